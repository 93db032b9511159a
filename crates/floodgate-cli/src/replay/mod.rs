//! `floodgate replay`: a dry run of a policy over recorded requests, on virtual time.
//!
//! The input streams line by line (one reusable buffer, lines capped at
//! [`MAX_LINE_BYTES`]); memory grows with the number of distinct keys — their limiter
//! states and, for the summary, their denial counts — never with the length of the
//! input. Times that go backwards are clamped to the latest time seen, as the
//! engine's clock never runs backwards, and the clamped time is the one reported;
//! how many lines were moved, and the first of them, is noted on stderr at the end
//! ([`OutOfOrder`]), since it changes the decisions.
//!
//! On a bad line the run stops: the message names the line number and the text, the
//! JSON lines already written stay valid (each is written whole), and no summary is
//! printed.

mod address;
mod engine;
#[cfg(feature = "redis")]
mod redis;

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};

use floodgate::{Decision, Nanos};
use floodgate_http::IpGrouping;

use floodgate_cli::input::{self, LineError, Request};
use floodgate_cli::seconds::Seconds;

use crate::cli::{InputFormat, ReplayArgs};
use crate::Failure;

pub(crate) use address::AddressKeys;
pub(crate) use engine::{engine_for, DecideError, PolicySpec, ReplayEngine};

/// The longest line accepted, in bytes (without its line end).
pub(crate) const MAX_LINE_BYTES: usize = 1 << 20;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Why a replay stopped early.
#[derive(Debug)]
pub(crate) enum ReplayError {
    /// A bad line: exit status 2.
    Input {
        line: u64,
        error: LineError,
        text: String,
    },
    /// The engine could not decide a line's request: exit status 2 for a time it
    /// cannot represent, 1 for a failing server.
    Decide { line: u64, error: DecideError },
    /// Reading the input failed.
    Read(io::Error),
    /// Writing the output failed.
    Write(io::Error),
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayError::Input { line, error, text } => {
                // Long lines are cut for the message.
                write!(f, "line {line}: {error}\n  text: {}", input::quoted(text))
            }
            ReplayError::Decide { line, error } => write!(f, "line {line}: {error}"),
            ReplayError::Read(e) => write!(f, "reading the input: {e}"),
            ReplayError::Write(e) => write!(f, "writing the output: {e}"),
        }
    }
}

type LineParser = for<'a> fn(&'a str) -> Result<Option<Request<'a>>, LineError>;

fn parser_for(format: InputFormat) -> LineParser {
    match format {
        InputFormat::Trace => input::parse_trace_line,
        InputFormat::Nginx => input::parse_nginx_line,
    }
}

/// The lines whose time was earlier than a line before them, each decided at the
/// latest time seen before it instead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct OutOfOrder {
    /// How many.
    pub(crate) lines: u64,
    /// The first one's line number.
    pub(crate) first: Option<u64>,
}

impl OutOfOrder {
    /// The note printed on stderr after a run, when any line was moved.
    pub(crate) fn note(&self) -> Option<String> {
        let first = self.first?;
        let lines = match self.lines {
            1 => "1 line".to_owned(),
            n => format!("{n} lines"),
        };
        Some(format!(
            "note: {lines} had a time earlier than a line before them (the first: line \
             {first}); each was counted at the latest time before it, as the limiter's \
             clock never runs backwards: sort the input by time to replay it as recorded"
        ))
    }
}

