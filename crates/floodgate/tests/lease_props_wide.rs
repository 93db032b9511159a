//! Property tests of the lease modes over wider traces than `lease_props` and
//! `keyed_hot`: bursts up to 300, `u32::MAX` costs, shard numbers past the count,
//! one-tick lifetimes, sub-tick clock steps and clocks that start late.
#![cfg(not(loom))]

mod common;

use std::time::Duration;

use floodgate::{
    Clock, HotKeyLimiter, HotKeys, Inline, KeyedBuilder, LeasedGcra, ManualClock, Nanos, Policy,
};
use proptest::prelude::*;

const T: u64 = 1_000_000; // 1 ms per unit

#[derive(Clone, Debug)]
struct Step {
    advance: u64,
    shard: usize,
    cost: u32,
}

fn cost(burst: u64) -> impl Strategy<Value = u32> {
    let b = burst as u32;
    prop_oneof![
        2 => Just(0u32),
        10 => 1..=b.max(1),
        1 => b..=b + 2,
        1 => Just(u32::MAX),
        1 => Just(u32::MAX - 1),
    ]
}

fn steps(burst: u64) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (
            prop_oneof![4 => Just(0u64), 2 => 0..70_000u64, 3 => 0..3 * T, 1 => 0..200 * T],
            prop_oneof![8 => 0usize..9, 1 => Just(usize::MAX), 1 => Just(1usize << 40)],
            cost(burst),
        )
            .prop_map(|(advance, shard, cost)| Step {
                advance,
                shard,
                cost,
            }),
        1..160,
    )
}

