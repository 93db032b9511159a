//! [`AsyncLimit`]: one limit behind an `async` call, so a layer (HTTP, gRPC) serves
//! in-process limiters and remote backends (Redis) alike.
//!
//! The trait names no runtime: the in-process limiters answer at once (their future is
//! ready on its first poll), a remote backend awaits its round trip. The error type
//! says whether a backend can fail; the in-process limiters use
//! [`Infallible`](core::convert::Infallible).

use core::any::Any;
use core::borrow::Borrow;
use core::convert::Infallible;
use core::fmt;
use core::future::{ready, Future};
use core::hash::Hash;

use crate::algorithm::Algorithm;
use crate::cell::StateCell;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::gcra::GcraState;
use crate::keyed::composite::Identified;
use crate::keyed::plans::{PlanAlgorithm, PlanId, PlanLimiter};
use crate::keyed::{HotKeyLimiter, KeyedLimiter, KeyedSlidingLog, Lookup, Storage};
use crate::lease::LeasedGcra;
use crate::limiter::RateLimiter;

/// A limit on keys of type `K` that answers through a future.
///
/// `check_n` decides `cost` units for `key` and consumes them if allowed; `peek_n`
/// answers exactly what `check_n` would, writing nothing. Both follow the
/// [`Decision`] contract: cost 0 reports the state and is always allowed, a cost above
/// the capacity is denied with `retry_after() == None`.
///
/// Implemented by [`KeyedLimiter`] and [`KeyedSlidingLog`] (per key), by
/// [`PlanLimiter`] (per key, under the key's plan), by [`RateLimiter`] (one limit for
/// every key: a global limit ignores the key), by the hot-key modes [`LeasedGcra`]
/// (one limit for every key) and [`HotKeyLimiter`] (per key), and by [`Identified`]
/// (a limit whose decisions carry a [`PolicyId`](crate::PolicyId)).
///
/// On the hot-key modes `peek_n` is the limiter's own `peek`
/// ([`LeasedGcra::peek`], [`HotKeyLimiter::peek`]), decision for decision: it
/// allows what `check_n` would on the calling thread's shard, and a denial, a cost
/// of 0 (the central word's report) and a cost above the burst report as
/// `check_n`'s. An allowed `remaining` is what the check would leave this thread:
/// its lease units less the cost, plus what the central word keeps after the part
/// of the cost the lease does not cover — a refill's view, which `check_n` reports
/// when it refills; a lease spend reports only the lease's units left (fast: no
/// shared read). (A cost-0 `peek_n` is the central word's report alone;
/// [`LeasedGcra::report`] and [`HotKeyLimiter::report`] add this thread's lease.)
///
/// # Examples
///
/// ```
/// use floodgate::{AsyncLimit, KeyedLimiter, Policy};
/// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     // The in-process futures are ready on their first poll.
/// #     let mut f = std::pin::pin!(f);
/// #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
/// #     match f.as_mut().poll(&mut cx) { std::task::Poll::Ready(v) => v, _ => unreachable!() }
/// # }
/// let per_ip: KeyedLimiter<u64> = KeyedLimiter::gcra(Policy::per_hour(1)?);
/// let d = block_on(AsyncLimit::check_n(&per_ip, &7, 1)).unwrap();
/// assert!(d.is_allowed());
/// let d = block_on(per_ip.peek_n(&7, 1)).unwrap();
/// assert!(!d.is_allowed());
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
pub trait AsyncLimit<K: ?Sized>: Send + Sync {
    /// Why a decision could not be made (a lost connection, a timeout); in-process
    /// limiters use [`Infallible`].
    type Error: core::fmt::Debug + core::fmt::Display + Send + Sync + 'static;

    /// Decides `cost` units for `key`, consuming them if allowed.
    fn check_n(
        &self,
        key: &K,
        cost: u32,
    ) -> impl Future<Output = Result<Decision, Self::Error>> + Send;

