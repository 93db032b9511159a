//! No lost updates: one script run per decision is atomic on the server, so many
//! concurrent callers on one key admit exactly the burst — and a naive GET-then-SET
//! client, under an explicit interleaving, admits more.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::{build, flood, limiter, runtime, RedisServer};
use floodgate::Policy;
use floodgate_redis::{Algorithm, OnFailure, RedisLimiter, RedisLimiterBuilder, Verdict};

/// GCRA, one unit a day after a burst of `burst`: nothing refills during the test.
fn daily(burst: u64) -> Policy {
    Policy::per_day(1)
        .and_then(|p| p.with_burst(burst))
        .unwrap()
}

#[test]
fn concurrent_tasks_on_one_key_admit_exactly_the_burst() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    const BURST: u64 = 100;
    let slow = Duration::from_secs(10);
    let limiter = limiter(
        &rt,
        &server,
        Algorithm::Gcra,
        daily(BURST),
        OnFailure::Error,
        slow,
    );
    let admitted = flood(&rt, vec![limiter], "hammer", (64, 5), |_, _| 1, |_| false);
    assert_eq!(
        admitted, BURST,
        "320 calls on one key admit exactly the burst"
    );
}

/// The child half of `two_processes_on_one_key_admit_exactly_the_burst`: hammers
/// the key named in the environment and prints how many were admitted.
#[test]
#[ignore = "a helper process, run by two_processes_on_one_key_admit_exactly_the_burst"]
fn hammer_child() {
    let url = std::env::var("FLOODGATE_HAMMER_URL").expect("run by the parent test");
    let rt = runtime();
    let admitted: u64 = rt.block_on(async {
        let conn = floodgate_redis::connect(&url).await.unwrap();
        let limiter = Arc::new(
            floodgate_redis::RedisLimiter::builder(Algorithm::Gcra, daily(60))
                .prefix("test:")
                .timeout(Duration::from_secs(10))
                .on_failure(OnFailure::Error)
                .build(conn)
                .unwrap(),
        );
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let limiter = Arc::clone(&limiter);
                tokio::spawn(async move {
                    let mut admitted = 0;
                    for _ in 0..5 {
                        let d = limiter.check_n("two-processes", 1).await.unwrap();
                        assert!(!d.is_fallback());
                        admitted += u64::from(d.decision().is_allowed());
                    }
                    admitted
                })
            })
            .collect();
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        total
    });
    println!("ADMITTED={admitted}");
}

#[test]
fn two_processes_on_one_key_admit_exactly_the_burst() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..2)
        .map(|_| {
            Command::new(&exe)
                .args(["--exact", "hammer_child", "--ignored", "--nocapture"])
                .env("FLOODGATE_HAMMER_URL", server.url())
                .output_spawn()
        })
        .collect();
    let mut total = 0;
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "child failed: {stdout}");
        let admitted: u64 = stdout
            .lines()
            .find_map(|l| l.strip_prefix("ADMITTED="))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no count from the child: {stdout}"));
        total += admitted;
    }
    // 2 processes × 80 calls for a burst of 60.
    assert_eq!(total, 60);
}

trait OutputSpawn {
    fn output_spawn(&mut self) -> std::process::Child;
}

impl OutputSpawn for Command {
    fn output_spawn(&mut self) -> std::process::Child {
        self.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap()
    }
}

/// The naive client the scripts replace: read the tokens left, decide, write back.
struct GetThenSet<'a> {
    server: &'a RedisServer,
    key: &'a str,
}

impl GetThenSet<'_> {
    fn read(&self) -> i64 {
        self.server.cmd(&["GET", self.key])
    }

    fn write(&self, left: i64) {
        let _: () = self.server.cmd(&["SET", self.key, &left.to_string()]);
    }
}

