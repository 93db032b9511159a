//! The sliding log: exact, with memory `O(L)` — a ring of timestamps.
//!
//! # Semantics
//!
//! An admitted unit at time `t` counts while `now < t + P`.
//!
//! ```text
//! units = admitted units with now < t + P
//! n > L               → deny, retry_after = never
//! units + n ≤ L       → allow, log n units at now
//! otherwise           → deny, retry_after = until the oldest units + n − L units left
//! remaining   = L − units (after the decision)
//! reset_after = until the newest unit leaves (0 if none counts)
//! ```
//!
//! Cost 0 is always allowed and writes nothing. A reading earlier than the latest
//! instant a unit was logged at (another thread's reading, or another core's clock)
//! is judged at that instant, and a unit admitted then is logged there, so the log
//! stays sorted and never moves back — not even when a refund gives back the newest
//! units: their admission dropped the units that had expired at their instant, which
//! a reading behind it would still count.
//!
//! # Memory
//!
//! The log is a ring (`VecDeque`) of `(instant, units)` entries: a request of cost
//! `n` is one entry, and requests at the same instant share one. Expired entries are
//! dropped whenever a request is admitted, so after every admission the ring holds at
//! most the `L` units still counting — at most `L` entries, whatever the traffic. A
//! denial drops nothing (a denied request changes nothing, even what a later, earlier
//! reading would see), so between admissions the ring does not grow either.
//!
//! # Why a mutex
//!
//! An exact log is many words: admitting means "drop the expired prefix, append, and
//! update the total" atomically with the check. A lock-free version would need a
//! multi-word atomic update (or a copy-on-write log with deferred reclamation) and
//! would cost more than the lock it removes. The critical section is short and
//! bounded: a comparison with the ring's oldest entry, a push, an add — amortised
//! `O(1)`; only a denial walks the entries that must leave to compute `retry_after`.
//! The benchmarks (`benches/benches/algorithms.rs`) measure it against the textbook
//! `Vec` + `retain` log under the same mutex. The lock is `std::sync::Mutex` (a futex
//! on Linux: one uncontended CAS to take it, one to release it).

use std::collections::VecDeque;

use crossbeam_utils::CachePadded;

use crate::algorithm::Charged;
use crate::clock::{Clock, DefaultClock, Nanos};
use crate::decision::Decision;
use crate::policy::Policy;
use crate::receipt::{Owner, Receipt};
use crate::sync::{lock, Mutex};
use crate::window::{counted, saturate};

/// An exact sliding-log limiter for one [`Policy`] (`limit` per `period`; `burst` is
/// not used), with the same `check`/`peek` API as [`RateLimiter`](crate::RateLimiter).
///
/// `Send + Sync`: share it with `Arc` or by reference.
///
/// # Examples
///
/// ```
/// use floodgate::{ManualClock, Policy, SlidingLog};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let log = SlidingLog::with_clock(Policy::per_minute(2)?, clock.clone());
/// assert!(log.check().is_allowed()); // at 0 s
/// clock.advance(Duration::from_secs(30));
/// assert!(log.check().is_allowed()); // at 30 s
/// let denied = log.check();
/// // The unit from 0 s leaves at 60 s.
/// assert_eq!(denied.retry_after(), Some(Duration::from_secs(30)));
/// clock.advance(Duration::from_secs(30));
/// assert!(log.check().is_allowed());
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
pub struct SlidingLog<C = DefaultClock> {
    clock: C,
    log: CachePadded<Mutex<Log>>,
    /// The id its receipts carry.
    owner: Owner,
}

/// Units logged at one instant.
#[derive(Clone, Copy, Debug)]
struct Entry {
    at: u64,
    units: u64,
}

/// The limit and period a log is judged by.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    limit: u64,
    period: u64,
}

impl Bounds {
    pub(crate) fn of(policy: Policy) -> Bounds {
        Bounds {
            limit: policy.limit(),
            period: policy.period_nanos(),
        }
    }
}

/// One log: its ring of entries, oldest first, and the units they hold. The
/// transitions of the [module docs](self), shared by [`SlidingLog`] and the keyed
/// log ([`KeyedSlidingLog`](crate::keyed::log::KeyedSlidingLog)).
#[derive(Debug, Default)]
pub(crate) struct Ring {
    entries: VecDeque<Entry>,
    units: u64,
    /// The latest instant a unit was ever logged at. A reading is judged no earlier:
    /// once a refund has removed the newest entry, the entries that entry's admission
    /// dropped (expired at its instant, not at earlier ones) would otherwise go
    /// uncounted for a reading behind it.
    logged: u64,
}

