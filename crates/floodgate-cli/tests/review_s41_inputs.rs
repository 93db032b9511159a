//! Session 41's review of what `floodgate replay` reads: hostile and unusual input,
//! through the built binary. Each test is named after what a user saw before its fix.

mod common;

use common::replay_file as replay;

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).expect("the output is UTF-8")
}

const GCRA_1_PER_S: [&str; 6] = ["--algorithm", "gcra", "--limit", "1", "--per", "1s"];

/// The user name of HTTP Basic credentials is the client's choice, and nginx logs it
/// as `$remote_user` unquoted, spaces and brackets as sent (it escapes only `"`, `\`
/// and bytes outside printable ASCII). One request carrying `Authorization: Basic`
/// for the user `john doe` stopped `replay --format nginx` of the whole log with
/// "missing [$time_local]" (exit 2, no summary): any client could make a day's log
/// impossible to replay. Now `$remote_user` runs to the last ` [` before the line's
/// first `"`, so the time read is nginx's own, even when the user name holds a
/// well-formed `[...]` time of its own. Mutation that fails it: reading
/// `$remote_user` as one space-free word again (`cursor.word("$remote_user")`).
#[test]
fn an_nginx_line_whose_basic_auth_user_holds_a_space_is_replayed() {
    let log = concat!(
        r#"203.0.113.7 - john doe [01/May/2024:12:00:00 +0000] "GET / HTTP/1.1" 401 0 "-" "curl/8.5.0""#,
        "\n",
        r#"203.0.113.7 - a [01/Jan/2500:00:00:00 +0000] b [01/May/2024:12:00:00 +0000] "GET / HTTP/1.1" 401 0 "-" "curl/8.5.0""#,
        "\n",
        r#"198.51.100.2 -   x  [01/May/2024:12:00:01 +0000] "GET / HTTP/1.1" 200 1 "-" "-""#,
        "\n",
    );
    let mut args = GCRA_1_PER_S.to_vec();
    args.extend(["--format", "nginx", "--jsonl"]);
    let output = replay(&args, log.as_bytes());
    assert!(output.status.success(), "{}", text(&output.stderr));
    let lines: Vec<serde_json::Value> = text(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object a line"))
        .collect();
    let seen: Vec<(&str, f64, bool)> = lines
        .iter()
        .map(|l| {
            (
                l["key"].as_str().unwrap(),
                l["t"].as_f64().unwrap(),
                l["allowed"].as_bool().unwrap(),
            )
        })
        .collect();
    // 2024-05-01T12:00:00Z is 1714564800 s after the epoch; the year 2500 in the
    // second line's user name is never the time read.
    assert_eq!(
        seen,
        [
            ("203.0.113.7", 1_714_564_800.0, true),
            ("203.0.113.7", 1_714_564_800.0, false),
            ("198.51.100.2", 1_714_564_801.0, true),
        ]
    );
    // A line that is not combined is still refused, naming what is missing.
    let bad = r#"203.0.113.7 - john doe 01/May/2024:12:00:00 +0000 "GET / HTTP/1.1" 200 0 "-" "-""#;
    let output = replay(&args, bad.as_bytes());
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains("line 1: missing [$time_local]"),
        "{}",
        text(&output.stderr)
    );
}

/// A trace key is any run of non-whitespace UTF-8, so it may hold ESC and other
/// control characters; the summary's "top denied keys" printed them raw, so a key
/// such as `a\x1b[2J` (from a trace built from client-sent API keys) cleared or
/// rewrote the user's terminal, and a key with an invisible character (U+200B)
/// looked exactly like another key. Now a key that `{:?}` would escape (a control
/// or invisible character, a `"` or a `\`) is shown quoted and escaped; other keys
/// are shown as before. Mutation that fails it: printing `key` instead of
/// `shown_key(key)` in `Summary::render`.
#[test]
fn the_summary_shows_keys_with_control_characters_escaped() {
    let trace = "0 a\x1b[2Jb\n0 a\x1b[2Jb\n0 a\u{200b}b\n0 a\u{200b}b\n0 ab\n0 ab\n0 \"q\n0 \"q\n";
    let output = replay(&GCRA_1_PER_S, trace.as_bytes());
    assert!(output.status.success(), "{}", text(&output.stderr));
    let out = text(&output.stdout);
    assert!(!out.contains('\x1b'), "{out:?}");
    assert!(!out.contains('\u{200b}'), "{out:?}");
    let top: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("top denied keys"))
        .skip(1)
        .map(|l| l.trim_start())
        .collect();
    // Ties by key: the keys as they are, not as shown.
    assert_eq!(
        top,
        [
            r#"1  "\"q""#,
            r#"1  "a\u{1b}[2Jb""#,
            "1  ab",
            r#"1  "a\u{200b}b""#,
        ]
    );
}

