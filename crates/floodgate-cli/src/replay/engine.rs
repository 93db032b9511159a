//! The decision engines replay drives: the library's own transitions and driver, one
//! state per key, at the instants the input gives (virtual time, no clock read).
//!
//! [`engine_for`] is the single place that maps an `--algorithm` name to an engine.
//! Every engine runs the library's transition through the library's own driver
//! ([`StateCell::apply`], the code under `RateLimiter::check_n_at`), so replay shows
//! what the library would have done — it is not a separate simulation.
//!
//! # Adding an algorithm
//!
//! A word-sized algorithm (anything implementing [`floodgate::Algorithm`]) needs one
//! arm in [`engine_for`]: `Ok(Box::new(PerKeyStates::new(FixedWindow::new(policy)?)))`.
//! A structure that is not an `Algorithm` (the sliding log) implements
//! [`ReplayEngine`] itself. When the keyed limiter lands, `PerKeyStates` can be
//! replaced by an impl of [`ReplayEngine`] for it (sized so that nothing live is
//! evicted), keeping this trait as the seam.

use std::fmt;

use floodgate::{
    Algorithm, AtomicCell, Decision, FixedWindow, Gcra, ManualClock, Nanos, Policy, PolicyError,
    SlidingLog, SlidingWindow, StateCell,
};

use super::KeyMap;
use crate::cli::AlgorithmName;

/// Decides requests for many keys at instants the caller supplies.
pub(crate) trait ReplayEngine {
    /// `check_n(cost)` for `key` at `now`. Callers never pass a `now` earlier than a
    /// previous one.
    ///
    /// # Errors
    ///
    /// Only an engine outside the process (Redis) fails: see [`DecideError`].
    fn check(&mut self, key: &str, now: Nanos, cost: u32) -> Result<Decision, DecideError>;
}

/// Why an engine could not decide a request; the reader adds the line number.
#[derive(Debug)]
#[cfg_attr(
    not(feature = "redis"),
    allow(dead_code, reason = "only the Redis engine fails")
)]
pub(crate) enum DecideError {
    /// A time the engine cannot represent exactly (Redis counts whole microseconds):
    /// exit status 2.
    TimeNotWholeMicros {
        /// The time, in nanoseconds on the input's axis.
        time: u64,
    },
    /// A time past the engine's range (Redis: 2^52 µs since the epoch, in the year
    /// 2112): exit status 2.
    TimeOutOfRange {
        /// The time, in nanoseconds on the input's axis.
        time: u64,
    },
    /// The engine's server failed or refused the request: exit status 1.
    Backend(String),
}

impl fmt::Display for DecideError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecideError::TimeNotWholeMicros { time } => write!(
                f,
                "time {} s is not a whole number of microseconds: replay --redis counts \
                 whole microseconds (round the trace's times to 6 decimals)",
                floodgate_cli::seconds::Seconds(*time)
            ),
            DecideError::TimeOutOfRange { time } => write!(
                f,
                "time {} s is past the last time replay --redis decides at (2^52 µs, in \
                 the year 2112)",
                floodgate_cli::seconds::Seconds(*time)
            ),
            DecideError::Backend(e) => write!(f, "redis: {e}"),
        }
    }
}

/// The packed state of every key, each request run through one library cell.
///
/// A library limiter per key would cost 256 bytes a key (its state word is
/// cache-padded, which is right for a shared limiter and wasted here: replay is one
/// thread) — 1.3 GB for a log with a million clients. So the table holds only each
/// key's 8-byte state; a request loads it into a library [`AtomicCell`], runs the
/// library's driver on it ([`StateCell::apply`], exactly what
/// `RateLimiter::check_n_at` runs) and stores the result back. A key first seen is
/// fresh (the all-zero state). Nothing is ever evicted: replay is deterministic, and
/// memory grows with the number of distinct keys, not with the input.
pub(crate) struct PerKeyStates<A: Algorithm> {
    algorithm: A,
    cell: AtomicCell<A::State>,
    /// The state of a key never seen (the library's fresh state).
    fresh: A::State,
    states: KeyMap<A::State>,
}

impl<A: Algorithm> PerKeyStates<A> {
    pub(crate) fn new(algorithm: A) -> Self {
        let cell = AtomicCell::fresh();
        PerKeyStates {
            algorithm,
            fresh: cell.load(),
            cell,
            states: KeyMap::default(),
        }
    }
}

impl<A: Algorithm> ReplayEngine for PerKeyStates<A> {
    fn check(&mut self, key: &str, now: Nanos, cost: u32) -> Result<Decision, DecideError> {
        let state = match self.states.get_mut(key) {
            Some(state) => state,
            None => self.states.entry(key.into()).or_insert(self.fresh),
        };
        self.cell.store(*state);
        let decision = self.cell.apply(&self.algorithm, now, cost);
        *state = self.cell.load();
        Ok(decision)
    }
}

/// One library [`SlidingLog`] per key: not a word-sized state (O(limit) per key).
pub(crate) struct PerKeyLogs {
    policy: Policy,
    clock: ManualClock,
    logs: KeyMap<SlidingLog<ManualClock>>,
}

impl PerKeyLogs {
    pub(crate) fn new(policy: Policy) -> Self {
        PerKeyLogs {
            policy,
            clock: ManualClock::new(),
            logs: KeyMap::default(),
        }
    }
}

