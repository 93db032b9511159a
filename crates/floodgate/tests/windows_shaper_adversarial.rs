//! An adversarial review of the window algorithms on one word, the shaper and the
//! waits: each test is an attack; those that failed before a fix name it.
#![cfg(not(loom))]

mod common;
use common::conforms;

use floodgate::{FixedWindow, ManualClock, Nanos, Policy, RateLimiter, SlidingWindow};
use std::time::Duration;

const S: u64 = 1_000_000_000;

/// A refund that empties the sliding counter's `cur` while `prev` is 0 left a state
/// whose counters were both 0, which `view` read as *fresh* (window-less). A reading
/// behind the stored window (another thread's earlier clock reading) was then judged
/// in its own, older window with `prev = 0`, although the state had already forgotten
/// that window's predecessor: the state moved back a window and admitted units that
/// the weighted estimate forbids there. The state must stay in its window.
#[test]
fn a_refund_that_empties_the_sliding_counter_keeps_its_window() {
    let sw = SlidingWindow::new(Policy::per_second(10).unwrap()).unwrap();
    let limiter = RateLimiter::with_clock(sw, ManualClock::new());
    // Window 5 full.
    assert!(limiter
        .check_n_at(Nanos::new(5 * S + S / 2), 10)
        .is_allowed());
    // Another request at 7.1 s moves the state to window 7 (window 5 is forgotten:
    // two windows old) and is refunded.
    let (d, receipt) = limiter.charge_at(Nanos::new(7 * S + S / 10), 1);
    assert!(d.is_allowed());
    assert!(limiter.refund(receipt));
    assert_eq!(sw.fields(limiter.state()).0, 7);
    // A thread whose reading (6.05 s) was taken before: judged at the start of window
    // 7 (nothing weighs there), it is admitted and must count in window 7.
    assert!(limiter
        .check_n_at(Nanos::new(6 * S + S / 20), 10)
        .is_allowed());
    assert_eq!(
        sw.fields(limiter.state()),
        (7, 0, 10),
        "the state moved back to an older window"
    );
    // So window 7 is full at 7.1 s. Counted in window 6 instead, its 10 units would
    // weigh only ⌊10·0.9⌋ = 9 there and one more would pass.
    assert!(!limiter
        .check_n_at(Nanos::new(7 * S + S / 10), 1)
        .is_allowed());
}

/// The same through the index wrap: a refund that empties a state whose window index
/// is `≡ 0 (mod 2^k)` produced the all-zero word, which is the fresh state, so a
/// reading behind it moved the state back a window. With the largest limit the
/// sliding counter's index has `k = 4` bits and periods of 45.6 days: the windows
/// `≡ 0 (mod 16)` are a 45-day stretch every two years.
#[test]
fn a_refund_at_a_window_index_that_wraps_to_zero_keeps_its_window() {
    let limit = (1u64 << 30) - 2;
    let p = floodgate::YEAR_NANOS / 8;
    let sw = SlidingWindow::new(Policy::new(limit, Duration::from_nanos(p)).unwrap()).unwrap();
    let cost = limit as u32;
    let limiter = RateLimiter::with_clock(sw, ManualClock::new());
    // Window 14 full; window 16 (index 0 mod 16) charged 2 and refunded.
    assert!(limiter
        .check_n_at(Nanos::new(14 * p + 1), cost)
        .is_allowed());
    let (d, receipt) = limiter.charge_at(Nanos::new(16 * p + 1), 2);
    assert!(d.is_allowed());
    assert!(limiter.refund(receipt));
    // A reading from window 15, taken before: judged at the start of window 16 (the
    // refund may keep one unit there rather than lose the window).
    assert!(limiter
        .check_n_at(Nanos::new(15 * p + 1), cost - 1)
        .is_allowed());
    assert_eq!(
        sw.fields(limiter.state()).0,
        0,
        "the state moved back to an older window"
    );
    // Counted in window 15 instead, window 14's units would be forgotten there and
    // these would weigh only ⌊(L − 1)·(P − 1)/P⌋ = L − 2 in window 16: two more pass.
    assert!(!limiter.check_n_at(Nanos::new(16 * p + 1), 2).is_allowed());
}

