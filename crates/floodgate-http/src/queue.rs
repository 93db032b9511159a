//! Queueing (feature `queue`): a request that arrives early waits for its GCRA slot,
//! up to a bound, instead of being refused — nginx's `limit_req` `burst` without
//! `nodelay`, on a [`Shaper`].
//!
//! Each request reserves its slot with one compare-and-swap ([`Shaper::reserve`]);
//! slots are handed out in reservation order, and the request then sleeps until its
//! slot with one `tokio::time::sleep` (no polling). A slot further away than
//! `max_delay` is a 429 with `Retry-After` (rounded up); a cost above the burst is the
//! never-fits answer. A request cancelled while it waits (the client went away, a
//! timeout layer fired) gives its units back ([`Shaper::cancel`]).
//!
//! The shaper's clock and Tokio's must agree: use a real clock in production
//! ([`DefaultClock`](floodgate::DefaultClock)); the tests drive both from Tokio's
//! paused clock. The runtime needs its time driver (`#[tokio::main]` has it).

use core::fmt;
use std::sync::Arc;
use std::time::Duration;

use floodgate::{Clock, Decision, GcraState, Policy, ShapeError, Shaper, StateCell};
use http::request::Parts;

use crate::error::ConfigError;
use crate::headers::{window_secs, PartitionKeyHasher, PolicyName};
use crate::layer::{Check, ErasedRule, Started};

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

    /// Reserves `cost` units per request.
    pub fn cost(self, cost: u32) -> Self {
        QueueRule { cost, ..self }
    }

    /// The refusal as a [`Decision`], for the headers: GCRA's denial numbers at `now`.
    fn refusal(&self, error: ShapeError) -> Decision {
        let policy: Policy = self.shaper.policy();
        let now = self.shaper.clock().now();
        let tat = self.shaper.state().tat();
        let tolerance = policy.burst().saturating_mul(policy.interval_nanos());
        let headroom = now
            .as_u64()
            .saturating_add(tolerance)
            .saturating_sub(tat.as_u64());
        let remaining = headroom / policy.interval_nanos().max(1);
        let reset = tat.saturating_since(now).as_duration();
        let retry = match error {
            ShapeError::TooLong { retry_after } => Some(retry_after),
            _ => None,
        };
        Decision::new(false, policy.burst(), remaining, reset, retry)
    }
}

/// Gives a reservation's units back unless the wait completed.
struct CancelOnDrop<'a, C: Clock, S: StateCell<GcraState>> {
    shaper: &'a Shaper<C, S>,
    reservation: Option<floodgate::Reservation>,
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
            match self.shaper.reserve(self.cost, self.max_delay) {
                Ok(reservation) => {
                    let decision = reservation.decision();
                    let delay = reservation.delay();
                    let queued = !delay.is_zero();
                    if queued {
                        let mut pending = CancelOnDrop {
                            shaper: &*self.shaper,
                            reservation: Some(reservation),
                        };
                        tokio::time::sleep(delay).await;
                        // The slot has come: keep the units.
                        let _kept = pending.reservation.take();
                    }
                    // The slot has passed: there is nothing a receipt could give back.
                    Ok(Check {
                        decision,
                        receipt: None,
                        queued,
                    })
                }
                Err(e) => Ok(Check {
                    decision: self.refusal(e),
                    receipt: None,
                    queued: false,
                }),
            }
        });
        Started {
            key_error: None,
            partition_key,
            check: Some(check),
        }
    }

    /// The slot was waited for and has passed: nothing can be given back.
    fn refund(&self, _parts: &Parts, _receipt: floodgate::Receipt) -> Option<floodgate::Decision> {
        None
    }
}
