//! The fixed window: at most `L` units in each window `[w·P, (w+1)·P)`, windows aligned
//! to the clock's origin (the Unix epoch for the default clocks, so a per-minute window
//! starts on the minute).
//!
//! # Semantics
//!
//! ```text
//! w = ⌊now/P⌋, count = units admitted in w
//! n > L              → deny, retry_after = never
//! count + n ≤ L      → allow, count += n
//! otherwise          → deny, retry_after = reset_after
//! remaining   = L − count (after the decision)
//! reset_after = (w+1)·P − now
//! ```
//!
//! Cost 0 is always allowed and writes nothing. A reading *earlier* than the window
//! the state holds (another core's clock) is judged in the stored window — the state
//! never moves back — so `reset_after` is then measured to the end of that window.
//!
//! # Refunds
//!
//! [`Algorithm::refund`] of `n` units at `now` gives back `min(n, count)` from the
//! count of the window a charge at `now` goes to (`now`'s window, or the stored one
//! when `now` reads earlier), keeping that window. If the state holds an older window,
//! the charge no longer counts at all and nothing is given back (`None`); nor when
//! the count or `n` is 0. So `check(n)` then `refund(n)` at one instant leaves a state
//! that decides like the one before. One exception keeps a unit: where giving all back
//! would leave the all-zero word (the fresh, window-less state) at an index that has
//! wrapped to 0, one unit stays, so that a reading behind the window cannot move the
//! state back to an older window.
//!
//! # Packing
//!
//! `{window mod 2^k, count}` in one word, the count `c` = bit length of `L + 1` bits
//! wide (so a count never fills its field: no state is all ones, see
//! [the layout rules](crate::window)) and `k = 64 − c`. Because `c ≥ 2` and
//! `P ≥ L ≥ 2^(c−1) − 1` for every valid [`Policy`], the index wraps only after
//! `2^(k−1)·P ≥ 2^62 − 2^(63−c) ≥ 2^61` ns (≈ 73 years) of idleness, so **every policy
//! fits except `L = 2^62 − 1` and `L = 2^62`** (the largest `L` is `2^62 − 2`; the
//! smallest `P` is 1 ns, with `L = 1`).
//!
//! `⌊now/P⌋` is computed with a precomputed reciprocal (one 128-bit multiply-high),
//! not a division instruction.

use crate::algorithm::{Algorithm, Charged};
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::policy::{Policy, PolicyError};
use crate::window::{counted, saturate, Age, WindowShape};

/// The fixed-window transition for one [`Policy`] (`limit` per `period`; `burst` is
/// not used).
///
/// # Examples
///
/// ```
/// use floodgate::{FixedWindow, ManualClock, Nanos, Policy, RateLimiter};
/// use std::time::Duration;
///
/// let clock = ManualClock::starting_at(Nanos::from_secs(60)); // 1:00
/// let limiter = RateLimiter::with_clock(FixedWindow::new(Policy::per_minute(2)?)?, clock.clone());
/// clock.advance(Duration::from_secs(45));
/// assert!(limiter.check().is_allowed());
/// assert!(limiter.check().is_allowed());
/// let denied = limiter.check();
/// assert!(!denied.is_allowed());
/// // The window ends at 2:00, 15 s from now.
/// assert_eq!(denied.retry_after(), Some(Duration::from_secs(15)));
/// clock.advance(Duration::from_secs(15));
/// assert!(limiter.check().is_allowed());
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FixedWindow {
    shape: WindowShape,
}

/// The fixed window's packed state: `{window mod 2^k, count}` (see [`FixedWindow`]);
/// all-zero is fresh. Read it with [`FixedWindow::window_of`] and
/// [`FixedWindow::count_of`].
///
/// # Examples
///
/// ```
/// use floodgate::{FixedWindow, FixedWindowState, Policy};
/// let fw = FixedWindow::new(Policy::per_second(5)?)?;
/// let s = fw.state(7, 3);
/// assert_eq!((fw.window_of(s), fw.count_of(s)), (7, 3));
/// assert_eq!(fw.count_of(FixedWindowState::default()), 0);
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(8))]
pub struct FixedWindowState {
    packed: u64,
}

