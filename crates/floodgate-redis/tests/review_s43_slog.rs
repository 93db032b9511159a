//! Session 43 review: the Redis sliding-log refunds under attack. Each test tries
//! to make the log admit beyond its limit, give back twice, give back units other
//! callers charged, corrupt the running totals or lose the key's time to live;
//! see VERIFICATION.md, "session 43: review of the sliding-log refunds".

mod common;

use std::time::Duration;

use common::{
    assert_totals_consistent, log_members, members, runtime, sliding_log as log, with_refunds,
    RedisServer,
};
use floodgate::{ManualClock, Policy, SlidingLog};
use floodgate_redis::Algorithm;
use proptest::prelude::Rng;
use proptest::test_runner::{RngAlgorithm, TestRng};

/// The head refund member of the log at `key`,
/// `refunds:ledger:floor:incarnation` (rank 0, scored -inf: its digits sort
/// before the other refund members' `id:` and `logged:`).
fn refund_member(server: &RedisServer, key: &str) -> String {
    let all = members(server, key);
    let (name, score) = all.first().expect("a refund member");
    assert!(name.starts_with("refunds:") && score == "-inf", "{all:?}");
    name.clone()
}

/// 2^53: the scripts' exact range.
const EXACT: u64 = 1 << 53;

/// A refund that gives back the log's last units leaves the key holding the
/// refund members alone, on the production script (server time, keys with a time
/// to live): the key keeps its time to live through every refund, never more than
/// the period, and still decides (5 left, then denials after 5).
#[test]
fn a_refund_keeps_the_keys_time_to_live_even_when_it_empties_the_log() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let l = log(&rt, &server, Policy::per_hour(5).unwrap());
    rt.block_on(async {
        let hour_ms = 3_600_000_i64;
        let ttl = || -> i64 { server.cmd(&["PTTL", "test:ttl"]) };
        let (v, first) = l.charge_n("ttl", 2).await.unwrap();
        assert!(v.decision().is_allowed());
        let (_, second) = l.charge_n("ttl", 1).await.unwrap();
        let (first, second) = (first.unwrap(), second.unwrap());
        for r in [&second, &first] {
            assert!(l.refund(r).await.unwrap());
            let left = ttl();
            assert!(left > 0 && left <= hour_ms, "PTTL {left}");
        }
        assert!(log_members(&server, "test:ttl").is_empty());
        assert!(members(&server, "test:ttl")
            .iter()
            .all(|(_, s)| s == "-inf"));
        assert_eq!(l.peek_n("ttl", 0).await.unwrap().decision().remaining(), 5);
        for _ in 0..5 {
            assert!(l.check_n("ttl", 1).await.unwrap().decision().is_allowed());
        }
        assert!(!l.check_n("ttl", 1).await.unwrap().decision().is_allowed());
        let left = ttl();
        assert!(left > 0 && left <= hour_ms, "PTTL {left}");
    });
}

/// A log whose refund ledger has grown close to 2^53 (as the windows' and GCRA's
/// in session 42): a refund that would carry it past 2^53 gives nothing and the
/// key stays usable (otherwise every later call on it fails as malformed, and
/// under `OnFailure::Open` admits everything).
#[test]
fn a_log_refund_never_carries_the_ledger_past_the_exact_range() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let l = log(&rt, &server, Policy::per_hour(5).unwrap());
    rt.block_on(async {
        let t = 1_000_000_u64;
        let r = l.charge_n_at_micros("big", 3, t).await.unwrap().1.unwrap();
        let name = refund_member(&server, "test:big");
        let fields: Vec<&str> = name.split(':').collect();
        // refunds:ledger:floor:incarnation, the ledger 2 below 2^53.
        let near = format!("refunds:{}:0:{}", EXACT - 2, fields[3]);
        let _: i64 = server.cmd(&["ZREM", "test:big", &name]);
        let _: i64 = server.cmd(&["ZADD", "test:big", "-inf", &near]);
        assert!(!l.refund_at_micros(&r, t).await.unwrap());
        assert_eq!(refund_member(&server, "test:big"), near);
        let d = l.check_n_at_micros("big", 2, t).await.unwrap();
        assert!(d.is_allowed() && d.remaining() == 0, "{d:?}");
        assert!(!l.check_n_at_micros("big", 1, t).await.unwrap().is_allowed());
    });
}

