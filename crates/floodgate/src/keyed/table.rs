//! The sharded key table behind [`KeyedLimiter`](super::KeyedLimiter).
//!
//! # Layout
//!
//! A power-of-two number of cache-padded shards; a key's 64-bit `ahash` picks its
//! shard from the high bits. Each shard is an open-addressing table with linear
//! probing over a fixed slot array sized once from the shard's share of the capacity
//! (load factor ≤ 7/8, never resized). A slot is two words: a `tag` (the key's hash
//! with the low bit set; 0 = empty) and a pointer to a heap [`Entry`] holding the key
//! and its state word. The state lives in the entry, not the slot, so moving an entry
//! between slots never changes which word a key's decisions use.
//!
//! # Readers (the hot path)
//!
//! A lookup pins the epoch (a thread-local write), walks the probe sequence comparing
//! tags, dereferences an entry only on a tag match, and compares the key. On a hit it
//! runs the algorithm's CAS on the entry's own state word. No lock, no allocation, no
//! shared write other than that CAS. Entries are freed through the epoch, so an entry
//! a reader holds stays allocated while it is pinned.
//!
//! # Writers (new keys, reclamation, eviction)
//!
//! Everything that changes the slot array holds the shard's mutex. Removing a key
//! takes two steps:
//!
//! 1. **retire the state**: a CAS of the entry's state word to the reserved *dead*
//!    word (all bits set). It succeeds only against the latest value, so a charge a
//!    reader made is either seen by the reclaimer (which then re-judges idleness) or
//!    made after it, in which case the reader's CAS fails, it sees *dead*, and it
//!    retries on the shard's locked path. A retired entry can never hand its state to
//!    anyone, and a reclaimed idle key is lossless.
//! 2. **unlink** with backward-shift deletion (no tombstones: probe lengths stay
//!    short under churn), bracketed by a per-shard sequence number (odd while entries
//!    move). A reader can miss a key that is moving; a miss is never trusted on its
//!    own: `check` goes to the locked path, `peek` validates the sequence number.
//!
//! The algorithm must never *store* the dead word; a transition that would is turned
//! into a permanent denial. GCRA reaches it only at TAT = `u64::MAX` ns (in 2554); the
//! window algorithms never do, because none of their counters is ever all ones (see
//! [the window layout](crate::window)).

#![allow(unsafe_code)]

use core::borrow::Borrow;
use core::hash::Hash;
use core::ptr;

use crossbeam_utils::CachePadded;

use crate::algorithm::{
    refund_word, update_word, update_word_ordered, Algorithm, Charged, RefundLedger,
};
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::sync::{fence, lock, pin, retire, Atomic, AtomicPtr, AtomicU64, Guard, Mutex, Ordering};

/// The tag of an empty slot. Occupied tags have the low bit set.
const EMPTY: u64 = 0;

/// How many slots the reclamation hand inspects per insert once a shard passes its
/// share.
const SWEEP_STEP: usize = 4;

/// How many live keys an eviction compares before evicting the closest to idle.
const EVICTION_SAMPLE: usize = 8;

/// Bytes of one slot (tag + pointer), the table's fixed cost per slot.
pub(crate) const SLOT_BYTES: usize = core::mem::size_of::<Slot<(), u64>>();

/// The reserved *dead* state: all bits set.
pub(crate) fn dead<S: bytemuck::Pod>() -> S {
    let mut s: S = bytemuck::Zeroable::zeroed();
    bytemuck::bytes_of_mut(&mut s).fill(0xFF);
    s
}

pub(crate) fn is_dead<S: bytemuck::Pod>(s: &S) -> bool {
    bytemuck::bytes_of(s).iter().all(|b| *b == 0xFF)
}

/// A key and its state word, on the heap so that slots can move it by pointer.
pub(crate) struct Entry<K, S> {
    key: K,
    state: Atomic<S>,
}

struct Slot<K, S> {
    tag: AtomicU64,
    entry: AtomicPtr<Entry<K, S>>,
}

/// Writer-side bookkeeping, only touched under the shard's mutex.
pub(crate) struct Writer {
    pub(crate) live: usize,
    /// The reclamation hand: the next slot to inspect.
    pub(crate) hand: usize,
}

