//! Adversarial tests of the hot-key modes (`LeasedGcra`, `HotKeyLimiter`): schedules
//! at the sealed bit, `peek` against `check`, extreme costs, shard numbers and
//! settings, and promotions racing checks on a moving clock.
#![cfg(not(loom))]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use floodgate::lease::{LeaseError, MAX_LEASE, MAX_SHARDS};
use floodgate::{
    Clock, HotKeyError, HotKeyLimiter, HotKeys, Inline, KeyedBuilder, LeasedGcra, ManualClock,
    Nanos, Policy,
};

const SEALED: u64 = 1 << 63;

/// B = 100 at one unit per nanosecond: a schedule's TAT is `now + units`.
fn ns_policy() -> Policy {
    Policy::per_second(1_000_000_000)
        .unwrap()
        .with_burst(100)
        .unwrap()
}

fn hot_at(
    clock: &ManualClock,
    policy: Policy,
    hot: HotKeys,
) -> HotKeyLimiter<u64, ManualClock, Inline> {
    HotKeyLimiter::new_in(
        policy,
        KeyedBuilder::default()
            .capacity(256)
            .shards(1)
            .clock(clock.clone()),
        hot,
    )
    .unwrap()
}

/// A cold key's schedule never reaches the sealed bit (`HotGcra` refuses it), and a
/// hot key's central word is capped below it too. Without the cap, a demotion wrote
/// such a TAT back as the key's word, which then *looked sealed*: here it would name
/// slot 0 at generation 2, exactly the word the next promotion writes for another
/// key, so key 1's checks were routed into key 2's lease limiter (200 admitted at
/// one instant against a burst of 100).
#[test]
fn a_hot_schedule_never_reaches_the_sealed_bit_nor_another_keys_entry() {
    // Key 1 exhausted at `t` would have TAT = t + 100 = seal_word(0, 2).
    let target = SEALED | (2 << 3);
    let t = target - 100;
    let clock = ManualClock::starting_at(Nanos::new(t));
    let limiter = hot_at(
        &clock,
        ns_policy(),
        HotKeys::default()
            .manual()
            .slots(1)
            .lease_shards(64)
            .lease_size(10),
    );
    assert!(limiter.promote(&1)); // generation 1, slot 0
    let mut key1 = 0u64;
    for _ in 0..1_000 {
        key1 += u64::from(limiter.check(&1).is_allowed());
    }
    assert!(key1 <= 100, "{key1} at one instant (B = 100)");
    assert!(key1 > 0, "the schedule up to the sealed bit is usable");
    assert!(limiter.demote(&1));
    assert!(
        !limiter.is_hot(&1),
        "a demoted key's word is a schedule, not a seal"
    );
    assert!(limiter.promote(&2)); // generation 2, slot 0
                                  // Key 1 is cold: at the same instant it admits at most what its burst has left
                                  // (the units up to the sealed bit that a lease of 10 no longer fitted).
    let (tx, rx) = mpsc::channel();
    let limiter = std::sync::Arc::new(limiter);
    let l = std::sync::Arc::clone(&limiter);
    std::thread::spawn(move || {
        let more = (0..200).filter(|_| l.check(&1).is_allowed()).count();
        let _ = tx.send(more);
    });
    let more = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("key 1's checks never returned");
    let total = key1 + more as u64;
    assert!(
        total <= 100,
        "key 1 admitted {total} at one instant (B = 100)"
    );
    assert!(limiter.check(&2).is_allowed(), "key 2 spends its own units");
}

