//! Queueing (feature `queue`): a request that arrives early waits for its GCRA slot,
//! up to a bound, instead of being refused — nginx's `limit_req` `burst` without
//! `nodelay`: one queue for every request on a [`Shaper`] ([`QueueRule`]), or one
//! queue per key (client IP, API key) on a keyed GCRA limiter ([`KeyedQueueRule`]),
//! where a client that sends too fast waits behind its own requests only.
//!
//! Each request reserves its slot with one compare-and-swap ([`Shaper::reserve`],
//! [`KeyedLimiter::reserve`]); slots are handed out in reservation order, and the
//! request then sleeps until its slot with one `tokio::time::sleep` (no polling). A
//! slot further away than `max_delay` is a 429 with `Retry-After` (rounded up); a
//! cost above the burst, which no slot can hold, is refused when the layer is built
//! ([`ConfigError::Cost`]). A request cancelled while it waits (the client went away,
//! a timeout layer fired) gives its units back ([`Shaper::cancel`]).
//!
//! A slot free when the request arrives is an admission like any in-process rule's:
//! a reservation granted with no delay is exactly a plain GCRA admission (its test,
//! `new TAT ≤ now + τ`, and its transition), and the core hands it over as the
//! receipt that charge would give
//! ([`Reservation::into_receipt`](floodgate::Reservation::into_receipt), the keyed
//! reservation's receipt) — one reservation per request, whether it waits or not. When a later rule of the layer rejects the request, or the request is
//! dropped after this rule, that slot is given back by its receipt
//! ([`Shaper::refund`], [`KeyedLimiter::refund`]: GCRA's refund rule, the slots
//! reserved after it kept), as the layer gives back every in-process charge (see
//! `RateLimitLayer`, "How rules combine"). A slot the request waited for stays
//! taken: the request has had its turn.
//!
//! An answer's `remaining` (an admission's or a refusal's) counts the units that
//! could still be reserved within `max_delay` (at most the burst), and its reset is
//! the time until the schedule is idle; a request that waited is told them as they
//! are when its slot comes (the requests that joined the queue behind it have taken
//! theirs by then), not as they were when it joined.
//!
//! When an earlier rule denies a request, a later queue is peeked (reserving
//! nothing, [`Shaper::peek_reserve`], [`KeyedLimiter::peek_reserve`]: the core's
//! own reservation rule, run on the schedule as it is): if it would refuse the
//! request too, the 429's `Retry-After` is at least the wait its own refusal would
//! give — until the same reservation's slot is at most `max_delay` away (see
//! `RateLimitLayer`, "How rules combine").
//!
//! The shaper's clock and Tokio's must agree: use a real clock in production
//! ([`DefaultClock`](floodgate::DefaultClock)); the tests drive both from Tokio's
//! paused clock. The runtime needs its time driver (`#[tokio::main]` has it).

use core::fmt;
use std::sync::Arc;
use std::time::Duration;

use floodgate::{
    Clock, Decision, Gcra, GcraState, KeyedLimiter, Nanos, Policy, Receipt, ReservationPeek,
    ShapeError, Shaper, StateCell, Storage,
};
use http::request::Parts;

use crate::error::ConfigError;
use crate::extract::KeyExtractor;
use crate::headers::{window_secs, PartitionKeyHasher, PolicyName};
use crate::layer::{Check, Checked, ErasedRule, Peeked, RuleReceipt, Started};

/// A queueing rule for [`RateLimitLayerBuilder::queue`](crate::RateLimitLayerBuilder::queue):
/// one shaper for every request (a global queue).
///
/// # Examples
///
/// ```
/// use floodgate::{Policy, Shaper};
/// use floodgate_http::{QueueRule, RateLimitLayer};
/// use std::time::Duration;
/// // 100 per second, one at a time, a request waits at most 250 ms.
/// let policy = Policy::per_second(100)?.with_burst(1)?;
/// let layer = RateLimitLayer::builder()
///     .queue(QueueRule::new("smooth", Shaper::new(policy), Duration::from_millis(250))?)
///     .build()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct QueueRule<C, S> {
    pub(crate) name: PolicyName,
    shaper: Arc<Shaper<C, S>>,
    max_delay: Duration,
    cost: u32,
    pub(crate) window: Option<u64>,
}

