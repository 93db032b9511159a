//! Second adversarial review of the window-start rule (session 49, "rev2"): every
//! window state is judged no earlier than its stored window's start (`judged_at`
//! in common.lua), with the latest reading on or off. Policy switches there and
//! back on a clock behind, and a switch charged at the window's start and
//! refunded. See VERIFICATION.md, "session 49: review of the window-start rule
//! (rev2)".

mod common;

use common::readings::{admits, fill, limiter, state, WINDOWS};
use common::{runtime, RedisServer};
use floodgate_redis::{Algorithm, RedisLimiter};

const S: u64 = 1_000_000;
/// 2026-12-01 00:00:00 in µs since the epoch: a multiple of 12 s.
const T: u64 = 1_796_083_200_000_000;
/// A's clock: 10 ms into A's window [6 s, 12 s) of 6 s.
const AHEAD: u64 = T + 6_010_000;
/// The clock behind: in A's window [0 s, 6 s) and B's [0 s, 4 s).
const BEHIND: u64 = T + S;

/// Limiters A (6 s) and B (4 s) of `algorithm`, 10 each, after A admitted 5 on
/// `key` at `AHEAD`.
fn a_ahead_then_b(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    algorithm: Algorithm,
    readings: bool,
    refunds: bool,
    key: &str,
) -> (RedisLimiter, RedisLimiter) {
    let a = limiter(rt, server, algorithm, 6, readings, refunds);
    let b = limiter(rt, server, algorithm, 4, readings, refunds);
    for _ in 0..5 {
        assert!(admits(rt, &a, key, AHEAD));
    }
    (a, b)
}

/// A switch there and back on a clock behind (A 6 s, B 4 s, 10 each): A admits 5
/// at 6.01 s; a replica whose clock reads 1 s admits one unit under B, then fills
/// under A; then A fills at 6.01 s again. The window-start rule judges B's switch
/// at 6 s, the start of A's window, but B's window holding the units is [4 s, 8 s),
/// so A's switch back is judged at 4 s and counts them in A's window [0 s, 6 s),
/// behind the window they were admitted in: at 6.01 s A starts fresh. With the
/// latest reading both switches are judged at 6.01 s and A's window [6 s, 12 s)
/// keeps all 10 (4 admitted behind, none at 6.01 s). Without it the fixed window
/// admits 10 more at 6.01 s (20 units within A's window of 10: the crate docs'
/// "up to the new limit more within one window"; the window that forgets is the
/// longer one, A's own), the sliding window 1 (A's 10 fade one period early).
///
/// Mutation seen failing: `judged_at` ignoring the reading `r` (the option-on
/// loop: 10 and 1 at 6.01 s).
#[test]
fn a_round_trip_behind_keeps_the_old_window_with_the_field() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    for readings in [true, false] {
        for algorithm in WINDOWS {
            let key = format!("trip-{algorithm:?}-{readings}");
            let (a, b) = a_ahead_then_b(&rt, &server, algorithm, readings, false, &key);
            assert!(admits(&rt, &b, &key, BEHIND), "{key}: B admits one");
            let behind = fill(&rt, &a, &key, BEHIND);
            assert_eq!(behind, 4, "{key}: the 6 units count under A behind");
            let ahead = fill(&rt, &a, &key, AHEAD);
            let s = state(&server, &format!("test:{key}"));
            if readings {
                assert_eq!(ahead, 0, "{key}: A's window forgot its units: {s}");
            } else {
                // The documented bound without the field: at most the limit more.
                let expected = match algorithm {
                    Algorithm::FixedWindow => 10,
                    _ => 1,
                };
                assert_eq!(ahead, expected, "{key}: {s}");
            }
        }
    }
}

/// A switch charged on a clock behind the stored window's start, with the option
/// off (no field: judged at the start alone): its receipt names the new period's
/// window of that start, which the state holds, and the refund gives back. A (6 s)
/// admits 5 at 6.01 s; B (4 s) charges 3 at 1 s, judged at 6 s (window [4 s, 8 s))
/// and refunds it at 1 s: 5 fit again (A's 5 carried). A receipt naming the window
/// of the clock behind ([0 s, 4 s)) would give back nothing (2 fit).
///
/// Mutation seen failing: either script's receipt naming `fdiv(now, p)`.
#[test]
fn a_switch_charged_at_the_window_start_is_refunded() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    for algorithm in WINDOWS {
        let key = format!("refund-{algorithm:?}");
        let (_, b) = a_ahead_then_b(&rt, &server, algorithm, false, true, &key);
        let (d, r) = rt.block_on(b.charge_n_at_micros(&key, 3, BEHIND)).unwrap();
        assert!(d.is_allowed(), "{key}: {d:?}");
        let back = rt.block_on(b.refund_at_micros(&r.unwrap(), BEHIND));
        assert!(matches!(back, Ok(true)), "{key}: {back:?}");
        let s = state(&server, &format!("test:{key}"));
        assert!(!s.contains('@'), "{key}: a field with the option off: {s}");
        assert_eq!(fill(&rt, &b, &key, BEHIND), 5, "{key}: {s}");
    }
}

/// Without the field, a switch read behind the stored window's start is judged at
/// that start: A (6 s) admits 5 at 6.01 s (window [6 s, 12 s)); B (2 s) fills at
/// 5.99 s, 6 s and 7.99 s, judged at 6 s, in its window [6 s, 8 s) on top of A's 5:
/// 5 in all. Judged at the clock behind, B's window [4 s, 6 s) counted A's 5 and
/// forgot them at 6 s (the fixed window; the sliding window once its previous
/// window faded, at 7.99 s): 15.
///
/// Mutation seen failing: `judged_at` without the window start (15, either
/// script).
#[test]
fn a_switch_behind_the_window_start_is_judged_there_without_the_field() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    for algorithm in WINDOWS {
        let key = format!("start-{algorithm:?}");
        let a = limiter(&rt, &server, algorithm, 6, false, false);
        let b = limiter(&rt, &server, algorithm, 2, false, false);
        for _ in 0..5 {
            assert!(admits(&rt, &a, &key, AHEAD));
        }
        let got: u64 = [T + 5_990_000, T + 6 * S, T + 7_990_000]
            .iter()
            .map(|&at| fill(&rt, &b, &key, at))
            .sum();
        let s = state(&server, &format!("test:{key}"));
        assert_eq!(got, 5, "{key}: {s}");
        assert!(!s.contains('@'), "{key}: a field with the option off: {s}");
    }
}
