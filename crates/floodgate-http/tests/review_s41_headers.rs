//! Adversarial review (session 41): the promises a client paces itself by, under
//! seeded random request sequences and clock advances, for every in-process rule
//! kind the layer offers.
//!
//! A walk sends requests for a few keys and moves a [`ManualClock`]; now and then it
//! stops to hold a response to its word, with nobody else sending:
//!
//! * **Retry-After is enough**: a 429 with `Retry-After: s`, the clock moved `s`
//!   seconds, the same request again is admitted;
//! * **not needlessly long** (exact rules): at `s − 1` seconds it is still denied;
//! * **Remaining is honest**: `X-RateLimit-Remaining: r`, the clock standing, the
//!   next `r` requests are admitted, the `r + 1`th denied (exact rules; the leased
//!   and hot rules promise the lower bound only);
//! * **Reset**: the largest `RateLimit` `t` later, the least quota `q` of
//!   `RateLimit-Policy` is admitted at once;
//! * `RateLimit-Policy` `q` / `w` are the rule's;
//! * soft and shadow rules never answer 429, and their `remaining` tells when they
//!   start to count requests as over (`RuleStats::soft` / `shadow`).
//!
//! Every seed's failure message replays it: the seed, the step and the trace.

use std::time::Duration;

use floodgate::keyed::plans::{PlanId, PlanLimiter, Plans};
use floodgate::{
    Gcra, HotKeyLimiter, HotKeys, KeyedBuilder, LeasedGcra, ManualClock, Nanos, Policy, RateLimiter,
};
use floodgate_http::{
    from_fn, Global, HeaderOptions, RateLimitLayer, RateLimitService, Rule, Strategy,
};
use http::Request;
use tower::{Layer, ServiceExt};
mod common;
use common::{even_free_odd_pro, key_of, keyed, Hello, Rng, TestResult};

type Error = Box<dyn std::error::Error>;