/// Times that go backwards are counted at the latest time seen (the engine's clock
/// never runs backwards), which changes the decisions: two traces concatenated
/// unsorted put the whole second one at the first one's end, and the summary showed
/// the resulting denials with no word that the input was out of order. Now a note
/// on stderr says how many lines were moved and which was first (exit status 0,
/// stdout unchanged); an input in order prints nothing there. Mutation that fails
/// it: not counting a line whose time is earlier than `latest`.
#[test]
fn times_out_of_order_are_reported_on_stderr() {
    for jsonl in [false, true] {
        let mut args = GCRA_1_PER_S.to_vec();
        if jsonl {
            args.push("--jsonl");
        }
        let output = replay(&args, b"5 a\n6 b\n4.5 a\n# note\n6 c\n3 d\n7 e\n");
        assert!(output.status.success(), "{}", text(&output.stderr));
        assert_eq!(
            text(&output.stderr),
            "floodgate: note: 2 lines had a time earlier than a line before them (the \
             first: line 3); each was counted at the latest time before it, as the \
             limiter's clock never runs backwards: sort the input by time to replay \
             it as recorded\n"
        );
        let sorted = replay(&args, b"5 a\n6 b\n6 c\n7 e\n");
        assert!(sorted.status.success());
        assert_eq!(text(&sorted.stderr), "");
    }
}

/// The reader caps a line at 1 MiB (without its line end): a line one byte over it
/// ending in `\r\n` was refused, the same line ending in `\n` was read. Now both are
/// refused; a line exactly at the cap is read with either ending. Mutation that
/// fails it: checking the length only for a line with no `\n` read.
#[test]
fn a_line_one_byte_over_the_cap_is_refused_with_either_line_end() {
    const CAP: usize = 1 << 20;
    for end in ["\n", "\r\n"] {
        let over = format!("0 {}{end}", "k".repeat(CAP - 1));
        let output = replay(&GCRA_1_PER_S, over.as_bytes());
        assert_eq!(output.status.code(), Some(2), "{end:?}");
        assert!(
            text(&output.stderr).starts_with("floodgate: line 1: line longer than 1048576 bytes"),
            "{end:?}: {}",
            text(&output.stderr)
        );
        let at_cap = format!("0 {}{end}", "k".repeat(CAP - 2));
        let output = replay(&GCRA_1_PER_S, at_cap.as_bytes());
        assert!(output.status.success(), "{end:?}: {}", text(&output.stderr));
    }
}

/// `replay --format nginx --jsonl` over `log` with `extra` arguments: each line's key.
fn nginx_keys(extra: &[&str], log: &str) -> Vec<String> {
    let mut args = GCRA_1_PER_S.to_vec();
    args.extend(["--format", "nginx", "--jsonl"]);
    args.extend(extra);
    let output = replay(&args, log.as_bytes());
    assert!(output.status.success(), "{}", text(&output.stderr));
    text(&output.stdout)
        .lines()
        .map(|l| {
            let line: serde_json::Value = serde_json::from_str(l).expect("one JSON object");
            line["key"].as_str().expect("a key").to_owned()
        })
        .collect()
}

