//! The tower [`Layer`] and [`Service`]: rules, strategies, headers and counters.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use crossbeam_utils::CachePadded;
use floodgate::keyed::plans::{PlanAlgorithm, PlanId, PlanLimiter};
use floodgate::{
    Algorithm, AsyncLimit, AsyncReceipt, Clock, Decision, Gcra, GcraState, HotKeyLimiter,
    KeyedLimiter, KeyedSlidingLog, LeasedGcra, Lookup, Nanos, Policy, RateLimiter, Receipt,
    StateCell, Storage,
};
use http::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use tower::{Layer, Service};

use crate::body::RateLimitBody;
use crate::error::ConfigError;
use crate::extract::{KeyError, KeyExtractor};
use crate::headers::{
    duration_window_secs, window_secs, write_limit_member, write_name_member, write_policy_member,
    Field, LimitItem, PartitionKeyHasher, PolicyItem, PolicyName, ResetFormat, ResponseFields,
};
use crate::stats::{Count, Counters, RuleStats};

/// What a rule does when it would deny a request.
///
/// Soft and shadow rules never block a request for any reason: a request without
/// the rule's key ([`OnMissingKey::Reject`]) or whose limiter fails
/// ([`OnLimiterError::FailClosed`]) skips the rule, counted in `bad_key` or `errors`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Strategy {
    /// Reject it: 429 with `Retry-After` (or the never-fits status). The default.
    #[default]
    Hard,
    /// Let it through, marked with `X-RateLimit-Exceeded: "<rule>"`, and count it.
    /// The rule shows in the header families too, unless
    /// [`HeaderOptions::include_soft`] is `false`.
    Soft,
    /// Dry run: decide and count, never block, and leave the headers alone unless
    /// [`HeaderOptions::include_shadow`] is set.
    Shadow,
}

/// What a rule does when its extractor finds no usable key.
///
/// The fallback key has the extractor's key type, so it is a key of the rule's own
/// limiter:
///
/// ```
/// use floodgate::{KeyedLimiter, Policy};
/// use floodgate_http::{OnMissingKey, PeerIp, Rule};
/// use std::net::{IpAddr, Ipv4Addr};
/// let limiter: KeyedLimiter<IpAddr> = KeyedLimiter::gcra(Policy::per_second(1)?);
/// let rule = Rule::new("r", limiter, PeerIp::new())?
///     .on_missing_key(OnMissingKey::Fallback(IpAddr::V4(Ipv4Addr::UNSPECIFIED)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A fallback key of another type is refused at compile time:
///
/// ```compile_fail
/// use floodgate::{KeyedLimiter, Policy};
/// use floodgate_http::{OnMissingKey, PeerIp, Rule};
/// use std::net::IpAddr;
/// let limiter: KeyedLimiter<IpAddr> = KeyedLimiter::gcra(Policy::per_second(1)?);
/// let rule = Rule::new("r", limiter, PeerIp::new())?
///     .on_missing_key(OnMissingKey::Fallback(String::from("anonymous")));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnMissingKey<K> {
    /// Answer `400 Bad Request` saying which key is missing or malformed (a hard
    /// rule; a soft or shadow rule is skipped). The default.
    Reject,
    /// Count the request against this one shared bucket (and in `bad_key`).
    Fallback(K),
}

/// What the layer does when a limiter fails (a backend error).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnLimiterError {
    /// Answer `503 Service Unavailable` (a hard rule; a soft or shadow rule is
    /// skipped). The default: a failing hard limiter admits nothing.
    #[default]
    FailClosed,
    /// Skip the rule for this request, as if it had admitted.
    FailOpen,
}

/// An in-process limiter that charges with a [`Receipt`] and can give back what the
/// charge took, so a request denied by a later rule is charged nowhere (see
/// [`RateLimitLayer`], "How rules combine"); after the refund its headers show the
/// limiter as it then is ([`peek`](Charge::peek)).
///
/// Implemented for the in-process limiters: [`KeyedLimiter`] (per key, on every
/// storage), [`KeyedSlidingLog`] (the exact log per key), [`PlanLimiter`] (per key,
/// under the key's plan), [`RateLimiter`] (one limit for every key), and the
/// hot-key modes [`LeasedGcra`] (one limit for every key, on per-core leases) and
/// [`HotKeyLimiter`] (per key, hot keys on leases). A refund gives back only what the
/// receipt proves is still the charge's own (see `floodgate::Algorithm::refund`; on
/// a lease, see [`LeasedGcra::refund`]). A
/// remote backend is used with [`Rule::remote`] (its refunds, if any, are
/// [`AsyncLimit::refund`]'s).
///
/// # Examples
///
/// ```
/// use floodgate::{ManualClock, Policy, RateLimiter};
/// use floodgate_http::Charge;
/// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(1)?, ManualClock::new());
/// let (decision, receipt) = Charge::<()>::charge(&limiter, &(), 1);
/// assert!(decision.is_allowed());
/// assert!(Charge::<()>::refund(&limiter, &(), receipt));
/// assert_eq!(Charge::<()>::peek(&limiter, &(), 0).remaining(), 1);
/// assert!(limiter.check().is_allowed());
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
pub trait Charge<K: ?Sized> {
    /// Decides `cost` units for `key`, consuming them if allowed, with the receipt a
    /// refund needs.
    fn charge(&self, key: &K, cost: u32) -> (Decision, Receipt);
    /// Gives back what the charge behind `receipt` still provably holds; returns
    /// whether anything came back.
    fn refund(&self, key: &K, receipt: Receipt) -> bool;
    /// What a charge of `cost` units for `key` would decide now, writing nothing
    /// (cost 0 reports the state).
    fn peek(&self, key: &K, cost: u32) -> Decision;

    /// The window `w` to advertise for `key` in `RateLimit-Policy`, in whole seconds,
    /// when the limiter's policy differs per key: a [`PlanLimiter`]'s is its key's
    /// plan's — the GCRA window ([`window_secs`]) on a GCRA plan, the period on a
    /// fixed or sliding window plan. `None` (the default): the rule's
    /// configured window ([`Rule::window`], [`Rule::window_of`]), if any, stands.
    ///
    /// The layer does not call this on its own: it learns the window from the
    /// charge ([`charge_with_window`](Charge::charge_with_window)) and from the
    /// refund ([`refund_and_peek`](Charge::refund_and_peek)), whose defaults call
    /// it. Asked separately, a [`PlanLimiter`] runs its resolver again, which may
    /// answer another plan than the one that charged.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::{KeyedBuilder, KeyedLimiter, Policy};
    /// use floodgate_http::Charge;
    /// let plans = Plans::classic();
    /// let (free, pro) = (plans.id("free").unwrap(), plans.id("pro").unwrap());
    /// let resolver = move |key: &str| if key.starts_with("pro_") { pro } else { free };
    /// let per_key = PlanLimiter::<String, _>::new(&plans, resolver, KeyedBuilder::default())?;
    /// // pro: 10 000 a day, burst 100: 100 × 8.64 s; free: 100 a day, burst 10.
    /// assert_eq!(Charge::<str>::window_secs(&per_key, "pro_1"), Some(864));
    /// assert_eq!(Charge::<str>::window_secs(&per_key, "x"), Some(8_640));
    /// let per_ip: KeyedLimiter<u64> = KeyedLimiter::gcra(Policy::per_second(5)?);
    /// assert_eq!(Charge::<u64>::window_secs(&per_ip, &7), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn window_secs(&self, key: &K) -> Option<u64> {
        let _ = key;
        None
    }

    /// [`charge`](Charge::charge), with the window `w` to advertise for this charge
    /// ([`window_secs`](Charge::window_secs)): what the layer calls, once per request.
    /// The default charges, then asks `window_secs`. A [`PlanLimiter`] answers both
    /// from one run of its resolver: the window is that of the plan that charged
    /// ([`PlanLimiter::charge_plan`]), even when the resolver answers another plan a
    /// moment later (an upgrade mid-request).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::KeyedBuilder;
    /// use floodgate_http::Charge;
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// let plans = Plans::classic();
    /// let (free, pro) = (plans.id("free").unwrap(), plans.id("pro").unwrap());
    /// let calls = AtomicU32::new(0);
    /// let resolver = |_: &str| if calls.fetch_add(1, Ordering::Relaxed) % 2 == 0 { free } else { pro };
    /// let per_key = PlanLimiter::<String, _>::new(&plans, resolver, KeyedBuilder::default())?;
    /// let (decision, _receipt, window) = Charge::<str>::charge_with_window(&per_key, "k", 1);
    /// assert_eq!(calls.load(Ordering::Relaxed), 1);
    /// // free: burst 10 over 8 640 s.
    /// assert_eq!((decision.limit(), window), (10, Some(8_640)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn charge_with_window(&self, key: &K, cost: u32) -> (Decision, Receipt, Option<u64>) {
        let (decision, receipt) = self.charge(key, cost);
        (decision, receipt, self.window_secs(key))
    }

    /// Gives back what the charge behind `receipt` still provably holds
    /// ([`refund`](Charge::refund)), then reports where that charge was taken as it
    /// now is ([`peek`](Charge::peek) at cost 0) with the window `w` to advertise
    /// with it: what the layer shows for a rule whose charge it gave back. The
    /// default refunds, peeks and asks [`window_secs`](Charge::window_secs). A
    /// [`PlanLimiter`] gives back and peeks in the plan whose table issued the
    /// receipt, under that plan's policy as it now is, without running its resolver
    /// ([`PlanLimiter::receipt_plan`]); only a receipt no table of it issued (another
    /// limiter's, or one voided by [`PlanLimiter::set_policy_mut`], which the layer
    /// never holds) gives back nothing and shows the plan the resolver answers now.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, RateLimiter};
    /// use floodgate_http::Charge;
    /// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(1)?, ManualClock::new());
    /// let (_, receipt) = Charge::<()>::charge(&limiter, &(), 1);
    /// let (after, window) = Charge::<()>::refund_and_peek(&limiter, &(), receipt);
    /// assert_eq!((after.remaining(), window), (1, None));
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    fn refund_and_peek(&self, key: &K, receipt: Receipt) -> (Decision, Option<u64>) {
        let _ = self.refund(key, receipt);
        (self.peek(key, 0), self.window_secs(key))
    }

    /// What a charge of `cost` for `key` would decide now, and the state (a peek at
    /// cost 0) with the window `w` to advertise beside it, writing nothing: what the
    /// layer asks of a hard rule after the one that denied a request (see
    /// [`RateLimitLayer`], "How rules combine"). The default peeks twice and asks
    /// [`window_secs`](Charge::window_secs). A [`PlanLimiter`] answers all three
    /// from one run of its resolver, under that plan.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, RateLimiter};
    /// use floodgate_http::Charge;
    /// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(1)?, ManualClock::new());
    /// assert!(limiter.check().is_allowed());
    /// let (at_cost, state, window) = Charge::<()>::peek_with_window(&limiter, &(), 1);
    /// assert!(!at_cost.is_allowed());
    /// assert_eq!((state.remaining(), window), (0, None));
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    fn peek_with_window(&self, key: &K, cost: u32) -> (Decision, Decision, Option<u64>) {
        (
            self.peek(key, cost),
            self.peek(key, 0),
            self.window_secs(key),
        )
    }

    /// When a charge of `cost` units can never be admitted, for any key, under the
    /// limiter's policy as it is now: the most units it admits at once (a GCRA burst,
    /// a window's or a log's limit). `None` when `cost` fits a key that has spent
    /// nothing, when it is within that capacity (a clock reading so late that no
    /// schedule can be written is not the configuration's fault), or when the
    /// limiter cannot tell without a key (the default).
    ///
    /// [`RateLimitLayerBuilder::build`] refuses a rule whose cost never fits
    /// ([`ConfigError::Cost`]): it could only ever answer the never-fits status. A
    /// [`PlanLimiter`]'s policy is its key's plan's: it answers when no plan can
    /// admit `cost` (with the largest capacity among them), and
    /// [`never_fits_plan`](Charge::never_fits_plan) names that plan.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedLimiter, Policy, RateLimiter};
    /// use floodgate_http::Charge;
    /// let global = RateLimiter::gcra(Policy::per_second(10)?.with_burst(5)?);
    /// assert_eq!(Charge::<()>::never_fits(&global, 5), None);
    /// assert_eq!(Charge::<()>::never_fits(&global, 6), Some(5));
    /// let per_ip: KeyedLimiter<u64> = KeyedLimiter::gcra(Policy::per_minute(3)?);
    /// assert_eq!(Charge::<u64>::never_fits(&per_ip, 4), Some(3));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn never_fits(&self, cost: u32) -> Option<u64> {
        let _ = cost;
        None
    }

    /// For a limiter whose policy is its key's plan's ([`PlanLimiter`]), when no
    /// plan admits a charge of `cost` units (a fresh key of every plan would be
    /// refused it), under the plans' policies as they are now: the name of the plan
    /// that comes closest (the largest capacity, the first in plan order among
    /// equals) and the most units it admits at once (its GCRA burst, its window's
    /// limit). `None` when `cost` fits a fresh key of at least one plan, or when the
    /// limiter has no plans (the default).
    ///
    /// [`RateLimitLayerBuilder::build`] refuses such a rule
    /// ([`ConfigError::PlanCost`]): no user of any plan could ever pass. A cost
    /// above only some plans' capacities builds: those plans' users are answered
    /// the never-fits status (429 by default, or the one set with
    /// [`never_status`](RateLimitLayerBuilder::never_status), such as 413; no
    /// `Retry-After`), which is how a layer says "not on your plan" (an export that
    /// only enterprise keys can afford); the build cannot tell that from a typo, so
    /// it does not refuse it.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::{KeyedBuilder, RateLimiter, Policy};
    /// use floodgate_http::Charge;
    /// let plans = Plans::classic(); // bursts: free 10, pro 100, enterprise 1 000
    /// let free = plans.id("free").unwrap();
    /// let per_key = PlanLimiter::<String, _>::new(&plans, move |_: &str| free, KeyedBuilder::default())?;
    /// assert_eq!(Charge::<str>::never_fits_plan(&per_key, 500), None); // enterprise admits it
    /// assert_eq!(Charge::<str>::never_fits_plan(&per_key, 1_000), None);
    /// assert_eq!(
    ///     Charge::<str>::never_fits_plan(&per_key, 1_001),
    ///     Some(("enterprise".to_owned(), 1_000))
    /// );
    /// assert_eq!(Charge::<str>::never_fits(&per_key, 1_001), Some(1_000));
    /// let global = RateLimiter::gcra(Policy::per_second(10)?.with_burst(5)?);
    /// assert_eq!(Charge::<()>::never_fits_plan(&global, 6), None); // no plans: see `never_fits`
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn never_fits_plan(&self, cost: u32) -> Option<(String, u64)> {
        let _ = cost;
        None
    }
}

