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
//! # Any algorithm
//!
//! Plans run GCRA by default ([`PlanLimiter::new`]); [`PlanLimiter::fixed_window`]
//! and [`PlanLimiter::sliding_window`] count each plan's `limit` per `period`
//! instead, and [`PlanLimiter::new_in`] picks any [`PlanAlgorithm`] and storage.
//! Every plan has a table of its own, with the builder's capacity (memory is
//! bounded by plans × capacity).
//!
//! **Why a table per plan, for GCRA too.** When more keys are live at once than a
//! table's capacity, an insert evicts the key of a sample whose loss forgives the
//! fewest units, ranked under the table's policy. A table shared by every plan
//! would rank an enterprise key under a free key's policy: a flood of free keys
//! (one unit each, booked 864 s ahead) would rank an enterprise key that has used
//! 900 of its 1 000 units (booked 78 s ahead) as the lightest and evict it, and its
//! next requests would find a fresh burst. In a plan's own table every key ranks
//! under its own policy, so a flood of one plan's keys evicts only that plan's
//! lightest keys and never touches another plan's.
//!
//! A key whose plan changes (the resolver, not the client, picks it) starts fresh
//! in its new plan's table and finds its old state again if it moves back: each
//! move forgives at most one burst (GCRA) or one window of the new plan.
//!
//! # Changing a quota at runtime
//!
//! [`PlanLimiter::set_policy_mut`] changes a plan's policy on every algorithm,
//! rewriting each of its keys as [`Algorithm::carry_over`] does (a window of another
//! period starts fresh). GCRA plans also change through a shared reference:
//! [`PlanLimiter::set_policy`] swaps a plan's policy while requests run. Every key
//! keeps its GCRA state (its theoretical arrival time): the new emission interval
//! applies from the next decision on, and `remaining` is clamped to `[0, B]` of the
//! new burst — the rule every runtime policy change in this crate follows for GCRA
//! ([`Algorithm::carry_over`]). The change itself neither forgives nor charges anything: a key that had used more than the new
//! burst allows is denied until its schedule catches up. Each plan's policy sits in
//! a per-plan sequence lock (four words); a decision reads it with plain loads and
//! retries only if an update ran at that very moment.

use core::fmt;

use crossbeam_utils::CachePadded;

use crate::algorithm::Algorithm;
use crate::clock::{Clock, DefaultClock, Nanos};
use crate::decision::Decision;
use crate::fixed_window::FixedWindow;
use crate::gcra::{Gcra, GcraState};
use crate::keyed::key::Lookup;
use crate::keyed::storage::{Heap, Storage};
use crate::keyed::{KeyedBuilder, KeyedError, KeyedLimiter, KeyedMetrics};
use crate::live::PolicyCell;
use crate::policy::{Policy, PolicyError};
use crate::receipt::Receipt;
use crate::sliding_window::SlidingWindow;
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

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::gcra::Gcra {}
    impl Sealed for crate::fixed_window::FixedWindow {}
    impl Sealed for crate::sliding_window::SlidingWindow {}
}

/// An algorithm a plan can run: [`Gcra`] (the default), [`FixedWindow`] or
/// [`SlidingWindow`], built from each plan's policy.
///
/// # Examples
///
/// ```
/// use floodgate::keyed::plans::PlanAlgorithm;
/// use floodgate::{FixedWindow, Gcra, Policy};
/// assert!(Gcra::POLICY_FREE_STATE); // a TAT means the same under every policy
/// assert!(!FixedWindow::POLICY_FREE_STATE); // a count is packed for its limit and period
/// assert!(FixedWindow::for_policy(Policy::per_minute(10)?).is_ok());
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
pub trait PlanAlgorithm: Algorithm + Sized + sealed::Sealed {
    /// Whether a key's state means the same under every policy. Then a plan's
    /// policy changes through `&self` ([`PlanLimiter::set_policy`]): each decision
    /// reads its plan's policy, and every key of the plan keeps its state.
    /// Otherwise the state is packed for the plan's limit and period, and a policy
    /// change rewrites the plan's table ([`PlanLimiter::set_policy_mut`]).
    const POLICY_FREE_STATE: bool;

    /// The algorithm for `policy`.
    ///
    /// # Errors
    ///
    /// What the algorithm's constructor rejects (a window too long for its packed
    /// index, for instance).
    fn for_policy(policy: Policy) -> Result<Self, PolicyError>;
}