impl<C, S> fmt::Debug for QueueRule<C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueRule")
            .field("name", &self.name)
            .field("max_delay", &self.max_delay)
            .field("cost", &self.cost)
            .finish_non_exhaustive()
    }
}

impl<C, S> QueueRule<C, S>
where
    C: Clock + 'static,
    S: StateCell<GcraState> + Send + Sync + 'static,
{
    /// A rule named `name` queueing each request (cost 1) on `shaper` for at most
    /// `max_delay`; it advertises the shaper's GCRA window `⌈B·T⌉`.
    ///
    /// # Errors
    ///
    /// [`ConfigError::PolicyName`] when `name` cannot be a header policy name.
    pub fn new(name: &str, shaper: Shaper<C, S>, max_delay: Duration) -> Result<Self, ConfigError> {
        QueueRule::shared(name, Arc::new(shaper), max_delay)
    }

    /// [`QueueRule::new`] with a shaper the application keeps a handle on.
    ///
    /// # Errors
    ///
    /// [`ConfigError::PolicyName`] when `name` cannot be a header policy name.
    pub fn shared(
        name: &str,
        shaper: Arc<Shaper<C, S>>,
        max_delay: Duration,
    ) -> Result<Self, ConfigError> {
        let window = Some(window_secs(&shaper.policy()));
        Ok(QueueRule {
            name: PolicyName::new(name)?,
            shaper,
            max_delay,
            cost: 1,
            window,
        })
    }

    /// Reserves `cost` units per request; a cost above the burst is refused when the
    /// layer is built ([`ConfigError::Cost`]).
    pub fn cost(self, cost: u32) -> Self {
        QueueRule { cost, ..self }
    }

    /// The reservation of `cost` this rule would make at `now`, reserving nothing.
    fn peek(&self, now: Nanos, cost: u32) -> ReservationPeek {
        self.shaper.peek_reserve_at(now, cost, self.max_delay)
    }

    /// The schedule now: the peek of a reservation of nothing, an admission whose
    /// `remaining` counts the units that could still be reserved within `max_delay`
    /// (at most the burst), as a reservation's own decision counts them when it is
    /// made, and whose reset is `TAT − now`. A request that waited is answered with
    /// it when its slot comes (its reservation's decision was made when it joined
    /// the queue, and the requests that joined after it have since taken units it
    /// counted), and a refusal counts its units the same way.
    fn schedule(&self) -> Decision {
        self.peek(self.shaper.clock().now(), 0).decision()
    }
}

/// A queueing rule's answer with no receipt: a slot waited for (it stays taken: the
/// request has had its turn), or a refusal (nothing was reserved).
fn checked(decision: Decision, queued: bool) -> Checked {
    Ok(Check {
        decision,
        receipt: None,
        queued,
    })
}

/// Units a waiting request holds: given back when dropped (the request was
/// cancelled before its slot) unless kept.
trait Held {
    /// The slot has come: the units are the request's.
    fn keep(&mut self);
}

/// Sleeps until the slot `delay` away, holding `pending`; a drop before then (the
/// client went away, a timeout layer fired) gives the units back.
async fn wait_for_slot(delay: Duration, mut pending: impl Held) {
    tokio::time::sleep(delay).await;
    pending.keep();
}

/// Gives a reservation's units back unless the wait completed.
struct CancelOnDrop<'a, C: Clock, S: StateCell<GcraState>> {
    shaper: &'a Shaper<C, S>,
    reservation: Option<floodgate::Reservation>,
}

impl<C: Clock, S: StateCell<GcraState>> Held for CancelOnDrop<'_, C, S> {
    fn keep(&mut self) {
        self.reservation = None;
    }
}

impl<C: Clock, S: StateCell<GcraState>> Drop for CancelOnDrop<'_, C, S> {
    fn drop(&mut self) {
        if let Some(r) = self.reservation.take() {
            self.shaper.cancel(r);
        }
    }
}