/// The capacity `algorithm` reports when `cost` never fits even a fresh state (the
/// all-zero one, which has spent nothing) at `now`, being above it; `None` when it
/// fits. A "never" for a cost within the capacity (a GCRA whose schedule would pass
/// `u64::MAX` ns, at a clock reading some 584 years on) is the clock's, not the
/// configuration's: `ConfigError::Cost` would name a cost above a capacity it is not
/// above, so it is left to the never-fits answer.
fn fresh_never_fits<A: Algorithm>(algorithm: &A, now: Nanos, cost: u32) -> Option<u64> {
    let (decision, _) = algorithm.decide(bytemuck::Zeroable::zeroed(), now, cost);
    let capacity = decision.limit();
    (!decision.is_allowed() && decision.retry_after().is_none() && u64::from(cost) > capacity)
        .then_some(capacity)
}

impl<K: ?Sized, A: Algorithm, C: Clock, S: StateCell<A::State>> Charge<K> for RateLimiter<A, C, S> {
    fn charge(&self, _key: &K, cost: u32) -> (Decision, Receipt) {
        RateLimiter::charge(self, cost)
    }

    fn refund(&self, _key: &K, receipt: Receipt) -> bool {
        RateLimiter::refund(self, receipt)
    }

    fn peek(&self, _key: &K, cost: u32) -> Decision {
        RateLimiter::peek(self, cost)
    }

    fn never_fits(&self, cost: u32) -> Option<u64> {
        fresh_never_fits(self.algorithm(), self.clock().now(), cost)
    }
}

/// One hot-key limit for every key: a proxy's global limit that scales across cores
/// (per-core leases of units from one central GCRA word: see [`LeasedGcra`]).
///
/// It is the one mode exempt from exact admission: over any interval it admits at
/// most what the central GCRA allows plus the units out on lease at the interval's
/// start (at most `shards × lease size` between requests). A refund (a later rule's
/// denial) gives the units back to the lease they were spent from when it runs on
/// the thread that charged them (its shard's only writer) while that lease is still
/// the shard's and unexpired, never above the lease size; otherwise — the task moved
/// to another worker thread while a later rule awaited (a remote limiter's round
/// trip), or the lease expired meanwhile — to the central word: the part of the
/// refill's booking the clock has not yet reached, as a plain GCRA refund, nothing
/// once the clock has passed it (never an admission beyond the bound, see
/// [`LeasedGcra::refund`]). An admission's response shows
/// [`LeasedGcra::report`]: this thread's lease units plus the central word's
/// remaining (a lower bound: other shards' leases may hold more), with the central
/// word's reset, the time until its schedule is idle. (A lease spend's own decision
/// holds only the lease's units and its lifetime left, which a client would read
/// as its quota resetting in a millisecond, or an hour, whatever the policy.) A
/// denial shows its decision: its `Retry-After` is the central word's wait for the
/// whole cost, after which a retry is admitted on any thread absent other traffic
/// (not just this shard's shortfall: this thread's lease may expire first, and the
/// retry may land on another thread's shard). A charge given back, and `peek(0)`,
/// show the report. A cost above the
/// burst never fits ([`ConfigError::Cost`]
/// at build).
///
/// # Examples
///
/// ```
/// use floodgate::{LeasedGcra, Policy};
/// use floodgate_http::{Global, RateLimitLayer, Rule};
///
/// // 100 000 a second for the whole proxy, one lease shard per worker thread.
/// let global = LeasedGcra::builder(Policy::per_second(100_000)?.with_burst(1_000)?)
///     .shards(8)
///     .lease_size(16)
///     .build()?;
/// let layer = RateLimitLayer::builder()
///     .rule(Rule::new("global", global, Global)?)
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
impl<K: ?Sized, C: Clock> Charge<K> for LeasedGcra<C> {
    fn charge(&self, _key: &K, cost: u32) -> (Decision, Receipt) {
        let (decision, receipt) = LeasedGcra::charge(self, cost);
        (shown(decision, || self.report()), receipt)
    }

    fn refund(&self, _key: &K, receipt: Receipt) -> bool {
        LeasedGcra::refund(self, receipt)
    }

    fn peek(&self, _key: &K, cost: u32) -> Decision {
        if cost == 0 {
            self.report()
        } else {
            LeasedGcra::peek(self, cost)
        }
    }

    fn never_fits(&self, cost: u32) -> Option<u64> {
        fresh_never_fits(&Gcra::new(self.policy()), Nanos::ZERO, cost)
    }
}

/// The body of a keyed limiter's [`Charge`]: its own methods of the same names.
macro_rules! charge_per_key {
    ($limiter:ident) => {
        fn charge(&self, key: &Q, cost: u32) -> (Decision, Receipt) {
            $limiter::charge(self, key, cost)
        }

        fn refund(&self, key: &Q, receipt: Receipt) -> bool {
            $limiter::refund(self, key, receipt)
        }

        fn peek(&self, key: &Q, cost: u32) -> Decision {
            $limiter::peek(self, key, cost)
        }
    };
}

impl<K, Q, A, C, S> Charge<Q> for KeyedLimiter<K, A, C, S>
where
    Q: Lookup<K> + ?Sized,
    A: Algorithm,
    C: Clock,
    S: Storage<K, A::State>,
{
    charge_per_key!(KeyedLimiter);

    fn never_fits(&self, cost: u32) -> Option<u64> {
        fresh_never_fits(self.algorithm(), self.clock().now(), cost)
    }
}

impl<K, Q, C> Charge<Q> for KeyedSlidingLog<K, C>
where
    K: core::hash::Hash + Eq + Clone + core::borrow::Borrow<Q>,
    Q: core::hash::Hash + Eq + ToOwned<Owned = K> + ?Sized,
    C: Clock,
{
    charge_per_key!(KeyedSlidingLog);

    fn never_fits(&self, cost: u32) -> Option<u64> {
        // The log admits at most its limit within a period: "never" is `n > L`.
        let limit = self.policy().limit();
        (u64::from(cost) > limit).then_some(limit)
    }
}

/// Per key, with hot keys on per-core leases ([`HotKeyLimiter`]): a cold key is the
/// keyed table's exact GCRA, and its refunds are the table's; a hot key's charge and
/// refund are its lease limiter's (see the [`LeasedGcra`] impl above and
/// [`HotKeyLimiter::refund`]: nothing comes back after the key's demotion or a new
/// promotion). An admission's response, a charge given back and `peek(0)` show
/// [`HotKeyLimiter::report`] (for a hot key its lease limiter's report, as above).
/// A cost above the burst never fits ([`ConfigError::Cost`] at build).
impl<K, Q, C, S> Charge<Q> for HotKeyLimiter<K, C, S>
where
    K: core::hash::Hash + Eq + Clone + Send + 'static,
    Q: Lookup<K> + ?Sized,
    C: Clock + Clone + 'static,
    S: Storage<K, GcraState>,
{
    fn charge(&self, key: &Q, cost: u32) -> (Decision, Receipt) {
        let (decision, receipt) = HotKeyLimiter::charge(self, key, cost);
        (shown(decision, || self.report(key)), receipt)
    }

    fn refund(&self, key: &Q, receipt: Receipt) -> bool {
        HotKeyLimiter::refund(self, key, receipt)
    }

    fn peek(&self, key: &Q, cost: u32) -> Decision {
        if cost == 0 {
            self.report(key)
        } else {
            HotKeyLimiter::peek(self, key, cost)
        }
    }

    fn never_fits(&self, cost: u32) -> Option<u64> {
        fresh_never_fits(&Gcra::new(self.policy()), self.clock().now(), cost)
    }
}

/// What a hot-key mode's response shows for an admission: its `report` (this
/// thread's lease units plus the central word's remaining, the central word's
/// reset) where a lease spend's own decision holds only the lease's units and
/// lifetime; a denial as decided.
fn shown(decision: Decision, report: impl FnOnce() -> Decision) -> Decision {
    if !decision.is_allowed() {
        return decision;
    }
    let report = report();
    Decision::new(
        true,
        decision.limit(),
        report.remaining(),
        report.reset_after(),
        None,
    )
    .with_policy(decision.policy())
}

/// Per API key under its plan: a [`PlanLimiter`] is a rule of its own. Its
/// `RateLimit-Policy` member advertises the window `w` of the request's key's plan
/// ([`Charge::window_secs`]) unless the rule was given one ([`Rule::window`]).
///
/// The layer runs the resolver once per request: the charge reports the plan it
/// was decided under ([`Charge::charge_with_window`], [`PlanLimiter::charge_plan`]),
/// so the window and the `RateLimit` / `X-RateLimit-*` figures all describe that
/// plan, even when the resolver answers another one a moment later. A charge the
/// layer gives back (a later rule denied the request) is refunded and shown in the
/// plan that took it, found from its receipt with no further run
/// ([`Charge::refund_and_peek`]).
///
/// # Examples
///
/// ```
/// use floodgate::keyed::plans::{PlanLimiter, Plans};
/// use floodgate::KeyedBuilder;
/// use floodgate_http::{HeaderKey, OnMissingKey, RateLimitLayer, Rule};
/// let plans = Plans::classic();
/// let (free, pro) = (plans.id("free").unwrap(), plans.id("pro").unwrap());
/// let resolver = move |key: &String| if key.starts_with("pro_") { pro } else { free };
/// let per_key = PlanLimiter::new(&plans, resolver, KeyedBuilder::default())?;
/// let layer = RateLimitLayer::builder()
///     .rule(
///         Rule::new("plan", per_key, HeaderKey::new("x-api-key")?)?
///             .on_missing_key(OnMissingKey::Fallback("anonymous".to_owned())),
///     )
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
impl<K, Q, R, C, S, A> Charge<Q> for PlanLimiter<K, R, C, S, A>
where
    Q: Lookup<K> + ?Sized,
    R: Fn(&Q) -> PlanId,
    C: Clock,
    A: PlanAlgorithm,
    S: Storage<K, A::State>,
{
    charge_per_key!(PlanLimiter);

    fn never_fits(&self, cost: u32) -> Option<u64> {
        self.never_fits_plan(cost).map(|(_, capacity)| capacity)
    }

    fn never_fits_plan(&self, cost: u32) -> Option<(String, u64)> {
        let now = self.clock().now();
        self.plans()
            .iter()
            .filter_map(|(_, name, policy)| {
                // Every plan's policy was accepted by `for_policy` when it was set,
                // so this is `Some`.
                let algorithm = A::for_policy(policy).ok()?;
                Some(fresh_never_fits(&algorithm, now, cost).map(|c| (name.to_owned(), c)))
            })
            // `None` as soon as one plan admits the cost; the largest capacity (the
            // first among equals) of the plans that all cannot.
            .try_fold(None::<(String, u64)>, |closest, never| {
                let (name, capacity) = never?;
                Some(match closest {
                    Some(c) if c.1 >= capacity => Some(c),
                    _ => Some((name, capacity)),
                })
            })
            .flatten()
    }

    fn window_secs(&self, key: &Q) -> Option<u64> {
        Some(plan_window_secs::<A>(&self.policy_of(key)))
    }

    fn charge_with_window(&self, key: &Q, cost: u32) -> (Decision, Receipt, Option<u64>) {
        let (charged, receipt) = PlanLimiter::charge_plan(self, key, cost);
        let window = plan_window_secs::<A>(&charged.policy);
        (charged.decision, receipt, Some(window))
    }

    fn refund_and_peek(&self, key: &Q, receipt: Receipt) -> (Decision, Option<u64>) {
        let after = match self.receipt_plan(&receipt) {
            Some(plan) => {
                let _ = self.refund_in(plan, key, receipt);
                self.peek_in(plan, key, 0)
            }
            // No table issued it: it gives back nothing anywhere.
            None => self.peek_plan(key, 0),
        };
        (after.decision, Some(plan_window_secs::<A>(&after.policy)))
    }

    fn peek_with_window(&self, key: &Q, cost: u32) -> (Decision, Decision, Option<u64>) {
        let at_cost = self.peek_plan(key, cost);
        let state = self.peek_in(at_cost.plan, key, 0);
        let window = plan_window_secs::<A>(&state.policy);
        (at_cost.decision, state.decision, Some(window))
    }
}

