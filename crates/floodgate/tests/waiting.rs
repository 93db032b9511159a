//! Waiting for every direct limiter: bookings for GCRA (first come, first served,
//! given back when an async wait is dropped), check-sleep-check for the windows and
//! the log, jitter that only adds — under a manual clock or Tokio's paused time.
#![cfg(not(loom))]

use floodgate::{
    Clock, FixedWindow, Gcra, Jitter, Limit, ManualClock, Nanos, Policy, RateLimiter, Shaper,
    SlidingLog, SlidingWindow, Wait, WaitError,
};
use proptest::prelude::*;
use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

const MS: Duration = Duration::from_millis(1);

fn clock() -> ManualClock {
    ManualClock::starting_at(Nanos::from_secs(1_000))
}

/// Waits for `cost` on `limit` with a sleep that advances `clock`; returns the
/// sleeps it asked for.
fn waits(
    limit: &dyn Limit,
    clock: &ManualClock,
    cost: u32,
) -> (Result<Duration, WaitError>, Vec<Duration>) {
    let mut sleeps = Vec::new();
    let r = limit.wait_with(cost, Jitter::NONE, |d| {
        sleeps.push(d);
        clock.advance(d);
    });
    (r, sleeps)
}

#[test]
fn gcra_waits_by_booking_slots_in_order() {
    let c = clock();
    let policy = Policy::per_second(10).unwrap().with_burst(2).unwrap();
    let limiter = RateLimiter::with_clock(Gcra::new(policy), c.clone());
    // Three bookings at the same instant: slots at 0, 0 and 100 ms, in call order.
    let now = c.now();
    let slots: Vec<Duration> = (0..4).map(|_| limiter.book_at(now, 1).unwrap().1).collect();
    assert_eq!(slots, [Duration::ZERO, Duration::ZERO, 100 * MS, 200 * MS]);
    // A waiter sleeps once, to its slot, and never checks again.
    let (r, sleeps) = waits(&limiter, &c, 1);
    assert_eq!(r, Ok(300 * MS));
    assert_eq!(sleeps, [300 * MS]);
    assert_eq!(waits(&limiter, &c, 3).0, Err(WaitError::Never { cost: 3 }));
}

#[test]
fn shapers_wait_by_booking_too() {
    let c = clock();
    let policy = Policy::per_second(4).unwrap().with_burst(1).unwrap();
    let shaper = Shaper::with_clock(policy, c.clone());
    let twin = Shaper::locked_with_clock(policy, c.clone());
    for limit in [&shaper as &dyn Limit, &twin] {
        assert_eq!(waits(limit, &c, 1).0, Ok(Duration::ZERO));
        let (r, sleeps) = waits(limit, &c, 1);
        // The clock moved 0 since: the next slot is 250 ms away.
        assert!(r.is_ok());
        assert_eq!(sleeps.len(), 1);
        assert_eq!(waits(limit, &c, 2).0, Err(WaitError::Never { cost: 2 }));
    }
}

#[test]
fn windows_and_the_log_wait_by_checking_again() {
    let c = clock();
    let policy = Policy::new(2, Duration::from_secs(1)).unwrap();
    let fixed = RateLimiter::with_clock(FixedWindow::new(policy).unwrap(), c.clone());
    let sliding = RateLimiter::with_clock(SlidingWindow::new(policy).unwrap(), c.clone());
    let log = SlidingLog::with_clock(policy, c.clone());
    let twin = RateLimiter::locked_with_clock(FixedWindow::new(policy).unwrap(), c.clone());
    for limit in [&fixed as &dyn Limit, &sliding, &log, &twin] {
        assert!(limit.check_n(2).is_allowed());
        let retry = limit.peek(1).retry_after().unwrap();
        let (r, sleeps) = waits(limit, &c, 1);
        assert!(r.is_ok());
        // The first sleep is the denial's retry_after; each later one too.
        assert_eq!(sleeps[0], retry);
        assert_eq!(r.unwrap(), sleeps.iter().sum::<Duration>());
        assert_eq!(waits(limit, &c, 3).0, Err(WaitError::Never { cost: 3 }));
        // Another request takes the freed unit between the waiter's sleeps: the
        // waiter sleeps again (nothing is held while it sleeps).
        assert!(limit.check_n(limit.peek(0).remaining() as u32).is_allowed());
        let mut stolen = false;
        let mut sleeps = 0;
        let r = limit.wait_with(1, Jitter::NONE, |d| {
            c.advance(d);
            sleeps += 1;
            if !stolen {
                stolen = true;
                let free = limit.peek(0).remaining() as u32;
                assert!(limit.check_n(free).is_allowed());
            }
        });
        assert!(r.is_ok());
        assert!(sleeps >= 2);
    }
}

/// Polls `f` once with a waker that does nothing.
fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(Waker::noop()))
}

