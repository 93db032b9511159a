//! [`KeyedLimiter`]: one limiter type over every storage, its builder, metrics and
//! errors. Every feature is written here once, over [`KeyTable`].

use core::fmt;
use core::marker::PhantomData;

use crossbeam_utils::CachePadded;

use super::key::Lookup;
use super::log::{worst_case_bytes, KeyedSlidingLog};
use super::storage::{
    shard_size, Fingerprint, Heap, Inline, KeyTable, KeyedCharge, Storage, TableCounts,
};
use crate::algorithm::Algorithm;
use crate::clock::{Clock, DefaultClock, Nanos};
use crate::decision::Decision;
use crate::gcra::{Gcra, GcraState};
use crate::limiter::Booking;
use crate::policy::Policy;
use crate::receipt::{Owner, Receipt};
use crate::shaping::{ReservationPeek, Reserve, ShapeError};
use crate::sync::{stripe_index, stripe_index_as_is, AtomicU64, Ordering};

/// The key capacity when none is set: 100 000 keys (≈ 3.8 MB for `u64` keys).
pub const DEFAULT_CAPACITY: usize = 100_000;

/// The largest key capacity accepted: 2^32 keys (its slot array alone takes
/// ≈ 91.6 GB, so it also needs a [`memory_budget`](KeyedBuilder::memory_budget)
/// that large).
pub const MAX_CAPACITY: usize = 1 << 32;

/// The slot-array budget when none is set: 4 GiB, enough for ≈ 200 million keys of
/// capacity (see [`KeyedBuilder::memory_budget`]).
pub const DEFAULT_MEMORY_BUDGET: usize = 4 << 30;

/// Bytes of one slot, in every storage: the heap table's (tag, entry pointer) and
/// the inline table's 128-bit (key, state) word.
const SLOT_BYTES: usize = 16;

/// Keys per shard below which no more shards are added.
const MIN_KEYS_PER_SHARD: usize = 64;

/// A rate limiter with one state per key, in bounded memory.
///
/// `K` is the key, `A` the [`Algorithm`] every key runs, `C` the clock and `S` the
/// storage: [`Heap`] (default, any `Hash + Eq` key), [`Inline`] (keys that encode
/// into 64 bits, beside their state) or [`Fingerprint`] (opt-in, any `Hash` key as a
/// 64-bit hash). Every method works on every storage. See the
/// [module docs](super) for the table design, reclamation, eviction and brute-force
/// protection.
///
/// # Examples
///
/// ```
/// use floodgate::{KeyedLimiter, ManualClock, Policy};
///
/// let clock = ManualClock::new();
/// let per_ip = floodgate::KeyedBuilder::new(floodgate::Gcra::new(Policy::per_second(2)?))
///     .capacity(10_000)
///     .clock(clock)
///     .build::<&str>()?;
/// assert!(per_ip.check(&"10.0.0.1").is_allowed());
/// assert!(per_ip.check(&"10.0.0.1").is_allowed());
/// assert!(!per_ip.check(&"10.0.0.1").is_allowed());
/// assert!(per_ip.check(&"10.0.0.2").is_allowed()); // its own budget
/// assert_eq!(per_ip.metrics().live_keys, 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct KeyedLimiter<K, A = Gcra, C = DefaultClock, S = Heap>
where
    A: Algorithm,
    S: Storage<K, A::State>,
{
    capacity: usize,
    algorithm: A,
    clock: C,
    table: S::Table,
    stripes: Stripes,
    /// The id its receipts carry.
    owner: Owner,
    _key: PhantomData<fn(&K)>,
}

/// Per-thread decision counters (one cache line each). `repr(C)`, denials first: the
/// counter of a decision is at `allowed as usize` words from the start, one
/// instruction from the flag.
#[repr(C)]
struct Stripe {
    denied: AtomicU64,
    allowed: AtomicU64,
}

/// Decision counters striped by thread (see [`KeyedMetrics`]): stripe `i` belongs
/// to the live thread holding stripe index `i` ([`stripe_index`]: no two live threads
/// hold one, and an exited thread's index goes to the next thread under a mutex that
/// orders the old owner's last store before the new owner's first load), which
/// writes it with a plain load and store; a thread whose index is past the stripes
/// (or that has none, in its thread-local teardown) counts in `shared` with an
/// atomic add. So no increment is ever lost.
pub(crate) struct Stripes {
    owned: Box<[CachePadded<Stripe>]>,
    shared: CachePadded<Stripe>,
}

impl Stripe {
    fn new() -> Self {
        Stripe {
            allowed: AtomicU64::new(0),
            denied: AtomicU64::new(0),
        }
    }

    #[inline(always)]
    fn counter(&self, allowed: bool) -> &AtomicU64 {
        if allowed {
            &self.allowed
        } else {
            &self.denied
        }
    }
}

impl Stripes {
    /// 2 × `shards` stripes, rounded up to a power of two.
    fn new(shards: usize) -> Self {
        Stripes {
            owned: (0..(2 * shards).next_power_of_two())
                .map(|_| CachePadded::new(Stripe::new()))
                .collect(),
            shared: CachePadded::new(Stripe::new()),
        }
    }

    #[inline(always)]
    fn count(&self, allowed: bool) {
        // A thread that has not asked for an index yet reads as past the stripes too:
        // one comparison here, the rest in `count_past`.
        match self.owned.get(stripe_index_as_is()) {
            Some(stripe) => Stripes::count_owned(stripe, allowed),
            None => self.count_past(allowed),
        }
    }

    /// Counts in this thread's own stripe.
    #[inline(always)]
    fn count_owned(stripe: &Stripe, allowed: bool) {
        // A load and a store, not an RMW: only this thread writes the stripe.
        let counter = stripe.counter(allowed);
        counter.store(
            counter.load(Ordering::Relaxed).wrapping_add(1),
            Ordering::Relaxed,
        );
    }

