//! GCRA — the generic cell rate algorithm — and the two buckets that are the same
//! machine: the token bucket ([`Gcra::token_bucket`]) and the leaky bucket as a meter
//! ([`Gcra::leaky_meter`]).
//!
//! # Semantics
//!
//! With `T = ⌈P/L⌉` ns and capacity `B`, the state is the theoretical arrival time
//! `TAT` (zero: fresh). For a request of cost `n` at `now`, with `τ = B·T`:
//!
//! ```text
//! tat     = max(TAT, now)
//! new_tat = tat + n·T
//! n > B                  → deny, retry_after = never
//! new_tat ≤ now + τ      → allow, TAT = new_tat,
//!                          remaining = ⌊(now + τ − new_tat)/T⌋, reset_after = new_tat − now
//! otherwise              → deny, retry_after = new_tat − (now + τ), reset_after = tat − now,
//!                          remaining = ⌊(now + τ − tat)/T⌋ clamped to [0, B]
//! ```
//!
//! Cost 0 is always allowed and writes nothing. The code works on the offset
//! `tat − now ≥ 0`, so no comparison needs a negative number and nothing overflows:
//! `n·T ≤ B·T ≤ 2^62` is guaranteed by [`Policy`]. The one bound left is the end of
//! time: a request whose new `TAT` would pass `u64::MAX` ns (the year 2554 for the
//! Unix-epoch clocks) is denied with "never" — stricter, never looser.
//!
//! # Token bucket and leaky bucket are GCRA
//!
//! A token bucket of capacity `B` refilled with `L` tokens per `P` holds
//! `tokens = (now + τ − TAT)/T` (capped at `B`) at any instant; taking `n` tokens is
//! moving `TAT` by `n·T`. A leaky bucket (meter) of capacity `B` draining `L` per `P`
//! holds `level = B − tokens`. All three admit exactly the same requests; the only
//! difference from the textbook versions is that time and tokens are exact integers
//! instead of `f64` (see [`reference`](crate::reference), which tests this).

use crate::algorithm::{Algorithm, Charged};
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::policy::{Policy, PolicyError};
use core::time::Duration;

/// The GCRA transition for one [`Policy`].
///
/// # Examples
///
/// ```
/// use floodgate::{ManualClock, Policy, RateLimiter};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(10)?.with_burst(2)?, clock.clone());
/// assert!(limiter.check().is_allowed());
/// assert!(limiter.check().is_allowed());
/// let denied = limiter.check();
/// assert_eq!(denied.retry_after(), Some(Duration::from_millis(100)));
/// clock.advance(Duration::from_millis(100));
/// assert!(limiter.check().is_allowed());
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Gcra {
    /// `T`, ns.
    interval: u64,
    /// `τ = B·T`, ns.
    tau: u64,
    /// `B`.
    burst: u64,
    policy: Policy,
}

/// GCRA's packed state: the theoretical arrival time (`TAT`); zero is fresh.
///
/// # Examples
///
/// ```
/// use floodgate::{GcraState, Nanos};
/// assert_eq!(GcraState::default().tat(), Nanos::ZERO);
/// assert_eq!(GcraState::from_tat(Nanos::new(5)).tat(), Nanos::new(5));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct GcraState {
    tat: Nanos,
}

impl GcraState {
    /// A state with the given theoretical arrival time.
    pub const fn from_tat(tat: Nanos) -> GcraState {
        GcraState { tat }
    }

    /// The theoretical arrival time (zero for a fresh state).
    pub const fn tat(self) -> Nanos {
        self.tat
    }
}

