//! Attacks (from an adversarial review) on the keyed tables' "never admits beyond a
//! limit" guarantees under reclamation, eviction, removal, refunds and runtime policy
//! changes, on every storage. The `#[ignore]`d tests fail: they are the review's open
//! findings, documented in `Clock` and listed in VERIFICATION.md
//! (`cargo test --test keyed_adversarial -- --ignored` shows them).
#![cfg(not(loom))]

#[macro_use]
mod common;

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use floodgate::keyed::plans::{PlanLimiter, Plans};
use floodgate::{
    Clock, FixedWindow, Gcra, KeyedBuilder, KeyedError, KeyedLimiter, LiveGcra, ManualClock, Nanos,
    Policy, RateLimiter, SlidingWindow, Storage,
};

const S: u64 = 1_000_000_000;

fn name<S>() -> &'static str {
    core::any::type_name::<S>()
}

// ---------------------------------------------------------------------------------
// 1. Plans: eviction must rank every key under its own plan.
// ---------------------------------------------------------------------------------

/// The module docs: "the one whose loss forgives least of a sample of 8 is evicted
/// ... so a heavy user is never evicted while a lighter key is in the sample,
/// whatever the algorithm". A flood of light free-plan keys must never evict an
/// enterprise key that has used 900 units (it did when GCRA plans shared one table
/// ranked under the inserting key's plan).
fn plan_heavy_user_survives<St: Storage<u64, floodgate::GcraState>>() {
    let mut plans = Plans::new();
    let free = plans.insert(
        "free",
        Policy::per_day(100).unwrap().with_burst(10).unwrap(),
    );
    let ent = plans.insert(
        "enterprise",
        Policy::per_day(1_000_000)
            .unwrap()
            .with_burst(1_000)
            .unwrap(),
    );
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let limiter: PlanLimiter<u64, _, ManualClock, St> = PlanLimiter::new_in(
        &plans,
        move |k: &u64| if *k == 0 { ent } else { free },
        KeyedBuilder::default()
            .capacity(16)
            .shards(1)
            .clock(clock.clone()),
    )
    .unwrap();
    // The enterprise key uses 900 of its 1 000 units.
    assert!(limiter.check_n(&0, 900).is_allowed());
    assert_eq!(limiter.peek(&0, 0).remaining(), 100);
    // A flood of light free keys, one unit each (10 % of their burst; the heavy
    // key used 90 % of its own, and 900 units against 1).
    for k in 1..2_000u64 {
        assert!(limiter.check(&k).is_allowed());
    }
    assert!(limiter.metrics().evicted > 1_000);
    let left = limiter.peek(&0, 0).remaining();
    // Then, at the same instant, how many more can the enterprise key take?
    let mut more = 0u64;
    while limiter.check(&0).is_allowed() {
        more += 1;
        if more > 2_000 {
            break;
        }
    }
    assert_eq!(
        (left, 900 + more),
        (100, 1_000),
        "{}: the heavy enterprise key was evicted by light free keys: it admitted \
         {} units at one instant with a burst of 1 000",
        name::<St>(),
        900 + more
    );
}

#[test]
fn plans_eviction_never_takes_a_heavy_key_of_another_plan() {
    every_storage_reporting!(St => { plan_heavy_user_survives::<St>(); });
}

// ---------------------------------------------------------------------------------
// 2. A refund judged at a reading earlier than a later admission of the same key.
// ---------------------------------------------------------------------------------

/// A clock that may be set backwards (the `Clock` docs: "The engine stays correct if
/// they do ... a backwards step makes decisions stricter").
#[derive(Clone, Default)]
struct Rewindable(Arc<AtomicU64>);

impl Rewindable {
    fn set(&self, t: u64) {
        self.0.store(t, Ordering::Relaxed);
    }
}

impl Clock for Rewindable {
    fn now(&self) -> Nanos {
        Nanos::new(self.0.load(Ordering::Relaxed))
    }
}

/// GCRA 1/s with burst `b` on a one-shard table over `clock`.
fn one_key_table<C: Clock, St>(b: u32, clock: C) -> KeyedLimiter<u64, Gcra, C, St>
where
    St: Storage<u64, floodgate::GcraState>,
{
    let policy = Policy::per_second(1)
        .unwrap()
        .with_burst(u64::from(b))
        .unwrap();
    KeyedBuilder::new(Gcra::new(policy))
        .capacity(64)
        .shards(1)
        .clock(clock)
        .build_in()
        .unwrap()
}

