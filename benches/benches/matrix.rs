//! The benchmark matrix (`floodgate_bench::matrix`) as criterion groups: every
//! contender of a workload in the same group, so the report shows ratios from one run.
//!
//! Groups (benchmark ids are `<group>/<workload>/<keys>/<threads>t/<contender>`):
//!
//! * `uncontended` — GCRA on one hot key, one thread: floodgate, its mutex twin, the
//!   textbook bucket, governor, the floor and the no-write ceiling;
//! * `contended` — the same at two threads;
//! * `keyed` — GCRA over 10^3 and 10^5 keys (inserted before the timed loop), both key
//!   policies (booked ahead, idle between visits), each with uniform keys
//!   (`gcra-keyed-booked`, `gcra-keyed-idle`) and Zipf keys, s = 1
//!   (`gcra-keyed-booked-zipf`, `gcra-keyed-idle-zipf`), and the idle policy with each
//!   thread on its own share of the keys (`gcra-keyed-idle-disjoint`), one and two
//!   threads;
//! * `algorithms` — the fixed window, the sliding window counter and the sliding log on
//!   one hot key, one and two threads;
//! * `clock` — one reading of each clock source.
//!
//! Each multi-thread run goes through `floodgate_bench::measure` (`iter_custom`, at
//! most the asked-for number of decisions per thread, every thread stopping when the
//! first is done: `Budget::UpTo`); the time per iteration is that of the whole
//! machine, scaled to the asked-for count at the run's own rate, so criterion's
//! throughput is total decisions per second with every thread working.
//!
//! Multi-thread cells take ten samples of equal length (a tenth of the measurement
//! time each): the steady state of contention, not its first milliseconds.
//!
//! Run: `cargo bench -p floodgate-benches -- --warm-up-time 0.5 --measurement-time 2`
//! (add a filter such as `contended` to run one group).

use std::hint::black_box;

use criterion::{Criterion, SamplingMode, Throughput};
use floodgate_bench::matrix::{clock_reads, groups, Group, Setup, Suite};
use floodgate_bench::Budget;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Thread counts of the multi-thread groups.
const THREADS: [usize; 2] = [1, 2];

/// Every contender of `group` at `keys` keys and `threads` threads, in criterion group
/// `name`.
fn bench(c: &mut Criterion, name: &str, group: &Group, keys: u64, threads: usize) {
    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Elements(threads as u64));
    if threads > 1 {
        // Ten samples of equal length (a tenth of the measurement time each), not
        // criterion's linear ramp of a hundred whose first samples last a millisecond
        // or less. The 2-thread mutex twin read faster in ~30 ms samples than in
        // second-long ones or in `floodgate bench`'s runs: short samples catch the
        // start of contention, not the steady state a proxy sees (BENCHMARKS.md,
        // "Criterion's sample length, and the suite's multi-thread cells").
        g.sampling_mode(SamplingMode::Flat).sample_size(10);
    }
    for contender in &group.contenders {
        let id = format!(
            "{}/{keys}/{threads}t/{}",
            group.id,
            contender.implementation.id()
        );
        // Built once per cell (limiter made, keys inserted); each sample measures the
        // same table again, its keys in the states earlier samples left them in.
        let mut prepared = (contender.run)(&Setup {
            threads,
            keys,
            budget: Budget::Ops(0),
            seed: 0,
        });
        g.bench_function(id, |b| {
            b.iter_custom(|iters| {
                let m = prepared.run(Budget::UpTo(iters));
                assert!(
                    m.admitted > 0 || !group.workload.contains("every decision admits"),
                    "{} {:?} admitted nothing",
                    group.id,
                    contender.implementation
                );
                m.time_for(iters * threads as u64)
            });
        });
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    for group in &groups() {
        match group.suite {
            Suite::HotKey => {
                bench(&mut c, "uncontended", group, 1, 1);
                bench(&mut c, "contended", group, 1, 2);
            }
            Suite::Keyed => {
                for &keys in &group.key_counts {
                    for threads in THREADS {
                        bench(&mut c, "keyed", group, keys, threads);
                    }
                }
            }
            Suite::Algorithms => {
                for threads in THREADS {
                    bench(&mut c, "algorithms", group, 1, threads);
                }
            }
        }
    }
    let mut g = c.benchmark_group("clock");
    g.throughput(Throughput::Elements(1));
    for (name, read) in clock_reads() {
        g.bench_function(name, |b| b.iter(|| black_box(read())));
    }
    g.finish();
    c.final_summary();
}
