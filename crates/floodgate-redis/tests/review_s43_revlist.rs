//! Session 43 review of the sliding log's compact refund layout (the refund state
//! in several members scored -inf): malformed layouts met by a multi-limit call,
//! and once per receipt when two logs are refunded in one run; see
//! VERIFICATION.md, "session 43: review of the compact log layout (revlist)".

mod common;

use std::time::Duration;

use common::{log_members, members, runtime, with_refunds, RedisServer};
use floodgate::Policy;
use floodgate_redis::{Algorithm, RedisLimiterBuilder};
use proptest::prelude::Rng;
use proptest::test_runner::{RngAlgorithm, TestRng};

/// Two sliding logs on one request (5 an hour, 4 in 10 s).
fn two_logs() -> RedisLimiterBuilder {
    common::builder(Algorithm::SlidingLog, Policy::per_hour(5).unwrap()).and(
        Algorithm::SlidingLog,
        Policy::new(4, Duration::from_secs(10)).unwrap(),
    )
}

/// A multi-limit refund of two sliding logs, the second log's layout malformed
/// (an unknown member at -inf, a second head, a log member that does not parse
/// after the charge's instant): the call fails naming that key, and the first
/// log — refunded before the second is read — is left as it was (its units still
/// taken, no refund member written). The same for a multi-limit charge. Put back,
/// the refund gives back on both logs, once.
#[test]
fn a_multi_limit_refund_with_a_malformed_log_writes_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let l = with_refunds(&rt, &server, two_logs(), true);
    rt.block_on(async {
        let t = 7_000_000_u64;
        let r = l.charge_n_at_micros("m", 2, t).await.unwrap().1.unwrap();
        let keys = l.redis_keys("m");
        let head = members(&server, &keys[1])[0].0.clone();
        let second_head = format!("{head}0");
        let cases: [(&str, &str); 3] = [
            ("-inf", "zzz"),
            ("-inf", &second_head),
            (&(t + 1).to_string(), "not:a:member"),
        ];
        for (score, member) in cases {
            let _: i64 = server.cmd(&["ZADD", &keys[1], score, member]);
            let before: Vec<_> = keys.iter().map(|k| members(&server, k)).collect();
            let e = l.refund_at_micros(&r, t).await.unwrap_err().to_string();
            assert!(e.contains("malformed") && e.contains(&keys[1]), "{e}");
            let e = l
                .check_n_at_micros("m", 1, t)
                .await
                .unwrap_err()
                .to_string();
            assert!(e.contains("malformed") && e.contains(&keys[1]), "{e}");
            let after: Vec<_> = keys.iter().map(|k| members(&server, k)).collect();
            assert_eq!(after, before, "{member} at {score}");
            let _: i64 = server.cmd(&["ZREM", &keys[1], member]);
        }
        assert!(l.refund_at_micros(&r, t).await.unwrap());
        assert!(!l.refund_at_micros(&r, t).await.unwrap());
        for k in &keys {
            assert!(log_members(&server, k).is_empty(), "{k}");
        }
        assert_eq!(l.peek_n_at_micros("m", 0, t).await.unwrap().remaining(), 4);
    });
}

/// A sliding log refunded beside a fixed window and GCRA in one run, the window's
/// or GCRA's state malformed: the call fails and the log, refunded first, is left
/// as it was.
#[test]
fn a_multi_limit_refund_with_a_malformed_window_leaves_the_log_as_it_was() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let builder = common::builder(Algorithm::SlidingLog, Policy::per_hour(5).unwrap())
        .and(Algorithm::FixedWindow, Policy::per_hour(5).unwrap())
        .and(Algorithm::Gcra, Policy::per_hour(5).unwrap());
    let l = with_refunds(&rt, &server, builder, true);
    rt.block_on(async {
        let t = 9_000_000_u64;
        let r = l.charge_n_at_micros("w", 2, t).await.unwrap().1.unwrap();
        let keys = l.redis_keys("w");
        for bad in [1, 2] {
            let was: String = server.cmd(&["GET", &keys[bad]]);
            let _: () = server.cmd(&["SET", &keys[bad], "1:x"]);
            let log = members(&server, &keys[0]);
            let e = l.refund_at_micros(&r, t).await.unwrap_err().to_string();
            assert!(e.contains("malformed") && e.contains(&keys[bad]), "{e}");
            assert_eq!(members(&server, &keys[0]), log, "key {bad}");
            let _: () = server.cmd(&["SET", &keys[bad], &was]);
        }
        assert!(l.refund_at_micros(&r, t).await.unwrap());
        assert!(log_members(&server, &keys[0]).is_empty());
        assert_eq!(l.peek_n_at_micros("w", 0, t).await.unwrap().remaining(), 5);
    });
}

