//! [`CompactKeyedLimiter`]: the keyed limiter for word-sized keys, stored inline,
//! and its opt-in fingerprint mode for any `Hash` key.

use core::fmt;
use core::hash::Hash;
use core::marker::PhantomData;

use super::compact_table::{CompactTable, SLOT_BYTES};
use super::{KeyedBuilder, KeyedError, KeyedMetrics, Stripes};
use crate::algorithm::Algorithm;
use crate::clock::{Clock, DefaultClock, Nanos};
use crate::decision::Decision;
use crate::gcra::Gcra;

/// A keyed rate limiter for keys of at most 8 bytes of plain old data (`u64`, `u32`,
/// `[u8; 4]` for an IPv4 address, `(u32, u32)`-like `Pod` structs), stored inline in
/// the table: 16 bytes per slot, no heap entry per key, one cache miss per lookup.
///
/// Same semantics as [`KeyedLimiter`](super::KeyedLimiter) — exact keys (two keys
/// with different bits never share a state), bounded memory, lossless reclamation of
/// idle keys on insert, eviction of the closest-to-idle key when full, the same
/// metrics — with these differences:
///
/// * keys are compared by their bytes (for `Pod` types, equal values have equal
///   bytes; a type whose `Eq` equates different byte patterns is not supported);
/// * a slot is one 128-bit atomic word `(key, state)` and a decision is one 128-bit
///   CAS on it, so reusing a slot for another key can never apply a stale decision to
///   that key (proof in the table's source; loom: `tests/loom_keyed_compact.rs`);
/// * memory is `slot_bytes()` and nothing else: ≈ 18.3 bytes per key of capacity
///   (load factor 7/8 plus the shards' slack), allocated once at build.
///
/// A key or state wider than 8 bytes is rejected at compile time.
///
/// **Fingerprint mode** ([`KeyedBuilder::build_fingerprint`], `E = `[`Fingerprint`]):
/// the same table for keys of any `Hash` type (`str`, `String`, `IpAddr`, tuples),
/// each standing for its 64-bit keyed hash. Opt-in because it is not exact: two keys
/// with equal fingerprints share a state (odds in [`Fingerprint`]).
///
/// # Performance
///
/// A known key costs one 16-byte load and one 16-byte CAS on one cache line: one
/// cache miss where the general table takes two (slot, then heap entry), which is
/// what matters once the table outgrows the cache. In cache, the 16-byte CAS
/// (`cmpxchg16b` on x86_64) costs a few nanoseconds more than the general table's
/// 8-byte one. `portable-atomic` picks the 16-byte instructions at run time (one
/// indirect call each); building with `RUSTFLAGS="-C target-feature=+cmpxchg16b,+avx"`
/// (or `-C target-cpu=native`) inlines them.
///
/// # Examples
///
/// ```
/// use floodgate::{CompactKeyedLimiter, Gcra, KeyedBuilder, ManualClock, Policy};
///
/// let per_ip: CompactKeyedLimiter<[u8; 4], Gcra, ManualClock> =
///     KeyedBuilder::new(Gcra::new(Policy::per_second(2)?))
///         .capacity(10_000)
///         .clock(ManualClock::new())
///         .build_compact()?;
/// let ip = [192, 0, 2, 7];
/// assert!(per_ip.check(&ip).is_allowed());
/// assert!(per_ip.check(&ip).is_allowed());
/// assert!(!per_ip.check(&ip).is_allowed());
/// assert!(per_ip.check(&[192, 0, 2, 8]).is_allowed()); // its own budget
/// assert_eq!(per_ip.metrics().live_keys, 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct CompactKeyedLimiter<K: ?Sized, A: Algorithm = Gcra, C = DefaultClock, E = Exact> {
    capacity: usize,
    algorithm: A,
    clock: C,
    table: CompactTable<A::State>,
    stripes: Stripes,
    encoding: E,
    _key: PhantomData<fn(&K)>,
}

/// How a [`CompactKeyedLimiter`] turns a key into the 64 bits its slot stores:
/// [`Exact`] (the key's own bytes) or [`Fingerprint`] (a keyed 64-bit hash).
///
/// # Examples
///
/// ```
/// use floodgate::{Exact, KeyBits};
/// assert_eq!(Exact.bits(&7u64), 7);
/// ```
pub trait KeyBits<K: ?Sized>: Send + Sync {
    /// The 64 bits that stand for `key` in the table.
    fn bits(&self, key: &K) -> u64;
}

