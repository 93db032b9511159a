//! Session 44 (revredis2): an adversarial review of the batched sliding-log
//! refund (redis2). The refund rewrites every member from the refunded instant on
//! in one `ZREM` and one `ZADD`, each split per 2 000 members (`LOG_BATCH`);
//! session 43 wrote a `ZREM` and a `ZADD` per member. Here both scripts run side
//! by side on copies of one key (`DUMP`/`RESTORE`): the reply, every member and
//! its score, the encoding and the time to live must be the same, at the
//! batching boundaries and on seeded logs. Also a multi-limit refund out of
//! memory, and the step kinds of the shared trace driver. See VERIFICATION.md,
//! "session 44: review of the batched log refund (revredis2)".

mod common;

use common::{refund_driver, runtime, with_refunds, RedisServer, GIVEN_TIME};
use floodgate::Policy;
use floodgate_redis::{Algorithm, RedisLimitError, RedisLimiter};
use proptest::prelude::Rng;
use proptest::test_runner::{RngAlgorithm, TestRng};

const COMMON: &str = include_str!("../src/lua/common.lua");
const SLIDING_LOG: &str = include_str!("../src/lua/sliding_log.lua");

/// Session 43's writes (`git show 95b0607:crates/floodgate-redis/src/lua/sliding_log.lua`):
/// a `ZREM` and at most one `ZADD` per member.
const PER_MEMBER: &str = "    for i, m in ipairs(after) do
      redis.call('ZREM', key, m.name)
      local units = m.units
      if i == 1 then units = units - n end
      if units > 0 then
        redis.call('ZADD', key, fmt(m.at), fmt(m.at) .. ':' .. fmt(units) .. ':' .. fmt(m.total - n))
      end
    end
";

/// The last write of the refund's records, after which the members from the
/// instant on are written to the end of the script (the refund comes last).
const RECORDS_WRITTEN: &str =
    "    for r in pairs(was) do redis.call('ZREM', key, 'refunds:id:' .. r) end\n";

/// The refund script as the crate builds it, and session 43's: the same text up
/// to the writes of the members from the instant on, then [`PER_MEMBER`].
fn scripts() -> (String, String) {
    let cut = SLIDING_LOG
        .find(RECORDS_WRITTEN)
        .expect("the refund's records written")
        + RECORDS_WRITTEN.len();
    assert!(
        SLIDING_LOG.ends_with("  end\nend\n"),
        "the refund is not last"
    );
    let new = [
        GIVEN_TIME,
        COMMON,
        SLIDING_LOG,
        refund_driver("sliding_log_refund").as_str(),
    ]
    .concat();
    let old = [
        GIVEN_TIME,
        COMMON,
        &SLIDING_LOG[..cut],
        PER_MEMBER,
        "  end\nend\n",
        refund_driver("sliding_log_refund").as_str(),
    ]
    .concat();
    (new, old)
}

/// A period long enough that no member leaves the window (µs).
const P: u64 = 1_000_000_000_000;

/// The incarnation of every key built here.
const BORN: u64 = 7;

/// A log at `key` as charges with receipts leave it: the refund head (ledger 0,
/// floor 0, incarnation [`BORN`]) and one member per `(instant, units)`, with
/// running totals from `base` on; a time to live of a day.
fn build_log(conn: &mut redis::Connection, key: &str, rows: &[(u64, u64)], base: u64) {
    let _: () = redis::cmd("DEL").arg(key).query(conn).unwrap();
    let mut add = redis::cmd("ZADD");
    add.arg(key).arg("-inf").arg(format!("refunds:0:0:{BORN}"));
    let mut total = base;
    for &(at, units) in rows {
        total += units;
        add.arg(at).arg(format!("{at}:{units}:{total}"));
    }
    let _: () = add.query(conn).unwrap();
    let _: () = redis::cmd("PEXPIRE")
        .arg(key)
        .arg(86_400_000)
        .query(conn)
        .unwrap();
}

/// A key as seen: every member and score, its encoding, whether it has a time to
/// live (the TTL itself runs down between reads).
type Seen = (Vec<(String, String)>, String, bool);

