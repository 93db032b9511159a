//! Adversarial review of the GCRA latest reading (session 45, "revread"): the
//! key's latest admitted reading kept as the first record `0/0/reading` of the
//! receipts form, a refund judged at `max(TIME, reading)`.
//!
//! The pre-change GCRA script (`fixtures/gcra_pre_s45.lua`, `git show
//! 8933177:crates/floodgate-redis/src/lua/gcra.lua`, after that commit's
//! `common.lua`, which differs from today's only in `record_refund`; the drivers in
//! `script.rs` did not change) runs here against states the new one wrote, and
//! the other way round, as in a rolling deploy where both versions serve a key.
//! Both are assembled as the crate assembles its given-time scripts, and
//! [`the_assembled_scripts_are_the_crates_own`] checks that the new one is byte for
//! byte the script the crate loads. See VERIFICATION.md, "session 45: adversarial
//! review of the Redis latest reading (revread)". Session 45's own script
//! (`fixtures/gcra_s45.lua`) runs the same way against the notes of refunds that
//! moved nobody, which session 46 added to the records.

mod common;

use common::{
    command_stats, eval, redis_now_micros, refund_driver, runtime, with_refunds, RedisServer,
    GIVEN_TIME,
};
use common::{AtLatestReading, InProcess, Reading};
use floodgate::{Nanos, Policy, RateLimiter};
use floodgate_redis::Algorithm;
use redis::Value;

/// The one-limit GCRA charge with a receipt (`script.rs` `CHARGE_GCRA`).
const CHARGE_GCRA: &str = "\
ISSUING = true
local r = gcra(KEYS[1], tonumber(ARG[1]), ARG[2] == '1', tonumber(ARG[3]), tonumber(ARG[4]))
if r.err or not RECEIPT then return r end
for i = 1, #RECEIPT do r[5 + i] = RECEIPT[i] end
return r
";

const COMMON_NOW: &str = include_str!("../src/lua/common.lua");
const GCRA_NOW: &str = include_str!("../src/lua/gcra.lua");
const GCRA_PRE: &str = include_str!("fixtures/gcra_pre_s45.lua");
/// Session 45's script, before the notes of refunds that moved nobody (`git show
/// 115f144:crates/floodgate-redis/src/lua/gcra.lua`; `common.lua` and the drivers
/// as today's).
const GCRA_S45: &str = include_str!("fixtures/gcra_s45.lua");

/// One version's given-time GCRA charge and refund scripts.
struct Version {
    charge: String,
    refund: String,
}

impl Version {
    fn of(common: &str, gcra: &str) -> Version {
        Version {
            charge: [GIVEN_TIME, common, gcra, CHARGE_GCRA].concat(),
            refund: [
                GIVEN_TIME,
                common,
                gcra,
                refund_driver("gcra_refund").as_str(),
            ]
            .concat(),
        }
    }
    fn now() -> Version {
        Version::of(COMMON_NOW, GCRA_NOW)
    }
    /// Session 45's scripts: the latest reading, no notes.
    fn s45() -> Version {
        Version::of(COMMON_NOW, GCRA_S45)
    }
    /// The pre-change `common.lua` is the current one but for `record_refund`,
    /// which dropped one record at most.
    fn pre() -> Version {
        let once = "  if #list > (kept or REFUNDS_KEPT) then\n";
        let common = COMMON_NOW.replace("  while #list > (kept or REFUNDS_KEPT) do\n", once);
        assert_eq!(common.matches(once).count(), 1);
        Version::of(&common, GCRA_PRE)
    }
}

/// T = 1 ms, B = 100: a refund of the newest charge is never clipped by the
/// burst (every booking lies within `now + B·T`).
const T: u64 = 1_000;
const B: u64 = 100;
/// 10 s in microseconds.
const TEN: u64 = 10_000_000;

/// What a charge answered: admitted, and the receipt `[start, end, ledger,
/// incarnation]` when it wrote one.
type Charge = (bool, Option<[u64; 4]>);

