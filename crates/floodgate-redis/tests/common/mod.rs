//! A `redis-server` of the test's own on a free loopback port, stopped on drop.
//!
//! Without `redis-server` on `PATH` a test prints a loud message and returns early,
//! unless `FLOODGATE_REQUIRE_REDIS=1`, when it fails.

#![allow(dead_code)]

use std::io::Write;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use floodgate::reference::{ExactFixedWindow, ExactGcra, ExactSlidingLog, ExactSlidingWindow};
use floodgate::{Clock, Decision, Nanos, Policy, RateLimiter, Receipt, SlidingLog, StateCell};
use floodgate_redis::{
    Algorithm, OnFailure, RedisLimitError, RedisLimiter, RedisLimiterBuilder, RedisReceipt, Verdict,
};
use proptest::prelude::Rng;
use proptest::test_runner::{RngAlgorithm, TestRng};

pub const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::Gcra,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::SlidingLog,
];

pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    /// Options beyond the defaults.
    extra: Vec<String>,
}

impl RedisServer {
    /// A fresh server, or `None` (after a loud message) where none can run.
    pub fn start() -> Option<RedisServer> {
        RedisServer::start_with(|_| Vec::new())
    }

    /// As [`RedisServer::start`], with more options for the port it gets.
    pub fn start_with(extra: impl Fn(u16) -> Vec<String>) -> Option<RedisServer> {
        if !tools_on_path(&["redis-server"]) {
            return None;
        }
        // A port can be taken between finding it free and the server binding it:
        // try a few.
        for _ in 0..5 {
            let port = free_port();
            let mut server = RedisServer {
                port,
                child: None,
                extra: extra(port),
            };
            if server.spawn() {
                return Some(server);
            }
        }
        panic!("redis-server did not start on a free loopback port");
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    fn spawn(&mut self) -> bool {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--enable-debug-command", "local"])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        // Another server may answer on the port (ours, unable to bind it, exits):
        // only our own process counts.
        let pid = format!("process_id:{}", child.id());
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(_)) = child.try_wait() {
                    self.child = None;
                    return false; // exited: the port was taken
                }
            }
            let info = self
                .connection()
                .and_then(|mut conn| redis::cmd("INFO").arg("server").query::<String>(&mut conn));
            if info.is_ok_and(|info| info.lines().any(|l| l.trim() == pid)) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A plain blocking connection for set-up and inspection.
    pub fn connection(&self) -> redis::RedisResult<redis::Connection> {
        let client = redis::Client::open(self.url())?;
        let mut conn = client.get_connection_with_timeout(Duration::from_secs(1))?;
        redis::cmd("PING").query::<String>(&mut conn)?;
        Ok(conn)
    }