/// The `RateLimit-Policy` members (name, `q`, `w`) a response for a key must carry.
type Members = fn(u64) -> Vec<(&'static str, u64, Option<u64>)>;

/// What a response told the client.
#[derive(Debug, Clone)]
struct Seen {
    status: u16,
    retry_after: Option<u64>,
    remaining: Option<u64>,
    /// `RateLimit`: (name, r, t) per member.
    limits: Vec<(String, u64, u64)>,
    /// `RateLimit-Policy`: (name, q, w) per member.
    policies: Vec<(String, u64, Option<u64>)>,
}

fn parse_params(member: &str) -> (String, Vec<(String, u64)>) {
    let mut parts = member.split(';');
    let name = parts
        .next()
        .unwrap_or_default()
        .trim_matches('"')
        .to_owned();
    let params = parts
        .filter_map(|p| {
            let (k, v) = p.split_once('=')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect();
    (name, params)
}

fn param(params: &[(String, u64)], key: &str) -> Option<u64> {
    params.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
}

/// One kind of rule (or set of rules) under test.
struct Case {
    name: &'static str,
    layer: RateLimitLayer,
    clock: ManualClock,
    /// Keys 0..keys are sent.
    keys: u64,
    /// `remaining` is exact (the `r + 1`th is denied) and `Retry-After` is the
    /// rounded-up wait (1 s earlier is still denied); else both are bounds.
    exact: bool,
    /// The rule that never blocks (soft or shadow) and whose counter tells when it
    /// would have denied; `None` for hard rules.
    advisory: Option<(&'static str, Strategy)>,
    /// The `RateLimit-Policy` members a response for `key` must carry.
    policy: Members,
}

impl Case {
    /// A case of hard, exact rules, sent two keys; the callers change the rest.
    fn hard(
        name: &'static str,
        layer: RateLimitLayer,
        clock: ManualClock,
        policy: Members,
    ) -> Case {
        Case {
            name,
            layer,
            clock,
            keys: 2,
            exact: true,
            advisory: None,
            policy,
        }
    }
}

struct Walk {
    case: Case,
    svc: RateLimitService<Hello>,
    rt: tokio::runtime::Runtime,
    trace: Vec<String>,
    seed: u64,
}

impl Walk {
    fn new(case: Case, seed: u64) -> Result<Walk, Error> {
        let svc = case.layer.layer(Hello);
        // Tokio's paused clock: a queueing rule's wait for its slot passes at once
        // (the limiters' clock is the walk's own).
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()?;
        Ok(Walk {
            case,
            svc,
            rt,
            trace: Vec::new(),
            seed,
        })
    }

    fn fail(&self, what: String) -> String {
        let tail: Vec<&String> = self.trace.iter().rev().take(12).collect();
        format!(
            "[{}] seed {}: {what}\n  last steps (newest first): {tail:#?}",
            self.case.name, self.seed
        )
    }

    fn advance(&mut self, d: Duration) {
        self.case.clock.advance(d);
        self.trace.push(format!("advance {d:?}"));
    }

    fn advisory_count(&self) -> u64 {
        match self.case.advisory {
            Some((name, strategy)) => {
                let s = self.case.layer.rule_stats(name).unwrap_or_else(|| {
                    panic!("no rule {name}");
                });
                if strategy == Strategy::Soft {
                    s.soft
                } else {
                    s.shadow
                }
            }
            None => 0,
        }
    }

    /// Sends one request for `key`; whether it was admitted (for an advisory rule:
    /// not counted as over it) and what it told.
    fn send(&mut self, key: u64) -> Result<(bool, Seen), String> {
        let before = self.advisory_count();
        let req = Request::builder()
            .header("x-key", key.to_string())
            .body(())
            .map_err(|e| e.to_string())?;
        let resp = self
            .rt
            .block_on(self.svc.clone().oneshot(req))
            .map_err(|e| -> String { match e {} })?;
        let h = resp.headers();
        let text = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let num = |name: &str| text(name).and_then(|v| v.parse::<u64>().ok());
        let mut limits = Vec::new();
        for m in text("ratelimit").unwrap_or_default().split(", ") {
            let (name, params) = parse_params(m);
            if let (Some(r), Some(t)) = (param(&params, "r"), param(&params, "t")) {
                limits.push((name, r, t));
            }
        }
        let mut policies = Vec::new();
        for m in text("ratelimit-policy").unwrap_or_default().split(", ") {
            let (name, params) = parse_params(m);
            if let Some(q) = param(&params, "q") {
                policies.push((name, q, param(&params, "w")));
            }
        }
        let seen = Seen {
            status: resp.status().as_u16(),
            retry_after: num("retry-after"),
            remaining: num("x-ratelimit-remaining"),
            limits,
            policies,
        };
        let over = self.advisory_count() > before;
        let admitted = seen.status == 200 && !over;
        self.trace.push(format!(
            "send key {key} at {:?}: admitted {admitted}, {seen:?}",
            floodgate::Clock::now(&self.case.clock)
        ));
        self.check_response(key, &seen)?;
        Ok((admitted, seen))
    }

    /// What every response must be: a 200 or a 429 with `Retry-After` ≥ 1 (never a
    /// 429 from an advisory rule), the rule's `RateLimit-Policy`.
    fn check_response(&self, key: u64, seen: &Seen) -> Result<(), String> {
        match (seen.status, seen.retry_after) {
            (200, None) => {}
            (429, Some(s)) if s >= 1 && self.case.advisory.is_none() => {}
            _ => return Err(self.fail(format!("a bad answer: {seen:?}"))),
        }
        let want: Vec<(String, u64, Option<u64>)> = (self.case.policy)(key)
            .into_iter()
            .map(|(n, q, w)| (n.to_owned(), q, w))
            .collect();
        // A denial shows the rules up to the one that denied, and the later ones
        // that would deny too.
        let shown = &seen.policies;
        if shown.is_empty() || !shown.iter().all(|m| want.contains(m)) {
            return Err(self.fail(format!(
                "RateLimit-Policy {shown:?}, the rules' are {want:?}"
            )));
        }
        Ok(())
    }

    /// Retry-After is enough (and, exact, not needlessly long).
    fn probe_retry(&mut self, key: u64, s: u64) -> Result<(), String> {
        if self.case.exact && s >= 2 {
            self.advance(Duration::from_secs(s - 1));
            let (admitted, _) = self.send(key)?;
            if admitted {
                return Err(self.fail(format!(
                    "Retry-After: {s} was needlessly long: admitted {} s before it",
                    1
                )));
            }
            self.advance(Duration::from_secs(1));
        } else {
            self.advance(Duration::from_secs(s));
        }
        let (admitted, seen) = self.send(key)?;
        if !admitted {
            return Err(self.fail(format!(
                "denied with Retry-After: {s}, waited {s} s, denied again: {seen:?}"
            )));
        }
        Ok(())
    }

    /// Remaining is honest: `r` admitted, the clock standing; the `r + 1`th denied
    /// where exact.
    fn probe_remaining(&mut self, key: u64, r: u64) -> Result<(), String> {
        for i in 0..r {
            let (admitted, seen) = self.send(key)?;
            if !admitted {
                return Err(self.fail(format!(
                    "Remaining: {r}, but request {} of them was denied: {seen:?}",
                    i + 1
                )));
            }
        }
        if self.case.exact {
            let (admitted, _) = self.send(key)?;
            if admitted {
                return Err(self.fail(format!(
                    "Remaining: {r}, but request {} was admitted too",
                    r + 1
                )));
            }
        }
        Ok(())
    }

    /// Reset: after the longest `t`, the least `q` at once — when the response
    /// listed every rule (a 429 lists the rules up to the one that denied and the
    /// later ones that would deny too: after its `t`, one request at least).
    fn probe_reset(&mut self, key: u64, seen: &Seen) -> Result<(), String> {
        let t = seen.limits.iter().map(|l| l.2).max().unwrap_or(0);
        let all = seen.policies.len() == (self.case.policy)(key).len();
        let q = match seen.policies.iter().map(|p| p.1).min() {
            Some(q) if all => q,
            _ => 1,
        };
        self.advance(Duration::from_secs(t));
        for i in 0..q {
            let (admitted, seen) = self.send(key)?;
            if !admitted {
                return Err(self.fail(format!(
                    "{t} s after reset t = {t}, request {} of the quota {q} denied: {seen:?}",
                    i + 1
                )));
            }
        }
        Ok(())
    }

    fn run(&mut self, steps: usize) -> Result<(), String> {
        let mut rng = Rng(self.seed);
        for _ in 0..steps {
            if rng.below(4) == 0 {
                let ms = rng.below(2_500);
                self.advance(Duration::from_millis(ms));
                continue;
            }
            let key = rng.below(self.case.keys);
            let (admitted, seen) = self.send(key)?;
            match rng.below(6) {
                0 | 1 if !admitted => {
                    if let Some(s) = seen.retry_after {
                        self.probe_retry(key, s)?;
                    }
                }
                2 => {
                    // The legacy trio holds the least remaining of the rules shown.
                    let r = seen
                        .remaining
                        .ok_or_else(|| self.fail("no remaining".into()))?;
                    if r <= 40 {
                        self.probe_remaining(key, r)?;
                    }
                }
                3 => self.probe_reset(key, &seen)?,
                _ => {}
            }
        }
        Ok(())
    }
}

/// Runs `make`'s case over `seeds` seeds.
fn walk_all(make: fn(ManualClock) -> Result<Case, Error>, seeds: u64) -> TestResult {
    let mut failures = Vec::new();
    for seed in 1..=seeds {
        let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
        let mut walk = Walk::new(make(clock)?, seed)?;
        if let Err(e) = walk.run(300) {
            failures.push(e);
        }
    }
    if let Some(first) = failures.first() {
        return Err(format!(
            "{} of {seeds} seeds broke a promise; the first:\n{first}",
            failures.len()
        )
        .into());
    }
    Ok(())
}

fn one_rule<L>(
    name: &'static str,
    limiter: L,
    clock: ManualClock,
    keys: u64,
    policy: Members,
) -> Result<Case, Error>
where
    L: floodgate_http::Charge<u64> + floodgate::AsyncLimit<u64> + Send + Sync + 'static,
{
    let layer = RateLimitLayer::builder()
        .rule(Rule::new(name, limiter, from_fn(key_of))?)
        .build()?;
    Ok(Case {
        keys,
        ..Case::hard(name, layer, clock, policy)
    })
}

/// 5 per 20 s (burst 5): T = 4 s (waits of several seconds), `w` = 20.
fn five_per_twenty() -> Result<Policy, Error> {
    Ok(Policy::new(5, Duration::from_secs(20))?)
}

/// A rule without `window`/`window_of` on a limiter that does not know its window
/// per key: `w` left out.
fn p_five_twenty(_: u64) -> Vec<(&'static str, u64, Option<u64>)> {
    vec![("r", 5, None)]
}

fn gcra_global(clock: ManualClock) -> Result<Case, Error> {
    let limiter = RateLimiter::gcra_with_clock(five_per_twenty()?, clock.clone());
    one_rule("r", limiter, clock, 3, p_five_twenty)
}

fn gcra_keyed(clock: ManualClock) -> Result<Case, Error> {
    let limiter = keyed(Gcra::new(five_per_twenty()?), &clock)?;
    one_rule("r", limiter, clock, 3, p_five_twenty)
}

fn token_bucket(clock: ManualClock) -> Result<Case, Error> {
    // 5 tokens, one more every 4 s.
    let limiter = keyed(Gcra::token_bucket(5, 1, Duration::from_secs(4))?, &clock)?;
    one_rule("r", limiter, clock, 2, p_five_twenty)
}

fn leaky_meter(clock: ManualClock) -> Result<Case, Error> {
    // Holds 5, leaks 5 every 20 s.
    let limiter = RateLimiter::with_clock(
        Gcra::leaky_meter(5, 5, Duration::from_secs(20))?,
        clock.clone(),
    );
    one_rule("r", limiter, clock, 2, p_five_twenty)
}

fn fixed_window(clock: ManualClock) -> Result<Case, Error> {
    let limiter = keyed(floodgate::FixedWindow::new(five_per_twenty()?)?, &clock)?;
    one_rule("r", limiter, clock, 2, p_five_twenty)
}

fn sliding_window(clock: ManualClock) -> Result<Case, Error> {
    let limiter = keyed(floodgate::SlidingWindow::new(five_per_twenty()?)?, &clock)?;
    one_rule("r", limiter, clock, 2, p_five_twenty)
}

fn sliding_log(clock: ManualClock) -> Result<Case, Error> {
    let limiter = KeyedBuilder::default()
        .clock(clock.clone())
        .sliding_log::<u64>(five_per_twenty()?)?;
    one_rule("r", limiter, clock, 2, p_five_twenty)
}

fn p_plans(key: u64) -> Vec<(&'static str, u64, Option<u64>)> {
    // Even keys: free, 5 per 20 s; odd keys: pro, 3 a second, burst 6: T is
    // 333 333 334 ns (rounded up), B·T = 2.000000004 s, `w` = 3.
    if key % 2 == 0 {
        vec![("plan", 5, Some(20))]
    } else {
        vec![("plan", 6, Some(3))]
    }
}

fn plans(clock: ManualClock) -> Result<Case, Error> {
    let limiter = even_free_odd_pro(
        &clock,
        five_per_twenty()?,
        Policy::per_second(3)?.with_burst(6)?,
    )?;
    one_rule("plan", limiter, clock, 4, p_plans)
}

fn p_composite(_: u64) -> Vec<(&'static str, u64, Option<u64>)> {
    vec![
        ("per-key", 5, Some(20)),
        ("global", 8, None),
        ("log", 6, None),
    ]
}

/// Per key GCRA, then a global fixed window (8 per 10 s), then a per-key sliding
/// log (6 per 3 s): three hard rules at once.
fn composite(clock: ManualClock) -> Result<Case, Error> {
    let per_key = keyed(Gcra::new(five_per_twenty()?), &clock)?;
    let global = RateLimiter::fixed_window_with_clock(
        Policy::new(8, Duration::from_secs(10))?,
        clock.clone(),
    )?;
    let log = KeyedBuilder::default()
        .clock(clock.clone())
        .sliding_log::<u64>(Policy::new(6, Duration::from_secs(3))?)?;
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("per-key", per_key, from_fn(key_of))?.window_of(&five_per_twenty()?))
        .rule(Rule::new("global", global, Global)?)
        .rule(Rule::new("log", log, from_fn(key_of))?)
        .build()?;
    Ok(Case {
        keys: 3,
        ..Case::hard("composite", layer, clock, p_composite)
    })
}

fn p_leased(_: u64) -> Vec<(&'static str, u64, Option<u64>)> {
    vec![("leased", 5, Some(20))]
}

fn leased(clock: ManualClock) -> Result<Case, Error> {
    let limiter = LeasedGcra::builder(five_per_twenty()?)
        .shards(4)
        .lease_size(2)
        .lifetime(Duration::from_secs(3_600))
        .build_with_clock(clock.clone())?;
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("leased", limiter, Global)?.window_of(&five_per_twenty()?))
        .build()?;
    Ok(Case {
        exact: false,
        ..Case::hard("leased", layer, clock, p_leased)
    })
}

fn p_hot(_: u64) -> Vec<(&'static str, u64, Option<u64>)> {
    vec![("hot", 5, Some(20))]
}

fn hot(clock: ManualClock) -> Result<Case, Error> {
    let limiter = HotKeyLimiter::<u64, ManualClock>::new_in(
        five_per_twenty()?,
        KeyedBuilder::default().clock(clock.clone()),
        HotKeys::default().lease_size(2).lease_shards(64).manual(),
    )?;
    // Key 0 hot, keys 1 and 2 cold.
    assert!(limiter.promote(&0));
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("hot", limiter, from_fn(key_of))?.window_of(&five_per_twenty()?))
        .build()?;
    Ok(Case {
        keys: 3,
        exact: false,
        ..Case::hard("hot", layer, clock, p_hot)
    })
}

fn p_soft(_: u64) -> Vec<(&'static str, u64, Option<u64>)> {
    vec![("warn", 5, Some(20))]
}

fn advisory(clock: ManualClock, strategy: Strategy) -> Result<Case, Error> {
    let limiter = keyed(Gcra::new(five_per_twenty()?), &clock)?;
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::new("warn", limiter, from_fn(key_of))?
                .strategy(strategy)
                .window_of(&five_per_twenty()?),
        )
        .headers(HeaderOptions::default().include_shadow(true))
        .build()?;
    Ok(Case {
        advisory: Some(("warn", strategy)),
        ..Case::hard("advisory", layer, clock, p_soft)
    })
}

