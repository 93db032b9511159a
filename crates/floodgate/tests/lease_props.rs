//! The leased hot-key mode against its stated bound, on random traces (shards, costs,
//! clock steps, lease sizes and lifetimes) under a manual clock:
//!
//! * over every interval `[a, b]` of the trace it admits at most
//!   `B + ⌊(b − a)/T⌋ + units on lease at a`;
//! * it denies only when a plain GCRA charged with the same admissions (at the
//!   instants they were admitted) would have fewer than `cost + units held in leases`
//!   available: the under-admission is the stranded units (checked on traces where no
//!   lease expires, so every unit taken from the central word is admitted or held).
#![cfg(not(loom))]

mod common;

use common::{denied_for_stranded_units, lease_builder, Plain};
use floodgate::reference::ExactGcra;
use floodgate::{LeasedGcra, ManualClock, Policy};
use proptest::prelude::*;
use std::time::Duration;

/// One millisecond per unit: T is exact.
const T: u64 = 1_000_000;

#[derive(Clone, Debug)]
struct Step {
    advance: u64,
    shard: usize,
    cost: u32,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (prop_oneof![Just(0u64), 0..3 * T], 0usize..4, 0u32..4).prop_map(
            |(advance, shard, cost)| Step {
                advance,
                shard,
                cost,
            },
        ),
        1..120,
    )
}

struct Run {
    /// (time, admitted units, units on lease just before) per step.
    trace: Vec<(u64, u64, u64)>,
}

fn run(
    burst: u64,
    lease: u32,
    shards: usize,
    lifetime: Duration,
    steps: &[Step],
    mut on_denial: impl FnMut(&LeasedGcra<ManualClock>, u64, u32, &Plain),
) -> Run {
    let clock = ManualClock::new();
    let mut limiter = lease_builder(burst, lease, shards, lifetime)
        .build_with_clock(clock.clone())
        .unwrap();
    let mut model = Plain {
        burst,
        interval: T,
        tat: 0,
    };
    let mut trace = Vec::new();
    let mut now = 0u64;
    for step in steps {
        now += step.advance;
        clock.advance(Duration::from_nanos(step.advance));
        let on_lease = limiter.units_on_lease();
        let d = limiter.check_on(step.shard, step.cost);
        if d.is_allowed() {
            assert!(d.remaining() <= burst && d.limit() == burst);
            model.charge(now, step.cost);
            trace.push((now, u64::from(step.cost), on_lease));
        } else {
            on_denial(&limiter, now, step.cost, &model);
            trace.push((now, 0, on_lease));
        }
    }
    Run { trace }
}

proptest! {
    #![proptest_config(crate::common::cases(256))]

    #[test]
    fn admits_at_most_the_central_gcra_plus_the_units_on_lease(
        burst in 1u64..24,
        lease_pick in 1u32..24,
        shards in 1usize..5,
        lifetime_ms in prop_oneof![Just(1u64), Just(2), Just(1_000)],
        steps in steps(),
    ) {
        let lease = lease_pick.min(burst as u32);
        let run = run(burst, lease, shards, Duration::from_millis(lifetime_ms), &steps, |_, _, _, _| {});
        let trace = &run.trace;
        for i in 0..trace.len() {
            let (a, _, on_lease) = trace[i];
            let mut admitted = 0u64;
            for &(b, units, _) in &trace[i..] {
                admitted += units;
                let bound = burst + (b - a) / T + on_lease;
                prop_assert!(
                    admitted <= bound,
                    "admitted {admitted} in [{a}, {b}] > {burst} + {} + {on_lease}",
                    (b - a) / T
                );
            }
            prop_assert!(on_lease <= shards.next_power_of_two() as u64 * u64::from(lease));
        }
    }

    #[test]
    fn denies_only_for_want_of_units_stranded_in_leases(
        burst in 1u64..24,
        lease_pick in 1u32..24,
        shards in 1usize..5,
        steps in steps(),
    ) {
        let lease = lease_pick.min(burst as u32);
        // A lifetime longer than any trace: nothing expires, every unit taken from the
        // central word is either admitted or still held.
        run(burst, lease, shards, Duration::from_secs(3_600), &steps, denied_for_stranded_units);
    }
}

#[test]
fn one_shard_with_leases_of_one_is_exactly_gcra() {
    let clock = ManualClock::new();
    let mut limiter =
        LeasedGcra::builder(Policy::per_second(1_000).unwrap().with_burst(5).unwrap())
            .shards(1)
            .lease_size(1)
            .build_with_clock(clock.clone())
            .unwrap();
    let mut model = ExactGcra::new(1_000, 1_000_000_000, 5).unwrap();
    let mut now = 0;
    for i in 0..200u64 {
        let step = (i * 7919) % 2_300_000;
        now += step;
        clock.advance(Duration::from_nanos(step));
        let cost = (i % 3) as u32;
        let ours = limiter.check_on(0, cost);
        let theirs = model.check(now, cost);
        assert_eq!(ours.is_allowed(), theirs.is_allowed(), "step {i}");
        if !ours.is_allowed() {
            assert_eq!(ours.retry_after(), theirs.retry_after(), "step {i}");
        }
    }
}
