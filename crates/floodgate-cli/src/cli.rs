//! Command-line arguments (clap derive).

use std::num::{NonZeroU64, NonZeroUsize};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use floodgate::parse_duration;

use crate::bench::MAX_REPEATS;

/// floodgate: lock-free rate limiting — benchmarks and policy replay.
#[derive(Debug, Parser)]
#[command(
    name = "floodgate",
    version,
    about,
    long_about = None,
    after_help = "Exit status: 0 on success (also when the reader of stdout goes away); \
                  2 for bad arguments, a bad policy or a bad input line; 1 when reading \
                  or writing fails."
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Multi-thread throughput: floodgate vs its mutex twin vs the textbook version vs
    /// governor, in million decisions per second.
    Bench(BenchArgs),
    /// What would this policy have done to recorded traffic? A deterministic dry run
    /// on virtual time.
    Replay(ReplayArgs),
}

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// A 10-second measuring budget instead of 90 (a quick look: its 20 ms runs move
    /// more between invocations). No run is shorter than 20 ms, so a large matrix
    /// takes longer: the main job about 25 s on 2 cores, warm-ups included.
    #[arg(long)]
    pub(crate) quick: bool,
    /// Total measuring time, e.g. `30s`, `2m` (overrides --quick); more than 0.
    #[arg(long, value_parser = parse_budget, value_name = "DURATION")]
    pub(crate) duration: Option<Duration>,
    /// Runs of each cell, at most 1000 (fewer than 3 run 3 times); the table shows
    /// their median and spread.
    #[arg(long, default_value_t = NonZeroUsize::MIN.saturating_add(2), value_name = "N",
          value_parser = parse_repeats)]
    pub(crate) repeats: NonZeroUsize,
    /// Measure no thread count above this (the default goes one power of two past
    /// the available parallelism).
    #[arg(long, value_name = "N")]
    pub(crate) max_threads: Option<NonZeroUsize>,
    /// Write the results as JSON on stdout instead of a table.
    #[arg(long, conflicts_with = "csv")]
    pub(crate) json: bool,
    /// Write the results as CSV on stdout (one line per cell) instead of a table.
    #[arg(long)]
    pub(crate) csv: bool,
    /// Print per-decision latency under 2-thread contention on one hot key (p50, p99,
    /// p99.9, max; CAS retries when built with the `cas-stats` feature) instead of the
    /// throughput table: --repeats rounds, each row once a round in a rotating order,
    /// medians and ranges over the rounds.
    #[arg(long, conflicts_with_all = ["csv", "plot", "groups", "keys", "duration"])]
    pub(crate) latency: bool,
    /// Also draw throughput against threads (the first group measured at its first
    /// key count: by default the hot-key group, `gcra`; one line per contender) as an
    /// SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) plot: Option<std::path::PathBuf>,
    /// Print the heap bytes per key of each keyed table (floodgate on each storage,
    /// the mutex twin, textbook, governor, the dashmap and papaya anchors) holding
    /// --keys u64 keys (default: 1000000) instead of the throughput table.
    #[arg(long, conflicts_with_all = [
        "csv", "plot", "latency", "groups", "duration", "quick", "repeats", "max_threads",
    ])]
    pub(crate) memory: bool,
    /// Key counts of the keyed groups, e.g. `10000,1000000` (default: 1000,100000;
    /// with --memory, 1000000). Each table holds its key count (capacity = keys); a
    /// count over the keyed table's default memory budget is refused, and so is a count
    /// given twice. The one-key group, `gcra-keyed-hot`, stays at one key; --keys with
    /// no group chosen that takes a key count is refused.
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    pub(crate) keys: Vec<NonZeroU64>,
    /// Measure only these groups (ids as the table prints them), e.g.
    /// `gcra-keyed-idle,gcra-keyed-idle-zipf`; `gcra-keyed-idle-disjoint` (each thread
    /// on its own share of the keys) runs only when named.
    #[arg(long, value_delimiter = ',', value_name = "ID,ID,...")]
    pub(crate) groups: Vec<String>,
}