/// Streams `input` through `engine`, calling `observe(request, now, decision)` for
/// each request in input order, where `now` is the (clamped) time the engine used and
/// the request's key is its client address's group under `addresses` (an nginx log)
/// or the key as written (`None`); returns the lines whose time was clamped.
pub(crate) fn replay<R: Read>(
    input: R,
    format: InputFormat,
    addresses: Option<&AddressKeys>,
    engine: &mut dyn ReplayEngine,
    mut observe: impl FnMut(&Request<'_>, u64, &Decision) -> io::Result<()>,
) -> Result<OutOfOrder, ReplayError> {
    let parse = parser_for(format);
    let mut input = BufReader::with_capacity(64 * 1024, input);
    let mut buf = Vec::with_capacity(256);
    let mut key_buf = String::with_capacity(48);
    let mut latest = 0u64;
    let mut line_no = 0u64;
    let mut out_of_order = OutOfOrder::default();
    loop {
        buf.clear();
        let read = (&mut input)
            .take(MAX_LINE_BYTES as u64 + 2)
            .read_until(b'\n', &mut buf)
            .map_err(ReplayError::Read)?;
        if read == 0 {
            return Ok(out_of_order);
        }
        line_no += 1;
        let bad = |error: LineError, bytes: &[u8]| ReplayError::Input {
            line: line_no,
            error,
            text: String::from_utf8_lossy(bytes).into_owned(),
        };
        let mut bytes = buf.as_slice();
        if let Some(rest) = bytes.strip_suffix(b"\n") {
            bytes = rest.strip_suffix(b"\r").unwrap_or(rest);
        }
        // Whichever way the line ends (or does not), the cap counts its text alone.
        if bytes.len() > MAX_LINE_BYTES {
            let prefix = &bytes[..200.min(bytes.len())];
            return Err(bad(
                LineError::new(format_args!("line longer than {MAX_LINE_BYTES} bytes")),
                prefix,
            ));
        }
        let text = std::str::from_utf8(bytes)
            .map_err(|e| bad(LineError::new(format_args!("not valid UTF-8 ({e})")), bytes))?;
        let Some(mut request) = parse(text).map_err(|e| bad(e, bytes))? else {
            continue;
        };
        if let Some(addresses) = addresses {
            request.key = addresses.key(request.key, &mut key_buf);
        }
        if request.time < latest {
            out_of_order.lines += 1;
            out_of_order.first.get_or_insert(line_no);
        }
        latest = latest.max(request.time);
        let decision = engine
            .check(request.key, Nanos::new(latest), request.cost)
            .map_err(|error| ReplayError::Decide {
                line: line_no,
                error,
            })?;
        observe(&request, latest, &decision).map_err(ReplayError::Write)?;
    }
}

/// Writes one `--jsonl` object (and its newline) for a decision.
pub(crate) fn write_json_line(
    out: &mut impl Write,
    request: &Request<'_>,
    now: u64,
    d: &Decision,
) -> io::Result<()> {
    // Build the line first so that a failed write never leaves half an object behind
    // in our own buffer.
    let mut line = Vec::with_capacity(192);
    write!(line, "{{\"t\": {}, \"key\": ", Seconds(now))?;
    serde_json::to_writer(&mut line, request.key)?;
    write!(
        line,
        ", \"cost\": {}, \"allowed\": {}, \"limit\": {}, \"remaining\": {}, \"reset_after\": {}, \"retry_after\": ",
        request.cost,
        d.is_allowed(),
        d.limit(),
        d.remaining(),
        Seconds(d.reset_after_nanos()),
    )?;
    match d.retry_after_nanos() {
        Some(ns) => write!(line, "{}}}", Seconds(ns))?,
        None => line.extend_from_slice(b"null}"),
    }
    line.push(b'\n');
    out.write_all(&line)
}

/// Replay's key tables: `ahash` hashes short keys faster than the default SipHash, and
/// replay's input is a file the user chose, not an attacker's stream.
pub(crate) type KeyMap<V> = HashMap<Box<str>, V, ahash::RandomState>;

/// The counts behind the summary.
#[derive(Debug, Default)]
pub(crate) struct Summary {
    requests: u64,
    allowed: u64,
    denied: u64,
    /// Every key seen, with its number of denials.
    denials: KeyMap<u64>,
    /// (second, requests) of the second being counted; times arrive in order.
    current_second: Option<(u64, u64)>,
    busiest_second: Option<(u64, u64)>,
}

impl Summary {
    pub(crate) fn record(&mut self, key: &str, now: u64, decision: &Decision) {
        self.requests += 1;
        let denied = u64::from(!decision.is_allowed());
        self.denied += denied;
        self.allowed += 1 - denied;
        match self.denials.get_mut(key) {
            Some(count) => *count += denied,
            None => {
                self.denials.insert(key.into(), denied);
            }
        }
        let second = now / NANOS_PER_SEC;
        match &mut self.current_second {
            Some((s, count)) if *s == second => *count += 1,
            _ => {
                self.close_second();
                self.current_second = Some((second, 1));
            }
        }
    }

    fn close_second(&mut self) {
        if let Some((second, count)) = self.current_second {
            // Strictly more: the earliest of equally busy seconds wins.
            if self.busiest_second.is_none_or(|(_, best)| count > best) {
                self.busiest_second = Some((second, count));
            }
        }
    }

    /// The ten keys with the most denials (ties by key), without keys never denied.
    fn top_denied(&self) -> Vec<(&str, u64)> {
        let mut denied: Vec<(&str, u64)> = self
            .denials
            .iter()
            .filter(|(_, &n)| n > 0)
            .map(|(k, &n)| (&**k, n))
            .collect();
        denied.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        denied.truncate(10);
        denied
    }

    /// The summary as printed, for `spec` over input in `format`, keyed by client
    /// address under `addresses` (an nginx log) or by the keys as written (`None`).
    pub(crate) fn render(
        mut self,
        spec: &PolicySpec,
        format: InputFormat,
        addresses: Option<&AddressKeys>,
        out: &mut impl Write,
    ) -> io::Result<()> {
        self.close_second();
        let percent = if self.requests == 0 {
            0.0
        } else {
            self.denied as f64 * 100.0 / self.requests as f64
        };
        writeln!(out, "policy          {spec}")?;
        if let Some(addresses) = addresses {
            writeln!(out, "key             {}", addresses.describe())?;
        }
        writeln!(
            out,
            "requests        {} (cost-0 lines included)",
            self.requests
        )?;
        writeln!(out, "allowed         {}", self.allowed)?;
        writeln!(out, "denied          {} ({percent:.2} %)", self.denied)?;
        writeln!(out, "distinct keys   {}", self.denials.len())?;
        match self.busiest_second {
            None => writeln!(out, "busiest second  -")?,
            Some((second, count)) => {
                let when = match format {
                    InputFormat::Trace => format!("[{second} s, {} s)", second + 1),
                    InputFormat::Nginx => input::utc_timestamp(second),
                };
                writeln!(out, "busiest second  {when}: {count} requests")?;
            }
        }
        let top = self.top_denied();
        if top.is_empty() {
            writeln!(out, "top denied keys -")?;
        } else {
            writeln!(out, "top denied keys (most denials first, ties by key)")?;
            for (key, count) in top {
                writeln!(out, "  {count:>12}  {}", shown_key(key))?;
            }
        }
        Ok(())
    }
}

/// A key as the summary shows it: as it is, or quoted and escaped as `{:?}` writes
/// it when that would escape any of its characters — a control character (ESC
/// would drive the reader's terminal), an invisible one (U+200B would make two keys
/// look alike), a `"` or a `\`. A key shown unquoted is therefore the key itself.
fn shown_key(key: &str) -> Cow<'_, str> {
    let debug = format!("{key:?}");
    // `{:?}` adds the two quotes, and each escape lengthens the text.
    if debug.len() == key.len() + 2 {
        Cow::Borrowed(key)
    } else {
        Cow::Owned(debug)
    }
}

