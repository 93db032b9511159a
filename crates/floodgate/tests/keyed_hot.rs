//! The per-key hot-key mode: cold keys exact, promotions and demotions that lose and
//! invent no unit (also racing checks on many threads), the lease bound for hot keys,
//! detection, slot reuse, and hot keys surviving a flood of cold ones — on every
//! storage.
#![cfg(not(loom))]

#[macro_use]
mod common;

use std::time::Duration;

use floodgate::{
    Gcra, HotKeyLimiter, HotKeys, KeyedBuilder, KeyedLimiter, ManualClock, Nanos, Policy, Storage,
};
use proptest::prelude::*;

/// B = 100, T = 10 ms.
fn policy() -> Policy {
    Policy::per_second(100).unwrap().with_burst(100).unwrap()
}

fn hot_on<S: Storage<u64, floodgate::GcraState>>(
    clock: &ManualClock,
    hot: HotKeys,
) -> HotKeyLimiter<u64, ManualClock, S> {
    HotKeyLimiter::new_in(
        policy(),
        KeyedBuilder::default().capacity(4_096).clock(clock.clone()),
        hot,
    )
    .unwrap()
}

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Check { key: u64, cost: u32 },
    Peek { key: u64, cost: u32 },
    Remove { key: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u64..30_000_000).prop_map(Op::Advance),
        8 => (0u64..5, 0u32..40).prop_map(|(key, cost)| Op::Check { key, cost }),
        2 => (0u64..5, 0u32..40).prop_map(|(key, cost)| Op::Peek { key, cost }),
        1 => (0u64..5).prop_map(|key| Op::Remove { key }),
    ]
}

/// With no key hot, the limiter is the keyed table's exact GCRA.
fn cold_keys_match_the_keyed_table<S: Storage<u64, floodgate::GcraState>>(ops: &[Op]) {
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let hot: HotKeyLimiter<u64, ManualClock, S> = hot_on(&clock, HotKeys::default().manual());
    let twin: KeyedLimiter<u64, Gcra, ManualClock, S> = KeyedBuilder::new(Gcra::new(policy()))
        .capacity(4_096)
        .clock(clock.clone())
        .build_in()
        .unwrap();
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Advance(ns) => {
                clock.advance(Duration::from_nanos(ns));
            }
            Op::Check { key, cost } => {
                assert_eq!(
                    hot.check_n(&key, cost),
                    twin.check_n(&key, cost),
                    "step {step}"
                );
            }
            Op::Peek { key, cost } => {
                assert_eq!(hot.peek(&key, cost), twin.peek(&key, cost), "step {step}");
            }
            Op::Remove { key } => {
                assert_eq!(hot.remove(&key), twin.remove(&key), "step {step}");
            }
        }
    }
    assert_eq!(hot.metrics(), twin.metrics());
}

proptest! {
    #![proptest_config(crate::common::cases(64))]

    #[test]
    fn cold_keys_are_the_keyed_tables_exact_gcra(ops in prop::collection::vec(op(), 1..200)) {
        cold_keys_match_the_keyed_table::<floodgate::Heap>(&ops);
        cold_keys_match_the_keyed_table::<floodgate::Inline>(&ops);
        cold_keys_match_the_keyed_table::<floodgate::Fingerprint>(&ops);
    }
}

#[test]
fn a_promotion_and_a_demotion_lose_and_invent_no_unit() {
    on_every_storage!(promotion_keeps_the_schedule);
}

fn promotion_keeps_the_schedule<S: Storage<u64, floodgate::GcraState>>() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let limiter: HotKeyLimiter<u64, ManualClock, S> = hot_on(
        &clock,
        HotKeys::default().manual().lease_shards(1).lease_size(8),
    );
    let mut admitted = 0;
    for _ in 0..30 {
        admitted += u32::from(limiter.check(&7).is_allowed());
    }
    assert!(limiter.promote(&7));
    assert!(limiter.is_hot(&7));
    while limiter.check(&7).is_allowed() {
        admitted += 1;
    }
    // The clock stands still: the burst, exactly, over both modes.
    assert_eq!(admitted, 100);
    assert!(limiter.demote(&7));
    assert!(!limiter.is_hot(&7));
    assert!(!limiter.check(&7).is_allowed());
    clock.advance(Duration::from_millis(10));
    assert!(
        limiter.check(&7).is_allowed(),
        "one interval later, one unit"
    );
    assert!(!limiter.check(&7).is_allowed());
    let hot = limiter.hot_metrics();
    assert_eq!((hot.hot_keys, hot.promotions, hot.demotions), (0, 1, 1));
    let m = limiter.metrics();
    assert_eq!(m.allowed, 101);
}

#[test]
fn threads_on_a_hot_key_never_pass_the_burst_while_the_clock_stands() {
    on_every_storage!(threads_within_the_burst);
}

fn threads_within_the_burst<S: Storage<u64, floodgate::GcraState>>() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let limiter: HotKeyLimiter<u64, ManualClock, S> = hot_on(
        &clock,
        HotKeys::default().manual().lease_shards(4).lease_size(5),
    );
    assert!(limiter.promote(&1));
    let admitted: u64 = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|_| s.spawn(|| (0..200).filter(|_| limiter.check(&1).is_allowed()).count() as u64))
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    // Every unit came from the central word (B = 100, no time passed); at most the
    // units stranded on other shards' leases (4 shards × 5) went unspent.
    assert!(admitted <= 100, "admitted {admitted}");
    assert!(admitted >= 100 - 4 * 5, "admitted only {admitted}");
}

#[test]
fn promotions_and_demotions_racing_checks_never_pass_the_burst() {
    on_every_storage!(promotions_racing_checks);
}

