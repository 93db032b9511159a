//! Real threads on one keyed table, against the crate's exact reference models
//! (`floodgate::reference`). Input bytes pick:
//!
//! * the algorithm: GCRA (built as such or as a token bucket, the same machine), the
//!   fixed window or the sliding window counter on a `KeyedLimiter` on `Heap`,
//!   `Inline` or `Fingerprint`, or the `KeyedSlidingLog`;
//! * 1, 2, 4 or 8 shards, 1 to 8 keys (a table of 256: nothing is ever evicted or
//!   reclaimed on its own), the time unit (ns, µs or ms), where the clock starts;
//! * a sequence of *phases*. Each sets the clock (the target's, `common/clock.rs`) to
//!   one instant — later, or in some phases earlier, than the last — and then 2 to 4
//!   threads (`std::thread::scope`, released together by a barrier) run each its own
//!   slice of operations on the shared table: checks and charges (at the clock or at
//!   an explicit reading of the same instant), peeks, refunds of the thread's own
//!   receipts (also of earlier phases, and on another key), `remove`,
//!   `reclaim_idle`, yields. The threads join before the next phase.
//!
//! **Judged instants.** Every decision of a shard is judged at `max(reading, R)`, R
//! that shard's latest removal instant, which only grows. Each key's shard is learnt
//! through the public API before the run (`common/probe.rs`), and per shard the target
//! knows R or, after a `reclaim_idle` that more than one shard may have removed in,
//! bounds it. While the clock stands at `t` every decision of a shard is judged at one
//! instant `J = max(t, R)`, whatever the threads remove meanwhile (a removal at `t`
//! moves R to `J` at most); where R is only bounded and may lie past `t`, the threads
//! read explicitly at the bound, where it is `J` again.
//!
//! **Oracles.** An *exact* phase makes no removal or refund and gives each key one
//! cost: with the instant frozen, every admission of a key is one step of a chain of
//! states and a denial meets its last, so the outcome does not depend on the order.
//! Its model (run sequentially: one check per request of the key) must admit exactly
//! as many, the admitted decisions must be the model's as a multiset, every denial the
//! model's denial, every peek and cost-0 check the view of one state of the chain, and
//! afterwards the key reads (peeks of several costs) as the model. A *mixed* phase
//! varies the costs and adds refunds and removals; per key, with `A` the most units
//! one decision could take (the largest cost a peek allows), the units admitted plus
//! what the key has left at the end never exceed `A` at the start, plus one fresh
//! key's `A` per successful removal, plus the charged units of each successful refund
//! (a refund gives back at most its own charge; the documented error of a refund
//! judged behind an admission stays within those units). A key neither removed nor
//! refunded must end exactly as its model after the units it admitted (at one instant
//! the state depends on their sum alone, and each must fit in the model); any other
//! key is removed after the phase and its model restarts fresh. Always: a cost-0 check
//! is allowed; a refund of a denial, of cost 0 or on another key gives back nothing;
//! the table's counters (admitted, denied, removed, reclaimed, never evicted) agree
//! with what the threads saw; live keys stay within `max_keys`.
//!
//! **Timed phases.** A mixed phase whose `costs[0] % 4` is 3 spans several instants:
//! the threads move the shared clock between their operations (forward, and back, by
//! up to 255 steps of the unit or a 64th of the period, whichever is more; `Refund`
//! and `RefundElsewhere` do so there, never before the start) and each keeps a
//! reading of its own (`Remove` takes one), so that a thread's `at` operations read
//! behind another's later ones, as another core's clock can. Every check, charge and
//! peek passes its reading explicitly, raised to its shard's R (or R's bound), which
//! is the instant it is judged at. There are no refunds, removals or reclamations, so
//! each key's decisions must be *linearisable*: some interleaving of the threads'
//! operations on the key, each thread's in its own order, applied to the key's model
//! at the same readings and costs gives every decision exactly (as the core's
//! transitions promise, being one atomic step each, monotone in their state, for
//! readings in any order: DESIGN.md's Time and Semantics). The search takes every
//! operation that leaves the model as it was (a peek, a denial) as soon as it
//! matches, and branches only on admissions, remembering failed (positions, state)
//! pairs; where it runs past a budget the key goes unjudged (counted in the stats).
//! Afterwards a key that admitted units starts over (the interleavings that match may
//! leave different states); any other must read as its model.
//!
//! Every assertion holds under every interleaving: a failure is a bug, never a race of
//! the target's own.
#![no_main]

#[path = "common/clock.rs"]
mod clock;
#[path = "common/probe.rs"]
mod probe;
#[path = "common/seeds.rs"]
mod seeds;

use arbitrary::Arbitrary;
use clock::AnyClock;
use floodgate::reference::{ExactFixedWindow, ExactGcra, ExactSlidingLog, ExactSlidingWindow};
use floodgate::{
    Algorithm, Clock, Decision, Fingerprint, FixedWindow, Gcra, Heap, Inline, KeyedBuilder,
    KeyedLimiter, KeyedMetrics, KeyedSlidingLog, Nanos, Policy, Receipt, SlidingWindow, Storage,
};
use libfuzzer_sys::fuzz_target;
use std::collections::HashSet;
use std::sync::Barrier;
use std::time::Duration;

