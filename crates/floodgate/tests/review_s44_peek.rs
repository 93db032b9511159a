//! Session 44 review of the reservation peek (`peek_reserve_at`): the attacks the
//! peek's own suite (`reserve_peek.rs`: room for every key, no removal, no policy
//! change, one thread) leaves out.
//!
//! * A full table: eight keys through four places, so keys are evicted and come
//!   back fresh; keys removed (a removal instant the next decision is clamped to)
//!   and peeked at an instant before it; the policy changed at runtime; plain
//!   checks between. On every storage, each peek (the request's cost and 0, present
//!   and absent keys) is what the reservation right after it decides, and the
//!   peeked table stays the twin of one never peeked: the same metrics (admitted,
//!   denied, live, reclaimed, evicted, removed), the same schedules, the same
//!   refunds.
//! * Threads: peeks from two threads at every storage and the shaper (both cells)
//!   write nothing: metrics, schedules, and what an outstanding receipt or
//!   reservation gives back are what they were.
//! * A shaper whose policy changes at runtime: the peek is still the next
//!   reservation, on both cells.
#![cfg(not(loom))]

#[macro_use]
mod common;

use floodgate::{
    AtomicCell, Clock, Decision, Gcra, GcraState, KeyedBuilder, KeyedLimiter, LockedCell,
    ManualClock, Nanos, Policy, Receipt, ReservationPeek, ShapeError, Shaper, StateCell, Storage,
};
use proptest::prelude::*;
use std::sync::Arc;
use std::time::Duration;

/// Keys `0..KEYS` through a table of `PLACES` places.
const KEYS: u64 = 8;
const PLACES: usize = 4;

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    /// Peek (at `cost` and at 0), then reserve, at the clock less `back` ns.
    Reserve {
        key: u64,
        cost: u32,
        max_delay: Duration,
        back: u64,
    },
    /// A plain check of `cost` (counted in the metrics).
    Check {
        key: u64,
        cost: u32,
    },
    /// Removes the key at the clock's reading.
    Remove(u64),
    /// Refunds the `pick`-th outstanding receipt.
    Refund(usize),
    /// Changes the policy at runtime: `rate` per second, burst `burst`.
    SetPolicy {
        rate: u64,
        burst: u64,
    },
}

fn policy(rate: u64, burst: u64) -> Policy {
    Policy::per_second(rate)
        .and_then(|p| p.with_burst(burst))
        .expect("a valid policy")
}

fn op() -> impl Strategy<Value = Op> {
    let cost = prop_oneof![
        2 => Just(0u32),
        6 => 1u32..=4,
        2 => 5u32..=9,
        1 => Just(u32::MAX),
    ];
    let max_delay = prop_oneof![
        2 => Just(Duration::ZERO),
        5 => (0u64..2_000_000_000).prop_map(Duration::from_nanos),
        1 => Just(Duration::MAX),
    ];
    let back = prop_oneof![3 => Just(0u64), 2 => 0u64..3_000_000_000];
    prop_oneof![
        3 => (0u64..500_000_000).prop_map(Op::Advance),
        8 => (0..KEYS, cost.clone(), max_delay, back)
            .prop_map(|(key, cost, max_delay, back)| Op::Reserve { key, cost, max_delay, back }),
        2 => (0..KEYS, cost).prop_map(|(key, cost)| Op::Check { key, cost }),
        2 => (0..KEYS).prop_map(Op::Remove),
        2 => any::<usize>().prop_map(Op::Refund),
        1 => (1u64..=50, 1u64..=6).prop_map(|(rate, burst)| Op::SetPolicy { rate, burst }),
    ]
}

fn limiter<S: Storage<u64, GcraState>>(
    policy: Policy,
    clock: &ManualClock,
) -> KeyedLimiter<u64, Gcra, ManualClock, S> {
    // One shard, one hash seed: the twins place and evict keys alike.
    KeyedBuilder::new(Gcra::new(policy))
        .capacity(PLACES)
        .shards(1)
        .hash_seed(44)
        .clock(clock.clone())
        .build_in::<u64, S>()
        .expect("valid configuration")
}

