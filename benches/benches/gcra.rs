//! GCRA side by side: floodgate's lock-free limiter, its mutex twin, the textbook
//! `Mutex<f64 bucket>`, governor, and the floor (one clock read + one CAS).
//!
//! Groups (benchmark ids are `<group>/<case>/<contender>`):
//!
//! * `uncontended/allow/*` — one thread, a policy so generous it never denies;
//! * `uncontended/deny/*` — one thread, a policy drained before the run (1 per hour);
//! * `contended/hot_key_2t/*` — two threads on one limiter, allow path; the time is per
//!   operation of the pair, so criterion's throughput is the total decisions per second.
//!
//! Every contender reads the allow bit of each decision and counts the unexpected ones;
//! a run that denied on the allow path (or admitted on the deny path) panics, so a
//! misconfigured policy cannot produce a flattering number.
//!
//! Run: `cargo bench -p floodgate-benches --bench gcra`; for tables over several
//! interleaved runs, `benches/run-interleaved.sh`.

mod contenders;

use std::sync::atomic::{AtomicU64, Ordering};

use contenders::{expect_path, for_each_contender, Contender, Path, Visit};
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use floodgate_benches::run_threads;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Threads in the contended run.
const THREADS: usize = 2;

type Group<'a> = BenchmarkGroup<'a, WallTime>;

/// One thread, one decision per iteration.
struct Uncontended<'g, 'c> {
    group: &'g mut Group<'c>,
    path: Path,
}

impl Visit for Uncontended<'_, '_> {
    fn visit<C: Contender>(&mut self, name: &'static str, contender: C) {
        let expected = self.path == Path::Allow;
        let mut unexpected = 0u64;
        self.group
            .bench_function(format!("{}/{name}", self.path.name()), |b| {
                b.iter(|| {
                    if contender.decide() != expected {
                        unexpected += 1;
                    }
                });
            });
        expect_path(name, self.path, unexpected);
    }
}

/// `THREADS` threads on one limiter (the hot key), allow path.
struct HotKey<'g, 'c> {
    group: &'g mut Group<'c>,
}

impl Visit for HotKey<'_, '_> {
    fn visit<C: Contender>(&mut self, name: &'static str, contender: C) {
        let denied = AtomicU64::new(0);
        self.group
            .bench_function(format!("hot_key_{THREADS}t/{name}"), |b| {
                b.iter_custom(|iters| {
                    let elapsed = run_threads(THREADS, iters, |_| {
                        || {
                            if !contender.decide() {
                                // Never taken on the allow path: no shared write in the loop.
                                denied.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    });
                    // `iters` decisions per thread: the wall time per decision of the
                    // whole machine is the elapsed time over THREADS · iters.
                    elapsed / THREADS as u32
                });
            });
        expect_path(name, Path::Allow, denied.load(Ordering::Relaxed));
    }
}

fn uncontended(c: &mut Criterion) {
    let mut group = c.benchmark_group("uncontended");
    group.throughput(Throughput::Elements(1));
    for path in [Path::Allow, Path::Deny] {
        // The floor has no denial to measure: it is the allow path's reference.
        let mut visitor = Uncontended {
            group: &mut group,
            path,
        };
        for_each_contender(path, path == Path::Allow, &mut visitor);
    }
    group.finish();
}

fn contended(c: &mut Criterion) {
    let mut group = c.benchmark_group("contended");
    // The time reported is per decision of the whole machine, so the throughput shown
    // is the total decisions per second of all threads.
    group.throughput(Throughput::Elements(1));
    for_each_contender(Path::Allow, false, &mut HotKey { group: &mut group });
    group.finish();
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    uncontended(&mut criterion);
    contended(&mut criterion);
    criterion.final_summary();
}
