//! [`Decision`]: the one answer every algorithm and backend gives, and the
//! [`PolicyId`] that says which limit gave it.

use core::fmt;
use core::time::Duration;

use crate::clock::Nanos;

/// `retry_after` when the cost exceeds the capacity.
const NEVER: u64 = u64::MAX;

/// Which limit a [`Decision`] came from: a small number the application assigns, so
/// a composite's answer can name the rule that denied it (names, windows and the
/// rest live in the application's configuration, keeping [`Decision`] small and
/// `Copy`).
///
/// A limiter's own decisions carry [`PolicyId::UNSET`] (0); a limit wrapped by
/// [`Limit::with_policy_id`](crate::Limit::with_policy_id) stamps its id on every
/// decision it returns.
///
/// # Examples
///
/// ```
/// use floodgate::PolicyId;
/// let per_user = PolicyId::new(2);
/// assert_eq!(per_user.get(), 2);
/// assert_eq!(PolicyId::default(), PolicyId::UNSET);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyId(u32);

impl PolicyId {
    /// The id of a decision no one labelled: 0.
    pub const UNSET: PolicyId = PolicyId(0);

    /// The id `id`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(floodgate::PolicyId::new(7).get(), 7);
    /// ```
    pub const fn new(id: u32) -> PolicyId {
        PolicyId(id)
    }

    /// The number.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(floodgate::PolicyId::UNSET.get(), 0);
    /// ```
    pub const fn get(self) -> u32 {
        self.0
    }
}

impl From<u32> for PolicyId {
    fn from(id: u32) -> PolicyId {
        PolicyId(id)
    }
}

/// The outcome of one request: allowed or not, and the numbers a client needs.
///
/// * `allowed` — [`is_allowed`](Decision::is_allowed)
/// * `policy` — which limit decided ([`policy`](Decision::policy)); [`PolicyId::UNSET`]
///   unless the limit was given an id
/// * `limit` — the capacity (GCRA: burst `B`; windows and log: `L`)
/// * `remaining` — whole units that could still be admitted now (after this request
///   if it was admitted), in `[0, limit]`
/// * `reset_after` — until the limiter is back to its fresh state with no more traffic
/// * `retry_after` — zero when allowed; when denied, the earliest wait after which the
///   same request would be admitted if nothing else happened; `None` ("never") when
///   the cost exceeds the capacity
///
/// `remaining` is derived lazily (a division), so a caller that reads only
/// `is_allowed` pays for none of it. The policy id sits in the padding after
/// `allowed`: the type is 48 bytes with or without it. HTTP headers, CLI output and
/// Redis replies are all rendered from this type.
///
/// # Examples
///
/// ```
/// use floodgate::{Decision, ManualClock, Policy, RateLimiter};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(2)?, clock.clone());
/// assert!(limiter.check().is_allowed());
/// let d = limiter.check();
/// assert!(d.is_allowed());
/// assert_eq!(d.remaining(), 0);
/// let d = limiter.check();
/// assert!(!d.is_allowed());
/// assert_eq!(d.retry_after(), Some(Duration::from_millis(500)));
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
#[must_use = "a rate-limit decision that is not looked at admits everything"]
#[derive(Clone, Copy)]
pub struct Decision {
    allowed: bool,
    policy: PolicyId,
    limit: u64,
    /// `remaining = min(headroom / unit, limit)`; GCRA stores nanoseconds of headroom
    /// and `T`, the windows store the count itself and 1.
    headroom: u64,
    unit: u64,
    reset_after: u64,
    retry_after: u64,
}

impl Decision {
    /// A decision from its parts, as a backend (Redis, a replay) reports it.
    ///
    /// `remaining` is clamped to `[0, limit]`; `retry_after` is forced to zero when
    /// `allowed`.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::Decision;
    /// use std::time::Duration;
    /// let d = Decision::new(false, 10, 99, Duration::from_secs(3), Some(Duration::from_secs(1)));
    /// assert_eq!(d.remaining(), 10);
    /// assert_eq!(d.retry_after(), Some(Duration::from_secs(1)));
    /// ```
    pub fn new(
        allowed: bool,
        limit: u64,
        remaining: u64,
        reset_after: Duration,
        retry_after: Option<Duration>,
    ) -> Decision {
        let retry_after = match (allowed, retry_after) {
            (true, _) => 0,
            (false, None) => NEVER,
            (false, Some(d)) => Nanos::from_duration(d).as_u64().min(NEVER - 1),
        };
        Decision {
            allowed,
            policy: PolicyId::UNSET,
            limit,
            headroom: remaining.min(limit),
            unit: 1,
            reset_after: Nanos::from_duration(reset_after).as_u64(),
            retry_after,
        }
    }

