//! Runtime changes to a keyed limiter, on every storage (`Heap`, `Inline`,
//! `Fingerprint`): `remove(key)` and `reset(key)` (receipts from before give back
//! nothing; racing checks never admit more than one burst per removal), and
//! `set_policy` / `set_algorithm` (each live key's state carried over).
#![cfg(not(loom))]

#[macro_use]
mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use floodgate::{
    Algorithm, FixedWindow, Gcra, KeyedBuilder, KeyedLimiter, ManualClock, Nanos, Policy,
    SlidingWindow, Storage,
};

type Keyed<A, S> = KeyedLimiter<u64, A, ManualClock, S>;

fn keyed<A: Algorithm, S: Storage<u64, A::State>>(alg: A, clock: &ManualClock) -> Keyed<A, S> {
    common::keyed_on(alg, clock, 64, 2)
}

#[test]
fn remove_and_reset_forget_a_key_and_say_whether_it_was_there() {
    on_every_storage!(remove_and_reset_forget_a_key);
}

fn remove_and_reset_forget_a_key<S: Storage<u64, floodgate::GcraState>>() {
    let clock = ManualClock::starting_at(Nanos::from_secs(100));
    let keyed: Keyed<Gcra, S> = keyed(Gcra::new(Policy::per_minute(3).unwrap()), &clock);
    assert!(!keyed.remove(&1), "absent");
    assert!(!keyed.reset(&1), "absent");
    for key in [1, 2] {
        assert!(keyed.check_n(&key, 3).is_allowed());
        assert!(!keyed.check(&key).is_allowed());
    }
    assert!(keyed.reset(&1));
    assert!(keyed.remove(&2));
    for key in [1, 2] {
        assert_eq!(keyed.peek(&key, 0).remaining(), 3, "fresh again");
    }
    let m = keyed.metrics();
    assert_eq!((m.live_keys, m.removed), (0, 2));
}

#[test]
fn a_receipt_taken_before_a_reset_or_remove_refunds_nothing() {
    on_every_storage!(a_receipt_before_a_removal_refunds_nothing);
}

fn a_receipt_before_a_removal_refunds_nothing<S: Storage<u64, floodgate::GcraState>>() {
    let clock = ManualClock::starting_at(Nanos::from_secs(100));
    let keyed: Keyed<Gcra, S> = keyed(Gcra::new(Policy::per_minute(2).unwrap()), &clock);
    for remove in [false, true] {
        let (first, receipt) = keyed.charge(&7, 1);
        assert!(first.is_allowed());
        assert!(if remove {
            keyed.remove(&7)
        } else {
            keyed.reset(&7)
        });
        // The key is fresh and charged again: the old receipt must not give back
        // this new charge.
        assert!(keyed.check_n(&7, 2).is_allowed());
        assert!(
            !keyed.refund(&7, receipt),
            "the removal gave it back already"
        );
        assert!(!keyed.check(&7).is_allowed());
        assert!(keyed.remove(&7));
    }
    // A receipt for another key in the same table is void too when the removal
    // was in its shard (two shards here: with one it always is).
    let one_shard: Keyed<Gcra, S> = KeyedBuilder::new(Gcra::new(Policy::per_minute(2).unwrap()))
        .capacity(64)
        .shards(1)
        .clock(clock.clone())
        .build_in()
        .unwrap();
    let (_, receipt) = one_shard.charge(&1, 1);
    assert!(one_shard.check(&2).is_allowed());
    assert!(one_shard.remove(&2));
    assert!(!one_shard.refund(&1, receipt));
}

/// The guarantee of `remove` and `reset` under races: each one that finds the key
/// forgives at most one burst, and a check whose clock reading is older than a
/// removal never starts the fresh state in the past. The clock stands at 1000 s.
/// Two threads check, each alternating a reading of 500 s (a thread preempted for
/// 500 s between its clock read and its check) with the clock's; a third removes
/// (or resets) the key each time it is exhausted. Every decision after a removal
/// is judged at 1000 s, so between two removals the key admits exactly its burst B:
/// in all, at most B × (removals + 1). A fresh state started at 500 s would admit B
/// there and B again at 1000 s (checked: with the clamp to the removal instant
/// disabled, this test fails).
#[test]
fn racing_removals_never_admit_more_than_a_burst_per_removal() {
    on_every_storage!(racing_removals_admit_a_burst_per_removal);
}

