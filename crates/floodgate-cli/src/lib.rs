//! The internals of the `floodgate` command, as a library: the parsers of its input
//! lines and arguments.
//!
//! **Not a stable API.** These modules exist so that the binary and the fuzz targets
//! (`fuzz/fuzz_targets/replay_input.rs`) share one copy of the parsers; they change
//! with the command, and semver covers the command's behaviour, not them. Use the
//! `floodgate` crate for rate limiting.
//!
//! * [`input`] — the replay input formats: trace lines and nginx `combined` lines;
//! * [`seconds`] — exact decimal seconds ↔ integer nanoseconds.
//!
//! Durations (`--per`, `--duration`) use the core crate's [`floodgate::parse_duration`],
//! the same parser as the TOML plans (the command's message for a fraction such as
//! `1.5s` says that fractions are not accepted and what to write).
//!
//! Every parser returns a value or a typed error for any input; none panics.
//!
//! # Examples
//!
//! ```
//! use floodgate_cli::{input::parse_trace_line, seconds::Seconds};
//! use std::time::Duration;
//!
//! let request = parse_trace_line("0.7 alice").unwrap().unwrap();
//! assert_eq!(Seconds(request.time).to_string(), "0.700000000");
//! assert_eq!(floodgate::parse_duration("5m"), Ok(Duration::from_secs(300)));
//! ```

pub mod input;
pub mod seconds;
