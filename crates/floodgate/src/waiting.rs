//! Waiting for capacity: [`Wait`] blocks a thread or awaits a future until a
//! [`Limit`] admits `cost` units, for every direct limiter.
//!
//! # How each limiter waits
//!
//! * **GCRA** ([`RateLimiter<Gcra>`](crate::RateLimiter), [`Shaper`](crate::Shaper))
//!   waits through a *booking*: one compare-and-swap reserves the earliest slot
//!   however far ahead ([`Limit::book_at`]), then the waiter sleeps until it. Slots
//!   are handed out first come, first served; a booking is never re-checked. If an
//!   async wait is dropped before its slot, its units are given back (the booking's
//!   receipt is refunded: the part of it the clock has not reached, less what later
//!   bookings still wait on — their slots are handed out and stay spent).
//! * **Windows and the sliding log** cannot book ahead: the waiter checks, sleeps
//!   until the denial's `retry_after`, and checks again. Nothing is held while it
//!   sleeps, so a waiter can lose the freed capacity to another request and sleep
//!   again: no fairness between waiters.
//!
//! A cost that can never fit (above the capacity) returns
//! [`WaitError::Never`] at once, and so does a wait that would end past the last
//! instant a clock reads (`u64::MAX` ns).
//!
//! # Jitter
//!
//! [`Jitter::up_to(max)`](Jitter::up_to) adds a uniformly drawn extra delay in
//! `[0, max]` to each sleep, so that waiters released at the same instant do not
//! all retry at once. It only ever adds: a jittered sleep is never shorter than the
//! wait the limiter asked for. (With a booking the extra delay is spent after the
//! slot, which stays booked.)
//!
//! # Runtimes
//!
//! Nothing here names a runtime. The blocking forms sleep with
//! `std::thread::sleep` ([`Wait::wait`]) or a sleep function you pass
//! ([`Wait::wait_with`]); the async form takes a function returning the runtime's
//! sleep future ([`Wait::until_ready_with`]): `tokio::time::sleep`,
//! `async_io::Timer::after` (smol, async-std), or a test's own. With the `tokio`
//! feature, `Wait::until_ready` passes `tokio::time::sleep` for you. A sleep
//! function keeps this crate free of a timer dependency and lets tests drive a
//! [`ManualClock`](crate::ManualClock).
//!
//! The delay is measured on the limiter's clock and slept on the runtime's, so wait
//! on a real clock ([`DefaultClock`](crate::DefaultClock),
//! [`StdClock`](crate::StdClock)) in production.

use core::fmt;
use core::future::Future;
use core::time::Duration;

use crate::algorithm::Algorithm;
use crate::clock::Clock;
use crate::keyed::composite::Limit;
use crate::keyed::{KeyedLimiter, Lookup, Storage};
use crate::receipt::Receipt;
use crate::sync::unique_id;

/// An extra delay drawn uniformly from `[0, max]` and added to every sleep of a
/// wait; [`Jitter::NONE`] adds nothing.
///
/// # Examples
///
/// ```
/// use floodgate::Jitter;
/// use std::time::Duration;
/// let jitter = Jitter::up_to(Duration::from_millis(10));
/// let wait = Duration::from_millis(100);
/// let slept = jitter.add_to(wait, 0x8000_0000_0000_0000);
/// assert_eq!(slept, Duration::from_millis(105)); // the middle of the range
/// assert_eq!(Jitter::NONE.add_to(wait, 12345), wait);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Jitter {
    max: Duration,
}

impl Jitter {
    /// No jitter.
    pub const NONE: Jitter = Jitter {
        max: Duration::ZERO,
    };

    /// Up to `max` of extra delay on each sleep.
    pub const fn up_to(max: Duration) -> Jitter {
        Jitter { max }
    }

    /// The largest extra delay.
    pub const fn max(&self) -> Duration {
        self.max
    }

    /// `wait` plus the extra delay that `random` (a uniformly random `u64`) picks
    /// from `[0, max]`: never less than `wait`, never more than `wait + max`
    /// (saturating at `Duration::MAX`).
    pub fn add_to(&self, wait: Duration, random: u64) -> Duration {
        // ⌊(max + 1) · random / 2^64⌋ ∈ [0, max] nanoseconds.
        let span = self.max.as_nanos().saturating_add(1);
        let extra = span.saturating_mul(u128::from(random)) >> 64;
        let extra = u64::try_from(extra).unwrap_or(u64::MAX);
        wait.saturating_add(Duration::from_nanos(extra).min(self.max))
    }