fn soft(clock: ManualClock) -> Result<Case, Error> {
    advisory(clock, Strategy::Soft)
}

fn shadow(clock: ManualClock) -> Result<Case, Error> {
    advisory(clock, Strategy::Shadow)
}

const SEEDS: u64 = 24;

#[test]
fn gcra_global_keeps_its_word() -> TestResult {
    walk_all(gcra_global, SEEDS)
}

#[test]
fn gcra_per_key_keeps_its_word() -> TestResult {
    walk_all(gcra_keyed, SEEDS)
}

#[test]
fn token_bucket_keeps_its_word() -> TestResult {
    walk_all(token_bucket, SEEDS)
}

#[test]
fn leaky_meter_keeps_its_word() -> TestResult {
    walk_all(leaky_meter, SEEDS)
}

#[test]
fn fixed_window_keeps_its_word() -> TestResult {
    walk_all(fixed_window, SEEDS)
}

#[test]
fn sliding_window_counter_keeps_its_word() -> TestResult {
    walk_all(sliding_window, SEEDS)
}

#[test]
fn sliding_log_keeps_its_word() -> TestResult {
    walk_all(sliding_log, SEEDS)
}

#[test]
fn plans_keep_their_word() -> TestResult {
    walk_all(plans, SEEDS)
}

