//! Differential fuzzing of every algorithm: GCRA, the fixed window and the sliding
//! window counter (atomic cell, mutex twin and naive reference model), and the sliding
//! log (against its plain-`Vec` model) must give equal decisions for any sequence of checks,
//! peeks, clock jumps (both ways) and policy changes that the constructors accept; no
//! operation may panic or overflow (this profile keeps overflow checks on).
#![no_main]

use arbitrary::Arbitrary;
use floodgate::reference::{ExactFixedWindow, ExactGcra, ExactSlidingLog, ExactSlidingWindow};
use floodgate::{
    Algorithm, AtomicCell, Decision, FixedWindow, Gcra, LockedCell, ManualClock, Nanos, Policy,
    PolicyError, SlidingLog, SlidingWindow, StateCell, YEAR_NANOS,
};
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

#[derive(Arbitrary, Debug, Clone, Copy)]
struct Rate {
    limit: u64,
    period: u64,
    burst: u64,
}

impl Rate {
    fn policy(self) -> Option<Policy> {
        Policy::new(self.limit, Duration::from_nanos(self.period))
            .and_then(|p| p.with_burst(self.burst))
            .ok()
    }
}

#[derive(Arbitrary, Debug)]
enum Op {
    Check(u32),
    Peek(u32),
    Advance(u64),
    Back(u32),
    Reconfigure(Rate),
}

#[derive(Arbitrary, Debug)]
struct Input {
    rate: Rate,
    start: u64,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let Some(policy) = input.rate.policy() else {
        return;
    };
    gcra(policy, input.start, &input.ops);
    windows(
        policy,
        input.start,
        &input.ops,
        FixedWindow::new,
        |p| ExactFixedWindow::new(p.limit(), p.period_nanos()).expect("numbers a Policy accepted"),
        ExactFixedWindow::check,
        ExactFixedWindow::peek,
    );
    windows(
        policy,
        input.start,
        &input.ops,
        SlidingWindow::new,
        |p| {
            ExactSlidingWindow::new(p.limit(), p.period_nanos()).expect("numbers a Policy accepted")
        },
        ExactSlidingWindow::check,
        ExactSlidingWindow::peek,
    );
    sliding_log(policy, input.start, &input.ops);
});

/// Window indices wrap (by design, see `floodgate::window`) only after a key is idle
/// for a year; the models never wrap. Readings stay within half a year of each other.
struct Span {
    lo: u64,
    now: u64,
}

impl Span {
    fn new(start: u64) -> Span {
        let lo = start.min(u64::MAX - YEAR_NANOS / 2);
        Span { lo, now: lo }
    }

    fn apply(&mut self, op: &Op) {
        let hi = self.lo + YEAR_NANOS / 2;
        match *op {
            Op::Advance(d) => self.now = self.now.saturating_add(d).min(hi),
            Op::Back(d) => self.now = self.now.saturating_sub(u64::from(d)).max(self.lo),
            _ => {}
        }
    }
}

/// One check of `cost` at `now` on the atomic cell and on the mutex twin: both must
/// decide as the model did (`model`, for `op`) and hold equal states after.
fn check_cells<A: Algorithm>(
    alg: &A,
    atomic: &AtomicCell<A::State>,
    locked: &LockedCell<A::State>,
    now: u64,
    cost: u32,
    model: Decision,
    op: &Op,
) {
    let t = Nanos::new(now);
    let a = atomic.apply(alg, t, cost);
    let l = locked.apply(alg, t, cost);
    assert_eq!(a, model, "atomic vs model: {op:?} at {now}");
    assert_eq!(l, model, "twin vs model: {op:?} at {now}");
    assert_eq!(StateCell::<_>::load(atomic), locked.load());
}

