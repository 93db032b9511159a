//! Per-key quotas: a table of named plans, a resolver from key to plan, and runtime
//! quota changes that keep every key's state.
//!
//! ```
//! use floodgate::keyed::plans::{PlanLimiter, Plans};
//! use floodgate::{KeyedBuilder, ManualClock, Policy};
//!
//! let plans = Plans::classic(); // free 100/day burst 10, pro 10 000/day burst 100, enterprise 1 000 000/day burst 1 000
//! let pro = plans.id("pro").unwrap();
//! let free = plans.id("free").unwrap();
//! let limiter = PlanLimiter::new(
//!     &plans,
//!     move |api_key: &String| if api_key.starts_with("pro_") { pro } else { free },
//!     KeyedBuilder::default().clock(ManualClock::new()),
//! )?;
//! assert_eq!(limiter.check(&"pro_42".to_owned()).limit(), 100);
//! assert_eq!(limiter.check(&"anon".to_owned()).limit(), 10);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Changing a quota at runtime
//!
//! [`PlanLimiter::set_policy`] swaps a plan's policy while requests run. Every key
//! keeps its GCRA state (its theoretical arrival time): the new emission interval
//! applies from the next decision on, and `remaining` is clamped to `[0, B]` of the
//! new burst — the rule every runtime policy change in this crate follows for GCRA
//! ([`Algorithm::carry_over`](crate::Algorithm::carry_over)). The change itself
//! neither forgives nor charges anything: a key that had used more than the new
//! burst allows is denied until its schedule catches up. Each plan's policy sits in
//! a per-plan sequence lock (four words); a decision reads it with plain loads and
//! retries only if an update ran at that very moment.

use core::fmt;

use crossbeam_utils::CachePadded;

use super::key::Lookup;
use super::storage::{Heap, Storage};
use super::{KeyedBuilder, KeyedError, KeyedLimiter};
use crate::clock::{Clock, DefaultClock, Nanos};
use crate::decision::Decision;
use crate::gcra::{Gcra, GcraState};
use crate::live::PolicyCell;
use crate::policy::{Policy, PolicyError};
use crate::receipt::Receipt;
use crate::sync::{lock, Mutex};

/// A plan's index in its [`Plans`] table.
///
/// # Examples
///
/// ```
/// let plans = floodgate::keyed::plans::Plans::classic();
/// assert_eq!(plans.name(plans.id("pro").unwrap()), Some("pro"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PlanId(u32);

/// Named policies. The first plan inserted is the default (see
/// [`Plans::set_default`]).
///
/// # Examples
///
/// ```
/// use floodgate::keyed::plans::Plans;
/// use floodgate::Policy;
/// let mut plans = Plans::new();
/// let basic = plans.insert("basic", Policy::per_minute(60)?);
/// assert_eq!(plans.policy(basic), Some(Policy::per_minute(60)?));
/// assert_eq!(plans.default_plan(), Some(basic));
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plans {
    names: Vec<String>,
    policies: Vec<Policy>,
    default: Option<PlanId>,
}

impl Plans {
    /// No plans.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(floodgate::keyed::plans::Plans::new().is_empty());
    /// ```
    pub fn new() -> Plans {
        Plans::default()
    }

    /// The classic table: `free` 100/day burst 10, `pro` 10 000/day burst 100,
    /// `enterprise` 1 000 000/day burst 1 000; `free` is the default.
    ///
    /// # Examples
    ///
    /// ```
    /// let plans = floodgate::keyed::plans::Plans::classic();
    /// let pro = plans.policy(plans.id("pro").unwrap()).unwrap();
    /// assert_eq!((pro.limit(), pro.burst()), (10_000, 100));
    /// ```
    pub fn classic() -> Plans {
        let mut plans = Plans::new();
        for (name, limit, burst) in [
            ("free", 100, 10),
            ("pro", 10_000, 100),
            ("enterprise", 1_000_000, 1_000),
        ] {
            // Valid by construction: a day holds far more than 10^6 nanoseconds.
            if let Ok(policy) = Policy::per_day(limit).and_then(|p| p.with_burst(burst)) {
                plans.insert(name, policy);
            }
        }
        plans
    }

