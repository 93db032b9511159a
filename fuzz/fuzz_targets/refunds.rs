//! "No sequence of charges and refunds admits beyond any single limit", single-threaded
//! with arbitrary interleavings: charges at stale readings (a thread that read the
//! clock, stalled, then decided), bookings and reservations, refunds and cancellations
//! of any earlier receipt (and of another limit's or key's, which must give back
//! nothing), clock moves, and for the keyed table removals and reclamation.
//!
//! One input drives one system: GCRA on the atomic cell and on the mutex twin,
//! `LiveGcra` with its burst flipped at runtime, a token bucket, the fixed window and
//! the sliding window counter (both cells), the sliding log, the shaper (both cells),
//! a `KeyedLimiter` of four keys in one shard (`Heap`, `Inline`, `Fingerprint`), or a
//! `check_all` composite of two limits that are also charged and refunded directly:
//! two direct limits, or a key of a keyed table with a direct limit or a second key of
//! the same table, in either order, among removals, `reclaim_idle` and floods of
//! untracked keys that evict. The keyed table is a `KeyedLimiter` of GCRA, the fixed
//! window or the sliding window counter (any storage), a `KeyedSlidingLog`, or a
//! one-plan `PlanLimiter` of GCRA or either window (its keys as `PlanLimit`s); 1 to 8
//! shards, a small capacity. The composite's receipts (each limit's, kept by a wrapper
//! that hands `check_all` a stand-in) are refunded later like any other; a denied
//! composite must have rolled back every admission it took. Keyed decisions are judged
//! at `max(reading, R)`, R the shard's latest removal instant, each key's shard learnt
//! by a probe as the `keyed` target learns it (see `composite`).
//!
//! The clock is the target's (`common/clock.rs`): it moves forward, and now and then
//! steps back. A decision's reading is the clock less an arbitrary lag (a thread that
//! read the clock, stalled, then decided), or now and then ahead of it (an instant
//! passed to a `*_at` method, a core whose clock runs ahead). Every refund reads the
//! limit's clock. A refund is exact only under the premise of the `Clock` docs: every
//! admission it sees was read no later than the refund (at `max(clock, R)` on a keyed
//! table). Where readings run ahead of the clock or the clock steps back that premise
//! can fail, which is a documented limitation (`keyed_adversarial`'s ignored tests), so
//! the target refunds only where it holds: each limit (each shard of a keyed table)
//! keeps the latest instant any of its decisions was judged at, and a receipt whose
//! refund would be judged earlier, or at a keyed R not known exactly, waits (a later
//! refund may take it). A composite's rollback is held back the same way: the wrapper
//! notes that `check_all` asked for it and keeps the receipt for later. After every
//! admission the bound of its algorithm is asserted over the admissions still held
//! (not given back by a refund or cancellation that reported success — dropping a
//! partially refunded charge only loosens the check):
//!
//! * GCRA and everything built on it: the held admissions, replayed at their readings
//!   (a booking or reservation: at its slot; keyed: at `max(reading, R)`) on a fresh
//!   GCRA of the policy, all conform;
//! * the fixed window: no window holds more than `L` units;
//! * the sliding window counter: the admission's estimate over the held units,
//!   `⌊prev·(P − e)/P⌋ + cur`, is at most `L`;
//! * the sliding log: no span of `P` holds more than `L` units.
//!
//! The instant a window or log admission counts at is read from its decision
//! (`reset_after`), checked against where the contract says it must be (never behind
//! the latest admission's window or logged instant).
#![no_main]

use arbitrary::Arbitrary;
use floodgate::keyed::composite::{check_all, Limit};
use floodgate::keyed::plans::{PlanAlgorithm, PlanId, PlanLimiter, Plans};
use floodgate::{
    Algorithm, Clock, Decision, Fingerprint, FixedWindow, Gcra, GcraState, Heap, Inline,
    KeyedBuilder, KeyedLimiter, KeyedMetrics, KeyedSlidingLog, LiveGcra, LockedCell, ManualClock,
    Nanos, Policy, RateLimiter, Receipt, Reservation, Shaper, SlidingLog, SlidingWindow, Storage,
};
use libfuzzer_sys::fuzz_target;

#[path = "common/bounds.rs"]
mod bounds;
#[path = "common/clock.rs"]
mod clock;
#[path = "common/probe.rs"]
mod probe;
#[path = "common/seeds.rs"]
mod seeds;
use bounds::{Kind, Oracle};
use clock::AnyClock;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// At most this many operations per input (the checks are quadratic in the worst case).
const MAX_OPS: usize = 256;
/// Keys of the keyed system (all in one shard, below its capacity: none is evicted).
const KEYS: u8 = 4;

#[derive(Arbitrary, Debug)]
enum Op {
    /// Charge `cost` on `target` at a reading `stale` ns behind the clock (from
    /// `0xF000` on, ahead of it: [`reading`]).
    Charge { target: u8, cost: u8, stale: u16 },
    /// Book `cost` at the earliest slot (GCRA front ends; others: a charge).
    Book { target: u8, cost: u8, stale: u16 },
    /// Reserve within `max_delay` ns (the shaper; others: a booking).
    Reserve {
        target: u8,
        cost: u8,
        stale: u16,
        max_delay: u16,
    },
    /// Refund (or cancel) an outstanding receipt, at the clock's reading.
    Refund { pick: u8 },
    /// Refund an outstanding receipt on another limit or key: nothing comes back.
    Misdirect { pick: u8 },
    /// Moves the clock on by this many ns; from `0xF000` on, steps it back
    /// ([`advance`]).
    Advance(u16),
    /// Keyed: remove a key (forgives it, voids the shard's receipts).
    Remove { key: u8 },
    /// Keyed: reclaim idle keys (loses nothing).
    Reclaim,
    /// `LiveGcra`: switch between the two bursts.
    Flip,
}

#[derive(Arbitrary, Debug)]
struct Input {
    system: u8,
    /// The limit (mod 8, plus 1); bit 4: the composite's keyed table is of the keyed
    /// slot's kind rather than GCRA (see [`composite`]).
    limit: u8,
    period: u16,
    burst: u8,
    /// `LiveGcra`'s other burst; the composite's second limit.
    other: u8,
    /// The composite's kinds of limit.
    pair: u8,
    start: u32,
    ops: Vec<Op>,
}

/// What gives a grant back.
enum Token {
    Receipt(Receipt),
    Reservation(Reservation),
}

/// An outstanding receipt: which limit (or key) issued it, the grant it holds, and
/// the keyed removal count when it was taken.
struct Handle {
    unit: usize,
    grant: Option<u64>,
    removals: u64,
    token: Token,
}

