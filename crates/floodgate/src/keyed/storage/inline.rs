//! [`Inline`](super::Inline) and [`Fingerprint`](super::Fingerprint) storage: a
//! key's 64-bit encoding stored inline beside its state, no heap entry, no epoch.
//!
//! # Layout
//!
//! Shards, hashing, probing, sizing, reclamation and eviction are those of the
//! heap table (the shard machinery in [`super`] is shared). The difference is the slot: one 16-byte
//! atomic word holding the key's bits (high 64 bits, the key's bytes zero-extended)
//! and its state (low 64 bits, the state's bytes zero-extended). A lookup loads one
//! slot — one cache line, no pointer to chase — and a decision is one 128-bit CAS
//! on it (`cmpxchg16b` on x86_64, through `portable-atomic`; no `unsafe` here).
//!
//! # Empty slots
//!
//! A slot is *empty* when its state half is [`DEAD`] (all 64 bits set), whatever
//! its key half. The state half is stored inverted (`!bits`), so an empty slot reads
//! as zero in memory and a new table's slot array comes zeroed from the allocator
//! (`alloc_zeroed`: for a large table, pages the OS maps lazily), not written slot
//! by slot. No key can make a slot look empty: the key half is not consulted.
//! No state can either: the state half of an occupied slot is a state's bytes
//! zero-extended, which is all-ones only for an 8-byte state equal to the reserved
//! dead word — which the algorithm must never store (as in the general table, a
//! transition that would is refused).
//!
//! # Why a reused slot never applies one key's CAS to another (ABA)
//!
//! Slots are reused in place and nothing is ever freed, so a reader may hold a
//! stale copy `(k, s)` of a slot that has since been emptied and refilled. Its CAS
//! compares the *whole* slot, key included: it succeeds only if the slot holds
//! exactly `(k, s)` at that instant. Invariant (kept by the writers, who serialise on
//! the shard lock): **at any instant at most one slot holds key `k` with a live
//! state** — an insert first looks the key up under the lock, and a move
//! (backward-shift deletion) first retires the source slot (CAS to dead) and only
//! then publishes the key in its new slot. So a successful CAS on `(k, s)` updates
//! `k`'s one live state, which is `s`; and the decision it stores was computed from
//! exactly `(k, s)` — a pure function of the state, `now` and the cost — so it is
//! the decision `k` would get at that instant. A different key's state is never
//! touched (its key half differs), and the same key's state is touched only when it
//! equals what the decision was computed from. This holds however many times the
//! slot was reused in between; loom: `tests/loom_keyed_compact.rs`.
//!
//! # Removal
//!
//! As in the general table, under the shard lock: retire the state (CAS of the
//! state half to dead; it fails against any charge made since, which is then
//! re-judged), then backward-shift the cluster behind it, each move retiring the
//! source before publishing the destination. Unlike the general table's retired
//! entries (whose tags stay until unlinked), a retired slot reads as empty at once,
//! so a probe for a key further along the cluster stops there: the shard's sequence
//! number therefore turns odd *before* the retirement CAS and even only after the
//! unlink, so that a `peek` trusts a miss only outside that window (loom:
//! `a_peek_behind_a_key_being_removed_still_finds_its_key`). A reader whose CAS
//! finds the slot dead or holding another key takes the locked path, which never
//! misses a present key.

use core::hash::Hash;
use core::marker::PhantomData;

use super::{
    charge_live, dead, decide_unwritten, is_dead, remove_at, shard_set_methods, table_hasher,
    KeyTable, KeyedCharge, Outcome, Retired, Salt, Shard, ShardSet, Slots, Writer,
};
use crate::algorithm::{Algorithm, Charged};
use crate::cell::{failure_of, update_word, CasWord};
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::keyed::key::{InlineKey, Lookup};
use crate::receipt::{from_bits, to_bits};
use crate::sync::{lock, AtomicU128, Ordering};

/// The state half of an empty (or retired) slot.
pub(crate) const DEAD: u64 = u64::MAX;

/// Bytes of one inline slot.
const SLOT_BYTES: usize = 16;

/// An empty slot: all zero in memory (the state half is stored inverted).
const EMPTY_SLOT: u128 = pack(0, DEAD);
const _: () = assert!(EMPTY_SLOT == 0);

