//! The multi-thread throughput harness.
//!
//! The criterion suites (through `iter_custom`) and the `floodgate bench` command drive
//! concurrent runs with the same functions, so both measure exactly the same thing:
//!
//! * [`run_threads`] — exactly a fixed number of operations per thread (what a count
//!   of instructions per operation needs);
//! * [`run_together`] — at most a number of operations per thread, every thread
//!   stopping when the first has done its share (what criterion's `iter_custom` gets
//!   from the suites: a contender that serves one thread at a time cannot finish its
//!   run on one thread alone);
//! * [`run_for`] — as many operations as fit in a duration (what a command with a time
//!   budget wants).
//!
//! They know nothing about rate limiting: they run closures. Each thread first builds
//! its own operation (`make_op(thread_index)`: per-thread setup such as a key sequence
//! or a counter, excluded from the timing), then all threads wait on one start barrier
//! and spin until every one of them is running, then each runs its operation in a
//! tight loop. The elapsed time is measured by the workers themselves, from the
//! earliest start to the latest finish, so thread spawning, setup and joining are not
//! counted, and the coordinating thread never competes with the workers for a core
//! while they are timed.
//!
//! An operation returns `()` or a `bool` (see [`Outcome`]); the `true`s are counted in
//! [`Measurement::admitted`], so a limiter benchmark can report how many of its
//! decisions admitted without a shared counter in the timed loop.
//!
//! # Examples
//!
//! Two threads hammering one atomic counter:
//!
//! ```
//! use floodgate_bench::run_threads;
//! use std::sync::atomic::{AtomicU64, Ordering};
//!
//! let hits = AtomicU64::new(0);
//! let elapsed = run_threads(2, 1_000, |_thread| {
//!     || {
//!         hits.fetch_add(1, Ordering::Relaxed);
//!     }
//! });
//! assert_eq!(hits.load(Ordering::Relaxed), 2_000);
//! println!("{:?} per operation", elapsed / 2_000);
//! ```

use std::hint::black_box;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_utils::{Backoff, CachePadded};

/// How many operations [`run_for`] runs between two looks at the clock.
///
/// Large enough that reading the clock is noise next to the operations (each look costs
/// about as much as one cheap operation), small enough that a run overshoots its
/// duration by well under a millisecond even at 100 ns per operation.
pub const BATCH: u64 = 1024;

/// What an operation returns, as the harness counts it.
///
/// `()` counts nothing and adds nothing to the loop (the criterion suites' operations);
/// `bool` counts its `true`s in [`Measurement::admitted`] (for a limiter: the decision
/// admitted) and goes through [`std::hint::black_box`] first, so the work that
/// produced it cannot be optimised away.
///
/// # Examples
///
/// ```
/// use floodgate_bench::Outcome;
///
/// assert!(true.admitted());
/// assert!(!false.admitted());
/// assert!(!().admitted());
/// ```
pub trait Outcome {
    /// Whether this result counts as admitted.
    fn admitted(self) -> bool;
}

impl Outcome for () {
    fn admitted(self) -> bool {
        false
    }
}

impl Outcome for bool {
    fn admitted(self) -> bool {
        black_box(self)
    }
}

/// What a concurrent run measured: the operations completed by all threads together,
/// how many of them returned `true`, and the wall-clock span from the first thread's
/// start to the last thread's finish.
///
/// # Examples
///
/// ```
/// use floodgate_bench::Measurement;
/// use std::time::Duration;
///
/// let m = Measurement { ops: 2_000_000, admitted: 0, elapsed: Duration::from_millis(500) };
/// assert_eq!(m.ops_per_sec(), 4_000_000.0);
/// assert_eq!(m.per_op(), Duration::from_nanos(250));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Measurement {
    /// Operations completed, summed over all threads.
    pub ops: u64,
    /// Operations whose [`Outcome`] was admitted (returned `true`); 0 for operations
    /// returning `()`.
    pub admitted: u64,
    /// From the earliest start (after the barrier) to the latest finish.
    pub elapsed: Duration,
}

