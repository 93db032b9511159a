//! One round trip per decision: after `CONFIG RESETSTAT`, N decisions (checks and
//! peeks, admissions and denials, the denial cache off) show in `INFO commandstats`
//! as exactly N `EVALSHA` calls — plus, for a script the server has not seen, one
//! failed `EVALSHA` (`NOSCRIPT`) and one `SCRIPT LOAD` — and no `EVAL`. Commandstats
//! also counts the commands a script calls inside (`TIME`, `GET`, `SET`, …), so
//! `MONITOR` (through `redis-cli`), which tells a script's commands (`[0 lua]`) from a
//! client's, shows that the limiter's connection sent nothing but those — and that a
//! sliding-log decision reads a few members of the log, not the whole window.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Lines};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use common::{command_stats, runtime, tools_on_path, RedisServer};
use floodgate::Policy;
use floodgate_redis::{Algorithm, OnFailure, RedisLimiter};

/// Decisions per phase.
const N: u64 = 25;

/// The commands `EVALSHA`, `SCRIPT` and `EVAL` of `stats`: the client-side script
/// commands (the rest run inside scripts or come from the test's own connections).
fn script_commands(stats: &BTreeMap<String, (u64, u64)>) -> BTreeMap<String, (u64, u64)> {
    stats
        .iter()
        .filter(|(name, _)| {
            name.as_str() == "evalsha" || name.as_str() == "eval" || name.starts_with("script|")
        })
        .map(|(name, &counts)| (name.clone(), counts))
        .collect()
}

