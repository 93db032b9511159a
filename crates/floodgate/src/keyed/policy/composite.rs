//! Composite limits: one request checked against several limits — global, per user,
//! per endpoint — as one decision.
//!
//! [`check_all`] charges the limits in order. If one denies, the ones already
//! charged are refunded ([`Algorithm::refund`]), the rest are only peeked, and the
//! most restrictive decision is returned: a denial with the longest `retry_after`
//! ("never" longest of all). If all admit, the admission with the least `remaining`
//! is returned.
//!
//! [`charge_all`] decides the same way and also returns the admission's receipts, one
//! per limit ([`CompositeReceipt`]), so that [`refund_all`] can give the whole
//! composite back later: the login pattern over several limits (charge per user and
//! per address before the password check, give both back when it was right — rather
//! than a [`reset`](KeyedLimiter::reset), which would also forgive an attacker's
//! failures whenever the owner logs in).
//!
//! # Consistency under concurrency
//!
//! Charges are taken one limit at a time, not atomically across limits. A request
//! racing with a composite that is later refunded may see that charge while it is
//! held (a *phantom* charge: it may be denied although, in hindsight, the composite
//! took nothing) — never the reverse. Each charge returns a [`Receipt`], and a refund
//! gives back only what the receipt proves is still that charge's own
//! ([`Algorithm::refund`]): after a refund, a limit's state
//! is never more permissive than the state that the other requests alone would have
//! produced, so no sequence of composites admits beyond any single limit.
//!
//! * GCRA gives back the part of the charge's booking the clock has not reached:
//!   all of it when the refund follows before the clock catches up (the usual case,
//!   microseconds later), nothing once the clock has passed it — and less or
//!   nothing when other refunds of the same limiter (of the same key, when keyed)
//!   that moved a later booking came between the charge and its refund: they may
//!   have moved its booking down (a refund of the last booking moved nobody and
//!   takes nothing). A keyed shard tells its keys' refunds apart while it has made
//!   at most 8 that moved a later booking since the charge; past that, every refund
//!   in the shard counts as the key's own (see [`KeyedLimiter::refund`]).
//! * A fixed or sliding window gives back the charged units while the state still
//!   holds the window they were counted in; once any request has moved it to a newer
//!   window, nothing.
//! * A keyed limit gives back nothing if the key's shard has removed any key since
//!   the charge: the entry may have been reclaimed or evicted and re-created, and
//!   the new entry never held the charge.
//!
//! Refunds read the clock after loading the state, so each is judged no earlier than
//! every admission it sees — exact with any clock that is monotone across threads
//! ([`ManualClock`](crate::ManualClock), [`StdClock`](crate::StdClock)); with the TSC
//! clock a GCRA refund can err by the cross-core skew (nanoseconds of booking).
//! Counters ([`KeyedMetrics`](crate::keyed::KeyedMetrics)) count a refunded admission as
//! allowed.
//!
//! ```
//! use floodgate::keyed::composite::{check_all, Limit};
//! use floodgate::{Gcra, KeyedBuilder, ManualClock, Policy, PolicyId, RateLimiter};
//!
//! let clock = ManualClock::new();
//! let global = RateLimiter::gcra_with_clock(Policy::per_second(1_000)?, clock.clone());
//! let per_user = KeyedBuilder::new(Gcra::new(Policy::per_minute(2)?)).clock(clock.clone()).build::<String>()?;
//! let per_endpoint = KeyedBuilder::new(Gcra::new(Policy::per_minute(100)?)).clock(clock.clone()).build::<&str>()?;
//!
//! // Ids say which rule decided: 1 global, 2 per user, 3 per endpoint.
//! let request = |user: &str| {
//!     check_all(
//!         &[
//!             &(&global).with_policy_id(PolicyId::new(1)),
//!             &per_user.limit(user).with_policy_id(PolicyId::new(2)),
//!             &per_endpoint.limit(&"/search").with_policy_id(PolicyId::new(3)),
//!         ],
//!         1,
//!     )
//! };
//! assert!(request("alice").is_allowed());
//! assert!(request("alice").is_allowed());
//! let third = request("alice");
//! assert!(!third.is_allowed());
//! assert_eq!(third.policy(), PolicyId::new(2)); // the per-user limit
//! // Nothing was charged for the denied request: the global and endpoint limits
//! // still show exactly two units taken.
//! assert_eq!(global.peek(0).remaining(), 998);
//! assert_eq!(per_endpoint.peek(&"/search", 0).remaining(), 98);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use core::borrow::Borrow;
use core::hash::Hash;