    /// Exactly what [`check_n`](AsyncLimit::check_n) would decide now; writes nothing.
    fn peek_n(
        &self,
        key: &K,
        cost: u32,
    ) -> impl Future<Output = Result<Decision, Self::Error>> + Send;

    /// [`check_n`](AsyncLimit::check_n), with an [`AsyncReceipt`] that
    /// [`refund`](AsyncLimit::refund) can give back.
    ///
    /// The default checks and returns an empty receipt ([`AsyncReceipt::none`]): a
    /// limit that cannot refund keeps every charge. A limit that can (a Redis
    /// limiter with refunds turned on) returns a charged receipt for an admission of
    /// cost ≥ 1; a denial or a cost of 0 took nothing and its receipt is empty.
    fn charge_n(
        &self,
        key: &K,
        cost: u32,
    ) -> impl Future<Output = Result<(Decision, AsyncReceipt), Self::Error>> + Send {
        let decided = self.check_n(key, cost);
        async move { decided.await.map(|d| (d, AsyncReceipt::none())) }
    }

    /// Gives back what the charge behind `receipt` (from
    /// [`charge_n`](AsyncLimit::charge_n) on the same `key`) still provably holds,
    /// under the rule of the in-process [`Receipt`](crate::Receipt) refunds: only the
    /// charge's own units, never another request's, at most once. Returns whether
    /// anything came back.
    ///
    /// The default gives back nothing (`Ok(false)`): a limit without refunds.
    ///
    /// # Errors
    ///
    /// Why the refund could not be made (a lost connection, a timeout); the charge
    /// may then still be held.
    fn refund(
        &self,
        key: &K,
        receipt: AsyncReceipt,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        let _ = (key, receipt);
        ready(Ok(false))
    }
}

/// Proof of one charge made by [`AsyncLimit::charge_n`], for
/// [`AsyncLimit::refund`]: opaque, its content the issuing limit's own.
///
/// A refund consumes its receipt (it is neither `Clone` nor `Copy`), so a charge is
/// given back at most once through it; a receipt another limit issued gives back
/// nothing there.
///
/// # Examples
///
/// ```
/// use floodgate::AsyncReceipt;
/// let empty = AsyncReceipt::none();
/// assert!(!empty.is_charged());
/// let charged = AsyncReceipt::new(7_u64);
/// assert!(charged.is_charged());
/// assert_eq!(charged.into_inner::<u64>(), Some(7));
/// ```
#[must_use = "a receipt that is dropped cannot refund its charge"]
pub struct AsyncReceipt {
    charge: Option<Box<dyn Any + Send + Sync>>,
}

impl AsyncReceipt {
    /// A receipt of nothing: a denial, a cost of 0, or a limit without refunds.
    pub fn none() -> AsyncReceipt {
        AsyncReceipt { charge: None }
    }

    /// A receipt holding `charge`, the issuing limit's own proof.
    pub fn new<T: Any + Send + Sync>(charge: T) -> AsyncReceipt {
        AsyncReceipt {
            charge: Some(Box::new(charge)),
        }
    }

    /// Whether the receipt holds a charge.
    pub fn is_charged(&self) -> bool {
        self.charge.is_some()
    }

    /// The proof, if it is a `T` (the issuing limit's type); `None` for an empty
    /// receipt or one of another type.
    pub fn into_inner<T: Any>(self) -> Option<T> {
        self.charge
            .and_then(|c| (c as Box<dyn Any>).downcast::<T>().ok())
            .map(|c| *c)
    }
}

impl fmt::Debug for AsyncReceipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncReceipt")
            .field("charged", &self.is_charged())
            .finish()
    }
}

/// The body of an in-process keyed limiter's [`AsyncLimit`]: its own `check_n` and
/// `peek`, answered at once.
macro_rules! ready_per_key {
    ($limiter:ident) => {
        type Error = Infallible;

        fn check_n(
            &self,
            key: &Q,
            cost: u32,
        ) -> impl Future<Output = Result<Decision, Infallible>> + Send {
            ready(Ok($limiter::check_n(self, key, cost)))
        }

        fn peek_n(
            &self,
            key: &Q,
            cost: u32,
        ) -> impl Future<Output = Result<Decision, Infallible>> + Send {
            ready(Ok($limiter::peek(self, key, cost)))
        }
    };
}

