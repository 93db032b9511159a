//! Random traces through Redis (the replay script: the production transition with
//! the time passed in) give the decisions of `floodgate::reference`'s exact models —
//! at small times and again shifted to an origin near today's epoch (≈ 1.8·10^18 ns),
//! where nanoseconds no longer fit a double but the scripts' microseconds do.

mod common;

use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{limiter, runtime, whole_micros, Model, RedisServer};
use floodgate::reference::ExactGcra;
use floodgate::{Decision, Policy};
use floodgate_redis::{
    Algorithm, OnFailure, RedisLimitError, RedisLimiter, MAX_NOW_MICROS, MAX_SPAN_MICROS,
};
use proptest::prelude::*;

/// 2026-11-30 in microseconds since the epoch, plus an odd offset so windows do
/// not start at the origin.
const TODAY_MICROS: u64 = 1_796_083_200_000_000 + 123_457;

#[derive(Clone, Debug)]
struct Op {
    /// Microseconds to move the clock by; negative steps read earlier.
    step: i64,
    cost: u32,
    peek: bool,
}

static KEYS: AtomicU64 = AtomicU64::new(0);

/// Replays `ops` through Redis and the model, the clock kept within `times` (µs);
/// the first difference fails the case.
#[allow(clippy::too_many_arguments)]
fn conform(
    rt: &tokio::runtime::Runtime,
    redis: &RedisLimiter,
    algorithm: Algorithm,
    limit: u64,
    period_us: u64,
    burst: u64,
    times: RangeInclusive<u64>,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let key = format!("conform:{}", KEYS.fetch_add(1, Ordering::Relaxed));
    let mut model = Model::new(algorithm, limit, period_us * 1_000, burst);
    let (origin, latest) = times.into_inner();
    let mut now = origin.saturating_add(3 * period_us).min(latest);
    for (i, op) in ops.iter().enumerate() {
        now = now.saturating_add_signed(op.step).clamp(origin, latest);
        let got = rt.block_on(async {
            if op.peek {
                redis.peek_n_at_micros(&key, op.cost, now).await
            } else {
                redis.check_n_at_micros(&key, op.cost, now).await
            }
        });
        let got = got.map_err(|e| TestCaseError::fail(format!("op {i}: {e}")))?;
        let want = whole_micros(model.decide(now * 1_000, op.cost, op.peek));
        prop_assert_eq!(got, want, "op {} {:?} at {} µs", i, op, now);
    }
    Ok(())
}

fn ops(period_us: u64, max_cost: u32) -> impl Strategy<Value = Vec<Op>> {
    let p = period_us as i64;
    let steps = prop_oneof![
        4 => 0..=p / 2,
        2 => 0..=2 * p,
        1 => -p..0,
        1 => Just(0),
    ];
    stepping(steps, max_cost, 1..40)
}

/// `len` operations moving the clock by `steps`, of costs up to `max_cost`, one in
/// five a peek.
fn stepping(
    steps: impl Strategy<Value = i64>,
    max_cost: u32,
    len: std::ops::Range<usize>,
) -> impl Strategy<Value = Vec<Op>> {
    let op = (steps, 0..=max_cost, prop::bool::weighted(0.2)).prop_map(|(step, cost, peek)| Op {
        step,
        cost,
        peek,
    });
    prop::collection::vec(op, len)
}

/// (limit, period µs, burst, ops): periods are whole microseconds; for GCRA the
/// period is `limit × T` so that `T` is whole microseconds too (the scripts'
/// resolution), and the emission interval equals the model's `⌈P/L⌉`.
fn case() -> impl Strategy<Value = (u64, u64, u64, Vec<Op>)> {
    (1..=5_u64, 1..=2_000_u64, 1..=6_u64).prop_flat_map(|(limit, t, burst)| {
        let period = limit * t;
        let max_cost = limit.max(burst) as u32 + 1;
        (
            Just(limit),
            Just(period),
            Just(burst),
            ops(period, max_cost),
        )
    })
}

/// 32 cases by default; PROPTEST_CASES raises it for a longer soak.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn run(algorithm: Algorithm) {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let config = config();
    proptest!(config, |((limit, period, burst, ops) in case())| {
        let policy = Policy::new(limit, Duration::from_micros(period))
            .and_then(|p| p.with_burst(burst))
            .map_err(|e| TestCaseError::reject(e.to_string()))?;
        let redis = limiter(&rt, &server, algorithm, policy, OnFailure::Error, Duration::from_secs(5));
        for origin in [0, TODAY_MICROS] {
            conform(&rt, &redis, algorithm, limit, period, burst, origin..=u64::MAX, &ops)?;
        }
    });
}

