//! The local denial cache: a key that Redis denied cost `n` until `T` is denied
//! locally, for the same cost `n`, until `T` by the local clock — no round trip.
//! A smaller cost may fit, and a larger one waits longer than `T`, which only Redis
//! can tell: both go to Redis.
//!
//! Sound because a denial can only get stronger without this process seeing it:
//! other callers add traffic. Only a refund gives units back (refunds on): this
//! process's own refund forgets the key's entry (`DenyCache::forget`), and a denial
//! of the key sent before that and answered after it is not recorded (Redis may have
//! decided it before the refund; keys are counted in 64 shards, so a refund drops
//! such late denials of its shard's other keys too: a round trip more); another
//! replica's refund is not seen, so the entry errs towards denying until its wait
//! ends, never towards admitting. The wait is
//! counted from when the request was **sent** (before Redis decided), so a cached
//! denial ends no later than Redis's own. "Never" (a cost above the capacity) is not
//! cached: it needs no round trip to be recomputed, and caching it would block the
//! smaller costs that fit. The map holds at most `capacity` keys; when it is full of
//! live denials a new one is simply not cached.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use floodgate::Decision;

struct Entry {
    /// Denied until then (local clock).
    until: Instant,
    /// For this cost.
    cost: u32,
    /// The request was sent then.
    sent: Instant,
    /// Redis's denial.
    decision: Decision,
}

/// How many shards of keys count forgets.
const SHARDS: usize = 64;

struct Map {
    entries: HashMap<String, Entry>,
    /// No entry expires before this: a full map is swept only once one can have.
    earliest: Option<Instant>,
    /// Forgets so far, per shard of keys (by `entries`' hash of the key).
    forgets: [u64; SHARDS],
}

impl Map {
    fn shard(&self, key: &str) -> usize {
        // The remainder is below SHARDS: no truncation.
        (self.entries.hasher().hash_one(key) % SHARDS as u64) as usize
    }
}

/// What a lookup that found no denial saw: its key's shard's forgets then. A
/// denial is recorded only while no forget has been made in that shard since.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ticket {
    shard: usize,
    forgets: u64,
}

pub(crate) struct DenyCache {
    capacity: usize,
    map: Mutex<Map>,
}

