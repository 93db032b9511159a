//! The hot-key modes under arbitrary operations, held to their documented bounds.
//!
//! **`HotKeyLimiter`** (storage picked by an input byte; 1, 2 or 4 table shards; a
//! capacity of 8 to 64 keys, so that floods of new keys reclaim and evict around hot
//! ones): checks at the clock or at readings behind or ahead of it, the same from a
//! second thread (a helper kept for the process, so a second owner index: a second lease shard, or
//! the central word alone when the key has one shard), clock moves, promotions,
//! demotions, removals and floods; leases of 1 to 5 units on 1, 2 or 4 shards, with
//! lifetimes from one tick (65.5 µs) to 1 s.
//!
//! * **Detection** (the mode byte's top bit, clear in the seeds made before it): one
//!   cold check in 1, 2 or 4 sampled per thread, a key sampled 1 to 4 times from 1 or
//!   2 threads within 5 ms to 5 s turns hot by itself, taking the slot of an idle hot
//!   key if none is free; otherwise keys turn hot only by `promote`. The sample
//!   counter is thread-local and lives as long as its thread, so each input first
//!   brings the counters of this thread and of the helper to a multiple of 4
//!   (`align_sampling`): which checks are sampled then depends on the input alone.
//!   After every operation the limiter's promotion and demotion counters say what
//!   changed: a check promotes at most its own key (then hot) and demotes at most
//!   one hot key for it (then cold), and the hot keys are exactly those the model
//!   holds. A key's lease bound applies from the check that promoted it on.
//! * The table judges every decision of a shard at `max(reading, R)`, R the shard's
//!   latest removal instant (`KeyedLimiter::remove`), and a hot key's the same
//!   (`HotKeyLimiter`'s bound). On a multi-shard table the target learns each key's
//!   shard before the run (`common/probe.rs`, with fixed hash seeds,
//!   `common/seeds.rs`) and keeps R per shard: a removal, reclamation or eviction an operation on a key makes is in that
//!   key's shard, at the instant that operation was judged at (the table's removal
//!   counters say when one happened). So readings behind a removal are judged at
//!   their own shard's R, on every table.
//! * A key never hot in its life (since it was last removed, or possibly evicted)
//!   decides exactly as an un-keyed GCRA twin judged at the same instants.
//! * Every key's admissions in a life, by judged instant, meet the lease bound: over
//!   any `[a, b]`, at most `B + ⌊(b − a)/T⌋ +` the units on lease at `a` — counted
//!   as `lease shards in use × lease size` once the key has been hot in the life,
//!   and with one 65.5 µs tick added to `b − a` (a lease is dated to its tick).
//!   A key idle when reclaimed keeps its life: an idle state and a fresh one judge
//!   alike at and after the reclamation instant.
//! * A hot key is never evicted nor reclaimed; `is_hot` says what the last
//!   promotion or demotion did.
//!
//! **`LeasedGcra`**, direct (one mode byte in four): `check_on` over 1 to 4 shards,
//! on a clock that the input moves both ways (readings behind the limiter's origin,
//! and near the end of the 44-bit expiry field); its admissions by reading meet
//! `B + ⌊(b − a)/T⌋ + shards × lease size` over every interval, with a tick's slack.
//! Where the mode byte's top bit is set, lease expiry reads a coarse clock of its own
//! (`Expiry::Coarse` over quanta's mock), at an origin apart from the refill clock's:
//! it follows the base reading less a staleness the input sets (`Flood`'s lag: ahead
//! of it too, and a larger one steps it back), stalls and resumes (`Demote`), and
//! reads before the limiter's origin when far behind. The same bound holds with the
//! slack widened by the spread of the lag (refill reading less expiry reading) over
//! the run's decisions: a unit is admitted at a refill reading at most a tick plus
//! that spread before the one it was taken at, and at most a lifetime plus it after.
#![no_main]

#[path = "common/clock.rs"]
mod clock;
#[path = "common/probe.rs"]
mod probe;
#[path = "common/seeds.rs"]
mod seeds;

use arbitrary::Arbitrary;
use clock::AnyClock;
use floodgate::lease::{CoarseClock, Expiry};
use floodgate::{
    Clock, Decision, Fingerprint, GcraState, Heap, HotKeyLimiter, HotKeys, Inline, KeyedBuilder,
    LeasedGcra, ManualClock, Nanos, Policy, RateLimiter, Storage,
};
use libfuzzer_sys::fuzz_target;
use std::collections::{HashMap, HashSet};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::Duration;

