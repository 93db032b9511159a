//! A reservation granted with no delay is its charge's receipt
//! (`Reservation::into_receipt`, the keyed reservation's receipt): over random
//! policies, costs, bounds, clock steps, refunds and cancellations, a limiter that
//! takes a free slot with one reservation (and converts it) stays exactly in step
//! with one that takes it with a plain `charge_at` and reserves only when that is
//! refused — the same states, the same refunds, the same reservations — for the
//! shaper, its mutex twin and the keyed limiter on every storage. A delayed
//! reservation yields no receipt (the shaper's comes back as itself, to be
//! cancelled), and the immediate reservation's decision is the schedule right after
//! it (what a queue reports for a slot taken at once).
#![cfg(not(loom))]

#[macro_use]
mod common;

use floodgate::{
    Gcra, GcraState, KeyedLimiter, ManualClock, Nanos, Policy, Receipt, Reservation, ShapeError,
    Shaper, StateCell, Storage,
};
use proptest::prelude::*;
use std::time::Duration;

/// One step of a trace.
#[derive(Clone, Debug)]
enum Op {
    /// Moves the clock forward `ns`.
    Advance(u64),
    /// Takes `cost` units for `key` now: the free slot, or else a slot within
    /// `max_delay`.
    Take {
        key: u64,
        cost: u32,
        max_delay: Duration,
    },
    /// Refunds the `pick`-th outstanding receipt of a slot taken at once.
    Refund { pick: usize },
    /// Cancels the `pick`-th outstanding delayed reservation.
    Cancel { pick: usize },
}

/// Costs 0, 1, up to the burst and beyond it; bounds 0, up to a few seconds and
/// unbounded; steps within and across intervals.
fn op(burst: u32) -> impl Strategy<Value = Op> {
    let cost = common::reservation_cost(burst);
    let max_delay = common::reservation_bound();
    prop_oneof![
        3 => (0u64..400_000_000).prop_map(Op::Advance),
        8 => (0u64..2, cost, max_delay).prop_map(|(key, cost, max_delay)| {
            Op::Take { key, cost, max_delay }
        }),
        3 => any::<usize>().prop_map(|pick| Op::Refund { pick }),
        2 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
    ]
}

fn trace() -> impl Strategy<Value = (Policy, Vec<Op>)> {
    common::shaper_policy().prop_flat_map(|p| {
        let burst = u32::try_from(p.burst()).expect("burst ≤ 8");
        (Just(p), prop::collection::vec(op(burst), 1..80))
    })
}

/// Removes the `pick`-th (modulo the length) of `v`, if any.
fn take<T>(v: &mut Vec<T>, pick: usize) -> Option<T> {
    (!v.is_empty()).then(|| v.remove(pick % v.len()))
}

/// Runs `ops` (keys ignored: one schedule) on `charged` (a free slot taken with
/// `charge_at`, a reservation made only when the charge is refused) and on
/// `reserved` (one reservation, converted to a receipt when it has no delay), both
/// on `clock`: after every step both hold the same state, and every refund and
/// cancellation gives back the same.
fn shaper_case<S: StateCell<GcraState>>(
    ops: &[Op],
    clock: &ManualClock,
    charged: &Shaper<ManualClock, S>,
    reserved: &Shaper<ManualClock, S>,
) {
    let mut receipts: Vec<(Receipt, Receipt)> = Vec::new();
    let mut waiting: Vec<(Reservation, Reservation)> = Vec::new();
    for op in ops {
        let now = floodgate::Clock::now(clock);
        match *op {
            Op::Advance(ns) => {
                clock.advance(Duration::from_nanos(ns));
            }
            Op::Take {
                cost, max_delay, ..
            } => {
                let (decision, by_charge) = charged.charge_at(now, cost);
                let reservation = reserved.reserve_at(now, cost, max_delay);
                if decision.is_allowed() {
                    let r = reservation.expect("a free slot is reserved");
                    assert_eq!(r.delay(), Duration::ZERO, "{op:?}");
                    // The decision is the schedule right after the reservation.
                    let after = reserved.peek_reserve_at(now, 0, max_delay).decision();
                    assert_eq!(r.decision(), after, "{op:?}");
                    if max_delay.is_zero() {
                        assert_eq!(r.decision(), decision, "{op:?}");
                    }
                    let receipt = r.into_receipt().expect("no delay: a receipt");
                    assert_eq!(
                        (receipt.cost(), receipt.charged_at()),
                        (by_charge.cost(), by_charge.charged_at()),
                        "{op:?}"
                    );
                    receipts.push((by_charge, receipt));
                } else {
                    // Not free: the charge side reserves as the other did.
                    let later = charged.reserve_at(now, cost, max_delay);
                    match (later, reservation) {
                        (Ok(a), Ok(b)) => {
                            assert!(!b.delay().is_zero(), "{op:?}");
                            let b = b.into_receipt().expect_err("delayed: no receipt");
                            assert_eq!((a.delay(), a.decision()), (b.delay(), b.decision()));
                            waiting.push((a, b));
                        }
                        (Err(a), Err(b)) => assert_eq!(a, b, "{op:?}"),
                        (a, b) => panic!("{op:?}: {a:?} vs {b:?}"),
                    }
                }
            }
            Op::Refund { pick } => {
                if let Some((a, b)) = take(&mut receipts, pick) {
                    assert_eq!(charged.refund(a), reserved.refund(b), "{op:?}");
                }
            }
            Op::Cancel { pick } => {
                if let Some((a, b)) = take(&mut waiting, pick) {
                    assert_eq!(charged.cancel_at(now, a), reserved.cancel_at(now, b));
                }
            }
        }
        assert_eq!(charged.state(), reserved.state(), "after {op:?}");
    }
}

