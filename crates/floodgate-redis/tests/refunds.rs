//! Refunds in Redis (session 42): a GCRA charge taken with a receipt
//! ([`RedisLimiter::charge_n`]) is given back by [`RedisLimiter::refund`] as the
//! in-process GCRA refund gives it back, at most once however often (and by
//! whichever replica) the receipt is sent, and never so that more is admitted than
//! the limit.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{drive_trace, runtime, Reading, RedisServer, Trace, TraceStep};
use floodgate::{AsyncLimit, Nanos, Policy, RateLimiter, Receipt};
use floodgate_redis::{Algorithm, OnFailure, RedisLimiter, RedisReceipt};

async fn limiter(server: &RedisServer, algorithm: Algorithm, policy: Policy) -> RedisLimiter {
    built(server, common::builder(algorithm, policy)).await
}

/// A limiter with refunds turned on ([`RedisLimiterBuilder::refunds`]).
async fn built(
    server: &RedisServer,
    builder: floodgate_redis::RedisLimiterBuilder,
) -> RedisLimiter {
    connected(server, builder.refunds(true)).await
}

/// `builder` as it is (refunds off unless it turned them on), on `server`.
async fn connected(
    server: &RedisServer,
    builder: floodgate_redis::RedisLimiterBuilder,
) -> RedisLimiter {
    let conn = floodgate_redis::connect(&server.url()).await.unwrap();
    builder
        .prefix("refunds:")
        .timeout(Duration::from_secs(5))
        .on_failure(OnFailure::Error)
        .build(conn)
        .unwrap()
}

/// A decision in whole microseconds, its durations rounded up as the scripts report
/// them (only the sliding window's in-process waits fall between microseconds).
fn micros(d: floodgate::Decision) -> (bool, u64, u64, u128, Option<u128>) {
    let up = |t: Duration| t.as_nanos().div_ceil(1_000);
    let (reset, retry) = (up(d.reset_after()), d.retry_after().map(up));
    (d.is_allowed(), d.limit(), d.remaining(), reset, retry)
}

/// One Redis limit and its in-process twin on a clock read where the trace
/// stands ([`common::drive_trace`], readings behind included): every decision (in
/// whole microseconds) and every refund's answer the same, and each receipt sent
/// a second time gives nothing more.
struct OneLimit<'a, A: floodgate::Algorithm> {
    remote: &'a RedisLimiter,
    fresh: Box<dyn Fn(Reading) -> RateLimiter<A, Reading>>,
    local: Option<(RateLimiter<A, Reading>, Reading)>,
    key: String,
    /// Per seed: the refunds made, and those that gave back.
    counts: Vec<(usize, usize)>,
    /// Whether Redis judges a refund no earlier than the key's latest reading
    /// (GCRA): the in-process refund is then judged at the latest reading a
    /// charge was admitted at, where the trace stands behind it.
    at_latest: bool,
    /// The latest reading a charge was admitted at, this seed.
    latest: Nanos,
}

impl<A: floodgate::Algorithm> OneLimit<'_, A> {
    /// The in-process limiter, its clock set to `at`.
    fn at(&self, at: TraceStep) -> (&RateLimiter<A, Reading>, Nanos) {
        let (local, clock) = self.local.as_ref().expect("a trace begun");
        let now = Nanos::new(at.now_us * 1_000);
        clock.set(now);
        (local, now)
    }
}

impl<A: floodgate::Algorithm> Trace for OneLimit<'_, A> {
    type Receipts = (Receipt, RedisReceipt);

    fn begin(&mut self, seed: u64) {
        let clock = Reading::default();
        self.local = Some(((self.fresh)(clock.clone()), clock));
        self.key = format!("trace{seed}");
        self.counts.push((0, 0));
        self.latest = Nanos::new(0);
    }

    async fn charge(&mut self, at: TraceStep, cost: u32) -> Option<Self::Receipts> {
        let (local, now) = self.at(at);
        let (d, r) = local.charge_at(now, cost);
        let remote = self.remote.charge_n_at_micros(&self.key, cost, at.now_us);
        let (rd, rr) = remote.await.unwrap();
        assert_eq!(micros(rd), micros(d), "{at}: charge {cost}");
        assert_eq!(rr.is_some(), r.is_charged(), "{at}");
        if r.is_charged() && now > self.latest {
            self.latest = now;
        }
        Some((r, rr?))
    }

    async fn refund(&mut self, at: TraceStep, (r, rr): Self::Receipts) {
        let (local, now) = self.at(at);
        if self.at_latest && self.latest > now {
            self.local
                .as_ref()
                .expect("a trace begun")
                .1
                .set(self.latest);
        }
        let back = local.refund(r);
        let rback = self.remote.refund_at_micros(&rr, at.now_us).await.unwrap();
        assert_eq!(rback, back, "{at}: refund");
        let seed = self.counts.last_mut().expect("a trace begun");
        seed.0 += 1;
        seed.1 += usize::from(back);
        // Sent again (a lost reply, another replica): nothing more.
        assert!(!self.remote.refund_at_micros(&rr, at.now_us).await.unwrap());
    }

    async fn after(&mut self, at: TraceStep) {
        let (local, now) = self.at(at);
        let d = local.peek_at(now, 0);
        let rd = self.remote.peek_n_at_micros(&self.key, 0, at.now_us);
        assert_eq!(micros(rd.await.unwrap()), micros(d), "{at}: state");
    }
}