impl Gcra {
    /// A token bucket of `capacity` tokens that gains `refill` tokens every `every`,
    /// as the GCRA that implements it (the same machine: see the
    /// [module docs](crate::gcra)).
    ///
    /// # Errors
    ///
    /// As [`Policy::new`] and [`Policy::with_burst`], with `limit = refill` and
    /// `burst = capacity`.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Gcra, ManualClock, RateLimiter};
    /// use std::time::Duration;
    ///
    /// // 5 tokens, one more every 200 ms.
    /// let bucket = Gcra::token_bucket(5, 1, Duration::from_millis(200))?;
    /// let limiter = RateLimiter::with_clock(bucket, ManualClock::new());
    /// assert!(limiter.check_n(5).is_allowed());
    /// assert!(!limiter.check().is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn token_bucket(capacity: u64, refill: u64, every: Duration) -> Result<Gcra, PolicyError> {
        Ok(Gcra::new(Policy::new(refill, every)?.with_burst(capacity)?))
    }

    /// A leaky bucket used as a meter — `capacity` units, draining `leak` units every
    /// `every`; a request fits if the level plus its cost stays within the capacity —
    /// as the GCRA that implements it. For the leaky bucket as a *queue* (requests
    /// wait for their slot), see [`Shaper`](crate::Shaper).
    ///
    /// # Errors
    ///
    /// As [`Policy::new`] and [`Policy::with_burst`], with `limit = leak` and
    /// `burst = capacity`.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Gcra, ManualClock, RateLimiter};
    /// use std::time::Duration;
    ///
    /// // Holds 3, leaks 1 per second.
    /// let meter = Gcra::leaky_meter(3, 1, Duration::from_secs(1))?;
    /// let clock = ManualClock::new();
    /// let limiter = RateLimiter::with_clock(meter, clock.clone());
    /// assert!(limiter.check_n(3).is_allowed());
    /// assert!(!limiter.check().is_allowed());
    /// clock.advance(Duration::from_secs(1));
    /// assert!(limiter.check().is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn leaky_meter(capacity: u64, leak: u64, every: Duration) -> Result<Gcra, PolicyError> {
        Gcra::token_bucket(capacity, leak, every)
    }

    /// GCRA for `policy`: `T = ⌈P/L⌉`, capacity `B = policy.burst()`.
    ///
    /// # Examples
    ///
    /// ```
    /// let g = floodgate::Gcra::new(floodgate::Policy::per_second(4)?);
    /// assert_eq!(g.policy().burst(), 4);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub const fn new(policy: Policy) -> Gcra {
        let interval = policy.interval_nanos();
        let burst = policy.burst();
        // Cannot overflow: Policy guarantees B·T ≤ 2^62.
        Gcra {
            interval,
            tau: burst * interval,
            burst,
            policy,
        }
    }

    /// The policy this transition enforces.
    pub const fn policy(&self) -> Policy {
        self.policy
    }

    /// `τ = B·T` in nanoseconds.
    pub(crate) const fn tolerance_nanos(&self) -> u64 {
        self.tau
    }

    /// The transition with the tolerance `tau` in place of `τ = B·T`: the admission
    /// test, `remaining` and `retry_after` use `tau`, "never" still means `n > B`.
    /// [`Algorithm::decide`] passes `τ`; the shaper passes `τ + max_delay`, which
    /// admits a request whose slot is at most `max_delay` away.
    #[inline(always)]
    pub(crate) fn decide_within(
        &self,
        tau: u64,
        state: GcraState,
        now: Nanos,
        cost: u32,
    ) -> (Decision, Option<GcraState>) {
        let headroom = |offset: u64| tau.saturating_sub(offset);
        let now = now.as_u64();
        let tat = state.tat.as_u64().max(now);
        // tat − now: how far ahead of `now` the bucket is booked.
        let offset = tat - now;
        let n = u64::from(cost);
        if n == 0 {
            let headroom = headroom(offset);
            return (
                Decision::allow(self.burst, headroom, self.interval, offset),
                None,
            );
        }
        // n > B  ⇔  n·T > B·T = τ (T ≥ 1); a product past u64 saturates above τ ≤ 2^62.
        // Folding the capacity check into the subtraction spares the hot path a
        // separate compare against B.
        let increment = n.saturating_mul(self.interval);
        let Some(within_burst) = self.tau.checked_sub(increment) else {
            let headroom = headroom(offset);
            return (
                Decision::never(self.burst, headroom, self.interval, offset),
                None,
            );
        };
        // The tolerance beyond τ: 0 for a check (folded away), max_delay for a
        // reservation. tau ≥ τ, and the sum is tau − n·T: no overflow.
        let slack = within_burst + (tau - self.tau);
        // new_tat ≤ now + τ  ⇔  offset + n·T ≤ τ  ⇔  offset ≤ τ − n·T
        if offset <= slack {
            let reset_after = offset + increment;
            let decision = Decision::allow(self.burst, slack - offset, self.interval, reset_after);
            match tat.checked_add(increment) {
                Some(new_tat) => (
                    decision,
                    Some(GcraState {
                        tat: Nanos::new(new_tat),
                    }),
                ),
                // The new TAT would pass u64::MAX ns: since TAT ≥ now only grows, this
                // request can never be represented — deny it for good (stricter, not looser).
                None => {
                    let headroom = headroom(offset);
                    (
                        Decision::never(self.burst, headroom, self.interval, offset),
                        None,
                    )
                }
            }
        } else {
            // retry = new_tat − (now + τ) = offset + n·T − τ = offset − slack > 0
            let headroom = headroom(offset);
            let retry = offset - slack;
            (
                Decision::deny(self.burst, headroom, self.interval, offset, retry),
                None,
            )
        }
    }
}