/// A slot's word: the key's bits high, the state's bits inverted low.
#[inline(always)]
const fn pack(key: u64, state: u64) -> u128 {
    ((key as u128) << 64) | (!state as u128)
}

#[inline(always)]
fn key_half(slot: u128) -> u64 {
    (slot >> 64) as u64
}

#[inline(always)]
fn state_half(slot: u128) -> u64 {
    !(slot as u64)
}

/// A slot as [`update_word`] drives it: the whole 128-bit word is compared. `S` is
/// the state type its state half holds.
#[repr(transparent)]
pub(crate) struct Slot<S>(AtomicU128, PhantomData<fn() -> S>);

impl<S> Slot<S> {
    #[cfg(any(test, loom))]
    fn new(word: u128) -> Self {
        Slot(AtomicU128::new(word), PhantomData)
    }
}

impl<S> CasWord for Slot<S> {
    type Value = u128;

    #[inline(always)]
    fn load_now(&self) -> u128 {
        // Relaxed: the slot publishes nothing but itself (key and state are in it).
        self.0.load(Ordering::Relaxed)
    }

    #[inline(always)]
    fn load_acquire(&self) -> u128 {
        self.0.load(Ordering::Acquire)
    }

    #[inline(always)]
    fn cas_weak(&self, current: u128, new: u128, success: Ordering) -> Result<u128, u128> {
        self.0
            .compare_exchange_weak(current, new, success, failure_of(success))
    }
}

/// One key's view of a slot, as the shared charge and refund code drives it: its
/// value is the state while the slot holds this key live and the dead word
/// otherwise (emptied, retired, or taken by another key), and its CAS compares the
/// whole slot, key half included.
struct KeyedSlot<'a, S> {
    slot: &'a Slot<S>,
    key: u64,
}

impl<'a, S: bytemuck::Pod> KeyedSlot<'a, S> {
    #[inline(always)]
    fn new(slot: &'a Slot<S>, key: u64) -> Self {
        KeyedSlot { slot, key }
    }

    /// The state `slot` holds for this key, or the dead word.
    #[inline(always)]
    fn state_of(&self, slot: u128) -> S {
        let bits = state_half(slot);
        if bits == DEAD || key_half(slot) != self.key {
            dead::<S>()
        } else {
            from_bits(bits)
        }
    }
}

impl<S: bytemuck::Pod> CasWord for KeyedSlot<'_, S> {
    type Value = S;

    #[inline(always)]
    fn load_now(&self) -> S {
        self.state_of(self.slot.load_now())
    }

    #[inline(always)]
    fn load_acquire(&self) -> S {
        self.state_of(self.slot.load_acquire())
    }

    #[inline(always)]
    fn cas_weak(&self, current: S, new: S, success: Ordering) -> Result<S, S> {
        // The shared code never CASes from the dead word, so `current` is this key's
        // live state and the whole-slot comparison is the ABA guard (module docs).
        self.slot
            .cas_weak(
                pack(self.key, to_bits(&current)),
                pack(self.key, to_bits(&new)),
                success,
            )
            .map(|v| self.state_of(v))
            .map_err(|v| self.state_of(v))
    }
}

/// How a key becomes the 64 bits its slot stores.
pub trait Encoding<K>: Send + Sync {
    /// A new encoder (for a fingerprint: seeds from the table's `seed`, else fresh).
    fn new(seed: Option<u64>) -> Self;
    /// The bits of `key`.
    fn bits<Q: Lookup<K> + ?Sized>(&self, key: &Q) -> u64;
}

/// Exact keys: the key's [`InlineKey`] encoding.
pub struct Exact;

impl<K: InlineKey> Encoding<K> for Exact {
    fn new(_seed: Option<u64>) -> Self {
        Exact
    }

    #[inline(always)]
    fn bits<Q: Lookup<K> + ?Sized>(&self, key: &Q) -> u64 {
        key.to_key().to_bits()
    }
}

/// Fingerprints: a 64-bit keyed hash of the key (seeds as the table's hasher's:
/// [`table_hasher`]).
pub struct Fingerprinted(ahash::RandomState);

impl<K: Hash> Encoding<K> for Fingerprinted {
    fn new(seed: Option<u64>) -> Self {
        Fingerprinted(table_hasher(seed, Salt::Fingerprint))
    }

