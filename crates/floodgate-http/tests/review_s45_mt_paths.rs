//! Session 45 (httpmt): the layer's other answers under concurrency, each path on
//! its own — a request rejected for its key (400) and one whose later remote
//! limiter fails (503) give back every earlier rule's charge, in-process and
//! remote; a gRPC request denied by a combination of rules is answered the longest
//! wait as a trailers-only status. Many requests at once on a multi-thread Tokio
//! runtime (4 workers, 8 tasks from a barrier); every in-process limiter stands on
//! a `ManualClock`, so the counts are exact.
//!
//! The earlier in-process rule is a keyed fixed window, whose refunds are exact
//! counts whatever their order (a GCRA refund may give back less when refunds
//! land out of order: the open finding of `review_s45_mt.rs`). The remote rule is
//! the in-memory double of `common/remote.rs`, whose refunds are counted.
#![cfg(feature = "queue")]

use std::future::{ready, Future};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use floodgate::{AsyncLimit, Decision, FixedWindow, KeyedLimiter, ManualClock, Policy};
use floodgate_http::{
    from_fn, HeaderKey, RateLimitLayer, RateLimitLayerBuilder, RateLimitService, Rule,
};
use http::{HeaderMap, Request};
use tower::{Layer, ServiceExt};
mod common;
#[path = "common/remote.rs"]
mod remote;
use common::{key_of, Hello};
#[path = "common/tasks.rs"]
mod tasks;
use remote::{per_user, Remote};
use tasks::{at_once, runtime};

type Error = Box<dyn std::error::Error + Send + Sync>;
type TestResult = Result<(), Error>;

const TASKS: usize = 8;
const EACH: u64 = 24;
const KEYS: u64 = 4;
/// The keyed window's limit per key.
const PER_KEY: u64 = 9;

/// A remote limiter that admits every request, except those of key `down`, for
/// which its backend fails.
struct Flaky;

#[derive(Debug)]
struct Unreachable;

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("backend unreachable")
    }
}

impl AsyncLimit<String> for Flaky {
    type Error = Unreachable;

    fn check_n(
        &self,
        key: &String,
        _: u32,
    ) -> impl Future<Output = Result<Decision, Unreachable>> + Send {
        ready(if key == "down" {
            Err(Unreachable)
        } else {
            Ok(Decision::new(true, 1_000, 999, Duration::ZERO, None))
        })
    }

    fn peek_n(
        &self,
        key: &String,
        cost: u32,
    ) -> impl Future<Output = Result<Decision, Unreachable>> + Send {
        self.check_n(key, cost)
    }
}

/// The layer under test and the limiters it charges first.
struct Paths {
    per_key: Arc<KeyedLimiter<u64, FixedWindow, ManualClock>>,
    remote: Arc<Remote>,
    layer: RateLimitLayer,
    svc: RateLimitService<Hello>,
}

/// "per-key" (a keyed fixed window of 9 an hour on `x-key`, in process), then
/// "per-user" (the remote double, 3 an hour on `x-user`, refunds on), then `last`'s
/// rule.
fn paths(
    last: impl FnOnce(RateLimitLayerBuilder) -> Result<RateLimitLayerBuilder, Error>,
) -> Result<Paths, Error> {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(7 * 3600));
    let per_key = Arc::new(
        floodgate::KeyedBuilder::new(FixedWindow::new(Policy::per_hour(PER_KEY)?)?)
            .clock(clock)
            .build::<u64>()?,
    );
    let remote = Remote::new().map_err(|e| e.to_string())?;
    let builder = RateLimitLayer::builder()
        .rule(Rule::shared(
            "per-key",
            Arc::clone(&per_key),
            from_fn(key_of),
        )?)
        .rule(per_user("per-user", &remote).map_err(|e| e.to_string())?);
    let layer = last(builder)?.build()?;
    let svc = layer.layer(Hello);
    Ok(Paths {
        per_key,
        remote,
        layer,
        svc,
    })
}

/// One response: the request's key, user, whether it carried the third rule's
/// trouble (no key, or a failing backend), and what came back.
#[derive(Debug)]
struct Seen {
    key: u64,
    user: String,
    trouble: bool,
    status: u16,
    headers: HeaderMap,
}

