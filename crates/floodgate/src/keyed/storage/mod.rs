//! Key storage: where a [`KeyedLimiter`](super::KeyedLimiter) keeps each key's state
//! word. The storage is the limiter's last type parameter; every feature (checks,
//! peeks, charges and refunds, plans, composites, metrics, reclamation) is written
//! once over [`KeyTable`] and works on each:
//!
//! * [`Heap`] (the default): slots point to heap entries holding the key and its
//!   state; any `Hash + Eq` key, borrowed lookups ([`Lookup`](super::Lookup));
//! * [`Inline`]: the key's 64-bit encoding ([`InlineKey`](super::InlineKey)) and the
//!   state in one 128-bit atomic slot, no heap entry, one cache miss per lookup;
//! * [`Fingerprint`] (opt-in, not exact): the inline slot keyed by a 64-bit keyed
//!   hash of any `Hash` key.
//!
//! The shard machinery is shared: the shard ([`Shard`]: its slot array, sequence
//! number ([`Version`]), removal record ([`Removals`]: generation, latest removal
//! instant, refund ledger) and write side), sizing, hashing to shards, the locked
//! write path that inserts a key, refunds, reclamation, eviction, counters and the
//! dead-word guard ([`charge_live`]) live here; a storage supplies only its slot type
//! ([`Slots`]) and its lookups.

pub(crate) mod heap;
pub(crate) mod inline;

use core::hash::Hash;

use crossbeam_utils::CachePadded;

use super::key::{InlineKey, Lookup};
use crate::algorithm::{Algorithm, Charged};
use crate::cell::{
    in_registers, refund_word, update_word_from_ordered, CasWord, RecentRefunds, RefundLedger,
};
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::sync::{fence, lock, AtomicU64, Mutex, Ordering};

/// Heap storage (the default): each key and its state in a heap entry behind a
/// 16-byte slot; any `Hash + Eq` key, looked up by any [`Lookup`](super::Lookup)
/// form (`&str` for `String`, [`Pair`](super::Pair) for pairs) without allocating.
///
/// # Examples
///
/// ```
/// use floodgate::{Gcra, Heap, KeyedBuilder, KeyedLimiter, Policy};
/// let keyed: KeyedLimiter<String, Gcra, _, Heap> =
///     KeyedBuilder::new(Gcra::new(Policy::per_second(1)?)).build()?;
/// assert!(keyed.check("alice").is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Heap;

/// Inline storage: keys that encode into 64 bits ([`InlineKey`](super::InlineKey):
/// integers, `[u8; N ≤ 8]`, `Ipv4Addr`, `IpAddr`, [`Ipv6Prefix`](super::Ipv6Prefix))
/// live in the slot beside their state, one 128-bit atomic word: no heap entry, no
/// epoch, one cache miss per lookup, ≈ 21.8 bytes per key of capacity all included.
///
/// # Examples
///
/// ```
/// use floodgate::{Gcra, KeyedBuilder, Policy};
/// use std::net::IpAddr;
/// let per_ip = KeyedBuilder::new(Gcra::new(Policy::per_second(1)?)).build_inline::<IpAddr>()?;
/// assert!(per_ip.check(&"192.0.2.7".parse::<IpAddr>()?).is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Inline;

/// Fingerprint storage (opt-in, [`KeyedBuilder::build_fingerprint`](super::KeyedBuilder::build_fingerprint)):
/// the inline slot keyed by a 64-bit keyed hash (`ahash`, per-process random seeds)
/// of a key of any `Hash` type.
///
/// **Not exact**: two different keys whose fingerprints are equal share one state
/// (each is charged for the other). For `n` keys in the table at once, the chance
/// that any two of them collide is about n² / 2⁶⁵: 3 × 10⁻⁸ for a million keys,
/// 3 × 10⁻⁴ for a hundred million. The seeds are random per process, so a client
/// cannot choose keys that collide — unless the builder fixed them
/// ([`hash_seed`](super::KeyedBuilder::hash_seed)): a client who knows the seed and
/// the build can then search offline for a key whose fingerprint equals another
/// client's and spend that client's limit. A collision never panics and never admits
/// more than one key's limit for the pair.
///
/// # Examples
///
/// ```
/// use floodgate::{Gcra, KeyedBuilder, Policy};
/// let keyed = KeyedBuilder::new(Gcra::new(Policy::per_hour(1)?)).build_fingerprint::<String>()?;
/// assert!(keyed.check("alice").is_allowed());
/// assert!(!keyed.check("alice").is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fingerprint;

/// A storage for keys `K` and state words `S`: [`Heap`], [`Inline`] or
/// [`Fingerprint`] (sealed: the table behind it is the crate's).
///
/// # Examples
///
/// ```
/// use floodgate::{GcraState, Heap, Inline, Storage};
/// fn stores<K, S: Storage<K, GcraState>>() {}
/// stores::<String, Heap>();
/// stores::<u64, Inline>();
/// ```
pub trait Storage<K, S>: sealed::Sealed {
    /// The table.
    #[doc(hidden)]
    type Table: KeyTable<K, S>;
}

pub(crate) mod sealed {
    /// Only this crate's storages.
    pub trait Sealed {}
    impl Sealed for super::Heap {}
    impl Sealed for super::Inline {}
    impl Sealed for super::Fingerprint {}
}

impl<K, S> Storage<K, S> for Heap
where
    K: Hash + Eq + Send + Sync + 'static,
    S: bytemuck::Pod + Send + Sync,
{
    type Table = heap::Table<K, S>;
}

impl<K: InlineKey, S: bytemuck::Pod + Send + Sync> Storage<K, S> for Inline {
    type Table = inline::InlineTable<S, inline::Exact>;
}

impl<K: Hash, S: bytemuck::Pod + Send + Sync> Storage<K, S> for Fingerprint {
    type Table = inline::InlineTable<S, inline::Fingerprinted>;
}

/// What a keyed limiter needs of its table: every storage implements it once, and
/// the limiter (and with it plans and composites) is written once over it.
#[doc(hidden)]
pub trait KeyTable<K, S>: Send + Sync + Sized {
    /// Bytes of one slot.
    const SLOT_BYTES: usize;
    /// Heap bytes one live key takes outside its slot (before allocator overhead).
    const ENTRY_BYTES: usize;

    /// A table for `capacity` keys over `shards` shards (a power of two ≤ capacity),
    /// hashing with `seed` if given ([`table_hasher`]).
    fn build(capacity: usize, shards: usize, seed: Option<u64>) -> Self;

    /// Decides `cost` at `now` for `key`, inserting the key if it must store a state;
    /// only a charge (an [`Outcome`] with `RECEIPT`) reads what its receipt compares.
    fn decide<O, Q, A>(&self, algorithm: &A, key: &Q, now: Nanos, cost: u32) -> O
    where
        O: Outcome<S>,
        Q: Lookup<K> + ?Sized,
        A: Algorithm<State = S> + ?Sized;

    /// Exactly what `decide` would decide now; writes nothing and inserts nothing.
    fn peek<Q, A>(&self, algorithm: &A, key: &Q, now: Nanos, cost: u32) -> Decision
    where
        Q: Lookup<K> + ?Sized,
        A: Algorithm<State = S> + ?Sized;

    /// Gives back what `charge` (made on `key` at removal generation `generation`,
    /// with the shard's refund ledger at `noted`) still provably holds, judged at
    /// `now()` read after the state is loaded. Refunds in a shard are serialised by
    /// its lock. Nothing if the shard has removed any key since the charge: the key's
    /// state may be a re-created one that the charge never touched.
    fn refund<Q, A>(
        &self,
        algorithm: &A,
        key: &Q,
        generation: u64,
        noted: u64,
        charge: &Charged<S>,
        now: &dyn Fn() -> Nanos,
    ) -> bool
    where
        Q: Lookup<K> + ?Sized,
        A: Algorithm<State = S> + ?Sized;

    /// The tag receipts carry for `key`.
    fn tag_of<Q: Lookup<K> + ?Sized>(&self, key: &Q) -> u64;

    /// Reclaims every idle key now (a full sweep under each shard's lock).
    fn reclaim_idle<A: Algorithm<State = S> + ?Sized>(&self, algorithm: &A, now: Nanos) -> usize;

    /// Removes `key` whatever its state, as reclamation removes an idle key (see
    /// [`remove_at`]): judged at `now`. Returns whether the key was present.
    fn remove<Q, A>(&self, algorithm: &A, key: &Q, now: Nanos) -> bool
    where
        Q: Lookup<K> + ?Sized,
        A: Algorithm<State = S> + ?Sized;

