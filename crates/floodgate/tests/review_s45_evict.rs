//! Session 45 adversarial review of the full look for idle keys (evict): before a
//! live key of the hand's sample is evicted, a pass over every slot of the shard
//! reclaims the idle keys, due again after `max(⌊share/8⌋, 1)` removals.
//!
//! Attacked here, on every storage (`Heap`, `Inline`, `Fingerprint`):
//!
//! * the rule at its exact boundary: a shard whose live keys never exceed
//!   `share − ⌊share/8⌋` (7/8 of it) evicts no live key, however often its looks run;
//! * "with one thread, in shards of fewer than 16 keys every live eviction follows a
//!   look at its own insert": at every insert that evicts a live key, the shard held
//!   no idle key (read off `live_keys` and the peeks of every key);
//! * the removal instant: a look that reclaims many keys voids the shard's receipts
//!   (a refund after it gives back nothing) and a later decision at an earlier
//!   reading is judged at the look's instant;
//! * threads checking keys that hover at the edge of idle while a flood of unique
//!   keys makes looks run often (backward shifts under lock-free decisions): no live
//!   key is evicted, each checked key's admissions meet the GCRA bound, and no key
//!   is held twice.
#![cfg(not(loom))]

#[macro_use]
mod common;
#[allow(dead_code)] // the shared harness: only its `Rng` is used here
mod race;

use floodgate::{Gcra, KeyedLimiter, ManualClock, Nanos, Policy, Storage};
use race::Rng;
use std::time::Duration;

type Keyed<S> = KeyedLimiter<u64, Gcra, ManualClock, S>;

/// One shard of `capacity` keys (its share is the capacity) on storage `S`.
fn one_shard<S: Storage<u64, floodgate::GcraState>>(
    policy: Policy,
    capacity: usize,
    seed: u64,
    clock: &ManualClock,
) -> Keyed<S> {
    floodgate::KeyedBuilder::new(Gcra::new(policy))
        .capacity(capacity)
        .shards(1)
        .hash_seed(seed)
        .clock(clock.clone())
        .build_in()
        .expect("valid configuration")
}

/// Whether `key` is held live at `now`: a key not held, or held idle, reads fresh
/// (nothing booked ahead of `now`).
fn live_at<S: Storage<u64, floodgate::GcraState>>(keyed: &Keyed<S>, key: u64, now: Nanos) -> bool {
    keyed.peek_at(&key, now, 0).reset_after_nanos() > 0
}

/// A shard of `share` keys on storage `S` (hash seed `seed`): `long` keys kept live
/// throughout beside a flood of `inserts` unique keys, each live for one step only
/// (one unit an hour, burst 100; the clock moves an hour before each flood key), so
/// that at every insert past the share the shard holds exactly `long` live keys and
/// `share − long` idle ones. Returns the live evictions seen.
fn flood_beside_long_keys<S: Storage<u64, floodgate::GcraState>>(
    share: usize,
    long: u64,
    seed: u64,
    inserts: u64,
) -> u64 {
    let clock = ManualClock::new();
    let policy = Policy::per_hour(1).unwrap().with_burst(100).unwrap();
    let keyed = one_shard::<S>(policy, share, seed, &clock);
    for key in 0..long {
        assert!(keyed.check_n(&key, 100).is_allowed());
    }
    for i in 1..=inserts {
        // The long keys stay live: topped up by 49 units every 50 steps, they keep
        // between 50 and 100 hours booked ahead (an evicted one comes back fresh:
        // admitted either way).
        if i % 50 == 0 {
            for key in 0..long {
                assert!(keyed.check_n(&key, 49).is_allowed(), "long key {key}");
            }
        }
        clock.advance(Duration::from_secs(3_600));
        assert!(keyed.check_n(&(1_000_000 + i), 1).is_allowed());
    }
    let m = keyed.metrics();
    assert!(
        m.reclaimed > inserts / 2,
        "the flood never reclaimed: {m:?}"
    );
    if m.evicted == 0 {
        let now = floodgate::Clock::now(keyed.clock());
        for key in 0..long {
            assert!(live_at(&keyed, key, now), "long key {key} lost its state");
        }
    }
    m.evicted
}

const SHARES: [(usize, u64); 4] = [(64, 1), (64, 2), (128, 3), (256, 4)];

