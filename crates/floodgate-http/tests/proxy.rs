//! The `proxy` example's proxy over loopback: a tiny upstream, the proxy in front of
//! it (the example's own code, included below), and a real HTTP/1.1 client standing in
//! for the trusted load balancer at 127.0.0.1. Time is a `ManualClock` that does not
//! move, so the numbers are exact.

#[allow(dead_code)]
#[path = "../examples/proxy/serve.rs"]
mod serve;

#[path = "common/answer.rs"]
mod answer;
use answer::Answer;

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use floodgate::{ManualClock, Policy};
use http::{Request, Response, StatusCode};
use http_body_util::{Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// An upstream answering `upstream saw <X-Forwarded-For>` to everything.
async fn upstream() -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                let xff = req
                    .headers()
                    .get("x-forwarded-for")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!(
                    "upstream saw {xff}"
                )))))
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc),
            );
        }
    });
    Ok(addr)
}

/// `GET /path` through the proxy, as the balancer forwarding for `xff`.
async fn get(
    proxy: SocketAddr,
    xff: &str,
) -> Result<Answer, Box<dyn std::error::Error + Send + Sync>> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let req = Request::get(format!("http://{proxy}/path?q=1"))
        .header("x-forwarded-for", xff)
        .body(Empty::new())?;
    Answer::read(client.request(req).await?).await
}

#[tokio::test]
async fn proxy_limits_each_client_behind_the_trusted_balancer() -> TestResult {
    let upstream = upstream().await?;
    let layer = serve::per_client_layer(Policy::per_minute(3)?.with_burst(3)?, ManualClock::new())?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let proxy = listener.local_addr()?;
    tokio::spawn(serve::serve(listener, upstream, layer.clone()));

    for remaining in (0..3).rev() {
        let a = get(proxy, "203.0.113.7").await?;
        assert_eq!(a.status, StatusCode::OK, "{}", a.body);
        // The proxy appended its peer (the balancer) to the client's entry.
        assert_eq!(a.body, "upstream saw 203.0.113.7, 127.0.0.1");
        assert_eq!(a.header("x-ratelimit-limit"), Some("3"));
        assert_eq!(
            a.header("x-ratelimit-remaining"),
            Some(remaining.to_string().as_str())
        );
        assert_eq!(
            a.header("ratelimit-policy"),
            Some(r#""per-client";q=3;w=60"#)
        );
        assert!(a.header("retry-after").is_none());
    }

    // A spoofed leftmost entry does not change the key: the balancer's rightmost one counts.
    let a = get(proxy, "198.51.100.1, 203.0.113.7").await?;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "{}", a.body);
    assert_eq!(a.header("retry-after"), Some("20"));
    assert_eq!(a.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(a.header("x-ratelimit-reset"), Some("60"));
    assert_eq!(a.header("ratelimit"), Some(r#""per-client";r=0;t=60"#));
    assert_eq!(
        a.header("ratelimit-policy"),
        Some(r#""per-client";q=3;w=60"#)
    );
    assert!(a.body.contains("\"per-client\" exceeded"), "{}", a.body);

    // Another client has its own bucket.
    let a = get(proxy, "203.0.113.8").await?;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(a.header("x-ratelimit-remaining"), Some("2"));

    let stats = layer.rule_stats("per-client").ok_or("no rule")?;
    assert_eq!((stats.allowed, stats.denied), (4, 1));
    Ok(())
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_bad_gateway_still_limited() -> TestResult {
    // Bind and drop: nothing listens there any more.
    let gone = TcpListener::bind("127.0.0.1:0").await?.local_addr()?;
    let layer = serve::per_client_layer(Policy::per_minute(1)?, ManualClock::new())?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let proxy = listener.local_addr()?;
    tokio::spawn(serve::serve(listener, gone, layer));
    let a = get(proxy, "203.0.113.9").await?;
    assert_eq!(a.status, StatusCode::BAD_GATEWAY, "{}", a.body);
    assert_eq!(a.header("x-ratelimit-remaining"), Some("0"));
    let a = get(proxy, "203.0.113.9").await?;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "{}", a.body);
    Ok(())
}