impl Algorithm for Gcra {
    type State = GcraState;

    #[inline(always)]
    fn decide(&self, state: GcraState, now: Nanos, cost: u32) -> (Decision, Option<GcraState>) {
        self.decide_within(self.tau, state, now, cost)
    }

    #[inline]
    fn is_idle(&self, state: GcraState, now: Nanos) -> bool {
        state.tat <= now
    }

    /// Gives back the part of the charge's booking that the clock has not reached.
    ///
    /// A charge at reading `a` booked the interval `[max(TAT₀, a), TAT₁)` of the
    /// schedule (`TAT₀` before it, `TAT₁` after); refunds of other charges since may
    /// have moved it down by up to `shift`. At `now`, the part of it before `now` may
    /// already have been claimed by an admission that, without this charge, would
    /// have found the schedule idle and started from its own reading; the part at or
    /// after `now` is still this charge's own. So the refund moves the TAT back by
    /// `(TAT₁ − shift) − max(max(TAT₀, a) − shift, now)` when that is positive, less
    /// the schedule booked after the charge whose slots may still be ahead of `now`
    /// (those slots are handed out and stay spent, as in `x/time/rate`): at most
    /// `n·T`, exactly `n·T` when it follows the charge before the clock catches up, no
    /// refund that moved a later booking came between (the cells leave the refund of
    /// the schedule's last booking out of `shift`:
    /// [`refund_moves_later`](Algorithm::refund_moves_later)) and nothing booked
    /// since waits for a later slot, nothing once the clock has passed the booking. Every admission the refund sees
    /// must have been decided at a reading ≤ `now` (the cells read the clock after
    /// loading the state, which gives this with any clock that is monotone across
    /// threads).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Algorithm, Charged, Gcra, GcraState, Nanos, Policy};
    /// let gcra = Gcra::new(Policy::per_second(1)?.with_burst(2)?);
    /// let t = Nanos::from_secs(10);
    /// let before = GcraState::default();
    /// let after = gcra.decide(before, t, 1).1.unwrap(); // books [10 s, 11 s)
    /// let charge = Charged { before, after, at: t, cost: 1 };
    /// let whole = (GcraState::from_tat(t), 1_000_000_000);
    /// assert_eq!(gcra.refund(after, &charge, 0, t), Some(whole));
    /// // Half of the booking has passed: only the half still ahead comes back.
    /// let (half, _) = gcra.refund(after, &charge, 0, Nanos::new(10_500_000_000)).unwrap();
    /// assert_eq!(half.tat(), Nanos::new(10_500_000_000));
    /// // Once the clock has passed the booking, nothing is this charge's any more.
    /// assert_eq!(gcra.refund(after, &charge, 0, Nanos::from_secs(11)), None);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    #[inline]
    fn book(
        &self,
        state: GcraState,
        now: Nanos,
        cost: u32,
    ) -> Option<(Decision, Option<GcraState>)> {
        // The tolerance without bound: every slot is within reach, "never" is n > B.
        Some(self.decide_within(u64::MAX, state, now, cost))
    }

    fn ready_at(&self, charge: &Charged<GcraState>) -> Nanos {
        // The slot: where a plain check of the same request first succeeds.
        let slot = charge.after.tat.as_u64().saturating_sub(self.tau);
        Nanos::new(slot.max(charge.at.as_u64()))
    }

    fn refund(
        &self,
        state: GcraState,
        charge: &Charged<GcraState>,
        shift: u64,
        now: Nanos,
    ) -> Option<(GcraState, u64)> {
        self.refund_judged(state, charge, shift, now, self.tau, false)
    }