impl<C, S> ErasedRule for QueueRule<C, S>
where
    C: Clock + 'static,
    S: StateCell<GcraState> + Send + Sync + 'static,
{
    fn start<'a>(&'a self, _parts: &Parts, hasher: Option<&PartitionKeyHasher>) -> Started<'a> {
        let partition_key = hasher.map(|h| h.hash(&()));
        let check = Box::pin(async move {
            let reservation = match self.shaper.reserve(self.cost, self.max_delay) {
                Ok(reservation) => reservation,
                // The schedule now, with the reservation's own wait: when the same
                // reservation would fit within `max_delay`.
                Err(e) => return checked(refused(self.schedule(), e), false),
            };
            let decision = reservation.decision();
            match reservation.into_receipt() {
                // The slot is free now: the reservation is a plain GCRA admission, and
                // its receipt the one that charge would give: a later rule's denial
                // gives it back ([`ErasedRule::refund`]).
                Ok(receipt) => Ok(Check {
                    decision,
                    receipt: Some(RuleReceipt::InProcess(receipt)),
                    queued: false,
                }),
                Err(reservation) => {
                    let delay = reservation.delay();
                    let pending = CancelOnDrop {
                        shaper: &*self.shaper,
                        reservation: Some(reservation),
                    };
                    wait_for_slot(delay, pending).await;
                    // The slot has come: it stays taken (no receipt), by design.
                    checked(self.schedule(), true)
                }
            }
        });
        Started {
            key_error: None,
            partition_key,
            window: None,
            check: Some(check),
        }
    }

    /// Gives back a slot taken at once (its receipt: GCRA's refund rule, the slots
    /// reserved after it kept) and returns the schedule after it; a slot that was
    /// waited for stays taken (it has no receipt).
    fn refund(&self, _parts: &Parts, receipt: Receipt) -> Option<Decision> {
        let _ = self.shaper.refund(receipt);
        Some(self.schedule())
    }

    fn never_fits(&self) -> Option<(u32, u64)> {
        cost_above_burst(self.cost, &self.shaper.policy())
    }

    /// The reservation this rule would make now, reserving nothing ([`queue_peek`]).
    fn peek_later(&self, _parts: &Parts, hasher: Option<&PartitionKeyHasher>) -> Option<Peeked> {
        let now = self.shaper.clock().now();
        let peeked = queue_peek(|cost| self.peek(now, cost), self.cost);
        Some(Peeked {
            partition_key: hasher.map(|h| h.hash(&())),
            ..peeked
        })
    }
}

/// What a queueing rule's reservation of `cost` units would decide now, reserving
/// nothing, for a request an earlier rule denied ([`ErasedRule::peek_later`]), from
/// `peek` (the core's peek of the rule's reservation at one instant, by cost): the
/// peek at the cost, and the schedule (the peek at cost 0) for the headers.
///
/// The core decides it with the reservation's own rule
/// ([`Shaper::peek_reserve`]): when the reservation would not fit, the peek denies
/// with the same wait the rule's own refusal gives ([`ShapeError::TooLong`]) and the
/// schedule's `remaining` and reset — after that wait, if nothing else reserves, the
/// same reservation fits, its slot at most `max_delay` away (the request is queued up
/// to `max_delay`, not necessarily admitted at once). A cost above the burst never
/// fits (no wait); a cost of 0 always does. The two peeks read the schedule one after
/// the other: a reservation or cancellation between them may show in one only.
fn queue_peek(peek: impl Fn(u32) -> ReservationPeek, cost: u32) -> Peeked {
    Peeked {
        at_cost: peek(cost).decision(),
        state: peek(0).decision(),
        partition_key: None,
        window: None,
    }
}

/// `schedule` as the refusal of a reservation that failed with `error`.
fn refused(schedule: Decision, error: ShapeError) -> Decision {
    let retry = match error {
        ShapeError::TooLong { retry_after } => Some(retry_after),
        _ => None,
    };
    Decision::new(
        false,
        schedule.limit(),
        schedule.remaining(),
        schedule.reset_after(),
        retry,
    )
}

/// The cost and the burst when a GCRA schedule can never hold `cost` units (`n > B`).
pub(crate) fn cost_above_burst(cost: u32, policy: &Policy) -> Option<(u32, u64)> {
    (u64::from(cost) > policy.burst()).then_some((cost, policy.burst()))
}