/// The table's keys (`0..keys`).
type Key = u16;
/// At most this many phases per input.
const MAX_PHASES: usize = 12;
/// At most this many operations per thread and phase.
const MAX_SLICE: usize = 48;
/// At most this many receipts a thread keeps (the oldest go first).
const MAX_HELD: usize = 32;
/// The table's capacity: far above the keys, so no shard reaches its share and nothing
/// is reclaimed or evicted but by `reclaim_idle` and `remove`.
const CAPACITY: usize = 256;
/// The most nodes a timed phase's linearisation search visits for one key.
const SEARCH_BUDGET: usize = 50_000;
/// Window readings stay within this span of the start: half a year, where an idle
/// key's window index cannot wrap (see VERIFICATION.md).
const WINDOW_SPAN: u64 = 182 * 86_400 * 1_000_000_000;

#[derive(Arbitrary, Clone, Copy, Debug)]
enum Op {
    /// `check_n`; `at`: `check_n_at` at the phase's instant (always, where the shard's
    /// R is only bounded).
    Check {
        key: u8,
        cost: u8,
        at: bool,
    },
    /// `charge` (as `Check`); the receipt joins the thread's own.
    Charge {
        key: u8,
        cost: u8,
        at: bool,
    },
    Peek {
        key: u8,
        cost: u8,
    },
    /// Refunds one of the thread's receipts on its own key (mixed phases only).
    Refund {
        pick: u8,
    },
    /// Refunds one on another key: nothing comes back (mixed phases only).
    RefundElsewhere {
        pick: u8,
        key: u8,
    },
    /// Mixed phases only.
    Remove {
        key: u8,
    },
    ReclaimIdle,
    Yield,
    /// Ends the phase and starts the next.
    Phase(Phase),
}

/// Where a phase starts: the clock's move and how the phase runs.
#[derive(Arbitrary, Clone, Copy, Debug)]
struct Phase {
    /// One cost per key, no removals, no refunds: the outcome is order-independent.
    exact: bool,
    /// The clock moves this many units: forward, or back where `back` (never before
    /// the start).
    step: u16,
    back: bool,
    /// 2, 3 or 4 threads (mod 3).
    threads: u8,
    /// The cost of key `k` in an exact phase: `costs[k % 4]` (see [`cost_of`]); in a
    /// mixed one, `costs[0] % 4 == 3` makes it *timed*.
    costs: [u8; 4],
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// GCRA, token bucket, fixed window, sliding window counter, sliding log (mod 5).
    algorithm: u8,
    /// Heap, inline or fingerprint (mod 3).
    storage: u8,
    /// 1, 2, 4 or 8 shards (mod 4, as the power of two).
    shards: u8,
    /// 1 to 8 keys (mod 8, plus 1).
    keys: u8,
    /// ns, µs or ms (mod 3).
    unit: u8,
    limit: u8,
    period: u16,
    burst: u8,
    offset: u64,
    /// The phases' operations, each phase's dealt to its threads in turn, and the
    /// starts of the phases after the first (a mixed phase of two threads at the start).
    ops: Vec<Op>,
}

/// The phases of `ops` (at most `MAX_PHASES`), each with its threads' slices (each
/// at most `MAX_SLICE` long).
fn phases(ops: &[Op]) -> Vec<(Phase, Vec<Vec<Op>>)> {
    let first = Phase {
        exact: false,
        step: 0,
        back: false,
        threads: 0,
        costs: [1; 4],
    };
    let mut out = vec![(first, Vec::new())];
    for &op in ops {
        if let Op::Phase(next) = op {
            if out.len() == MAX_PHASES {
                break;
            }
            out.push((next, Vec::new()));
        } else {
            out.last_mut().expect("a first phase").1.push(op);
        }
    }
    out.into_iter()
        .map(|(phase, ops)| {
            let threads = 2 + usize::from(phase.threads % 3);
            let mut slices = vec![Vec::new(); threads];
            for (i, op) in ops.into_iter().take(threads * MAX_SLICE).enumerate() {
                slices[i % threads].push(op);
            }
            (phase, slices)
        })
        .collect()
}

/// A cost byte: 0 to 7, or one far beyond any burst (one byte in 32).
fn cost_of(byte: u8) -> u32 {
    if byte >= 0xF8 {
        u32::MAX - u32::from(byte & 7)
    } else {
        u32::from(byte % 8)
    }
}

/// A keyed table of [`Key`] keys: a `KeyedLimiter` or the `KeyedSlidingLog`. `at`:
/// an explicit reading, else the table's clock.
trait Table: Sync {
    fn check(&self, key: Key, at: Option<Nanos>, cost: u32) -> Decision;
    fn charge(&self, key: Key, at: Option<Nanos>, cost: u32) -> (Decision, Receipt);
    fn peek(&self, key: Key, at: Option<Nanos>, cost: u32) -> Decision;
    fn refund(&self, key: Key, receipt: Receipt) -> bool;
    fn remove(&self, key: Key) -> bool;
    /// Reclaims every idle key now (the log has no such call: `None`).
    fn reclaim_idle(&self) -> Option<usize>;
    /// The table's metrics and `max_keys`.
    fn counters(&self) -> (KeyedMetrics, usize);
}

