//! loom models of the GCRA cell: racing threads admit exactly what some sequential
//! order would, and no update is lost.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=4 cargo test -p floodgate --release --test loom_gcra`
#![cfg(loom)]

mod loom_seen;
use loom_seen::Seen;

use floodgate::reference::ExactGcra;
use floodgate::{Clock, Decision, Gcra, ManualClock, Nanos, Policy, RateLimiter};
use loom::sync::Arc;
use loom::thread;
use std::time::Duration;

const T: u64 = 1_000_000_000;

fn limiter(burst: u64, clock: ManualClock) -> RateLimiter<Gcra, ManualClock> {
    RateLimiter::gcra_with_clock(
        Policy::per_second(1).unwrap().with_burst(burst).unwrap(),
        clock,
    )
}

/// Every order of `ops`, run on the exact model; true if one of them yields `observed`.
fn some_sequential_order_matches(burst: u64, ops: &[(u64, u32)], observed: &[Decision]) -> bool {
    fn permute(
        rest: &mut Vec<usize>,
        chosen: &mut Vec<usize>,
        visit: &mut dyn FnMut(&[usize]) -> bool,
    ) -> bool {
        if rest.is_empty() {
            return visit(chosen);
        }
        for i in 0..rest.len() {
            let x = rest.remove(i);
            chosen.push(x);
            let found = permute(rest, chosen, visit);
            chosen.pop();
            rest.insert(i, x);
            if found {
                return true;
            }
        }
        false
    }
    let mut indices: Vec<usize> = (0..ops.len()).collect();
    permute(&mut indices, &mut Vec::new(), &mut |order| {
        let mut model = ExactGcra::new(1, T, burst).unwrap();
        order
            .iter()
            .all(|&i| model.check(ops[i].0, ops[i].1) == observed[i])
    })
}

#[test]
fn three_threads_race_for_two_units() {
    let seen = Seen::new(&["thread 0 denied", "thread 1 denied", "thread 2 denied"]);
    let s = seen.clone();
    loom::model(move || {
        let clock = ManualClock::starting_at(Nanos::new(10 * T));
        let lim = Arc::new(limiter(2, clock));
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let lim = Arc::clone(&lim);
                thread::spawn(move || lim.check())
            })
            .collect();
        let decisions: Vec<Decision> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let admitted = decisions.iter().filter(|d| d.is_allowed()).count();
        assert_eq!(admitted, 2);
        // No lost update: both admissions are in the state.
        assert_eq!(lim.state().tat(), Nanos::new(12 * T));
        let ops = [(10 * T, 1); 3];
        assert!(
            some_sequential_order_matches(2, &ops, &decisions),
            "{decisions:?}"
        );
        s.saw(decisions.iter().position(|d| !d.is_allowed()).unwrap());
    });
    seen.assert_each("three_threads_race_for_two_units");
}

#[test]
fn mixed_costs_linearize() {
    let seen = Seen::new(&["thread 0 admitted", "thread 1 admitted"]);
    let s = seen.clone();
    loom::model(move || {
        let clock = ManualClock::starting_at(Nanos::new(10 * T));
        let lim = Arc::new(limiter(3, clock));
        let costs = [2u32, 2];
        let handles: Vec<_> = costs
            .iter()
            .map(|&c| {
                let lim = Arc::clone(&lim);
                thread::spawn(move || lim.check_n(c))
            })
            .collect();
        let mut decisions: Vec<Decision> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        decisions.push(lim.check_n(1));
        assert_eq!(decisions.iter().filter(|d| d.is_allowed()).count(), 2);
        let ops = [(10 * T, 2), (10 * T, 2), (10 * T, 1)];
        // The final check ran last; the two racers in either order.
        assert!(
            some_sequential_order_matches(3, &ops, &decisions),
            "{decisions:?}"
        );
        assert_eq!(lim.state().tat(), Nanos::new(13 * T));
        s.saw_if(decisions[0].is_allowed(), 0, 1);
    });
    seen.assert_each("mixed_costs_linearize");
}

#[test]
fn a_moving_clock_never_moves_the_state_back() {
    let seen = Seen::new(&["one admission", "two admissions"]);
    let s = seen.clone();
    loom::model(move || {
        let clock = ManualClock::starting_at(Nanos::new(10 * T));
        let lim = Arc::new(limiter(1, clock.clone()));
        let ticker = {
            let clock = clock.clone();
            thread::spawn(move || {
                clock.advance(Duration::from_secs(1));
            })
        };
        let racer = {
            let lim = Arc::clone(&lim);
            thread::spawn(move || lim.check().is_allowed())
        };
        let mine = lim.check().is_allowed();
        ticker.join().unwrap();
        let theirs = racer.join().unwrap();
        let admitted = usize::from(mine) + usize::from(theirs);
        // Burst 1, and at most one second passes: one or two admissions, never zero.
        assert!((1..=2).contains(&admitted));
        // Each admission moved TAT by exactly T from max(TAT, now).
        let tat = lim.state().tat().as_u64();
        assert!(tat >= 10 * T + admitted as u64 * T, "tat {tat}");
        assert!(tat <= 12 * T);
        s.saw(admitted - 1);
    });
    seen.assert_each("a_moving_clock_never_moves_the_state_back");
}

/// The review's GCRA over-admission: a composite charges at t = 0 (booking [0, 1 s)),
/// another thread moves the clock to 5 s and is admitted (booking [5 s, 6 s)), then
/// the composite refunds. Subtracting `T` from the TAT would erase the 5 s booking;
/// the refund gives back only the part of its own booking still ahead of the clock.
/// With burst 1, exactly one request is admitted at 5 s in every interleaving.
#[test]
fn a_refund_never_erases_a_later_booking() {
    use floodgate::keyed::composite::check_all;
    let seen = Seen::new(&["the direct check denied", "the direct check admitted"]);
    let s = seen.clone();
    loom::model(move || {
        let clock = ManualClock::new();
        let shared = Arc::new(limiter(1, clock.clone()));
        // Exhausted for the whole model: one per day.
        let daily = Policy::new(1, Duration::from_secs(86_400)).unwrap();
        let strict = RateLimiter::gcra_with_clock(daily, clock.clone());
        assert!(strict.check().is_allowed());
        let composite = {
            let shared = Arc::clone(&shared);
            thread::spawn(move || check_all(&[&*shared, &strict], 1))
        };
        let direct = {
            let shared = Arc::clone(&shared);
            let clock = clock.clone();
            thread::spawn(move || {
                clock.advance(Duration::from_secs(5));
                shared.check().is_allowed()
            })
        };
        assert!(!composite.join().unwrap().is_allowed());
        let direct = direct.join().unwrap();
        assert_eq!(clock.now(), Nanos::from_secs(5));
        let after = shared.check().is_allowed();
        assert_eq!(u32::from(direct) + u32::from(after), 1);
        s.saw(usize::from(direct));
    });
    seen.assert_each("a_refund_never_erases_a_later_booking");
}
