//! Adversarial review of floodgate-redis across policy changes (session 48,
//! "redpol"): every client switches at one instant from policy A to policy B on
//! the same prefix and keys (a clean switch, a new limiter built with B), and
//! back, in seeded random traces of charges and refunds on one key, checked at
//! every admission under B against ABSOLUTE bounds computed here from the trace
//! alone (no model of the crate's):
//!
//! * fixed window: the net units logged in B's window holding the reading
//!   within `L_B`;
//! * sliding window counter: B's weighted estimate over the net units at their
//!   instants in B's windows within `L_B`;
//! * sliding log: the net units in `(t − P_B, t]` within `L_B`;
//! * GCRA: for any run of admissions `i..=j` ending under B (starting under
//!   either: the TAT is kept), the schedule booked (each at its policy's `T`)
//!   less the most the refunds between them may give back at most
//!   `B_B·T_B + now_j − now_i` (`T` in whole µs, rounded up as the crate does);
//!   stronger than runs under B alone, which a TAT reset at the switch passes.
//!
//! Units are logged at the state's clock (the latest admission's reading), a
//! refund that answers `true` takes its units back at their instant (GCRA: at
//! most the part of its booking still ahead, as `review_s47_bound.rs`), and a
//! receipt gives back once (single limits). What a policy's state no longer holds
//! when the switch comes — a fixed window's earlier windows, a sliding window's
//! older ones, log instants past its period — is counted from the switch on by
//! nobody: the bound leaves units before that horizon out (see the ignored tests
//! below, which show that a policy of a longer period admits them again). See
//! VERIFICATION.md, "session 48: bounds across policy changes on Redis".

mod common;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use common::{runtime, with_refunds, RedisServer};
use floodgate::Policy;
use floodgate_redis::{Algorithm, RedisLimiter, RedisReceipt};
use proptest::prelude::Rng;
use proptest::test_runner::{RngAlgorithm, TestRng};

const S: u64 = 1_000_000;

fn policy(limit: u64, period_us: u64) -> Policy {
    Policy::new(limit, Duration::from_micros(period_us)).unwrap()
}
/// One limit of a policy: the algorithm, the limit (GCRA: the rate), the period
/// (µs) and GCRA's burst.
#[derive(Clone, Copy, Debug)]
struct Limit {
    algorithm: Algorithm,
    limit: u64,
    period_us: u64,
    burst: u64,
}

impl Limit {
    fn policy(&self) -> Policy {
        let p = policy(self.limit, self.period_us);
        if self.algorithm == Algorithm::Gcra {
            p.with_burst(self.burst).unwrap()
        } else {
            p
        }
    }

    /// GCRA's `T` as the crate rounds it: `⌈P / L⌉` ns, up to whole µs.
    fn interval_us(&self) -> u64 {
        self.period_us.div_ceil(self.limit)
    }

    fn capacity(&self) -> u64 {
        if self.algorithm == Algorithm::Gcra {
            self.burst
        } else {
            self.limit
        }
    }

    /// The earliest instant whose units the state written under this limit at
    /// the reading `latest` may still hold: a fixed window its window's, a
    /// sliding window its previous window's, the log the instants of its period
    /// (GCRA: none forgotten).
    fn horizon(&self, latest: u64) -> u64 {
        let (p, w) = (self.period_us, latest / self.period_us);
        match self.algorithm {
            Algorithm::FixedWindow => w * p,
            Algorithm::SlidingWindow => w.saturating_sub(1) * p,
            Algorithm::SlidingLog => (latest + 1).saturating_sub(p),
            _ => 0,
        }
    }
}

/// One limit's absolute bound under policy changes, from the trace alone: the
/// net units per instant (the state's clock, the latest admission's reading) and
/// the GCRA schedule of the current policy's run.
#[derive(Default)]
struct Part {
    /// The latest reading an admission was made at (any policy).
    latest: u64,
    /// Instants before this were forgotten by a policy whose state no longer
    /// holds them (see `Limit::horizon`); the bound counts from here.
    horizon: u64,
    net: BTreeMap<u64, u64>,
    /// GCRA: booked (each admission at its own policy's `T`) less given back
    /// (µs), and the most of `now_i − booked` before each admission `i`.
    booked: i128,
    best: Option<i128>,
}