/// The `Table` methods both tables have under the same names (their own, inherent
/// methods, which a path through `Self` finds before the trait's).
macro_rules! table_methods {
    () => {
        fn check(&self, key: Key, at: Option<Nanos>, cost: u32) -> Decision {
            match at {
                Some(at) => Self::check_n_at(self, &key, at, cost),
                None => Self::check_n(self, &key, cost),
            }
        }
        fn charge(&self, key: Key, at: Option<Nanos>, cost: u32) -> (Decision, Receipt) {
            match at {
                Some(at) => Self::charge_at(self, &key, at, cost),
                None => Self::charge(self, &key, cost),
            }
        }
        fn peek(&self, key: Key, at: Option<Nanos>, cost: u32) -> Decision {
            match at {
                Some(at) => Self::peek_at(self, &key, at, cost),
                None => Self::peek(self, &key, cost),
            }
        }
        fn remove(&self, key: Key) -> bool {
            Self::remove(self, &key)
        }
        fn counters(&self) -> (KeyedMetrics, usize) {
            (Self::metrics(self), Self::max_keys(self))
        }
        fn refund(&self, key: Key, receipt: Receipt) -> bool {
            Self::refund(self, &key, receipt)
        }
    };
}

impl<A: Algorithm, S: Storage<Key, A::State>> Table for KeyedLimiter<Key, A, AnyClock, S>
where
    Self: Sync,
{
    table_methods!();
    fn reclaim_idle(&self) -> Option<usize> {
        Some(Self::reclaim_idle(self))
    }
}

impl Table for KeyedSlidingLog<Key, AnyClock> {
    table_methods!();
    fn reclaim_idle(&self) -> Option<usize> {
        None
    }
}

/// One key's exact reference model.
#[derive(Clone, Debug)]
enum Model {
    Gcra(ExactGcra),
    Fixed(ExactFixedWindow),
    Sliding(ExactSlidingWindow),
    Log(ExactSlidingLog),
}

impl Model {
    fn check(&mut self, at: u64, cost: u32) -> Decision {
        match self {
            Model::Gcra(m) => m.check(at, cost),
            Model::Fixed(m) => m.check(at, cost),
            Model::Sliding(m) => m.check(at, cost),
            Model::Log(m) => m.check(at, cost),
        }
    }

    fn peek(&self, at: u64, cost: u32) -> Decision {
        match self {
            Model::Gcra(m) => m.peek(at, cost),
            Model::Fixed(m) => m.peek(at, cost),
            Model::Sliding(m) => m.peek(at, cost),
            Model::Log(m) => m.peek(at, cost),
        }
    }
}

/// The most units one decision admits (up to `most`), read through `peek`: a
/// binary search, every algorithm admitting a cost exactly when it admits every
/// smaller one (the sliding log's model clones its log per peek).
fn headroom(peek: impl Fn(u32) -> Decision, most: u32) -> u64 {
    // Admitted at `low` (cost 0 always is), refused above `high`.
    let (mut low, mut high) = (0, most);
    while low < high {
        let mid = low + (high - low).div_ceil(2);
        if peek(mid).is_allowed() {
            low = mid;
        } else {
            high = mid - 1;
        }
    }
    u64::from(low)
}

/// What one run needs besides the table.
struct Setup {
    keys: usize,
    unit: u64,
    start: u64,
    /// The latest instant the clock may reach (window readings: half a year on).
    end: u64,
    /// A fresh key's model.
    fresh: Model,
    /// Above any cost one decision can admit (`max(L, B) + 1`).
    most: u32,
    /// A timed phase's clock step: the unit, or a 64th of the period where that is
    /// more (255 steps span about 4 periods: moves cross windows and drain buckets).
    step: u64,
    shards: usize,
}

fuzz_target!(|input: Input| {
    seeds::fix_hash_seeds();
    let unit = [1, 1_000, 1_000_000][usize::from(input.unit % 3)];
    let period = Duration::from_nanos(u64::from(input.period) * unit);
    let Ok(rate) = Policy::new(u64::from(input.limit), period) else {
        return;
    };
    let Ok(bursty) = rate.with_burst(u64::from(input.burst)) else {
        return;
    };
    let start = 100_000_000_000 + input.offset % (1 << 40);
    let (p, l) = (rate.period_nanos(), rate.limit());
    let mut setup = Setup {
        keys: usize::from(input.keys % 8) + 1,
        unit,
        start,
        end: start.saturating_add(WINDOW_SPAN),
        fresh: Model::Log(ExactSlidingLog::new(l, p).expect("a valid policy")),
        most: u32::try_from(l.max(bursty.burst()) + 1).expect("u8 limits"),
        step: unit.max(p / 64),
        shards: 1 << (input.shards % 4),
    };
    let shards = setup.shards;
    match input.algorithm % 5 {
        algorithm @ (0 | 1) => {
            let gcra = if algorithm == 0 {
                Gcra::new(bursty)
            } else {
                let Ok(bucket) = Gcra::token_bucket(u64::from(input.burst), l, period) else {
                    return;
                };
                bucket
            };
            let b = bursty.burst();
            setup.end = u64::MAX >> 2;
            setup.fresh = Model::Gcra(ExactGcra::new(l, p, b).expect("a valid policy"));
            on_storage(gcra, &input, &setup, shards);
        }
        2 => {
            let Ok(window) = FixedWindow::new(rate) else {
                return;
            };
            setup.fresh = Model::Fixed(ExactFixedWindow::new(l, p).expect("a valid policy"));
            on_storage(window, &input, &setup, shards);
        }
        3 => {
            let Ok(window) = SlidingWindow::new(rate) else {
                return;
            };
            setup.fresh = Model::Sliding(ExactSlidingWindow::new(l, p).expect("a valid policy"));
            on_storage(window, &input, &setup, shards);
        }
        _ => {
            let clock = AnyClock::default();
            let Ok(table) = KeyedBuilder::default()
                .capacity(CAPACITY)
                .shards(shards)
                .clock(clock.clone())
                .sliding_log::<Key>(rate)
            else {
                return;
            };
            run(&table, &clock, &input, &setup);
        }
    }
});