#[test]
fn gcra_matches_the_exact_model() {
    run(Algorithm::Gcra);
}

#[test]
fn fixed_window_matches_the_exact_model() {
    run(Algorithm::FixedWindow);
}

#[test]
fn sliding_window_matches_the_exact_model() {
    run(Algorithm::SlidingWindow);
}

#[test]
fn sliding_log_matches_the_exact_model() {
    run(Algorithm::SlidingLog);
}

/// A long log: limits up to 64 and clock steps of about one unit's share of the
/// period, so the window holds dozens of members (the members' running totals
/// span many of them) and a denial's binary search runs over many ranks; among the
/// steps, requests at the same microsecond and earlier readings.
#[test]
fn a_long_sliding_log_matches_the_exact_model() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let case = (8..=64_u64, 100..=5_000_u64).prop_flat_map(|(limit, period)| {
        let share = (period / limit) as i64;
        let steps = prop_oneof![
            6 => 0..=2 * share,
            2 => Just(0),
            1 => -4 * share..0,
            1 => 0..=period as i64,
        ];
        (Just(limit), Just(period), stepping(steps, 4, 40..160))
    });
    proptest!(config(), |((limit, period, ops) in case)| {
        let policy = Policy::new(limit, Duration::from_micros(period)).unwrap();
        let algorithm = Algorithm::SlidingLog;
        let redis = limiter(&rt, &server, algorithm, policy, OnFailure::Error, Duration::from_secs(5));
        conform(&rt, &redis, algorithm, limit, period, limit, TODAY_MICROS..=u64::MAX, &ops)?;
    });
}

/// The largest policies the limiter accepts, at the latest times it decides at:
/// every sum and product a script computes sits at the top of a double's exact
/// range (`now + B·T` and `(L + 1)·P` up to 2^53, `now` up to 2^52), costs reach
/// `u32::MAX`, and the decisions still equal the exact models' (u128 nanoseconds);
/// a later time is refused.
#[test]
fn the_edges_of_the_exact_range_match_the_exact_model() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    // (algorithm, limit, period µs, burst, clock steps' scale µs, largest cost)
    let edges = [
        // T = 2^20 µs, B·T = 2^51 µs.
        (
            Algorithm::Gcra,
            1,
            1 << 20,
            1 << 31,
            MAX_SPAN_MICROS,
            u32::MAX,
        ),
        // 2·P = 2^51 µs; counts beyond u32.
        (
            Algorithm::FixedWindow,
            1 << 33,
            1 << 50,
            1,
            1 << 50,
            u32::MAX,
        ),
        // (L + 1)·P = 2^53 µs.
        (
            Algorithm::SlidingWindow,
            (1 << 31) - 1,
            1 << 22,
            1,
            1 << 22,
            u32::MAX,
        ),
        // 2·P = 2^51 µs (the model keeps one entry per unit: a small limit).
        (Algorithm::SlidingLog, 8, 1 << 50, 1, 1 << 50, 9),
    ];
    let times = MAX_NOW_MICROS - MAX_SPAN_MICROS..=MAX_NOW_MICROS;
    let config = config();
    for (algorithm, limit, period, burst, scale, max_cost) in edges {
        let policy = Policy::new(limit, Duration::from_micros(period))
            .and_then(|p| p.with_burst(burst.max(limit)))
            .unwrap();
        let redis = limiter(
            &rt,
            &server,
            algorithm,
            policy,
            OnFailure::Error,
            Duration::from_secs(5),
        );
        let burst = policy.burst();
        proptest!(config.clone(), |(ops in ops(scale, max_cost))| {
            conform(&rt, &redis, algorithm, limit, period, burst, times.clone(), &ops)?;
        });
        // One microsecond later is refused, and writes nothing.
        for late in [MAX_NOW_MICROS + 1, u64::MAX] {
            let refused = rt.block_on(redis.check_n_at_micros("late", 1, late));
            assert!(
                matches!(refused, Err(RedisLimitError::TimeOutOfRange { now_micros }) if now_micros == late),
                "{algorithm:?} at {late}: {refused:?}"
            );
        }
        assert_eq!(server.cmd::<i64>(&["EXISTS", "test:late"]), 0);
    }
}