/// Exact keys: a key's own bytes, zero-extended (keys of at most 8 bytes of plain
/// old data). Two different keys never share a state.
///
/// # Examples
///
/// ```
/// use floodgate::{Exact, KeyBits};
/// assert_ne!(Exact.bits(&[10u8, 0, 0, 1]), Exact.bits(&[10u8, 0, 0, 2]));
/// ```
///
/// A key wider than 8 bytes does not compile:
///
/// ```compile_fail
/// use floodgate::{Exact, KeyBits};
/// let _ = Exact.bits(&[0u8; 16]);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Exact;

impl<K: bytemuck::Pod> KeyBits<K> for Exact {
    #[inline(always)]
    fn bits(&self, key: &K) -> u64 {
        crate::receipt::to_bits(key)
    }
}

/// Fingerprint keys (opt-in, [`KeyedBuilder::build_fingerprint`]): a key of any
/// `Hash` type stands for its 64-bit keyed hash (`ahash`, per-process random seeds).
///
/// **Not exact**: two different keys whose fingerprints are equal share one state
/// (each is charged for the other). For `n` keys in the table at once, the chance
/// that any two of them collide is about n² / 2⁶⁵: 3 × 10⁻⁸ for a million keys,
/// 3 × 10⁻⁴ for a hundred million. The seeds are random per process, so a client
/// cannot choose keys that collide. A collision never panics and never admits more
/// than one key's limit for the pair.
///
/// # Examples
///
/// ```
/// use floodgate::{Fingerprint, KeyBits};
/// let f = Fingerprint::new();
/// assert_eq!(f.bits("alice"), f.bits("alice"));
/// assert_ne!(f.bits("alice"), f.bits("bob"));
/// ```
#[derive(Clone, Debug)]
pub struct Fingerprint(ahash::RandomState);

impl Fingerprint {
    /// A fingerprint with fresh random seeds (fixed under loom).
    ///
    /// # Examples
    ///
    /// ```
    /// let _f = floodgate::Fingerprint::new();
    /// ```
    pub fn new() -> Self {
        #[cfg(not(loom))]
        let seeds = ahash::RandomState::new();
        #[cfg(loom)]
        let seeds = ahash::RandomState::with_seeds(5, 6, 7, 8);
        Fingerprint(seeds)
    }
}

impl Default for Fingerprint {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Hash + ?Sized> KeyBits<K> for Fingerprint {
    #[inline(always)]
    fn bits(&self, key: &K) -> u64 {
        self.0.hash_one(key)
    }
}

/// Compile-time check that a key and a state fit a slot's words.
struct WordSized<K, S>(PhantomData<(K, S)>);

impl<K, S> WordSized<K, S> {
    const OK: () = assert!(
        core::mem::size_of::<K>() <= 8 && core::mem::size_of::<S>() <= 8,
        "CompactKeyedLimiter needs keys and states of at most 8 bytes"
    );
}

impl<A, C> KeyedBuilder<A, C> {
    /// Builds a [`CompactKeyedLimiter`] (keys of at most 8 bytes, stored inline),
    /// allocating its whole slot array now.
    ///
    /// # Errors
    ///
    /// [`KeyedError`] for a zero or too large capacity, zero shards, or a slot array
    /// over the [`memory_budget`](KeyedBuilder::memory_budget).
    ///
    /// # Examples
    ///
    /// ```
    /// let keyed = floodgate::KeyedBuilder::new(floodgate::Gcra::new(floodgate::Policy::per_second(1)?))
    ///     .capacity(700)
    ///     .shards(1)
    ///     .build_compact::<u64>()?;
    /// assert_eq!(keyed.slot_bytes(), 800 * 16);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn build_compact<K>(self) -> Result<CompactKeyedLimiter<K, A, C>, KeyedError>
    where
        A: Algorithm,
        K: bytemuck::Pod,
    {
        let () = WordSized::<K, A::State>::OK;
        self.build_with(Exact)
    }

    /// Builds a [`CompactKeyedLimiter`] in fingerprint mode: keys of any `Hash` type
    /// (`String`, `IpAddr`, tuples) stand for their 64-bit keyed hash. Opt-in and
    /// **not exact**: see [`Fingerprint`] for the collision odds.
    ///
    /// # Errors
    ///
    /// [`KeyedError`] for a zero or too large capacity, zero shards, or a slot array
    /// over the [`memory_budget`](KeyedBuilder::memory_budget).
    ///
    /// # Examples
    ///
    /// ```
    /// let keyed = floodgate::KeyedBuilder::new(floodgate::Gcra::new(floodgate::Policy::per_second(1)?))
    ///     .build_fingerprint::<str>()?;
    /// assert!(keyed.check("alice").is_allowed());
    /// assert!(!keyed.check("alice").is_allowed());
    /// assert!(keyed.check("bob").is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn build_fingerprint<K>(
        self,
    ) -> Result<CompactKeyedLimiter<K, A, C, Fingerprint>, KeyedError>
    where
        A: Algorithm,
        K: Hash + ?Sized,
    {
        let () = WordSized::<u64, A::State>::OK;
        self.build_with(Fingerprint::new())
    }

