//! Session 46 (revprio): a leased global rule (`LeasedGcra`) through the layer on a
//! multi-thread runtime while its clock runs and its leases expire mid-storm, a
//! later remote rule turning half the requests away after a round trip (so a
//! request's task may finish on another worker than the one it was charged on, and
//! its refund goes back to a lease that may have expired meanwhile, or to the
//! central word).
//!
//! The documented bound (`floodgate::lease`, "The bound"): over the readings
//! `[a, b]`, admitted ≤ `B + ⌊(b − a)/T⌋` + the units out on lease at `a` (none: the
//! limiter is fresh); a refunded charge is not an admission and a refund never
//! creates a unit. So besides the requests passed, the units still held on leases
//! plus what the central word has left never exceed what the central word could
//! hand out over the run.
//!
//! The same on a hot-key rule (`HotKeyLimiter`) whose key another thread promotes
//! and demotes at every move of the clock.
//!
//! No defect found here (see the report of session 46).

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use floodgate::{
    AsyncLimit, Clock, Decision, HotKeyLimiter, HotKeys, Inline, KeyedBuilder, LeasedGcra,
    ManualClock, Nanos, Policy,
};
use floodgate_http::{from_fn, Global, KeyError, RateLimitLayer, Rule};
use http::request::Parts;
use http::Request;
use tower::Layer;
mod common;
#[path = "common/tasks.rs"]
mod tasks;
use common::{client, Hello};
use tasks::{at_once, counted_once, runtime, send};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A remote rule that, after a round trip, turns away the requests whose key is
/// `true` and admits the others.
struct Later;

impl AsyncLimit<bool> for Later {
    type Error = Infallible;

    async fn check_n(&self, deny: &bool, _: u32) -> Result<Decision, Infallible> {
        // A round trip: pending once, after which a multi-thread runtime may go
        // on with the task on another worker.
        tokio::task::yield_now().await;
        let second = Duration::from_secs(1);
        Ok(if *deny {
            Decision::new(false, 1, 0, second, Some(second))
        } else {
            Decision::new(true, 1, 1, Duration::ZERO, None)
        })
    }

    async fn peek_n(&self, deny: &bool, _: u32) -> Result<Decision, Infallible> {
        Ok(Decision::new(
            !*deny,
            1,
            u64::from(!*deny),
            Duration::ZERO,
            None,
        ))
    }
}

/// Whether the later rule turns the request away: `x-deny: 1`.
fn deny(parts: &Parts) -> Result<bool, KeyError> {
    Ok(parts.headers.get("x-deny").is_some_and(|v| v == "1"))
}

/// What a storm of [`storm`] did: the requests passed, and the clock's readings
/// at its start and end (nanoseconds).
struct Storm {
    passed: u64,
    a: u64,
    b: u64,
}

const PER_TASK: u64 = 100;