/// Multi-limit refunds of the windows alone and of GCRA alone, checked before
/// they are made: each still reports what came back (true, then false when sent
/// again) and gives back the charge once.
#[test]
fn a_checked_multi_limit_refund_still_gives_back_and_reports_it() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let hour = Policy::per_hour(5).unwrap();
    let builders = [
        common::builder(Algorithm::FixedWindow, hour).and(Algorithm::SlidingWindow, hour),
        common::builder(Algorithm::Gcra, hour).and(
            Algorithm::Gcra,
            Policy::per_hour(5).unwrap().with_burst(5).unwrap(),
        ),
    ];
    for (i, builder) in builders.into_iter().enumerate() {
        let l = with_refunds(&rt, &server, builder, true);
        rt.block_on(async {
            let t = 11_000_000_u64;
            let key = format!("c{i}");
            let left = l.peek_n_at_micros(&key, 0, t).await.unwrap().remaining();
            let r = l.charge_n_at_micros(&key, 1, t).await.unwrap().1.unwrap();
            assert!(l.refund_at_micros(&r, t).await.unwrap(), "limiter {i}");
            assert!(!l.refund_at_micros(&r, t).await.unwrap(), "limiter {i}");
            let now = l.peek_n_at_micros(&key, 0, t).await.unwrap().remaining();
            assert_eq!(now, left, "limiter {i}");
        });
    }
}

/// The units of the log members at `key`.
fn units(server: &RedisServer, key: &str) -> u64 {
    log_members(server, key).iter().map(|m| m.1).sum()
}

/// Two logs refunded in one run, many one-unit charges at two instants (their
/// records tie on `noted` until a refund moves the ledger), refunded in a seeded
/// order and every receipt sent again and again, far past the 8 records a key
/// remembers: each log gives each receipt's unit back at most once (its units
/// drop by 0 or 1, never twice for one receipt), the refund reports it, and the
/// units left are those charged less those given back.
#[test]
fn two_logs_refunded_in_one_run_give_each_receipt_back_at_most_once() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let builder = common::builder(Algorithm::SlidingLog, Policy::per_hour(40).unwrap()).and(
        Algorithm::SlidingLog,
        Policy::new(30, Duration::from_secs(10)).unwrap(),
    );
    let l = with_refunds(&rt, &server, builder, true);
    rt.block_on(async {
        let mut back_total = 0;
        for seed in 1..=4_u8 {
            let key = format!("once{seed}");
            let keys = l.redis_keys(&key);
            let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]);
            let t = 20_000_000_u64;
            let mut receipts = Vec::new();
            let mut given = Vec::new();
            for step in 0..120 {
                let at = t + (step as u64 * 2) / 120;
                let charge = receipts.len() < 24 && rng.next_u64() % 3 == 0;
                if charge || receipts.is_empty() {
                    let (d, r) = l.charge_n_at_micros(&key, 1, at).await.unwrap();
                    assert!(d.is_allowed(), "seed {seed} step {step}");
                    receipts.push(r.unwrap());
                    given.push([false; 2]);
                    continue;
                }
                let i = (rng.next_u64() % receipts.len() as u64) as usize;
                let before = [0, 1].map(|k| units(&server, &keys[k]));
                let back = l.refund_at_micros(&receipts[i], at).await.unwrap();
                let after = [0, 1].map(|k| units(&server, &keys[k]));
                let mut any = false;
                for k in 0..2 {
                    let d = before[k] - after[k];
                    assert!(d <= 1, "seed {seed} step {step} key {k}: {d}");
                    if d == 1 {
                        assert!(!given[i][k], "seed {seed} step {step}: receipt {i} twice");
                        given[i][k] = true;
                        any = true;
                        back_total += 1;
                    }
                }
                assert_eq!(back, any, "seed {seed} step {step}");
            }
            for k in 0..2 {
                let charged = receipts.len() as u64;
                let back = given.iter().filter(|g| g[k]).count() as u64;
                assert_eq!(units(&server, &keys[k]), charged - back, "seed {seed}");
            }
        }
        assert!(back_total > 16, "the trace refunds: {back_total}");
    });
}