fn on_storage<A>(algorithm: A, input: &Input, setup: &Setup, shards: usize)
where
    A: Algorithm + Send + Sync,
    Heap: Storage<Key, A::State>,
    Inline: Storage<Key, A::State>,
    Fingerprint: Storage<Key, A::State>,
{
    match input.storage % 3 {
        0 => keyed::<A, Heap>(algorithm, input, setup, shards),
        1 => keyed::<A, Inline>(algorithm, input, setup, shards),
        _ => keyed::<A, Fingerprint>(algorithm, input, setup, shards),
    }
}

fn keyed<A, S>(algorithm: A, input: &Input, setup: &Setup, shards: usize)
where
    A: Algorithm + Send + Sync,
    S: Storage<Key, A::State>,
    KeyedLimiter<Key, A, AnyClock, S>: Sync,
{
    let clock = AnyClock::default();
    let Ok(table) = KeyedBuilder::new(algorithm)
        .capacity(CAPACITY)
        .shards(shards)
        .clock(clock.clone())
        .build_in::<Key, S>()
    else {
        return;
    };
    let table: KeyedLimiter<Key, A, AnyClock, S> = table;
    run(&table, &clock, input, setup);
}

/// The keys' shards as the target knows them: a class per shard met, and per class
/// what is known of its latest removal R.
struct Classes {
    of: Vec<usize>,
    /// A lower bound of the shard's R (R itself where it equals `most`).
    known: Vec<u64>,
    /// An upper bound of the shard's R.
    most: Vec<u64>,
    /// The latest phase whose receipts a removal the shard is known to have made
    /// after it voids.
    voided_after: Vec<Option<usize>>,
}

impl Classes {
    /// Learns the classes of the keys `0..keys` through the public API, with the clock
    /// at the probe's instants `1..=keys` ns (`common/probe.rs`).
    fn probe<T: Table>(table: &T, clock: &AnyClock, keys: usize, shards: usize) -> Self {
        let mut of: Vec<usize> = Vec::new();
        let mut known: Vec<Nanos> = Vec::new();
        for i in 0..keys {
            let key = Key::try_from(i).expect("at most 8 keys");
            let at = Nanos::new(i as u64 + 1);
            clock.set(at);
            let class = probe::probe_key(
                key,
                at,
                || table.charge(key, Some(Nanos::ZERO), 1),
                || table.remove(key),
                &mut known,
                |j| of[j],
            );
            of.push(class);
        }
        assert!(
            known.len() <= shards,
            "probe: {} classes of keys over {shards} shards",
            known.len()
        );
        let known: Vec<u64> = known.iter().map(|t| t.as_u64()).collect();
        Classes {
            of,
            most: known.clone(),
            voided_after: vec![None; known.len()],
            known,
        }
    }

    /// The instant every decision on `key` is judged at while the clock stands at
    /// `t`, and whether the threads must read it explicitly (R only bounded, and the
    /// bound past `t`).
    fn judged(&self, key: usize, t: u64) -> (u64, bool) {
        let c = self.of[key];
        if self.known[c] < self.most[c] && t < self.most[c] {
            (self.most[c], true)
        } else {
            (t.max(self.known[c]), false)
        }
    }

    /// A removal made in `class` with the clock at `t` (judged at `max(t, R)`), after
    /// every charge of the phases up to `voids` (whose receipts it voids).
    fn removed(&mut self, class: usize, t: u64, voids: Option<usize>) {
        self.known[class] = self.known[class].max(t);
        self.most[class] = self.most[class].max(t);
        self.voided_after[class] = self.voided_after[class].max(voids);
    }

    /// A removal that may have been made in `class` with the clock at `t`.
    fn maybe_removed(&mut self, class: usize, t: u64) {
        self.most[class] = self.most[class].max(t);
    }
}

/// How a phase decides one key: at which instant, whether the threads read it
/// explicitly, (exact phases) its one cost, and the latest phase whose receipts a
/// removal its shard is known to have made since voids.
#[derive(Clone, Copy, Debug)]
struct KeyPlan {
    at: u64,
    explicit: bool,
    cost: Option<u32>,
    voided_after: Option<usize>,
    /// The phase's index.
    phase: usize,
}

/// A timed phase's clock: the span it moves in and its step (a move is `pick` steps).
#[derive(Clone, Copy, Debug)]
struct Timed {
    lo: u64,
    hi: u64,
    step: u64,
}

impl Timed {
    /// Whether `phase` is timed (see [`Phase::costs`]).
    fn of(phase: &Phase) -> bool {
        !phase.exact && phase.costs[0] % 4 == 3
    }
}

/// A receipt a thread keeps: its key, what it charged, whether that was admitted,
/// and the phase it was taken in.
struct Held {
    key: Key,
    cost: u32,
    allowed: bool,
    receipt: Receipt,
    phase: usize,
}

/// What a thread saw.
#[derive(Clone, Debug)]
enum Event {
    /// A check or a charge.
    Decided {
        key: Key,
        cost: u32,
        got: Decision,
    },
    Peeked {
        key: Key,
        cost: u32,
        got: Decision,
    },
    /// A refund on the receipt's own key, of a charge of `cost` units.
    Refunded {
        key: Key,
        cost: u32,
        back: bool,
    },
    Removed {
        key: Key,
        present: bool,
    },
    Reclaimed(usize),
    /// A timed phase's check, charge (`write`) or peek at an explicit reading.
    Accessed {
        key: Key,
        access: Access,
    },
}