#[test]
fn a_dropped_async_wait_gives_its_booking_back() {
    let c = clock();
    let policy = Policy::per_second(10).unwrap().with_burst(1).unwrap();
    let limiter = RateLimiter::with_clock(Gcra::new(policy), c.clone());
    let shaper = Shaper::with_clock(policy, c.clone());
    for limit in [&limiter as &(dyn Limit + Sync), &shaper] {
        assert!(limit.check().is_allowed());
        let before = limit.peek(1);
        {
            let wait =
                pin!(limit.until_ready_with(1, Jitter::NONE, |_| std::future::pending::<()>()));
            assert!(poll_once(wait).is_pending());
            // Booked: the next slot moved.
            assert_ne!(limit.peek(1).retry_after(), before.retry_after());
        }
        // Dropped before its slot: the booking came back whole.
        assert_eq!(limit.peek(1), before);
        // A wait whose sleep completes keeps its units.
        let wait = pin!(limit.until_ready_with(1, Jitter::NONE, |d| {
            c.advance(d);
            std::future::ready(())
        }));
        assert!(matches!(poll_once(wait), Poll::Ready(Ok(_))));
        assert!(!limit.peek(1).is_allowed());
        c.advance(Duration::from_secs(1));
    }
}

/// A clock that reads Tokio's (pausable) time.
struct TokioClock(tokio::time::Instant);

impl Clock for TokioClock {
    fn now(&self) -> Nanos {
        Nanos::from_duration(self.0.elapsed()).saturating_add(Duration::from_secs(1_000))
    }
}

#[test]
fn async_waits_under_tokio_paused_time() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let policy = Policy::per_second(10).unwrap().with_burst(1).unwrap();
        let limiter = Arc::new(RateLimiter::with_clock(
            Gcra::new(policy),
            TokioClock(tokio::time::Instant::now()),
        ));
        let window = Arc::new(RateLimiter::with_clock(
            FixedWindow::new(policy).unwrap(),
            TokioClock(tokio::time::Instant::now()),
        ));
        let start = tokio::time::Instant::now();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..5u32 {
            let (limiter, order) = (Arc::clone(&limiter), Arc::clone(&order));
            tasks.push(tokio::spawn(async move {
                let waited = limiter
                    .until_ready_with(1, Jitter::NONE, tokio::time::sleep)
                    .await
                    .unwrap();
                order.lock().unwrap().push(i);
                waited
            }));
        }
        let mut waited = Vec::new();
        for t in tasks {
            waited.push(t.await.unwrap());
        }
        // First come, first served: slots 100 ms apart in spawn order.
        assert_eq!(waited, [0, 100, 200, 300, 400].map(|ms| ms * MS));
        assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4]);
        assert_eq!(start.elapsed(), 400 * MS);
        // A window: 10 per second; the 11th waits for the next window.
        assert!(window.check_n(10).is_allowed());
        let waited = window
            .until_ready_with(1, Jitter::NONE, tokio::time::sleep)
            .await
            .unwrap();
        assert!(waited > Duration::ZERO && waited <= Duration::from_secs(1));
    });
}

proptest! {
    /// Jitter only adds, and never more than its bound.
    #[test]
    fn jitter_stays_within_its_bounds(wait_ns in any::<u64>(), max_ns in 0u64..u64::MAX / 2, random in any::<u64>()) {
        let wait = Duration::from_nanos(wait_ns);
        let max = Duration::from_nanos(max_ns);
        let slept = Jitter::up_to(max).add_to(wait, random);
        prop_assert!(slept >= wait);
        prop_assert!(slept <= wait + max);
        prop_assert_eq!(Jitter::NONE.add_to(wait, random), wait);
    }

    /// Every jittered sleep of a wait is at least what the limiter asked for (the
    /// denial's `retry_after`) and at most that plus the bound.
    #[test]
    fn jittered_waits_never_sleep_less_than_asked(max_ms in 0u64..50, limit in 1u64..4, rounds in 1usize..6) {
        let c = clock();
        let policy = Policy::new(limit, Duration::from_millis(100)).unwrap();
        let fixed = RateLimiter::with_clock(FixedWindow::new(policy).unwrap(), c.clone());
        let log = SlidingLog::with_clock(policy, c.clone());
        let jitter = Jitter::up_to(Duration::from_millis(max_ms));
        for limit_ref in [&fixed as &dyn Limit, &log] {
            for _ in 0..rounds {
                let mut ok = true;
                let r = limit_ref.wait_with(1, jitter, |d| {
                    // The waiter has just been denied at this reading.
                    let asked = limit_ref.peek(1).retry_after().unwrap();
                    ok &= asked <= d && d <= asked + jitter.max();
                    c.advance(d);
                });
                prop_assert!(r.is_ok() && ok);
            }
        }
    }
}
