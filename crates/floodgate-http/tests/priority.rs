//! Priority queueing (feature `queue`): one queue per tier on Tokio's paused clock,
//! which also drives the shaper, so every slot time is exact and no test sleeps.

use std::sync::Arc;
use std::time::Duration;

use floodgate::{Policy, Shaper};
use floodgate_http::{from_fn, PriorityRule, RateLimitLayer, RateLimitService};
use http::Request;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tower::{Layer, Service};
mod common;
use common::{tier, Hello, TestResult, TokioClock};

/// 10 per second, one at a time (slots 100 ms apart); `bounds` waiters per tier.
fn layer(start: Instant, bounds: &[usize]) -> Result<RateLimitLayer, Box<dyn std::error::Error>> {
    let policy = Policy::per_second(10)?.with_burst(1)?;
    let shaper = Shaper::with_clock(policy, TokioClock { start });
    Ok(RateLimitLayer::builder()
        .priority(PriorityRule::new("smooth", shaper, bounds, from_fn(tier))?)
        .build()?)
}

type Outcome = (u16, Duration);

/// Sends a request of `tier` and lets it reach its queue before returning.
async fn arrive(svc: &RateLimitService<Hello>, start: Instant, tier: usize) -> JoinHandle<Outcome> {
    let mut svc = svc.clone();
    let req = Request::builder()
        .header("x-tier", tier.to_string())
        .body(())
        .expect("request");
    let task = tokio::spawn(async move {
        let resp = svc.call(req).await.expect("infallible");
        (resp.status().as_u16(), start.elapsed())
    });
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
    task
}

