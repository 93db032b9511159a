//! [`Heap`](super::Heap) storage: slots point to heap entries holding each key and
//! its state, for any `Hash + Eq` key.
//!
//! # Layout
//!
//! A power-of-two number of cache-padded shards; a key's 64-bit `ahash` picks its
//! shard from the high bits. Each shard is an open-addressing table with linear
//! probing over a fixed slot array sized once from the shard's share of the capacity
//! (load factor ≤ 3/4, never resized). A slot is two words: a `tag` (the key's hash
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

use core::hash::Hash;
use core::ptr;

use super::{
    charge_live, dead, decide_unwritten, is_dead, remove_at, shard_set_methods, KeyTable,
    KeyedCharge, Outcome, Retired, Shard, ShardSet, Slots, Writer,
};
use crate::algorithm::{Algorithm, Charged};
use crate::cell::{update_word, CasWord};
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::keyed::key::Lookup;
use crate::sync::{lock, pin, retire, Atomic, AtomicPtr, AtomicU64, Guard, Ordering};

/// The tag of an empty slot. Occupied tags have the low bit set.
const EMPTY: u64 = 0;

/// Bytes of one slot (tag + pointer), the table's fixed cost per slot.
const SLOT_BYTES: usize = core::mem::size_of::<Slot<(), u64>>();

/// A key and its state word, on the heap so that slots can move it by pointer.
pub(crate) struct Entry<K, S> {
    key: K,
    state: Atomic<S>,
}

pub(crate) struct Slot<K, S> {
    tag: AtomicU64,
    entry: AtomicPtr<Entry<K, S>>,
}

/// The sharded table: keys `K` to state words `S`.
pub struct Table<K: Send + 'static, S: bytemuck::Pod + Send> {
    set: ShardSet<Slot<K, S>>,
}

impl<K, S> Table<K, S>
where
    K: Eq + Hash + Send + Sync + 'static,
    S: bytemuck::Pod + Send + Sync,
{
    /// The shard of `key` and its tag (its hash with the low bit set).
    #[inline(always)]
    fn locate<Q: Hash + ?Sized>(&self, key: &Q) -> (&Shard<Slot<K, S>>, u64) {
        let (shard, hash) = self.set.locate(key);
        (shard, hash | 1)
    }
}