    /// Nothing is booked after the charge when its booking, moved down by at most
    /// `shift`, ends at or past the `TAT` (it can end no higher than the `TAT`, so
    /// it ends there: neither a booking nor a gap is above it).
    fn refund_moves_later(
        &self,
        state: GcraState,
        charge: &Charged<GcraState>,
        shift: u64,
    ) -> bool {
        state.tat.as_u64() > charge.after.tat.as_u64().saturating_sub(shift)
    }
}

impl Gcra {
    /// [`Algorithm::refund`], judging whether a unit booked after the charge has come
    /// with the tolerance `booked_tau` instead of `τ`: it must be at most the `τ` of
    /// every policy a booking on this state may have been made under (a later
    /// booking's slot is its schedule's end less the `τ` it was booked with, so a
    /// larger `τ` would see a waiting booking as come). [`LiveGcra`](crate::LiveGcra)
    /// passes the smallest `τ` it has ever had.
    ///
    /// `tau_may_rise`: the policy may get a larger `τ` after this refund (a
    /// [`LiveGcra`](crate::LiveGcra)). A booking still waiting keeps its slot while
    /// the next ones are placed `τ` before the schedule's end, so after a raise they
    /// land earlier against it by the raise; no part of the schedule below a waiting
    /// booking can then be given back safely, and the refund gives back nothing while
    /// one waits.
    pub(crate) fn refund_judged(
        &self,
        state: GcraState,
        charge: &Charged<GcraState>,
        shift: u64,
        now: Nanos,
        booked_tau: u64,
        tau_may_rise: bool,
    ) -> Option<(GcraState, u64)> {
        let start = charge
            .before
            .tat
            .max(charge.at)
            .as_u64()
            .saturating_sub(shift);
        let end = charge.after.tat.as_u64().saturating_sub(shift);
        let own = end.saturating_sub(start.max(now.as_u64()));
        // Units booked after this charge may hold slots still ahead of `now` (a
        // waiter's booking, a reservation): those slots are handed out and do not move,
        // so moving the TAT down under them would hand the same instants out again.
        // As in `x/time/rate`, they stay spent: the refund gives back only what exceeds
        // them. A later unit whose schedule ends at `e` (moved down by at most `shift`)
        // has its slot at or before `e + shift − τ`; it has provably come when that is
        // at or before `now`, and then it may move like any admission already made.
        let passed = now
            .as_u64()
            .saturating_add(booked_tau)
            .saturating_sub(shift);
        let ahead = state.tat.as_u64().saturating_sub(end.max(passed));
        if tau_may_rise && ahead > 0 {
            return None;
        }
        let back = own.saturating_sub(ahead);
        (back > 0).then(|| {
            let tat = Nanos::new(state.tat.as_u64().saturating_sub(back));
            (GcraState { tat }, back)
        })
    }
}

/// The token bucket's former constructor; use [`Gcra::token_bucket`].
#[derive(Debug)]
pub struct TokenBucket {
    _private: (),
}

impl TokenBucket {
    /// [`Gcra::token_bucket`].
    ///
    /// # Errors
    ///
    /// As [`Gcra::token_bucket`].
    #[deprecated(since = "0.1.0", note = "use `Gcra::token_bucket`")]
    #[allow(clippy::new_ret_no_self)]
    pub fn new(capacity: u64, refill: u64, every: Duration) -> Result<Gcra, PolicyError> {
        Gcra::token_bucket(capacity, refill, every)
    }
}

/// The leaky meter's former constructor; use [`Gcra::leaky_meter`].
#[derive(Debug)]
pub struct LeakyBucket {
    _private: (),
}

