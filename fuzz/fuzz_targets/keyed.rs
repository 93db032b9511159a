//! The keyed tables against an unbounded map of un-keyed limiters — the oracle of
//! "never admit beyond a limit": arbitrary checks and charges (also at readings
//! earlier and later than the clock, across removals), peeks, refunds, removals, clock
//! moves (forward, and back: the clock is the target's, `common/clock.rs`) and
//! explicit reclamation over a small-capacity table, so that inserts, automatic
//! reclamation and eviction all happen. Input bytes pick:
//!
//! * the algorithm: GCRA, the fixed window or the sliding window counter on a
//!   `KeyedLimiter`, or the `KeyedSlidingLog`; its twin, one `RateLimiter` (or
//!   `SlidingLog`) per key, is the model;
//! * the storage of a `KeyedLimiter`: `Heap`, `Inline` or `Fingerprint`;
//! * 1, 2, 4 or 8 shards;
//! * the keys: operations name `u8` keys, and a flood checks up to 255 keys from its
//!   first on (so up to 510, the table's keys are `u16`): enough for every shard of an
//!   8-shard table to pass its share plus headroom and evict;
//! * the time unit (ns, µs or ms) of the period, the clock moves and the stale
//!   readings, and where the clock starts: 100 s on, near the top of `u64`, a few
//!   periods before a window index wraps (modulo `2^k`), or anywhere. Window readings
//!   stay within half a year of the start, where an idle key never sees its index wrap.
//!
//! **Shards.** Every decision of a shard is judged at `max(reading, R)`, R the latest
//! instant that shard removed a key at. Which shard a key is in is not public, so the
//! target learns it through the public API before the run: at instant `i` it charges
//! the `i`-th key at reading 0, which the table judges at its shard's R — the instant
//! the previous key of that shard was probed at, or 0 — and then removes it (R of that
//! shard becomes `i`). The probe asserts that this yields at most as many classes as
//! shards and that each judged instant is its class's latest removal. Then the model
//! keeps R per class: a removal made by an insert is in the inserting key's shard at
//! the instant the insert was judged at; `remove(key)` in the key's shard at the
//! clock's reading; `reclaim_idle` in the shards of the keys that may be idle — where
//! more than one class may have removed, R is known only to lie between its last
//! known value and the clock, and later readings of those classes are raised to the
//! clock's reading of then (where every possible R gives the same judgment). The
//! hash seeds are fixed (`common/seeds.rs`), so a multi-shard failure reproduces from
//! its input. Readings ahead of the clock (one in sixteen of those with a `back`) and
//! clock steps back make R pass the clock: an insert read ahead removes keys at its
//! reading, and a removal or reclamation at a clock stepped back leaves R ahead of it.
//! Every decision, peek and comparison is then judged at `max(reading, R)`, and
//! `reclaim_idle` may take a key idle at `max(clock, R)`.
//!
//! **Oracles.** Every decision of a tracked key equals its model's at `max(reading,
//! R)`, and a peek equals the check that follows it, for every key. An admission's
//! receipt says it was judged at that instant. After every operation every tracked key
//! is compared through peeks of 0 units (what is left) and 1 unit (where an admission
//! would count) now and at its class's R: equal, except keys a live eviction in that
//! very operation dropped (in the inserting key's shard), which must read as fresh.
//! On the lock-free table the victim was the lightest of a sample of 8 of its shard:
//! at most `present − 8` live keys of its class forgave less (`present`: the keys of
//! the class that have a model; units in use, then `reset_after`). The log's eviction
//! is run beside it as its docs specify ([`LogShadow`]: sweeps, rankings by units then
//! the newest unit's instant then hash order from the hand, keys charged since passed
//! over): each insert's idle drops and eviction, each `remove`'s answer and the keys
//! held must be the shadow's; and a key evicted live must meet the contract itself —
//! among the lightest eighth of its shard's last sweep, no heavier now than then, and
//! no key that sweep ranked before it still held without having been charged since
//! (so no key at its limit goes while a lighter ranked key, uncharged, stays).
//! `reclaim_idle` removes no more keys than may be idle. Refunds are made only where
//! the refund guarantee's premise holds: judged (at `max(clock, R)`, R known) no
//! earlier than every decision of the key's shard; a receipt waits otherwise. A
//! receipt taken before a known removal in its shard gives back nothing; on the windows
//! and the log a refund equals the model's; on GCRA (whose refund ledger is per shard,
//! not per key) it never leaves the table more permissive than the model, and a key
//! whose refund differs leaves the comparison. The admissions each key still holds
//! (since its last removal) meet their algorithm's bound whatever the model says
//! (`common/bounds.rs`): GCRA's conform replayed at their judged instants, no fixed
//! window holds more than `L`, the sliding counter's estimate stays within `L`, no
//! span of `P` of the log holds more than `L`. Live keys never exceed `max_keys`.
#![no_main]

#[path = "common/bounds.rs"]
mod bounds;
#[path = "common/clock.rs"]
mod clock;
#[path = "common/probe.rs"]
mod probe;
#[path = "common/seeds.rs"]
mod seeds;

use arbitrary::Arbitrary;
use bounds::{Kind, Oracle};
use clock::AnyClock;
use floodgate::keyed::composite::Limit;
use floodgate::{
    Algorithm, Clock, Decision, Fingerprint, FixedWindow, Gcra, Heap, Inline, KeyedBuilder,
    KeyedLimiter, KeyedMetrics, KeyedSlidingLog, Nanos, Policy, RateLimiter, Receipt, SlidingLog,
    SlidingWindow, Storage,
};
use libfuzzer_sys::fuzz_target;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

/// At most this many operations per input, floods expanded (each compares every key).
const MAX_OPS: usize = 1024;
/// Window readings stay within this span of the start: half a year, where an idle
/// key's window index cannot wrap (see VERIFICATION.md).
const WINDOW_SPAN: u64 = 182 * 86_400 * 1_000_000_000;
/// The clock starts no earlier (the probe runs at instants 1 to 256 ns).
const EARLIEST_START: u64 = 1 << 30;

