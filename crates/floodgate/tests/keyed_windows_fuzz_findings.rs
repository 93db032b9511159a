//! What the fuzz review of the keyed windows (fuzz target `keyed`, 2026-12-05) found,
//! as deterministic cases: each keyed table must decide as its un-keyed twin.
//!
//! **A reclamation at an earlier reading dropped a state its window still held.** A
//! refund that empties a window keeps the window (so that a reading behind it is
//! judged there, and the state never moves back to an older window whose count it no
//! longer knows); the log likewise keeps the latest instant it logged at. An insert
//! judged at a reading behind that window reclaimed the emptied state as idle, and
//! the key's next reading behind the window was then judged on a fresh state in its
//! own, older window: the table admitted beyond the limit its twin holds.
#![cfg(not(loom))]

#[macro_use]
mod common;

use floodgate::{
    Algorithm, FixedWindow, KeyedBuilder, KeyedLimiter, ManualClock, Nanos, Policy, RateLimiter,
    SlidingLog, SlidingWindow, Storage,
};
use std::time::Duration;

const S: u64 = 1_000_000_000;
/// Key A's instants are this far on, so that key C's unit at 1 s is long idle.
const BASE: u64 = 100 * S;
const A: u8 = 1;
const B: u8 = 2;
const C: u8 = 3;

fn at(ns: u64) -> Nanos {
    Nanos::new(ns)
}

/// 2 per 10 s (1 per 10 s for the log).
fn policy(limit: u64) -> Policy {
    Policy::new(limit, Duration::from_secs(10)).expect("a valid policy")
}

/// A table of two keys in one shard: C's idle unit at 1 s, A's at `first`; then at
/// `BASE + 25 s` A charges a unit in a later window and refunds it, which empties
/// that window but keeps it. An insert of B read at `BASE + 18 s` (behind A's window)
/// finds the shard full and reclaims what is idle there. A's decisions at `BASE + 19 s`
/// (2 units) and `BASE + 25 s` (1 unit) must equal its twin's, which never forgot.
fn emptied_window_ahead_of_a_reclamation<Al, St>(algorithm: Al, first: u64)
where
    Al: Algorithm + Copy,
    St: Storage<u8, Al::State>,
{
    let clock = ManualClock::new();
    let keyed: KeyedLimiter<u8, Al, ManualClock, St> = KeyedBuilder::new(algorithm)
        .capacity(2)
        .shards(1)
        .clock(clock.clone())
        .build_in()
        .expect("a valid table");
    let twin_clock = ManualClock::new();
    let twin = RateLimiter::with_clock(algorithm, twin_clock.clone());

    assert!(keyed.check_n_at(&C, at(S), 1).is_allowed());
    assert!(keyed.check_n_at(&A, at(first), 1).is_allowed());
    assert!(twin.check_n_at(at(first), 1).is_allowed());
    clock.set(at(BASE + 25 * S));
    twin_clock.set(at(BASE + 25 * S));
    let (d, receipt) = keyed.charge_at(&A, at(BASE + 25 * S), 1);
    let (e, theirs) = twin.charge_at(at(BASE + 25 * S), 1);
    assert!(d.is_allowed() && e.is_allowed());
    assert!(keyed.refund(&A, receipt));
    assert!(twin.refund(theirs));

    assert!(keyed.check_n_at(&B, at(BASE + 18 * S), 1).is_allowed());
    assert_eq!(keyed.metrics().evicted, 0, "C was idle: nothing is evicted");
    assert_eq!(
        keyed.check_n_at(&A, at(BASE + 19 * S), 2),
        twin.check_n_at(at(BASE + 19 * S), 2),
        "A read behind its emptied window"
    );
    assert_eq!(
        keyed.check_n_at(&A, at(BASE + 25 * S), 1),
        twin.check_n_at(at(BASE + 25 * S), 1),
        "A in its window"
    );
}

/// Fixed window, L = 2: A's unit at 115 s (window 11), its refunded charge at 125 s
/// (window 12, emptied). Reclaimed, A's 2 units read at 119 s counted in window 11
/// (3 units there) and a third unit passed at 125 s: 4 units where the twin admits 3.
#[test]
fn a_fixed_window_emptied_ahead_of_a_reclamation_is_kept() {
    let window = FixedWindow::new(policy(2)).expect("fits");
    each_storage!(St => {
        emptied_window_ahead_of_a_reclamation::<_, St>(window, BASE + 15 * S);
    });
}

/// Sliding window counter, L = 2: A's unit at 105 s (window 10), its refunded charge
/// at 125 s (window 12, emptied, no previous count). Reclaimed, A's 2 units read at
/// 119 s counted in window 11, weighing only half at 125 s, where a unit passed that
/// the twin (which counted them in window 12) denies.
#[test]
fn a_sliding_window_emptied_ahead_of_a_reclamation_is_kept() {
    let window = SlidingWindow::new(policy(2)).expect("fits");
    each_storage!(St => {
        emptied_window_ahead_of_a_reclamation::<_, St>(window, BASE + 5 * S);
    });
}

/// The keyed sliding log, L = 1: A's unit at 105 s; its charge at 115 s drops it and
/// is refunded (the log keeps 115 s as its latest instant). Reclaimed at B's 108 s,
/// A's unit read at 109 s was logged there, beside the 105 s unit (2 within 10 s),
/// and a unit at 120 s passed that the twin (which logged it at 115 s) denies.
#[test]
fn a_sliding_log_emptied_ahead_of_a_reclamation_is_kept() {
    let clock = ManualClock::new();
    let keyed = KeyedBuilder::default()
        .capacity(2)
        .shards(1)
        .clock(clock.clone())
        .sliding_log::<u8>(policy(1))
        .expect("a valid table");
    let twin_clock = ManualClock::new();
    let twin = SlidingLog::with_clock(policy(1), twin_clock.clone());

    assert!(keyed.check_n_at(&C, at(S), 1).is_allowed());
    assert!(keyed.check_n_at(&A, at(BASE + 5 * S), 1).is_allowed());
    assert!(twin.check_n_at(at(BASE + 5 * S), 1).is_allowed());
    clock.set(at(BASE + 15 * S));
    twin_clock.set(at(BASE + 15 * S));
    let (d, receipt) = keyed.charge_at(&A, at(BASE + 15 * S), 1);
    let (e, theirs) = twin.charge_at(at(BASE + 15 * S), 1);
    assert!(d.is_allowed() && e.is_allowed());
    assert!(keyed.refund(&A, receipt));
    assert!(twin.refund(theirs));

    assert!(keyed.check_n_at(&B, at(BASE + 8 * S), 1).is_allowed());
    assert_eq!(keyed.metrics().evicted, 0, "C was idle: nothing is evicted");
    assert_eq!(
        keyed.check_n_at(&A, at(BASE + 9 * S), 1),
        twin.check_n_at(at(BASE + 9 * S), 1),
        "A read behind its latest instant"
    );
    clock.set(at(BASE + 20 * S));
    assert_eq!(
        keyed.check_n_at(&A, at(BASE + 20 * S), 1),
        twin.check_n_at(at(BASE + 20 * S), 1),
        "A at 120 s"
    );
}
