//! A reservation's peek (`peek_reserve_at`) against the reservation itself: over
//! random policies, costs (0, within the burst, above it), bounds and bookings
//! (reservations, cancellations, refunds, earlier clock readings), the peek at an
//! instant is exactly what `reserve_at` then decides at that instant — the decision
//! and the delay or error — for the shaper, its mutex twin and the keyed limiter on
//! every storage; and a peek writes nothing: a twin that is never peeked makes the
//! same reservations.
#![cfg(not(loom))]

#[macro_use]
mod common;

use floodgate::{
    Clock, Decision, Gcra, GcraState, KeyedLimiter, ManualClock, Nanos, Policy, Reservation,
    ReservationPeek, ShapeError, Shaper, StateCell, Storage,
};
use proptest::prelude::*;
use std::time::Duration;

/// One step of a booking trace.
#[derive(Clone, Debug)]
enum Op {
    /// Moves the clock forward `ns`.
    Advance(u64),
    /// Peeks, then reserves, `cost` units for `key` within `max_delay`, at the
    /// clock's reading less `back` ns (an earlier reading).
    Reserve {
        key: u64,
        cost: u32,
        max_delay: Duration,
        back: u64,
    },
    /// Gives back the `pick`-th outstanding reservation (cancel, or refund for keys).
    GiveBack { pick: usize },
}

/// Costs 0, 1, up to the burst, just above it and `u32::MAX`; bounds 0, up to a few
/// seconds, and unbounded; steps within and across intervals.
fn op(burst: u32) -> impl Strategy<Value = Op> {
    let cost = common::reservation_cost(burst);
    let max_delay = common::reservation_bound();
    let back = prop_oneof![4 => Just(0u64), 1 => 0u64..500_000_000];
    prop_oneof![
        3 => (0u64..400_000_000).prop_map(Op::Advance),
        8 => (0u64..4, cost, max_delay, back).prop_map(|(key, cost, max_delay, back)| {
            Op::Reserve { key, cost, max_delay, back }
        }),
        2 => any::<usize>().prop_map(|pick| Op::GiveBack { pick }),
    ]
}

fn trace() -> impl Strategy<Value = (Policy, Vec<Op>)> {
    common::shaper_policy().prop_flat_map(|p| {
        let burst = u32::try_from(p.burst()).expect("burst ≤ 8");
        (Just(p), prop::collection::vec(op(burst), 1..80))
    })
}

/// What a reservation reports, comparable across limiters: the decision and the
/// delay, or the error.
type Outcome = Result<(Decision, Duration), ShapeError>;

fn shaped(r: &Result<Reservation, ShapeError>) -> Outcome {
    r.as_ref()
        .map(|r| (r.decision(), r.delay()))
        .map_err(|e| *e)
}

/// The peek as the reservation it foretells: an admission's decision and delay, or
/// the error — and a refusal's decision must say the same as the error.
fn foretold(peek: &ReservationPeek) -> Outcome {
    let decision = peek.decision();
    match peek.delay() {
        Ok(delay) => {
            assert!(decision.is_allowed(), "{peek:?}");
            Ok((decision, delay))
        }
        Err(e) => {
            assert!(!decision.is_allowed(), "{peek:?}");
            let retry = match e {
                ShapeError::TooLong { retry_after } => Some(retry_after),
                _ => None,
            };
            assert_eq!(decision.retry_after(), retry, "{peek:?}");
            Err(e)
        }
    }
}

/// A refusal's decision reports the schedule as it stands, as the peek of a
/// reservation of nothing at the same instant does: its `remaining` (the units
/// reservable within the bound) and its reset (`ReservationPeek`'s docs).
fn refusal_shows_the_schedule(peek: &ReservationPeek, schedule: &ReservationPeek) {
    if peek.delay().is_err() {
        let (d, s) = (peek.decision(), schedule.decision());
        assert_eq!(
            (d.remaining(), d.reset_after()),
            (s.remaining(), s.reset_after())
        );
    }
}