/// The window `w` of a plan's `policy`. The plan algorithms are sealed: the GCRA
/// (the one whose state means the same under every policy) refills over `B·T`; a
/// fixed or sliding window counts the plan's limit over its period.
fn plan_window_secs<A: PlanAlgorithm>(policy: &Policy) -> u64 {
    if A::POLICY_FREE_STATE {
        window_secs(policy)
    } else {
        duration_window_secs(policy.period())
    }
}

/// A charge's decision and receipt, with the window `w` to advertise beside it
/// ([`Charge::charge_with_window`]).
type ChargeWithWindow = (Decision, Receipt, Option<u64>);

/// A peek at a charge and at the state, with the window `w` beside the state
/// ([`Charge::peek_with_window`]).
type PeekWithWindow = (Decision, Decision, Option<u64>);

/// How an in-process rule charges, refunds and peeks (its limiter's [`Charge`]).
struct InProcess<L, K: ?Sized> {
    /// [`Charge::charge_with_window`].
    charge: fn(&L, &K, u32) -> ChargeWithWindow,
    /// [`Charge::refund_and_peek`].
    refund: fn(&L, &K, Receipt) -> (Decision, Option<u64>),
    never_fits: fn(&L, u32) -> Option<u64>,
    never_fits_plan: fn(&L, u32) -> Option<(String, u64)>,
    /// [`Charge::peek_with_window`].
    peek: fn(&L, &K, u32) -> PeekWithWindow,
}

/// One limit applied to every request: a name (its policy id in the headers), a
/// limiter, an extractor for its key, and how to act on a denial.
///
/// # Examples
///
/// ```
/// use floodgate::{KeyedLimiter, Policy};
/// use floodgate_http::{PeerIp, Rule, Strategy};
/// use std::net::IpAddr;
/// let policy = Policy::per_minute(10)?;
/// let per_ip: KeyedLimiter<IpAddr> = KeyedLimiter::gcra(policy);
/// let rule = Rule::new("per-ip", per_ip, PeerIp::new())?
///     .window_of(&policy)
///     .strategy(Strategy::Hard);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Rule<L, E: KeyExtractor> {
    name: PolicyName,
    limiter: Arc<L>,
    extractor: E,
    strategy: Strategy,
    cost: u32,
    window: Option<u64>,
    /// The fallback key shared, so a remote refund that outlives the request (its
    /// response future dropped: [`Held`]) owns what it needs.
    on_missing: OnMissingKey<Arc<E::Key>>,
    on_error: Option<OnLimiterError>,
    in_process: Option<InProcess<L, E::Key>>,
}

impl<L, E> Rule<L, E>
where
    L: AsyncLimit<E::Key> + 'static,
    E: KeyExtractor,
{
    /// A hard rule named `name` (see [`PolicyName`]) charging cost 1 per request, on
    /// an in-process limiter: when a later rule denies the request, this rule's charge
    /// is given back ([`Charge`]).
    ///
    /// # Errors
    ///
    /// [`ConfigError::PolicyName`] when `name` cannot be a header policy name.
    pub fn new(name: &str, limiter: L, extractor: E) -> Result<Self, ConfigError>
    where
        L: Charge<E::Key>,
    {
        Rule::shared(name, Arc::new(limiter), extractor)
    }

    /// [`Rule::new`] with a limiter the application keeps a handle on (to read its
    /// metrics, change its policy, or share it between rules or layers).
    ///
    /// # Errors
    ///
    /// [`ConfigError::PolicyName`] when `name` cannot be a header policy name.
    pub fn shared(name: &str, limiter: Arc<L>, extractor: E) -> Result<Self, ConfigError>
    where
        L: Charge<E::Key>,
    {
        let mut rule = Rule::remote_shared(name, limiter, extractor)?;
        rule.in_process = Some(InProcess {
            charge: |l: &L, k: &E::Key, cost| l.charge_with_window(k, cost),
            refund: |l: &L, k: &E::Key, receipt| l.refund_and_peek(k, receipt),
            never_fits: |l: &L, cost| l.never_fits(cost),
            never_fits_plan: |l: &L, cost| l.never_fits_plan(cost),
            peek: |l: &L, k: &E::Key, cost| l.peek_with_window(k, cost),
        });
        Ok(rule)
    }

    /// A rule on a remote limiter (Redis): checked with [`AsyncLimit::charge_n`], and
    /// when a later rule denies the request (or the request is dropped while a later
    /// rule makes it wait: [`RateLimitLayerBuilder::refund_spawner`]) its charge is
    /// given back with [`AsyncLimit::refund`] — for a limit without refunds (the trait's default; a
    /// Redis limiter unless built with `RedisLimiterBuilder::refunds(true)`) it stays
    /// taken, with no refund round trip. See [`RateLimitLayer`], "How rules combine".
    ///
    /// # Errors
    ///
    /// [`ConfigError::PolicyName`] when `name` cannot be a header policy name.
    pub fn remote(name: &str, limiter: L, extractor: E) -> Result<Self, ConfigError> {
        Rule::remote_shared(name, Arc::new(limiter), extractor)
    }

    /// [`Rule::remote`] with a limiter the application keeps a handle on.
    ///
    /// # Errors
    ///
    /// [`ConfigError::PolicyName`] when `name` cannot be a header policy name.
    pub fn remote_shared(name: &str, limiter: Arc<L>, extractor: E) -> Result<Self, ConfigError> {
        Ok(Rule {
            name: PolicyName::new(name)?,
            limiter,
            extractor,
            strategy: Strategy::Hard,
            cost: 1,
            window: None,
            on_missing: OnMissingKey::Reject,
            on_error: None,
            in_process: None,
        })
    }

    /// Acts on denials with `strategy`.
    pub fn strategy(self, strategy: Strategy) -> Self {
        Rule { strategy, ..self }
    }

    /// Charges `cost` units per request (0 reports without charging).
    ///
    /// A cost more than the limiter ever admits at once (a GCRA burst, a window's
    /// limit) could only be answered the never-fits status:
    /// [`build`](RateLimitLayerBuilder::build) refuses such a rule, whatever its
    /// [`Strategy`], on every in-process limiter ([`ConfigError::Cost`],
    /// [`Charge::never_fits`]). On a [`PlanLimiter`] the cost must fit at least
    /// one plan, else no user could pass: `build` refuses it naming the plan that
    /// comes closest ([`ConfigError::PlanCost`], [`Charge::never_fits_plan`]); a
    /// cost above only some plans' capacities builds, and those plans' users get
    /// the never-fits status ("not on your plan"). Each is judged under the policy as it is at
    /// `build`. A policy lowered later through a shared handle
    /// ([`PlanLimiter::set_policy`], [`KeyedSlidingLog::set_policy`]) and a
    /// [`Rule::remote`] limiter, which is not checked, answer a request that can
    /// never fit the never-fits status
    /// ([`never_status`](RateLimitLayerBuilder::never_status)).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Policy, RateLimiter};
    /// use floodgate_http::{ConfigError, Global, RateLimitLayer, Rule};
    /// let uploads = RateLimiter::gcra(Policy::per_minute(10)?);
    /// let err = RateLimitLayer::builder()
    ///     .rule(Rule::new("uploads", uploads, Global)?.cost(20))
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err, ConfigError::Cost { rule: "uploads".into(), cost: 20, capacity: 10 });
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cost(self, cost: u32) -> Self {
        Rule { cost, ..self }
    }

    /// Advertises `w` = `window` in whole seconds (rounded up, at least 1), for every
    /// key: it stands over a window the limiter knows per key
    /// ([`Charge::window_secs`]).
    pub fn window(self, window: Duration) -> Self {
        Rule {
            window: Some(duration_window_secs(window)),
            ..self
        }
    }

    /// Advertises the GCRA window of `policy`: `⌈B·T⌉` seconds ([`window_secs`]), as
    /// [`Rule::window`] does.
    pub fn window_of(self, policy: &Policy) -> Self {
        Rule {
            window: Some(window_secs(policy)),
            ..self
        }
    }

    /// What to do when the extractor finds no usable key.
    pub fn on_missing_key(self, on_missing: OnMissingKey<E::Key>) -> Self {
        let on_missing = match on_missing {
            OnMissingKey::Reject => OnMissingKey::Reject,
            OnMissingKey::Fallback(key) => OnMissingKey::Fallback(Arc::new(key)),
        };
        Rule { on_missing, ..self }
    }

    /// What to do when this rule's limiter fails, in place of the layer's
    /// [`on_limiter_error`](RateLimitLayerBuilder::on_limiter_error): a shared
    /// per-client limit may fail open while a global quota fails closed. A soft or
    /// shadow rule never blocks: its failure skips it whatever this says. An
    /// in-process limiter never fails; this is for [`Rule::remote`] ones (Redis).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedLimiter, Policy};
    /// use floodgate_http::{OnLimiterError, PeerIp, Rule};
    /// use std::net::IpAddr;
    /// // In production a `floodgate_redis::RedisLimiter`, which can fail.
    /// let per_ip: KeyedLimiter<IpAddr> = KeyedLimiter::gcra(Policy::per_second(10)?);
    /// let rule = Rule::remote("per-ip", per_ip, PeerIp::new())?
    ///     .on_limiter_error(OnLimiterError::FailOpen);
    /// # let _ = rule;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_limiter_error(self, on_error: OnLimiterError) -> Self {
        Rule {
            on_error: Some(on_error),
            ..self
        }
    }
}

impl<L, E: KeyExtractor + fmt::Debug> fmt::Debug for Rule<L, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rule")
            .field("name", &self.name)
            .field("extractor", &self.extractor)
            .field("strategy", &self.strategy)
            .field("cost", &self.cost)
            .field("window", &self.window)
            .field("on_error", &self.on_error)
            .finish_non_exhaustive()
    }
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A rule's work for one request, begun.
pub(crate) struct Started<'a> {
    /// The key could not be extracted (the check, if any, runs on the fallback key).
    pub(crate) key_error: Option<KeyError>,
    pub(crate) partition_key: Option<[u8; 16]>,
    /// The window `w` the limiter advertises for this request's key, learned from
    /// its charge ([`Charge::charge_with_window`]), if it knows one.
    pub(crate) window: Option<u64>,
    /// `None` when the request is to be rejected for its key. An in-process rule's
    /// check carries the receipt of its charge.
    pub(crate) check: Option<BoxFuture<'a, Checked>>,
}

/// What a rule's charge took, for its refund when a later rule denies.
pub(crate) enum RuleReceipt {
    /// An in-process limiter's ([`Charge`]).
    InProcess(Receipt),
    /// A remote limiter's ([`AsyncLimit::charge_n`]).
    Remote(AsyncReceipt),
}

/// A rule's decision for one request.
pub(crate) struct Check {
    pub(crate) decision: Decision,
    /// For a charge that can be given back, what its refund needs.
    pub(crate) receipt: Option<RuleReceipt>,
    /// The request waited in a queue for its slot (and was admitted).
    pub(crate) queued: bool,
}

/// A rule's check, or the limiter's error.
pub(crate) type Checked = Result<Check, String>;

/// A remote rule's refund ([`ErasedRule::refund_remote`]): whether anything came
/// back, or the limiter's error.
pub(crate) type RemoteRefund = BoxFuture<'static, Result<bool, String>>;