    /// An admission; `remaining` is `headroom / unit`.
    #[inline(always)]
    pub(crate) fn allow(limit: u64, headroom: u64, unit: u64, reset_after: u64) -> Decision {
        Decision {
            allowed: true,
            policy: PolicyId::UNSET,
            limit,
            headroom,
            unit,
            reset_after,
            retry_after: 0,
        }
    }

    /// A denial that could succeed after `retry_after` ns.
    #[inline(always)]
    pub(crate) fn deny(
        limit: u64,
        headroom: u64,
        unit: u64,
        reset_after: u64,
        retry_after: u64,
    ) -> Decision {
        Decision {
            allowed: false,
            policy: PolicyId::UNSET,
            limit,
            headroom,
            unit,
            reset_after,
            retry_after: retry_after.min(NEVER - 1),
        }
    }

    /// A denial that can never succeed: the cost exceeds the capacity.
    #[inline(always)]
    pub(crate) fn never(limit: u64, headroom: u64, unit: u64, reset_after: u64) -> Decision {
        Decision::deny(limit, headroom, unit, reset_after, 0).refused()
    }

    /// This decision turned into a denial that never succeeds: used when the state the
    /// transition wants to store cannot be stored (stricter, never looser), and by
    /// [`never`](Decision::never).
    pub(crate) fn refused(self) -> Decision {
        Decision {
            allowed: false,
            retry_after: NEVER,
            ..self
        }
    }

    /// Which limit made this decision: [`PolicyId::UNSET`] unless the limit was given
    /// an id ([`Limit::with_policy_id`](crate::Limit::with_policy_id)) or the
    /// decision was labelled ([`with_policy`](Decision::with_policy)).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::composite::{check_all, Limit};
    /// use floodgate::{ManualClock, Policy, PolicyId, RateLimiter};
    /// let clock = ManualClock::new();
    /// let global = RateLimiter::gcra_with_clock(Policy::per_second(100)?, clock.clone());
    /// let per_user = RateLimiter::gcra_with_clock(Policy::per_second(1)?, clock.clone());
    /// assert_eq!(global.check().policy(), PolicyId::UNSET);
    ///
    /// let global = (&global).with_policy_id(PolicyId::new(1));
    /// let per_user = (&per_user).with_policy_id(PolicyId::new(2));
    /// assert!(check_all(&[&global, &per_user], 1).is_allowed());
    /// let denied = check_all(&[&global, &per_user], 1);
    /// assert!(!denied.is_allowed());
    /// assert_eq!(denied.policy(), PolicyId::new(2)); // the per-user limit denied
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    #[inline]
    pub fn policy(&self) -> PolicyId {
        self.policy
    }

    /// This decision labelled as made by the limit `policy`.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Decision, PolicyId};
    /// let d = Decision::new(true, 10, 9, Default::default(), None).with_policy(PolicyId::new(3));
    /// assert_eq!(d.policy(), PolicyId::new(3));
    /// assert_eq!(d.remaining(), 9);
    /// ```
    #[inline]
    pub fn with_policy(self, policy: PolicyId) -> Decision {
        Decision { policy, ..self }
    }

    /// Whether the request was admitted (and, for a check, consumed).
    ///
    /// # Examples
    ///
    /// ```
    /// let d = floodgate::Decision::new(true, 1, 0, Default::default(), None);
    /// assert!(d.is_allowed());
    /// ```
    #[inline]
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// The capacity: GCRA's burst `B`, a window's limit `L`.
    ///
    /// # Examples
    ///
    /// ```
    /// let d = floodgate::Decision::new(true, 7, 0, Default::default(), None);
    /// assert_eq!(d.limit(), 7);
    /// ```
    #[inline]
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Whole units that could still be admitted now, in `[0, limit]`.
    ///
    /// # Examples
    ///
    /// ```
    /// let d = floodgate::Decision::new(true, 7, 3, Default::default(), None);
    /// assert_eq!(d.remaining(), 3);
    /// ```
    #[inline]
    pub fn remaining(&self) -> u64 {
        (self.headroom / self.unit).min(self.limit)
    }