#[derive(Arbitrary, Debug)]
enum Op {
    Check {
        key: u8,
        cost: u8,
    },
    /// A reading `lag` ms from the clock (negative: a reading taken earlier).
    CheckAt {
        key: u8,
        cost: u8,
        lag: i16,
    },
    /// `CheckAt` from the second thread.
    Peer {
        key: u8,
        cost: u8,
        lag: i16,
    },
    Advance {
        ms: u16,
    },
    Promote {
        key: u8,
    },
    Demote {
        key: u8,
    },
    Remove {
        key: u8,
    },
    /// Checks of `n` new keys (a lag as `CheckAt`'s): reclamation and eviction.
    Flood {
        n: u8,
        lag: i16,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    mode: u8,
    lease_size: u8,
    lease_shards: u8,
    lifetime: u8,
    table: u8,
    ops: Vec<Op>,
}

/// 10 per second (T = 100 ms), burst 5.
const BURST: u64 = 5;
const INTERVAL_NS: u64 = 100_000_000;
const MS: u64 = 1_000_000;
/// A lease is dated to its tick: 2^16 ns.
const TICK: u64 = 1 << 16;
/// Keys the operations name.
const KEYS: u8 = 6;
/// The first flood key.
const FLOOD: u64 = 1_000;
const START: u64 = 1_000_000_000_000;

fn policy() -> Policy {
    Policy::per_second(10).unwrap().with_burst(BURST).unwrap()
}

fn lease_size(input: &Input) -> u32 {
    u32::from(input.lease_size % 5) + 1
}

fn lease_shards(input: &Input) -> usize {
    1 << (input.lease_shards % 3)
}

fn lifetime(input: &Input) -> Duration {
    match input.lifetime % 4 {
        0 => Duration::from_nanos(TICK),
        1 => Duration::from_millis(50),
        2 => Duration::from_millis(300),
        _ => Duration::from_secs(1),
    }
}

/// A reading `lag` ms from `now` (never below 1 s).
fn lagged(now: u64, lag: i16) -> u64 {
    now.saturating_add_signed(i64::from(lag) * MS as i64)
        .max(1_000_000_000)
}

/// Asserts the lease bound over every interval of `grants` (instant, units): at
/// most `B + ⌊(b − a + ahead)/T⌋ + on_lease` units judged in `[a, b]` (the documented
/// bound, the units on lease at `a` counted as `on_lease`), and at most
/// `B + ⌊(b − a + life)/T⌋` where `life` is the lease lifetime plus `ahead` (0 for a
/// key never hot): each unit admitted at `j` was taken from the central word at a
/// reading in `(j − lifetime, j + ahead)` — no later than its admission, to the tick
/// (`ahead` is a tick; with a coarse expiry clock, plus the spread of its lag, on
/// both sides), and no earlier than a lifetime before — and the central word is an
/// exact GCRA.
fn assert_bound(grants: &[(u64, u64)], on_lease: u64, ahead: u64, life: u64, what: &str) {
    let mut g: Vec<(u64, u64)> = grants.to_vec();
    g.sort_unstable();
    for i in 0..g.len() {
        if i > 0 && g[i - 1].0 == g[i].0 {
            continue; // an interval starts at the first grant of an instant
        }
        let mut sum = 0;
        for j in i..g.len() {
            sum += g[j].1;
            if g.get(j + 1).is_some_and(|n| n.0 == g[j].0) {
                continue;
            }
            let span = g[j].0 - g[i].0;
            let allowed =
                BURST + ((span + ahead) / INTERVAL_NS + on_lease).min((span + life) / INTERVAL_NS);
            assert!(
                sum <= allowed,
                "{what}: {sum} units judged in [{}, {}] > {allowed}: {g:?}",
                g[i].0,
                g[j].0
            );
        }
    }
}

/// One key's life in the model: since its last removal (or possible eviction).
#[derive(Default)]
struct Life {
    grants: Vec<(u64, u64)>,
    /// Hot at some point of this life (or possibly evicted unseen): no exact twin.
    inexact: bool,
    twin: Option<RateLimiter<floodgate::Gcra, AnyClock>>,
}

/// A job for the helper thread.
type Job = Box<dyn FnOnce() + Send>;

/// Runs `job` on the second thread and returns its answer: the thread is spawned
/// once and kept, so it holds one owner index for the whole process (a thread per
/// input would also leave LeakSanitizer a thread still tearing down at exit).
fn on_helper<R: Send + 'static>(job: impl FnOnce() -> R + Send + 'static) -> R {
    static HELPER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let helper = HELPER.get_or_init(|| {
        let (job_tx, job_rx) = mpsc::channel::<Job>();
        std::thread::spawn(move || {
            for job in job_rx {
                job();
            }
        });
        Mutex::new(job_tx)
    });
    let (answer_tx, answer_rx) = mpsc::channel();
    let job: Job = Box::new(move || {
        let _ = answer_tx.send(job());
    });
    helper.lock().unwrap().send(job).unwrap();
    answer_rx.recv().unwrap()
}

