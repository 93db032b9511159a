//! The hot-key modes as layer rules: `LeasedGcra` (one limit for every key, on
//! per-core leases) and `HotKeyLimiter` (per key, hot keys on leases) implement
//! `Charge`.
//!
//! * Many threads through the tower service on a `ManualClock`: a leased global rule
//!   admits at most its documented bound (the central GCRA's allowance plus the
//!   units out on lease at the start: none), every response carries consistent
//!   headers, and every unit the central word handed out is admitted, held on a
//!   lease, or still in the central word — including when a later rule's denials
//!   refund it.
//! * A later rule's denial gives the leased rule's charge back to its lease (hot key
//!   and direct alike); a cold key's comes back as the keyed table's.
//! * A cost above the burst is refused at build (`ConfigError::Cost`).
//! * The request's task on more than one thread: a later remote rule denies after
//!   the task moved threads (the future polled on one thread until the remote rule
//!   awaits, finished on another, as a multi-threaded runtime may do), and the
//!   leased charge comes back to the central word; a client that waits a leased
//!   denial's `Retry-After` and retries from another thread (another lease shard)
//!   is admitted.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::Duration;

use floodgate::{
    AsyncLimit, Decision, HotKeyLimiter, HotKeys, Inline, KeyedBuilder, LeasedGcra, ManualClock,
    Nanos, Policy, RateLimiter,
};
use floodgate_http::{from_fn, ConfigError, Global, RateLimitLayer, Rule};
use http::{Request, Response};
use tower::{Layer, ServiceExt};
mod common;
use common::{client, Hello, TestResult};

type Body = floodgate_http::RateLimitBody<String>;
type Answer = Result<Response<Body>, Infallible>;
type Hot = HotKeyLimiter<u64, ManualClock, Inline>;

fn num(r: &Response<Body>, name: &str) -> u64 {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing or not a number: {:?}", r.headers()))
}

fn request(client: u64) -> Request<()> {
    Request::builder()
        .header("x-client", client.to_string())
        .body(())
        .expect("a test request")
}

fn leased(
    burst: u64,
    per_second: u64,
    lease: u32,
    clock: &ManualClock,
) -> Arc<LeasedGcra<ManualClock>> {
    Arc::new(
        LeasedGcra::builder(
            Policy::per_second(per_second)
                .unwrap()
                .with_burst(burst)
                .unwrap(),
        )
        .shards(64)
        .lease_size(lease)
        .lifetime(Duration::from_secs(3_600))
        .build_with_clock(clock.clone())
        .unwrap(),
    )
}

/// What each thread saw: 200s, 429s.
#[derive(Default)]
struct Tally {
    passed: u64,
    denied: u64,
    /// Responses whose headers are wrong, and why.
    bad: Vec<String>,
}

/// A limit of `limits`, a remaining within it, the `RateLimit` field; a 200 or a
/// 429 with `Retry-After` of at least 1 s.
fn check_headers(r: &Response<Body>, limits: &[u64]) -> Result<(), String> {
    let h = r.headers();
    let num = |name: &str| -> Result<u64, String> {
        h.get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{name} missing or not a number: {h:?}"))
    };
    let limit = num("x-ratelimit-limit")?;
    let remaining = num("x-ratelimit-remaining")?;
    if !limits.contains(&limit) || remaining > limit || !h.contains_key("ratelimit") {
        return Err(format!("limit {limit}, remaining {remaining}: {h:?}"));
    }
    match r.status().as_u16() {
        200 => Ok(()),
        429 if num("retry-after")? >= 1 => Ok(()),
        other => Err(format!("status {other}: {h:?}")),
    }
}

/// How [`drive`] sends: `threads` threads, `rounds` rounds of `per_round` requests
/// each, from `clients` clients per thread, each sending `in_a_row` requests before
/// the next client's (request `i` of thread `t` is client
/// `t × 1 000 + (i / in_a_row) % clients`), the clock moving `step` between rounds;
/// every response's `x-ratelimit-limit` is one of `limits`.
struct Run {
    threads: u64,
    rounds: usize,
    per_round: u64,
    clients: u64,
    in_a_row: u64,
    step: Duration,
    limits: &'static [u64],
}

