//! `floodgate bench`: multi-thread throughput, side by side, in one run.
//!
//! The matrix is [`floodgate_bench::matrix::groups`] (workloads × implementations ×
//! key counts) × thread counts ([`thread_counts`]), the same one the criterion suites
//! walk. The time budget is split evenly over every run; the cells are visited
//! round-robin, `repeats` times over (at least [`MIN_REPEATS`]), so a slow drift of the
//! machine (another process, thermal throttling) spreads over every contender instead
//! of landing on one. Each run builds its limiter, inserts its keys, warms up on the
//! same limiter for a quarter of its run time (untimed), then measures.
//!
//! Each cell reports the median of its runs and their spread (max ÷ min); a cell whose
//! runs disagree by more than [`UNSTABLE_SPREAD`] is marked `!` in the table and
//! `"unstable": true` in JSON: its median is not to be trusted.
//!
//! `--memory` measures no time: it builds each keyed table
//! ([`floodgate_bench::matrix::keyed_tables`]) at the `--keys` key counts and prints
//! the heap bytes per key the binary's counting allocator saw it keep
//! ([`floodgate_bench::memory`]).

mod plot;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, IsTerminal, Write};
use std::num::NonZeroU64;
use std::time::{Duration, Instant};

use floodgate::{KeyedBuilder, DEFAULT_MEMORY_BUDGET, MAX_CAPACITY};
use floodgate_bench::keys::KeyDistribution;
use floodgate_bench::latency::Spread;
use floodgate_bench::matrix::{groups, keyed_tables, Group, Implementation, Setup, Suite};
use floodgate_bench::memory::{counting, footprint};
use floodgate_bench::{Budget, Measurement};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::cli::BenchArgs;
use crate::Failure;

/// The default total measuring time (warm-ups and key insertion come on top): about
/// 120 ms per run over the main job's 252 cells × 3 repeats. Longer runs move less
/// between invocations than 40 ms ones (BENCHMARKS.md, "How long the main job
/// measures"), but on a 2-vCPU VM three consecutive invocations still move some cells
/// not marked `!` by more than 10 % (BENCHMARKS.md, "The main job at 90 s").
const DEFAULT_TOTAL: Duration = Duration::from_secs(90);
/// `--quick`'s total.
const QUICK_TOTAL: Duration = Duration::from_secs(10);
/// No run is shorter than this: a longer total first, never fewer repeats than asked.
const MIN_RUN: Duration = Duration::from_millis(20);
/// Each cell runs at least this often, so its spread means something.
pub(crate) const MIN_REPEATS: usize = 3;
/// The most `--repeats` accepts (a larger count is refused, not cut down).
pub(crate) const MAX_REPEATS: usize = 1_000;
/// Runs of a cell whose max ÷ min exceeds this are marked unstable.
pub(crate) const UNSTABLE_SPREAD: f64 = 1.2;

/// 1, 2, 4, … up to `available`, then one power of two past it; none above `cap`.
pub(crate) fn thread_counts(available: usize, cap: Option<usize>) -> Vec<usize> {
    let mut counts = vec![1];
    while let Some(&last) = counts.last() {
        if last > available || counts.len() > 16 {
            break;
        }
        counts.push(last * 2);
    }
    if let Some(cap) = cap {
        counts.retain(|&n| n <= cap.max(1));
    }
    counts
}

/// How long each run lasts and how often each cell runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) repeats: usize,
    pub(crate) run_time: Duration,
}

impl Plan {
    /// The untimed warm-up before each run: a quarter of it.
    pub(crate) fn warm_up(&self) -> Duration {
        self.run_time / 4
    }
}

/// Splits `total` over `cells × repeats` runs; a run is never shorter than
/// [`MIN_RUN`] (the total grows instead). The product is taken in 128 bits: a matrix
/// of more runs than a `u32` counts gets the floor, not a wrapped divisor.
pub(crate) fn plan(total: Duration, cells: usize, repeats: usize) -> Plan {
    let repeats = repeats.clamp(1, MAX_REPEATS);
    let runs = cells.max(1) as u128 * repeats as u128;
    let nanos = u64::try_from(total.as_nanos() / runs).unwrap_or(u64::MAX);
    Plan {
        repeats,
        run_time: Duration::from_nanos(nanos).max(MIN_RUN),
    }
}

#[derive(Serialize)]
struct Report {
    unit: &'static str,
    machine: Machine,
    repeats: usize,
    run_ms: f64,
    warm_up_ms: f64,
    unstable_spread: f64,
    total_s: f64,
    rows: Vec<Row>,
}

#[derive(Serialize)]
struct Machine {
    cpu: String,
    available_parallelism: usize,
    arch: &'static str,
    os: &'static str,
}

#[derive(Serialize)]
struct Row {
    group: String,
    keys: u64,
    workload: String,
    threads: usize,
    /// One entry per implementation measured, by its id.
    #[serde(flatten)]
    cells: BTreeMap<&'static str, Measured>,
    /// floodgate ÷ mutex twin.
    vs_mutex_twin: Option<Ratio>,
    /// floodgate ÷ governor.
    vs_governor: Option<Ratio>,
    /// Leased mode ÷ the no-write ceiling, with a TSC read per decision and coarse.
    leased_vs_ceiling: Option<Ratio>,
    leased_coarse_vs_ceiling: Option<Ratio>,
    /// Leased mode ÷ governor.
    leased_vs_governor: Option<Ratio>,
    /// Wall time of this row's runs, all contenders and repeats.
    ran_s: f64,
}

