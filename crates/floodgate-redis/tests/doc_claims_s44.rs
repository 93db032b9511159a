//! floodgate-redis's promises added in session 44 that no other test pins down.
//!
//! * The crate's **Refunds**, sliding log: a refund's writes are "`O(members after
//!   it)` work in two commands: one `ZREM` of every member from the charge's instant
//!   on and one `ZADD` of those left (each split per 2 000 members …), at most `L`
//!   members under one policy …, and at most six more commands for the refund
//!   members" (and `sliding_log.lua`'s `sliding_log_refund`, the same).
//! * `RedisLimitError::is_retryable`: true for "out of memory — `OOM`, a script's
//!   first write refused, so nothing written" — for a decision (the refund's
//!   case: `review_s44_redis.rs`). Out of memory, a sliding log's decision is not
//!   refused: its first write (the trim) frees memory, and Redis then lets the
//!   script write on.
//!
//! Needs `redis-server` (skipped without it unless `FLOODGATE_REQUIRE_REDIS=1`).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{command_stats, runtime, RedisServer};
use floodgate::Policy;
use floodgate_redis::{Algorithm, RedisLimitError};

/// `INFO commandstats` as `{command: calls}`.
fn calls(server: &RedisServer) -> BTreeMap<String, u64> {
    command_stats(server)
        .into_iter()
        .map(|(name, (calls, _))| (name, calls))
        .collect()
}

/// The commands that write a key, as a script might call them.
const WRITES: [&str; 16] = [
    "zadd",
    "zrem",
    "zincrby",
    "zremrangebyscore",
    "zremrangebyrank",
    "zremrangebylex",
    "zpopmin",
    "zpopmax",
    "set",
    "del",
    "unlink",
    "pexpire",
    "expire",
    "pexpireat",
    "persist",
    "incrby",
];

/// A sliding log of `L` = 10 a 10 s window, charged one unit at each of ten
/// instants with receipts (ten members, the window full). The refund of the
/// charge at instant `k` rewrites the `m = 10 − k` members from its instant on in
/// one `ZREM` and one `ZADD` (m ≤ 2 000: one chunk each), plus at most six commands
/// for the refund members (at most three of each), nothing else: `ZREM ≤ 1 + 3`,
/// `ZADD ≤ 1 + 3`, all writes `≤ 8` whatever `m`; each receipt gives back (`true`)
/// and the log's total drops by one. (`round_trips.rs` pins the exact counts.)
///
/// Mutation seen failing: `sliding_log_refund` writing each later member on its
/// own (session 43's per-member `ZADD`: `ZADD` = m + refund members at k = 0).
#[test]
fn a_sliding_log_refund_writes_its_later_members_in_one_zrem_and_one_zadd() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let limit = 10_u64;
    let p = Policy::new(limit, Duration::from_secs(10)).expect("policy");
    // Newest first, so each refund's members from its instant on are all charged
    // and none given back yet: m = 1, 4, 7, 10.
    for k in [9_u64, 6, 3, 0] {
        let limiter = common::with_refunds(
            &rt,
            &server,
            common::builder(Algorithm::SlidingLog, p),
            true,
        );
        let key = format!("writes{k}");
        let t = 100_000_000_u64;
        rt.block_on(async {
            let mut receipts = Vec::new();
            for i in 0..limit {
                let (d, r) = limiter
                    .charge_n_at_micros(&key, 1, t + i * 1_000)
                    .await
                    .expect("charge");
                assert!(d.is_allowed(), "charge {i}");
                receipts.push(r.expect("a receipt"));
            }
            let full = limiter
                .peek_n_at_micros(&key, 0, t + limit * 1_000)
                .await
                .expect("peek");
            assert_eq!(full.remaining(), 0, "the window is full");
            // Load the refund script first: its first run is refused NOSCRIPT,
            // with nothing run inside it, but keep the count clean all the same.
            let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
            let back = limiter
                .refund_at_micros(&receipts[k as usize], t + limit * 1_000)
                .await
                .expect("refund");
            assert!(back, "k = {k}: the charge is given back");
            let ran = calls(&server);
            let m = limit - k;
            let of = |name: &str| ran.get(name).copied().unwrap_or(0);
            let writes: u64 = WRITES.iter().map(|w| of(w)).sum();
            let others = writes - of("zadd") - of("zrem");
            eprintln!("k = {k}, m = {m}: {ran:?}");
            assert!(of("zrem") <= 1 + 3, "k = {k}, m = {m}: {ran:?}");
            assert!(of("zadd") <= 1 + 3, "k = {k}, m = {m}: {ran:?}");
            assert_eq!(others, 0, "k = {k}: only ZADD and ZREM: {ran:?}");
            assert!(writes <= 8, "k = {k}, m = {m}: {ran:?}");
            let left = limiter
                .peek_n_at_micros(&key, 0, t + limit * 1_000)
                .await
                .expect("peek");
            assert_eq!(left.remaining(), 1, "k = {k}: one unit given back");
        });
    }
}

