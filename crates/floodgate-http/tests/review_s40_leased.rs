//! Adversarial review (session 40) of the hot-key modes as layer rules
//! (`LeasedGcra` and `HotKeyLimiter` implement `Charge`).
//!
//! * A hot-key rule whose key another thread promotes and demotes over and over,
//!   with a later rule denying half the requests (so half the hot charges are given
//!   back) and a report rule (cost 0) on the same limiter: the key never passes more
//!   than its burst on a standing clock, and every response's headers are true — no
//!   `RateLimit` reset read off the closed central word a demotion leaves (the end
//!   of time), a limit of the rules', a remaining within it, a 429's `Retry-After`.
//! * A leased global rule on a multi-threaded Tokio runtime, a later rule denying
//!   half the requests: the rule never passes more than its burst, and every unit
//!   its central word handed out is passed, held on a lease, or still central.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use floodgate::{
    HotKeyLimiter, HotKeys, Inline, KeyedBuilder, LeasedGcra, ManualClock, Nanos, Policy,
};
use floodgate_http::{from_fn, Global, KeyError, RateLimitLayer, RateLimitLayerBuilder, Rule};
use http::request::Parts;
use http::{Request, Response};
use tower::{Layer, ServiceExt};
mod common;
use common::{Hello, TestResult};

type Body = floodgate_http::RateLimitBody<String>;

/// The number in header `name` of `parts`.
fn header_number(parts: &Parts, name: &'static str) -> Result<u64, KeyError> {
    parts
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or(KeyError::Missing { what: name.into() })
}

/// A request of client `client` that the later rule denies when `deny`.
fn request(client: u64, deny: bool, n: u64) -> Request<()> {
    // The later rule's key: one exhausted key for a denial, a fresh one otherwise.
    let later = if deny { 0 } else { n + 1 };
    Request::builder()
        .header("x-client", client.to_string())
        .header("x-later", later.to_string())
        .body(())
        .expect("a test request")
}

/// The later rule's key: the `x-later` header.
fn later_key(parts: &Parts) -> Result<u64, KeyError> {
    header_number(parts, "x-later")
}

/// `builder` with the later rule added: one request a minute per `x-later` key (key
/// 0 is used up first).
fn with_later(
    builder: RateLimitLayerBuilder,
    clock: &ManualClock,
) -> Result<RateLimitLayerBuilder, Box<dyn std::error::Error>> {
    let later = KeyedBuilder::new(floodgate::Gcra::new(Policy::per_minute(1)?))
        .clock(clock.clone())
        .build::<u64>()?;
    Ok(builder.rule(Rule::new("later", later, from_fn(later_key))?))
}

/// Why a response's headers are not true, if they are not: a limit of `limits`, a
/// remaining within it, every `RateLimit` reset and `X-RateLimit-Reset` at most
/// `max_reset` seconds, a 200 or a 429 with a `Retry-After` of 1 to `max_reset`.
fn untrue(r: &Response<Body>, limits: &[u64], max_reset: u64) -> Option<String> {
    let h = r.headers();
    let num = |name: &str| -> Option<u64> { h.get(name)?.to_str().ok()?.parse().ok() };
    let (Some(limit), Some(remaining), Some(reset)) = (
        num("x-ratelimit-limit"),
        num("x-ratelimit-remaining"),
        num("x-ratelimit-reset"),
    ) else {
        return Some(format!("X-RateLimit-* missing: {h:?}"));
    };
    if !limits.contains(&limit) || remaining > limit || reset > max_reset {
        return Some(format!(
            "limit {limit}, remaining {remaining}, reset {reset}: {h:?}"
        ));
    }
    let Some(fields) = h.get("ratelimit").and_then(|v| v.to_str().ok()) else {
        return Some(format!("RateLimit missing: {h:?}"));
    };
    for t in fields
        .split(';')
        .filter_map(|p| p.trim().strip_prefix("t="))
    {
        let t = t
            .split(',')
            .next()
            .and_then(|t| t.trim().parse::<u64>().ok());
        let Some(t) = t else {
            return Some(format!("RateLimit reset not a number: {fields}"));
        };
        if t > max_reset {
            return Some(format!("RateLimit reset {t} > {max_reset}: {fields}"));
        }
    }
    match (r.status().as_u16(), num("retry-after")) {
        (200, _) => None,
        (429, Some(retry)) if (1..=max_reset).contains(&retry) => None,
        (status, retry) => Some(format!("status {status}, Retry-After {retry:?}: {h:?}")),
    }
}