#[derive(Serialize, Clone, Debug, PartialEq)]
struct Measured {
    /// Median of the runs, million decisions per second.
    mdps: f64,
    runs_mdps: Vec<f64>,
    /// Fastest run ÷ slowest run.
    spread: f64,
    /// `spread` above [`UNSTABLE_SPREAD`].
    unstable: bool,
    admitted_fraction: f64,
    ran_s: f64,
}

/// Million operations per second of one run.
fn millions_per_second(run: &Measurement) -> f64 {
    run.ops_per_sec() / 1e6
}

/// The median of the rates of `runs` in million operations per second (the mean of
/// the middle two for an even count); `None` for no runs.
fn median_rate(runs: &[Measurement]) -> Option<f64> {
    median(runs.iter().map(millions_per_second).collect())
}

/// The median of `values` (the mean of the middle two for an even count); `None` for
/// none.
fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    match values.len() {
        0 => None,
        n if n % 2 == 1 => Some(values[mid]),
        _ => Some((values[mid - 1] + values[mid]) / 2.0),
    }
}

/// Max ÷ min of `values` and whether it is above [`UNSTABLE_SPREAD`]: `(0.0, true)`
/// when it is not a finite number (a zero among them), which no reader can trust.
fn spread_of(values: &[f64]) -> (f64, bool) {
    let max = values.iter().copied().fold(f64::MIN, f64::max);
    let min = values.iter().copied().fold(f64::MAX, f64::min);
    let spread = if min > 0.0 { max / min } else { f64::INFINITY };
    if spread.is_finite() {
        (spread, spread > UNSTABLE_SPREAD)
    } else {
        (0.0, true)
    }
}

impl Measured {
    fn from_samples(samples: &[Measurement]) -> Option<Measured> {
        let mdps = median_rate(samples)?;
        let rates: Vec<f64> = samples.iter().map(millions_per_second).collect();
        let (spread, unstable) = spread_of(&rates);
        let operations: u64 = samples.iter().map(|s| s.ops).sum();
        let admitted: u64 = samples.iter().map(|s| s.admitted).sum();
        Some(Measured {
            mdps,
            runs_mdps: rates,
            spread,
            unstable,
            admitted_fraction: if operations == 0 {
                0.0
            } else {
                admitted as f64 / operations as f64
            },
            ran_s: samples.iter().map(|s| s.elapsed.as_secs_f64()).sum(),
        })
    }
}

impl Row {
    fn get(&self, implementation: Implementation) -> Option<&Measured> {
        self.cells.get(implementation.id())
    }
}

/// One contender's throughput ÷ another's in the same row, taken run by run.
///
/// Run `i` of every cell belongs to round `i`, and a row's cells run one after the
/// other in each round, so the two runs of a pair were measured within a second or two
/// of each other: a change of the machine's speed between rounds (another guest on
/// the host, a frequency step) moves both and cancels out of their ratio, where it
/// would stay in the ratio of the two cells' medians. On the 2-vCPU VMs of
/// BENCHMARKS.md the paired ratios moved less between invocations ("The main job's
/// ratios, paired by round").
#[derive(Serialize, Clone, Debug, PartialEq)]
struct Ratio {
    /// The median of the per-round ratios.
    median: f64,
    /// Per round: the one's run ÷ the other's.
    runs: Vec<f64>,
    /// Largest per-round ratio ÷ smallest.
    spread: f64,
    /// `spread` above [`UNSTABLE_SPREAD`]: the rounds disagree on the comparison.
    unstable: bool,
}

/// `a ÷ b`, round by round; `None` without both cells or with a round whose `b` run
/// measured nothing.
fn ratio(a: Option<&Measured>, b: Option<&Measured>) -> Option<Ratio> {
    let (a, b) = (a?, b?);
    if a.runs_mdps.len() != b.runs_mdps.len() || b.runs_mdps.iter().any(|&r| r <= 0.0) {
        return None;
    }
    let runs: Vec<f64> = a
        .runs_mdps
        .iter()
        .zip(&b.runs_mdps)
        .map(|(a, b)| a / b)
        .collect();
    let median = median(runs.clone())?;
    let (spread, unstable) = spread_of(&runs);
    Some(Ratio {
        median,
        runs,
        spread,
        unstable,
    })
}

/// A ratio as the table prints it: `median x/spread`, `!` when the rounds disagree.
fn ratio_text(r: Option<&Ratio>) -> String {
    r.map_or_else(
        || "n/a ".to_owned(),
        |r| {
            format!(
                "{:.2}x/{:.2}{}",
                r.median,
                r.spread,
                if r.unstable { "!" } else { " " }
            )
        },
    )
}

/// One cell of the matrix: a contender at a key count and a thread count.
struct Cell {
    group: usize,
    keys: u64,
    threads: usize,
    implementation: Implementation,
    run: floodgate_bench::matrix::Contender,
    label: String,
    samples: Vec<Measurement>,
}

/// Decisions each thread times in `--latency` (and with `--quick`).
const LATENCY_DECISIONS: u64 = 2_000_000;
const QUICK_LATENCY_DECISIONS: u64 = 200_000;

