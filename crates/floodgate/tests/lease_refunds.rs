//! Receipts and refunds of the leased (hot-key) mode: `LeasedGcra::charge`/`refund`
//! and `HotKeyLimiter::charge`/`refund`. A refund gives units back to the lease
//! they were spent from — the calling thread's shard, that lease (its expiry) still
//! the shard's and unexpired, never above the lease size — or else to the central
//! word, the part of the booking still ahead of the clock; a cold key's refund is
//! the keyed table's. Another limiter, a demotion or a new promotion, another key, a
//! receipt of the other mode, a booking the clock has passed: nothing comes back.
//! On a standing clock every unit the central word handed out stays admitted (net
//! of refunds), held on a lease, or in the central word: none is created.
#![cfg(not(loom))]

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use floodgate::{
    HotKeyLimiter, HotKeys, Inline, KeyedBuilder, LeasedGcra, ManualClock, Nanos, Policy,
};

fn leased(burst: u64, lease: u32, shards: usize, clock: &ManualClock) -> LeasedGcra<ManualClock> {
    LeasedGcra::builder(
        Policy::per_second(1_000)
            .unwrap()
            .with_burst(burst)
            .unwrap(),
    )
    .shards(shards)
    .lease_size(lease)
    .lifetime(Duration::from_millis(1))
    .build_with_clock(clock.clone())
    .unwrap()
}

#[test]
fn a_refund_puts_the_units_back_on_their_lease_never_above_the_lease_size() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let l = leased(100, 10, 64, &clock);
    let (d, first) = l.charge(3); // leases 10, spends 3
    assert!(d.is_allowed() && first.is_charged());
    let (_, second) = l.charge(2);
    assert_eq!(l.units_on_lease(), 5);
    assert!(l.refund(second));
    assert_eq!(l.units_on_lease(), 7);
    assert!(l.refund(first));
    assert_eq!(l.units_on_lease(), 10);
    // A charge above the lease size takes its units from the central word; its
    // refund tops the lease up to the lease size and no further.
    let (_, spent) = l.charge(10); // the lease's 10
    let (d, big) = l.charge(30); // need 30, the lease is empty: 30 from the central word
    assert!(d.is_allowed() && big.cost() == 30, "{d:?} {big:?}");
    assert_eq!(l.units_on_lease(), 0);
    assert!(l.refund(big));
    assert_eq!(l.units_on_lease(), 10, "capped at the lease size");
    // The 20 the lease has no room for go to the central word, judged against
    // `big`'s own booking, [1.01 s, 1.04 s): its last 20 units are ahead.
    assert_eq!(l.peek(0).remaining(), 80);
    // A full lease takes nothing more: `spent` goes to the central word. Its
    // booking, [1 s, 1.01 s), was noted before the 20 came back, and a central
    // refund cannot tell where in the schedule those 20 were: its booking counts
    // as moved down by them (the ledger's shift), behind the clock.
    assert!(!l.refund(spent));
    assert_eq!(l.units_on_lease(), 10);
    // Conservation on a standing clock: admitted (net) + held + central ≤ 100 (the
    // 10 of `spent` are lost: conservative, the ledger's shift).
    let central = l.peek(0).remaining();
    let admitted = 0; // every charge above was refunded
    assert_eq!((central, l.units_held()), (80, 10));
    assert!(admitted + l.units_held() + central <= 100);
}

/// A charge above the room left on its lease: the lease is filled to its size and
/// the rest goes to the central word, as the refund of a charge of that many units
/// of the same booking — its last units, the part of the booking that ends last.
#[test]
fn what_a_full_lease_has_no_room_for_goes_to_the_central_word() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let lease_living_an_hour = || {
        LeasedGcra::builder(Policy::per_second(1_000).unwrap().with_burst(100).unwrap())
            .shards(64)
            .lease_size(10)
            .lifetime(Duration::from_secs(3_600))
            .build_with_clock(clock.clone())
            .unwrap()
    };
    // A standing clock: the lease takes 10 of the 30, the central word the other
    // 20 (all of the booking is still ahead). Nothing is lost: admitted 0 + held
    // 10 + central 90 = the burst.
    let l = lease_living_an_hour();
    let (d, big) = l.charge(30); // books [1 s, 1.03 s); the lease is left empty
    assert!(d.is_allowed() && big.cost() == 30, "{d:?} {big:?}");
    assert_eq!((l.units_on_lease(), l.peek(0).remaining()), (0, 70));
    assert!(l.refund(big));
    assert_eq!(l.units_on_lease(), 10, "the lease up to its size");
    assert_eq!(
        l.peek(0).remaining(),
        90,
        "the other 20 to the central word"
    );
    assert_eq!(l.units_held() + l.peek(0).remaining(), 100);

    // 25 ms on, 5 ms of the booking are ahead. The 20 are the booking's last 20
    // units, [1.01 s, 1.03 s): its 5 ms ahead come back and the schedule is idle
    // (the booking's first 20, [1 s, 1.02 s), would have given nothing). This is
    // the history of a refill that took 10 units, not 30, with no charge: its
    // booking [1 s, 1.01 s) passed, the lease holds 10.
    let l = lease_living_an_hour();
    let (_, big) = l.charge(30);
    clock.advance(Duration::from_millis(25));
    assert_eq!(l.peek(0).remaining(), 95);
    assert!(l.refund(big));
    assert_eq!(l.units_on_lease(), 10);
    assert_eq!(l.peek(0).remaining(), 100, "the 5 ms still ahead came back");
    assert_eq!(l.peek(0).reset_after(), Duration::ZERO);

    // Once the clock has passed the booking, only the lease's part comes back.
    let l = lease_living_an_hour();
    let (_, big) = l.charge(30);
    clock.advance(Duration::from_millis(40));
    assert!(l.refund(big));
    assert_eq!((l.units_on_lease(), l.peek(0).remaining()), (10, 100));
}

