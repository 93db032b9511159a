//! Adversarial review (session 42) of the day's floodgate-http changes: a 429 speaks
//! for the rule `later_denials` picks, its `X-RateLimit-Remaining` is a least, a
//! queued admission is answered with the schedule at its slot, a queue's refusal
//! counts its units as an admission does.
//!
//! The word a client is held to is the one the session's own tests use: a
//! `remaining r` counts **units**, so a "twin" layer on the same limiters charging
//! 1 unit per rule passes exactly `r` requests (the `r + 1`th is denied).
//!
//! * **The trio and the members**: a 429's trio is the longest denial's `Limit` and
//!   reset with the least `Remaining`; each `RateLimit` member stays its own rule's.
//! * **Found here**: the least was taken over the *denying* rules only. A hard rule
//!   the request passed can hold fewer units: an earlier remote rule keeps the charge
//!   it took (even at one cost for every rule), and a hard rule charging less than
//!   the denying one admits with fewer units than the denier has left. The 429 said
//!   `Remaining: 2` where the twin's first request was denied.
//! * Soft and shadow rules spent to 0 never lower it (they do not block).
//! * **Queues**: a refusal's `remaining` is exact in units (it counts the wait bound,
//!   as an admission does); an unbounded wait on a day-long slot answers without
//!   overflow.
//! * **The admit path** peeks no rule (the new work is all on the denial path).

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use floodgate::{AsyncLimit, Decision, Gcra, ManualClock, Nanos, Policy, RateLimiter, Receipt};
use floodgate_http::{
    Charge, Global, HeaderOptions, RateLimitLayer, RateLimitService, Rule, Strategy,
};
use tower::Layer;
mod common;
use common::{send_key, Hello, TestResult};

type Error = Box<dyn std::error::Error>;

/// A global GCRA limiter on a manual clock.
type Gl = RateLimiter<Gcra, ManualClock>;

/// What a response told the client.
#[derive(Debug, Clone)]
struct Seen {
    status: u16,
    retry_after: Option<u64>,
    limit: Option<u64>,
    remaining: Option<u64>,
    reset: Option<u64>,
    /// The `RateLimit` members: (name, `r`, `t`).
    members: Vec<(String, u64, u64)>,
}

impl Seen {
    /// The `RateLimit` member of rule `name`: (`r`, `t`).
    fn member(&self, name: &str) -> Option<(u64, u64)> {
        self.members
            .iter()
            .find(|m| m.0 == name)
            .map(|m| (m.1, m.2))
    }
}

/// `"name";r=R;t=T, …` as (name, R, T).
fn members(field: &str) -> Vec<(String, u64, u64)> {
    field
        .split(", ")
        .filter(|m| !m.is_empty())
        .filter_map(|m| {
            let mut parts = m.split(';');
            let name = parts.next()?.trim_matches('"').to_owned();
            let (mut r, mut t) = (None, None);
            for p in parts {
                match p.split_once('=') {
                    Some(("r", v)) => r = v.parse().ok(),
                    Some(("t", v)) => t = v.parse().ok(),
                    _ => {}
                }
            }
            Some((name, r?, t?))
        })
        .collect()
}

/// Sends one request (key `x-key: key`): what it was told.
async fn send(svc: &RateLimitService<Hello>, key: u64) -> Result<Seen, Error> {
    let (status, h) = send_key(svc, key).await?;
    let text = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
    let num = |name: &str| text(name).parse::<u64>().ok();
    Ok(Seen {
        status,
        retry_after: num("retry-after"),
        limit: num("x-ratelimit-limit"),
        remaining: num("x-ratelimit-remaining"),
        reset: num("x-ratelimit-reset"),
        members: members(text("ratelimit")),
    })
}

fn block_on<F: Future>(f: F) -> Result<F::Output, Error> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?
        .block_on(f))
}

/// A global GCRA of `limit` units per `secs` seconds (burst `limit`) on `clock`.
fn gcra(limit: u64, secs: u64, clock: &ManualClock) -> Result<Arc<Gl>, Error> {
    let policy = Policy::new(limit, Duration::from_secs(secs))?;
    Ok(Arc::new(RateLimiter::gcra_with_clock(
        policy,
        clock.clone(),
    )))
}

