//! Session 44 review of the 429 path as a proxy runs it, the pieces combined: a
//! remote rule with refunds (the `Remote` double), an in-process keyed rule that
//! denies, then a queue and a priority rule peeked for the 429, with soft and
//! shadow rules mixed in, requests of cost 2 and 0, and the request's future
//! dropped at each await point (poll once, then drop). On Tokio's paused clock,
//! which also drives the in-process limiters.
#![cfg(feature = "queue")]

use std::future::{poll_fn, Future};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use floodgate::{Clock, KeyedLimiter, Policy, Shaper};
use floodgate_http::{
    from_fn, HeaderKey, KeyedQueueRule, PriorityRule, QueueRule, RateLimitLayer,
    RateLimitLayerBuilder, RateLimitService, Rule, Strategy,
};
use http::Request;
use tokio::time::Instant;
use tower::{Layer, Service};
#[path = "common/answer.rs"]
mod answer;
mod common;
#[path = "common/remote.rs"]
mod remote;
use answer::Answer;
use common::{tier, Hello, TestResult, TokioClock};
use remote::{let_spawned_tasks_run, per_user, Remote};

type PerUser = KeyedLimiter<String, floodgate::Gcra, TokioClock>;

/// The limiters of [`proxy`], kept to read their state.
struct Proxy {
    remote: Arc<Remote>,
    per_key: Arc<PerUser>,
    queue: Arc<Shaper<TokioClock>>,
    clock: TokioClock,
    layer: RateLimitLayer,
    svc: RateLimitService<Hello>,
}

/// The rules in a proxy's order: "per-user" (remote, 3 an hour, refunds on);
/// "per-key" (in-process, 1 per 2 s, burst 1, keyed on `x-user`); `extra`'s rules;
/// "queue" (global, 1 per 10 s, burst 1, waiting at most 1 s); "priority" (global,
/// 100 a second, tiers of 2 and 2). Every rule costs `cost`.
fn proxy(
    cost: u32,
    extra: impl FnOnce(RateLimitLayerBuilder, TokioClock) -> Result<RateLimitLayerBuilder, String>,
) -> Result<Proxy, Box<dyn std::error::Error>> {
    proxy_with(cost, |b, _| Ok(b), extra)
}

/// [`proxy`], with `early`'s rules between "per-user" and "per-key".
fn proxy_with(
    cost: u32,
    early: impl FnOnce(RateLimitLayerBuilder, TokioClock) -> Result<RateLimitLayerBuilder, String>,
    extra: impl FnOnce(RateLimitLayerBuilder, TokioClock) -> Result<RateLimitLayerBuilder, String>,
) -> Result<Proxy, Box<dyn std::error::Error>> {
    let clock = TokioClock {
        start: Instant::now(),
    };
    let remote = Remote::new()?;
    let per_key: Arc<PerUser> = Arc::new(KeyedLimiter::gcra_with_clock(
        Policy::new(1, Duration::from_secs(2))?.with_burst(u64::from(cost.max(1)))?,
        clock,
    ));
    let queue = Arc::new(Shaper::with_clock(
        Policy::new(1, Duration::from_secs(10))?.with_burst(u64::from(cost.max(1)))?,
        clock,
    ));
    let builder = RateLimitLayer::builder().rule(per_user("per-user", &remote)?.cost(cost));
    let builder = early(builder, clock)?
        .rule(Rule::shared("per-key", Arc::clone(&per_key), HeaderKey::new("x-user")?)?.cost(cost));
    let builder = extra(builder, clock)?;
    let layer = builder
        .queue(QueueRule::shared("queue", Arc::clone(&queue), Duration::from_secs(1))?.cost(cost))
        .priority(
            PriorityRule::new(
                "priority",
                Shaper::with_clock(Policy::per_second(100)?.with_burst(10)?, clock),
                &[2, 2],
                from_fn(tier),
            )?
            .cost(cost),
        )
        .max_refund_tasks(1)
        .build()?;
    let svc = layer.layer(Hello);
    Ok(Proxy {
        remote,
        per_key,
        queue,
        clock,
        layer,
        svc,
    })
}

/// Tokio's clock from now, and the "per-key" limiter on it: 1 per 2 s, `burst`.
fn per_key_rule(burst: u64) -> Result<(TokioClock, Arc<PerUser>), Box<dyn std::error::Error>> {
    let clock = TokioClock {
        start: Instant::now(),
    };
    let policy = Policy::new(1, Duration::from_secs(2))?.with_burst(burst)?;
    Ok((
        clock,
        Arc::new(KeyedLimiter::gcra_with_clock(policy, clock)),
    ))
}

/// "per-user" on `remote`, then "per-key" on `per_key`, each of cost 1.
fn remote_then_per_key(
    remote: &Arc<Remote>,
    per_key: &Arc<PerUser>,
) -> Result<RateLimitLayerBuilder, Box<dyn std::error::Error>> {
    let key = HeaderKey::new("x-user")?;
    Ok(RateLimitLayer::builder()
        .rule(per_user("per-user", remote)?)
        .rule(Rule::shared("per-key", Arc::clone(per_key), key)?))
}