    /// [`count`](Stripes::count) for a thread whose index, as it stands, is past the
    /// stripes: it takes one if it has none yet, and counts in `shared` if that is
    /// past them too.
    #[cold]
    #[inline(never)]
    fn count_past(&self, allowed: bool) {
        match self.owned.get(stripe_index()) {
            Some(stripe) => Stripes::count_owned(stripe, allowed),
            None => {
                self.shared.counter(allowed).fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The metrics: these decision counts and the table's key counts.
    fn metrics(&self, counts: TableCounts) -> KeyedMetrics {
        let mut m = KeyedMetrics::default();
        for stripe in self.owned.iter().chain([&self.shared]) {
            // Relaxed: statistics.
            m.allowed += stripe.allowed.load(Ordering::Relaxed);
            m.denied += stripe.denied.load(Ordering::Relaxed);
        }
        m.live_keys = counts.live;
        m.reclaimed = counts.reclaimed;
        m.evicted = counts.evicted;
        m.removed = counts.removed;
        m
    }
}

/// A snapshot of a [`KeyedLimiter`]'s counters.
///
/// `allowed` and `denied` are kept per thread stripe and summed when read, and they
/// are exact: every decision is counted once. Each of the first 2 × the shard count
/// live threads that decide writes only its own cache line, with a plain load +
/// store rather than an atomic read-modify-write; threads beyond them share one
/// more stripe and add to it atomically. The key counts are exact too (written by
/// the write path under its shard lock).
///
/// # Examples
///
/// ```
/// use floodgate::{KeyedLimiter, ManualClock, Policy};
/// let keyed = floodgate::KeyedBuilder::new(floodgate::Gcra::new(Policy::per_second(1)?))
///     .clock(ManualClock::new())
///     .build::<u64>()?;
/// let _ = keyed.check(&1u64);
/// let _ = keyed.check(&1u64);
/// let m = keyed.metrics();
/// assert_eq!((m.allowed, m.denied, m.live_keys), (1, 1, 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyedMetrics {
    /// Checks admitted.
    pub allowed: u64,
    /// Checks denied.
    pub denied: u64,
    /// Keys in the table now.
    pub live_keys: u64,
    /// Idle keys dropped (lossless).
    pub reclaimed: u64,
    /// Live keys evicted because the table was full (their state was lost).
    pub evicted: u64,
    /// Keys removed by [`KeyedLimiter::remove`] or [`KeyedLimiter::reset`].
    pub removed: u64,
}

/// Why a [`KeyedBuilder`] could not build.
///
/// # Examples
///
/// ```
/// use floodgate::{KeyedError, KeyedLimiter, Policy};
/// let err = floodgate::KeyedBuilder::new(floodgate::Gcra::new(Policy::per_second(1)?))
///     .capacity(0)
///     .build::<u64>()
///     .unwrap_err();
/// assert_eq!(err, KeyedError::ZeroCapacity);
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyedError {
    /// The key capacity was 0: set at least 1.
    ZeroCapacity,
    /// The key capacity exceeds [`MAX_CAPACITY`].
    CapacityTooLarge {
        /// The capacity asked for.
        requested: usize,
    },
    /// The shard count was 0: set at least 1 (it is rounded up to a power of two).
    ZeroShards,
    /// The slot array for this capacity would take more bytes than the memory budget
    /// ([`KeyedBuilder::memory_budget`]). Nothing was allocated: lower the capacity or
    /// raise the budget.
    OverMemoryBudget {
        /// The capacity asked for.
        capacity: usize,
        /// The bytes its slot arrays would take (a plan limiter's: one per plan).
        slot_bytes: usize,
        /// The budget, in bytes.
        budget: usize,
    },
}

impl fmt::Display for KeyedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyedError::ZeroCapacity => f.write_str("key capacity must be at least 1"),
            KeyedError::CapacityTooLarge { requested } => write!(
                f,
                "key capacity {requested} exceeds the maximum of {MAX_CAPACITY}"
            ),
            KeyedError::ZeroShards => f.write_str("shard count must be at least 1"),
            KeyedError::OverMemoryBudget {
                capacity,
                slot_bytes,
                budget,
            } => write!(
                f,
                "a key capacity of {capacity} needs {slot_bytes} bytes of slots, over the \
                 memory budget of {budget} bytes"
            ),
        }
    }
}

impl std::error::Error for KeyedError {}

/// Configures a [`KeyedLimiter`]: capacity, shard count, memory budget, clock, and
/// (by the build method) the storage.
///
/// The clock is made when the limiter is built: without a
/// [`clock`](KeyedBuilder::clock) of your own, `build` makes the [`DefaultClock`]
/// (which calibrates the TSC once per process); with one, the TSC is never touched
/// (so a [`ManualClock`](crate::ManualClock) builder works under Miri and loom).
///
/// # Examples
///
/// ```
/// use floodgate::{KeyedLimiter, Policy, StdClock};
/// let keyed: KeyedLimiter<String, _, _> = floodgate::KeyedBuilder::new(floodgate::Gcra::new(Policy::per_minute(60)?))
///     .capacity(1_000)
///     .shards(4)
///     .clock(StdClock::new())
///     .build()?;
/// assert_eq!(keyed.capacity(), 1_000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct KeyedBuilder<A, C = DefaultClock> {
    algorithm: A,
    clock: ClockChoice<C>,
    capacity: usize,
    shards: Option<usize>,
    memory_budget: usize,
    hash_seed: Option<u64>,
}

/// The clock a builder will hand its limiter: one given, or a constructor run at
/// build time (the default clock calibrates the TSC: not before it is needed).
#[derive(Clone, Debug)]
enum ClockChoice<C> {
    Given(C),
    Deferred(fn() -> C),
}

impl<C> ClockChoice<C> {
    fn make(self) -> C {
        match self {
            ClockChoice::Given(clock) => clock,
            ClockChoice::Deferred(make) => make(),
        }
    }
}

/// A builder with no algorithm yet, for limiters that bring their own
/// ([`PlanLimiter`](crate::keyed::plans::PlanLimiter) runs each key's plan): the
/// table's capacity, shards, memory budget and clock.
///
/// # Examples
///
/// ```
/// use floodgate::keyed::plans::{PlanLimiter, Plans};
/// use floodgate::{KeyedBuilder, ManualClock};
/// let plans = Plans::classic();
/// let free = plans.id("free").unwrap();
/// let table = KeyedBuilder::default().capacity(1_000).clock(ManualClock::new());
/// let limiter = PlanLimiter::new(&plans, move |_: &u64| free, table)?;
/// assert_eq!(limiter.check(&1).limit(), 10);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
impl Default for KeyedBuilder<()> {
    fn default() -> Self {
        KeyedBuilder::new(())
    }
}

impl<C> KeyedBuilder<(), C> {
    /// Builds the exact sliding log per key ([`KeyedSlidingLog`]) for `policy`
    /// (`limit` per `period`; `burst` is not used) with this builder's capacity,
    /// shards and clock.
    ///
    /// # Errors
    ///
    /// [`KeyedError`] for a zero or too large capacity, zero shards, or a worst case
    /// (every key holding a full log) over the
    /// [`memory_budget`](KeyedBuilder::memory_budget).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedBuilder, KeyedError, Policy};
    /// let log = KeyedBuilder::default().capacity(1_000).sliding_log::<u64>(Policy::per_second(10)?)?;
    /// assert!(log.check_n(&1, 10).is_allowed());
    /// // A million keys of a million-unit log: terabytes in the worst case.
    /// let err = KeyedBuilder::default()
    ///     .capacity(1_000_000)
    ///     .sliding_log::<u64>(Policy::per_minute(1_000_000)?)
    ///     .unwrap_err();
    /// assert!(matches!(err, KeyedError::OverMemoryBudget { .. }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sliding_log<K>(self, policy: Policy) -> Result<KeyedSlidingLog<K, C>, KeyedError>
    where
        K: core::hash::Hash + Eq + Clone,
        C: Clock,
    {
        let wanted = self.validate_shape()?;
        let (capacity, shards) = self.layout(wanted);
        let (share, _) = shard_size(capacity, shards);
        let bytes = worst_case_bytes::<K>(share, shards, policy).unwrap_or(usize::MAX);
        if bytes > self.memory_budget {
            return Err(KeyedError::OverMemoryBudget {
                capacity: self.capacity,
                slot_bytes: bytes,
                budget: self.memory_budget,
            });
        }
        Ok(KeyedSlidingLog::assemble(
            self.clock.make(),
            policy,
            capacity,
            shards,
            share,
            self.memory_budget,
            self.hash_seed,
        ))
    }
}

impl<A> KeyedBuilder<A> {
    /// Starts configuring a keyed limiter running `algorithm` for every key.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedLimiter, Policy, TokenBucket};
    /// use std::time::Duration;
    /// let bucket = TokenBucket::new(10, 1, Duration::from_millis(100))?;
    /// let keyed: KeyedLimiter<u64, _> = floodgate::KeyedBuilder::new(bucket).capacity(1_000).build()?;
    /// assert!(keyed.check_n(&7, 10).is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(algorithm: A) -> KeyedBuilder<A> {
        KeyedBuilder {
            algorithm,
            clock: ClockChoice::Deferred(DefaultClock::new),
            capacity: DEFAULT_CAPACITY,
            shards: None,
            memory_budget: DEFAULT_MEMORY_BUDGET,
            hash_seed: None,
        }
    }
}

impl<A, C> KeyedBuilder<A, C> {
    /// This builder with its clock made now (a deferred default clock is calibrated
    /// here), so that every limiter built from its clones shares one clock.
    pub(crate) fn settle_clock(self) -> Self {
        KeyedBuilder {
            clock: ClockChoice::Given(self.clock.make()),
            ..self
        }
    }