/// Runs `ops` on `peeked` (peeked before every reservation) and on `twin` (never
/// peeked), both on `clock`: each peek is what the reservation right after it
/// decides, and the twin makes the same reservations.
fn shaper_case<S: StateCell<GcraState>>(
    ops: &[Op],
    clock: &ManualClock,
    peeked: &Shaper<ManualClock, S>,
    twin: &Shaper<ManualClock, S>,
) -> Result<(), TestCaseError> {
    let mut held: Vec<(Reservation, Reservation)> = Vec::new();
    for op in ops {
        match *op {
            Op::Advance(ns) => {
                clock.advance(Duration::from_nanos(ns));
            }
            Op::Reserve {
                cost,
                max_delay,
                back,
                ..
            } => {
                let now = Nanos::new(clock.now().as_u64().saturating_sub(back));
                let before = peeked.state();
                let peek = peeked.peek_reserve_at(now, cost, max_delay);
                refusal_shows_the_schedule(&peek, &peeked.peek_reserve_at(now, 0, max_delay));
                prop_assert_eq!(peeked.state(), before, "the peek wrote");
                let reserved = peeked.reserve_at(now, cost, max_delay);
                let unpeeked = twin.reserve_at(now, cost, max_delay);
                prop_assert_eq!(foretold(&peek), shaped(&reserved));
                prop_assert_eq!(shaped(&unpeeked), shaped(&reserved));
                if let (Ok(a), Ok(b)) = (reserved, unpeeked) {
                    held.push((a, b));
                }
            }
            Op::GiveBack { pick } => {
                if !held.is_empty() {
                    let (a, b) = held.swap_remove(pick % held.len());
                    prop_assert_eq!(peeked.cancel(a), twin.cancel(b));
                }
            }
        }
        prop_assert_eq!(peeked.state(), twin.state());
    }
    Ok(())
}

fn keyed_on<S: Storage<u64, GcraState>>(
    policy: Policy,
    clock: &ManualClock,
) -> KeyedLimiter<u64, Gcra, ManualClock, S> {
    // Room for every key: no eviction, so the twins' tables hold the same keys.
    common::keyed_on(Gcra::new(policy), clock, 64, 4)
}

/// [`shaper_case`] for a keyed limiter on storage `S`, four keys; a peek also
/// inserts no key.
fn keyed_case<S: Storage<u64, GcraState>>(policy: Policy, ops: &[Op]) -> Result<(), TestCaseError> {
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let peeked = keyed_on::<S>(policy, &clock);
    let twin = keyed_on::<S>(policy, &clock);
    let mut held = Vec::new();
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
                let keys = peeked.metrics().live_keys;
                let schedule = peeked.peek_at(&key, now, 0);
                let peek = peeked.peek_reserve_at(&key, now, cost, max_delay);
                let nothing = peeked.peek_reserve_at(&key, now, 0, max_delay);
                refusal_shows_the_schedule(&peek, &nothing);
                prop_assert_eq!(peeked.metrics().live_keys, keys, "the peek inserted");
                prop_assert_eq!(peeked.peek_at(&key, now, 0), schedule, "the peek wrote");
                let reserved = peeked.reserve_at(&key, now, cost, max_delay);
                let unpeeked = twin.reserve_at(&key, now, cost, max_delay);
                let strip = |r: &Result<(Decision, Duration, floodgate::Receipt), ShapeError>| {
                    r.as_ref().map(|(d, delay, _)| (*d, *delay)).map_err(|e| *e)
                };
                prop_assert_eq!(foretold(&peek), strip(&reserved));
                prop_assert_eq!(strip(&unpeeked), strip(&reserved));
                if let (Ok((_, _, a)), Ok((_, _, b))) = (reserved, unpeeked) {
                    held.push((key, a, b));
                }
            }
            Op::GiveBack { pick } => {
                if !held.is_empty() {
                    let (key, a, b) = held.swap_remove(pick % held.len());
                    prop_assert_eq!(peeked.refund(&key, a), twin.refund(&key, b));
                }
            }
        }
        for key in 0..4u64 {
            let now = clock.now();
            prop_assert_eq!(peeked.peek_at(&key, now, 0), twin.peek_at(&key, now, 0));
        }
        prop_assert_eq!(peeked.metrics().live_keys, twin.metrics().live_keys);
    }
    Ok(())
}

proptest! {
    #![proptest_config(crate::common::cases(256))]

    #[test]
    fn a_shapers_peek_is_its_next_reservation((policy, ops) in trace()) {
        let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
        let peeked = Shaper::with_clock(policy, clock.clone());
        let twin = Shaper::with_clock(policy, clock.clone());
        shaper_case(&ops, &clock, &peeked, &twin)?;
        let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
        let peeked = Shaper::locked_with_clock(policy, clock.clone());
        let twin = Shaper::locked_with_clock(policy, clock.clone());
        shaper_case(&ops, &clock, &peeked, &twin)?;
    }

    #[test]
    fn a_keyed_peek_is_the_keys_next_reservation((policy, ops) in trace()) {
        each_storage!(S => { keyed_case::<S>(policy, &ops)?; });
    }
}

