//! Public behaviour of `CompactKeyedLimiter` (word-sized keys stored inline): the same
//! exactness properties as `tests/keyed.rs` — per-key decisions equal to a direct
//! limiter, no insert on peek, lossless reclamation, eviction of the closest to idle,
//! a differential test against an unbounded per-key model — plus slot reuse under
//! churn with threads.
#![cfg(not(loom))]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use floodgate::{
    Algorithm, CompactKeyedLimiter, Gcra, KeyedBuilder, LeakyBucket, ManualClock, Nanos, Policy,
    RateLimiter, TokenBucket,
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

/// Every key behaves exactly like its own `RateLimiter`, for each GCRA flavour.
fn same_as_direct<A: Algorithm + Clone>(alg: A) {
    let clock = ManualClock::new();
    let limiter = compact::<u64, A>(alg.clone(), 1_000, 1, &clock);
    let direct: Vec<_> = (0..5)
        .map(|_| RateLimiter::with_clock(alg.clone(), clock.clone()))
        .collect();
    let mut step = 0u64;
    for round in 0..400u64 {
        let key = (round * 7 + round / 3) % 5;
        let cost = (round % 4) as u32;
        step = step
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        if step >> 61 == 0 {
            clock.advance(Duration::from_millis(step >> 54 & 0xFF));
        }
        let peeked = limiter.peek(&key, cost);
        assert_eq!(
            peeked,
            direct[key as usize].peek(cost),
            "peek {key} {round}"
        );
        let got = limiter.check_n(&key, cost);
        assert_eq!(got, direct[key as usize].check_n(cost), "key {key} {round}");
        assert_eq!(got, peeked, "peek must predict check");
    }
}

#[test]
fn gcra_per_key_is_exact() {
    same_as_direct(Gcra::new(
        Policy::per_second(10).unwrap().with_burst(4).unwrap(),
    ));
}

#[test]
fn token_bucket_per_key_is_exact() {
    same_as_direct(TokenBucket::new(5, 1, Duration::from_millis(100)).unwrap());
}

