//! Fixed window and sliding window counter: the atomic limiter, its mutex twin and the
//! exact model agree on random traces; threads under a frozen clock never admit more
//! than the limit; the textbook fixed window agrees where its semantics coincide.
#![cfg(not(loom))]

use floodgate::reference::{
    ExactFixedWindow, ExactSlidingWindow, TextbookFixedWindow, TextbookSlidingWindow,
};
use floodgate::{
    Algorithm, Decision, FixedWindow, ManualClock, Nanos, Policy, RateLimiter, SlidingWindow,
    YEAR_NANOS,
};
use proptest::prelude::*;

mod common;
use common::{advance, op, Op};
use std::time::Duration;

/// One step of a trace: move the clock by `step` (may be negative), then check or peek.
fn policy() -> impl Strategy<Value = (u64, u64)> {
    let period = prop_oneof![
        Just(1u64),
        Just(7),
        Just(1_000),
        Just(1_000_000_007),
        Just(1_000_000_000),
        Just(60_000_000_000),
        15_000_000u64..5_000_000_000,
    ];
    (period, 1u64..=40).prop_map(|(p, l)| (p, l.min(p)))
}

/// Start times anywhere, including close to the end of `u64`.
fn start() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        0u64..1 << 62,
        (u64::MAX - YEAR_NANOS)..=u64::MAX,
    ]
}

/// Drives an algorithm, its twin and a model with the same trace.
fn differential<A, M>(
    alg: A,
    twin: A,
    start: u64,
    ops: &[Op],
    mut model: M,
) -> Result<(), TestCaseError>
where
    A: Algorithm,
    M: FnMut(u64, u32, bool) -> Decision,
{
    let atomic = RateLimiter::with_clock(alg, ManualClock::new());
    let locked = RateLimiter::locked_with_clock(twin, ManualClock::new());
    let mut now = start;
    for (i, o) in ops.iter().enumerate() {
        now = advance(now, o.step);
        let t = Nanos::new(now);
        let (a, b) = if o.peek {
            (atomic.peek_at(t, o.cost), locked.peek_at(t, o.cost))
        } else {
            (atomic.check_n_at(t, o.cost), locked.check_n_at(t, o.cost))
        };
        let m = model(now, o.cost, o.peek);
        prop_assert_eq!(a, b, "step {} at {}: atomic vs twin", i, now);
        prop_assert_eq!(a, m, "step {} at {}: atomic vs model {:?}", i, now, o);
        prop_assert_eq!(atomic.state(), locked.state());
        // An idle state decides exactly like a fresh one, so forgetting it loses nothing.
        let alg = atomic.algorithm();
        if alg.is_idle(atomic.state(), t) {
            let fresh = bytemuck::Zeroable::zeroed();
            for cost in [0, 1, o.cost] {
                prop_assert_eq!(
                    alg.decide(atomic.state(), t, cost),
                    alg.decide(fresh, t, cost)
                );
            }
        }
        // Peek is exactly the decision check would make.
        if o.peek {
            prop_assert_eq!(atomic.check_n_at(t, o.cost), a);
            prop_assert_eq!(locked.check_n_at(t, o.cost), b);
            let _ = model(now, o.cost, false);
        }
    }
    Ok(())
}

/// A policy, a start time and a trace for it.
fn case() -> impl Strategy<Value = (u64, u64, u64, Vec<Op>)> {
    policy().prop_flat_map(|(p, l)| {
        (
            Just(p),
            Just(l),
            start(),
            proptest::collection::vec(op(p, l, (1000 * p).min(YEAR_NANOS / 8)), 1..80),
        )
    })
}