#[test]
fn several_rules_at_once_keep_their_word() -> TestResult {
    walk_all(composite, SEEDS)
}

#[test]
fn leased_global_rule_keeps_its_word() -> TestResult {
    walk_all(leased, SEEDS)
}

#[test]
fn hot_key_rule_keeps_its_word() -> TestResult {
    walk_all(hot, SEEDS)
}

#[test]
fn soft_rule_never_429s_and_its_remaining_is_true() -> TestResult {
    walk_all(soft, SEEDS)
}

#[test]
fn shadow_rule_never_429s_and_its_remaining_is_true() -> TestResult {
    walk_all(shadow, SEEDS)
}

/// Found by the walk (several rules at once): the 429 spoke for the first rule that
/// denied only. A client that waited out its `Retry-After: 1` was denied again by a
/// later rule that was already spent when the 429 was written (and which that 429's
/// `RateLimit` did not even list), now with `Retry-After: 9`.
#[test]
fn a_429s_retry_after_waited_out_is_not_denied_by_a_later_rule_already_spent() -> TestResult {
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    // Per key: 2 a second (burst 2). Global: 3 per 10 s, a fixed window.
    let per_key = keyed(Gcra::new(Policy::per_second(2)?), &clock)?;
    let global = RateLimiter::fixed_window_with_clock(
        Policy::new(3, Duration::from_secs(10))?,
        clock.clone(),
    )?;
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("per-key", per_key, from_fn(key_of))?)
        .rule(Rule::new("global", global, Global)?)
        .build()?;
    let case = Case::hard("per-key then global", layer, clock, |_| {
        vec![("per-key", 2, None), ("global", 3, None)]
    });
    let mut walk = Walk::new(case, 0)?;
    // Key 1 spends its burst, key 2 the global window's last unit.
    for key in [1, 1, 2] {
        assert!(walk.send(key)?.0);
    }
    let (admitted, seen) = walk.send(1)?;
    assert!(!admitted);
    // The global window ends in 10 s: that is the wait.
    assert_eq!(seen.retry_after, Some(10), "{seen:?}");
    assert!(
        seen.limits.iter().any(|l| l.0 == "global" && l.1 == 0),
        "the 429's RateLimit lists the spent later rule: {seen:?}"
    );
    walk.probe_retry(1, 10)?;
    Ok(())
}