    /// Adds a plan or replaces the policy of one with the same name.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::Plans;
    /// use floodgate::Policy;
    /// let mut plans = Plans::classic();
    /// let free = plans.insert("free", Policy::per_day(50)?);
    /// assert_eq!(plans.policy(free).unwrap().limit(), 50);
    /// assert_eq!(plans.len(), 3);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn insert(&mut self, name: &str, policy: Policy) -> PlanId {
        if let Some(id) = self.id(name) {
            self.policies[id.0 as usize] = policy;
            return id;
        }
        let id = PlanId(self.names.len() as u32);
        self.names.push(name.to_owned());
        self.policies.push(policy);
        self.default.get_or_insert(id);
        id
    }

    /// Makes `name` the default plan (what an unknown [`PlanId`] resolves to).
    ///
    /// # Errors
    ///
    /// [`PlansError::UnknownPlan`] if there is no such plan.
    ///
    /// # Examples
    ///
    /// ```
    /// let mut plans = floodgate::keyed::plans::Plans::classic();
    /// plans.set_default("pro")?;
    /// assert_eq!(plans.default_plan(), plans.id("pro"));
    /// # Ok::<(), floodgate::keyed::plans::PlansError>(())
    /// ```
    pub fn set_default(&mut self, name: &str) -> Result<(), PlansError> {
        let id = self.id(name).ok_or_else(|| PlansError::UnknownPlan {
            name: name.to_owned(),
        })?;
        self.default = Some(id);
        Ok(())
    }

    /// The id of the plan called `name`.
    ///
    /// # Examples
    ///
    /// ```
    /// let plans = floodgate::keyed::plans::Plans::classic();
    /// assert!(plans.id("enterprise").is_some());
    /// assert!(plans.id("platinum").is_none());
    /// ```
    pub fn id(&self, name: &str) -> Option<PlanId> {
        self.names
            .iter()
            .position(|n| n == name)
            .map(|i| PlanId(i as u32))
    }

    /// The name of plan `id`.
    ///
    /// # Examples
    ///
    /// ```
    /// let plans = floodgate::keyed::plans::Plans::classic();
    /// assert_eq!(plans.name(plans.default_plan().unwrap()), Some("free"));
    /// ```
    pub fn name(&self, id: PlanId) -> Option<&str> {
        self.names.get(id.0 as usize).map(String::as_str)
    }

    /// The policy of plan `id`.
    ///
    /// # Examples
    ///
    /// ```
    /// let plans = floodgate::keyed::plans::Plans::classic();
    /// assert_eq!(plans.policy(plans.id("free").unwrap()).unwrap().burst(), 10);
    /// ```
    pub fn policy(&self, id: PlanId) -> Option<Policy> {
        self.policies.get(id.0 as usize).copied()
    }

    /// The default plan (the first inserted unless [`set_default`](Plans::set_default)).
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(floodgate::keyed::plans::Plans::new().default_plan().is_none());
    /// ```
    pub fn default_plan(&self) -> Option<PlanId> {
        self.default
    }

    /// How many plans.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(floodgate::keyed::plans::Plans::classic().len(), 3);
    /// ```
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether there are no plans.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(!floodgate::keyed::plans::Plans::classic().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Every plan: id, name, policy.
    ///
    /// # Examples
    ///
    /// ```
    /// let plans = floodgate::keyed::plans::Plans::classic();
    /// let names: Vec<_> = plans.iter().map(|(_, name, _)| name).collect();
    /// assert_eq!(names, ["free", "pro", "enterprise"]);
    /// ```
    pub fn iter(&self) -> impl Iterator<Item = (PlanId, &str, Policy)> + '_ {
        self.names
            .iter()
            .zip(&self.policies)
            .enumerate()
            .map(|(i, (name, policy))| (PlanId(i as u32), name.as_str(), *policy))
    }
}