impl Part {
    fn units(&self, from: u64, to: u64) -> u64 {
        let from = from.max(self.horizon);
        if from >= to {
            return 0;
        }
        self.net.range(from..to).map(|(_, u)| u).sum()
    }

    /// A switch from `old`. GCRA's runs go on across it: the TAT is kept.
    fn switch(&mut self, old: &Limit) {
        self.horizon = self.horizon.max(old.horizon(self.latest));
    }

    /// Admission of `cost` at `now` under `l`: where it is logged, or why the
    /// bound breaks. With `readings` (the states record their latest reading) a
    /// sliding window's estimate weighs its previous window at the latest
    /// reading, as the script judges it, else at `now`.
    fn admit(&mut self, l: &Limit, now: u64, cost: u64, readings: bool) -> Result<u64, String> {
        self.latest = self.latest.max(now);
        let t = self.latest;
        *self.net.entry(t).or_insert(0) += cost;
        let (p, limit) = (l.period_us, l.limit);
        let start = t / p * p;
        match l.algorithm {
            Algorithm::FixedWindow => {
                let held = self.units(start, start + p);
                if held > limit {
                    return Err(format!("window at {start} holds {held}, limit {limit}"));
                }
            }
            Algorithm::SlidingWindow => {
                let cur = self.units(start, start + p);
                let prev = self.units(start.saturating_sub(p), start);
                let e = if readings { t } else { now }.saturating_sub(start);
                let estimate = prev * (p - e) / p + cur;
                if estimate > limit {
                    return Err(format!(
                        "window at {start}: estimate {estimate} (prev {prev}, cur {cur}, e {e}), \
                         limit {limit}"
                    ));
                }
            }
            Algorithm::SlidingLog => {
                let live = self.units((t + 1).saturating_sub(p), t + 1);
                if live > limit {
                    return Err(format!(
                        "{live} units in ({}, {t}], limit {limit}",
                        t as i128 - p as i128
                    ));
                }
            }
            _ => {
                let best = (now as i128 - self.booked).max(self.best.unwrap_or(i128::MIN));
                self.best = Some(best);
                self.booked += (cost * l.interval_us()) as i128;
                let over = self.booked + best - now as i128 - (l.burst * l.interval_us()) as i128;
                if over > 0 {
                    return Err(format!(
                        "a run ending at {now} booked {over} µs past B·T + elapsed"
                    ));
                }
            }
        }
        Ok(t)
    }

    /// A receipt's part (`cost` logged at `at`; GCRA booked `cost·t_us` µs until
    /// `end`) gave back at `now`.
    fn refund(
        &mut self,
        gcra: Option<(u64, u64)>,
        at: u64,
        cost: u64,
        now: u64,
    ) -> Result<(), String> {
        if let Some((t_us, end)) = gcra {
            let judged = self.latest.max(now);
            let most = (cost * t_us).min(end.saturating_sub(judged));
            if most == 0 {
                return Err(format!("booked until {end}, gave back at {judged}"));
            }
            self.booked -= most as i128;
            return Ok(());
        }
        let net = self.net.get_mut(&at).expect("an instant charged");
        *net = net.checked_sub(cost).ok_or("an instant below 0")?;
        Ok(())
    }
}
/// A trace's two policies (the same algorithms, one limit each or several) and
/// its numbers.
#[derive(Clone, Copy, Debug)]
struct Shape {
    a: &'static [Limit],
    b: &'static [Limit],
    max_cost: u64,
    /// A small step of the clock forward is below this (µs).
    small_us: u64,
    seeds: u64,
    steps: u32,
    /// Both policies' limiters record window states' latest reading
    /// (`latest_reading`): the clock then steps back freely (a window's bound is
    /// judged at the latest reading), else never behind the windows of the latest
    /// reading (see `a_clock_behind_a_switch_drops_units_of_a_later_window`).
    readings: bool,
}

