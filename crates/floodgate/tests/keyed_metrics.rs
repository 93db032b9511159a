//! A keyed limiter's decision counters add up exactly: every decision is counted
//! once, as allowed or denied, however many threads decide at once and however many
//! threads the process ran before (a per-thread index that only grows would map two
//! live threads to one stripe, and a plain load + store there loses increments).
#![cfg(not(loom))]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;

use floodgate::{Gcra, KeyedBuilder, ManualClock, Policy};

/// `threads` threads check 8 keys `CHECKS` times each on a limiter of one shard
/// (the fewest stripes there are: 2), the clock standing still.
fn counts_add_up_with(threads: u64) {
    // Enough to overlap the threads' loads and stores many times over in either build.
    const CHECKS: u64 = if cfg!(debug_assertions) {
        100_000
    } else {
        1_000_000
    };
    let keyed = KeyedBuilder::new(Gcra::new(Policy::per_minute(100).unwrap()))
        .clock(ManualClock::new())
        .shards(1)
        .capacity(64)
        .build::<u64>()
        .unwrap();
    let barrier = Barrier::new(threads as usize);
    let admitted = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                barrier.wait();
                for i in 0..CHECKS {
                    if keyed.check(&(i % 8)).is_allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let m = keyed.metrics();
    let admitted = admitted.load(Ordering::Relaxed);
    assert_eq!(admitted, 8 * 100, "{threads} threads: the limit, exactly");
    assert_eq!(
        (m.allowed, m.denied),
        (admitted, threads * CHECKS - admitted),
        "{threads} threads on {} shard(s)",
        keyed.shards()
    );
}

#[test]
fn every_decision_is_counted_once_however_many_threads_decide() {
    // Threads that have come and gone first, as in any server.
    for _ in 0..5 {
        std::thread::spawn(|| ()).join().unwrap();
    }
    for threads in [1, 2, 3, 4] {
        counts_add_up_with(threads);
    }
}
