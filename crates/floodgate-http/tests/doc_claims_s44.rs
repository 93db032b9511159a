//! The layer's promises added in session 44 that no other test pins down
//! (feature `queue`).
//!
//! * `RateLimitLayerBuilder::max_refund_tasks`: "The most refund tasks of dropped
//!   requests in flight at once …; 4096 by default" (and `refund_spawner`: "bounded
//!   per layer (…, 4096 by default)"): a layer built without the setting spawns
//!   exactly 4096 tasks, and the next dropped request's charge stays taken,
//!   counted in `errors`.
//! * The crate's "How rules combine", a later priority rule peeked: "its tier's
//!   places and the lower tiers it could shed — and when that arrival would be
//!   refused, the 429's `Retry-After` is at least the wait the rule's own refusal
//!   would give … A request the rule would queue counts as admitted": a full tier
//!   with a lower waiter to shed would queue the request, so the 429 is the earlier
//!   rule's alone, and the peek sheds nobody.
//! * `max_refund_tasks`: at the cap, the charges "each counted in its rule's
//!   `errors` (and logged with feature `tracing`)" — with `--features
//!   queue,tracing` (or `--all-features`) only.
//!
//! The remote limit is the in-memory double of `common/remote.rs`; no test sleeps.

use tokio::time::Instant;
use tower::Layer;
#[path = "common/answer.rs"]
mod answer;
mod common;
#[path = "common/priority.rs"]
mod priority;
#[path = "common/remote.rs"]
mod remote;
use common::{Hello, TestResult};
use priority::{arrive, per_user_then_priority, send};
use remote::{
    a_holds_the_slot, dropped_while_queued, errors, paused_runtime, remote_then_queue, Remote,
    Tasks,
};

/// The documented default of `max_refund_tasks`.
const DEFAULT_CAP: usize = 4096;

/// A layer built without `max_refund_tasks` (a spawner that keeps every task,
/// none run): 4096 requests dropped while queued, each holding a remote charge,
/// make 4096 tasks; the 4097th makes none, its charge stays taken and is counted
/// in `errors`. Each user is charged once, so every charge is its own.
///
/// Mutations seen failing: `DEFAULT_MAX_REFUND_TASKS` 4095 (the 4096th request
/// not spawned: `errors` 1 within the cap) and 4097 (the 4097th spawned: 4097
/// tasks).
#[test]
fn the_default_cap_is_4096_refund_tasks() -> TestResult {
    let remote = Remote::new()?;
    let tasks = Tasks::default();
    let layer = tasks.spawner(remote_then_queue(&remote)?).build()?;
    let rt = paused_runtime()?;
    a_holds_the_slot(&rt, &layer)?;
    for i in 0..DEFAULT_CAP {
        dropped_while_queued(&rt, &layer, &format!("u{i}"))?;
    }
    assert_eq!(
        errors(&layer),
        Some(0),
        "every refund within the cap spawned"
    );
    dropped_while_queued(&rt, &layer, "beyond")?;
    let held = tasks.take()?;
    assert_eq!(held.len(), DEFAULT_CAP, "the default cap");
    assert_eq!(
        errors(&layer),
        Some(1),
        "the refund beyond the cap, counted"
    );
    assert_eq!(remote.left("beyond"), 2, "its charge stays taken");
    let mut held = held;
    if let Some(task) = held.pop() {
        rt.block_on(task);
    }
    assert_eq!(
        remote.left(&format!("u{}", DEFAULT_CAP - 1)),
        3,
        "a kept task still gives back"
    );
    drop(held);
    assert_eq!(
        errors(&layer),
        Some(DEFAULT_CAP as u64),
        "the tasks dropped unrun count their refunds"
    );
    Ok(())
}