/// Sends [`Run`]'s requests, each thread with a runtime of its own (so each decides
/// on its own shard), and checks every response's headers: a limit of the run's,
/// a remaining within it, the `RateLimit` field, a 429's `Retry-After`.
fn drive(layer: &RateLimitLayer, clock: &ManualClock, run: Run) -> Tally {
    let Run {
        threads,
        rounds,
        per_round,
        clients,
        in_a_row,
        step,
        limits,
    } = run;
    let between = Arc::new(Barrier::new(threads as usize + 1));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (layer, between) = (layer.clone(), between.clone());
            thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .expect("a runtime");
                let mut tally = Tally::default();
                for _ in 0..rounds {
                    for i in 0..per_round {
                        let svc = layer.layer(Hello);
                        let r = rt
                            .block_on(svc.oneshot(request(t * 1_000 + (i / in_a_row) % clients)))
                            .expect("infallible");
                        // Judged after the run: a panic here would leave the
                        // others waiting at the barrier.
                        if let Err(why) = check_headers(&r, limits) {
                            tally.bad.push(why);
                        }
                        match r.status().as_u16() {
                            200 => tally.passed += 1,
                            _ => tally.denied += 1,
                        }
                    }
                    between.wait(); // the round is over
                    between.wait(); // the clock has moved
                }
                tally
            })
        })
        .collect();
    for _ in 0..rounds {
        between.wait();
        clock.advance(step);
        between.wait();
    }
    let mut all = Tally::default();
    for w in workers {
        let t = w.join().expect("a worker");
        all.passed += t.passed;
        all.denied += t.denied;
        all.bad.extend(t.bad);
    }
    assert!(all.bad.is_empty(), "{:?}", all.bad);
    all
}

#[test]
fn a_leased_global_rule_admits_at_most_its_bound_from_many_threads() -> TestResult {
    const BURST: u64 = 50;
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    // 1 000 a second: 1 unit a millisecond; rounds of 10 ms.
    let global = leased(BURST, 1_000, 4, &clock);
    let layer = RateLimitLayer::builder()
        .rule(Rule::shared("global", Arc::clone(&global), Global)?)
        .build()?;
    let rounds = 5;
    let run = Run {
        threads: 4,
        rounds,
        per_round: 40,
        clients: 1_000,
        in_a_row: 1,
        step: Duration::from_millis(10),
        limits: &[BURST],
    };
    let tally = drive(&layer, &clock, run);
    // Over the run's readings [a, b]: B + ⌊(b − a)/T⌋ + the units out on lease at a
    // (none: the limiter was fresh). The last step is after the last request.
    let span_ms = (rounds as u64 - 1) * 10;
    assert!(
        tally.passed <= BURST + span_ms,
        "admitted {} > {} + {span_ms}",
        tally.passed,
        BURST
    );
    assert!(tally.passed > 0 && tally.denied > 0);
    assert_eq!(tally.passed + tally.denied, 4 * rounds as u64 * 40);
    let stats = layer.stats();
    assert_eq!(stats[0].allowed, tally.passed);
    Ok(())
}

