//! Durations written for people: `500ms`, `1s`, `1m`, `5m`, `1h`, `24h`, `1d`.
//!
//! One whole number followed by one unit, no sign, no spaces, no fractions:
//! `ns`, `us` (or `µs`), `ms`, `s`, `m`, `h`, `d`. A day is 86 400 s (no calendar). Every
//! error is a value ([`ParseDurationError`]) naming the text; nothing panics, and a
//! number too large for [`Duration`] is an error rather than a wrap.
//!
//! The core crate may grow a parser of its own; this module is the only place the CLI
//! parses durations, so swapping it is a one-line change in `cli.rs`.
//!
//! # Examples
//!
//! ```
//! use floodgate_cli::duration::parse_duration;
//! use std::time::Duration;
//!
//! assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
//! assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
//! assert!(parse_duration("1.5s").is_err());
//! ```

use core::fmt;
use core::time::Duration;

/// Why a duration did not parse: the text and the reason, with examples of valid
/// durations in the message.
///
/// # Examples
///
/// ```
/// use floodgate_cli::duration::parse_duration;
///
/// let error = parse_duration("10").unwrap_err();
/// assert!(error.to_string().starts_with("invalid duration \"10\": missing unit"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseDurationError {
    text: String,
    reason: &'static str,
}

impl fmt::Display for ParseDurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid duration {:?}: {} (examples: 500ms, 1s, 5m, 1h, 1d; units ns, us, ms, s, m, h, d)",
            self.text, self.reason
        )
    }
}

impl std::error::Error for ParseDurationError {}

/// The units, longest suffix first so that `ms` is not read as `m` + garbage.
const UNITS: [(&str, Unit); 8] = [
    ("ns", Unit::Nanos(1)),
    ("us", Unit::Nanos(1_000)),
    ("µs", Unit::Nanos(1_000)),
    ("ms", Unit::Nanos(1_000_000)),
    ("s", Unit::Secs(1)),
    ("m", Unit::Secs(60)),
    ("h", Unit::Secs(3_600)),
    ("d", Unit::Secs(86_400)),
];

#[derive(Clone, Copy)]
enum Unit {
    Nanos(u64),
    Secs(u64),
}

/// Parses `<digits><unit>`, e.g. `500ms` or `24h`.
///
/// # Errors
///
/// [`ParseDurationError`] when the number is missing, the unit is missing or unknown,
/// or the value does not fit a [`Duration`].
///
/// # Examples
///
/// ```
/// use floodgate_cli::duration::parse_duration;
/// use std::time::Duration;
///
/// assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
/// assert!(parse_duration("18446744073709551616s").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, ParseDurationError> {
    let fail = |reason| ParseDurationError {
        text: text.to_owned(),
        reason,
    };
    let digits_end = text
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(digits_end);
    if digits.is_empty() {
        return Err(fail("expected a whole number first"));
    }
    if suffix.is_empty() {
        return Err(fail("missing unit"));
    }
    let unit = UNITS
        .iter()
        .find(|(name, _)| *name == suffix)
        .map(|(_, unit)| *unit)
        .ok_or_else(|| fail("unknown unit"))?;
    let value: u64 = digits.parse().map_err(|_| fail("number too large"))?;
    match unit {
        Unit::Nanos(scale) => value
            .checked_mul(scale)
            .map(Duration::from_nanos)
            .ok_or_else(|| fail("number too large")),
        Unit::Secs(scale) => value
            .checked_mul(scale)
            .map(Duration::from_secs)
            .ok_or_else(|| fail("number too large")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit() {
        let cases = [
            ("1ns", Duration::from_nanos(1)),
            ("7us", Duration::from_micros(7)),
            ("7µs", Duration::from_micros(7)),
            ("500ms", Duration::from_millis(500)),
            ("1s", Duration::from_secs(1)),
            ("1m", Duration::from_secs(60)),
            ("5m", Duration::from_secs(300)),
            ("1h", Duration::from_secs(3_600)),
            ("24h", Duration::from_secs(86_400)),
            ("1d", Duration::from_secs(86_400)),
            ("0s", Duration::ZERO),
            ("007s", Duration::from_secs(7)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn rejects_malformed_text_with_a_reason() {
        let cases = [
            ("", "expected a whole number first"),
            ("s", "expected a whole number first"),
            ("-1s", "expected a whole number first"),
            ("+1s", "expected a whole number first"),
            (" 1s", "expected a whole number first"),
            ("10", "missing unit"),
            ("1x", "unknown unit"),
            ("1 s", "unknown unit"),
            ("1S", "unknown unit"),
            ("1.5s", "unknown unit"),
            ("1s1", "unknown unit"),
            ("1msx", "unknown unit"),
        ];
        for (text, reason) in cases {
            let err = parse_duration(text).unwrap_err();
            assert_eq!(err.reason, reason, "{text}");
            assert!(err.to_string().contains(&format!("{text:?}")), "{err}");
        }
    }

    #[test]
    fn overflow_is_an_error_not_a_wrap() {
        assert_eq!(
            parse_duration("18446744073709551615s"),
            Ok(Duration::from_secs(u64::MAX))
        );
        for text in [
            "18446744073709551616s",
            "18446744073709551615m",
            "213503982334602d",
            "18446744073709551615ms",
            "99999999999999999999999999ns",
        ] {
            assert_eq!(
                parse_duration(text).unwrap_err().reason,
                "number too large",
                "{text}"
            );
        }
        assert_eq!(
            parse_duration("18446744073709551615ns"),
            Ok(Duration::from_nanos(u64::MAX))
        );
    }

    proptest::proptest! {
        #[test]
        fn whole_numbers_with_a_unit_parse_exactly(n in 0u64..1 << 40, unit in 0usize..UNITS.len()) {
            let (name, scale) = UNITS[unit];
            let want = match scale {
                Unit::Nanos(k) => Duration::from_nanos(n * k),
                Unit::Secs(k) => Duration::from_secs(n * k),
            };
            proptest::prop_assert_eq!(parse_duration(&format!("{n}{name}")), Ok(want));
        }

        #[test]
        fn no_text_panics(text: String) {
            let _ = parse_duration(&text);
        }
    }
}
