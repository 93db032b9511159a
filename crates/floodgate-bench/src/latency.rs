//! Per-decision latency under contention: p50 / p99 / p99.9 / max with hdrhistogram.
//!
//! Each of `threads` threads times every decision with two reads of quanta's raw TSC
//! counter around it and records the difference in its own histogram (merged at the
//! end); the **timer-only** row times nothing between the two reads, so it is the cost
//! of measuring itself — every other row includes it. The contenders are the hot-key
//! GCRA ones of the matrix ([`crate::matrix::gcra_policy`]): floodgate, its leased
//! hot-key mode, its mutex twin and governor (feature `compare`).
//!
//! [`rounds`] measures the whole table several times, rotating the order of the rows
//! from round to round, and reports each figure as its median and range over the
//! rounds: on a 2-vCPU virtual machine one run of a row can land the two threads
//! differently on the host and move its tail several-fold, so a single run per row
//! (as [`table`] gives) says little about which contender has the shorter tail.
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
        row_name(self.implementation)
    }
}

/// A latency row's name: the contender's heading, or the timer-only baseline's.
fn row_name(implementation: Option<Implementation>) -> &'static str {
    implementation.map_or("timer only", Implementation::heading)
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

/// One row of the latency table over several rounds: the same contender measured once
/// per round.
#[derive(Clone, Debug, PartialEq)]
pub struct LatencySeries {
    /// Which contender (`None`: the timer-only baseline).
    pub implementation: Option<Implementation>,
    /// One measurement per round, in round order.
    pub rounds: Vec<Latency>,
}

/// A figure over rounds: the median and the range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spread<T = u64> {
    /// The median round's value (the upper median for an even count).
    pub median: T,
    /// The lowest round's value.
    pub min: T,
    /// The highest round's value.
    pub max: T,
}

impl<T: Copy + PartialOrd> Spread<T> {
    /// The median and range of `values` (`None` when there are none; values that do
    /// not compare, such as NaN, sort as equal to anything).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_bench::latency::Spread;
    /// let s = Spread::of([30, 10, 20]).unwrap();
    /// assert_eq!((s.median, s.min, s.max), (20, 10, 30));
    /// assert_eq!(Spread::of([0.5, 2.0]).map(|s| s.median), Some(2.0));
    /// assert_eq!(Spread::<u64>::of([]), None);
    /// ```
    pub fn of(values: impl IntoIterator<Item = T>) -> Option<Spread<T>> {
        let mut v: Vec<T> = values.into_iter().collect();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(core::cmp::Ordering::Equal));
        Some(Spread {
            median: *v.get(v.len() / 2)?,
            min: v[0],
            max: v[v.len() - 1],
        })
    }
}

impl LatencySeries {
    /// The row's name.
    pub fn name(&self) -> &'static str {
        row_name(self.implementation)
    }

    /// One figure of every round (e.g. `|l| l.p999`), as median and range.
    ///
    /// # Panics
    ///
    /// If the series has no round ([`rounds`] always measures at least one).
    pub fn spread(&self, figure: impl Fn(&Latency) -> u64) -> Spread {
        Spread::of(self.rounds.iter().map(figure)).expect("a series has at least one round")
    }

    /// Decisions timed over every round.
    pub fn decisions(&self) -> u64 {
        self.rounds.iter().map(|l| l.decisions).sum()
    }

    /// CAS retries per decision over every round (mean, max), where counted.
    pub fn cas_retries(&self) -> Option<(f64, u64)> {
        let counted: Vec<_> = self
            .rounds
            .iter()
            .filter_map(|l| l.cas_retries.map(|c| (c, l.decisions)))
            .collect();
        let decisions: u64 = counted.iter().map(|(_, d)| d).sum();
        (decisions > 0).then(|| {
            let mean = counted
                .iter()
                .map(|((mean, _), d)| mean * *d as f64)
                .sum::<f64>()
                / decisions as f64;
            let max = counted.iter().map(|((_, max), _)| *max).max().unwrap_or(0);
            (mean, max)
        })
    }
}

/// The table `repeats` times over (at least once): each round measures the timer-only
/// row and every contender once, starting one row later than the round before, so
/// that no contender always runs first, last, or after the same neighbour, and a slow
/// drift of the machine (or the vCPUs landing differently on the host) spreads over
/// every row. Rows come back in [`table`]'s order, each with its rounds in order.
///
/// # Examples
///
/// ```
/// let rows = floodgate_bench::latency::rounds(2, 500, 3);
/// assert_eq!(rows[0].name(), "timer only");
/// assert!(rows.iter().all(|r| r.rounds.len() == 3));
/// let p999 = rows[1].spread(|l| l.p999);
/// assert!(p999.min <= p999.median && p999.median <= p999.max);
/// ```
pub fn rounds(threads: usize, decisions_per_thread: u64, repeats: usize) -> Vec<LatencySeries> {
    let mut rows: Vec<LatencySeries> = std::iter::once(None)
        .chain(contenders().into_iter().map(Some))
        .map(|implementation| LatencySeries {
            implementation,
            rounds: Vec::new(),
        })
        .collect();
    let n = rows.len();
    for round in 0..repeats.max(1) {
        for offset in 0..n {
            let row = &mut rows[(round + offset) % n];
            let measured = measure_latency(row.implementation, threads, decisions_per_thread);
            row.rounds.push(measured);
        }
    }
    rows
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

    #[test]
    fn rounds_measure_every_row_once_a_round_and_rotate_the_order() {
        let rows = rounds(2, 1_000, 4);
        let names: Vec<_> = rows.iter().map(LatencySeries::name).collect();
        let once: Vec<_> = table(2, 10).iter().map(Latency::name).collect();
        assert_eq!(names, once);
        for row in &rows {
            assert_eq!(row.rounds.len(), 4, "{}", row.name());
            assert!(row
                .rounds
                .iter()
                .all(|l| l.implementation == row.implementation));
            assert_eq!(row.decisions(), 4 * 2_000);
            for figure in [|l: &Latency| l.p50, |l: &Latency| l.p999] {
                let s = row.spread(figure);
                let mut v: Vec<u64> = row.rounds.iter().map(figure).collect();
                v.sort_unstable();
                assert_eq!((s.min, s.median, s.max), (v[0], v[2], v[3]));
            }
        }
    }

    #[test]
    fn a_spread_is_the_median_and_range_of_its_values() {
        assert_eq!(
            Spread::of([7]),
            Some(Spread {
                median: 7,
                min: 7,
                max: 7
            })
        );
        assert_eq!(
            Spread::of([5, 1, 9, 3]),
            Some(Spread {
                median: 5,
                min: 1,
                max: 9
            })
        );
        assert_eq!(Spread::<u64>::of(Vec::new()), None);
    }

    #[test]
    fn cas_retries_over_rounds_weigh_each_round_by_its_decisions() {
        let round = |decisions, cas_retries| Latency {
            implementation: Some(Implementation::Floodgate),
            decisions,
            p50: 1,
            p99: 1,
            p999: 1,
            max: 1,
            cas_retries,
        };
        let series = LatencySeries {
            implementation: Some(Implementation::Floodgate),
            rounds: vec![round(100, Some((0.5, 3))), round(300, Some((0.1, 7)))],
        };
        let (mean, max) = series.cas_retries().unwrap();
        assert!((mean - 0.2).abs() < 1e-12, "{mean}");
        assert_eq!(max, 7);
        let uncounted = LatencySeries {
            implementation: Some(Implementation::Floodgate),
            rounds: vec![round(100, None)],
        };
        assert_eq!(uncounted.cas_retries(), None);
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
