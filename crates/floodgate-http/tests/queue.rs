//! Queueing (feature `queue`): requests wait for their slot on Tokio's paused clock,
//! which also drives the shaper, so every wait is exact and no test sleeps for real.

use std::sync::Arc;
use std::time::Duration;

use floodgate::{Policy, Shaper};
use floodgate_http::{ConfigError, HeaderKey, KeyedQueueRule, QueueRule, RateLimitLayer};
use http::{Request, Response};
use tokio::time::Instant;
use tower::{Layer, Service};
mod common;
use common::{Hello, TestResult, TokioClock};

/// Sends every request at once (each on its own task) and returns, in order, each
/// response's status, when it came (since `start`) and its `Retry-After`.
async fn all_at_once<S, B>(
    svc: &S,
    requests: impl IntoIterator<Item = Request<()>>,
    start: Instant,
) -> Result<Vec<(u16, Duration, Option<http::HeaderValue>)>, Box<dyn std::error::Error>>
where
    S: Service<Request<()>, Response = Response<B>> + Clone + Send + 'static,
    B: Send + 'static,
    S::Error: std::error::Error + Send + Sync + 'static,
    S::Future: Send + 'static,
{
    let mut tasks = Vec::new();
    for request in requests {
        let call = svc.clone().call(request);
        tasks.push(tokio::spawn(async move {
            let resp = call.await;
            (resp, start.elapsed())
        }));
    }
    let mut done = Vec::new();
    for t in tasks {
        let (resp, at) = t.await?;
        let resp = resp?;
        let retry = resp.headers().get("retry-after").cloned();
        done.push((resp.status().as_u16(), at, retry));
    }
    Ok(done)
}

/// Sends one request, served at once, then a second whose slot is at 100 ms and
/// gives it up at 10 ms (the client went away), never served.
async fn serve_one_abandon_one<S, B>(svc: &mut S, request: impl Fn() -> Request<()>) -> TestResult
where
    S: Service<Request<()>, Response = Response<B>>,
    S::Error: std::error::Error + Send + Sync + 'static,
{
    assert_eq!(svc.call(request()).await?.status(), 200);
    let waiting = svc.call(request());
    assert!(tokio::time::timeout(Duration::from_millis(10), waiting)
        .await
        .is_err());
    Ok(())
}

fn shaper(start: Instant) -> Result<Arc<Shaper<TokioClock>>, floodgate::PolicyError> {
    // 10 per second, one at a time: slots 100 ms apart.
    let policy = Policy::per_second(10)?.with_burst(1)?;
    Ok(Arc::new(Shaper::with_clock(policy, TokioClock { start })))
}