#[derive(Arbitrary, Clone, Copy, Debug)]
enum Op<K = u8> {
    Check {
        key: K,
        cost: u8,
    },
    /// A check at a reading `back` units earlier than the clock (a preempted thread,
    /// an early TSC, `check_n_at` with an older time), or, where `back ≥ 0xF000`,
    /// `back & 0xFFF` units later (see [`shifted`]).
    CheckEarlier {
        key: K,
        cost: u8,
        back: u16,
    },
    Peek {
        key: K,
        cost: u8,
    },
    Charge {
        key: K,
        cost: u8,
    },
    /// A charge at a reading `back` units earlier than the clock (or later: as
    /// `CheckEarlier`).
    ChargeEarlier {
        key: K,
        cost: u8,
        back: u16,
    },
    Refund {
        pick: u8,
    },
    /// Moves the clock by this many units; from `0xF000_0000` on, steps it back by
    /// the low 16 bits' units instead (never before the start).
    Advance(u32),
    ReclaimIdle,
    Remove {
        key: K,
    },
    /// Checks of `count` keys from `from` on (past 255: [`Key`]), each read `back`
    /// units earlier than the clock (or later: as `CheckEarlier`): a burst of inserts, enough to fill the shards of
    /// an 8-shard table (each holds its share plus a headroom of 20-odd keys).
    Flood {
        from: K,
        count: u8,
        cost: u8,
        back: u16,
    },
}

/// The table's keys: the operations name `u8` keys, and a flood runs on past 255 (up
/// to 510), so that every shard of an 8-shard table can fill beyond its share and
/// evict (each holds its share plus a headroom of 20-odd keys).
type Key = u16;

/// Where a `back` field puts a reading after the clock's `now`: `back` units before
/// it, or, from `0xF000` on, `back & 0xFFF` units after it (one reading in sixteen; a
/// window reading no later than `end`). An insert read ahead removes keys at an instant
/// the clock has not reached: its shard's R passes the clock. Below `0xF000` a seed
/// reads as it did before readings ran ahead.
fn shifted(now: u64, back: u16, unit: u64, end: u64) -> u64 {
    if back >= 0xF000 {
        let ahead = now.saturating_add(u64::from(back & 0xFFF) * unit);
        ahead.min(end.max(now))
    } else {
        now.saturating_sub(u64::from(back) * unit)
    }
}

/// Where `Advance(units)` sets the clock from `now`: `units` later (a window clock no
/// later than `end`), or, from `0xF000_0000` on, `units & 0xFFFF` units earlier but not
/// before `start` (a clock stepped back: another core's TSC, an NTP step).
fn moved(now: u64, units: u32, unit: u64, start: u64, end: u64) -> u64 {
    if units >= 0xF000_0000 {
        let back = u64::from(units & 0xFFFF) * unit;
        now.saturating_sub(back).max(start.min(now))
    } else {
        let next = now.saturating_add(u64::from(units) * unit);
        next.min(end.max(now))
    }
}

/// The operations, each flood expanded into its checks, keys widened to [`Key`].
fn expand(ops: &[Op]) -> Vec<Op<Key>> {
    let mut out = Vec::new();
    for op in ops {
        match *op {
            Op::Flood {
                from,
                count,
                cost,
                back,
            } => out.extend((0..Key::from(count)).map(|i| Op::CheckEarlier {
                key: Key::from(from) + i,
                cost,
                back,
            })),
            Op::Check { key, cost } => out.push(Op::Check {
                key: key.into(),
                cost,
            }),
            Op::CheckEarlier { key, cost, back } => out.push(Op::CheckEarlier {
                key: key.into(),
                cost,
                back,
            }),
            Op::Peek { key, cost } => out.push(Op::Peek {
                key: key.into(),
                cost,
            }),
            Op::Charge { key, cost } => out.push(Op::Charge {
                key: key.into(),
                cost,
            }),
            Op::ChargeEarlier { key, cost, back } => out.push(Op::ChargeEarlier {
                key: key.into(),
                cost,
                back,
            }),
            Op::Refund { pick } => out.push(Op::Refund { pick }),
            Op::Advance(units) => out.push(Op::Advance(units)),
            Op::ReclaimIdle => out.push(Op::ReclaimIdle),
            Op::Remove { key } => out.push(Op::Remove { key: key.into() }),
        }
        if out.len() >= MAX_OPS {
            out.truncate(MAX_OPS);
            break;
        }
    }
    out
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// Heap, inline or fingerprint (mod 3).
    storage: u8,
    limit: u8,
    period: u16,
    burst: u8,
    capacity: u8,
    /// GCRA, fixed window, sliding window counter or sliding log (mod 4).
    algorithm: u8,
    /// 1, 2, 4 or 8 shards (mod 4, as the power of two).
    shards: u8,
    /// The time unit: ns, µs or ms (mod 3).
    unit: u8,
    /// Where the clock starts (mod 4; see `start_of`).
    start: u8,
    offset: u64,
    ops: Vec<Op>,
}

/// What the run needs of an algorithm besides [`Algorithm`].
trait Alg: Algorithm + Copy + Send + Sync + 'static {
    const KIND: Kind;
    /// Whether the admission `admitted`, judged at `at`, stores the keyed table's
    /// reserved dead word (the table refuses it: stricter than the model).
    fn into_dead(_at: Nanos, _admitted: &Decision) -> bool {
        false
    }
    /// `2^k · P`: how long its window index takes to wrap, if it has one.
    fn wrap_span(&self) -> Option<u128> {
        None
    }
}

impl Alg for Gcra {
    const KIND: Kind = Kind::Gcra;
    /// A TAT of `u64::MAX`: `reset_after` runs to it.
    fn into_dead(at: Nanos, admitted: &Decision) -> bool {
        admitted.is_allowed()
            && at.as_u64().checked_add(admitted.reset_after_nanos()) == Some(u64::MAX)
    }
}

impl Alg for FixedWindow {
    const KIND: Kind = Kind::Fixed;
    fn wrap_span(&self) -> Option<u128> {
        let bits = 64 - self.count_bits();
        Some(u128::from(self.policy().period_nanos()) << bits)
    }
}

impl Alg for SlidingWindow {
    const KIND: Kind = Kind::Sliding;
    fn wrap_span(&self) -> Option<u128> {
        let bits = 64 - 2 * self.count_bits();
        Some(u128::from(self.policy().period_nanos()) << bits)
    }
}

/// A keyed table of [`Key`] keys: a `KeyedLimiter` or the `KeyedSlidingLog`.
trait Table {
    fn check(&self, key: Key, at: Nanos, cost: u32) -> Decision;
    fn charge(&self, key: Key, at: Nanos, cost: u32) -> (Decision, Receipt);
    fn peek(&self, key: Key, at: Nanos, cost: u32) -> Decision;
    fn refund(&self, key: Key, receipt: Receipt) -> bool;
    fn remove(&self, key: Key) -> bool;
    /// Reclaims every idle key now (the log has no such call: 0).
    fn reclaim_idle(&self) -> usize;
    fn metrics(&self) -> KeyedMetrics;
    fn max_keys(&self) -> usize;
}