impl DenyCache {
    pub(crate) fn new(capacity: usize) -> DenyCache {
        DenyCache {
            capacity,
            map: Mutex::new(Map {
                entries: HashMap::new(),
                earliest: None,
                forgets: [0; SHARDS],
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Map> {
        // A panic elsewhere cannot leave an entry half-written: use the map as is.
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cached denial of `cost` on `key` at `now`, aged to `now`; else the ticket
    /// to record the answer of the request sent now with.
    pub(crate) fn lookup(&self, key: &str, cost: u32, now: Instant) -> Result<Decision, Ticket> {
        let mut map = self.lock();
        let shard = map.shard(key);
        let miss = Ticket {
            shard,
            forgets: map.forgets[shard],
        };
        let Some(entry) = map.entries.get(key) else {
            return Err(miss);
        };
        if now >= entry.until {
            map.entries.remove(key);
            return Err(miss);
        }
        if cost != entry.cost {
            return Err(miss);
        }
        let d = entry.decision;
        let elapsed = now.saturating_duration_since(entry.sent);
        Ok(Decision::new(
            false,
            d.limit(),
            d.remaining(),
            d.reset_after().saturating_sub(elapsed),
            Some(entry.until.saturating_duration_since(now)),
        ))
    }

    /// Remembers `decision` on `key` for `cost` if it is a denial that can end and
    /// no forget was made in the key's shard since `ticket` (the request's lookup).
    pub(crate) fn record(
        &self,
        key: &str,
        cost: u32,
        sent: Instant,
        ticket: Ticket,
        decision: Decision,
    ) {
        let Some(retry) = decision.retry_after() else {
            return; // allowed has Some(0); "never" is None
        };
        if decision.is_allowed() || cost == 0 || retry == Duration::ZERO {
            return;
        }
        let until = sent + retry;
        let now = Instant::now();
        if until <= now {
            return;
        }
        let mut map = self.lock();
        if map.forgets[ticket.shard] != ticket.forgets {
            return; // a refund since: Redis may have decided before it
        }
        // The latest denial of a key replaces its entry: the cost now asked for.
        if !map.entries.contains_key(key) && map.entries.len() >= self.capacity {
            if map.earliest.is_some_and(|e| e <= now) {
                map.entries.retain(|_, e| e.until > now);
                map.earliest = map.entries.values().map(|e| e.until).min();
            }
            if map.entries.len() >= self.capacity {
                return;
            }
        }
        map.earliest = Some(map.earliest.map_or(until, |e| e.min(until)));
        map.entries.insert(
            key.to_owned(),
            Entry {
                until,
                cost,
                sent,
                decision,
            },
        );
    }

    /// Drops `key`'s cached denial, if any (a refund made room on it), and any
    /// denial in its shard sent before now and not yet recorded.
    pub(crate) fn forget(&self, key: &str) {
        let mut map = self.lock();
        let shard = map.shard(key);
        map.forgets[shard] = map.forgets[shard].wrapping_add(1);
        map.entries.remove(key);
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records as a call would: the ticket of a lookup at `sent`.
    fn record(cache: &DenyCache, key: &str, cost: u32, sent: Instant, decision: Decision) {
        let ticket = cache
            .lookup(key, 0, sent)
            .expect_err("cost 0 is never cached");
        cache.record(key, cost, sent, ticket, decision);
    }

    fn denied(retry_ms: Option<u64>) -> Decision {
        Decision::new(
            false,
            5,
            1,
            Duration::from_secs(10),
            retry_ms.map(Duration::from_millis),
        )
    }

    #[test]
    fn a_denial_answers_its_own_cost_until_it_ends() {
        let cache = DenyCache::new(4);
        let t0 = Instant::now();
        record(&cache, "k", 3, t0, denied(Some(60_000)));
        assert!(cache.lookup("k", 2, t0).is_err(), "a smaller cost may fit");
        assert!(
            cache.lookup("k", 4, t0).is_err(),
            "a larger cost waits longer"
        );
        let d = cache.lookup("k", 3, t0 + Duration::from_secs(1)).unwrap();
        assert!(!d.is_allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_secs(59)));
        assert_eq!(d.reset_after(), Duration::from_secs(9));
        // A later denial of another cost replaces the entry.
        record(&cache, "k", 2, t0, denied(Some(30_000)));
        assert!(cache.lookup("k", 3, t0).is_err());
        assert!(cache.lookup("k", 2, t0).is_ok());
        assert!(cache.lookup("k", 2, t0 + Duration::from_secs(30)).is_err());
        assert_eq!(cache.len(), 0, "an expired entry is dropped when found");
    }

    #[test]
    fn never_allowed_and_zero_costs_are_not_cached() {
        let cache = DenyCache::new(4);
        let t0 = Instant::now();
        record(&cache, "never", 9, t0, denied(None));
        record(&cache, "zero", 0, t0, denied(Some(60_000)));
        record(
            &cache,
            "allowed",
            1,
            t0,
            Decision::new(true, 5, 4, Duration::ZERO, None),
        );
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn the_map_stays_within_its_capacity() {
        let cache = DenyCache::new(2);
        let t0 = Instant::now();
        for key in ["a", "b", "c"] {
            record(&cache, key, 1, t0, denied(Some(60_000)));
        }
        assert_eq!(cache.len(), 2);
        assert!(cache.lookup("c", 1, t0).is_err());
    }

    #[test]
    fn a_denial_sent_before_a_forget_is_not_recorded_after_it() {
        let cache = DenyCache::new(4);
        let t0 = Instant::now();
        let before = cache.lookup("k", 1, t0).expect_err("empty");
        cache.forget("k");
        cache.record("k", 1, t0, before, denied(Some(60_000)));
        assert_eq!(cache.len(), 0, "a refund came between");
        let after = cache.lookup("k", 1, t0).expect_err("empty");
        cache.record("k", 1, t0, after, denied(Some(60_000)));
        assert!(cache.lookup("k", 1, t0).is_ok());
    }
}
