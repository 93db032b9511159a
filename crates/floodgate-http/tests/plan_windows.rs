//! A plan rule advertises the window `w` of the request's key's plan, follows a
//! plan's policy change, and yields to a window configured on the rule.

use std::sync::Arc;

use axum::routing::get;
use axum::Router;
use floodgate::keyed::plans::{PlanId, PlanLimiter, Plans};
use floodgate::{KeyedBuilder, ManualClock, Policy};
use floodgate_http::{HeaderKey, RateLimitLayer, Rule};
use http::Request;
use std::time::Duration;
use tower::{Layer, Service};

type Error = Box<dyn std::error::Error>;
type TestResult = Result<(), Error>;

/// A plan limiter whose resolver picks a key's plan by its prefix.
type Tiers = PlanLimiter<String, Box<dyn Fn(&String) -> PlanId + Send + Sync>, ManualClock>;

/// `free` 10 a minute (burst 10: window 60 s), `pro` 100 a minute with burst 20
/// (window 12 s); keys starting `pro_` are pro.
fn plans(clock: &ManualClock) -> Result<Arc<Tiers>, Error> {
    let mut plans = Plans::new();
    let free = plans.insert("free", Policy::per_minute(10)?);
    let pro = plans.insert("pro", Policy::per_minute(100)?.with_burst(20)?);
    let resolver: Box<dyn Fn(&String) -> PlanId + Send + Sync> =
        Box::new(move |key: &String| if key.starts_with("pro_") { pro } else { free });
    Ok(Arc::new(PlanLimiter::new(
        &plans,
        resolver,
        KeyedBuilder::default().clock(clock.clone()),
    )?))
}

/// The `RateLimit-Policy` of one request with `x-api-key: key` through `layer`.
async fn policy(layer: &RateLimitLayer, key: &str) -> Result<String, Error> {
    let app = Router::new().route("/", get(|| async { "ok" }));
    let resp = layer
        .layer(app)
        .call(
            Request::get("/")
                .header("x-api-key", key)
                .body(String::new())?,
        )
        .await?;
    Ok(resp.headers()["ratelimit-policy"].to_str()?.to_owned())
}

#[tokio::test]
async fn each_request_advertises_its_keys_plan_window() -> TestResult {
    let clock = ManualClock::new();
    let per_key = plans(&clock)?;
    let layer = RateLimitLayer::builder()
        .rule(Rule::shared(
            "plan",
            Arc::clone(&per_key),
            HeaderKey::new("x-api-key")?,
        )?)
        .build()?;
    assert_eq!(policy(&layer, "free_1").await?, r#""plan";q=10;w=60"#);
    assert_eq!(policy(&layer, "pro_1").await?, r#""plan";q=20;w=12"#);

    // A plan's policy changed at runtime: its next request advertises the new one.
    per_key.set_policy("pro", Policy::per_minute(100)?.with_burst(50)?)?;
    assert_eq!(policy(&layer, "pro_1").await?, r#""plan";q=50;w=30"#);
    assert_eq!(policy(&layer, "free_1").await?, r#""plan";q=10;w=60"#);
    Ok(())
}

#[tokio::test]
async fn a_window_configured_on_the_rule_stands_for_every_key() -> TestResult {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::shared("plan", plans(&clock)?, HeaderKey::new("x-api-key")?)?
                .window(Duration::from_secs(3600)),
        )
        .build()?;
    assert_eq!(policy(&layer, "free_1").await?, r#""plan";q=10;w=3600"#);
    assert_eq!(policy(&layer, "pro_1").await?, r#""plan";q=20;w=3600"#);
    Ok(())
}

/// The plans of [`plans`] (`free` 10 a minute, `pro` 100 a minute with burst 20) on
/// windows: a window counts the plan's limit over its period, not a burst.
fn window_plans<L>(
    clock: &ManualClock,
    build: impl FnOnce(
        &Plans,
        Box<dyn Fn(&String) -> PlanId + Send + Sync>,
        KeyedBuilder<(), ManualClock>,
    ) -> Result<L, floodgate::keyed::plans::PlansError>,
) -> Result<Arc<L>, Error> {
    let mut plans = Plans::new();
    let free = plans.insert("free", Policy::per_minute(10)?);
    let pro = plans.insert("pro", Policy::per_minute(100)?.with_burst(20)?);
    let resolver: Box<dyn Fn(&String) -> PlanId + Send + Sync> =
        Box::new(move |key: &String| if key.starts_with("pro_") { pro } else { free });
    Ok(Arc::new(build(
        &plans,
        resolver,
        KeyedBuilder::default().clock(clock.clone()),
    )?))
}

#[tokio::test]
async fn a_window_plan_advertises_its_period_not_a_gcra_window() -> TestResult {
    let clock = ManualClock::new();
    let fixed = window_plans(&clock, PlanLimiter::fixed_window)?;
    let sliding = window_plans(&clock, PlanLimiter::sliding_window)?;
    for layer in [
        RateLimitLayer::builder()
            .rule(Rule::shared("plan", fixed, HeaderKey::new("x-api-key")?)?)
            .build()?,
        RateLimitLayer::builder()
            .rule(Rule::shared("plan", sliding, HeaderKey::new("x-api-key")?)?)
            .build()?,
    ] {
        // 100 units a minute: the window is the minute (B·T would say 12 s, a rate
        // five times what the limiter admits).
        assert_eq!(policy(&layer, "pro_1").await?, r#""plan";q=100;w=60"#);
        assert_eq!(policy(&layer, "free_1").await?, r#""plan";q=10;w=60"#);
    }
    Ok(())
}
