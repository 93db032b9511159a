//! Session 45 adversarial review of `Reservation::into_receipt` (qreceipt): a
//! reservation granted with no delay becomes its charge's receipt. Attacked here on
//! the lock-free shaper and its mutex twin: the receipt is the one `charge_at` gives
//! at the same instant, field for field, over seeded traces with explicit earlier and
//! later instants, resets, policy changes, refunds and cancellations; the boundary
//! slot (exactly `now + τ`, and one nanosecond later); cost 0; the end of `u64` time;
//! foreign shapers; refunds after later reservations were cancelled or converted;
//! and conversions and refunds racing from several threads on a frozen clock.
#![cfg(not(loom))]

use floodgate::{
    Clock, GcraState, LockedShaper, ManualClock, Nanos, Policy, Receipt, Reservation, ShapeError,
    Shaper, StateCell,
};
use std::time::Duration;

/// A constructor of a shaper on one kind of cell.
type Make<S> = fn(Policy, ManualClock) -> Shaper<ManualClock, S>;

/// Runs `$case` on the lock-free shaper and on its mutex twin.
macro_rules! on_both_cells {
    ($case:ident) => {
        $case(Shaper::<ManualClock>::with_clock);
        $case(LockedShaper::<ManualClock>::locked_with_clock);
    };
}

/// A small deterministic generator (xorshift), so a failure replays from its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// A receipt's fields without the issuing shaper's id (two shapers' receipts differ
/// only there when their histories are the same).
fn without_owner(receipt: &Receipt) -> String {
    let text = format!("{receipt:?}");
    let Some(at) = text.find("owner: ") else {
        return text;
    };
    let rest = &text[at + "owner: ".len()..];
    let digits = rest.chars().take_while(char::is_ascii_digit).count();
    format!("{}owner: _{}", &text[..at], &rest[digits..])
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn policy(per_second: u64, burst: u64) -> Policy {
    Policy::per_second(per_second)
        .and_then(|p| p.with_burst(burst))
        .expect("a valid policy")
}

/// Twin shapers on one cell kind driven through the same seeded trace: `converted`
/// takes every slot with one reservation and converts it; `charged` takes a free
/// slot with `charge_at` and reserves only when that is refused (what the queue
/// rules did before qreceipt). At every step the converted receipt is the charge's
/// receipt field for field (bar the shaper's id), the reservation's decision is the
/// schedule peeked right after the charge, refunds and cancellations agree, and the
/// states stay equal.
fn a_converted_receipt_is_the_charges_receipt<S: StateCell<GcraState>>(make: Make<S>) {
    for seed in 1..=64u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let burst = 1 + rng.below(4);
        let per_second = [1, 3, 10, 1000][rng.below(4) as usize];
        let p = policy(per_second, burst);
        let interval = p.interval_nanos();
        let clock_c = ManualClock::starting_at(Nanos::from_secs(5));
        let clock_p = ManualClock::starting_at(Nanos::from_secs(5));
        let mut converted = make(p, clock_c.clone());
        let mut charged = make(p, clock_p.clone());
        let mut receipts: Vec<(Receipt, Receipt)> = Vec::new();
        let mut waiting: Vec<(Reservation, Reservation)> = Vec::new();
        for step in 0..120 {
            let now = clock_c.now();
            match rng.below(16) {
                0..=2 => {
                    let d = Duration::from_nanos(rng.below(3 * interval));
                    clock_c.advance(d);
                    clock_p.advance(d);
                }
                3..=9 => {
                    // An instant the caller read: now, or up to two intervals before
                    // or after it (reserve_at / charge_at at explicit instants).
                    let shift = rng.below(2 * interval);
                    let at = match rng.below(3) {
                        0 => now,
                        1 => Nanos::new(now.as_u64().saturating_sub(shift)),
                        _ => Nanos::new(now.as_u64() + shift),
                    };
                    let cost = rng.below(burst + 2) as u32;
                    let max_delay =
                        [Duration::ZERO, ms(250), Duration::from_secs(3)][rng.below(3) as usize];
                    let ctx = format!("seed {seed} step {step} at {at:?} cost {cost}");
                    let reserved = converted.reserve_at(at, cost, max_delay);
                    let (plain, receipt) = charged.charge_at(at, cost);
                    match reserved {
                        Ok(reservation) => {
                            let decision = reservation.decision();
                            match reservation.into_receipt() {
                                Ok(mine) => {
                                    assert!(plain.is_allowed(), "{ctx}: converted, charge refused");
                                    assert_eq!(
                                        without_owner(&mine),
                                        without_owner(&receipt),
                                        "{ctx}"
                                    );
                                    assert_eq!(
                                        mine.cost(),
                                        if mine.is_charged() { cost } else { 0 }
                                    );
                                    let schedule =
                                        charged.peek_reserve_at(at, 0, max_delay).decision();
                                    assert_eq!(decision, schedule, "{ctx}: the immediate figures");
                                    receipts.push((mine, receipt));
                                }
                                Err(later) => {
                                    assert!(!plain.is_allowed(), "{ctx}: delayed, charge admitted");
                                    assert!(!later.delay().is_zero(), "{ctx}");
                                    let twin = charged
                                        .reserve_at(at, cost, max_delay)
                                        .expect("the twin's reservation fits too");
                                    assert_eq!(twin.delay(), later.delay(), "{ctx}");
                                    waiting.push((later, twin));
                                }
                            }
                        }
                        Err(e) => {
                            if plain.is_allowed() {
                                panic!("{ctx}: reservation refused ({e}), charge admitted");
                            }
                            assert_eq!(
                                charged.reserve_at(at, cost, max_delay).err(),
                                Some(e),
                                "{ctx}"
                            );
                        }
                    }
                }
                10..=12 if !receipts.is_empty() => {
                    let pick = rng.below(receipts.len() as u64) as usize;
                    let (mine, theirs) = receipts.swap_remove(pick);
                    assert_eq!(
                        converted.refund(mine),
                        charged.refund(theirs),
                        "seed {seed} step {step}: refund"
                    );
                }
                13 | 14 if !waiting.is_empty() => {
                    let pick = rng.below(waiting.len() as u64) as usize;
                    let (mine, theirs) = waiting.swap_remove(pick);
                    assert_eq!(
                        converted.cancel(mine),
                        charged.cancel(theirs),
                        "seed {seed} step {step}: cancel"
                    );
                }
                15 => {
                    if rng.below(2) == 0 {
                        converted.reset();
                        charged.reset();
                    } else {
                        let next = policy([1, 10, 1000][rng.below(3) as usize], 1 + rng.below(4));
                        converted.set_policy(next);
                        charged.set_policy(next);
                    }
                }
                _ => {}
            }
            assert_eq!(
                converted.state(),
                charged.state(),
                "seed {seed} step {step}: states"
            );
        }
    }
}

