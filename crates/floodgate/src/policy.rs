//! [`Policy`]: `limit` units per `period`, with an optional `burst`.
//!
//! A policy is validated once, when it is built, so the transitions never need to
//! check it: after construction `L·T ≤ 2^62` and `B·T ≤ 2^62` hold, which keeps
//! `now + B·T` and `n·T` (with `n ≤ B`) far from `u64` overflow.
//!
//! # The emission interval and its rounding
//!
//! GCRA spaces units by the emission interval `T = ⌈P / L⌉` nanoseconds. Rounding up
//! means the sustained rate `1/T` is never above the stated `L/P`; when `L` does not
//! divide `P` it is below it by a relative error `(T − P/L)/T < 1/T`. For a second
//! divided by 3 that is `2·10⁻⁹`; it only becomes visible for rates near one unit per
//! nanosecond (`7·10⁸`/s rounds to `T = 2` ns, i.e. `5·10⁸`/s). The window algorithms
//! count units per period and are not affected.

use core::fmt;
use core::time::Duration;

use crate::clock::Nanos;

/// The largest `B·T` and `L·T` a policy may have: 2^62 ns, about 146 years.
pub const MAX_SPAN_NANOS: u64 = 1 << 62;

/// A validated rate: `limit` units per `period`, admitting `burst` at once.
///
/// `burst` defaults to `limit`. GCRA (and the token and leaky buckets, which are the
/// same machine) use all three; the window algorithms use `limit` and `period`.
///
/// # Examples
///
/// ```
/// use floodgate::Policy;
/// use std::time::Duration;
///
/// let p = Policy::per_minute(600)?.with_burst(20)?;
/// assert_eq!(p.limit(), 600);
/// assert_eq!(p.burst(), 20);
/// assert_eq!(p.emission_interval(), Duration::from_millis(100));
///
/// // Bad input is a typed error naming the field, never a panic.
/// let err = Policy::per_second(0).unwrap_err();
/// assert_eq!(err.to_string(), "invalid policy: limit must be at least 1 (got 0)");
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    limit: u64,
    period: u64,
    burst: u64,
    interval: u64,
}