fuzz_target!(|input: Input| {
    // Multi-shard keyed tables spread keys alike in every process.
    seeds::fix_hash_seeds();
    let limit = u64::from(input.limit % 8) + 1;
    let period = u64::from(input.period) + 1;
    let burst = u64::from(input.burst % 8) + 1;
    let Ok(policy) =
        Policy::new(limit, Duration::from_nanos(period)).and_then(|p| p.with_burst(burst))
    else {
        return;
    };
    let other = u64::from(input.other % 8) + 1;
    let clock = AnyClock::default();
    clock.set(Nanos::new(u64::from(input.start)));
    let ops = &input.ops[..input.ops.len().min(MAX_OPS)];
    match input.system % 15 {
        0 => direct(
            &RateLimiter::gcra_with_clock(policy, clock.clone()),
            Kind::Gcra,
            policy,
            &clock,
            ops,
        ),
        1 => direct(
            &RateLimiter::locked_with_clock(Gcra::new(policy), clock.clone()),
            Kind::Gcra,
            policy,
            &clock,
            ops,
        ),
        2 => live(policy, other, &clock, ops),
        3 => {
            // `limit` tokens every `period`, `burst` held: T rounded up.
            let Ok(bucket) = Gcra::token_bucket(burst, limit, Duration::from_nanos(period)) else {
                return;
            };
            let limiter = RateLimiter::with_clock(bucket, clock.clone());
            direct(&limiter, Kind::Gcra, bucket.policy(), &clock, ops);
        }
        4 | 5 => {
            if let Ok(w) = FixedWindow::new(policy) {
                on_cell(w, input.system % 15 == 5, Kind::Fixed, policy, &clock, ops);
            }
        }
        6 | 7 => {
            if let Ok(w) = SlidingWindow::new(policy) {
                on_cell(
                    w,
                    input.system % 15 == 7,
                    Kind::Sliding,
                    policy,
                    &clock,
                    ops,
                );
            }
        }
        8 => direct(
            &SlidingLog::with_clock(policy, clock.clone()),
            Kind::Log,
            policy,
            &clock,
            ops,
        ),
        9 => shaper(
            &Shaper::with_clock(policy, clock.clone()),
            policy,
            &clock,
            ops,
        ),
        10 => shaper(
            &Shaper::locked_with_clock(policy, clock.clone()),
            policy,
            &clock,
            ops,
        ),
        11 => keyed::<Heap>(policy, &clock, ops),
        12 => keyed::<Inline>(policy, &clock, ops),
        13 => keyed::<Fingerprint>(policy, &clock, ops),
        _ => {
            let Ok(second) = Policy::new(other, Duration::from_nanos(period)) else {
                return;
            };
            let _ = composite(policy, second, &input, input.start, ops);
        }
    }
    if std::env::var_os("REFUNDS_STATS").is_some() {
        eprintln!(
            "refunds made {} waited (premise) {} (this process so far)",
            REFUNDS[0].load(Ordering::Relaxed),
            REFUNDS[1].load(Ordering::Relaxed)
        );
    }
});

/// What a run reached (`REFUNDS_STATS=1` prints it): refunds made, and refunds that
/// waited because their premise failed.
static REFUNDS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// The reading a decision is made at: `stale` ns behind the clock, or, from `0xF000`
/// on (one reading in sixteen), `16·(stale & 0xFFF)` ns ahead of it (up to 65 520 ns,
/// as far as the longest lag). Below `0xF000` a seed reads as it did before readings
/// ran ahead.
fn reading(clock: &AnyClock, stale: u16) -> Nanos {
    let now = clock.now().as_u64();
    Nanos::new(if stale >= 0xF000 {
        now.saturating_add(16 * u64::from(stale & 0xFFF))
    } else {
        now.saturating_sub(u64::from(stale))
    })
}

/// Moves the clock on by `d` ns, or, from `0xF000` on, back by `16·(d & 0xFFF)` ns (an
/// NTP step, another core's clock).
fn advance(clock: &AnyClock, d: u16) {
    let now = clock.now().as_u64();
    clock.set(Nanos::new(if d >= 0xF000 {
        now.saturating_sub(16 * u64::from(d & 0xFFF))
    } else {
        now.saturating_add(u64::from(d))
    }));
}

/// The refund premise of one limit (or one shard of a keyed table): the latest instant
/// any of its decisions was judged at.
#[derive(Clone, Copy, Debug)]
struct Premise(Nanos);

impl Premise {
    const NONE: Premise = Premise(Nanos::ZERO);

    fn saw(&mut self, judged: Nanos) {
        self.0 = self.0.max(judged);
    }

    /// Whether a refund judged at `at` sees no admission read later.
    fn holds(self, at: Nanos) -> bool {
        at >= self.0
    }
}

/// Takes out the receipt `pick` names where `ready` (a refund whose premise holds, or
/// one that cannot give anything back); else it waits.
fn take(receipts: &mut Vec<Handle>, pick: u8, ready: bool) -> Option<Handle> {
    if receipts.is_empty() {
        return None;
    }
    REFUNDS[usize::from(!ready)].fetch_add(1, Ordering::Relaxed);
    ready.then(|| receipts.swap_remove(usize::from(pick) % receipts.len()))
}

/// A cost: 0 to `L + 1`, and now and then `u32::MAX` (never fits).
fn cost_of(cost: u8, limit: u64) -> u32 {
    if cost == u8::MAX {
        u32::MAX
    } else {
        (u64::from(cost) % (limit + 2)) as u32
    }
}

/// Charges (or books) on `limit` at `at`, records the admission in `oracle`, and
/// returns the handle of its receipt.
fn charge(
    limit: &dyn Limit,
    oracle: &mut Oracle,
    unit: usize,
    at: Nanos,
    judged: Nanos,
    cost: u32,
    book: bool,
) -> Handle {
    let booked = if book { limit.book_at(at, cost) } else { None };
    let (grant, token) = match booked {
        Some((d, delay, receipt)) => {
            // The delay runs from the reading the booking was made at.
            let slot = at.saturating_add(delay).as_u64();
            (oracle.admit(judged.as_u64(), Some(slot), &d, cost), receipt)
        }
        None => {
            let (d, receipt) = limit.charge_at(at, cost);
            (oracle.admit(judged.as_u64(), None, &d, cost), receipt)
        }
    };
    Handle {
        unit,
        grant,
        removals: 0,
        token: Token::Receipt(token),
    }
}

/// Settles a refund (or cancellation) of `handle` on its own limit that reported
/// `back`: a grant given back is no longer held; what took nothing gives nothing back.
fn settle(oracle: &mut Oracle, grant: Option<u64>, back: bool) {
    match grant {
        Some(id) if back => {
            assert!(
                oracle.release(id),
                "a refund gave back a grant no longer held"
            );
        }
        None => assert!(
            !back,
            "a refund of a charge that took nothing gave something back"
        ),
        Some(_) => {}
    }
}

