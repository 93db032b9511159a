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
//! `check_all` composite of two limits that are also charged and refunded directly.
//!
//! The clock is one `ManualClock` that only moves forward; a stale reading is the
//! clock minus an arbitrary lag, and every refund reads the limiter's clock (the
//! current reading), as the refund premise asks. After every admission the bound of
//! its algorithm is asserted over the admissions still held (not given back by a
//! refund or cancellation that reported success — dropping a partially refunded charge
//! only loosens the check):
//!
//! * GCRA and everything built on it: the held admissions, replayed at their readings
//!   (a booking or reservation: at its slot; keyed: at `max(reading, the shard's last
//!   removal instant)`) on a fresh GCRA of the policy, all conform;
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
use floodgate::{
    Algorithm, Clock, Decision, Fingerprint, FixedWindow, Gcra, GcraState, Heap, Inline,
    KeyedBuilder, KeyedLimiter, LiveGcra, LockedCell, ManualClock, Nanos, Policy, RateLimiter,
    Receipt, Reservation, Shaper, SlidingLog, SlidingWindow, Storage,
};
use libfuzzer_sys::fuzz_target;

#[path = "common/bounds.rs"]
mod bounds;
use bounds::{Kind, Oracle};
use std::cell::RefCell;
use std::time::Duration;

/// At most this many operations per input (the checks are quadratic in the worst case).
const MAX_OPS: usize = 256;
/// Keys of the keyed system (all in one shard, below its capacity: none is evicted).
const KEYS: u8 = 4;

#[derive(Arbitrary, Debug)]
enum Op {
    /// Charge `cost` on `target` at a reading `stale` ns behind the clock.
    Charge {
        target: u8,
        cost: u8,
        stale: u16,
    },
    /// Book `cost` at the earliest slot (GCRA front ends; others: a charge).
    Book {
        target: u8,
        cost: u8,
        stale: u16,
    },
    /// Reserve within `max_delay` ns (the shaper; others: a booking).
    Reserve {
        target: u8,
        cost: u8,
        stale: u16,
        max_delay: u16,
    },
    /// Refund (or cancel) an outstanding receipt, at the clock's reading.
    Refund {
        pick: u8,
    },
    /// Refund an outstanding receipt on another limit or key: nothing comes back.
    Misdirect {
        pick: u8,
    },
    Advance(u16),
    /// Keyed: remove a key (forgives it, voids the shard's receipts).
    Remove {
        key: u8,
    },
    /// Keyed: reclaim idle keys (loses nothing).
    Reclaim,
    /// `LiveGcra`: switch between the two bursts.
    Flip,
}

#[derive(Arbitrary, Debug)]
struct Input {
    system: u8,
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
    let limit = u64::from(input.limit % 8) + 1;
    let period = u64::from(input.period) + 1;
    let burst = u64::from(input.burst % 8) + 1;
    let Ok(policy) =
        Policy::new(limit, Duration::from_nanos(period)).and_then(|p| p.with_burst(burst))
    else {
        return;
    };
    let other = u64::from(input.other % 8) + 1;
    let clock = ManualClock::starting_at(Nanos::new(u64::from(input.start)));
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
            composite(policy, second, input.pair, &clock, ops);
        }
    }
});

