//! Session 43 (feature `queue`): a request dropped while a later rule makes it wait
//! is given back its remote charges (a spawned refund task), and a 429 carries a
//! later queue's wait when that queue would deny the retry too.
//!
//! The remote limit is an in-memory double with receipts and refunds ([`Remote`]);
//! the queues run on Tokio's paused clock (or a `ManualClock` where the test drops a
//! future outside any runtime), so no test sleeps for real.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use floodgate::{Gcra, KeyedBuilder, ManualClock, Policy, RateLimiter, Shaper};
use floodgate_http::{
    Global, HeaderKey, KeyedQueueRule, QueueRule, RateLimitLayer, ResponseFuture, Rule,
};
use http::{Request, Response, StatusCode};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
#[path = "common/answer.rs"]
mod answer;
mod common;
#[path = "common/remote.rs"]
mod remote;
use answer::Answer;
use common::{Hello, TestResult, TokioClock};
use remote::{from, paused_runtime, slow_remote_then_global, Remote, Tasks};

/// The remote per-user rule on `remote`, then a global queue of one request per
/// 100 ms waiting at most 1 s, on `shaper`.
fn remote_then_queue<C>(
    remote: &Arc<Remote>,
    shaper: Shaper<C>,
) -> Result<floodgate_http::RateLimitLayerBuilder, Box<dyn std::error::Error>>
where
    C: floodgate::Clock + 'static,
{
    Ok(RateLimitLayer::builder()
        .rule(Rule::remote_shared(
            "per-user",
            Arc::clone(remote),
            HeaderKey::new("x-user")?,
        )?)
        .queue(QueueRule::new("queue", shaper, Duration::from_secs(1))?))
}

/// [`remote_then_queue`] built, the queue on Tokio's clock from now.
fn on_tokio_clock() -> Result<(Instant, Arc<Remote>, RateLimitLayer), Box<dyn std::error::Error>> {
    let start = Instant::now();
    let remote = Remote::new()?;
    let shaper = Shaper::with_clock(smooth()?, TokioClock { start });
    let layer = remote_then_queue(&remote, shaper)?.build()?;
    Ok((start, remote, layer))
}

/// One request per 100 ms, one at a time.
fn smooth() -> Result<Policy, floodgate::PolicyError> {
    Policy::per_second(10)?.with_burst(1)
}

/// "a" takes the queue's slot (admitted at once, charged 1 in `remote`); "b" is then
/// charged in `remote` and waits 100 ms for its slot, and goes away after 10 ms.
async fn b_goes_away_while_queued<S>(svc: &mut S) -> TestResult
where
    S: Service<Request<()>, Response = Response<floodgate_http::RateLimitBody<String>>>,
    S::Error: std::error::Error + Send + Sync + 'static,
{
    assert_eq!(status_of(svc, "a").await?, StatusCode::OK);
    let b = svc.ready().await?.call(from("b"));
    assert!(
        tokio::time::timeout(Duration::from_millis(10), b)
            .await
            .is_err(),
        "b must still be waiting for its slot"
    );
    Ok(())
}

/// The status of `svc`'s answer to a request from `who`.
async fn status_of<S, B>(svc: &mut S, who: &str) -> Result<StatusCode, Box<dyn std::error::Error>>
where
    S: Service<Request<()>, Response = Response<B>>,
    S::Error: std::error::Error + Send + Sync + 'static,
{
    Ok(svc.ready().await?.call(from(who)).await?.status())
}

/// Lets the spawned refund tasks run to their end (each completes on its second
/// poll): a few turns of the current-thread scheduler, no time passing.
async fn let_spawned_tasks_run() {
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
}

