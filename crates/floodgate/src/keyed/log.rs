//! [`KeyedSlidingLog`]: the exact sliding log for many keys, with bounded memory.
//!
//! Each key has the log of [`SlidingLog`](crate::SlidingLog) (same semantics, same
//! transitions: an admitted unit at `t` counts while `now < t + P`). A log is many
//! words, so it cannot live in the lock-free table's state word: the keys sit in
//! sharded `HashMap`s, one mutex per shard (cache-padded), each decision one short
//! critical section on its key's shard.
//!
//! # Memory stays bounded
//!
//! A table holds its `capacity` of keys (spread over shards with the same headroom
//! for uneven hashing as the lock-free table) without removing any. Beyond that, a
//! shard first drops the logs of idle keys (no unit counts: lossless), at most once
//! per an eighth of its share of inserts, and when every key is live it evicts the
//! key whose loss forgives least (fewest units counting, then the units counting
//! for the shortest time: the oldest newest unit; as the lock-free table, by units
//! then `reset_after`), ranked over the whole shard: each sweep ranks the eighth of
//! the shard's keys that are lightest, and the evictions until the next sweep take
//! them lightest first, passing over a key heavier now than when it was ranked
//! (charged since, at a later instant or with more units; a key charged since
//! whose older units have left the window may be lighter than it was, and is
//! evicted as ranked; the ranking is made again when none is left). So a key is
//! evicted only once every key that was lighter at the sweep has been evicted or
//! made heavier since — unlike a sample of a
//! few keys in the map's order, which would be the same few every time. Keys of
//! equal weight (keys at their limit whose newest units were logged at one reading,
//! as under a cached clock) take turns: ties are ranked in the order of their
//! hashes from a hand that each sweep moves past the last key it ranked. So a flood
//! of keys charged to the limit evicts each full key about once per share of
//! inserts, not the same front of the map at every sweep; the entries holding the
//! units play no part (a client chooses them by charging at one reading or many).
//! The price of evicting the lightest: a key is evicted at most once per ranking,
//! and a ranking is used up only by `max(⌊share/8⌋, 1)` full-shard inserts,
//! charges of its keys or removals — but a key kept just lighter than a flood's
//! keys (one unit below the limit while they use all of it) is evicted that often,
//! each time starting a fresh log: about the rate at which the lock-free table's
//! sample of 8 finds such a key. Size the capacity for the live set.
//! Each log holds at most `L` entries after an admission, so the table's memory is
//! bounded by [`max_keys`](KeyedSlidingLog::max_keys) rings of at most `2·L`
//! entries of 16 bytes each, plus each shard's map: a slot of `(key, ring)` per
//! key of its share, up to ≈ 4.6 slots per key once a churning flood has filled
//! the map with removals' tombstones (the map never shrinks); the builder checks
//! that bound against its
//! [`memory_budget`](crate::KeyedBuilder::memory_budget). Heap memory a key owns (a
//! `String`'s bytes) comes on top: bound keys' lengths where they come from, as
//! floodgate-http's extractors do.
//!
//! # Removals and earlier readings
//!
//! As in the lock-free table: every removal (reclaimed, evicted, [`remove`]) bumps its
//! shard's generation, so a receipt taken before it refunds nothing, and records the
//! instant it was judged at; every later decision in the shard is judged no earlier
//! than that instant, so a reading taken before a reclamation cannot see a fresh log
//! where the removed one still had units counting.
//!
//! [`remove`]: KeyedSlidingLog::remove

use core::borrow::Borrow;
use core::fmt;
use core::hash::Hash;
use std::collections::HashMap;

use crossbeam_utils::CachePadded;

use super::limiter::KeyedMetrics;
use super::storage::{table_hasher, Salt};
use crate::clock::{Clock, Nanos};
use crate::decision::Decision;
use crate::policy::Policy;
use crate::receipt::{Owner, Receipt};
use crate::sliding_log::{Bounds, Ring};
use crate::sync::{lock, Mutex};

/// What evicting a log forgives, as an order: the units still counting, then the
/// instant its newest unit was logged at (units logged later count longer).
/// Eviction takes the least. Not the entries holding the units: a client chooses
/// those (units charged at one reading make one entry, at `L` readings `L`), and
/// evicting either forgives the same units.
type Weight = (u64, u64);

/// The weight of `ring` at `now` under `bounds`, of a period of `period` ns.
fn weight_of(ring: &Ring, bounds: Bounds, period: u64, now: u64) -> Weight {
    let units = ring.live_units(bounds, now);
    if units == 0 {
        return (0, 0);
    }
    // The newest entry leaves `reset` after `now`, a period after it was logged.
    let reset = ring.judge(bounds, now, 0).0.reset_after_nanos();
    let newest = (u128::from(now) + u128::from(reset)).saturating_sub(u128::from(period));
    (units, u64::try_from(newest).unwrap_or(u64::MAX))
}