#[tokio::test(start_paused = true)]
async fn requests_wait_for_their_slot_up_to_the_bound() -> TestResult {
    let start = Instant::now();
    let layer = RateLimitLayer::builder()
        .queue(QueueRule::shared(
            "smooth",
            shaper(start)?,
            Duration::from_millis(250),
        )?)
        .build()?;
    let done = all_at_once(&layer.layer(Hello), (0..4).map(|_| Request::new(())), start).await?;
    // Slots at 0, 100 and 200 ms; the fourth (300 ms) is past the 250 ms bound.
    assert_eq!(done[0].0, 200);
    assert_eq!(done[0].1, Duration::ZERO);
    assert_eq!(done[1].0, 200);
    assert!(done[1].1 >= Duration::from_millis(100) && done[1].1 < Duration::from_millis(110));
    assert_eq!(done[2].0, 200);
    assert!(done[2].1 >= Duration::from_millis(200) && done[2].1 < Duration::from_millis(210));
    assert_eq!(done[3].0, 429);
    assert_eq!(done[3].1, Duration::ZERO);
    // The same reservation fits 50 ms later: Retry-After rounds up to 1.
    assert_eq!(
        done[3].2.as_ref().map(|v| v.to_str().unwrap_or("")),
        Some("1")
    );
    let s = layer.rule_stats("smooth").ok_or("rule")?;
    assert_eq!((s.allowed, s.denied), (3, 1));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_wait_gives_its_slot_back() -> TestResult {
    let start = Instant::now();
    let shaper = shaper(start)?;
    let layer = RateLimitLayer::builder()
        .queue(QueueRule::shared(
            "smooth",
            Arc::clone(&shaper),
            Duration::from_secs(1),
        )?)
        .build()?;
    let mut svc = layer.layer(Hello);
    serve_one_abandon_one(&mut svc, || Request::new(())).await?;
    // Its units came back: the next slot is at 100 ms again (90 ms from now), not 200.
    let next = shaper.reserve(1, Duration::from_secs(1))?;
    assert_eq!(next.delay(), Duration::from_millis(90));
    Ok(())
}

/// A cost above the burst, which no slot can hold, is refused when the layer is
/// built, naming the rule, the cost and the burst.
#[tokio::test(start_paused = true)]
async fn a_cost_above_the_burst_is_refused_when_built() -> TestResult {
    let start = Instant::now();
    let err = RateLimitLayer::builder()
        .queue(QueueRule::shared("smooth", shaper(start)?, Duration::from_secs(10))?.cost(2))
        .build()
        .expect_err("cost 2 > burst 1");
    assert_eq!(
        err,
        ConfigError::Cost {
            rule: "smooth".into(),
            cost: 2,
            capacity: 1
        }
    );
    let err = RateLimitLayer::builder()
        .queue_per_key(
            KeyedQueueRule::new(
                "per-key",
                HeaderKey::new("x-api-key")?,
                per_key(start)?,
                Duration::from_secs(10),
            )?
            .cost(2),
        )
        .build()
        .expect_err("cost 2 > burst 1");
    assert!(
        matches!(
            err,
            ConfigError::Cost {
                cost: 2,
                capacity: 1,
                ..
            }
        ),
        "{err}"
    );
    // At the burst it fits.
    RateLimitLayer::builder()
        .queue(QueueRule::shared("smooth", shaper(start)?, Duration::from_secs(10))?.cost(1))
        .build()?;
    Ok(())
}

/// 10 per second per API key, one at a time, on Tokio's clock.
fn per_key(
    start: Instant,
) -> Result<floodgate::KeyedLimiter<String, floodgate::Gcra, TokioClock>, Box<dyn std::error::Error>>
{
    let gcra = floodgate::Gcra::new(Policy::per_second(10)?.with_burst(1)?);
    Ok(floodgate::KeyedBuilder::new(gcra)
        .capacity(64)
        .clock(TokioClock { start })
        .build()?)
}

fn with_key(key: &str) -> Request<()> {
    Request::get("/")
        .header("x-api-key", key)
        .body(())
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn each_key_waits_behind_its_own_requests_only() -> TestResult {
    let start = Instant::now();
    let layer = RateLimitLayer::builder()
        .queue_per_key(KeyedQueueRule::new(
            "per-key",
            HeaderKey::new("x-api-key")?,
            per_key(start)?,
            Duration::from_millis(250),
        )?)
        .build()?;
    let requests = ["a", "a", "b", "a", "a", "b"].map(with_key);
    let done = all_at_once(&layer.layer(Hello), requests, start).await?;
    let slots: Vec<(u16, u128)> = done.iter().map(|d| (d.0, d.1.as_millis())).collect();
    // Key a: slots at 0, 100 and 200 ms, its fourth (300 ms) is past the bound; key b
    // has its own schedule (0 and 100 ms), untouched by a's queue.
    assert_eq!(
        slots,
        vec![
            (200, 0),
            (200, 100),
            (200, 0),
            (200, 200),
            (429, 0),
            (200, 100)
        ]
    );
    // The refused reservation fits 50 ms later: Retry-After rounds up to 1.
    assert_eq!(
        done[4].2.as_ref().map(|v| v.to_str().unwrap_or("")),
        Some("1")
    );
    let s = layer.rule_stats("per-key").ok_or("rule")?;
    assert_eq!((s.allowed, s.denied, s.queued), (5, 1, 3));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_per_key_wait_gives_its_slot_back() -> TestResult {
    let start = Instant::now();
    let limiter = Arc::new(per_key(start)?);
    let layer = RateLimitLayer::builder()
        .queue_per_key(KeyedQueueRule::shared(
            "per-key",
            HeaderKey::new("x-api-key")?,
            Arc::clone(&limiter),
            Duration::from_secs(1),
        )?)
        .build()?;
    let mut svc = layer.layer(Hello);
    serve_one_abandon_one(&mut svc, || with_key("a")).await?;
    // Its units came back: the next slot is at 100 ms again (90 ms from now).
    let (_, delay, _) = limiter.reserve("a", 1, Duration::from_secs(1))?;
    assert_eq!(delay, Duration::from_millis(90));
    // A request without a key is a 400, and reserves nothing.
    let resp = svc.call(Request::new(())).await?;
    assert_eq!(resp.status(), 400);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_wait_gives_back_the_earlier_rules_charges_too() -> TestResult {
    let start = Instant::now();
    // Two requests a minute in all, then the queue.
    let global = Arc::new(floodgate::RateLimiter::gcra_with_clock(
        Policy::per_minute(2)?,
        floodgate::ManualClock::new(),
    ));
    let layer = RateLimitLayer::builder()
        .rule(floodgate_http::Rule::shared(
            "global",
            Arc::clone(&global),
            floodgate_http::Global,
        )?)
        .queue(QueueRule::shared(
            "smooth",
            shaper(start)?,
            Duration::from_secs(1),
        )?)
        .build()?;
    let mut svc = layer.layer(Hello);
    // The second request passes "global" before it waits for its slot.
    serve_one_abandon_one(&mut svc, || Request::new(())).await?;
    // A request never served is charged nowhere: "global" still has one unit.
    assert_eq!(global.peek(0).remaining(), 1);
    assert_eq!(svc.call(Request::new(())).await?.status(), 200);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn published_outcomes_say_which_request_waited() -> TestResult {
    use floodgate_http::RateLimitOutcomes;
    use std::convert::Infallible;
    let start = Instant::now();
    let layer = RateLimitLayer::builder()
        .queue(QueueRule::shared(
            "smooth",
            shaper(start)?,
            Duration::from_secs(1),
        )?)
        .publish_outcomes(true)
        .build()?;
    // The handler answers 200 when the rule's outcome says the request waited, 203
    // when it did not.
    let handler = tower::service_fn(|req: Request<()>| async move {
        let outcomes = req.extensions().get::<RateLimitOutcomes>().cloned();
        let smooth = outcomes.as_ref().and_then(|o| o.get("smooth"));
        let status = match smooth.map(|o| (o.queued, o.decision.is_allowed())) {
            Some((true, true)) => 200,
            Some((false, true)) => 203,
            _ => 500,
        };
        let mut resp = Response::new(String::new());
        *resp.status_mut() = http::StatusCode::from_u16(status).expect("status");
        Ok::<_, Infallible>(resp)
    });
    let done = all_at_once(
        &layer.layer(handler),
        (0..2).map(|_| Request::new(())),
        start,
    )
    .await?;
    // The first is served at once; the second waits 100 ms for its slot.
    assert_eq!((done[0].0, done[0].1), (203, Duration::ZERO));
    assert_eq!((done[1].0, done[1].1), (200, Duration::from_millis(100)));
    Ok(())
}