impl PlanAlgorithm for Gcra {
    const POLICY_FREE_STATE: bool = true;

    #[inline]
    fn for_policy(policy: Policy) -> Result<Self, PolicyError> {
        Ok(Gcra::new(policy))
    }
}

impl PlanAlgorithm for FixedWindow {
    const POLICY_FREE_STATE: bool = false;

    fn for_policy(policy: Policy) -> Result<Self, PolicyError> {
        FixedWindow::new(policy)
    }
}

impl PlanAlgorithm for SlidingWindow {
    const POLICY_FREE_STATE: bool = false;

    fn for_policy(policy: Policy) -> Result<Self, PolicyError> {
        SlidingWindow::new(policy)
    }
}

/// A decision of a [`PlanLimiter`] with the plan it was made under and that plan's
/// policy as the decision read it ([`charge_plan`](PlanLimiter::charge_plan),
/// [`peek_in`](PlanLimiter::peek_in)): what a caller advertises next to the decision
/// (a rate-limit header's window) describes the same plan, with no second call to
/// the resolver that might answer another plan.
///
/// # Examples
///
/// ```
/// use floodgate::keyed::plans::{PlanLimiter, Plans};
/// use floodgate::KeyedBuilder;
/// let plans = Plans::classic();
/// let pro = plans.id("pro").unwrap();
/// let limiter = PlanLimiter::new(&plans, move |_: &u64| pro, KeyedBuilder::default())?;
/// let (charged, _receipt) = limiter.charge_plan(&7, 1);
/// assert_eq!((charged.plan, charged.policy), (pro, plans.policy(pro).unwrap()));
/// assert_eq!(charged.decision.limit(), 100);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PlanDecision {
    /// The decision.
    pub decision: Decision,
    /// The plan it was made under (the default plan for an id the resolver made up).
    pub plan: PlanId,
    /// The plan's policy the decision was made under.
    pub policy: Policy,
}

/// A keyed limiter whose policy depends on the key's plan, running GCRA (the
/// default), a fixed window or a sliding window counter ([`PlanAlgorithm`]).
///
/// Each plan has a table of its own, with the capacity of the builder passed in
/// (memory is bounded by plans × capacity), so eviction ranks every key under its
/// own plan; a key whose plan changes starts fresh in its new plan's table, which
/// forgives at most one burst or window of the new plan per change (the resolver,
/// not the client, picks the plan).
///
/// See the [module docs](self) for an example and runtime changes.
pub struct PlanLimiter<K, R, C = DefaultClock, S = Heap, A = Gcra>
where
    A: PlanAlgorithm,
    S: Storage<K, A::State>,
{
    /// One table per plan, in plan order.
    tables: Box<[KeyedLimiter<K, A, C, S>]>,
    names: Vec<String>,
    cells: Box<[CachePadded<PolicyCell>]>,
    default: usize,
    update: Mutex<()>,
    resolver: R,
}

impl<K, R, C> PlanLimiter<K, R, C>
where
    C: Clock + Clone,
    Heap: Storage<K, GcraState>,
{
    /// A GCRA limiter for `plans`, mapping keys to plans with `resolver`, with the
    /// capacity, shards and clock of `table` ([`KeyedBuilder::default`]: each key
    /// runs its plan's algorithm, so the table brings none).
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

impl<K, R, C> PlanLimiter<K, R, C, Heap, FixedWindow>
where
    C: Clock + Clone,
    Heap: Storage<K, <FixedWindow as Algorithm>::State>,
{
    /// [`new`](PlanLimiter::new) with a fixed window per plan: `limit` units per
    /// `period` window, one table per plan.
    ///
    /// # Errors
    ///
    /// As [`new`](PlanLimiter::new), and [`PlansError::Policy`] for a plan whose
    /// policy a fixed window cannot run.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::{KeyedBuilder, ManualClock};
    /// let plans = Plans::classic();
    /// let free = plans.id("free").unwrap();
    /// let limiter = PlanLimiter::fixed_window(&plans, move |_: &u64| free, KeyedBuilder::default().clock(ManualClock::new()))?;
    /// // A window counts the plan's limit (100 a day), not a burst.
    /// assert_eq!(limiter.check(&1).remaining(), 99);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fixed_window(
        plans: &Plans,
        resolver: R,
        table: KeyedBuilder<(), C>,
    ) -> Result<Self, PlansError> {
        Self::new_in(plans, resolver, table)
    }
}

