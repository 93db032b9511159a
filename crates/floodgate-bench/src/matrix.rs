//! The benchmark matrix: workloads × implementations × key counts × threads.
//!
//! A [`Group`] is one workload (an algorithm, its policy, the keys it goes to); it has
//! up to one [`Contender`] per [`Implementation`] (the table's columns). A contender is
//! a plain function ([`Runner`]) that builds its limiter and inserts its keys for a
//! [`Setup`] (thread count, key count), returning a [`Prepared`] run that hands a
//! decision closure per thread to the harness ([`measure`]) for each [`Budget`] it is
//! asked to measure. The criterion suites (`cargo bench -p
//! floodgate-benches`) and `floodgate bench` both walk [`groups`], so the two measure
//! the same code.
//!
//! # The contenders
//!
//! * **leased**, **leased-coarse**: floodgate's hot-key mode (`LeasedGcra`, one shard
//!   per thread): each thread spends units leased from the central GCRA word on its
//!   own padded word; `leased` reads the TSC on every decision, `leased-coarse` only
//!   on a refill (lease expiry on quanta's recent time).
//! * **floodgate**: the lock-free limiter (`RateLimiter`; for many keys the keyed
//!   limiter on inline storage for `u64` keys, capacity = the key count, as the README
//!   tells users to size it).
//! * **mutex twin**: the same transition under a mutex. For many keys it is the
//!   *sharded* twin — [`TWIN_SHARDS`] `Mutex<HashMap<u64, State>>` shards with ahash,
//!   the shard from the high hash bits — because that is floodgate's table shape with a
//!   lock in place of the CAS: the ratio then measures the lock, not the sharding. One
//!   map under one mutex is the textbook column's job.
//! * **textbook**: the seed article's version (`floodgate::reference`) under one mutex.
//! * **governor**: the `governor` crate in its fastest configuration: the direct
//!   limiter with its quanta clock; keyed, its `DashMap` store hashed with ahash.
//! * **dashmap anchor**: the GCRA transition on a `DashMap<u64, AtomicU64>` (a shard
//!   read lock, then a CAS): what a careful hand-rolled keyed limiter gets.
//! * **papaya anchor**: the same transition on a `papaya::HashMap<u64, AtomicU64>`
//!   (a lock-free lookup under papaya's guard, then a CAS): the strongest hand-rolled
//!   keyed anchor — but unbounded: no key is ever removed, so a flood of unique keys
//!   grows it without limit, where floodgate's table stays within its capacity.
//! * **floor**: one clock read and one *uncontended* CAS per decision (each thread its
//!   own padded word): no limiter that reads a clock and writes a word can be faster.
//! * **no-write ceiling**: each thread reads the clock and one *shared read-only* word:
//!   what a decision could cost if it never wrote shared memory — the bound a hot-key
//!   mode that spends leased units locally is measured against.
//!
//! # One key of a keyed limiter
//!
//! `gcra-keyed-hot` sends every thread to one key of a keyed limiter: floodgate's
//! table word (one cache line every admission writes), the per-key hot-key mode
//! (`HotKeyLimiter`, the key promoted before the run: its word is read, not
//! written, and units come from per-thread leases), the sharded mutex twin, the
//! textbook version, governor's keyed store, and the DashMap and papaya anchors.
//!
//! # The deny path
//!
//! `gcra-deny` (one per hour, burst 1) measures the path where every decision after
//! the first denies and writes nothing: floodgate, its mutex twin, the textbook bucket
//! and governor.
//!
//! # Key policies
//!
//! Keyed groups come in two policies: **booked ahead** (1 per second, burst 10^9: each
//! visit books the key a second further ahead, so every key stays live for the whole
//! run and every decision is the known-key path) and **idle between visits** (10^9 per
//! second, burst 1000: each key is idle again long before its next visit, so a table
//! may reclaim it). Keys are inserted before the measured loop, and under a
//! [`Budget::Time`] a warm-up runs first on the same limiter.
//!
//! # Key distributions
//!
//! Each key policy comes in two [`KeyDistribution`]s (see [`crate::keys`]):
//! **uniform** (`gcra-keyed-booked`, `gcra-keyed-idle`: each thread walks its own
//! scramble of every key) and **Zipf** with s = 1 (`gcra-keyed-booked-zipf`,
//! `gcra-keyed-idle-zipf`: rank k visited in proportion to 1/k, ranks scattered over
//! the keys by a fixed permutation, so a few keys are hot and threads meet on them).
//! The Zipf keys are drawn before any measured run into one sequence that each thread
//! reads from its own starting point, so the timed loop reads a table where the
//! uniform one computes a multiply and a modulo: compare the columns of one group,
//! not a uniform group's figures with a Zipf group's.
//!
//! The idle policy also comes **disjoint** (`gcra-keyed-idle-disjoint`): each thread
//! walks the uniform scramble of its own share of the keys, so no two threads visit
//! one key (issue 10's "2 threads on distinct keys, 500k each" at `--keys 1000000`).
//! `floodgate bench` runs it only when `--groups` names it ([`Group::main_job`]).
//!
//! # Memory
//!
//! [`keyed_tables`] lists every keyed contender's table (floodgate on each storage:
//! heap, inline, fingerprint) for [`crate::memory`], which counts the bytes each holds
//! per key.

use std::collections::HashMap;
#[cfg(feature = "compare")]
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::Instant;

use crossbeam_utils::CachePadded;
use dashmap::DashMap;
use floodgate::keyed::MAX_HOT_KEYS;
use floodgate::reference::{
    TextbookFixedWindow, TextbookSlidingLog, TextbookSlidingWindow, TextbookTokenBucket,
};
use floodgate::{
    Algorithm, AtomicCell, Clock, DefaultClock, Fingerprint, FixedWindow, Gcra, GcraState, Heap,
    HotKeyLimiter, HotKeys, Inline, KeyedBuilder, KeyedLimiter, LeasedGcra, Policy, RateLimiter,
    SlidingLog, SlidingWindow, StateCell, Storage,
};

use crate::harness::{measure, Budget, Measurement};
use crate::keys::{keys_of, share_keys_of, KeyDistribution, ZipfKeys, ZIPF_SEED};

/// Units per second of the hot-key GCRA workload (and of the idle keyed policy).
pub const LIMIT: u64 = 1_000_000_000;
/// Their burst (capacity).
pub const BURST: u64 = 1_000;
/// The sliding window counter's and the sliding log's limit per second: the counter's
/// two counts and a window index that lasts a year share one word, so it cannot take
/// GCRA's 10^9 per second.
pub const SLIDING_LIMIT: u64 = 1_000;
/// Shards of the keyed mutex twin (a power of two: threads rarely meet on one lock).
pub const TWIN_SHARDS: usize = 64;

/// The columns of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Implementation {
    /// floodgate's lock-free limiter.
    Floodgate,
    /// floodgate's leased hot-key mode (`LeasedGcra`), a clock read per decision.
    Leased,
    /// The leased mode with the coarse expiry clock: no TSC read while a lease is valid.
    LeasedCoarse,
    /// The same transition under a mutex.
    MutexTwin,
    /// The seed article's version under a mutex (`floodgate::reference`).
    Textbook,
    /// The `governor` crate.
    Governor,
    /// GCRA on a `DashMap<u64, AtomicU64>`.
    DashmapAnchor,
    /// GCRA on a `papaya::HashMap<u64, AtomicU64>` (lock-free reads): the few lines
    /// a careful user writes, the strongest keyed anchor.
    PapayaAnchor,
    /// A clock read and one uncontended CAS (in a keyed group: the GCRA step on the
    /// key's own word in a plain array the key indexes, the floor of any keyed table:
    /// no lookup, no key stored).
    Floor,
    /// A clock read and a load of one shared read-only word.
    NoWriteCeiling,
}