/// `redis-cli monitor` on the server: every command, with who sent it.
struct Monitor {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

/// A sentinel the test echoes to know it has seen every earlier command.
const SENTINEL: &str = "floodgate-round-trips-sentinel";

impl Monitor {
    fn start(server: &RedisServer) -> Monitor {
        let mut child = Command::new("redis-cli")
            .args(["-u", &server.url(), "monitor"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-cli monitor");
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut lines = BufReader::new(stdout).lines();
        let first = lines.next().expect("a first line").expect("UTF-8");
        assert_eq!(first, "OK", "redis-cli monitor did not start");
        Monitor { child, lines }
    }

    /// The commands sent by clients (not by scripts) since the last call, by client
    /// address, in order, up to the sentinel (which is left out).
    fn client_commands(&mut self, server: &RedisServer) -> BTreeMap<String, Vec<String>> {
        let mut by_client: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (client, command) in self.commands(server) {
            if client != "lua" {
                let name = command.into_iter().next().unwrap_or_default();
                by_client
                    .entry(client)
                    .or_default()
                    .push(name.to_lowercase());
            }
        }
        by_client
    }

    /// The commands that scripts ran since the last call, each with its arguments.
    fn script_commands(&mut self, server: &RedisServer) -> Vec<Vec<String>> {
        let commands = self.commands(server).into_iter();
        commands
            .filter(|(client, _)| client == "lua")
            .map(|(_, command)| command)
            .collect()
    }

    /// Every command since the last call, with who sent it (a client address or
    /// `lua`), up to the sentinel (which is left out).
    fn commands(&mut self, server: &RedisServer) -> Vec<(String, Vec<String>)> {
        let _: String = server.cmd(&["ECHO", SENTINEL]);
        let mut commands = Vec::new();
        for line in &mut self.lines {
            let line = line.expect("UTF-8");
            if line.contains(SENTINEL) {
                return commands;
            }
            // `<time> [<db> <client address | lua>] "<command>" "<arg>" …` (the
            // test's arguments hold no quotes)
            let Some((source, rest)) = line.split_once("] \"") else {
                continue;
            };
            let client = source.rsplit(' ').next().unwrap_or_default().to_owned();
            let words = rest.split('"').step_by(2).map(str::to_owned).collect();
            commands.push((client, words));
        }
        panic!("redis-cli monitor ended before the sentinel");
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The commands of the one client that sent `EVALSHA` (the limiter's connection);
/// every other client sent only the test's inspection commands.
fn limiter_commands(by_client: BTreeMap<String, Vec<String>>) -> Vec<String> {
    let mut limiter = None;
    for (client, commands) in by_client {
        if commands.iter().any(|c| c == "evalsha") {
            assert!(limiter.is_none(), "two clients ran EVALSHA");
            limiter = Some(commands);
        } else {
            for c in &commands {
                assert!(
                    ["config", "echo", "info", "client", "ping"].contains(&c.as_str()),
                    "{client} sent {c}"
                );
            }
        }
    }
    limiter.expect("the limiter's commands")
}

fn decide_n(rt: &tokio::runtime::Runtime, limiter: &RedisLimiter) {
    rt.block_on(async {
        for i in 0..N {
            let key = format!("k{}", i % 3);
            let verdict = if i % 4 == 3 {
                limiter.peek_n(&key, 1).await
            } else {
                limiter.check_n(&key, 1).await
            };
            let verdict = verdict.expect("decided");
            assert!(
                !verdict.is_fallback() && !verdict.is_cached(),
                "{verdict:?}"
            );
        }
    });
}

#[test]
fn each_decision_is_one_evalsha_and_nothing_else() {
    if !tools_on_path(&["redis-cli"]) {
        return;
    }
    let Some(server) = RedisServer::start() else {
        return;
    };
    let mut monitor = Monitor::start(&server);
    let rt = runtime();
    let url = server.url();
    let minute = Duration::from_secs(60);
    let builders = [
        RedisLimiter::builder(Algorithm::Gcra, Policy::new(5, minute).expect("policy")),
        RedisLimiter::builder(
            Algorithm::SlidingLog,
            Policy::new(4, minute).expect("policy"),
        )
        .and(
            Algorithm::FixedWindow,
            Policy::new(6, minute).expect("policy"),
        ),
    ];
    for builder in builders {
        let limiter = rt.block_on(async {
            let conn = floodgate_redis::connect(&url).await.expect("connect");
            builder
                .prefix("trips:")
                .timeout(Duration::from_secs(5))
                .on_failure(OnFailure::Error)
                .deny_cache(0)
                .build(conn)
                .expect("valid limiter")
        });
        // A script the server has not seen: the first call fails NOSCRIPT, the
        // client loads the script and runs it again.
        let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
        monitor.client_commands(&server);
        decide_n(&rt, &limiter);
        let first = BTreeMap::from([
            ("evalsha".to_owned(), (N + 1, 1)),
            ("script|load".to_owned(), (1, 0)),
        ]);
        assert_eq!(script_commands(&command_stats(&server)), first);
        let mut sent = vec!["evalsha", "script"];
        sent.extend(["evalsha"; N as usize]);
        assert_eq!(limiter_commands(monitor.client_commands(&server)), sent);
        // Loaded: N decisions, N EVALSHA, nothing else.
        let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
        monitor.client_commands(&server);
        decide_n(&rt, &limiter);
        let then = BTreeMap::from([("evalsha".to_owned(), (N, 0))]);
        assert_eq!(script_commands(&command_stats(&server)), then);
        let sent = vec!["evalsha"; N as usize];
        assert_eq!(limiter_commands(monitor.client_commands(&server)), sent);
    }
}

/// A sliding-log decision reads a few members of the log, never the whole window:
/// with 2 000 live members, every range a script reads names at most one member
/// (a rank, or a score range with `LIMIT 0 1`), and there are O(log n) of them.
/// (Reading the whole window blocked the server for every client in proportion to
/// its traffic: 95 ms per decision at 10^5 members.)
#[test]
fn a_sliding_log_decision_reads_a_few_members_not_the_window() {
    if !tools_on_path(&["redis-cli"]) {
        return;
    }
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let limit = 2_000;
    let policy = Policy::new(limit, Duration::from_secs(3_600)).expect("policy");
    let limiter = rt.block_on(async {
        let conn = floodgate_redis::connect(&server.url())
            .await
            .expect("connect");
        RedisLimiter::builder(Algorithm::SlidingLog, policy)
            .prefix("trips:")
            .timeout(Duration::from_secs(5))
            .on_failure(OnFailure::Error)
            .build(conn)
            .expect("valid limiter")
    });
    rt.block_on(async {
        for _ in 0..limit {
            let d = limiter.check_n("log", 1).await.expect("decided").decision();
            assert!(d.is_allowed());
        }
    });
    assert_eq!(
        server.cmd::<u64>(&["ZCARD", "trips:log"]),
        limit,
        "one member a call"
    );
    let mut monitor = Monitor::start(&server);
    monitor.client_commands(&server);
    for cost in [1, 0, 3_000] {
        let verdict = rt.block_on(limiter.check_n("log", cost)).expect("decided");
        let reads: Vec<Vec<String>> = monitor
            .script_commands(&server)
            .into_iter()
            .filter(|c| c[0].to_lowercase().starts_with("zrange"))
            .collect();
        assert!(
            !reads.is_empty() && reads.len() <= 16,
            "cost {cost}: {reads:?}"
        );
        for read in &reads {
            let one_rank = read[0].eq_ignore_ascii_case("zrange") && read[2] == read[3];
            let limited = read.windows(3).any(|w| w[0] == "LIMIT" && w[2] == "1");
            assert!(
                one_rank || limited,
                "cost {cost} ({verdict:?}) read {read:?}"
            );
        }
    }
}

/// The commands a script ran of `stats`: all but those a client sends (the
/// script commands, the test's own `CONFIG`, `INFO`, `PING`, `CLIENT`, `HELLO`).
fn run_by_scripts(stats: &BTreeMap<String, (u64, u64)>) -> BTreeMap<String, u64> {
    let client = ["evalsha", "eval", "info", "ping", "hello"];
    stats
        .iter()
        .filter(|(name, _)| {
            !client.contains(&name.as_str())
                && !name.starts_with("script|")
                && !name.starts_with("config|")
                && !name.starts_with("client|")
        })
        .map(|(name, &(calls, _))| (name.clone(), calls))
        .collect()
}

/// A multi-limit refund reads each key once: it checks every key before it writes
/// one (all or nothing) and then writes from what it read. After `CONFIG
/// RESETSTAT`, a refund that gives back, and its receipt sent again (which gives
/// nothing), show in `INFO commandstats` one `GET` per GCRA or window key and,
/// for the sliding log, one read of its refund members (`ZRANGE` of rank 0, then
/// `ZRANGEBYSCORE` of the `-inf` members) and, where the receipt may still give
/// back, one of its newest member (`ZRANGE`) and of the members from the
/// charge's instant on (`ZRANGEBYSCORE`; since session 46 from the earliest
/// remembered record's instant, here the first refund's, in the same one
/// command). Two and four limits; the counts are
/// printed (`--nocapture`), BENCHMARKS.md's Redis section quotes them.
#[test]
fn a_multi_limit_refund_reads_each_key_once() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let p = Policy::new(10, Duration::from_secs(10)).expect("policy");
    let two = RedisLimiter::builder(Algorithm::Gcra, p).and(Algorithm::SlidingLog, p);
    let four = RedisLimiter::builder(Algorithm::Gcra, p)
        .and(Algorithm::FixedWindow, p)
        .and(Algorithm::SlidingWindow, p)
        .and(Algorithm::SlidingLog, p);
    // The builder, its GCRA and window keys.
    for (builder, strings) in [(two, 1), (four, 3)] {
        let limiter = common::with_refunds(&rt, &server, builder, true);
        let key = format!("reads{strings}");
        // At the start of a 10 s window: every charge in it.
        let t = 100_000_000_u64;
        let reads = |get, zrange, zrangebyscore| {
            BTreeMap::from([
                ("get".to_owned(), get),
                ("zrange".to_owned(), zrange),
                ("zrangebyscore".to_owned(), zrangebyscore),
            ])
        };
        rt.block_on(async {
            let mut receipts = Vec::new();
            for at in t..t + 4 {
                let (d, r) = limiter.charge_n_at_micros(&key, 1, at).await.unwrap();
                assert!(d.is_allowed());
                receipts.push(r.expect("a receipt"));
            }
            // The script loaded (its first run is refused NOSCRIPT), the log's
            // oldest member given back.
            assert!(limiter.refund_at_micros(&receipts[0], t + 3).await.unwrap());
            // The second charge: three log members from its instant on.
            for (gives, want) in [(true, reads(strings, 2, 2)), (false, reads(strings, 1, 1))] {
                let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
                let back = limiter.refund_at_micros(&receipts[1], t + 3).await.unwrap();
                assert_eq!(back, gives);
                let ran = run_by_scripts(&command_stats(&server));
                eprintln!(
                    "{} limits, a refund that gives {}: {} commands {ran:?}",
                    strings + 1,
                    if gives { "back" } else { "nothing" },
                    ran.values().sum::<u64>()
                );
                let read: BTreeMap<String, u64> = ran
                    .into_iter()
                    .filter(|(name, _)| want.contains_key(name))
                    .collect();
                assert_eq!(read, want, "{} limits, gives back: {gives}", strings + 1);
            }
        });
    }
}

/// A multi-limit refund names each key once (`prefix{key}:i`): its refunds write
/// from reads made before any write, which a write to the same key earlier in the
/// run would make stale. The limiter's own refund, sent again by hand (`EVALSHA`
/// as `MONITOR` saw it) with its first key and that limit's arguments twice, is
/// refused with an error naming the key, and writes nothing.
#[test]
fn a_multi_limit_refund_refuses_a_key_named_twice() {
    if !tools_on_path(&["redis-cli"]) {
        return;
    }
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let p = Policy::new(10, Duration::from_secs(10)).expect("policy");
    let builder = RedisLimiter::builder(Algorithm::FixedWindow, p).and(Algorithm::Gcra, p);
    let limiter = common::with_refunds(&rt, &server, builder, true);
    let t = 100_000_000_u64;
    let mut monitor = Monitor::start(&server);
    let sent = rt.block_on(async {
        let (_, r) = limiter.charge_n_at_micros("twice", 1, t).await.unwrap();
        let r = r.expect("a receipt");
        monitor.commands(&server);
        assert!(limiter.refund_at_micros(&r, t).await.unwrap());
        monitor.commands(&server)
    });
    // EVALSHA sha 2 key0 key1 now, then 7 arguments per key.
    let refund = sent
        .into_iter()
        .map(|(_, words)| words)
        .rfind(|w| w[0].eq_ignore_ascii_case("evalsha"))
        .expect("the refund's EVALSHA");
    assert_eq!(refund.len(), 6 + 2 * 7, "{refund:?}");
    let key = refund[3].clone();
    let mut twice = vec![refund[1].clone(), "2".to_owned(), key.clone(), key.clone()];
    twice.push(refund[5].clone());
    twice.extend_from_slice(&refund[6..13]);
    twice.extend_from_slice(&refund[6..13]);
    let before: String = server.cmd(&["GET", &key]);
    let mut conn = server.connection().expect("connect");
    let reply: redis::RedisResult<redis::Value> =
        redis::cmd("EVALSHA").arg(&twice).query(&mut conn);
    let e = reply.expect_err("a key named twice").to_string();
    assert!(e.contains("twice") && e.contains(&key), "{e}");
    assert_eq!(server.cmd::<String>(&["GET", &key]), before);
}

/// Log members as (instant, units, running total).
type LogRows = Vec<(u64, u64, u64)>;

/// The `ZREM` and `ZADD` calls (with every command, printed) of one refund of
/// the first of `k` one-unit charges at `k` successive instants of a sliding log
/// with refunds (the key's first refund), and the log left.
fn log_refund_writes(
    server: &RedisServer,
    rt: &tokio::runtime::Runtime,
    k: u64,
) -> (BTreeMap<String, u64>, LogRows) {
    let p = Policy::new(k, Duration::from_secs(10)).expect("policy");
    let limiter = common::sliding_log(rt, server, p);
    let key = format!("writes{k}");
    let t = 100_000_000_u64;
    rt.block_on(async {
        let mut first = None;
        for at in t..t + k {
            let (d, r) = limiter.charge_n_at_micros(&key, 1, at).await.unwrap();
            assert!(d.is_allowed(), "charge at {at}");
            first = first.or(r);
        }
        let first = first.expect("a receipt");
        // The script loaded by a refund that gives nothing (another key).
        let (_, other) = limiter.charge_n_at_micros("other", 1, t).await.unwrap();
        let other = other.expect("a receipt");
        assert!(limiter.refund_at_micros(&other, t + 1).await.unwrap());
        let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
        assert!(limiter.refund_at_micros(&first, t + k).await.unwrap());
    });
    let ran = run_by_scripts(&command_stats(server));
    eprintln!(
        "a log refund with {k} members from its instant on: {} commands {ran:?}",
        ran.values().sum::<u64>()
    );
    let writes = ran
        .into_iter()
        .filter(|(name, _)| name == "zadd" || name == "zrem")
        .collect();
    (writes, common::log_members(server, &format!("test:{key}")))
}

/// A sliding-log refund rewrites the members from the charge's instant on in two
/// commands, one `ZREM` of them all and one `ZADD` of those left (the member at
/// the instant, emptied, is not put back), whatever their number; beside them the
/// refund members' own writes on a key's first refund (the new ledger head, the
/// latest instant logged and the receipt's record added, the old head removed).
/// Before session 44 (redis2) a `ZREM` and a `ZADD` per member: 1 + k and 2 + k.
/// The log left is the one the other charges alone would have made. The counts
/// are printed (`--nocapture`); BENCHMARKS.md's Redis section quotes them.
#[test]
fn a_sliding_log_refund_writes_its_members_in_two_commands() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let t = 100_000_000_u64;
    for k in [1, 5, 50] {
        let (writes, left) = log_refund_writes(&server, &rt, k);
        let zadd = 3 + u64::from(k > 1);
        let want = BTreeMap::from([("zadd".to_owned(), zadd), ("zrem".to_owned(), 2)]);
        assert_eq!(writes, want, "{k} members from the instant on");
        let rest: LogRows = (1..k).map(|i| (t + i, 1, i)).collect();
        assert_eq!(left, rest, "{k} members from the instant on");
    }
}

/// More members than one command may take from a script (Lua's `unpack` gives
/// about 8 000 values, a `ZADD` takes two a member): the refund splits its `ZREM`
/// and its `ZADD` per 2 000 members — 4 501 members from the instant on, three of
/// each — and every member is rewritten once, exactly.
#[test]
fn a_sliding_log_refund_of_more_members_than_a_command_takes_splits_them() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let t = 100_000_000_u64;
    let k = 4_501;
    let (writes, left) = log_refund_writes(&server, &rt, k);
    // The refund members' three ZADD and one ZREM, then 4 501 names removed and
    // 4 500 members put back, by 2 000.
    let want = BTreeMap::from([("zadd".to_owned(), 3 + 3), ("zrem".to_owned(), 1 + 3)]);
    assert_eq!(writes, want);
    let rest: LogRows = (1..k).map(|i| (t + i, 1, i)).collect();
    assert_eq!(left, rest);
}