/// The reading a decision is made at: `stale` ns behind the clock.
fn reading(clock: &ManualClock, stale: u16) -> Nanos {
    Nanos::new(clock.now().as_u64().saturating_sub(u64::from(stale)))
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
fn on_cell<A>(
    algorithm: A,
    locked: bool,
    kind: Kind,
    policy: Policy,
    clock: &ManualClock,
    ops: &[Op],
) where
    A: Algorithm,
    RateLimiter<A, ManualClock>: Limit,
    RateLimiter<A, ManualClock, LockedCell<A::State>>: Limit,
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

fn direct<L: Limit>(limit: &L, kind: Kind, policy: Policy, clock: &ManualClock, ops: &[Op]) {
    let mut oracle = Oracle::new(kind, policy);
    let mut receipts: Vec<Handle> = Vec::new();
    for op in ops {
        match *op {
            Op::Charge { cost, stale, .. }
            | Op::Book { cost, stale, .. }
            | Op::Reserve { cost, stale, .. } => {
                let at = reading(clock, stale);
                let book = !matches!(op, Op::Charge { .. });
                let cost = cost_of(cost, oracle.limit.max(policy.burst()));
                receipts.push(charge(limit, &mut oracle, 0, at, at, cost, book));
            }
            Op::Refund { pick } | Op::Misdirect { pick } => {
                if receipts.is_empty() {
                    continue;
                }
                let h = receipts.swap_remove(usize::from(pick) % receipts.len());
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
            Op::Advance(d) => {
                clock.advance(Duration::from_nanos(u64::from(d)));
            }
            Op::Remove { .. } | Op::Reclaim | Op::Flip => {}
        }
    }
}

/// `LiveGcra` whose burst flips between `policy`'s and `other`: the held admissions
/// conform to the larger burst (the same `T`, the largest `τ`).
fn live(policy: Policy, other: u64, clock: &ManualClock, ops: &[Op]) {
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
                let book = !matches!(op, Op::Charge { .. });
                let cost = cost_of(cost, generous.burst());
                receipts.push(charge(&limiter, &mut oracle, 0, at, at, cost, book));
            }
            Op::Refund { pick } | Op::Misdirect { pick } => {
                if receipts.is_empty() {
                    continue;
                }
                let h = receipts.swap_remove(usize::from(pick) % receipts.len());
                let Token::Receipt(receipt) = h.token else {
                    unreachable!()
                };
                let back = limiter.refund(receipt);
                settle(&mut oracle, h.grant, back);
            }
            Op::Advance(d) => {
                clock.advance(Duration::from_nanos(u64::from(d)));
            }
            Op::Remove { .. } | Op::Reclaim => {}
        }
    }
}

/// The shaper: immediate charges, bookings (held at their slot, refunded by GCRA's
/// rule) and reservations within a `max_delay` (held at their slot, cancelled by
/// `cancel`, which gives back a count of units: any is taken as the whole grant).
fn shaper<S: floodgate::StateCell<GcraState>>(
    shaper: &Shaper<ManualClock, S>,
    policy: Policy,
    clock: &ManualClock,
    ops: &[Op],
) {
    let mut oracle = Oracle::new(Kind::Gcra, policy);
    let mut receipts: Vec<Handle> = Vec::new();
    for op in ops {
        match *op {
            Op::Charge { cost, stale, .. } | Op::Book { cost, stale, .. } => {
                let at = reading(clock, stale);
                let book = matches!(op, Op::Book { .. });
                let cost = cost_of(cost, policy.burst());
                receipts.push(charge(shaper, &mut oracle, 0, at, at, cost, book));
            }
            Op::Reserve {
                cost,
                stale,
                max_delay,
                ..
            } => {
                let at = reading(clock, stale);
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
                    receipts.push(Handle {
                        unit: 0,
                        grant,
                        removals: 0,
                        token: Token::Reservation(r),
                    });
                }
            }
            Op::Refund { pick } | Op::Misdirect { pick } => {
                if receipts.is_empty() {
                    continue;
                }
                let h = receipts.swap_remove(usize::from(pick) % receipts.len());
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
            Op::Advance(d) => {
                clock.advance(Duration::from_nanos(u64::from(d)));
            }
            Op::Remove { .. } | Op::Reclaim | Op::Flip => {}
        }
    }
}

/// A keyed GCRA table of `KEYS` keys in one shard on storage `S`. Each key is held to
/// the policy since its last removal; decisions are judged at `max(reading, R)`, R the
/// shard's latest removal instant (reclamation loses nothing: a reclaimed key's held
/// admissions stay in its bound). Every receipt taken before a removal in the shard
/// gives back nothing; a receipt refunded on another key gives back nothing.
fn keyed<S: Storage<u8, GcraState>>(policy: Policy, clock: &ManualClock, ops: &[Op]) {
    let Ok(table) = KeyedBuilder::new(Gcra::new(policy))
        .capacity(usize::from(KEYS))
        .shards(1)
        .clock(clock.clone())
        .build_in::<u8, S>()
    else {
        return;
    };
    let table: KeyedLimiter<u8, Gcra, ManualClock, S> = table;
    let mut oracles: Vec<Oracle> = (0..KEYS).map(|_| Oracle::new(Kind::Gcra, policy)).collect();
    let mut receipts: Vec<Handle> = Vec::new();
    // The shard's latest removal instant and removal count, as the table reports them.
    let mut removed_at = Nanos::ZERO;
    let mut removals = 0u64;
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
                if receipts.is_empty() {
                    continue;
                }
                let h = receipts.swap_remove(usize::from(pick) % receipts.len());
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
            Op::Advance(d) => {
                clock.advance(Duration::from_nanos(u64::from(d)));
            }
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

/// A [`Limit`] deciding at a stale reading inside a composite, logging what it was
/// asked to do so the oracle can follow the composite's charges and rollbacks.
struct Stale<'a> {
    inner: &'a dyn Limit,
    reading: Nanos,
    events: RefCell<Vec<Event>>,
}