    /// Replaces every live key's state `s` with `f(s, now)`, `now` clamped to its
    /// shard's latest removal instant. `&mut self`: no decision runs meanwhile.
    fn replace_states(&mut self, now: Nanos, f: impl FnMut(S, Nanos) -> S);

    /// Writer-side counters summed over shards.
    fn counts(&self) -> TableCounts;

    /// Keys the table holds at most.
    fn capacity(&self) -> usize;

    /// Number of shards.
    fn shard_count(&self) -> usize;

    /// Slots over all shards.
    fn slot_count(&self) -> usize;
}

/// The [`KeyTable`] methods a table answers from its [`ShardSet`] alone (the field
/// named by `field`), for the state type `state`: written once, expanded in each
/// table's impl.
macro_rules! shard_set_methods {
    (state: $state:ty, field: $set:ident) => {
        fn reclaim_idle<A>(&self, algorithm: &A, now: $crate::clock::Nanos) -> usize
        where
            A: $crate::algorithm::Algorithm<State = $state> + ?Sized,
        {
            self.$set.reclaim_idle(algorithm, now)
        }

        fn replace_states(
            &mut self,
            now: $crate::clock::Nanos,
            f: impl FnMut($state, $crate::clock::Nanos) -> $state,
        ) {
            self.$set.replace_states(now, f);
        }

        fn counts(&self) -> $crate::keyed::storage::TableCounts {
            self.$set.counts()
        }

        fn capacity(&self) -> usize {
            self.$set.capacity()
        }

        fn shard_count(&self) -> usize {
            self.$set.shard_count()
        }

        fn slot_count(&self) -> usize {
            self.$set.slot_count()
        }
    };
}
use shard_set_methods;

/// How many slots the reclamation hand inspects per insert once a shard passes its
/// share.
const SWEEP_STEP: usize = 4;

/// How many live keys an eviction compares before evicting the closest to idle.
const EVICTION_SAMPLE: usize = 8;

/// Samples an eviction tries when racing decisions change its victims (see
/// [`evict_one`]).
const EVICTION_ATTEMPTS: usize = 4;

/// A full look for idle keys (one pass over a shard's slots) is paid for by
/// `share / FULL_LOOK_SPACING` removals (at least one): the idle keys it reclaimed
/// and the live evictions after it. See [`evict_sampled`].
const FULL_LOOK_SPACING: usize = 8;

/// The removals that pay for a full look in a shard of `share` keys.
fn full_look_credit(share: usize) -> usize {
    (share / FULL_LOOK_SPACING).max(1)
}

/// The reserved *dead* state: all bits set.
pub(crate) fn dead<S: bytemuck::Pod>() -> S {
    let mut s: S = bytemuck::Zeroable::zeroed();
    bytemuck::bytes_of_mut(&mut s).fill(0xFF);
    s
}

pub(crate) fn is_dead<S: bytemuck::Pod>(s: &S) -> bool {
    bytemuck::bytes_of(s).iter().all(|b| *b == 0xFF)
}

/// Writer-side bookkeeping, only touched under the shard's mutex.
pub(crate) struct Writer {
    pub(crate) live: usize,
    /// The reclamation hand: the next slot to inspect (it moves [`Shard::stride`]
    /// slots at a step).
    pub(crate) hand: usize,
    /// Live evictions still to make before the next full look for idle keys is due
    /// (0: due). See [`evict_sampled`].
    pub(crate) look_in: usize,
    /// The shard's latest refunds, so that a refund's shift counts only its own
    /// key's (see [`RefundLedger`]).
    pub(crate) recent: RecentRefunds,
}

pub(crate) struct WriteSide {
    pub(crate) lock: Mutex<Writer>,
    /// Counters written only under `lock`, read lock-free by metrics.
    pub(crate) live: AtomicU64,
    pub(crate) reclaimed: AtomicU64,
    pub(crate) evicted: AtomicU64,
    pub(crate) removed: AtomicU64,
    /// Full looks for idle keys made before an eviction (unit tests and the loom
    /// models count them).
    #[cfg(any(test, loom))]
    pub(crate) full_looks: AtomicU64,
}

impl WriteSide {
    pub(crate) fn new() -> CachePadded<Self> {
        CachePadded::new(WriteSide {
            lock: Mutex::new(Writer {
                live: 0,
                hand: 0,
                // The first eviction looks at the whole shard first.
                look_in: 0,
                // The ledger beside it starts at 0.
                recent: RecentRefunds::starting_at(0),
            }),
            live: AtomicU64::new(0),
            reclaimed: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            removed: AtomicU64::new(0),
            #[cfg(any(test, loom))]
            full_looks: AtomicU64::new(0),
        })
    }

    /// Records `live` keys (under `lock`).
    pub(crate) fn set_live(&self, writer: &Writer) {
        self.live.store(writer.live as u64, Ordering::Relaxed);
    }
}

/// The removals a shard has made: how many (the generation a refund receipt
/// compares, so that a refund never lands on a re-created entry) and the latest
/// instant one was judged at (every decision in the shard is made at
/// `max(reading, that instant)`, so a reading taken before a removal never finds a
/// fresh key where the removed state would have denied). Written under the shard
/// lock, read lock-free on the hot path: it sits on the readers' line beside the
/// sequence number, which every removal writes anyway.
pub(crate) struct Removals {
    generation: AtomicU64,
    at: AtomicU64,
    /// What refunds in this shard gave back (serialised by the shard lock; the
    /// record of the latest ones, [`Writer::recent`], lives under that lock).
    pub(crate) ledger: RefundLedger,
}

impl Removals {
    pub(crate) fn new() -> Removals {
        Removals {
            generation: AtomicU64::new(0),
            at: AtomicU64::new(0),
            ledger: RefundLedger::new(),
        }
    }

    /// `now`, or the latest removal instant if that is later.
    #[inline(always)]
    pub(crate) fn clamp(&self, now: Nanos) -> Nanos {
        // Relaxed: a stale value is read only by a decision on a live entry (whose
        // state was not removed); a miss re-reads it under the lock, which orders it
        // after every removal.
        now.max(Nanos::new(self.at.load(Ordering::Relaxed)))
    }

    /// How many removals the shard has made. Relaxed: a reader that found an entry
    /// through an Acquire load of its slot sees every removal made before that
    /// entry was linked (they were made under the lock the inserter held later).
    #[inline(always)]
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// What a charge's receipt compares, read before the probe: the generation and
    /// the ledger's note for an outcome that carries a receipt, nothing (zeros) for a
    /// bare decision. A removal of the key the probe then finds happens after this
    /// read, so a refund sees the generation move.
    #[inline(always)]
    pub(crate) fn before_probe<O: Outcome<S>, S>(&self) -> (u64, u64) {
        if O::RECEIPT {
            (self.generation(), self.ledger.note())
        } else {
            (0, 0)
        }
    }

    /// Records a removal judged at `now` (under the shard lock).
    pub(crate) fn record(&self, now: Nanos) {
        let generation = self.generation.load(Ordering::Relaxed);
        self.generation
            .store(generation.wrapping_add(1), Ordering::Relaxed);
        if now.as_u64() > self.at.load(Ordering::Relaxed) {
            self.at.store(now.as_u64(), Ordering::Relaxed);
        }
    }
}

/// A shard's sequence number: odd while a writer moves keys, so that a lock-free
/// probe that missed can tell whether its miss may be spurious (a seqlock). Written
/// under the shard lock.
pub(crate) struct Version(AtomicU64);

impl Version {
    fn new() -> Version {
        Version(AtomicU64::new(0))
    }