/// Tier 0 of two places, tier 1 of one. "a" takes the free slot (the shaper's TAT
/// at 10 s); "b" waits in tier 0 holding the slot at 10 s, "d" waits in tier 0
/// behind it, "c" fills tier 1. "a" again in tier 1 is denied by the per-user rule
/// (2 s); the priority rule would queue it, shedding "d" (the newest tier-0 waiter,
/// not the holder): it counts as admitted, so the 429 is the per-user rule's alone
/// (`Retry-After: 2`), where a peek that ignored shedding would show the rule's
/// refusal of a full tier. The peek shed nobody: "b", "c" and "d" are all served.
///
/// Mutations seen failing: `PriorityRule::peek_later` taking an arrival that
/// would shed (`Join { shed: Some(_) }`) as a refusal, and `PriorityRule::arrive`
/// shedding no lower tier (`shed` always `None`): both make the 429 the priority
/// rule's, `Retry-After: 30`.
#[tokio::test(start_paused = true)]
async fn a_429_carries_no_priority_refusal_where_the_tier_could_shed_a_lower_waiter() -> TestResult
{
    let start = Instant::now();
    let layer = per_user_then_priority(start, &[2, 1])?;
    assert_eq!(send(&layer, "a", 0).await?.status, 200);
    let svc = layer.layer(Hello);
    let b = arrive(&svc, "b", 0).await;
    let d = arrive(&svc, "d", 0).await;
    let c = arrive(&svc, "c", 1).await;

    let denied = send(&layer, "a", 1).await?;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("retry-after"), Some("2"), "{}", denied.body);
    assert!(denied.body.contains("\"per-user\""), "{}", denied.body);
    assert!(!denied.body.contains("\"prio\""), "{}", denied.body);

    // The peek shed nobody and took no place.
    assert_eq!(layer.rule_stats("prio").map(|s| s.denied), Some(0));
    assert_eq!((b.await?, c.await?, d.await?), (200, 200, 200));
    Ok(())
}

/// The `tracing` events of one thread, by their message (feature `tracing`).
#[cfg(feature = "tracing")]
mod events {
    use std::sync::{Arc, Mutex};

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata, Subscriber};

    /// Keeps each event's message and its `rule` and `max` fields.
    #[derive(Clone, Default)]
    pub struct Events(pub Arc<Mutex<Vec<String>>>);

    struct Line(String);

    impl Visit for Line {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0.push_str(&format!("{}={value:?};", field.name()));
        }
    }

    impl Subscriber for Events {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut line = Line(String::new());
            event.record(&mut line);
            if let Ok(mut events) = self.0.lock() {
                events.push(line.0);
            }
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }
}

/// `max_refund_tasks`: at the cap a dropped request's charges stay taken, "each
/// counted in its rule's `errors` (and logged with feature `tracing`)". With a
/// cap of 1 (a spawner that keeps the task), the second request dropped while
/// queued logs one event naming its rule and the cap; the first, spawned, logs
/// nothing.
///
/// Mutation seen failing: the at-cap `tracing::warn!` in `spawn_refunds` removed
/// (no event).
#[cfg(feature = "tracing")]
#[test]
fn a_refund_not_spawned_at_the_cap_is_logged() -> TestResult {
    let remote = Remote::new()?;
    let (tasks, layer) = remote::kept_tasks_layer(&remote, 1)?;
    let rt = paused_runtime()?;
    let events = events::Events::default();
    let seen = std::sync::Arc::clone(&events.0);
    tracing::subscriber::with_default(events, || {
        a_holds_the_slot(&rt, &layer)?;
        dropped_while_queued(&rt, &layer, "b")?;
        let at_cap = |e: &String| e.contains("refund tasks are at their cap");
        let before = seen.lock().map_err(|e| e.to_string())?.clone();
        assert!(!before.iter().any(at_cap), "{before:?}");
        dropped_while_queued(&rt, &layer, "c")?;
        let after = seen.lock().map_err(|e| e.to_string())?.clone();
        let logged: Vec<&String> = after.iter().filter(|e| at_cap(e)).collect();
        assert_eq!(logged.len(), 1, "{after:?}");
        assert!(logged[0].contains("rule=per-user"), "{logged:?}");
        assert!(logged[0].contains("max=1"), "{logged:?}");
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    assert_eq!(errors(&layer), Some(1), "c's refund, counted");
    assert_eq!(tasks.take()?.len(), 1, "b's task, kept");
    Ok(())
}
