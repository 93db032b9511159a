//! # floodgate-http
//!
//! HTTP rate limiting on [`floodgate`]: the 429 contract, the rate-limit
//! header fields, client-key extractors and a tower [`Layer`](tower::Layer) for axum,
//! hyper or any tower stack.
//!
//! ```
//! use axum::{extract::ConnectInfo, routing::get, Router};
//! use floodgate::{KeyedLimiter, Policy, RateLimiter};
//! use floodgate_http::{Global, PeerIp, RateLimitLayer, Rule};
//! use std::net::{IpAddr, SocketAddr};
//!
//! // GET /: 10 per minute per client IP (burst 10), 1000 per second in all.
//! let per_ip_policy = Policy::per_minute(10)?;
//! let per_ip: KeyedLimiter<IpAddr> = KeyedLimiter::gcra(per_ip_policy);
//! let peer = PeerIp::new().lookup(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()));
//! let layer = RateLimitLayer::builder()
//!     .rule(Rule::new("per-ip", per_ip, peer)?.window_of(&per_ip_policy))
//!     .rule(Rule::new("global", RateLimiter::gcra(Policy::per_second(1_000)?), Global)?)
//!     .build()?;
//! let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(layer.clone());
//! // axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! // Later: layer.stats() reads each rule's allowed / denied / soft / shadow counters.
//! # let _ = app;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## The contract
//!
//! * **Every** response — 2xx and 429 alike — carries the configured header families
//!   ([`HeaderOptions`]): `X-RateLimit-Limit`, `X-RateLimit-Remaining`,
//!   `X-RateLimit-Reset` (seconds from now, rounded up, or Unix epoch seconds), and the
//!   IETF `RateLimit-Policy` / `RateLimit` lists (pinned to
//!   draft-ietf-httpapi-ratelimit-headers-10; see [`headers`](mod@headers)). They
//!   replace any of the same names the inner service wrote, unless it is trusted to
//!   add its own ([`HeaderOptions::keep_service_fields`]).
//! * A denial is `429 Too Many Requests` with `Retry-After` in whole seconds **rounded
//!   up** and never `0` ([`Decision::retry_after_secs`](floodgate::Decision::retry_after_secs)).
//! * A request that can never fit (cost above the capacity) gets no `Retry-After`
//!   (retrying cannot help) and a body saying so. A rule whose cost its in-process
//!   limiter can never admit is refused when the layer is built
//!   ([`ConfigError::Cost`]; on a plan limiter, a cost above every plan's
//!   capacity, naming the plan that comes closest: [`ConfigError::PlanCost`]). The
//!   answer remains for a plan's keys when the cost is above that plan's capacity
//!   but another plan admits it ("not on your plan"), and for what the builder
//!   cannot judge (a remote backend, a policy lowered after the build).
//! * Client IPs behind proxies come from the **rightmost** entries of
//!   `X-Forwarded-For` / `Forwarded`, and only when the peer is a trusted proxy
//!   ([`ForwardedIp`]); a spoofed leftmost value is never used.
//! * Rules are checked in order and the first hard denial stops the walk; for
//!   in-process limiters the decision is all-or-nothing (the earlier rules' charges
//!   are refunded; see [`RateLimitLayer`]); a remote limiter with refunds is given
//!   its charge back too (a round trip), also when the client goes away while a
//!   later rule makes the request wait (then in a spawned task:
//!   [`refund_spawner`](RateLimitLayerBuilder::refund_spawner), at most
//!   [`max_refund_tasks`](RateLimitLayerBuilder::max_refund_tasks) in flight per
//!   layer; a refund not spawned for the cap, or whose task is dropped unfinished,
//!   leaves its charge taken — unless its round trip was under way and reached the
//!   limiter — counted in the rule's `errors`); **soft** rules let the request
//!   through marked `X-RateLimit-Exceeded`, **shadow** rules only count
//!   ([`Strategy`]). Per-rule counters ([`RuleStats`]) are sharded atomics.
//! * No input panics: a missing, malformed, oversized or non-UTF-8 value is a
//!   [`KeyError`], answered `400` or counted against a fallback bucket
//!   ([`OnMissingKey`]); a soft or shadow rule without its key is skipped, as is one
//!   whose limiter fails: those never block.
//! * The handler can see what the layer decided: with
//!   [`publish_outcomes`](RateLimitLayerBuilder::publish_outcomes), each request
//!   passed on carries a [`RateLimitOutcomes`] in its extensions (every rule that
//!   decided: name, strategy, [`Decision`](floodgate::Decision)). Off by default, at
//!   no cost.
//!
//! The layer is generic over [`AsyncLimit`](floodgate::AsyncLimit): in-process
//! [`KeyedLimiter`](floodgate::KeyedLimiter) / [`RateLimiter`](floodgate::RateLimiter)
//! and remote backends alike.
//!
//! ## Features
//!
//! * `tracing` — a `tracing` event on each denial and limiter error.
//! * `queue` — `QueueRule`: requests wait for their GCRA slot (up to a bound)
//!   instead of being refused; `KeyedQueueRule`: the same per key (client IP, API
//!   key), each key waiting behind its own requests only; `PriorityRule`: one queue per plan, the highest plan
//!   served first and the lowest shed first; needs Tokio's timer. With it, a
//!   dropped request's remote refunds are spawned on the current Tokio runtime
//!   unless the layer has its own
//!   [`refund_spawner`](RateLimitLayerBuilder::refund_spawner).
//! * `metrics` — `RateLimitLayer::export_metrics` sets `metrics` facade counters
//!   (`METRIC_NAMES`, label `rule`) to the per-rule totals, read from the sharded
//!   counters when called, so the request path writes nothing shared.
//! * `grpc` — the layer's own answer to a gRPC request (`content-type:
//!   application/grpc*`) is a trailers-only gRPC status: a denial is
//!   `RESOURCE_EXHAUSTED` with `grpc-retry-pushback-ms` and a `google.rpc.RetryInfo` in
//!   `grpc-status-details-bin` (see [`RateLimitLayer`], "Responses").

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod body;
mod error;
#[cfg(feature = "metrics")]
mod export;
mod extract;
#[cfg(feature = "grpc")]
mod grpc;
pub mod headers;
mod layer;
#[cfg(feature = "queue")]
mod priority;
#[cfg(feature = "queue")]
mod queue;
mod stats;

