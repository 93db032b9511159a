//! Session 41's review of what `floodgate replay` reads: hostile and unusual input,
//! through the built binary. Each test is named after what a user saw before its fix.

use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

/// `floodgate replay <args> FILE`, the file (one per call) holding `input`: a file,
/// not a pipe, as the binary stops reading at a bad line.
fn replay(args: &[&str], input: &[u8]) -> Output {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let name = format!("review-s41-{}.input", CALLS.fetch_add(1, Ordering::Relaxed));
    let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&file, input).expect("the input file is written");
    let mut command = Command::new(env!("CARGO_BIN_EXE_floodgate"));
    command.arg("replay").args(args).arg(&file);
    command.output().expect("the floodgate binary runs")
}

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
