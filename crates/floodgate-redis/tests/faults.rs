//! Faults: a killed server, a restart on the same port, a flushed script cache, a
//! blocked server, a server busy with another script, and keys holding what the
//! scripts did not write. No call panics, each returns within generous bounds of its
//! 50 ms timeout, and the limiter recovers by itself.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{build, flood, limiter, runtime, RedisServer, ALGORITHMS};
use floodgate::Policy;
use floodgate_redis::{Algorithm, OnFailure, RedisLimitError, RedisLimiter, Verdict};

const TIMEOUT: Duration = Duration::from_millis(50);
/// What "within the timeout" means on a loaded machine: generous, never tight.
const PROMPTLY: Duration = Duration::from_secs(1);

fn policy() -> Policy {
    Policy::per_second(1_000).unwrap()
}

/// Calls until Redis decides (the first call loads the script), up to `within`.
fn until_decided(rt: &tokio::runtime::Runtime, limiter: &RedisLimiter, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        match rt.block_on(limiter.check_n("k", 1)) {
            Ok(Verdict::Decided(_)) => return,
            other => {
                assert!(
                    Instant::now() < deadline,
                    "no decision from Redis within {within:?}: {other:?}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

#[test]
fn a_killed_server_fails_open_or_closed_promptly_and_a_restart_recovers() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let closed_wait = Duration::from_secs(3);
    let open = limiter(
        &rt,
        &server,
        Algorithm::Gcra,
        policy(),
        OnFailure::Open,
        TIMEOUT,
    );
    let closed = limiter(
        &rt,
        &server,
        Algorithm::SlidingLog,
        policy(),
        OnFailure::Closed {
            retry_after: closed_wait,
        },
        TIMEOUT,
    );
    let error = limiter(
        &rt,
        &server,
        Algorithm::FixedWindow,
        policy(),
        OnFailure::Error,
        TIMEOUT,
    );
    for l in [&open, &closed, &error] {
        until_decided(&rt, l, Duration::from_secs(5));
    }

    server.kill();
    for _ in 0..3 {
        let t0 = Instant::now();
        match rt.block_on(open.check_n("k", 1)) {
            Ok(Verdict::Fallback { decision, .. }) => assert!(decision.is_allowed()),
            other => panic!("fail open expected: {other:?}"),
        }
        let t1 = Instant::now();
        match rt.block_on(closed.check_n("k", 1)) {
            Ok(Verdict::Fallback { decision, .. }) => {
                assert!(!decision.is_allowed());
                assert_eq!(decision.retry_after(), Some(closed_wait));
                // Not "full again now" beside a wait: the reset says the same wait.
                assert_eq!(decision.reset_after(), closed_wait);
            }
            other => panic!("fail closed expected: {other:?}"),
        }
        let t2 = Instant::now();
        match rt.block_on(error.check_n("k", 1)) {
            Err(e) => assert!(e.is_retryable(), "{e}"),
            other => panic!("an error expected: {other:?}"),
        }
        // Through the AsyncLimit trait too: the policy's fallback, as Ok.
        let d = rt
            .block_on(floodgate::AsyncLimit::check_n(&open, "k", 1))
            .unwrap();
        assert!(d.is_allowed());
        let t3 = Instant::now();
        for dt in [t1 - t0, t2 - t1, t3 - t2] {
            assert!(
                dt < PROMPTLY,
                "a call took {dt:?} with a {TIMEOUT:?} timeout"
            );
        }
    }

    server.restart();
    for l in [&open, &closed, &error] {
        until_decided(&rt, l, Duration::from_secs(10));
    }
}

#[test]
fn a_flushed_script_cache_is_reloaded_on_the_next_call() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    for algorithm in ALGORITHMS {
        let l = limiter(
            &rt,
            &server,
            algorithm,
            policy(),
            OnFailure::Error,
            Duration::from_secs(5),
        );
        until_decided(&rt, &l, Duration::from_secs(5));
        let _: () = server.cmd(&["SCRIPT", "FLUSH"]);
        let v = rt.block_on(l.check_n("k", 1)).unwrap();
        assert!(!v.is_fallback());
    }
}

#[test]
fn a_blocked_server_times_out_promptly() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let error = limiter(
        &rt,
        &server,
        Algorithm::Gcra,
        policy(),
        OnFailure::Error,
        TIMEOUT,
    );
    let open = limiter(
        &rt,
        &server,
        Algorithm::Gcra,
        policy(),
        OnFailure::Open,
        TIMEOUT,
    );
    until_decided(&rt, &error, Duration::from_secs(5));
    until_decided(&rt, &open, Duration::from_secs(5));

    // The server stops answering the limiter: `CLIENT PAUSE ... WRITE` holds every
    // script (a write command) until `CLIENT UNPAUSE`, and its +OK says the pause is
    // in place. A block the test ends, not the clock: a `DEBUG SLEEP 0.3` had ended
    // if this thread was descheduled 200 ms, and the calls were decided. The 30 s
    // only bounds a build whose calls ignore their timeout (it fails below).
    let _: () = server.cmd(&["CLIENT", "PAUSE", "30000", "WRITE"]);

    let t0 = Instant::now();
    let e = rt.block_on(error.check_n("k", 1)).unwrap_err();
    assert!(
        matches!(e, RedisLimitError::Timeout { after } if after == TIMEOUT),
        "{e}"
    );
    let v = rt.block_on(open.check_n("k", 1)).unwrap();
    assert!(v.is_fallback() && v.decision().is_allowed(), "{v:?}");
    let dt = t0.elapsed();
    assert!(
        dt < PROMPTLY,
        "two calls took {dt:?} with a {TIMEOUT:?} timeout"
    );

    // Unpaused, the connection serves again.
    let _: () = server.cmd(&["CLIENT", "UNPAUSE"]);
    until_decided(&rt, &error, Duration::from_secs(5));
}

#[test]
fn keys_holding_other_data_are_typed_errors_not_panics() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    for algorithm in ALGORITHMS {
        let l = limiter(
            &rt,
            &server,
            algorithm,
            policy(),
            OnFailure::Error,
            Duration::from_secs(5),
        );
        let _: () = server.cmd(&["SET", "test:garbage", "not:a:state:at:all"]);
        let _: () = server.cmd(&["DEL", "test:list"]);
        let _: i64 = server.cmd(&["RPUSH", "test:list", "x"]);
        let _: () = server.cmd(&["DEL", "test:zset"]);
        // A member without units at a live instant (the server's clock, give or take).
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros();
        let _: i64 = server.cmd(&["ZADD", "test:zset", &now_us.to_string(), "no-units"]);
        for key in ["garbage", "list", "zset"] {
            if algorithm == Algorithm::SlidingLog && key == "garbage" {
                // A string under a sorted-set script: WRONGTYPE, checked with "list".
                continue;
            }
            if algorithm != Algorithm::SlidingLog && key == "zset" {
                continue;
            }
            match rt.block_on(l.check_n(key, 1)) {
                Err(RedisLimitError::Redis(e)) => assert!(!e.to_string().is_empty()),
                other => panic!("{algorithm:?} on {key}: a Redis error expected, got {other:?}"),
            }
        }
    }
}

