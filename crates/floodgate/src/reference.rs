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
//!
//! The exact models take the numbers a [`Policy`] takes and refuse what it refuses
//! (a zero limit, period or burst, a unit closer than 1 ns, `L·T` or `B·T` past
//! 2^62 ns) with the same [`PolicyError`]: an oracle must not divide by zero where
//! the engine would never have been built.

use crate::decision::Decision;
use crate::policy::{Policy, PolicyError};
use core::time::Duration;
use std::collections::HashMap;

/// The policy a model's numbers describe, validated as [`Policy`] validates them.
fn validated(limit: u64, period_nanos: u64, burst: u64) -> Result<Policy, PolicyError> {
    Policy::new(limit, Duration::from_nanos(period_nanos))?.with_burst(burst)
}

fn dur(ns: u128) -> Duration {
    Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
}

/// GCRA straight from the formulas, in 128-bit integers.
///
/// # Examples
///
/// ```
/// use floodgate::reference::ExactGcra;
/// let mut m = ExactGcra::new(1, 1_000_000_000, 2)?;
/// assert!(m.check(0, 2).is_allowed());
/// assert_eq!(m.check(0, 1).retry_after_nanos(), Some(1_000_000_000));
/// assert!(ExactGcra::new(1, 0, 1).is_err()); // a zero period, as `Policy` says
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
#[derive(Clone, Debug)]
pub struct ExactGcra {
    t: u128,
    b: u128,
    tat: Option<u128>,
}

impl ExactGcra {
    /// `limit` per `period_nanos` with capacity `burst`.
    ///
    /// # Errors
    ///
    /// The [`PolicyError`] that [`Policy`] gives for the same numbers.
    pub fn new(limit: u64, period_nanos: u64, burst: u64) -> Result<ExactGcra, PolicyError> {
        validated(limit, period_nanos, burst)?;
        let (l, p) = (u128::from(limit), u128::from(period_nanos));
        // T = ⌈P / L⌉, spelled out rather than sharing the engine's `div_ceil`.
        #[allow(clippy::manual_div_ceil)]
        let t = (p + l - 1) / l;
        Ok(ExactGcra {
            t,
            b: u128::from(burst),
            tat: None,
        })
    }

