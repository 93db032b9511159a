//! What the production scripts (server `TIME`) leave in Redis: idle keys expire, no
//! key before its state is fresh again, and a peek, a cost of 0, a cost above the
//! capacity and a denial write nothing.

mod common;

use std::time::{Duration, Instant};

use common::{an_hour, build, limiter, mid_window_periods, runtime, RedisServer, ALGORITHMS};
use floodgate::Policy;
use floodgate_redis::{Algorithm, OnFailure, RedisLimitError, RedisLimiter, Verdict};

fn decided(v: Result<Verdict, floodgate_redis::RedisLimitError>) -> floodgate::Decision {
    match v {
        Ok(Verdict::Decided(d)) => d,
        other => panic!("no decision from Redis: {other:?}"),
    }
}

fn slow(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    a: Algorithm,
    p: Policy,
) -> RedisLimiter {
    limiter(rt, server, a, p, OnFailure::Error, Duration::from_secs(5))
}

#[test]
fn idle_keys_expire() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    // 2 per 600 ms: every state is fresh again within 1.2 s.
    let policy = Policy::new(2, Duration::from_millis(600)).unwrap();
    for algorithm in ALGORITHMS {
        let l = slow(&rt, &server, algorithm, policy);
        for key in ["a", "b", "c"] {
            assert!(decided(rt.block_on(l.check_n(key, 1))).is_allowed());
        }
        // Written, with a TTL within the policy's bound (-1, none, fails). The key
        // lives at most 1.2 s: this thread, descheduled that long, finds it gone
        // (-2), so "c" is checked again until a PTTL finds it (a denial keeps it).
        let mut ttl: i64 = server.cmd(&["PTTL", "test:c"]);
        for _ in 0..100 {
            if ttl != -2 {
                break;
            }
            let _ = decided(rt.block_on(l.check_n("c", 1)));
            ttl = server.cmd(&["PTTL", "test:c"]);
        }
        assert!(
            (0..=1_200).contains(&ttl),
            "{algorithm:?}: PTTL {ttl} (-2: never written)"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.cmd::<i64>(&["DBSIZE"]) > 0 {
            assert!(
                Instant::now() < deadline,
                "{algorithm:?}: keys outlived their TTL"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn peeks_zero_costs_impossible_costs_and_denials_write_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    // 3 an hour, with a quarter of an hour left at least in the window.
    let policy = Policy::new(3, an_hour(&server)).unwrap();
    for algorithm in ALGORITHMS {
        let _: () = server.cmd(&["FLUSHALL"]);
        let l = slow(&rt, &server, algorithm, policy);
        let peek = decided(rt.block_on(l.peek_n("k", 1)));
        assert!(peek.is_allowed());
        assert_eq!(peek.remaining(), 2);
        let zero = decided(rt.block_on(l.check_n("k", 0)));
        assert!(zero.is_allowed());
        assert_eq!(zero.remaining(), 3);
        let never = decided(rt.block_on(l.check_n("k", 4)));
        assert!(!never.is_allowed());
        assert_eq!(
            never.retry_after(),
            None,
            "{algorithm:?}: cost 4 > 3 never fits"
        );
        assert_eq!(
            server.cmd::<i64>(&["DBSIZE"]),
            0,
            "{algorithm:?} wrote a key"
        );

        // Fill it, then a denial leaves the stored state as it was.
        assert!(decided(rt.block_on(l.check_n("k", 3))).is_allowed());
        let before: Vec<u8> = server.cmd(&["DUMP", "test:k"]);
        let denied = decided(rt.block_on(l.check_n("k", 1)));
        assert!(!denied.is_allowed());
        assert!(denied.retry_after().is_some_and(|r| r > Duration::ZERO));
        let peeked = decided(rt.block_on(l.peek_n("k", 1)));
        assert_eq!(peeked.is_allowed(), denied.is_allowed());
        let after: Vec<u8> = server.cmd(&["DUMP", "test:k"]);
        assert_eq!(
            before, after,
            "{algorithm:?}: a denial or a peek changed the state"
        );
    }
}

#[test]
fn the_server_clock_drives_gcra() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    // 1 per hour, burst 2: two at once, the third waits about an hour.
    let policy = Policy::per_hour(1).and_then(|p| p.with_burst(2)).unwrap();
    let l = slow(&rt, &server, Algorithm::Gcra, policy);
    for remaining in [1, 0] {
        let d = decided(rt.block_on(l.check_n("gcra", 1)));
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), remaining);
    }
    let d = decided(rt.block_on(l.check_n("gcra", 1)));
    assert!(!d.is_allowed());
    let retry = d.retry_after().unwrap();
    // Generous bounds: an hour less the (short) time since the first call.
    assert!(retry <= Duration::from_secs(3_600), "{retry:?}");
    assert!(retry > Duration::from_secs(3_500), "{retry:?}");
    let ttl: i64 = server.cmd(&["PTTL", "test:gcra"]);
    assert!(ttl > 7_000_000 && ttl <= 7_200_000, "PTTL {ttl}");
}