    /// The number before a probe. Acquire: pairs with the writer's final Release
    /// store, so a probe that starts on an even number sees every move before it (and
    /// every removal instant recorded before the moves).
    #[inline(always)]
    pub(crate) fn begin(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Whether a miss by a probe that began at `before` can be trusted: no writer was
    /// moving keys when it began, and none has started since.
    #[inline(always)]
    pub(crate) fn unchanged(&self, before: u64) -> bool {
        // Acquire fence: if the probe read anything a writer stored after making the
        // number odd, the re-read below sees that odd number.
        fence(Ordering::Acquire);
        let after = self.0.load(Ordering::Relaxed);
        before == after && before % 2 == 0
    }

    /// Whether the number is odd (under the lock).
    pub(crate) fn is_open(&self) -> bool {
        self.0.load(Ordering::Relaxed) % 2 == 1
    }

    /// Makes the number odd (under the lock): a probe that misses from now until
    /// [`close`](Self::close) does not trust its miss.
    pub(crate) fn open(&self) {
        let version = self.0.load(Ordering::Relaxed);
        debug_assert!(version % 2 == 0);
        self.0.store(version.wrapping_add(1), Ordering::Relaxed);
        // Release fence: a reader that reads any store below and then fences with
        // Acquire also reads the odd number (the seqlock protocol).
        fence(Ordering::Release);
    }

    /// Makes the number even again (under the lock).
    pub(crate) fn close(&self) {
        let version = self.0.load(Ordering::Relaxed);
        debug_assert!(version % 2 == 1);
        // Release: a reader that reads this even number sees every store above.
        self.0.store(version.wrapping_add(1), Ordering::Release);
    }
}

/// Sums the counters of `sides` (each read lock-free).
pub(crate) fn sum_counts<'a>(sides: impl Iterator<Item = &'a WriteSide>) -> TableCounts {
    let mut c = TableCounts::default();
    for side in sides {
        // Relaxed: statistics; each counter is written only under its shard lock.
        c.live += side.live.load(Ordering::Relaxed);
        c.reclaimed += side.reclaimed.load(Ordering::Relaxed);
        c.evicted += side.evicted.load(Ordering::Relaxed);
        c.removed += side.removed.load(Ordering::Relaxed);
        #[cfg(any(test, loom))]
        {
            c.full_looks += side.full_looks.load(Ordering::Relaxed);
        }
    }
    c
}

/// A shard holds `HEADROOM` keys per empty slot at its full share: a load factor of
/// 3/4. Linear probing's successful lookup reads ½(1 + 1/(1 − α)) slots on average,
/// 2.5 at 3/4 against 4.5 at 7/8: at 10^6 keys, 1.35 cache misses and 254
/// instructions per decision against 1.80 and 294 (callgrind, BENCHMARKS.md), for
/// 16 × 4/3 ≈ 21.3 bytes per key instead of 18.3.
pub(crate) const HEADROOM: usize = 3;

/// A table filled with exactly `capacity` keys overflows a shard's share with a
/// chance below 2^-`OVERFLOW_BITS` (see [`shard_size`]).
pub(crate) const OVERFLOW_BITS: u32 = 40;

/// Slots per shard and each shard's share of the key capacity, for `capacity` keys
/// over `shards` shards.
///
/// Keys do not spread evenly: the keys of one shard are binomial around its share.
/// Each shard holds [`overflow_slack`] keys beyond it, so that `capacity` keys fit
/// without evicting a live one in a crowded shard, except with a chance below
/// 2^-[`OVERFLOW_BITS`] per table filled (over every shard at once). Load factor
/// ≤ 3/4 (one slot in [`HEADROOM`] + 1 stays empty), so always at least one empty
/// slot and probes end.
pub(crate) fn shard_size(capacity: usize, shards: usize) -> (usize, usize) {
    debug_assert!(shards.is_power_of_two() && shards <= capacity);
    let share = capacity.div_ceil(shards);
    let per_shard = if shards == 1 {
        share
    } else {
        share.saturating_add(overflow_slack(share, shards))
    };
    (
        per_shard,
        per_shard.saturating_add(per_shard.div_ceil(HEADROOM)),
    )
}

/// The keys a shard holds beyond its `share` when a table has `shards` shards (a
/// power of two above 1).
///
/// The keys landing in one shard, out of `capacity` hashed at random, are a sum of
/// independent indicators with mean and variance at most μ = `share`. Bernstein's
/// inequality bounds the chance that they pass μ by `t`:
///
/// ```text
/// P(X ≥ μ + t) ≤ exp(−t² / (2(μ + t/3)))
/// ```
///
/// and the union bound over the shards keeps the chance that any of them does below
/// 2^-40 when `shards · exp(…) ≤ 2^-40`, that is for
///
/// ```text
/// t = L/3 + √(L²/9 + 2Lμ),   L = ln(shards · 2^40) = (log₂ shards + 40) · ln 2.
/// ```
///
/// About 2.2 % of the share at 125 000 keys per shard (8 shards of 10^6 keys), 23 %
/// at 1 250, and 1.9× a share of 35 (65 536 shards). Computed in integers: `l` is
/// 1000·L rounded up, and 3000·t = l + √(l² + 18 000·l·μ).
pub(crate) fn overflow_slack(share: usize, shards: usize) -> usize {
    debug_assert!(shards.is_power_of_two() && shards > 1);
    // ln 2 < 0.694.
    let l = 694 * (u128::from(shards.trailing_zeros()) + u128::from(OVERFLOW_BITS));
    let mu = share as u128;
    let root = isqrt(l * l + 18_000 * l * mu) + 1;
    usize::try_from((l + root).div_ceil(3000)).unwrap_or(usize::MAX)
}

/// The shard of `hash`: its high bits (`>> 1 >> (63 − bits)` is 0 for one shard).
#[inline(always)]
pub(crate) fn shard_index(hash: u64, shard_bits: u32) -> usize {
    ((hash >> 1) >> (63 - shard_bits)) as usize
}

/// The home slot of `hash` among `len`: multiply-shift (any slot count works) over
/// the bits below the shard bits.
#[inline(always)]
pub(crate) fn home_slot(hash: u64, shard_bits: u32, len: usize) -> usize {
    let spread = hash << shard_bits;
    ((u128::from(spread) * len as u128) >> 64) as usize
}

/// The slot `stride` (≤ `len`) after `i` among `len`, wrapping.
#[inline(always)]
fn stride_slot(i: usize, stride: usize, len: usize) -> usize {
    let j = i + stride;
    if j >= len {
        j - len
    } else {
        j
    }
}

/// The step between the slots the reclamation hand inspects in a shard of `len`
/// slots: the `s` with `s · c ≡ 1 (mod len)` for `c` the integer coprime to `len`
/// nearest above `len / φ²` (φ the golden ratio). Slot `i` is then met at step
/// `i · c mod len` of the hand's round: every slot once a round, and neighbouring
/// slots at times spread evenly over it (the golden ratio's multiples), so the keys
/// the hand has just reclaimed and those it will reach last are scattered through
/// the shard, not gathered ahead of the hand into one run that every insert and
/// every removal then walks (BENCHMARKS.md, "The churn insert, counted").
pub(crate) fn hand_stride(len: usize) -> usize {
    if len <= 2 {
        return 1;
    }
    // len / φ² ≈ len · 0.381966.
    let mut c = ((len as u128 * 381_966) / 1_000_000) as usize;
    c = c.max(1);
    while gcd(c, len) != 1 {
        c += 1;
    }
    // The inverse of c modulo len (extended Euclid).
    let (mut r0, mut r1) = (len as i128, c as i128);
    let (mut t0, mut t1) = (0i128, 1i128);
    while r1 != 0 {
        let q = r0 / r1;
        (r0, r1) = (r1, r0 - q * r1);
        (t0, t1) = (t1, t0 - q * t1);
    }
    usize::try_from(t0.rem_euclid(len as i128)).unwrap_or(1)
}

fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The slot after `i` among `len`, wrapping.
#[inline(always)]
pub(crate) fn next_slot(i: usize, len: usize) -> usize {
    if i + 1 == len {
        0
    } else {
        i + 1
    }
}

/// A storage's slot type, as the shared shard code sees it. Every method runs with
/// the shard lock held: those that read a key's state take the lock's [`Writer`] as
/// the proof (the heap storage frees entries only under that lock).
pub(crate) trait Slots: Sized {
    /// The state word type.
    type State: bytemuck::Pod;
    /// What else a shard of these slots keeps (the inline storage: the table's
    /// hasher, which finds a moved key's home).
    type Extra;
    /// Whether no key is in this slot.
    fn is_empty(&self) -> bool;
    /// The state of the key in this slot, or `None` when it is empty; `held`: its
    /// shard's lock.
    fn state(&self, held: &Writer) -> Option<Self::State>;
    /// Stores `state` for the key in this slot (occupied), while no decision runs
    /// (the table is borrowed mutably); `held`: its shard's lock. `state` is never
    /// the dead word.
    fn set_state(&mut self, held: &Writer, state: Self::State);
    /// Retires the state of the key in slot `i` of `shard` as `judge` (see
    /// [`judge`]) says of it; `None` when the slot is empty. `held`: the shard's
    /// lock.
    fn retire_at(
        shard: &Shard<Self>,
        held: &Writer,
        i: usize,
        judge: impl FnMut(Self::State) -> (Retired, bool),
    ) -> Option<Retired>;
    /// Unlinks the (retired) key in slot `i` of `shard`.
    fn unlink(shard: &Shard<Self>, writer: &mut Writer, i: usize);
}

