//! CAS retries per decision, counted per thread (feature `cas-stats`, for benchmarks).
//!
//! With the feature on, the crate's one compare-exchange loop records, on the calling
//! thread, how many loops it ran and how many of their CAS attempts failed (each
//! failure is one retry). The counters are thread-local `Cell`s: no shared write, no
//! atomic, but still a few instructions per decision, which is why this is a feature
//! and never in the default build. [`take`] returns this thread's counts and resets
//! them.
//!
//! # Examples
//!
//! ```
//! use floodgate::{cas_stats, Gcra, Policy, RateLimiter};
//!
//! let limiter = RateLimiter::new(Gcra::new(Policy::per_second(1_000)?));
//! cas_stats::take();
//! for _ in 0..10 {
//!     let _ = limiter.check();
//! }
//! let stats = cas_stats::take();
//! assert_eq!((stats.loops, stats.retries), (10, 0)); // one thread: no CAS ever fails
//! # Ok::<(), floodgate::PolicyError>(())
//! ```

use std::cell::Cell;

/// One thread's CAS loop counts since the last [`take`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CasStats {
    /// Compare-exchange loops run (decisions, refunds, retirements).
    pub loops: u64,
    /// Failed CAS attempts over all loops (each is one retry).
    pub retries: u64,
    /// The most retries one loop needed.
    pub max_retries: u64,
}

impl CasStats {
    /// Mean retries per loop (0 when no loop ran).
    ///
    /// # Examples
    ///
    /// ```
    /// let s = floodgate::cas_stats::CasStats { loops: 4, retries: 2, max_retries: 1 };
    /// assert_eq!(s.mean_retries(), 0.5);
    /// ```
    pub fn mean_retries(&self) -> f64 {
        if self.loops == 0 {
            0.0
        } else {
            self.retries as f64 / self.loops as f64
        }
    }

    /// Adds another thread's counts to these.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::cas_stats::CasStats;
    /// let mut a = CasStats { loops: 1, retries: 3, max_retries: 3 };
    /// a.merge(CasStats { loops: 2, retries: 1, max_retries: 1 });
    /// assert_eq!(a, CasStats { loops: 3, retries: 4, max_retries: 3 });
    /// ```
    pub fn merge(&mut self, other: CasStats) {
        self.loops += other.loops;
        self.retries += other.retries;
        self.max_retries = self.max_retries.max(other.max_retries);
    }
}

thread_local! {
    static STATS: Cell<CasStats> = const { Cell::new(CasStats { loops: 0, retries: 0, max_retries: 0 }) };
}

/// Records one finished loop that needed `retries` retries (the CAS loop calls this).
#[inline]
pub(crate) fn record(retries: u64) {
    STATS.with(|s| {
        let mut stats = s.get();
        stats.loops += 1;
        stats.retries += retries;
        stats.max_retries = stats.max_retries.max(retries);
        s.set(stats);
    });
}

/// This thread's counts since the last call, which it resets.
///
/// # Examples
///
/// ```
/// let _ = floodgate::cas_stats::take();
/// assert_eq!(floodgate::cas_stats::take().loops, 0);
/// ```
pub fn take() -> CasStats {
    STATS.with(|s| s.replace(CasStats::default()))
}
