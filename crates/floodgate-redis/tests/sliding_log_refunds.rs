//! Sliding-log refunds in Redis (session 43): a charge taken with a receipt
//! ([`RedisLimiter::charge_n`]) is given back as the in-process
//! [`floodgate::SlidingLog`] gives it back — the charge's units off the member of
//! its instant, every later running total down by as many — while that instant is
//! in the window, once per receipt, never on another incarnation of the key; and
//! a key charged without receipts keeps exactly the members it always had.

mod common;

use std::time::Duration;

use common::{
    assert_totals_consistent, drive_trace, log_members, members, runtime, sliding_log as log,
    with_refunds as built, RedisServer, Trace, TraceShape, TraceStep,
};
use floodgate::{Clock, ManualClock, Nanos, Policy, Receipt, SlidingLog};
use floodgate_redis::{Algorithm, RedisLimiter, RedisReceipt};

/// The period of the logs below that count by the second: 1 s in microseconds.
const P: u64 = 1_000_000;

/// A sliding log of `limit` per second with refunds on.
fn per_second(rt: &tokio::runtime::Runtime, server: &RedisServer, limit: u64) -> RedisLimiter {
    log(
        rt,
        server,
        Policy::new(limit, Duration::from_micros(P)).unwrap(),
    )
}

/// A decision in whole microseconds (the log's durations are whole microseconds
/// in process too, its instants being whole microseconds here).
fn micros(d: floodgate::Decision) -> (bool, u64, u64, u128, Option<u128>) {
    let up = |t: Duration| t.as_nanos().div_ceil(1_000);
    let (reset, retry) = (up(d.reset_after()), d.retry_after().map(up));
    (d.is_allowed(), d.limit(), d.remaining(), reset, retry)
}

/// The Redis log and the in-process one of a trace: every decision and every
/// refund's answer the same, each receipt sent a second time giving nothing more,
/// the running totals consistent.
struct OneLog<'a> {
    server: &'a RedisServer,
    remote: &'a RedisLimiter,
    policy: Policy,
    clock: ManualClock,
    local: SlidingLog<ManualClock>,
    key: String,
    /// The instant of the seed's last charge.
    last_charge: Option<u64>,
    /// Refunds, units given back (in-process), charges merged at an instant.
    counts: (usize, usize, usize),
}

impl Trace for OneLog<'_> {
    type Receipts = (Receipt, RedisReceipt);

    fn begin(&mut self, seed: u64) {
        self.clock = ManualClock::new();
        self.local = SlidingLog::with_clock(self.policy, self.clock.clone());
        self.key = format!("trace{seed}");
        self.last_charge = None;
    }

    async fn charge(&mut self, at: TraceStep, cost: u32) -> Option<Self::Receipts> {
        let now_us = at.now_us;
        self.clock.set(Nanos::new(now_us * 1_000));
        let (d, r) = self.local.charge_at(Nanos::new(now_us * 1_000), cost);
        let (rd, rr) = self
            .remote
            .charge_n_at_micros(&self.key, cost, now_us)
            .await
            .unwrap();
        assert_eq!(micros(rd), micros(d), "{at}: charge");
        assert_eq!(rr.is_some(), r.is_charged(), "{at}");
        let rr = rr?;
        if self.last_charge == Some(now_us) {
            self.counts.2 += 1;
        }
        self.last_charge = Some(now_us);
        Some((r, rr))
    }

    async fn refund(&mut self, at: TraceStep, (r, rr): Self::Receipts) {
        self.clock.set(Nanos::new(at.now_us * 1_000));
        let back = self.local.refund(r);
        // The in-process refund reads the clock, which never steps back.
        let latest = self.clock.now().as_u64() / 1_000;
        let rback = self.remote.refund_at_micros(&rr, latest).await.unwrap();
        assert_eq!(rback, back, "{at}: refund");
        self.counts.0 += 1;
        self.counts.1 += usize::from(back);
        assert!(!self.remote.refund_at_micros(&rr, latest).await.unwrap());
    }

    async fn after(&mut self, at: TraceStep) {
        let now = Nanos::new(at.now_us * 1_000);
        self.clock.set(now);
        let d = self.local.peek_at(now, 0);
        let rd = self
            .remote
            .peek_n_at_micros(&self.key, 0, at.now_us)
            .await
            .unwrap();
        assert_eq!(micros(rd), micros(d), "{at}: state");
        assert_totals_consistent(&log_members(self.server, &format!("test:{}", self.key)));
    }
}

