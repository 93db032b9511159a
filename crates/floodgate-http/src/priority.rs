//! Priority queueing (feature `queue`): the queue strategy with per-plan queues.
//!
//! Requests are sorted into **tiers** (plans) by an extractor: tier 0 is the lowest.
//! A request that finds a slot free on the [`Shaper`] and nobody waiting goes at once.
//! Otherwise it joins its tier's FIFO queue, and slots are handed out one at a time to
//! the head of the **highest** non-empty tier: a pro request that arrives after a
//! queue of free requests is served before them; within a tier, first come first
//! served.
//!
//! Each tier has a number of places (its bound), and at most the sum of the bounds
//! wait in all. A request that finds its tier's places taken, or every place taken,
//! **sheds** a waiting request of a lower tier — the lowest tier first, and in it the
//! newest (so the survivors keep their FIFO order) — which is answered 429 at once,
//! and takes its place; when no lower tier has a waiter to shed, the arriving request
//! itself is refused (429). So under overload the lower plans are shed first, a tier
//! holds at most its own places and those of the tiers below it, and no request waits
//! behind more than the sum of the bounds.
//!
//! A request cancelled while it waits leaves its queue (and gives back the slot it
//! was about to take, [`Shaper::cancel`]).
//!
//! A request that goes at once reserves the free slot within no delay (exactly a
//! plain GCRA admission) and keeps it as that charge's receipt
//! ([`Reservation::into_receipt`]): when a later rule of the layer rejects the
//! request, or the request is dropped after this rule, the slot is given back
//! ([`Shaper::refund`]: GCRA's refund rule, a waiter's slot reserved after it kept),
//! as every in-process charge is (see `RateLimitLayer`, "How rules combine"). A slot
//! a request waited for in its tier stays taken.
//!
//! When an earlier rule denies a request, a later priority rule is peeked (taking no
//! place and reserving nothing): under its queues' lock it runs the same arrival
//! rule as a request would — the free slot peeked on the shaper
//! ([`Shaper::peek_reserve`]) when nobody waits, then its tier's places and the
//! lower tiers it could shed — and when that arrival would be refused, the 429's
//! `Retry-After` is at least the wait the rule's own refusal would give (until,
//! with nothing else arriving, the waiters ahead of it in its tier and the tiers
//! above have taken their slots and its own fits at once). A request the rule would
//! queue counts as admitted (it waits rather than being refused), as a
//! [`QueueRule`](crate::QueueRule) peek counts a slot within its bound. The peek is
//! a look at one instant: a waiter served, shed or cancelled later changes the
//! answer, as it changes the rule's own.
//!
//! # Design and costs
//!
//! The queues sit behind one `Mutex` (never held across an `.await`); the fast path
//! — nobody waiting — takes the lock once and reserves with one compare-and-swap. At
//! most one waiter holds a reservation at a time (the head of the highest tier,
//! sleeping until its slot), so a later higher-tier arrival gets the next slot. When a
//! waiter is served, shed or cancelled, every waiter is woken to look again
//! (`Notify::notify_waiters`): O(waiting) work per slot, fine for queues bounded in the
//! tens or hundreds; this is not meant for queues of millions.
//!
//! The shaper's clock and Tokio's must agree, as for [`QueueRule`](crate::QueueRule).

use core::fmt;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use floodgate::{
    Clock, Decision, GcraState, Policy, Receipt, Reservation, ShapeError, Shaper, StateCell,
};
use http::request::Parts;
use tokio::sync::Notify;

use crate::error::ConfigError;
use crate::extract::{KeyError, KeyExtractor};
use crate::headers::{window_secs, PartitionKeyHasher, PolicyName};
use crate::layer::{Check, ErasedRule, Peeked, RuleReceipt, Started};

/// The longest a head-of-queue waiter reserves ahead: effectively unbounded (the
/// queues' lengths are the bound).
const NO_DELAY_BOUND: Duration = Duration::from_secs(365 * 24 * 3600);