/// One shard: a storage's slot array and what every storage keeps beside it.
pub(crate) struct Shard<T: Slots> {
    pub(crate) slots: Box<[T]>,
    /// Sequence number: odd while a writer moves keys.
    pub(crate) version: Version,
    /// Removals made (generation, latest instant).
    pub(crate) removals: Removals,
    /// The table's shard bits (the hash bits above the home index).
    shard_bits: u32,
    /// This shard's share of the key capacity.
    share: usize,
    /// How far the reclamation hand moves between the slots it inspects
    /// ([`hand_stride`]).
    pub(crate) stride: usize,
    /// What else the storage keeps per shard.
    pub(crate) extra: T::Extra,
    /// The write side, on its own cache line: inserting a key never disturbs the
    /// line readers load `slots` and `version` from.
    pub(crate) write: CachePadded<WriteSide>,
}

impl<T: Slots> Shard<T> {
    /// The home slot of `hash`: multiply-shift over the bits below the shard bits.
    #[inline(always)]
    pub(crate) fn home(&self, hash: u64) -> usize {
        home_slot(hash, self.shard_bits, self.slots.len())
    }

    /// The slot after `i`, wrapping.
    #[inline(always)]
    pub(crate) fn next(&self, i: usize) -> usize {
        next_slot(i, self.slots.len())
    }

    /// The write path, every storage's: under the shard lock, `charge_found` charges
    /// the key at the clamped instant if it is present (under the lock nothing moves
    /// and every key found is live: a writer retires and unlinks within one critical
    /// section); otherwise the key is decided on a fresh state and, if that stores a
    /// state, `insert`ed into the first empty slot from `home`, after making room.
    /// `tag` is what the receipt carries.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn decide_locked<O, A>(
        &self,
        algorithm: &A,
        tag: u64,
        home: usize,
        now: Nanos,
        cost: u32,
        charge_found: impl FnOnce(Nanos) -> Option<(Decision, Option<Charged<T::State>>)>,
        insert: impl FnOnce(&T, T::State),
    ) -> O
    where
        O: Outcome<T::State>,
        A: Algorithm<State = T::State> + ?Sized,
    {
        let mut writer = lock(&self.write.lock);
        // Under the lock every removal so far is visible: judge at or after them.
        let now = self.removals.clamp(now);
        let answer = |decision, charge| {
            O::from_parts(
                decision,
                charge,
                tag,
                self.removals.generation(),
                self.removals.ledger.note(),
            )
        };
        if let Some((decision, charge)) = charge_found(now) {
            return answer(decision, charge);
        }
        let before: T::State = bytemuck::Zeroable::zeroed();
        let (decision, next) = algorithm.decide(before, now, cost);
        // Nothing to store (a denial, cost 0): a fresh key stays out of the table.
        let Some(next) = next else {
            return answer(decision, None);
        };
        if is_dead(&next) {
            return answer(decision.refused(), None);
        }
        make_room(self, &mut writer, algorithm, now);
        // There is always an empty slot: make_room evicts whenever a shard is at its
        // share, and takes its victim whatever it became when the insert would leave
        // fewer than two slots empty. Bounded all the same.
        let mut i = home;
        let mut probes = 0;
        while !self.slots[i].is_empty() {
            i = self.next(i);
            probes += 1;
            if probes == self.slots.len() {
                return answer(decision.refused(), None);
            }
        }
        insert(&self.slots[i], next);
        writer.live += 1;
        self.write.set_live(&writer);
        // The generation after make_room's removals: the key is new at it.
        answer(
            decision,
            Some(Charged {
                before,
                after: next,
                at: now,
                cost,
            }),
        )
    }

    /// A refund (see [`KeyTable::refund`]) on the state word `find` finds under the
    /// shard lock (`None`: the key is absent). Under the lock nothing moves and
    /// nothing is retired: a word found is the key's one live state word (readers may
    /// still change it). `tag` is the key's tag as receipts carry it
    /// ([`KeyTable::tag_of`]): the ledger's shift counts the refunds of that tag
    /// only, when it can tell (see [`RefundLedger`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn refund<A, W>(
        &self,
        algorithm: &A,
        tag: u64,
        generation: u64,
        noted: u64,
        charge: &Charged<T::State>,
        now: &dyn Fn() -> Nanos,
        find: impl FnOnce() -> Option<W>,
    ) -> bool
    where
        A: Algorithm<State = T::State> + ?Sized,
        W: CasWord<Value = T::State>,
    {
        let mut writer = lock(&self.write.lock);
        let removals = &self.removals;
        if removals.generation() != generation {
            return false;
        }
        let Some(word) = find() else {
            return false;
        };
        let recent = &mut writer.recent;
        removals.ledger.settle(recent, tag, noted, |shift| {
            refund_word(
                algorithm,
                &word,
                charge,
                shift,
                || removals.clamp(now()),
                |s| !is_dead(s),
            )
        })
    }
}

/// Which keys a removal takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Take {
    /// Idle keys only: reclamation.
    Idle,
    /// An eviction's victim, ranked [`forgiven`] as this: taken if idle, or if its
    /// state forgives no more now. A decision that made it heavier since it was
    /// ranked — or a hot-key promotion that sealed it, the heaviest of words — keeps
    /// it: the shard lock orders removals, not the lock-free CASes on states.
    Victim((u64, u64)),
    /// Whatever its state: a user's `remove` or `reset`.
    Any,
}

/// Whether to retire `state`: the outcome, and whether to write the dead word.
pub(crate) fn judge<A>(algorithm: &A, state: A::State, now: Nanos, take: Take) -> (Retired, bool)
where
    A: Algorithm + ?Sized,
{
    let idle = algorithm.is_idle(state, now);
    let keep = match take {
        Take::Idle => !idle,
        Take::Victim(ranked) => !idle && forgiven(algorithm, state, now) > ranked,
        Take::Any => false,
    };
    if keep {
        return (Retired::Kept, false);
    }
    (if idle { Retired::Idle } else { Retired::Live }, true)
}

/// Writer-side counters of a table, summed over shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableCounts {
    pub(crate) live: u64,
    pub(crate) reclaimed: u64,
    pub(crate) evicted: u64,
    pub(crate) removed: u64,
    /// Full looks for idle keys made before an eviction.
    #[cfg(any(test, loom))]
    pub(crate) full_looks: u64,
}

/// Which of a table's hashers [`table_hasher`] makes: one seed gives each its own keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Salt {
    /// The hasher that picks a key's shard and home slot.
    Table,
    /// The inline table's 64-bit fingerprints of keys.
    Fingerprint,
    /// The hot-key limiter's sampling of keys.
    HotSample,
    /// The hash map of the keyed log's shard `n`.
    LogShard(u64),
}

/// A table's hasher: from `seed` when the builder fixed one
/// ([`KeyedBuilder::hash_seed`](crate::KeyedBuilder::hash_seed)), the same in every
/// process running the same build; otherwise from random per-table seeds (HashDoS resistance: no client can
/// predict which keys share a probe run), or fixed under loom, whose exploration must
/// be deterministic.
pub(crate) fn table_hasher(seed: Option<u64>, salt: Salt) -> ahash::RandomState {
    let salt = match salt {
        Salt::Table => 0,
        Salt::Fingerprint => 1,
        Salt::HotSample => 2,
        Salt::LogShard(n) => 3 + n,
    };
    match seed {
        Some(seed) => {
            // splitmix64 from the seed and salt: four well-mixed, distinct keys.
            let mut x = seed ^ salt.wrapping_mul(0xA076_1D64_78BD_642F);
            let mut next = || {
                x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = x;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^ (z >> 31)
            };
            ahash::RandomState::with_seeds(next(), next(), next(), next())
        }
        #[cfg(not(loom))]
        None => ahash::RandomState::new(),
        #[cfg(loom)]
        None => {
            ahash::RandomState::with_seeds(1 + 4 * salt, 2 + 4 * salt, 3 + 4 * salt, 4 + 4 * salt)
        }
    }
}

/// A table's shards and the hasher that spreads keys over them.
pub(crate) struct ShardSet<T: Slots> {
    pub(crate) shards: Box<[CachePadded<Shard<T>>]>,
    shard_bits: u32,
    hasher: ahash::RandomState,
}