impl<K, S> KeyTable<K, S> for Table<K, S>
where
    K: Eq + Hash + Send + Sync + 'static,
    S: bytemuck::Pod + Send + Sync,
{
    const SLOT_BYTES: usize = SLOT_BYTES;
    const ENTRY_BYTES: usize = core::mem::size_of::<Entry<K, S>>();

    fn build(capacity: usize, shards: usize, seed: Option<u64>) -> Self {
        let set = ShardSet::new(capacity, shards, seed, |slots, _| {
            let slots = (0..slots)
                .map(|_| Slot {
                    tag: AtomicU64::new(EMPTY),
                    entry: AtomicPtr::new(ptr::null_mut()),
                })
                .collect();
            (slots, ())
        });
        Table { set }
    }

    #[inline(always)]
    fn decide<O, Q, A>(&self, algorithm: &A, key: &Q, now: Nanos, cost: u32) -> O
    where
        O: Outcome<S>,
        Q: Lookup<K> + ?Sized,
        A: Algorithm<State = S> + ?Sized,
    {
        let (shard, tag) = self.locate(key);
        let guard = pin();
        let (generation, noted) = shard.removals.before_probe::<O, S>();
        if let Some(entry) = shard.find(tag, key, &guard) {
            let now = shard.removals.clamp(now);
            let seen = entry.state.load_now();
            if let Some((decision, charge)) = charge_live(algorithm, &entry.state, seen, now, cost)
            {
                return O::from_parts(decision, charge, tag, generation, noted);
            }
        }
        // The locked path answers with a whole `KeyedCharge`, which `O` is copied out
        // of, so the fast path above builds its decision in registers (as on the
        // inline storage: BENCHMARKS.md, "The decision in registers").
        O::from_charge(shard.check_locked(algorithm, tag, key, now, cost, &guard))
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
        let (shard, tag) = self.locate(key);
        let guard = pin();
        shard.refund(algorithm, tag, generation, noted, charge, now, || {
            shard.find(tag, key, &guard).map(|entry| &entry.state)
        })
    }

    fn tag_of<Q: Lookup<K> + ?Sized>(&self, key: &Q) -> u64 {
        self.locate(key).1
    }

    #[inline]
    fn peek<Q, A>(&self, algorithm: &A, key: &Q, now: Nanos, cost: u32) -> Decision
    where
        Q: Lookup<K> + ?Sized,
        A: Algorithm<State = S> + ?Sized,
    {
        let (shard, tag) = self.locate(key);
        let guard = pin();
        let before = shard.version.begin();
        let clamped = shard.removals.clamp(now);
        match shard.find(tag, key, &guard) {
            Some(entry) => {
                let state = entry.state.load(Ordering::Relaxed);
                if !is_dead(&state) {
                    return decide_unwritten(algorithm, state, clamped, cost);
                }
            }
            None => {
                if shard.version.unchanged(before) {
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

    fn remove<Q, A>(&self, algorithm: &A, key: &Q, now: Nanos) -> bool
    where
        Q: Lookup<K> + ?Sized,
        A: Algorithm<State = S> + ?Sized,
    {
        let (shard, tag) = self.locate(key);
        let guard = pin();
        remove_at(shard, algorithm, now, |shard| {
            // Under the lock nothing moves: a miss is a miss.
            let entry = shard.find(tag, key, &guard)?;
            shard.slot_of(tag, entry)
        })
    }

    shard_set_methods!(state: S, field: set);
}

impl<K, S> Shard<Slot<K, S>>
where
    K: Eq + Send + Sync + 'static,
    S: bytemuck::Pod + Send + Sync,
{
    /// Lock-free probe. A hit is always right; a miss may be spurious while entries
    /// move (see the module docs).
    #[inline(always)]
    fn find<'g, Q>(&'g self, tag: u64, key: &Q, _guard: &'g Guard) -> Option<&'g Entry<K, S>>
    where
        Q: Lookup<K> + ?Sized,
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
                    if key.matches(&entry.key) {
                        return Some(entry);
                    }
                }
            }
            i = self.next(i);
        }
        None
    }

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
        Q: Lookup<K> + ?Sized,
        A: Algorithm<State = S> + ?Sized,
    {
        let found = |now| {
            let entry = self.find(tag, key, guard)?;
            charge_live(algorithm, &entry.state, entry.state.load_now(), now, cost)
        };
        let insert = |slot: &Slot<K, S>, next| {
            let entry = Box::into_raw(Box::new(Entry {
                key: key.to_key(),
                state: Atomic::new(next),
            }));
            // Release (both): a reader that sees the tag sees the pointer, and one
            // that sees the pointer sees the entry's contents.
            slot.entry.store(entry, Ordering::Release);
            slot.tag.store(tag, Ordering::Release);
        };
        self.decide_locked(algorithm, tag, self.home(tag), now, cost, found, insert)
    }

    /// The slot linking `entry` (found by `tag`), under the shard lock.
    fn slot_of(&self, tag: u64, entry: &Entry<K, S>) -> Option<usize> {
        let wanted: *const Entry<K, S> = entry;
        let mut i = self.home(tag);
        for _ in 0..self.slots.len() {
            if ptr::eq(self.slots[i].entry.load(Ordering::Relaxed), wanted) {
                return Some(i);
            }
            i = self.next(i);
        }
        None
    }
}

impl<K, S> Slot<K, S> {
    /// The entry in this slot, if any, for as long as `_held` (its shard's lock
    /// guard) is borrowed.
    fn entry<'a>(&'a self, _held: &'a Writer) -> Option<&'a Entry<K, S>> {
        let p = self.entry.load(Ordering::Relaxed);
        // SAFETY: `_held` proves this slot's shard lock is held, and the returned
        // reference cannot outlive that borrow; only lock holders unlink and retire
        // entries, so a linked entry cannot be freed meanwhile.
        (!p.is_null()).then(|| unsafe { &*p })
    }
}

