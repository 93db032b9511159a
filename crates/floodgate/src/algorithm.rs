//! The pure-transition contract: an [`Algorithm`] is a pure function from
//! `(state, now, cost)` to a [`Decision`] and the state to write (`None`: nothing to
//! write — a denial, a peek, cost 0). Its state is a `Copy` word of 8 bytes whose
//! all-zero value means "fresh". The drivers that run it on shared memory (the cells,
//! the keyed tables) live in the `cell` and `keyed` modules; this module knows
//! none of them.
//!
//! # Memory ordering (what the drivers promise the contract)
//!
//! The state word publishes nothing but itself, so loads are `Relaxed`: all
//! read-modify-writes of one location are totally ordered (its modification order),
//! and a CAS only succeeds against the latest value, so no update is lost. A `Relaxed`
//! load may return an older value; with it the transition either writes (and the CAS
//! then fails and retries with the current value) or denies. A denial from an older
//! state is still correct because every transition is monotone: a newer state is never
//! more permissive than an older one at the same `now`.
//!
//! A decision's CAS is `Release` and a refund loads and CASes with `Acquire`: a
//! refund that sees an admission happens after that admission's clock reading, so
//! its own reading (taken after the load) is no earlier — the premise of
//! [`Algorithm::refund`] (see `RefundLedger`). On x86 a locked CAS is a full barrier
//! either way.

use crate::clock::Nanos;
use crate::decision::Decision;

/// A rate-limiting algorithm as a pure transition over a packed 64-bit state.
///
/// The all-zero state (`bytemuck::Zeroable::zeroed()`) is the fresh state of a key
/// that has seen no traffic.
///
/// # Examples
///
/// ```
/// use floodgate::{Algorithm, Gcra, Nanos, Policy};
///
/// let gcra = Gcra::new(Policy::per_second(1)?);
/// let fresh = floodgate::GcraState::default();
/// let (decision, next) = gcra.decide(fresh, Nanos::from_secs(10), 1);
/// assert!(decision.is_allowed());
/// let (denied, nothing) = gcra.decide(next.unwrap(), Nanos::from_secs(10), 1);
/// assert!(!denied.is_allowed());
/// assert!(nothing.is_none()); // a denial writes nothing
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
pub trait Algorithm: Send + Sync {
    /// The packed state: 8 bytes of plain old data, zero = fresh.
    type State: bytemuck::Pod + PartialEq + core::fmt::Debug + Send + Sync;

    /// Decides a request of `cost` units at `now` against `state`.
    ///
    /// Returns the decision and the state to store, or `None` when nothing changes
    /// (a denial, cost 0). Must be pure, must not panic for any input, and must be
    /// monotone: a state it returns is never more permissive than `state`.
    fn decide(&self, state: Self::State, now: Nanos, cost: u32) -> (Decision, Option<Self::State>);

    /// Whether `state` at `now` is indistinguishable from a fresh state, so that
    /// forgetting it loses nothing.
    fn is_idle(&self, state: Self::State, now: Nanos) -> bool;

    /// Gives back what the admission recorded in `charge` still provably holds in
    /// `state`, judged at `now`: the state to store and how far the refund moves the
    /// bookings of later admissions (GCRA: the nanoseconds of schedule it gives back;
    /// the windows: 0, a count moves nobody), or `None` when nothing is given back
    /// (the default: the algorithm cannot refund).
    ///
    /// `shift` bounds how far refunds of *other* charges, made since this one, may
    /// have moved this charge's own booking down (the cells keep that ledger; a keyed
    /// shard counts only its key's refunds while its record of the latest ones
    /// reaches back to the charge, all of its refunds otherwise).
    ///
    /// The rule every implementation keeps: the state it returns is never more
    /// permissive than the state that the same sequence of *other* admissions would
    /// have produced had this charge never been made — it gives back only units that
    /// are still this charge's own, never another request's. Used by composite limits
    /// to undo a charge when another limit denies, and by the login pattern (charge
    /// first, refund on success). Must not panic for any input.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Algorithm, Charged, Gcra, GcraState, Nanos, Policy};
    /// let gcra = Gcra::new(Policy::per_second(1)?);
    /// let now = Nanos::from_secs(10);
    /// let before = GcraState::default();
    /// let (_, after) = gcra.decide(before, now, 1);
    /// let charge = Charged { before, after: after.unwrap(), at: now, cost: 1 };
    /// let (refunded, moved) = gcra.refund(charge.after, &charge, 0, now).unwrap();
    /// assert!(gcra.is_idle(refunded, now));
    /// assert_eq!(moved, 1_000_000_000); // one second of schedule given back
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    fn refund(
        &self,
        state: Self::State,
        charge: &Charged<Self::State>,
        shift: u64,
        now: Nanos,
    ) -> Option<(Self::State, u64)> {
        let _ = (state, charge, shift, now);
        None
    }