fn seen(conn: &mut redis::Connection, key: &str) -> Seen {
    let members: Vec<(String, String)> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(conn)
        .unwrap();
    let encoding: String = redis::cmd("OBJECT")
        .arg("ENCODING")
        .arg(key)
        .query(conn)
        .unwrap();
    let ttl: i64 = redis::cmd("PTTL").arg(key).query(conn).unwrap();
    (members, encoding, ttl > 0)
}

/// The refund of `n` units at `x` (running total after the charge `total`,
/// ledger seen `noted`), run at `now` by `script` on `key`: what it gave back,
/// or the error's text.
fn refund(
    conn: &mut redis::Connection,
    script: &str,
    key: &str,
    now: u64,
    (x, n, total, noted): (u64, u64, u64, u64),
) -> Result<u64, String> {
    redis::cmd("EVAL")
        .arg(script)
        .arg(1)
        .arg(key)
        .arg(now)
        .arg(x)
        .arg(n)
        .arg(total)
        .arg(noted)
        .arg(BORN)
        .arg(P)
        .query(conn)
        .map_err(|e| e.to_string())
}

/// `key` copied to `twin` exactly (`DUMP`, `RESTORE` with its time to live).
fn copy(conn: &mut redis::Connection, key: &str, twin: &str) {
    let dump: Vec<u8> = redis::cmd("DUMP").arg(key).query(conn).unwrap();
    let ttl: i64 = redis::cmd("PTTL").arg(key).query(conn).unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg(twin)
        .arg(ttl.max(0))
        .arg(dump)
        .arg("REPLACE")
        .query(conn)
        .unwrap();
}

/// The refund run by the crate's script on `key` and by session 43's on a copy:
/// the same answer, the same key after (members, scores, encoding, time to live).
/// Returns the answer and the key after.
fn side_by_side(
    conn: &mut redis::Connection,
    (new, old): &(String, String),
    key: &str,
    now: u64,
    receipt: (u64, u64, u64, u64),
) -> (Result<u64, String>, Seen) {
    let twin = format!("{key}:s43");
    copy(conn, key, &twin);
    let got = refund(conn, new, key, now, receipt);
    let want = refund(conn, old, &twin, now, receipt);
    assert_eq!(got, want, "{key}: the answer, receipt {receipt:?}");
    let after = seen(conn, key);
    assert_eq!(
        after,
        seen(conn, &twin),
        "{key}: the key after, receipt {receipt:?}"
    );
    (got, after)
}

/// The log members of a key seen, as (instant, units, total).
fn rows(s: &Seen) -> Vec<(u64, u64, u64)> {
    s.0.iter()
        .filter(|(m, _)| !m.starts_with("refunds:"))
        .map(|(m, score)| {
            let f: Vec<u64> = m.split(':').map(|x| x.parse().unwrap()).collect();
            assert_eq!(score.parse::<u64>().unwrap(), f[0], "{m} at {score}");
            (f[0], f[1], f[2])
        })
        .collect()
}