/// The same clock, a schedule that would pass the sealed bit by 5: the lease is
/// refused, and after the demotion every check and peek of the key returns (without
/// the cap its word named slot 5 of 2, and they spun forever).
#[test]
fn a_demoted_key_near_the_sealed_bit_is_checked_and_peeked_promptly() {
    let t = SEALED - 5;
    let clock = ManualClock::starting_at(Nanos::new(t));
    let limiter = std::sync::Arc::new(hot_at(
        &clock,
        ns_policy(),
        HotKeys::default()
            .manual()
            .slots(2)
            .lease_shards(64) // every test thread owns a shard: the check takes a lease
            .lease_size(10),
    ));
    assert!(limiter.promote(&1));
    let refused = limiter.check(&1);
    assert!(
        !refused.is_allowed(),
        "a lease of 10 would pass the sealed bit"
    );
    assert_eq!(refused.retry_after(), None, "never, like a cold key's");
    assert!(limiter.demote(&1));
    assert!(!limiter.is_hot(&1));
    for what in ["check", "peek"] {
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let (l, d) = (
            std::sync::Arc::clone(&limiter),
            std::sync::Arc::clone(&done),
        );
        std::thread::spawn(move || {
            if what == "check" {
                let _ = l.check(&1);
            } else {
                let _ = l.peek(&1, 1);
            }
            d.store(true, Ordering::SeqCst);
        });
        let waited = std::time::Instant::now();
        while !done.load(Ordering::SeqCst) && waited.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            done.load(Ordering::SeqCst),
            "a {what} of the demoted key 1 has not returned after 10 s"
        );
    }
}

/// `peek` promises what `check` would decide. With units on this thread's lease and
/// the central word refilled, a cost above the burst is "allowed" by peek and "never"
/// by check.
#[test]
fn peek_and_check_agree_on_a_cost_above_the_burst() {
    let clock = ManualClock::starting_at(Nanos::from_secs(10));
    // B = 10, T = 1 ms; leases of 10 that live a second.
    let limiter = hot_at(
        &clock,
        Policy::per_second(1_000).unwrap().with_burst(10).unwrap(),
        HotKeys::default()
            .manual()
            .lease_shards(64)
            .lease_size(10)
            .lease_lifetime(Duration::from_secs(1)),
    );
    assert!(limiter.promote(&1));
    for _ in 0..5 {
        assert!(limiter.check(&1).is_allowed()); // 5 left on this thread's lease
    }
    clock.advance(Duration::from_millis(7)); // the central word holds 7
    let peek = limiter.peek(&1, 12);
    let check = limiter.check_n(&1, 12);
    assert_eq!(
        peek.is_allowed(),
        check.is_allowed(),
        "peek {peek:?} vs check {check:?}"
    );
}

/// Builders refuse bad settings with errors, never panics.
#[test]
fn builders_refuse_edge_settings_cleanly() {
    let p = Policy::per_second(1_000).unwrap().with_burst(100).unwrap();
    let b = || LeasedGcra::builder(p);
    for shards in [0, MAX_SHARDS + 1, usize::MAX, usize::MAX / 2 + 2] {
        assert_eq!(
            b().shards(shards).build().unwrap_err(),
            LeaseError::Shards(shards)
        );
    }
    assert_eq!(
        b().shards(MAX_SHARDS).build().unwrap().shard_count(),
        MAX_SHARDS
    );
    assert_eq!(
        b().shards(MAX_SHARDS - 1).build().unwrap().shard_count(),
        MAX_SHARDS
    );
    for size in [0, 101, u32::MAX] {
        assert!(matches!(
            b().lease_size(size).build().unwrap_err(),
            LeaseError::LeaseSize { .. }
        ));
    }
    for lifetime in [
        Duration::ZERO,
        Duration::from_nanos(65_535),
        Duration::from_secs(367 * 86_400),
        Duration::MAX,
        Duration::from_nanos(u64::MAX),
        Duration::new(u64::MAX / 2, 0),
    ] {
        assert_eq!(
            b().lifetime(lifetime).build().unwrap_err(),
            LeaseError::Lifetime(lifetime),
            "{lifetime:?}"
        );
    }
    b().lifetime(Duration::from_nanos(65_536)).build().unwrap();
    b().lifetime(Duration::from_secs(366 * 86_400))
        .build()
        .unwrap();
    // A burst past the lease field: the largest lease is MAX_LEASE.
    let big = Policy::per_second(1_000_000_000)
        .unwrap()
        .with_burst(u64::from(u32::MAX) * 4)
        .unwrap_or_else(|_| {
            Policy::per_second(1_000_000_000)
                .unwrap()
                .with_burst(1 << 30)
                .unwrap()
        });
    let l = LeasedGcra::builder(big)
        .shards(1)
        .lease_size(MAX_LEASE)
        .build_with_clock(ManualClock::new())
        .unwrap();
    assert_eq!(l.lease_size(), MAX_LEASE);
    assert!(matches!(
        LeasedGcra::builder(big)
            .lease_size(MAX_LEASE + 1)
            .build()
            .unwrap_err(),
        LeaseError::LeaseSize { .. }
    ));
    // Hot-key settings.
    let table = || KeyedBuilder::default().capacity(256).shards(1);
    for slots in [0, 8, usize::MAX] {
        assert_eq!(
            HotKeyLimiter::<u64>::new(p, table(), HotKeys::default().slots(slots)).unwrap_err(),
            HotKeyError::Slots(slots)
        );
    }
    assert!(matches!(
        HotKeyLimiter::<u64>::new(p, table(), HotKeys::default().lease_shards(0)).unwrap_err(),
        HotKeyError::Lease(LeaseError::Shards(0))
    ));
    assert!(matches!(
        HotKeyLimiter::<u64>::new(p, table(), HotKeys::default().lease_size(0)).unwrap_err(),
        HotKeyError::Lease(_)
    ));
    assert!(matches!(
        HotKeyLimiter::<u64>::new(p, table(), HotKeys::default().lease_lifetime(Duration::MAX))
            .unwrap_err(),
        HotKeyError::Lease(_)
    ));
    assert!(matches!(
        HotKeyLimiter::<u64>::new(
            p,
            KeyedBuilder::default().capacity(8).shards(4),
            HotKeys::default()
        )
        .unwrap_err(),
        HotKeyError::KeysPerShard { .. } | HotKeyError::Keyed(_)
    ));
}