/// One direct limiter: charges, bookings, refunds, misdirected refunds (to a fresh
/// limiter of the same kind: nothing comes back) and clock moves.
/// `algorithm` on the lock-free cell, or on its mutex twin if `locked`.
fn on_cell<A>(algorithm: A, locked: bool, kind: Kind, policy: Policy, clock: &AnyClock, ops: &[Op])
where
    A: Algorithm,
    RateLimiter<A, AnyClock>: Limit,
    RateLimiter<A, AnyClock, LockedCell<A::State>>: Limit,
{
    if locked {
        direct(
            &RateLimiter::locked_with_clock(algorithm, clock.clone()),
            kind,
            policy,
            clock,
            ops,
        );
    } else {
        direct(
            &RateLimiter::with_clock(algorithm, clock.clone()),
            kind,
            policy,
            clock,
            ops,
        );
    }
}

fn direct<L: Limit>(limit: &L, kind: Kind, policy: Policy, clock: &AnyClock, ops: &[Op]) {
    let mut oracle = Oracle::new(kind, policy);
    let mut receipts: Vec<Handle> = Vec::new();
    let mut premise = Premise::NONE;
    for op in ops {
        match *op {
            Op::Charge { cost, stale, .. }
            | Op::Book { cost, stale, .. }
            | Op::Reserve { cost, stale, .. } => {
                let at = reading(clock, stale);
                premise.saw(at);
                let book = !matches!(op, Op::Charge { .. });
                let cost = cost_of(cost, oracle.limit.max(policy.burst()));
                receipts.push(charge(limit, &mut oracle, 0, at, at, cost, book));
            }
            Op::Refund { pick } | Op::Misdirect { pick } => {
                // A misdirected refund goes to a stranger: nothing can come back.
                let ready = matches!(op, Op::Misdirect { .. }) || premise.holds(clock.now());
                let Some(h) = take(&mut receipts, pick, ready) else {
                    continue;
                };
                let Token::Receipt(receipt) = h.token else {
                    unreachable!("direct limits issue receipts only")
                };
                if matches!(op, Op::Refund { .. }) {
                    let back = limit.refund(receipt);
                    settle(&mut oracle, h.grant, back);
                } else {
                    let stranger = RateLimiter::gcra_with_clock(policy, clock.clone());
                    assert!(
                        !stranger.refund(receipt),
                        "another limiter's receipt gave something back"
                    );
                }
            }
            Op::Advance(d) => advance(clock, d),
            Op::Remove { .. } | Op::Reclaim | Op::Flip => {}
        }
    }
}

/// `LiveGcra` whose burst flips between `policy`'s and `other`: the held admissions
/// conform to the larger burst (the same `T`, the largest `τ`).
fn live(policy: Policy, other: u64, clock: &AnyClock, ops: &[Op]) {
    let Ok(alt) = policy.with_burst(other) else {
        return;
    };
    let generous = if alt.burst() > policy.burst() {
        alt
    } else {
        policy
    };
    let limiter = RateLimiter::with_clock(LiveGcra::new(policy), clock.clone());
    let mut oracle = Oracle::new(Kind::Gcra, generous);
    let mut receipts: Vec<Handle> = Vec::new();
    let mut premise = Premise::NONE;
    let mut flipped = false;
    for op in ops {
        match *op {
            Op::Flip => {
                flipped = !flipped;
                limiter
                    .algorithm()
                    .set_policy(if flipped { alt } else { policy });
            }
            Op::Charge { cost, stale, .. }
            | Op::Book { cost, stale, .. }
            | Op::Reserve { cost, stale, .. } => {
                let at = reading(clock, stale);
                premise.saw(at);
                let book = !matches!(op, Op::Charge { .. });
                let cost = cost_of(cost, generous.burst());
                receipts.push(charge(&limiter, &mut oracle, 0, at, at, cost, book));
            }
            Op::Refund { pick } | Op::Misdirect { pick } => {
                let Some(h) = take(&mut receipts, pick, premise.holds(clock.now())) else {
                    continue;
                };
                let Token::Receipt(receipt) = h.token else {
                    unreachable!()
                };
                let back = limiter.refund(receipt);
                settle(&mut oracle, h.grant, back);
            }
            Op::Advance(d) => advance(clock, d),
            Op::Remove { .. } | Op::Reclaim => {}
        }
    }
}

/// The shaper: immediate charges, bookings (held at their slot, refunded by GCRA's
/// rule) and reservations within a `max_delay` (held at their slot, cancelled by
/// `cancel`, which gives back a count of units: any is taken as the whole grant; or,
/// granted with no delay, kept as their charge's receipt and refunded).
fn shaper<S: floodgate::StateCell<GcraState>>(
    shaper: &Shaper<AnyClock, S>,
    policy: Policy,
    clock: &AnyClock,
    ops: &[Op],
) {
    let mut oracle = Oracle::new(Kind::Gcra, policy);
    let mut receipts: Vec<Handle> = Vec::new();
    let mut premise = Premise::NONE;
    for op in ops {
        match *op {
            Op::Charge { cost, stale, .. } | Op::Book { cost, stale, .. } => {
                let at = reading(clock, stale);
                premise.saw(at);
                let book = matches!(op, Op::Book { .. });
                let cost = cost_of(cost, policy.burst());
                receipts.push(charge(shaper, &mut oracle, 0, at, at, cost, book));
            }
            Op::Reserve {
                target,
                cost,
                stale,
                max_delay,
            } => {
                let at = reading(clock, stale);
                premise.saw(at);
                let cost = cost_of(cost, policy.burst());
                let max_delay = Duration::from_nanos(u64::from(max_delay));
                if let Ok(r) = shaper.reserve_at(at, cost, max_delay) {
                    assert!(r.ready_at() >= at && r.ready_at() <= at.saturating_add(max_delay));
                    let grant = oracle.admit(
                        at.as_u64(),
                        Some(r.ready_at().as_u64()),
                        &r.decision(),
                        cost,
                    );
                    // An odd target keeps a slot granted with no delay as its charge's
                    // receipt (refunded by GCRA's rule); a delayed one has none.
                    let token = if target % 2 == 1 {
                        let now = r.delay().is_zero();
                        match r.into_receipt() {
                            Ok(receipt) => {
                                assert!(now, "a delayed reservation gave a receipt");
                                Token::Receipt(receipt)
                            }
                            Err(r) => {
                                assert!(!now, "a reservation with no delay gave no receipt");
                                Token::Reservation(r)
                            }
                        }
                    } else {
                        Token::Reservation(r)
                    };
                    receipts.push(Handle {
                        unit: 0,
                        grant,
                        removals: 0,
                        token,
                    });
                }
            }
            Op::Refund { pick } | Op::Misdirect { pick } => {
                // A misdirected receipt (not a reservation) is refunded here.
                let Some(h) = take(&mut receipts, pick, premise.holds(clock.now())) else {
                    continue;
                };
                match h.token {
                    Token::Receipt(receipt) => {
                        let back = shaper.refund(receipt);
                        settle(&mut oracle, h.grant, back);
                    }
                    Token::Reservation(r) => {
                        let cost = r.cost();
                        let units = if matches!(op, Op::Misdirect { .. }) {
                            let stranger = Shaper::with_clock(policy, clock.clone());
                            assert_eq!(
                                stranger.cancel(r),
                                0,
                                "another shaper's reservation gave units back"
                            );
                            continue;
                        } else {
                            shaper.cancel(r)
                        };
                        assert!(units <= cost, "a cancellation gave back {units} of {cost}");
                        settle(&mut oracle, h.grant, units > 0);
                    }
                }
            }
            Op::Advance(d) => advance(clock, d),
            Op::Remove { .. } | Op::Reclaim | Op::Flip => {}
        }
    }
}