const _: () = assert!(core::mem::size_of::<FixedWindowState>() == 8);

const ALLOWED: &str = "fixed window: limit ≤ 2^62 − 2";

impl FixedWindow {
    /// The fixed window for `policy`.
    ///
    /// # Errors
    ///
    /// [`PolicyError::Unrepresentable`] for `limit = 2^62 − 1` and `limit = 2^62`, the
    /// two valid policies whose count leaves too few bits for the window index.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{FixedWindow, Policy};
    /// use std::time::Duration;
    /// let fw = FixedWindow::new(Policy::per_hour(1000)?)?;
    /// assert_eq!(fw.policy().limit(), 1000);
    /// let largest = (1 << 62) - 2;
    /// assert!(FixedWindow::new(Policy::new(largest, Duration::from_nanos(largest))?).is_ok());
    /// assert!(FixedWindow::new(Policy::new(largest + 1, Duration::from_nanos(largest + 1))?).is_err());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn new(policy: Policy) -> Result<FixedWindow, PolicyError> {
        Ok(FixedWindow {
            shape: WindowShape::for_policy(policy, 1, ALLOWED)?,
        })
    }

    /// The policy this transition enforces.
    ///
    /// # Examples
    ///
    /// ```
    /// let fw = floodgate::FixedWindow::new(floodgate::Policy::per_second(3)?)?;
    /// assert_eq!(fw.policy().period().as_secs(), 1);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub const fn policy(&self) -> Policy {
        self.shape.policy
    }

    /// Bits of the count (`c`, the bit length of `L + 1`); the window index has `64 − c`.
    ///
    /// # Examples
    ///
    /// ```
    /// let fw = floodgate::FixedWindow::new(floodgate::Policy::per_second(1000)?)?;
    /// assert_eq!(fw.count_bits(), 10);
    /// // 1023 = 2^10 − 1 would fill ten bits: it takes eleven.
    /// let fw = floodgate::FixedWindow::new(floodgate::Policy::per_second(1023)?)?;
    /// assert_eq!(fw.count_bits(), 11);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub const fn count_bits(&self) -> u32 {
        self.shape.layout.count_bits()
    }

    /// A state holding `count` units in window `window` (stored modulo `2^(64 − c)`).
    /// The count is clamped to `2^c − 2 ≥ L`, the largest a count field holds.
    ///
    /// # Examples
    ///
    /// ```
    /// let fw = floodgate::FixedWindow::new(floodgate::Policy::per_second(3)?)?;
    /// assert_eq!(fw.count_of(fw.state(1, 2)), 2);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn state(&self, window: u64, count: u64) -> FixedWindowState {
        FixedWindowState {
            packed: self
                .shape
                .layout
                .pack(window, count.min(self.shape.layout.count_max())),
        }
    }

    /// The window index a state holds, modulo `2^(64 − c)`.
    ///
    /// # Examples
    ///
    /// ```
    /// let fw = floodgate::FixedWindow::new(floodgate::Policy::per_second(3)?)?;
    /// assert_eq!(fw.window_of(fw.state(9, 1)), 9);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn window_of(&self, state: FixedWindowState) -> u64 {
        self.shape.layout.window_of(state.packed)
    }

    /// The count a state holds for its window.
    ///
    /// # Examples
    ///
    /// ```
    /// let fw = floodgate::FixedWindow::new(floodgate::Policy::per_second(3)?)?;
    /// assert_eq!(fw.count_of(fw.state(9, 1)), 1);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn count_of(&self, state: FixedWindowState) -> u64 {
        self.shape.layout.counter(state.packed, 0)
    }

    /// The window to count in, its count, and `reset_after` (to that window's end).
    #[inline(always)]
    fn view(&self, state: FixedWindowState, now: u64) -> (u64, u64, u64) {
        let (w, e) = self.shape.reciprocal.split(now);
        let count = self.shape.layout.counter(state.packed, 0);
        // Only the fresh state is window-less: an empty count in a stored window
        // (a refund emptied it) still holds that window, so a reading behind it
        // counts there and the state never goes back to an older window, whose
        // count this state no longer knows.
        if state.packed == 0 {
            return (w, 0, self.shape.period - e);
        }
        let stored = self.shape.layout.window_of(state.packed);
        match self.shape.layout.age(stored, w) {
            Age::Ahead(0) => (w, count, self.shape.period - e),
            Age::Ahead(_) => (w, 0, self.shape.period - e),
            // `now` reads before the stored window `w + a`: count there; it ends at
            // (w + a + 1)·P = now + (a + 1)·P − e.
            Age::Behind(a) => {
                let end = u128::from(a + 1) * u128::from(self.shape.period) - u128::from(e);
                (stored, count, saturate(end))
            }
        }
    }
}

