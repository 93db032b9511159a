//! The trace format: one request a line, `<time> <key> [<cost>]`.
//!
//! * Fields are separated by runs of spaces or tabs; leading and trailing spaces and
//!   tabs are ignored, and a trailing `\r` (a `\r\n` line end) is dropped by the reader.
//! * Time: seconds as `digits[.digits]`, at most 9 fractional digits, parsed exactly
//!   into nanoseconds (see [`crate::seconds`]).
//! * Key: any run of non-whitespace UTF-8 (a key holding some other whitespace
//!   character, such as a vertical tab or a no-break space, is an error: it would not
//!   survive a round trip through the format).
//! * Cost: a whole number from 0 to 4294967295; 1 when absent.
//! * A line that is blank, or whose first non-blank character is `#`, is skipped.
//!   Anything else — a fourth field, a bad number — is an error.

use super::{LineError, Request};
use crate::seconds::parse_seconds;

/// Parses one trace line (without its line end); `Ok(None)` for a skipped line.
///
/// # Errors
///
/// A [`LineError`] naming the bad field: a malformed time or cost, a missing key, a
/// key holding whitespace other than spaces and tabs, or a fourth field.
///
/// # Examples
///
/// ```
/// use floodgate_cli::input::parse_trace_line;
///
/// let request = parse_trace_line("12.000000001\tbob\t3").unwrap().unwrap();
/// assert_eq!((request.time, request.key, request.cost), (12_000_000_001, "bob", 3));
/// assert_eq!(parse_trace_line("# a comment"), Ok(None));
/// assert!(parse_trace_line("1e3 bob").is_err());
/// ```
pub fn parse_trace_line(line: &str) -> Result<Option<Request<'_>>, LineError> {
    let mut fields = line.split([' ', '\t']).filter(|f| !f.is_empty());
    let Some(time) = fields.next() else {
        return Ok(None);
    };
    if time.starts_with('#') {
        return Ok(None);
    }
    let time = parse_seconds(time).map_err(|e| LineError::field("time", time, e))?;
    let key = fields
        .next()
        .ok_or_else(|| LineError::new("missing key (expected `<time> <key> [<cost>]`)"))?;
    if key.chars().any(char::is_whitespace) {
        return Err(LineError::field(
            "key",
            key,
            "a key may not contain whitespace",
        ));
    }
    let cost = match fields.next() {
        None => 1,
        Some(cost) => parse_cost(cost)?,
    };
    if let Some(extra) = fields.next() {
        return Err(LineError::field(
            "extra field",
            extra,
            "expected `<time> <key> [<cost>]`",
        ));
    }
    Ok(Some(Request { time, key, cost }))
}

fn parse_cost(text: &str) -> Result<u32, LineError> {
    let bad = |reason| LineError::field("cost", text, reason);
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("expected a whole number from 0 to 4294967295"));
    }
    let digits = text.trim_start_matches('0');
    if digits.is_empty() {
        return Ok(0);
    }
    digits
        .parse()
        .map_err(|_| bad("larger than 4294967295 (u32::MAX)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(line: &str) -> Option<(u64, &str, u32)> {
        parse_trace_line(line)
            .unwrap()
            .map(|r| (r.time, r.key, r.cost))
    }

    #[test]
    fn parses_requests() {
        assert_eq!(ok("0 alice"), Some((0, "alice", 1)));
        assert_eq!(ok("1.5 bob 3"), Some((1_500_000_000, "bob", 3)));
        assert_eq!(ok("\t2\t\tcarol\t0  "), Some((2_000_000_000, "carol", 0)));
        assert_eq!(ok("  7 k 4294967295"), Some((7_000_000_000, "k", u32::MAX)));
        assert_eq!(ok("7 k 0004"), Some((7_000_000_000, "k", 4)));
        assert_eq!(ok("7 ключ#1"), Some((7_000_000_000, "ключ#1", 1)));
    }

    #[test]
    fn skips_blank_lines_and_comments() {
        for line in ["", "   ", "\t", "# a comment", "  #indented comment", "#"] {
            assert_eq!(ok(line), None, "{line:?}");
        }
    }

    #[test]
    fn rejects_bad_lines_naming_the_field() {
        let cases = [
            ("1", "missing key"),
            ("x alice", "time \"x\""),
            ("-1 alice", "time \"-1\""),
            ("1e3 alice", "time \"1e3\""),
            ("0.0000000001 alice", "time \"0.0000000001\""),
            ("1 alice -1", "cost \"-1\""),
            ("1 alice +1", "cost \"+1\""),
            ("1 alice 1.0", "cost \"1.0\""),
            ("1 alice 4294967296", "cost \"4294967296\""),
            ("1 alice 2 extra", "extra field \"extra\""),
            ("1 al\u{b}ice", "key"),
            ("1 al\u{a0}ice", "key"),
            ("1 alice\r", "key"),
        ];
        for (line, want) in cases {
            let err = parse_trace_line(line).unwrap_err().to_string();
            assert!(err.contains(want), "{line:?}: {err}");
        }
    }

    proptest::proptest! {
        #[test]
        fn written_requests_parse_back(
            ns: u64,
            key in "[!-~&&[^#]][!-~]{0,20}|[а-я]{1,5}",
            cost: Option<u32>,
            sep in "[ \t]{1,3}",
        ) {
            let time = crate::seconds::Seconds(ns);
            let line = match cost {
                Some(c) => format!("{time}{sep}{key}{sep}{c}"),
                None => format!("{time}{sep}{key}"),
            };
            let parsed = parse_trace_line(&line).unwrap().unwrap();
            proptest::prop_assert_eq!(
                (parsed.time, parsed.key, parsed.cost),
                (ns, key.as_str(), cost.unwrap_or(1))
            );
        }

        #[test]
        fn no_line_panics(line: String) {
            let _ = parse_trace_line(&line);
        }
    }
}