impl<K, R, C> PlanLimiter<K, R, C, Heap, SlidingWindow>
where
    C: Clock + Clone,
    Heap: Storage<K, <SlidingWindow as Algorithm>::State>,
{
    /// [`new`](PlanLimiter::new) with a sliding window counter per plan, one table
    /// per plan.
    ///
    /// # Errors
    ///
    /// As [`fixed_window`](PlanLimiter::fixed_window).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::{KeyedBuilder, ManualClock};
    /// let plans = Plans::classic();
    /// let pro = plans.id("pro").unwrap();
    /// let limiter = PlanLimiter::sliding_window(&plans, move |_: &u64| pro, KeyedBuilder::default().clock(ManualClock::new()))?;
    /// assert_eq!(limiter.check_n(&1, 10_000).remaining(), 0);
    /// assert!(!limiter.check(&1).is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sliding_window(
        plans: &Plans,
        resolver: R,
        table: KeyedBuilder<(), C>,
    ) -> Result<Self, PlansError> {
        Self::new_in(plans, resolver, table)
    }
}

impl<K, R, C, S, A> PlanLimiter<K, R, C, S, A>
where
    C: Clock,
    A: PlanAlgorithm,
    S: Storage<K, A::State>,
{
    /// A limiter running algorithm `A` on storage `S` (e.g. [`Inline`](crate::Inline)
    /// for `u64` or `IpAddr` keys); see [`new`](PlanLimiter::new).
    ///
    /// # Errors
    ///
    /// As [`new`](PlanLimiter::new), and [`PlansError::Policy`] for a plan whose
    /// policy `A` cannot run.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::{FixedWindow, Inline, KeyedBuilder};
    /// let plans = Plans::classic();
    /// let pro = plans.id("pro").unwrap();
    /// let gcra: PlanLimiter<u64, _, _, Inline> =
    ///     PlanLimiter::new_in(&plans, move |_: &u64| pro, KeyedBuilder::default())?;
    /// assert_eq!(gcra.check(&1).limit(), 100);
    /// let window: PlanLimiter<u64, _, _, Inline, FixedWindow> =
    ///     PlanLimiter::new_in(&plans, move |_: &u64| pro, KeyedBuilder::default())?;
    /// assert_eq!(window.check(&1).limit(), 10_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new_in(
        plans: &Plans,
        resolver: R,
        table: KeyedBuilder<(), C>,
    ) -> Result<Self, PlansError>
    where
        C: Clone,
    {
        let default = plans.default_plan().ok_or(PlansError::NoPlans)?;
        let algorithms = plans
            .iter()
            .map(|(_, name, policy)| {
                A::for_policy(policy).map_err(|error| PlansError::Policy {
                    plan: name.to_owned(),
                    error,
                })
            })
            .collect::<Result<Vec<A>, PlansError>>()?;
        // The budget bounds every table together: one slot array per plan.
        table
            .fits_budget(algorithms.len())
            .map_err(PlansError::Keyed)?;
        // Every table shares one clock, made once.
        let table = table.settle_clock();
        Ok(PlanLimiter {
            // One table per plan: eviction ranks a table's keys under its plan.
            tables: algorithms
                .into_iter()
                .map(|algorithm| table.clone().algorithm(algorithm).build_in::<K, S>())
                .collect::<Result<_, _>>()
                .map_err(PlansError::Keyed)?,
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

    /// The table that holds `key` (its plan's) and, for a policy-free state, the
    /// algorithm of the plan's policy read now (otherwise the table's own decides).
    #[inline]
    fn route<Q: ?Sized>(&self, key: &Q) -> (&KeyedLimiter<K, A, C, S>, Option<A>)
    where
        R: Fn(&Q) -> PlanId,
    {
        let plan = self.index((self.resolver)(key));
        let algorithm = if A::POLICY_FREE_STATE {
            // Every stored policy was accepted by `for_policy` (at construction or
            // by a change), so this is `Some`.
            A::for_policy(self.cells[plan].load()).ok()
        } else {
            None
        };
        (&self.tables[plan], algorithm)
    }

    /// Plan `plan`'s table, the algorithm a decision in it runs (as in
    /// [`route`](PlanLimiter::route)) and the plan's policy that algorithm has: for a
    /// policy-free state the one it was built from, read once; otherwise the table's,
    /// which the cell matches (both change together, under `&mut`).
    fn in_plan(&self, plan: usize) -> (&KeyedLimiter<K, A, C, S>, Option<A>, Policy) {
        let policy = self.cells[plan].load();
        let algorithm = if A::POLICY_FREE_STATE {
            // Accepted by `for_policy` when it was stored: `Some`.
            A::for_policy(policy).ok()
        } else {
            None
        };
        (&self.tables[plan], algorithm, policy)
    }

    /// The policy of `key`'s plan, as it is now (what the key's next decision is made
    /// under): to advertise it, as a rate-limit header's window.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::KeyedBuilder;
    /// let plans = Plans::classic();
    /// let (free, pro) = (plans.id("free").unwrap(), plans.id("pro").unwrap());
    /// let limiter = PlanLimiter::<u64, _>::new(&plans, move |k: &u64| if *k < 10 { free } else { pro }, KeyedBuilder::default())?;
    /// assert_eq!(limiter.policy_of(&1), plans.policy(free).unwrap());
    /// assert_eq!(limiter.policy_of(&20), plans.policy(pro).unwrap());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn policy_of<Q>(&self, key: &Q) -> Policy
    where
        Q: ?Sized,
        R: Fn(&Q) -> PlanId,
    {
        self.cells[self.index((self.resolver)(key))].load()
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
        self.check_n_at(key, self.clock().now(), 1)
    }

    /// Decides `cost` units for `key` now under its plan.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::KeyedBuilder;
    /// let plans = Plans::classic();
    /// let free = plans.id("free").unwrap();
    /// let limiter = PlanLimiter::new(&plans, move |_: &u64| free, KeyedBuilder::default())?;
    /// assert!(!limiter.check_n(&7, 11).is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn check_n<Q>(&self, key: &Q, cost: u32) -> Decision
    where
        Q: Lookup<K> + ?Sized,
        R: Fn(&Q) -> PlanId,
    {
        self.check_n_at(key, self.clock().now(), cost)
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
        let (table, algorithm) = self.route(key);
        table.check_with(
            algorithm.as_ref().unwrap_or(table.algorithm()),
            key,
            now,
            cost,
        )
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
        self.peek_at(key, self.clock().now(), cost)
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
        let (table, algorithm) = self.route(key);
        table.peek_with(
            algorithm.as_ref().unwrap_or(table.algorithm()),
            key,
            now,
            cost,
        )
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
        self.charge_at(key, self.clock().now(), cost)
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
        let (table, algorithm) = self.route(key);
        table.charge_with(
            algorithm.as_ref().unwrap_or(table.algorithm()),
            key,
            now,
            cost,
        )
    }

    /// Gives back what the charge behind `receipt` still provably holds for `key`
    /// (see [`KeyedLimiter::refund`]); returns whether anything came back. A charge
    /// taken before the key changed plan (on the windows: in another table) gives
    /// back nothing.
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
        let (table, algorithm) = self.route(key);
        table.refund_with(
            algorithm.as_ref().unwrap_or(table.algorithm()),
            key,
            receipt,
        )
    }

    /// [`charge`](PlanLimiter::charge), reporting the plan it charged under and that
    /// plan's policy as the decision read it ([`PlanDecision`]). The resolver runs
    /// once: a caller that advertises the policy (a rate-limit header's window) next
    /// to the decision describes the plan that charged, even when the resolver
    /// answers another plan a moment later (an upgrade mid-request). Calling
    /// [`policy_of`](PlanLimiter::policy_of) besides would run it twice.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::KeyedBuilder;
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// let plans = Plans::classic();
    /// let (free, pro) = (plans.id("free").unwrap(), plans.id("pro").unwrap());
    /// let calls = AtomicU32::new(0);
    /// // Every call answers the other plan: an upgrade racing every request.
    /// let resolver = |_: &u64| if calls.fetch_add(1, Ordering::Relaxed) % 2 == 0 { free } else { pro };
    /// let limiter = PlanLimiter::new(&plans, resolver, KeyedBuilder::default())?;
    /// let (charged, receipt) = limiter.charge_plan(&7, 1);
    /// assert_eq!(calls.load(Ordering::Relaxed), 1);
    /// assert_eq!(charged.plan, free);
    /// assert_eq!(charged.decision.limit(), charged.policy.burst()); // free's burst, 10
    /// assert_eq!(limiter.receipt_plan(&receipt), Some(free));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charge_plan<Q>(&self, key: &Q, cost: u32) -> (PlanDecision, Receipt)
    where
        Q: Lookup<K> + ?Sized,
        R: Fn(&Q) -> PlanId,
    {
        self.charge_plan_at(key, self.clock().now(), cost)
    }

    /// [`charge_plan`](PlanLimiter::charge_plan) at an instant the caller read.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::{KeyedBuilder, Nanos};
    /// let plans = Plans::classic();
    /// let free = plans.id("free").unwrap();
    /// let limiter = PlanLimiter::fixed_window(&plans, move |_: &u64| free, KeyedBuilder::default())?;
    /// let (charged, _receipt) = limiter.charge_plan_at(&7, Nanos::from_secs(1), 100);
    /// assert_eq!(charged.decision.remaining(), 0);
    /// assert_eq!(charged.policy.limit(), 100); // 100 a day
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charge_plan_at<Q>(&self, key: &Q, now: Nanos, cost: u32) -> (PlanDecision, Receipt)
    where
        Q: Lookup<K> + ?Sized,
        R: Fn(&Q) -> PlanId,
    {
        let plan = self.index((self.resolver)(key));
        let (table, algorithm, policy) = self.in_plan(plan);
        let (decision, receipt) = table.charge_with(
            algorithm.as_ref().unwrap_or(table.algorithm()),
            key,
            now,
            cost,
        );
        let plan = PlanId(plan as u32);
        (
            PlanDecision {
                decision,
                plan,
                policy,
            },
            receipt,
        )
    }

    /// [`peek`](PlanLimiter::peek), reporting the plan it was decided under and that
    /// plan's policy as the decision read it ([`PlanDecision`]), from one run of the
    /// resolver.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::KeyedBuilder;
    /// let plans = Plans::classic();
    /// let free = plans.id("free").unwrap();
    /// let limiter = PlanLimiter::new(&plans, move |_: &u64| free, KeyedBuilder::default())?;
    /// let now = limiter.peek_plan(&7, 0);
    /// assert_eq!((now.plan, now.decision.remaining()), (free, 10));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek_plan<Q>(&self, key: &Q, cost: u32) -> PlanDecision
    where
        Q: Lookup<K> + ?Sized,
        R: Fn(&Q) -> PlanId,
    {
        self.peek_in((self.resolver)(key), key, cost)
    }

    /// The plan whose table issued `receipt`: the plan its charge was decided under,
    /// told without running the resolver. `None` for a receipt of another limiter,
    /// or one voided by a rewrite of its plan's table
    /// ([`set_policy_mut`](PlanLimiter::set_policy_mut) on a window plan), which
    /// gives back nothing anywhere.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::KeyedBuilder;
    /// let plans = Plans::classic();
    /// let pro = plans.id("pro").unwrap();
    /// let limiter = PlanLimiter::new(&plans, move |_: &u64| pro, KeyedBuilder::default())?;
    /// let other = PlanLimiter::<u64, _>::new(&plans, move |_: &u64| pro, KeyedBuilder::default())?;
    /// let (_, receipt) = limiter.charge(&7, 1);
    /// assert_eq!(limiter.receipt_plan(&receipt), Some(pro));
    /// assert_eq!(other.receipt_plan(&receipt), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn receipt_plan(&self, receipt: &Receipt) -> Option<PlanId> {
        self.tables
            .iter()
            .position(|table| table.issued(receipt))
            .map(|plan| PlanId(plan as u32))
    }

    /// [`refund`](PlanLimiter::refund) in plan `plan`'s table, without running the
    /// resolver: with [`receipt_plan`](PlanLimiter::receipt_plan), a charge is given
    /// back in the table that took it, even after the key moved to another plan.
    /// An id not in the plans means the default plan.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::KeyedBuilder;
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// let plans = Plans::classic();
    /// let (free, pro) = (plans.id("free").unwrap(), plans.id("pro").unwrap());
    /// let upgraded = AtomicBool::new(false);
    /// let resolver = |_: &u64| if upgraded.load(Ordering::Relaxed) { pro } else { free };
    /// let limiter = PlanLimiter::new(&plans, resolver, KeyedBuilder::default())?;
    /// let (_, receipt) = limiter.charge(&7, 10);
    /// upgraded.store(true, Ordering::Relaxed);
    /// let plan = limiter.receipt_plan(&receipt).unwrap();
    /// assert!(limiter.refund_in(plan, &7, receipt)); // back in free's table
    /// assert_eq!(limiter.peek_in(free, &7, 0).decision.remaining(), 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund_in<Q>(&self, plan: PlanId, key: &Q, receipt: Receipt) -> bool
    where
        Q: Lookup<K> + ?Sized,
    {
        let (table, algorithm, _) = self.in_plan(self.index(plan));
        table.refund_with(
            algorithm.as_ref().unwrap_or(table.algorithm()),
            key,
            receipt,
        )
    }

    /// What a charge of `cost` for `key` would decide now under plan `plan` (its
    /// table, its policy now), without running the resolver; writes nothing,
    /// inserts nothing. An id not in the plans means the default plan.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::KeyedBuilder;
    /// let plans = Plans::classic();
    /// let (free, pro) = (plans.id("free").unwrap(), plans.id("pro").unwrap());
    /// let limiter = PlanLimiter::new(&plans, move |_: &u64| free, KeyedBuilder::default())?;
    /// assert!(limiter.check(&7).is_allowed());
    /// assert_eq!(limiter.peek_in(free, &7, 0).decision.remaining(), 9);
    /// let in_pro = limiter.peek_in(pro, &7, 0); // pro's table has no entry for 7
    /// assert_eq!((in_pro.plan, in_pro.decision.remaining()), (pro, 100));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek_in<Q>(&self, plan: PlanId, key: &Q, cost: u32) -> PlanDecision
    where
        Q: Lookup<K> + ?Sized,
    {
        let plan = self.index(plan);
        let (table, algorithm, policy) = self.in_plan(plan);
        let decision = table.peek_with(
            algorithm.as_ref().unwrap_or(table.algorithm()),
            key,
            self.clock().now(),
            cost,
        );
        PlanDecision {
            decision,
            plan: PlanId(plan as u32),
            policy,
        }
    }

    /// Deletes `key`'s entries, whatever its plan, and returns whether it had one:
    /// [`KeyedLimiter::remove`] on every table behind the plans (refund receipts
    /// taken before it give back nothing; a check racing it is judged at or after
    /// its clock reading).
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
        // Every table: a key that changed plan may have left an entry behind.
        self.tables
            .iter()
            .fold(false, |removed, table| table.remove(key) | removed)
    }

    /// Returns `key` to its fresh state under its plan (a whole burst or window
    /// again) and returns whether it had an entry: [`remove`](PlanLimiter::remove).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::{KeyedBuilder, ManualClock};
    /// let plans = Plans::classic();
    /// let pro = plans.id("pro").unwrap();
    /// let table = KeyedBuilder::default().clock(ManualClock::new());
    /// let limiter = PlanLimiter::new(&plans, move |_: &&str| pro, table)?;
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
        self.remove(key)
    }

    /// Changes plan `name`'s policy, for every algorithm: each key of the plan
    /// keeps its state as [`Algorithm::carry_over`] rewrites it (GCRA: its
    /// schedule; a window of the same period: its count, clamped to the new limit;
    /// a window of another period starts fresh). GCRA plans can also change through
    /// a shared reference ([`set_policy`](PlanLimiter::set_policy)).
    ///
    /// # Errors
    ///
    /// [`PlansError::UnknownPlan`] if no plan has this name; [`PlansError::Policy`]
    /// if `A` cannot run `policy` (nothing changes).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::{KeyedBuilder, ManualClock, Policy};
    /// let plans = Plans::classic();
    /// let free = plans.id("free").unwrap();
    /// let mut limiter = PlanLimiter::fixed_window(&plans, move |_: &u64| free, KeyedBuilder::default().clock(ManualClock::new()))?;
    /// assert!(limiter.check_n(&1, 60).is_allowed());
    /// // The same period (a day): the 60 units stay counted against the new limit.
    /// limiter.set_policy_mut("free", Policy::per_day(80)?)?;
    /// assert_eq!(limiter.peek(&1, 0).remaining(), 20);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_policy_mut(&mut self, name: &str, policy: Policy) -> Result<(), PlansError> {
        let id = self.plan_named(name)?;
        let algorithm = A::for_policy(policy).map_err(|error| PlansError::Policy {
            plan: name.to_owned(),
            error,
        })?;
        if !A::POLICY_FREE_STATE {
            // A policy-free state needs no rewrite: each decision reads the cell.
            self.tables[id].set_algorithm(algorithm);
        }
        self.cells[id].store(policy);
        Ok(())
    }

    /// The index of plan `name`.
    fn plan_named(&self, name: &str) -> Result<usize, PlansError> {
        self.names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| PlansError::UnknownPlan {
                name: name.to_owned(),
            })
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

    /// A copy of the limiter's plans as they are now: every plan's name and id, in
    /// plan order, with its current policy (after any
    /// [`set_policy`](PlanLimiter::set_policy)), and the default plan.
    ///
    /// The set of plans is fixed when the limiter is built; their policies are not,
    /// so the copy shows each plan's policy at this call and does not follow later
    /// changes.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::{KeyedBuilder, Policy};
    /// let plans = Plans::classic();
    /// let free = plans.id("free").unwrap();
    /// let limiter = PlanLimiter::<u64, _>::new(&plans, move |_: &u64| free, KeyedBuilder::default())?;
    /// assert_eq!(limiter.plans(), plans);
    /// limiter.set_policy("pro", Policy::per_day(10_000)?.with_burst(5)?)?;
    /// let bursts: Vec<_> = limiter.plans().iter().map(|(_, name, p)| (name.to_owned(), p.burst())).collect();
    /// assert_eq!(bursts, [("free".to_owned(), 10), ("pro".to_owned(), 5), ("enterprise".to_owned(), 1_000)]);
    /// assert_eq!(limiter.plans().default_plan(), Some(free));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn plans(&self) -> Plans {
        Plans {
            names: self.names.clone(),
            policies: self.cells.iter().map(|cell| cell.load()).collect(),
            default: Some(PlanId(self.default as u32)),
        }
    }

    /// The counters of every table behind the plans, added up.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::KeyedBuilder;
    /// let plans = Plans::classic();
    /// let (free, pro) = (plans.id("free").unwrap(), plans.id("pro").unwrap());
    /// let limiter = PlanLimiter::sliding_window(&plans, move |k: &u64| if *k < 10 { free } else { pro }, KeyedBuilder::default())?;
    /// let _ = (limiter.check(&1), limiter.check(&20));
    /// let m = limiter.metrics();
    /// assert_eq!((m.allowed, m.live_keys), (2, 2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn metrics(&self) -> KeyedMetrics {
        self.tables
            .iter()
            .map(|t| t.metrics())
            .fold(KeyedMetrics::default(), |sum, m| KeyedMetrics {
                allowed: sum.allowed + m.allowed,
                denied: sum.denied + m.denied,
                live_keys: sum.live_keys + m.live_keys,
                reclaimed: sum.reclaimed + m.reclaimed,
                evicted: sum.evicted + m.evicted,
                removed: sum.removed + m.removed,
            })
    }

    /// A read-only view of the table behind plan `plan` (an unknown id is the
    /// default plan's): its counters, size and the plan's current policy.
    ///
    /// The view decides nothing: every decision goes through the plan limiter,
    /// which reads the plan's policy at that moment, so a view can never judge a
    /// key under a policy the plan no longer has.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::{FixedWindow, KeyedBuilder};
    /// let plans = Plans::classic();
    /// let pro = plans.id("pro").unwrap();
    /// let limiter = PlanLimiter::fixed_window(&plans, move |_: &u64| pro, KeyedBuilder::default().capacity(500))?;
    /// let _ = limiter.check(&1);
    /// assert_eq!(limiter.table(pro).metrics().live_keys, 1);
    /// assert_eq!(limiter.table(plans.id("free").unwrap()).metrics().live_keys, 0);
    /// assert_eq!(limiter.table(pro).capacity(), 500);
    /// assert_eq!(limiter.table(pro).policy().limit(), 10_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn table(&self, plan: PlanId) -> PlanTable<'_, K, A, C, S> {
        let index = self.index(plan);
        PlanTable {
            table: &self.tables[index],
            cell: &self.cells[index],
        }
    }

    /// The index of `plan`'s table: an id outside the plans is the default's.
    #[inline]
    fn index(&self, plan: PlanId) -> usize {
        let plan = plan.0 as usize;
        if plan < self.cells.len() {
            plan
        } else {
            self.default
        }
    }

    /// The clock every table reads.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::{Clock, KeyedBuilder, ManualClock, Nanos};
    /// let clock = ManualClock::new();
    /// let plans = Plans::classic();
    /// let free = plans.id("free").unwrap();
    /// let limiter: PlanLimiter<u64, _, _> = PlanLimiter::new(&plans, move |_: &u64| free, KeyedBuilder::default().clock(clock.clone()))?;
    /// clock.advance(std::time::Duration::from_secs(5));
    /// assert_eq!(limiter.clock().now(), Nanos::from_secs(5));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn clock(&self) -> &C {
        self.tables[0].clock()
    }
}