/// Detection with the largest sampling period: a setting, never a panic. (Fails in a
/// debug build: `u32::MAX.next_power_of_two()` overflows in `HotKeys::detection`; in
/// release it wraps to 0 and `sampled(0)` then samples one check in 2^32.)
#[test]
fn detection_with_extreme_settings_never_panics() {
    let p = Policy::per_second(1_000).unwrap().with_burst(100).unwrap();
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    for (every, window, samples, threads) in [
        (u32::MAX, Duration::MAX, u32::MAX, u32::MAX),
        ((1 << 31) + 1, Duration::ZERO, 0, 0),
        (0, Duration::from_nanos(1), 1, 1),
    ] {
        let limiter = hot_at(
            &clock,
            p,
            HotKeys::default().detection(every, window, samples, threads),
        );
        for i in 0..1_000u64 {
            let _ = limiter.check(&(i % 3));
            let _ = limiter.peek(&(i % 3), 1);
        }
    }
}

/// Any cost on a hot key, any shard number on a lease limiter: answers, no panics,
/// and a cost above the burst is never admitted.
#[test]
fn extreme_costs_and_shard_numbers() {
    let clock = ManualClock::starting_at(Nanos::from_secs(5));
    let p = Policy::per_second(1_000).unwrap().with_burst(100).unwrap();
    let limiter = hot_at(&clock, p, HotKeys::default().manual().lease_size(7));
    assert!(limiter.promote(&3));
    for cost in [
        0,
        1,
        6,
        7,
        8,
        99,
        100,
        101,
        MAX_LEASE,
        MAX_LEASE + 1,
        u32::MAX - 1,
        u32::MAX,
    ] {
        let d = limiter.check_n(&3, cost);
        let p = limiter.peek(&3, cost);
        assert!(d.remaining() <= 100 && p.remaining() <= 100);
        if u64::from(cost) > 100 {
            assert!(!d.is_allowed(), "cost {cost} admitted");
            assert_eq!(d.retry_after(), None, "cost {cost}: never");
        }
    }
    let mut leased = LeasedGcra::builder(p)
        .shards(3)
        .lease_size(10)
        .build_with_clock(clock.clone())
        .unwrap();
    let mut admitted = 0u64;
    for (i, shard) in [0, 3, 4, 5, usize::MAX, usize::MAX - 1, 1 << 40]
        .into_iter()
        .enumerate()
    {
        for cost in [0, 1, 9, 10, 11, 100, 101, u32::MAX] {
            let d = leased.check_on(shard, cost);
            if d.is_allowed() {
                admitted += u64::from(cost);
            }
            assert!(d.remaining() <= 100, "{i}");
        }
    }
    assert!(admitted <= 100, "admitted {admitted} at one instant");
    assert!(leased.units_on_lease() <= 4 * 10);
    let _ = leased.check_n(u32::MAX);
}

