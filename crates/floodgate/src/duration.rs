//! Human durations for configuration files: `"1d"`, `"5m"`, `"500ms"`, `"1h30m"`.
//!
//! [`parse_duration`] accepts one or more `<whole number><unit>` groups, optionally
//! separated by spaces, with units `ns`, `us` (or `µs`), `ms`, `s`, `m`, `h`, `d`,
//! `w`. Every malformed input is a [`DurationError`]; nothing panics and nothing
//! overflows silently.

use core::fmt;
use core::time::Duration;

/// Parses a duration such as `"1d"`, `"5m"`, `"500ms"` or `"1h 30m"`.
///
/// # Errors
///
/// [`DurationError`] for an empty string, a missing number or unit, an unknown unit,
/// or a total beyond `u64::MAX` nanoseconds.
///
/// # Examples
///
/// ```
/// use floodgate::{parse_duration, DurationError};
/// use std::time::Duration;
///
/// assert_eq!(parse_duration("1d")?, Duration::from_secs(86_400));
/// assert_eq!(parse_duration("500ms")?, Duration::from_millis(500));
/// assert_eq!(parse_duration("1h30m")?, Duration::from_secs(5_400));
/// assert_eq!(parse_duration("5 fortnights"), Err(DurationError::UnknownUnit { unit: "fortnights".into() }));
/// # Ok::<(), DurationError>(())
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(DurationError::Empty);
    }
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return Err(DurationError::MissingNumber {
                at: text.len() - rest.len(),
            });
        }
        let (number, after) = rest.split_at(digits);
        let value: u64 = number.parse().map_err(|_| DurationError::Overflow)?;
        let after = after.trim_start();
        let unit_len = after.len() - after.trim_start_matches(|c: char| c.is_alphabetic()).len();
        let (unit, after) = after.split_at(unit_len);
        let nanos_per_unit: u64 = match unit {
            "ns" => 1,
            "us" | "µs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3_600 * 1_000_000_000,
            "d" => 86_400 * 1_000_000_000,
            "w" => 7 * 86_400 * 1_000_000_000,
            "" => {
                return Err(DurationError::MissingUnit {
                    at: text.len() - after.len(),
                })
            }
            other => {
                return Err(DurationError::UnknownUnit {
                    unit: other.to_owned(),
                })
            }
        };
        total = value
            .checked_mul(nanos_per_unit)
            .and_then(|n| total.checked_add(n))
            .ok_or(DurationError::Overflow)?;
        rest = after.trim_start();
    }
    Ok(Duration::from_nanos(total))
}

/// Why [`parse_duration`] rejected its input.
///
/// # Examples
///
/// ```
/// use floodgate::{parse_duration, DurationError};
/// assert_eq!(parse_duration(""), Err(DurationError::Empty));
/// assert_eq!(parse_duration("10"), Err(DurationError::MissingUnit { at: 2 }));
/// assert_eq!(parse_duration("ms"), Err(DurationError::MissingNumber { at: 0 }));
/// assert_eq!(parse_duration("999999999999d"), Err(DurationError::Overflow));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DurationError {
    /// Nothing to parse: write e.g. `"1s"`.
    Empty,
    /// A unit or other text where a number was expected, at byte `at`.
    MissingNumber {
        /// Byte offset in the input.
        at: usize,
    },
    /// A number without a unit, ending at byte `at`: add one of `ns us ms s m h d w`.
    MissingUnit {
        /// Byte offset in the input.
        at: usize,
    },
    /// A unit that is not one of `ns us µs ms s m h d w`.
    UnknownUnit {
        /// The unit as written.
        unit: String,
    },
    /// The total exceeds `u64::MAX` nanoseconds (about 584 years).
    Overflow,
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DurationError::Empty => f.write_str("empty duration (write e.g. \"1s\")"),
            DurationError::MissingNumber { at } => {
                write!(f, "expected a whole number at byte {at} of the duration")
            }
            DurationError::MissingUnit { at } => write!(
                f,
                "missing unit at byte {at} of the duration (one of ns, us, ms, s, m, h, d, w)"
            ),
            DurationError::UnknownUnit { unit } => write!(
                f,
                "unknown duration unit {unit:?} (one of ns, us, ms, s, m, h, d, w)"
            ),
            DurationError::Overflow => {
                f.write_str("duration exceeds u64::MAX nanoseconds (about 584 years)")
            }
        }
    }
}

impl std::error::Error for DurationError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_groups() {
        let cases = [
            ("1ns", 1),
            ("7us", 7_000),
            ("7µs", 7_000),
            ("500ms", 500_000_000),
            ("2s", 2_000_000_000),
            ("5m", 300_000_000_000),
            ("1h", 3_600_000_000_000),
            ("1d", 86_400_000_000_000),
            ("1w", 604_800_000_000_000),
            (" 1h 30m ", 5_400_000_000_000),
            ("1m1s1ms", 61_001_000_000),
            ("0s", 0),
            ("18446744073709551615ns", u64::MAX),
        ];
        for (text, nanos) in cases {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_nanos(nanos)),
                "{text}"
            );
        }
    }

    #[test]
    fn errors_never_panics() {
        assert_eq!(parse_duration("   "), Err(DurationError::Empty));
        assert_eq!(
            parse_duration("1.5s"),
            Err(DurationError::MissingUnit { at: 1 })
        );
        assert_eq!(
            parse_duration("-1s"),
            Err(DurationError::MissingNumber { at: 0 })
        );
        assert_eq!(
            parse_duration("1s x"),
            Err(DurationError::MissingNumber { at: 3 })
        );
        assert_eq!(
            parse_duration("3 parsecs"),
            Err(DurationError::UnknownUnit {
                unit: "parsecs".into()
            })
        );
        assert_eq!(
            parse_duration("18446744073709551616ns"),
            Err(DurationError::Overflow)
        );
        assert_eq!(
            parse_duration("18446744073709551615ns1ns"),
            Err(DurationError::Overflow)
        );
        assert_eq!(
            parse_duration("99999999999999999999999d"),
            Err(DurationError::Overflow)
        );
        for text in ["\u{0}", "1\u{1F600}", "µ", "1µ", "ää", "1 1s", "s1"] {
            assert!(parse_duration(text).is_err(), "{text:?}");
        }
    }
}
