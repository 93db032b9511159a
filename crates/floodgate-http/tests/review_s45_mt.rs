//! Session 45 (httpmt): the layer under real concurrency. Many requests at once
//! through one service on a multi-thread Tokio runtime (4 workers, 8 tasks that
//! start together at a barrier), over a stack of in-process rules of every
//! algorithm: a per-key GCRA, a per-route sliding log, a global fixed window and a
//! global GCRA. Every limiter stands on one `ManualClock`, so the counts are exact
//! whatever the scheduling: nothing refills during a storm.
//!
//! What is checked, per storm: no rule admits beyond its limit; a denied request
//! leaves every earlier rule as if it never came — exactly on the window and log
//! rules (their refunds are counts), and never more than that on a GCRA rule (see
//! below); the counters add up; every response's headers agree with the decision
//! (a 429 has `Retry-After` and `X-RateLimit-Remaining: 0`; a 200's
//! `X-RateLimit-Remaining` is the least of its `RateLimit` members; the remaining
//! the last rule showed is exactly its count, an earlier rule's never above it);
//! and a 429 of a storm where nothing can pass tells a wait at least every rule's.
//!
//! Finding (in the core): a GCRA refund made after the refund of a *later* charge
//! on the same limiter gave back nothing — the ledger's shift counted that later
//! refund as having moved the earlier booking, which it did not. Two requests of
//! one client turned away at once by a later rule, their refunds landing in the
//! reverse of their charges' order, left the client one unit short (until the
//! clock refilled it); the storms saw it as a per-key `remaining` below its exact
//! count. **Fixed** where the later charge was still the limiter's last booking
//! when given back (session 45, "order"): [`two_denials_refunded_out_of_order`].
//! Where a third charge was booked after it, the loss stays (open, documented).
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use floodgate::{
    FixedWindow, Gcra, KeyedBuilder, KeyedLimiter, KeyedSlidingLog, ManualClock, Policy,
    RateLimiter,
};
use floodgate_http::{from_fn, KeyError, RateLimitLayer, RateLimitService, Rule};
use http::request::Parts;
use http::{HeaderMap, Request};
use tower::{Layer, ServiceExt};
mod common;
use common::{key_of, Hello, Rng};
#[path = "common/tasks.rs"]
mod tasks;
use tasks::{at_once, deny_at_the_gate, runtime, Gate};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// The request's route: the `x-route` header.
fn route_of(parts: &Parts) -> Result<u64, KeyError> {
    parts
        .headers
        .get("x-route")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or(KeyError::missing("x-route"))
}

/// What one response said.
#[derive(Clone, Debug)]
struct Seen {
    key: u64,
    route: u64,
    status: u16,
    retry_after: Option<u64>,
    remaining: Option<u64>,
    /// The `RateLimit` members: name → (r, t).
    limits: BTreeMap<String, (u64, u64)>,
}

/// Reads `name=value` of one member's parameters.
fn param(member: &str, name: &str) -> Option<u64> {
    member.split(';').skip(1).find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        (k == name).then(|| v.parse().ok()).flatten()
    })
}

fn seen(key: u64, route: u64, status: u16, h: &HeaderMap) -> Seen {
    let text = |n: &str| h.get(n).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let num = |n: &str| text(n).and_then(|v| v.parse::<u64>().ok());
    let mut limits = BTreeMap::new();
    for m in text("ratelimit").unwrap_or_default().split(", ") {
        let name = m
            .split(';')
            .next()
            .unwrap_or("")
            .trim_matches('"')
            .to_owned();
        if let (Some(r), Some(t)) = (param(m, "r"), param(m, "t")) {
            limits.insert(name, (r, t));
        }
    }
    Seen {
        key,
        route,
        status,
        retry_after: num("retry-after"),
        remaining: num("x-ratelimit-remaining"),
        limits,
    }
}

/// The four rules of the stack, kept to read their state.
struct Stack {
    per_key: Arc<KeyedLimiter<u64, Gcra, ManualClock>>,
    per_route: Arc<KeyedSlidingLog<u64, ManualClock>>,
    window: Arc<RateLimiter<FixedWindow, ManualClock>>,
    global: Arc<RateLimiter<Gcra, ManualClock>>,
    clock: ManualClock,
    layer: RateLimitLayer,
    svc: RateLimitService<Hello>,
}