/// 8 tasks × [`PER_TASK`] requests at once through `layer` (its last rule the later
/// rule, which turns every other request away), while another thread moves
/// `clock` on 1 ms every millisecond and `meanwhile` runs between the moves. Every
/// response is a 200 or a 429 with `Retry-After`, and the layer counted each
/// request once.
fn storm(
    layer: &RateLimitLayer,
    clock: &ManualClock,
    meanwhile: impl Fn() + Send + 'static,
) -> Result<Storm, Box<dyn std::error::Error + Send + Sync>> {
    let rt = runtime()?;
    let svc = layer.layer(Hello);
    let a = clock.now().as_u64();
    let stop = Arc::new(AtomicBool::new(false));
    let mover = {
        let (clock, stop) = (clock.clone(), Arc::clone(&stop));
        thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                clock.advance(Duration::from_millis(1));
                meanwhile();
                thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let out = rt.block_on(at_once(8, |t| {
        let svc = svc.clone();
        async move {
            let mut out = Vec::new();
            for i in 0..PER_TASK {
                let req = Request::get("/")
                    .header("x-client", "7")
                    .header("x-deny", if (t as u64 + i) % 2 == 0 { "1" } else { "0" })
                    .body(())
                    .map_err(|e| e.to_string())?;
                let resp = send(&svc, req).await?;
                let retry = resp.headers().get("retry-after").cloned();
                out.push((resp.status().as_u16(), retry));
                tokio::task::yield_now().await;
            }
            Ok(out)
        }
    }));
    stop.store(true, Ordering::SeqCst);
    mover.join().map_err(|_| "the clock thread")?;
    let out = out?;
    let b = clock.now().as_u64();
    for (status, retry) in &out {
        assert!(
            *status == 200 || (*status == 429 && retry.is_some()),
            "{status} {retry:?}"
        );
    }
    let passed = out.iter().filter(|(s, _)| *s == 200).count() as u64;
    let stats = layer.stats();
    counted_once(&stats, 8 * PER_TASK, passed, "the storm");
    assert!(stats[1].denied > 0 && passed > 0);
    Ok(Storm { passed, a, b })
}

/// 100 a second (`T` = 10 ms), burst 20.
fn policy() -> Result<Policy, floodgate::PolicyError> {
    Policy::per_second(100)?.with_burst(BURST)
}

const BURST: u64 = 20;

/// [`storm`] through a leased global rule of [`policy`], leases of 4 that live
/// 3 ms: leases expire (over the 10 to 40 ms a storm runs) and the central word
/// refills during the storm; the bound is reached (seen: passed = bound in most
/// storms). Then, the clock standing: passed ≤ `B + ⌊(b − a)/T⌋`, and passed +
/// held on leases + the central word's remaining ≤ the same (a refund, to a lease
/// or to the central word, never creates a unit). Five storms.
///
/// Mutation seen failing: the layer giving back the in-process charges of a
/// request it passed on (`Held::keep` not clearing `receipts`: passed beyond the
/// bound).
#[test]
fn a_leased_rule_keeps_its_bound_while_leases_expire_under_refunds() -> TestResult {
    for round in 0..5 {
        let clock = ManualClock::starting_at(Nanos::from_secs(1));
        let global = Arc::new(
            LeasedGcra::builder(policy()?)
                .shards(64)
                .lease_size(4)
                .lifetime(Duration::from_millis(3))
                .build_with_clock(clock.clone())?,
        );
        let layer = RateLimitLayer::builder()
            .rule(Rule::shared("global", Arc::clone(&global), Global)?)
            .rule(Rule::remote("later", Later, from_fn(deny))?)
            .build()?;
        let Storm { passed, a, b } = storm(&layer, &clock, || {})?;
        let refill = (b - a) / policy()?.interval_nanos();
        let bound = BURST + refill;
        assert!(passed <= bound, "round {round}: passed {passed} > {bound}");
        let (held, central) = (global.units_held(), global.peek(0).remaining());
        assert!(held <= 64 * 4, "round {round}: held {held}");
        assert!(
            passed + held + central <= bound,
            "round {round}: passed {passed} + held {held} + central {central} > {bound} \
             (refill {refill}): a refund created units"
        );
    }
    Ok(())
}

/// [`storm`] on one client's key of a hot-key rule (`HotKeyLimiter`, [`policy`],
/// leases of 4 that live 3 ms) while the clock thread promotes and demotes the
/// key at each move: the key's charges go to leases, to the keyed table and back,
/// leases expire, and the later rule's refunds land wherever the key now is. The
/// key never passes more than `B + ⌊(b − a)/T⌋` (it is never removed). Five
/// storms.
///
/// Mutation seen failing: the layer giving back the in-process charges of a
/// request it passed on (`Held::keep` not clearing `receipts`: 188 passed, bound
/// 22).
#[test]
fn a_hot_key_rule_keeps_its_bound_under_promotion_churn_and_refunds() -> TestResult {
    for round in 0..5 {
        let clock = ManualClock::starting_at(Nanos::from_secs(1));
        let hot: Arc<HotKeyLimiter<u64, ManualClock, Inline>> = Arc::new(HotKeyLimiter::new_in(
            policy()?,
            KeyedBuilder::default().clock(clock.clone()),
            HotKeys::default()
                .lease_size(4)
                .lease_shards(64)
                .lease_lifetime(Duration::from_millis(3))
                .manual(),
        )?);
        let layer = RateLimitLayer::builder()
            .rule(Rule::shared(
                "per-client",
                Arc::clone(&hot),
                from_fn(client),
            )?)
            .rule(Rule::remote("later", Later, from_fn(deny))?)
            .build()?;
        let churn = Arc::clone(&hot);
        let Storm { passed, a, b } = storm(&layer, &clock, move || {
            if churn.is_hot(&7) {
                churn.demote(&7);
            } else {
                churn.promote(&7);
            }
        })?;
        let bound = BURST + (b - a) / policy()?.interval_nanos();
        assert!(passed <= bound, "round {round}: passed {passed} > {bound}");
    }
    Ok(())
}
