//! Session 41 review of leased refunds to the central word (`LeasedGcra::refund`,
//! "Back to the central word"), on a refill clock (a [`ManualClock`]) and a coarse
//! expiry clock driven by hand (`CoarseClock::with_clock` over quanta's mock), the
//! two apart, as `tests/lease_coarse.rs` drives them.
//!
//! * A refund to the lease of a charge whose lease an owner's stale reading dated
//!   again (a refill at a tick behind a later refill's, then a refund there) put
//!   units of a booking the clock had passed into a lease judged against a later
//!   booking: a charge of them, refunded on another thread, gave that later
//!   booking's tail back to the central word — a refund whose own booking had
//!   passed gave back units. The lease refund now lowers the shard's `booked` to
//!   the receipt's booking end (and keeps the older ledger note).
//! * With an expiry clock that steps back (or a thread that has not seen the
//!   coarse clock's newest tick), a receipt of a lease expired at `a` can still go
//!   back to that lease and be spent again: the bound needs every outstanding
//!   receipt's charge counted as out at `a`, not only those of leases unexpired at
//!   `a` (the module docs said the latter).
#![cfg(not(loom))]

mod common;
mod lease_ledger;

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::lease_builder;
use floodgate::lease::{CoarseClock, Expiry};
use floodgate::{Clock, LeasedGcra, ManualClock, Nanos, Receipt};

/// An expiry tick: a lease is dated to one (2^16 ns).
const TICK: u64 = 1 << 16;
/// Expiry ticks in about a second: far past a lease's 15.
const SECOND: i64 = 15_259;

/// A limiter of `burst` at 1 000/s (T = 1 ms), leases of 10 living 1 ms (15 expiry
/// ticks) over 64 shards (the test thread owns one), on a refill clock and a mocked
/// expiry clock standing at tick 10 past the limiter's origin.
struct Rig {
    /// The expiry clock's hand.
    coarse: Arc<quanta::Mock>,
    refill: ManualClock,
    limiter: LeasedGcra<ManualClock>,
}

impl Rig {
    fn at_tick_10(burst: u64) -> Rig {
        let (quanta_clock, coarse) = quanta::Clock::mock();
        coarse.increment(5_000);
        let refill = ManualClock::starting_at(Nanos::from_secs(1_000));
        let limiter = lease_builder(burst, 10, 64, Duration::from_millis(1))
            .build_with(
                refill.clone(),
                Expiry::Coarse(CoarseClock::with_clock(quanta_clock)),
            )
            .unwrap();
        assert!(limiter.owns_shard());
        coarse.increment(10 * TICK);
        Rig {
            coarse,
            refill,
            limiter,
        }
    }

    /// Tick 10: a lease of 10 booked [S, S + 10 ms), all spent by the charge whose
    /// receipt this returns; then the refill clock passes that booking and, at tick
    /// 11, a new lease booked [S + 20, S + 30 ms) is spent whole (its receipt kept:
    /// an admission); then the expiry clock reads tick 10 again (an owner's stale
    /// reading, or the expiry clock stepping back): the tick-11 lease is not
    /// spendable there, so the next refill dates a lease at the first's expiry.
    fn a_passed_booking_then_back_to_its_tick(&self) -> Receipt {
        let l = &self.limiter;
        let (d, first) = l.charge(10);
        assert!(d.is_allowed() && first.is_charged());
        self.refill.advance(Duration::from_millis(20));
        self.ticks(1);
        assert!(l.charge(10).0.is_allowed());
        self.ticks(-1);
        first
    }

    /// Moves the expiry clock `ticks` ticks on (back, if negative).
    fn ticks(&self, ticks: i64) {
        let by = ticks.unsigned_abs() * TICK;
        if ticks < 0 {
            self.coarse.decrement(by);
        } else {
            self.coarse.increment(by);
        }
    }
}

/// Refunds `receipt` on a fresh thread (one that owns no shard): to the central word.
fn refund_elsewhere(l: &LeasedGcra<ManualClock>, receipt: Receipt) -> bool {
    thread::scope(|s| s.spawn(|| l.refund(receipt)).join().unwrap())
}

/// The central word's remaining (nothing written).
fn central(l: &LeasedGcra<ManualClock>) -> u64 {
    l.peek(0).remaining()
}

/// Refunds `receipt` on this thread: its cost if anything came back, else 0.
fn refunded(l: &LeasedGcra<ManualClock>, receipt: Receipt) -> u64 {
    let cost = receipt.cost();
    if l.refund(receipt) {
        u64::from(cost)
    } else {
        0
    }
}