/// A request from `who` in tier 0.
fn req(who: &str) -> Request<()> {
    common::tier_request(who, 0)
}

async fn send(p: &Proxy, who: &str) -> Result<Answer, Box<dyn std::error::Error>> {
    let mut svc = p.svc.clone();
    let response = svc.call(req(who)).await?;
    Answer::read(response)
        .await
        .map_err(|e| e.to_string().into())
}

/// `who`'s request through `svc`, read whole.
async fn ask(
    svc: &mut RateLimitService<Hello>,
    who: &str,
) -> Result<Answer, Box<dyn std::error::Error>> {
    let response = svc.call(req(who)).await?;
    Answer::read(response)
        .await
        .map_err(|e| e.to_string().into())
}

fn stat(layer: &RateLimitLayer, rule: &str) -> Result<floodgate_http::RuleStats, String> {
    layer
        .rule_stats(rule)
        .ok_or_else(|| format!("no rule {rule}"))
}

/// "u" is served: its per-key unit spent for 2 s, 1 of its 3 remote units kept,
/// and the queue's slot taken (the next is 10 s away, 9 s beyond the queue's 1 s
/// bound).
async fn spend(p: &Proxy) -> TestResult {
    let a = send(p, "u").await?;
    assert_eq!(a.status, 200, "u is served: {}", a.body);
    assert_eq!(p.remote.left("u"), 2);
    Ok(())
}

/// The whole proxy: "u" again is charged in the remote rule, denied by per-key
/// (2 s), and the queue would refuse it for 9 s. The 429 is the queue's (9 s,
/// its name, its limit, the least remaining), lists per-key and the queue but
/// not the admitting priority rule; the remote charge comes back exactly once;
/// and "u", retrying after exactly `Retry-After`, is served (queued within the
/// queue's bound).
#[test]
fn combined_429_is_the_longest_and_its_retry_after_holds() -> TestResult {
    remote::paused_runtime()?.block_on(async {
        let p = proxy(1, |b, _| Ok(b))?;
        spend(&p).await?;
        let denied = send(&p, "u").await?;
        assert_eq!(denied.status, 429, "{}", denied.body);
        assert_eq!(denied.header("retry-after"), Some("9"), "the queue's wait");
        assert!(denied.body.contains("\"queue\""), "{}", denied.body);
        assert_eq!(denied.header("x-ratelimit-limit"), Some("1"));
        assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
        let limit = denied.header("ratelimit").unwrap_or_default();
        let policy = denied.header("ratelimit-policy").unwrap_or_default();
        for shown in ["\"per-user\"", "\"per-key\"", "\"queue\""] {
            assert!(limit.contains(shown), "{shown} in RateLimit: {limit}");
            assert!(
                policy.contains(shown),
                "{shown} in RateLimit-Policy: {policy}"
            );
        }
        assert!(!limit.contains("priority"), "admits, not shown: {limit}");
        // The remote charge given back, once; nothing failed.
        assert_eq!(p.remote.refunds.load(Ordering::SeqCst), 1);
        assert_eq!(p.remote.left("u"), 2);
        assert_eq!(stat(&p.layer, "per-user")?.errors, 0);
        // Nothing in the queue was reserved by the peek: its schedule as "u" left it.
        assert_eq!(
            p.queue.peek_at(p.clock.now(), 0).reset_after(),
            Duration::from_secs(10)
        );
        // Waiting exactly Retry-After gets through.
        tokio::time::advance(Duration::from_secs(9)).await;
        let retried = send(&p, "u").await?;
        assert_eq!(retried.status, 200, "{}", retried.body);
        assert_eq!(p.remote.left("u"), 1);
        Ok(())
    })
}

/// Soft and shadow rules, between the denial and the queue, spent for an hour
/// (burst 1, each spent by "u"'s first request), and a soft one between the remote
/// rule and the denial that admits: none changes the 429 — still the queue's 9 s —
/// and the earlier soft rule's charge is given back.
#[test]
fn soft_and_shadow_rules_never_answer_the_429() -> TestResult {
    remote::paused_runtime()?.block_on(async {
        let key = || HeaderKey::new("x-user").map_err(|e| e.to_string());
        let kept: std::sync::Mutex<Vec<Arc<PerUser>>> = std::sync::Mutex::default();
        let keep = |limiter: Arc<PerUser>| -> Result<Arc<PerUser>, String> {
            kept.lock()
                .map_err(|e| e.to_string())?
                .push(Arc::clone(&limiter));
            Ok(limiter)
        };
        let gcra =
            |p: Result<Policy, floodgate::PolicyError>, clock| -> Result<Arc<PerUser>, String> {
                let policy = p.map_err(|e| e.to_string())?;
                keep(Arc::new(KeyedLimiter::gcra_with_clock(policy, clock)))
            };
        let p = proxy_with(
            1,
            |b, clock| {
                let roomy = gcra(Policy::per_second(100), clock)?;
                let roomy = Rule::shared("soft-roomy", roomy, key()?).map_err(|e| e.to_string())?;
                Ok(b.rule(roomy.strategy(Strategy::Soft)))
            },
            |b, clock| {
                let soft = gcra(Policy::per_hour(1), clock)?;
                let shadow = gcra(Policy::per_hour(1), clock)?;
                let soft = Rule::shared("soft-hour", soft, key()?).map_err(|e| e.to_string())?;
                let shadow =
                    Rule::shared("shadow-hour", shadow, key()?).map_err(|e| e.to_string())?;
                Ok(b.rule(soft.strategy(Strategy::Soft))
                    .rule(shadow.strategy(Strategy::Shadow)))
            },
        )?;
        let roomy = Arc::clone(&kept.lock().map_err(|e| e.to_string())?[0]);
        spend(&p).await?;
        let roomy_before = roomy.peek("u", 0).remaining();
        let denied = send(&p, "u").await?;
        assert_eq!(denied.status, 429, "{}", denied.body);
        assert_eq!(denied.header("retry-after"), Some("9"), "the queue's wait");
        assert!(denied.body.contains("\"queue\""), "{}", denied.body);
        assert_eq!(denied.header("x-ratelimit-limit"), Some("1"));
        // The soft rule before the denial admitted "u" and was given back.
        assert_eq!(stat(&p.layer, "soft-roomy")?.allowed, 2);
        assert_eq!(roomy.peek("u", 0).remaining(), roomy_before);
        tokio::time::advance(Duration::from_secs(9)).await;
        let retried = send(&p, "u").await?;
        assert_eq!(retried.status, 200, "{}", retried.body);
        Ok(())
    })
}