/// The fixed window's twin: its index wraps to 0 within `u64` only for the widest
/// counts (`k = 2`, `L ≥ 2^61 − 1`, windows 4, 8, … of about 2^61 ns).
#[test]
fn a_fixed_window_refund_at_a_wrapped_index_keeps_its_window() {
    let p = 1u64 << 61;
    let fw = FixedWindow::new(Policy::new(p, Duration::from_nanos(p)).unwrap()).unwrap();
    assert_eq!(fw.count_bits(), 62);
    let limiter = RateLimiter::with_clock(fw, ManualClock::new());
    assert!(limiter.check_n_at(Nanos::new(3 * p + 5), 7).is_allowed());
    let (d, receipt) = limiter.charge_at(Nanos::new(4 * p + 5), 2);
    assert!(d.is_allowed());
    assert!(limiter.refund(receipt));
    // A reading from window 3, taken before: judged in window 4 (ends in 2P − 6 ns),
    // not in window 3, whose count of 7 the state no longer holds (counted there,
    // window 3 could take another L − 1 units).
    let d = limiter.check_n_at(Nanos::new(3 * p + 6), 1);
    assert!(d.is_allowed());
    assert_eq!(d.reset_after_nanos(), 2 * p - 6);
    assert_eq!(
        fw.window_of(limiter.state()),
        0,
        "the state moved back to an older window"
    );
    assert!(limiter.peek_at(Nanos::new(4 * p + 7), 0).remaining() < p);
}

/// Three waiters book slots 0, 1 s and 2 s on a burst of 1 at 1 per second; the middle
/// one's wait is dropped (its booking refunded). A fourth waiter must not be handed
/// the third's slot.
#[test]
fn a_dropped_booking_never_hands_out_a_later_bookings_slot() {
    let policy = Policy::per_second(1).unwrap().with_burst(1).unwrap();
    let limiter = RateLimiter::gcra_with_clock(policy, ManualClock::new());
    let t0 = Nanos::ZERO;
    let book = || {
        let (d, delay, receipt) = limiter.book_at(t0, 1).unwrap();
        assert!(d.is_allowed());
        (t0.saturating_add(delay), receipt)
    };
    let (x, _x) = book();
    let (y, y_receipt) = book();
    let (z, _z) = book();
    assert_eq!((x, y, z), (t0, Nanos::from_secs(1), Nanos::from_secs(2)));
    let _ = limiter.refund(y_receipt);
    let (w, _w) = book();
    conforms(policy, &[(x, 1), (z, 1), (w, 1)]).unwrap();
}

mod schedules {
    //! Random reservations, bookings and charges on one shaper, some of them
    //! cancelled or refunded, on a clock that only moves forward: the instants at
    //! which the live ones proceed always conform to the shaper's GCRA.
    use super::conforms;
    use floodgate::{Clock, ManualClock, Nanos, Policy, Receipt, Reservation, Shaper};
    use proptest::prelude::*;
    use std::time::Duration;

    const T: u64 = 1_000;

    #[derive(Clone, Debug)]
    enum Op {
        Advance(u64),
        Reserve {
            cost: u32,
            max_delay: u64,
        },
        Book(u32),
        Charge(u32),
        /// Cancel or refund a live grant (index modulo their number).
        GiveBack(usize),
    }

    fn op(burst: u32) -> impl Strategy<Value = Op> {
        prop_oneof![
            2 => (0..3 * T).prop_map(Op::Advance),
            3 => (1..=burst, 0..6 * T).prop_map(|(cost, max_delay)| Op::Reserve { cost, max_delay }),
            3 => (1..=burst).prop_map(Op::Book),
            2 => (1..=burst).prop_map(Op::Charge),
            3 => any::<usize>().prop_map(Op::GiveBack),
        ]
    }

    /// Reservations and cancellations only (the `x/time/rate` rule).
    fn reservation(burst: u32) -> impl Strategy<Value = Op> {
        prop_oneof![
            2 => (0..3 * T).prop_map(Op::Advance),
            4 => (1..=burst, 0..6 * T).prop_map(|(cost, max_delay)| Op::Reserve { cost, max_delay }),
            3 => any::<usize>().prop_map(Op::GiveBack),
        ]
    }

