//! Refunds of the leased mode that cannot go back to their lease go to the central
//! word (`LeasedGcra::refund`, "Back to the central word"): a refund on a thread
//! that does not own the charging shard (a task that moved threads between its
//! charge and a later rule's denial), or after the lease expired or was replaced.
//! Only the part of the refill's booking the clock has not reached comes back, moved
//! down by what earlier central refunds gave back (the ledger's shift), judged
//! against the earliest booking a lease's units may come from (a refill in the same
//! expiry tick keeps it); and the bound holds with four threads charging and
//! refunding each other's receipts while the clock moves. Also: a denial's
//! `retry_after` is the central word's wait for the whole cost, so a retry after it
//! admits on another shard.
#![cfg(not(loom))]

mod lease_ledger;

use std::collections::VecDeque;
use std::sync::{mpsc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

use floodgate::{LeasedGcra, ManualClock, Nanos, Receipt};
use lease_ledger::{assert_accounted, limiter_on, look, Look};

/// `burst` at 1 000/s (T = 1 ms), 64 shards of leases of `lease` units living an hour.
fn leased(burst: u64, lease: u32, clock: &ManualClock) -> LeasedGcra<ManualClock> {
    limiter_on(clock, 1_000, burst, lease, 64)
}

/// Refunds `receipt` on a fresh thread (one that owns no shard).
fn refund_elsewhere(l: &LeasedGcra<ManualClock>, receipt: Receipt) -> bool {
    thread::scope(|s| s.spawn(|| l.refund(receipt)).join().unwrap())
}

#[test]
fn a_refund_on_another_thread_gives_the_units_back_to_the_central_word() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let l = leased(100, 10, &clock);
    let (d, receipt) = l.charge(3); // books 10 units: [1 s, 1.01 s)
    assert!(d.is_allowed() && receipt.is_charged());
    assert_eq!((l.peek(0).remaining(), l.units_on_lease()), (90, 7));
    assert!(refund_elsewhere(&l, receipt), "the charge comes back");
    assert_eq!(l.peek(0).remaining(), 93, "to the central word");
    assert_eq!(l.units_on_lease(), 7, "the lease is untouched");
    // On the charging thread, while its lease lives: back to the lease, as before.
    let (_, receipt) = l.charge(2);
    assert!(l.refund(receipt));
    assert_eq!((l.peek(0).remaining(), l.units_on_lease()), (93, 7));
}

#[test]
fn only_the_part_of_the_booking_still_ahead_comes_back() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let l = leased(100, 10, &clock);
    let (_, early) = l.charge(4); // books [1 s, 1.01 s)
    let (_, late) = l.charge(4);
    let (_, passed) = l.charge(1);
    // 7 ms on: 3 ms of the booking are ahead, less than the 4 units of `early`.
    clock.advance(Duration::from_millis(7));
    let before = l.peek(0).remaining(); // 100 − 3 ms booked ahead
    assert_eq!(before, 97);
    assert!(refund_elsewhere(&l, early));
    assert_eq!(
        l.peek(0).remaining(),
        100,
        "3 of the 4 units: the rest has passed"
    );
    // The schedule is idle now: nothing of the booking is ahead any more.
    assert!(!refund_elsewhere(&l, late));
    clock.advance(Duration::from_millis(10));
    assert!(
        !refund_elsewhere(&l, passed),
        "the clock has passed the booking"
    );
    assert_eq!(l.peek(0).remaining(), 100);
}

#[test]
fn a_booking_moved_by_an_earlier_refund_gives_back_only_what_is_still_ahead() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let l = leased(100, 4, &clock);
    // Three refills of 4 on this thread, each in a later expiry tick: bookings
    // [0, 4), [4, 8) and [8, 12) ms past 1 s.
    let (_, a) = l.charge(4);
    clock.advance(Duration::from_micros(70));
    let (_, b) = l.charge(4);
    clock.advance(Duration::from_micros(70));
    let (_, _c) = l.charge(4);
    assert_eq!(l.peek(0).remaining(), 88);
    // At 3 ms, 1 ms of A's booking is ahead: it comes back, and B's booking moves
    // down by it, to [3, 7).
    clock.set(Nanos::new(1_003_000_000));
    assert!(refund_elsewhere(&l, a));
    // At 5 ms, 2 ms of B's moved booking are ahead (not the 3 ms its receipt's
    // booking end would say).
    clock.set(Nanos::new(1_005_000_000));
    assert!(refund_elsewhere(&l, b));
    // The schedule ends at 12 − 1 − 2 = 9 ms: 4 ms ahead of the clock.
    assert_eq!(l.peek(0).remaining(), 96);
}