use super::plans::{PlanAlgorithm, PlanId, PlanLimiter};
use crate::algorithm::Algorithm;
use crate::cell::StateCell;
use crate::clock::{Clock, Nanos};
use crate::decision::{Decision, PolicyId};
use crate::gcra::{Gcra, GcraState};
use crate::keyed::key::Lookup;
use crate::keyed::log::KeyedSlidingLog;
use crate::keyed::storage::{Heap, Storage};
use crate::keyed::KeyedLimiter;
use crate::limiter::RateLimiter;
use crate::receipt::Receipt;
use crate::shaping::Shaper;
use crate::sliding_log::SlidingLog;

/// One limit a composite can charge and refund.
///
/// Implemented by [`RateLimiter`] (lock-free and its mutex twin), by
/// [`SlidingLog`], by [`Shaper`] and [`LockedShaper`](crate::LockedShaper) (a
/// charge is a plain GCRA check), by [`KeyedLimit`] (a keyed limiter and a key:
/// [`KeyedLimiter::limit`]), by [`PlanLimit`] ([`PlanLimiter::limit`]), by a
/// reference to any of them, and by [`Identified`] (any of them with a policy id:
/// [`with_policy_id`](Limit::with_policy_id)).
///
/// The provided methods are the check family every direct limiter shares:
/// `check`, `check_n`, `check_n_at`, `peek` and `charge`, each on this limit's own
/// clock.
///
/// # Examples
///
/// ```
/// use floodgate::keyed::composite::Limit;
/// use floodgate::{ManualClock, Policy, RateLimiter};
/// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(1)?, ManualClock::new());
/// let now = Limit::now(&limiter);
/// let (decision, receipt) = Limit::charge_at(&limiter, now, 1);
/// assert!(decision.is_allowed());
/// assert!(Limit::refund(&limiter, receipt));
/// assert!(limiter.check().is_allowed());
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
pub trait Limit {
    /// This limit's clock reading.
    fn now(&self) -> Nanos;
    /// Decides `cost` at `now`, consuming it if allowed, with the receipt a refund
    /// needs.
    fn charge_at(&self, now: Nanos, cost: u32) -> (Decision, Receipt);
    /// What `charge_at` would decide, writing nothing.
    fn peek_at(&self, now: Nanos, cost: u32) -> Decision;
    /// Gives back what the charge behind `receipt` still provably holds (see the
    /// [module docs](self)); returns whether anything came back.
    fn refund(&self, receipt: Receipt) -> bool;

    /// Decides `cost` at `now`, consuming it if allowed.
    fn check_n_at(&self, now: Nanos, cost: u32) -> Decision {
        self.charge_at(now, cost).0
    }

    /// Decides `cost` now, consuming it if allowed.
    fn check_n(&self, cost: u32) -> Decision {
        self.check_n_at(self.now(), cost)
    }

    /// Decides one unit now, consuming it if allowed.
    fn check(&self) -> Decision {
        self.check_n(1)
    }

    /// What `check_n(cost)` would decide now, writing nothing.
    fn peek(&self, cost: u32) -> Decision {
        self.peek_at(self.now(), cost)
    }

    /// Decides `cost` now with a receipt for [`refund`](Limit::refund).
    fn charge(&self, cost: u32) -> (Decision, Receipt) {
        self.charge_at(self.now(), cost)
    }

    /// Books `cost` units at the earliest instant they fit, however far ahead: the
    /// decision (denied only for "never"), the delay until then, and the receipt
    /// whose [`refund`](Limit::refund) cancels the booking. `None` (the default)
    /// when this limit cannot book ahead: a waiter then sleeps until `retry_after`
    /// and checks again ([`Wait`](crate::Wait)).
    fn book_at(&self, now: Nanos, cost: u32) -> Option<(Decision, core::time::Duration, Receipt)> {
        let _ = (now, cost);
        None
    }