/// Four fresh threads send four requests each for key 0 (their leases taken
/// first), and the last 429's `Retry-After` waited out, a fresh thread's first
/// request is admitted; six rounds, the clock moved a little more each.
fn retry_after_is_enough_on_any_thread(layer: &RateLimitLayer, clock: &ManualClock) -> TestResult {
    // Sends `n` requests on a new thread; the last 429's Retry-After.
    let burst_on_new_thread = |n: usize| -> Option<u64> {
        let layer = layer.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("a runtime");
            let mut last = None;
            for _ in 0..n {
                let req = Request::builder().header("x-key", "0").body(());
                let resp = rt
                    .block_on(layer.layer(Hello).oneshot(req.expect("a request")))
                    .expect("infallible");
                if resp.status() == 429 {
                    last = resp
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok()?.parse().ok());
                }
            }
            last
        })
        .join()
        .expect("a sender thread")
    };
    for round in 0..6u64 {
        let mut retry = None;
        for _ in 0..4 {
            retry = burst_on_new_thread(4).or(retry);
        }
        let s = retry.ok_or("four threads of four requests each saw no 429")?;
        clock.advance(Duration::from_secs(s));
        assert_eq!(
            burst_on_new_thread(1),
            None,
            "round {round}: Retry-After: {s} waited out, denied again on another thread"
        );
        clock.advance(Duration::from_millis(round * 700));
    }
    Ok(())
}