/// Sends `EACH` requests from each of `TASKS` tasks at once: each a key drawn in
/// `0..KEYS`, its own user (each user's one charge in the remote double), and every
/// other request made with `trouble` applied.
async fn storm(
    svc: &RateLimitService<Hello>,
    trouble: fn(http::request::Builder) -> http::request::Builder,
    fine: fn(http::request::Builder) -> http::request::Builder,
) -> Result<Vec<Seen>, String> {
    at_once(TASKS, |t| {
        let svc = svc.clone();
        async move {
            let mut rng = common::Rng(t as u64 + 11);
            let mut out = Vec::new();
            for i in 0..EACH {
                let key = rng.below(KEYS);
                let user = format!("t{t}-{i}");
                let bad = rng.below(2) == 0;
                let req = Request::get("/")
                    .header("x-key", key.to_string())
                    .header("x-user", &user);
                let req = if bad { trouble(req) } else { fine(req) };
                let resp = svc
                    .clone()
                    .oneshot(req.body(()).map_err(|e| e.to_string())?)
                    .await
                    .map_err(|e| -> String { match e {} })?;
                out.push(Seen {
                    key,
                    user,
                    trouble: bad,
                    status: resp.status().as_u16(),
                    headers: resp.headers().clone(),
                });
                tokio::task::yield_now().await;
            }
            Ok(out)
        }
    })
    .await
}

/// What every storm of [`paths`] must leave: the requests answered `rejected` (400
/// or 503) are exactly those with trouble that the first two rules admitted; each
/// gave back its window charge (the window's count per key is exactly the 200s)
/// and its remote charge (one refund made each, and the 200s' users alone keep
/// theirs); the first two rules' 429s are the rest.
fn check(p: &Paths, all: &[Seen], rejected: u16) -> TestResult {
    let passed = |s: &&Seen| s.status == 200;
    for s in all {
        assert!([200, 429, rejected].contains(&s.status), "{s:?}");
        assert_eq!(s.status == rejected, s.trouble && s.status != 429, "{s:?}");
        assert_eq!(
            s.headers.contains_key("retry-after"),
            s.status == 429,
            "{s:?}"
        );
    }
    let n_rejected = all.iter().filter(|s| s.status == rejected).count() as u64;
    assert!(n_rejected > 0, "the path was taken");
    for k in 0..KEYS {
        let ok = all.iter().filter(passed).filter(|s| s.key == k).count() as u64;
        assert!(ok <= PER_KEY);
        assert_eq!(
            p.per_key.peek(&k, 0).remaining(),
            PER_KEY - ok,
            "key {k}: every {rejected}'s window charge given back"
        );
    }
    assert_eq!(
        u64::from(p.remote.refunds.load(Ordering::SeqCst)),
        n_rejected,
        "one remote refund per {rejected}"
    );
    for s in all {
        let left = p.remote.left(&s.user);
        match s.status {
            200 => assert_eq!(left, 2, "{s:?}"),
            // Each user charges once: nothing is taken from a 429'd or refunded user
            // (but a GCRA refund may give back less: the open finding).
            _ => assert!(left >= 2, "{s:?}: {left}"),
        }
    }
    let stats = p.layer.stats();
    let denied: u64 = stats.iter().map(|r| r.denied).sum();
    assert_eq!(
        denied,
        all.iter().filter(|s| s.status == 429).count() as u64
    );
    Ok(())
}

/// 400s: the third rule needs an `x-b` header (rejected without one), and every
/// other request lacks it.
///
/// Mutations seen failing: the in-process refunds of the 400 path removed
/// (`held.give_back` before the `BAD_REQUEST` reply in `decide`: the window keeps
/// the 400s' charges), and its remote refunds removed
/// (`held.give_back_remote` there: no refund made). The 503 test below passes under
/// both: the paths are tested apart.
#[test]
fn concurrent_400s_give_back_every_earlier_charge() -> TestResult {
    let p = paths(|b| {
        let needs_b = KeyedLimiter::<String, floodgate::Gcra, ManualClock>::gcra_with_clock(
            Policy::per_hour(1_000_000)?,
            ManualClock::new(),
        );
        Ok(b.rule(Rule::new("needs-b", needs_b, HeaderKey::new("x-b")?)?))
    })?;
    let all = runtime()?.block_on(storm(&p.svc, |r| r, |r| r.header("x-b", "1")))?;
    check(&p, &all, 400)?;
    let bad = p.layer.rule_stats("needs-b").map(|s| s.bad_key);
    let n400 = all.iter().filter(|s| s.status == 400).count() as u64;
    assert_eq!(bad, Some(n400));
    Ok(())
}

/// 503s: the third rule is a remote limiter whose backend fails for key `down`
/// (fail closed, the default), which every other request uses.
///
/// Mutations seen failing: the in-process refunds of the 503 path removed
/// (`held.give_back` before the `SERVICE_UNAVAILABLE` reply) and its remote refunds
/// removed (`held.give_back_remote` there). The 400 test passes under both.
#[test]
fn concurrent_503s_give_back_every_earlier_charge() -> TestResult {
    let p = paths(|b| Ok(b.rule(Rule::remote("flaky", Flaky, HeaderKey::new("x-mode")?)?)))?;
    let all = runtime()?.block_on(storm(
        &p.svc,
        |r| r.header("x-mode", "down"),
        |r| r.header("x-mode", "up"),
    ))?;
    check(&p, &all, 503)?;
    let errors = p.layer.rule_stats("flaky").map(|s| s.errors);
    let n503 = all.iter().filter(|s| s.status == 503).count() as u64;
    assert_eq!(errors, Some(n503));
    Ok(())
}

