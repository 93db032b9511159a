//! Many tasks at once on a multi-thread Tokio runtime, for the session 45
//! concurrency reviews (review_s45_mt*.rs).
#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;

/// A multi-thread runtime of 4 workers, with its timer.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_time()
        .build()
}

/// Runs `each(t)` for `t` in `0..tasks`, each on its own spawned task, all
/// released together by a barrier: every task's outputs, in task order, or the
/// first error (a task's panic as an error).
pub async fn at_once<T, F, Fut>(tasks: usize, each: F) -> Result<Vec<T>, String>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Result<Vec<T>, String>> + Send + 'static,
{
    let barrier = Arc::new(tokio::sync::Barrier::new(tasks));
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let barrier = Arc::clone(&barrier);
            let work = each(t);
            tokio::spawn(async move {
                barrier.wait().await;
                work.await
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.map_err(|e| e.to_string())??);
    }
    Ok(all)
}

/// A remote rule that holds each request until the test opens its gate (by the
/// request's `x-req`), then denies it: it decides when each request's earlier
/// charges are given back.
#[derive(Default)]
pub struct Gate {
    pub open: std::sync::Mutex<Vec<String>>,
}

impl floodgate::AsyncLimit<String> for Gate {
    type Error = std::convert::Infallible;

    fn check_n(
        &self,
        key: &String,
        _: u32,
    ) -> impl std::future::Future<Output = Result<floodgate::Decision, Self::Error>> + Send {
        let key = key.clone();
        std::future::poll_fn(move |_| {
            let open = self.open.lock().map(|o| o.contains(&key)).unwrap_or(false);
            if open {
                let wait = std::time::Duration::from_secs(1);
                std::task::Poll::Ready(Ok(floodgate::Decision::new(false, 1, 0, wait, Some(wait))))
            } else {
                std::task::Poll::Pending
            }
        })
    }

    fn peek_n(
        &self,
        _: &String,
        _: u32,
    ) -> impl std::future::Future<Output = Result<floodgate::Decision, Self::Error>> + Send {
        std::future::ready(Ok(floodgate::Decision::new(
            true,
            1,
            1,
            std::time::Duration::ZERO,
            None,
        )))
    }
}

/// Requests "a" and "b" of user "u" (`x-user`; `x-req` their gate) are called on
/// `svc` and held at `gate`'s rule (each polled once: every rule before the gate
/// has charged them); `held()` then looks; then their gates open in `order`, each
/// request answered 429 before the next opens (its earlier charges given back).
pub fn deny_at_the_gate(
    svc: &mut floodgate_http::RateLimitService<crate::common::Hello>,
    gate: &Gate,
    order: [&str; 2],
    held: impl FnOnce(),
) -> Result<(), String> {
    use std::task::{Context, Poll, Waker};
    use tower::Service;
    let mut cx = Context::from_waker(Waker::noop());
    let mut call = |id: &str| -> Result<_, String> {
        let req = http::Request::get("/")
            .header("x-user", "u")
            .header("x-req", id)
            .body(())
            .map_err(|e| e.to_string())?;
        let mut fut = svc.call(req);
        assert!(
            fut.as_mut().poll(&mut cx).is_pending(),
            "{id} held at the gate"
        );
        Ok(fut)
    };
    let mut a = call("a")?;
    let mut b = call("b")?;
    held();
    for id in order {
        gate.open
            .lock()
            .map_err(|e| e.to_string())?
            .push(id.to_owned());
        let fut = if id == "a" { &mut a } else { &mut b };
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(Ok(resp)) => assert_eq!(resp.status(), 429),
            Poll::Ready(Err(e)) => match e {},
            Poll::Pending => return Err(format!("{id} still pending")),
        }
    }
    Ok(())
}

/// Sends `req` through a clone of `svc`: the response.
pub async fn send(
    svc: &floodgate_http::RateLimitService<crate::common::Hello>,
    req: http::Request<()>,
) -> Result<http::Response<floodgate_http::RateLimitBody<String>>, String> {
    use tower::ServiceExt;
    svc.clone()
        .oneshot(req)
        .await
        .map_err(|e| -> String { match e {} })
}

/// The counters of a layer of two hard rules after `total` requests of which
/// `passed` passed: every request met the first rule once, every one it admitted
/// met the second once, and the second admitted exactly those that passed.
pub fn counted_once(stats: &[floodgate_http::RuleStats], total: u64, passed: u64, what: &str) {
    assert_eq!(stats[0].allowed + stats[0].denied, total, "{what}");
    assert_eq!(stats[1].allowed, passed, "{what}");
    let second = stats[1].allowed + stats[1].denied;
    assert_eq!(second, stats[0].allowed, "{what}");
}