/// `floodgate replay`.
pub(crate) fn run(args: ReplayArgs) -> Result<(), Failure> {
    let spec = PolicySpec {
        algorithm: args.algorithm,
        limit: args.limit,
        per: args.per,
        burst: args.burst,
    };
    let addresses = address_keys(&args)?;
    let mut engine = match redis_engine(&args, &spec)? {
        Some(engine) => engine,
        None => engine_for(&spec).map_err(|e| Failure::usage(e.to_string()))?,
    };
    let input: Box<dyn Read> = match args.input.as_deref() {
        None => Box::new(io::stdin().lock()),
        Some(path) if path.as_os_str() == "-" => Box::new(io::stdin().lock()),
        Some(path) => {
            let cannot_open =
                |why: String| Failure::usage(format!("cannot open {}: {why}", path.display()));
            let file = File::open(path).map_err(|e| cannot_open(e.to_string()))?;
            // A directory opens, and only its first read fails: say so, naming it.
            if file.metadata().is_ok_and(|m| m.is_dir()) {
                return Err(cannot_open("it is a directory".to_owned()));
            }
            Box::new(file)
        }
    };
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let result = if args.jsonl {
        replay(
            input,
            args.format,
            addresses.as_ref(),
            &mut *engine,
            |request, now, d| write_json_line(&mut out, request, now, d),
        )
        .map(|out_of_order| (None, out_of_order))
    } else {
        let mut summary = Summary::default();
        replay(
            input,
            args.format,
            addresses.as_ref(),
            &mut *engine,
            |request, now, d| {
                summary.record(request.key, now, d);
                Ok(())
            },
        )
        .map(|out_of_order| (Some(summary), out_of_order))
    };
    // Flush what was printed before reporting anything: those lines stay valid.
    let flushed = out.flush();
    let (summary, out_of_order) = match result {
        Ok(done) => done,
        Err(ReplayError::Write(e)) => return Err(Failure::output(e)),
        Err(e @ ReplayError::Input { .. }) => {
            return Err(flushed.map_or_else(Failure::output, |()| Failure::usage(e.to_string())))
        }
        Err(
            e @ ReplayError::Decide {
                error: DecideError::TimeNotWholeMicros { .. } | DecideError::TimeOutOfRange { .. },
                ..
            },
        ) => return Err(flushed.map_or_else(Failure::output, |()| Failure::usage(e.to_string()))),
        Err(e @ (ReplayError::Read(_) | ReplayError::Decide { .. })) => {
            return Err(flushed.map_or_else(Failure::output, |()| Failure::runtime(e.to_string())))
        }
    };
    flushed.map_err(Failure::output)?;
    if let Some(summary) = summary {
        summary
            .render(&spec, args.format, addresses.as_ref(), &mut out)
            .and_then(|()| out.flush())
            .map_err(Failure::output)?;
    }
    if let Some(note) = out_of_order.note() {
        eprintln!("floodgate: {note}");
    }
    Ok(())
}

