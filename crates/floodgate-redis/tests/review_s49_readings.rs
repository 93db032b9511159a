//! Adversarial review of the windows' latest reading
//! (`RedisLimiterBuilder::latest_reading`, session 49, "revwin"): readings the
//! reader accepts but no script writes, a reading a script writes that its refund
//! then refuses, replicas with and without the option on one key, keys' time to
//! live under the server's clock when the field is ahead of it, and a key written
//! before the option whose first field is behind its own window. See
//! VERIFICATION.md, "session 49: review of the windows' latest reading (revwin)".

mod common;

use common::readings::{fill, limiter, state, WINDOWS};
use common::{redis_now_micros, runtime, RedisServer};
use floodgate_redis::{Algorithm, RedisLimitError, Verdict};

const S: u64 = 1_000_000;
/// 2026-12-01 00:00:00 in µs since the epoch: a multiple of 6 s.
const T: u64 = 1_796_083_200_000_000;
/// A window state's fields before the reading: window `w` of a period of 2 s,
/// one unit.
fn plain(algorithm: Algorithm, w: u64) -> String {
    match algorithm {
        Algorithm::FixedWindow => format!("{w}:1:2000000"),
        _ => format!("{w}:0:1:2000000"),
    }
}

/// Finding (fixed): `window_reading` bounded the reading by 2^53 (the bound of a
/// window's END), not by the time range (2^52: no script's `now`, so no reading a
/// script writes, is later). A planted reading in (2^52, 2^53) was accepted and
/// judged at: at 2^53 − 1 the fixed window wrote window 4503599627 of 2 s, whose end
/// is past 2^53, and the next call read that state as malformed ("window ends past
/// 2^53 us") — under the server's clock with a time to live of some 228 years, an
/// error (or, under `OnFailure::Open`, an admission) on every call. Now a reading
/// past 2^52 is malformed, refused with nothing written; 2^52 itself is read, and
/// what it writes is read again. Mutations seen failing: the bound back at 2^53
/// (the first loop); the bound at `>= 2^52` (the last block).
#[test]
fn a_reading_past_the_time_range_is_malformed() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let at = T + 2 * S;
    let w = at / (2 * S);
    for algorithm in WINDOWS {
        for r in [(1_u64 << 52) + 1, (1_u64 << 53) - 1] {
            let planted = format!("{}@{r}", plain(algorithm, w));
            for readings in [false, true] {
                let l = limiter(&rt, &server, algorithm, 2, readings, true);
                let _: () = server.cmd(&["SET", "test:far", &planted]);
                match rt.block_on(l.check_n_at_micros("far", 1, at)) {
                    Err(RedisLimitError::Redis(e)) => {
                        let e = e.to_string();
                        assert!(e.contains("malformed"), "{planted}: {e}");
                    }
                    other => panic!("{planted}: a malformed state expected, got {other:?}"),
                }
                assert_eq!(state(&server, "test:far"), planted);
            }
        }
        // The last reading a script may write: judged at, and read again.
        let top = 1_u64 << 52;
        let l = limiter(&rt, &server, algorithm, 2, true, true);
        let _: () = server.cmd(&["SET", "test:top", &format!("{}@{top}", plain(algorithm, w))]);
        assert_eq!(fill(&rt, &l, "top", at), 10, "{algorithm:?}");
        assert!(state(&server, "test:top").ends_with(&format!("@{top}")));
    }
}

