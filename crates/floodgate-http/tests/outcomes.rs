//! `RateLimitLayerBuilder::publish_outcomes`: what each rule decided, read by the
//! inner service from the request's extensions. The limiters run on a manual clock
//! that never moves, so every decision is exact.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use floodgate::{ManualClock, Policy, RateLimiter};
use floodgate_http::{
    Global, HeaderKey, RateLimitLayer, RateLimitLayerBuilder, RateLimitOutcomes, Rule, Strategy,
};
use http::{Request, Response, StatusCode};
use tower::{service_fn, Layer, Service, ServiceExt};

mod common;
use common::TestResult;

/// One rule's outcome as the handler saw it: name, strategy, allowed, remaining.
type Seen = Vec<(String, Strategy, bool, u64)>;

/// Serves one request through `layer` to a handler that records the outcomes it
/// finds in the request's extensions (`None`: none were published). Returns the
/// status and what the handler saw (`None` as well when it was not called).
async fn one_request(layer: &RateLimitLayer) -> (StatusCode, Option<Option<Seen>>) {
    let seen = Arc::new(Mutex::new(None));
    let record = Arc::clone(&seen);
    let handler = service_fn(move |req: Request<()>| {
        let outcomes = req.extensions().get::<RateLimitOutcomes>().map(|o| {
            o.iter()
                .map(|r| {
                    let allowed = r.decision.is_allowed();
                    (
                        r.name.to_owned(),
                        r.strategy,
                        allowed,
                        r.decision.remaining(),
                    )
                })
                .collect::<Seen>()
        });
        *record.lock().expect("handler record") = Some(outcomes);
        async { Ok::<_, Infallible>(Response::new(String::new())) }
    });
    let resp = layer
        .layer(handler)
        .oneshot(Request::new(()))
        .await
        .unwrap_or_else(|never| match never {});
    let seen = seen.lock().expect("handler record").take();
    (resp.status(), seen)
}

/// A layer, in order: "hard" (2 per minute), "soft" and "shadow" (1 per minute
/// each), and "keyless", a soft rule keyed on a header no request sends.
fn rules(clock: &ManualClock) -> Result<RateLimitLayerBuilder, Box<dyn std::error::Error>> {
    let per_minute = |n| -> Result<_, floodgate::PolicyError> {
        Ok(RateLimiter::gcra_with_clock(
            Policy::per_minute(n)?,
            clock.clone(),
        ))
    };
    Ok(RateLimitLayer::builder()
        .rule(Rule::new("hard", per_minute(2)?, Global)?)
        .rule(Rule::new("soft", per_minute(1)?, Global)?.strategy(Strategy::Soft))
        .rule(Rule::new("shadow", per_minute(1)?, Global)?.strategy(Strategy::Shadow))
        .rule(
            Rule::new(
                "keyless",
                floodgate::KeyedLimiter::<String>::gcra(Policy::per_minute(1)?),
                HeaderKey::new("x-api-key")?,
            )?
            .strategy(Strategy::Soft),
        ))
}

fn seen(rows: &[(&str, Strategy, bool, u64)]) -> Option<Option<Seen>> {
    Some(Some(
        rows.iter()
            .map(|&(name, strategy, allowed, remaining)| {
                (name.to_owned(), strategy, allowed, remaining)
            })
            .collect(),
    ))
}

#[tokio::test]
async fn a_handler_reads_every_rule_that_decided_with_its_strategy() -> TestResult {
    let clock = ManualClock::new();
    let layer = rules(&clock)?.publish_outcomes(true).build()?;
    use Strategy::{Hard, Shadow, Soft};

    // 1: all admit; the keyless soft rule is skipped, so it is not listed.
    // 2: the soft and shadow rules deny and the request still passes: listed as
    //    denials, each with its strategy.
    // 3: a hard denial is the layer's own answer: the handler is not called.
    for (n, want_status, want) in [
        (
            1,
            StatusCode::OK,
            seen(&[
                ("hard", Hard, true, 1),
                ("soft", Soft, true, 0),
                ("shadow", Shadow, true, 0),
            ]),
        ),
        (
            2,
            StatusCode::OK,
            seen(&[
                ("hard", Hard, true, 0),
                ("soft", Soft, false, 0),
                ("shadow", Shadow, false, 0),
            ]),
        ),
        (3, StatusCode::TOO_MANY_REQUESTS, None),
    ] {
        let (status, got) = one_request(&layer).await;
        assert_eq!((status, got), (want_status, want), "request {n}");
    }
    Ok(())
}

#[tokio::test]
async fn outcomes_are_looked_up_by_rule_name() -> TestResult {
    let clock = ManualClock::new();
    let layer = rules(&clock)?.publish_outcomes(true).build()?;
    let handler = service_fn(|req: Request<()>| async move {
        let outcomes = req
            .extensions()
            .get::<RateLimitOutcomes>()
            .expect("published");
        assert_eq!(outcomes.len(), 3);
        assert!(!outcomes.is_empty());
        let soft = outcomes.get("soft").expect("soft decided");
        assert_eq!((soft.strategy, soft.decision.limit()), (Strategy::Soft, 1));
        assert!(!soft.queued);
        assert!(outcomes.get("keyless").is_none());
        assert!(outcomes.get("nonesuch").is_none());
        let text = format!("{outcomes:?}");
        assert!(text.starts_with("[RuleOutcome { name: \"hard\""), "{text}");
        Ok::<_, Infallible>(Response::new(String::new()))
    });
    let mut svc = layer.layer(handler);
    let resp = svc.ready().await?.call(Request::new(())).await?;
    assert_eq!(resp.status(), StatusCode::OK);
    Ok(())
}

#[tokio::test]
async fn nothing_is_published_unless_asked() -> TestResult {
    let clock = ManualClock::new();
    for layer in [
        rules(&clock)?.build()?,
        rules(&clock)?.publish_outcomes(false).build()?,
    ] {
        let (status, got) = one_request(&layer).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(got, Some(None));
    }
    Ok(())
}