fn int(v: &Value) -> u64 {
    match v {
        Value::Int(i) => u64::try_from(*i).expect("a whole number"),
        other => panic!("not an integer: {other:?}"),
    }
}

/// A charge of `n` at `now` by `version`'s script.
fn charge(server: &RedisServer, version: &Version, key: &str, n: u64, now: u64) -> Charge {
    let reply = eval(server, &version.charge, key, &[now, n, 1, T, B]).expect("a charge");
    let Value::Array(items) = reply else {
        panic!("not a decision: {reply:?}");
    };
    let receipt = (items.len() == 9).then(|| {
        [
            int(&items[5]),
            int(&items[6]),
            int(&items[7]),
            int(&items[8]),
        ]
    });
    (int(&items[0]) == 1, receipt)
}

/// A refund of `receipt` at `now` by `version`'s script: the microseconds given
/// back.
fn refund(server: &RedisServer, version: &Version, key: &str, receipt: [u64; 4], now: u64) -> u64 {
    let [s, e, l, b] = receipt;
    int(&eval(server, &version.refund, key, &[now, s, e, l, b, T, B]).expect("a refund"))
}

/// The GCRA state at `key` split at its `:`.
fn fields(server: &RedisServer, key: &str) -> Vec<String> {
    let state: String = server.cmd(&["GET", key]);
    state.split(':').map(str::to_owned).collect()
}

