//! The docs' guarantees about a [`Decision`], each attacked directly on every limiter
//! (direct, keyed, the log, the shaper as a limit, composites).
//!
//! The property tests elsewhere hold each engine to an exact model; a model written
//! from the same formulas can share a slip with the code. These tests check what the
//! docs promise a *caller* — the numbers mean what they say — without any model:
//!
//! * `Decision` (decision.rs): `remaining` is the whole units that could still be
//!   admitted now, in `[0, limit]`; `limit` is GCRA's burst or the window's `L`;
//!   `retry_after` is zero when allowed, `None` exactly when the cost exceeds the
//!   capacity, and otherwise "the earliest wait after which the same request would
//!   be admitted if nothing else happened"; `reset_after` is "until the limiter is
//!   back to its fresh state with no more traffic", and `reset_after_secs` is "never
//!   0 while anything is counted".
//! * `check_n` (limiter.rs, sliding_log.rs): cost 0 "is always allowed and writes
//!   nothing"; `peek` is "exactly what `check_n` would return now".
//! * `SlidingLog` (sliding_log.rs, "Memory"): "after every admission the ring holds
//!   at most the `L` units still counting — at most `L` entries".
//! * `check_all` (composite.rs): a denial charges nothing and is "the most
//!   restrictive decision: a denial with the longest `retry_after` ("never" longest
//!   of all)"; if all admit, "the admission with the least `remaining`".
//! * `Shaper` (shaping.rs): a reservation's decision "`remaining` counts the units
//!   that could still be reserved within the same `max_delay`"; `ShapeError::TooLong`
//!   "the same reservation fits after `retry_after` if nothing else is reserved".
//! * `Wait` (waiting.rs): a cost that can never fit "returns `WaitError::Never` at
//!   once" ("nothing slept"), on every limiter.
//!
//! The tests further down quote each claim they attack in their own docs: policies,
//! bookings, keyed reservations, the keyed tables' numbers, the clocks, one clock read
//! per decision, no panics at the edges. VERIFICATION.md ("The docs' guarantees,
//! claim by claim") maps them.
//!
//! Every test runs on a `ManualClock` (or readings passed in): no sleeps, no timing
//! (one test compares the default clocks with `SystemTime`, within a second).
//! Off under `--cfg loom` (the crate's atomics are then loom's, usable only in a
//! model).
#![cfg(not(loom))]

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use floodgate::{
    check_all, Decision, FixedWindow, Gcra, Jitter, KeyedBuilder, Limit, ManualClock, Nanos,
    Policy, RateLimiter, ShapeError, Shaper, SlidingLog, SlidingWindow, Wait, WaitError,
};
use proptest::prelude::*;

/// Every claim about one decision `d`, returned by a charge of `cost` at reading `t`
/// on `limit`, whose capacity (burst or `L`) is `cap`. Peeks only: nothing written.
fn decision_keeps_its_promises(
    limit: &dyn Limit,
    t: u64,
    cost: u32,
    cap: u64,
    d: Decision,
) -> Result<(), TestCaseError> {
    let at = |ns: u64| Nanos::new(ns);
    let ctx = || format!("cost {cost} at {t}: {d:?}");
    // `limit`: the capacity.
    prop_assert_eq!(d.limit(), cap, "limit: {}", ctx());
    // `remaining` in [0, limit].
    prop_assert!(d.remaining() <= cap, "remaining over the limit: {}", ctx());
    // Zero when allowed.
    if d.is_allowed() {
        prop_assert_eq!(d.retry_after(), Some(Duration::ZERO), "{}", ctx());
        prop_assert!(
            u64::from(cost) <= cap,
            "admitted over the capacity: {}",
            ctx()
        );
    }
    // `None` ("never") exactly when the cost exceeds the capacity.
    if u64::from(cost) > cap {
        prop_assert!(!d.is_allowed(), "{}", ctx());
        prop_assert_eq!(d.retry_after(), None, "{}", ctx());
        prop_assert_eq!(d.retry_after_secs(), None, "{}", ctx());
    } else {
        prop_assert!(
            d.retry_after().is_some(),
            "never for a cost that fits: {}",
            ctx()
        );
    }
    // `remaining`: whole units that could still be admitted now — `remaining` fit,
    // one more does not.
    let rem = u32::try_from(d.remaining()).expect("small limits");
    let fits = limit.peek_at(at(t), rem);
    prop_assert!(
        fits.is_allowed(),
        "remaining {} does not fit: {} / {:?}",
        rem,
        ctx(),
        fits
    );
    let over = limit.peek_at(at(t), rem + 1);
    prop_assert!(
        !over.is_allowed(),
        "remaining + 1 fits too: {} / {:?}",
        ctx(),
        over
    );
    // `retry_after`: the earliest wait after which the same request is admitted.
    if let (false, Some(wait)) = (d.is_allowed(), d.retry_after_nanos()) {
        prop_assert!(wait > 0, "a denial that says retry now: {}", ctx());
        prop_assert!(d.retry_after_secs().is_some_and(|s| s >= 1), "{}", ctx());
        let then = limit.peek_at(at(t + wait), cost);
        prop_assert!(
            then.is_allowed(),
            "still denied at retry_after: {} / {:?}",
            ctx(),
            then
        );
        let early = limit.peek_at(at(t + wait - 1), cost);
        prop_assert!(
            !early.is_allowed(),
            "admitted 1 ns before retry_after: {} / {:?}",
            ctx(),
            early
        );
    }
    // `reset_after`: back to the fresh state with no more traffic; never 0 while
    // anything is counted.
    let fresh = limit.peek_at(at(t + d.reset_after_nanos()), 0);
    prop_assert_eq!(
        fresh.remaining(),
        cap,
        "not fresh at reset_after: {} / {:?}",
        ctx(),
        fresh
    );
    if d.remaining() < cap {
        prop_assert!(
            d.reset_after_secs() >= 1,
            "reset 0 while counted: {}",
            ctx()
        );
    }
    Ok(())
}

/// One step of a trace: how the reading moves, then a charge of `cost`.
#[derive(Clone, Debug)]
struct Step {
    /// Forward by this many per-mille of the period (up to two periods)…
    forward: u64,
    /// …or, when set, back by this many per-mille of half a period (an earlier
    /// reading: another thread's, another core's clock).
    back: Option<u64>,
    cost: u32,
}

fn steps(max_cost: u32) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (
            prop_oneof![4 => Just(0u64), 6 => 0u64..2_000],
            prop::option::weighted(0.15, 0u64..1_000),
            0..=max_cost,
        )
            .prop_map(|(forward, back, cost)| Step {
                forward,
                back,
                cost,
            }),
        1..40,
    )
}

/// Periods: a short one (the window tables' small rows), a prime, a long one.
fn period() -> impl Strategy<Value = u64> {
    prop_oneof![Just(60_000u64), Just(1_000_003u64), Just(1_000_000_000u64)]
}