#[derive(Serialize)]
struct LatencyReport {
    unit: &'static str,
    machine: Machine,
    threads: usize,
    /// Rounds: each row was measured once per round, the rows' order rotating.
    rounds: usize,
    rows: Vec<LatencyRow>,
    /// Per round, floodgate's p99.9 ÷ governor's (median, min, max); absent without
    /// governor.
    floodgate_p999_over_governor: Option<[f64; 3]>,
    /// Per round, the leased mode's p99.9 ÷ governor's.
    leased_p999_over_governor: Option<[f64; 3]>,
}

/// A row's figures are the medians over the rounds; `*_range` are [min, max].
#[derive(Serialize)]
struct LatencyRow {
    implementation: &'static str,
    decisions: u64,
    p50: u64,
    p99: u64,
    p999: u64,
    max: u64,
    p99_range: [u64; 2],
    p999_range: [u64; 2],
    cas_retries_mean: Option<f64>,
    cas_retries_max: Option<u64>,
}

/// `floodgate bench --latency`.
fn run_latency(args: &BenchArgs) -> Result<(), Failure> {
    let threads = args.max_threads.map_or(2, |n| n.get().min(2));
    let decisions = if args.quick {
        QUICK_LATENCY_DECISIONS
    } else {
        LATENCY_DECISIONS
    };
    let repeats = args.repeats.get().max(MIN_REPEATS);
    let _ = floodgate::Clock::now(&floodgate::DefaultClock::new());
    let series = floodgate_bench::latency::rounds(threads, decisions, repeats);
    let ratio = |contender: Implementation| {
        let rounds_of = |i| {
            series
                .iter()
                .find(|s| s.implementation == Some(i))
                .map(|s| &s.rounds)
        };
        let (ours, theirs) = (rounds_of(contender)?, rounds_of(Implementation::Governor)?);
        let r = Spread::of(
            ours.iter()
                .zip(theirs)
                .map(|(a, b)| a.p999 as f64 / b.p999.max(1) as f64),
        )?;
        Some([r.median, r.min, r.max])
    };
    let rows: Vec<LatencyRow> = series
        .iter()
        .map(|s| {
            let (p99, p999) = (s.spread(|l| l.p99), s.spread(|l| l.p999));
            LatencyRow {
                implementation: s.implementation.map_or("timer_only", Implementation::id),
                decisions: s.decisions(),
                p50: s.spread(|l| l.p50).median,
                p99: p99.median,
                p999: p999.median,
                max: s.spread(|l| l.max).median,
                p99_range: [p99.min, p99.max],
                p999_range: [p999.min, p999.max],
                cas_retries_mean: s.cas_retries().map(|c| c.0),
                cas_retries_max: s.cas_retries().map(|c| c.1),
            }
        })
        .collect();
    let report = LatencyReport {
        unit: "nanoseconds per decision, timer included",
        machine: machine(),
        threads,
        rounds: repeats,
        rows,
        floodgate_p999_over_governor: ratio(Implementation::Floodgate),
        leased_p999_over_governor: ratio(Implementation::Leased),
    };
    print(args.json, &report, write_latency)
}

/// Standard output, buffered.
type Stdout = io::BufWriter<io::StdoutLock<'static>>;

/// Writes `report` on standard output: as JSON when `json`, else through `text`.
fn print<R: Serialize>(
    json: bool,
    report: &R,
    text: impl FnOnce(&mut Stdout, &R) -> io::Result<()>,
) -> Result<(), Failure> {
    let mut out = io::BufWriter::new(io::stdout().lock());
    let written = if json {
        serde_json::to_writer_pretty(&mut out, report)
            .map_err(io::Error::from)
            .and_then(|()| writeln!(out))
    } else {
        text(&mut out, report)
    };
    written.and_then(|()| out.flush()).map_err(Failure::output)
}

fn write_latency(out: &mut impl Write, report: &LatencyReport) -> io::Result<()> {
    writeln!(
        out,
        "floodgate bench --latency: {}, {} thread{} on one hot key",
        report.unit,
        report.threads,
        if report.threads == 1 { "" } else { "s" }
    )?;
    writeln!(
        out,
        "machine: {}, available parallelism {}",
        report.machine.cpu, report.machine.available_parallelism
    )?;
    writeln!(
        out,
        "each decision timed by two TSC reads; `timer_only` times nothing (the cost of timing)"
    )?;
    writeln!(
        out,
        "{} rounds, every row once a round in a rotating order; figures: median [min-max] \
         over the rounds",
        report.rounds
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "{:<12} {:>10} {:>7} {:>17} {:>17} {:>9} {:>10} {:>9}",
        "", "decisions", "p50", "p99", "p99.9", "max", "CAS mean", "CAS max"
    )?;
    for r in &report.rows {
        let (mean, max) = match (r.cas_retries_mean, r.cas_retries_max) {
            (Some(mean), Some(max)) => (format!("{mean:.3}"), max.to_string()),
            _ => ("n/a".to_owned(), "n/a".to_owned()),
        };
        let ranged = |median: u64, [lo, hi]: [u64; 2]| format!("{median} [{lo}-{hi}]");
        writeln!(
            out,
            "{:<12} {:>10} {:>7} {:>17} {:>17} {:>9} {:>10} {:>9}",
            r.implementation,
            r.decisions,
            r.p50,
            ranged(r.p99, r.p99_range),
            ranged(r.p999, r.p999_range),
            r.max,
            mean,
            max
        )?;
    }
    for (name, ratio) in [
        ("floodgate", report.floodgate_p999_over_governor),
        ("leased", report.leased_p999_over_governor),
    ] {
        if let Some([median, lo, hi]) = ratio {
            writeln!(
                out,
                "{name} p99.9 / governor p99.9, per round: {median:.2}x [{lo:.2}-{hi:.2}]"
            )?;
        }
    }
    Ok(())
}