/// A hard in-process rule on `limiter` charging `cost`.
fn hard(name: &str, limiter: &Arc<Gl>, cost: u32) -> Result<Rule<Gl, Global>, Error> {
    Ok(Rule::shared(name, Arc::clone(limiter), Global)?.cost(cost))
}

/// Spends `units` of `limiter` now.
fn spend(limiter: &Gl, units: u32) -> TestResult {
    let (d, _) = Charge::<()>::charge(limiter, &(), units);
    if d.is_allowed() {
        Ok(())
    } else {
        Err(format!("could not spend {units}: {d:?}").into())
    }
}

/// The word `remaining r` put to the test on the twin (every rule at 1 unit): `r`
/// requests pass, the next one is denied.
fn holds(twin: &RateLimitService<Hello>, told: &Seen) -> TestResult {
    let r = told.remaining.ok_or("no X-RateLimit-Remaining")?;
    for i in 0..r {
        let s = block_on(send(twin, 0))??;
        if s.status != 200 {
            return Err(format!("told {told:?}; twin request {i} of {r}: {s:?}").into());
        }
    }
    let s = block_on(send(twin, 0))??;
    if s.status == 200 {
        return Err(format!("told {told:?}; twin request {r} (one past the word) passed").into());
    }
    Ok(())
}

/// The trio on a 429 is the longest denial's `Limit` and reset with the least
/// `Remaining` of the denying rules; each `RateLimit` member stays its own rule's
/// decision (the least is written into the trio only).
///
/// `a` (3 per 3 s) and `b` (4 per 60 s), both at cost 3: after one request `a` has
/// 0 units (ready in 3 s), `b` 1 unit (ready in 30 s for 3, full in 45 s).
#[test]
fn a_429s_trio_takes_the_least_and_each_member_stays_its_own() -> TestResult {
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let (a, b) = (gcra(3, 3, &clock)?, gcra(4, 60, &clock)?);
    let svc = RateLimitLayer::builder()
        .rule(hard("a", &a, 3)?)
        .rule(hard("b", &b, 3)?)
        .build()?
        .layer(Hello);
    assert_eq!(block_on(send(&svc, 0))??.status, 200);
    let seen = block_on(send(&svc, 0))??;
    assert_eq!(seen.status, 429, "{seen:?}");
    // `b` holds the request back longest: its wait, limit and reset.
    assert_eq!(seen.retry_after, Some(30), "{seen:?}");
    assert_eq!((seen.limit, seen.reset), (Some(4), Some(45)), "{seen:?}");
    // The least remaining: `a`'s 0.
    assert_eq!(seen.remaining, Some(0), "{seen:?}");
    // Each member its own, as the limiters themselves say.
    let own = |l: &Gl| Charge::<()>::peek(l, &(), 0).remaining();
    assert_eq!(seen.member("a").map(|m| m.0), Some(own(&a)), "{seen:?}");
    assert_eq!(seen.member("b"), Some((own(&b), 45)), "{seen:?}");
    assert_eq!(own(&b), 1);
    Ok(())
}

/// Found here: an earlier **remote** rule keeps the charge it took for a request a
/// later in-process rule denies. `r` (remote, 3 per 3 s) admits the request with its
/// last 3 units; `a` (in-process, 5 per 50 s, 2 units left) denies it. The 429 said
/// `X-RateLimit-Remaining: 2` (the least of the rules that *deny*), and the twin's
/// first request was denied by `r`, which had 0.
#[test]
fn a_429s_remaining_counts_an_earlier_remote_rules_kept_charge() -> TestResult {
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let (r, a) = (gcra(3, 3, &clock)?, gcra(5, 50, &clock)?);
    let layer = |cost: u32| -> Result<RateLimitService<Hello>, Error> {
        Ok(RateLimitLayer::builder()
            .rule(Rule::remote_shared("r", Arc::clone(&r), Global)?.cost(cost))
            .rule(hard("a", &a, cost)?)
            .build()?
            .layer(Hello))
    };
    let (svc, twin) = (layer(3)?, layer(1)?);
    assert_eq!(block_on(send(&svc, 0))??.status, 200);
    // `r` is full again, `a` still has 2 units.
    clock.advance(Duration::from_secs(3));
    let seen = block_on(send(&svc, 0))??;
    assert_eq!(seen.status, 429, "{seen:?}");
    assert_eq!(seen.member("a").map(|m| m.0), Some(2), "{seen:?}");
    assert_eq!(seen.member("r").map(|m| m.0), Some(0), "{seen:?}");
    assert_eq!(seen.remaining, Some(0), "{seen:?}");
    holds(&twin, &seen)
}