/// GCRA 1/s with burst `b`. A charge at 10 s; an admission at `later` (a later
/// reading); then the refund of the first charge judged at 10 s; then more checks at
/// `later`. Returns how many were admitted at `later` and whether the refund gave
/// anything back.
fn refund_judged_before_a_later_admission<St>(b: u32, later: u64) -> (u32, bool)
where
    St: Storage<u64, floodgate::GcraState>,
{
    let clock = Rewindable::default();
    let keyed = one_key_table::<_, St>(b, clock.clone());
    clock.set(10 * S);
    let (a, receipt) = keyed.charge(&7, 1);
    assert!(a.is_allowed());
    clock.set(later);
    let mut admitted = u32::from(keyed.check(&7).is_allowed());
    clock.set(10 * S); // a reading from a core whose clock runs behind
    let refunded = keyed.refund(&7, receipt);
    clock.set(later);
    for _ in 0..=b {
        admitted += u32::from(keyed.check(&7).is_allowed());
    }
    (admitted, refunded)
}

/// The same with a monotone `ManualClock` and `check_n_at` given a reading taken
/// ahead of the limiter's clock ("at an instant the caller read").
fn refund_after_a_reading_ahead_of_the_clock<St>(b: u32, later: u64) -> (u32, bool)
where
    St: Storage<u64, floodgate::GcraState>,
{
    let clock = ManualClock::starting_at(Nanos::from_secs(10));
    let keyed = one_key_table::<_, St>(b, clock);
    let (a, receipt) = keyed.charge(&7, 1); // at 10 s
    assert!(a.is_allowed());
    let later = Nanos::new(later);
    let mut admitted = u32::from(keyed.check_n_at(&7, later, 1).is_allowed());
    let refunded = keyed.refund(&7, receipt); // judged at the clock: 10 s
    for _ in 0..=b {
        admitted += u32::from(keyed.check_n_at(&7, later, 1).is_allowed());
    }
    (admitted, refunded)
}

/// The un-keyed `RateLimiter` shares the rule (gcra.rs `refund`).
fn unkeyed_refund_after_a_reading_ahead_of_the_clock(b: u32, later: u64) -> (u32, bool) {
    let clock = ManualClock::starting_at(Nanos::from_secs(10));
    let policy = Policy::per_second(1)
        .unwrap()
        .with_burst(u64::from(b))
        .unwrap();
    let limiter = RateLimiter::gcra_with_clock(policy, clock.clone());
    let (a, receipt) = limiter.charge(1);
    assert!(a.is_allowed());
    let later = Nanos::new(later);
    let mut admitted = u32::from(limiter.check_n_at(later, 1).is_allowed());
    let refunded = limiter.refund(receipt);
    for _ in 0..=b {
        admitted += u32::from(limiter.check_n_at(later, 1).is_allowed());
    }
    (admitted, refunded)
}

/// Burst 1, the later admission at 20 s, long after the charge's booking ended: the
/// schedule the refund would give back lies below the later admission's own booking,
/// which the refund treats as handed out ("units booked after this charge stay
/// spent"), so it gives back nothing and 20 s sees exactly one admission. These were
/// open findings when written; the rule for bookings still ahead closed them.
#[test]
fn a_refund_judged_behind_a_later_admission_gives_nothing_back_at_burst_1() {
    every_storage_reporting!(St => {
        assert_eq!(refund_judged_before_a_later_admission::<St>(1, 20 * S), (1, false), "{}", name::<St>());
        assert_eq!(refund_after_a_reading_ahead_of_the_clock::<St>(1, 20 * S), (1, false), "{}", name::<St>());
    });
    assert_eq!(
        unkeyed_refund_after_a_reading_ahead_of_the_clock(1, 20 * S),
        (1, false)
    );
}

/// Burst 3, the later admission at 11.5 s, just after the charge's booking [10 s,
/// 11 s) ended: its own booking [11.5 s, 12.5 s) sits within `τ` of the refund's
/// reading, so the refund cannot tell it from an admission it precedes, gives back
/// the whole unit, and 11.5 s sees four admissions with a burst of 3. Only knowing
/// the latest reading of any admission would close this, and that is a shared write
/// per decision; the `Clock` docs state the premise (a refund's reading is no earlier
/// than any admission it sees) and bound the error (the refunded charge's own units,
/// once).
fn over_admits_by_one_unit(found: (u32, bool)) {
    assert!(
        found.0 <= 3,
        "{} admissions at 11.5 s with a burst of 3",
        found.0
    );
}

