//! An in-memory remote limit with receipts and refunds ([`Remote`]), for the tests
//! of a dropped request's remote refunds (review_s43_cancel.rs,
//! review_s43_revcancel.rs, doc_claims_s43.rs, refund_tasks.rs, review_s44_cap.rs,
//! doc_claims_s44.rs): its refunds
//! run on their second poll, so a refund
//! future that is made but never run gives nothing back.
#![allow(dead_code)]

use std::future::{ready, Future};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::task::Poll;

use floodgate::{
    AsyncLimit, AsyncReceipt, Decision, Gcra, KeyedBuilder, KeyedLimiter, ManualClock, Policy,
    RateLimiter, Receipt, Shaper,
};
use floodgate_http::{
    Charge, Global, HeaderKey, QueueRule, RateLimitLayer, RateLimitLayerBuilder, RefundTask,
    ResponseFuture, Rule,
};
use http::{Request, StatusCode};
use tower::{Layer, Service, ServiceExt};

/// [`Remote`]'s error: the refund's round trip failed.
#[derive(Debug)]
pub struct Unreachable;

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("backend unreachable")
    }
}

/// A remote limit with refunds, in memory: a keyed GCRA of 3 an hour on a standing
/// clock, charging with receipts; its refunds fail while `down` is set, take 1 s
/// (Tokio's clock) while `slow` is set, never complete (a round trip with no reply)
/// while `stuck` is set, panic while `panics` is set, and each refund made is
/// counted in `refunds`.
pub struct Remote {
    pub limiter: KeyedLimiter<String, Gcra, ManualClock>,
    pub down: AtomicBool,
    pub slow: AtomicBool,
    pub stuck: AtomicBool,
    pub panics: AtomicBool,
    pub refunds: AtomicU32,
}

impl Remote {
    pub fn new() -> Result<Arc<Remote>, Box<dyn std::error::Error>> {
        let limiter = KeyedBuilder::new(Gcra::new(Policy::per_hour(3)?))
            .clock(ManualClock::new())
            .build::<String>()?;
        Ok(Arc::new(Remote {
            limiter,
            down: AtomicBool::new(false),
            slow: AtomicBool::new(false),
            stuck: AtomicBool::new(false),
            panics: AtomicBool::new(false),
            refunds: AtomicU32::new(0),
        }))
    }

    /// The units `user` has left.
    pub fn left(&self, user: &str) -> u64 {
        self.limiter.peek(user, 0).remaining()
    }
}

impl AsyncLimit<String> for Remote {
    type Error = Unreachable;

    fn check_n(
        &self,
        key: &String,
        cost: u32,
    ) -> impl Future<Output = Result<Decision, Unreachable>> + Send {
        ready(Ok(self.limiter.check_n(key, cost)))
    }

    fn peek_n(
        &self,
        key: &String,
        cost: u32,
    ) -> impl Future<Output = Result<Decision, Unreachable>> + Send {
        ready(Ok(self.limiter.peek(key, cost)))
    }

    fn charge_n(
        &self,
        key: &String,
        cost: u32,
    ) -> impl Future<Output = Result<(Decision, AsyncReceipt), Unreachable>> + Send {
        let (decision, receipt) = Charge::<String>::charge(&self.limiter, key, cost);
        let receipt = if receipt.is_charged() {
            AsyncReceipt::new(receipt)
        } else {
            AsyncReceipt::none()
        };
        ready(Ok((decision, receipt)))
    }

    async fn refund(&self, key: &String, receipt: AsyncReceipt) -> Result<bool, Unreachable> {
        // One round trip: the refund is made, and completes, on the second poll,
        // so a refund future that is made but never run gives nothing back.
        tokio::task::yield_now().await;
        if self.slow.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        if self.stuck.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        assert!(
            !self.panics.load(Ordering::SeqCst),
            "the test double's refund panics"
        );
        self.refunds.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(Unreachable);
        }
        Ok(receipt
            .into_inner::<Receipt>()
            .is_some_and(|r| self.limiter.refund(key, r)))
    }
}

/// A request from `who` (its `x-user` header).
pub fn from(who: &str) -> Request<()> {
    Request::get("/")
        .header("x-user", who)
        .body(())
        .unwrap_or_default()
}

/// The tasks a [`Tasks::spawner`] was handed, not run.
#[derive(Clone, Default)]
pub struct Tasks(Arc<Mutex<Vec<RefundTask>>>);

impl Tasks {
    /// `builder` with a refund spawner that keeps each task here.
    pub fn spawner(&self, builder: RateLimitLayerBuilder) -> RateLimitLayerBuilder {
        let tasks = Arc::clone(&self.0);
        builder.refund_spawner(move |task| {
            if let Ok(mut tasks) = tasks.lock() {
                tasks.push(task);
            }
        })
    }

    /// The tasks handed over since the last call.
    pub fn take(&self) -> Result<Vec<RefundTask>, String> {
        Ok(std::mem::take(
            &mut *self.0.lock().map_err(|e| e.to_string())?,
        ))
    }
}

/// A current-thread runtime on Tokio's paused clock, with its timer.
pub fn paused_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
}

/// A request from `who` is charged 1 in the remote limit, waits in the queue, and
/// its client goes away (`layer`'s queue slot held, its clock standing): the future is dropped on `rt` (where, with no spawner,
/// its refund task is spawned), then `rt` runs its ready tasks.
pub fn dropped_while_queued(
    rt: &tokio::runtime::Runtime,
    layer: &RateLimitLayer,
    who: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    rt.block_on(async {
        let mut svc = layer.layer(crate::common::Hello);
        let mut waiting = ServiceExt::<Request<()>>::ready(&mut svc)
            .await?
            .call(from(who));
        let pending =
            std::future::poll_fn(|cx| Poll::Ready(waiting.as_mut().poll(cx).is_pending())).await;
        assert!(pending, "{who} must wait for its slot");
        drop(waiting);
        let_spawned_tasks_run().await;
        Ok(())
    })
}

