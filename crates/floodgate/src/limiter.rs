//! [`RateLimiter`]: one limit, one state, any algorithm, any clock.

use core::time::Duration;

use crate::algorithm::Algorithm;
use crate::cell::{refund_receipt, AtomicCell, LockedCell, StateCell};
use crate::clock::{Clock, DefaultClock, Nanos};
use crate::decision::Decision;
use crate::fixed_window::FixedWindow;
use crate::gcra::Gcra;
use crate::policy::{Policy, PolicyError};
use crate::receipt::{Owner, Receipt};
use crate::sliding_window::SlidingWindow;

/// A direct (un-keyed) rate limiter: an [`Algorithm`], a [`Clock`] and one state cell.
///
/// Lock-free by default ([`AtomicCell`]); [`LockedRateLimiter`] is the same limiter
/// with its state behind a mutex. Limiters are `Send + Sync`; share one with `Arc` or
/// by reference. Each decision reads the clock once.
///
/// # Examples
///
/// ```
/// use floodgate::{Policy, RateLimiter};
/// use std::sync::Arc;
///
/// let limiter = Arc::new(RateLimiter::gcra(Policy::per_second(100)?.with_burst(10)?));
/// let worker = Arc::clone(&limiter);
/// std::thread::spawn(move || {
///     let _ = worker.check();
/// })
/// .join()
/// .unwrap();
/// let d = limiter.check_n(5);
/// assert!(d.is_allowed());
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
pub struct RateLimiter<A, C = DefaultClock, S = AtomicCell<<A as Algorithm>::State>>
where
    A: Algorithm,
{
    algorithm: A,
    clock: C,
    cell: S,
    /// The id its receipts carry.
    owner: Owner,
}

/// The mutex twin of [`RateLimiter`]: the same transition, its state under a `Mutex`.
///
/// # Examples
///
/// ```
/// use floodgate::{Gcra, LockedRateLimiter, ManualClock, Policy, RateLimiter};
///
/// let policy = Policy::per_second(2)?;
/// let clock = ManualClock::new();
/// let locked: LockedRateLimiter<Gcra, ManualClock> =
///     RateLimiter::locked_with_clock(Gcra::new(policy), clock.clone());
/// let atomic = RateLimiter::gcra_with_clock(policy, clock);
/// for _ in 0..3 {
///     assert_eq!(locked.check(), atomic.check());
/// }
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
pub type LockedRateLimiter<A = Gcra, C = DefaultClock> =
    RateLimiter<A, C, LockedCell<<A as Algorithm>::State>>;

impl RateLimiter<Gcra> {
    /// A lock-free GCRA limiter for `policy` on the [`DefaultClock`].
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = floodgate::RateLimiter::gcra(floodgate::Policy::per_minute(60)?);
    /// assert!(limiter.check().is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn gcra(policy: Policy) -> Self {
        RateLimiter::new(Gcra::new(policy))
    }
}

impl RateLimiter<FixedWindow> {
    /// A lock-free fixed-window limiter for `policy` on the [`DefaultClock`].
    ///
    /// # Errors
    ///
    /// [`PolicyError`] if the window's counters cannot hold `policy`
    /// ([`FixedWindow::new`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = floodgate::RateLimiter::fixed_window(floodgate::Policy::per_minute(60)?)?;
    /// assert!(limiter.check().is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn fixed_window(policy: Policy) -> Result<Self, PolicyError> {
        Ok(RateLimiter::new(FixedWindow::new(policy)?))
    }
}

impl<C: Clock> RateLimiter<FixedWindow, C> {
    /// A lock-free fixed-window limiter for `policy` on `clock`.
    ///
    /// # Errors
    ///
    /// As [`fixed_window`](RateLimiter::fixed_window).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, RateLimiter};
    /// let limiter = RateLimiter::fixed_window_with_clock(Policy::per_second(1)?, ManualClock::new())?;
    /// assert!(limiter.check().is_allowed());
    /// assert!(!limiter.check().is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn fixed_window_with_clock(policy: Policy, clock: C) -> Result<Self, PolicyError> {
        Ok(RateLimiter::with_clock(FixedWindow::new(policy)?, clock))
    }
}

