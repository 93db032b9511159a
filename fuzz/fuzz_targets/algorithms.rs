//! Differential fuzzing of every word-sized algorithm: the atomic cell, the mutex twin
//! and the naive reference model must give equal decisions for any sequence of checks,
//! peeks, clock jumps (both ways) and policy changes that the constructors accept; no
//! operation may panic or overflow (this profile keeps overflow checks on).
#![no_main]

use arbitrary::Arbitrary;
use floodgate::reference::ExactGcra;
use floodgate::{Algorithm, AtomicCell, Gcra, LockedCell, Nanos, Policy, StateCell};
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
});

fn gcra(policy: Policy, start: u64, ops: &[Op]) {
    let mut alg = Gcra::new(policy);
    let atomic = AtomicCell::fresh();
    let locked = LockedCell::fresh();
    let mut model = ExactGcra::new(policy.limit(), policy.period_nanos(), policy.burst());
    let mut now = start;
    for op in ops {
        match *op {
            Op::Advance(d) => now = now.saturating_add(d),
            Op::Back(d) => now = now.saturating_sub(u64::from(d)),
            Op::Reconfigure(rate) => {
                if let Some(p) = rate.policy() {
                    alg = Gcra::new(p);
                    model.set_policy(p.limit(), p.period_nanos(), p.burst());
                }
            }
            Op::Check(cost) => {
                let t = Nanos::new(now);
                let a = atomic.apply(&alg, t, cost);
                let l = locked.apply(&alg, t, cost);
                let m = model.check(now, cost);
                assert_eq!(a, m, "atomic vs model: {op:?} at {now}");
                assert_eq!(l, m, "twin vs model: {op:?} at {now}");
                assert_eq!(StateCell::<_>::load(&atomic), locked.load());
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