/// A keyed GCRA table of `KEYS` keys in one shard on storage `S`. Each key is held to
/// the policy since its last removal; decisions are judged at `max(reading, R)`, R the
/// shard's latest removal instant (reclamation loses nothing: a reclaimed key's held
/// admissions stay in its bound). Every receipt taken before a removal in the shard
/// gives back nothing; a receipt refunded on another key gives back nothing. A refund
/// is judged at `max(clock, R)` and made only where that is no earlier than every
/// decision of the shard (the refund premise); else its receipt waits.
fn keyed<S: Storage<u8, GcraState>>(policy: Policy, clock: &AnyClock, ops: &[Op]) {
    let Ok(table) = KeyedBuilder::new(Gcra::new(policy))
        .capacity(usize::from(KEYS))
        .shards(1)
        .clock(clock.clone())
        .build_in::<u8, S>()
    else {
        return;
    };
    let table: KeyedLimiter<u8, Gcra, AnyClock, S> = table;
    let mut oracles: Vec<Oracle> = (0..KEYS).map(|_| Oracle::new(Kind::Gcra, policy)).collect();
    let mut receipts: Vec<Handle> = Vec::new();
    // The shard's latest removal instant and removal count, as the table reports them.
    let mut removed_at = Nanos::ZERO;
    let mut removals = 0u64;
    // The shard's refund premise (its ledger is per shard).
    let mut premise = Premise::NONE;
    let count = |m: floodgate::KeyedMetrics| m.reclaimed + m.evicted + m.removed;
    for op in ops {
        let before = table.metrics();
        let now = clock.now();
        let mut judged = now.max(removed_at);
        match *op {
            Op::Charge {
                target,
                cost,
                stale,
            }
            | Op::Book {
                target,
                cost,
                stale,
            }
            | Op::Reserve {
                target,
                cost,
                stale,
                ..
            } => {
                let key = target % KEYS;
                let at = reading(clock, stale);
                judged = at.max(removed_at);
                premise.saw(judged);
                let book = !matches!(op, Op::Charge { .. });
                let cost = cost_of(cost, policy.burst());
                let limit = table.limit(&key);
                let mut h = charge(
                    &limit,
                    &mut oracles[usize::from(key)],
                    usize::from(key),
                    at,
                    judged,
                    cost,
                    book,
                );
                h.removals = removals;
                receipts.push(h);
            }
            Op::Refund { pick } | Op::Misdirect { pick } => {
                // A refund is judged at `max(clock, R)`; on another key nothing comes back.
                let ready = matches!(op, Op::Misdirect { .. }) || premise.holds(judged);
                let Some(h) = take(&mut receipts, pick, ready) else {
                    continue;
                };
                let Token::Receipt(receipt) = h.token else {
                    unreachable!()
                };
                let key = h.unit as u8;
                if matches!(op, Op::Misdirect { .. }) {
                    let wrong = (key + 1) % KEYS;
                    assert!(
                        !table.refund(&wrong, receipt),
                        "key {key}'s receipt gave back on key {wrong}"
                    );
                    continue;
                }
                let back = table.refund(&key, receipt);
                if h.removals < removals {
                    assert!(
                        !back,
                        "a receipt taken before a removal in the shard gave something back"
                    );
                }
                settle(&mut oracles[usize::from(key)], h.grant, back);
            }
            Op::Advance(d) => advance(clock, d),
            Op::Remove { key } => {
                let key = key % KEYS;
                if table.remove(&key) {
                    // Forgiven: the key starts fresh at the removal instant.
                    oracles[usize::from(key)].held.clear();
                }
            }
            Op::Reclaim => {
                let _ = table.reclaim_idle();
            }
            Op::Flip => {}
        }
        let after = table.metrics();
        assert_eq!(
            after.evicted, 0,
            "no key is evicted below capacity: {after:?}"
        );
        if count(after) > count(before) {
            removed_at = removed_at.max(judged);
            removals += 1;
        }
    }
}

/// Keys of a composite's keyed table that the oracle follows: `0..TRACKED`.
const TRACKED: u16 = 4;
/// The table's keys: floods insert `TRACKED..KEY_SPACE` in turn (untracked), enough
/// to fill every shard of an 8-shard table past its share plus headroom.
const KEY_SPACE: u16 = 512;

/// A keyed table of `u16` keys, as the composite arm uses it: a `KeyedLimiter` of any
/// algorithm and storage, a `KeyedSlidingLog`, or a `PlanLimiter` with its one plan.
trait Table {
    fn limit<'a>(&'a self, key: &'a u16) -> Box<dyn Limit + 'a>;
    fn remove(&self, key: u16) -> bool;
    fn reclaim_idle(&self) -> usize;
    fn metrics(&self) -> KeyedMetrics;

    /// One unit at `at` (a flood's insert).
    fn check(&self, key: u16, at: Nanos) -> Decision {
        self.limit(&key).check_n_at(at, 1)
    }
    /// Zero units at `at`.
    fn peek(&self, key: u16, at: Nanos) -> Decision {
        self.limit(&key).peek_at(at, 0)
    }
    /// Keys evicted, and keys removed in any way (evicted, reclaimed, removed).
    fn removals(&self) -> (u64, u64) {
        let m = self.metrics();
        (m.evicted, m.evicted + m.reclaimed + m.removed)
    }
}

impl<A: Algorithm, S: Storage<u16, A::State>> Table for KeyedLimiter<u16, A, AnyClock, S> {
    fn limit<'a>(&'a self, key: &'a u16) -> Box<dyn Limit + 'a> {
        Box::new(KeyedLimiter::limit(self, key))
    }
    fn remove(&self, key: u16) -> bool {
        KeyedLimiter::remove(self, &key)
    }
    fn reclaim_idle(&self) -> usize {
        KeyedLimiter::reclaim_idle(self)
    }
    fn metrics(&self) -> KeyedMetrics {
        KeyedLimiter::metrics(self)
    }
}

