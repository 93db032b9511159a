//! A keyed shard's refund ledger counts only the refunds of the key being refunded
//! (when the shard can tell), so another key's refund between a charge and its
//! refund no longer eats into what the refund gives back — and the bound still
//! holds: a refund of the same key between still shifts the booking, a record that
//! no longer reaches back to the charge falls back to the whole shard's growth, and
//! no interleaving (one thread or many) leaves a key more permissive than its other
//! admissions alone. Every case on every storage, one shard.
#![cfg(not(loom))]

#[macro_use]
mod common;

use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::Duration;

use floodgate::{
    Clock, Gcra, KeyedBuilder, KeyedLimiter, ManualClock, Nanos, Policy, RateLimiter, Receipt,
    Storage,
};
use proptest::prelude::*;

type Keyed<St> = KeyedLimiter<u64, Gcra, ManualClock, St>;

/// A one-shard GCRA table of 64 keys on `St`.
fn one_shard<St: Storage<u64, floodgate::GcraState>>(
    policy: Policy,
    clock: &ManualClock,
) -> Keyed<St> {
    KeyedBuilder::new(Gcra::new(policy))
        .capacity(64)
        .shards(1)
        .clock(clock.clone())
        .build_in::<u64, St>()
        .unwrap()
}

/// `limit` per millisecond with a burst of `burst`.
fn per_ms(limit: u64, burst: u64) -> Policy {
    Policy::new(limit, Duration::from_millis(1))
        .unwrap()
        .with_burst(burst)
        .unwrap()
}

/// How many units of one each `key` admits now, one after another (charging them).
fn drain<St: Storage<u64, floodgate::GcraState>>(keyed: &Keyed<St>, key: u64) -> u32 {
    let mut n = 0;
    while keyed.check(&key).is_allowed() {
        n += 1;
    }
    n
}

/// Every admission of one key: (reading, cost, refunded).
type Log = Vec<(Nanos, u32, bool)>;

/// The table is no more permissive for `key` at `now` than a fresh limiter that saw
/// only the key's admissions not refunded (replayed in reading order).
fn no_more_than_the_others<St: Storage<u64, floodgate::GcraState>>(
    keyed: &Keyed<St>,
    policy: Policy,
    key: u64,
    log: &Log,
    now: Nanos,
) -> Result<(), String> {
    let model = RateLimiter::gcra_with_clock(policy, ManualClock::new());
    let mut kept: Vec<(Nanos, u32)> = log.iter().filter(|e| !e.2).map(|e| (e.0, e.1)).collect();
    kept.sort();
    for &(at, cost) in &kept {
        if !model.check_n_at(at, cost).is_allowed() {
            return Err(format!("key {key}: the others alone deny {cost} at {at:?}"));
        }
    }
    for cost in 1..=policy.burst() as u32 + 1 {
        if keyed.peek_at(&key, now, cost).is_allowed() && !model.peek_at(now, cost).is_allowed() {
            return Err(format!(
                "key {key}: {cost} admitted at {now:?} where the others alone deny it"
            ));
        }
    }
    Ok(())
}

/// The reviewer's reproduction: GCRA 5/hour, charge alice, charge bob, refund bob,
/// refund alice. Bob's refund moved only bob's schedule, so alice gets her whole
/// unit back: both keys admit their full burst afterwards.
fn another_keys_refund<St: Storage<u64, floodgate::GcraState>>() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let keyed = one_shard::<St>(Policy::per_hour(5).unwrap(), &clock);
    let (alice, bob) = (1u64, 2u64);
    let (d, a) = keyed.charge(&alice, 1);
    assert!(d.is_allowed());
    let (d, b) = keyed.charge(&bob, 1);
    assert!(d.is_allowed());
    assert!(keyed.refund(&bob, b));
    assert!(keyed.refund(&alice, a), "alice's refund gave nothing back");
    assert_eq!(drain(&keyed, alice), 5, "alice lost a unit to bob's refund");
    assert_eq!(drain(&keyed, bob), 5);
}

#[test]
fn another_keys_refund_leaves_the_whole_unit_to_give_back() {
    on_every_storage!(another_keys_refund);
}

