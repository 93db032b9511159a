//! nginx's `combined` access-log format:
//!
//! ```text
//! $remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent"
//! ```
//!
//! The key is `$remote_addr`; the time is `$time_local` (`10/Oct/2000:13:55:36 -0700`)
//! converted to nanoseconds since the Unix epoch, so the replay's time axis is Unix
//! time and fixed windows align to UTC seconds, minutes, hours and days — as the
//! library's default clock does. Every line costs 1.
//!
//! Every field of `combined` must be present and well formed. Fields *after* the
//! user agent are accepted and ignored: many sites append `$http_x_forwarded_for`,
//! `$request_time` and the like to the combined format. nginx escapes `"` inside
//! quoted fields as `\x22`, so a quoted field ends at the next `"`. Blank lines are
//! skipped; nginx writes no comments, so `#` has no special meaning.
//!
//! `$remote_user` is the user name of the request's Basic credentials, which any
//! client may send: nginx logs it unquoted, with its spaces and brackets as sent (it
//! escapes only `"`, `\` and bytes outside printable ASCII). So it runs up to the
//! last ` [` before the line's first `"` (which opens `"$request"`), and
//! `$time_local` is the `[…]` there: a user name such as `john doe`, or one holding a
//! `[…]` time of its own, neither stops the replay nor chooses the time read.

use super::{LineError, Request};

const NANOS_PER_SEC: u64 = 1_000_000_000;
const SECS_PER_DAY: i64 = 86_400;
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Parses one combined-format line (without its line end); `Ok(None)` when blank.
///
/// # Errors
///
/// A [`LineError`] naming the first missing or malformed field.
///
/// # Examples
///
/// ```
/// use floodgate_cli::input::parse_nginx_line;
///
/// let line = r#"127.0.0.1 - frank [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.0" 200 2326 "-" "curl/8.0""#;
/// let request = parse_nginx_line(line).unwrap().unwrap();
/// assert_eq!((request.key, request.cost), ("127.0.0.1", 1));
/// assert_eq!(request.time, 971_211_336_000_000_000); // 2000-10-10T20:55:36Z
/// assert_eq!(parse_nginx_line("  "), Ok(None));
/// assert!(parse_nginx_line("127.0.0.1 - -").is_err());
/// ```
pub fn parse_nginx_line(line: &str) -> Result<Option<Request<'_>>, LineError> {
    if line.trim_matches([' ', '\t']).is_empty() {
        return Ok(None);
    }
    let mut cursor = Cursor { rest: line };
    let addr = cursor.word("$remote_addr")?;
    cursor.word("the `-` after $remote_addr")?;
    cursor.remote_user()?;
    let time_local = cursor.delimited('[', ']', "[$time_local]")?;
    let time = parse_time_local(time_local)?;
    cursor.delimited('"', '"', "\"$request\"")?;
    let status = cursor.word("$status")?;
    if status.len() != 3 || !status.bytes().all(|b| b.is_ascii_digit()) {
        return Err(LineError::field(
            "$status",
            status,
            "expected a 3-digit HTTP status",
        ));
    }
    let bytes = cursor.word("$body_bytes_sent")?;
    if !bytes.bytes().all(|b| b.is_ascii_digit()) {
        return Err(LineError::field(
            "$body_bytes_sent",
            bytes,
            "expected a whole number",
        ));
    }
    cursor.delimited('"', '"', "\"$http_referer\"")?;
    cursor.delimited('"', '"', "\"$http_user_agent\"")?;
    Ok(Some(Request {
        time,
        key: addr,
        cost: 1,
    }))
}

/// A left-to-right reader over one line; fields are separated by single spaces.
struct Cursor<'a> {
    rest: &'a str,
}

impl<'a> Cursor<'a> {
    fn skip_separator(&mut self) {
        self.rest = self.rest.trim_start_matches(' ');
    }