/// The client of "b" goes away while the queue makes it wait: its per-user charge in
/// the remote limit is given back (a task spawned on the runtime), so "b" has its 3
/// units; "a", served, keeps its charge; no error is counted.
///
/// Mutation seen failing: `Held`'s drop not spawning the remote refunds (b keeps 2).
#[tokio::test(start_paused = true)]
async fn a_dropped_request_gives_its_remote_charge_back() -> TestResult {
    let (start, remote, layer) = on_tokio_clock()?;
    let mut svc = layer.layer(Hello);
    b_goes_away_while_queued(&mut svc).await?;
    let_spawned_tasks_run().await;
    assert_eq!(remote.refunds.load(Ordering::SeqCst), 1);
    assert_eq!(remote.left("b"), 3, "b's remote charge must be given back");
    assert_eq!(remote.left("a"), 2, "a was served: its charge stays");
    assert_eq!(layer.rule_stats("per-user").map(|s| s.errors), Some(0));
    // And b's queue slot came back (the queue's own give-back): "c", sent at 10 ms,
    // takes b's slot at 100 ms, not the next one at 200 ms.
    assert_eq!(status_of(&mut svc, "c").await?, StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    Ok(())
}

/// The refund of a dropped request fails (the backend is down): it is counted in the
/// rule's `errors`, once, and the charge stays taken.
///
/// Mutation seen failing: the spawned task ignoring a refund's error (`errors` 0).
#[tokio::test(start_paused = true)]
async fn a_dropped_requests_failed_refund_counts_an_error() -> TestResult {
    let (_, remote, layer) = on_tokio_clock()?;
    let mut svc = layer.layer(Hello);
    remote.down.store(true, Ordering::SeqCst);
    b_goes_away_while_queued(&mut svc).await?;
    let_spawned_tasks_run().await;
    assert_eq!(
        remote.refunds.load(Ordering::SeqCst),
        1,
        "the refund was tried"
    );
    assert_eq!(layer.rule_stats("per-user").map(|s| s.errors), Some(1));
    assert_eq!(
        remote.left("b"),
        2,
        "a failed refund leaves the charge taken"
    );
    Ok(())
}

/// A request that reached the inner service keeps every charge, even when its
/// response future is then dropped (the service was slow): no refund is tried.
///
/// Mutation seen failing: `Held::keep` not clearing the remote receipts (the drop at
/// the end of the walk spawns their refunds: b gets its unit back).
#[tokio::test(start_paused = true)]
async fn a_request_that_reached_the_service_keeps_its_remote_charge() -> TestResult {
    let (start, remote, layer) = on_tokio_clock()?;
    // A service that never answers: the client gives up while it works.
    let slow = tower::service_fn(|_req: Request<()>| async {
        std::future::pending::<Result<Response<String>, std::convert::Infallible>>().await
    });
    let mut svc = layer.layer(slow);
    let b = svc.ready().await?.call(from("b"));
    assert!(tokio::time::timeout(Duration::from_millis(10), b)
        .await
        .is_err());
    let_spawned_tasks_run().await;
    assert_eq!(remote.refunds.load(Ordering::SeqCst), 0);
    assert_eq!(remote.left("b"), 2, "b reached the service: charged");
    assert_eq!(layer.rule_stats("per-user").map(|s| s.errors), Some(0));
    // One that waited in the queue and was served keeps its charge too.
    let mut svc = layer.layer(Hello);
    assert_eq!(status_of(&mut svc, "c").await?, StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_millis(100), "c was queued");
    let_spawned_tasks_run().await;
    assert_eq!(remote.left("c"), 2);
    assert_eq!(remote.refunds.load(Ordering::SeqCst), 0);
    Ok(())
}

/// A request a later rule turns away, whose client goes away during its remote
/// refund's round trip (1 s): the refund under way is not abandoned but spawned, and
/// gives the charge back.
///
/// Mutation seen failing: `Refunds`' drop not spawning the refunds still under way
/// (b keeps 2, no refund made).
#[tokio::test(start_paused = true)]
async fn a_429_dropped_during_its_refund_round_trip_still_gives_the_charge_back() -> TestResult {
    let remote = Remote::new()?;
    let layer = slow_remote_then_global(&remote)?.build()?;
    let mut svc = layer.layer(Hello);
    assert_eq!(status_of(&mut svc, "a").await?, StatusCode::OK);
    // "b": charged per user, turned away by the spent global rule; the client
    // gives up 10 ms into the refund's round trip.
    let b = ServiceExt::<Request<()>>::ready(&mut svc)
        .await?
        .call(from("b"));
    assert!(tokio::time::timeout(Duration::from_millis(10), b)
        .await
        .is_err());
    assert_eq!(remote.left("b"), 2, "the refund is under way");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(remote.refunds.load(Ordering::SeqCst), 1);
    assert_eq!(remote.left("b"), 3, "b's charge must be given back");
    assert_eq!(layer.rule_stats("per-user").map(|s| s.errors), Some(0));
    Ok(())
}

/// No refund spawner and no runtime where the future is dropped: the refund cannot
/// run, the charge stays taken, counted in the rule's `errors`; nothing panics.
///
/// Mutation seen failing: `spawn_remote` not counting the refunds it could not run
/// (`errors` 0).
#[test]
fn a_request_dropped_outside_a_runtime_keeps_its_remote_charge_counted_as_an_error() -> TestResult {
    let remote = Remote::new()?;
    let shaper = Shaper::with_clock(smooth()?, ManualClock::new());
    let layer = remote_then_queue(&remote, shaper)?.build()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    let waiting = rt.block_on(waiting_b(&layer))?;
    // Dropped on this thread, outside the runtime.
    drop(waiting);
    assert_eq!(remote.refunds.load(Ordering::SeqCst), 0);
    assert_eq!(remote.left("b"), 2);
    assert_eq!(layer.rule_stats("per-user").map(|s| s.errors), Some(1));
    Ok(())
}

/// `layer`'s response future for "b", polled once: "a" holds the queue's slot, so it
/// waits for its own (charged 1 in the remote limit).
async fn waiting_b(
    layer: &RateLimitLayer,
) -> Result<ResponseFuture<String, std::convert::Infallible>, Box<dyn std::error::Error>> {
    let mut svc = layer.layer(Hello);
    assert_eq!(status_of(&mut svc, "a").await?, StatusCode::OK);
    let mut b = ServiceExt::<Request<()>>::ready(&mut svc)
        .await?
        .call(from("b"));
    let pending = std::future::poll_fn(|cx| Poll::Ready(b.as_mut().poll(cx).is_pending())).await;
    assert!(pending, "b must wait for its slot");
    Ok(b)
}

/// With a refund spawner the layer hands it the task, whatever the thread: dropped
/// outside any runtime, the task is the spawner's, and running it gives the charge
/// back.
///
/// Mutation seen failing: `spawn` ignoring the layer's spawner (no task; `errors` 1).
#[test]
fn a_refund_spawner_gets_the_task_of_a_dropped_request() -> TestResult {
    let remote = Remote::new()?;
    let shaper = Shaper::with_clock(smooth()?, ManualClock::new());
    let tasks = Tasks::default();
    let layer = tasks.spawner(remote_then_queue(&remote, shaper)?).build()?;
    let rt = paused_runtime()?;
    let waiting = rt.block_on(waiting_b(&layer))?;
    drop(waiting);
    let mut tasks = tasks.take()?;
    assert_eq!(tasks.len(), 1, "one task for the dropped request");
    assert_eq!(remote.left("b"), 2, "not run yet");
    rt.block_on(tasks.remove(0));
    assert_eq!(remote.left("b"), 3);
    assert_eq!(layer.rule_stats("per-user").map(|s| s.errors), Some(0));
    Ok(())
}

/// 1 per `secs` s, burst 1.
fn one_per(secs: u64) -> Result<Policy, floodgate::PolicyError> {
    Policy::new(1, Duration::from_secs(secs))?.with_burst(1)
}

/// An in-process rule of 1 per 2 s, then a global queue of 1 per 10 s waiting at
/// most 1 s. The first request is admitted by both. The second, at once, is denied
/// by the first rule (2 s) while the queue would refuse it too: its slot is 10 s
/// away, 9 s past its bound — the 429 is the queue's, `Retry-After: 9`. A retry 1 ms
/// short of it is refused by the queue; one after exactly 9 s is queued 1 s and
/// served (the peek reserved nothing).
///
/// Mutation seen failing: `QueueRule::peek_later` removed (peek skipping queue
/// rules: `Retry-After: 2`, the first rule's).
#[tokio::test(start_paused = true)]
async fn a_429_carries_a_later_queues_longer_wait() -> TestResult {
    let start = Instant::now();
    let clock = TokioClock { start };
    let first = RateLimiter::gcra_with_clock(one_per(2)?, clock);
    let queue = Shaper::with_clock(one_per(10)?, clock);
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("first", first, Global)?)
        .queue(QueueRule::new("queue", queue, Duration::from_secs(1))?)
        .build()?;
    let send = || async { Answer::read(layer.layer(Hello).oneshot(Request::new(())).await?).await };
    assert_eq!(send().await.map_err(|e| e.to_string())?.status, 200);
    let denied = send().await.map_err(|e| e.to_string())?;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("retry-after"), Some("9"));
    assert!(denied.body.contains("\"queue\""), "{}", denied.body);
    // The queue shows in `RateLimit` as it is: nothing reservable within its bound.
    let limits = denied.header("ratelimit").unwrap_or_default();
    assert!(limits.contains("\"queue\";r=0"), "{limits}");
    tokio::time::advance(Duration::from_secs(9) - Duration::from_millis(1)).await;
    let early = send().await.map_err(|e| e.to_string())?;
    assert_eq!(early.status, 429, "1 ms early the queue still refuses");
    assert!(early.body.contains("\"queue\""), "{}", early.body);
    tokio::time::advance(Duration::from_millis(1)).await;
    let waited = send().await.map_err(|e| e.to_string())?;
    assert_eq!(waited.status, 200);
    assert_eq!(start.elapsed(), Duration::from_secs(10), "queued 1 s");
    Ok(())
}