/// A receipt as the trace holds it.
struct Held {
    receipt: RedisReceipt,
    /// The policy that issued it (0: A, 1: B).
    policy: usize,
    cost: u64,
    /// Where each part logged it (the state's clock then).
    at: Vec<u64>,
    /// GCRA: the booking's end (unknown for several limits).
    end: u64,
}

/// What a shape's traces did, so that a trace that tries nothing fails.
#[derive(Debug, Default)]
struct Tally {
    admitted: u64,
    denied: u64,
    switches: u64,
    gave: u64,
    /// Refunds through a limiter of the other policy (each gave nothing).
    foreign: u64,
}

fn limiters(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    limits: &[Limit],
    readings: bool,
) -> Vec<RedisLimiter> {
    (0..2)
        .map(|_| {
            let first =
                common::builder(limits[0].algorithm, limits[0].policy()).latest_reading(readings);
            let b = limits[1..]
                .iter()
                .fold(first, |b, l| b.and(l.algorithm, l.policy()));
            with_refunds(rt, server, b, true)
        })
        .collect()
}

/// `shape`'s traces on `server`: each seed a fresh key, clients switching all at
/// once between policy A and B (a clean switch), checked after every step.
fn run_shape(server: &RedisServer, rt: &tokio::runtime::Runtime, shape: Shape, name: &str) {
    let policies = [shape.a, shape.b];
    let clients = [
        limiters(rt, server, shape.a, shape.readings),
        limiters(rt, server, shape.b, shape.readings),
    ];
    let several = shape.a.len() > 1;
    let capacity = policies
        .iter()
        .flat_map(|p| p.iter().map(Limit::capacity))
        .min()
        .unwrap();
    let mut tally = Tally::default();
    let seeds = match std::env::var("FLOODGATE_POLICY_SEEDS") {
        Ok(n) => 1..=n.parse().expect("a number of seeds"),
        Err(_) => 1..=shape.seeds,
    };
    for seed in seeds {
        let key = format!("policy-{name}-{seed}");
        let mut seed_bytes = [48; 32];
        seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
        // Each shape its own traces.
        for (i, b) in name.bytes().enumerate() {
            seed_bytes[8 + i % 24] ^= b;
        }
        let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes);
        let below = |rng: &mut TestRng, n: u64| rng.next_u64() % n.max(1);
        let span = shape.a[0].period_us;
        let base = 1_000 * 42 * span + span / 3;
        let mut now = base;
        let mut current = 0;
        let mut parts: Vec<Part> = shape.a.iter().map(|_| Part::default()).collect();
        let mut held: Vec<Held> = Vec::new();
        let mut gave: HashSet<usize> = HashSet::new();
        let mut log: Vec<String> = Vec::new();
        let fail = |log: &[String], why: String| -> ! {
            let tail = &log[log.len().saturating_sub(50)..];
            panic!(
                "{name} seed {seed}: {why}\nlast operations:\n{}",
                tail.join("\n")
            );
        };
        for step in 0..shape.steps {
            let roll = below(&mut rng, 100);
            let c = below(&mut rng, 2) as usize;
            if roll < 4 {
                // A clean switch, now and then at or just before one of the new
                // policy's window edges.
                let old = policies[current];
                current = 1 - current;
                for (part, l) in parts.iter_mut().zip(old) {
                    part.switch(l);
                }
                if below(&mut rng, 2) == 0 {
                    let p = policies[current][0].period_us;
                    let edge = (now / p + 1) * p;
                    now = now.max(edge - below(&mut rng, 3) * below(&mut rng, 2_000));
                }
                tally.switches += 1;
                log.push(format!(
                    "{step}: switch to {} at {now}",
                    ["A", "B"][current]
                ));
            } else if roll < 50 || held.is_empty() {
                let cost = match below(&mut rng, 40) {
                    0 => capacity + 1,
                    1 => capacity,
                    _ => 1 + below(&mut rng, shape.max_cost),
                };
                let l = &clients[current][c];
                let (d, r) = rt
                    .block_on(l.charge_n_at_micros(&key, cost as u32, now))
                    .unwrap();
                log.push(format!(
                    "{step}: {} client {c} charges {cost} at {now}: {}",
                    ["A", "B"][current],
                    if d.is_allowed() {
                        format!("receipt {}", held.len())
                    } else {
                        "denied".into()
                    }
                ));
                if !d.is_allowed() {
                    tally.denied += 1;
                    continue;
                }
                tally.admitted += 1;
                let mut at = Vec::new();
                for (part, l) in parts.iter_mut().zip(policies[current]) {
                    match part.admit(l, now, cost, shape.readings) {
                        Ok(t) => at.push(t),
                        Err(why) => fail(&log, format!("{:?}: {why}", l.algorithm)),
                    }
                }
                let end = if several {
                    u64::MAX
                } else {
                    now + d.reset_after().as_micros() as u64
                };
                let receipt = r.expect("a receipt");
                held.push(Held {
                    receipt,
                    policy: current,
                    cost,
                    at,
                    end,
                });
            } else if roll < 75 {
                let id = match below(&mut rng, 4) {
                    0 => below(&mut rng, held.len() as u64) as usize,
                    _ => held.len() - 1 - below(&mut rng, 5.min(held.len() as u64)) as usize,
                };
                let h = &held[id];
                // Mostly the issuing policy's limiter (an old replica finishing a
                // request after the switch), else the current one's.
                let by = if below(&mut rng, 4) == 0 {
                    current
                } else {
                    h.policy
                };
                let back = rt
                    .block_on(clients[by][c].refund_at_micros(&h.receipt, now))
                    .unwrap();
                log.push(format!(
                    "{step}: {} client {c} refunds receipt {id} at {now}: {back}",
                    ["A", "B"][by]
                ));
                if by != h.policy {
                    tally.foreign += 1;
                    if back {
                        fail(&log, "another policy's limiter gave back".into());
                    }
                }
                if !back {
                    continue;
                }
                tally.gave += 1;
                if !gave.insert(id) && !several {
                    fail(&log, format!("receipt {id} gave back twice"));
                }
                for ((part, l), &at) in parts.iter_mut().zip(policies[h.policy]).zip(&h.at) {
                    let gcra = (l.algorithm == Algorithm::Gcra).then(|| (l.interval_us(), h.end));
                    if let Err(why) = part.refund(gcra, at, h.cost, now) {
                        if !several {
                            fail(&log, format!("{:?}: {why}", l.algorithm));
                        }
                    }
                }
            } else if roll < 93 {
                now += if below(&mut rng, 5) == 0 {
                    span / 2 + below(&mut rng, 2 * span)
                } else {
                    below(&mut rng, shape.small_us)
                };
                log.push(format!("{step}: clock to {now}"));
            } else {
                // A little back (another replica's clock); without the latest
                // reading, never behind the windows of the latest reading (see
                // `a_clock_behind_a_switch_drops_units_of_a_later_window`).
                let mut floor = base;
                for (i, part) in parts.iter().enumerate().filter(|_| !shape.readings) {
                    for l in policies.iter().map(|p| &p[i]) {
                        if matches!(
                            l.algorithm,
                            Algorithm::FixedWindow | Algorithm::SlidingWindow
                        ) {
                            floor = floor.max(part.latest / l.period_us * l.period_us);
                        }
                    }
                }
                now = now.saturating_sub(below(&mut rng, span / 4)).max(floor);
                log.push(format!("{step}: clock back to {now}"));
            }
        }
    }
    eprintln!("{name}: {tally:?}");
    let t = &tally;
    assert!(
        t.admitted > 0 && t.denied > 0 && t.switches > 0 && t.gave > 0 && t.foreign > 0,
        "{name}: {tally:?}"
    );
}
/// The period of policy A's limits: 6 s, long beside a trace's run time, so no
/// key's time to live ends while the trace still reads it.
const P: u64 = 6 * S;