#[test]
fn leaky_bucket_per_key_is_exact() {
    same_as_direct(LeakyBucket::meter(5, 10, Duration::from_secs(1)).unwrap());
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

#[test]
fn only_stored_states_insert_keys() {
    let clock = ManualClock::new();
    let limiter = compact::<u64, _>(Gcra::new(Policy::per_second(2).unwrap()), 16, 1, &clock);
    let _ = limiter.peek(&1, 1);
    let _ = limiter.check_n(&2, 0);
    let never = limiter.check_n(&3, 3);
    assert_eq!(never.retry_after(), None);
    assert_eq!(limiter.metrics().live_keys, 0);
    assert!(limiter.check(&4).is_allowed());
    assert_eq!(limiter.metrics().live_keys, 1);
}

#[test]
fn idle_keys_are_reclaimed_without_a_call() {
    let clock = ManualClock::new();
    let limiter = compact::<u64, _>(Gcra::new(Policy::per_second(1).unwrap()), 64, 1, &clock);
    for key in 0..64 {
        assert!(limiter.check(&key).is_allowed());
    }
    clock.advance(Duration::from_secs(1));
    for key in 64..1_000 {
        assert!(limiter.check(&key).is_allowed());
        clock.advance(Duration::from_secs(1));
    }
    let m = limiter.metrics();
    assert_eq!(m.evicted, 0);
    assert!(m.live_keys <= 64);
    assert_eq!(m.reclaimed + m.live_keys, 1_000);
}

#[test]
fn a_full_table_evicts_the_key_closest_to_idle() {
    let clock = ManualClock::new();
    let limiter = compact::<u64, _>(
        Gcra::new(Policy::per_second(1).unwrap().with_burst(100).unwrap()),
        8,
        1,
        &clock,
    );
    for key in 0..8u64 {
        assert!(limiter.check_n(&key, key as u32 + 1).is_allowed());
    }
    assert!(limiter.check_n(&100, 50).is_allowed());
    let m = limiter.metrics();
    assert_eq!((m.live_keys, m.evicted, m.reclaimed), (8, 1, 0));
    assert_eq!(limiter.peek(&0, 1).remaining(), 99);
    for key in 1..8u64 {
        assert_eq!(
            limiter.peek(&key, 0).remaining(),
            100 - (key + 1),
            "key {key}"
        );
    }
}

#[test]
fn memory_stays_bounded_under_a_flood_of_live_keys() {
    let clock = ManualClock::new();
    let limiter = compact::<u64, _>(Gcra::new(Policy::per_hour(1).unwrap()), 1_000, 4, &clock);
    for key in 0..20_000u64 {
        assert!(limiter.check(&key).is_allowed());
        assert!(limiter.metrics().live_keys as usize <= limiter.max_keys());
    }
    let m = limiter.metrics();
    assert_eq!(m.reclaimed, 0);
    assert_eq!(m.live_keys + m.evicted, 20_000);
}

#[test]
fn threads_never_admit_more_than_the_burst_per_key() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let limiter = compact::<u64, _>(
        Gcra::new(Policy::per_hour(1).unwrap().with_burst(3).unwrap()),
        4_096,
        4,
        &clock,
    );
    let admitted: Vec<AtomicU64> = (0..512).map(|_| AtomicU64::new(0)).collect();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (limiter, admitted) = (&limiter, &admitted);
            s.spawn(move || {
                for round in 0..8u64 {
                    for key in 0..512u64 {
                        let key = (key + t * 131 + round * 17) % 512;
                        if limiter.check(&key).is_allowed() {
                            admitted[key as usize].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    for (key, n) in admitted.iter().enumerate() {
        assert_eq!(n.load(Ordering::Relaxed), 3, "key {key}");
    }
    let m = limiter.metrics();
    assert_eq!(
        (m.allowed, m.denied, m.live_keys),
        (512 * 3, 4 * 8 * 512 - 512 * 3, 512)
    );
}

#[test]
fn slot_reuse_under_churn_never_over_admits() {
    // 64 keys cycle through a table of 16 slots-worth of capacity while threads decide
    // on them and the clock moves: slots are emptied and refilled by other keys all
    // the time. With eviction a key may restart fresh, so the bound is per residency;
    // without eviction (idle keys only) no key may admit more than B + elapsed/T.
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let gcra = Gcra::new(Policy::per_second(1_000).unwrap().with_burst(2).unwrap());
    let limiter = compact::<u64, _>(gcra, 64, 1, &clock);
    let admitted: Vec<AtomicU64> = (0..64).map(|_| AtomicU64::new(0)).collect();
    let finished = AtomicU64::new(0);
    let start = floodgate::Clock::now(&clock);
    let iterations = if cfg!(miri) { 200 } else { 30_000 };
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let (limiter, admitted, finished) = (&limiter, &admitted, &finished);
            s.spawn(move || {
                for i in 0..iterations {
                    let key = (i * 7 + t) % 64;
                    if limiter.check(&key).is_allowed() {
                        admitted[key as usize].fetch_add(1, Ordering::Relaxed);
                    }
                }
                finished.fetch_add(1, Ordering::Relaxed);
            });
        }
        while finished.load(Ordering::Relaxed) < 3 {
            clock.advance(Duration::from_micros(500));
            let _ = limiter.reclaim_idle();
        }
    });
    let elapsed_ms = (floodgate::Clock::now(&clock).as_u64() - start.as_u64()) / 1_000_000;
    for (key, n) in admitted.iter().enumerate() {
        let n = n.load(Ordering::Relaxed);
        assert!(
            n <= 2 + elapsed_ms,
            "key {key}: {n} admitted in {elapsed_ms} ms"
        );
    }
    clock.advance(Duration::from_millis(2));
    let _ = limiter.reclaim_idle();
    let m = limiter.metrics();
    assert_eq!(m.evicted, 0);
    assert_eq!((m.live_keys, m.reclaimed > 0), (0, true));
}

#[test]
fn a_full_sweep_reclaims_every_idle_key() {
    let clock = ManualClock::new();
    let limiter = compact::<u64, _>(Gcra::new(Policy::per_second(1).unwrap()), 1_000, 1, &clock);
    for key in 0..1_000 {
        assert!(limiter.check(&key).is_allowed());
    }
    assert_eq!(limiter.reclaim_idle(), 0);
    clock.advance(Duration::from_secs(1));
    assert_eq!(limiter.reclaim_idle(), 1_000);
    assert_eq!(limiter.metrics().live_keys, 0);
    // Every key starts fresh again.
    assert!(limiter.peek(&3, 1).is_allowed());
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