impl Measurement {
    /// Total throughput: operations per second over all threads (0 for an empty run).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_bench::Measurement;
    /// use std::time::Duration;
    ///
    /// let m = Measurement { ops: 10, admitted: 5, elapsed: Duration::from_secs(2) };
    /// assert_eq!(m.ops_per_sec(), 5.0);
    /// assert_eq!(Measurement { ops: 0, admitted: 0, elapsed: Duration::ZERO }.ops_per_sec(), 0.0);
    /// ```
    pub fn ops_per_sec(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if self.ops == 0 || secs == 0.0 {
            0.0
        } else {
            self.ops as f64 / secs
        }
    }

    /// Wall-clock time per operation with all threads working together (the inverse of
    /// [`ops_per_sec`](Measurement::ops_per_sec)); zero for an empty run.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_bench::Measurement;
    /// use std::time::Duration;
    ///
    /// let m = Measurement { ops: 4, admitted: 4, elapsed: Duration::from_nanos(100) };
    /// assert_eq!(m.per_op(), Duration::from_nanos(25));
    /// ```
    pub fn per_op(&self) -> Duration {
        if self.ops == 0 {
            return Duration::ZERO;
        }
        let nanos = self.elapsed.as_nanos() / u128::from(self.ops);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// How long `ops` operations take at this run's throughput: `elapsed` scaled by
    /// `ops / self.ops` (exact to the nanosecond, unlike `per_op() * ops`). What
    /// criterion's `iter_custom` is given when a [`run_together`] stopped short of the
    /// operations it asked for. An empty run reports its `elapsed` unscaled.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_bench::Measurement;
    /// use std::time::Duration;
    ///
    /// let m = Measurement { ops: 3, admitted: 0, elapsed: Duration::from_nanos(40) };
    /// assert_eq!(m.time_for(6), Duration::from_nanos(80));
    /// assert_eq!(m.time_for(3), m.elapsed);
    /// ```
    pub fn time_for(&self, ops: u64) -> Duration {
        if self.ops == 0 {
            return self.elapsed;
        }
        let nanos = self.elapsed.as_nanos() * u128::from(ops) / u128::from(self.ops);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

/// Runs `ops_per_thread` operations on each of `threads` threads and returns the
/// wall-clock time they took together.
///
/// `make_op(i)` is called once on thread `i` (0-based) before the start barrier; the
/// closure it returns is then called `ops_per_thread` times on that thread. Setup and
/// thread start-up are therefore not timed. Every thread does its whole count, even
/// after the others have finished: for throughput under contention, use
/// [`run_together`].
///
/// # Panics
///
/// If `threads` is zero, or (re-raised here) if `make_op` or an operation panics.
///
/// # Examples
///
/// ```
/// use floodgate_bench::run_threads;
/// use std::hint::black_box;
/// use std::sync::Mutex;
///
/// let shared = Mutex::new(0u64);
/// let elapsed = run_threads(2, 500, |thread| {
///     let step = thread as u64 + 1; // per-thread setup, not timed
///     let shared = &shared;
///     move || *shared.lock().unwrap() += black_box(step)
/// });
/// assert_eq!(*shared.lock().unwrap(), 500 * 1 + 500 * 2);
/// assert!(elapsed > std::time::Duration::ZERO);
/// ```
pub fn run_threads<M, Op, R>(threads: usize, ops_per_thread: u64, make_op: M) -> Duration
where
    M: Fn(usize) -> Op + Sync,
    Op: FnMut() -> R,
    R: Outcome,
{
    run_ops(threads, ops_per_thread, make_op).elapsed
}

/// Runs operations on each of `threads` threads until `duration` has passed on that
/// thread, and returns how many ran and for how long.
///
/// As [`run_threads`], `make_op(i)` builds thread `i`'s operation before the start
/// barrier. Each thread looks at the clock once every [`BATCH`] operations, so the run
/// lasts at least `duration` and overshoots by at most one batch; the reported
/// [`Measurement::elapsed`] is the real span, not `duration`.
///
/// # Panics
///
/// If `threads` is zero, or (re-raised here) if `make_op` or an operation panics.
///
/// # Examples
///
/// ```
/// use floodgate_bench::{run_for, BATCH};
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::time::Duration;
///
/// let hits = AtomicU64::new(0);
/// let m = run_for(2, Duration::from_millis(5), |_| {
///     || {
///         hits.fetch_add(1, Ordering::Relaxed);
///     }
/// });
/// assert_eq!(m.ops, hits.load(Ordering::Relaxed));
/// assert_eq!(m.ops % BATCH, 0);
/// assert!(m.elapsed >= Duration::from_millis(5));
/// println!("{:.1} M ops/s", m.ops_per_sec() / 1e6);
/// ```
pub fn run_for<M, Op, R>(threads: usize, duration: Duration, make_op: M) -> Measurement
where
    M: Fn(usize) -> Op + Sync,
    Op: FnMut() -> R,
    R: Outcome,
{
    on_threads(threads, make_op, |op| {
        let start = Instant::now();
        in_batches(op, u64::MAX, || start.elapsed() >= duration)
    })
}

/// Runs `op` in batches of [`BATCH`] operations (the last one shorter, `limit` in
/// all at most), asking `stop` after each whether to end there; returns how many ran
/// and how many of them admitted.
#[inline(always)]
fn in_batches<Op, R>(op: &mut Op, limit: u64, mut stop: impl FnMut() -> bool) -> (u64, u64)
where
    Op: FnMut() -> R,
    R: Outcome,
{
    let (mut ops, mut admitted) = (0u64, 0u64);
    while ops < limit {
        let batch = BATCH.min(limit - ops);
        for _ in 0..batch {
            admitted += u64::from(op().admitted());
        }
        ops += batch;
        if stop() {
            break;
        }
    }
    (ops, admitted)
}

/// How much work one measured run does: a number of operations per thread, exact or at
/// most (what criterion's `iter_custom` asks for), or a time span after a warm-up (what
/// a command with a time budget wants).
///
/// # Examples
///
/// ```
/// use floodgate_bench::Budget;
/// use std::time::Duration;
///
/// let fixed = Budget::Ops(1_000);
/// let timed = Budget::Time { warm_up: Duration::from_millis(5), run: Duration::from_millis(20) };
/// assert_ne!(fixed, timed);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Budget {
    /// This many operations on each thread, no warm-up ([`run_ops`]: exact counts,
    /// e.g. for counting instructions per operation).
    Ops(u64),
    /// At most this many operations on each thread, all stopping when the first thread
    /// has done its share, no warm-up ([`run_together`]: what criterion's
    /// `iter_custom` runs, as it warms up itself).
    UpTo(u64),
    /// First `warm_up` on the same state (untimed, discarded), then `run` measured.
    Time {
        /// Run, untimed, before the measured run: caches, branch predictors, the TSC
        /// calibration and the CPU's frequency settle here.
        warm_up: Duration,
        /// The measured span (at least; see [`run_for`]).
        run: Duration,
    },
}

/// Runs `make_op`'s operations on `threads` threads under `budget` and returns the
/// measured run (for [`Budget::Time`], after an untimed warm-up run whose operations
/// act on the same state).
///
/// # Panics
///
/// If `threads` is zero, or (re-raised here) if `make_op` or an operation panics.
///
/// # Examples
///
/// ```
/// use floodgate_bench::{measure, Budget};
/// use std::sync::atomic::{AtomicU64, Ordering};
///
/// let hits = AtomicU64::new(0);
/// let m = measure(2, Budget::Ops(100), |_| || hits.fetch_add(1, Ordering::Relaxed) % 2 == 0);
/// assert_eq!((m.ops, m.admitted), (200, 100));
/// ```
pub fn measure<M, Op, R>(threads: usize, budget: Budget, make_op: M) -> Measurement
where
    M: Fn(usize) -> Op + Sync,
    Op: FnMut() -> R,
    R: Outcome,
{
    match budget {
        Budget::Ops(ops) => run_ops(threads, ops, make_op),
        Budget::UpTo(ops) => run_together(threads, ops, make_op),
        Budget::Time { warm_up, run } => {
            if !warm_up.is_zero() {
                run_for(threads, warm_up, &make_op);
            }
            run_for(threads, run, make_op)
        }
    }
}

/// As [`run_threads`], but returns the whole [`Measurement`] (operations, admitted,
/// elapsed).
///
/// # Panics
///
/// If `threads` is zero, or (re-raised here) if `make_op` or an operation panics.
///
/// # Examples
///
/// ```
/// use floodgate_bench::run_ops;
///
/// let m = run_ops(3, 10, |thread| move || thread == 0);
/// assert_eq!((m.ops, m.admitted), (30, 10));
/// ```
pub fn run_ops<M, Op, R>(threads: usize, ops_per_thread: u64, make_op: M) -> Measurement
where
    M: Fn(usize) -> Op + Sync,
    Op: FnMut() -> R,
    R: Outcome,
{
    on_threads(threads, make_op, |op| {
        let mut admitted = 0u64;
        for _ in 0..ops_per_thread {
            admitted += u64::from(op().admitted());
        }
        (ops_per_thread, admitted)
    })
}

/// Runs at most `ops_per_thread` operations on each of `threads` threads: the first
/// thread to finish its share stops the others at their next look (every [`BATCH`]
/// operations), so no part of the timed span has fewer threads working than the rest.
///
/// With a fixed count per thread ([`run_ops`]), a contender that serves one thread at
/// a time (a mutex that the thread holding it keeps re-taking) lets that thread finish
/// early; the others then run alone, uncontended and faster, and the run reports a
/// throughput that no moment of contention had. Here [`Measurement::ops`] is what was
/// done; [`Measurement::time_for`] scales the span to the count that was asked for.
///
/// # Panics
///
/// If `threads` is zero, or (re-raised here) if `make_op` or an operation panics.
///
/// # Examples
///
/// ```
/// use floodgate_bench::run_together;
///
/// let m = run_together(1, 5_000, |_| || true);
/// assert_eq!((m.ops, m.admitted), (5_000, 5_000));
/// let m = run_together(2, 5_000, |_| || true);
/// assert!(m.ops >= 5_000 && m.ops <= 10_000);
/// ```
pub fn run_together<M, Op, R>(threads: usize, ops_per_thread: u64, make_op: M) -> Measurement
where
    M: Fn(usize) -> Op + Sync,
    Op: FnMut() -> R,
    R: Outcome,
{
    let stop = CachePadded::new(AtomicBool::new(false));
    on_threads(threads, make_op, |op| {
        // Relaxed: a flag, read once a batch; it orders nothing.
        let done = in_batches(op, ops_per_thread, || stop.load(Ordering::Relaxed));
        if done.0 == ops_per_thread {
            stop.store(true, Ordering::Relaxed);
        }
        done
    })
}

/// The common core: on each of `threads` scoped threads, `make_op(i)` builds the
/// thread's operation (untimed); after a barrier every thread runs `drive` over it once,
/// which returns the number of operations it ran and how many of them admitted.
/// Timestamps are taken by the workers around their own `drive`.
fn on_threads<M, Op, D>(threads: usize, make_op: M, drive: D) -> Measurement
where
    M: Fn(usize) -> Op + Sync,
    D: Fn(&mut Op) -> (u64, u64) + Sync,
{
    assert!(threads > 0, "a run needs at least one thread");
    let barrier = Barrier::new(threads);
    let running = CachePadded::new(AtomicUsize::new(0));
    let spans: Vec<(Instant, Instant, (u64, u64))> = thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|index| {
                let (barrier, running, make_op, drive) = (&barrier, &running, &make_op, &drive);
                scope.spawn(move || {
                    // A setup that panics must still reach the barrier, or the other
                    // threads would wait forever; its panic is re-raised right after.
                    let op = panic::catch_unwind(AssertUnwindSafe(|| make_op(index)));
                    barrier.wait();
                    // The barrier releases its last thread at once and wakes the others
                    // later (a futex wake each); spinning until all are running keeps
                    // the first from timing itself alone. Relaxed: a count, nothing
                    // else is published through it.
                    running.fetch_add(1, Ordering::Relaxed);
                    let backoff = Backoff::new();
                    while running.load(Ordering::Relaxed) < threads {
                        backoff.snooze();
                    }
                    let mut op = op.unwrap_or_else(|payload| panic::resume_unwind(payload));
                    let start = Instant::now();
                    let ops = drive(&mut op);
                    (start, Instant::now(), ops)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|payload| panic::resume_unwind(payload))
            })
            .collect()
    });
    let first_start = spans.iter().map(|s| s.0).min();
    let last_end = spans.iter().map(|s| s.1).max();
    let elapsed = match (first_start, last_end) {
        (Some(start), Some(end)) => end.saturating_duration_since(start),
        _ => Duration::ZERO,
    };
    Measurement {
        ops: spans.iter().map(|&(_, _, (ops, _))| ops).sum(),
        admitted: spans.iter().map(|&(_, _, (_, admitted))| admitted).sum(),
        elapsed,
    }
}

