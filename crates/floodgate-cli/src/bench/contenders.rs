//! The benchmark matrix: which implementations run for which algorithm and key
//! pattern.
//!
//! A [`Group`] is one algorithm on one key pattern ([`Keys`]); it has up to one
//! [`Contender`] per [`Implementation`] (the table's columns). A contender is a plain
//! function that builds its limiter and hands one decision closure to the generic
//! [`measure`]; the closure receives `(thread_index, op_index)`, so a many-keys
//! contender picks its key from them.
//!
//! # Adding rows
//!
//! * A new algorithm (fixed window, sliding window counter, sliding log): a function
//!   like [`gcra_hot`] returning its contenders, pushed in [`groups`]. Leave out an
//!   implementation that does not exist (governor has only GCRA; a textbook version
//!   only where `floodgate::reference` has one): the table prints `n/a`.
//! * Many keys, once the keyed limiter lands: a group with `keys: Keys::Many` whose
//!   floodgate contender checks `key_for(thread, op)` on the keyed limiter, its mutex
//!   twin on the locked keyed limiter, and governor's `RateLimiter::keyed` (behind the
//!   `compare` feature).
//!
//! # The workload
//!
//! Every contender enforces [`LIMIT`] per second with a burst of [`BURST`]: a rate far
//! above what any of them can decide, so every decision admits and every admission
//! writes the state — the contended worst case for a lock-free cell (a denial writes
//! nothing). Every contender reads its own clock once per decision, as it would in
//! production: floodgate's TSC clock, governor's quanta clock.

use std::time::Duration;

#[cfg(feature = "compare")]
use std::num::NonZeroU32;

use floodgate::reference::TextbookTokenBucket;
use floodgate::{Clock, DefaultClock, Gcra, Policy, RateLimiter};

use super::harness::{measure, Sample};

/// Units per second every contender enforces.
pub(crate) const LIMIT: u64 = 1_000_000_000;
/// Their burst (capacity).
pub(crate) const BURST: u64 = 1_000;

/// The columns of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Implementation {
    /// floodgate's lock-free limiter.
    Floodgate,
    /// The same transition under a mutex.
    MutexTwin,
    /// The seed article's version under a mutex (`floodgate::reference`).
    Textbook,
    /// The `governor` crate.
    Governor,
}

impl Implementation {
    /// Every column, in table order.
    pub(crate) const ALL: [Implementation; 4] = [
        Implementation::Floodgate,
        Implementation::MutexTwin,
        Implementation::Textbook,
        Implementation::Governor,
    ];

    /// The column heading.
    pub(crate) fn heading(self) -> &'static str {
        match self {
            Implementation::Floodgate => "floodgate",
            Implementation::MutexTwin => "mutex twin",
            Implementation::Textbook => "textbook",
            Implementation::Governor => "governor",
        }
    }

    /// The name in JSON and CSV.
    pub(crate) fn id(self) -> &'static str {
        match self {
            Implementation::Floodgate => "floodgate",
            Implementation::MutexTwin => "mutex_twin",
            Implementation::Textbook => "textbook",
            Implementation::Governor => "governor",
        }
    }
}

/// Which keys the decisions go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Keys {
    /// Every thread decides on the same key: maximum contention on one state.
    Hot,
    /// Threads spread over many keys (the keyed limiter's case). No group uses it
    /// until the keyed limiter lands.
    #[allow(dead_code)]
    Many,
}

impl Keys {
    pub(crate) fn id(self) -> &'static str {
        match self {
            Keys::Hot => "hot",
            Keys::Many => "many",
        }
    }
}

/// Builds a contender's limiter and measures it on `threads` threads for `run_time`.
pub(crate) type Runner = fn(threads: usize, run_time: Duration) -> Sample;

/// One implementation in one group.
#[derive(Clone, Copy)]
pub(crate) struct Contender {
    pub(crate) implementation: Implementation,
    pub(crate) run: Runner,
}

/// One algorithm on one key pattern: the rows of the table (one per thread count).
pub(crate) struct Group {
    pub(crate) algorithm: &'static str,
    pub(crate) keys: Keys,
    pub(crate) contenders: Vec<Contender>,
}

impl Group {
    pub(crate) fn contender(&self, implementation: Implementation) -> Option<&Contender> {
        self.contenders
            .iter()
            .find(|c| c.implementation == implementation)
    }
}

/// The whole matrix.
pub(crate) fn groups() -> Vec<Group> {
    vec![Group {
        algorithm: "gcra",
        keys: Keys::Hot,
        contenders: gcra_hot(),
    }]
}

fn gcra_policy() -> Policy {
    // Constant and covered by a test below: this cannot fail.
    Policy::per_second(LIMIT)
        .and_then(|p| p.with_burst(BURST))
        .expect("the benchmark policy is valid")
}

/// GCRA on one hot key.
pub(crate) fn gcra_hot() -> Vec<Contender> {
    let mut contenders = vec![
        Contender {
            implementation: Implementation::Floodgate,
            run: gcra_floodgate,
        },
        Contender {
            implementation: Implementation::MutexTwin,
            run: gcra_mutex_twin,
        },
        Contender {
            implementation: Implementation::Textbook,
            run: gcra_textbook,
        },
    ];
    #[cfg(feature = "compare")]
    contenders.push(Contender {
        implementation: Implementation::Governor,
        run: gcra_governor,
    });
    contenders
}

fn gcra_floodgate(threads: usize, run_time: Duration) -> Sample {
    let limiter = RateLimiter::gcra(gcra_policy());
    measure(threads, run_time, |_, _| limiter.check().is_allowed())
}

fn gcra_mutex_twin(threads: usize, run_time: Duration) -> Sample {
    let limiter = RateLimiter::locked_with_clock(Gcra::new(gcra_policy()), DefaultClock::new());
    measure(threads, run_time, |_, _| limiter.check().is_allowed())
}

fn gcra_textbook(threads: usize, run_time: Duration) -> Sample {
    let clock = DefaultClock::new();
    let bucket = std::sync::Mutex::new(TextbookTokenBucket::new(
        BURST as f64,
        LIMIT as f64,
        Duration::from_secs(1),
        clock.now().as_u64(),
    ));
    measure(threads, run_time, |_, _| {
        // The clock is read before taking the lock, as the limiters do.
        let now = clock.now().as_u64();
        bucket
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .allow(now, 1.0)
    })
}

#[cfg(feature = "compare")]
fn gcra_governor(threads: usize, run_time: Duration) -> Sample {
    let limit = NonZeroU32::new(LIMIT as u32).unwrap_or(NonZeroU32::MAX);
    let burst = NonZeroU32::new(BURST as u32).unwrap_or(NonZeroU32::MIN);
    let limiter =
        governor::RateLimiter::direct(governor::Quota::per_second(limit).allow_burst(burst));
    measure(threads, run_time, |_, _| limiter.check().is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workload_policy_is_valid_and_fits_governor() {
        let policy = gcra_policy();
        assert_eq!((policy.limit(), policy.burst()), (LIMIT, BURST));
        assert!(u32::try_from(LIMIT).is_ok() && u32::try_from(BURST).is_ok());
    }

    #[test]
    fn every_contender_runs_and_admits() {
        for group in groups() {
            for contender in &group.contenders {
                let sample = (contender.run)(2, Duration::from_millis(5));
                assert!(sample.operations > 0, "{:?}", contender.implementation);
                // A rate far above the achievable one: (nearly) everything admits.
                assert!(
                    sample.admitted * 10 >= sample.operations * 9,
                    "{:?}: {sample:?}",
                    contender.implementation
                );
            }
        }
    }
}
