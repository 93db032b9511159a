//! The pure-transition contract and the two cells that drive it.
//!
//! An [`Algorithm`] is a pure function from `(state, now, cost)` to a [`Decision`] and
//! the state to write (`None`: nothing to write — a denial, a peek, cost 0). Its state
//! is a `Copy` word of 8 bytes whose all-zero value means "fresh". Two drivers run any
//! algorithm:
//!
//! * [`AtomicCell`]: the state in one cache-padded atomic word, updated by a
//!   `compare_exchange_weak` loop — lock-free;
//! * [`LockedCell`]: the same transition under a `Mutex` — the mutex twin, the
//!   apples-to-apples baseline for benchmarks and an oracle for tests.
//!
//! # Memory ordering
//!
//! The state word publishes nothing but itself, so every access is `Relaxed`: all
//! read-modify-writes of one location are totally ordered (its modification order),
//! and a CAS only succeeds against the latest value, so no update is lost. A `Relaxed`
//! load may return an older value; with it the transition either writes (and the CAS
//! then fails and retries with the current value) or denies. A denial from an older
//! state is still correct because every transition is monotone: a newer state is never
//! more permissive than an older one at the same `now`.

use crossbeam_utils::{Backoff, CachePadded};

use crate::clock::Nanos;
use crate::decision::Decision;
use crate::sync::{lock, Atomic, Mutex, Ordering};

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
    /// `state`, judged at `now`; `None` when nothing is given back (the default: the
    /// algorithm cannot refund).
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
    /// let refunded = gcra.refund(charge.after, &charge, now).unwrap();
    /// assert!(gcra.is_idle(refunded, now));
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    fn refund(
        &self,
        state: Self::State,
        charge: &Charged<Self::State>,
        now: Nanos,
    ) -> Option<Self::State> {
        let _ = (state, charge, now);
        None
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
/// let charge: Charged<_> = charge.unwrap();
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

/// Runs one decision on an atomic word and returns what it wrote, if anything.
#[inline(always)]
pub(crate) fn charge_on<A: Algorithm + ?Sized>(
    algorithm: &A,
    word: &Atomic<A::State>,
    now: Nanos,
    cost: u32,
) -> (Decision, Option<Charged<A::State>>) {
    update_word(word, |before| {
        let (decision, next) = algorithm.decide(before, now, cost);
        let charge = next.map(|after| Charged {
            before,
            after,
            at: now,
            cost,
        });
        ((decision, charge), next)
    })
}

/// Runs one decision on an atomic word (see [`update_word`]).
///
/// One clock reading (`now`) serves every retry.
#[inline(always)]
pub(crate) fn decide_on<A: Algorithm + ?Sized>(
    algorithm: &A,
    word: &Atomic<A::State>,
    now: Nanos,
    cost: u32,
) -> Decision {
    update_word(word, |current| algorithm.decide(current, now, cost))
}

/// A word [`update_word`] can drive: a load and a weak compare-exchange.
pub(crate) trait CasWord {
    /// The value the word holds.
    type Value: Copy;
    /// Loads the current value.
    fn load_now(&self) -> Self::Value;
    /// One weak CAS; `Err` hands back the current value.
    fn cas_weak(&self, current: Self::Value, new: Self::Value) -> Result<Self::Value, Self::Value>;
}

impl<S: bytemuck::Pod> CasWord for Atomic<S> {
    type Value = S;

    #[inline(always)]
    fn load_now(&self) -> S {
        // Relaxed: see the module docs; the word publishes nothing but itself.
        self.load(Ordering::Relaxed)
    }

    #[inline(always)]
    fn cas_weak(&self, current: S, new: S) -> Result<S, S> {
        self.compare_exchange_weak(current, new, Ordering::Relaxed, Ordering::Relaxed)
    }
}

/// The crate's only `compare_exchange` loop: applies `step` to the word until the
/// state it wants written is written, or it wants nothing written.
///
/// `step` maps the current state to an outcome and the state to store (`None`:
/// nothing to write). A failed CAS hands back the current value, which the next round
/// reuses instead of reloading; `Backoff::spin` runs only after a failure, so the
/// uncontended path never spins. Every caller (decisions, the keyed tables'
/// retirement, refunds) goes through here.
#[inline(always)]
pub(crate) fn update_word<W, R>(word: &W, step: impl FnMut(W::Value) -> (R, Option<W::Value>)) -> R
where
    W: CasWord + ?Sized,
{
    update_word_from(word, word.load_now(), step)
}

/// [`update_word`] from a value of the word the caller has just loaded (a lookup that
/// read the word to find it saves the second load; a stale value only costs a failed
/// CAS, which hands back the current one).
#[inline(always)]
pub(crate) fn update_word_from<W, R>(
    word: &W,
    mut current: W::Value,
    mut step: impl FnMut(W::Value) -> (R, Option<W::Value>),
) -> R
where
    W: CasWord + ?Sized,
{
    let backoff = Backoff::new();
    loop {
        let (outcome, next) = step(current);
        let Some(next) = next else {
            return outcome;
        };
        match word.cas_weak(current, next) {
            Ok(_) => return outcome,
            Err(actual) => {
                current = actual;
                backoff.spin();
            }
        }
    }
}

/// Where a limiter keeps its state: an [`AtomicCell`] or its mutex twin [`LockedCell`].
///
/// # Examples
///
/// ```
/// use floodgate::{AtomicCell, Gcra, LockedCell, Nanos, Policy, StateCell};
///
/// let gcra = Gcra::new(Policy::per_second(1)?);
/// let a = AtomicCell::fresh();
/// let l = LockedCell::fresh();
/// let now = Nanos::from_secs(1);
/// assert_eq!(a.apply(&gcra, now, 1), l.apply(&gcra, now, 1));
/// assert_eq!(a.load(), l.load());
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
pub trait StateCell<S>: Send + Sync {
    /// A cell holding the fresh (all-zero) state.
    fn fresh() -> Self;
    /// The current state.
    fn load(&self) -> S;
    /// Overwrites the state (used when a policy changes or a test sets a state up).
    fn store(&self, state: S);
    /// Decides and, when the transition says so, writes the new state.
    fn apply<A: Algorithm<State = S>>(&self, algorithm: &A, now: Nanos, cost: u32) -> Decision;
    /// [`apply`](StateCell::apply), also returning what the admission wrote (`None`
    /// when it wrote nothing: a denial, cost 0), for a later [`refund`](StateCell::refund).
    fn charge<A: Algorithm<State = S>>(
        &self,
        algorithm: &A,
        now: Nanos,
        cost: u32,
    ) -> (Decision, Option<Charged<S>>);
    /// Gives back what `charge` still provably holds ([`Algorithm::refund`]), reading
    /// the instant from `now` after each load of the state (so the refund is judged
    /// no earlier than any admission it sees). Returns whether anything came back.
    fn refund<A: Algorithm<State = S>>(
        &self,
        algorithm: &A,
        charge: &Charged<S>,
        now: impl FnMut() -> Nanos,
    ) -> bool;
}

/// The lock-free cell: one cache-padded atomic word.
///
/// `CachePadded` keeps the word alone on its cache line (128 bytes on x86_64), so a
/// hot limiter never false-shares with its neighbours.
///
/// # Examples
///
/// ```
/// use floodgate::{AtomicCell, Gcra, Nanos, Policy, StateCell};
/// let gcra = Gcra::new(Policy::per_second(1)?);
/// let cell = AtomicCell::fresh();
/// assert!(cell.apply(&gcra, Nanos::ZERO, 1).is_allowed());
/// assert!(!cell.apply(&gcra, Nanos::ZERO, 1).is_allowed());
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
pub struct AtomicCell<S> {
    word: CachePadded<Atomic<S>>,
}

impl<S: bytemuck::Pod + Send + Sync> StateCell<S> for AtomicCell<S> {
    fn fresh() -> Self {
        AtomicCell {
            word: CachePadded::new(Atomic::new(bytemuck::Zeroable::zeroed())),
        }
    }

    #[inline]
    fn load(&self) -> S {
        self.word.load(Ordering::Relaxed)
    }

    fn store(&self, state: S) {
        self.word.store(state, Ordering::Relaxed);
    }

    #[inline(always)]
    fn apply<A: Algorithm<State = S>>(&self, algorithm: &A, now: Nanos, cost: u32) -> Decision {
        decide_on(algorithm, &self.word, now, cost)
    }

    #[inline]
    fn charge<A: Algorithm<State = S>>(
        &self,
        algorithm: &A,
        now: Nanos,
        cost: u32,
    ) -> (Decision, Option<Charged<S>>) {
        charge_on(algorithm, &self.word, now, cost)
    }

    fn refund<A: Algorithm<State = S>>(
        &self,
        algorithm: &A,
        charge: &Charged<S>,
        now: impl FnMut() -> Nanos,
    ) -> bool {
        refund_on(algorithm, &*self.word, charge, now)
    }
}

/// A refund on an atomic word: the clock is read after each load of the state, so
/// every admission the refund sees was decided at a reading no later than its own
/// (with a clock that is monotone across threads).
pub(crate) fn refund_on<A: Algorithm + ?Sized>(
    algorithm: &A,
    word: &Atomic<A::State>,
    charge: &Charged<A::State>,
    mut now: impl FnMut() -> Nanos,
) -> bool {
    update_word(word, |state| {
        let next = algorithm.refund(state, charge, now());
        (next.is_some(), next)
    })
}

impl<S: bytemuck::Pod + core::fmt::Debug + Send + Sync> core::fmt::Debug for AtomicCell<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_tuple("AtomicCell").field(&self.load()).finish()
    }
}

