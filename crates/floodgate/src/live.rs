//! [`LiveGcra`]: GCRA whose policy changes through a shared reference, for limiters
//! that live behind an `Arc` (a proxy's global limit, a keyed table) and must be
//! reconfigured without stopping traffic.
//!
//! The policy sits in four atomic words behind a sequence lock ([`PolicyCell`], also
//! what each plan of a [`PlanLimiter`](crate::keyed::plans::PlanLimiter) keeps): a
//! decision reads them with plain loads and retries only if an update ran at that
//! very moment, so it always runs on one whole policy, the old or the new, never a
//! mix. The state is GCRA's `TAT` either way, so nothing is rewritten: each key keeps
//! its schedule (its `TAT`), and the new rate and tolerance apply from the next
//! decision — what [`Algorithm::carry_over`] does for GCRA.

use core::fmt;

use crossbeam_utils::{Backoff, CachePadded};

use crate::algorithm::{Algorithm, Charged};
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::gcra::{Gcra, GcraState};
use crate::policy::Policy;
use crate::sync::{fence, lock, AtomicU64, Mutex, Ordering};

/// A policy in four atomic words behind a sequence lock. Writers serialise among
/// themselves (a lock of the caller's); readers never block them.
pub(crate) struct PolicyCell {
    version: AtomicU64,
    words: [AtomicU64; 4],
}

impl PolicyCell {
    pub(crate) fn new(policy: Policy) -> PolicyCell {
        PolicyCell {
            version: AtomicU64::new(0),
            words: policy.to_words().map(AtomicU64::new),
        }
    }

    /// The current policy: retried only while an update is mid-way.
    #[inline]
    pub(crate) fn load(&self) -> Policy {
        let backoff = Backoff::new();
        loop {
            // Acquire: pairs with the writer's closing Release store.
            let before = self.version.load(Ordering::Acquire);
            let words = [0, 1, 2, 3].map(|i| self.words[i].load(Ordering::Relaxed));
            // Acquire fence: if a word came from an update, the re-read sees its
            // odd (or later) version.
            fence(Ordering::Acquire);
            if before % 2 == 0 && self.version.load(Ordering::Relaxed) == before {
                return Policy::from_words(words);
            }
            // An update is mid-way: let it finish (under loom, a yield the model
            // checker sees, so the wait is explored rather than spun forever).
            #[cfg(not(loom))]
            backoff.snooze();
            #[cfg(loom)]
            {
                let _ = &backoff;
                loom::thread::yield_now();
            }
        }
    }

    /// Replaces the policy; callers serialise stores among themselves.
    pub(crate) fn store(&self, policy: Policy) {
        let version = self.version.load(Ordering::Relaxed);
        self.version
            .store(version.wrapping_add(1), Ordering::Relaxed);
        // Release fence: orders the odd version before the word stores.
        fence(Ordering::Release);
        for (word, value) in self.words.iter().zip(policy.to_words()) {
            word.store(value, Ordering::Relaxed);
        }
        // Release: a reader that sees the even version sees every word.
        self.version
            .store(version.wrapping_add(2), Ordering::Release);
    }
}