/// Nine of twelve one-unit charges merged at one instant given back, then every
/// receipt sent again: the first one's record is forgotten (a key remembers 8),
/// and the floor refuses it — it would otherwise take a unit another caller
/// charged at that instant. 3 units stay taken whatever is sent.
#[test]
fn a_receipt_forgotten_by_the_records_never_takes_a_merged_unit_of_another() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let l = log(&rt, &server, Policy::per_hour(20).unwrap());
    rt.block_on(async {
        let t = 5_000_000_u64;
        let mut r = Vec::new();
        for _ in 0..12 {
            r.push(l.charge_n_at_micros("f", 1, t).await.unwrap().1.unwrap());
        }
        for x in &r[..9] {
            assert!(l.refund_at_micros(x, t).await.unwrap());
        }
        for _ in 0..2 {
            for (i, x) in r.iter().enumerate() {
                assert!(!l.refund_at_micros(x, t).await.unwrap(), "receipt {i}");
            }
        }
        assert_eq!(
            l.peek_n_at_micros("f", 0, t).await.unwrap().remaining(),
            20 - 3
        );
    });
}

/// A rolling deploy from a 10 s log to a 1 s log (the same limit, prefix and
/// key): the 1 s replica's charge drops the 10 s replica's member, its own
/// receipt then gives its units back (the newest member goes), and a reading that
/// steps back to the dropped instant charges there. That charge is judged at the
/// latest instant logged, not at the dropped one, so the 10 s receipt finds no
/// member at its instant and gives nothing: never the later charge's units.
#[test]
fn a_dropped_instant_never_holds_a_later_charge_for_an_old_receipt() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let long = log(
        &rt,
        &server,
        Policy::new(4, Duration::from_secs(10)).unwrap(),
    );
    let short = log(
        &rt,
        &server,
        Policy::new(4, Duration::from_secs(1)).unwrap(),
    );
    rt.block_on(async {
        let x = 100_000_000_u64;
        let old = long.charge_n_at_micros("d", 3, x).await.unwrap().1.unwrap();
        let later = x + 1_500_000;
        let own = short
            .charge_n_at_micros("d", 1, later)
            .await
            .unwrap()
            .1
            .unwrap();
        assert!(short.refund_at_micros(&own, later).await.unwrap());
        // Another client, at a reading 1.5 s behind (a clock stepped back).
        let (d, _) = long.charge_n_at_micros("d", 3, x).await.unwrap();
        assert!(d.is_allowed());
        assert!(!long.refund_at_micros(&old, x).await.unwrap());
        assert!(!long.refund_at_micros(&old, later).await.unwrap());
        // The other client's 3 units stay taken (at the latest instant logged).
        assert_eq!(
            long.peek_n_at_micros("d", 0, later)
                .await
                .unwrap()
                .remaining(),
            1
        );
    });
}

/// Several limits, two sliding logs of other periods (4 per 300 ms and 7 per
/// 1 s), against two in-process logs ([`drive_trace`]): random charges (all or
/// nothing: each log charged only when both admit), refunds of the receipts held
/// in any order (each log's part by its own period: the short log's part leaves
/// its window first), waits, readings that step back. Every admission, every
/// refund's answer and the fewest remaining after each step are the in-process
/// ones; a receipt sent a second time gives nothing.
#[test]
fn a_multi_limit_refund_judges_each_log_by_its_own_period() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let short = Policy::new(4, Duration::from_millis(300)).unwrap();
    let long = Policy::new(7, Duration::from_secs(1)).unwrap();
    let remote = with_refunds(
        &rt,
        &server,
        common::builder(Algorithm::SlidingLog, short).and(Algorithm::SlidingLog, long),
        true,
    );
    let fresh = move || -> common::Locals {
        let clock = ManualClock::new();
        let logs = [short, long].map(|p| {
            Box::new(SlidingLog::with_clock(p, clock.clone())) as Box<dyn common::InProcess>
        });
        (
            logs.into(),
            Box::new(move |now| {
                clock.set(now);
            }),
        )
    };
    common::drive_multi_trace(&rt, &remote, "multi", Box::new(fresh));
}

