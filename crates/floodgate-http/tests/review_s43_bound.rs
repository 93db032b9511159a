//! Session 43 review ("bound"): the layer under hostile floods. A flood of unique
//! API keys, and of keys a megabyte long, through a keyed rule: real keys keep
//! their limits, the table stays within `max_keys`, an oversized key is a `400`
//! that charges and stores nothing. Counted by the table's and the rule's own
//! counters; the clocks stand still (manual) or are Tokio's paused clock.

use std::sync::Arc;

use floodgate::{Gcra, KeyedBuilder, KeyedLimiter, ManualClock, Policy};
use floodgate_http::{HeaderKey, RateLimitLayer, Rule};
use http::Request;
use tower::{Layer, Service};
mod common;
use common::{Hello, TestResult};

/// Threads sending requests.
const THREADS: u64 = 4;
/// Requests per thread: unique keys, a real key every 4th, an oversized one every 8th.
const PER_THREAD: u64 = 1_500;
/// Real API keys.
const REAL: u64 = 3;
/// Their burst (the clock stands still: nothing refills).
const BURST: u64 = 25;

fn request(key: &str) -> Request<()> {
    Request::get("/")
        .header("x-api-key", key)
        .body(())
        .unwrap_or_default()
}

/// What a thread saw: requests per status, and admissions per real key.
#[derive(Default)]
struct Seen {
    ok: u64,
    denied: u64,
    bad: u64,
    real: [u64; REAL as usize],
}

#[test]
#[cfg_attr(miri, ignore)]
fn a_threaded_flood_of_unique_and_megabyte_keys_through_a_keyed_rule() -> TestResult {
    let per_key: KeyedLimiter<String, Gcra, ManualClock> =
        KeyedBuilder::new(Gcra::new(Policy::per_minute(60)?.with_burst(BURST)?))
            .capacity(128)
            .shards(2)
            .clock(ManualClock::new())
            .build()?;
    let per_key = Arc::new(per_key);
    let rule = Rule::shared("key", Arc::clone(&per_key), HeaderKey::new("x-api-key")?)?;
    let layer = RateLimitLayer::builder().rule(rule).build()?;
    let svc = layer.layer(Hello);
    // A megabyte of visible ASCII: a valid header value, far past the 256-byte bound.
    let huge: Arc<str> = "k".repeat(1 << 20).into();
    // Tasks on a runtime of `THREADS` worker threads: requests race for real.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(THREADS as usize)
        .build()?;
    let seen: Vec<Seen> = rt.block_on(async {
        let tasks: Vec<_> = (0..THREADS)
            .map(|t| {
                let (mut svc, huge) = (svc.clone(), Arc::clone(&huge));
                tokio::spawn(async move {
                    let mut seen = Seen::default();
                    for i in 0..PER_THREAD {
                        let (key, real) = match i % 8 {
                            0 => (format!("{huge}{t}-{i}"), None),
                            2 | 6 => {
                                let r = (i / 4 + t) % REAL;
                                (format!("real-{r}"), Some(r))
                            }
                            _ => (format!("flood-{t}-{i}"), None),
                        };
                        let status = svc.call(request(&key)).await;
                        match status.map(|r| r.status().as_u16()) {
                            Ok(200) => {
                                seen.ok += 1;
                                if let Some(r) = real {
                                    seen.real[r as usize] += 1;
                                }
                            }
                            Ok(429) => seen.denied += 1,
                            Ok(400) => seen.bad += 1,
                            other => panic!("request {i} of task {t}: {other:?}"),
                        }
                    }
                    seen
                })
            })
            .collect();
        let mut seen = Vec::new();
        for task in tasks {
            seen.push(task.await.expect("no panic"));
        }
        seen
    });
    let mut real = [0u64; REAL as usize];
    for s in &seen {
        for (sum, n) in real.iter_mut().zip(s.real) {
            *sum += n;
        }
    }
    assert_eq!(
        real, [BURST; REAL as usize],
        "each real key: its burst, once"
    );
    let (ok, denied, bad) = seen.iter().fold((0, 0, 0), |(o, d, b), s| {
        (o + s.ok, d + s.denied, b + s.bad)
    });
    let oversized = THREADS * PER_THREAD.div_ceil(8);
    let unique = THREADS * PER_THREAD - oversized - THREADS * PER_THREAD / 4;
    // Every unique key is admitted (fresh), every oversized one refused as a 400.
    assert_eq!(bad, oversized);
    assert_eq!(ok, unique + REAL * BURST);
    assert_eq!(ok + denied + bad, THREADS * PER_THREAD);
    let stats = layer.rule_stats("key").ok_or("rule")?;
    assert_eq!(
        (stats.allowed, stats.denied, stats.bad_key),
        (ok, denied, bad)
    );
    // The table: within its bound, and no oversized key ever reached it: every key
    // it took in is live, reclaimed or evicted, and only the flood's and the real ones.
    let m = per_key.metrics();
    let within = m.live_keys as usize <= per_key.max_keys() && m.evicted > 0;
    assert!(within, "{m:?}: a full table, within max_keys");
    assert_eq!(
        (m.live_keys + m.reclaimed + m.evicted, m.allowed + m.denied),
        (unique + REAL, ok + denied),
        "{m:?}"
    );
    Ok(())
}

