//! Who holds a lease shard: only threads that decide on a leased limiter. A thread
//! that decides on a keyed limiter (whose decision counters rank threads too) and
//! stays alive must not keep the next leased thread off shard 0. One test in its
//! own binary, so that no other test's thread holds a lease index meanwhile.
#![cfg(not(loom))]

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use floodgate::{KeyedLimiter, LeasedGcra, ManualClock, Nanos, Policy};

#[test]
fn a_keyed_decision_takes_no_lease_shard() {
    let keyed: KeyedLimiter<u64> = KeyedLimiter::gcra(Policy::per_second(10).unwrap());
    let leased = LeasedGcra::builder(Policy::per_second(1).unwrap().with_burst(8).unwrap())
        .shards(1)
        .lease_size(4)
        .lifetime(Duration::from_secs(3_600))
        .build_with_clock(ManualClock::starting_at(Nanos::from_secs(10)))
        .unwrap();
    let counted = Arc::new(Barrier::new(2));
    let done = Arc::new(Barrier::new(2));
    thread::scope(|scope| {
        // A start-up check on a thread that lives on.
        scope.spawn(|| {
            assert!(keyed.check(&1).is_allowed());
            counted.wait();
            done.wait();
        });
        counted.wait();
        let owned = thread::scope(|inner| {
            inner
                .spawn(|| {
                    assert!(leased.check().is_allowed());
                    // An owned shard took a lease of 4 and spent 1 of it; the central
                    // word alone would leave nothing on lease.
                    leased.units_on_lease()
                })
                .join()
                .unwrap()
        });
        done.wait();
        assert_eq!(owned, 3, "the leased thread decided on the central word");
    });
}