/// Random charges (costs 1 to 3, often several at one instant), refunds of the
/// receipts held (in any order), waits of up to half the period and, now and then,
/// a reading that steps back, replayed on Redis's scripts and on the in-process
/// log at the same instants ([`drive_trace`]): every decision and every refund's
/// answer is the same, each receipt sent a second time gives nothing more, and
/// the running totals stay consistent.
#[test]
fn sliding_log_refunds_give_back_what_the_in_process_refunds_give_back() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    // 5 per 400 ms, passed in steps of up to 200 ms.
    let policy = Policy::new(5, Duration::from_millis(400)).unwrap();
    let remote = log(&rt, &server, policy);
    let clock = ManualClock::new();
    let mut trace = OneLog {
        server: &server,
        remote: &remote,
        policy,
        local: SlidingLog::with_clock(policy, clock.clone()),
        clock,
        key: String::new(),
        last_charge: None,
        counts: (0, 0, 0),
    };
    let shape = TraceShape {
        seeds: 16,
        steps: 300,
        max_cost: 3,
        held: 5,
        wait_us: 200_000,
        back_us: 150_000,
    };
    rt.block_on(drive_trace(shape, &mut trace));
    let (refunded, given, merged) = trace.counts;
    assert!(
        refunded > 300 && given > 150 && merged > 50,
        "{given}/{refunded}, {merged} merged"
    );
}

/// Three charges at one instant (1, 2 and 3 units: one member of 6) and one later:
/// each refund takes its own units off the shared member — the later member's
/// running total down by as many — once, whichever replica sends it; the member
/// goes when its last unit is given back.
#[test]
fn charges_merged_at_one_instant_are_given_back_each_once() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let policy = Policy::per_hour(10).unwrap();
    let a = log(&rt, &server, policy);
    let b = log(&rt, &server, policy);
    rt.block_on(async {
        let t = 5_000_000_u64;
        let mut r = Vec::new();
        for cost in [1, 2, 3] {
            r.push(a.charge_n_at_micros("m", cost, t).await.unwrap().1.unwrap());
        }
        let later = b
            .charge_n_at_micros("m", 4, t + 7)
            .await
            .unwrap()
            .1
            .unwrap();
        assert_eq!(log_members(&server, "test:m"), [(t, 6, 6), (t + 7, 4, 10)]);
        let (x, y) = tokio::join!(
            a.refund_at_micros(&r[1], t + 9),
            b.refund_at_micros(&r[1], t + 9)
        );
        assert!(x.unwrap() ^ y.unwrap(), "exactly one gives back");
        assert_eq!(log_members(&server, "test:m"), [(t, 4, 4), (t + 7, 4, 8)]);
        assert_eq!(
            a.peek_n_at_micros("m", 0, t + 9).await.unwrap().remaining(),
            2
        );
        assert!(b.refund_at_micros(&r[2], t + 9).await.unwrap());
        assert!(!a.refund_at_micros(&r[2], t + 9).await.unwrap());
        assert_eq!(log_members(&server, "test:m"), [(t, 1, 1), (t + 7, 4, 5)]);
        assert!(a.refund_at_micros(&r[0], t + 9).await.unwrap());
        assert_eq!(log_members(&server, "test:m"), [(t + 7, 4, 4)]);
        assert!(a.refund_at_micros(&later, t + 9).await.unwrap());
        assert!(log_members(&server, "test:m").is_empty());
        // Every unit back: 10 admissions, then a denial.
        assert_eq!(
            a.peek_n_at_micros("m", 0, t + 9).await.unwrap().remaining(),
            10
        );
        assert!(a
            .check_n_at_micros("m", 10, t + 9)
            .await
            .unwrap()
            .is_allowed());
        assert!(!b
            .check_n_at_micros("m", 1, t + 9)
            .await
            .unwrap()
            .is_allowed());
        for x in r.iter().chain([&later]) {
            assert!(!a.refund_at_micros(x, t + 9).await.unwrap());
        }
    });
}