/// A rule with its key and limiter types erased, so one layer holds rules on
/// different keys (global, per client, per endpoint).
pub(crate) trait ErasedRule: Send + Sync {
    fn start<'a>(&'a self, parts: &Parts, hasher: Option<&PartitionKeyHasher>) -> Started<'a>;

    /// Gives back what `start` charged for this request (its `receipt`): the key is
    /// extracted again (extractors are pure functions of the request head). Returns
    /// the rule's state after the refund (a peek at cost 0) for the headers, when it
    /// can tell.
    fn refund(&self, parts: &Parts, receipt: Receipt) -> Option<Decision>;

    /// Gives back a remote charge ([`AsyncLimit::refund`]) that `start` took for
    /// this request, the key extracted again; `None` when the rule has none to give
    /// back. The future ends within the limiter's own timeout (a Redis limiter's),
    /// and owns what it needs: it may run after the request is gone ([`Held`]'s
    /// drop).
    fn refund_remote(&self, parts: &Parts, receipt: AsyncReceipt) -> Option<RemoteRefund> {
        let _ = (parts, receipt);
        None
    }

    /// [`refund`](ErasedRule::refund), with the window `w` to show beside the state
    /// after it when the refund tells one ([`Charge::refund_and_peek`]: a plan
    /// limiter's is the plan that charged); `None` keeps the window shown.
    fn refund_with_window(
        &self,
        parts: &Parts,
        receipt: Receipt,
    ) -> Option<(Decision, Option<u64>)> {
        self.refund(parts, receipt).map(|after| (after, None))
    }

    /// The rule's cost and its limiter's capacity when the cost never fits, for any
    /// key ([`Charge::never_fits`]); `None` when it fits or the rule cannot tell.
    fn never_fits(&self) -> Option<(u32, u64)>;

    /// The rule's cost, and the plan and its capacity when the cost never fits that
    /// plan's keys ([`Charge::never_fits_plan`]); `None` when it fits every plan or
    /// the rule has no plans.
    fn never_fits_plan(&self) -> Option<(u32, String, u64)> {
        None
    }

    /// For a request an earlier rule denied: what this rule would decide for it now,
    /// writing nothing (an in-process rule's peek at its cost, and at cost 0 for the
    /// headers; a queue's reservation, reserving nothing; a priority queue's
    /// arrival, taking no place); `None` when the rule cannot tell without a charge
    /// or a round trip (a remote limiter) or has no key for the request.
    fn peek_later(&self, parts: &Parts, hasher: Option<&PartitionKeyHasher>) -> Option<Peeked> {
        let _ = (parts, hasher);
        None
    }
}

/// A later rule's view of a request an earlier rule denied ([`ErasedRule::peek_later`]).
pub(crate) struct Peeked {
    /// The peek at the rule's cost: would it deny too, and for how long.
    pub(crate) at_cost: Decision,
    /// The peek at cost 0: the rule's state, for the headers.
    pub(crate) state: Decision,
    pub(crate) partition_key: Option<[u8; 16]>,
    /// The window the limiter knows for the key ([`Charge::window_secs`]).
    pub(crate) window: Option<u64>,
}

impl<L, E> ErasedRule for Rule<L, E>
where
    L: AsyncLimit<E::Key> + 'static,
    E: KeyExtractor,
{
    fn start<'a>(&'a self, parts: &Parts, hasher: Option<&PartitionKeyHasher>) -> Started<'a> {
        enum Key<'a, K> {
            Own(K),
            Fallback(&'a K),
        }
        let (key, key_error) = match self.extractor.extract(parts) {
            Ok(k) => (Key::Own(k), None),
            Err(e) => match &self.on_missing {
                OnMissingKey::Reject => {
                    return Started {
                        key_error: Some(e),
                        partition_key: None,
                        window: None,
                        check: None,
                    }
                }
                OnMissingKey::Fallback(k) => (Key::Fallback(&**k), Some(e)),
            },
        };
        let key_ref = match &key {
            Key::Own(k) => k,
            Key::Fallback(k) => *k,
        };
        let partition_key = hasher.map(|h| h.hash(key_ref));
        let limiter = &*self.limiter;
        let cost = self.cost;
        let mut window = None;
        let check: BoxFuture<'a, _> = match &self.in_process {
            // In process: decide now, keeping the receipt for a refund, and learn the
            // window from the same look at the key (one run of a plan resolver).
            Some(in_process) => {
                let (decision, receipt, w) = (in_process.charge)(limiter, key_ref, cost);
                window = w;
                Box::pin(core::future::ready(Ok(Check {
                    decision,
                    receipt: Some(RuleReceipt::InProcess(receipt)),
                    queued: false,
                })))
            }
            None => Box::pin(async move {
                let key = match &key {
                    Key::Own(k) => k,
                    Key::Fallback(k) => *k,
                };
                // With a receipt, given back if a later rule denies (a limit
                // without refunds returns an empty one: a plain check).
                let charged = limiter.charge_n(key, cost).await;
                charged
                    .map(|(decision, receipt)| Check {
                        decision,
                        receipt: Some(RuleReceipt::Remote(receipt)),
                        queued: false,
                    })
                    .map_err(|e| e.to_string())
            }),
        };
        Started {
            key_error,
            partition_key,
            window,
            check: Some(check),
        }
    }

    fn refund(&self, parts: &Parts, receipt: Receipt) -> Option<Decision> {
        self.refund_with_window(parts, receipt)
            .map(|(after, _)| after)
    }

    fn refund_with_window(
        &self,
        parts: &Parts,
        receipt: Receipt,
    ) -> Option<(Decision, Option<u64>)> {
        let in_process = self.in_process.as_ref()?;
        let limiter = &*self.limiter;
        match (self.extractor.extract(parts), &self.on_missing) {
            (Ok(key), _) => Some((in_process.refund)(limiter, &key, receipt)),
            (Err(_), OnMissingKey::Fallback(key)) => {
                Some((in_process.refund)(limiter, &**key, receipt))
            }
            (Err(_), OnMissingKey::Reject) => None,
        }
    }

    fn refund_remote(&self, parts: &Parts, receipt: AsyncReceipt) -> Option<RemoteRefund> {
        if self.in_process.is_some() || !receipt.is_charged() {
            return None;
        }
        // Owned (the limiter and the key shared or moved in), so that the refund of
        // a dropped request can run after the request is gone.
        let limiter = Arc::clone(&self.limiter);
        let refund: RemoteRefund = match (self.extractor.extract(parts), &self.on_missing) {
            (Ok(key), _) => Box::pin(async move {
                limiter
                    .refund(&key, receipt)
                    .await
                    .map_err(|e| e.to_string())
            }),
            (Err(_), OnMissingKey::Fallback(key)) => {
                let key = Arc::clone(key);
                Box::pin(async move {
                    limiter
                        .refund(&*key, receipt)
                        .await
                        .map_err(|e| e.to_string())
                })
            }
            (Err(_), OnMissingKey::Reject) => return None,
        };
        Some(refund)
    }

    fn never_fits(&self) -> Option<(u32, u64)> {
        let in_process = self.in_process.as_ref()?;
        let capacity = (in_process.never_fits)(&self.limiter, self.cost)?;
        Some((self.cost, capacity))
    }

    fn never_fits_plan(&self) -> Option<(u32, String, u64)> {
        let in_process = self.in_process.as_ref()?;
        let (plan, capacity) = (in_process.never_fits_plan)(&self.limiter, self.cost)?;
        Some((self.cost, plan, capacity))
    }

    fn peek_later(&self, parts: &Parts, hasher: Option<&PartitionKeyHasher>) -> Option<Peeked> {
        let in_process = self.in_process.as_ref()?;
        let limiter = &*self.limiter;
        let own = self.extractor.extract(parts);
        let key = match (&own, &self.on_missing) {
            (Ok(key), _) => key,
            (Err(_), OnMissingKey::Fallback(key)) => &**key,
            (Err(_), OnMissingKey::Reject) => return None,
        };
        let (at_cost, state, window) = (in_process.peek)(limiter, key, self.cost);
        Some(Peeked {
            at_cost,
            state,
            partition_key: hasher.map(|h| h.hash(key)),
            window,
        })
    }
}

struct RuleEntry {
    name: PolicyName,
    strategy: Strategy,
    window: Option<u64>,
    /// The rule's own failure policy, else the layer's.
    on_error: Option<OnLimiterError>,
    rule: Box<dyn ErasedRule>,
    counters: Counters,
}

/// Which header families the layer writes, on every response it passes or answers.
///
/// The default writes both families: `X-RateLimit-Limit/-Remaining/-Reset` (reset in
/// seconds from now) and `RateLimit-Policy` / `RateLimit`
/// (draft-ietf-httpapi-ratelimit-headers-10), without `pk`, leaving shadow rules out.
/// `Retry-After` is always written on a 429.
///
/// # Examples
///
/// ```
/// use floodgate_http::{HeaderOptions, PartitionKeyHasher, ResetFormat};
/// let opts = HeaderOptions::default()
///     .legacy(Some(ResetFormat::UnixEpoch))
///     .partition_key(PartitionKeyHasher::new([42; 16]));
/// ```
#[derive(Clone, Debug)]
pub struct HeaderOptions {
    legacy: Option<ResetFormat>,
    ietf: bool,
    shadow: bool,
    soft: bool,
    partition_key: Option<PartitionKeyHasher>,
    keep_service: bool,
}

impl Default for HeaderOptions {
    fn default() -> HeaderOptions {
        HeaderOptions {
            legacy: Some(ResetFormat::Seconds),
            ietf: true,
            shadow: false,
            soft: true,
            partition_key: None,
            keep_service: false,
        }
    }
}

impl HeaderOptions {
    /// Writes the `X-RateLimit-*` trio with `format` for the reset, or not (`None`).
    ///
    /// The trio holds one decision: the denial's on a 429 (the hard rule that holds
    /// the request back longest: see [`RateLimitLayer`], "How rules combine"), else
    /// the visible rule with the least `remaining` (the longest reset on a tie).
    /// On a 429 its `Remaining` is the least of the hard rules the request met
    /// (the in-process ones before the denial as they are after the refund; a remote
    /// one as of its check, this request's charge counted even when a refund then
    /// gave it back — no round trip is spent to look again, so the figure may be
    /// low, never high; the denial; the in-process ones after it, peeked): a rule
    /// whose cost is above 1 denies with up to cost − 1 units left, which another
    /// rule may not have (`remaining` counts units, not requests).
    pub fn legacy(self, format: Option<ResetFormat>) -> Self {
        HeaderOptions {
            legacy: format,
            ..self
        }
    }

    /// Writes `RateLimit-Policy` and `RateLimit` (one member per visible rule), or not.
    pub fn ietf(self, on: bool) -> Self {
        HeaderOptions { ietf: on, ..self }
    }

    /// Shows shadow rules in the headers too (by default they alter nothing).
    pub fn include_shadow(self, on: bool) -> Self {
        HeaderOptions { shadow: on, ..self }
    }

    /// Shows soft rules in the header families (the default), or leaves them out
    /// (`false`): a soft rule past its limit then shows only in
    /// `X-RateLimit-Exceeded`, and the `X-RateLimit-*` trio and the IETF members
    /// speak of the rules that can refuse. Shown, a soft rule past its limit puts
    /// `X-RateLimit-Remaining: 0` on requests that still pass, and a client that
    /// paces itself by it backs off while the hard rules still admit it.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Policy, RateLimiter};
    /// use floodgate_http::{Global, HeaderOptions, RateLimitLayer, Rule, Strategy};
    /// let warn = RateLimiter::gcra(Policy::per_second(10)?);
    /// let cap = RateLimiter::gcra(Policy::per_second(100)?);
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::new("warn", warn, Global)?.strategy(Strategy::Soft))
    ///     .rule(Rule::new("cap", cap, Global)?)
    ///     .headers(HeaderOptions::default().include_soft(false))
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn include_soft(self, on: bool) -> Self {
        HeaderOptions { soft: on, ..self }
    }

    /// Keeps the rate-limit fields the inner service wrote on a response the layer
    /// passes, combining them with the layer's own (`true`), or replaces them (the
    /// default, `false`: an upstream cannot then make a client believe in limits the
    /// layer does not enforce).
    ///
    /// Kept, a handler's own limits (a login handler's lockout, a quota it keeps
    /// itself) reach the client beside the layer's, by these rules:
    ///
    /// * `RateLimit`, `RateLimit-Policy` and `X-RateLimit-Exceeded` (Structured Field
    ///   Lists) become one field line: the layer's members, then the service's, in
    ///   the order it wrote them, all its lines taken as one List. A service member
    ///   named like one of the layer's (the same item before its parameters) is left
    ///   out: the layer's describes that policy. A service line is parsed as RFC
    ///   9651 §4.2 parses a List, and left out whole unless every parser reads it,
    ///   so that the combined field still parses. It is left out for a byte outside
    ///   visible ASCII, a string left open, an empty member, a member that is not an
    ///   item or inner list with its parameters; a display string whose `%` is not
    ///   followed by two lower-case hex digits or whose octets are not UTF-8; a byte
    ///   sequence that is not base64 with its `=` padding and zero unused bits (the
    ///   form RFC 9651 writes; a parser may refuse others); a date that is not an
    ///   integer; an integer of more than 15 digits, a decimal of more than 12
    ///   before its dot or 3 after; or a size past what RFC 9651 §3 has every
    ///   parser accept (1 024 characters in a string, 512 in a token, 16 384 octets
    ///   in a byte sequence, 256 members in an inner list, 256 parameters, 64
    ///   characters in a parameter's key, 1 024 members in the combined field).
    /// * The `X-RateLimit-Limit/-Remaining/-Reset` trio is always the service's or the
    ///   layer's, never a mix of the two: the service's trio stays, and the layer
    ///   writes none, when the service wrote all three, each once as a whole
    ///   non-negative integer,
    ///   and its `Remaining` is less than the layer's; otherwise the layer's trio
    ///   replaces whatever part of one the service wrote. (The reset is not
    ///   compared: the service may count it in another format.)
    /// * `Retry-After`: the layer writes it only on its own answers, which no service
    ///   wrote anything to, so the service's stands on a response it passes — with
    ///   this option or without.
    ///
    /// A field the layer does not write on a response (its family turned off, no
    /// visible rule) is left as the service wrote it, with this option or without.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Policy, RateLimiter};
    /// use floodgate_http::{Global, HeaderOptions, RateLimitLayer, Rule};
    /// let global = RateLimiter::gcra(Policy::per_second(100)?);
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::new("global", global, Global)?)
    ///     .headers(HeaderOptions::default().keep_service_fields(true))
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn keep_service_fields(self, on: bool) -> Self {
        HeaderOptions {
            keep_service: on,
            ..self
        }
    }

    /// Adds `pk` (a keyed hash of each rule's key) to the IETF members.
    pub fn partition_key(self, hasher: PartitionKeyHasher) -> Self {
        HeaderOptions {
            partition_key: Some(hasher),
            ..self
        }
    }
}

