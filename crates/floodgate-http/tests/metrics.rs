//! The per-rule counters through the `metrics` facade (feature `metrics`), read back
//! with `metrics-util`'s debugging recorder.

use floodgate::{ManualClock, Policy, RateLimiter};
use floodgate_http::{Global, RateLimitLayer, Rule, Strategy, METRIC_NAMES};
use http::Request;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;
use tower::{Layer, Service};
mod common;
use common::Hello;

fn one_per_minute() -> RateLimiter<floodgate::Gcra, ManualClock> {
    RateLimiter::gcra_with_clock(Policy::per_minute(1).expect("policy"), ManualClock::new())
}

/// The counter `name{rule}` in the recorder's snapshot.
fn counter(snapshot: &[(String, String, u64)], name: &str, rule: &str) -> Option<u64> {
    snapshot
        .iter()
        .find(|(n, r, _)| n == name && r == rule)
        .map(|(_, _, v)| *v)
}

#[tokio::test]
async fn exported_counters_are_the_rule_totals() -> Result<(), Box<dyn std::error::Error>> {
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("shadow", one_per_minute(), Global)?.strategy(Strategy::Shadow))
        .rule(Rule::new("soft", one_per_minute(), Global)?.strategy(Strategy::Soft))
        .rule(Rule::new(
            "hard",
            RateLimiter::gcra_with_clock(Policy::per_minute(2)?, ManualClock::new()),
            Global,
        )?)
        .build()?;
    let mut svc = layer.layer(Hello);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(svc.call(Request::new(())).await?.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 429]);

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // Exported twice: `absolute` sets the totals, it does not add them up again.
    metrics::with_local_recorder(&recorder, || {
        layer.export_metrics();
        layer.export_metrics();
    });
    let snapshot: Vec<(String, String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let (kind, key) = key.into_parts();
            let rule = key.labels().find(|l| l.key() == "rule")?.value().to_owned();
            match (kind, value) {
                (MetricKind::Counter, DebugValue::Counter(v)) => {
                    Some((key.name().to_owned(), rule, v))
                }
                _ => None,
            }
        })
        .collect();
    // Seven counters for each of the three rules.
    assert_eq!(snapshot.len(), 3 * METRIC_NAMES.len());
    let get = |name: &str, rule: &str| counter(&snapshot, name, rule);
    // shadow: 1 allowed, then 2 it would have denied.
    assert_eq!(get("floodgate_http_allowed_total", "shadow"), Some(1));
    assert_eq!(get("floodgate_http_shadow_total", "shadow"), Some(2));
    // soft: 1 allowed, 2 let through over the limit.
    assert_eq!(get("floodgate_http_allowed_total", "soft"), Some(1));
    assert_eq!(get("floodgate_http_soft_total", "soft"), Some(2));
    // hard: 2 allowed, 1 denied.
    assert_eq!(get("floodgate_http_allowed_total", "hard"), Some(2));
    assert_eq!(get("floodgate_http_denied_total", "hard"), Some(1));
    for rule in ["shadow", "soft", "hard"] {
        assert_eq!(get("floodgate_http_queued_total", rule), Some(0));
        assert_eq!(get("floodgate_http_bad_key_total", rule), Some(0));
        assert_eq!(get("floodgate_http_errors_total", rule), Some(0));
    }
    Ok(())
}