#[test]
#[ignore = "open: a refund assumes no admission it sees was read later (Clock docs)"]
fn a_backwards_clock_never_lets_a_refund_free_a_later_admissions_slot() {
    every_storage_reporting!(St => {
        over_admits_by_one_unit(refund_judged_before_a_later_admission::<St>(3, 11_500_000_000));
    });
}

#[test]
#[ignore = "open: a refund assumes no admission it sees was read later (Clock docs)"]
fn check_n_at_ahead_of_the_clock_then_refund() {
    every_storage_reporting!(St => {
        over_admits_by_one_unit(refund_after_a_reading_ahead_of_the_clock::<St>(3, 11_500_000_000));
    });
}

#[test]
#[ignore = "open: a refund assumes no admission it sees was read later (Clock docs)"]
fn unkeyed_limiter_check_n_at_ahead_of_the_clock_then_refund() {
    over_admits_by_one_unit(unkeyed_refund_after_a_reading_ahead_of_the_clock(
        3,
        11_500_000_000,
    ));
}

/// The error stays within the documented bound: at most the refunded charge's own
/// unit, once (four at 11.5 s with a burst of 3, never five), on every storage.
#[test]
fn a_refund_judged_behind_a_later_admission_errs_by_at_most_its_own_units() {
    every_storage_reporting!(St => {
        let (keyed, _) = refund_judged_before_a_later_admission::<St>(3, 11_500_000_000);
        let (at, _) = refund_after_a_reading_ahead_of_the_clock::<St>(3, 11_500_000_000);
        assert!(keyed <= 4 && at <= 4, "{}: {keyed} and {at} admissions at 11.5 s, burst 3", name::<St>());
    });
    assert!(unkeyed_refund_after_a_reading_ahead_of_the_clock(3, 11_500_000_000).0 <= 4);
}

// ---------------------------------------------------------------------------------
// 3. Refunds of receipts taken before removal / reset / reclaim / set_policy.
// ---------------------------------------------------------------------------------

fn receipts_before_every_kind_of_removal<St>()
where
    St: Storage<u64, floodgate::GcraState>,
{
    let clock = ManualClock::starting_at(Nanos::from_secs(100));
    let mut keyed: KeyedLimiter<u64, Gcra, ManualClock, St> = KeyedBuilder::new(Gcra::new(
        Policy::per_second(1).unwrap().with_burst(2).unwrap(),
    ))
    .capacity(8)
    .shards(1)
    .clock(clock.clone())
    .build_in()
    .unwrap();
    // (a) reclaim of the very key, then re-creation: the receipt must be void.
    let (d, r) = keyed.charge(&1, 1);
    assert!(d.is_allowed());
    clock.advance(Duration::from_secs(1)); // key 1 idle now
    assert_eq!(keyed.reclaim_idle(), 1);
    assert!(keyed.check_n(&1, 2).is_allowed()); // re-created, full burst used
    assert!(
        !keyed.refund(&1, r),
        "{}: refund after reclaim",
        name::<St>()
    );
    assert!(!keyed.check(&1).is_allowed());
    // (b) a removal of *another* key in the shard voids it too (documented).
    let (d, r) = keyed.charge(&2, 1);
    assert!(d.is_allowed());
    assert!(keyed.check(&3).is_allowed());
    assert!(keyed.remove(&3));
    assert!(!keyed.refund(&2, r));
    // (c) set_policy voids every receipt; a refund after it gives nothing back.
    let (d, r) = keyed.charge(&4, 2);
    assert!(d.is_allowed());
    keyed.set_policy(Policy::per_second(1).unwrap().with_burst(2).unwrap());
    assert!(
        !keyed.refund(&4, r),
        "{}: refund after set_policy",
        name::<St>()
    );
    assert!(!keyed.check(&4).is_allowed());
    // (d) reset, then a receipt of the new incarnation refunds exactly its own.
    let (_, old) = keyed.charge(&5, 2);
    assert!(keyed.reset(&5));
    let (d, new) = keyed.charge(&5, 1);
    assert!(d.is_allowed());
    assert!(!keyed.refund(&5, old));
    assert!(keyed.refund(&5, new));
    assert_eq!(keyed.peek(&5, 0).remaining(), 2);
    // (e) eviction: a receipt taken before the shard evicted anything is void.
    let (d, r) = keyed.charge(&6, 1);
    assert!(d.is_allowed());
    for k in 100..120u64 {
        assert!(keyed.check_n(&k, 2).is_allowed());
    }
    assert!(keyed.metrics().evicted > 0);
    assert!(!keyed.refund(&6, r));
}

