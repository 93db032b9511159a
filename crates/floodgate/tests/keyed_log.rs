//! The keyed sliding log: exact against one `SlidingLog` per key, bounded under a
//! flood of unique keys, holding its capacity without removals, never beyond its
//! limit under threads, and judging readings earlier than a removal at the removal.
#![cfg(not(loom))]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use floodgate::{
    check_all, Clock, KeyedBuilder, KeyedError, KeyedSlidingLog, ManualClock, Nanos, Policy,
    Receipt, SlidingLog,
};
use proptest::prelude::*;

const SECOND: u64 = 1_000_000_000;

fn log_of(
    policy: Policy,
    clock: &ManualClock,
    capacity: usize,
    shards: usize,
) -> KeyedSlidingLog<u64, ManualClock> {
    KeyedBuilder::default()
        .capacity(capacity)
        .shards(shards)
        .clock(clock.clone())
        .sliding_log(policy)
        .expect("valid configuration")
}

#[derive(Clone, Debug)]
enum Op {
    /// Moves the clock (negative: a reading earlier than the last, another core's).
    Step(i64),
    Charge {
        key: u64,
        cost: u32,
    },
    Peek {
        key: u64,
        cost: u32,
    },
    /// Refunds the `n`-th outstanding receipt (modulo their count).
    Refund(usize),
    Remove {
        key: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (-(SECOND as i64) / 2..=(2 * SECOND) as i64).prop_map(Op::Step),
        8 => (0u64..6, 0u32..6).prop_map(|(key, cost)| Op::Charge { key, cost }),
        2 => (0u64..6, 0u32..6).prop_map(|(key, cost)| Op::Peek { key, cost }),
        2 => (0usize..16).prop_map(Op::Refund),
        1 => (0u64..6).prop_map(|key| Op::Remove { key }),
    ]
}

/// The model: one `SlidingLog` per key, with the keyed log's two documented rules
/// for removals made explicit (one shard, so "the key's shard" is the table):
/// a reading is judged no earlier than the latest removal, and a receipt taken
/// before any removal refunds nothing.
fn run_against_one_log_per_key(ops: &[Op]) {
    let policy = Policy::new(5, Duration::from_secs(1)).unwrap();
    let clock = ManualClock::new();
    clock.set(Nanos::from_secs(100));
    let keyed = log_of(policy, &clock, 64, 1);
    let model_clock = ManualClock::new();
    let mut model: HashMap<u64, SlidingLog<ManualClock>> = HashMap::new();
    let mut removed_at = 0u64;
    let mut removals = 0u64;
    let mut receipts: Vec<(u64, Receipt, Receipt, u64)> = Vec::new();
    // Keys with a log in the keyed table: admitted since their last removal.
    let mut present = std::collections::HashSet::new();
    let mut now = 100 * SECOND;
    for (step, op) in ops.iter().enumerate() {
        clock.set(Nanos::new(now));
        model_clock.set(Nanos::new(now.max(removed_at)));
        let judged = Nanos::new(now.max(removed_at));
        match *op {
            Op::Step(ns) => now = now.saturating_add_signed(ns).max(SECOND),
            Op::Charge { key, cost } => {
                let (got, receipt) = keyed.charge_at(&key, Nanos::new(now), cost);
                let oracle = model
                    .entry(key)
                    .or_insert_with(|| SlidingLog::with_clock(policy, model_clock.clone()));
                let (want, model_receipt) = oracle.charge_at(judged, cost);
                assert_eq!(got, want, "step {step}: {op:?}");
                if got.is_allowed() && cost > 0 {
                    present.insert(key);
                }
                receipts.push((key, receipt, model_receipt, removals));
            }
            Op::Peek { key, cost } => {
                let want = model.get(&key).map_or_else(
                    || SlidingLog::with_clock(policy, model_clock.clone()).peek_at(judged, cost),
                    |l| l.peek_at(judged, cost),
                );
                assert_eq!(
                    keyed.peek_at(&key, Nanos::new(now), cost),
                    want,
                    "step {step}: {op:?}"
                );
            }
            Op::Refund(n) => {
                if receipts.is_empty() {
                    continue;
                }
                let (key, receipt, model_receipt, at_removals) =
                    receipts.remove(n % receipts.len());
                let want = at_removals == removals
                    && model.get(&key).is_some_and(|l| l.refund(model_receipt));
                assert_eq!(keyed.refund(&key, receipt), want, "step {step}: {op:?}");
            }
            Op::Remove { key } => {
                model.remove(&key);
                let had = present.remove(&key);
                assert_eq!(keyed.remove(&key), had, "step {step}: {op:?}");
                if had {
                    removals += 1;
                    // `remove` reads the (manual, never decreasing) clock.
                    removed_at = removed_at.max(clock.now().as_u64());
                }
            }
        }
    }
    assert_eq!(keyed.metrics().evicted, 0);
}