/// GCRA whose policy changes through `&self` ([`set_policy`](LiveGcra::set_policy)),
/// lock-free for decisions: use it as the algorithm of a [`RateLimiter`], a
/// [`KeyedLimiter`](crate::KeyedLimiter) or a [`Shaper`](crate::Shaper)-like keyed
/// reservation, and change the limit of a limiter that requests are using.
///
/// A change is linearisable: each decision runs on the old policy or the new one,
/// whole. Every key keeps its `TAT`, the time its schedule is booked to: the new
/// rate and tolerance `τ = B·T` apply from the next decision, so the time a key has
/// used counts in units of the new interval, and a key booked further ahead than the
/// new `τ` waits until its schedule drains to it. Refund receipts stay valid across a
/// change (GCRA's refund gives back a span of the schedule, whatever the rate). A
/// refund judges whether the bookings made since its charge have come with the
/// smallest `τ` this has ever had (their slots were set with the `τ` of their
/// time), and while one of them still waits it gives back nothing: a later raise
/// would place the next bookings earlier against the waiting one's slot.
///
/// A decision costs four more loads (one cache line, read-only between changes)
/// than with a plain [`Gcra`].
///
/// [`RateLimiter`]: crate::RateLimiter
///
/// # Examples
///
/// ```
/// use floodgate::{KeyedBuilder, LiveGcra, ManualClock, Policy, RateLimiter};
/// use std::sync::Arc;
///
/// let clock = ManualClock::new();
/// let global = Arc::new(RateLimiter::with_clock(LiveGcra::new(Policy::per_second(2)?), clock.clone()));
/// assert!(global.check().is_allowed());
/// assert!(global.check().is_allowed());
/// assert!(!global.check().is_allowed());
/// // Another task raises the limit while requests keep coming: no `&mut`, no lock.
/// let admin = Arc::clone(&global);
/// admin.algorithm().set_policy(Policy::per_second(4)?.with_burst(8)?);
/// // The schedule is kept (1 s booked); the new tolerance is 2 s: 4 more units now.
/// assert_eq!(global.check().remaining(), 3);
///
/// // Keyed: every key's schedule is kept, the new policy applies to all of them.
/// let per_user = KeyedBuilder::new(LiveGcra::new(Policy::per_minute(10)?))
///     .clock(clock)
///     .build::<String>()?;
/// assert_eq!(per_user.check("alice").remaining(), 9);
/// per_user.algorithm().set_policy(Policy::per_minute(100)?);
/// // Alice's 6 s of schedule is 10 units at the new rate: 89 remain after this one.
/// assert_eq!(per_user.check("alice").remaining(), 89);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct LiveGcra {
    cell: CachePadded<PolicyCell>,
    /// The smallest `τ = B·T` of every policy this has ever had, in ns: a refund
    /// judges with it whether a booking made since its charge has come (a booking's
    /// slot is its schedule's end less the `τ` it was booked under; judged with a
    /// larger `τ` after a raise, a waiter would look come and its slot be handed out
    /// again). Written under `update`, before the policy it covers is published.
    booked_tau: AtomicU64,
    /// Serialises [`set_policy`](LiveGcra::set_policy) calls (never a decision).
    update: Mutex<()>,
}

impl LiveGcra {
    /// GCRA starting at `policy`.
    pub fn new(policy: Policy) -> LiveGcra {
        LiveGcra {
            cell: CachePadded::new(PolicyCell::new(policy)),
            booked_tau: AtomicU64::new(Gcra::new(policy).tolerance_nanos()),
            update: Mutex::new(()),
        }
    }

    /// The policy decisions use now.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{LiveGcra, Policy};
    /// let live = LiveGcra::new(Policy::per_second(5)?);
    /// live.set_policy(Policy::per_second(50)?);
    /// assert_eq!(live.policy().limit(), 50);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn policy(&self) -> Policy {
        self.cell.load()
    }

    /// Replaces the policy for every decision from now on, through a shared
    /// reference; decisions never wait for it (see the type's docs for what each key
    /// keeps).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{LiveGcra, ManualClock, Policy, RateLimiter};
    /// let limiter = RateLimiter::with_clock(LiveGcra::new(Policy::per_second(10)?), ManualClock::new());
    /// assert!(limiter.check_n(6).is_allowed()); // 600 ms of schedule booked
    /// // Down to 5 per second (T = 200 ms, τ = 1 s): the 600 ms are 3 units now.
    /// limiter.algorithm().set_policy(Policy::per_second(5)?);
    /// assert_eq!(limiter.peek(0).remaining(), 2);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn set_policy(&self, policy: Policy) {
        let _serialised = lock(&self.update);
        // Before the policy is published (its Release store): a refund that sees a
        // booking made under it reads the state with Acquire after that booking's
        // Release CAS, and so sees this floor.
        let tau = Gcra::new(policy).tolerance_nanos();
        let floor = self.booked_tau.load(Ordering::Relaxed);
        self.booked_tau.store(floor.min(tau), Ordering::Relaxed);
        self.cell.store(policy);
    }

    /// The GCRA of the current policy.
    #[inline(always)]
    fn gcra(&self) -> Gcra {
        Gcra::new(self.cell.load())
    }
}

impl fmt::Debug for LiveGcra {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LiveGcra")
            .field("policy", &self.policy())
            .finish()
    }
}

