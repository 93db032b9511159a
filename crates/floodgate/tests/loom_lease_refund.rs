//! loom models of the lease refund: a refund is a plain load and store by the
//! shard's owner (its only writer), like a spend, so two threads charging and
//! refunding — each on its own shard, or one past the shard count deciding on the
//! central word — create and lose no unit: on a standing clock the central word
//! hands out exactly the burst, and every unit is admitted (net of refunds), held on
//! a lease, or still in the central word. A refund on a thread that does not own
//! the charging shard goes to the central word, by a CAS that races the other
//! threads' refills, and a hot key's demotion: before the demotion closes the
//! word the unit comes back, after it nothing does. (Under loom a thread's owner index is its number in the
//! model: the main thread is 0, the spawned threads 1 and 2.)
//!
//! Each model fails unless loom reached every outcome it is about (`loom_seen`): the
//! two charge-refund-charge models, whose accounts leave no trace of the order, place
//! thread 2's charge and its refund against thread 1's refill with a `Span`.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=4 cargo test -p floodgate --release --test loom_lease_refund`
#![cfg(loom)]

mod lease_ledger;
mod loom_seen;

use floodgate::{LeasedGcra, ManualClock};
use lease_ledger::{assert_conserved, limiter};
use loom::sync::Arc;
use loom_seen::{Seen, Span};

/// Each thread charges `first` and refunds it, then charges `second` and keeps it;
/// returns the units the thread kept. `at(0)`, `at(1)` and `at(2)` run just before
/// the first charge, just after it and just after the refund.
fn charge_refund_charge(
    lim: &LeasedGcra<ManualClock>,
    first: u32,
    second: u32,
    mut at: impl FnMut(usize),
) -> u64 {
    at(0);
    let (d, receipt) = lim.charge(first);
    at(1);
    let mut kept = if d.is_allowed() { u64::from(first) } else { 0 };
    if lim.refund(receipt) {
        kept -= u64::from(first);
    }
    at(2);
    let (d, _) = lim.charge(second);
    if d.is_allowed() {
        kept += u64::from(second);
    }
    kept
}

/// Where thread 2's first charge and its refund fell against thread 1's first
/// charge (the refill that leases it units from the central word): outcome `p` for
/// the charge, `3 + p` for the refund, `p` an index into `loom_seen::PLACEMENTS`.
const AGAINST_THE_REFILL: &[&str] = &[
    "thread 2 charged all before thread 1's refill",
    "thread 2 charged across thread 1's refill",
    "thread 2 charged all after thread 1's refill",
    "thread 2 refunded all before thread 1's refill",
    "thread 2 refunded across thread 1's refill",
    "thread 2 refunded all after thread 1's refill",
];

/// Threads 1 and 2 charge, refund and charge again; thread 1's first charge is
/// marked by a [`Span`] that thread 2 reads around its own charge and refund, and
/// the model fails unless loom ran thread 2's charge and its refund all before
/// thread 1's refill, across it and all after it.
fn conserve(name: &str, burst: u64, lease: u32, shards: usize) {
    let seen = Seen::new(AGAINST_THE_REFILL);
    let placed = seen.clone();
    loom::model(move || {
        let lim = Arc::new(limiter(burst, lease, shards));
        let span = Arc::new(Span::default());
        let first = {
            let (lim, span) = (lim.clone(), span.clone());
            loom::thread::spawn(move || {
                charge_refund_charge(&lim, 1, 1, |at| match at {
                    0 => span.begin(),
                    1 => span.end(),
                    _ => {}
                })
            })
        };
        let second = {
            let (lim, span) = (lim.clone(), span.clone());
            loom::thread::spawn(move || {
                let mut marks = [0; 3];
                let kept = charge_refund_charge(&lim, 1, 1, |at| marks[at] = span.mark());
                (kept, marks)
            })
        };
        let (kept, marks) = second.join().unwrap();
        let admitted = first.join().unwrap() + kept;
        placed.saw(Span::placement(marks[0], marks[1]));
        placed.saw(3 + Span::placement(marks[1], marks[2]));
        let lim = Arc::try_unwrap(lim).expect("the threads have exited");
        assert_conserved(lim, admitted, burst, lease, shards);
    });
    seen.assert_each(name);
}

#[test]
fn two_owners_charge_refund_and_charge_again() {
    conserve("two_owners_charge_refund_and_charge_again", 3, 2, 4);
}

#[test]
fn an_owner_refunds_beside_a_thread_past_the_shard_count() {
    conserve(
        "an_owner_refunds_beside_a_thread_past_the_shard_count",
        3,
        2,
        2,
    );
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

/// A hot key's cross-thread refund racing its demotion: main charges the hot key
/// (its shard leases the one unit it spends), then thread 1 demotes the key while
/// thread 2 refunds the receipt (it owns no lease shard: the central word). The
/// refund lands before the demotion closes the central word — the unit is back, and
/// the table takes the schedule without it — or after, and gives nothing: never a
/// unit given back that the table's schedule still charges, nor one lost after a
/// `true`. Burst 2 at 1/s on a standing clock.
#[test]
fn a_hot_keys_cross_thread_refund_races_its_demotion() {
    use floodgate::{HotKeyLimiter, HotKeys, KeyedBuilder, Nanos, Policy};
    let seen = Seen::new(&["the refund came back", "the demotion came first"]);
    let outcomes = seen.clone();
    loom::model(move || {
        let hot = Arc::new(
            HotKeyLimiter::<u64, ManualClock>::new(
                Policy::per_second(1).unwrap().with_burst(2).unwrap(),
                KeyedBuilder::default()
                    .capacity(64)
                    .shards(1)
                    .clock(ManualClock::starting_at(Nanos::from_secs(10))),
                HotKeys::default().manual().lease_shards(1).lease_size(1),
            )
            .unwrap(),
        );
        assert!(hot.promote(&1));
        let (d, receipt) = hot.charge(&1, 1);
        assert!(d.is_allowed() && receipt.is_charged());
        let demoter = {
            let hot = hot.clone();
            loom::thread::spawn(move || assert!(hot.demote(&1)))
        };
        let refunder = {
            let hot = hot.clone();
            loom::thread::spawn(move || hot.refund(&1, receipt))
        };
        let back = refunder.join().unwrap();
        demoter.join().unwrap();
        assert!(!hot.is_hot(&1));
        let remaining = hot.peek(&1, 0).remaining();
        assert_eq!(remaining, if back { 2 } else { 1 }, "back {back}");
        outcomes.saw_if(back, 0, 1);
    });
    seen.assert_each("a hot key's cross-thread refund races its demotion");
}