/// What each of `keys` holds, exactly (`DUMP`: its type and value; nil when
/// absent).
fn dumps(server: &RedisServer, keys: &[String]) -> Vec<Option<Vec<u8>>> {
    keys.iter().map(|k| server.cmd(&["DUMP", k])).collect()
}

/// Each algorithm alone (5 an hour), one unit taken on "kept" first, then the
/// server out of memory (`maxmemory` 1, `noeviction`): a check on "kept" and one
/// on a key never seen either go through (a script whose first write frees
/// memory — the sliding log's trim — may write on past the limit, as Redis lets
/// any script that has written) or fail with Redis's `OOM` error, retryable,
/// having written nothing: "kept" holds what it held, "fresh" does not exist,
/// and with memory allowed again the same check counts one unit only. GCRA and
/// both windows (their one write a `SET`) fail so.
///
/// Mutation seen failing: `is_retryable` without `OOM` among its codes.
#[test]
fn a_decision_refused_for_memory_is_retryable_and_writes_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let p = Policy::per_hour(5).expect("policy");
    // Half past two, 1 January 1970: the middle of an hour's window.
    let t = 9_000_000_000_u64;
    let mut refused_by = Vec::new();
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ] {
        let l = common::with_refunds(&rt, &server, common::builder(algorithm, p), false);
        let (kept, fresh) = (format!("kept{algorithm:?}"), format!("fresh{algorithm:?}"));
        rt.block_on(async {
            let first = l.check_n_at_micros(&kept, 1, t).await.expect("check");
            assert_eq!((first.is_allowed(), first.remaining()), (true, 4));
            for (key, left) in [(&kept, 4), (&fresh, 5)] {
                let keys = l.redis_keys(key);
                let before = dumps(&server, &keys);
                let _: () = server.cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
                let _: () = server.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
                let r = l.check_n_at_micros(key, 1, t).await;
                let _: () = server.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
                let Err(e) = r else {
                    continue;
                };
                refused_by.push(format!("{algorithm:?} {key}"));
                assert!(matches!(&e, RedisLimitError::Redis(_)), "{e:?}");
                assert!(e.to_string().contains("OOM"), "{e}");
                assert!(e.is_retryable(), "{algorithm:?}: {e:?}");
                assert_eq!(
                    dumps(&server, &keys),
                    before,
                    "{algorithm:?} {key}: written"
                );
                let again = l.check_n_at_micros(key, 1, t).await.expect("retried");
                assert_eq!((again.is_allowed(), again.remaining()), (true, left - 1));
            }
        });
    }
    eprintln!("refused for memory: {refused_by:?}");
    for algorithm in ["Gcra", "FixedWindow", "SlidingWindow"] {
        let n = refused_by
            .iter()
            .filter(|r| r.starts_with(&format!("{algorithm} ")))
            .count();
        assert_eq!(n, 2, "{algorithm}: {refused_by:?}");
    }
}