/// Random charges (1 or 2 units), refunds (in any order, up to 4 outstanding),
/// waits (under 150 ms) and readings up to 100 ms behind on one key a seed, 12
/// seeds of 300 steps ([`common::drive_trace`]), replayed on Redis's scripts and
/// on the in-process limiter `fresh` makes at the same readings ([`OneLimit`]);
/// every seed makes over 20 refunds, over 10 of them giving back. Returns the
/// refunds made and those that gave back, over all seeds.
fn replay_against_in_process<A: floodgate::Algorithm>(
    server: &RedisServer,
    algorithm: Algorithm,
    policy: Policy,
    fresh: Box<dyn Fn(Reading) -> RateLimiter<A, Reading>>,
) -> (usize, usize) {
    let rt = runtime();
    let remote = rt.block_on(limiter(server, algorithm, policy));
    let mut trace = OneLimit {
        remote: &remote,
        fresh,
        local: None,
        key: String::new(),
        counts: Vec::new(),
        at_latest: algorithm == Algorithm::Gcra,
        latest: Nanos::new(0),
    };
    rt.block_on(drive_trace(common::ONE_LIMIT_TRACE, &mut trace));
    for (seed, &(refunded, given)) in (1..).zip(&trace.counts) {
        assert!(
            refunded > 20 && given > 10,
            "seed {seed}: {given}/{refunded}"
        );
    }
    let total = |f: fn(&(usize, usize)) -> usize| trace.counts.iter().map(f).sum::<usize>();
    let counts = (total(|c| c.0), total(|c| c.1));
    eprintln!(
        "{algorithm:?}: {} refunds, {} gave back",
        counts.0, counts.1
    );
    counts
}

/// GCRA: Redis gives back exactly what the in-process refund does — the booking
/// still ahead of now, moved down by the refunds made since the charge — judged
/// no earlier than the latest reading a charge was admitted at (the key's latest
/// reading). Fails if Redis judges at the reading it is given (`local at = now`
/// in `gcra_refund`): seed 1 step 12.
#[test]
fn gcra_refunds_give_back_what_the_in_process_refunds_give_back() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    // T = 100 ms, B = 4: a 400 ms schedule, passed in steps of up to 150 ms.
    let policy = Policy::per_second(10).unwrap().with_burst(4).unwrap();
    let fresh = move |clock| RateLimiter::gcra_with_clock(policy, clock);
    replay_against_in_process(&server, Algorithm::Gcra, policy, Box::new(fresh));
}

/// The fixed window: the charge's units back while its window lasts, none after.
#[test]
fn fixed_window_refunds_give_back_what_the_in_process_refunds_give_back() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    // 4 per 400 ms windows, passed in steps of up to 150 ms.
    let policy = Policy::new(4, Duration::from_millis(400)).unwrap();
    let fresh = move |clock| RateLimiter::fixed_window_with_clock(policy, clock).unwrap();
    replay_against_in_process(&server, Algorithm::FixedWindow, policy, Box::new(fresh));
}

