//! Session 42 review: the remote refunds under attack. Each test tries to make a
//! refund give back more than its charge took, admit beyond the limit, or give
//! back twice; see VERIFICATION.md, "session 42: remote refunds under attack".

mod common;

use std::time::Duration;

use common::{runtime, RedisServer};
use floodgate::Policy;
use floodgate_redis::{Algorithm, OnFailure, RedisLimiter};

/// A limiter on `server` deciding with `OnFailure::Error`, keys prefixed `test:`.
fn limiter(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    algorithm: Algorithm,
    policy: Policy,
) -> RedisLimiter {
    let builder = RedisLimiter::builder(algorithm, policy)
        .on_failure(OnFailure::Error)
        .timeout(Duration::from_secs(5))
        .refunds(true);
    common::build(rt, server, builder)
}

/// The algorithms that refund.
const REFUNDING: [Algorithm; 3] = [
    Algorithm::Gcra,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
];

/// 2^53: the scripts' exact range.
const EXACT: u64 = 1 << 53;

/// A key whose refund ledger has grown close to 2^53 (a hot key refunded for
/// months under a long period: the ledger sums microseconds of schedule given
/// back): a refund that would carry the ledger past 2^53 gives nothing, and the
/// key stays usable. Before the fix the refund wrote a ledger past 2^53 and every
/// later call on the key failed as a malformed state (under `OnFailure::Open`: the
/// key admitted everything).
#[test]
fn a_refund_never_carries_the_ledger_past_the_exact_range() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    // T = 100 ms, B = 10.
    let policy = Policy::per_second(10).unwrap();
    let g = limiter(&rt, &server, Algorithm::Gcra, policy);
    let windows = [Algorithm::FixedWindow, Algorithm::SlidingWindow]
        .map(|a| (a, limiter(&rt, &server, a, policy)));
    rt.block_on(async {
        let t0 = 1_000_000_u64;
        let ledger = EXACT - 50;
        let state = format!("{t0}:{ledger}:{t0}:0:5:1/1");
        let _: () = server.cmd(&["SET", "test:g", &state]);
        let (d, r) = g.charge_n_at_micros("g", 1, t0).await.unwrap();
        assert!(d.is_allowed());
        assert!(!g.refund_at_micros(&r.unwrap(), t0).await.unwrap());
        let d = g.check_n_at_micros("g", 1, t0).await.unwrap();
        assert!(d.is_allowed(), "{d:?}");
        assert_eq!(d.remaining(), 8, "the charge stayed taken: {d:?}");

        // The windows: their ledger sums units.
        let states = [
            ("f", format!("1:0:1000000:{}:0:5:1/1/1/1", EXACT - 1)),
            ("s", format!("1:0:0:1000000:{}:0:5:1/1/1/1", EXACT - 1)),
        ];
        for ((algorithm, l), (key, state)) in windows.iter().zip(states) {
            let _: () = server.cmd(&["SET", &format!("test:{key}"), &state]);
            let (d, r) = l.charge_n_at_micros(key, 2, 1_500_000).await.unwrap();
            assert!(d.is_allowed(), "{algorithm:?}");
            let back = l.refund_at_micros(&r.unwrap(), 1_500_000).await.unwrap();
            assert!(!back, "{algorithm:?}");
            let d = l.check_n_at_micros(key, 1, 1_500_000).await.unwrap();
            assert_eq!(d.remaining(), 7, "{algorithm:?}: {d:?}");
        }
    });
}

/// A receipt from a limiter of another policy (a rolling deploy: another T, B or
/// period, or another algorithm on the same prefix and key) gives nothing back
/// and changes nothing.
#[test]
fn a_receipt_refunded_under_another_policy_gives_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let old = limiter(&rt, &server, Algorithm::Gcra, Policy::per_hour(5).unwrap());
    let others = [
        (Algorithm::Gcra, Policy::per_hour(10).unwrap()),
        (
            Algorithm::Gcra,
            Policy::per_hour(5).unwrap().with_burst(9).unwrap(),
        ),
        (Algorithm::FixedWindow, Policy::per_hour(5).unwrap()),
    ]
    .map(|(a, p)| (a, p, limiter(&rt, &server, a, p)));
    rt.block_on(async {
        let t0 = 3_600_000_000_u64;
        for (algorithm, policy, new) in others {
            let _: i64 = server.cmd(&["DEL", "test:p"]);
            let (_, r) = old.charge_n_at_micros("p", 3, t0).await.unwrap();
            let r = r.unwrap();
            let before: String = server.cmd(&["GET", "test:p"]);
            assert!(!new.refund_at_micros(&r, t0).await.unwrap(), "{policy:?}");
            let after: String = server.cmd(&["GET", "test:p"]);
            assert_eq!(before, after, "{algorithm:?} {policy:?}");
            // Its own limiter still gives it back, once.
            assert!(old.refund_at_micros(&r, t0).await.unwrap());
            assert!(!old.refund_at_micros(&r, t0).await.unwrap());
        }
    });
}