struct Shared {
    rules: Box<[RuleEntry]>,
    headers: HeaderOptions,
    never_status: StatusCode,
    on_error: OnLimiterError,
    publish_outcomes: bool,
    /// Where a dropped request's remote refunds run
    /// ([`refund_spawner`](RateLimitLayerBuilder::refund_spawner)); `None`: Tokio's
    /// current runtime, if any (feature `queue`).
    spawner: Option<Arc<Spawner>>,
    /// Those tasks in flight, and their cap
    /// ([`max_refund_tasks`](RateLimitLayerBuilder::max_refund_tasks)).
    refund_tasks: RefundTasks,
}

/// The default of [`RateLimitLayerBuilder::max_refund_tasks`].
const DEFAULT_MAX_REFUND_TASKS: usize = 4096;

/// A [`refund_spawner`](RateLimitLayerBuilder::refund_spawner).
type Spawner = dyn Fn(RefundTask) + Send + Sync;

/// The refunds of one dropped request's remote charges, as one task to spawn
/// ([`RateLimitLayerBuilder::refund_spawner`]): it gives back each charge with
/// [`AsyncLimit::refund`], all at once, each within its limiter's own timeout, and
/// counts a refund that fails in its rule's `errors`. Dropped before its end (by a
/// spawner, a runtime shutting down, or after a refund panicked in it) it counts
/// each refund it had not seen end in its rule's `errors`: those charges stay
/// taken, but one whose refund's round trip was under way may have been given
/// back all the same (the limiter may have made it, the answer lost).
/// It holds a reference to the layer's rules and one of its places for refund
/// tasks ([`RateLimitLayerBuilder::max_refund_tasks`]) until it is dropped, and
/// needs no runtime of its own beyond what the limiters' futures need (a Redis
/// limiter's: Tokio).
pub type RefundTask = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A tower [`Layer`] that rate-limits every request by its [`Rule`]s.
///
/// Works with `axum::Router::layer`, `tower::ServiceBuilder` and plain hyper (through
/// `hyper_util::service::TowerToHyperService`). Cloning is cheap (one `Arc`); keep a
/// clone to read [`stats`](RateLimitLayer::stats).
///
/// # How rules combine
///
/// Rules are checked **in order**, each with `check_n` (awaited: a remote limiter
/// works too), and the first **hard** denial stops the walk: the request is answered
/// 429, and the rules after it are neither charged nor counted. The same holds for
/// a request rejected for its key (400) or for a failed limiter (503).
///
/// The 429 speaks for every hard in-process rule ([`Rule::new`]) and queue
/// (`QueueRule`, `KeyedQueueRule`, `PriorityRule`, feature `queue`), as
/// [`check_all`](floodgate::keyed::composite::check_all) does: the hard in-process
/// rules and queues after the one that denied are peeked (a look at the request's
/// cost, charging and reserving nothing, on the denial path only; a queue that would
/// deny waits for the same time its own refusal would give: until the same
/// reservation's slot is at most its `max_delay` away, or for a priority queue
/// whose tier is full with nothing lower to shed, until the waiters ahead of it
/// have had their slots); each that would deny the request too
/// is shown in `RateLimit` as it is (those that would admit it are not shown), and
/// when one would deny for longer, the 429 is its denial (its `Retry-After`,
/// its `X-RateLimit-*`, its name in the body), the longest wait of all ("never"
/// longest; its `X-RateLimit-Remaining` the least of the hard rules the request
/// met, those peeked included, whether or not they deny). A client
/// that waits out `Retry-After` is then not denied by a later rule that was already
/// spent (a later queue then queues it within its bound). Later remote rules (a
/// round trip each) are not peeked: their wait is not in the `Retry-After`. A
/// priority queue is peeked at one instant: a request it would queue counts as
/// admitted, and waiters served, shed or cancelled later change its answer.
///
/// * **In-process limiters** ([`Rule::new`], [`Charge`]): all or nothing. The charges
///   the earlier rules took for the denied request are given back by their receipts, as
///   [`check_all`](floodgate::keyed::composite::check_all) does, with the same
///   consistency under concurrency: a racing request may see a charge while it is
///   held (a phantom denial), never the reverse — no request is admitted beyond any
///   single limit. A refund gives back only what the receipt proves is still the
///   charge's own, so under concurrency it may give back less: on a GCRA (a
///   per-key or global limiter, a queue's immediate slot) a charge given back after
///   a *later* charge of the same limit was given back, while a third charge was
///   booked after that one, may give back less or nothing, the later refund
///   counted as maybe having moved its booking. That unit stays spent until the
///   clock refills it: a loss, never an admission beyond the limit. (A later
///   charge that was still the limit's last booking when given back moved nothing
///   and costs the earlier one nothing: two requests of one client turned away at
///   once get both units back in either order.) The fixed
///   window's and the sliding log's refunds are counts, exact in any order. A
///   request whose response future is dropped before it reaches the inner service
///   (the client went away while it waited for a queue's slot or a remote limiter)
///   is given back the same way. On the hot-key modes
///   ([`LeasedGcra`], a hot key of [`HotKeyLimiter`]) a charge comes back to the
///   lease it was spent from, on the thread that charged it, while that lease is
///   unexpired (never above the lease size); otherwise (the task moved threads, the
///   lease expired) to the central word, the part of its booking still ahead of the
///   clock — a charge whose booking the clock has passed stays charged (a
///   conservative loss, never an admission beyond its bound).
/// * **Remote limiters** ([`Rule::remote`]): in order, stop at the first denial. An
///   earlier remote rule charges with a receipt ([`AsyncLimit::charge_n`]) and, when
///   a later rule rejects the request (429, 400, 503), is given back by it
///   ([`AsyncLimit::refund`]): one more round trip per such rule, on the rejection
///   path only, all at once, each within its limiter's own timeout (a Redis
///   limiter's). A refund that fails is counted in the rule's `errors` (and logged
///   with feature `tracing`) and changes nothing else: the answer stays the same. A
///   limit without refunds (the trait's default: a Redis limiter unless built with
///   `RedisLimiterBuilder::refunds(true)`, which is opt-in until every replica reads
///   the refund state) keeps its charge, with no round trip
///   for a refund. A Redis GCRA refund follows the in-process rule above (a
///   refund of the key's last booking costs no earlier one anything), and a Redis
///   key remembers enough refunds for a crowd of one key charged before any
///   refund landed and all turned away: up to 64 requests of one window, `B` of a
///   GCRA key (8 to 64), any number on a sliding log charged at distinct
///   instants all give back — the windows' and the log's in any order, GCRA's
///   as far as the rule above allows (floodgate-redis docs, "Refunds", **Once**); past that, the receipts refunded after the forgotten ones give
///   back nothing (a loss, never an admission; `review_s46_redis.rs`). A request whose response future is dropped before it reaches
///   the inner service (the client went away while a later rule made it wait, or
///   during a rejection's refund round trips) is given back its remote charges
///   too, by a task nothing awaits: spawned with the
///   layer's [`refund_spawner`](RateLimitLayerBuilder::refund_spawner), else on the
///   Tokio runtime the future is dropped in (feature `queue`); the same refunds,
///   each within its limiter's timeout, failures counted in `errors`, at most
///   [`max_refund_tasks`](RateLimitLayerBuilder::max_refund_tasks) such tasks in
///   flight per layer. Where nothing runs them to their end (the tasks at their
///   cap, no spawner and no runtime, a spawner that panics or drops the task, a
///   runtime shutting down) those charges stay taken, each counted in its rule's
///   `errors` (but a refund dropped during its round trip may have reached the
///   limiter: counted all the same). A remote charge whose
///   own round trip is under way at the drop has no receipt yet: if the limiter
///   took it, it stays taken. Put the
///   rule most likely to deny (per client) before the shared ones (global), so a
///   flooding client is stopped before it spends the global budget.
/// * Soft and shadow rules never stop the walk; their admissions are refunded like
///   the hard rules' when a later hard rule denies.
/// * **Queueing rules** (`QueueRule`, `KeyedQueueRule`, `PriorityRule`, feature
///   `queue`): each request makes one reservation; one granted with no delay (a
///   slot free when the request arrives) is exactly a plain GCRA admission and
///   comes with that charge's receipt, so it is given back like an in-process
///   rule's charge when a later rule rejects the request or the request is dropped
///   after it: a client that a later per-client rule denies leaves a shared
///   queue's slot to the next client. A slot the request **waited** for stays
///   taken, by design: the request has had its turn (no receipt is kept for it,
///   though GCRA's refund rule would give back the part of its booking still
///   ahead of the clock). Putting the per-client rules before a shared queue still
///   spares the queue's waits for requests they deny.
///
/// A request passed on to the inner service keeps every charge, whatever the service
/// then does (an error, a panic, a 5xx): it reached the service.
///
/// Counters count an admission that was later refunded as allowed. The headers of a
/// denied request show an earlier in-process rule, or a queue whose slot was given
/// back, as it is after the refund (a peek at cost 0: its `remaining` no longer
/// counts this request); a remote rule as of
/// its check (no round trip is spent to show it after a refund).
///
/// # Responses
///
/// * every response, passed or answered: the header families of [`HeaderOptions`];
/// * a hard denial: `429 Too Many Requests`, `Retry-After` in whole seconds rounded
///   up (never 0), a `text/plain` body naming the rule;
/// * a request that can never fit (cost above the capacity): the never-fits status
///   (429 by default, [`RateLimitLayerBuilder::never_status`]), **no** `Retry-After`,
///   a body saying so (a rule whose limiter can tell is refused at
///   [`build`](RateLimitLayerBuilder::build) instead: see [`Rule::cost`]);
/// * no usable key for a hard rule and [`OnMissingKey::Reject`]: `400 Bad Request`
///   saying why;
/// * a hard rule's limiter error and [`OnLimiterError::FailClosed`]: `503 Service
///   Unavailable` (soft and shadow rules are skipped instead: see [`Strategy`]).
/// * to a gRPC request (`content-type: application/grpc*`, feature `grpc`), each of
///   these answers is instead a trailers-only gRPC status (HTTP 200): a denial or a
///   never-fits request is `RESOURCE_EXHAUSTED` (8) with `grpc-retry-pushback-ms` (the
///   delay in milliseconds rounded up, at least 1; `-1` for never) and, for a denial, a
///   `google.rpc.RetryInfo` in `grpc-status-details-bin`; a missing key is
///   `INVALID_ARGUMENT` (3), a failed limiter `UNAVAILABLE` (14).
///
/// # Examples
///
/// ```
/// use floodgate::{KeyedLimiter, Policy, RateLimiter};
/// use floodgate_http::{Global, PeerIp, RateLimitLayer, Rule, Strategy};
/// use std::net::IpAddr;
///
/// let per_ip_policy = Policy::per_minute(10)?;
/// let per_ip: KeyedLimiter<IpAddr> = KeyedLimiter::gcra(per_ip_policy);
/// let global = RateLimiter::gcra(Policy::per_second(1_000)?);
/// let layer = RateLimitLayer::builder()
///     .rule(Rule::new("per-ip", per_ip, PeerIp::new())?.window_of(&per_ip_policy))
///     .rule(Rule::new("global", global, Global)?.strategy(Strategy::Shadow))
///     .build()?;
/// assert_eq!(layer.stats()[0].name, "per-ip");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct RateLimitLayer {
    shared: Arc<Shared>,
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.shared.rules.iter().map(|r| r.name.as_str()).collect();
        f.debug_struct("RateLimitLayer")
            .field("rules", &names)
            .field("headers", &self.shared.headers)
            .finish_non_exhaustive()
    }
}

/// Builds a [`RateLimitLayer`].
#[must_use = "a builder does nothing until built"]
pub struct RateLimitLayerBuilder {
    rules: Vec<RuleEntry>,
    headers: HeaderOptions,
    never_status: StatusCode,
    on_error: OnLimiterError,
    publish_outcomes: bool,
    spawner: Option<Arc<Spawner>>,
    max_refund_tasks: usize,
}

impl fmt::Debug for RateLimitLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("rules", &self.rules.len())
            .finish_non_exhaustive()
    }
}