#[derive(Debug, Args)]
pub(crate) struct ReplayArgs {
    /// The algorithm. gcra, token-bucket and leaky-bucket (as a meter) are the same
    /// machine.
    #[arg(long, value_enum)]
    pub(crate) algorithm: AlgorithmName,
    /// Units admitted per period.
    #[arg(long, value_name = "N")]
    pub(crate) limit: u64,
    /// The period, e.g. `500ms`, `1s`, `1m`, `5m`, `1h`, `24h`, `1d`.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) per: Duration,
    /// Capacity (gcra, token-bucket, leaky-bucket only; default: --limit).
    #[arg(long, value_name = "B")]
    pub(crate) burst: Option<u64>,
    /// The input format.
    #[arg(long, value_enum, default_value_t = InputFormat::Trace)]
    pub(crate) format: InputFormat,
    /// One JSON object per request instead of a summary.
    #[arg(long)]
    pub(crate) jsonl: bool,
    /// Decide through Redis at this URL (e.g. `redis://127.0.0.1:6379/`) instead of
    /// in process: the same transitions as Lua scripts, the trace's time passed in as
    /// whole microseconds (a time finer than 1 µs is refused). Prints the same output.
    #[cfg(feature = "redis")]
    #[arg(long, value_name = "URL")]
    pub(crate) redis: Option<String>,
    /// The Redis key prefix (with --redis). Default: a fresh prefix per run,
    /// `floodgate:replay:<pid>-<nanoseconds since the epoch>:`, so runs never share
    /// state; give one to continue a run's keys.
    #[cfg(feature = "redis")]
    #[arg(long, value_name = "P", requires = "redis")]
    pub(crate) prefix: Option<String>,
    /// The input file; `-` or nothing reads standard input.
    #[arg(value_name = "FILE")]
    pub(crate) input: Option<PathBuf>,
}

/// `--duration`: a duration above zero (a budget of 0 would measure every run at the
/// floor, as if a budget had been given).
fn parse_budget(text: &str) -> Result<Duration, String> {
    match parse_duration(text).map_err(|e| e.to_string())? {
        Duration::ZERO => {
            Err("a measuring time of 0 measures nothing; give more than 0".to_owned())
        }
        budget => Ok(budget),
    }
}

/// `--repeats`: 1 to [`MAX_REPEATS`] (fewer than [`MIN_REPEATS`] run as many).
///
/// [`MIN_REPEATS`]: crate::bench::MIN_REPEATS
fn parse_repeats(text: &str) -> Result<NonZeroUsize, String> {
    let repeats: NonZeroUsize = text.parse().map_err(|e| format!("{e}"))?;
    if repeats.get() > MAX_REPEATS {
        return Err(format!("at most {MAX_REPEATS}"));
    }
    Ok(repeats)
}

/// Every algorithm name `replay` accepts (and later `bench` may filter on).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum AlgorithmName {
    Gcra,
    TokenBucket,
    LeakyBucket,
    FixedWindow,
    SlidingWindow,
    SlidingLog,
}

impl AlgorithmName {
    /// The name as written on the command line.
    pub(crate) fn name(self) -> &'static str {
        match self {
            AlgorithmName::Gcra => "gcra",
            AlgorithmName::TokenBucket => "token-bucket",
            AlgorithmName::LeakyBucket => "leaky-bucket",
            AlgorithmName::FixedWindow => "fixed-window",
            AlgorithmName::SlidingWindow => "sliding-window",
            AlgorithmName::SlidingLog => "sliding-log",
        }
    }

    /// Whether `--burst` means something: the GCRA family only.
    pub(crate) fn takes_burst(self) -> bool {
        matches!(
            self,
            AlgorithmName::Gcra | AlgorithmName::TokenBucket | AlgorithmName::LeakyBucket
        )
    }
}

/// `--format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum InputFormat {
    /// `<time> <key> [<cost>]`, time in decimal seconds from 0.
    Trace,
    /// nginx `combined` access log; key = client address, time = [$time_local].
    Nginx,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn arguments_are_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn names_match_clap_values() {
        for name in AlgorithmName::value_variants() {
            let value = name.to_possible_value().unwrap();
            assert_eq!(value.get_name(), name.name());
        }
    }
}
