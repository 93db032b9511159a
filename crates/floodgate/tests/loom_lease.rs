//! loom models of the lease protocol: units move central word → lease → admission
//! and none is created or lost, whether two threads decide on two shards or race on
//! one (claiming its units back, refilling, putting units back).
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p floodgate --release --test loom_lease`
#![cfg(loom)]

use floodgate::{LeasedGcra, ManualClock, Nanos, Policy};
use loom::sync::Arc;
use loom::thread;
use std::time::Duration;

const T: u64 = 1_000_000_000;

fn limiter(burst: u64, lease: u32, shards: usize) -> LeasedGcra<ManualClock> {
    LeasedGcra::builder(Policy::per_second(1).unwrap().with_burst(burst).unwrap())
        .shards(shards)
        .lease_size(lease)
        .lifetime(Duration::from_secs(3_600))
        .build_with_clock(ManualClock::starting_at(Nanos::new(10 * T)))
        .unwrap()
}

/// Two threads each decide `costs` on `shard_of(thread)`; the clock stands still, so
/// the central word hands out exactly the burst, and every unit it handed out is
/// either admitted or still held by a lease.
fn conserve(
    burst: u64,
    lease: u32,
    shards: usize,
    shard_of: fn(usize) -> usize,
    costs: &'static [u32],
) {
    loom::model(move || {
        let lim = Arc::new(limiter(burst, lease, shards));
        let handles: Vec<_> = (0..2)
            .map(|t| {
                let lim = Arc::clone(&lim);
                thread::spawn(move || {
                    costs
                        .iter()
                        .filter(|&&c| lim.check_on(shard_of(t), c).is_allowed())
                        .map(|&c| u64::from(c))
                        .sum::<u64>()
                })
            })
            .collect();
        let admitted: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        let central = lim.check_on(0, 0).remaining();
        let held = lim.units_held();
        assert!(admitted <= burst, "admitted {admitted} > burst {burst}");
        assert_eq!(
            admitted + held + central,
            burst,
            "admitted {admitted} + held {held} + central {central}"
        );
        assert!(held <= shards as u64 * u64::from(lease) + u64::from(lease));
    });
}

#[test]
fn two_shards_take_and_spend_leases() {
    conserve(3, 2, 2, |t| t, &[1, 1]);
}

#[test]
fn two_threads_race_on_one_shard() {
    conserve(3, 2, 1, |_| 0, &[1, 1]);
}

#[test]
fn a_cost_above_the_lease_claims_the_shards_own_units_back() {
    conserve(4, 2, 1, |_| 0, &[1, 2]);
}