const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[tokio::test(start_paused = true)]
async fn the_higher_tier_goes_first_and_fifo_holds_within_a_tier() -> TestResult {
    let start = Instant::now();
    let layer = layer(start, &[4, 4])?;
    let svc = layer.layer(Hello);
    let a = arrive(&svc, start, 0).await; // the free slot at 0
    let b = arrive(&svc, start, 0).await; // holds the slot at 100 ms
    let c = arrive(&svc, start, 0).await;
    let d = arrive(&svc, start, 0).await;
    let p = arrive(&svc, start, 1).await; // pro, after c and d
    let q = arrive(&svc, start, 1).await;
    assert_eq!(a.await?, (200, ms(0)));
    assert_eq!(b.await?, (200, ms(100)));
    // Both pro requests overtake the free ones that were waiting; each tier is FIFO.
    assert_eq!(p.await?, (200, ms(200)));
    assert_eq!(q.await?, (200, ms(300)));
    assert_eq!(c.await?, (200, ms(400)));
    assert_eq!(d.await?, (200, ms(500)));
    let s = layer.rule_stats("smooth").ok_or("rule")?;
    assert_eq!((s.allowed, s.queued, s.denied), (6, 5, 0));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_sheds_the_lower_tier_first() -> TestResult {
    let start = Instant::now();
    let layer = layer(start, &[2, 1])?;
    let svc = layer.layer(Hello);
    let a = arrive(&svc, start, 0).await; // at once
    let b = arrive(&svc, start, 0).await; // holds 100 ms
    let c = arrive(&svc, start, 0).await; // free queue: b, c (full)
                                          // A third free request finds its queue full and nobody lower to shed: refused.
    let e = arrive(&svc, start, 0).await;
    assert_eq!(e.await?, (429, ms(0)));
    let p = arrive(&svc, start, 1).await; // pro queue: p (full)
                                          // A second pro request sheds the newest free waiter that holds no slot: c.
    let q = arrive(&svc, start, 1).await;
    assert_eq!(c.await?, (429, ms(0)));
    assert_eq!(a.await?, (200, ms(0)));
    assert_eq!(b.await?, (200, ms(100)));
    assert_eq!(p.await?, (200, ms(200)));
    assert_eq!(q.await?, (200, ms(300)));
    let s = layer.rule_stats("smooth").ok_or("rule")?;
    assert_eq!((s.allowed, s.queued, s.denied), (4, 3, 2));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_shed_or_refused_request_says_when_to_retry() -> TestResult {
    let start = Instant::now();
    let layer = layer(start, &[1])?;
    let mut svc = layer.layer(Hello);
    let _a = arrive(&svc, start, 0).await;
    let _b = arrive(&svc, start, 0).await;
    let req = Request::builder().header("x-tier", "0").body(())?;
    let resp = svc.call(req).await?;
    assert_eq!(resp.status(), 429);
    // One waiter ahead: two slots (200 ms) away, rounded up to 1 s.
    assert_eq!(resp.headers()["retry-after"], "1");
    assert_eq!(resp.headers()["ratelimit-policy"], r#""smooth";q=1;w=1"#);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_leaves_its_queue_and_its_slot() -> TestResult {
    let start = Instant::now();
    let layer = layer(start, &[4, 4])?;
    let svc = layer.layer(Hello);
    let a = arrive(&svc, start, 0).await;
    let b = arrive(&svc, start, 0).await; // holds 100 ms
    let c = arrive(&svc, start, 0).await;
    let d = arrive(&svc, start, 1).await; // next after b
    tokio::time::sleep(ms(10)).await;
    b.abort();
    d.abort();
    assert!(b.await.is_err_and(|e| e.is_cancelled()));
    assert!(d.await.is_err_and(|e| e.is_cancelled()));
    assert_eq!(a.await?, (200, ms(0)));
    // b's slot at 100 ms came back and goes to c, the only one left.
    assert_eq!(c.await?, (200, ms(100)));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn no_tier_is_tier_zero_and_no_bounds_is_an_error() -> TestResult {
    let start = Instant::now();
    let layer = layer(start, &[1, 1])?;
    let mut svc = layer.layer(Hello);
    // Missing and out-of-range tiers both count as tier 0, and both as a bad key (a
    // classifier naming a plan the rule lacks shows in the counters).
    assert_eq!(svc.call(Request::new(())).await?.status(), 200);
    let req = Request::builder().header("x-tier", "9").body(())?;
    let held = tokio::spawn({
        let mut svc = svc.clone();
        async move { svc.call(req).await.map(|r| r.status().as_u16()) }
    });
    tokio::task::yield_now().await;
    let req = Request::builder().header("x-tier", "0").body(())?;
    assert_eq!(
        svc.call(req).await?.status(),
        429,
        "tier 0's one place is taken"
    );
    assert_eq!(held.await??, 200);
    assert_eq!(layer.rule_stats("smooth").ok_or("rule")?.bad_key, 2);

    let policy = Policy::per_second(1)?;
    let shaper = Arc::new(Shaper::with_clock(policy, TokioClock { start }));
    let err = PriorityRule::shared("p", shaper, &[], from_fn(tier)).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"priority rule "p": bounds is empty; give one per tier"#
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn shedding_never_grows_the_queues_past_their_bounds() -> TestResult {
    let start = Instant::now();
    // Three places in all: two free, one pro.
    let layer = layer(start, &[2, 1])?;
    let svc = layer.layer(Hello);
    let mut tasks = vec![
        arrive(&svc, start, 0).await, // at once
        arrive(&svc, start, 0).await, // holds 100 ms
        arrive(&svc, start, 0).await, // the second free place
    ];
    // Pro and free requests in turn: each pro one that finds its place taken sheds a
    // free waiter, and a free one takes the place that shedding seemed to free.
    for _ in 0..10 {
        tasks.push(arrive(&svc, start, 1).await);
        tasks.push(arrive(&svc, start, 0).await);
    }
    let mut admitted = Vec::new();
    for t in tasks {
        let (status, at) = t.await?;
        if status == 200 {
            admitted.push(at);
        }
    }
    // At most three wait at once besides the one served at 0: the last slot is
    // at 300 ms, and no request waits longer.
    assert!(admitted.len() <= 4, "{admitted:?}");
    assert!(admitted.iter().all(|at| *at <= ms(300)), "{admitted:?}");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_refusal_behind_a_lower_tier_holder_is_not_told_to_retry_early() -> TestResult {
    let start = Instant::now();
    // One place per tier, slots 1 s apart, so Retry-After shows whole slots.
    let policy = Policy::per_second(1)?.with_burst(1)?;
    let shaper = Shaper::with_clock(policy, TokioClock { start });
    let layer = RateLimitLayer::builder()
        .priority(PriorityRule::new("smooth", shaper, &[1, 1], from_fn(tier))?)
        .build()?;
    let mut svc = layer.layer(Hello);
    let _a = arrive(&svc, start, 0).await; // at once; the next slot is at 1 s
    let _b = arrive(&svc, start, 0).await; // free, holds the slot at 1 s
    let _p = arrive(&svc, start, 1).await; // pro, takes the slot at 2 s
    let req = Request::builder().header("x-tier", "1").body(())?;
    let resp = svc.call(req).await?;
    assert_eq!(resp.status(), 429);
    // b's slot (1 s) and p's (2 s) go first: with nothing else, this request fits
    // at 3 s, not at 2 s.
    assert_eq!(resp.headers()["retry-after"], "3");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_queued_admission_reports_what_remains_at_its_slot() -> TestResult {
    let start = Instant::now();
    let layer = layer(start, &[4])?;
    let mut svc = layer.layer(Hello);
    let first = svc.call(Request::builder().header("x-tier", "0").body(())?);
    assert_eq!(first.await?.headers()["ratelimit"], r#""smooth";r=0;t=1"#);
    // The second waits for its slot at 100 ms; when it goes, the bucket (burst 1)
    // is empty again: nothing remains, as for the first.
    let second = svc.call(Request::builder().header("x-tier", "0").body(())?);
    let resp = second.await?;
    assert_eq!(start.elapsed(), ms(100));
    assert_eq!(resp.headers()["ratelimit"], r#""smooth";r=0;t=1"#);
    assert_eq!(resp.headers()["x-ratelimit-remaining"], "0");
    Ok(())
}

/// Random arrivals in three tiers, some cancelled while they wait, on the paused
/// clock (a fixed xorshift per seed): after each arrival no more than the sum of the
/// bounds wait, and tier `i` at most the places of tiers `0..=i`; admissions keep
/// the shaper's spacing (100 ms at burst 1, whoever was shed or cancelled); a 429
/// comes at an arrival's instant (refused at once, or shed by the newcomer); and
/// every request ends.
#[tokio::test(start_paused = true)]
async fn random_arrivals_and_cancellations_keep_every_bound() -> TestResult {
    let bounds = [3, 2, 1];
    let places: usize = bounds.iter().sum();
    for seed in 1..=24_u64 {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let start = Instant::now();
        let layer = layer(start, &bounds)?;
        let svc = layer.layer(Hello);
        let mut running: Vec<(usize, Option<Duration>, JoinHandle<Outcome>)> = Vec::new();
        let mut arrivals = Vec::new();
        for _ in 0..60 {
            tokio::time::sleep(ms(next(80))).await;
            let now = start.elapsed();
            for (_, cancel_at, task) in &mut running {
                if cancel_at.is_some_and(|at| at <= now) {
                    task.abort();
                    *cancel_at = None;
                }
            }
            let tier = usize::try_from(next(3))?;
            let cancel_at = (next(4) == 0).then(|| now + ms(next(400)));
            arrivals.push(now);
            running.push((tier, cancel_at, arrive(&svc, start, tier).await));
            let mut waiting = [0; 3];
            for (tier, _, task) in &running {
                if !task.is_finished() {
                    waiting[*tier] += 1;
                }
            }
            assert!(
                waiting.iter().sum::<usize>() <= places,
                "seed {seed}: {waiting:?}"
            );
            for tier in 0..bounds.len() {
                let room: usize = bounds[..=tier].iter().sum();
                assert!(waiting[tier] <= room, "seed {seed}: {waiting:?}");
            }
        }
        let mut admitted = Vec::new();
        for (_, _, task) in running {
            match task.await {
                Ok((200, at)) => admitted.push(at),
                Ok((429, at)) => assert!(arrivals.contains(&at), "seed {seed}: 429 at {at:?}"),
                Ok(other) => panic!("seed {seed}: {other:?}"),
                Err(e) => assert!(e.is_cancelled(), "seed {seed}: {e}"),
            }
        }
        admitted.sort();
        for pair in admitted.windows(2) {
            assert!(pair[1] - pair[0] >= ms(100), "seed {seed}: {admitted:?}");
        }
    }
    Ok(())
}

/// A cost above the burst, which no slot can hold, is refused when the layer is
/// built, naming the rule, the cost and the burst; at the burst it is taken.
#[test]
fn a_cost_above_the_burst_is_refused_when_built() -> TestResult {
    let start = Instant::now();
    let shaper = || -> Result<_, floodgate::PolicyError> {
        Ok(Shaper::with_clock(
            Policy::per_second(10)?.with_burst(2)?,
            TokioClock { start },
        ))
    };
    let err = RateLimitLayer::builder()
        .priority(PriorityRule::new("smooth", shaper()?, &[1], from_fn(tier))?.cost(3))
        .build()
        .expect_err("cost 3 > burst 2");
    assert_eq!(
        err,
        floodgate_http::ConfigError::Cost {
            rule: "smooth".into(),
            cost: 3,
            capacity: 2
        }
    );
    RateLimitLayer::builder()
        .priority(PriorityRule::new("smooth", shaper()?, &[1], from_fn(tier))?.cost(2))
        .build()?;
    Ok(())
}