/// The `Table` methods both tables have under the same names (their own, inherent
/// methods, which a path through `Self` finds before the trait's).
macro_rules! table_methods {
    () => {
        fn check(&self, key: Key, at: Nanos, cost: u32) -> Decision {
            Self::check_n_at(self, &key, at, cost)
        }
        fn charge(&self, key: Key, at: Nanos, cost: u32) -> (Decision, Receipt) {
            Self::charge_at(self, &key, at, cost)
        }
        fn peek(&self, key: Key, at: Nanos, cost: u32) -> Decision {
            Self::peek_at(self, &key, at, cost)
        }
        fn refund(&self, key: Key, receipt: Receipt) -> bool {
            Self::refund(self, &key, receipt)
        }
        fn remove(&self, key: Key) -> bool {
            Self::remove(self, &key)
        }
        fn metrics(&self) -> KeyedMetrics {
            Self::metrics(self)
        }
        fn max_keys(&self) -> usize {
            Self::max_keys(self)
        }
    };
}

impl<A: Algorithm, S: Storage<Key, A::State>> Table for KeyedLimiter<Key, A, AnyClock, S> {
    table_methods!();
    fn reclaim_idle(&self) -> usize {
        Self::reclaim_idle(self)
    }
}

impl Table for KeyedSlidingLog<Key, AnyClock> {
    table_methods!();
    fn reclaim_idle(&self) -> usize {
        0
    }
}

/// One key's un-keyed twin, a `RateLimiter` or a `SlidingLog`, decided through
/// [`Limit`] (a refund reads the model clock).
trait Model: Limit {
    /// Whether `got` is the keyed table's refusal of `want`, judged at `at`, because
    /// admitting it would store the table's dead word (allowed: stricter).
    fn dead_refusal(&self, at: Nanos, got: &Decision, want: &Decision) -> bool;
    /// Whether the log's twin holds no unit that counts at `at` (what the keyed log's
    /// sweep drops); `None` on the lock-free table's twins, whose eviction samples.
    fn log_idle(&self, _at: Nanos) -> Option<bool> {
        None
    }
}

impl<A: Alg> Model for RateLimiter<A, AnyClock> {
    fn dead_refusal(&self, at: Nanos, got: &Decision, want: &Decision) -> bool {
        A::into_dead(at, want) && refusal(got, want)
    }
}

impl Model for SlidingLog<AnyClock> {
    fn dead_refusal(&self, _: Nanos, _: &Decision, _: &Decision) -> bool {
        false
    }
    fn log_idle(&self, at: Nanos) -> Option<bool> {
        Some(self.is_idle(at))
    }
}

/// Whether `got` is `want` turned into a denial that never succeeds.
fn refusal(got: &Decision, want: &Decision) -> bool {
    !got.is_allowed()
        && got.retry_after().is_none()
        && (got.limit(), got.remaining(), got.reset_after())
            == (want.limit(), want.remaining(), want.reset_after())
}

/// The run's shape, from the input.
struct Setup<'a> {
    input: &'a Input,
    policy: Policy,
    /// Nanoseconds per time unit.
    unit: u64,
    shards: usize,
    capacity: usize,
    /// The operations, floods expanded (at most `MAX_OPS`).
    ops: Vec<Op<Key>>,
}

fuzz_target!(|input: Input| {
    seeds::fix_hash_seeds();
    let unit = [1, 1_000, 1_000_000][usize::from(input.unit % 3)];
    let period = Duration::from_nanos(u64::from(input.period) * unit);
    let Ok(policy) = Policy::new(u64::from(input.limit), period)
        .and_then(|p| p.with_burst(u64::from(input.burst)))
    else {
        return;
    };
    let setup = Setup {
        input: &input,
        policy,
        unit,
        shards: 1 << (input.shards % 4),
        capacity: usize::from(input.capacity).max(1),
        ops: expand(&input.ops),
    };
    match input.algorithm % 4 {
        0 => on_storage(Gcra::new(policy), &setup),
        1 => {
            if let Ok(window) = FixedWindow::new(policy) {
                on_storage(window, &setup);
            }
        }
        2 => {
            if let Ok(window) = SlidingWindow::new(policy) {
                on_storage(window, &setup);
            }
        }
        _ => {
            let clock = AnyClock::default();
            let Ok(table) = KeyedBuilder::default()
                .capacity(setup.capacity)
                .shards(setup.shards)
                .clock(clock.clone())
                .sliding_log::<Key>(policy)
            else {
                return;
            };
            // The builder's rounding: a power of two, at most one shard per key.
            let shards = setup.shards.min(1 << setup.capacity.ilog2());
            let start = start_of(setup.input, None, policy.period_nanos());
            run(&table, &clock, shards, Kind::Log, start, &setup, |clock| {
                SlidingLog::with_clock(policy, clock.clone())
            });
        }
    }
});

fn on_storage<A: Alg>(algorithm: A, setup: &Setup)
where
    Heap: Storage<Key, A::State>,
    Inline: Storage<Key, A::State>,
    Fingerprint: Storage<Key, A::State>,
{
    match setup.input.storage % 3 {
        0 => keyed::<A, Heap>(algorithm, setup),
        1 => keyed::<A, Inline>(algorithm, setup),
        _ => keyed::<A, Fingerprint>(algorithm, setup),
    }
}

fn keyed<A: Alg, S: Storage<Key, A::State>>(algorithm: A, setup: &Setup) {
    let clock = AnyClock::default();
    let Ok(table) = KeyedBuilder::new(algorithm)
        .capacity(setup.capacity)
        .shards(setup.shards)
        .clock(clock.clone())
        .build_in::<Key, S>()
    else {
        return;
    };
    let table: KeyedLimiter<Key, A, AnyClock, S> = table;
    let start = start_of(
        setup.input,
        algorithm.wrap_span(),
        setup.policy.period_nanos(),
    );
    run(
        &table,
        &clock,
        table.shards(),
        A::KIND,
        start,
        setup,
        |clock| RateLimiter::with_clock(algorithm, clock.clone()),
    );
}

/// Where the clock starts: 100 s on (mode 0), near the top of `u64` (1), a few periods
/// before a window index wraps to 0 (2; GCRA and the log: near 2^63), anywhere (3).
fn start_of(input: &Input, wrap: Option<u128>, period: u64) -> u64 {
    let offset = input.offset;
    let start = match input.start % 4 {
        0 => 100_000_000_000 + offset % (1 << 40),
        1 => u64::MAX - offset % (1 << 40),
        2 => match wrap.and_then(|span| u64::try_from(span).ok()) {
            Some(span) => {
                // The start of window 2^k·m, less up to 8 periods.
                let m = 1 + (offset >> 8) % (u64::MAX / span);
                let back = (offset % 256).saturating_mul(period) / 32;
                m * span - back.min(span - 1)
            }
            None => (1 << 63) - offset % (1 << 40),
        },
        _ => offset,
    };
    start.max(EARLIEST_START)
}

