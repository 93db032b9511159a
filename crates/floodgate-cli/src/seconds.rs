//! Seconds as exact decimals, both ways: `digits[.digits]` (at most 9 fractional
//! digits) into integer nanoseconds, and nanoseconds back out with exactly 9
//! fractional digits. No floating point anywhere, so `0.7` is 700 000 000 ns and
//! prints back as `0.700000000`.
//!
//! # Examples
//!
//! ```
//! use floodgate_cli::seconds::{parse_seconds, Seconds};
//!
//! let ns = parse_seconds("0.7").unwrap();
//! assert_eq!(ns, 700_000_000);
//! assert_eq!(Seconds(ns).to_string(), "0.700000000");
//! assert_eq!(parse_seconds(&Seconds(ns).to_string()), Ok(ns));
//! ```

use core::fmt;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Why a time field did not parse; the message is completed by the caller with the
/// line number and the text.
///
/// # Examples
///
/// ```
/// use floodgate_cli::seconds::{parse_seconds, SecondsError};
///
/// assert_eq!(parse_seconds("1e3"), Err(SecondsError::Syntax));
/// assert_eq!(parse_seconds("0.0000000001"), Err(SecondsError::TooPrecise));
/// assert_eq!(parse_seconds("18446744074"), Err(SecondsError::TooLarge));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecondsError {
    /// Not `digits[.digits]`.
    Syntax,
    /// More than 9 fractional digits (below a nanosecond).
    TooPrecise,
    /// More than `u64::MAX` nanoseconds (about 584 years).
    TooLarge,
}

impl fmt::Display for SecondsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SecondsError::Syntax => "expected seconds as digits[.digits] (no sign, no exponent)",
            SecondsError::TooPrecise => "more than 9 fractional digits (finer than 1 ns)",
            SecondsError::TooLarge => "beyond 18446744073.709551615 s (u64 nanoseconds)",
        })
    }
}

impl std::error::Error for SecondsError {}

/// Parses `digits[.digits]` exactly into nanoseconds.
///
/// # Errors
///
/// [`SecondsError`]: not that shape (signs, exponents, `.5`, `5.` and non-ASCII digits
/// included), more than 9 fractional digits, or more than `u64::MAX` nanoseconds.
///
/// # Examples
///
/// ```
/// use floodgate_cli::seconds::parse_seconds;
///
/// assert_eq!(parse_seconds("12.000000001"), Ok(12_000_000_001));
/// assert_eq!(parse_seconds("18446744073.709551615"), Ok(u64::MAX));
/// assert!(parse_seconds("-1").is_err());
/// ```
pub fn parse_seconds(text: &str) -> Result<u64, SecondsError> {
    let (whole, fraction) = match text.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (text, None),
    };
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(whole) || fraction.is_some_and(|f| !all_digits(f)) {
        return Err(SecondsError::Syntax);
    }
    let fraction = fraction.unwrap_or("");
    if fraction.len() > 9 {
        return Err(SecondsError::TooPrecise);
    }
    // Leading zeros are harmless; skip them so that a long run of them still parses.
    let whole = whole.trim_start_matches('0');
    let secs: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| SecondsError::TooLarge)?
    };
    let mut frac_nanos: u64 = 0;
    for (i, b) in fraction.bytes().enumerate() {
        // At most 9 digits: 10^8 · 9 + … < 10^9, no overflow.
        frac_nanos += u64::from(b - b'0') * 10u64.pow(8 - i as u32);
    }
    secs.checked_mul(NANOS_PER_SEC)
        .and_then(|ns| ns.checked_add(frac_nanos))
        .ok_or(SecondsError::TooLarge)
}

/// Nanoseconds shown as seconds with exactly 9 fractional digits, e.g. `1.500000000`
/// (no exponent, ever); [`parse_seconds`] reads it back exactly.
///
/// # Examples
///
/// ```
/// use floodgate_cli::seconds::Seconds;
///
/// assert_eq!(Seconds(1_500_000_000).to_string(), "1.500000000");
/// assert_eq!(Seconds(u64::MAX).to_string(), "18446744073.709551615");
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Seconds(pub u64);

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{:09}",
            self.0 / NANOS_PER_SEC,
            self.0 % NANOS_PER_SEC
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_exactly() {
        let cases = [
            ("0", 0),
            ("0.0", 0),
            ("1", NANOS_PER_SEC),
            ("0.7", 700_000_000),
            ("0.1", 100_000_000),
            ("12.000000001", 12 * NANOS_PER_SEC + 1),
            ("0.999999999", 999_999_999),
            ("000000000000000000000000000003.5", 3_500_000_000),
            ("18446744073.709551615", u64::MAX),
        ];
        for (text, want) in cases {
            assert_eq!(parse_seconds(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn rejects_everything_else() {
        let cases = [
            ("", SecondsError::Syntax),
            (".5", SecondsError::Syntax),
            ("5.", SecondsError::Syntax),
            ("-1", SecondsError::Syntax),
            ("+1", SecondsError::Syntax),
            ("1e3", SecondsError::Syntax),
            ("1.2.3", SecondsError::Syntax),
            ("1,5", SecondsError::Syntax),
            ("١", SecondsError::Syntax),
            ("0.0000000001", SecondsError::TooPrecise),
            ("18446744073.709551616", SecondsError::TooLarge),
            ("18446744074", SecondsError::TooLarge),
            ("99999999999999999999999", SecondsError::TooLarge),
        ];
        for (text, want) in cases {
            assert_eq!(parse_seconds(text), Err(want), "{text}");
        }
    }

    #[test]
    fn formats_with_nine_digits_and_round_trips() {
        assert_eq!(Seconds(0).to_string(), "0.000000000");
        assert_eq!(Seconds(1).to_string(), "0.000000001");
        assert_eq!(Seconds(1_500_000_000).to_string(), "1.500000000");
        assert_eq!(Seconds(u64::MAX).to_string(), "18446744073.709551615");
        for ns in [0, 1, 999_999_999, 1_000_000_000, 123_456_789_012, u64::MAX] {
            assert_eq!(parse_seconds(&Seconds(ns).to_string()), Ok(ns));
        }
    }

    proptest::proptest! {
        #[test]
        fn every_nanosecond_count_round_trips(ns: u64) {
            proptest::prop_assert_eq!(parse_seconds(&Seconds(ns).to_string()), Ok(ns));
        }

        #[test]
        fn no_text_panics(text: String) {
            let _ = parse_seconds(&text);
        }
    }
}