    /// The most keys held at once (default [`DEFAULT_CAPACITY`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let b = floodgate::KeyedBuilder::new(floodgate::Gcra::new(floodgate::Policy::per_second(1)?));
    /// assert_eq!(b.capacity(64).build::<u64>()?.capacity(), 64);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn capacity(mut self, keys: usize) -> Self {
        self.capacity = keys;
        self
    }

    /// The number of shards, rounded up to a power of two and down to at most one
    /// per key of capacity and at most 65 536 (default: 4 × `available_parallelism()`,
    /// at most one per 64 keys).
    ///
    /// # Examples
    ///
    /// ```
    /// let b = floodgate::KeyedBuilder::new(floodgate::Gcra::new(floodgate::Policy::per_second(1)?));
    /// assert_eq!(b.shards(3).build::<u64>()?.shards(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// The most bytes the slot array may take (default [`DEFAULT_MEMORY_BUDGET`],
    /// 4 GiB); a build whose slot array would take more returns
    /// [`KeyedError::OverMemoryBudget`] without allocating.
    ///
    /// # What a capacity costs
    ///
    /// Both tables allocate their whole slot array at build: 16 bytes per slot, with
    /// `capacity / shards` keys per shard (plus a slack for uneven hashing when there
    /// is more than one shard: 2.2 % at 125 000 keys per shard) at a load factor of
    /// 3/4 — ≈ 21.8 bytes per key of capacity at 10^6 keys over 8 shards
    /// ([`slot_bytes`](KeyedBuilder::slot_bytes) gives the exact number). Each shard
    /// also takes a fixed part beside its slots (its lock, counters and its record of
    /// the latest refunds: a few hundred bytes, under 1 KiB), not counted in the budget.
    ///
    /// * [`Inline`] and [`Fingerprint`] storage: the slot array is all its key memory.
    /// * [`Heap`] storage: each live key also takes a heap entry (the key and its state
    ///   word, plus allocator overhead), allocated as keys arrive and not counted in the
    ///   budget: at most [`max_keys`](KeyedLimiter::max_keys) of them, each with the
    ///   heap memory its key owns (a `String`'s bytes): bound keys' lengths where they
    ///   come from (floodgate-http's extractors do: 256 bytes for a header, 1 KiB for a
    ///   path).
    ///
    /// A [`PlanLimiter`](crate::keyed::plans::PlanLimiter) builds one table per plan
    /// from one builder: the budget bounds their slot arrays together.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Gcra, KeyedBuilder, KeyedError, Policy};
    /// let b = KeyedBuilder::new(Gcra::new(Policy::per_second(1)?)).capacity(750).shards(1);
    /// assert_eq!(b.slot_bytes()?, 1_000 * 16);
    /// assert!(b.clone().memory_budget(1_000 * 16).build::<u64>().is_ok());
    /// assert_eq!(
    ///     b.memory_budget(1_000).build_inline::<u64>().unwrap_err(),
    ///     KeyedError::OverMemoryBudget { capacity: 750, slot_bytes: 1_000 * 16, budget: 1_000 }
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn memory_budget(mut self, bytes: usize) -> Self {
        self.memory_budget = bytes;
        self
    }

    /// Hashes keys with seeds derived from `seed`, the same for every table built from
    /// this builder and in every process running the same build, instead of random
    /// seeds drawn per table (the default).
    ///
    /// For reproducible tests and benchmarks: a table's layout — which keys share a
    /// shard and a probe run — then repeats from run to run, as long as the build
    /// (ahash's version and the target features it uses: a `-C target-cpu=native`
    /// build hashes otherwise) and the shard count (by default from the available
    /// parallelism) stay the same. Keep the default in
    /// production: a client who knows the seed can choose keys that crowd one shard
    /// and one probe run. The table stays bounded, but those lookups slow down and
    /// evictions fall on that shard's keys; [`Heap`] and [`Inline`] tables stay
    /// exact, while a [`Fingerprint`] table's fingerprints are then the client's to
    /// search: a key found offline with another key's fingerprint shares its state.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Gcra, KeyedBuilder, Policy};
    /// // The same layout in every run of the benchmark.
    /// let keyed = KeyedBuilder::new(Gcra::new(Policy::per_second(1)?))
    ///     .capacity(10_000)
    ///     .hash_seed(7)
    ///     .build_inline::<u64>()?;
    /// assert!(keyed.check(&1).is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn hash_seed(mut self, seed: u64) -> Self {
        self.hash_seed = Some(seed);
        self
    }

    /// The seed [`hash_seed`](KeyedBuilder::hash_seed) fixed, if any.
    pub(crate) fn seed(&self) -> Option<u64> {
        self.hash_seed
    }

    /// The bytes of the slot array a build would allocate now (the same for both
    /// tables; see [`memory_budget`](KeyedBuilder::memory_budget)). Allocates nothing.
    ///
    /// # Errors
    ///
    /// [`KeyedError`] for a zero or too large capacity, or zero shards (the budget is
    /// not checked).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Gcra, KeyedBuilder, Policy, MAX_CAPACITY};
    /// let b = KeyedBuilder::new(Gcra::new(Policy::per_second(1)?));
    /// // About 91.6 GB for the largest capacity: over the default budget.
    /// let most = b.capacity(MAX_CAPACITY).shards(1).slot_bytes()?;
    /// assert_eq!(most, ((1usize << 32) + (1usize << 32).div_ceil(3)) * 16);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn slot_bytes(&self) -> Result<usize, KeyedError> {
        let wanted = self.validate_shape()?;
        let (capacity, shards) = self.layout(wanted);
        let (_, slots_per_shard) = shard_size(capacity, shards);
        Ok(slots_per_shard
            .saturating_mul(shards)
            .saturating_mul(SLOT_BYTES))
    }

    /// The clock decisions read (default [`DefaultClock`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Clock, ManualClock};
    /// let clock = ManualClock::new();
    /// let keyed = floodgate::KeyedBuilder::new(floodgate::Gcra::new(floodgate::Policy::per_second(1)?))
    ///     .clock(clock.clone())
    ///     .build::<u64>()?;
    /// assert_eq!(keyed.clock().now(), clock.now());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn clock<C2>(self, clock: C2) -> KeyedBuilder<A, C2> {
        KeyedBuilder {
            algorithm: self.algorithm,
            clock: ClockChoice::Given(clock),
            capacity: self.capacity,
            shards: self.shards,
            memory_budget: self.memory_budget,
            hash_seed: self.hash_seed,
        }
    }

    /// The same configuration running `algorithm` instead (plans build their table
    /// this way from [`KeyedBuilder::default`], which has none).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Gcra, KeyedBuilder, Policy};
    /// let keyed = KeyedBuilder::default().capacity(64).algorithm(Gcra::new(Policy::per_second(1)?)).build::<u64>()?;
    /// assert_eq!(keyed.capacity(), 64);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn algorithm<A2>(self, algorithm: A2) -> KeyedBuilder<A2, C> {
        KeyedBuilder {
            algorithm,
            clock: self.clock,
            capacity: self.capacity,
            shards: self.shards,
            memory_budget: self.memory_budget,
            hash_seed: self.hash_seed,
        }
    }

    fn default_shards(&self) -> usize {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        (cores * 4).min((self.capacity / MIN_KEYS_PER_SHARD).max(1))
    }

    /// Builds the limiter, allocating its whole slot array now.
    ///
    /// # Errors
    ///
    /// [`KeyedError`] for a zero or too large capacity, zero shards, or a slot array
    /// over the [`memory_budget`](KeyedBuilder::memory_budget).
    ///
    /// # Examples
    ///
    /// ```
    /// let keyed = floodgate::KeyedBuilder::new(floodgate::Gcra::new(floodgate::Policy::per_second(1)?)).build::<u64>()?;
    /// assert_eq!(keyed.capacity(), floodgate::DEFAULT_CAPACITY);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn build<K>(self) -> Result<KeyedLimiter<K, A, C>, KeyedError>
    where
        A: Algorithm,
        Heap: Storage<K, A::State>,
    {
        self.build_in::<K, Heap>()
    }

    /// Builds a limiter on [`Inline`] storage: keys that encode into 64 bits
    /// ([`InlineKey`](super::InlineKey): integers, `[u8; N ≤ 8]`, IP addresses)
    /// stored beside their state, no heap entry per key.
    ///
    /// # Errors
    ///
    /// As [`build`](KeyedBuilder::build).
    ///
    /// # Examples
    ///
    /// ```
    /// let keyed = floodgate::KeyedBuilder::new(floodgate::Gcra::new(floodgate::Policy::per_second(1)?))
    ///     .capacity(750)
    ///     .shards(1)
    ///     .build_inline::<u64>()?;
    /// assert_eq!(keyed.slot_bytes(), 1_000 * 16);
    /// assert!(keyed.check(&7).is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn build_inline<K>(self) -> Result<KeyedLimiter<K, A, C, Inline>, KeyedError>
    where
        A: Algorithm,
        Inline: Storage<K, A::State>,
    {
        self.build_in::<K, Inline>()
    }

    /// Builds a limiter on [`Fingerprint`] storage: keys of any `Hash` type stand for
    /// their 64-bit keyed hash in an inline slot. Opt-in and **not exact**: see
    /// [`Fingerprint`] for the collision odds.
    ///
    /// # Errors
    ///
    /// As [`build`](KeyedBuilder::build).
    ///
    /// # Examples
    ///
    /// ```
    /// let keyed = floodgate::KeyedBuilder::new(floodgate::Gcra::new(floodgate::Policy::per_hour(1)?))
    ///     .build_fingerprint::<String>()?;
    /// assert!(keyed.check("alice").is_allowed());
    /// assert!(!keyed.check("alice").is_allowed());
    /// assert!(keyed.check("bob").is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn build_fingerprint<K>(self) -> Result<KeyedLimiter<K, A, C, Fingerprint>, KeyedError>
    where
        A: Algorithm,
        Fingerprint: Storage<K, A::State>,
    {
        self.build_in::<K, Fingerprint>()
    }

    /// Builds a limiter on storage `S` ([`Heap`], [`Inline`] or [`Fingerprint`]).
    ///
    /// # Errors
    ///
    /// As [`build`](KeyedBuilder::build).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Gcra, Inline, KeyedBuilder, Policy};
    /// let keyed = KeyedBuilder::new(Gcra::new(Policy::per_second(1)?)).build_in::<u32, Inline>()?;
    /// assert!(keyed.check(&7).is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn build_in<K, S>(self) -> Result<KeyedLimiter<K, A, C, S>, KeyedError>
    where
        A: Algorithm,
        S: Storage<K, A::State>,
    {
        let wanted = self.validate()?;
        Ok(self.assemble(wanted))
    }

    /// The shard count asked for, once capacity, shards and the slot array's size
    /// are known to be valid.
    fn validate(&self) -> Result<usize, KeyedError> {
        self.fits_budget(1)?;
        self.validate_shape()
    }

    /// Whether `tables` slot arrays of this shape fit the memory budget together
    /// (a plan limiter builds one table per plan from one builder).
    pub(crate) fn fits_budget(&self, tables: usize) -> Result<(), KeyedError> {
        let slot_bytes = self.slot_bytes()?.saturating_mul(tables);
        if slot_bytes > self.memory_budget {
            return Err(KeyedError::OverMemoryBudget {
                capacity: self.capacity,
                slot_bytes,
                budget: self.memory_budget,
            });
        }
        Ok(())
    }

    /// The shard count asked for, once capacity and shards are known to be valid.
    fn validate_shape(&self) -> Result<usize, KeyedError> {
        if self.capacity == 0 {
            return Err(KeyedError::ZeroCapacity);
        }
        if self.capacity > MAX_CAPACITY {
            return Err(KeyedError::CapacityTooLarge {
                requested: self.capacity,
            });
        }
        match self.shards {
            Some(0) => Err(KeyedError::ZeroShards),
            Some(n) => Ok(n),
            None => Ok(self.default_shards()),
        }
    }

    /// The capacity and shard count (a power of two in `[1, capacity]`) for `wanted`.
    fn layout(&self, wanted: usize) -> (usize, usize) {
        let capacity = self.capacity.clamp(1, MAX_CAPACITY);
        let shards = wanted
            .clamp(1, 1 << 16)
            .next_power_of_two()
            .min(prev_power_of_two(capacity));
        (capacity, shards)
    }

    /// Builds with `wanted` shards (rounded to a power of two in `[1, capacity]`).
    fn assemble<K, S>(self, wanted: usize) -> KeyedLimiter<K, A, C, S>
    where
        A: Algorithm,
        S: Storage<K, A::State>,
    {
        let (capacity, shards) = self.layout(wanted);
        KeyedLimiter {
            capacity,
            algorithm: self.algorithm,
            clock: self.clock.make(),
            table: S::Table::build(capacity, shards, self.hash_seed),
            stripes: Stripes::new(shards),
            owner: Owner::new(),
            _key: PhantomData,
        }
    }
}

