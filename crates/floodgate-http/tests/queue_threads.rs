//! The queue strategy and the priority tiers under real concurrency: a multi-threaded
//! runtime, many requests at once on one key and on several, some dropped (the client
//! went away) while they wait. The shapers run on the production clock
//! ([`DefaultClock`]) and the inner service reads the same clock when it is called,
//! so each check below is sound whatever the scheduling delays: a request reaches the
//! inner service at or after its slot, so the requests seen there by instant `t`
//! number at most what the policy admits from the first arrival to `t`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::{poll_fn, ready, Future, Ready};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use floodgate::{Clock, DefaultClock, Gcra, KeyedBuilder, Policy, Shaper};
use floodgate_http::{
    from_fn, HeaderKey, KeyedQueueRule, PriorityRule, QueueRule, RateLimitLayer, Rule,
};
use http::{Request, Response};
use tower::{Layer, Service};
mod common;
use common::tier;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// One request that reached the inner service: its key and when.
#[derive(Clone, Debug)]
struct Seen {
    key: String,
    at: u64,
}

/// Records every call the moment it is made (before any response future exists), so
/// a request dropped after it was admitted is counted too.
#[derive(Clone)]
struct Recorder {
    clock: DefaultClock,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Each served request's key and when its first poll returned (see [`storms`]).
    polled: Arc<Mutex<Vec<(String, u64)>>>,
}

impl Recorder {
    fn new(clock: DefaultClock) -> Recorder {
        Recorder {
            clock,
            seen: Arc::new(Mutex::new(Vec::new())),
            polled: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Every call recorded so far.
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The first polls of the served requests of `key` ("" for all), each moved
    /// `ahead` on (see [`assert_slots_within`]).
    fn polled(&self, key: &str, ahead: Duration) -> Vec<u64> {
        let ahead = ahead.as_nanos() as u64;
        let polled = self.polled.lock().unwrap();
        let mine = polled.iter().filter(|(k, _)| key.is_empty() || k == key);
        mine.map(|(_, at)| at + ahead).collect()
    }
}

impl Service<Request<()>> for Recorder {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<()>) -> Self::Future {
        let at = self.clock.now().as_u64();
        let key = api_key(&req);
        self.seen.lock().unwrap().push(Seen { key, at });
        ready(Ok(Response::new("ok".to_owned())))
    }
}

/// A request's `x-api-key` ("" without one).
fn api_key(req: &Request<()>) -> String {
    let key = req.headers().get("x-api-key").and_then(|v| v.to_str().ok());
    key.unwrap_or("").to_owned()
}

/// What became of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Served,
    /// 429 with a `Retry-After`.
    Refused,
    /// The client went away first.
    Dropped,
    /// Anything else (a bug).
    Other(u16),
}

/// A small deterministic generator (no dev-dependency for randomness).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
}

/// Storms at most this many times: see [`storms`].
const STORMS: u64 = 8;

