//! The sliding window counter: the previous window's count, weighted by how much of
//! it still overlaps the last period, plus the current window's count.
//!
//! # Semantics
//!
//! ```text
//! w = ⌊now/P⌋, e = now − w·P, prev = count of w−1 (0 if older), cur = count of w
//! estimate    = ⌊prev·(P − e)/P⌋ + cur            (the product in u128)
//! n > L                → deny, retry_after = never
//! estimate + n ≤ L     → allow, cur += n
//! otherwise            → deny, retry_after = the earliest instant the same request
//!                        would be admitted with no other traffic (this window, the
//!                        next, or the one after)
//! remaining   = L − estimate − (n if admitted), clamped at 0
//! reset_after = end of window w+1 if cur > 0 (after the decision),
//!               else end of window w if prev > 0, else 0
//! ```
//!
//! Cost 0 is always allowed and writes nothing. The floor means a request 1 ns past a
//! window edge can see one unit less of `prev`: intended, and exact. A reading earlier
//! than the window the state holds is judged at the start of that window (the state
//! never moves back); `reset_after` and `retry_after` are still measured from `now`.
//!
//! The admission test needs no division: `⌊X/P⌋ + cur + n ≤ L ⇔ X < (L − cur − n + 1)·P`
//! with `X = prev·(P − e)`, both sides in `u128`. `remaining` is left to the
//! [`Decision`] to divide lazily. `⌊now/P⌋` uses a precomputed reciprocal.
//!
//! # Packing and the policies that fit
//!
//! `{window mod 2^k, prev, cur}` in one word: both counters are `c` = bit length of
//! `L + 1` bits wide (so a count never fills its field and no state is all ones, see
//! [the layout rules](crate::window)), the window index gets `k = 64 − 2c` bits, and a
//! policy is accepted when an index wraps only after a key is idle for a year
//! (`2^(k−1)·P ≥ 365 days`), and `k ≥ 3` so that a count two windows old is
//! forgotten. So the largest limit is `2^30 − 2` and:
//!
//! | limit `L` up to | `c` | `k` | smallest period `P` |
//! |---|---|---|---|
//! | 1,022 | 10 | 44 | 3,586 ns (and `P ≥ L` ns) |
//! | 65,534 | 16 | 32 | 14,685,095 ns (14.69 ms) |
//! | 524,286 | 19 | 26 | 0.94 s |
//! | 1,048,574 | 20 | 24 | 3.76 s |
//! | 16,777,214 | 24 | 16 | 16.0 min |
//! | 1,073,741,822 | 30 | 4 | 45.6 days (`365 days / 8`) |
//!
//! A limit of the form `2^c − 1` takes the next row's width: 1,023 needs
//! `P ≥ 14,341 ns`, 65,535 needs `P ≥ 58,740,378 ns` (58.74 ms), and `2^30 − 1` does
//! not fit. Other policies are rejected with [`PolicyError::Unrepresentable`].
//!
//! # Refunds
//!
//! [`Algorithm::refund`] of `n` units at `now` gives back `min(n, cur)` from `cur`,
//! the count of the window a charge at `now` goes to (`now`'s window, or the stored
//! one when `now` reads earlier), keeping that window and `prev`. Once the window has
//! moved on, the charge is part of `prev` and weighs only `⌊prev·(P − e)/P⌋`, fading;
//! a refund then gives nothing back (`None`), as it does when `cur` or `n` is 0. So
//! `check(n)` then `refund(n)` at one instant leaves a state that decides like the one
//! before. One exception keeps a unit: where giving all back would leave the all-zero
//! word (the fresh, window-less state) at an index that has wrapped to 0, one unit
//! stays, so that a reading behind the window cannot move the state back.

use crate::algorithm::{Algorithm, Charged};
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::policy::{Policy, PolicyError};
use crate::window::{saturate, Age, WindowShape};