/// The exact boundary of "a shard evicts only after a look found more than 7/8 of
/// its share live": with `share − ⌊share/8⌋` long keys, every look finds exactly
/// ⌊share/8⌋ idle keys, which leaves the next look due at once: no live key may go.
#[test]
fn no_live_key_is_evicted_while_at_most_seven_eighths_of_the_share_is_live() {
    every_storage_reporting!(S => {
        for (share, seed) in SHARES {
            let long = (share - share / 8) as u64;
            let evicted = flood_beside_long_keys::<S>(share, long, seed, 3_000);
            assert_eq!(
                evicted, 0,
                "{}: share {share}, seed {seed}: a live key was evicted with 7/8 live",
                std::any::type_name::<S>()
            );
        }
    });
}

/// The boundary is exact: one long key more, and the shard does evict (a look then
/// finds ⌊share/8⌋ − 1 idle keys, which leaves one eviction before the next look).
/// Without this, the case above could pass on a rule looser than the one claimed.
#[test]
fn one_live_key_past_seven_eighths_lets_the_shard_evict() {
    every_storage_reporting!(S => {
        let evicted: u64 = SHARES
            .into_iter()
            .map(|(share, seed)| {
                flood_beside_long_keys::<S>(share, (share - share / 8 + 1) as u64, seed, 3_000)
            })
            .sum();
        assert!(
            evicted > 0,
            "{}: never evicted with one key past 7/8 live",
            std::any::type_name::<S>()
        );
    });
}

/// "With one thread, in shards of fewer than 16 keys every live eviction follows a
/// look at its own insert": a look reclaims every idle key, so at every insert that
/// evicts a live key the shard held no idle key. Read off the outside: the keys the
/// shard holds (`live_keys`) against those of the pool that read live (an idle or
/// absent key reads fresh; a live key is never absent but by eviction).
fn small_shards_evict_only_when_no_idle_key_is_held<S: Storage<u64, floodgate::GcraState>>(
    share: usize,
    seed: u64,
) -> u64 {
    let clock = ManualClock::new();
    // 10 a second (T = 100 ms), burst 8.
    let policy = Policy::per_second(10).unwrap().with_burst(8).unwrap();
    let keyed = one_shard::<S>(policy, share, seed, &clock);
    let pool = 2 * share as u64;
    let mut rng = Rng::new(seed);
    let mut evictions = 0;
    for op in 0..6_000 {
        clock.advance(Duration::from_millis(rng.below(60)));
        let now = floodgate::Clock::now(keyed.clock());
        let key = rng.below(pool);
        let cost = 1 + rng.below(8) as u32;
        let before = keyed.metrics();
        let live = (0..pool).filter(|&k| live_at(&keyed, k, now)).count() as u64;
        let idle_held = before.live_keys - live;
        let _ = keyed.check_n(&key, cost);
        let after = keyed.metrics();
        if after.evicted > before.evicted {
            evictions += 1;
            assert_eq!(
                idle_held,
                0,
                "{}: share {share}, seed {seed}, op {op}: a live key was evicted while \
                 {idle_held} idle key(s) were held ({before:?} -> {after:?})",
                std::any::type_name::<S>()
            );
        }
    }
    evictions
}

#[test]
fn in_shards_below_16_keys_a_live_eviction_leaves_no_idle_key_behind() {
    every_storage_reporting!(S => {
        let mut evictions = 0;
        for share in [3usize, 5, 8, 12, 13, 14, 15] {
            for seed in 1..=6u64 {
                evictions += small_shards_evict_only_when_no_idle_key_is_held::<S>(share, seed);
            }
        }
        // The premise: the traces do evict (and so test the rule).
        assert!(evictions > 100, "only {evictions} evictions");
    });
}