#[test]
fn a_hot_key_rule_under_promotion_churn_passes_at_most_its_burst_with_true_headers() -> TestResult {
    const BURST: u64 = 40; // one a second: τ = 40 s
    const THREADS: u64 = 3;
    const PER_THREAD: u64 = 20_000;
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let hot: Arc<HotKeyLimiter<u64, ManualClock, Inline>> = Arc::new(HotKeyLimiter::new_in(
        Policy::per_second(1)?.with_burst(BURST)?,
        KeyedBuilder::default().clock(clock.clone()),
        HotKeys::default()
            .lease_size(2)
            .lease_shards(64)
            .slots(2)
            .manual(),
    )?);
    let client = |p: &Parts| header_number(p, "x-client");
    let layer = with_later(
        RateLimitLayer::builder()
            // A report on the same limiter (cost 0): its numbers in every response.
            .rule(Rule::shared("hot-report", Arc::clone(&hot), from_fn(client))?.cost(0))
            .rule(Rule::shared(
                "per-client",
                Arc::clone(&hot),
                from_fn(client),
            )?),
        &clock,
    )?
    .build()?;
    let stop = Arc::new(AtomicBool::new(false));
    // The churn flips the key once before it looks at `stop`, and the workers start
    // after that first flip: a churn thread first run after the workers had ended
    // (a start order the scheduler may pick) used to count no flip at all.
    let (flipped, first_flip) = std::sync::mpsc::channel();
    let churn = {
        let (hot, stop) = (Arc::clone(&hot), Arc::clone(&stop));
        thread::spawn(move || {
            let mut flips = 0u64;
            loop {
                let _ = hot.promote(&7);
                let _ = hot.demote(&7);
                flips += 1;
                if flips == 1 {
                    let _ = flipped.send(());
                }
                if stop.load(Ordering::Relaxed) {
                    break flips;
                }
            }
        })
    };
    first_flip.recv()?;
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let layer = layer.clone();
            thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .expect("a runtime");
                let (mut passed, mut bad) = (0u64, Vec::new());
                for i in 0..PER_THREAD {
                    let n = t * PER_THREAD + i;
                    let r = rt
                        .block_on(layer.layer(Hello).oneshot(request(7, i % 2 == 1, n)))
                        .expect("infallible");
                    if let Some(why) = untrue(&r, &[BURST, 1], 60) {
                        if bad.len() < 4 {
                            bad.push(why);
                        }
                    }
                    passed += u64::from(r.status() == 200);
                }
                (passed, bad)
            })
        })
        .collect();
    let mut passed = 0;
    let mut bad = Vec::new();
    for w in workers {
        let (p, b) = w.join().expect("a worker");
        passed += p;
        bad.extend(b);
    }
    stop.store(true, Ordering::Relaxed);
    let flips = churn.join().expect("the churn thread");
    assert!(flips > 0);
    assert!(bad.is_empty(), "untrue headers: {bad:?}");
    assert!(passed > 0, "the key passed nothing");
    assert!(passed <= BURST, "passed {passed} > burst {BURST}");
    Ok(())
}

#[test]
fn a_leased_global_rule_on_a_multi_thread_runtime_keeps_its_burst() -> TestResult {
    const BURST: u64 = 60;
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let global = Arc::new(
        LeasedGcra::builder(Policy::per_second(1)?.with_burst(BURST)?)
            .shards(64)
            .lease_size(3)
            // The default lifetime (1 ms; the clock stands): a lease spend's reset is
            // the lease's lifetime left, which a long lifetime would advertise.
            .build_with_clock(clock.clone())?,
    );
    let layer = with_later(
        RateLimitLayer::builder().rule(Rule::shared("global", Arc::clone(&global), Global)?),
        &clock,
    )?
    .build()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()?;
    // 300 tasks of two requests each: first one the later rule denies (its key 0),
    // then one it admits (a fresh key). The second task to start sends its first
    // request when at most the first task's 2 have been decided and at most 4 leases
    // of 3 are out (one a worker): 14 of the 60, so the global rule admits it and the
    // later rule, its key 0 spent by the first task's, denies it — whatever the
    // workers' interleaving. (600 tasks of one request each: the fresh ones run
    // before the others spend the burst, and no request meets the later denial.)
    let passed: u64 = rt.block_on(async {
        let tasks: Vec<_> = (0..300u64)
            .map(|m| {
                let svc = layer.layer(Hello);
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    for (deny, n) in [(true, 2 * m + 1), (false, 2 * m)] {
                        let r = svc
                            .clone()
                            .oneshot(request(1, deny, n))
                            .await
                            .expect("infallible");
                        seen.push((r.status() == 200, untrue(&r, &[BURST, 1], 60)));
                    }
                    seen
                })
            })
            .collect();
        let mut passed = 0;
        for t in tasks {
            for (ok, why) in t.await.expect("a task") {
                assert!(why.is_none(), "{why:?}");
                passed += u64::from(ok);
            }
        }
        passed
    });
    let (held, central) = (global.units_held(), global.peek(0).remaining());
    assert!(passed <= BURST, "passed {passed} > burst {BURST}");
    assert!(
        passed + held + central <= BURST,
        "passed {passed} + held {held} + central {central} > {BURST}: a refund created units"
    );
    assert!(layer.stats()[1].denied > 0, "the later rule denied");
    Ok(())
}
