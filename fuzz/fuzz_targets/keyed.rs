//! The keyed table against a `HashMap` model: arbitrary checks, peeks, clock moves and
//! explicit reclamation over a small-capacity `KeyedLimiter` (so inserts, automatic
//! reclamation and eviction all happen).
//!
//! After every operation, every key the model knows is compared with the table through
//! `peek(0)` (which inserts nothing): equal, except for keys that an eviction in this
//! very operation dropped while live — those must then read as fresh, and the model
//! forgets them too. Reclamation must therefore be lossless, two keys must never share
//! state, and the table must never hold more than its bound.
#![no_main]

use arbitrary::Arbitrary;
use floodgate::reference::ExactGcra;
use floodgate::{Gcra, KeyedBuilder, ManualClock, Nanos, Policy};
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;
use std::time::Duration;

#[derive(Arbitrary, Debug)]
enum Op {
    Check { key: u8, cost: u8 },
    Peek { key: u8, cost: u8 },
    Advance(u32),
    ReclaimIdle,
}

#[derive(Arbitrary, Debug)]
struct Input {
    limit: u8,
    period_ms: u16,
    burst: u8,
    capacity: u8,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let Ok(policy) = Policy::new(u64::from(input.limit), Duration::from_millis(u64::from(input.period_ms)))
        .and_then(|p| p.with_burst(u64::from(input.burst)))
    else {
        return;
    };
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let Ok(keyed) = KeyedBuilder::new(Gcra::new(policy))
        .capacity(usize::from(input.capacity).max(1))
        .clock(clock.clone())
        .build::<u8>()
    else {
        return;
    };
    let fresh = || {
        ExactGcra::new(policy.limit(), policy.period_nanos(), policy.burst())
            .expect("numbers a Policy accepted")
    };
    let mut model: HashMap<u8, ExactGcra> = HashMap::new();
    for op in &input.ops {
        let evicted_before = keyed.metrics().evicted;
        let now = clock.now_nanos();
        match *op {
            Op::Check { key, cost } => {
                let got = keyed.check_n_at(&key, Nanos::new(now), u32::from(cost));
                let want = model.entry(key).or_insert_with(fresh).check(now, u32::from(cost));
                // The key itself may have been the one evicted only if it was absent
                // and its insert evicted another: its own decision is always exact.
                assert_eq!(got, want, "check {key} cost {cost} at {now}");
            }
            Op::Peek { key, cost } => {
                let got = keyed.peek_at(&key, Nanos::new(now), u32::from(cost));
                let want = model.get(&key).cloned().unwrap_or_else(fresh).peek(now, u32::from(cost));
                assert_eq!(got, want, "peek {key} cost {cost} at {now}");
            }
            Op::Advance(ms) => {
                clock.advance(Duration::from_millis(u64::from(ms)));
            }
            Op::ReclaimIdle => {
                let _ = keyed.reclaim_idle();
            }
        }
        let metrics = keyed.metrics();
        assert!(metrics.live_keys as usize <= keyed.max_keys(), "{metrics:?}");
        let mut evicted_now = metrics.evicted - evicted_before;
        let now = clock.now_nanos();
        let mut forget = Vec::new();
        for (&key, m) in &model {
            let got = keyed.peek_at(&key, Nanos::new(now), 0);
            let want = m.peek(now, 0);
            if got != want {
                // Only a live eviction in this operation may explain a difference,
                // and the evicted key must then read as fresh.
                assert!(evicted_now > 0, "key {key}: table {got:?} vs model {want:?}");
                assert_eq!(got, fresh().peek(now, 0), "key {key} was not dropped cleanly");
                evicted_now -= 1;
                forget.push(key);
            }
        }
        for key in forget {
            model.remove(&key);
        }
    }
});

trait NowNanos {
    fn now_nanos(&self) -> u64;
}

impl NowNanos for ManualClock {
    fn now_nanos(&self) -> u64 {
        floodgate::Clock::now(self).as_u64()
    }
}