impl Policy {
    /// `limit` units per `period`, burst = `limit`.
    ///
    /// # Errors
    ///
    /// [`PolicyError`] if `limit` or `period` is zero, if `limit` exceeds the period in
    /// nanoseconds (an emission interval under 1 ns), or if `L·T` exceeds 2^62 ns.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::Policy;
    /// use std::time::Duration;
    /// let p = Policy::new(5, Duration::from_secs(300))?;
    /// assert_eq!(p.emission_interval(), Duration::from_secs(60));
    /// assert!(Policy::new(5, Duration::MAX).is_err());
    /// // The constructors are `const`: a policy can be validated at compile time.
    /// const API: Policy = match Policy::per_minute(600) {
    ///     Ok(p) => p,
    ///     Err(_) => panic!("invalid policy"),
    /// };
    /// assert_eq!(API.limit(), 600);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub const fn new(limit: u64, period: Duration) -> Result<Policy, PolicyError> {
        Policy::with_burst_nanos(limit, Nanos::from_duration(period).as_u64(), limit)
    }

    /// `limit` units per second.
    ///
    /// # Errors
    ///
    /// As [`Policy::new`].
    ///
    /// # Examples
    ///
    /// ```
    /// let p = floodgate::Policy::per_second(1_000_000_000)?;
    /// assert_eq!(p.emission_interval().as_nanos(), 1);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub const fn per_second(limit: u64) -> Result<Policy, PolicyError> {
        Policy::new(limit, Duration::from_secs(1))
    }

    /// `limit` units per minute.
    ///
    /// # Errors
    ///
    /// As [`Policy::new`].
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(floodgate::Policy::per_minute(60)?.emission_interval().as_secs(), 1);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub const fn per_minute(limit: u64) -> Result<Policy, PolicyError> {
        Policy::new(limit, Duration::from_secs(60))
    }

    /// `limit` units per hour.
    ///
    /// # Errors
    ///
    /// As [`Policy::new`].
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(floodgate::Policy::per_hour(3600)?.emission_interval().as_secs(), 1);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub const fn per_hour(limit: u64) -> Result<Policy, PolicyError> {
        Policy::new(limit, Duration::from_secs(3600))
    }

    /// `limit` units per day.
    ///
    /// # Errors
    ///
    /// As [`Policy::new`].
    ///
    /// # Examples
    ///
    /// ```
    /// let free = floodgate::Policy::per_day(100)?.with_burst(10)?;
    /// assert_eq!(free.emission_interval().as_secs(), 864);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub const fn per_day(limit: u64) -> Result<Policy, PolicyError> {
        Policy::new(limit, Duration::from_secs(86_400))
    }

    /// The same rate with capacity `burst`.
    ///
    /// # Errors
    ///
    /// [`PolicyError`] if `burst` is zero or `B·T` exceeds 2^62 ns.
    ///
    /// # Examples
    ///
    /// ```
    /// let p = floodgate::Policy::per_second(10)?.with_burst(1)?;
    /// assert_eq!(p.burst(), 1);
    /// assert!(floodgate::Policy::per_second(10)?.with_burst(0).is_err());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub const fn with_burst(self, burst: u64) -> Result<Policy, PolicyError> {
        Policy::with_burst_nanos(self.limit, self.period, burst)
    }

    const fn with_burst_nanos(limit: u64, period: u64, burst: u64) -> Result<Policy, PolicyError> {
        if limit == 0 {
            return Err(PolicyError::Zero { field: "limit" });
        }
        if period == 0 {
            return Err(PolicyError::Zero { field: "period" });
        }
        if burst == 0 {
            return Err(PolicyError::Zero { field: "burst" });
        }
        if limit > period {
            return Err(PolicyError::IntervalBelowOneNanosecond {
                limit,
                period: Duration::from_nanos(period),
            });
        }
        let interval = period.div_ceil(limit);
        let fields = [("limit", limit), ("burst", burst)];
        let mut i = 0;
        while i < fields.len() {
            let (field, value) = fields[i];
            let too_long = match value.checked_mul(interval) {
                Some(span) => span > MAX_SPAN_NANOS,
                None => true,
            };
            if too_long {
                return Err(PolicyError::SpanTooLong {
                    field,
                    value,
                    interval: Duration::from_nanos(interval),
                });
            }
            i += 1;
        }
        Ok(Policy {
            limit,
            period,
            burst,
            interval,
        })
    }

    /// Units admitted per period (`L`).
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(floodgate::Policy::per_hour(7)?.limit(), 7);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub const fn limit(&self) -> u64 {
        self.limit
    }

    /// The period (`P`).
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(floodgate::Policy::per_hour(7)?.period().as_secs(), 3600);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn period(&self) -> Duration {
        Duration::from_nanos(self.period)
    }

    /// The period in nanoseconds.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(floodgate::Policy::per_second(1)?.period_nanos(), 1_000_000_000);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub const fn period_nanos(&self) -> u64 {
        self.period
    }

    /// The capacity of the GCRA bucket (`B`, default `L`).
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(floodgate::Policy::per_hour(7)?.burst(), 7);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub const fn burst(&self) -> u64 {
        self.burst
    }

    /// The emission interval `T = ⌈P / L⌉`.
    ///
    /// # Examples
    ///
    /// ```
    /// // 1 s / 3 rounds up: never more permissive than stated.
    /// assert_eq!(floodgate::Policy::per_second(3)?.emission_interval().as_nanos(), 333_333_334);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn emission_interval(&self) -> Duration {
        Duration::from_nanos(self.interval)
    }

    /// The emission interval in nanoseconds.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(floodgate::Policy::per_second(4)?.interval_nanos(), 250_000_000);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub const fn interval_nanos(&self) -> u64 {
        self.interval
    }

    /// The policy as four words, for storing it in atomics (plan tables).
    pub(crate) const fn to_words(self) -> [u64; 4] {
        [self.limit, self.period, self.burst, self.interval]
    }

    /// A policy back from [`to_words`](Policy::to_words). Only ever fed words that
    /// came from a validated policy.
    pub(crate) const fn from_words(words: [u64; 4]) -> Policy {
        Policy {
            limit: words[0],
            period: words[1],
            burst: words[2],
            interval: words[3],
        }
    }
}