/// gRPC requests denied by a combination, at once from many tasks, beside plain
/// HTTP ones: "per-key" (a keyed fixed window, 1 a minute; key 0 spent) and
/// "global" (GCRA, 2 an hour, spent), on a standing clock. Every gRPC answer is
/// trailers-only (HTTP 200, `application/grpc`, no body) with `RESOURCE_EXHAUSTED`,
/// `grpc-retry-pushback-ms` the longest wait — the global's 1 800 s, also for key
/// 0, which "per-key" denied for 60 s — and a `RetryInfo` of the same delay; its
/// rate-limit headers are those of the HTTP 429 beside it; and the keys the
/// per-key window admitted before the global denied are charged nothing.
///
/// Mutation seen failing: the later rules not peeked on a denial (`later_denials`
/// answering the first denial: key 0's pushback 60 000).
#[cfg(feature = "grpc")]
#[test]
fn concurrent_grpc_denials_by_a_combination_are_the_longest_wait() -> TestResult {
    use tonic_types::StatusExt;
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(7 * 3600));
    let per_key = Arc::new(
        floodgate::KeyedBuilder::new(FixedWindow::new(Policy::per_minute(1)?)?)
            .clock(clock.clone())
            .build::<u64>()?,
    );
    let global = Arc::new(floodgate::RateLimiter::gcra_with_clock(
        Policy::per_hour(2)?,
        clock,
    ));
    let layer = RateLimitLayer::builder()
        .rule(Rule::shared(
            "per-key",
            Arc::clone(&per_key),
            from_fn(key_of),
        )?)
        .rule(Rule::shared(
            "global",
            Arc::clone(&global),
            floodgate_http::Global,
        )?)
        .build()?;
    let svc = layer.layer(Hello);
    assert!(per_key.charge(&0, 1).0.is_allowed());
    assert!(global.charge(2).0.is_allowed());
    let rt = runtime()?;
    let answers = rt.block_on(at_once(TASKS, |t| {
        let svc = svc.clone();
        async move {
            let mut out = Vec::new();
            for i in 0..EACH {
                let key = (t as u64 + i) % KEYS;
                let grpc = i % 3 != 0;
                let mut req =
                    Request::post("/grpc.health.v1.Health/Check").header("x-key", key.to_string());
                if grpc {
                    req = req.header("content-type", "application/grpc+proto");
                }
                let resp = svc
                    .clone()
                    .oneshot(req.body(()).map_err(|e| e.to_string())?)
                    .await
                    .map_err(|e| -> String { match e {} })?;
                let (head, body) = resp.into_parts();
                let empty = http_body::Body::is_end_stream(&body);
                out.push((key, grpc, head.status.as_u16(), head.headers, empty));
                tokio::task::yield_now().await;
            }
            Ok(out)
        }
    }))?;
    let text = |h: &HeaderMap, n: &str| h.get(n).and_then(|v| v.to_str().ok()).map(str::to_owned);
    for (key, grpc, status, h, empty) in &answers {
        let what = format!("key {key}, grpc {grpc}: {h:?}");
        // Both families: the global's 1 800 s, the longest, and no units left.
        assert_eq!(text(h, "retry-after").as_deref(), Some("1800"), "{what}");
        assert_eq!(
            text(h, "x-ratelimit-remaining").as_deref(),
            Some("0"),
            "{what}"
        );
        assert!(
            text(h, "ratelimit").is_some_and(|r| r.contains("\"global\";r=0")),
            "{what}"
        );
        if *grpc {
            assert_eq!(*status, 200, "{what}");
            assert!(*empty, "trailers-only: {what}");
            assert_eq!(text(h, "content-type").as_deref(), Some("application/grpc"));
            assert_eq!(
                text(h, "grpc-retry-pushback-ms").as_deref(),
                Some("1800000")
            );
            let st = tonic::Status::from_header_map(h).ok_or(format!("no status: {what}"))?;
            assert_eq!(st.code(), tonic::Code::ResourceExhausted, "{what}");
            assert!(st.message().contains("\"global\""), "{what}");
            let retry = st
                .get_details_retry_info()
                .ok_or(format!("no RetryInfo: {what}"))?;
            assert_eq!(retry.retry_delay, Some(Duration::from_secs(1800)), "{what}");
        } else {
            assert_eq!(*status, 429, "{what}");
            assert!(!h.contains_key("grpc-status"), "{what}");
        }
    }
    // The keys the window admitted were given back; key 0 stays spent.
    assert_eq!(per_key.peek(&0, 0).remaining(), 0);
    for k in 1..KEYS {
        assert_eq!(per_key.peek(&k, 0).remaining(), 1, "key {k}");
    }
    let stats = layer.stats();
    assert_eq!(stats[1].denied, answers.len() as u64 - stats[0].denied);
    Ok(())
}
