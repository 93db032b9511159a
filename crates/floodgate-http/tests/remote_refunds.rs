//! Session 42: a remote rule's charge is given back when a later hard rule denies
//! the request, as an in-process rule's is — a client that a global rule turned
//! away keeps its per-user budget in Redis.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use floodgate::{Policy, RateLimiter};
use floodgate_http::{from_fn, Global, RateLimitLayer, Rule};
use floodgate_redis::{Algorithm, ConnectionManager, OnFailure, RedisLimiter};
use http::{Request, Response, StatusCode};
use tower::{service_fn, Layer, Service, ServiceExt};
#[path = "common/redis.rs"]
mod redis_server;
use redis_server::Redis;

fn user(parts: &http::request::Parts) -> Result<String, floodgate_http::KeyError> {
    Ok(parts
        .headers
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("anon")
        .to_owned())
}

/// The per-user limit of the tests below: GCRA in Redis, `limit` an hour, under
/// `layer:`, refunds `on` or off.
fn per_user_limit(conn: ConnectionManager, limit: u64, on: bool) -> Arc<RedisLimiter> {
    let limiter = RedisLimiter::builder(Algorithm::Gcra, Policy::per_hour(limit).unwrap())
        .refunds(on)
        .prefix("layer:")
        .timeout(Duration::from_secs(2))
        .on_failure(OnFailure::Error)
        .build(conn)
        .unwrap();
    Arc::new(limiter)
}

/// A remote rule on `per_user` keyed on `x-user`, then an in-process global rule of
/// 1 an hour: the second request, whoever sends it, is turned away by the global
/// rule after the per-user one charged.
fn per_user_then_global(per_user: &Arc<RedisLimiter>) -> RateLimitLayer {
    let global = RateLimiter::gcra(Policy::per_hour(1).unwrap());
    RateLimitLayer::builder()
        .rule(Rule::remote_shared("per-user", Arc::clone(per_user), from_fn(user)).unwrap())
        .rule(Rule::new("global", global, Global).unwrap())
        .build()
        .unwrap()
}

/// A request from user `who`.
fn send(who: &str) -> Request<()> {
    Request::get("/").header("x-user", who).body(()).unwrap()
}

/// `layer`'s service over an empty 200, after one request from "a": the global unit
/// goes to "a", charged in both rules (and the scripts are loaded).
async fn global_spent_on_a(
    layer: &RateLimitLayer,
) -> impl Service<Request<()>, Response = Response<impl Sized>, Error = Infallible> {
    let mut svc = layer.layer(service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(()))
    }));
    let r = svc.ready().await.unwrap().call(send("a")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    svc
}

/// A remote per-user rule (GCRA in Redis, 3 an hour), then an in-process global
/// rule that is spent: every request is turned away by the global rule, and each
/// time the user's charge in Redis is given back — afterwards the user's budget is
/// whole. One request the global rule admits is charged in both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_denial_gives_the_remote_charge_back() {
    let Some(redis) = Redis::start() else {
        return;
    };
    let conn = floodgate_redis::connect(&redis.url()).await.unwrap();
    let per_user = per_user_limit(conn, 3, true);
    let layer = per_user_then_global(&per_user);
    let mut svc = global_spent_on_a(&layer).await;
    let left = |d: floodgate::Decision| d.remaining();
    let a = per_user.peek_n("a", 0).await.unwrap().decision();
    assert_eq!(left(a), 2);

    // "b" is turned away by the global rule five times (more than its own 3).
    for _ in 0..5 {
        let r = svc.ready().await.unwrap().call(send("b")).await.unwrap();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    let b = per_user.peek_n("b", 0).await.unwrap().decision();
    assert_eq!(left(b), 3, "b's per-user budget must be untouched");
    assert_eq!(layer.stats()[0].errors, 0);
    // And "a" was charged once, by the admitted request only.
    let a = per_user.peek_n("a", 0).await.unwrap().decision();
    assert_eq!(left(a), 2);
    drop(redis);
}