const fn limit(algorithm: Algorithm, limit: u64, period_us: u64, burst: u64) -> Limit {
    Limit {
        algorithm,
        limit,
        period_us,
        burst,
    }
}

/// A window or log policy A (8 in 6 s) and the B's it switches with: its period
/// and a third of it (each with a smaller limit and a larger one), twice it, 7/5
/// of it.
fn window_shapes(algorithm: Algorithm, readings: bool) -> Vec<(String, Shape)> {
    let leak = |l: Limit| -> &'static [Limit] { Box::leak(Box::new([l])) };
    let a = leak(limit(algorithm, 8, P, 0));
    [
        (4, P),
        (14, P),
        (4, P / 3),
        (12, P / 3),
        (14, 2 * P),
        (6, 7 * P / 5),
    ]
    .into_iter()
    .map(|(l, p)| {
        (
            format!("{algorithm:?} 8/{P} to {l}/{p}"),
            Shape {
                a,
                b: leak(limit(algorithm, l, p, 0)),
                max_cost: 3,
                small_us: P / 10,
                seeds: 2,
                steps: 300,
                readings,
            },
        )
    })
    .collect()
}

/// Every window shape of `algorithm` ([`window_shapes`]) through [`run_shape`],
/// with the limiters' `latest_reading` option as `readings`.
fn window_switches(algorithm: Algorithm, readings: bool) {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    for (name, shape) in window_shapes(algorithm, readings) {
        run_shape(&server, &rt, shape, &name);
    }
}