#[test]
fn several_limits_share_a_hash_tag_and_charge_all_or_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let conn = rt
        .block_on(floodgate_redis::connect(&server.url()))
        .unwrap();
    // A burst of 5 an hour, and at most 2 in a fixed hour (a quarter of it left at
    // least).
    let hour = an_hour(&server);
    let l = RedisLimiter::builder(Algorithm::Gcra, Policy::new(5, hour).unwrap())
        .and(Algorithm::FixedWindow, Policy::new(2, hour).unwrap())
        .prefix("test:")
        .timeout(Duration::from_secs(5))
        .on_failure(OnFailure::Error)
        .build(conn)
        .unwrap();
    assert_eq!(l.redis_keys("u"), ["test:{u}:0", "test:{u}:1"]);
    let first = decided(rt.block_on(l.check_n("u", 1)));
    assert!(first.is_allowed());
    assert_eq!(
        first.remaining(),
        1,
        "the window's 1 left, not the bucket's 4"
    );
    assert!(decided(rt.block_on(l.check_n("u", 1))).is_allowed());
    let bucket: Vec<u8> = server.cmd(&["DUMP", "test:{u}:0"]);
    let denied = decided(rt.block_on(l.check_n("u", 1)));
    assert!(!denied.is_allowed(), "the window denies");
    assert_eq!(denied.limit(), 2);
    let after: Vec<u8> = server.cmd(&["DUMP", "test:{u}:0"]);
    assert_eq!(bucket, after, "a denial by one limit charges none");
    assert_eq!(server.cmd::<i64>(&["DBSIZE"]), 2);
    for key in ["test:{u}:0", "test:{u}:1"] {
        assert!(server.cmd::<i64>(&["PTTL", key]) > 0, "{key} has a TTL");
    }
}

/// A key lives as long as its state matters, and not much longer: its TTL is the
/// decision's `reset_after` (until the state is fresh again: GCRA's TAT, the end of
/// the fixed window, of the sliding window after the one counted in, the newest
/// log entry's exit) rounded up to a millisecond. An earlier expiry would hand out
/// a fresh limit early.
#[test]
fn every_key_lives_exactly_as_long_as_its_state_matters() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let policy = Policy::per_hour(3).unwrap();
    for algorithm in ALGORITHMS {
        let l = slow(&rt, &server, algorithm, policy);
        for cost in [1, 2] {
            let sent = Instant::now();
            let d = decided(rt.block_on(l.check_n("ttl", cost)));
            assert!(d.is_allowed(), "{algorithm:?}");
            let ttl: u128 = server.cmd::<u64>(&["PTTL", "test:ttl"]).into();
            let between = sent.elapsed().as_micros();
            let reset = d.reset_after().as_micros();
            // Up to a millisecond above (rounding), and below only by the time the
            // PTTL comes after the decision: at most the time measured around both,
            // however long this thread was descheduled (and a second more).
            assert!(
                ttl * 1_000 <= reset + 1_000 && ttl * 1_000 + between + 1_000_000 >= reset,
                "{algorithm:?} cost {cost}: PTTL {ttl} ms, reset_after {reset} µs"
            );
        }
        let _: () = server.cmd(&["DEL", "test:ttl"]);
    }
}

