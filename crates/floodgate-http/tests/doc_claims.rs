//! The layer's documented contract, attacked where no other test looks:
//!
//! * `HeaderOptions::legacy`: "The trio holds one decision: the denying rule's on a
//!   429, else the visible rule with the least `remaining` (the longest reset on a
//!   tie)."
//! * `RateLimitLayer`, "How rules combine": "the first hard denial stops the walk …
//!   the rules after it are neither charged nor counted. The same holds for … a
//!   failed limiter (503)", and "All or nothing: a request the layer rejects (429,
//!   400, 503) is charged nowhere"; "Counters count an admission that was later
//!   refunded as allowed."
//! * "Every response — 2xx and 429 alike — carries the configured header families",
//!   and a 429 carries `Retry-After` "in whole seconds rounded up and never 0".
//!
//! Driven through `tower::Service` with a `ManualClock`: no sockets, no sleeps.

use std::fmt;
use std::future::{ready, Future};
use std::sync::Arc;

use floodgate::{AsyncLimit, Decision, ManualClock, Policy, RateLimiter};
use floodgate_http::{Global, OnLimiterError, RateLimitLayer, Rule};
use http::{Request, Response};
use tower::{Layer, ServiceExt};
mod common;
use common::{Hello, TestResult};

/// A remote limiter whose backend is down: every call fails.
struct Down;

#[derive(Debug)]
struct Unreachable;

impl fmt::Display for Unreachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("backend unreachable")
    }
}

impl std::error::Error for Unreachable {}

impl AsyncLimit<()> for Down {
    type Error = Unreachable;

    fn check_n(
        &self,
        _: &(),
        _: u32,
    ) -> impl Future<Output = Result<Decision, Unreachable>> + Send {
        ready(Err(Unreachable))
    }

    fn peek_n(&self, _: &(), _: u32) -> impl Future<Output = Result<Decision, Unreachable>> + Send {
        ready(Err(Unreachable))
    }
}

async fn send(layer: &RateLimitLayer) -> Response<floodgate_http::RateLimitBody<String>> {
    layer
        .layer(Hello)
        .oneshot(Request::new(()))
        .await
        .expect("infallible")
}

fn header<B>(r: &Response<B>, name: &str) -> Option<String> {
    r.headers()
        .get(name)
        .map(|v| v.to_str().expect("ASCII").to_owned())
}

