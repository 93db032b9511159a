//! The token bucket and the leaky bucket (meter) are GCRA: checked against the
//! textbook `f64` versions of the seed articles.
//!
//! Tolerance: with `P` divisible by `L` (so `T` is exact), the textbook bucket's
//! token count must equal GCRA's `(now + τ − TAT)/T` (capped at `B`) within
//! `1e-6` tokens after every step, and the two must make the same decision whenever
//! the textbook's count is further than `1e-6` from the threshold. At the threshold
//! `f64` rounding may decide either way; the trace stops there, since the two states
//! legitimately diverge after a different decision.
#![cfg(not(loom))]

use floodgate::reference::{TextbookLeakyBucket, TextbookTokenBucket};
use floodgate::{Gcra, ManualClock, Nanos, RateLimiter};
use proptest::prelude::*;
use std::time::Duration;

const EPS: f64 = 1e-6;

fn trace() -> impl Strategy<Value = Vec<(u64, u32)>> {
    prop::collection::vec(
        (prop_oneof![Just(0u64), 0u64..5_000_000_000], 0u32..12),
        1..300,
    )
}

/// GCRA's token count at `now`, from its state alone.
fn gcra_tokens(tat: u64, now: u64, interval: u64, burst: u64) -> f64 {
    let tau = burst * interval;
    let tat = tat.max(now);
    let available = (now + tau).saturating_sub(tat);
    available as f64 / interval as f64
}

proptest! {
    #[test]
    fn token_bucket_matches_textbook(capacity in 1u64..50, refill in 1u64..20, interval in 1_000u64..1_000_000_000, steps in trace()) {
        let every = Duration::from_nanos(interval * refill);
        let gcra = Gcra::token_bucket(capacity, refill, every).unwrap();
        let limiter = RateLimiter::with_clock(gcra, ManualClock::new());
        let start = 1u64 << 40;
        let mut textbook = TextbookTokenBucket::new(capacity as f64, refill as f64, every, start);
        let mut now = start;
        for (dt, cost) in steps {
            now += dt;
            let tokens = textbook.tokens(now);
            let exact = gcra_tokens(limiter.state().tat().as_u64(), now, interval, capacity);
            prop_assert!((tokens - exact).abs() <= EPS, "tokens {} vs exact {}", tokens, exact);
            let ours = limiter.check_n_at(Nanos::new(now), cost).is_allowed();
            let theirs = textbook.allow(now, f64::from(cost));
            if (tokens - f64::from(cost)).abs() <= EPS {
                if ours != theirs {
                    break;
                }
            } else {
                prop_assert_eq!(ours, theirs, "at {} cost {} tokens {}", now, cost, tokens);
            }
        }
    }

    #[test]
    fn leaky_meter_matches_textbook(capacity in 1u64..50, leak in 1u64..20, interval in 1_000u64..1_000_000_000, steps in trace()) {
        let every = Duration::from_nanos(interval * leak);
        let gcra = Gcra::leaky_meter(capacity, leak, every).unwrap();
        let limiter = RateLimiter::with_clock(gcra, ManualClock::new());
        let start = 1u64 << 40;
        let mut textbook = TextbookLeakyBucket::new(capacity as f64, leak as f64, every, start);
        let mut now = start;
        for (dt, cost) in steps {
            now += dt;
            let level = textbook.level(now);
            let exact_level =
                capacity as f64 - gcra_tokens(limiter.state().tat().as_u64(), now, interval, capacity);
            prop_assert!((level - exact_level).abs() <= EPS, "level {} vs exact {}", level, exact_level);
            let ours = limiter.check_n_at(Nanos::new(now), cost).is_allowed();
            let theirs = textbook.allow(now, f64::from(cost));
            if (level + f64::from(cost) - capacity as f64).abs() <= EPS {
                if ours != theirs {
                    break;
                }
            } else {
                prop_assert_eq!(ours, theirs, "at {} cost {} level {}", now, cost, level);
            }
        }
    }
}

/// The seed article's example: a bucket of 10 refilled at 1/s.
#[test]
fn seed_example_capacity_ten_one_per_second() {
    let clock = ManualClock::new();
    let limiter = RateLimiter::with_clock(
        Gcra::token_bucket(10, 1, Duration::from_secs(1)).unwrap(),
        clock.clone(),
    );
    let mut textbook = TextbookTokenBucket::new(10.0, 1.0, Duration::from_secs(1), 0);
    for _ in 0..10 {
        assert!(limiter.check().is_allowed());
        assert!(textbook.allow(0, 1.0));
    }
    assert!(!limiter.check().is_allowed());
    assert!(!textbook.allow(0, 1.0));
    clock.advance(Duration::from_millis(2_500));
    let d = limiter.check_n(2);
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 0);
    assert!(textbook.allow(2_500_000_000, 2.0));
    assert!(!textbook.allow(2_500_000_000, 1.0));
    assert_eq!(
        limiter.check().retry_after(),
        Some(Duration::from_millis(500))
    );
}