enum Event {
    Charged(Decision, u32),
    Refunded(bool),
}

impl Limit for Stale<'_> {
    fn now(&self) -> Nanos {
        self.reading
    }

    fn charge_at(&self, now: Nanos, cost: u32) -> (Decision, Receipt) {
        let (d, receipt) = self.inner.charge_at(now, cost);
        self.events.borrow_mut().push(Event::Charged(d, cost));
        (d, receipt)
    }

    fn peek_at(&self, now: Nanos, cost: u32) -> Decision {
        self.inner.peek_at(now, cost)
    }

    fn refund(&self, receipt: Receipt) -> bool {
        let back = self.inner.refund(receipt);
        self.events.borrow_mut().push(Event::Refunded(back));
        back
    }
}

/// A window or log limiter (or GCRA) of `kind` for `policy` on `clock`.
fn build(kind: Kind, policy: Policy, clock: &ManualClock) -> Option<Box<dyn Limit>> {
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

/// `check_all` over two limits (kinds from `pair`, in either order), each also charged
/// and refunded directly: the composite's rollbacks, at stale readings, interleave with
/// direct refunds; neither limit's held admissions pass its bound.
fn composite(first: Policy, second: Policy, pair: u8, clock: &ManualClock, ops: &[Op]) {
    const KINDS: [Kind; 4] = [Kind::Gcra, Kind::Fixed, Kind::Sliding, Kind::Log];
    let kinds = [
        KINDS[usize::from(pair % 4)],
        KINDS[usize::from(pair / 4 % 4)],
    ];
    let (Some(a), Some(b)) = (
        build(kinds[0], first, clock),
        build(kinds[1], second, clock),
    ) else {
        return;
    };
    let limits: [&dyn Limit; 2] = [a.as_ref(), b.as_ref()];
    let mut oracles = [Oracle::new(kinds[0], first), Oracle::new(kinds[1], second)];
    let mut receipts: Vec<Handle> = Vec::new();
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
                let at = reading(clock, stale);
                let cost = cost_of(cost, first.burst().max(second.burst()));
                let book = !matches!(op, Op::Charge { .. });
                match target % 4 {
                    unit @ (0 | 1) => {
                        let unit = usize::from(unit);
                        receipts.push(charge(
                            limits[unit],
                            &mut oracles[unit],
                            unit,
                            at,
                            at,
                            cost,
                            book,
                        ));
                    }
                    order => {
                        let stale = limits.map(|inner| Stale {
                            inner,
                            reading: at,
                            events: RefCell::new(Vec::new()),
                        });
                        let d = if order == 2 {
                            check_all(&[&stale[0], &stale[1]], cost)
                        } else {
                            check_all(&[&stale[1], &stale[0]], cost)
                        };
                        for (unit, s) in stale.into_iter().enumerate() {
                            let events = s.events.into_inner();
                            let mut held = None;
                            for e in &events {
                                match *e {
                                    Event::Charged(ref d, cost) => {
                                        held = oracles[unit].admit(at.as_u64(), None, d, cost);
                                    }
                                    Event::Refunded(back) => {
                                        settle(&mut oracles[unit], held.take(), back);
                                    }
                                }
                            }
                            if d.is_allowed() {
                                assert!(
                                    matches!(events[..], [Event::Charged(ref c, _)] if c.is_allowed()),
                                    "the composite admitted, limit {unit} ({:?}) was not charged once",
                                    kinds[unit]
                                );
                            }
                        }
                    }
                }
            }
            Op::Refund { pick } | Op::Misdirect { pick } => {
                if receipts.is_empty() {
                    continue;
                }
                let h = receipts.swap_remove(usize::from(pick) % receipts.len());
                let Token::Receipt(receipt) = h.token else {
                    unreachable!()
                };
                if matches!(op, Op::Misdirect { .. }) {
                    let other = 1 - h.unit;
                    assert!(
                        !limits[other].refund(receipt),
                        "limit {}'s receipt gave back on limit {other}",
                        h.unit
                    );
                    continue;
                }
                let back = limits[h.unit].refund(receipt);
                settle(&mut oracles[h.unit], h.grant, back);
            }
            Op::Advance(d) => {
                clock.advance(Duration::from_nanos(u64::from(d)));
            }
            Op::Remove { .. } | Op::Reclaim | Op::Flip => {}
        }
    }
}
