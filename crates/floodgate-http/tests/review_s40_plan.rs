//! Adversarial review (session 40) of a plan rule's one-resolver-run path through
//! the layer (`charge_with_window`, `refund_and_peek`): many threads through the
//! service under a resolver that answers another plan on every call, a later
//! queue rule's refusal and a request dropped while it waits in that queue (feature
//! `queue`), and user code that panics (a resolver, a later rule) mid-request.
//!
//! * No plan's table admits beyond its burst, and the layer's global rule beyond
//!   its own; each response shows one plan (its quota and window agree).
//! * A charge given back (a later rule's denial, a dropped request, a panic)
//!   returns to the plan that took it, with no further run of the resolver.

mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::{ready, Future};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use common::{tiers, Hello, Tiers};
use floodgate::keyed::plans::PlanId;
use floodgate::{
    AsyncLimit, Decision, Gcra, HotKeyLimiter, HotKeys, KeyedBuilder, ManualClock, Policy,
    RateLimiter, Receipt,
};
use floodgate_http::{Charge, Global, HeaderKey, RateLimitLayer, RateLimitLayerBuilder, Rule};
use http::{Request, StatusCode};
use tower::{Layer, Service};

type Error = Box<dyn std::error::Error + Send + Sync>;
type TestResult = Result<(), Error>;

/// The plans' ids in `tiers`: `[free, pro]`.
fn ids(tiers: &Tiers) -> Result<[PlanId; 2], Error> {
    let plans = tiers.plans();
    Ok([
        plans.id("free").ok_or("no free")?,
        plans.id("pro").ok_or("no pro")?,
    ])
}

/// `free` on even calls, `pro` on odd ones: a plan change racing every request.
fn flip(call: u32, free: PlanId, pro: PlanId) -> PlanId {
    if call % 2 == 0 {
        free
    } else {
        pro
    }
}

/// [`flip`], but the first call panics: the resolver's lookup failed.
fn panics_first(call: u32, free: PlanId, pro: PlanId) -> PlanId {
    assert_ne!(call, 0, "the resolver's lookup failed");
    flip(call, free, pro)
}

/// A layer, its plan limiter, the resolver's call count and the plans' ids.
type PlanLayer = (RateLimitLayer, Arc<Tiers>, Arc<AtomicU32>, [PlanId; 2]);

/// A layer with a plan rule named `plan` (keyed by `x-api-key`) over [`tiers`]
/// under the [`flip`] resolver, then what `then` adds on the same clock.
fn plan_then(
    then: impl FnOnce(RateLimitLayerBuilder, ManualClock) -> Result<RateLimitLayerBuilder, Error>,
) -> Result<PlanLayer, Error> {
    let (clock, calls) = (ManualClock::new(), Arc::new(AtomicU32::new(0)));
    let tiers = Arc::new(tiers(&clock, &calls, flip)?);
    let ids = ids(&tiers)?;
    let builder = RateLimitLayer::builder().rule(Rule::shared(
        "plan",
        Arc::clone(&tiers),
        HeaderKey::new("x-api-key")?,
    )?);
    Ok((then(builder, clock)?.build()?, tiers, calls, ids))
}