/// `--memory`'s key count without `--keys`.
const MEMORY_KEYS: u64 = 1_000_000;

#[derive(Serialize)]
struct MemoryReport {
    unit: &'static str,
    rows: Vec<MemoryRow>,
}

#[derive(Serialize)]
struct MemoryRow {
    table: &'static str,
    keys: u64,
    bytes: isize,
    bytes_per_key: f64,
}

/// `floodgate bench --memory`.
fn run_memory(args: &BenchArgs) -> Result<(), Failure> {
    if !counting() {
        return Err(Failure::runtime(
            "--memory: this binary's allocator does not count its bytes".to_owned(),
        ));
    }
    check_key_counts(&args.keys)?;
    let keys: Vec<u64> = if args.keys.is_empty() {
        vec![MEMORY_KEYS]
    } else {
        args.keys.iter().map(|k| k.get()).collect()
    };
    let tables = keyed_tables();
    let progress = progress_bar((tables.len() * keys.len()) as u64);
    let mut rows = Vec::new();
    for table in &tables {
        for &n in &keys {
            progress.set_message(format!("{}, {n} keys", table.id));
            let f = footprint(table, n);
            rows.push(MemoryRow {
                table: f.id,
                keys: f.keys,
                bytes: f.bytes,
                bytes_per_key: f.bytes_per_key(),
            });
            progress.inc(1);
        }
    }
    progress.finish_and_clear();
    let report = MemoryReport {
        unit: "heap bytes per key",
        rows,
    };
    print(args.json, &report, |out, report| {
        write_memory(out, report, &keys)
    })
}

/// One line per table, one column per key count.
fn write_memory(out: &mut impl Write, report: &MemoryReport, keys: &[u64]) -> io::Result<()> {
    writeln!(out, "floodgate bench --memory: {} (u64 keys)", report.unit)?;
    writeln!(
        out,
        "bytes allocated and not freed while building the table and inserting the keys, \
         divided by the keys; capacity = keys where a table takes one; payload bytes, the \
         allocator's own overhead not included"
    )?;
    writeln!(out)?;
    let width = name_width(report.rows.iter().map(|r| r.table), "table");
    let mut header = format!("{:<width$}", "table");
    for n in keys {
        header += &format!(" {:>14}", format!("{n} keys"));
    }
    writeln!(out, "{header}")?;
    let mut tables: Vec<&str> = Vec::new();
    for row in &report.rows {
        if !tables.contains(&row.table) {
            tables.push(row.table);
        }
    }
    for table in tables {
        let mut line = format!("{table:<width$}");
        for &n in keys {
            match report.rows.iter().find(|r| r.table == table && r.keys == n) {
                Some(r) => line += &format!(" {:>14.1}", r.bytes_per_key),
                None => line += &format!(" {:>14}", "n/a"),
            }
        }
        writeln!(out, "{line}")?;
    }
    Ok(())
}

fn machine() -> Machine {
    Machine {
        cpu: cpu_model(),
        available_parallelism: std::thread::available_parallelism().map_or(1, |n| n.get()),
        arch: std::env::consts::ARCH,
        os: std::env::consts::OS,
    }
}

/// Refuses a `--keys` count given twice (it would be measured twice and printed as
/// two rows), and one that floodgate's keyed table, built as the matrix builds it
/// (capacity = keys, the library's default shards and memory budget), cannot hold,
/// before any table is built: the matrix's builders treat their capacity as valid.
fn check_key_counts(keys: &[NonZeroU64]) -> Result<(), Failure> {
    let mut seen = BTreeSet::new();
    if let Some(twice) = keys.iter().find(|&&count| !seen.insert(count)) {
        return Err(Failure::usage(format!("--keys: {twice} is given twice")));
    }
    for &count in keys {
        let refused = |reason: String| Failure::usage(format!("--keys {count}: {reason}"));
        let capacity = usize::try_from(count.get())
            .map_err(|_| refused(format!("more than {MAX_CAPACITY} keys")))?;
        let slot_bytes = KeyedBuilder::default()
            .capacity(capacity)
            .slot_bytes()
            .map_err(|e| refused(e.to_string()))?;
        if slot_bytes > DEFAULT_MEMORY_BUDGET {
            return Err(refused(format!(
                "a keyed table of {count} keys needs {slot_bytes} bytes of slots, over the \
                 default memory budget of {DEFAULT_MEMORY_BUDGET} bytes"
            )));
        }
    }
    Ok(())
}

