//! loom models of runtime changes on direct limiters: a reset racing a refund never
//! lets the refund give back a unit charged after the reset, and a policy change on
//! the sliding log racing checks never admits beyond either policy's bound.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=4 cargo test -p floodgate --release --test loom_runtime`
#![cfg(loom)]

mod loom_seen;
use loom_seen::Seen;

use floodgate::{
    Algorithm, FixedWindow, Gcra, LockedRateLimiter, ManualClock, Nanos, Policy, RateLimiter,
    SlidingLog, StateCell,
};
use loom::sync::Arc;
use loom::thread;
use std::time::Duration;

/// A limiter of capacity 1, a receipt for its only unit; one thread refunds it while
/// another resets and takes the unit again. The unit taken after the reset must
/// still be held at the end: the refund may only give back the pre-reset charge.
fn reset_racing_refund<A, S>(limiter: RateLimiter<A, ManualClock, S>) -> bool
where
    A: Algorithm + 'static,
    S: StateCell<A::State> + 'static,
{
    let limiter = Arc::new(limiter);
    let now = Nanos::from_secs(10);
    let (first, receipt) = limiter.charge_at(now, 1);
    assert!(first.is_allowed());
    let refunder = {
        let limiter = Arc::clone(&limiter);
        thread::spawn(move || limiter.refund(receipt))
    };
    let resetter = {
        let limiter = Arc::clone(&limiter);
        thread::spawn(move || {
            limiter.reset();
            limiter.check_n_at(now, 1)
        })
    };
    let refunded = refunder.join().unwrap();
    let after_reset = resetter.join().unwrap();
    // Fresh after the reset (or refunded before it): the check is admitted.
    assert!(after_reset.is_allowed());
    // ...and its unit is never given back by the older receipt.
    assert!(!limiter.peek_at(now, 1).is_allowed());
    refunded
}

/// The outcomes of [`reset_racing_refund`]: whether the refund gave its unit back.
fn refund_outcomes() -> Seen {
    Seen::new(&["refund after the reset (nothing back)", "refund before it"])
}

fn clock() -> ManualClock {
    ManualClock::starting_at(Nanos::from_secs(10))
}

#[test]
fn reset_racing_a_gcra_refund() {
    let seen = refund_outcomes();
    let s = seen.clone();
    loom::model(move || {
        let policy = Policy::per_second(1).unwrap();
        let refunded = reset_racing_refund(RateLimiter::with_clock(Gcra::new(policy), clock()));
        s.saw(usize::from(refunded));
    });
    seen.assert_each("reset_racing_a_gcra_refund");
}

#[test]
fn reset_racing_a_fixed_window_refund() {
    let seen = refund_outcomes();
    let s = seen.clone();
    loom::model(move || {
        let fw = FixedWindow::new(Policy::per_second(1).unwrap()).unwrap();
        s.saw(usize::from(reset_racing_refund(RateLimiter::with_clock(
            fw,
            clock(),
        ))));
    });
    seen.assert_each("reset_racing_a_fixed_window_refund");
}

#[test]
fn reset_racing_a_refund_on_the_mutex_twin() {
    let seen = refund_outcomes();
    let s = seen.clone();
    loom::model(move || {
        let policy = Policy::per_second(1).unwrap();
        let twin: LockedRateLimiter<Gcra, ManualClock> =
            RateLimiter::locked_with_clock(Gcra::new(policy), clock());
        s.saw(usize::from(reset_racing_refund(twin)));
    });
    seen.assert_each("reset_racing_a_refund_on_the_mutex_twin");
}

#[test]
fn sliding_log_policy_change_racing_checks() {
    let seen = Seen::new(&["one admitted (change first)", "two admitted"]);
    let s = seen.clone();
    loom::model(move || {
        let log = Arc::new(SlidingLog::with_clock(
            Policy::new(2, Duration::from_secs(1)).unwrap(),
            clock(),
        ));
        let now = Nanos::from_secs(10);
        let checks: Vec<_> = (0..2)
            .map(|_| {
                let log = Arc::clone(&log);
                thread::spawn(move || log.check_n_at(now, 1).is_allowed())
            })
            .collect();
        let changer = {
            let log = Arc::clone(&log);
            thread::spawn(move || log.set_policy(Policy::new(1, Duration::from_secs(1)).unwrap()))
        };
        changer.join().unwrap();
        let admitted = checks
            .into_iter()
            .filter_map(|h| h.join().unwrap().then_some(()))
            .count();
        // Never beyond the larger bound; at least the smaller one is reachable.
        assert!((1..=2).contains(&admitted));
        // Under the new limit of 1, whatever was admitted fills it.
        assert!(!log.peek_at(now, 1).is_allowed());
        assert_eq!(log.peek_at(now, 0).remaining(), 0);
        s.saw(admitted - 1);
    });
    seen.assert_each("sliding_log_policy_change_racing_checks");
}
