//! The keyed table against an unbounded `HashMap` of un-keyed limiters — the oracle of
//! "never admit beyond a limit": arbitrary checks (also at readings earlier than the
//! clock, across reclamations), peeks, charges and refunds, clock moves and explicit
//! reclamation over a small-capacity, one-shard `KeyedLimiter` (so inserts, automatic
//! reclamation and eviction all happen) on the storage an input byte picks: `Heap`,
//! `Inline` (slot reuse and backward-shift moves under churn) or `Fingerprint`.
//!
//! Every decision is compared with the map's at `max(reading, R)`, R being the latest
//! instant the table removed a key at (the table judges every decision there). After
//! every operation each known key is compared through `peek(0)` — equal, except keys
//! that a live eviction in that very operation dropped, which must read as fresh.
//! Refunds: the table's and the model's are made from their own receipts; the table's
//! must never leave it more permissive than the model's. When the two differ (the
//! table's refund is more conservative: its ledger is per shard, and any removal in the
//! shard voids a receipt) the key leaves the comparison.
#![no_main]

use arbitrary::Arbitrary;
use floodgate::{
    Clock, Decision, Fingerprint, Gcra, GcraState, Heap, Inline, KeyedBuilder, ManualClock, Nanos,
    Policy, RateLimiter, Receipt, Storage,
};
use libfuzzer_sys::fuzz_target;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

#[derive(Arbitrary, Debug)]
enum Op {
    Check {
        key: u8,
        cost: u8,
    },
    /// A check at a reading `back_ms` earlier than the clock (a preempted thread, an
    /// early TSC, `check_n_at` with an older time).
    CheckEarlier {
        key: u8,
        cost: u8,
        back_ms: u16,
    },
    Peek {
        key: u8,
        cost: u8,
    },
    Charge {
        key: u8,
        cost: u8,
    },
    /// A charge at a reading `back_ms` earlier than the clock.
    ChargeEarlier {
        key: u8,
        cost: u8,
        back_ms: u16,
    },
    Refund {
        pick: u8,
    },
    Advance(u32),
    ReclaimIdle,
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// Which storage: heap, inline or fingerprint (mod 3).
    storage: u8,
    limit: u8,
    period_ms: u16,
    burst: u8,
    capacity: u8,
    ops: Vec<Op>,
}

type Model = RateLimiter<Gcra, ManualClock>;

fuzz_target!(|input: Input| {
    match input.storage % 3 {
        0 => run::<Heap>(&input),
        1 => run::<Inline>(&input),
        _ => run::<Fingerprint>(&input),
    }
});