#[test]
fn receipts_from_before_any_removal_refund_nothing() {
    each_storage!(St => { receipts_before_every_kind_of_removal::<St>(); });
}

// ---------------------------------------------------------------------------------
// 4. LiveGcra keyed: refunds across a policy change never free another's units.
// ---------------------------------------------------------------------------------

fn live_refund_across_a_change<St>()
where
    St: Storage<u64, floodgate::GcraState>,
{
    let clock = ManualClock::starting_at(Nanos::from_secs(100));
    let keyed: KeyedLimiter<u64, LiveGcra, ManualClock, St> =
        KeyedBuilder::new(LiveGcra::new(Policy::per_second(10).unwrap()))
            .capacity(64)
            .shards(1)
            .clock(clock.clone())
            .build_in()
            .unwrap();
    // A charges 5 at 10/s (500 ms of schedule), the policy drops to 1/s burst 10
    // (τ = 10 s), B charges 5 (5 s of schedule), A is refunded. A refund judges the
    // units booked after its charge with the smallest τ the limiter has had (1 s): B's
    // schedule reaches past now + 1 s, so B could be a booking made at 10/s still
    // waiting for its slot, and under a τ that has risen nothing below a waiting
    // booking can be given back: A's refund gives back nothing (a conservative loss,
    // never more than its own 500 ms). Then ⌊10 s − 5.5 s⌋ = 4 more units fit.
    let (a, ra) = keyed.charge(&1, 5);
    assert!(a.is_allowed());
    keyed
        .algorithm()
        .set_policy(Policy::per_second(1).unwrap().with_burst(10).unwrap());
    assert!(keyed.check_n(&1, 5).is_allowed());
    assert!(!keyed.refund(&1, ra));
    let mut more = 0;
    while keyed.check(&1).is_allowed() {
        more += 1;
        assert!(more < 100);
    }
    assert_eq!(more, 4, "{}", name::<St>());
    // The reverse: charge at a slow rate, speed it up, refund.
    let (b, rb) = keyed.charge(&2, 10); // 10 s of schedule at 1/s
    assert!(b.is_allowed());
    keyed
        .algorithm()
        .set_policy(Policy::per_second(100).unwrap().with_burst(10).unwrap()); // τ = 100 ms
    assert!(!keyed.check(&2).is_allowed());
    assert!(keyed.refund(&2, rb)); // the whole 10 s back
    let mut more = 0;
    while keyed.check(&2).is_allowed() {
        more += 1;
        assert!(more < 100);
    }
    assert_eq!(more, 10, "{}", name::<St>());
}

#[test]
fn live_gcra_refunds_across_a_policy_change_give_back_only_their_own() {
    each_storage!(St => { live_refund_across_a_change::<St>(); });
}

// ---------------------------------------------------------------------------------
// 5. IPv4-mapped IPv6 addresses.
// ---------------------------------------------------------------------------------

#[test]
fn ipv4_mapped_addresses_share_the_ipv4_key_inline() {
    let clock = ManualClock::new();
    let by_ip = KeyedBuilder::new(Gcra::new(Policy::per_minute(3).unwrap()))
        .clock(clock.clone())
        .build_inline::<IpAddr>()
        .unwrap();
    let v4: IpAddr = "192.0.2.7".parse().unwrap();
    let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
    assert!(by_ip.check(&v4).is_allowed());
    assert!(by_ip.check(&mapped).is_allowed());
    assert!(by_ip.check(&v4).is_allowed());
    assert!(!by_ip.check(&mapped).is_allowed());
    assert!(!by_ip.check(&v4).is_allowed());
    assert_eq!(by_ip.metrics().live_keys, 1);
    // Removal through either form removes the one key.
    assert!(by_ip.remove(&mapped));
    assert!(!by_ip.remove(&v4));
}