/// One operation of a timed phase on a key: the reading it passed (the instant it is
/// judged at), its cost, whether it writes (a check or charge) and what it got.
#[derive(Clone, Copy, Debug)]
struct Access {
    at: u64,
    cost: u32,
    write: bool,
    got: Decision,
}

/// A charge whose receipt joins the thread's own (the oldest going first).
fn charge<T: Table>(
    table: &T,
    held: &mut Vec<Held>,
    key: Key,
    at: Option<Nanos>,
    cost: u32,
    phase: usize,
) -> Decision {
    let (got, receipt) = table.charge(key, at, cost);
    if held.len() == MAX_HELD {
        held.remove(0);
    }
    held.push(Held {
        key,
        cost,
        allowed: got.is_allowed(),
        receipt,
        phase,
    });
    got
}

/// One thread's slice of a phase.
fn worker<T: Table>(
    table: &T,
    ops: &[Op],
    plans: &[KeyPlan],
    held: &mut Vec<Held>,
    barrier: &Barrier,
    timed: Option<(&AnyClock, Timed)>,
) -> Vec<Event> {
    if let Some((clock, timed)) = timed {
        return timed_worker(table, ops, plans, held, barrier, clock, timed);
    }
    let exact = plans[0].cost.is_some();
    let keys = plans.len();
    let key_of = |byte: u8| usize::from(byte) % keys;
    let reading = |k: usize, at: bool| {
        let plan = plans[k];
        (plan.explicit || at).then_some(Nanos::new(plan.at))
    };
    let mut seen = Vec::with_capacity(ops.len());
    barrier.wait();
    for op in ops {
        match *op {
            Op::Check { key, cost, at } | Op::Charge { key, cost, at } => {
                let k = key_of(key);
                let cost = plans[k].cost.unwrap_or_else(|| cost_of(cost));
                let key = k as Key;
                let got = if let Op::Charge { .. } = op {
                    charge(table, held, key, reading(k, at), cost, plans[k].phase)
                } else {
                    table.check(key, reading(k, at), cost)
                };
                assert!(
                    cost > 0 || got.is_allowed(),
                    "key {key}: a check of cost 0 refused: {got:?}"
                );
                seen.push(Event::Decided { key, cost, got });
            }
            Op::Peek { key, cost } => {
                let k = key_of(key);
                let cost = cost_of(cost);
                let got = table.peek(k as Key, reading(k, false), cost);
                seen.push(Event::Peeked {
                    key: k as Key,
                    cost,
                    got,
                });
            }
            Op::Refund { pick } if !exact && !held.is_empty() => {
                let h = held.swap_remove(usize::from(pick) % held.len());
                let back = table.refund(h.key, h.receipt);
                assert!(
                    !back || (h.allowed && h.cost > 0),
                    "key {}: a refund of a denial or of cost 0 gave back (cost {})",
                    h.key,
                    h.cost
                );
                let void = plans[usize::from(h.key)]
                    .voided_after
                    .is_some_and(|q| q >= h.phase);
                assert!(
                    !(back && void),
                    "key {}: a receipt of phase {} gave back after a removal in its shard \
                     (after phase {:?})",
                    h.key,
                    h.phase,
                    plans[usize::from(h.key)].voided_after
                );
                seen.push(Event::Refunded {
                    key: h.key,
                    cost: h.cost,
                    back,
                });
            }
            Op::RefundElsewhere { pick, key } if !exact && !held.is_empty() && keys > 1 => {
                let h = held.swap_remove(usize::from(pick) % held.len());
                let mut other = key_of(key) as Key;
                if other == h.key {
                    other = (other + 1) % keys as Key;
                }
                assert!(
                    !table.refund(other, h.receipt),
                    "a receipt of key {} gave back on key {other}",
                    h.key
                );
            }
            Op::Remove { key } if !exact => {
                let key = key_of(key) as Key;
                let present = table.remove(key);
                seen.push(Event::Removed { key, present });
            }
            Op::ReclaimIdle => {
                if let Some(n) = table.reclaim_idle() {
                    seen.push(Event::Reclaimed(n));
                }
            }
            Op::Yield | Op::Refund { .. } | Op::RefundElsewhere { .. } | Op::Remove { .. } => {
                std::thread::yield_now();
            }
            Op::Phase(_) => unreachable!("phases are split"),
        }
    }
    seen
}

