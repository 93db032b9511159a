//! An adversarial review of the window algorithms on one word, the shaper and the
//! waits: each test is an attack; those that failed before a fix name it.
#![cfg(not(loom))]

use floodgate::{ManualClock, Nanos, Policy, RateLimiter, SlidingWindow};

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