/// Keys are data, never code or protocol: spaces, CR LF, NUL, braces, quotes, Lua
/// syntax, non-ASCII and a megabyte-long key are each stored under exactly
/// `prefix + key` and decide alone — also when the script's error names a
/// malformed key (CR LF in an error reply would split it).
/// A rolling deploy that shortens a window's period: the short policy's writes hold
/// units that the long policy's current window counts, and the key keeps them as long
/// as that window lasts, not only as long as the short policy needs them (its own
/// window, or two of them: under a minute here); a later write of the short policy
/// never shortens that.
#[test]
fn a_window_state_lives_as_long_as_another_period_counts_its_units() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    // About an hour and 10 to 30 s, each with a quarter of its window left at least:
    // no window ends during the test.
    let first = |shortest| {
        mid_window_periods(&server, Duration::from_secs(shortest))
            .next()
            .expect("a period in the middle of its window")
    };
    let (long, short) = (first(3_600), first(10));
    assert!(short <= Duration::from_secs(30), "{short:?}");
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let key = format!("deploy:{algorithm:?}");
        let [long, short] = [long, short]
            .map(|period| slow(&rt, &server, algorithm, Policy::new(3, period).unwrap()));
        assert!(decided(rt.block_on(long.check_n(&key, 1))).is_allowed());
        for _ in 0..2 {
            assert!(decided(rt.block_on(short.check_n(&key, 1))).is_allowed());
        }
        let ttl: i64 = server.cmd(&["PTTL", &format!("test:{key}")]);
        assert!(ttl > 10 * 60 * 1_000, "{algorithm:?}: PTTL {ttl} ms");
        // The long window holds all three.
        let d = decided(rt.block_on(long.check_n(&key, 1)));
        assert_eq!((d.is_allowed(), d.remaining()), (false, 0), "{algorithm:?}");
    }
}

#[test]
fn keys_with_any_characters_are_stored_as_given() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let l = slow(&rt, &server, Algorithm::Gcra, Policy::per_hour(3).unwrap());
    let long = "k".repeat(1 << 20);
    let keys = [
        "a b",
        "line\r\n+OK\r\n",
        "nul\0byte",
        "{tag}",
        "'; return {1,2,3,4,5} --",
        "]]..redis.call('FLUSHALL')..[[",
        "ключ🔑",
        long.as_str(),
    ];
    for (i, key) in keys.iter().enumerate() {
        let d = decided(rt.block_on(l.check_n(*key, 1)));
        assert_eq!((d.is_allowed(), d.remaining()), (true, 2), "key {i}");
        // As given, but for a `\` before a leading `{` (see the next test).
        let stored = l.redis_keys(*key).remove(0);
        let escape = if key.starts_with('{') { "\\" } else { "" };
        assert_eq!(stored, format!("test:{escape}{key}"), "key {i}");
        let mut conn = server.connection().unwrap();
        let exists: i64 = redis::cmd("EXISTS").arg(stored).query(&mut conn).unwrap();
        assert_eq!(exists, 1, "key {i}");
        assert_eq!(server.cmd::<usize>(&["DBSIZE"]), i + 1, "key {i}");
    }
    // A malformed state under a key with CR LF: one error, and the connection
    // still answers the next call rightly.
    let evil = "evil\r\n:1\r\n";
    let mut conn = server.connection().unwrap();
    let _: () = redis::cmd("SET")
        .arg(format!("test:{evil}"))
        .arg("not a number")
        .query(&mut conn)
        .unwrap();
    for _ in 0..3 {
        match rt.block_on(l.check_n(evil, 1)) {
            Err(RedisLimitError::Redis(e)) => assert!(e.to_string().contains("malformed")),
            other => panic!("an error expected, got {other:?}"),
        }
        let d = decided(rt.block_on(l.peek_n("a b", 1)));
        assert_eq!((d.is_allowed(), d.remaining()), (true, 1), "{d:?}");
    }
}

/// A caller-chosen key of a one-limit limiter (a login name, say) shaped like a
/// multi-limit limiter's Redis key under the same prefix (`{victim}:0`) charges its
/// own state, never the victim's limit.
#[test]
fn a_one_limit_key_never_reaches_a_multi_limit_limiters_state() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let hourly = Policy::per_hour(3).unwrap();
    let multi = build(
        &rt,
        &server,
        common::builder(Algorithm::Gcra, hourly)
            .and(Algorithm::Gcra, Policy::per_day(100).unwrap())
            .on_failure(OnFailure::Error),
    );
    let single = slow(&rt, &server, Algorithm::Gcra, hourly);
    for forged in ["{victim}:0", "\\{victim}:0"] {
        for _ in 0..3 {
            assert!(decided(rt.block_on(single.check_n(forged, 1))).is_allowed());
        }
        assert!(!decided(rt.block_on(single.check_n(forged, 1))).is_allowed());
    }
    let d = decided(rt.block_on(multi.check_n("victim", 1)));
    assert_eq!((d.is_allowed(), d.remaining()), (true, 2), "{d:?}");
    // The escape keeps one-limit keys apart from each other too.
    assert_ne!(single.redis_keys("{a"), single.redis_keys("\\{a"));
    assert_eq!(single.redis_keys("a{b}"), ["test:a{b}"]);
}