/// How an nginx log's client addresses become keys: floodgate-http's default
/// grouping, with `--ipv4-prefix` and `--ipv6-prefix` applied; `None` for a trace,
/// whose keys are used as written (and which takes neither option).
fn address_keys(args: &ReplayArgs) -> Result<Option<AddressKeys>, Failure> {
    let mut grouping = IpGrouping::default();
    let prefixes = [
        ("--ipv4-prefix", args.ipv4_prefix),
        ("--ipv6-prefix", args.ipv6_prefix),
    ];
    if args.format != InputFormat::Nginx {
        return match prefixes.iter().find(|(_, len)| len.is_some()) {
            Some((option, _)) => Err(Failure::usage(format!(
                "{option} groups client addresses, which only `--format nginx` has: a \
                 trace's keys are used as written"
            ))),
            None => Ok(None),
        };
    }
    // `IpGrouping` checks the lengths, as it does for the layer.
    let bad = |e: floodgate_http::ConfigError| Failure::usage(e.to_string());
    if let Some(len) = args.ipv4_prefix {
        grouping = grouping.v4_prefix(len).map_err(bad)?;
    }
    if let Some(len) = args.ipv6_prefix {
        grouping = grouping.v6_prefix(len).map_err(bad)?;
    }
    Ok(Some(AddressKeys::new(grouping)))
}

/// The Redis engine when `--redis` is given.
#[cfg(feature = "redis")]
fn redis_engine(
    args: &ReplayArgs,
    spec: &PolicySpec,
) -> Result<Option<Box<dyn ReplayEngine>>, Failure> {
    let Some(url) = args.redis.as_deref() else {
        return Ok(None);
    };
    let (engine, prefix) = redis::RedisEngine::connect(url, args.prefix.clone(), spec)?;
    // Said before the first request, so that a run that stops early says it too.
    eprintln!(
        "floodgate: replaying through Redis under the key prefix {prefix:?}; the keys \
         keep no TTL: delete them when done (give --prefix {prefix:?} to continue them)"
    );
    Ok(Some(Box::new(engine)))
}

