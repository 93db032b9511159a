//! The leased hot-key mode with a coarse expiry clock ([`Expiry::Coarse`]) driven by
//! hand (`CoarseClock::with_clock` over quanta's mock), apart from the refill clock
//! (a [`ManualClock`]): the two start at unrelated origins, and the expiry clock lags
//! the refill clock, stalls, jumps ahead or steps back. Pinned:
//!
//! * a lease lives by the expiry clock alone: spendable until that clock reaches its
//!   expiry, however far the refill clock has moved, and never after;
//! * a reading behind a lease's date spends nothing from it, and one before the
//!   limiter's origin decides on the central word alone;
//! * over every interval `[a, b]` of refill readings the mode admits at most
//!   `B + ⌊(b − a)/T⌋ +` the units on lease at `a` (≤ `shards × lease size`), with
//!   the expiry clock lagging, stalled or jumping; and, if it ever steps back, the
//!   same with the units the shards hold at `a`;
//! * a stale expiry clock only lets a lease live longer by how much staler it got:
//!   the units admitted in `[a, b]` were taken from the central word within the
//!   lifetime plus the spread of the lag before `a`;
//! * a denial happens only when a plain GCRA charged with the same admissions lacks
//!   `cost +` the units held in leases.
#![cfg(not(loom))]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{denied_for_stranded_units, lease_builder, Plain};
use floodgate::lease::{CoarseClock, Expiry};
use floodgate::{LeasedGcra, ManualClock, Nanos};
use proptest::prelude::*;

/// One millisecond per unit: T is exact.
const T: u64 = 1_000_000;
/// An expiry tick: a lease is dated to one (2^16 ns).
const TICK: u64 = 1 << 16;
/// The refill clock's start (its origin is unrelated to the expiry clock's).
const START: u64 = 1_000_000_000_000;
/// The expiry clock's reading when the limiter is built (its origin): readings
/// below it fall before the origin.
const COARSE_ORIGIN: u64 = 1_000_000_000;

/// A limiter on a refill clock and a mocked expiry clock, with both handles.
struct Rig {
    limiter: LeasedGcra<ManualClock>,
    refill: ManualClock,
    coarse: Arc<quanta::Mock>,
}

impl Rig {
    fn new(burst: u64, lease: u32, shards: usize, lifetime: Duration) -> Rig {
        let refill = ManualClock::starting_at(Nanos::new(START));
        let (clock, coarse) = quanta::Clock::mock();
        coarse.increment(7_777); // the mock's own anchor: readings count from here
        let expiry = CoarseClock::with_clock(clock);
        coarse.increment(COARSE_ORIGIN);
        let limiter = lease_builder(burst, lease, shards, lifetime)
            .build_with(refill.clone(), Expiry::Coarse(expiry))
            .unwrap();
        Rig {
            limiter,
            refill,
            coarse,
        }
    }
}

#[test]
#[cfg_attr(miri, ignore = "quanta executes CPUID")]
fn a_lease_lives_by_the_expiry_clock_not_the_refill_clock() {
    let mut rig = Rig::new(10, 4, 1, Duration::from_millis(1)); // 15 ticks
    let l = &mut rig.limiter;
    assert!(l.check_on(0, 1).is_allowed());
    assert_eq!(l.units_on_lease(), 3, "a lease of 4 taken, 1 spent");
    // An hour on the refill clock, none on the expiry clock: still spendable.
    rig.refill.advance(Duration::from_secs(3_600));
    let spend = l.check_on(0, 1);
    assert_eq!((spend.is_allowed(), spend.remaining()), (true, 2));
    // The last nanosecond of its 15th tick: still spendable.
    rig.coarse.increment(15 * TICK - 1);
    assert_eq!(l.check_on(0, 1).remaining(), 1);
    assert_eq!(l.units_on_lease(), 1);
    // Its expiry: no longer on lease, and the next decision refills from the
    // central word (full again after the hour: 10 − 4 = 6 after this lease, + its 3).
    rig.coarse.increment(1);
    assert_eq!(l.units_on_lease(), 0);
    assert_eq!(l.units_held(), 1);
    let refill = l.check_on(0, 1);
    assert_eq!((refill.is_allowed(), refill.remaining()), (true, 6 + 3));
    assert_eq!(l.units_on_lease(), 3);
}

