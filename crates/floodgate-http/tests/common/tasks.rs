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