#[test]
fn fixed_window_switches_stay_within_the_new_limit() {
    window_switches(Algorithm::FixedWindow, false);
}

#[test]
fn sliding_window_switches_stay_within_the_new_limit() {
    window_switches(Algorithm::SlidingWindow, false);
}

#[test]
fn sliding_log_switches_stay_within_the_new_limit() {
    window_switches(Algorithm::SlidingLog, false);
}

/// The window traces again with the latest reading recorded (session 49), the
/// clock stepping back freely, up to a quarter of A's period, across switches.
///
/// Mutations seen failing: see `a_clock_behind_a_switch_is_judged_at_the_latest_reading`.
#[test]
fn window_switches_with_the_latest_reading_stay_within_the_new_limit() {
    window_switches(Algorithm::FixedWindow, true);
    window_switches(Algorithm::SlidingWindow, true);
}

/// GCRA 6 in 6 s (T = 1 s), burst 8, and B's of the same `T` with a burst of 3
/// and of 16, of a shorter `T` with a smaller burst, a longer one with a larger
/// burst, `T` = 1.2 s, and 0.6 s with a burst of 2; 2 s / 6 rounds up to
/// T = 333 334 µs.
#[test]
fn gcra_switches_stay_within_the_new_burst_and_rate() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    const A: &[Limit] = &[limit(Algorithm::Gcra, 6, P, 8)];
    for (i, b) in [
        limit(Algorithm::Gcra, 6, P, 3),
        limit(Algorithm::Gcra, 6, P, 16),
        limit(Algorithm::Gcra, 6, 2 * S, 3),
        limit(Algorithm::Gcra, 6, 2 * P, 12),
        limit(Algorithm::Gcra, 7, 7 * P / 5, 5),
        limit(Algorithm::Gcra, 10, P, 2),
    ]
    .into_iter()
    .enumerate()
    {
        let shape = Shape {
            a: A,
            b: Box::leak(Box::new([b])),
            max_cost: 3,
            small_us: S / 2,
            seeds: 2,
            steps: 300,
            readings: false,
        };
        run_shape(&server, &rt, shape, &format!("gcra {i}"));
    }
}