    /// `wait` plus a fresh random extra delay.
    fn apply(&self, wait: Duration) -> Duration {
        if self.max.is_zero() {
            return wait;
        }
        self.add_to(wait, random_u64())
    }
}

/// A per-thread splitmix64 stream, seeded from a process-unique number: jitter needs
/// spread, not cryptographic strength.
fn random_u64() -> u64 {
    std::thread_local! {
        static STATE: core::cell::Cell<u64> =
            core::cell::Cell::new(unique_id().wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03);
    }
    STATE.with(|state| {
        let next = state.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
        state.set(next);
        let mut z = next;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    })
}

/// Why a wait cannot succeed.
///
/// # Examples
///
/// ```
/// use floodgate::{ManualClock, Policy, RateLimiter, Wait, WaitError};
/// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(2)?, ManualClock::new());
/// assert_eq!(limiter.wait(3), Err(WaitError::Never { cost: 3 }));
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitError {
    /// The cost exceeds the limit's capacity, or its admission would come after
    /// the last instant a clock reads (`u64::MAX` ns, the year 2554 on the
    /// Unix-anchored clocks): no wait helps.
    Never {
        /// The cost asked for.
        cost: u32,
    },
}

impl fmt::Display for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitError::Never { cost } => {
                write!(
                    f,
                    "a cost of {cost} can never be admitted: it exceeds the limit's capacity \
                     (or its wait ends past the clock's last instant)"
                )
            }
        }
    }
}

impl std::error::Error for WaitError {}

/// One step of a wait: admitted, or how long to sleep (and, for a booking, the
/// receipt that holds the slot meanwhile).
enum Step {
    Done,
    Sleep(Duration, Option<Receipt>),
}

fn step<L: Limit + ?Sized>(limit: &L, cost: u32) -> Result<Step, WaitError> {
    let now = limit.now();
    if let Some((decision, delay, receipt)) = limit.book_at(now, cost) {
        if !decision.is_allowed() {
            return Err(WaitError::Never { cost });
        }
        return Ok(if delay.is_zero() {
            Step::Done
        } else {
            Step::Sleep(delay, Some(receipt))
        });
    }
    let decision = limit.check_n_at(now, cost);
    if decision.is_allowed() {
        return Ok(Step::Done);
    }
    // A wait that would end past the last reading a clock has (`u64::MAX` ns: in
    // the last window, the next one starts at 2^64 ns) never ends: no clock gets
    // there, so sleeping on it would be denied at the same reading for ever.
    match decision
        .retry_after_nanos()
        .filter(|&wait| now.as_u64().checked_add(wait).is_some())
    {
        Some(wait) => Ok(Step::Sleep(Duration::from_nanos(wait), None)),
        None => Err(WaitError::Never { cost }),
    }
}

/// Gives a booking back if the wait that holds it is dropped before its slot.
struct Held<'a, L: Limit + ?Sized> {
    limit: &'a L,
    receipt: Option<Receipt>,
}

impl<L: Limit + ?Sized> Drop for Held<'_, L> {
    fn drop(&mut self) {
        if let Some(receipt) = self.receipt.take() {
            let _ = self.limit.refund(receipt);
        }
    }
}

/// Waiting until a [`Limit`] admits `cost` units: blocking or async, on any runtime
/// (see the [module docs](self)). Implemented for every [`Limit`].
///
/// Each method returns the total time it slept (zero when admitted at once).
///
/// # Examples
///
/// ```
/// use floodgate::{Jitter, ManualClock, Policy, RateLimiter, Wait};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(10)?.with_burst(1)?, clock.clone());
/// // A sleep that advances the manual clock instead of the thread.
/// let sleep = |d: Duration| {
///     clock.advance(d);
/// };
/// assert_eq!(limiter.wait_with(1, Jitter::NONE, sleep), Ok(Duration::ZERO));
/// assert_eq!(limiter.wait_with(1, Jitter::NONE, sleep), Ok(Duration::from_millis(100)));
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
pub trait Wait: Limit {
    /// Blocks the thread (`std::thread::sleep`) until `cost` units are admitted.
    ///
    /// # Errors
    ///
    /// [`WaitError::Never`] when `cost` exceeds the capacity (nothing slept).
    fn wait(&self, cost: u32) -> Result<Duration, WaitError> {
        self.wait_with(cost, Jitter::NONE, std::thread::sleep)
    }