/// Runs `trace` on `limit`, checking every decision and the claims around it.
fn run_trace(limit: &dyn Limit, cap: u64, p: u64, trace: &[Step]) -> Result<(), TestCaseError> {
    let mut t = 4 * p;
    for step in trace {
        t += step.forward * p / 1_000;
        if let Some(back) = step.back {
            t -= back * (p / 2) / 1_000;
        }
        let before = (
            limit.peek_at(Nanos::new(t), 0),
            limit.peek_at(Nanos::new(t), 1),
        );
        let peeked = limit.peek_at(Nanos::new(t), step.cost);
        let d = limit.check_n_at(Nanos::new(t), step.cost);
        // `peek` is exactly what the check returns.
        prop_assert_eq!(peeked, d, "peek vs check, cost {} at {}", step.cost, t);
        // Cost 0 is always allowed and writes nothing.
        if step.cost == 0 {
            prop_assert!(d.is_allowed(), "cost 0 denied at {}: {:?}", t, d);
        }
        if step.cost == 0 || !d.is_allowed() {
            let after = (
                limit.peek_at(Nanos::new(t), 0),
                limit.peek_at(Nanos::new(t), 1),
            );
            prop_assert_eq!(before, after, "a cost-0 check or a denial wrote, at {}", t);
        }
        decision_keeps_its_promises(limit, t, step.cost, cap, d)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(crate::common::cases(256))]

    /// GCRA (lock-free and the mutex twin), a token bucket, and the shaper as a limit
    /// (a plain GCRA check): the decision's numbers mean what the docs say.
    #[test]
    fn gcra_decisions_keep_their_promises(
        limit in 1u64..6, burst in 1u64..7, p in period(), trace in steps(8),
    ) {
        let policy = Policy::new(limit, Duration::from_nanos(p)).unwrap().with_burst(burst).unwrap();
        let clock = ManualClock::new();
        let atomic = RateLimiter::gcra_with_clock(policy, clock.clone());
        run_trace(&atomic, burst, p, &trace)?;
        let twin = RateLimiter::locked_with_clock(Gcra::new(policy), clock.clone());
        run_trace(&twin, burst, p, &trace)?;
        let shaper = Shaper::with_clock(policy, clock.clone());
        run_trace(&shaper, burst, p, &trace)?;
        let bucket = Gcra::token_bucket(burst, limit, Duration::from_nanos(p)).unwrap();
        run_trace(&RateLimiter::with_clock(bucket, clock), burst, p, &trace)?;
    }

    /// The fixed window, the sliding window counter and the sliding log.
    #[test]
    fn window_and_log_decisions_keep_their_promises(
        limit in 1u64..6, p in period(), trace in steps(7),
    ) {
        let policy = Policy::new(limit, Duration::from_nanos(p)).unwrap();
        let clock = ManualClock::new();
        let fixed = RateLimiter::with_clock(FixedWindow::new(policy).unwrap(), clock.clone());
        run_trace(&fixed, limit, p, &trace)?;
        let sliding = RateLimiter::with_clock(SlidingWindow::new(policy).unwrap(), clock.clone());
        run_trace(&sliding, limit, p, &trace)?;
        let log = SlidingLog::with_clock(policy, clock);
        run_trace(&log, limit, p, &trace)?;
    }

    /// The same on keyed limiters (inline table, heap table, the keyed log), one key
    /// each and a table far from full (no removal moves the judged instant).
    #[test]
    fn keyed_decisions_keep_their_promises(
        limit in 1u64..6, burst in 1u64..7, p in period(), trace in steps(8),
    ) {
        let policy = Policy::new(limit, Duration::from_nanos(p)).unwrap();
        let gcra = policy.with_burst(burst).unwrap();
        let clock = ManualClock::new();
        let key = 7u64;
        let inline = KeyedBuilder::new(Gcra::new(gcra)).clock(clock.clone()).capacity(64).shards(1)
            .build_inline::<u64>().unwrap();
        run_trace(&inline.limit(&key), burst, p, &trace)?;
        let heap = KeyedBuilder::new(SlidingWindow::new(policy).unwrap()).clock(clock.clone())
            .capacity(64).shards(1).build::<u64>().unwrap();
        run_trace(&heap.limit(&key), limit, p, &trace)?;
        let fixed = KeyedBuilder::new(FixedWindow::new(policy).unwrap()).clock(clock.clone())
            .capacity(64).shards(1).build_fingerprint::<u64>().unwrap();
        run_trace(&fixed.limit(&key), limit, p, &trace)?;
        let log = KeyedBuilder::default().clock(clock).capacity(64).shards(1)
            .sliding_log::<u64>(policy).unwrap();
        run_trace(&log.limit(&key), limit, p, &trace)?;
    }

    /// sliding_log.rs, "Memory": after every admission the ring holds at most `L`
    /// entries, whatever the traffic (earlier readings and refunds included).
    #[test]
    fn the_log_holds_at_most_l_entries_after_every_admission(
        limit in 1u64..8, p in period(), trace in steps(3), refund_every in 2usize..5,
    ) {
        let policy = Policy::new(limit, Duration::from_nanos(p)).unwrap();
        let log = SlidingLog::with_clock(policy, ManualClock::new());
        // keyed/log.rs: "Each log holds at most `L` entries after an admission".
        let keyed = KeyedBuilder::default().clock(ManualClock::new()).capacity(4)
            .sliding_log::<u64>(policy).unwrap();
        let mut t = 4 * p;
        for (i, step) in trace.iter().enumerate() {
            t += step.forward * p / 1_000;
            if let Some(back) = step.back {
                t -= back * (p / 2) / 1_000;
            }
            let (d, receipt) = log.charge_at(Nanos::new(t), step.cost);
            let (k, keyed_receipt) = keyed.charge_at(&1, Nanos::new(t), step.cost);
            prop_assert_eq!(d, k);
            if i % refund_every == 0 {
                let _ = log.refund(receipt);
                let _ = keyed.refund(&1, keyed_receipt);
            }
            if d.is_allowed() {
                prop_assert!(log.entries() as u64 <= limit, "{} entries for L = {}", log.entries(), limit);
                prop_assert!(keyed.entries() as u64 <= limit, "{} keyed entries for L = {}", keyed.entries(), limit);
            }
        }
    }

    /// composite.rs: a denial charges nothing and is the denial with the longest
    /// `retry_after` ("never" longest); an admission is the one with the least
    /// `remaining`; and the composite's numbers keep the `Decision` promises over
    /// all its limits together.
    #[test]
    fn check_all_returns_the_most_restrictive_decision(
        limit in 1u64..5, burst in 1u64..6, p in period(), trace in steps(6),
    ) {
        let policy = Policy::new(limit, Duration::from_nanos(p)).unwrap();
        let clock = ManualClock::new();
        let gcra = RateLimiter::gcra_with_clock(policy.with_burst(burst).unwrap(), clock.clone());
        let fixed = RateLimiter::with_clock(FixedWindow::new(policy).unwrap(), clock.clone());
        let sliding = RateLimiter::with_clock(SlidingWindow::new(policy).unwrap(), clock.clone());
        let log = SlidingLog::with_clock(policy, clock.clone());
        let limits: [&dyn Limit; 4] = [&gcra, &fixed, &sliding, &log];
        let mut t = 4 * p;
        for step in &trace {
            t += step.forward * p / 1_000; // one clock, forward only (the refund premise)
            clock.set(Nanos::new(t));
            let now = Nanos::new(t);
            let peeks: Vec<Decision> = limits.iter().map(|l| l.peek_at(now, step.cost)).collect();
            let before: Vec<(Decision, Decision)> =
                limits.iter().map(|l| (l.peek_at(now, 0), l.peek_at(now, 1))).collect();
            let d = check_all(&limits, step.cost);
            prop_assert_eq!(d.is_allowed(), peeks.iter().all(Decision::is_allowed), "{:?}", peeks);
            if d.is_allowed() {
                let least = limits.iter().map(|l| l.peek_at(now, 0).remaining()).min();
                prop_assert_eq!(Some(d.remaining()), least);
            } else {
                // Nothing charged.
                let after: Vec<(Decision, Decision)> =
                    limits.iter().map(|l| (l.peek_at(now, 0), l.peek_at(now, 1))).collect();
                prop_assert_eq!(&before, &after, "a denied composite kept a charge at {}", t);
                let longest = peeks
                    .iter()
                    .filter(|d| !d.is_allowed())
                    .map(|d| d.retry_after_nanos().unwrap_or(u64::MAX))
                    .max();
                prop_assert_eq!(Some(d.retry_after_nanos().unwrap_or(u64::MAX)), longest);
                // The earliest wait after which the same request passes every limit.
                if let Some(wait) = d.retry_after_nanos() {
                    let at = |ns| Nanos::new(ns);
                    prop_assert!(limits.iter().all(|l| l.peek_at(at(t + wait), step.cost).is_allowed()),
                        "a limit still denies at the composite's retry_after {}", wait);
                    prop_assert!(limits.iter().any(|l| !l.peek_at(at(t + wait - 1), step.cost).is_allowed()),
                        "every limit admits 1 ns before the composite's retry_after {}", wait);
                }
            }
        }
    }

    /// shaping.rs: a reservation's `remaining` counts the units that could still be
    /// reserved within the same `max_delay`; `TooLong`'s `retry_after` is when the
    /// same reservation fits if nothing else is reserved (and not 1 ns earlier).
    #[test]
    fn shaper_reservations_mean_what_they_say(
        limit in 1u64..5, burst in 1u64..5, p in period(), delay_slots in 0u64..4,
        trace in steps(4), probe_extra in 0u32..2,
    ) {
        let policy = Policy::new(limit, Duration::from_nanos(p)).unwrap().with_burst(burst).unwrap();
        let max_delay = Duration::from_nanos(delay_slots * policy.interval_nanos());
        // Replays the trace on a fresh shaper: (the shaper, the clock, the last result).
        let replay = || {
            let clock = ManualClock::new();
            let shaper = Shaper::with_clock(policy, clock.clone());
            let mut t = 4 * p;
            let mut last = None;
            for step in &trace {
                t += step.forward * p / 1_000;
                clock.set(Nanos::new(t));
                last = Some(shaper.reserve(step.cost.max(1), max_delay));
            }
            (shaper, clock, last)
        };
        let (shaper, clock, last) = replay();
        match last {
            Some(Ok(r)) => {
                let rem = u32::try_from(r.decision().remaining()).unwrap();
                // `rem + probe_extra` units: rem must fit, rem + 1 must not.
                let probe = rem + probe_extra;
                let fits = if probe == 0 { true } else { shaper.reserve(probe, max_delay).is_ok() };
                prop_assert_eq!(fits, probe_extra == 0, "remaining {} of {:?}", rem, r);
            }
            Some(Err(ShapeError::TooLong { retry_after })) => {
                let cost = trace.last().unwrap().cost.max(1);
                let wait = u64::try_from(retry_after.as_nanos()).unwrap();
                prop_assert!(wait > 0);
                clock.advance(retry_after);
                prop_assert!(shaper.reserve(cost, max_delay).is_ok(), "not at retry_after {:?}", retry_after);
                let (shaper, clock, _) = replay();
                clock.advance(retry_after - Duration::from_nanos(1));
                prop_assert!(shaper.reserve(cost, max_delay).is_err(), "1 ns before retry_after {:?}", retry_after);
            }
            Some(Err(ShapeError::Never { .. })) => {
                prop_assert!(u64::from(trace.last().unwrap().cost) > burst);
            }
            Some(Err(other)) => prop_assert!(false, "unexpected {:?}", other),
            None => {}
        }
    }
}