/// The matrix's groups `--groups` names (by default those of the main job), the
/// keyed ones at the `--keys` key counts, except the one-key group (`[1]`: every
/// thread on one key), which stays at one key.
fn chosen_groups(args: &BenchArgs) -> Result<Vec<Group>, Failure> {
    let mut all = groups();
    if let Some(unknown) = args
        .groups
        .iter()
        .find(|id| !all.iter().any(|g| &g.id == *id))
    {
        let known: Vec<&str> = all.iter().map(|g| g.id.as_str()).collect();
        return Err(Failure::usage(format!(
            "--groups: no group `{unknown}`; the groups are {}",
            known.join(", ")
        )));
    }
    if args.groups.is_empty() {
        all.retain(|g| g.main_job);
    } else {
        all.retain(|g| args.groups.contains(&g.id));
    }
    if !args.keys.is_empty() {
        check_key_counts(&args.keys)?;
        let sized_by_keys = |g: &Group| g.suite == Suite::Keyed && g.key_counts != [1];
        if !all.iter().any(sized_by_keys) {
            let chosen: Vec<&str> = all.iter().map(|g| g.id.as_str()).collect();
            let sized: Vec<String> = groups()
                .into_iter()
                .filter(sized_by_keys)
                .map(|g| g.id)
                .collect();
            return Err(Failure::usage(format!(
                "--keys: no group chosen ({}) takes a key count; --keys sizes {}",
                chosen.join(", "),
                sized.join(", ")
            )));
        }
        for group in all.iter_mut().filter(|g| sized_by_keys(g)) {
            group.key_counts = args.keys.iter().map(|k| k.get()).collect();
        }
    }
    Ok(all)
}

/// Refuses a key count below the largest thread count for a group whose threads each
/// walk their own share of the keys: with fewer keys than threads, the threads past
/// the keys would all visit the last key, and the row would not measure what it says.
fn check_disjoint_shares(groups: &[Group], threads: &[usize]) -> Result<(), Failure> {
    let most = threads.iter().copied().max().unwrap_or(1);
    let suffix = format!("-{}", KeyDistribution::Disjoint.id());
    for group in groups.iter().filter(|g| g.id.ends_with(&suffix)) {
        if let Some(keys) = group.key_counts.iter().find(|&&k| k < most as u64) {
            return Err(Failure::usage(format!(
                "--keys {keys}: {} gives each of {most} threads its own keys, so it needs \
                 at least {most} keys (or --max-threads {keys})",
                group.id
            )));
        }
    }
    Ok(())
}

/// `floodgate bench`.
pub(crate) fn run(args: BenchArgs) -> Result<(), Failure> {
    if args.latency {
        return run_latency(&args);
    }
    if args.memory {
        return run_memory(&args);
    }
    let total = args.duration.unwrap_or(if args.quick {
        QUICK_TOTAL
    } else {
        DEFAULT_TOTAL
    });
    let available = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = thread_counts(available, args.max_threads.map(|n| n.get()));
    let groups = chosen_groups(&args)?;
    check_disjoint_shares(&groups, &threads)?;
    if let Some(path) = &args.plot {
        // Fail before measuring, not after: open the file for writing now, without
        // truncating one that exists (an interrupted run keeps the earlier plot) and
        // removing one this check created (an interrupted run leaves no empty file).
        let existed = path.exists();
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .map_err(|e| Failure::runtime(format!("--plot {}: {e}", path.display())))?;
        if !existed {
            let _ = std::fs::remove_file(path);
        }
    }
    let mut cells: Vec<Cell> = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        for &keys in &group.key_counts {
            for &n in &threads {
                for contender in &group.contenders {
                    cells.push(Cell {
                        group: g,
                        keys,
                        threads: n,
                        implementation: contender.implementation,
                        run: *contender,
                        label: format!(
                            "{}, {keys} key{}, {n} thread{}, {}",
                            group.id,
                            if keys == 1 { "" } else { "s" },
                            if n == 1 { "" } else { "s" },
                            contender.implementation.heading()
                        ),
                        samples: Vec::new(),
                    });
                }
            }
        }
    }
    let plan = plan(total, cells.len(), args.repeats.get().max(MIN_REPEATS));
    // Calibrate and anchor the TSC clock now, not inside the first measured run.
    let _ = floodgate::Clock::now(&floodgate::DefaultClock::new());
    let progress = progress_bar((cells.len() * plan.repeats) as u64);
    let started = Instant::now();
    for repeat in 1..=plan.repeats {
        for cell in &mut cells {
            progress.set_message(format!("{} (run {repeat}/{})", cell.label, plan.repeats));
            cell.samples.push(cell.run.measure(&Setup {
                threads: cell.threads,
                keys: cell.keys,
                budget: Budget::Time {
                    warm_up: plan.warm_up(),
                    run: plan.run_time,
                },
                // Run `repeat` of every cell lays its tables out alike in every
                // invocation (`Setup::seed`).
                seed: repeat as u64,
            }));
            progress.inc(1);
        }
    }
    progress.finish_and_clear();
    let report = Report {
        unit: "million decisions per second",
        machine: Machine {
            cpu: cpu_model(),
            available_parallelism: available,
            arch: std::env::consts::ARCH,
            os: std::env::consts::OS,
        },
        repeats: plan.repeats,
        run_ms: plan.run_time.as_secs_f64() * 1e3,
        warm_up_ms: plan.warm_up().as_secs_f64() * 1e3,
        unstable_spread: UNSTABLE_SPREAD,
        total_s: started.elapsed().as_secs_f64(),
        rows: rows(&groups, &threads, &cells),
    };
    // The measurements first: a plot that fails to be written loses none of them.
    let printed = print(args.json, &report, |out, report| {
        if args.csv {
            write_csv(out, report)
        } else {
            write_table(out, report)
        }
    });
    let plotted = match &args.plot {
        Some(path) => draw_plot(path, &groups[0], &report),
        None => Ok(()),
    };
    match (printed, plotted) {
        // A reader that went away (status 0) still gets the plot's failure reported.
        (Err(failure), _) if failure.status != 0 => Err(failure),
        (_, Err(failure)) => Err(failure),
        (printed, Ok(())) => printed,
    }
}