fn run<S: Storage<u8, GcraState>>(input: &Input) {
    let Ok(policy) = Policy::new(
        u64::from(input.limit),
        Duration::from_millis(u64::from(input.period_ms)),
    )
    .and_then(|p| p.with_burst(u64::from(input.burst))) else {
        return;
    };
    let clock = ManualClock::starting_at(Nanos::from_secs(100));
    let Ok(keyed) = KeyedBuilder::new(Gcra::new(policy))
        .capacity(usize::from(input.capacity).max(1))
        .shards(1)
        .clock(clock.clone())
        .build_in::<u8, S>()
    else {
        return;
    };
    // The model's clock: set to the instant the table judges each operation at.
    let model_clock = ManualClock::new();
    let fresh = || RateLimiter::gcra_with_clock(policy, model_clock.clone());
    let mut model: HashMap<u8, Model> = HashMap::new();
    let mut untracked: HashSet<u8> = HashSet::new();
    // Outstanding receipts: (key, the table's, the model's).
    let mut receipts: Vec<(u8, Receipt, Option<Receipt>)> = Vec::new();
    let mut removed_at = Nanos::ZERO;
    let removals = |m: floodgate::KeyedMetrics| m.reclaimed + m.evicted;
    for op in &input.ops {
        let before = keyed.metrics();
        let now = clock.now();
        // The reading this operation's table call judges at, before any removal it makes.
        let mut judged = now.max(removed_at);
        match *op {
            Op::Check { key, cost }
            | Op::CheckEarlier {
                key,
                cost,
                back_ms: _,
            } => {
                let reading = match *op {
                    Op::CheckEarlier { back_ms, .. } => {
                        Nanos::new(now.as_u64().saturating_sub(u64::from(back_ms) * 1_000_000))
                    }
                    _ => now,
                };
                judged = reading.max(removed_at);
                let got = keyed.check_n_at(&key, reading, u32::from(cost));
                let want = model
                    .entry(key)
                    .or_insert_with(fresh)
                    .check_n_at(judged, u32::from(cost));
                if !untracked.contains(&key) {
                    assert_eq!(got, want, "check {key} cost {cost} read at {reading:?}");
                }
            }
            Op::Peek { key, cost } => {
                let got = keyed.peek_at(&key, now, u32::from(cost));
                let want = model.get(&key).map_or_else(
                    || fresh().peek_at(judged, u32::from(cost)),
                    |m| m.peek_at(judged, u32::from(cost)),
                );
                if !untracked.contains(&key) {
                    assert_eq!(got, want, "peek {key} cost {cost} at {now:?}");
                }
            }
            Op::Charge { key, cost }
            | Op::ChargeEarlier {
                key,
                cost,
                back_ms: _,
            } => {
                let reading = match *op {
                    Op::ChargeEarlier { back_ms, .. } => {
                        Nanos::new(now.as_u64().saturating_sub(u64::from(back_ms) * 1_000_000))
                    }
                    _ => now,
                };
                judged = reading.max(removed_at);
                let (got, receipt) = keyed.charge_at(&key, reading, u32::from(cost));
                let (want, theirs) = model
                    .entry(key)
                    .or_insert_with(fresh)
                    .charge_at(judged, u32::from(cost));
                if !untracked.contains(&key) {
                    assert_eq!(got, want, "charge {key} cost {cost} read at {reading:?}");
                }
                receipts.push((key, receipt, Some(theirs)));
            }
            Op::Refund { pick } => {
                if !receipts.is_empty() {
                    let (key, receipt, theirs) =
                        receipts.remove(usize::from(pick) % receipts.len());
                    model_clock.set(judged);
                    let back = keyed.refund(&key, receipt);
                    let model_back = match (model.get(&key), theirs) {
                        (Some(m), Some(theirs)) => m.refund(theirs),
                        _ => false,
                    };
                    if !untracked.contains(&key) {
                        if let Some(m) = model.get(&key) {
                            // Never more permissive than the model after its own refund.
                            let at = clock.now().max(removed_at);
                            for cost in 0..=u32::from(input.burst) + 1 {
                                let (t, w) = (keyed.peek_at(&key, at, cost), m.peek_at(at, cost));
                                assert!(
                                    !t.is_allowed() || w.is_allowed(),
                                    "refund {key}: table {t:?} vs model {w:?}"
                                );
                            }
                            // What is left, read without taking anything (a denial's and
                            // an admission's `remaining` count before and after the cost).
                            let (t, w) = (keyed.peek_at(&key, at, 0), m.peek_at(at, 0));
                            assert!(
                                t.remaining() <= w.remaining(),
                                "refund {key}: table {t:?} vs model {w:?}"
                            );
                            if back != model_back || keyed.peek_at(&key, at, 0) != m.peek_at(at, 0)
                            {
                                untracked.insert(key);
                            }
                        }
                    }
                }
            }
            Op::Advance(ms) => {
                clock.advance(Duration::from_millis(u64::from(ms)));
            }
            Op::ReclaimIdle => {
                let _ = keyed.reclaim_idle();
            }
        }
        let metrics = keyed.metrics();
        assert!(
            metrics.live_keys as usize <= keyed.max_keys(),
            "{metrics:?}"
        );
        if removals(metrics) > removals(before) {
            removed_at = removed_at.max(judged);
        }
        let mut evicted_now = metrics.evicted - before.evicted;
        let at = clock.now().max(removed_at);
        let mut forget = Vec::new();
        for (&key, m) in &model {
            if untracked.contains(&key) {
                continue;
            }
            // Compared now and at the earliest instant a later operation can be judged
            // at (the latest removal): a live key evicted in this operation may read as
            // idle now and still differ for a later reading earlier than now.
            let (got, want) = [at, removed_at]
                .into_iter()
                .map(|t| (keyed.peek_at(&key, t, 0), m.peek_at(t, 0), t))
                .find(|(g, w, _)| g != w)
                .map_or_else(
                    || (keyed.peek_at(&key, at, 0), m.peek_at(at, 0)),
                    |(g, w, t)| {
                        assert_eq!(
                            g,
                            fresh().peek_at(t, 0),
                            "key {key} was not dropped cleanly"
                        );
                        (g, w)
                    },
                );
            let got: Decision = got;
            if got != want {
                // Only a live eviction in this operation may explain a difference,
                // and the evicted key must then read as fresh.
                assert!(
                    evicted_now > 0,
                    "key {key}: table {got:?} vs model {want:?}"
                );
                evicted_now -= 1;
                forget.push(key);
            }
        }
        for key in forget {
            model.remove(&key);
            // The evicted key's outstanding receipts refund nothing in the table now;
            // the model's are void too.
            for r in receipts.iter_mut().filter(|r| r.0 == key) {
                r.2 = None;
            }
        }
    }
}