    /// This limit with its every decision labelled `id` ([`Decision::policy`]), so
    /// a composite's answer says which limit gave it. Wrap a reference to keep the
    /// limiter: `(&limiter).with_policy_id(id)`.
    ///
    /// The limiter itself is unchanged: its own `check` pays nothing for ids.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::composite::Limit;
    /// use floodgate::{ManualClock, Policy, PolicyId, RateLimiter};
    /// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(1)?, ManualClock::new());
    /// let labelled = (&limiter).with_policy_id(PolicyId::new(4));
    /// assert_eq!(labelled.check().policy(), PolicyId::new(4));
    /// assert_eq!(labelled.peek(1).policy(), PolicyId::new(4));
    /// assert_eq!(limiter.peek(1).policy(), PolicyId::UNSET);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    fn with_policy_id(self, id: PolicyId) -> Identified<Self>
    where
        Self: Sized,
    {
        Identified::new(id, self)
    }
}

/// A borrowed limit is a limit: `check_all(&[&(&limiter).with_policy_id(id)], 1)`
/// keeps `limiter` with its owner.
impl<L: Limit + ?Sized> Limit for &L {
    fn now(&self) -> Nanos {
        (**self).now()
    }

    fn charge_at(&self, now: Nanos, cost: u32) -> (Decision, Receipt) {
        (**self).charge_at(now, cost)
    }

    fn peek_at(&self, now: Nanos, cost: u32) -> Decision {
        (**self).peek_at(now, cost)
    }

    fn refund(&self, receipt: Receipt) -> bool {
        (**self).refund(receipt)
    }

    fn book_at(&self, now: Nanos, cost: u32) -> Option<(Decision, core::time::Duration, Receipt)> {
        (**self).book_at(now, cost)
    }
}

/// A limit whose every decision carries a policy id: [`Limit::with_policy_id`].
///
/// Charges, peeks, refunds and bookings go to the wrapped limit unchanged; only the
/// returned decisions are labelled. It is an [`AsyncLimit`](crate::AsyncLimit) too
/// when the wrapped limit is one (a layer's rule, a remote backend).
///
/// # Examples
///
/// ```
/// use floodgate::keyed::composite::{check_all_indexed, Limit};
/// use floodgate::{Gcra, KeyedBuilder, ManualClock, Policy, PolicyId, RateLimiter};
/// let clock = ManualClock::new();
/// let global = RateLimiter::gcra_with_clock(Policy::per_second(100)?, clock.clone())
///     .with_policy_id(PolicyId::new(1));
/// let per_ip = KeyedBuilder::new(Gcra::new(Policy::per_second(1)?))
///     .clock(clock.clone())
///     .build::<u32>()?;
/// let request = |ip: u32| check_all_indexed(&[&global, &per_ip.limit(&ip).with_policy_id(PolicyId::new(2))], 1);
/// assert!(request(7).0.is_allowed());
/// let (denied, index) = request(7);
/// assert_eq!((denied.policy(), index), (PolicyId::new(2), Some(1)));
/// assert_eq!(global.get_ref().peek(0).remaining(), 99); // the global charge was refunded
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Identified<L> {
    id: PolicyId,
    limit: L,
}

impl<L> Identified<L> {
    /// `limit` with `id` on its every decision: the constructor for an
    /// [`AsyncLimit`](crate::AsyncLimit) that is not a [`Limit`] (a
    /// [`KeyedLimiter`] for all its keys, a remote backend).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::composite::Identified;
    /// use floodgate::{KeyedLimiter, Policy, PolicyId};
    /// let per_ip: KeyedLimiter<u64> = KeyedLimiter::gcra(Policy::per_second(1)?);
    /// let per_ip = Identified::new(PolicyId::new(2), per_ip);
    /// assert_eq!(per_ip.id(), PolicyId::new(2));
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn new(id: PolicyId, limit: L) -> Identified<L> {
        Identified { id, limit }
    }

    /// The id stamped on every decision.
    pub fn id(&self) -> PolicyId {
        self.id
    }

    /// The wrapped limit (its own methods answer without the id).
    pub fn get_ref(&self) -> &L {
        &self.limit
    }

    /// The wrapped limit, unwrapped.
    pub fn into_inner(self) -> L {
        self.limit
    }
}

