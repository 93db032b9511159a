//! loom models of the lease protocol: units move central word → lease → admission
//! and none is created or lost, whether two threads each own a shard or one owns a
//! shard while the other, past the shard count, decides on the central word alone.
//! (Under loom a thread's owner index is its number in the model: the spawned
//! threads are 1 and 2.)
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=4 cargo test -p floodgate --release --test loom_lease`
#![cfg(loom)]

mod lease_ledger;
mod loom_seen;

use lease_ledger::{admitted_on_threads, assert_conserved, limiter};
use loom::sync::Arc;
use loom_seen::Kinds;

/// Two threads each decide `costs` on their own shard (or the central word); the
/// clock stands still, so the central word hands out exactly the burst, and every
/// unit it handed out is either admitted or still held by a lease. The total is the
/// same in every order, but its split between the threads tells which took units
/// from the central word first: `splits` is how many distinct splits the orders give
/// at CI's bound (`LOOM_MAX_PREEMPTIONS=4`), and each must be reached.
fn conserve(
    model: &str,
    (burst, lease, shards): (u64, u32, usize),
    costs: &'static [u32],
    splits: usize,
) {
    let each_split = Kinds::default();
    let seen = each_split.clone();
    loom::model(move || {
        let lim = Arc::new(limiter(burst, lease, shards));
        // Thread 1 decides while the calling thread starts thread 2 and waits for it:
        // both run at once, as `admitted_on_threads` runs its threads.
        let mut second = 0;
        let first = admitted_on_threads(&lim, &[costs], || {
            second = admitted_on_threads(&lim, &[costs], || {});
        });
        let each = [first, second];
        let lim = Arc::try_unwrap(lim).expect("the threads have exited");
        assert_conserved(lim, each.iter().sum(), burst, lease, shards);
        seen.saw(each);
    });
    each_split.assert_at_least(model, splits);
}

#[test]
fn two_owners_take_and_spend_leases() {
    // Thread 1 first: it admits 2 (its lease), thread 2 the last unit; or the mirror.
    conserve("two_owners_take_and_spend_leases", (3, 2, 4), &[1, 1], 2);
}

#[test]
fn an_owner_beside_a_thread_past_the_shard_count() {
    // The owner (thread 1) leases first and admits 2, or thread 2 (past the shard
    // count) takes central units first and the owner's lease is short.
    conserve(
        "an_owner_beside_a_thread_past_the_shard_count",
        (3, 2, 2),
        &[1, 1],
        2,
    );
}

#[test]
fn a_cost_above_the_lease_counts_the_owners_units_first() {
    // One thread decides both its costs before the other's first lease: it admits 3
    // and the other nothing (either way round); or both lease first and each cost
    // of 2 is denied (1 and 1).
    conserve(
        "a_cost_above_the_lease_counts_the_owners_units_first",
        (4, 2, 4),
        &[1, 2],
        3,
    );
}
