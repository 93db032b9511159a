//! Session 44 (redis2): charges on a server out of memory (`maxmemory` 1,
//! `noeviction`). A script without flags is not refused at its start; Redis
//! refuses its first command that may grow memory (`SET`, `ZADD`) only while the
//! script has run no write command (even one that changed nothing), and lets a
//! script that has go on to its end (it cannot stop one half way). So a charge
//! either fails with `OOM` before its first write — nothing written on any key, a
//! retryable error — or, where its first write is one Redis does not refuse (the
//! sliding log's `ZREMRANGEBYSCORE` of the members that left the window, whether
//! or not it removes any), writes every limit as a charge with memory would.
//! Never a half write: no limit charged while another is not. See
//! VERIFICATION.md, "session 44: the log refund batched, the refund traces
//! shared, OOM on charges (redis2)".

mod common;

use common::{runtime, with_refunds, RedisServer};
use floodgate::{Decision, Policy};
use floodgate_redis::{Algorithm, RedisLimitError, RedisLimiter, RedisLimiterBuilder};

/// Half past two, the 1st of January 1970, in microseconds: the middle of an
/// hour's window.
const MID_HOUR: u64 = 9_000_000_000;

/// An hour in microseconds.
const HOUR: u64 = 3_600_000_000;

/// What a key holds, exactly (`DUMP`: its type and value; nil when absent) and
/// its time to live in milliseconds (`PTTL`).
type Snapshot = (Option<Vec<u8>>, i64);

fn snapshots(server: &RedisServer, keys: &[String]) -> Vec<Snapshot> {
    keys.iter()
        .map(|k| (server.cmd(&["DUMP", k]), server.cmd(&["PTTL", k])))
        .collect()
}

/// How a charge out of memory ended.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// Refused with `OOM`, nothing written.
    Refused,
    /// Decided and written on every limit.
    Charged,
}

/// `algorithms` in this order on one request, each 5 an hour.
fn limits(algorithms: &[Algorithm]) -> RedisLimiterBuilder {
    let p = Policy::per_hour(5).unwrap();
    let mut builder = common::builder(algorithms[0], p);
    for &a in &algorithms[1..] {
        builder = builder.and(a, p);
    }
    builder
}

/// A charge of one unit at `at` (with a receipt where refunds are on).
async fn charge(l: &RedisLimiter, key: &str, at: u64) -> Result<Decision, RedisLimitError> {
    l.charge_n_at_micros(key, 1, at).await.map(|(d, _)| d)
}

/// `history` (one-unit charges at those instants) on `key` and on a twin key,
/// then one charge at `at` on `key` with the server out of memory. Either it
/// fails with `OOM`, retryable, and every key of `key` is exactly as before; or it
/// is decided and every key is written: each differs from before, and the key
/// answers as its twin charged with memory (the same decision, the same peeks
/// after; with refunds off the same `DUMP` of every key).
fn charge_out_of_memory(
    server: &RedisServer,
    algorithms: &[Algorithm],
    refunds: bool,
    history: &[u64],
    at: u64,
) -> Outcome {
    let rt = runtime();
    let l = with_refunds(&rt, server, limits(algorithms), refunds);
    let name = format!("{algorithms:?} refunds {refunds}, {history:?} then {at}");
    let key = format!("oom{}", server.cmd::<u64>(&["INCR", "oom:keys"]));
    let twin = format!("{key}twin");
    rt.block_on(async {
        // Also loads the scripts before memory runs out.
        for &t in history {
            for k in [&key, &twin] {
                assert!(charge(&l, k, t).await.unwrap().is_allowed(), "{name}");
            }
        }
        let _: Decision = l.peek_n_at_micros("load", 0, at).await.unwrap();
        let keys = l.redis_keys(&key);
        let before = snapshots(server, &keys);
        let _: () = server.cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
        let _: () = server.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
        let out = charge(&l, &key, at).await;
        let _: () = server.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
        let after = snapshots(server, &keys);
        match out {
            Err(e) => {
                assert!(matches!(&e, RedisLimitError::Redis(_)), "{name}: {e:?}");
                assert!(e.to_string().contains("OOM"), "{name}: {e}");
                assert!(e.is_retryable(), "{name}: {e:?}");
                assert_eq!(after, before, "{name}: written, then refused");
                // Retried with memory: as the twin.
                let d = charge(&l, &key, at).await.unwrap();
                assert_eq!(d, charge(&l, &twin, at).await.unwrap(), "{name}");
                Outcome::Refused
            }
            Ok(d) => {
                for (i, (a, b)) in after.iter().zip(&before).enumerate() {
                    assert_ne!(a, b, "{name}: limit {i} not written");
                }
                assert_eq!(d, charge(&l, &twin, at).await.unwrap(), "{name}");
                if !refunds {
                    let twins = snapshots(server, &l.redis_keys(&twin));
                    let dumps = |s: &[Snapshot]| s.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
                    assert_eq!(dumps(&after), dumps(&twins), "{name}");
                }
                for later in [at, at + HOUR / 2, at + HOUR] {
                    for cost in [0, 1, 5] {
                        assert_eq!(
                            l.peek_n_at_micros(&key, cost, later).await.unwrap(),
                            l.peek_n_at_micros(&twin, cost, later).await.unwrap(),
                            "{name}: peek {cost} at {later}"
                        );
                    }
                }
                Outcome::Charged
            }
        }
    })
}

