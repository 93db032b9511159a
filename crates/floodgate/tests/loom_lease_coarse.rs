//! loom models of the lease protocol under the coarse expiry clock
//! ([`Expiry::Coarse`]): leases expire by a word that the model's main thread moves
//! as the upkeep thread would, while two threads decide. Every reading is a
//! `Relaxed` load of that word, so loom lets a thread read an older tick than the
//! main thread has stored, or than the other thread has read: the threads' expiry
//! readings lag the upkeep and differ between them, the refill clock (a
//! [`ManualClock`]) stands still or moves apart from them, and a lease expires while
//! its owner spends it, refills past it, or takes more than it holds.
//!
//! Each model starts and ends quiescent (before the spawns, after the joins): `a`
//! and `b`. Over `[a, b]` it asserts the module's bound — admitted ≤ the central
//! word's remaining at `a` + `⌊Δ/T⌋` (Δ: the refill clock's move) + the units on
//! lease at `a` (unexpired at `a`'s expiry reading), which is within `B + ⌊Δ/T⌋ +`
//! those units — and that no unit is counted twice: each unit admitted in `[a, b]` or
//! held by a shard at `b` was held at `a` or handed out by the central word in
//! between. (Under loom a thread's owner index is its number in the model: main 0,
//! the spawned threads 1 and 2. A thread that reads the clock, then takes over a
//! recycled index, is `tests/lease_stale_reading.rs` and the stress test
//! `tests/lease_coarse_threads.rs`: loom threads keep their index.)
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=4 cargo test -p floodgate --release --test loom_lease_coarse`
#![cfg(loom)]

use std::time::Duration;

mod lease_ledger;
mod loom_seen;

use floodgate::lease::{CoarseClock, Expiry};
use floodgate::{LeasedGcra, ManualClock, Nanos, Policy};
use lease_ledger::{admitted_on_threads_marked, assert_accounted, look};
use loom::sync::Arc;
use loom_seen::{Kinds, Seen, Span};

/// One unit a second.
const T: u64 = 1_000_000_000;
/// An expiry tick (2^16 ns): a lease is dated to one.
const TICK: u64 = 1 << 16;
/// Leases live two ticks: one taken at tick k is spendable at ticks k and k + 1.
const LIFETIME_TICKS: u64 = 2;

/// What a model runs.
struct Model {
    burst: u64,
    lease: u32,
    shards: usize,
    /// Taken by shard 1 (thread 1's) at expiry tick 0, before `a`.
    pre_lease: Option<u32>,
    /// The expiry clock's tick at `a`.
    tick_at_a: u64,
    /// The upkeep's later ticks, stored while the threads decide.
    upkeep: &'static [u64],
    /// Moves of the refill clock, in units of T, made while the threads decide.
    refill_moves: u64,
    /// The costs thread 1 and thread 2 decide, in order.
    costs: [&'static [u32]; 2],
    /// How many distinct ends (admitted, and the look at `b`) loom's executions reach
    /// at CI's bound (`LOOM_MAX_PREEMPTIONS=4`): each tells apart orders of the
    /// threads' refills, spends and readings against the upkeep, and fewer mean loom
    /// ran fewer orders.
    ends: usize,
    /// Whether the model is about where the upkeep falls against thread 1 (the
    /// owner of the pre-taken lease): a [`Span`] around the upkeep, read by thread 1
    /// around its decisions, and the model fails unless loom ran thread 1's
    /// decisions all before the upkeep, across it, and all after it. (Thread 2 reads
    /// no mark: each read is one more step in loom's search, and thread 2 holds no
    /// lease whose expiry its reading decides.)
    place_upkeep: bool,
}

/// Where the upkeep fell against thread 1's decisions (indexed as
/// `loom_seen::PLACEMENTS`).
const UPKEEP_PLACEMENTS: &[&str] = &[
    "thread 1 decided all before the upkeep",
    "thread 1 decided across the upkeep",
    "thread 1 decided all after the upkeep",
];

/// The models' common ground: thread 1's lease of 2, taken at tick 0 with one unit
/// left, is in its last tick at `a`, and the upkeep expires it while the threads
/// decide; each model changes what it is about.
const BASE: Model = Model {
    burst: 3,
    lease: 2,
    shards: 4,
    pre_lease: Some(1),
    tick_at_a: LIFETIME_TICKS - 1,
    upkeep: &[LIFETIME_TICKS],
    refill_moves: 0,
    costs: [&[1, 1], &[1]],
    ends: 2,
    place_upkeep: false,
};

fn run(name: &str, m: &'static Model) {
    let ends = Kinds::default();
    let seen = ends.clone();
    let placements = Seen::new(UPKEEP_PLACEMENTS);
    let placed = placements.clone();
    loom::model(move || {
        let coarse = CoarseClock::new();
        let refill = ManualClock::starting_at(Nanos::new(10 * T));
        let mut lim = LeasedGcra::builder(
            Policy::per_second(1)
                .and_then(|p| p.with_burst(m.burst))
                .expect("valid policy"),
        )
        .shards(m.shards)
        .lease_size(m.lease)
        .lifetime(Duration::from_nanos(LIFETIME_TICKS * TICK))
        .build_with(refill.clone(), Expiry::Coarse(coarse.clone()))
        .expect("valid configuration");
        if let Some(cost) = m.pre_lease {
            assert!(lim.check_on(1, cost).is_allowed());
        }
        coarse.upkeep(m.tick_at_a * TICK);
        let a = look(&mut lim);

        let lim = Arc::new(lim);
        // The main thread is the upkeep thread, and moves the refill clock.
        let span = m.place_upkeep.then(|| Arc::new(Span::default()));
        let marks = span.clone();
        let mark = move |thread| match &marks {
            Some(span) if thread == 0 => span.mark(),
            _ => 0,
        };
        let (admitted, read) = admitted_on_threads_marked(&lim, &m.costs, mark, || {
            if let Some(span) = &span {
                span.begin();
            }
            for &tick in m.upkeep {
                coarse.upkeep(tick * TICK);
            }
            if let Some(span) = &span {
                span.end();
            }
            for _ in 0..m.refill_moves {
                refill.advance(Duration::from_nanos(T));
            }
        });

        let mut lim = Arc::try_unwrap(lim).expect("the threads have exited");
        let b = look(&mut lim);
        assert_accounted(&lim, (a, b), admitted, m.refill_moves, a.on_lease, "[a, b]");
        seen.saw((admitted, b));
        if m.place_upkeep {
            let (before, after) = read[0];
            placed.saw(Span::placement(before, after));
        }
    });
    ends.assert_at_least(name, m.ends);
    if m.place_upkeep {
        placements.assert_each(name);
    }
}

/// Thread 1's lease has expired at `a` (held, not on lease); the upkeep moves on
/// while both threads decide: neither reading, however old, spends it. The ends do
/// not show where the upkeep fell (no reading spends the lease), so the model
/// places it: thread 1 (the lease's owner) decides all before the upkeep, across
/// it, and all after it in some execution.
#[test]
fn an_expired_lease_is_never_spent_whatever_tick_a_thread_reads() {
    static M: Model = Model {
        tick_at_a: LIFETIME_TICKS,
        upkeep: &[LIFETIME_TICKS + 1],
        ends: 2,
        place_upkeep: true,
        ..BASE
    };
    run(
        "an_expired_lease_is_never_spent_whatever_tick_a_thread_reads",
        &M,
    );
}

/// Thread 1's lease is in its last tick at `a`; the upkeep expires it while thread 1
/// spends it (at the older reading) or refills past it (at the newer), and thread 2
/// takes a lease of its own at either reading.
#[test]
fn a_lease_expiring_while_its_owner_spends_it() {
    static M: Model = Model {
        burst: 4,
        costs: [&[1, 1], &[1, 1]],
        ends: 4,
        ..BASE
    };
    run("a_lease_expiring_while_its_owner_spends_it", &M);
}

/// The refill clock moves one T while the upkeep expires thread 1's lease: each
/// refill sees the central word before or after the move, with an expiry reading
/// before or after the tick, in any pairing.
#[test]
fn expiry_racing_a_refill_across_a_moving_refill_clock() {
    static M: Model = Model {
        pre_lease: Some(2),
        refill_moves: 1,
        ends: 3,
        ..BASE
    };
    run("expiry_racing_a_refill_across_a_moving_refill_clock", &M);
}

/// A cost above what thread 1's lease holds counts its own units first, at whichever
/// reading it sees: the unit still on lease (old tick) or none (the lease expired).
#[test]
fn a_cost_above_the_lease_counts_own_units_at_the_reading_it_sees() {
    static M: Model = Model {
        burst: 4,
        costs: [&[2], &[1, 1]],
        ends: 3,
        ..BASE
    };
    run(
        "a_cost_above_the_lease_counts_own_units_at_the_reading_it_sees",
        &M,
    );
}

/// With two shards, thread 2 (index 2) decides on the central word alone at the
/// refill clock, beside thread 1 spending a lease by the coarse one.
#[test]
fn a_thread_past_the_shard_count_beside_a_coarse_owner() {
    static M: Model = Model {
        shards: 2,
        refill_moves: 1,
        costs: [&[1, 1], &[1, 1]],
        ends: 7,
        ..BASE
    };
    run("a_thread_past_the_shard_count_beside_a_coarse_owner", &M);
}
