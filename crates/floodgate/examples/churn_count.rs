//! Workloads for counting the keyed table's instructions and cache misses under
//! callgrind or cachegrind (BENCHMARKS.md, "The churn insert, counted"): `fill`,
//! `flood`, `flood_spread`, `churn`, `known`, each on `heap` or `inline` storage, over 8 shards, hash
//! seed 7, a `ManualClock`, decisions at explicit instants (no clock read). The
//! capacity (default 10⁴) and the number of unique keys a `flood` or a `churn`
//! inserts (default 10⁵) are optional arguments.
//!
//! `valgrind --tool=callgrind target/release/examples/churn_count churn heap`
//! `valgrind --tool=cachegrind --cache-sim=yes target/release/examples/churn_count flood inline 1000000 1500000`

use floodgate::{Gcra, KeyedBuilder, ManualClock, Nanos, Policy};

/// The workload's sizes: the table's capacity and the unique keys a flood or a churn
/// inserts.
#[derive(Clone, Copy)]
struct Sizes {
    capacity: u64,
    keys: u64,
}

fn run<T: Fn(u64, Nanos) -> bool>(check: T, workload: &str, sizes: Sizes) -> u64 {
    let mut allowed = 0u64;
    let mut count = |ok: bool| allowed += u64::from(ok);
    let fill = |count: &mut dyn FnMut(bool)| {
        for key in 0..sizes.capacity {
            count(check(key, Nanos::from_secs(1)));
        }
    };
    match workload {
        "fill" => fill(&mut count),
        // Unique keys at one instant (one an hour: every key stays live).
        "flood" => {
            for key in 0..sizes.keys {
                count(check(key, Nanos::from_secs(1)));
            }
        }
        // Unique keys one a microsecond (one an hour: every key stays live, and no two
        // states are equal: an eviction takes the oldest key of its sample).
        "flood_spread" => {
            for key in 0..sizes.keys {
                count(check(key, Nanos::new(1_000_000_000 + key * 1_000)));
            }
        }
        // Unique keys, one a millisecond (1/s: idle a second later).
        "churn" => {
            for key in 0..sizes.keys {
                count(check(key, Nanos::new((1_000 + key) * 1_000_000)));
            }
        }
        // The fill, then 10 rounds of checks of the keys held.
        "known" => {
            fill(&mut count);
            for round in 0..10 {
                for key in 0..sizes.capacity {
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
    let sizes = Sizes {
        capacity: args.get(3).map_or(Ok(10_000), |a| a.parse())?,
        keys: args.get(4).map_or(Ok(100_000), |a| a.parse())?,
    };
    let policy = match workload {
        "flood" | "flood_spread" => Policy::per_hour(1)?,
        _ => Policy::per_second(1)?,
    };
    let builder = KeyedBuilder::new(Gcra::new(policy))
        .capacity(usize::try_from(sizes.capacity)?)
        .shards(8)
        .hash_seed(7)
        // No calibration of a real clock in the count: every check names its instant.
        .clock(ManualClock::new());
    let (allowed, metrics) = match storage {
        "heap" => {
            let keyed = builder.build::<u64>()?;
            let a = run(
                |k, t| keyed.check_n_at(&k, t, 1).is_allowed(),
                workload,
                sizes,
            );
            (a, keyed.metrics())
        }
        "inline" => {
            let keyed = builder.build_inline::<u64>()?;
            let a = run(
                |k, t| keyed.check_n_at(&k, t, 1).is_allowed(),
                workload,
                sizes,
            );
            (a, keyed.metrics())
        }
        other => return Err(format!("unknown storage {other}").into()),
    };
    println!("{workload} {storage}: {allowed} allowed, {metrics:?}");
    Ok(())
}