/// The server's clock steps back between a charge and its refund (and forward
/// again): the refund never gives back more than the charge took, the receipt
/// gives back once, and no more than B plus the charge is ever admitted.
#[test]
fn a_clock_stepping_back_never_gives_back_more_than_the_charge() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    // T = 720 s, B = 5.
    let g = limiter(&rt, &server, Algorithm::Gcra, Policy::per_hour(5).unwrap());
    rt.block_on(async {
        let t = 720_000_000_u64;
        let t0 = 100 * t;
        for step_back in [1, 600_000_000, 2 * t, 50 * t] {
            let _: i64 = server.cmd(&["DEL", "test:c"]);
            assert!(g.check_n_at_micros("c", 1, t0).await.unwrap().is_allowed());
            let (_, r) = g.charge_n_at_micros("c", 2, t0).await.unwrap();
            let r = r.unwrap();
            assert!(g.check_n_at_micros("c", 2, t0).await.unwrap().is_allowed());
            let early = t0 - step_back;
            // What the early refund cannot give (units booked after the charge
            // still ahead of its now + B*T) it has not recorded: the receipt may
            // give back once more, at t0, and then never again.
            let first = g.refund_at_micros(&r, early).await.unwrap();
            let second = g.refund_at_micros(&r, t0).await.unwrap();
            assert!(
                !(first && second),
                "step back {step_back}: given back twice"
            );
            assert!(!g.refund_at_micros(&r, t0).await.unwrap());
            assert!(!g.refund_at_micros(&r, early).await.unwrap());
            let left = g.peek_n_at_micros("c", 0, t0).await.unwrap().remaining();
            assert!(
                left <= 2,
                "step back {step_back}: {left} left, the charge was 2"
            );
            // Admissions at t0 never pass B (5) in all: 5 charged, `left` back.
            let mut admitted = 0;
            while g.check_n_at_micros("c", 1, t0).await.unwrap().is_allowed() {
                admitted += 1;
                assert!(admitted <= 2);
            }
            assert_eq!(admitted, left);
        }
    });
}

/// More than 8 refunds, in an order unlike the charges' (receipts charged at
/// different ledgers), each receipt sent again after every later refund: each
/// gives back at most once, and what is admitted is exactly what was charged less
/// what came back — never beyond B.
#[test]
fn many_interleaved_refunds_give_each_charge_back_at_most_once() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    // T = 2 s, B = 30 (the windows: 30 a minute), all at one instant: nothing
    // comes back by the clock.
    let policy = Policy::per_minute(30).unwrap();
    let limiters = REFUNDING.map(|a| (a, limiter(&rt, &server, a, policy)));
    rt.block_on(async {
        for (algorithm, l) in limiters {
            let now = 20_000_000_u64 + 10;
            let key = format!("i{algorithm:?}");
            let mut receipts = Vec::new();
            let mut back = 0_u64;
            let mut given = Vec::new();
            // Three rounds: charge 6, refund some out of order, resend all so far.
            for round in 0..3 {
                for _ in 0..6 {
                    let (d, r) = l.charge_n_at_micros(&key, 1, now).await.unwrap();
                    assert!(d.is_allowed(), "{algorithm:?}");
                    receipts.push(r.unwrap());
                    given.push(false);
                }
                let order: Vec<usize> = match round {
                    0 => vec![4, 1, 5],
                    1 => vec![9, 0, 11, 2, 7, 6],
                    _ => vec![17, 3, 13, 8, 12, 16, 10],
                };
                for i in order {
                    if l.refund_at_micros(&receipts[i], now).await.unwrap() {
                        assert!(!given[i], "{algorithm:?}: receipt {i} gave back twice");
                        given[i] = true;
                        back += 1;
                    }
                    for (j, r) in receipts.iter().enumerate() {
                        if l.refund_at_micros(r, now).await.unwrap() {
                            assert!(!given[j], "{algorithm:?}: receipt {j} gave back twice");
                            given[j] = true;
                            back += 1;
                        }
                    }
                }
            }
            let charged = receipts.len() as u64;
            let left = l.peek_n_at_micros(&key, 0, now).await.unwrap().remaining();
            assert_eq!(left, 30 - charged + back, "{algorithm:?}");
            assert!(back <= charged);
        }
    });
}

