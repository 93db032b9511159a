//! Session 43 review ("revbound"): an attacker's review of the keyed sliding log's
//! eviction by ranking. The clocks are manual, so every count below is exact;
//! nothing is timed.
#![cfg(not(loom))]

use std::time::Duration;

use floodgate::{KeyedBuilder, KeyedSlidingLog, ManualClock, Policy};

/// The limit of every log below.
const L: u64 = 5;
/// Flood keys per test.
const FLOOD: u64 = 20_000;
/// Real keys, tried in turn after each flood key.
const REAL: u64 = 16;

/// A full shard of 64 keys (16 real, the rest a flood of unique keys) on `clock`:
/// each flood key is charged to the limit at `readings` readings `step` apart
/// (one reading: one check of `L` units), and after each a real key is tried once
/// and, if its log was evicted, charged to the limit again at that reading.
/// Returns the share and what each real key was admitted.
fn flood(clock: &ManualClock, readings: u64, step: Duration) -> (u64, Vec<u64>) {
    let log: KeyedSlidingLog<u64, ManualClock> = KeyedBuilder::default()
        .capacity(64)
        .shards(1)
        .clock(clock.clone())
        .sliding_log::<u64>(Policy::per_second(L).expect("a valid policy"))
        .expect("a valid log");
    let mut admitted = vec![0u64; REAL as usize];
    for r in 0..REAL {
        assert!(log.check_n(&r, L as u32).is_allowed());
        admitted[r as usize] += L;
    }
    for i in 0..FLOOD {
        for _ in 0..readings {
            clock.advance(step);
            let cost = L / readings;
            assert!(log.check_n(&(1_000 + i), cost as u32).is_allowed());
        }
        let r = (i % REAL) as usize;
        while log.check(&(r as u64)).is_allowed() {
            admitted[r] += 1;
        }
    }
    (log.max_keys() as u64, admitted)
}

/// Asserts that no real key was admitted more than about twice what keys evicted
/// in turn get (one eviction per share of flood keys), plus its first burst.
fn assert_in_turn(share: u64, admitted: &[u64]) {
    let most = *admitted.iter().max().expect("real keys");
    let bound = L * (2 + 2 * FLOOD / share);
    assert!(
        most <= bound,
        "share {share}: {admitted:?} admitted, {bound} at most"
    );
}

/// Every key of a full shard at its limit, charged at one reading of a clock that
/// stands still, weighs the same, so the ranking can only break ties: an attacker
/// who charges each flood key to the limit (as heavy as a real key can be) must
/// not make the same real keys lose their logs again and again. In turn, each real
/// key is admitted at most 1 085 times here; with ties broken by the map's order
/// (the keys at the map's front ranked at every sweep), up to 6 240.
#[test]
fn tied_keys_are_evicted_in_turn_not_by_the_maps_order() {
    let (share, admitted) = flood(&ManualClock::new(), 1, Duration::ZERO);
    assert_in_turn(share, &admitted);
}

/// The entries holding a key's units are the client's to choose: units charged at
/// one reading (one request of cost `L`, or `L` requests within one tick of a
/// cached clock) make one entry, at `L` readings `L`. An attacker who charges a
/// real key's units at one reading and each flood key's at `L` readings 1 µs apart
/// (0.1 s in all, within one period) made the real key lighter than every flood key
/// of the same units — though evicting either forgives the same `L` units — and
/// evicted at every sweep: admitted up to 6 240 times. Ranked by how long the units
/// still count, at most 1 615.
#[test]
fn a_key_charged_at_one_reading_is_not_evicted_before_keys_of_equal_units() {
    let (share, admitted) = flood(&ManualClock::new(), L, Duration::from_micros(1));
    assert_in_turn(share, &admitted);
}

/// Evicting the lightest key has a price the ranking cannot remove: a real key kept
/// one unit below a flood whose keys use the whole limit is the lightest of the
/// shard at every sweep, so it is evicted once per ranking — once per `share / 8`
/// full-shard inserts (the flood's and its own fresh logs), about the rate at
/// which the lock-free table's sample of 8 finds it (8 of `share` keys) — and each
/// time its next `L − 1` units start a fresh log. The bound the docs give: no more
/// often than that. Here, 20 000 flood keys at a share of 64 evict it 2 849 times
/// (its limit of 5 gives it 11 400 units).
#[test]
fn a_key_kept_just_lighter_than_the_flood_is_evicted_once_per_ranking() {
    let log: KeyedSlidingLog<u64, ManualClock> = KeyedBuilder::default()
        .capacity(64)
        .shards(1)
        .clock(ManualClock::new())
        .sliding_log::<u64>(Policy::per_second(L).expect("a valid policy"))
        .expect("a valid log");
    let per_ranking = log.max_keys() as u64 / 8;
    let mut evicted = 0u64;
    assert!(log.check_n(&0, L as u32 - 1).is_allowed());
    for i in 0..FLOOD {
        assert!(log.check_n(&(1_000 + i), L as u32).is_allowed());
        if log.peek(&0, 0).remaining() == L {
            evicted += 1;
            assert!(log.check_n(&0, L as u32 - 1).is_allowed());
        }
    }
    // Its own fresh logs are inserts into the full shard too.
    assert!(
        evicted <= (FLOOD + evicted) / per_ranking + 1,
        "evicted {evicted} times by {FLOOD} inserts, rankings of {per_ranking}"
    );
    assert!(
        evicted >= FLOOD / per_ranking / 2,
        "the lightest key was evicted only {evicted} times"
    );
}