#[test]
fn a_converted_receipt_is_the_charges_receipt_field_for_field() {
    on_both_cells!(a_converted_receipt_is_the_charges_receipt);
}

/// 10 a second, burst 2 (`T` = 100 ms, `τ` = 200 ms): the schedule is booked to
/// 200 ms at 0. At 100 ms a unit's new `TAT` is 300 ms = now + τ: the slot is now,
/// and it converts (as `charge_at` admits it). One nanosecond earlier the slot is
/// 1 ns away: no receipt, and `charge_at` refuses with that 1 ns.
fn the_slot_at_now_plus_tau_converts_and_one_ns_later_does_not<S: StateCell<GcraState>>(
    make: Make<S>,
) {
    let at = |ns: u64| Nanos::new(ns);
    for (now, converts) in [(100_000_000, true), (99_999_999, false)] {
        let shaper = make(policy(10, 2), ManualClock::new());
        let twin = make(policy(10, 2), ManualClock::new());
        let _ = shaper
            .reserve_at(at(0), 2, Duration::ZERO)
            .expect("the burst");
        let _ = twin.charge_at(at(0), 2);
        let reservation = shaper.reserve_at(at(now), 1, ms(1)).expect("within 1 ms");
        let (plain, _) = twin.charge_at(at(now), 1);
        assert_eq!(reservation.ready_at(), at(100_000_000));
        match reservation.into_receipt() {
            Ok(receipt) => {
                assert!(converts, "a slot 1 ns away converted");
                assert!(plain.is_allowed());
                assert_eq!(receipt.cost(), 1);
                assert_eq!(receipt.charged_at(), Some(at(now)));
            }
            Err(later) => {
                assert!(!converts, "the slot at now + τ did not convert");
                assert_eq!(later.delay(), Duration::from_nanos(1));
                assert_eq!(plain.retry_after(), Some(Duration::from_nanos(1)));
                assert_eq!(shaper.cancel_at(at(now), later), 1);
            }
        }
    }
}

#[test]
fn the_slot_exactly_at_now_plus_tau_converts_and_one_ns_later_does_not() {
    on_both_cells!(the_slot_at_now_plus_tau_converts_and_one_ns_later_does_not);
}