/// The sliding-window-counter transition for one [`Policy`] (`limit` per `period`;
/// `burst` is not used).
///
/// # Examples
///
/// ```
/// use floodgate::{ManualClock, Nanos, Policy, RateLimiter, SlidingWindow};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let limiter = RateLimiter::with_clock(SlidingWindow::new(Policy::per_minute(10)?)?, clock.clone());
/// assert!(limiter.check_n(10).is_allowed()); // window 0 is full
/// clock.set(Nanos::from_secs(90)); // half-way through window 1: ⌊10·30/60⌋ = 5 still weigh
/// let d = limiter.check_n(5);
/// assert!(d.is_allowed());
/// assert_eq!(d.remaining(), 0);
/// let denied = limiter.check_n(3);
/// // Three more fit once ⌊10·(60 − e)/60⌋ ≤ 2, i.e. 10·(60 s − e) < 180 s: e > 42 s.
/// assert_eq!(denied.retry_after(), Some(Duration::from_secs(12) + Duration::from_nanos(1)));
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlidingWindow {
    shape: WindowShape,
}

/// The sliding window counter's packed state: `{window mod 2^k, prev, cur}`; all-zero
/// is fresh. Read it with [`SlidingWindow::fields`].
///
/// # Examples
///
/// ```
/// use floodgate::{Policy, SlidingWindow, SlidingWindowState};
/// let sw = SlidingWindow::new(Policy::per_second(5)?)?;
/// assert_eq!(sw.fields(sw.state(3, 4, 1)), (3, 4, 1));
/// assert_eq!(sw.fields(SlidingWindowState::default()), (0, 0, 0));
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(8))]
pub struct SlidingWindowState {
    packed: u64,
}

const _: () = assert!(core::mem::size_of::<SlidingWindowState>() == 8);

const ALLOWED: &str =
    "sliding window: limit ≤ 2^30 − 2 and 2^(63 − 2·bits(limit + 1)) · period ≥ 365 days \
                       (see the table in floodgate::sliding_window)";

/// What a state means at `now`.
#[derive(Clone, Copy)]
struct View {
    /// The window to count in (possibly the stored one, ahead of `now`'s).
    window: u64,
    prev: u64,
    cur: u64,
    /// Elapsed time in that window at the effective instant.
    elapsed: u64,
    /// How far the effective instant is after `now` (0 unless the reading was early).
    lag: u64,
}

impl SlidingWindow {
    /// The sliding window counter for `policy`.
    ///
    /// # Errors
    ///
    /// [`PolicyError::Unrepresentable`] when the limit is above `2^30 − 2`
    /// (`field: "limit"`) or the period is below the table's smallest for that limit
    /// (`field: "period"`).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Policy, PolicyError, SlidingWindow};
    /// assert!(SlidingWindow::new(Policy::per_second(500_000)?).is_ok());
    /// assert!(matches!(
    ///     SlidingWindow::new(Policy::per_second(1_000_000)?),
    ///     Err(PolicyError::Unrepresentable { field: "period", .. })
    /// ));
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn new(policy: Policy) -> Result<SlidingWindow, PolicyError> {
        Ok(SlidingWindow {
            shape: WindowShape::for_policy(policy, 2, ALLOWED)?,
        })
    }