/// The keys' shards as the target knows them: a class per shard met, and per class
/// what is known of its latest removal.
struct Classes {
    of: BTreeMap<Key, usize>,
    /// The keys of each class.
    members: Vec<Vec<Key>>,
    /// The latest removal instant known (a lower bound of the shard's R).
    known: Vec<Nanos>,
    /// An upper bound of the shard's R (above `known` after a `reclaim_idle` that
    /// more than one class may have removed in).
    most: Vec<Nanos>,
    /// Removals known to have happened in the class (a receipt taken before one
    /// refunds nothing).
    removals: Vec<u64>,
    /// Removals that may have happened in the class.
    maybe: Vec<u64>,
    /// The latest instant any decision of the class was judged at: a refund is made
    /// only where it is judged no earlier (the refund guarantee's premise).
    latest: Vec<Nanos>,
}

impl Classes {
    /// Learns the shard classes of `keys` through the public API (see the module docs),
    /// with the clock at the probe's instants `1..=keys.len()` ns.
    fn probe<T: Table>(table: &T, clock: &AnyClock, keys: &BTreeSet<Key>, shards: usize) -> Self {
        let mut of = BTreeMap::new();
        let mut order = Vec::new();
        let mut known: Vec<Nanos> = Vec::new();
        for (i, &key) in keys.iter().enumerate() {
            let at = Nanos::new(i as u64 + 1);
            clock.set(at);
            let class = probe::probe_key(
                key,
                at,
                || table.charge(key, Nanos::ZERO, 1),
                || table.remove(key),
                &mut known,
                |i| of[&order[i]],
            );
            of.insert(key, class);
            order.push(key);
        }
        assert!(
            known.len() <= shards,
            "probe: {} classes of keys over {shards} shards",
            known.len()
        );
        let n = known.len();
        let mut members = vec![Vec::new(); n];
        for (&key, &class) in &of {
            members[class].push(key);
        }
        Classes {
            of,
            members,
            most: known.clone(),
            known,
            removals: vec![0; n],
            maybe: vec![0; n],
            latest: vec![Nanos::ZERO; n],
        }
    }

    /// The reading to decide `key` at instead of `reading`: raised to the clock's
    /// reading of the last unsure reclamation while its class's R is unknown.
    fn reading(&self, key: Key, reading: Nanos) -> Nanos {
        let c = self.of[&key];
        if self.known[c] < self.most[c] {
            reading.max(self.most[c])
        } else {
            reading
        }
    }

    /// The instant the table judges `reading` (from [`Classes::reading`]) at.
    fn judged(&self, key: Key, reading: Nanos) -> Nanos {
        reading.max(self.known[self.of[&key]])
    }

    /// The earliest instant a later decision on `key` can be judged at.
    fn floor(&self, key: Key) -> Nanos {
        self.most[self.of[&key]]
    }

    /// The instant a refund of `key` with the clock at `now` is judged at, where it
    /// is known and no earlier than every decision of its class (the refund
    /// guarantee's premise); `None` where either fails.
    fn refund_at(&self, key: Key, now: Nanos) -> Option<Nanos> {
        let c = self.of[&key];
        let at = if now >= self.most[c] {
            now
        } else if self.known[c] == self.most[c] {
            self.known[c]
        } else {
            return None;
        };
        (at >= self.latest[c]).then_some(at)
    }

    /// A removal known to be in `class`, judged at `at`.
    fn removed(&mut self, class: usize, at: Nanos) {
        self.known[class] = self.known[class].max(at);
        self.most[class] = self.most[class].max(at);
        self.removals[class] += 1;
    }

    /// A removal that may be in `class`, judged at `at`.
    fn maybe_removed(&mut self, class: usize, at: Nanos) {
        self.most[class] = self.most[class].max(at);
        self.maybe[class] += 1;
    }
}

/// An outstanding receipt: the table's, the model's (`None`: void), the grant it
/// holds, and its class's removal counts when it was taken.
struct Held {
    key: Key,
    table: Receipt,
    model: Option<Receipt>,
    grant: Option<u64>,
    removals: u64,
    maybe: u64,
}

