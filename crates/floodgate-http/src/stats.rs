//! Per-rule counters: sharded, so the request path does one uncontended relaxed
//! `fetch_add` on a cache line that (mostly) only its own thread writes.
//!
//! # Memory ordering
//!
//! Every count is `Relaxed`: the counters order nothing else, and a read
//! ([`RuleStats`]) is a sum of per-shard snapshots, each exact, the total exact once
//! the requests it should include have finished.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

use crate::headers::PolicyName;

/// What one rule decided, summed over every request since the layer was built.
///
/// * `allowed` — requests the rule admitted (any strategy);
/// * `denied` — requests a **hard** rule rejected (429, or the never-fits status);
/// * `soft` — requests a **soft** rule went over and let through (marked with
///   `X-RateLimit-Exceeded`);
/// * `shadow` — requests a **shadow** rule would have denied (let through, unmarked);
/// * `queued` — requests a queueing rule admitted after a wait for their slot (also
///   counted in `allowed`);
/// * `bad_key` — requests whose key could not be extracted (rejected with 400, or
///   counted against the fallback bucket; for a priority rule, a missing tier or one
///   beyond the configured tiers, served as tier 0);
/// * `errors` — decisions the limiter could not make (a backend error), and refunds
///   of a remote rule's charge it could not make (the answer is unchanged), or that
///   nothing ran to their end for a dropped request (no refund spawner and no Tokio
///   runtime, a spawner that panicked or dropped the task, a runtime shut down
///   under it, a refund that panicked:
///   [`RateLimitLayerBuilder::refund_spawner`](crate::RateLimitLayerBuilder::refund_spawner)),
///   or that were not spawned because the layer's refund tasks were at their cap
///   ([`RateLimitLayerBuilder::max_refund_tasks`](crate::RateLimitLayerBuilder::max_refund_tasks)).
///   Each such charge stays taken, but one whose refund's round trip was under
///   way when its task was dropped: the limiter may have made that refund.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RuleStats {
    /// The rule's name.
    pub name: String,
    /// Admitted by this rule.
    pub allowed: u64,
    /// Rejected by this (hard) rule.
    pub denied: u64,
    /// Over this soft rule, let through.
    pub soft: u64,
    /// Over this shadow rule, let through unmarked.
    pub shadow: u64,
    /// Admitted after waiting in a queue (also counted in `allowed`).
    pub queued: u64,
    /// No usable key.
    pub bad_key: u64,
    /// The limiter failed.
    pub errors: u64,
}

/// One line, `name allowed=… denied=… soft=… shadow=… queued=… bad_key=… errors=…`:
/// what a stats endpoint or a log line shows.
///
/// # Examples
///
/// ```
/// use floodgate::{Policy, RateLimiter};
/// use floodgate_http::{Global, RateLimitLayer, Rule};
/// let global = RateLimiter::gcra(Policy::per_second(1_000)?);
/// let layer = RateLimitLayer::builder().rule(Rule::new("global", global, Global)?).build()?;
/// assert_eq!(
///     layer.stats()[0].to_string(),
///     "global allowed=0 denied=0 soft=0 shadow=0 queued=0 bad_key=0 errors=0",
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
impl fmt::Display for RuleStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let RuleStats {
            name,
            allowed,
            denied,
            soft,
            shadow,
            queued,
            bad_key,
            errors,
        } = self;
        write!(
            f,
            "{name} allowed={allowed} denied={denied} soft={soft} shadow={shadow} \
             queued={queued} bad_key={bad_key} errors={errors}"
        )
    }
}

/// Which counter to bump.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Count {
    Allowed = 0,
    Denied = 1,
    Soft = 2,
    Shadow = 3,
    BadKey = 4,
    Error = 5,
    Queued = 6,
}

const KINDS: usize = 7;

pub(crate) struct Counters {
    shards: Box<[CachePadded<[AtomicU64; KINDS]>]>,
}

/// Threads take shard indices round-robin on first use.
static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static THREAD_SLOT: Cell<Option<usize>> = const { Cell::new(None) };
}

fn thread_slot() -> usize {
    THREAD_SLOT.with(|slot| match slot.get() {
        Some(i) => i,
        None => {
            // Relaxed: only uniqueness-ish spreading matters, not ordering.
            let i = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
            slot.set(Some(i));
            i
        }
    })
}

impl Counters {
    pub(crate) fn new() -> Counters {
        let cpus = std::thread::available_parallelism().map_or(4, usize::from);
        let n = cpus.clamp(1, 64).next_power_of_two();
        Counters {
            shards: (0..n)
                .map(|_| CachePadded::new(Default::default()))
                .collect(),
        }
    }

    #[inline]
    pub(crate) fn bump(&self, which: Count) {
        let shard = &self.shards[thread_slot() & (self.shards.len() - 1)];
        // Relaxed: a statistic; see the module docs.
        shard[which as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn read(&self, name: &PolicyName) -> RuleStats {
        let mut sums = [0u64; KINDS];
        for shard in self.shards.iter() {
            for (sum, c) in sums.iter_mut().zip(shard.iter()) {
                *sum = sum.wrapping_add(c.load(Ordering::Relaxed));
            }
        }
        RuleStats {
            name: name.as_str().to_owned(),
            allowed: sums[Count::Allowed as usize],
            denied: sums[Count::Denied as usize],
            soft: sums[Count::Soft as usize],
            shadow: sums[Count::Shadow as usize],
            queued: sums[Count::Queued as usize],
            bad_key: sums[Count::BadKey as usize],
            errors: sums[Count::Error as usize],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_from_many_threads_add_up() {
        let c = Counters::new();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        c.bump(Count::Allowed);
                    }
                    c.bump(Count::Shadow);
                });
            }
        });
        c.bump(Count::Error);
        let name = PolicyName::new("r").unwrap();
        let s = c.read(&name);
        assert_eq!((s.allowed, s.shadow, s.errors, s.denied), (4000, 4, 1, 0));
        assert_eq!(s.name, "r");
    }
}
