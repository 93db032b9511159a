//! Session 43 review ("revbound"): an attacker's review of the keyed sliding log's
//! eviction by ranking and of its memory budget. The clocks are manual and stand
//! still, so every count below is exact; nothing is timed.
#![cfg(not(loom))]

use floodgate::{KeyedBuilder, KeyedSlidingLog, ManualClock, Policy};

/// A keyed log of `limit` per second for `capacity` keys over one shard, on a clock
/// that stands still.
fn log_of(capacity: usize, limit: u64) -> KeyedSlidingLog<u64, ManualClock> {
    KeyedBuilder::default()
        .capacity(capacity)
        .shards(1)
        .clock(ManualClock::new())
        .sliding_log::<u64>(Policy::per_second(limit).expect("a valid policy"))
        .expect("a valid log")
}

/// Every key of a full shard at its limit weighs the same, so the ranking can only
/// break ties: an attacker who charges each flood key to the limit (as heavy as a
/// real key can be) must not be able to make the same real keys lose their logs
/// again and again. Evicting keys of equal weight in turn, each real key is evicted
/// about once per `share` flood keys; breaking ties by the map's order ranked the
/// keys in the front of the map at every sweep.
#[test]
fn tied_keys_are_evicted_in_turn_not_by_the_maps_order() {
    const L: u64 = 5;
    const FLOOD: u64 = 20_000;
    let log = log_of(64, L);
    let share = log.max_keys() as u64;
    let real = 16u64;
    let mut admitted = vec![0u64; real as usize];
    for r in 0..real {
        assert!(log.check_n(&r, L as u32).is_allowed());
        admitted[r as usize] += L;
    }
    for i in 0..FLOOD {
        assert!(log.check_n(&(1_000 + i), L as u32).is_allowed());
        let r = i % real;
        // A real key is tried once per flood key; an evicted one gets a fresh log.
        if log.check(&r).is_allowed() {
            admitted[r as usize] += 1;
            while log.check(&r).is_allowed() {
                admitted[r as usize] += 1;
            }
        }
    }
    let most = *admitted.iter().max().expect("real keys");
    // In turn: about one eviction per key per `share` flood keys (measured: 1 085
    // admissions at most), and the first burst; by the map's order, up to 6 240.
    let bound = L * (2 + FLOOD / share);
    eprintln!("share {share}, bound {bound}, admitted {admitted:?}");
    assert!(
        most <= bound,
        "share {share}: {admitted:?} admitted, {bound} at most"
    );
}