fn prev_power_of_two(n: usize) -> usize {
    if n == 0 {
        0
    } else {
        1 << (usize::BITS - 1 - n.leading_zeros())
    }
}

impl<K> KeyedLimiter<K, Gcra>
where
    Heap: Storage<K, crate::gcra::GcraState>,
{
    /// A GCRA keyed limiter for `policy` with the default capacity and clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedLimiter, Policy};
    /// let keyed = KeyedLimiter::gcra(Policy::per_second(10)?);
    /// assert!(keyed.check(&42u64).is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn gcra(policy: Policy) -> Self {
        let builder = KeyedBuilder::new(Gcra::new(policy));
        let shards = builder.default_shards();
        builder.assemble(shards)
    }
}

impl<K, C> KeyedLimiter<K, Gcra, C>
where
    Heap: Storage<K, crate::gcra::GcraState>,
{
    /// A GCRA keyed limiter for `policy` with the default capacity, on `clock`: the
    /// keyed twin of [`RateLimiter::gcra_with_clock`](crate::RateLimiter::gcra_with_clock)
    /// ([`KeyedBuilder`] sets the capacity and shards too).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedLimiter, ManualClock, Policy};
    /// use std::time::Duration;
    /// let clock = ManualClock::new();
    /// let keyed = KeyedLimiter::gcra_with_clock(Policy::per_second(1)?, clock.clone());
    /// assert!(keyed.check(&42u64).is_allowed());
    /// assert!(!keyed.check(&42u64).is_allowed());
    /// clock.advance(Duration::from_secs(1));
    /// assert!(keyed.check(&42u64).is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn gcra_with_clock(policy: Policy, clock: C) -> Self {
        let builder = KeyedBuilder::new(Gcra::new(policy)).clock(clock);
        let shards = builder.default_shards();
        builder.assemble(shards)
    }
}