    fn build_with<K: ?Sized, E>(
        self,
        encoding: E,
    ) -> Result<CompactKeyedLimiter<K, A, C, E>, KeyedError>
    where
        A: Algorithm,
    {
        let wanted = self.validate()?;
        let (capacity, shards) = self.layout(wanted);
        Ok(CompactKeyedLimiter {
            capacity,
            algorithm: self.algorithm,
            clock: self.clock,
            table: CompactTable::new(capacity, shards),
            stripes: Stripes::new(shards),
            encoding,
            _key: PhantomData,
        })
    }
}

impl<K, A, C, E> CompactKeyedLimiter<K, A, C, E>
where
    K: ?Sized,
    E: KeyBits<K>,
    A: Algorithm,
    C: Clock,
{
    /// Decides one unit for `key` now, consuming it if allowed.
    ///
    /// # Examples
    ///
    /// ```
    /// let keyed = floodgate::KeyedBuilder::new(floodgate::Gcra::new(floodgate::Policy::per_second(1)?))
    ///     .build_compact::<u64>()?;
    /// assert!(keyed.check(&42).is_allowed());
    /// assert!(!keyed.check(&42).is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn check(&self, key: &K) -> Decision {
        self.check_n(key, 1)
    }

    /// Decides `cost` units for `key` now, consuming them if allowed.
    ///
    /// # Examples
    ///
    /// ```
    /// let keyed = floodgate::KeyedBuilder::new(floodgate::Gcra::new(floodgate::Policy::per_second(10)?))
    ///     .build_compact::<u32>()?;
    /// assert_eq!(keyed.check_n(&1, 4).remaining(), 6);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn check_n(&self, key: &K, cost: u32) -> Decision {
        self.decide(key, || self.clock.now(), cost)
    }

    /// [`check_n`](CompactKeyedLimiter::check_n) at an instant the caller read.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::Nanos;
    /// let keyed = floodgate::KeyedBuilder::new(floodgate::Gcra::new(floodgate::Policy::per_second(1)?))
    ///     .build_compact::<u64>()?;
    /// assert!(keyed.check_n_at(&1, Nanos::from_secs(5), 1).is_allowed());
    /// assert!(!keyed.check_n_at(&1, Nanos::from_secs(5), 1).is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn check_n_at(&self, key: &K, now: Nanos, cost: u32) -> Decision {
        self.decide(key, || now, cost)
    }

    /// A check whose clock is read once the slot's load is under way.
    #[inline(always)]
    fn decide(&self, key: &K, now: impl FnOnce() -> Nanos, cost: u32) -> Decision {
        let bits = self.encoding.bits(key);
        let decision = self.table.check(&self.algorithm, bits, now, cost);
        self.stripes.count(decision.is_allowed());
        decision
    }

    /// Exactly what [`check_n(key, cost)`](CompactKeyedLimiter::check_n) would return
    /// now; writes nothing and inserts no key.
    ///
    /// # Examples
    ///
    /// ```
    /// let keyed = floodgate::KeyedBuilder::new(floodgate::Gcra::new(floodgate::Policy::per_second(1)?))
    ///     .build_compact::<u64>()?;
    /// assert!(keyed.peek(&9, 1).is_allowed());
    /// assert_eq!(keyed.metrics().live_keys, 0); // nothing inserted
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn peek(&self, key: &K, cost: u32) -> Decision {
        self.peek_at(key, self.clock.now(), cost)
    }

    /// [`peek`](CompactKeyedLimiter::peek) at an instant the caller read.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::Nanos;
    /// let keyed = floodgate::KeyedBuilder::new(floodgate::Gcra::new(floodgate::Policy::per_second(1)?))
    ///     .build_compact::<u64>()?;
    /// let _ = keyed.check_n_at(&1, Nanos::from_secs(5), 1);
    /// assert!(!keyed.peek_at(&1, Nanos::from_secs(5), 1).is_allowed());
    /// assert!(keyed.peek_at(&1, Nanos::from_secs(6), 1).is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn peek_at(&self, key: &K, now: Nanos, cost: u32) -> Decision {
        self.table
            .peek(&self.algorithm, self.encoding.bits(key), now, cost)
    }

    /// Drops every idle key now and returns how many (never needed for bounded
    /// memory — inserts reclaim on their own).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::ManualClock;
    /// use std::time::Duration;
    /// let clock = ManualClock::new();
    /// let keyed = floodgate::KeyedBuilder::new(floodgate::Gcra::new(floodgate::Policy::per_second(1)?))
    ///     .clock(clock.clone())
    ///     .build_compact::<u64>()?;
    /// let _ = keyed.check(&1);
    /// clock.advance(Duration::from_secs(1));
    /// assert_eq!(keyed.reclaim_idle(), 1);
    /// assert_eq!(keyed.metrics().live_keys, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reclaim_idle(&self) -> usize {
        self.table.reclaim_idle(&self.algorithm, self.clock.now())
    }
}