    #[inline(always)]
    fn bits<Q: Lookup<K> + ?Sized>(&self, key: &Q) -> u64 {
        // A lookup form hashes as its key does (the `Lookup` contract).
        self.0.hash_one(key)
    }
}

/// The inline sharded table: keys (as their 64-bit encoding `E`) to state words `S`.
pub struct InlineTable<S: bytemuck::Pod, E> {
    set: ShardSet<Slot<S>>,
    encoding: E,
}

impl<K, S, E> KeyTable<K, S> for InlineTable<S, E>
where
    S: bytemuck::Pod + Send + Sync,
    E: Encoding<K>,
{
    const SLOT_BYTES: usize = SLOT_BYTES;
    const ENTRY_BYTES: usize = 0;

    fn build(capacity: usize, shards: usize, seed: Option<u64>) -> Self {
        let set = ShardSet::new(capacity, shards, seed, |slots, hasher| {
            (empty_slots(slots), hasher.clone())
        });
        InlineTable {
            set,
            encoding: E::new(seed),
        }
    }

    #[inline(always)]
    fn decide<O, Q, A>(&self, algorithm: &A, key: &Q, now: Nanos, cost: u32) -> O
    where
        O: Outcome<S>,
        Q: Lookup<K> + ?Sized,
        A: Algorithm<State = S> + ?Sized,
    {
        let bits = self.encoding.bits(key);
        let (shard, hash) = self.set.locate(&bits);
        let (generation, noted) = shard.removals.before_probe::<O, S>();
        let found = shard.probe(hash, bits);
        let now = shard.removals.clamp(now);
        if let Some((_, slot, seen)) = found {
            let slot = KeyedSlot::new(slot, bits);
            let seen = slot.state_of(seen);
            if let Some((decision, charge)) = charge_live(algorithm, &slot, seen, now, cost) {
                return O::from_parts(decision, charge, bits, generation, noted);
            }
        }
        // The locked path answers with every part a receipt needs, whatever `O`
        // keeps: an answer larger than `O` is copied out of, never written in
        // place, so the fast path above builds its decision in registers (when the
        // locked path wrote `O` itself, the fast path stored every field of its
        // decision to the memory that call writes: BENCHMARKS.md, "The decision
        // in registers").
        O::from_charge(shard.check_locked(algorithm, hash, bits, now, cost))
    }

    #[inline]
    fn peek<Q, A>(&self, algorithm: &A, key: &Q, now: Nanos, cost: u32) -> Decision
    where
        Q: Lookup<K> + ?Sized,
        A: Algorithm<State = S> + ?Sized,
    {
        let key = self.encoding.bits(key);
        let (shard, hash) = self.set.locate(&key);
        let before = shard.version.begin();
        let clamped = shard.removals.clamp(now);
        let state = match shard.find(hash, key) {
            Some((_, seen)) => Some(state_half(seen)),
            None => shard.version.unchanged(before).then_some(0),
        };
        let (bits, now) = match state {
            // A state the probe saw live, or a trusted miss (fresh, all zero).
            Some(bits) if bits != DEAD => (bits, clamped),
            _ => {
                let _writer = lock(&shard.write.lock);
                let bits = shard
                    .find(hash, key)
                    .map_or(0, |(_, seen)| state_half(seen));
                (bits, shard.removals.clamp(now))
            }
        };
        decide_unwritten(algorithm, from_bits(bits), now, cost)
    }

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
        A: Algorithm<State = S> + ?Sized,
    {
        let bits = self.encoding.bits(key);
        let (shard, hash) = self.set.locate(&bits);
        // A hit is this key's one live slot (readers may still change its state
        // half, never its key).
        shard.refund(algorithm, bits, generation, noted, charge, now, || {
            let (i, _) = shard.find(hash, bits)?;
            Some(KeyedSlot::new(&shard.slots[i], bits))
        })
    }

    fn tag_of<Q: Lookup<K> + ?Sized>(&self, key: &Q) -> u64 {
        self.encoding.bits(key)
    }

    fn remove<Q, A>(&self, algorithm: &A, key: &Q, now: Nanos) -> bool
    where
        Q: Lookup<K> + ?Sized,
        A: Algorithm<State = S> + ?Sized,
    {
        let bits = self.encoding.bits(key);
        let (shard, hash) = self.set.locate(&bits);
        // Under the lock nothing moves and nothing is retired: a hit is this key's
        // one live slot, a miss is a miss.
        remove_at(shard, algorithm, now, |shard| {
            shard.find(hash, bits).map(|(i, _)| i)
        })
    }

    shard_set_methods!(state: S, field: set);
}