    /// The policy this transition enforces.
    ///
    /// # Examples
    ///
    /// ```
    /// let sw = floodgate::SlidingWindow::new(floodgate::Policy::per_second(3)?)?;
    /// assert_eq!(sw.policy().limit(), 3);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub const fn policy(&self) -> Policy {
        self.shape.policy
    }

    /// Bits of each counter (`c`, the bit length of `L + 1`); the window index has
    /// `64 − 2c`.
    ///
    /// # Examples
    ///
    /// ```
    /// let sw = floodgate::SlidingWindow::new(floodgate::Policy::per_second(1000)?)?;
    /// assert_eq!(sw.count_bits(), 10);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub const fn count_bits(&self) -> u32 {
        self.shape.layout.count_bits()
    }

    /// A state for window `window` (stored modulo `2^k`) with counts `prev` and `cur`,
    /// each clamped to `2^c − 2 ≥ L`, the largest a counter holds.
    ///
    /// # Examples
    ///
    /// ```
    /// let sw = floodgate::SlidingWindow::new(floodgate::Policy::per_second(3)?)?;
    /// assert_eq!(sw.fields(sw.state(1, 2, 3)), (1, 2, 3));
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn state(&self, window: u64, prev: u64, cur: u64) -> SlidingWindowState {
        let max = self.shape.layout.count_max();
        SlidingWindowState {
            packed: self.shape.layout.pack2(window, prev.min(max), cur.min(max)),
        }
    }

    /// `(window mod 2^k, prev, cur)` of a state.
    ///
    /// # Examples
    ///
    /// ```
    /// let sw = floodgate::SlidingWindow::new(floodgate::Policy::per_second(3)?)?;
    /// assert_eq!(sw.fields(sw.state(8, 0, 2)), (8, 0, 2));
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn fields(&self, state: SlidingWindowState) -> (u64, u64, u64) {
        let p = state.packed;
        (
            self.shape.layout.window_of(p),
            self.shape.layout.counter(p, 1),
            self.shape.layout.counter(p, 0),
        )
    }

    #[inline(always)]
    fn view(&self, state: SlidingWindowState, now: u64) -> View {
        let (w, e) = self.shape.reciprocal.split(now);
        let p = state.packed;
        let fresh = View {
            window: w,
            prev: 0,
            cur: 0,
            elapsed: e,
            lag: 0,
        };
        // Only the fresh state is window-less: empty counters in a stored window (a
        // refund emptied `cur` with `prev` at 0) still hold that window, so a reading
        // behind it is judged there and the state never goes back to an older window,
        // whose predecessor's count this state no longer knows.
        if p == 0 {
            return fresh;
        }
        let (prev, cur) = (
            self.shape.layout.counter(p, 1),
            self.shape.layout.counter(p, 0),
        );
        match self.shape.layout.age(self.shape.layout.window_of(p), w) {
            Age::Ahead(0) => View { prev, cur, ..fresh },
            Age::Ahead(1) => View { prev: cur, ..fresh },
            Age::Ahead(_) => fresh,
            // Judged at the start of the stored window w + a: a·P − e after now.
            Age::Behind(a) => View {
                window: self.shape.layout.window_of(p),
                prev,
                cur,
                elapsed: 0,
                lag: saturate(u128::from(a) * u128::from(self.shape.period) - u128::from(e)),
            },
        }
    }

    /// `max(L − used − ⌊X/P⌋, 0)` as `(headroom, unit)` for [`Decision`]'s lazy
    /// division: with `A = L − used`, `⌊(A·P + P − 1 − X)/P⌋ = A − ⌊X/P⌋`.
    #[inline(always)]
    fn headroom(&self, used: u64, weighted: u128) -> (u64, u64) {
        let Some(a) = self.shape.limit.checked_sub(used) else {
            return (0, 1);
        };
        self.headroom_below(
            (u128::from(a) + 1) * u128::from(self.shape.period),
            weighted,
        )
    }

    /// The same from `bound = (A + 1)·P`: headroom `bound − 1 − X`, clamped at 0.
    #[inline(always)]
    fn headroom_below(&self, bound: u128, weighted: u128) -> (u64, u64) {
        let h = (bound - 1).saturating_sub(weighted);
        match u64::try_from(h) {
            Ok(h) => (h, self.shape.period),
            // Only for long periods with large limits: divide here instead.
            Err(_) => (saturate(h / u128::from(self.shape.period)), 1),
        }
    }

    /// `reset_after` with `cur` counted after the decision.
    #[inline(always)]
    fn reset(&self, v: &View, cur: u64) -> u64 {
        let left = self.shape.period - v.elapsed;
        if cur > 0 {
            v.lag.saturating_add(left).saturating_add(self.shape.period)
        } else if v.prev > 0 {
            v.lag.saturating_add(left)
        } else {
            0
        }
    }

    /// Nanoseconds after the effective instant until `n` (≤ L) is admitted with no
    /// other traffic; the request was denied there.
    #[cold]
    fn retry(&self, v: &View, n: u64) -> u64 {
        let p = u128::from(self.shape.period);
        let e = u128::from(v.elapsed);
        let limit = u128::from(self.shape.limit);
        let n = u128::from(n);
        // Least x in [from, P) with prev·(P − x) < (room + 1)·P, if any.
        let first_fit = |weight: u128, room: u128, from: u128| -> Option<u128> {
            if weight == 0 {
                return Some(from);
            }
            // P − x ≤ ⌊((room + 1)·P − 1)/weight⌋: one 64-bit division whenever it fits
            // (every period under 18 s, and longer ones with little room), which is
            // many times cheaper than the 128-bit division routine.
            let numerator = (room + 1) * p - 1;
            let most = match (u64::try_from(numerator), u64::try_from(weight)) {
                (Ok(num), Ok(weight)) => u128::from(num / weight),
                _ => numerator / weight,
            };
            let x = p.saturating_sub(most).max(from);
            (x < p).then_some(x)
        };
        let cur = u128::from(v.cur);
        // This window: prev still fades, cur stays.
        if let Some(room) = limit.checked_sub(cur + n) {
            if let Some(x) = first_fit(u128::from(v.prev), room, e) {
                return saturate(x - e);
            }
        }
        // The next window: cur becomes prev and fades, nothing current.
        let to_next = p - e;
        match first_fit(cur, limit - n, 0) {
            Some(x) => saturate(to_next + x),
            // The window after: nothing weighs.
            None => saturate(to_next + p),
        }
    }
}