#[test]
fn get_then_set_over_admits_when_both_read_before_either_writes() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    // One token left, two replicas.
    let _: () = server.cmd(&["SET", "naive", "1"]);
    let (a, b) = (
        GetThenSet {
            server: &server,
            key: "naive",
        },
        GetThenSet {
            server: &server,
            key: "naive",
        },
    );
    // Both read, then both write.
    let (seen_a, seen_b) = (a.read(), b.read());
    let admitted = u64::from(seen_a > 0) + u64::from(seen_b > 0);
    a.write(seen_a - 1);
    b.write(seen_b - 1);
    assert_eq!(admitted, 2, "one token, two admissions: an update was lost");
    assert_eq!(server.cmd::<i64>(&["GET", "naive"]), 0);

    // The script under the same race: one token, two concurrent callers, one admitted.
    let rt = runtime();
    let limiter = Arc::new(limiter(
        &rt,
        &server,
        Algorithm::Gcra,
        daily(1),
        OnFailure::Error,
        Duration::from_secs(10),
    ));
    let call = || {
        let limiter = Arc::clone(&limiter);
        rt.spawn(async move { limiter.check_n("scripted", 1).await })
    };
    let (x, y) = (call(), call());
    let (x, y) = rt.block_on(async { (x.await.unwrap(), y.await.unwrap()) });
    let admitted = [x.unwrap(), y.unwrap()]
        .iter()
        .filter(|v| !v.is_fallback() && v.decision().is_allowed())
        .count();
    assert_eq!(admitted, 1);
}

/// Windows of 2^47 µs (about 4.5 years): no window edge passes during the test, so
/// nothing refills and the admitted count is exact.
fn long_windows(limit: u64) -> Policy {
    Policy::new(limit, Duration::from_micros(1 << 47)).unwrap()
}

/// Costs 1 and 2 in turn.
fn one_or_two(task: u32, call: u32) -> u32 {
    1 + (task + call) % 2
}

/// Every algorithm, 4 connections × 16 tasks on one key with costs 1 and 2: the
/// units admitted are exactly the limit (each call's units fit or are refused
/// whole, and the flood asks for far more), never one more.
#[test]
fn every_algorithm_admits_exactly_its_limit_under_concurrent_connections() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    const LIMIT: u64 = 41;
    for algorithm in common::ALGORITHMS {
        let policy = match algorithm {
            Algorithm::Gcra => daily(LIMIT),
            _ => long_windows(LIMIT),
        };
        let limiters = (0..4)
            .map(|_| {
                let slow = Duration::from_secs(10);
                limiter(&rt, &server, algorithm, policy, OnFailure::Error, slow)
            })
            .collect();
        let admitted = flood(
            &rt,
            limiters,
            "every-algorithm",
            (16, 6),
            one_or_two,
            |_| false,
        );
        // Odd limit, costs 1 and 2: the last unit is taken by a cost-1 call.
        assert_eq!(admitted, LIMIT, "{algorithm:?}");
        let _: () = server.cmd(&["FLUSHALL"]);
    }
}

/// Three limits on one key under the same flood: a call is charged on all of them
/// or on none, so each limit has spent exactly the units admitted — the tightest
/// limit's 25 (odd, taken whole by a cost-1 call) — and the others keep the rest.
#[test]
fn several_limits_charge_all_or_nothing_under_concurrent_connections() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let limits = [
        (Algorithm::Gcra, daily(50)),
        (Algorithm::FixedWindow, long_windows(25)),
        (Algorithm::SlidingLog, long_windows(30)),
    ];
    let slow = Duration::from_secs(10);
    let connect = |builder: RedisLimiterBuilder| {
        build(
            &rt,
            &server,
            builder.timeout(slow).on_failure(OnFailure::Error),
        )
    };
    let limiters = (0..4)
        .map(|_| {
            let [(a0, p0), (a1, p1), (a2, p2)] = limits;
            connect(RedisLimiter::builder(a0, p0).and(a1, p1).and(a2, p2))
        })
        .collect();
    let admitted = flood(&rt, limiters, "all", (16, 6), one_or_two, |_| false);
    assert_eq!(admitted, 25, "the fixed window's 25 units");
    // Each limit alone, through a one-limit limiter on its stored state (moved to a
    // one-limit key: no one-limit key names a multi-limit limiter's state).
    for (i, (algorithm, policy)) in limits.into_iter().enumerate() {
        let _: () = server.cmd(&[
            "RENAME",
            &format!("test:{{all}}:{i}"),
            &format!("test:alone{i}"),
        ]);
        let alone = connect(RedisLimiter::builder(algorithm, policy));
        let d = match rt.block_on(alone.peek_n(&format!("alone{i}"), 0)) {
            Ok(Verdict::Decided(d)) => d,
            other => panic!("no decision: {other:?}"),
        };
        assert_eq!(
            d.limit() - d.remaining(),
            admitted,
            "{algorithm:?} spent other units than were admitted"
        );
    }
}
