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
//! * The table judges every decision of a shard at `max(reading, R)`, R the shard's
//!   latest removal instant (`KeyedLimiter::remove`), and a hot key's the same
//!   (`HotKeyLimiter`'s bound). With one table shard the target knows R exactly
//!   (the table's removal counters say when one moved); with more, readings are
//!   raised to the latest instant any shard can have removed at, so that a decision
//!   is judged at its reading.
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
#![no_main]

use arbitrary::Arbitrary;
use floodgate::{
    Clock, Decision, Fingerprint, GcraState, Heap, HotKeyLimiter, HotKeys, Inline, KeyedBuilder,
    LeasedGcra, ManualClock, Nanos, Policy, RateLimiter, Storage,
};
use libfuzzer_sys::fuzz_target;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
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
/// Keys the operations name (flood keys are 1 000 and up).
const KEYS: u8 = 6;
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
/// most `B + ⌊(b − a + TICK)/T⌋ + on_lease` units judged in `[a, b]` (the documented
/// bound, the units on lease at `a` counted as `on_lease`), and at most
/// `B + ⌊(b − a + life)/T⌋` where `life` is the lease lifetime plus a tick (0 for a
/// key never hot): each unit admitted at `j` was taken from the central word at a
/// reading in `(j − lifetime, j + tick)` — no later than its admission, to the tick,
/// and no earlier than a lifetime before — and the central word is an exact GCRA.
fn assert_bound(grants: &[(u64, u64)], on_lease: u64, life: u64, what: &str) {
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
                BURST + ((span + TICK) / INTERVAL_NS + on_lease).min((span + life) / INTERVAL_NS);
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
    twin: Option<RateLimiter<floodgate::Gcra, ManualClock>>,
}

/// A check for the helper thread to make, with its own owner index.
type Job = Box<dyn FnOnce() -> Decision + Send>;

/// Runs `job` on the second thread: spawned once and kept, so it holds one owner
/// index for the whole process (a thread per input would also leave LeakSanitizer a
/// thread still tearing down at exit).
fn on_helper(job: Job) -> Decision {
    type Helper = Mutex<(mpsc::Sender<Job>, mpsc::Receiver<Decision>)>;
    static HELPER: OnceLock<Helper> = OnceLock::new();
    let helper = HELPER.get_or_init(|| {
        let (job_tx, job_rx) = mpsc::channel::<Job>();
        let (answer_tx, answer_rx) = mpsc::channel();
        std::thread::spawn(move || {
            for job in job_rx {
                if answer_tx.send(job()).is_err() {
                    break;
                }
            }
        });
        Mutex::new((job_tx, answer_rx))
    });
    let helper = helper.lock().unwrap();
    helper.0.send(job).unwrap();
    helper.1.recv().unwrap()
}