impl<T: Slots> ShardSet<T> {
    /// `shards` shards (a power of two ≤ `capacity`), each with the slot array and
    /// extra that `make` gives for its slot count and the table's hasher.
    pub(crate) fn new(
        capacity: usize,
        shards: usize,
        seed: Option<u64>,
        make: impl Fn(usize, &ahash::RandomState) -> (Box<[T]>, T::Extra),
    ) -> Self {
        let (share, slot_count) = shard_size(capacity, shards);
        let shard_bits = shards.trailing_zeros();
        let hasher = table_hasher(seed, Salt::Table);
        let shards = (0..shards)
            .map(|_| {
                let (slots, extra) = make(slot_count, &hasher);
                CachePadded::new(Shard {
                    slots,
                    version: Version::new(),
                    removals: Removals::new(),
                    shard_bits,
                    share,
                    stride: hand_stride(slot_count),
                    extra,
                    write: WriteSide::new(),
                })
            })
            .collect();
        ShardSet {
            shards,
            shard_bits,
            hasher,
        }
    }

    /// The shard of `key` and the key's hash.
    #[inline(always)]
    pub(crate) fn locate<Q: Hash + ?Sized>(&self, key: &Q) -> (&Shard<T>, u64) {
        let hash = self.hasher.hash_one(key);
        (&self.shards[shard_index(hash, self.shard_bits)], hash)
    }

    /// Number of shards.
    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Keys the table holds at most.
    pub(crate) fn capacity(&self) -> usize {
        self.shards.iter().map(|s| s.share).sum()
    }

    /// Slots over all shards.
    pub(crate) fn slot_count(&self) -> usize {
        self.shards.iter().map(|s| s.slots.len()).sum()
    }

    /// Counters summed over shards (each read lock-free).
    pub(crate) fn counts(&self) -> TableCounts {
        sum_counts(self.shards.iter().map(|s| &*s.write))
    }

    /// Reclaims every idle key now (a full sweep under each shard's lock).
    pub(crate) fn reclaim_idle<A>(&self, algorithm: &A, now: Nanos) -> usize
    where
        A: Algorithm<State = T::State> + ?Sized,
    {
        self.shards
            .iter()
            .map(|shard| reclaim_shard(&**shard, algorithm, now))
            .sum()
    }

    /// Replaces every live key's state `s` with `f(s, now)`, `now` clamped to its
    /// shard's latest removal instant (no decision runs: `&mut self`).
    ///
    /// A replacement that would be the dead word (which no algorithm may store;
    /// none of this crate's `carry_over`s returns it) stores the fresh state instead.
    pub(crate) fn replace_states(
        &mut self,
        now: Nanos,
        mut f: impl FnMut(T::State, Nanos) -> T::State,
    ) {
        for shard in self.shards.iter_mut() {
            let shard: &mut Shard<T> = shard;
            let now = shard.removals.clamp(now);
            // Uncontended (`&mut self`); held as the slots' proof of the lock.
            let held = lock(&shard.write.lock);
            for slot in shard.slots.iter_mut() {
                if let Some(state) = slot.state(&held) {
                    let next = f(state, now);
                    let next = if is_dead(&next) {
                        bytemuck::Zeroable::zeroed()
                    } else {
                        next
                    };
                    slot.set_state(&held, next);
                }
            }
        }
    }
}

/// How a removal went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retired {
    /// The key was idle: nothing lost.
    Idle,
    /// The key was live: its state is lost (an eviction).
    Live,
    /// Not retired (it was not idle and only idle keys were wanted).
    Kept,
}

/// What a table's `decide` returns: the bare [`Decision`] (a check: nothing else is
/// read or carried) or a [`KeyedCharge`] (a charge: what its receipt compares).
#[doc(hidden)]
pub trait Outcome<S>: Sized {
    /// Whether the receipt's parts are read (the removal generation and ledger note
    /// before the probe).
    const RECEIPT: bool;
    /// The outcome from a decision and what a receipt would carry.
    fn from_parts(
        decision: Decision,
        charge: Option<Charged<S>>,
        tag: u64,
        generation: u64,
        noted: u64,
    ) -> Self;

    /// The outcome from a whole [`KeyedCharge`] (the locked path's answer).
    #[inline(always)]
    fn from_charge(c: KeyedCharge<S>) -> Self {
        Self::from_parts(c.decision, c.charge, c.tag, c.generation, c.noted)
    }
}

impl<S> Outcome<S> for Decision {
    const RECEIPT: bool = false;

    #[inline(always)]
    fn from_parts(decision: Decision, _: Option<Charged<S>>, _: u64, _: u64, _: u64) -> Self {
        decision
    }
}

impl<S> Outcome<S> for KeyedCharge<S> {
    const RECEIPT: bool = true;

    #[inline(always)]
    fn from_parts(
        decision: Decision,
        charge: Option<Charged<S>>,
        tag: u64,
        generation: u64,
        noted: u64,
    ) -> Self {
        KeyedCharge {
            decision,
            charge,
            tag,
            generation,
            noted,
        }
    }
}

/// A keyed decision, what it wrote, and what a refund of it must compare.
pub struct KeyedCharge<S> {
    pub(crate) decision: Decision,
    /// What the admission wrote (`None`: nothing).
    pub(crate) charge: Option<Charged<S>>,
    /// The key's tag as receipts carry it (see [`KeyTable::tag_of`]).
    pub(crate) tag: u64,
    /// The shard's removal generation when the charged entry was known live.
    pub(crate) generation: u64,
    /// The shard's refund ledger before the charge's CAS.
    pub(crate) noted: u64,
}

/// Reclaims every idle key of one shard (a full sweep under its lock).
pub(crate) fn reclaim_shard<T, A>(shard: &Shard<T>, algorithm: &A, now: Nanos) -> usize
where
    T: Slots,
    A: Algorithm<State = T::State> + ?Sized,
{
    let mut writer = lock(&shard.write.lock);
    let before = shard.write.reclaimed.load(Ordering::Relaxed);
    let start = writer.hand;
    writer.hand = 0;
    sweep(shard, &mut writer, algorithm, now, Walk::Whole);
    writer.hand = start % shard.slots.len();
    (shard.write.reclaimed.load(Ordering::Relaxed) - before) as usize
}

/// Makes room for one more key. Below the shard's share (which includes the
/// headroom for uneven hashing) nothing is removed: a table holds its capacity of
/// keys, idle or not, without reclaiming or re-inserting any. At the share, the hand
/// reclaims the idle keys it passes; if none of them was idle, the shard is searched
/// for idle keys whole when a full look is due ([`evict_sampled`]), and only if that
/// finds none (or none is due) does the key whose loss forgives least of a small
/// sample go. The sample begins where the hand's walk at this insert began: the slots
/// the walk just read, a cache line each, are ranked again from cache, and the sample
/// reads only the slots after them (BENCHMARKS.md, "The eviction's sample,
/// cache-simulated").
pub(crate) fn make_room<T, A>(shard: &Shard<T>, writer: &mut Writer, algorithm: &A, now: Nanos)
where
    T: Slots,
    A: Algorithm<State = T::State> + ?Sized,
{
    if writer.live < shard.share {
        return;
    }
    let walked_from = writer.hand;
    sweep(shard, writer, algorithm, now, Walk::Hand(SWEEP_STEP));
    if writer.live >= shard.share {
        // The sample begins where the walk did: the slots it just read are in cache.
        writer.hand = walked_from;
        evict_one(shard, writer, algorithm, now);
    }
}

/// How far a [`sweep`] moves the hand.
#[derive(Clone, Copy)]
enum Walk {
    /// Past this many slots, [`Shard::stride`] apart: the hand's steps at an insert.
    Hand(usize),
    /// Past every slot, one at a time, back to where it began: a full pass. One slot
    /// at a time, because a key that backward shifting moves lands in the slot just
    /// emptied (inspected again) or in a slot between it and the key's old one, not
    /// yet passed: the pass meets every key. Steps `stride` apart could move a key
    /// they have not met into a slot they have passed.
    Whole,
}

/// Moves the hand as `walk` says, reclaiming the idle keys it meets.
fn sweep<T, A>(shard: &Shard<T>, writer: &mut Writer, algorithm: &A, now: Nanos, walk: Walk)
where
    T: Slots,
    A: Algorithm<State = T::State> + ?Sized,
{
    let (steps, stride) = match walk {
        Walk::Hand(steps) => (steps, shard.stride),
        Walk::Whole => (shard.slots.len(), 1),
    };
    // Count slots the hand moves past, not iterations: after a removal a later key
    // may have shifted into the same slot, which is inspected again.
    let mut advanced = 0;
    while advanced < steps {
        let i = writer.hand;
        if take(shard, writer, algorithm, i, now, Take::Idle) == Some(Retired::Idle) {
            // A later key may shift into `i`: look at it next.
            shard.write.reclaimed.fetch_add(1, Ordering::Relaxed);
        } else {
            writer.hand = stride_slot(i, stride, shard.slots.len());
            advanced += 1;
        }
    }
}