/// A charge of 2 given back restores exactly 2 admissions, and the receipt sent a
/// second time — by the same replica or another, at once — gives nothing more.
#[test]
fn a_refund_restores_its_charge_once() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        // B = 5 per hour: no unit comes back by the clock during the test.
        let policy = Policy::per_hour(5).unwrap();
        let a = limiter(&server, Algorithm::Gcra, policy).await;
        let b = limiter(&server, Algorithm::Gcra, policy).await;
        // A unit first: the charge given back is booked ahead of the clock.
        assert!(a.check_n("u", 1).await.unwrap().decision().is_allowed());
        let (v, receipt) = a.charge_n("u", 2).await.unwrap();
        assert!(v.decision().is_allowed());
        let receipt = receipt.expect("an admission of cost 2 has a receipt");
        let (v, _) = a.charge_n("u", 2).await.unwrap();
        assert_eq!(v.decision().remaining(), 0);
        assert!(!a.peek_n("u", 1).await.unwrap().decision().is_allowed());
        let (first, again) = tokio::join!(a.refund(&receipt), b.refund(&receipt));
        assert!(first.unwrap() ^ again.unwrap(), "exactly one gives back");
        assert!(!a.refund(&receipt).await.unwrap());
        // Exactly the 2 units: 2 admissions, then a denial.
        assert_eq!(a.peek_n("u", 0).await.unwrap().decision().remaining(), 2);
        assert!(b.check_n("u", 1).await.unwrap().decision().is_allowed());
        assert!(a.check_n("u", 1).await.unwrap().decision().is_allowed());
        assert!(!b.check_n("u", 1).await.unwrap().decision().is_allowed());
        // A denial and a cost of 0 take nothing and carry no receipt.
        assert!(a.charge_n("u", 1).await.unwrap().1.is_none());
        assert!(a.charge_n("u", 0).await.unwrap().1.is_none());
        // Through the async trait: the receipt of another key gives nothing.
        let (d, r) = AsyncLimit::charge_n(&a, "w", 1).await.unwrap();
        assert!(d.is_allowed() && r.is_charged());
        assert!(!AsyncLimit::refund(&a, "u", r).await.unwrap());
        let (_, r) = AsyncLimit::charge_n(&a, "w", 1).await.unwrap();
        assert!(AsyncLimit::refund(&a, "w", r).await.unwrap());
        assert_eq!(a.peek_n("w", 0).await.unwrap().decision().remaining(), 4);
    });
}

/// A key remembers its last 8 refunds: a receipt refunded before them is refused
/// by the ledger floor, not given back a second time (its booking, moved down by
/// the 8 refunds since, would otherwise still lie ahead of the clock).
#[test]
fn a_receipt_refunded_before_the_last_eight_refunds_gives_nothing_again() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        // T = 100 ms, B = 20, all at one instant.
        let policy = Policy::per_second(10).unwrap().with_burst(20).unwrap();
        let l = limiter(&server, Algorithm::Gcra, policy).await;
        let t0 = 5_000_000;
        for _ in 0..10 {
            assert!(l.check_n_at_micros("k", 1, t0).await.unwrap().is_allowed());
        }
        let (_, r) = l.charge_n_at_micros("k", 1, t0).await.unwrap();
        let r = r.unwrap();
        let mut later = Vec::new();
        for _ in 0..8 {
            later.push(l.charge_n_at_micros("k", 1, t0).await.unwrap().1.unwrap());
        }
        assert!(l.refund_at_micros(&r, t0).await.unwrap());
        for x in &later {
            assert!(l.refund_at_micros(x, t0).await.unwrap());
        }
        let left = |d: floodgate::Decision| d.remaining();
        assert_eq!(left(l.peek_n_at_micros("k", 0, t0).await.unwrap()), 10);
        assert!(!l.refund_at_micros(&r, t0).await.unwrap());
        assert_eq!(left(l.peek_n_at_micros("k", 0, t0).await.unwrap()), 10);
    });
}

/// The sliding window counter: the current window's count, while its window lasts.
#[test]
fn sliding_window_refunds_give_back_what_the_in_process_refunds_give_back() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    // 4 per 400 ms windows, passed in steps of up to 150 ms.
    let policy = Policy::new(4, Duration::from_millis(400)).unwrap();
    let fresh = move |clock| RateLimiter::sliding_window_with_clock(policy, clock).unwrap();
    replay_against_in_process(&server, Algorithm::SlidingWindow, policy, Box::new(fresh));
}

