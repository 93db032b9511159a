//! A decision made at a clock reading taken *before* a lease it spends: possible when
//! an owner index passes from an exited thread to a thread that had already read the
//! clock. The bound is stated over intervals of readings: `admitted in [a, b] ≤ B +
//! ⌊(b − a)/T⌋ + units on lease at a`. A plain (cold) GCRA keeps that bound whatever
//! the order of readings; the lease mode keeps it because a reading older than a
//! lease (to the 65.5 µs tick) spends nothing from it. Before that rule, the thread
//! below admitted 109 units at one reading against a burst of 100.
//!
//! One test per binary: the owner indices are process-wide, and this test needs the
//! first thread that decides to get index 0 (the one shard).
#![cfg(not(loom))]

use std::sync::mpsc;
use std::time::Duration;

use floodgate::{Clock, HotKeyLimiter, HotKeys, Inline, KeyedBuilder, ManualClock, Nanos, Policy};

#[test]
fn a_stale_reading_spends_a_lease_taken_at_a_later_reading() {
    const B: u64 = 100;
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let limiter: HotKeyLimiter<u64, ManualClock, Inline> = HotKeyLimiter::new_in(
        Policy::per_second(1_000).unwrap().with_burst(B).unwrap(), // T = 1 ms
        KeyedBuilder::default()
            .capacity(256)
            .shards(1)
            .clock(clock.clone()),
        HotKeys::default()
            .manual()
            .lease_shards(1)
            .lease_size(10)
            .lease_lifetime(Duration::from_secs(1)),
    )
    .unwrap();
    assert!(limiter.promote(&1));
    let t0 = clock.now();
    std::thread::scope(|s| {
        // B reads the clock at t0, then is held up before it decides.
        let (read_tx, read_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (clock_b, limiter_b) = (&clock, &limiter);
        let late = s.spawn(move || {
            let now = clock_b.now();
            read_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            (0..20)
                .filter(|_| limiter_b.check_n_at(&1, now, 1).is_allowed())
                .count() as u64
        });
        read_rx.recv().unwrap();
        // A thread exhausts the key at t0 and exits (its index, 0, is freed).
        let first = s
            .spawn(|| {
                let owns = floodgate::LeasedGcra::builder(Policy::per_second(1).unwrap())
                    .shards(1)
                    .build()
                    .unwrap()
                    .owns_shard();
                let mut n = 0u64;
                while limiter.check_n_at(&1, t0, 1).is_allowed() {
                    n += 1;
                }
                (n, owns)
            })
            .join()
            .unwrap();
        // 10 ms later another thread takes index 0, leases 10 units, spends one, exits.
        let t1 = clock.advance(Duration::from_millis(10));
        let second = s
            .spawn(move || u64::from(limiter_b.check_n_at(&1, t1, 1).is_allowed()))
            .join()
            .unwrap();
        go_tx.send(()).unwrap();
        let stale = late.join().unwrap();
        eprintln!(
            "at t0: {} (owned shard 0: {}); at t0+10ms: {second}; stale t0 reading: {stale}",
            first.0, first.1
        );
        assert!(first.1, "the first deciding thread should own shard 0");
        assert_eq!(first.0, B);
        // Readings in [t0, t0]: B + 0 + units on lease at t0 (0: nothing was leased
        // before the first decision, and the first thread spent every lease it took).
        assert!(
            first.0 + stale <= B,
            "admitted {} at reading t0 > B = {B}",
            first.0 + stale
        );
    });
}