/// Found here: rules at different costs. `cheap` (cost 1) has 1 unit, `dear`
/// (cost 4) has 3: `cheap` admits the request and `dear` denies it, and the 429
/// said `Remaining: 3` — the twin's second request was denied by `cheap`. The
/// same with `cheap` after `dear` (peeked: it would admit, so it was left out).
#[test]
fn a_429s_remaining_counts_a_cheaper_hard_rule_that_would_admit() -> TestResult {
    for cheap_first in [true, false] {
        let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
        let (cheap, dear) = (gcra(5, 5, &clock)?, gcra(8, 8, &clock)?);
        spend(&cheap, 4)?;
        spend(&dear, 5)?;
        let layer = |c: u32, d: u32| -> Result<RateLimitService<Hello>, Error> {
            let (c, d) = (hard("cheap", &cheap, c)?, hard("dear", &dear, d)?);
            let b = RateLimitLayer::builder();
            let b = if cheap_first {
                b.rule(c).rule(d)
            } else {
                b.rule(d).rule(c)
            };
            Ok(b.build()?.layer(Hello))
        };
        let (svc, twin) = (layer(1, 4)?, layer(1, 1)?);
        let seen = block_on(send(&svc, 0))??;
        assert_eq!(seen.status, 429, "cheap first: {cheap_first}; {seen:?}");
        assert_eq!(
            seen.remaining,
            Some(1),
            "cheap first: {cheap_first}; {seen:?}"
        );
        holds(&twin, &seen).map_err(|e| format!("cheap first: {cheap_first}: {e}"))?;
    }
    Ok(())
}

/// Soft and shadow rules spent to 0, before and after the denial, never lower a
/// 429's `Remaining`: they block nothing (the twin passes as many as the hard rules
/// hold). Shadow rules are made visible, so every one of them is in the headers.
#[test]
fn soft_and_shadow_rules_spent_do_not_lower_a_429s_remaining() -> TestResult {
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let (s1, sh, s2) = (
        gcra(2, 2, &clock)?,
        gcra(2, 2, &clock)?,
        gcra(2, 2, &clock)?,
    );
    let (a, b) = (gcra(3, 3, &clock)?, gcra(4, 60, &clock)?);
    for l in [&s1, &sh, &s2] {
        spend(l, 2)?;
    }
    spend(&a, 1)?;
    spend(&b, 2)?;
    let layer = |cost: u32| -> Result<RateLimitService<Hello>, Error> {
        Ok(RateLimitLayer::builder()
            .rule(hard("s1", &s1, 1)?.strategy(Strategy::Soft))
            .rule(hard("sh", &sh, 1)?.strategy(Strategy::Shadow))
            .rule(hard("a", &a, cost)?)
            .rule(hard("s2", &s2, 1)?.strategy(Strategy::Soft))
            .rule(hard("b", &b, cost)?)
            .headers(HeaderOptions::default().include_shadow(true))
            .build()?
            .layer(Hello))
    };
    let (svc, twin) = (layer(3)?, layer(1)?);
    let seen = block_on(send(&svc, 0))??;
    assert_eq!(seen.status, 429, "{seen:?}");
    // `b` (2 units, 15 s for 3) holds it back longest; `a` has 2 units too.
    assert_eq!(seen.retry_after, Some(15), "{seen:?}");
    assert_eq!(seen.member("s1").map(|m| m.0), Some(0), "{seen:?}");
    assert_eq!(seen.member("sh").map(|m| m.0), Some(0), "{seen:?}");
    assert_eq!(seen.remaining, Some(2), "{seen:?}");
    holds(&twin, &seen)
}

/// A limiter that counts how often it is peeked.
struct Counted {
    inner: Gl,
    peeks: AtomicUsize,
}

impl Charge<()> for Counted {
    fn charge(&self, key: &(), cost: u32) -> (Decision, Receipt) {
        Charge::<()>::charge(&self.inner, key, cost)
    }

