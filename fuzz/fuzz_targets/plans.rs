//! Per-key plans (`PlanLimiter`) against one un-keyed model limiter per (plan, key),
//! and against the per-move bound of the plans docs, under adversarial traffic.
//!
//! An input builds 2–4 plans with arbitrary small policies (limit and burst 1–16, a
//! period of 1 ms to 2 s), picks the algorithm (GCRA — `new_in`, which
//! `PlanLimiter::new` is for `Heap` —, the fixed window or the sliding window counter)
//! and the storage (`Heap`, `Inline`, `Fingerprint`), the default plan, a capacity
//! of 1–6 keys per table (8–13 on 8 shards), and 1, 2, 4 or 8 shards per table (each
//! shard's own removal instant R, policy changes carried over at each shard's
//! `max(now, R)`). Six keys have models; floods check keys 6 to 255 (no model, routed
//! to the flooded plan), which push the shards of any table past their share plus
//! headroom, so that inserts evict and reclaim on every shard count. The
//! resolver reads each key's plan from an `Arc<[AtomicU8]>` that the input rewrites
//! mid-run (a move); one value stands for an id outside the plans, which resolves to
//! the default plan. Operations (three bytes each, after the header; see
//! `Op::decode`): checks and charges (also at readings up to 254 ms earlier or 256 ms
//! later than the clock, through `check`, `check_n` and `check_n_at`), peeks, a peek
//! then a check at the same reading, refunds of any earlier receipt (also on the wrong
//! key), `remove` and `reset`, `set_policy` through `&self` (GCRA) and
//! `set_policy_mut` (every algorithm; the plan's period or another, also up to 1 024
//! units per 34 minutes; also on an unknown name), moves, clock moves (forward, and
//! back by up to 408 ms: the clock is the target's, which may step back), each
//! table's `reclaim_idle`, and floods (a `reclaim_idle` byte from 192 on).
//!
//! Which shard of each plan's table a key is in is learnt before the run as the
//! `keyed` target learns it, with the hash seeds fixed (`common/seeds.rs`); R is kept
//! per (table, shard) as there. A refund is made only where the documented premise of
//! the refund guarantee holds: judged (at `max(clock, R)`) no earlier than every
//! admission of its shard (a charge read ahead of the clock, or a clock stepped back,
//! would break it), and at a known R.
//!
//! # The exact model
//!
//! Each (plan, key) has a `RateLimiter` of the plan's algorithm on a manual clock,
//! which lives on while the key is in another plan (a key moving back finds its old
//! state) and starts fresh when the key is removed. Policy changes reach it the way
//! the plan's table takes them: the windows through `RateLimiter::set_algorithm`
//! (`Algorithm::carry_over` at `max(now, R)`, which voids receipts as the table's
//! `set_algorithm` does); GCRA through a GCRA whose policy is swapped through `&self`
//! (`SwitchGcra` below: the state is kept, which is GCRA's `carry_over`, and receipts
//! stay valid, as in the plan's table, which builds its `Gcra` from the plan's cell on
//! every call). `LiveGcra` is not the model: its refund judges with the smallest `τ`
//! it ever had and gives nothing back while a later booking waits, stricter than the
//! `Gcra` refund a plan's table runs (a plan limiter books nothing).
//!
//! Every decision is compared with the model's at `max(reading, R)`, R the latest
//! instant the key's shard of the plan's table removed a key at; `peek` must equal the next check at the
//! same reading; no decision leaves more than its limit. After every operation each
//! (plan, key) of every table the operation changed is compared through `peek` of 0
//! and of 1 unit (an admission's `reset_after` tells where it would count) at the
//! clock and at R (the key routed to that plan for the peek): equal, except pairs
//! that a live eviction in that very operation dropped, which must read as fresh
//! (their model restarts).
//!
//! Refunds: the table's and the model's are made from their own receipts; a receipt
//! refunded after its key moved to another plan, on another key, or for a charge that
//! took nothing gives back nothing. The table's refund must never leave the pair more
//! permissive than the model after its own. When the two differ (the table's ledger
//! is per shard, and any removal in the shard voids its receipts) the pair leaves the
//! exact comparison (the bound below still holds it); it rejoins, with a fresh model,
//! once it reads as fresh at the clock and at R (nothing more can be lost: every later
//! decision is judged at R or after).
//!
//! # The bound (on the table, not on the model)
//!
//! The plans docs: "each move forgives at most one burst (GCRA) or one window of the
//! new plan". Each (plan, key) has a *life*, started only by its first admission in
//! that plan's table or after the pair was dropped — `remove`/`reset`, an eviction
//! (the pair read as fresh where its model did not), a pair out of the exact comparison
//! reading as fresh, or, for the windows, a
//! policy change of the plan (`carry_over` starts a window of another period fresh,
//! and clamps a count to the new limit's packing, so a cut then a raise within one
//! window forgives the units clamped away: 10 + 8 in a window of 10 after 10 → 2 →
//! 10) — never by a move. Within a life,
//! over the admissions still held (a refund that reports success drops its whole
//! charge, which only loosens the check: a refund gives back at most its own charge):
//!
//! * GCRA: `Σ cost·T ≤ t + τ − t₀` at every admission, `T` the plan's interval when
//!   each was admitted, `t` and `τ` the latest admission's judged instant and
//!   tolerance, `t₀` the life's first admission (the TAT starts at `t₀`, grows by
//!   `cost·T` per admission and never passes `t + τ`);
//! * the fixed window: no window holds more than `L` units;
//! * the sliding window counter: `⌊prev·(P − e)/P⌋ + cur ≤ L` after each admission;
//! * both windows: an admission counts in its judged instant's window or, behind the
//!   state's, in the state's — never behind the latest (`common/bounds.rs`, shared with
//!   `refunds` and `keyed`); not checked in a life a policy change started (the count
//!   carried over keeps a window that life never saw).
//!
//! So over a run a key admits at most one burst (or window) of each plan per life,
//! plus what the rate allows: a move back into a plan where the key already lives
//! forgives nothing. Overflow checks stay on in the fuzz profile: no input may panic.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use floodgate::keyed::plans::{PlanAlgorithm, PlanId, PlanLimiter, Plans, PlansError};
use floodgate::{
    Algorithm, Charged, Clock, Decision, Fingerprint, FixedWindow, Gcra, GcraState, Heap, Inline,
    KeyedBuilder, KeyedMetrics, Nanos, Policy, RateLimiter, Receipt, SlidingWindow, Storage,
};
use libfuzzer_sys::fuzz_target;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[path = "common/bounds.rs"]
mod bounds;
#[path = "common/clock.rs"]
mod clock;
#[path = "common/seeds.rs"]
mod seeds;
use bounds::{Grant, Kind, Oracle};
use clock::AnyClock;

