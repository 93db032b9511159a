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
//! * A new word-sized algorithm (fixed window, sliding window counter): a [`Workload`]
//!   impl that builds it for the workload's rate, and one group in [`groups`] —
//!   `hot_key::<FixedWindowWorkload>(textbook)` gives its floodgate and mutex-twin
//!   contenders. Pass only the extra contenders that exist (governor has only GCRA; a
//!   textbook version only where `floodgate::reference` has one): the table prints
//!   `n/a` for the rest. The sliding log, which is not an `Algorithm`, gets runner
//!   functions of its own, shaped like [`gcra_textbook`].
//! * Many keys, once the keyed limiter lands: a group with `keys: Keys::Many` whose
//!   floodgate contender checks `key_for(thread, op)` on the keyed limiter, its mutex
//!   twin on the locked keyed limiter, and governor's `RateLimiter::keyed` (behind the
//!   `compare` feature).
//!
//! # The workload
//!
//! Each group states its workload (the report prints it). GCRA's contenders enforce
//! [`LIMIT`] per second with a burst of [`BURST`]: a rate far above what any of them
//! can decide, so every decision admits and every admission writes the state — the
//! contended worst case for a lock-free cell (a denial writes nothing). A window
//! algorithm may not accept such a policy (its counters and window index share one
//! word), so its [`Workload`] picks its own and says so. Every contender reads its
//! own clock once per decision, as it would in production: floodgate's TSC clock,
//! governor's quanta clock.

use std::time::Duration;

#[cfg(feature = "compare")]
use std::num::NonZeroU32;

use floodgate::reference::TextbookTokenBucket;
use floodgate::{Algorithm, Clock, DefaultClock, Gcra, Policy, RateLimiter};

use super::harness::{measure, Sample};

/// Units per second GCRA's contenders enforce.
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
    /// The policy and what it makes the decisions do.
    pub(crate) workload: String,
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
    let mut gcra_others = vec![Contender {
        implementation: Implementation::Textbook,
        run: gcra_textbook,
    }];
    #[cfg(feature = "compare")]
    gcra_others.push(Contender {
        implementation: Implementation::Governor,
        run: gcra_governor,
    });
    vec![Group {
        algorithm: "gcra",
        keys: Keys::Hot,
        workload: GcraWorkload::description(),
        contenders: hot_key::<GcraWorkload>(gcra_others),
    }]
}

/// A word-sized algorithm the matrix measures, built for the workload's rate.
pub(crate) trait Workload {
    /// The library type.
    type Algorithm: Algorithm;
    /// The algorithm, built for this workload's policy.
    fn algorithm() -> Self::Algorithm;
    /// The policy and what it makes the decisions do, for the report.
    fn description() -> String;
}

/// GCRA (and so the token and leaky buckets).
pub(crate) struct GcraWorkload;

impl Workload for GcraWorkload {
    type Algorithm = Gcra;
    fn algorithm() -> Gcra {
        Gcra::new(gcra_policy())
    }
    fn description() -> String {
        format!("{LIMIT} per second, burst {BURST}: every decision admits and writes the state")
    }
}

fn gcra_policy() -> Policy {
    // Constant and covered by a test below: this cannot fail.
    Policy::per_second(LIMIT)
        .and_then(|p| p.with_burst(BURST))
        .expect("the benchmark policy is valid")
}

/// `W` on one hot key, lock-free and as its mutex twin, followed by `others`.
pub(crate) fn hot_key<W: Workload>(others: Vec<Contender>) -> Vec<Contender> {
    let mut contenders = vec![
        Contender {
            implementation: Implementation::Floodgate,
            run: floodgate_hot::<W>,
        },
        Contender {
            implementation: Implementation::MutexTwin,
            run: mutex_twin_hot::<W>,
        },
    ];
    contenders.extend(others);
    contenders
}

fn floodgate_hot<W: Workload>(threads: usize, run_time: Duration) -> Sample {
    let limiter = RateLimiter::new(W::algorithm());
    measure(threads, run_time, |_, _| limiter.check().is_allowed())
}

fn mutex_twin_hot<W: Workload>(threads: usize, run_time: Duration) -> Sample {
    let limiter = RateLimiter::locked_with_clock(W::algorithm(), DefaultClock::new());
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
