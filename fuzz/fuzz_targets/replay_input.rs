//! The parsers behind `floodgate replay` and the command's arguments, on arbitrary
//! input: the trace-line parser, the nginx `combined`-line parser, the exact
//! decimal-seconds parser and the duration parser. Every input must give a value or an
//! error, never a panic or an overflow (this profile keeps overflow checks on), and
//! whatever parses must survive a round trip:
//!
//! * seconds: the value printed with 9 decimals is the canonical form of the text
//!   (leading zeros dropped, fraction padded) and parses back to the same nanoseconds;
//!   any nanosecond count printed and parsed comes back unchanged;
//! * trace: a request written back as `<seconds> <key> <cost>` parses to the same
//!   request; a skipped line is blank or a comment;
//! * nginx: the request's time written as a UTC `$time_local` in a fresh combined
//!   line parses back to the same key and time; the cost is always 1;
//! * durations: the value written in nanoseconds (or whole seconds, beyond `u64`
//!   nanoseconds) parses back to the same duration.
#![no_main]

use floodgate::parse_duration;
use floodgate_cli::input::{parse_nginx_line, parse_trace_line, utc_timestamp};
use floodgate_cli::seconds::{parse_seconds, Seconds};
use libfuzzer_sys::fuzz_target;

const NANOS_PER_SEC: u64 = 1_000_000_000;

fuzz_target!(|data: &[u8]| {
    if let Some(bytes) = data.first_chunk::<8>() {
        let ns = u64::from_le_bytes(*bytes);
        assert_eq!(parse_seconds(&Seconds(ns).to_string()), Ok(ns));
    }
    let text = String::from_utf8_lossy(data);
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        seconds(line);
        trace(line);
        nginx(line);
        duration(line);
        // The fields on their own too: libFuzzer rarely builds a whole valid line
        // around the one field it is mutating.
        for field in line.split([' ', '\t']) {
            seconds(field);
            duration(field);
        }
    }
});

fn seconds(text: &str) {
    let Ok(ns) = parse_seconds(text) else {
        return;
    };
    let printed = Seconds(ns).to_string();
    assert_eq!(printed, canonical_seconds(text), "{text:?}");
    assert_eq!(parse_seconds(&printed), Ok(ns), "{text:?}");
}

/// `digits[.digits]` written as `Seconds` prints it: no leading zeros in the whole
/// part (a single `0` if none is left), exactly 9 fractional digits.
fn canonical_seconds(text: &str) -> String {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let whole = whole.trim_start_matches('0');
    let whole = if whole.is_empty() { "0" } else { whole };
    format!("{whole}.{fraction:0<9}")
}

fn trace(line: &str) {
    match parse_trace_line(line) {
        Err(error) => assert!(!error.to_string().is_empty()),
        Ok(None) => {
            let rest = line.trim_start_matches([' ', '\t']);
            assert!(rest.is_empty() || rest.starts_with('#'), "skipped {line:?}");
        }
        Ok(Some(request)) => {
            assert!(!request.key.is_empty());
            assert!(!request.key.chars().any(char::is_whitespace), "{line:?}");
            let written = format!("{} {} {}", Seconds(request.time), request.key, request.cost);
            assert_eq!(parse_trace_line(&written), Ok(Some(request)), "{line:?}");
        }
    }
}

fn nginx(line: &str) {
    let request = match parse_nginx_line(line) {
        Err(error) => {
            assert!(!error.to_string().is_empty());
            return;
        }
        Ok(None) => {
            assert!(
                line.trim_matches([' ', '\t']).is_empty(),
                "skipped {line:?}"
            );
            return;
        }
        Ok(Some(request)) => request,
    };
    assert_eq!(request.cost, 1);
    assert!(
        !request.key.is_empty() && !request.key.contains(' '),
        "{line:?}"
    );
    assert_eq!(request.time % NANOS_PER_SEC, 0, "{line:?}");
    // `YYYY-MM-DDTHH:MM:SSZ` → `DD/Mon/YYYY:HH:MM:SS +0000`.
    let stamp = utc_timestamp(request.time / NANOS_PER_SEC);
    let (date, clock) = stamp
        .strip_suffix('Z')
        .and_then(|s| s.split_once('T'))
        .expect("utc_timestamp writes YYYY-MM-DDTHH:MM:SSZ");
    let mut ymd = date.split('-');
    let (year, month, day) = (
        ymd.next().unwrap(),
        ymd.next().unwrap(),
        ymd.next().unwrap(),
    );
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS[month.parse::<usize>().unwrap() - 1];
    let written = format!(
        r#"{} - - [{day}/{month}/{year}:{clock} +0000] "GET / HTTP/1.1" 200 0 "-" "fuzz""#,
        request.key
    );
    let back = parse_nginx_line(&written);
    assert_eq!(back, Ok(Some(request)), "{line:?} → {written:?}");
}

fn duration(text: &str) {
    let parsed = match parse_duration(text) {
        Err(error) => {
            // clap shows the offending text beside this message; it must say why.
            assert!(!error.to_string().is_empty());
            return;
        }
        Ok(d) => d,
    };
    let written = match u64::try_from(parsed.as_nanos()) {
        Ok(ns) => format!("{ns}ns"),
        Err(_) => {
            assert_eq!(parsed.subsec_nanos(), 0, "{text:?}");
            format!("{}s", parsed.as_secs())
        }
    };
    assert_eq!(
        parse_duration(&written),
        Ok(parsed),
        "{text:?} → {written:?}"
    );
}
