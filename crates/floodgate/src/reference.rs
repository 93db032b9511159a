//! Oracles, written apart from the transitions so that a wrong transition cannot hide
//! behind itself.
//!
//! * **Exact models** ([`ExactGcra`]): the formulas of the design redone naively in
//!   `u128`/`i128`, with an `Option` for "fresh" — no offsets, no saturation, no
//!   shared code with [`Gcra`](crate::Gcra). The property tests demand *equal*
//!   decisions from the atomic cell, the mutex twin and these models.
//! * **Textbook versions** ([`TextbookTokenBucket`], [`TextbookLeakyBucket`]): the
//!   `f64` buckets of the seed articles (`tokens` and `last_refill`, `level` and
//!   `last_leak`). They are benchmark baselines; tests compare them with GCRA within a
//!   stated tolerance, because `f64` time and tokens round where GCRA's integers do not.

use crate::decision::Decision;
use core::time::Duration;

fn dur(ns: u128) -> Duration {
    Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
}

/// GCRA straight from the formulas, in 128-bit integers.
///
/// # Examples
///
/// ```
/// use floodgate::reference::ExactGcra;
/// let mut m = ExactGcra::new(1, 1_000_000_000, 2);
/// assert!(m.check(0, 2).is_allowed());
/// assert_eq!(m.check(0, 1).retry_after_nanos(), Some(1_000_000_000));
/// ```
#[derive(Clone, Debug)]
pub struct ExactGcra {
    t: u128,
    b: u128,
    tat: Option<u128>,
}

impl ExactGcra {
    /// `limit` per `period_nanos` with capacity `burst` (assumed valid: see
    /// [`Policy`](crate::Policy)).
    pub fn new(limit: u64, period_nanos: u64, burst: u64) -> ExactGcra {
        let (l, p) = (u128::from(limit.max(1)), u128::from(period_nanos));
        // T = ⌈P / L⌉, spelled out rather than sharing the engine's `div_ceil`.
        #[allow(clippy::manual_div_ceil)]
        let t = (p + l - 1) / l;
        ExactGcra {
            t,
            b: u128::from(burst),
            tat: None,
        }
    }

    /// Switches to a new rate, keeping the state (as a runtime policy change does).
    pub fn set_policy(&mut self, limit: u64, period_nanos: u64, burst: u64) {
        let tat = self.tat;
        *self = ExactGcra::new(limit, period_nanos, burst);
        self.tat = tat;
    }

    /// `check(n)` at `now`.
    pub fn check(&mut self, now: u64, cost: u32) -> Decision {
        self.decide(now, cost, true)
    }

    /// `peek(n)` at `now`.
    pub fn peek(&self, now: u64, cost: u32) -> Decision {
        self.clone().decide(now, cost, false)
    }

    fn decide(&mut self, now: u64, cost: u32, write: bool) -> Decision {
        let now = u128::from(now);
        let n = u128::from(cost);
        let (t, b) = (self.t, self.b);
        let tat = self.tat.unwrap_or(now).max(now);
        let new_tat = tat + n * t;
        let limit_at = now + b * t;
        let remaining_at = |x: u128| -> u64 {
            let r = (limit_at as i128 - x as i128).div_euclid(t as i128);
            r.clamp(0, b as i128) as u64
        };
        let b64 = b as u64;
        if n > b {
            return Decision::new(false, b64, remaining_at(tat), dur(tat - now), None);
        }
        if n == 0 {
            return Decision::new(true, b64, remaining_at(tat), dur(tat - now), None);
        }
        // The engine's one documented bound: a TAT past u64::MAX ns (the year 2554)
        // cannot be stored, so such a request is denied for good.
        if new_tat <= limit_at && new_tat > u128::from(u64::MAX) {
            return Decision::new(false, b64, remaining_at(tat), dur(tat - now), None);
        }
        if new_tat <= limit_at {
            if write {
                self.tat = Some(new_tat);
            }
            Decision::new(true, b64, remaining_at(new_tat), dur(new_tat - now), None)
        } else {
            let retry = dur(new_tat - limit_at);
            Decision::new(false, b64, remaining_at(tat), dur(tat - now), Some(retry))
        }
    }
}