    /// Runs one command on a fresh blocking connection.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut conn = self.connection().expect("connect to the test server");
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut conn).expect("test command")
    }

    /// Stops the server (SIGKILL: a crash, not a shutdown).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port.
    pub fn restart(&mut self) {
        self.kill();
        assert!(
            self.spawn(),
            "redis-server did not restart on port {}",
            self.port
        );
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether every one of `tools` runs (`TOOL --version`). Where one does not, prints
/// a loud message and returns `false`, unless `FLOODGATE_REQUIRE_REDIS=1`, when it
/// panics.
pub fn tools_on_path(tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|tool| {
            !Command::new(tool)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect();
    if missing.is_empty() {
        return true;
    }
    let missing = missing.join(" and ");
    let required = std::env::var("FLOODGATE_REQUIRE_REDIS").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "FLOODGATE_REQUIRE_REDIS=1 but {missing} not on PATH \
         (apt-get install -y redis-server, which brings redis-tools)"
    );
    // Straight to the process's stderr: the test harness captures `eprintln!`.
    let _ = writeln!(
        std::io::stderr(),
        "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
         !!! SKIPPED: {missing} not on PATH; this Redis test did not run.\n\
         !!! Install it (apt-get install -y redis-server) or set\n\
         !!! FLOODGATE_REQUIRE_REDIS=1 to make its absence a failure.\n\
         !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
    );
    false
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A small multi-thread runtime with the timer and I/O drivers.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// How long a test's call waits for Redis unless the test sets its own timeout: far
/// above a loaded machine's stalls. The first call of a limiter loads its script
/// (three round trips), which the default 50 ms does not always cover on a busy
/// 2-core machine, and a test of semantics must not turn into a test of the host's
/// scheduling (session 53's stall runs: 40 ms before the load failed such tests).
pub const TEST_TIMEOUT: Duration = Duration::from_secs(5);

/// `RedisLimiter::builder` with [`TEST_TIMEOUT`]; a later `.timeout(..)` replaces it.
pub fn builder(algorithm: Algorithm, policy: Policy) -> RedisLimiterBuilder {
    RedisLimiter::builder(algorithm, policy).timeout(TEST_TIMEOUT)
}

/// A limiter on `server` (connects inside the runtime).
pub fn limiter(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    algorithm: Algorithm,
    policy: Policy,
    on_failure: OnFailure,
    timeout: Duration,
) -> RedisLimiter {
    let builder = RedisLimiter::builder(algorithm, policy)
        .on_failure(on_failure)
        .timeout(timeout);
    build(rt, server, builder)
}

/// `builder` on a connection of its own to `server`, keys prefixed `test:`.
pub fn build(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    builder: RedisLimiterBuilder,
) -> RedisLimiter {
    build_prefixed(rt, server, builder.prefix("test:"))
}

/// `builder` on a connection of its own to `server`, with the builder's own prefix.
pub fn build_prefixed(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    builder: RedisLimiterBuilder,
) -> RedisLimiter {
    let url = server.url();
    rt.block_on(async move {
        let conn = floodgate_redis::connect(&url).await.expect("connect");
        builder.build(conn).expect("valid limiter")
    })
}

/// `tasks` tasks on each of `limiters`, each checking `key` `calls` times at the
/// cost `cost(task, call)`; returns the units admitted. A call that Redis did not
/// decide fails the test unless `uncharged` says it failed without charging.
pub fn flood(
    rt: &tokio::runtime::Runtime,
    limiters: Vec<RedisLimiter>,
    key: &'static str,
    (tasks, calls): (u32, u32),
    cost: fn(u32, u32) -> u32,
    uncharged: fn(&RedisLimitError) -> bool,
) -> u64 {
    rt.block_on(async {
        let mut running = Vec::new();
        for limiter in limiters.into_iter().map(Arc::new) {
            for task in 0..tasks {
                let limiter = Arc::clone(&limiter);
                running.push(tokio::spawn(async move {
                    let mut admitted = 0;
                    for call in 0..calls {
                        let cost = cost(task, call);
                        match limiter.check_n(key, cost).await {
                            Ok(Verdict::Decided(d)) => {
                                admitted += u64::from(cost) * u64::from(d.is_allowed());
                            }
                            Err(e) if uncharged(&e) => {}
                            other => panic!("no decision: {other:?}"),
                        }
                    }
                    admitted
                }));
            }
        }
        let mut total = 0;
        for t in running {
            total += t.await.expect("a flooding task");
        }
        total
    })
}

/// The reference model of `algorithm` for `limit` per `period_us` (burst for GCRA).
pub enum Model {
    Gcra(ExactGcra),
    Fixed(ExactFixedWindow),
    Sliding(ExactSlidingWindow),
    Log(ExactSlidingLog),
}

impl Model {
    pub fn new(algorithm: Algorithm, limit: u64, period_ns: u64, burst: u64) -> Model {
        // The numbers come from a policy the limiter accepted: the models accept them.
        const VALID: &str = "a policy the limiter accepted";
        match algorithm {
            Algorithm::Gcra => Model::Gcra(ExactGcra::new(limit, period_ns, burst).expect(VALID)),
            Algorithm::FixedWindow => {
                Model::Fixed(ExactFixedWindow::new(limit, period_ns).expect(VALID))
            }
            Algorithm::SlidingWindow => {
                Model::Sliding(ExactSlidingWindow::new(limit, period_ns).expect(VALID))
            }
            Algorithm::SlidingLog => {
                Model::Log(ExactSlidingLog::new(limit, period_ns).expect(VALID))
            }
            _ => unreachable!("every algorithm has a model"),
        }
    }

    pub fn decide(&mut self, now_ns: u64, cost: u32, peek: bool) -> Decision {
        match (self, peek) {
            (Model::Gcra(m), false) => m.check(now_ns, cost),
            (Model::Gcra(m), true) => m.peek(now_ns, cost),
            (Model::Fixed(m), false) => m.check(now_ns, cost),
            (Model::Fixed(m), true) => m.peek(now_ns, cost),
            (Model::Sliding(m), false) => m.check(now_ns, cost),
            (Model::Sliding(m), true) => m.peek(now_ns, cost),
            (Model::Log(m), false) => m.check(now_ns, cost),
            (Model::Log(m), true) => m.peek(now_ns, cost),
        }
    }
}

/// The model's decision at the scripts' resolution: the sliding window's retry can
/// fall between two microseconds (admitted 1 ns past a bound); the first whole
/// microsecond after it is the script's answer. Every other number is whole already.
pub fn whole_micros(d: Decision) -> Decision {
    let retry = d
        .retry_after_nanos()
        .map(|ns| Duration::from_micros(ns.div_ceil(1_000)));
    Decision::new(
        d.is_allowed(),
        d.limit(),
        d.remaining(),
        d.reset_after(),
        retry,
    )
}

/// Redis's clock, in microseconds since the epoch.
pub fn redis_now_micros(server: &RedisServer) -> u64 {
    let time: Vec<u64> = server.cmd(&["TIME"]);
    time[0] * 1_000_000 + time[1]
}

/// "An hour" for a window on the server's clock: the first of
/// [`mid_window_periods`] from an hour on, so that no window ends for a quarter of
/// an hour at least. An hour's windows end at every full hour: a test on the
/// server's clock that ran across one saw its window's units come back.
pub fn an_hour(server: &RedisServer) -> Duration {
    mid_window_periods(server, Duration::from_secs(3_600))
        .next()
        .expect("a period in the middle of its window")
}

/// Periods of whole seconds from `shortest` on, shortest first, such that Redis's
/// clock now stands in the middle half of each one's current window (windows are
/// aligned to the epoch): at least a quarter of the period passes before it ends.
pub fn mid_window_periods(
    server: &RedisServer,
    shortest: Duration,
) -> impl Iterator<Item = Duration> {
    let now = redis_now_micros(server);
    (shortest.as_secs()..)
        .map(|secs| secs * 1_000_000)
        .filter(move |&p| (p / 4..=3 * p / 4).contains(&(now % p)))
        .map(Duration::from_micros)
}

/// `builder` with refunds `on` (or off), keys prefixed `test:`, errors returned.
pub fn with_refunds(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    builder: RedisLimiterBuilder,
    on: bool,
) -> RedisLimiter {
    let builder = builder
        .on_failure(OnFailure::Error)
        .timeout(Duration::from_secs(5))
        .refunds(on);
    build(rt, server, builder)
}

/// Two GCRA limits (`first`, then 100 an hour) with refunds on, keys prefixed
/// `test:`; their Redis keys for `key`, and the receipt of a charge of 2 on `key`
/// at `at_us` (admitted).
pub fn two_gcra_limits_charged(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    first: Policy,
    key: &str,
    at_us: u64,
) -> (RedisLimiter, Vec<String>, RedisReceipt) {
    let builder = RedisLimiter::builder(Algorithm::Gcra, first)
        .and(Algorithm::Gcra, Policy::per_hour(100).unwrap());
    let l = with_refunds(rt, server, builder, true);
    let keys = l.redis_keys(key);
    let (ok, r) = rt.block_on(l.charge_n_at_micros(key, 2, at_us)).unwrap();
    assert!(ok.is_allowed());
    (l, keys, r.expect("a receipt"))
}

/// A sliding log of `policy` with refunds on.
pub fn sliding_log(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    policy: Policy,
) -> RedisLimiter {
    with_refunds(
        rt,
        server,
        RedisLimiter::builder(Algorithm::SlidingLog, policy),
        true,
    )
}

/// The members of the sorted set at `key`, lowest score first, with their scores.
pub fn members(server: &RedisServer, key: &str) -> Vec<(String, String)> {
    server.cmd(&["ZRANGE", key, "0", "-1", "WITHSCORES"])
}

/// The log members (not the refund members, all `refunds:...`) as (instant,
/// units, total).
pub fn log_members(server: &RedisServer, key: &str) -> Vec<(u64, u64, u64)> {
    members(server, key)
        .into_iter()
        .filter(|(m, _)| !m.starts_with("refunds:"))
        .map(|(m, score)| {
            let f: Vec<u64> = m.split(':').map(|x| x.parse().unwrap()).collect();
            assert_eq!(f.len(), 3, "{m}");
            assert_eq!(score.parse::<u64>().unwrap(), f[0], "{m} at {score}");
            (f[0], f[1], f[2])
        })
        .collect()
}

/// Running totals are consistent: each member's total is the one before it plus
/// its units (the first at least its units).
pub fn assert_totals_consistent(rows: &[(u64, u64, u64)]) {
    for pair in rows.windows(2) {
        assert_eq!(pair[1].2, pair[0].2 + pair[1].1, "{rows:?}");
    }
}

/// Where a seeded trace stands: its seed, its step and the reading (µs) the step
/// runs at.
#[derive(Clone, Copy, Debug)]
pub struct TraceStep {
    pub seed: u64,
    pub step: u32,
    pub now_us: u64,
}

impl std::fmt::Display for TraceStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "seed {} step {}", self.seed, self.step)
    }
}

