//! The windows' latest reading (`RedisLimiterBuilder::latest_reading`, session
//! 49): the field's form, who writes it and who keeps it, how a reading behind it
//! is judged and answered, what is refused as malformed, and that a version from
//! before it cannot read a key that has it (why the option is off by default).
//! The over-admission it closes is `review_s48_policy.rs`'s
//! `a_clock_behind_a_switch_is_judged_at_the_latest_reading`.

mod common;

use std::time::Duration;

use common::readings::{admits, fill, limiter, state, WINDOWS};
use common::s47::COMMON_S47;
use common::s48::FIXED_WINDOW_S48;
use common::{eval, runtime, with_refunds, RedisServer, GIVEN_TIME};
use floodgate::Policy;
use floodgate_redis::{Algorithm, RedisLimitError};

/// A time the given-time script runs at (2026-12-01 00:00:02, in µs since the
/// epoch): the start of a window of 2 s.
const T0: u64 = 1_796_083_202_000_000;
const S: u64 = 1_000_000;
/// With the option off no write adds the field (checks, charges with receipts,
/// refunds: a key an older version reads); with it on every admission writes the
/// later of the field and its reading, and a peek writes nothing. A limiter with
/// the option off keeps, and raises, a field it finds. Mutations seen failing:
/// `reading_field` writing the field without the option; the refund dropping the
/// field; either script judging at now (the field then falls back).
#[test]
fn only_the_option_adds_the_field_and_every_write_keeps_it() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    for algorithm in WINDOWS {
        for refunds in [false, true] {
            let key = format!("form-{algorithm:?}-{refunds}");
            let redis_key = format!("test:{key}");
            let off = limiter(&rt, &server, algorithm, 2, false, refunds);
            let on = limiter(&rt, &server, algorithm, 2, true, refunds);
            let (_, receipt) = rt.block_on(off.charge_n_at_micros(&key, 1, T0)).unwrap();
            assert!(admits(&rt, &off, &key, T0 + 1));
            if let Some(r) = receipt {
                assert!(rt.block_on(off.refund_at_micros(&r, T0 + 2)).unwrap());
            }
            let plain = state(&server, &redis_key);
            assert!(!plain.contains('@'), "{key}: {plain}");
            assert!(admits(&rt, &on, &key, T0 + 50));
            let s = state(&server, &redis_key);
            assert!(s.ends_with(&format!("@{}", T0 + 50)), "{key}: {s}");
            assert!(rt
                .block_on(on.peek_n_at_micros(&key, 1, T0 + 60))
                .unwrap()
                .is_allowed());
            // Behind the field: it stays; ahead, it moves, whoever writes.
            assert!(admits(&rt, &on, &key, T0 + 40));
            assert!(state(&server, &redis_key).ends_with(&format!("@{}", T0 + 50)));
            assert!(admits(&rt, &off, &key, T0 + 70));
            let s = state(&server, &redis_key);
            assert!(s.ends_with(&format!("@{}", T0 + 70)), "{key}: {s}");
            if refunds {
                let (d, r) = rt
                    .block_on(on.charge_n_at_micros(&key, 2, T0 + 80))
                    .unwrap();
                assert!(d.is_allowed());
                let before = state(&server, &redis_key);
                assert!(rt
                    .block_on(on.refund_at_micros(&r.unwrap(), T0 + 90))
                    .unwrap());
                let after = state(&server, &redis_key);
                assert_ne!(before, after, "{key}: the refund wrote nothing");
                assert!(after.ends_with(&format!("@{}", T0 + 80)), "{key}: {after}");
            }
        }
    }
    // Several limits: each window key gets its own field.
    let policy = Policy::new(10, Duration::from_secs(2)).unwrap();
    let b = common::builder(Algorithm::FixedWindow, policy)
        .and(Algorithm::SlidingWindow, policy)
        .latest_reading(true);
    let multi = with_refunds(&rt, &server, b, false);
    assert!(admits(&rt, &multi, "multi", T0 + 5));
    for k in multi.redis_keys("multi") {
        let s = state(&server, &k);
        assert!(s.ends_with(&format!("@{}", T0 + 5)), "{k}: {s}");
    }
}

