//! End-to-end tests of `floodgate replay --redis`: the built binary against a
//! `redis-server` the test starts on a free loopback port. The same trace through
//! Redis and in process prints byte-identical `--jsonl`, at small times and shifted
//! to an origin near today's epoch — but for the sliding window counter's
//! `retry_after`, which Redis reports rounded up to a whole microsecond.
//!
//! Without `redis-server` on `PATH` a test prints a loud message and returns early,
//! unless `FLOODGATE_REQUIRE_REDIS=1`, when it fails.

#![cfg(feature = "redis")]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` of the test's own, stopped on drop.
struct RedisServer {
    port: u16,
    child: Child,
}

impl RedisServer {
    fn start() -> Option<RedisServer> {
        let found = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            let required = std::env::var("FLOODGATE_REQUIRE_REDIS").is_ok_and(|v| v == "1");
            assert!(
                !required,
                "FLOODGATE_REQUIRE_REDIS=1 but redis-server is not on PATH \
                 (apt-get install -y redis-server)"
            );
            let _ = writeln!(
                std::io::stderr(),
                "\n!!! SKIPPED: redis-server is not on PATH; this replay --redis test did \
                 not run. Install it (apt-get install -y redis-server) or set \
                 FLOODGATE_REQUIRE_REDIS=1 to make its absence a failure. !!!\n"
            );
            return None;
        }
        // A port can be taken between finding it free and the server binding it.
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("a free loopback port");
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string()])
                .args(["--bind", "127.0.0.1"])
                .args(["--save", ""])
                .args(["--appendonly", "no"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server");
            let mut server = RedisServer { port, child };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = server.child.try_wait() {
                    break; // exited: the port was taken
                }
                // Another server may answer on the port (ours, unable to bind it,
                // exits): only our own process counts.
                if server.process_id() == Some(server.child.id()) {
                    return Some(server);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // Dropping it stops ours if it is still starting.
        }
        panic!("redis-server did not start on a free loopback port");
    }

    /// The process id of the server answering on the port (`INFO server`, inline
    /// protocol, no client library), or `None` while none answers.
    fn process_id(&self) -> Option<u32> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        s.write_all(b"INFO server\r\n").ok()?;
        // A bulk reply: `$<len>\r\n<len bytes>\r\n`.
        let mut reply = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&reply);
            if let Some((head, body)) = text.split_once("\r\n") {
                let len: usize = head.strip_prefix('$')?.parse().ok()?;
                if body.len() >= len {
                    return body
                        .get(..len)?
                        .lines()
                        .find_map(|l| l.trim().strip_prefix("process_id:"))?
                        .parse()
                        .ok();
                }
            }
            let n = s.read(&mut chunk).ok()?;
            if n == 0 {
                return None;
            }
            reply.extend_from_slice(&chunk[..n]);
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `floodgate replay <args>` on `stdin`.
fn replay(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .arg("replay")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the floodgate binary starts");
    let mut pipe = child.stdin.take().expect("stdin is piped");
    // The binary may stop reading early (a bad line): ignore a broken pipe here.
    let _ = pipe.write_all(stdin.as_bytes());
    drop(pipe);
    child.wait_with_output().expect("the floodgate binary ends")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whole-microsecond instants (µs from the origin), keys and costs: bursts, a
/// refill, cost 0, a cost that never fits, a window edge, a time out of order.
const TRACE: &[(u64, &str, u32)] = &[
    (0, "a", 1),
    (0, "a", 2),
    (100_000, "b", 1),
    (250_000, "a", 1),
    (250_000, "a", 0),
    (333_333, "a", 1),
    (500_000, "b", 3),
    (700_001, "a", 9),
    (999_999, "a", 1),
    (1_000_000, "a", 1),
    (1_000_000, "c", 1),
    (1_250_000, "a", 2),
    (900_000, "b", 1),
    (1_999_999, "b", 2),
    (2_100_000, "b", 1),
    (2_100_000, "a", 4),
    (2_750_000, "c", 4),
    (3_000_000, "c", 1),
];

/// [`TRACE`] as trace lines, its instants after `origin_secs`.
fn trace(origin_secs: u64) -> String {
    TRACE
        .iter()
        .map(|&(us, key, cost)| {
            format!(
                "{}.{:06} {key} {cost}\n",
                origin_secs + us / 1_000_000,
                us % 1_000_000
            )
        })
        .collect()
}

/// The policies compared: every algorithm name, periods and intervals in whole
/// microseconds.
const POLICIES: &[&str] = &[
    "--algorithm gcra --limit 4 --per 1s",
    "--algorithm token-bucket --limit 4 --per 1s --burst 6",
    "--algorithm leaky-bucket --limit 5 --per 2s --burst 2",
    "--algorithm fixed-window --limit 4 --per 1s",
    "--algorithm sliding-window --limit 4 --per 1s",
    "--algorithm sliding-log --limit 4 --per 1s",
    "--algorithm sliding-log --limit 3 --per 500ms",
];

/// A `--jsonl` line (and its newline) with `retry_after` rounded up to a whole
/// microsecond: what the scripts report for the sliding window counter, whose wait in
/// nanoseconds can fall 1 ns past a bound (floodgate-redis's crate docs). Every
/// other field, and every other algorithm's line, is byte-identical.
fn retry_after_in_whole_micros(line: &str) -> String {
    const FIELD: &str = "\"retry_after\": ";
    let at = line.find(FIELD).expect("a retry_after field") + FIELD.len();
    let (head, value) = line.split_at(at);
    let Some(seconds) = value.strip_suffix('}') else {
        panic!("retry_after is not the last field: {line}");
    };
    if seconds == "null" {
        return format!("{line}\n");
    }
    let (whole, fraction) = seconds.split_once('.').expect("decimal seconds");
    let nanos: u64 = whole.parse::<u64>().expect("seconds") * 1_000_000_000
        + fraction.parse::<u64>().expect("nanoseconds");
    let nanos = nanos.div_ceil(1_000) * 1_000;
    format!(
        "{head}{}.{:09}}}\n",
        nanos / 1_000_000_000,
        nanos % 1_000_000_000
    )
}

#[test]
fn redis_and_in_process_print_the_same_jsonl() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    // 0 s, and ≈ 1.8·10^9 s: 2027-01-15 08:00 UTC, where nanoseconds since the epoch
    // no longer fit a double but the scripts' microseconds do.
    for origin in [0, 1_800_000_000] {
        let input = trace(origin);
        for policy in POLICIES {
            let args: Vec<&str> = policy.split_whitespace().chain(["--jsonl"]).collect();
            let local = replay(&args, &input);
            assert!(local.status.success(), "{}", text(&local.stderr));
            let with_redis: Vec<&str> = args.iter().copied().chain(["--redis", &url]).collect();
            let remote = replay(&with_redis, &input);
            assert!(remote.status.success(), "{}", text(&remote.stderr));
            assert_eq!(
                text(&local.stdout).lines().count(),
                TRACE.len(),
                "{policy} at {origin} s"
            );
            let mut want = text(&local.stdout);
            if policy.contains("sliding-window") {
                want = want.lines().map(retry_after_in_whole_micros).collect();
            }
            assert_eq!(
                text(&remote.stdout),
                want,
                "{policy} at {origin} s: Redis (left) and in process (right) differ"
            );
        }
    }
}