/// Removes one key: the first idle one met, else every idle key of the shard when a
/// full look is due, else the closest to idle of a sample ([`evict_sampled`]).
///
/// The victim is taken only if it forgives no more than when it was ranked
/// ([`Take::Victim`]): a decision or a hot-key seal may change it meanwhile, since
/// they CAS without the shard lock. Then the next slots are sampled, up to
/// [`EVICTION_ATTEMPTS`] times; past that the insert goes ahead over the share
/// (into the headroom), and the next insert evicts — unless the shard is one key
/// short of its last empty slot, where the victim is taken whatever it became.
fn evict_one<T, A>(shard: &Shard<T>, writer: &mut Writer, algorithm: &A, now: Nanos)
where
    T: Slots,
    A: Algorithm<State = T::State> + ?Sized,
{
    for _ in 0..EVICTION_ATTEMPTS {
        match evict_sampled(shard, writer, algorithm, now) {
            Some(Retired::Kept) => continue,
            _ => return,
        }
    }
}

/// One eviction attempt: `Some(Kept)` when the victim changed after it was ranked.
///
/// From the hand (where [`make_room`]'s walk at this insert began), stepping as it does
/// ([`Shard::stride`] slots apart), the first idle key met is reclaimed; otherwise the
/// first [`EVICTION_SAMPLE`] live keys met are ranked. Before one of them is evicted,
/// if a *full look* is due, one pass over every slot of the shard (a [`sweep`] one slot
/// at a time from the hand, under the same lock) reclaims every idle key; if it
/// reclaimed any, no live key goes. A full look costs one pass over the slots (≈ 4/3 of
/// the share); it is due again once it is paid for by [`full_look_credit`]
/// (`⌊share / 8⌋`, at least 1) removals: the idle keys it reclaimed, then the live
/// evictions after it. So a look that reclaims that many keys leaves the next one due at once, one that
/// reclaims none defers it by `⌊share / 8⌋` evictions, and under a flood of unique live
/// keys an insert inspects ≈ 8 × 4/3 ≈ 11 more slots, amortized.
///
/// The rule, then: a live key is evicted only when the hand's walk met no idle key
/// and either a full look at this insert's instant found none, or the shard's last
/// full look reclaimed `r` idle keys and `e` live keys have been evicted since, with
/// `r + e` below the credit. With one thread, in shards of fewer than 16 keys
/// (credit 1), every live eviction follows a look at its own insert that found
/// nothing (with racing decisions, an eviction whose victims all changed after such
/// a look leaves the next insert to evict without one). A walk that met every slot
/// (fewer live keys than the sample) was a full look itself.
fn evict_sampled<T, A>(
    shard: &Shard<T>,
    writer: &mut Writer,
    algorithm: &A,
    now: Nanos,
) -> Option<Retired>
where
    T: Slots,
    A: Algorithm<State = T::State> + ?Sized,
{
    let side = &shard.write;
    let mut best: Option<((u64, u64), usize)> = None;
    let mut sampled = 0;
    let mut i = writer.hand;
    for _ in 0..shard.slots.len() {
        if let Some(how) = take(shard, writer, algorithm, i, now, Take::Idle) {
            if how == Retired::Idle {
                side.reclaimed.fetch_add(1, Ordering::Relaxed);
                writer.hand = i;
                return Some(how);
            }
            // Live (or made live by a racing decision): a candidate. The victim is
            // the key whose loss forgives least: the fewest units in use now
            // (`limit − remaining`: what a fresh state would hand back at once), then
            // the least time until the state is fresh again.
            if let Some(state) = shard.slots[i].state(writer) {
                let loss = forgiven(algorithm, state, now);
                if best.is_none_or(|(b, _)| loss < b) {
                    best = Some((loss, i));
                }
            }
            sampled += 1;
            if sampled == EVICTION_SAMPLE {
                break;
            }
        }
        i = stride_slot(i, shard.stride, shard.slots.len());
    }
    let (loss, victim) = best?;
    if sampled == EVICTION_SAMPLE && writer.look_in == 0 {
        // The walk stopped short of the whole shard: look at all of it for idle keys
        // first. A pass that reclaims nothing moves no key, so `victim` and `i` stay.
        #[cfg(any(test, loom))]
        side.full_looks.fetch_add(1, Ordering::Relaxed);
        let before = side.reclaimed.load(Ordering::Relaxed);
        sweep(shard, writer, algorithm, now, Walk::Whole);
        let found = side.reclaimed.load(Ordering::Relaxed) - before;
        let found = usize::try_from(found).unwrap_or(usize::MAX);
        writer.look_in = full_look_credit(shard.share).saturating_sub(found);
        if found > 0 {
            return Some(Retired::Idle);
        }
    }
    // The last empty slot keeps probes finite: never insert into it.
    let rule = if writer.live + 2 >= shard.slots.len() {
        Take::Any
    } else {
        Take::Victim(loss)
    };
    let how = take(shard, writer, algorithm, victim, now, rule)?;
    match how {
        Retired::Idle => {
            side.reclaimed.fetch_add(1, Ordering::Relaxed);
        }
        Retired::Live => {
            side.evicted.fetch_add(1, Ordering::Relaxed);
            writer.look_in = writer.look_in.saturating_sub(1);
        }
        Retired::Kept => {}
    }
    writer.hand = stride_slot(i, shard.stride, shard.slots.len());
    Some(how)
}

/// Takes the key in slot `i` out of its shard (under the shard lock `writer`
/// guards), the one way every removal goes — reclamation, eviction and
/// [`remove_at`]: retire its state (a CAS to the dead word, if `rule` takes it),
/// record the removal judged at `now` (the generation moves, so a refund receipt for
/// a key of this shard gives back nothing; every later decision in the shard is made
/// at `max(reading, now)`), and unlink it. `None` when `i` is empty;
/// [`Retired::Kept`] when `rule` kept the key (nothing changed).
fn take<T, A>(
    shard: &Shard<T>,
    writer: &mut Writer,
    algorithm: &A,
    i: usize,
    now: Nanos,
    rule: Take,
) -> Option<Retired>
where
    T: Slots,
    A: Algorithm<State = T::State> + ?Sized,
{
    let how = T::retire_at(shard, writer, i, |state| judge(algorithm, state, now, rule))?;
    if how != Retired::Kept {
        shard.removals.record(now);
        T::unlink(shard, writer, i);
    }
    Some(how)
}

/// Removes the key a storage found in slot `i` of `shard` (its lookup under the
/// lock; `None`: absent), whatever its state, judged at `now`: a user's
/// `remove(key)` or `reset(key)`. Returns whether the key was present.
///
/// A decision racing the removal is ordered before it (its CAS landed first: the
/// retirement takes the state it left) or after it (its CAS meets the dead word and
/// it retries on the locked path, which sees the removal): it then finds no key and
/// is judged at `max(reading, now)` on a fresh state, never at an earlier reading.
pub(crate) fn remove_at<T, A>(
    shard: &Shard<T>,
    algorithm: &A,
    now: Nanos,
    find: impl FnOnce(&Shard<T>) -> Option<usize>,
) -> bool
where
    T: Slots,
    A: Algorithm<State = T::State> + ?Sized,
{
    let mut writer = lock(&shard.write.lock);
    let Some(i) = find(shard) else {
        return false;
    };
    if take(shard, &mut writer, algorithm, i, now, Take::Any).is_none() {
        return false;
    }
    shard.write.removed.fetch_add(1, Ordering::Relaxed);
    true
}

/// What forgetting `state` at `now` would forgive, as an order: the units in use
/// (`limit − remaining`), then the time until the state is fresh again. Eviction
/// takes the least of its sample.
pub(crate) fn forgiven<A>(algorithm: &A, state: A::State, now: Nanos) -> (u64, u64)
where
    A: Algorithm + ?Sized,
{
    let view = algorithm.decide(state, now, 0).0;
    (
        view.limit().saturating_sub(view.remaining()),
        view.reset_after_nanos(),
    )
}

/// ⌊√n⌋ by Newton's method (no floating point).
fn isqrt(n: u128) -> u128 {
    if n < 2 {
        return n;
    }
    let mut x = n;
    let mut y = x.div_ceil(2);
    while y < x {
        x = y;
        y = (x + n / x) / 2;
    }
    x
}