impl<K, A, C, S> KeyedLimiter<K, A, C, S>
where
    A: Algorithm,
    C: Clock,
    S: Storage<K, A::State>,
{
    /// Decides one unit for `key` now, consuming it if allowed.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedLimiter, Policy};
    /// let keyed: KeyedLimiter<String> = KeyedLimiter::gcra(Policy::per_hour(1)?);
    /// assert!(keyed.check("alice").is_allowed()); // &str looks up a String key
    /// assert!(!keyed.check("alice").is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    #[inline]
    pub fn check<Q>(&self, key: &Q) -> Decision
    where
        Q: Lookup<K> + ?Sized,
    {
        self.check_n_at(key, self.clock.now(), 1)
    }

    /// Decides `cost` units for `key` now, consuming them if allowed.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedLimiter, Policy};
    /// let keyed = KeyedLimiter::gcra(Policy::per_second(10)?);
    /// assert_eq!(keyed.check_n(&1u64, 4).remaining(), 6);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    #[inline]
    pub fn check_n<Q>(&self, key: &Q, cost: u32) -> Decision
    where
        Q: Lookup<K> + ?Sized,
    {
        self.check_n_at(key, self.clock.now(), cost)
    }

    /// [`check_n`](KeyedLimiter::check_n) at an instant the caller read, from this
    /// limiter's clock: a refund judged at the clock's reading assumes no admission it
    /// sees was decided later (see [`Clock`](crate::Clock)).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedLimiter, Nanos, Policy};
    /// let keyed = KeyedLimiter::gcra(Policy::per_second(1)?);
    /// assert!(keyed.check_n_at(&1u64, Nanos::from_secs(5), 1).is_allowed());
    /// assert!(!keyed.check_n_at(&1u64, Nanos::from_secs(5), 1).is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    #[inline]
    pub fn check_n_at<Q>(&self, key: &Q, now: Nanos, cost: u32) -> Decision
    where
        Q: Lookup<K> + ?Sized,
    {
        self.check_with(&self.algorithm, key, now, cost)
    }

    /// A check with another algorithm over the same state type (plans).
    #[inline]
    pub(crate) fn check_with<Q>(&self, algorithm: &A, key: &Q, now: Nanos, cost: u32) -> Decision
    where
        Q: Lookup<K> + ?Sized,
    {
        let decision: Decision = self.table.decide(algorithm, key, now, cost);
        self.count(decision.is_allowed());
        decision
    }

    /// Decides `cost` units for `key` now like [`check_n`](KeyedLimiter::check_n), and
    /// returns a [`Receipt`] for a later [`refund`](KeyedLimiter::refund): the
    /// charge-first login pattern, composite limits.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedLimiter, Policy};
    /// let keyed: KeyedLimiter<String> = KeyedLimiter::gcra(Policy::per_second(1)?);
    /// let (decision, receipt) = keyed.charge("alice", 1);
    /// assert!(decision.is_allowed());
    /// assert!(keyed.refund("alice", receipt));
    /// assert!(keyed.check("alice").is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    #[inline]
    pub fn charge<Q>(&self, key: &Q, cost: u32) -> (Decision, Receipt)
    where
        Q: Lookup<K> + ?Sized,
    {
        self.charge_at(key, self.clock.now(), cost)
    }

    /// [`charge`](KeyedLimiter::charge) at an instant the caller read.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedLimiter, Nanos, Policy};
    /// let keyed = KeyedLimiter::gcra(Policy::per_second(1)?);
    /// let (decision, receipt) = keyed.charge_at(&1u64, Nanos::from_secs(5), 1);
    /// assert!(decision.is_allowed() && receipt.is_charged());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    #[inline]
    pub fn charge_at<Q>(&self, key: &Q, now: Nanos, cost: u32) -> (Decision, Receipt)
    where
        Q: Lookup<K> + ?Sized,
    {
        self.charge_with(&self.algorithm, key, now, cost)
    }

    /// A charge with another algorithm over the same state type (plans).
    pub(crate) fn charge_with<Q>(
        &self,
        algorithm: &A,
        key: &Q,
        now: Nanos,
        cost: u32,
    ) -> (Decision, Receipt)
    where
        Q: Lookup<K> + ?Sized,
    {
        let c = self
            .table
            .decide::<KeyedCharge<A::State>, Q, A>(algorithm, key, now, cost);
        self.settle(c)
    }

    /// [`charge_at`](KeyedLimiter::charge_at), counted by the caller (a hot-key
    /// limiter counts a check that met a sealed word where it is decided).
    pub(crate) fn charge_uncounted<Q>(&self, key: &Q, now: Nanos, cost: u32) -> (Decision, Receipt)
    where
        Q: Lookup<K> + ?Sized,
    {
        let c = self
            .table
            .decide::<KeyedCharge<A::State>, Q, A>(&self.algorithm, key, now, cost);
        self.receipt_of(c)
    }

    /// Counts a keyed charge's decision and writes its receipt.
    fn settle(&self, c: KeyedCharge<A::State>) -> (Decision, Receipt) {
        self.count(c.decision.is_allowed());
        self.receipt_of(c)
    }

    /// A keyed charge's decision and receipt (not counted).
    fn receipt_of(&self, c: KeyedCharge<A::State>) -> (Decision, Receipt) {
        let charge = c.charge.map(|charge| (charge, c.noted));
        (
            c.decision,
            Receipt::new(self.owner, c.tag, c.generation, charge),
        )
    }

    /// Books `cost` units for `key` at the earliest instant they fit, however far
    /// ahead, for a waiter ([`wait_key`](KeyedLimiter::wait_key),
    /// [`until_key_ready_with`](KeyedLimiter::until_key_ready_with)): the decision
    /// (denied only for "never"), the delay until the booked slot, and the receipt
    /// whose [`refund`](KeyedLimiter::refund) cancels the booking (the part of it the
    /// clock has not reached). `None` when the algorithm cannot book ahead
    /// ([`Algorithm::book`]: GCRA books, the windows do not).
    ///
    /// Bookings of one key are first come, first served: each moves the key's
    /// schedule by its own units in one compare-and-swap. A [`remove`](KeyedLimiter::remove)
    /// or [`reset`](KeyedLimiter::reset) in the key's shard voids the receipt, like any
    /// other.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedLimiter, ManualClock, Nanos, Policy};
    /// use std::time::Duration;
    /// let keyed = floodgate::KeyedBuilder::new(floodgate::Gcra::new(Policy::per_second(2)?.with_burst(1)?))
    ///     .clock(ManualClock::new())
    ///     .build::<String>()?;
    /// let now = Nanos::from_secs(1);
    /// let (first, wait, _) = keyed.book_at("alice", now, 1).unwrap();
    /// assert!(first.is_allowed() && wait.is_zero());
    /// let (_, wait, receipt) = keyed.book_at("alice", now, 1).unwrap();
    /// assert_eq!(wait, Duration::from_millis(500));
    /// assert!(keyed.book_at("bob", now, 1).unwrap().1.is_zero()); // another key's schedule
    /// assert!(keyed.refund("alice", receipt)); // not reached yet: it all comes back
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn book_at<Q>(
        &self,
        key: &Q,
        now: Nanos,
        cost: u32,
    ) -> Option<(Decision, core::time::Duration, Receipt)>
    where
        Q: Lookup<K> + ?Sized,
    {
        let _can_book = self.algorithm.book(bytemuck::Zeroable::zeroed(), now, 0)?;
        let booking = Booking(&self.algorithm);
        let c = self
            .table
            .decide::<KeyedCharge<A::State>, Q, Booking<'_, A>>(&booking, key, now, cost);
        let delay = c
            .charge
            .as_ref()
            .map_or(core::time::Duration::ZERO, |charge| {
                self.algorithm
                    .ready_at(charge)
                    .saturating_since(now)
                    .as_duration()
            });
        let (decision, receipt) = self.settle(c);
        Some((decision, delay, receipt))
    }

    /// Gives back what the charge behind `receipt` still provably holds for `key`
    /// ([`Algorithm::refund`]: never another request's units). Returns whether
    /// anything came back. Nothing comes back for a receipt of another limiter or
    /// another key, a charge that took nothing, or a key whose shard has removed any
    /// key since the charge (the entry may have been re-created: the charge is not in
    /// it). The refund is judged at a clock reading taken after the state is loaded.
    /// Refunds of other keys in the same shard since the charge take nothing from it
    /// as long as the shard has made at most 8 refunds that moved a later booking
    /// since the charge (it remembers its latest 8); past that, every refund in the
    /// shard since the charge counts as if it had moved this key's schedule
    /// (conservative: less comes back). A refund of the key's last booking (nothing
    /// booked after it) moved nothing else and takes nothing from a later refund of
    /// an earlier charge.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedLimiter, Policy};
    /// let keyed: KeyedLimiter<u64> = KeyedLimiter::gcra(Policy::per_second(1)?);
    /// let (_, first) = keyed.charge(&1, 1);
    /// assert!(keyed.refund(&1, first)); // consumed: a charge comes back once
    /// let (_, second) = keyed.charge(&1, 1);
    /// assert!(!keyed.refund(&2, second)); // another key's receipt: nothing
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn refund<Q>(&self, key: &Q, receipt: Receipt) -> bool
    where
        Q: Lookup<K> + ?Sized,
    {
        self.refund_with(&self.algorithm, key, receipt)
    }

    /// A refund with another algorithm over the same state type (plans).
    pub(crate) fn refund_with<Q>(&self, algorithm: &A, key: &Q, receipt: Receipt) -> bool
    where
        Q: Lookup<K> + ?Sized,
    {
        let tag = self.table.tag_of(key);
        let Some(charge) = receipt.charge_for(self.owner, tag) else {
            return false;
        };
        let (generation, noted) = (receipt.generation(), receipt.noted());
        self.table
            .refund(algorithm, key, generation, noted, &charge, &|| {
                self.clock.now()
            })
    }

    /// Exactly what [`check_n(key, cost)`](KeyedLimiter::check_n) would return now;
    /// writes nothing and inserts no key.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedLimiter, Policy};
    /// let keyed: KeyedLimiter<u64> = KeyedLimiter::gcra(Policy::per_second(1)?);
    /// assert!(keyed.peek(&9, 1).is_allowed());
    /// assert_eq!(keyed.metrics().live_keys, 0); // nothing inserted
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    #[inline]
    pub fn peek<Q>(&self, key: &Q, cost: u32) -> Decision
    where
        Q: Lookup<K> + ?Sized,
    {
        self.peek_at(key, self.clock.now(), cost)
    }

    /// [`peek`](KeyedLimiter::peek) at an instant the caller read.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedLimiter, Nanos, Policy};
    /// let keyed = KeyedLimiter::gcra(Policy::per_second(1)?);
    /// let _ = keyed.check_n_at(&1u64, Nanos::from_secs(5), 1);
    /// assert!(!keyed.peek_at(&1u64, Nanos::from_secs(5), 1).is_allowed());
    /// assert!(keyed.peek_at(&1u64, Nanos::from_secs(6), 1).is_allowed());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    #[inline]
    pub fn peek_at<Q>(&self, key: &Q, now: Nanos, cost: u32) -> Decision
    where
        Q: Lookup<K> + ?Sized,
    {
        self.peek_with(&self.algorithm, key, now, cost)
    }

    /// A peek with another algorithm over the same state type (plans).
    #[inline]
    pub(crate) fn peek_with<Q>(&self, algorithm: &A, key: &Q, now: Nanos, cost: u32) -> Decision
    where
        Q: Lookup<K> + ?Sized,
    {
        self.table.peek(algorithm, key, now, cost)
    }

    /// Drops every idle key now and returns how many (never needed for bounded
    /// memory — inserts reclaim on their own — but handy before a snapshot).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedLimiter, ManualClock, Policy};
    /// use std::time::Duration;
    /// let clock = ManualClock::new();
    /// let keyed = floodgate::KeyedBuilder::new(floodgate::Gcra::new(Policy::per_second(1)?)).clock(clock.clone()).build::<u64>()?;
    /// let _ = keyed.check(&1u64);
    /// clock.advance(Duration::from_secs(1));
    /// assert_eq!(keyed.reclaim_idle(), 1);
    /// assert_eq!(keyed.metrics().live_keys, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reclaim_idle(&self) -> usize {
        self.table.reclaim_idle(&self.algorithm, self.clock.now())
    }

    /// Deletes `key`'s entry and returns whether it was present: its state is
    /// forgotten, and its next check finds a fresh key.
    ///
    /// The removal goes the way reclamation drops an idle key, under the key's
    /// shard lock, at a clock reading `t` taken now:
    ///
    /// * **Linearisable at `t`.** A decision racing the removal is ordered either
    ///   before it (charged to the removed state) or after it. One ordered after is
    ///   judged at `max(its reading, t)`: a reading taken before the removal (a
    ///   thread preempted between its clock read and its check, or
    ///   [`check_n_at`](KeyedLimiter::check_n_at) with an older time) never starts
    ///   the fresh state in the past, where it would have admitted more. So a key
    ///   admits, between two removals, at most what a fresh un-keyed limiter admits
    ///   from the first removal's instant on — for GCRA, `B` plus one unit per `T`
    ///   elapsed: **each removal forgives at most one burst** (a window algorithm's:
    ///   one window's limit).
    /// * **Receipts are void.** Every refund receipt taken before the removal for a
    ///   key in the same shard gives back nothing (the shard's removal generation
    ///   moved): the charge is not in the re-created state.
    ///
    /// With [`Fingerprint`] storage, keys whose fingerprints collide share one entry
    /// and are removed together.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedLimiter, Policy};
    /// let keyed: KeyedLimiter<String> = KeyedLimiter::gcra(Policy::per_hour(1)?);
    /// assert!(keyed.check("banned").is_allowed());
    /// assert!(!keyed.check("banned").is_allowed());
    /// assert!(keyed.remove("banned"));
    /// assert!(!keyed.remove("banned")); // gone already
    /// assert!(keyed.check("banned").is_allowed()); // a fresh key
    /// assert_eq!(keyed.metrics().removed, 1);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn remove<Q>(&self, key: &Q) -> bool
    where
        Q: Lookup<K> + ?Sized,
    {
        self.table.remove(&self.algorithm, key, self.clock.now())
    }

    /// Returns `key` to its fresh state — to clear a login counter after a
    /// successful login, or to unblock a customer — and returns whether the key had
    /// an entry.
    ///
    /// A fresh state and no entry are the same thing, so a reset *is*
    /// [`remove`](KeyedLimiter::remove): the entry is deleted and the key's next
    /// check re-creates it, with everything `remove` guarantees (linearisable at the
    /// reset's clock reading; refund receipts taken before it give back nothing).
    /// It intentionally forgives: after a reset the key may admit a whole burst
    /// again, however much it used before. Resetting the state in place instead
    /// would let a check racing the reset with an earlier clock reading start the
    /// fresh state in the past.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedLimiter, Policy};
    /// let logins: KeyedLimiter<String> = KeyedLimiter::gcra(Policy::per_hour(3)?);
    /// for _ in 0..3 {
    ///     let _ = logins.check("alice"); // three failed attempts
    /// }
    /// assert!(!logins.peek("alice", 1).is_allowed());
    /// assert!(logins.reset("alice")); // she logged in: the counter starts over
    /// assert_eq!(logins.peek("alice", 1).remaining(), 2);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn reset<Q>(&self, key: &Q) -> bool
    where
        Q: Lookup<K> + ?Sized,
    {
        self.remove(key)
    }

    /// Replaces the algorithm (and with it the policy) for every key, keeping each
    /// live key's state as [`Algorithm::carry_over`] says: GCRA keeps its schedule
    /// and applies the new rate from now on (`remaining` clamped to the new burst);
    /// a window keeps its counts when the period stays and starts fresh when it
    /// changes. Outstanding refund receipts are invalidated (a refund of an earlier
    /// charge gives back nothing: the state may be in another packing).
    ///
    /// Takes `&mut self`: no decision runs on the old algorithm while the states are
    /// carried over, and the pass visits every slot (time proportional to the
    /// capacity). To change a shared limiter, hold it in a lock of your own; for
    /// per-key quotas that change while requests run, see
    /// [`PlanLimiter::set_policy`](crate::keyed::plans::PlanLimiter::set_policy).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{FixedWindow, KeyedBuilder, ManualClock, Policy};
    /// let mut keyed = KeyedBuilder::new(FixedWindow::new(Policy::per_minute(10)?)?)
    ///     .clock(ManualClock::new())
    ///     .build::<u64>()?;
    /// assert!(keyed.check_n(&1, 4).is_allowed());
    /// // Same period: the 4 units stay counted.
    /// keyed.set_algorithm(FixedWindow::new(Policy::per_minute(5)?)?);
    /// assert_eq!(keyed.peek(&1, 0).remaining(), 1);
    /// // Another period: a fresh window.
    /// keyed.set_algorithm(FixedWindow::new(Policy::per_hour(5)?)?);
    /// assert_eq!(keyed.peek(&1, 0).remaining(), 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_algorithm(&mut self, algorithm: A) {
        let now = self.clock.now();
        let previous = core::mem::replace(&mut self.algorithm, algorithm);
        let next = &self.algorithm;
        self.table
            .replace_states(now, |state, now| next.carry_over(&previous, state, now));
        // Receipts name their limiter: a new name voids every one handed out.
        self.owner = Owner::new();
    }

    /// Whether this limiter issued `receipt` (and no [`set_algorithm`] has voided it
    /// since), whatever its key: a refund of it here may give something back.
    ///
    /// [`set_algorithm`]: KeyedLimiter::set_algorithm
    pub(crate) fn issued(&self, receipt: &Receipt) -> bool {
        receipt.is_from(self.owner)
    }

    #[inline(always)]
    pub(crate) fn count(&self, allowed: bool) {
        self.stripes.count(allowed);
    }

    /// [`check_with`](KeyedLimiter::check_with) without counting the decision in
    /// the metrics (a caller that counts what it makes of it).
    #[inline]
    pub(crate) fn decide_uncounted<Q>(
        &self,
        algorithm: &A,
        key: &Q,
        now: Nanos,
        cost: u32,
    ) -> Decision
    where
        Q: Lookup<K> + ?Sized,
    {
        self.table.decide(algorithm, key, now, cost)
    }
}