/// A charge whose instant has left the window gives nothing back (at the window's
/// very end, and after it) and changes nothing; one still in it gives back.
#[test]
fn a_refund_after_its_instant_left_the_window_gives_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let l = per_second(&rt, &server, 3);
    rt.block_on(async {
        let t = 9_000_000_u64;
        let old = l.charge_n_at_micros("w", 2, t).await.unwrap().1.unwrap();
        let kept = l
            .charge_n_at_micros("w", 1, t + 10)
            .await
            .unwrap()
            .1
            .unwrap();
        let before = members(&server, "test:w");
        for at in [t + P, t + P + 5] {
            assert!(!l.refund_at_micros(&old, at).await.unwrap(), "at {at}");
            assert_eq!(members(&server, "test:w"), before);
        }
        // The later charge still counts at t + P: given back.
        assert!(l.refund_at_micros(&kept, t + P).await.unwrap());
        assert_eq!(
            l.peek_n_at_micros("w", 0, t + P).await.unwrap().remaining(),
            3
        );
    });
}

/// A key lost between a charge and its refund and charged afresh — at the very
/// instant of the charge, too: the old receipt gives nothing back (the key's
/// incarnation differs), and the fresh key's units all stay taken.
#[test]
fn a_receipt_of_a_lost_log_gives_nothing_back_on_its_successor() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let policy = Policy::per_hour(5).unwrap();
    let l = log(&rt, &server, policy);
    let off = built(
        &rt,
        &server,
        common::builder(Algorithm::SlidingLog, policy),
        false,
    );
    rt.block_on(async {
        let t0 = 3_600_000_000_u64;
        let (_, r) = l.charge_n_at_micros("lost", 3, t0).await.unwrap();
        let r = r.unwrap();
        let _: i64 = server.cmd(&["DEL", "test:lost"]);
        // The fresh key: first charged with a receipt a microsecond earlier (another
        // incarnation), then at the receipt's instant.
        assert!(l
            .charge_n_at_micros("lost", 2, t0 - 1)
            .await
            .unwrap()
            .0
            .is_allowed());
        assert!(l
            .charge_n_at_micros("lost", 3, t0)
            .await
            .unwrap()
            .0
            .is_allowed());
        assert!(!l.refund_at_micros(&r, t0).await.unwrap());
        assert_eq!(
            l.peek_n_at_micros("lost", 0, t0).await.unwrap().remaining(),
            0
        );
        // A fresh key charged without receipts: no refund member, nothing back.
        let _: i64 = server.cmd(&["DEL", "test:lost"]);
        assert!(off
            .check_n_at_micros("lost", 3, t0)
            .await
            .unwrap()
            .is_allowed());
        assert!(!l.refund_at_micros(&r, t0).await.unwrap());
        assert_eq!(
            l.peek_n_at_micros("lost", 0, t0).await.unwrap().remaining(),
            2
        );
    });
}

/// A refund gives back the newest unit: a later reading behind it is still judged
/// at that unit's instant (its admission dropped the units that had left the
/// window there), so a charge then is logged there and leaves the window when the
/// in-process log's does.
#[test]
fn a_reading_behind_a_newest_unit_given_back_is_judged_at_its_instant() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let l = per_second(&rt, &server, 2);
    rt.block_on(async {
        let t = 20_000_000_u64;
        assert!(l.check_n_at_micros("b", 1, t).await.unwrap().is_allowed());
        let r = l
            .charge_n_at_micros("b", 1, t + 500_000)
            .await
            .unwrap()
            .1
            .unwrap();
        assert!(l.refund_at_micros(&r, t + 500_000).await.unwrap());
        // A reading 0.4 s behind: judged at t + 0.5 s, logged there.
        assert!(l
            .check_n_at_micros("b", 1, t + 100_000)
            .await
            .unwrap()
            .is_allowed());
        assert_eq!(
            log_members(&server, "test:b"),
            [(t, 1, 1), (t + 500_000, 1, 2)]
        );
        let d = l.peek_n_at_micros("b", 0, t + P + 200_000).await.unwrap();
        assert_eq!(d.remaining(), 1, "{d:?}");
    });
}