/// Detection settings (`HotKeys::detection`), from the mode byte's bits 2 to 6
/// and the lifetime byte's bits 2 and 3.
#[derive(Clone, Copy, Debug)]
struct Detect {
    every: u32,
    window: Duration,
    samples: u32,
    threads: u32,
}

/// Detection on where the mode byte's top bit is set (clear in the seeds made before).
fn detection(input: &Input) -> Option<Detect> {
    (input.mode & 0x80 != 0).then(|| Detect {
        every: 1 << ((input.mode >> 2) % 3),
        samples: u32::from((input.mode >> 4) & 3) + 1,
        threads: u32::from((input.mode >> 6) & 1) + 1,
        window: Duration::from_millis(match (input.lifetime >> 2) & 3 {
            0 => 5,
            1 => 50,
            2 => 500,
            _ => 5_000,
        }),
    })
}

/// The largest `Detect::every`: [`align_sampling`] aligns to it.
const SAMPLE_ALIGN: u32 = 4;

/// Brings the calling thread's detection counter (a thread-local count of cold
/// checks, `sampled` in hot.rs, kept for the thread's life) to a multiple of
/// [`SAMPLE_ALIGN`], so that which checks of an input are sampled depends on the
/// input alone: cold checks of one key on a limiter sampling one in `SAMPLE_ALIGN`
/// and promoting on the first sample, until a check turns the key hot (that check
/// was the sampled one), then a demotion for the next call.
fn align_sampling() {
    static ALIGNER: OnceLock<HotKeyLimiter<u64, ManualClock>> = OnceLock::new();
    let aligner = ALIGNER.get_or_init(|| {
        HotKeyLimiter::new(
            policy(),
            KeyedBuilder::default()
                .capacity(8)
                .shards(1)
                .clock(ManualClock::starting_at(Nanos::new(START))),
            HotKeys::default()
                .slots(1)
                .lease_shards(1)
                .lease_size(1)
                .detection(SAMPLE_ALIGN, Duration::from_secs(1), 1, 1),
        )
        .unwrap()
    });
    for _ in 0..SAMPLE_ALIGN {
        let _ = aligner.check(&0);
        if aligner.demote(&0) {
            return;
        }
    }
    panic!("none of {SAMPLE_ALIGN} checks was sampled");
}

/// The table shard classes of the keys an input names, learnt by a probe
/// (`common/probe.rs`) with the clock at `1..=keys` ns: the unit charged at reading
/// 0 was judged at `at + left − T`, `left` what a peek of the key at `at` says is
/// booked ahead (a key detection promoted is demoted first, its booking unchanged).
/// One table shard needs no probe: no classes (every key in class 0), R = 0.
fn probe_shards<S: Storage<u64, GcraState>>(
    limiter: &HotKeyLimiter<u64, AnyClock, S>,
    clock: &AnyClock,
    keys: impl Iterator<Item = u64>,
    shards: usize,
    detection: bool,
) -> (HashMap<u64, usize>, Vec<u64>) {
    if shards == 1 {
        return (HashMap::new(), vec![0]);
    }
    let mut of = HashMap::new();
    let mut order = Vec::new();
    let mut known = Vec::new();
    for (i, key) in keys.enumerate() {
        let at = Nanos::new(i as u64 + 1);
        clock.set(at);
        let judge = || {
            let d = limiter.check_n_at(&key, Nanos::ZERO, 1);
            assert!(d.is_allowed(), "probe: fresh key {key} refused: {d:?}");
            if detection {
                limiter.demote(&key);
            }
            let left = limiter.peek(&key, 0).reset_after_nanos();
            let judged = (at.as_u64() + left).checked_sub(INTERVAL_NS);
            Nanos::new(judged.expect("probe: the unit charged is no longer booked"))
        };
        let class = probe::probe_judged(
            key,
            at,
            judge,
            || limiter.remove(&key),
            &mut known,
            |i| of[&order[i]],
        );
        of.insert(key, class);
        order.push(key);
    }
    assert!(known.len() <= shards, "probe: more classes than shards");
    (of, known.iter().map(|r| r.as_u64()).collect())
}