impl Ring {
    /// The instant a reading `now` is judged at: never before the latest instant a
    /// unit was logged at (the newest entry's, or a later one a refund removed).
    #[inline]
    fn judged_at(&self, now: u64) -> u64 {
        self.logged.max(now)
    }

    /// `(units still counting at t, index of the oldest entry still counting)`.
    #[inline]
    fn live(&self, bounds: Bounds, t: u64) -> (u64, usize) {
        let mut expired = 0;
        let mut first = 0;
        // t ≥ every entry's instant, so t − at does not underflow.
        for e in &self.entries {
            if t - e.at < bounds.period {
                break;
            }
            expired += e.units;
            first += 1;
        }
        (self.units - expired, first)
    }

    /// Units still counting at `now` (judged no earlier than the newest entry).
    pub(crate) fn live_units(&self, bounds: Bounds, now: u64) -> u64 {
        self.live(bounds, self.judged_at(now)).0
    }

    /// Whether no logged unit counts at `now`, so that dropping the log loses nothing.
    /// Not while the latest instant logged at is after `now` (a refund removed its
    /// entry): a reading behind it is judged there, and a fresh log would judge it at
    /// its own instant, missing the units dropped at the later one that still count
    /// there (the keyed log reclaims at an insert's reading, which may be behind a
    /// key's latest instant).
    pub(crate) fn is_idle(&self, bounds: Bounds, now: u64) -> bool {
        self.logged <= now && self.live_units(bounds, now) == 0
    }

    /// Entries held now.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Entries its buffer has room for (what it allocated): for memory tests.
    #[cfg(test)]
    pub(crate) fn room(&self) -> usize {
        self.entries.capacity()
    }

    /// Forgets every unit.
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.units = 0;
        self.logged = 0;
    }

    /// The decision, and the instant to log the units at if admitted.
    pub(crate) fn judge(&self, bounds: Bounds, now: u64, cost: u32) -> (Decision, Option<u64>) {
        let t = self.judged_at(now);
        let (units, first) = self.live(bounds, t);
        // Until the newest live entry leaves: at + P − now.
        let leaves =
            |at: u64| saturate(u128::from(at) + u128::from(bounds.period) - u128::from(now));
        let reset = if units == 0 {
            0
        } else {
            self.entries.back().map_or(0, |e| leaves(e.at))
        };
        let n = u64::from(cost);
        // Denied: the oldest `units + n − L` units must leave; retry when the last of
        // them does.
        let retry = || {
            let mut must_leave = units + n - bounds.limit;
            for e in self.entries.iter().skip(first) {
                if e.units >= must_leave {
                    return leaves(e.at);
                }
                must_leave -= e.units;
            }
            reset
        };
        let (decision, admit) = counted(bounds.limit, units, n, reset, || leaves(t), retry);
        (decision, admit.then_some(t))
    }

    /// Decides `cost` units at `now` and logs them if admitted: the decision and
    /// what was charged (the instant the units were logged at).
    pub(crate) fn charge(
        &mut self,
        bounds: Bounds,
        now: Nanos,
        cost: u32,
    ) -> (Decision, Option<Charged<u64>>) {
        let (decision, admit_at) = self.judge(bounds, now.as_u64(), cost);
        let charge = match admit_at {
            Some(at) if cost > 0 => {
                self.admit(bounds, at, u64::from(cost));
                Some(Charged {
                    before: 0u64,
                    after: at,
                    at: now,
                    cost,
                })
            }
            _ => None,
        };
        (decision, charge)
    }

    /// Drops what expired at `at`, then logs `n` units there.
    fn admit(&mut self, bounds: Bounds, at: u64, n: u64) {
        while let Some(oldest) = self.entries.front() {
            if at - oldest.at < bounds.period {
                break;
            }
            self.units -= oldest.units;
            self.entries.pop_front();
        }
        self.units += n;
        self.logged = at;
        match self.entries.back_mut() {
            Some(newest) if newest.at == at => newest.units += n,
            _ => self.entries.push_back(Entry { at, units: n }),
        }
    }

    /// Gives back `charge`'s units if they still count at `now` (judged no earlier
    /// than the newest entry): the entry at the instant they were logged at has not
    /// expired. Units logged at one instant are interchangeable, so removing the
    /// charge's own count from that entry leaves exactly the log the other requests
    /// would have produced. Returns whether anything came back.
    pub(crate) fn give_back(&mut self, bounds: Bounds, now: u64, charge: &Charged<u64>) -> bool {
        let t = self.judged_at(now);
        let at = charge.after;
        let units = u64::from(charge.cost);
        if t.saturating_sub(at) >= bounds.period {
            return false;
        }
        let Ok(i) = self.entries.binary_search_by_key(&at, |e| e.at) else {
            return false;
        };
        let Some(entry) = self.entries.get_mut(i) else {
            return false;
        };
        if entry.units < units {
            return false;
        }
        entry.units -= units;
        if entry.units == 0 {
            let _ = self.entries.remove(i);
        }
        self.units -= units;
        true
    }
}