/// A window limiter whose period changes (a redeploy on the same prefix) counts, in
/// its windows, the units the old state may hold there: both policies may be in
/// force at once (a rolling deploy: replicas on either share the keys), and starting
/// fresh on each switch would let a caller spread over both go unlimited. The old
/// state's window index counts windows of the old period, and is never read as one
/// of the new period (it would name a window thousands of years ahead — counted in,
/// written back with a TTL as long, and denying the key for good once full): each
/// of its counts holds units admitted before the end of its window, and counts
/// whole in the new policy's window if that end is past the window's start (the
/// sliding window: weighted in its previous window if past that one's start), else
/// not at all; the sliding window also counts no fewer than the old policy's own
/// estimate then. GCRA and the log keep absolute times and carry on.
#[test]
fn a_window_whose_period_changes_carries_the_units_it_still_counts() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let slow = Duration::from_secs(5);
    // 2026-11-30 at midnight: a multiple of 60 s (and 2 s past one of 7 s).
    let origin = TODAY_MICROS - 123_457;
    // (period in s, ms after `origin` of the first request, costs 1 ms apart).
    let phases: [(u64, u64, &[u32]); 7] = [
        // Fresh: two units in the 1 s window [0, 1).
        (1, 500, &[1, 1]),
        // The 60 s window [0, 60) holds the two units of [0, 1).
        (60, 1_250, &[2, 1]),
        // [0, 60) ended before [61, 62) started: nothing of it counts in the fixed
        // window; the sliding one counts what the 60 s policy's estimate still
        // holds (3 units weighted 58.7/60: 2).
        (1, 61_300, &[1, 1]),
        // The policy's own state, a window on.
        (1, 62_400, &[1]),
        // The 7 s window [61, 68) holds both 1 s windows, [61, 62) and [62, 63).
        (7, 62_500, &[2, 1]),
        // [60, 120) holds what [61, 68) (fixed) or [61, 63) (sliding) holds.
        (60, 62_600, &[1]),
        // Back to 1 s in [62, 63): the fixed window finds the 7 s state, which may
        // hold units of [62, 63); the sliding window its own.
        (1, 62_700, &[1, 1]),
    ];
    // (allowed, remaining) of each request, phase by phase.
    let fixed: [&[(bool, u64)]; 7] = [
        &[(true, 2), (true, 1)],
        &[(false, 1), (true, 0)],
        &[(true, 2), (true, 1)],
        &[(true, 2)],
        &[(true, 0), (false, 0)],
        &[(false, 0)],
        &[(false, 0), (false, 0)],
    ];
    let sliding: [&[(bool, u64)]; 7] = [
        &[(true, 2), (true, 1)],
        &[(false, 1), (true, 0)],
        &[(true, 0), (false, 0)],
        // 3 units a window back, weighted 0.6: 1.
        &[(true, 1)],
        &[(false, 0), (false, 0)],
        &[(false, 0)],
        // Its own state (2 and 1 at 0.7 s into [62, 63)).
        &[(true, 1), (true, 0)],
    ];
    for (algorithm, want) in [
        (Algorithm::FixedWindow, fixed),
        (Algorithm::SlidingWindow, sliding),
    ] {
        let key = format!("period:{algorithm:?}");
        for ((secs, start, costs), want) in phases.into_iter().zip(want) {
            let policy = Policy::new(3, Duration::from_secs(secs)).unwrap();
            let redis = limiter(&rt, &server, algorithm, policy, OnFailure::Error, slow);
            for (i, (&cost, &want)) in costs.iter().zip(want).enumerate() {
                let now = origin + (start + i as u64) * 1_000;
                let got = rt
                    .block_on(redis.check_n_at_micros(&key, cost, now))
                    .unwrap();
                assert_eq!(
                    (got.is_allowed(), got.remaining()),
                    want,
                    "{algorithm:?}, period {secs} s, at {start} ms + {i}"
                );
            }
        }
    }
}