#[test]
fn a_time_finer_than_a_microsecond_exits_2_naming_its_line() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    let args = [
        "--algorithm",
        "gcra",
        "--limit",
        "4",
        "--per",
        "1s",
        "--jsonl",
        "--redis",
        &url,
    ];
    let output = replay(&args, "0.000001 a\n0.0000015 b\n1 c\n");
    let err = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(
        err.contains("line 2: time 0.000001500 s is not a whole number of microseconds"),
        "{err}"
    );
    assert_eq!(text(&output.stdout).lines().count(), 1, "{err}");
    // In process the same trace is fine.
    let output = replay(&args[..7], "0.000001 a\n0.0000015 b\n1 c\n");
    assert!(output.status.success(), "{}", text(&output.stderr));
}

#[test]
fn each_run_takes_a_fresh_prefix_unless_one_is_given() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    let input = "0 k\n0 k\n";
    let args = [
        "--algorithm",
        "fixed-window",
        "--limit",
        "2",
        "--per",
        "1s",
        "--jsonl",
        "--redis",
        &url,
    ];
    let allowed = |output: &Output| -> Vec<bool> {
        assert!(output.status.success(), "{}", text(&output.stderr));
        text(&output.stdout)
            .lines()
            .map(|l| l.contains("\"allowed\": true"))
            .collect()
    };
    // Fresh prefixes: the second run starts from nothing, as the first did.
    assert_eq!(allowed(&replay(&args, input)), [true, true]);
    assert_eq!(allowed(&replay(&args, input)), [true, true]);
    // One prefix: the second run continues the first's keys.
    let shared: Vec<&str> = args.iter().copied().chain(["--prefix", "t:"]).collect();
    assert_eq!(allowed(&replay(&shared, input)), [true, true]);
    assert_eq!(allowed(&replay(&shared, input)), [false, false]);
    // --prefix means nothing without --redis.
    let output = replay(
        &[
            "--algorithm",
            "gcra",
            "--limit",
            "1",
            "--per",
            "1s",
            "--prefix",
            "t:",
        ],
        "",
    );
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
}

