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

use crossbeam_utils::CachePadded;

use super::{
    charge_live, dead, decide_unwritten, home_slot, is_dead, judge, make_room, next_slot,
    remove_at, KeyTable, Outcome, Removals, Retired, ShardSet, Slots, TableCounts, Take, WriteSide,
    Writer,
};
use crate::algorithm::{Algorithm, Charged};
use crate::cell::{refund_word, update_word, CasWord};
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::keyed::key::Lookup;
use crate::sync::{fence, lock, pin, retire, Atomic, AtomicPtr, AtomicU64, Guard, Ordering};

/// The tag of an empty slot. Occupied tags have the low bit set.
const EMPTY: u64 = 0;

/// Bytes of one slot (tag + pointer), the table's fixed cost per slot.
const SLOT_BYTES: usize = core::mem::size_of::<Slot<(), u64>>();

/// A key and its state word, on the heap so that slots can move it by pointer.
pub(crate) struct Entry<K, S> {
    key: K,
    state: Atomic<S>,
}

struct Slot<K, S> {
    tag: AtomicU64,
    entry: AtomicPtr<Entry<K, S>>,
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

/// The sharded table: keys `K` to state words `S`.
pub struct Table<K, S> {
    set: ShardSet<Shard<K, S>>,
}

impl<K, S> Table<K, S>
where
    K: Eq + Hash + Send + Sync + 'static,
    S: bytemuck::Pod + Send + Sync,
{
    /// The shard of `key` and its tag (its hash with the low bit set).
    #[inline(always)]
    fn locate<Q: Hash + ?Sized>(&self, key: &Q) -> (&Shard<K, S>, u64) {
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
        let set = ShardSet::new(capacity, shards, seed, |shape| Shard {
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
    fn decide<O, Q, A>(&self, algorithm: &A, key: &Q, now: Nanos, cost: u32) -> O
    where
        O: Outcome<S>,
        Q: Lookup<K> + ?Sized,
        A: Algorithm<State = S> + ?Sized,
    {
        let (shard, tag) = self.locate(key);
        let guard = pin();
        // Read before the probe: a removal of the entry found below happens after
        // this read, so a refund sees the generation move.
        let (generation, noted) = if O::RECEIPT {
            (shard.removals.generation(), shard.removals.ledger.note())
        } else {
            (0, 0)
        };
        if let Some(entry) = shard.find(tag, key, &guard) {
            let now = shard.removals.clamp(now);
            let seen = entry.state.load_now();
            if let Some((decision, charge)) = charge_live(algorithm, &entry.state, seen, now, cost)
            {
                return O::from_parts(decision, charge, tag, generation, noted);
            }
        }
        shard.check_locked(algorithm, tag, key, now, cost, &guard)
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

    fn reclaim_idle<A: Algorithm<State = S> + ?Sized>(&self, algorithm: &A, now: Nanos) -> usize {
        self.set.reclaim_idle(algorithm, now)
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

    fn replace_states(&mut self, now: Nanos, f: impl FnMut(S, Nanos) -> S) {
        self.set.replace_states(now, f);
    }

    fn counts(&self) -> TableCounts {
        self.set.counts()
    }

    fn capacity(&self) -> usize {
        self.set.capacity()
    }

    fn shard_count(&self) -> usize {
        self.set.shard_count()
    }

    fn slot_count(&self) -> usize {
        self.set.slot_count()
    }
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
}

impl<K, S> Shard<K, S>
where
    K: Eq + Send + Sync + 'static,
    S: bytemuck::Pod + Send + Sync,
{
    /// The write path: find or insert `key` under the shard lock, then decide.
    #[cold]
    fn check_locked<O, Q, A>(
        &self,
        algorithm: &A,
        tag: u64,
        key: &Q,
        now: Nanos,
        cost: u32,
        guard: &Guard,
    ) -> O
    where
        O: Outcome<S>,
        Q: Lookup<K> + ?Sized,
        A: Algorithm<State = S> + ?Sized,
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
        // Under the lock nothing moves and every linked entry is live: a writer
        // retires and unlinks within one critical section.
        if let Some(entry) = self.find(tag, key, guard) {
            let seen = entry.state.load_now();
            if let Some((decision, charge)) = charge_live(algorithm, &entry.state, seen, now, cost)
            {
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
        // There is always an empty slot: make_room evicts whenever a shard is at its
        // share, and takes its victim whatever it became when the insert would leave
        // fewer than two slots empty. Bounded all the same.
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
            key: key.to_key(),
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

    /// CAS of the entry's state to the dead word (as `take` says: see [`Take`]).
    fn retire_at<A>(&self, algorithm: &A, i: usize, now: Nanos, take: Take) -> Option<Retired>
    where
        A: Algorithm<State = S> + ?Sized,
    {
        let entry = self.entry_at(i)?;
        Some(update_word(&entry.state, |state| {
            let (how, write) = judge(algorithm, state, now, take);
            (how, write.then(dead::<S>))
        }))
    }

    fn unlink(&self, writer: &mut Writer, i: usize) {
        self.unlink_entry(writer, i, &pin());
    }

    fn set_state_at(&mut self, i: usize, state: S) {
        if let Some(entry) = self.entry_at(i) {
            // Relaxed: `&mut self`, no reader; the next shares the table through a
            // synchronising handoff.
            entry.state.store(state, Ordering::Relaxed);
        }
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