const PER_KEY: u64 = 3;
const PER_ROUTE: u64 = 7;
const WINDOW: u64 = 14;
const GLOBAL: u64 = 11;
const KEYS: u64 = 10;
const ROUTES: u64 = 3;

/// "per-key" (GCRA, 3 an hour, `x-key`), "per-route" (sliding log, 7 an hour,
/// `x-route`), "window" (fixed window, 14 an hour), "global" (GCRA, 11 an hour,
/// burst 11): all hard, in that order, on one standing clock.
fn stack() -> Result<Stack, Box<dyn std::error::Error + Send + Sync>> {
    let clock = ManualClock::new();
    // Far from 0, so the fixed window's period is well inside the clock's range.
    clock.advance(Duration::from_secs(7 * 3600));
    let per_key = Arc::new(KeyedLimiter::gcra_with_clock(
        Policy::per_hour(PER_KEY)?,
        clock.clone(),
    ));
    let per_route = Arc::new(
        KeyedBuilder::default()
            .clock(clock.clone())
            .sliding_log::<u64>(Policy::per_hour(PER_ROUTE)?)?,
    );
    let window = Arc::new(RateLimiter::fixed_window_with_clock(
        Policy::per_hour(WINDOW)?,
        clock.clone(),
    )?);
    let global = Arc::new(RateLimiter::gcra_with_clock(
        Policy::per_hour(GLOBAL)?,
        clock.clone(),
    ));
    let layer = RateLimitLayer::builder()
        .rule(Rule::shared(
            "per-key",
            Arc::clone(&per_key),
            from_fn(key_of),
        )?)
        .rule(Rule::shared(
            "per-route",
            Arc::clone(&per_route),
            from_fn(route_of),
        )?)
        .rule(Rule::shared(
            "window",
            Arc::clone(&window),
            floodgate_http::Global,
        )?)
        .rule(Rule::shared(
            "global",
            Arc::clone(&global),
            floodgate_http::Global,
        )?)
        .build()?;
    let svc = layer.layer(Hello);
    Ok(Stack {
        per_key,
        per_route,
        window,
        global,
        clock,
        layer,
        svc,
    })
}

/// Sends `per_task` requests from each of `tasks` tasks at once (a barrier first),
/// each of a key and a route drawn from the task's seeded stream: every response.
async fn storm(
    svc: &RateLimitService<Hello>,
    tasks: usize,
    per_task: u64,
    seed: u64,
) -> Result<Vec<Seen>, String> {
    at_once(tasks, |t| {
        let svc = svc.clone();
        async move {
            let mut rng = Rng(seed ^ ((t as u64) << 32));
            let mut out = Vec::new();
            for _ in 0..per_task {
                let (key, route) = (rng.below(KEYS), rng.below(ROUTES));
                let req = Request::get("/")
                    .header("x-key", key.to_string())
                    .header("x-route", route.to_string())
                    .body(())
                    .map_err(|e| e.to_string())?;
                let resp = tasks::send(&svc, req).await?;
                out.push(seen(key, route, resp.status().as_u16(), resp.headers()));
                // Interleave the tasks on the workers.
                tokio::task::yield_now().await;
            }
            Ok(out)
        }
    })
    .await
}

/// The admitted requests' remainings shown for `rule`, most first: the i-th may be
/// at most `limit − 1 − i` (each admission charged while every admission before it
/// in the limiter's order still held; a refunded one never reached the service).
fn never_overstated(admitted: &[&Seen], rule: &str, limit: u64, exact: bool) -> TestResult {
    let mut shown: Vec<u64> = admitted
        .iter()
        .map(|s| {
            s.limits
                .get(rule)
                .map(|l| l.0)
                .ok_or(format!("{rule} missing"))
        })
        .collect::<Result<_, _>>()?;
    shown.sort_unstable_by(|a, b| b.cmp(a));
    for (i, r) in (0u64..).zip(&shown) {
        let bound = limit - 1 - i;
        if exact {
            assert_eq!(
                *r, bound,
                "{rule}: the last rule's admissions are its count: {shown:?}"
            );
        } else {
            assert!(*r <= bound, "{rule}: remaining overstated: {shown:?}");
        }
    }
    Ok(())
}