#[test]
fn a_url_that_does_not_parse_is_a_usage_error_and_no_server_a_runtime_one() {
    let through = |url: &str| {
        let policy = "--algorithm gcra --limit 5 --per 1s --redis";
        let mut args: Vec<&str> = policy.split(' ').collect();
        args.push(url);
        let out = replay(&args, "0 a 1\n");
        assert!(out.stdout.is_empty(), "{url}: nothing decided");
        (out.status.code(), text(&out.stderr))
    };
    for url in ["not a url", "http://127.0.0.1:6379/", "redis://"] {
        let (status, stderr) = through(url);
        assert_eq!(status, Some(2), "{url}: {stderr}");
        assert!(stderr.contains("--redis"), "{url}: {stderr}");
    }
    // Port 1 on loopback: nothing listens there (a refused connection, at once).
    let (status, stderr) = through("redis://127.0.0.1:1/");
    assert_eq!(status, Some(1), "{stderr}");
    assert!(stderr.contains("cannot connect"), "{stderr}");
}

/// The README and `--prefix`'s help: "With `--redis`, the run names its key prefix
/// on stderr; the replay's keys keep no TTL (the replayed clock is not the
/// server's)". For each algorithm, the prefix the run names on stderr is the one
/// its keys are under (and only they: a second run names another), and every key
/// has no TTL. Mutation that fails it: floodgate-redis's given-time prologue with
/// `local EXPIRE = true` (the production scripts' TTL on the replay's keys).
#[test]
fn the_run_names_its_prefix_and_its_keys_keep_no_ttl() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    let mut con = redis::Client::open(url.as_str())
        .and_then(|c| c.get_connection())
        .expect("a connection to the test's redis-server");
    let mut named = Vec::new();
    for algorithm in ["gcra", "fixed-window", "sliding-window", "sliding-log"] {
        let args = [
            "--algorithm",
            algorithm,
            "--limit",
            "2",
            "--per",
            "1s",
            "--redis",
            &url,
        ];
        let output = replay(&args, "0 a\n0.5 b\n0.5 b\n");
        let err = text(&output.stderr);
        assert!(output.status.success(), "{algorithm}: {err}");
        // `… under the key prefix "floodgate:replay:…:"; the keys keep no TTL …`
        let start = err.find("key prefix \"").expect("the prefix named") + "key prefix \"".len();
        let prefix = &err[start..start + err[start..].find('"').expect("quoted")];
        assert!(
            prefix.starts_with("floodgate:replay:"),
            "{algorithm}: {err}"
        );
        assert!(err.contains("keep no TTL"), "{algorithm}: {err}");
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query(&mut con)
            .expect("KEYS");
        assert!(
            keys.iter().any(|k| k.starts_with(&format!("{prefix}a")))
                && keys.iter().any(|k| k.starts_with(&format!("{prefix}b"))),
            "{algorithm}: {keys:?}"
        );
        for key in &keys {
            let ttl: i64 = redis::cmd("PTTL").arg(key).query(&mut con).expect("PTTL");
            assert_eq!(ttl, -1, "{algorithm}: {key} has a TTL");
        }
        named.push(prefix.to_owned());
    }
    named.sort();
    named.dedup();
    assert_eq!(named.len(), 4, "a fresh prefix per run: {named:?}");
}