    /// Blocks until `cost` units are admitted, sleeping with `sleep` and adding
    /// `jitter` to each sleep.
    ///
    /// # Errors
    ///
    /// As [`wait`](Wait::wait).
    fn wait_with(
        &self,
        cost: u32,
        jitter: Jitter,
        mut sleep: impl FnMut(Duration),
    ) -> Result<Duration, WaitError> {
        let mut slept = Duration::ZERO;
        loop {
            match step(self, cost)? {
                Step::Done => return Ok(slept),
                Step::Sleep(wait, booked) => {
                    let wait = jitter.apply(wait);
                    sleep(wait);
                    slept = slept.saturating_add(wait);
                    if booked.is_some() {
                        // The slot has come: the units are ours.
                        return Ok(slept);
                    }
                }
            }
        }
    }

    /// Waits asynchronously until `cost` units are admitted, sleeping on the future
    /// `sleep` returns and adding `jitter` to each sleep. Dropping the future before
    /// a booked slot gives the booking back.
    ///
    /// # Errors
    ///
    /// As [`wait`](Wait::wait).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Jitter, Policy, RateLimiter, Wait};
    /// use std::time::Duration;
    /// # let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
    /// # rt.block_on(async {
    /// let limiter = RateLimiter::gcra(Policy::per_second(1000)?.with_burst(1)?);
    /// let jitter = Jitter::up_to(Duration::from_micros(100));
    /// limiter.until_ready_with(1, jitter, tokio::time::sleep).await.unwrap();
    /// limiter.until_ready_with(1, jitter, tokio::time::sleep).await.unwrap();
    /// # Ok::<(), floodgate::PolicyError>(())
    /// # }).unwrap();
    /// ```
    fn until_ready_with<F>(
        &self,
        cost: u32,
        jitter: Jitter,
        mut sleep: impl FnMut(Duration) -> F + Send,
    ) -> impl Future<Output = Result<Duration, WaitError>> + Send
    where
        F: Future<Output = ()> + Send,
        Self: Sync,
    {
        async move {
            let mut slept = Duration::ZERO;
            loop {
                match step(self, cost)? {
                    Step::Done => return Ok(slept),
                    Step::Sleep(wait, booked) => {
                        let wait = jitter.apply(wait);
                        let booked = booked.is_some().then_some(Held {
                            limit: self,
                            receipt: booked,
                        });
                        sleep(wait).await;
                        slept = slept.saturating_add(wait);
                        if let Some(mut held) = booked {
                            // The slot has come: keep the units.
                            let _kept = held.receipt.take();
                            return Ok(slept);
                        }
                    }
                }
            }
        }
    }

    /// [`until_ready_with`](Wait::until_ready_with) on Tokio's timer
    /// (`tokio::time::sleep`), without jitter. Must run inside a Tokio runtime with
    /// the time driver enabled.
    ///
    /// # Errors
    ///
    /// As [`wait`](Wait::wait).
    #[cfg(feature = "tokio")]
    fn until_ready(&self, cost: u32) -> impl Future<Output = Result<Duration, WaitError>> + Send
    where
        Self: Sync,
    {
        self.until_ready_with(cost, Jitter::NONE, tokio::time::sleep)
    }
}

impl<L: Limit + ?Sized> Wait for L {}