impl<K, C, S> KeyedLimiter<K, Gcra, C, S>
where
    C: Clock,
    S: Storage<K, crate::gcra::GcraState>,
{
    /// Replaces the policy for every key ([`set_algorithm`](KeyedLimiter::set_algorithm)
    /// with `Gcra::new(policy)`): each key keeps its schedule, the new rate applies
    /// from now on and `remaining` is clamped to the new burst.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedBuilder, Gcra, ManualClock, Policy};
    /// let mut keyed = KeyedBuilder::new(Gcra::new(Policy::per_second(10)?))
    ///     .clock(ManualClock::new())
    ///     .build_inline::<u64>()?;
    /// assert!(keyed.check_n(&1, 6).is_allowed());
    /// // TAT = now + 600 ms; under 5/s (T = 200 ms, τ = 1 s) 2 units fit.
    /// keyed.set_policy(Policy::per_second(5)?);
    /// assert_eq!(keyed.peek(&1, 0).remaining(), 2);
    /// assert_eq!(keyed.peek(&2, 0).remaining(), 5); // a fresh key gets the new burst
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_policy(&mut self, policy: Policy) {
        self.set_algorithm(Gcra::new(policy));
    }

    /// Reserves `cost` units for `key` now if their slot is at most `max_delay`
    /// away — [`Shaper::reserve`](crate::Shaper::reserve) for one key of many: the
    /// decision, the delay until the slot, and the receipt whose
    /// [`refund`](KeyedLimiter::refund) cancels the reservation (the part of it the
    /// clock has not reached). Slots of one key are handed out first come, first
    /// served; keys do not wait for each other.
    ///
    /// A reservation granted with no delay is exactly a plain GCRA admission (`new
    /// TAT ≤ now + τ`, the same transition): its receipt is the one
    /// [`charge_at`](KeyedLimiter::charge_at) would have given at the same instant,
    /// and its refund gives back exactly what that charge's would (GCRA's
    /// [refund rule](Algorithm::refund): the part of the booking the clock has not
    /// reached, less any slot reserved after it that is still ahead). A delayed
    /// reservation's receipt is its cancellation, judged by the same rule. Either
    /// way the receipt is the reservation's only way back and is consumed by its
    /// refund, so its units come back at most once. (The direct shaper's
    /// counterpart is [`Reservation::into_receipt`](crate::Reservation::into_receipt).)
    ///
    /// # Errors
    ///
    /// [`ShapeError::TooLong`] when the slot is further than `max_delay` (nothing is
    /// consumed), [`ShapeError::Never`] when `cost` exceeds the burst.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Gcra, KeyedBuilder, ManualClock, Policy};
    /// use std::time::Duration;
    /// let keyed = KeyedBuilder::new(Gcra::new(Policy::per_second(4)?.with_burst(1)?))
    ///     .clock(ManualClock::new())
    ///     .build::<String>()?;
    /// let max = Duration::from_millis(300);
    /// assert!(keyed.reserve("alice", 1, max)?.1.is_zero());
    /// let (_, delay, receipt) = keyed.reserve("alice", 1, max)?;
    /// assert_eq!(delay, Duration::from_millis(250));
    /// assert!(keyed.reserve("alice", 1, max).is_err()); // 500 ms away
    /// assert!(keyed.reserve("bob", 1, max)?.1.is_zero()); // bob's own schedule
    /// assert!(keyed.refund("alice", receipt)); // cancelled: the slot comes back
    /// assert_eq!(keyed.reserve("alice", 1, max)?.1, Duration::from_millis(250));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve<Q>(
        &self,
        key: &Q,
        cost: u32,
        max_delay: core::time::Duration,
    ) -> Result<(Decision, core::time::Duration, Receipt), ShapeError>
    where
        Q: Lookup<K> + ?Sized,
    {
        self.reserve_at(key, self.clock.now(), cost, max_delay)
    }

    /// [`reserve`](KeyedLimiter::reserve) at an instant the caller read.
    ///
    /// # Errors
    ///
    /// As [`reserve`](KeyedLimiter::reserve).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Gcra, KeyedBuilder, ManualClock, Nanos, Policy};
    /// use std::time::Duration;
    /// let keyed = KeyedBuilder::new(Gcra::new(Policy::per_second(1)?.with_burst(1)?))
    ///     .clock(ManualClock::new())
    ///     .build_inline::<u64>()?;
    /// let now = Nanos::from_secs(10);
    /// assert!(keyed.reserve_at(&1, now, 1, Duration::ZERO)?.1.is_zero());
    /// assert!(keyed.reserve_at(&1, now, 1, Duration::ZERO).is_err());
    /// assert!(keyed.reserve_at(&1, now, 2, Duration::from_secs(60)).is_err()); // never fits
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve_at<Q>(
        &self,
        key: &Q,
        now: Nanos,
        cost: u32,
        max_delay: core::time::Duration,
    ) -> Result<(Decision, core::time::Duration, Receipt), ShapeError>
    where
        Q: Lookup<K> + ?Sized,
    {
        let reserve = Reserve::new(self.algorithm, max_delay);
        let c = self
            .table
            .decide::<KeyedCharge<GcraState>, Q, Reserve>(&reserve, key, now, cost);
        let judged = reserve.judge(c.decision, cost);
        let (decision, receipt) = self.settle(c);
        let delay = judged.delay()?;
        Ok((decision, delay, receipt))
    }

    /// What [`reserve`](KeyedLimiter::reserve) would decide for `key` now, reserving
    /// nothing and inserting no key (a key not in the table is peeked as a fresh
    /// schedule, as [`peek`](KeyedLimiter::peek) does): the same transition on the
    /// key's state as it is, not written ([`ReservationPeek`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Gcra, KeyedBuilder, ManualClock, Policy};
    /// use std::time::Duration;
    /// let keyed = KeyedBuilder::new(Gcra::new(Policy::per_second(4)?.with_burst(1)?))
    ///     .clock(ManualClock::new())
    ///     .build::<String>()?;
    /// let max = Duration::from_millis(300);
    /// let _ = keyed.reserve("alice", 1, max)?;
    /// let peek = keyed.peek_reserve("alice", 1, max);
    /// assert_eq!(peek.delay(), Ok(Duration::from_millis(250)));
    /// assert_eq!(keyed.peek_reserve("bob", 1, max).delay(), Ok(Duration::ZERO));
    /// assert_eq!(keyed.metrics().live_keys, 1); // bob was not inserted
    /// // The reservation the peek foretold:
    /// let (decision, delay, _) = keyed.reserve("alice", 1, max)?;
    /// assert_eq!((decision, delay), (peek.decision(), Duration::from_millis(250)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek_reserve<Q>(
        &self,
        key: &Q,
        cost: u32,
        max_delay: core::time::Duration,
    ) -> ReservationPeek
    where
        Q: Lookup<K> + ?Sized,
    {
        self.peek_reserve_at(key, self.clock.now(), cost, max_delay)
    }

    /// [`peek_reserve`](KeyedLimiter::peek_reserve) at an instant the caller read:
    /// exactly what [`reserve_at`](KeyedLimiter::reserve_at) would decide at `now` on
    /// the key's state as it is.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Gcra, KeyedBuilder, ManualClock, Nanos, Policy, ShapeError};
    /// use std::time::Duration;
    /// let keyed = KeyedBuilder::new(Gcra::new(Policy::per_second(1)?.with_burst(1)?))
    ///     .clock(ManualClock::new())
    ///     .build_inline::<u64>()?;
    /// let now = Nanos::from_secs(10);
    /// let _ = keyed.reserve_at(&1, now, 1, Duration::ZERO)?;
    /// let peek = keyed.peek_reserve_at(&1, now, 1, Duration::ZERO);
    /// assert_eq!(peek.delay(), Err(ShapeError::TooLong { retry_after: Duration::from_secs(1) }));
    /// assert_eq!(keyed.peek_reserve_at(&1, now, 2, Duration::MAX).delay(), Err(ShapeError::Never { cost: 2, burst: 1 }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek_reserve_at<Q>(
        &self,
        key: &Q,
        now: Nanos,
        cost: u32,
        max_delay: core::time::Duration,
    ) -> ReservationPeek
    where
        Q: Lookup<K> + ?Sized,
    {
        let reserve = Reserve::new(self.algorithm, max_delay);
        reserve.judge(self.table.peek(&reserve, key, now, cost), cost)
    }
}