impl LeakyBucket {
    /// [`Gcra::leaky_meter`].
    ///
    /// # Errors
    ///
    /// As [`Gcra::leaky_meter`].
    #[deprecated(since = "0.1.0", note = "use `Gcra::leaky_meter`")]
    pub fn meter(capacity: u64, leak: u64, every: Duration) -> Result<Gcra, PolicyError> {
        Gcra::leaky_meter(capacity, leak, every)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn gcra(limit: u64, period: Duration, burst: u64) -> Gcra {
        Gcra::new(
            Policy::new(limit, period)
                .unwrap()
                .with_burst(burst)
                .unwrap(),
        )
    }

    /// Runs a sequence of (now, cost) on a fresh state; returns decisions and the state.
    fn run(g: &Gcra, steps: &[(u64, u32)]) -> (Vec<Decision>, GcraState) {
        let mut s = GcraState::default();
        let mut out = Vec::new();
        for &(now, cost) in steps {
            let (d, next) = g.decide(s, Nanos::new(now), cost);
            if let Some(next) = next {
                s = next;
            }
            out.push(d);
        }
        (out, s)
    }

    #[test]
    fn fresh_key_admits_burst_at_once_then_denies_with_retry_t() {
        let g = gcra(10, Duration::from_secs(1), 3);
        let now = 50 * S;
        let (ds, s) = run(&g, &[(now, 1), (now, 1), (now, 1), (now, 1)]);
        for (i, d) in ds[..3].iter().enumerate() {
            assert!(d.is_allowed());
            assert_eq!(d.remaining(), 2 - i as u64);
            assert_eq!(d.reset_after_nanos(), (i as u64 + 1) * S / 10);
            assert_eq!(d.retry_after_nanos(), Some(0));
        }
        let denied = ds[3];
        assert!(!denied.is_allowed());
        assert_eq!(denied.retry_after_nanos(), Some(S / 10));
        assert_eq!(denied.remaining(), 0);
        assert_eq!(denied.reset_after_nanos(), 3 * S / 10);
        assert_eq!(denied.limit(), 3);
        assert_eq!(s.tat(), Nanos::new(now + 3 * S / 10));
    }

    #[test]
    fn cost_above_burst_is_never_and_writes_nothing() {
        let g = gcra(10, Duration::from_secs(1), 3);
        let (d, next) = g.decide(GcraState::default(), Nanos::new(S), 4);
        assert!(!d.is_allowed());
        assert_eq!(d.retry_after(), None);
        assert_eq!(d.remaining(), 3);
        assert!(next.is_none());
        let (d, _) = g.decide(GcraState::default(), Nanos::new(S), u32::MAX);
        assert_eq!(d.retry_after(), None);
        // n·T past u64 (T = 100 years, n = u32::MAX) is still "never", not a wrap.
        let g = gcra(1, Duration::from_secs(100 * 365 * 86_400), 1);
        for cost in [2, u32::MAX] {
            let (d, next) = g.decide(GcraState::default(), Nanos::new(S), cost);
            assert!(!d.is_allowed());
            assert_eq!(d.retry_after(), None);
            assert_eq!(d.remaining(), 1);
            assert!(next.is_none());
        }
        // Cost exactly B still fits a fresh key.
        assert!(g
            .decide(GcraState::default(), Nanos::new(S), 1)
            .0
            .is_allowed());
    }

    #[test]
    fn cost_zero_reports_and_writes_nothing() {
        let g = gcra(10, Duration::from_secs(1), 3);
        let s = GcraState::from_tat(Nanos::new(S + 2 * S / 10));
        let (d, next) = g.decide(s, Nanos::new(S), 0);
        assert!(d.is_allowed());
        assert!(next.is_none());
        assert_eq!(d.remaining(), 1);
        assert_eq!(d.reset_after_nanos(), 2 * S / 10);
        // Even when the bucket is over-full (e.g. after a policy shrank), cost 0 is allowed.
        let over = GcraState::from_tat(Nanos::new(S + 10 * S));
        let (d, next) = g.decide(over, Nanos::new(S), 0);
        assert!(d.is_allowed() && next.is_none());
        assert_eq!(d.remaining(), 0);
    }

    #[test]
    fn denial_changes_nothing_and_retry_is_exact() {
        let g = gcra(1, Duration::from_secs(3), 1);
        let (ds, s) = run(
            &g,
            &[
                (10 * S, 1),
                (11 * S, 1),
                (12 * S + 999_999_999, 1),
                (13 * S, 1),
            ],
        );
        assert!(ds[0].is_allowed());
        assert_eq!(ds[1].retry_after_nanos(), Some(2 * S));
        assert_eq!(ds[2].retry_after_nanos(), Some(1));
        assert!(ds[3].is_allowed());
        assert_eq!(s.tat(), Nanos::new(16 * S));
    }

    #[test]
    fn cost_n_retry_after_counts_the_whole_cost() {
        let g = gcra(10, Duration::from_secs(1), 10);
        let (ds, _) = run(&g, &[(0, 8), (0, 5)]);
        assert!(ds[0].is_allowed());
        assert_eq!(ds[0].remaining(), 2);
        assert!(!ds[1].is_allowed());
        // Needs 5 units, has 2: wait 3·T.
        assert_eq!(ds[1].retry_after_nanos(), Some(3 * S / 10));
    }

    #[test]
    fn an_earlier_reading_never_moves_the_state_back() {
        let g = gcra(1, Duration::from_secs(1), 2);
        let (_, s) = run(&g, &[(100 * S, 1)]);
        assert_eq!(s.tat(), Nanos::new(101 * S));
        // A reading 5 s earlier (another core's TSC): the state only moves forward.
        let (d, next) = g.decide(s, Nanos::new(95 * S), 1);
        assert!(!d.is_allowed(), "{d:?}");
        assert!(next.is_none());
        let (d, next) = g.decide(s, Nanos::new(100 * S), 1);
        assert!(d.is_allowed());
        assert_eq!(next.unwrap().tat(), Nanos::new(102 * S));
    }

    #[test]
    fn idle_means_fresh() {
        let g = gcra(1, Duration::from_secs(1), 2);
        let s = GcraState::from_tat(Nanos::new(10));
        assert!(!g.is_idle(s, Nanos::new(9)));
        assert!(g.is_idle(s, Nanos::new(10)));
        // An idle state decides exactly like a fresh one.
        assert_eq!(
            g.decide(s, Nanos::new(10), 2).0,
            g.decide(GcraState::default(), Nanos::new(10), 2).0
        );
    }

    #[test]
    fn timestamps_near_the_top_of_u64_never_overflow() {
        let g = gcra(1, Duration::from_secs(1), 5);
        let top = u64::MAX - 2 * S;
        let (ds, s) = run(
            &g,
            &[(top, 1), (top, 1), (top, 3), (u64::MAX, 1), (u64::MAX, 5)],
        );
        assert!(ds[0].is_allowed() && ds[1].is_allowed());
        assert_eq!(s.tat(), Nanos::MAX);
        // A TAT past u64::MAX cannot be stored: such a request is denied for good.
        for d in &ds[2..] {
            assert!(!d.is_allowed());
            assert_eq!(d.retry_after(), None);
        }
        // A TAT far ahead of `now`: exact retry, no saturation.
        let (d, _) = g.decide(GcraState::from_tat(Nanos::MAX), Nanos::ZERO, 1);
        assert!(!d.is_allowed());
        assert_eq!(d.remaining(), 0);
        assert_eq!(d.retry_after_nanos(), Some(u64::MAX - 4 * S));
    }

    #[test]
    fn extreme_but_valid_rates() {
        // 10^9 per second: T = 1 ns.
        let g = gcra(1_000_000_000, Duration::from_secs(1), 1_000_000_000);
        let (d, next) = g.decide(GcraState::default(), Nanos::new(S), u32::MAX);
        assert_eq!(d.retry_after(), None);
        assert!(next.is_none());
        let (d, next) = g.decide(GcraState::default(), Nanos::new(S), 1_000_000_000);
        assert!(d.is_allowed());
        assert_eq!(next.unwrap().tat(), Nanos::new(2 * S));
        // One per 100 years: T = 100 y, τ = T.
        let century = Duration::from_secs(100 * 365 * 86_400);
        let g = gcra(1, century, 1);
        let (ds, _) = run(&g, &[(S, 1), (2 * S, 1)]);
        assert!(ds[0].is_allowed());
        assert_eq!(
            ds[1].retry_after_nanos(),
            Some(century.as_nanos() as u64 - S)
        );
        // Huge burst with T = 1 ns and the largest cost.
        let g = gcra(1, Duration::from_nanos(1), 1 << 62);
        let (d, next) = g.decide(GcraState::default(), Nanos::new(1 << 63), u32::MAX);
        assert!(d.is_allowed());
        assert_eq!(
            next.unwrap().tat(),
            Nanos::new((1 << 63) + u64::from(u32::MAX))
        );
        assert_eq!(d.remaining(), (1 << 62) - u64::from(u32::MAX));
    }

    #[test]
    fn buckets_are_gcra() {
        let tb = Gcra::token_bucket(5, 2, Duration::from_secs(1)).unwrap();
        assert_eq!(tb, gcra(2, Duration::from_secs(1), 5));
        let lb = Gcra::leaky_meter(5, 2, Duration::from_secs(1)).unwrap();
        assert_eq!(lb, tb);
        assert!(Gcra::token_bucket(0, 1, Duration::from_secs(1)).is_err());
    }
}
