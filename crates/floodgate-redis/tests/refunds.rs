//! Refunds in Redis (session 42): a GCRA charge taken with a receipt
//! ([`RedisLimiter::charge_n`]) is given back by [`RedisLimiter::refund`] as the
//! in-process GCRA refund gives it back, at most once however often (and by
//! whichever replica) the receipt is sent, and never so that more is admitted than
//! the limit.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{runtime, RedisServer};
use floodgate::{AsyncLimit, ManualClock, Nanos, Policy, RateLimiter};
use floodgate_redis::{Algorithm, OnFailure, RedisLimiter, RedisReceipt};
use proptest::prelude::Rng;
use proptest::test_runner::{RngAlgorithm, TestRng};

async fn limiter(server: &RedisServer, algorithm: Algorithm, policy: Policy) -> RedisLimiter {
    let conn = floodgate_redis::connect(&server.url()).await.unwrap();
    RedisLimiter::builder(algorithm, policy)
        .prefix("refunds:")
        .timeout(Duration::from_secs(5))
        .on_failure(OnFailure::Error)
        .build(conn)
        .unwrap()
}

/// A number below `n` from a seeded generator: the trace is the same on every run.
fn below(rng: &mut TestRng, n: u64) -> u64 {
    rng.next_u64() % n
}

/// Random charges, refunds (in any order, a few outstanding at once) and waits,
/// replayed on Redis's script and on the in-process GCRA at the same instants:
/// every decision and every refund's answer is the same, so Redis gives back
/// exactly what the in-process refund does — the booking still ahead of now,
/// moved down by the refunds made since the charge, never more.
#[test]
fn gcra_refunds_give_back_what_the_in_process_refunds_give_back() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        // T = 100 ms, B = 4: a 400 ms schedule, passed in steps of up to 150 ms.
        let policy = Policy::per_second(10).unwrap().with_burst(4).unwrap();
        let remote = limiter(&server, Algorithm::Gcra, policy).await;
        for seed in 1..=12_u64 {
            let key = format!("trace{seed}");
            let clock = ManualClock::new();
            let local = RateLimiter::gcra_with_clock(policy, clock.clone());
            let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[seed as u8; 32]);
            let mut now_us = 1_000_000_u64;
            let mut held = Vec::new();
            let (mut refunded, mut given) = (0, 0);
            for step in 0..300 {
                clock.set(Nanos::new(now_us * 1_000));
                let op = below(&mut rng, 10);
                if op < 5 || held.is_empty() {
                    let cost = 1 + below(&mut rng, 2) as u32;
                    let (d, r) = local.charge(cost);
                    let (rd, rr) = remote.charge_n_at_micros(&key, cost, now_us).await.unwrap();
                    assert_eq!(rd, d, "seed {seed} step {step}: charge {cost}");
                    assert_eq!(rr.is_some(), r.is_charged(), "seed {seed} step {step}");
                    if let Some(rr) = rr {
                        if held.len() < 4 {
                            held.push((r, rr));
                        }
                    }
                } else if op < 8 {
                    let (r, rr) = held.swap_remove(below(&mut rng, held.len() as u64) as usize);
                    let back = local.refund(r);
                    let rback = remote.refund_at_micros(&rr, now_us).await.unwrap();
                    assert_eq!(rback, back, "seed {seed} step {step}: refund");
                    refunded += 1;
                    given += usize::from(back);
                    // Sent again (a lost reply, another replica): nothing more.
                    assert!(!remote.refund_at_micros(&rr, now_us).await.unwrap());
                } else {
                    now_us += below(&mut rng, 150_000);
                    clock.set(Nanos::new(now_us * 1_000));
                }
                let d = local.peek(0);
                let rd = remote.peek_n_at_micros(&key, 0, now_us).await.unwrap();
                assert_eq!(rd, d, "seed {seed} step {step}: state");
            }
            assert!(
                refunded > 20 && given > 10,
                "seed {seed}: {given}/{refunded}"
            );
        }
    });
}

/// A charge of 2 given back restores exactly 2 admissions, and the receipt sent a
/// second time — by the same replica or another, at once — gives nothing more.
#[test]
fn a_refund_restores_its_charge_once() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        // B = 5 per hour: no unit comes back by the clock during the test.
        let policy = Policy::per_hour(5).unwrap();
        let a = limiter(&server, Algorithm::Gcra, policy).await;
        let b = limiter(&server, Algorithm::Gcra, policy).await;
        // A unit first: the charge given back is booked ahead of the clock.
        assert!(a.check_n("u", 1).await.unwrap().decision().is_allowed());
        let (v, receipt) = a.charge_n("u", 2).await.unwrap();
        assert!(v.decision().is_allowed());
        let receipt = receipt.expect("an admission of cost 2 has a receipt");
        let (v, _) = a.charge_n("u", 2).await.unwrap();
        assert_eq!(v.decision().remaining(), 0);
        assert!(!a.peek_n("u", 1).await.unwrap().decision().is_allowed());
        let (first, again) = tokio::join!(a.refund(&receipt), b.refund(&receipt));
        assert!(first.unwrap() ^ again.unwrap(), "exactly one gives back");
        assert!(!a.refund(&receipt).await.unwrap());
        // Exactly the 2 units: 2 admissions, then a denial.
        assert_eq!(a.peek_n("u", 0).await.unwrap().decision().remaining(), 2);
        assert!(b.check_n("u", 1).await.unwrap().decision().is_allowed());
        assert!(a.check_n("u", 1).await.unwrap().decision().is_allowed());
        assert!(!b.check_n("u", 1).await.unwrap().decision().is_allowed());
        // A denial and a cost of 0 take nothing and carry no receipt.
        assert!(a.charge_n("u", 1).await.unwrap().1.is_none());
        assert!(a.charge_n("u", 0).await.unwrap().1.is_none());
        // Through the async trait: the receipt of another key gives nothing.
        let (d, r) = AsyncLimit::charge_n(&a, "w", 1).await.unwrap();
        assert!(d.is_allowed() && r.is_charged());
        assert!(!AsyncLimit::refund(&a, "u", r).await.unwrap());
        let (_, r) = AsyncLimit::charge_n(&a, "w", 1).await.unwrap();
        assert!(AsyncLimit::refund(&a, "w", r).await.unwrap());
        assert_eq!(a.peek_n("w", 0).await.unwrap().decision().remaining(), 4);
    });
}