impl ReplayEngine for PerKeyLogs {
    fn check(&mut self, key: &str, now: Nanos, cost: u32) -> Result<Decision, DecideError> {
        if let Some(log) = self.logs.get(key) {
            return Ok(log.check_n_at(now, cost));
        }
        let log = SlidingLog::with_clock(self.policy, self.clock.clone());
        let decision = log.check_n_at(now, cost);
        self.logs.insert(key.into(), log);
        Ok(decision)
    }
}

/// The policy flags of `floodgate replay`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PolicySpec {
    pub(crate) algorithm: AlgorithmName,
    pub(crate) limit: u64,
    pub(crate) per: std::time::Duration,
    pub(crate) burst: Option<u64>,
}

impl fmt::Display for PolicySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} per {:?}",
            self.algorithm.name(),
            self.limit,
            self.per
        )?;
        if self.algorithm.takes_burst() {
            write!(f, ", burst {}", self.burst.unwrap_or(self.limit))?;
        }
        Ok(())
    }
}

/// Why no engine could be built; printed as is, exit status 2.
#[derive(Debug)]
pub(crate) enum EngineError {
    /// The library rejected the policy.
    Policy(PolicyError),
    /// `--burst` with an algorithm that has no burst.
    BurstNotApplicable(AlgorithmName),
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::Policy(e) => e.fmt(f),
            EngineError::BurstNotApplicable(a) => write!(
                f,
                "--burst applies to gcra, token-bucket and leaky-bucket, not to {}: a window \
                 admits `--limit` per window",
                a.name()
            ),
        }
    }
}

impl From<PolicyError> for EngineError {
    fn from(e: PolicyError) -> Self {
        EngineError::Policy(e)
    }
}

/// The policy of `spec`, its burst applied (the GCRA family only).
pub(crate) fn policy_for(spec: &PolicySpec) -> Result<Policy, EngineError> {
    if spec.burst.is_some() && !spec.algorithm.takes_burst() {
        return Err(EngineError::BurstNotApplicable(spec.algorithm));
    }
    let policy = Policy::new(spec.limit, spec.per)?;
    Ok(match spec.burst {
        Some(burst) => policy.with_burst(burst)?,
        None => policy,
    })
}

/// The engine for `spec`: the one `match` from algorithm names to library types.
pub(crate) fn engine_for(spec: &PolicySpec) -> Result<Box<dyn ReplayEngine>, EngineError> {
    let policy = policy_for(spec)?;
    match spec.algorithm {
        // The token bucket (capacity B, refilled L per P) and the leaky bucket as a
        // meter (capacity B, draining L per P) are the same machine as GCRA.
        AlgorithmName::Gcra | AlgorithmName::TokenBucket | AlgorithmName::LeakyBucket => {
            Ok(Box::new(PerKeyStates::new(Gcra::new(policy))))
        }
        AlgorithmName::FixedWindow => Ok(Box::new(PerKeyStates::new(FixedWindow::new(policy)?))),
        AlgorithmName::SlidingWindow => {
            Ok(Box::new(PerKeyStates::new(SlidingWindow::new(policy)?)))
        }
        AlgorithmName::SlidingLog => Ok(Box::new(PerKeyLogs::new(policy))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use floodgate::reference::ExactGcra;
    use std::collections::HashMap;
    use std::time::Duration;

    fn spec(algorithm: AlgorithmName, burst: Option<u64>) -> PolicySpec {
        PolicySpec {
            algorithm,
            limit: 3,
            per: Duration::from_secs(1),
            burst,
        }
    }

    #[test]
    fn gcra_engine_matches_the_exact_model_per_key() {
        let mut engine = engine_for(&spec(AlgorithmName::TokenBucket, Some(2))).unwrap();
        let mut models: HashMap<&str, ExactGcra> = HashMap::new();
        let trace: [(u64, &str, u32); 9] = [
            (0, "a", 1),
            (0, "a", 1),
            (0, "a", 1),
            (0, "b", 2),
            (100_000_000, "a", 0),
            (333_333_334, "a", 1),
            (400_000_000, "b", 3),
            (1_000_000_000, "b", 2),
            (1_000_000_000, "c", 5),
        ];
        for (now, key, cost) in trace {
            let model = models
                .entry(key)
                .or_insert_with(|| ExactGcra::new(3, 1_000_000_000, 2).expect("a valid policy"));
            assert_eq!(
                engine.check(key, Nanos::new(now), cost).unwrap(),
                model.check(now, cost),
                "{now} {key} {cost}"
            );
        }
    }

    #[test]
    fn burst_is_refused_for_windows_and_missing_algorithms_say_so() {
        for name in [
            AlgorithmName::FixedWindow,
            AlgorithmName::SlidingWindow,
            AlgorithmName::SlidingLog,
        ] {
            let err = engine_for(&spec(name, Some(5))).err().unwrap();
            assert!(matches!(err, EngineError::BurstNotApplicable(_)), "{err}");
            assert!(engine_for(&spec(name, None)).is_ok());
        }
        let err = engine_for(&spec(AlgorithmName::Gcra, Some(0)))
            .err()
            .unwrap();
        assert!(matches!(err, EngineError::Policy(_)), "{err}");
    }
}