/// Two replicas charge one key concurrently and give back about half their
/// admissions, each refund sent twice (once by each replica, concurrently), on
/// GCRA, both windows and the sliding log (alone and behind GCRA): the admissions
/// kept never exceed the limit (6, all at one instant: no unit comes back by the
/// clock) plus the charges given back, and each receipt gives back at most once.
#[test]
fn two_replicas_charging_and_refunding_never_admit_beyond_the_limit() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    const NOW: u64 = 7_000_000_000;
    runtime().block_on(async {
        let policy = Policy::per_hour(6).unwrap();
        let builder = |a| common::builder(a, policy);
        // Several limits: the fixed window's (the log's) 6 binds, GCRA's 7 does not.
        let several =
            |a| common::builder(Algorithm::Gcra, policy.with_burst(7).unwrap()).and(a, policy);
        for (algorithm, builder) in [
            ("gcra", builder(Algorithm::Gcra)),
            ("fixed", builder(Algorithm::FixedWindow)),
            ("sliding", builder(Algorithm::SlidingWindow)),
            ("log", builder(Algorithm::SlidingLog)),
            ("several", several(Algorithm::FixedWindow)),
            ("several-log", several(Algorithm::SlidingLog)),
        ] {
            let key = format!("shared-{algorithm}");
            let a = Arc::new(built(&server, builder.clone()).await);
            let b = Arc::new(built(&server, builder).await);
            let admitted = Arc::new(AtomicU64::new(0));
            let refunded = Arc::new(AtomicU64::new(0));
            let mut tasks = Vec::new();
            for worker in 0..8_u64 {
                let (own, other) = if worker % 2 == 0 {
                    (Arc::clone(&a), Arc::clone(&b))
                } else {
                    (Arc::clone(&b), Arc::clone(&a))
                };
                let (admitted, refunded) = (Arc::clone(&admitted), Arc::clone(&refunded));
                let key = key.clone();
                tasks.push(tokio::spawn(async move {
                    for i in 0..60_u64 {
                        let (d, receipt) = own.charge_n_at_micros(&key, 1, NOW).await.unwrap();
                        if !d.is_allowed() {
                            continue;
                        }
                        admitted.fetch_add(1, Ordering::SeqCst);
                        let receipt: RedisReceipt = receipt.unwrap();
                        if (i + worker) % 2 == 0 {
                            let (x, y) = tokio::join!(
                                own.refund_at_micros(&receipt, NOW),
                                other.refund_at_micros(&receipt, NOW)
                            );
                            let (x, y) = (x.unwrap(), y.unwrap());
                            assert!(!(x && y), "a receipt gave back twice");
                            if x || y {
                                refunded.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            let (admitted, refunded) = (
                admitted.load(Ordering::SeqCst),
                refunded.load(Ordering::SeqCst),
            );
            assert!(
                admitted <= 6 + refunded,
                "{algorithm:?}: {admitted} admitted, {refunded} given back: beyond the limit of 6"
            );
            assert!(
                refunded > 0 && admitted > 6,
                "{algorithm:?}: {admitted} admitted, {refunded} given back"
            );
        }
    });
}

/// The fixed window: a charge of 2 given back restores exactly 2 admissions in its
/// window, once, whichever replica sends it; in the next window it gives nothing.
#[test]
fn a_fixed_window_refund_restores_its_charge_once_and_only_in_its_window() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        // 5 per 10 s windows; 3 s into window 100.
        let policy = Policy::new(5, Duration::from_secs(10)).unwrap();
        let a = limiter(&server, Algorithm::FixedWindow, policy).await;
        let b = limiter(&server, Algorithm::FixedWindow, policy).await;
        let t = 1_003_000_000;
        assert!(a.check_n_at_micros("f", 1, t).await.unwrap().is_allowed());
        let r = a.charge_n_at_micros("f", 2, t).await.unwrap().1.unwrap();
        let last = b.charge_n_at_micros("f", 2, t).await.unwrap().1.unwrap();
        assert!(!a.peek_n_at_micros("f", 1, t).await.unwrap().is_allowed());
        let (x, y) = tokio::join!(a.refund_at_micros(&r, t), b.refund_at_micros(&r, t));
        assert!(x.unwrap() ^ y.unwrap(), "exactly one gives back");
        assert_eq!(a.peek_n_at_micros("f", 0, t).await.unwrap().remaining(), 2);
        assert!(b.check_n_at_micros("f", 2, t).await.unwrap().is_allowed());
        assert!(!a.check_n_at_micros("f", 1, t).await.unwrap().is_allowed());
        // Window 101: the receipt of window 100 gives nothing.
        let next = t + 10_000_000;
        assert!(a
            .check_n_at_micros("f", 1, next)
            .await
            .unwrap()
            .is_allowed());
        assert!(!a.refund_at_micros(&last, next).await.unwrap());
        assert_eq!(
            a.peek_n_at_micros("f", 0, next).await.unwrap().remaining(),
            4
        );
    });
}

/// Several limits (GCRA, burst 3, and a fixed window of 4): a charge given back is
/// given back on every limit it charged, at once and once.
#[test]
fn a_multi_limit_refund_gives_back_every_limit_once() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let gcra = Policy::per_hour(1).unwrap().with_burst(3).unwrap();
        let window = Policy::new(4, Duration::from_secs(10)).unwrap();
        let builder = common::builder(Algorithm::Gcra, gcra).and(Algorithm::FixedWindow, window);
        let a = built(&server, builder.clone()).await;
        let b = built(&server, builder).await;
        let t = 2_003_000_000;
        assert!(a.check_n_at_micros("m", 1, t).await.unwrap().is_allowed());
        let r = a.charge_n_at_micros("m", 2, t).await.unwrap().1.unwrap();
        assert!(!a.peek_n_at_micros("m", 1, t).await.unwrap().is_allowed());
        let (x, y) = tokio::join!(a.refund_at_micros(&r, t), b.refund_at_micros(&r, t));
        assert!(x.unwrap() ^ y.unwrap(), "exactly one gives back");
        // GCRA 2 left, the window 3: the tightest is 2.
        assert_eq!(a.peek_n_at_micros("m", 0, t).await.unwrap().remaining(), 2);
        // Two more: the window counts 3 + 2 = 5 > 4 unless it was given back too.
        assert!(b.check_n_at_micros("m", 1, t).await.unwrap().is_allowed());
        assert!(a.check_n_at_micros("m", 1, t).await.unwrap().is_allowed());
        assert!(!a.check_n_at_micros("m", 1, t).await.unwrap().is_allowed());
        // A single-limit limiter's receipt is no receipt here.
        let single = limiter(&server, Algorithm::Gcra, gcra).await;
        let other = single
            .charge_n_at_micros("s", 1, t)
            .await
            .unwrap()
            .1
            .unwrap();
        assert!(!a.refund_at_micros(&other, t).await.unwrap());
    });
}