/// A key lost between a charge and its refund (evicted under memory pressure, or a
/// write lost in a failover) and charged afresh by others: the old receipt must
/// give back nothing — the new key holds none of its units (the key's incarnation
/// differs). Before the fix it gave back units that other callers' charges took
/// (GCRA 2, the windows 3 beyond B).
#[test]
fn a_receipt_of_a_lost_key_gives_nothing_back_on_its_successor() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let policy = Policy::per_hour(5).unwrap();
    let limiters = REFUNDING.map(|a| (a, limiter(&rt, &server, a, policy)));
    rt.block_on(async {
        let t0 = 3_600_000_000_u64 + 1_000;
        for (algorithm, l) in limiters {
            let _: i64 = server.cmd(&["DEL", "test:lost"]);
            let (_, r) = l.charge_n_at_micros("lost", 3, t0).await.unwrap();
            let r = r.unwrap();
            // The key is lost; others fill the fresh one.
            let _: i64 = server.cmd(&["DEL", "test:lost"]);
            for _ in 0..5 {
                assert!(l
                    .check_n_at_micros("lost", 1, t0 + 1)
                    .await
                    .unwrap()
                    .is_allowed());
            }
            let gave = l.refund_at_micros(&r, t0 + 2).await.unwrap();
            let left = l
                .peek_n_at_micros("lost", 0, t0 + 2)
                .await
                .unwrap()
                .remaining();
            assert!(
                !gave && left == 0,
                "{algorithm:?}: {left} admitted beyond B"
            );
        }
    });
}

/// A rolling deploy with two window periods on one key: a 10 s window charges
/// with a receipt, a 1 s window's writes carry its units and then roll them off
/// (its own windows end), and the 10 s window charges again on what the 1 s one
/// counted. The state is the receipt's window of its period again, but holds none
/// of its units: the receipt gives nothing back (before the fix it took back the
/// other charges' units — and its own charge's id, window/count, could be the
/// receipt of a later charge, which then never refunded).
#[test]
fn a_receipt_gives_nothing_once_another_period_wrote_the_key() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let s = Duration::from_secs;
    let pairs = [Algorithm::FixedWindow, Algorithm::SlidingWindow].map(|a| {
        let long = limiter(&rt, &server, a, Policy::new(10, s(10)).unwrap());
        let short = limiter(&rt, &server, a, Policy::new(10, s(1)).unwrap());
        (format!("{a:?}"), long, short)
    });
    // Several limits: both of each limiter's limits of one period.
    let several = |p: Policy| {
        let b = common::builder(Algorithm::FixedWindow, p).and(Algorithm::SlidingWindow, p);
        common::build(&rt, &server, b.on_failure(OnFailure::Error).refunds(true))
    };
    let multi = (
        "several".to_owned(),
        several(Policy::new(10, s(10)).unwrap()),
        several(Policy::new(10, s(1)).unwrap()),
    );
    rt.block_on(async {
        let t1 = 100_500_000_u64;
        for (algorithm, long, short) in pairs.into_iter().chain([multi]) {
            let key = format!("roll{algorithm:?}");
            let (_, r) = long.charge_n_at_micros(&key, 3, t1).await.unwrap();
            let r = r.unwrap();
            for at in [t1 + 100_000, t1 + 1_000_000, t1 + 2_000_000] {
                assert!(short
                    .check_n_at_micros(&key, 1, at)
                    .await
                    .unwrap()
                    .is_allowed());
            }
            let at = t1 + 2_100_000;
            for _ in 0..2 {
                assert!(long
                    .charge_n_at_micros(&key, 1, at)
                    .await
                    .unwrap()
                    .0
                    .is_allowed());
            }
            let before = long
                .peek_n_at_micros(&key, 0, at)
                .await
                .unwrap()
                .remaining();
            assert!(
                !long.refund_at_micros(&r, at).await.unwrap(),
                "{algorithm:?}"
            );
            let after = long
                .peek_n_at_micros(&key, 0, at)
                .await
                .unwrap()
                .remaining();
            assert_eq!(before, after, "{algorithm:?}");
        }
    });
}

/// A hand-written GCRA state whose latest TAT lies below its TAT (no script
/// writes one: every write keeps the latest TAT at least the TAT) is malformed: a
/// refund over it fails and writes nothing. Before the fix the refund set the
/// key's time to live from that latest TAT — a millisecond — and the key, with
/// every unit it held, was gone: all of B admitted again.
#[test]
fn a_refund_over_a_latest_tat_below_the_tat_fails_and_keeps_the_key() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let g = limiter(&rt, &server, Algorithm::Gcra, Policy::per_hour(5).unwrap());
    rt.block_on(async {
        let (_, r) = g.charge_n("h", 1).await.unwrap();
        let r = r.unwrap();
        for _ in 0..4 {
            assert!(g.check_n("h", 1).await.unwrap().decision().is_allowed());
        }
        // TAT:ledger:latest TAT:floor:incarnation:records, the latest TAT 1.
        let state: String = server.cmd(&["GET", "test:h"]);
        let mut fields: Vec<&str> = state.split(':').collect();
        fields[2] = "1";
        let bad = fields.join(":");
        let _: () = server.cmd(&["SET", "test:h", &bad, "EX", "3600"]);
        let e = g.refund(&r).await.unwrap_err().to_string();
        assert!(e.contains("malformed") && e.contains("test:h"), "{e}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let after: String = server.cmd(&["GET", "test:h"]);
        assert_eq!(after, bad);
    });
}
