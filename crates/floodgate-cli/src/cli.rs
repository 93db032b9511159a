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
    /// The period, e.g. `500ms`, `1s`, `1m`, `5m`, `1h`, `24h`, `1d`: whole numbers
    /// (`1500ms`, not `1.5s`).
    #[arg(long, value_parser = parse_whole_duration, value_name = "DURATION")]
    pub(crate) per: Duration,
    /// Capacity (gcra, token-bucket, leaky-bucket only; default: --limit).
    #[arg(long, value_name = "B")]
    pub(crate) burst: Option<u64>,
    /// The input format.
    #[arg(long, value_enum, default_value_t = InputFormat::Trace)]
    pub(crate) format: InputFormat,
    /// With `--format nginx`: IPv6 clients share a key per /N (0 to 128; default 64,
    /// floodgate-http's default grouping, as one host usually holds a whole /64).
    #[arg(long, value_parser = parse_ipv6_prefix, value_name = "N")]
    pub(crate) ipv6_prefix: Option<u8>,
    /// With `--format nginx`: IPv4 clients share a key per /N (0 to 32; default 32,
    /// each address its own, floodgate-http's default grouping).
    #[arg(long, value_parser = parse_ipv4_prefix, value_name = "N")]
    pub(crate) ipv4_prefix: Option<u8>,
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
    /// state; give one to continue a run's keys (the run names its prefix on stderr).
    /// The replay's keys keep no TTL: delete them when done. Refused: an empty
    /// prefix, and floodgate-redis's default `floodgate:` or a prefix inside it
    /// (where live limiters keep their state) other than `floodgate:replay:…`.
    #[cfg(feature = "redis")]
    #[arg(long, value_name = "P", requires = "redis", value_parser = parse_redis_prefix)]
    pub(crate) prefix: Option<String>,
    /// The input file; `-` or nothing reads standard input.
    #[arg(value_name = "FILE")]
    pub(crate) input: Option<PathBuf>,
}

/// `--duration`: a duration above zero (a budget of 0 would measure every run at the
/// floor, as if a budget had been given).
fn parse_budget(text: &str) -> Result<Duration, String> {
    match parse_whole_duration(text)? {
        Duration::ZERO => {
            Err("a measuring time of 0 measures nothing; give more than 0".to_owned())
        }
        budget => Ok(budget),
    }
}

/// A duration as [`parse_duration`] reads it; a fraction (`1.5s`), which it refuses
/// as a number without a unit, is refused saying so, with the whole number of a
/// smaller unit to write instead where there is one (`1500ms`).
pub(crate) fn parse_whole_duration(text: &str) -> Result<Duration, String> {
    parse_duration(text).map_err(|error| match fraction(text) {
        None => error.to_string(),
        Some((written, Some(whole))) => {
            format!("fractional values are not accepted: write {whole} for {written}")
        }
        Some((written, None)) => format!(
            "fractional values are not accepted ({written}): write a whole number of a \
             smaller unit, e.g. 1500ms for 1.5s"
        ),
    })
}