/// Every later-rule denial refunds the leased rule: on a standing clock, the
/// requests passed plus the units held on leases plus the central word's remaining
/// are at most the burst (a refund creates no unit), and no request passed beyond
/// the burst.
#[test]
fn refunds_of_later_denials_create_no_leased_unit() -> TestResult {
    const BURST: u64 = 200;
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let global = leased(BURST, 1, 8, &clock);
    // Each client passes twice; its third request is denied by this later rule.
    let per_client = KeyedBuilder::new(floodgate::Gcra::new(Policy::per_minute(1)?.with_burst(2)?))
        .clock(clock.clone())
        .build::<u64>()?;
    let layer = RateLimitLayer::builder()
        .rule(Rule::shared("global", Arc::clone(&global), Global)?)
        .rule(Rule::new("per-client", per_client, from_fn(client))?)
        .build()?;
    // 30 clients a thread, three requests each in a row: every thread's third
    // request is a later-rule denial whatever the threads' interleaving. Before the
    // first of them the threads have passed at most 2 each and hold at most a lease
    // (8) each: 40 of the 200, so the global rule admits it. (Clients taken in turn,
    // the third requests come after 60 a thread: four threads in step exhaust the
    // burst at about 50 each, and no request ever reached the later rule.)
    let run = Run {
        threads: 4,
        rounds: 1,
        per_round: 90,
        clients: 30,
        in_a_row: 3,
        step: Duration::ZERO,
        limits: &[BURST, 2],
    };
    let passed = drive(&layer, &clock, run).passed;
    let stats = layer.stats();
    // 4 threads × 30 clients × 2 = 240 would pass the per-client rule: the global
    // burst of 200 is the binding limit, and the later rule denied some requests
    // the global rule had charged (refunded).
    assert!(stats[1].denied > 0, "the later rule denied");
    let central = global.peek(0).remaining();
    let held = global.units_held();
    assert!(passed <= BURST, "passed {passed} > burst {BURST}");
    assert!(
        passed + held + central <= BURST,
        "passed {passed} + held {held} + central {central} > {BURST}: a refund created units"
    );
    // Every later denial's unit came back (to a lease never full, never expired):
    // none was lost either.
    assert_eq!(
        passed + held + central,
        BURST,
        "passed {passed} + held {held} + central {central}: a refund gave nothing back"
    );
    Ok(())
}

#[test]
fn a_later_rules_denial_gives_the_leased_charge_back_to_its_lease() -> TestResult {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let global = leased(100, 1_000, 10, &clock);
    let tight = RateLimiter::gcra_with_clock(Policy::per_minute(1)?, clock.clone());
    let layer = RateLimitLayer::builder()
        .rule(Rule::shared("global", Arc::clone(&global), Global)?)
        .rule(Rule::new("tight", tight, Global)?)
        .build()?;
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    let r = rt.block_on(layer.layer(Hello).oneshot(request(1)))?;
    assert_eq!(r.status(), 200);
    assert_eq!(global.units_on_lease(), 9);
    // The leased rule's remaining: on a spend from the lease, the units left on it.
    assert_eq!(
        num(&r, "x-ratelimit-remaining"),
        0,
        "the least remaining: tight's"
    );
    let r = rt.block_on(layer.layer(Hello).oneshot(request(1)))?;
    assert_eq!(r.status(), 429);
    assert_eq!(
        global.units_on_lease(),
        9,
        "the denied request's unit came back"
    );
    // The central word is as the first request left it (its lease took 10).
    assert_eq!(global.peek(0).remaining(), 90);
    Ok(())
}

fn hot(clock: &ManualClock) -> Result<Arc<Hot>, Box<dyn std::error::Error>> {
    Ok(Arc::new(HotKeyLimiter::new_in(
        Policy::per_second(1)?.with_burst(20)?,
        KeyedBuilder::default().clock(clock.clone()),
        HotKeys::default().lease_size(4).lease_shards(64).manual(),
    )?))
}

#[test]
fn a_later_rules_denial_refunds_a_hot_key_to_its_lease_and_a_cold_key_exactly() -> TestResult {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let per_client = hot(&clock)?;
    assert!(per_client.promote(&7));
    let tight = KeyedBuilder::new(floodgate::Gcra::new(Policy::per_minute(1)?))
        .clock(clock.clone())
        .build::<u64>()?;
    let layer = RateLimitLayer::builder()
        .rule(Rule::shared(
            "per-client",
            Arc::clone(&per_client),
            from_fn(client),
        )?)
        .rule(Rule::new("tight", tight, from_fn(client))?)
        .build()?;
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    for key in [7, 8] {
        let r = rt.block_on(layer.layer(Hello).oneshot(request(key)))?;
        assert_eq!(r.status(), 200, "key {key}");
    }
    // Hot key 7: a lease of 4, one spent; cold key 8: 19 left.
    assert_eq!(per_client.peek(&7, 0).remaining(), 16, "the central word");
    assert_eq!(per_client.peek(&8, 0).remaining(), 19);
    for key in [7, 8] {
        let r = rt.block_on(layer.layer(Hello).oneshot(request(key)))?;
        assert_eq!(r.status(), 429, "key {key}");
    }
    assert_eq!(
        per_client.peek(&8, 0).remaining(),
        19,
        "the cold refund is exact"
    );
    // The hot refund went back to the lease: three spends without a refill.
    for _ in 0..3 {
        assert!(per_client.check(&7).is_allowed());
    }
    assert_eq!(per_client.peek(&7, 0).remaining(), 16, "no refill");
    assert!(per_client.check(&7).is_allowed());
    assert_eq!(per_client.peek(&7, 0).remaining(), 12, "now a refill");
    Ok(())
}