/// The login pattern on a busy shard: 6 users charge (each password check still
/// running), then their successes are refunded one after another, up to 5 other
/// keys' refunds landing between a user's charge and its refund (fewer than the
/// record holds): each user still gets the whole unit back.
fn login_burst<St: Storage<u64, floodgate::GcraState>>() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let keyed = one_shard::<St>(Policy::per_hour(3).unwrap(), &clock);
    let users: Vec<u64> = (10..16).collect();
    let receipts: Vec<Receipt> = users.iter().map(|u| keyed.charge(u, 1).1).collect();
    for (user, receipt) in users.iter().zip(receipts) {
        assert!(keyed.refund(user, receipt), "user {user} got nothing back");
    }
    for user in &users {
        assert_eq!(drain(&keyed, *user), 3, "user {user} lost a unit");
    }
}

#[test]
fn other_keys_refunds_in_a_login_burst_take_nothing() {
    on_every_storage!(login_burst);
}

/// GCRA 4 per ms, burst 4 (T = 250 µs). Alice charges 2 (A) and 1 (B); A's refund
/// moves B's booking down by 2 T. Later charges fill the schedule, and B's refund at
/// 250 µs must judge B where it now is: a shift of 0 would give back time the clock
/// has already reached and admit 3 where alice's other admissions alone deny it.
/// `between` other keys charge and refund one unit each right after A's refund:
/// below the record's size the shift is still alice's own; above it, the record no
/// longer reaches back to B's charge and the whole shard's growth bounds it.
fn same_key_between<St: Storage<u64, floodgate::GcraState>>(between: u64) {
    let policy = per_ms(4, 4);
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let keyed = one_shard::<St>(policy, &clock);
    let alice = 1u64;
    let mut log: Log = Vec::new();
    let charge = |keyed: &Keyed<St>, log: &mut Log, cost: u32| {
        let now = clock.now();
        let (d, r) = keyed.charge_at(&alice, now, cost);
        assert!(d.is_allowed() && r.is_charged());
        log.push((now, cost, false));
        r
    };
    let a = charge(&keyed, &mut log, 2);
    let b = charge(&keyed, &mut log, 1);
    assert!(keyed.refund(&alice, a));
    log[0].2 = true;
    for other in 0..between {
        let key = 100 + other;
        let (d, r) = keyed.charge(&key, 1);
        assert!(d.is_allowed());
        assert!(keyed.refund(&key, r));
    }
    clock.advance(Duration::from_nanos(178_385));
    let _c = charge(&keyed, &mut log, 1);
    let _d = charge(&keyed, &mut log, 1);
    clock.advance(Duration::from_nanos(71_615));
    let _ = keyed.refund(&alice, b);
    log[1].2 = true;
    no_more_than_the_others(&keyed, policy, alice, &log, clock.now()).unwrap();
}

#[test]
fn a_refund_of_the_same_key_between_still_bounds_the_shift() {
    fn case<St: Storage<u64, floodgate::GcraState>>() {
        same_key_between::<St>(0);
        // Other keys' refunds in the record beside alice's own.
        same_key_between::<St>(3);
    }
    on_every_storage!(case);
}

#[test]
fn a_record_that_no_longer_reaches_back_falls_back_to_the_whole_shard() {
    fn case<St: Storage<u64, floodgate::GcraState>>() {
        // More refunds since B's charge than the record holds (8): A's is dropped.
        same_key_between::<St>(8);
        same_key_between::<St>(40);
    }
    on_every_storage!(case);
}

mod interleavings {
    use super::*;

    const KEYS: u64 = 3;

    #[derive(Clone, Debug)]
    pub(super) enum Op {
        Advance(u64),
        Charge { key: u64, cost: u32 },
        Refund(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            2 => prop_oneof![Just(0u64), 0..250_000u64, 0..2_000_000u64].prop_map(Op::Advance),
            4 => (0..KEYS, 0u32..4).prop_map(|(key, cost)| Op::Charge { key, cost }),
            3 => any::<usize>().prop_map(Op::Refund),
        ]
    }