/// A storm: sends `n` requests, four every `4·gap`, each with headers from
/// `headers(i)`; a third of them give up after a random 0–`drop_max`. Storms again
/// (the seed moved on), [`STORMS`] times at most, until `exercised` holds of every
/// outcome so far: whether one storm fills the queues, has clients leave mid-queue
/// and serves enough depends on the machine's timing (a sender descheduled between
/// its groups sends below the rate, and nothing queues; workers that stall serve a
/// storm's requests all at once). The bounds checked after it are over every call
/// since `start`, as sound for several storms as for one. Each served request's
/// key (`x-api-key`) and the instant its first poll returned go to `recorder`.
/// Returns each request's outcome.
#[allow(clippy::too_many_arguments)]
async fn storms<S>(
    svc: S,
    recorder: &Recorder,
    clock: DefaultClock,
    n: usize,
    gap: Duration,
    drop_max: Duration,
    seed: u64,
    headers: impl Fn(usize) -> Vec<(&'static str, String)>,
    exercised: impl Fn(&[Outcome]) -> bool,
) -> Result<Vec<Outcome>, Box<dyn std::error::Error + Send + Sync>>
where
    S: Service<Request<()>, Response = Response<floodgate_http::RateLimitBody<String>>>
        + Clone
        + Send
        + 'static,
    S::Error: std::fmt::Debug + Send,
    S::Future: Send + 'static,
{
    let mut out = Vec::new();
    for round in 0..STORMS {
        let mut rng = Lcg(seed + round);
        let mut tasks = Vec::with_capacity(n);
        for i in 0..n {
            let mut b = Request::builder();
            for (name, value) in headers(i) {
                b = b.header(name, value);
            }
            let req = b.body(())?;
            let key = api_key(&req);
            let mut call = Box::pin(svc.clone().call(req));
            let give_up = (rng.next() % 3 == 0)
                .then(|| Duration::from_micros(rng.next() % (drop_max.as_micros() as u64 + 1)));
            let served = Arc::clone(&recorder.polled);
            tasks.push(tokio::spawn(async move {
                // The queue decides in the first poll: refused, or a slot booked.
                let first = poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
                let polled = clock.now().as_u64();
                let resp = match (first, give_up) {
                    (Poll::Ready(r), _) => r,
                    (Poll::Pending, Some(after)) => match tokio::time::timeout(after, call).await {
                        Ok(r) => r,
                        Err(_) => return Outcome::Dropped,
                    },
                    (Poll::Pending, None) => call.await,
                };
                let resp = resp.expect("the layer's service is infallible here");
                match resp.status().as_u16() {
                    200 => {
                        served.lock().unwrap().push((key, polled));
                        Outcome::Served
                    }
                    429 if resp.headers().contains_key("retry-after") => Outcome::Refused,
                    other => Outcome::Other(other),
                }
            }));
            if !gap.is_zero() && i % 4 == 3 {
                tokio::time::sleep(gap * 4).await;
            }
        }
        for t in tasks {
            out.push(t.await?);
        }
        if exercised(&out) {
            break;
        }
    }
    Ok(out)
}

/// Whether the outcomes so far include a refusal and a client that left, and
/// `recorder` saw more than `min` calls of each of `keys`.
fn exercised(out: &[Outcome], recorder: &Recorder, keys: &[&str], min: usize) -> bool {
    let seen = recorder.seen();
    out.contains(&Outcome::Refused)
        && out.contains(&Outcome::Dropped)
        && keys
            .iter()
            .all(|k| seen.iter().filter(|s| s.key == *k).count() > min)
}

/// Property (1) for one schedule: by each instant a request reached the inner service,
/// at most `B + (instant − start)/T` had (GCRA from a full bucket at `start`).
fn assert_within_gcra(times: &mut [u64], start: u64, burst: u64, interval: u64, what: &str) {
    times.sort_unstable();
    for (j, &t) in times.iter().enumerate() {
        let admits = burst + t.saturating_sub(start) / interval;
        assert!(
            (j as u64) < admits,
            "{what}: {} requests reached the service by {} µs after the start; the policy admits {admits}",
            j + 1,
            t.saturating_sub(start) / 1_000
        );
    }
}

/// Property (2) whatever the scheduling delays: a queue admits a request only with
/// its slot at most `max_delay` after it decides, and it decides in the request's
/// first poll, so the served requests polled by `x` (each of `polled` is such a
/// first poll moved `max_delay` on) have their slots by `x + max_delay`: at most
/// `B + (x + max_delay − start)/T` of them. (Measured to the call, as before, a
/// wait also counted the workers' stalls after the slot: a 300 ms stall of every
/// worker failed it.)
fn assert_slots_within(polled: &mut [u64], start: u64, burst: u64, interval: u64, what: &str) {
    let what = format!("{what}, first polls moved on by max_delay");
    assert_within_gcra(polled, start, burst, interval, &what);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn keyed_queues_never_pass_a_keys_policy_with_clients_leaving_mid_queue() -> TestResult {
    tokio::time::timeout(Duration::from_secs(10), async {
        // Each key: 200 per second (T = 5 ms), burst 2, a request waits at most 40 ms.
        let policy = Policy::per_second(200)?.with_burst(2)?;
        let limiter = Arc::new(
            KeyedBuilder::new(Gcra::new(policy))
                .clock(DefaultClock::new())
                .build::<String>()?,
        );
        let clock = *limiter.clock();
        let max_delay = Duration::from_millis(40);
        let recorder = Recorder::new(clock);
        let layer = RateLimitLayer::builder()
            .queue_per_key(KeyedQueueRule::shared(
                "per-key",
                HeaderKey::new("x-api-key")?,
                Arc::clone(&limiter),
                max_delay,
            )?)
            .build()?;
        let svc = layer.layer(recorder.clone());
        let keys = ["alice", "bob", "carol"];
        let start = clock.now().as_u64();
        // 3 keys × 200 requests over ~300 ms: each key sends about 2.2× its rate, so
        // every key's queue stays full and the bound below is tight.
        let out = storms(
            svc,
            &recorder,
            clock,
            600,
            Duration::from_micros(500),
            Duration::from_millis(30),
            7,
            |i| vec![("x-api-key", keys[i % 3].to_owned())],
            |out| exercised(out, &recorder, &keys, 10),
        )
        .await?;
        let seen = recorder.seen();
        assert!(
            !out.iter().any(|o| matches!(o, Outcome::Other(_))),
            "every answer is a 200 or a 429 with Retry-After: {out:?}"
        );
        let served = out.iter().filter(|o| **o == Outcome::Served).count();
        assert!(seen.len() >= served, "every 200 went through the service");
        assert!(out.contains(&Outcome::Refused), "the queues filled up");
        assert!(out.contains(&Outcome::Dropped), "some clients left");
        let interval = policy.interval_nanos();
        let mut by_key: HashMap<&str, Vec<u64>> = HashMap::new();
        for s in &seen {
            by_key.entry(&s.key).or_default().push(s.at);
        }
        for key in keys {
            let times = by_key.entry(key).or_default();
            assert!(times.len() > 10, "{key} was served ({})", times.len());
            assert_within_gcra(times, start, policy.burst(), interval, key);
            let mut polled = recorder.polled(key, max_delay);
            assert_slots_within(&mut polled, start, policy.burst(), interval, key);
        }
        Ok(())
    })
    .await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn one_queue_never_passes_its_policy_with_clients_leaving_mid_queue() -> TestResult {
    tokio::time::timeout(Duration::from_secs(10), async {
        // 250 per second (T = 4 ms), burst 1, a request waits at most 30 ms.
        let policy = Policy::per_second(250)?.with_burst(1)?;
        let shaper = Arc::new(Shaper::with_clock(policy, DefaultClock::new()));
        let clock = *shaper.clock();
        let max_delay = Duration::from_millis(30);
        let recorder = Recorder::new(clock);
        let layer = RateLimitLayer::builder()
            .queue(QueueRule::shared("smooth", Arc::clone(&shaper), max_delay)?)
            .build()?;
        let svc = layer.layer(recorder.clone());
        let start = clock.now().as_u64();
        let out = storms(
            svc,
            &recorder,
            clock,
            400,
            Duration::from_micros(500),
            Duration::from_millis(25),
            11,
            |i| vec![("x-api-key", format!("k{}", i % 5))],
            |out| exercised(out, &recorder, &[], 0) && recorder.seen().len() > 20,
        )
        .await?;
        let seen = recorder.seen();
        assert!(
            !out.iter().any(|o| matches!(o, Outcome::Other(_))),
            "{out:?}"
        );
        assert!(out.contains(&Outcome::Refused) && out.contains(&Outcome::Dropped));
        let mut times: Vec<u64> = seen.iter().map(|s| s.at).collect();
        assert!(times.len() > 20);
        assert_within_gcra(
            &mut times,
            start,
            policy.burst(),
            policy.interval_nanos(),
            "global",
        );
        let mut polled = recorder.polled("", max_delay);
        assert_slots_within(
            &mut polled,
            start,
            policy.burst(),
            policy.interval_nanos(),
            "global",
        );
        Ok(())
    })
    .await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn priority_tiers_hold_their_bounds_and_policy_with_clients_leaving() -> TestResult {
    tokio::time::timeout(Duration::from_secs(10), async {
        // 250 per second (T = 4 ms), burst 1; free may queue 3 deep, pro 2.
        let policy = Policy::per_second(250)?.with_burst(1)?;
        let shaper = Arc::new(Shaper::with_clock(policy, DefaultClock::new()));
        let clock = *shaper.clock();
        let bounds = [3, 2];
        let recorder = Recorder::new(clock);
        let layer = RateLimitLayer::builder()
            .priority(PriorityRule::shared(
                "smooth",
                Arc::clone(&shaper),
                &bounds,
                from_fn(tier),
            )?)
            .build()?;
        let svc = layer.layer(recorder.clone());
        let start = clock.now().as_u64();
        let mut rng = Lcg(3);
        let tiers: Vec<usize> = (0..400).map(|_| (rng.next() % 2) as usize).collect();
        let out = storms(
            svc.clone(),
            &recorder,
            clock,
            400,
            Duration::from_micros(400),
            Duration::from_millis(20),
            5,
            |i| {
                vec![
                    ("x-tier", tiers[i].to_string()),
                    ("x-api-key", format!("t{}", tiers[i])),
                ]
            },
            |out| exercised(out, &recorder, &[], 0) && recorder.seen().len() > 20,
        )
        .await?;
        assert!(
            !out.iter().any(|o| matches!(o, Outcome::Other(_))),
            "{out:?}"
        );
        assert!(out.contains(&Outcome::Refused) && out.contains(&Outcome::Dropped));
        let seen_now = recorder.seen();
        let interval = policy.interval_nanos();
        let mut times: Vec<u64> = seen_now.iter().map(|s| s.at).collect();
        assert!(times.len() > 20);
        assert_within_gcra(&mut times, start, policy.burst(), interval, "shaper");
        // No wall-clock cap on a pro request's wait here: a waiter books its slot only
        // when it wakes as the queue's head, and that wake-up is the scheduler's (a
        // 300 ms stall of the workers made a pro request wait 310 ms against a cap of
        // 174 ms, with the queue right). The tiers' order is tested on Tokio's paused
        // clock in `priority.rs` (`the_higher_tier_goes_first_and_fifo_holds_within_a_tier`).
        // Nothing was left behind in the queues (a ghost head or holder would block
        // everyone, a leaked place would refuse): once the storm is over, one request
        // after another of each plan goes through.
        for i in 0..6 {
            let req = Request::builder()
                .header("x-tier", (i % 2).to_string())
                .body(())?;
            let mut svc = svc.clone();
            let resp = svc.call(req).await.expect("infallible");
            assert_eq!(resp.status(), 200, "request {i} after the storm");
        }
        Ok(())
    })
    .await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_simultaneous_crowd_gets_at_most_the_places_queued() -> TestResult {
    tokio::time::timeout(Duration::from_secs(10), async {
        // 10 per second (T = 100 ms), burst 1; free may queue 2 deep, pro 3.
        let policy = Policy::per_second(10)?.with_burst(1)?;
        let shaper = Arc::new(Shaper::with_clock(policy, DefaultClock::new()));
        let clock = *shaper.clock();
        let recorder = Recorder::new(clock);
        let layer = RateLimitLayer::builder()
            .priority(PriorityRule::shared(
                "smooth",
                Arc::clone(&shaper),
                &[2, 3],
                from_fn(tier),
            )?)
            .build()?;
        let svc = layer.layer(recorder.clone());
        let start = clock.now();
        // When the last request's first poll returned: each is refused, takes its
        // place or is served in it, so every place was given by then.
        let decided_by = Arc::new(AtomicU64::new(0));
        // 40 at once, alternating plans; nobody leaves.
        let mut tasks = Vec::new();
        for i in 0..40 {
            let req = Request::builder()
                .header("x-tier", (i % 2).to_string())
                .body(())?;
            let mut call = svc.clone().call(req);
            let decided_by = Arc::clone(&decided_by);
            tasks.push(tokio::spawn(async move {
                let first = poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
                decided_by.fetch_max(clock.now().as_u64(), Ordering::SeqCst);
                match first {
                    Poll::Ready(resp) => resp,
                    Poll::Pending => call.await,
                }
            }));
        }
        let mut served = 0u64;
        let mut refused = 0;
        for t in tasks {
            let resp = t.await?.expect("infallible");
            match resp.status().as_u16() {
                200 => served += 1,
                429 => {
                    assert!(resp.headers().contains_key("retry-after"));
                    refused += 1;
                }
                other => panic!("status {other}"),
            }
        }
        // One goes at once, at most 5 wait; slots that pass while the crowd is still
        // being decided may let a few more in (none at all unless the first polls
        // took 100 ms). Counted to the last first poll, not to the last spawn: the
        // workers may poll a request long after it was spawned (a crowd half polled
        // 350 ms late had 9 served against a bound of 7).
        let interval = policy.interval_nanos();
        let decided_by = decided_by.load(Ordering::SeqCst);
        let extra = decided_by.saturating_sub(start.as_u64()) / interval + 1;
        assert!(
            served <= 1 + 5 + extra,
            "{served} served, {refused} refused (places 5, {extra} slots passed while deciding)"
        );
        assert!(served >= 6, "the places were used: {served} served");
        Ok(())
    })
    .await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn an_earlier_rules_refunds_for_clients_leaving_the_queue_never_pass_its_policy() -> TestResult
{
    tokio::time::timeout(Duration::from_secs(10), async {
        let clock = DefaultClock::new();
        // Each key: 100 per second (T = 10 ms), burst 3, charged before the queue; the
        // charge is given back when the request is refused by the queue or leaves it.
        let per_key = Policy::per_second(100)?.with_burst(3)?;
        let keyed = KeyedBuilder::new(Gcra::new(per_key))
            .clock(clock)
            .build::<String>()?;
        // Then one queue for all: 400 per second, burst 1, at most 15 ms of waiting.
        let shaper = Shaper::with_clock(Policy::per_second(400)?.with_burst(1)?, clock);
        let recorder = Recorder::new(clock);
        let layer = RateLimitLayer::builder()
            .rule(Rule::new("per-key", keyed, HeaderKey::new("x-api-key")?)?)
            .queue(QueueRule::new("smooth", shaper, Duration::from_millis(15))?)
            .build()?;
        let svc = layer.layer(recorder.clone());
        let keys = ["alice", "bob", "carol"];
        let start = clock.now().as_u64();
        let out = storms(
            svc,
            &recorder,
            clock,
            600,
            Duration::from_micros(500),
            Duration::from_millis(12),
            13,
            |i| vec![("x-api-key", keys[i % 3].to_owned())],
            |out| exercised(out, &recorder, &keys, 10),
        )
        .await?;
        assert!(
            !out.iter().any(|o| matches!(o, Outcome::Other(_))),
            "{out:?}"
        );
        assert!(out.contains(&Outcome::Refused) && out.contains(&Outcome::Dropped));
        let seen = recorder.seen();
        let mut by_key: HashMap<&str, Vec<u64>> = HashMap::new();
        for s in &seen {
            by_key.entry(&s.key).or_default().push(s.at);
        }
        for key in keys {
            let times = by_key.entry(key).or_default();
            assert!(times.len() > 10, "{key} was served ({})", times.len());
            assert_within_gcra(times, start, per_key.burst(), per_key.interval_nanos(), key);
        }
        let mut all: Vec<u64> = seen.iter().map(|s| s.at).collect();
        assert_within_gcra(&mut all, start, 1, 2_500_000, "the queue");
        Ok(())
    })
    .await?
}