/// 4 per 8 s: waits of seconds, so a `Retry-After` one second short is not enough.
fn four_per_eight() -> Result<Policy, Error> {
    Ok(Policy::new(4, Duration::from_secs(8))?)
}

/// The leased global rule's `Retry-After` is the central word's wait for the whole
/// cost: a denial seen on one thread, waited out, is admitted on any other thread.
#[test]
fn a_leased_rules_retry_after_waited_out_is_admitted_on_another_thread() -> TestResult {
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let leased = LeasedGcra::builder(four_per_eight()?)
        .shards(8)
        .lease_size(3)
        .lifetime(Duration::from_secs(3_600))
        .build_with_clock(clock.clone())?;
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("leased", leased, Global)?)
        .build()?;
    retry_after_is_enough_on_any_thread(&layer, &clock)
}

/// The same for a hot key of a `HotKeyLimiter` (its lease limiter's central word).
#[test]
fn a_hot_keys_retry_after_waited_out_is_admitted_on_another_thread() -> TestResult {
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let hot = HotKeyLimiter::<u64, ManualClock>::new_in(
        four_per_eight()?,
        KeyedBuilder::default().clock(clock.clone()),
        HotKeys::default().lease_size(3).lease_shards(8).manual(),
    )?;
    assert!(hot.promote(&0));
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("hot", hot, from_fn(key_of))?)
        .build()?;
    retry_after_is_enough_on_any_thread(&layer, &clock)
}

