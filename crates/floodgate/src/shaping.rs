//! Shaping: the leaky bucket as a *queue*. A request is not refused when it arrives
//! early — it is given a slot, the instant it may proceed, and waits for it.
//!
//! # Reservations on GCRA
//!
//! A reservation of `n` units is GCRA's transition with the tolerance raised from
//! `τ = B·T` to `τ + max_delay`: with `tat = max(TAT, now)` and `new_tat = tat + n·T`,
//!
//! ```text
//! n > B                          → never (ShapeError::Never)
//! new_tat − τ − now ≤ max_delay  → TAT = new_tat; proceed at max(new_tat − τ, now)
//! otherwise                      → denied without consuming; retry after
//!                                  new_tat − τ − now − max_delay
//! ```
//!
//! The slot is `new_tat − τ`: the instant a plain GCRA check of the same request would
//! first succeed. Each reservation moves `TAT` forward by its own `n·T` in one
//! compare-and-swap, so slots are handed out in reservation order and never overlap:
//! **the reservation instant is the order**. Waiters then sleep until their slot —
//! one `std::thread::sleep` ([`Shaper::wait`]) or one `tokio::time::sleep_until`
//! (`Shaper::until_ready`, feature `tokio`) — with no polling loop and no queue to
//! lock.
//!
//! [`Shaper::cancel`] gives units back as Go's `x/time/rate` does: the units reserved
//! *after* the cancelled one stay spent (their slots were already handed out), the
//! rest return; a reservation whose slot has passed is not refunded.
//!
//! A reservation granted with no delay is exactly a plain GCRA admission (`new TAT ≤
//! now + τ`, the same transition): [`Reservation::into_receipt`] turns it into the
//! [`Receipt`] that [`Shaper::charge`] would have given, refunded by GCRA's rule
//! ([`Shaper::refund`]) — so one reservation serves a caller that queues when it must
//! and, when it did not, may give its slot back later as any charge can. A delayed
//! reservation has no receipt; it is cancelled.
//!
//! # nginx `limit_req`
//!
//! For `rate=r` (`T = 1/r`):
//!
//! | nginx | floodgate |
//! |---|---|
//! | `burst=b` (queue, no `nodelay`) | burst `1`, `max_delay = b·T` |
//! | `burst=b nodelay` | burst `b + 1`, `max_delay = 0` (plain GCRA) |
//! | `burst=b delay=d` (two-stage) | burst `d + 1`, `max_delay = (b − d)·T` |
//!
//! `tests/shaping.rs` replays each against nginx's `excess` arithmetic.

use core::fmt;
use core::time::Duration;

use crate::algorithm::{Algorithm, Charged};
use crate::cell::{refund_receipt, AtomicCell, LockedCell, StateCell};
use crate::clock::{Clock, DefaultClock, Nanos};
use crate::decision::Decision;
use crate::gcra::{Gcra, GcraState};
use crate::limiter::Booking;
use crate::policy::Policy;
use crate::receipt::{Owner, Receipt};
use crate::sync::{unique_id, AtomicU64, Ordering};

/// A shaper: reservations on one GCRA state. Lock-free by default; [`LockedShaper`]
/// is its mutex twin.
///
/// # Examples
///
/// ```
/// use floodgate::{ManualClock, Policy, Shaper};
/// use std::time::Duration;
///
/// // 10 per second, one at a time, queueing up to half a second.
/// let shaper = Shaper::with_clock(Policy::per_second(10)?.with_burst(1)?, ManualClock::new());
/// let max = Duration::from_millis(500);
/// let first = shaper.reserve(1, max)?;
/// let second = shaper.reserve(1, max)?;
/// assert_eq!(first.delay(), Duration::ZERO);
/// assert_eq!(second.delay(), Duration::from_millis(100));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Shaper<C = DefaultClock, S = AtomicCell<GcraState>> {
    /// This shaper's identity, unique in the process (never reused, unlike its
    /// address): a [`Reservation`] carries it so that only its shaper refunds it.
    id: u64,
    /// The id its composite receipts carry ([`Limit`](crate::Limit)).
    owner: Owner,
    gcra: Gcra,
    clock: C,
    cell: S,
}

/// The mutex twin of [`Shaper`]: the same transitions, the state under a `Mutex`.
///
/// # Examples
///
/// ```
/// use floodgate::{LockedShaper, ManualClock, Policy, Shaper};
/// use std::time::Duration;
/// let twin: LockedShaper<ManualClock> =
///     Shaper::locked_with_clock(Policy::per_second(10)?.with_burst(2)?, ManualClock::new());
/// assert_eq!(twin.reserve(2, Duration::from_secs(1))?.delay(), Duration::ZERO);
/// assert_eq!(twin.reserve(1, Duration::from_secs(1))?.delay(), Duration::from_millis(100));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type LockedShaper<C = DefaultClock> = Shaper<C, LockedCell<GcraState>>;

/// A granted slot: the request may proceed at [`ready_at`](Reservation::ready_at).
///
/// Drop it to keep the units, or hand it to [`Shaper::cancel`] to give them back;
/// one granted with no delay may instead become its charge's [`Receipt`]
/// ([`into_receipt`](Reservation::into_receipt)).
/// A reservation belongs to the shaper that granted it: any other shaper (including
/// a later one at the same address) refunds nothing for it. Two reservations are
/// equal only if the same shaper granted the same slot.
///
/// # Examples
///
/// ```
/// use floodgate::{ManualClock, Nanos, Policy, Shaper};
/// use std::time::Duration;
/// let shaper = Shaper::with_clock(Policy::per_second(2)?.with_burst(1)?, ManualClock::new());
/// let _ = shaper.reserve(1, Duration::ZERO)?;
/// let r = shaper.reserve(1, Duration::from_secs(1))?;
/// assert_eq!(r.ready_at(), Nanos::ZERO.saturating_add(Duration::from_millis(500)));
/// assert_eq!(r.cost(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "a reservation holds units; drop it to keep them or cancel it to give them back"]
#[derive(Debug, PartialEq, Eq)]
pub struct Reservation {
    /// The id of the shaper that granted it.
    shaper: u64,
    /// The id the shaper's receipts carry ([`into_receipt`](Reservation::into_receipt)).
    owner: Owner,
    /// The state the reservation replaced; `None` when it took nothing (cost 0).
    before: Option<GcraState>,
    /// The shaper's cell generation at the reservation: a reset invalidates it.
    generation: u64,
    /// The shaper's refund ledger as the reservation noted it: how far later
    /// cancellations and refunds have moved its booking since is the difference.
    noted: u64,
    made_at: Nanos,
    ready_at: Nanos,
    /// `TAT` right after this reservation.
    tat: Nanos,
    cost: u32,
    decision: Decision,
}