/// A reading behind the field is judged at it (the sliding window weighs its
/// previous window there) and answers its waits from now. Sliding window, 10 in 2
/// s: 10 admitted at 1 s; at 3 s the previous window weighs 5 and 5 more fit; at
/// 3.6 s it weighs 2 and one more is admitted (the field: 3.6 s); a reading of 3 s
/// is then judged at 3.6 s, where 2 more fit (at 3 s: none). Its denial's wait
/// runs from now to where the weight lets one more in (3.6 s and a µs: 0.6 s; at
/// 3 s the wait would be 0.2 s). A fixed window reading 20 ms behind a switch's
/// latest admission counts it in that admission's window and waits for its end,
/// from now. Mutations seen failing: either script judged at now.
#[test]
fn a_reading_behind_the_field_is_judged_at_it_and_waits_from_now() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let on = limiter(&rt, &server, Algorithm::SlidingWindow, 2, true, false);
    let off = limiter(&rt, &server, Algorithm::SlidingWindow, 2, false, false);
    for (l, fits, wait) in [(&on, 2, 600_001), (&off, 0, 200_001)] {
        let key = format!("behind-{fits}");
        assert_eq!(fill(&rt, l, &key, T0 + S), 10);
        assert_eq!(fill(&rt, l, &key, T0 + 3 * S), 5);
        assert!(admits(&rt, l, &key, T0 + 3_600_000));
        assert_eq!(fill(&rt, l, &key, T0 + 3 * S), fits, "{key}");
        let d = rt
            .block_on(l.check_n_at_micros(&key, 1, T0 + 3 * S))
            .unwrap();
        assert!(!d.is_allowed());
        assert_eq!(
            d.retry_after(),
            Some(Duration::from_micros(wait)),
            "{key}: {d:?}"
        );
    }
    // A fixed window of 2 s after one of 6 s: A admits at 4.01 s, B reads 3.99 s.
    let a = common::builder(
        Algorithm::FixedWindow,
        Policy::new(10, Duration::from_secs(6)).unwrap(),
    )
    .latest_reading(true);
    let a = with_refunds(&rt, &server, a, false);
    let b = limiter(&rt, &server, Algorithm::FixedWindow, 2, true, false);
    let t = T0 - 2 * S + 600 * S; // a multiple of 6 s
    assert_eq!(t % (6 * S), 0);
    assert!(admits(&rt, &a, "switch", t + 4_010_000));
    let d = rt
        .block_on(b.check_n_at_micros("switch", 1, t + 3_990_000))
        .unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 8, "A's unit counts in B's window [4 s, 6 s)");
    assert_eq!(d.reset_after(), Duration::from_micros(2_010_000), "{d:?}");
}

/// A field that is not `@digits` after the state, or a time past 2^52 µs (as the
/// scripts refuse a `now`: the windows' sums on it must stay below 2^53), is a
/// malformed state: an error naming the key, with the option on or off, and nothing
/// written; 2^52 itself is read. Mutations seen failing: `window_reading` without
/// its bound, or with the bound at 2^53.
#[test]
fn a_malformed_reading_is_refused_and_writes_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let top = (1_u64 << 52) + 1;
    let w = T0 / (2 * S);
    for (algorithm, fields) in [
        (Algorithm::FixedWindow, format!("{w}:1:2000000")),
        (Algorithm::SlidingWindow, format!("{w}:0:1:2000000")),
    ] {
        for tail in [
            "@".to_owned(),
            "@x".to_owned(),
            "@-5".to_owned(),
            "@1@2".to_owned(),
            "@1.5".to_owned(),
            format!("@{top}"),
            format!("@{}", 1_u64 << 53),
            "@7:0:0:5:".to_owned(),
            ":0:0:5:@7:".to_owned(),
        ] {
            let planted = format!("{fields}{tail}");
            for readings in [false, true] {
                let l = limiter(&rt, &server, algorithm, 2, readings, true);
                let _: () = server.cmd(&["SET", "test:k", &planted]);
                match rt.block_on(l.check_n_at_micros("k", 1, T0)) {
                    Err(RedisLimitError::Redis(e)) => {
                        let e = e.to_string();
                        assert!(
                            e.contains("malformed") && e.contains("test:k"),
                            "{planted}: {e}"
                        );
                    }
                    other => panic!("{planted}: a malformed state expected, got {other:?}"),
                }
                assert_eq!(state(&server, "test:k"), planted);
            }
        }
        // The field after the refund fields, empty receipts included, is read.
        let fine = format!("{fields}:0:0:5:@{}", T0 + 9);
        let l = limiter(&rt, &server, algorithm, 2, false, true);
        let _: () = server.cmd(&["SET", "test:k", &fine]);
        assert!(admits(&rt, &l, "k", T0));
        let s = state(&server, "test:k");
        assert!(s.ends_with(&format!(":0:0:5:@{}", T0 + 9)), "{s}");
        // The latest time a reading may be: read, and judged there.
        let last = 1_u64 << 52;
        let _: () = server.cmd(&["SET", "test:k", &format!("{fields}@{last}")]);
        assert!(admits(&rt, &l, "k", T0));
        let s = state(&server, "test:k");
        assert!(s.starts_with(&format!("{}:", last / (2 * S))), "{s}");
    }
}

/// Why the option is off by default: the scripts before it (the fixed window's
/// of sessions 46 to 48 on session 47's helpers, `tests/fixtures`) read a window
/// key that has the field as malformed. Mutation
/// seen failing: none possible (a fixture); it pins the documented rollout.
#[test]
fn a_version_before_the_field_refuses_a_key_that_has_it() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let driver = "return fixed_window(KEYS[1], tonumber(ARG[1]), ARG[2] == '1', \
                  tonumber(ARG[3]), tonumber(ARG[4]))\n";
    let old = [GIVEN_TIME, COMMON_S47, FIXED_WINDOW_S48, driver].concat();
    let w = T0 / (2 * S);
    let args = [T0, 1, 1, 2 * S, 10];
    let _: () = server.cmd(&["SET", "plain", &format!("{w}:1:2000000")]);
    assert!(eval(&server, &old, "plain", &args).is_ok());
    let _: () = server.cmd(&["SET", "field", &format!("{w}:1:2000000@{T0}")]);
    let e = eval(&server, &old, "field", &args).unwrap_err().to_string();
    assert!(e.contains("malformed"), "{e}");
}