/// Two replicas of a rolling deploy, one on 3 per 10 s and one on 3 per 15 s, with
/// a client alternating between them: every unit admitted within a window counts
/// there, whichever policy admitted it and whether or not the other policy's window
/// has ended since. The 10 s policy admits at 11 s, the 15 s one at 14 s and 14.5 s;
/// at 15.1 s the 15 s window has ended but the 10 s one, [10 s, 20 s), holds three
/// units: full (the key's time to live: `keys.rs`).
#[test]
fn units_count_in_every_window_of_either_period_that_holds_them() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let slow = Duration::from_secs(5);
    // 2026-11-30 at midnight: a multiple of 30 s, so both periods' windows start there.
    let origin = TODAY_MICROS - 123_457;
    let policy = |secs| Policy::new(3, Duration::from_secs(secs)).unwrap();
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let key = format!("rolling:{algorithm:?}");
        let [ten, fifteen] = [10, 15].map(|secs| {
            limiter(
                &rt,
                &server,
                algorithm,
                policy(secs),
                OnFailure::Error,
                slow,
            )
        });
        let at = |limiter: &RedisLimiter, ms: u64| {
            let now = origin + ms * 1_000;
            rt.block_on(limiter.check_n_at_micros(&key, 1, now))
                .unwrap()
        };
        assert!(at(&ten, 11_000).is_allowed(), "{algorithm:?}");
        assert!(at(&fifteen, 14_000).is_allowed(), "{algorithm:?}");
        assert!(at(&fifteen, 14_500).is_allowed(), "{algorithm:?}");
        let d = at(&ten, 15_100);
        assert!(!d.is_allowed(), "{algorithm:?}: {d:?}");
        assert_eq!(d.remaining(), 0, "{algorithm:?}");
    }
}

/// The sliding log's members carry running totals of units; past 2^52 the log
/// counts from its oldest live member again and decides on exactly.
#[test]
fn a_sliding_log_past_2_pow_52_units_counts_on_exactly() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    // A log that has admitted 2^52 units: 3 at t, then 1 at t + 1 µs.
    let ops = [
        (10, 2),
        (0, 5),
        (1, 1),
        (5, 3),
        (999_990, 4),
        (2, 7),
        (1_000_000, 6),
    ];
    past_2_pow_52(&server, "big", &[(0, 3), (1, 1)], &ops);
    // 8 of 10 units live at t, t + 1 and t + 2 µs: a denial's binary search over
    // totals near 2^52, then the recount on an admission at the newest member's own
    // microsecond (merged into it), a denial and a peek after it, and the window
    // sliding past the counted-again members.
    let ops = [
        (0, 3),
        (0, 2),
        (0, 1),
        (0, 0),
        (999_998, 2),
        (0, 2),
        (1, 2),
        (1, 4),
        (999_999, 10),
    ];
    past_2_pow_52(&server, "big-merged", &[(0, 3), (1, 1), (2, 4)], &ops);
}

/// Writes a log of `key` (members: µs after today, units) whose newest total is
/// 2^52 (any admission passes it), tells the model the same, then replays `ops` (µs after the newest
/// member, cost) through a log of 10 a second: the model's decisions, and after the
/// first admission totals counted again from the live members.
fn past_2_pow_52(server: &RedisServer, key: &str, members: &[(u64, u32)], ops: &[(u64, u32)]) {
    let rt = runtime();
    let (limit, period_us) = (10, 1_000_000);
    let policy = Policy::new(limit, Duration::from_micros(period_us)).unwrap();
    let slow = Duration::from_secs(5);
    let algorithm = Algorithm::SlidingLog;
    let redis = limiter(&rt, server, algorithm, policy, OnFailure::Error, slow);
    let mut model = Model::new(algorithm, limit, period_us * 1_000, limit);
    let t = TODAY_MICROS;
    let stored = format!("test:{key}");
    let mut total = (1_u64 << 52) - members.iter().map(|&(_, u)| u64::from(u)).sum::<u64>();
    for &(offset, units) in members {
        total += u64::from(units);
        let at = t + offset;
        let member = format!("{at}:{units}:{total}");
        let _: i64 = server.cmd(&["ZADD", &stored, &at.to_string(), &member]);
        assert!(model.decide(at * 1_000, units, false).is_allowed());
    }
    let newest_total = || {
        let newest: Vec<String> = server.cmd(&["ZRANGE", &stored, "-1", "-1"]);
        newest[0]
            .rsplit(':')
            .next()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    let mut now = t + members.last().map_or(0, |&(offset, _)| offset);
    let mut admitted = false;
    for (i, &(step, cost)) in ops.iter().enumerate() {
        now += step;
        let got = rt
            .block_on(redis.check_n_at_micros(key, cost, now))
            .unwrap();
        let want = whole_micros(model.decide(now * 1_000, cost, false));
        assert_eq!(got, want, "{key}: op {i} at {now}");
        admitted |= cost > 0 && got.is_allowed();
        if admitted {
            assert!(
                newest_total() < 100,
                "{key}: op {i}: the totals were not counted again"
            );
        }
    }
    assert!(admitted, "{key}: nothing was admitted");
}

/// A GCRA interval that is not whole microseconds is rounded up: the script serves
/// the model of the rounded rate, never a faster one.
#[test]
fn gcra_rounds_the_interval_up_to_whole_microseconds() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    // 3 per second: T = 333_333_334 ns, served as 333_334 µs.
    let policy = Policy::per_second(3).unwrap();
    let redis = limiter(
        &rt,
        &server,
        Algorithm::Gcra,
        policy,
        OnFailure::Error,
        Duration::from_secs(5),
    );
    let mut model = ExactGcra::new(3, 3 * 333_334_000, 3).expect("a valid policy");
    let mut now = TODAY_MICROS;
    for (step, cost) in [(0, 3), (1, 1), (333_333, 1), (1, 1), (10, 2), (999_999, 3)] {
        now += step;
        let got = rt
            .block_on(redis.check_n_at_micros("round", cost, now))
            .unwrap();
        assert_eq!(
            got,
            model.check(now * 1_000, cost),
            "at {now} µs, cost {cost}"
        );
    }
}