impl Reservation {
    /// The instant the request may proceed.
    pub fn ready_at(&self) -> Nanos {
        self.ready_at
    }

    /// How long after the reservation was made the request may proceed.
    pub fn delay(&self) -> Duration {
        self.ready_at.saturating_since(self.made_at).as_duration()
    }

    /// The units reserved.
    pub fn cost(&self) -> u32 {
        self.cost
    }

    /// The decision behind the reservation: `remaining` counts the units that could
    /// still be reserved within the same `max_delay`.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// The reservation as a charge's [`Receipt`] when its slot is now (no delay), or
    /// the reservation itself when its slot is later.
    ///
    /// A reservation granted with no delay is exactly a plain GCRA admission: the same
    /// test (`new TAT ≤ now + τ`) and the same transition as
    /// [`charge_at`](Shaper::charge_at) at the reservation's instant. Its receipt is
    /// the one that charge would have given, and [`Shaper::refund`] judges it by
    /// GCRA's refund rule ([`Algorithm::refund`]) exactly as it judges a charge's:
    /// the part of the booking the clock has not reached comes back, less any slot
    /// reserved after it that is still ahead (those stay spent). A reservation of cost
    /// 0 gives a receipt that holds nothing (as `charge(0)`'s).
    ///
    /// A reservation whose slot is later is returned unchanged (`Err`): it has no
    /// receipt, and [`Shaper::cancel`] is its only way back.
    ///
    /// The conversion consumes the reservation, so its units are given back at most
    /// once: by the receipt's refund, or by a cancellation, never both.
    ///
    /// ```compile_fail
    /// use floodgate::{ManualClock, Policy, Shaper};
    /// use std::time::Duration;
    /// let shaper = Shaper::with_clock(Policy::per_second(1).unwrap(), ManualClock::new());
    /// let r = shaper.reserve(1, Duration::ZERO).unwrap();
    /// let receipt = r.into_receipt().unwrap();
    /// shaper.cancel(r); // the reservation became the receipt: cancelling it again does not compile
    /// ```
    ///
    /// ```compile_fail
    /// use floodgate::{ManualClock, Policy, Shaper};
    /// use std::time::Duration;
    /// let shaper = Shaper::with_clock(Policy::per_second(1).unwrap(), ManualClock::new());
    /// let r = shaper.reserve(1, Duration::ZERO).unwrap();
    /// shaper.cancel(r);
    /// let receipt = r.into_receipt(); // cancelled: no receipt is left to take
    /// ```
    ///
    /// # Errors
    ///
    /// The reservation itself when its slot is later than the instant it was made at
    /// (its [`delay`](Reservation::delay) is not zero).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, Shaper};
    /// use std::time::Duration;
    /// let shaper = Shaper::with_clock(Policy::per_second(10)?.with_burst(1)?, ManualClock::new());
    /// let max = Duration::from_secs(1);
    /// // The slot is free now: the reservation is a charge, with that charge's receipt,
    /// let receipt = shaper.reserve(1, max)?.into_receipt().expect("no delay");
    /// assert!(receipt.is_charged());
    /// // which gives the slot back as a charge's receipt would.
    /// assert!(shaper.refund(receipt));
    /// let kept = shaper.reserve(1, max)?;
    /// assert_eq!(kept.delay(), Duration::ZERO);
    /// // The next slot is 100 ms away: no receipt, the reservation comes back.
    /// let later = shaper.reserve(1, max)?.into_receipt().expect_err("delayed");
    /// assert_eq!(later.delay(), Duration::from_millis(100));
    /// assert_eq!(shaper.cancel(later), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    // The `Err` is the reservation itself, handed back unchanged (as `Arc::try_unwrap`
    // hands back the `Arc`): boxing it would allocate once per delayed request.
    #[allow(clippy::result_large_err)]
    pub fn into_receipt(self) -> Result<Receipt, Reservation> {
        if self.ready_at != self.made_at {
            return Err(self);
        }
        let charge = self.before.map(|before| {
            let charged = Charged {
                before,
                after: GcraState::from_tat(self.tat),
                at: self.made_at,
                cost: self.cost,
            };
            (charged, self.noted)
        });
        Ok(Receipt::new(self.owner, 0, self.generation, charge))
    }
}

/// Why a reservation was refused. Nothing was consumed.
///
/// # Examples
///
/// ```
/// use floodgate::{ManualClock, Policy, ShapeError, Shaper};
/// use std::time::Duration;
/// let shaper = Shaper::with_clock(Policy::per_second(10)?.with_burst(2)?, ManualClock::new());
/// assert_eq!(shaper.reserve(3, Duration::MAX), Err(ShapeError::Never { cost: 3, burst: 2 }));
/// let _ = shaper.reserve(2, Duration::ZERO)?;
/// assert_eq!(
///     shaper.reserve(1, Duration::from_millis(40)),
///     Err(ShapeError::TooLong { retry_after: Duration::from_millis(60) })
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShapeError {
    /// The slot is further away than `max_delay`. Retryable: the same reservation fits
    /// after `retry_after` if nothing else is reserved.
    TooLong {
        /// The wait after which the same reservation would fit.
        retry_after: Duration,
    },
    /// The cost exceeds the burst (or the slot would pass the end of `u64` time): no
    /// wait helps.
    Never {
        /// The cost asked for.
        cost: u32,
        /// The burst `B`.
        burst: u64,
    },
}

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShapeError::TooLong { retry_after } => write!(
                f,
                "the slot is beyond the maximum delay; retry after {retry_after:?}"
            ),
            ShapeError::Never { cost, burst } => {
                write!(f, "a cost of {cost} can never fit a burst of {burst}")
            }
        }
    }
}

