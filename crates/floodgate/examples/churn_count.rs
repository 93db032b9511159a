//! Workloads for counting the keyed table's instructions under callgrind
//! (BENCHMARKS.md, "The churn insert, counted"): `fill`, `flood`, `churn`, `known`,
//! each on `heap` or `inline` storage, capacity 10⁴ over 8 shards, hash seed 7,
//! a `ManualClock`, decisions at explicit instants (no clock read).
//!
//! `valgrind --tool=callgrind target/release/examples/churn_count churn heap`

use floodgate::{Gcra, KeyedBuilder, ManualClock, Nanos, Policy};

const CAPACITY: u64 = 10_000;

fn run<T: Fn(u64, Nanos) -> bool>(check: T, workload: &str) -> u64 {
    let mut allowed = 0u64;
    let mut count = |ok: bool| allowed += u64::from(ok);
    let fill = |count: &mut dyn FnMut(bool)| {
        for key in 0..CAPACITY {
            count(check(key, Nanos::from_secs(1)));
        }
    };
    match workload {
        "fill" => fill(&mut count),
        // 10⁵ unique keys at one instant (one an hour: every key stays live).
        "flood" => {
            for key in 0..100_000 {
                count(check(key, Nanos::from_secs(1)));
            }
        }
        // 10⁵ unique keys, one a millisecond (1/s: idle a second later).
        "churn" => {
            for key in 0..100_000u64 {
                count(check(key, Nanos::new((1_000 + key) * 1_000_000)));
            }
        }
        // The fill, then 10 rounds of checks of the keys held.
        "known" => {
            fill(&mut count);
            for round in 0..10 {
                for key in 0..CAPACITY {
                    count(check(key, Nanos::from_secs(2 + round)));
                }
            }
        }
        other => panic!("unknown workload {other}"),
    }
    allowed
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let workload = args.get(1).map_or("churn", String::as_str);
    let storage = args.get(2).map_or("heap", String::as_str);
    let policy = match workload {
        "flood" => Policy::per_hour(1)?,
        _ => Policy::per_second(1)?,
    };
    let builder = KeyedBuilder::new(Gcra::new(policy))
        .capacity(CAPACITY as usize)
        .shards(8)
        .hash_seed(7)
        // No calibration of a real clock in the count: every check names its instant.
        .clock(ManualClock::new());
    let (allowed, metrics) = match storage {
        "heap" => {
            let keyed = builder.build::<u64>()?;
            let a = run(|k, t| keyed.check_n_at(&k, t, 1).is_allowed(), workload);
            (a, keyed.metrics())
        }
        "inline" => {
            let keyed = builder.build_inline::<u64>()?;
            let a = run(|k, t| keyed.check_n_at(&k, t, 1).is_allowed(), workload);
            (a, keyed.metrics())
        }
        other => return Err(format!("unknown storage {other}").into()),
    };
    println!("{workload} {storage}: {allowed} allowed, {metrics:?}");
    Ok(())
}