#[test]
fn an_expired_or_replaced_lease_sends_the_refund_to_the_central_word() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let l = leased(100, 4, 64, &clock);
    let (_, stale) = l.charge(1); // books [1 s, 1.004 s) for the lease of 4
    clock.advance(Duration::from_millis(2)); // past the 1 ms lifetime
    let held = l.units_held();
    let central = l.peek(0).remaining();
    assert!(l.refund(stale), "an expired lease: to the central word");
    assert_eq!(l.units_held(), held, "nothing written to the expired lease");
    assert_eq!(l.peek(0).remaining(), central + 1);

    let (_, old) = l.charge(1); // a new lease of 4
    let (_, rest) = l.charge(3); // spends it out
    clock.advance(Duration::from_micros(200)); // a later expiry tick, same lifetime
    let (d, _) = l.charge(1); // refills: a new lease, a later expiry
    assert!(d.is_allowed());
    assert_eq!(l.units_on_lease(), 3);
    let central = l.peek(0).remaining();
    assert!(
        l.refund(old),
        "the lease it was spent from was replaced: to the central word"
    );
    assert!(l.refund(rest));
    assert_eq!(l.units_on_lease(), 3, "the new lease is untouched");
    assert_eq!(l.peek(0).remaining(), central + 4);
    // Once the clock has passed the booking, nothing is the charge's any more.
    let (_, late) = l.charge(1);
    clock.advance(Duration::from_millis(50));
    assert!(!l.refund(late));
}

#[test]
fn another_limiters_receipt_gives_nothing_back() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let a = leased(100, 10, 64, &clock);
    let b = leased(100, 10, 64, &clock);
    let (_, from_a) = a.charge(2);
    let (_, _from_b) = b.charge(2); // same shard, same expiry, 8 left
    assert!(!b.refund(from_a));
    assert_eq!(b.units_on_lease(), 8);
}

#[test]
fn another_shards_receipt_goes_back_to_the_central_word_not_to_its_lease() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let l = Arc::new(leased(1_000, 10, 64, &clock));
    let both = Arc::new(Barrier::new(2));
    let (to_b, from_a) = std::sync::mpsc::channel();
    let a = {
        let (l, both) = (l.clone(), both.clone());
        thread::spawn(move || {
            assert!(l.owns_shard());
            let (_, receipt) = l.charge(5);
            to_b.send(receipt).unwrap();
            both.wait(); // alive (holding its shard) until B has tried
        })
    };
    let b = {
        let (l, both) = (l.clone(), both.clone());
        thread::spawn(move || {
            assert!(l.owns_shard());
            let (_, own) = l.charge(1); // its own lease, same expiry as A's
            assert!(own.is_charged());
            let receipt = from_a.recv().unwrap();
            let before = (l.units_on_lease(), l.peek(0).remaining());
            let back = l.refund(receipt);
            let after = (l.units_on_lease(), l.peek(0).remaining());
            both.wait(); // asserted after the wait: a failure never leaves A waiting
            (back, before, after)
        })
    };
    a.join().unwrap();
    let (back, before, after) = b.join().unwrap();
    assert!(back, "A's receipt on B's shard: to the central word");
    assert_eq!(after.0, before.0, "B's lease is untouched");
    assert_eq!(after.1, before.1 + 5, "the central word has A's 5 back");
}

#[test]
fn a_thread_without_a_shard_decides_exactly_and_refunds_nothing() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let l = Arc::new(leased(100, 10, 1, &clock));
    let all = Arc::new(Barrier::new(3));
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let (l, all) = (l.clone(), all.clone());
            thread::spawn(move || {
                let owns = l.owns_shard();
                all.wait(); // three live threads, one shard: at most one owns it
                let (d, receipt) = l.charge(1);
                let charged = receipt.is_charged();
                let back = l.refund(receipt);
                all.wait(); // asserted after the wait: a failure leaves no thread waiting
                (owns, d.is_allowed() && charged, back)
            })
        })
        .collect();
    let outcomes: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let shardless: Vec<_> = outcomes.iter().filter(|o| !o.0).collect();
    assert!(shardless.len() >= 2);
    for (_, charged, back) in shardless {
        assert!(
            !charged && !back,
            "a central decision holds nothing to refund"
        );
    }
}

