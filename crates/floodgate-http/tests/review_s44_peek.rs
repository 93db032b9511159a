//! Session 44 (feature `queue`): a 429 from an earlier rule carries a later priority
//! rule's refusal when that rule would refuse the retry too — its tier's places
//! taken with nothing lower to shed, or (a tier without places) the shaper's slot
//! not free — and nothing when the request's tier still has room; the peek takes no
//! place. On Tokio's paused clock, which also drives the limiters.

use std::time::Duration;

use tokio::time::Instant;
use tower::Layer;
#[path = "common/answer.rs"]
mod answer;
mod common;
#[path = "common/priority.rs"]
mod priority;
use common::{Hello, TestResult};
use priority::{arrive, per_user_then_priority, send};

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