pub use body::RateLimitBody;
pub use error::ConfigError;
#[cfg(feature = "metrics")]
pub use export::METRIC_NAMES;
pub use extract::{
    default_peer_lookup, from_fn, ForwardedIp, ForwardingHeader, FromFn, Global, HeaderKey,
    IpGrouping, IpNet, KeyError, KeyExtractor, PeerAddr, PeerIp, PeerLookup, RoutePath,
    TrustedProxies, DEFAULT_MAX_FORWARDED_LEN,
};
pub use headers::{
    legacy_headers, render_limit, render_policy, retry_after, window_secs, LimitItem,
    PartitionKeyHasher, PolicyItem, PolicyName, ResetFormat, MAX_SF_INTEGER,
};
pub use layer::{
    Charge, HeaderOptions, OnLimiterError, OnMissingKey, RateLimitLayer, RateLimitLayerBuilder,
    RateLimitOutcomes, RateLimitService, RefundTask, ResponseFuture, Rule, RuleOutcome, Strategy,
};
#[cfg(feature = "queue")]
pub use priority::PriorityRule;
#[cfg(feature = "queue")]
pub use queue::{KeyedQueueRule, QueueRule};
pub use stats::RuleStats;

/// Compile-time proof that the layer and its service can be shared across threads.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<RateLimitLayer>();
    assert_send_sync::<RateLimitService<()>>();
    assert_send_sync::<RateLimitOutcomes>();
    assert_send_sync::<PeerIp>();
    assert_send_sync::<ForwardedIp>();
};

/// The workspace README's examples (the core, this layer and the Redis backend),
/// compiled and run as doctests here, where every crate they use is at hand.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