/// The log has no `reclaim_idle`: it reclaims nothing.
impl Table for KeyedSlidingLog<u16, AnyClock> {
    fn limit<'a>(&'a self, key: &'a u16) -> Box<dyn Limit + 'a> {
        Box::new(KeyedSlidingLog::limit(self, key))
    }
    fn remove(&self, key: u16) -> bool {
        KeyedSlidingLog::remove(self, &key)
    }
    fn reclaim_idle(&self) -> usize {
        0
    }
    fn metrics(&self) -> KeyedMetrics {
        KeyedSlidingLog::metrics(self)
    }
}

/// A plan limiter whose resolver routes every key to its one plan.
impl<R, S, A> Table for (PlanLimiter<u16, R, AnyClock, S, A>, PlanId)
where
    R: Fn(&u16) -> PlanId,
    A: PlanAlgorithm,
    S: Storage<u16, A::State>,
{
    fn limit<'a>(&'a self, key: &'a u16) -> Box<dyn Limit + 'a> {
        Box::new(self.0.limit(key))
    }
    fn remove(&self, key: u16) -> bool {
        self.0.remove(&key)
    }
    fn reclaim_idle(&self) -> usize {
        self.0.table(self.1).reclaim_idle()
    }
    fn metrics(&self) -> KeyedMetrics {
        self.0.metrics()
    }
}

/// The keyed table of `kind` (`plan`: a one-plan `PlanLimiter` of GCRA or a window;
/// the log is always a `KeyedSlidingLog`) for `policy` on `storage` (mod 3: `Heap`,
/// `Inline`, `Fingerprint`).
fn build_table(
    kind: Kind,
    plan: bool,
    storage: u8,
    policy: Policy,
    builder: KeyedBuilder<(), AnyClock>,
) -> Option<Box<dyn Table>> {
    let on = (plan, policy, builder);
    match kind {
        Kind::Log => Some(Box::new(on.2.sliding_log::<u16>(policy).ok()?)),
        Kind::Gcra => on_storage(Gcra::new(policy), storage, on),
        Kind::Fixed => on_storage(FixedWindow::new(policy).ok()?, storage, on),
        Kind::Sliding => on_storage(SlidingWindow::new(policy).ok()?, storage, on),
    }
}

/// [`table_in`] on `storage` (mod 3).
fn on_storage<A: PlanAlgorithm + 'static>(
    algorithm: A,
    storage: u8,
    on: (bool, Policy, KeyedBuilder<(), AnyClock>),
) -> Option<Box<dyn Table>>
where
    Heap: Storage<u16, A::State>,
    Inline: Storage<u16, A::State>,
    Fingerprint: Storage<u16, A::State>,
{
    match storage % 3 {
        0 => table_in::<A, Heap>(algorithm, on),
        1 => table_in::<A, Inline>(algorithm, on),
        _ => table_in::<A, Fingerprint>(algorithm, on),
    }
}

/// A `KeyedLimiter` of `algorithm` on `S`, or (`plan`) a `PlanLimiter` of `A` with one
/// plan of `policy`, every key routed to it.
fn table_in<A: PlanAlgorithm + 'static, S: Storage<u16, A::State> + 'static>(
    algorithm: A,
    (plan, policy, builder): (bool, Policy, KeyedBuilder<(), AnyClock>),
) -> Option<Box<dyn Table>> {
    if !plan {
        return Some(Box::new(
            builder.algorithm(algorithm).build_in::<u16, S>().ok()?,
        ));
    }
    let mut plans = Plans::new();
    let id = plans.insert("only", policy);
    let route = move |_: &u16| id;
    let limiter = PlanLimiter::<u16, _, _, S, A>::new_in(&plans, route, builder).ok()?;
    Some(Box::new((limiter, id)))
}

/// What the target knows of a keyed table's shards: each key's class (a shard, learnt
/// by [`Shards::probe`]) and, per class, its latest removal instant R (known, or known
/// only to lie between `known` and `most` after a `reclaim_idle` on several shards)
/// its known removals (a receipt taken before one gives back nothing), and its refund
/// premise (the latest instant any decision of the shard was judged at: its GCRA
/// refund ledger is per shard).
///
/// A removal is judged at `max(clock, R)` (an insert's: at its decision's instant),
/// ahead of the clock once readings run ahead of it or the clock steps back.
struct Shards {
    of: Vec<usize>,
    known: Vec<Nanos>,
    most: Vec<Nanos>,
    removals: Vec<u64>,
    premise: Vec<Premise>,
}

impl Shards {
    /// Learns the class of keys `0..keys` as the `keyed` target does: at instant
    /// `i + 1` it charges key `i` at reading 0, which the table judges at its shard's R
    /// (the instant the previous key of that shard was removed at, or 0), then removes
    /// it.
    fn probe(table: &dyn Table, clock: &AnyClock, shards: usize, keys: u16) -> Shards {
        let mut of: Vec<usize> = Vec::new();
        let mut known: Vec<Nanos> = Vec::new();
        for key in 0..keys {
            let at = Nanos::new(u64::from(key) + 1);
            clock.set(at);
            let class = probe::probe_key(
                key,
                at,
                || table.limit(&key).charge_at(Nanos::ZERO, 1),
                || table.remove(key),
                &mut known,
                |i| of[i],
            );
            of.push(class);
        }
        assert!(known.len() <= shards, "probe: more classes than shards");
        Shards {
            of,
            most: known.clone(),
            removals: vec![0; known.len()],
            premise: known.iter().map(|&at| Premise(at)).collect(),
            known,
        }
    }

    fn class(&self, key: u16) -> usize {
        self.of[usize::from(key)]
    }

    /// The reading to decide `key` at instead of `at`: raised to the upper bound of
    /// its class's R while R is unsure (where every possible R judges alike).
    fn reading(&self, key: u16, at: Nanos) -> Nanos {
        let c = self.class(key);
        if self.known[c] < self.most[c] {
            at.max(self.most[c])
        } else {
            at
        }
    }

    /// The instant the table judges a reading from [`Shards::reading`] at.
    fn judged(&self, key: u16, at: Nanos) -> Nanos {
        at.max(self.known[self.class(key)])
    }

    /// A removal known to be in `class`, at `max(at, R)`: R is then known where `at`
    /// is no earlier than every R it may be (an insert's decision, raised by
    /// [`Shards::reading`]) or R was known.
    fn removed(&mut self, class: usize, at: Nanos) {
        self.known[class] = self.known[class].max(at);
        self.most[class] = self.most[class].max(self.known[class]);
        self.removals[class] += 1;
    }

    /// A removal that may be in `class`, at `max(at, R)`.
    fn maybe_removed(&mut self, class: usize, at: Nanos) {
        self.most[class] = self.most[class].max(at);
    }

