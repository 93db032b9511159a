//! `CompactKeyedLimiter` (word-sized keys stored inline) beyond the cases
//! `tests/keyed.rs` runs on both tables (per-key exactness, no insert on peek,
//! lossless reclamation, eviction, threads): narrow and all-ones keys, and a
//! differential test against an unbounded per-key model.
#![cfg(not(loom))]

use std::collections::HashMap;
use std::time::Duration;

use floodgate::{
    Algorithm, CompactKeyedLimiter, Gcra, KeyedBuilder, ManualClock, Policy, RateLimiter,
};
use proptest::prelude::*;

fn compact<K, A>(
    alg: A,
    capacity: usize,
    shards: usize,
    clock: &ManualClock,
) -> CompactKeyedLimiter<K, A, ManualClock>
where
    K: bytemuck::Pod,
    A: Algorithm,
{
    KeyedBuilder::new(alg)
        .capacity(capacity)
        .shards(shards)
        .clock(clock.clone())
        .build_compact()
        .expect("valid configuration")
}

#[test]
fn narrow_and_wide_keys_are_distinct_keys() {
    let clock = ManualClock::new();
    let gcra = Gcra::new(Policy::per_second(1).unwrap());
    let ipv4 = compact::<[u8; 4], _>(gcra, 64, 1, &clock);
    assert!(ipv4.check(&[10, 0, 0, 1]).is_allowed());
    assert!(!ipv4.check(&[10, 0, 0, 1]).is_allowed());
    assert!(ipv4.check(&[10, 0, 0, 2]).is_allowed());
    // All-ones keys are ordinary keys (emptiness lives in the state half).
    assert!(ipv4.check(&[255; 4]).is_allowed());
    assert!(!ipv4.check(&[255; 4]).is_allowed());
    let wide = compact::<u64, _>(gcra, 64, 1, &clock);
    for key in [0, u64::MAX, 1 << 63, u64::MAX - 1] {
        assert!(wide.check(&key).is_allowed(), "{key}");
        assert!(!wide.check(&key).is_allowed(), "{key}");
    }
    assert_eq!(wide.metrics().live_keys, 4);
    let small = compact::<u16, _>(gcra, 64, 1, &clock);
    assert!(small.check(&0).is_allowed());
    assert!(small.check(&u16::MAX).is_allowed());
    assert!(!small.check(&0).is_allowed());
}

#[derive(Clone, Debug)]
enum Op {
    Check { key: u8, cost: u8 },
    Peek { key: u8, cost: u8 },
    Advance { millis: u16 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..24, 0u8..4).prop_map(|(key, cost)| Op::Check { key, cost }),
        1 => (0u8..24, 0u8..4).prop_map(|(key, cost)| Op::Peek { key, cost }),
        2 => (0u16..2_000).prop_map(|millis| Op::Advance { millis }),
    ]
}

proptest! {
    /// A tiny compact table makes the same decisions as an unbounded per-key model as
    /// long as it only reclaimed idle keys; a roomy one always does.
    #[test]
    fn tiny_compact_matches_an_unbounded_model_while_nothing_was_evicted(
        ops in prop::collection::vec(op(), 1..300),
        shards in prop_oneof![Just(1usize), Just(2)],
    ) {
        let clock = ManualClock::new();
        let gcra = Gcra::new(Policy::per_second(4).unwrap().with_burst(3).unwrap());
        let tiny = compact::<u8, _>(gcra, 6, shards, &clock);
        let full = compact::<u64, _>(gcra, 1_000, shards, &clock);
        let mut model: HashMap<u8, RateLimiter<Gcra, ManualClock>> = HashMap::new();
        for op in ops {
            match op {
                Op::Advance { millis } => { clock.advance(Duration::from_millis(u64::from(millis))); }
                Op::Peek { key, cost } => {
                    let a = tiny.peek(&key, u32::from(cost));
                    let b = full.peek(&u64::from(key), u32::from(cost));
                    let c = model.get(&key).map_or_else(
                        || RateLimiter::with_clock(gcra, clock.clone()).peek(u32::from(cost)),
                        |m| m.peek(u32::from(cost)),
                    );
                    prop_assert_eq!(b, c);
                    if tiny.metrics().evicted == 0 { prop_assert_eq!(a, b); }
                }
                Op::Check { key, cost } => {
                    let a = tiny.check_n(&key, u32::from(cost));
                    let b = full.check_n(&u64::from(key), u32::from(cost));
                    let c = model
                        .entry(key)
                        .or_insert_with(|| RateLimiter::with_clock(gcra, clock.clone()))
                        .check_n(u32::from(cost));
                    prop_assert_eq!(b, c);
                    if tiny.metrics().evicted == 0 { prop_assert_eq!(a, b); }
                }
            }
            prop_assert!(tiny.metrics().live_keys as usize <= tiny.max_keys());
        }
    }
}