proptest! {
    #![proptest_config(crate::common::cases(400))]

    /// The lease bound with any cost (u32::MAX included), any shard number, tiny
    /// lifetimes (one expiry tick) and sub-tick clock steps.
    #[test]
    fn lease_bound_with_extreme_costs_shards_and_lifetimes(
        (burst, steps) in (1u64..300).prop_flat_map(|b| (Just(b), steps(b))),
        lease_pick in 1u32..300,
        shards in 1usize..9,
        lifetime_ns in prop_oneof![Just(65_536u64), Just(65_537), Just(131_071), Just(T), Just(3 * T), Just(1_000 * T)],
        start in prop_oneof![Just(0u64), Just(65_535), Just(1 << 40)],
    ) {
        let lease = lease_pick.min(burst as u32);
        let clock = ManualClock::starting_at(Nanos::new(start));
        let mut limiter = LeasedGcra::builder(
            Policy::per_second(1_000).unwrap().with_burst(burst).unwrap(),
        )
        .shards(shards)
        .lease_size(lease)
        .lifetime(Duration::from_nanos(lifetime_ns))
        .build_with_clock(clock.clone())
        .unwrap();
        let cap = shards.next_power_of_two() as u64 * u64::from(lease);
        let mut now = start;
        let mut trace = Vec::new();
        for step in &steps {
            now += step.advance;
            clock.advance(Duration::from_nanos(step.advance));
            let on_lease = limiter.units_on_lease();
            prop_assert!(on_lease <= cap, "on lease {on_lease} > {cap}");
            prop_assert!(limiter.units_held() <= cap);
            let d = limiter.check_on(step.shard, step.cost);
            prop_assert!(d.remaining() <= burst && d.limit() == burst);
            if u64::from(step.cost) > burst {
                prop_assert!(!d.is_allowed(), "cost {} > burst {burst} admitted", step.cost);
            }
            if !d.is_allowed() && step.cost <= burst as u32 && step.cost > 0 {
                prop_assert!(d.retry_after().is_some(), "a cost within the burst is never 'never'");
            }
            let units = if d.is_allowed() { u64::from(step.cost) } else { 0 };
            trace.push((now, units, on_lease));
        }
        for i in 0..trace.len() {
            let (a, _, on_lease) = trace[i];
            let mut admitted = 0u64;
            for &(b, units, _) in &trace[i..] {
                admitted += units;
                let bound = burst + (b - a) / T + on_lease;
                prop_assert!(admitted <= bound, "admitted {admitted} in [{a}, {b}] > {bound}");
            }
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Check { key: u64, cost: u32 },
    Promote(u64),
    Demote(u64),
    Remove(u64),
}

fn op(burst: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => prop_oneof![Just(0u64), 0..3 * T, 0..100 * T].prop_map(Op::Advance),
        10 => (0u64..3, cost(burst)).prop_map(|(key, cost)| Op::Check { key, cost }),
        2 => (0u64..3).prop_map(Op::Promote),
        2 => (0u64..3).prop_map(Op::Demote),
        1 => (0u64..3).prop_map(Op::Remove),
    ]
}

proptest! {
    #![proptest_config(crate::common::cases(300))]

    /// One thread, keys promoted and demoted at random: per key, admissions over every
    /// interval within B + ⌊(b − a)/T⌋ + one lease (this thread owns one shard of each
    /// entry, and only the current entry is reachable) — intervals that contain no
    /// removal of the key (a removal forgives the schedule by design). `peek` agrees
    /// with the `check` that follows it for costs within the burst.
    #[test]
    fn one_thread_promote_demote_keeps_each_keys_bound_and_peek_agrees(
        (burst, ops) in (1u64..60).prop_flat_map(|b| (Just(b), prop::collection::vec(op(b), 1..250))),
        lease_pick in 1u32..60,
        lifetime_ms in prop_oneof![Just(1u64), Just(5), Just(1_000)],
    ) {
        let lease = lease_pick.min(burst as u32);
        let clock = ManualClock::starting_at(Nanos::from_secs(50));
        let limiter: HotKeyLimiter<u64, ManualClock, Inline> = HotKeyLimiter::new_in(
            Policy::per_second(1_000).unwrap().with_burst(burst).unwrap(),
            KeyedBuilder::default().capacity(256).shards(1).clock(clock.clone()),
            HotKeys::default()
                .manual()
                .slots(2)
                .lease_shards(64)
                .lease_size(lease)
                .lease_lifetime(Duration::from_millis(lifetime_ms)),
        )
        .unwrap();
        // Per key: (time, units) admitted since its last removal.
        let mut log: Vec<Vec<(u64, u64)>> = vec![Vec::new(); 3];
        for (i, op) in ops.iter().enumerate() {
            let now = clock.now().as_u64();
            match *op {
                Op::Advance(ns) => {
                    clock.advance(Duration::from_nanos(ns));
                }
                Op::Check { key, cost } => {
                    let peek = limiter.peek(&key, cost);
                    let d = limiter.check_n(&key, cost);
                    if u64::from(cost) <= burst {
                        prop_assert_eq!(peek.is_allowed(), d.is_allowed(),
                            "step {}: peek {:?} check {:?} hot {}", i, peek, d, limiter.is_hot(&key));
                    }
                    if u64::from(cost) > burst {
                        prop_assert!(!d.is_allowed());
                    }
                    prop_assert!(d.remaining() <= burst);
                    if d.is_allowed() && cost > 0 {
                        log[key as usize].push((now, u64::from(cost)));
                    }
                }
                Op::Promote(key) => {
                    limiter.promote(&key);
                }
                Op::Demote(key) => {
                    limiter.demote(&key);
                }
                Op::Remove(key) => {
                    limiter.remove(&key);
                    // Check what was logged so far, then start afresh.
                    check_bound(&log[key as usize], burst, u64::from(lease))?;
                    log[key as usize].clear();
                }
            }
        }
        for l in &log {
            check_bound(l, burst, u64::from(lease))?;
        }
        let hot = limiter.hot_metrics();
        prop_assert_eq!(hot.promotions - hot.demotions, hot.hot_keys);
    }
}

fn check_bound(log: &[(u64, u64)], burst: u64, lease: u64) -> Result<(), TestCaseError> {
    for i in 0..log.len() {
        let a = log[i].0;
        let mut admitted = 0;
        for &(b, units) in &log[i..] {
            admitted += units;
            let bound = burst + (b - a) / T + lease;
            prop_assert!(
                admitted <= bound,
                "admitted {admitted} in [{a}, {b}] > {bound}"
            );
        }
    }
    Ok(())
}
