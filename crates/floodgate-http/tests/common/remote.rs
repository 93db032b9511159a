//! An in-memory remote limit with receipts and refunds ([`Remote`]), for the tests
//! of a dropped request's remote refunds (review_s43_cancel.rs,
//! review_s43_revcancel.rs): its refunds run on their second poll, so a refund
//! future that is made but never run gives nothing back.
#![allow(dead_code)]

use std::future::{ready, Future};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use floodgate::{
    AsyncLimit, AsyncReceipt, Decision, Gcra, KeyedBuilder, KeyedLimiter, ManualClock, Policy,
    Receipt,
};
use floodgate_http::{Charge, RateLimitLayerBuilder, RefundTask};
use http::Request;

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
/// (Tokio's clock) while `slow` is set, and each refund made is counted in
/// `refunds`.
pub struct Remote {
    pub limiter: KeyedLimiter<String, Gcra, ManualClock>,
    pub down: AtomicBool,
    pub slow: AtomicBool,
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