impl RateLimitLayerBuilder {
    /// Adds `rule`, checked after the rules added before it.
    pub fn rule<L, E>(mut self, rule: Rule<L, E>) -> Self
    where
        L: AsyncLimit<E::Key> + 'static,
        E: KeyExtractor,
    {
        self.rules.push(RuleEntry {
            name: rule.name.clone(),
            strategy: rule.strategy,
            window: rule.window,
            on_error: rule.on_error,
            rule: Box::new(rule),
            counters: Counters::new(),
        });
        self
    }

    /// Adds a rule that denies as a hard rule does (the queueing rules).
    #[cfg(feature = "queue")]
    fn hard(mut self, name: PolicyName, window: Option<u64>, rule: Box<dyn ErasedRule>) -> Self {
        self.rules.push(RuleEntry {
            name,
            strategy: Strategy::Hard,
            window,
            on_error: None,
            rule,
            counters: Counters::new(),
        });
        self
    }

    /// Adds a per-key queueing rule (feature `queue`), checked after the rules added
    /// before it: a request waits for its key's slot up to the rule's `max_delay`,
    /// else it is denied as by a hard rule; a request without a usable key is a 400.
    #[cfg(feature = "queue")]
    pub fn queue_per_key<E, C, S>(self, rule: crate::queue::KeyedQueueRule<E, C, S>) -> Self
    where
        E: KeyExtractor,
        E::Key: Clone,
        C: floodgate::Clock + 'static,
        S: floodgate::Storage<E::Key, floodgate::GcraState> + 'static,
    {
        let (name, window) = (rule.name.clone(), rule.window);
        self.hard(name, window, Box::new(rule))
    }

    /// Adds a queueing rule (feature `queue`), checked after the rules added before
    /// it: a request waits for its slot up to the rule's `max_delay`, else it is
    /// denied as by a hard rule.
    #[cfg(feature = "queue")]
    pub fn queue<C, S>(self, rule: crate::queue::QueueRule<C, S>) -> Self
    where
        C: floodgate::Clock + 'static,
        S: floodgate::StateCell<floodgate::GcraState> + Send + Sync + 'static,
    {
        let (name, window) = (rule.name.clone(), rule.window);
        self.hard(name, window, Box::new(rule))
    }

    /// Adds a priority-queueing rule (feature `queue`), checked after the rules added
    /// before it: one queue per tier (plan), the highest tier served first, the lowest
    /// shed first when a queue is full.
    #[cfg(feature = "queue")]
    pub fn priority<C, S, E>(mut self, rule: crate::priority::PriorityRule<C, S, E>) -> Self
    where
        C: floodgate::Clock + 'static,
        S: floodgate::StateCell<floodgate::GcraState> + Send + Sync + 'static,
        E: KeyExtractor<Key = usize>,
    {
        self.rules.push(RuleEntry {
            name: rule.name.clone(),
            strategy: Strategy::Hard,
            window: rule.window,
            on_error: None,
            rule: Box::new(rule),
            counters: Counters::new(),
        });
        self
    }

    /// Which headers to write.
    pub fn headers(self, headers: HeaderOptions) -> Self {
        RateLimitLayerBuilder { headers, ..self }
    }

    /// The status for a request that can never fit (429 by default; 413 or 400 are
    /// common choices). It must be a client or server error (4xx or 5xx):
    /// [`build`](Self::build) refuses any other.
    pub fn never_status(self, status: StatusCode) -> Self {
        RateLimitLayerBuilder {
            never_status: status,
            ..self
        }
    }

    /// What to do when a limiter fails (a rule may override it:
    /// [`Rule::on_limiter_error`]).
    pub fn on_limiter_error(self, on_error: OnLimiterError) -> Self {
        RateLimitLayerBuilder { on_error, ..self }
    }

    /// Whether to insert a [`RateLimitOutcomes`] into the extensions of every request
    /// the layer passes on, so the inner service (a handler) can read what each rule
    /// decided. Off by default, and then it costs nothing: no allocation, no insert.
    /// On, it costs one allocation per passed request (the list; rule names are
    /// shared with the layer).
    ///
    /// # Examples
    ///
    /// ```
    /// use axum::{routing::get, Extension, Router};
    /// use floodgate::{Policy, RateLimiter};
    /// use floodgate_http::{Global, RateLimitLayer, RateLimitOutcomes, Rule};
    ///
    /// async fn hello(Extension(outcomes): Extension<RateLimitOutcomes>) -> String {
    ///     match outcomes.get("global") {
    ///         Some(o) => format!("hello; {} left this second\n", o.decision.remaining()),
    ///         None => "hello\n".to_owned(),
    ///     }
    /// }
    ///
    /// let global = RateLimiter::gcra(Policy::per_second(1_000)?);
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::new("global", global, Global)?)
    ///     .publish_outcomes(true)
    ///     .build()?;
    /// let app: Router = Router::new().route("/", get(hello)).layer(layer);
    /// # let _ = app;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn publish_outcomes(self, on: bool) -> Self {
        RateLimitLayerBuilder {
            publish_outcomes: on,
            ..self
        }
    }

    /// Where the refunds of a dropped request's remote charges run.
    ///
    /// A request whose response future is dropped before it reaches the inner
    /// service (the client went away, a timeout layer fired, while a later rule
    /// made it wait: a queue's slot, a slow remote limiter) is charged nowhere: its
    /// in-process charges are given back at once, and its remote charges
    /// ([`Rule::remote`], [`AsyncLimit::refund`]) by a [`RefundTask`] handed to
    /// `spawn` — nothing awaits the dropped future any more. So are the refunds of
    /// a rejected request (429, 400, 503) still under way when its future is
    /// dropped during their round trips: they go on in the task. `spawn` should run
    /// the task to its end (`tokio::spawn` does); a task dropped unfinished (by
    /// `spawn`, or by a runtime shutting down) leaves the charges it had not given
    /// back taken, each counted in its rule's `errors` by the task's own drop (a
    /// refund dropped during its round trip is counted, though the limiter may have
    /// made it).
    ///
    /// Without this call, with feature `queue` the task is spawned on the Tokio
    /// runtime the future is dropped in
    /// (`tokio::runtime::Handle::try_current`); where there is none (dropped on a
    /// thread outside a runtime, or the feature off), the refunds are not run:
    /// those charges stay taken, each counted in its rule's `errors` (and logged
    /// with feature `tracing`), and nothing panics. The same when `spawn` panics
    /// (`tokio::spawn`, as below, where the future is dropped outside a runtime):
    /// the panic is caught, never unwinding out of the drop (a task the spawner
    /// kept before panicking still runs, and counts only what it does not give
    /// back). A runtime that is shutting down drops a task spawned on it: the
    /// charges it had not given back stay taken, counted in `errors`; so does a
    /// refund that panics inside the task.
    ///
    /// The tasks in flight are bounded per layer
    /// ([`max_refund_tasks`](RateLimitLayerBuilder::max_refund_tasks), 4096 by
    /// default): a flood of clients that go away while charged makes at most that
    /// many tasks at once, each within its limiters' timeouts; beyond it a
    /// dropped request's refunds are not spawned, its charges stay taken, counted
    /// in `errors`.
    ///
    /// A remote charge still under way when the future is dropped (its round trip
    /// sent, no reply yet) has no receipt to give back: if the limiter took it, it
    /// stays taken. Only the charges already made are refunded.
    ///
    /// An admitted request pays nothing for this (no allocation, no atomic
    /// operation); a rejected one, one `Arc` clone per remote refund; a dropped one
    /// holding remote charges, the task (and, on the layer's count of tasks in
    /// flight, a compare-and-swap to take a place, retried under contention, and a
    /// subtraction to give it back).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Policy, RateLimiter};
    /// use floodgate_http::{Global, RateLimitLayer, Rule};
    /// let global = RateLimiter::gcra(Policy::per_second(1_000)?);
    /// let layer = RateLimitLayer::builder()
    ///     // In production a `floodgate_redis::RedisLimiter` with refunds on.
    ///     .rule(Rule::remote("global", global, Global)?)
    ///     .refund_spawner(|task| {
    ///         tokio::spawn(task);
    ///     })
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund_spawner<F>(self, spawn: F) -> Self
    where
        F: Fn(RefundTask) + Send + Sync + 'static,
    {
        RateLimitLayerBuilder {
            spawner: Some(Arc::new(spawn)),
            ..self
        }
    }

    /// The most refund tasks of dropped requests in flight at once (see
    /// [`refund_spawner`](RateLimitLayerBuilder::refund_spawner)); 4096 by default.
    ///
    /// A task holds its place from the drop that makes it until it is dropped
    /// itself: run to its end, dropped unrun by its spawner, dropped part-way by a
    /// runtime shutting down, or after a refund panicked in it. With `max` tasks in
    /// flight, a request dropped holding remote charges is not given them back:
    /// they stay taken (never an admission beyond a limit), each counted in its
    /// rule's `errors` (and logged with feature `tracing`). This bounds the tasks,
    /// and the memory and round trips they hold, under a flood of clients that go
    /// away while charged (a slow backend holds each task for up to its limiters'
    /// timeouts). `0` spawns none: every such charge stays taken, counted.
    ///
    /// The count is one atomic per layer, touched only when a dropped request has
    /// remote charges to give back: nothing on the admit path.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Policy, RateLimiter};
    /// use floodgate_http::{Global, RateLimitLayer, Rule};
    /// let global = RateLimiter::gcra(Policy::per_second(1_000)?);
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::remote("global", global, Global)?)
    ///     .max_refund_tasks(1_000)
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn max_refund_tasks(self, max: usize) -> Self {
        RateLimitLayerBuilder {
            max_refund_tasks: max,
            ..self
        }
    }

    /// The layer.
    ///
    /// # Errors
    ///
    /// [`ConfigError::DuplicateRule`] when two rules share a name;
    /// [`ConfigError::NeverStatus`] when the never-fits status is not a 4xx or 5xx;
    /// [`ConfigError::Cost`] when a rule's cost is more than its limiter ever admits
    /// at once (see [`Rule::cost`]), judged under the limiter's policy as it is at
    /// this call; [`ConfigError::PlanCost`] when it is more than every one of a
    /// [`PlanLimiter`]'s plans admits, judged under each plan's policy as it is at
    /// this call.
    ///
    /// A layer without rules is valid: it passes every request unchanged and writes
    /// no header.
    pub fn build(self) -> Result<RateLimitLayer, ConfigError> {
        if !(self.never_status.is_client_error() || self.never_status.is_server_error()) {
            return Err(ConfigError::NeverStatus {
                status: self.never_status.as_u16(),
            });
        }
        for (i, r) in self.rules.iter().enumerate() {
            if self.rules[..i].iter().any(|o| o.name == r.name) {
                return Err(ConfigError::DuplicateRule {
                    name: r.name.as_str().to_owned(),
                });
            }
            if let Some((cost, plan, capacity)) = r.rule.never_fits_plan() {
                return Err(ConfigError::PlanCost {
                    rule: r.name.as_str().to_owned(),
                    plan,
                    cost,
                    capacity,
                });
            }
            if let Some((cost, capacity)) = r.rule.never_fits() {
                return Err(ConfigError::Cost {
                    rule: r.name.as_str().to_owned(),
                    cost,
                    capacity,
                });
            }
        }
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                rules: self.rules.into_boxed_slice(),
                headers: self.headers,
                never_status: self.never_status,
                on_error: self.on_error,
                publish_outcomes: self.publish_outcomes,
                spawner: self.spawner,
                refund_tasks: RefundTasks::new(self.max_refund_tasks),
            }),
        })
    }
}

impl RateLimitLayer {
    /// A builder with no rules, both header families, never-fits status 429, and
    /// fail-closed on limiter errors.
    pub fn builder() -> RateLimitLayerBuilder {
        RateLimitLayerBuilder {
            rules: Vec::new(),
            headers: HeaderOptions::default(),
            never_status: StatusCode::TOO_MANY_REQUESTS,
            on_error: OnLimiterError::FailClosed,
            publish_outcomes: false,
            spawner: None,
            max_refund_tasks: DEFAULT_MAX_REFUND_TASKS,
        }
    }

    /// The counters of every rule, in rule order.
    pub fn stats(&self) -> Vec<RuleStats> {
        self.shared
            .rules
            .iter()
            .map(|r| r.counters.read(&r.name))
            .collect()
    }

