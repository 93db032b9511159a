//! loom models of the lease refund: a refund is a plain load and store by the
//! shard's owner (its only writer), like a spend, so two threads charging and
//! refunding — each on its own shard, or one past the shard count deciding on the
//! central word — create and lose no unit: on a standing clock the central word
//! hands out exactly the burst, and every unit is admitted (net of refunds), held on
//! a lease, or still in the central word. A refund on a thread that does not own
//! the charging shard goes to the central word, by a CAS that races the other
//! threads' refills. (Under loom a thread's owner index is its number in the
//! model: the main thread is 0, the spawned threads 1 and 2.)
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p floodgate --release --test loom_lease_refund`
#![cfg(loom)]

mod lease_ledger;
mod loom_seen;

use floodgate::{LeasedGcra, ManualClock};
use lease_ledger::{assert_conserved, limiter};
use loom::sync::Arc;
use loom_seen::Seen;

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

/// A refund on a thread that does not own the charging shard goes to the central
/// word: main (shard 0) charges 1 (its refill books 2 of the burst of 3), thread 1
/// refunds that receipt (on the central word: it owns shard 1), while thread 2 (shard
/// 2) charges 1 with a refill of its own. On the standing clock the refund gives
/// back the whole unit (its booking is all ahead), in either order: its CAS and the
/// refill's are one modification order, and every unit is admitted, held on a lease
/// or in the central word.
#[test]
fn a_cross_thread_refund_to_the_central_word_races_a_refill() {
    let seen = Seen::new(&["the refill saw the refund", "the refill came first"]);
    let outcomes = seen.clone();
    let (burst, lease, shards) = (3, 2, 4);
    loom::model(move || {
        let lim = Arc::new(limiter(burst, lease, shards));
        let (d, receipt) = lim.charge(1);
        assert!(d.is_allowed() && receipt.is_charged());
        let refunder = {
            let lim = lim.clone();
            loom::thread::spawn(move || lim.refund(receipt))
        };
        let charger = {
            let lim = lim.clone();
            loom::thread::spawn(move || u64::from(lim.charge(1).0.is_allowed()))
        };
        assert!(refunder.join().unwrap(), "the unit comes back");
        let admitted = charger.join().unwrap();
        assert_eq!(admitted, 1, "the central word held a unit for the refill");
        let mut lim = Arc::try_unwrap(lim).expect("the threads have exited");
        // Refund first: the refill took a whole lease (2), leaving the central word 0.
        outcomes.saw_if(lim.check_on(0, 0).remaining() == 0, 0, 1);
        assert_conserved(lim, admitted, burst, lease, shards);
    });
    seen.assert_each("a cross-thread refund races a refill");
}