    /// A decision of `key`'s shard judged at `judged`.
    fn saw(&mut self, key: u16, judged: Nanos) {
        let c = self.class(key);
        self.premise[c].saw(judged);
    }

    /// Whether a refund on `key` with the clock at `now` is judged at a known instant
    /// (`max(now, R)`) no earlier than every decision of its shard.
    fn refundable(&self, key: u16, now: Nanos) -> bool {
        let c = self.class(key);
        let at = if now >= self.most[c] {
            now
        } else if self.known[c] == self.most[c] {
            self.known[c]
        } else {
            return false;
        };
        self.premise[c].holds(at)
    }
}

/// Every limit's held admissions, and the keyed table's shards.
struct World {
    /// 0 and 1: the composite's direct limits; `2 + k`: tracked key `k`.
    oracles: Vec<Oracle>,
    shards: Option<Shards>,
    /// The refund premise of the direct limits (0 and 1).
    premise: [Premise; 2],
    /// A key of the table's kind that is never charged: what a fresh key reads as.
    fresh: Option<Box<dyn Limit>>,
    clock: AnyClock,
    /// What the run reached (`REFUNDS_STATS=1` prints it): evictions, tracked keys
    /// forgotten, rollbacks and later refunds that gave something back, rollbacks
    /// held back (their premise failed).
    stats: [u64; 5],
}

impl World {
    /// Accounts for what an insert of `key` judged at `judged` removed, if anything:
    /// its removals are in the key's shard at that instant. An eviction forgives some
    /// key of the shard, which one is not said: every tracked key of the shard that
    /// reads as idle then (absent keys do) is forgotten — harmless for one that was
    /// not evicted, whose held admissions all lie behind every later decision.
    fn inserted(&mut self, table: &dyn Table, key: u16, judged: Nanos, before: (u64, u64)) {
        let after = table.removals();
        if after.1 == before.1 {
            return;
        }
        let shards = self.shards.as_mut().expect("a keyed table");
        let class = shards.class(key);
        shards.removed(class, judged);
        if after.0 > before.0 {
            self.stats[0] += after.0 - before.0;
            let fresh = self
                .fresh
                .as_ref()
                .expect("a keyed table")
                .peek_at(judged, 0);
            let reads = |d: Decision| (d.remaining(), d.reset_after_nanos());
            for k in (0..TRACKED).filter(|&k| shards.class(k) == class) {
                if reads(table.peek(k, judged)) == reads(fresh) {
                    self.oracles[2 + usize::from(k)].forget();
                    self.stats[1] += 1;
                }
            }
        }
    }

    /// A decision of oracle `unit`'s limit judged at `judged`.
    fn saw(&mut self, unit: usize, judged: Nanos) {
        match (unit.checked_sub(2), &mut self.shards) {
            (Some(k), Some(s)) => s.saw(k as u16, judged),
            _ => self.premise[unit].saw(judged),
        }
    }

    /// Whether a refund on oracle `unit`'s limit now meets its premise.
    fn refundable(&self, unit: usize) -> bool {
        let now = self.clock.now();
        match (unit.checked_sub(2), &self.shards) {
            (Some(k), Some(s)) => s.refundable(k as u16, now),
            _ => self.premise[unit].holds(now),
        }
    }

    /// The known removals of the shard of the key behind oracle `unit` (0: direct).
    fn removals(&self, unit: usize) -> u64 {
        match (unit.checked_sub(2), &self.shards) {
            (Some(k), Some(s)) => s.removals[s.class(k as u16)],
            _ => 0,
        }
    }

    /// Settles a refund of `h` (on its own limit or key) that reported `back`.
    fn refunded(&mut self, unit: usize, grant: Option<u64>, removals: u64, back: bool) {
        assert!(
            !back || self.removals(unit) == removals,
            "unit {unit}: a receipt taken before a removal in its shard gave something back"
        );
        settle(&mut self.oracles[unit], grant, back);
    }
}

/// One limit of a composite (or one charged alone): a direct limit or a tracked key,
/// deciding at a fixed reading. It settles its own charges and refunds in the oracle
/// as they happen (an insert of a later limit may evict this key), and keeps each
/// charge's receipt, handing the composite a stand-in, so that an admitted
/// composite's receipts can be refunded later.
struct Unit<'a> {
    inner: Box<dyn Limit + 'a>,
    reading: Nanos,
    /// Its oracle in `world` (`2 + k` for key `k`).
    unit: usize,
    table: Option<&'a dyn Table>,
    world: &'a RefCell<World>,
    taken: RefCell<Option<Handle>>,
    /// Its charges, and whether the last admitted.
    charges: RefCell<(u32, bool)>,
    /// Whether the composite rolled its charge back (the receipt stays in `taken`
    /// where that refund's premise failed).
    rolled: Cell<bool>,
}

impl<'a> Unit<'a> {
    fn new(
        world: &'a RefCell<World>,
        direct: &'a [Option<Box<dyn Limit>>; 2],
        table: Option<&'a dyn Table>,
        keys: &'a [u16],
        unit: usize,
        at: Nanos,
    ) -> Unit<'a> {
        let (inner, reading, table): (Box<dyn Limit + 'a>, _, _) = match unit.checked_sub(2) {
            Some(k) => {
                let table = table.expect("a keyed unit has a table");
                let world = world.borrow();
                let shards = world.shards.as_ref().expect("a keyed table");
                (
                    table.limit(&keys[k]),
                    shards.reading(keys[k], at),
                    Some(table),
                )
            }
            None => {
                let limit = direct[unit].as_deref().expect("a direct unit has a limit");
                (Box::new(limit), at, None)
            }
        };
        Unit {
            inner,
            reading,
            unit,
            table,
            world,
            taken: RefCell::new(None),
            charges: RefCell::new((0, false)),
            rolled: Cell::new(false),
        }
    }

    /// The table's removal counts, if keyed (taken before a charge).
    fn before(&self) -> Option<(u64, u64)> {
        self.table.map(|t| t.removals())
    }

    /// Settles a charge (or booking: `slot`) decided at `at` after the table's
    /// removal counts were `before`, and keeps its receipt.
    fn record(
        &self,
        at: Nanos,
        cost: u32,
        before: Option<(u64, u64)>,
        (d, slot, receipt): (Decision, Option<Nanos>, Receipt),
    ) {
        let mut world = self.world.borrow_mut();
        let judged = match (self.table, before) {
            (Some(table), Some(before)) => {
                let key = (self.unit - 2) as u16;
                let judged = world.shards.as_ref().expect("shards").judged(key, at);
                world.inserted(table, key, judged, before);
                if slot.is_none() && d.is_allowed() && cost > 0 {
                    assert_eq!(
                        receipt.charged_at(),
                        Some(judged),
                        "key {key} charged at {at:?} not judged at max(reading, R)"
                    );
                }
                judged
            }
            _ => at,
        };
        world.saw(self.unit, judged);
        let grant =
            world.oracles[self.unit].admit(judged.as_u64(), slot.map(Nanos::as_u64), &d, cost);
        let removals = world.removals(self.unit);
        let mut charges = self.charges.borrow_mut();
        *charges = (charges.0 + 1, d.is_allowed());
        *self.taken.borrow_mut() = Some(Handle {
            unit: self.unit,
            grant,
            removals,
            token: Token::Receipt(receipt),
        });
    }
}