/// One thread's slice of a timed phase: checks, charges and peeks at explicit
/// readings (a fresh one of the clock, or with `at` the thread's own, older one),
/// each raised to its key's `plan.at` (its shard's R or R's bound); the clock moved
/// forward (`Refund`) or back (`RefundElsewhere`) by `pick` steps within the span; a
/// new reading of its own taken (`Remove`).
#[allow(clippy::too_many_arguments)]
fn timed_worker<T: Table>(
    table: &T,
    ops: &[Op],
    plans: &[KeyPlan],
    held: &mut Vec<Held>,
    barrier: &Barrier,
    clock: &AnyClock,
    timed: Timed,
) -> Vec<Event> {
    let keys = plans.len();
    let key_of = |byte: u8| usize::from(byte) % keys;
    let mut mine = clock.now().as_u64();
    let mut seen = Vec::with_capacity(ops.len());
    barrier.wait();
    for op in ops {
        match *op {
            Op::Check { key, cost, .. } | Op::Charge { key, cost, .. } | Op::Peek { key, cost } => {
                let k = key_of(key);
                let at = matches!(op, Op::Check { at: true, .. } | Op::Charge { at: true, .. });
                let reading = if at { mine } else { clock.now().as_u64() };
                let reading = reading.max(plans[k].at);
                let (cost, key, when) = (cost_of(cost), k as Key, Some(Nanos::new(reading)));
                let (got, write) = match op {
                    Op::Charge { .. } => {
                        (charge(table, held, key, when, cost, plans[k].phase), true)
                    }
                    Op::Check { .. } => (table.check(key, when, cost), true),
                    _ => (table.peek(key, when, cost), false),
                };
                assert!(
                    !write || cost > 0 || got.is_allowed(),
                    "key {key}: a check of cost 0 refused: {got:?}"
                );
                if write {
                    seen.push(Event::Decided { key, cost, got });
                }
                let access = Access {
                    at: reading,
                    cost,
                    write,
                    got,
                };
                seen.push(Event::Accessed { key, access });
            }
            Op::Refund { pick } | Op::RefundElsewhere { pick, .. } => {
                let step = u64::from(pick) * timed.step;
                let now = clock.now().as_u64();
                let next = if let Op::Refund { .. } = op {
                    now.saturating_add(step).min(timed.hi)
                } else {
                    now.saturating_sub(step).max(timed.lo)
                };
                clock.set(Nanos::new(next));
            }
            Op::Remove { .. } => mine = clock.now().as_u64(),
            Op::ReclaimIdle | Op::Yield => std::thread::yield_now(),
            Op::Phase(_) => unreachable!("phases are split"),
        }
    }
    seen
}

/// Whether some interleaving of `threads` (each in its own order) applied to `model`
/// gives every access its decision; `None` where the search ran past its budget.
/// An access that leaves the model as it was (a peek, a denial, cost 0) is taken as
/// soon as it matches: whatever order worked with it later works with it now.
fn linearisable(model: &Model, threads: &[Vec<Access>]) -> Option<bool> {
    fn apply(model: &mut Model, a: &Access) -> bool {
        let got = if a.write {
            model.check(a.at, a.cost)
        } else {
            model.peek(a.at, a.cost)
        };
        got == a.got
    }
    fn search(
        model: &Model,
        threads: &[Vec<Access>],
        pos: &mut Vec<usize>,
        failed: &mut HashSet<(Vec<usize>, String)>,
        budget: &mut usize,
    ) -> Option<bool> {
        let start = pos.clone();
        // Take every access that matches and leaves the state as it was.
        loop {
            let mut took = false;
            for t in 0..threads.len() {
                // A peek, a denial or cost 0 writes nothing, in the models too.
                while let Some(a) = threads[t]
                    .get(pos[t])
                    .filter(|a| !(a.write && a.cost > 0 && a.got.is_allowed()))
                {
                    if !apply(&mut model.clone(), a) {
                        break;
                    }
                    pos[t] += 1;
                    took = true;
                }
            }
            if !took {
                break;
            }
        }
        let result = 'node: {
            if (0..threads.len()).all(|t| pos[t] == threads[t].len()) {
                break 'node Some(true);
            }
            let key = (pos.clone(), format!("{model:?}"));
            if failed.contains(&key) {
                break 'node Some(false);
            }
            if *budget == 0 {
                break 'node None;
            }
            *budget -= 1;
            let mut unknown = false;
            for t in 0..threads.len() {
                let Some(a) = threads[t].get(pos[t]) else {
                    continue;
                };
                let mut next = model.clone();
                if !apply(&mut next, a) {
                    continue;
                }
                pos[t] += 1;
                let found = search(&next, threads, pos, failed, budget);
                pos[t] -= 1;
                match found {
                    Some(true) => break 'node Some(true),
                    None => unknown = true,
                    Some(false) => {}
                }
            }
            if unknown {
                None
            } else {
                failed.insert(key);
                Some(false)
            }
        };
        *pos = start;
        result
    }
    let mut budget = SEARCH_BUDGET;
    search(
        model,
        threads,
        &mut vec![0; threads.len()],
        &mut HashSet::new(),
        &mut budget,
    )
}