/// The numbers of a seeded trace (see [`drive_trace`]).
#[derive(Clone, Copy, Debug)]
pub struct TraceShape {
    /// Seeds 1 to `seeds`, one key each.
    pub seeds: u64,
    /// Steps per seed.
    pub steps: u32,
    /// A charge costs 1 to `max_cost`.
    pub max_cost: u64,
    /// Receipts held at most (a charge beyond them is not refunded).
    pub held: usize,
    /// A wait moves the reading on by less than this (µs).
    pub wait_us: u64,
    /// A reading behind the last (another replica's, a clock that stepped back)
    /// is less than this (µs) behind.
    pub back_us: u64,
}

/// The shape of `refunds.rs`'s one-limit traces (GCRA and both windows): 12 seeds
/// of 300 steps, costs 1–2, 4 receipts held, waits under 150 ms, readings up to
/// 100 ms behind (`review_s44_redis2.rs` counts the kinds of steps they take).
pub const ONE_LIMIT_TRACE: TraceShape = TraceShape {
    seeds: 12,
    steps: 300,
    max_cost: 2,
    held: 4,
    wait_us: 150_000,
    back_us: 100_000,
};

/// The two sides of a seeded trace: a Redis limiter and the in-process model it
/// must agree with. Each method runs one operation on both and asserts what the
/// test promises of it.
pub trait Trace {
    /// A charge's receipts on both sides.
    type Receipts;
    /// A fresh key and model for `seed`.
    fn begin(&mut self, seed: u64);
    /// Charges `cost` at `at.now_us` on both sides; the receipts to hold where it
    /// was charged.
    async fn charge(&mut self, at: TraceStep, cost: u32) -> Option<Self::Receipts>;
    /// Gives `receipts` back on both sides.
    async fn refund(&mut self, at: TraceStep, receipts: Self::Receipts);
    /// After every step, at the reading the step left.
    async fn after(&mut self, at: TraceStep);
}

