//! `replay --redis`: the same requests decided by floodgate-redis's replay scripts —
//! the transitions as Lua scripts on a Redis server, with the trace's time passed in
//! (whole microseconds, the scripts' unit) instead of the server's clock.
//!
//! One script run, one round trip, per request; the keys are `prefix + key` and keep
//! no TTL (the replayed clock is not the server's). Each run takes a fresh prefix
//! unless `--prefix` is given, so two runs of one trace print the same thing.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use floodgate::{Decision, Nanos};
use floodgate_redis::{Algorithm, RedisLimitError, RedisLimiter};

use super::engine::{policy_for, DecideError, PolicySpec, ReplayEngine};
use crate::cli::AlgorithmName;
use crate::Failure;

/// The most one request waits for Redis.
const TIMEOUT: Duration = Duration::from_secs(10);

/// A limiter on a Redis server and the single-thread runtime its calls run on.
pub(crate) struct RedisEngine {
    runtime: tokio::runtime::Runtime,
    limiter: RedisLimiter,
}

impl RedisEngine {
    /// Connects to `url` and builds the limiter of `spec` under `prefix` (default: a
    /// fresh one); returns it with the prefix used.
    ///
    /// # Errors
    ///
    /// A policy the scripts cannot serve exactly (status 2); no runtime or no
    /// connection (status 1).
    pub(crate) fn connect(
        url: &str,
        prefix: Option<String>,
        spec: &PolicySpec,
    ) -> Result<(RedisEngine, String), Failure> {
        let policy = policy_for(spec).map_err(|e| Failure::usage(e.to_string()))?;
        let algorithm = match spec.algorithm {
            AlgorithmName::Gcra | AlgorithmName::TokenBucket | AlgorithmName::LeakyBucket => {
                Algorithm::Gcra
            }
            AlgorithmName::FixedWindow => Algorithm::FixedWindow,
            AlgorithmName::SlidingWindow => Algorithm::SlidingWindow,
            AlgorithmName::SlidingLog => Algorithm::SlidingLog,
        };
        let prefix = prefix.unwrap_or_else(fresh_prefix);
        let builder = RedisLimiter::builder(algorithm, policy)
            .prefix(prefix.clone())
            .timeout(TIMEOUT);
        builder
            .check()
            .map_err(|e| Failure::usage(format!("--redis: {e}")))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Failure::runtime(format!("starting the async runtime: {e}")))?;
        let conn = runtime
            .block_on(floodgate_redis::connect(url))
            .map_err(|e| {
                if e.kind() == redis::ErrorKind::InvalidClientConfig {
                    Failure::usage(format!("--redis: {url:?} is not a Redis URL: {e}"))
                } else {
                    Failure::runtime(format!("cannot connect to Redis at {url}: {e}"))
                }
            })?;
        let limiter = builder
            .build(conn)
            .map_err(|e| Failure::usage(format!("--redis: {e}")))?;
        Ok((RedisEngine { runtime, limiter }, prefix))
    }
}

/// `floodgate:replay:<pid>-<nanoseconds since the epoch>:`: no two runs share one.
fn fresh_prefix() -> String {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("floodgate:replay:{}-{since_epoch}:", std::process::id())
}

impl ReplayEngine for RedisEngine {
    fn check(&mut self, key: &str, now: Nanos, cost: u32) -> Result<Decision, DecideError> {
        let time = now.as_u64();
        if time % 1_000 != 0 {
            return Err(DecideError::TimeNotWholeMicros { time });
        }
        self.runtime
            .block_on(self.limiter.check_n_at_micros(key, cost, time / 1_000))
            .map_err(|e| match e {
                RedisLimitError::TimeOutOfRange { .. } => DecideError::TimeOutOfRange { time },
                other => DecideError::Backend(other.to_string()),
            })
    }
}