    /// A run of non-space characters.
    fn word(&mut self, what: &'static str) -> Result<&'a str, LineError> {
        self.skip_separator();
        let end = self.rest.find(' ').unwrap_or(self.rest.len());
        let (word, rest) = self.rest.split_at(end);
        if word.is_empty() {
            return Err(LineError::missing(what));
        }
        self.rest = rest;
        Ok(word)
    }

    /// `$remote_user`, which may hold spaces and brackets (see the module docs): up
    /// to the last ` [` before the first `"`; without one, a word (what follows is
    /// then no `[$time_local]`, and the next field says so).
    fn remote_user(&mut self) -> Result<&'a str, LineError> {
        self.skip_separator();
        let head = self.rest.find('"').map_or(self.rest, |q| &self.rest[..q]);
        match head.rfind(" [") {
            // `rest` starts with no space, so the user name is not empty.
            Some(end) if end > 0 => {
                let (user, rest) = self.rest.split_at(end);
                self.rest = rest;
                Ok(user.trim_end_matches(' '))
            }
            _ => self.word("$remote_user"),
        }
    }

    /// `open … close`, returning what is between.
    fn delimited(
        &mut self,
        open: char,
        close: char,
        what: &'static str,
    ) -> Result<&'a str, LineError> {
        self.skip_separator();
        let Some(inner) = self.rest.strip_prefix(open) else {
            return Err(LineError::missing(what));
        };
        let Some(end) = inner.find(close) else {
            return Err(LineError::new(format_args!("unterminated {what}")));
        };
        self.rest = &inner[end + close.len_utf8()..];
        if !(self.rest.is_empty() || self.rest.starts_with(' ')) {
            return Err(LineError::new(format_args!(
                "unexpected text after {what} (expected a space)"
            )));
        }
        Ok(&inner[..end])
    }
}

/// `dd/Mon/yyyy:HH:MM:SS ±hhmm` → nanoseconds since the Unix epoch.
fn parse_time_local(text: &str) -> Result<u64, LineError> {
    let bad = |reason| LineError::field("$time_local", text, reason);
    let b = text.as_bytes();
    let shape_ok = b.len() == 26
        && b[2] == b'/'
        && b[6] == b'/'
        && b[11] == b':'
        && b[14] == b':'
        && b[17] == b':'
        && b[20] == b' '
        && (b[21] == b'+' || b[21] == b'-');
    if !shape_ok || !text.is_ascii() {
        return Err(bad("expected dd/Mon/yyyy:HH:MM:SS +hhmm"));
    }
    let number = |range: core::ops::Range<usize>| -> Result<i64, LineError> {
        let s = &text[range];
        if s.bytes().all(|b| b.is_ascii_digit()) {
            // At most 4 ASCII digits: always fits.
            Ok(s.bytes().fold(0, |n, b| n * 10 + i64::from(b - b'0')))
        } else {
            Err(bad("expected dd/Mon/yyyy:HH:MM:SS +hhmm"))
        }
    };
    let day = number(0..2)?;
    let month = MONTHS
        .iter()
        .position(|m| *m == &text[3..6])
        .ok_or_else(|| bad("unknown month (expected Jan … Dec)"))? as i64
        + 1;
    let year = number(7..11)?;
    let (hour, minute, second) = (number(12..14)?, number(15..17)?, number(18..20)?);
    let (off_h, off_m) = (number(22..24)?, number(24..26)?);
    if day < 1 || day > days_in_month(year, month) {
        return Err(bad("no such day in that month"));
    }
    if hour > 23 || minute > 59 || second > 59 || off_h > 23 || off_m > 59 {
        return Err(bad("hour, minute, second or offset out of range"));
    }
    let offset = (off_h * 3_600 + off_m * 60) * if b[21] == b'-' { -1 } else { 1 };
    let local =
        days_from_civil(year, month, day) * SECS_PER_DAY + hour * 3_600 + minute * 60 + second;
    // Local time = UTC + offset.
    let utc = local - offset;
    let secs =
        u64::try_from(utc).map_err(|_| bad("before the Unix epoch (1970-01-01T00:00:00Z)"))?;
    secs.checked_mul(NANOS_PER_SEC)
        .ok_or_else(|| bad("after 2554-07-21T23:34:33Z (u64 nanoseconds since the epoch)"))
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the given proleptic Gregorian date (years 0..=9999 here).
///
/// Counts in 400-year eras starting on 1 March, so the leap day falls at the end of
/// the counting year.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    // 719 468 days from 0000-03-01 to 1970-01-01.
    era * 146_097 + day_of_era - 719_468
}

