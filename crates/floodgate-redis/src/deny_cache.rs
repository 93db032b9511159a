//! The local denial cache: a key that Redis denied cost `n` until `T` is denied
//! locally, for the same cost `n`, until `T` by the local clock — no round trip.
//! A smaller cost may fit, and a larger one waits longer than `T`, which only Redis
//! can tell: both go to Redis.
//!
//! Sound because a denial can only get stronger without this process seeing it:
//! other callers add traffic. Only a refund gives units back (refunds on): this
//! process's own refund forgets the key's entry (`DenyCache::forget`); another
//! replica's refund is not seen, so the entry errs towards denying until its wait
//! ends, never towards admitting. The wait is
//! counted from when the request was **sent** (before Redis decided), so a cached
//! denial ends no later than Redis's own. "Never" (a cost above the capacity) is not
//! cached: it needs no round trip to be recomputed, and caching it would block the
//! smaller costs that fit. The map holds at most `capacity` keys; when it is full of
//! live denials a new one is simply not cached.

use std::collections::HashMap;
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

struct Map {
    entries: HashMap<String, Entry>,
    /// No entry expires before this: a full map is swept only once one can have.
    earliest: Option<Instant>,
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
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Map> {
        // A panic elsewhere cannot leave an entry half-written: use the map as is.
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cached denial of `cost` on `key` at `now`, aged to `now`.
    pub(crate) fn lookup(&self, key: &str, cost: u32, now: Instant) -> Option<Decision> {
        let mut map = self.lock();
        let entry = map.entries.get(key)?;
        if now >= entry.until {
            map.entries.remove(key);
            return None;
        }
        if cost != entry.cost {
            return None;
        }
        let d = entry.decision;
        let elapsed = now.saturating_duration_since(entry.sent);
        Some(Decision::new(
            false,
            d.limit(),
            d.remaining(),
            d.reset_after().saturating_sub(elapsed),
            Some(entry.until.saturating_duration_since(now)),
        ))
    }

    /// Remembers `decision` on `key` for `cost` if it is a denial that can end.
    pub(crate) fn record(&self, key: &str, cost: u32, sent: Instant, decision: Decision) {
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

    /// Drops `key`'s cached denial, if any (a refund made room on it).
    pub(crate) fn forget(&self, key: &str) {
        self.lock().entries.remove(key);
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        cache.record("k", 3, t0, denied(Some(60_000)));
        assert_eq!(cache.lookup("k", 2, t0), None, "a smaller cost may fit");
        assert_eq!(cache.lookup("k", 4, t0), None, "a larger cost waits longer");
        let d = cache.lookup("k", 3, t0 + Duration::from_secs(1)).unwrap();
        assert!(!d.is_allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_secs(59)));
        assert_eq!(d.reset_after(), Duration::from_secs(9));
        // A later denial of another cost replaces the entry.
        cache.record("k", 2, t0, denied(Some(30_000)));
        assert_eq!(cache.lookup("k", 3, t0), None);
        assert!(cache.lookup("k", 2, t0).is_some());
        assert_eq!(cache.lookup("k", 2, t0 + Duration::from_secs(30)), None);
        assert_eq!(cache.len(), 0, "an expired entry is dropped when found");
    }

    #[test]
    fn never_allowed_and_zero_costs_are_not_cached() {
        let cache = DenyCache::new(4);
        let t0 = Instant::now();
        cache.record("never", 9, t0, denied(None));
        cache.record("zero", 0, t0, denied(Some(60_000)));
        cache.record(
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
            cache.record(key, 1, t0, denied(Some(60_000)));
        }
        assert_eq!(cache.len(), 2);
        assert!(cache.lookup("c", 1, t0).is_none());
    }
}