/// The removal instant of a look's reclamations: a receipt issued before the look
/// gives back nothing after it (the shard's generation moved), and a decision for a
/// new key at a reading before the look is judged at the look's instant. One shard
/// of 64 keys: key 0 charged (with a receipt), 61 keys live for 50 s, 2 idle after
/// 1 s; two seconds on, one insert reclaims both idle keys at once.
#[test]
fn a_look_voids_the_shards_receipts_and_later_decisions_are_judged_at_its_instant() {
    every_storage_reporting!(S => {
        let mut seen = 0;
        for seed in 1..=40u64 {
            let clock = ManualClock::new();
            clock.advance(Duration::from_secs(10));
            let policy = Policy::per_second(1).unwrap().with_burst(100).unwrap();
            let keyed = one_shard::<S>(policy, 64, seed, &clock);
            let (d, receipt) = keyed.charge(&0, 10);
            assert!(d.is_allowed());
            for key in 1..62u64 {
                assert!(keyed.check_n(&key, 50).is_allowed());
            }
            assert!(keyed.check_n(&62, 1).is_allowed());
            assert!(keyed.check_n(&63, 1).is_allowed());
            clock.advance(Duration::from_secs(2));
            let r = floodgate::Clock::now(keyed.clock());
            assert!(keyed.check_n(&1_000, 1).is_allowed());
            let m = keyed.metrics();
            assert_eq!(m.evicted, 0, "seed {seed}: evicted with idle keys held");
            if m.reclaimed != 2 {
                continue; // the hand met one idle key first: no look this time
            }
            seen += 1;
            let held = keyed.peek_at(&0, r, 0).reset_after_nanos();
            assert!(!keyed.refund(&0, receipt), "seed {seed}: a receipt outlived the look");
            assert_eq!(
                keyed.peek_at(&0, r, 0).reset_after_nanos(),
                held,
                "seed {seed}: the refund gave units back"
            );
            // Half a second before the look: judged at the look's instant, so one
            // unit (1 s) is booked ahead of it, not half a second.
            let early = Nanos::new(r.as_u64() - 500_000_000);
            assert!(keyed.check_n_at(&2_000, early, 1).is_allowed());
            assert_eq!(
                keyed.peek_at(&2_000, r, 0).reset_after_nanos(),
                1_000_000_000,
                "seed {seed}: a decision after the look was judged before it"
            );
        }
        assert!(seen >= 10, "only {seen} seeds reclaimed both idle keys at once");
    });
}

/// One checked key's admission: the clock's value read before the decision, after
/// it, and the cost. The decision was judged at an instant between the two (at its
/// reading, or at a later removal instant recorded before it ran).
#[derive(Clone, Copy)]
struct Grant {
    before: u64,
    after: u64,
    cost: u64,
}

/// The GCRA bound, sound for grants known only within `[before, after]`: any set of
/// admissions judged within `[a, b]` holds at most `burst + ⌊(b − a) / T⌋` units
/// (each admission books `cost · T` from at least `a`, and the last one must end by
/// `b + burst · T`). Checked over every run of up to 64 consecutive grants.
fn gcra_bound_holds(grants: &mut [Grant], burst: u64, t: u64) -> Result<(), String> {
    grants.sort_by_key(|g| g.before);
    for i in 0..grants.len() {
        let a = grants[i].before;
        let (mut units, mut b) = (0, a);
        for g in &grants[i..grants.len().min(i + 64)] {
            units += g.cost;
            b = b.max(g.after);
            let bound = burst + (b - a) / t;
            if units > bound {
                return Err(format!(
                    "{units} units judged within [{a}, {b}] ns: the bound is {bound}"
                ));
            }
        }
    }
    Ok(())
}

const T_NS: u64 = 1_000_000;
const BURST: u64 = 4;
/// The clock moves T/2 before each flood key.
const STEP: u64 = T_NS / 2;
/// A flood key's cost: live for T = 2 clock steps.
const FLOOD_COST: u32 = 1;
/// Keys the flood thread keeps live throughout (booked 4 to 8 steps ahead).
const LONG: u64 = 43;
const CHECKERS: u64 = 2;
const CHECKED_EACH: u64 = 4;
const FLOOD: u64 = 20_000;