impl<L: Limit> Limit for Identified<L> {
    fn now(&self) -> Nanos {
        self.limit.now()
    }

    fn charge_at(&self, now: Nanos, cost: u32) -> (Decision, Receipt) {
        let (decision, receipt) = self.limit.charge_at(now, cost);
        (decision.with_policy(self.id), receipt)
    }

    fn peek_at(&self, now: Nanos, cost: u32) -> Decision {
        self.limit.peek_at(now, cost).with_policy(self.id)
    }

    fn refund(&self, receipt: Receipt) -> bool {
        self.limit.refund(receipt)
    }

    fn book_at(&self, now: Nanos, cost: u32) -> Option<(Decision, core::time::Duration, Receipt)> {
        self.limit
            .book_at(now, cost)
            .map(|(decision, delay, receipt)| (decision.with_policy(self.id), delay, receipt))
    }
}

/// Checks `cost` against every limit as one decision: if any denies, none is
/// charged. See the [module docs](self) for the returned decision and consistency.
///
/// An empty list admits.
///
/// # Examples
///
/// ```
/// use floodgate::keyed::composite::check_all;
/// use floodgate::{ManualClock, Policy, RateLimiter};
/// let clock = ManualClock::new();
/// let a = RateLimiter::gcra_with_clock(Policy::per_second(5)?, clock.clone());
/// let b = RateLimiter::gcra_with_clock(Policy::per_second(1)?, clock.clone());
/// assert!(check_all(&[&a, &b], 1).is_allowed());
/// let denied = check_all(&[&a, &b], 1);
/// assert!(!denied.is_allowed());
/// assert_eq!(a.peek(0).remaining(), 4); // refunded
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
pub fn check_all(limits: &[&dyn Limit], cost: u32) -> Decision {
    check_all_indexed(limits, cost).0
}

/// [`check_all`], also saying which limit's decision it returns: its index in
/// `limits` (`None` for an empty list). On a denial that is the limit with the
/// longest wait (the one that denied, or a later one whose peek would wait longer);
/// on an admission the one with the least `remaining`. With ids on the limits
/// ([`Limit::with_policy_id`]) the decision's [`policy`](Decision::policy) says the
/// same.
///
/// # Examples
///
/// ```
/// use floodgate::keyed::composite::check_all_indexed;
/// use floodgate::{ManualClock, Policy, RateLimiter};
/// let clock = ManualClock::new();
/// let a = RateLimiter::gcra_with_clock(Policy::per_second(5)?, clock.clone());
/// let b = RateLimiter::gcra_with_clock(Policy::per_second(1)?, clock.clone());
/// let (admitted, tightest) = check_all_indexed(&[&a, &b], 1);
/// assert!(admitted.is_allowed());
/// assert_eq!(tightest, Some(1)); // b has nothing left
/// let (denied, by) = check_all_indexed(&[&a, &b], 1);
/// assert_eq!((denied.is_allowed(), by), (false, Some(1)));
/// assert_eq!(check_all_indexed(&[], 1).1, None);
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
pub fn check_all_indexed(limits: &[&dyn Limit], cost: u32) -> (Decision, Option<usize>) {
    let (decision, index, _receipts) = charge_all_indexed(limits, cost);
    (decision, index)
}