/// A log, the policy it is judged by, and its resets so far.
#[derive(Debug)]
struct Log {
    ring: Ring,
    bounds: Bounds,
    policy: Policy,
    /// Resets so far: a receipt from an earlier generation refunds nothing.
    generation: u64,
}

impl SlidingLog<DefaultClock> {
    /// A sliding log for `policy` on the [`DefaultClock`].
    ///
    /// # Examples
    ///
    /// ```
    /// let log = floodgate::SlidingLog::new(floodgate::Policy::per_second(5)?);
    /// assert!(log.check().is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn new(policy: Policy) -> Self {
        SlidingLog::with_clock(policy, DefaultClock::new())
    }
}

impl<C: Clock> SlidingLog<C> {
    /// A sliding log for `policy` on `clock`.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, SlidingLog};
    /// let log = SlidingLog::with_clock(Policy::per_second(1)?, ManualClock::new());
    /// assert!(log.check().is_allowed());
    /// assert!(!log.check().is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn with_clock(policy: Policy, clock: C) -> Self {
        SlidingLog {
            clock,
            log: CachePadded::new(Mutex::new(Log {
                ring: Ring::default(),
                bounds: Bounds::of(policy),
                policy,
                generation: 0,
            })),
            owner: Owner::new(),
        }
    }

    /// Decides one unit now, logging it if allowed. Same as `check_n(1)`.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, SlidingLog};
    /// let log = SlidingLog::with_clock(Policy::per_second(1)?, ManualClock::new());
    /// assert!(log.check().is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    #[inline]
    pub fn check(&self) -> Decision {
        self.check_n(1)
    }

    /// Decides `cost` units now, logging them if allowed. Cost 0 reports and writes
    /// nothing; a cost above the limit is denied with `retry_after() == None`.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, SlidingLog};
    /// let log = SlidingLog::with_clock(Policy::per_second(10)?, ManualClock::new());
    /// assert!(log.check_n(4).is_allowed());
    /// assert_eq!(log.check_n(0).remaining(), 6);
    /// assert_eq!(log.check_n(11).retry_after(), None);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    #[inline]
    pub fn check_n(&self, cost: u32) -> Decision {
        self.check_n_at(self.clock.now(), cost)
    }

    /// Exactly what [`check_n(cost)`](SlidingLog::check_n) would return now, writing
    /// nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, SlidingLog};
    /// let log = SlidingLog::with_clock(Policy::per_second(1)?, ManualClock::new());
    /// let peeked = log.peek(1);
    /// assert_eq!(log.check(), peeked);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    #[inline]
    pub fn peek(&self, cost: u32) -> Decision {
        self.peek_at(self.clock.now(), cost)
    }

    /// [`check_n`](SlidingLog::check_n) at an instant the caller read.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Nanos, Policy, SlidingLog};
    /// let log = SlidingLog::with_clock(Policy::per_second(1)?, ManualClock::new());
    /// assert!(log.check_n_at(Nanos::from_secs(5), 1).is_allowed());
    /// assert!(!log.check_n_at(Nanos::from_secs(5), 1).is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn check_n_at(&self, now: Nanos, cost: u32) -> Decision {
        self.charge_at(now, cost).0
    }

    /// Decides `cost` units now like [`check_n`](SlidingLog::check_n), and returns a
    /// [`Receipt`] for a later [`refund`](SlidingLog::refund).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, SlidingLog};
    /// let log = SlidingLog::with_clock(Policy::per_second(2)?, ManualClock::new());
    /// let (decision, receipt) = log.charge(2);
    /// assert_eq!(decision.remaining(), 0);
    /// assert!(log.refund(receipt));
    /// assert_eq!(log.peek(0).remaining(), 2);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    #[inline]
    pub fn charge(&self, cost: u32) -> (Decision, Receipt) {
        self.charge_at(self.clock.now(), cost)
    }

    /// [`charge`](SlidingLog::charge) at an instant the caller read.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Nanos, Policy, SlidingLog};
    /// let log = SlidingLog::with_clock(Policy::per_second(1)?, ManualClock::new());
    /// let (decision, receipt) = log.charge_at(Nanos::from_secs(5), 1);
    /// assert!(decision.is_allowed() && receipt.is_charged());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn charge_at(&self, now: Nanos, cost: u32) -> (Decision, Receipt) {
        let mut log = lock(&self.log);
        let bounds = log.bounds;
        let (decision, charge) = log.ring.charge(bounds, now, cost);
        (
            decision,
            Receipt::new(self.owner, 0, log.generation, charge.map(|c| (c, 0))),
        )
    }

    /// Gives back the units the charge behind `receipt` logged, if they still count:
    /// the entry at the instant they were logged at has not expired at the refund's
    /// reading (judged no earlier than the newest entry). Units logged at the same
    /// instant are interchangeable, so removing the charge's own count from that
    /// entry leaves exactly the log the other requests would have produced. A
    /// receipt of another limiter, of a charge that took nothing, or of a charge
    /// taken before a [`reset`](SlidingLog::reset), gives back nothing. Returns
    /// whether anything came back.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, SlidingLog};
    /// use std::time::Duration;
    /// let clock = ManualClock::new();
    /// let log = SlidingLog::with_clock(Policy::per_second(2)?, clock.clone());
    /// let (_, receipt) = log.charge(1);
    /// clock.advance(Duration::from_secs(1));
    /// assert!(!log.refund(receipt)); // expired: nothing of it still counts
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn refund(&self, receipt: Receipt) -> bool {
        let Some(charge) = receipt.charge_for::<u64>(self.owner, 0) else {
            return false;
        };
        let mut log = lock(&self.log);
        if log.generation != receipt.generation() {
            return false;
        }
        let bounds = log.bounds;
        // Read after the lock: no earlier than any admission the log holds.
        log.ring
            .give_back(bounds, self.clock.now().as_u64(), &charge)
    }

    /// Forgets every logged unit, as if no request had been seen. Outstanding
    /// receipts are invalidated: a refund of an earlier charge gives back nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, SlidingLog};
    /// let log = SlidingLog::with_clock(Policy::per_second(1)?, ManualClock::new());
    /// let (_, receipt) = log.charge(1);
    /// log.reset();
    /// assert!(log.check().is_allowed());
    /// assert!(!log.refund(receipt));
    /// assert!(!log.check().is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn reset(&self) {
        let mut log = lock(&self.log);
        log.ring.clear();
        log.generation = log.generation.wrapping_add(1);
    }

    /// Replaces the policy at runtime. The log keeps its timestamps — they are
    /// exact under any period: a unit logged at `t` counts while `now < t + P` for
    /// the new `P` (units already dropped under a shorter period stay dropped).
    /// Receipts stay valid. A log that holds more units than the new limit admits
    /// nothing until enough of them leave.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, SlidingLog};
    /// let log = SlidingLog::with_clock(Policy::per_minute(10)?, ManualClock::new());
    /// assert!(log.check_n(4).is_allowed());
    /// log.set_policy(Policy::per_minute(5)?);
    /// assert_eq!(log.peek(0).remaining(), 1);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn set_policy(&self, policy: Policy) {
        let mut log = lock(&self.log);
        log.bounds = Bounds::of(policy);
        log.policy = policy;
    }

    /// [`peek`](SlidingLog::peek) at an instant the caller read.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Nanos, Policy, SlidingLog};
    /// let log = SlidingLog::with_clock(Policy::per_second(1)?, ManualClock::new());
    /// assert!(log.peek_at(Nanos::from_secs(5), 1).is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn peek_at(&self, now: Nanos, cost: u32) -> Decision {
        let log = lock(&self.log);
        log.ring.judge(log.bounds, now.as_u64(), cost).0
    }

    /// Whether no logged unit counts at `now`, so that dropping the log loses nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Nanos, Policy, SlidingLog};
    /// let log = SlidingLog::with_clock(Policy::per_second(1)?, ManualClock::new());
    /// let _ = log.check_n_at(Nanos::from_secs(1), 1);
    /// assert!(!log.is_idle(Nanos::from_secs(1)));
    /// assert!(log.is_idle(Nanos::from_secs(2)));
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn is_idle(&self, now: Nanos) -> bool {
        let log = lock(&self.log);
        log.ring.is_idle(log.bounds, now.as_u64())
    }

    /// Entries the ring holds now (at most `L` after any admission): for tests and
    /// memory metrics.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, SlidingLog};
    /// let log = SlidingLog::with_clock(Policy::per_second(3)?, ManualClock::new());
    /// let _ = log.check_n(2); // one entry for both units
    /// assert_eq!(log.entries(), 1);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn entries(&self) -> usize {
        lock(&self.log).ring.len()
    }

    /// The policy this log enforces.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, SlidingLog};
    /// let log = SlidingLog::with_clock(Policy::per_second(3)?, ManualClock::new());
    /// assert_eq!(log.policy().limit(), 3);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn policy(&self) -> Policy {
        lock(&self.log).policy
    }

    /// The clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Clock, ManualClock, Nanos, Policy, SlidingLog};
    /// let log = SlidingLog::with_clock(Policy::per_second(3)?, ManualClock::new());
    /// assert_eq!(log.clock().now(), Nanos::ZERO);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn clock(&self) -> &C {
        &self.clock
    }
}