/// `--plot`: the first group chosen (by default the hot key, `gcra`), at its first key
/// count: one point per thread count for each contender.
fn draw_plot(path: &std::path::Path, drawn: &Group, report: &Report) -> Result<(), Failure> {
    let keys = drawn.key_counts[0];
    let rows = report.rows.iter();
    let series = plot::series(
        rows.filter(|r| r.group == drawn.id && r.keys == keys)
            .map(|row| {
                (
                    row.threads,
                    Implementation::ALL
                        .iter()
                        .filter_map(|&i| row.get(i).map(|m| (i.heading(), m.mdps)))
                        .collect::<Vec<_>>(),
                )
            }),
    );
    let title = format!(
        "{}, {keys} key{}, {} ({} cores): million decisions/s",
        drawn.id,
        if keys == 1 { "" } else { "s" },
        report.machine.cpu,
        report.machine.available_parallelism
    );
    plot::draw(path, &title, &series)
        .map_err(|e| Failure::runtime(format!("--plot {}: {e}", path.display())))
}

/// The CPU's model name where the OS says it (Linux), else `unknown`.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, name)| name.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

fn rows(groups: &[Group], threads: &[usize], cells: &[Cell]) -> Vec<Row> {
    let mut rows = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        for &keys in &group.key_counts {
            for &n in threads {
                let mut measured = BTreeMap::new();
                for cell in cells
                    .iter()
                    .filter(|c| c.group == g && c.keys == keys && c.threads == n)
                {
                    if let Some(m) = Measured::from_samples(&cell.samples) {
                        measured.insert(cell.implementation.id(), m);
                    }
                }
                let mut row = Row {
                    group: group.id.clone(),
                    keys,
                    workload: group.workload.clone(),
                    threads: n,
                    cells: measured,
                    vs_mutex_twin: None,
                    vs_governor: None,
                    leased_vs_ceiling: None,
                    leased_coarse_vs_ceiling: None,
                    leased_vs_governor: None,
                    ran_s: 0.0,
                };
                let floodgate = row.get(Implementation::Floodgate);
                let vs_mutex_twin = ratio(floodgate, row.get(Implementation::MutexTwin));
                let vs_governor = ratio(floodgate, row.get(Implementation::Governor));
                (row.vs_mutex_twin, row.vs_governor) = (vs_mutex_twin, vs_governor);
                let ceiling = row.get(Implementation::NoWriteCeiling);
                let leased = row.get(Implementation::Leased);
                let leased_vs_ceiling = ratio(leased, ceiling);
                let coarse_vs_ceiling = ratio(row.get(Implementation::LeasedCoarse), ceiling);
                let leased_vs_governor = ratio(leased, row.get(Implementation::Governor));
                row.leased_vs_ceiling = leased_vs_ceiling;
                row.leased_coarse_vs_ceiling = coarse_vs_ceiling;
                row.leased_vs_governor = leased_vs_governor;
                row.ran_s = row.cells.values().map(|m| m.ran_s).sum();
                rows.push(row);
            }
        }
    }
    rows
}

fn progress_bar(runs: u64) -> ProgressBar {
    if !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(runs);
    if let Ok(style) =
        ProgressStyle::with_template("{bar:24} {pos}/{len} runs, eta {eta}  {wide_msg}")
    {
        bar.set_style(style);
    }
    bar
}

/// A cell as the table prints it: `median/spread`, `!` when unstable.
fn cell_text(m: &Measured) -> String {
    format!(
        "{:.2}/{:.2}{}",
        m.mdps,
        m.spread,
        if m.unstable { "!" } else { " " }
    )
}

/// The width of a table's first column: its heading or its longest name.
fn name_width<'a>(names: impl Iterator<Item = &'a str>, heading: &'a str) -> usize {
    names.chain([heading]).map(str::len).max().unwrap_or(0)
}