impl Implementation {
    /// Every column, in table order.
    pub const ALL: [Implementation; 10] = [
        Implementation::Floodgate,
        Implementation::Leased,
        Implementation::LeasedCoarse,
        Implementation::MutexTwin,
        Implementation::Textbook,
        Implementation::Governor,
        Implementation::DashmapAnchor,
        Implementation::PapayaAnchor,
        Implementation::Floor,
        Implementation::NoWriteCeiling,
    ];

    /// The column heading.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_bench::matrix::Implementation;
    /// assert_eq!(Implementation::MutexTwin.heading(), "mutex twin");
    /// ```
    pub fn heading(self) -> &'static str {
        match self {
            Implementation::Floodgate => "floodgate",
            Implementation::Leased => "leased",
            Implementation::LeasedCoarse => "leased-coarse",
            Implementation::MutexTwin => "mutex twin",
            Implementation::Textbook => "textbook",
            Implementation::Governor => "governor",
            Implementation::DashmapAnchor => "dashmap",
            Implementation::PapayaAnchor => "papaya",
            Implementation::Floor => "floor",
            Implementation::NoWriteCeiling => "no-write",
        }
    }

    /// The name in JSON, CSV and criterion benchmark ids.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_bench::matrix::Implementation;
    /// assert_eq!(Implementation::NoWriteCeiling.id(), "no_write_ceiling");
    /// ```
    pub fn id(self) -> &'static str {
        match self {
            Implementation::Floodgate => "floodgate",
            Implementation::Leased => "leased",
            Implementation::LeasedCoarse => "leased_coarse",
            Implementation::MutexTwin => "mutex_twin",
            Implementation::Textbook => "textbook",
            Implementation::Governor => "governor",
            Implementation::DashmapAnchor => "dashmap_anchor",
            Implementation::PapayaAnchor => "papaya_anchor",
            Implementation::Floor => "floor",
            Implementation::NoWriteCeiling => "no_write_ceiling",
        }
    }
}

/// Which criterion group a workload belongs to (`floodgate bench` prints them all).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suite {
    /// GCRA on one hot key: `uncontended` at one thread, `contended` above.
    HotKey,
    /// Many keys: `keyed`.
    Keyed,
    /// The other algorithms on one hot key: `algorithms`.
    Algorithms,
}

/// How the keyed groups' per-key policy treats a key between two visits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyPolicy {
    /// 1 per second, burst 10^9: each key is booked ahead of the clock (always live).
    BookedAhead,
    /// 10^9 per second, burst 1000: each key is idle again between visits.
    IdleBetweenVisits,
}

impl KeyPolicy {
    /// The name in the table, JSON and benchmark ids.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_bench::matrix::KeyPolicy;
    /// assert_eq!(KeyPolicy::BookedAhead.id(), "booked");
    /// ```
    pub fn id(self) -> &'static str {
        match self {
            KeyPolicy::BookedAhead => "booked",
            KeyPolicy::IdleBetweenVisits => "idle",
        }
    }

    fn policy(self) -> Policy {
        match self {
            KeyPolicy::BookedAhead => {
                Policy::per_second(1).and_then(|p| p.with_burst(1_000_000_000))
            }
            KeyPolicy::IdleBetweenVisits => gcra_policy_result(),
        }
        .expect("the benchmark policies are valid")
    }

    #[cfg(feature = "compare")]
    fn quota(self) -> governor::Quota {
        let policy = self.policy();
        let nz = |n: u64| {
            NonZeroU32::new(u32::try_from(n).unwrap_or(u32::MAX)).unwrap_or(NonZeroU32::MIN)
        };
        governor::Quota::per_second(nz(policy.limit())).allow_burst(nz(policy.burst()))
    }
}

/// What one measured run is asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setup {
    /// Threads deciding at once.
    pub threads: usize,
    /// Distinct keys (1 for a hot key).
    pub keys: u64,
    /// How much work each thread does.
    pub budget: Budget,
    /// The run's hash seed: every keyed table the run builds (floodgate's, through
    /// `KeyedBuilder::hash_seed`, and each contender's map) hashes with seeds derived
    /// from it instead of random ones. Which keys share a shard or a probe run moves a
    /// table's speed by up to about 15 % at 10^3–10^4 keys, so `floodgate bench` gives
    /// run `i` of every cell seed `i`: two invocations of one binary on one machine lay
    /// out their tables alike, and their medians differ only by what the machine did.
    /// (A build with other target features, or another core count, which sets
    /// floodgate's default shard count, lays them out otherwise.)
    pub seed: u64,
}

impl Setup {
    /// Hasher number `n` of a contender for this run ([`Setup::seed`]). Hashers that
    /// must not agree take different `n`: a map inside a shard chosen by the top bits
    /// of one hash would find nearly every key's tag alike if it hashed with the same
    /// one.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_bench::matrix::Setup;
    /// use floodgate_bench::Budget;
    /// let setup = Setup { threads: 1, keys: 10, budget: Budget::Ops(0), seed: 3 };
    /// let hash = |setup: Setup, n| setup.hasher(n).hash_one(7u64);
    /// assert_eq!(hash(setup, 0), hash(setup, 0));
    /// assert_ne!(hash(setup, 0), hash(setup, 1));
    /// assert_ne!(hash(setup, 0), hash(Setup { seed: 4, ..setup }, 0));
    /// ```
    pub fn hasher(&self, n: u64) -> ahash::RandomState {
        let [k0, k1, k2, k3] =
            crate::keys::seed_words(self.seed ^ n.wrapping_mul(0xA076_1D64_78BD_642F));
        ahash::RandomState::with_seeds(k0, k1, k2, k3)
    }
}

/// Builds a contender's limiter for a [`Setup`] and inserts its keys (the setup's
/// budget is not used until [`Prepared::run`]).
pub type Runner = fn(&Setup) -> Prepared;

/// A contender built for a setup: its limiter exists and its keys are inserted, so
/// that each [`run`](Prepared::run) measures the same table again, its keys in the
/// states the previous runs left them in (as a long-lived limiter's are). The
/// criterion suites prepare once per cell and run once per sample.
pub struct Prepared {
    threads: usize,
    run: Box<dyn FnMut(usize, Budget) -> Measurement>,
}

impl Prepared {
    /// A prepared run for `setup.threads` threads; `run` measures one budget on the
    /// state it owns.
    fn new(setup: &Setup, run: impl FnMut(usize, Budget) -> Measurement + 'static) -> Prepared {
        Prepared {
            threads: setup.threads,
            run: Box::new(run),
        }
    }

    /// Measures one run of `budget` on each thread.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_bench::matrix::{groups, Setup};
    /// use floodgate_bench::Budget;
    /// let matrix = groups();
    /// let keyed = matrix.iter().find(|g| g.id == "gcra-keyed-idle").unwrap();
    /// let setup = Setup { threads: 1, keys: 100, budget: Budget::Ops(0), seed: 0 };
    /// let mut prepared = (keyed.contenders[0].run)(&setup);
    /// assert_eq!(prepared.run(Budget::Ops(1_000)).admitted, 1_000);
    /// assert_eq!(prepared.run(Budget::Ops(500)).ops, 500);
    /// ```
    pub fn run(&mut self, budget: Budget) -> Measurement {
        (self.run)(self.threads, budget)
    }
}