/// Keys `0..KEYS`, each with a model; each table holds 1–6 of them (8–13 on 8
/// shards).
const KEYS: u8 = 6;
/// Keys in all: `KEYS..=255` have no model and are only checked by floods (each
/// routed to the flooded plan), enough to push every shard of an 8-shard table past
/// its share plus headroom.
const ALL_KEYS: usize = 256;
/// At most this many operations per input.
const MAX_OPS: usize = 160;
/// The largest limit and burst a plan gets.
const MAX_UNITS: u64 = 16;

/// A plan's policy in two bytes: limit and burst `1..=16` (a nibble each), a period
/// of `1..=2033` ms (small ones likelier).
#[derive(Arbitrary, Debug, Clone, Copy)]
struct Spec {
    units: u8,
    period: u8,
}

impl Spec {
    fn policy(self) -> Option<Policy> {
        let ms = u64::from(self.period) * u64::from(self.period) / 32 + 1;
        Policy::new(u64::from(self.units & 15) + 1, Duration::from_millis(ms))
            .and_then(|p| p.with_burst(u64::from(self.units >> 4) + 1))
            .ok()
    }
}

#[derive(Debug)]
enum Op {
    /// A check at a reading `back_ms` before the clock (0: `check`/`check_n`;
    /// negative: after it).
    Check {
        key: u8,
        cost: u32,
        back_ms: i16,
    },
    Peek {
        key: u8,
        cost: u32,
    },
    /// A peek and then a check at the same reading: equal decisions.
    PeekThenCheck {
        key: u8,
        cost: u32,
        back_ms: i16,
    },
    Charge {
        key: u8,
        cost: u32,
        back_ms: i16,
    },
    /// Refund an outstanding receipt (on the next key if `wrong`).
    Refund {
        pick: u8,
        wrong: bool,
    },
    Remove {
        key: u8,
        reset: bool,
    },
    /// A policy change of plan `plan` (one past the last: an unknown name), through
    /// `&self` if `shared` and the plans run GCRA; `period` `None` keeps the plan's;
    /// `wide`: limit and burst ×64 and the period ×1000 (up to 1 024 units per 34
    /// minutes).
    SetPolicy {
        plan: u8,
        units: u8,
        period: Option<u8>,
        shared: bool,
        wide: bool,
    },
    /// Moves `key` to plan `plan` (one past the last: an id outside the plans).
    Route {
        key: u8,
        plan: u8,
    },
    Advance(Duration),
    /// Sets the clock this much earlier (a clock stepped back; readings earlier than
    /// a state's are judged as the state allows).
    Rewind(Duration),
    Reclaim {
        plan: u8,
    },
    /// Checks a unit of `count + 1` keys without a model (`KEYS..=255` in turn), each
    /// routed to plan `plan` (one past the last: the default), at the clock's reading.
    Flood {
        plan: u8,
        count: u8,
    },
}

impl Op {
    /// Three bytes: the low nibble of the first picks the operation (checks, charges,
    /// refunds, moves and clock moves weigh more), its high nibble a plan or a key
    /// (8 and above: the previous operation's key, so that runs on one key are likely).
    fn decode([code, a, b]: [u8; 3], last: &mut u8) -> Op {
        let plan = code >> 4;
        let key = if plan >= 8 { *last } else { plan % KEYS };
        *last = key;
        // Mostly one unit; 255 never fits.
        let cost = match a {
            0..=127 => 1,
            255 => u32::MAX,
            x => u32::from(x) % (MAX_UNITS as u32 + 2),
        };
        // Three readings in eight are the clock's, one up to 256 ms after it, the
        // others up to 254 ms behind it.
        let back_ms = match b {
            0..=95 => 0,
            96..=127 => -8 * (i16::from(b) - 95),
            _ => i16::from(b - 127) * 2,
        };
        match code & 15 {
            0..=2 => Op::Check { key, cost, back_ms },
            3 | 4 => Op::Charge { key, cost, back_ms },
            5 => Op::Peek { key, cost },
            6 => Op::PeekThenCheck { key, cost, back_ms },
            7 | 8 => Op::Refund {
                pick: a,
                wrong: b % 8 == 7,
            },
            9 => Op::Remove {
                key,
                reset: a % 2 == 1,
            },
            10 => Op::SetPolicy {
                plan: plan & 7,
                units: a,
                period: (b >= 128).then_some(b),
                shared: b % 2 == 1,
                wide: plan >= 8,
            },
            11 | 12 => Op::Route { key, plan: a },
            13 | 14 => match b {
                240.. => Op::Advance(Duration::from_millis(u64::from(a) * 100)),
                176..=239 => Op::Rewind(Duration::from_micros(
                    u64::from(a) * 100 * (u64::from(b % 16) + 1),
                )),
                _ => Op::Advance(Duration::from_micros(
                    u64::from(a) * 100 * (u64::from(b % 16) + 1),
                )),
            },
            // One in four: a flood of `b / 4 + 1` keys.
            _ if a >= 192 => Op::Flood { plan, count: b / 4 },
            _ => Op::Reclaim { plan },
        }
    }
}