/// A rolling deploy on one log key: replicas of 1 s (limit 5) and 3 s (limit 8)
/// with refunds on and one of 2 s (limit 5) with refunds off, charging at readings
/// on a 100 ms grid that step back now and then (so a reading meets an instant
/// another replica dropped), each receipt refunded by its replica and sent again.
/// A model of what every instant holds — each charge's units added at the
/// instant its receipt names (the newest member), taken off by its own refund —
/// must be the log exactly after every step: a refund gives back only its own
/// charge's units, once, never at an instant a trim dropped (no member comes back
/// there), and the running totals stay consistent.
#[test]
fn replicas_of_three_periods_never_give_back_units_not_their_own() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let builder = |limit, ms| {
        let p = Policy::new(limit, Duration::from_millis(ms)).unwrap();
        common::builder(Algorithm::SlidingLog, p)
    };
    let replicas = [
        with_refunds(&rt, &server, builder(5, 1_000), true),
        with_refunds(&rt, &server, builder(8, 3_000), true),
        with_refunds(&rt, &server, builder(5, 2_000), false),
    ];
    rt.block_on(async {
        let (mut given, mut dropped) = (0, 0);
        for seed in 1..=12_u64 {
            let key = format!("deploy{seed}");
            let redis_key = format!("test:{key}");
            let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[seed as u8; 32]);
            let below = |rng: &mut TestRng, n: u64| rng.next_u64() % n;
            let step_us = 100_000;
            let mut now_us = 50_000_000_u64;
            // What each instant holds, and the instants a trim dropped.
            let mut model = std::collections::BTreeMap::<u64, u64>::new();
            let mut gone = std::collections::BTreeSet::<u64>::new();
            // (replica, receipt, instant, cost)
            let mut held = Vec::new();
            for step in 0..250 {
                let op = below(&mut rng, 10);
                if op < 5 || held.is_empty() {
                    let who = below(&mut rng, 3) as usize;
                    let cost = 1 + below(&mut rng, 3);
                    let (d, r) = replicas[who]
                        .charge_n_at_micros(&key, cost as u32, now_us)
                        .await
                        .unwrap();
                    let rows = log_members(&server, &redis_key);
                    let present: std::collections::BTreeSet<u64> =
                        rows.iter().map(|m| m.0).collect();
                    let dropped_now: Vec<u64> = model
                        .keys()
                        .copied()
                        .filter(|at| !present.contains(at))
                        .collect();
                    for at in dropped_now {
                        model.remove(&at);
                        gone.insert(at);
                        dropped += 1;
                    }
                    if d.is_allowed() {
                        let x = rows.last().expect("a member after an admission").0;
                        assert!(!gone.contains(&x), "seed {seed} step {step}: {x} again");
                        *model.entry(x).or_default() += cost;
                        if let Some(r) = r {
                            held.push((who, r, x, cost));
                        }
                    }
                } else if op < 7 {
                    let i = below(&mut rng, held.len() as u64) as usize;
                    let (who, r, x, cost) = held.swap_remove(i);
                    let back = replicas[who].refund_at_micros(&r, now_us).await.unwrap();
                    if back {
                        given += 1;
                        let units = model.get_mut(&x).expect("given back at a live instant");
                        assert!(*units >= cost, "seed {seed} step {step}: not its own");
                        *units -= cost;
                        if *units == 0 {
                            model.remove(&x);
                        }
                    }
                    assert!(!replicas[who].refund_at_micros(&r, now_us).await.unwrap());
                } else if op < 9 {
                    now_us += step_us * below(&mut rng, 9);
                } else {
                    now_us -= step_us * below(&mut rng, 4);
                }
                let rows = log_members(&server, &redis_key);
                assert_totals_consistent(&rows);
                let found: Vec<(u64, u64)> = rows.iter().map(|m| (m.0, m.1)).collect();
                let want: Vec<(u64, u64)> = model.iter().map(|(&a, &u)| (a, u)).collect();
                assert_eq!(found, want, "seed {seed} step {step}");
            }
        }
        assert!(
            given > 150 && dropped > 50,
            "{given} given, {dropped} dropped"
        );
    });
}