proptest! {
    #![proptest_config(crate::common::cases(256))]

    #[test]
    fn the_keyed_log_matches_one_sliding_log_per_key(ops in prop::collection::vec(op(), 1..200)) {
        run_against_one_log_per_key(&ops);
    }
}

#[test]
fn a_flood_of_unique_keys_stays_within_the_capacity() {
    let clock = ManualClock::new();
    let policy = Policy::new(3, Duration::from_secs(60)).unwrap();
    let keyed = log_of(policy, &clock, 1_000, 4);
    let bound = {
        // What the table may hold: each shard's share (the capacity plus headroom).
        let mut most = 0;
        for key in 0..200_000u64 {
            assert!(
                keyed.check(&key).is_allowed(),
                "a fresh key is always admitted"
            );
            most = most.max(keyed.metrics().live_keys);
            if key % 97 == 0 {
                clock.advance(Duration::from_millis(1));
            }
        }
        most
    };
    let m = keyed.metrics();
    assert!(bound as usize <= keyed.max_keys(), "held {bound} keys");
    assert!(
        keyed.max_keys() < 1_600,
        "the slack stays a fraction of the capacity"
    );
    assert!(
        m.live_keys >= 1_000,
        "keeps at least its capacity: {}",
        m.live_keys
    );
    assert_eq!(m.live_keys + m.reclaimed + m.evicted, 200_000);
    assert!(m.evicted > 0, "every key was live: the flood evicts");
    // Each live key's log holds one entry: memory is bounded by the table.
    assert_eq!(keyed.entries() as u64, m.live_keys);
}

/// What a flood past capacity leaves on a log hashing with `seed`: each key's
/// remaining units (a fresh key for one evicted, its entries for one kept).
fn what_a_flood_leaves(seed: Option<u64>) -> Vec<u64> {
    let clock = ManualClock::new();
    let mut builder = KeyedBuilder::default()
        .capacity(64)
        .shards(4)
        .clock(clock.clone());
    if let Some(seed) = seed {
        builder = builder.hash_seed(seed);
    }
    let keyed = builder
        .sliding_log::<u64>(Policy::new(8, Duration::from_secs(3_600)).unwrap())
        .expect("valid configuration");
    for key in 0..400u64 {
        assert!(keyed.check_n(&key, (key % 7 + 1) as u32).is_allowed());
    }
    assert!(keyed.metrics().evicted > 0);
    (0..400u64)
        .map(|key| keyed.peek(&key, 0).remaining())
        .collect()
}

#[test]
fn a_fixed_hash_seed_repeats_the_logs_layout() {
    // Which keys a flood evicts depends on the shards they hash to and the order of
    // their shard's map: the same seed gives the same survivors, log after log.
    let first = what_a_flood_leaves(Some(7));
    assert_eq!(first, what_a_flood_leaves(Some(7)));
    assert_ne!(first, what_a_flood_leaves(Some(8)));
    assert_ne!(first, what_a_flood_leaves(None));
}

#[test]
fn idle_keys_make_room_before_live_ones_are_evicted() {
    let clock = ManualClock::new();
    let keyed = log_of(Policy::per_second(1).unwrap(), &clock, 64, 1);
    for key in 0..64u64 {
        assert!(keyed.check(&key).is_allowed());
    }
    clock.advance(Duration::from_secs(2)); // every key is idle now
    for key in 64..128u64 {
        assert!(keyed.check(&key).is_allowed());
    }
    let m = keyed.metrics();
    assert_eq!((m.live_keys, m.evicted), (64, 0));
    assert_eq!(m.reclaimed, 64);
}

#[test]
fn a_table_holds_its_capacity_of_idle_keys_without_removing_any() {
    for shards in [1, 16, 64] {
        let clock = ManualClock::new();
        let capacity = 10_000;
        let keyed = log_of(Policy::per_second(2).unwrap(), &clock, capacity, shards);
        for _visit in 0..2 {
            for key in 0..capacity as u64 {
                assert!(keyed.check(&key).is_allowed());
                clock.advance(Duration::from_micros(300)); // idle again by the next visit
            }
        }
        let m = keyed.metrics();
        assert_eq!(
            (m.live_keys, m.reclaimed, m.evicted),
            (capacity as u64, 0, 0),
            "{shards} shards"
        );
    }
}