/// The input's first bytes; the rest are operations, three bytes each.
#[derive(Arbitrary, Debug)]
struct Input {
    algorithm: u8,
    storage: u8,
    plans: [Spec; 4],
    /// 2–4 plans (mod 3); 1, 2 or 4 shards per table (the high nibble, mod 3, as
    /// the power of two; at most one per key of capacity).
    count: u8,
    default: u8,
    capacity: u8,
    routes: [u8; KEYS as usize],
}

/// GCRA whose policy is swapped through `&self`: the un-keyed twin of a GCRA plan,
/// whose table builds its `Gcra` from the plan's policy cell on every call. The state
/// is kept across a swap (GCRA's `carry_over`) and receipts stay valid.
struct SwitchGcra(Mutex<Policy>);

impl SwitchGcra {
    fn gcra(&self) -> Gcra {
        Gcra::new(*self.0.lock().expect("never poisoned"))
    }
}

impl Algorithm for SwitchGcra {
    type State = GcraState;

    fn decide(&self, state: GcraState, now: Nanos, cost: u32) -> (Decision, Option<GcraState>) {
        self.gcra().decide(state, now, cost)
    }

    fn is_idle(&self, state: GcraState, now: Nanos) -> bool {
        self.gcra().is_idle(state, now)
    }

    fn refund(
        &self,
        state: GcraState,
        charge: &Charged<GcraState>,
        shift: u64,
        now: Nanos,
    ) -> Option<(GcraState, u64)> {
        self.gcra().refund(state, charge, shift, now)
    }

    fn refund_moves_later(
        &self,
        state: GcraState,
        charge: &Charged<GcraState>,
        shift: u64,
    ) -> bool {
        self.gcra().refund_moves_later(state, charge, shift)
    }
}

/// What the target needs of an algorithm: its plans' algorithm, the model's, and how
/// a policy change reaches each.
trait Flavor {
    type A: PlanAlgorithm;
    type M: Algorithm<State = <Self::A as Algorithm>::State>;
    const KIND: Kind;

    /// The model algorithm for a policy the plans' algorithm accepted.
    fn model(policy: Policy) -> Self::M;

    /// Applies a policy change to a model, as the plan's table takes it.
    fn change(model: &mut RateLimiter<Self::M, AnyClock>, policy: Policy);

    /// `set_policy` through `&self` where the algorithm has it (GCRA), else `None`.
    fn set_shared<R, S>(
        limiter: &PlanLimiter<u8, R, AnyClock, S, Self::A>,
        name: &str,
        policy: Policy,
    ) -> Option<Result<(), PlansError>>
    where
        S: Storage<u8, <Self::A as Algorithm>::State>,
    {
        let _ = (limiter, name, policy);
        None
    }
}

struct OnGcra;

impl Flavor for OnGcra {
    type A = Gcra;
    type M = SwitchGcra;
    const KIND: Kind = Kind::Gcra;

    fn model(policy: Policy) -> SwitchGcra {
        SwitchGcra(Mutex::new(policy))
    }

    fn change(model: &mut RateLimiter<SwitchGcra, AnyClock>, policy: Policy) {
        *model.algorithm().0.lock().expect("never poisoned") = policy;
    }

    fn set_shared<R, S>(
        limiter: &PlanLimiter<u8, R, AnyClock, S, Gcra>,
        name: &str,
        policy: Policy,
    ) -> Option<Result<(), PlansError>>
    where
        S: Storage<u8, GcraState>,
    {
        Some(limiter.set_policy(name, policy))
    }
}

/// A window algorithm's bound.
trait Window: PlanAlgorithm {
    const KIND: Kind;
}

impl Window for FixedWindow {
    const KIND: Kind = Kind::Fixed;
}

impl Window for SlidingWindow {
    const KIND: Kind = Kind::Sliding;
}

/// A window algorithm: the model is the algorithm itself, changed by `set_algorithm`.
struct OnWindow<W>(std::marker::PhantomData<W>);

impl<W: Window> Flavor for OnWindow<W> {
    type A = W;
    type M = W;
    const KIND: Kind = W::KIND;

    fn model(policy: Policy) -> W {
        W::for_policy(policy).expect("the plans accepted this policy")
    }

    fn change(model: &mut RateLimiter<W, AnyClock>, policy: Policy) {
        model.set_algorithm(Self::model(policy));
    }
}

fuzz_target!(|data: &[u8]| {
    seeds::fix_hash_seeds();
    let mut u = Unstructured::new(data);
    let Ok(input) = Input::arbitrary(&mut u) else {
        return;
    };
    let ops = u.take_rest();
    match (input.algorithm % 3, input.storage % 3) {
        (0, 0) => run::<OnGcra, Heap>(&input, ops),
        (0, 1) => run::<OnGcra, Inline>(&input, ops),
        (0, _) => run::<OnGcra, Fingerprint>(&input, ops),
        (1, 0) => run::<OnWindow<FixedWindow>, Heap>(&input, ops),
        (1, 1) => run::<OnWindow<FixedWindow>, Inline>(&input, ops),
        (1, _) => run::<OnWindow<FixedWindow>, Fingerprint>(&input, ops),
        (_, 0) => run::<OnWindow<SlidingWindow>, Heap>(&input, ops),
        (_, 1) => run::<OnWindow<SlidingWindow>, Inline>(&input, ops),
        _ => run::<OnWindow<SlidingWindow>, Fingerprint>(&input, ops),
    }
});