/// One shard of 64 keys (a look is due again after ⌊64 / 8⌋ = 8 removals). A flood
/// thread keeps 43 keys live throughout, inserts unique keys of cost 1 (each live
/// for T = 2 clock steps) and moves the clock; two checker threads check 4 keys
/// each at the edge of idle (mostly when their own booking says the key is within
/// T/4 of idle, sometimes at once) at the clock's reading, which lags it by at most
/// 2 steps. So at any decision's instant at most 43 + 4 flood keys (those inserted
/// within 2 + 2 steps) + 8 checked keys are live: 55, fewer than 64 − 8; every look
/// reclaims at least 9, and no live key may be evicted (the rule). With about 3/4
/// of the shard live, the hand's 12 keys are often all live: looks run, each
/// moving keys back while the checkers read. Then: no eviction; each checked key's
/// admissions meet the GCRA bound; no key is held twice (a second `remove` finds
/// nothing), and the keys removed are the ones counted live.
fn checks_race_looks<S: Storage<u64, floodgate::GcraState> + Send + Sync>(seed: u64)
where
    Keyed<S>: Sync,
{
    let flood_n = common::stress_rounds(FLOOD);
    let clock = ManualClock::new();
    let policy = Policy::per_second(1_000)
        .unwrap()
        .with_burst(BURST)
        .unwrap();
    let keyed = one_shard::<S>(policy, 64, seed, &clock);
    let now = std::sync::atomic::AtomicU64::new(T_NS);
    let done = std::sync::atomic::AtomicBool::new(false);
    // The clock reading of each checker's last finished turn: the flood moves the
    // clock at most 2 steps past the slowest, so a checker's reading lags the clock
    // by at most 2 steps (a decision at an earlier reading sees more keys live).
    let caught_up: Vec<std::sync::atomic::AtomicU64> = (0..CHECKERS)
        .map(|_| std::sync::atomic::AtomicU64::new(T_NS))
        .collect();
    let ordering = std::sync::atomic::Ordering::SeqCst;
    let mut grants: Vec<Vec<Grant>> = std::thread::scope(|scope| {
        let checkers: Vec<_> = (0..CHECKERS)
            .map(|c| {
                let (keyed, now, done) = (&keyed, &now, &done);
                let caught_up = &caught_up[c as usize];
                scope.spawn(move || {
                    let mut rng = Rng::new((seed << 8) | c);
                    let keys: Vec<u64> = (0..CHECKED_EACH).map(|k| c * CHECKED_EACH + k).collect();
                    let mut booked = vec![0u64; keys.len()];
                    let mut grants = vec![Vec::new(); keys.len()];
                    let (mut seen, mut here) = (0, 0);
                    while !done.load(ordering) {
                        let before = now.load(ordering);
                        // At most 4 turns a clock step.
                        if before == seen && here >= 4 {
                            caught_up.store(before, ordering);
                            std::thread::yield_now();
                            continue;
                        }
                        (seen, here) = (before, if before == seen { here + 1 } else { 1 });
                        let k = rng.below(keys.len() as u64) as usize;
                        if before + T_NS / 4 < booked[k] && rng.below(8) != 0 {
                            caught_up.store(before, ordering);
                            continue;
                        }
                        let cost = 1 + rng.below(2);
                        let d = keyed.check_n_at(&keys[k], Nanos::new(before), cost as u32);
                        let after = now.load(ordering);
                        if d.is_allowed() {
                            grants[k].push(Grant {
                                before,
                                after,
                                cost,
                            });
                            booked[k] = booked[k].max(before) + cost * T_NS;
                        }
                        caught_up.store(before, ordering);
                    }
                    grants
                })
            })
            .collect();
        let long = |key: u64, cost: u32| {
            let at = Nanos::new(now.load(ordering));
            assert!(
                keyed.check_n_at(&key, at, cost).is_allowed(),
                "long key {key}"
            );
        };
        for key in 0..LONG {
            long(2_000_000 + key, 4);
        }
        for i in 0..flood_n {
            // 2T every 4 steps (2T): booked 4 to 8 steps ahead.
            if i > 0 && i % 4 == 0 {
                for key in 0..LONG {
                    long(2_000_000 + key, 2);
                }
            }
            let next = now.load(ordering) + STEP;
            while caught_up.iter().any(|c| c.load(ordering) + 2 * STEP < next) {
                std::thread::yield_now();
            }
            let at = now.fetch_add(STEP, ordering) + STEP;
            let d = keyed.check_n_at(&(1_000_000 + i), Nanos::new(at), FLOOD_COST);
            assert!(d.is_allowed(), "flood key {i} denied");
        }
        done.store(true, ordering);
        checkers
            .into_iter()
            .flat_map(|h| h.join().expect("a checker panicked"))
            .collect()
    });
    let name = std::any::type_name::<S>();
    let m = keyed.metrics();
    assert_eq!(
        m.evicted, 0,
        "{name}, seed {seed}: a live key was evicted: {m:?}"
    );
    assert!(m.reclaimed > flood_n / 2, "{name}, seed {seed}: {m:?}");
    for (k, g) in grants.iter_mut().enumerate() {
        assert!(
            g.len() as u64 > flood_n / 20,
            "{name}, seed {seed}: key {k} admitted {} times",
            g.len()
        );
        if let Err(e) = gcra_bound_holds(g, BURST, T_NS) {
            panic!("{name}, seed {seed}, checked key {k}: {e}");
        }
    }
    let mut held = 0;
    let checked = 0..CHECKERS * CHECKED_EACH;
    let flood = 1_000_000..1_000_000 + flood_n;
    for key in checked.chain(flood).chain(2_000_000..2_000_000 + LONG) {
        if keyed.remove(&key) {
            held += 1;
            assert!(
                !keyed.remove(&key),
                "{name}, seed {seed}: key {key} held twice"
            );
        }
    }
    assert_eq!(
        held, m.live_keys,
        "{name}, seed {seed}: keys held against live_keys"
    );
}

#[test]
fn checks_at_the_edge_of_idle_race_full_looks_without_loss_or_duplicates() {
    every_storage_reporting!(S => {
        for seed in 1..=3 {
            checks_race_looks::<S>(seed);
        }
    });
}