/// A window state of period 0 (no policy has one: only foreign or corrupt data) is a
/// malformed state, named as such, and the call writes nothing.
#[test]
fn a_window_state_of_period_zero_is_malformed() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    for (algorithm, state) in [
        (Algorithm::FixedWindow, "5:1:0"),
        (Algorithm::SlidingWindow, "5:0:1:0"),
    ] {
        let l = limiter(
            &rt,
            &server,
            algorithm,
            policy(),
            OnFailure::Error,
            Duration::from_secs(5),
        );
        let _: () = server.cmd(&["SET", "test:zero", state]);
        match rt.block_on(l.check_n("zero", 1)) {
            Err(RedisLimitError::Redis(e)) => {
                assert!(e.to_string().contains("malformed"), "{algorithm:?}: {e}");
            }
            other => panic!("{algorithm:?} on period 0: a malformed state expected, got {other:?}"),
        }
        let kept: String = server.cmd(&["GET", "test:zero"]);
        assert_eq!(kept, state, "{algorithm:?}: the call wrote");
    }
}

/// A server busy running another client's slow script answers `BUSY` until that
/// script ends: the same call succeeds later, so the error is retryable.
#[test]
fn a_server_busy_with_a_slow_script_is_a_retryable_error() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let slow = Duration::from_secs(5);
    let l = limiter(
        &rt,
        &server,
        Algorithm::Gcra,
        policy(),
        OnFailure::Error,
        slow,
    );
    until_decided(&rt, &l, slow);
    // Others get BUSY once a script has run 10 ms; this one runs until killed.
    let _: () = server.cmd(&["CONFIG", "SET", "busy-reply-threshold", "10"]);
    let mut spin = send_raw(&server, &["EVAL", "while 1 do end", "0"]);
    std::thread::sleep(Duration::from_millis(100));

    let e = rt.block_on(l.check_n("k", 1)).unwrap_err();
    assert!(e.to_string().contains("BUSY"), "{e}");
    assert!(e.is_retryable(), "{e}");

    // SCRIPT KILL on a raw connection (a client's PING would be BUSY too).
    let mut ok = [0_u8; 5];
    send_raw(&server, &["SCRIPT", "KILL"])
        .read_exact(&mut ok)
        .unwrap();
    assert_eq!(&ok, b"+OK\r\n");
    let mut killed = [0_u8; 1];
    spin.read_exact(&mut killed).unwrap();
    assert_eq!(&killed, b"-", "the slow script ends in an error");
    until_decided(&rt, &l, slow);
}