impl<K, R, C, S> PlanLimiter<K, R, C, S, Gcra>
where
    C: Clock,
    S: Storage<K, GcraState>,
{
    /// Changes plan `name`'s policy now, through a shared reference; every key
    /// keeps its state (GCRA: its TAT), the new interval applies from the next
    /// decision and `remaining` is clamped to the new burst.
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
        let id = self.plan_named(name)?;
        let _serial = lock(&self.update);
        self.cells[id].store(policy);
        Ok(())
    }
}

/// One plan's table, seen through its [`PlanLimiter`] ([`PlanLimiter::table`]):
/// counters, size and the plan's current policy, but no decisions (those read the
/// plan's policy at the moment they run, which only the plan limiter does).
pub struct PlanTable<'a, K, A, C, S>
where
    A: PlanAlgorithm,
    S: Storage<K, A::State>,
{
    table: &'a KeyedLimiter<K, A, C, S>,
    cell: &'a PolicyCell,
}

impl<K, A, C, S> PlanTable<'_, K, A, C, S>
where
    C: Clock,
    A: PlanAlgorithm,
    S: Storage<K, A::State>,
{
    /// The plan's policy now (after any [`PlanLimiter::set_policy`]).
    pub fn policy(&self) -> Policy {
        self.cell.load()
    }

    /// This table's counters ([`KeyedLimiter::metrics`]).
    pub fn metrics(&self) -> KeyedMetrics {
        self.table.metrics()
    }

    /// The most keys this table holds without reclaiming ([`KeyedLimiter::capacity`]).
    pub fn capacity(&self) -> usize {
        self.table.capacity()
    }

    /// The most keys this table can hold at once ([`KeyedLimiter::max_keys`]).
    pub fn max_keys(&self) -> usize {
        self.table.max_keys()
    }

    /// This table's shard count ([`KeyedLimiter::shards`]).
    pub fn shards(&self) -> usize {
        self.table.shards()
    }

    /// The bytes of this table's slot array ([`KeyedLimiter::slot_bytes`]).
    pub fn slot_bytes(&self) -> usize {
        self.table.slot_bytes()
    }

    /// Drops this table's keys that are idle now and returns how many
    /// ([`KeyedLimiter::reclaim_idle`]). Idle is judged without the policy for GCRA
    /// (a schedule that has caught up) and under the plan's current window for the
    /// windows ([`PlanLimiter::set_policy_mut`] rewrites the table).
    pub fn reclaim_idle(&self) -> usize {
        self.table.reclaim_idle()
    }
}

impl<K, A, C, S> fmt::Debug for PlanTable<'_, K, A, C, S>
where
    C: Clock,
    A: PlanAlgorithm,
    S: Storage<K, A::State>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The plan's policy now, not the table's construction-time algorithm.
        f.debug_struct("PlanTable")
            .field("policy", &self.policy())
            .field("capacity", &self.capacity())
            .field("metrics", &self.metrics())
            .finish()
    }
}

impl<K, R, C, S, A> fmt::Debug for PlanLimiter<K, R, C, S, A>
where
    C: Clock,
    A: PlanAlgorithm,
    S: Storage<K, A::State>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tables: Vec<_> = (0..self.tables.len())
            .map(|i| (&self.names[i], self.table(PlanId(i as u32))))
            .collect();
        f.debug_struct("PlanLimiter")
            .field("tables", &tables)
            .finish_non_exhaustive()
    }
}
