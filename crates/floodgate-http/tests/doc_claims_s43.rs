//! The layer's promises added in sessions 42–43 that no other test pins down
//! (feature `queue`).
//!
//! * `RateLimitLayer`, "How rules combine": a 429's `X-RateLimit-Remaining` is "the
//!   least of the hard rules the request met, those peeked included, whether or not
//!   they deny" — a later queue that would admit included.
//! * "How rules combine": an earlier remote rule's charge "when a later rule rejects
//!   the request (429, 400, 503), is given back by it" — the 400 and the 503 too.
//! * `RateLimitLayerBuilder::refund_spawner`: "a task dropped unfinished (by
//!   `spawn`, or by a runtime shutting down) leaves the charges it had not given
//!   back taken, each counted in its rule's `errors` by the task's own drop"; a
//!   panicking spawner: "a task the spawner kept before panicking still runs, and
//!   counts only what it does not give back".
//!
//! The remote limit is the in-memory double of `common/remote.rs`; no test sleeps.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use floodgate::{ManualClock, Policy, RateLimiter, Shaper};
use floodgate_http::{Global, HeaderKey, OnLimiterError, QueueRule, RateLimitLayer, Rule};
use http::{Request, StatusCode};
use tower::{Layer, ServiceExt};
#[path = "common/answer.rs"]
mod answer;
mod common;
#[path = "common/remote.rs"]
mod remote;
use answer::Answer;
use common::{Down, Hello, TestResult};
use remote::{from, paused_runtime, remote_then_queue, waiting_b, Remote};

/// "dear" (in-process, cost 4, 7 an hour) then a global queue of cost 1 (1 per
/// 10 s, burst 2, waiting at most 1 s), on one standing clock. The first request
/// takes 4 of dear's 7 and books the queue 10 s ahead (1 more unit reservable
/// within its bound); the second is denied by dear with 3 units left, and the
/// queue, peeked, would admit it with 1 left: the 429 says `Remaining: 1`.
///
/// Mutation seen failing: `QueueRule::peek_later` answering `None` (the queue not
/// peeked): `Remaining: 3`, more than the queue lets through.
#[tokio::test]
async fn a_429s_remaining_counts_a_later_queue_that_would_admit() -> TestResult {
    let clock = ManualClock::new();
    let dear = RateLimiter::gcra_with_clock(
        Policy::new(7, Duration::from_secs(3_600))?.with_burst(7)?,
        clock.clone(),
    );
    let shaper = Shaper::with_clock(
        Policy::new(1, Duration::from_secs(10))?.with_burst(2)?,
        clock.clone(),
    );
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("dear", dear, Global)?.cost(4))
        .queue(QueueRule::new("queue", shaper, Duration::from_secs(1))?)
        .build()?;
    let svc = layer.layer(Hello);
    let first = svc.clone().oneshot(Request::new(())).await?;
    assert_eq!(first.status(), StatusCode::OK);
    let second = Answer::read(svc.oneshot(Request::new(())).await?)
        .await
        .map_err(|e| e.to_string())?;
    assert_eq!(
        second.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        second.body
    );
    assert_eq!(
        second.header("x-ratelimit-remaining"),
        Some("1"),
        "{:?}",
        second.headers
    );
    Ok(())
}

/// A spawner that bounds the refund tasks and drops one it refuses: "b"'s charge
/// stays taken, counted in `errors` once (by the task's drop).
///
/// Mutation seen failing: `SpawnedRefunds`' drop not counting its refunds
/// (`errors` 0).
#[test]
fn a_spawner_that_drops_the_task_leaves_the_charges_taken_counted() -> TestResult {
    let remote = Remote::new()?;
    let handed = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let seen = Arc::clone(&handed);
    let layer = remote_then_queue(&remote)?
        .refund_spawner(move |task| {
            seen.fetch_add(1, Ordering::SeqCst);
            drop(task);
        })
        .build()?;
    let rt = paused_runtime()?;
    let waiting = waiting_b(&rt, &layer)?;
    drop(waiting);
    assert_eq!(handed.load(Ordering::SeqCst), 1, "one task, refused");
    assert_eq!(remote.refunds.load(Ordering::SeqCst), 0);
    assert_eq!(remote.left("b"), 2, "b's charge stays taken");
    assert_eq!(remote.left("a"), 2);
    assert_eq!(layer.rule_stats("per-user").map(|s| s.errors), Some(1));
    Ok(())
}