/// At the batching boundaries — 1 999 to 2 002 and 3 999 to 4 002 members from
/// the instant on, the member at it emptied or keeping units (so the `ZADD` puts
/// back one member fewer or as many as the `ZREM` removed), members before it
/// untouched, several units a member (charges merged at one instant) — the batched
/// refund leaves exactly what session 43's per-member refund leaves, and the log
/// the other charges alone would have made; the key keeps its time to live.
#[test]
fn a_refund_at_the_batch_boundaries_writes_what_the_per_member_refund_writes() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let mut conn = server.connection().unwrap();
    let scripts = scripts();
    let t0 = 1_000_000_u64;
    for k in [1_999_u64, 2_000, 2_001, 2_002, 3_999, 4_000, 4_001, 4_002] {
        for keep in [0_u64, 1] {
            let key = format!("bound{k}:{keep}");
            // Three members before the instant, then k from it on; the one at the
            // instant holds 2 + keep units, a merged charge.
            let mut log: Vec<(u64, u64)> = (0..3).map(|i| (t0 + i, 1 + i % 2)).collect();
            let x = t0 + 10;
            log.push((x, 2 + keep));
            log.extend((1..k).map(|i| (x + i, 1 + i % 3)));
            build_log(&mut conn, &key, &log, 0);
            let total_x: u64 = log.iter().take(4).map(|r| r.1).sum();
            let now = x + k;
            let (got, after) = side_by_side(&mut conn, &scripts, &key, now, (x, 2, total_x, 0));
            assert_eq!(got, Ok(2), "{key}");
            // The model: every later total less 2, the member at x less 2 units.
            let mut want = Vec::new();
            let mut total = 0;
            for &(at, units) in &log {
                let units = if at == x { units - 2 } else { units };
                total += units;
                if units > 0 {
                    want.push((at, units, total));
                }
            }
            assert_eq!(rows(&after), want, "{key}");
            assert_eq!(after.1, "skiplist", "{key}");
            assert!(after.2, "{key}: the time to live lost");
        }
    }
}

/// A number below `n`.
fn below(rng: &mut TestRng, n: u64) -> u64 {
    rng.next_u64() % n
}

/// The ledger in the refund head of a key seen.
fn ledger(s: &Seen) -> u64 {
    let head =
        s.0.iter()
            .map(|(m, _)| m)
            .find(|m| m.split(':').count() == 4)
            .expect("a refund head");
    head.split(':').nth(1).unwrap().parse().unwrap()
}

/// Seeded logs of 1 to 6 000 members (listpacks and skiplists), 1 to 4 units a
/// member, each given 12 refunds in a row: a member's instant and total at
/// random (the newest included), part or all of its units, the ledger seen now
/// or earlier, and now and then a receipt that gives nothing (sent again, more
/// units than the member holds, an instant no member holds). After each, the
/// crate's refund and session 43's leave the same key, member by member, score by
/// score, with the same encoding and time to live, and the totals stay
/// consistent.
#[test]
fn seeded_refunds_write_what_the_per_member_refund_writes() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let mut conn = server.connection().unwrap();
    let scripts = scripts();
    let (mut given, mut nothing, mut listpacks) = (0, 0, 0);
    for seed in 1..=24_u64 {
        let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[seed as u8; 32]);
        let size = match seed % 4 {
            0 => 1 + below(&mut rng, 60),
            1 => 100 + below(&mut rng, 60),
            2 => 1_990 + below(&mut rng, 30),
            _ => 3_990 + below(&mut rng, 2_010),
        };
        let key = format!("seeded{seed}");
        let mut at = 5_000_000_u64;
        let log: Vec<(u64, u64)> = (0..size)
            .map(|_| {
                at += 1 + below(&mut rng, 3);
                (at, 1 + below(&mut rng, 4))
            })
            .collect();
        build_log(&mut conn, &key, &log, below(&mut rng, 1_000));
        let now = at;
        let mut sent = Vec::new();
        for _ in 0..12 {
            let before = seen(&mut conn, &key);
            let members = rows(&before);
            let l = ledger(&before);
            let receipt = match below(&mut rng, 10) {
                0 if !sent.is_empty() => sent[below(&mut rng, sent.len() as u64) as usize],
                1 => (now + 1, 1, 1, l),
                _ if members.is_empty() => (now + 1, 1, 1, l),
                _ => {
                    let (x, units, total) = members[below(&mut rng, members.len() as u64) as usize];
                    let n = if below(&mut rng, 8) == 0 {
                        units + 1
                    } else {
                        1 + below(&mut rng, units)
                    };
                    (x, n, total, l - below(&mut rng, l.min(3) + 1))
                }
            };
            sent.push(receipt);
            let (got, after) = side_by_side(&mut conn, &scripts, &key, now, receipt);
            match got {
                Ok(0) => nothing += 1,
                Ok(_) => given += 1,
                Err(e) => panic!("{key}: {e}"),
            }
            listpacks += usize::from(after.1 == "listpack");
            let rows = rows(&after);
            common::assert_totals_consistent(&rows);
            assert!(after.2, "{key}: the time to live lost");
        }
    }
    eprintln!("{given} refunds gave back, {nothing} nothing, {listpacks} listpacks after");
    assert!(given > 150 && nothing > 20 && listpacks > 40);
}

