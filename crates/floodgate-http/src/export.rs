//! The per-rule counters through the [`metrics`] facade (feature `metrics`).
//!
//! # Why export on demand
//!
//! A `metrics` counter is whatever the installed recorder makes it; in the common
//! exporters it is one shared atomic per label set. Incrementing it on every request
//! would put one write to a shared cache line on the request path — the contention
//! the layer's sharded counters ([`RuleStats`](crate::RuleStats)) exist to avoid — and
//! a recorder's counter cannot be backed by those shards. So the request path writes
//! only its shard, and [`RateLimitLayer::export_metrics`] reads the shards and sets
//! each facade counter to the total (`Counter::absolute`): O(rules × shards) per
//! export, nothing per request. Call it before each scrape, or on an interval.

use crate::layer::RateLimitLayer;

/// The exported counters: one per [`RuleStats`](crate::RuleStats) field, each
/// labelled `rule` with the rule's name. `queued` is a subset of `allowed`.
pub const METRIC_NAMES: [&str; 7] = [
    "floodgate_http_allowed_total",
    "floodgate_http_denied_total",
    "floodgate_http_soft_total",
    "floodgate_http_shadow_total",
    "floodgate_http_queued_total",
    "floodgate_http_bad_key_total",
    "floodgate_http_errors_total",
];

impl RateLimitLayer {
    /// Sets the `metrics` counters ([`METRIC_NAMES`], label `rule`) to each rule's
    /// totals, on the recorder installed now (see the module docs for why this is not
    /// done per request).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Policy, RateLimiter};
    /// use floodgate_http::{Global, RateLimitLayer, Rule};
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::new("global", RateLimiter::gcra(Policy::per_second(100)?), Global)?)
    ///     .build()?;
    /// // E.g. from the Prometheus endpoint's handler, just before rendering.
    /// layer.export_metrics();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn export_metrics(&self) {
        for s in self.stats() {
            let values = [
                s.allowed, s.denied, s.soft, s.shadow, s.queued, s.bad_key, s.errors,
            ];
            for (name, value) in METRIC_NAMES.into_iter().zip(values) {
                metrics::counter!(name, "rule" => s.name.clone()).absolute(value);
            }
        }
    }
}