/// A receipt that holds nothing: the stand-in a [`Unit`] hands a composite.
fn stand_in() -> Receipt {
    RateLimiter::gcra_with_clock(Policy::per_second(1).expect("a policy"), ManualClock::new())
        .charge_at(Nanos::ZERO, 0)
        .1
}

impl Limit for Unit<'_> {
    fn now(&self) -> Nanos {
        self.reading
    }

    fn charge_at(&self, now: Nanos, cost: u32) -> (Decision, Receipt) {
        let before = self.before();
        let (d, receipt) = self.inner.charge_at(now, cost);
        self.record(now, cost, before, (d, None, receipt));
        (d, stand_in())
    }

    fn peek_at(&self, now: Nanos, cost: u32) -> Decision {
        self.inner.peek_at(now, cost)
    }

    fn book_at(&self, now: Nanos, cost: u32) -> Option<(Decision, Duration, Receipt)> {
        let before = self.before();
        let (d, delay, receipt) = self.inner.book_at(now, cost)?;
        // The delay runs from the reading the booking was made at.
        let slot = Some(now.saturating_add(delay));
        self.record(now, cost, before, (d, slot, receipt));
        Some((d, delay, stand_in()))
    }

    /// Refunds the charge this unit holds (the composite's rollback), where the refund
    /// premise holds; else the receipt waits for a later refund.
    fn refund(&self, _: Receipt) -> bool {
        self.rolled.set(true);
        if !self.world.borrow().refundable(self.unit) {
            self.world.borrow_mut().stats[4] += 1;
            return false;
        }
        let Some(h) = self.taken.borrow_mut().take() else {
            return false;
        };
        let Token::Receipt(receipt) = h.token else {
            unreachable!("units issue receipts only")
        };
        let back = self.inner.refund(receipt);
        let mut world = self.world.borrow_mut();
        world.stats[2] += u64::from(back);
        world.refunded(h.unit, h.grant, h.removals, back);
        back
    }
}