/// One implementation in one group.
#[derive(Clone, Copy)]
pub struct Contender {
    /// Its column.
    pub implementation: Implementation,
    /// Builds it for a setup.
    pub run: Runner,
}

impl Contender {
    /// Builds it for `setup` and measures one run of `setup.budget`.
    ///
    /// # Examples
    ///
    /// ```
    /// let matrix = floodgate_bench::matrix::groups();
    /// let setup = floodgate_bench::matrix::Setup { threads: 1, keys: 1, budget: floodgate_bench::Budget::Ops(100), seed: 0 };
    /// assert_eq!(matrix[0].contenders[0].measure(&setup).ops, 100);
    /// ```
    pub fn measure(&self, setup: &Setup) -> Measurement {
        (self.run)(setup).run(setup.budget)
    }
}

/// One workload: the rows of the table (one per key count × thread count).
pub struct Group {
    /// Short name: the algorithm, and for keyed groups the key policy and, when not
    /// uniform, the key distribution (`gcra-keyed-idle-zipf`).
    pub id: String,
    /// The criterion group it belongs to.
    pub suite: Suite,
    /// The key counts it runs at (`[1]` for a hot key).
    pub key_counts: Vec<u64>,
    /// The policy and what it makes the decisions do.
    pub workload: String,
    /// Its contenders, in column order.
    pub contenders: Vec<Contender>,
    /// Whether `floodgate bench` runs it when `--groups` names no group. A group that
    /// answers one question (each thread on its own keys) runs only when named, so
    /// that the main job's cells, which share its fixed measuring time, stay few.
    pub main_job: bool,
}

/// A keyed runner's key distribution, as its index in [`KeyDistribution::ALL`] (a
/// const parameter: runners are plain function pointers).
const UNIFORM: usize = 0;
/// See [`UNIFORM`].
const ZIPF: usize = 1;
/// See [`UNIFORM`].
const DISJOINT: usize = 2;
const _: () = {
    assert!(matches!(
        KeyDistribution::ALL[UNIFORM],
        KeyDistribution::Uniform
    ));
    assert!(matches!(KeyDistribution::ALL[ZIPF], KeyDistribution::Zipf));
    assert!(matches!(
        KeyDistribution::ALL[DISJOINT],
        KeyDistribution::Disjoint
    ));
};

/// Key counts of the keyed groups.
pub const KEY_COUNTS: [u64; 2] = [1_000, 100_000];

/// The whole matrix.
///
/// # Examples
///
/// ```
/// use floodgate_bench::matrix::{groups, Implementation};
/// let matrix = groups();
/// assert!(matrix.iter().any(|g| g.contenders.iter().any(|c| c.implementation == Implementation::Floor)));
/// ```
pub fn groups() -> Vec<Group> {
    let c = |implementation, run| Contender {
        implementation,
        run,
    };
    let mut gcra_hot = vec![
        c(Implementation::Floodgate, hot::<GcraWorkload>),
        c(Implementation::Leased, leased::<false>),
        c(Implementation::LeasedCoarse, leased::<true>),
        c(Implementation::MutexTwin, hot_twin::<GcraWorkload>),
        c(Implementation::Textbook, gcra_textbook::<false>),
    ];
    #[cfg(feature = "compare")]
    gcra_hot.push(c(Implementation::Governor, gcra_governor));
    gcra_hot.push(c(Implementation::Floor, floor));
    gcra_hot.push(c(Implementation::NoWriteCeiling, no_write_ceiling));
    let mut matrix = vec![Group {
        id: "gcra".to_owned(),
        suite: Suite::HotKey,
        main_job: true,
        key_counts: vec![1],
        workload: GcraWorkload::description(),
        contenders: gcra_hot,
    }];
    #[cfg_attr(not(feature = "compare"), allow(unused_mut))]
    let mut gcra_deny = vec![
        c(Implementation::Floodgate, hot::<GcraDenyWorkload>),
        c(Implementation::MutexTwin, hot_twin::<GcraDenyWorkload>),
        c(Implementation::Textbook, gcra_textbook::<true>),
    ];
    #[cfg(feature = "compare")]
    gcra_deny.push(c(Implementation::Governor, gcra_governor_deny));
    matrix.push(Group {
        id: "gcra-deny".to_owned(),
        suite: Suite::HotKey,
        main_job: true,
        key_counts: vec![1],
        workload: GcraDenyWorkload::description(),
        contenders: gcra_deny,
    });
    matrix.push(keyed_group::<true, UNIFORM>());
    matrix.push(keyed_group::<false, UNIFORM>());
    matrix.push(keyed_group::<true, ZIPF>());
    matrix.push(keyed_group::<false, ZIPF>());
    // Issue 10's "2 threads on distinct keys": the idle policy only (the state clients
    // under their rate leave keys in); `floodgate bench` runs it only when named.
    matrix.push(keyed_group::<false, DISJOINT>());
    matrix.push(keyed_hot_group());
    matrix.push(Group {
        id: "fixed-window".to_owned(),
        suite: Suite::Algorithms,
        main_job: true,
        key_counts: vec![1],
        workload: FixedWindowWorkload::description(),
        contenders: vec![
            c(Implementation::Floodgate, hot::<FixedWindowWorkload>),
            c(Implementation::MutexTwin, hot_twin::<FixedWindowWorkload>),
            c(Implementation::Textbook, fixed_window_textbook),
        ],
    });
    matrix.push(Group {
        id: "sliding-window".to_owned(),
        suite: Suite::Algorithms,
        main_job: true,
        key_counts: vec![1],
        workload: SlidingWindowWorkload::description(),
        contenders: vec![
            c(Implementation::Floodgate, hot::<SlidingWindowWorkload>),
            c(Implementation::MutexTwin, hot_twin::<SlidingWindowWorkload>),
            c(Implementation::Textbook, sliding_window_textbook),
        ],
    });
    matrix.push(Group {
        id: "sliding-log".to_owned(),
        suite: Suite::Algorithms,
        main_job: true,
        key_counts: vec![1],
        workload: format!(
            "{SLIDING_LIMIT} per second, a ring of {SLIDING_LIMIT} timestamps under a short \
             mutex (no lock-free twin to compare)"
        ),
        contenders: vec![
            c(Implementation::Floodgate, sliding_log_floodgate),
            c(Implementation::Textbook, sliding_log_textbook),
        ],
    });
    matrix
}

/// The keyed group of one key policy (`BOOKED`: booked ahead, else idle between
/// visits) and one key distribution (`DIST`: [`UNIFORM`], [`ZIPF`] or [`DISJOINT`]):
/// every keyed contender.
fn keyed_group<const BOOKED: bool, const DIST: usize>() -> Group {
    let (policy, distribution) = (key_policy(BOOKED), KeyDistribution::ALL[DIST]);
    let contenders = keyed_contenders::<BOOKED, DIST>();
    let policy_text = match policy {
        KeyPolicy::BookedAhead => "each key 1 per second, burst 10^9: booked ahead, always live",
        KeyPolicy::IdleBetweenVisits => {
            "each key 10^9 per second, burst 1000: idle again between visits"
        }
    };
    let id = match distribution {
        KeyDistribution::Uniform => format!("gcra-keyed-{}", policy.id()),
        KeyDistribution::Zipf | KeyDistribution::Disjoint => {
            format!("gcra-keyed-{}-{}", policy.id(), distribution.id())
        }
    };
    Group {
        id,
        suite: Suite::Keyed,
        main_job: distribution != KeyDistribution::Disjoint,
        key_counts: KEY_COUNTS.to_vec(),
        workload: format!(
            "{policy_text}; keys inserted before the run, {}; every decision admits",
            distribution.description()
        ),
        contenders,
    }
}

