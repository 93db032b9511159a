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
    // admissions at most); allowed twice that, and the first burst. By the map's
    // order: up to 6 240.
    let bound = L * (2 + 2 * FLOOD / share);
    eprintln!("share {share}, bound {bound}, admitted {admitted:?}");
    assert!(
        most <= bound,
        "share {share}: {admitted:?} admitted, {bound} at most"
    );
}

/// The weight's second measure, the entries holding a key's units, is the
/// client's to choose: units charged at one reading (one request of cost `L`, or
/// `L` requests within one tick of a cached clock) make one entry, units charged
/// at `L` readings make `L`. An attacker who charges a real key's units at one
/// reading and each flood key's at `L` readings makes the real key lighter than
/// every flood key of the same units, though evicting either forgives the same
/// `L` units; it must still not be evicted more often than keys in turn.
#[test]
fn a_key_charged_at_one_reading_is_not_evicted_before_keys_of_equal_units() {
    const L: u64 = 5;
    const FLOOD: u64 = 20_000;
    let clock = ManualClock::new();
    let log = KeyedBuilder::default()
        .capacity(64)
        .shards(1)
        .clock(clock.clone())
        .sliding_log::<u64>(Policy::per_second(L).expect("a valid policy"))
        .expect("a valid log");
    let share = log.max_keys() as u64;
    let real = 16u64;
    let mut admitted = vec![0u64; real as usize];
    for r in 0..real {
        assert!(log.check_n(&r, L as u32).is_allowed());
        admitted[r as usize] += L;
    }
    // 20 000 flood keys of 5 readings 1 µs apart: 0.1 s, within one period.
    for i in 0..FLOOD {
        for _ in 0..L {
            clock.advance(std::time::Duration::from_micros(1));
            assert!(log.check(&(1_000 + i)).is_allowed());
        }
        let r = i % real;
        if log.check(&r).is_allowed() {
            admitted[r as usize] += 1;
            // The rest of the real key's limit at the same reading.
            while log.check(&r).is_allowed() {
                admitted[r as usize] += 1;
            }
        }
    }
    let most = *admitted.iter().max().expect("real keys");
    // Oldest first among equal units: about one eviction per key per `share` flood
    // keys (measured: 1 615 admissions at most); allowed twice that, and the first
    // burst. Fewest entries first: 6 240, the real keys evicted at every sweep.
    let bound = L * (2 + 2 * FLOOD / share);
    eprintln!("share {share}, bound {bound}, admitted {admitted:?}");
    assert!(
        most <= bound,
        "share {share}: {admitted:?} admitted, {bound} at most"
    );
}