/// A key ranked for eviction by its weight when ranked, ties broken by its turn
/// (compared by weight, then turn).
struct Ranked<K> {
    weight: Weight,
    /// How far the key's hash lies past the shard's hand: among keys of equal
    /// weight, the nearest go first.
    turn: u64,
    key: K,
}

impl<K> PartialEq for Ranked<K> {
    fn eq(&self, other: &Self) -> bool {
        (self.weight, self.turn) == (other.weight, other.turn)
    }
}

impl<K> Eq for Ranked<K> {}

impl<K> PartialOrd for Ranked<K> {
    fn partial_cmp(&self, other: &Self) -> Option<core::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<K> Ord for Ranked<K> {
    fn cmp(&self, other: &Self) -> core::cmp::Ordering {
        (self.weight, self.turn).cmp(&(other.weight, other.turn))
    }
}

/// One shard: its keys' logs and its counters, under one mutex.
struct LogShard<K> {
    logs: HashMap<K, Ring, ahash::RandomState>,
    bounds: Bounds,
    policy: Policy,
    /// Removals so far: a receipt from an earlier generation refunds nothing.
    generation: u64,
    /// The latest instant a log was removed at: decisions are judged no earlier.
    removed_at: u64,
    /// Full-shard inserts left before the next sweep for idle logs.
    sweep_credit: usize,
    /// The lightest keys of the shard at the last sweep, heaviest first: the next
    /// evictions' victims.
    ranked: Vec<Ranked<K>>,
    /// Where the ranking of keys of equal weight starts: just past the hash of the
    /// heaviest key the last sweep ranked, so that tied keys take their turns.
    hand: u64,
    counts: KeyedMetrics,
    /// Sweeps so far: for tests of their amortised cost.
    #[cfg(test)]
    sweeps: u64,
}

/// The exact sliding log per key: see the [module docs](self). Build it with
/// [`KeyedBuilder::sliding_log`](crate::KeyedBuilder::sliding_log).
///
/// Keys are looked up by any borrowed form (`&str` for `String` keys); a key
/// already present never allocates. Keys are `Clone` (an eviction copies its
/// victim's key to remove it).
///
/// # Examples
///
/// ```
/// use floodgate::{KeyedBuilder, ManualClock, Policy};
/// use std::time::Duration;
/// let clock = ManualClock::new();
/// let logins = KeyedBuilder::default()
///     .capacity(10_000)
///     .clock(clock.clone())
///     .sliding_log::<String>(Policy::per_minute(2)?)?;
/// assert!(logins.check("alice").is_allowed()); // at 0 s
/// clock.advance(Duration::from_secs(30));
/// assert!(logins.check("alice").is_allowed()); // at 30 s
/// let denied = logins.check("alice");
/// assert_eq!(denied.retry_after(), Some(Duration::from_secs(30))); // the 0 s unit leaves at 60 s
/// assert!(logins.check("bob").is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct KeyedSlidingLog<K, C> {
    clock: C,
    shards: Box<[CachePadded<Mutex<LogShard<K>>>]>,
    hasher: ahash::RandomState,
    shard_bits: u32,
    /// Keys a shard holds before it removes any.
    share: usize,
    capacity: usize,
    memory_budget: usize,
    /// The id its receipts carry.
    owner: Owner,
}

/// The most bytes the logs of `shards` shards of `share` keys each, keys of type
/// `K`, can hold under `policy`: each shard's map and each key's ring buffer.
///
/// * **The map** (`std`'s `HashMap`, hashbrown): a bucket per slot, each the
///   `(key, ring)` pair and a control byte, plus a group's control bytes. A map
///   holding at most `share` keys has `b` = the next power of two at or above
///   `⌊share · 8/7⌋` buckets (at most 16 below 15 keys); it grows once more when
///   removals' tombstones fill it while more than half of it holds keys (it
///   resizes to hold one more than it could), never again: after that doubling
///   `share` keys fill at most half of it, and tombstones are cleared in place. So
///   at most `2·b` buckets — up to ≈ 4.6 slots per key — since `retain` and
///   `remove` never shrink a map. A table under a churning flood reaches that.
/// * **The rings**: at most `L` entries of 16 bytes after an admission; a
///   `VecDeque`'s buffer at most doubles what it held, and holds 4 at least.
/// * **The ranking**: the `max(⌊share / 8⌋, 1)` lightest keys (clones), their
///   weights and turns, for the evictions between two sweeps.
///
/// Not counted: heap memory a key owns (a `String`'s bytes); bound it where keys
/// come from (floodgate-http's extractors bound their keys' lengths).
pub(crate) fn worst_case_bytes<K>(share: usize, shards: usize, policy: Policy) -> Option<usize> {
    let entries = usize::try_from(policy.limit()).ok()?.checked_mul(2)?.max(4);
    let ring_bytes = entries.checked_mul(16)?;
    let buckets = (share.checked_mul(8)? / 7)
        .checked_next_power_of_two()?
        .max(16)
        .checked_mul(2)?;
    let map_bytes = buckets
        .checked_mul(core::mem::size_of::<(K, Ring)>() + 1)?
        .checked_add(16)?;
    let ranked_bytes = (share / 8)
        .max(1)
        .checked_mul(core::mem::size_of::<Ranked<K>>())?;
    let shard_bytes = share
        .checked_mul(ring_bytes)?
        .checked_add(map_bytes)?
        .checked_add(ranked_bytes)?;
    shards.checked_mul(shard_bytes)
}