fn run<T: Table, M: Model>(
    table: &T,
    clock: &AnyClock,
    shards: usize,
    kind: Kind,
    start: u64,
    setup: &Setup,
    twin: impl Fn(&AnyClock) -> M,
) {
    let keys: BTreeSet<Key> = setup
        .ops
        .iter()
        .filter_map(|op| match *op {
            Op::Check { key, .. }
            | Op::CheckEarlier { key, .. }
            | Op::Peek { key, .. }
            | Op::Charge { key, .. }
            | Op::ChargeEarlier { key, .. }
            | Op::Remove { key } => Some(key),
            _ => None,
        })
        .collect();
    let mut classes = Classes::probe(table, clock, &keys, shards);
    clock.set(Nanos::new(start));
    // Window readings stay within half a year of the start.
    let end = match kind {
        Kind::Fixed | Kind::Sliding => start.saturating_add(WINDOW_SPAN),
        Kind::Gcra | Kind::Log => u64::MAX,
    };
    // The models' clock: set to the instant the table judges a refund at.
    let model_clock = AnyClock::default();
    let fresh = || twin(&model_clock);
    let mut models: BTreeMap<Key, M> = BTreeMap::new();
    let mut untracked: HashSet<Key> = HashSet::new();
    let mut oracles: BTreeMap<Key, Oracle> = BTreeMap::new();
    let mut receipts: Vec<Held> = Vec::new();
    // For the stats: operations after which some shard's R was past the clock, and
    // refunds held back because their premise failed.
    let (mut ahead, mut waited) = (0u64, 0u64);
    let unit = setup.unit;
    // The log's eviction, as its docs specify it (the lock-free table's samples).
    let mut log = (kind == Kind::Log).then(|| {
        assert_eq!(table.max_keys() % shards, 0, "a share per shard");
        LogShadow::new(
            &classes,
            shards,
            table.max_keys(),
            setup.policy.period_nanos(),
        )
    });
    for (i, op) in setup.ops.iter().enumerate() {
        let before = table.metrics();
        let now = clock.now();
        // The key whose insert may have removed keys, and the instant it was judged at.
        let mut insert: Option<(Key, Nanos)> = None;
        let mut charged = false;
        // What the log's docs say the operation removed.
        let mut predicted = LogRemovals::default();
        // The keys whose state or judgment the operation may have changed.
        let mut scope = Scope::Nothing;
        match *op {
            Op::Check { key, cost }
            | Op::CheckEarlier { key, cost, .. }
            | Op::Charge { key, cost }
            | Op::ChargeEarlier { key, cost, .. } => {
                let back = match *op {
                    Op::CheckEarlier { back, .. } | Op::ChargeEarlier { back, .. } => back,
                    _ => 0,
                };
                let cost = u32::from(cost);
                let stale = Nanos::new(shifted(now.as_u64(), back, unit, end));
                let reading = classes.reading(key, stale);
                let judged = classes.judged(key, reading);
                let c = classes.of[&key];
                classes.latest[c] = classes.latest[c].max(judged);
                let peeked = table.peek(key, reading, cost);
                let model = models.entry(key).or_insert_with(fresh);
                let charging = matches!(op, Op::Charge { .. } | Op::ChargeEarlier { .. });
                let (got, want, receipts_of) = if charging {
                    let (got, receipt) = table.charge(key, reading, cost);
                    let (want, theirs) = model.charge_at(judged, cost);
                    if got.is_allowed() && cost > 0 {
                        assert_eq!(
                            receipt.charged_at(),
                            Some(judged),
                            "key {key}: charge read at {reading:?} judged elsewhere"
                        );
                    }
                    (got, want, Some((receipt, theirs)))
                } else {
                    (
                        table.check(key, reading, cost),
                        model.check_n_at(judged, cost),
                        None,
                    )
                };
                assert_eq!(
                    peeked, got,
                    "key {key}: peek then check, cost {cost} read at {reading:?}"
                );
                if !untracked.contains(&key) && got != want {
                    assert!(
                        model.dead_refusal(judged, &got, &want),
                        "key {key}: cost {cost} read at {reading:?}, judged at {judged:?}: \
                         table {got:?} vs model {want:?}"
                    );
                    // The model stored what the table refused.
                    untracked.insert(key);
                }
                if let Some(log) = log.as_mut() {
                    let logged = got.is_allowed() && cost > 0;
                    predicted = log.decided(c, key, judged, logged, i, &models);
                }
                let grant = oracles
                    .entry(key)
                    .or_insert_with(|| Oracle::new(kind, setup.policy))
                    .admit(judged.as_u64(), None, &got, cost);
                if let Some((table, model)) = receipts_of {
                    // Its class's counts are noted after this operation's own removals,
                    // which come before the charge.
                    receipts.push(Held {
                        key,
                        table,
                        model: Some(model),
                        grant,
                        removals: 0,
                        maybe: 0,
                    });
                    charged = true;
                }
                insert = Some((key, judged));
                scope = Scope::Key(key);
            }
            Op::Peek { key, cost } => {
                let cost = u32::from(cost);
                let reading = classes.reading(key, now);
                let judged = classes.judged(key, reading);
                let got = table.peek(key, reading, cost);
                let model = models.get(&key);
                let want = model.map_or_else(
                    || fresh().peek_at(judged, cost),
                    |m| m.peek_at(judged, cost),
                );
                if !untracked.contains(&key) && got != want {
                    assert!(
                        model.map_or_else(
                            || fresh().dead_refusal(judged, &got, &want),
                            |m| m.dead_refusal(judged, &got, &want)
                        ),
                        "peek {key} cost {cost} at {reading:?}: table {got:?} vs model {want:?}"
                    );
                }
            }
            Op::Refund { pick } if !receipts.is_empty() => {
                let index = usize::from(pick) % receipts.len();
                // Only where the premise holds (else the receipt stays for later).
                let at = classes.refund_at(receipts[index].key, now);
                waited += u64::from(at.is_none());
                if let Some(at) = at {
                    let held = receipts.remove(index);
                    scope = Scope::Key(held.key);
                    refund(
                        table,
                        held,
                        &mut Refunding {
                            classes: &classes,
                            models: &models,
                            untracked: &mut untracked,
                            oracles: &mut oracles,
                            model_clock: &model_clock,
                            now: at,
                            kind,
                            burst: setup.policy.burst(),
                        },
                    );
                }
            }
            Op::Refund { .. } => {}
            Op::Advance(units) => {
                clock.set(Nanos::new(moved(now.as_u64(), units, unit, start, end)));
            }
            Op::ReclaimIdle => {
                scope = Scope::All;
                let n = table.reclaim_idle();
                assert_eq!(
                    table.metrics().reclaimed - before.reclaimed,
                    n as u64,
                    "reclaim_idle's count"
                );
                // Which classes hold a key that may be idle now (the table's keys are
                // among the models'), judged at `max(now, R)`: idle at the latest R may
                // be (idleness lasts once reached).
                let candidates: Vec<Key> = models
                    .iter()
                    .filter(|(k, m)| {
                        let at = now.max(classes.floor(**k));
                        untracked.contains(k) || m.peek_at(at, 0) == fresh().peek_at(at, 0)
                    })
                    .map(|(&k, _)| k)
                    .collect();
                assert!(
                    n <= candidates.len(),
                    "reclaim_idle took {n} keys, only {candidates:?} may be idle"
                );
                if n > 0 {
                    let hit: BTreeSet<usize> = candidates.iter().map(|k| classes.of[k]).collect();
                    if hit.len() == 1 {
                        classes.removed(*hit.first().expect("one class"), now);
                    } else {
                        for &c in &hit {
                            classes.maybe_removed(c, now);
                        }
                    }
                }
            }
            Op::Flood { .. } => unreachable!("floods are expanded"),
            Op::Remove { key } => {
                scope = Scope::Class(classes.of[&key]);
                let held = log.as_mut().map(|l| l.remove(classes.of[&key], key));
                let removed = table.remove(key);
                if let Some(held) = held {
                    assert_eq!(removed, held, "remove({key}): held as the log's docs say");
                }
                if removed {
                    classes.removed(classes.of[&key], now);
                    models.remove(&key);
                    untracked.remove(&key);
                    if let Some(o) = oracles.get_mut(&key) {
                        o.forget();
                    }
                }
            }
        }
        let after = table.metrics();
        ahead += u64::from(classes.most.iter().any(|&r| r > clock.now()));
        assert!(after.live_keys as usize <= table.max_keys(), "{after:?}");
        let evicted = after.evicted - before.evicted;
        if let Some(log) = &log {
            // Which key went is the comparison's to find (it reads as fresh).
            let reclaimed = after.reclaimed - before.reclaimed;
            assert_eq!(
                (reclaimed, evicted),
                (predicted.reclaimed, u64::from(predicted.evicted.is_some())),
                "{op:?}: the log's idle removals and live evictions, against its docs' \
                 {predicted:?}"
            );
            assert_eq!(after.live_keys as usize, log.live(), "{op:?}: keys held");
        }
        let class_of_insert = insert.map(|(key, _)| classes.of[&key]);
        match insert {
            Some((key, judged)) => {
                if after.reclaimed + evicted > before.reclaimed {
                    classes.removed(classes.of[&key], judged);
                    scope = Scope::Class(classes.of[&key]);
                }
                if charged {
                    // Its class's counts after this operation's own removals, which a
                    // charge's receipt outlives.
                    let held = receipts.last_mut().expect("just pushed");
                    let c = classes.of[&key];
                    (held.removals, held.maybe) = (classes.removals[c], classes.maybe[c]);
                }
            }
            None => {
                assert_eq!(evicted, 0, "an eviction without an insert: {op:?}");
                if !matches!(op, Op::ReclaimIdle) {
                    assert_eq!(after.reclaimed, before.reclaimed, "a reclamation in {op:?}");
                }
            }
        }
        if i + 1 == setup.ops.len() {
            // Every key, once at the end.
            scope = Scope::All;
        }
        let mut sweep = Sweep {
            classes: &classes,
            models: &mut models,
            untracked: &untracked,
            oracles: &mut oracles,
            now: clock.now(),
            scope,
            inserted: insert,
            log: log.as_ref(),
        };
        let dropped = sweep.compare(table, class_of_insert, evicted, &fresh);
        if log.is_some() {
            assert_eq!(
                dropped,
                Vec::from_iter(predicted.evicted),
                "{op:?}: the key evicted live is not the one the log's docs say"
            );
        }
    }
    if std::env::var_os("KEYED_STATS").is_some() {
        // What a corpus reaches: `KEYED_STATS=1 keyed -runs=0 corpus/keyed`.
        let m = table.metrics();
        eprintln!(
            "stats: {kind:?} storage {} shards {shards} evicted {} reclaimed {} \
             R ahead {ahead} refunds waiting {waited}",
            setup.input.storage % 3,
            m.evicted,
            m.reclaimed
        );
    }
}

