//! [`CompactKeyedLimiter`]: the keyed limiter for word-sized keys, stored inline.

use core::fmt;
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
pub struct CompactKeyedLimiter<K, A: Algorithm = Gcra, C = DefaultClock> {
    capacity: usize,
    algorithm: A,
    clock: C,
    table: CompactTable<A::State>,
    stripes: Stripes,
    _key: PhantomData<fn(&K)>,
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
    /// [`KeyedError`] for a zero or too large capacity, or zero shards.
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
        let wanted = self.validate()?;
        let (capacity, shards) = self.layout(wanted);
        Ok(CompactKeyedLimiter {
            capacity,
            algorithm: self.algorithm,
            clock: self.clock,
            table: CompactTable::new(capacity, shards),
            stripes: Stripes::new(shards),
            _key: PhantomData,
        })
    }
}

impl<K, A, C> CompactKeyedLimiter<K, A, C>
where
    K: bytemuck::Pod,
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
        let decision = self.table.check(&self.algorithm, key_bits(key), now, cost);
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
        self.table.peek(&self.algorithm, key_bits(key), now, cost)
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

/// A key's bytes, zero-extended to a word.
#[inline(always)]
fn key_bits<K: bytemuck::Pod>(key: &K) -> u64 {
    super::compact_table::to_bits(key)
}

impl<K, A: Algorithm, C> CompactKeyedLimiter<K, A, C> {
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

impl<K, A: Algorithm + fmt::Debug, C: fmt::Debug> fmt::Debug for CompactKeyedLimiter<K, A, C> {
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