/// Observation, not a documented guarantee: on `Heap` and `Fingerprint` storage an
/// `IpAddr` key is hashed as-is, so the mapped form is another client.
#[test]
fn ipv4_mapped_addresses_on_heap_and_fingerprint_are_other_keys() {
    let v4: IpAddr = "192.0.2.7".parse().unwrap();
    let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
    let heap = KeyedBuilder::new(Gcra::new(Policy::per_minute(1).unwrap()))
        .clock(ManualClock::new())
        .build::<IpAddr>()
        .unwrap();
    assert!(heap.check(&v4).is_allowed());
    let heap_mapped_admitted = heap.check(&mapped).is_allowed();
    let fp = KeyedBuilder::new(Gcra::new(Policy::per_minute(1).unwrap()))
        .clock(ManualClock::new())
        .build_fingerprint::<IpAddr>()
        .unwrap();
    assert!(fp.check(&v4).is_allowed());
    let fp_mapped_admitted = fp.check(&mapped).is_allowed();
    eprintln!(
        "heap: mapped admitted after v4 = {heap_mapped_admitted}; fingerprint: {fp_mapped_admitted}"
    );
}

// ---------------------------------------------------------------------------------
// 6. Absurd inputs: clean errors, never panics.
// ---------------------------------------------------------------------------------

fn absurd_inputs_on<St>()
where
    St: Storage<u64, floodgate::GcraState>,
{
    let b = || KeyedBuilder::new(Gcra::new(Policy::per_second(1).unwrap()));
    assert_eq!(
        b().capacity(0).build_in::<u64, St>().err(),
        Some(KeyedError::ZeroCapacity)
    );
    assert_eq!(
        b().shards(0).build_in::<u64, St>().err(),
        Some(KeyedError::ZeroShards)
    );
    assert!(matches!(
        b().capacity(usize::MAX).build_in::<u64, St>().err(),
        Some(KeyedError::CapacityTooLarge { .. })
    ));
    assert!(b()
        .capacity(floodgate::MAX_CAPACITY)
        .shards(usize::MAX)
        .memory_budget(usize::MAX)
        .slot_bytes()
        .is_ok());
    assert!(matches!(
        b().capacity(floodgate::MAX_CAPACITY)
            .build_in::<u64, St>()
            .err(),
        Some(KeyedError::OverMemoryBudget { .. })
    ));
    // Shards far above the capacity, capacity 1.
    for (cap, shards) in [(1usize, usize::MAX), (1, 1 << 20), (3, 1 << 16), (1, 1)] {
        let clock = ManualClock::starting_at(Nanos::from_secs(5));
        let k: KeyedLimiter<u64, Gcra, ManualClock, St> = b()
            .capacity(cap)
            .shards(shards)
            .clock(clock.clone())
            .build_in()
            .unwrap();
        assert!(k.shards() <= cap);
        // `cap` keys fit without removal (capacity means capacity).
        for key in 0..cap as u64 {
            assert!(k.check(&key).is_allowed());
        }
        let m = k.metrics();
        assert_eq!((m.evicted, m.reclaimed), (0, 0), "{cap} {shards}");
        // Then one more key evicts; each key still admits one at this instant.
        assert!(k.check(&u64::MAX).is_allowed());
        assert!(!k.check(&u64::MAX).is_allowed());
    }
    // Costs and instants at the extremes.
    let clock = ManualClock::starting_at(Nanos::from_secs(5));
    let k: KeyedLimiter<u64, Gcra, ManualClock, St> = b()
        .capacity(4)
        .shards(1)
        .clock(clock.clone())
        .build_in()
        .unwrap();
    for now in [
        Nanos::ZERO,
        Nanos::new(1),
        Nanos::new(u64::MAX - 1),
        Nanos::MAX,
    ] {
        for cost in [0u32, 1, 2, u32::MAX] {
            for key in [0u64, u64::MAX] {
                let _ = k.check_n_at(&key, now, cost);
                let _ = k.peek_at(&key, now, cost);
                let (_, r) = k.charge_at(&key, now, cost);
                let _ = k.refund(&key, r);
                let _ = k.book_at(&key, now, cost);
                let _ = k.reserve_at(&key, now, cost, Duration::MAX);
                let _ = k.reserve_at(&key, now, cost, Duration::ZERO);
            }
        }
    }
    let _ = k.remove(&0);
    let _ = k.reclaim_idle();
    // After a decision at u64::MAX the key is stuck (dead word refused), never
    // admitted beyond its burst.
    let at = Nanos::new(u64::MAX - 1);
    let mut n = 0;
    for _ in 0..5 {
        n += u32::from(k.check_n_at(&9, at, 1).is_allowed());
    }
    assert!(n <= 1, "{}: {n}", name::<St>());
}

