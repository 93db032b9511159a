//! Each rule's own failure policy ([`Rule::on_limiter_error`]) over the layer's.

use floodgate_http::{Global, OnLimiterError, RateLimitLayer, Rule, Strategy};
use http::{Request, StatusCode};
use tower::{Layer, ServiceExt};

mod common;
use common::{Down, Hello, TestResult};

/// The status of one request through `layer` around [`Hello`].
async fn status(layer: &RateLimitLayer) -> Result<StatusCode, Box<dyn std::error::Error>> {
    let response = layer
        .layer(Hello)
        .oneshot(Request::get("/").body(String::new())?)
        .await?;
    Ok(response.status())
}

#[tokio::test]
async fn a_rule_s_failure_policy_overrides_the_layer_s() -> TestResult {
    // The layer fails closed; the first rule fails open, the second follows the layer.
    let layer = RateLimitLayer::builder()
        .rule(Rule::remote("per-client", Down, Global)?.on_limiter_error(OnLimiterError::FailOpen))
        .rule(Rule::remote("quota", Down, Global)?)
        .build()?;
    assert_eq!(status(&layer).await?, StatusCode::SERVICE_UNAVAILABLE);
    let errors: Vec<u64> = layer.stats().iter().map(|s| s.errors).collect();
    assert_eq!(errors, [1, 1]);

    // The layer fails open; a rule that must not be skipped fails closed.
    let layer = RateLimitLayer::builder()
        .rule(Rule::remote("per-client", Down, Global)?)
        .rule(Rule::remote("quota", Down, Global)?.on_limiter_error(OnLimiterError::FailClosed))
        .on_limiter_error(OnLimiterError::FailOpen)
        .build()?;
    assert_eq!(status(&layer).await?, StatusCode::SERVICE_UNAVAILABLE);

    // Both open: the request passes, each failure counted.
    let layer = RateLimitLayer::builder()
        .rule(Rule::remote("per-client", Down, Global)?.on_limiter_error(OnLimiterError::FailOpen))
        .on_limiter_error(OnLimiterError::FailClosed)
        .build()?;
    assert_eq!(status(&layer).await?, StatusCode::OK);
    assert_eq!(layer.stats()[0].errors, 1);
    Ok(())
}

/// A soft or shadow rule never blocks, whatever its own failure policy says: a
/// failure skips it and counts in its `errors`.
#[tokio::test]
async fn a_soft_or_shadow_rule_that_fails_closed_still_never_blocks() -> TestResult {
    for strategy in [Strategy::Soft, Strategy::Shadow] {
        let layer = RateLimitLayer::builder()
            .rule(
                Rule::remote("trial", Down, Global)?
                    .strategy(strategy)
                    .on_limiter_error(OnLimiterError::FailClosed),
            )
            .on_limiter_error(OnLimiterError::FailClosed)
            .build()?;
        assert_eq!(status(&layer).await?, StatusCode::OK, "{strategy:?}");
        let stats = &layer.stats()[0];
        assert_eq!((stats.errors, stats.denied), (1, 0), "{strategy:?}");
    }
    Ok(())
}
