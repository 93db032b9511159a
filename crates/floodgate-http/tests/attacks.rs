//! Attacks on the layer's promises, each driven straight through the tower service
//! (no sockets), on a manual clock.

use std::convert::Infallible;
use std::future::{ready, Future};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;

use floodgate::{AsyncLimit, Decision, KeyedBuilder, KeyedLimiter, ManualClock, Policy};
use floodgate_http::{
    ForwardedIp, Global, HeaderKey, OnMissingKey, PeerAddr, PeerIp, RateLimitLayer, Rule, Strategy,
    TrustedProxies,
};
use http::{HeaderMap, HeaderValue, Request};
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

/// One limit for every request: `n` a minute on `clock`.
fn per_minute(
    n: u64,
    clock: &ManualClock,
) -> Result<floodgate::RateLimiter<floodgate::Gcra, ManualClock>, floodgate::PolicyError> {
    Ok(floodgate::RateLimiter::gcra_with_clock(
        Policy::per_minute(n)?,
        clock.clone(),
    ))
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

/// A remote backend that answers one fixed decision, whatever it is asked.
struct Answers(Decision);

impl AsyncLimit<()> for Answers {
    type Error = Infallible;

    fn check_n(&self, _: &(), _: u32) -> impl Future<Output = Result<Decision, Infallible>> + Send {
        ready(Ok(self.0))
    }

    fn peek_n(&self, _: &(), _: u32) -> impl Future<Output = Result<Decision, Infallible>> + Send {
        ready(Ok(self.0))
    }
}

/// The headers the layer answers a plain request with, for a backend answering `d`.
async fn answered(d: Decision) -> Result<(u16, HeaderMap), Box<dyn std::error::Error>> {
    let layer = RateLimitLayer::builder()
        .rule(Rule::remote("r", Answers(d), Global)?.window(Duration::MAX))
        .build()?;
    let (app, _) = counting_app();
    let resp = layer
        .layer(app)
        .call(Request::get("/").body(String::new())?)
        .await?;
    Ok((resp.status().as_u16(), resp.headers().clone()))
}

#[tokio::test]
async fn extreme_decisions_render_as_valid_fields() -> TestResult {
    let huge = Decision::new(
        false,
        u64::MAX,
        u64::MAX,
        Duration::MAX,
        Some(Duration::MAX),
    );
    let (status, h) = answered(huge).await?;
    assert_eq!(status, 429);
    // Structured Field integers stay within 15 digits; a decision's durations hold
    // at most u64::MAX ns, 18 446 744 074 s rounded up.
    assert_eq!(
        h["ratelimit-policy"],
        r#""r";q=999999999999999;w=999999999999999"#
    );
    assert_eq!(h["ratelimit"], r#""r";r=999999999999999;t=18446744074"#);
    let retry: u64 = h["retry-after"].to_str()?.parse()?;
    assert_eq!(retry, 18_446_744_074);
    assert_eq!(h["x-ratelimit-limit"], u64::MAX.to_string().as_str());

    // A denial to retry at once still says 1 s, never 0.
    let now = Decision::new(false, 0, 0, Duration::ZERO, Some(Duration::ZERO));
    let (status, h) = answered(now).await?;
    assert_eq!((status, h["retry-after"].to_str()?), (429, "1"));
    assert_eq!(h["ratelimit"], r#""r";r=0;t=0"#);

    // Never: the never-fits answer, without Retry-After.
    let never = Decision::new(false, 1, 0, Duration::from_nanos(1), None);
    let (status, h) = answered(never).await?;
    assert_eq!(status, 429);
    assert!(h.get("retry-after").is_none());
    assert_eq!(h["x-ratelimit-reset"], "1");
    Ok(())
}

#[tokio::test]
async fn the_layer_replaces_the_upstream_fields_of_its_names_only() -> TestResult {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("global", per_minute(5, &clock)?, Global)?)
        .build()?;
    // An upstream with rate-limit fields of its own, two RateLimit lines among them.
    let upstream = Router::new().route(
        "/",
        get(|| async {
            let mut h = HeaderMap::new();
            h.append("ratelimit", HeaderValue::from_static(r#""up";r=9;t=9"#));
            h.append("ratelimit", HeaderValue::from_static(r#""up2";r=9;t=9"#));
            h.insert("x-ratelimit-remaining", HeaderValue::from_static("999"));
            h.insert("retry-after", HeaderValue::from_static("7"));
            (h, "ok")
        }),
    );
    let resp = layer
        .layer(upstream)
        .call(Request::get("/").body(String::new())?)
        .await?;
    let h = resp.headers();
    let ratelimit: Vec<_> = h.get_all("ratelimit").iter().collect();
    assert_eq!(ratelimit, [r#""global";r=4;t=12"#]);
    assert_eq!(h["x-ratelimit-remaining"], "4");
    // The layer writes no Retry-After on an admission: the upstream's stays.
    assert_eq!(h["retry-after"], "7");
    Ok(())
}

#[tokio::test]
async fn shadow_and_soft_rules_never_block_even_a_request_that_never_fits() -> TestResult {
    let clock = ManualClock::new();
    // Remote rules: the builder refuses an in-process rule whose cost never fits
    // (ConfigError::Cost), but a backend's capacity is not known until it answers.
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::remote("trial", per_minute(1, &clock)?, Global)?
                .cost(2)
                .strategy(Strategy::Shadow),
        )
        .rule(
            Rule::remote("cap", per_minute(1, &clock)?, Global)?
                .cost(u32::MAX)
                .strategy(Strategy::Soft),
        )
        .build()?;
    let (app, served) = counting_app();
    let mut svc = layer.layer(app);
    for _ in 0..3 {
        let resp = svc.call(Request::get("/").body(String::new())?).await?;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-ratelimit-exceeded"], r#""cap""#);
        assert!(resp.headers().get("retry-after").is_none());
    }
    assert_eq!(served.load(Ordering::Relaxed), 3);
    let s = layer.stats();
    assert_eq!(
        (s[0].shadow, s[0].allowed, s[1].soft, s[1].allowed),
        (3, 0, 3, 0)
    );
    Ok(())
}

#[test]
fn concurrent_requests_never_pass_any_limit() -> TestResult {
    // 100 in all; each of 8 clients (API keys) 20. 8 threads of 50 requests, one
    // client each: 160 would pass per client, the global limit stops them at 100.
    let clock = ManualClock::new();
    let global = Arc::new(floodgate::RateLimiter::gcra_with_clock(
        Policy::per_minute(100)?,
        clock.clone(),
    ));
    let per_key: KeyedLimiter<String, floodgate::Gcra, ManualClock> =
        KeyedBuilder::new(floodgate::Gcra::new(Policy::per_minute(20)?))
            .capacity(64)
            .clock(clock)
            .build()?;
    let per_key = Arc::new(per_key);
    let layer = RateLimitLayer::builder()
        .rule(Rule::shared("global", Arc::clone(&global), Global)?)
        .rule(Rule::shared(
            "key",
            Arc::clone(&per_key),
            HeaderKey::new("x-api-key")?,
        )?)
        .build()?;
    let (app, served) = counting_app();
    let svc = layer.layer(app);
    let passed: Vec<u64> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let mut svc = svc.clone();
                s.spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread().build()?;
                    rt.block_on(async {
                        let mut ok = 0;
                        for _ in 0..50 {
                            let req = Request::get("/")
                                .header("x-api-key", format!("k{t}"))
                                .body(String::new())?;
                            if svc.call(req).await?.status() == 200 {
                                ok += 1;
                            }
                        }
                        Ok::<u64, Box<dyn std::error::Error + Send + Sync>>(ok)
                    })
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("no panic").expect("no error"))
            .collect()
    });
    let total: u64 = passed.iter().sum();
    assert!(passed.iter().all(|&n| n <= 20), "{passed:?}");
    assert!(total <= 100, "{passed:?}");
    // Only admitted requests reached the app, and every one of them stays charged.
    assert_eq!(served.load(Ordering::Relaxed), total);
    assert!(global.peek(0).remaining() <= 100 - total);
    for (t, n) in passed.iter().enumerate() {
        assert!(per_key.peek(format!("k{t}").as_str(), 0).remaining() <= 20 - n);
    }
    Ok(())
}

/// Sends three requests from one client through `first` (10 a minute per client)
/// and then a global rule of 1 a minute: the two refused ones must be charged nowhere.
async fn the_first_rule_gets_back_what_a_later_denial_refused<L>(
    first: Arc<L>,
    clock: ManualClock,
) -> TestResult
where
    L: floodgate_http::Charge<IpAddr> + AsyncLimit<IpAddr> + 'static,
{
    let layer = RateLimitLayer::builder()
        .rule(Rule::shared("per-ip", Arc::clone(&first), PeerIp::new())?)
        .rule(Rule::new("global", per_minute(1, &clock)?, Global)?)
        .build()?;
    let (app, _) = counting_app();
    let mut svc = layer.layer(app);
    for status in [200, 429, 429] {
        let req = from_peer("192.0.2.1", "accept", b"*/*")?;
        assert_eq!(svc.call(req).await?.status(), status);
    }
    // One unit taken, not three.
    let ip: IpAddr = "192.0.2.1".parse()?;
    assert_eq!(first.peek(&ip, 0).remaining(), 9);
    Ok(())
}

#[tokio::test]
async fn inline_tables_and_sliding_logs_are_in_process_rules_too() -> TestResult {
    // Inline slots (the storage for IP keys) and the exact log per key both charge
    // with receipts, so a later rule's denial gives their charge back.
    let clock = ManualClock::new();
    let policy = Policy::per_minute(10)?;
    let inline = KeyedBuilder::new(floodgate::Gcra::new(policy))
        .capacity(64)
        .clock(clock.clone())
        .build_inline::<IpAddr>()?;
    the_first_rule_gets_back_what_a_later_denial_refused(Arc::new(inline), clock.clone()).await?;
    let log = KeyedBuilder::default()
        .capacity(64)
        .clock(clock.clone())
        .sliding_log::<IpAddr>(policy)?;
    the_first_rule_gets_back_what_a_later_denial_refused(Arc::new(log), clock.clone()).await
}
