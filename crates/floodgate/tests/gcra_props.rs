//! GCRA against its oracles: the atomic cell, the mutex twin and the naive u128
//! model must give *equal* decisions on random traces; under threads the cell must
//! admit exactly what the budget allows.
#![cfg(not(loom))]

use floodgate::reference::ExactGcra;
use floodgate::{Clock, Gcra, LockedRateLimiter, ManualClock, Nanos, Policy, RateLimiter};
use proptest::prelude::*;
use std::time::Duration;

/// One step of a trace: move the clock (possibly backwards, as another core's TSC
/// might), then check or peek `cost` units.
#[derive(Clone, Debug)]
struct Step {
    jump: i64,
    cost: u32,
    peek: bool,
}

fn policy() -> impl Strategy<Value = Policy> {
    (1u64..2_000, 1u64..=86_400_000_000_000, 1u64..2_000).prop_filter_map(
        "valid policy",
        |(limit, period, burst)| {
            Policy::new(limit, Duration::from_nanos(period))
                .and_then(|p| p.with_burst(burst))
                .ok()
        },
    )
}

fn steps(max_cost: u32) -> impl Strategy<Value = Vec<Step>> {
    let jump = prop_oneof![
        4 => Just(0i64),
        4 => 0i64..1_000_000_000,
        2 => 0i64..200_000_000_000_000,
        1 => -5_000_000_000i64..0,
    ];
    let cost = prop_oneof![8 => 0..=max_cost, 1 => Just(u32::MAX)];
    prop::collection::vec((jump, cost, any::<bool>()), 1..200).prop_map(|v| {
        v.into_iter()
            .map(|(jump, cost, peek)| Step { jump, cost, peek })
            .collect()
    })
}

proptest! {
    #[test]
    fn atomic_twin_and_exact_model_agree(policy in policy(), start in 0u64..(1 << 62), trace in steps(2_100)) {
        let gcra = Gcra::new(policy);
        let clock = ManualClock::new();
        let atomic = RateLimiter::with_clock(gcra, clock.clone());
        let locked: LockedRateLimiter<Gcra, ManualClock> = RateLimiter::locked_with_clock(gcra, clock);
        let mut model = ExactGcra::new(policy.limit(), policy.period_nanos(), policy.burst()).unwrap();
        let mut now = start;
        for step in &trace {
            now = now.saturating_add_signed(step.jump);
            let t = Nanos::new(now);
            let (a, l, m) = if step.peek {
                (atomic.peek_at(t, step.cost), locked.peek_at(t, step.cost), model.peek(now, step.cost))
            } else {
                (atomic.check_n_at(t, step.cost), locked.check_n_at(t, step.cost), model.check(now, step.cost))
            };
            prop_assert_eq!(a, m, "atomic vs model at {:?}", step);
            prop_assert_eq!(l, m, "twin vs model at {:?}", step);
            prop_assert_eq!(atomic.state(), locked.state());
        }
    }

    #[test]
    fn peek_is_exactly_the_next_check(policy in policy(), trace in steps(50)) {
        let limiter = RateLimiter::gcra_with_clock(policy, ManualClock::new());
        let mut now = 1u64 << 40;
        for step in &trace {
            now = now.saturating_add_signed(step.jump);
            let t = Nanos::new(now);
            let before = limiter.state();
            let peeked = limiter.peek_at(t, step.cost);
            prop_assert_eq!(limiter.state(), before, "peek wrote");
            prop_assert_eq!(limiter.check_n_at(t, step.cost), peeked);
            if !peeked.is_allowed() || step.cost == 0 {
                prop_assert_eq!(limiter.state(), before, "a denial or cost 0 wrote");
            }
        }
    }

    #[test]
    fn remaining_is_within_capacity_and_retry_is_sufficient(policy in policy(), trace in steps(2_100)) {
        let limiter = RateLimiter::gcra_with_clock(policy, ManualClock::new());
        let mut now = 1u64 << 40;
        for step in &trace {
            now = now.saturating_add_signed(step.jump.max(0));
            let t = Nanos::new(now);
            let d = limiter.check_n_at(t, step.cost);
            prop_assert!(d.remaining() <= d.limit());
            prop_assert_eq!(d.limit(), policy.burst());
            match d.retry_after_nanos() {
                None => prop_assert!(u64::from(step.cost) > policy.burst()),
                Some(0) => prop_assert!(d.is_allowed()),
                Some(wait) => {
                    // After exactly `wait` the same request fits; one nanosecond earlier it does not.
                    let later = limiter.peek_at(Nanos::new(now + wait), step.cost);
                    prop_assert!(later.is_allowed());
                    let earlier = limiter.peek_at(Nanos::new(now + wait - 1), step.cost);
                    prop_assert!(!earlier.is_allowed());
                }
            }
        }
    }
}

/// With the clock frozen, N threads racing on one cell admit exactly B.
#[test]
fn frozen_clock_threads_admit_exactly_burst() {
    for (threads, burst) in [(2, 1), (4, 7), (8, 1000)] {
        let policy = Policy::per_hour(1).unwrap().with_burst(burst).unwrap();
        let limiter =
            RateLimiter::gcra_with_clock(policy, ManualClock::starting_at(Nanos::from_secs(1)));
        let admitted: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        (0..burst * 2)
                            .filter(|_| limiter.check().is_allowed())
                            .count() as u64
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(admitted, burst, "{threads} threads, burst {burst}");
    }
}

/// With a moving clock, admitted units never exceed B + elapsed / T.
#[test]
fn moving_clock_threads_admit_at_most_the_budget() {
    let policy = Policy::per_second(1_000).unwrap().with_burst(20).unwrap();
    let clock = ManualClock::starting_at(Nanos::from_secs(5));
    let limiter = RateLimiter::gcra_with_clock(policy, clock.clone());
    let start = clock.now().as_u64();
    let admitted: u64 = std::thread::scope(|s| {
        let ticker = s.spawn(|| {
            for _ in 0..2_000 {
                clock.advance(Duration::from_micros(250));
                std::thread::yield_now();
            }
        });
        let workers: Vec<_> = (0..3)
            .map(|i| {
                let limiter = &limiter;
                s.spawn(move || {
                    (0..20_000u32)
                        .map(|k| u64::from(1 + (k + i) % 3))
                        .filter(|&c| limiter.check_n(c as u32).is_allowed())
                        .sum::<u64>()
                })
            })
            .collect();
        ticker.join().unwrap();
        workers.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let elapsed = clock.now().as_u64() - start;
    let budget = policy.burst() + elapsed / policy.interval_nanos();
    assert!(admitted <= budget, "admitted {admitted} > budget {budget}");
    // And the final TAT accounts for every admitted unit exactly once.
    let tat = limiter.state().tat().as_u64();
    assert!(tat >= start + admitted * policy.interval_nanos());
}