pub(crate) struct Shard<K, S> {
    slots: Box<[Slot<K, S>]>,
    /// Sequence number: odd while a writer moves entries.
    version: AtomicU64,
    /// Removals made (generation, latest instant).
    removals: Removals,
    /// The table's shard bits (the hash bits above the home index).
    shard_bits: u32,
    /// This shard's share of the key capacity.
    capacity: usize,
    /// The write side, on its own cache line: inserting a key never disturbs the
    /// line readers load `slots` and `version` from.
    write: CachePadded<WriteSide>,
}

pub(crate) struct WriteSide {
    pub(crate) lock: Mutex<Writer>,
    /// Counters written only under `lock`, read lock-free by metrics.
    pub(crate) live: AtomicU64,
    pub(crate) reclaimed: AtomicU64,
    pub(crate) evicted: AtomicU64,
}

impl WriteSide {
    pub(crate) fn new() -> CachePadded<Self> {
        CachePadded::new(WriteSide {
            lock: Mutex::new(Writer { live: 0, hand: 0 }),
            live: AtomicU64::new(0),
            reclaimed: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
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
    /// What refunds in this shard gave back (serialised by the shard lock).
    ledger: RefundLedger,
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

/// Sums the counters of `sides` (each read lock-free).
pub(crate) fn sum_counts<'a>(sides: impl Iterator<Item = &'a WriteSide>) -> TableCounts {
    let mut c = TableCounts::default();
    for side in sides {
        // Relaxed: statistics; each counter is written only under its shard lock.
        c.live += side.live.load(Ordering::Relaxed);
        c.reclaimed += side.reclaimed.load(Ordering::Relaxed);
        c.evicted += side.evicted.load(Ordering::Relaxed);
    }
    c
}

/// Slots per shard and each shard's share of the key capacity, for `capacity` keys
/// over `shards` shards.
///
/// Keys do not spread evenly: a shard's count is binomial around its share with
/// σ ≈ √share. Four σ of slack (plus a little) keep a table holding `capacity` keys
/// from evicting live ones in a crowded shard, for about 4/√share more memory (1 % at
/// 125 000 keys per shard). Load factor ≤ 7/8, and always at least one empty slot so
/// probes end.
pub(crate) fn shard_size(capacity: usize, shards: usize) -> (usize, usize) {
    debug_assert!(shards.is_power_of_two() && shards <= capacity);
    let share = capacity.div_ceil(shards);
    let per_shard = if shards == 1 {
        share
    } else {
        share + 4 * isqrt(share) + 8
    };
    (per_shard, per_shard + per_shard.div_ceil(7))
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

/// The slot after `i` among `len`, wrapping.
#[inline(always)]
pub(crate) fn next_slot(i: usize, len: usize) -> usize {
    if i + 1 == len {
        0
    } else {
        i + 1
    }
}

/// One shard's slot array as the shared reclamation and eviction code sees it. Every
/// method runs with the shard lock held.
pub(crate) trait Slots {
    /// The state word type.
    type State: bytemuck::Pod;
    /// Number of slots.
    fn len(&self) -> usize;
    /// The shard's write side (lock and counters).
    fn write_side(&self) -> &WriteSide;
    /// The shard's removal record.
    fn removals(&self) -> &Removals;
    /// This shard's share of the key capacity.
    fn share(&self) -> usize;
    /// The state of the key in slot `i`, or `None` when `i` is empty.
    fn state_at(&self, i: usize) -> Option<Self::State>;
    /// Retires the state of the key in slot `i` (see [`judge`]); `None` when empty.
    fn retire_at<A>(&self, algorithm: &A, i: usize, now: Nanos, idle_only: bool) -> Option<Retired>
    where
        A: Algorithm<State = Self::State> + ?Sized;
    /// Unlinks the (retired) key in slot `i`.
    fn unlink(&self, writer: &mut Writer, i: usize);
}

/// Whether to retire `state`: the outcome, and whether to write the dead word.
pub(crate) fn judge<A>(
    algorithm: &A,
    state: A::State,
    now: Nanos,
    idle_only: bool,
) -> (Retired, bool)
where
    A: Algorithm + ?Sized,
{
    let idle = algorithm.is_idle(state, now);
    if idle_only && !idle {
        return (Retired::Kept, false);
    }
    (if idle { Retired::Idle } else { Retired::Live }, true)
}

/// Writer-side counters of a table, summed over shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TableCounts {
    pub(crate) live: u64,
    pub(crate) reclaimed: u64,
    pub(crate) evicted: u64,
}

/// The sharded table: keys `K` to state words `S`.
pub(crate) struct Table<K, S> {
    pub(crate) set: ShardSet<Shard<K, S>>,
}

/// The shard-level operations (counts, capacity, full sweeps) are the shard set's.
impl<K, S> core::ops::Deref for Table<K, S> {
    type Target = ShardSet<Shard<K, S>>;

    fn deref(&self) -> &Self::Target {
        &self.set
    }
}

/// A table's shards and the hasher that spreads keys over them.
pub(crate) struct ShardSet<T> {
    pub(crate) shards: Box<[CachePadded<T>]>,
    shard_bits: u32,
    hasher: ahash::RandomState,
}

/// What a new shard is made from.
pub(crate) struct ShardShape<'a> {
    /// The shard's share of the key capacity.
    pub(crate) share: usize,
    /// Its slot count.
    pub(crate) slots: usize,
    /// The table's shard bits.
    pub(crate) shard_bits: u32,
    /// The table's hasher.
    pub(crate) hasher: &'a ahash::RandomState,
}

impl<T: Slots> ShardSet<T> {
    /// `shards` shards (a power of two ≤ `capacity`), each made by `make`.
    pub(crate) fn new(capacity: usize, shards: usize, make: impl Fn(ShardShape<'_>) -> T) -> Self {
        let (share, slots) = shard_size(capacity, shards);
        let shard_bits = shards.trailing_zeros();
        // Random per-process seeds (HashDoS resistance); fixed under loom, whose
        // exploration must be deterministic.
        #[cfg(not(loom))]
        let hasher = ahash::RandomState::new();
        #[cfg(loom)]
        let hasher = ahash::RandomState::with_seeds(1, 2, 3, 4);
        let shards = (0..shards)
            .map(|_| {
                CachePadded::new(make(ShardShape {
                    share,
                    slots,
                    shard_bits,
                    hasher: &hasher,
                }))
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
    pub(crate) fn locate<Q: Hash + ?Sized>(&self, key: &Q) -> (&T, u64) {
        let hash = self.hasher.hash_one(key);
        (&self.shards[shard_index(hash, self.shard_bits)], hash)
    }

    /// Number of shards.
    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Keys the table holds at most.
    pub(crate) fn capacity(&self) -> usize {
        self.shards.iter().map(|s| s.share()).sum()
    }

    /// Slots over all shards.
    pub(crate) fn slot_count(&self) -> usize {
        self.shards.iter().map(|s| s.len()).sum()
    }

    /// Counters summed over shards (each read lock-free).
    pub(crate) fn counts(&self) -> TableCounts {
        sum_counts(self.shards.iter().map(|s| s.write_side()))
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
}

/// How a removal went.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retired {
    /// The key was idle: nothing lost.
    Idle,
    /// The key was live: its state is lost (an eviction).
    Live,
    /// Not retired (it was not idle and only idle keys were wanted).
    Kept,
}

impl<K, S> Table<K, S>
where
    K: Eq + Hash + Send + Sync + 'static,
    S: bytemuck::Pod + Send + Sync,
{
    /// A table for `capacity` keys over `shards` shards (a power of two ≤ capacity).
    pub(crate) fn new(capacity: usize, shards: usize) -> Self {
        let set = ShardSet::new(capacity, shards, |shape| Shard {
            slots: (0..shape.slots)
                .map(|_| Slot {
                    tag: AtomicU64::new(EMPTY),
                    entry: AtomicPtr::new(ptr::null_mut()),
                })
                .collect(),
            version: AtomicU64::new(0),
            removals: Removals::new(),
            shard_bits: shape.shard_bits,
            capacity: shape.share,
            write: WriteSide::new(),
        });
        Table { set }
    }

    #[inline(always)]
    fn locate<Q: Hash + ?Sized>(&self, key: &Q) -> (&Shard<K, S>, u64) {
        let (shard, hash) = self.set.locate(key);
        (shard, hash | 1)
    }

    /// Decides `cost` at `now` for `key`, inserting the key if it must store a state.
    #[inline]
    pub(crate) fn check<Q, A>(&self, algorithm: &A, key: &Q, now: Nanos, cost: u32) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        A: Algorithm<State = S> + ?Sized,
    {
        self.decide::<false, Q, A>(algorithm, key, now, cost)
            .decision
    }

    /// [`check`](Table::check), also returning what the admission wrote and what a
    /// refund of it must compare (see [`KeyedCharge`]).
    #[inline]
    pub(crate) fn charge<Q, A>(
        &self,
        algorithm: &A,
        key: &Q,
        now: Nanos,
        cost: u32,
    ) -> KeyedCharge<S>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        A: Algorithm<State = S> + ?Sized,
    {
        self.decide::<true, Q, A>(algorithm, key, now, cost)
    }

    /// The decision path of `check` and `charge`; only a charge (`RECEIPT`) reads
    /// what its receipt compares (atomic loads a plain check would not remove).
    #[inline(always)]
    fn decide<const RECEIPT: bool, Q, A>(
        &self,
        algorithm: &A,
        key: &Q,
        now: Nanos,
        cost: u32,
    ) -> KeyedCharge<S>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        A: Algorithm<State = S> + ?Sized,
    {
        let (shard, tag) = self.locate(key);
        let guard = pin();
        // Read before the probe: a removal of the entry found below happens after
        // this read, so a refund sees the generation move.
        let (generation, noted) = if RECEIPT {
            (shard.removals.generation(), shard.removals.ledger.note())
        } else {
            (0, 0)
        };
        if let Some(entry) = shard.find(tag, key, &guard) {
            let now = shard.removals.clamp(now);
            if let Some((decision, charge)) = charge_live(algorithm, &entry.state, now, cost) {
                return KeyedCharge {
                    decision,
                    charge,
                    tag,
                    generation,
                    noted,
                };
            }
        }
        shard.check_locked(algorithm, tag, key, now, cost, &guard)
    }

    /// Gives back what `charge` (made on `key` at removal generation `generation`,
    /// with the shard's refund ledger at `noted`) still provably holds, judged at
    /// `now()` read after the state is loaded. Refunds in a shard are serialised by
    /// its lock. Nothing if the shard has removed any key since the charge: the entry
    /// may be a re-created one that the charge never touched.
    pub(crate) fn refund<Q, A>(
        &self,
        algorithm: &A,
        key: &Q,
        generation: u64,
        noted: u64,
        charge: &Charged<S>,
        now: impl Fn() -> Nanos,
    ) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
        A: Algorithm<State = S> + ?Sized,
    {
        let (shard, tag) = self.locate(key);
        let guard = pin();
        let _writer = lock(&shard.write.lock);
        let removals = &shard.removals;
        if removals.generation() != generation {
            return false;
        }
        // Under the lock nothing moves: a miss is a miss.
        let Some(entry) = shard.find(tag, key, &guard) else {
            return false;
        };
        removals.ledger.refund_locked(noted, |shift| {
            refund_word(
                algorithm,
                &entry.state,
                charge,
                shift,
                || removals.clamp(now()),
                |s| !is_dead(s),
            )
        })
    }

    /// The tag of `key` (its hash with the low bit set), as receipts carry it.
    pub(crate) fn tag_of<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.locate(key).1
    }

    /// Exactly what `check` would decide now; writes nothing and inserts nothing.
    #[inline]
    pub(crate) fn peek<Q, A>(&self, algorithm: &A, key: &Q, now: Nanos, cost: u32) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
        A: Algorithm<State = S> + ?Sized,
    {
        let (shard, tag) = self.locate(key);
        let guard = pin();
        // Acquire: pairs with the writer's final Release store of the version, so a
        // probe that starts on an even version sees every move before it (and every
        // removal instant recorded before the moves).
        let before = shard.version.load(Ordering::Acquire);
        let clamped = shard.removals.clamp(now);
        match shard.find(tag, key, &guard) {
            Some(entry) => {
                let state = entry.state.load(Ordering::Relaxed);
                if !is_dead(&state) {
                    return decide_unwritten(algorithm, state, clamped, cost);
                }
            }
            None => {
                // Acquire fence: if the probe read anything a writer stored after
                // making the version odd, the re-read below sees that odd version.
                fence(Ordering::Acquire);
                let after = shard.version.load(Ordering::Relaxed);
                if before == after && before % 2 == 0 {
                    let fresh = bytemuck::Zeroable::zeroed();
                    return decide_unwritten(algorithm, fresh, clamped, cost);
                }
            }
        }
        let _writer = lock(&shard.write.lock);
        let state = match shard.find(tag, key, &guard) {
            Some(entry) => entry.state.load(Ordering::Relaxed),
            None => bytemuck::Zeroable::zeroed(),
        };
        decide_unwritten(algorithm, state, shard.removals.clamp(now), cost)
    }
}

/// A keyed decision, what it wrote, and what a refund of it must compare.
pub(crate) struct KeyedCharge<S> {
    pub(crate) decision: Decision,
    /// What the admission wrote (`None`: nothing).
    pub(crate) charge: Option<Charged<S>>,
    /// The key's tag (its hash with the low bit set).
    pub(crate) tag: u64,
    /// The shard's removal generation when the charged entry was known live.
    pub(crate) generation: u64,
    /// The shard's refund ledger before the charge's CAS.
    pub(crate) noted: u64,
}

/// Reclaims every idle key of one shard (a full sweep under its lock).
pub(crate) fn reclaim_shard<T, A>(shard: &T, algorithm: &A, now: Nanos) -> usize
where
    T: Slots,
    A: Algorithm<State = T::State> + ?Sized,
{
    let mut writer = lock(&shard.write_side().lock);
    let before = shard.write_side().reclaimed.load(Ordering::Relaxed);
    let start = writer.hand;
    writer.hand = 0;
    sweep(shard, &mut writer, algorithm, now, shard.len());
    writer.hand = start % shard.len();
    (shard.write_side().reclaimed.load(Ordering::Relaxed) - before) as usize
}

/// Makes room for one more key: past 7/8 of the share, the hand reclaims idle keys
/// as it passes; when full, the closest-to-idle of a small sample goes.
pub(crate) fn make_room<T, A>(shard: &T, writer: &mut Writer, algorithm: &A, now: Nanos)
where
    T: Slots,
    A: Algorithm<State = T::State> + ?Sized,
{
    let share = shard.share();
    if writer.live >= share - share / 8 {
        sweep(shard, writer, algorithm, now, SWEEP_STEP);
    }
    if writer.live >= share {
        evict_one(shard, writer, algorithm, now);
    }
}

/// Moves the hand past `steps` slots, reclaiming the idle keys it meets.
fn sweep<T, A>(shard: &T, writer: &mut Writer, algorithm: &A, now: Nanos, steps: usize)
where
    T: Slots,
    A: Algorithm<State = T::State> + ?Sized,
{
    // Count slots the hand moves past, not iterations: after a removal a later key
    // may have shifted into the same slot, which is inspected again.
    let mut advanced = 0;
    while advanced < steps {
        let i = writer.hand;
        if shard.retire_at(algorithm, i, now, true) == Some(Retired::Idle) {
            // A later key may shift into `i`: look at it next.
            shard.removals().record(now);
            shard.unlink(writer, i);
            shard.write_side().reclaimed.fetch_add(1, Ordering::Relaxed);
        } else {
            writer.hand = next_slot(i, shard.len());
            advanced += 1;
        }
    }
}

/// Removes one key: the first idle one met, else the closest to idle of a sample.
fn evict_one<T, A>(shard: &T, writer: &mut Writer, algorithm: &A, now: Nanos)
where
    T: Slots,
    A: Algorithm<State = T::State> + ?Sized,
{
    let side = shard.write_side();
    let mut best: Option<((u64, u64), usize)> = None;
    let mut sampled = 0;
    let mut i = writer.hand;
    for _ in 0..shard.len() {
        if let Some(how) = shard.retire_at(algorithm, i, now, true) {
            if how == Retired::Idle {
                shard.removals().record(now);
                shard.unlink(writer, i);
                side.reclaimed.fetch_add(1, Ordering::Relaxed);
                writer.hand = i;
                return;
            }
            // Live (or made live by a racing decision): a candidate. The victim is
            // the key whose loss forgives least: the fewest units in use now
            // (`limit − remaining`: what a fresh state would hand back at once), then
            // the least time until the state is fresh again.
            if let Some(state) = shard.state_at(i) {
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
        i = next_slot(i, shard.len());
    }
    let Some((_, victim)) = best else {
        return;
    };
    if let Some(how) = shard.retire_at(algorithm, victim, now, false) {
        shard.removals().record(now);
        shard.unlink(writer, victim);
        if how == Retired::Idle {
            side.reclaimed.fetch_add(1, Ordering::Relaxed);
        } else {
            side.evicted.fetch_add(1, Ordering::Relaxed);
        }
        writer.hand = next_slot(i, shard.len());
    }
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
fn isqrt(n: usize) -> usize {
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
fn decide_unwritten<A>(algorithm: &A, state: A::State, now: Nanos, cost: u32) -> Decision
where
    A: Algorithm + ?Sized,
{
    match algorithm.decide(state, now, cost) {
        (decision, Some(next)) if is_dead(&next) => decision.refused(),
        (decision, _) => decision,
    }
}

/// Runs the decision on a live entry; `None` when the entry is dead. Also returns
/// what the admission wrote.
#[inline(always)]
fn charge_live<A>(
    algorithm: &A,
    word: &Atomic<A::State>,
    now: Nanos,
    cost: u32,
) -> Option<(Decision, Option<Charged<A::State>>)>
where
    A: Algorithm + ?Sized,
{
    // Release: see `RefundLedger` (a refund that sees this state sees the ledger
    // as the charge noted it).
    update_word_ordered(word, Ordering::Release, |before| {
        if is_dead(&before) {
            return (None, None);
        }
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
    })
}

impl<K, S> Shard<K, S>
where
    K: Eq + Send + Sync + 'static,
    S: bytemuck::Pod + Send + Sync,
{
    /// The home slot of `tag`: multiply-shift over the bits below the shard bits.
    #[inline(always)]
    fn home(&self, tag: u64) -> usize {
        home_slot(tag, self.shard_bits, self.slots.len())
    }

    #[inline(always)]
    fn next(&self, i: usize) -> usize {
        next_slot(i, self.slots.len())
    }

    /// Lock-free probe. A hit is always right; a miss may be spurious while entries
    /// move (see the module docs).
    #[inline(always)]
    fn find<'g, Q>(&'g self, tag: u64, key: &Q, _guard: &'g Guard) -> Option<&'g Entry<K, S>>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let mut i = self.home(tag);
        for _ in 0..self.slots.len() {
            let slot = &self.slots[i];
            // Acquire: pairs with the writer's Release store of the tag, which follows
            // its store of the entry pointer.
            let seen = slot.tag.load(Ordering::Acquire);
            if seen == EMPTY {
                return None;
            }
            if seen == tag {
                // Acquire: the entry's contents were written before the pointer.
                let p = slot.entry.load(Ordering::Acquire);
                if !p.is_null() {
                    // SAFETY: `p` was read from a slot while this thread is pinned
                    // (`_guard`). Entries are freed only through `retire`, after being
                    // unlinked from every slot, and the epoch frees them only once all
                    // threads pinned at that time have unpinned; so `*p` is live for
                    // `'g`. Its key is never written after publication.
                    let entry = unsafe { &*p };
                    if entry.key.borrow() == key {
                        return Some(entry);
                    }
                }
            }
            i = self.next(i);
        }
        None
    }
}

impl<K, S> Shard<K, S>
where
    K: Eq + Send + Sync + 'static,
    S: bytemuck::Pod + Send + Sync,
{
    /// The write path: find or insert `key` under the shard lock, then decide.
    #[cold]
    fn check_locked<Q, A>(
        &self,
        algorithm: &A,
        tag: u64,
        key: &Q,
        now: Nanos,
        cost: u32,
        guard: &Guard,
    ) -> KeyedCharge<S>
    where
        K: Borrow<Q>,
        Q: Eq + ToOwned<Owned = K> + ?Sized,
        A: Algorithm<State = S> + ?Sized,
    {
        let mut writer = lock(&self.write.lock);
        // Under the lock every removal so far is visible: judge at or after them.
        let now = self.removals.clamp(now);
        let answer = |decision, charge| KeyedCharge {
            decision,
            charge,
            tag,
            generation: self.removals.generation(),
            noted: self.removals.ledger.note(),
        };
        // Under the lock nothing moves and every linked entry is live: a writer
        // retires and unlinks within one critical section.
        if let Some(entry) = self.find(tag, key, guard) {
            if let Some((decision, charge)) = charge_live(algorithm, &entry.state, now, cost) {
                return answer(decision, charge);
            }
        }
        let before: S = bytemuck::Zeroable::zeroed();
        let (decision, next) = algorithm.decide(before, now, cost);
        // Nothing to store (a denial, cost 0): a fresh key stays out of the table.
        let Some(next) = next else {
            return answer(decision, None);
        };
        if is_dead(&next) {
            return answer(decision.refused(), None);
        }
        make_room(self, &mut writer, algorithm, now);
        // There is always an empty slot: make_room leaves live < capacity < slots
        // (it evicts whenever a shard is full and holds a key). Bounded all the same.
        let mut i = self.home(tag);
        let mut probes = 0;
        while self.slots[i].tag.load(Ordering::Relaxed) != EMPTY {
            i = self.next(i);
            probes += 1;
            if probes == self.slots.len() {
                return answer(decision.refused(), None);
            }
        }
        let entry = Box::into_raw(Box::new(Entry {
            key: key.to_owned(),
            state: Atomic::new(next),
        }));
        // Release (both): a reader that sees the tag sees the pointer, and one that
        // sees the pointer sees the entry's contents.
        self.slots[i].entry.store(entry, Ordering::Release);
        self.slots[i].tag.store(tag, Ordering::Release);
        writer.live += 1;
        self.write.set_live(&writer);
        // The generation after make_room's removals: the entry is new at it.
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

    /// The entry in slot `i`, if any (under the shard lock).
    fn entry_at(&self, i: usize) -> Option<&Entry<K, S>> {
        let p = self.slots[i].entry.load(Ordering::Relaxed);
        // SAFETY: called only with the shard lock held; only lock holders unlink and
        // retire entries, so a linked entry cannot be freed while we hold the lock.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// Unlinks the (retired) entry in slot `hole` by backward-shift deletion and
    /// hands it to the epoch.
    fn unlink_entry(&self, writer: &mut Writer, mut hole: usize, guard: &Guard) {
        let dead_entry = self.slots[hole].entry.load(Ordering::Relaxed);
        let n = self.slots.len();
        // Sequence number odd: readers that miss during the moves retry.
        let version = self.version.load(Ordering::Relaxed);
        self.version
            .store(version.wrapping_add(1), Ordering::Relaxed);
        // Release fence: a reader that reads any store below and then fences with
        // Acquire also reads the odd version (the seqlock protocol).
        fence(Ordering::Release);
        let mut j = hole;
        loop {
            j = self.next(j);
            let tag = self.slots[j].tag.load(Ordering::Relaxed);
            if tag == EMPTY {
                break;
            }
            // Keep the entry at j if its home lies cyclically in (hole, j].
            let from_home = (j + n - self.home(tag)) % n;
            let from_hole = (j + n - hole) % n;
            if from_home < from_hole {
                continue;
            }
            let p = self.slots[j].entry.load(Ordering::Relaxed);
            // Pointer first, then tag (Release), as on insert; for a moment the entry
            // sits in both slots, which is harmless: it is one entry, one state word.
            self.slots[hole].entry.store(p, Ordering::Release);
            self.slots[hole].tag.store(tag, Ordering::Release);
            hole = j;
        }
        self.slots[hole].tag.store(EMPTY, Ordering::Release);
        self.slots[hole]
            .entry
            .store(ptr::null_mut(), Ordering::Release);
        // Release: a reader that reads this even version sees every move above.
        self.version
            .store(version.wrapping_add(2), Ordering::Release);
        writer.live -= 1;
        self.write.set_live(writer);
        // SAFETY: `dead_entry` came from `Box::into_raw` on insert, is now unlinked
        // from every slot (it was in exactly one at rest, and moves only copy other
        // entries), and is retired exactly once, here, under the shard lock.
        unsafe { retire(guard, dead_entry) };
    }
}

impl<K, S> Slots for Shard<K, S>
where
    K: Eq + Send + Sync + 'static,
    S: bytemuck::Pod + Send + Sync,
{
    type State = S;

    fn len(&self) -> usize {
        self.slots.len()
    }

    fn write_side(&self) -> &WriteSide {
        &self.write
    }

    fn removals(&self) -> &Removals {
        &self.removals
    }

    fn share(&self) -> usize {
        self.capacity
    }

    fn state_at(&self, i: usize) -> Option<S> {
        self.entry_at(i).map(|e| e.state.load(Ordering::Relaxed))
    }

    /// CAS of the entry's state to the dead word (only if idle when `idle_only`).
    fn retire_at<A>(&self, algorithm: &A, i: usize, now: Nanos, idle_only: bool) -> Option<Retired>
    where
        A: Algorithm<State = S> + ?Sized,
    {
        let entry = self.entry_at(i)?;
        Some(update_word(&entry.state, |state| {
            let (how, write) = judge(algorithm, state, now, idle_only);
            (how, write.then(dead::<S>))
        }))
    }

    fn unlink(&self, writer: &mut Writer, i: usize) {
        self.unlink_entry(writer, i, &pin());
    }
}

impl<K, S> Drop for Table<K, S> {
    fn drop(&mut self) {
        for shard in self.set.shards.iter() {
            for slot in shard.slots.iter() {
                let p = slot.entry.load(Ordering::Relaxed);
                if !p.is_null() {
                    // SAFETY: `&mut self`: no reader or writer is left; at rest every
                    // entry is linked from exactly one slot, so each is freed once.
                    drop(unsafe { Box::from_raw(p) });
                }
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    //! Small enough for Miri, which checks the table's `unsafe` (entry lifetimes,
    //! frees, data races). crossbeam-epoch casts integers to pointers and breaks
    //! Stacked Borrows inside itself, and its global garbage outlives the process, so:
    //! `MIRIFLAGS="-Zmiri-permissive-provenance -Zmiri-tree-borrows -Zmiri-ignore-leaks"
    //! cargo +nightly miri test -p floodgate --lib keyed::table -- --include-ignored`
    use super::*;
    use crate::gcra::{Gcra, GcraState};
    use crate::policy::Policy;

    fn gcra() -> Gcra {
        Gcra::new(Policy::per_second(1).unwrap().with_burst(2).unwrap())
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "crossbeam-epoch needs -Zmiri-permissive-provenance -Zmiri-tree-borrows -Zmiri-ignore-leaks; .ci/run runs these with --include-ignored"
    )]
    fn insert_find_retire_and_drop_heap_keys() {
        let table: Table<String, GcraState> = Table::new(8, 1);
        let g = gcra();
        let t0 = Nanos::from_secs(1);
        for i in 0..8 {
            assert!(table
                .check(&g, format!("k{i}").as_str(), t0, 1)
                .is_allowed());
        }
        assert_eq!(table.counts().live, 8);
        // Full of live keys: each new key evicts one (backward-shift unlinks).
        for i in 8..20 {
            assert!(table
                .check(&g, format!("k{i}").as_str(), t0, 2)
                .is_allowed());
        }
        assert_eq!(table.counts().live, 8);
        assert_eq!(table.counts().evicted, 12);
        // Everything idle later: a sweep reclaims all, entries freed via the epoch.
        assert_eq!(table.reclaim_idle(&g, Nanos::from_secs(10)), 8);
        assert!(table.peek(&g, "k19", Nanos::from_secs(10), 2).is_allowed());
        // Refill and drop the table with entries inside.
        let t = Nanos::from_secs(10);
        let mut charged = None;
        for i in 0..5 {
            let c = table.charge(&g, format!("again{i}").as_str(), t, 1);
            if i == 0 {
                charged = c.charge.map(|charge| (charge, c.generation));
            }
        }
        let (charge, generation) = charged.unwrap();
        assert!(table.refund(&g, "again0", generation, 0, &charge, || t));
        assert!(!table.refund(&g, "missing", generation, 0, &charge, || t));
        // The shard of "again0" removed keys after the charge (here: none, so the
        // refund above went through); a stale generation gives nothing back.
        assert!(!table.refund(&g, "again0", generation.wrapping_add(1), 0, &charge, || t));
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "crossbeam-epoch needs -Zmiri-permissive-provenance -Zmiri-tree-borrows -Zmiri-ignore-leaks; .ci/run runs these with --include-ignored"
    )]
    fn threads_race_on_insert_lookup_and_removal() {
        let table: Table<u64, GcraState> = Table::new(4, 1);
        let g = gcra();
        std::thread::scope(|s| {
            for t in 0..2u64 {
                let (table, g) = (&table, &g);
                s.spawn(move || {
                    for i in 0..12u64 {
                        let now = Nanos::from_secs(1 + i);
                        let _ = table.check(g, &((i + t) % 6), now, 1);
                        let _ = table.peek(g, &(i % 6), now, 1);
                    }
                });
            }
        });
        assert!(table.counts().live <= 4);
    }

    #[test]
    fn the_dead_word_is_never_stored() {
        assert!(is_dead(&dead::<GcraState>()));
        assert!(!is_dead(&GcraState::from_tat(Nanos::new(u64::MAX - 1))));
        // A transition that would store the dead word is refused instead.
        let word = Atomic::new(GcraState::from_tat(Nanos::new(u64::MAX - 1_000_000_000)));
        let d = charge_live(&gcra(), &word, Nanos::new(u64::MAX - 1_500_000_000), 1);
        assert!(d.is_some_and(|(d, charge)| !d.is_allowed() && charge.is_none()));
        assert!(!is_dead(&word.load(Ordering::Relaxed)));
    }

    #[test]
    fn isqrt_is_exact() {
        for n in [0usize, 1, 2, 3, 4, 15, 16, 17, 99, 100, 125_000, usize::MAX] {
            let r = isqrt(n);
            assert!(r.checked_mul(r).is_some_and(|sq| sq <= n));
            assert!((r + 1).checked_mul(r + 1).is_none_or(|sq| sq > n), "{n}");
        }
    }
}