impl<K, C> KeyedSlidingLog<K, C>
where
    K: Hash + Eq + Clone,
    C: Clock,
{
    /// A table of `shards` shards (a power of two) holding `share` keys each.
    pub(crate) fn assemble(
        clock: C,
        policy: Policy,
        capacity: usize,
        shards: usize,
        share: usize,
        memory_budget: usize,
        seed: Option<u64>,
    ) -> Self {
        let shards_list = (0..shards)
            .map(|n| {
                CachePadded::new(Mutex::new(LogShard {
                    logs: HashMap::with_hasher(table_hasher(seed, Salt::LogShard(n as u64))),
                    bounds: Bounds::of(policy),
                    policy,
                    generation: 0,
                    removed_at: 0,
                    sweep_credit: 0,
                    ranked: Vec::new(),
                    hand: 0,
                    counts: KeyedMetrics::default(),
                    #[cfg(test)]
                    sweeps: 0,
                }))
            })
            .collect();
        KeyedSlidingLog {
            clock,
            shards: shards_list,
            hasher: table_hasher(seed, Salt::Table),
            shard_bits: shards.trailing_zeros(),
            share,
            capacity,
            memory_budget,
            owner: Owner::new(),
        }
    }

    /// The hash of `key` and its shard.
    #[inline]
    fn locate<Q: Hash + ?Sized>(&self, key: &Q) -> (u64, &Mutex<LogShard<K>>) {
        let hash = self.hasher.hash_one(key);
        let shard = super::storage::shard_index(hash, self.shard_bits);
        (hash, &self.shards[shard])
    }

    /// Decides one unit for `key` now, logging it if allowed.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedBuilder, ManualClock, Policy};
    /// let log = KeyedBuilder::default().clock(ManualClock::new()).sliding_log::<u64>(Policy::per_second(1)?)?;
    /// assert!(log.check(&1).is_allowed());
    /// assert!(!log.check(&1).is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn check<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_n(key, 1)
    }

    /// Decides `cost` units for `key` now, logging them if allowed.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedBuilder, ManualClock, Policy};
    /// let log = KeyedBuilder::default().clock(ManualClock::new()).sliding_log::<u64>(Policy::per_second(5)?)?;
    /// assert_eq!(log.check_n(&1, 4).remaining(), 1);
    /// assert_eq!(log.check_n(&1, 6).retry_after(), None); // more than the limit: never
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn check_n<Q>(&self, key: &Q, cost: u32) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.charge_at(key, self.clock.now(), cost).0
    }

    /// [`check_n`](KeyedSlidingLog::check_n) at an instant the caller read.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedBuilder, ManualClock, Nanos, Policy};
    /// let log = KeyedBuilder::default().clock(ManualClock::new()).sliding_log::<u64>(Policy::per_second(1)?)?;
    /// assert!(log.check_n_at(&1, Nanos::from_secs(5), 1).is_allowed());
    /// assert!(log.check_n_at(&1, Nanos::from_secs(6), 1).is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_n_at<Q>(&self, key: &Q, now: Nanos, cost: u32) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.charge_at(key, now, cost).0
    }

    /// Decides `cost` units for `key` now, with a [`Receipt`] for a later
    /// [`refund`](KeyedSlidingLog::refund).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedBuilder, ManualClock, Policy};
    /// let log = KeyedBuilder::default().clock(ManualClock::new()).sliding_log::<String>(Policy::per_minute(5)?)?;
    /// let (decision, receipt) = log.charge("alice", 5);
    /// assert_eq!(decision.remaining(), 0);
    /// assert!(log.refund("alice", receipt));
    /// assert_eq!(log.peek("alice", 0).remaining(), 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charge<Q>(&self, key: &Q, cost: u32) -> (Decision, Receipt)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.charge_at(key, self.clock.now(), cost)
    }

    /// [`charge`](KeyedSlidingLog::charge) at an instant the caller read.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedBuilder, ManualClock, Nanos, Policy};
    /// let log = KeyedBuilder::default().clock(ManualClock::new()).sliding_log::<u64>(Policy::per_second(1)?)?;
    /// let (decision, receipt) = log.charge_at(&1, Nanos::from_secs(3), 1);
    /// assert!(decision.is_allowed() && receipt.is_charged());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charge_at<Q>(&self, key: &Q, now: Nanos, cost: u32) -> (Decision, Receipt)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (hash, shard) = self.locate(key);
        let mut shard = lock(shard);
        let now = Nanos::new(now.as_u64().max(shard.removed_at));
        let bounds = shard.bounds;
        let (decision, charge) = match shard.logs.get_mut(key) {
            Some(ring) => ring.charge(bounds, now, cost),
            None => {
                // A fresh log: kept only if the request logged anything.
                let mut ring = Ring::default();
                let (decision, charge) = ring.charge(bounds, now, cost);
                if charge.is_some() {
                    self.make_room(&mut shard, now.as_u64());
                    shard.logs.insert(key.to_owned(), ring);
                }
                (decision, charge)
            }
        };
        if decision.is_allowed() {
            shard.counts.allowed += 1;
        } else {
            shard.counts.denied += 1;
        }
        let receipt = Receipt::new(self.owner, hash, shard.generation, charge.map(|c| (c, 0)));
        (decision, receipt)
    }

    /// Makes room for one more key in a shard at its share: drops idle logs
    /// (lossless) and ranks the shard's lightest keys when the sweep credit allows,
    /// then, if the shard is still full, evicts the lightest ranked key that is
    /// still no heavier than when it was ranked — ranking again if none is.
    fn make_room(&self, shard: &mut LogShard<K>, now: u64) {
        if shard.logs.len() < self.share {
            return;
        }
        if shard.sweep_credit == 0 {
            self.sweep(shard, now);
        } else {
            shard.sweep_credit -= 1;
        }
        if shard.logs.len() < self.share || Self::evict_ranked(shard, now) {
            return;
        }
        // Every ranked key has left or been charged since: rank again. Using a
        // ranking up takes as many removals or charges as it holds keys, so this
        // costs each of them O(log share) on average.
        self.sweep(shard, now);
        if shard.logs.len() >= self.share {
            Self::evict_ranked(shard, now);
        }
    }

    /// Drops the idle logs (lossless), then ranks the lightest keys left — as many
    /// as the full-shard inserts until the next sweep — for the evictions until then;
    /// keys of equal weight in hash order from the shard's hand, which then moves
    /// past the heaviest key ranked (tied keys take turns). Hashing every key costs
    /// `O(share)` more per sweep, within its `O(share · log share)`.
    ///
    /// The ranking looks at every key of the shard, as the sweep does: a sample of
    /// a few keys taken in the map's order would be the same few every time (the
    /// map's first slots), and once a flood's light keys there were evicted, every
    /// eviction would take one of the heavy keys left in them while lighter keys
    /// sat in the rest of the map.
    fn sweep(&self, shard: &mut LogShard<K>, now: u64) {
        #[cfg(test)]
        {
            shard.sweeps += 1;
        }
        let bounds = shard.bounds;
        let period = shard.policy.period_nanos();
        let before = shard.logs.len();
        shard.logs.retain(|_, ring| !ring.is_idle(bounds, now));
        let dropped = before - shard.logs.len();
        if dropped > 0 {
            shard.counts.reclaimed += dropped as u64;
            Self::record_removal(shard, now);
        }
        let wanted = (self.share / 8).max(1);
        shard.sweep_credit = wanted;
        // The `wanted` lightest, kept in a max-heap on the ranking's own buffer.
        let mut ranked = core::mem::take(&mut shard.ranked);
        ranked.clear();
        let mut heap = std::collections::BinaryHeap::from(ranked);
        heap.reserve_exact(wanted);
        let hand = shard.hand;
        for (key, ring) in &shard.logs {
            let weight = weight_of(ring, bounds, period, now);
            let turn = self.hasher.hash_one(key).wrapping_sub(hand);
            if heap.len() < wanted {
                heap.push(Ranked {
                    weight,
                    turn,
                    key: key.clone(),
                });
            } else if let Some(mut heaviest) = heap.peek_mut() {
                if (weight, turn) < (heaviest.weight, heaviest.turn) {
                    *heaviest = Ranked {
                        weight,
                        turn,
                        key: key.clone(),
                    };
                }
            }
        }
        // Ascending, then reversed: `pop` takes the lightest.
        let mut ranked = heap.into_sorted_vec();
        ranked.reverse();
        // The next sweep ranks keys tied with the heaviest ranked one from past it.
        if let Some(heaviest) = ranked.first() {
            shard.hand = hand.wrapping_add(heaviest.turn).wrapping_add(1);
        }
        shard.ranked = ranked;
    }

    /// Evicts the lightest ranked key still in the shard and no heavier than when
    /// it was ranked (one made heavier since, by a charge, is passed over). Whether
    /// one was evicted.
    fn evict_ranked(shard: &mut LogShard<K>, now: u64) -> bool {
        let bounds = shard.bounds;
        let period = shard.policy.period_nanos();
        while let Some(Ranked { weight, key, .. }) = shard.ranked.pop() {
            let Some(ring) = shard.logs.get(&key) else {
                continue;
            };
            if weight_of(ring, bounds, period, now) > weight {
                continue;
            }
            let idle = ring.is_idle(bounds, now);
            shard.logs.remove(&key);
            if idle {
                shard.counts.reclaimed += 1;
            } else {
                shard.counts.evicted += 1;
            }
            Self::record_removal(shard, now);
            return true;
        }
        false
    }

    /// A removal at `now`: receipts from before it refund nothing, and later
    /// decisions are judged no earlier than `now`.
    fn record_removal(shard: &mut LogShard<K>, now: u64) {
        shard.generation = shard.generation.wrapping_add(1);
        shard.removed_at = shard.removed_at.max(now);
    }

    /// What [`check_n`](KeyedSlidingLog::check_n) would decide now; writes nothing,
    /// inserts nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedBuilder, ManualClock, Policy};
    /// let log = KeyedBuilder::default().clock(ManualClock::new()).sliding_log::<u64>(Policy::per_second(2)?)?;
    /// assert_eq!(log.peek(&1, 1), log.check(&1));
    /// assert_eq!(log.metrics().live_keys, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek<Q>(&self, key: &Q, cost: u32) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.peek_at(key, self.clock.now(), cost)
    }

    /// [`peek`](KeyedSlidingLog::peek) at an instant the caller read.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedBuilder, ManualClock, Nanos, Policy};
    /// let log = KeyedBuilder::default().clock(ManualClock::new()).sliding_log::<u64>(Policy::per_second(2)?)?;
    /// assert!(log.peek_at(&1, Nanos::from_secs(1), 2).is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek_at<Q>(&self, key: &Q, now: Nanos, cost: u32) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (_, shard) = self.locate(key);
        let shard = lock(shard);
        let now = now.as_u64().max(shard.removed_at);
        match shard.logs.get(key) {
            Some(ring) => ring.judge(shard.bounds, now, cost).0,
            None => Ring::default().judge(shard.bounds, now, cost).0,
        }
    }

    /// Gives back the units the charge behind `receipt` logged for `key`, if they
    /// still count (see [`SlidingLog::refund`](crate::SlidingLog::refund)); returns
    /// whether anything came back. A receipt of another limiter or key, of a charge
    /// that took nothing, or taken before any removal in the key's shard, gives back
    /// nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedBuilder, ManualClock, Policy};
    /// let log = KeyedBuilder::default().clock(ManualClock::new()).sliding_log::<u64>(Policy::per_second(1)?)?;
    /// let (_, receipt) = log.charge(&1, 1);
    /// assert!(!log.refund(&2, receipt)); // not key 2's charge
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund<Q>(&self, key: &Q, receipt: Receipt) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (hash, shard) = self.locate(key);
        let Some(charge) = receipt.charge_for::<u64>(self.owner, hash) else {
            return false;
        };
        let mut shard = lock(shard);
        if shard.generation != receipt.generation() {
            return false;
        }
        let bounds = shard.bounds;
        // Read after the lock: no earlier than any admission the log holds.
        let now = self.clock.now().as_u64().max(shard.removed_at);
        shard
            .logs
            .get_mut(key)
            .is_some_and(|ring| ring.give_back(bounds, now, &charge))
    }

    /// Deletes `key`'s log and returns whether it had one (to unblock a client, or
    /// to clear a login counter). Receipts taken before it refund nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedBuilder, ManualClock, Policy};
    /// let log = KeyedBuilder::default().clock(ManualClock::new()).sliding_log::<u64>(Policy::per_second(1)?)?;
    /// assert!(log.check(&1).is_allowed());
    /// assert!(!log.check(&1).is_allowed());
    /// assert!(log.remove(&1));
    /// assert!(log.check(&1).is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn remove<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (_, shard) = self.locate(key);
        let mut shard = lock(shard);
        // Read under the lock: later decisions in the shard are judged no earlier.
        let now = self.clock.now().as_u64();
        if shard.logs.remove(key).is_none() {
            return false;
        }
        shard.counts.removed += 1;
        Self::record_removal(&mut shard, now);
        true
    }

    /// [`remove`](KeyedSlidingLog::remove): the key's next request starts a fresh log.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedBuilder, ManualClock, Policy};
    /// let log = KeyedBuilder::default().clock(ManualClock::new()).sliding_log::<u64>(Policy::per_second(1)?)?;
    /// assert!(!log.reset(&1)); // nothing to reset
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reset<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.remove(key)
    }

    /// Replaces the policy for every key, through a shared reference. Each log keeps
    /// its timestamps — exact under any period (see
    /// [`SlidingLog::set_policy`](crate::SlidingLog::set_policy)); each shard
    /// switches under its own lock, so every decision runs on one whole policy.
    ///
    /// # Errors
    ///
    /// [`KeyedError::OverMemoryBudget`](crate::KeyedError::OverMemoryBudget) when
    /// the table's worst case under `policy` exceeds its memory budget; nothing
    /// changes.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedBuilder, ManualClock, Policy};
    /// let log = KeyedBuilder::default().clock(ManualClock::new()).sliding_log::<u64>(Policy::per_minute(10)?)?;
    /// assert!(log.check_n(&1, 4).is_allowed());
    /// log.set_policy(Policy::per_minute(5)?)?;
    /// assert_eq!(log.peek(&1, 0).remaining(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_policy(&self, policy: Policy) -> Result<(), super::KeyedError> {
        let bytes =
            worst_case_bytes::<K>(self.share, self.shards.len(), policy).unwrap_or(usize::MAX);
        if bytes > self.memory_budget {
            return Err(super::KeyedError::OverMemoryBudget {
                capacity: self.capacity,
                slot_bytes: bytes,
                budget: self.memory_budget,
            });
        }
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            shard.bounds = Bounds::of(policy);
            shard.policy = policy;
        }
        Ok(())
    }

    /// The policy every key is judged by.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedBuilder, Policy};
    /// let log = KeyedBuilder::default().sliding_log::<u64>(Policy::per_second(3)?)?;
    /// assert_eq!(log.policy().limit(), 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn policy(&self) -> Policy {
        lock(&self.shards[0]).policy
    }

    /// Counters summed over the shards: decisions, live keys, and keys removed
    /// (reclaimed idle, evicted live, or removed by [`remove`](KeyedSlidingLog::remove)).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedBuilder, ManualClock, Policy};
    /// let log = KeyedBuilder::default().clock(ManualClock::new()).sliding_log::<u64>(Policy::per_second(1)?)?;
    /// let _ = (log.check(&1), log.check(&1), log.check(&2));
    /// let m = log.metrics();
    /// assert_eq!((m.allowed, m.denied, m.live_keys), (2, 1, 2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn metrics(&self) -> KeyedMetrics {
        self.shards
            .iter()
            .fold(KeyedMetrics::default(), |sum, shard| {
                let shard = lock(shard);
                let c = shard.counts;
                KeyedMetrics {
                    allowed: sum.allowed + c.allowed,
                    denied: sum.denied + c.denied,
                    live_keys: sum.live_keys + shard.logs.len() as u64,
                    reclaimed: sum.reclaimed + c.reclaimed,
                    evicted: sum.evicted + c.evicted,
                    removed: sum.removed + c.removed,
                }
            })
    }

    /// Entries (instants with units) logged over every key: for memory metrics.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedBuilder, ManualClock, Policy};
    /// let log = KeyedBuilder::default().clock(ManualClock::new()).sliding_log::<u64>(Policy::per_second(9)?)?;
    /// let _ = (log.check_n(&1, 3), log.check(&2));
    /// assert_eq!(log.entries(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn entries(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| lock(shard).logs.values().map(Ring::len).sum::<usize>())
            .sum()
    }

    /// The keys held without removing any (the builder's capacity).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedBuilder, Policy};
    /// let log = KeyedBuilder::default().capacity(5_000).sliding_log::<u64>(Policy::per_second(3)?)?;
    /// assert_eq!(log.capacity(), 5_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The most keys the table can hold: each shard's share of the capacity plus the
    /// slack for uneven hashing, as [`KeyedLimiter::max_keys`](crate::KeyedLimiter::max_keys).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{KeyedBuilder, Policy};
    /// let log = KeyedBuilder::default().capacity(1_000).shards(4).sliding_log::<u64>(Policy::per_second(3)?)?;
    /// assert_eq!(log.max_keys(), 4 * (250 + 131));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn max_keys(&self) -> usize {
        self.share * self.shards.len()
    }

    /// The clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Clock, KeyedBuilder, ManualClock, Nanos, Policy};
    /// let log = KeyedBuilder::default().clock(ManualClock::new()).sliding_log::<u64>(Policy::per_second(3)?)?;
    /// assert_eq!(log.clock().now(), Nanos::ZERO);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn clock(&self) -> &C {
        &self.clock
    }
}