/// The reading `back_ms` before `now` (negative: after it).
fn reading(now: Nanos, back_ms: i16) -> Nanos {
    let by = u64::from(back_ms.unsigned_abs()) * 1_000_000;
    Nanos::new(if back_ms >= 0 {
        now.as_u64().saturating_sub(by)
    } else {
        now.as_u64().saturating_add(by)
    })
}

/// What the target knows of one plan's table's shards: each key's class (its shard,
/// learnt through the public API before the run, as the `keyed` target does), and
/// per class the latest removal instant known (`known`, a lower bound of the shard's
/// R), an upper bound of R (`most`: above `known` after a `reclaim_idle` that more
/// than one class may have removed in; later readings of the class are then raised
/// to it, where every possible R judges alike), and the latest instant an admission
/// of the class was judged at (a refund judged earlier would break the documented
/// premise of the refund guarantee, so none is made).
struct Shards {
    /// Every key's class (`ALL_KEYS`).
    of: Vec<usize>,
    known: Vec<Nanos>,
    most: Vec<Nanos>,
    latest: Vec<Nanos>,
}

impl Shards {
    /// The reading to decide `key` at instead of `reading` (see the type docs).
    fn raise(&self, key: u8, reading: Nanos) -> Nanos {
        let c = self.of[usize::from(key)];
        if self.known[c] < self.most[c] {
            reading.max(self.most[c])
        } else {
            reading
        }
    }

    /// The instant the table judges a raised reading of `key` at.
    fn judged(&self, key: u8, raised: Nanos) -> Nanos {
        raised.max(self.known[self.of[usize::from(key)]])
    }

    /// The instant a decision on `key` at `reading` is judged at.
    fn at(&self, key: u8, reading: Nanos) -> Nanos {
        self.judged(key, self.raise(key, reading))
    }

    /// Whether the instant a decision on `key` read at `reading` is judged at is
    /// known without raising the reading.
    fn sure(&self, key: u8, reading: Nanos) -> bool {
        let c = self.of[usize::from(key)];
        self.known[c] == self.most[c] || reading >= self.most[c]
    }

    /// The earliest instant a later decision on `key` can be judged at.
    fn floor(&self, key: u8) -> Nanos {
        self.most[self.of[usize::from(key)]]
    }

    /// A removal known to be in class `c`, judged at `at`.
    fn removed(&mut self, c: usize, at: Nanos) {
        self.known[c] = self.known[c].max(at);
        self.most[c] = self.most[c].max(at);
    }
}

/// Learns each table's shard classes: at instant `i` (ns) the `i`-th key of the
/// table, routed there, is charged a unit at reading 0, which the table judges at its
/// shard's latest removal (the instant the previous key of that shard was probed at,
/// or 0), then removed (R of that shard becomes `i`).
fn learn_shards<R, S, A>(
    limiter: &PlanLimiter<u8, R, AnyClock, S, A>,
    clock: &AnyClock,
    routes: &[AtomicU8],
    n: usize,
    shards: usize,
) -> Vec<Shards>
where
    R: Fn(&u8) -> PlanId,
    A: PlanAlgorithm,
    S: Storage<u8, A::State>,
{
    let saved: Vec<u8> = routes.iter().map(|r| r.load(Ordering::Relaxed)).collect();
    let mut instant = 0;
    let out = (0..n)
        .map(|p| {
            let mut of = vec![0; ALL_KEYS];
            let mut known: Vec<Nanos> = Vec::new();
            let mut probed_at = Vec::new();
            // One shard: every key in class 0, the keys without a model unprobed.
            let probed = if shards > 1 { u8::MAX } else { KEYS - 1 };
            for k in 0..=probed {
                routes[usize::from(k)].store(p as u8, Ordering::Relaxed);
                instant += 1;
                let at = Nanos::new(instant);
                clock.set(at);
                let (d, receipt) = limiter.charge_at(&k, Nanos::ZERO, 1);
                assert!(d.is_allowed(), "probe: fresh key {k} refused a unit: {d:?}");
                let judged = receipt.charged_at().expect("an admitted unit is charged");
                assert!(limiter.remove(&k), "probe: key {k} is not in its table");
                let class = match probed_at.iter().position(|&t| t == judged) {
                    _ if judged == Nanos::ZERO => {
                        known.push(Nanos::ZERO);
                        known.len() - 1
                    }
                    Some(i) => {
                        let class = of[i];
                        assert_eq!(
                            known[class], judged,
                            "probe: key {k} judged at {judged:?}, not its shard's latest removal"
                        );
                        class
                    }
                    None => panic!("probe: key {k} judged at {judged:?}, no removal's instant"),
                };
                known[class] = at;
                of[usize::from(k)] = class;
                probed_at.push(at);
            }
            assert!(
                known.len() <= shards,
                "probe: {} classes over {shards} shards",
                known.len()
            );
            let classes = known.len();
            Shards {
                of,
                most: known.clone(),
                known,
                latest: vec![Nanos::ZERO; classes],
            }
        })
        .collect();
    for (route, saved) in routes.iter().zip(saved) {
        route.store(saved, Ordering::Relaxed);
    }
    out
}

/// A (plan, key)'s admissions since its life started (see the module docs).
enum Life {
    /// GCRA: the judged instant of the life's first admission, the admissions held,
    /// in ns of schedule (`cost·T`) at the instant each was judged at, and the next
    /// grant's id.
    Gcra {
        start: Option<u64>,
        held: Vec<Grant>,
        next: u64,
    },
    /// The windows: the admissions held, at their window, and their bound (with where
    /// each must count: never behind the latest).
    Window(Oracle),
}