impl std::error::Error for ShapeError {}

/// What a reservation would decide at one instant, reserving nothing:
/// [`Shaper::peek_reserve`] and the keyed
/// [`KeyedLimiter::peek_reserve`](crate::KeyedLimiter::peek_reserve).
///
/// It is the same transition as the reservation's, run on the state as it is and
/// not written: the [`decision`](ReservationPeek::decision) the reservation would
/// carry (or its refusal's), and the [`delay`](ReservationPeek::delay) until its
/// slot — `Ok` exactly when the reservation would succeed, with its delay, and
/// otherwise the same [`ShapeError`]. A reservation made later sees whatever was
/// reserved, cancelled or refunded in between, so a peek is a forecast, not a hold.
///
/// A refusal's decision reports the schedule as it stands (`remaining`: the units
/// reservable within `max_delay`; `reset_after`: until the schedule is idle); an
/// admission's, as it would be after the reservation.
///
/// # Examples
///
/// ```
/// use floodgate::{ManualClock, Policy, ShapeError, Shaper};
/// use std::time::Duration;
/// let shaper = Shaper::with_clock(Policy::per_second(10)?.with_burst(1)?, ManualClock::new());
/// let max = Duration::from_millis(150);
/// let _ = shaper.reserve(1, max)?;
/// let peek = shaper.peek_reserve(1, max);
/// assert_eq!(peek.delay(), Ok(Duration::from_millis(100)));
/// assert_eq!(peek.decision(), shaper.reserve(1, max)?.decision());
/// // Nothing was reserved by the peek: the second reservation got the 100 ms slot,
/// // and a third would be 200 ms away, 50 ms beyond the bound.
/// let refused = shaper.peek_reserve(1, max);
/// assert_eq!(refused.delay(), Err(ShapeError::TooLong { retry_after: Duration::from_millis(50) }));
/// assert_eq!(refused.decision().retry_after(), Some(Duration::from_millis(50)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "a peek reserves nothing; it only says what a reservation would decide"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReservationPeek {
    decision: Decision,
    /// Nanoseconds until the slot, or why there is none.
    delay: Result<u64, ShapeError>,
}

impl ReservationPeek {
    /// The decision the reservation would carry: an admission as
    /// [`Reservation::decision`] (or the keyed reservation's) would report it, or the
    /// refusal, whose `retry_after` is the [`ShapeError::TooLong`] wait (`None` for
    /// [`ShapeError::Never`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, Shaper};
    /// use std::time::Duration;
    /// let shaper = Shaper::with_clock(Policy::per_second(10)?.with_burst(2)?, ManualClock::new());
    /// let peek = shaper.peek_reserve(3, Duration::MAX);
    /// assert!(!peek.decision().is_allowed());
    /// assert_eq!(peek.decision().retry_after(), None); // never: 3 > burst 2
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// The delay until the slot, as the reservation would report it
    /// ([`Reservation::delay`], the keyed reservation's delay), or the error it
    /// would fail with.
    ///
    /// # Errors
    ///
    /// [`ShapeError::TooLong`] when the slot would be further than `max_delay`,
    /// [`ShapeError::Never`] when the cost exceeds the burst (or the slot would pass
    /// the end of `u64` time), as the reservation's.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, Shaper};
    /// use std::time::Duration;
    /// let shaper = Shaper::with_clock(Policy::per_second(4)?.with_burst(1)?, ManualClock::new());
    /// assert_eq!(shaper.peek_reserve(1, Duration::ZERO).delay(), Ok(Duration::ZERO));
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn delay(&self) -> Result<Duration, ShapeError> {
        self.delay.map(Duration::from_nanos)
    }
}

/// A reservation: GCRA with the tolerance `τ + max_delay`. Monotone like GCRA.
/// Shared by [`Shaper::reserve`] and the keyed
/// [`KeyedLimiter::reserve`](crate::KeyedLimiter::reserve), and by their peeks.
pub(crate) struct Reserve {
    gcra: Gcra,
    tolerance: u64,
}

impl Reserve {
    /// `gcra` admitting anything whose slot is at most `max_delay` away.
    pub(crate) fn new(gcra: Gcra, max_delay: Duration) -> Reserve {
        Reserve {
            gcra,
            tolerance: gcra
                .tolerance_nanos()
                .saturating_add(Nanos::from_duration(max_delay).as_u64()),
        }
    }

    /// What this reservation's `decision` for `cost` means (the nanoseconds until
    /// its slot, or why nothing was reserved), with the decision: the one mapping
    /// that reservations and their peeks share.
    pub(crate) fn judge(&self, decision: Decision, cost: u32) -> ReservationPeek {
        ReservationPeek {
            decision,
            delay: self.outcome(&decision, cost),
        }
    }

    /// What this reservation's `decision` for `cost` means: the nanoseconds until
    /// its slot, or why nothing was reserved.
    fn outcome(&self, decision: &Decision, cost: u32) -> Result<u64, ShapeError> {
        if !decision.is_allowed() {
            return Err(match decision.retry_after() {
                Some(retry_after) => ShapeError::TooLong { retry_after },
                None => ShapeError::Never {
                    cost,
                    burst: self.gcra.policy().burst(),
                },
            });
        }
        // Admitted with cost ≥ 1: reset_after = new_tat − now, the slot new_tat − τ.
        // Cost 0 reserves nothing and proceeds now.
        Ok(if cost == 0 {
            0
        } else {
            decision
                .reset_after_nanos()
                .saturating_sub(self.gcra.tolerance_nanos())
        })
    }
}

impl Algorithm for Reserve {
    type State = GcraState;

    #[inline(always)]
    fn decide(&self, state: GcraState, now: Nanos, cost: u32) -> (Decision, Option<GcraState>) {
        self.gcra.decide_within(self.tolerance, state, now, cost)
    }

    fn is_idle(&self, state: GcraState, now: Nanos) -> bool {
        self.gcra.is_idle(state, now)
    }
}

