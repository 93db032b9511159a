//! Hostile states planted under the limiter's prefix: what no script writes (a
//! sliding log whose running totals fall, times far past the scripts' exact range,
//! a GCRA state that is not a whole number). Each is a malformed-state error that
//! names the key and writes nothing; none admits beyond the limit, and none comes
//! back as an unreadable reply.

mod common;

use std::time::Duration;

use common::{limiter, runtime, RedisServer};
use floodgate::Policy;
use floodgate_redis::{Algorithm, OnFailure, RedisLimitError, RedisLimiter};

/// A time the given-time script runs at (2026-12-01, in µs since the epoch).
const NOW: u64 = 1_796_083_200_000_000;
const LIMIT: u64 = 5;

/// A limiter on `server` that returns every failure as an error.
fn strict(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    a: Algorithm,
    policy: Policy,
) -> RedisLimiter {
    limiter(
        rt,
        server,
        a,
        policy,
        OnFailure::Error,
        Duration::from_secs(5),
    )
}

fn per_second(a: Algorithm, rt: &tokio::runtime::Runtime, server: &RedisServer) -> RedisLimiter {
    strict(rt, server, a, Policy::per_second(LIMIT).unwrap())
}

/// Checks `key` `calls` times at [`NOW`]: each call must fail as a malformed state
/// naming the key (never a decision, never an unreadable reply).
fn all_malformed(rt: &tokio::runtime::Runtime, l: &RedisLimiter, what: &str, calls: usize) {
    for i in 0..calls {
        match rt.block_on(l.check_n_at_micros("k", 1, NOW)) {
            Err(RedisLimitError::Redis(e)) => {
                let e = e.to_string();
                assert!(
                    e.contains("malformed") && e.contains("test:k"),
                    "{what}, call {i}: {e}"
                );
            }
            other => panic!("{what}, call {i}: a malformed state expected, got {other:?}"),
        }
    }
}

/// Every live member's running total must be at least the one before it: a log
/// whose newest total is below its oldest one counted a negative number of units
/// and admitted every call (20 of 20 under a limit of 5). Mutations that fail it:
/// dropping either half of the totals check in `sliding_log.lua`, or the check that
/// a member's units are within its total.
#[test]
fn a_log_whose_totals_fall_is_malformed_and_admits_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let l = per_second(Algorithm::SlidingLog, &rt, &server);
    let plant = |members: &[(u64, String)]| -> Vec<String> {
        let _: () = server.cmd(&["DEL", "test:k"]);
        for (at, member) in members {
            let _: i64 = server.cmd(&["ZADD", "test:k", &at.to_string(), member]);
        }
        server.cmd(&["ZRANGE", "test:k", "0", "-1", "WITHSCORES"])
    };
    let (a, b) = (NOW - 10, NOW - 5);
    for members in [
        // The newest total below the oldest: -85 units in the window.
        vec![(a, format!("{a}:5:100")), (b, format!("{b}:5:10"))],
        // The newest total below the oldest, yet above its own units: 3 − 0 = 3
        // counted, but the oldest alone holds 5.
        vec![(a, format!("{a}:5:5")), (b, format!("{b}:1:3"))],
        // The newest total below its own units plus the units before the oldest
        // (9 units before the oldest; 12 − 9 = 3 counted, but the newest holds 5).
        vec![(a, format!("{a}:1:10")), (b, format!("{b}:5:12"))],
        // One member holding more units than its total.
        vec![(a, format!("{a}:5:2"))],
    ] {
        let planted = plant(&members);
        all_malformed(&rt, &l, &format!("{members:?}"), 20);
        let after: Vec<String> = server.cmd(&["ZRANGE", "test:k", "0", "-1", "WITHSCORES"]);
        assert_eq!(after, planted, "{members:?}: a failed call wrote the log");
    }
}

