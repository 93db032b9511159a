//! Adversarial review of the refund order rule (session 45, "revorder"): a refund
//! whose booking, moved down by its whole shift, still ends at the `TAT` is left
//! out of every later refund's shift (`Algorithm::refund_moves_later`). The attack:
//! find a refund left out that did move a booking, which a later refund then
//! mis-locates and over-gives.
//!
//! The oracle is the counterfactual one of `never_beyond.rs`, on usage: the grants
//! still held (a charge at its reading, a booking or reservation at its slot; a
//! refunded or cancelled one removed whole) plus anything the limiter admits now
//! must conform to a fresh GCRA of the policy (`common::conforms`).
#![cfg(not(loom))]

#[macro_use]
mod common;

use floodgate::keyed::composite::Limit;
use floodgate::{
    Clock, Gcra, KeyedBuilder, LiveGcra, ManualClock, Nanos, Policy, RateLimiter, Receipt,
    Reservation, Shaper,
};
use proptest::prelude::*;
use std::time::Duration;

const P: u64 = 1_000_000;

fn policy(limit: u64, burst: u64) -> Policy {
    Policy::new(limit, Duration::from_nanos(P))
        .unwrap()
        .with_burst(burst)
        .unwrap()
}

/// Something held: a receipt (charge or booking) or a shaper reservation.
enum Held {
    Receipt(Receipt),
    Reservation(Reservation),
}

#[derive(Clone, Debug)]
enum Op {
    /// Advance, then charge `cost` on key `key` (mod the keys).
    Charge { advance: u64, key: usize, cost: u32 },
    /// Advance, then book `cost` (a booking may wait for a later slot).
    Book { advance: u64, key: usize, cost: u32 },
    /// Advance, then refund (or cancel) the held item at `pick`; `receipt`: a
    /// reservation without delay is turned into its receipt first.
    Refund {
        advance: u64,
        pick: usize,
        receipt: bool,
    },
    /// Switch a `LiveGcra` to the first (`false`) or second policy; nothing elsewhere.
    Policy { second: bool },
}

fn op() -> impl Strategy<Value = Op> {
    let advance = prop_oneof![4 => Just(0u64), 2 => 0..P / 2, 1 => 0..3 * P];
    prop_oneof![
        3 => (advance.clone(), 0usize..2, 0u32..4)
            .prop_map(|(advance, key, cost)| Op::Charge { advance, key, cost }),
        3 => (advance.clone(), 0usize..2, 1u32..4)
            .prop_map(|(advance, key, cost)| Op::Book { advance, key, cost }),
        4 => (advance, any::<usize>(), any::<bool>())
            .prop_map(|(advance, pick, receipt)| Op::Refund { advance, pick, receipt }),
        1 => any::<bool>().prop_map(|second| Op::Policy { second }),
    ]
}

/// One limit under test: `book` books (a GCRA booking or a shaper reservation with a
/// delay of up to 3 periods); `give` refunds or cancels.
trait Target {
    fn limit(&self) -> &dyn Limit;
    /// Books `cost` at `now`: the slot and what to hold, if admitted.
    fn book(&self, now: Nanos, cost: u32) -> Option<(Nanos, Held)>;
    fn give(&self, held: Held, receipt: bool);
}

struct Plain<'a>(&'a dyn Limit);

impl Target for Plain<'_> {
    fn limit(&self) -> &dyn Limit {
        self.0
    }
    fn book(&self, now: Nanos, cost: u32) -> Option<(Nanos, Held)> {
        let (decision, delay, receipt) = self.0.book_at(now, cost)?;
        (decision.is_allowed() && receipt.is_charged()).then(|| {
            let slot = Nanos::new(now.as_u64() + delay.as_nanos() as u64);
            (slot, Held::Receipt(receipt))
        })
    }
    fn give(&self, held: Held, _: bool) {
        if let Held::Receipt(r) = held {
            let _ = self.0.refund(r);
        }
    }
}