impl FromIterator<(String, Policy)> for Plans {
    /// Plans from `(name, policy)` pairs, in order; the first is the default.
    fn from_iter<I: IntoIterator<Item = (String, Policy)>>(iter: I) -> Plans {
        let mut plans = Plans::new();
        for (name, policy) in iter {
            plans.insert(&name, policy);
        }
        plans
    }
}

/// Why plans could not be loaded or used.
///
/// # Examples
///
/// ```
/// use floodgate::keyed::plans::{Plans, PlansError};
/// let err = Plans::classic().set_default("gold").unwrap_err();
/// assert_eq!(err, PlansError::UnknownPlan { name: "gold".into() });
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlansError {
    /// The TOML text is malformed or has the wrong shape.
    Toml {
        /// The parser's message (with line and column).
        message: String,
    },
    /// A plan's `period` is not a duration.
    Period {
        /// The plan.
        plan: String,
        /// What was wrong with it.
        error: crate::duration::DurationError,
    },
    /// A plan's numbers make no valid policy.
    Policy {
        /// The plan.
        plan: String,
        /// What was wrong with it.
        error: PolicyError,
    },
    /// No plan has this name.
    UnknownPlan {
        /// The name asked for.
        name: String,
    },
    /// A plan limiter needs at least one plan.
    NoPlans,
    /// The key table could not be built.
    Keyed(KeyedError),
}

impl fmt::Display for PlansError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlansError::Toml { message } => write!(f, "invalid plans TOML: {message}"),
            PlansError::Period { plan, error } => write!(f, "plan {plan:?}: period: {error}"),
            PlansError::Policy { plan, error } => write!(f, "plan {plan:?}: {error}"),
            PlansError::UnknownPlan { name } => write!(f, "no plan named {name:?}"),
            PlansError::NoPlans => f.write_str("at least one plan is needed"),
            PlansError::Keyed(error) => write!(f, "{error}"),
        }
    }
}

impl std::error::Error for PlansError {}

/// A keyed GCRA limiter whose policy depends on the key's plan.
///
/// See the [module docs](self) for an example and runtime changes.
pub struct PlanLimiter<K, R, C = DefaultClock, S = Heap>
where
    S: Storage<K, GcraState>,
{
    keyed: KeyedLimiter<K, Gcra, C, S>,
    names: Vec<String>,
    cells: Box<[CachePadded<PolicyCell>]>,
    default: usize,
    update: Mutex<()>,
    resolver: R,
}

impl<K, R, C> PlanLimiter<K, R, C>
where
    C: Clock,
    Heap: Storage<K, GcraState>,
{
    /// A limiter for `plans`, mapping keys to plans with `resolver`, with the
    /// capacity, shards and clock of `table` ([`KeyedBuilder::default`]: each key
    /// runs its plan's GCRA, so the table brings no algorithm).
    ///
    /// An id that is not in `plans` resolves to the default plan.
    ///
    /// # Errors
    ///
    /// [`PlansError::NoPlans`] for an empty table, [`PlansError::Keyed`] for a bad
    /// table configuration.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::KeyedBuilder;
    /// let plans = Plans::classic();
    /// let enterprise = plans.id("enterprise").unwrap();
    /// let limiter = PlanLimiter::new(&plans, move |_: &u64| enterprise, KeyedBuilder::default().capacity(1_000))?;
    /// assert_eq!(limiter.check(&1).limit(), 1_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(plans: &Plans, resolver: R, table: KeyedBuilder<(), C>) -> Result<Self, PlansError> {
        Self::new_in(plans, resolver, table)
    }
}