/// `n` empty slots, zeroed by the allocator: for a large array the OS maps pages of
/// zeros lazily, so building costs no pass over the memory.
#[cfg(not(loom))]
#[allow(unsafe_code)]
fn empty_slots<S>(n: usize) -> Box<[Slot<S>]> {
    let Ok(layout) = core::alloc::Layout::array::<Slot<S>>(n) else {
        panic!("{n} slots overflow the address space");
    };
    if layout.size() == 0 {
        return Box::new([]);
    }
    // SAFETY: `layout` has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<Slot<S>>();
    if ptr.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    // SAFETY: `ptr` is a live allocation from the global allocator with the layout of
    // `[Slot<S>; n]`, which is the layout `Box<[Slot<S>]>` frees with. All `n` slots
    // are initialised: a `Slot` is one `portable_atomic::AtomicU128` beside a
    // zero-sized marker (`repr(transparent)`), which has the size and bit validity of
    // `u128`, so all-zero bytes are a valid slot — `EMPTY_SLOT`.
    unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(ptr, n)) }
}

/// `n` empty slots (loom's 128-bit atomic is a mutex: built one by one).
#[cfg(loom)]
fn empty_slots<S>(n: usize) -> Box<[Slot<S>]> {
    (0..n).map(|_| Slot::new(EMPTY_SLOT)).collect()
}

impl<S: bytemuck::Pod + Send + Sync> Shard<Slot<S>> {
    /// Lock-free probe: the index of the slot holding `key` live, and the slot's
    /// value as read. A hit may be stale by the time it is used (the CAS re-checks);
    /// a miss may be spurious while keys move (see the module docs).
    #[inline(always)]
    fn find(&self, hash: u64, key: u64) -> Option<(usize, u128)> {
        self.probe(hash, key).map(|(i, _, seen)| (i, seen))
    }

    /// [`find`](Self::find), with the slot itself (a decision CASes it without
    /// indexing the slots again).
    #[inline(always)]
    fn probe(&self, hash: u64, key: u64) -> Option<(usize, &Slot<S>, u128)> {
        let mut i = self.home(hash);
        for _ in 0..self.slots.len() {
            let slot = &self.slots[i];
            let word = slot.load_now();
            if state_half(word) == DEAD {
                return None;
            }
            if key_half(word) == key {
                return Some((i, slot, word));
            }
            i = self.next(i);
        }
        None
    }

    /// The write path: find or insert `key` under the shard lock, then decide.
    #[cold]
    fn check_locked<A>(
        &self,
        algorithm: &A,
        hash: u64,
        key: u64,
        now: Nanos,
        cost: u32,
    ) -> KeyedCharge<S>
    where
        A: Algorithm<State = S> + ?Sized,
    {
        // Under the lock nothing moves and no key is retired: a hit stays `key`'s.
        let found = |now| {
            let (i, seen) = self.find(hash, key)?;
            let slot = KeyedSlot::new(&self.slots[i], key);
            charge_live(algorithm, &slot, slot.state_of(seen), now, cost)
        };
        let insert = |slot: &Slot<S>, next| {
            // Release: the seqlock's stores (see `unlink`); the slot itself is one word.
            slot.0.store(pack(key, to_bits(&next)), Ordering::Release);
        };
        self.decide_locked(algorithm, key, self.home(hash), now, cost, found, insert)
    }
}

impl<S: bytemuck::Pod> Shard<Slot<S>> {
    /// Retires slot `i`'s state to dead and returns the state it held (under the
    /// lock; readers may still charge it until the CAS lands).
    fn freeze(&self, i: usize) -> u128 {
        update_word(&self.slots[i], |current| {
            (current, Some(pack(key_half(current), DEAD)))
        })
    }
}

impl<S: bytemuck::Pod> Slots for Slot<S> {
    type State = S;
    type Extra = ahash::RandomState;