fn run_keyed<S: Storage<u64, GcraState> + 'static>(input: &Input) {
    let clock = AnyClock::default();
    let table_shards = 1usize << (input.table % 3);
    // 8 to 64 keys a shard.
    let capacity = table_shards * (8 << ((input.table / 3) % 4));
    let detect = detection(input);
    let hot = HotKeys::default()
        .slots(2)
        .lease_shards(lease_shards(input))
        .lease_size(lease_size(input))
        .lease_lifetime(lifetime(input));
    let hot = match detect {
        Some(d) => hot.detection(d.every, d.window, d.samples, d.threads),
        None => hot.manual(),
    };
    let limiter: Arc<HotKeyLimiter<u64, AnyClock, S>> = Arc::new(
        HotKeyLimiter::new_in(
            policy(),
            KeyedBuilder::default()
                .capacity(capacity)
                .shards(table_shards)
                .clock(clock.clone()),
            hot,
        )
        .unwrap(),
    );
    let ops = &input.ops[..input.ops.len().min(300)];
    let uses_peer = ops.iter().any(|op| matches!(op, Op::Peer { .. }));
    if detect.is_some() {
        align_sampling();
        if uses_peer {
            on_helper(align_sampling);
        }
    }
    let floods: u64 = ops
        .iter()
        .map(|op| match *op {
            Op::Flood { n, .. } => u64::from(n % 48),
            _ => 0,
        })
        .sum();
    let (class, removed_at) = probe_shards(
        &limiter,
        &clock,
        (0..u64::from(KEYS)).chain(FLOOD..FLOOD + floods),
        table_shards,
        detect.is_some(),
    );
    clock.set(Nanos::new(START));
    // Lease shards a key's units can sit on: this thread's and the helper's.
    let on_lease =
        (lease_shards(input).min(1 + usize::from(uses_peer)) as u64) * u64::from(lease_size(input));
    let m = limiter.metrics();
    let h = limiter.hot_metrics();
    let mut model = Model {
        clock: &clock,
        class,
        removed_at,
        lives: HashMap::new(),
        hot: HashSet::new(),
        counts: (m.reclaimed, m.evicted, m.removed),
        hot_counts: (h.promotions, h.demotions),
        on_lease,
        lifetime: lifetime(input).as_nanos() as u64,
        stats: [0; 3],
    };
    let mut next_flood = FLOOD;
    for op in ops {
        let now = clock.now().as_u64();
        match *op {
            Op::Check { key, cost }
            | Op::CheckAt { key, cost, .. }
            | Op::Peer { key, cost, .. } => {
                let key = u64::from(key % KEYS);
                let cost = u32::from(cost % 8);
                let at = match *op {
                    Op::CheckAt { lag, .. } | Op::Peer { lag, .. } => lagged(now, lag),
                    _ => now,
                };
                let d = match *op {
                    Op::Check { .. } => limiter.check_n(&key, cost),
                    Op::Peer { .. } => {
                        let limiter = Arc::clone(&limiter);
                        on_helper(move || limiter.check_n_at(&key, Nanos::new(at), cost))
                    }
                    _ => limiter.check_n_at(&key, Nanos::new(at), cost),
                };
                model.decided(&limiter, key, at, cost, d);
                model.detected(&limiter, key, detect.is_some());
            }
            Op::Advance { ms } => {
                clock.advance(Duration::from_millis(u64::from(ms % 2_000)));
            }
            Op::Promote { key } => {
                let key = u64::from(key % KEYS);
                let was = model.hot.contains(&key);
                let promoted = limiter.promote(&key);
                model.after(&limiter, key, model.judged(key, now));
                // A promotion takes the slot of an idle hot key if none is free.
                let (up, down) = model.sync_hot(&limiter, key);
                assert_eq!(promoted, limiter.is_hot(&key), "key {key}");
                assert_eq!(up, u64::from(promoted && !was), "key {key} promoted");
                assert!(down <= up, "{down} keys demoted by {up} promotions");
            }
            Op::Demote { key } => {
                let key = u64::from(key % KEYS);
                let was = limiter.is_hot(&key);
                assert_eq!(was, model.hot.contains(&key), "key {key} hot");
                assert_eq!(limiter.demote(&key), was);
                model.after(&limiter, key, model.judged(key, now));
                assert_eq!(model.sync_hot(&limiter, key), (0, u64::from(was)));
            }
            Op::Remove { key } => {
                let key = u64::from(key % KEYS);
                let was = model.hot.contains(&key);
                limiter.remove(&key);
                // A removal forgets the key: its count starts again, fresh.
                model.end_life(key);
                model.after(&limiter, key, model.judged(key, now));
                assert_eq!(model.sync_hot(&limiter, key), (0, u64::from(was)));
                assert!(!limiter.is_hot(&key));
            }
            Op::Flood { n, lag } => {
                for _ in 0..(n % 48) {
                    let key = next_flood;
                    next_flood += 1;
                    let at = lagged(clock.now().as_u64(), lag);
                    let _ = limiter.check_n_at(&key, Nanos::new(at), 1);
                    model.after(&limiter, key, model.judged(key, at));
                    model.detected(&limiter, key, detect.is_some());
                }
            }
        }
        for &key in &model.hot {
            assert!(limiter.is_hot(&key), "hot key {key} lost its seal");
        }
    }
    for key in model.lives.keys().copied().collect::<Vec<_>>() {
        model.end_life(key);
    }
    if std::env::var_os("HOT_KEYS_STATS").is_some() {
        // What a corpus reaches: `HOT_KEYS_STATS=1 hot_keys -runs=0 corpus/hot_keys`.
        let [detected, displaced, behind] = model.stats;
        let classes = model.removed_at.len();
        eprintln!(
            "keyed shards {table_shards} classes {classes} detection {} promoted by it \
             {detected} displaced {displaced} judged behind R {behind}",
            detect.is_some()
        );
    }
}

