//! loom models of the lease refund: a refund is a plain load and store by the
//! shard's owner (its only writer), like a spend, so two threads charging and
//! refunding — each on its own shard, or one past the shard count deciding on the
//! central word — create and lose no unit: on a standing clock the central word
//! hands out exactly the burst, and every unit is admitted (net of refunds), held on
//! a lease, or still in the central word. (Under loom a thread's owner index is its
//! number in the model: the spawned threads are 1 and 2.)
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p floodgate --release --test loom_lease_refund`
#![cfg(loom)]

mod lease_ledger;

use floodgate::{LeasedGcra, ManualClock};
use lease_ledger::{assert_conserved, limiter};
use loom::sync::Arc;

/// Each thread charges `first` and refunds it, then charges `second` and keeps it;
/// returns the units the thread kept.
fn charge_refund_charge(lim: &LeasedGcra<ManualClock>, first: u32, second: u32) -> u64 {
    let (d, receipt) = lim.charge(first);
    let mut kept = if d.is_allowed() { u64::from(first) } else { 0 };
    if lim.refund(receipt) {
        kept -= u64::from(first);
    }
    let (d, _) = lim.charge(second);
    if d.is_allowed() {
        kept += u64::from(second);
    }
    kept
}

fn conserve(burst: u64, lease: u32, shards: usize) {
    loom::model(move || {
        let lim = Arc::new(limiter(burst, lease, shards));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let lim = lim.clone();
                loom::thread::spawn(move || charge_refund_charge(&lim, 1, 1))
            })
            .collect();
        let admitted: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        let lim = Arc::try_unwrap(lim).expect("the threads have exited");
        assert_conserved(lim, admitted, burst, lease, shards);
    });
}

#[test]
fn two_owners_charge_refund_and_charge_again() {
    conserve(3, 2, 4);
}

#[test]
fn an_owner_refunds_beside_a_thread_past_the_shard_count() {
    conserve(3, 2, 2);
}