#[test]
#[cfg_attr(miri, ignore = "quanta executes CPUID")]
fn an_expired_lease_is_not_spent_while_the_central_word_is_empty() {
    let mut rig = Rig::new(5, 5, 1, Duration::from_millis(1));
    let l = &mut rig.limiter;
    assert!(l.check_on(0, 1).is_allowed()); // the whole burst on lease, 4 left
    assert!(l.check_on(0, 1).is_allowed());
    // The expiry clock passes the lifetime; the refill clock stands.
    rig.coarse.increment(Duration::from_millis(1));
    let d = l.check_on(0, 1);
    assert!(!d.is_allowed(), "spent an expired lease: {d:?}");
    assert_eq!(d.retry_after(), Some(Duration::from_millis(1)));
    assert_eq!(l.units_held(), 3, "a denial keeps the lease as it was");
}

#[test]
#[cfg_attr(miri, ignore = "quanta executes CPUID")]
fn a_reading_behind_the_leases_date_spends_nothing_from_it() {
    let mut rig = Rig::new(10, 4, 1, Duration::from_secs(1));
    let l = &mut rig.limiter;
    rig.coarse.increment(10 * TICK);
    assert!(l.check_on(0, 1).is_allowed()); // dated at tick 10, 3 left
    rig.coarse.decrement(5 * TICK);
    assert_eq!(l.units_on_lease(), 3, "not expired at tick 5: still out");
    // Tick 5 is before the lease was taken: the decision refills (6 → 2 on the
    // central word) and the 3 units of the later-dated lease are given up.
    let d = l.check_on(0, 1);
    assert_eq!((d.is_allowed(), d.remaining()), (true, 2 + 3));
    assert_eq!(l.units_held(), 3);
    assert_eq!(l.check_on(0, 0).remaining(), 2, "the central word");
}

#[test]
#[cfg_attr(miri, ignore = "quanta executes CPUID")]
fn a_reading_before_the_origin_decides_on_the_central_word_alone() {
    let mut rig = Rig::new(10, 4, 1, Duration::from_secs(1));
    let l = &mut rig.limiter;
    rig.coarse.decrement(COARSE_ORIGIN + 1); // below the mock's anchor too: reads 0
    for left in (7..10).rev() {
        let d = l.check_on(0, 1);
        assert_eq!((d.is_allowed(), d.remaining()), (true, left));
        assert_eq!(l.units_held(), 0, "a lease taken before the origin");
    }
    rig.coarse.increment(COARSE_ORIGIN + 1);
    assert!(l.check_on(0, 1).is_allowed());
    assert_eq!(l.units_held(), 3);
}

#[test]
#[cfg_attr(miri, ignore = "quanta executes CPUID")]
fn a_stalled_expiry_clock_reaches_the_bound_and_no_further() {
    const B: u64 = 8;
    const SHARDS: usize = 4;
    let mut rig = Rig::new(B, 2, SHARDS, Duration::from_millis(1));
    let l = &mut rig.limiter;
    // Every shard takes a lease of 2 and spends 1: the central word is empty.
    for shard in 0..SHARDS {
        assert!(l.check_on(shard, 1).is_allowed());
    }
    // The upkeep thread starves for an hour: the leases outlive their millisecond.
    rig.refill.advance(Duration::from_secs(3_600));
    let on_lease = l.units_on_lease();
    assert_eq!(on_lease, SHARDS as u64);
    // At one refill reading: every leased unit, then the full central word.
    let mut admitted = 0;
    for shard in (0..SHARDS).cycle().take(4 * SHARDS) {
        admitted += u64::from(l.check_on(shard, 1).is_allowed());
    }
    assert_eq!(admitted, B + on_lease);
}