/// The mutex twin: the same transition behind a `std::sync::Mutex`.
///
/// # Examples
///
/// ```
/// use floodgate::{Gcra, LockedCell, Nanos, Policy, StateCell};
/// let gcra = Gcra::new(Policy::per_second(1)?);
/// let cell = LockedCell::fresh();
/// assert!(cell.apply(&gcra, Nanos::ZERO, 1).is_allowed());
/// assert!(!cell.apply(&gcra, Nanos::ZERO, 1).is_allowed());
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
pub struct LockedCell<S> {
    state: CachePadded<Mutex<S>>,
}

impl<S: bytemuck::Pod + Send + Sync> StateCell<S> for LockedCell<S> {
    fn fresh() -> Self {
        LockedCell {
            state: CachePadded::new(Mutex::new(bytemuck::Zeroable::zeroed())),
        }
    }

    fn load(&self) -> S {
        *lock(&self.state)
    }

    fn store(&self, state: S) {
        *lock(&self.state) = state;
    }

    #[inline]
    fn apply<A: Algorithm<State = S>>(&self, algorithm: &A, now: Nanos, cost: u32) -> Decision {
        self.charge(algorithm, now, cost).0
    }

    #[inline]
    fn charge<A: Algorithm<State = S>>(
        &self,
        algorithm: &A,
        now: Nanos,
        cost: u32,
    ) -> (Decision, Option<Charged<S>>) {
        let mut guard = lock(&self.state);
        let before = *guard;
        let (decision, next) = algorithm.decide(before, now, cost);
        let charge = next.map(|after| {
            *guard = after;
            Charged {
                before,
                after,
                at: now,
                cost,
            }
        });
        (decision, charge)
    }

    fn refund<A: Algorithm<State = S>>(
        &self,
        algorithm: &A,
        charge: &Charged<S>,
        mut now: impl FnMut() -> Nanos,
    ) -> bool {
        let mut guard = lock(&self.state);
        match algorithm.refund(*guard, charge, now()) {
            Some(next) => {
                *guard = next;
                true
            }
            None => false,
        }
    }
}

impl<S: bytemuck::Pod + core::fmt::Debug + Send + Sync> core::fmt::Debug for LockedCell<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_tuple("LockedCell").field(&self.load()).finish()
    }
}