/// How many times Redis ran a script by its SHA1 (`EVALSHA`) since the last
/// `CONFIG RESETSTAT`: one per charge, one per refund.
async fn script_runs(conn: &mut ConnectionManager) -> u64 {
    let info: String = floodgate_redis::redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Refunds are opt-in (`RedisLimiterBuilder::refunds`, off by default): with them
/// off, the same layer as above keeps the remote charge of each request the global
/// rule turns away, makes no refund round trip for it (one script run per request,
/// counted by Redis), and leaves the user's key in the plain state every version
/// reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_refunds_off_a_later_denial_keeps_the_remote_charge_without_a_round_trip() {
    let Some(redis) = Redis::start() else {
        return;
    };
    let mut conn = floodgate_redis::connect(&redis.url()).await.unwrap();
    let per_user = per_user_limit(conn.clone(), 10, false);
    let layer = per_user_then_global(&per_user);
    let mut svc = global_spent_on_a(&layer).await;
    let _: () = floodgate_redis::redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    for _ in 0..5 {
        let r = svc.ready().await.unwrap().call(send("b")).await.unwrap();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(
        script_runs(&mut conn).await,
        5,
        "one charge each, no refund"
    );
    let b = per_user.peek_n("b", 0).await.unwrap().decision();
    assert_eq!(b.remaining(), 5, "b's charges stay taken");
    assert_eq!(layer.stats()[0].errors, 0);
    let raw: String = floodgate_redis::redis::cmd("GET")
        .arg(per_user.redis_keys("b"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(raw.bytes().all(|c| c.is_ascii_digit()), "{raw}");
    drop(redis);
}

/// A remote limit that admits with a receipt and whose refunds always fail.
struct RefundsFail;

impl floodgate::AsyncLimit<String> for RefundsFail {
    type Error = String;

    async fn check_n(&self, _key: &String, cost: u32) -> Result<floodgate::Decision, String> {
        Ok(floodgate::Decision::new(
            true,
            9,
            9 - u64::from(cost),
            Duration::ZERO,
            None,
        ))
    }

    async fn peek_n(&self, key: &String, cost: u32) -> Result<floodgate::Decision, String> {
        self.check_n(key, cost).await
    }

    async fn charge_n(
        &self,
        key: &String,
        cost: u32,
    ) -> Result<(floodgate::Decision, floodgate::AsyncReceipt), String> {
        let d = self.check_n(key, cost).await?;
        Ok((d, floodgate::AsyncReceipt::new(())))
    }

    async fn refund(
        &self,
        _key: &String,
        _receipt: floodgate::AsyncReceipt,
    ) -> Result<bool, String> {
        Err("the backend is down".to_owned())
    }
}

/// A refund that fails is counted in the remote rule's `errors` and changes
/// nothing else: the request is still answered 429 by the rule that denied it.
#[tokio::test]
async fn a_failed_refund_is_counted_and_the_denial_stands() {
    let global = RateLimiter::gcra(Policy::per_hour(1).unwrap());
    let layer = RateLimitLayer::builder()
        .rule(Rule::remote("per-user", RefundsFail, from_fn(user)).unwrap())
        .rule(Rule::new("global", global, Global).unwrap())
        .build()
        .unwrap();
    let mut svc = layer.layer(service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(()))
    }));
    assert_eq!(
        svc.ready()
            .await
            .unwrap()
            .call(send("c"))
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    let r = svc.ready().await.unwrap().call(send("c")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(r.headers().contains_key("retry-after"));
    let stats = layer.stats();
    assert_eq!((stats[0].allowed, stats[0].errors), (2, 1));
    assert_eq!((stats[1].allowed, stats[1].denied), (1, 1));
}

/// Session 43, end to end (feature `queue`): a real Redis limit with refunds as a
/// remote rule, then a global queue of one request a minute (burst 1, waiting at
/// most 5 min) on a standing clock. "a" takes the queue's slot; "b" is charged in
/// Redis and waits a minute for its own; its client goes away after 100 ms. (On
/// the production clock at one a second, a runtime that stalled a second between
/// "a" and "b" served "b" at once: only a stall of a minute after b's first poll
/// could serve it now.) The response future is
/// dropped on the runtime, which runs the refund in a spawned task: "b"'s per-user
/// budget in Redis comes back whole, with no error counted; "a", served, keeps its
/// charge.
#[cfg(feature = "queue")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_in_a_later_queue_gets_its_redis_charge_back() {
    let Some(redis) = Redis::start() else {
        return;
    };
    let conn = floodgate_redis::connect(&redis.url()).await.unwrap();
    let per_user = per_user_limit(conn, 3, true);
    let queue = floodgate::Shaper::with_clock(
        Policy::per_minute(1).unwrap().with_burst(1).unwrap(),
        floodgate::ManualClock::new(),
    );
    let layer = RateLimitLayer::builder()
        .rule(Rule::remote_shared("per-user", Arc::clone(&per_user), from_fn(user)).unwrap())
        .queue(floodgate_http::QueueRule::new("queue", queue, Duration::from_secs(300)).unwrap())
        .build()
        .unwrap();
    let mut svc = global_spent_on_a(&layer).await;
    let b = svc.ready().await.unwrap().call(send("b"));
    let gone = tokio::time::timeout(Duration::from_millis(100), b).await;
    assert!(gone.is_err(), "b must still be waiting for its slot");
    // The refund runs in a task of its own: wait for it (within the limiter's 2 s
    // timeout, and then some).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let left = loop {
        let left = per_user
            .peek_n("b", 0)
            .await
            .unwrap()
            .decision()
            .remaining();
        if left == 3 || std::time::Instant::now() > deadline {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(left, 3, "b's Redis charge must be given back");
    assert_eq!(layer.stats()[0].errors, 0);
    let a = per_user.peek_n("a", 0).await.unwrap().decision();
    assert_eq!(a.remaining(), 2, "a was served: its charge stays");
    drop(redis);
}
