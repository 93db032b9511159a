//! A generic multi-thread throughput harness: run one operation on `n` threads for a
//! fixed time and count how many completed.
//!
//! [`measure`] is generic over the operation, so each contender's loop is compiled
//! for that contender alone (no dynamic call in the hot loop). All threads wait on a
//! start barrier, so they begin together; the coordinating thread then sleeps for the
//! run time and raises a stop flag, which the workers poll once per [`BATCH`]
//! operations. Each worker times itself from the barrier to the stop, and the rate is
//! all operations over the longest worker's time — a conservative figure when the
//! workers finish a little apart.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

/// Operations between two polls of the stop flag.
pub(crate) const BATCH: u64 = 64;

/// The outcome of one run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Sample {
    /// Operations completed by all threads.
    pub(crate) operations: u64,
    /// Operations that returned `true` (decisions that admitted).
    pub(crate) admitted: u64,
    /// The longest worker's time from the start barrier to the stop.
    pub(crate) elapsed: Duration,
}

impl Sample {
    /// Million operations per second.
    pub(crate) fn millions_per_second(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs == 0.0 {
            return 0.0;
        }
        self.operations as f64 / secs / 1e6
    }
}

/// Runs `op(thread_index, op_index)` on `threads` threads for about `run_time`.
///
/// `op` returns whether the decision admitted; the result goes through
/// [`black_box`] so the work cannot be optimised away. `op_index` counts from 0 on
/// each thread, so an operation can pick a key from `(thread_index, op_index)`.
pub(crate) fn measure<F>(threads: usize, run_time: Duration, op: F) -> Sample
where
    F: Fn(usize, u64) -> bool + Sync,
{
    let threads = threads.max(1);
    let start = Barrier::new(threads + 1);
    let stop = AtomicBool::new(false);
    let results: Vec<(u64, u64, Duration)> = thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread_index| {
                let (start, stop, op) = (&start, &stop, &op);
                scope.spawn(move || {
                    start.wait();
                    let began = Instant::now();
                    let (mut done, mut admitted) = (0u64, 0u64);
                    // Relaxed: the flag carries no data; a worker that sees it a batch
                    // late only runs a few more operations, all counted.
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..BATCH {
                            admitted += u64::from(black_box(op(thread_index, done)));
                            done += 1;
                        }
                    }
                    (done, admitted, began.elapsed())
                })
            })
            .collect();
        start.wait();
        thread::sleep(run_time);
        stop.store(true, Ordering::Relaxed);
        workers
            .into_iter()
            .map(|w| match w.join() {
                Ok(result) => result,
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    });
    Sample {
        operations: results.iter().map(|r| r.0).sum(),
        admitted: results.iter().map(|r| r.1).sum(),
        elapsed: results.iter().map(|r| r.2).max().unwrap_or(Duration::ZERO),
    }
}

/// The median of the rates of `samples` (the mean of the middle two for an even
/// count); `None` for no samples.
pub(crate) fn median_rate(samples: &[Sample]) -> Option<f64> {
    let mut rates: Vec<f64> = samples.iter().map(Sample::millions_per_second).collect();
    rates.sort_by(f64::total_cmp);
    let mid = rates.len() / 2;
    match rates.len() {
        0 => None,
        n if n % 2 == 1 => Some(rates[mid]),
        _ => Some((rates[mid - 1] + rates[mid]) / 2.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Mutex;

    #[test]
    fn every_thread_runs_and_every_operation_is_counted() {
        let calls = AtomicU64::new(0);
        let seen = Mutex::new(vec![false; 3]);
        let sample = measure(3, Duration::from_millis(20), |thread, i| {
            calls.fetch_add(1, Ordering::Relaxed);
            if i == 0 {
                seen.lock().unwrap()[thread] = true;
            }
            i % 2 == 0
        });
        assert_eq!(sample.operations, calls.load(Ordering::Relaxed));
        assert_eq!(sample.operations % BATCH, 0);
        // Per thread, exactly half of each batch admits.
        assert_eq!(sample.admitted * 2, sample.operations);
        assert_eq!(*seen.lock().unwrap(), vec![true; 3]);
        assert!(sample.elapsed > Duration::ZERO);
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        let s = |operations| Sample {
            operations,
            admitted: 0,
            elapsed: Duration::from_secs(1),
        };
        assert_eq!(median_rate(&[]), None);
        assert_eq!(
            median_rate(&[s(5_000_000), s(1_000_000), s(3_000_000)]),
            Some(3.0)
        );
        assert_eq!(median_rate(&[s(4_000_000), s(2_000_000)]), Some(3.0));
    }
}