/// Every response of a storm: a 200 or a 429, each with consistent headers.
fn check_responses(all: &[Seen]) {
    for s in all {
        match s.status {
            200 => {
                assert_eq!(s.retry_after, None, "{s:?}");
                assert_eq!(s.limits.len(), 4, "every rule shown: {s:?}");
                let least = s.limits.values().map(|l| l.0).min();
                assert_eq!(s.remaining, least, "the trio is the least member: {s:?}");
            }
            429 => {
                assert!(s.retry_after.is_some_and(|r| r >= 1), "{s:?}");
                assert_eq!(s.remaining, Some(0), "{s:?}");
                // The denier is shown, spent.
                assert!(s.limits.values().any(|l| l.0 == 0), "{s:?}");
            }
            other => panic!("unexpected status {other}: {s:?}"),
        }
    }
}

/// A storm of 8 tasks × 40 requests over 10 keys and 3 routes, then its checks:
/// the bounds, the state of every limiter afterwards (all refunds made, none
/// more), the counters, and the headers.
///
/// Mutations seen failing: the refunds on a hard denial removed (`held.give_back`
/// in `decide`'s denial path: the log and the window keep the denied requests'
/// charges); the `X-RateLimit-*` trio of a 200 picking the rule with the most
/// `remaining` instead of the least (`render`).
#[test]
fn a_storm_over_four_rules_admits_within_each_and_refunds_every_denial() -> TestResult {
    let rt = runtime()?;
    let mut lost = 0;
    for seed in [1, 2, 3] {
        let s = stack()?;
        let all = rt.block_on(storm(&s.svc, 8, 40, seed))?;
        check_responses(&all);
        let admitted: Vec<&Seen> = all.iter().filter(|s| s.status == 200).collect();
        let total = admitted.len() as u64;
        assert!(total <= GLOBAL.min(WINDOW), "{total} admitted");
        assert!(total >= 1, "someone passes");
        for k in 0..KEYS {
            let mine: Vec<&Seen> = admitted.iter().copied().filter(|s| s.key == k).collect();
            let n = mine.len() as u64;
            assert!(n <= PER_KEY, "key {k}: {n}");
            // Never more than the exact count: a refund never gives back another
            // request's unit. (Exactly the count but for the open finding above: a
            // refund after a later charge's refund gives back nothing.)
            let left = s.per_key.peek(&k, 0).remaining();
            assert!(left <= PER_KEY - n, "key {k}: {left} left, {n} admitted");
            lost += PER_KEY - n - left;
            never_overstated(&mine, "per-key", PER_KEY, false)?;
        }
        for r in 0..ROUTES {
            let mine: Vec<&Seen> = admitted.iter().copied().filter(|s| s.route == r).collect();
            let n = mine.len() as u64;
            assert!(n <= PER_ROUTE, "route {r}: {n}");
            assert_eq!(
                s.per_route.peek(&r, 0).remaining(),
                PER_ROUTE - n,
                "route {r}"
            );
            never_overstated(&mine, "per-route", PER_ROUTE, false)?;
        }
        assert_eq!(s.window.peek(0).remaining(), WINDOW - total, "window");
        assert_eq!(s.global.peek(0).remaining(), GLOBAL - total, "global");
        never_overstated(&admitted, "window", WINDOW, false)?;
        never_overstated(&admitted, "global", GLOBAL, true)?;
        // The counters: each rule decides what the rules before it admitted.
        let stats = s.layer.stats();
        let denied: u64 = stats.iter().map(|r| r.denied).sum();
        assert_eq!(denied, all.len() as u64 - total);
        let mut reached = all.len() as u64;
        for r in &stats {
            assert_eq!(r.allowed + r.denied, reached, "{r:?}");
            reached = r.allowed;
        }
        assert_eq!(reached, total);
    }
    eprintln!("per-key units lost to out-of-order refunds over the storms: {lost}");
    Ok(())
}