/// A cancellation, as `x/time/rate` computes it, run as a refund on the cell (so
/// that the cell's refund ledger records how far it moved later bookings, and a
/// reset in between makes it give back nothing).
///
/// The one transition that moves `TAT` back. Under the atomic driver a stale load
/// shows a `TAT` no later than the current one (it never goes below this
/// reservation's own write, which happened before), so it counts no more units
/// reserved later and refunds no less — when it writes, the CAS fails and the loop
/// retries on the current value; when it refunds nothing (slot passed, or every unit
/// re-booked), the current value would refund nothing either.
struct CancelRule {
    interval: u64,
    /// `TAT` right after the reservation.
    tat: u64,
    ready_at: u64,
    units: u64,
    /// The units the last successful run gave back (read by `cancel_at` under the
    /// cell's refund serialisation).
    given_back: AtomicU64,
}

impl Algorithm for CancelRule {
    type State = GcraState;

    fn decide(&self, _state: GcraState, _now: Nanos, _cost: u32) -> (Decision, Option<GcraState>) {
        // Never decides: a cancellation only refunds.
        (Decision::allow(0, 0, 1, 0), None)
    }

    fn is_idle(&self, state: GcraState, now: Nanos) -> bool {
        state.tat() <= now
    }

    fn refund(
        &self,
        state: GcraState,
        _charge: &Charged<GcraState>,
        shift: u64,
        now: Nanos,
    ) -> Option<(GcraState, u64)> {
        if now.as_u64() > self.ready_at {
            return None;
        }
        let current = state.tat().as_u64();
        // Units reserved after this one: their slots are handed out, they stay spent.
        // Cancellations and refunds since this reservation (`shift` of schedule) may
        // have moved its booking down, and the later ones with it, without moving
        // their slots: its booking now ends at or after `tat − shift`, so at most
        // `current − (tat − shift)` of schedule, rounded up to whole units, is theirs.
        let ours = self.tat.saturating_sub(shift);
        let later = current.saturating_sub(ours).div_ceil(self.interval.max(1));
        let back = self.units.saturating_sub(later);
        if back == 0 {
            return None;
        }
        let tat = current.saturating_sub(back.saturating_mul(self.interval));
        // Relaxed: read by the same thread after the refund returns.
        self.given_back.store(back, Ordering::Relaxed);
        Some((GcraState::from_tat(Nanos::new(tat)), current - tat))
    }

    /// Nothing is reserved after this reservation when its booking, moved down by at
    /// most `shift`, ends at or past the `TAT` (as [`Gcra`]'s).
    fn refund_moves_later(
        &self,
        state: GcraState,
        _charge: &Charged<GcraState>,
        shift: u64,
    ) -> bool {
        state.tat().as_u64() > self.tat.saturating_sub(shift)
    }
}

impl Shaper<DefaultClock> {
    /// A lock-free shaper for `policy` on the [`DefaultClock`].
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Policy, Shaper};
    /// use std::time::Duration;
    /// let shaper = Shaper::new(Policy::per_second(100)?);
    /// assert!(shaper.wait(1, Duration::from_millis(10)).is_ok());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn new(policy: Policy) -> Self {
        Shaper::with_clock(policy, DefaultClock::new())
    }
}

impl<C: Clock> Shaper<C> {
    /// A lock-free shaper for `policy` on `clock`.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, Shaper};
    /// let shaper = Shaper::with_clock(Policy::per_second(1)?, ManualClock::new());
    /// assert_eq!(shaper.policy().limit(), 1);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn with_clock(policy: Policy, clock: C) -> Self {
        Shaper {
            id: unique_id(),
            owner: Owner::new(),
            gcra: Gcra::new(policy),
            clock,
            cell: AtomicCell::fresh(),
        }
    }
}

impl<C: Clock> LockedShaper<C> {
    /// The mutex twin for `policy` on `clock`.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, Shaper};
    /// let twin = Shaper::locked_with_clock(Policy::per_second(1)?, ManualClock::new());
    /// assert_eq!(twin.policy().limit(), 1);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn locked_with_clock(policy: Policy, clock: C) -> Self {
        Shaper {
            id: unique_id(),
            owner: Owner::new(),
            gcra: Gcra::new(policy),
            clock,
            cell: LockedCell::fresh(),
        }
    }
}