fn num<B>(r: &Response<B>, name: &str) -> u64 {
    header(r, name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing or not a number"))
}

/// On a 2xx the trio shows the visible rule with the least `remaining`, and of two
/// with the same `remaining` the one with the longest reset.
#[tokio::test]
async fn the_trio_breaks_a_remaining_tie_by_the_longest_reset() -> TestResult {
    let clock = ManualClock::new();
    // Both have 1 unit left after the first request; "slow" resets in 2 min,
    // "fast" in 2 s.
    let fast = RateLimiter::gcra_with_clock(Policy::per_second(1)?.with_burst(2)?, clock.clone());
    let slow = RateLimiter::gcra_with_clock(Policy::per_minute(1)?.with_burst(2)?, clock.clone());
    for (first, second) in [("fast", "slow"), ("slow", "fast")] {
        let (a, b) = if first == "fast" {
            (fast.clone_policy(&clock), slow.clone_policy(&clock))
        } else {
            (slow.clone_policy(&clock), fast.clone_policy(&clock))
        };
        let layer = RateLimitLayer::builder()
            .rule(Rule::new(first, a, Global)?)
            .rule(Rule::new(second, b, Global)?)
            .build()?;
        let r = send(&layer).await;
        assert_eq!(r.status(), 200);
        assert_eq!(
            num(&r, "x-ratelimit-remaining"),
            1,
            "rules {first}, {second}"
        );
        assert_eq!(
            num(&r, "x-ratelimit-reset"),
            60,
            "rules {first}, {second}: the trio must show the longest reset of the tie: {:?}",
            r.headers()
        );
    }
    Ok(())
}

/// A 429 shows the denying rule's numbers in the trio, even where an earlier rule
/// that admitted (and was refunded) has less remaining.
#[tokio::test]
async fn a_429s_trio_is_the_denying_rules() -> TestResult {
    let clock = ManualClock::new();
    let tight = Arc::new(RateLimiter::gcra_with_clock(
        Policy::per_minute(3)?,
        clock.clone(),
    ));
    let big = RateLimiter::gcra_with_clock(Policy::per_minute(100)?, clock.clone());
    let layer = RateLimitLayer::builder()
        .rule(Rule::shared("tight", Arc::clone(&tight), Global)?)
        .rule(Rule::new("big", big, Global)?.cost(60))
        .build()?;
    let r = send(&layer).await;
    assert_eq!(r.status(), 200);
    let _ = tight.check(); // "tight" now has 1 left
    let r = send(&layer).await;
    assert_eq!(r.status(), 429);
    // "big" denied 60 with 40 left; "tight" (refunded) shows 1.
    assert_eq!(num(&r, "x-ratelimit-limit"), 100, "{:?}", r.headers());
    assert_eq!(num(&r, "x-ratelimit-remaining"), 40, "{:?}", r.headers());
    // Retry-After: whole seconds, rounded up, never 0 (20 units of 600 ms: 12 s).
    assert_eq!(num(&r, "retry-after"), 12);
    // The refund took "tight" back to where it was: 1 unit left.
    assert_eq!(tight.peek(0).remaining(), 1);
    assert!(header(&r, "ratelimit").is_some() && header(&r, "ratelimit-policy").is_some());
    Ok(())
}

/// A failed limiter (503, fail closed) after an in-process rule: the earlier rule's
/// charge is given back, the rules after it are neither charged nor counted, and the
/// earlier rule's refunded admission still counts as allowed.
#[tokio::test]
async fn a_503_is_charged_nowhere_and_stops_the_walk() -> TestResult {
    let clock = ManualClock::new();
    let before = Arc::new(RateLimiter::gcra_with_clock(
        Policy::per_minute(10)?,
        clock.clone(),
    ));
    let after = Arc::new(RateLimiter::gcra_with_clock(
        Policy::per_minute(10)?,
        clock.clone(),
    ));
    let layer = RateLimitLayer::builder()
        .rule(Rule::shared("before", Arc::clone(&before), Global)?)
        .rule(Rule::remote("down", Down, Global)?)
        .rule(Rule::shared("after", Arc::clone(&after), Global)?)
        .on_limiter_error(OnLimiterError::FailClosed)
        .build()?;
    for _ in 0..3 {
        let r = send(&layer).await;
        assert_eq!(r.status(), 503);
    }
    assert_eq!(
        before.peek(0).remaining(),
        10,
        "a 503 kept the earlier rule's charge"
    );
    assert_eq!(
        after.peek(0).remaining(),
        10,
        "a rule after the failure was charged"
    );
    let stats = layer.stats();
    assert_eq!((stats[0].allowed, stats[0].denied), (3, 0));
    assert_eq!(stats[1].errors, 3);
    assert_eq!(
        (stats[2].allowed, stats[2].denied, stats[2].errors),
        (0, 0, 0),
        "a rule after the failure was counted"
    );
    Ok(())
}

/// Fail open: the failed rule is skipped, the request passes, and the other rules
/// are charged as usual (the walk goes on).
#[tokio::test]
async fn fail_open_skips_only_the_failed_rule() -> TestResult {
    let clock = ManualClock::new();
    let after = Arc::new(RateLimiter::gcra_with_clock(
        Policy::per_minute(2)?,
        clock.clone(),
    ));
    let layer = RateLimitLayer::builder()
        .rule(Rule::remote("down", Down, Global)?)
        .rule(Rule::shared("after", Arc::clone(&after), Global)?)
        .on_limiter_error(OnLimiterError::FailOpen)
        .build()?;
    assert_eq!(send(&layer).await.status(), 200);
    assert_eq!(send(&layer).await.status(), 200);
    let r = send(&layer).await;
    assert_eq!(
        r.status(),
        429,
        "a failed rule must not switch off the rules after it"
    );
    assert!(num(&r, "retry-after") >= 1);
    Ok(())
}

/// A GCRA limiter with the same policy and clock as `self`, fresh.
trait ClonePolicy {
    fn clone_policy(&self, clock: &ManualClock) -> RateLimiter<floodgate::Gcra, ManualClock>;
}

impl ClonePolicy for RateLimiter<floodgate::Gcra, ManualClock> {
    fn clone_policy(&self, clock: &ManualClock) -> RateLimiter<floodgate::Gcra, ManualClock> {
        RateLimiter::gcra_with_clock(self.algorithm().policy().to_owned(), clock.clone())
    }
}