/// The records of the state at `key` (the sixth field) split at `,`.
fn records(server: &RedisServer, key: &str) -> Vec<String> {
    let f = fields(server, key);
    assert_eq!(f.len(), 6, "{f:?}");
    f[5].split(',')
        .filter(|r| !r.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The key's latest reading, if its records begin with one.
fn reading(server: &RedisServer, key: &str) -> Option<u64> {
    records(server, key)
        .first()?
        .strip_prefix("0/0/")
        .map(|r| r.parse().expect("a reading"))
}

/// Whether `record` is a note of a refund that moved nobody (`0/1/before/back`,
/// session 46).
fn is_note(record: &str) -> bool {
    record.starts_with("0/1/") && record.split('/').count() == 4
}

/// The receipts among the records (every record but the reading and the notes).
fn receipts(server: &RedisServer, key: &str) -> usize {
    records(server, key)
        .iter()
        .filter(|r| !r.starts_with("0/0/") && !is_note(r))
        .count()
}

/// The harness's scripts are the crate's: after the crate's given-time charge and
/// refund (one GCRA limit, refunds on) ran, the server knows the SHA1 of the
/// scripts assembled here from the new `gcra.lua`.
///
/// Fails if any part assembled here drifts from `script.rs` (seen: one space added
/// to `CHARGE_GCRA` above).
#[test]
fn the_assembled_scripts_are_the_crates_own() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let policy = Policy::per_second(1000).unwrap().with_burst(B).unwrap();
    let l = with_refunds(&rt, &server, common::builder(Algorithm::Gcra, policy), true);
    rt.block_on(async {
        let (_, r) = l.charge_n_at_micros("own", 1, TEN).await.unwrap();
        assert!(l.refund_at_micros(&r.unwrap(), TEN).await.unwrap());
    });
    let v = Version::now();
    for script in [&v.charge, &v.refund] {
        let sha = redis::Script::new(script).get_hash().to_owned();
        let known: Vec<u8> = server.cmd(&["SCRIPT", "EXISTS", &sha]);
        assert_eq!(known, vec![1], "the harness's script is not the crate's");
    }
    // The harness's charge over a fresh key writes what the crate's wrote.
    let (ok, receipt) = charge(&server, &v, "test:own2", 1, TEN);
    assert!(ok && receipt.is_some());
    assert_eq!(reading(&server, "test:own2"), Some(TEN));
}

/// Both versions on one key, as a rolling deploy runs them: the pre-change
/// script reads a state with the reading, its admissions keep the reading as it
/// found them (first, unraised), its refund gives back what the new one gives at
/// a reading in order and keeps the reading first; the new script refunds a
/// receipt the old one charged and raises the reading at its next admission.
///
/// Fails if the new refund is judged at `TIME` on a state where the old script
/// admitted (the clamp `if st.reading and st.reading > at then at = st.reading
/// end` dropped from `gcra_refund`: B gives back 3 ms, its whole booking, of
/// which 1.5 ms lay before the new admission's reading).
#[test]
fn the_pre_change_script_and_the_new_one_share_a_key() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let (new, old) = (Version::now(), Version::pre());
    let key = "test:mix";
    let (ok, a) = charge(&server, &new, key, 2, TEN);
    assert!(ok);
    assert_eq!(reading(&server, key), Some(TEN));
    // The old script's admission later: the TAT moves on, the reading does not.
    let (ok, b) = charge(&server, &old, key, 3, TEN + 500);
    assert!(ok);
    let f = fields(&server, key);
    assert_eq!(f[0], (TEN + 5 * T).to_string(), "{f:?}");
    assert_eq!(f[5], format!("0/0/{TEN}"));
    // The old script refunds the new receipt A ([10 s, +2 ms), its units
    // below B's: nothing ahead of it but B's own booking within B·T) and keeps the
    // reading first.
    assert_eq!(
        refund(&server, &old, key, a.unwrap(), TEN + 500),
        2 * T - 500
    );
    let r = records(&server, key);
    assert_eq!(r.len(), 2, "{r:?}");
    assert_eq!(r[0], format!("0/0/{TEN}"));
    // Sent again by either version: nothing.
    assert_eq!(refund(&server, &old, key, a.unwrap(), TEN + 500), 0);
    assert_eq!(refund(&server, &new, key, a.unwrap(), TEN + 500), 0);
    // The new script's admission at 10.002 s raises the reading (the TAT: 10.0035
    // s, then 10.0045 s) ...
    assert!(charge(&server, &new, key, 1, TEN + 2_000).0);
    assert_eq!(reading(&server, key), Some(TEN + 2_000));
    // ... and its refund of B, which the old script charged, at a TIME stepped
    // back to 9.999 s is judged at that reading, 10.002 s: B's booking [10.002,
    // 10.005) s moved down by A's 1.5 ms to [10.0005, 10.0035) s, of which 1.5 ms
    // lies after it.
    assert_eq!(refund(&server, &new, key, b.unwrap(), TEN - 1_000), 1_500);
    assert_eq!(fields(&server, key)[0], (TEN + 3_000).to_string());
    // The reading stays where it was; the next admission raises it.
    assert!(charge(&server, &new, key, 1, TEN + 2_500).0);
    assert_eq!(reading(&server, key), Some(TEN + 2_500));
    assert_eq!(receipts(&server, key), 2);
}

/// A key the pre-change script wrote (receipts form, no reading) is read by the
/// new one: its refund there is judged at `TIME` as read, and its admission
/// starts the reading in front of the records the old one kept.
///
/// Fails if a state without the reading record is judged at a reading it does
/// not hold (seen: `local reading = false` → `local reading = s` in `gcra_read`,
/// the TAT taken for the reading: A's refund gives nothing).
#[test]
fn the_new_script_reads_a_key_the_pre_change_one_wrote() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let (new, old) = (Version::now(), Version::pre());
    let key = "test:old";
    let (_, a) = charge(&server, &old, key, 2, TEN);
    let (_, b) = charge(&server, &old, key, 2, TEN + 3_000);
    assert_eq!(refund(&server, &old, key, b.unwrap(), TEN + 3_000), 2 * T);
    assert_eq!(reading(&server, key), None);
    // A's booking [10, 10.002) s, moved down by B's 2 ms, refunded at a TIME
    // stepped back to 9.9985 s: judged there (no reading known; at 10.003 s, B's
    // admission, it would give nothing), 1.5 ms back, as before the change.
    assert_eq!(refund(&server, &new, key, a.unwrap(), TEN - 1_500), 1_500);
    assert_eq!(reading(&server, key), None);
    assert!(charge(&server, &new, key, 1, TEN + 3_000).0);
    assert_eq!(reading(&server, key), Some(TEN + 3_000));
    assert_eq!(receipts(&server, key), 2);
}

