//! An adversarial review of the window algorithms on one word, the shaper and the
//! waits: each test is an attack; those that failed before a fix name it.
#![cfg(not(loom))]

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
