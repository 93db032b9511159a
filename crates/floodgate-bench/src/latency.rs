//! Per-decision latency under contention: p50 / p99 / p99.9 / max with hdrhistogram.
//!
//! Each of `threads` threads times every decision with two reads of quanta's raw TSC
//! counter around it and records the difference in its own histogram (merged at the
//! end); the **timer-only** row times nothing between the two reads, so it is the cost
//! of measuring itself — every other row includes it. The contenders are the hot-key
//! GCRA ones of the matrix ([`crate::matrix::gcra_policy`]): floodgate, its leased
//! hot-key mode, its mutex twin and governor (feature `compare`).
//!
//! With floodgate's `cas-stats` feature (this crate's feature of the same name), the
//! floodgate row also reports CAS retries per decision (mean, max), summed over the
//! threads.

use std::sync::Barrier;
use std::thread;

use floodgate::{DefaultClock, Gcra, RateLimiter};
use hdrhistogram::Histogram;

use crate::matrix::{gcra_policy, Implementation};

/// One row of the latency table.
#[derive(Clone, Debug, PartialEq)]
pub struct Latency {
    /// Which contender (`None`: the timer-only baseline).
    pub implementation: Option<Implementation>,
    /// Decisions timed, over all threads.
    pub decisions: u64,
    /// Median, nanoseconds.
    pub p50: u64,
    /// 99th percentile, nanoseconds.
    pub p99: u64,
    /// 99.9th percentile, nanoseconds.
    pub p999: u64,
    /// Slowest decision, nanoseconds.
    pub max: u64,
    /// CAS retries per decision (mean, max), where counted (floodgate with `cas-stats`).
    pub cas_retries: Option<(f64, u64)>,
}

impl Latency {
    /// The row's name.
    ///
    /// # Examples
    ///
    /// ```
    /// let row = floodgate_bench::latency::measure_latency(None, 1, 100);
    /// assert_eq!(row.name(), "timer only");
    /// ```
    pub fn name(&self) -> &'static str {
        self.implementation
            .map_or("timer only", Implementation::heading)
    }
}

/// The contenders of the latency table, after the timer-only row.
pub fn contenders() -> Vec<Implementation> {
    let mut out = vec![
        Implementation::Floodgate,
        Implementation::Leased,
        Implementation::MutexTwin,
    ];
    if cfg!(feature = "compare") {
        out.push(Implementation::Governor);
    }
    out
}

