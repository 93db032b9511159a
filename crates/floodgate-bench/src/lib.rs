//! The floodgate benchmark matrix and the multi-thread harness that runs it.
//!
//! One matrix ([`matrix::groups`]) of workloads × implementations × key counts ×
//! threads, used by both the criterion suites (`cargo bench -p floodgate-benches`,
//! groups `uncontended`, `contended`, `keyed`, `algorithms`, `clock`) and the
//! `floodgate bench` command, so the two measure the same code. The harness
//! ([`run_threads`], [`run_for`], [`measure`]) runs closures on scoped threads behind a
//! start barrier and times the workers themselves.
//!
//! Besides floodgate the matrix holds its mutex twin, the textbook versions, governor
//! (feature `compare`, on by default) and two physical ceilings: the **floor** (a clock
//! read and one uncontended CAS) and the **no-write ceiling** (a clock read and a load
//! of a shared read-only word).
//!
//! The keyed groups visit their keys uniformly or Zipf-distributed ([`keys`]); the
//! memory each keyed contender holds per key is counted by [`memory`] (a counting
//! wrapper around the binary's allocator; `floodgate bench --memory`).
//!
//! # Examples
//!
//! ```
//! use floodgate_bench::matrix::{groups, Setup};
//! use floodgate_bench::Budget;
//!
//! let matrix = groups();
//! let hot = &matrix[0];
//! let run = hot.contenders[0].measure(&Setup { threads: 1, keys: 1, budget: Budget::Ops(1_000), seed: 0 });
//! assert_eq!(run.ops, 1_000);
//! ```

mod harness;
pub mod keys;
pub mod latency;
pub mod matrix;
pub mod memory;

pub use harness::{
    measure, median_and_range, run_for, run_ops, run_threads, run_together, Budget, Measurement,
    Outcome, BATCH,
};