/// [`check_all`] with the receipts of an admission, so that [`refund_all`] can give
/// the whole composite back later — the login pattern over several limits: charge
/// per user **and** per address before the password check, give both back when it
/// was right.
///
/// All or nothing as [`check_all`]: a denial leaves no limit charged, and its
/// receipt holds nothing. An admission's receipt holds one [`Receipt`] per limit, in
/// the order of `limits`; each refund gives back at most that limit's own charge, by
/// the rules of the [module docs](self) (a keyed limit whose key was removed,
/// reclaimed or evicted since gives back nothing).
///
/// # Examples
///
/// ```
/// use floodgate::keyed::composite::{charge_all, refund_all, Limit};
/// use floodgate::{KeyedLimiter, ManualClock, Policy, PolicyId};
/// let clock = ManualClock::new();
/// let per_user: KeyedLimiter<String, _, _> = KeyedLimiter::gcra_with_clock(Policy::per_hour(5)?, clock.clone());
/// let per_ip: KeyedLimiter<u32, _, _> = KeyedLimiter::gcra_with_clock(Policy::per_hour(20)?, clock.clone());
///
/// let limits = [
///     &per_user.limit("alice").with_policy_id(PolicyId::new(1)) as &dyn Limit,
///     &per_ip.limit(&7).with_policy_id(PolicyId::new(2)),
/// ];
/// let (decision, receipt) = charge_all(&limits, 1);
/// assert!(decision.is_allowed());
/// // The password was right: both attempts come back.
/// assert_eq!(refund_all(&limits, receipt), 2);
/// assert_eq!(per_user.peek("alice", 0).remaining(), 5);
/// assert_eq!(per_ip.peek(&7, 0).remaining(), 20);
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
pub fn charge_all(limits: &[&dyn Limit], cost: u32) -> (Decision, CompositeReceipt) {
    let (decision, _, receipts) = charge_all_indexed(limits, cost);
    (decision, CompositeReceipt { receipts })
}

/// Gives back the composite charge behind `receipt` ([`charge_all`]): each receipt
/// to the limit at its place in `limits` — pass the same limits in the same order.
/// Returns how many limits gave something back.
///
/// Each limit gives back at most its own charge, by the rules of the
/// [module docs](self); a receipt handed to another limit (a different list or
/// order, another key) gives back nothing. The receipt is consumed: a composite is
/// given back at most once.
///
/// # Examples
///
/// ```
/// use floodgate::keyed::composite::{charge_all, refund_all};
/// use floodgate::{ManualClock, Policy, RateLimiter};
/// let clock = ManualClock::new();
/// let a = RateLimiter::gcra_with_clock(Policy::per_second(5)?, clock.clone());
/// let b = RateLimiter::gcra_with_clock(Policy::per_second(1)?, clock.clone());
/// let (admitted, receipt) = charge_all(&[&a, &b], 1);
/// assert!(admitted.is_allowed() && receipt.is_charged());
/// assert_eq!(refund_all(&[&b, &a], receipt), 0); // the wrong order gives nothing
/// let (denied, receipt) = charge_all(&[&a, &b], 1);
/// assert!(!denied.is_allowed() && !receipt.is_charged()); // already given back
/// assert_eq!(refund_all(&[&a, &b], receipt), 0);
/// assert_eq!(a.peek(0).remaining(), 4);
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
///
/// A refunded receipt is gone:
///
/// ```compile_fail,E0382
/// use floodgate::keyed::composite::{charge_all, refund_all};
/// use floodgate::{Policy, RateLimiter};
/// let a = RateLimiter::gcra(Policy::per_second(5).unwrap());
/// let (_, receipt) = charge_all(&[&a], 1);
/// refund_all(&[&a], receipt);
/// refund_all(&[&a], receipt);
/// ```
pub fn refund_all(limits: &[&dyn Limit], receipt: CompositeReceipt) -> usize {
    let mut receipts = receipt.receipts;
    limits
        .iter()
        .zip(receipts.drain())
        .map(|(limit, receipt)| limit.refund(receipt))
        .filter(|&back| back)
        .count()
}

/// What one composite charge took ([`charge_all`]), for [`refund_all`]: one
/// [`Receipt`] per limit of an admission, in the order of its list; nothing after a
/// denial (its charges were given back before it returned).
///
/// Neither `Clone` nor `Copy`: [`refund_all`] consumes it.
#[must_use = "a receipt that is dropped cannot refund its charge"]
#[derive(Debug, Default)]
pub struct CompositeReceipt {
    receipts: SmallReceipts,
}

impl CompositeReceipt {
    /// Whether any limit was charged (an admission of cost ≥ 1 by a limit that
    /// charges).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::composite::charge_all;
    /// use floodgate::{ManualClock, Policy, RateLimiter};
    /// let a = RateLimiter::gcra_with_clock(Policy::per_second(1)?, ManualClock::new());
    /// assert!(!charge_all(&[&a], 0).1.is_charged()); // cost 0 takes nothing
    /// assert!(charge_all(&[&a], 1).1.is_charged());
    /// assert!(!charge_all(&[&a], 1).1.is_charged()); // denied
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn is_charged(&self) -> bool {
        self.receipts.iter().any(Receipt::is_charged)
    }
}

