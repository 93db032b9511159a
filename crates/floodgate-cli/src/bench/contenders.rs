//! The benchmark matrix: which implementations run for which algorithm and key
//! pattern.
//!
//! A [`Group`] is one algorithm on one key pattern ([`Keys`]); it has up to one
//! [`Contender`] per [`Implementation`] (the table's columns). A contender is a plain
//! function that builds its limiter and hands it to the shared harness,
//! [`floodgate_benches::run_for`] (the one the criterion suites use): per thread, a
//! setup closure builds that thread's decision closure (a many-keys contender gives
//! each thread its own key sequence, see [`key_for`]), and the decision closure
//! returns whether the decision admitted.
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
//! * Many keys: the group "gcra, many keys" measures [`MANY_KEYS`] keys spread by
//!   [`key_for`] — its mutex twin (the same transition over a sharded map of states,
//!   a mutex per shard), the textbook keyed limiter (one map of `f64` buckets under
//!   one mutex) and governor's keyed limiter (`RateLimiter::keyed`, a `DashMap`).
//!   Its floodgate column is the keyed limiter for word-sized keys
//!   (`KeyedLimiter<u64, _, _, Inline>`, keys inline in the slots), sized for twice
//!   [`MANY_KEYS`] so nothing live is evicted.
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

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;
use std::time::Duration;

#[cfg(feature = "compare")]
use std::num::NonZeroU32;

use floodgate::reference::{
    TextbookFixedWindow, TextbookSlidingLog, TextbookSlidingWindow, TextbookTokenBucket,
};
use floodgate::{
    Algorithm, AtomicCell, Clock, DefaultClock, FixedWindow, Gcra, KeyedBuilder, Policy,
    RateLimiter, SlidingLog, SlidingWindow, StateCell,
};

use floodgate_benches::{run_for, Measurement};

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
    /// Threads spread over many keys (the keyed limiter's case).
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
pub(crate) type Runner = fn(threads: usize, run_time: Duration) -> Measurement;

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

/// The whole matrix.
pub(crate) fn groups() -> Vec<Group> {
    #[cfg_attr(not(feature = "compare"), allow(unused_mut))]
    let mut gcra_others = vec![Contender {
        implementation: Implementation::Textbook,
        run: gcra_textbook,
    }];
    #[cfg(feature = "compare")]
    gcra_others.push(Contender {
        implementation: Implementation::Governor,
        run: gcra_governor,
    });
    #[cfg_attr(not(feature = "compare"), allow(unused_mut))]
    let mut gcra_many_others = vec![Contender {
        implementation: Implementation::Textbook,
        run: gcra_textbook_many,
    }];
    #[cfg(feature = "compare")]
    gcra_many_others.push(Contender {
        implementation: Implementation::Governor,
        run: gcra_governor_many,
    });
    vec![
        Group {
            algorithm: "gcra",
            keys: Keys::Hot,
            workload: GcraWorkload::description(),
            contenders: hot_key::<GcraWorkload>(gcra_others),
        },
        Group {
            algorithm: "gcra",
            keys: Keys::Many,
            workload: format!("{MANY_KEYS} keys, each {}", GcraWorkload::description()),
            contenders: many_keys::<GcraWorkload>(gcra_many_others),
        },
        Group {
            algorithm: "fixed-window",
            keys: Keys::Hot,
            workload: FixedWindowWorkload::description(),
            contenders: hot_key::<FixedWindowWorkload>(vec![Contender {
                implementation: Implementation::Textbook,
                run: fixed_window_textbook,
            }]),
        },
        Group {
            algorithm: "sliding-window",
            keys: Keys::Hot,
            workload: SlidingWindowWorkload::description(),
            contenders: hot_key::<SlidingWindowWorkload>(vec![Contender {
                implementation: Implementation::Textbook,
                run: sliding_window_textbook,
            }]),
        },
        Group {
            algorithm: "sliding-log",
            keys: Keys::Hot,
            workload: format!(
                "{SLIDING_LIMIT} per second, a ring of {SLIDING_LIMIT} timestamps under a \
                 short mutex (no lock-free twin to compare)"
            ),
            contenders: vec![
                Contender {
                    implementation: Implementation::Floodgate,
                    run: sliding_log_floodgate,
                },
                Contender {
                    implementation: Implementation::Textbook,
                    run: sliding_log_textbook,
                },
            ],
        },
    ]
}