proptest! {
    #![proptest_config(crate::common::cases(400))]

    #[test]
    fn fixed_window_atomic_twin_and_model_agree((period, limit, start, ops) in case()) {
        let p = Policy::new(limit, Duration::from_nanos(period)).unwrap();
        let mut model = ExactFixedWindow::new(limit, period).unwrap();
        differential(
            FixedWindow::new(p).unwrap(),
            FixedWindow::new(p).unwrap(),
            start,
            &ops,
            |now, cost, peek| if peek { model.peek(now, cost) } else { model.check(now, cost) },
        )?;
    }

    #[test]
    fn sliding_window_atomic_twin_and_model_agree((period, limit, start, ops) in case()) {
        let p = Policy::new(limit, Duration::from_nanos(period)).unwrap();
        let mut model = ExactSlidingWindow::new(limit, period).unwrap();
        differential(
            SlidingWindow::new(p).unwrap(),
            SlidingWindow::new(p).unwrap(),
            start,
            &ops,
            |now, cost, peek| if peek { model.peek(now, cost) } else { model.check(now, cost) },
        )?;
    }

    /// Where the textbook fixed window coincides with the aligned one: each window the
    /// trace enters opens with a request at its first instant `k·P`, and at least one
    /// window was skipped before it (the textbook restarts only when more than `P` has
    /// passed since its last start).
    #[test]
    fn textbook_fixed_window_agrees_where_aligned(
        limit in 1u64..20,
        windows in proptest::collection::vec((2u64..5, proptest::collection::vec((0u64..1000, 0u64..4), 0..30)), 1..10),
    ) {
        let period = 1000;
        let fw = RateLimiter::with_clock(
            FixedWindow::new(Policy::new(limit, Duration::from_nanos(period)).unwrap()).unwrap(),
            ManualClock::new(),
        );
        let mut textbook = TextbookFixedWindow::new(limit, period, 0);
        let mut w = 0;
        for (skip, requests) in windows {
            w += skip;
            let start = w * period;
            // The request that opens the window, then the rest in order.
            let mut times: Vec<(u64, u64)> = requests;
            times.sort_unstable();
            times.insert(0, (0, 1));
            for (offset, cost) in times {
                let now = start + offset;
                let ours = fw.check_n_at(Nanos::new(now), cost as u32).is_allowed();
                prop_assert_eq!(ours, textbook.allow(now, cost), "at {}", now);
            }
        }
    }
}

proptest! {
    /// The textbook sliding counter (`total + n − 1 < L` in `f64`) and the exact one
    /// (`⌊prev·w⌋ + cur + n ≤ L`) are the same test for integer counts, but the textbook
    /// window starts at its first request and switches only *after* `P`, so the two
    /// coincide only while that first window lasts: both start at 0, no switch yet.
    #[test]
    fn textbook_sliding_window_agrees_in_its_first_window(
        limit in 1u64..20,
        requests in proptest::collection::vec((0u64..1000, 0u64..5), 1..40),
    ) {
        let period = 1000;
        let sw = RateLimiter::with_clock(
            SlidingWindow::new(Policy::new(limit, Duration::from_nanos(period)).unwrap()).unwrap(),
            ManualClock::new(),
        );
        let mut textbook = TextbookSlidingWindow::new(limit, period, 0);
        let mut requests = requests;
        requests.sort_unstable();
        for (now, cost) in requests {
            let ours = sw.check_n_at(Nanos::new(now), cost as u32).is_allowed();
            prop_assert_eq!(ours, textbook.allow(now, cost), "at {}", now);
        }
    }
}

/// `threads` threads each check `per_thread` times at one frozen instant.
fn admitted_under_threads<A: Algorithm>(alg: A, threads: usize, per_thread: usize) -> (u64, u64) {
    let clock = ManualClock::starting_at(Nanos::from_secs(1_700_000_000));
    let atomic = RateLimiter::with_clock(alg, clock);
    let admitted: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    (0..per_thread)
                        .filter(|_| atomic.check().is_allowed())
                        .count() as u64
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    (admitted, atomic.peek(0).remaining())
}

#[test]
fn threads_under_a_frozen_clock_admit_exactly_the_limit() {
    for limit in [1, 7, 100, 1000] {
        let p = Policy::per_minute(limit).unwrap();
        let (admitted, remaining) = admitted_under_threads(FixedWindow::new(p).unwrap(), 4, 600);
        assert_eq!((admitted, remaining), (limit, 0));
        let (admitted, remaining) = admitted_under_threads(SlidingWindow::new(p).unwrap(), 4, 600);
        assert_eq!((admitted, remaining), (limit, 0));
    }
}