/// The composite charge behind [`check_all_indexed`] and [`charge_all`]: the
/// decision, the index of the limit that gave it, and the receipts of an admission
/// (none after a denial: those taken were given back).
fn charge_all_indexed(
    limits: &[&dyn Limit],
    cost: u32,
) -> (Decision, Option<usize>, SmallReceipts) {
    // The receipts of the limits charged so far (a composite rarely has more than a
    // handful of limits: no allocation below 8).
    let mut receipts: SmallReceipts = SmallReceipts::default();
    // The decision to return and the index of the limit that gave it.
    let mut verdict: Option<(Decision, usize)> = None;
    for (i, limit) in limits.iter().enumerate() {
        let (decision, receipt) = limit.charge_at(limit.now(), cost);
        verdict = Some(match verdict {
            Some(v) => most_restrictive(v, (decision, i)),
            None => (decision, i),
        });
        if !decision.is_allowed() {
            // Undo what was taken, then learn the other limits' verdicts.
            for (taken, receipt) in limits[..i].iter().zip(receipts.drain()) {
                taken.refund(receipt);
            }
            for (j, rest) in limits.iter().enumerate().skip(i + 1) {
                let d = rest.peek_at(rest.now(), cost);
                verdict = verdict.map(|v| most_restrictive(v, (d, j)));
            }
            break;
        }
        receipts.push(receipt);
    }
    match verdict {
        Some((decision, i)) => (decision, Some(i), receipts),
        None => (
            Decision::new(true, 0, 0, Default::default(), None),
            None,
            receipts,
        ),
    }
}

/// Receipts inline up to 8, on the heap beyond.
#[derive(Debug, Default)]
struct SmallReceipts {
    inline: [Option<Receipt>; 8],
    len: usize,
    spill: Vec<Receipt>,
}

impl SmallReceipts {
    fn push(&mut self, receipt: Receipt) {
        match self.inline.get_mut(self.len) {
            Some(slot) => *slot = Some(receipt),
            None => self.spill.push(receipt),
        }
        self.len += 1;
    }

    /// The receipts in charge order, taken out.
    fn drain(&mut self) -> impl Iterator<Item = Receipt> + '_ {
        self.len = 0;
        self.inline
            .iter_mut()
            .filter_map(Option::take)
            .chain(self.spill.drain(..))
    }

    /// The receipts in charge order.
    fn iter(&self) -> impl Iterator<Item = &Receipt> {
        self.inline.iter().flatten().chain(&self.spill)
    }
}

/// The more restrictive of two decisions (each with its limit's index); the first on
/// a tie.
fn most_restrictive(a: (Decision, usize), b: (Decision, usize)) -> (Decision, usize) {
    match (a.0.is_allowed(), b.0.is_allowed()) {
        (true, false) => b,
        (false, true) => a,
        (false, false) => {
            // None ("never") is the longest wait.
            let wait = |d: &Decision| d.retry_after_nanos().unwrap_or(u64::MAX);
            if wait(&b.0) > wait(&a.0) {
                b
            } else {
                a
            }
        }
        (true, true) => {
            let key = |d: &Decision| (d.remaining(), core::cmp::Reverse(d.reset_after_nanos()));
            if key(&b.0) < key(&a.0) {
                b
            } else {
                a
            }
        }
    }
}

impl<A: Algorithm, C: Clock, S: StateCell<A::State>> Limit for RateLimiter<A, C, S> {
    fn now(&self) -> Nanos {
        self.clock().now()
    }

    fn charge_at(&self, now: Nanos, cost: u32) -> (Decision, Receipt) {
        RateLimiter::charge_at(self, now, cost)
    }

    fn peek_at(&self, now: Nanos, cost: u32) -> Decision {
        RateLimiter::peek_at(self, now, cost)
    }

    fn refund(&self, receipt: Receipt) -> bool {
        RateLimiter::refund(self, receipt)
    }

    fn book_at(&self, now: Nanos, cost: u32) -> Option<(Decision, core::time::Duration, Receipt)> {
        RateLimiter::book_at(self, now, cost)
    }
}

impl<C: Clock> Limit for SlidingLog<C> {
    fn now(&self) -> Nanos {
        self.clock().now()
    }