/// Finding (fixed): a charge with the option on at instant 0 (the replay's
/// `*_at_micros`; a trace whose clock starts at 0) writes the reading `@0`, which
/// the transitions read (a reading of 0: none to judge at) but `window_refund`
/// kept in the refund fields only when the reading was above 0, so it parsed `@0`
/// as refund fields and answered "malformed state" to the receipt of that very
/// charge. Now "no field" is -1 (`window_reading`), the refund strips and keeps any
/// reading it finds, and a limiter with the option off keeps `@0` too (it used to
/// drop it: a field of 0 read as none). Mutations seen failing: `if r > 0` back in
/// `window_refund`; `reading_field` dropping a field of 0 where the option is off.
#[test]
fn a_reading_of_zero_is_refunded_like_any_other() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    for algorithm in WINDOWS {
        let key = format!("zero-{algorithm:?}");
        let redis_key = format!("test:{key}");
        let l = limiter(&rt, &server, algorithm, 2, true, true);
        let (d, r) = rt.block_on(l.charge_n_at_micros(&key, 3, 0)).unwrap();
        assert!(d.is_allowed());
        assert!(state(&server, &redis_key).ends_with("@0"));
        let back = rt.block_on(l.refund_at_micros(&r.unwrap(), 1));
        assert!(matches!(back, Ok(true)), "{key}: {back:?}");
        let s = state(&server, &redis_key);
        assert!(s.ends_with("@0"), "{key}: {s}");
        // All 3 given back: 10 fit again in window 0.
        assert_eq!(fill(&rt, &l, &key, 1), 10, "{key}: {s}");
        let _: () = server.cmd(&["SET", &redis_key, &s.replace(":10:", ":0:")]);
        let off = limiter(&rt, &server, algorithm, 2, false, true);
        assert!(rt
            .block_on(off.check_n_at_micros(&key, 1, 0))
            .unwrap()
            .is_allowed());
        let kept = state(&server, &redis_key);
        assert!(kept.ends_with("@0"), "{key}: a field of 0 dropped: {kept}");
    }
}

/// A charge read behind the field is judged in the field's window, and so is its
/// receipt: the refund finds that window and gives back (a receipt naming the
/// window of the reading behind would give back nothing, the state never going
/// back to it). One unit at 2.01 s (window [2 s, 4 s) of 2 s), a charge of 3 read
/// at 1.99 s, refunded at 1.995 s: 9 fit again at 1.99 s. Mutation seen failing:
/// either script's receipt naming `fdiv(now, p)`.
#[test]
fn a_charge_behind_the_field_is_refunded_in_the_fields_window() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    for algorithm in WINDOWS {
        let key = format!("refund-{algorithm:?}");
        let l = limiter(&rt, &server, algorithm, 2, true, true);
        let (d, _) = rt
            .block_on(l.charge_n_at_micros(&key, 1, T + 2_010_000))
            .unwrap();
        assert!(d.is_allowed());
        let (d, r) = rt
            .block_on(l.charge_n_at_micros(&key, 3, T + 1_990_000))
            .unwrap();
        assert!(d.is_allowed());
        let back = rt.block_on(l.refund_at_micros(&r.unwrap(), T + 1_995_000));
        assert!(matches!(back, Ok(true)), "{key}: {back:?}");
        assert_eq!(fill(&rt, &l, &key, T + 1_990_000), 9, "{key}");
    }
}

/// A replica without the option judges a reading behind a field it finds at that
/// field, as one with it does: a mixed configuration (the option on some
/// replicas only) keeps the switch of `review_s48_policy.rs`'s finding closed. A
/// (6 s, option on) admits 5 at 4.01 s; B (2 s, option off) reads 3.99 s, 4 s and
/// 5.99 s: judged at 4.01 s, A's units count in B's window [4 s, 6 s) and B admits
/// 5 in all (judged at its own clock: 5 in [2 s, 4 s), then 10 in [4 s, 6 s) on
/// top of A's 5, 15 in all). The field stays A's. Mutation seen failing: both
/// scripts judging at the field only where READINGS is on.
#[test]
fn a_replica_without_the_option_judges_at_a_field_it_finds() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    for algorithm in WINDOWS {
        let key = format!("mixed-{algorithm:?}");
        let a = limiter(&rt, &server, algorithm, 6, true, false);
        let b = limiter(&rt, &server, algorithm, 2, false, false);
        let ahead = T + 4_010_000;
        for _ in 0..5 {
            assert!(rt
                .block_on(a.check_n_at_micros(&key, 1, ahead))
                .unwrap()
                .is_allowed());
        }
        let got: u64 = [T + 3_990_000, T + 4 * S, T + 5_990_000]
            .iter()
            .map(|&at| fill(&rt, &b, &key, at))
            .sum();
        assert_eq!(got, 5, "{algorithm:?}");
        let s = state(&server, &format!("test:{key}"));
        assert!(s.ends_with(&format!("@{ahead}")), "{algorithm:?}: {s}");
    }
}