/// Drives `trace` through `shape.seeds` seeded traces of `shape.steps` steps from
/// 10 s on: charges (half the steps, and every step with no receipt held),
/// refunds of a receipt held (a quarter, picked at random, so in any order),
/// waits, and now and then a reading that steps back. With no receipt held after
/// a charge refused at the reading, a step that would refund or wait waits or
/// steps back (its charge would be refused again, and the trace would stall with
/// the limit full for the rest of the seed: two of twelve GCRA seeds did). A receipt held across 8
/// refunds is dropped unused: a key remembers its last 8 refunds, so the floor may
/// refuse it (a conservative loss the in-process refunds do not take).
pub async fn drive_trace<T: Trace>(shape: TraceShape, trace: &mut T) {
    for seed in 1..=shape.seeds {
        trace.begin(seed);
        let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[seed as u8; 32]);
        let below = |rng: &mut TestRng, n: u64| rng.next_u64() % n;
        let mut now_us = 10_000_000_u64;
        // Each receipt held with the refunds made since.
        let mut held = Vec::new();
        // The last charge, at this reading, was refused.
        let mut refused = false;
        for step in 0..shape.steps {
            let at = TraceStep { seed, step, now_us };
            let op = below(&mut rng, 12);
            // Nothing held and the limit full: a charge at this reading (the
            // step's own or one in place of a refund) may be refused again
            // forever; a step that would refund or wait waits (or steps back).
            let stuck = held.is_empty() && refused;
            if op < 6 || (held.is_empty() && !stuck) {
                let cost = 1 + below(&mut rng, shape.max_cost) as u32;
                let receipts = trace.charge(at, cost).await;
                refused = receipts.is_none();
                if let Some(r) = receipts {
                    if held.len() < shape.held {
                        held.push((r, 0));
                    }
                }
            } else if op < 9 && !stuck {
                let drawn = below(&mut rng, held.len() as u64) as usize;
                let (r, _) = held.swap_remove(drawn);
                trace.refund(at, r).await;
                for h in &mut held {
                    h.1 += 1;
                }
                held.retain(|h| h.1 < 8);
            } else if op < 11 {
                now_us += below(&mut rng, shape.wait_us);
                refused = false;
            } else {
                now_us -= below(&mut rng, shape.back_us);
                refused = false;
            }
            trace.after(TraceStep { seed, step, now_us }).await;
        }
    }
}