/// FINDING (fixed): the records grew without bound while both versions served a
/// key. The pre-change script takes the reading for its oldest receipt: its
/// refund over the full list (the reading and 8 receipts) drops only the reading
/// and keeps 9 receipts; the new script's next admission puts a reading back in
/// front, and the old script's next refund again drops only that. Each new
/// admission followed by an old refund left one receipt more, and the new
/// script's own refund removed only one record per refund added, so the list
/// never came back to 8 while the key lived (every charge writes it all back,
/// every refund reads it through).
///
/// The new script's refund now trims to what it keeps (`record_gcra_refund` drops
/// the oldest while more are left, the floor past each one dropped; since session
/// 46's crowd records, B's worth, 8 to 64: 64 here): the growth lasts only until
/// the new version's next refund on the key. Every receipt trimmed gives nothing
/// when sent again (the floor), and the newest still refunds.
///
/// Fails if `record_refund` drops one record at most (`while` back to `if`): 78
/// receipts are left after the new script's refund.
#[test]
fn the_records_come_back_to_what_a_key_keeps_after_both_versions_refunded() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let (new, old) = (Version::now(), Version::pre());
    let key = "test:grow";
    let mut now = TEN;
    // 8 receipts refunded by the new script: the reading and 8 records.
    for _ in 0..8 {
        let (ok, r) = charge(&server, &new, key, 1, now);
        assert!(ok);
        assert_eq!(refund(&server, &new, key, r.unwrap(), now), T);
        now += 10;
    }
    assert_eq!(
        (receipts(&server, key), reading(&server, key)),
        (8, Some(now - 10))
    );
    // A new admission, then an old refund, 70 times.
    let mut refunded = Vec::new();
    for _ in 0..70 {
        let (ok, r) = charge(&server, &new, key, 1, now);
        assert!(ok);
        assert_eq!(refund(&server, &old, key, r.unwrap(), now), T);
        refunded.push(r.unwrap());
        now += 10;
    }
    // The pre-change script cannot be fixed: 78 receipts kept by now.
    assert_eq!(receipts(&server, key), 78);
    let (ok, last) = charge(&server, &new, key, 1, now);
    assert!(ok);
    let (ok, keep) = charge(&server, &new, key, 1, now);
    assert!(ok);
    assert_eq!(refund(&server, &new, key, last.unwrap(), now), T);
    assert_eq!(receipts(&server, key), 64, "{:?}", records(&server, key));
    assert_eq!(reading(&server, key), Some(now));
    // Every receipt refunded before gives nothing again; the one still held
    // refunds.
    for r in refunded {
        assert_eq!(refund(&server, &new, key, r, now), 0);
    }
    assert_eq!(refund(&server, &new, key, keep.unwrap(), now), T);
    assert_eq!(receipts(&server, key), 64);
}

/// 5 a second, burst 5 (T = 200 ms).
fn five() -> Policy {
    Policy::per_second(5).unwrap().with_burst(5).unwrap()
}