impl<K, C: fmt::Debug> fmt::Debug for KeyedSlidingLog<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedSlidingLog")
            .field("capacity", &self.capacity)
            .field("shards", &self.shards.len())
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    /// Buckets behind a `HashMap` that reports `capacity` (hashbrown: 7/8 of its
    /// buckets from 8 buckets on, one fewer below).
    fn buckets(capacity: usize) -> usize {
        if capacity < 8 {
            capacity + 1
        } else {
            capacity * 8 / 7
        }
    }

    /// A churning flood of unique `String` keys (1 unit each, the clock moving so
    /// that some logs go idle and are swept, the rest evicted) through one shard of
    /// `share` keys: the map's buckets, the rings' buffers and the ranking, as the
    /// table holds them at their largest, stay within the worst case the budget is
    /// checked against. Shares just under 7/8 of a power of two fill the map with tombstones
    /// until it doubles.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn a_churning_flood_stays_within_the_budgeted_worst_case() {
        for (share, limit) in [
            (10, 1),
            (100, 1),
            (1_700, 1),
            (1_792, 1),
            (1_793, 1),
            (3_000, 2),
        ] {
            let clock = ManualClock::new();
            let policy = Policy::per_second(limit).unwrap();
            let log = crate::KeyedBuilder::default()
                .capacity(share)
                .shards(1)
                .clock(clock.clone())
                .sliding_log::<String>(policy)
                .unwrap();
            let mut most = 0;
            for i in 0..share * 30 {
                for _ in 0..limit {
                    let _ = log.check(format!("k{i}").as_str());
                }
                if i % 7 == 0 {
                    clock.advance(core::time::Duration::from_millis(1));
                }
                if i % 61 == 0 || i + 1 == share * 30 {
                    let shard = lock(&log.shards[0]);
                    let map = buckets(shard.logs.capacity())
                        * (core::mem::size_of::<(String, Ring)>() + 1)
                        + 16;
                    let rings: usize = shard.logs.values().map(|r| r.room() * 16).sum();
                    let ranked = shard.ranked.capacity() * core::mem::size_of::<Ranked<String>>();
                    most = most.max(map + rings + ranked);
                }
            }
            let bound = worst_case_bytes::<String>(log.share, 1, policy).unwrap();
            assert!(
                most <= bound,
                "share {share}: {most} bytes held, {bound} budgeted"
            );
        }
    }

    /// What one shard of `share` keys of type `K` holds at its largest under a
    /// churning flood of `make(i)` keys (1 unit each, some going idle), against its
    /// budgeted worst case.
    fn churn<K: Hash + Eq + Clone>(share: usize, make: impl Fn(usize) -> K) -> (usize, usize) {
        let clock = ManualClock::new();
        let policy = Policy::per_second(1).unwrap();
        let log = crate::KeyedBuilder::default()
            .capacity(share)
            .shards(1)
            .clock(clock.clone())
            .sliding_log::<K>(policy)
            .unwrap();
        assert_eq!(log.share, share);
        let mut most = 0;
        for i in 0..share * 40 + 64 {
            let _ = log.check(&make(i));
            if i % 5 == 0 {
                clock.advance(core::time::Duration::from_millis(1));
            }
            let shard = lock(&log.shards[0]);
            let map = buckets(shard.logs.capacity()) * (core::mem::size_of::<(K, Ring)>() + 1) + 16;
            let rings: usize = shard.logs.values().map(|r| r.room() * 16).sum();
            let ranked = shard.ranked.capacity() * core::mem::size_of::<Ranked<K>>();
            most = most.max(map + rings + ranked);
        }
        (most, worst_case_bytes::<K>(share, 1, policy).unwrap())
    }

    /// The budget holds for the smallest shares (one key, fewer keys than a
    /// group's 16 buckets, the shares where a map of 16 or 32 buckets fills) and
    /// for keys of no bytes to large ones, not only for `String`s.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn small_shares_and_any_key_size_stay_within_the_budget() {
        for share in [1, 2, 3, 4, 7, 8, 13, 14, 15, 16, 27, 28, 29, 56, 57] {
            let (most, bound) = churn(share, |i| i as u64);
            assert!(
                most <= bound,
                "u64, share {share}: {most} held, {bound} budgeted"
            );
            let (most, bound) = churn(share, |i| {
                let mut key = [0u8; 200];
                key[..8].copy_from_slice(&(i as u64).to_le_bytes());
                key
            });
            assert!(
                most <= bound,
                "[u8; 200], share {share}: {most} held, {bound} budgeted"
            );
            let (most, bound) = churn(share, |i| (i as u16, ()));
            assert!(
                most <= bound,
                "(u16, ()), share {share}: {most} held, {bound} budgeted"
            );
        }
    }

    /// A sweep ranks the whole shard (`O(share · log share)`), so it must be paid
    /// for: by the `share / 8` full-shard inserts of its credit, or — when the
    /// ranking runs out first — by as many evictions, charges of ranked keys or
    /// removals. A plain flood sweeps once per eighth of a share of inserts; an
    /// adversary who charges every ranked key after each insert (here knowing the
    /// ranking) forces a sweep at every insert, but only by paying a charge per
    /// ranked key: sweeps never outnumber twice the inserts, charges and removals
    /// per ranking, never one per insert for free.
    #[test]
    fn a_sweep_is_paid_for_by_inserts_charges_or_removals() {
        // Smaller under Miri (thousands of map operations there take minutes).
        let (share, inserts) = if cfg!(miri) { (16, 48) } else { (64, 800) };
        let wanted = (share / 8) as u64;
        let log = crate::KeyedBuilder::default()
            .capacity(share)
            .shards(1)
            .clock(ManualClock::new())
            .sliding_log::<u64>(Policy::per_second(1_000_000).unwrap())
            .unwrap();
        let sweeps = || lock(&log.shards[0]).sweeps;
        for key in 0..share as u64 {
            assert!(log.check(&key).is_allowed());
        }
        // A plain flood: one sweep per credit.
        for key in 0..inserts {
            assert!(log.check(&(1_000 + key)).is_allowed());
        }
        let plain = sweeps();
        assert!(
            plain <= inserts / wanted + 1,
            "{plain} sweeps for {inserts} inserts"
        );
        // The adversary: after each insert, charge every key left in the ranking;
        // every few inserts, remove one ranked key too.
        let (mut charges, mut removals) = (0u64, 0u64);
        for key in 0..inserts {
            assert!(log.check(&(10_000 + key)).is_allowed());
            let ranked: Vec<u64> = lock(&log.shards[0]).ranked.iter().map(|r| r.key).collect();
            for (n, ranked_key) in ranked.iter().enumerate() {
                if n == 0 && key % 4 == 0 {
                    assert!(log.remove(ranked_key));
                    removals += 1;
                } else {
                    assert!(log.check(ranked_key).is_allowed());
                    charges += 1;
                }
            }
        }
        let forced = sweeps() - plain;
        assert!(
            forced > inserts / wanted + 1,
            "the adversary forced no extra sweep: {forced}"
        );
        let paid = (inserts + charges + removals) / wanted;
        assert!(
            forced <= 2 * paid + 2,
            "{forced} sweeps for {inserts} inserts, {charges} charges, {removals} removals"
        );
    }

    /// The budget's edges: a table whose worst case is exactly its budget builds,
    /// one byte less is refused; a limit whose worst case overflows `usize` (huge
    /// `L`) is refused with an error, not a panic, at build and at `set_policy`
    /// (which then changes nothing), even under a budget of `usize::MAX − 1`.
    #[test]
    fn the_budget_is_checked_to_the_byte_and_overflow_is_an_error() {
        let policy = Policy::per_second(3).unwrap();
        let build = |budget: usize, policy: Policy| {
            crate::KeyedBuilder::default()
                .capacity(100)
                .shards(2)
                .clock(ManualClock::new())
                .memory_budget(budget)
                .sliding_log::<u64>(policy)
        };
        let log = build(usize::MAX, policy).unwrap();
        let exact = worst_case_bytes::<u64>(log.share, 2, policy).unwrap();
        assert!(build(exact, policy).is_ok());
        assert!(matches!(
            build(exact - 1, policy),
            Err(crate::KeyedError::OverMemoryBudget { slot_bytes, budget, .. })
                if slot_bytes == exact && budget == exact - 1
        ));
        let huge = Policy::new(1 << 61, core::time::Duration::from_nanos(1 << 62)).unwrap();
        assert_eq!(worst_case_bytes::<u64>(log.share, 2, huge), None);
        assert!(build(usize::MAX - 1, huge).is_err());
        let log = build(usize::MAX - 1, policy).unwrap();
        assert!(log.set_policy(huge).is_err());
        assert_eq!(log.policy(), policy);
        // Exactly the budget of a larger limit: accepted.
        let wider = Policy::per_second(4).unwrap();
        let log = build(
            worst_case_bytes::<u64>(log.share, 2, wider).unwrap(),
            policy,
        )
        .unwrap();
        assert!(log.set_policy(wider).is_ok());
        assert_eq!(log.policy(), wider);
    }
}
