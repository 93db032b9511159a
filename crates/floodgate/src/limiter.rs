//! [`RateLimiter`]: one limit, one state, any algorithm, any clock.

use crate::algorithm::Algorithm;
use crate::cell::{AtomicCell, LockedCell, StateCell};
use crate::clock::{Clock, DefaultClock, Nanos};
use crate::decision::Decision;
use crate::gcra::Gcra;
use crate::policy::Policy;
use crate::receipt::{Owner, Receipt};

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
    /// replay, or a clock read already taken for the request).
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
        let (decision, charge) = self.cell.charge(&self.algorithm, now, cost);
        (decision, Receipt::new(self.owner, 0, 0, charge))
    }

    /// Gives back what the charge behind `receipt` still provably holds
    /// ([`Algorithm::refund`]): never another request's units. Returns whether
    /// anything came back. A receipt of another limiter, or of a charge that took
    /// nothing, gives back nothing. The clock is read after the state is loaded, so
    /// the refund is judged no earlier than any admission it sees.
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
        match receipt.charge_for(self.owner, 0) {
            Some(charge) => self
                .cell
                .refund(&self.algorithm, &charge, receipt.noted(), || {
                    self.clock.now()
                }),
            None => false,
        }
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