type Reserved = Result<(Decision, Duration, Receipt), ShapeError>;

fn stripped(r: &Reserved) -> Result<(Decision, Duration), ShapeError> {
    r.as_ref().map(|(d, delay, _)| (*d, *delay)).map_err(|e| *e)
}

fn foretold(p: &ReservationPeek) -> Result<(Decision, Duration), ShapeError> {
    p.delay().map(|delay| (p.decision(), delay))
}

/// Every key's schedule at `now` (a plain peek: writes nothing).
fn schedules<S: Storage<u64, GcraState>>(
    k: &KeyedLimiter<u64, Gcra, ManualClock, S>,
    now: Nanos,
) -> Vec<Decision> {
    (0..KEYS).map(|key| k.peek_at(&key, now, 0)).collect()
}

fn full_table_case<S: Storage<u64, GcraState>>(ops: &[Op]) -> Result<(), TestCaseError> {
    let clock = ManualClock::starting_at(Nanos::from_secs(100));
    let mut peeked = limiter::<S>(policy(10, 3), &clock);
    let mut twin = limiter::<S>(policy(10, 3), &clock);
    let mut held: Vec<(u64, Receipt, Receipt)> = Vec::new();
    for op in ops {
        match *op {
            Op::Advance(ns) => {
                clock.advance(Duration::from_nanos(ns));
            }
            Op::Reserve {
                key,
                cost,
                max_delay,
                back,
            } => {
                let now = Nanos::new(clock.now().as_u64().saturating_sub(back));
                let metrics = peeked.metrics();
                let before = schedules(&peeked, clock.now());
                // Every key peeked, present or not, at 0 and at the cost.
                for other in 0..KEYS {
                    let _ = peeked.peek_reserve_at(&other, now, 0, max_delay);
                    let _ = peeked.peek_reserve_at(&other, now, cost, max_delay);
                }
                let peek = peeked.peek_reserve_at(&key, now, cost, max_delay);
                prop_assert_eq!(peeked.metrics(), metrics, "a peek moved the metrics");
                prop_assert_eq!(schedules(&peeked, clock.now()), before, "a peek wrote");
                let reserved = peeked.reserve_at(&key, now, cost, max_delay);
                let unpeeked = twin.reserve_at(&key, now, cost, max_delay);
                prop_assert_eq!(foretold(&peek), stripped(&reserved), "{:?}", op);
                prop_assert_eq!(stripped(&unpeeked), stripped(&reserved));
                if let (Ok((_, _, a)), Ok((_, _, b))) = (reserved, unpeeked) {
                    held.push((key, a, b));
                }
            }
            Op::Check { key, cost } => {
                prop_assert_eq!(peeked.check_n(&key, cost), twin.check_n(&key, cost));
            }
            Op::Remove(key) => {
                prop_assert_eq!(peeked.remove(&key), twin.remove(&key));
            }
            Op::Refund(pick) => {
                if !held.is_empty() {
                    let (key, a, b) = held.swap_remove(pick % held.len());
                    prop_assert_eq!(peeked.refund(&key, a), twin.refund(&key, b));
                }
            }
            Op::SetPolicy { rate, burst } => {
                peeked.set_policy(policy(rate, burst));
                twin.set_policy(policy(rate, burst));
            }
        }
        prop_assert_eq!(peeked.metrics(), twin.metrics());
        let now = clock.now();
        prop_assert_eq!(schedules(&peeked, now), schedules(&twin, now));
    }
    Ok(())
}

proptest! {
    #![proptest_config(crate::common::cases(192))]

    /// Mutations seen failing: the table's peek judging a live key at the caller's
    /// instant instead of the one clamped to the shard's latest removal (heap and
    /// inline `peek`: `decide_unwritten(.., now, ..)` for `clamped`): a peek before
    /// a removal's instant differs from the reservation; `peek_reserve_at` counting
    /// its decision (`self.count(..)`, as `settle` does): the metrics move.
    #[test]
    fn a_peek_on_a_full_table_is_the_next_reservation_and_writes_nothing(
        ops in prop::collection::vec(op(), 1..100)
    ) {
        full_table_case::<floodgate::Heap>(&ops)?;
        full_table_case::<floodgate::Inline>(&ops)?;
        full_table_case::<floodgate::Fingerprint>(&ops)?;
    }
}

