//! Session 39's adversarial review of the per-key refund ledger: sequences the
//! existing ledger tests do not run — bookings (keyed waits) interleaved with
//! charges and refunds of several keys in one shard, more than 8 refunds between a
//! charge and its refund, receipts handed to the wrong key, removals of another
//! key between a charge and its refund — must never leave a key more permissive
//! than its admissions that were not given back, replayed alone.
#![cfg(not(loom))]

#[macro_use]
mod common;

use std::time::Duration;

use floodgate::{
    Clock, Gcra, KeyedBuilder, KeyedLimiter, ManualClock, Nanos, Policy, RateLimiter, Receipt,
    Storage,
};
use proptest::prelude::*;

/// A one-shard GCRA table of 64 keys on `St` (every key shares the shard's ledger).
fn one_shard<St: Storage<u64, floodgate::GcraState>>(
    policy: Policy,
    clock: &ManualClock,
) -> KeyedLimiter<u64, Gcra, ManualClock, St> {
    common::keyed_on(Gcra::new(policy), clock, 64, 1)
}

/// `limit` per millisecond with a burst of `burst`.
fn per_ms(limit: u64, burst: u64) -> Policy {
    Policy::per_second(limit * 1_000)
        .and_then(|p| p.with_burst(burst))
        .expect("a valid policy")
}

/// Keys 0..KEYS are checked against the bound; key `SCRATCH` is only charged and
/// removed (a removal in the shard between other keys' charges and refunds).
const KEYS: u64 = 3;
const SCRATCH: u64 = 9;

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Charge {
        key: u64,
        cost: u32,
    },
    Book {
        key: u64,
        cost: u32,
    },
    Refund(usize),
    /// A receipt refunded on the next key instead of its own (must give nothing).
    RefundWrongKey(usize),
    RemoveScratch,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => prop_oneof![Just(0u64), 0..250_000u64, 0..2_000_000u64].prop_map(Op::Advance),
        3 => (0..KEYS, 0u32..4).prop_map(|(key, cost)| Op::Charge { key, cost }),
        2 => (0..KEYS, 1u32..4).prop_map(|(key, cost)| Op::Book { key, cost }),
        4 => any::<usize>().prop_map(Op::Refund),
        1 => any::<usize>().prop_map(Op::RefundWrongKey),
        1 => Just(Op::RemoveScratch),
    ]
}

/// How many refunds a keyed shard remembers (the docs of `KeyedLimiter::refund`).
const REMEMBERED: u64 = 8;