/// No spawner; "b"'s future is held by a task of a runtime that is then shut down:
/// the future is dropped during the shutdown, its refund task is spawned on the
/// runtime going away and dropped unrun. The charge stays taken, counted in
/// `errors` once (by the task's drop), and nothing panics.
///
/// Mutation seen failing: `SpawnedRefunds`' drop not counting its refunds
/// (`errors` 0).
#[test]
fn a_runtime_shutting_down_drops_the_refund_task_charges_taken_counted() -> TestResult {
    let remote = Remote::new()?;
    let layer = remote_then_queue(&remote)?.build()?;
    let rt = paused_runtime()?;
    let waiting = waiting_b(&rt, &layer)?;
    // The runtime's own task holds "b" (its slot 100 ms away on a standing clock:
    // it never comes), then the runtime shuts down and drops it.
    drop(rt.spawn(waiting));
    rt.block_on(async {
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
    });
    assert_eq!(remote.left("b"), 2, "b is charged and waiting");
    drop(rt);
    assert_eq!(remote.refunds.load(Ordering::SeqCst), 0);
    assert_eq!(remote.left("b"), 2, "b's charge stays taken");
    assert_eq!(layer.rule_stats("per-user").map(|s| s.errors), Some(1));
    Ok(())
}

/// The remote per-user rule (refunds), then a rule that rejects "b"'s request
/// without a 429: a key it cannot read (`x-plan` missing: 400), or a backend that
/// is down under `FailClosed` (503). Each time "b"'s remote charge comes back: it
/// keeps its 3 units, one refund per request, no error counted.
///
/// Mutation seen failing: the 400 branch of the walk without
/// `held.give_back_remote().await` ("b" left 2 after the 400); the same in the 503
/// branch (left 2 after the 503).
#[tokio::test]
async fn a_400_or_503_after_a_remote_rule_gives_its_charge_back() -> TestResult {
    let remote = Remote::new()?;
    let per_user = || {
        Rule::remote_shared(
            "per-user",
            Arc::clone(&remote),
            HeaderKey::new("x-user").map_err(|e| e.to_string())?,
        )
        .map_err(|e| e.to_string())
    };
    let bad_key = RateLimitLayer::builder()
        .rule(per_user()?)
        .rule(Rule::new(
            "plan",
            RateLimiter::gcra(Policy::per_second(100)?),
            HeaderKey::new("x-plan")?,
        )?)
        .build()?;
    let down = RateLimitLayer::builder()
        .rule(per_user()?)
        .rule(Rule::remote("down", Down, Global)?)
        .on_limiter_error(OnLimiterError::FailClosed)
        .build()?;
    for (layer, status, made) in [
        (&bad_key, StatusCode::BAD_REQUEST, 1),
        (&down, StatusCode::SERVICE_UNAVAILABLE, 2),
    ] {
        let answer = layer.layer(Hello).oneshot(from("b")).await?;
        assert_eq!(answer.status(), status);
        assert_eq!(remote.refunds.load(Ordering::SeqCst), made, "{status}");
        assert_eq!(remote.left("b"), 3, "{status}: b's charge given back");
        assert_eq!(layer.rule_stats("per-user").map(|s| s.errors), Some(0));
    }
    Ok(())
}

/// A spawner that keeps the task and then panics: the drop does not panic, and the
/// task the spawner kept still gives the charge back when run; no error is counted
/// (the task counts only what it does not give back).
///
/// Mutations seen failing: `spawn` calling the spawner without `catch_unwind` (the
/// drop panics); `spawn_refunds` counting each refund as not run when the spawner
/// panics (`errors` 1).
#[test]
fn a_task_kept_by_a_spawner_that_panics_still_gives_the_charge_back() -> TestResult {
    let remote = Remote::new()?;
    let kept = Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = Arc::clone(&kept);
    let layer = remote_then_queue(&remote)?
        .refund_spawner(move |task| {
            if let Ok(mut kept) = keep.lock() {
                kept.push(task);
            }
            panic!("a spawner that fails after keeping the task");
        })
        .build()?;
    let rt = paused_runtime()?;
    let waiting = waiting_b(&rt, &layer)?;
    let dropped = std::thread::spawn(move || drop(waiting)).join();
    assert!(dropped.is_ok(), "dropping the request must not panic");
    assert_eq!(layer.rule_stats("per-user").map(|s| s.errors), Some(0));
    assert_eq!(remote.left("b"), 2, "not run yet");
    let tasks = std::mem::take(&mut *kept.lock().map_err(|e| e.to_string())?);
    assert_eq!(tasks.len(), 1);
    for task in tasks {
        rt.block_on(task);
    }
    assert_eq!(remote.left("b"), 3, "the kept task gave the charge back");
    assert_eq!(layer.rule_stats("per-user").map(|s| s.errors), Some(0));
    Ok(())
}