/// A reservation of nothing has no delay even on a schedule booked far ahead, and
/// converts to a receipt that holds nothing: its refund gives nothing back and
/// leaves the schedule as it was.
fn cost_zero_converts_to_nothing<S: StateCell<GcraState>>(make: Make<S>) {
    let shaper = make(policy(10, 1), ManualClock::new());
    let _ = shaper.reserve(1, Duration::ZERO).expect("the burst");
    let _ = shaper
        .reserve(1, Duration::from_secs(5))
        .expect("a later slot");
    let booked = shaper.state();
    let nothing = shaper
        .reserve(0, Duration::ZERO)
        .expect("cost 0 always fits");
    assert_eq!(nothing.delay(), Duration::ZERO);
    let receipt = nothing.into_receipt().expect("no delay");
    assert!(!receipt.is_charged());
    assert_eq!(receipt.cost(), 0);
    assert!(!shaper.refund(receipt));
    assert_eq!(shaper.state(), booked);
}

#[test]
fn a_cost_zero_reservation_converts_to_nothing_on_a_booked_schedule() {
    on_both_cells!(cost_zero_converts_to_nothing);
}

/// Near the end of `u64` time a free slot converts and its refund gives back
/// exactly its units (the next reservation at the same instant is free again,
/// the one after it is not); a slot whose `TAT` would pass `u64::MAX` is never
/// reserved (nothing to convert).
fn end_of_time<S: StateCell<GcraState>>(make: Make<S>) {
    let start = Nanos::new(u64::MAX - 1_000_000_000);
    let clock = ManualClock::starting_at(start);
    let shaper = make(policy(10, 2), clock.clone());
    let receipt = shaper
        .reserve(2, Duration::ZERO)
        .expect("fits before the end")
        .into_receipt()
        .expect("no delay");
    assert_eq!(receipt.cost(), 2);
    assert!(shaper.refund(receipt));
    assert_eq!(shaper.state().tat(), start, "gave back exactly its 200 ms");
    let again = shaper.reserve(2, Duration::ZERO).expect("free again");
    assert_eq!(again.delay(), Duration::ZERO);
    assert!(shaper.reserve(1, Duration::ZERO).is_err());
    clock.set(Nanos::new(u64::MAX - 50_000_000));
    let past_the_end = shaper.reserve(1, Duration::MAX);
    assert!(
        matches!(past_the_end, Err(ShapeError::Never { .. })),
        "{past_the_end:?}"
    );
}

#[test]
fn a_receipt_at_the_end_of_u64_time_gives_back_exactly_its_units() {
    on_both_cells!(end_of_time);
}

/// A receipt converted before a reset or a policy change gives nothing back after
/// it, whenever it was converted, and leaves the schedule alone.
fn voided_by_reset_or_policy<S: StateCell<GcraState>>(make: Make<S>) {
    // Converted before the policy change, refunded after it.
    let mut shaper = make(policy(10, 2), ManualClock::new());
    let receipt = shaper
        .reserve(2, ms(100))
        .expect("free")
        .into_receipt()
        .expect("now");
    shaper.set_policy(policy(1, 2));
    let booked = shaper.state();
    assert!(!shaper.refund(receipt));
    assert_eq!(shaper.state(), booked);
    // Reserved before the policy change, converted after it.
    let mut shaper = make(policy(10, 2), ManualClock::new());
    let reservation = shaper.reserve(1, ms(100)).expect("free");
    shaper.set_policy(policy(10, 3));
    let booked = shaper.state();
    assert!(!shaper.refund(reservation.into_receipt().expect("now")));
    assert_eq!(shaper.state(), booked);
    // Reserved before a reset, converted after it: the reset's schedule is kept.
    let shaper = make(policy(10, 1), ManualClock::new());
    let reservation = shaper.reserve(1, Duration::ZERO).expect("free");
    shaper.reset();
    let _ = shaper
        .reserve(1, Duration::ZERO)
        .expect("free after the reset");
    let booked = shaper.state();
    assert!(!shaper.refund(reservation.into_receipt().expect("now")));
    assert_eq!(shaper.state(), booked);
}

#[test]
fn a_receipt_from_before_a_reset_or_policy_change_gives_back_nothing() {
    on_both_cells!(voided_by_reset_or_policy);
}