fn promotions_racing_checks<S: Storage<u64, floodgate::GcraState>>() {
    for round in 0..20 {
        let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
        let limiter: HotKeyLimiter<u64, ManualClock, S> = hot_on(
            &clock,
            HotKeys::default().manual().lease_shards(2).lease_size(3),
        );
        let admitted: u64 = std::thread::scope(|s| {
            let flipper = s.spawn(|| {
                for i in 0..200 {
                    if i % 2 == 0 {
                        limiter.promote(&9);
                    } else {
                        limiter.demote(&9);
                    }
                }
            });
            let workers: Vec<_> = (0..3)
                .map(|_| {
                    s.spawn(|| (0..300).filter(|_| limiter.check(&9).is_allowed()).count() as u64)
                })
                .collect();
            flipper.join().unwrap();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        assert!(admitted <= 100, "round {round}: admitted {admitted}");
        // Whatever mode it ends in, nothing is left to admit.
        limiter.demote(&9);
        assert!(!limiter.check(&9).is_allowed(), "round {round}");
    }
}

#[test]
fn detection_promotes_a_key_hit_from_two_threads_only() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let detect = HotKeys::default().detection(1, Duration::from_secs(1), 20, 2);
    let limiter: HotKeyLimiter<u64, ManualClock, floodgate::Heap> = HotKeyLimiter::new(
        Policy::per_second(1_000_000).unwrap(),
        KeyedBuilder::default().clock(clock.clone()),
        detect,
    )
    .unwrap();
    // One thread alone, however busy, is no contention.
    for _ in 0..1_000 {
        let _ = limiter.check(&1);
    }
    assert!(!limiter.is_hot(&1));
    // Two threads, one after the other: samples within one window count whether or
    // not the threads overlap, and overlapping ones may skip samples (a busy lock
    // skips one: a thread stalled holding it let the other's 100 checks all go by).
    let hit = || {
        for _ in 0..100 {
            let _ = limiter.check(&2);
        }
    };
    std::thread::scope(|s| s.spawn(hit).join().unwrap());
    assert!(!limiter.is_hot(&2), "one other thread alone");
    std::thread::scope(|s| s.spawn(hit).join().unwrap());
    assert!(limiter.is_hot(&2));
    assert!(!limiter.is_hot(&1));
    assert_eq!(limiter.hot_metrics().promotions, 1);
}

#[test]
fn an_idle_hot_key_gives_its_slot_to_a_new_one() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let limiter: HotKeyLimiter<u64, ManualClock, floodgate::Inline> =
        hot_on(&clock, HotKeys::default().manual().slots(1).lease_size(4));
    assert!(limiter.promote(&1));
    assert!(limiter.check(&1).is_allowed()); // 3 units out on lease
    assert!(!limiter.promote(&2), "key 1 holds leased units: not idle");
    // Past the lease lifetime and key 1's schedule: idle.
    clock.advance(Duration::from_secs(2));
    assert!(limiter.promote(&2));
    assert!(!limiter.is_hot(&1) && limiter.is_hot(&2));
    // Key 1's four leased units were counted; its schedule has caught up by now.
    assert_eq!(limiter.peek(&1, 0).remaining(), 100);
}

#[test]
fn a_hot_key_survives_a_flood_of_cold_ones() {
    on_every_storage!(hot_key_survives_a_flood);
}

fn hot_key_survives_a_flood<S: Storage<u64, floodgate::GcraState>>() {
    const SHARDS: usize = 64;
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let limiter: HotKeyLimiter<u64, ManualClock, S> = HotKeyLimiter::new_in(
        Policy::per_second(1).unwrap().with_burst(1_000).unwrap(),
        KeyedBuilder::default()
            .capacity(64)
            .shards(1)
            .clock(clock.clone()),
        HotKeys::default()
            .manual()
            .lease_shards(SHARDS)
            .lease_size(10),
    )
    .unwrap();
    assert!(limiter.promote(&0));
    // Whether this thread owns one of the key's lease shards: its owner index is
    // process-wide (taken here if it has none, kept until the thread exits), and the
    // tests running beside this one may hold the low indices; a thread past the
    // shard count decides on the central word alone and strands nothing.
    let owns = floodgate::LeasedGcra::builder(Policy::per_second(1).unwrap())
        .shards(SHARDS)
        .build_with_clock(clock.clone())
        .unwrap()
        .owns_shard();
    for _ in 0..5 {
        assert!(limiter.check(&0).is_allowed());
    }
    // Every cold key stays live (booked a second ahead), so the table evicts.
    for key in 1..10_000u64 {
        let _ = limiter.check(&key);
    }
    assert!(limiter.metrics().evicted > 0);
    assert!(limiter.is_hot(&0), "a sealed word is never the victim");
    assert!(limiter.demote(&0));
    // 10 leased (5 spent, 5 stranded) of 1 000; 5 taken from the central word alone
    // by a thread that owns no shard.
    let stranded = if owns { 5 } else { 0 };
    assert_eq!(
        limiter.peek(&0, 0).remaining(),
        995 - stranded,
        "owns a shard: {owns}"
    );
}

#[test]
fn removing_a_hot_key_demotes_it_first() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let limiter: HotKeyLimiter<u64, ManualClock, floodgate::Heap> =
        hot_on(&clock, HotKeys::default().manual());
    assert!(limiter.promote(&5));
    assert!(limiter.check_n(&5, 50).is_allowed());
    assert!(limiter.remove(&5));
    assert!(!limiter.is_hot(&5));
    assert_eq!(limiter.check(&5).remaining(), 99);
    assert_eq!(limiter.hot_metrics().hot_keys, 0);
}