/// A few turns of the current-thread scheduler, no time passing: a spawned refund
/// task runs as far as it can (the double's refund ends on its second poll).
pub async fn let_spawned_tasks_run() {
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
}

/// Runs `each(thread, runtime)` on `threads` threads at once, each on its own
/// paused runtime, and joins them: the first error, or a thread's panic, as the
/// error.
pub fn on_threads<F>(threads: usize, each: F) -> Result<(), String>
where
    F: Fn(usize, &tokio::runtime::Runtime) -> Result<(), Box<dyn std::error::Error>> + Sync,
{
    std::thread::scope(|s| {
        let running: Vec<_> = (0..threads)
            .map(|t| {
                let each = &each;
                s.spawn(move || -> Result<(), String> {
                    let rt = paused_runtime().map_err(|e| e.to_string())?;
                    each(t, &rt).map_err(|e| e.to_string())
                })
            })
            .collect();
        running
            .into_iter()
            .try_for_each(|t| t.join().map_err(|_| "a thread panicked".to_owned())?)
    })
}

/// A remote rule named `name` on `remote`, keyed on `x-user`.
pub fn per_user(
    name: &str,
    remote: &Arc<Remote>,
) -> Result<Rule<Remote, HeaderKey>, Box<dyn std::error::Error>> {
    Ok(Rule::remote_shared(
        name,
        Arc::clone(remote),
        HeaderKey::new("x-user")?,
    )?)
}

/// The remote per-user rule on `remote`, then a global queue of one request per
/// 100 ms waiting at most 1 s, on a standing clock.
pub fn remote_then_queue(
    remote: &Arc<Remote>,
) -> Result<RateLimitLayerBuilder, Box<dyn std::error::Error>> {
    let shaper = Shaper::with_clock(Policy::per_second(10)?.with_burst(1)?, ManualClock::new());
    Ok(RateLimitLayer::builder()
        .rule(per_user("per-user", remote)?)
        .queue(QueueRule::new("queue", shaper, Duration::from_secs(1))?))
}

/// The remote per-user rule on `remote`, its refunds' round trips made 1 s long
/// (`slow`), then an in-process global rule of 1 an hour on a standing clock: once
/// "a" is served, every request is charged in `remote` and then turned away (429),
/// its refund's round trip under way for 1 s.
pub fn slow_remote_then_global(
    remote: &Arc<Remote>,
) -> Result<RateLimitLayerBuilder, Box<dyn std::error::Error>> {
    remote.slow.store(true, Ordering::SeqCst);
    let global = RateLimiter::gcra_with_clock(Policy::per_hour(1)?, ManualClock::new());
    Ok(RateLimitLayer::builder()
        .rule(per_user("per-user", remote)?)
        .rule(Rule::new("global", global, Global)?))
}

/// "a" is served by `svc`; then `svc`'s response future for "b", not yet polled.
pub async fn a_served_then_b<S>(svc: &mut S) -> Result<S::Future, Box<dyn std::error::Error>>
where
    S: Service<Request<()>, Response = http::Response<floodgate_http::RateLimitBody<String>>>,
    S::Error: std::error::Error + Send + Sync + 'static,
{
    let a = svc.ready().await?.call(from("a")).await?;
    assert_eq!(a.status(), StatusCode::OK);
    Ok(svc.ready().await?.call(from("b")))
}

/// `layer`'s response future for "b", polled once on `rt`: "a" holds the queue's
/// slot, so "b" (charged 1 in the remote limit) waits for its own.
pub fn waiting_b(
    rt: &tokio::runtime::Runtime,
    layer: &RateLimitLayer,
) -> Result<ResponseFuture<String, std::convert::Infallible>, Box<dyn std::error::Error>> {
    rt.block_on(async {
        let mut b = a_served_then_b(&mut layer.layer(crate::common::Hello)).await?;
        let pending =
            std::future::poll_fn(|cx| Poll::Ready(b.as_mut().poll(cx).is_pending())).await;
        assert!(pending, "b must wait for its slot");
        Ok(b)
    })
}

/// "a" is served by `layer` on `rt` and keeps the queue's slot (the queue's clock
/// stands): every later request waits for its own.
pub fn a_holds_the_slot(
    rt: &tokio::runtime::Runtime,
    layer: &RateLimitLayer,
) -> crate::common::TestResult {
    rt.block_on(async {
        let a = layer.layer(crate::common::Hello).oneshot(from("a")).await?;
        assert_eq!(a.status(), StatusCode::OK);
        Ok(())
    })
}

/// The `errors` of the remote rule.
pub fn errors(layer: &RateLimitLayer) -> Option<u64> {
    layer.rule_stats("per-user").map(|s| s.errors)
}

/// `remote_then_queue` on `remote` with at most `cap` refund tasks, each kept (not
/// run) by the returned [`Tasks`].
pub fn kept_tasks_layer(
    remote: &Arc<Remote>,
    cap: usize,
) -> Result<(Tasks, RateLimitLayer), Box<dyn std::error::Error>> {
    let tasks = Tasks::default();
    let layer = tasks
        .spawner(remote_then_queue(remote)?)
        .max_refund_tasks(cap)
        .build()?;
    Ok((tasks, layer))
}