    fn refund(&self, key: &(), receipt: Receipt) -> bool {
        Charge::<()>::refund(&self.inner, key, receipt)
    }

    fn peek(&self, key: &(), cost: u32) -> Decision {
        self.peeks.fetch_add(1, Ordering::Relaxed);
        Charge::<()>::peek(&self.inner, key, cost)
    }
}

impl AsyncLimit<()> for Counted {
    type Error = Infallible;

    fn check_n(
        &self,
        key: &(),
        cost: u32,
    ) -> impl Future<Output = Result<Decision, Infallible>> + Send {
        AsyncLimit::<()>::check_n(&self.inner, key, cost)
    }

    fn peek_n(
        &self,
        key: &(),
        cost: u32,
    ) -> impl Future<Output = Result<Decision, Infallible>> + Send {
        self.peeks.fetch_add(1, Ordering::Relaxed);
        AsyncLimit::<()>::peek_n(&self.inner, key, cost)
    }
}

/// The day's changes added work on the denial path only: an admitted request peeks
/// no rule (each is charged once), and a denied one peeks the rules after the one
/// that denied (and, for its headers, the earlier ones it gave a charge back to).
#[test]
fn an_admitted_request_peeks_no_rule() -> TestResult {
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let counted = |limit: u64| -> Result<Arc<Counted>, Error> {
        let policy = Policy::new(limit, Duration::from_secs(limit))?;
        Ok(Arc::new(Counted {
            inner: RateLimiter::gcra_with_clock(policy, clock.clone()),
            peeks: AtomicUsize::new(0),
        }))
    };
    let (first, second, third) = (counted(100)?, counted(3)?, counted(100)?);
    let svc = RateLimitLayer::builder()
        .rule(Rule::shared("first", Arc::clone(&first), Global)?)
        .rule(Rule::shared("second", Arc::clone(&second), Global)?)
        .rule(Rule::shared("third", Arc::clone(&third), Global)?)
        .build()?
        .layer(Hello);
    let peeks = || [&first, &second, &third].map(|c| c.peeks.load(Ordering::Relaxed));
    for _ in 0..3 {
        assert_eq!(block_on(send(&svc, 0))??.status, 200);
    }
    assert_eq!(peeks(), [0, 0, 0], "admissions peeked");
    // `second` denies: `first` is given back its charge (and peeked for its
    // headers), `third` is peeked, `second` is not.
    assert_eq!(block_on(send(&svc, 0))??.status, 429);
    let [f, s, t] = peeks();
    assert!(f > 0 && s == 0 && t > 0, "{:?}", [f, s, t]);
    Ok(())
}

/// The queueing rules (feature `queue`) on Tokio's paused clock, which drives the
/// shapers too: every slot is exact.
#[cfg(feature = "queue")]
mod queues {
    use super::*;
    use common::{key_of, TokioClock};
    use floodgate::{KeyedBuilder, KeyedLimiter, Shaper};
    use floodgate_http::{from_fn, KeyedQueueRule, QueueRule};
    use tokio::task::JoinHandle;
    use tokio::time::Instant;

    /// 10 per second (slots 100 ms apart), burst 3, waits of at most 1 s.
    const MAX_DELAY: Duration = Duration::from_secs(1);

    fn policy() -> Result<Policy, Error> {
        Ok(Policy::per_second(10)?.with_burst(3)?)
    }

    /// One request for key 0 on its own task.
    fn spawn(svc: &RateLimitService<Hello>) -> JoinHandle<Result<Seen, String>> {
        let svc = svc.clone();
        tokio::spawn(async move { send(&svc, 0).await.map_err(|e| e.to_string()) })
    }