impl Life {
    /// A life under `policy` (a window's ends with the policy).
    fn new(kind: Kind, policy: Policy) -> Life {
        match kind {
            Kind::Gcra => Life::Gcra {
                start: None,
                held: Vec::new(),
                next: 0,
            },
            _ => Life::Window(Oracle::new(kind, policy)),
        }
    }

    /// Records admission `id` of `cost` judged at `t` under `policy`, decided `d`,
    /// and asserts the bound; returns the grant's id if it took anything.
    fn admit(&mut self, policy: Policy, t: u64, d: &Decision, cost: u32) -> Option<u64> {
        match self {
            Life::Window(oracle) => oracle.admit(t, None, d, cost),
            Life::Gcra { start, held, next } => {
                if !d.is_allowed() || cost == 0 {
                    return None;
                }
                let start = *start.get_or_insert(t);
                let interval = policy.interval_nanos();
                let id = *next;
                *next += 1;
                held.push(Grant {
                    id,
                    at: t,
                    cost: u64::from(cost) * interval,
                });
                let used: u128 = held.iter().map(|g| u128::from(g.cost)).sum();
                let tau = i128::from(policy.burst()) * i128::from(interval);
                let room = i128::from(t) + tau - i128::from(start);
                assert!(
                    i128::try_from(used).is_ok_and(|used| used <= room),
                    "GCRA life: {used} ns of schedule held > t {t} + τ {tau} − t₀ {start} under {policy:?}"
                );
                Some(id)
            }
        }
    }

    /// Drops grant `id` (its refund succeeded); whether it was held.
    fn release(&mut self, id: u64) -> bool {
        match self {
            Life::Window(oracle) => oracle.release(id),
            Life::Gcra { held, .. } => {
                let before = held.len();
                held.retain(|g| g.id != id);
                held.len() < before
            }
        }
    }
}

/// One (plan, key): its model, whether it is compared exactly, and its life.
struct Pair<M: Algorithm> {
    model: RateLimiter<M, AnyClock>,
    tracked: bool,
    life: Life,
}

/// An outstanding receipt: the plan and key it was charged on, the table's and the
/// model's receipts, and the grant it holds in the pair's life.
struct Held {
    plan: usize,
    key: u8,
    table: Receipt,
    model: Option<Receipt>,
    grant: Option<u64>,
}

fn removals(m: KeyedMetrics) -> u64 {
    m.reclaimed + m.evicted + m.removed
}