/// The exact per-key oracle: each key is also run on a direct limiter of its own
/// (its refund ledger holds that key's refunds only). While a shard has made at
/// most 8 refunds that gave anything back between a receipt's charge and its
/// refund, the docs promise that other keys' refunds take nothing from it: the
/// keyed table must then decide, book and give back exactly as the key's own
/// limiter does. Past that it may give back less (never more); a key whose refund
/// gave back less leaves the comparison (its schedule is then stricter).
fn run_exact<St: Storage<u64, floodgate::GcraState>>(
    policy: Policy,
    ops: &[Op],
) -> Result<(), String> {
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let keyed = one_shard::<St>(policy, &clock);
    let own: Vec<RateLimiter<Gcra, ManualClock>> = (0..KEYS)
        .map(|_| RateLimiter::gcra_with_clock(policy, clock.clone()))
        .collect();
    let mut exact = [true; KEYS as usize];
    // The shard's refunds that gave something back so far.
    let mut moving = 0u64;
    // (key, moving refunds at the charge, keyed receipt, the key's own receipt).
    let mut held: Vec<(u64, u64, Receipt, Receipt)> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        let now = clock.now();
        let here = |what: &str| format!("step {step} ({op:?}): {what}");
        match *op {
            Op::Advance(d) => {
                clock.advance(Duration::from_nanos(d));
            }
            Op::Charge { key, cost } | Op::Book { key, cost } => {
                let k = key as usize;
                let ((dk, rk), (dm, rm)) = if matches!(op, Op::Book { .. }) {
                    let (dk, wk, rk) = keyed.book_at(&key, now, cost).expect("GCRA books");
                    let (dm, wm, rm) = own[k].book_at(now, cost).expect("GCRA books");
                    if exact[k] && wk != wm {
                        return Err(here(&format!("booked for {wk:?}, its own limiter {wm:?}")));
                    }
                    ((dk, rk), (dm, rm))
                } else {
                    (
                        keyed.charge_at(&key, now, cost),
                        own[k].charge_at(now, cost),
                    )
                };
                if exact[k] && dk.is_allowed() != dm.is_allowed() {
                    return Err(here(&format!("keyed {dk:?}, its own limiter {dm:?}")));
                }
                if exact[k] && rk.is_charged() {
                    held.push((key, moving, rk, rm));
                }
            }
            Op::RefundWrongKey(pick) => {
                if !held.is_empty() {
                    let (key, _, rk, _) = held.remove(pick % held.len());
                    let other = (key + 1) % KEYS;
                    if keyed.refund(&other, rk) {
                        return Err(here(&format!(
                            "key {key}'s receipt gave back on key {other}"
                        )));
                    }
                    // Neither receipt is given back: both keep the charge.
                }
            }
            Op::Refund(pick) => {
                if !held.is_empty() {
                    let (key, at, rk, rm) = held.remove(pick % held.len());
                    let k = key as usize;
                    let back = keyed.refund(&key, rk);
                    moving += u64::from(back);
                    let expected = own[k].refund(rm);
                    if exact[k] {
                        if back && !expected {
                            return Err(here("keyed gave back where its own limiter could not"));
                        }
                        if moving - u64::from(back) - at <= REMEMBERED && back != expected {
                            return Err(here(&format!(
                                "key {key}: gave back {back}, its own limiter {expected}, \
                                 {} refunds between",
                                moving - u64::from(back) - at
                            )));
                        }
                    }
                }
            }
            Op::RemoveScratch => {
                // A removal voids every receipt of the shard: only charge it
                // when no receipt is held (the comparison needs them).
                if held.is_empty() {
                    let _ = keyed.charge_at(&SCRATCH, now, 1);
                    let _ = keyed.remove(&SCRATCH);
                }
            }
        }
        let now = clock.now();
        for key in 0..KEYS {
            let k = key as usize;
            if !exact[k] {
                continue;
            }
            let (pk, pm) = (keyed.peek_at(&key, now, 0), own[k].peek_at(now, 0));
            if pk.reset_after() != pm.reset_after() || pk.remaining() != pm.remaining() {
                // Stricter is allowed past the record: leave the comparison.
                if pk.reset_after() > pm.reset_after() {
                    exact[k] = false;
                    held.retain(|h| h.0 != key);
                    continue;
                }
                return Err(here(&format!(
                    "key {key}: keyed state {pk:?} is more permissive than its own {pm:?}"
                )));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(crate::common::cases(512))]
    /// The per-key ledger against each key's own limiter: exact while the shard
    /// remembers every refund between, never more permissive past that.
    #[test]
    fn a_shard_with_many_keys_refunds_each_exactly_as_its_own_limiter(
        limit in 1u64..5, burst in 1u64..5,
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        let policy = per_ms(limit, burst);
        each_storage!(St => {
            run_exact::<St>(policy, &ops).map_err(TestCaseError::fail)?;
        });
    }
}

/// A refund of key 0 moves key 0's later booking; then 8 refunds of key 1 push it
/// out of the shard's record. The later booking's refund must still count the move
/// (the whole shard's growth, since the record no longer reaches back): never more
/// than what is left of its booking, as key 0's own limiter gives back — not the
/// whole unit, which would free part of a third booking still held.
fn own_refund_out_of_the_record<St: Storage<u64, floodgate::GcraState>>() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let policy = per_ms(1, 20); // T = 1 ms, τ = 20 ms
    let keyed = one_shard::<St>(policy, &clock);
    let own = RateLimiter::gcra_with_clock(policy, clock.clone());
    let t = clock.now();
    let charge = |cost| {
        let (d, r) = keyed.charge_at(&0, t, cost);
        let (e, m) = own.charge_at(t, cost);
        assert!(d.is_allowed() && e.is_allowed());
        (r, m)
    };
    let (a0, m0) = charge(1);
    let (a1, m1) = charge(1);
    let (_a2, _m2) = charge(1);
    clock.advance(Duration::from_micros(500));
    assert!(keyed.refund(&0, a0));
    assert!(own.refund(m0));
    for _ in 0..REMEMBERED {
        let (d, b) = keyed.charge_at(&1, clock.now(), 1);
        assert!(d.is_allowed());
        assert!(keyed.refund(&1, b));
    }
    clock.advance(Duration::from_micros(300));
    // The keyed table takes the whole shard's growth (8.5 units) as the shift: it
    // may give back less than key 0's own limiter (here nothing), never more.
    let _ = keyed.refund(&0, a1);
    assert!(own.refund(m1));
    let now = clock.now();
    let (k, o) = (keyed.peek_at(&0, now, 0), own.peek_at(now, 0));
    assert!(
        k.reset_after() >= o.reset_after(),
        "key 0 is more permissive in the table ({k:?}) than on its own limiter ({o:?})"
    );
}