/// After a storm, every key spent: a second storm where nothing can pass (the clock
/// stands) is all 429s, each with a `Retry-After` at least the wait of every rule
/// that would deny it, read from the limiters themselves (their state the same
/// before and after the storm), and a client that waits out the longest
/// `Retry-After` told passes.
///
/// Mutation seen failing: the later rules not peeked on a denial (`later_denials`
/// answering the first denial: "per-key"'s 1 200 s where the window needs 3 600 s).
#[test]
fn a_storm_of_denials_tells_each_client_a_wait_every_rule_keeps() -> TestResult {
    let rt = runtime()?;
    let s = stack()?;
    let first = rt.block_on(storm(&s.svc, 8, 40, 7))?;
    let passed = first.iter().filter(|x| x.status == 200).count() as u64;
    // Spend what is left of the global limit, so that nothing can pass.
    assert!(passed <= GLOBAL);
    // Spend every key, so that the storm below is denied by the first rule and
    // charges nothing (no refund races: see the open finding above); its 429s
    // must still speak for the later rules' longer waits.
    for k in 0..KEYS {
        while s.per_key.peek(&k, 0).remaining() > 0 {
            assert!(s.per_key.charge(&k, 1).0.is_allowed());
        }
    }
    let state = || {
        (
            s.global.peek(0),
            s.window.peek(0),
            (0..KEYS).map(|k| s.per_key.peek(&k, 0)).collect::<Vec<_>>(),
            (0..ROUTES)
                .map(|r| s.per_route.peek(&r, 0))
                .collect::<Vec<_>>(),
        )
    };
    let before = state();
    let second = rt.block_on(storm(&s.svc, 8, 30, 8))?;
    check_responses(&second);
    assert!(second.iter().all(|x| x.status == 429), "nothing passes");
    let after = state();
    assert_eq!(before, after, "the denials charged nothing");
    let secs = |d: floodgate::Decision| d.retry_after_secs();
    for x in &second {
        let waits = [
            secs(s.per_key.peek(&x.key, 1)),
            secs(s.per_route.peek(&x.route, 1)),
            secs(s.window.peek(1)),
            secs(s.global.peek(1)),
        ];
        let longest = waits.iter().flatten().max().copied().unwrap_or(0);
        assert!(
            x.retry_after.is_some_and(|r| r >= longest),
            "Retry-After below a rule's wait ({waits:?}): {x:?}"
        );
    }
    // Waiting out the longest Retry-After told: every rule admits again.
    let longest = second
        .iter()
        .filter_map(|x| x.retry_after)
        .max()
        .unwrap_or(0);
    s.clock.advance(Duration::from_secs(longest));
    let x = &second[0];
    let again = rt.block_on(async {
        let req = Request::get("/")
            .header("x-key", x.key.to_string())
            .header("x-route", x.route.to_string())
            .body(())?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(s.svc.clone().oneshot(req).await?)
    })?;
    assert_eq!(again.status(), 200);
    Ok(())
}

/// Two requests of user "u" charged in "per-key" (GCRA, 3 an hour, standing
/// clock), both held by the gate, then turned away (429) in `order`: what "u" has
/// left afterwards.
fn two_denials(order: [&str; 2]) -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
    let clock = ManualClock::new();
    let per_key = Arc::new(KeyedLimiter::<String, Gcra, ManualClock>::gcra_with_clock(
        Policy::per_hour(3)?,
        clock,
    ));
    let gate = Arc::new(Gate::default());
    let layer = RateLimitLayer::builder()
        .rule(Rule::shared(
            "per-key",
            Arc::clone(&per_key),
            floodgate_http::HeaderKey::new("x-user")?,
        )?)
        .rule(Rule::remote_shared(
            "gate",
            Arc::clone(&gate),
            floodgate_http::HeaderKey::new("x-req")?,
        )?)
        .build()?;
    let mut svc = layer.layer(Hello);
    deny_at_the_gate(&mut svc, &gate, order, || {
        assert_eq!(per_key.peek("u", 0).remaining(), 1, "both charged");
    })?;
    Ok(per_key.peek("u", 0).remaining())
}

/// Two denied requests of one client, refunded in their charges' order: the
/// client has all 3 units back.
///
/// Mutation seen failing: the refunds on a hard denial removed (`held.give_back`
/// in `decide`'s denial path: 1 left).
#[test]
fn two_denials_refunded_in_order() -> TestResult {
    assert_eq!(two_denials(["a", "b"])?, 3);
    Ok(())
}

/// The same two denials, the later charge refunded first (B's gate opens first, as
/// a concurrent later rule may answer): the client has all 3 units back. Before
/// session 45 ("order") it had 2: the earlier charge's refund counted B's refund
/// as having moved its own booking (the core ledger's shift), though B's booking
/// was the last and its refund moved nobody.
///
/// Mutation seen failing: `Gcra::refund_moves_later` always `true` (2 back).
#[test]
fn two_denials_refunded_out_of_order() -> TestResult {
    assert_eq!(two_denials(["b", "a"])?, 3);
    Ok(())
}