    fn charge_at(&self, now: Nanos, cost: u32) -> (Decision, Receipt) {
        SlidingLog::charge_at(self, now, cost)
    }

    fn peek_at(&self, now: Nanos, cost: u32) -> Decision {
        SlidingLog::peek_at(self, now, cost)
    }

    fn refund(&self, receipt: Receipt) -> bool {
        SlidingLog::refund(self, receipt)
    }
}

impl<C: Clock, S: StateCell<GcraState>> Limit for Shaper<C, S> {
    fn now(&self) -> Nanos {
        self.clock().now()
    }

    fn charge_at(&self, now: Nanos, cost: u32) -> (Decision, Receipt) {
        Shaper::charge_at(self, now, cost)
    }

    fn peek_at(&self, now: Nanos, cost: u32) -> Decision {
        Shaper::peek_at(self, now, cost)
    }

    fn refund(&self, receipt: Receipt) -> bool {
        Shaper::refund(self, receipt)
    }

    fn book_at(&self, now: Nanos, cost: u32) -> Option<(Decision, core::time::Duration, Receipt)> {
        Some(Shaper::book_at(self, now, cost))
    }
}

/// A [`KeyedLimiter`] and one key, as a [`Limit`].
///
/// # Examples
///
/// ```
/// use floodgate::keyed::composite::Limit;
/// use floodgate::{KeyedLimiter, Policy};
/// let keyed: KeyedLimiter<u64> = KeyedLimiter::gcra(Policy::per_second(1)?);
/// let limit = keyed.limit(&7);
/// assert!(limit.charge_at(limit.now(), 1).0.is_allowed());
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
pub struct KeyedLimit<'a, K, Q, A, C, S = Heap>
where
    Q: ?Sized,
    A: Algorithm,
    S: Storage<K, A::State>,
{
    limiter: &'a KeyedLimiter<K, A, C, S>,
    key: &'a Q,
}

impl<K, A, C, S> KeyedLimiter<K, A, C, S>
where
    A: Algorithm,
    C: Clock,
    S: Storage<K, A::State>,
{
    /// This limiter for one key, as a composite [`Limit`].
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::composite::check_all;
    /// use floodgate::{KeyedLimiter, Policy};
    /// let keyed: KeyedLimiter<String> = KeyedLimiter::gcra(Policy::per_second(1)?);
    /// assert!(check_all(&[&keyed.limit("alice")], 1).is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn limit<'a, Q>(&'a self, key: &'a Q) -> KeyedLimit<'a, K, Q, A, C, S>
    where
        Q: Lookup<K> + ?Sized,
    {
        KeyedLimit { limiter: self, key }
    }
}

impl<K, Q, A, C, S> Limit for KeyedLimit<'_, K, Q, A, C, S>
where
    Q: Lookup<K> + ?Sized,
    A: Algorithm,
    C: Clock,
    S: Storage<K, A::State>,
{
    fn now(&self) -> Nanos {
        self.limiter.clock().now()
    }

    fn charge_at(&self, now: Nanos, cost: u32) -> (Decision, Receipt) {
        self.limiter.charge_at(self.key, now, cost)
    }

    fn peek_at(&self, now: Nanos, cost: u32) -> Decision {
        self.limiter.peek_at(self.key, now, cost)
    }

    fn refund(&self, receipt: Receipt) -> bool {
        self.limiter.refund(self.key, receipt)
    }

    fn book_at(&self, now: Nanos, cost: u32) -> Option<(Decision, core::time::Duration, Receipt)> {
        self.limiter.book_at(self.key, now, cost)
    }
}

/// A [`PlanLimiter`] and one key, as a [`Limit`].
///
/// # Examples
///
/// ```
/// use floodgate::keyed::composite::check_all;
/// use floodgate::keyed::plans::{PlanLimiter, Plans};
/// use floodgate::KeyedBuilder;
/// let plans = Plans::classic();
/// let free = plans.id("free").unwrap();
/// let limiter = PlanLimiter::new(&plans, move |_: &u64| free, KeyedBuilder::default())?;
/// assert_eq!(check_all(&[&limiter.limit(&1)], 10).remaining(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct PlanLimit<'a, K, Q, R, C, S = Heap, A = Gcra>
where
    Q: ?Sized,
    A: PlanAlgorithm,
    S: Storage<K, A::State>,
{
    limiter: &'a PlanLimiter<K, R, C, S, A>,
    key: &'a Q,
}

