//! What the `plans` fuzz target (`fuzz/fuzz_targets/plans.rs`) found, as deterministic
//! tests that failed before their fix.
//!
//! A window key whose refund emptied its count keeps its stored window, so that a
//! reading behind that window counts there and never in an older window whose count
//! the state no longer knows. But `is_idle` looked only at the count, so such a key
//! was idle at a reading behind its window: an insert decided at an earlier reading
//! (a thread that read the clock, stalled, then decided; `check_n_at`) reclaimed it
//! as if nothing were lost, and the key's later readings in the older window counted
//! afresh — 6 units over two fixed windows of 2, where the un-keyed limiter admits 4.
//! Now an emptied window ahead of the reading is not idle (reclamation keeps it;
//! only an eviction, counted as one, may drop it).
#![cfg(not(loom))]

use std::time::Duration;

use floodgate::keyed::plans::{PlanAlgorithm, PlanId, PlanLimiter, Plans};
use floodgate::{
    FixedWindow, Heap, KeyedBuilder, ManualClock, Nanos, Policy, RateLimiter, SlidingWindow,
};

/// `ms` milliseconds.
fn ms(ms: u64) -> Nanos {
    Nanos::new(ms * 1_000_000)
}

/// One plan of 2 per second (its id), on a one-shard table of `capacity` keys, the
/// clock at 10.5 s (window 10), and an un-keyed twin of the same algorithm.
#[allow(clippy::type_complexity)]
fn setup<A: PlanAlgorithm>(
    capacity: usize,
) -> (
    ManualClock,
    PlanId,
    PlanLimiter<u64, impl Fn(&u64) -> PlanId, ManualClock, Heap, A>,
    RateLimiter<A, ManualClock>,
) {
    let policy = Policy::new(2, Duration::from_secs(1)).unwrap();
    let mut plans = Plans::new();
    let only = plans.insert("only", policy);
    let clock = ManualClock::starting_at(ms(10_500));
    let limiter = PlanLimiter::new_in(
        &plans,
        move |_: &u64| only,
        KeyedBuilder::default()
            .capacity(capacity)
            .shards(1)
            .clock(clock.clone()),
    )
    .unwrap();
    let twin = RateLimiter::with_clock(A::for_policy(policy).unwrap(), clock.clone());
    (clock, only, limiter, twin)
}

/// Key 1 admits 2 units at `early` (an older window), then a charge of 1 at 10.5 s is
/// refunded: its state holds window 10, emptied. The twin gets the same requests.
fn empty_window_ahead<R, A>(
    limiter: &PlanLimiter<u64, R, ManualClock, Heap, A>,
    twin: &RateLimiter<A, ManualClock>,
    early: Nanos,
) where
    R: Fn(&u64) -> PlanId,
    A: PlanAlgorithm,
{
    assert!(limiter.check_n_at(&1, early, 2).is_allowed());
    assert!(twin.check_n_at(early, 2).is_allowed());
    let (d, receipt) = limiter.charge_at(&1, ms(10_500), 1);
    assert!(d.is_allowed());
    assert!(limiter.refund(&1, receipt));
    let (_, receipt) = twin.charge_at(ms(10_500), 1);
    assert!(twin.refund(receipt));
}

/// Key 9 counts 1 unit at `idle_at`, long enough ago to be idle at `insert_at`; key 1
/// empties a window ahead of `insert_at` (see [`empty_window_ahead`]); key 2 is
/// inserted at the earlier reading `insert_at`, in a table of two keys: room is made
/// by reclaiming the idle key 9 — and, before the fix, key 1 too. Then key 1 must
/// decide as its twin at each of `after`, 2 units at a time.
fn reclaim_behind<A: PlanAlgorithm>(
    early: Nanos,
    idle_at: Nanos,
    insert_at: Nanos,
    after: [u64; 2],
) {
    // Slot layouts differ from table to table (random hash seeds): many tables.
    for _ in 0..64 {
        let (_, _, limiter, twin) = setup::<A>(2);
        assert!(limiter.check_n_at(&9, idle_at, 1).is_allowed());
        empty_window_ahead(&limiter, &twin, early);
        assert!(limiter.check_n_at(&2, insert_at, 1).is_allowed());
        let m = limiter.metrics();
        assert_eq!(
            (m.reclaimed, m.evicted),
            (1, 0),
            "key 1 was dropped as idle: {m:?}"
        );
        for at in after {
            assert_eq!(
                limiter.check_n_at(&1, ms(at), 2),
                twin.check_n_at(ms(at), 2),
                "at {at} ms"
            );
        }
    }
}

/// Fixed window. Key 1 holds 2 units of window 9 (at 9.5 s), then an emptied window
/// 10. Dropped as idle by an insert read at 9.6 s, it counted 2 more in window 9 at
/// 9.7 s and 2 in window 10 at 10.6 s: 6 units in two windows of 2. Its twin counts
/// the 9.7 s units in window 10 (the state's) and denies at 10.6 s.
#[test]
fn a_fixed_window_emptied_by_a_refund_is_not_idle_at_a_reading_behind_it() {
    reclaim_behind::<FixedWindow>(ms(9_500), ms(8_500), ms(9_600), [9_700, 10_600]);
}

/// Sliding window counter. Key 1 holds 2 units of window 8 (at 8.5 s), then an
/// emptied window 10 with nothing in window 9. Dropped as idle by an insert read at
/// 9.1 s, it admitted 2 at 9.2 s (window 8's 2 still weigh 80 % there: an estimate of
/// 3 > 2) and 1 more at 10.5 s: 5 units where its twin admits 4.
#[test]
fn a_sliding_window_emptied_by_a_refund_is_not_idle_at_a_reading_behind_it() {
    reclaim_behind::<SlidingWindow>(ms(8_500), ms(6_500), ms(9_100), [9_200, 10_500]);
}

/// The path the fuzzer took: a one-key table, and another key inserted at a reading
/// behind key 1's emptied window. Key 1 must not be dropped as idle (reclaimed, which
/// loses nothing by contract); making room for the insert evicts it (a live key:
/// counted as an eviction, the one loss the table admits to).
#[test]
fn an_insert_at_an_earlier_reading_evicts_an_emptied_window_ahead_of_it() {
    fn run<A: PlanAlgorithm>(early: Nanos, insert_at: Nanos) {
        let (_, _, limiter, twin) = setup::<A>(1);
        empty_window_ahead(&limiter, &twin, early);
        assert!(limiter.check_n_at(&2, insert_at, 1).is_allowed());
        let m = limiter.metrics();
        assert_eq!((m.reclaimed, m.evicted), (0, 1), "{m:?}");
    }
    run::<FixedWindow>(ms(9_500), ms(9_600));
    run::<SlidingWindow>(ms(8_500), ms(9_100));
}