/// [`shaper_case`] for the keyed limiter (two keys): a free slot taken with
/// `charge_at` or with a reservation whose receipt is kept; a delayed reservation's
/// receipt is its cancellation on both.
fn keyed_case<St: Storage<u64, GcraState>>(policy: Policy, ops: &[Op]) {
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let make = || -> KeyedLimiter<u64, Gcra, ManualClock, St> {
        common::keyed_on(Gcra::new(policy), &clock, 64, 1)
    };
    let (charged, reserved) = (make(), make());
    let mut receipts: Vec<(u64, Receipt, Receipt)> = Vec::new();
    let mut waiting: Vec<(u64, Receipt, Receipt)> = Vec::new();
    let schedule = |l: &KeyedLimiter<u64, Gcra, ManualClock, St>, key: u64, now: Nanos| {
        l.peek_reserve_at(&key, now, 0, Duration::MAX).decision()
    };
    for op in ops {
        let now = floodgate::Clock::now(&clock);
        match *op {
            Op::Advance(ns) => {
                clock.advance(Duration::from_nanos(ns));
            }
            Op::Take {
                key,
                cost,
                max_delay,
            } => {
                let (decision, by_charge) = charged.charge_at(&key, now, cost);
                let reservation = reserved.reserve_at(&key, now, cost, max_delay);
                if decision.is_allowed() {
                    let (d, delay, receipt) = reservation.expect("a free slot is reserved");
                    assert_eq!(delay, Duration::ZERO, "{op:?}");
                    let after = reserved.peek_reserve_at(&key, now, 0, max_delay).decision();
                    assert_eq!(d, after, "{op:?}");
                    if max_delay.is_zero() {
                        assert_eq!(d, decision, "{op:?}");
                    }
                    assert_eq!(
                        (receipt.cost(), receipt.charged_at()),
                        (by_charge.cost(), by_charge.charged_at()),
                        "{op:?}"
                    );
                    receipts.push((key, by_charge, receipt));
                } else {
                    let later = charged.reserve_at(&key, now, cost, max_delay);
                    match (later, reservation) {
                        (Ok((da, a_delay, a)), Ok((db, b_delay, b))) => {
                            assert!(!b_delay.is_zero(), "{op:?}");
                            assert_eq!((da, a_delay), (db, b_delay), "{op:?}");
                            waiting.push((key, a, b));
                        }
                        (Err(a), Err(b)) => assert_eq!(a, b, "{op:?}"),
                        (a, b) => panic!("{op:?}: {a:?} vs {b:?}"),
                    }
                }
            }
            Op::Refund { pick } => {
                if let Some((key, a, b)) = take(&mut receipts, pick) {
                    assert_eq!(charged.refund(&key, a), reserved.refund(&key, b), "{op:?}");
                }
            }
            Op::Cancel { pick } => {
                if let Some((key, a, b)) = take(&mut waiting, pick) {
                    assert_eq!(charged.refund(&key, a), reserved.refund(&key, b), "{op:?}");
                }
            }
        }
        let now = floodgate::Clock::now(&clock);
        for key in 0..2 {
            assert_eq!(
                schedule(&charged, key, now),
                schedule(&reserved, key, now),
                "key {key} after {op:?}"
            );
        }
    }
}