#[test]
fn a_lease_refilled_in_the_same_tick_keeps_the_earlier_booking() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let l = leased(100, 4, &clock);
    let (_, first) = l.charge(4); // books [0, 4) ms past 1 s; the lease is spent
    let (_, _second) = l.charge(4); // same tick, same expiry: books [4, 8) ms
    assert!(l.refund(first), "back to the lease of the same expiry");
    assert_eq!(l.units_on_lease(), 4);
    // These units are the first booking's, which ends at 4 ms.
    let (_, spent) = l.charge(4);
    clock.set(Nanos::new(1_005_000_000));
    assert!(
        !refund_elsewhere(&l, spent),
        "judged against the first booking, which the clock has passed"
    );
    assert_eq!(l.peek(0).remaining(), 97); // [5, 8) ms ahead
}

/// A refill that carries units over (the lease's own still spendable, fewer than
/// the cost) spends them first: the units it leaves are all of its own booking, so
/// a later charge from that lease is judged against that booking's end, not the
/// older one the carried units came from.
#[test]
fn a_charge_after_a_refill_that_carried_units_over_is_judged_against_the_new_booking() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let l = leased(100, 10, &clock);
    let (_, first) = l.charge(8); // books [0, 10) ms past 1 s; 2 left on the lease
    clock.set(Nanos::new(1_020_000_000)); // that booking has passed
    let (d, refill) = l.charge(3); // spends the 2 carried, books [20, 30) ms
    assert!(d.is_allowed());
    assert_eq!((l.units_on_lease(), l.peek(0).remaining()), (9, 90));
    let (_, later) = l.charge(4);
    assert!(
        refund_elsewhere(&l, later),
        "its units are the new booking's, all still ahead"
    );
    assert_eq!(l.peek(0).remaining(), 94, "[26, 30) ms came back");
    // The refill's own charge spent the 2 carried units of the passed booking: it
    // is judged against that booking's end (conservative: its 1 unit of the new
    // booking does not come back).
    assert!(!refund_elsewhere(&l, refill));
    assert!(!refund_elsewhere(&l, first));
    assert_eq!(l.peek(0).remaining(), 94);
    assert_eq!(l.units_on_lease(), 5);
}

/// The refill's own charge, when it spends carried units, spans two bookings with
/// another shard's between them: judged against the new booking's end with its
/// whole cost it would give back part of the other shard's booking. It is judged
/// against the earlier end.
#[test]
fn a_refills_own_charge_of_carried_units_gives_back_no_other_shards_booking() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let l = leased(100, 4, &clock);
    let (_, _first) = l.charge(3); // books [0, 4) ms past 1 s; 1 left on the lease
    thread::scope(|s| {
        s.spawn(|| {
            let (d, _) = l.charge(1); // another shard books [4, 8) ms
            assert!(d.is_allowed());
        });
    });
    clock.set(Nanos::new(1_005_000_000));
    // Spends the carried unit and 5 new ones: the refill takes its need, 5,
    // booking [8, 13) ms; this lease is left empty (the other shard holds 3).
    let (d, spanning) = l.charge(6);
    assert!(d.is_allowed());
    assert_eq!((l.units_on_lease(), l.peek(0).remaining()), (3, 92));
    refund_elsewhere(&l, spanning);
    let back = l.peek(0).remaining() - 92;
    assert!(
        back <= 5,
        "{back} back: more than this refill's booking, part of [4, 8) ms"
    );
    // Judged against the carried unit's booking, [0, 4) ms, which has passed.
    assert_eq!(back, 0);
}