impl Algorithm for LiveGcra {
    type State = GcraState;

    #[inline(always)]
    fn decide(&self, state: GcraState, now: Nanos, cost: u32) -> (Decision, Option<GcraState>) {
        self.gcra().decide(state, now, cost)
    }

    fn is_idle(&self, state: GcraState, now: Nanos) -> bool {
        self.gcra().is_idle(state, now)
    }

    fn refund(
        &self,
        state: GcraState,
        charge: &Charged<GcraState>,
        shift: u64,
        now: Nanos,
    ) -> Option<(GcraState, u64)> {
        // Relaxed: see `booked_tau`.
        let booked_tau = self.booked_tau.load(Ordering::Relaxed);
        let gcra = self.gcra();
        let booked_tau = booked_tau.min(gcra.tolerance_nanos());
        gcra.refund_judged(state, charge, shift, now, booked_tau, true)
    }

    fn refund_moves_later(
        &self,
        state: GcraState,
        charge: &Charged<GcraState>,
        shift: u64,
    ) -> bool {
        self.gcra().refund_moves_later(state, charge, shift)
    }

    fn book(
        &self,
        state: GcraState,
        now: Nanos,
        cost: u32,
    ) -> Option<(Decision, Option<GcraState>)> {
        self.gcra().book(state, now, cost)
    }

    fn ready_at(&self, charge: &Charged<GcraState>) -> Nanos {
        self.gcra().ready_at(charge)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::limiter::RateLimiter;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    fn policy(limit: u64, burst: u64) -> Policy {
        Policy::per_second(limit)
            .and_then(|p| p.with_burst(burst))
            .expect("valid policy")
    }

    /// Two policies whose fields cannot mix unseen: a decision on a fresh state
    /// reports `(limit, reset_after)` = (1, 1 s) under one and (10, 100 ms) under the
    /// other; a mix (burst 10, interval 1 s or burst 1, interval 100 ms) reports
    /// neither.
    #[test]
    #[cfg_attr(miri, ignore = "200 000 decisions; loom models the same race")]
    fn racing_changes_never_show_a_mixed_policy() {
        let live = Arc::new(LiveGcra::new(policy(1, 1)));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (live, stop) = (Arc::clone(&live), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut flip = false;
                while !stop.load(Ordering::Relaxed) {
                    live.set_policy(if flip { policy(1, 1) } else { policy(10, 10) });
                    flip = !flip;
                }
            })
        };
        let ms = |n: u64| core::time::Duration::from_millis(n);
        for _ in 0..200_000 {
            let (d, _) = live.decide(GcraState::default(), Nanos::from_secs(5), 1);
            let seen = (d.limit(), d.reset_after());
            assert!(seen == (1, ms(1_000)) || seen == (10, ms(100)), "{seen:?}");
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().expect("the writer never panics");
    }

    #[test]
    fn a_change_keeps_the_schedule_and_clamps_to_the_new_burst() {
        let clock = ManualClock::new();
        let limiter = RateLimiter::with_clock(LiveGcra::new(policy(10, 10)), clock.clone());
        assert!(limiter.check_n(8).is_allowed()); // TAT = now + 800 ms
        limiter.algorithm().set_policy(policy(5, 5));
        // T = 200 ms, τ = 1 s: 200 ms of headroom = 1 unit.
        assert_eq!(limiter.peek(1).remaining(), 0);
        assert!(limiter.check().is_allowed());
        assert!(!limiter.check().is_allowed());
        limiter.algorithm().set_policy(policy(100, 200));
        // The schedule (TAT = now + 1 s) is kept; τ = 200 × 10 ms = 2 s: 1 s of
        // headroom is 100 units.
        assert_eq!(limiter.peek(0).remaining(), 100);
        assert_eq!(limiter.algorithm().policy(), policy(100, 200));
    }

    #[test]
    fn receipts_refund_across_a_change() {
        let clock = ManualClock::new();
        let limiter = RateLimiter::with_clock(LiveGcra::new(policy(1, 1)), clock);
        let (d, receipt) = limiter.charge(1);
        assert!(d.is_allowed());
        limiter.algorithm().set_policy(policy(1, 1));
        assert!(limiter.refund(receipt));
        assert!(limiter.check().is_allowed());
    }
}