fn run<F, S>(input: &Input, ops: &[u8])
where
    F: Flavor,
    S: Storage<u8, <F::A as Algorithm>::State>,
{
    let n = usize::from(input.count % 3) + 2;
    let Some(mut policies) = input.plans[..n]
        .iter()
        .map(|s| s.policy())
        .collect::<Option<Vec<Policy>>>()
    else {
        return;
    };
    let names: Vec<String> = (0..n).map(|i| format!("p{i}")).collect();
    let mut plans = Plans::new();
    for (name, &policy) in names.iter().zip(&policies) {
        plans.insert(name, policy);
    }
    let default = usize::from(input.default) % n;
    plans
        .set_default(&names[default])
        .expect("one of the plans");
    let ids: Vec<PlanId> = plans.iter().map(|(id, _, _)| id).collect();
    // An id outside the plans (the fifth of a larger table): the default plan's.
    let mut bigger = Plans::new();
    for i in 0..5 {
        bigger.insert(&format!("x{i}"), policies[0]);
    }
    let mut route_ids = ids.clone();
    route_ids.push(bigger.id("x4").expect("five plans"));
    // Keys past `KEYS` start in the default plan (the id outside the plans).
    let routes: Arc<[AtomicU8]> = (0..ALL_KEYS)
        .map(|k| AtomicU8::new(input.routes.get(k).map_or(n as u8, |&r| r % (n as u8 + 1))))
        .collect();
    let resolver = {
        let (routes, route_ids) = (Arc::clone(&routes), route_ids.clone());
        move |key: &u8| route_ids[usize::from(routes[usize::from(*key)].load(Ordering::Relaxed))]
    };
    let plan_of = |key: u8| match usize::from(routes[usize::from(key)].load(Ordering::Relaxed)) {
        v if v == n => default,
        v => v,
    };
    // At 0 until the shards are learnt (at 1 to 1 024 ns), then at 100 s.
    let clock = AnyClock::default();
    // The `count` byte's high nibble: 1, 2 or 4 shards (mod 3), 8 shards at 15.
    let eight = input.count >> 4 == 15;
    let capacity = usize::from(input.capacity) % usize::from(KEYS) + if eight { 8 } else { 1 };
    // The builder's rounding: at most one shard per key of capacity.
    let shards = if eight {
        8
    } else {
        1 << ((input.count >> 4) % 3)
    }
    .min(1 << capacity.ilog2());
    let builder = KeyedBuilder::default()
        .capacity(capacity)
        .shards(shards)
        .clock(clock.clone());
    let mut limiter: PlanLimiter<u8, _, AnyClock, S, F::A> =
        match PlanLimiter::new_in(&plans, resolver, builder) {
            Ok(limiter) => limiter,
            Err(PlansError::Policy { .. }) => {
                assert!(
                    policies.iter().any(|&p| F::A::for_policy(p).is_err()),
                    "a plan the algorithm runs was refused"
                );
                return;
            }
            Err(e) => panic!("{e}"),
        };

    // The models' clock: set to the instant the table judges a refund or change at.
    let model_clock = AnyClock::default();
    let fresh = |policy: Policy| RateLimiter::with_clock(F::model(policy), model_clock.clone());
    let new_pair = |policy: Policy| Pair {
        model: fresh(policy),
        tracked: true,
        life: Life::new(F::KIND, policy),
    };
    let mut pairs: Vec<Vec<Pair<F::M>>> = policies
        .iter()
        .map(|&p| (0..KEYS).map(|_| new_pair(p)).collect())
        .collect();
    let mut receipts: Vec<Held> = Vec::new();
    // Each table's shards, learnt through the public API (removals at 1 to 1 024 ns).
    let mut shards = learn_shards(&limiter, &clock, &routes, n, shards);
    clock.set(Nanos::from_secs(100));

    // Whether each table has had keys without a model (any of them may be idle), and
    // the next such key a flood checks.
    let mut flooded = vec![false; n];
    let mut cursor = 0;
    let mut last = 0;
    let ops = ops
        .chunks_exact(3)
        .take(MAX_OPS)
        .map(|c| Op::decode([c[0], c[1], c[2]], &mut last));
    for op in ops {
        let before: Vec<KeyedMetrics> = ids.iter().map(|&id| limiter.table(id).metrics()).collect();
        let now = clock.now();
        // The table, class and judged instant of a decision that may insert (and so
        // reclaim or evict in its shard).
        let mut insert: Option<(usize, usize, Nanos)> = None;
        // The tables this operation may have changed beyond their counters.
        let mut touched = vec![false; n];
        match op {
            Op::Check { key, cost, back_ms }
            | Op::PeekThenCheck { key, cost, back_ms }
            | Op::Charge { key, cost, back_ms } => {
                let (k, c) = (key, cost);
                let p = plan_of(k);
                let r = shards[p].raise(k, reading(now, back_ms));
                let t = shards[p].judged(k, r);
                // The clock's own reading (`check`, `charge`) unless raised.
                let back_ms = if r == now {
                    back_ms.max(0)
                } else {
                    back_ms.min(-1)
                };
                let class = shards[p].of[usize::from(k)];
                insert = Some((p, class, t));
                let pair = &mut pairs[p][usize::from(k)];
                let (got, want, receipts_of) = match op {
                    Op::Charge { .. } => {
                        let (got, receipt) = if back_ms == 0 {
                            limiter.charge(&k, c)
                        } else {
                            limiter.charge_at(&k, r, c)
                        };
                        let (want, theirs) = pair.model.charge_at(t, c);
                        (got, want, Some((receipt, theirs)))
                    }
                    Op::PeekThenCheck { .. } => {
                        let peeked = limiter.peek_at(&k, r, c);
                        let got = limiter.check_n_at(&k, r, c);
                        assert_eq!(peeked, got, "peek then check {k} cost {c} at {r:?}");
                        (got, pair.model.check_n_at(t, c), None)
                    }
                    _ => {
                        let got = match (back_ms, c) {
                            (0, 1) => limiter.check(&k),
                            (0, _) => limiter.check_n(&k, c),
                            _ => limiter.check_n_at(&k, r, c),
                        };
                        (got, pair.model.check_n_at(t, c), None)
                    }
                };
                if pair.tracked {
                    assert_eq!(
                        got, want,
                        "{op:?} on plan {p} read at {r:?}, judged at {t:?}"
                    );
                }
                // What is left never passes the plan's limit (GCRA: its burst).
                assert!(got.remaining() <= got.limit(), "{op:?}: {got:?}");
                let grant = pair.life.admit(policies[p], t.as_u64(), &got, c);
                if got.is_allowed() && c > 0 {
                    shards[p].latest[class] = shards[p].latest[class].max(t);
                }
                if let Some((table, theirs)) = receipts_of {
                    receipts.push(Held {
                        plan: p,
                        key: k,
                        table,
                        model: Some(theirs),
                        grant,
                    });
                }
            }
            Op::Peek { key, cost } => {
                let (k, c) = (key, cost);
                let p = plan_of(k);
                let pair = &pairs[p][usize::from(k)];
                let r = shards[p].raise(k, now);
                let got = if r == now {
                    limiter.peek(&k, c)
                } else {
                    limiter.peek_at(&k, r, c)
                };
                if pair.tracked {
                    let want = pair.model.peek_at(shards[p].judged(k, r), c);
                    assert_eq!(got, want, "peek {k} cost {c} on plan {p} at {now:?}");
                }
            }
            Op::Refund { pick, wrong } => {
                let i = usize::from(pick) % receipts.len().max(1);
                // The key the receipt would be refunded on, its table, and the
                // instant the table judges the refund at (the clock's reading).
                let target = receipts.get(i).map(|h| {
                    let on = if wrong { (h.key + 1) % KEYS } else { h.key };
                    let p = plan_of(on);
                    (on, p, shards[p].at(on, now))
                });
                // Only refunds the documented premise covers: judged no earlier than
                // every admission of the shard, at a known instant.
                let premise = target.is_some_and(|(on, p, t)| {
                    shards[p].sure(on, now) && t >= shards[p].latest[shards[p].of[usize::from(on)]]
                });
                if premise {
                    let h = receipts.swap_remove(i);
                    let (on, p, t) = target.expect("a receipt");
                    touched[p] = true;
                    model_clock.set(t);
                    let back = limiter.refund(&on, h.table);
                    match h.grant {
                        Some(grant) if !wrong && p == h.plan => {
                            let pair = &mut pairs[p][usize::from(on)];
                            if back {
                                assert!(
                                    pair.life.release(grant),
                                    "a refund gave back a charge its pair no longer holds"
                                );
                            }
                            let model_back = h.model.is_some_and(|r| pair.model.refund(r));
                            if pair.tracked {
                                refund_never_looser(&limiter, pair, on, t);
                                if back != model_back
                                    || probe(|c| limiter.peek_at(&on, t, c)) != probe(|c| pair.model.peek_at(t, c))
                                {
                                    pair.tracked = false;
                                }
                            }
                        }
                        _ => assert!(
                            !back,
                            "a receipt gave back on key {on} (plan {p}) for {} (plan {}), grant {:?}",
                            h.key, h.plan, h.grant
                        ),
                    }
                }
            }
            Op::Remove { key, reset } => {
                let k = key;
                let live = (0..n).any(|p| {
                    let pair = &pairs[p][usize::from(k)];
                    let t = shards[p].at(k, now);
                    pair.tracked
                        && probe(|c| pair.model.peek_at(t, c))
                            != probe(|c| fresh(policies[p]).peek_at(t, c))
                });
                let removed = if reset {
                    limiter.reset(&k)
                } else {
                    limiter.remove(&k)
                };
                assert!(removed || !live, "key {k} had state and no entry to remove");
                touched.fill(true);
                for p in 0..n {
                    let m = limiter.table(ids[p]).metrics();
                    if removals(m) > removals(before[p]) {
                        // In the key's shard, at the clock's reading.
                        assert_eq!(m.removed, before[p].removed + 1, "plan {p}: {m:?}");
                        let c = shards[p].of[usize::from(k)];
                        shards[p].removed(c, now);
                    }
                }
                for p in 0..n {
                    drop_pair(
                        &mut pairs[p][usize::from(k)],
                        &mut receipts,
                        p,
                        k,
                        new_pair(policies[p]),
                    );
                }
            }
            Op::SetPolicy {
                plan,
                units,
                period,
                shared,
                wide,
            } => {
                let idx = usize::from(plan) % (n + 1);
                // The plan's period unless the operation names one.
                let plan_ns = policies[idx.min(n - 1)].period_nanos();
                let scale = if wide { 64 } else { 1 };
                let period_ns = match period {
                    Some(b) => {
                        let ms = u64::from(b) * u64::from(b) / 32 + 1;
                        ms * 1_000_000 * if wide { 1_000 } else { 1 }
                    }
                    None => plan_ns,
                };
                let policy = Policy::new(
                    (u64::from(units & 15) + 1) * scale,
                    Duration::from_nanos(period_ns),
                )
                .and_then(|p| p.with_burst((u64::from(units >> 4) + 1) * scale))
                .ok();
                if let Some(policy) = policy {
                    let name = names.get(idx).map_or("nobody", String::as_str);
                    let result = match shared.then(|| F::set_shared(&limiter, name, policy)) {
                        Some(Some(result)) => result,
                        _ => limiter.set_policy_mut(name, policy),
                    };
                    if idx == n {
                        assert!(
                            matches!(result, Err(PlansError::UnknownPlan { .. })),
                            "{result:?}"
                        );
                    } else {
                        let accepted = F::A::for_policy(policy).is_ok();
                        assert_eq!(result.is_ok(), accepted, "{result:?} for {policy:?}");
                        if accepted {
                            touched[idx] = true;
                            policies[idx] = policy;
                            for (k, pair) in pairs[idx].iter_mut().enumerate() {
                                let k = k as u8;
                                // Each shard carries its keys over at max(now, R).
                                model_clock.set(shards[idx].at(k, now));
                                if F::KIND != Kind::Gcra && !shards[idx].sure(k, now) {
                                    // At an instant not known: held to the bounds
                                    // until it reads as fresh.
                                    pair.tracked = false;
                                }
                                F::change(&mut pair.model, policy);
                                if F::KIND != Kind::Gcra {
                                    // A window change may forgive (see the module docs).
                                    let mut oracle = Oracle::new(F::KIND, policy);
                                    // A count carried over keeps its window, which
                                    // the new life never saw: where an admission
                                    // counts is no longer checked in it.
                                    oracle.contract = false;
                                    pair.life = Life::Window(oracle);
                                }
                            }
                        }
                        assert_eq!(limiter.policy(name), Some(policies[idx]));
                        assert_eq!(limiter.table(ids[idx]).policy(), policies[idx]);
                    }
                }
            }
            Op::Flood { plan, count } => {
                let p = match usize::from(plan) % (n + 1) {
                    i if i == n => default,
                    i => i,
                };
                flooded[p] = true;
                touched[p] = true;
                for _ in 0..=count {
                    let k = KEYS + cursor % (u8::MAX - KEYS + 1);
                    cursor = (cursor + 1) % (u8::MAX - KEYS + 1);
                    routes[usize::from(k)].store(plan % (n as u8 + 1), Ordering::Relaxed);
                    let r = shards[p].raise(k, now);
                    let t = shards[p].judged(k, r);
                    let m = limiter.table(ids[p]).metrics();
                    let _ = limiter.check_n_at(&k, r, 1);
                    if removals(limiter.table(ids[p]).metrics()) > removals(m) {
                        // Its reclamation or eviction: in its shard, at its instant.
                        let c = shards[p].of[usize::from(k)];
                        shards[p].removed(c, t);
                    }
                }
            }
            Op::Route { key, plan } => {
                routes[usize::from(key)].store(plan % (n as u8 + 1), Ordering::Relaxed);
            }
            Op::Advance(by) => {
                clock.advance(by);
            }
            Op::Rewind(by) => {
                clock.set(Nanos::new(
                    now.as_u64().saturating_sub(by.as_nanos() as u64),
                ));
            }
            Op::Reclaim { plan } => {
                let i = usize::from(plan) % (n + 1);
                let p = if i == n { default } else { i };
                let id = route_ids[i];
                let gone = limiter.table(id).reclaim_idle();
                if gone > 0 {
                    // In the shards of the keys that may be idle, at the clock's
                    // reading: where more than one class may have removed, R is known
                    // only to lie below max(R, now).
                    let blank = fresh(policies[p]);
                    let mut hit: Vec<usize> = (0..KEYS)
                        .filter(|&k| {
                            let pair = &pairs[p][usize::from(k)];
                            let t = shards[p].at(k, now);
                            !pair.tracked
                                || probe(|c| pair.model.peek_at(t, c))
                                    == probe(|c| blank.peek_at(t, c))
                        })
                        .chain((KEYS..=u8::MAX).filter(|_| flooded[p]))
                        .map(|k| shards[p].of[usize::from(k)])
                        .collect();
                    hit.sort_unstable();
                    hit.dedup();
                    assert!(
                        !hit.is_empty(),
                        "plan {p}: {gone} reclaimed, no key may be idle"
                    );
                    if let [c] = hit[..] {
                        shards[p].removed(c, now);
                    } else {
                        for c in hit {
                            shards[p].most[c] = shards[p].most[c].max(now);
                        }
                    }
                }
            }
        }

        // Every pair of every table this operation changed, routed to its plan for
        // the peeks (a table it left alone holds what it held, and is compared again
        // once an operation reaches it).
        let mut total = KeyedMetrics::default();
        for p in 0..n {
            let table = limiter.table(ids[p]);
            let m = table.metrics();
            assert!(m.live_keys as usize <= table.max_keys(), "plan {p}: {m:?}");
            total.allowed += m.allowed;
            total.denied += m.denied;
            total.live_keys += m.live_keys;
            total.reclaimed += m.reclaimed;
            total.evicted += m.evicted;
            total.removed += m.removed;
            if let Some((q, c, t)) = insert.filter(|&(q, ..)| q == p) {
                if removals(m) > removals(before[q]) {
                    // An insert's reclamation or eviction: in its shard, at its instant.
                    shards[q].removed(c, t);
                }
            }
            if !touched[p] && m == before[p] {
                continue;
            }
            let mut evicted_now = m.evicted - before[p].evicted;
            let blank = fresh(policies[p]);
            for k in 0..KEYS {
                let route = routes[usize::from(k)].swap(p as u8, Ordering::Relaxed);
                let pair = &mut pairs[p][usize::from(k)];
                let r = shards[p].floor(k);
                let at = clock.now().max(r);
                // Now, and at the earliest instant a later operation can be judged at
                // (a pair evicted here may read as idle now only).
                let instants: &[Nanos] = if r < at { &[at, r] } else { &[at] };
                let reads_fresh = || {
                    instants.iter().all(|&t| {
                        probe(|c| limiter.peek_at(&k, t, c)) == probe(|c| blank.peek_at(t, c))
                    })
                };
                let dropped = if pair.tracked {
                    let differs = instants.iter().find(|&&t| {
                        probe(|c| limiter.peek_at(&k, t, c)) != probe(|c| pair.model.peek_at(t, c))
                    });
                    if let Some(&t) = differs {
                        assert!(
                            reads_fresh(),
                            "plan {p} key {k} was not dropped cleanly: table {:?} vs model {:?} at {t:?}",
                            probe(|c| limiter.peek_at(&k, t, c)),
                            probe(|c| pair.model.peek_at(t, c))
                        );
                        // Only a live eviction in this operation may explain it.
                        assert!(evicted_now > 0, "plan {p} key {k} lost its state");
                        evicted_now -= 1;
                    }
                    differs.is_some()
                } else {
                    // Fresh at both instants: nothing more can be lost, compare again.
                    reads_fresh()
                };
                if dropped {
                    drop_pair(pair, &mut receipts, p, k, new_pair(policies[p]));
                }
                routes[usize::from(k)].store(route, Ordering::Relaxed);
            }
        }
        assert_eq!(limiter.metrics(), total);
    }
    if std::env::var_os("PLANS_STATS").is_some() {
        // What a corpus reaches: `PLANS_STATS=1 plans -runs=0 corpus/plans`.
        let m = limiter.metrics();
        eprintln!(
            "stats: {:?} shards {} flooded {} evicted {} reclaimed {} removed {}",
            F::KIND,
            limiter.table(ids[0]).shards(),
            flooded.iter().any(|&f| f),
            m.evicted,
            m.reclaimed,
            m.removed
        );
    }
}