    /// The counters of the rule named `name`.
    pub fn rule_stats(&self, name: &str) -> Option<RuleStats> {
        self.shared
            .rules
            .iter()
            .find(|r| r.name.as_str() == name)
            .map(|r| r.counters.read(&r.name))
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimitService<S>;

    fn layer(&self, inner: S) -> RateLimitService<S> {
        RateLimitService {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The [`Service`] a [`RateLimitLayer`] wraps around `S`.
#[derive(Clone)]
pub struct RateLimitService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: fmt::Debug> fmt::Debug for RateLimitService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S> RateLimitService<S> {
    /// The counters of every rule, in rule order.
    pub fn stats(&self) -> Vec<RuleStats> {
        RateLimitLayer {
            shared: Arc::clone(&self.shared),
        }
        .stats()
    }
}

/// The future of [`RateLimitService::call`].
pub type ResponseFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<RateLimitBody<B>>, E>> + Send>>;

/// One visible rule's numbers for the headers.
#[derive(Clone, Copy)]
struct Shown {
    rule: usize,
    decision: Decision,
    partition_key: Option<[u8; 16]>,
    /// The advertised window: the rule's configured one, else its limiter's for the
    /// request's key.
    window: Option<u64>,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimitService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The clone is the one that is not yet ready; the ready one serves this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let (mut parts, body) = req.into_parts();
            let mut verdict = decide(&shared, &parts).await;
            if let Some(reply) = verdict.reply.take() {
                let mut resp = respond(&parts, &verdict, reply);
                render(&shared, &verdict, resp.headers_mut());
                return Ok(resp);
            }
            if shared.publish_outcomes {
                parts.extensions.insert(RateLimitOutcomes {
                    shared: Arc::clone(&shared),
                    decided: core::mem::take(&mut verdict.decided),
                });
            }
            let resp = inner.call(Request::from_parts(parts, body)).await?;
            let (mut head, body) = resp.into_parts();
            // The layer's fields replace (or, kept, combine with) any of the same
            // names the inner service set.
            render(&shared, &verdict, &mut head.headers);
            Ok(Response::from_parts(head, RateLimitBody::inner(body)))
        })
    }
}

/// What the rules decided for one request.
struct Verdict {
    shown: Vec<Shown>,
    /// Every rule that decided, for [`RateLimitOutcomes`]; left empty (unallocated)
    /// unless the layer publishes them.
    decided: Vec<Decided>,
    exceeded: Vec<usize>,
    /// The hard denial that stopped the walk.
    denial: Option<Shown>,
    /// The layer's own answer (429, never-fits, 400, 503).
    reply: Option<Reply>,
}

/// The layer's own answer to a request it does not pass on.
pub(crate) struct Reply {
    /// The HTTP status (429, the never-fits status, 400 or 503).
    pub(crate) status: StatusCode,
    /// A one-line explanation, ending in a newline.
    pub(crate) text: String,
}

async fn decide(shared: &Arc<Shared>, parts: &Parts) -> Verdict {
    let mut v = Verdict {
        shown: Vec::with_capacity(shared.rules.len()),
        decided: if shared.publish_outcomes {
            Vec::with_capacity(shared.rules.len())
        } else {
            Vec::new()
        },
        exceeded: Vec::new(),
        denial: None,
        reply: None,
    };
    let hasher = shared.headers.partition_key.as_ref();
    let mut held = Held {
        shared,
        parts,
        receipts: Vec::new(),
        remote: Vec::new(),
    };
    for (i, entry) in shared.rules.iter().enumerate() {
        let started = entry.rule.start(parts, hasher);
        // Soft and shadow rules never block: a missing key or a failed limiter skips
        // them whatever `OnMissingKey` and `OnLimiterError` say.
        let blocks = entry.strategy == Strategy::Hard;
        if let Some(e) = &started.key_error {
            entry.counters.bump(Count::BadKey);
            if started.check.is_none() && blocks {
                let text = format!("{e} (rate limit \"{}\")\n", entry.name);
                v.reply = Some(Reply {
                    status: StatusCode::BAD_REQUEST,
                    text,
                });
                held.give_back(&mut v.shown);
                held.give_back_remote().await;
                return v;
            }
        }
        let Some(check) = started.check else {
            continue;
        };
        let Check {
            decision,
            receipt,
            queued,
        } = match check.await {
            Ok(c) => c,
            Err(_error) => {
                entry.counters.bump(Count::Error);
                #[cfg(feature = "tracing")]
                tracing::warn!(rule = %entry.name, error = %_error, "rate limiter failed");
                match entry.on_error.unwrap_or(shared.on_error) {
                    OnLimiterError::FailClosed if blocks => {
                        let text = format!("rate limit \"{}\" is unavailable\n", entry.name);
                        v.reply = Some(Reply {
                            status: StatusCode::SERVICE_UNAVAILABLE,
                            text,
                        });
                        held.give_back(&mut v.shown);
                        held.give_back_remote().await;
                        return v;
                    }
                    _ => continue,
                }
            }
        };
        let shown = Shown {
            rule: i,
            decision,
            partition_key: started.partition_key,
            window: entry.window.or(started.window),
        };
        if shared.publish_outcomes {
            v.decided.push(Decided {
                rule: i,
                decision,
                queued,
            });
        }
        if decision.is_allowed() {
            entry.counters.bump(Count::Allowed);
            if queued {
                entry.counters.bump(Count::Queued);
            }
            match receipt {
                Some(RuleReceipt::InProcess(r)) if r.is_charged() => held.receipts.push((i, r)),
                Some(RuleReceipt::Remote(r)) if r.is_charged() => held.remote.push((i, r)),
                _ => {}
            }
        } else {
            match entry.strategy {
                Strategy::Hard => {
                    entry.counters.bump(Count::Denied);
                    held.give_back(&mut v.shown);
                    held.give_back_remote().await;
                    v.shown.push(shown);
                    // The 429 speaks for the rule that holds the request back longest:
                    // a later hard rule already spent would deny the retry too.
                    let (shown, entry) = later_denials(shared, parts, i, shown, &mut v.shown);
                    // The answer is the longest denial's: its status and body as well
                    // as its `Retry-After` ("never" when a later rule never fits).
                    let answered = shown.decision;
                    #[cfg(feature = "tracing")]
                    tracing::info!(
                        rule = %entry.name,
                        retry_after_secs = ?answered.retry_after_secs(),
                        "request denied"
                    );
                    let (status, text) = match answered.retry_after_secs() {
                        Some(secs) => (
                            StatusCode::TOO_MANY_REQUESTS,
                            format!(
                                "rate limit \"{}\" exceeded; retry after {secs} s\n",
                                entry.name
                            ),
                        ),
                        None => (
                            shared.never_status,
                            format!(
                                "rate limit \"{}\": this request costs more than the limit's capacity and can never be admitted\n",
                                entry.name
                            ),
                        ),
                    };
                    v.reply = Some(Reply { status, text });
                    v.denial = Some(shown);
                    return v;
                }
                Strategy::Soft => {
                    entry.counters.bump(Count::Soft);
                    v.exceeded.push(i);
                }
                Strategy::Shadow => {
                    entry.counters.bump(Count::Shadow);
                    #[cfg(feature = "tracing")]
                    tracing::debug!(rule = %entry.name, "shadow rule would deny");
                }
            }
        }
        let visible = match entry.strategy {
            Strategy::Hard => true,
            Strategy::Soft => shared.headers.soft,
            Strategy::Shadow => shared.headers.shadow,
        };
        if visible {
            v.shown.push(shown);
        }
    }
    held.keep();
    v
}

/// After rule `denied` denied a request (`denial`): the hard in-process rules after
/// it, peeked without a charge ([`ErasedRule::peek_later`]), each that would deny
/// too shown in `shown` as it is (those that would admit stay out, as before);
/// returns the denial to answer with — the longest wait of them all
/// ("never" longest), the first on a tie, as
/// [`check_all`](floodgate::keyed::composite::check_all) picks, with the least
/// `remaining` of the hard rules the request met (the earlier ones in `shown` as
/// they now are, the denial, and every later one peeked, admitting or not: at a
/// cost above 1 a rule denies with up to cost − 1 units left, which another rule
/// may not have) — and its rule.
fn later_denials<'s>(
    shared: &'s Shared,
    parts: &Parts,
    denied: usize,
    denial: Shown,
    shown: &mut Vec<Shown>,
) -> (Shown, &'s RuleEntry) {
    let wait = |d: &Decision| d.retry_after_nanos().unwrap_or(u64::MAX);
    let hasher = shared.headers.partition_key.as_ref();
    // The least `remaining` of every hard rule the request met, not only of those
    // that deny: an earlier remote rule is shown as of its check (its charge
    // counted, even when refunded since), and a rule charging less
    // than the denier may admit with fewer units than the denier has left.
    let mut least = shown
        .iter()
        .filter(|s| shared.rules[s.rule].strategy == Strategy::Hard)
        .fold(denial.decision.remaining(), |least, s| {
            least.min(s.decision.remaining())
        });
    let mut longest = denial;
    for (j, entry) in shared.rules.iter().enumerate().skip(denied + 1) {
        if entry.strategy != Strategy::Hard {
            continue;
        }
        let Some(peeked) = entry.rule.peek_later(parts, hasher) else {
            continue;
        };
        least = least.min(peeked.state.remaining());
        if peeked.at_cost.is_allowed() {
            continue;
        }
        let window = entry.window.or(peeked.window);
        shown.push(Shown {
            rule: j,
            decision: peeked.state,
            partition_key: peeked.partition_key,
            window,
        });
        if wait(&peeked.at_cost) > wait(&longest.decision) {
            longest = Shown {
                rule: j,
                decision: peeked.at_cost,
                partition_key: peeked.partition_key,
                window,
            };
        }
    }
    let d = longest.decision;
    if least < d.remaining() {
        // Only `remaining` changes: the rule that denied keeps its id.
        longest.decision = Decision::new(false, d.limit(), least, d.reset_after(), d.retry_after())
            .with_policy(d.policy());
    }
    (longest, &shared.rules[longest.rule])
}

/// One rule's decision for a passed request, as [`RateLimitOutcomes`] keeps it.
#[derive(Clone, Copy)]
struct Decided {
    rule: usize,
    decision: Decision,
    queued: bool,
}

/// What each rule decided for a request the layer passed on, in rule order: inserted
/// into the request's extensions when the layer is built with
/// [`publish_outcomes`](RateLimitLayerBuilder::publish_outcomes), so the inner
/// service (an axum handler, through `Extension<RateLimitOutcomes>`) can read it.
///
/// A rule is listed when it decided: every hard rule (each admitted the request, or
/// it would not have been passed on), and each soft or shadow rule that was checked,
/// admitting or (for a soft or shadow rule) denying. A rule is absent when it was
/// skipped: a soft or shadow rule without its key, or a rule whose limiter failed
/// and which [`OnLimiterError::FailOpen`] let through. A request the layer answers
/// itself (429, 400, 503) never reaches the inner service, so it carries none.
///
/// The key is not listed: keys have each rule's own type. A handler that needs it
/// runs the rule's extractor on the request head, which gives the same key the
/// layer used ([`KeyExtractor::extract`] is a function of the head alone), typed.
///
/// # Examples
///
/// ```
/// use floodgate::{Policy, RateLimiter};
/// use floodgate_http::{Global, RateLimitLayer, RateLimitOutcomes, Rule, Strategy};
/// use std::convert::Infallible;
/// use tower::{service_fn, Layer, Service, ServiceExt};
///
/// let layer = RateLimitLayer::builder()
///     .rule(Rule::new("global", RateLimiter::gcra(Policy::per_second(1)?), Global)?)
///     .rule(
///         Rule::new("trial", RateLimiter::gcra(Policy::per_hour(1)?), Global)?
///             .strategy(Strategy::Shadow),
///     )
///     .publish_outcomes(true)
///     .build()?;
/// let mut svc = layer.layer(service_fn(|req: http::Request<()>| async move {
///     let outcomes = req.extensions().get::<RateLimitOutcomes>().expect("published");
///     let trial = outcomes.get("trial").expect("decided");
///     assert_eq!(trial.strategy, Strategy::Shadow);
///     assert_eq!(trial.decision.remaining(), 0);
///     Ok::<_, Infallible>(http::Response::new(trial.decision.remaining().to_string()))
/// }));
/// let rt = tokio::runtime::Builder::new_current_thread().build()?;
/// rt.block_on(async { svc.ready().await?.call(http::Request::new(())).await })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct RateLimitOutcomes {
    shared: Arc<Shared>,
    decided: Vec<Decided>,
}

impl RateLimitOutcomes {
    /// Each rule that decided, in rule order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = RuleOutcome<'_>> + '_ {
        self.decided.iter().map(|d| {
            let entry = &self.shared.rules[d.rule];
            RuleOutcome {
                name: entry.name.as_str(),
                strategy: entry.strategy,
                decision: d.decision,
                queued: d.queued,
            }
        })
    }

    /// What the rule named `name` decided, if it decided.
    pub fn get(&self, name: &str) -> Option<RuleOutcome<'_>> {
        self.iter().find(|o| o.name == name)
    }

    /// How many rules decided.
    pub fn len(&self) -> usize {
        self.decided.len()
    }

    /// Whether no rule decided (a layer without rules, or every rule skipped).
    pub fn is_empty(&self) -> bool {
        self.decided.is_empty()
    }
}

impl fmt::Debug for RateLimitOutcomes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// One rule's decision for a passed request: see [`RateLimitOutcomes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RuleOutcome<'a> {
    /// The rule's name.
    pub name: &'a str,
    /// The rule's strategy: a denial here is a soft or shadow rule's.
    pub strategy: Strategy,
    /// The rule's decision, as the headers show it.
    pub decision: Decision,
    /// The request waited in the rule's queue for its slot (the queueing rules).
    pub queued: bool,
}