/// Borrowed keys peek the owned key's schedule, and a key never seen peeks a fresh
/// schedule: the whole burst now, whatever the other keys booked (`String` keys:
/// the storages that hold them).
#[test]
fn a_borrowed_key_peeks_the_owned_keys_schedule() {
    fn case<S: Storage<String, GcraState>>() {
        let clock = ManualClock::new();
        let keyed: KeyedLimiter<String, Gcra, ManualClock, S> = floodgate::KeyedBuilder::new(
            Gcra::new(Policy::per_second(10).unwrap().with_burst(2).unwrap()),
        )
        .clock(clock.clone())
        .build_in()
        .unwrap();
        let max = Duration::from_millis(100);
        let _ = keyed.reserve("alice", 2, max).unwrap();
        let peek = keyed.peek_reserve("alice", 2, max);
        // TAT 200 ms, τ 200 ms: two more units end at 400 ms, 100 ms past τ + max.
        assert_eq!(
            peek.delay(),
            Err(ShapeError::TooLong {
                retry_after: Duration::from_millis(100)
            })
        );
        assert_eq!(keyed.peek_reserve(&"alice".to_owned(), 2, max), peek);
        assert_eq!(
            keyed.peek_reserve("bob", 2, Duration::ZERO).delay(),
            Ok(Duration::ZERO)
        );
        assert_eq!(keyed.metrics().live_keys, 1);
    }
    case::<floodgate::Heap>();
    case::<floodgate::Fingerprint>();
}

/// At the end of `u64` time a slot that would pass it can never be held: the peek
/// says `Never`, as the reservation does, for every bound — the shaper, its mutex
/// twin and every keyed storage, at instants up to `u64::MAX`.
#[test]
fn a_peek_at_the_end_of_time_is_the_reservations_never() {
    /// A booking first (when one fits), then the peek and the reservation; whether
    /// the peek said `Never`.
    fn shaper_at_end<S: StateCell<GcraState>>(
        s: &Shaper<ManualClock, S>,
        now: Nanos,
        cost: u32,
        max: Duration,
    ) -> bool {
        let _ = s.reserve_at(now, 1, max);
        let peek = s.peek_reserve_at(now, cost, max);
        assert_eq!(foretold(&peek), shaped(&s.reserve_at(now, cost, max)));
        matches!(peek.delay(), Err(ShapeError::Never { .. }))
    }
    let policy = Policy::new(1, Duration::from_secs(3_600 * 24 * 365))
        .and_then(|p| p.with_burst(2))
        .unwrap();
    let year = 3_600 * 24 * 365 * 1_000_000_000u64;
    let ends = [
        u64::MAX,
        u64::MAX - 1,
        u64::MAX - year / 2,
        u64::MAX - 3 * year,
    ];
    let bounds = [Duration::ZERO, Duration::from_secs(1), Duration::MAX];
    let clock = ManualClock::new();
    let mut nevers = 0;
    for &end in &ends {
        for &max in &bounds {
            for cost in 0..=3u32 {
                let now = Nanos::new(end);
                let atomic = Shaper::with_clock(policy, clock.clone());
                let locked = Shaper::locked_with_clock(policy, clock.clone());
                nevers += usize::from(shaper_at_end(&atomic, now, cost, max));
                nevers += usize::from(shaper_at_end(&locked, now, cost, max));
                each_storage!(S => {
                    let keyed = keyed_on::<S>(policy, &clock);
                    let _ = keyed.reserve_at(&1, now, 1, max);
                    let peek = keyed.peek_reserve_at(&1, now, cost, max);
                    let reserved = keyed.reserve_at(&1, now, cost, max);
                    assert_eq!(foretold(&peek), reserved.map(|(d, delay, _)| (d, delay)));
                });
            }
        }
    }
    // The corner is reached: within the burst, some of these slots pass the end of
    // time (3 of 4 costs above 0 at the last instants, not only cost 3 > burst).
    assert!(nevers > 2 * ends.len() * bounds.len(), "{nevers}");
}