/// waiting.rs: "A cost that can never fit (above the capacity) returns
/// `WaitError::Never` at once" — on every limiter, blocking and async, and without a
/// single sleep.
#[test]
fn a_wait_that_can_never_fit_fails_at_once_without_sleeping() {
    let policy = Policy::per_second(3).unwrap();
    let clock = ManualClock::new();
    let gcra = RateLimiter::gcra_with_clock(policy, clock.clone());
    let fixed = RateLimiter::with_clock(FixedWindow::new(policy).unwrap(), clock.clone());
    let sliding = RateLimiter::with_clock(SlidingWindow::new(policy).unwrap(), clock.clone());
    let log = SlidingLog::with_clock(policy, clock.clone());
    let shaper = Shaper::with_clock(policy, clock.clone());
    let keyed = KeyedBuilder::new(Gcra::new(policy))
        .clock(clock.clone())
        .capacity(8)
        .build::<u64>()
        .unwrap();
    let keyed_window = KeyedBuilder::new(FixedWindow::new(policy).unwrap())
        .clock(clock.clone())
        .capacity(8)
        .build_inline::<u64>()
        .unwrap();
    let keyed_log = KeyedBuilder::default()
        .clock(clock.clone())
        .capacity(8)
        .sliding_log::<u64>(policy)
        .unwrap();
    let k = 1u64;
    let limits: [&(dyn Limit + Sync); 8] = [
        &gcra,
        &fixed,
        &sliding,
        &log,
        &shaper,
        &keyed.limit(&k),
        &keyed_window.limit(&k),
        &keyed_log.limit(&k),
    ];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    for (i, limit) in limits.iter().enumerate() {
        // Fill it first: a full limiter must not make the waiter sleep either.
        let _ = limit.check_n(3);
        let slept = AtomicU32::new(0);
        let r = limit.wait_with(4, Jitter::NONE, |_| {
            slept.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(r, Err(WaitError::Never { cost: 4 }), "limit {i}");
        assert_eq!(
            slept.load(Ordering::Relaxed),
            0,
            "limit {i} slept before saying never"
        );
        let r = rt.block_on(limit.until_ready_with(4, Jitter::NONE, |d: Duration| {
            slept.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(d)
        }));
        assert_eq!(r, Err(WaitError::Never { cost: 4 }), "limit {i} (async)");
        assert_eq!(
            slept.load(Ordering::Relaxed),
            0,
            "limit {i} slept before saying never (async)"
        );
        // Nothing was charged by the attempts.
        assert_eq!(limit.peek(0).remaining(), 0, "limit {i}");
    }
    assert_eq!(
        keyed.wait_key_with(&2, 4, Jitter::NONE, |_| panic!("slept")),
        Err(WaitError::Never { cost: 4 })
    );
}

proptest! {
    #![proptest_config(crate::common::cases(128))]

    /// `set_algorithm` / `SlidingLog::set_policy` change a limit at runtime ("keeping
    /// state as `carry_over` says"): the decisions after the change keep every
    /// `Decision` promise under the new policy — also where the carried state holds
    /// more than the new limit (a GCRA schedule past the new burst, a window count
    /// or a log over the new `L`).
    #[test]
    fn decisions_after_a_policy_change_keep_their_promises(
        limit in 1u64..7, burst in 1u64..8, p in period(),
        limit2 in 1u64..7, burst2 in 1u64..8, same_period in any::<bool>(),
        first in steps(8), second in steps(8),
    ) {
        let policy = Policy::new(limit, Duration::from_nanos(p)).unwrap();
        let p2 = if same_period { p } else { p * 2 };
        let policy2 = Policy::new(limit2, Duration::from_nanos(p2)).unwrap();
        let clock = ManualClock::new();
        // `run_trace` starts at 4·P: the second half starts later than the first ends.
        let later = |trace: &[Step]| -> Vec<Step> {
            let mut v = vec![Step { forward: 400_000, back: None, cost: 0 }];
            v.extend_from_slice(trace);
            v
        };
        let mut gcra = RateLimiter::gcra_with_clock(policy.with_burst(burst).unwrap(), clock.clone());
        run_trace(&gcra, burst, p, &first)?;
        gcra.set_policy(policy2.with_burst(burst2).unwrap());
        run_trace(&gcra, burst2, p2, &later(&second))?;
        let mut fixed = RateLimiter::with_clock(FixedWindow::new(policy).unwrap(), clock.clone());
        run_trace(&fixed, limit, p, &first)?;
        fixed.set_algorithm(FixedWindow::new(policy2).unwrap());
        run_trace(&fixed, limit2, p2, &later(&second))?;
        let mut sliding = RateLimiter::with_clock(SlidingWindow::new(policy).unwrap(), clock.clone());
        run_trace(&sliding, limit, p, &first)?;
        sliding.set_algorithm(SlidingWindow::new(policy2).unwrap());
        run_trace(&sliding, limit2, p2, &later(&second))?;
        // `LiveGcra`: the same change through `&self`.
        let live = RateLimiter::with_clock(floodgate::LiveGcra::new(policy.with_burst(burst).unwrap()), clock.clone());
        run_trace(&live, burst, p, &first)?;
        live.algorithm().set_policy(policy2.with_burst(burst2).unwrap());
        run_trace(&live, burst2, p2, &later(&second))?;
        let log = SlidingLog::with_clock(policy, clock);
        run_trace(&log, limit, p, &first)?;
        log.set_policy(policy2);
        run_trace(&log, limit2, p2, &later(&second))?;
    }
}

/// waiting.rs, `Wait`: "Each method returns the total time it slept (zero when
/// admitted at once)" — jitter included, for a booking (GCRA) and for check-and-sleep
/// (windows, the log).
#[test]
fn a_wait_returns_the_total_time_it_slept() {
    let policy = Policy::per_second(2).unwrap().with_burst(1).unwrap();
    let clock = ManualClock::new();
    let gcra = RateLimiter::gcra_with_clock(policy, clock.clone());
    let fixed = RateLimiter::with_clock(FixedWindow::new(policy).unwrap(), clock.clone());
    let sliding = RateLimiter::with_clock(SlidingWindow::new(policy).unwrap(), clock.clone());
    let log = SlidingLog::with_clock(policy, clock.clone());
    let limits: [&dyn Limit; 4] = [&gcra, &fixed, &sliding, &log];
    for (i, limit) in limits.iter().enumerate() {
        for jitter in [Jitter::NONE, Jitter::up_to(Duration::from_millis(7))] {
            for round in 0..5 {
                let mut total = Duration::ZERO;
                let r = limit.wait_with(1, jitter, |d| {
                    total += d;
                    clock.advance(d);
                });
                assert_eq!(r, Ok(total), "limit {i}, round {round}, {jitter:?}");
            }
        }
    }
    // Admitted at once: zero.
    clock.advance(Duration::from_secs(10));
    assert_eq!(
        gcra.wait_with(1, Jitter::NONE, |_| panic!("slept")),
        Ok(Duration::ZERO)
    );
}

/// keyed/mod.rs: "A denied or cost-0 request for an unknown key stores nothing, so it
/// inserts nothing"; `peek` "writes nothing and inserts no key" — every storage and
/// the keyed log.
#[test]
fn requests_that_take_nothing_insert_no_key() {
    let policy = Policy::per_second(3).unwrap();
    let clock = ManualClock::new();
    let heap = KeyedBuilder::new(Gcra::new(policy))
        .clock(clock.clone())
        .capacity(16)
        .build::<u64>()
        .unwrap();
    let inline = KeyedBuilder::new(FixedWindow::new(policy).unwrap())
        .clock(clock.clone())
        .capacity(16)
        .build_inline::<u64>()
        .unwrap();
    let fingerprint = KeyedBuilder::new(SlidingWindow::new(policy).unwrap())
        .clock(clock.clone())
        .capacity(16)
        .build_fingerprint::<u64>()
        .unwrap();
    let log = KeyedBuilder::default()
        .clock(clock.clone())
        .capacity(16)
        .sliding_log::<u64>(policy)
        .unwrap();
    for k in 0..10u64 {
        assert!(heap.peek(&k, 1).is_allowed());
        assert!(heap.check_n(&k, 0).is_allowed());
        assert!(!heap.check_n(&k, 4).is_allowed());
        assert!(!heap.charge(&k, 4).1.is_charged());
        assert!(inline.peek(&k, 1).is_allowed());
        assert!(inline.check_n(&k, 0).is_allowed());
        assert!(!inline.check_n(&k, 4).is_allowed());
        assert!(fingerprint.peek(&k, 1).is_allowed());
        assert!(fingerprint.check_n(&k, 0).is_allowed());
        assert!(!fingerprint.check_n(&k, 4).is_allowed());
        assert!(log.peek(&k, 1).is_allowed());
        assert!(log.check_n(&k, 0).is_allowed());
        assert!(!log.check_n(&k, 4).is_allowed());
    }
    assert_eq!(heap.metrics().live_keys, 0);
    assert_eq!(inline.metrics().live_keys, 0);
    assert_eq!(fingerprint.metrics().live_keys, 0);
    assert_eq!(log.metrics().live_keys, 0);
    assert_eq!(log.entries(), 0);
}

/// The numbers the keyed docs print: bytes per key, the shards' slack for uneven
/// hashing, the defaults and the largest capacity, and the shard count's rounding.
#[test]
fn the_keyed_tables_numbers_are_the_documented_ones() {
    let b = || KeyedBuilder::new(Gcra::new(Policy::per_second(1).unwrap()));
    // keyed/limiter.rs `memory_budget`: "≈ 21.8 bytes per key of capacity at 10^6
    // keys over 8 shards"; keyed/mod.rs: the same for inline storage.
    let bytes = b().capacity(1_000_000).shards(8).slot_bytes().unwrap();
    assert!(
        (21_750_000..21_850_000).contains(&bytes),
        "{bytes} bytes for 10^6 keys"
    );
    // `max_keys`: "none with one shard; 2.2 % at 125 000 keys per shard, 23 % at 1 250".
    let slack = |capacity: usize, shards: usize| {
        let l = b()
            .capacity(capacity)
            .shards(shards)
            .build_inline::<u64>()
            .unwrap();
        assert_eq!(l.shards(), shards);
        l.max_keys() as f64 / capacity as f64 - 1.0
    };
    assert_eq!(slack(100_000, 1), 0.0);
    let s = slack(1_000_000, 8);
    assert!(
        (0.0215..0.0225).contains(&s),
        "slack {s} at 125 000 keys per shard"
    );
    let s = slack(10_000, 8);
    assert!(
        (0.225..0.235).contains(&s),
        "slack {s} at 1 250 keys per shard"
    );
    // "sized so that `capacity` keys overflow no shard except with a chance below
    // 2^-40 (Bernstein's bound over every shard at once)": the slack is at least the
    // t that solves shards · exp(−t² / (2(μ + t/3))) = 2^-40, computed here in f64.
    for shards in [2usize, 4, 8, 64, 1024] {
        for share in [35usize, 100, 1_250, 12_500, 125_000] {
            let capacity = share * shards;
            let l = b()
                .capacity(capacity)
                .shards(shards)
                .build_inline::<u64>()
                .unwrap();
            let per_shard = (l.max_keys() / shards) as f64 - share as f64;
            let ln = (shards as f64).ln() + 40.0 * 2f64.ln();
            let mu = share as f64;
            let t = ln / 3.0 + (ln * ln / 9.0 + 2.0 * ln * mu).sqrt();
            let bound = shards as f64 * (-t * t / (2.0 * (mu + t / 3.0))).exp();
            assert!(bound <= 2f64.powi(-40) * 1.000_001);
            assert!(
                per_shard >= t && per_shard <= t * 1.01 + 2.0,
                "{shards} shards of {share}: slack {per_shard}, Bernstein needs {t}"
            );
        }
    }
    // `DEFAULT_CAPACITY`: 100 000 keys, "≈ 3.8 MB for u64 keys" (slots plus one
    // 16-byte entry per key); `DEFAULT_MEMORY_BUDGET`: 4 GiB, "enough for ≈ 200
    // million keys of capacity" (on up to 16 shards).
    assert_eq!(floodgate::DEFAULT_CAPACITY, 100_000);
    let d = KeyedBuilder::new(Gcra::new(Policy::per_second(1).unwrap()))
        .build::<u64>()
        .unwrap();
    let mb = (d.slot_bytes() + 16 * d.capacity()) as f64 / 1e6;
    assert!((3.7..3.95).contains(&mb), "{mb} MB by default");
    assert_eq!(floodgate::DEFAULT_MEMORY_BUDGET, 4 << 30);
    for shards in [1, 8, 16] {
        let need = b()
            .capacity(200_000_000)
            .shards(shards)
            .slot_bytes()
            .unwrap();
        assert!(
            need <= 4 << 30,
            "{need} bytes for 2·10^8 keys on {shards} shards"
        );
    }
    // `MAX_CAPACITY`: 2^32 keys, "its slot array alone takes ≈ 91.6 GB".
    assert_eq!(floodgate::MAX_CAPACITY, 1 << 32);
    let most = b().capacity(1 << 32).shards(1).slot_bytes().unwrap() as f64 / 1e9;
    assert!((91.5..91.7).contains(&most), "{most} GB");
    // Shards: "rounded up to a power of two and down to at most one per key of
    // capacity (default: 4 × available_parallelism(), at most one per 64 keys)".
    let shards = |capacity: usize, asked: Option<usize>| {
        let builder = b().capacity(capacity);
        let builder = match asked {
            Some(n) => builder.shards(n),
            None => builder,
        };
        builder.build_inline::<u64>().unwrap().shards()
    };
    assert_eq!(shards(100, Some(3)), 4);
    assert_eq!(shards(5, Some(64)), 4);
    assert_eq!(shards(1, Some(64)), 1);
    assert_eq!(shards(1_000, Some(1_000)), 512);
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let default = (4 * cores).next_power_of_two();
    assert_eq!(shards(1 << 20, None), default.min(1 << 14));
    assert_eq!(shards(128, None), 2);
    assert_eq!(shards(127, None), 1);
    // "… and at most 65 536": more shards asked for build the same slot arrays.
    let bytes = |n: usize| b().capacity(1 << 24).shards(n).slot_bytes().unwrap();
    assert_eq!(bytes(1 << 17), bytes(1 << 16));
    assert_eq!(bytes(usize::MAX), bytes(1 << 16));
    assert_ne!(bytes(1 << 16), bytes(1 << 15));
    // "Bytes of one slot, in every storage": the builder's figure is every table's.
    let want = b().capacity(3_000).shards(4).slot_bytes().unwrap();
    assert_eq!(
        b().capacity(3_000)
            .shards(4)
            .build::<u64>()
            .unwrap()
            .slot_bytes(),
        want
    );
    assert_eq!(
        b().capacity(3_000)
            .shards(4)
            .build_inline::<u64>()
            .unwrap()
            .slot_bytes(),
        want
    );
    let fp = b()
        .capacity(3_000)
        .shards(4)
        .build_fingerprint::<String>()
        .unwrap();
    assert_eq!(fp.slot_bytes(), want);
}

/// clock.rs: `DefaultClock` is "quanta's TSC, anchored once to the Unix epoch" and
/// `StdClock` is "anchored to the Unix epoch when created", so a per-minute fixed
/// window "starts on the minute" (fixed_window.rs). Checked against `SystemTime` with
/// a second of slack either way (an anchor off by any real amount — a boot-time
/// origin, a wrong unit — is off by far more).
#[test]
fn the_default_clocks_read_unix_time() {
    use floodgate::{Clock, DefaultClock, StdClock};
    let unix = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    };
    let second = 1_000_000_000;
    let tsc = DefaultClock::new();
    let std_clock = StdClock::new();
    for clock in [&tsc as &dyn Clock, &std_clock] {
        let before = unix();
        let now = clock.now().as_u64();
        let after = unix();
        assert!(
            before - second <= now && now <= after + second,
            "{now} not within a second of [{before}, {after}]"
        );
    }
    // A per-minute window on the default clock ends on the minute. `end` is placed
    // from `before`, so it is early by however long passed between `before` and the
    // check's own reading (at most `after − before`, however long this thread was
    // descheduled): the slack is a second plus that.
    let minute = RateLimiter::fixed_window(Policy::per_minute(10).unwrap()).unwrap();
    let before = unix();
    let d = minute.check();
    let after = unix();
    let end = before + d.reset_after_nanos();
    let off = (end % (60 * second)).min(60 * second - end % (60 * second));
    assert!(
        off <= second + (after - before),
        "the window ends {off} ns off the minute ({} ns around the check)",
        after - before
    );
}

proptest! {
    #![proptest_config(crate::common::cases(128))]

    /// keyed/mod.rs: after a removal in the shard at instant `R`, "every decision in
    /// the shard is made at `max(reading, R)`", "answered exactly as an unbounded map
    /// of un-keyed limiters would answer at that instant". So a decision read before
    /// `R` keeps every `Decision` promise counted from `R` (not from its reading: the
    /// clock has passed `R` already; keyed/mod.rs says so since this test). Every
    /// storage and the keyed log, one shard; the removals are of another key, at a
    /// clock set ahead of the readings.
    #[test]
    fn keyed_decisions_read_before_a_removal_keep_their_promises(
        limit in 1u64..6, burst in 1u64..7, p in period(), trace in steps(8),
        removals in prop::collection::vec(prop::option::weighted(0.3, 1u64..1_000), 40),
    ) {
        let policy = Policy::new(limit, Duration::from_nanos(p)).unwrap();
        let gcra = policy.with_burst(burst).unwrap();
        let clock = ManualClock::new();
        let inline = KeyedBuilder::new(Gcra::new(gcra)).clock(clock.clone()).capacity(64).shards(1)
            .build_inline::<u64>().unwrap();
        let heap = KeyedBuilder::new(SlidingWindow::new(policy).unwrap()).clock(clock.clone())
            .capacity(64).shards(1).build::<u64>().unwrap();
        let fixed = KeyedBuilder::new(FixedWindow::new(policy).unwrap()).clock(clock.clone())
            .capacity(64).shards(1).build_fingerprint::<u64>().unwrap();
        let log = KeyedBuilder::default().clock(clock.clone()).capacity(64).shards(1)
            .sliding_log::<u64>(policy).unwrap();
        let (key, other) = (7u64, 99u64);
        let mut t = 4 * p;
        let mut removed_at = 0u64;
        for (step, removal) in trace.iter().zip(&removals) {
            t += step.forward * p / 1_000;
            if let Some(back) = step.back {
                t -= back * (p / 2) / 1_000;
            }
            if let Some(ahead) = removal {
                // A removal at R = t + ahead·P/1000, in the key's shard.
                let r = t + ahead * p / 1_000;
                if floodgate::Clock::now(&clock).as_u64() < r {
                    clock.set(Nanos::new(r));
                }
                let _ = inline.check(&other);
                let _ = inline.remove(&other);
                let _ = heap.check(&other);
                let _ = heap.remove(&other);
                let _ = fixed.check(&other);
                let _ = fixed.remove(&other);
                let _ = log.check(&other);
                let _ = log.remove(&other);
                removed_at = removed_at.max(floodgate::Clock::now(&clock).as_u64());
            }
            let judged = t.max(removed_at);
            for (limit, cap) in [
                (&inline.limit(&key) as &dyn Limit, burst),
                (&heap.limit(&key), limit),
                (&fixed.limit(&key), limit),
                (&log.limit(&key), limit),
            ] {
                let peeked = limit.peek_at(Nanos::new(t), step.cost);
                let d = limit.check_n_at(Nanos::new(t), step.cost);
                prop_assert_eq!(peeked, d);
                decision_keeps_its_promises(limit, judged, step.cost, cap, d)?;
            }
        }
    }
}

/// lib.rs / README: "No input panics: policies are validated once, and the
/// arithmetic after that is bounded or saturating." Every public operation of every
/// limiter at the edges of its inputs — readings at 0 and the top of `u64` (in both
/// orders), costs up to `u32::MAX`, delays up to `Duration::MAX`, the largest and
/// smallest policies — and each decision still keeps its basic promises (the limit,
/// `remaining ≤ limit`, "never" exactly for a cost over the capacity, never looser at
/// the end of time). Meant for a debug build (overflow checks on):
/// `cargo test -p floodgate --test doc_claims no_input_panics`.
#[test]
fn no_input_panics_at_the_edges() {
    let max_span = floodgate::MAX_SPAN_NANOS;
    let policies = [
        Policy::new(1, Duration::from_nanos(1)).unwrap(),
        Policy::per_second(1_000_000_000).unwrap(),
        Policy::per_second(3).unwrap(),
        // L·T = 2^62 exactly, and a burst of 2^62 at T = 1 ns.
        Policy::new(1, Duration::from_nanos(max_span)).unwrap(),
        Policy::new(1 << 20, Duration::from_nanos(max_span)).unwrap(),
        Policy::new(2, Duration::from_nanos(2))
            .unwrap()
            .with_burst(max_span)
            .unwrap(),
        // The sliding counter's largest limit, at its shortest period.
        Policy::new((1 << 30) - 2, Duration::from_secs(365 * 86_400 / 8)).unwrap(),
    ];
    let readings = [
        0,
        1,
        999,
        u64::MAX / 2,
        u64::MAX - max_span,
        u64::MAX - 1,
        u64::MAX,
        0,
        u64::MAX,
        7,
    ];
    let costs = [0u32, 1, 2, 3, u32::MAX / 2, u32::MAX];
    let delays = [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_secs(1),
        Duration::MAX,
    ];
    let basic = |d: Decision, cost: u32, cap: u64| {
        assert_eq!(d.limit(), cap);
        assert!(d.remaining() <= cap);
        if u64::from(cost) > cap {
            assert!(!d.is_allowed() && d.retry_after().is_none(), "{d:?}");
        }
        if d.is_allowed() {
            assert_eq!(d.retry_after(), Some(Duration::ZERO));
        }
        let _ = (d.retry_after_secs(), d.reset_after_secs(), d.reset_after());
    };
    for policy in policies {
        let clock = ManualClock::new();
        let fixed = FixedWindow::new(policy).ok();
        let sliding = SlidingWindow::new(policy).ok();
        let mut gcra = RateLimiter::gcra_with_clock(policy, clock.clone());
        let twin = RateLimiter::locked_with_clock(Gcra::new(policy), clock.clone());
        let log = SlidingLog::with_clock(policy, clock.clone());
        let shaper = Shaper::with_clock(policy, clock.clone());
        let keyed = KeyedBuilder::new(Gcra::new(policy))
            .clock(clock.clone())
            .capacity(4)
            .shards(1)
            .build_inline::<u64>()
            .unwrap();
        let keyed_log = KeyedBuilder::default()
            .clock(clock.clone())
            .capacity(4)
            .shards(1)
            .sliding_log::<u64>(Policy::new(3, policy.period()).unwrap_or(policy))
            .ok();
        let fixed = fixed.map(|a| RateLimiter::with_clock(a, clock.clone()));
        let sliding = sliding.map(|a| {
            KeyedBuilder::new(a)
                .clock(clock.clone())
                .capacity(4)
                .shards(1)
                .build::<u64>()
                .unwrap()
        });
        let (b, l) = (policy.burst(), policy.limit());
        for &t in &readings {
            clock.set(Nanos::new(t));
            let now = Nanos::new(t);
            for &cost in &costs {
                for (limit, cap) in [
                    (&gcra as &dyn Limit, b),
                    (&twin, b),
                    (&log, l),
                    (&shaper, b),
                    (&keyed.limit(&1), b),
                ] {
                    basic(limit.peek_at(now, cost), cost, cap);
                    let (d, receipt) = limit.charge_at(now, cost);
                    basic(d, cost, cap);
                    let _ = limit.refund(receipt);
                    let _ = limit.book_at(now, cost);
                    basic(limit.check_n_at(now, cost), cost, cap);
                }
                if let Some(f) = &fixed {
                    basic(f.check_n_at(now, cost), cost, l);
                    let (_, r) = f.charge_at(now, cost);
                    let _ = f.refund(r);
                }
                if let Some(s) = &sliding {
                    basic(s.check_n_at(&2, now, cost), cost, l);
                    let (_, r) = s.charge_at(&2, now, cost);
                    let _ = s.refund(&2, r);
                    basic(s.peek_at(&3, now, cost), cost, l);
                }
                if let Some(k) = &keyed_log {
                    let (_, r) = k.charge_at(&2, now, cost);
                    let _ = k.refund(&2, r);
                    let _ = k.peek_at(&2, now, cost);
                }
                for &delay in &delays {
                    if let Ok(r) = shaper.reserve_at(now, cost, delay) {
                        let _ = (r.ready_at(), r.delay(), r.cost(), r.decision());
                        let _ = shaper.cancel_at(now, r);
                    }
                    if let Ok((_, _, r)) = keyed.reserve_at(&3, now, cost, delay) {
                        let _ = keyed.refund(&3, r);
                    }
                }
            }
            let _ = keyed.remove(&1);
            let _ = keyed.reclaim_idle();
            if let Some(k) = &keyed_log {
                let _ = k.remove(&2);
            }
            let _ = log.is_idle(now);
        }
        // A policy change at the top of time, then decisions on the new policy.
        gcra.set_policy(Policy::new(1, Duration::from_nanos(max_span)).unwrap());
        log.set_policy(Policy::per_second(1).unwrap());
        for &t in &readings {
            basic(gcra.check_n_at(Nanos::new(t), 1), 1, 1);
            basic(log.check_n_at(Nanos::new(t), 1), 1, 1);
        }
        gcra.reset();
        log.reset();
        shaper.reset();
    }
    // The end of time is never looser: a schedule that would pass u64::MAX is "never".
    let gcra = RateLimiter::gcra_with_clock(Policy::per_second(1).unwrap(), ManualClock::new());
    let top = Nanos::new(u64::MAX - 500_000_000);
    assert!(!gcra.check_n_at(top, 1).is_allowed());
    assert_eq!(gcra.check_n_at(top, 1).retry_after(), None);
}

/// receipt.rs: "A refund consumes its receipt (it is neither `Clone` nor `Copy`), so
/// a charge is given back at most once"; shaping.rs: a `Reservation` is handed to
/// `cancel` by value the same way. Checked at compile time: an inherent constant
/// that exists only for `Clone` types shadows the trait's `false`.
#[test]
fn receipts_and_reservations_cannot_be_copied() {
    use std::marker::PhantomData;
    trait NotClone {
        const CLONE: bool = false;
    }
    struct Probe<T>(PhantomData<T>);
    impl<T> NotClone for Probe<T> {}
    #[allow(dead_code)]
    impl<T: Clone> Probe<T> {
        const CLONE: bool = true;
    }
    // Evaluated at compile time: a `Clone` receipt or reservation fails the build.
    const {
        assert!(Probe::<u8>::CLONE, "the probe sees Clone types");
        assert!(!Probe::<floodgate::Receipt>::CLONE, "Receipt is Clone");
        assert!(
            !Probe::<floodgate::Reservation>::CLONE,
            "Reservation is Clone"
        );
    }
}

/// shaping.rs: "Two reservations are equal only if the same shaper granted the same
/// slot" — two shapers alike in everything hand out unequal reservations, and a
/// reset shaper's new reservation for the same slot is not the old one.
#[test]
fn reservations_are_equal_only_for_the_same_shaper_and_slot() {
    let policy = Policy::per_second(1).unwrap();
    let clock = ManualClock::new();
    let a = Shaper::with_clock(policy, clock.clone());
    let b = Shaper::with_clock(policy, clock.clone());
    let now = Nanos::from_secs(5);
    let ra = a.reserve_at(now, 1, Duration::ZERO).unwrap();
    let rb = b.reserve_at(now, 1, Duration::ZERO).unwrap();
    assert_eq!(ra.ready_at(), rb.ready_at());
    assert_ne!(ra, rb, "two shapers' reservations of one slot are equal");
    // Another's reservation gives back nothing.
    assert_eq!(a.cancel_at(now, rb), 0);
    let later = a.reserve_at(now, 1, Duration::from_secs(5)).unwrap();
    assert_ne!(ra, later);
    assert_eq!(a.cancel_at(now, later), 1);
}

proptest! {
    #![proptest_config(crate::common::cases(256))]

    /// keyed/limiter.rs `reserve`: "`Shaper::reserve` for one key of many … Slots of
    /// one key are handed out first come, first served; keys do not wait for each
    /// other" — each key's reservations (decision, delay, `TooLong`'s `retry_after`,
    /// `Never`) equal those of a `Shaper` of its own, on every storage.
    #[test]
    fn keyed_reservations_are_one_shaper_per_key(
        limit in 1u64..5, burst in 1u64..5, p in period(),
        ops in prop::collection::vec((0u64..2, 0u64..1_500, 0u32..6, 0u64..4), 1..40),
    ) {
        let policy = Policy::new(limit, Duration::from_nanos(p)).unwrap().with_burst(burst).unwrap();
        let clock = ManualClock::new();
        let heap = KeyedBuilder::new(Gcra::new(policy)).clock(clock.clone()).capacity(8)
            .build::<u64>().unwrap();
        let inline = KeyedBuilder::new(Gcra::new(policy)).clock(clock.clone()).capacity(8)
            .build_inline::<u64>().unwrap();
        let shapers = [Shaper::with_clock(policy, clock.clone()), Shaper::with_clock(policy, clock.clone())];
        let mut t = 4 * p;
        for (key, forward, cost, slots) in ops {
            t += forward * p / 1_000;
            let now = Nanos::new(t);
            let max_delay = Duration::from_nanos(slots * policy.interval_nanos());
            let want = shapers[key as usize].reserve_at(now, cost, max_delay)
                .map(|r| (r.decision(), r.delay()));
            for got in [
                heap.reserve_at(&key, now, cost, max_delay),
                inline.reserve_at(&key, now, cost, max_delay),
            ] {
                let got = got.map(|(d, delay, _)| (d, delay));
                prop_assert_eq!(&got, &want, "key {} cost {} at {}", key, cost, t);
            }
        }
    }
}

proptest! {
    #![proptest_config(crate::common::cases(2_000))]

    /// policy.rs: "after construction `L·T ≤ 2^62` and `B·T ≤ 2^62` hold"; `T = ⌈P/L⌉`
    /// "means the sustained rate `1/T` is never above the stated `L/P`", below it by
    /// a relative error under `1/T`; and `Policy::new` / `with_burst` fail exactly for
    /// the documented reasons (a zero field, `L > P` ns, a span over 2^62 ns), each
    /// error naming the field and the value.
    #[test]
    fn a_policy_is_valid_exactly_when_the_docs_say(
        limit in prop_oneof![Just(0u64), 1u64..100, any::<u64>(), Just(1u64 << 62)],
        period in prop_oneof![Just(0u64), 1u64..1_000, any::<u64>(), Just(1u64 << 62)],
        burst in prop_oneof![Just(0u64), 1u64..100, any::<u64>(), Just(1u64 << 62)],
    ) {
        let max = u128::from(floodgate::MAX_SPAN_NANOS);
        prop_assert_eq!(max, 1u128 << 62);
        let got = Policy::new(limit, Duration::from_nanos(period)).and_then(|p| p.with_burst(burst));
        let t = if limit == 0 { 0 } else { period.div_ceil(limit) };
        let reason: Option<&str> = if limit == 0 {
            Some("limit must be at least 1 (got 0)")
        } else if period == 0 {
            Some("period must be at least 1 (got 0)")
        } else if limit > period {
            Some("spaces units less than 1 ns apart")
        } else if u128::from(limit) * u128::from(t) > max {
            Some("limit")
        } else if burst == 0 {
            Some("burst must be at least 1 (got 0)")
        } else if u128::from(burst) * u128::from(t) > max {
            Some("burst")
        } else {
            None
        };
        match (got, reason) {
            (Ok(p), None) => {
                prop_assert_eq!((p.limit(), p.period_nanos(), p.burst()), (limit, period, burst));
                prop_assert_eq!(p.interval_nanos(), t);
                prop_assert!(u128::from(p.limit()) * u128::from(t) <= max);
                prop_assert!(u128::from(p.burst()) * u128::from(t) <= max);
                // 1/T ≤ L/P, and (T − P/L)/T < 1/T, i.e. T·L − P < L.
                prop_assert!(u128::from(t) * u128::from(limit) >= u128::from(period));
                prop_assert!(u128::from(t) * u128::from(limit) - u128::from(period) < u128::from(limit));
            }
            (Err(e), Some(why)) => {
                let text = e.to_string();
                prop_assert!(text.starts_with("invalid policy: "), "{}", text);
                prop_assert!(text.contains(why), "{} should say {}", text, why);
                if why == "limit" || why == "burst" {
                    let value = if why == "limit" { limit } else { burst };
                    prop_assert!(text.contains(&format!("{why} {value} ")), "{}", text);
                    prop_assert!(text.contains("exceeds 2^62 ns"), "{}", text);
                }
            }
            (got, reason) => prop_assert!(false, "{:?} where the docs say {:?}", got, reason),
        }
    }
}

/// A manual clock that counts its readings.
#[derive(Clone, Default)]
struct CountingClock {
    inner: ManualClock,
    reads: std::sync::Arc<AtomicU32>,
}

impl floodgate::Clock for CountingClock {
    fn now(&self) -> Nanos {
        self.reads.fetch_add(1, Ordering::Relaxed);
        floodgate::Clock::now(&self.inner)
    }
}

impl CountingClock {
    /// Readings since the last call.
    fn take(&self) -> u32 {
        self.reads.swap(0, Ordering::Relaxed)
    }
}

/// README: "A decision costs one clock read"; clock.rs: "A decision costs exactly one
/// clock read"; limiter.rs: "Each decision reads the clock once" — checks, peeks,
/// charges and refunds, admitted or denied, on every limiter that reads a clock.
#[test]
fn a_decision_reads_the_clock_once() {
    let policy = Policy::per_second(2).unwrap();
    let clock = CountingClock::default();
    clock.inner.set(Nanos::from_secs(100));
    let gcra = RateLimiter::gcra_with_clock(policy, clock.clone());
    let twin = RateLimiter::locked_with_clock(Gcra::new(policy), clock.clone());
    let fixed = RateLimiter::with_clock(FixedWindow::new(policy).unwrap(), clock.clone());
    let sliding = RateLimiter::with_clock(SlidingWindow::new(policy).unwrap(), clock.clone());
    let log = SlidingLog::with_clock(policy, clock.clone());
    let shaper = Shaper::with_clock(policy, clock.clone());
    let heap = KeyedBuilder::new(Gcra::new(policy))
        .clock(clock.clone())
        .capacity(8)
        .build::<u64>()
        .unwrap();
    let inline = KeyedBuilder::new(FixedWindow::new(policy).unwrap())
        .clock(clock.clone())
        .capacity(8)
        .build_inline::<u64>()
        .unwrap();
    let keyed_log = KeyedBuilder::default()
        .clock(clock.clone())
        .capacity(8)
        .sliding_log::<u64>(policy)
        .unwrap();
    let _ = clock.take();
    let mut failures = Vec::new();
    let mut expect_one = |what: &str, reads: u32| {
        if reads != 1 {
            failures.push(format!("{what}: {reads} clock reads"));
        }
    };
    for round in 0..4 {
        // Rounds 0 and 1 admit; 2 and 3 are denied (a burst of 2).
        let _ = gcra.check();
        expect_one(
            &format!("RateLimiter<Gcra>::check, round {round}"),
            clock.take(),
        );
        let _ = twin.check();
        expect_one(
            &format!("LockedRateLimiter::check, round {round}"),
            clock.take(),
        );
        let _ = fixed.check();
        expect_one(
            &format!("RateLimiter<FixedWindow>::check, round {round}"),
            clock.take(),
        );
        let _ = sliding.check();
        expect_one(
            &format!("RateLimiter<SlidingWindow>::check, round {round}"),
            clock.take(),
        );
        let _ = log.check();
        expect_one(&format!("SlidingLog::check, round {round}"), clock.take());
        let _ = shaper.reserve(1, Duration::ZERO);
        expect_one(&format!("Shaper::reserve, round {round}"), clock.take());
        let _ = heap.check(&1);
        expect_one(
            &format!("KeyedLimiter<Heap>::check, round {round}"),
            clock.take(),
        );
        let _ = inline.check(&1);
        expect_one(
            &format!("KeyedLimiter<Inline>::check, round {round}"),
            clock.take(),
        );
        let _ = keyed_log.check(&1);
        expect_one(
            &format!("KeyedSlidingLog::check, round {round}"),
            clock.take(),
        );
        let _ = gcra.peek(1);
        expect_one("RateLimiter::peek", clock.take());
        let _ = heap.peek(&1, 1);
        expect_one("KeyedLimiter<Heap>::peek", clock.take());
        let _ = inline.peek(&2, 1);
        expect_one("KeyedLimiter<Inline>::peek of an unknown key", clock.take());
        let _ = keyed_log.peek(&2, 1);
        expect_one("KeyedSlidingLog::peek of an unknown key", clock.take());
    }
    // A refund reads the clock once, after loading the state.
    clock.inner.advance(Duration::from_secs(10));
    let (_, r) = gcra.charge(1);
    let _ = clock.take();
    let _ = gcra.refund(r);
    expect_one("RateLimiter::refund", clock.take());
    let (_, r) = heap.charge(&5, 1);
    let _ = clock.take();
    let _ = heap.refund(&5, r);
    expect_one("KeyedLimiter::refund", clock.take());
    let (_, r) = log.charge(1);
    let _ = clock.take();
    let _ = log.refund(r);
    expect_one("SlidingLog::refund", clock.take());
    assert!(failures.is_empty(), "{failures:#?}");
}

proptest! {
    #![proptest_config(crate::common::cases(256))]

    /// limiter.rs `book_at`: "Books `cost` units at the earliest instant they fit,
    /// however far ahead … the decision (denied only for "never"), the delay until
    /// the booked slot" — the delay is what a check's `retry_after` said just before
    /// (zero when the check would admit), on every limit that books (GCRA, its twin,
    /// `LiveGcra`, the shaper, keyed GCRA); the windows and the log do not book.
    #[test]
    fn a_booking_is_the_earliest_slot(
        limit in 1u64..5, burst in 1u64..5, p in period(),
        ops in prop::collection::vec((any::<bool>(), 0u64..1_500, 0u32..6), 1..40),
    ) {
        let policy = Policy::new(limit, Duration::from_nanos(p)).unwrap().with_burst(burst).unwrap();
        let clock = ManualClock::new();
        let gcra = RateLimiter::gcra_with_clock(policy, clock.clone());
        let twin = RateLimiter::locked_with_clock(Gcra::new(policy), clock.clone());
        let live = RateLimiter::with_clock(floodgate::LiveGcra::new(policy), clock.clone());
        let shaper = Shaper::with_clock(policy, clock.clone());
        let keyed = KeyedBuilder::new(Gcra::new(policy)).clock(clock.clone()).capacity(8)
            .build_inline::<u64>().unwrap();
        let fixed = RateLimiter::with_clock(FixedWindow::new(policy).unwrap(), clock.clone());
        let log = SlidingLog::with_clock(policy, clock.clone());
        prop_assert!(fixed.book_at(Nanos::new(1), 1).is_none());
        prop_assert!(log.book_at(Nanos::new(1), 1).is_none());
        let limits: [&dyn Limit; 5] = [&gcra, &twin, &live, &shaper, &keyed.limit(&3)];
        let mut t = 4 * p;
        for (book, forward, cost) in ops {
            t += forward * p / 1_000;
            let now = Nanos::new(t);
            for (i, limit) in limits.iter().enumerate() {
                if !book {
                    let _ = limit.check_n_at(now, cost);
                    continue;
                }
                let asked = limit.peek_at(now, cost);
                let (d, wait, receipt) = limit.book_at(now, cost).expect("GCRA books");
                if u64::from(cost) > burst {
                    prop_assert!(!d.is_allowed() && d.retry_after().is_none(), "limit {}", i);
                    prop_assert!(!receipt.is_charged());
                    continue;
                }
                prop_assert!(d.is_allowed(), "limit {}: a booking denied for a cost that fits: {:?}", i, d);
                let want = asked.retry_after().expect("fits");
                prop_assert_eq!(wait, want, "limit {}: booked {:?} where a check said {:?}", i, wait, asked);
                prop_assert_eq!(receipt.is_charged(), cost > 0);
            }
        }
    }
}

/// decision.rs: `Decision` is "Equal when every observable number and the policy id
/// are equal (`remaining` compared as derived)", and `Decision::new` ("as a backend
/// reports it") clamps `remaining` to `[0, limit]` and forces `retry_after` to zero
/// when allowed: a backend's decision rebuilt from a limiter's numbers equals it.
#[test]
fn decisions_are_equal_by_what_they_say() {
    let clock = ManualClock::new();
    let gcra = RateLimiter::gcra_with_clock(Policy::per_second(3).unwrap(), clock.clone());
    let log = SlidingLog::with_clock(Policy::per_second(3).unwrap(), clock.clone());
    clock.advance(Duration::from_millis(1_234));
    for d in [
        gcra.check(),
        gcra.check_n(2),
        gcra.check(),
        log.check_n(3),
        log.check(),
        gcra.check_n(4),
    ] {
        let rebuilt = Decision::new(
            d.is_allowed(),
            d.limit(),
            d.remaining(),
            d.reset_after(),
            d.retry_after(),
        );
        assert_eq!(
            rebuilt, d,
            "GCRA stores nanoseconds of headroom, Decision::new units"
        );
        assert_ne!(rebuilt.with_policy(floodgate::PolicyId::new(1)), d);
    }
    let clamped = Decision::new(true, 5, 9, Duration::ZERO, Some(Duration::from_secs(3)));
    assert_eq!(
        (clamped.remaining(), clamped.retry_after()),
        (5, Some(Duration::ZERO))
    );
    let never = Decision::new(false, 5, 0, Duration::ZERO, None);
    assert_eq!(
        (never.retry_after(), never.retry_after_secs()),
        (None, None)
    );
}

/// lib.rs: "Every algorithm is a pure transition over a `Copy` state that packs into
/// 64 bits"; README: "one word (64 bits …)", a `Decision` "still 48 bytes and `Copy`".
#[test]
fn states_are_one_word_and_decisions_48_bytes() {
    fn copy<T: Copy>() {}
    copy::<floodgate::GcraState>();
    copy::<floodgate::FixedWindowState>();
    copy::<floodgate::SlidingWindowState>();
    copy::<Decision>();
    assert_eq!(std::mem::size_of::<floodgate::GcraState>(), 8);
    assert_eq!(std::mem::size_of::<floodgate::FixedWindowState>(), 8);
    assert_eq!(std::mem::size_of::<floodgate::SlidingWindowState>(), 8);
    assert_eq!(std::mem::size_of::<Decision>(), 48);
}