impl<K, A, C, S> KeyedLimiter<K, A, C, S>
where
    A: Algorithm,
    S: Storage<K, A::State>,
{
    /// The counters, summed over stripes and shards.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedLimiter, Policy};
    /// let keyed = KeyedLimiter::gcra(Policy::per_second(1)?);
    /// let _ = keyed.check(&1u64);
    /// assert_eq!(keyed.metrics().allowed, 1);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn metrics(&self) -> KeyedMetrics {
        self.stripes.metrics(self.table.counts())
    }

    /// Under loom only: how many full looks for idle keys the table's shards made
    /// before an eviction (see the storage module's `evict_sampled`), so that a loom
    /// model can assert the look it races actually ran.
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn full_looks(&self) -> u64 {
        self.table.counts().full_looks
    }

    /// The configured key capacity.
    ///
    /// # Examples
    ///
    /// ```
    /// let keyed = floodgate::KeyedLimiter::<u64>::gcra(floodgate::Policy::per_second(1)?);
    /// assert_eq!(keyed.capacity(), floodgate::DEFAULT_CAPACITY);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The keys the table holds before it evicts: each shard's share of the capacity
    /// plus a slack for uneven hashing (none with one shard; 2.2 % at 125 000 keys
    /// per shard, 23 % at 1 250), sized so that `capacity` keys overflow no shard
    /// except with a chance below 2^-40 (Bernstein's bound over every shard at once).
    /// An eviction whose sampled victims all change under racing decisions before it
    /// takes one (4 samples in a row) lets that insert into the slot array's headroom;
    /// the next insert evicts again.
    ///
    /// # Examples
    ///
    /// ```
    /// let one = floodgate::KeyedBuilder::new(floodgate::Gcra::new(floodgate::Policy::per_second(1)?))
    ///     .capacity(1_000).shards(1).build::<u64>()?;
    /// assert_eq!(one.max_keys(), 1_000);
    /// let four = floodgate::KeyedBuilder::new(floodgate::Gcra::new(floodgate::Policy::per_second(1)?))
    ///     .capacity(1_000).shards(4).build::<u64>()?;
    /// assert_eq!(four.max_keys(), 4 * (250 + 131)); // a share of 250 and its slack
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn max_keys(&self) -> usize {
        self.table.capacity()
    }

    /// The number of shards.
    ///
    /// # Examples
    ///
    /// ```
    /// let keyed = floodgate::KeyedLimiter::<u64>::gcra(floodgate::Policy::per_second(1)?);
    /// assert!(keyed.shards().is_power_of_two());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn shards(&self) -> usize {
        self.table.shard_count()
    }

    /// Bytes of the fixed slot array (allocated once, at build).
    ///
    /// # Examples
    ///
    /// ```
    /// let keyed = floodgate::KeyedBuilder::new(floodgate::Gcra::new(floodgate::Policy::per_second(1)?))
    ///     .capacity(750).shards(1).build::<u64>()?;
    /// assert_eq!(keyed.slot_bytes(), 1_000 * 16);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn slot_bytes(&self) -> usize {
        self.table.slot_count() * <S::Table as KeyTable<K, A::State>>::SLOT_BYTES
    }

    /// Bytes one live key's entry holds on the heap (key + state, before allocator
    /// overhead).
    ///
    /// # Examples
    ///
    /// ```
    /// let keyed = floodgate::KeyedLimiter::<u64>::gcra(floodgate::Policy::per_second(1)?);
    /// assert_eq!(keyed.entry_bytes(), 16);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn entry_bytes(&self) -> usize {
        <S::Table as KeyTable<K, A::State>>::ENTRY_BYTES
    }

    /// The algorithm every key runs.
    ///
    /// # Examples
    ///
    /// ```
    /// let keyed = floodgate::KeyedLimiter::<u64>::gcra(floodgate::Policy::per_second(3)?);
    /// assert_eq!(keyed.algorithm().policy().limit(), 3);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn algorithm(&self) -> &A {
        &self.algorithm
    }

    /// The clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::Clock;
    /// let keyed = floodgate::KeyedLimiter::<u64>::gcra(floodgate::Policy::per_second(3)?);
    /// let _now = keyed.clock().now();
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn clock(&self) -> &C {
        &self.clock
    }
}