/// A queueing rule per key for
/// [`RateLimitLayerBuilder::queue_per_key`](crate::RateLimitLayerBuilder::queue_per_key):
/// each key the extractor finds (client IP, API key, route) waits for its own GCRA
/// slot on a keyed limiter ([`KeyedLimiter::reserve`]), up to `max_delay`; keys never
/// wait for each other. A slot further than `max_delay` is a 429 with `Retry-After`;
/// a request without a usable key is a 400. A request cancelled while it waits gives
/// its units back (the receipt's refund).
///
/// What waits is bounded per key — the requests whose slots fit within `max_delay`
/// of the key's schedule, `burst + ⌊max_delay / T⌋` of cost 1 — not in total: every key
/// with a booked schedule may hold that many, and a key evicted from a full table
/// (its schedule forgotten, see [`KeyedLimiter`]'s eviction) leaves its waiters to
/// sleep out their slots while its next requests start afresh. Each waiter is a
/// request the server holds; bound them all with a concurrency limit in front of the
/// layer (tower's `ConcurrencyLimitLayer`, the server's connection limit).
///
/// # Examples
///
/// ```
/// use floodgate::{Gcra, KeyedBuilder, Policy};
/// use floodgate_http::{KeyedQueueRule, PeerIp, RateLimitLayer};
/// use std::time::Duration;
/// // Each client IP: 10 per second, one at a time, a request waits at most 500 ms.
/// let per_ip = KeyedBuilder::new(Gcra::new(Policy::per_second(10)?.with_burst(1)?))
///     .capacity(100_000)
///     .build_inline()?;
/// let layer = RateLimitLayer::builder()
///     .queue_per_key(KeyedQueueRule::new("per-ip", PeerIp::new(), per_ip, Duration::from_millis(500))?)
///     .build()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct KeyedQueueRule<E, C, S>
where
    E: KeyExtractor,
    S: Storage<E::Key, GcraState>,
{
    pub(crate) name: PolicyName,
    limiter: Arc<KeyedLimiter<E::Key, Gcra, C, S>>,
    extractor: E,
    max_delay: Duration,
    cost: u32,
    pub(crate) window: Option<u64>,
}

impl<E, C, S> fmt::Debug for KeyedQueueRule<E, C, S>
where
    E: KeyExtractor + fmt::Debug,
    S: Storage<E::Key, GcraState>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedQueueRule")
            .field("name", &self.name)
            .field("extractor", &self.extractor)
            .field("max_delay", &self.max_delay)
            .field("cost", &self.cost)
            .finish_non_exhaustive()
    }
}

impl<E, C, S> KeyedQueueRule<E, C, S>
where
    E: KeyExtractor,
    E::Key: Clone,
    C: Clock + 'static,
    S: Storage<E::Key, GcraState> + 'static,
{
    /// A rule named `name` queueing each request (cost 1) on its key's schedule in
    /// `limiter` for at most `max_delay`; it advertises the GCRA window `⌈B·T⌉`.
    ///
    /// # Errors
    ///
    /// [`ConfigError::PolicyName`] when `name` cannot be a header policy name.
    pub fn new(
        name: &str,
        extractor: E,
        limiter: KeyedLimiter<E::Key, Gcra, C, S>,
        max_delay: Duration,
    ) -> Result<Self, ConfigError> {
        KeyedQueueRule::shared(name, extractor, Arc::new(limiter), max_delay)
    }

    /// [`KeyedQueueRule::new`] with a limiter the application keeps a handle on.
    ///
    /// # Errors
    ///
    /// [`ConfigError::PolicyName`] when `name` cannot be a header policy name.
    pub fn shared(
        name: &str,
        extractor: E,
        limiter: Arc<KeyedLimiter<E::Key, Gcra, C, S>>,
        max_delay: Duration,
    ) -> Result<Self, ConfigError> {
        let window = Some(window_secs(&limiter.algorithm().policy()));
        Ok(KeyedQueueRule {
            name: PolicyName::new(name)?,
            limiter,
            extractor,
            max_delay,
            cost: 1,
            window,
        })
    }

    /// Reserves `cost` units per request; a cost above the burst is refused when the
    /// layer is built ([`ConfigError::Cost`]).
    pub fn cost(self, cost: u32) -> Self {
        KeyedQueueRule { cost, ..self }
    }

    /// The reservation of `cost` this rule would make for `key` at `now`, reserving
    /// nothing.
    fn peek(&self, key: &E::Key, now: Nanos, cost: u32) -> ReservationPeek {
        self.limiter.peek_reserve_at(key, now, cost, self.max_delay)
    }

    /// `key`'s schedule now, as [`QueueRule`]'s.
    fn schedule(&self, key: &E::Key) -> Decision {
        self.peek(key, self.limiter.clock().now(), 0).decision()
    }
}