/// A per-key queue under a flood of unique keys on a table of 64 while one real key
/// queues: the real key still waits behind its own requests only, and no more of
/// them than its bound admits (burst 1 at 10 per second, 250 ms: slots at 0, 100
/// and 200 ms); every unique key goes at once; the table stays within `max_keys`.
/// The real key's booked schedule ranks heavier than any flood key's in an
/// eviction sample, so the flood never hands it a fresh schedule.
#[cfg(feature = "queue")]
#[tokio::test(start_paused = true)]
async fn a_flood_of_unique_keys_never_lets_a_queued_key_past_its_bound() -> TestResult {
    use common::TokioClock;
    use floodgate_http::KeyedQueueRule;
    use std::time::Duration;
    use tokio::time::Instant;

    let start = Instant::now();
    let per_key: KeyedLimiter<String, Gcra, TokioClock> =
        KeyedBuilder::new(Gcra::new(Policy::per_second(10)?.with_burst(1)?))
            .capacity(64)
            .shards(1)
            .clock(TokioClock { start })
            .build()?;
    let per_key = Arc::new(per_key);
    let layer = RateLimitLayer::builder()
        .queue_per_key(KeyedQueueRule::shared(
            "per-key",
            HeaderKey::new("x-api-key")?,
            Arc::clone(&per_key),
            Duration::from_millis(250),
        )?)
        .build()?;
    let svc = layer.layer(Hello);
    let mut tasks = Vec::new();
    for i in 0..600u32 {
        let key = if i % 30 == 0 {
            "real".to_owned()
        } else {
            format!("flood-{i}")
        };
        let call = svc.clone().call(request(&key));
        tasks.push(tokio::spawn(async move {
            let status = call.await.map(|r| r.status().as_u16());
            (i % 30 == 0, status, start.elapsed())
        }));
    }
    let mut real = Vec::new();
    for t in tasks {
        let (is_real, status, at) = t.await?;
        let status = status?;
        if is_real {
            real.push((status, at.as_millis()));
        } else {
            assert_eq!(
                (status, at),
                (200, Duration::ZERO),
                "a flood key goes at once"
            );
        }
    }
    let admitted: Vec<u128> = real
        .iter()
        .filter(|(s, _)| *s == 200)
        .map(|(_, at)| *at)
        .collect();
    assert_eq!(admitted, vec![0, 100, 200], "{real:?}");
    assert_eq!(real.iter().filter(|(s, _)| *s == 429).count(), 20 - 3);
    let m = per_key.metrics();
    assert!(m.live_keys as usize <= per_key.max_keys(), "{m:?}");
    assert!(m.evicted > 0, "the flood filled the table: {m:?}");
    Ok(())
}