/// `build(capacity)` builds and `build(capacity + 1)` is refused naming both.
fn refused_above(
    capacity: u32,
    build: impl Fn(u32) -> Result<RateLimitLayer, ConfigError>,
) -> TestResult {
    build(capacity)?;
    let err = build(capacity + 1).expect_err("a cost above the burst");
    assert!(
        matches!(&err, ConfigError::Cost { cost, capacity: c, .. }
            if *cost == capacity + 1 && *c == u64::from(capacity)),
        "{err}"
    );
    Ok(())
}

#[test]
fn a_cost_above_the_burst_is_refused_at_build() -> TestResult {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    refused_above(5, |cost| {
        RateLimitLayer::builder()
            .rule(Rule::shared("global", leased(5, 10, 2, &clock), Global)?.cost(cost))
            .build()
    })?;
    let per_client = hot(&clock)?;
    refused_above(20, |cost| {
        RateLimitLayer::builder()
            .rule(Rule::shared("per-client", Arc::clone(&per_client), from_fn(client))?.cost(cost))
            .build()
    })
}

/// A leased rule's admission shows the whole limit as this thread sees it
/// (`LeasedGcra::report`): its lease units plus the central word's remaining, and
/// the central word's reset — after a refill and after a spend from the lease
/// alike, never the spend's own view (the lease's units, and its lifetime of an
/// hour as the reset).
#[test]
fn a_leased_rules_response_shows_the_whole_limit() -> TestResult {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let global = leased(100, 1_000, 10, &clock);
    let layer = RateLimitLayer::builder()
        .rule(Rule::shared("global", Arc::clone(&global), Global)?)
        .build()?;
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    let send = || rt.block_on(layer.layer(Hello).oneshot(request(1)));
    let r = send()?;
    assert_eq!(num(&r, "x-ratelimit-remaining"), 90 + 9, "a refill");
    let r = send()?;
    assert_eq!(
        num(&r, "x-ratelimit-remaining"),
        90 + 8,
        "a spend from the lease"
    );
    // The central word's schedule: 10 units at 1 ms, idle in 10 ms (1 s rounded up),
    // not the lease's hour.
    assert_eq!(global.peek(0).reset_after_secs(), 1);
    assert_eq!(num(&r, "x-ratelimit-reset"), 1, "{:?}", r.headers());
    let field = r.headers()["ratelimit"].to_str()?;
    assert!(field.contains("r=98") && field.contains("t=1"), "{field}");
    assert_eq!(global.peek(0).remaining(), 90, "the central word");
    assert_eq!(
        global.report().remaining(),
        98,
        "the lease's 8 and the central 90"
    );
    Ok(())
}

/// A hot-key rule's admission shows the key's whole limit (`HotKeyLimiter::report`):
/// after a spend from the lease, the lease's units plus the key's central word and
/// the central word's reset (not the lease's lifetime left, a millisecond by default), as a cold key's
/// response shows its own schedule.
#[test]
fn a_hot_key_rules_response_shows_the_keys_whole_limit() -> TestResult {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let per_client = hot(&clock)?;
    assert!(per_client.promote(&7));
    let layer = RateLimitLayer::builder()
        .rule(Rule::shared(
            "per-client",
            Arc::clone(&per_client),
            from_fn(client),
        )?)
        .build()?;
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    let send = |c| rt.block_on(layer.layer(Hello).oneshot(request(c)));
    let r = send(7)?;
    assert_eq!(num(&r, "x-ratelimit-remaining"), 16 + 3, "a refill of 4");
    let r = send(7)?;
    assert_eq!(
        num(&r, "x-ratelimit-remaining"),
        16 + 2,
        "a spend from the lease"
    );
    // 4 units at 1 s each booked on the key's central word: idle in 4 s.
    assert_eq!(num(&r, "x-ratelimit-reset"), 4, "{:?}", r.headers());
    assert_eq!(per_client.report(&7).remaining(), 18);
    // A cold key shows its own schedule: 19 left, idle in 1 s.
    let r = send(8)?;
    assert_eq!(num(&r, "x-ratelimit-remaining"), 19);
    assert_eq!(num(&r, "x-ratelimit-reset"), 1);
    Ok(())
}