/// A clock read where the trace stands, back included ([`floodgate::ManualClock`]
/// never steps back): the in-process refunds are judged at the reading the Redis
/// refund is given, as a server's `TIME` that steps back gives it.
#[derive(Clone, Debug, Default)]
pub struct Reading(Arc<AtomicU64>);

impl Reading {
    pub fn set(&self, now: Nanos) {
        self.0.store(now.as_u64(), Ordering::Relaxed);
    }
}

impl Clock for Reading {
    fn now(&self) -> Nanos {
        Nanos::new(self.0.load(Ordering::Relaxed))
    }
}

/// An in-process limit with receipts, read at an explicit instant (its refund at
/// its own clock's).
pub trait InProcess {
    fn peek_at(&self, now: Nanos, cost: u32) -> Decision;
    fn charge_at(&self, now: Nanos, cost: u32) -> Receipt;
    fn refund(&self, receipt: Receipt) -> bool;
}

impl<A: floodgate::Algorithm, C: Clock, S: StateCell<A::State>> InProcess for RateLimiter<A, C, S> {
    fn peek_at(&self, now: Nanos, cost: u32) -> Decision {
        RateLimiter::peek_at(self, now, cost)
    }
    fn charge_at(&self, now: Nanos, cost: u32) -> Receipt {
        RateLimiter::charge_at(self, now, cost).1
    }
    fn refund(&self, receipt: Receipt) -> bool {
        RateLimiter::refund(self, receipt)
    }
}

impl<C: Clock> InProcess for SlidingLog<C> {
    fn peek_at(&self, now: Nanos, cost: u32) -> Decision {
        SlidingLog::peek_at(self, now, cost)
    }
    fn charge_at(&self, now: Nanos, cost: u32) -> Receipt {
        SlidingLog::charge_at(self, now, cost).1
    }
    fn refund(&self, receipt: Receipt) -> bool {
        SlidingLog::refund(self, receipt)
    }
}

/// An in-process limit whose refund is judged no earlier than the latest reading
/// a charge on it was admitted at, as Redis judges a GCRA refund (the key's
/// latest reading): its own clock, set where the trace stands, moved up to that
/// reading for a refund and back.
pub struct AtLatestReading<L> {
    pub limit: L,
    pub clock: Reading,
    latest: std::cell::Cell<Nanos>,
}