#[test]
#[cfg_attr(miri, ignore = "quanta executes CPUID")]
fn a_lease_expired_by_a_reading_ahead_is_spent_again_if_the_clock_steps_back() {
    const B: u64 = 10;
    let mut rig = Rig::new(B, 5, 2, Duration::from_millis(1));
    let l = &mut rig.limiter;
    assert!(l.check_on(0, 1).is_allowed()); // shard 0: 4 left
    rig.refill.advance(Duration::from_secs(3_600)); // the central word full again
    rig.coarse.increment(Duration::from_millis(2));
    let (on_lease, held) = (l.units_on_lease(), l.units_held());
    assert_eq!((on_lease, held), (0, 4), "expired, still held");
    // Shard 1 takes the whole central word; then the expiry clock steps back
    // behind shard 1's lease and into shard 0's lifetime.
    let mut admitted = 0;
    for _ in 0..B {
        admitted += u64::from(l.check_on(1, 1).is_allowed());
    }
    rig.coarse.decrement(Duration::from_millis(2));
    for _ in 0..B {
        admitted += u64::from(l.check_on(0, 1).is_allowed());
        admitted += u64::from(l.check_on(1, 1).is_allowed());
    }
    // Past the bound counted with the units on lease, within it counted with the
    // units held (a monotone clock never brings an expired lease back).
    assert_eq!(admitted, B + held);
}

/// How the expiry clock moves at a step.
#[derive(Clone, Copy, Debug)]
enum Coarse {
    /// To the refill clock's reading less a lag (never back: it waits instead).
    Follow(u64),
    /// Not at all: the upkeep thread waits for a core.
    Stall,
    /// Ahead by this much.
    Jump(u64),
    /// Back by this much (quanta's recent time should never do this).
    Back(u64),
}

#[derive(Clone, Debug)]
struct Step {
    advance: u64,
    coarse: Coarse,
    shard: usize,
    cost: u32,
}

fn steps(back: bool) -> impl Strategy<Value = Vec<Step>> {
    let coarse = prop_oneof![
        4 => (0..5 * T).prop_map(Coarse::Follow),
        3 => Just(Coarse::Stall),
        1 => (0..3 * T).prop_map(Coarse::Jump),
        u32::from(back) * 2 => (0..3 * T).prop_map(Coarse::Back),
    ];
    prop::collection::vec(
        (
            prop_oneof![Just(0u64), 0..3 * T, 0..100 * T],
            coarse,
            0usize..4,
            0u32..4,
        )
            .prop_map(|(advance, coarse, shard, cost)| Step {
                advance,
                coarse,
                shard,
                cost,
            }),
        1..120,
    )
}

/// One decision: its refill reading, the units admitted, and the units on lease
/// and held just before it.
#[derive(Clone, Copy, Debug)]
struct Point {
    at: u64,
    admitted: u64,
    on_lease: u64,
    held: u64,
}

/// A trace of `steps`, the spread of the lag (refill reading less expiry reading,
/// largest less smallest) over its decisions.
fn run(
    burst: u64,
    lease: u32,
    shards: usize,
    lifetime: Duration,
    steps: &[Step],
    mut on_denial: impl FnMut(&LeasedGcra<ManualClock>, u64, u32, &Plain),
) -> (Vec<Point>, u64) {
    let mut rig = Rig::new(burst, lease, shards, lifetime);
    let mut model = Plain {
        burst,
        interval: T,
        tat: START,
    };
    let (mut now, mut coarse) = (START, COARSE_ORIGIN);
    let (mut lag_min, mut lag_max) = (i128::MAX, i128::MIN);
    let mut trace = Vec::new();
    for step in steps {
        now += step.advance;
        rig.refill.advance(Duration::from_nanos(step.advance));
        let to = match step.coarse {
            Coarse::Follow(lag) => coarse.max((now - START + COARSE_ORIGIN).saturating_sub(lag)),
            Coarse::Stall => coarse,
            Coarse::Jump(by) => coarse + by,
            Coarse::Back(by) => coarse.saturating_sub(by),
        };
        if to > coarse {
            rig.coarse.increment(to - coarse);
        } else {
            rig.coarse.decrement(coarse - to);
        }
        coarse = to;
        let lag = i128::from(now - START) - i128::from(coarse);
        (lag_min, lag_max) = (lag_min.min(lag), lag_max.max(lag));
        let l = &mut rig.limiter;
        let (on_lease, held) = (l.units_on_lease(), l.units_held());
        let d = l.check_on(step.shard, step.cost);
        let admitted = if d.is_allowed() {
            assert!(d.remaining() <= burst && d.limit() == burst);
            model.charge(now, step.cost);
            u64::from(step.cost)
        } else {
            on_denial(l, now, step.cost, &model);
            0
        };
        trace.push(Point {
            at: now,
            admitted,
            on_lease,
            held,
        });
    }
    (trace, (lag_max - lag_min) as u64)
}