/// A window algorithm: atomic cell, mutex twin and model on the same operations. A
/// policy change starts the windows fresh (the engine's rule for windows).
fn windows<A: Algorithm, M>(
    policy: Policy,
    start: u64,
    ops: &[Op],
    build: impl Fn(Policy) -> Result<A, PolicyError>,
    exact: impl Fn(Policy) -> M,
    check: impl Fn(&mut M, u64, u32) -> Decision,
    peek: impl Fn(&M, u64, u32) -> Decision,
) {
    let Ok(mut alg) = build(policy) else {
        return;
    };
    let mut atomic = AtomicCell::fresh();
    let mut locked = LockedCell::fresh();
    let mut model = exact(policy);
    let mut span = Span::new(start);
    for op in ops {
        span.apply(op);
        let now = span.now;
        let t = Nanos::new(now);
        match *op {
            Op::Advance(_) | Op::Back(_) => {}
            Op::Reconfigure(rate) => {
                if let Some(p) = rate.policy() {
                    if let Ok(next) = build(p) {
                        alg = next;
                        atomic = AtomicCell::fresh();
                        locked = LockedCell::fresh();
                        model = exact(p);
                    }
                }
            }
            Op::Check(cost) => {
                let m = check(&mut model, now, cost);
                check_cells(&alg, &atomic, &locked, now, cost, m, op);
            }
            Op::Peek(cost) => {
                let a = alg.decide(atomic.load(), t, cost).0;
                assert_eq!(a, peek(&model, now, cost), "peek vs model: {op:?} at {now}");
            }
        }
    }
}

/// The sliding log against its plain-`Vec` model (policies with small limits: the
/// model stores one timestamp per unit).
fn sliding_log(policy: Policy, start: u64, ops: &[Op]) {
    if policy.limit() > 1 << 12 {
        return;
    }
    let mut limit = policy.limit();
    let mut log = SlidingLog::with_clock(policy, ManualClock::new());
    let mut model = ExactSlidingLog::new(policy.limit(), policy.period_nanos())
        .expect("numbers a Policy accepted");
    let mut now = start;
    for op in ops {
        match *op {
            Op::Advance(d) => now = now.saturating_add(d),
            Op::Back(d) => now = now.saturating_sub(u64::from(d)),
            Op::Reconfigure(rate) => {
                if let Some(p) = rate.policy().filter(|p| p.limit() <= 1 << 12) {
                    limit = p.limit();
                    log = SlidingLog::with_clock(p, ManualClock::new());
                    model = ExactSlidingLog::new(p.limit(), p.period_nanos())
                        .expect("numbers a Policy accepted");
                }
            }
            Op::Check(cost) => {
                let d = log.check_n_at(Nanos::new(now), cost);
                assert_eq!(d, model.check(now, cost), "log vs model: {op:?} at {now}");
                assert!(log.entries() as u64 <= limit);
            }
            Op::Peek(cost) => {
                let d = log.peek_at(Nanos::new(now), cost);
                assert_eq!(
                    d,
                    model.peek(now, cost),
                    "log peek vs model: {op:?} at {now}"
                );
            }
        }
    }
}

fn gcra(policy: Policy, start: u64, ops: &[Op]) {
    let mut alg = Gcra::new(policy);
    let atomic = AtomicCell::fresh();
    let locked = LockedCell::fresh();
    let mut model = ExactGcra::new(policy.limit(), policy.period_nanos(), policy.burst())
        .expect("numbers a Policy accepted");
    let mut now = start;
    for op in ops {
        match *op {
            Op::Advance(d) => now = now.saturating_add(d),
            Op::Back(d) => now = now.saturating_sub(u64::from(d)),
            Op::Reconfigure(rate) => {
                if let Some(p) = rate.policy() {
                    alg = Gcra::new(p);
                    model
                        .set_policy(p.limit(), p.period_nanos(), p.burst())
                        .expect("numbers a Policy accepted");
                }
            }
            Op::Check(cost) => {
                let m = model.check(now, cost);
                check_cells(&alg, &atomic, &locked, now, cost, m, op);
            }
            Op::Peek(cost) => {
                let t = Nanos::new(now);
                let a = alg.decide(atomic.load(), t, cost).0;
                let m = model.peek(now, cost);
                assert_eq!(a, m, "peek vs model: {op:?} at {now}");
            }
        }
    }
}