/// Polls `who`'s request once, then drops it: whether it was still pending.
async fn poll_once_then_drop(svc: &RateLimitService<Hello>, who: &str) -> bool {
    let mut svc = svc.clone();
    let mut call = Box::pin(svc.call(req(who)));
    let pending = poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx).is_pending())).await;
    drop(call);
    pending
}

/// The same request dropped at each of its await points, one after another on a
/// layer of at most one refund task: during the 429's remote refund (per-key
/// denies), then waiting in the queue (per-key admits; "u2"), and each time the
/// remote charge comes back exactly once by the spawned task, the in-process
/// per-key charge at once, nothing counted in `errors`, and the task's place given
/// back (the next drop is spawned, not refused at the cap).
#[test]
fn dropped_at_each_await_point_gives_everything_back_once() -> TestResult {
    remote::paused_runtime()?.block_on(async {
        let p = proxy(1, |b, _| Ok(b))?;
        spend(&p).await?;
        // 1. Denied by per-key; the future is parked in the remote refund's round trip.
        assert!(
            poll_once_then_drop(&p.svc, "u").await,
            "parked in the refund"
        );
        assert_eq!(p.remote.left("u"), 1, "the refund not yet made");
        let_spawned_tasks_run().await;
        assert_eq!(p.remote.left("u"), 2, "given back by the spawned task");
        assert_eq!(p.remote.refunds.load(Ordering::SeqCst), 1);
        assert_eq!(stat(&p.layer, "per-user")?.errors, 0);
        // 2. "u2" admitted by remote and per-key, then queued behind "v"'s slot: but
        //    the queue is 9 s beyond its bound, so first let 9 s pass.
        tokio::time::advance(Duration::from_secs(9)).await;
        let per_key_before = p.per_key.peek("u2", 0).remaining();
        assert!(
            poll_once_then_drop(&p.svc, "u2").await,
            "waiting in the queue"
        );
        assert_eq!(p.per_key.peek("u2", 0).remaining(), per_key_before);
        assert_eq!(p.remote.left("u2"), 2, "not yet refunded");
        let_spawned_tasks_run().await;
        assert_eq!(p.remote.left("u2"), 3, "given back by the spawned task");
        assert_eq!(p.remote.refunds.load(Ordering::SeqCst), 2);
        // The queue's slot given back too: "u3" now takes it within the bound.
        assert_eq!(
            p.queue.peek_at(p.clock.now(), 0).reset_after(),
            Duration::from_secs(1)
        );
        assert_eq!(stat(&p.layer, "per-user")?.errors, 0);
        Ok(())
    })
}

/// [`Remote`] whose charge's reply is one poll late: the limiter takes the charge on
/// the first poll, the answer comes on the second (a round trip under way).
struct LateReply(Arc<Remote>);

impl floodgate::AsyncLimit<String> for LateReply {
    type Error = remote::Unreachable;

    fn check_n(
        &self,
        key: &String,
        cost: u32,
    ) -> impl Future<Output = Result<floodgate::Decision, Self::Error>> + Send {
        self.0.check_n(key, cost)
    }

    fn peek_n(
        &self,
        key: &String,
        cost: u32,
    ) -> impl Future<Output = Result<floodgate::Decision, Self::Error>> + Send {
        self.0.peek_n(key, cost)
    }

    fn charge_n(
        &self,
        key: &String,
        cost: u32,
    ) -> impl Future<Output = Result<(floodgate::Decision, floodgate::AsyncReceipt), Self::Error>> + Send
    {
        let taken = self.0.charge_n(key, cost);
        async move {
            let taken = taken.await;
            tokio::task::yield_now().await;
            taken
        }
    }

    fn refund(
        &self,
        key: &String,
        receipt: floodgate::AsyncReceipt,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        self.0.refund(key, receipt)
    }
}