/// Two or three limits on one key, all or nothing: the script's decision is the
/// tightest of the models' decisions, and the models are charged only when all admit.
#[test]
fn several_limits_match_the_exact_models_all_or_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let limit = (0..4_usize, 1..=4_u64, 1..=1_500_u64, 1..=5_u64);
    let case = (prop::collection::vec(limit, 2..=3), ops(3_000, 6));
    let config = config();
    proptest!(config, |((limits, ops) in case)| {
        let algorithm = |i: usize| common::ALGORITHMS[i];
        let policy = |&(_, l, t, b): &(usize, u64, u64, u64)| {
            Policy::new(l, Duration::from_micros(l * t)).and_then(|p| p.with_burst(b))
        };
        let (first, rest) = limits.split_first().unwrap();
        let mut builder = RedisLimiter::builder(algorithm(first.0), policy(first).unwrap());
        for l in rest {
            builder = builder.and(algorithm(l.0), policy(l).unwrap());
        }
        let conn = rt.block_on(floodgate_redis::connect(&server.url())).unwrap();
        let redis = builder
            .prefix("test:")
            .timeout(Duration::from_secs(5))
            .build(conn)
            .unwrap();
        let key = format!("multi:{}", KEYS.fetch_add(1, Ordering::Relaxed));
        let mut models: Vec<Model> = limits
            .iter()
            .map(|&(a, l, t, b)| Model::new(algorithm(a), l, l * t * 1_000, b))
            .collect();
        let mut now = TODAY_MICROS;
        for (i, op) in ops.iter().enumerate() {
            now = now.saturating_add_signed(op.step).max(TODAY_MICROS);
            let got = rt.block_on(async {
                if op.peek {
                    redis.peek_n_at_micros(&key, op.cost, now).await
                } else {
                    redis.check_n_at_micros(&key, op.cost, now).await
                }
            });
            let got = got.map_err(|e| TestCaseError::fail(format!("op {i}: {e}")))?;
            let dry: Vec<Decision> = models
                .iter_mut()
                .map(|m| whole_micros(m.decide(now * 1_000, op.cost, true)))
                .collect();
            let all = dry.iter().all(Decision::is_allowed);
            let decided = if all && !op.peek {
                models
                    .iter_mut()
                    .map(|m| whole_micros(m.decide(now * 1_000, op.cost, false)))
                    .collect()
            } else {
                dry
            };
            let want = if all {
                decided.iter().copied().reduce(|a, d| if d.remaining() < a.remaining() { d } else { a })
            } else {
                let wait = |d: &Decision| d.retry_after_nanos().unwrap_or(u64::MAX);
                decided
                    .iter()
                    .copied()
                    .filter(|d| !d.is_allowed())
                    .reduce(|a, d| if wait(&d) > wait(&a) { d } else { a })
            };
            prop_assert_eq!(Some(got), want, "op {} {:?} at {} µs", i, op, now);
        }
    });
}