#[test]
fn an_own_refund_pushed_out_of_the_record_still_counts() {
    on_every_storage!(own_refund_out_of_the_record);
}

/// A key charged under one plan whose resolver then moves it to another: the
/// receipt names the first plan's table, so a refund while the key is on the
/// second plan gives nothing back there (it would credit units the second plan
/// never charged), and once the key is back the refund lands where the charge was.
/// On every storage: on `Inline` the plans' tables tag a key alike, so only the
/// receipt's limiter id tells the tables apart.
fn plan_switch<St>()
where
    St: Storage<u64, floodgate::GcraState>,
{
    use floodgate::keyed::plans::{PlanLimiter, Plans};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let mut plans = Plans::new();
    let small = plans.insert("small", per_ms(1, 2));
    let large = plans.insert("large", per_ms(1, 3));
    let upgraded = Arc::new(AtomicBool::new(false));
    let flag = upgraded.clone();
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let limiter: PlanLimiter<u64, _, _, St> = PlanLimiter::new_in(
        &plans,
        move |_: &u64| {
            if flag.load(Ordering::Relaxed) {
                large
            } else {
                small
            }
        },
        KeyedBuilder::default().clock(clock.clone()),
    )
    .unwrap();
    let (d, receipt) = limiter.charge(&7, 2);
    assert!(d.is_allowed());
    upgraded.store(true, Ordering::Relaxed);
    let (d, _kept) = limiter.charge(&7, 3);
    assert!(d.is_allowed(), "a fresh key on the large plan");
    assert!(
        !limiter.refund(&7, receipt),
        "the small plan's receipt gave back on the large plan"
    );
    assert!(
        !limiter.check(&7).is_allowed(),
        "the large plan's burst is spent"
    );
    // Back on the small plan, a receipt taken there still gives back there.
    upgraded.store(false, Ordering::Relaxed);
    let (d, receipt) = limiter.charge(&8, 2);
    assert!(d.is_allowed());
    assert!(limiter.refund(&8, receipt));
    assert_eq!(limiter.peek(&8, 0).remaining(), 2);
}

#[test]
fn a_refund_after_a_plan_switch_credits_no_other_plan() {
    on_every_storage!(plan_switch);
}

/// Key 0 charges one unit; `others` other keys of its shard then charge and refund
/// one unit each (every refund gives something back); then key 0's refund. Returns
/// what key 0 can admit afterwards.
fn after_others_refunds<St: Storage<u64, floodgate::GcraState>>(others: u64) -> u64 {
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let keyed = one_shard::<St>(Policy::per_hour(3).unwrap(), &clock);
    let (d, mine) = keyed.charge(&0, 1);
    assert!(d.is_allowed());
    for other in 1..=others {
        let (d, theirs) = keyed.charge(&other, 1);
        assert!(d.is_allowed() && keyed.refund(&other, theirs));
    }
    let _ = keyed.refund(&0, mine);
    keyed.peek(&0, 0).remaining()
}

/// The docs' bound, at its edge: with exactly 8 refunds of other keys between a
/// charge and its refund (as many as a shard remembers), the refund still gives
/// back the whole unit (with 9 it may give back less: the docs' conservative
/// fallback). Mutation seen failing it: `RECENT_REFUNDS` 8 → 7 (cell.rs).
fn the_edge_of_the_record<St: Storage<u64, floodgate::GcraState>>() {
    assert_eq!(
        after_others_refunds::<St>(REMEMBERED),
        3,
        "8 others between"
    );
}

#[test]
fn eight_other_keys_refunds_between_take_nothing() {
    on_every_storage!(the_edge_of_the_record);
}
