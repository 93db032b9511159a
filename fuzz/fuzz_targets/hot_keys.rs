//! The per-key hot-key mode (`HotKeyLimiter`) under arbitrary checks, clock moves,
//! promotions, demotions and removals, on the storage an input byte picks:
//!
//! * a key never promoted decides exactly as an un-keyed GCRA of its own (the cold
//!   path is the keyed table's exact GCRA);
//! * every key, hot or cold, admits over any run at most what GCRA allows from a
//!   fresh start: `B + ⌊elapsed / T⌋` units (the leases are taken from the key's own
//!   schedule, and promotions and demotions hand the schedule over whole), counted
//!   from the key's last removal;
//! * nothing panics, and `is_hot` says what the last promotion or demotion did.
#![no_main]

use arbitrary::Arbitrary;
use floodgate::{
    Clock, Fingerprint, GcraState, Heap, HotKeyLimiter, HotKeys, Inline, KeyedBuilder, ManualClock,
    Nanos, Policy, RateLimiter, Storage,
};
use libfuzzer_sys::fuzz_target;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

#[derive(Arbitrary, Debug)]
enum Op {
    Check { key: u8, cost: u8 },
    Advance { ms: u16 },
    Promote { key: u8 },
    Demote { key: u8 },
    Remove { key: u8 },
}

#[derive(Arbitrary, Debug)]
struct Input {
    storage: u8,
    lease_size: u8,
    ops: Vec<Op>,
}

/// 10 per second (T = 100 ms), burst 5.
const BURST: u64 = 5;
const INTERVAL_NS: u64 = 100_000_000;

fn run<S: Storage<u64, GcraState>>(input: &Input) {
    let policy = Policy::per_second(10).unwrap().with_burst(BURST).unwrap();
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let limiter: HotKeyLimiter<u64, ManualClock, S> = HotKeyLimiter::new_in(
        policy,
        KeyedBuilder::default()
            .capacity(256)
            .shards(1)
            .clock(clock.clone()),
        HotKeys::default()
            .manual()
            .slots(2)
            .lease_shards(1)
            .lease_size(u32::from(input.lease_size % 5) + 1)
            .lease_lifetime(Duration::from_millis(50)),
    )
    .unwrap();
    // Keys ever promoted leave the exact comparison; every key keeps the bound.
    let mut promoted: HashSet<u64> = HashSet::new();
    let mut exact: HashMap<u64, RateLimiter<floodgate::Gcra, ManualClock>> = HashMap::new();
    // (units admitted, instant counted from) per key.
    let mut admitted: HashMap<u64, (u64, u64)> = HashMap::new();
    for op in input.ops.iter().take(400) {
        let now = clock.now().as_u64();
        match *op {
            Op::Check { key, cost } => {
                let key = u64::from(key % 6);
                let cost = u32::from(cost % 8);
                let decision = limiter.check_n(&key, cost);
                if !promoted.contains(&key) {
                    let twin = exact
                        .entry(key)
                        .or_insert_with(|| RateLimiter::gcra_with_clock(policy, clock.clone()));
                    assert_eq!(decision, twin.check_n(cost), "cold key {key}");
                }
                let (units, since) = admitted.entry(key).or_insert((0, now));
                if decision.is_allowed() {
                    *units += u64::from(cost);
                }
                let allowed = BURST + (now - *since) / INTERVAL_NS;
                assert!(*units <= allowed, "key {key}: {units} > {allowed}");
            }
            Op::Advance { ms } => {
                clock.advance(Duration::from_millis(u64::from(ms % 2_000)));
            }
            Op::Promote { key } => {
                let key = u64::from(key % 6);
                if limiter.promote(&key) {
                    promoted.insert(key);
                    assert!(limiter.is_hot(&key));
                }
            }
            Op::Demote { key } => {
                let key = u64::from(key % 6);
                let was = limiter.is_hot(&key);
                assert_eq!(limiter.demote(&key), was);
                assert!(!limiter.is_hot(&key));
            }
            Op::Remove { key } => {
                let key = u64::from(key % 6);
                limiter.remove(&key);
                assert!(!limiter.is_hot(&key));
                // A removal forgets the key: its count starts again, fresh.
                admitted.remove(&key);
                exact.remove(&key);
            }
        }
    }
}

fuzz_target!(|input: Input| {
    match input.storage % 3 {
        0 => run::<Heap>(&input),
        1 => run::<Inline>(&input),
        _ => run::<Fingerprint>(&input),
    }
});