    /// Switches to a new rate, keeping the state (as a runtime policy change does).
    ///
    /// # Errors
    ///
    /// As [`new`](ExactGcra::new); then nothing changes.
    pub fn set_policy(
        &mut self,
        limit: u64,
        period_nanos: u64,
        burst: u64,
    ) -> Result<(), PolicyError> {
        let tat = self.tat;
        *self = ExactGcra::new(limit, period_nanos, burst)?;
        self.tat = tat;
        Ok(())
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

/// Per-window counts in `u128`: the store both exact window models keep (a map from
/// window index to count; no index wraps).
#[derive(Clone, Debug)]
struct WindowCounts {
    limit: u128,
    period: u128,
    counts: HashMap<u128, u128>,
}

impl WindowCounts {
    /// `limit` per `period_nanos`, nothing counted.
    ///
    /// # Errors
    ///
    /// The [`PolicyError`] that [`Policy`] gives for the same numbers.
    fn new(limit: u64, period_nanos: u64) -> Result<WindowCounts, PolicyError> {
        validated(limit, period_nanos, limit)?;
        Ok(WindowCounts {
            limit: u128::from(limit),
            period: u128::from(period_nanos),
            counts: HashMap::new(),
        })
    }

    /// The count of window `w` (0 if none).
    fn count(&self, w: u128) -> u128 {
        self.counts.get(&w).copied().unwrap_or(0)
    }

    /// The newest window with a count.
    fn newest(&self) -> Option<u128> {
        self.counts.keys().copied().max()
    }
}

/// What the exact window and log models answer before asking whether `n` units fit
/// beside the `used` ones of limit `l`: a cost above the limit is never admitted, a
/// zero cost always is (and writes nothing); `None` for any other cost.
fn unconditional(l: u128, n: u128, used: u128, reset: Duration) -> Option<Decision> {
    let remaining = l.saturating_sub(used) as u64;
    if n > l {
        Some(Decision::new(false, l as u64, remaining, reset, None))
    } else if n == 0 {
        Some(Decision::new(true, l as u64, remaining, reset, None))
    } else {
        None
    }
}

/// The fixed window straight from its definition: a `HashMap` from window index to
/// count, in `u128`.
///
/// A reading earlier than the newest window with a count is judged in that window (the
/// engine never moves a state back). No window index wraps here.
///
/// # Examples
///
/// ```
/// use floodgate::reference::ExactFixedWindow;
/// let mut m = ExactFixedWindow::new(2, 1_000)?;
/// assert!(m.check(1_500, 2).is_allowed());
/// let d = m.check(1_999, 1);
/// assert_eq!(d.retry_after_nanos(), Some(1));
/// assert!(m.check(2_000, 1).is_allowed());
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
#[derive(Clone, Debug)]
pub struct ExactFixedWindow {
    windows: WindowCounts,
}

impl ExactFixedWindow {
    /// `limit` per `period_nanos`.
    ///
    /// # Errors
    ///
    /// The [`PolicyError`] that [`Policy`] gives for the same numbers.
    pub fn new(limit: u64, period_nanos: u64) -> Result<ExactFixedWindow, PolicyError> {
        Ok(ExactFixedWindow {
            windows: WindowCounts::new(limit, period_nanos)?,
        })
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
        let (l, p, n) = (self.windows.limit, self.windows.period, u128::from(cost));
        let w = (now / p).max(self.windows.newest().unwrap_or(0));
        let count = self.windows.count(w);
        let reset = dur((w + 1) * p - now);
        if let Some(d) = unconditional(l, n, count, reset) {
            return d;
        }
        let l64 = l as u64;
        let remaining = |c: u128| l.saturating_sub(c) as u64;
        if count + n <= l {
            if write {
                self.windows.counts.insert(w, count + n);
            }
            Decision::new(true, l64, remaining(count + n), reset, None)
        } else {
            Decision::new(false, l64, remaining(count), reset, Some(reset))
        }
    }
}

/// The sliding window counter straight from its definition: counts per window in a
/// `HashMap`, the estimate `⌊prev·(P − e)/P⌋ + cur` in `u128`, and `retry_after` found
/// by a binary search over time (the estimate never rises without traffic).
///
/// A reading earlier than the start of the newest window with a count is judged at
/// that start. No window index wraps here.
///
/// # Examples
///
/// ```
/// use floodgate::reference::ExactSlidingWindow;
/// let mut m = ExactSlidingWindow::new(10, 60)?;
/// assert!(m.check(59, 10).is_allowed());
/// // At 61: ⌊10·59/60⌋ = 9 still weigh.
/// assert_eq!(m.peek(61, 0).remaining(), 1);
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
#[derive(Clone, Debug)]
pub struct ExactSlidingWindow {
    windows: WindowCounts,
}

impl ExactSlidingWindow {
    /// `limit` per `period_nanos`.
    ///
    /// # Errors
    ///
    /// The [`PolicyError`] that [`Policy`] gives for the same numbers.
    pub fn new(limit: u64, period_nanos: u64) -> Result<ExactSlidingWindow, PolicyError> {
        Ok(ExactSlidingWindow {
            windows: WindowCounts::new(limit, period_nanos)?,
        })
    }

    /// `check(n)` at `now`.
    pub fn check(&mut self, now: u64, cost: u32) -> Decision {
        self.decide(now, cost, true)
    }

    /// `peek(n)` at `now`.
    pub fn peek(&self, now: u64, cost: u32) -> Decision {
        self.clone().decide(now, cost, false)
    }

    fn estimate(&self, t: u128) -> u128 {
        let p = self.windows.period;
        let w = t / p;
        let e = t - w * p;
        let prev = if w == 0 { 0 } else { self.windows.count(w - 1) };
        prev * (p - e) / p + self.windows.count(w)
    }

    fn decide(&mut self, now: u64, cost: u32, write: bool) -> Decision {
        let now = u128::from(now);
        let (l, p, n) = (self.windows.limit, self.windows.period, u128::from(cost));
        let t = now.max(self.windows.newest().map_or(0, |w| w * p));
        let w = t / p;
        let prev = if w == 0 { 0 } else { self.windows.count(w - 1) };
        let cur = self.windows.count(w);
        let estimate = self.estimate(t);
        let reset = |cur: u128| {
            dur(if cur > 0 {
                (w + 2) * p - now
            } else if prev > 0 {
                (w + 1) * p - now
            } else {
                0
            })
        };
        if let Some(d) = unconditional(l, n, estimate, reset(cur)) {
            return d;
        }
        let l64 = l as u64;
        let remaining = |used: u128| l.saturating_sub(used) as u64;
        if estimate + n <= l {
            if write {
                self.windows.counts.insert(w, cur + n);
            }
            return Decision::new(true, l64, remaining(estimate + n), reset(cur + n), None);
        }
        // The least instant in (t, t + 2P] that admits n: at t + 2P nothing weighs.
        let (mut lo, mut hi) = (t, t + 2 * p);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.estimate(mid) + n <= l {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        let retry = dur(hi - now);
        Decision::new(false, l64, remaining(estimate), reset(cur), Some(retry))
    }
}

/// The sliding log straight from its definition: every admitted unit's timestamp in a
/// plain `Vec`, never pruned. A unit at `t` counts while `now < t + P`.
///
/// A reading earlier than the newest timestamp is judged at that timestamp (units are
/// logged at the judged instant, so the log stays in order).
///
/// # Examples
///
/// ```
/// use floodgate::reference::ExactSlidingLog;
/// let mut m = ExactSlidingLog::new(2, 100)?;
/// assert!(m.check(10, 1).is_allowed());
/// assert!(m.check(50, 1).is_allowed());
/// assert_eq!(m.check(60, 1).retry_after_nanos(), Some(50));
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
#[derive(Clone, Debug)]
pub struct ExactSlidingLog {
    limit: u128,
    period: u128,
    log: Vec<u128>,
}

impl ExactSlidingLog {
    /// `limit` per `period_nanos`.
    ///
    /// # Errors
    ///
    /// The [`PolicyError`] that [`Policy`] gives for the same numbers.
    pub fn new(limit: u64, period_nanos: u64) -> Result<ExactSlidingLog, PolicyError> {
        validated(limit, period_nanos, limit)?;
        Ok(ExactSlidingLog {
            limit: u128::from(limit),
            period: u128::from(period_nanos),
            log: Vec::new(),
        })
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
        let (l, p, n) = (self.limit, self.period, u128::from(cost));
        let t = self.log.iter().copied().fold(now, u128::max);
        let mut live: Vec<u128> = self.log.iter().copied().filter(|&x| t < x + p).collect();
        live.sort_unstable();
        let units = live.len() as u128;
        let reset = dur(live.last().map_or(0, |&x| x + p - now));
        if let Some(d) = unconditional(l, n, units, reset) {
            return d;
        }
        let l64 = l as u64;
        let remaining = |used: u128| l.saturating_sub(used) as u64;
        if units + n <= l {
            if write {
                self.log.extend((0..n).map(|_| t));
            }
            return Decision::new(true, l64, remaining(units + n), dur(t + p - now), None);
        }
        // The oldest `units + n − L` units must leave; the last of them leaves at x + P.
        let must_leave = (units + n - l) as usize;
        let retry = dur(live[must_leave - 1] + p - now);
        Decision::new(false, l64, remaining(units), reset, Some(retry))
    }
}

/// The seed article's fixed window: the window starts at the first request after the
/// previous one expired (not aligned), compared with `>`.
///
/// # Examples
///
/// ```
/// use floodgate::reference::TextbookFixedWindow;
/// let mut w = TextbookFixedWindow::new(1, 100, 0);
/// assert!(w.allow(10, 1));
/// assert!(!w.allow(100, 1)); // 100 − 0 is not > 100
/// assert!(w.allow(101, 1));
/// ```
#[derive(Clone, Debug)]
pub struct TextbookFixedWindow {
    limit: u64,
    period: u64,
    window_start: u64,
    counter: u64,
}

impl TextbookFixedWindow {
    /// `limit` per `period` ns, the first window starting at `now`.
    pub fn new(limit: u64, period: u64, now: u64) -> Self {
        TextbookFixedWindow {
            limit,
            period,
            window_start: now,
            counter: 0,
        }
    }

    /// Restarts the window if it expired, then admits `cost` if it fits.
    pub fn allow(&mut self, now: u64, cost: u64) -> bool {
        if now.saturating_sub(self.window_start) > self.period {
            self.window_start = now;
            self.counter = 0;
        }
        if self.counter + cost <= self.limit {
            self.counter += cost;
            true
        } else {
            false
        }
    }
}

/// The seed article's sliding window counter: two counters and an `f64` weight, the
/// window restarting at the first request after it expired.
///
/// # Examples
///
/// ```
/// use floodgate::reference::TextbookSlidingWindow;
/// let mut w = TextbookSlidingWindow::new(2, 100, 0);
/// assert!(w.allow(0, 2));
/// assert!(!w.allow(50, 1));
/// // The window restarts at 150 (not at 100), where the old 2 still weigh fully.
/// assert!(!w.allow(150, 1));
/// assert!(w.allow(200, 1)); // 2·(1 − 50/100) = 1 < 2
/// ```
#[derive(Clone, Debug)]
pub struct TextbookSlidingWindow {
    limit: f64,
    period: u64,
    current_window_start: u64,
    current_counter: f64,
    previous_counter: f64,
}

impl TextbookSlidingWindow {
    /// `limit` per `period` ns, the first window starting at `now`.
    pub fn new(limit: u64, period: u64, now: u64) -> Self {
        TextbookSlidingWindow {
            limit: limit as f64,
            period,
            current_window_start: now,
            current_counter: 0.0,
            previous_counter: 0.0,
        }
    }

    /// Switches windows if the current one expired, then admits `cost` if the weighted
    /// total is below the limit (the article's `total < limit`, for `cost` units:
    /// `total + cost − 1 < limit`).
    pub fn allow(&mut self, now: u64, cost: u64) -> bool {
        if cost == 0 {
            return true;
        }
        if now.saturating_sub(self.current_window_start) > self.period {
            self.previous_counter = self.current_counter;
            self.current_counter = 0.0;
            self.current_window_start = now;
        }
        let elapsed = now.saturating_sub(self.current_window_start) as f64;
        let prev_weight = 1.0 - elapsed / self.period as f64;
        let total = self.current_counter + self.previous_counter * prev_weight;
        if total + ((cost - 1) as f64) < self.limit {
            self.current_counter += cost as f64;
            true
        } else {
            false
        }
    }
}

/// The seed article's exact sliding log: a `Vec` of timestamps filtered with `retain`
/// on every call.
///
/// # Examples
///
/// ```
/// use floodgate::reference::TextbookSlidingLog;
/// let mut log = TextbookSlidingLog::new(1, 100);
/// assert!(log.allow(0));
/// assert!(!log.allow(99));
/// assert!(log.allow(100));
/// ```
#[derive(Clone, Debug)]
pub struct TextbookSlidingLog {
    limit: usize,
    period: u64,
    requests: Vec<u64>,
}

impl TextbookSlidingLog {
    /// `limit` per `period` ns.
    pub fn new(limit: usize, period: u64) -> Self {
        TextbookSlidingLog {
            limit,
            period,
            requests: Vec::new(),
        }
    }

    /// Drops timestamps older than the period, then admits one request if there is room.
    pub fn allow(&mut self, now: u64) -> bool {
        let period = self.period;
        // t > now − period, without going below zero.
        self.requests.retain(|&t| t.saturating_add(period) > now);
        if self.requests.len() < self.limit {
            self.requests.push(now);
            true
        } else {
            false
        }
    }
}

/// A slot granted by [`ExactShaper::reserve`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExactSlot {
    /// When the request may proceed.
    pub ready_at: u64,
    /// The theoretical arrival time right after the reservation.
    pub tat: u128,
    /// Units reserved.
    pub units: u64,
    /// The schedule every cancellation had given back when this was reserved.
    pub noted: u128,
}

/// Reservations on GCRA straight from their definition, in `u128`: the slot of `n`
/// units is the instant `tat + n·T − B·T` at which a plain GCRA check of them would
/// first succeed; a refund gives back the units nobody may have reserved after them
/// (`x/time/rate`'s rule, counting as "after" all the schedule that cancellations
/// since the reservation may have moved it by: those that moved a later
/// reservation, while the latest 8 such reach back to the reservation, as the
/// shaper's record does, every cancellation since otherwise).
///
/// # Examples
///
/// ```
/// use floodgate::reference::ExactShaper;
/// let mut m = ExactShaper::new(10, 1_000, 1)?; // T = 100 ns, B = 1
/// assert_eq!(m.reserve(0, 1, 1_000).unwrap().ready_at, 0);
/// assert_eq!(m.reserve(0, 1, 1_000).unwrap().ready_at, 100);
/// assert_eq!(m.reserve(0, 1, 50), Err(Some(150)));
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
#[derive(Clone, Debug)]
pub struct ExactShaper {
    t: u128,
    b: u128,
    tat: Option<u128>,
    /// Schedule given back by every cancellation so far.
    given_back: u128,
    /// The latest cancellations that moved a later reservation (the total before,
    /// what they gave back), at most [`RECORDED`] + 1: the oldest is the newest the
    /// shaper's record has dropped once it holds that many.
    recorded: std::collections::VecDeque<(u128, u128)>,
}

/// How many cancellations the shaper's record holds (`cell::RECENT_REFUNDS`).
const RECORDED: usize = 8;

impl ExactShaper {
    /// `limit` per `period_nanos` with capacity `burst`.
    ///
    /// # Errors
    ///
    /// The [`PolicyError`] that [`Policy`] gives for the same numbers.
    pub fn new(limit: u64, period_nanos: u64, burst: u64) -> Result<ExactShaper, PolicyError> {
        validated(limit, period_nanos, burst)?;
        Ok(ExactShaper {
            t: u128::from(period_nanos.div_ceil(limit)),
            b: u128::from(burst),
            tat: None,
            given_back: 0,
            recorded: std::collections::VecDeque::new(),
        })
    }

    /// Reserves `cost` units at `now` if their slot is at most `max_delay` ns away.
    /// `Err(Some(wait))`: too far, retry after `wait`; `Err(None)`: never.
    pub fn reserve(
        &mut self,
        now: u64,
        cost: u32,
        max_delay: u64,
    ) -> Result<ExactSlot, Option<u64>> {
        let now = u128::from(now);
        let n = u128::from(cost);
        if n > self.b {
            return Err(None);
        }
        let tat = self.tat.unwrap_or(now).max(now);
        if n == 0 {
            return Ok(ExactSlot {
                ready_at: now as u64,
                tat,
                units: 0,
                noted: self.given_back,
            });
        }
        let new_tat = tat + n * self.t;
        let slot = (new_tat as i128 - (self.b * self.t) as i128).max(now as i128) as u128;
        let delay = slot - now;
        if delay > u128::from(max_delay) {
            return Err(Some(
                u64::try_from(delay - u128::from(max_delay)).unwrap_or(u64::MAX - 1),
            ));
        }
        if new_tat > u128::from(u64::MAX) {
            return Err(None);
        }
        self.tat = Some(new_tat);
        Ok(ExactSlot {
            ready_at: slot as u64,
            tat: new_tat,
            units: n as u64,
            noted: self.given_back,
        })
    }

    /// Cancels `slot` at `now`; returns the units given back.
    pub fn cancel(&mut self, now: u64, slot: ExactSlot) -> u64 {
        if u128::from(now) > u128::from(slot.ready_at) {
            return 0;
        }
        let current = self.tat.unwrap_or(0);
        // Cancellations since this reservation may have moved it down by up to what
        // they gave back: everything above its lowest possible end may be later units.
        // One that moved no later reservation moved nobody; once the record has
        // dropped one since the reservation, all count.
        let reach = match self.recorded.front() {
            Some(&(before, moved)) if self.recorded.len() > RECORDED => before + moved,
            _ => 0,
        };
        let shift = if slot.noted >= reach {
            self.recorded
                .iter()
                .filter(|&&(before, _)| before >= slot.noted)
                .map(|&(_, moved)| moved)
                .sum()
        } else {
            self.given_back - slot.noted
        };
        let lowest_end = slot.tat.saturating_sub(shift);
        let later = current.saturating_sub(lowest_end).div_ceil(self.t);
        let back = u128::from(slot.units).saturating_sub(later);
        if back > 0 {
            self.tat = Some(current.saturating_sub(back * self.t));
            if current > lowest_end {
                self.recorded.push_back((self.given_back, back * self.t));
                if self.recorded.len() > RECORDED + 1 {
                    self.recorded.pop_front();
                }
            }
            self.given_back += back * self.t;
        }
        back as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Numbers a `Policy` refuses build no model (a zero period divided by zero
    /// in `ExactGcra::check` and `ExactShaper::cancel`): the same error, every model.
    #[test]
    fn invalid_numbers_build_no_model() {
        const P: u64 = 1_000_000_000;
        let three = [
            (1, 0, 1),             // zero period
            (0, P, 1),             // zero limit
            (1, P, 0),             // zero burst
            (2, 1, 2),             // units closer than 1 ns
            (1, u64::MAX, 1),      // L·T past 2^62 ns
            (1 << 40, P, 1 << 62), // B·T past 2^62 ns
        ];
        for (limit, period, burst) in three {
            let policy = validated(limit, period, burst).unwrap_err();
            assert_eq!(ExactGcra::new(limit, period, burst).unwrap_err(), policy);
            assert_eq!(ExactShaper::new(limit, period, burst).unwrap_err(), policy);
        }
        for (limit, period) in [(1, 0), (0, P), (2, 1), (1, u64::MAX)] {
            let policy = validated(limit, period, limit).unwrap_err();
            assert_eq!(ExactFixedWindow::new(limit, period).unwrap_err(), policy);
            assert_eq!(ExactSlidingWindow::new(limit, period).unwrap_err(), policy);
            assert_eq!(ExactSlidingLog::new(limit, period).unwrap_err(), policy);
        }
        // A refused policy change leaves the model as it was.
        let mut m = ExactGcra::new(1, P, 1).unwrap();
        assert!(m.check(0, 1).is_allowed());
        assert!(m.set_policy(1, 0, 1).is_err());
        assert_eq!(m.check(0, 1).retry_after_nanos(), Some(P));
        // The largest numbers it accepts still build.
        assert!(ExactGcra::new(1, 1 << 62, 1).is_ok());
        assert!(ExactSlidingLog::new(1, 1 << 62).is_ok());
    }
}