/// Keys an eviction compares (`EVICTION_SAMPLE` in the keyed tables).
const EVICTION_SAMPLE: u64 = 8;

/// Which keys the comparison after an operation looks at: those whose state or
/// judgment it may have changed (after the last operation, every key).
#[derive(Clone, Copy, Debug)]
enum Scope {
    Nothing,
    Key(Key),
    /// The keys of a class (shard) that removed a key.
    Class(usize),
    All,
}

/// What a refund is settled against.
struct Refunding<'a, M> {
    classes: &'a Classes,
    models: &'a BTreeMap<Key, M>,
    untracked: &'a mut HashSet<Key>,
    oracles: &'a mut BTreeMap<Key, Oracle>,
    model_clock: &'a AnyClock,
    /// The instant the table judges the refund at (`max(clock, R)`).
    now: Nanos,
    kind: Kind,
    burst: u64,
}

/// Refunds `held` on the table and the model (both judged at `max(clock, R)`) and
/// compares them.
fn refund<T: Table, M: Model>(table: &T, held: Held, r: &mut Refunding<M>) {
    let key = held.key;
    let c = r.classes.of[&key];
    // A known removal in the key's shard since the charge voids its receipt; a
    // possible one may have.
    let voided = held.removals != r.classes.removals[c];
    let unsure = held.maybe != r.classes.maybe[c];
    r.model_clock.set(r.now);
    let back = table.refund(key, held.table);
    assert!(
        !(voided && back),
        "key {key}: a receipt taken before a removal in its shard gave back"
    );
    let model = r.models.get(&key);
    let model_back = match (model, held.model) {
        // Where the table may have voided it, the model follows the table.
        (Some(m), Some(theirs)) if !voided && (back || !unsure) => m.refund(theirs),
        _ => false,
    };
    if let Some(oracle) = r.oracles.get_mut(&key) {
        match held.grant {
            Some(id) if back => assert!(
                oracle.release(id),
                "key {key}: a refund of a grant not held"
            ),
            None => assert!(!back, "key {key}: a refund of nothing gave back"),
            Some(_) => {}
        }
    }
    let Some(m) = model.filter(|_| !r.untracked.contains(&key)) else {
        return;
    };
    if r.kind != Kind::Gcra {
        // The windows and the log refund exactly as their twins.
        assert_eq!(back, model_back, "key {key}: refund");
        return;
    }
    // GCRA's refund ledger is per shard: never more permissive than the model's.
    let at = r.now;
    for cost in 0..=u32::try_from(r.burst + 1).unwrap_or(u32::MAX) {
        let (t, w) = (table.peek(key, at, cost), m.peek_at(at, cost));
        assert!(
            !t.is_allowed() || w.is_allowed(),
            "refund {key}: table {t:?} vs model {w:?}"
        );
    }
    // What is left, read without taking anything.
    let (t, w) = (table.peek(key, at, 0), m.peek_at(at, 0));
    assert!(
        t.remaining() <= w.remaining(),
        "refund {key}: table {t:?} vs model {w:?}"
    );
    if back != model_back || t != w {
        r.untracked.insert(key);
    }
}

/// The comparison of every tracked key after an operation.
struct Sweep<'a, M> {
    classes: &'a Classes,
    models: &'a mut BTreeMap<Key, M>,
    untracked: &'a HashSet<Key>,
    oracles: &'a mut BTreeMap<Key, Oracle>,
    now: Nanos,
    scope: Scope,
    /// The key inserted and the instant it was judged at.
    inserted: Option<(Key, Nanos)>,
    /// The log's eviction as its docs specify it (`None`: the lock-free table, whose
    /// eviction samples).
    log: Option<&'a LogShadow>,
}