/// Dropped while a second remote rule's charge is under way (after "per-user" and
/// "per-key" admitted): "per-user"'s remote charge comes back by the spawned task,
/// "per-key"'s at once; the charge in flight has no receipt and stays taken, as
/// documented ("if the limiter took it, it stays taken"), counted nowhere.
#[test]
fn dropped_during_a_later_remote_charge() -> TestResult {
    remote::paused_runtime()?.block_on(async {
        let late = Remote::new()?;
        let late_rule = {
            let late = Arc::clone(&late);
            move |b: RateLimitLayerBuilder, _| -> Result<RateLimitLayerBuilder, String> {
                let rule = Rule::remote(
                    "late",
                    LateReply(late),
                    HeaderKey::new("x-user").map_err(|e| e.to_string())?,
                )
                .map_err(|e| e.to_string())?;
                Ok(b.rule(rule))
            }
        };
        let p = proxy(1, late_rule)?;
        assert!(
            poll_once_then_drop(&p.svc, "u").await,
            "parked in late's charge"
        );
        assert_eq!(
            p.per_key.peek("u", 0).remaining(),
            1,
            "given back at the drop"
        );
        let_spawned_tasks_run().await;
        assert_eq!(p.remote.left("u"), 3, "given back by the spawned task");
        assert_eq!(p.remote.refunds.load(Ordering::SeqCst), 1);
        assert_eq!(
            late.left("u"),
            2,
            "taken in flight: stays taken (documented)"
        );
        assert_eq!(late.refunds.load(Ordering::SeqCst), 0);
        assert_eq!(stat(&p.layer, "per-user")?.errors, 0);
        assert_eq!(stat(&p.layer, "late")?.errors, 0);
        // The task's place was given back: a second such drop is spawned too.
        assert!(
            poll_once_then_drop(&p.svc, "w").await,
            "parked in late's charge"
        );
        let_spawned_tasks_run().await;
        assert_eq!(p.remote.left("w"), 3);
        assert_eq!(stat(&p.layer, "per-user")?.errors, 0);
        Ok(())
    })
}

/// A zero-cost request over spent rules ("0 reports without charging"): admitted,
/// nothing charged anywhere, nothing refunded, the state shown as it is.
#[test]
fn zero_cost_request_is_admitted_and_charges_nothing() -> TestResult {
    remote::paused_runtime()?.block_on(async {
        let p = proxy(0, |b, _| Ok(b))?;
        let _ = p.remote.limiter.check_n("u", 3);
        assert!(p.per_key.check("u").is_allowed());
        let (spent, _) = p.queue.charge(1);
        assert!(spent.is_allowed());
        let queue_before = p.queue.peek_at(p.clock.now(), 0);
        for _ in 0..3 {
            let a = send(&p, "u").await?;
            assert_eq!(a.status, 200, "{}", a.body);
            assert_eq!(a.header("x-ratelimit-remaining"), Some("0"));
            assert_eq!(a.header("retry-after"), None);
        }
        assert_eq!(p.remote.left("u"), 0);
        assert_eq!(p.remote.refunds.load(Ordering::SeqCst), 0);
        assert_eq!(p.per_key.peek("u", 0).remaining(), 0);
        assert_eq!(p.queue.peek_at(p.clock.now(), 0), queue_before);
        Ok(())
    })
}

/// Cost 2 everywhere: "a" is served (the queue's burst of 2 spent: a cost-2
/// reservation is 19 s beyond the 1 s bound); "b", with 1 of its 2 per-key units
/// spent, is denied by per-key (1 left, 2 s) and the queue (0 left, 19 s): the 429
/// is the queue's, remaining the least (0), the remote charge of 2 given back; and
/// "b", retrying after exactly `Retry-After`, is served.
#[test]
fn cost_two_429_remaining_and_retry() -> TestResult {
    remote::paused_runtime()?.block_on(async {
        let p = proxy(2, |b, _| Ok(b))?;
        let a = send(&p, "a").await?;
        assert_eq!(a.status, 200, "{}", a.body);
        assert!(p.per_key.check("b").is_allowed());
        let denied = send(&p, "b").await?;
        assert_eq!(denied.status, 429, "{}", denied.body);
        assert_eq!(denied.header("retry-after"), Some("19"));
        assert!(denied.body.contains("\"queue\""), "{}", denied.body);
        assert_eq!(denied.header("x-ratelimit-limit"), Some("2"));
        assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
        let limit = denied.header("ratelimit").unwrap_or_default();
        assert!(limit.contains("\"per-key\";r=1"), "{limit}");
        assert!(limit.contains("\"queue\";r=0"), "{limit}");
        assert_eq!(p.remote.left("b"), 3, "the charge of 2 given back");
        tokio::time::advance(Duration::from_secs(19)).await;
        let retried = send(&p, "b").await?;
        assert_eq!(retried.status, 200, "{}", retried.body);
        assert_eq!(p.remote.left("b"), 1);
        Ok(())
    })
}