/// A priority-queueing rule for
/// [`RateLimitLayerBuilder::priority`](crate::RateLimitLayerBuilder::priority): one
/// shaper, one FIFO queue per tier (plan), lower tiers shed first.
///
/// The extractor's key is the request's tier, `0` being the lowest; a missing key or
/// a tier beyond the configured ones counts as tier 0 (shed first), and both are
/// counted in [`RuleStats::bad_key`](crate::RuleStats::bad_key).
///
/// # Examples
///
/// ```
/// use floodgate::{Policy, Shaper};
/// use floodgate_http::{from_fn, PriorityRule, RateLimitLayer};
/// // 100 per second one at a time; free (tier 0) may queue 10 deep, pro (tier 1) 50.
/// let tier = from_fn(|parts: &http::request::Parts| {
///     let pro = parts.headers.get("x-api-key").is_some_and(|k| k.as_bytes().starts_with(b"pro_"));
///     Ok(usize::from(pro))
/// });
/// let shaper = Shaper::new(Policy::per_second(100)?.with_burst(1)?);
/// let layer = RateLimitLayer::builder()
///     .priority(PriorityRule::new("smooth", shaper, &[10, 50], tier)?)
///     .build()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct PriorityRule<C, S, E> {
    pub(crate) name: PolicyName,
    pub(crate) window: Option<u64>,
    shaper: Arc<Shaper<C, S>>,
    tiers: Arc<Tiers>,
    classify: E,
    cost: u32,
}

impl<C, S, E: fmt::Debug> fmt::Debug for PriorityRule<C, S, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PriorityRule")
            .field("name", &self.name)
            .field("bounds", &self.tiers.bounds)
            .field("classify", &self.classify)
            .field("cost", &self.cost)
            .finish_non_exhaustive()
    }
}

/// The queues and who holds the one outstanding reservation.
struct Tiers {
    /// Each tier's places.
    bounds: Box<[usize]>,
    /// The sum of the bounds: how many may wait in all.
    places: usize,
    queues: Mutex<Queues>,
    /// Woken whenever a queue changes in a way a waiter must see.
    changed: Notify,
}

struct Queues {
    /// Waiter ids per tier, oldest first.
    waiting: Box<[VecDeque<u64>]>,
    /// Ids of waiters shed by a higher tier, not yet told.
    shed: Vec<u64>,
    /// The waiter holding a reservation, sleeping until its slot.
    holder: Option<u64>,
    next_id: u64,
}

impl Queues {
    fn is_empty(&self) -> bool {
        self.waiting.iter().all(VecDeque::is_empty)
    }

    /// The id that should take the next slot: the head of the highest non-empty tier.
    fn head(&self) -> Option<u64> {
        self.waiting.iter().rev().find_map(|q| q.front().copied())
    }

    /// How many wait in all.
    fn len(&self) -> usize {
        self.waiting.iter().map(VecDeque::len).sum()
    }

    /// How many wait in tiers `tier` and above (ahead of or level with a newcomer)
    /// without a slot yet: the holder's slot is already booked on the shaper.
    fn unbooked_ahead_of(&self, tier: usize) -> usize {
        let ahead = &self.waiting[tier..];
        let booked = self
            .holder
            .is_some_and(|h| ahead.iter().any(|q| q.contains(&h)));
        ahead.iter().map(VecDeque::len).sum::<usize>() - usize::from(booked)
    }

    fn remove(&mut self, id: u64) -> bool {
        for q in self.waiting.iter_mut() {
            if let Some(at) = q.iter().position(|&w| w == id) {
                q.remove(at);
                return true;
            }
        }
        false
    }
}

