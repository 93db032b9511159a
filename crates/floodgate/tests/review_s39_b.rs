//! Review (session 39, second pass) of the keyed decision counters (`Stripes::count`:
//! one bounds check on the thread's stripe index as it stands, a cold path for a
//! thread without one).
//!
//! The promise (`KeyedMetrics`): `allowed` and `denied` are exact, every decision
//! counted once as what it was. Tried here where the index scheme could lose or
//! double-count: more live threads than any limiter has stripes, several limiters of
//! different stripe counts used by the same threads (an index within one limiter's
//! stripes and past another's), threads spawned and ended round after round (their
//! indices freed and taken again), and decisions made from a thread-local
//! destructor (a thread whose index may already be released).
#![cfg(not(loom))]

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use floodgate::{Gcra, KeyedBuilder, KeyedLimiter, ManualClock, Policy};

type Keyed = KeyedLimiter<u64, Gcra, ManualClock>;

/// One limiter and what its decisions actually answered.
struct Counted {
    keyed: Keyed,
    allowed: AtomicU64,
    denied: AtomicU64,
}

impl Counted {
    fn new(shards: usize, clock: &ManualClock) -> Counted {
        Counted {
            keyed: KeyedBuilder::new(Gcra::new(
                Policy::per_second(1_000)
                    .and_then(|p| p.with_burst(50))
                    .expect("policy"),
            ))
            .clock(clock.clone())
            .shards(shards)
            .capacity(256)
            .build::<u64>()
            .expect("keyed limiter"),
            allowed: AtomicU64::new(0),
            denied: AtomicU64::new(0),
        }
    }

    fn decide(&self, key: u64, cost: u32) {
        if self.keyed.check_n(&key, cost).is_allowed() {
            self.allowed.fetch_add(1, Ordering::Relaxed);
        } else {
            self.denied.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn assert_exact(&self, when: &str) {
        let m = self.keyed.metrics();
        let answered = (
            self.allowed.load(Ordering::Relaxed),
            self.denied.load(Ordering::Relaxed),
        );
        assert!(
            answered.0 > 0 && answered.1 > 0,
            "{when}: both kinds decided"
        );
        assert_eq!(
            (m.allowed, m.denied),
            answered,
            "{when}: metrics against the decisions returned, {} shard(s)",
            self.keyed.shards()
        );
    }
}

/// Decides on every limiter from its destructor: run in the thread's thread-local
/// teardown, before or after the index registry's own destructor released the
/// thread's stripe index.
struct DecideOnExit(Arc<Vec<Counted>>);

impl Drop for DecideOnExit {
    fn drop(&mut self) {
        for (i, limiter) in self.0.iter().enumerate() {
            limiter.decide(i as u64, 1);
            limiter.decide(1_000 + i as u64, 0);
        }
    }
}

thread_local! {
    static ON_EXIT: RefCell<Option<DecideOnExit>> = const { RefCell::new(None) };
}

#[test]
fn metrics_match_the_decisions_across_limiters_rounds_and_teardown() {
    const CHECKS: u64 = if cfg!(debug_assertions) {
        4_000
    } else {
        40_000
    };
    let clock = ManualClock::new();
    // Stripes: 2, 4, 16 (2 × shards, a power of two).
    let limiters = Arc::new(vec![
        Counted::new(1, &clock),
        Counted::new(2, &clock),
        Counted::new(8, &clock),
    ]);
    // Rounds of threads started and ended: the indices they took are freed and
    // taken again, fewer and more threads than stripes, up to more than 2 × the
    // largest limiter's (16).
    for (round, threads) in [3usize, 20, 5, 37, 1, 24].into_iter().enumerate() {
        let barrier = Arc::new(Barrier::new(threads));
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let limiters = Arc::clone(&limiters);
                let barrier = Arc::clone(&barrier);
                let clock = clock.clone();
                std::thread::spawn(move || {
                    // Some threads decide first from teardown only, some on the
                    // smaller limiters before the larger ones.
                    if t % 3 == 0 {
                        ON_EXIT
                            .with(|e| *e.borrow_mut() = Some(DecideOnExit(Arc::clone(&limiters))));
                    }
                    barrier.wait();
                    if t % 5 == 4 {
                        return;
                    }
                    for i in 0..CHECKS {
                        let which = ((i + t as u64) % 3) as usize;
                        let limiter = &limiters[if t % 2 == 0 { which } else { 2 - which }];
                        limiter.decide(i % 16, (i % 4) as u32);
                        if t == 0 && i % 64 == 0 {
                            clock.advance(std::time::Duration::from_millis(3));
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("decider");
        }
        for l in limiters.iter() {
            l.assert_exact(&format!("round {round} ({threads} threads)"));
        }
    }
}