/// Four threads charge and hand their receipts to the next thread, which refunds
/// them (on the central word: it does not own the charging shard). Phase 1's
/// receipts are refunded in the middle of phase 2 (the schedule busy again, the
/// clock past their bookings), phase 2's late, while the clock moves. Between a quiescent look `a` (after phase 1) and
/// `b` (after phase 2), the admissions of phase 2 net of its refunded charges stay
/// within the central word's remaining at `a`, the T the clock moved, and the units
/// the shards held at `a`: a refund of a charge made before `a` gives back only
/// schedule still ahead of the clock, never capacity the bound does not allow.
#[test]
fn the_bound_holds_with_four_threads_charging_and_refunding_across_threads() {
    const THREADS: usize = 4;
    const ROUNDS: u64 = 1_000;
    const STEP: Duration = Duration::from_micros(25);
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let mut l = leased(8, 2, &clock);
    let all = Barrier::new(THREADS);
    let at_a = Mutex::new(None);
    let (senders, receivers): (Vec<_>, Vec<_>) =
        (0..THREADS).map(|_| mpsc::channel::<Receipt>()).unzip();
    let (admitted, before_a_back): (i64, u64) = thread::scope(|s| {
        let (l, clock, all, at_a) = (&l, &clock, &all, &at_a);
        let handles: Vec<_> = receivers
            .into_iter()
            .enumerate()
            .map(|(i, from_prev)| {
                let to_next = senders[(i + 1) % THREADS].clone();
                s.spawn(move || {
                    let cost_of = |round: u64| 1 + ((round as u32 + i as u32) % 3);
                    // Phase 1: charges whose receipts go to the next thread.
                    for round in 0..ROUNDS / 4 {
                        clock.advance(STEP);
                        let (d, receipt) = l.charge(cost_of(round));
                        if d.is_allowed() {
                            let _ = to_next.send(receipt);
                        }
                    }
                    all.wait();
                    // Every phase-1 receipt has been sent: take the previous thread's.
                    let early: Vec<Receipt> = from_prev.try_iter().collect();
                    if i == 0 {
                        // Past every booking (the schedule is at most 8 ms ahead).
                        clock.advance(Duration::from_millis(20));
                        *at_a.lock().unwrap() = Some(Look {
                            central: l.peek(0).remaining(),
                            on_lease: l.units_on_lease(),
                            held: l.units_held(),
                        });
                    }
                    all.wait();
                    // Phase 2.
                    let mut early = Some(early);
                    let mut before_a_back = 0u64;
                    let mut net = 0i64;
                    let mut held: VecDeque<Receipt> = VecDeque::new();
                    for round in 0..ROUNDS {
                        if round == ROUNDS / 2 {
                            // The previous thread's phase-1 receipts, while the
                            // schedule is busy again (charged before `a`: not
                            // admissions of this phase, whatever comes back).
                            for receipt in early.take().into_iter().flatten() {
                                let cost = receipt.cost();
                                if l.refund(receipt) {
                                    before_a_back += u64::from(cost);
                                }
                            }
                        }
                        clock.advance(STEP);
                        let cost = cost_of(round);
                        let (d, receipt) = l.charge(cost);
                        if d.is_allowed() {
                            net += i64::from(cost);
                            if round % 2 == 0 {
                                let _ = to_next.send(receipt);
                            }
                        }
                        held.extend(from_prev.try_iter());
                        // Late: many after the clock has passed their booking.
                        while held.len() > 3 {
                            let receipt = held.pop_front().expect("non-empty");
                            let cost = receipt.cost();
                            if l.refund(receipt) {
                                net -= i64::from(cost);
                            }
                        }
                    }
                    (net, before_a_back)
                })
            })
            .collect();
        drop(senders);
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .fold((0, 0), |(n, b), (dn, db)| (n + dn, b + db))
    });
    let a = at_a.into_inner().unwrap().expect("thread 0 looked");
    let b = look(&mut l);
    assert_eq!(
        before_a_back, 0,
        "bookings the clock had passed gave units back"
    );
    let admitted = u64::try_from(admitted).expect("net admissions are not negative");
    let refills = (THREADS as u64 * ROUNDS * STEP.as_nanos() as u64) / 1_000_000;
    assert_accounted(
        &l,
        (a, b),
        admitted,
        refills,
        a.held,
        "cross-thread refunds",
    );
}

#[test]
fn a_denials_retry_after_admits_on_another_shard() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let mut l = limiter_on(&clock, 1, 10, 4, 4); // 10 at 1/s, leases of 4
    assert!(l.check_on(0, 3).is_allowed()); // leases 4: 1 left, central 6
    assert!(l.check_on(1, 3).is_allowed()); // leases 4: 1 left, central 2
    assert!(l.check_on(1, 3).is_allowed()); // 1 + 2 from central: central 0
                                            // Shard 0 holds 1 unit and is short of 2.
    let denied = l.check_on(0, 3);
    assert!(!denied.is_allowed());
    let retry = denied.retry_after().expect("a wait, not never");
    clock.advance(retry);
    // The retry lands on a shard without a lease (another thread's).
    assert!(
        l.check_on(2, 3).is_allowed(),
        "waited the {retry:?} shown, denied again"
    );
}