/// The inverse of [`days_from_civil`]: (year, month, day) of a day since the epoch.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A Unix second as `YYYY-MM-DDTHH:MM:SSZ`, for the summary of an nginx replay.
///
/// # Examples
///
/// ```
/// use floodgate_cli::input::utc_timestamp;
///
/// assert_eq!(utc_timestamp(0), "1970-01-01T00:00:00Z");
/// assert_eq!(utc_timestamp(971_211_336), "2000-10-10T20:55:36Z");
/// ```
pub fn utc_timestamp(unix_secs: u64) -> String {
    let secs = i64::try_from(unix_secs).unwrap_or(i64::MAX);
    let (days, second_of_day) = (secs.div_euclid(SECS_PER_DAY), secs.rem_euclid(SECS_PER_DAY));
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        second_of_day / 3_600,
        second_of_day % 3_600 / 60,
        second_of_day % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"127.0.0.1 - frank [10/Oct/2000:13:55:36 -0700] "GET /apache_pb.gif HTTP/1.0" 200 2326 "http://www.example.com/start.html" "Mozilla/4.08 [en] (Win98; I ;Nav)""#;

    #[test]
    fn parses_the_documented_example() {
        let r = parse_nginx_line(SAMPLE).unwrap().unwrap();
        assert_eq!(r.key, "127.0.0.1");
        assert_eq!(r.cost, 1);
        // 2000-10-10T20:55:36Z
        assert_eq!(r.time, 971_211_336 * NANOS_PER_SEC);
        assert_eq!(utc_timestamp(971_211_336), "2000-10-10T20:55:36Z");
    }

    #[test]
    fn accepts_ipv6_extra_fields_and_escaped_quotes() {
        let line = r#"2001:db8::1 - - [01/Jan/1970:00:00:01 +0000] "GET /?q=\x22x\x22 HTTP/1.1" 429 0 "-" "curl/8.0" "10.0.0.9" 0.001"#;
        let r = parse_nginx_line(line).unwrap().unwrap();
        assert_eq!((r.key, r.time), ("2001:db8::1", NANOS_PER_SEC));
    }

    #[test]
    fn a_remote_user_with_spaces_and_brackets_is_no_field_boundary() {
        let line = r#"192.0.2.1 - a [01/Jan/2500:00:00:00 +0000] b [01/Jan/1970:00:00:02 +0000] "GET / HTTP/1.1" 401 0 "-" "-""#;
        let r = parse_nginx_line(line).unwrap().unwrap();
        assert_eq!((r.key, r.time), ("192.0.2.1", 2 * NANOS_PER_SEC));
        let line =
            r#"192.0.2.1 - john doe [01/Jan/1970:00:00:03 +0000] "GET / HTTP/1.1" 401 0 "-" "-""#;
        assert_eq!(
            parse_nginx_line(line).unwrap().unwrap().time,
            3 * NANOS_PER_SEC
        );
    }

    #[test]
    fn converts_offsets_and_calendar_edges() {
        let cases = [
            ("01/Jan/1970:00:00:00 +0000", 0),
            ("01/Jan/1970:01:00:00 +0100", 0),
            ("31/Dec/1969:19:00:00 -0500", 0),
            ("29/Feb/2024:12:00:00 +0000", 1_709_208_000),
            ("01/Mar/2000:00:00:00 +0000", 951_868_800),
            ("31/Dec/2099:23:59:59 +0000", 4_102_444_799),
            // The last second u64 nanoseconds can hold.
            ("21/Jul/2554:23:34:33 +0000", 18_446_744_073),
        ];
        for (text, secs) in cases {
            assert_eq!(parse_time_local(text), Ok(secs * NANOS_PER_SEC), "{text}");
        }
        for secs in [0, 951_868_800, 1_709_208_000, 4_102_444_799] {
            let stamp = utc_timestamp(secs);
            let (date, clock) = stamp.trim_end_matches('Z').split_once('T').unwrap();
            let d: Vec<i64> = date.split('-').map(|p| p.parse().unwrap()).collect();
            let c: Vec<i64> = clock.split(':').map(|p| p.parse().unwrap()).collect();
            let back =
                days_from_civil(d[0], d[1], d[2]) * SECS_PER_DAY + c[0] * 3_600 + c[1] * 60 + c[2];
            assert_eq!(back, secs as i64, "{stamp}");
        }
    }

    #[test]
    fn rejects_bad_times() {
        for text in [
            "29/Feb/2023:12:00:00 +0000",
            "31/Apr/2023:12:00:00 +0000",
            "00/Jan/2023:12:00:00 +0000",
            "10/Foo/2000:13:55:36 -0700",
            "10/Oct/2000:24:00:00 -0700",
            "10/Oct/2000:13:60:36 -0700",
            "10/Oct/2000:13:55:60 -0700",
            "10/Oct/2000:13:55:36 0700",
            "10/Oct/2000:13:55:36 -07:00",
            "10/Oct/2000 13:55:36 -0700",
            "31/Dec/1969:23:59:59 +0000",
            "1a/Oct/2000:13:55:36 -0700",
            "10/Oct/2000:13:55:36 -07é",
            "21/Jul/2554:23:34:34 +0000",
            "31/Dec/9999:23:59:59 -2359",
        ] {
            assert!(parse_time_local(text).is_err(), "{text}");
        }
    }

    #[test]
    fn rejects_malformed_lines_naming_the_field() {
        let cases = [
            ("127.0.0.1", "the `-` after $remote_addr"),
            ("127.0.0.1 - -", "[$time_local]"),
            ("127.0.0.1 - - 10/Oct/2000:13:55:36 -0700", "[$time_local]"),
            ("127.0.0.1 - - [10/Oct/2000:13:55:36 -0700", "unterminated"),
            (
                r#"127.0.0.1 - - [10/Oct/2000:13:55:36 -0700] GET"#,
                "\"$request\"",
            ),
            (
                r#"127.0.0.1 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 2000 1 "-" "-""#,
                "$status",
            ),
            (
                r#"127.0.0.1 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 200 -1 "-" "-""#,
                "$body_bytes_sent",
            ),
            (
                r#"127.0.0.1 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 200 1 "-""#,
                "$http_user_agent",
            ),
            (
                r#"127.0.0.1 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1"x 200 1 "-" "-""#,
                "text after",
            ),
        ];
        for (line, want) in cases {
            let err = parse_nginx_line(line).unwrap_err().to_string();
            assert!(err.contains(want), "{line}: {err}");
        }
        assert_eq!(parse_nginx_line("  ").unwrap().map(|r| r.cost), None);
    }

    proptest::proptest! {
        #[test]
        fn written_times_parse_back(
            unix in 86_400u64..253_402_214_400,
            offset_minutes in -(23 * 60 + 59)..=(23i64 * 60 + 59),
        ) {
            // Write the local time for `offset_minutes` the way nginx does.
            let local = unix as i64 + offset_minutes * 60;
            let (days, secs) = (local.div_euclid(SECS_PER_DAY), local.rem_euclid(SECS_PER_DAY));
            let (y, m, d) = civil_from_days(days);
            let sign = if offset_minutes < 0 { '-' } else { '+' };
            let off = offset_minutes.abs();
            let text = format!(
                "{d:02}/{}/{y:04}:{:02}:{:02}:{:02} {sign}{:02}{:02}",
                MONTHS[(m - 1) as usize],
                secs / 3_600,
                secs % 3_600 / 60,
                secs % 60,
                off / 60,
                off % 60
            );
            match unix.checked_mul(NANOS_PER_SEC) {
                Some(ns) => proptest::prop_assert_eq!(parse_time_local(&text), Ok(ns), "{}", text),
                None => proptest::prop_assert!(parse_time_local(&text).is_err(), "{}", text),
            }
        }

        #[test]
        fn no_line_panics(line: String) {
            let _ = parse_nginx_line(&line);
        }

        #[test]
        fn no_near_miss_panics(tail: String) {
            let _ = parse_nginx_line(&format!("1.2.3.4 - - [{tail}"));
            let _ = parse_time_local(&format!("10/Oct/2000:13:55:36 {tail}"));
        }
    }
}