fn racing_removals_admit_a_burst_per_removal<S: Storage<u64, floodgate::GcraState>>() {
    const BURST: u64 = 4;
    const CHECKS: usize = if cfg!(miri) { 500 } else { 1_000_000 };
    const REMOVALS: u64 = if cfg!(miri) { 5 } else { 300 };
    let now = Nanos::from_secs(1_000);
    let stale = Nanos::from_secs(500);
    let clock = ManualClock::starting_at(now);
    for use_reset in [false, true] {
        let gcra = Gcra::new(Policy::per_second(1).unwrap().with_burst(4).unwrap());
        let keyed: Keyed<Gcra, S> = keyed(gcra, &clock);
        // A removal before the race, so that every decision in it is judged at or
        // after 1000 s (the key's first state is not what is tested here).
        assert!(keyed.check(&7).is_allowed());
        assert!(keyed.remove(&7));
        let admitted = AtomicU64::new(0);
        let removed = AtomicU64::new(0);
        let done = AtomicBool::new(false);
        let checkers_left = AtomicUsize::new(2);
        std::thread::scope(|s| {
            let (keyed, admitted, removed, done) = (&keyed, &admitted, &removed, &done);
            let checkers_left = &checkers_left;
            let checkers: Vec<_> = [0, 1]
                .into_iter()
                .map(|phase| {
                    s.spawn(move || {
                        // Until the remover is done (bounded, should it stall);
                        // stale and current readings in turn.
                        for i in 0..CHECKS {
                            if done.load(Ordering::Relaxed) {
                                break;
                            }
                            let d = if (i + phase) % 2 == 0 {
                                keyed.check_n_at(&7, stale, 1)
                            } else {
                                keyed.check(&7)
                            };
                            if d.is_allowed() {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            } else {
                                // Denied until the next removal: let the remover run
                                // (the machine may have fewer cores than threads).
                                std::thread::yield_now();
                            }
                        }
                        checkers_left.fetch_sub(1, Ordering::Relaxed);
                    })
                })
                .collect();
            // Removes the key once it is exhausted at 1000 s (a peek denies: it
            // stays so until removed, the clock standing still). Each epoch is thus
            // driven to its limit, so an epoch that admitted more than B would push
            // the total past the bound.
            s.spawn(move || {
                let mut found = 0;
                while found < REMOVALS {
                    if keyed.peek(&7, 1).is_allowed() {
                        if checkers_left.load(Ordering::Relaxed) == 0 {
                            break;
                        }
                        std::thread::yield_now();
                        continue;
                    }
                    let present = if use_reset {
                        keyed.reset(&7)
                    } else {
                        keyed.remove(&7)
                    };
                    if present {
                        found += 1;
                        removed.store(found, Ordering::Relaxed);
                    }
                }
                done.store(true, Ordering::Relaxed);
            });
            for c in checkers {
                c.join().unwrap();
            }
        });
        let (admitted, removed) = (admitted.into_inner(), removed.into_inner());
        assert!(
            admitted <= BURST * (removed + 1),
            "{admitted} admitted with {removed} removals (reset: {use_reset})"
        );
        // Each removal took an exhausted key: B per epoch, exactly.
        assert!(admitted >= BURST * removed, "{admitted}");
        assert_eq!(keyed.metrics().removed, removed + 1);
    }
}

#[test]
fn set_policy_keeps_each_keys_schedule() {
    on_every_storage!(set_policy_keeps_schedules);
}

fn set_policy_keeps_schedules<S: Storage<u64, floodgate::GcraState>>() {
    let clock = ManualClock::new();
    let mut keyed: Keyed<Gcra, S> = keyed(Gcra::new(Policy::per_second(10).unwrap()), &clock);
    assert!(keyed.check_n(&1, 6).is_allowed());
    assert!(keyed.check_n(&2, 10).is_allowed());
    let (_, receipt) = keyed.charge(&3, 1);
    keyed.set_policy(Policy::per_second(5).unwrap());
    assert_eq!(keyed.algorithm().policy().limit(), 5);
    // TAT 600 ms: under 5/s (T = 200 ms, τ = 1 s) two units fit; TAT 1 s: none.
    assert_eq!(keyed.peek(&1, 0).remaining(), 2);
    assert_eq!(keyed.peek(&2, 0).remaining(), 0);
    assert_eq!(
        keyed.peek(&4, 0).remaining(),
        5,
        "a fresh key: the new burst"
    );
    // The receipt names the old configuration: void.
    assert!(!keyed.refund(&3, receipt));
    assert_eq!(keyed.peek(&3, 0).remaining(), 4);
    // Receipts taken after the change still work.
    let (_, receipt) = keyed.charge(&3, 1);
    assert!(keyed.refund(&3, receipt));
    assert_eq!(keyed.metrics().live_keys, 3);
}

#[test]
fn set_algorithm_carries_window_counts_over() {
    on_every_storage!(set_algorithm_carries_fixed_windows);
    on_every_storage!(set_algorithm_carries_sliding_windows);
}

fn set_algorithm_carries_fixed_windows<S: Storage<u64, floodgate::FixedWindowState>>() {
    let clock = ManualClock::starting_at(Nanos::from_secs(90));
    let fixed = |p| FixedWindow::new(p).unwrap();
    let mut keyed: Keyed<FixedWindow, S> = keyed(fixed(Policy::per_minute(10).unwrap()), &clock);
    assert!(keyed.check_n(&1, 4).is_allowed());
    assert!(keyed.check_n(&2, 9).is_allowed());
    // Same period: the counts stay (and may exceed the new limit: denied).
    keyed.set_algorithm(fixed(Policy::per_minute(5).unwrap()));
    assert_eq!(keyed.peek(&1, 0).remaining(), 1);
    assert!(!keyed.check(&2).is_allowed());
    // Another period: fresh windows.
    keyed.set_algorithm(fixed(Policy::per_hour(5).unwrap()));
    assert_eq!(keyed.peek(&1, 0).remaining(), 5);
    assert_eq!(keyed.peek(&2, 0).remaining(), 5);
}

fn set_algorithm_carries_sliding_windows<S: Storage<u64, floodgate::SlidingWindowState>>() {
    let clock = ManualClock::starting_at(Nanos::from_secs(90));
    let sliding = |p| SlidingWindow::new(p).unwrap();
    let mut keyed: Keyed<SlidingWindow, S> =
        keyed(sliding(Policy::per_minute(10).unwrap()), &clock);
    assert!(keyed.check_n(&1, 4).is_allowed());
    keyed.set_algorithm(sliding(Policy::per_minute(6).unwrap()));
    assert_eq!(keyed.peek(&1, 0).remaining(), 2);
    keyed.set_algorithm(sliding(Policy::per_hour(6).unwrap()));
    assert_eq!(keyed.peek(&1, 0).remaining(), 6);
}