    /// `svc` (cost 3) and `twin` (cost 1) on one schedule: four cost-3 requests book
    /// every slot within the bound but 1 unit (TAT 1.2 s ahead of 1.3 s); the fifth
    /// is refused, told `remaining 1`; then, at the same instant, 1 cost-1 request
    /// passes on the twin (it waits 1 s) and the next is refused.
    ///
    /// Seen failing with a refusal's remaining counted without the wait bound (the
    /// code before 8b2bfae: `remaining 0`, and the twin's request then passed).
    async fn refusal_is_exact(
        svc: RateLimitService<Hello>,
        twin: RateLimitService<Hello>,
    ) -> TestResult {
        let booked: Vec<_> = (0..4).map(|_| spawn(&svc)).collect();
        let refused = spawn(&svc).await??;
        assert_eq!(refused.status, 429, "{refused:?}");
        // The same reservation fits 200 ms on: Retry-After rounds up to 1 s.
        assert_eq!(refused.retry_after, Some(1), "{refused:?}");
        assert_eq!(refused.remaining, Some(1), "{refused:?}");
        let probes: Vec<_> = (0..2).map(|_| spawn(&twin)).collect();
        let mut statuses = Vec::new();
        for p in probes {
            statuses.push(p.await??.status);
        }
        assert_eq!(statuses, [200, 429], "told {refused:?}");
        for b in booked {
            assert_eq!(b.await??.status, 200);
        }
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_queue_refusals_remaining_is_exact_in_units() -> TestResult {
        let start = Instant::now();
        let shaper = Arc::new(Shaper::with_clock(policy()?, TokioClock { start }));
        let layer = |cost: u32| -> Result<RateLimitService<Hello>, Error> {
            let rule = QueueRule::shared("queue", Arc::clone(&shaper), MAX_DELAY)?.cost(cost);
            Ok(RateLimitLayer::builder().queue(rule).build()?.layer(Hello))
        };
        refusal_is_exact(layer(3)?, layer(1)?).await
    }

    #[tokio::test(start_paused = true)]
    async fn a_per_key_queue_refusals_remaining_is_exact_in_units() -> TestResult {
        let start = Instant::now();
        let limiter: Arc<KeyedLimiter<u64, Gcra, TokioClock>> = Arc::new(
            KeyedBuilder::new(Gcra::new(policy()?))
                .clock(TokioClock { start })
                .build::<u64>()?,
        );
        let layer = |cost: u32| -> Result<RateLimitService<Hello>, Error> {
            let rule =
                KeyedQueueRule::shared("queue", from_fn(key_of), Arc::clone(&limiter), MAX_DELAY)?
                    .cost(cost);
            Ok(RateLimitLayer::builder()
                .queue_per_key(rule)
                .build()?
                .layer(Hello))
        };
        refusal_is_exact(layer(3)?, layer(1)?).await
    }

    /// One unit a day, waits unbounded (`Duration::MAX`): the second request waits a
    /// day and is answered, at its slot, `remaining 1` (a third would be queued: the
    /// burst caps it) and a reset of a day — `B·T + max_delay` past `u64` saturates.
    ///
    /// Seen failing (an overflow panic) with `schedule_now` adding the wait bound
    /// with `+`.
    async fn a_day_long_slot(svc: RateLimitService<Hello>) -> TestResult {
        let first = spawn(&svc).await??;
        assert_eq!((first.status, first.remaining), (200, Some(1)), "{first:?}");
        let second = spawn(&svc).await??;
        assert_eq!(second.status, 200, "{second:?}");
        assert_eq!(second.remaining, Some(1), "{second:?}");
        assert_eq!(
            second.member("queue").map(|m| m.1),
            Some(86_400),
            "{second:?}"
        );
        Ok(())
    }

    fn one_a_day() -> Result<Policy, Error> {
        Ok(Policy::new(1, Duration::from_secs(86_400))?)
    }

    #[tokio::test(start_paused = true)]
    async fn an_unbounded_wait_on_a_day_long_slot_does_not_overflow() -> TestResult {
        let start = Instant::now();
        let shaper = Shaper::with_clock(one_a_day()?, TokioClock { start });
        let rule = QueueRule::new("queue", shaper, Duration::MAX)?;
        a_day_long_slot(RateLimitLayer::builder().queue(rule).build()?.layer(Hello)).await
    }

    #[tokio::test(start_paused = true)]
    async fn an_unbounded_per_key_wait_on_a_day_long_slot_does_not_overflow() -> TestResult {
        let start = Instant::now();
        let limiter = KeyedBuilder::new(Gcra::new(one_a_day()?))
            .clock(TokioClock { start })
            .build::<u64>()?;
        let rule = KeyedQueueRule::new("queue", from_fn(key_of), limiter, Duration::MAX)?;
        let layer = RateLimitLayer::builder().queue_per_key(rule).build()?;
        a_day_long_slot(layer.layer(Hello)).await
    }
}