/// Multi-limit limiters (`and`) whose parts change: a fixed window and a log,
/// and GCRA and a log; each part's bound checked.
#[test]
fn multi_limit_switches_stay_within_every_new_limit() {
    use Algorithm::{FixedWindow, Gcra, SlidingLog, SlidingWindow};
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    const SHAPES: [(&[Limit], &[Limit]); 3] = [
        (
            &[limit(FixedWindow, 8, P, 0), limit(SlidingLog, 12, 2 * P, 0)],
            &[
                limit(FixedWindow, 4, P / 3, 0),
                limit(SlidingLog, 20, 7 * P / 5, 0),
            ],
        ),
        (
            &[limit(SlidingWindow, 8, P, 0), limit(SlidingLog, 12, P, 0)],
            &[
                limit(SlidingWindow, 14, 2 * P, 0),
                limit(SlidingLog, 6, P / 3, 0),
            ],
        ),
        (
            &[limit(Gcra, 6, P, 8), limit(SlidingLog, 10, P, 0)],
            &[limit(Gcra, 6, 2 * S, 3), limit(SlidingLog, 6, 2 * P, 0)],
        ),
    ];
    for readings in [false, true] {
        for (i, (a, b)) in SHAPES.into_iter().enumerate() {
            let shape = Shape {
                a,
                b,
                max_cost: 3,
                small_us: P / 10,
                seeds: 2,
                steps: 300,
                readings,
            };
            run_shape(&server, &rt, shape, &format!("multi {i} {readings}"));
        }
    }
}

/// Two limiters on `server`, policies `a` and `b` of `algorithm` on the same
/// prefix.
fn pair(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    algorithm: Algorithm,
    a: Policy,
    b: Policy,
) -> [RedisLimiter; 2] {
    [a, b].map(|p| with_refunds(rt, server, common::builder(algorithm, p), true))
}

/// Runs `probe` on a fresh server: it returns what went over a bound, which must
/// be nothing.
fn over_the_limit(probe: impl FnOnce(&RedisServer, &tokio::runtime::Runtime) -> Vec<String>) {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let over = probe(&server, &runtime());
    assert!(over.is_empty(), "{over:#?}");
}

/// How many charges of 1 `l` admits on `key` at `at` (µs), up to 100.
fn fill(rt: &tokio::runtime::Runtime, l: &RedisLimiter, key: &str, at: u64) -> u64 {
    let admit = || {
        rt.block_on(l.check_n_at_micros(key, 1, at))
            .unwrap()
            .is_allowed()
    };
    (0..100).take_while(|_| admit()).count() as u64
}

/// Found by this review, and closed where window states record their latest
/// reading (`RedisLimiterBuilder::latest_reading`, session 49; see the next test):
/// without it, a clock a little behind at a switch to a shorter
/// window loses the old policy's units. Policy A, 10 in 6 s, admits 5 at 4.01 s
/// (A's window [0, 6)); B, 10 in 2 s, reads 3.99 s (a replica 20 ms behind) and
/// counts A's 5 whole in its window [2, 4) (A's window ends past its start),
/// admits 5 and writes window [2, 4) of its own period; at 4.02 s B's own state
/// is of an older window, so [4, 6) starts fresh and admits 10: with A's 5 at
/// 4.01 s, 15 units in B's window [4, 6). The sliding window the same, once the
/// previous window's weight has faded (at 5.99 s: 5 + 1 + 9). The cause: a state
/// of another period records its window, not its latest instant; a window of
/// the new period that ends before the old window does is written as if it held
/// all the old units, and forgets them when it moves on (`fixed_window.lua` and
/// `sliding_window.lua`, the `sp ~= p` branch). No small fix: judging at the
/// new period's last window within the old one would deny a clean switch's
/// whole new window; recording the latest reading changes the state's format,
/// which a version from before it reads as malformed: hence an option.
#[test]
#[ignore = "open without the latest reading: a clock behind a switch to a shorter window drops the old units (see doc)"]
fn a_clock_behind_a_switch_drops_units_of_a_later_window() {
    clock_behind_a_switch(false);
}

/// The same with window states recording their latest reading: B's reading 20 ms
/// behind A's admission is judged at it, so A's 5 count in B's window [4, 6) and
/// B admits 5 more there in all.
///
/// Mutations seen failing: the reading not parsed (`window_reading` returning 0),
/// not judged at (`at` left at now, in either window script), not written
/// (`reading_field` returning '').
#[test]
fn a_clock_behind_a_switch_is_judged_at_the_latest_reading() {
    clock_behind_a_switch(true);
}