/// Pending once (waking its waker), then ready: a remote limiter's round trip.
struct RoundTrip(bool);

impl Future for RoundTrip {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// A remote limiter that denies every request after one round trip.
struct DeniesAfterARoundTrip;

impl AsyncLimit<()> for DeniesAfterARoundTrip {
    type Error = Infallible;

    async fn check_n(&self, _: &(), _: u32) -> Result<Decision, Infallible> {
        RoundTrip(false).await;
        let minute = Duration::from_secs(60);
        Ok(Decision::new(false, 1, 0, minute, Some(minute)))
    }

    async fn peek_n(&self, _: &(), _: u32) -> Result<Decision, Infallible> {
        Ok(Decision::new(false, 1, 0, Duration::from_secs(60), None))
    }
}

/// Runs `f` on a new thread (its own current-thread runtime where it needs one).
fn on_another_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    thread::scope(|s| s.spawn(f).join().expect("the thread ran"))
}

fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime")
        .block_on(f)
}

#[test]
fn a_remote_denial_after_the_task_moved_threads_gives_the_leased_charge_back() -> TestResult {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let global = leased(100, 1_000, 10, &clock);
    let layer = RateLimitLayer::builder()
        .rule(Rule::shared("global", Arc::clone(&global), Global)?)
        .rule(Rule::remote("redis", DeniesAfterARoundTrip, Global)?)
        .build()?;
    let mut call: Pin<Box<dyn Future<Output = Answer> + Send>> =
        Box::pin(layer.layer(Hello).oneshot(Request::new(())));
    // Thread A: the leased rule charges (its shard leases 10 from the central
    // word), then the remote rule awaits its round trip.
    let call = on_another_thread(move || {
        let mut cx = Context::from_waker(Waker::noop());
        assert!(call.as_mut().poll(&mut cx).is_pending());
        call
    });
    assert_eq!(global.peek(0).remaining(), 90);
    assert_eq!(global.units_held(), 9);
    // Thread B: the remote rule denies; the layer gives the leased charge back.
    let r = on_another_thread(move || block_on(call))?;
    assert_eq!(r.status(), 429);
    assert_eq!(
        global.peek(0).remaining(),
        91,
        "the denied request's unit is back on the central word"
    );
    assert_eq!(global.units_held(), 9, "thread A's lease is untouched");
    Ok(())
}

fn retry_after(r: &Response<Body>) -> u64 {
    r.headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no Retry-After: {:?}", r.headers()))
}

#[test]
fn a_client_that_waits_the_retry_after_of_a_leased_denial_is_admitted_on_another_thread(
) -> TestResult {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    // 10 a burst, 1 a second, leases of 4; every request costs 3.
    let global = leased(10, 1, 4, &clock);
    let layer = RateLimitLayer::builder()
        .rule(Rule::shared("global", Arc::clone(&global), Global)?.cost(3))
        .build()?;
    let call = || block_on(layer.layer(Hello).oneshot(Request::new(())));
    // This thread leases 4 and spends 3 (1 left); the central word has 6.
    assert_eq!(call()?.status(), 200);
    // Another thread leases 4 and spends 3, then spends its 1 and the central 2.
    let (first, second) = on_another_thread(|| {
        let first = call().map(|r| r.status().as_u16());
        (first, call().map(|r| r.status().as_u16()))
    });
    assert_eq!((first?, second?), (200, 200));
    assert_eq!(global.peek(0).remaining(), 0);
    // This thread holds 1 and is short of 2: denied.
    let denied = call()?;
    assert_eq!(denied.status(), 429);
    let wait = retry_after(&denied);
    clock.advance(Duration::from_secs(wait));
    // The client's retry lands on another thread, whose shard holds nothing.
    let retried = on_another_thread(call)?;
    assert_eq!(
        retried.status(),
        200,
        "waited the Retry-After of {wait} s shown, denied again"
    );
    Ok(())
}