#[test]
fn absurd_inputs_give_clean_errors_and_never_panic() {
    each_storage!(St => { absurd_inputs_on::<St>(); });
    // Policies at their extremes.
    for p in [
        Policy::new(1, Duration::from_nanos(floodgate::MAX_SPAN_NANOS)),
        Policy::new(u64::MAX, Duration::from_nanos(floodgate::MAX_SPAN_NANOS)),
        Policy::new(u64::MAX, Duration::from_nanos(1)),
        Policy::new(0, Duration::from_secs(1)),
        Policy::new(1, Duration::ZERO),
        Policy::new(1, Duration::MAX),
    ]
    .into_iter()
    .flatten()
    {
        {
            for burst in [0u64, 1, u64::MAX] {
                if let Ok(p) = p.with_burst(burst) {
                    let k = KeyedBuilder::new(Gcra::new(p))
                        .capacity(4)
                        .clock(ManualClock::new())
                        .build_inline::<u64>()
                        .unwrap();
                    for cost in [0, 1, u32::MAX] {
                        let _ = k.check_n_at(&1, Nanos::MAX, cost);
                        let _ = k.check_n_at(&1, Nanos::ZERO, cost);
                    }
                    if let Ok(fw) = FixedWindow::new(p) {
                        let k = KeyedBuilder::new(fw)
                            .capacity(4)
                            .clock(ManualClock::new())
                            .build::<u64>()
                            .unwrap();
                        for cost in [0, 1, u32::MAX] {
                            let _ = k.check_n_at(&1, Nanos::MAX, cost);
                            let _ = k.check_n_at(&1, Nanos::ZERO, cost);
                        }
                    }
                    if let Ok(sw) = SlidingWindow::new(p) {
                        let k = KeyedBuilder::new(sw)
                            .capacity(4)
                            .clock(ManualClock::new())
                            .build_fingerprint::<u64>()
                            .unwrap();
                        for cost in [0, 1, u32::MAX] {
                            let _ = k.check_n_at(&1, Nanos::MAX, cost);
                            let _ = k.check_n_at(&1, Nanos::ZERO, cost);
                        }
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// 7. Capacity means capacity: `capacity` idle keys revisited, nothing reclaimed.
// ---------------------------------------------------------------------------------

fn idle_keys_at_capacity_are_kept<St: Storage<u64, floodgate::GcraState>>(
    cap: usize,
    shards: Option<usize>,
) {
    let clock = ManualClock::starting_at(Nanos::from_secs(10));
    let mut b = KeyedBuilder::new(Gcra::new(
        Policy::per_second(1).unwrap().with_burst(3).unwrap(),
    ))
    .capacity(cap)
    .clock(clock.clone());
    if let Some(s) = shards {
        b = b.shards(s);
    }
    let keyed: KeyedLimiter<u64, Gcra, ManualClock, St> = b.build_in().unwrap();
    for round in 0..4u64 {
        for k in 0..cap as u64 {
            assert!(keyed.check_n(&k, 1 + (k % 3) as u32).is_allowed());
        }
        clock.advance(Duration::from_secs(5)); // every key idle now
        let m = keyed.metrics();
        assert_eq!(
            (m.reclaimed, m.evicted, m.live_keys),
            (0, 0, cap as u64),
            "{} cap {cap} shards {:?} round {round}",
            name::<St>(),
            keyed.shards()
        );
    }
}

#[test]
fn capacity_idle_keys_are_never_reclaimed_or_evicted() {
    each_storage!(St => {
        idle_keys_at_capacity_are_kept::<St>(1, None);
        idle_keys_at_capacity_are_kept::<St>(7, Some(1));
        idle_keys_at_capacity_are_kept::<St>(1_000, Some(1));
        idle_keys_at_capacity_are_kept::<St>(50_000, None);
        idle_keys_at_capacity_are_kept::<St>(4_096, Some(64));
    });
}