/// Sends `args` as one command on a new raw connection, for commands that block the
/// server or must pass while it is blocked; the reply is left to read.
fn send_raw(server: &RedisServer, args: &[&str]) -> TcpStream {
    let addr = server.url();
    let addr = addr.trim_start_matches("redis://").trim_end_matches('/');
    let mut command = format!("*{}\r\n", args.len());
    for a in args {
        command.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.write_all(command.as_bytes()).unwrap();
    raw
}

/// `SCRIPT FLUSH` over and over while 32 tasks hammer one key: every `NOSCRIPT` is
/// reloaded and run once — the burst is admitted exactly, never once more. (A call
/// whose every reload was flushed again fails `NOSCRIPT`, uncharged.)
#[test]
fn script_flushes_under_load_neither_fail_nor_double_charge() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let burst = 50;
    let daily = Policy::per_day(1)
        .and_then(|p| p.with_burst(burst))
        .unwrap();
    let slow = Duration::from_secs(10);
    let l = limiter(&rt, &server, Algorithm::Gcra, daily, OnFailure::Error, slow);
    until_decided(&rt, &l, slow);
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    // Flushed before the flood: its first call meets NOSCRIPT on every schedule,
    // though the flusher thread may start only after the flood has ended (its
    // first flush came after the 640 calls: no NOSCRIPT, no flush).
    let _: () = server.cmd(&["SCRIPT", "FLUSH"]);
    let flushing = Arc::new(AtomicBool::new(true));
    let flusher = {
        let (flushing, mut conn) = (Arc::clone(&flushing), server.connection().unwrap());
        std::thread::spawn(move || {
            while flushing.load(Ordering::SeqCst) {
                redis::cmd("SCRIPT").arg("FLUSH").exec(&mut conn).unwrap();
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let no_script = |e: &RedisLimitError| matches!(e, RedisLimitError::Redis(e) if e.kind() == redis::ErrorKind::NoScriptError);
    let admitted = flood(&rt, vec![l], "flushed", (32, 20), |_, _| 1, no_script);
    flushing.store(false, Ordering::SeqCst);
    flusher.join().unwrap();
    let errors: String = server.cmd(&["INFO", "errorstats"]);
    assert!(
        errors.contains("errorstat_NOSCRIPT:count="),
        "no call met a flushed cache: {errors}"
    );
    assert_eq!(admitted, burst, "640 calls, a burst of {burst}");
}

/// A multi-limit call whose second key holds what the scripts did not write fails
/// before charging any: the first key stays as it was.
#[test]
fn a_malformed_key_of_several_charges_none() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let builder = RedisLimiter::builder(Algorithm::Gcra, policy())
        .and(Algorithm::FixedWindow, policy())
        .and(Algorithm::SlidingLog, policy())
        .timeout(Duration::from_secs(5))
        .on_failure(OnFailure::Error);
    let l = build(&rt, &server, builder);
    for (bad, value) in [(1, "12:x"), (2, "not a sorted set"), (1, "9:9")] {
        let _: () = server.cmd(&["FLUSHALL"]);
        let keys = l.redis_keys("u");
        let _: () = server.cmd(&["SET", &keys[bad], value]);
        match rt.block_on(l.check_n("u", 1)) {
            Err(RedisLimitError::Redis(e)) => assert!(!e.to_string().is_empty()),
            other => panic!("key {bad} = {value:?}: a Redis error expected, got {other:?}"),
        }
        assert_eq!(
            server.cmd::<i64>(&["DBSIZE"]),
            1,
            "key {bad} = {value:?}: another key was charged"
        );
    }
}

/// A multi-limit call whose sliding log would count its totals again (past 2^52)
/// reads the whole log in its dry run, before anything is written: a denial by
/// another limit leaves the log as it was, and a malformed member deep inside the
/// log fails the call before any key is charged.
#[test]
fn a_log_counted_again_in_a_dry_run_writes_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let day_us: u64 = 86_400_000_000;
    let builder = RedisLimiter::builder(Algorithm::SlidingLog, Policy::per_second(10).unwrap())
        .and(Algorithm::FixedWindow, Policy::per_day(1).unwrap())
        .timeout(Duration::from_secs(5))
        .on_failure(OnFailure::Error);
    let l = build(&rt, &server, builder);
    let keys = l.redis_keys("u");
    // 5 units live at t, t + 1 and t + 2 µs; the newest total is 2^52, so the next
    // admission counts the totals again.
    let t: u64 = 1_796_083_200_000_000;
    let top = 1_u64 << 52;
    let log = |middle: &str| -> Vec<String> {
        let _: () = server.cmd(&["FLUSHALL"]);
        let members = [
            (t, format!("{t}:3:{}", top - 2)),
            (t + 1, middle.to_owned()),
            (t + 2, format!("{}:1:{top}", t + 2)),
        ];
        for (at, member) in members {
            let _: i64 = server.cmd(&["ZADD", &keys[0], &at.to_string(), &member]);
        }
        server.cmd(&["ZRANGE", &keys[0], "0", "-1", "WITHSCORES"])
    };
    let now = t + 3;

    // The day's one unit is spent: denied, and neither key changes.
    let written = log(&format!("{}:1:{}", t + 1, top - 1));
    let full = format!("{}:1:{day_us}", now / day_us);
    let _: () = server.cmd(&["SET", &keys[1], &full]);
    let d = rt.block_on(l.check_n_at_micros("u", 1, now)).unwrap();
    assert!(!d.is_allowed(), "{d:?}");
    let after: Vec<String> = server.cmd(&["ZRANGE", &keys[0], "0", "-1", "WITHSCORES"]);
    assert_eq!(after, written, "a denied call rewrote the log");
    assert_eq!(server.cmd::<String>(&["GET", &keys[1]]), full);

    // A malformed member among the live ones: met by the dry run's recount, so the
    // call fails with the fixed window uncharged and the log as it was.
    let written = log("not-a-member");
    match rt.block_on(l.check_n_at_micros("u", 1, now)) {
        Err(RedisLimitError::Redis(e)) => assert!(e.to_string().contains("malformed"), "{e}"),
        other => panic!("a malformed log must fail the call: {other:?}"),
    }
    let after: Vec<String> = server.cmd(&["ZRANGE", &keys[0], "0", "-1", "WITHSCORES"]);
    assert_eq!(after, written, "a failed call rewrote the log");
    assert_eq!(server.cmd::<i64>(&["EXISTS", &keys[1]]), 0, "charged");
}