/// Repeated figures as `median [min–max]`: the median (the upper one of an even
/// count) and the range, for the examples that print rounds of one measurement.
///
/// # Examples
///
/// ```
/// use floodgate_bench::median_and_range;
/// assert_eq!(median_and_range(vec![3.0, 1.0, 2.0]), "2.0 [1.0–3.0]");
/// assert_eq!(median_and_range(vec![]), "—");
/// ```
pub fn median_and_range(mut runs: Vec<f64>) -> String {
    runs.sort_by(f64::total_cmp);
    match (runs.first(), runs.get(runs.len() / 2), runs.last()) {
        (Some(min), Some(median), Some(max)) => format!("{median:.1} [{min:.1}–{max:.1}]"),
        _ => "—".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::Mutex;

    #[test]
    fn every_thread_runs_its_operation_exactly_ops_per_thread_times() {
        for threads in [1, 2, 3, 5] {
            let counts: Vec<AtomicU64> = (0..threads).map(|_| AtomicU64::new(0)).collect();
            let built = Mutex::new(Vec::new());
            run_threads(threads, 777, |thread| {
                built.lock().unwrap().push(thread);
                let mine = &counts[thread];
                move || {
                    mine.fetch_add(1, Ordering::Relaxed);
                }
            });
            for (thread, count) in counts.iter().enumerate() {
                assert_eq!(count.load(Ordering::Relaxed), 777, "thread {thread}");
            }
            // make_op ran once per thread index, each index once.
            let mut built = built.into_inner().unwrap();
            built.sort_unstable();
            assert_eq!(built, (0..threads).collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_run_together_stops_every_thread_when_the_first_is_done() {
        // Thread 1's first operation waits until thread 0 has done its whole share and
        // the harness has had ample time to raise the stop flag: a fixed count would
        // then make thread 1 run its share alone. Here it stops at its first look.
        let share = 20 * BATCH;
        let counts: Vec<AtomicU64> = (0..2).map(|_| AtomicU64::new(0)).collect();
        let m = run_together(2, share, |thread| {
            let counts = &counts;
            move || {
                let mine = counts[thread].fetch_add(1, Ordering::Relaxed);
                if thread == 1 && mine == 0 {
                    while counts[0].load(Ordering::Relaxed) < share {
                        thread::yield_now();
                    }
                    thread::sleep(Duration::from_millis(50));
                }
                true
            }
        });
        let done: Vec<u64> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        assert_eq!(done[0], share);
        assert!(done[1] < share && done[1] % BATCH == 0, "{done:?}");
        assert_eq!((m.ops, m.admitted), (done[0] + done[1], done[0] + done[1]));
        // And the span scales to the asked-for count at the run's own rate.
        assert_eq!(m.time_for(m.ops), m.elapsed);
        assert!(m.time_for(2 * share) > m.elapsed);
    }

    #[test]
    fn a_run_together_on_even_threads_does_every_share() {
        // Nothing waits: a share smaller than a batch is done in one go, and a thread
        // only stops early at a batch boundary, so each does its share exactly.
        for threads in [1, 2, 3] {
            let counts: Vec<AtomicU64> = (0..threads).map(|_| AtomicU64::new(0)).collect();
            let m = run_together(threads, BATCH - 1, |thread| {
                let mine = &counts[thread];
                move || {
                    mine.fetch_add(1, Ordering::Relaxed);
                }
            });
            for count in &counts {
                assert_eq!(count.load(Ordering::Relaxed), BATCH - 1);
            }
            assert_eq!(m.ops, threads as u64 * (BATCH - 1));
        }
    }

    #[test]
    fn each_operation_runs_on_its_own_thread() {
        let owners = Mutex::new(std::collections::HashMap::new());
        run_threads(3, 50, |thread| {
            let owners = &owners;
            move || {
                let me = thread::current().id();
                let mut map = owners.lock().unwrap();
                let owner = *map.entry(thread).or_insert(me);
                assert_eq!(owner, me, "operation of thread {thread} ran elsewhere");
            }
        });
        let ids: std::collections::HashSet<_> =
            owners.into_inner().unwrap().into_values().collect();
        assert_eq!(ids.len(), 3);
    }

    #[test]
    fn no_operation_starts_before_every_thread_is_set_up() {
        let threads = 4;
        let built = AtomicUsize::new(0);
        let early = AtomicU64::new(0);
        run_threads(threads, 10, |_| {
            // Slow, uneven setup: without the barrier, fast threads would start early.
            built.fetch_add(1, Ordering::SeqCst);
            || {
                if built.load(Ordering::SeqCst) != threads {
                    early.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        assert_eq!(early.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn zero_operations_run_nothing() {
        let calls = AtomicU64::new(0);
        let built = AtomicU64::new(0);
        run_threads(2, 0, |_| {
            built.fetch_add(1, Ordering::Relaxed);
            || {
                calls.fetch_add(1, Ordering::Relaxed);
            }
        });
        assert_eq!(calls.load(Ordering::Relaxed), 0);
        assert_eq!(built.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn run_for_reports_the_operations_it_ran_in_whole_batches() {
        let counts: Vec<AtomicU64> = (0..2).map(|_| AtomicU64::new(0)).collect();
        let duration = Duration::from_millis(2);
        let m = run_for(2, duration, |thread| {
            let mine = &counts[thread];
            move || {
                mine.fetch_add(1, Ordering::Relaxed);
            }
        });
        let per_thread: Vec<u64> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        assert_eq!(m.ops, per_thread.iter().sum::<u64>());
        for ops in per_thread {
            assert!(ops >= BATCH && ops % BATCH == 0, "{ops}");
        }
        // Each worker stops only once its own clock has passed `duration`, and the span
        // covers every worker, so this holds however slow the machine is.
        assert!(m.elapsed >= duration);
    }

    #[test]
    fn run_for_counts_the_operations_that_return_true() {
        // Each thread admits every other operation; a thread runs whole batches (an
        // even count), so exactly half of all operations admit.
        let calls = AtomicU64::new(0);
        let m = run_for(3, Duration::from_millis(2), |_| {
            let mut parity = false;
            let calls = &calls;
            move || {
                calls.fetch_add(1, Ordering::Relaxed);
                parity = !parity;
                parity
            }
        });
        assert_eq!(m.ops, calls.load(Ordering::Relaxed));
        assert!(m.ops > 0);
        assert_eq!(m.admitted * 2, m.ops);
        let never = run_for(1, Duration::from_millis(1), |_| || false);
        assert_eq!((never.admitted, never.ops % BATCH), (0, 0));
        let unit = run_for(1, Duration::from_millis(1), |_| || ());
        assert_eq!(unit.admitted, 0);
        assert!(unit.ops >= BATCH);
    }

    #[test]
    fn run_threads_accepts_operations_returning_bool() {
        let calls = AtomicU64::new(0);
        run_threads(2, 100, |_| {
            || {
                calls.fetch_add(1, Ordering::Relaxed);
                true
            }
        });
        assert_eq!(calls.load(Ordering::Relaxed), 200);
    }

    #[test]
    fn a_panicking_operation_is_re_raised() {
        let result = std::panic::catch_unwind(|| {
            run_threads(2, 3, |thread| {
                move || {
                    if thread == 1 {
                        panic!("operation failed");
                    }
                }
            })
        });
        let payload = result.expect_err("the panic must reach the caller");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"operation failed"));
    }

    #[test]
    fn a_panicking_setup_is_re_raised_without_deadlock() {
        let result = std::panic::catch_unwind(|| {
            run_threads(3, 3, |thread| {
                assert_ne!(thread, 2, "setup failed");
                || {}
            })
        });
        assert!(result.is_err());
    }

    #[test]
    #[should_panic(expected = "at least one thread")]
    fn zero_threads_is_refused() {
        run_threads(0, 1, |_| || {});
    }

    #[test]
    fn measurement_arithmetic() {
        let m = Measurement {
            ops: 3,
            admitted: 0,
            elapsed: Duration::from_nanos(10),
        };
        assert_eq!(m.per_op(), Duration::from_nanos(3));
        assert_eq!(m.ops_per_sec(), 3e8);
        let empty = Measurement {
            ops: 0,
            admitted: 0,
            elapsed: Duration::from_secs(1),
        };
        assert_eq!(empty.per_op(), Duration::ZERO);
        assert_eq!(empty.ops_per_sec(), 0.0);
    }
}