    fn is_empty(&self) -> bool {
        state_half(self.load_now()) == DEAD
    }

    fn state(&self, _held: &Writer) -> Option<S> {
        let bits = state_half(self.load_now());
        (bits != DEAD).then(|| from_bits(bits))
    }

    fn set_state(&mut self, _held: &Writer, state: S) {
        let slot = self.load_now();
        debug_assert!(state_half(slot) != DEAD && !is_dead(&state));
        // Relaxed: `&mut` table, no reader; the next shares the table through a
        // synchronising handoff.
        self.0
            .store(pack(key_half(slot), to_bits(&state)), Ordering::Relaxed);
    }

    /// CAS of the slot's state half to dead (as `judge` says).
    ///
    /// A dead slot reads as empty, so a probe for a key further along the cluster
    /// would stop there: the retirement opens the shard's sequence window (odd
    /// version) *before* the CAS, and the window stays open through the unlink that
    /// follows, so a `peek` never trusts such a miss. If the CAS ends up not writing
    /// (a racing charge made the key live), the window is closed again here.
    fn retire_at(
        shard: &Shard<Self>,
        _held: &Writer,
        i: usize,
        mut judge: impl FnMut(S) -> (Retired, bool),
    ) -> Option<Retired> {
        let mut opened = false;
        let (how, written) = update_word(&shard.slots[i], |current| {
            let bits = state_half(current);
            if bits == DEAD {
                return ((None, false), None);
            }
            let (how, write) = judge(from_bits(bits));
            if write && !opened {
                shard.version.open();
                opened = true;
            }
            (
                (Some(how), write),
                write.then(|| pack(key_half(current), DEAD)),
            )
        });
        if opened && !written {
            shard.version.close();
        }
        how
    }

