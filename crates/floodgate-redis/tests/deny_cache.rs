//! The local denial cache: a denied key is answered without a round trip until its
//! wait ends — even with Redis gone — while "never", other costs and cost 0 still go
//! to Redis.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{runtime, RedisServer};
use floodgate::Policy;
use floodgate_redis::redis::aio::ConnectionLike;
use floodgate_redis::redis::{Cmd, Pipeline, RedisFuture, Value};
use floodgate_redis::{
    Algorithm, ConnectionManager, OnFailure, RedisLimiter, RedisLimiterBuilder, RedisReceipt,
    Verdict,
};

fn cached_limiter(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    policy: Policy,
    keys: usize,
) -> RedisLimiter {
    let conn = rt
        .block_on(floodgate_redis::connect(&server.url()))
        .unwrap();
    cached_builder(policy, keys).build(conn).unwrap()
}

/// GCRA under `policy`, keys prefixed `test:`, a 1 s timeout reported as an error,
/// a denial cache of `keys` keys.
fn cached_builder(policy: Policy, keys: usize) -> RedisLimiterBuilder {
    RedisLimiter::builder(Algorithm::Gcra, policy)
        .prefix("test:")
        .timeout(Duration::from_secs(1))
        .on_failure(OnFailure::Error)
        .deny_cache(keys)
}

#[test]
fn a_denial_is_answered_locally_until_its_wait_ends() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    // A burst of 3, one more an hour.
    let policy = Policy::per_hour(1).and_then(|p| p.with_burst(3)).unwrap();
    let l = cached_limiter(&rt, &server, policy, 16);
    assert!(rt
        .block_on(l.check_n("k", 2))
        .unwrap()
        .decision()
        .is_allowed());
    let denied = rt.block_on(l.check_n("k", 2)).unwrap();
    assert!(matches!(denied, Verdict::Decided(d) if !d.is_allowed()));
    assert_eq!(l.cached_denials(), 1);

    // Redis is gone; cost 2 is still denied, from the cache.
    server.kill();
    match rt.block_on(l.check_n("k", 2)) {
        Ok(Verdict::Cached(d)) => {
            assert!(!d.is_allowed());
            let retry = d.retry_after().unwrap();
            assert!(retry <= denied.decision().retry_after().unwrap());
            assert!(retry > Duration::from_secs(3_000), "{retry:?}");
        }
        other => panic!("a cached denial expected, got {other:?}"),
    }
    assert!(rt.block_on(l.peek_n("k", 2)).unwrap().is_cached());
    // A smaller cost, a larger one, cost 0 and "never" need Redis: errors now.
    for cost in [1, 3, 0, 4] {
        assert!(rt.block_on(l.check_n("k", cost)).is_err(), "cost {cost}");
    }
}

#[test]
fn never_is_not_cached_and_a_wait_that_ended_goes_back_to_redis() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    // One per 300 ms.
    let policy = Policy::new(1, Duration::from_millis(300)).unwrap();
    let l = cached_limiter(&rt, &server, policy, 16);
    let never = rt.block_on(l.check_n("k", 2)).unwrap();
    assert!(matches!(never, Verdict::Decided(d) if d.retry_after().is_none()));
    assert_eq!(l.cached_denials(), 0);

    assert!(rt
        .block_on(l.check_n("k", 1))
        .unwrap()
        .decision()
        .is_allowed());
    // Denied while the unit is spent: 300 ms, over if this thread was descheduled
    // that long (then admitted again). Checked until a check is denied: each
    // admission spends the unit again, so the next check within 300 ms is denied.
    let denied = (0..100).any(|_| {
        !rt.block_on(l.check_n("k", 1))
            .unwrap()
            .decision()
            .is_allowed()
    });
    assert!(denied, "100 checks of a unit per 300 ms, none denied");
    // Within a generous bound the wait ends and Redis admits again.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match rt.block_on(l.check_n("k", 1)).unwrap() {
            Verdict::Decided(d) if d.is_allowed() => break,
            Verdict::Cached(_) | Verdict::Decided(_) => {
                assert!(Instant::now() < deadline, "never admitted again");
                std::thread::sleep(Duration::from_millis(20));
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn the_cache_holds_at_most_its_capacity() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let l = cached_limiter(&rt, &server, Policy::per_hour(1).unwrap(), 2);
    for key in ["a", "b", "c", "d"] {
        assert!(rt
            .block_on(l.check_n(key, 1))
            .unwrap()
            .decision()
            .is_allowed());
        assert!(!rt
            .block_on(l.check_n(key, 1))
            .unwrap()
            .decision()
            .is_allowed());
    }
    assert_eq!(l.cached_denials(), 2);
    // The uncached keys still get Redis's (identical) denial.
    let d = rt.block_on(l.check_n("d", 1)).unwrap();
    assert!(matches!(d, Verdict::Decided(d) if !d.is_allowed()));
}

