//! loom models of the window cells: racing checks (including a reading from an earlier
//! window than the one another thread just wrote) are linearizable against the exact
//! models, no admission is lost, and a composite's refund racing a check gives back
//! exactly its own charge.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=4 cargo test -p floodgate --release --test loom_windows`
#![cfg(loom)]

mod linearize;
mod loom_seen;

use loom_seen::Seen;

use floodgate::keyed::composite::check_all;
use floodgate::reference::{ExactFixedWindow, ExactSlidingWindow};
use floodgate::{
    Algorithm, Decision, FixedWindow, FixedWindowState, ManualClock, Nanos, Policy, RateLimiter,
    SlidingWindow,
};
use linearize::some_order_matches;
use loom::sync::Arc;
use loom::thread;
use std::time::Duration;

const P: u64 = 1_000;

/// Runs `ops` (instant, cost) on one limiter, one thread each; returns the decisions.
fn race<A: Algorithm + 'static>(
    alg: A,
    ops: &[(u64, u32)],
) -> (Vec<Decision>, Arc<RateLimiter<A, ManualClock>>) {
    let lim = Arc::new(RateLimiter::with_clock(alg, ManualClock::new()));
    (race_on(&lim, ops), lim)
}

/// Runs `ops` (instant, cost) on `lim`, one thread each; returns the decisions.
fn race_on<A: Algorithm + 'static>(
    lim: &Arc<RateLimiter<A, ManualClock>>,
    ops: &[(u64, u32)],
) -> Vec<Decision> {
    let handles: Vec<_> = ops
        .iter()
        .map(|&(now, cost)| {
            let lim = Arc::clone(lim);
            thread::spawn(move || lim.check_n_at(Nanos::new(now), cost))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Whether some serial order of `ops` on `model` (asked with `check`) gives `decisions`.
fn linearizable<M: Clone>(
    model: &M,
    ops: &[(u64, u32)],
    decisions: &[Decision],
    check: fn(&mut M, u64, u32) -> Decision,
) -> bool {
    some_order_matches(model, ops, decisions, |m, &(t, n)| check(m, t, n))
}

/// Races `ops` on a fixed window of `limit` per `P` and asserts the decisions are
/// linearizable against [`ExactFixedWindow`]; returns the window, the decisions and
/// the final state.
fn fixed_window_race(
    limit: u64,
    ops: &[(u64, u32)],
) -> (FixedWindow, Vec<Decision>, FixedWindowState) {
    let fw = FixedWindow::new(policy(limit)).unwrap();
    let (decisions, lim) = race(fw, ops);
    let model = ExactFixedWindow::new(limit, P).unwrap();
    assert!(linearizable(
        &model,
        ops,
        &decisions,
        ExactFixedWindow::check
    ));
    (fw, decisions, lim.state())
}

fn policy(limit: u64) -> Policy {
    Policy::new(limit, Duration::from_nanos(P)).unwrap()
}

#[test]
fn fixed_window_three_threads_race_for_two_units() {
    let seen = Seen::new(&["thread 0 denied", "thread 1 denied", "thread 2 denied"]);
    let s = seen.clone();
    loom::model(move || {
        let (fw, decisions, state) = fixed_window_race(2, &[(5 * P + 1, 1); 3]);
        assert_eq!(decisions.iter().filter(|d| d.is_allowed()).count(), 2);
        assert_eq!(fw.count_of(state), 2);
        s.saw(decisions.iter().position(|d| !d.is_allowed()).unwrap());
    });
    seen.assert_each("fixed_window_three_threads_race_for_two_units");
}

#[test]
fn fixed_window_an_earlier_window_races_a_later_one() {
    let seen = Seen::new(&["window 5's check first", "window 6's first"]);
    let s = seen.clone();
    loom::model(move || {
        // Window 6 and window 5 (a late reading): whatever wins, the state stays in 6.
        let (fw, decisions, state) = fixed_window_race(2, &[(6 * P, 2), (5 * P + 500, 1)]);
        assert_eq!(fw.window_of(state), 6);
        // Window 5's check is admitted only if it ran first.
        s.saw_if(decisions[1].is_allowed(), 0, 1);
    });
    seen.assert_each("fixed_window_an_earlier_window_races_a_later_one");
}

#[test]
fn sliding_window_races_across_an_edge() {
    let seen = Seen::new(&["window 5's check denied", "window 5's check admitted"]);
    let s = seen.clone();
    loom::model(move || {
        let sw = SlidingWindow::new(policy(3)).unwrap();
        // Two units in window 5, then a thread in window 6 and one still in window 5.
        let lim = RateLimiter::with_clock(sw, ManualClock::new());
        assert!(lim.check_n_at(Nanos::new(5 * P), 2).is_allowed());
        let start = lim.state();
        let lim = Arc::new(lim);
        let ops = [(6 * P + 100, 2), (5 * P + 900, 1)];
        let decisions = race_on(&lim, &ops);
        let mut model = ExactSlidingWindow::new(3, P).unwrap();
        let _ = model.check(5 * P, 2);
        assert_ne!(lim.state(), start);
        assert!(linearizable(
            &model,
            &ops,
            &decisions,
            ExactSlidingWindow::check
        ));
        s.saw(usize::from(decisions[1].is_allowed()));
    });
    seen.assert_each("sliding_window_races_across_an_edge");
}

#[test]
fn fixed_window_refund_races_a_check() {
    let seen = Seen::new(&[
        "the check between the charge and its refund",
        "the check before the charge or after the refund",
    ]);
    let s = seen.clone();
    loom::model(move || {
        let clock = ManualClock::starting_at(Nanos::new(5 * P + 1));
        let fw = FixedWindow::new(policy(3)).unwrap();
        let window = Arc::new(RateLimiter::with_clock(fw, clock.clone()));
        // An exhausted second limit: the composite charges the window, then refunds it.
        let strict = RateLimiter::with_clock(FixedWindow::new(policy(1)).unwrap(), clock);
        assert!(strict.check().is_allowed());
        let composite = {
            let window = Arc::clone(&window);
            thread::spawn(move || check_all(&[&*window, &strict], 1))
        };
        let direct = {
            let window = Arc::clone(&window);
            thread::spawn(move || window.check_n(2))
        };
        assert!(!composite.join().unwrap().is_allowed());
        // 1 + 2 ≤ 3: the check fits beside the held charge, and the refund (a CAS on
        // the same word) never erases it: the window holds exactly the check's units.
        let direct = direct.join().unwrap();
        assert!(direct.is_allowed());
        assert_eq!(fw.count_of(window.state()), 2);
        assert_eq!(fw.window_of(window.state()), 5);
        // Beside the held charge the check took the window's last unit; beside none,
        // one was left.
        s.saw_if(direct.remaining() == 0, 0, 1);
    });
    seen.assert_each("fixed_window_refund_races_a_check");
}

/// The review's over-admission: a composite charges window 5 at its last instant,
/// another thread moves the clock and the state into window 6 and is admitted there,
/// then the composite refunds. The refund must not give back window 6's unit: with
/// L = 1, window 6 admits one request in every interleaving.
#[test]
fn a_refund_never_gives_back_a_later_windows_unit() {
    let seen = Seen::new(&["the direct check denied", "the direct check admitted"]);
    let s = seen.clone();
    loom::model(move || {
        let clock = ManualClock::starting_at(Nanos::new(6 * P - 1));
        let fw = FixedWindow::new(policy(1)).unwrap();
        let window = Arc::new(RateLimiter::with_clock(fw, clock.clone()));
        // Exhausted for the whole model: an hourly window.
        let hourly = Policy::new(1, Duration::from_secs(3600)).unwrap();
        let strict = RateLimiter::with_clock(FixedWindow::new(hourly).unwrap(), clock.clone());
        assert!(strict.check().is_allowed());
        let composite = {
            let window = Arc::clone(&window);
            thread::spawn(move || check_all(&[&*window, &strict], 1))
        };
        let direct = {
            let window = Arc::clone(&window);
            let clock = clock.clone();
            thread::spawn(move || {
                clock.advance(Duration::from_nanos(1));
                window.check().is_allowed()
            })
        };
        assert!(!composite.join().unwrap().is_allowed());
        let direct = direct.join().unwrap();
        let after = window.check().is_allowed();
        assert_eq!(u32::from(direct) + u32::from(after), 1);
        s.saw(usize::from(direct));
    });
    seen.assert_each("a_refund_never_gives_back_a_later_windows_unit");
}