impl<K, R, C, S> PlanLimiter<K, R, C, S>
where
    C: Clock,
    S: Storage<K, GcraState>,
{
    /// [`new`](PlanLimiter::new) on storage `S` (e.g. [`Inline`](crate::Inline) for
    /// `u64` or `IpAddr` keys).
    ///
    /// # Errors
    ///
    /// As [`new`](PlanLimiter::new).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::{Inline, KeyedBuilder};
    /// let plans = Plans::classic();
    /// let pro = plans.id("pro").unwrap();
    /// let limiter: PlanLimiter<u64, _, _, Inline> =
    ///     PlanLimiter::new_in(&plans, move |_: &u64| pro, KeyedBuilder::default())?;
    /// assert_eq!(limiter.check(&1).limit(), 100);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new_in(
        plans: &Plans,
        resolver: R,
        table: KeyedBuilder<(), C>,
    ) -> Result<Self, PlansError> {
        let default = plans.default_plan().ok_or(PlansError::NoPlans)?;
        let first = plans.policy(default).ok_or(PlansError::NoPlans)?;
        // The table's own algorithm only judges idleness and closeness to idle, which
        // for GCRA depend on the state alone, not on the policy.
        let keyed = table
            .algorithm(Gcra::new(first))
            .build_in::<K, S>()
            .map_err(PlansError::Keyed)?;
        Ok(PlanLimiter {
            keyed,
            names: plans.names.clone(),
            cells: plans
                .policies
                .iter()
                .map(|p| CachePadded::new(PolicyCell::new(*p)))
                .collect(),
            default: default.0 as usize,
            update: Mutex::new(()),
            resolver,
        })
    }

    #[inline]
    fn gcra_for<Q: ?Sized>(&self, key: &Q) -> Gcra
    where
        R: Fn(&Q) -> PlanId,
    {
        let id = (self.resolver)(key).0 as usize;
        let cell = self.cells.get(id).unwrap_or(&self.cells[self.default]);
        Gcra::new(cell.load())
    }

    /// Decides one unit for `key` under its plan, consuming it if allowed.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::KeyedBuilder;
    /// let plans = Plans::classic();
    /// let free = plans.id("free").unwrap();
    /// let limiter = PlanLimiter::new(&plans, move |_: &u64| free, KeyedBuilder::default())?;
    /// assert_eq!(limiter.check(&7).remaining(), 9);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn check<Q>(&self, key: &Q) -> Decision
    where
        Q: Lookup<K> + ?Sized,
        R: Fn(&Q) -> PlanId,
    {
        self.check_n_at(key, self.keyed.clock().now(), 1)
    }

    /// Decides `cost` units for `key` at `now` under its plan.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::{KeyedBuilder, Nanos};
    /// let plans = Plans::classic();
    /// let pro = plans.id("pro").unwrap();
    /// let limiter = PlanLimiter::new(&plans, move |_: &u64| pro, KeyedBuilder::default())?;
    /// assert_eq!(limiter.check_n_at(&7, Nanos::from_secs(1), 100).remaining(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn check_n_at<Q>(&self, key: &Q, now: Nanos, cost: u32) -> Decision
    where
        Q: Lookup<K> + ?Sized,
        R: Fn(&Q) -> PlanId,
    {
        let gcra = self.gcra_for(key);
        self.keyed.check_with(&gcra, key, now, cost)
    }

    /// What a check of `cost` would decide now; writes nothing, inserts nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::KeyedBuilder;
    /// let plans = Plans::classic();
    /// let free = plans.id("free").unwrap();
    /// let limiter = PlanLimiter::new(&plans, move |_: &u64| free, KeyedBuilder::default())?;
    /// assert!(!limiter.peek(&7, 11).is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn peek<Q>(&self, key: &Q, cost: u32) -> Decision
    where
        Q: Lookup<K> + ?Sized,
        R: Fn(&Q) -> PlanId,
    {
        self.peek_at(key, self.keyed.clock().now(), cost)
    }

    /// [`peek`](PlanLimiter::peek) at an instant the caller read.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::{KeyedBuilder, Nanos};
    /// let plans = Plans::classic();
    /// let free = plans.id("free").unwrap();
    /// let limiter = PlanLimiter::new(&plans, move |_: &u64| free, KeyedBuilder::default())?;
    /// assert!(limiter.peek_at(&7, Nanos::from_secs(3), 10).is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn peek_at<Q>(&self, key: &Q, now: Nanos, cost: u32) -> Decision
    where
        Q: Lookup<K> + ?Sized,
        R: Fn(&Q) -> PlanId,
    {
        let gcra = self.gcra_for(key);
        self.keyed.peek_with(&gcra, key, now, cost)
    }

    /// Decides `cost` units for `key` now under its plan, with a [`Receipt`] for a
    /// later [`refund`](PlanLimiter::refund).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::KeyedBuilder;
    /// let plans = Plans::classic();
    /// let free = plans.id("free").unwrap();
    /// let limiter = PlanLimiter::new(&plans, move |_: &u64| free, KeyedBuilder::default())?;
    /// let (decision, receipt) = limiter.charge(&7, 10);
    /// assert_eq!(decision.remaining(), 0);
    /// assert!(limiter.refund(&7, receipt));
    /// assert_eq!(limiter.peek(&7, 0).remaining(), 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charge<Q>(&self, key: &Q, cost: u32) -> (Decision, Receipt)
    where
        Q: Lookup<K> + ?Sized,
        R: Fn(&Q) -> PlanId,
    {
        self.charge_at(key, self.keyed.clock().now(), cost)
    }

    /// [`charge`](PlanLimiter::charge) at an instant the caller read.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::{KeyedBuilder, Nanos};
    /// let plans = Plans::classic();
    /// let free = plans.id("free").unwrap();
    /// let limiter = PlanLimiter::new(&plans, move |_: &u64| free, KeyedBuilder::default())?;
    /// let (decision, receipt) = limiter.charge_at(&7, Nanos::from_secs(1), 10);
    /// assert_eq!(decision.remaining(), 0);
    /// assert!(receipt.is_charged());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charge_at<Q>(&self, key: &Q, now: Nanos, cost: u32) -> (Decision, Receipt)
    where
        Q: Lookup<K> + ?Sized,
        R: Fn(&Q) -> PlanId,
    {
        let gcra = self.gcra_for(key);
        self.keyed.charge_with(&gcra, key, now, cost)
    }

    /// Gives back what the charge behind `receipt` still provably holds for `key`
    /// (see [`KeyedLimiter::refund`]); returns whether anything came back.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::KeyedBuilder;
    /// let plans = Plans::classic();
    /// let free = plans.id("free").unwrap();
    /// let limiter = PlanLimiter::new(&plans, move |_: &u64| free, KeyedBuilder::default())?;
    /// let (_, receipt) = limiter.charge(&7, 1);
    /// assert!(!limiter.refund(&8, receipt)); // not key 8's charge
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund<Q>(&self, key: &Q, receipt: Receipt) -> bool
    where
        Q: Lookup<K> + ?Sized,
        R: Fn(&Q) -> PlanId,
    {
        let gcra = self.gcra_for(key);
        self.keyed.refund_with(&gcra, key, receipt)
    }

    /// Deletes `key`'s entry, whatever its plan, and returns whether it had one:
    /// [`KeyedLimiter::remove`] on the table behind the plans (refund receipts taken
    /// before it give back nothing; a check racing it is judged at or after its clock
    /// reading).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::KeyedBuilder;
    /// let plans = Plans::classic();
    /// let free = plans.id("free").unwrap();
    /// let limiter = PlanLimiter::new(&plans, move |_: &u64| free, KeyedBuilder::default())?;
    /// for _ in 0..10 { assert!(limiter.check(&7).is_allowed()); }
    /// assert!(limiter.remove(&7));
    /// assert!(!limiter.remove(&7));
    /// assert_eq!(limiter.check(&7).remaining(), 9);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn remove<Q>(&self, key: &Q) -> bool
    where
        Q: Lookup<K> + ?Sized,
    {
        self.keyed.remove(key)
    }

    /// Returns `key` to its fresh state under its plan (a whole burst again) and
    /// returns whether it had an entry: [`KeyedLimiter::reset`], which is
    /// [`remove`](PlanLimiter::remove).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::KeyedBuilder;
    /// let plans = Plans::classic();
    /// let pro = plans.id("pro").unwrap();
    /// let limiter = PlanLimiter::new(&plans, move |_: &&str| pro, KeyedBuilder::default())?;
    /// let burst = limiter.check(&"acme").remaining() + 1;
    /// for _ in 1..burst { assert!(limiter.check(&"acme").is_allowed()); }
    /// assert!(!limiter.check(&"acme").is_allowed());
    /// assert!(limiter.reset(&"acme"));
    /// assert!(limiter.check(&"acme").is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reset<Q>(&self, key: &Q) -> bool
    where
        Q: Lookup<K> + ?Sized,
    {
        self.keyed.reset(key)
    }

    /// Changes plan `name`'s policy now; every key keeps its state (GCRA: its TAT),
    /// the new interval applies from the next decision and `remaining` is clamped to
    /// the new burst.
    ///
    /// # Errors
    ///
    /// [`PlansError::UnknownPlan`] if no plan has this name.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::{KeyedBuilder, ManualClock, Policy};
    /// let plans = Plans::classic();
    /// let free = plans.id("free").unwrap();
    /// let limiter = PlanLimiter::new(&plans, move |_: &u64| free, KeyedBuilder::default().clock(ManualClock::new()))?;
    /// for _ in 0..10 { assert!(limiter.check(&1).is_allowed()); }
    /// assert!(!limiter.check(&1).is_allowed());
    /// // Doubling the burst: the key's TAT is kept, so it gets the 10 extra at once.
    /// limiter.set_policy("free", Policy::per_day(100)?.with_burst(20)?)?;
    /// assert_eq!(limiter.check(&1).remaining(), 9);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_policy(&self, name: &str, policy: Policy) -> Result<(), PlansError> {
        let id =
            self.names
                .iter()
                .position(|n| n == name)
                .ok_or_else(|| PlansError::UnknownPlan {
                    name: name.to_owned(),
                })?;
        let _serial = lock(&self.update);
        self.cells[id].store(policy);
        Ok(())
    }

    /// The current policy of plan `name`.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::KeyedBuilder;
    /// let limiter = PlanLimiter::<u64, _>::new(&Plans::classic(), |_: &u64| floodgate::keyed::plans::Plans::classic().default_plan().unwrap(), KeyedBuilder::default())?;
    /// assert_eq!(limiter.policy("pro").unwrap().burst(), 100);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn policy(&self, name: &str) -> Option<Policy> {
        let id = self.names.iter().position(|n| n == name)?;
        Some(self.cells[id].load())
    }

    /// The key table underneath (metrics, capacity).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::KeyedBuilder;
    /// let plans = Plans::classic();
    /// let free = plans.id("free").unwrap();
    /// let limiter = PlanLimiter::new(&plans, move |_: &u64| free, KeyedBuilder::default())?;
    /// let _ = limiter.check(&1);
    /// assert_eq!(limiter.keyed().metrics().live_keys, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn keyed(&self) -> &KeyedLimiter<K, Gcra, C, S> {
        &self.keyed
    }
}

impl<K, R, C, S> fmt::Debug for PlanLimiter<K, R, C, S>
where
    C: fmt::Debug,
    S: Storage<K, GcraState> + Default + fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlanLimiter")
            .field("plans", &self.names)
            .field("keyed", &self.keyed)
            .finish_non_exhaustive()
    }
}