/// Charges and refunds from many threads on a standing clock create no unit: the
/// central word handed out the burst, and it is all admitted (net of refunds),
/// held on leases, or still in the central word.
#[test]
fn refunds_from_many_threads_create_no_unit() {
    const BURST: u64 = 400;
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let l = Arc::new(
        LeasedGcra::builder(Policy::per_second(1).unwrap().with_burst(BURST).unwrap())
            .shards(64)
            .lease_size(8)
            .lifetime(Duration::from_secs(3_600))
            .build_with_clock(clock.clone())
            .unwrap(),
    );
    let threads: Vec<_> = (0..4u32)
        .map(|t| {
            let l = l.clone();
            thread::spawn(move || {
                let mut admitted = 0u64;
                for i in 0..500u32 {
                    let cost = 1 + (i + t) % 5;
                    let (d, receipt) = l.charge(cost);
                    if !d.is_allowed() {
                        continue;
                    }
                    // Every third admission is refunded (a later rule's denial).
                    if i % 3 == 0 && l.refund(receipt) {
                        continue;
                    }
                    admitted += u64::from(cost);
                }
                admitted
            })
        })
        .collect();
    let admitted: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let mut l = Arc::try_unwrap(l).expect("every thread has exited");
    let central = l.check_on(0, 0).remaining();
    let held = l.units_held();
    assert!(admitted <= BURST, "admitted {admitted} > burst {BURST}");
    assert!(
        admitted + held + central <= BURST,
        "admitted {admitted} + held {held} + central {central} > {BURST}: a refund created units"
    );
}

fn hot_limiter(clock: &ManualClock) -> HotKeyLimiter<u64, ManualClock, Inline> {
    HotKeyLimiter::new_in(
        Policy::per_second(1).unwrap().with_burst(20).unwrap(),
        KeyedBuilder::default().clock(clock.clone()),
        HotKeys::default()
            .lease_size(4)
            .lease_shards(64)
            .slots(2)
            .manual(),
    )
    .unwrap()
}

#[test]
fn a_cold_keys_refund_is_the_keyed_tables() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let h = hot_limiter(&clock);
    let (d, receipt) = h.charge(&1, 3);
    assert!(d.is_allowed() && receipt.is_charged());
    assert_eq!(h.peek(&1, 0).remaining(), 17);
    let (_, other) = h.charge(&2, 1);
    assert!(!h.refund(&1, other), "another key's receipt");
    assert!(h.refund(&1, receipt));
    assert_eq!(h.peek(&1, 0).remaining(), 20);
    // A cold receipt after the key turned hot: its schedule moved; nothing back.
    let (_, cold) = h.charge(&1, 2);
    assert!(h.promote(&1));
    assert!(!h.refund(&1, cold));
    assert_eq!(h.peek(&1, 0).remaining(), 18);
}

#[test]
fn a_hot_keys_refund_goes_back_to_its_lease_under_the_same_promotion_only() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let h = hot_limiter(&clock);
    assert!(h.promote(&1) && h.promote(&2));
    let (d, one) = h.charge(&1, 1); // leases 4 of key 1's 20, spends 1
    assert!(d.is_allowed() && one.is_charged());
    assert_eq!(h.peek(&1, 0).remaining(), 16, "the central word");
    let (_, two) = h.charge(&2, 1);
    assert!(!h.refund(&1, two), "another hot key's receipt");
    assert!(
        !h.refund(&3, one_more(&h)),
        "a cold key given a hot key's receipt"
    );
    assert!(h.refund(&1, one));
    // The lease holds 3 again (one spent by `one_more`): three spends, no refill
    // (the central word stays at 16).
    for _ in 0..3 {
        assert!(h.check(&1).is_allowed());
    }
    assert_eq!(h.peek(&1, 0).remaining(), 16);

    // A demotion: every leased unit went back into the table's schedule.
    let (_, before_demotion) = h.charge(&1, 1); // a new lease of 4, one spent
    assert!(h.demote(&1));
    let cold = h.peek(&1, 0).remaining();
    assert!(!h.refund(&1, before_demotion));
    assert_eq!(h.peek(&1, 0).remaining(), cold);

    // A new promotion: a new lease limiter; an old receipt gives nothing back.
    assert!(h.promote(&1));
    let (_, old) = h.charge(&1, 1);
    assert!(h.demote(&1) && h.promote(&1));
    let (_, _new) = h.charge(&1, 1); // same thread, same shard, same expiry
    let central = h.peek(&1, 0).remaining();
    assert!(!h.refund(&1, old));
    assert_eq!(h.peek(&1, 0).remaining(), central);
    assert_eq!(h.peek(&1, 3), h.peek(&1, 3), "peek writes nothing");
}

/// A charged receipt of hot key 1.
fn one_more(h: &HotKeyLimiter<u64, ManualClock, Inline>) -> floodgate::Receipt {
    let (d, receipt) = h.charge(&1, 1);
    assert!(d.is_allowed() && receipt.is_charged());
    receipt
}