/// A malformed reading on the second limit of a multi-limit key fails the
/// multi-limit charge, peek and refund (`multi.lua`, `multi_refund.lua`) with an
/// error naming that key, and writes nothing on either key, their time to live
/// included; put back, the refund gives back once.
///
/// Fails if `gcra_read` drops its check that the reading lies before the latest
/// TAT (`reading >= h`): the refund over `0/0/{latest TAT}` then gives back.
#[test]
fn a_malformed_reading_fails_a_multi_limit_call_and_writes_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let (l, keys, r) = common::two_gcra_limits_charged(&rt, &server, five(), "m", TEN);
    rt.block_on(async {
        let first: String = server.cmd(&["GET", &keys[0]]);
        let _: () = server.cmd(&["PEXPIRE", &keys[0], "600000"]);
        let f = fields(&server, &keys[1]);
        let head = f[..5].join(":");
        let hi = &f[2];
        let huge = format!("0/0/{}", "9".repeat(400));
        for records in [
            format!("0/0/{hi}"),
            huge,
            "0/0/5/7".to_owned(),
            format!("0/0/{TEN},"),
            format!("0/0/{TEN},x"),
        ] {
            let bad = format!("{head}:{records}");
            let _: () = server.cmd(&["SET", &keys[1], &bad]);
            let calls = [
                l.refund_at_micros(&r, TEN).await.map(|_| ()),
                l.check_n_at_micros("m", 1, TEN).await.map(|_| ()),
                l.peek_n_at_micros("m", 1, TEN).await.map(|_| ()),
                l.charge_n_at_micros("m", 1, TEN).await.map(|_| ()),
            ];
            for call in calls {
                let e = call.expect_err(&bad).to_string();
                assert!(
                    e.contains("malformed state at key") && e.contains(&keys[1]),
                    "{bad}: {e}"
                );
            }
            assert_eq!(server.cmd::<String>(&["GET", &keys[1]]), bad);
            assert_eq!(server.cmd::<String>(&["GET", &keys[0]]), first);
            let ttl: i64 = server.cmd(&["PTTL", &keys[0]]);
            assert!(ttl > 590_000, "{ttl}");
        }
        let _: () = server.cmd(&["SET", &keys[1], &format!("{head}:0/0/{TEN}")]);
        assert!(l.refund_at_micros(&r, TEN).await.unwrap());
        assert!(!l.refund_at_micros(&r, TEN).await.unwrap());
    });
}

/// The production scripts (server `TIME`, keys with a time to live) with the
/// reading: a charge and a refund each run one `GET` and one `SET` per key, as
/// before the change, and the key lives until its latest TAT has passed (whole
/// milliseconds, rounded up) after either, the refund's time to live counted from
/// its own `TIME`, not from the reading (an earlier instant) nor kept from the
/// charge.
///
/// Fails if the refund's time to live is counted from the reading
/// (`st.hi - at` in `gcra_refund`'s write, seen: 50 ms longer than `hi - TIME`),
/// or if `gcra_write` keeps a time to live through `set_window_state` (a `PTTL`
/// more per charge).
#[test]
fn command_counts_and_times_to_live_are_as_before() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    // 1 a second, burst 100: the key lives ~100 s.
    let policy = Policy::per_second(1).unwrap().with_burst(100).unwrap();
    let l = with_refunds(&rt, &server, common::builder(Algorithm::Gcra, policy), true);
    let key = &l.redis_keys("ttl")[0];
    rt.block_on(async {
        // Load the scripts first so that only the calls measured run commands.
        let _ = l.charge_n("warm", 1).await.unwrap();
        let counts = |before: &std::collections::BTreeMap<String, (u64, u64)>| {
            let after = command_stats(&server);
            let delta =
                |c: &str| after.get(c).map_or(0, |x| x.0) - before.get(c).map_or(0, |x| x.0);
            (delta("get"), delta("set"), delta("pttl"))
        };
        let before = command_stats(&server);
        let t0 = redis_now_micros(&server);
        let (d, r) = l.charge_n("ttl", 50).await.unwrap();
        assert_eq!(counts(&before), (1, 1, 0));
        assert!(d.decision().is_allowed());
        let ttl: i64 = server.cmd(&["PTTL", key]);
        // Read after the PTTL: the time to live only falls from the write on, so
        // the bound below holds however long the calls between them took.
        let t1 = redis_now_micros(&server);
        let hi: u64 = fields(&server, key)[2].parse().unwrap();
        let at_most = (hi - t0).div_ceil(1000) as i64;
        let at_least = ((hi - t1) / 1000) as i64 - 1;
        assert!(
            (at_least..=at_most).contains(&ttl),
            "{ttl} not in {at_least}..={at_most}"
        );
        let at: u64 = reading(&server, key).unwrap();
        assert!((t0..=t1).contains(&at));
        std::thread::sleep(std::time::Duration::from_millis(50));
        let before = command_stats(&server);
        let t2 = redis_now_micros(&server);
        assert!(l.refund(&r.unwrap()).await.unwrap());
        let t3 = redis_now_micros(&server);
        assert_eq!(counts(&before), (1, 1, 0));
        let ttl: i64 = server.cmd(&["PTTL", key]);
        let t3 = redis_now_micros(&server).max(t3);
        let at_most = (hi - t2).div_ceil(1000) as i64;
        let at_least = ((hi - t3) / 1000) as i64 - 1;
        assert!(
            (at_least..=at_most).contains(&ttl),
            "{ttl} not in {at_least}..={at_most}"
        );
        assert_eq!(reading(&server, key), Some(at));
    });
}

