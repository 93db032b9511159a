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
    Algorithm, FixedWindow, KeyedBuilder, KeyedLimiter, Limit, ManualClock, Nanos, Policy,
    RateLimiter, SlidingLog, SlidingWindow, Storage,
};
use std::time::Duration;

const S: u64 = 1_000_000_000;
/// Key A's instants are this far on, so that key C's unit at 1 s is long idle.
const BASE: u64 = 100 * S;
const A: u8 = 1;
const B: u8 = 2;
const C: u8 = 3;

/// 2 per 10 s (1 per 10 s for the log).
fn policy(limit: u64) -> Policy {
    Policy::new(limit, Duration::from_secs(10)).expect("a valid policy")
}

/// A case's instants, in seconds after `BASE`.
#[derive(Clone, Copy)]
struct Steps {
    /// A's first unit.
    first: u64,
    /// A's charge in a later window (or at a later instant), refunded at once: the
    /// window stays, emptied (the log keeps the instant as its latest).
    charge: u64,
    /// B's insert, read behind that window: the shard (two keys) is full and reclaims
    /// what is idle there.
    insert: u64,
    /// A read behind the window, with this cost.
    behind: (u64, u32),
    /// A read later on, for one unit.
    later: u64,
}

/// Runs `steps` on a table of two keys in one shard, holding C's idle unit at 1 s
/// (`keys`: A, B and C's limits), and on A's `twin` (a direct limiter): A's
/// decisions read behind its emptied window and later on must equal the twin's,
/// which never forgot.
fn emptied_ahead_of_a_reclamation(
    keys: [&dyn Limit; 3],
    evicted: &dyn Fn() -> u64,
    twin: &dyn Limit,
    clocks: [&ManualClock; 2],
    steps: Steps,
) {
    let [a, b, c] = keys;
    let at = |secs: u64| Nanos::new(BASE + secs * S);
    assert!(c.check_n_at(Nanos::new(S), 1).is_allowed());
    assert!(a.check_n_at(at(steps.first), 1).is_allowed());
    assert!(twin.check_n_at(at(steps.first), 1).is_allowed());
    for clock in clocks {
        clock.set(at(steps.charge));
    }
    let (d, receipt) = a.charge_at(at(steps.charge), 1);
    let (e, theirs) = twin.charge_at(at(steps.charge), 1);
    assert!(d.is_allowed() && e.is_allowed());
    assert!(a.refund(receipt) && twin.refund(theirs));

    assert!(b.check_n_at(at(steps.insert), 1).is_allowed());
    assert_eq!(evicted(), 0, "C was idle: nothing is evicted");
    let (behind, cost) = steps.behind;
    let read_behind = (
        a.check_n_at(at(behind), cost),
        twin.check_n_at(at(behind), cost),
    );
    for clock in clocks {
        clock.set(at(steps.later));
    }
    let later = (
        a.check_n_at(at(steps.later), 1),
        twin.check_n_at(at(steps.later), 1),
    );
    assert_eq!(
        later.0.is_allowed(),
        later.1.is_allowed(),
        "A later on: {later:?} (read behind: {read_behind:?})"
    );
    assert_eq!(
        read_behind.0, read_behind.1,
        "A read behind its emptied window"
    );
    assert_eq!(later.0, later.1, "A later on");
}

/// The case on a `KeyedLimiter` of `algorithm` on storage `St`.
fn on_keyed_limiter<Al, St>(algorithm: Al, steps: Steps)
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
    emptied_ahead_of_a_reclamation(
        [&keyed.limit(&A), &keyed.limit(&B), &keyed.limit(&C)],
        &|| keyed.metrics().evicted,
        &twin,
        [&clock, &twin_clock],
        steps,
    );
}

/// A window case on every storage: A's first unit at `first`, its charge at 125 s
/// refunded, B's insert read at 118 s, A's 2 units read at 119 s, one at 125 s.
fn window_case<Al>(window: Al, first: u64)
where
    Al: Algorithm + Copy,
    floodgate::Heap: Storage<u8, Al::State>,
    floodgate::Inline: Storage<u8, Al::State>,
    floodgate::Fingerprint: Storage<u8, Al::State>,
{
    let steps = Steps {
        first,
        charge: 25,
        insert: 18,
        behind: (19, 2),
        later: 25,
    };
    each_storage!(St => {
        on_keyed_limiter::<_, St>(window, steps);
    });
}

/// Fixed window, L = 2: A's unit at 115 s (window 11), its refunded charge at 125 s
/// (window 12, emptied). Reclaimed, A's 2 units read at 119 s counted in window 11
/// (3 units there) and a third unit passed at 125 s: 4 units where the twin admits 3.
#[test]
fn a_fixed_window_emptied_ahead_of_a_reclamation_is_kept() {
    window_case(FixedWindow::new(policy(2)).expect("fits"), 15);
}

/// Sliding window counter, L = 2: A's unit at 105 s (window 10), its refunded charge
/// at 125 s (window 12, emptied, no previous count). Reclaimed, A's 2 units read at
/// 119 s counted in window 11, weighing only half at 125 s, where a unit passed that
/// the twin (which counted them in window 12) denies.
#[test]
fn a_sliding_window_emptied_ahead_of_a_reclamation_is_kept() {
    window_case(SlidingWindow::new(policy(2)).expect("fits"), 5);
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
    emptied_ahead_of_a_reclamation(
        [&keyed.limit(&A), &keyed.limit(&B), &keyed.limit(&C)],
        &|| keyed.metrics().evicted,
        &twin,
        [&clock, &twin_clock],
        Steps {
            first: 5,
            charge: 15,
            insert: 8,
            behind: (9, 1),
            later: 20,
        },
    );
}
