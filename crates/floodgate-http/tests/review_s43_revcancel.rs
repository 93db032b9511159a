//! Session 43, review of the dropped-request refunds (feature `queue`): a refund
//! spawner that panics (the documented `tokio::spawn` one, outside a runtime) must
//! not turn a dropped request into a panic, and a rejection dropped half-way through
//! its refunds gives each remote charge back exactly once.
//!
//! The remote limit is the in-memory double with receipts and refunds of
//! `common/remote.rs` ([`Remote`]);
//! time is Tokio's paused clock or a `ManualClock`, so no test sleeps for real.

use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::Duration;

use floodgate::{ManualClock, Policy, RateLimiter};
use floodgate_http::{Global, RateLimitLayer, Rule};
use tower::{Layer, ServiceExt};
mod common;
#[path = "common/remote.rs"]
mod remote;
use common::{Hello, TestResult};
use remote::{
    a_served_then_b, from, paused_runtime, per_user, remote_then_queue, waiting_b, Remote, Tasks,
};

/// The refund spawner of `RateLimitLayerBuilder::refund_spawner`'s example,
/// `tokio::spawn`, panics where there is no runtime; a request dropped there (its
/// future moved off the runtime's thread) must not panic: its charge stays taken,
/// counted in the rule's `errors`, as with no spawner at all.
///
/// Mutation seen failing: `spawn` calling the spawner without `catch_unwind` (the
/// drop panics: "there is no reactor running").
#[test]
fn a_panicking_refund_spawner_does_not_panic_the_drop() -> TestResult {
    let remote = Remote::new()?;
    let layer = remote_then_queue(&remote)?
        .refund_spawner(|task| {
            tokio::spawn(task);
        })
        .build()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    let waiting = waiting_b(&rt, &layer)?;
    let dropped = std::thread::spawn(move || drop(waiting)).join();
    assert!(dropped.is_ok(), "dropping the request must not panic");
    assert_eq!(remote.refunds.load(Ordering::SeqCst), 0);
    assert_eq!(remote.left("b"), 2, "nothing ran the refund");
    assert_eq!(layer.rule_stats("per-user").map(|s| s.errors), Some(1));
    // The layer still serves: "c" waits for its slot like anyone.
    let c = rt.block_on(async {
        tokio::time::timeout(
            Duration::from_millis(10),
            layer.layer(Hello).oneshot(from("c")),
        )
        .await
    });
    assert!(c.is_err(), "c waits for the queue's slot (standing clock)");
    Ok(())
}

/// Two remote rules with refunds charge "b"; an in-process global rule then turns it
/// away. The first rule's refund completes at once, the second's takes 1 s; the
/// client goes away 10 ms in. The finished refund is not made again and the one
/// under way goes on in a spawned task: each charge comes back exactly once.
///
/// Mutation seen failing: `Refunds::run` keeping finished refunds pending (the
/// finished one is polled again: "`async fn` resumed after completion").
#[tokio::test(start_paused = true)]
async fn a_rejection_dropped_half_way_through_its_refunds_gives_each_back_once() -> TestResult {
    let fast = Remote::new()?;
    let slow = Remote::new()?;
    slow.slow.store(true, Ordering::SeqCst);
    let global = RateLimiter::gcra_with_clock(Policy::per_hour(1)?, ManualClock::new());
    let layer = RateLimitLayer::builder()
        .rule(per_user("fast", &fast)?)
        .rule(per_user("slow", &slow)?)
        .rule(Rule::new("global", global, Global)?)
        .build()?;
    let b = a_served_then_b(&mut layer.layer(Hello)).await?;
    assert!(tokio::time::timeout(Duration::from_millis(10), b)
        .await
        .is_err());
    assert_eq!(
        fast.left("b"),
        3,
        "the fast refund finished before the drop"
    );
    assert_eq!(slow.left("b"), 2, "the slow refund is under way");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(fast.refunds.load(Ordering::SeqCst), 1);
    assert_eq!(slow.refunds.load(Ordering::SeqCst), 1);
    assert_eq!((fast.left("b"), slow.left("b")), (3, 3));
    assert_eq!(
        (fast.left("a"), slow.left("a")),
        (2, 2),
        "a keeps its charges"
    );
    let stats = layer.stats();
    assert_eq!((stats[0].errors, stats[1].errors), (0, 0));
    Ok(())
}

/// A refund task that is itself dropped unfinished (its spawner, or a runtime
/// shutting down, gave up on it after a poll) is not spawned again: the spawner gets
/// one task for the dropped request, never a second from that task's drop (with a
/// spawner that runs a task once and drops it, a respawn would loop for ever). The
/// charge it had not given back stays taken, counted in the rule's `errors` by the
/// task's drop.
///
/// Mutation seen failing: `Refunds`' drop ignoring `spawned` (a second task); since
/// the spawned task is its own type, `SpawnedRefunds`' drop handing its pending
/// refunds to `spawn_refunds` (a second task); that drop not counting them
/// (`errors` 0).
#[test]
fn a_refund_task_dropped_part_way_is_not_spawned_again() -> TestResult {
    let remote = Remote::new()?;
    remote.slow.store(true, Ordering::SeqCst);
    let tasks = Tasks::default();
    let layer = tasks.spawner(remote_then_queue(&remote)?).build()?;
    let rt = paused_runtime()?;
    drop(waiting_b(&rt, &layer)?);
    let mut first = tasks.take()?;
    assert_eq!(first.len(), 1, "one task for the dropped request");
    let mut task = first.remove(0);
    // One poll: the refund's round trip is under way (1 s on the paused clock).
    let pending = rt.block_on(std::future::poll_fn(|cx| {
        Poll::Ready(task.as_mut().poll(cx).is_pending())
    }));
    assert!(pending, "the refund must be under way");
    drop(task);
    assert_eq!(
        tasks.take()?.len(),
        0,
        "a dropped refund task is not respawned"
    );
    assert_eq!(remote.refunds.load(Ordering::SeqCst), 0);
    assert_eq!(
        remote.left("b"),
        2,
        "the charge it had not given back stays taken"
    );
    assert_eq!(layer.rule_stats("per-user").map(|s| s.errors), Some(1));
    Ok(())
}