/// The combined 429 with the remote's refund failing (its backend down): the
/// answer is the same (the queue's 9 s), the failure counted once in "per-user"'s
/// `errors`, and that charge stays taken — and the retry after exactly
/// `Retry-After` still gets through.
#[test]
fn combined_429_with_a_failed_remote_refund() -> TestResult {
    remote::paused_runtime()?.block_on(async {
        let p = proxy(1, |b, _| Ok(b))?;
        spend(&p).await?;
        p.remote.down.store(true, Ordering::SeqCst);
        let denied = send(&p, "u").await?;
        assert_eq!(denied.status, 429, "{}", denied.body);
        assert_eq!(denied.header("retry-after"), Some("9"));
        assert!(denied.body.contains("\"queue\""), "{}", denied.body);
        assert_eq!(stat(&p.layer, "per-user")?.errors, 1);
        assert_eq!(
            p.remote.left("u"),
            1,
            "the failed refund's charge stays taken"
        );
        p.remote.down.store(false, Ordering::SeqCst);
        tokio::time::advance(Duration::from_secs(9)).await;
        let retried = send(&p, "u").await?;
        assert_eq!(retried.status, 200, "{}", retried.body);
        assert_eq!(p.remote.left("u"), 0);
        Ok(())
    })
}

/// What a 429 shows of an earlier remote rule with refunds: its decision as of its
/// check, the charge counted though it was then given back (no round trip is spent
/// to look again; `RateLimitLayer`, "How rules combine"; `HeaderOptions::legacy`).
/// "per-user" (remote, cost 3 of its 3) admits with 0 left, "per-key" (cost 2,
/// burst 3, 2 spent) denies with 1 left: `X-RateLimit-Remaining` is 0, the
/// remote's `r=0`, while the remote, refunded, has all 3 again. Understated, never
/// overstated.
#[test]
fn a_refunded_remote_is_shown_as_of_its_check() -> TestResult {
    remote::paused_runtime()?.block_on(async {
        let (_, per_key) = per_key_rule(3)?;
        let remote = Remote::new()?;

        let layer = RateLimitLayer::builder()
            .rule(per_user("per-user", &remote)?.cost(3))
            .rule(Rule::shared("per-key", Arc::clone(&per_key), HeaderKey::new("x-user")?)?.cost(2))
            .build()?;
        assert!(per_key.check_n("u", 2).is_allowed());
        let mut svc = layer.layer(Hello);
        let denied = ask(&mut svc, "u").await?;
        assert_eq!(denied.status, 429, "{}", denied.body);
        assert!(denied.body.contains("\"per-key\""), "{}", denied.body);
        assert_eq!(remote.left("u"), 3, "refunded");
        assert_eq!(denied.header("x-ratelimit-limit"), Some("3"));
        assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
        let limit = denied.header("ratelimit").unwrap_or_default();
        assert!(limit.contains("\"per-user\";r=0"), "{limit}");
        assert!(limit.contains("\"per-key\";r=1"), "{limit}");
        Ok(())
    })
}

/// Tokio's clock from now, and a queue's policy of 1 per 10 s with `burst`.
fn slow_from_now(burst: u64) -> Result<(TokioClock, Policy), floodgate::PolicyError> {
    let clock = TokioClock {
        start: Instant::now(),
    };
    Ok((
        clock,
        Policy::new(1, Duration::from_secs(10))?.with_burst(burst)?,
    ))
}

/// The queueing rules, each put before a per-client rule in
/// [`queue_then_per_key`].
#[derive(Clone, Copy, Debug)]
enum First {
    /// `QueueRule`: one shaper for every request.
    Queue,
    /// `KeyedQueueRule` keyed on `x-tier`: every tier-0 request on one schedule.
    KeyedQueue,
    /// `PriorityRule` with no place to wait (tier 0, bound 0).
    Priority,
}

const FIRSTS: [First; 3] = [First::Queue, First::KeyedQueue, First::Priority];

/// A layer of `first` ("queue": 1 per 10 s, burst 1, at most 1 s of waiting; the
/// priority rule has no places) then "per-key" (in-process, 1 an hour, keyed on
/// `x-user`) with "u"'s unit already spent, and a look at the queue: whether its
/// slot is free now (a reservation of 1 would go at once), writing nothing.
#[allow(clippy::type_complexity)]
fn queue_then_per_key(
    first: First,
) -> Result<(RateLimitLayer, Box<dyn Fn() -> bool>), Box<dyn std::error::Error>> {
    let (clock, policy) = slow_from_now(1)?;
    let per_key: Arc<PerUser> =
        Arc::new(KeyedLimiter::gcra_with_clock(Policy::per_hour(1)?, clock));
    assert!(per_key.check("u").is_allowed());
    let max_delay = Duration::from_secs(1);
    let builder = RateLimitLayer::builder();
    let (builder, free): (_, Box<dyn Fn() -> bool>) = match first {
        First::Queue | First::Priority => {
            let shaper = Arc::new(Shaper::with_clock(policy, clock));
            let free = {
                let shaper = Arc::clone(&shaper);
                move || shaper.peek_reserve(1, Duration::ZERO).delay() == Ok(Duration::ZERO)
            };
            let builder = match first {
                First::Queue => builder.queue(QueueRule::shared("queue", shaper, max_delay)?),
                _ => builder.priority(PriorityRule::shared("queue", shaper, &[0], from_fn(tier))?),
            };
            (builder, Box::new(free))
        }
        First::KeyedQueue => {
            let keyed: Arc<PerUser> = Arc::new(KeyedLimiter::gcra_with_clock(policy, clock));
            let free = {
                let keyed = Arc::clone(&keyed);
                move || keyed.peek_reserve("0", 1, Duration::ZERO).delay() == Ok(Duration::ZERO)
            };
            let rule =
                KeyedQueueRule::shared("queue", HeaderKey::new("x-tier")?, keyed, max_delay)?;
            (builder.queue_per_key(rule), Box::new(free))
        }
    };
    let layer = builder
        .rule(Rule::shared("per-key", per_key, HeaderKey::new("x-user")?)?)
        .build()?;
    Ok((layer, free))
}