impl RateLimiter<SlidingWindow> {
    /// A lock-free sliding-window-counter limiter for `policy` on the
    /// [`DefaultClock`].
    ///
    /// # Errors
    ///
    /// [`PolicyError`] if the window's counters cannot hold `policy`
    /// ([`SlidingWindow::new`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = floodgate::RateLimiter::sliding_window(floodgate::Policy::per_minute(60)?)?;
    /// assert!(limiter.check().is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn sliding_window(policy: Policy) -> Result<Self, PolicyError> {
        Ok(RateLimiter::new(SlidingWindow::new(policy)?))
    }
}

impl<C: Clock> RateLimiter<SlidingWindow, C> {
    /// A lock-free sliding-window-counter limiter for `policy` on `clock`.
    ///
    /// # Errors
    ///
    /// As [`sliding_window`](RateLimiter::sliding_window).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, RateLimiter};
    /// let limiter = RateLimiter::sliding_window_with_clock(Policy::per_second(1)?, ManualClock::new())?;
    /// assert!(limiter.check().is_allowed());
    /// assert!(!limiter.check().is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn sliding_window_with_clock(policy: Policy, clock: C) -> Result<Self, PolicyError> {
        Ok(RateLimiter::with_clock(SlidingWindow::new(policy)?, clock))
    }
}

impl<C: Clock> RateLimiter<Gcra, C> {
    /// A lock-free GCRA limiter for `policy` on `clock`.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, RateLimiter};
    /// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(1)?, ManualClock::new());
    /// assert!(limiter.check().is_allowed());
    /// assert!(!limiter.check().is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn gcra_with_clock(policy: Policy, clock: C) -> Self {
        RateLimiter::with_clock(Gcra::new(policy), clock)
    }
}

impl<C: Clock, S: StateCell<crate::gcra::GcraState>> RateLimiter<Gcra, C, S> {
    /// Replaces the policy ([`set_algorithm`](RateLimiter::set_algorithm) with
    /// `Gcra::new(policy)`): the schedule is kept, the new rate applies from now on
    /// and `remaining` is clamped to the new burst.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, RateLimiter};
    /// let mut limiter = RateLimiter::gcra_with_clock(Policy::per_second(10)?, ManualClock::new());
    /// assert!(limiter.check_n(6).is_allowed());
    /// // TAT = now + 600 ms; under 5/s (T = 200 ms, τ = 1 s) 2 units fit.
    /// limiter.set_policy(Policy::per_second(5)?);
    /// assert_eq!(limiter.peek(0).remaining(), 2);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn set_policy(&mut self, policy: Policy) {
        self.set_algorithm(Gcra::new(policy));
    }
}

impl<A: Algorithm> RateLimiter<A> {
    /// A lock-free limiter running `algorithm` on the [`DefaultClock`].
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Gcra, Policy, RateLimiter};
    /// let limiter = RateLimiter::new(Gcra::new(Policy::per_second(5)?));
    /// assert_eq!(limiter.check().limit(), 5);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn new(algorithm: A) -> Self {
        RateLimiter::with_clock(algorithm, DefaultClock::new())
    }
}

impl<A: Algorithm, C: Clock> RateLimiter<A, C> {
    /// A lock-free limiter running `algorithm` on `clock`.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Gcra, ManualClock, Policy, RateLimiter};
    /// let limiter = RateLimiter::with_clock(Gcra::new(Policy::per_second(5)?), ManualClock::new());
    /// assert!(limiter.check_n(5).is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn with_clock(algorithm: A, clock: C) -> Self {
        RateLimiter {
            algorithm,
            clock,
            cell: AtomicCell::fresh(),
            owner: Owner::new(),
        }
    }
}