/// Many threads check one key while another thread promotes and demotes it, and the
/// clock moves. Each check uses a reading it took from the clock just before. Over
/// every interval of readings, admissions must stay within
/// `B + ⌊(b − a)/T⌋ + threads × lease size` (each thread owns one shard and spends
/// one entry's lease per check; no thread exits, so no index moves).
#[test]
fn flipping_a_key_under_many_threads_with_a_moving_clock_keeps_the_bound() {
    const B: u64 = 50;
    const T: u64 = 1_000_000; // 1 ms
    const L: u64 = 4;
    const THREADS: u64 = 3;
    for round in 0..6u64 {
        let clock = ManualClock::starting_at(Nanos::from_secs(100));
        let limiter = hot_at(
            &clock,
            Policy::per_second(1_000).unwrap().with_burst(B).unwrap(),
            HotKeys::default()
                .manual()
                .slots(1 + (round % 2) as usize)
                .lease_shards(64)
                .lease_size(L as u32)
                .lease_lifetime(Duration::from_millis(if round % 3 == 0 { 1 } else { 50 })),
        );
        let ticking = AtomicBool::new(true);
        let (clock, limiter, ticking) = (&clock, &limiter, &ticking);
        let log: Vec<Vec<(u64, u64)>> = std::thread::scope(|s| {
            s.spawn(move || {
                let mut i = 0u64;
                while ticking.load(Ordering::Relaxed) {
                    match i % 4 {
                        0 => {
                            limiter.promote(&9);
                        }
                        1 => {
                            limiter.promote(&(10 + i % 3));
                        }
                        2 => {
                            limiter.demote(&9);
                        }
                        _ => {
                            limiter.demote(&(10 + (i / 4) % 3));
                        }
                    }
                    i += 1;
                    std::thread::yield_now();
                }
            });
            s.spawn(move || {
                for _ in 0..3_000 {
                    clock.advance(Duration::from_micros(50));
                    std::thread::sleep(Duration::from_micros(50));
                }
                ticking.store(false, Ordering::Relaxed);
            });
            let workers: Vec<_> = (0..THREADS)
                .map(|w| {
                    s.spawn(move || {
                        let mut mine = Vec::new();
                        let mut i = 0u64;
                        while ticking.load(Ordering::Relaxed) {
                            i += 1;
                            let now = clock.now();
                            let cost = 1 + ((i + w) % 3) as u32;
                            if limiter.check_n_at(&9, now, cost).is_allowed() {
                                mine.push((now.as_u64(), u64::from(cost)));
                            }
                        }
                        mine
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        let mut all: Vec<(u64, u64)> = log.into_iter().flatten().collect();
        all.sort();
        let total: u64 = all.iter().map(|a| a.1).sum();
        let span = all.last().map_or(0, |l| l.0) - all.first().map_or(0, |f| f.0);
        let mut worst = 0i64;
        for i in 0..all.len() {
            let a = all[i].0;
            let mut admitted = 0;
            for &(b, units) in &all[i..] {
                admitted += units;
                let bound = B + (b - a) / T + THREADS * L;
                worst = worst.max(admitted as i64 - (B + (b - a) / T) as i64);
                assert!(
                    admitted <= bound,
                    "round {round}: admitted {admitted} in [{a}, {b}] > {bound}"
                );
            }
        }
        let hot = limiter.hot_metrics();
        eprintln!(
            "round {round}: admitted {total} over {span} ns, worst excess over B + (b-a)/T: {worst}, {hot:?}"
        );
        assert_eq!(hot.promotions - hot.demotions, hot.hot_keys);
    }
}