    /// Charges and refunds of three keys in one shard, interleaved: after every step
    /// each key is no more permissive than its own other admissions alone.
    fn run<St: Storage<u64, floodgate::GcraState>>(
        policy: Policy,
        ops: &[Op],
    ) -> Result<(), String> {
        let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
        let keyed = one_shard::<St>(policy, &clock);
        let mut logs: Vec<Log> = vec![Vec::new(); KEYS as usize];
        let mut held: Vec<(u64, usize, Receipt)> = Vec::new();
        for op in ops {
            match *op {
                Op::Advance(d) => {
                    clock.advance(Duration::from_nanos(d));
                }
                Op::Charge { key, cost } => {
                    let now = clock.now();
                    let (d, r) = keyed.charge_at(&key, now, cost);
                    if d.is_allowed() && r.is_charged() {
                        let log = &mut logs[key as usize];
                        log.push((now, cost, false));
                        held.push((key, log.len() - 1, r));
                    }
                }
                Op::Refund(pick) => {
                    if !held.is_empty() {
                        let (key, index, r) = held.remove(pick % held.len());
                        let _ = keyed.refund(&key, r);
                        logs[key as usize][index].2 = true;
                    }
                }
            }
            for key in 0..KEYS {
                no_more_than_the_others(&keyed, policy, key, &logs[key as usize], clock.now())?;
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(crate::common::cases(1024))]
        #[test]
        fn interleaved_keys_never_beat_the_exact_bound(
            limit in 1u64..5, burst in 1u64..5,
            ops in proptest::collection::vec(op(), 1..60),
        ) {
            let policy = per_ms(limit, burst);
            each_storage!(St => {
                run::<St>(policy, &ops).map_err(TestCaseError::fail)?;
            });
        }
    }
}

/// Many threads charge and refund distinct and shared keys of one shard, round after
/// round, a receipt refunded in its round or a later one (the clock moves between
/// rounds, by less than a unit's interval): at the end
/// of every round each key is no more permissive than its admissions that were not
/// refunded, replayed alone. Seeded, so a failure reproduces its schedule of
/// operations (not its thread interleaving).
fn threads_on<St: Storage<u64, floodgate::GcraState>>(seed: u64) {
    const THREADS: u64 = 4;
    const ROUNDS: u64 = 40;
    const OPS: u64 = 3;
    let policy = per_ms(4, 3);
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let keyed = one_shard::<St>(policy, &clock);
    // Keys 0 and 1 shared by every thread, then one key of each thread's own.
    let keys = 2 + THREADS;
    let logs: Vec<Mutex<Log>> = (0..keys).map(|_| Mutex::new(Vec::new())).collect();
    // Each thread's receipts not yet refunded, kept across rounds.
    let mut held: Vec<Vec<(u64, usize, Receipt)>> = (0..THREADS).map(|_| Vec::new()).collect();
    for round in 0..ROUNDS {
        let barrier = Barrier::new(THREADS as usize);
        let now = clock.now();
        thread::scope(|scope| {
            for (t, held) in (0..THREADS).zip(held.iter_mut()) {
                let (keyed, logs, barrier) = (&keyed, &logs, &barrier);
                let mut rng = seed ^ (round << 32) ^ (t << 48) ^ 0x9E37_79B9_7F4A_7C15;
                scope.spawn(move || {
                    let mut next = move || {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        rng
                    };
                    barrier.wait();
                    for _ in 0..OPS {
                        let r = next();
                        if r % 2 == 0 || held.is_empty() {
                            let key = if r % 3 == 0 { 2 + t } else { (r >> 8) % 2 };
                            let cost = (1 + (r >> 16) % 2) as u32;
                            let (d, receipt) = keyed.charge_at(&key, now, cost);
                            if d.is_allowed() && receipt.is_charged() {
                                // Every reading of the round is `now`: an entry's
                                // place in the log does not matter.
                                let mut log = logs[key as usize].lock().unwrap();
                                log.push((now, cost, false));
                                held.push((key, log.len() - 1, receipt));
                            }
                        } else {
                            let pick = (r >> 20) as usize % held.len();
                            let (key, index, receipt) = held.swap_remove(pick);
                            let _ = keyed.refund(&key, receipt);
                            logs[key as usize].lock().unwrap()[index].2 = true;
                        }
                    }
                });
            }
        });
        for key in 0..keys {
            let log = logs[key as usize].lock().unwrap();
            no_more_than_the_others(&keyed, policy, key, &log, now)
                .unwrap_or_else(|e| panic!("seed {seed}, round {round}: {e}"));
        }
        clock.advance(Duration::from_nanos(90_000 + (seed % 7) * 11_000));
    }
}

#[test]
fn threads_on_shared_and_distinct_keys_never_beat_the_exact_bound() {
    fn case<St: Storage<u64, floodgate::GcraState>>() {
        for seed in 1..=24 {
            threads_on::<St>(seed);
        }
    }
    on_every_storage!(case);
}