impl<K, S> Slots for Slot<K, S>
where
    K: Send + 'static,
    S: bytemuck::Pod + Send,
{
    type State = S;
    type Extra = ();

    fn is_empty(&self) -> bool {
        self.tag.load(Ordering::Relaxed) == EMPTY
    }

    fn state(&self, held: &Writer) -> Option<S> {
        self.entry(held).map(|e| e.state.load(Ordering::Relaxed))
    }

    fn set_state(&mut self, held: &Writer, state: S) {
        if let Some(entry) = self.entry(held) {
            // Relaxed: `&mut` table, no reader; the next shares the table through a
            // synchronising handoff.
            entry.state.store(state, Ordering::Relaxed);
        }
    }

    /// CAS of the entry's state to the dead word (as `judge` says).
    fn retire_at(
        shard: &Shard<Self>,
        held: &Writer,
        i: usize,
        mut judge: impl FnMut(S) -> (Retired, bool),
    ) -> Option<Retired> {
        let entry = shard.slots[i].entry(held)?;
        Some(update_word(&entry.state, |state| {
            let (how, write) = judge(state);
            (how, write.then(dead::<S>))
        }))
    }

    /// Backward-shift deletion of the (retired) entry in slot `hole`, which then goes
    /// to the epoch.
    fn unlink(shard: &Shard<Self>, writer: &mut Writer, mut hole: usize) {
        let guard = &pin();
        let dead_entry = shard.slots[hole].entry.load(Ordering::Relaxed);
        let n = shard.slots.len();
        // Sequence number odd: readers that miss during the moves retry.
        shard.version.open();
        let mut j = hole;
        loop {
            j = shard.next(j);
            let tag = shard.slots[j].tag.load(Ordering::Relaxed);
            if tag == EMPTY {
                break;
            }
            // Keep the entry at j if its home lies cyclically in (hole, j].
            let from_home = (j + n - shard.home(tag)) % n;
            let from_hole = (j + n - hole) % n;
            if from_home < from_hole {
                continue;
            }
            let p = shard.slots[j].entry.load(Ordering::Relaxed);
            // Pointer first, then tag (Release), as on insert; for a moment the entry
            // sits in both slots, which is harmless: it is one entry, one state word.
            shard.slots[hole].entry.store(p, Ordering::Release);
            shard.slots[hole].tag.store(tag, Ordering::Release);
            hole = j;
        }
        shard.slots[hole].tag.store(EMPTY, Ordering::Release);
        shard.slots[hole]
            .entry
            .store(ptr::null_mut(), Ordering::Release);
        // Even again: a reader that reads it sees every move above.
        shard.version.close();
        writer.live -= 1;
        shard.write.set_live(writer);
        // SAFETY: `dead_entry` came from `Box::into_raw` on insert, is now unlinked
        // from every slot (it was in exactly one at rest, and moves only copy other
        // entries), and is retired exactly once, here, under the shard lock.
        unsafe { retire(guard, dead_entry) };
    }
}

impl<K: Send + 'static, S: bytemuck::Pod + Send> Drop for Table<K, S> {
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
    //! cargo +nightly miri test -p floodgate --lib keyed::storage::heap -- --include-ignored`
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
        let table: Table<String, GcraState> = Table::build(8, 1, None);
        let g = gcra();
        let t0 = Nanos::from_secs(1);
        for i in 0..8 {
            assert!(table
                .decide::<Decision, _, _>(&g, format!("k{i}").as_str(), t0, 1)
                .is_allowed());
        }
        assert_eq!(table.counts().live, 8);
        // Full of live keys: each new key evicts one (backward-shift unlinks).
        for i in 8..20 {
            assert!(table
                .decide::<Decision, _, _>(&g, format!("k{i}").as_str(), t0, 2)
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
            let c = table.decide::<super::super::KeyedCharge<_>, _, _>(
                &g,
                format!("again{i}").as_str(),
                t,
                1,
            );
            if i == 0 {
                charged = c.charge.map(|charge| (charge, c.generation));
            }
        }
        let (charge, generation) = charged.unwrap();
        assert!(table.refund(&g, "again0", generation, 0, &charge, &|| t));
        assert!(!table.refund(&g, "missing", generation, 0, &charge, &|| t));
        // The shard of "again0" removed keys after the charge (here: none, so the
        // refund above went through); a stale generation gives nothing back.
        assert!(!table.refund(&g, "again0", generation.wrapping_add(1), 0, &charge, &|| t));
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "crossbeam-epoch needs -Zmiri-permissive-provenance -Zmiri-tree-borrows -Zmiri-ignore-leaks; .ci/run runs these with --include-ignored"
    )]
    fn remove_and_replace_heap_keys() {
        super::super::tests::remove_deletes_one_key::<Table<u64, GcraState>>();
        super::super::tests::replace_states_rewrites_live_keys::<Table<u64, GcraState>>();
    }

    #[test]
    #[cfg(not(miri))] // 20 000 inserts: too slow under Miri, and .ci/run runs this module's ignored tests there
    fn churn_keeps_runs_short_on_the_heap() {
        let table: Table<u64, GcraState> = Table::build(1024, 1, Some(45));
        super::super::tests::churn_keeps_runs_short(&table, |t| &*t.set.shards[0]);
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "crossbeam-epoch needs -Zmiri-permissive-provenance -Zmiri-tree-borrows -Zmiri-ignore-leaks; .ci/run runs these with --include-ignored"
    )]
    fn threads_race_on_insert_lookup_and_removal() {
        let table: Table<u64, GcraState> = Table::build(4, 1, None);
        let g = gcra();
        std::thread::scope(|s| {
            for t in 0..2u64 {
                let (table, g) = (&table, &g);
                s.spawn(move || {
                    for i in 0..12u64 {
                        let now = Nanos::from_secs(1 + i);
                        let _ = table.decide::<Decision, _, _>(g, &((i + t) % 6), now, 1);
                        let _ = table.peek(g, &(i % 6), now, 1);
                    }
                });
            }
        });
        assert!(table.counts().live <= 4);
    }
}