/// The first `<digits>.<digits><unit>` (or with `,`) in `text`: as written, and as
/// the whole number of the largest unit that holds it exactly, if one does.
fn fraction(text: &str) -> Option<(&str, Option<String>)> {
    const UNITS: [(&str, u128); 8] = [
        ("w", 7 * 86_400 * 1_000_000_000),
        ("d", 86_400 * 1_000_000_000),
        ("h", 3_600 * 1_000_000_000),
        ("m", 60 * 1_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
        ("ns", 1),
    ];
    let bytes = text.as_bytes();
    let point = (1..bytes.len().saturating_sub(1)).find(|&i| {
        matches!(bytes[i], b'.' | b',')
            && bytes[i - 1].is_ascii_digit()
            && bytes[i + 1].is_ascii_digit()
    })?;
    let start = text[..point]
        .trim_end_matches(|c: char| c.is_ascii_digit())
        .len();
    let after = &text[point + 1..];
    let frac_len = after
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(after.len());
    // The parser takes spaces between a number and its unit.
    let spaced = &text[point + 1 + frac_len..];
    let unit_start = point + 1 + frac_len + (spaced.len() - spaced.trim_start().len());
    let unit_len = text[unit_start..]
        .find(|c: char| !c.is_alphabetic())
        .unwrap_or(text.len() - unit_start);
    let written = &text[start..unit_start + unit_len];
    let unit = text[unit_start..unit_start + unit_len].replace('µ', "u");
    let whole = (|| {
        let per_unit = UNITS.iter().find(|(name, _)| *name == unit)?.1;
        let int: u128 = text[start..point].parse().ok()?;
        let frac: u128 = after[..frac_len].parse().ok()?;
        let scale = 10u128.checked_pow(u32::try_from(frac_len).ok()?)?;
        let frac_nanos = frac.checked_mul(per_unit)?;
        if frac_nanos % scale != 0 {
            return None;
        }
        let nanos = int.checked_mul(per_unit)?.checked_add(frac_nanos / scale)?;
        if nanos == 0 {
            return Some("0s".to_owned());
        }
        let (name, size) = UNITS.iter().find(|(_, size)| nanos % size == 0)?;
        Some(format!("{}{name}", nanos / size))
    })();
    Some((written, whole))
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

/// `--prefix`: not one that shares its keys with live data: not empty, and not
/// floodgate-redis's default `floodgate:` nor inside it (a live limiter there keeps
/// `floodgate:` + its key, so `floodgate:user:` + `42` is the live key `user:42`'s),
/// except under `floodgate:replay:`, where the replay's fresh prefixes live.
#[cfg(feature = "redis")]
fn parse_redis_prefix(text: &str) -> Result<String, String> {
    const LIVE: &str = "floodgate:";
    let why = match text {
        "" => "an empty prefix writes the replay's keys among the database's other keys".to_owned(),
        LIVE => {
            "`floodgate:` is floodgate-redis's default prefix, where live limiters keep their state"
                .to_owned()
        }
        _ if text.starts_with(LIVE) && !text.starts_with("floodgate:replay:") => format!(
            "{text:?} is inside floodgate-redis's default prefix `floodgate:`, where live \
             limiters keep their state as `floodgate:` + their key: this prefix and a replayed \
             key can spell one of those keys"
        ),
        _ => return Ok(text.to_owned()),
    };
    Err(format!(
        "{why}, and they keep no TTL: give a prefix of the replay's own (e.g. \
         `floodgate:replay:mine:`), or leave --prefix out for a fresh one"
    ))
}

/// `--ipv6-prefix`: a prefix length (floodgate-http's `IpGrouping` checks its range
/// when the replay starts).
fn parse_ipv6_prefix(text: &str) -> Result<u8, String> {
    prefix_length(text, "0 to 128, e.g. 64")
}

/// `--ipv4-prefix`: a prefix length (checked as `--ipv6-prefix` is).
fn parse_ipv4_prefix(text: &str) -> Result<u8, String> {
    prefix_length(text, "0 to 32, e.g. 24")
}

/// A prefix length in decimal, `/` optional (`64`, `/64`).
fn prefix_length(text: &str, range: &str) -> Result<u8, String> {
    let digits = text.strip_prefix('/').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "expected a prefix length, a whole number from {range}"
        ));
    }
    digits
        .parse::<u8>()
        .map_err(|_| format!("the prefix length {digits} is out of range: from {range}"))
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
    /// nginx `combined` access log; key = client address as the HTTP layer groups
    /// it (IPv6 per /64 by default), time = [$time_local].
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

    /// `--prefix floodgate:user:` over a trace keyed `42` wrote `floodgate:user:42`,
    /// the very key a live floodgate-redis limiter on its default prefix keeps for
    /// the key `user:42`: only the exact `floodgate:` was refused, not a prefix
    /// inside that namespace. Refused now, except under `floodgate:replay:`, where
    /// the replay's own fresh prefixes live.
    #[cfg(feature = "redis")]
    #[test]
    fn a_prefix_inside_the_live_namespace_is_refused() {
        for inside in ["floodgate:user:", "floodgate:1", "floodgate:api:per-key:"] {
            let err = parse_redis_prefix(inside).unwrap_err();
            assert!(
                err.contains("inside floodgate-redis's default prefix `floodgate:`"),
                "{inside}: {err}"
            );
            assert!(err.contains("floodgate:replay:"), "{inside}: {err}");
        }
        for own in ["floodgate:replay:mine:", "replay:", "floodgate", "x"] {
            assert_eq!(parse_redis_prefix(own).as_deref(), Ok(own));
        }
    }

    #[test]
    fn fractions_say_what_to_write() {
        let message = |text: &str| parse_whole_duration(text).unwrap_err();
        assert_eq!(
            message("1.5s"),
            "fractional values are not accepted: write 1500ms for 1.5s"
        );
        assert_eq!(
            message("0.25m"),
            "fractional values are not accepted: write 15s for 0.25m"
        );
        assert_eq!(
            message("1h 2,5m"),
            "fractional values are not accepted: write 150s for 2,5m"
        );
        assert_eq!(
            message("1.5µs"),
            "fractional values are not accepted: write 1500ns for 1.5µs"
        );
        // No whole number of nanoseconds, no unit, an unknown unit: the general advice.
        for (text, written) in [
            ("1.0000000001s", "1.0000000001s"),
            ("1.5", "1.5"),
            ("2.5x", "2.5x"),
        ] {
            assert_eq!(
                message(text),
                format!(
                    "fractional values are not accepted ({written}): write a whole number \
                     of a smaller unit, e.g. 1500ms for 1.5s"
                ),
                "{text}"
            );
        }
        assert_eq!(
            message("1.5 h"),
            "fractional values are not accepted: write 90m for 1.5 h"
        );
        assert_eq!(
            message("0.0s"),
            "fractional values are not accepted: write 0s for 0.0s"
        );
        // Other errors and durations are the parser's own.
        assert_eq!(
            parse_whole_duration("1500ms"),
            Ok(Duration::from_millis(1500))
        );
        assert_eq!(
            message("10"),
            floodgate::DurationError::MissingUnit { at: 2 }.to_string()
        );
        assert_eq!(
            message(".5s"),
            parse_duration(".5s").unwrap_err().to_string()
        );
        for text in [
            "\u{0}",
            "1.\u{1F600}",
            "µ1.5s",
            "\u{1F600}1.5s",
            "9.99999999999999999999999999999999999999999d",
            "1.5s.5",
        ] {
            assert!(parse_whole_duration(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn names_match_clap_values() {
        for name in AlgorithmName::value_variants() {
            let value = name.to_possible_value().unwrap();
            assert_eq!(value.get_name(), name.name());
        }
    }
}