/// A queueing rule (each of the three) before a per-client rule gives back the
/// slot it gave at once to a request the per-client rule then denies, as an
/// in-process rule gives back its charge (see "How rules combine"): "u" (its
/// per-key unit spent) is answered 429 by per-key, the queue's slot is free again,
/// and the 429 shows the queue as it is after the refund (its one unit back).
#[test]
fn an_immediate_queue_slot_is_given_back_when_a_later_rule_denies() -> TestResult {
    for first in FIRSTS {
        remote::paused_runtime()?.block_on(async {
            let (layer, free) = queue_then_per_key(first)?;
            let mut svc = layer.layer(Hello);
            let u = ask(&mut svc, "u").await?;
            assert_eq!(u.status, 429, "{first:?}: {}", u.body);
            assert!(u.body.contains("\"per-key\""), "{first:?}: {}", u.body);
            assert!(free(), "{first:?}: the queue's slot given back");
            let limit = u.header("ratelimit").unwrap_or_default();
            assert!(limit.contains("\"queue\";r=1"), "{first:?}: {limit}");
            Ok::<_, Box<dyn std::error::Error>>(())
        })?;
    }
    Ok(())
}

/// The user's view of the same: with a shared queue before a per-client rule, a
/// client the per-client rule denies no longer spends the queue's slot, so "v",
/// whom nothing else holds back, is served at once (before the fix the queue
/// refused "v" for 9 s, and the priority rule, with no place to wait, at once).
#[test]
fn a_denied_client_leaves_the_queue_slot_to_the_next_client() -> TestResult {
    for first in FIRSTS {
        remote::paused_runtime()?.block_on(async {
            let (layer, _) = queue_then_per_key(first)?;
            let mut svc = layer.layer(Hello);
            assert_eq!(ask(&mut svc, "u").await?.status, 429, "{first:?}");
            let before = Instant::now();
            let v = ask(&mut svc, "v").await?;
            assert_eq!(v.status, 200, "{first:?}: {}", v.body);
            assert_eq!(Instant::now(), before, "{first:?}: served at once");
            let w = ask(&mut svc, "w").await?;
            assert_eq!(w.status, 429, "{first:?}: v took the slot: {}", w.body);
            assert!(w.body.contains("\"queue\""), "{first:?}: {}", w.body);
            Ok::<_, Box<dyn std::error::Error>>(())
        })?;
    }
    Ok(())
}

/// A `QueueRule`'s slot taken at once (now a plain GCRA charge with a receipt)
/// answers with the reservation's figures, as before: `remaining` counts the units
/// that could still be reserved within `max_delay` (at most the burst), not those a
/// plain check would still admit. 1 per 10 s, burst 2, waiting at most 10 s: the
/// first request leaves 2 (a plain check: 1), the second 1 (a plain check: 0).
#[test]
fn an_immediate_queue_slot_shows_the_reservations_figures() -> TestResult {
    remote::paused_runtime()?.block_on(async {
        let (clock, policy) = slow_from_now(2)?;
        let shaper = Arc::new(Shaper::with_clock(policy, clock));
        let max_delay = Duration::from_secs(10);
        let layer = RateLimitLayer::builder()
            .queue(QueueRule::shared("queue", Arc::clone(&shaper), max_delay)?)
            .build()?;
        let mut svc = layer.layer(Hello);
        let start = Instant::now();
        for left in ["2", "1"] {
            let a = ask(&mut svc, "u").await?;
            assert_eq!(a.status, 200, "{}", a.body);
            assert_eq!(Instant::now(), start, "served at once");
            assert_eq!(a.header("x-ratelimit-remaining"), Some(left));
            let schedule = shaper.peek_reserve(0, max_delay).decision();
            assert_eq!(schedule.remaining().to_string(), left);
        }
        Ok(())
    })
}

