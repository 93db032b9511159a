//! Session 39's review of the scripts' malformed-state checks for false positives:
//! no state a legitimate run writes may be refused as malformed (a refusal is an
//! outage for every request on that key, or an open door under
//! `OnFailure::Open`). Runs what a deployment does: two policies of different
//! periods and limits on the same keys at once (a rolling deploy), readings that
//! step back, costs from 0 past the limit, near the end of the exact range, and a
//! sliding log whose running totals reached 2^52 after a long uptime.

mod common;

use std::time::Duration;

use common::{runtime, RedisServer};
use floodgate::Policy;
use floodgate_redis::{Algorithm, OnFailure, RedisLimiter};
use tokio::runtime::Runtime;

/// 2026-12-01 in µs since the epoch.
const NOW: u64 = 1_796_083_200_000_000;
/// 2^52 µs: the latest time a script accepts.
const END: u64 = 1 << 52;

/// A limiter of `policy` on `server` (driven by `rt`) that returns every failure
/// as an error.
fn strict(rt: &Runtime, server: &RedisServer, a: Algorithm, policy: Policy) -> RedisLimiter {
    let builder = RedisLimiter::builder(a, policy).on_failure(OnFailure::Error);
    common::build(rt, server, builder.timeout(Duration::from_secs(5)))
}

/// A splitmix64 stream: the same trace on every run.
struct Trace(u64);

impl Trace {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % below
    }
}

/// Two policies on the same key, called alternately at random (steps of 0 to 3
/// periods of the shorter, a fifth of them back by up to a period), costs 0 to the
/// limit + 1, from `start` up to at most `last`: every call decides.
fn rolling_deploy(server: &RedisServer, a: Algorithm, start: u64, last: u64, seed: u64) {
    let rt = runtime();
    let (short, long) = (1_000_000u64, 7_300_000u64);
    let old = strict(
        &rt,
        server,
        a,
        Policy::new(5, Duration::from_micros(short)).unwrap(),
    );
    let new = strict(
        &rt,
        server,
        a,
        Policy::new(40, Duration::from_micros(long)).unwrap(),
    );
    let _: () = server.cmd(&["FLUSHALL"]);
    let mut trace = Trace(seed);
    let mut now = start;
    for call in 0..600 {
        let step = trace.next(3 * short);
        now = if trace.next(5) == 0 {
            now.saturating_sub(trace.next(short))
        } else {
            now.saturating_add(step).min(last)
        };
        let (which, l) = if trace.next(2) == 0 {
            ("old", &old)
        } else {
            ("new", &new)
        };
        let cost = trace.next(7) as u32;
        let key = ["k", "j"][trace.next(2) as usize];
        if let Err(e) = rt.block_on(l.check_n_at_micros(key, cost, now)) {
            panic!("{a:?}, seed {seed}, call {call} ({which}, {key}, cost {cost}, at {now}): {e}");
        }
    }
}

/// A rolling deploy of a period change, mid-range and at the end of the exact
/// range: every call of either policy decides. Mutation seen failing it: the
/// windows' 2^53 bound lowered to the end of the range (`(sw + 1) * sp >= EXACT`
/// → `>= 4503599627370496` in `fixed_window.lua`: "window ends past 2^53 us").
#[test]
fn a_rolling_deploy_never_meets_a_malformed_state() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    for a in common::ALGORITHMS {
        for seed in 0..4 {
            rolling_deploy(&server, a, NOW, u64::MAX, seed);
            rolling_deploy(&server, a, END - 60_000_000, END, seed);
        }
    }
}

/// A sliding log that has admitted close to 2^52 units in its life (its running
/// totals there, as the script writes them), then called by two periods: the
/// totals pass 2^52 and count again from the oldest live member — every call
/// decides (the newest total reaches exactly 2^52 before the rebase), and the
/// per-second policy admits no more than 5 within any second. Mutation seen
/// failing it: the member's total bound at 2^52 instead of 2^53 (`t >= EXACT` →
/// `t > 4503599627370495` in `sliding_log.lua`: "member not instant:units:total").
#[test]
fn a_log_whose_totals_pass_2_pow_52_still_decides() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let second = strict(
        &rt,
        &server,
        Algorithm::SlidingLog,
        Policy::per_second(5).unwrap(),
    );
    let minute = strict(
        &rt,
        &server,
        Algorithm::SlidingLog,
        Policy::per_minute(9).unwrap(),
    );
    let _: () = server.cmd(&["FLUSHALL"]);
    // Two live members; the newest total 3 below 2^52.
    let near = END - 3;
    for (at, units, total) in [(NOW - 500_000, 1, near - 2), (NOW - 1_000, 2, near)] {
        let member = format!("{at}:{units}:{total}");
        let _: i64 = server.cmd(&["ZADD", "test:k", &at.to_string(), &member]);
    }
    let mut admitted = Vec::new();
    for (i, now) in (0..40u64).map(|i| (i, NOW + i * 50_000)) {
        let l = if i % 3 == 0 { &minute } else { &second };
        let d = rt
            .block_on(l.check_n_at_micros("k", 1, now))
            .unwrap_or_else(|e| panic!("call {i} at {now}: {e}"));
        if d.is_allowed() && i % 3 != 0 {
            admitted.push(now);
        }
    }
    // The per-second policy: at most 5 of its own (and the planted 3) in any second.
    for (j, &at) in admitted.iter().enumerate() {
        let within = admitted[j..]
            .iter()
            .take_while(|&&t| t < at + 1_000_000)
            .count();
        assert!(within <= 5, "{within} admitted within a second from {at}");
    }
}