impl Algorithm for SlidingWindow {
    type State = SlidingWindowState;

    #[inline(always)]
    fn decide(
        &self,
        state: SlidingWindowState,
        now: Nanos,
        cost: u32,
    ) -> (Decision, Option<SlidingWindowState>) {
        let v = self.view(state, now.as_u64());
        let limit = self.shape.limit;
        let n = u64::from(cost);
        // X = prev·(P − e) < 2^31 · 2^64.
        let weighted = u128::from(v.prev) * u128::from(self.shape.period - v.elapsed);
        if n > limit {
            let (h, unit) = self.headroom(v.cur, weighted);
            return (Decision::never(limit, h, unit, self.reset(&v, v.cur)), None);
        }
        if n == 0 {
            let (h, unit) = self.headroom(v.cur, weighted);
            return (Decision::allow(limit, h, unit, self.reset(&v, v.cur)), None);
        }
        // ⌊X/P⌋ + cur + n ≤ L  ⇔  X < (L − cur − n + 1)·P = bound
        let bound = match limit.checked_sub(v.cur + n) {
            Some(room) => (u128::from(room) + 1) * u128::from(self.shape.period),
            None => 0,
        };
        if weighted < bound {
            // cur + n ≤ L ≤ 2^c − 2: the lowest counter is never all ones.
            let cur = v.cur + n;
            // remaining = L − cur − ⌊X/P⌋, from the same bound.
            let (h, unit) = self.headroom_below(bound, weighted);
            let next = SlidingWindowState {
                packed: self.shape.layout.pack2(v.window, v.prev, cur),
            };
            // cur > 0 now: reset at the end of the next window.
            let reset = v
                .lag
                .saturating_add(self.shape.period - v.elapsed)
                .saturating_add(self.shape.period);
            (Decision::allow(limit, h, unit, reset), Some(next))
        } else {
            let (h, unit) = self.headroom(v.cur, weighted);
            let retry = v.lag.saturating_add(self.retry(&v, n));
            (
                Decision::deny(limit, h, unit, self.reset(&v, v.cur), retry),
                None,
            )
        }
    }

    /// Empty counters are idle only when judged at `now` itself: a state whose window
    /// is after `now`'s (a refund emptied it) judges a reading behind it at the start of
    /// that window (`lag > 0`), so forgetting it would move such a reading back to
    /// its own, older window (the keyed tables reclaim at an insert's reading, which
    /// may be behind a key's window).
    #[inline]
    fn is_idle(&self, state: SlidingWindowState, now: Nanos) -> bool {
        let v = self.view(state, now.as_u64());
        v.prev == 0 && v.cur == 0 && v.lag == 0
    }