struct Model<'a> {
    clock: &'a AnyClock,
    /// Each key's table shard class (from the probe; empty with one shard).
    class: HashMap<u64, usize>,
    /// Each class's latest removal instant R.
    removed_at: Vec<u64>,
    lives: HashMap<u64, Life>,
    /// The keys hot now (flood keys too, where detection promoted one).
    hot: HashSet<u64>,
    /// The table's (reclaimed, evicted, removed) counters last seen.
    counts: (u64, u64, u64),
    /// The limiter's (promotions, demotions) last seen.
    hot_counts: (u64, u64),
    on_lease: u64,
    /// The lease lifetime, in ns.
    lifetime: u64,
    /// What the run reached (`HOT_KEYS_STATS=1` prints it): promotions by detection,
    /// demotions they made, decisions judged after their reading (behind an R).
    stats: [u64; 3],
}

impl Model<'_> {
    /// The instant the table judges `key` read at `at` at: `max(at, R)` of its shard.
    fn judged(&self, key: u64, at: u64) -> u64 {
        at.max(self.removed_at[self.class_of(key)])
    }

    fn class_of(&self, key: u64) -> usize {
        if self.class.is_empty() {
            0
        } else {
            self.class[&key]
        }
    }

    fn life(&mut self, key: u64) -> &mut Life {
        self.lives.entry(key).or_default()
    }

    /// The bound over the life that ends, then a fresh one.
    fn end_life(&mut self, key: u64) {
        if let Some(life) = self.lives.remove(&key) {
            let (on_lease, span) = if life.inexact {
                (self.on_lease, self.lifetime + TICK)
            } else {
                (0, 0)
            };
            assert_bound(&life.grants, on_lease, TICK, span, &format!("key {key}"));
        }
    }

    /// A decision `d` on `key` read at `at`.
    fn decided<S: Storage<u64, GcraState>>(
        &mut self,
        limiter: &HotKeyLimiter<u64, AnyClock, S>,
        key: u64,
        at: u64,
        cost: u32,
        d: Decision,
    ) {
        let judged = self.judged(key, at);
        self.stats[2] += u64::from(judged > at);
        let clock = self.clock.clone();
        let life = self.life(key);
        if !life.inexact {
            let twin = life
                .twin
                .get_or_insert_with(|| RateLimiter::gcra_with_clock(policy(), clock));
            let want = twin.check_n_at(Nanos::new(judged), cost);
            assert_eq!(d, want, "cold key {key} read at {at}, judged at {judged}");
        }
        if d.is_allowed() && cost > 0 {
            life.grants.push((judged, u64::from(cost)));
        }
        self.after(limiter, key, judged);
    }

    /// After a check of `key` (which detection may have sampled): at most one
    /// promotion, of `key`, which may have demoted one idle hot key for its slot.
    /// The key's lease bound applies from here on.
    fn detected<S: Storage<u64, GcraState>>(
        &mut self,
        limiter: &HotKeyLimiter<u64, AnyClock, S>,
        key: u64,
        detection: bool,
    ) {
        let (up, down) = self.sync_hot(limiter, key);
        assert!(
            up <= u64::from(detection) && down <= up,
            "a check of key {key}: {up} promotions, {down} demotions"
        );
        self.stats[0] += up;
        self.stats[1] += down;
    }

    /// Follows the limiter's promotions and demotions since the last call, made by
    /// an operation on `key`: a promotion can only be of `key`, which then is hot (and
    /// no longer exact, if modelled); a demotion is of a key in the hot set, which
    /// then is not hot. Returns (promotions, demotions).
    fn sync_hot<S: Storage<u64, GcraState>>(
        &mut self,
        limiter: &HotKeyLimiter<u64, AnyClock, S>,
        key: u64,
    ) -> (u64, u64) {
        let h = limiter.hot_metrics();
        let up = h.promotions - self.hot_counts.0;
        let down = h.demotions - self.hot_counts.1;
        self.hot_counts = (h.promotions, h.demotions);
        let before = self.hot.len() as u64;
        self.hot.retain(|k| limiter.is_hot(k));
        assert_eq!(before - self.hot.len() as u64, down, "hot keys demoted");
        assert!(up <= 1, "{up} promotions in one operation");
        if up == 1 {
            assert!(limiter.is_hot(&key), "key {key} promoted but not hot");
            assert!(self.hot.insert(key), "key {key} promoted while hot");
            if key < u64::from(KEYS) {
                self.life(key).inexact = true;
            }
        }
        assert_eq!(h.hot_keys, self.hot.len() as u64, "hot keys {:?}", self.hot);
        (up, down)
    }

    /// After an operation on `key` judged at `at`: a reclamation, eviction or removal
    /// (in `key`'s shard, the only one an operation on it touches) moves that shard's
    /// removal instant to `at`; an eviction may have taken any cold key of that shard
    /// that now reads as fresh, whose life then ends (the target cannot tell).
    fn after<S: Storage<u64, GcraState>>(
        &mut self,
        limiter: &HotKeyLimiter<u64, AnyClock, S>,
        key: u64,
        at: u64,
    ) {
        let m = limiter.metrics();
        let counts = (m.reclaimed, m.evicted, m.removed);
        if counts == self.counts {
            return;
        }
        let class = self.class_of(key);
        self.removed_at[class] = self.removed_at[class].max(at);
        if counts.1 != self.counts.1 {
            let maybe: Vec<u64> = self
                .lives
                .keys()
                .copied()
                .filter(|k| *k != key && !self.hot.contains(k) && self.class_of(*k) == class)
                .filter(|k| limiter.peek(k, 0).remaining() == BURST)
                .collect();
            for k in maybe {
                self.end_life(k);
                self.life(k).inexact = true;
            }
        }
        self.counts = counts;
    }
}