impl<C: core::fmt::Debug> core::fmt::Debug for SlidingLog<C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let log = lock(&self.log);
        f.debug_struct("SlidingLog")
            .field("policy", &log.policy)
            .field("clock", &self.clock)
            .field("entries", &log.ring.entries.len())
            .field("units", &log.ring.units)
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use core::time::Duration;

    const S: u64 = 1_000_000_000;

    fn log(limit: u64, period: Duration) -> SlidingLog<ManualClock> {
        SlidingLog::with_clock(Policy::new(limit, period).unwrap(), ManualClock::new())
    }

    #[test]
    fn exact_values_with_costs() {
        let l = log(5, Duration::from_secs(10));
        let at = |t: u64, n: u32| l.check_n_at(Nanos::new(t), n);
        let d = at(S, 2);
        assert!(d.is_allowed());
        assert_eq!((d.remaining(), d.reset_after_nanos()), (3, 10 * S));
        let d = at(4 * S, 3);
        assert!(d.is_allowed());
        assert_eq!((d.remaining(), d.reset_after_nanos()), (0, 10 * S));
        // Full. One unit waits for the two from 1 s to leave at 11 s.
        let d = at(6 * S, 1);
        assert!(!d.is_allowed());
        assert_eq!(d.retry_after_nanos(), Some(5 * S));
        assert_eq!(d.reset_after_nanos(), 8 * S);
        // Three units wait for the three from 4 s too: 14 s.
        assert_eq!(at(6 * S, 3).retry_after_nanos(), Some(8 * S));
        // Above the limit: never.
        let d = at(6 * S, 6);
        assert_eq!(d.retry_after(), None);
        assert_eq!(d.remaining(), 0);
        // The instant the first units leave: now = t + P is outside.
        let d = at(11 * S, 2);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 0);
        assert_eq!(l.entries(), 2);
        // Cost 0 writes nothing.
        let d = at(11 * S, 0);
        assert!(d.is_allowed());
        assert_eq!(l.entries(), 2);
    }

    #[test]
    fn an_earlier_reading_is_judged_at_the_newest_entry() {
        let l = log(2, Duration::from_secs(10));
        assert!(l.check_n_at(Nanos::new(20 * S), 1).is_allowed());
        // 15 s reads before the entry at 20 s: judged (and logged) at 20 s.
        let d = l.check_n_at(Nanos::new(15 * S), 1);
        assert!(d.is_allowed());
        assert_eq!(d.reset_after_nanos(), 15 * S);
        assert_eq!(l.entries(), 1);
        let d = l.check_n_at(Nanos::new(15 * S), 1);
        assert_eq!(d.retry_after_nanos(), Some(15 * S));
    }

    #[test]
    fn memory_stays_within_the_limit() {
        let l = log(8, Duration::from_secs(1));
        for i in 0..10_000u64 {
            let _ = l.check_n_at(Nanos::new(i * S / 7), 1 + (i % 3) as u32);
            assert!(l.entries() <= 8);
        }
        // Idle after a period with nothing new.
        assert!(!l.is_idle(Nanos::new(9_999 * S / 7)));
        assert!(l.is_idle(Nanos::new(9_999 * S / 7 + S)));
    }

    #[test]
    fn timestamps_at_the_top_of_u64() {
        let l = log(1, Duration::from_secs(1));
        assert!(l.check_n_at(Nanos::MAX, 1).is_allowed());
        let d = l.check_n_at(Nanos::MAX, 1);
        assert!(!d.is_allowed());
        assert_eq!(d.retry_after_nanos(), Some(S));
        assert_eq!(d.reset_after_nanos(), S);
    }
}