/// A converted receipt is its own shaper's only: another shaper, lock-free or
/// locked, with the same policy, clock and schedule, gives nothing back for it.
#[test]
fn a_converted_receipt_is_refunded_only_by_its_own_shaper() {
    let clock = ManualClock::new();
    let p = policy(10, 2);
    let lock_free = Shaper::with_clock(p, clock.clone());
    let locked = Shaper::locked_with_clock(p, clock.clone());
    let other = Shaper::with_clock(p, clock.clone());
    let convert =
        |r: Result<Reservation, ShapeError>| r.expect("free").into_receipt().expect("now");
    let from_lock_free = convert(lock_free.reserve(1, Duration::ZERO));
    let from_locked = convert(locked.reserve(1, Duration::ZERO));
    let _ = other.reserve(1, Duration::ZERO).expect("free");
    let booked = other.state();
    assert!(
        !locked.refund(from_lock_free),
        "a lock-free receipt on the twin"
    );
    assert!(
        !lock_free.refund(from_locked),
        "a twin's receipt on the lock-free shaper"
    );
    assert_eq!((lock_free.state(), locked.state()), (booked, booked));
    let from_lock_free = convert(lock_free.reserve(1, Duration::ZERO));
    assert!(!other.refund(from_lock_free));
    assert_eq!(other.state(), booked);
    let from_locked = convert(locked.reserve(1, Duration::ZERO));
    assert!(locked.refund(from_locked), "its own shaper refunds it");
    assert_eq!(locked.state(), booked);
}

/// A reservation made at an explicit later instant than the clock, converted and
/// refunded at the clock's (earlier) reading, gives back its own units and no
/// more: the schedule below its instant stays; one made at an earlier instant
/// whose slot the clock has passed gives back nothing.
fn explicit_instants<S: StateCell<GcraState>>(make: Make<S>) {
    let shaper = make(policy(10, 3), ManualClock::new());
    let _ = shaper.reserve(1, Duration::ZERO).expect("free");
    let later = shaper
        .reserve_at(Nanos::from_secs(10), 2, Duration::ZERO)
        .expect("free at 10 s")
        .into_receipt()
        .expect("no delay");
    assert_eq!(shaper.state().tat(), Nanos::new(10_200_000_000));
    assert!(shaper.refund(later));
    assert_eq!(
        shaper.state().tat(),
        Nanos::from_secs(10),
        "200 ms back, no more"
    );

    let clock = ManualClock::starting_at(Nanos::from_secs(10));
    let shaper = make(policy(10, 3), clock);
    let earlier = shaper
        .reserve_at(Nanos::from_secs(5), 2, Duration::ZERO)
        .expect("free at 5 s")
        .into_receipt()
        .expect("no delay");
    let booked = shaper.state();
    assert!(
        !shaper.refund(earlier),
        "its booking ended before the clock"
    );
    assert_eq!(shaper.state(), booked);
}

#[test]
fn a_receipt_reserved_at_an_explicit_instant_gives_back_at_most_its_units() {
    on_both_cells!(explicit_instants);
}

/// 10 a second, burst 1 (`T` = `τ` = 100 ms), clock frozen at 0. A converted
/// receipt refunded after a later reservation was cancelled gives back nothing it
/// cannot prove its own; refunded while a later reservation waits, it gives back
/// nothing that reservation holds; two converted receipts refunded in either order
/// give back at most the burst, not below the clock.
fn later_reservations<S: StateCell<GcraState>>(make: Make<S>) {
    let max = Duration::from_secs(1);
    // A later reservation cancelled first.
    let shaper = make(policy(10, 1), ManualClock::new());
    let first = shaper
        .reserve(1, max)
        .expect("free")
        .into_receipt()
        .expect("now");
    let second = shaper
        .reserve(1, max)
        .expect("100 ms")
        .into_receipt()
        .expect_err("delayed");
    assert_eq!(shaper.cancel(second), 1);
    assert_eq!(shaper.state().tat(), Nanos::new(100_000_000));
    let _ = shaper.refund(first);
    assert!(shaper.state().tat() <= Nanos::new(100_000_000));
    let next = shaper.reserve(1, max).expect("fits");
    let expected_slot = shaper.state().tat().as_u64() - 100_000_000;
    assert_eq!(next.ready_at(), Nanos::new(expected_slot));
    // A later reservation still waiting: its slot (100 ms) stays handed out.
    let shaper = make(policy(10, 1), ManualClock::new());
    let first = shaper
        .reserve(1, max)
        .expect("free")
        .into_receipt()
        .expect("now");
    let waiter = shaper.reserve(1, max).expect("100 ms");
    assert_eq!(waiter.delay(), ms(100));
    let _ = shaper.refund(first);
    assert_eq!(
        shaper.reserve(1, max).expect("fits").delay(),
        ms(200),
        "100 ms handed out twice"
    );
    // Two converted receipts (burst 2), refunded in both orders.
    for reverse in [false, true] {
        let clock = ManualClock::starting_at(Nanos::from_secs(1));
        let shaper = make(policy(10, 2), clock);
        let a = shaper
            .reserve(1, max)
            .expect("free")
            .into_receipt()
            .expect("now");
        let b = shaper
            .reserve(1, max)
            .expect("free")
            .into_receipt()
            .expect("now");
        let (x, y) = if reverse { (b, a) } else { (a, b) };
        assert!(shaper.refund(x));
        let _ = shaper.refund(y);
        assert!(
            shaper.state().tat() >= Nanos::from_secs(1),
            "below the clock"
        );
        // Both come back, in either order: later first, that refund was of the
        // schedule's last booking and moved nobody, so it takes nothing from the
        // earlier receipt (session 45, "order"; before, the earlier gave back
        // nothing and one unit stayed spent). Never more than the burst.
        let free = 2;
        assert_eq!(
            shaper.reserve(free, Duration::ZERO).map(|r| r.delay()),
            Ok(Duration::ZERO)
        );
        assert!(
            shaper.reserve(1, Duration::ZERO).is_err(),
            "more than the burst free"
        );
    }
}