/// Half past two, the 1st of January 1970, in microseconds.
const MID_HOUR: u64 = 9_000_000_000;

/// Two sliding logs on one request, `hour` an hour and `day` a day, refunds on.
fn two_logs(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    hour: u64,
    day: u64,
) -> RedisLimiter {
    let builder = common::builder(Algorithm::SlidingLog, Policy::per_hour(hour).unwrap())
        .and(Algorithm::SlidingLog, Policy::per_day(day).unwrap());
    with_refunds(rt, server, builder, true)
}

/// `k` one-unit charges of `key` at successive instants from [`MID_HOUR`], each
/// admitted; the first one's receipt.
async fn charged(l: &RedisLimiter, key: &str, k: u64) -> floodgate_redis::RedisReceipt {
    let mut first = None;
    for at in MID_HOUR..MID_HOUR + k {
        let (d, r) = l.charge_n_at_micros(key, 1, at).await.unwrap();
        assert!(d.is_allowed(), "charge at {at}");
        first = first.or(r);
    }
    first.expect("a receipt")
}

/// What each of `keys` holds, exactly (`DUMP`).
fn dumps(server: &RedisServer, keys: &[String]) -> Vec<Vec<u8>> {
    keys.iter().map(|k| server.cmd(&["DUMP", k])).collect()
}

/// A multi-limit refund of two sliding logs (5 000 an hour and 6 000 a day) with
/// 4 501 members each from the refunded instant on — three `ZREM` and three `ZADD`
/// chunks a key — on a server out of memory (`maxmemory` 1, `noeviction`): the
/// script's first write, the first log's new refund head (`ZADD`), is refused,
/// so it fails with `OOM`, retryable, and neither key is written (a later chunk is
/// never reached half way). With memory back, the same receipt gives back on both
/// logs, every later total one lower.
#[test]
fn a_multi_limit_log_refund_out_of_memory_writes_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let l = two_logs(&rt, &server, 5_000, 6_000);
    let key = "oomrefund";
    let k = 4_501_u64;
    let keys = l.redis_keys(key);
    rt.block_on(async {
        let first = charged(&l, key, k).await;
        // The refund script loaded (another key's refund).
        let (_, other) = l.charge_n_at_micros("other", 1, MID_HOUR).await.unwrap();
        let other = other.expect("a receipt");
        assert!(l.refund_at_micros(&other, MID_HOUR + 1).await.unwrap());
        let before = dumps(&server, &keys);
        let _: () = server.cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
        let _: () = server.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
        let out = l.refund_at_micros(&first, MID_HOUR + k).await;
        let _: () = server.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
        match out {
            Err(e) => {
                assert!(matches!(&e, RedisLimitError::Redis(_)), "{e:?}");
                assert!(e.to_string().contains("OOM"), "{e}");
                assert!(e.is_retryable(), "{e:?}");
            }
            Ok(back) => panic!("out of memory, the refund answered {back}"),
        }
        assert_eq!(dumps(&server, &keys), before, "written, then refused");
        assert!(l.refund_at_micros(&first, MID_HOUR + k).await.unwrap());
        for k in &keys {
            let rows = common::log_members(&server, k);
            let want: Vec<(u64, u64, u64)> = (1..4_501).map(|i| (MID_HOUR + i, 1, i)).collect();
            assert_eq!(rows, want, "{k}");
        }
    });
}

/// What one seed of a trace did: steps of each kind, and the refunds made at a
/// reading a wait moved on or a step back moved behind (the last move before
/// them), with those that gave back.
#[derive(Clone, Copy, Debug, Default)]
struct Kinds {
    charges: u32,
    refused: u32,
    refunds: u32,
    given: u32,
    waits: u32,
    backs: u32,
    after_wait: u32,
    after_back: u32,
    given_after_back: u32,
}