#[test]
fn threads_on_one_key_never_pass_the_limit() {
    let clock = ManualClock::new();
    clock.set(Nanos::from_secs(10));
    let keyed = KeyedBuilder::default()
        .clock(clock.clone())
        .sliding_log::<String>(Policy::per_minute(100).unwrap())
        .unwrap();
    let admitted: u32 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let mut units = 0;
                    for i in 0..500 {
                        let cost = 1 + i % 2;
                        if keyed.check_n("hot", cost).is_allowed() {
                            units += cost;
                        }
                    }
                    units
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert!(admitted <= 100, "admitted {admitted} units");
    assert!(admitted >= 99, "a full window is used: {admitted}");
    assert_eq!(keyed.peek("hot", 0).remaining() as u32, 100 - admitted);
}

#[test]
fn a_reading_earlier_than_a_reclamation_is_judged_at_it() {
    let clock = ManualClock::new();
    let keyed = log_of(Policy::per_second(1).unwrap(), &clock, 1, 1);
    clock.set(Nanos::from_secs(10));
    assert!(keyed.check(&1).is_allowed()); // logged at 10 s
    clock.set(Nanos::from_secs(12));
    assert!(keyed.check(&2).is_allowed()); // key 1 is idle at 12 s: reclaimed
    assert_eq!(keyed.metrics().reclaimed, 1);
    // A reading from before the reclamation (another core's) is judged at 12 s: the
    // unit is logged there, so it still counts at 12.5 s.
    assert!(keyed
        .check_n_at(&1, Nanos::new(10_500_000_000), 1)
        .is_allowed());
    assert!(!keyed
        .check_n_at(&1, Nanos::new(12_500_000_000), 1)
        .is_allowed());
}

#[test]
fn removal_voids_receipts_and_policy_changes_keep_timestamps() {
    let clock = ManualClock::new();
    let keyed = log_of(Policy::per_minute(10).unwrap(), &clock, 100, 1);
    let (_, receipt) = keyed.charge(&1, 4);
    assert!(keyed.remove(&1));
    assert!(!keyed.refund(&1, receipt));
    assert!(keyed.check_n(&1, 6).is_allowed());
    keyed.set_policy(Policy::per_minute(5).unwrap()).unwrap();
    assert!(
        !keyed.check(&1).is_allowed(),
        "6 units count against a limit of 5"
    );
    keyed.set_policy(Policy::per_second(10).unwrap()).unwrap();
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        keyed.check(&1).remaining(),
        9,
        "under a 1 s period they left"
    );
    let too_big = Policy::per_second(1_000_000_000).unwrap();
    assert!(matches!(
        KeyedBuilder::default()
            .capacity(100_000)
            .sliding_log::<u64>(too_big),
        Err(KeyedError::OverMemoryBudget { .. })
    ));
    assert!(matches!(
        keyed.set_policy(too_big),
        Err(KeyedError::OverMemoryBudget { .. })
    ));
    assert_eq!(keyed.policy(), Policy::per_second(10).unwrap());
}

#[test]
fn the_keyed_log_composes_all_or_nothing() {
    let clock = ManualClock::new();
    let per_user = KeyedBuilder::default()
        .clock(clock.clone())
        .sliding_log::<String>(Policy::per_second(3).unwrap())
        .unwrap();
    let per_ip = log_of(Policy::per_second(2).unwrap(), &clock, 100, 1);
    assert!(check_all(&[&per_user.limit("alice"), &per_ip.limit(&7)], 2).is_allowed());
    // The IP has 0 left: alice's log is not charged.
    assert!(!check_all(&[&per_user.limit("alice"), &per_ip.limit(&7)], 1).is_allowed());
    assert_eq!(per_user.peek("alice", 0).remaining(), 1);
    assert_eq!(clock.now(), Nanos::ZERO);
}

#[test]
fn waiting_on_one_key_sleeps_until_its_oldest_unit_leaves() {
    use floodgate::{Jitter, Wait};
    let clock = ManualClock::new();
    let keyed = log_of(Policy::per_second(2).unwrap(), &clock, 100, 1);
    assert!(keyed.check_n(&1, 2).is_allowed());
    clock.advance(Duration::from_millis(300));
    let slept = keyed
        .limit(&1)
        .wait_with(1, Jitter::NONE, |d| {
            clock.advance(d);
        })
        .unwrap();
    // The units from 0 s leave at 1 s: 700 ms after the wait began.
    assert_eq!(slept, Duration::from_millis(700));
    assert_eq!(keyed.peek(&1, 0).remaining(), 1);
    assert!(keyed.limit(&2).wait_with(3, Jitter::NONE, |_| ()).is_err());
}