/// A refund record that no script writes is a malformed state: the refund fails
/// with an error naming the key and writes nothing.
#[test]
fn a_refund_over_a_malformed_record_fails_and_writes_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let policy = Policy::per_second(10).unwrap();
        let l = limiter(&server, Algorithm::Gcra, policy).await;
        let (_, r) = l.charge_n_at_micros("m", 1, 1_000_000).await.unwrap();
        let r = r.unwrap();
        let bad = "1100000:0:1100000:0:7/";
        let _: () = server.cmd(&["SET", "refunds:m", bad]);
        let e = l
            .refund_at_micros(&r, 1_000_000)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("malformed") && e.contains("refunds:m"), "{e}");
        let after: String = server.cmd(&["GET", "refunds:m"]);
        assert_eq!(after, bad);
        // A fixed window state: its refund fields too, for a charge and a refund.
        let fw = limiter(&server, Algorithm::FixedWindow, policy).await;
        let (_, r) = fw.charge_n_at_micros("mw", 1, 1_000_000).await.unwrap();
        let r = r.unwrap();
        for bad in ["1:1:1000000:0:0:7/", "1:1:1000000:zz"] {
            let _: () = server.cmd(&["SET", "refunds:mw", bad]);
            let e = fw.refund_at_micros(&r, 1_000_000).await.unwrap_err();
            assert!(e.to_string().contains("malformed"), "{bad}: {e}");
            let after: String = server.cmd(&["GET", "refunds:mw"]);
            assert_eq!(after, bad);
        }
        // Fields that are no refund fields fail a charge too (the records
        // themselves are read by refunds only).
        let e = fw.check_n_at_micros("mw", 1, 1_000_000).await.unwrap_err();
        assert!(e.to_string().contains("malformed"), "{e}");
    });
}