fn write_table(out: &mut impl Write, report: &Report) -> io::Result<()> {
    writeln!(out, "floodgate bench: {}", report.unit)?;
    writeln!(
        out,
        "machine: {}, available parallelism {}, {} {}",
        report.machine.cpu,
        report.machine.available_parallelism,
        report.machine.arch,
        report.machine.os
    )?;
    writeln!(
        out,
        "each cell: median/spread of {} run{} of {:.0} ms (after {:.0} ms warm-up); spread = \
         fastest run / slowest run; ! = spread above {:.1}: runs disagree, do not trust the \
         median; total {:.1} s\n\
         vs mutex, vs governor: floodgate / the other, run by run (a row's cells run back \
         to back in each round): median/spread of the rounds' ratios, ! above {:.1}\n\
         compare within a row: an unmarked cell can still move by 10 % or more between \
         invocations on a shared or virtual machine (BENCHMARKS.md, \"The main job at 90 s\")",
        report.repeats,
        if report.repeats == 1 { "" } else { "s" },
        report.run_ms,
        report.warm_up_ms,
        report.unstable_spread,
        report.total_s,
        report.unstable_spread
    )?;
    let mut described: Vec<&str> = Vec::new();
    for row in &report.rows {
        if !described.contains(&row.group.as_str()) {
            described.push(&row.group);
            writeln!(out, "workload {}: {}", row.group, row.workload)?;
        }
    }
    writeln!(out)?;
    let name_width = name_width(report.rows.iter().map(|r| r.group.as_str()), "group");
    let columns: Vec<Implementation> = Implementation::ALL
        .into_iter()
        .filter(|&i| report.rows.iter().any(|r| r.get(i).is_some()))
        .collect();
    let mut header = format!("{:<name_width$} {:>7} {:>7}", "group", "keys", "threads");
    for implementation in &columns {
        header += &format!(" {:>12}", implementation.heading());
    }
    header += &format!(" {:>13} {:>13} {:>7}", "vs mutex ", "vs governor ", "ran");
    writeln!(out, "{header}")?;
    for row in &report.rows {
        let mut line = format!(
            "{:<name_width$} {:>7} {:>7}",
            row.group, row.keys, row.threads
        );
        for &implementation in &columns {
            match row.get(implementation) {
                Some(m) => line += &format!(" {:>12}", cell_text(m)),
                None => line += &format!(" {:>12}", "n/a "),
            }
        }
        for r in [&row.vs_mutex_twin, &row.vs_governor] {
            line += &format!(" {:>13}", ratio_text(r.as_ref()));
        }
        line += &format!(" {:>6.1}s", row.ran_s);
        writeln!(out, "{line}")?;
    }
    let x = |r: &Option<Ratio>| ratio_text(r.as_ref()).trim_end().to_owned();
    for row in report.rows.iter().filter(|r| r.leased_vs_ceiling.is_some()) {
        writeln!(
            out,
            "hot key, {} thread{}: leased = {} the no-write ceiling ({} governor), leased-coarse = {} the ceiling",
            row.threads,
            if row.threads == 1 { "" } else { "s" },
            x(&row.leased_vs_ceiling),
            x(&row.leased_vs_governor),
            x(&row.leased_coarse_vs_ceiling)
        )?;
    }
    Ok(())
}