    enum Held {
        Reserved(Reservation),
        Receipt(Receipt),
    }

    fn run(burst: u32, ops: &[Op]) -> Result<(), String> {
        let policy = Policy::new(1, Duration::from_nanos(T))
            .unwrap()
            .with_burst(u64::from(burst))
            .unwrap();
        let clock = ManualClock::new();
        let shaper = Shaper::with_clock(policy, clock.clone());
        // (proceeds at, cost, what gives it back)
        let mut live: Vec<(Nanos, u32, Held)> = Vec::new();
        for op in ops {
            let now = clock.now();
            match *op {
                Op::Advance(d) => {
                    clock.advance(Duration::from_nanos(d));
                }
                Op::Reserve { cost, max_delay } => {
                    if let Ok(r) = shaper.reserve_at(now, cost, Duration::from_nanos(max_delay)) {
                        live.push((r.ready_at(), cost, Held::Reserved(r)));
                    }
                }
                Op::Book(cost) => {
                    let (d, delay, receipt) = shaper.book_at(now, cost);
                    if d.is_allowed() {
                        live.push((now.saturating_add(delay), cost, Held::Receipt(receipt)));
                    }
                }
                Op::Charge(cost) => {
                    let (d, receipt) = shaper.charge_at(now, cost);
                    if d.is_allowed() {
                        live.push((now, cost, Held::Receipt(receipt)));
                    }
                }
                Op::GiveBack(pick) => {
                    if !live.is_empty() {
                        let (_, _, held) = live.remove(pick % live.len());
                        match held {
                            Held::Reserved(r) => {
                                let _ = shaper.cancel_at(now, r);
                            }
                            Held::Receipt(r) => {
                                let _ = shaper.refund(r);
                            }
                        }
                    }
                }
            }
            let grants: Vec<(Nanos, u32)> = live.iter().map(|&(at, c, _)| (at, c)).collect();
            conforms(policy, &grants)?;
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(crate::common::cases(2_000))]

        #[test]
        fn live_grants_conform_whatever_is_given_back(
            burst in 1u32..4,
            ops in proptest::collection::vec(op(3), 1..30),
        ) {
            let ops: Vec<Op> = ops.into_iter().map(|o| match o {
                Op::Reserve { cost, max_delay } => Op::Reserve { cost: cost.min(burst), max_delay },
                Op::Book(c) => Op::Book(c.min(burst)),
                Op::Charge(c) => Op::Charge(c.min(burst)),
                o => o,
            }).collect();
            if let Err(e) = run(burst, &ops) {
                prop_assert!(false, "{}", e);
            }
        }

        #[test]
        fn live_reservations_conform_whatever_is_cancelled(
            burst in 1u32..4,
            ops in proptest::collection::vec(reservation(3), 1..30),
        ) {
            let ops: Vec<Op> = ops.into_iter().map(|o| match o {
                Op::Reserve { cost, max_delay } => Op::Reserve { cost: cost.min(burst), max_delay },
                o => o,
            }).collect();
            if let Err(e) = run(burst, &ops) {
                prop_assert!(false, "{}", e);
            }
        }
    }
}

/// The keyed reservations behind the HTTP layer's per-key queue: the middle of three
/// queued requests goes away (its receipt refunded); a fourth must not be handed the
/// third's slot.
#[test]
fn a_refunded_keyed_reservation_never_hands_out_a_later_ones_slot() {
    let policy = Policy::per_second(4).unwrap().with_burst(1).unwrap();
    let keyed = floodgate::KeyedBuilder::new(floodgate::Gcra::new(policy))
        .clock(ManualClock::new())
        .build::<String>()
        .unwrap();
    let max = Duration::from_secs(1);
    let mut slots = Vec::new();
    let mut receipts = Vec::new();
    for _ in 0..3 {
        let (_, delay, receipt) = keyed.reserve("alice", 1, max).unwrap();
        slots.push(Nanos::ZERO.saturating_add(delay));
        receipts.push(receipt);
    }
    let middle = receipts.remove(1);
    slots.remove(1);
    let _ = keyed.refund("alice", middle);
    let (_, delay, _fourth) = keyed.reserve("alice", 1, max).unwrap();
    slots.push(Nanos::ZERO.saturating_add(delay));
    let grants: Vec<(Nanos, u32)> = slots.iter().map(|&s| (s, 1)).collect();
    conforms(policy, &grants).unwrap();
}