/// A request dropped while a later queue makes it wait (the client went away)
/// gives back the slot an earlier queue gave it at once, as the layer gives back
/// every in-process charge at the drop: "first" (1 per 10 s, burst 1) admits "u"
/// at once, "second" (its slot already taken) queues it for 10 s, the client goes
/// away, and "first"'s slot is free again.
#[test]
fn dropped_in_a_later_queue_gives_the_immediate_slot_back() -> TestResult {
    remote::paused_runtime()?.block_on(async {
        let (clock, policy) = slow_from_now(1)?;
        let first = Arc::new(Shaper::with_clock(policy, clock));
        let second = Arc::new(Shaper::with_clock(policy, clock));
        assert!(second.reserve(1, Duration::ZERO).is_ok());
        let layer = RateLimitLayer::builder()
            .queue(QueueRule::shared(
                "first",
                Arc::clone(&first),
                Duration::ZERO,
            )?)
            .queue(QueueRule::shared(
                "second",
                Arc::clone(&second),
                Duration::from_secs(20),
            )?)
            .build()?;
        let svc = layer.layer(Hello);
        assert!(poll_once_then_drop(&svc, "u").await, "waiting in second");
        let free = first.peek_reserve(1, Duration::ZERO).delay();
        assert_eq!(free, Ok(Duration::ZERO), "first's slot given back");
        let waited = second.peek_reserve(1, Duration::from_secs(20)).delay();
        assert_eq!(
            waited,
            Ok(Duration::from_secs(10)),
            "second's reservation cancelled"
        );
        Ok(())
    })
}

/// A slot the request waited for stays taken when a later rule denies it (only a
/// slot taken at once is given back): on a `KeyedQueueRule` (1 per 10 s, burst 1,
/// waiting at most 20 s, keyed on `x-tier`), "a" takes the slot at once, "u" waits
/// 10 s for the next and is then denied by per-key; "v", arriving then, waits for
/// the slot after "u"'s (10 s more), not for "u"'s.
#[test]
fn a_waited_slot_stays_taken_when_a_later_rule_denies() -> TestResult {
    remote::paused_runtime()?.block_on(async {
        let (clock, policy) = slow_from_now(1)?;
        let per_key: Arc<PerUser> =
            Arc::new(KeyedLimiter::gcra_with_clock(Policy::per_hour(1)?, clock));
        assert!(per_key.check("u").is_allowed());
        let keyed: Arc<PerUser> = Arc::new(KeyedLimiter::gcra_with_clock(policy, clock));
        let queue = KeyedQueueRule::shared(
            "queue",
            HeaderKey::new("x-tier")?,
            keyed,
            Duration::from_secs(20),
        )?;
        let layer = RateLimitLayer::builder()
            .queue_per_key(queue)
            .rule(Rule::shared("per-key", per_key, HeaderKey::new("x-user")?)?)
            .build()?;
        let mut svc = layer.layer(Hello);
        let start = Instant::now();
        assert_eq!(ask(&mut svc, "a").await?.status, 200);
        let u = ask(&mut svc, "u").await?;
        assert_eq!(u.status, 429, "{}", u.body);
        assert_eq!(start.elapsed(), Duration::from_secs(10), "u waited");
        assert_eq!(ask(&mut svc, "v").await?.status, 200);
        assert_eq!(start.elapsed(), Duration::from_secs(20), "v after u's slot");
        Ok(())
    })
}

/// A cost above a queue's burst, on each queueing rule: refused at `build`
/// (`ConfigError::Cost`), never a request answered "never".
#[test]
fn a_queue_cost_above_its_burst_is_refused_at_build() -> TestResult {
    let clock = TokioClock {
        start: Instant::now(),
    };
    let policy = Policy::new(1, Duration::from_secs(10))?.with_burst(2)?;
    let cost = |rule: &str| floodgate_http::ConfigError::Cost {
        rule: rule.into(),
        cost: 3,
        capacity: 2,
    };
    let queue = QueueRule::new(
        "q",
        Shaper::with_clock(policy, clock),
        Duration::from_secs(1),
    )?;
    let built = RateLimitLayer::builder().queue(queue.cost(3)).build();
    assert_eq!(built.err(), Some(cost("q")));
    let keyed: PerUser = KeyedLimiter::gcra_with_clock(policy, clock);
    let keyed = floodgate_http::KeyedQueueRule::new(
        "kq",
        HeaderKey::new("x-user")?,
        keyed,
        Duration::from_secs(1),
    )?;
    let built = RateLimitLayer::builder()
        .queue_per_key(keyed.cost(3))
        .build();
    assert_eq!(built.err(), Some(cost("kq")));
    let priority = PriorityRule::new("p", Shaper::with_clock(policy, clock), &[1], from_fn(tier))?;
    let built = RateLimitLayer::builder().priority(priority.cost(3)).build();
    assert_eq!(built.err(), Some(cost("p")));
    Ok(())
}