/// `check_all` over two limits, each also charged and refunded directly: the
/// composite's rollbacks, at stale readings or readings ahead of the clock, interleave
/// with refunds of its own and the direct charges' receipts; no limit's held
/// admissions pass its bound.
///
/// `pair` below 128: two direct limits (kinds from its low nibble). From 128 on, a
/// key of a keyed table takes the place of the first limit, of the second, or of
/// both (bits 4–5: 0 the first, 1 the second, 2 and 3 both, two keys of the same
/// table, the same one at times). With `limit`'s bit 4 clear the table is a GCRA
/// `KeyedLimiter` (as in seeds older than the other tables); with it set, the table's
/// kind is the keyed slot's kind in `pair`'s low nibble (the first keyed slot's), and
/// `other`'s bit 7 makes a GCRA or window table a one-plan `PlanLimiter` (the log is
/// always a `KeyedSlidingLog`). `other`'s bits 3–4
/// pick 1, 2, 4 or 8 shards, bits 5–6 the storage (`Heap`, `Inline`, `Fingerprint`),
/// and `burst`'s bits 3–7 a capacity of 1 to 32. Each operation's `target` picks the
/// keys (bits 2–3 and 4–5). `Remove` removes a tracked key, or from key 128 on floods
/// `2·(key − 128) + 2` untracked keys at the clock's reading; `Reclaim` runs
/// `reclaim_idle`. Keyed decisions are judged at `max(reading, R)` ([`Shards`]).
fn composite(first: Policy, second: Policy, input: &Input, start: u32, ops: &[Op]) -> Option<()> {
    let pair = input.pair;
    let keyed = (pair >= 128).then(|| match pair >> 4 & 3 {
        0 => [true, false],
        1 => [false, true],
        _ => [true, true],
    });
    let keyed_slots = keyed.unwrap_or([false; 2]);
    let start = Nanos::new(u64::from(start));
    // At 0 while a keyed table's shards are learnt.
    let clock = AnyClock::default();
    if keyed.is_none() {
        clock.set(start);
    }
    const KINDS: [Kind; 4] = [Kind::Gcra, Kind::Fixed, Kind::Sliding, Kind::Log];
    let kinds = [
        KINDS[usize::from(pair % 4)],
        KINDS[usize::from(pair / 4 % 4)],
    ];
    let table_slot = usize::from(!keyed_slots[0]);
    let table_policy = [first, second][table_slot];
    let wide = input.limit & 16 != 0;
    let table_kind = if !wide { Kind::Gcra } else { kinds[table_slot] };
    let shards = 1 << (input.other >> 3 & 3);
    let capacity = usize::from(input.burst >> 3) + 1;
    let builder = KeyedBuilder::default()
        .capacity(capacity)
        .shards(shards)
        .clock(clock.clone());
    let table: Option<Box<dyn Table>> = match keyed {
        None => None,
        Some(_) => Some(build_table(
            table_kind,
            wide && input.other & 128 != 0,
            input.other >> 5 & 3,
            table_policy,
            builder,
        )?),
    };
    let table = table.as_deref();
    // The keys the run uses: the tracked ones and those its floods insert (most of the
    // run's time goes to learning a key's shard).
    let flooded: usize = ops
        .iter()
        .map(|op| match *op {
            Op::Remove { key } if key >= 128 => 2 * usize::from(key - 128) + 2,
            _ => 0,
        })
        .sum();
    let used = (usize::from(TRACKED) + flooded).min(usize::from(KEY_SPACE)) as u16;
    let shards = table.map(|t| Shards::probe(t, &clock, shards, used));
    if table.is_some() {
        clock.set(Nanos::new(u64::from(KEY_SPACE) + 1 + start.as_u64()));
    }
    let policies = [first, second];
    let mut direct: [Option<Box<dyn Limit>>; 2] = [None, None];
    for slot in 0..2 {
        if !keyed_slots[slot] {
            direct[slot] = Some(build(kinds[slot], policies[slot], &clock)?);
        }
    }
    let world = RefCell::new(World {
        oracles: [Oracle::new(kinds[0], first), Oracle::new(kinds[1], second)]
            .into_iter()
            .chain((0..TRACKED).map(|_| Oracle::new(table_kind, table_policy)))
            .collect(),
        shards,
        premise: [Premise::NONE; 2],
        fresh: match table {
            Some(_) => Some(build(table_kind, table_policy, &clock)?),
            None => None,
        },
        clock: clock.clone(),
        stats: [0; 5],
    });
    let keys: Vec<u16> = (0..TRACKED).collect();
    let mut receipts: Vec<Handle> = Vec::new();
    let mut cursor = 0u16;
    // The unit slot `slot` stands for in an operation with `target`.
    let unit_of = |slot: usize, target: u8| {
        if keyed_slots[slot] {
            2 + usize::from(target >> (2 + 2 * slot)) % usize::from(TRACKED)
        } else {
            slot
        }
    };
    for op in ops {
        match *op {
            Op::Charge {
                target,
                cost,
                stale,
            }
            | Op::Book {
                target,
                cost,
                stale,
            }
            | Op::Reserve {
                target,
                cost,
                stale,
                ..
            } => {
                let at = reading(&clock, stale);
                let cost = cost_of(cost, first.burst().max(second.burst()));
                let book = !matches!(op, Op::Charge { .. });
                let units: Vec<Unit> = match target % 4 {
                    slot @ (0 | 1) => {
                        let unit = unit_of(usize::from(slot), target);
                        let u = Unit::new(&world, &direct, table, &keys, unit, at);
                        if !book || u.book_at(u.reading, cost).is_none() {
                            let _ = u.charge_at(u.reading, cost);
                        }
                        vec![u]
                    }
                    order => {
                        let units = [0, 1].map(|slot| {
                            Unit::new(&world, &direct, table, &keys, unit_of(slot, target), at)
                        });
                        let d = if order == 2 {
                            check_all(&[&units[0], &units[1]], cost)
                        } else {
                            check_all(&[&units[1], &units[0]], cost)
                        };
                        for u in &units {
                            let charges = *u.charges.borrow();
                            if d.is_allowed() {
                                assert_eq!(
                                    charges,
                                    (1, true),
                                    "the composite admitted, unit {} was not charged once",
                                    u.unit
                                );
                            } else if charges == (1, true) {
                                assert!(
                                    u.rolled.get(),
                                    "the composite denied, unit {}'s admission was not rolled back",
                                    u.unit
                                );
                            }
                        }
                        units.into()
                    }
                };
                receipts.extend(units.into_iter().filter_map(|u| u.taken.into_inner()));
            }
            Op::Refund { pick } | Op::Misdirect { pick } => {
                // A misdirected refund goes to a stranger or another key: nothing can
                // come back.
                let ready = matches!(op, Op::Misdirect { .. })
                    || receipts
                        .get(usize::from(pick) % receipts.len().max(1))
                        .is_some_and(|h| world.borrow().refundable(h.unit));
                let Some(h) = take(&mut receipts, pick, ready) else {
                    continue;
                };
                let Token::Receipt(receipt) = h.token else {
                    unreachable!()
                };
                let limit: Box<dyn Limit> = match (h.unit, table) {
                    (0 | 1, _) => Box::new(direct[h.unit].as_deref().expect("a direct limit")),
                    (_, Some(table)) => table.limit(&keys[h.unit - 2]),
                    (_, None) => unreachable!("a keyed receipt without a table"),
                };
                if matches!(op, Op::Misdirect { .. }) {
                    let stranger: Box<dyn Limit> = match (h.unit, table) {
                        (0 | 1, _) => Box::new(RateLimiter::gcra_with_clock(first, clock.clone())),
                        (_, Some(table)) => table.limit(&keys[(h.unit - 1) % keys.len()]),
                        (_, None) => unreachable!(),
                    };
                    assert!(
                        !stranger.refund(receipt),
                        "unit {}'s receipt gave back elsewhere",
                        h.unit
                    );
                    continue;
                }
                let back = limit.refund(receipt);
                let mut world = world.borrow_mut();
                world.stats[3] += u64::from(back);
                world.refunded(h.unit, h.grant, h.removals, back);
            }
            Op::Advance(d) => advance(&clock, d),
            Op::Remove { key } => {
                let Some(table) = table else { continue };
                let mut world = world.borrow_mut();
                let now = clock.now();
                if key < 128 {
                    let k = u16::from(key) % TRACKED;
                    if table.remove(k) {
                        let shards = world.shards.as_mut().expect("shards");
                        let class = shards.class(k);
                        shards.removed(class, now);
                        world.oracles[2 + usize::from(k)].forget();
                    }
                    continue;
                }
                for _ in 0..2 * (u16::from(key) - 128) + 2 {
                    let k = TRACKED + cursor % (KEY_SPACE - TRACKED);
                    cursor = cursor.wrapping_add(1) % (KEY_SPACE - TRACKED);
                    let shards = world.shards.as_ref().expect("shards");
                    let at = shards.reading(k, now);
                    let judged = shards.judged(k, at);
                    let before = table.removals();
                    let _ = table.check(k, at);
                    world.saw(2 + usize::from(k), judged);
                    world.inserted(table, k, judged, before);
                }
            }
            Op::Reclaim => {
                let Some(table) = table else { continue };
                if table.reclaim_idle() == 0 {
                    continue;
                }
                // Reclaimed keys were idle: their held admissions stay.
                let now = clock.now();
                let mut world = world.borrow_mut();
                let shards = world.shards.as_mut().expect("shards");
                if shards.known.len() == 1 {
                    shards.removed(0, now);
                } else {
                    for class in 0..shards.known.len() {
                        shards.maybe_removed(class, now);
                    }
                }
            }
            Op::Flip => {}
        }
    }
    if std::env::var_os("REFUNDS_STATS").is_some() {
        let world = world.borrow();
        let [evicted, forgotten, rollbacks, refunds, held] = world.stats;
        let classes = world.shards.as_ref().map_or(0, |s| s.known.len());
        eprintln!(
            "composite keyed {keyed_slots:?} {table_kind:?} classes {classes} evicted {evicted} \
             forgotten {forgotten} rollbacks back {rollbacks} held back {held} refunds back {refunds}"
        );
    }
    Some(())
}

/// A window or log limiter (or GCRA) of `kind` for `policy` on `clock`.
fn build(kind: Kind, policy: Policy, clock: &AnyClock) -> Option<Box<dyn Limit>> {
    Some(match kind {
        Kind::Gcra => Box::new(RateLimiter::gcra_with_clock(policy, clock.clone())),
        Kind::Fixed => Box::new(RateLimiter::with_clock(
            FixedWindow::new(policy).ok()?,
            clock.clone(),
        )),
        Kind::Sliding => Box::new(RateLimiter::with_clock(
            SlidingWindow::new(policy).ok()?,
            clock.clone(),
        )),
        Kind::Log => Box::new(SlidingLog::with_clock(policy, clock.clone())),
    })
}
