//! Decisions per second through Redis at 1, 16 and 64 concurrent tasks, beside
//! `redis-benchmark` running the same production script with `EVALSHA` at the same
//! concurrency (its floor: no client-side work of ours).
//!
//! `cargo bench -p floodgate-redis --bench throughput` (needs `redis-server` and
//! `redis-benchmark` on `PATH`; starts its own server on a free loopback port).
//! `FLOODGATE_BENCH_CALLS` sets the calls per row (default 50 000).
//!
//! Then a flood: 64 tasks on one key far past its limit, the local denial cache off
//! and on — decisions per second and the `EVALSHA` calls Redis served.

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{runtime, RedisServer};
use floodgate::Policy;
use floodgate_redis::{Algorithm, OnFailure, RedisLimiter, Verdict};

fn main() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let calls: u64 = std::env::var("FLOODGATE_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000);
    let rt = runtime();
    let conn = rt
        .block_on(floodgate_redis::connect(&server.url()))
        .unwrap();
    // All admitted: the rate is far above the load, so every call writes.
    let policy = Policy::per_second(1_000_000_000).unwrap();
    let limiter = Arc::new(
        RedisLimiter::builder(Algorithm::Gcra, policy)
            .prefix("bench:")
            .timeout(Duration::from_secs(5))
            .on_failure(OnFailure::Error)
            .build(conn)
            .unwrap(),
    );
    // Load the script once.
    assert!(!rt
        .block_on(limiter.check_n("warm", 1))
        .unwrap()
        .is_fallback());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("machine: {cpus} cores; {calls} calls per row; GCRA, 10^5 keys, all admitted");
    println!("| tasks | floodgate-redis decisions/s | redis-benchmark EVALSHA req/s |");
    println!("|---:|---:|---:|");
    for tasks in [1_u64, 16, 64] {
        let per_task = calls / tasks;
        let t0 = Instant::now();
        rt.block_on(async {
            let handles: Vec<_> = (0..tasks)
                .map(|t| {
                    let limiter = Arc::clone(&limiter);
                    tokio::spawn(async move {
                        for i in 0..per_task {
                            let key = (t * 7_919 + i) % 100_000;
                            match limiter.check_n(&key, 1).await {
                                Ok(Verdict::Decided(_)) => {}
                                other => panic!("{other:?}"),
                            }
                        }
                    })
                })
                .collect();
            for h in handles {
                h.await.unwrap();
            }
        });
        let ours = (per_task * tasks) as f64 / t0.elapsed().as_secs_f64();
        let theirs = redis_benchmark(&server, &limiter, tasks, calls);
        println!("| {tasks} | {ours:.0} | {theirs} |");
    }
    flood(&rt, &server, calls);
}

/// 64 tasks hammering one key (GCRA, 10 a minute) with the denial cache off and on.
fn flood(rt: &tokio::runtime::Runtime, server: &RedisServer, calls: u64) {
    let tasks = 64_u64;
    let per_task = calls / tasks;
    println!();
    println!("flood: {tasks} tasks, one key, GCRA 10 per minute, {calls} calls");
    println!("| deny cache | decisions/s | Redis EVALSHA calls |");
    println!("|---|---:|---:|");
    for keys in [0_usize, 1_024] {
        let conn = rt
            .block_on(floodgate_redis::connect(&server.url()))
            .unwrap();
        let limiter = Arc::new(
            RedisLimiter::builder(Algorithm::Gcra, Policy::per_minute(10).unwrap())
                .prefix(format!("flood{keys}:"))
                .timeout(Duration::from_secs(5))
                .on_failure(OnFailure::Error)
                .deny_cache(keys)
                .build(conn)
                .unwrap(),
        );
        let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
        let t0 = Instant::now();
        rt.block_on(async {
            let handles: Vec<_> = (0..tasks)
                .map(|_| {
                    let limiter = Arc::clone(&limiter);
                    tokio::spawn(async move {
                        for _ in 0..per_task {
                            match limiter.check_n("victim", 1).await {
                                Ok(Verdict::Decided(_) | Verdict::Cached(_)) => {}
                                other => panic!("{other:?}"),
                            }
                        }
                    })
                })
                .collect();
            for h in handles {
                h.await.unwrap();
            }
        });
        let rate = (per_task * tasks) as f64 / t0.elapsed().as_secs_f64();
        let info: String = server.cmd(&["INFO", "commandstats"]);
        let evalsha = info
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next())
            .unwrap_or("0")
            .to_owned();
        let label = if keys == 0 { "off" } else { "on (1024 keys)" };
        println!("| {label} | {rate:.0} | {evalsha} |");
    }
}

/// `redis-benchmark` running the limiter's script directly, or why not.
fn redis_benchmark(
    server: &RedisServer,
    limiter: &RedisLimiter,
    clients: u64,
    calls: u64,
) -> String {
    let port = server
        .url()
        .rsplit(':')
        .next()
        .unwrap_or("")
        .trim_end_matches('/')
        .to_owned();
    // The script's arguments: cost, write, T (µs), B — as RedisLimiter sends them.
    let out = Command::new("redis-benchmark")
        .args([
            "-p",
            &port,
            "-c",
            &clients.to_string(),
            "-n",
            &calls.to_string(),
        ])
        .args(["-r", "100000", "-q", "--csv"])
        .args(["EVALSHA", limiter.script_sha1(), "1", "bench:__rand_int__"])
        .args(["1", "1", "1", "1000000000"])
        .output();
    match out {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            // CSV: "test","rps",...
            text.lines()
                .filter_map(|l| l.split(',').nth(1))
                .map(|v| v.trim_matches('"').to_owned())
                .find(|v| v.parse::<f64>().is_ok())
                .unwrap_or_else(|| format!("unparsed: {text}"))
        }
        Ok(out) => format!("failed: {}", String::from_utf8_lossy(&out.stderr).trim()),
        Err(e) => format!("not run ({e})"),
    }
}