/// Charges `cost` from this thread's lease and refunds it on another thread (to the
/// central word): nothing comes back, and the central word is as it was.
fn charge_and_refund_elsewhere_gives_nothing(l: &LeasedGcra<ManualClock>, cost: u32, why: &str) {
    let (d, receipt) = l.charge(cost);
    assert!(d.is_allowed() && receipt.is_charged(), "{d:?}");
    let before = central(l);
    let back = refund_elsewhere(l, receipt);
    assert_eq!((back, central(l)), (false, before), "{why}");
}

#[test]
#[cfg_attr(miri, ignore = "quanta executes CPUID")]
fn a_refund_whose_booking_has_passed_gives_nothing_back_after_a_refill_at_an_older_tick() {
    let rig = Rig::at_tick_10(30);
    let l = &rig.limiter;
    // `first` spent a lease booked [S, S + 10 ms); at tick 10 again, a refill
    // dates a new lease at `first`'s expiry, booked [S + 30, S + 40 ms).
    let first = rig.a_passed_booking_then_back_to_its_tick();
    let (d, _third) = l.charge(10);
    assert!(d.is_allowed());
    assert_eq!(central(l), 10, "20 ms booked ahead of S + 20 ms: 30 − 20");
    // `first` goes back to that lease (same expiry tick): its 10 units, of a
    // booking the refill clock passed 10 ms ago.
    assert!(l.refund(first));
    assert_eq!(l.units_on_lease(), 10);
    // A charge of them, refunded on another thread: to the central word. Its units
    // came from the passed booking, so nothing of theirs is ahead of the clock.
    charge_and_refund_elsewhere_gives_nothing(
        l,
        10,
        "a refund of units whose booking has passed gave the later booking's tail back",
    );
}

/// A refill that spends carried units leaves a lease word its own charge is known
/// by (judged against the carried units' booking, the earlier end). A refund to the
/// lease that puts units of an older booking back clears that: a later charge that
/// leaves the same word is judged against the lowered end, not the refill's.
#[test]
#[cfg_attr(miri, ignore = "quanta executes CPUID")]
fn a_charge_leaving_a_carrying_refills_word_after_a_lease_refund_is_judged_against_the_older_booking(
) {
    let rig = Rig::at_tick_10(100);
    let l = &rig.limiter;
    // `first` spent a lease booked [S, S + 10 ms); at tick 10 again, a lease at
    // `first`'s expiry tick, booked [S + 30, S + 40 ms), 2 left; then a refill that
    // carries those 2 (same tick, same expiry), booked [S + 40, S + 50 ms), 9 left.
    let first = rig.a_passed_booking_then_back_to_its_tick();
    assert!(l.charge(8).0.is_allowed());
    assert!(l.charge(3).0.is_allowed());
    assert_eq!((l.units_on_lease(), central(l)), (9, 70));
    // `first` goes back to that lease: 1 unit of room (the other 9 to the central
    // word, where its booking has passed: nothing).
    assert!(l.refund(first));
    assert_eq!((l.units_on_lease(), central(l)), (10, 70));
    // A charge of 1 leaves the lease word the carrying refill left; the lease holds
    // a unit of `first`'s passed booking, so nothing of it is ahead of the clock.
    charge_and_refund_elsewhere_gives_nothing(
        l,
        1,
        "a charge after a lease refund was judged as the carrying refill's own",
    );
}

#[test]
#[cfg_attr(miri, ignore = "quanta executes CPUID")]
fn a_receipt_of_an_expired_lease_refunded_at_a_stale_reading_is_spent_again() {
    let burst = 10;
    let rig = Rig::at_tick_10(burst);
    let l = &rig.limiter;
    // Tick 10: the whole burst on lease, spent by one charge.
    let (d, receipt) = l.charge(10);
    assert!(d.is_allowed() && receipt.is_charged());
    // `a`: the expiry clock has passed the lease, the refill clock its booking. The
    // shards hold nothing; the one receipt outstanding is of an expired lease.
    rig.ticks(SECOND);
    rig.refill.advance(Duration::from_millis(10));
    let (held_at_a, on_lease_at_a) = (l.units_held(), l.units_on_lease());
    assert_eq!((held_at_a, on_lease_at_a, central(l)), (0, 0, burst));
    // The expiry clock steps back to tick 10 (or: a thread that has not seen the
    // newer ticks): the lease reads unexpired, and the receipt goes back to it.
    rig.ticks(-SECOND);
    assert!(l.refund(receipt), "back to the lease it was spent from");
    let mut admitted = 0;
    if l.check_n(10).is_allowed() {
        admitted += 10;
    }
    // And the central word's burst, at the same refill reading.
    rig.ticks(SECOND);
    if l.check_n(10).is_allowed() {
        admitted += 10;
    }
    // The bound as the module docs read it before: units the shards hold at `a`,
    // and charges refundable at `a` from a lease unexpired at `a` (none).
    let documented = burst + held_at_a;
    assert!(
        admitted > documented,
        "the attack no longer admits past the old reading: {admitted}"
    );
    // The bound with every receipt outstanding at `a` counted as out (10 units).
    assert!(admitted <= burst + held_at_a + 10, "admitted {admitted}");
}