/// Redis's default `zset-max-listpack-value`: a sorted set whose every member
/// is at most this many bytes (and `zset-max-listpack-entries`, 128, members at
/// most) is a compact listpack.
const LISTPACK_VALUE: usize = 64;

/// The encoding of the sorted set at `key` and its longest member's length.
fn encoding(server: &RedisServer, key: &str) -> (String, usize) {
    let longest = members(server, key).iter().map(|(m, _)| m.len()).max();
    (
        server.cmd(&["OBJECT", "ENCODING", key]),
        longest.unwrap_or(0),
    )
}

/// The encoding of a log key once refunds have recorded receipts (crate docs,
/// "Refunds", **State**): under Redis's default settings it stays a listpack
/// through more refunds than a key remembers (30, at instants of today's size).
/// A layout with the records inside one refund member outgrew the default
/// `zset-max-listpack-value` at the first refund and made the key a skiplist
/// (about 1 KB for one unit where a listpack takes about 130 bytes).
#[test]
fn a_refunded_log_key_stays_a_listpack_under_the_default_settings() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let setting: Vec<String> = server.cmd(&["CONFIG", "GET", "zset-max-listpack-value"]);
    assert_eq!(setting[1], LISTPACK_VALUE.to_string());
    let rt = runtime();
    let l = log(&rt, &server, Policy::per_hour(100).unwrap());
    rt.block_on(async {
        let t = 1_796_083_200_123_457_u64;
        let _ = l.charge_n_at_micros("e", 3, t).await.unwrap();
        assert_eq!(encoding(&server, "test:e").0, "listpack");
        for i in 1..=30 {
            let at = t + i * 1_000;
            let (_, r) = l.charge_n_at_micros("e", 1, at).await.unwrap();
            assert!(l.refund_at_micros(&r.unwrap(), at).await.unwrap());
            let (enc, longest) = encoding(&server, "test:e");
            assert!(
                longest <= LISTPACK_VALUE,
                "{:?}",
                members(&server, "test:e")
            );
            assert_eq!(enc, "listpack", "after refund {i}");
        }
        // The head, the latest instant logged, the last refund's record (each
        // earlier one pruned, session 46: no unit is left at its instant, before
        // the latest logged) and the 3 units left.
        assert_eq!(members(&server, "test:e").len(), 1 + 1 + 1 + 1);
        assert_eq!(
            l.peek_n_at_micros("e", 0, t + 30_000)
                .await
                .unwrap()
                .remaining(),
            97
        );
    });
}

/// The longest refund members a script writes, every number of 16 digits (a
/// ledger and floor near 2^53, an incarnation and an instant near 2^52, a running
/// total of 10^15): a record of 61 bytes, a head of 58, still a listpack under the
/// default settings, and the refund gives back.
#[test]
fn the_longest_refund_members_fit_the_default_listpack_value() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let l = log(&rt, &server, Policy::per_hour(100).unwrap());
    rt.block_on(async {
        let t = (1_u64 << 52) - 496;
        let born = t - 999;
        let total = 1_000_000_000_000_000_u64;
        let head = format!("refunds:{}:{}:{born}", EXACT - 100, EXACT - 200);
        let old = (t - 10).to_string();
        let _: i64 = server.cmd(&["ZADD", "test:w", "-inf", &head]);
        let _: i64 = server.cmd(&["ZADD", "test:w", &old, &format!("{old}:1:{total}")]);
        let (d, r) = l.charge_n_at_micros("w", 1, t).await.unwrap();
        assert!(d.is_allowed() && d.remaining() == 98, "{d:?}");
        assert!(l.refund_at_micros(&r.unwrap(), t).await.unwrap());
        assert_eq!(encoding(&server, "test:w"), ("listpack".to_owned(), 61));
        let record = format!("refunds:id:{}/{t}/{}", EXACT - 100, total + 1);
        let all = members(&server, "test:w");
        assert!(
            all.iter().any(|(m, s)| *m == record && s == "-inf"),
            "{all:?}"
        );
        assert_eq!(record.len(), 61);
        assert_eq!(refund_member(&server, "test:w").len(), 58);
        assert_eq!(log_members(&server, "test:w"), [(t - 10, 1, total)]);
    });
}