fn write_csv(out: &mut impl Write, report: &Report) -> io::Result<()> {
    writeln!(
        out,
        "group,keys,threads,implementation,mdps,spread,unstable,runs,admitted_fraction,ran_s"
    )?;
    for row in &report.rows {
        for implementation in Implementation::ALL {
            if let Some(m) = row.get(implementation) {
                writeln!(
                    out,
                    "{},{},{},{},{:.4},{:.4},{},{},{:.6},{:.4}",
                    row.group,
                    row.keys,
                    row.threads,
                    implementation.id(),
                    m.mdps,
                    m.spread,
                    m.unstable,
                    m.runs_mdps.len(),
                    m.admitted_fraction,
                    m.ran_s
                )?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_counts_go_one_power_of_two_past_the_cores() {
        assert_eq!(thread_counts(1, None), [1, 2]);
        assert_eq!(thread_counts(2, None), [1, 2, 4]);
        assert_eq!(thread_counts(3, None), [1, 2, 4]);
        assert_eq!(thread_counts(4, None), [1, 2, 4, 8]);
        assert_eq!(thread_counts(6, None), [1, 2, 4, 8]);
        assert_eq!(thread_counts(64, None), [1, 2, 4, 8, 16, 32, 64, 128]);
        assert_eq!(thread_counts(8, Some(4)), [1, 2, 4]);
        assert_eq!(thread_counts(8, Some(1)), [1]);
        assert_eq!(thread_counts(8, Some(0)), [1]);
        assert_eq!(thread_counts(usize::MAX, None).len(), 17);
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        let run = |ops| Measurement {
            ops,
            admitted: 0,
            elapsed: Duration::from_secs(1),
        };
        assert_eq!(median_rate(&[]), None);
        assert_eq!(
            median_rate(&[run(5_000_000), run(1_000_000), run(3_000_000)]),
            Some(3.0)
        );
        assert_eq!(median_rate(&[run(4_000_000), run(2_000_000)]), Some(3.0));
    }

    #[test]
    fn cells_report_medians_spreads_admitted_fractions_and_time_ran() {
        let run = |ops, admitted, ms| Measurement {
            ops,
            admitted,
            elapsed: Duration::from_millis(ms),
        };
        let m = Measured::from_samples(&[
            run(4_000_000, 1_000_000, 1_000),
            run(2_000_000, 2_000_000, 500),
        ])
        .unwrap();
        assert_eq!(m.mdps, 4.0);
        assert_eq!(m.runs_mdps, [4.0, 4.0]);
        assert_eq!((m.spread, m.unstable), (1.0, false));
        assert_eq!(m.admitted_fraction, 0.5);
        assert_eq!(m.ran_s, 1.5);
        assert!(Measured::from_samples(&[]).is_none());
        let empty = Measured::from_samples(&[run(0, 0, 0)]).unwrap();
        assert_eq!((empty.mdps, empty.admitted_fraction), (0.0, 0.0));
        assert!(empty.unstable, "a run with no rate cannot be trusted");
    }

    #[test]
    fn runs_that_disagree_by_more_than_the_threshold_are_marked() {
        let rate = |mdps: u64| Measurement {
            ops: mdps * 1_000_000,
            admitted: 0,
            elapsed: Duration::from_secs(1),
        };
        let steady = Measured::from_samples(&[rate(100), rate(110), rate(120)]).unwrap();
        assert_eq!(
            (steady.mdps, steady.spread, steady.unstable),
            (110.0, 1.2, false)
        );
        assert!(cell_text(&steady).ends_with(' '), "{}", cell_text(&steady));
        let shaky = Measured::from_samples(&[rate(100), rate(110), rate(121)]).unwrap();
        assert!(shaky.unstable);
        assert_eq!(cell_text(&shaky), "110.00/1.21!");
    }

    #[test]
    fn ratios_pair_the_runs_of_one_round() {
        let cell = |runs: &[f64]| Measured {
            mdps: median(runs.to_vec()).unwrap(),
            runs_mdps: runs.to_vec(),
            spread: spread_of(runs).0,
            unstable: spread_of(runs).1,
            admitted_fraction: 1.0,
            ran_s: 1.0,
        };
        // The machine ran at full speed in round 1, at half in rounds 0 and 2: both
        // contenders moved together, and their comparison did not.
        let (a, b) = (cell(&[10.0, 20.0, 10.0]), cell(&[5.0, 10.0, 5.0]));
        let r = ratio(Some(&a), Some(&b)).unwrap();
        assert_eq!((r.median, r.spread, r.unstable), (2.0, 1.0, false));
        assert_eq!(r.runs, [2.0, 2.0, 2.0]);
        assert_eq!(ratio_text(Some(&r)), "2.00x/1.00 ");
        // The medians' ratio (20 / 10) would say 2; the rounds say 1, 2, 1.
        let (a, b) = (cell(&[10.0, 20.0, 40.0]), cell(&[10.0, 10.0, 40.0]));
        let r = ratio(Some(&a), Some(&b)).unwrap();
        assert_eq!((r.median, r.spread, r.unstable), (1.0, 2.0, true));
        assert_eq!(ratio_text(Some(&r)), "1.00x/2.00!");
        // Even counts take the mean of the middle two ratios.
        let r = ratio(Some(&cell(&[3.0, 8.0])), Some(&cell(&[1.0, 2.0]))).unwrap();
        assert_eq!((r.median, r.spread), (3.5, 4.0 / 3.0));
        // No ratio without both cells, with a round the other measured nothing in, or
        // with runs that do not pair up.
        assert_eq!(ratio(Some(&a), None), None);
        assert_eq!(ratio(None, Some(&b)), None);
        assert_eq!(ratio(Some(&a), Some(&cell(&[1.0, 0.0, 1.0]))), None);
        assert_eq!(ratio(Some(&a), Some(&cell(&[1.0, 1.0]))), None);
        assert_eq!(ratio_text(None), "n/a ");
        // A round in which the one measured nothing: a ratio of 0, never trusted.
        let r = ratio(Some(&cell(&[0.0, 1.0, 1.0])), Some(&b)).unwrap();
        assert_eq!((r.spread, r.unstable), (0.0, true));
    }

    #[test]
    fn the_memory_table_has_a_row_per_table_and_a_column_per_key_count() {
        let row = |table, keys, bytes: isize| MemoryRow {
            table,
            keys,
            bytes,
            bytes_per_key: bytes as f64 / keys as f64,
        };
        let report = MemoryReport {
            unit: "heap bytes per key",
            rows: vec![
                row("floodgate_inline", 10, 190),
                row("floodgate_inline", 100, 1_850),
                row("papaya_anchor", 10, 400),
            ],
        };
        let mut out = Vec::new();
        write_memory(&mut out, &report, &[10, 100]).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().skip(3).collect();
        assert_eq!(
            lines,
            [
                "table                   10 keys       100 keys",
                "floodgate_inline           19.0           18.5",
                "papaya_anchor              40.0            n/a",
            ]
        );
    }

    #[test]
    fn plans_keep_the_repeats_and_a_minimum_run() {
        let s = Duration::from_secs;
        assert_eq!(
            plan(s(30), 12, 3),
            Plan {
                repeats: 3,
                run_time: Duration::from_nanos(833_333_333)
            }
        );
        let short = plan(Duration::from_millis(100), 12, 3);
        assert_eq!((short.repeats, short.run_time), (3, MIN_RUN));
        assert_eq!(short.warm_up(), MIN_RUN / 4);
        assert_eq!(plan(s(1), 0, 0).repeats, 1);
        // More runs than a u32 counts: the run time is the floor, not a wrapped
        // product or a division by zero.
        let huge = plan(s(90), usize::MAX, MAX_REPEATS);
        assert_eq!((huge.repeats, huge.run_time), (MAX_REPEATS, MIN_RUN));
        assert_eq!(plan(s(90), 1 << 32, 1).run_time, MIN_RUN);
    }
}