impl<C: Clock, S: StateCell<GcraState>> Shaper<C, S> {
    /// Reserves `cost` units now if their slot is at most `max_delay` away.
    ///
    /// # Errors
    ///
    /// [`ShapeError::TooLong`] when the slot is further than `max_delay` (nothing is
    /// consumed), [`ShapeError::Never`] when `cost` exceeds the burst.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, Shaper};
    /// use std::time::Duration;
    /// let shaper = Shaper::with_clock(Policy::per_second(4)?.with_burst(1)?, ManualClock::new());
    /// let r = shaper.reserve(1, Duration::ZERO)?;
    /// assert_eq!(r.delay(), Duration::ZERO);
    /// assert!(shaper.reserve(1, Duration::ZERO).is_err());
    /// assert_eq!(shaper.reserve(1, Duration::from_secs(1))?.delay(), Duration::from_millis(250));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve(&self, cost: u32, max_delay: Duration) -> Result<Reservation, ShapeError> {
        self.reserve_at(self.clock.now(), cost, max_delay)
    }

    /// [`reserve`](Shaper::reserve) at an instant the caller read.
    ///
    /// # Errors
    ///
    /// As [`reserve`](Shaper::reserve).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Nanos, Policy, Shaper};
    /// use std::time::Duration;
    /// let shaper = Shaper::with_clock(Policy::per_second(1)?.with_burst(1)?, ManualClock::new());
    /// let r = shaper.reserve_at(Nanos::from_secs(10), 1, Duration::ZERO)?;
    /// assert_eq!(r.ready_at(), Nanos::from_secs(10));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve_at(
        &self,
        now: Nanos,
        cost: u32,
        max_delay: Duration,
    ) -> Result<Reservation, ShapeError> {
        let reserve = Reserve::new(self.gcra, max_delay);
        let generation = self.cell.generation();
        let (decision, charged) = self.cell.charge(&reserve, now, cost);
        let delay = reserve.judge(decision, cost).delay?;
        let booked = decision.reset_after_nanos();
        Ok(Reservation {
            shaper: self.id,
            owner: self.owner,
            before: charged.map(|(c, _)| c.before),
            generation,
            noted: charged.map_or(0, |(_, noted)| noted),
            made_at: now,
            ready_at: Nanos::new(now.as_u64().saturating_add(delay)),
            tat: Nanos::new(now.as_u64().saturating_add(booked)),
            cost,
            decision,
        })
    }

    /// What [`reserve`](Shaper::reserve) would decide now, reserving nothing: the
    /// same transition on the state as it is, not written ([`ReservationPeek`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, Shaper};
    /// use std::time::Duration;
    /// let shaper = Shaper::with_clock(Policy::per_second(4)?.with_burst(1)?, ManualClock::new());
    /// let _ = shaper.reserve(1, Duration::ZERO)?;
    /// let before = shaper.state();
    /// assert_eq!(shaper.peek_reserve(1, Duration::from_secs(1)).delay(), Ok(Duration::from_millis(250)));
    /// assert_eq!(shaper.state(), before); // nothing reserved
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek_reserve(&self, cost: u32, max_delay: Duration) -> ReservationPeek {
        self.peek_reserve_at(self.clock.now(), cost, max_delay)
    }

    /// [`peek_reserve`](Shaper::peek_reserve) at an instant the caller read: exactly
    /// what [`reserve_at`](Shaper::reserve_at) would decide at `now` on the state as
    /// it is.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Nanos, Policy, ShapeError, Shaper};
    /// use std::time::Duration;
    /// let shaper = Shaper::with_clock(Policy::per_second(1)?.with_burst(1)?, ManualClock::new());
    /// let now = Nanos::from_secs(10);
    /// let _ = shaper.reserve_at(now, 1, Duration::ZERO)?;
    /// let peek = shaper.peek_reserve_at(now, 1, Duration::ZERO);
    /// assert_eq!(peek.delay(), Err(ShapeError::TooLong { retry_after: Duration::from_secs(1) }));
    /// assert_eq!(shaper.reserve_at(now, 1, Duration::ZERO).map(|r| r.delay()), peek.delay());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek_reserve_at(&self, now: Nanos, cost: u32, max_delay: Duration) -> ReservationPeek {
        let reserve = Reserve::new(self.gcra, max_delay);
        let (decision, _) = reserve.decide(self.cell.load(), now, cost);
        reserve.judge(decision, cost)
    }

    /// Gives back the units of `reservation` that nobody reserved after it, unless its
    /// slot has passed. Returns the units given back.
    ///
    /// Units reserved after it keep their slots, so they stay spent. When other
    /// cancellations or refunds that moved later units came since this reservation,
    /// it cannot tell whether they moved it down (they did if they were for units
    /// before it): it then counts as reserved after it every unit that may be, and
    /// may give back less than an exact count would. One of the schedule's last
    /// reservation moved nobody and does not count, so waiters that leave from the
    /// last to the first each give back their units. It never gives back a slot a
    /// later reservation still holds.
    ///
    /// A reservation another shaper granted (another [`Shaper`] or [`LockedShaper`],
    /// or one since dropped, even if this shaper now sits at its address) is not
    /// this shaper's to refund: cancelling it here does nothing and returns 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, Shaper};
    /// use std::time::Duration;
    /// let shaper = Shaper::with_clock(Policy::per_second(10)?.with_burst(3)?, ManualClock::new());
    /// let max = Duration::from_secs(1);
    /// let _now = shaper.reserve(1, max)?;
    /// let three = shaper.reserve(3, max)?; // slot in 100 ms
    /// let two = shaper.reserve(2, max)?; // slot in 300 ms
    /// // Two units were reserved after `three`: they stay spent, one comes back.
    /// assert_eq!(shaper.cancel(three), 1);
    /// // Nothing was reserved after `two`: both come back.
    /// assert_eq!(shaper.cancel(two), 2);
    /// assert_eq!(shaper.reserve(1, max)?.delay(), Duration::from_millis(100));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cancel(&self, reservation: Reservation) -> u32 {
        // The clock is read after the state is loaded, as for a refund: every
        // reservation the cancellation sees was made at a reading no later than its
        // own, so a slot that has passed for any of them has passed for it.
        self.cancel_with(reservation, || self.clock.now())
    }

    /// [`cancel`](Shaper::cancel) at an instant the caller read.
    ///
    /// As with [`reserve_at`](Shaper::reserve_at), the caller keeps its instants in
    /// order: a cancellation at an instant earlier than a reservation the shaper has
    /// already made (another thread's, at a later reading) may find a slot not yet
    /// passed that has passed for that reservation, and give back units it relies on.
    /// [`cancel`](Shaper::cancel) reads the shaper's clock after loading the state,
    /// which rules this out.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Nanos, Policy, Shaper};
    /// use std::time::Duration;
    /// let shaper = Shaper::with_clock(Policy::per_second(1)?.with_burst(1)?, ManualClock::new());
    /// let r = shaper.reserve_at(Nanos::from_secs(1), 1, Duration::ZERO)?;
    /// // The slot (1 s) has passed at 2 s: nothing comes back.
    /// assert_eq!(shaper.cancel_at(Nanos::from_secs(2), r), 0);
    /// // Another shaper's reservation is not this one's to refund.
    /// let other = Shaper::with_clock(Policy::per_second(1)?.with_burst(1)?, ManualClock::new());
    /// let theirs = other.reserve_at(Nanos::from_secs(3), 1, Duration::ZERO)?;
    /// assert_eq!(shaper.cancel_at(Nanos::from_secs(3), theirs), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cancel_at(&self, now: Nanos, reservation: Reservation) -> u32 {
        self.cancel_with(reservation, || now)
    }

    /// A cancellation judged at `now()`, read after each load of the state.
    fn cancel_with(&self, reservation: Reservation, now: impl FnMut() -> Nanos) -> u32 {
        if reservation.shaper != self.id {
            return 0;
        }
        let rule = CancelRule {
            interval: self.gcra.policy().interval_nanos(),
            tat: reservation.tat.as_u64(),
            ready_at: reservation.ready_at.as_u64(),
            units: u64::from(reservation.cost),
            given_back: AtomicU64::new(0),
        };
        let charge = Charged {
            before: GcraState::default(),
            after: GcraState::from_tat(reservation.tat),
            at: reservation.made_at,
            cost: reservation.cost,
        };
        if !self.cell.refund(
            &rule,
            &charge,
            reservation.noted,
            reservation.generation,
            now,
        ) {
            return 0;
        }
        // given_back ≤ cost ≤ u32::MAX
        u32::try_from(rule.given_back.load(Ordering::Relaxed)).unwrap_or(u32::MAX)
    }

    /// Reserves `cost` units and blocks the thread until their slot: one
    /// `std::thread::sleep`, no polling. Returns how long it slept.
    ///
    /// The wait is measured on this shaper's clock and slept in real time, so use a
    /// real clock ([`DefaultClock`], [`StdClock`](crate::StdClock)) here.
    ///
    /// # Errors
    ///
    /// As [`reserve`](Shaper::reserve); then nothing was reserved and nothing slept.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Policy, Shaper};
    /// use std::time::Duration;
    /// let shaper = Shaper::new(Policy::per_second(1000)?.with_burst(1)?);
    /// assert!(shaper.wait(1, Duration::from_millis(50)).is_ok());
    /// // The next slot is about 1 ms away: this sleeps until then.
    /// let slept = shaper.wait(1, Duration::from_millis(50)).unwrap();
    /// assert!(slept <= Duration::from_millis(1));
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn wait(&self, cost: u32, max_delay: Duration) -> Result<Duration, ShapeError> {
        let delay = self.reserve(cost, max_delay)?.delay();
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        Ok(delay)
    }

    /// Reserves `cost` units and waits asynchronously until their slot: one
    /// `tokio::time::sleep_until`, no polling. Returns the wait. If the future is
    /// dropped before the slot, the reservation is cancelled (as
    /// [`cancel`](Shaper::cancel)).
    ///
    /// Must run inside a Tokio runtime with the time driver enabled. The wait is
    /// measured on this shaper's clock and slept on Tokio's.
    ///
    /// # Errors
    ///
    /// As [`reserve`](Shaper::reserve).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Policy, Shaper};
    /// use std::time::Duration;
    /// # let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    /// # rt.block_on(async {
    /// let shaper = Shaper::new(Policy::per_second(1000)?.with_burst(1)?);
    /// shaper.until_ready(1, Duration::from_millis(50)).await.unwrap();
    /// let waited = shaper.until_ready(1, Duration::from_millis(50)).await.unwrap();
    /// assert!(waited <= Duration::from_millis(1));
    /// # Ok::<(), floodgate::PolicyError>(())
    /// # }).unwrap();
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn until_ready(
        &self,
        cost: u32,
        max_delay: Duration,
    ) -> Result<Duration, ShapeError> {
        let reservation = self.reserve(cost, max_delay)?;
        let delay = reservation.delay();
        if delay.is_zero() {
            return Ok(delay);
        }
        let deadline = tokio::time::Instant::now() + delay;
        let mut pending = CancelOnDrop {
            shaper: self,
            reservation: Some(reservation),
        };
        tokio::time::sleep_until(deadline).await;
        // The slot has come: keep the units.
        pending.reservation = None;
        Ok(delay)
    }

    /// Charges `cost` units now as a plain GCRA check (no queueing: the slot must be
    /// now), with a [`Receipt`] for [`refund`](Shaper::refund) — what a shaper does as a
    /// composite [`Limit`](crate::Limit). A refund follows GCRA's rule
    /// ([`Algorithm::refund`]), not [`cancel`](Shaper::cancel)'s (whose slot would
    /// always have passed for a charge made now).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, Shaper};
    /// let shaper = Shaper::with_clock(Policy::per_second(2)?.with_burst(1)?, ManualClock::new());
    /// let (decision, receipt) = shaper.charge(1);
    /// assert!(decision.is_allowed());
    /// assert!(!shaper.charge(1).0.is_allowed());
    /// assert!(shaper.refund(receipt));
    /// assert!(shaper.charge(1).0.is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn charge(&self, cost: u32) -> (Decision, Receipt) {
        self.charge_at(self.clock.now(), cost)
    }

    /// [`charge`](Shaper::charge) at an instant the caller read.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Nanos, Policy, Shaper};
    /// let shaper = Shaper::with_clock(Policy::per_second(1)?, ManualClock::new());
    /// assert!(shaper.charge_at(Nanos::from_secs(3), 1).1.is_charged());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn charge_at(&self, now: Nanos, cost: u32) -> (Decision, Receipt) {
        let generation = self.cell.generation();
        let (decision, charge) = self.cell.charge(&self.gcra, now, cost);
        (decision, Receipt::new(self.owner, 0, generation, charge))
    }

    /// Books `cost` units at the earliest slot, however far ahead (no `max_delay`),
    /// for a waiter ([`Wait`](crate::Wait)): the decision (denied only for "never"),
    /// the delay until the slot and the receipt whose [`refund`](Shaper::refund)
    /// cancels it.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Nanos, Policy, Shaper};
    /// use std::time::Duration;
    /// let shaper = Shaper::with_clock(Policy::per_second(4)?.with_burst(1)?, ManualClock::new());
    /// let _ = shaper.book_at(Nanos::ZERO, 1);
    /// let (_, wait, _) = shaper.book_at(Nanos::ZERO, 1);
    /// assert_eq!(wait, Duration::from_millis(250));
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn book_at(&self, now: Nanos, cost: u32) -> (Decision, Duration, Receipt) {
        let generation = self.cell.generation();
        let (decision, charge) = self.cell.charge(&Booking(&self.gcra), now, cost);
        let delay = charge.as_ref().map_or(Duration::ZERO, |(c, _)| {
            self.gcra.ready_at(c).saturating_since(now).as_duration()
        });
        (
            decision,
            delay,
            Receipt::new(self.owner, 0, generation, charge),
        )
    }

    /// What [`charge_at`](Shaper::charge_at) would decide, writing nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Nanos, Policy, Shaper};
    /// let shaper = Shaper::with_clock(Policy::per_second(1)?, ManualClock::new());
    /// assert!(shaper.peek_at(Nanos::from_secs(3), 1).is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn peek_at(&self, now: Nanos, cost: u32) -> Decision {
        self.gcra.decide(self.cell.load(), now, cost).0
    }

    /// Gives back what the charge behind `receipt` still provably holds (GCRA's
    /// rule, see [`Algorithm::refund`]); a receipt of another limiter, or of a charge
    /// before a [`reset`](Shaper::reset) or a policy change, gives back nothing. The
    /// receipt of a reservation granted with no delay
    /// ([`Reservation::into_receipt`]) is a charge's receipt and is judged the same.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, Shaper};
    /// let shaper = Shaper::with_clock(Policy::per_second(1)?, ManualClock::new());
    /// let (_, receipt) = shaper.charge(1);
    /// assert!(shaper.refund(receipt));
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn refund(&self, receipt: Receipt) -> bool {
        refund_receipt(&self.cell, &self.gcra, self.owner, receipt, || {
            self.clock.now()
        })
    }

    /// Back to the fresh state: every slot handed out is forgotten, and outstanding
    /// reservations and receipts give back nothing when cancelled or refunded.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, Shaper};
    /// use std::time::Duration;
    /// let shaper = Shaper::with_clock(Policy::per_second(1)?.with_burst(1)?, ManualClock::new());
    /// let r = shaper.reserve(1, Duration::ZERO)?;
    /// shaper.reset();
    /// assert_eq!(shaper.cancel(r), 0);
    /// assert_eq!(shaper.reserve(1, Duration::ZERO)?.delay(), Duration::ZERO);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reset(&self) {
        self.cell.reset();
    }

    /// Replaces the policy, keeping the schedule (GCRA's
    /// [`carry_over`](Algorithm::carry_over)): slots already handed out stay, the new
    /// rate applies to reservations from now on. Outstanding reservations and
    /// receipts give back nothing afterwards (their arithmetic was in the old
    /// interval). Takes `&mut self`: no reservation runs on the old policy meanwhile.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, Shaper};
    /// use std::time::Duration;
    /// let mut shaper = Shaper::with_clock(Policy::per_second(10)?.with_burst(1)?, ManualClock::new());
    /// let _ = shaper.reserve(1, Duration::ZERO)?;
    /// shaper.set_policy(Policy::per_second(1)?.with_burst(1)?);
    /// // TAT stays at 100 ms; the next unit books a whole second after it.
    /// assert_eq!(shaper.reserve(1, Duration::from_secs(2))?.delay(), Duration::from_millis(100));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_policy(&mut self, policy: Policy) {
        let now = self.clock.now();
        let next = Gcra::new(policy);
        let previous = core::mem::replace(&mut self.gcra, next);
        self.cell
            .replace(|state| next.carry_over(&previous, state, now));
    }

    /// The policy.
    ///
    /// # Examples
    ///
    /// ```
    /// let shaper = floodgate::Shaper::new(floodgate::Policy::per_second(3)?);
    /// assert_eq!(shaper.policy().limit(), 3);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn policy(&self) -> Policy {
        self.gcra.policy()
    }

    /// The clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Clock, ManualClock, Nanos, Policy, Shaper};
    /// let shaper = Shaper::with_clock(Policy::per_second(3)?, ManualClock::new());
    /// assert_eq!(shaper.clock().now(), Nanos::ZERO);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The GCRA state (`TAT`: the end of the last reserved slot plus `τ`).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Nanos, Policy, Shaper};
    /// use std::time::Duration;
    /// let shaper = Shaper::with_clock(Policy::per_second(1)?, ManualClock::new());
    /// let _ = shaper.reserve(1, Duration::ZERO);
    /// assert_eq!(shaper.state().tat(), Nanos::from_secs(1));
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn state(&self) -> GcraState {
        self.cell.load()
    }
}