impl<M: Model> Sweep<'_, M> {
    /// Asserts that `victim`, evicted by the insert of `inserted` judged at `judged`,
    /// was the lightest of a sample of `EVICTION_SAMPLE` keys of its shard (or of
    /// every key, where fewer): at most `present − EVICTION_SAMPLE` live keys of its
    /// class forgive less than it did, `present` the class's keys the table may hold
    /// (those with a model: every key the table holds has one), ranked by units in
    /// use, then `reset_after`. Unknown where an untracked key is in the class. (The
    /// log ranks its whole shard: [`LogShadow`] follows its docs exactly.)
    fn ranked(&self, victim: Key, inserted: Key, judged: Nanos, fresh: &impl Fn() -> M) {
        let class = self.classes.of[&victim];
        let members = &self.classes.members[class];
        if members.iter().any(|k| self.untracked.contains(k)) {
            return;
        }
        let idle = fresh().peek_at(judged, 0);
        let loss = |d: Decision| (d.limit() - d.remaining(), d.reset_after_nanos());
        let lost = loss(self.models[&victim].peek_at(judged, 0));
        let others: Vec<(Key, Decision)> = members
            .iter()
            .filter(|&&k| k != inserted && k != victim)
            .filter_map(|k| self.models.get(k).map(|m| (*k, m.peek_at(judged, 0))))
            .collect();
        let lighter: Vec<&(Key, Decision)> = others
            .iter()
            .filter(|(_, d)| *d != idle && loss(*d) < lost)
            .collect();
        let present = others.len() as u64 + 1;
        assert!(
            lighter.len() as u64 <= present.saturating_sub(EVICTION_SAMPLE),
            "evicted key {victim} forgave {lost:?}, but {} of the {present} keys its \
             shard may hold forgave less: {lighter:?}",
            lighter.len()
        );
    }

    /// Compares every tracked key through peeks of 0 and 1 unit, now and at the
    /// earliest instant a later decision on it can be judged at (its class's R: a key
    /// evicted live may read as idle now and still differ for a later reading earlier
    /// than now). Only `evicted` live evictions by an insert in class `insert` may
    /// explain a difference, and the evicted key then reads as fresh. Returns the keys
    /// found evicted.
    fn compare<T: Table>(
        &mut self,
        table: &T,
        insert: Option<usize>,
        mut evicted: u64,
        fresh: &impl Fn() -> M,
    ) -> Vec<Key> {
        let mut dropped = Vec::new();
        let keys: &[Key] = match self.scope {
            Scope::Nothing => &[],
            Scope::Key(ref k) => core::slice::from_ref(k),
            Scope::Class(c) => &self.classes.members[c],
            Scope::All => &self.classes.members.concat(),
        };
        for &key in keys {
            let Some(m) = self.models.get(&key) else {
                continue;
            };
            if self.untracked.contains(&key) {
                continue;
            }
            // Costs 0 (what is left) and 1 (where an admission would count).
            // Each judged where it is read: no earlier than the class's R.
            let floor = self.classes.floor(key);
            let probes = [self.now.max(floor), floor]
                .into_iter()
                .flat_map(|t| [(t, 0), (t, 1)]);
            let Some((t, cost, got, want)) = probes
                .clone()
                .map(|(t, cost)| (t, cost, table.peek(key, t, cost), m.peek_at(t, cost)))
                .find(|&(t, _, g, w)| g != w && !m.dead_refusal(t, &g, &w))
            else {
                continue;
            };
            assert!(
                evicted > 0 && insert == Some(self.classes.of[&key]),
                "key {key} at {t:?}, cost {cost}: table {got:?} vs model {want:?}"
            );
            let new = fresh();
            for (t, cost) in probes {
                let (got, want) = (table.peek(key, t, cost), new.peek_at(t, cost));
                assert!(
                    got == want || new.dead_refusal(t, &got, &want),
                    "key {key} was not dropped cleanly: {got:?} vs fresh {want:?}"
                );
            }
            if let Some((inserted, judged)) = self.inserted {
                match self.log {
                    Some(log) => log.audit(self.classes.of[&key], key, judged, self.models),
                    None => self.ranked(key, inserted, judged, fresh),
                }
            }
            evicted -= 1;
            dropped.push(key);
        }
        for key in &dropped {
            // Its receipts are void: the eviction is a known removal in its class.
            self.models.remove(key);
            if let Some(o) = self.oracles.get_mut(key) {
                o.forget();
            }
        }
        if evicted > 0 {
            // An eviction no tracked key shows: any untracked key of the class may be
            // the one, and then its admissions no longer count and its window is lost.
            for (key, o) in self.oracles.iter_mut() {
                if self.untracked.contains(key) && insert == Some(self.classes.of[key]) {
                    o.forget();
                    o.contract = false;
                }
            }
        }
        dropped
    }
}

/// What evicting a log forgives, as the keyed log's docs order it: the units still
/// counting, then the instant its newest unit was logged at ((0, 0) where none counts).
type Weight = (u64, u64);

/// The weight of the twin `model` judged at `at`, read through a peek of 0 units (its
/// newest unit leaves `reset_after` later, a period after it was logged).
fn log_weight<M: Model>(model: &M, at: Nanos, period: u64) -> Weight {
    let d = model.peek_at(at, 0);
    let units = d.limit() - d.remaining();
    if units == 0 {
        return (0, 0);
    }
    let leaves = u128::from(at.as_u64()) + u128::from(d.reset_after_nanos());
    let newest = leaves.saturating_sub(u128::from(period));
    (units, u64::try_from(newest).unwrap_or(u64::MAX))
}

/// A key as a sweep of the log saw it: its weight then and its turn among keys of
/// equal weight (how far its hash lies past the shard's hand).
#[derive(Clone, Copy, Debug)]
struct Rank {
    weight: Weight,
    turn: u64,
    key: Key,
}

impl Rank {
    fn order(&self) -> (Weight, u64) {
        (self.weight, self.turn)
    }
}

/// One shard (class) of the log, as its docs specify it.
#[derive(Default)]
struct ShardShadow {
    /// The keys the shard holds.
    present: BTreeSet<Key>,
    /// Full-shard inserts left before the next sweep.
    credit: usize,
    /// The last sweep's lightest keys, heaviest first: the next evictions' victims.
    ranked: Vec<Rank>,
    /// Where ties start: past the hash of the heaviest key the last sweep ranked.
    hand: u64,
    /// Every key the last sweep saw, lightest first, and the operation it ran in.
    swept: Vec<Rank>,
    swept_op: usize,
    /// The operation each key last logged units in (charged, or inserted).
    charged: BTreeMap<Key, usize>,
}

/// What an insert into the log removed, as the shadow has it: idle logs dropped
/// (counted as reclaimed) and the live key evicted, if any.
#[derive(Clone, Copy, Debug, Default)]
struct LogRemovals {
    reclaimed: u64,
    evicted: Option<Key>,
}

/// An insert into the log the shadow makes room for: its class, the instant it is
/// judged at, its operation, and the twins to weigh the shard's keys by.
struct Insert<'m, M> {
    class: usize,
    at: Nanos,
    op: usize,
    models: &'m BTreeMap<Key, M>,
}

/// The keyed log's eviction as its module docs (`keyed/log.rs`) specify it, run beside
/// the table on the twins' weights: a shard at its share sweeps once per
/// `max(⌊share/8⌋, 1)` full-shard inserts (at the first, then after each credit is
/// used up), dropping idle logs and ranking the `max(⌊share/8⌋, 1)` lightest keys
/// (weight, then hash order from a hand that each sweep moves past the heaviest key it
/// ranked); an insert into a shard still full evicts the lightest ranked key still
/// there and no heavier than when ranked (one charged since is passed over), ranking
/// again when none is left. The hash is the table's: the seeds are fixed
/// (`common/seeds.rs`), so `ahash::RandomState::new()` is the table's hasher.
struct LogShadow {
    share: usize,
    wanted: usize,
    period: u64,
    hasher: ahash::RandomState,
    shards: Vec<ShardShadow>,
}