impl<K, A, C, S> fmt::Debug for KeyedLimiter<K, A, C, S>
where
    A: Algorithm + fmt::Debug,
    C: fmt::Debug,
    S: Storage<K, A::State> + Default + fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedLimiter")
            .field("algorithm", &self.algorithm)
            .field("clock", &self.clock)
            .field("storage", &S::default())
            .field("capacity", &self.capacity())
            .field("shards", &self.shards())
            .field("metrics", &self.metrics())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    /// A builder given a clock never makes the default one: under Miri (which cannot
    /// run the TSC calibration's CPUID) this test would fail if it did.
    #[test]
    fn a_builder_with_its_own_clock_never_makes_the_default_clock() {
        let clock = ManualClock::starting_at(Nanos::from_secs(7));
        let keyed = KeyedBuilder::new(Gcra::new(Policy::per_second(1).unwrap()))
            .capacity(8)
            .clock(clock.clone())
            .build_inline::<u64>()
            .unwrap();
        assert_eq!(keyed.clock().now(), Nanos::from_secs(7));
        assert!(keyed.check(&1).is_allowed());
        // The same through the algorithm-less builder plans use.
        let table = KeyedBuilder::default()
            .capacity(8)
            .clock(clock)
            .algorithm(Gcra::new(Policy::per_second(1).unwrap()))
            .build_inline::<u64>()
            .unwrap();
        assert_eq!(table.clock().now(), Nanos::from_secs(7));
    }
}