/// Over every interval from a decision `a` on: at most `B + ⌊(b − a)/T⌋ + out(a)`
/// admitted, with `out(a) ≤ most`.
fn assert_bound(
    trace: &[Point],
    burst: u64,
    most: u64,
    out: impl Fn(&Point) -> u64,
) -> Result<(), TestCaseError> {
    for (i, a) in trace.iter().enumerate() {
        prop_assert!(out(a) <= most, "{} out on lease > {most}", out(a));
        let mut admitted = 0u64;
        for b in &trace[i..] {
            admitted += b.admitted;
            let bound = burst + (b.at - a.at) / T + out(a);
            prop_assert!(
                admitted <= bound,
                "admitted {admitted} in [{}, {}] > {burst} + {} + {}",
                a.at,
                b.at,
                (b.at - a.at) / T,
                out(a)
            );
        }
    }
    Ok(())
}

/// Runs `steps` with leases of `lease_pick` (at most the burst) and asserts the
/// bound with `out` as the units out on lease at an interval's start; the trace and
/// the lag spread.
fn bounded_run(
    burst: u64,
    lease_pick: u32,
    shards: usize,
    lifetime: Duration,
    steps: &[Step],
    out: impl Fn(&Point) -> u64,
) -> Result<(Vec<Point>, u64), TestCaseError> {
    let lease = lease_pick.min(burst as u32);
    let (trace, spread) = run(burst, lease, shards, lifetime, steps, |_, _, _, _| {});
    let most = shards.next_power_of_two() as u64 * u64::from(lease);
    assert_bound(&trace, burst, most, out)?;
    Ok((trace, spread))
}

proptest! {
    #![proptest_config(crate::common::cases(256))]

    #[test]
    #[cfg_attr(miri, ignore = "quanta executes CPUID")]
    fn admits_at_most_the_central_gcra_plus_the_units_on_lease_whatever_the_staleness(
        burst in 1u64..24,
        lease_pick in 1u32..24,
        shards in 1usize..5,
        lifetime_ms in prop_oneof![Just(1u64), Just(2), Just(50)],
        steps in steps(false),
    ) {
        let lifetime = Duration::from_millis(lifetime_ms);
        let (trace, spread) =
            bounded_run(burst, lease_pick, shards, lifetime, &steps, |a| a.on_lease)?;
        // A unit admitted at `b` was taken from the central word at a refill reading
        // in `(b − lifetime − spread, b]`: its lease expires `lifetime` (to the
        // tick, rounded down) after it was taken on the expiry clock, which can
        // have fallen behind the refill clock since by `spread` at most.
        let life = lifetime.as_nanos() as u64 + spread;
        for (i, a) in trace.iter().enumerate() {
            let mut admitted = 0u64;
            for b in &trace[i..] {
                admitted += b.admitted;
                let bound = burst + (b.at - a.at + life) / T;
                prop_assert!(
                    admitted <= bound,
                    "admitted {admitted} in [{}, {}] > {burst} + ({} + {life}) / T",
                    a.at,
                    b.at,
                    b.at - a.at
                );
            }
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "quanta executes CPUID")]
    fn an_expiry_clock_stepping_back_keeps_the_bound_over_the_units_held(
        burst in 1u64..24,
        lease_pick in 1u32..24,
        shards in 1usize..5,
        lifetime_ms in prop_oneof![Just(1u64), Just(2), Just(50)],
        steps in steps(true),
    ) {
        let lifetime = Duration::from_millis(lifetime_ms);
        bounded_run(burst, lease_pick, shards, lifetime, &steps, |a| a.held)?;
    }

    #[test]
    #[cfg_attr(miri, ignore = "quanta executes CPUID")]
    fn denies_only_for_want_of_units_stranded_in_leases_whatever_the_staleness(
        burst in 1u64..24,
        lease_pick in 1u32..24,
        shards in 1usize..5,
        steps in steps(false),
    ) {
        let lease = lease_pick.min(burst as u32);
        // A lifetime longer than any trace's expiry clock moves: nothing expires,
        // every unit taken from the central word is either admitted or still held.
        run(burst, lease, shards, Duration::from_secs(3_600), &steps, denied_for_stranded_units);
    }
}
