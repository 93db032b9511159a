//! A model-based property test (from an adversarial review) of a keyed table with
//! several keys in one shard — charges at readings earlier than the clock, refunds
//! of any held receipt, removals, idle sweeps and runtime policy changes
//! (`LiveGcra::set_policy`) interleaved — against "the others alone": after every
//! step, each key's non-refunded admissions of its current incarnation, replayed on
//! a fresh un-keyed limiter at their effective instants (max(reading, the shard's
//! latest removal instant)) with the same policy changes, must all be admitted, and
//! the table must never be more permissive than that replay.
#![cfg(not(loom))]

mod common;

use std::time::Duration;

use floodgate::{
    Clock, Fingerprint, Heap, Inline, KeyedBuilder, KeyedLimiter, LiveGcra, ManualClock, Nanos,
    Policy, RateLimiter, Receipt, Storage,
};
use proptest::prelude::*;

const P: u64 = 1_000_000;
const KEYS: u64 = 4;

fn policies() -> [Policy; 3] {
    let p = |limit, burst| {
        Policy::new(limit, Duration::from_nanos(P))
            .unwrap()
            .with_burst(burst)
            .unwrap()
    };
    [p(2, 3), p(5, 2), p(1, 1)]
}

#[derive(Clone, Debug)]
enum Op {
    Charge { key: u64, back: u64, cost: u32 },
    Refund { pick: usize },
    Advance { d: u64 },
    Remove { key: u64 },
    Sweep,
    SetPolicy { which: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..KEYS, prop_oneof![2 => Just(0u64), 1 => 0..P], 0u32..5)
            .prop_map(|(key, back, cost)| Op::Charge { key, back, cost }),
        3 => any::<usize>().prop_map(|pick| Op::Refund { pick }),
        3 => prop_oneof![0..P / 4, 0..3 * P].prop_map(|d| Op::Advance { d }),
        1 => (0..KEYS).prop_map(|key| Op::Remove { key }),
        1 => Just(Op::Sweep),
        1 => (0usize..3).prop_map(|which| Op::SetPolicy { which }),
    ]
}

#[derive(Clone, Copy)]
enum Event {
    /// (key, incarnation, effective instant, cost, refunded)
    Admit(u64, u32, Nanos, u32, bool),
    Policy(usize),
}

fn run<St: Storage<u64, floodgate::GcraState>>(ops: &[Op]) -> Result<(), TestCaseError> {
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let keyed: KeyedLimiter<u64, LiveGcra, ManualClock, St> =
        KeyedBuilder::new(LiveGcra::new(policies()[0]))
            .capacity(8)
            .shards(1)
            .clock(clock.clone())
            .build_in()
            .unwrap();
    let mut removal_at = Nanos::ZERO;
    let mut incarnation = [0u32; KEYS as usize];
    let mut events: Vec<Event> = Vec::new();
    let mut held: Vec<(usize, u64, Receipt)> = Vec::new();
    let mut policy = 0usize;
    for op in ops {
        match *op {
            Op::Charge { key, back, cost } => {
                let reading = Nanos::new(clock.now().as_u64() - back);
                let (d, r) = keyed.charge_at(&key, reading, cost);
                if d.is_allowed() && r.is_charged() {
                    let eff = reading.max(removal_at);
                    events.push(Event::Admit(
                        key,
                        incarnation[key as usize],
                        eff,
                        cost,
                        false,
                    ));
                    held.push((events.len() - 1, key, r));
                }
            }
            Op::Refund { pick } => {
                if held.is_empty() {
                    continue;
                }
                let (i, key, r) = held.remove(pick % held.len());
                if keyed.refund(&key, r) {
                    if let Event::Admit(_, _, _, _, refunded) = &mut events[i] {
                        *refunded = true;
                    }
                }
            }
            Op::Advance { d } => {
                clock.advance(Duration::from_nanos(d));
            }
            Op::Remove { key } => {
                if keyed.remove(&key) {
                    removal_at = removal_at.max(clock.now());
                    incarnation[key as usize] += 1;
                }
            }
            Op::Sweep => {
                if keyed.reclaim_idle() > 0 {
                    removal_at = removal_at.max(clock.now());
                }
            }
            Op::SetPolicy { which } => {
                keyed.algorithm().set_policy(policies()[which]);
                events.push(Event::Policy(which));
                policy = which;
            }
        }
        prop_assert_eq!(keyed.metrics().evicted, 0);
        // The others alone, per key.
        let now = clock.now();
        for key in 0..KEYS {
            let model = RateLimiter::with_clock(LiveGcra::new(policies()[0]), ManualClock::new());
            for e in &events {
                match *e {
                    Event::Policy(w) => model.algorithm().set_policy(policies()[w]),
                    Event::Admit(k, inc, at, cost, refunded) => {
                        if k == key && inc == incarnation[key as usize] && !refunded {
                            prop_assert!(
                                model.check_n_at(at, cost).is_allowed(),
                                "key {} cost {} at {:?}: the others alone would deny it",
                                key,
                                cost,
                                at
                            );
                        }
                    }
                }
            }
            prop_assert_eq!(model.algorithm().policy(), policies()[policy]);
            let at = now.max(removal_at);
            for cost in 1..=6u32 {
                let (r, m) = (keyed.peek_at(&key, now, cost), model.peek_at(at, cost));
                prop_assert!(
                    !r.is_allowed() || m.is_allowed(),
                    "key {} cost {} admitted at {:?} where the others alone deny it",
                    key,
                    cost,
                    now
                );
            }
            prop_assert!(
                keyed.peek_at(&key, now, 0).remaining() <= model.peek_at(at, 0).remaining()
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(crate::common::cases(1_000))]

    #[test]
    fn keyed_multi_key_removals_refunds_policy_changes_heap(ops in proptest::collection::vec(op(), 1..60)) {
        run::<Heap>(&ops)?;
    }

    #[test]
    fn keyed_multi_key_removals_refunds_policy_changes_inline(ops in proptest::collection::vec(op(), 1..60)) {
        run::<Inline>(&ops)?;
    }

    #[test]
    fn keyed_multi_key_removals_refunds_policy_changes_fingerprint(ops in proptest::collection::vec(op(), 1..60)) {
        run::<Fingerprint>(&ops)?;
    }
}