/// The member of a structured-field list `field` named `"plan"`.
fn plan_member(field: &str) -> Option<String> {
    field
        .split(", ")
        .find(|m| m.starts_with(r#""plan";"#))
        .map(str::to_owned)
}

/// A parameter `name` of a structured-field member, as a number.
fn param(member: &str, name: &str) -> Option<u64> {
    member
        .split(';')
        .find_map(|p| p.strip_prefix(name)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

/// One response's status and the plan rule's quota `q`, window `w` and remaining
/// `r`, if it shows the plan rule.
#[derive(Debug)]
struct Seen {
    status: StatusCode,
    plan: Option<(u64, u64, u64)>,
}

async fn send<S>(svc: &mut S, key: &str) -> Result<Seen, Error>
where
    S: Service<Request<()>, Response = http::Response<floodgate_http::RateLimitBody<String>>>,
    S::Error: std::error::Error + Send + Sync + 'static,
{
    let resp = svc
        .call(Request::get("/").header("x-api-key", key).body(())?)
        .await?;
    let header = |name: &str| -> Option<String> {
        Some(resp.headers().get(name)?.to_str().ok()?.to_owned())
    };
    let plan = match (
        header("ratelimit-policy").and_then(|f| plan_member(&f)),
        header("ratelimit").and_then(|f| plan_member(&f)),
    ) {
        (Some(policy), Some(limit)) => Some((
            param(&policy, "q").ok_or("no q")?,
            param(&policy, "w").ok_or("no w")?,
            param(&limit, "r").ok_or("no r")?,
        )),
        _ => None,
    };
    Ok(Seen {
        status: resp.status(),
        plan,
    })
}

/// The plan a response's quota and window describe: `free` (q=10, w=60) or `pro`
/// (q=20, w=12), and never a mix of the two.
fn plan_of(q: u64, w: u64) -> Result<usize, Error> {
    match (q, w) {
        (10, 60) => Ok(0),
        (20, 12) => Ok(1),
        _ => Err(format!("q={q} w={w} describes no one plan").into()),
    }
}

/// 400 requests for two keys on eight threads through one service: a plan rule
/// under a resolver that flips plans on every call, then a global rule of 25 that
/// denies most of them (their plan charges given back).
#[test]
fn many_threads_through_the_service_never_admit_beyond_any_plan() -> TestResult {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(8)
        .build()?;
    let (layer, tiers, calls, ids) = plan_then(|builder, clock| {
        let global = RateLimiter::gcra_with_clock(Policy::per_minute(25)?, clock);
        Ok(builder.rule(Rule::new("global", global, Global)?))
    })?;
    let svc = layer.layer(Hello);
    let seen: Vec<(usize, Seen)> = runtime.block_on(async {
        let tasks: Vec<_> = (0..400usize)
            .map(|n| {
                let mut svc = svc.clone();
                tokio::spawn(async move {
                    let key = if n % 2 == 0 { "a" } else { "b" };
                    send(&mut svc, key).await.map(|s| (n % 2, s))
                })
            })
            .collect();
        let mut seen = Vec::new();
        for task in tasks {
            seen.push(task.await??);
        }
        Ok::<_, Error>(seen)
    })?;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        400,
        "one resolver run a request"
    );
    // Admitted requests, per key and plan.
    let mut admitted: HashMap<(usize, usize), u64> = HashMap::new();
    let mut total = 0;
    for (key, s) in &seen {
        let (q, w, r) = s.plan.ok_or_else(|| format!("no plan member: {s:?}"))?;
        let plan = plan_of(q, w)?;
        assert!(r <= q, "{s:?}");
        if s.status == StatusCode::OK {
            *admitted.entry((*key, plan)).or_default() += 1;
            total += 1;
        } else {
            assert_eq!(s.status, StatusCode::TOO_MANY_REQUESTS, "{s:?}");
        }
    }
    assert!(total <= 25, "the global rule admitted {total}");
    for key in 0..2 {
        let name = if key == 0 { "a" } else { "b" };
        for (plan, burst) in [(0, 10u64), (1, 20)] {
            let n = admitted.get(&(key, plan)).copied().unwrap_or(0);
            assert!(n <= burst, "key {name} plan {plan}: {n} admitted");
            // The table holds every admitted unit: none came back twice.
            let left = tiers
                .peek_in(ids[plan], &name.to_owned(), 0)
                .decision
                .remaining();
            assert!(
                left + n <= burst,
                "key {name} plan {plan}: {n} admitted, {left} left"
            );
        }
    }
    Ok(())
}

/// A later rule that panics as it charges (user code: a buggy limiter); it checks
/// and peeks as `0` does.
struct Panics(RateLimiter<Gcra, ManualClock>);

impl AsyncLimit<()> for Panics {
    type Error = Infallible;

    fn check_n(&self, _: &(), cost: u32) -> impl Future<Output = Result<Decision, Infallible>> {
        ready(Ok(self.0.check_n(cost)))
    }

    fn peek_n(&self, _: &(), cost: u32) -> impl Future<Output = Result<Decision, Infallible>> {
        ready(Ok(self.0.peek(cost)))
    }
}

impl Charge<()> for Panics {
    fn charge(&self, _: &(), _: u32) -> (Decision, Receipt) {
        panic!("a later rule's limiter failed");
    }

    fn refund(&self, _: &(), _: Receipt) -> bool {
        false
    }

    fn peek(&self, _: &(), cost: u32) -> Decision {
        self.0.peek(cost)
    }
}

/// A panic in a later rule unwinds through the request: the plan rule's charge
/// comes back to the plan that took it, and the refund runs no resolver (one that
/// panicked there would abort the process, a panic during a panic).
#[tokio::test]
async fn a_later_rule_that_panics_leaves_the_plan_charge_given_back() -> TestResult {
    let (layer, tiers, calls, [free, _]) = plan_then(|builder, clock| {
        let inner = RateLimiter::gcra_with_clock(Policy::per_minute(1)?, clock);
        Ok(builder.rule(Rule::new("panics", Panics(inner), Global)?))
    })?;
    let mut svc = layer.layer(Hello);
    let outcome = tokio::spawn(async move { send(&mut svc, "k").await.map(|_| ()) }).await;
    assert!(outcome.is_err_and(|e| e.is_panic()));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        tiers.peek_in(free, &"k".to_owned(), 0).decision.remaining(),
        10
    );
    Ok(())
}

/// A resolver that panics (its lookup failed) after an earlier rule charged: the
/// earlier charge comes back as the request unwinds, so the next request fits.
#[tokio::test]
async fn a_resolver_that_panics_leaves_the_earlier_charges_given_back() -> TestResult {
    let (clock, calls) = (ManualClock::new(), Arc::new(AtomicU32::new(0)));
    let tiers = tiers(&clock, &calls, panics_first)?;
    let global = RateLimiter::gcra_with_clock(Policy::per_minute(1)?, clock);
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("global", global, Global)?)
        .rule(Rule::new("plan", tiers, HeaderKey::new("x-api-key")?)?)
        .build()?;
    let svc = layer.layer(Hello);
    let mut boom = svc.clone();
    let outcome = tokio::spawn(async move { send(&mut boom, "k").await.map(|_| ()) }).await;
    assert!(outcome.is_err_and(|e| e.is_panic()));
    let mut next = svc.clone();
    let seen = send(&mut next, "k").await?;
    assert_eq!(
        seen.status,
        StatusCode::OK,
        "the global rule's one unit: {seen:?}"
    );
    Ok(())
}

/// A hot-key rule (its key promoted and demoted by another thread all along) and
/// then a global rule that denies every request: each request's hot charge is
/// given back and the hot rule shown as `peek(0)` reports it. A peek racing a
/// demotion once showed the closed central word there: `t` at the end of time
/// (18 446 744 069 s) beside `r=0`.
#[test]
fn a_hot_rule_shown_after_a_refund_never_shows_the_closed_word() -> TestResult {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()?;
    let clock = ManualClock::new();
    let hot = Arc::new(HotKeyLimiter::<String, ManualClock>::new(
        Policy::per_second(1)?.with_burst(10)?,
        KeyedBuilder::default().clock(clock.clone()),
        HotKeys::default().lease_size(2).lease_shards(8).manual(),
    )?);
    let spent = RateLimiter::gcra_with_clock(Policy::per_minute(1)?, clock);
    assert!(spent.check().is_allowed());
    let layer = RateLimitLayer::builder()
        .rule(Rule::shared(
            "hot",
            Arc::clone(&hot),
            HeaderKey::new("x-api-key")?,
        )?)
        .rule(Rule::new("global", spent, Global)?)
        .build()?;
    let svc = layer.layer(Hello);
    let stop = Arc::new(AtomicBool::new(false));
    let stepper = {
        let (hot, stop) = (Arc::clone(&hot), Arc::clone(&stop));
        std::thread::spawn(move || {
            let key = "k".to_owned();
            while !stop.load(Ordering::Relaxed) {
                assert!(hot.promote(&key));
                std::thread::yield_now();
                assert!(hot.demote(&key));
            }
        })
    };
    let shown: Result<Vec<String>, Error> = runtime.block_on(async {
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let mut svc = svc.clone();
                tokio::spawn(async move {
                    let mut shown = Vec::new();
                    for _ in 0..3_000 {
                        let resp = svc
                            .call(Request::get("/").header("x-api-key", "k").body(())?)
                            .await?;
                        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
                        let field = resp
                            .headers()
                            .get("ratelimit")
                            .ok_or("no RateLimit")?
                            .to_str()?;
                        let member = field
                            .split(", ")
                            .find(|m| m.starts_with(r#""hot";"#))
                            .ok_or("no hot member")?;
                        shown.push(member.to_owned());
                    }
                    Ok::<_, Error>(shown)
                })
            })
            .collect();
        let mut all = Vec::new();
        for task in tasks {
            all.extend(task.await??);
        }
        Ok(all)
    });
    stop.store(true, Ordering::Relaxed);
    stepper
        .join()
        .map_err(|_| "the promoting thread panicked")?;
    for member in shown? {
        // The clock stands still: burst 10 at 1/s resets within 10 s.
        let t = param(&member, "t").ok_or("no t")?;
        assert!(t <= 11, "{member}");
    }
    Ok(())
}

#[cfg(feature = "queue")]
mod queued {
    use super::*;
    use floodgate::Shaper;
    use floodgate_http::{from_fn, PriorityRule, QueueRule};
    use std::time::Duration;

    /// A plan rule under the flipping resolver, then a queue of one slot a minute
    /// that waits at most `max_delay`.
    fn layer(max_delay: Duration) -> Result<PlanLayer, Error> {
        plan_then(|builder, clock| {
            let shaper = Shaper::with_clock(Policy::per_minute(1)?, clock);
            Ok(builder.queue(QueueRule::new("queue", shaper, max_delay)?))
        })
    }

    /// A later priority rule whose queues are full (no waiters: the slot is
    /// taken) refuses the request: the plan's charge goes back to the plan that
    /// took it, as for any later rule's denial.
    #[tokio::test]
    async fn a_priority_rules_refusal_gives_the_plan_charge_back() -> TestResult {
        let (layer, tiers, calls, [free, pro]) = plan_then(|builder, clock| {
            let shaper = Shaper::with_clock(Policy::per_minute(1)?, clock);
            let rule = PriorityRule::new("smooth", shaper, &[0], from_fn(|_: &_| Ok(0)))?;
            Ok(builder.priority(rule))
        })?;
        let mut svc = layer.layer(Hello);
        let first = send(&mut svc, "k").await?;
        assert_eq!(
            (first.status, first.plan),
            (StatusCode::OK, Some((10, 60, 9)))
        );
        for n in 1..4 {
            let refused = send(&mut svc, "k").await?;
            assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "request {n}");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        let k = "k".to_owned();
        assert_eq!(tiers.peek_in(free, &k, 0).decision.remaining(), 9);
        assert_eq!(tiers.peek_in(pro, &k, 0).decision.remaining(), 20);
        Ok(())
    }

    /// The queue refuses (its next slot is past the bound): the plan's charge goes
    /// back to the plan that took it, and the response shows that plan whole.
    #[tokio::test]
    async fn a_queue_refusal_gives_the_charge_back_to_the_plan_that_took_it() -> TestResult {
        let (layer, tiers, calls, [free, pro]) = layer(Duration::from_secs(1))?;
        let mut svc = layer.layer(Hello);
        let first = send(&mut svc, "k").await?;
        assert_eq!(
            (first.status, first.plan),
            (StatusCode::OK, Some((10, 60, 9)))
        );
        let second = send(&mut svc, "k").await?;
        assert_eq!(
            (second.status, second.plan),
            (StatusCode::TOO_MANY_REQUESTS, Some((20, 12, 20)))
        );
        let third = send(&mut svc, "k").await?;
        assert_eq!(
            (third.status, third.plan),
            (StatusCode::TOO_MANY_REQUESTS, Some((10, 60, 9)))
        );
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        let k = "k".to_owned();
        assert_eq!(tiers.peek_in(free, &k, 0).decision.remaining(), 9);
        assert_eq!(tiers.peek_in(pro, &k, 0).decision.remaining(), 20);
        Ok(())
    }

    /// A request dropped while it waits for its slot (the client went away): the
    /// plan charge comes back to its plan, with no further run of the resolver.
    #[tokio::test(start_paused = true)]
    async fn a_request_dropped_in_the_queue_gives_the_plan_charge_back() -> TestResult {
        let (layer, tiers, calls, [free, pro]) = layer(Duration::from_secs(3600))?;
        let mut svc = layer.layer(Hello);
        assert_eq!(send(&mut svc, "k").await?.status, StatusCode::OK);
        // Charged in pro, then waits a minute for the queue's next slot.
        let waiting = send(&mut svc, "k");
        assert!(tokio::time::timeout(Duration::from_millis(10), waiting)
            .await
            .is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        let k = "k".to_owned();
        assert_eq!(tiers.peek_in(free, &k, 0).decision.remaining(), 9);
        assert_eq!(tiers.peek_in(pro, &k, 0).decision.remaining(), 20);
        Ok(())
    }
}
