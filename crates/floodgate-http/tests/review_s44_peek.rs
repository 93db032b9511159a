//! Session 44 (feature `queue`): a 429 from an earlier rule carries a later priority
//! rule's refusal when that rule would refuse the retry too — its tier's places
//! taken with nothing lower to shed, or (a tier without places) the shaper's slot
//! not free — and nothing when the request's tier still has room; the peek takes no
//! place. On Tokio's paused clock, which also drives the limiters.

use std::time::Duration;

use floodgate::{KeyedLimiter, Policy, Shaper};
use floodgate_http::{from_fn, HeaderKey, PriorityRule, RateLimitLayer, RateLimitService, Rule};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
#[path = "common/answer.rs"]
mod answer;
mod common;
use answer::Answer;
use common::{tier, tier_request, Hello, TestResult, TokioClock};

/// 1 per `secs` s, burst 1.
fn one_per(secs: u64) -> Result<Policy, floodgate::PolicyError> {
    Policy::new(1, Duration::from_secs(secs))?.with_burst(1)
}

/// A per-user rule of 1 per 2 s, then a priority rule "prio" of 1 per 10 s with
/// `bounds` places per tier; both on Tokio's clock from `start`.
fn per_user_then_priority(
    start: Instant,
    bounds: &[usize],
) -> Result<RateLimitLayer, Box<dyn std::error::Error>> {
    let clock = TokioClock { start };
    let per_user: KeyedLimiter<String, _, _> = KeyedLimiter::gcra_with_clock(one_per(2)?, clock);
    let shaper = Shaper::with_clock(one_per(10)?, clock);
    Ok(RateLimitLayer::builder()
        .rule(Rule::new("per-user", per_user, HeaderKey::new("x-user")?)?)
        .priority(PriorityRule::new("prio", shaper, bounds, from_fn(tier))?)
        .build()?)
}

async fn send(layer: &RateLimitLayer, who: &str, tier: usize) -> Result<Answer, String> {
    let response = layer
        .layer(Hello)
        .oneshot(tier_request(who, tier))
        .await
        .map_err(|e| e.to_string())?;
    Answer::read(response).await.map_err(|e| e.to_string())
}

/// Sends a request and lets it reach its queue before returning.
async fn arrive(svc: &RateLimitService<Hello>, who: &str, tier: usize) -> JoinHandle<u16> {
    let mut svc = svc.clone();
    let req = tier_request(who, tier);
    let task = tokio::spawn(async move {
        let resp = svc.call(req).await.expect("infallible");
        resp.status().as_u16()
    });
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
    task
}

/// Tiers of one place each. "a" takes the free slot (the shaper's TAT at 10 s), "b"
/// waits in tier 0 holding the slot at 10 s (TAT 20 s). "a" again at once is denied
/// by the per-user rule (2 s) while the priority rule would refuse a tier-0 request
/// too: tier 0's place is taken and no lower tier has a waiter to shed. Its refusal
/// (nothing ahead without a slot) is the wait until a plain check after the holder
/// would pass, `TAT + T − τ − now` = 20 s: the 429 is the priority rule's,
/// `Retry-After: 20`, exactly what the rule's own 429 tells a request ("c") that
/// the per-user rule lets through. The same request in tier 1, where a place is
/// free, would be queued: only the per-user rule holds it back (`Retry-After: 2`).
/// No peek took a place.
///
/// Mutations seen failing: `PriorityRule::peek_later` removed (`Retry-After: 2`,
/// the per-user rule's); the peek classifying every request as tier 0 (tier 1 told
/// 20).
#[tokio::test(start_paused = true)]
async fn a_429_carries_a_later_priority_rules_refusal_for_a_full_tier() -> TestResult {
    let start = Instant::now();
    let layer = per_user_then_priority(start, &[1, 1])?;
    assert_eq!(send(&layer, "a", 0).await?.status, 200);
    let svc = layer.layer(Hello);
    let b = arrive(&svc, "b", 0).await;

    let denied = send(&layer, "a", 0).await?;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("retry-after"), Some("20"));
    assert!(denied.body.contains("\"prio\""), "{}", denied.body);
    let limits = denied.header("ratelimit").unwrap_or_default();
    assert!(limits.contains("\"prio\";r=0"), "{limits}");

    // The rule's own refusal of a tier-0 request says the same.
    let own = send(&layer, "c", 0).await?;
    assert_eq!(own.status, 429);
    assert_eq!(own.header("retry-after"), Some("20"));

    // Tier 1 has room: the priority rule would queue it.
    let pro = send(&layer, "a", 1).await?;
    assert_eq!(pro.status, 429);
    assert_eq!(pro.header("retry-after"), Some("2"));
    assert!(pro.body.contains("\"per-user\""), "{}", pro.body);

    // The peeks took no place: "b" still waits alone, and is served at 10 s.
    assert_eq!(layer.rule_stats("prio").map(|s| s.denied), Some(1));
    assert_eq!(b.await?, 200);
    assert_eq!(start.elapsed(), Duration::from_secs(10));
    Ok(())
}

/// Tier 0 has no places: a tier-0 request goes at once or is refused. With nobody
/// waiting the peek asks the shaper for its slot now (reserving nothing): "a" took
/// it at 0 (TAT 10 s), so "a" again is denied by the per-user rule (2 s) and would
/// be refused by the priority rule until 10 s — `Retry-After: 10`. At 10 s less
/// 1 ms the per-user rule admits "a" and the priority rule refuses it itself; at
/// 10 s it is admitted at once (the peeks reserved nothing).
///
/// Mutation seen failing: the peek taking the shaper's slot as free whatever the
/// shaper says (`Retry-After: 2`).
#[tokio::test(start_paused = true)]
async fn a_429_carries_a_later_priority_tier_that_cannot_wait() -> TestResult {
    let start = Instant::now();
    let layer = per_user_then_priority(start, &[0, 1])?;
    assert_eq!(send(&layer, "a", 0).await?.status, 200);
    let denied = send(&layer, "a", 0).await?;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("retry-after"), Some("10"));
    assert!(denied.body.contains("\"prio\""), "{}", denied.body);

    tokio::time::advance(Duration::from_secs(10) - Duration::from_millis(1)).await;
    let early = send(&layer, "a", 0).await?;
    assert_eq!(early.status, 429, "1 ms early the priority rule refuses");
    assert!(early.body.contains("\"prio\""), "{}", early.body);
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(send(&layer, "a", 0).await?.status, 200);
    assert_eq!(start.elapsed(), Duration::from_secs(10), "admitted at once");
    Ok(())
}