/// Without the `redis` feature there is no `--redis`.
#[cfg(not(feature = "redis"))]
fn redis_engine(
    _args: &ReplayArgs,
    _spec: &PolicySpec,
) -> Result<Option<Box<dyn ReplayEngine>>, Failure> {
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::AlgorithmName;
    use std::time::Duration;

    fn spec() -> PolicySpec {
        PolicySpec {
            algorithm: AlgorithmName::Gcra,
            limit: 2,
            per: Duration::from_secs(1),
            burst: None,
        }
    }

    fn jsonl(input: &str) -> (String, Result<OutOfOrder, ReplayError>) {
        let mut engine = engine_for(&spec()).unwrap();
        let mut out = Vec::new();
        let result = replay(
            input.as_bytes(),
            InputFormat::Trace,
            None,
            &mut *engine,
            |r, t, d| write_json_line(&mut out, r, t, d),
        );
        (String::from_utf8(out).unwrap(), result)
    }

    #[test]
    fn json_lines_are_exact() {
        let (out, result) = jsonl("0 a\r\n0 a\n0.25 a\n# note\n\n0.5 a 3\n0.1 \"b\\ 0\n");
        // The last line's 0.1 s is counted at 0.5 s, and said so.
        assert_eq!(
            result.unwrap(),
            OutOfOrder {
                lines: 1,
                first: Some(7)
            }
        );
        let want = [
            r#"{"t": 0.000000000, "key": "a", "cost": 1, "allowed": true, "limit": 2, "remaining": 1, "reset_after": 0.500000000, "retry_after": 0.000000000}"#,
            r#"{"t": 0.000000000, "key": "a", "cost": 1, "allowed": true, "limit": 2, "remaining": 0, "reset_after": 1.000000000, "retry_after": 0.000000000}"#,
            r#"{"t": 0.250000000, "key": "a", "cost": 1, "allowed": false, "limit": 2, "remaining": 0, "reset_after": 0.750000000, "retry_after": 0.250000000}"#,
            r#"{"t": 0.500000000, "key": "a", "cost": 3, "allowed": false, "limit": 2, "remaining": 1, "reset_after": 0.500000000, "retry_after": null}"#,
            r#"{"t": 0.500000000, "key": "\"b\\", "cost": 0, "allowed": true, "limit": 2, "remaining": 2, "reset_after": 0.000000000, "retry_after": 0.000000000}"#,
        ];
        assert_eq!(out.lines().collect::<Vec<_>>(), want);
    }

    #[test]
    fn a_bad_line_stops_after_the_good_ones() {
        let (out, result) = jsonl("0 a\n1 b\n2 c x\n3 d\n");
        assert_eq!(out.lines().count(), 2);
        match result {
            Err(ReplayError::Input { line, text, .. }) => {
                assert_eq!((line, text.as_str()), (3, "2 c x"));
            }
            other => panic!("{other:?}"),
        }
        let (_, result) = jsonl("0 a\n\u{0}\u{ff}");
        let message = result.unwrap_err().to_string();
        assert!(message.starts_with("line 2: invalid time"), "{message}");
        let mut engine = engine_for(&spec()).unwrap();
        let invalid_utf8: &[u8] = b"0 a\n1 \xff\n";
        let err = replay(
            invalid_utf8,
            InputFormat::Trace,
            None,
            &mut *engine,
            |_, _, _| Ok(()),
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("line 2: not valid UTF-8"), "{err}");
    }

    #[test]
    fn overlong_lines_are_refused_without_reading_them_whole() {
        let long = format!("0 {}\n", "k".repeat(MAX_LINE_BYTES + 10));
        let (_, result) = jsonl(&long);
        let err = result.unwrap_err().to_string();
        assert!(err.starts_with("line 1: line longer than"), "{err}");
        // Exactly at the cap is fine.
        let at_cap = format!("0 {}\r\n", "k".repeat(MAX_LINE_BYTES - 2));
        let (out, result) = jsonl(&at_cap);
        result.unwrap();
        assert_eq!(out.lines().count(), 1);
    }

    #[test]
    fn top_denied_keys_are_ten_by_count_then_key() {
        let deny = Decision::new(false, 1, 0, Duration::ZERO, None);
        let allow = Decision::new(true, 1, 0, Duration::ZERO, None);
        let mut summary = Summary::default();
        // k00 … k11 denied 1, 2, 1, 2, … times; "never" is only ever allowed.
        for i in 0..12u64 {
            for _ in 0..=(i % 2) {
                summary.record(&format!("k{i:02}"), i, &deny);
            }
        }
        summary.record("never", 0, &allow);
        let top: Vec<(&str, u64)> = summary.top_denied();
        assert_eq!(
            top,
            [
                ("k01", 2),
                ("k03", 2),
                ("k05", 2),
                ("k07", 2),
                ("k09", 2),
                ("k11", 2),
                ("k00", 1),
                ("k02", 1),
                ("k04", 1),
                ("k06", 1),
            ]
        );
        assert_eq!(summary.denials.len(), 13);
    }

    #[test]
    fn the_earliest_of_equally_busy_seconds_wins() {
        let allow = Decision::new(true, 1, 0, Duration::ZERO, None);
        let mut summary = Summary::default();
        for t in [0, 1, 1, 2, 2, 3] {
            summary.record("k", t * NANOS_PER_SEC, &allow);
        }
        summary.close_second();
        assert_eq!(summary.busiest_second, Some((1, 2)));
    }

    #[test]
    fn summary_counts_keys_denials_and_the_busiest_second() {
        let mut engine = engine_for(&spec()).unwrap();
        let mut summary = Summary::default();
        let input = "0 a\n0 a\n0 a\n0 b\n0 b\n0 b\n0.5 c 0\n1 a\n1 a\n1.5 z\n1.5 z\n1.5 z\n2 y\n";
        replay(
            input.as_bytes(),
            InputFormat::Trace,
            None,
            &mut *engine,
            |r, t, d| {
                summary.record(r.key, t, d);
                Ok(())
            },
        )
        .unwrap();
        let mut out = Vec::new();
        summary
            .render(&spec(), InputFormat::Trace, None, &mut out)
            .unwrap();
        let out = String::from_utf8(out).unwrap();
        let want = "\
policy          gcra 2 per 1s, burst 2
requests        13 (cost-0 lines included)
allowed         10
denied          3 (23.08 %)
distinct keys   5
busiest second  [0 s, 1 s): 7 requests
top denied keys (most denials first, ties by key)
             1  a
             1  b
             1  z
";
        assert_eq!(out, want);
    }
}