/// Extreme inputs never panic (debug builds check overflow): `Duration::MAX` delays,
/// `u32::MAX` costs, readings at both ends of `u64`, the widest policies; a cost above
/// the burst is "never", and what is refused consumes nothing.
#[test]
fn extreme_inputs_never_panic_on_the_shaper_and_the_windows() {
    use floodgate::{Algorithm, Jitter, ShapeError, Shaper};
    let span = floodgate::MAX_SPAN_NANOS;
    let policies = [
        Policy::new(1, Duration::from_nanos(1)).unwrap(),
        Policy::new(1, Duration::from_nanos(span)).unwrap(),
        Policy::new(span, Duration::from_nanos(span)).unwrap(),
        Policy::per_second(3).unwrap().with_burst(2).unwrap(),
    ];
    let times = [
        0,
        1,
        span,
        u64::MAX / 2,
        u64::MAX - span,
        u64::MAX - 1,
        u64::MAX,
    ];
    let delays = [Duration::ZERO, Duration::from_nanos(1), Duration::MAX];
    for policy in policies {
        let shaper = Shaper::with_clock(policy, ManualClock::new());
        let burst = u32::try_from(policy.burst()).unwrap_or(u32::MAX);
        for &t in &times {
            let now = Nanos::new(t);
            for &max_delay in &delays {
                for cost in [0, 1, burst, u32::MAX] {
                    match shaper.reserve_at(now, cost, max_delay) {
                        Ok(r) => {
                            assert!(r.ready_at() >= now);
                            let _ = r.delay();
                            let _ = shaper.cancel_at(now, r);
                        }
                        Err(ShapeError::Never { .. }) => {}
                        Err(ShapeError::TooLong { retry_after }) => assert!(!retry_after.is_zero()),
                        Err(e) => panic!("{e}"),
                    }
                    if u64::from(cost) > policy.burst() {
                        assert!(matches!(
                            shaper.reserve_at(now, cost, Duration::MAX),
                            Err(ShapeError::Never { .. })
                        ));
                    }
                    let (_, delay, receipt) = shaper.book_at(now, cost);
                    let _ = now.saturating_add(delay);
                    let _ = shaper.refund(receipt);
                    let (_, receipt) = shaper.charge_at(now, cost);
                    let _ = shaper.refund(receipt);
                }
            }
        }
        if let Ok(fw) = FixedWindow::new(policy) {
            let limiter = RateLimiter::with_clock(fw, ManualClock::new());
            for &t in times.iter().chain(times.iter().rev()) {
                for cost in [0, 1, u32::MAX] {
                    let (_, receipt) = limiter.charge_at(Nanos::new(t), cost);
                    let _ = limiter.peek_at(Nanos::new(t), cost);
                    let _ = limiter.refund(receipt);
                    let _ = fw.is_idle(limiter.state(), Nanos::new(t));
                }
            }
        }
        if let Ok(sw) = SlidingWindow::new(policy) {
            let limiter = RateLimiter::with_clock(sw, ManualClock::new());
            for &t in times.iter().chain(times.iter().rev()) {
                for cost in [0, 1, u32::MAX] {
                    let (_, receipt) = limiter.charge_at(Nanos::new(t), cost);
                    let _ = limiter.peek_at(Nanos::new(t), cost);
                    let _ = limiter.refund(receipt);
                }
            }
        }
    }
    let jitter = Jitter::up_to(Duration::MAX);
    assert_eq!(jitter.add_to(Duration::MAX, u64::MAX), Duration::MAX);
    assert!(jitter.add_to(Duration::from_secs(1), 0) >= Duration::from_secs(1));
}