fn sliding_log_policy() -> Policy {
    Policy::per_second(SLIDING_LIMIT).expect("the benchmark policy is valid")
}

fn sliding_log_floodgate(threads: usize, run_time: Duration) -> Measurement {
    let log = SlidingLog::new(sliding_log_policy());
    run_for(threads, run_time, |_| || log.check().is_allowed())
}

/// The seed article's log: a `Vec` of timestamps pruned with `retain`, in a mutex.
fn sliding_log_textbook(threads: usize, run_time: Duration) -> Measurement {
    let clock = DefaultClock::new();
    let log = Mutex::new(TextbookSlidingLog::new(
        SLIDING_LIMIT as usize,
        1_000_000_000,
    ));
    let (clock, log) = (&clock, &log);
    run_for(threads, run_time, |_| {
        move || {
            let now = clock.now().as_u64();
            lock(log).allow(now)
        }
    })
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

/// The fixed window at GCRA's rate.
pub(crate) struct FixedWindowWorkload;

impl Workload for FixedWindowWorkload {
    type Algorithm = FixedWindow;
    fn algorithm() -> FixedWindow {
        Policy::per_second(LIMIT)
            .and_then(FixedWindow::new)
            .expect("the benchmark policy is valid")
    }
    fn description() -> String {
        format!("{LIMIT} per second: every decision admits and writes the state")
    }
}

/// The sliding window counter's limit: its two counters and a window index that lasts
/// a year share one word, so it cannot take GCRA's 10^9 per second.
pub(crate) const SLIDING_LIMIT: u64 = 1_000;

/// The sliding window counter at [`SLIDING_LIMIT`] per second.
pub(crate) struct SlidingWindowWorkload;

impl Workload for SlidingWindowWorkload {
    type Algorithm = SlidingWindow;
    fn algorithm() -> SlidingWindow {
        Policy::per_second(SLIDING_LIMIT)
            .and_then(SlidingWindow::new)
            .expect("the benchmark policy is valid")
    }
    fn description() -> String {
        format!("{SLIDING_LIMIT} per second: nearly every decision denies and writes nothing")
    }
}

fn fixed_window_textbook(threads: usize, run_time: Duration) -> Measurement {
    textbook_window(
        threads,
        run_time,
        LIMIT,
        TextbookFixedWindow::new,
        TextbookFixedWindow::allow,
    )
}

fn sliding_window_textbook(threads: usize, run_time: Duration) -> Measurement {
    textbook_window(
        threads,
        run_time,
        SLIDING_LIMIT,
        TextbookSlidingWindow::new,
        TextbookSlidingWindow::allow,
    )
}

/// A textbook window of `limit` per second under one mutex (`new` builds it from
/// limit, period and now), asked with `allow` at each clock reading.
fn textbook_window<T: Send>(
    threads: usize,
    run_time: Duration,
    limit: u64,
    new: fn(u64, u64, u64) -> T,
    allow: impl Fn(&mut T, u64, u64) -> bool + Sync,
) -> Measurement {
    let clock = DefaultClock::new();
    let window = Mutex::new(new(limit, 1_000_000_000, clock.now().as_u64()));
    let (clock, window, allow) = (&clock, &window, &allow);
    run_for(threads, run_time, |_| {
        move || {
            let now = clock.now().as_u64();
            allow(&mut lock(window), now, 1)
        }
    })
}

fn gcra_policy() -> Policy {
    // Constant and covered by a test below: this cannot fail.
    Policy::per_second(LIMIT)
        .and_then(|p| p.with_burst(BURST))
        .expect("the benchmark policy is valid")
}

/// `W` on one hot key, lock-free and as its mutex twin, followed by `others`.
pub(crate) fn hot_key<W: Workload>(others: Vec<Contender>) -> Vec<Contender> {
    floodgate_and_twin(floodgate_hot::<W>, mutex_twin_hot::<W>, others)
}

/// floodgate's runner and its mutex twin's, followed by `others`.
fn floodgate_and_twin(floodgate: Runner, twin: Runner, others: Vec<Contender>) -> Vec<Contender> {
    let mut contenders = vec![
        Contender {
            implementation: Implementation::Floodgate,
            run: floodgate,
        },
        Contender {
            implementation: Implementation::MutexTwin,
            run: twin,
        },
    ];
    contenders.extend(others);
    contenders
}

fn floodgate_hot<W: Workload>(threads: usize, run_time: Duration) -> Measurement {
    let limiter = RateLimiter::new(W::algorithm());
    run_for(threads, run_time, |_| || limiter.check().is_allowed())
}

fn mutex_twin_hot<W: Workload>(threads: usize, run_time: Duration) -> Measurement {
    let limiter = RateLimiter::locked_with_clock(W::algorithm(), DefaultClock::new());
    run_for(threads, run_time, |_| || limiter.check().is_allowed())
}

/// Distinct keys in the many-keys groups.
pub(crate) const MANY_KEYS: u64 = 100_000;

/// The key of operation `op` on thread `thread` in a many-keys group: spread over
/// [`MANY_KEYS`] by a multiplicative scramble, each thread on its own sequence.
pub(crate) fn key_for(thread: usize, op: u64) -> u64 {
    let thread = (thread as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
    (op.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ thread) % MANY_KEYS
}

/// Thread `thread`'s keys, one per call: `key_for(thread, 0)`, `key_for(thread, 1)`, …
/// (built in the harness's untimed per-thread setup).
fn keys_of(thread: usize) -> impl FnMut() -> u64 {
    let mut op = 0u64;
    move || {
        let key = key_for(thread, op);
        op = op.wrapping_add(1);
        key
    }
}

/// `W` on [`MANY_KEYS`] keys: its mutex twin, followed by `others`.
pub(crate) fn many_keys<W: Workload>(others: Vec<Contender>) -> Vec<Contender> {
    floodgate_and_twin(floodgate_many::<W>, mutex_twin_many::<W>, others)
}

/// floodgate's keyed limiter for `u64` keys (inline storage: keys inline in the
/// slots), sized for twice [`MANY_KEYS`] (nothing live is evicted).
fn floodgate_many<W: Workload>(threads: usize, run_time: Duration) -> Measurement {
    let keyed = KeyedBuilder::new(W::algorithm())
        .capacity(2 * MANY_KEYS as usize)
        .build_inline::<u64>()
        .expect("the benchmark capacity is valid");
    run_for(threads, run_time, |thread| {
        let mut next_key = keys_of(thread);
        let keyed = &keyed;
        move || keyed.check(&next_key()).is_allowed()
    })
}

/// A power of two: enough shards that threads rarely meet on one lock.
const TWIN_SHARDS: usize = 64;

/// One shard of the keyed mutex twin, alone on its cache lines.
#[repr(align(128))]
struct TwinShard<S>(Mutex<HashMap<u64, S>>);

/// The keyed mutex twin: `W`'s transition over per-key states in sharded maps, one
/// mutex per shard (the shard from the key's high hash bits).
fn mutex_twin_many<W: Workload>(threads: usize, run_time: Duration) -> Measurement {
    let algorithm = W::algorithm();
    let fresh = AtomicCell::<<W::Algorithm as Algorithm>::State>::fresh().load();
    let clock = DefaultClock::new();
    let shards: Vec<TwinShard<_>> = (0..TWIN_SHARDS)
        .map(|_| TwinShard(Mutex::new(HashMap::new())))
        .collect();
    let hasher = RandomState::new();
    run_for(threads, run_time, |thread| {
        let mut next_key = keys_of(thread);
        let (algorithm, clock, shards, hasher) = (&algorithm, &clock, &shards, &hasher);
        move || {
            let key = next_key();
            let now = clock.now();
            let shard = (hasher.hash_one(key) >> (64 - TWIN_SHARDS.trailing_zeros())) as usize;
            let mut states = lock(&shards[shard].0);
            let state = states.entry(key).or_insert(fresh);
            let (decision, next) = algorithm.decide(*state, now, 1);
            if let Some(next) = next {
                *state = next;
            }
            decision.is_allowed()
        }
    })
}

/// The textbook keyed limiter: one map of `f64` buckets under one mutex.
fn gcra_textbook_many(threads: usize, run_time: Duration) -> Measurement {
    let clock = DefaultClock::new();
    let buckets: Mutex<HashMap<u64, TextbookTokenBucket>> = Mutex::new(HashMap::new());
    run_for(threads, run_time, |thread| {
        let mut next_key = keys_of(thread);
        let (clock, buckets) = (&clock, &buckets);
        move || {
            let key = next_key();
            let now = clock.now().as_u64();
            lock(buckets)
                .entry(key)
                .or_insert_with(|| textbook_bucket(now))
                .allow(now, 1.0)
        }
    })
}

#[cfg(feature = "compare")]
fn gcra_governor_many(threads: usize, run_time: Duration) -> Measurement {
    let limiter = governor::RateLimiter::keyed(governor_quota());
    run_for(threads, run_time, |thread| {
        let mut next_key = keys_of(thread);
        let limiter = &limiter;
        move || limiter.check_key(&next_key()).is_ok()
    })
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A full textbook bucket for GCRA's workload, created at `now`.
fn textbook_bucket(now: u64) -> TextbookTokenBucket {
    TextbookTokenBucket::new(BURST as f64, LIMIT as f64, Duration::from_secs(1), now)
}

fn gcra_textbook(threads: usize, run_time: Duration) -> Measurement {
    let clock = DefaultClock::new();
    let bucket = Mutex::new(textbook_bucket(clock.now().as_u64()));
    run_for(threads, run_time, |_| {
        || {
            // The clock is read before taking the lock, as the limiters do.
            let now = clock.now().as_u64();
            lock(&bucket).allow(now, 1.0)
        }
    })
}

#[cfg(feature = "compare")]
fn governor_quota() -> governor::Quota {
    let limit = NonZeroU32::new(LIMIT as u32).unwrap_or(NonZeroU32::MAX);
    let burst = NonZeroU32::new(BURST as u32).unwrap_or(NonZeroU32::MIN);
    governor::Quota::per_second(limit).allow_burst(burst)
}

#[cfg(feature = "compare")]
fn gcra_governor(threads: usize, run_time: Duration) -> Measurement {
    let limiter = governor::RateLimiter::direct(governor_quota());
    run_for(threads, run_time, |_| || limiter.check().is_ok())
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
                assert!(sample.ops > 0, "{:?}", contender.implementation);
                if !group.workload.contains("every decision admits") {
                    continue;
                }
                // A rate far above the achievable one: (nearly) everything admits.
                assert!(
                    sample.admitted * 10 >= sample.ops * 9,
                    "{:?}: {sample:?}",
                    contender.implementation
                );
            }
        }
    }

    #[test]
    fn each_thread_walks_its_own_key_sequence() {
        for thread in [0, 1, 7] {
            let mut next_key = keys_of(thread);
            for op in 0..100 {
                assert_eq!(next_key(), key_for(thread, op));
            }
        }
        assert!((0..1_000).all(|op| key_for(3, op) < MANY_KEYS));
        assert_ne!(
            (0..8).map(|op| key_for(0, op)).collect::<Vec<_>>(),
            (0..8).map(|op| key_for(1, op)).collect::<Vec<_>>()
        );
    }
}