impl Tiers {
    fn lock(&self) -> MutexGuard<'_, Queues> {
        // A panic elsewhere cannot leave the queues half-updated (every update is a
        // single push, pop or remove), so a poisoned lock is still usable.
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// How a request arriving in a tier fares on the queues as they are
/// ([`PriorityRule::arrive`]).
enum Arrival<T> {
    /// Nobody waits and the shaper's slot is free now: what taking (or peeking) it
    /// gave.
    Now(T),
    /// It joins its tier's queue, first shedding the newest waiter of tier `shed`
    /// (a lower one) when the places it needs are taken.
    Join { shed: Option<usize> },
    /// Refused at once: the refusal.
    Refused(Decision),
}

impl<C, S, E> PriorityRule<C, S, E>
where
    C: Clock + 'static,
    S: StateCell<GcraState> + Send + Sync + 'static,
    E: KeyExtractor<Key = usize>,
{
    /// A rule named `name` queueing requests (cost 1) on `shaper`, with one queue per
    /// tier: tier `i` has `bounds[i]` places, a higher tier may take a lower one's by
    /// shedding its waiter, and at most the sum of the bounds wait in all (tier 0 is
    /// the lowest, shed first). `classify` gives each request its tier.
    ///
    /// # Errors
    ///
    /// [`ConfigError::PolicyName`] when `name` cannot be a header policy name;
    /// [`ConfigError::Tiers`] when `bounds` is empty.
    pub fn new(
        name: &str,
        shaper: Shaper<C, S>,
        bounds: &[usize],
        classify: E,
    ) -> Result<Self, ConfigError> {
        PriorityRule::shared(name, Arc::new(shaper), bounds, classify)
    }

    /// [`PriorityRule::new`] with a shaper the application keeps a handle on.
    ///
    /// # Errors
    ///
    /// As [`PriorityRule::new`].
    pub fn shared(
        name: &str,
        shaper: Arc<Shaper<C, S>>,
        bounds: &[usize],
        classify: E,
    ) -> Result<Self, ConfigError> {
        let name = PolicyName::new(name)?;
        if bounds.is_empty() {
            return Err(ConfigError::Tiers {
                name: name.as_str().to_owned(),
            });
        }
        let window = Some(window_secs(&shaper.policy()));
        Ok(PriorityRule {
            name,
            window,
            shaper,
            tiers: Arc::new(Tiers {
                bounds: bounds.into(),
                places: bounds.iter().fold(0, |sum, &b| sum.saturating_add(b)),
                queues: Mutex::new(Queues {
                    waiting: bounds.iter().map(|_| VecDeque::new()).collect(),
                    shed: Vec::new(),
                    holder: None,
                    next_id: 0,
                }),
                changed: Notify::new(),
            }),
            classify,
            cost: 1,
        })
    }

    /// Reserves `cost` units per request; a cost above the burst is refused when the
    /// layer is built ([`ConfigError::Cost`]).
    pub fn cost(self, cost: u32) -> Self {
        PriorityRule { cost, ..self }
    }

    /// The request's tier, and why its key was not usable: a missing key or a tier
    /// beyond the configured ones is tier 0.
    fn tier(&self, parts: &Parts) -> (usize, Option<KeyError>) {
        match self.classify.extract(parts) {
            Ok(t) if t < self.tiers.bounds.len() => (t, None),
            Ok(_) => (
                0,
                Some(KeyError::malformed("tier", "beyond the configured tiers")),
            ),
            Err(e) => (0, Some(e)),
        }
    }

    /// How many requests wait in each tier now.
    pub fn waiting(&self) -> Vec<usize> {
        self.tiers
            .lock()
            .waiting
            .iter()
            .map(VecDeque::len)
            .collect()
    }

    /// A refusal as a [`Decision`]: nothing remains; with nothing else arriving, the
    /// `ahead` waiters without a slot yet take theirs after the shaper's booked `TAT`
    /// (the holder's slot included), and this request fits when a plain GCRA check
    /// after all of them would: retry after `TAT + (ahead + 1)·n·T − τ − now`, and
    /// the bucket is empty again at `TAT + ahead·n·T`.
    fn refusal(&self, ahead: usize, never: bool) -> Decision {
        let policy: Policy = self.shaper.policy();
        let now = self.shaper.clock().now().as_u64();
        let tat = self.shaper.state().tat().as_u64().max(now);
        let slot = policy.interval_nanos().saturating_mul(u64::from(self.cost));
        let ahead = u64::try_from(ahead).unwrap_or(u64::MAX);
        let booked = tat.saturating_add(slot.saturating_mul(ahead));
        let tolerance = policy.burst().saturating_mul(policy.interval_nanos());
        let wait = booked
            .saturating_add(slot)
            .saturating_sub(now.saturating_add(tolerance));
        let reset = Duration::from_nanos(booked - now);
        let retry = (!never).then_some(Duration::from_nanos(wait));
        Decision::new(false, policy.burst(), 0, reset, retry)
    }

    /// The shaper's slot now, reserved within no delay, or why it is not free: the
    /// wait until it is ([`ShapeError::TooLong`]), or never (a cost above the burst).
    /// A reservation within no delay is exactly a plain GCRA admission (the same
    /// test, `new TAT ≤ now + τ`, and the same decision), so its receipt is that
    /// charge's ([`Reservation::into_receipt`]).
    fn reserve_now(&self) -> Result<Reservation, ShapeError> {
        self.shaper.reserve(self.cost, Duration::ZERO)
    }

    /// The arrival rule, shared by a request ([`wait_in_line`](Self::wait_in_line))
    /// and a peek ([`ErasedRule::peek_later`]): how a request of `tier` fares on the
    /// queues `q` as they are. `free` is asked only when nobody waits, for the
    /// shaper's slot now (a reservation within no delay, or its peek).
    fn arrive<T>(
        &self,
        q: &Queues,
        tier: usize,
        free: impl FnOnce() -> Result<T, ShapeError>,
    ) -> Arrival<T> {
        if q.is_empty() {
            match free() {
                Ok(taken) => return Arrival::Now(taken),
                Err(ShapeError::TooLong { .. }) => {}
                // Never (or any later non-retryable error): no wait helps.
                Err(_) => return Arrival::Refused(self.refusal(0, true)),
            }
        }
        let tiers = &*self.tiers;
        if q.waiting[tier].len() < tiers.bounds[tier] && q.len() < tiers.places {
            return Arrival::Join { shed: None };
        }
        // Full: shed the newest waiter of the lowest tier below this one (never the
        // one already sleeping on its reservation) and take its place.
        let holder = q.holder;
        let shed = (0..tier).find(|&t| {
            let back = q.waiting[t].back().copied();
            back.is_some() && back != holder
        });
        match shed {
            Some(t) => Arrival::Join { shed: Some(t) },
            None => Arrival::Refused(self.refusal(q.unbooked_ahead_of(tier), false)),
        }
    }

    /// Waits in `tier`'s queue for a slot: the admission, whether it waited in a
    /// queue and, for a slot taken at once, the receipt that gives it back; or the
    /// refusal (shed, queue full, never fits).
    async fn wait_in_line(
        &self,
        tier: usize,
    ) -> Result<(Decision, bool, Option<Receipt>), Decision> {
        let tiers = &*self.tiers;
        let mut guard = Leave {
            tiers,
            shaper: &self.shaper,
            id: None,
            reservation: None,
        };
        let id = {
            let mut q = tiers.lock();
            let free = || self.reserve_now();
            match self.arrive(&q, tier, free) {
                Arrival::Now(reservation) => {
                    let decision = reservation.decision();
                    // Reserved within no delay, its slot is now (`new TAT − τ ≤
                    // now`): it always converts to its charge's receipt.
                    return Ok((decision, false, reservation.into_receipt().ok()));
                }
                Arrival::Refused(refusal) => return Err(refusal),
                Arrival::Join { shed: None } => {}
                Arrival::Join { shed: Some(t) } => {
                    if let Some(v) = q.waiting[t].pop_back() {
                        q.shed.push(v);
                        tiers.changed.notify_waiters();
                    }
                }
            }
            let id = q.next_id;
            q.next_id += 1;
            q.waiting[tier].push_back(id);
            id
        };
        guard.id = Some(id);
        loop {
            let changed = tiers.changed.notified();
            tokio::pin!(changed);
            // Registered before the look, so no wake-up between the two is lost.
            changed.as_mut().enable();
            let reserved = {
                let mut q = tiers.lock();
                if let Some(at) = q.shed.iter().position(|&s| s == id) {
                    q.shed.swap_remove(at);
                    guard.id = None;
                    return Err(self.refusal(q.unbooked_ahead_of(tier), false));
                }
                if q.holder.is_none() && q.head() == Some(id) {
                    match self.shaper.reserve(self.cost, NO_DELAY_BOUND) {
                        Ok(r) => {
                            q.holder = Some(id);
                            Some(r)
                        }
                        Err(e) => {
                            q.remove(id);
                            guard.id = None;
                            tiers.changed.notify_waiters();
                            let never = !matches!(e, ShapeError::TooLong { .. });
                            return Err(self.refusal(0, never));
                        }
                    }
                } else {
                    None
                }
            };
            if let Some(r) = reserved {
                let delay = r.delay();
                guard.reservation = Some(r);
                tokio::time::sleep(delay).await;
                // The slot has come: keep it, leave the queue, let the next one reserve.
                guard.reservation = None;
                // The reservation's own decision counts what fits within its delay
                // bound (a year: always the whole burst); the headers show the
                // shaper as it is now that this request has taken its slot.
                let decision = self.shaper.peek_at(self.shaper.clock().now(), 0);
                return Ok((decision, true, None));
            }
            changed.await;
        }
    }
}

/// Takes a waiter out of its queue however its wait ends (served, refused or
/// cancelled), giving back a reservation it did not get to use.
struct Leave<'a, C: Clock, S: StateCell<GcraState>> {
    tiers: &'a Tiers,
    shaper: &'a Shaper<C, S>,
    id: Option<u64>,
    reservation: Option<Reservation>,
}

