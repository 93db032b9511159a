//! A per-user rule then a priority rule on Tokio's clock, and the requests that
//! meet them, for the tests of a later priority rule's peek (review_s44_peek.rs,
//! doc_claims_s44.rs). Needs the test crate's `answer` and `common` modules.
#![allow(dead_code)]

use std::time::Duration;

use floodgate::{KeyedLimiter, Policy, Shaper};
use floodgate_http::{from_fn, HeaderKey, PriorityRule, RateLimitLayer, RateLimitService, Rule};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

use crate::answer::Answer;
use crate::common::{tier, tier_request, Hello, TokioClock};

/// 1 per `secs` s, burst 1.
pub fn one_per(secs: u64) -> Result<Policy, floodgate::PolicyError> {
    Policy::new(1, Duration::from_secs(secs))?.with_burst(1)
}

/// A per-user rule of 1 per 2 s, then a priority rule "prio" of 1 per 10 s with
/// `bounds` places per tier; both on Tokio's clock from `start`.
pub fn per_user_then_priority(
    start: Instant,
    bounds: &[usize],
) -> Result<RateLimitLayer, Box<dyn std::error::Error>> {
    let clock = TokioClock { start };
    let per_user: KeyedLimiter<String, _, _> = KeyedLimiter::gcra_with_clock(one_per(2)?, clock);
    let shaper = Shaper::with_clock(one_per(10)?, clock);
    Ok(RateLimitLayer::builder()
        .rule(Rule::new("per-user", per_user, HeaderKey::new("x-user")?)?)
        .priority(PriorityRule::new("prio", shaper, bounds, from_fn(tier))?)
        .build()?)
}

pub async fn send(layer: &RateLimitLayer, who: &str, tier: usize) -> Result<Answer, String> {
    let response = layer
        .layer(Hello)
        .oneshot(tier_request(who, tier))
        .await
        .map_err(|e| e.to_string())?;
    Answer::read(response).await.map_err(|e| e.to_string())
}

/// Sends a request and lets it reach its queue before returning.
pub async fn arrive(svc: &RateLimitService<Hello>, who: &str, tier: usize) -> JoinHandle<u16> {
    let mut svc = svc.clone();
    let req = tier_request(who, tier);
    let task = tokio::spawn(async move {
        let resp = svc.call(req).await.expect("infallible");
        resp.status().as_u16()
    });
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
    task
}