/// [`common::drive_trace`] on an in-process limiter alone (the Redis traces of
/// `refunds.rs` agree with it step by step, so they take the same steps),
/// counting the kinds of steps per seed.
struct Counting<A: floodgate::Algorithm> {
    fresh: fn(common::Reading) -> floodgate::RateLimiter<A, common::Reading>,
    local: Option<(floodgate::RateLimiter<A, common::Reading>, common::Reading)>,
    seeds: Vec<Kinds>,
    /// The reading before the step, and whether the step charged or refunded.
    last_us: u64,
    used: bool,
    /// The last move: true a step back, false a wait, None neither yet.
    moved: Option<bool>,
}

impl<A: floodgate::Algorithm> Counting<A> {
    fn at(&self, at: common::TraceStep) -> &floodgate::RateLimiter<A, common::Reading> {
        let (local, clock) = self.local.as_ref().expect("a trace begun");
        clock.set(floodgate::Nanos::new(at.now_us * 1_000));
        local
    }

    fn seed(&mut self) -> &mut Kinds {
        self.seeds.last_mut().expect("a trace begun")
    }
}

impl<A: floodgate::Algorithm> common::Trace for Counting<A> {
    type Receipts = floodgate::Receipt;

    fn begin(&mut self, _seed: u64) {
        let clock = common::Reading::default();
        self.local = Some(((self.fresh)(clock.clone()), clock));
        self.seeds.push(Kinds::default());
        self.last_us = 10_000_000;
        self.moved = None;
    }

    async fn charge(&mut self, at: common::TraceStep, cost: u32) -> Option<floodgate::Receipt> {
        let (d, r) = self
            .at(at)
            .charge_at(floodgate::Nanos::new(at.now_us * 1_000), cost);
        self.used = true;
        let seed = self.seed();
        seed.charges += 1;
        seed.refused += u32::from(!d.is_allowed());
        r.is_charged().then_some(r)
    }

    async fn refund(&mut self, at: common::TraceStep, r: floodgate::Receipt) {
        let back = self.at(at).refund(r);
        self.used = true;
        let moved = self.moved;
        let seed = self.seed();
        seed.refunds += 1;
        seed.given += u32::from(back);
        match moved {
            Some(true) => {
                seed.after_back += 1;
                seed.given_after_back += u32::from(back);
            }
            Some(false) => seed.after_wait += 1,
            None => {}
        }
    }

    async fn after(&mut self, at: common::TraceStep) {
        if !self.used {
            let back = at.now_us < self.last_us;
            self.moved = Some(back);
            let seed = self.seed();
            if back {
                seed.backs += 1;
            } else {
                seed.waits += 1;
            }
        }
        self.used = false;
        self.last_us = at.now_us;
    }
}

/// The shared trace driver after its stall fix, on the three `refunds.rs` traces
/// (GCRA 10/s burst 4, both windows 4 per 400 ms; [`common::ONE_LIMIT_TRACE`]): in every
/// seed of every trace each kind of step is taken — charges, refused charges,
/// refunds, waits, steps back — and refunds follow waits and steps back, some of
/// those after a step back giving back. A seed that stalls (the limit full,
/// nothing held, every step a refused charge at one reading) fails here.
#[test]
fn every_trace_seed_takes_every_kind_of_step() {
    use floodgate::RateLimiter;
    use std::time::Duration;
    fn run<A: floodgate::Algorithm>(
        name: &str,
        fresh: fn(common::Reading) -> RateLimiter<A, common::Reading>,
    ) {
        let mut trace = Counting {
            fresh,
            local: None,
            seeds: Vec::new(),
            last_us: 0,
            used: false,
            moved: None,
        };
        runtime().block_on(common::drive_trace(common::ONE_LIMIT_TRACE, &mut trace));
        for (seed, k) in (1..).zip(&trace.seeds) {
            eprintln!("{name} seed {seed}: {k:?}");
        }
        for (seed, k) in (1..).zip(&trace.seeds) {
            assert!(
                k.charges > 120
                    && k.refused > 50
                    && k.refunds > 45
                    && k.waits > 25
                    && k.backs > 12
                    && k.after_wait > 25
                    && k.after_back > 8
                    && k.given_after_back > 5,
                "{name} seed {seed}: {k:?}"
            );
        }
    }
    run("gcra", |c| {
        RateLimiter::gcra_with_clock(Policy::per_second(10).unwrap().with_burst(4).unwrap(), c)
    });
    run("fixed window", |c| {
        RateLimiter::fixed_window_with_clock(Policy::new(4, Duration::from_millis(400)).unwrap(), c)
            .unwrap()
    });
    run("sliding window", |c| {
        RateLimiter::sliding_window_with_clock(
            Policy::new(4, Duration::from_millis(400)).unwrap(),
            c,
        )
        .unwrap()
    });
}