/// What a pair shows at an instant: its decisions for 0 and 1 unit (a peek of 0 alone
/// does not tell a sliding counter's emptied window ahead of the instant from a fresh
/// state; an admission's `reset_after` does).
fn probe(peek: impl Fn(u32) -> Decision) -> [Decision; 2] {
    [peek(0), peek(1)]
}

/// After a refund: the table's pair is never more permissive than its model after
/// the model's own refund, for any cost, and has no more left.
fn refund_never_looser<R, S, A, M>(
    limiter: &PlanLimiter<u8, R, AnyClock, S, A>,
    pair: &Pair<M>,
    key: u8,
    at: Nanos,
) where
    R: Fn(&u8) -> PlanId,
    A: PlanAlgorithm,
    S: Storage<u8, A::State>,
    M: Algorithm,
{
    for cost in 0..=MAX_UNITS as u32 + 1 {
        let (t, w) = (
            limiter.peek_at(&key, at, cost),
            pair.model.peek_at(at, cost),
        );
        assert!(
            !t.is_allowed() || w.is_allowed(),
            "refund {key}: table {t:?} vs model {w:?}"
        );
    }
    let (t, w) = (limiter.peek_at(&key, at, 0), pair.model.peek_at(at, 0));
    assert!(
        t.remaining() <= w.remaining(),
        "refund {key}: table {t:?} vs model {w:?}"
    );
}

/// Starts pair (`plan`, `key`) over as `fresh` (a fresh model, compared exactly, a
/// new life); its outstanding model receipts are void (the table's are, by the
/// removal).
fn drop_pair<M: Algorithm>(
    pair: &mut Pair<M>,
    receipts: &mut [Held],
    plan: usize,
    key: u8,
    fresh: Pair<M>,
) {
    *pair = fresh;
    for h in receipts
        .iter_mut()
        .filter(|h| h.plan == plan && h.key == key)
    {
        h.model = None;
    }
}