/// A fixed window state that holds fewer units than the charge took (its count
/// lowered behind the limiter's back — in a rolling deploy, another period's
/// write): the refund gives back what is there, never a count below 0.
#[test]
fn a_fixed_window_refund_never_takes_the_count_below_zero() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let policy = Policy::new(5, Duration::from_secs(10)).unwrap();
        let l = limiter(&server, Algorithm::FixedWindow, policy).await;
        let t = 1_003_000_000;
        let r = l.charge_n_at_micros("z", 2, t).await.unwrap().1.unwrap();
        // The count lowered to 1, the refund fields (the key's incarnation) kept.
        let state: String = server.cmd(&["GET", "refunds:z"]);
        let lowered = state.replacen("100:2:", "100:1:", 1);
        assert_ne!(state, lowered);
        let _: () = server.cmd(&["SET", "refunds:z", &lowered]);
        assert!(l.refund_at_micros(&r, t).await.unwrap());
        let d = l.peek_n_at_micros("z", 0, t).await.unwrap();
        assert_eq!(d.remaining(), 5);
        let state: String = server.cmd(&["GET", "refunds:z"]);
        assert!(state.starts_with("100:0:10000000:"), "{state}");
    });
}

/// Whether `value` is a state in the plain form that a version of this crate from
/// before refunds reads: `fields` whole numbers joined by `:` (GCRA `TAT`, the fixed
/// window `window:count:P`, the sliding window `window:prev:cur:P`), no refund fields.
fn plain(value: &str, fields: usize) -> bool {
    let parts: Vec<&str> = value.split(':').collect();
    parts.len() == fields
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// Refunds are off by default (a rolling deploy may still run replicas that read
/// the refund state as malformed): `charge_n` is a plain check with no receipt,
/// a refund gives nothing back — not even a receipt of a limiter with refunds on —
/// and every key charged and "refunded" stays in the plain form, read raw from
/// Redis. A charge of the limiter with refunds on writes the refund fields (which
/// `plain` tells apart), and its refund gives the unit back.
#[test]
fn with_refunds_off_a_charged_and_refunded_key_stays_in_the_plain_form() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    // 5 an hour, with a quarter of an hour left at least in the window.
    let hour = common::an_hour(&server);
    runtime().block_on(async {
        let policy = Policy::new(5, hour).unwrap();
        let several = common::builder(Algorithm::Gcra, policy).and(Algorithm::FixedWindow, policy);
        for (name, builder, fields) in [
            ("gcra", common::builder(Algorithm::Gcra, policy), vec![1]),
            (
                "fixed",
                common::builder(Algorithm::FixedWindow, policy),
                vec![3],
            ),
            (
                "sliding",
                common::builder(Algorithm::SlidingWindow, policy),
                vec![4],
            ),
            ("several", several, vec![1, 3]),
        ] {
            let off = connected(&server, builder.clone()).await;
            let on = built(&server, builder).await;
            let key = format!("off-{name}");
            let raw = || {
                off.redis_keys(&key)
                    .iter()
                    .map(|k| server.cmd::<String>(&["GET", k]))
                    .collect::<Vec<String>>()
            };
            let all_plain = |values: &[String]| {
                values.len() == fields.len()
                    && values.iter().zip(&fields).all(|(v, &n)| plain(v, n))
            };
            let (v, r) = off.charge_n(&key, 1).await.unwrap();
            assert!(v.decision().is_allowed() && r.is_none(), "{name}: {r:?}");
            let (d, r) = AsyncLimit::charge_n(&off, key.as_str(), 1).await.unwrap();
            assert!(d.is_allowed() && !r.is_charged(), "{name}");
            assert!(!AsyncLimit::refund(&off, key.as_str(), r).await.unwrap());
            // Charged and "refunded" with refunds off: the plain form.
            assert!(all_plain(&raw()), "{name}: {:?}", raw());
            // A receipt of a limiter with refunds on (same prefix and limits): its
            // charge writes the refund fields (the key's incarnation).
            let (_, receipt) = on.charge_n(&key, 1).await.unwrap();
            let receipt = receipt.expect("refunds on: a receipt");
            assert!(!all_plain(&raw()), "{name}: {:?}", raw());
            assert!(!off.refund(&receipt).await.unwrap(), "{name}");
            let left = off.peek_n(&key, 0).await.unwrap().decision().remaining();
            assert_eq!(left, 2, "{name}: nothing given back");
            // The replay path too: no receipt.
            let replay = format!("{key}-replay");
            let (d, r) = off.charge_n_at_micros(&replay, 1, 1_000_000).await.unwrap();
            assert!(d.is_allowed() && r.is_none(), "{name}: {r:?}");
            // Refunded by the limiter with refunds on: given back.
            assert!(on.refund(&receipt).await.unwrap(), "{name}");
            let left = off.peek_n(&key, 0).await.unwrap().decision().remaining();
            assert_eq!(left, 3, "{name}: given back by the limiter with refunds on");
        }
    });
}
