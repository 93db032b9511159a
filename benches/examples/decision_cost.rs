//! Runs one hot-key GCRA contender of the benchmark matrix on one thread, for counting
//! instructions per decision with callgrind — a measure that, unlike time, does not
//! depend on what else the machine is doing.
//!
//! ```text
//! cargo build -p floodgate-benches --profile bench --example decision_cost
//! for n in 1000000 2000000; do
//!   valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$n.out \
//!     target/release/examples/decision_cost floodgate $n
//! done
//! # instructions per decision = (the "summary:" of 2M − that of 1M) / 1000000
//! ```
//!
//! Contenders: the ids of the matrix's hot-key group (`floodgate`, `mutex_twin`,
//! `textbook`, `governor`, `floor`, `no_write_ceiling`). The harness loop is inlined
//! into its thread, so no function marks the timed part; the difference of two runs
//! cancels most of what both do once (building the limiter, inserting keys, one
//! thread start and one barrier), but not the clock's calibration, which runs for a
//! wall-clock time that valgrind stretches by a varying amount: the difference moves
//! by up to ±6 instructions a decision between two runs of one binary. For a keyed
//! group, `--toggle-collect='floodgate_bench::matrix::keyed_floodgate::*'` (governor:
//! `'*check_key'`) counts only inside the limiter call, exactly (benches/README.md).
//!
//! Another group of the matrix, with its key count, follows as two more arguments,
//! e.g. `decision_cost governor 1000000 gcra-keyed-idle 1000000`; keyed groups insert
//! their keys before the run too (add `--cache-sim=yes` for the cache misses). A keyed
//! group also takes floodgate on its other storages (the group's `floodgate` is
//! `Inline`): `floodgate_heap`, `floodgate_heap_string`, `floodgate_fingerprint`,
//! `floodgate_fingerprint_string` (`matrix::keyed_storages`; count the string ones
//! inside the call with `--toggle-collect='floodgate_bench::matrix::keyed_floodgate_string::*'`).

use std::process::ExitCode;

use floodgate_bench::matrix::{groups, keyed_storages, Runner, Setup, Suite};
use floodgate_bench::Budget;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let matrix = groups();
    let (group, keys) = match args.get(2..4) {
        Some([group, keys]) => (Some(group.as_str()), keys.parse::<u64>().ok()),
        _ => (None, Some(1)),
    };
    let Some(hot) = matrix.iter().find(|g| match group {
        Some(id) => g.id == id,
        None => g.suite == Suite::HotKey,
    }) else {
        eprintln!("the matrix has no such group");
        return ExitCode::from(1);
    };
    // The group's contenders, then (a keyed group) floodgate on its other storages.
    let runs: Vec<(&str, Runner)> = hot
        .contenders
        .iter()
        .map(|c| (c.implementation.id(), c.run))
        .chain(
            keyed_storages(&hot.id)
                .unwrap_or_default()
                .into_iter()
                .map(|t| (t.id, t.build)),
        )
        .collect();
    let ids: Vec<&str> = runs.iter().map(|(id, _)| *id).collect();
    let usage = format!(
        "usage: decision_cost <{}> <decisions> [<group> <keys>]",
        ids.join("|")
    );
    let (Some(keys), [wanted, decisions, ..]) = (keys, args.as_slice()) else {
        eprintln!("{usage}");
        return ExitCode::from(2);
    };
    let (Some((_, run)), Ok(decisions)) = (
        runs.iter().find(|(id, _)| id == wanted),
        decisions.parse::<u64>(),
    ) else {
        eprintln!("{usage}");
        return ExitCode::from(2);
    };
    let setup = Setup {
        threads: 1,
        keys,
        budget: Budget::Ops(decisions),
        seed: 0,
    };
    let m = run(&setup).run(setup.budget);
    println!(
        "{wanted}: {} decisions, {} admitted, {:?} per decision",
        m.ops,
        m.admitted,
        m.per_op()
    );
    ExitCode::SUCCESS
}