/// A key remembers its last 8 refunds: a receipt refunded before them is refused
/// by the ledger floor, not given back a second time (its booking, moved down by
/// the 8 refunds since, would otherwise still lie ahead of the clock).
#[test]
fn a_receipt_refunded_before_the_last_eight_refunds_gives_nothing_again() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        // T = 100 ms, B = 20, all at one instant.
        let policy = Policy::per_second(10).unwrap().with_burst(20).unwrap();
        let l = limiter(&server, Algorithm::Gcra, policy).await;
        let t0 = 5_000_000;
        for _ in 0..10 {
            assert!(l.check_n_at_micros("k", 1, t0).await.unwrap().is_allowed());
        }
        let (_, r) = l.charge_n_at_micros("k", 1, t0).await.unwrap();
        let r = r.unwrap();
        let mut later = Vec::new();
        for _ in 0..8 {
            later.push(l.charge_n_at_micros("k", 1, t0).await.unwrap().1.unwrap());
        }
        assert!(l.refund_at_micros(&r, t0).await.unwrap());
        for x in &later {
            assert!(l.refund_at_micros(x, t0).await.unwrap());
        }
        let left = |d: floodgate::Decision| d.remaining();
        assert_eq!(left(l.peek_n_at_micros("k", 0, t0).await.unwrap()), 10);
        assert!(!l.refund_at_micros(&r, t0).await.unwrap());
        assert_eq!(left(l.peek_n_at_micros("k", 0, t0).await.unwrap()), 10);
    });
}

/// The other algorithms have no refund in Redis: their charge carries no receipt
/// and is a plain check.
#[test]
fn the_window_and_log_limiters_charge_without_a_receipt() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let policy = Policy::per_hour(3).unwrap();
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::SlidingLog,
        ] {
            let l = limiter(&server, algorithm, policy).await;
            let key = format!("{algorithm:?}");
            let (v, r) = l.charge_n(&key, 1).await.unwrap();
            assert!(v.decision().is_allowed() && r.is_none(), "{algorithm:?}");
            assert_eq!(l.peek_n(&key, 0).await.unwrap().decision().remaining(), 2);
        }
    });
}

/// Two replicas charge one key concurrently and give back about half their
/// admissions, each refund sent twice (once by each replica, concurrently): the
/// admissions kept never exceed the burst (B = 6 per hour: the clock gives no unit
/// back during the test), and each receipt gives back at most once.
#[test]
fn two_replicas_charging_and_refunding_never_admit_beyond_the_limit() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let policy = Policy::per_hour(6).unwrap();
        let a = Arc::new(limiter(&server, Algorithm::Gcra, policy).await);
        let b = Arc::new(limiter(&server, Algorithm::Gcra, policy).await);
        let admitted = Arc::new(AtomicU64::new(0));
        let refunded = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for worker in 0..8_u64 {
            let (own, other) = if worker % 2 == 0 {
                (Arc::clone(&a), Arc::clone(&b))
            } else {
                (Arc::clone(&b), Arc::clone(&a))
            };
            let (admitted, refunded) = (Arc::clone(&admitted), Arc::clone(&refunded));
            tasks.push(tokio::spawn(async move {
                for i in 0..60_u64 {
                    let (v, receipt) = own.charge_n("shared", 1).await.unwrap();
                    if !v.decision().is_allowed() {
                        continue;
                    }
                    admitted.fetch_add(1, Ordering::SeqCst);
                    let receipt: RedisReceipt = receipt.unwrap();
                    if (i + worker) % 2 == 0 {
                        let (x, y) = tokio::join!(own.refund(&receipt), other.refund(&receipt));
                        let (x, y) = (x.unwrap(), y.unwrap());
                        assert!(!(x && y), "a receipt gave back twice");
                        if x || y {
                            refunded.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let (admitted, refunded) = (
            admitted.load(Ordering::SeqCst),
            refunded.load(Ordering::SeqCst),
        );
        assert!(
            admitted <= 6 + refunded,
            "{admitted} admitted, {refunded} given back: beyond the burst of 6"
        );
        assert!(
            refunded > 0 && admitted > 6,
            "{admitted} admitted, {refunded} given back"
        );
    });
}

/// A refund record that no script writes is a malformed state: the refund fails
/// with an error naming the key and writes nothing.
#[test]
fn a_refund_over_a_malformed_record_fails_and_writes_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let policy = Policy::per_second(10).unwrap();
        let l = limiter(&server, Algorithm::Gcra, policy).await;
        let (_, r) = l.charge_n_at_micros("m", 1, 1_000_000).await.unwrap();
        let r = r.unwrap();
        let bad = "1100000:0:1100000:0:7/";
        let _: () = server.cmd(&["SET", "refunds:m", bad]);
        let e = l
            .refund_at_micros(&r, 1_000_000)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("malformed") && e.contains("refunds:m"), "{e}");
        let after: String = server.cmd(&["GET", "refunds:m"]);
        assert_eq!(after, bad);
    });
}
