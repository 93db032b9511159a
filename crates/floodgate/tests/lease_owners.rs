//! Owned lease shards on real threads: a shard's only writer is the live thread
//! holding its owner index, indices pass from exited threads to new ones, and threads
//! past the shard count decide on the central word. If two live threads ever wrote
//! one shard (an index handed out twice, or freed before its owner's last store was
//! ordered before the next owner's first load), their plain stores would lose spends,
//! and the units admitted and held would come to more than the central word handed
//! out: the clock stands still, so it handed out exactly the burst.
#![cfg(not(loom))]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use floodgate::{LeasedGcra, ManualClock, Nanos, Policy};

fn limiter(burst: u64, lease: u32, shards: usize) -> Arc<LeasedGcra<ManualClock>> {
    Arc::new(
        LeasedGcra::builder(Policy::per_second(1).unwrap().with_burst(burst).unwrap())
            .shards(shards)
            .lease_size(lease)
            .lifetime(Duration::from_secs(3_600))
            .build_with_clock(ManualClock::starting_at(Nanos::from_secs(10)))
            .unwrap(),
    )
}

/// Every unit the central word handed out is admitted or held, and no more.
fn assert_conserved(limiter: Arc<LeasedGcra<ManualClock>>, burst: u64, admitted: u64) {
    let mut limiter = Arc::try_unwrap(limiter).expect("every thread has exited");
    let central = limiter.check_on(0, 0).remaining();
    let held = limiter.units_held();
    assert!(admitted <= burst, "admitted {admitted} > burst {burst}");
    assert_eq!(
        admitted + held + central,
        burst,
        "admitted {admitted} + held {held} + central {central}"
    );
    assert!(held <= limiter.shard_count() as u64 * u64::from(limiter.lease_size()));
}

/// Waves of short-lived threads, started while earlier ones are still exiting, so
/// indices are freed and taken again concurrently; more threads live at once than
/// there are shards, so some decide on the central word.
#[test]
fn recycled_indices_never_give_a_shard_two_writers() {
    const BURST: u64 = 6_000;
    for round in 0..4 {
        let limiter = limiter(BURST, 3, 4);
        let admitted = Arc::new(AtomicU64::new(0));
        let mut handles = Vec::new();
        for wave in 0..16u64 {
            for t in 0..6u64 {
                let (limiter, admitted) = (Arc::clone(&limiter), Arc::clone(&admitted));
                handles.push(thread::spawn(move || {
                    let mine: u64 = (0..60u64)
                        .map(|i| 1 + ((i + t + wave + round) % 3) as u32)
                        .filter(|&cost| limiter.check_n(cost).is_allowed())
                        .map(u64::from)
                        .sum();
                    admitted.fetch_add(mine, Ordering::Relaxed);
                }));
            }
            // Let about half of the wave finish before the next one starts.
            for handle in handles.drain(..handles.len() / 2) {
                handle.join().unwrap();
            }
        }
        for handle in handles {
            handle.join().unwrap();
        }
        assert_conserved(limiter, BURST, admitted.load(Ordering::Relaxed));
    }
}

/// Threads that all stay alive until every one has decided: at most `shards` of them
/// own a shard, the rest decide on the central word, and together they admit the
/// burst exactly (nothing stranded: every lease is spent to zero or still held).
#[test]
fn live_threads_past_the_shard_count_share_the_central_word_exactly() {
    const BURST: u64 = 200;
    let limiter = limiter(BURST, 4, 2);
    let barrier = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (limiter, barrier) = (Arc::clone(&limiter), Arc::clone(&barrier));
            thread::spawn(move || {
                let mine = (0..100).filter(|_| limiter.check().is_allowed()).count() as u64;
                let owns = limiter.owns_shard();
                barrier.wait();
                (mine, owns)
            })
        })
        .collect();
    let (admitted, owners) = handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .fold((0, 0), |(a, o), (mine, owns)| {
            (a + mine, o + usize::from(owns))
        });
    // Eight live threads, two shards: at most two own one (fewer when other tests'
    // threads hold the low indices).
    assert!(owners <= 2, "{owners} threads own one of 2 shards");
    assert_conserved(limiter, BURST, admitted);
}
