//! gRPC over loopback (feature `grpc`): a real tonic server with the layer, serving the
//! pre-generated health service (no protoc), and a real tonic client reading the
//! status, its metadata and its `RetryInfo` back.

use std::net::SocketAddr;
use std::time::Duration;

use floodgate::{ManualClock, Policy, RateLimiter};
use floodgate_http::{Global, RateLimitLayer, Rule};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::Code;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_types::StatusExt;

/// Serves the health service behind `layer` on `127.0.0.1:0`; returns a connected client.
async fn serve(layer: RateLimitLayer) -> HealthClient<Channel> {
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

/// One request per minute for everyone (burst 1), on a clock that does not move.
fn one_per_minute(cost: u32) -> RateLimitLayer {
    let limiter = RateLimiter::gcra_with_clock(Policy::per_minute(1).unwrap(), ManualClock::new());
    // A cost above the burst: as a remote rule (which the builder cannot judge; an
    // in-process one is refused when built), to reach the never-fits answer.
    let rule = if cost > 1 {
        Rule::remote("global", limiter, Global)
    } else {
        Rule::new("global", limiter, Global)
    };
    RateLimitLayer::builder()
        .rule(rule.unwrap().cost(cost))
        .build()
        .unwrap()
}

fn check() -> HealthCheckRequest {
    HealthCheckRequest {
        service: String::new(),
    }
}

#[tokio::test]
async fn a_denial_is_resource_exhausted_with_pushback_and_retry_info() {
    let layer = one_per_minute(1);
    let mut client = serve(layer.clone()).await;

    let ok = client
        .check(check())
        .await
        .expect("the first call is admitted");
    // The header families reach the client as response metadata.
    let md = ok.metadata();
    assert_eq!(md.get("x-ratelimit-remaining").unwrap(), "0");
    assert!(md.get("ratelimit").is_some());

    let status = client
        .check(check())
        .await
        .expect_err("the second is denied");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(
        status.message().contains("\"global\" exceeded"),
        "{:?}",
        status.message()
    );
    let md = status.metadata();
    // The manual clock stands still: the next slot is exactly one minute away.
    assert_eq!(md.get("grpc-retry-pushback-ms").unwrap(), "60000");
    assert_eq!(md.get("retry-after").unwrap(), "60");
    let retry = status
        .get_details_retry_info()
        .expect("a google.rpc.RetryInfo in grpc-status-details-bin");
    assert_eq!(retry.retry_delay, Some(Duration::from_secs(60)));

    let stats = layer.rule_stats("global").unwrap();
    assert_eq!((stats.allowed, stats.denied), (1, 1));
}

#[tokio::test]
async fn a_call_that_can_never_fit_is_told_not_to_retry() {
    let mut client = serve(one_per_minute(2)).await;
    let status = client.check(check()).await.expect_err("cost 2 > burst 1");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("can never be admitted"));
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "-1"
    );
    assert!(status.metadata().get("retry-after").is_none());
    assert!(status.get_details_retry_info().is_none());
}