/// The doc's claim on a `TIME` that steps back and forward (`lib.rs`,
/// **Refunds**: "never schedule a later admission had passed (the TAT stays at or
/// above that admission's reading)"), on seeded traces of charges (by a limiter
/// with refunds on and, now and then, one with them off on the same keys),
/// refunds in any order (each sent twice), readings up to 1 s back and 400 ms on:
/// after every step the key's latest reading is the latest reading any admission
/// on it was judged at (either limiter's), the TAT is at or above it, and the
/// records hold the reading and at most 8 receipts. With the TAT at or above the
/// latest reading, a charge at a reading behind it books where one at that
/// reading would and admits no more (its limit `now + B·T` is lower), and a
/// refund is judged there: Redis then admits no more than the in-process limiter
/// on a clock that never stepped back.
///
/// Fails if the refund is judged at `TIME` (the clamp to `st.reading` dropped
/// from `gcra_refund`: the TAT falls below the reading), or if a write takes
/// `now` for the reading (`local reading = now` without the max with
/// `st.reading` in `gcra_write`).
#[test]
fn the_tat_never_falls_below_the_latest_reading_on_a_clock_that_steps() {
    use proptest::prelude::Rng;
    use proptest::test_runner::{RngAlgorithm, TestRng};
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let on = with_refunds(&rt, &server, common::builder(Algorithm::Gcra, five()), true);
    let off = with_refunds(
        &rt,
        &server,
        common::builder(Algorithm::Gcra, five()),
        false,
    );
    let below = |rng: &mut TestRng, n: u64| rng.next_u64() % n;
    let mut given = 0;
    rt.block_on(async {
        for seed in 1..=4_u8 {
            let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]);
            let key = format!("steps{seed}");
            let redis_key = &on.redis_keys(&key)[0];
            let mut now = TEN;
            let mut latest = None::<u64>;
            let mut held = Vec::new();
            for step in 0..300 {
                match below(&mut rng, 10) {
                    0..=3 => {
                        let cost = 1 + below(&mut rng, 3) as u32;
                        let (d, r) = on.charge_n_at_micros(&key, cost, now).await.unwrap();
                        if d.is_allowed() {
                            latest = latest.max(Some(now));
                            held.push(r.unwrap());
                        }
                    }
                    4 if latest.is_some() => {
                        let d = off.check_n_at_micros(&key, 1, now).await.unwrap();
                        if d.is_allowed() {
                            latest = latest.max(Some(now));
                        }
                    }
                    5 | 6 if !held.is_empty() => {
                        let r = held.swap_remove(below(&mut rng, held.len() as u64) as usize);
                        given += usize::from(on.refund_at_micros(&r, now).await.unwrap());
                        assert!(!on.refund_at_micros(&r, now).await.unwrap());
                    }
                    7 => now = now.saturating_sub(below(&mut rng, 1_000_000)),
                    _ => now += below(&mut rng, 400_000),
                }
                let Some(latest) = latest else { continue };
                let f = fields(&server, redis_key);
                let tat: u64 = f[0].parse().unwrap();
                let at = format!("seed {seed} step {step}: {f:?}");
                assert_eq!(reading(&server, redis_key), Some(latest), "{at}");
                assert!(tat >= latest, "{at}: the TAT below the latest reading");
                assert!(receipts(&server, redis_key) <= 8, "{at}");
            }
        }
    });
    // The traces refund: not a vacuous pass.
    assert!(given > 40, "{given}");
}