proptest! {
    #![proptest_config(crate::common::cases(256))]

    /// A free slot taken by one reservation refunds exactly as a charge's: the shaper
    /// and its mutex twin.
    #[test]
    fn a_shapers_immediate_reservation_refunds_as_a_charge((policy, ops) in trace()) {
        let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
        let charged = Shaper::with_clock(policy, clock.clone());
        let reserved = Shaper::with_clock(policy, clock.clone());
        shaper_case(&ops, &clock, &charged, &reserved);
        let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
        let charged = Shaper::locked_with_clock(policy, clock.clone());
        let reserved = Shaper::locked_with_clock(policy, clock.clone());
        shaper_case(&ops, &clock, &charged, &reserved);
    }

    /// The same for the keyed limiter, on every storage.
    #[test]
    fn a_keyed_immediate_reservation_refunds_as_a_charge((policy, ops) in trace()) {
        every_storage_reporting!(St => { keyed_case::<St>(policy, &ops); });
    }
}

/// A policy of 10 per second, burst 1 (T = 100 ms).
fn ten_per_second() -> Policy {
    Policy::per_second(10)
        .and_then(|p| p.with_burst(1))
        .expect("a valid policy")
}

/// A delayed reservation yields no receipt: `into_receipt` hands the reservation
/// back unchanged, to be cancelled. The free slot's receipt before it refunds as a
/// charge's would: nothing while the delayed slot waits after it (GCRA's refund
/// rule keeps a waiter's slot), and the cancellation gives the delayed units back.
fn delayed_reservation_has_no_receipt<S: StateCell<GcraState>>(shaper: &Shaper<ManualClock, S>) {
    let max = Duration::from_secs(1);
    let first = shaper.reserve(1, max).expect("free");
    let receipt = first.into_receipt().expect("no delay: a receipt");
    let second = shaper.reserve(1, max).expect("within the bound");
    let (ready, decision) = (second.ready_at(), second.decision());
    let back = second.into_receipt().expect_err("delayed: no receipt");
    assert_eq!((back.ready_at(), back.decision()), (ready, decision));
    assert_eq!(back.delay(), Duration::from_millis(100));
    assert!(!shaper.refund(receipt), "the waiter's slot is kept");
    assert_eq!(shaper.state().tat(), Nanos::new(200_000_000));
    assert_eq!(shaper.cancel(back), 1);
    assert_eq!(shaper.state().tat(), Nanos::new(100_000_000));
}

#[test]
fn a_delayed_reservation_yields_no_receipt() {
    delayed_reservation_has_no_receipt(&Shaper::with_clock(ten_per_second(), ManualClock::new()));
    delayed_reservation_has_no_receipt(&Shaper::locked_with_clock(
        ten_per_second(),
        ManualClock::new(),
    ));
}

/// A cost of 0 reserves nothing: its receipt holds nothing; a cost above the burst
/// is refused as before, nothing reserved.
#[test]
fn a_reservation_of_nothing_converts_to_an_empty_receipt() {
    let shaper = Shaper::with_clock(ten_per_second(), ManualClock::new());
    let receipt = shaper
        .reserve(0, Duration::ZERO)
        .expect("cost 0 fits")
        .into_receipt()
        .expect("no delay");
    assert!(!receipt.is_charged());
    assert!(!shaper.refund(receipt));
    assert_eq!(
        shaper.reserve(2, Duration::MAX),
        Err(ShapeError::Never { cost: 2, burst: 1 })
    );
    assert_eq!(shaper.state(), GcraState::default());
}

/// A receipt from a reservation is voided by a reset, as a charge's: nothing comes
/// back, and the fresh schedule is not moved.
#[test]
fn a_reset_voids_a_reservations_receipt() {
    let shaper = Shaper::locked_with_clock(ten_per_second(), ManualClock::new());
    let receipt = shaper
        .reserve(1, Duration::from_secs(1))
        .expect("free")
        .into_receipt()
        .expect("no delay");
    shaper.reset();
    let _kept = shaper
        .reserve(1, Duration::ZERO)
        .expect("free after the reset");
    assert!(!shaper.refund(receipt));
    assert_eq!(shaper.state().tat(), Nanos::new(100_000_000));
}