/// A log planted with running totals that fall after the refunded instant —
/// a member's total less than the one before it plus its units — is malformed
/// (the crate docs: such a key fails the call, naming it, before anything is
/// written). The refund reads every member from the instant on, and checked only
/// that each later total stays at least its units once lowered: it rewrote such
/// logs. Worst, a later member named as the refunded one is renamed (the
/// instant in its name not its score): session 43's per-member writes renamed
/// one onto the other and then removed it, losing the member; the batched writes
/// keep both. Either way the refund now fails as malformed, nothing written.
#[test]
fn a_refund_over_later_totals_that_fall_is_malformed_and_writes_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let mut conn = server.connection().unwrap();
    let (new, _) = scripts();
    let head = format!("refunds:0:0:{BORN}");
    for (name, members) in [
        // The member at 101 named as the one at 100 becomes once 1 unit is given
        // back, its total 4 below 5 + 1.
        (
            "renamed",
            [("99:3:3", 99), ("100:2:5", 100), ("100:1:4", 101)],
        ),
        // The member at 102 holds 2 units, its total 6 only 0 above the one before.
        (
            "fall",
            [("100:1:5", 100), ("101:1:6", 101), ("102:2:6", 102)],
        ),
    ] {
        let key = format!("falls:{name}");
        let mut add = redis::cmd("ZADD");
        add.arg(&key).arg("-inf").arg(&head);
        for (m, score) in members {
            add.arg(score).arg(m);
        }
        let _: () = add.query(&mut conn).unwrap();
        let dump = |conn: &mut redis::Connection| -> Vec<u8> {
            redis::cmd("DUMP").arg(&key).query(conn).unwrap()
        };
        let before = dump(&mut conn);
        let out = refund(&mut conn, &new, &key, 200, (100, 1, 5, 0));
        let e = out.expect_err(&format!("{name}: a refund over totals that fall"));
        assert!(e.contains("malformed") && e.contains(&key), "{name}: {e}");
        assert_eq!(dump(&mut conn), before, "{name}: written");
    }
}

/// A multi-limit refund of two logs whose second log's later totals fall (a
/// member's total planted one below the one before it plus its units): the
/// call fails as malformed, naming that key, and neither log is written — the
/// first, well formed, not given back while the second is refused.
#[test]
fn a_multi_limit_refund_over_a_log_whose_totals_fall_writes_neither() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let l = two_logs(&rt, &server, 10, 20);
    let key = "fallsmulti";
    let keys = l.redis_keys(key);
    rt.block_on(async {
        let first = charged(&l, key, 3).await;
        let last = MID_HOUR + 2;
        let planted = format!("{last}:1:2");
        let _: () = server.cmd(&["ZREM", &keys[1], &format!("{last}:1:3")]);
        let _: () = server.cmd(&["ZADD", &keys[1], &last.to_string(), &planted]);
        let before = dumps(&server, &keys);
        let e = l
            .refund_at_micros(&first, last)
            .await
            .expect_err("a refund over totals that fall");
        let text = e.to_string();
        assert!(text.contains("malformed") && text.contains(&keys[1]), "{e}");
        assert_eq!(dumps(&server, &keys), before, "written");
    });
}