impl<A: Algorithm, C: Clock> RateLimiter<A, C, LockedCell<A::State>> {
    /// The mutex twin: `algorithm` on `clock`, its state under a `Mutex`.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Gcra, ManualClock, Policy, RateLimiter};
    /// let twin = RateLimiter::locked_with_clock(Gcra::new(Policy::per_second(1)?), ManualClock::new());
    /// assert!(twin.check().is_allowed());
    /// assert!(!twin.check().is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn locked_with_clock(algorithm: A, clock: C) -> Self {
        RateLimiter {
            algorithm,
            clock,
            cell: LockedCell::fresh(),
            owner: Owner::new(),
        }
    }
}

impl<A, C, S> RateLimiter<A, C, S>
where
    A: Algorithm,
    C: Clock,
    S: StateCell<A::State>,
{
    /// Decides one unit now, consuming it if allowed. Same as `check_n(1)`.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, RateLimiter};
    /// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(1)?, ManualClock::new());
    /// assert!(limiter.check().is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    #[inline]
    pub fn check(&self) -> Decision {
        self.check_n(1)
    }

    /// Decides `cost` units now, consuming them if allowed.
    ///
    /// Cost 0 reports the current state, is always allowed and writes nothing. A cost
    /// above the capacity is denied with `retry_after() == None` ("never").
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, RateLimiter};
    /// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(10)?, ManualClock::new());
    /// assert!(limiter.check_n(4).is_allowed());
    /// assert_eq!(limiter.check_n(0).remaining(), 6);
    /// assert_eq!(limiter.check_n(11).retry_after(), None);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    #[inline]
    pub fn check_n(&self, cost: u32) -> Decision {
        self.check_n_at(self.clock.now(), cost)
    }

    /// Exactly what [`check_n(cost)`](RateLimiter::check_n) would return now, writing
    /// nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, RateLimiter};
    /// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(1)?, ManualClock::new());
    /// let peeked = limiter.peek(1);
    /// assert_eq!(limiter.peek(1), peeked); // nothing was consumed
    /// assert_eq!(limiter.check(), peeked);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    #[inline]
    pub fn peek(&self, cost: u32) -> Decision {
        self.peek_at(self.clock.now(), cost)
    }

    /// [`check_n`](RateLimiter::check_n) at an instant the caller read (simulation,
    /// replay, or a clock read already taken for the request). A later refund on this
    /// limiter is judged at its clock's reading and assumes no admission it sees was
    /// decided after it (see [`Clock`](crate::Clock)).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Nanos, Policy, RateLimiter};
    /// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(1)?, ManualClock::new());
    /// assert!(limiter.check_n_at(Nanos::from_secs(5), 1).is_allowed());
    /// assert!(!limiter.check_n_at(Nanos::from_secs(5), 1).is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    #[inline]
    pub fn check_n_at(&self, now: Nanos, cost: u32) -> Decision {
        self.cell.apply(&self.algorithm, now, cost)
    }

    /// Decides `cost` units now like [`check_n`](RateLimiter::check_n), and returns a
    /// [`Receipt`] for a later [`refund`](RateLimiter::refund) (composite limits, the
    /// charge-first login pattern).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, RateLimiter};
    /// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(2)?, ManualClock::new());
    /// let (decision, receipt) = limiter.charge(2);
    /// assert_eq!(decision.remaining(), 0);
    /// assert!(limiter.refund(receipt));
    /// assert_eq!(limiter.peek(0).remaining(), 2);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    #[inline]
    pub fn charge(&self, cost: u32) -> (Decision, Receipt) {
        self.charge_at(self.clock.now(), cost)
    }

    /// [`charge`](RateLimiter::charge) at an instant the caller read.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Nanos, Policy, RateLimiter};
    /// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(1)?, ManualClock::new());
    /// let (decision, receipt) = limiter.charge_at(Nanos::from_secs(5), 1);
    /// assert!(decision.is_allowed() && receipt.is_charged());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    #[inline]
    pub fn charge_at(&self, now: Nanos, cost: u32) -> (Decision, Receipt) {
        let generation = self.cell.generation();
        let (decision, charge) = self.cell.charge(&self.algorithm, now, cost);
        (decision, Receipt::new(self.owner, 0, generation, charge))
    }

    /// Gives back what the charge behind `receipt` still provably holds
    /// ([`Algorithm::refund`]): never another request's units. Returns whether
    /// anything came back. A receipt of another limiter, or of a charge that took
    /// nothing, or of a charge taken before a [`reset`](RateLimiter::reset) or a
    /// policy change, gives back nothing. The clock is read after the state is
    /// loaded, so the refund is judged no earlier than any admission it sees.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{FixedWindow, ManualClock, Policy, RateLimiter};
    /// use std::time::Duration;
    /// let clock = ManualClock::new();
    /// let limiter = RateLimiter::with_clock(FixedWindow::new(Policy::per_second(3)?)?, clock.clone());
    /// let (_, receipt) = limiter.charge(1);
    /// clock.advance(Duration::from_secs(1));
    /// let _ = limiter.check(); // another request opens the next window
    /// assert!(!limiter.refund(receipt)); // that window's unit is not ours to give back
    /// assert_eq!(limiter.peek(0).remaining(), 2);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn refund(&self, receipt: Receipt) -> bool {
        refund_receipt(&self.cell, &self.algorithm, self.owner, receipt, || {
            self.clock.now()
        })
    }

    /// Back to the fresh state, as if no request had been seen (to unblock a client,
    /// or clear a failure counter). Outstanding receipts are invalidated: a refund
    /// of a charge taken before the reset gives back nothing, since the reset has
    /// already given back everything.
    ///
    /// A decision racing the reset is ordered before it (and wiped) or after it.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, RateLimiter};
    /// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(1)?, ManualClock::new());
    /// let (_, receipt) = limiter.charge(1);
    /// assert!(!limiter.check().is_allowed());
    /// limiter.reset();
    /// assert!(limiter.check().is_allowed());
    /// assert!(!limiter.refund(receipt)); // the reset gave it back already
    /// assert!(!limiter.check().is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn reset(&self) {
        self.cell.reset();
    }

    /// Replaces the algorithm (and with it the policy), keeping the state as
    /// [`Algorithm::carry_over`] says: GCRA keeps its schedule and applies the new
    /// rate from now on; a window keeps its counts when the period stays and starts
    /// fresh when it changes. Outstanding receipts are invalidated (a refund of an
    /// earlier charge gives back nothing).
    ///
    /// Takes `&mut self`: no decision can run on the old algorithm while the state is
    /// carried over. To change a shared limiter, hold it in a lock of your own, or
    /// use [`SlidingLog::set_policy`](crate::SlidingLog::set_policy), whose state is
    /// under a mutex anyway.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{FixedWindow, ManualClock, Policy, RateLimiter};
    /// let mut limiter = RateLimiter::with_clock(FixedWindow::new(Policy::per_minute(10)?)?, ManualClock::new());
    /// assert!(limiter.check_n(4).is_allowed());
    /// // Same period: the 4 units stay counted.
    /// limiter.set_algorithm(FixedWindow::new(Policy::per_minute(5)?)?);
    /// assert_eq!(limiter.peek(0).remaining(), 1);
    /// // Another period: a fresh window.
    /// limiter.set_algorithm(FixedWindow::new(Policy::per_hour(5)?)?);
    /// assert_eq!(limiter.peek(0).remaining(), 5);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn set_algorithm(&mut self, algorithm: A) {
        let now = self.clock.now();
        let previous = core::mem::replace(&mut self.algorithm, algorithm);
        let next = &self.algorithm;
        self.cell
            .replace(|state| next.carry_over(&previous, state, now));
    }

    /// Books `cost` units at the earliest instant they fit, however far ahead, for a
    /// waiter ([`Wait`](crate::Wait)): the decision (denied only for "never"), the
    /// delay until the booked slot, and the receipt whose
    /// [`refund`](RateLimiter::refund) cancels the booking. `None` when the
    /// algorithm cannot book ahead ([`Algorithm::book`]: GCRA books, the windows do
    /// not).
    ///
    /// Bookings are first come, first served: each moves the schedule by its own
    /// units in one compare-and-swap.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Nanos, Policy, RateLimiter};
    /// use std::time::Duration;
    /// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(2)?.with_burst(1)?, ManualClock::new());
    /// let now = Nanos::from_secs(1);
    /// let (first, wait, _) = limiter.book_at(now, 1).unwrap();
    /// assert!(first.is_allowed() && wait.is_zero());
    /// let (_, wait, receipt) = limiter.book_at(now, 1).unwrap();
    /// assert_eq!(wait, Duration::from_millis(500));
    /// assert!(limiter.refund(receipt)); // a booking not yet reached comes back whole
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn book_at(&self, now: Nanos, cost: u32) -> Option<(Decision, Duration, Receipt)> {
        let _can_book = self.algorithm.book(bytemuck::Zeroable::zeroed(), now, 0)?;
        let generation = self.cell.generation();
        let booking = Booking(&self.algorithm);
        let (decision, charge) = self.cell.charge(&booking, now, cost);
        let delay = charge.as_ref().map_or(Duration::ZERO, |(c, _)| {
            self.algorithm
                .ready_at(c)
                .saturating_since(now)
                .as_duration()
        });
        Some((
            decision,
            delay,
            Receipt::new(self.owner, 0, generation, charge),
        ))
    }

    /// [`peek`](RateLimiter::peek) at an instant the caller read.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Nanos, Policy, RateLimiter};
    /// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(1)?, ManualClock::new());
    /// assert!(limiter.peek_at(Nanos::from_secs(5), 1).is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    #[inline]
    pub fn peek_at(&self, now: Nanos, cost: u32) -> Decision {
        self.algorithm.decide(self.cell.load(), now, cost).0
    }

    /// The algorithm (and through it, the policy).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Policy, RateLimiter};
    /// let limiter = RateLimiter::gcra(Policy::per_second(3)?);
    /// assert_eq!(limiter.algorithm().policy().limit(), 3);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn algorithm(&self) -> &A {
        &self.algorithm
    }

    /// The clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Clock, ManualClock, Nanos, Policy, RateLimiter};
    /// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(3)?, ManualClock::new());
    /// assert_eq!(limiter.clock().now(), Nanos::ZERO);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The current packed state (for tests, metrics and persistence).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Nanos, Policy, RateLimiter};
    /// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(1)?, ManualClock::new());
    /// let _ = limiter.check();
    /// assert_eq!(limiter.state().tat(), Nanos::from_secs(1));
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn state(&self) -> A::State {
        self.cell.load()
    }
}

/// An algorithm's [`book`](Algorithm::book) run as a decision (for the cells).
pub(crate) struct Booking<'a, A>(pub(crate) &'a A);

impl<A: Algorithm> Algorithm for Booking<'_, A> {
    type State = A::State;

    #[inline]
    fn decide(&self, state: A::State, now: Nanos, cost: u32) -> (Decision, Option<A::State>) {
        self.0
            .book(state, now, cost)
            .unwrap_or_else(|| self.0.decide(state, now, cost))
    }

    fn is_idle(&self, state: A::State, now: Nanos) -> bool {
        self.0.is_idle(state, now)
    }
}

impl<A, C, S> core::fmt::Debug for RateLimiter<A, C, S>
where
    A: Algorithm + core::fmt::Debug,
    C: core::fmt::Debug,
    S: StateCell<A::State>,
{
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("algorithm", &self.algorithm)
            .field("clock", &self.clock)
            .field("state", &self.cell.load())
            .finish()
    }
}