/// Session 46's notes under session 45's script, in a rolling deploy: the new
/// script charges A, B, C at 10 s and gives C back (the last booking: noted);
/// session 45's script charges D over that state, gives B back (no note: it
/// counts in every later shift, conservatively) and parses every state the new
/// one wrote; the new script then gives A back as the in-process limiter does
/// (B's refund moved D, so it counts: A's booking lies below the clock, nothing)
/// and D, charged after C's refund (whose note is before D's charge), its whole
/// 1 ms where it lies after B's refund. Every receipt sent again by any version
/// gives nothing; the schedule left is A's 1 ms.
///
/// Fails if the new shift leaves out the ledger (`local shift = 0` in
/// `gcra_refund`): A gives back 1 ms, where session 45's refund of B, which
/// moved D, counts in A's shift as in process. (A note written as another
/// field, `'/' .. fmt(back)` → `':' .. fmt(back)`, fails it too: a state of
/// seven fields.)
#[test]
fn session_45s_script_and_the_new_one_share_a_key_with_notes() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let (new, s45) = (Version::now(), Version::s45());
    let key = "test:notes";
    let [a, b, c] = [(); 3].map(|()| {
        let (ok, r) = charge(&server, &new, key, 1, TEN);
        assert!(ok);
        r.unwrap()
    });
    assert_eq!(refund(&server, &new, key, c, TEN), T);
    let r = records(&server, key);
    assert_eq!(r.len(), 3, "{r:?}");
    assert!(is_note(&r[2]), "{r:?}");
    let (ok, d) = charge(&server, &s45, key, 1, TEN);
    assert!(ok);
    assert_eq!(
        records(&server, key),
        r,
        "the old script's charge keeps them"
    );
    assert_eq!(refund(&server, &s45, key, b, TEN), T);
    assert_eq!(refund(&server, &new, key, a, TEN), 0);
    assert_eq!(refund(&server, &new, key, d.unwrap(), TEN), T);
    for receipt in [a, b, c, d.unwrap()] {
        for version in [&new, &s45] {
            assert_eq!(refund(&server, version, key, receipt, TEN), 0);
        }
    }
    assert_eq!(fields(&server, key)[0], (TEN + T).to_string());
    assert_eq!(receipts(&server, key), 3);
}

/// Session 45's script trims the records to 8 counting the notes: after 8
/// refunds that moved nobody (8 receipts, 8 notes) its refund (of the lower of
/// two bookings: no note) drops the 9 oldest records, the last a receipt whose
/// note it leaves first, the floor past every receipt dropped. The new script's
/// next refund (of the upper booking, moved by the old script's refund, which
/// counts in its shift) drops that note too (a note goes with its receipt: at
/// most one per receipt kept); every receipt refunded gives nothing again,
/// under either script, and the schedule is empty.
///
/// Fails if `record_gcra_refund` keeps a note left first (`or
/// lone_note(list[1])` dropped from its loop): the records then begin with it.
#[test]
fn notes_left_first_by_session_45s_trim_go_with_the_new_scripts_next_refund() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let (new, s45) = (Version::now(), Version::s45());
    let key = "test:trim";
    let mut refunded = Vec::new();
    for _ in 0..8 {
        let (ok, r) = charge(&server, &new, key, 1, TEN);
        assert!(ok);
        assert_eq!(refund(&server, &new, key, r.unwrap(), TEN), T);
        refunded.push(r.unwrap());
    }
    let r = records(&server, key);
    assert_eq!(r.len(), 17, "{r:?}");
    assert_eq!(r.iter().filter(|x| is_note(x)).count(), 8, "{r:?}");
    let (_, lower) = charge(&server, &new, key, 1, TEN);
    let (_, upper) = charge(&server, &new, key, 1, TEN);
    assert_eq!(refund(&server, &s45, key, lower.unwrap(), TEN), T);
    refunded.push(lower.unwrap());
    let r = records(&server, key);
    assert_eq!(r.len(), 9, "{r:?}");
    assert!(
        is_note(&r[1]),
        "a note left first, after the reading: {r:?}"
    );
    assert_eq!(refund(&server, &new, key, upper.unwrap(), TEN), T);
    refunded.push(upper.unwrap());
    let r = records(&server, key);
    assert!(!is_note(&r[1]), "{r:?}");
    assert_eq!(receipts(&server, key), 5);
    for receipt in refunded {
        for version in [&new, &s45] {
            assert_eq!(refund(&server, version, key, receipt, TEN), 0);
        }
    }
    assert_eq!(fields(&server, key)[0], TEN.to_string());
}