/// Why a [`Policy`] was rejected. Each variant names the field and the bad value.
///
/// # Examples
///
/// ```
/// use floodgate::{Policy, PolicyError};
/// use std::time::Duration;
/// match Policy::new(10, Duration::from_nanos(5)) {
///     Err(PolicyError::IntervalBelowOneNanosecond { limit: 10, .. }) => {}
///     other => panic!("{other:?}"),
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicyError {
    /// A field that must be at least 1 was 0.
    Zero {
        /// `"limit"`, `"period"` or `"burst"`.
        field: &'static str,
    },
    /// `limit` exceeds the period in nanoseconds: units would be closer than 1 ns.
    IntervalBelowOneNanosecond {
        /// The limit asked for.
        limit: u64,
        /// The period asked for.
        period: Duration,
    },
    /// `value · T` exceeds 2^62 ns (≈ 146 years): the bucket would take longer than
    /// that to fill.
    SpanTooLong {
        /// `"limit"` or `"burst"`.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The emission interval it was multiplied by.
        interval: Duration,
    },
    /// A window algorithm cannot represent the policy in its packed state.
    Unrepresentable {
        /// The field out of range.
        field: &'static str,
        /// Its value.
        value: u64,
        /// What the algorithm accepts.
        allowed: &'static str,
    },
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::Zero { field } => {
                write!(f, "invalid policy: {field} must be at least 1 (got 0)")
            }
            PolicyError::IntervalBelowOneNanosecond { limit, period } => write!(
                f,
                "invalid policy: limit {limit} per {period:?} spaces units less than 1 ns apart; \
                 raise the period or lower the limit"
            ),
            PolicyError::SpanTooLong {
                field,
                value,
                interval,
            } => write!(
                f,
                "invalid policy: {field} {value} × emission interval {interval:?} exceeds 2^62 ns \
                 (about 146 years)"
            ),
            PolicyError::Unrepresentable {
                field,
                value,
                allowed,
            } => {
                write!(
                    f,
                    "invalid policy: {field} {value} is out of range ({allowed})"
                )
            }
        }
    }
}

impl std::error::Error for PolicyError {}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn rejects_each_bad_field_by_name() {
        assert_eq!(
            Policy::per_second(0),
            Err(PolicyError::Zero { field: "limit" })
        );
        assert_eq!(
            Policy::new(1, Duration::ZERO),
            Err(PolicyError::Zero { field: "period" })
        );
        assert_eq!(
            Policy::per_second(1).and_then(|p| p.with_burst(0)),
            Err(PolicyError::Zero { field: "burst" })
        );
        assert_eq!(
            Policy::new(2, Duration::from_nanos(1)),
            Err(PolicyError::IntervalBelowOneNanosecond {
                limit: 2,
                period: Duration::from_nanos(1)
            })
        );
        let e = Policy::new(1, Duration::MAX).unwrap_err();
        assert!(
            matches!(
                e,
                PolicyError::SpanTooLong {
                    field: "limit",
                    value: 1,
                    ..
                }
            ),
            "{e}"
        );
        let e = Policy::per_day(1)
            .unwrap()
            .with_burst(u64::MAX)
            .unwrap_err();
        assert!(
            matches!(e, PolicyError::SpanTooLong { field: "burst", .. }),
            "{e}"
        );
        assert!(e.to_string().contains("burst 18446744073709551615"));
    }

    #[test]
    fn interval_rounds_up() {
        let p = Policy::per_second(3).unwrap();
        assert_eq!(p.interval_nanos(), 333_333_334);
        assert!(p.interval_nanos() * 3 >= 1_000_000_000);
        let p = Policy::per_second(1_000_000_000).unwrap();
        assert_eq!(p.interval_nanos(), 1);
    }

    #[test]
    fn edges_of_the_span_limit() {
        // Exactly 2^62 ns is accepted; one more nanosecond is not.
        let p = Policy::new(1, Duration::from_nanos(MAX_SPAN_NANOS)).unwrap();
        assert_eq!(p.interval_nanos(), MAX_SPAN_NANOS);
        assert!(Policy::new(1, Duration::from_nanos(MAX_SPAN_NANOS + 1)).is_err());
        // One per 500 years does not fit (500 y > 146 y).
        let five_hundred_years = Duration::from_secs(500 * 365 * 86_400);
        assert!(Policy::new(1, five_hundred_years).is_err());
        // Nor does any limit over 500 years (L·T ≥ P), while 1 per 100 years does.
        assert!(Policy::new(500, five_hundred_years).is_err());
        assert!(Policy::new(1, Duration::from_secs(100 * 365 * 86_400)).is_ok());
        // u64::MAX units per u64::MAX ns: T = 1, L·T = u64::MAX > 2^62.
        assert!(Policy::new(u64::MAX, Duration::from_nanos(u64::MAX)).is_err());
    }
}
