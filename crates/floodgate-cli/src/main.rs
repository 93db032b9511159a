//! `floodgate`: the command-line companion of the floodgate rate limiter.
//!
//! * `floodgate bench` — multi-thread throughput of floodgate's lock-free limiter
//!   against its mutex twin, the textbook version and governor, as a table, JSON or
//!   CSV; `--latency`, per-decision tail latency; `--memory`, the bytes per key of
//!   each keyed table.
//! * `floodgate replay` — a deterministic dry run of a policy over a trace or an nginx
//!   access log, through the library's own engine on virtual time; with
//!   `--redis URL` (the default `redis` feature), through floodgate-redis's scripts
//!   on a Redis server instead, the time passed in as whole microseconds.
//!
//! Exit status: 0 on success; 2 for bad arguments, a bad policy or a bad input line
//! (the message names the line and its text); 1 when reading or writing fails. A
//! closed standard output (`floodgate replay --jsonl … | head`) ends the run quietly
//! with status 0.
//!
//! The parsers (input lines, seconds, durations) live in the package's library,
//! `floodgate_cli`, which the fuzz targets share.

mod bench;
mod cli;
mod replay;

use std::io;
use std::process::ExitCode;

use clap::Parser;

/// mimalloc: the allocator production users of a rate limiter tend to run with;
/// replay allocates one key per new client, and bench threads allocate nothing on
/// the hot path, so this mostly keeps replay's key table fast. Wrapped in
/// floodgate-bench's counter, which `bench --memory` reads (bytes per key of each
/// keyed table); it adds a thread-local add per allocation and no shared write.
#[global_allocator]
static GLOBAL: floodgate_bench::memory::Counting<mimalloc::MiMalloc> =
    floodgate_bench::memory::Counting::new(mimalloc::MiMalloc);

/// A command that did not succeed: the exit status and what to print on stderr.
#[derive(Debug)]
pub(crate) struct Failure {
    status: u8,
    message: Option<String>,
}

impl Failure {
    /// Bad arguments, policy or input: status 2.
    pub(crate) fn usage(message: String) -> Failure {
        Failure {
            status: 2,
            message: Some(message),
        }
    }

    /// Reading failed: status 1.
    pub(crate) fn runtime(message: String) -> Failure {
        Failure {
            status: 1,
            message: Some(message),
        }
    }

    /// Writing standard output failed: status 1, or a quiet 0 when the reader went
    /// away (a closed pipe).
    pub(crate) fn output(error: io::Error) -> Failure {
        if error.kind() == io::ErrorKind::BrokenPipe {
            return Failure {
                status: 0,
                message: None,
            };
        }
        Failure {
            status: 1,
            message: Some(format!("writing the output: {error}")),
        }
    }
}

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let result = match cli.command {
        cli::Command::Bench(args) => bench::run(args),
        cli::Command::Replay(args) => replay::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            if let Some(message) = failure.message {
                eprintln!("floodgate: {message}");
            }
            ExitCode::from(failure.status)
        }
    }
}