    /// Whether a [`refund`](Algorithm::refund) of `charge` on `state` (with the same
    /// `shift`) may move a booking made after the charge's: `false` only when nothing
    /// is booked after it (GCRA: the charge's booking, moved down by at most
    /// `shift`, still ends at the `TAT`). The cells leave a refund that moved nobody
    /// out of the shift of every later refund: it moved no booking then, and a
    /// booking made after it started from the schedule it left.
    ///
    /// The default, `true`, counts every refund (the conservative answer).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Algorithm, Charged, Gcra, GcraState, Nanos, Policy};
    /// let gcra = Gcra::new(Policy::per_second(1)?.with_burst(2)?);
    /// let t = Nanos::from_secs(10);
    /// let before = GcraState::default();
    /// let mid = gcra.decide(before, t, 1).1.unwrap(); // [10 s, 11 s)
    /// let after = gcra.decide(mid, t, 1).1.unwrap(); // [11 s, 12 s)
    /// let first = Charged { before, after: mid, at: t, cost: 1 };
    /// let second = Charged { before: mid, after, at: t, cost: 1 };
    /// assert!(gcra.refund_moves_later(after, &first, 0)); // the second is after it
    /// assert!(!gcra.refund_moves_later(after, &second, 0)); // nothing is
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    fn refund_moves_later(
        &self,
        state: Self::State,
        charge: &Charged<Self::State>,
        shift: u64,
    ) -> bool {
        let _ = (state, charge, shift);
        true
    }

    /// The state to keep when `self` replaces `previous` at runtime (a policy change),
    /// given the state `previous` left, read at `now`.
    ///
    /// The default keeps the state as it is — GCRA's rule: the new `T` applies from
    /// now on and `remaining` is clamped to `[0, B]`. The window algorithms start their
    /// windows fresh when the period changes, and otherwise carry the counts into
    /// their own packing.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Algorithm, FixedWindow, Nanos, Policy};
    /// let old = FixedWindow::new(Policy::per_minute(10)?)?;
    /// let new = FixedWindow::new(Policy::per_minute(1000)?)?;
    /// let now = Nanos::from_secs(90);
    /// let s = old.decide(Default::default(), now, 4).1.unwrap();
    /// // Same period: the 4 units stay counted in this minute.
    /// assert_eq!(new.decide(new.carry_over(&old, s, now), now, 0).0.remaining(), 996);
    /// // A new period starts fresh.
    /// let hourly = FixedWindow::new(Policy::per_hour(1000)?)?;
    /// assert_eq!(hourly.carry_over(&old, s, now), Default::default());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    fn carry_over(&self, previous: &Self, state: Self::State, now: Nanos) -> Self::State
    where
        Self: Sized,
    {
        let _ = (previous, now);
        state
    }

    /// Books `cost` units at the earliest instant they fit, however far ahead (first
    /// come, first served): the decision (denied only for "never") and the state to
    /// store; `None` when the algorithm cannot book ahead (the default: the window
    /// algorithms, which wait by checking again after `retry_after`).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Algorithm, Charged, FixedWindow, Gcra, Nanos, Policy};
    /// let gcra = Gcra::new(Policy::per_second(1)?);
    /// let now = Nanos::from_secs(10);
    /// let (_, full) = gcra.decide(Default::default(), now, 1);
    /// let (booked, after) = gcra.book(full.unwrap(), now, 1).unwrap();
    /// assert!(booked.is_allowed());
    /// let charge = Charged { before: full.unwrap(), after: after.unwrap(), at: now, cost: 1 };
    /// assert_eq!(gcra.ready_at(&charge), Nanos::from_secs(11));
    /// assert!(FixedWindow::new(Policy::per_second(1)?)?.book(Default::default(), now, 1).is_none());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    fn book(
        &self,
        state: Self::State,
        now: Nanos,
        cost: u32,
    ) -> Option<(Decision, Option<Self::State>)> {
        let _ = (state, now, cost);
        None
    }

    /// The instant the units of a [`book`](Algorithm::book)ing may be used (the
    /// default: the instant it was made).
    fn ready_at(&self, charge: &Charged<Self::State>) -> Nanos {
        charge.at
    }
}

/// What one admission wrote: the evidence a refund needs to give back only its own
/// units ([`Algorithm::refund`]).
///
/// # Examples
///
/// ```
/// use floodgate::{Algorithm, AtomicCell, Charged, FixedWindow, Nanos, Policy, StateCell};
/// let fw = FixedWindow::new(Policy::per_second(3)?)?;
/// let cell = AtomicCell::fresh();
/// let (decision, charge) = cell.charge(&fw, Nanos::from_secs(1), 2);
/// assert!(decision.is_allowed());
/// let (charge, _ledger): (Charged<_>, u64) = charge.unwrap();
/// assert_eq!((charge.cost, fw.count_of(charge.after)), (2, 2));
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Charged<S> {
    /// The state the admission replaced.
    pub before: S,
    /// The state it wrote.
    pub after: S,
    /// The clock reading it was decided at.
    pub at: Nanos,
    /// The units it took.
    pub cost: u32,
}