/// Waiting for one key of a [`KeyedLimiter`]: [`Wait`] on
/// [`limit(key)`](KeyedLimiter::limit). GCRA waits through a booking of the key's
/// own schedule ([`KeyedLimiter::book_at`]: first come, first served among the
/// key's waiters, given back if an async wait is dropped before its slot); the
/// windows and the log check, sleep until `retry_after` and check again.
impl<K, A, C, S> KeyedLimiter<K, A, C, S>
where
    A: Algorithm,
    C: Clock,
    S: Storage<K, A::State>,
{
    /// Blocks the thread (`std::thread::sleep`) until `cost` units for `key` are
    /// admitted; returns how long it slept.
    ///
    /// # Errors
    ///
    /// [`WaitError::Never`] when `cost` exceeds the capacity (nothing slept).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedLimiter, Policy};
    /// let keyed: KeyedLimiter<String> = KeyedLimiter::gcra(Policy::per_second(1000)?.with_burst(1)?);
    /// assert!(keyed.wait_key("alice", 1)?.is_zero());
    /// assert!(keyed.wait_key("alice", 1).is_ok()); // sleeps about 1 ms
    /// assert!(keyed.wait_key("alice", 2).is_err()); // never fits a burst of 1
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_key<Q>(&self, key: &Q, cost: u32) -> Result<Duration, WaitError>
    where
        Q: Lookup<K> + ?Sized,
    {
        self.limit(key).wait(cost)
    }

    /// Blocks until `cost` units for `key` are admitted, sleeping with `sleep` and
    /// adding `jitter` to each sleep ([`Wait::wait_with`]).
    ///
    /// # Errors
    ///
    /// As [`wait_key`](KeyedLimiter::wait_key).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{FixedWindow, Jitter, KeyedBuilder, ManualClock, Policy};
    /// use std::time::Duration;
    /// let clock = ManualClock::new();
    /// let keyed = KeyedBuilder::new(FixedWindow::new(Policy::per_second(1)?)?)
    ///     .clock(clock.clone())
    ///     .build::<u64>()?;
    /// let sleep = |d: Duration| {
    ///     clock.advance(d);
    /// };
    /// assert_eq!(keyed.wait_key_with(&7, 1, Jitter::NONE, sleep)?, Duration::ZERO);
    /// // A window cannot book: the waiter sleeps until the next window and checks again.
    /// assert_eq!(keyed.wait_key_with(&7, 1, Jitter::NONE, sleep)?, Duration::from_secs(1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_key_with<Q>(
        &self,
        key: &Q,
        cost: u32,
        jitter: Jitter,
        sleep: impl FnMut(Duration),
    ) -> Result<Duration, WaitError>
    where
        Q: Lookup<K> + ?Sized,
    {
        self.limit(key).wait_with(cost, jitter, sleep)
    }

    /// Waits asynchronously until `cost` units for `key` are admitted, sleeping on
    /// the future `sleep` returns ([`Wait::until_ready_with`]). Dropping the future
    /// before a booked slot gives the booking back.
    ///
    /// # Errors
    ///
    /// As [`wait_key`](KeyedLimiter::wait_key).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Gcra, Jitter, KeyedBuilder, ManualClock, Policy};
    /// use std::time::Duration;
    /// # let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
    /// # rt.block_on(async {
    /// let keyed = KeyedBuilder::new(Gcra::new(Policy::per_second(10)?.with_burst(1)?))
    ///     .clock(ManualClock::new()) // stands still unless advanced: the wait is exact
    ///     .build::<String>()?;
    /// keyed.until_key_ready_with("alice", 1, Jitter::NONE, tokio::time::sleep).await?;
    /// let waited = keyed.until_key_ready_with("alice", 1, Jitter::NONE, tokio::time::sleep).await?;
    /// assert_eq!(waited, Duration::from_millis(100)); // the booked slot, one interval on
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn until_key_ready_with<Q, F>(
        &self,
        key: &Q,
        cost: u32,
        jitter: Jitter,
        sleep: impl FnMut(Duration) -> F + Send,
    ) -> Result<Duration, WaitError>
    where
        Q: Lookup<K> + Sync + ?Sized,
        F: Future<Output = ()> + Send,
        Self: Sync,
    {
        self.limit(key).until_ready_with(cost, jitter, sleep).await
    }

    /// [`until_key_ready_with`](KeyedLimiter::until_key_ready_with) on Tokio's timer,
    /// without jitter. Must run inside a Tokio runtime with the time driver enabled.
    ///
    /// # Errors
    ///
    /// As [`wait_key`](KeyedLimiter::wait_key).
    #[cfg(feature = "tokio")]
    pub fn until_key_ready<'a, Q>(
        &'a self,
        key: &'a Q,
        cost: u32,
    ) -> impl Future<Output = Result<Duration, WaitError>> + Send + 'a
    where
        Q: Lookup<K> + Sync + ?Sized,
        Self: Sync,
    {
        self.until_key_ready_with(key, cost, Jitter::NONE, tokio::time::sleep)
    }
}
