//! What the fuzz review of the hot-key modes (fuzz target `hot_keys`, 2026-12-05)
//! found, as deterministic cases. The oracle is the documented bound: over any
//! interval `[a, b]` of readings a hot key (or a `LeasedGcra`) admits at most
//! `B + ⌊(b − a)/T⌋ +` the units on lease at `a`, because every admitted unit was taken
//! from the central word at a reading no later than its admission's (to the 65.5 µs
//! tick); and a removal forgives at most one burst: a reading taken before it is
//! judged at its instant, as the keyed table judges a cold key's.
//!
//! Each test runs on its own thread, which owns one of 64 lease shards (asserted), so
//! that its decisions spend leases rather than deciding on the central word alone.
#![cfg(not(loom))]

use floodgate::{
    Clock, HotKeyLimiter, HotKeys, Inline, KeyedBuilder, LeasedGcra, ManualClock, Nanos, Policy,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const S: u64 = 1_000_000_000;
/// 10 per second (T = 100 ms), burst 5.
const B: u64 = 5;
const SHARDS: usize = 64;

fn policy() -> Policy {
    Policy::per_second(10).unwrap().with_burst(B).unwrap()
}

/// A limiter with one table shard, leases of `lease` units living 1 s, on `clock`.
fn hot(clock: &ManualClock, lease: u32) -> HotKeyLimiter<u64, ManualClock, Inline> {
    HotKeyLimiter::new_in(
        policy(),
        KeyedBuilder::default()
            .capacity(64)
            .shards(1)
            .clock(clock.clone()),
        HotKeys::default()
            .manual()
            .lease_shards(SHARDS)
            .lease_size(lease)
            .lease_lifetime(Duration::from_secs(1)),
    )
    .unwrap()
}

/// This thread owns a lease shard of a `SHARDS`-shard limiter (it takes its owner
/// index here if it has none yet).
fn assert_owns_a_shard() {
    let probe = LeasedGcra::builder(policy())
        .shards(SHARDS)
        .build_with_clock(ManualClock::new())
        .unwrap();
    assert!(
        probe.owns_shard(),
        "the test thread should own a lease shard"
    );
}

/// **A reading taken before the key's promotion spent a lease taken at a later
/// reading.** A lease remembers its tick (65.5 µs since the lease limiter's origin,
/// the promotion's instant), and a reading older than the lease spends nothing from
/// it; but every reading before the origin counted as tick 0, so a lease taken at
/// any reading before the promotion was spendable at every earlier one: 9 units at
/// one reading, burst 5.
#[test]
fn a_reading_before_the_promotion_never_spends_a_lease_taken_later() {
    assert_owns_a_shard();
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let limiter = hot(&clock, 5);
    assert!(limiter.promote(&1));
    // Readings a thread took before the promotion (the clock reads 1 000 s).
    let early = Nanos::from_secs(980);
    let later = Nanos::from_secs(990);
    let mut at_early = 0;
    if limiter.check_n_at(&1, early, 5).is_allowed() {
        at_early += 5;
    }
    // A lease of 5 taken at 990 s: 1 admitted, 4 left on it.
    assert!(limiter.check_n_at(&1, later, 1).is_allowed());
    if limiter.check_n_at(&1, early, 4).is_allowed() {
        at_early += 4;
    }
    assert!(
        at_early <= B,
        "{at_early} units admitted at the one reading 980 s (burst {B}): the lease \
         taken at 990 s was spent at 980 s"
    );
}

/// **A check behind a removal found the hot key's fresh schedule in the past.** The
/// table judges a cold key's decisions at `max(reading, the shard's latest removal
/// instant)`, so that a reading taken before a removal never starts the fresh state
/// early (`KeyedLimiter::remove`: each removal forgives at most one burst). A hot
/// key's check went to its lease limiter at the raw reading: after a removal at
/// 1 000 s and a promotion, readings behind 1 000 s admitted a burst each 0.5 s they
/// were behind — 10 units (5 more than the burst) with no reading later than the
/// removal.
#[test]
fn a_reading_behind_a_removal_is_judged_at_the_removal_on_a_hot_key() {
    assert_owns_a_shard();
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let limiter = hot(&clock, 1);
    assert!(limiter.check_n(&1, 5).is_allowed());
    assert!(limiter.remove(&1)); // at 1 000 s: forgives one burst
    assert!(limiter.promote(&1));
    let mut admitted = 0;
    for reading in [Nanos::from_secs(990), clock.now()] {
        if limiter.check_n_at(&1, reading, 5).is_allowed() {
            admitted += 5;
        }
    }
    assert!(
        admitted <= B,
        "{admitted} units admitted after the removal at 1 000 s, no reading later (burst {B})"
    );
}

/// A clock a test can move either way (a `ManualClock` never goes back).
#[derive(Clone, Default)]
struct BackClock(Arc<AtomicU64>);

impl Clock for BackClock {
    fn now(&self) -> Nanos {
        Nanos::new(self.0.load(Ordering::Relaxed))
    }
}

impl BackClock {
    fn set(&self, t: u64) {
        self.0.store(t, Ordering::Relaxed);
    }
}

/// **The direct limiter, with a clock stepping back before its origin.** The same
/// tick-0 rule: a lease taken at the limiter's first tick was spendable at every
/// reading before the limiter was built.
#[test]
fn a_direct_limiter_reading_before_its_origin_never_spends_a_later_lease() {
    let clock = BackClock::default();
    clock.set(1_000 * S);
    let mut leased = LeasedGcra::builder(policy())
        .shards(1)
        .lease_size(5)
        .lifetime(Duration::from_secs(1))
        .build_with_clock(clock.clone())
        .unwrap();
    // A reading before the origin takes the whole burst from the central word.
    clock.set(980 * S);
    assert!(leased.check_on(0, 5).is_allowed());
    // At the origin, 20 s on: a lease of 5, one admitted, 4 left on it.
    clock.set(1_000 * S);
    assert!(leased.check_on(0, 1).is_allowed());
    // Back before the origin: those 4 were taken at a later reading.
    clock.set(980 * S);
    let spent = leased.check_on(0, 4).is_allowed();
    assert!(
        !spent,
        "9 units admitted at the one reading 980 s (burst {B}): the lease taken at \
         1 000 s was spent at 980 s"
    );
}

/// **A lease taken past the expiry field's range.** Expiry ticks are 44 bits from
/// the origin (36 years of 65.5 µs ticks); a lease taken later had its expiry capped
/// at the field's top, which made it spendable at readings up to a lifetime *before*
/// it was taken.
#[test]
fn a_lease_taken_past_the_expiry_range_is_not_spent_at_earlier_readings() {
    let clock = BackClock::default();
    let mut leased = LeasedGcra::builder(policy())
        .shards(1)
        .lease_size(5)
        .lifetime(Duration::from_secs(100))
        .build_with_clock(clock.clone())
        .unwrap();
    // The last tick the expiry field holds, and readings around it (ticks of 2^16 ns).
    let top = ((1u64 << 44) - 1) << 16;
    // 50 s before the top: the whole burst from the central word.
    clock.set(top - 50 * S);
    assert!(leased.check_on(0, 5).is_allowed());
    // 10 s past the top: a lease of 5, one admitted, 4 left (its expiry capped).
    clock.set(top + 10 * S);
    assert!(leased.check_on(0, 1).is_allowed());
    // Back to the first reading: the 4 were taken 60 s later.
    clock.set(top - 50 * S);
    let spent = leased.check_on(0, 4).is_allowed();
    assert!(
        !spent,
        "9 units admitted at one reading (burst {B}): a lease taken 60 s later was spent"
    );
}