/// Cancels a pending reservation when an `until_ready` future is dropped early.
#[cfg(feature = "tokio")]
struct CancelOnDrop<'a, C: Clock, S: StateCell<GcraState>> {
    shaper: &'a Shaper<C, S>,
    reservation: Option<Reservation>,
}

#[cfg(feature = "tokio")]
impl<C: Clock, S: StateCell<GcraState>> Drop for CancelOnDrop<'_, C, S> {
    fn drop(&mut self) {
        if let Some(r) = self.reservation.take() {
            let _ = self.shaper.cancel(r);
        }
    }
}

impl<C: fmt::Debug, S: StateCell<GcraState>> fmt::Debug for Shaper<C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shaper")
            .field("gcra", &self.gcra)
            .field("clock", &self.clock)
            .field("state", &self.cell.load())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    const MS: u64 = 1_000_000;

    fn shaper(per_second: u64, burst: u64) -> Shaper<ManualClock> {
        let policy = Policy::per_second(per_second)
            .unwrap()
            .with_burst(burst)
            .unwrap();
        Shaper::with_clock(policy, ManualClock::starting_at(Nanos::from_secs(100)))
    }

    #[test]
    fn slots_follow_reservation_order() {
        let s = shaper(10, 1);
        let max = Duration::from_secs(1);
        let delays: Vec<u64> = (0..5)
            .map(|_| s.reserve(1, max).unwrap().delay().as_nanos() as u64)
            .collect();
        assert_eq!(delays, [0, 100 * MS, 200 * MS, 300 * MS, 400 * MS]);
        // With burst 3, a cost of 3 books 3 intervals: its slot is where its last unit
        // fits, TAT − τ = 6T − 3T.
        let s = shaper(10, 3);
        assert_eq!(s.reserve(3, max).unwrap().delay(), Duration::ZERO);
        let r = s.reserve(3, max).unwrap();
        assert_eq!(r.delay(), Duration::from_millis(300));
        assert_eq!(r.ready_at(), Nanos::new(100_000 * MS + 300 * MS));
    }

    #[test]
    fn too_long_is_denied_without_consuming() {
        let s = shaper(10, 1);
        let max = Duration::from_millis(250);
        for _ in 0..3 {
            let _ = s.reserve(1, max).unwrap();
        }
        let before = s.state();
        assert_eq!(
            s.reserve(1, max),
            Err(ShapeError::TooLong {
                retry_after: Duration::from_millis(50)
            })
        );
        assert_eq!(s.state(), before);
        s.clock().advance(Duration::from_millis(50));
        assert_eq!(s.reserve(1, max).unwrap().delay(), max);
        assert_eq!(
            s.reserve(2, Duration::MAX),
            Err(ShapeError::Never { cost: 2, burst: 1 })
        );
        // Cost 0 proceeds now and books nothing.
        let r = s.reserve(0, Duration::ZERO).unwrap();
        assert_eq!(r.delay(), Duration::ZERO);
        assert_eq!(s.cancel(r), 0);
    }

    #[test]
    fn cancel_keeps_later_reservations_spent() {
        // τ = 3T: a slot is TAT − 3T.
        let s = shaper(10, 3);
        let max = Duration::from_secs(1);
        let first = s.reserve(1, max).unwrap(); // TAT 1T, now
        let three = s.reserve(3, max).unwrap(); // TAT 4T, slot 1T
        let two = s.reserve(2, max).unwrap(); // TAT 6T, slot 3T
        assert_eq!(three.delay(), Duration::from_millis(100));
        assert_eq!(two.delay(), Duration::from_millis(300));
        assert_eq!(s.cancel(three), 1); // 2 reserved later: TAT 5T
        let one = s.reserve(1, max).unwrap(); // TAT 6T
        assert_eq!(one.delay(), Duration::from_millis(300));
        assert_eq!(s.cancel(one), 1); // the latest: all back, TAT 5T

        // Two cancellations came after `two`: `three`'s moved it down by T; `one`'s
        // was of the schedule's last reservation and moved nobody, so it is not
        // counted (`refund_moves_later`; before session 45 it was, and one unit stayed
        // spent). `two` ends at 5T with nothing above it: both units come back.
        assert_eq!(s.cancel(two), 2); // TAT 3T

        // The first slot was at the start: 1 ns later it has passed, no refund.
        s.clock().advance(Duration::from_nanos(1));
        assert_eq!(s.cancel(first), 0);
        assert_eq!(s.state().tat(), Nanos::new(100_000 * MS + 300 * MS));
    }

    /// A reservation from another shaper (a bigger one, one with the same policy, one
    /// dropped whose memory the next shaper reuses, the mutex twin's) gives back
    /// nothing and leaves the state alone: never wrong arithmetic, never a panic.
    #[test]
    fn a_foreign_reservation_gives_back_nothing() {
        fn foreign_cancels_do_nothing<S: StateCell<GcraState>>(
            make: impl Fn(Policy) -> Shaper<ManualClock, S>,
        ) {
            let max = Duration::from_secs(1);
            let small = Policy::per_second(10).unwrap().with_burst(1).unwrap();
            // T = 2 ns, B = u32::MAX: a reservation of u32::MAX units.
            let huge = Policy::new(u64::from(u32::MAX), Duration::from_secs(5)).unwrap();
            let slow = Policy::new(1, Duration::from_secs(3_600 * 24 * 365 * 100)).unwrap();

            let mut s = make(small);
            let _ = s.reserve(1, max).unwrap();
            let before = s.state();
            let big = make(huge).reserve(u32::MAX, max).unwrap();
            assert_eq!(s.cancel(big), 0);
            let twin = make(small).reserve(1, max).unwrap();
            assert_eq!(s.cancel(twin), 0);
            let long = make(slow).reserve(1, max).unwrap();
            assert_eq!(s.cancel(long), 0);
            assert_eq!(s.state(), before);

            // The same place in memory, a new shaper: the old reservation is not its.
            let at = core::ptr::addr_of!(s) as usize;
            let old = s.reserve(1, max).unwrap();
            s = make(small);
            assert_eq!(core::ptr::addr_of!(s) as usize, at);
            let _ = s.reserve(1, max).unwrap();
            let before = s.state();
            assert_eq!(s.cancel(old), 0);
            assert_eq!(s.state(), before);
            // Its own reservation still comes back.
            let own = s.reserve(1, max).unwrap();
            assert_eq!(s.cancel(own), 1);
            assert_eq!(s.state(), before);
        }
        let clock = ManualClock::starting_at(Nanos::from_secs(100));
        foreign_cancels_do_nothing(|p| Shaper::with_clock(p, clock.clone()));
        foreign_cancels_do_nothing(|p| Shaper::locked_with_clock(p, clock.clone()));
        // Across kinds: the twin's reservation is foreign to the lock-free shaper.
        let policy = Policy::per_second(10).unwrap().with_burst(1).unwrap();
        let atomic = Shaper::with_clock(policy, clock.clone());
        let locked = Shaper::locked_with_clock(policy, clock.clone());
        let r = locked.reserve(1, Duration::ZERO).unwrap();
        assert_eq!(atomic.cancel(r), 0);
        assert_eq!(atomic.state(), GcraState::default());
    }

    #[test]
    fn atomic_and_twin_agree() {
        let policy = Policy::per_second(10).unwrap().with_burst(2).unwrap();
        let clock = ManualClock::new();
        let a = Shaper::with_clock(policy, clock.clone());
        let l = Shaper::locked_with_clock(policy, clock.clone());
        for i in 0..50u32 {
            let max = Duration::from_millis(u64::from(i % 7) * 90);
            let (ra, rl) = (a.reserve(i % 3, max), l.reserve(i % 3, max));
            // The same slots; not equal reservations: each belongs to its own shaper.
            let slot = |r: &Reservation| (r.ready_at(), r.delay(), r.cost(), r.decision());
            assert_eq!(ra.as_ref().map(slot), rl.as_ref().map(slot));
            if i % 4 == 0 {
                if let (Ok(ra), Ok(rl)) = (ra, rl) {
                    assert_eq!(a.cancel(ra), l.cancel(rl));
                }
            }
            assert_eq!(a.state(), l.state());
            clock.advance(Duration::from_millis(u64::from(i % 5) * 30));
        }
    }
}