/// The receipts of the rules that admitted (and so charged) a request.
///
/// All or nothing: a request the layer rejects (429, 400, 503) is charged nowhere,
/// and neither is one whose future is dropped before the inner service is called
/// (the client went away, or a timeout fired, while it waited for a queue's slot or
/// a remote limiter): the charges are given back unless [kept](Held::keep) — the
/// in-process ones at once, the remote ones by a spawned [`RefundTask`].
struct Held<'a> {
    shared: &'a Arc<Shared>,
    parts: &'a Parts,
    receipts: Vec<(usize, Receipt)>,
    /// The remote rules' receipts ([`AsyncLimit::charge_n`]): given back on a
    /// rejection by [`give_back_remote`](Held::give_back_remote), on a drop (the
    /// request's future dropped) by [`spawn_refunds`].
    remote: Vec<(usize, AsyncReceipt)>,
}

impl Held<'_> {
    /// Gives every charge back; `shown` then holds each refunded rule as it is after
    /// its refund.
    fn give_back(&mut self, shown: &mut [Shown]) {
        for (j, receipt) in self.receipts.drain(..) {
            let entry = &self.shared.rules[j];
            if let Some((after, window)) = entry.rule.refund_with_window(self.parts, receipt) {
                for s in shown.iter_mut().filter(|s| s.rule == j) {
                    s.decision = after;
                    // The window of the state after the refund (a plan's: the plan
                    // that charged, its policy now), unless the rule has its own.
                    s.window = entry.window.or(window).or(s.window);
                }
            }
        }
    }

    /// The refunds of every remote charge held ([`ErasedRule::refund_remote`]),
    /// each with its rule.
    fn remote_refunds(&mut self) -> Vec<(usize, RemoteRefund)> {
        let mut refunds = Vec::new();
        for (j, receipt) in self.remote.drain(..) {
            let rule = &self.shared.rules[j].rule;
            if let Some(refund) = rule.refund_remote(self.parts, receipt) {
                refunds.push((j, refund));
            }
        }
        refunds
    }

    /// Gives every remote charge back ([`AsyncLimit::refund`]), the round trips at
    /// once, each within its limiter's own timeout. A refund that fails is counted
    /// in its rule's `errors` (and logged with feature `tracing`); it changes
    /// nothing else in the answer. Dropped before they end (the client went away
    /// during the round trips), the refunds still under way are spawned
    /// ([`Refunds`]).
    async fn give_back_remote(&mut self) {
        let pending = self.remote_refunds();
        Refunds {
            shared: self.shared,
            pending,
        }
        .run()
        .await;
    }

    /// The request goes on to the inner service: every charge stays taken.
    fn keep(mut self) {
        self.receipts.clear();
        self.remote.clear();
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.give_back(&mut []);
        if !self.remote.is_empty() {
            // The request was dropped holding remote charges.
            let pending = self.remote_refunds();
            spawn_refunds(self.shared, pending);
        }
    }
}

/// Remote refunds under way ([`ErasedRule::refund_remote`]), each with its rule,
/// awaited by a rejected request.
///
/// Dropped before they all end (the request's future dropped during the round
/// trips), those still under way are spawned ([`spawn_refunds`]).
struct Refunds<'a> {
    shared: &'a Arc<Shared>,
    pending: Vec<(usize, RemoteRefund)>,
}

impl Refunds<'_> {
    /// Runs every refund at once to its end; a refund that fails is counted in its
    /// rule's `errors` (and logged with feature `tracing`).
    async fn run(&mut self) {
        core::future::poll_fn(|cx| poll_refunds(self.shared, &mut self.pending, cx)).await;
    }
}

impl Drop for Refunds<'_> {
    fn drop(&mut self) {
        spawn_refunds(self.shared, core::mem::take(&mut self.pending));
    }
}

/// Polls every refund in `pending` once, removing those that ended (a failure
/// counted in its rule's `errors`, and logged with feature `tracing`); ready when
/// none is left.
fn poll_refunds(
    shared: &Shared,
    pending: &mut Vec<(usize, RemoteRefund)>,
    cx: &mut Context<'_>,
) -> Poll<()> {
    pending.retain_mut(|(j, refund)| {
        let Poll::Ready(outcome) = refund.as_mut().poll(cx) else {
            return true;
        };
        if let Err(_error) = outcome {
            let entry = &shared.rules[*j];
            entry.counters.bump(Count::Error);
            #[cfg(feature = "tracing")]
            tracing::warn!(rule = %entry.name, error = %_error, "refund failed");
        }
        false
    });
    if pending.is_empty() {
        Poll::Ready(())
    } else {
        Poll::Pending
    }
}

/// The refund tasks of one layer in flight, and their cap
/// ([`RateLimitLayerBuilder::max_refund_tasks`]).
///
/// # Memory ordering
///
/// `Relaxed` throughout: the count orders no other memory (a task's refunds
/// carry their own state), and the cap holds exactly all the same — every
/// read-modify-write of one atomic reads the latest value in its modification
/// order, so no two tasks can take the last place.
struct RefundTasks {
    /// Padded: written only on the drop path, away from the fields every request
    /// reads.
    in_flight: CachePadded<AtomicUsize>,
    max: usize,
}

impl RefundTasks {
    fn new(max: usize) -> RefundTasks {
        RefundTasks {
            in_flight: CachePadded::new(AtomicUsize::new(0)),
            max,
        }
    }

    /// Takes a place for one more task; `false` at the cap.
    fn try_acquire(&self) -> bool {
        // Relaxed: see the type's docs.
        self.in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max).then_some(n + 1)
            })
            .is_ok()
    }

    /// Gives back a place [`try_acquire`](RefundTasks::try_acquire) took.
    fn release(&self) {
        // Relaxed: see the type's docs. Never below 0: only a place taken is given
        // back, once ([`SpawnedRefunds`]' drop).
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The refunds of a request that is gone, as the task nothing awaits
/// ([`RefundTask`]): it holds one of the layer's places for refund tasks
/// ([`RefundTasks`]) from its making to its drop.
///
/// However it ends — run to its end, dropped unrun or part-way (a spawner that
/// refuses it, a runtime shutting down, no runtime at all), or dropped after a
/// refund panicked in its poll — its drop gives the place back and counts each
/// refund it had not seen end in its rule's `errors`: those charges stay taken
/// (but one whose round trip was under way may have reached the limiter). Never
/// spawned again.
struct SpawnedRefunds {
    shared: Arc<Shared>,
    pending: Vec<(usize, RemoteRefund)>,
}

impl SpawnedRefunds {
    /// The task for `pending`, or `pending` back when the layer's refund tasks are
    /// at their cap.
    fn new(
        shared: &Arc<Shared>,
        pending: Vec<(usize, RemoteRefund)>,
    ) -> Result<SpawnedRefunds, Vec<(usize, RemoteRefund)>> {
        if !shared.refund_tasks.try_acquire() {
            return Err(pending);
        }
        Ok(SpawnedRefunds {
            shared: Arc::clone(shared),
            pending,
        })
    }
}

impl Future for SpawnedRefunds {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        poll_refunds(&this.shared, &mut this.pending, cx)
    }
}

impl Drop for SpawnedRefunds {
    fn drop(&mut self) {
        // A refund that panicked in its poll is still here (`retain_mut` keeps the
        // element it was judging): not made, counted with the rest. Counted, and
        // the place given back, before any refund future is dropped (by the
        // field's own drop, after this): a limiter's future that panics when
        // dropped can then leak neither a count nor the place.
        for (j, _) in &self.pending {
            let entry = &self.shared.rules[*j];
            entry.counters.bump(Count::Error);
            #[cfg(feature = "tracing")]
            tracing::warn!(
                rule = %entry.name,
                "a dropped request's refund did not run to its end: its task was dropped (no refund spawner and no Tokio runtime, a spawner that refused it or panicked, a runtime shutting down, or a refund that panicked)"
            );
        }
        self.shared.refund_tasks.release();
    }
}

/// Runs `pending`, the refunds of a request that is gone, in a task nothing awaits:
/// on the layer's spawner ([`RateLimitLayerBuilder::refund_spawner`]), else on
/// Tokio's current runtime (feature `queue`). Where none runs it to its end (the
/// layer's refund tasks at their cap, no runtime, the spawner panicked or dropped
/// it, the runtime shut down), each refund not seen to end is counted in its
/// rule's `errors` (its charge stays taken, unless its round trip was under way
/// and reached the limiter).
fn spawn_refunds(shared: &Arc<Shared>, pending: Vec<(usize, RemoteRefund)>) {
    if pending.is_empty() {
        return;
    }
    match SpawnedRefunds::new(shared, pending) {
        // A task that is not run counts its refunds in its drop.
        Ok(task) => spawn(shared.spawner.as_deref(), Box::pin(task)),
        Err(refused) => {
            // At the cap: the charges stay taken, counted as failed refunds.
            for (j, _) in &refused {
                let entry = &shared.rules[*j];
                entry.counters.bump(Count::Error);
                #[cfg(feature = "tracing")]
                tracing::warn!(
                    rule = %entry.name,
                    max = shared.refund_tasks.max,
                    "a dropped request's refund was not spawned: the layer's refund tasks are at their cap"
                );
            }
            drop_contained(refused);
        }
    }
}

/// Drops `refunds` (unrun), catching a panic a limiter's future makes in its drop:
/// this runs in a drop, where a panic would unwind out of the dropped response
/// future (or abort, were it already unwinding). What they held is counted
/// already.
fn drop_contained<T>(refunds: T) {
    let _panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(refunds)));
}

/// Hands `task` to `spawner`, else to Tokio's current runtime (feature `queue`);
/// where nothing can run it, drops it (its drop counts its refunds as not made;
/// a panic in a refund future's own drop is caught: [`drop_contained`]).
///
/// A spawner that panics (`tokio::spawn` outside a runtime) is caught: this runs in
/// a drop, where a panic would unwind out of the dropped response future (or abort,
/// were it already unwinding). Whether the spawner kept the task or dropped it, the
/// task counts what it does not give back.
fn spawn(spawner: Option<&Spawner>, task: RefundTask) {
    if let Some(spawn) = spawner {
        let _panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || spawn(task)));
        return;
    }
    #[cfg(feature = "queue")]
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        drop(runtime.spawn(task));
        return;
    }
    drop_contained(task);
}

/// The response for the layer's own answer: `text/plain`, or, to a gRPC request
/// (feature `grpc`), the gRPC status that says the same.
fn respond<B>(parts: &Parts, v: &Verdict, reply: Reply) -> Response<RateLimitBody<B>> {
    #[cfg(feature = "grpc")]
    if crate::grpc::is_grpc(&parts.headers) {
        return crate::grpc::respond(v.denial.as_ref().map(|d| &d.decision), reply);
    }
    let _ = (parts, v);
    let mut resp = Response::new(RateLimitBody::reply(Bytes::from(reply.text)));
    *resp.status_mut() = reply.status;
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// Writes the configured header families for `v` into `out`: all their values in one
/// buffer, one allocation for the lot ([`ResponseFields`]).
fn render(shared: &Shared, v: &Verdict, out: &mut HeaderMap) {
    let opts = &shared.headers;
    let visible = (opts.legacy.is_some() || opts.ietf) && !v.shown.is_empty();
    if !visible && v.denial.is_none() && v.exceeded.is_empty() {
        // Nothing to write: not even the buffer is set up.
        return;
    }
    let mut fields = ResponseFields::new();
    if let Some(d) = &v.denial {
        fields.retry_after(&d.decision);
    }
    if let Some(format) = opts.legacy {
        let pick = v.denial.as_ref().or_else(|| {
            v.shown.iter().min_by(|a, b| {
                let (a, b) = (&a.decision, &b.decision);
                a.remaining()
                    .cmp(&b.remaining())
                    .then(b.reset_after().cmp(&a.reset_after()))
            })
        });
        if let Some(s) = pick {
            let now = match format {
                ResetFormat::UnixEpoch => SystemTime::now(),
                _ => SystemTime::UNIX_EPOCH,
            };
            fields.legacy(&s.decision, format, now);
        }
    }
    if opts.ietf && !v.shown.is_empty() {
        for s in &v.shown {
            let rule = &shared.rules[s.rule];
            write_policy_member(
                fields.value(),
                &PolicyItem {
                    name: &rule.name,
                    quota: s.decision.limit(),
                    window: s.window,
                    partition_key: s.partition_key.as_ref().map(|k| &k[..]),
                },
            );
        }
        fields.finish(Field::Policy);
        for s in &v.shown {
            let rule = &shared.rules[s.rule];
            write_limit_member(
                fields.value(),
                &LimitItem {
                    partition_key: s.partition_key.as_ref().map(|k| &k[..]),
                    ..LimitItem::from_decision(&rule.name, &s.decision)
                },
            );
        }
        fields.finish(Field::RateLimit);
    }
    if !v.exceeded.is_empty() {
        for &i in &v.exceeded {
            write_name_member(fields.value(), &shared.rules[i].name);
        }
        fields.finish(Field::Exceeded);
    }
    fields.insert_into(out, opts.keep_service);
}
