//! A plan rule runs its resolver (user code: often a cache or a database lookup)
//! once per request, and every figure the headers show for it (`RateLimit-Policy`'s
//! `q` and `w`, `RateLimit`'s `r`, the `X-RateLimit-*` trio) describes the plan that
//! charged, even when the resolver answers another plan on its next call, and after
//! a later rule's denial gave the charge back.

mod common;

use std::convert::Infallible;
use std::future::{ready, Future};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{tiers, Hello, Tiers};
use floodgate::keyed::plans::PlanId;
use floodgate::{AsyncLimit, Decision, Gcra, ManualClock, Policy, RateLimiter, Receipt};
use floodgate_http::{Charge, Global, HeaderKey, RateLimitLayer, Rule};
use http::{Request, StatusCode};
use tower::{Layer, Service};

type Error = Box<dyn std::error::Error>;
type TestResult = Result<(), Error>;

/// Always `free`.
fn always_free(_: u32, free: PlanId, _: PlanId) -> PlanId {
    free
}

/// `free` on even calls, `pro` on odd ones: a plan change racing every request.
fn flip(call: u32, free: PlanId, pro: PlanId) -> PlanId {
    if call % 2 == 0 {
        free
    } else {
        pro
    }
}

/// The layer's answer to one request with `x-api-key: key`: its status and the
/// headers the plan rule is shown in.
struct Shown {
    status: StatusCode,
    /// The `"plan"` member of `RateLimit-Policy`, such as `"plan";q=10;w=60`.
    policy: String,
    /// The `"plan"` member of `RateLimit`, such as `"plan";r=9;t=6`.
    limit: String,
    /// `X-RateLimit-Limit` and `X-RateLimit-Remaining`.
    legacy: (String, String),
}