impl<C: Clock, S: StateCell<GcraState>> Drop for Leave<'_, C, S> {
    fn drop(&mut self) {
        let Some(id) = self.id else {
            return;
        };
        if let Some(r) = self.reservation.take() {
            self.shaper.cancel(r);
        }
        let mut q = self.tiers.lock();
        q.remove(id);
        if q.holder == Some(id) {
            q.holder = None;
        }
        if let Some(at) = q.shed.iter().position(|&s| s == id) {
            q.shed.swap_remove(at);
        }
        drop(q);
        self.tiers.changed.notify_waiters();
    }
}

impl<C, S, E> ErasedRule for PriorityRule<C, S, E>
where
    C: Clock + 'static,
    S: StateCell<GcraState> + Send + Sync + 'static,
    E: KeyExtractor<Key = usize>,
{
    fn start<'a>(&'a self, parts: &Parts, hasher: Option<&PartitionKeyHasher>) -> Started<'a> {
        let (tier, key_error) = self.tier(parts);
        let partition_key = hasher.map(|h| h.hash(&tier));
        let check = Box::pin(async move {
            let (decision, queued, receipt) = match self.wait_in_line(tier).await {
                Ok(admitted) => admitted,
                Err(refused) => (refused, false, None),
            };
            Ok(Check {
                decision,
                receipt: receipt.map(RuleReceipt::InProcess),
                queued,
            })
        });
        Started {
            key_error,
            partition_key,
            window: None,
            check: Some(check),
        }
    }

    /// Gives back a slot taken at once (its receipt: GCRA's refund rule, the slot of
    /// a waiter that reserved after it kept) and returns the shaper as a plain check
    /// sees it after the refund; a slot that was waited for stays taken (it has no
    /// receipt).
    fn refund(&self, _parts: &Parts, receipt: Receipt) -> Option<Decision> {
        let _ = self.shaper.refund(receipt);
        Some(self.shaper.peek_at(self.shaper.clock().now(), 0))
    }

    fn never_fits(&self) -> Option<(u32, u64)> {
        crate::queue::cost_above_burst(self.cost, &self.shaper.policy())
    }

    /// What the request's arrival would meet now ([`arrive`](PriorityRule::arrive)),
    /// taking no place and reserving nothing: its refusal when it would be refused
    /// (as the state too: the rule's own 429 shows it), otherwise an admission (it
    /// would go at once or wait in its tier) with the shaper as a plain check sees
    /// it now for the headers.
    fn peek_later(&self, parts: &Parts, hasher: Option<&PartitionKeyHasher>) -> Option<Peeked> {
        let (tier, _) = self.tier(parts);
        let now = self.shaper.clock().now();
        let arrival = {
            let q = self.tiers.lock();
            self.arrive(&q, tier, || {
                self.shaper
                    .peek_reserve_at(now, self.cost, Duration::ZERO)
                    .delay()
            })
        };
        let (at_cost, state) = match arrival {
            Arrival::Refused(refusal) => (refusal, refusal),
            Arrival::Now(_) | Arrival::Join { .. } => {
                let state = self.shaper.peek_at(now, 0);
                (state, state)
            }
        };
        Some(Peeked {
            at_cost,
            state,
            partition_key: hasher.map(|h| h.hash(&tier)),
            window: None,
        })
    }
}
