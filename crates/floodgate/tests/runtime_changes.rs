//! Runtime changes on direct limiters: `reset` and policy changes, and what they do
//! to outstanding receipts (a refund after a reset gives back nothing).
#![cfg(not(loom))]

use floodgate::{
    check_all, FixedWindow, Gcra, Limit, ManualClock, Nanos, Policy, RateLimiter, Shaper,
    SlidingLog, SlidingWindow,
};
use std::time::Duration;

fn clock() -> ManualClock {
    ManualClock::starting_at(Nanos::from_secs(1_000))
}

/// Exhausts `limit` (capacity `capacity`) with one receipt kept, resets, and checks
/// that the reset gave back everything and the old receipt gives back nothing.
fn reset_invalidates_receipts(limit: &dyn Limit, capacity: u32, reset: &dyn Fn()) {
    let (first, receipt) = limit.charge(1);
    assert!(first.is_allowed() && receipt.is_charged());
    assert!(limit.check_n(capacity - 1).is_allowed());
    assert!(!limit.peek(1).is_allowed());
    reset();
    assert_eq!(limit.peek(0).remaining(), u64::from(capacity));
    assert!(limit.check_n(capacity).is_allowed());
    // The charge before the reset is not the limiter's to give back any more.
    assert!(!limit.refund(receipt));
    assert!(!limit.peek(1).is_allowed());
    // A charge after the reset still refunds.
    reset();
    let (_, receipt) = limit.charge(capacity);
    assert!(limit.refund(receipt));
    assert_eq!(limit.peek(0).remaining(), u64::from(capacity));
}

#[test]
fn reset_invalidates_receipts_on_every_direct_limiter() {
    let policy = Policy::per_second(4).unwrap();
    let gcra = RateLimiter::with_clock(Gcra::new(policy), clock());
    reset_invalidates_receipts(&gcra, 4, &|| gcra.reset());
    let twin = RateLimiter::locked_with_clock(Gcra::new(policy), clock());
    reset_invalidates_receipts(&twin, 4, &|| twin.reset());
    let fixed = RateLimiter::with_clock(FixedWindow::new(policy).unwrap(), clock());
    reset_invalidates_receipts(&fixed, 4, &|| fixed.reset());
    let fixed_twin = RateLimiter::locked_with_clock(FixedWindow::new(policy).unwrap(), clock());
    reset_invalidates_receipts(&fixed_twin, 4, &|| fixed_twin.reset());
    let sliding = RateLimiter::with_clock(SlidingWindow::new(policy).unwrap(), clock());
    reset_invalidates_receipts(&sliding, 4, &|| sliding.reset());
    let log = SlidingLog::with_clock(policy, clock());
    reset_invalidates_receipts(&log, 4, &|| log.reset());
    let shaper = Shaper::with_clock(policy, clock());
    reset_invalidates_receipts(&shaper, 4, &|| shaper.reset());
    let locked_shaper = Shaper::locked_with_clock(policy, clock());
    reset_invalidates_receipts(&locked_shaper, 4, &|| locked_shaper.reset());
}

#[test]
fn a_reset_invalidates_outstanding_reservations() {
    let policy = Policy::per_second(10).unwrap().with_burst(1).unwrap();
    let shaper = Shaper::with_clock(policy, clock());
    let max = Duration::from_secs(1);
    let _now = shaper.reserve(1, max).unwrap();
    let later = shaper.reserve(1, max).unwrap();
    shaper.reset();
    let _fresh = shaper.reserve(1, max).unwrap();
    let state = shaper.state();
    // Cancelling the pre-reset reservation would move the fresh schedule back.
    assert_eq!(shaper.cancel(later), 0);
    assert_eq!(shaper.state(), state);
}

#[test]
fn every_direct_limiter_composes_in_check_all() {
    let c = clock();
    let policy = Policy::per_second(3).unwrap();
    let gcra = RateLimiter::with_clock(Gcra::new(policy), c.clone());
    let twin = RateLimiter::locked_with_clock(FixedWindow::new(policy).unwrap(), c.clone());
    let log = SlidingLog::with_clock(policy, c.clone());
    let shaper = Shaper::with_clock(policy, c.clone());
    let locked_shaper = Shaper::locked_with_clock(policy, c.clone());
    let narrow = RateLimiter::with_clock(Gcra::new(Policy::per_second(1).unwrap()), c.clone());
    let all: [&dyn Limit; 6] = [&gcra, &twin, &log, &shaper, &locked_shaper, &narrow];
    assert!(check_all(&all, 1).is_allowed());
    // The narrow limit denies: every other limit is refunded.
    assert!(!check_all(&all, 1).is_allowed());
    for limit in &all[..5] {
        assert_eq!(limit.peek(0).remaining(), 2);
    }
}