    /// Until the limiter would be back to its fresh state with no more traffic.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let d = floodgate::Decision::new(true, 7, 3, Duration::from_secs(2), None);
    /// assert_eq!(d.reset_after(), Duration::from_secs(2));
    /// ```
    #[inline]
    pub fn reset_after(&self) -> Duration {
        Duration::from_nanos(self.reset_after)
    }

    /// [`reset_after`](Decision::reset_after) in nanoseconds.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let d = floodgate::Decision::new(true, 7, 3, Duration::from_secs(2), None);
    /// assert_eq!(d.reset_after_nanos(), 2_000_000_000);
    /// ```
    #[inline]
    pub fn reset_after_nanos(&self) -> u64 {
        self.reset_after
    }

    /// Zero when allowed; the earliest wait after which the same request would be
    /// admitted if nothing else happened; `None` when it never can (cost > capacity).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let d = floodgate::Decision::new(false, 7, 0, Duration::ZERO, None);
    /// assert_eq!(d.retry_after(), None);
    /// let d = floodgate::Decision::new(true, 7, 0, Duration::ZERO, None);
    /// assert_eq!(d.retry_after(), Some(Duration::ZERO));
    /// ```
    #[inline]
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after_nanos().map(Duration::from_nanos)
    }

    /// [`retry_after`](Decision::retry_after) in nanoseconds.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let d = floodgate::Decision::new(false, 7, 0, Duration::ZERO, Some(Duration::from_nanos(5)));
    /// assert_eq!(d.retry_after_nanos(), Some(5));
    /// ```
    #[inline]
    pub fn retry_after_nanos(&self) -> Option<u64> {
        (self.retry_after != NEVER).then_some(self.retry_after)
    }

    /// [`retry_after`](Decision::retry_after) in whole seconds rounded **up**, as HTTP's
    /// `Retry-After` wants it: `Some(0)` when allowed, at least `Some(1)` on a denial
    /// (a client told "0" or a value rounded down retries too early and is denied
    /// again), `None` when the request can never fit.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::Decision;
    /// use std::time::Duration;
    /// let deny = |ms| Decision::new(false, 1, 0, Duration::ZERO, Some(Duration::from_millis(ms)));
    /// assert_eq!(deny(300).retry_after_secs(), Some(1));
    /// assert_eq!(deny(1_900).retry_after_secs(), Some(2));
    /// assert_eq!(deny(2_000).retry_after_secs(), Some(2));
    /// assert_eq!(deny(0).retry_after_secs(), Some(1));
    /// assert_eq!(Decision::new(true, 1, 1, Duration::ZERO, None).retry_after_secs(), Some(0));
    /// assert_eq!(Decision::new(false, 1, 0, Duration::ZERO, None).retry_after_secs(), None);
    /// ```
    #[inline]
    pub fn retry_after_secs(&self) -> Option<u64> {
        const NANOS_PER_SEC: u64 = 1_000_000_000;
        let nanos = self.retry_after_nanos()?;
        if self.allowed {
            return Some(0);
        }
        Some(nanos.div_ceil(NANOS_PER_SEC).max(1))
    }

    /// [`reset_after`](Decision::reset_after) in whole seconds rounded up (a window
    /// that ends in 300 ms is reported as 1 s, never as 0 while anything is counted).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::Decision;
    /// use std::time::Duration;
    /// let d = Decision::new(true, 5, 4, Duration::from_millis(1_200), None);
    /// assert_eq!(d.reset_after_secs(), 2);
    /// assert_eq!(Decision::new(true, 5, 5, Duration::ZERO, None).reset_after_secs(), 0);
    /// ```
    #[inline]
    pub fn reset_after_secs(&self) -> u64 {
        self.reset_after.div_ceil(1_000_000_000)
    }
}

/// Equal when every observable number and the policy id are equal (`remaining`
/// compared as derived).
impl PartialEq for Decision {
    fn eq(&self, other: &Decision) -> bool {
        self.allowed == other.allowed
            && self.policy == other.policy
            && self.limit == other.limit
            && self.remaining() == other.remaining()
            && self.reset_after == other.reset_after
            && self.retry_after == other.retry_after
    }
}

impl Eq for Decision {}

// The policy id lives in the padding after `allowed`: a decision stays six words.
const _: () = assert!(core::mem::size_of::<Decision>() == 48);

impl fmt::Debug for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decision")
            .field("allowed", &self.allowed)
            .field("policy", &self.policy.0)
            .field("limit", &self.limit)
            .field("remaining", &self.remaining())
            .field("reset_after", &self.reset_after())
            .field("retry_after", &self.retry_after())
            .finish()
    }
}