/// A charge whose first write is one that may grow memory — GCRA's or a
/// window's `SET`, or the new refund head's `ZADD` on a log charged with a
/// receipt for the first time — alone or before the other limits: refused whole,
/// nothing written on any key; with memory back the charge admits as the twin.
#[test]
fn a_charge_whose_first_write_may_grow_memory_is_refused_whole() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let [gcra, fixed, sliding, log] = common::ALGORITHMS;
    let mut cases = Vec::new();
    for refunds in [false, true] {
        for history in [&[][..], &[MID_HOUR]] {
            for shape in [
                vec![gcra],
                vec![fixed],
                vec![sliding],
                vec![gcra, fixed, sliding, log],
                vec![sliding, log, gcra],
            ] {
                cases.push((shape, refunds, history));
            }
        }
    }
    // A fresh log with receipts: the refund head's ZADD first.
    cases.push((vec![log], true, &[]));
    cases.push((vec![log, gcra, fixed, sliding], true, &[]));
    for (shape, refunds, history) in cases {
        let out = charge_out_of_memory(&server, &shape, refunds, history, MID_HOUR + 1);
        assert_eq!(
            out,
            Outcome::Refused,
            "{shape:?} refunds {refunds} {history:?}"
        );
    }
}

/// A charge whose first write is the sliding log's `ZREMRANGEBYSCORE` of the
/// members that left the window — every log charge but a receipt's on a fresh
/// key, whether or not it removes any (Redis counts the command, not its effect):
/// Redis lets the script write on, out of memory, and the charge completes on
/// every limit, as with memory (the log's `ZADD`, then every later limit's
/// `SET`). Where a limit before the log writes first, refused whole.
#[test]
fn a_charge_that_first_trims_the_log_completes_on_every_limit() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let [gcra, fixed, sliding, log] = common::ALGORITHMS;
    let expired = MID_HOUR + HOUR + 1;
    let mut cases = Vec::new();
    for (refunds, history, at) in [
        (false, &[][..], MID_HOUR),
        (false, &[MID_HOUR][..], MID_HOUR + 1),
        (false, &[MID_HOUR][..], expired),
        (true, &[MID_HOUR][..], MID_HOUR + 1),
        (true, &[MID_HOUR][..], expired),
    ] {
        for shape in [vec![log], vec![log, gcra], vec![log, fixed, sliding, gcra]] {
            cases.push((shape, refunds, history, at, Outcome::Charged));
        }
        for shape in [vec![fixed, log], vec![gcra, log]] {
            cases.push((shape, refunds, history, at, Outcome::Refused));
        }
    }
    for (shape, refunds, history, at, want) in cases {
        let out = charge_out_of_memory(&server, &shape, refunds, history, at);
        assert_eq!(out, want, "{shape:?} refunds {refunds} {history:?} at {at}");
    }
}

/// Production time (the server's clock, keys with a time to live), refunds off
/// and on, on a fresh key: the four algorithms with GCRA first are refused with
/// `OOM`, nothing written, and admit once memory is back; the log first (refunds
/// off: its trim first) completes, every key written with a time to live.
#[test]
fn a_production_charge_out_of_memory_is_whole_either_way() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let gcra_first = common::ALGORITHMS;
    let mut log_first = gcra_first;
    log_first.reverse();
    for (shape, refunds, refused) in [
        (gcra_first, false, true),
        (gcra_first, true, true),
        (log_first, true, true),
        (log_first, false, false),
    ] {
        let l = with_refunds(&rt, &server, limits(&shape), refunds);
        let key = format!("prod{shape:?}{refunds}");
        rt.block_on(async {
            // The scripts loaded before memory runs out.
            let _ = l.peek_n(&format!("load{key}"), 0).await.unwrap();
            let _ = l.charge_n(&format!("load{key}"), 1).await.unwrap();
            let keys = l.redis_keys(&key);
            let before = snapshots(&server, &keys);
            let _: () = server.cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
            let _: () = server.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
            let out = l.charge_n(&key, 1).await;
            let _: () = server.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
            let after = snapshots(&server, &keys);
            let name = format!("{shape:?} refunds {refunds}");
            let v = match out {
                Err(e) => {
                    assert!(refused, "{name}: {e:?}");
                    assert!(e.to_string().contains("OOM") && e.is_retryable(), "{e:?}");
                    assert_eq!(after, before, "{name}");
                    let (v, r) = l.charge_n(&key, 1).await.unwrap();
                    assert_eq!(r.is_some(), refunds, "{name}");
                    v
                }
                Ok((v, _)) => {
                    assert!(!refused, "{name}");
                    for (i, (a, b)) in after.iter().zip(&before).enumerate() {
                        assert!(a.0.is_some() && a.1 > 0 && a != b, "{name}: limit {i}");
                    }
                    v
                }
            };
            assert_eq!(v.decision().remaining(), 4, "{name}");
        });
    }
}