impl<L> AtLatestReading<L> {
    pub fn new(limit: L, clock: Reading) -> Self {
        AtLatestReading {
            limit,
            clock,
            latest: std::cell::Cell::new(Nanos::new(0)),
        }
    }
}

impl<L: InProcess> InProcess for AtLatestReading<L> {
    fn peek_at(&self, now: Nanos, cost: u32) -> Decision {
        self.limit.peek_at(now, cost)
    }
    fn charge_at(&self, now: Nanos, cost: u32) -> Receipt {
        let r = self.limit.charge_at(now, cost);
        if r.is_charged() && now > self.latest.get() {
            self.latest.set(now);
        }
        r
    }
    fn refund(&self, receipt: Receipt) -> bool {
        let now = self.clock.now();
        self.clock.set(now.max(self.latest.get()));
        let back = self.limit.refund(receipt);
        self.clock.set(now);
        back
    }
}

/// Fresh in-process limits for a seed, in the remote limiter's order, and the
/// function that sets the clock their refunds read.
pub type Locals = (Vec<Box<dyn InProcess>>, Box<dyn Fn(Nanos)>);

/// A multi-limit Redis limiter and the in-process limits of a trace
/// ([`drive_trace`]): a charge admitted (with its receipt) exactly where every
/// limit admits it, each charged only then; a refund's answer whether any limit
/// gave back, a receipt sent a second time giving nothing; the fewest remaining
/// after each step the in-process one.
pub struct MultiTrace<'a> {
    pub remote: &'a RedisLimiter,
    /// The key of seed `s` is `{name}{s}`.
    pub name: &'static str,
    pub fresh: Box<dyn Fn() -> Locals>,
    locals: Option<Locals>,
    key: String,
    /// Refunds that gave back, that gave nothing, whose limits differed.
    pub counts: (usize, usize, usize),
}

impl<'a> MultiTrace<'a> {
    pub fn new(
        remote: &'a RedisLimiter,
        name: &'static str,
        fresh: Box<dyn Fn() -> Locals>,
    ) -> MultiTrace<'a> {
        MultiTrace {
            remote,
            name,
            fresh,
            locals: None,
            key: String::new(),
            counts: (0, 0, 0),
        }
    }

    /// The in-process limits, their clock set to `now`.
    fn at(&self, now: Nanos) -> &[Box<dyn InProcess>] {
        let (limits, set) = self.locals.as_ref().expect("a trace begun");
        set(now);
        limits
    }
}

impl Trace for MultiTrace<'_> {
    type Receipts = (Vec<Receipt>, RedisReceipt);

    fn begin(&mut self, seed: u64) {
        self.locals = Some((self.fresh)());
        self.key = format!("{}{seed}", self.name);
    }

    async fn charge(&mut self, at: TraceStep, cost: u32) -> Option<Self::Receipts> {
        let now = Nanos::new(at.now_us * 1_000);
        let admits = self
            .at(now)
            .iter()
            .all(|l| l.peek_at(now, cost).is_allowed());
        let (rd, rr) = self
            .remote
            .charge_n_at_micros(&self.key, cost, at.now_us)
            .await
            .unwrap();
        assert_eq!(rd.is_allowed(), admits, "{at}");
        assert_eq!(rr.is_some(), admits, "{at}");
        let rr = rr?;
        let local = self
            .at(now)
            .iter()
            .map(|l| l.charge_at(now, cost))
            .collect();
        Some((local, rr))
    }

    async fn refund(&mut self, at: TraceStep, (local, rr): Self::Receipts) {
        let limits = self.at(Nanos::new(at.now_us * 1_000));
        let backs: Vec<bool> = limits.iter().zip(local).map(|(l, r)| l.refund(r)).collect();
        if backs.iter().any(|&b| b != backs[0]) {
            self.counts.2 += 1;
        }
        // The in-process refunds read the clock: `now_us`.
        let rback = self.remote.refund_at_micros(&rr, at.now_us).await.unwrap();
        assert_eq!(rback, backs.contains(&true), "{at}: {backs:?}");
        if rback {
            self.counts.0 += 1;
        } else {
            self.counts.1 += 1;
        }
        assert!(!self.remote.refund_at_micros(&rr, at.now_us).await.unwrap());
    }

    async fn after(&mut self, at: TraceStep) {
        let now = Nanos::new(at.now_us * 1_000);
        let local: Vec<Decision> = self.at(now).iter().map(|l| l.peek_at(now, 0)).collect();
        let fewest = local.iter().map(Decision::remaining).min().unwrap_or(0);
        let rd = self
            .remote
            .peek_n_at_micros(&self.key, 0, at.now_us)
            .await
            .unwrap();
        assert_eq!(rd.remaining(), fewest, "{at}: {local:?}");
    }
}

