//! loom models of the lease protocol: units move central word → lease → admission
//! and none is created or lost, whether two threads each own a shard or one owns a
//! shard while the other, past the shard count, decides on the central word alone.
//! (Under loom a thread's owner index is its number in the model: the spawned
//! threads are 1 and 2.)
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=4 cargo test -p floodgate --release --test loom_lease`
#![cfg(loom)]

mod lease_ledger;

use lease_ledger::{admitted_on_threads, assert_conserved, limiter};
use loom::sync::Arc;

/// Two threads each decide `costs` on their own shard (or the central word); the
/// clock stands still, so the central word hands out exactly the burst, and every
/// unit it handed out is either admitted or still held by a lease.
fn conserve(burst: u64, lease: u32, shards: usize, costs: &'static [u32]) {
    loom::model(move || {
        let lim = Arc::new(limiter(burst, lease, shards));
        let admitted = admitted_on_threads(&lim, &[costs, costs], || {});
        let lim = Arc::try_unwrap(lim).expect("the threads have exited");
        assert_conserved(lim, admitted, burst, lease, shards);
    });
}

#[test]
fn two_owners_take_and_spend_leases() {
    conserve(3, 2, 4, &[1, 1]);
}

#[test]
fn an_owner_beside_a_thread_past_the_shard_count() {
    conserve(3, 2, 2, &[1, 1]);
}

#[test]
fn a_cost_above_the_lease_counts_the_owners_units_first() {
    conserve(4, 2, 4, &[1, 2]);
}
