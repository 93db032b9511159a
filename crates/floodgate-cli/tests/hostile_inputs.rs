//! Hostile input lines to `floodgate replay`, through the built binary: a field of
//! a near-megabyte line is quoted in the error message cut, as the line is.

mod common;

use std::process::Output;

/// `floodgate replay --algorithm gcra --limit 10 --per 1s [extra] FILE`, the file
/// holding `input` ([`common::replay_file`]).
fn replay(extra: &[&str], input: &str) -> Output {
    let gcra = ["--algorithm", "gcra", "--limit", "10", "--per", "1s"];
    let args: Vec<&str> = gcra.iter().chain(extra).copied().collect();
    common::replay_file(&args, input.as_bytes())
}

/// A bad field of a long line (each under the 1 MiB line limit) was quoted whole:
/// one error message of 900 KB on stderr, for a time, a key, a cost or an nginx
/// field. The line itself was already cut at 200 characters; the field is now cut
/// the same way (` …` after 200 characters), and the message still names the field
/// and the reason, with exit status 2. Mutation that fails it: quoting the whole
/// field in `LineError::field` again.
#[test]
fn a_long_bad_field_is_quoted_cut_like_the_line() {
    let long = |c: &str| c.repeat(900_000);
    let nginx_time = format!(
        "1.2.3.4 - - [{}] \"GET / HTTP/1.0\" 200 1 \"-\" \"x\"\n",
        long("1")
    );
    let cases: [(&[&str], String, &str); 4] = [
        (&[], format!("{}x a\n", long("1")), "invalid time \"111"),
        (
            &[],
            format!("0 a\u{2028}{}\n", long("b")),
            "invalid key \"a\\u{2028}bbb",
        ),
        (&[], format!("0 a {}\n", long("9")), "invalid cost \"999"),
        (
            &["--format", "nginx"],
            nginx_time,
            "invalid $time_local \"111",
        ),
    ];
    for (extra, input, needle) in cases {
        let output = replay(extra, &input);
        let err = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{needle}: {}",
            &err[..err.len().min(400)]
        );
        assert!(output.stdout.is_empty(), "{needle}");
        assert!(
            err.contains(needle),
            "{needle} not in {}",
            &err[..err.len().min(400)]
        );
        // The field's 200 characters, the line's 200 and the words around them.
        assert!(
            err.len() < 2_000,
            "{needle}: a message of {} bytes",
            err.len()
        );
        assert_eq!(err.matches(" …").count(), 2, "{needle}: both cut: {err}");
    }
}