fn run<T: Table>(table: &T, clock: &AnyClock, input: &Input, setup: &Setup) {
    let mut classes = Classes::probe(table, clock, setup.keys, setup.shards);
    let mut now = setup.start;
    let mut models = vec![setup.fresh.clone(); setup.keys];
    let mut held: Vec<Vec<Held>> = (0..4).map(|_| Vec::new()).collect();
    // For the stats: exact and mixed phases, phases with a key read explicitly past
    // the clock, and what the threads saw.
    // Timed phases, and keys a timed phase left unjudged (the search's budget).
    let mut stats = [0u64; 3];
    let mut timed_stats = [0u64; 2];
    // `THREADED_TIMED=1`: every phase after the first is timed, so that only the timed
    // phases' oracle judges what they do (as when showing it catches a mutant).
    let all_timed = std::env::var_os("THREADED_TIMED").is_some();
    let mut events = [0u64; 5];
    for (index, (phase, slices)) in phases(&input.ops).into_iter().enumerate() {
        let step = u64::from(phase.step) * setup.unit;
        now = if phase.back {
            now.saturating_sub(step).max(setup.start)
        } else {
            now.saturating_add(step).min(setup.end)
        };
        clock.set(Nanos::new(now));
        let timed = (Timed::of(&phase) || all_timed && index > 0).then_some(Timed {
            lo: setup.start,
            hi: setup.end,
            step: setup.step,
        });
        let plans: Vec<KeyPlan> = (0..setup.keys)
            .map(|k| {
                let (at, explicit) = if timed.is_some() {
                    // The readings' floor: R's bound, every reading at or past it is
                    // judged where it reads.
                    (classes.most[classes.of[k]], true)
                } else {
                    classes.judged(k, now)
                };
                let cost = phase.exact.then(|| cost_of(phase.costs[k % 4]));
                KeyPlan {
                    at,
                    explicit,
                    cost,
                    voided_after: classes.voided_after[classes.of[k]],
                    phase: index,
                }
            })
            .collect();
        let (before, _) = table.counters();
        let barrier = Barrier::new(slices.len());
        let per_thread: Vec<Vec<Event>> = std::thread::scope(|s| {
            let handles: Vec<_> = held
                .iter_mut()
                .zip(&slices)
                .map(|(held, ops)| {
                    let (plans, barrier) = (&plans, &barrier);
                    let timed = timed.map(|t| (clock, t));
                    s.spawn(move || worker(table, ops, plans, held, barrier, timed))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a worker panicked"))
                .collect()
        });
        let began = now;
        if timed.is_some() {
            // The threads moved the clock: the phase ends where they left it.
            now = clock.now().as_u64().clamp(setup.start, setup.end);
            clock.set(Nanos::new(now));
            timed_stats[0] += 1;
        }
        let seen: Vec<Event> = per_thread.iter().flatten().cloned().collect();
        counters(table, &before, &seen);
        stats[usize::from(!phase.exact)] += 1;
        stats[2] += u64::from(plans.iter().any(|p| p.explicit));
        for e in &seen {
            let i = match e {
                Event::Decided { got, .. } => usize::from(!got.is_allowed()),
                Event::Refunded { back: true, .. } => 2,
                Event::Removed { present: true, .. } => 3,
                Event::Reclaimed(n) if *n > 0 => 4,
                _ => continue,
            };
            events[i] += 1;
        }
        let mut dirty = Vec::new();
        for (k, plan) in plans.iter().enumerate() {
            let key = k as Key;
            let model = &mut models[k];
            if timed.is_some() {
                let accesses: Vec<Vec<Access>> = per_thread
                    .iter()
                    .map(|events| {
                        events
                            .iter()
                            .filter_map(|e| match *e {
                                Event::Accessed { key: k, access } if k == key => Some(access),
                                _ => None,
                            })
                            .collect()
                    })
                    .collect();
                match linearisable(model, &accesses) {
                    Some(true) => {}
                    Some(false) => panic!(
                        "key {key}: no interleaving of the threads' accesses gives their \
                         decisions from the model {model:?}: {accesses:#?}"
                    ),
                    None => timed_stats[1] += 1,
                }
                let wrote = accesses
                    .iter()
                    .flatten()
                    .any(|a| a.write && a.cost > 0 && a.got.is_allowed());
                if wrote {
                    dirty.push(key);
                } else {
                    // Nothing admitted: the key reads as its model, where the phase began.
                    let at = began.max(plan.at);
                    same(table, key, &KeyPlan { at, ..*plan }, model, 1);
                }
            } else if plan.cost.is_some() {
                exact(table, key, plan, model, &seen);
            } else if !mixed(table, key, plan, model, &seen, setup) {
                dirty.push(key);
            }
        }
        // Removals shift their shards' R (all judged at `max(now, R)`).
        for e in &seen {
            if let Event::Removed { key, present: true } = *e {
                classes.removed(classes.of[usize::from(key)], now, index.checked_sub(1));
            }
        }
        let reclaimed: usize = seen
            .iter()
            .map(|e| match e {
                Event::Reclaimed(n) => *n,
                _ => 0,
            })
            .sum();
        if reclaimed > 0 {
            let n = classes.known.len();
            for c in 0..n {
                if n == 1 {
                    classes.removed(c, now, index.checked_sub(1));
                } else {
                    classes.maybe_removed(c, now);
                }
            }
        }
        // A key whose state depends on the order starts over, in the table and the model.
        for key in dirty {
            if table.remove(key) {
                classes.removed(classes.of[usize::from(key)], now, Some(index));
            }
            models[usize::from(key)] = setup.fresh.clone();
        }
    }
    if std::env::var_os("THREADED_STATS").is_some() {
        // What a corpus reaches: `THREADED_STATS=1 threaded -runs=0 corpus/threaded`.
        eprintln!(
            "stats: algorithm {} storage {} keys {} classes {} phases exact/mixed/explicit \
             {stats:?} admitted/denied/refunded/removed/reclaims {events:?} \
             timed/unjudged keys {timed_stats:?}",
            input.algorithm % 5,
            input.storage % 3,
            setup.keys,
            classes.known.len(),
        );
    }
}

/// The table's counters against what the threads saw.
fn counters<T: Table>(table: &T, before: &KeyedMetrics, seen: &[Event]) {
    let (after, max_keys) = table.counters();
    let (mut allowed, mut denied, mut removed, mut reclaimed) = (0u64, 0u64, 0u64, 0u64);
    for e in seen {
        match *e {
            Event::Decided { got, .. } if got.is_allowed() => allowed += 1,
            Event::Decided { .. } => denied += 1,
            Event::Removed { present: true, .. } => removed += 1,
            Event::Reclaimed(n) => reclaimed += n as u64,
            _ => {}
        }
    }
    let moved = (
        after.allowed - before.allowed,
        after.denied - before.denied,
        after.removed - before.removed,
        after.reclaimed - before.reclaimed,
        after.evicted - before.evicted,
    );
    assert_eq!(
        moved,
        (allowed, denied, removed, reclaimed, 0),
        "counters (allowed, denied, removed, reclaimed, evicted): {before:?} -> {after:?}"
    );
    assert!(after.live_keys as usize <= max_keys, "{after:?}");
}

/// Decisions with their costs.
type Costed = Vec<(u32, Decision)>;

/// The decisions the threads saw for `key`: those of its checks and charges, and of
/// its peeks.
fn decisions(key: Key, seen: &[Event]) -> (Costed, Costed) {
    let (mut decided, mut peeked) = (Vec::new(), Vec::new());
    for e in seen {
        match *e {
            Event::Decided { key: k, cost, got } if k == key => decided.push((cost, got)),
            Event::Peeked { key: k, cost, got } if k == key => peeked.push((cost, got)),
            _ => {}
        }
    }
    (decided, peeked)
}

/// An exact phase's key: the model, run sequentially over as many requests of the
/// key's one cost, gives the same decisions as a multiset; every peek and cost-0 check
/// is the view of one state it passed; the key ends as the model.
fn exact<T: Table>(table: &T, key: Key, plan: &KeyPlan, model: &mut Model, seen: &[Event]) {
    let (at, cost) = (plan.at, plan.cost.expect("an exact phase"));
    let (decided, peeked) = decisions(key, seen);
    let mut states = vec![model.clone()];
    let (mut admitted, mut denial) = (Vec::new(), None);
    for _ in &decided {
        let d = model.check(at, cost);
        if d.is_allowed() {
            admitted.push(d);
            states.push(model.clone());
        } else {
            denial = Some(d);
        }
    }
    let mut got_admitted = 0;
    for (_, got) in &decided {
        if got.is_allowed() {
            got_admitted += 1;
            let i = admitted.iter().position(|d| d == got).unwrap_or_else(|| {
                panic!("key {key} at {at}, cost {cost}: admitted {got:?}, not one of the model's {admitted:?}")
            });
            let _taken = admitted.swap_remove(i);
        } else {
            assert_eq!(
                Some(*got),
                denial,
                "key {key} at {at}, cost {cost}: denial vs the model's"
            );
        }
    }
    assert!(
        admitted.is_empty(),
        "key {key} at {at}, cost {cost}: {got_admitted} admitted, the model admits also {admitted:?}"
    );
    let views = peeked.iter().copied().chain(
        decided
            .iter()
            .copied()
            .filter(|&(c, _)| c == 0 && cost == 0),
    );
    for (c, got) in views {
        assert!(
            states.iter().any(|s| s.peek(at, c) == got),
            "key {key} at {at}: peek of {c} read {got:?}, no state the model passed"
        );
    }
    same(table, key, plan, model, cost);
}

/// A mixed phase's key: the bound on what it admitted and kept; where nothing was
/// removed or refunded, the model catches up with the units admitted and the key reads
/// as it. Returns whether the model follows the key (else it must start over).
fn mixed<T: Table>(
    table: &T,
    key: Key,
    plan: &KeyPlan,
    model: &mut Model,
    seen: &[Event],
    setup: &Setup,
) -> bool {
    let at = plan.at;
    let (decided, _) = decisions(key, seen);
    let admitted: Vec<u32> = decided
        .iter()
        .filter(|(_, d)| d.is_allowed())
        .map(|&(c, _)| c)
        .collect();
    let units: u64 = admitted.iter().map(|&c| u64::from(c)).sum();
    let (mut removals, mut refunded) = (0u64, 0u64);
    for e in seen {
        match *e {
            Event::Removed {
                key: k,
                present: true,
            } if k == key => removals += 1,
            Event::Refunded {
                key: k,
                cost,
                back: true,
            } if k == key => {
                refunded += u64::from(cost);
            }
            _ => {}
        }
    }
    let start = headroom(|n| model.peek(at, n), setup.most);
    let fresh = headroom(|n| setup.fresh.peek(at, n), setup.most);
    let explicit = plan.explicit.then_some(Nanos::new(at));
    let left = headroom(|n| table.peek(key, explicit, n), setup.most);
    assert!(
        units + left <= start + removals * fresh + refunded,
        "key {key} at {at}: admitted {units} ({admitted:?}) and kept {left}, from {start} \
         with {removals} removals (fresh {fresh}) and {refunded} refunded"
    );
    if removals > 0 || refunded > 0 {
        return false;
    }
    for &c in &admitted {
        let d = model.check(at, c);
        assert!(
            d.is_allowed(),
            "key {key} at {at}: the table admitted {admitted:?}, the model refuses {c} of them: {d:?}"
        );
    }
    same(table, key, plan, model, 1);
    true
}

/// The key reads as its model at the phase's instant (peeks of 0, 1, `cost` and the
/// model's headroom and one more).
fn same<T: Table>(table: &T, key: Key, plan: &KeyPlan, model: &Model, cost: u32) {
    let at = plan.at;
    let room = headroom(|n| model.peek(at, n), 1 << 10) as u32;
    for c in [0, 1, cost, room, room + 1] {
        let got = table.peek(key, Some(Nanos::new(at)), c);
        let want = model.peek(at, c);
        assert_eq!(
            got, want,
            "key {key} at {at}: a peek of {c} after the phase"
        );
    }
}