/// The queueing rules (feature `queue`): a request waits for its slot up to a bound
/// (6 s here); a slot further away is a 429 whose `Retry-After` is the wait until
/// it is within the bound.
#[cfg(feature = "queue")]
mod queues {
    use super::*;
    use floodgate::Shaper;
    use floodgate_http::{KeyedQueueRule, QueueRule};

    const BOUND: Duration = Duration::from_secs(6);

    fn p_queue(_: u64) -> Vec<(&'static str, u64, Option<u64>)> {
        vec![("queue", 5, Some(20))]
    }

    fn global_queue(clock: ManualClock) -> Result<Case, Error> {
        let shaper = Shaper::with_clock(five_per_twenty()?, clock.clone());
        let layer = RateLimitLayer::builder()
            .queue(QueueRule::new("queue", shaper, BOUND)?)
            .build()?;
        Ok(Case::hard("queue", layer, clock, p_queue))
    }

    fn keyed_queue(clock: ManualClock) -> Result<Case, Error> {
        let limiter = keyed(Gcra::new(five_per_twenty()?), &clock)?;
        let layer = RateLimitLayer::builder()
            .queue_per_key(KeyedQueueRule::new(
                "queue",
                from_fn(key_of),
                limiter,
                BOUND,
            )?)
            .build()?;
        Ok(Case::hard("keyed queue", layer, clock, p_queue))
    }

    fn priority(clock: ManualClock) -> Result<Case, Error> {
        let shaper = Shaper::with_clock(five_per_twenty()?, clock.clone());
        // Even keys tier 0, odd keys tier 1; two places each.
        let tier =
            from_fn(|parts: &http::request::Parts| key_of(parts).map(|k| usize::from(k % 2 == 1)));
        let layer = RateLimitLayer::builder()
            .priority(floodgate_http::PriorityRule::new(
                "queue",
                shaper,
                &[2, 2],
                tier,
            )?)
            .build()?;
        // Its bound is in places, not time: a client alone is never refused, only
        // made to wait, and `remaining` (the shaper's headroom now) is a lower bound.
        Ok(Case {
            exact: false,
            ..Case::hard("priority", layer, clock, p_queue)
        })
    }

    #[test]
    fn a_priority_queue_keeps_its_word() -> TestResult {
        walk_all(priority, SEEDS)
    }

    #[test]
    fn a_global_queue_keeps_its_word() -> TestResult {
        walk_all(global_queue, SEEDS)
    }

    #[test]
    fn a_keyed_queue_keeps_its_word() -> TestResult {
        walk_all(keyed_queue, SEEDS)
    }
}

/// The peek at a later plan rule (for a 429's `Retry-After`) keeps the plan rule's
/// promise of one resolver run per request, and shows the plan it peeked.
#[test]
fn a_plan_rule_peeked_after_a_denial_runs_its_resolver_once() -> TestResult {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let calls = Arc::new(AtomicU32::new(0));
    let mut plans = Plans::new();
    let free = plans.insert("free", Policy::new(2, Duration::from_secs(60))?);
    let counted = Arc::clone(&calls);
    let resolver = move |_: &u64| -> PlanId {
        counted.fetch_add(1, Ordering::SeqCst);
        free
    };
    let plan = PlanLimiter::new(
        &plans,
        resolver,
        KeyedBuilder::default().clock(clock.clone()),
    )?;
    // The first rule: one a second per key.
    let first = keyed(Gcra::new(Policy::per_second(1)?), &clock)?;
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("first", first, from_fn(key_of))?)
        .rule(Rule::new("plan", plan, from_fn(key_of))?)
        .build()?;
    let case = Case::hard("first then plan", layer, clock, |_| {
        vec![("first", 1, None), ("plan", 2, Some(60))]
    });
    let mut walk = Walk::new(case, 0)?;
    // Two seconds apart: both rules admit, the plan's two units are spent.
    assert!(walk.send(1)?.0);
    walk.advance(Duration::from_secs(2));
    assert!(walk.send(1)?.0);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    // "first" denies (1 s); the plan would deny for 28 s (T = 30 s: its units were
    // spent at 0 s and 2 s, the next is free at 30 s).
    let (admitted, seen) = walk.send(1)?;
    assert!(!admitted);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "one run for the denied request"
    );
    assert_eq!(seen.retry_after, Some(28), "{seen:?}");
    Ok(())
}