/// A state holding a time at or past 2^53 µs (the scripts' exact range; no script
/// writes one) is malformed. Before, a window state of a far-future window was
/// charged and then answered with a reply Rust could not read (the reset, past
/// `i64`, came back negative) — under `OnFailure::Open` an admission on every call;
/// a GCRA state of `1e300` gave the same unreadable reply; a log's totals past 2^53
/// round. Mutation that fails it: dropping the 2^53 bound in any of the four
/// transitions, or on a log member's total.
#[test]
fn states_past_the_exact_range_are_malformed_and_charge_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let huge = "99999999999999999999999";
    let window_past = (1_u64 << 53) / 1_000_000; // (w + 1)·P just past 2^53 µs
    for (algorithm, state) in [
        (Algorithm::Gcra, huge.to_owned()),
        (Algorithm::Gcra, "1e300".to_owned()),
        (Algorithm::Gcra, (1_u64 << 53).to_string()),
        (Algorithm::FixedWindow, format!("{huge}:0:1000000")),
        (Algorithm::FixedWindow, format!("{window_past}:0:1000000")),
        (Algorithm::FixedWindow, format!("0:0:{huge}")),
        (Algorithm::SlidingWindow, format!("{huge}:0:0:1000000")),
        (
            Algorithm::SlidingWindow,
            format!("{window_past}:0:0:1000000"),
        ),
        (Algorithm::SlidingWindow, format!("0:0:0:{huge}")),
    ] {
        let l = per_second(algorithm, &rt, &server);
        let _: () = server.cmd(&["SET", "test:k", &state]);
        all_malformed(&rt, &l, &format!("{algorithm:?} {state}"), 7);
        let after: String = server.cmd(&["GET", "test:k"]);
        assert_eq!(after, state, "{algorithm:?}: a failed call wrote the state");
    }
    // The log: a member scored past the range (its name agrees with the score), or
    // with a running total past it (the script counts its totals again past 2^52;
    // past 2^53 they round, and a count of 4 units can read as 2).
    let l = per_second(Algorithm::SlidingLog, &rt, &server);
    let live = (NOW - 5).to_string();
    let top = 1_u64 << 53;
    for (at, member) in [
        (huge.to_owned(), format!("{huge}:1:1")),
        (top.to_string(), format!("{top}:1:1")),
        ("inf".to_owned(), "inf:1:1".to_owned()),
        (live.clone(), format!("{live}:1:{top}")),
        (live.clone(), format!("{live}:1:{huge}")),
    ] {
        let _: () = server.cmd(&["DEL", "test:k"]);
        let _: i64 = server.cmd(&["ZADD", "test:k", &at, &member]);
        all_malformed(&rt, &l, &format!("log member {member}"), 7);
        let members: i64 = server.cmd(&["ZCARD", "test:k"]);
        assert_eq!(
            members, 1,
            "log member {member}: a failed call wrote the log"
        );
    }
}

/// The windows read only `digits:digits:...`; a GCRA state must be digits too.
/// Before, `nan`, `-5`, `1.5`, ` 5` or `0x10` were read as numbers (`nan` and the
/// negative one as a fresh key). Mutation that fails it: reading the GCRA state
/// with a bare `tonumber`.
#[test]
fn a_gcra_state_that_is_not_a_whole_number_is_malformed() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let l = per_second(Algorithm::Gcra, &rt, &server);
    for state in ["nan", "inf", "-5", "1.5", " 5", "0x10", "5 ", ""] {
        let _: () = server.cmd(&["SET", "test:k", state]);
        all_malformed(&rt, &l, &format!("{state:?}"), 3);
        let after: String = server.cmd(&["GET", "test:k"]);
        assert_eq!(after, state, "{state:?}: a failed call wrote the state");
    }
}

/// The bound is not too tight: the latest state a policy can write at the end of
/// the exact range (2^52 µs, the most a time may be) still decides, for each
/// algorithm, with the widest span the builder accepts. Mutation that fails it: a
/// bound of 2^52 in place of 2^53.
#[test]
fn the_latest_legitimate_states_still_decide() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let end = 1_u64 << 52;
    // 2^50 µs per unit, burst 2: B·T = 2^51 µs, the widest span accepted.
    let span = Duration::from_micros(1 << 50);
    for algorithm in common::ALGORITHMS {
        let policy = match algorithm {
            Algorithm::Gcra => Policy::new(1, span).unwrap().with_burst(2).unwrap(),
            // 2·P ≤ 2^51 µs.
            _ => Policy::new(2, span).unwrap(),
        };
        let l = strict(&rt, &server, algorithm, policy);
        let _: () = server.cmd(&["FLUSHALL"]);
        for i in 0..3 {
            let d = rt
                .block_on(l.check_n_at_micros("k", 1, end))
                .unwrap_or_else(|e| panic!("{algorithm:?}, call {i}: {e}"));
            assert_eq!(d.is_allowed(), i < 2, "{algorithm:?}, call {i}: {d:?}");
        }
    }
}