/// The decision `check` would take on `state`, without writing: a transition to the
/// dead word is refused there, so it is refused here too.
#[inline(always)]
pub(crate) fn decide_unwritten<A>(algorithm: &A, state: A::State, now: Nanos, cost: u32) -> Decision
where
    A: Algorithm + ?Sized,
{
    match algorithm.decide(state, now, cost) {
        (decision, Some(next)) if is_dead(&next) => decision.refused(),
        (decision, _) => decision,
    }
}

/// The dead-word guard, shared by every storage: runs the decision on a key's state
/// word (last seen holding `seen`) unless it is dead; `None` when it is (the key is
/// being removed, or — for inline slots — the slot holds another key now). A
/// transition that would store the dead word is refused instead. Also returns what
/// the admission wrote.
#[inline(always)]
pub(crate) fn charge_live<A, W>(
    algorithm: &A,
    word: &W,
    seen: A::State,
    now: Nanos,
    cost: u32,
) -> Option<(Decision, Option<Charged<A::State>>)>
where
    A: Algorithm + ?Sized,
    W: CasWord<Value = A::State> + ?Sized,
{
    // Release: see `RefundLedger` (a refund that sees this state sees the ledger
    // as the charge noted it).
    update_word_from_ordered(word, seen, Ordering::Release, |before| {
        // One exit, through `in_registers`: an early return of a bare `None` (the dead
        // word) kept the result in memory (BENCHMARKS.md, "The CAS loop's result in
        // registers").
        let (outcome, next) = if is_dead(&before) {
            (None, None)
        } else {
            let (decision, next) = algorithm.decide(before, now, cost);
            match next {
                Some(next) if is_dead(&next) => (Some((decision.refused(), None)), None),
                Some(after) => {
                    let charge = Charged {
                        before,
                        after,
                        at: now,
                        cost,
                    };
                    (Some((decision, Some(charge))), Some(after))
                }
                None => (Some((decision, None)), None),
            }
        };
        (outcome, in_registers(next, before))
    })
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::gcra::{Gcra, GcraState};
    use crate::policy::Policy;
    use crate::sync::Atomic;

    fn gcra() -> Gcra {
        Gcra::new(Policy::per_second(1).unwrap().with_burst(2).unwrap())
    }

    /// `memory_budget`'s docs: a shard's fixed part (beside its slot array) is under
    /// 1 KiB on every storage.
    #[test]
    fn a_shards_fixed_part_is_under_a_kibibyte() {
        use core::mem::size_of;
        assert!(size_of::<CachePadded<Shard<inline::Slot<GcraState>>>>() < 1024);
        assert!(size_of::<CachePadded<Shard<heap::Slot<String, GcraState>>>>() < 1024);
    }

    #[test]
    fn the_dead_word_is_never_stored() {
        assert!(is_dead(&dead::<GcraState>()));
        assert!(!is_dead(&GcraState::from_tat(Nanos::new(u64::MAX - 1))));
        // A transition that would store the dead word is refused instead.
        let word = Atomic::new(GcraState::from_tat(Nanos::new(u64::MAX - 1_000_000_000)));
        let seen = word.load(Ordering::Relaxed);
        let now = Nanos::new(u64::MAX - 1_500_000_000);
        let d = charge_live(&gcra(), &word, seen, now, 1);
        assert!(d.is_some_and(|(d, charge)| !d.is_allowed() && charge.is_none()));
        assert!(!is_dead(&word.load(Ordering::Relaxed)));
        // A dead word is never charged.
        let dead_word = Atomic::new(dead::<GcraState>());
        assert!(charge_live(&gcra(), &dead_word, dead::<GcraState>(), now, 1).is_none());
    }

    /// `remove` on table `T` (one shard, 8 keys of capacity, GCRA 1/s burst 2):
    /// deletes one key and nothing else, moves the generation (a receipt from before
    /// refunds nothing), counts it, and clamps later decisions to its instant. Each
    /// storage's tests run it.
    pub(super) fn remove_deletes_one_key<T: KeyTable<u64, GcraState>>() {
        let table = T::build(8, 1, None);
        let g = gcra();
        let t = Nanos::from_secs(10);
        let check = |key: u64, now: Nanos, cost: u32| {
            table
                .decide::<Decision, _, _>(&g, &key, now, cost)
                .is_allowed()
        };
        for key in 0..6 {
            assert!(check(key, t, 2));
        }
        let receipt = table.decide::<KeyedCharge<_>, _, _>(&g, &6u64, t, 1);
        let charge = receipt.charge.expect("a fresh key stores its state");
        assert!(table.remove(&g, &3u64, t));
        assert!(!table.remove(&g, &3u64, t), "gone already");
        assert!(!table.remove(&g, &99u64, t), "never present");
        let counts = table.counts();
        assert_eq!((counts.live, counts.removed), (6, 1));
        // Every other key keeps its state wherever backward shifting moved it.
        for key in [0, 1, 2, 4, 5] {
            assert!(!table.peek(&g, &key, t, 1).is_allowed(), "key {key}");
        }
        assert!(table.peek(&g, &6u64, t, 1).is_allowed(), "one of two used");
        // Key 3 is fresh again.
        assert!(check(3, t, 2));
        // The shard removed a key since key 6 was charged: its receipt is void.
        assert!(!table.refund(&g, &6u64, receipt.generation, receipt.noted, &charge, &|| t));
        assert!(!table.peek(&g, &6u64, t, 2).is_allowed());
        // A removal at 20 s: a decision read earlier (10 s) is judged at 20 s, so
        // the fresh state does not start in the past (TAT 12 s would admit again at
        // 20 s; TAT 22 s does not).
        assert!(table.remove(&g, &0u64, Nanos::from_secs(20)));
        let late = table.decide::<Decision, _, _>(&g, &0u64, t, 2);
        assert!(late.is_allowed());
        assert_eq!(late.reset_after(), core::time::Duration::from_secs(2));
        assert!(!check(0, Nanos::from_secs(20), 1));
        assert_eq!(table.counts().removed, 2);
    }

    /// `replace_states` on table `T` rewrites every live key's state and only those.
    pub(super) fn replace_states_rewrites_live_keys<T: KeyTable<u64, GcraState>>() {
        let mut table = T::build(8, 2, None);
        let g = gcra();
        let t = Nanos::from_secs(10);
        for key in 0..5u64 {
            assert!(table.decide::<Decision, _, _>(&g, &key, t, 2).is_allowed());
        }
        let mut seen = 0;
        // Every key's schedule moves 2 s back: each admits two again at 10 s.
        table.replace_states(t, |state, now| {
            seen += 1;
            assert_eq!((state.tat(), now), (Nanos::from_secs(12), t));
            GcraState::from_tat(Nanos::from_secs(10))
        });
        assert_eq!(seen, 5);
        for key in 0..5u64 {
            assert!(table.decide::<Decision, _, _>(&g, &key, t, 2).is_allowed());
        }
        assert_eq!(table.counts().live, 5);
    }

    /// A flood of unique live keys through one shard of `T` (capacity 1 024, GCRA one
    /// an hour: no key goes idle): every eviction is of a live key, each full look for
    /// idle keys finds none, and the next is due only ⌊1 024 / 8⌋ = 128 evictions
    /// later — one pass over the shard per 128 inserts, not one per insert.
    fn full_looks_are_amortized_under_a_live_flood<T: KeyTable<u64, GcraState>>() {
        let table = T::build(1024, 1, None);
        let g = Gcra::new(Policy::per_hour(1).unwrap());
        let t = Nanos::from_secs(10);
        for key in 0..1024 + 20_000u64 {
            assert!(table.decide::<Decision, _, _>(&g, &key, t, 1).is_allowed());
        }
        let c = table.counts();
        assert_eq!((c.live, c.evicted, c.reclaimed), (1024, 20_000, 0));
        // The first eviction looks (the credit starts due), then every 128th.
        assert_eq!(c.full_looks, 20_000u64.div_ceil(128));
    }

    /// The most slots in a row that hold a key, around the ring: a bound on every
    /// probe (for a key present or absent) and every backward-shift walk in `shard`.
    pub(super) fn longest_run<T: Slots>(shard: &Shard<T>) -> usize {
        let n = shard.slots.len();
        let Some(start) = (0..n).find(|&i| shard.slots[i].is_empty()) else {
            return n;
        };
        let (mut longest, mut run) = (0, 0);
        for k in 1..=n {
            if shard.slots[(start + k) % n].is_empty() {
                run = 0;
            } else {
                run += 1;
                longest = longest.max(run);
            }
        }
        longest
    }

    /// Churn through one shard of `T` (capacity 1 024: 1 366 slots; GCRA 1/s, one new
    /// key every 4 ms, 20 000 keys: keys go idle 250 inserts after their own, and at
    /// the share the hand reclaims about one an insert): no run of occupied slots
    /// grows past 400 (82 to 189 seen over random hash seeds, as in a shard at load
    /// 3/4 whose keys lie at random), so no probe and no backward shift walks far;
    /// every key of the last second is still found with its state. With a hand that
    /// moves one slot at a time, the keys it has just reclaimed lie behind it and
    /// those it reaches last ahead of it, denser than a slot each: one run of 850 to
    /// 870 slots, walked by every insert and every removal (BENCHMARKS.md, "The
    /// churn insert, counted").
    pub(super) fn churn_keeps_runs_short<T, U>(table: &T, shard: impl Fn(&T) -> &Shard<U>)
    where
        T: KeyTable<u64, GcraState>,
        U: Slots,
    {
        let g = Gcra::new(Policy::per_second(1).unwrap());
        let at = |key: u64| Nanos::new((1_000 + 4 * key) * 1_000_000);
        let mut longest = 0;
        for key in 0..20_000u64 {
            assert!(table
                .decide::<Decision, _, _>(&g, &key, at(key), 1)
                .is_allowed());
            if key % 100 == 99 {
                longest = longest.max(longest_run(shard(table)));
            }
        }
        let c = table.counts();
        assert_eq!(c.evicted, 0);
        assert!(c.reclaimed > 15_000, "the hand reclaimed {}", c.reclaimed);
        assert!(longest <= 400, "a run of {longest} occupied slots");
        // The last second's keys are present with their state: denied again.
        let now = at(19_999);
        for key in 19_750..20_000u64 {
            assert!(!table.peek(&g, &key, now, 1).is_allowed(), "key {key}");
        }
    }

    #[test]
    fn inline_storages_remove_and_replace() {
        remove_deletes_one_key::<inline::InlineTable<GcraState, inline::Exact>>();
        remove_deletes_one_key::<inline::InlineTable<GcraState, inline::Fingerprinted>>();
        replace_states_rewrites_live_keys::<inline::InlineTable<GcraState, inline::Exact>>();
        replace_states_rewrites_live_keys::<inline::InlineTable<GcraState, inline::Fingerprinted>>(
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "21 024 inserts a storage: too slow under Miri")]
    fn full_looks_are_amortized_on_every_storage() {
        full_looks_are_amortized_under_a_live_flood::<heap::Table<u64, GcraState>>();
        full_looks_are_amortized_under_a_live_flood::<inline::InlineTable<GcraState, inline::Exact>>(
        );
        full_looks_are_amortized_under_a_live_flood::<
            inline::InlineTable<GcraState, inline::Fingerprinted>,
        >();
    }

    #[test]
    fn an_eviction_takes_its_victim_only_as_ranked_or_lighter() {
        let gcra = Gcra::new(Policy::per_second(10).unwrap());
        let now = Nanos::from_secs(100);
        let light = gcra.decide(GcraState::default(), now, 1).1.unwrap();
        let heavy = gcra.decide(light, now, 3).1.unwrap();
        let ranked = forgiven(&gcra, light, now);
        assert!(forgiven(&gcra, heavy, now) > ranked);
        assert_eq!(
            judge(&gcra, light, now, Take::Victim(ranked)),
            (Retired::Live, true)
        );
        // Charged again after it was ranked: kept (the next sample is tried).
        assert_eq!(
            judge(&gcra, heavy, now, Take::Victim(ranked)),
            (Retired::Kept, false)
        );
        assert_eq!(judge(&gcra, heavy, now, Take::Any), (Retired::Live, true));
        assert_eq!(judge(&gcra, heavy, now, Take::Idle), (Retired::Kept, false));
        let later = Nanos::from_secs(200);
        assert_eq!(
            judge(&gcra, heavy, later, Take::Victim(ranked)),
            (Retired::Idle, true)
        );
    }

    /// ln P(X ≥ k) for X ~ Binomial(n, p), summed term by term from k (no bound).
    fn ln_binomial_tail(n: usize, p: f64, k: usize) -> f64 {
        if k > n {
            return f64::NEG_INFINITY;
        }
        let (n_f, k_f) = (n as f64, k as f64);
        let ln_choose: f64 = (1..=k).map(|i| ((n - k + i) as f64 / i as f64).ln()).sum();
        let ln_first = ln_choose + k_f * p.ln() + (n_f - k_f) * (-p).ln_1p();
        // Terms relative to the first: each is the last × (n − j)/(j + 1) · p/(1 − p).
        let (mut term, mut sum) = (1.0f64, 1.0f64);
        for j in k..n {
            term *= (n - j) as f64 / (j + 1) as f64 * p / (1.0 - p);
            sum += term;
            if term < sum * 1e-18 {
                break;
            }
        }
        ln_first + sum.ln()
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "pure floating-point arithmetic: nothing for Miri to check"
    )]
    fn capacity_keys_overflow_no_shard_but_with_a_chance_below_two_to_the_minus_forty() {
        // (capacity, shards): default layouts, small shares, and the most shards a
        // builder takes. The old slack (4·√share + 8) failed the first: 0.37 per fill.
        for (capacity, shards) in [
            (65_536 * 35, 65_536),
            (1_000_000, 8),
            (10_000, 8),
            (10_000_000, 256),
            (64 * 1024, 1024),
            (1 << 16, 1 << 16),
            (100, 2),
        ] {
            let (per_shard, slots) = shard_size(capacity, shards);
            assert!(slots > per_shard, "an empty slot always stays");
            // A shard overflows when more than `per_shard` of the keys land in it.
            let ln_one = ln_binomial_tail(capacity, 1.0 / shards as f64, per_shard + 1);
            let ln_any = ln_one + (shards as f64).ln();
            assert!(
                ln_any <= -f64::from(OVERFLOW_BITS) * core::f64::consts::LN_2,
                "{capacity} keys over {shards} shards of {per_shard}: ln P = {ln_any}"
            );
        }
    }

    /// A full pass (`reclaim_idle`) over a full shard of `T` whose even keys are idle
    /// and odd keys live reclaims every idle one, though backward shifting moves keys
    /// as it goes, and keeps every live one.
    fn a_full_pass_reclaims_every_idle_key<T: KeyTable<u64, GcraState>>() {
        let table = T::build(1024, 1, Some(45));
        let g = gcra();
        let decide = |key: u64, secs: u64, cost: u32| {
            let now = Nanos::from_secs(secs);
            assert!(table
                .decide::<Decision, _, _>(&g, &key, now, cost)
                .is_allowed());
        };
        for key in 0..1024u64 {
            decide(key, 1, 1);
        }
        for key in (1..1024u64).step_by(2) {
            // TAT 11 s: live at 10 s.
            decide(key, 9, 2);
        }
        assert_eq!(table.reclaim_idle(&g, Nanos::from_secs(10)), 512);
        assert_eq!(table.counts().live, 512);
        for key in (1..1024u64).step_by(2) {
            assert!(!table.peek(&g, &key, Nanos::from_secs(10), 2).is_allowed());
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "3 072 inserts: slow under Miri")]
    fn a_full_pass_reclaims_every_idle_key_on_every_storage() {
        a_full_pass_reclaims_every_idle_key::<heap::Table<u64, GcraState>>();
        a_full_pass_reclaims_every_idle_key::<inline::InlineTable<GcraState, inline::Exact>>();
        a_full_pass_reclaims_every_idle_key::<inline::InlineTable<GcraState, inline::Fingerprinted>>(
        );
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "millions of integer steps, no memory access: nothing for Miri to check"
    )]
    fn the_hands_stride_meets_every_slot_and_spreads_neighbours() {
        for len in 1..3_000usize {
            let s = hand_stride(len);
            assert!(s >= 1 && (s < len || len <= 2), "{len}: {s}");
            assert_eq!(gcd(s, len), 1, "{len}: {s}");
            if len > 2 {
                // Neighbouring slots are met c = s⁻¹ steps apart, c ≈ len / φ².
                let c = (1..len).find(|c| c * s % len == 1).unwrap();
                let ideal = len as f64 * 0.381_966;
                assert!((c as f64 - ideal).abs() < 16.0, "{len}: c = {c}");
            }
        }
    }

    #[test]
    fn isqrt_is_exact() {
        for n in [0u128, 1, 2, 3, 4, 15, 16, 17, 99, 100, 125_000, u128::MAX] {
            let r = isqrt(n);
            assert!(r.checked_mul(r).is_some_and(|sq| sq <= n));
            assert!((r + 1).checked_mul(r + 1).is_none_or(|sq| sq > n), "{n}");
        }
    }
}