/// The body of an in-process limit for every key's [`AsyncLimit`]: its own `check_n`
/// and `peek`, the key ignored, answered at once.
macro_rules! ready_global {
    ($limiter:ident) => {
        type Error = Infallible;

        fn check_n(
            &self,
            _key: &K,
            cost: u32,
        ) -> impl Future<Output = Result<Decision, Infallible>> + Send {
            ready(Ok($limiter::check_n(self, cost)))
        }

        fn peek_n(
            &self,
            _key: &K,
            cost: u32,
        ) -> impl Future<Output = Result<Decision, Infallible>> + Send {
            ready(Ok($limiter::peek(self, cost)))
        }
    };
}

impl<K, Q, A, C, S> AsyncLimit<Q> for KeyedLimiter<K, A, C, S>
where
    K: Send + Sync + 'static,
    Q: Lookup<K> + ?Sized,
    A: Algorithm,
    C: Clock,
    S: Storage<K, A::State>,
{
    ready_per_key!(KeyedLimiter);
}

impl<K, Q, C> AsyncLimit<Q> for KeyedSlidingLog<K, C>
where
    K: Hash + Eq + Clone + Borrow<Q> + Send + Sync,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    C: Clock,
{
    ready_per_key!(KeyedSlidingLog);
}

/// Each key under its plan: the plan limiter's own `check_n` and `peek`.
///
/// # Examples
///
/// ```
/// use floodgate::keyed::plans::{PlanLimiter, Plans};
/// use floodgate::{AsyncLimit, KeyedBuilder, ManualClock};
/// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     let mut f = std::pin::pin!(f);
/// #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
/// #     match f.as_mut().poll(&mut cx) { std::task::Poll::Ready(v) => v, _ => unreachable!() }
/// # }
/// let plans = Plans::classic();
/// let (free, pro) = (plans.id("free").unwrap(), plans.id("pro").unwrap());
/// let resolver = move |key: &String| if key.starts_with("pro_") { pro } else { free };
/// let limiter = PlanLimiter::new(&plans, resolver, KeyedBuilder::default().clock(ManualClock::new()))?;
/// let d = block_on(AsyncLimit::check_n(&limiter, &"pro_1".to_owned(), 1)).unwrap();
/// assert_eq!((d.limit(), d.remaining()), (100, 99));
/// let d = block_on(AsyncLimit::peek_n(&limiter, &"anon".to_owned(), 11)).unwrap();
/// assert!(!d.is_allowed()); // the free plan's burst is 10
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
impl<K, Q, R, C, S, A> AsyncLimit<Q> for PlanLimiter<K, R, C, S, A>
where
    K: Send + Sync + 'static,
    Q: Lookup<K> + ?Sized,
    R: Fn(&Q) -> PlanId + Send + Sync,
    C: Clock,
    A: PlanAlgorithm,
    S: Storage<K, A::State>,
    Self: Send + Sync,
{
    ready_per_key!(PlanLimiter);
}

impl<K, A, C, S> AsyncLimit<K> for RateLimiter<A, C, S>
where
    K: ?Sized,
    A: Algorithm,
    C: Clock,
    S: StateCell<A::State>,
{
    ready_global!(RateLimiter);
}

/// One hot-key limit for every key (the key is ignored).
impl<K: ?Sized, C: Clock> AsyncLimit<K> for LeasedGcra<C>
where
    Self: Send + Sync,
{
    ready_global!(LeasedGcra);
}