/// The direct limiter's coarse expiry clock (`Expiry::Coarse` over quanta's mock):
/// its mock reads `base − lag` (never below 0) unless stalled; readings count from
/// the mock at `START` (so a reading is `base − START − lag`), and the limiter's origin
/// is 1 s on: a lag past the base's distance from `START + 1 s` reads before it.
struct CoarseDrive {
    mock: Arc<quanta::Mock>,
    /// The mock's value.
    value: u64,
    lag_ms: i64,
    stalled: bool,
    /// The least and the most `refill reading − expiry reading` a decision saw.
    lags: (i128, i128),
}

impl CoarseDrive {
    fn new() -> (CoarseDrive, Expiry) {
        let (clock, mock) = quanta::Clock::mock();
        mock.increment(START);
        let expiry = Expiry::Coarse(CoarseClock::with_clock(clock));
        mock.increment(1_000 * MS);
        let drive = CoarseDrive {
            mock,
            value: START + 1_000 * MS,
            lag_ms: 0,
            stalled: false,
            lags: (i128::MAX, i128::MIN),
        };
        (drive, expiry)
    }

    /// Moves the clock for a decision read at `at`, the base reading being `base`.
    fn tick(&mut self, base: u64, at: u64) {
        if !self.stalled {
            let to = base.saturating_add_signed(-self.lag_ms * MS as i64);
            if to > self.value {
                self.mock.increment(to - self.value);
            } else {
                self.mock.decrement(self.value - to);
            }
            self.value = to;
        }
        let lag = i128::from(at) - i128::from(self.value.saturating_sub(START));
        self.lags = (self.lags.0.min(lag), self.lags.1.max(lag));
    }