/// The seed article's token bucket: `f64` tokens refilled from `last_refill`.
///
/// # Examples
///
/// ```
/// use floodgate::reference::TextbookTokenBucket;
/// use std::time::Duration;
/// let mut b = TextbookTokenBucket::new(2.0, 1.0, Duration::from_secs(1), 0);
/// assert!(b.allow(0, 2.0));
/// assert!(!b.allow(500_000_000, 1.0));
/// assert!(b.allow(1_000_000_000, 1.0));
/// ```
#[derive(Clone, Debug)]
pub struct TextbookTokenBucket {
    capacity: f64,
    tokens: f64,
    per_nano: f64,
    last_refill: u64,
}

impl TextbookTokenBucket {
    /// A full bucket of `capacity` tokens gaining `refill` per `every`, created at `now`.
    pub fn new(capacity: f64, refill: f64, every: Duration, now: u64) -> Self {
        let per_nano = refill / every.as_nanos() as f64;
        TextbookTokenBucket {
            capacity,
            tokens: capacity,
            per_nano,
            last_refill: now,
        }
    }

    /// Refills for the time since `last_refill`, then takes `cost` tokens if there are
    /// that many.
    pub fn allow(&mut self, now: u64, cost: f64) -> bool {
        self.refill(now);
        if self.tokens >= cost {
            self.tokens -= cost;
            true
        } else {
            false
        }
    }

    /// The tokens held at `now` (after refilling).
    pub fn tokens(&mut self, now: u64) -> f64 {
        self.refill(now);
        self.tokens
    }

    fn refill(&mut self, now: u64) {
        let elapsed = now.saturating_sub(self.last_refill) as f64;
        self.tokens = (self.tokens + elapsed * self.per_nano).min(self.capacity);
        self.last_refill = self.last_refill.max(now);
    }
}

/// The seed article's leaky bucket as a meter: an `f64` level drained from
/// `last_leak`.
///
/// # Examples
///
/// ```
/// use floodgate::reference::TextbookLeakyBucket;
/// use std::time::Duration;
/// let mut b = TextbookLeakyBucket::new(2.0, 1.0, Duration::from_secs(1), 0);
/// assert!(b.allow(0, 2.0));
/// assert!(!b.allow(0, 1.0));
/// assert!(b.allow(1_000_000_000, 1.0));
/// ```
#[derive(Clone, Debug)]
pub struct TextbookLeakyBucket {
    capacity: f64,
    level: f64,
    per_nano: f64,
    last_leak: u64,
}

impl TextbookLeakyBucket {
    /// An empty meter of `capacity` draining `leak` per `every`, created at `now`.
    pub fn new(capacity: f64, leak: f64, every: Duration, now: u64) -> Self {
        let per_nano = leak / every.as_nanos() as f64;
        TextbookLeakyBucket {
            capacity,
            level: 0.0,
            per_nano,
            last_leak: now,
        }
    }

    /// Drains for the time since `last_leak`, then adds `cost` if it fits.
    pub fn allow(&mut self, now: u64, cost: f64) -> bool {
        self.leak(now);
        if self.level + cost <= self.capacity {
            self.level += cost;
            true
        } else {
            false
        }
    }

    /// The level at `now` (after draining).
    pub fn level(&mut self, now: u64) -> f64 {
        self.leak(now);
        self.level
    }

    fn leak(&mut self, now: u64) {
        let elapsed = now.saturating_sub(self.last_leak) as f64;
        self.level = (self.level - elapsed * self.per_nano).max(0.0);
        self.last_leak = self.last_leak.max(now);
    }
}