/// A cached denial never reports a wait that Redis would not: after a denial of
/// cost 1, costs 2 and 3 wait two and three intervals at Redis, not the one
/// interval of the cost-1 denial — whoever answers, the wait is Redis's own, aged
/// by at most the moments between the two calls.
#[test]
fn a_cached_denial_reports_the_wait_redis_would_for_its_cost() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    // A burst of 3, one more an hour.
    let policy = Policy::per_hour(1).and_then(|p| p.with_burst(3)).unwrap();
    let cached = cached_limiter(&rt, &server, policy, 16);
    let uncached = cached_limiter(&rt, &server, policy, 0);
    assert!(rt
        .block_on(cached.check_n("k", 3))
        .unwrap()
        .decision()
        .is_allowed());
    let denied = rt.block_on(cached.check_n("k", 1)).unwrap();
    assert!(matches!(denied, Verdict::Decided(d) if !d.is_allowed()));
    for cost in [1, 2, 3, 1] {
        let sent = Instant::now();
        let redis = match rt.block_on(uncached.peek_n("k", cost)).unwrap() {
            Verdict::Decided(d) => d.retry_after().unwrap(),
            other => panic!("cost {cost}: {other:?}"),
        };
        let answer = rt.block_on(cached.check_n("k", cost)).unwrap();
        let d = answer.decision();
        assert!(!d.is_allowed(), "cost {cost}: {answer:?}");
        let retry = d.retry_after().unwrap();
        // Aged by the time between the two calls: at most the time measured
        // around both, however long this thread was descheduled (and a second).
        let between = sent.elapsed();
        assert!(
            retry <= redis,
            "cost {cost}: {retry:?} beyond Redis's {redis:?}"
        );
        assert!(
            retry + between + Duration::from_secs(1) >= redis,
            "cost {cost}: {answer:?} waits {retry:?}, Redis {redis:?}"
        );
    }
}

/// A refund that gives something back forgets the key's cached denial: the units it
/// returned admit the cost that was denied, at once, where the cache would have
/// answered "denied" for the rest of the hour.
#[test]
fn a_refund_that_gives_back_forgets_the_cached_denial() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    // A burst of 2, one more an hour.
    let policy = Policy::per_hour(1).and_then(|p| p.with_burst(2)).unwrap();
    let conn = rt
        .block_on(floodgate_redis::connect(&server.url()))
        .unwrap();
    let l = cached_builder(policy, 16)
        .refunds(true)
        .build(conn)
        .unwrap();
    let (first, _) = rt.block_on(l.charge_n("k", 1)).unwrap();
    assert!(first.decision().is_allowed());
    let (second, receipt) = rt.block_on(l.charge_n("k", 1)).unwrap();
    assert!(second.decision().is_allowed());
    let denied = rt.block_on(l.check_n("k", 1)).unwrap();
    assert!(!denied.decision().is_allowed());
    assert!(rt.block_on(l.check_n("k", 1)).unwrap().is_cached());
    assert_eq!(l.cached_denials(), 1);

    let receipt = receipt.unwrap();
    assert!(rt.block_on(l.refund(&receipt)).unwrap());
    assert_eq!(l.cached_denials(), 0, "the refund forgot the denial");
    asks_redis_and_is_admitted(&rt, &l);
    // Spent again: denied, and cached again.
    denied_and_cached(&rt, &l);
    // The same receipt again gives nothing back (Redis answers 0): the entry stays,
    // and the next call is answered locally (session 54's review; mutation seen
    // failing: every refund reply forgetting).
    assert!(!rt.block_on(l.refund(&receipt)).unwrap());
    assert_eq!(
        l.cached_denials(),
        1,
        "a refund of nothing forgot the denial"
    );
    assert!(rt.block_on(l.check_n("k", 1)).unwrap().is_cached());
}