/// An nginx `combined` line from `addr` at 12:00:00 UTC.
fn nginx_line(addr: &str) -> String {
    format!(r#"{addr} - - [01/May/2024:12:00:00 +0000] "GET / HTTP/1.1" 200 1 "-" "-""#) + "\n"
}

/// The replay is meant to predict the HTTP layer, whose client-address extractors
/// group IPv6 clients by /64 (`IpGrouping::default()`) and read an IPv4-mapped
/// address as its IPv4 address; `replay --format nginx` keyed every IPv6 address on
/// its own, so a client rotating through its /64 (which any host with a /64 can) was
/// allowed every request in the replay and denied behind the layer. Now the key is
/// the layer's group, written `2001:db8:1:2::/64`; `--ipv6-prefix` and
/// `--ipv4-prefix` change the prefixes as `IpGrouping` does, and a key that is no IP
/// address is kept as written. Mutation that fails it: not applying the grouping
/// (`replay` leaving `request.key` as parsed).
#[test]
fn nginx_ipv6_clients_are_keyed_by_their_64_as_the_layer_keys_them() {
    let log: String = [
        "2001:db8:1:2::1",
        "2001:db8:1:2:ffff::9",
        "2001:db8:1:3::1",
        "::ffff:192.0.2.7",
        "192.0.2.7",
        "192.0.2.8",
        "unix:",
    ]
    .map(nginx_line)
    .concat();
    assert_eq!(
        nginx_keys(&[], &log),
        [
            "2001:db8:1:2::/64",
            "2001:db8:1:2::/64",
            "2001:db8:1:3::/64",
            "192.0.2.7",
            "192.0.2.7",
            "192.0.2.8",
            "unix:",
        ]
    );
    // One client rotating through its /64: denied after its first request, as the
    // layer would deny it.
    let mut args = GCRA_1_PER_S.to_vec();
    args.extend(["--format", "nginx"]);
    let output = replay(&args, log.as_bytes());
    assert!(output.status.success(), "{}", text(&output.stderr));
    let out = text(&output.stdout);
    assert!(
        out.contains("\nkey             client address: IPv4 each address, IPv6 per /64 (IPv4-mapped IPv6 as IPv4)\n"),
        "{out}"
    );
    assert!(out.contains("\ndistinct keys   5\n"), "{out}");
    assert!(out.contains("\n             1  192.0.2.7\n"), "{out}");
    assert!(
        out.contains("\n             1  2001:db8:1:2::/64\n"),
        "{out}"
    );
    // Other prefixes, as `IpGrouping::v4_prefix` / `v6_prefix` take them.
    assert_eq!(
        nginx_keys(&["--ipv6-prefix", "/128", "--ipv4-prefix", "24"], &log),
        [
            "2001:db8:1:2::1",
            "2001:db8:1:2:ffff::9",
            "2001:db8:1:3::1",
            "192.0.2.0/24",
            "192.0.2.0/24",
            "192.0.2.0/24",
            "unix:",
        ]
    );
    assert_eq!(
        nginx_keys(&["--ipv6-prefix", "48"], &log)[..3],
        ["2001:db8:1::/48", "2001:db8:1::/48", "2001:db8:1::/48"]
    );
}

/// The prefixes are checked as `IpGrouping` checks them, with a clear message and
/// status 2, and only an nginx log takes them (a trace's keys are used as written).
/// Mutation that fails it: `address_keys` ignoring
/// `IpGrouping::v6_prefix`'s error (`.unwrap_or(grouping)`).
#[test]
fn address_prefixes_are_refused_out_of_range_or_without_nginx() {
    let refused = |extra: &[&str], format: &str, want: &str| {
        let mut args = GCRA_1_PER_S.to_vec();
        args.extend(["--format", format]);
        args.extend(extra);
        let output = replay(&args, b"");
        let err = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
        assert!(output.stdout.is_empty(), "{extra:?}");
    };
    refused(
        &["--ipv6-prefix", "129"],
        "nginx",
        "ipv6 prefix /129 is longer than /128",
    );
    refused(
        &["--ipv4-prefix", "33"],
        "nginx",
        "ipv4 prefix /33 is longer than /32",
    );
    refused(
        &["--ipv6-prefix", "300"],
        "nginx",
        "the prefix length 300 is out of range: from 0 to 128, e.g. 64",
    );
    refused(
        &["--ipv4-prefix=-1"],
        "nginx",
        "expected a prefix length, a whole number from 0 to 32, e.g. 24",
    );
    refused(
        &["--ipv6-prefix", "64"],
        "trace",
        "--ipv6-prefix groups client addresses, which only `--format nginx` has",
    );
}

/// `--per 1.5s` was refused with "missing unit at byte 1 of the duration", which
/// does not say that fractions are not accepted, nor what to write. Now the message
/// says so and gives the whole number of the largest unit that holds it exactly;
/// other durations and errors are the parser's. Mutation that fails it:
/// `parse_whole_duration` returning `error.to_string()` alone.
#[test]
fn a_fractional_period_says_fractions_are_not_accepted() {
    let per = |period: &str| {
        let args = ["--algorithm", "gcra", "--limit", "1", "--per", period];
        replay(&args, b"0 a\n")
    };
    for (period, want) in [
        (
            "1.5s",
            "fractional values are not accepted: write 1500ms for 1.5s",
        ),
        (
            "0.5m",
            "fractional values are not accepted: write 30s for 0.5m",
        ),
    ] {
        let output = per(period);
        let err = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{err}");
        assert!(err.contains(want), "{period}: {err}");
    }
    assert!(per("1500ms").status.success());
    let err = text(&per("10").stderr);
    assert!(err.contains("missing unit at byte 2"), "{err}");
}

/// `replay --redis URL --prefix ""` wrote the replay's keys (the bare client keys,
/// with no TTL) among the database's other keys, and `--prefix floodgate:` into
/// floodgate-redis's default namespace, where a live limiter keyed by client address
/// keeps `floodgate:203.0.113.7`: a dry run that overwrote production state. Both are
/// refused before connecting (status 2), saying why and what to give instead; other
/// prefixes are taken. Needs no `redis-server`: nothing listens on port 1. Mutation
/// that fails it: `parse_redis_prefix` taking `""` (its `"" =>` arm removed).
#[cfg(feature = "redis")]
#[test]
fn an_empty_or_live_redis_prefix_is_refused() {
    let run = |prefix: &str| {
        let mut args = GCRA_1_PER_S.to_vec();
        args.extend(["--redis", "redis://127.0.0.1:1/", "--prefix", prefix]);
        replay(&args, b"0 a\n")
    };
    for (prefix, why) in [
        ("", "an empty prefix writes the replay's keys among the database's other keys"),
        (
            "floodgate:",
            "`floodgate:` is floodgate-redis's default prefix, where live limiters keep their state",
        ),
    ] {
        let output = run(prefix);
        let err = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{prefix:?}: {err}");
        assert!(err.contains(why), "{prefix:?}: {err}");
        assert!(
            err.contains("or leave --prefix out for a fresh one"),
            "{prefix:?}: {err}"
        );
        assert!(!err.contains("cannot connect"), "{prefix:?}: {err}");
        assert!(output.stdout.is_empty());
    }
    // A prefix of the replay's own is taken: the run gets as far as connecting.
    let output = run("floodgate:replay:mine:");
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("cannot connect"));
}