/// A removal at 100 s, the key reserved again then, and a reservation read at 5 s
/// (a clock behind the shard's removal): the shard judges it at 100 s, and so must
/// the peek — the pinned case of the proptest above.
#[test]
fn a_peek_before_a_removal_is_judged_at_the_removal() {
    fn case<S: Storage<u64, GcraState>>() {
        let clock = ManualClock::starting_at(Nanos::from_secs(100));
        let keyed = limiter::<S>(policy(1, 1), &clock);
        let max = Duration::ZERO;
        assert!(keyed.reserve(&1, 1, max).is_ok());
        assert!(keyed.remove(&1));
        assert!(keyed.reserve(&1, 1, max).is_ok()); // fresh: TAT = 101 s
        let early = Nanos::from_secs(5);
        let peek = keyed.peek_reserve_at(&1, early, 1, max);
        assert_eq!(
            peek.delay(),
            Err(ShapeError::TooLong {
                retry_after: Duration::from_secs(1)
            })
        );
        assert_eq!(
            foretold(&peek),
            stripped(&keyed.reserve_at(&1, early, 1, max))
        );
    }
    on_every_storage!(case);
}

/// Two threads peek a full keyed table (present and absent keys, every kind of
/// cost, bound and instant) while nothing else runs: the metrics, every schedule,
/// and what an outstanding receipt gives back are what a never-peeked twin shows.
///
/// Mutation seen failing: `peek_reserve_at` deciding through the table
/// (`self.table.decide::<KeyedCharge<_>, _, _>` in place of `self.table.peek`): the
/// peeks reserve, insert and evict.
#[test]
fn peeks_from_threads_write_nothing_on_any_storage() {
    fn case<S: Storage<u64, GcraState> + 'static>() {
        let clock = ManualClock::starting_at(Nanos::from_secs(50));
        let peeked = Arc::new(limiter::<S>(policy(10, 3), &clock));
        let twin = limiter::<S>(policy(10, 3), &clock);
        let mut receipts = Vec::new();
        for key in 0..PLACES as u64 {
            let a = peeked.reserve(&key, 2, Duration::from_secs(1));
            let b = twin.reserve(&key, 2, Duration::from_secs(1));
            let (Ok((_, _, a)), Ok((_, _, b))) = (a, b) else {
                panic!("a fresh key's reservation fits");
            };
            receipts.push((key, a, b));
        }
        let metrics = peeked.metrics();
        let threads: Vec<_> = (0..2u64)
            .map(|t| {
                let peeked = Arc::clone(&peeked);
                std::thread::spawn(move || {
                    let bounds = [Duration::ZERO, Duration::from_millis(150), Duration::MAX];
                    for i in 0..4_000u64 {
                        let key = (i * 7 + t) % KEYS;
                        let cost = [0, 1, 3, 4, u32::MAX][(i % 5) as usize];
                        let now = Nanos::from_secs(40 + (i % 30));
                        let _ = peeked.peek_reserve_at(&key, now, cost, bounds[(i % 3) as usize]);
                        let _ = peeked.peek_reserve(&key, cost, bounds[(i % 2) as usize]);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("a peeking thread");
        }
        assert_eq!(peeked.metrics(), metrics);
        assert_eq!(peeked.metrics(), twin.metrics());
        let now = clock.now();
        assert_eq!(schedules(&peeked, now), schedules(&twin, now));
        clock.advance(Duration::from_millis(50));
        for (key, a, b) in receipts {
            assert_eq!(peeked.refund(&key, a), twin.refund(&key, b));
        }
        assert_eq!(
            schedules(&peeked, clock.now()),
            schedules(&twin, clock.now())
        );
    }
    on_every_storage!(case);
}

/// Two threads peek a shaper (each cell) booked ahead: the state and what an
/// outstanding reservation's cancellation gives back (the refund ledger) are the
/// twin's.
///
/// Mutation seen failing: `Shaper::peek_reserve_at` through the cell's charge
/// (`self.cell.charge(&reserve, now, cost)`): the state moves.
#[test]
fn shaper_peeks_from_threads_write_nothing() {
    fn case<S: StateCell<GcraState> + 'static>(
        make: impl Fn(Policy, ManualClock) -> Shaper<ManualClock, S>,
    ) {
        let clock = ManualClock::starting_at(Nanos::from_secs(50));
        let peeked = Arc::new(make(policy(10, 3), clock.clone()));
        let twin = make(policy(10, 3), clock.clone());
        let max = Duration::from_secs(1);
        let a = peeked.reserve(3, max).expect("fits");
        let b = twin.reserve(3, max).expect("fits");
        let a2 = peeked.reserve(2, max).expect("fits");
        let b2 = twin.reserve(2, max).expect("fits");
        let state = peeked.state();
        let threads: Vec<_> = (0..2u64)
            .map(|t| {
                let peeked = Arc::clone(&peeked);
                std::thread::spawn(move || {
                    for i in 0..4_000u64 {
                        let cost = [0, 1, 3, 4, u32::MAX][((i + t) % 5) as usize];
                        let bound = [Duration::ZERO, Duration::from_millis(250), Duration::MAX]
                            [(i % 3) as usize];
                        let _ = peeked.peek_reserve_at(Nanos::from_secs(45 + i % 10), cost, bound);
                        let _ = peeked.peek_reserve(cost, bound);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("a peeking thread");
        }
        assert_eq!(peeked.state(), state);
        assert_eq!(peeked.state(), twin.state());
        assert_eq!(peeked.cancel(a), twin.cancel(b));
        assert_eq!(peeked.cancel(a2), twin.cancel(b2));
        assert_eq!(peeked.state(), twin.state());
    }
    case::<AtomicCell<GcraState>>(Shaper::with_clock);
    case::<LockedCell<GcraState>>(Shaper::locked_with_clock);
}

/// A shaper's policy changed at runtime (`set_policy`, tighter then looser, with
/// reservations outstanding): at every instant, cost and bound, the peek is the
/// reservation made right after it, on both cells, and the peeked shaper stays its
/// never-peeked twin.
///
/// Mutation seen failing: `Shaper::peek_reserve_at` without the bound
/// (`Reserve::new(self.gcra, Duration::ZERO)`): the peek refuses slots the
/// reservation books.
#[test]
fn a_shaper_peek_after_a_policy_change_is_the_next_reservation() {
    fn case<S: StateCell<GcraState>>(make: impl Fn(Policy, ManualClock) -> Shaper<ManualClock, S>) {
        let clock = ManualClock::starting_at(Nanos::from_secs(10));
        let mut peeked = make(policy(10, 4), clock.clone());
        let mut twin = make(policy(10, 4), clock.clone());
        let bounds = [Duration::ZERO, Duration::from_millis(350), Duration::MAX];
        let mut step = 0u64;
        for next in [policy(2, 1), policy(50, 6), policy(1, 3)] {
            for _ in 0..12 {
                step += 1;
                let now = Nanos::new(clock.now().as_u64().saturating_sub(step % 3 * 40_000_000));
                let cost = [0, 1, 2, 3, 7, u32::MAX][(step % 6) as usize];
                let bound = bounds[(step % 3) as usize];
                let peek = peeked.peek_reserve_at(now, cost, bound);
                let reserved = peeked.reserve_at(now, cost, bound);
                let unpeeked = twin.reserve_at(now, cost, bound);
                let outcome = |r: &Result<floodgate::Reservation, ShapeError>| {
                    r.as_ref()
                        .map(|r| (r.decision(), r.delay()))
                        .map_err(|e| *e)
                };
                assert_eq!(foretold(&peek), outcome(&reserved), "step {step}");
                assert_eq!(outcome(&unpeeked), outcome(&reserved), "step {step}");
                clock.advance(Duration::from_millis(70));
            }
            peeked.set_policy(next);
            twin.set_policy(next);
            assert_eq!(peeked.state(), twin.state());
        }
    }
    case::<AtomicCell<GcraState>>(Shaper::with_clock);
    case::<LockedCell<GcraState>>(Shaper::locked_with_clock);
}