impl LogShadow {
    /// A shadow of empty shards (the probe leaves every shard empty, with no sweep
    /// made: it never fills one) for `classes`, a table of `shards` shards holding
    /// `max_keys` keys.
    fn new(classes: &Classes, shards: usize, max_keys: usize, period: u64) -> Self {
        let share = max_keys / shards;
        let hasher = ahash::RandomState::new();
        // The target's hasher is the table's: the keys of a class share their hash's
        // shard bits (its high bits, after the top one).
        let bits = shards.trailing_zeros();
        for members in &classes.members {
            let shard_of = |k: &Key| (hasher.hash_one(k) >> 1) >> (63 - bits);
            assert!(
                members.iter().all(|k| shard_of(k) == shard_of(&members[0])),
                "the target's hasher is not the table's: class {members:?} spans shards"
            );
        }
        LogShadow {
            share,
            wanted: (share / 8).max(1),
            period,
            hasher,
            shards: classes
                .members
                .iter()
                .map(|_| ShardShadow::default())
                .collect(),
        }
    }

    /// Keys held over every shard.
    fn live(&self) -> usize {
        self.shards.iter().map(|s| s.present.len()).sum()
    }

    /// `remove(key)` in class `c`: whether the shard held it.
    fn remove(&mut self, c: usize, key: Key) -> bool {
        self.shards[c].present.remove(&key)
    }

    /// A decision on `key` (class `c`) judged at `at` in operation `op`; `logged`:
    /// it logged units. A key not held is inserted, after room is made for it.
    fn decided<M: Model>(
        &mut self,
        c: usize,
        key: Key,
        at: Nanos,
        logged: bool,
        op: usize,
        models: &BTreeMap<Key, M>,
    ) -> LogRemovals {
        let mut out = LogRemovals::default();
        if !logged {
            return out;
        }
        self.shards[c].charged.insert(key, op);
        if self.shards[c].present.contains(&key) {
            return out;
        }
        let insert = Insert {
            class: c,
            at,
            op,
            models,
        };
        self.make_room(&insert, &mut out);
        self.shards[c].present.insert(key);
        out
    }

    fn weight<M: Model>(&self, models: &BTreeMap<Key, M>, key: Key, at: Nanos) -> Weight {
        let model = models
            .get(&key)
            .expect("every key the log holds has a twin");
        log_weight(model, at, self.period)
    }

    fn idle<M: Model>(models: &BTreeMap<Key, M>, key: Key, at: Nanos) -> bool {
        let model = models
            .get(&key)
            .expect("every key the log holds has a twin");
        model.log_idle(at).expect("the log's twin")
    }

    fn make_room<M: Model>(&mut self, insert: &Insert<M>, out: &mut LogRemovals) {
        let c = insert.class;
        if self.shards[c].present.len() < self.share {
            return;
        }
        if self.shards[c].credit == 0 {
            self.sweep(insert, out);
        } else {
            self.shards[c].credit -= 1;
        }
        if self.shards[c].present.len() < self.share || self.evict_ranked(insert, out) {
            return;
        }
        self.sweep(insert, out);
        if self.shards[c].present.len() >= self.share {
            self.evict_ranked(insert, out);
        }
    }

    fn sweep<M: Model>(&mut self, insert: &Insert<M>, out: &mut LogRemovals) {
        let Insert {
            class: c,
            at,
            op,
            models,
        } = *insert;
        let before = self.shards[c].present.len();
        self.shards[c]
            .present
            .retain(|&k| !Self::idle(models, k, at));
        out.reclaimed += (before - self.shards[c].present.len()) as u64;
        let hand = self.shards[c].hand;
        let mut swept: Vec<Rank> = self.shards[c]
            .present
            .iter()
            .map(|&key| Rank {
                weight: self.weight(models, key, at),
                turn: self.hasher.hash_one(key).wrapping_sub(hand),
                key,
            })
            .collect();
        swept.sort_by_key(Rank::order);
        let mut ranked: Vec<Rank> = swept.iter().take(self.wanted).copied().collect();
        ranked.reverse();
        let s = &mut self.shards[c];
        if let Some(heaviest) = ranked.first() {
            s.hand = hand.wrapping_add(heaviest.turn).wrapping_add(1);
        }
        s.credit = self.wanted;
        s.ranked = ranked;
        s.swept = swept;
        s.swept_op = op;
    }

    fn evict_ranked<M: Model>(&mut self, insert: &Insert<M>, out: &mut LogRemovals) -> bool {
        let Insert {
            class: c,
            at,
            models,
            ..
        } = *insert;
        while let Some(rank) = self.shards[c].ranked.pop() {
            if !self.shards[c].present.contains(&rank.key)
                || self.weight(models, rank.key, at) > rank.weight
            {
                continue;
            }
            self.shards[c].present.remove(&rank.key);
            if Self::idle(models, rank.key, at) {
                out.reclaimed += 1;
            } else {
                out.evicted = Some(rank.key);
            }
            return true;
        }
        false
    }

    /// Asserts the eviction contract of the log's docs for `victim`, which the table
    /// evicted live from class `c` in an insert judged at `at` (before the shadow's
    /// own choice is compared): it was among the `max(⌊share/8⌋, 1)` lightest keys of
    /// the last sweep, it is no heavier now than then (a key charged since is passed
    /// over), and every key that sweep ranked lighter has left or logged units since
    /// (else it would have been evicted first) — so no key at its limit is evicted
    /// while a lighter key of its ranking, not charged since, is still held.
    fn audit<M: Model>(&self, c: usize, victim: Key, at: Nanos, models: &BTreeMap<Key, M>) {
        let s = &self.shards[c];
        let Some(place) = s.swept.iter().position(|r| r.key == victim) else {
            panic!("evicted key {victim} was not in its shard at the last sweep");
        };
        let ranked = s.swept[place];
        assert!(
            place < self.wanted,
            "evicted key {victim} ({:?}) was not among the {} lightest of its shard's \
             last sweep: {place} keys ranked before it: {:?}",
            ranked.weight,
            self.wanted,
            &s.swept[..place.min(16)]
        );
        let now = self.weight(models, victim, at);
        assert!(
            now <= ranked.weight,
            "evicted key {victim} is heavier ({now:?}) than when ranked ({:?}): \
             charged since, it should have been passed over",
            ranked.weight
        );
        let limit = models[&victim].peek_at(at, 0).limit();
        for lighter in &s.swept[..place] {
            let since = s
                .charged
                .get(&lighter.key)
                .is_some_and(|&op| op > s.swept_op);
            assert!(
                !s.present.contains(&lighter.key) || since,
                "evicted key {victim} ({now:?} of a limit of {limit}{}) while key {}, \
                 ranked before it in the same sweep ({:?}), is still held, not charged since",
                if now.0 >= limit { ", at its limit" } else { "" },
                lighter.key,
                lighter.weight
            );
        }
    }
}