/// Times `decisions_per_thread` decisions of `implementation` (`None`: nothing, the
/// timer-only baseline) on each of `threads` threads on one hot key.
///
/// # Panics
///
/// If `threads` is zero or `implementation` has no latency contender (only floodgate,
/// the leased mode, the mutex twin and governor do).
///
/// # Examples
///
/// ```
/// use floodgate_bench::latency::measure_latency;
/// use floodgate_bench::matrix::Implementation;
///
/// let row = measure_latency(Some(Implementation::Floodgate), 2, 1_000);
/// assert_eq!(row.decisions, 2_000);
/// assert!(row.p50 <= row.p99 && row.p99 <= row.p999 && row.p999 <= row.max);
/// ```
pub fn measure_latency(
    implementation: Option<Implementation>,
    threads: usize,
    decisions_per_thread: u64,
) -> Latency {
    let floodgate = RateLimiter::new(Gcra::new(gcra_policy()));
    let leased = floodgate::LeasedGcra::builder(gcra_policy())
        .shards(threads)
        .build()
        .expect("valid lease settings");
    let twin = RateLimiter::locked_with_clock(Gcra::new(gcra_policy()), DefaultClock::new());
    #[cfg(feature = "compare")]
    let governor = governor::RateLimiter::direct(crate::matrix::governor_quota());
    let decide: &(dyn Fn() -> bool + Sync) = match implementation {
        None => &|| true,
        Some(Implementation::Floodgate) => &|| floodgate.check().is_allowed(),
        Some(Implementation::MutexTwin) => &|| twin.check().is_allowed(),
        Some(Implementation::Leased) => &|| leased.check().is_allowed(),
        #[cfg(feature = "compare")]
        Some(Implementation::Governor) => &|| governor.check().is_ok(),
        Some(other) => panic!("no latency contender for {other:?}"),
    };
    assert!(threads > 0, "a run needs at least one thread");
    let clock = quanta::Clock::new();
    let barrier = Barrier::new(threads);
    let results: Vec<(Histogram<u64>, CasCount)> = thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (clock, barrier) = (&clock, &barrier);
                scope.spawn(move || {
                    let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
                        .expect("valid histogram bounds");
                    // Warm up: the limiter, the caches and the clock.
                    for _ in 0..decisions_per_thread.min(10_000) {
                        std::hint::black_box(decide());
                    }
                    barrier.wait();
                    // Drops this thread's warm-up counts (`take` resets them).
                    let _ = cas_count();
                    for _ in 0..decisions_per_thread {
                        let start = clock.raw();
                        std::hint::black_box(decide());
                        let end = clock.raw();
                        histogram.saturating_record(clock.delta_as_nanos(start, end).max(1));
                    }
                    (histogram, cas_count())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut all =
        Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds");
    let mut cas = CasCount::default();
    for (histogram, count) in &results {
        all.add(histogram).expect("same bounds");
        cas.add(*count);
    }
    Latency {
        implementation,
        decisions: all.len(),
        p50: all.value_at_quantile(0.5),
        p99: all.value_at_quantile(0.99),
        p999: all.value_at_quantile(0.999),
        max: all.max(),
        cas_retries: (implementation == Some(Implementation::Floodgate))
            .then(|| cas.mean_max())
            .flatten(),
    }
}

/// The whole table: timer only, then each contender, on `threads` threads.
///
/// # Examples
///
/// ```
/// let rows = floodgate_bench::latency::table(2, 500);
/// assert_eq!(rows[0].name(), "timer only");
/// ```
pub fn table(threads: usize, decisions_per_thread: u64) -> Vec<Latency> {
    std::iter::once(None)
        .chain(contenders().into_iter().map(Some))
        .map(|i| measure_latency(i, threads, decisions_per_thread))
        .collect()
}

/// CAS loop counts of one thread (all zero without `cas-stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct CasCount {
    counted: bool,
    loops: u64,
    retries: u64,
    max_retries: u64,
}

impl CasCount {
    fn add(&mut self, other: CasCount) {
        self.counted |= other.counted;
        self.loops += other.loops;
        self.retries += other.retries;
        self.max_retries = self.max_retries.max(other.max_retries);
    }

    fn mean_max(self) -> Option<(f64, u64)> {
        (self.counted && self.loops > 0)
            .then(|| (self.retries as f64 / self.loops as f64, self.max_retries))
    }
}

#[cfg(feature = "cas-stats")]
fn cas_count() -> CasCount {
    // This thread's counts since the last call, which `take` resets.
    let s = floodgate::cas_stats::take();
    CasCount {
        counted: true,
        loops: s.loops,
        retries: s.retries,
        max_retries: s.max_retries,
    }
}

#[cfg(not(feature = "cas-stats"))]
fn cas_count() -> CasCount {
    CasCount::default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_times_every_decision_and_orders_its_percentiles() {
        for row in table(2, 2_000) {
            assert_eq!(row.decisions, 4_000, "{}", row.name());
            assert!(row.p50 >= 1 && row.p50 <= row.p99, "{row:?}");
            assert!(row.p99 <= row.p999 && row.p999 <= row.max, "{row:?}");
            if row.implementation != Some(Implementation::Floodgate) || !cfg!(feature = "cas-stats")
            {
                assert_eq!(row.cas_retries, None, "{row:?}");
            }
        }
    }

    #[cfg(feature = "cas-stats")]
    #[test]
    fn floodgate_reports_cas_retries_with_the_feature() {
        let row = measure_latency(Some(Implementation::Floodgate), 2, 2_000);
        let (mean, max) = row.cas_retries.expect("counted");
        assert!(mean >= 0.0 && mean <= max as f64, "{row:?}");
        let one = measure_latency(Some(Implementation::Floodgate), 1, 2_000);
        assert_eq!(one.cas_retries, Some((0.0, 0)), "one thread never retries");
    }
}