#[test]
#[cfg_attr(miri, ignore = "quanta executes CPUID")]
fn a_refund_judged_against_its_bookings_ledger_note_after_a_refill_at_an_older_tick() {
    let rig = Rig::at_tick_10(30);
    let l = &rig.limiter;
    // Tick 10: a lease of 10 booked [S, S + 10 ms), spent by two charges of 5.
    let (_, kept) = l.charge(5);
    let (_, early) = l.charge(5);
    assert!(kept.is_charged() && early.is_charged());
    // `early` back to the central word: the booking moves down 5 ms, to
    // [S, S + 5 ms) — the ledger's shift.
    assert!(refund_elsewhere(l, early));
    assert_eq!(central(l), 25);
    // 6 ms on, the moved booking has passed. Tick 11: a new lease; then tick 10
    // again (a stale reading): a lease of `kept`'s expiry tick, dated anew, its
    // booking noted after `early`'s refund.
    rig.refill.advance(Duration::from_millis(6));
    rig.ticks(1);
    assert!(l.charge(10).0.is_allowed());
    rig.ticks(-1);
    assert!(l.charge(10).0.is_allowed());
    // `kept` back to that lease, spent again, refunded on another thread: its
    // booking (moved to end at S + 5 ms) has passed, whatever the new lease's note.
    assert!(l.refund(kept));
    charge_and_refund_elsewhere_gives_nothing(
        l,
        5,
        "judged without the shift of the refund that moved its booking",
    );
}

/// Four threads charge on a manual clock whose leases live one expiry tick; at `a`
/// every lease has expired, and the central schedule is still ahead (a deficit) or,
/// with `pass`, passed too. Each thread then refunds half its pre-`a` receipts
/// itself, one a decision, and hands the rest to the next thread, which refunds
/// them at once — all to the central word (their leases expired: not "out on
/// lease at `a`") — while all keep charging and refunding their own receipts. With
/// a deficit the pre-`a` refunds give units back, yet together no more than the
/// deficit; passed, none. Either way the bound `B + ⌊(b − a)/T⌋ +` units on lease
/// at `a` holds. Returns the units the pre-`a` refunds gave back.
fn expired_receipts_against_the_bound(pass: bool) -> u64 {
    use std::sync::{mpsc, Barrier, Mutex};
    const THREADS: usize = 4;
    const PRE_ROUNDS: u64 = 100;
    const PRE_STEP: Duration = Duration::from_micros(100);
    const ROUNDS: u64 = 50;
    const STEP: Duration = Duration::from_micros(20);
    let burst = 40;
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let l = lease_builder(burst, 4, 64, Duration::from_micros(70))
        .build_with_clock(clock.clone())
        .unwrap();
    let all = Barrier::new(THREADS);
    let at_a = Mutex::new(None);
    // A ring: thread i sends to thread i + 1.
    let (mut senders, receivers): (Vec<_>, Vec<_>) =
        (0..THREADS).map(|_| mpsc::channel::<Receipt>()).unzip();
    senders.rotate_left(1);
    let ring = senders.into_iter().zip(receivers);
    let (admitted, before_a_back) = thread::scope(|s| {
        let (l, clock, all, at_a) = (&l, &clock, &all, &at_a);
        let mut handles = Vec::new();
        for (i, (to_next, from_prev)) in ring.enumerate() {
            handles.push(s.spawn(move || {
                let cost_of = |round: u64| 1 + ((round as u32 + i as u32 * 7) % 3);
                // Before `a`: charges kept, their receipts for the next thread.
                let mut early = Vec::new();
                for round in 0..PRE_ROUNDS {
                    // 40 ms of charges (twice the burst): leases of many expiry
                    // ticks, bookings judged apart, most passed by `a`.
                    clock.advance(PRE_STEP);
                    let (d, receipt) = l.charge(cost_of(round));
                    if d.is_allowed() {
                        early.push(receipt);
                    }
                }
                // Every other receipt to the next thread; the rest this thread
                // refunds itself (its leases expired: to the central word too).
                let mut own = Vec::new();
                for (n, receipt) in early.into_iter().enumerate() {
                    if n % 2 == 0 {
                        let _ = to_next.send(receipt);
                    } else {
                        own.push(receipt);
                    }
                }
                all.wait();
                if i == 0 {
                    // Every lease expires (two ticks on); the schedule, booked
                    // up to the burst ahead, is passed only with `pass`.
                    let passed = if pass { 50_000 } else { 140 };
                    clock.advance(Duration::from_micros(passed));
                    *at_a.lock().unwrap() =
                        Some((l.peek(0).remaining(), l.units_on_lease(), clock.now()));
                }
                all.wait();
                let mut early: Vec<Receipt> = from_prev.try_iter().collect();
                let (mut net, mut back) = (0i64, 0u64);
                let mut held = std::collections::VecDeque::new();
                for round in 0..ROUNDS {
                    if round == 5 {
                        // No thread is more than 5 rounds on: the clock is
                        // at most 0.4 ms past `a`.
                        all.wait();
                    }
                    if round == i as u64 {
                        // While the others charge on the deficit.
                        back += early.drain(..).map(|r| refunded(l, r)).sum::<u64>();
                    }
                    if let Some(receipt) = own.pop() {
                        back += refunded(l, receipt);
                    }
                    clock.advance(STEP);
                    let cost = cost_of(round);
                    let (d, receipt) = l.charge(cost);
                    if d.is_allowed() {
                        net += i64::from(cost);
                        if round % 3 == 0 {
                            held.push_back(receipt);
                        }
                    }
                    if held.len() > 2 {
                        let oldest = held.pop_front().expect("non-empty");
                        net -= refunded(l, oldest) as i64;
                    }
                }
                (net, back)
            }));
        }
        let each: Vec<(i64, u64)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        (
            each.iter().map(|e| e.0).sum::<i64>(),
            each.iter().map(|e| e.1).sum::<u64>(),
        )
    });
    let (central_at_a, on_lease_at_a, a) = at_a.into_inner().unwrap().expect("looked");
    let admitted = u64::try_from(admitted).expect("net admissions are not negative");
    let refills = (clock.now().as_u64() - a.as_u64()) / 1_000_000;
    assert!(
        admitted <= burst + refills + on_lease_at_a,
        "admitted {admitted} past B {burst} + {refills} T + {on_lease_at_a} on lease at a"
    );
    assert!(
        admitted <= central_at_a + refills + on_lease_at_a + before_a_back,
        "admitted {admitted}: central at a {central_at_a}, pre-a refunds {before_a_back}"
    );
    before_a_back
}