struct Shaped<'a, S: floodgate::StateCell<floodgate::GcraState>>(&'a Shaper<ManualClock, S>);

impl<S: floodgate::StateCell<floodgate::GcraState>> Target for Shaped<'_, S> {
    fn limit(&self) -> &dyn Limit {
        self.0
    }
    fn book(&self, now: Nanos, cost: u32) -> Option<(Nanos, Held)> {
        let r = self
            .0
            .reserve_at(now, cost, Duration::from_nanos(3 * P))
            .ok()?;
        Some((r.ready_at(), Held::Reservation(r)))
    }
    fn give(&self, held: Held, receipt: bool) {
        match held {
            Held::Receipt(r) => {
                let _ = self.0.refund(r);
            }
            Held::Reservation(r) if receipt => match r.into_receipt() {
                Ok(receipt) => {
                    let _ = self.0.refund(receipt);
                }
                Err(r) => {
                    let _ = self.0.cancel(r);
                }
            },
            Held::Reservation(r) => {
                let _ = self.0.cancel(r);
            }
        }
    }
}

/// Runs `ops` on `targets` (one per key, all on `clock`) and checks the usage of each
/// key after every step.
fn run(
    policy: Policy,
    clock: &ManualClock,
    targets: &[&dyn Target],
    ops: &[Op],
) -> Result<(), TestCaseError> {
    // Per key: (slot, cost) of every grant still held, by id; held items by id.
    let mut grants: Vec<Vec<Option<(Nanos, u32)>>> = vec![Vec::new(); targets.len()];
    let mut held: Vec<(usize, usize, Held)> = Vec::new();
    for op in ops {
        match *op {
            Op::Charge { advance, key, cost } => {
                clock.advance(Duration::from_nanos(advance));
                let key = key % targets.len();
                let (d, r) = targets[key].limit().charge_at(clock.now(), cost);
                if d.is_allowed() && r.is_charged() {
                    grants[key].push(Some((clock.now(), cost)));
                    held.push((key, grants[key].len() - 1, Held::Receipt(r)));
                }
            }
            Op::Book { advance, key, cost } => {
                clock.advance(Duration::from_nanos(advance));
                let key = key % targets.len();
                if let Some((slot, h)) = targets[key].book(clock.now(), cost) {
                    grants[key].push(Some((slot, cost)));
                    held.push((key, grants[key].len() - 1, h));
                }
            }
            Op::Refund {
                advance,
                pick,
                receipt,
            } => {
                clock.advance(Duration::from_nanos(advance));
                if held.is_empty() {
                    continue;
                }
                let (key, id, h) = held.remove(pick % held.len());
                targets[key].give(h, receipt);
                grants[key][id] = None;
            }
            Op::Policy { .. } => {}
        }
        let now = clock.now();
        for (key, target) in targets.iter().enumerate() {
            let kept: Vec<(Nanos, u32)> = grants[key].iter().flatten().copied().collect();
            // Now and at later instants (a sub-period over-give shows there).
            for at in (0..8).map(|k| Nanos::new(now.as_u64() + k * P / 2)) {
                for cost in 1..=policy.burst() as u32 {
                    if target.limit().peek_at(at, cost).is_allowed() {
                        let mut with = kept.clone();
                        with.push((at, cost));
                        if let Err(e) = common::conforms(policy, &with) {
                            return Err(TestCaseError::fail(format!(
                                "key {key}: {cost} admitted at {at:?} beyond the limit: {e}"
                            )));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

fn check_all(policy: Policy, ops: &[Op]) -> Result<(), TestCaseError> {
    let start = Nanos::from_secs(1_000);
    let gcra = Gcra::new(policy);
    let clock = ManualClock::starting_at(start);
    let direct = RateLimiter::with_clock(gcra, clock.clone());
    run(policy, &clock, &[&Plain(&direct)], ops)?;
    let clock = ManualClock::starting_at(start);
    let locked = RateLimiter::locked_with_clock(gcra, clock.clone());
    run(policy, &clock, &[&Plain(&locked)], ops)?;
    each_storage!(St => {
        let clock = ManualClock::starting_at(start);
        let keyed = KeyedBuilder::new(gcra)
            .shards(1)
            .clock(clock.clone())
            .build_in::<u64, St>()
            .unwrap();
        let (a, b) = (keyed.limit(&1), keyed.limit(&2));
        run(policy, &clock, &[&Plain(&a), &Plain(&b)], ops)?;
    });
    let clock = ManualClock::starting_at(start);
    let shaper = Shaper::with_clock(policy, clock.clone());
    run(policy, &clock, &[&Shaped(&shaper)], ops)?;
    let clock = ManualClock::starting_at(start);
    let shaper = Shaper::locked_with_clock(policy, clock.clone());
    run(policy, &clock, &[&Shaped(&shaper)], ops)?;
    Ok(())
}

/// `LiveGcra` with its policy switched between `first` and `second` (τ and `T`
/// both change) between charges, bookings and refunds: the limiter is never more
/// permissive than a fresh `LiveGcra` that replays only the admissions still held,
/// with the same switches at the same places (`never_beyond.rs`'s model).
fn check_live(first: Policy, second: Policy, ops: &[Op]) -> Result<(), TestCaseError> {
    #[derive(Clone, Copy)]
    enum Event {
        Admit {
            at: Nanos,
            cost: u32,
            book: bool,
            held: bool,
        },
        Switch(Policy),
    }
    let start = Nanos::from_secs(1_000);
    let clock = ManualClock::starting_at(start);
    let real = RateLimiter::with_clock(LiveGcra::new(first), clock.clone());
    let mut events: Vec<Event> = Vec::new();
    let mut held: Vec<(usize, Receipt)> = Vec::new();
    for op in ops {
        match *op {
            Op::Charge { advance, cost, .. } | Op::Book { advance, cost, .. } => {
                clock.advance(Duration::from_nanos(advance));
                let now = clock.now();
                let book = matches!(op, Op::Book { .. });
                let (d, r) = if book {
                    let (d, _, r) = real.book_at(now, cost).expect("GCRA books");
                    (d, r)
                } else {
                    real.charge_at(now, cost)
                };
                if d.is_allowed() && r.is_charged() {
                    events.push(Event::Admit {
                        at: now,
                        cost,
                        book,
                        held: true,
                    });
                    held.push((events.len() - 1, r));
                }
            }
            Op::Refund { advance, pick, .. } => {
                clock.advance(Duration::from_nanos(advance));
                if held.is_empty() {
                    continue;
                }
                let (index, r) = held.remove(pick % held.len());
                let _ = real.refund(r);
                if let Event::Admit { held, .. } = &mut events[index] {
                    *held = false;
                }
            }
            Op::Policy { second: to_second } => {
                let p = if to_second { second } else { first };
                real.algorithm().set_policy(p);
                events.push(Event::Switch(p));
            }
        }
        let model = RateLimiter::with_clock(LiveGcra::new(first), ManualClock::new());
        for event in &events {
            match *event {
                Event::Admit {
                    at,
                    cost,
                    book,
                    held: true,
                } => {
                    let admitted = if book {
                        model
                            .book_at(at, cost)
                            .is_some_and(|(d, _, _)| d.is_allowed())
                    } else {
                        model.check_n_at(at, cost).is_allowed()
                    };
                    prop_assert!(admitted, "the others alone deny {} at {:?}", cost, at);
                }
                Event::Admit { .. } => {}
                Event::Switch(p) => model.algorithm().set_policy(p),
            }
        }
        let now = clock.now();
        let most = first.burst().max(second.burst()) as u32 + 1;
        for cost in 1..=most {
            prop_assert!(
                !real.peek_at(now, cost).is_allowed() || model.peek_at(now, cost).is_allowed(),
                "LiveGcra admits {} at {:?} where the others alone deny it",
                cost,
                now
            );
        }
        prop_assert!(real.state().tat() >= model.state().tat() || model.state().tat() <= now);
    }
    Ok(())
}

proptest! {
    #![proptest_config(crate::common::cases(512))]

    /// Charges, bookings, reservations with delays, refunds and cancellations in any
    /// order, the clock moving between them: no key's usage ever passes the limit.
    #[test]
    fn refunds_in_any_order_never_pass_the_limit(
        limit in 1u64..4, burst in 1u64..5,
        ops in proptest::collection::vec(op(), 1..48),
    ) {
        check_all(policy(limit, burst), &ops)?;
    }

    /// The same mix on `LiveGcra` with policy switches between the steps.
    #[test]
    fn live_refunds_across_policy_changes_never_pass_the_others(
        limits in (1u64..4, 1u64..5, 1u64..4, 1u64..5),
        ops in proptest::collection::vec(op(), 1..48),
    ) {
        let (l1, b1, l2, b2) = limits;
        check_live(policy(l1, b1), policy(l2, b2), &ops)?;
    }
}

/// Two threads charge, book (slots up to several periods ahead) and refund on one
/// state, each its own receipts in a scripted order, so refunds land between other
/// charges' notes and their CAS, and between a refund's load and its CAS (the stale
/// "moved nobody" verdict). Either thread may move the clock a third of a period
/// before a step (each reads it afterwards); every receipt a thread refunds
/// is given up whatever the refund returns. Afterwards, no admission now or later
/// may pass the limit with the grants still held.
fn threaded_rounds(make: &dyn Fn(&ManualClock) -> Box<dyn Limit + Sync + '_>) {
    let policy = policy(1, 2);
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..common::stress_rounds(1_500) {
        let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
        let limit = make(&clock);
        let scripts: Vec<Vec<u64>> = (0..2).map(|_| (0..8).map(|_| next()).collect()).collect();
        let kept: Vec<(Nanos, u32)> = std::thread::scope(|scope| {
            let handles: Vec<_> = scripts
                .iter()
                .map(|script| {
                    let (limit, clock) = (&*limit, &clock);
                    scope.spawn(move || {
                        let mut held: Vec<(Nanos, u32, Receipt)> = Vec::new();
                        for &step in script {
                            if step % 5 == 4 {
                                clock.advance(Duration::from_nanos(P / 3));
                            }
                            let now = clock.now();
                            match step % 3 {
                                0 => {
                                    let (d, r) = limit.charge_at(now, 1);
                                    if d.is_allowed() && r.is_charged() {
                                        held.push((now, 1, r));
                                    }
                                }
                                1 => {
                                    if let Some((d, wait, r)) = limit.book_at(now, 1) {
                                        if d.is_allowed() && r.is_charged() {
                                            let slot = now.as_u64() + wait.as_nanos() as u64;
                                            held.push((Nanos::new(slot), 1, r));
                                        }
                                    }
                                }
                                _ if held.is_empty() => {}
                                _ => {
                                    // Mostly the latest, sometimes an earlier one.
                                    let pick = if step % 7 < 4 {
                                        held.len() - 1
                                    } else {
                                        (step as usize / 7) % held.len()
                                    };
                                    let (_, _, r) = held.remove(pick);
                                    let _ = limit.refund(r);
                                }
                            }
                        }
                        held.into_iter()
                            .map(|(at, cost, _)| (at, cost))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("no panic"))
                .collect()
        });
        let now = clock.now();
        for at in (0..16).map(|k| Nanos::new(now.as_u64() + k * P / 2)) {
            for cost in 1..=2 {
                if limit.peek_at(at, cost).is_allowed() {
                    let mut with = kept.clone();
                    with.push((at, cost));
                    if let Err(e) = common::conforms(policy, &with) {
                        panic!("round {round}: {cost} admitted at {at:?}: {e}");
                    }
                }
            }
        }
    }
}

#[test]
fn racing_refunds_in_any_order_never_pass_the_limit() {
    let gcra = Gcra::new(policy(1, 2));
    threaded_rounds(&|clock| Box::new(RateLimiter::with_clock(gcra, clock.clone())));
    threaded_rounds(&|clock| Box::new(RateLimiter::locked_with_clock(gcra, clock.clone())));
    threaded_rounds(&|clock| Box::new(Shaper::with_clock(policy(1, 2), clock.clone())));
    threaded_rounds(&|clock| {
        let keyed = KeyedBuilder::new(gcra)
            .shards(1)
            .clock(clock.clone())
            .build::<u64>()
            .unwrap();
        Box::new(OneKey(keyed))
    });
}

/// Key 7 of a keyed GCRA limiter, owned, as a [`Limit`].
struct OneKey(floodgate::KeyedLimiter<u64, Gcra, ManualClock>);

impl Limit for OneKey {
    fn now(&self) -> Nanos {
        self.0.limit(&7).now()
    }
    fn charge_at(&self, now: Nanos, cost: u32) -> (floodgate::Decision, Receipt) {
        self.0.limit(&7).charge_at(now, cost)
    }
    fn peek_at(&self, now: Nanos, cost: u32) -> floodgate::Decision {
        self.0.limit(&7).peek_at(now, cost)
    }
    fn refund(&self, receipt: Receipt) -> bool {
        self.0.limit(&7).refund(receipt)
    }
    fn book_at(&self, now: Nanos, cost: u32) -> Option<(floodgate::Decision, Duration, Receipt)> {
        self.0.limit(&7).book_at(now, cost)
    }
}

/// A cancellation that moved later reservations is recorded, so a later one of a
/// reservation it moved finds it where it is. `a` (3 units), `b` and `c` reserved in
/// turn (1 per 100 ms, burst 3): cancelling `a` gives back 1 (`b` and `c` were
/// reserved after it: 2 stay spent) and moves `b` and `c` down 100 ms; `b` then
/// still has `c` after it: nothing back (read at `b`'s booked end, unmoved, it
/// would give its unit back with `c`'s slot still ahead); `c`, the last, gives its
/// unit back.
#[test]
fn a_cancellation_that_moved_later_reservations_counts_in_their_cancels() {
    let policy = Policy::new(1, Duration::from_millis(100))
        .unwrap()
        .with_burst(3)
        .unwrap();
    let clock = ManualClock::starting_at(Nanos::from_secs(100));
    cancel_in_turn(&Shaper::with_clock(policy, clock.clone()));
    let clock = ManualClock::starting_at(Nanos::from_secs(100));
    cancel_in_turn(&Shaper::locked_with_clock(policy, clock.clone()));
}

fn cancel_in_turn<S: floodgate::StateCell<floodgate::GcraState>>(shaper: &Shaper<ManualClock, S>) {
    const MS: u64 = 1_000_000;
    let at = |ms: u64| Nanos::new(100_000 * MS + ms * MS);
    let max = Duration::from_secs(1);
    let a = shaper.reserve(3, max).unwrap();
    let b = shaper.reserve(1, max).unwrap();
    let c = shaper.reserve(1, max).unwrap();
    assert_eq!(shaper.state().tat(), at(500));
    assert_eq!(shaper.cancel(a), 1);
    assert_eq!(shaper.state().tat(), at(400));
    assert_eq!(shaper.cancel(b), 0, "c still waits after b");
    assert_eq!(shaper.state().tat(), at(400));
    assert_eq!(shaper.cancel(c), 1, "c is the last");
    assert_eq!(shaper.state().tat(), at(300));
}