/// Under the server's clock, a switch read behind the field (the field ahead by
/// 20 s: a key written by a replica whose clock is ahead) keeps the key alive,
/// from the server's now, until the old policy's window of the field ends (the
/// fixed window) or the one after it (the sliding window): `keep` is taken at the
/// field and measured from now. The given-time calls of `window_readings.rs` set no
/// time to live, so nothing else pins it. Old policy 6 s, the field half a second
/// into a window of 6 s at least 20 s ahead; the new policy 2 s, its own window
/// ending 5.5 s (fixed) or 3.5 s (sliding) sooner than what `keep` must cover.
/// Mutation seen failing: `keep` measured from the field (`- at`) in either script.
#[test]
fn a_switch_behind_the_field_keeps_the_key_for_the_old_window_from_now() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    for algorithm in WINDOWS {
        let key = format!("ttl-{algorithm:?}");
        let redis_key = format!("test:{key}");
        let now = redis_now_micros(&server);
        let sw = (now + 20 * S) / (6 * S) + 1;
        let field = sw * 6 * S + S / 2;
        let (planted, old_end) = match algorithm {
            Algorithm::FixedWindow => (format!("{sw}:5:6000000@{field}"), (sw + 1) * 6 * S),
            _ => (format!("{sw}:0:5:6000000@{field}"), (sw + 2) * 6 * S),
        };
        let _: () = server.cmd(&["SET", &redis_key, &planted]);
        let b = limiter(&rt, &server, algorithm, 2, true, false);
        let v = rt.block_on(b.check_n(key.as_str(), 1)).unwrap();
        assert!(matches!(v, Verdict::Decided(_)), "{algorithm:?}: {v:?}");
        let d = v.decision();
        assert!(d.is_allowed(), "{algorithm:?}: {d:?}");
        assert_eq!(d.remaining(), 4, "{algorithm:?}: the old 5 count");
        let pttl: i64 = server.cmd(&["PTTL", &redis_key]);
        let after = redis_now_micros(&server);
        // PTTL's milliseconds: a little slack, far below the seconds at stake.
        let least = (old_end - after) / 1000 - 2;
        assert!(
            u64::try_from(pttl).unwrap() >= least,
            "{algorithm:?}: PTTL {pttl} ms < {least} ms"
        );
        assert!(state(&server, &redis_key).ends_with(&format!("@{field}")));
    }
}

/// Found open by this review, closed by judging no reading earlier than the stored
/// window's start (`judged_at` in common.lua: an admission judged in that window
/// wrote the state). A key written without the field (before the option, or by a
/// replica with it off on a key that never had it) by A, whose clock is ahead (6
/// s, admits 5 at 6.01 s: window [6 s, 12 s)), then admitted by B with the option
/// (6 s, reads 5.99 s): B used to record `@5.99 s`, behind even that window's
/// start. C (2 s, option on) then read 5.995 s: judged there, the 6 old units
/// counted in [4 s, 6 s) (4 admitted), and at 6 s C's window moved on and forgot
/// them: 10 more, 20 units within one window of 10 of the new policy. Now B
/// records 6 s and C admits 4. What stays (the rollout's premise, in the
/// builder's docs): where A keeps writing without the field later in its window
/// (8.01 s), C's window [6 s, 8 s) forgets A's units at 8 s; only A recording its
/// reading closes that.
///
/// Mutation seen failing: `judged_at` without the window start (20 admitted).
#[test]
fn a_first_field_behind_the_state_reopens_the_switch() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let a = limiter(&rt, &server, Algorithm::FixedWindow, 6, false, false);
    let b = limiter(&rt, &server, Algorithm::FixedWindow, 6, true, false);
    let c = limiter(&rt, &server, Algorithm::FixedWindow, 2, true, false);
    for _ in 0..5 {
        assert!(rt
            .block_on(a.check_n_at_micros("legacy", 1, T + 6_010_000))
            .unwrap()
            .is_allowed());
    }
    assert!(!state(&server, "test:legacy").contains('@'));
    assert!(rt
        .block_on(b.check_n_at_micros("legacy", 1, T + 5_990_000))
        .unwrap()
        .is_allowed());
    let got = fill(&rt, &c, "legacy", T + 5_995_000) + fill(&rt, &c, "legacy", T + 6 * S);
    assert_eq!(
        got,
        4,
        "C admitted {got} on top of 6 old units: {}",
        state(&server, "test:legacy")
    );
}