#[test]
fn refunds_of_expired_leases_charges_give_back_no_more_than_the_deficit_at_a() {
    let back = expired_receipts_against_the_bound(false);
    assert!(back > 0, "no pre-a refund gave anything back");
}

#[test]
fn refunds_of_expired_leases_charges_give_nothing_back_once_their_bookings_passed() {
    assert_eq!(expired_receipts_against_the_bound(true), 0);
}

/// Readings at the end of time: a limiter built there dates its leases from its
/// origin, so it leases; the central schedule cannot pass `u64::MAX`. Charges,
/// refunds to the lease and to the central word neither panic nor give back more
/// than was charged, and the central word never reports more than the burst.
#[test]
fn readings_at_the_end_of_time_neither_panic_nor_give_back_more_than_charged() {
    for start in [u64::MAX - 5_000_000, u64::MAX - 1, u64::MAX] {
        let clock = ManualClock::starting_at(Nanos::new(start));
        let l = lease_builder(10, 4, 64, Duration::from_secs(1))
            .build_with_clock(clock.clone())
            .unwrap();
        let mut admitted = 0u64;
        let mut receipts = Vec::new();
        for cost in [1, 3, 4, 2, 5, 1] {
            let (d, receipt) = l.charge(cost);
            if d.is_allowed() {
                admitted += u64::from(cost);
            }
            receipts.push(receipt);
        }
        let on_lease = l.units_on_lease();
        assert!(
            admitted + on_lease <= 10,
            "{start}: {admitted} + {on_lease}"
        );
        let before = central(&l);
        let (mut back_elsewhere, mut charged_elsewhere) = (0, 0);
        for (n, receipt) in receipts.into_iter().enumerate() {
            if n % 2 == 0 {
                charged_elsewhere += u64::from(receipt.cost() * u32::from(receipt.is_charged()));
                if refund_elsewhere(&l, receipt) {
                    back_elsewhere += 1;
                }
            } else {
                let _ = l.refund(receipt);
            }
        }
        let after = central(&l);
        assert!(after <= 10, "{start}: central {after}");
        assert!(
            after - before <= charged_elsewhere,
            "{start}: the central word gained {} for {charged_elsewhere} charged ({back_elsewhere} back)",
            after - before
        );
        assert!(l.units_on_lease() <= 4);
        clock.advance(Duration::from_secs(10));
        let _ = l.charge(1);
        let _ = l.peek(3);
    }
}
