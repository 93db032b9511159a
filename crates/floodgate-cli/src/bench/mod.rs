//! `floodgate bench`: multi-thread throughput, side by side, in one run.
//!
//! The matrix is groups (algorithm × key pattern, see [`contenders`]) × thread counts
//! ([`thread_counts`]) × implementations. The time budget is split evenly over every
//! run; the cells are visited round-robin, `repeats` times over, so a slow drift of
//! the machine (another process, thermal throttling) spreads over every contender
//! instead of landing on one, and each cell reports the median of its runs.
//!
//! Each run goes through [`floodgate_benches::run_for`], the harness the criterion
//! suites use: every thread builds its decision loop before a shared start barrier,
//! times itself, and stops once its own clock passes the run time (it looks every
//! [`floodgate_benches::BATCH`] decisions); a run's rate is all decisions over the span
//! from the first thread's start to the last thread's finish.

mod contenders;

use std::io::{self, IsTerminal, Write};
use std::time::{Duration, Instant};

use floodgate_benches::Measurement;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::cli::BenchArgs;
use crate::Failure;
use contenders::{groups, Group, Implementation, Keys};

/// The default total measuring time.
const DEFAULT_TOTAL: Duration = Duration::from_secs(30);
/// `--quick`'s total.
const QUICK_TOTAL: Duration = Duration::from_secs(10);
/// No run is shorter than this: fewer repeats first, then a longer total.
const MIN_RUN: Duration = Duration::from_millis(20);

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

/// Splits `total` over `cells × repeats` runs, trading repeats for run length when
/// the runs would fall under [`MIN_RUN`].
pub(crate) fn plan(total: Duration, cells: usize, repeats: usize) -> Plan {
    let cells = cells.max(1) as u32;
    let fits = |repeats: usize| total / (cells * repeats as u32);
    let mut repeats = repeats.clamp(1, 1_000);
    while repeats > 1 && fits(repeats) < MIN_RUN {
        repeats -= 1;
    }
    Plan {
        repeats,
        run_time: fits(repeats).max(MIN_RUN),
    }
}

#[derive(Serialize)]
struct Report {
    unit: &'static str,
    machine: Machine,
    repeats: usize,
    run_ms: f64,
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
    algorithm: &'static str,
    keys: &'static str,
    workload: String,
    threads: usize,
    floodgate: Option<Measured>,
    mutex_twin: Option<Measured>,
    textbook: Option<Measured>,
    governor: Option<Measured>,
    /// floodgate ÷ mutex twin.
    vs_mutex_twin: Option<f64>,
    /// floodgate ÷ governor.
    vs_governor: Option<f64>,
    /// Wall time of this row's runs, all contenders and repeats.
    ran_s: f64,
}

#[derive(Serialize)]
struct Measured {
    /// Median of the runs, million decisions per second.
    mdps: f64,
    runs_mdps: Vec<f64>,
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
    let mut rates: Vec<f64> = runs.iter().map(millions_per_second).collect();
    rates.sort_by(f64::total_cmp);
    let mid = rates.len() / 2;
    match rates.len() {
        0 => None,
        n if n % 2 == 1 => Some(rates[mid]),
        _ => Some((rates[mid - 1] + rates[mid]) / 2.0),
    }
}