impl<K, R, C, S, A> PlanLimiter<K, R, C, S, A>
where
    C: Clock,
    A: PlanAlgorithm,
    S: Storage<K, A::State>,
{
    /// This limiter for one key, as a composite [`Limit`].
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::composite::Limit;
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::KeyedBuilder;
    /// let plans = Plans::classic();
    /// let pro = plans.id("pro").unwrap();
    /// let limiter = PlanLimiter::new(&plans, move |_: &u64| pro, KeyedBuilder::default())?;
    /// let limit = limiter.limit(&1);
    /// assert_eq!(limit.charge_at(limit.now(), 1).0.limit(), 100);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn limit<'a, Q>(&'a self, key: &'a Q) -> PlanLimit<'a, K, Q, R, C, S, A>
    where
        Q: Lookup<K> + ?Sized,
        R: Fn(&Q) -> PlanId,
    {
        PlanLimit { limiter: self, key }
    }
}

impl<K, Q, R, C, S, A> Limit for PlanLimit<'_, K, Q, R, C, S, A>
where
    Q: Lookup<K> + ?Sized,
    R: Fn(&Q) -> PlanId,
    C: Clock,
    A: PlanAlgorithm,
    S: Storage<K, A::State>,
{
    fn now(&self) -> Nanos {
        self.limiter.clock().now()
    }

    fn charge_at(&self, now: Nanos, cost: u32) -> (Decision, Receipt) {
        self.limiter.charge_at(self.key, now, cost)
    }

    fn peek_at(&self, now: Nanos, cost: u32) -> Decision {
        self.limiter.peek_at(self.key, now, cost)
    }

    fn refund(&self, receipt: Receipt) -> bool {
        self.limiter.refund(self.key, receipt)
    }
}

/// A [`KeyedSlidingLog`] and one key, as a [`Limit`].
///
/// # Examples
///
/// ```
/// use floodgate::{check_all, KeyedBuilder, ManualClock, Policy, RateLimiter};
/// let clock = ManualClock::new();
/// let global = RateLimiter::gcra_with_clock(Policy::per_second(100)?, clock.clone());
/// let per_user = KeyedBuilder::default().clock(clock).sliding_log::<String>(Policy::per_second(2)?)?;
/// assert!(check_all(&[&global, &per_user.limit("alice")], 2).is_allowed());
/// // alice's log is full: the global limit is not charged either.
/// assert!(!check_all(&[&global, &per_user.limit("alice")], 1).is_allowed());
/// assert_eq!(global.peek(0).remaining(), 98);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct KeyedLogLimit<'a, K, Q: ?Sized, C> {
    log: &'a KeyedSlidingLog<K, C>,
    key: &'a Q,
}

impl<K, C> KeyedSlidingLog<K, C>
where
    K: Hash + Eq + Clone,
    C: Clock,
{
    /// This log for one key, as a composite [`Limit`].
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedBuilder, Limit, ManualClock, Policy};
    /// let log = KeyedBuilder::default().clock(ManualClock::new()).sliding_log::<u64>(Policy::per_second(3)?)?;
    /// assert_eq!(log.limit(&7).check_n(2).remaining(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn limit<'a, Q>(&'a self, key: &'a Q) -> KeyedLogLimit<'a, K, Q, C>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        KeyedLogLimit { log: self, key }
    }
}

impl<K, Q, C> Limit for KeyedLogLimit<'_, K, Q, C>
where
    K: Hash + Eq + Clone + Borrow<Q>,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    C: Clock,
{
    fn now(&self) -> Nanos {
        self.log.clock().now()
    }

    fn charge_at(&self, now: Nanos, cost: u32) -> (Decision, Receipt) {
        self.log.charge_at(self.key, now, cost)
    }

    fn peek_at(&self, now: Nanos, cost: u32) -> Decision {
        self.log.peek_at(self.key, now, cost)
    }

    fn refund(&self, receipt: Receipt) -> bool {
        self.log.refund(self.key, receipt)
    }
}
