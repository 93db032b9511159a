//! Hostile inputs to the public API that earlier reviews left out: readings at the
//! end of the clock (`u64::MAX` ns, the year 2554 on the Unix-anchored clocks).

use std::cell::Cell;
use std::time::Duration;

use floodgate::{
    Clock, Jitter, KeyedBuilder, ManualClock, Nanos, Policy, RateLimiter, SlidingWindow, Wait,
    WaitError,
};

/// The longest window a policy may have, so that the window after the one holding
/// `u64::MAX` ns starts past the clock's range (at 2^64 ns).
fn last_window_policy() -> Policy {
    Policy::new(1, Duration::from_nanos(1 << 62)).unwrap()
}

/// A sleep on `clock` that fails the test once it has slept `most` times: a wait
/// that never ends would otherwise hang the test.
fn bounded_sleep(clock: &ManualClock, most: u32) -> impl FnMut(Duration) + '_ {
    let slept = Cell::new(0);
    move |d| {
        slept.set(slept.get() + 1);
        assert!(
            slept.get() <= most,
            "the wait never ends: slept {d:?} again"
        );
        clock.advance(d);
    }
}

/// In the last window a clock can read, a window limiter's denial says "retry in
/// 1 ns" — the next window starts at 2^64 ns, which no clock reads: a clock stops at
/// `u64::MAX` (`ManualClock` saturates there). `wait` slept 1 ns, was denied at the
/// same reading and slept again, for ever (blocking and async, plain and keyed). It
/// must end with `WaitError::Never`, as GCRA's wait does at the end of time.
/// Mutation that fails it: sleeping on any `Some` retry in `waiting::step`.
#[test]
fn a_wait_past_the_clocks_last_reading_is_never_not_a_loop() {
    let policy = last_window_policy();
    let start = Nanos::new(u64::MAX - 10);

    let clock = ManualClock::starting_at(start);
    let fixed = RateLimiter::fixed_window_with_clock(policy, clock.clone()).unwrap();
    assert_eq!(
        fixed.wait_with(1, Jitter::NONE, bounded_sleep(&clock, 4)),
        Ok(Duration::ZERO)
    );
    let r = fixed.wait_with(1, Jitter::NONE, bounded_sleep(&clock, 4));
    assert_eq!(r, Err(WaitError::Never { cost: 1 }), "fixed window");
    // At once, nothing slept; the denial itself is unchanged: the window's end,
    // 2^64 ns, is 11 ns away.
    assert_eq!(clock.now(), start);
    assert_eq!(fixed.peek(1).retry_after(), Some(Duration::from_nanos(11)));

    let clock = ManualClock::starting_at(start);
    let sliding = RateLimiter::with_clock(SlidingWindow::new(policy).unwrap(), clock.clone());
    assert!(sliding.check().is_allowed());
    let r = sliding.wait_with(1, Jitter::NONE, bounded_sleep(&clock, 4));
    assert_eq!(r, Err(WaitError::Never { cost: 1 }), "sliding window");

    // Jitter does not move the verdict: the wait itself is what cannot end.
    let clock = ManualClock::starting_at(start);
    let keyed = KeyedBuilder::new(floodgate::FixedWindow::new(policy).unwrap())
        .clock(clock.clone())
        .build::<u64>()
        .unwrap();
    assert!(keyed.check(&7).is_allowed());
    let jitter = Jitter::up_to(Duration::from_nanos(3));
    let r = keyed.wait_key_with(&7, 1, jitter, bounded_sleep(&clock, 4));
    assert_eq!(r, Err(WaitError::Never { cost: 1 }), "keyed fixed window");

    let clock = ManualClock::starting_at(start);
    let fixed = RateLimiter::fixed_window_with_clock(policy, clock.clone()).unwrap();
    assert!(fixed.check().is_allowed());
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut sleep = bounded_sleep(&clock, 4);
    let r = rt.block_on(fixed.until_ready_with(1, Jitter::NONE, |d| {
        sleep(d);
        std::future::ready(())
    }));
    assert_eq!(r, Err(WaitError::Never { cost: 1 }), "async fixed window");
}

/// The bound is the clock's last reading, not earlier: a window that starts at
/// `u64::MAX` ns itself is waited for and admits. Mutation that fails it: treating
/// a wait that ends exactly at `u64::MAX` as never (`checked_add(w + 1)`).
#[test]
fn a_wait_that_ends_at_the_clocks_last_reading_still_admits() {
    // 1 per (2^64 − 1) / 5 ns: the sixth window starts at u64::MAX ns exactly.
    let period = u64::MAX / 5;
    let policy = Policy::new(1, Duration::from_nanos(period)).unwrap();
    let clock = ManualClock::starting_at(Nanos::new(u64::MAX - 5));
    let fixed = RateLimiter::fixed_window_with_clock(policy, clock.clone()).unwrap();
    assert!(fixed.check().is_allowed());
    let r = fixed.wait_with(1, Jitter::NONE, bounded_sleep(&clock, 4));
    assert_eq!(r, Ok(Duration::from_nanos(5)));
    assert_eq!(clock.now(), Nanos::new(u64::MAX));
}