/// Gives a keyed reservation's units back unless the wait completed.
struct RefundOnDrop<'a, K, C, S>
where
    K: Clone + core::hash::Hash + Eq,
    C: Clock,
    S: Storage<K, GcraState>,
{
    limiter: &'a KeyedLimiter<K, Gcra, C, S>,
    key: &'a K,
    receipt: Option<Receipt>,
}

impl<K, C, S> Held for RefundOnDrop<'_, K, C, S>
where
    K: Clone + core::hash::Hash + Eq,
    C: Clock,
    S: Storage<K, GcraState>,
{
    fn keep(&mut self) {
        self.receipt = None;
    }
}

impl<K, C, S> Drop for RefundOnDrop<'_, K, C, S>
where
    K: Clone + core::hash::Hash + Eq,
    C: Clock,
    S: Storage<K, GcraState>,
{
    fn drop(&mut self) {
        if let Some(receipt) = self.receipt.take() {
            let _ = self.limiter.refund(self.key, receipt);
        }
    }
}

impl<E, C, S> ErasedRule for KeyedQueueRule<E, C, S>
where
    E: KeyExtractor,
    E::Key: Clone,
    C: Clock + 'static,
    S: Storage<E::Key, GcraState> + 'static,
{
    fn start<'a>(&'a self, parts: &Parts, hasher: Option<&PartitionKeyHasher>) -> Started<'a> {
        let key = match self.extractor.extract(parts) {
            Ok(key) => key,
            Err(e) => {
                return Started {
                    key_error: Some(e),
                    partition_key: None,
                    window: None,
                    check: None,
                }
            }
        };
        let partition_key = hasher.map(|h| h.hash(&key));
        let check = Box::pin(async move {
            match self.limiter.reserve(&key, self.cost, self.max_delay) {
                Ok((decision, delay, receipt)) if delay.is_zero() => {
                    // The slot is free now: this reservation is exactly a plain GCRA
                    // charge (the same transition, `new TAT ≤ now + τ`), and its
                    // receipt is the one that charge would give: a later rule's
                    // denial gives it back ([`ErasedRule::refund`]).
                    Ok(Check {
                        decision,
                        receipt: Some(RuleReceipt::InProcess(receipt)),
                        queued: false,
                    })
                }
                Ok((_, delay, receipt)) => {
                    let pending = RefundOnDrop {
                        limiter: &*self.limiter,
                        key: &key,
                        receipt: Some(receipt),
                    };
                    wait_for_slot(delay, pending).await;
                    // The slot has come: it stays taken (no receipt), by design.
                    checked(self.schedule(&key), true)
                }
                // The key's schedule now, with the reservation's own wait: when the
                // same reservation would fit within `max_delay`.
                Err(e) => checked(refused(self.schedule(&key), e), false),
            }
        });
        Started {
            key_error: None,
            partition_key,
            window: None,
            check: Some(check),
        }
    }

    /// Gives back a slot taken at once (its receipt: GCRA's refund rule, the slots
    /// reserved after it kept) and returns the key's schedule after it; a slot that
    /// was waited for stays taken (it has no receipt). `None` without a usable key.
    fn refund(&self, parts: &Parts, receipt: Receipt) -> Option<Decision> {
        let key = self.extractor.extract(parts).ok()?;
        let _ = self.limiter.refund(&key, receipt);
        Some(self.schedule(&key))
    }

    fn never_fits(&self) -> Option<(u32, u64)> {
        cost_above_burst(self.cost, &self.limiter.algorithm().policy())
    }

    /// The reservation this rule would make now for the request's key, reserving
    /// nothing ([`queue_peek`]); `None` without a usable key.
    fn peek_later(&self, parts: &Parts, hasher: Option<&PartitionKeyHasher>) -> Option<Peeked> {
        let key = self.extractor.extract(parts).ok()?;
        let now = self.limiter.clock().now();
        let peeked = queue_peek(|cost| self.peek(&key, now, cost), self.cost);
        Some(Peeked {
            partition_key: hasher.map(|h| h.hash(&key)),
            ..peeked
        })
    }
}