    /// Gives back `min(cost, cur)` units from `cur` while the state still holds the
    /// window the charge counted in (the stored window of `charge.after`), keeping the
    /// window and `prev`. Once another admission has moved the state on, the charge is
    /// part of `prev` (or gone) and nothing is given back (`None`), as when `cur` or
    /// `cost` is 0. `now` does not matter: the stored window says whose units `cur`
    /// holds. A charge refunded before anything else leaves a state that decides like
    /// the one before it.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Algorithm, Charged, Nanos, Policy, SlidingWindow};
    /// let sw = SlidingWindow::new(Policy::per_minute(10)?)?;
    /// let now = Nanos::from_secs(75);
    /// let charge = Charged { before: sw.state(1, 2, 1), after: sw.state(1, 2, 4), at: now, cost: 3 };
    /// assert_eq!(sw.refund(sw.state(1, 2, 4), &charge, 0, now).map(|r| r.0), Some(sw.state(1, 2, 1)));
    /// assert_eq!(sw.refund(sw.state(1, 2, 1), &charge, 0, now).map(|r| r.0), Some(sw.state(1, 2, 0))); // prev is kept
    /// // In the next window the units are `prev`, fading: nothing is given back.
    /// assert_eq!(sw.refund(sw.state(2, 4, 1), &charge, 0, Nanos::from_secs(130)).map(|r| r.0), None);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    fn refund(
        &self,
        state: SlidingWindowState,
        charge: &Charged<SlidingWindowState>,
        _shift: u64,
        now: Nanos,
    ) -> Option<(SlidingWindowState, u64)> {
        let (window, prev, cur) = self.fields(state);
        if window != self.fields(charge.after).0 {
            return None;
        }
        let mut back = u64::from(charge.cost).min(cur);
        // Never the all-zero (fresh) word at a wrapped index: it would lose the window.
        back = back.saturating_sub(self.shape.kept_by_refund(
            self.shape.layout.pack2(window, prev, cur - back),
            charge.at.as_u64(),
            now.as_u64(),
        ));
        // Only cur shrinks, in the window it counts in: every field stays ≤ count_max.
        // A count moves nobody's booking: nothing for the refund ledger.
        (back > 0).then(|| {
            let packed = self.shape.layout.pack2(window, prev, cur - back);
            (SlidingWindowState { packed }, 0)
        })
    }

    /// Same period: the counts that weigh at `now` carry over, re-packed for the new
    /// limit. A count wider than the new counters is clamped to their maximum
    /// (`2^c − 2 ≥ L`): the current window stays full, but a clamped `prev` fades
    /// faster than the original would have. Another period: fresh windows.
    fn carry_over(
        &self,
        previous: &Self,
        state: SlidingWindowState,
        now: Nanos,
    ) -> SlidingWindowState {
        if previous.shape.period != self.shape.period || previous.is_idle(state, now) {
            return SlidingWindowState::default();
        }
        let v = previous.view(state, now.as_u64());
        // `view` gives `now`'s window, or the stored one (reduced) if `now` reads
        // earlier: rebuild the full index from `now`'s.
        let (w, _) = self.shape.reciprocal.split(now.as_u64());
        let window = match previous.shape.layout.age(v.window, w) {
            Age::Behind(a) => w.wrapping_add(a),
            Age::Ahead(_) => w,
        };
        self.state(window, v.prev, v.cur)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use core::time::Duration;

    const S: u64 = 1_000_000_000;

    fn sw(limit: u64, period: Duration) -> SlidingWindow {
        SlidingWindow::new(Policy::new(limit, period).unwrap()).unwrap()
    }

    #[test]
    fn weighted_estimate_exact_values() {
        // 10 per 60 s. Window 1 = [60, 120) s held 8; now window 2, 15 s in.
        let f = sw(10, Duration::from_secs(60));
        let s = f.state(1, 3, 8);
        let now = Nanos::from_secs(135);
        // prev = 8, e = 15 s: ⌊8·45/60⌋ = 6; estimate 6, remaining 4.
        let (d, next) = f.decide(s, now, 0);
        assert!(d.is_allowed() && next.is_none());
        assert_eq!(d.remaining(), 4);
        // prev > 0, cur = 0: until the end of window 2 (45 s).
        assert_eq!(d.reset_after(), Duration::from_secs(45));
        let (d, next) = f.decide(s, now, 4);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 0);
        // cur > 0: until the end of window 3.
        assert_eq!(d.reset_after(), Duration::from_secs(105));
        let next = next.unwrap();
        assert_eq!(f.fields(next), (2, 8, 4));
        // Now estimate 10: one more waits until ⌊8·(60 − x)/60⌋ ≤ 5 ⇔ 8·(60 − x) < 360
        // ⇔ x > 15 s: x = 15 s + 1 ns.
        let (d, _) = f.decide(next, now, 1);
        assert!(!d.is_allowed());
        assert_eq!(d.retry_after_nanos(), Some(1));
        // Five more need ⌊8·(60 − x)/60⌋ ≤ 1 ⇔ 8·(60 − x) < 120 ⇔ x > 45 s.
        let (d, _) = f.decide(next, now, 5);
        assert_eq!(d.retry_after_nanos(), Some(30 * S + 1));
        assert_eq!(d.remaining(), 0);
        assert_eq!(d.reset_after(), Duration::from_secs(105));
    }

    #[test]
    fn retry_may_fall_in_the_next_window_or_the_one_after() {
        let f = sw(10, Duration::from_secs(10));
        // cur = 7 in window 0: 4 more can't fit in window 0 (7 + 4 > 10).
        let s = f.state(0, 0, 7);
        let (d, _) = f.decide(s, Nanos::from_secs(2), 4);
        assert!(!d.is_allowed());
        // Window 1: ⌊7·(10 − x)/10⌋ + 4 ≤ 10 ⇔ 7·(10 − x) < 70 ⇔ x > 0: 8 s + 1 ns.
        assert_eq!(d.retry_after_nanos(), Some(8 * S + 1));
        // A full window and a full cost: window 1 once ⌊10·(P − x)/P⌋ = 0 ⇔ x > 9 s.
        let s = f.state(0, 0, 10);
        let (d, _) = f.decide(s, Nanos::from_secs(2), 10);
        assert_eq!(d.retry_after_nanos(), Some(17 * S + 1));
        // With L = P = 5 ns, ⌊5·(5 − x)/5⌋ ≥ 1 for every x < 5: the window after next.
        let g = sw(5, Duration::from_nanos(5));
        let (d, _) = g.decide(g.state(0, 0, 5), Nanos::new(2), 5);
        assert_eq!(d.retry_after_nanos(), Some(8));
        // Cost 1 after a full window: fits in window 1 once ⌊10·(P − x)/P⌋ ≤ 9, at x = 1 ns.
        let (d, _) = f.decide(s, Nanos::from_secs(2), 1);
        assert_eq!(d.retry_after_nanos(), Some(8 * S + 1));
        // In the same window, cost above the room but fitting later in this window.
        let s = f.state(1, 10, 0);
        let (d, _) = f.decide(s, Nanos::from_secs(10), 3);
        // At e = 0: ⌊10·10/10⌋ = 10. Fits when ⌊(10 − x)⌋ ≤ 7 ⇔ 10 − x < 8 ⇔ x > 2 s.
        assert!(!d.is_allowed());
        assert_eq!(d.retry_after_nanos(), Some(2 * S + 1));
    }

    #[test]
    fn the_floor_gives_one_unit_just_past_the_edge() {
        let f = sw(10, Duration::from_secs(1));
        let s = f.state(0, 0, 10);
        // At the edge: prev = 10 weighs fully.
        assert!(!f.decide(s, Nanos::new(S), 1).0.is_allowed());
        // 1 ns later ⌊10·(P − 1)/P⌋ = 9.
        let (d, _) = f.decide(s, Nanos::new(S + 1), 1);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 0);
    }

    #[test]
    fn costs_zero_and_above_the_limit() {
        let f = sw(5, Duration::from_secs(1));
        let s = f.state(4, 2, 1);
        for cost in [6, u32::MAX] {
            let (d, next) = f.decide(s, Nanos::new(4 * S + S / 2), cost);
            assert!(!d.is_allowed() && next.is_none());
            assert_eq!(d.retry_after(), None);
            // ⌊2·0.5⌋ + 1 = 2 → remaining 3.
            assert_eq!(d.remaining(), 3);
            assert_eq!(d.reset_after_nanos(), S + S / 2);
        }
        // Fresh key: remaining L, reset 0.
        let (d, _) = f.decide(SlidingWindowState::default(), Nanos::new(S), 0);
        assert_eq!((d.remaining(), d.reset_after_nanos()), (5, 0));
    }

    #[test]
    fn gaps_roll_the_windows() {
        let f = sw(5, Duration::from_secs(1));
        let s = f.state(4, 2, 3);
        // Next window: prev = 3 at e = 0 weighs 3.
        let (d, next) = f.decide(s, Nanos::new(5 * S), 2);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 0);
        assert_eq!(f.fields(next.unwrap()), (5, 3, 2));
        // Two windows later: fresh.
        assert!(f.is_idle(s, Nanos::new(6 * S)));
        assert!(!f.is_idle(s, Nanos::new(6 * S - 1)));
        let (d, next) = f.decide(s, Nanos::new(6 * S), 5);
        assert!(d.is_allowed());
        assert_eq!(f.fields(next.unwrap()), (6, 0, 5));
        // prev = 0 and cur = 0 after one roll: idle.
        assert!(f.is_idle(f.state(4, 7, 0), Nanos::new(5 * S)));
    }

    #[test]
    fn an_earlier_reading_is_judged_at_the_stored_window_start() {
        let f = sw(4, Duration::from_secs(1));
        let s = f.state(7, 4, 0);
        // 6.75 s is before window 7: judged at 7.0 s (prev = 4 weighs fully), 0.25 s later.
        let now = Nanos::new(6 * S + 3 * S / 4);
        let (d, next) = f.decide(s, now, 1);
        assert!(!d.is_allowed() && next.is_none());
        // ⌊4·(1 − x)⌋ ≤ 3 from x = 1 ns: 0.25 s + 1 ns.
        assert_eq!(d.retry_after_nanos(), Some(S / 4 + 1));
        assert_eq!(d.reset_after_nanos(), S + S / 4);
        assert!(!f.is_idle(s, now));
    }

    #[test]
    fn policies_at_the_edges_of_the_table() {
        let min16 = crate::YEAR_NANOS.div_ceil(1 << 31);
        assert_eq!(min16, 14_685_095);
        let ok = SlidingWindow::new(Policy::new(65_534, Duration::from_nanos(min16)).unwrap());
        assert_eq!(ok.unwrap().count_bits(), 16);
        let err = SlidingWindow::new(Policy::new(65_534, Duration::from_nanos(min16 - 1)).unwrap());
        assert!(matches!(
            err,
            Err(PolicyError::Unrepresentable {
                field: "period",
                value,
                ..
            }) if value == min16 - 1
        ));
        // 65,535 = 2^16 − 1 takes 17-bit counters (k = 30): P ≥ ⌈year / 2^29⌉.
        let min17 = crate::YEAR_NANOS.div_ceil(1 << 29);
        assert_eq!(min17, 58_740_378);
        let at = |limit: u64, p: u64| {
            SlidingWindow::new(Policy::new(limit, Duration::from_nanos(p)).unwrap())
        };
        assert_eq!(at(65_535, min17).unwrap().count_bits(), 17);
        assert!(at(65_535, min17 - 1).is_err());
        assert!(at(65_535, min16).is_err());
        // The table's first row: 1,022 at 3,586 ns; 1,023 needs 14,341 ns.
        assert_eq!(at(1_022, 3_586).unwrap().count_bits(), 10);
        assert!(at(1_022, 3_585).is_err());
        assert_eq!(at(1_023, 14_341).unwrap().count_bits(), 11);
        assert!(at(1_023, 14_340).is_err());
        let p = crate::YEAR_NANOS / 8;
        let eighth = Duration::from_nanos(p);
        assert_eq!(p, 3_942_000_000_000_000);
        assert!(SlidingWindow::new(Policy::new((1 << 30) - 2, eighth).unwrap()).is_ok());
        assert!(SlidingWindow::new(
            Policy::new((1 << 30) - 2, eighth - Duration::from_nanos(1)).unwrap()
        )
        .is_err());
        for limit in [(1 << 30) - 1, 1 << 30] {
            assert!(matches!(
                SlidingWindow::new(Policy::new(limit, eighth * 16).unwrap()),
                Err(PolicyError::Unrepresentable { field: "limit", value, .. }) if value == limit
            ));
        }
        // The largest limit: k = 4, an index looks earlier after 8 idle windows (1 year).
        let f = sw((1 << 30) - 2, eighth);
        assert_eq!(f.count_bits(), 30);
        let s = f.state(0, 0, 1);
        assert!(!f.is_idle(s, Nanos::new(2 * p - 1)));
        assert!(f.is_idle(s, Nanos::new(2 * p)));
        assert!(f.is_idle(s, Nanos::new(8 * p - 1)));
        // Idle 8 windows: looks earlier, the stale unit counts again (stricter).
        assert!(!f.is_idle(s, Nanos::new(8 * p)));
    }

    #[test]
    fn a_policy_change_carries_counts_or_starts_fresh() {
        let old = sw(10, Duration::from_secs(1));
        let s = old.state(4, 3, 6);
        // Same period, larger limit: window 4's counts, read at 4.5 s.
        let big = sw(100, Duration::from_secs(1));
        let now = Nanos::new(4 * S + S / 2);
        let c = big.carry_over(&old, s, now);
        assert_eq!(big.fields(c), (4, 3, 6));
        // ⌊3·0.5⌋ + 6 = 7 → remaining 93.
        assert_eq!(big.decide(c, now, 0).0.remaining(), 93);
        // One window later the counts have rolled: prev = 6.
        assert_eq!(
            big.fields(big.carry_over(&old, s, Nanos::new(5 * S))),
            (5, 6, 0)
        );
        // An earlier reading keeps the stored window.
        assert_eq!(
            big.fields(big.carry_over(&old, s, Nanos::new(3 * S))),
            (4, 3, 6)
        );
        // A smaller limit clamps to its 2-bit counters' maximum, 2^2 − 2.
        let small = sw(2, Duration::from_secs(1));
        assert_eq!(small.fields(small.carry_over(&old, s, now)), (4, 2, 2));
        assert!(!small
            .decide(small.carry_over(&old, s, now), now, 1)
            .0
            .is_allowed());
        // Another period, or nothing that weighs: fresh.
        let minute = sw(10, Duration::from_secs(60));
        assert_eq!(
            minute.carry_over(&old, s, now),
            SlidingWindowState::default()
        );
        assert_eq!(
            big.carry_over(&old, s, Nanos::new(6 * S)),
            SlidingWindowState::default()
        );
    }

    #[test]
    fn refunds_give_back_only_from_the_window_charged() {
        // 10 per second; window 4 holds prev 6 (of window 3) and cur 2, then 3 more.
        let f = sw(10, Duration::from_secs(1));
        let before = f.state(4, 6, 2);
        let now = Nanos::new(4 * S + S / 2);
        let after = f.decide(before, now, 3).1.unwrap();
        assert_eq!(f.fields(after), (4, 6, 5));
        let charge = Charged {
            before,
            after,
            at: now,
            cost: 3,
        };
        // ⌊6·0.5⌋ + 5 = 8 → remaining 2; 3 back: ⌊6·0.5⌋ + 2 = 5 → remaining 5.
        assert_eq!(f.decide(after, now, 0).0.remaining(), 2);
        let r = f.refund(after, &charge, 0, now).map(|r| r.0).unwrap();
        assert_eq!(r, before);
        assert_eq!(f.decide(r, now, 0).0.remaining(), 5);
        // Less than charged is left (others refunded): down to zero, prev untouched.
        let r = f
            .refund(f.state(4, 6, 1), &charge, 0, now)
            .map(|r| r.0)
            .unwrap();
        assert_eq!(f.fields(r), (4, 6, 0));
        // Nothing current, or a state moved on by another request: nothing back.
        assert_eq!(
            f.refund(f.state(4, 6, 0), &charge, 0, now).map(|r| r.0),
            None
        );
        assert_eq!(
            f.refund(f.state(5, 5, 1), &charge, 0, Nanos::new(5 * S))
                .map(|r| r.0),
            None
        );
        assert_eq!(
            f.refund(f.state(5, 5, 1), &charge, 0, now).map(|r| r.0),
            None
        );
        // While the state holds window 4, the reading does not matter: a later reading
        // gives back from cur (which would become prev, weighing for the next window).
        assert_eq!(
            f.refund(after, &charge, 0, Nanos::new(5 * S + 1))
                .map(|r| r.0),
            Some(before)
        );
    }

    #[test]
    fn a_long_period_with_a_large_limit_divides_eagerly() {
        // L·P past u64: remaining must still be exact.
        let f = sw(1 << 29, Duration::from_secs(400 * 86_400));
        let p = 400 * 86_400 * S;
        let s = f.state(1, 1 << 28, 0);
        let (d, _) = f.decide(s, Nanos::new(p + p / 2), 0);
        // ⌊2^28 · 0.5⌋ = 2^27 → remaining 2^29 − 2^27.
        assert_eq!(d.remaining(), (1 << 29) - (1 << 27));
    }
}