/// Every keyed contender of one key policy and one key distribution, in table order.
fn keyed_contenders<const BOOKED: bool, const DIST: usize>() -> Vec<Contender> {
    let c = |implementation, run| Contender {
        implementation,
        run,
    };
    #[cfg_attr(not(feature = "compare"), allow(unused_mut))]
    let mut contenders = vec![
        c(
            Implementation::Floodgate,
            keyed_floodgate::<Inline, BOOKED, DIST>,
        ),
        c(Implementation::MutexTwin, keyed_twin::<BOOKED, DIST>),
        c(Implementation::Textbook, keyed_textbook::<BOOKED, DIST>),
    ];
    #[cfg(feature = "compare")]
    contenders.push(c(Implementation::Governor, keyed_governor::<BOOKED, DIST>));
    contenders.extend([
        c(Implementation::DashmapAnchor, keyed_dashmap::<BOOKED, DIST>),
        c(Implementation::PapayaAnchor, keyed_papaya::<BOOKED, DIST>),
        c(Implementation::Floor, keyed_floor::<BOOKED, DIST>),
    ]);
    contenders
}

/// One key of a keyed limiter hit by every thread (the idle policy's rate, 10^9 per
/// second, burst 1000, so every decision admits): the keyed table's own word against
/// the per-key hot-key mode (`HotKeyLimiter`, the key promoted before the run) and
/// the keyed peers (the textbook version included, as in every keyed group).
fn keyed_hot_group() -> Group {
    // The idle policy's contenders (uniform keys: with one key, every thread's is
    // key 0), the hot-key mode beside floodgate's table word.
    let mut contenders = keyed_contenders::<false, UNIFORM>();
    contenders.insert(
        1,
        Contender {
            implementation: Implementation::Leased,
            run: keyed_hot,
        },
    );
    Group {
        id: "gcra-keyed-hot".to_owned(),
        suite: Suite::Keyed,
        main_job: true,
        key_counts: vec![1],
        workload: "every thread on one key of a keyed limiter, 10^9 per second, burst 1000; \
                   leased: HotKeyLimiter with the key promoted (a lease shard per thread)"
            .to_owned(),
        contenders,
    }
}

/// floodgate's per-key hot-key mode: a `HotKeyLimiter` on inline storage whose
/// keys are promoted before the run (one lease shard per thread).
fn keyed_hot(setup: &Setup) -> Prepared {
    let limiter: HotKeyLimiter<u64, DefaultClock, Inline> = HotKeyLimiter::new_in(
        gcra_policy(),
        KeyedBuilder::default()
            .capacity(1_024)
            .hash_seed(setup.seed),
        HotKeys::default()
            .manual()
            .slots(MAX_HOT_KEYS)
            .lease_shards(setup.threads),
    )
    .expect("the benchmark hot-key settings are valid");
    for key in 0..setup.keys.min(MAX_HOT_KEYS as u64) {
        assert!(limiter.promote(&key), "a free slot for each benchmark key");
    }
    keyed_run_inserting_elsewhere(setup, KeyDistribution::Uniform, move |key| {
        limiter.check(&key).is_allowed()
    })
}

/// A keyed contender's table, for measuring the memory it holds per key.
#[derive(Clone, Copy)]
pub struct KeyedTable {
    /// Its name: the column's id, with the storage for floodgate (`floodgate_inline`).
    pub id: &'static str,
    /// Builds it for a setup and inserts the setup's keys (booked ahead: every key
    /// stays live).
    pub build: Runner,
}

/// Every keyed contender's table: floodgate on each storage (heap, inline,
/// fingerprint; capacity = the key count), then the other columns of the keyed groups.
///
/// # Examples
///
/// ```
/// use floodgate_bench::matrix::{keyed_tables, Setup};
/// use floodgate_bench::Budget;
/// let tables = keyed_tables();
/// assert_eq!(tables[1].id, "floodgate_inline");
/// let setup = Setup { threads: 1, keys: 10, budget: Budget::Ops(5), seed: 0 };
/// assert_eq!((tables[1].build)(&setup).run(setup.budget).admitted, 5);
/// ```
pub fn keyed_tables() -> Vec<KeyedTable> {
    let mut tables = vec![
        KeyedTable {
            id: "floodgate_heap",
            build: keyed_floodgate::<Heap, true, UNIFORM>,
        },
        KeyedTable {
            id: "floodgate_inline",
            build: keyed_floodgate::<Inline, true, UNIFORM>,
        },
        KeyedTable {
            id: "floodgate_fingerprint",
            build: keyed_floodgate::<Fingerprint, true, UNIFORM>,
        },
    ];
    tables.extend(
        keyed_group::<true, UNIFORM>()
            .contenders
            .into_iter()
            .filter(|c| c.implementation != Implementation::Floodgate)
            .map(|c| KeyedTable {
                id: c.implementation.id(),
                build: c.run,
            }),
    );
    tables
}