/// Policy A (10 in 6 s) admits 5 at 4.01 s; B (10 in 2 s) reads 3.99 s, then 4.02
/// s and 5.99 s: B's window [4, 6) must hold no more than B's limit with A's 5.
fn clock_behind_a_switch(latest_reading: bool) {
    over_the_limit(|server, rt| {
        let t0 = 600 * S;
        let mut over = Vec::new();
        for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
            let [a, b] = [policy(10, 6 * S), policy(10, 2 * S)].map(|p| {
                let builder = common::builder(algorithm, p).latest_reading(latest_reading);
                with_refunds(rt, server, builder, true)
            });
            let key = format!("behind-{algorithm:?}");
            assert!(rt
                .block_on(a.check_n_at_micros(&key, 5, t0 + 4_010_000))
                .unwrap()
                .is_allowed());
            assert_eq!(fill(rt, &b, &key, t0 + 3_990_000), 5, "A's 5 counted");
            let later = fill(rt, &b, &key, t0 + 4_020_000) + fill(rt, &b, &key, t0 + 5_990_000);
            if later > 5 {
                over.push(format!(
                    "{algorithm:?}: [4 s, 6 s) holds A's 5 and {later} of B's"
                ));
            }
        }
        over
    });
}

/// By design (the crate docs, "A policy change"): a policy of a longer period counts
/// what the old policy's state still holds, nothing more. Each a limit of 10 a
/// second, then of 25 (the log 15) in 2 s: at its last admission the log had
/// trimmed the units older than its second, and the fixed and sliding windows had
/// moved on from the window holding them, so the one unit admitted then is all
/// the new policy counts, and it admits its limit less that one: the log 14 at
/// 101.3 s, 25 in (99.3, 101.3] with a limit of 15. A state keeps only what its
/// own period needs (it cannot know a later policy's). Found by this review as
/// an over-admission of B's windows; kept as the documented behaviour.
///
/// Mutations seen failing: another period's state read as fresh by the fixed
/// window, and by the sliding window (each admits 25).
#[test]
fn a_longer_period_counts_what_the_old_state_still_holds() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    for (algorithm, limit_b, second_at) in [
        (Algorithm::SlidingLog, 15, 101_200_000),
        (Algorithm::FixedWindow, 25, 101_000_000),
        (Algorithm::SlidingWindow, 25, 102_000_000),
    ] {
        let [a, b] = pair(
            &rt,
            &server,
            algorithm,
            policy(10, S),
            policy(limit_b, 2 * S),
        );
        let key = format!("longer-{algorithm:?}");
        let check = |n, at| {
            rt.block_on(a.check_n_at_micros(&key, n, at))
                .unwrap()
                .is_allowed()
        };
        assert!(check(10, 100 * S) && check(1, second_at));
        let admitted = fill(&rt, &b, &key, second_at + 300_000);
        assert_eq!(admitted, limit_b - 1, "{algorithm:?}");
    }
}

/// The sliding window at a switch counts no less than the old policy's own
/// estimate then (the crate docs, "A policy change"): a unit fits only where it
/// fits under both. A, 10 in 6 s, admits 10 at 5 s; B, 10 in 2 s, reads 7.9 s:
/// on B's windows A's 10 (its window ends at 6 s) weigh 0.05 in the previous
/// window [4 s, 6 s), 0; A's own estimate weighs them `(6 − 1.9)/6`, 6. The
/// random traces do not demand this (their bound is B's windows alone).
///
/// Mutation seen failing: the floor at the old estimate removed (B admits 10).
#[test]
fn a_sliding_window_switch_counts_the_old_estimate() {
    over_the_limit(|server, rt| {
        let [a, b] = pair(
            rt,
            server,
            Algorithm::SlidingWindow,
            policy(10, 6 * S),
            policy(10, 2 * S),
        );
        let t0 = 600 * S;
        let a_admits = rt.block_on(a.check_n_at_micros("floor", 10, t0 + 5 * S));
        assert!(a_admits.unwrap().is_allowed());
        let old_estimate = 10 * (6 * S - 1_900_000) / (6 * S);
        let admitted = fill(rt, &b, "floor", t0 + 7_900_000);
        if admitted + old_estimate > 10 {
            return vec![format!(
                "B admitted {admitted} over A's estimate {old_estimate}"
            )];
        }
        Vec::new()
    });
}