#[test]
fn refunds_after_later_reservations_give_back_no_slot_they_hold() {
    on_both_cells!(later_reservations);
}

/// What one thread did on a frozen clock.
#[derive(Default)]
struct Tally {
    /// Units reserved (immediate and delayed).
    taken: u64,
    /// Units cancellations gave back.
    cancelled: u64,
    /// Units of the converted receipts refunded.
    refunded: u64,
}

/// Four threads reserve 1 or 2 units, convert, and refund half their receipts and
/// cancel half their delayed reservations, on a clock frozen at 1 s. Nothing's slot
/// passes, so the booked schedule at the end is exactly the units taken less those
/// given back: at least `T·(taken − cancelled − refunded)` (no refund gave back
/// more than its receipt's units), at most `T·(taken − cancelled)`, and never past
/// `τ + max_delay`.
fn concurrent<S: StateCell<GcraState> + Send + Sync>(make: Make<S>) {
    const THREADS: u64 = 4;
    let start = Nanos::from_secs(1);
    let p = policy(1000, 4);
    let interval = p.interval_nanos();
    let max_delay = ms(20);
    for round in 0..20u64 {
        let shaper = make(p, ManualClock::starting_at(start));
        let tallies: Vec<Tally> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let shaper = &shaper;
                    s.spawn(move || {
                        let mut rng =
                            Rng((round * THREADS + t + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
                        let mut tally = Tally::default();
                        for _ in 0..200 {
                            let cost = 1 + rng.below(2) as u32;
                            let Ok(reservation) = shaper.reserve(cost, max_delay) else {
                                continue;
                            };
                            tally.taken += u64::from(cost);
                            match reservation.into_receipt() {
                                Ok(receipt) if rng.below(2) == 0 => {
                                    tally.refunded += u64::from(receipt.cost());
                                    let _ = shaper.refund(receipt);
                                }
                                Ok(_) => {}
                                Err(later) if rng.below(2) == 0 => {
                                    tally.cancelled += u64::from(shaper.cancel(later));
                                }
                                Err(_) => {}
                            }
                        }
                        tally
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("no panic"))
                .collect()
        });
        let taken: u64 = tallies.iter().map(|t| t.taken).sum();
        let cancelled: u64 = tallies.iter().map(|t| t.cancelled).sum();
        let refunded: u64 = tallies.iter().map(|t| t.refunded).sum();
        let booked = shaper.state().tat().as_u64().saturating_sub(start.as_u64());
        let ctx = format!("round {round}: taken {taken}, cancelled {cancelled}, refunded {refunded}, booked {booked} ns");
        assert!(cancelled + refunded <= taken, "{ctx}");
        assert!(
            booked >= (taken - cancelled - refunded) * interval,
            "{ctx}: a refund gave back more than it took"
        );
        assert!(
            booked <= (taken - cancelled) * interval,
            "{ctx}: units appeared"
        );
        assert!(
            booked <= p.burst() * interval + 20_000_000,
            "{ctx}: past τ + max_delay"
        );
    }
}

#[test]
fn concurrent_conversions_refunds_and_cancellations_never_give_back_more_than_taken() {
    on_both_cells!(concurrent);
}
