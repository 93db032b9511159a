//! Attacks on the layer's promises, each driven straight through the tower service
//! (no sockets), on a manual clock.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::routing::get;
use axum::Router;

use floodgate::{KeyedBuilder, KeyedLimiter, ManualClock, Policy};
use floodgate_http::{ForwardedIp, OnMissingKey, PeerAddr, RateLimitLayer, Rule, TrustedProxies};
use http::Request;
use tower::{Layer, Service};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// An axum app that counts the requests that reach it.
fn counting_app() -> (Router, Arc<AtomicU64>) {
    let served = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&served);
    let app = Router::new().route(
        "/",
        get(move || {
            // Relaxed: a count read after every request has finished.
            count.fetch_add(1, Ordering::Relaxed);
            async { "ok" }
        }),
    );
    (app, served)
}

fn keyed_ip(
    policy: Policy,
    clock: &ManualClock,
) -> Result<KeyedLimiter<IpAddr, floodgate::Gcra, ManualClock>, Box<dyn std::error::Error>> {
    Ok(KeyedBuilder::new(floodgate::Gcra::new(policy))
        .capacity(1_024)
        .clock(clock.clone())
        .build()?)
}

/// A request from `peer` with the header `name: value`.
fn from_peer(
    peer: &str,
    name: &str,
    value: &[u8],
) -> Result<Request<String>, Box<dyn std::error::Error>> {
    let mut req = Request::get("/").header(name, value).body(String::new())?;
    req.extensions_mut()
        .insert(PeerAddr(format!("{peer}:4000").parse()?));
    Ok(req)
}

#[tokio::test]
async fn a_client_cannot_move_itself_into_the_fallback_bucket() -> TestResult {
    let clock = ManualClock::new();
    let xff = ForwardedIp::x_forwarded_for(TrustedProxies::new(["10.0.0.0/8"])?, 1);
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::new("client", keyed_ip(Policy::per_minute(1)?, &clock)?, xff)?
                .on_missing_key(OnMissingKey::Fallback(IpAddr::from([0, 0, 0, 0]))),
        )
        .build()?;
    let (app, served) = counting_app();
    let mut svc = layer.layer(app);
    // The balancer appends the address it saw to whatever the client sent.
    let first = from_peer("10.0.0.1", "x-forwarded-for", b"203.0.113.5")?;
    assert_eq!(svc.call(first).await?.status(), 200);
    // Its one request a minute spent, the client sends a byte that is not visible
    // ASCII in its own part of the list: it is still itself, and still refused.
    let spoof = from_peer("10.0.0.1", "x-forwarded-for", b"\xff, 203.0.113.5")?;
    assert_eq!(svc.call(spoof).await?.status(), 429);
    assert_eq!(served.load(Ordering::Relaxed), 1);
    assert_eq!(layer.stats()[0].bad_key, 0);
    Ok(())
}
