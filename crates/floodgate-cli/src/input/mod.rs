//! The input formats of `floodgate replay`: one request per line, in the trace format
//! ([`parse_trace_line`]) or nginx's `combined` access-log format
//! ([`parse_nginx_line`]).
//!
//! Each parser takes one line without its line end and returns `Ok(Some(request))`,
//! `Ok(None)` for a line to skip (blank, or a trace comment) or a [`LineError`] saying
//! what is wrong; no input panics (the `replay_input` fuzz target checks this). The
//! reader in the binary adds the line number and the text to the message.

mod nginx;
mod trace;

use core::fmt;

pub use nginx::{parse_nginx_line, utc_timestamp};
pub use trace::parse_trace_line;

/// One parsed request. `time` is nanoseconds on the input's time axis (the trace's
/// own seconds, or Unix time for nginx logs).
///
/// # Examples
///
/// ```
/// use floodgate_cli::input::{parse_trace_line, Request};
///
/// let request = parse_trace_line("1.5 alice 2").unwrap();
/// assert_eq!(request, Some(Request { time: 1_500_000_000, key: "alice", cost: 2 }));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    /// Nanoseconds on the input's time axis.
    pub time: u64,
    /// The key the request is limited by (borrowed from the line).
    pub key: &'a str,
    /// How many units it costs.
    pub cost: u32,
}

/// What is wrong with one line; the reader adds the line number and the text.
///
/// # Examples
///
/// ```
/// use floodgate_cli::input::{parse_trace_line, LineError};
///
/// let error = parse_trace_line("1 alice 2 extra").unwrap_err();
/// assert_eq!(
///     error.to_string(),
///     "invalid extra field \"extra\": expected `<time> <key> [<cost>]`"
/// );
/// assert_eq!(LineError::missing("key").to_string(), "missing key");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineError {
    message: String,
}

impl LineError {
    /// An error with this message.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_cli::input::LineError;
    ///
    /// assert_eq!(LineError::new("not valid UTF-8").to_string(), "not valid UTF-8");
    /// ```
    pub fn new(message: impl fmt::Display) -> Self {
        LineError {
            message: message.to_string(),
        }
    }

    /// `invalid <field> "<text>": <reason>`.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_cli::input::LineError;
    ///
    /// let error = LineError::field("cost", "-1", "expected a whole number");
    /// assert_eq!(error.to_string(), "invalid cost \"-1\": expected a whole number");
    /// // A long field is quoted cut, as [`quoted`](floodgate_cli::input::quoted) does.
    /// let error = LineError::field("key", &"k".repeat(1_000), "too long");
    /// assert!(error.to_string().len() < 250);
    /// ```
    pub fn field(field: &str, text: &str, reason: impl fmt::Display) -> Self {
        LineError::new(format_args!("invalid {field} {}: {reason}", quoted(text)))
    }

    /// `missing <what>`.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_cli::input::LineError;
    ///
    /// assert_eq!(LineError::missing("$status").to_string(), "missing $status");
    /// ```
    pub fn missing(what: &str) -> Self {
        LineError::new(format_args!("missing {what}"))
    }
}

/// The most characters of a text a message quotes.
const QUOTED_CHARS: usize = 200;

/// `text` quoted for an error message (`{:?}`), cut after 200 characters (at a
/// character boundary) and marked ` …` where it was: a near-megabyte line or field
/// makes a message of a few hundred bytes, not a megabyte.
///
/// # Examples
///
/// ```
/// use floodgate_cli::input::quoted;
///
/// assert_eq!(quoted("a\"b"), "\"a\\\"b\"");
/// let long = "é".repeat(300);
/// assert_eq!(quoted(&long), format!("{:?} …", "é".repeat(200)));
/// ```
pub fn quoted(text: &str) -> String {
    let shown: String = text.chars().take(QUOTED_CHARS).collect();
    let cut = if shown.len() < text.len() { " …" } else { "" };
    format!("{shown:?}{cut}")
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for LineError {}