/// floodgate's keyed limiter on its other storages for one keyed group (`group` is a
/// keyed group's id; `None` for any other group), with the group's key policy and key
/// distribution: `floodgate_heap` (`u64` keys on [`Heap`]), `floodgate_heap_string`
/// (the same keys as `String`s on [`Heap`], the storage the README gives string
/// keys), `floodgate_fingerprint` and `floodgate_fingerprint_string` (on
/// [`Fingerprint`]). The group's own `floodgate` column is [`Inline`]. Not in the
/// matrix; `decision_cost` counts a decision on each.
///
/// # Examples
///
/// ```
/// use floodgate_bench::matrix::{keyed_storages, Setup};
/// use floodgate_bench::Budget;
/// let storages = keyed_storages("gcra-keyed-idle").unwrap();
/// assert_eq!(storages[1].id, "floodgate_heap_string");
/// let setup = Setup { threads: 1, keys: 10, budget: Budget::Ops(5), seed: 0 };
/// assert_eq!((storages[1].build)(&setup).run(setup.budget).admitted, 5);
/// assert!(keyed_storages("gcra").is_none());
/// ```
pub fn keyed_storages(group: &str) -> Option<Vec<KeyedTable>> {
    fn of<const BOOKED: bool, const DIST: usize>() -> Vec<KeyedTable> {
        let runs: [(&'static str, Runner); 4] = [
            ("floodgate_heap", keyed_floodgate::<Heap, BOOKED, DIST>),
            (
                "floodgate_heap_string",
                keyed_floodgate_string::<Heap, BOOKED, DIST>,
            ),
            (
                "floodgate_fingerprint",
                keyed_floodgate::<Fingerprint, BOOKED, DIST>,
            ),
            (
                "floodgate_fingerprint_string",
                keyed_floodgate_string::<Fingerprint, BOOKED, DIST>,
            ),
        ];
        runs.into_iter()
            .map(|(id, build)| KeyedTable { id, build })
            .collect()
    }
    Some(match group {
        "gcra-keyed-booked" => of::<true, UNIFORM>(),
        "gcra-keyed-idle" | "gcra-keyed-hot" => of::<false, UNIFORM>(),
        "gcra-keyed-booked-zipf" => of::<true, ZIPF>(),
        "gcra-keyed-idle-zipf" => of::<false, ZIPF>(),
        "gcra-keyed-idle-disjoint" => of::<false, DISJOINT>(),
        _ => return None,
    })
}

/// A word-sized algorithm the matrix measures, built for the workload's rate.
pub trait Workload {
    /// The library type.
    type Algorithm: Algorithm + 'static;
    /// The algorithm, built for this workload's policy.
    fn algorithm() -> Self::Algorithm;
    /// The policy and what it makes the decisions do, for the report.
    fn description() -> String;
}

/// GCRA (and so the token and leaky buckets) at [`LIMIT`] per second, burst [`BURST`].
pub struct GcraWorkload;

impl Workload for GcraWorkload {
    type Algorithm = Gcra;
    fn algorithm() -> Gcra {
        Gcra::new(gcra_policy())
    }
    fn description() -> String {
        format!("{LIMIT} per second, burst {BURST}: every decision admits and writes the state")
    }
}

/// The fixed window at [`LIMIT`] per second.
pub struct FixedWindowWorkload;

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

/// GCRA at one per hour, burst 1: after the first decision every decision denies
/// and writes nothing (the deny path).
pub struct GcraDenyWorkload;

impl Workload for GcraDenyWorkload {
    type Algorithm = Gcra;
    fn algorithm() -> Gcra {
        Gcra::new(gcra_deny_policy())
    }
    fn description() -> String {
        "1 per hour, burst 1: after the first, every decision denies and writes nothing".to_owned()
    }
}

/// The deny workload's policy.
fn gcra_deny_policy() -> Policy {
    Policy::per_hour(1).expect("the benchmark policy is valid")
}

/// The sliding window counter at [`SLIDING_LIMIT`] per second.
pub struct SlidingWindowWorkload;

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

fn gcra_policy_result() -> Result<Policy, floodgate::PolicyError> {
    Policy::per_second(LIMIT).and_then(|p| p.with_burst(BURST))
}

/// The hot-key GCRA policy: [`LIMIT`] per second, burst [`BURST`].
///
/// # Examples
///
/// ```
/// let policy = floodgate_bench::matrix::gcra_policy();
/// assert_eq!(policy.burst(), floodgate_bench::matrix::BURST);
/// ```
pub fn gcra_policy() -> Policy {
    gcra_policy_result().expect("the benchmark policy is valid")
}

/// governor's quota for the hot-key workload.
#[cfg(feature = "compare")]
pub fn governor_quota() -> governor::Quota {
    let limit = NonZeroU32::new(LIMIT as u32).unwrap_or(NonZeroU32::MAX);
    let burst = NonZeroU32::new(BURST as u32).unwrap_or(NonZeroU32::MIN);
    governor::Quota::per_second(limit).allow_burst(burst)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn hot<W: Workload>(setup: &Setup) -> Prepared {
    let limiter = RateLimiter::new(W::algorithm());
    Prepared::new(setup, move |threads, budget| {
        measure(threads, budget, |_| || limiter.check().is_allowed())
    })
}

fn hot_twin<W: Workload>(setup: &Setup) -> Prepared {
    let limiter = RateLimiter::locked_with_clock(W::algorithm(), DefaultClock::new());
    Prepared::new(setup, move |threads, budget| {
        measure(threads, budget, |_| || limiter.check().is_allowed())
    })
}

/// A full textbook bucket for GCRA's workload (`DENY`: the deny workload's one
/// per hour, burst 1), created at `now`.
fn textbook_bucket<const DENY: bool>(now: u64) -> TextbookTokenBucket {
    let (burst, refill, every) = if DENY {
        (1.0, 1.0, std::time::Duration::from_secs(3600))
    } else {
        (
            BURST as f64,
            LIMIT as f64,
            std::time::Duration::from_secs(1),
        )
    };
    TextbookTokenBucket::new(burst, refill, every, now)
}

fn gcra_textbook<const DENY: bool>(setup: &Setup) -> Prepared {
    let clock = DefaultClock::new();
    let bucket = Mutex::new(textbook_bucket::<DENY>(clock.now().as_u64()));
    Prepared::new(setup, move |threads, budget| {
        measure(threads, budget, |_| {
            || {
                // The clock is read before taking the lock, as the limiters do.
                let now = clock.now().as_u64();
                lock(&bucket).allow(now, 1.0)
            }
        })
    })
}

#[cfg(feature = "compare")]
fn gcra_governor(setup: &Setup) -> Prepared {
    let limiter = governor::RateLimiter::direct(governor_quota());
    Prepared::new(setup, move |threads, budget| {
        measure(threads, budget, |_| || limiter.check().is_ok())
    })
}

/// governor's direct limiter on the deny workload's quota (one per hour, burst 1).
#[cfg(feature = "compare")]
fn gcra_governor_deny(setup: &Setup) -> Prepared {
    let quota = governor::Quota::per_hour(NonZeroU32::MIN);
    let limiter = governor::RateLimiter::direct(quota);
    Prepared::new(setup, move |threads, budget| {
        measure(threads, budget, |_| || limiter.check().is_ok())
    })
}

/// The leased hot-key mode: one shard per thread, default lease size (burst ÷ 4 ×
/// shards) and lifetime (1 ms); `COARSE`: the coarse expiry clock.
fn leased<const COARSE: bool>(setup: &Setup) -> Prepared {
    let builder = LeasedGcra::builder(gcra_policy()).shards(setup.threads);
    let limiter = if COARSE {
        builder.build_coarse()
    } else {
        builder.build()
    }
    .expect("the benchmark lease settings are valid");
    Prepared::new(setup, move |threads, budget| {
        measure(threads, budget, |_| || limiter.check().is_allowed())
    })
}

/// One clock read and one CAS on the thread's own padded word.
fn floor(setup: &Setup) -> Prepared {
    let clock = DefaultClock::new();
    let words: Vec<CachePadded<AtomicU64>> = (0..setup.threads)
        .map(|_| CachePadded::new(AtomicU64::new(0)))
        .collect();
    Prepared::new(setup, move |threads, budget| {
        measure(threads, budget, |thread| {
            let (clock, word) = (&clock, &words[thread]);
            move || {
                let now = clock.now().as_u64();
                let current = word.load(Ordering::Relaxed);
                word.compare_exchange(
                    current,
                    now.max(current + 1),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
            }
        })
    })
}

/// One clock read and a load of one shared word nobody writes.
fn no_write_ceiling(setup: &Setup) -> Prepared {
    let clock = DefaultClock::new();
    let word = CachePadded::new(AtomicU64::new(u64::MAX));
    Prepared::new(setup, move |threads, budget| {
        measure(threads, budget, |_| {
            || {
                let now = clock.now().as_u64();
                now < word.load(Ordering::Acquire)
            }
        })
    })
}

fn fixed_window_textbook(setup: &Setup) -> Prepared {
    textbook_window(
        setup,
        LIMIT,
        TextbookFixedWindow::new,
        TextbookFixedWindow::allow,
    )
}

fn sliding_window_textbook(setup: &Setup) -> Prepared {
    textbook_window(
        setup,
        SLIDING_LIMIT,
        TextbookSlidingWindow::new,
        TextbookSlidingWindow::allow,
    )
}

/// A textbook window of `limit` per second under one mutex (`new` builds it from
/// limit, period and now), asked with `allow` at each clock reading.
fn textbook_window<T: Send + 'static>(
    setup: &Setup,
    limit: u64,
    new: fn(u64, u64, u64) -> T,
    allow: impl Fn(&mut T, u64, u64) -> bool + Sync + 'static,
) -> Prepared {
    let clock = DefaultClock::new();
    let window = Mutex::new(new(limit, 1_000_000_000, clock.now().as_u64()));
    Prepared::new(setup, move |threads, budget| {
        let (clock, window, allow) = (&clock, &window, &allow);
        measure(threads, budget, |_| {
            move || {
                let now = clock.now().as_u64();
                allow(&mut lock(window), now, 1)
            }
        })
    })
}

fn sliding_log_policy() -> Policy {
    Policy::per_second(SLIDING_LIMIT).expect("the benchmark policy is valid")
}

fn sliding_log_floodgate(setup: &Setup) -> Prepared {
    let log = SlidingLog::new(sliding_log_policy());
    Prepared::new(setup, move |threads, budget| {
        measure(threads, budget, |_| || log.check().is_allowed())
    })
}

/// The seed article's log: a `Vec` of timestamps pruned with `retain`, in a mutex.
fn sliding_log_textbook(setup: &Setup) -> Prepared {
    let clock = DefaultClock::new();
    let log = Mutex::new(TextbookSlidingLog::new(
        SLIDING_LIMIT as usize,
        1_000_000_000,
    ));
    Prepared::new(setup, move |threads, budget| {
        let (clock, log) = (&clock, &log);
        measure(threads, budget, |_| {
            move || {
                let now = clock.now().as_u64();
                lock(log).allow(now)
            }
        })
    })
}

/// Runs `check` once on every key (untimed, before any measured run), then prepares
/// runs of it on each thread's keys as `distribution` picks them.
fn keyed_run(
    setup: &Setup,
    distribution: KeyDistribution,
    check: impl Fn(u64) -> bool + Sync + 'static,
) -> Prepared {
    insert_keys(setup, &check);
    keyed_walks_of(setup, distribution, check)
}

/// Checks every key once (untimed), so the timed runs find them in the table.
fn insert_keys(setup: &Setup, check: &(impl Fn(u64) -> bool + Sync)) {
    for key in 0..setup.keys {
        check(key);
    }
}

/// [`keyed_run`] with the keys inserted on a thread of their own, which exits before
/// the timed runs: for the hot-key mode, where a check of a promoted key is a leased
/// decision, and a thread that makes one holds an owner index (one of the key's lease
/// shards) until it exits.
fn keyed_run_inserting_elsewhere(
    setup: &Setup,
    distribution: KeyDistribution,
    check: impl Fn(u64) -> bool + Sync + 'static,
) -> Prepared {
    thread::scope(|scope| {
        scope
            .spawn(|| insert_keys(setup, &check))
            .join()
            .unwrap_or_else(|payload| std::panic::resume_unwind(payload));
    });
    keyed_walks_of(setup, distribution, check)
}

/// The timed walks of [`keyed_run`], keys already inserted.
fn keyed_walks_of(
    setup: &Setup,
    distribution: KeyDistribution,
    check: impl Fn(u64) -> bool + Sync + 'static,
) -> Prepared {
    let keys = setup.keys;
    match distribution {
        KeyDistribution::Uniform => {
            keyed_walks(setup, check, move |thread, _| keys_of(thread, keys))
        }
        KeyDistribution::Zipf => {
            let zipf = ZipfKeys::shared(keys, ZIPF_SEED);
            keyed_walks(setup, check, move |thread, threads| {
                zipf.walk(thread, threads)
            })
        }
        KeyDistribution::Disjoint => keyed_walks(setup, check, move |thread, threads| {
            share_keys_of(thread, threads, keys)
        }),
    }
}

/// Runs of `check` on each thread's keys: `walk(thread, threads)` hands out the
/// thread's keys, one per call (made in the harness's untimed per-thread setup).
fn keyed_walks<W: FnMut() -> u64>(
    setup: &Setup,
    check: impl Fn(u64) -> bool + Sync + 'static,
    walk: impl Fn(usize, usize) -> W + Sync + 'static,
) -> Prepared {
    Prepared::new(setup, move |threads, budget| {
        let (check, walk) = (&check, &walk);
        measure(threads, budget, |thread| {
            let mut next_key = walk(thread, threads);
            move || check(next_key())
        })
    })
}

fn key_policy(booked: bool) -> KeyPolicy {
    if booked {
        KeyPolicy::BookedAhead
    } else {
        KeyPolicy::IdleBetweenVisits
    }
}

/// floodgate's keyed limiter for `u64` keys on storage `S` (the matrix's column:
/// inline, keys in the slots), sized by [`keyed_limiter`].
fn keyed_floodgate<S, const BOOKED: bool, const DIST: usize>(setup: &Setup) -> Prepared
where
    S: Storage<u64, GcraState> + 'static,
{
    let keyed = keyed_limiter::<u64, S>(setup, BOOKED);
    keyed_run(setup, KeyDistribution::ALL[DIST], move |key| {
        keyed.check(&key).is_allowed()
    })
}

/// floodgate's keyed limiter for keys `K` on storage `S`, sized as the README tells
/// users to size it: capacity = the number of keys (a table holds its capacity without
/// reclaiming or evicting any).
fn keyed_limiter<K, S>(setup: &Setup, booked: bool) -> KeyedLimiter<K, Gcra, DefaultClock, S>
where
    K: 'static,
    S: Storage<K, GcraState>,
{
    KeyedBuilder::new(Gcra::new(key_policy(booked).policy()))
        .capacity(setup.keys.max(1) as usize)
        .hash_seed(setup.seed)
        .build_in::<K, S>()
        .expect("the benchmark capacity is valid")
}

/// [`keyed_floodgate`] with `String` keys (key `n` is `"user:{n}"`, made before the
/// run): the decision's closure looks the string up by its number in a vector (a bounds
/// check and two loads) and checks it as a `&str`.
fn keyed_floodgate_string<S, const BOOKED: bool, const DIST: usize>(setup: &Setup) -> Prepared
where
    S: Storage<String, GcraState> + 'static,
{
    let keyed = keyed_limiter::<String, S>(setup, BOOKED);
    let names: Vec<String> = (0..setup.keys.max(1))
        .map(|n| format!("user:{n}"))
        .collect();
    keyed_run(setup, KeyDistribution::ALL[DIST], move |key| {
        keyed.check(names[key as usize].as_str()).is_allowed()
    })
}

/// One shard of the keyed mutex twin, alone on its cache lines.
type TwinShard = CachePadded<Mutex<HashMap<u64, GcraState, ahash::RandomState>>>;

/// The keyed mutex twin: GCRA's transition over per-key states in [`TWIN_SHARDS`]
/// ahash maps, one mutex per shard (the shard from the key's high hash bits).
fn keyed_twin<const BOOKED: bool, const DIST: usize>(setup: &Setup) -> Prepared {
    let gcra = Gcra::new(key_policy(BOOKED).policy());
    let fresh = AtomicCell::<GcraState>::fresh().load();
    let clock = DefaultClock::new();
    let shards: Vec<TwinShard> = (0..TWIN_SHARDS)
        .map(|n| CachePadded::new(Mutex::new(HashMap::with_hasher(setup.hasher(1 + n as u64)))))
        .collect();
    let hasher = setup.hasher(0);
    keyed_run(setup, KeyDistribution::ALL[DIST], move |key| {
        let now = clock.now();
        let shard = (hasher.hash_one(key) >> (64 - TWIN_SHARDS.trailing_zeros())) as usize;
        let mut states = lock(&shards[shard]);
        let state = states.entry(key).or_insert(fresh);
        let (decision, next) = gcra.decide(*state, now, 1);
        if let Some(next) = next {
            *state = next;
        }
        decision.is_allowed()
    })
}

/// The textbook keyed limiter: one map of `f64` buckets under one mutex.
fn keyed_textbook<const BOOKED: bool, const DIST: usize>(setup: &Setup) -> Prepared {
    let policy = key_policy(BOOKED).policy();
    let clock = DefaultClock::new();
    let buckets: Mutex<HashMap<u64, TextbookTokenBucket, ahash::RandomState>> =
        Mutex::new(HashMap::with_hasher(setup.hasher(0)));
    keyed_run(setup, KeyDistribution::ALL[DIST], move |key| {
        let now = clock.now().as_u64();
        lock(&buckets)
            .entry(key)
            .or_insert_with(|| {
                TextbookTokenBucket::new(
                    policy.burst() as f64,
                    policy.limit() as f64,
                    std::time::Duration::from_secs(1),
                    now,
                )
            })
            .allow(now, 1.0)
    })
}

/// governor's keyed limiter on its `DashMap` store, hashed with ahash.
#[cfg(feature = "compare")]
fn keyed_governor<const BOOKED: bool, const DIST: usize>(setup: &Setup) -> Prepared {
    let limiter =
        governor::RateLimiter::dashmap_with_hasher(key_policy(BOOKED).quota(), setup.hasher(0));
    keyed_run(setup, KeyDistribution::ALL[DIST], move |key| {
        limiter.check_key(&key).is_ok()
    })
}

/// GCRA on a `DashMap<u64, AtomicU64>`: a shard read lock, then a CAS on the key's word.
fn keyed_dashmap<const BOOKED: bool, const DIST: usize>(setup: &Setup) -> Prepared {
    let gcra = Gcra::new(key_policy(BOOKED).policy());
    let clock = DefaultClock::new();
    let map: DashMap<u64, AtomicU64, ahash::RandomState> = DashMap::with_hasher(setup.hasher(0));
    keyed_run(setup, KeyDistribution::ALL[DIST], move |key| {
        let now = clock.now();
        let word = match map.get(&key) {
            Some(word) => word,
            None => map
                .entry(key)
                .or_insert_with(|| AtomicU64::new(0))
                .downgrade(),
        };
        gcra_on_word(&gcra, &word, now)
    })
}

/// GCRA on a `papaya::HashMap<u64, AtomicU64>` sized for the keys: a lock-free
/// lookup under papaya's guard, then a CAS on the key's word (an insert only for a
/// new key). Unbounded: nothing ever removes a key.
fn keyed_papaya<const BOOKED: bool, const DIST: usize>(setup: &Setup) -> Prepared {
    let gcra = Gcra::new(key_policy(BOOKED).policy());
    let clock = DefaultClock::new();
    let map: papaya::HashMap<u64, AtomicU64, ahash::RandomState> = papaya::HashMap::builder()
        .capacity(setup.keys.max(1) as usize)
        .hasher(setup.hasher(0))
        .build();
    keyed_run(setup, KeyDistribution::ALL[DIST], move |key| {
        let now = clock.now();
        let map = map.pin();
        let word = match map.get(&key) {
            Some(word) => word,
            None => map.get_or_insert_with(key, || AtomicU64::new(0)),
        };
        gcra_on_word(&gcra, word, now)
    })
}

/// The floor of a keyed table: the GCRA step on the key's own word in an array the
/// key indexes (a perfect hash, which no table for unknown keys has): a clock read,
/// one access at the key's address and one CAS. Each word takes 16 bytes, the
/// footprint of a 64-bit key beside its state, so that at 10^6 keys the access misses
/// memory as a table's does; what a table costs beyond this is its lookup.
fn keyed_floor<const BOOKED: bool, const DIST: usize>(setup: &Setup) -> Prepared {
    /// A state word in a 64-bit key's and its state's 16 bytes.
    #[repr(align(16))]
    struct KeyWord(AtomicU64);
    let gcra = Gcra::new(key_policy(BOOKED).policy());
    let clock = DefaultClock::new();
    let words: Vec<KeyWord> = (0..setup.keys.max(1))
        .map(|_| KeyWord(AtomicU64::new(0)))
        .collect();
    keyed_run(setup, KeyDistribution::ALL[DIST], move |key| {
        let now = clock.now();
        gcra_on_word(&gcra, &words[key as usize].0, now)
    })
}

/// The GCRA step on a bare `AtomicU64` holding the TAT: decide, then CAS (retried on
/// a race), as a hand-rolled keyed limiter does it.
#[inline(always)]
fn gcra_on_word(gcra: &Gcra, word: &AtomicU64, now: floodgate::Nanos) -> bool {
    let mut current = word.load(Ordering::Relaxed);
    loop {
        let state = GcraState::from_tat(floodgate::Nanos::new(current));
        let (decision, next) = gcra.decide(state, now, 1);
        let Some(next) = next else {
            return decision.is_allowed();
        };
        match word.compare_exchange_weak(
            current,
            next.tat().as_u64(),
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => return decision.is_allowed(),
            Err(actual) => current = actual,
        }
    }
}

/// One clock source: a reading in nanoseconds from some origin (never 0).
pub type ClockRead = Box<dyn Fn() -> u64 + Send + Sync>;

/// Clock sources the `clock` criterion group compares: what one reading costs.
///
/// # Examples
///
/// ```
/// for (name, read) in floodgate_bench::matrix::clock_reads() {
///     assert!(read() > 0, "{name}");
/// }
/// ```
pub fn clock_reads() -> Vec<(&'static str, ClockRead)> {
    let floodgate = DefaultClock::new();
    let quanta = quanta::Clock::new();
    let origin = Instant::now();
    vec![
        (
            "floodgate_default",
            Box::new(move || floodgate.now().as_u64()),
        ),
        ("quanta_now", {
            let start = quanta.now();
            Box::new(move || quanta.now().duration_since(start).as_nanos() as u64 + 1)
        }),
        ("quanta_raw", {
            let quanta = quanta::Clock::new();
            Box::new(move || quanta.raw())
        }),
        (
            "std_instant",
            Box::new(move || origin.elapsed().as_nanos() as u64 + 1),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_workload_policies_are_valid_and_fit_governor() {
        let policy = gcra_policy();
        assert_eq!((policy.limit(), policy.burst()), (LIMIT, BURST));
        assert!(u32::try_from(LIMIT).is_ok() && u32::try_from(BURST).is_ok());
        for p in [KeyPolicy::BookedAhead, KeyPolicy::IdleBetweenVisits] {
            let policy = p.policy();
            assert!(u32::try_from(policy.limit()).is_ok() && u32::try_from(policy.burst()).is_ok());
        }
    }

    #[test]
    fn every_contender_runs_and_admits() {
        for group in groups() {
            for contender in &group.contenders {
                for &keys in &group.key_counts {
                    for budget in [
                        Budget::Ops(3_000),
                        Budget::Time {
                            warm_up: Duration::from_millis(1),
                            run: Duration::from_millis(3),
                        },
                    ] {
                        let setup = Setup {
                            threads: 2,
                            keys: keys.min(1_000),
                            budget,
                            seed: 0,
                        };
                        let sample = contender.measure(&setup);
                        assert!(
                            sample.ops > 0,
                            "{} {:?}",
                            group.id,
                            contender.implementation
                        );
                        if group.id == "gcra-deny" {
                            // One unit per hour: only the limiter's first decision admits.
                            assert!(
                                sample.admitted <= 1,
                                "{:?}: {sample:?}",
                                contender.implementation
                            );
                        }
                        if !group.workload.contains("every decision admits") {
                            continue;
                        }
                        // A rate far above the achievable one: (nearly) everything admits.
                        assert!(
                            sample.admitted * 10 >= sample.ops * 9,
                            "{} {:?}: {sample:?}",
                            group.id,
                            contender.implementation
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn every_keyed_group_comes_uniform_zipf_and_disjoint_with_the_same_contenders() {
        let matrix = groups();
        let columns = |id: &str| -> Vec<Implementation> {
            let group = matrix.iter().find(|g| g.id == id).expect(id);
            assert_eq!(group.suite, Suite::Keyed, "{id}");
            group.contenders.iter().map(|c| c.implementation).collect()
        };
        for policy in ["booked", "idle"] {
            let uniform = columns(&format!("gcra-keyed-{policy}"));
            assert_eq!(uniform, columns(&format!("gcra-keyed-{policy}-zipf")));
            assert!(uniform.contains(&Implementation::PapayaAnchor));
            assert!(uniform.contains(&Implementation::DashmapAnchor));
            assert_eq!(
                uniform.contains(&Implementation::Governor),
                cfg!(feature = "compare")
            );
        }
        // The idle policy also runs each thread on its own keys.
        assert_eq!(
            columns("gcra-keyed-idle"),
            columns("gcra-keyed-idle-disjoint")
        );
        // The four policy × distribution groups, the disjoint one and the one-key group.
        assert_eq!(matrix.iter().filter(|g| g.suite == Suite::Keyed).count(), 6);
        let zipf = matrix.iter().find(|g| g.id == "gcra-keyed-idle-zipf");
        assert!(zipf.is_some_and(|g| g.workload.contains("Zipf")));
        let disjoint = matrix.iter().find(|g| g.id == "gcra-keyed-idle-disjoint");
        assert!(disjoint.is_some_and(|g| g.workload.contains("own share")));
        // It runs when named; every other group is part of the main job.
        for group in &matrix {
            assert_eq!(
                group.main_job,
                group.id != "gcra-keyed-idle-disjoint",
                "{}",
                group.id
            );
        }
    }

    #[test]
    fn a_disjoint_run_keeps_each_thread_on_its_own_share() {
        // A table that records which thread visited each key: no key is visited by
        // two threads, and together they visit every key.
        let visits = std::sync::Arc::new(Mutex::new(HashMap::<u64, std::thread::ThreadId>::new()));
        let record = std::sync::Arc::clone(&visits);
        let shared = std::sync::Arc::new(AtomicU64::new(0));
        let shared_in = std::sync::Arc::clone(&shared);
        let setup = Setup {
            threads: 2,
            keys: 100,
            budget: Budget::Ops(0),
            seed: 0,
        };
        let mut prepared = keyed_run(&setup, KeyDistribution::Disjoint, move |key| {
            let me = std::thread::current().id();
            if *lock(&record).entry(key).or_insert(me) != me {
                shared_in.fetch_add(1, Ordering::Relaxed);
            }
            true
        });
        // The untimed insertion ran on this thread: start the record afresh.
        lock(&visits).clear();
        assert_eq!(prepared.run(Budget::Ops(1_000)).admitted, 2_000);
        assert_eq!(
            shared.load(Ordering::Relaxed),
            0,
            "a key visited by both threads"
        );
        assert_eq!(lock(&visits).len(), 100, "every key visited");
    }

    #[test]
    fn the_one_key_group_runs_the_hot_key_mode_and_admits_nearly_every_decision() {
        let matrix = groups();
        let hot = matrix
            .iter()
            .find(|g| g.id == "gcra-keyed-hot")
            .expect("the one-key group");
        assert_eq!(hot.key_counts, [1]);
        let setup = Setup {
            threads: 2,
            keys: 1,
            budget: Budget::Ops(20_000),
            seed: 0,
        };
        for implementation in [Implementation::Floodgate, Implementation::Leased] {
            let contender = hot
                .contenders
                .iter()
                .find(|c| c.implementation == implementation)
                .expect("a column");
            let m = contender.measure(&setup);
            assert_eq!(m.ops, 40_000, "{implementation:?}");
            // Most admit; a reading of one core's clock behind another's can meet a
            // schedule booked past it (a burst of 1000 at 10^9 per second is 1 µs).
            assert!(m.admitted > m.ops / 2, "{implementation:?}: {m:?}");
        }
    }

    #[test]
    fn a_zipf_run_visits_the_keys_of_the_shared_sequence() {
        // A table that records its keys: the run visits exactly the sequence's keys,
        // each thread from its own starting point.
        let visited = std::sync::Arc::new(Mutex::new(Vec::new()));
        let record = std::sync::Arc::clone(&visited);
        let setup = Setup {
            threads: 2,
            keys: 500,
            budget: Budget::Ops(100),
            seed: 0,
        };
        let mut prepared = keyed_run(&setup, KeyDistribution::Zipf, move |key| {
            lock(&record).push(key);
            true
        });
        let inserted: Vec<u64> = std::mem::take(&mut *lock(&visited));
        assert!(
            inserted.iter().copied().eq(0..500),
            "every key inserted first"
        );
        assert_eq!(prepared.run(setup.budget).admitted, 200);
        let keys = ZipfKeys::new(500, ZIPF_SEED);
        let mut expected: Vec<u64> = (0..2)
            .flat_map(|thread| {
                let mut walk = keys.walk(thread, 2);
                (0..100).map(move |_| walk()).collect::<Vec<_>>()
            })
            .collect();
        let mut seen = lock(&visited).clone();
        expected.sort_unstable();
        seen.sort_unstable();
        assert_eq!(seen, expected);
    }

    #[test]
    fn keyed_tables_cover_each_storage_and_every_other_keyed_column() {
        let ids: Vec<&str> = keyed_tables().iter().map(|t| t.id).collect();
        let mut expected = vec![
            "floodgate_heap",
            "floodgate_inline",
            "floodgate_fingerprint",
            "mutex_twin",
            "textbook",
        ];
        if cfg!(feature = "compare") {
            expected.push("governor");
        }
        expected.extend(["dashmap_anchor", "papaya_anchor", "floor"]);
        assert_eq!(ids, expected);
        for table in keyed_tables() {
            let setup = Setup {
                threads: 1,
                keys: 50,
                budget: Budget::Ops(10),
                seed: 0,
            };
            assert_eq!(
                (table.build)(&setup).run(setup.budget).admitted,
                10,
                "{}",
                table.id
            );
        }
    }

    #[test]
    fn every_group_has_floodgate_first_and_distinct_columns() {
        for group in groups() {
            assert_eq!(
                group.contenders[0].implementation,
                Implementation::Floodgate
            );
            let mut seen: Vec<_> = group.contenders.iter().map(|c| c.implementation).collect();
            seen.dedup();
            assert_eq!(seen.len(), group.contenders.len(), "{}", group.id);
        }
    }
}