/// A connection that, once armed, holds the reply of its next command until
/// released: Redis has decided, and the caller has not yet seen it.
#[derive(Clone)]
struct Held {
    inner: ConnectionManager,
    armed: Arc<Mutex<bool>>,
    replied: Arc<AtomicBool>,
    release: Arc<AtomicBool>,
}

impl ConnectionLike for Held {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let hold = std::mem::take(&mut *self.armed.lock().unwrap());
        Box::pin(async move {
            let reply = self.inner.req_packed_command(cmd).await;
            if hold {
                self.replied.store(true, Ordering::SeqCst);
                while !self.release.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.inner.req_packed_commands(cmd, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

/// `k`'s next call is denied, and the denial cached.
fn denied_and_cached<C>(rt: &tokio::runtime::Runtime, l: &RedisLimiter<C>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let denied = rt.block_on(l.check_n("k", 1)).unwrap();
    assert!(!denied.decision().is_allowed(), "{denied:?}");
    assert_eq!(l.cached_denials(), 1);
}

/// `k`'s next call goes to Redis (no cached denial) and is admitted.
fn asks_redis_and_is_admitted<C>(rt: &tokio::runtime::Runtime, l: &RedisLimiter<C>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let after = rt.block_on(l.check_n("k", 1)).unwrap();
    assert!(
        after.decision().is_allowed() && !after.is_cached(),
        "{after:?}"
    );
}

/// A limiter with refunds on, timeout `timeout`, on a [`Held`] connection to
/// `server`, whose key `k` (a burst of 2, one more an hour) has spent its burst in
/// two charges: the connection and the second charge's receipt.
fn held_and_spent(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    timeout: Duration,
) -> (Held, RedisLimiter<Held>, RedisReceipt) {
    let policy = Policy::per_hour(1).and_then(|p| p.with_burst(2)).unwrap();
    let conn = Held {
        inner: rt
            .block_on(floodgate_redis::connect(&server.url()))
            .unwrap(),
        armed: Arc::default(),
        replied: Arc::default(),
        release: Arc::default(),
    };
    let l = cached_builder(policy, 16)
        .timeout(timeout)
        .refunds(true)
        .build(conn.clone())
        .unwrap();
    assert!(rt
        .block_on(l.charge_n("k", 1))
        .unwrap()
        .0
        .decision()
        .is_allowed());
    let (second, receipt) = rt.block_on(l.charge_n("k", 1)).unwrap();
    assert!(second.decision().is_allowed());
    (conn, l, receipt.unwrap())
}

/// A denial that Redis decided before this process's refund, whose reply comes back
/// after the refund forgot the key's entry, is not cached: the refund's room
/// admits the key's next call. Before session 53 the late denial was recorded over
/// the forgotten entry and answered "denied" for the rest of the hour.
#[test]
fn a_denial_decided_before_a_refund_is_not_cached_after_it() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    // 5 s: the held check waits for the refund, which a loaded machine may delay.
    let (conn, l, receipt) = held_and_spent(&rt, &server, common::TEST_TIMEOUT);
    let l = Arc::new(l);

    // The check script loaded (a NOSCRIPT reply is not a decision to hold).
    assert!(rt
        .block_on(l.peek_n("other", 1))
        .unwrap()
        .decision()
        .is_allowed());
    // Redis denies; the reply is held until the refund is made.
    *conn.armed.lock().unwrap() = true;
    let late = rt.spawn({
        let l = Arc::clone(&l);
        async move { l.check_n("k", 1).await }
    });
    while !conn.replied.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(rt.block_on(l.refund(&receipt)).unwrap());
    conn.release.store(true, Ordering::SeqCst);
    let denied = rt.block_on(late).unwrap().unwrap();
    assert!(
        matches!(denied, Verdict::Decided(d) if !d.is_allowed()),
        "{denied:?}"
    );

    assert_eq!(l.cached_denials(), 0, "the late denial was cached");
    asks_redis_and_is_admitted(&rt, &l);
}

/// The refund script loaded on `l` (a NOSCRIPT reply is not the reply to hold),
/// and `k` denied and cached.
fn refund_loaded_and_denied(rt: &tokio::runtime::Runtime, l: &RedisLimiter<Held>) {
    let (other, other_receipt) = rt.block_on(l.charge_n("other", 1)).unwrap();
    assert!(other.decision().is_allowed());
    assert!(rt.block_on(l.refund(&other_receipt.unwrap())).unwrap());
    denied_and_cached(rt, l);
}

/// A refund whose reply never comes back (held past the limiter's timeout, after
/// Redis ran it) still forgets the key's cached denial: the caller cannot tell what
/// was given back, and the key's next call asks Redis, which admits with the
/// refunded room. Before session 54 only a reply of units given back forgot the
/// entry, and the cache went on answering "denied" for the rest of the hour.
#[test]
fn a_refund_whose_reply_is_lost_forgets_the_cached_denial() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let (conn, l, receipt) = held_and_spent(&rt, &server, Duration::from_secs(1));
    refund_loaded_and_denied(&rt, &l);

    // Redis runs the refund; its reply is held past the 1 s timeout.
    *conn.armed.lock().unwrap() = true;
    let lost = rt.block_on(l.refund(&receipt));
    conn.release.store(true, Ordering::SeqCst);
    assert!(conn.replied.load(Ordering::SeqCst), "Redis ran the refund");
    assert!(
        matches!(lost, Err(floodgate_redis::RedisLimitError::Timeout { .. })),
        "{lost:?}"
    );
    assert_eq!(l.cached_denials(), 0, "the lost refund kept the denial");
    asks_redis_and_is_admitted(&rt, &l);
}

/// A refund whose caller stops waiting for it (its future dropped: a caller's own
/// timeout, a `select!`, a client gone) after Redis ran it forgets the key's cached
/// denial too, as a refund whose reply the limiter's own timeout lost: the reply
/// never came. Before session 54's review the dropped refund skipped the forget,
/// and the cache answered "denied" for the rest of the hour though the refund had
/// made room.
#[test]
fn a_refund_dropped_by_its_caller_forgets_the_cached_denial() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    // The limiter's own timeout far past the caller's.
    let (conn, l, receipt) = held_and_spent(&rt, &server, common::TEST_TIMEOUT);
    refund_loaded_and_denied(&rt, &l);

    // Redis runs the refund; its reply is held, and the caller gives up first.
    *conn.armed.lock().unwrap() = true;
    let dropped = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(1), l.refund(&receipt)).await });
    conn.release.store(true, Ordering::SeqCst);
    assert!(dropped.is_err(), "the caller's timeout: {dropped:?}");
    assert!(conn.replied.load(Ordering::SeqCst), "Redis ran the refund");
    assert_eq!(l.cached_denials(), 0, "the dropped refund kept the denial");
    asks_redis_and_is_admitted(&rt, &l);
}