/// The same for a per-key queue: the 429 carries the wait of the request's own key's
/// queue, and another key's (idle) queue adds nothing.
///
/// Mutation seen failing: `KeyedQueueRule::peek_later` removed (`Retry-After: 2`).
#[tokio::test(start_paused = true)]
async fn a_429_carries_a_later_per_key_queues_longer_wait() -> TestResult {
    let start = Instant::now();
    let clock = TokioClock { start };
    let first = RateLimiter::gcra_with_clock(one_per(2)?, clock);
    let per_user = KeyedBuilder::new(Gcra::new(one_per(10)?))
        .clock(clock)
        .build::<String>()?;
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("first", first, Global)?)
        .queue_per_key(KeyedQueueRule::new(
            "per-user-queue",
            HeaderKey::new("x-user")?,
            per_user,
            Duration::from_secs(1),
        )?)
        .build()?;
    let send = |who: &'static str| {
        let svc = layer.layer(Hello);
        async move { Answer::read(svc.oneshot(from(who)).await?).await }
    };
    assert_eq!(send("a").await.map_err(|e| e.to_string())?.status, 200);
    let a = send("a").await.map_err(|e| e.to_string())?;
    assert_eq!(a.status, 429);
    assert_eq!(a.header("retry-after"), Some("9"), "a's queue is 9 s past");
    // "b"'s queue is idle: only the first rule holds it back.
    let b = send("b").await.map_err(|e| e.to_string())?;
    assert_eq!(b.status, 429);
    assert_eq!(b.header("retry-after"), Some("2"));
    tokio::time::advance(Duration::from_secs(9)).await;
    assert_eq!(send("a").await.map_err(|e| e.to_string())?.status, 200);
    Ok(())
}