fn run_keyed<S: Storage<u64, GcraState> + 'static>(input: &Input) {
    let clock = ManualClock::starting_at(Nanos::new(START));
    let table_shards = 1usize << (input.table % 3);
    // 8 to 64 keys a shard.
    let capacity = table_shards * (8 << ((input.table / 3) % 4));
    let limiter: Arc<HotKeyLimiter<u64, ManualClock, S>> = Arc::new(
        HotKeyLimiter::new_in(
            policy(),
            KeyedBuilder::default()
                .capacity(capacity)
                .shards(table_shards)
                .clock(clock.clone()),
            HotKeys::default()
                .manual()
                .slots(2)
                .lease_shards(lease_shards(input))
                .lease_size(lease_size(input))
                .lease_lifetime(lifetime(input)),
        )
        .unwrap(),
    );
    let one_shard = table_shards == 1;
    let uses_peer = input.ops.iter().any(|op| matches!(op, Op::Peer { .. }));
    // Lease shards a key's units can sit on: this thread's and the helper's.
    let on_lease =
        (lease_shards(input).min(1 + usize::from(uses_peer)) as u64) * u64::from(lease_size(input));
    {
        let mut model = Model {
            clock: &clock,
            one_shard,
            removed_at: 0,
            lives: HashMap::new(),
            hot: HashSet::new(),
            counts: (0, 0, 0),
            on_lease,
            lifetime: lifetime(input).as_nanos() as u64,
        };
        let mut next_flood = 1_000u64;
        for op in input.ops.iter().take(300) {
            let now = clock.now().as_u64();
            match *op {
                Op::Check { key, cost } => {
                    let key = u64::from(key % KEYS);
                    let cost = u32::from(cost % 8);
                    let at = model.reading(now);
                    let d = if at == now {
                        limiter.check_n(&key, cost)
                    } else {
                        limiter.check_n_at(&key, Nanos::new(at), cost)
                    };
                    model.decided(&limiter, key, at, cost, d.is_allowed(), Some(d));
                }
                Op::CheckAt { key, cost, lag } | Op::Peer { key, cost, lag } => {
                    let key = u64::from(key % KEYS);
                    let cost = u32::from(cost % 8);
                    let at = model.reading(lagged(now, lag));
                    let d = if matches!(op, Op::Peer { .. }) {
                        let limiter = Arc::clone(&limiter);
                        on_helper(Box::new(move || {
                            limiter.check_n_at(&key, Nanos::new(at), cost)
                        }))
                    } else {
                        limiter.check_n_at(&key, Nanos::new(at), cost)
                    };
                    model.decided(&limiter, key, at, cost, d.is_allowed(), Some(d));
                }
                Op::Advance { ms } => {
                    clock.advance(Duration::from_millis(u64::from(ms % 2_000)));
                }
                Op::Promote { key } => {
                    let key = u64::from(key % KEYS);
                    let promoted = limiter.promote(&key);
                    // A promotion takes the slot of an idle hot key if none is free.
                    let before = model.hot.len();
                    model.hot.retain(|k| limiter.is_hot(k));
                    let freed = before - model.hot.len();
                    assert!(
                        freed == 0 || (promoted && freed == 1),
                        "{freed} keys demoted"
                    );
                    if promoted {
                        assert!(limiter.is_hot(&key));
                        model.hot.insert(key);
                        model.life(key).inexact = true;
                    } else {
                        assert!(!limiter.is_hot(&key));
                    }
                    model.after(&limiter, now, None);
                }
                Op::Demote { key } => {
                    let key = u64::from(key % KEYS);
                    let was = limiter.is_hot(&key);
                    assert_eq!(was, model.hot.contains(&key), "key {key} hot");
                    assert_eq!(limiter.demote(&key), was);
                    assert!(!limiter.is_hot(&key));
                    model.hot.remove(&key);
                    model.after(&limiter, now, None);
                }
                Op::Remove { key } => {
                    let key = u64::from(key % KEYS);
                    limiter.remove(&key);
                    assert!(!limiter.is_hot(&key));
                    model.hot.remove(&key);
                    // A removal forgets the key: its count starts again, fresh.
                    model.end_life(key);
                    model.after(&limiter, now, None);
                }
                Op::Flood { n, lag } => {
                    for _ in 0..(n % 48) {
                        let at = model.reading(lagged(clock.now().as_u64(), lag));
                        let _ = limiter.check_n_at(&next_flood, Nanos::new(at), 1);
                        next_flood += 1;
                        model.after(&limiter, at, None);
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
    }
}

struct Model<'a> {
    clock: &'a ManualClock,
    one_shard: bool,
    /// The latest instant any shard removed a key at (exact with one shard).
    removed_at: u64,
    lives: HashMap<u64, Life>,
    hot: HashSet<u64>,
    /// The table's (reclaimed, evicted, removed) counters last seen.
    counts: (u64, u64, u64),
    on_lease: u64,
    /// The lease lifetime, in ns.
    lifetime: u64,
}

impl Model<'_> {
    /// The reading a check is made at: with several table shards, none behind a
    /// removal (whose shard the target does not know).
    fn reading(&self, at: u64) -> u64 {
        if self.one_shard {
            at
        } else {
            at.max(self.removed_at)
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
            assert_bound(&life.grants, on_lease, span, &format!("key {key}"));
        }
    }

    /// A decision on `key` read at `at`.
    fn decided<S: Storage<u64, GcraState>>(
        &mut self,
        limiter: &HotKeyLimiter<u64, ManualClock, S>,
        key: u64,
        at: u64,
        cost: u32,
        allowed: bool,
        d: Option<Decision>,
    ) {
        let judged = at.max(self.removed_at);
        let clock = self.clock.clone();
        let life = self.life(key);
        if !life.inexact {
            let twin = life
                .twin
                .get_or_insert_with(|| RateLimiter::gcra_with_clock(policy(), clock));
            let want = twin.check_n_at(Nanos::new(judged), cost);
            if let Some(d) = d {
                assert_eq!(d, want, "cold key {key} read at {at}, judged at {judged}");
            }
        }
        if allowed && cost > 0 {
            life.grants.push((judged, u64::from(cost)));
        }
        self.after(limiter, judged, Some(key));
    }

    /// After an operation judged at `at` (on `key`): a reclamation, eviction or
    /// removal moves the removal instant; an eviction may have taken any cold key
    /// that now reads as fresh, whose life then ends (the target cannot tell).
    fn after<S: Storage<u64, GcraState>>(
        &mut self,
        limiter: &HotKeyLimiter<u64, ManualClock, S>,
        at: u64,
        key: Option<u64>,
    ) {
        let m = limiter.metrics();
        let counts = (m.reclaimed, m.evicted, m.removed);
        if counts == self.counts {
            return;
        }
        // A removal by `remove` is judged at the clock's reading (`at` is that).
        self.removed_at = self.removed_at.max(at.max(self.removed_at));
        if counts.1 != self.counts.1 {
            let maybe: Vec<u64> = self
                .lives
                .keys()
                .copied()
                .filter(|k| Some(*k) != key && !self.hot.contains(k))
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

/// A clock the input moves both ways.
#[derive(Clone, Default)]
struct BackClock(Arc<AtomicU64>);

impl Clock for BackClock {
    fn now(&self) -> Nanos {
        Nanos::new(self.0.load(Ordering::Relaxed))
    }
}

fn run_direct(input: &Input) {
    let clock = BackClock::default();
    clock.0.store(START, Ordering::Relaxed);
    let shards = lease_shards(input);
    let mut leased = LeasedGcra::builder(policy())
        .shards(shards)
        .lease_size(lease_size(input))
        .lifetime(lifetime(input))
        .build_with_clock(clock.clone())
        .unwrap();
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
            _ => continue,
        };
        let at = if lag == i16::MIN {
            START - 30_000 * MS
        } else {
            lagged(base, lag)
        };
        clock.0.store(at, Ordering::Relaxed);
        let cost = u32::from(cost % 8);
        if leased.check_on(usize::from(shard), cost).is_allowed() && cost > 0 {
            grants.push((at, u64::from(cost)));
        }
    }
    let on_lease = shards as u64 * u64::from(lease_size(input));
    let life = lifetime(input).as_nanos() as u64 + TICK;
    assert_bound(&grants, on_lease, life, "direct");
}

fuzz_target!(|input: Input| {
    match input.mode % 4 {
        0 => run_keyed::<Heap>(&input),
        1 => run_keyed::<Inline>(&input),
        2 => run_keyed::<Fingerprint>(&input),
        _ => run_direct(&input),
    }
});