    /// How far the lag moved over the decisions (0 before any).
    fn spread(&self) -> u64 {
        let (least, most) = self.lags;
        most.checked_sub(least)
            .and_then(|d| u64::try_from(d).ok())
            .unwrap_or(0)
    }
}

fn run_direct(input: &Input) {
    let clock = AnyClock::default();
    clock.set(Nanos::new(START));
    let shards = lease_shards(input);
    let builder = LeasedGcra::builder(policy())
        .shards(shards)
        .lease_size(lease_size(input))
        .lifetime(lifetime(input));
    let (mut coarse, mut leased) = if input.mode & 0x80 != 0 {
        let (drive, expiry) = CoarseDrive::new();
        (
            Some(drive),
            builder.build_with(clock.clone(), expiry).unwrap(),
        )
    } else {
        (None, builder.build_with_clock(clock.clone()).unwrap())
    };
    // The base reading moves forward; each check reads it with a lag either way.
    // One start in two sits just before the 44-bit expiry field ends.
    let mut base = if input.table % 2 == 0 {
        // Lags reach 32 s either way: readings before the origin too.
        START + 10_000 * MS
    } else {
        // Halfway through the last lifetime whose leases the field can date: a
        // reading ahead by more than half a lifetime takes a lease past its end.
        let lifetime_ns = (lifetime(input).as_nanos() as u64 >> 16) << 16;
        START + (((1u64 << 44) - 1) << 16) - lifetime_ns / 2
    };
    let mut grants = Vec::new();
    for op in input.ops.iter().take(300) {
        let (shard, cost, lag) = match *op {
            Op::Check { key, cost } => (key, cost, 0),
            Op::CheckAt { key, cost, lag } | Op::Peer { key, cost, lag } => (key, cost, lag),
            Op::Advance { ms } => {
                base += u64::from(ms % 2_000) * MS;
                continue;
            }
            // A jump far back: before the origin.
            Op::Promote { key } => (key, 1, i16::MIN),
            // The expiry clock: a staleness (ahead if negative), a stall or its end.
            Op::Flood { lag, .. } => {
                if let Some(c) = coarse.as_mut() {
                    c.lag_ms = i64::from(lag);
                }
                continue;
            }
            Op::Demote { .. } => {
                if let Some(c) = coarse.as_mut() {
                    c.stalled = !c.stalled;
                }
                continue;
            }
            Op::Remove { .. } => continue,
        };
        let at = if lag == i16::MIN {
            START - 30_000 * MS
        } else {
            lagged(base, lag)
        };
        clock.set(Nanos::new(at));
        if let Some(c) = coarse.as_mut() {
            c.tick(base, at);
        }
        let cost = u32::from(cost % 8);
        if leased.check_on(usize::from(shard), cost).is_allowed() && cost > 0 {
            grants.push((at, u64::from(cost)));
        }
    }
    let on_lease = shards as u64 * u64::from(lease_size(input));
    let spread = coarse.as_ref().map_or(0, CoarseDrive::spread);
    let life = lifetime(input).as_nanos() as u64 + TICK + 2 * spread;
    assert_bound(&grants, on_lease, TICK + spread, life, "direct");
}

fuzz_target!(|input: Input| {
    seeds::fix_hash_seeds();
    match input.mode % 4 {
        0 => run_keyed::<Heap>(&input),
        1 => run_keyed::<Inline>(&input),
        2 => run_keyed::<Fingerprint>(&input),
        _ => run_direct(&input),
    }
});