impl Algorithm for FixedWindow {
    type State = FixedWindowState;

    #[inline(always)]
    fn decide(
        &self,
        state: FixedWindowState,
        now: Nanos,
        cost: u32,
    ) -> (Decision, Option<FixedWindowState>) {
        let (window, count, reset) = self.view(state, now.as_u64());
        let n = u64::from(cost);
        let (decision, admit) = counted(self.shape.limit, count, n, reset, || reset, || reset);
        // Admitted: count + n ≤ L ≤ 2^c − 2 fits its field and is not all ones.
        let next = admit.then(|| FixedWindowState {
            packed: self.shape.layout.pack(window, count + n),
        });
        (decision, next)
    }

    /// An empty count is idle only in `now`'s own window (or an older one): a state
    /// a refund emptied in a window *after* `now`'s still holds that window, where a
    /// later reading behind it is counted (forgetting it would count that reading in
    /// its own, older window, whose count the state no longer knows: the keyed
    /// tables reclaim at an insert's reading, which may be behind a key's window).
    #[inline]
    fn is_idle(&self, state: FixedWindowState, now: Nanos) -> bool {
        let now = now.as_u64();
        let (window, count, _) = self.view(state, now);
        count == 0 && window == self.shape.reciprocal.div(now)
    }

    /// Gives back `min(cost, count)` units while the state still holds the window the
    /// charge counted in (the stored window of `charge.after`); once another admission
    /// has moved the state to a newer window, the charge no longer counts and nothing
    /// is given back (`None`) — the count then belongs to other requests. Nor when the
    /// count or `cost` is 0. `now` does not matter: the stored window, not a reading,
    /// says whose units the count holds. A charge refunded before anything else leaves
    /// a state that decides like the one before it.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Algorithm, Charged, FixedWindow, Nanos, Policy};
    /// let fw = FixedWindow::new(Policy::per_minute(10)?)?;
    /// let now = Nanos::from_secs(75);
    /// let charge = Charged { before: fw.state(1, 1), after: fw.state(1, 4), at: now, cost: 3 };
    /// assert_eq!(fw.refund(fw.state(1, 4), &charge, 0, now).map(|r| r.0), Some(fw.state(1, 1)));
    /// assert_eq!(fw.refund(fw.state(1, 2), &charge, 0, now).map(|r| r.0), Some(fw.state(1, 0))); // never below zero
    /// // Another request moved the state to the next window: its units are not ours.
    /// assert_eq!(fw.refund(fw.state(2, 1), &charge, 0, Nanos::from_secs(120)).map(|r| r.0), None);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    fn refund(
        &self,
        state: FixedWindowState,
        charge: &Charged<FixedWindowState>,
        _shift: u64,
        now: Nanos,
    ) -> Option<(FixedWindowState, u64)> {
        let window = self.window_of(state);
        if window != self.window_of(charge.after) {
            return None;
        }
        let count = self.count_of(state);
        let mut back = u64::from(charge.cost).min(count);
        // Never the all-zero (fresh) word at a wrapped index: it would lose the window.
        back = back.saturating_sub(self.shape.kept_by_refund(
            self.shape.layout.pack(window, count - back),
            charge.at.as_u64(),
            now.as_u64(),
        ));
        // The count only shrinks: the state stays ≤ count_max and in its window.
        // A count moves nobody's booking: nothing for the refund ledger.
        (back > 0).then(|| {
            let packed = self.shape.layout.pack(window, count - back);
            (FixedWindowState { packed }, 0)
        })
    }

    /// Same period: the count of the window in force carries over (re-packed for the
    /// new limit, clamped to `2^c − 2` — a count above the new limit just leaves
    /// nothing remaining). Another period: fresh windows.
    fn carry_over(&self, previous: &Self, state: FixedWindowState, now: Nanos) -> FixedWindowState {
        if previous.shape.period != self.shape.period || previous.is_idle(state, now) {
            return FixedWindowState::default();
        }
        let (w, _) = self.shape.reciprocal.split(now.as_u64());
        let stored = previous.shape.layout.window_of(state.packed);
        let window = match previous.shape.layout.age(stored, w) {
            Age::Behind(a) => w.wrapping_add(a),
            Age::Ahead(_) => w,
        };
        self.state(window, previous.count_of(state))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use core::time::Duration;

    const S: u64 = 1_000_000_000;

    fn fw(limit: u64, period: Duration) -> FixedWindow {
        FixedWindow::new(Policy::new(limit, period).unwrap()).unwrap()
    }

    fn run(
        f: &FixedWindow,
        mut s: FixedWindowState,
        steps: &[(u64, u32)],
    ) -> (Vec<Decision>, FixedWindowState) {
        let mut out = Vec::new();
        for &(now, cost) in steps {
            let (d, next) = f.decide(s, Nanos::new(now), cost);
            if let Some(next) = next {
                s = next;
            }
            out.push(d);
        }
        (out, s)
    }

    #[test]
    fn counts_within_the_window_and_denies_until_its_end() {
        let f = fw(3, Duration::from_secs(1));
        let t = 10 * S + S / 4;
        let (ds, s) = run(
            &f,
            FixedWindowState::default(),
            &[(t, 1), (t, 1), (t, 1), (t + 1, 1)],
        );
        for (i, d) in ds[..3].iter().enumerate() {
            assert!(d.is_allowed());
            assert_eq!(d.remaining(), 2 - i as u64);
            assert_eq!(d.reset_after_nanos(), 3 * S / 4);
            assert_eq!(d.retry_after_nanos(), Some(0));
            assert_eq!(d.limit(), 3);
        }
        assert!(!ds[3].is_allowed());
        assert_eq!(ds[3].remaining(), 0);
        assert_eq!(ds[3].retry_after_nanos(), Some(3 * S / 4 - 1));
        assert_eq!(ds[3].reset_after_nanos(), 3 * S / 4 - 1);
        assert_eq!((f.window_of(s), f.count_of(s)), (10, 3));
    }

    #[test]
    fn window_edges() {
        let f = fw(2, Duration::from_secs(1));
        let (ds, s) = run(
            &f,
            FixedWindowState::default(),
            &[
                (5 * S, 2),
                // The last instant of window 5.
                (6 * S - 1, 1),
                // The instant window 5 ends.
                (6 * S, 2),
                // A gap of two windows: fresh again.
                (8 * S + 5, 1),
            ],
        );
        assert!(ds[0].is_allowed());
        assert_eq!(ds[0].reset_after_nanos(), S);
        assert!(!ds[1].is_allowed());
        assert_eq!(ds[1].retry_after_nanos(), Some(1));
        assert!(ds[2].is_allowed());
        assert_eq!(ds[2].remaining(), 0);
        assert!(ds[3].is_allowed());
        assert_eq!(ds[3].remaining(), 1);
        assert_eq!(ds[3].reset_after_nanos(), S - 5);
        assert_eq!((f.window_of(s), f.count_of(s)), (8, 1));
    }

    #[test]
    fn costs_zero_n_and_above_the_limit() {
        let f = fw(10, Duration::from_secs(60));
        let s = f.state(0, 4);
        let (d, next) = f.decide(s, Nanos::from_secs(15), 0);
        assert!(d.is_allowed() && next.is_none());
        assert_eq!(d.remaining(), 6);
        assert_eq!(d.reset_after(), Duration::from_secs(45));
        let (d, next) = f.decide(s, Nanos::from_secs(15), 6);
        assert!(d.is_allowed());
        assert_eq!(f.count_of(next.unwrap()), 10);
        let (d, next) = f.decide(s, Nanos::from_secs(15), 7);
        assert!(!d.is_allowed() && next.is_none());
        assert_eq!(d.remaining(), 6);
        assert_eq!(d.retry_after(), Some(Duration::from_secs(45)));
        for cost in [11, u32::MAX] {
            let (d, next) = f.decide(s, Nanos::from_secs(15), cost);
            assert!(!d.is_allowed() && next.is_none());
            assert_eq!(d.retry_after(), None);
            assert_eq!(d.remaining(), 6);
        }
    }

    #[test]
    fn an_earlier_reading_counts_in_the_stored_window() {
        let f = fw(3, Duration::from_secs(1));
        let s = f.state(7, 2);
        // 6.5 s reads a window behind the state's: judged in window 7, which ends in 1.5 s.
        let (d, next) = f.decide(s, Nanos::new(6 * S + S / 2), 1);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 0);
        assert_eq!(d.reset_after_nanos(), S + S / 2);
        let next = next.unwrap();
        assert_eq!((f.window_of(next), f.count_of(next)), (7, 3));
        let (d, _) = f.decide(next, Nanos::new(6 * S + S / 2), 1);
        assert!(!d.is_allowed());
        assert_eq!(d.retry_after_nanos(), Some(S + S / 2));
        assert!(!f.is_idle(next, Nanos::new(6 * S)));
    }

    #[test]
    fn idle_means_fresh() {
        let f = fw(3, Duration::from_secs(1));
        let s = f.state(7, 2);
        assert!(!f.is_idle(s, Nanos::new(8 * S - 1)));
        assert!(f.is_idle(s, Nanos::new(8 * S)));
        assert!(f.is_idle(FixedWindowState::default(), Nanos::new(123)));
        assert_eq!(
            f.decide(s, Nanos::new(8 * S), 3).0,
            f.decide(FixedWindowState::default(), Nanos::new(8 * S), 3)
                .0
        );
    }

    #[test]
    fn the_index_wraps_only_after_2_to_the_61_ns() {
        // L = 1, P = 1 ns: c = 2 (the bit length of L + 1), k = 62, half the index range
        // is 2^61 windows.
        let f = fw(1, Duration::from_nanos(1));
        assert_eq!(f.count_bits(), 2);
        let s = f.state(0, 1);
        // Idle 2^61 − 1 windows: recognised as later, fresh.
        assert!(f.is_idle(s, Nanos::new((1 << 61) - 1)));
        assert!(f.decide(s, Nanos::new((1 << 61) - 1), 1).0.is_allowed());
        // Idle 2^61 windows (73 years): looks earlier, the stale unit counts (stricter).
        assert!(!f.is_idle(s, Nanos::new(1 << 61)));
        let (d, _) = f.decide(s, Nanos::new(1 << 61), 1);
        assert!(!d.is_allowed());
        // The largest limit: L = 2^62 − 2 leaves k = 2, a half range of two windows of
        // 2^62 − 2 ns (146 years).
        let largest = (1 << 62) - 2;
        let f = fw(largest, Duration::from_nanos(largest));
        assert_eq!(f.count_bits(), 62);
        let s = f.state(0, 1);
        assert!(f.is_idle(s, Nanos::new(2 * largest - 1)));
        assert!(!f.is_idle(s, Nanos::new(2 * largest)));
        // A full count of the largest limit in window 3 (all ones mod 2^2) is not the
        // all-ones word.
        assert_eq!(f.state(3, largest).packed, u64::MAX - 1);
        for limit in [largest + 1, 1 << 62] {
            assert_eq!(
                FixedWindow::new(Policy::new(limit, Duration::from_nanos(limit)).unwrap()),
                Err(PolicyError::Unrepresentable {
                    field: "limit",
                    value: limit,
                    allowed: ALLOWED
                })
            );
        }
    }

    #[test]
    fn a_policy_change_carries_the_count_or_starts_fresh() {
        let old = fw(10, Duration::from_secs(1));
        let s = old.state(7, 6);
        let big = fw(1000, Duration::from_secs(1));
        let now = Nanos::new(7 * S + 1);
        assert_eq!(big.carry_over(&old, s, now), big.state(7, 6));
        // Earlier reading: the stored window is kept whole.
        assert_eq!(big.carry_over(&old, s, Nanos::new(6 * S)), big.state(7, 6));
        // Shrinking below the count: clamped to 2^2 − 2 (L = 1 takes 2 bits), nothing
        // remaining.
        let one = fw(1, Duration::from_secs(1));
        let c = one.carry_over(&old, s, now);
        assert_eq!(one.count_of(c), 2);
        assert_eq!(one.decide(c, now, 0).0.remaining(), 0);
        // Next window, or another period: fresh.
        assert_eq!(
            big.carry_over(&old, s, Nanos::new(8 * S)),
            FixedWindowState::default()
        );
        let two = fw(10, Duration::from_secs(2));
        assert_eq!(two.carry_over(&old, s, now), FixedWindowState::default());
        // GCRA keeps its state (the trait's default).
        let g = crate::Gcra::new(Policy::per_second(1).unwrap());
        let tat = crate::GcraState::from_tat(Nanos::new(5));
        assert_eq!(g.carry_over(&g, tat, Nanos::ZERO), tat);
    }

    #[test]
    fn refunds_give_back_only_from_the_window_charged() {
        let f = fw(5, Duration::from_secs(1));
        let at = Nanos::new(7 * S + S / 4);
        let now = Nanos::new(7 * S + S / 2);
        let before = f.state(7, 1);
        let (_, after) = f.decide(before, at, 3);
        let after = after.unwrap();
        let charge = Charged {
            before,
            after,
            at,
            cost: 3,
        };
        assert_eq!((f.window_of(after), f.count_of(after)), (7, 4));
        // The 3 units back: count 1, remaining 4.
        let r = f.refund(after, &charge, 0, now).map(|r| r.0).unwrap();
        assert_eq!((f.window_of(r), f.count_of(r)), (7, 1));
        let (d, _) = f.decide(r, now, 0);
        assert_eq!((d.remaining(), d.reset_after_nanos()), (4, S / 2));
        // Others refunded meanwhile: down to zero, never below; the key is then idle.
        let r = f
            .refund(f.state(7, 2), &charge, 0, now)
            .map(|r| r.0)
            .unwrap();
        assert_eq!((f.window_of(r), f.count_of(r)), (7, 0));
        assert!(f.is_idle(r, now));
        // Nothing to give back: a zero count, or a state another request moved to a
        // newer window (its count is that request's), whatever the reading says.
        assert_eq!(f.refund(f.state(7, 0), &charge, 0, now).map(|r| r.0), None);
        assert_eq!(
            f.refund(f.state(8, 1), &charge, 0, Nanos::new(8 * S))
                .map(|r| r.0),
            None
        );
        assert_eq!(f.refund(f.state(8, 1), &charge, 0, now).map(|r| r.0), None);
        // The reading does not matter while the state holds the charged window: the
        // units are still the charge's own.
        let r = f
            .refund(after, &charge, 0, Nanos::new(20 * S))
            .map(|r| r.0)
            .unwrap();
        assert_eq!(f.count_of(r), 1);
        // A charge of nothing gives back nothing.
        let zero = Charged { cost: 0, ..charge };
        assert_eq!(f.refund(after, &zero, 0, now).map(|r| r.0), None);
    }

    #[test]
    fn timestamps_at_the_top_of_u64() {
        let f = fw(2, Duration::from_secs(3600));
        let top = u64::MAX;
        let (ds, _) = run(
            &f,
            FixedWindowState::default(),
            &[(top - 1, 1), (top, 1), (top, 1)],
        );
        let p = 3600 * S;
        let reset = p - top % p;
        assert!(ds[0].is_allowed() && ds[1].is_allowed());
        assert_eq!(ds[1].reset_after_nanos(), reset);
        assert_eq!(ds[2].retry_after_nanos(), Some(reset));
        // A state far ahead of an early reading: exact, no overflow.
        let s = f.state(u64::MAX / p, 2);
        let (d, _) = f.decide(s, Nanos::ZERO, 1);
        assert!(!d.is_allowed());
        // (w + 1)·P is past u64::MAX ns: saturated.
        assert_eq!(d.reset_after_nanos(), u64::MAX);
    }
}