impl Measured {
    fn from_samples(samples: &[Measurement]) -> Option<Measured> {
        let mdps = median_rate(samples)?;
        let operations: u64 = samples.iter().map(|s| s.ops).sum();
        let admitted: u64 = samples.iter().map(|s| s.admitted).sum();
        Some(Measured {
            mdps,
            runs_mdps: samples.iter().map(millions_per_second).collect(),
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
        match implementation {
            Implementation::Floodgate => self.floodgate.as_ref(),
            Implementation::MutexTwin => self.mutex_twin.as_ref(),
            Implementation::Textbook => self.textbook.as_ref(),
            Implementation::Governor => self.governor.as_ref(),
        }
    }
}

fn ratio(a: Option<&Measured>, b: Option<&Measured>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b.mdps > 0.0 => Some(a.mdps / b.mdps),
        _ => None,
    }
}

/// One cell of the matrix: a contender at a thread count.
struct Cell {
    group: usize,
    threads: usize,
    implementation: Implementation,
    run: contenders::Runner,
    label: String,
    samples: Vec<Measurement>,
}

/// `floodgate bench`.
pub(crate) fn run(args: BenchArgs) -> Result<(), Failure> {
    let total = args.duration.unwrap_or(if args.quick {
        QUICK_TOTAL
    } else {
        DEFAULT_TOTAL
    });
    let available = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = thread_counts(available, args.max_threads.map(|n| n.get()));
    let groups = groups();
    let mut cells: Vec<Cell> = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        for &n in &threads {
            for contender in &group.contenders {
                cells.push(Cell {
                    group: g,
                    threads: n,
                    implementation: contender.implementation,
                    run: contender.run,
                    label: format!(
                        "{}, {} key{}, {n} thread{}, {}",
                        group.algorithm,
                        group.keys.id(),
                        if group.keys == Keys::Hot { "" } else { "s" },
                        if n == 1 { "" } else { "s" },
                        contender.implementation.heading()
                    ),
                    samples: Vec::new(),
                });
            }
        }
    }
    let plan = plan(total, cells.len(), args.repeats.get());
    // Calibrate and anchor the TSC clock now, not inside the first measured run.
    let _ = floodgate::Clock::now(&floodgate::DefaultClock::new());
    let progress = progress_bar((cells.len() * plan.repeats) as u64);
    let started = Instant::now();
    for repeat in 1..=plan.repeats {
        for cell in &mut cells {
            progress.set_message(format!("{} (run {repeat}/{})", cell.label, plan.repeats));
            cell.samples.push((cell.run)(cell.threads, plan.run_time));
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
        total_s: started.elapsed().as_secs_f64(),
        rows: rows(&groups, &threads, &cells),
    };
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let written = if args.json {
        serde_json::to_writer_pretty(&mut out, &report)
            .map_err(io::Error::from)
            .and_then(|()| writeln!(out))
    } else if args.csv {
        write_csv(&mut out, &report)
    } else {
        write_table(&mut out, &report)
    };
    written.and_then(|()| out.flush()).map_err(Failure::output)
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
        for &n in threads {
            let measured = |implementation: Implementation| {
                let cell = cells.iter().find(|c| {
                    c.group == g && c.threads == n && c.implementation == implementation
                })?;
                Measured::from_samples(&cell.samples)
            };
            let mut row = Row {
                algorithm: group.algorithm,
                keys: group.keys.id(),
                workload: group.workload.clone(),
                threads: n,
                floodgate: measured(Implementation::Floodgate),
                mutex_twin: measured(Implementation::MutexTwin),
                textbook: measured(Implementation::Textbook),
                governor: measured(Implementation::Governor),
                vs_mutex_twin: None,
                vs_governor: None,
                ran_s: 0.0,
            };
            row.vs_mutex_twin = ratio(row.floodgate.as_ref(), row.mutex_twin.as_ref());
            row.vs_governor = ratio(row.floodgate.as_ref(), row.governor.as_ref());
            row.ran_s = Implementation::ALL
                .iter()
                .filter_map(|&i| row.get(i))
                .map(|m| m.ran_s)
                .sum();
            rows.push(row);
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
        "each cell: median of {} run{} of {:.0} ms; column `ran` = time that row measured; total {:.1} s",
        report.repeats,
        if report.repeats == 1 { "" } else { "s" },
        report.run_ms,
        report.total_s
    )?;
    let mut described: Vec<(&str, &str)> = Vec::new();
    for row in &report.rows {
        if !described.contains(&(row.algorithm, row.keys)) {
            described.push((row.algorithm, row.keys));
            writeln!(
                out,
                "workload {} ({} key{}): {}",
                row.algorithm,
                row.keys,
                if row.keys == Keys::Hot.id() { "" } else { "s" },
                row.workload
            )?;
        }
    }
    writeln!(out)?;
    let name_width = report
        .rows
        .iter()
        .map(|r| r.algorithm.len())
        .chain(["algorithm".len()])
        .max()
        .unwrap_or(0);
    let mut header = format!(
        "{:<name_width$} {:<5} {:>7}",
        "algorithm", "keys", "threads"
    );
    for implementation in Implementation::ALL {
        header += &format!(" {:>10}", implementation.heading());
    }
    header += &format!(" {:>9} {:>12} {:>7}", "vs mutex", "vs governor", "ran");
    writeln!(out, "{header}")?;
    for row in &report.rows {
        let mut line = format!(
            "{:<name_width$} {:<5} {:>7}",
            row.algorithm, row.keys, row.threads
        );
        for implementation in Implementation::ALL {
            match row.get(implementation) {
                Some(m) => line += &format!(" {:>10.2}", m.mdps),
                None => line += &format!(" {:>10}", "n/a"),
            }
        }
        for (r, width) in [(row.vs_mutex_twin, 9), (row.vs_governor, 12)] {
            match r {
                Some(r) => line += &format!(" {:>width$}", format!("{r:.2}x")),
                None => line += &format!(" {:>width$}", "n/a"),
            }
        }
        line += &format!(" {:>6.1}s", row.ran_s);
        writeln!(out, "{line}")?;
    }
    Ok(())
}

fn write_csv(out: &mut impl Write, report: &Report) -> io::Result<()> {
    writeln!(
        out,
        "algorithm,keys,threads,implementation,mdps,runs,admitted_fraction,ran_s"
    )?;
    for row in &report.rows {
        for implementation in Implementation::ALL {
            if let Some(m) = row.get(implementation) {
                writeln!(
                    out,
                    "{},{},{},{},{:.4},{},{:.6},{:.4}",
                    row.algorithm,
                    row.keys,
                    row.threads,
                    implementation.id(),
                    m.mdps,
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
    fn cells_report_medians_admitted_fractions_and_time_ran() {
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
        assert_eq!(m.admitted_fraction, 0.5);
        assert_eq!(m.ran_s, 1.5);
        assert!(Measured::from_samples(&[]).is_none());
        let empty = Measured::from_samples(&[run(0, 0, 0)]).unwrap();
        assert_eq!((empty.mdps, empty.admitted_fraction), (0.0, 0.0));
    }

    #[test]
    fn plans_trade_repeats_for_run_length() {
        let s = Duration::from_secs;
        assert_eq!(
            plan(s(30), 12, 3),
            Plan {
                repeats: 3,
                run_time: Duration::from_nanos(833_333_333)
            }
        );
        assert_eq!(
            plan(Duration::from_millis(500), 12, 3),
            Plan {
                repeats: 2,
                run_time: Duration::from_nanos(20_833_333)
            }
        );
        assert_eq!(
            plan(Duration::from_millis(100), 12, 3),
            Plan {
                repeats: 1,
                run_time: MIN_RUN
            }
        );
        assert_eq!(plan(s(1), 0, 0).repeats, 1);
    }
}