/// A rolling deploy under out-of-order refunds: 16 seeded traces of 300 steps on
/// one key each, every call by session 45's script or the new one at random
/// (charges of 1 or 2, refunds of any receipt held, waits, a `TIME` up to 2 ms
/// behind), beside the in-process limiter at the same readings charged with
/// what Redis admitted, its refunds judged at the latest admitted reading as
/// Redis judges them. No call fails, the in-process limiter admits every charge
/// Redis admits, and after every step the key's TAT is at or past the
/// in-process one's: the mix never holds less schedule than the rule it ports
/// (session 45's refunds keep the whole ledger growth in their shift, a loss),
/// so it never admits more.
///
/// Fails if every refund is noted as having moved nobody (`if st.tat <= e0` →
/// `if true` in `gcra_refund`): the key's TAT falls below the in-process one.
#[test]
fn both_versions_refunding_in_any_order_never_hold_less_than_in_process() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let versions = [Version::now(), Version::s45()];
    let policy = Policy::per_second(1_000_000 / T)
        .unwrap()
        .with_burst(B)
        .unwrap();
    let mut given = 0;
    for seed in 1..=16_u64 {
        let key = format!("test:mixtrace{seed}");
        let clock = Reading::default();
        let local = AtLatestReading::new(
            RateLimiter::gcra_with_clock(policy, clock.clone()),
            clock.clone(),
        );
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut draw = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut now = TEN;
        let mut held: Vec<(floodgate::Receipt, [u64; 4])> = Vec::new();
        for step in 0..300 {
            let version = &versions[draw(2) as usize];
            clock.set(Nanos::new(now * 1_000));
            match draw(8) {
                0..=3 => {
                    let cost = 1 + draw(2);
                    // What Redis admitted, charged in process too (where it must
                    // fit: that schedule is at or below Redis's).
                    if let (true, Some(rr)) = charge(&server, version, &key, cost, now) {
                        let r = local.charge_at(Nanos::new(now * 1_000), cost as u32);
                        assert!(r.is_charged(), "seed {seed} step {step}");
                        held.push((r, rr));
                    }
                }
                4 | 5 if !held.is_empty() => {
                    let (r, rr) = held.swap_remove(draw(held.len() as u64) as usize);
                    let _ = local.refund(r);
                    given += u64::from(refund(&server, version, &key, rr, now) > 0);
                }
                6 => now += draw(3 * T),
                _ => now -= draw(2 * T),
            }
            let state: Option<String> = server.cmd(&["GET", &key]);
            let tat = state.map_or(0, |s| s.split(':').next().unwrap().parse().unwrap());
            let ahead = local.peek_at(Nanos::new(now * 1_000), 0).reset_after();
            let local_tat = now + u64::try_from(ahead.as_micros()).unwrap();
            assert!(
                tat.max(now) >= local_tat,
                "seed {seed} step {step}: TAT {tat} below {local_tat}"
            );
        }
    }
    assert!(given > 200, "{given} refunds gave back");
}