/// Behind the per-key denial (2 s), a later plan rule whose cost (5) is above the
/// request's plan's capacity (free: burst 3; pro's 10 lets it build): the answer
/// is the never-fits status (413 here), no `Retry-After`, the body naming the plan
/// rule ("never" is the longest wait); the remote charge is given back.
#[test]
fn a_later_never_fitting_plan_answers_never() -> TestResult {
    remote::paused_runtime()?.block_on(async {
        let (_, per_key) = per_key_rule(1)?;
        let remote = Remote::new()?;

        let plans = common::even_free_odd_pro(
            &floodgate::ManualClock::new(),
            Policy::per_minute(3)?,
            Policy::per_minute(10)?,
        )?;
        let layer = remote_then_per_key(&remote, &per_key)?
            .rule(Rule::new("plan", plans, from_fn(common::key_of))?.cost(5))
            .never_status(http::StatusCode::PAYLOAD_TOO_LARGE)
            .build()?;
        assert!(per_key.check("u").is_allowed());
        let mut svc = layer.layer(Hello);
        for (key, status, retry) in [(2, 413, None), (1, 429, Some("2"))] {
            let mut request = req("u");
            request
                .headers_mut()
                .insert("x-key", http::HeaderValue::from(key));
            let response = svc.call(request).await?;
            let answer = Answer::read(response).await.map_err(|e| e.to_string())?;
            assert_eq!(answer.status, status, "key {key}: {}", answer.body);
            assert_eq!(answer.header("retry-after"), retry, "key {key}");
            let named = if retry.is_some() { "per-key" } else { "plan" };
            assert!(answer.body.contains(named), "key {key}: {}", answer.body);
        }
        assert_eq!(remote.left("u"), 3, "both charges given back");
        assert_eq!(remote.refunds.load(Ordering::SeqCst), 2);
        Ok(())
    })
}

/// remote → per-key (1 per 2 s) → a roomy queue (100 a second) → "priority" (1 per
/// 10 s, burst 1, one place in tier 0): its limiters and the layer.
#[allow(clippy::type_complexity)]
fn priority_chain(
) -> Result<(Arc<Remote>, Arc<PerUser>, RateLimitLayer), Box<dyn std::error::Error>> {
    let (clock, per_key) = per_key_rule(1)?;
    let remote = Remote::new()?;
    let roomy = Shaper::with_clock(Policy::per_second(100)?.with_burst(10)?, clock);
    let slow = Shaper::with_clock(
        Policy::new(1, Duration::from_secs(10))?.with_burst(1)?,
        clock,
    );
    let layer = remote_then_per_key(&remote, &per_key)?
        .queue(QueueRule::new("queue", roomy, Duration::from_secs(1))?)
        .priority(PriorityRule::new("priority", slow, &[1], from_fn(tier))?)
        .max_refund_tasks(1)
        .build()?;
    Ok((remote, per_key, layer))
}

/// The chain with the priority rule the longest: remote, per-key (denies for 2 s),
/// a roomy queue (would admit at once), then a priority rule of 1 per 10 s whose
/// only place (tier 0, bound 1) "b" holds behind "a": the 429 is the priority
/// rule's (until a plain check after "b"'s booked slot at 10 s fits: 20 s; its
/// name; listed in `RateLimit`, the queue not), the remote charge comes back, and
/// "u", retrying after exactly `Retry-After`, is served, "b" served before it.
#[test]
fn combined_429_from_a_full_priority_tier_behind_a_roomy_queue() -> TestResult {
    remote::paused_runtime()?.block_on(async {
        let (remote, per_key, layer) = priority_chain()?;
        let mut svc = layer.layer(Hello);
        assert_eq!(ask(&mut svc, "a").await?.status, 200);
        let mut b = svc.clone();
        let b = tokio::spawn(async move { b.call(req("b")).await.map(|r| r.status()) });
        remote::let_spawned_tasks_run().await;
        assert!(!b.is_finished(), "b waits in tier 0");
        assert!(per_key.check("u").is_allowed());
        let denied = ask(&mut svc, "u").await?;
        assert_eq!(denied.status, 429, "{}", denied.body);
        assert!(denied.body.contains("\"priority\""), "{}", denied.body);
        assert_eq!(denied.header("retry-after"), Some("20"));
        let limit = denied.header("ratelimit").unwrap_or_default();
        assert!(limit.contains("\"priority\""), "{limit}");
        assert!(!limit.contains("\"queue\""), "{limit}");
        assert_eq!(remote.left("u"), 3, "the remote charge given back");
        tokio::time::advance(Duration::from_secs(20)).await;
        assert_eq!(b.await??, 200);
        let retried = ask(&mut svc, "u").await?;
        assert_eq!(retried.status, 200, "{}", retried.body);
        Ok(())
    })
}

/// Dropped while waiting in the priority rule after the remote, per-key and the
/// queue admitted it ("a" holds the shaper's slot): the remote charge comes back by
/// the spawned task, per-key's at once, the priority place is left, nothing is
/// counted in `errors`, and the next arrival finds the tier empty.
#[test]
fn dropped_while_waiting_in_the_priority_rule() -> TestResult {
    remote::paused_runtime()?.block_on(async {
        let (remote, per_key, layer) = priority_chain()?;
        let mut svc = layer.layer(Hello);
        assert_eq!(ask(&mut svc, "a").await?.status, 200);
        assert!(poll_once_then_drop(&svc, "u").await, "waiting in tier 0");
        assert_eq!(
            per_key.peek("u", 0).remaining(),
            1,
            "given back at the drop"
        );
        let_spawned_tasks_run().await;
        assert_eq!(remote.left("u"), 3, "given back by the spawned task");
        assert_eq!(remote.refunds.load(Ordering::SeqCst), 1);
        assert_eq!(stat(&layer, "per-user")?.errors, 0);
        let b = tokio::spawn(async move { svc.call(req("b")).await.map(|r| r.status()) });
        let_spawned_tasks_run().await;
        assert!(!b.is_finished(), "b takes the place u left");
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(b.await??, 200);
        Ok(())
    })
}