/// Running totals past 2^52: a charge renumbers the live members (every refund
/// member put back: the head, the latest instant logged, the record), a receipt
/// taken before the renumbering still gives back its units, exactly, once, and
/// one given back before it gives nothing again (not the units another charge
/// merged at its instant holds).
#[test]
fn a_receipt_taken_before_the_totals_are_renumbered_still_gives_back() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let l = per_second(&rt, &server, 100);
    rt.block_on(async {
        let t = 50_000_000_u64;
        let big = (1_u64 << 52) - 20;
        // A long-lived key: the totals near 2^52 (an old unit, one in the window).
        let old = (t - 2 * P).to_string();
        let live = (t - 10).to_string();
        let _: i64 = server.cmd(&["ZADD", "test:n", &old, &format!("{old}:5:{}", big - 4)]);
        let _: i64 = server.cmd(&["ZADD", "test:n", &live, &format!("{live}:4:{big}")]);
        let r0 = l.charge_n_at_micros("n", 1, t).await.unwrap().1.unwrap();
        let r = l.charge_n_at_micros("n", 3, t).await.unwrap().1.unwrap();
        assert!(l.refund_at_micros(&r0, t).await.unwrap());
        let refund_members = || -> Vec<(String, String)> {
            let all = members(&server, "test:n");
            all.into_iter().filter(|(_, s)| s == "-inf").collect()
        };
        let kept = refund_members();
        assert_eq!(kept.len(), 3, "{kept:?}");
        assert_eq!(
            log_members(&server, "test:n").last(),
            Some(&(t, 3, big + 3))
        );
        // 20 more at t + 1: past 2^52, renumbered from the oldest live member.
        let (d, _) = l.charge_n_at_micros("n", 20, t + 1).await.unwrap();
        assert!(d.is_allowed() && d.remaining() == 73, "{d:?}");
        assert_eq!(
            log_members(&server, "test:n"),
            [(t - 10, 4, 4), (t, 3, 7), (t + 1, 20, 27)]
        );
        assert_eq!(refund_members(), kept);
        assert!(!l.refund_at_micros(&r0, t + 2).await.unwrap());
        assert!(l.refund_at_micros(&r, t + 2).await.unwrap());
        assert!(!l.refund_at_micros(&r, t + 2).await.unwrap());
        assert_eq!(
            log_members(&server, "test:n"),
            [(t - 10, 4, 4), (t + 1, 20, 24)]
        );
        assert_eq!(
            l.peek_n_at_micros("n", 0, t + 2).await.unwrap().remaining(),
            76
        );
    });
}

/// Refunds off (a rolling deploy): a key charged without receipts holds exactly
/// the members it always did; a charge with receipts adds the refund member at
/// -inf, which a limiter with refunds off reads (its decisions unchanged) and keeps
/// — also when its admission drops the members that left the window — so the
/// receipt still gives back.
#[test]
fn with_refunds_off_the_log_keeps_its_members_and_the_refund_member() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let policy = Policy::new(4, Duration::from_micros(P)).unwrap();
    let builder = || common::builder(Algorithm::SlidingLog, policy);
    let on = built(&rt, &server, builder(), true);
    let off = built(&rt, &server, builder(), false);
    rt.block_on(async {
        let t = 30_000_000_u64;
        let (d, r) = off.charge_n_at_micros("o", 1, t).await.unwrap();
        assert!(d.is_allowed() && r.is_none());
        let (v, r) = off.charge_n("o-now", 1).await.unwrap();
        assert!(v.decision().is_allowed() && r.is_none());
        assert!(!members(&server, "test:o-now")[0].0.starts_with("refunds:"));
        assert_eq!(
            members(&server, "test:o"),
            [(format!("{t}:1:1"), t.to_string())]
        );
        let r = on
            .charge_n_at_micros("o", 2, t + 1)
            .await
            .unwrap()
            .1
            .unwrap();
        let all = members(&server, "test:o");
        assert!(
            all[0].0.starts_with("refunds:") && all[0].1 == "-inf",
            "{all:?}"
        );
        assert!(!off.refund_at_micros(&r, t + 1).await.unwrap());
        // Refunds off: the same decisions, the refund member kept, also when the
        // unit at t leaves the window.
        assert_eq!(
            off.peek_n_at_micros("o", 0, t + 1)
                .await
                .unwrap()
                .remaining(),
            1
        );
        assert!(off
            .check_n_at_micros("o", 1, t + P)
            .await
            .unwrap()
            .is_allowed());
        assert_eq!(
            log_members(&server, "test:o"),
            [(t + 1, 2, 3), (t + P, 1, 4)]
        );
        assert!(members(&server, "test:o")[0].0.starts_with("refunds:"));
        assert!(on.refund_at_micros(&r, t + P).await.unwrap());
        assert_eq!(log_members(&server, "test:o"), [(t + P, 1, 2)]);
        assert_eq!(
            off.peek_n_at_micros("o", 0, t + P)
                .await
                .unwrap()
                .remaining(),
            3
        );
    });
}