impl<K: ?Sized, A: Algorithm, C, E> CompactKeyedLimiter<K, A, C, E> {
    /// The counters, summed over stripes and shards (as [`KeyedMetrics`] describes).
    ///
    /// # Examples
    ///
    /// ```
    /// let keyed = floodgate::KeyedBuilder::new(floodgate::Gcra::new(floodgate::Policy::per_second(1)?))
    ///     .build_compact::<u64>()?;
    /// let _ = keyed.check(&1);
    /// let _ = keyed.check(&1);
    /// let m = keyed.metrics();
    /// assert_eq!((m.allowed, m.denied, m.live_keys), (1, 1, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn metrics(&self) -> KeyedMetrics {
        self.stripes.metrics(self.table.counts())
    }

    /// The configured key capacity.
    ///
    /// # Examples
    ///
    /// ```
    /// let keyed = floodgate::KeyedBuilder::new(floodgate::Gcra::new(floodgate::Policy::per_second(1)?))
    ///     .capacity(64)
    ///     .build_compact::<u64>()?;
    /// assert_eq!(keyed.capacity(), 64);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The most keys the table can hold (as [`KeyedLimiter::max_keys`](super::KeyedLimiter::max_keys)).
    ///
    /// # Examples
    ///
    /// ```
    /// let keyed = floodgate::KeyedBuilder::new(floodgate::Gcra::new(floodgate::Policy::per_second(1)?))
    ///     .capacity(1_000)
    ///     .shards(1)
    ///     .build_compact::<u64>()?;
    /// assert_eq!(keyed.max_keys(), 1_000);
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
    /// let keyed = floodgate::KeyedBuilder::new(floodgate::Gcra::new(floodgate::Policy::per_second(1)?))
    ///     .shards(3)
    ///     .build_compact::<u64>()?;
    /// assert_eq!(keyed.shards(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn shards(&self) -> usize {
        self.table.shard_count()
    }

    /// Bytes of the slot array: all the memory the keys take (allocated once).
    ///
    /// # Examples
    ///
    /// ```
    /// let keyed = floodgate::KeyedBuilder::new(floodgate::Gcra::new(floodgate::Policy::per_second(1)?))
    ///     .capacity(1_000_000)
    ///     .build_compact::<u64>()?;
    /// assert!(keyed.slot_bytes() <= 19 * 1_000_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn slot_bytes(&self) -> usize {
        self.table.slot_count() * SLOT_BYTES
    }

    /// The algorithm every key runs.
    ///
    /// # Examples
    ///
    /// ```
    /// let keyed = floodgate::KeyedBuilder::new(floodgate::Gcra::new(floodgate::Policy::per_second(3)?))
    ///     .build_compact::<u64>()?;
    /// assert_eq!(keyed.algorithm().policy().limit(), 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
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
    /// let keyed = floodgate::KeyedBuilder::new(floodgate::Gcra::new(floodgate::Policy::per_second(3)?))
    ///     .build_compact::<u64>()?;
    /// let _now = keyed.clock().now();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn clock(&self) -> &C {
        &self.clock
    }
}

impl<K: ?Sized, A: Algorithm + fmt::Debug, C: fmt::Debug, E> fmt::Debug
    for CompactKeyedLimiter<K, A, C, E>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompactKeyedLimiter")
            .field("algorithm", &self.algorithm)
            .field("clock", &self.clock)
            .field("capacity", &self.capacity())
            .field("shards", &self.shards())
            .field("metrics", &self.metrics())
            .finish()
    }
}
