//! The boundary spike: limit 10 per minute, 10 requests at 0:59 and 10 more at 1:01.
//! Each algorithm admits what its formula says; the expected counts are worked out by
//! hand in the comments.
#![cfg(not(loom))]

use floodgate::reference::{ExactFixedWindow, ExactGcra, ExactSlidingLog, ExactSlidingWindow};
use floodgate::{
    FixedWindow, Gcra, ManualClock, Nanos, Policy, RateLimiter, SlidingLog, SlidingWindow,
};
use std::time::Duration;

const S: u64 = 1_000_000_000;

/// Admitted at 0:59 and at 1:01, ten single requests each, through `check`.
fn spike(mut check: impl FnMut() -> bool, clock: &ManualClock) -> (usize, usize) {
    clock.set(Nanos::new(59 * S));
    let first = (0..10).filter(|_| check()).count();
    clock.set(Nanos::new(61 * S));
    let second = (0..10).filter(|_| check()).count();
    (first, second)
}

fn per_minute() -> Policy {
    Policy::per_minute(10).unwrap()
}

#[test]
fn fixed_window_admits_twenty() {
    // Windows [0:00, 1:00) and [1:00, 2:00): 10 fit in each, so 10 + 10 = 20 within two
    // seconds — the spike the fixed window is known for.
    let clock = ManualClock::new();
    let l = RateLimiter::with_clock(FixedWindow::new(per_minute()).unwrap(), clock.clone());
    assert_eq!(spike(|| l.check().is_allowed(), &clock), (10, 10));
    let mut m = ExactFixedWindow::new(10, 60 * S).unwrap();
    let mut now = 59 * S;
    let first = (0..10).filter(|_| m.check(now, 1).is_allowed()).count();
    now = 61 * S;
    let second = (0..10).filter(|_| m.check(now, 1).is_allowed()).count();
    assert_eq!((first, second), (10, 10));
}

#[test]
fn sliding_log_admits_ten() {
    // At 1:01 the ten units of 0:59 count until 1:59 (59 + 60 > 61): nothing fits.
    let clock = ManualClock::new();
    let l = SlidingLog::with_clock(per_minute(), clock.clone());
    assert_eq!(spike(|| l.check().is_allowed(), &clock), (10, 0));
    // The first of them leaves at 1:59, 58 s after 1:01.
    assert_eq!(l.check().retry_after(), Some(Duration::from_secs(58)));
    let mut m = ExactSlidingLog::new(10, 60 * S).unwrap();
    assert!(m.check(59 * S, 10).is_allowed());
    assert_eq!(
        m.check(61 * S, 1).retry_after(),
        Some(Duration::from_secs(58))
    );
}

#[test]
fn sliding_window_counter_admits_eleven() {
    // 0:59 is in window 0 (fresh): 10 fit, cur = 10.
    // 1:01 is in window 1, e = 1 s: prev = 10 weighs ⌊10·(60 − 1)/60⌋ = ⌊9.83⌋ = 9.
    // The first request: 9 + 0 + 1 = 10 ≤ 10, admitted (cur = 1); the next: 9 + 1 + 1 = 11.
    // So 10 + 1 = 11.
    let clock = ManualClock::new();
    let l = RateLimiter::with_clock(SlidingWindow::new(per_minute()).unwrap(), clock.clone());
    assert_eq!(spike(|| l.check().is_allowed(), &clock), (10, 1));
    // One more fits once ⌊10·(60 − e)/60⌋ ≤ 8 ⇔ 10·(60 s − e) < 540 s ⇔ e > 6 s: 5 s + 1 ns.
    assert_eq!(
        l.check().retry_after(),
        Some(Duration::from_secs(5) + Duration::from_nanos(1))
    );
    let mut m = ExactSlidingWindow::new(10, 60 * S).unwrap();
    assert!(m.check(59 * S, 10).is_allowed());
    assert!(m.check(61 * S, 1).is_allowed());
    assert!(!m.check(61 * S, 1).is_allowed());
}

#[test]
fn gcra_admits_ten() {
    // T = 60 s / 10 = 6 s, B = 10. At 0:59 a fresh key takes its burst of 10: TAT = 0:59 +
    // 10·6 s = 1:59. At 1:01 one more needs TAT + 6 s = 2:05 ≤ 1:01 + 60 s = 2:01: no.
    // Two seconds restore a third of a unit: 10 + 0 = 10.
    let clock = ManualClock::new();
    let l = RateLimiter::with_clock(Gcra::new(per_minute()), clock.clone());
    assert_eq!(spike(|| l.check().is_allowed(), &clock), (10, 0));
    // The next unit at 2:05 − 60 s = 1:05, 4 s after 1:01.
    assert_eq!(l.check().retry_after(), Some(Duration::from_secs(4)));
    let mut m = ExactGcra::new(10, 60 * S, 10).unwrap();
    assert!(m.check(59 * S, 10).is_allowed());
    assert_eq!(
        m.check(61 * S, 1).retry_after(),
        Some(Duration::from_secs(4))
    );
}