/// Several limits with a sliding log (GCRA, burst 5, and a log of 4): a charge
/// given back is given back on both limits, in one run, once.
#[test]
fn a_multi_limit_refund_gives_back_the_sliding_logs_part() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let gcra = Policy::per_hour(1).unwrap().with_burst(5).unwrap();
    let window = Policy::new(4, Duration::from_secs(10)).unwrap();
    let builder = common::builder(Algorithm::Gcra, gcra).and(Algorithm::SlidingLog, window);
    let a = built(&rt, &server, builder.clone(), true);
    let b = built(&rt, &server, builder, true);
    rt.block_on(async {
        let t = 2_003_000_000;
        assert!(a.check_n_at_micros("m", 1, t).await.unwrap().is_allowed());
        let r = a.charge_n_at_micros("m", 3, t).await.unwrap().1.unwrap();
        assert!(!a.peek_n_at_micros("m", 1, t).await.unwrap().is_allowed());
        let (x, y) = tokio::join!(a.refund_at_micros(&r, t), b.refund_at_micros(&r, t));
        assert!(x.unwrap() ^ y.unwrap(), "exactly one gives back");
        // GCRA 4 left, the log 3: the tightest is 3.
        assert_eq!(a.peek_n_at_micros("m", 0, t).await.unwrap().remaining(), 3);
        assert!(b.check_n_at_micros("m", 3, t).await.unwrap().is_allowed());
        assert!(!a.check_n_at_micros("m", 1, t).await.unwrap().is_allowed());
        let key = &a.redis_keys("m")[1];
        assert_eq!(log_members(&server, key), [(t, 4, 4)]);
    });
}

/// Refund members that no script writes (another score, fields that do not
/// parse or not as a script writes them, one twice, records without the head,
/// more records than a reader accepts (65: it reads 64, see `review_s47_slog_read`),
/// a log member at -inf) are a malformed
/// state: a charge and a refund fail with an error naming the key, and write
/// nothing.
#[test]
fn a_malformed_refund_member_fails_the_call_and_writes_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let l = log(&rt, &server, Policy::per_hour(5).unwrap());
    rt.block_on(async {
        let t = 1_000_000_u64;
        let r = l.charge_n_at_micros("bad", 1, t).await.unwrap().1.unwrap();
        let good = members(&server, "test:bad")[0].0.clone();
        let g = good.as_str();
        let many: Vec<String> = (0..65).map(|i| format!("refunds:id:0/{i}/1")).collect();
        let mut cases: Vec<Vec<(&str, &str)>> = vec![
            vec![("-inf", "refunds:0:0:zz:0:")],
            vec![("-5", g)],
            vec![("-inf", g), ("-inf", "refunds:id:0/1/zz")],
            vec![("-inf", g), ("-inf", "refunds:id:00/1000000/1")],
            vec![
                ("-inf", g),
                ("-inf", "refunds:logged:1"),
                ("-inf", "refunds:logged:2"),
            ],
            vec![("-inf", g), ("-inf", "refunds:1:0:5")],
            vec![("-inf", "refunds:id:0/1000000/1")],
            vec![("-inf", g), ("-inf", "999999:1:1")],
        ];
        cases.push(
            std::iter::once(g)
                .chain(many.iter().map(String::as_str))
                .map(|m| ("-inf", m))
                .collect(),
        );
        for case in cases {
            let _: i64 = server.cmd(&["ZREM", "test:bad", &good]);
            for (score, member) in &case {
                let _: i64 = server.cmd(&["ZADD", "test:bad", score, member]);
            }
            let before = members(&server, "test:bad");
            let e = l.refund_at_micros(&r, t).await.unwrap_err().to_string();
            assert!(e.contains("malformed") && e.contains("test:bad"), "{e}");
            let e = l
                .check_n_at_micros("bad", 1, t)
                .await
                .unwrap_err()
                .to_string();
            assert!(e.contains("malformed"), "{e}");
            assert_eq!(members(&server, "test:bad"), before, "{case:?}");
            for (_, member) in &case {
                let _: i64 = server.cmd(&["ZREM", "test:bad", member]);
            }
        }
        // Put back as a script wrote it, the key works again.
        let _: i64 = server.cmd(&["ZADD", "test:bad", "-inf", &good]);
        assert!(l.refund_at_micros(&r, t).await.unwrap());
    });
}
