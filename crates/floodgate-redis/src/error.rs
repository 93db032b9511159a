//! [`ConfigError`] (a limiter that cannot be built) and [`RedisLimitError`] (a
//! decision that could not be made).

use core::fmt;
use core::time::Duration;

/// Why a [`RedisLimiter`](crate::RedisLimiter) could not be built. Each variant names
/// the field and the bad value.
///
/// # Examples
///
/// ```
/// use floodgate::Policy;
/// use floodgate_redis::{Algorithm, ConfigError, RedisLimiter};
/// use std::time::Duration;
///
/// // Windows count whole microseconds: a period of 1.5 µs is refused.
/// let p = Policy::new(1, Duration::from_nanos(1_500))?;
/// let err = RedisLimiter::builder(Algorithm::FixedWindow, p).check().unwrap_err();
/// assert!(matches!(err, ConfigError::PeriodNotWholeMicros { .. }));
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The key prefix contains `{`, which Redis Cluster reserves for hash tags.
    PrefixHasBrace {
        /// The prefix asked for.
        prefix: String,
    },
    /// A window or log period that is not a whole number of microseconds (the
    /// scripts' resolution): its windows could not be aligned exactly.
    PeriodNotWholeMicros {
        /// The period asked for.
        period: Duration,
    },
    /// A span the scripts could not keep exact in a Lua double: see
    /// [`MAX_SPAN_MICROS`](crate::MAX_SPAN_MICROS).
    SpanTooLong {
        /// What was measured: `"burst × interval"`, `"2 × period"`,
        /// `"(limit + 1) × period"` or `"limit"`.
        field: &'static str,
        /// Its value in microseconds (units for `"limit"`), saturated at `u64::MAX`.
        value: u64,
        /// The largest accepted value.
        max: u64,
    },
    /// A per-call timeout of zero.
    ZeroTimeout,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::PrefixHasBrace { prefix } => write!(
                f,
                "invalid Redis limiter: key prefix {prefix:?} contains '{{' (reserved for hash tags)"
            ),
            ConfigError::PeriodNotWholeMicros { period } => write!(
                f,
                "invalid Redis limiter: period {period:?} is not a whole number of microseconds"
            ),
            ConfigError::SpanTooLong { field, value, max } => write!(
                f,
                "invalid Redis limiter: {field} = {value} exceeds {max}, the most the scripts \
                 keep exact"
            ),
            ConfigError::ZeroTimeout => write!(f, "invalid Redis limiter: timeout must be above 0"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Why a decision could not be made. The failure policy
/// ([`OnFailure`](crate::OnFailure)) turns these into a fallback decision, unless it
/// is [`OnFailure::Error`](crate::OnFailure::Error).
///
/// A call that failed — above all one that **timed out** — may still have been run by
/// Redis and charged its cost: the reply was lost, not necessarily the write.
#[derive(Debug)]
#[non_exhaustive]
pub enum RedisLimitError {
    /// No reply within the limiter's per-call timeout (Redis slow, blocked, or
    /// unreachable while the connection is being re-established). Retryable.
    Timeout {
        /// The timeout that elapsed.
        after: Duration,
    },
    /// The client or the server reported an error: connection refused or lost, a
    /// script error (for instance a key holding another type, or a state this crate
    /// did not write). The connection re-establishes itself; later calls recover.
    Redis(redis::RedisError),
    /// Redis answered something that is not a decision.
    MalformedReply {
        /// What was wrong, with the reply.
        detail: String,
    },
    /// A replayed time beyond [`MAX_NOW_MICROS`](crate::MAX_NOW_MICROS).
    TimeOutOfRange {
        /// The time given, in microseconds.
        now_micros: u64,
    },
}

impl RedisLimitError {
    /// Whether the same call may succeed later (a timeout, a connection problem, or
    /// a server that is busy: loading, `BUSY` with another script, a cluster
    /// reconfiguring — `TRYAGAIN`, `CLUSTERDOWN`, or a slot still moving when the
    /// limiter's sends ran out on `MOVED` or `ASK` —, out of memory — `OOM`, a
    /// script's first write refused, so nothing written), as opposed to one that
    /// will fail again (a malformed state or reply). One exception it cannot tell:
    /// a limiter on a plain connection to one node of a Redis Cluster meets `MOVED`
    /// for every key another node owns, and no retry helps there — build it on
    /// [`connect_cluster`](crate::connect_cluster) instead.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_redis::RedisLimitError;
    /// use std::time::Duration;
    /// let e = RedisLimitError::Timeout { after: Duration::from_millis(50) };
    /// assert!(e.is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        match self {
            RedisLimitError::Timeout { .. } => true,
            RedisLimitError::Redis(e) => {
                e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.is_timeout()
                    || e.is_unrecoverable_error()
                    // The server will serve again: it is loading its data, its
                    // cluster is reconfiguring, another client's script runs, or
                    // it is out of memory until keys expire or maxmemory rises.
                    || matches!(e.retry_method(), redis::RetryMethod::WaitAndRetry)
                    // A Cluster slot still moving when the client's sends ran out: a
                    // redirect (`MOVED`, `ASK`) that the end of the move settles.
                    || matches!(e.kind(), redis::ErrorKind::Moved | redis::ErrorKind::Ask)
                    || e.code() == Some("BUSY")
                    || e.code() == Some("OOM")
            }
            RedisLimitError::MalformedReply { .. } | RedisLimitError::TimeOutOfRange { .. } => {
                false
            }
        }
    }
}

impl fmt::Display for RedisLimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisLimitError::Timeout { after } => {
                write!(f, "Redis limiter: no reply within {after:?}")
            }
            RedisLimitError::Redis(e) => write!(f, "Redis limiter: {e}"),
            RedisLimitError::MalformedReply { detail } => {
                write!(f, "Redis limiter: malformed reply ({detail})")
            }
            RedisLimitError::TimeOutOfRange { now_micros } => write!(
                f,
                "Redis limiter: replayed time {now_micros} µs is beyond the exact range"
            ),
        }
    }
}

impl std::error::Error for RedisLimitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RedisLimitError::Redis(e) => Some(e),
            _ => None,
        }
    }
}

impl From<redis::RedisError> for RedisLimitError {
    fn from(e: redis::RedisError) -> Self {
        RedisLimitError::Redis(e)
    }
}

#[cfg(test)]
mod tests {
    use super::RedisLimitError;
    use redis::ErrorKind;

    /// Session 54: a Cluster redirect left when the limiter's sends ran out (a slot
    /// still moving) is retryable, as `TRYAGAIN` is; a script's error is not.
    #[test]
    fn a_redirect_left_after_the_sends_is_retryable() {
        let error = |kind, detail: &str| {
            RedisLimitError::Redis(redis::RedisError::from((kind, "server", detail.to_owned())))
        };
        assert!(error(ErrorKind::Ask, "7629 127.0.0.1:7001").is_retryable());
        assert!(error(ErrorKind::Moved, "7629 127.0.0.1:7001").is_retryable());
        assert!(error(ErrorKind::TryAgain, "later").is_retryable());
        assert!(!error(ErrorKind::ResponseError, "WRONGTYPE").is_retryable());
    }
}