    /// Backward-shift deletion of the retired slot `hole`: each key that moves is
    /// retired in its old slot before it is published in the new one, so at no
    /// instant do two slots hold it live.
    fn unlink(shard: &Shard<Self>, writer: &mut Writer, mut hole: usize) {
        let n = shard.slots.len();
        // Open already (the retirement opened it); opened here only if not.
        if !shard.version.is_open() {
            shard.version.open();
        }
        let mut j = hole;
        loop {
            j = shard.next(j);
            let slot = shard.slots[j].load_now();
            // Under the lock a dead slot is empty: retiring and unlinking happen in
            // one critical section.
            if state_half(slot) == DEAD {
                break;
            }
            let home = shard.home(shard.extra.hash_one(key_half(slot)));
            // Keep the key at j if its home lies cyclically in (hole, j].
            if (j + n - home) % n < (j + n - hole) % n {
                continue;
            }
            let moved = shard.freeze(j);
            shard.slots[hole].0.store(moved, Ordering::Release);
            hole = j;
        }
        // `hole` is dead already (retired, or frozen by the last move).
        shard.version.close();
        writer.live -= 1;
        shard.write.set_live(writer);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::gcra::{Gcra, GcraState};
    use crate::policy::Policy;

    fn gcra() -> Gcra {
        Gcra::new(Policy::per_second(1).unwrap().with_burst(2).unwrap())
    }

    /// Whether a check of `cost` on `key` at `now` is allowed.
    fn check(
        table: &InlineTable<GcraState, Exact>,
        g: &Gcra,
        key: u64,
        now: Nanos,
        cost: u32,
    ) -> bool {
        table
            .decide::<Decision, _, _>(g, &key, now, cost)
            .is_allowed()
    }

    #[test]
    fn bits_round_trip_and_never_look_dead() {
        let s = GcraState::from_tat(Nanos::new(u64::MAX - 1));
        assert_eq!(from_bits::<GcraState>(to_bits(&s)), s);
        assert_ne!(to_bits(&s), DEAD);
        // Narrow keys and states are zero-extended: never all ones.
        assert_eq!(to_bits(&[0xFFu8; 4]), u64::from(u32::MAX));
        assert_eq!(to_bits(&u32::MAX), u64::from(u32::MAX));
        let slot = pack(7, 9);
        assert_eq!((key_half(slot), state_half(slot)), (7, 9));
    }

    #[test]
    fn insert_evict_reclaim_in_one_shard() {
        let table: InlineTable<GcraState, Exact> = KeyTable::<u64, _>::build(8, 1, None);
        let shard = &table.set.shards[0];
        let g = gcra();
        let t0 = Nanos::from_secs(1);
        for k in 0..8 {
            assert!(check(&table, &g, k, t0, 1));
        }
        assert_eq!(KeyTable::<u64, _>::counts(&table).live, 8);
        for k in 8..20 {
            assert!(check(&table, &g, k, t0, 2));
        }
        assert_eq!(KeyTable::<u64, _>::counts(&table).live, 8);
        assert_eq!(KeyTable::<u64, _>::counts(&table).evicted, 12);
        assert_eq!(
            KeyTable::<u64, _>::reclaim_idle(&table, &g, Nanos::from_secs(10)),
            8
        );
        assert!(KeyTable::<u64, _>::peek(&table, &g, &19u64, Nanos::from_secs(10), 2).is_allowed());
        // Every slot is empty again after backward-shift deletions.
        assert!(shard.slots.iter().all(|s| state_half(s.load_now()) == DEAD));
    }

    /// One shard for 64 keys, hash seed 5.
    fn table_of_64() -> InlineTable<GcraState, Exact> {
        KeyTable::<u64, _>::build(64, 1, Some(5))
    }

    /// The keys 0..64 that land, in a [`table_of_64`] filled in order, on the slots
    /// `on(slot, stride, slot count)` picks, in slot order: the same seed, keys and
    /// order give the same slots in every such table.
    fn keys_of_64_on(on: impl Fn(usize, usize, usize) -> bool) -> Vec<u64> {
        let g = Gcra::new(Policy::per_second(1).unwrap().with_burst(100).unwrap());
        let probe = table_of_64();
        for k in 0..64 {
            assert!(check(&probe, &g, k, Nanos::from_secs(1), 50));
        }
        let shard = &probe.set.shards[0];
        let n = shard.slots.len();
        (0..n)
            .filter(|&i| on(i, shard.stride, n))
            .map(|i| shard.slots[i].load_now())
            .filter(|&bits| state_half(bits) != DEAD)
            .filter_map(|bits| (0..64u64).find(|k| InlineKey::to_bits(k) == key_half(bits)))
            .collect()
    }

    /// A full look's credit (the shared shard code, every storage's): in a shard of
    /// 64 keys (credit ⌊64 / 8⌋ = 8), a look that reclaims 3 idle keys defers the next
    /// one by 8 − 3 = 5 live evictions. The idle keys are read off slots the hand's
    /// first 40 steps do not meet (it starts at slot 0 and inspects 4 slots, then,
    /// from the first of them, 8 live keys, `stride` apart), so only a full look
    /// finds them.
    #[test]
    fn the_keys_a_full_look_reclaims_pay_for_it() {
        let g = Gcra::new(Policy::per_second(1).unwrap().with_burst(100).unwrap());
        let t0 = Nanos::from_secs(1);
        let t2 = Nanos::from_secs(3);
        let far: Vec<u64> = keys_of_64_on(|i, stride, n| !(0..40).any(|k| k * stride % n == i))
            .into_iter()
            .take(3)
            .collect();
        assert_eq!(far.len(), 3, "keys the hand's walk does not meet");
        let table = table_of_64();
        for k in 0..64 {
            // The far keys are idle after 1 s, the others live for 50 s.
            let cost = if far.contains(&k) { 1 } else { 50 };
            assert!(check(&table, &g, k, t0, cost));
        }
        let counts = || KeyTable::<u64, _>::counts(&table);
        // At the share, the hand's walk meets only live keys: the look reclaims the 3.
        assert!(check(&table, &g, 1_000, t2, 50));
        let c = counts();
        assert_eq!((c.reclaimed, c.evicted, c.full_looks), (3, 0, 1));
        // Back to the share, then 5 evictions without a look.
        for k in 1_001..1_008 {
            assert!(check(&table, &g, k, t2, 50));
        }
        let c = counts();
        assert_eq!((c.live, c.evicted, c.full_looks), (64, 5, 1));
        // The sixth is due a look (which finds nothing) first.
        assert!(check(&table, &g, 1_008, t2, 50));
        let c = counts();
        assert_eq!((c.reclaimed, c.evicted, c.full_looks), (3, 6, 2));
    }

    /// The eviction's sample begins where the hand's walk at that insert began, so
    /// the slots the walk just read (in cache) are ranked too: in a shard at its
    /// share of live keys, the one light key, read off a slot of the walk's first 4
    /// steps, is the one evicted, and every heavy key stays.
    #[test]
    fn an_evictions_sample_ranks_the_slots_the_walk_just_read() {
        let g = Gcra::new(Policy::per_second(1).unwrap().with_burst(100).unwrap());
        let t0 = Nanos::from_secs(1);
        // The hand starts at slot 0; the walk reads its first 4 steps, `stride` apart.
        let light = *keys_of_64_on(|i, stride, n| (0..4).any(|k| k * stride % n == i))
            .first()
            .expect("a key on the walk's first steps");
        let table = table_of_64();
        for k in 0..64 {
            let cost = if k == light { 1 } else { 50 };
            assert!(check(&table, &g, k, t0, cost));
        }
        // At the share, every key live: the insert evicts one.
        assert!(check(&table, &g, 1_000, t0, 50));
        let c = KeyTable::<u64, _>::counts(&table);
        assert_eq!((c.live, c.evicted, c.reclaimed), (64, 1, 0));
        // The light key went (fresh again: its whole burst), every heavy key stayed.
        assert!(KeyTable::<u64, _>::peek(&table, &g, &light, t0, 100).is_allowed());
        for k in (0..64).filter(|&k| k != light) {
            assert!(
                !KeyTable::<u64, _>::peek(&table, &g, &k, t0, 51).is_allowed(),
                "heavy key {k} was evicted"
            );
        }
    }

    #[test]
    #[cfg(not(miri))] // 20 000 inserts: too slow under Miri, and .ci/run runs this module's ignored tests there
    fn churn_keeps_runs_short_inline() {
        let exact: InlineTable<GcraState, Exact> = KeyTable::<u64, _>::build(1024, 1, Some(45));
        super::super::tests::churn_keeps_runs_short(&exact, |t| &*t.set.shards[0]);
        let fingerprinted: InlineTable<GcraState, Fingerprinted> =
            KeyTable::<u64, _>::build(1024, 1, Some(45));
        super::super::tests::churn_keeps_runs_short(&fingerprinted, |t| &*t.set.shards[0]);
    }

    #[test]
    fn a_transition_to_the_dead_word_is_refused() {
        let slot = Slot::new(pack(
            3,
            to_bits(&GcraState::from_tat(Nanos::new(u64::MAX - 1_000_000_000))),
        ));
        let view = KeyedSlot::<GcraState>::new(&slot, 3);
        let seen = view.load_now();
        let d = charge_live(
            &gcra(),
            &view,
            seen,
            Nanos::new(u64::MAX - 1_500_000_000),
            1,
        );
        assert!(d.is_some_and(|(d, charge)| !d.is_allowed() && charge.is_none()));
        assert_ne!(state_half(slot.load_now()), DEAD);
        // Another key's CAS never applies to this slot: it reads as dead to key 4.
        let other = KeyedSlot::<GcraState>::new(&slot, 4);
        assert!(is_dead(&other.load_now()));
        assert!(charge_live(&gcra(), &other, other.load_now(), Nanos::new(0), 1).is_none());
        // Even a CAS from a guessed state compares the key half and fails.
        let guessed = view.load_now();
        assert!(other.cas_weak(guessed, guessed, Ordering::Relaxed).is_err());
    }

    /// An empty slot is all zero in memory, so a new table's slot array can come
    /// zeroed from the allocator instead of being written slot by slot.
    #[test]
    fn a_new_table_is_all_zero_bytes() {
        let table: InlineTable<GcraState, Exact> = KeyTable::<u64, _>::build(100, 2, None);
        let g = gcra();
        for shard in table.set.shards.iter() {
            assert!(shard.slots.iter().all(|s| s.0.load(Ordering::Relaxed) == 0));
        }
        // Zero bytes are empty slots: the table behaves as fresh.
        assert!(check(&table, &g, 0, Nanos::from_secs(1), 2));
        assert!(!check(&table, &g, 0, Nanos::from_secs(1), 1));
        assert_eq!(KeyTable::<u64, _>::counts(&table).live, 1);
    }
}