#[test]
fn gcra_policy_change_keeps_the_schedule() {
    let mut limiter = RateLimiter::with_clock(Gcra::new(Policy::per_second(10).unwrap()), clock());
    let (_, receipt) = limiter.charge(6);
    // T = 100 ms, τ = 1 s: TAT = now + 600 ms. Under 5/s (T = 200 ms, τ = 1 s) that
    // leaves (1 s − 600 ms) / 200 ms = 2.
    limiter.set_policy(Policy::per_second(5).unwrap());
    assert_eq!(limiter.peek(0).remaining(), 2);
    assert_eq!(limiter.peek(0).limit(), 5);
    // Receipts from before the change give back nothing.
    assert!(!limiter.refund(receipt));
    assert_eq!(limiter.peek(0).remaining(), 2);
}

#[test]
fn window_policy_change_starts_fresh_only_when_the_period_changes() {
    let c = clock();
    let per_minute = |l| FixedWindow::new(Policy::per_minute(l).unwrap()).unwrap();
    let mut fixed = RateLimiter::with_clock(per_minute(10), c.clone());
    assert!(fixed.check_n(7).is_allowed());
    fixed.set_algorithm(per_minute(8));
    assert_eq!(fixed.peek(0).remaining(), 1);
    fixed.set_algorithm(FixedWindow::new(Policy::per_hour(8).unwrap()).unwrap());
    assert_eq!(fixed.peek(0).remaining(), 8);

    let per_minute = |l| SlidingWindow::new(Policy::per_minute(l).unwrap()).unwrap();
    let mut sliding = RateLimiter::with_clock(per_minute(10), c.clone());
    assert!(sliding.check_n(7).is_allowed());
    sliding.set_algorithm(per_minute(20));
    assert_eq!(sliding.peek(0).remaining(), 13);
    sliding.set_algorithm(SlidingWindow::new(Policy::per_hour(20).unwrap()).unwrap());
    assert_eq!(sliding.peek(0).remaining(), 20);
}

#[test]
fn sliding_log_policy_change_keeps_its_timestamps() {
    let c = clock();
    let log = SlidingLog::with_clock(Policy::per_minute(10).unwrap(), c.clone());
    assert!(log.check_n(3).is_allowed());
    c.advance(Duration::from_secs(30));
    let (_, receipt) = log.charge(3);
    log.set_policy(Policy::per_minute(5).unwrap());
    assert_eq!(log.peek(0).remaining(), 0);
    assert!(!log.check().is_allowed());
    // The receipt stays valid: its units are still logged.
    assert!(log.refund(receipt));
    assert_eq!(log.peek(0).remaining(), 2);
    // A shorter period: the units from 30 s ago no longer count.
    log.set_policy(Policy::new(5, Duration::from_secs(20)).unwrap());
    assert_eq!(log.peek(0).remaining(), 5);
}

#[test]
fn sliding_log_refunds_only_what_still_counts() {
    let c = clock();
    let log = SlidingLog::with_clock(Policy::new(3, Duration::from_secs(10)).unwrap(), c.clone());
    let (_, mine) = log.charge(2);
    let (_, theirs) = log.charge(1); // the same instant: one entry of 3 units
    assert_eq!(log.entries(), 1);
    assert!(log.refund(mine));
    assert_eq!(log.peek(0).remaining(), 2);
    // Another limiter's receipt gives back nothing.
    let other = SlidingLog::with_clock(Policy::per_second(3).unwrap(), c.clone());
    assert!(!other.refund(theirs));
    c.advance(Duration::from_secs(10));
    let (_, expired) = log.charge(1);
    c.advance(Duration::from_secs(10));
    assert!(!log.refund(expired));
    assert_eq!(log.peek(0).remaining(), 3);
}