impl<K, Q, C, S> AsyncLimit<Q> for HotKeyLimiter<K, C, S>
where
    K: Hash + Eq + Clone + Send + 'static,
    Q: Lookup<K> + ?Sized,
    C: Clock + Clone + 'static,
    S: Storage<K, GcraState>,
    Self: Send + Sync,
{
    ready_per_key!(HotKeyLimiter);
}

/// The wrapped limit's answer, labelled with the id.
impl<K, L> AsyncLimit<K> for Identified<L>
where
    K: ?Sized,
    L: AsyncLimit<K>,
{
    type Error = L::Error;

    fn check_n(
        &self,
        key: &K,
        cost: u32,
    ) -> impl Future<Output = Result<Decision, L::Error>> + Send {
        let (id, decided) = (self.id(), self.get_ref().check_n(key, cost));
        async move { decided.await.map(|d| d.with_policy(id)) }
    }

    fn peek_n(
        &self,
        key: &K,
        cost: u32,
    ) -> impl Future<Output = Result<Decision, L::Error>> + Send {
        let (id, decided) = (self.id(), self.get_ref().peek_n(key, cost));
        async move { decided.await.map(|d| d.with_policy(id)) }
    }

    fn charge_n(
        &self,
        key: &K,
        cost: u32,
    ) -> impl Future<Output = Result<(Decision, AsyncReceipt), L::Error>> + Send {
        let (id, charged) = (self.id(), self.get_ref().charge_n(key, cost));
        async move { charged.await.map(|(d, r)| (d.with_policy(id), r)) }
    }

    fn refund(
        &self,
        key: &K,
        receipt: AsyncReceipt,
    ) -> impl Future<Output = Result<bool, L::Error>> + Send {
        self.get_ref().refund(key, receipt)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::{ManualClock, Policy, PolicyId};
    use core::pin::pin;
    use core::task::{Context, Poll, Waker};

    /// The in-process futures are ready on their first poll.
    fn ready_now<F: Future>(f: F) -> F::Output {
        match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(v) => v,
            Poll::Pending => panic!("an in-process limit was not ready at once"),
        }
    }

    #[test]
    fn identified_labels_async_answers() {
        let policy = Policy::per_second(1).unwrap();
        // Inline storage: no epoch, so Miri's strict-provenance run covers it.
        let keyed = crate::KeyedBuilder::new(crate::Gcra::new(policy))
            .clock(ManualClock::new())
            .build_inline::<u64>()
            .unwrap();
        let id = PolicyId::new(9);
        let labelled = Identified::new(id, keyed);
        let d = ready_now(AsyncLimit::check_n(&labelled, &1, 1)).unwrap();
        assert_eq!((d.is_allowed(), d.policy()), (true, id));
        let d = ready_now(AsyncLimit::peek_n(&labelled, &1, 1)).unwrap();
        assert_eq!((d.is_allowed(), d.policy()), (false, id));
        let d = ready_now(AsyncLimit::check_n(labelled.get_ref(), &2, 1)).unwrap();
        assert_eq!(d.policy(), PolicyId::UNSET);
    }

    #[test]
    fn a_limit_without_refunds_charges_with_an_empty_receipt_and_gives_nothing_back() {
        let keyed = crate::KeyedBuilder::new(crate::Gcra::new(Policy::per_second(1).unwrap()))
            .clock(ManualClock::new())
            .build_inline::<u64>()
            .unwrap();
        let labelled = Identified::new(PolicyId::new(4), keyed);
        let (d, receipt) = ready_now(AsyncLimit::charge_n(&labelled, &1, 1)).unwrap();
        assert_eq!((d.is_allowed(), d.policy()), (true, PolicyId::new(4)));
        assert!(!receipt.is_charged());
        // The default refund keeps the charge: the key stays spent.
        assert!(!ready_now(AsyncLimit::refund(&labelled, &1, receipt)).unwrap());
        assert!(!ready_now(labelled.peek_n(&1, 1)).unwrap().is_allowed());
        // A receipt of another type is no proof here.
        assert_eq!(AsyncReceipt::new(1_u32).into_inner::<u64>(), None);
    }
}