/// Drives a [`MultiTrace`] of `remote` against the limits `fresh` makes through
/// 8 seeded traces of 200 steps (costs 1 and 2, 4 receipts held, waits under
/// 250 ms, readings up to 100 ms behind), keys `{name}{seed}`; the trace must
/// refund enough to mean something: over 100 refunds that gave back, one that
/// gave nothing, 20 where the limits differed.
pub fn drive_multi_trace(
    rt: &tokio::runtime::Runtime,
    remote: &RedisLimiter,
    name: &'static str,
    fresh: Box<dyn Fn() -> Locals>,
) {
    let mut trace = MultiTrace::new(remote, name, fresh);
    let shape = TraceShape {
        seeds: 8,
        steps: 200,
        max_cost: 2,
        held: 4,
        wait_us: 250_000,
        back_us: 100_000,
    };
    rt.block_on(drive_trace(shape, &mut trace));
    let (given, refused, partial) = trace.counts;
    assert!(
        given > 100 && refused > 0 && partial > 20,
        "{given} given, {refused} refused, {partial} partial"
    );
}

/// `INFO commandstats` as `{command: (calls, failed_calls)}`.
pub fn command_stats(server: &RedisServer) -> std::collections::BTreeMap<String, (u64, u64)> {
    let info: String = server.cmd(&["INFO", "commandstats"]);
    let mut stats = std::collections::BTreeMap::new();
    for line in info.lines() {
        let Some((name, fields)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let field = |key: &str| {
            fields
                .split(',')
                .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
                .map_or(0, |v| v.parse::<u64>().expect("a count"))
        };
        stats.insert(name.to_owned(), (field("calls"), field("failed_calls")));
    }
    stats
}

/// The given-time prologue of the crate's scripts (`script.rs` `GIVEN_TIME`), for a
/// test that assembles a script by hand (an earlier version's transition beside
/// the current one).
pub const GIVEN_TIME: &str = "\
local EXPIRE = false
local ARG = {}
for i = 2, #ARGV do ARG[i - 1] = ARGV[i] end
local now = tonumber(ARGV[1])
local READINGS = false
local WIDE_LOG = false
";

/// `EVAL` of `script` on one `key` with `args`, on a fresh connection (a test that
/// runs a script assembled by hand: an earlier version beside the current one).
pub fn eval(
    server: &RedisServer,
    script: &str,
    key: &str,
    args: &[u64],
) -> redis::RedisResult<redis::Value> {
    let mut conn = server.connection()?;
    redis::cmd("EVAL")
        .arg(script)
        .arg(1)
        .arg(key)
        .arg(args)
        .query(&mut conn)
}

/// The one-limit charge with a receipt of `function` (`script.rs` `charge_driver!`).
pub fn charge_driver(function: &str) -> String {
    format!(
        "\
ISSUING = true
local r = {function}(KEYS[1], tonumber(ARG[1]), ARG[2] == '1', tonumber(ARG[3]), tonumber(ARG[4]))
if r.err or not RECEIPT then return r end
for i = 1, #RECEIPT do r[5 + i] = RECEIPT[i] end
return r
"
    )
}

/// The one-limit refund driver of `function` (`script.rs` `refund_driver!`, six
/// arguments).
pub fn refund_driver(function: &str) -> String {
    format!(
        "\
local a = {{}}
for i = 1, 6 do
  a[i] = tonumber(ARG[i])
  if not a[i] or a[i] < 0 or a[i] >= EXACT or a[i] ~= math.floor(a[i]) then
    return redis.error_reply('floodgate: refund argument ' .. i .. ' is not a whole number below 2^53')
  end
end
local back, write = {function}(KEYS[1], unpack(a))
if write then write() end
return back
"
    )
}

/// The current scripts' files and session 46's (`tests/fixtures`, from 410abd5; the
/// windows' own files did not change until session 49: `s48`), for a rolling
/// deploy's tests.
pub mod s46 {
    pub const COMMON_NOW: &str = include_str!("../../src/lua/common.lua");
    pub const COMMON_S46: &str = include_str!("../fixtures/common_s46.lua");
    pub const GCRA_NOW: &str = include_str!("../../src/lua/gcra.lua");
    pub const GCRA_S46: &str = include_str!("../fixtures/gcra_s46.lua");
    pub const FIXED_WINDOW: &str = include_str!("../../src/lua/fixed_window.lua");
    pub const SLIDING_WINDOW: &str = include_str!("../../src/lua/sliding_window.lua");
    pub const SLIDING_LOG_NOW: &str = include_str!("../../src/lua/sliding_log.lua");
    pub const SLIDING_LOG_S46: &str = include_str!("../fixtures/sliding_log_s46.lua");
}

/// The log's scripts as they were before session 47's reader limit
/// (`tests/fixtures`, from 69ea949), for a rolling deploy's tests.
pub mod s47 {
    pub const COMMON_S47: &str = include_str!("../fixtures/common_s47.lua");
    pub const SLIDING_LOG_S47: &str = include_str!("../fixtures/sliding_log_s47.lua");
}

/// The window scripts as they were before session 49's latest reading
/// (`tests/fixtures`, from ab66d6d, as in session 46; their helpers then differ
/// from `s47::COMMON_S47` only in the log's reader limit), for a rolling deploy's
/// tests.
pub mod s48 {
    pub const FIXED_WINDOW_S48: &str = include_str!("../fixtures/fixed_window_s48.lua");
    pub const SLIDING_WINDOW_S48: &str = include_str!("../fixtures/sliding_window_s48.lua");
}

/// The windows' latest reading (session 49): the tests' shared limiter and reads.
pub mod readings {
    use std::time::Duration;

    use floodgate::Policy;
    use floodgate_redis::{Algorithm, RedisLimiter};

    use super::{with_refunds, RedisServer};

    pub const WINDOWS: [Algorithm; 2] = [Algorithm::FixedWindow, Algorithm::SlidingWindow];

    /// 10 per `period_s` seconds of `algorithm`, keys `test:…`, the latest reading
    /// as `readings`, refunds as `refunds`, every failure an error.
    pub fn limiter(
        rt: &tokio::runtime::Runtime,
        server: &RedisServer,
        algorithm: Algorithm,
        period_s: u64,
        readings: bool,
        refunds: bool,
    ) -> RedisLimiter {
        let policy = Policy::new(10, Duration::from_secs(period_s)).unwrap();
        let b = RedisLimiter::builder(algorithm, policy).latest_reading(readings);
        with_refunds(rt, server, b, refunds)
    }

    /// The string at `key`.
    pub fn state(server: &RedisServer, key: &str) -> String {
        server.cmd(&["GET", key])
    }

    /// Whether `l` admits one unit on `key` at `at` (µs).
    pub fn admits(rt: &tokio::runtime::Runtime, l: &RedisLimiter, key: &str, at: u64) -> bool {
        rt.block_on(l.check_n_at_micros(key, 1, at))
            .unwrap()
            .is_allowed()
    }

    /// How many single units `l` admits on `key` at `at`, up to 20.
    pub fn fill(rt: &tokio::runtime::Runtime, l: &RedisLimiter, key: &str, at: u64) -> u64 {
        (0..20).take_while(|_| admits(rt, l, key, at)).count() as u64
    }
}