/// The member of a structured-field list `field` named `"plan"`.
fn plan_member(field: &str) -> Result<String, Error> {
    field
        .split(", ")
        .find(|m| m.starts_with(r#""plan";"#))
        .map(str::to_owned)
        .ok_or_else(|| format!("no plan member in {field:?}").into())
}

async fn send(layer: &RateLimitLayer, key: &str) -> Result<Shown, Error> {
    let resp = layer
        .layer(Hello)
        .call(Request::get("/").header("x-api-key", key).body(())?)
        .await?;
    let header = |name: &str| -> Result<String, Error> {
        let value = resp.headers().get(name).ok_or(format!("no {name}"))?;
        Ok(value.to_str()?.to_owned())
    };
    Ok(Shown {
        status: resp.status(),
        policy: plan_member(&header("ratelimit-policy")?)?,
        limit: plan_member(&header("ratelimit")?)?,
        legacy: (
            header("x-ratelimit-limit")?,
            header("x-ratelimit-remaining")?,
        ),
    })
}

/// The `r` of a `RateLimit` member.
fn remaining(member: &str) -> Option<&str> {
    member.split(';').find_map(|p| p.strip_prefix("r="))
}

/// How the layer around the plan rule is built.
struct Setup {
    /// The resolver's answer on each call ([`always_free`], [`flip`]).
    pick: fn(u32, PlanId, PlanId) -> PlanId,
    /// After the plan rule, a global rule of one request a minute: from the second
    /// request on it denies, and the plan rule's charge is given back.
    then_global: bool,
    /// A window configured on the plan rule ([`Rule::window`]).
    window: Option<Duration>,
}

/// A layer with a plan rule named `plan` over [`tiers`] (and what `setup` adds),
/// keyed by `x-api-key`, and its resolver's call count.
fn layer(setup: Setup) -> Result<(RateLimitLayer, Arc<AtomicU32>), Error> {
    let (clock, calls) = (ManualClock::new(), Arc::new(AtomicU32::new(0)));
    let mut rule = Rule::new(
        "plan",
        tiers(&clock, &calls, setup.pick)?,
        HeaderKey::new("x-api-key")?,
    )?;
    if let Some(window) = setup.window {
        rule = rule.window(window);
    }
    let mut builder = RateLimitLayer::builder().rule(rule);
    if setup.then_global {
        let global = RateLimiter::gcra_with_clock(Policy::per_minute(1)?, clock);
        builder = builder.rule(Rule::new("global", global, Global)?);
    }
    Ok((builder.build()?, calls))
}

#[tokio::test]
async fn a_plan_rule_runs_the_resolver_once_per_request() -> TestResult {
    let (layer, calls) = layer(Setup {
        pick: always_free,
        then_global: false,
        window: None,
    })?;
    // Ten admitted (free's burst), then two denied by the plan rule itself.
    for n in 1..=12u32 {
        let shown = send(&layer, "k").await?;
        let expected = if n <= 10 {
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        assert_eq!(shown.status, expected, "request {n}");
        assert_eq!(shown.policy, r#""plan";q=10;w=60"#);
        assert_eq!(
            calls.load(Ordering::SeqCst),
            n,
            "resolver calls after request {n}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_refunded_plan_charge_runs_the_resolver_once_too() -> TestResult {
    let (layer, calls) = layer(Setup {
        pick: always_free,
        then_global: true,
        window: None,
    })?;
    let first = send(&layer, "k").await?;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(remaining(&first.limit), Some("9"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    for n in 2..=4u32 {
        let shown = send(&layer, "k").await?;
        assert_eq!(shown.status, StatusCode::TOO_MANY_REQUESTS, "request {n}");
        // Charged, then given back: the plan rule shows 9 left, as before.
        assert_eq!(shown.policy, r#""plan";q=10;w=60"#);
        assert_eq!(remaining(&shown.limit), Some("9"), "request {n}");
        assert_eq!(
            calls.load(Ordering::SeqCst),
            n,
            "resolver calls after request {n}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_flipping_resolver_shows_the_charged_plan_in_every_header() -> TestResult {
    let (layer, calls) = layer(Setup {
        pick: flip,
        then_global: false,
        window: None,
    })?;
    // Calls 0, 2, 4 answer free (its table counts down from 10), calls 1, 3, 5
    // pro (from 20): each request is charged under one plan and shows only it.
    let expected = [
        (r#""plan";q=10;w=60"#, "9", "10"),
        (r#""plan";q=20;w=12"#, "19", "20"),
        (r#""plan";q=10;w=60"#, "8", "10"),
        (r#""plan";q=20;w=12"#, "18", "20"),
    ];
    for (n, (policy, r, limit)) in expected.into_iter().enumerate() {
        let shown = send(&layer, "k").await?;
        assert_eq!(shown.status, StatusCode::OK, "request {n}");
        assert_eq!(shown.policy, policy, "request {n}");
        assert_eq!(remaining(&shown.limit), Some(r), "request {n}");
        assert_eq!(
            shown.legacy,
            (limit.to_owned(), r.to_owned()),
            "request {n}"
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    Ok(())
}

#[tokio::test]
async fn a_refund_under_a_flipping_resolver_goes_back_to_the_plan_that_charged() -> TestResult {
    let (layer, calls) = layer(Setup {
        pick: flip,
        then_global: true,
        window: None,
    })?;
    // Call 0: free charges, the global rule admits.
    let first = send(&layer, "k").await?;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.policy, r#""plan";q=10;w=60"#);
    assert_eq!(remaining(&first.limit), Some("9"));
    // Call 1: pro charges, the global rule denies, pro gets its unit back: the
    // plan rule shows pro whole again, with pro's window, and nothing else.
    let second = send(&layer, "k").await?;
    assert_eq!(second.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(second.policy, r#""plan";q=20;w=12"#);
    assert_eq!(remaining(&second.limit), Some("20"));
    // Call 2: free again; its table still holds only the first request's unit.
    let third = send(&layer, "k").await?;
    assert_eq!(third.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(third.policy, r#""plan";q=10;w=60"#);
    assert_eq!(remaining(&third.limit), Some("9"));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    Ok(())
}

/// A global rule that, as it charges, first changes plan `free`'s policy on
/// `tiers` (an operator's change landing between a plan charge and its refund),
/// then decides on `inner`.
struct ChangesFree {
    tiers: Arc<Tiers>,
    policy: Policy,
    inner: RateLimiter<Gcra, ManualClock>,
}

impl AsyncLimit<()> for ChangesFree {
    type Error = Infallible;

    fn check_n(&self, _: &(), cost: u32) -> impl Future<Output = Result<Decision, Infallible>> {
        ready(Ok(self.inner.check_n(cost)))
    }

    fn peek_n(&self, _: &(), cost: u32) -> impl Future<Output = Result<Decision, Infallible>> {
        ready(Ok(self.inner.peek(cost)))
    }
}

impl Charge<()> for ChangesFree {
    fn charge(&self, _: &(), cost: u32) -> (Decision, Receipt) {
        self.tiers
            .set_policy("free", self.policy)
            .expect("plan free exists");
        self.inner.charge(cost)
    }

    fn refund(&self, _: &(), receipt: Receipt) -> bool {
        self.inner.refund(receipt)
    }

    fn peek(&self, _: &(), cost: u32) -> Decision {
        self.inner.peek(cost)
    }
}

#[tokio::test]
async fn after_a_refund_the_window_is_the_charged_plans_policy_as_it_then_is() -> TestResult {
    let (clock, calls) = (ManualClock::new(), Arc::new(AtomicU32::new(0)));
    let tiers = Arc::new(tiers(&clock, &calls, always_free)?);
    // Already spent: it denies every request, after changing free to burst 20
    // (20 × 6 s: `w` = 120).
    let inner = RateLimiter::gcra_with_clock(Policy::per_minute(1)?, clock.clone());
    assert!(inner.check().is_allowed());
    let changes_free = ChangesFree {
        tiers: Arc::clone(&tiers),
        policy: Policy::per_minute(10)?.with_burst(20)?,
        inner,
    };
    let layer = RateLimitLayer::builder()
        .rule(Rule::shared(
            "plan",
            Arc::clone(&tiers),
            HeaderKey::new("x-api-key")?,
        )?)
        .rule(Rule::new("changes-free", changes_free, Global)?)
        .build()?;
    // Charged under free's burst 10 (`w` = 60), given back after the change: the
    // plan rule shows free as it now is, its quota and its window alike.
    let shown = send(&layer, "k").await?;
    assert_eq!(shown.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(shown.policy, r#""plan";q=20;w=120"#);
    assert_eq!(remaining(&shown.limit), Some("20"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    Ok(())
}

#[tokio::test]
async fn a_window_configured_on_the_rule_stands_after_a_refund() -> TestResult {
    let (layer, calls) = layer(Setup {
        pick: flip,
        then_global: true,
        window: Some(Duration::from_secs(3600)),
    })?;
    assert_eq!(send(&layer, "k").await?.policy, r#""plan";q=10;w=3600"#);
    // Denied by the global rule, refunded in pro: pro's quota, the rule's window.
    let refunded = send(&layer, "k").await?;
    assert_eq!(refunded.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refunded.policy, r#""plan";q=20;w=3600"#);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    Ok(())
}
