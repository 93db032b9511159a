//! Attacks (from an adversarial review) on `PlanLimiter`'s table per plan: runtime
//! policy changes against the tables' construction-time algorithms, receipts across
//! plan moves, a key flipping plans from two threads, removal and metrics across
//! tables, memory across the tables, and ids outside the plans. Each test says
//! whether it held from the start or was an open finding, fixed since.
#![cfg(not(loom))]

#[macro_use]
mod common;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use floodgate::keyed::plans::{PlanAlgorithm, PlanId, PlanLimiter, Plans, PlansError};
use floodgate::{
    FixedWindow, Gcra, GcraState, KeyedBuilder, KeyedError, ManualClock, Nanos, Policy,
    SlidingWindow, Storage,
};

/// `free` 100/day burst 10 (the default), `pro` 10 000/day burst 100, `enterprise`
/// 1 000 000/day burst 1 000.
fn classic_ids(plans: &Plans) -> (PlanId, PlanId, PlanId) {
    (
        plans.id("free").unwrap(),
        plans.id("pro").unwrap(),
        plans.id("enterprise").unwrap(),
    )
}

/// A plan limiter built from `table` on a manual clock at 1 000 s, and the clock.
fn plan_limiter<St, A, R>(
    plans: &Plans,
    resolver: R,
    table: KeyedBuilder<()>,
) -> (ManualClock, PlanLimiter<u64, R, ManualClock, St, A>)
where
    A: PlanAlgorithm,
    St: Storage<u64, A::State>,
{
    let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
    let limiter = PlanLimiter::new_in(plans, resolver, table.clock(clock.clone())).unwrap();
    (clock, limiter)
}

/// Checks `key` one unit at a time until denied (at most `cap` times).
fn drain(mut check: impl FnMut() -> bool, cap: u64) -> u64 {
    let mut admitted = 0;
    while admitted < cap && check() {
        admitted += 1;
    }
    admitted
}

// ---------------------------------------------------------------------------------
// 1. Runtime GCRA changes against the table's construction-time algorithm.
// ---------------------------------------------------------------------------------

/// Holds (was open). `PlanLimiter::table(plan)` used to hand out the plan's
/// `KeyedLimiter`, whose decision methods ran the GCRA built from the plan's policy
/// *at construction*: after `set_policy` (or `set_policy_mut`, which for GCRA
/// rewrites no table) cut `free` from burst 10 to burst 2, `table(free).check_n(k,
/// 10)` admitted 10 units at one instant for a fresh key, 5× the plan's burst. The
/// view it returns now decides nothing and reports the plan's current policy; every
/// decision (check, peek, charge) goes through the plan limiter, at the new burst,
/// through `&self` and `&mut self` changes alike, on every storage.
fn table_after_a_change<St: Storage<u64, GcraState>>() {
    let plans = Plans::classic();
    let (free, _, _) = classic_ids(&plans);
    let (_, mut limiter) = plan_limiter::<St, Gcra, _>(
        &plans,
        move |_: &u64| free,
        KeyedBuilder::default().capacity(64),
    );
    let cut = Policy::per_day(100).unwrap().with_burst(2).unwrap();
    limiter.set_policy("free", cut).unwrap();
    assert_eq!(limiter.policy("free"), Some(cut));
    assert_eq!(limiter.table(free).policy(), cut);
    assert!(!limiter.peek(&1, 3).is_allowed());
    assert!(!limiter.charge(&1, 3).0.is_allowed());
    assert_eq!(drain(|| limiter.check(&2).is_allowed(), 10), 2);
    let cut_again = Policy::per_day(100).unwrap().with_burst(3).unwrap();
    limiter.set_policy_mut("free", cut_again).unwrap();
    assert_eq!(limiter.table(free).policy(), cut_again);
    assert_eq!(drain(|| limiter.check(&3).is_allowed(), 10), 3);
    let shown = format!("{:?}", limiter.table(free));
    assert!(
        shown.contains("burst: 3"),
        "the view shows the current policy: {shown}"
    );
}

#[test]
fn a_gcra_plans_table_decides_under_the_plans_current_policy() {
    each_storage!(St => { table_after_a_change::<St>(); });
}

/// Holds. Reclaiming a GCRA plan's table through its construction-time algorithm
/// (`table(plan).reclaim_idle()`) after `set_policy` drops only keys whose schedule
/// has caught up (`TAT ≤ now`, policy-free): a key booked ahead under a slower new
/// rate is kept, and so is its debt. A judge that read a key's debt through the
/// stale policy (5 units at the old 100/day: 72 min) would drop key 1 at +1 day,
/// with 4 days of its schedule (at the new 1/day) still ahead: it would then admit
/// a fresh 10 instead of 6.
fn reclaim_after_a_change<St: Storage<u64, GcraState>>() {
    let plans = Plans::classic();
    let (free, _, _) = classic_ids(&plans);
    let (clock, limiter) = plan_limiter::<St, Gcra, _>(
        &plans,
        move |_: &u64| free,
        KeyedBuilder::default().capacity(64).shards(1),
    );
    // 1/day, burst 10: each unit books a whole day.
    limiter
        .set_policy("free", Policy::per_day(1).unwrap().with_burst(10).unwrap())
        .unwrap();
    assert!(limiter.check_n(&1, 5).is_allowed()); // TAT = now + 5 days
    assert!(limiter.check_n(&2, 1).is_allowed()); // TAT = now + 1 day
    clock.advance(Duration::from_secs(86_400 + 1));
    assert_eq!(limiter.table(free).reclaim_idle(), 1, "only key 2 is idle");
    assert_eq!(limiter.metrics().live_keys, 1);
    // Key 1 still owes 4 days: 10 − 4 = 6 units fit, not a fresh 10.
    assert_eq!(limiter.peek(&1, 0).remaining(), 6);
    assert_eq!(drain(|| limiter.check(&1).is_allowed(), 100), 6);
}

#[test]
fn reclaiming_a_gcra_plans_table_after_a_change_keeps_every_busy_key() {
    each_storage!(St => { reclaim_after_a_change::<St>(); });
}

/// Holds. A GCRA plan whose burst is cut to 1 at runtime: every key of the table is
/// then "1 unit in use", so eviction tells a heavy key from a light one only by
/// the time until its schedule is fresh (`forgiven`'s second field, computed under
/// the plan's current policy). The enterprise key booked 900 units (77.76 s ahead)
/// then a flood of 2 000 light enterprise keys (one unit, 86.4 ms ahead) fills the
/// 16-key table: the heavy key must survive. Were it evicted (ranking by units
/// only, a tie broken by slot order), after 10 s it would admit 1 unit instead of
/// 0, its remaining 67.76 s of schedule forgiven.
fn burst_cut_then_flood<St: Storage<u64, GcraState>>() {
    let plans = Plans::classic();
    let (_, _, ent) = classic_ids(&plans);
    let (clock, limiter) = plan_limiter::<St, Gcra, _>(
        &plans,
        move |_: &u64| ent,
        KeyedBuilder::default().capacity(16).shards(1),
    );
    assert!(limiter.check_n(&0, 900).is_allowed());
    limiter
        .set_policy(
            "enterprise",
            Policy::per_day(1_000_000).unwrap().with_burst(1).unwrap(),
        )
        .unwrap();
    for k in 1..2_000u64 {
        assert!(limiter.check(&k).is_allowed());
    }
    assert!(limiter.metrics().evicted > 1_000);
    clock.advance(Duration::from_secs(10));
    let more = drain(|| limiter.check(&0).is_allowed(), 2_000);
    assert_eq!(more, 0, "the heavy key was evicted: {more} more after 10 s");
}

#[test]
fn a_burst_cut_to_one_still_ranks_the_heavy_key_heaviest() {
    each_storage!(St => { burst_cut_then_flood::<St>(); });
}

// ---------------------------------------------------------------------------------
// 2. Receipts across plan moves.
// ---------------------------------------------------------------------------------

/// Holds, on every algorithm and storage. Plans `a` (limit/burst 4 a minute) and
/// `b` (8), at one instant. A charge of 3 under `a`, refunded once the key is in
/// `b`, gives `b` nothing (it stays fresh: 8) and `a` keeps the charge (1 left).
/// Then 1 more charged under `a` (0 left), 8 checked under `b` (0 left), and back
/// in `a` that receipt refunds exactly its 1 unit (1 left) while `b` stays at 0:
/// 3 + 1 + 8 + 1 = 13 admitted = 4 + 8 + the 1 refunded.
fn receipts_across_moves<A, St>()
where
    A: PlanAlgorithm,
    St: Storage<u64, A::State>,
{
    let plans: Plans = [
        ("a".to_owned(), Policy::per_minute(4).unwrap()),
        ("b".to_owned(), Policy::per_minute(8).unwrap()),
    ]
    .into_iter()
    .collect();
    let ids: Vec<PlanId> = plans.iter().map(|(id, _, _)| id).collect();
    let current = Arc::new(AtomicU32::new(0));
    let switch = Arc::clone(&current);
    let (_, limiter) = plan_limiter::<St, A, _>(
        &plans,
        move |_: &u64| ids[switch.load(Ordering::Relaxed) as usize],
        KeyedBuilder::default().capacity(64).shards(1),
    );
    let to = |plan: u32| current.store(plan, Ordering::Relaxed);
    to(0);
    let (d, first) = limiter.charge(&7, 3);
    assert!(d.is_allowed());
    to(1);
    assert!(!limiter.refund(&7, first), "a's receipt refunded into b");
    assert_eq!(limiter.peek(&7, 0).remaining(), 8);
    to(0);
    assert_eq!(limiter.peek(&7, 0).remaining(), 1, "a lost its charge");
    // Charge 1 more under a (0 left), 8 under b, back to a and refund a's.
    let (d, second) = limiter.charge(&7, 1);
    assert!(d.is_allowed());
    to(1);
    assert!(limiter.check_n(&7, 8).is_allowed());
    to(0);
    assert!(limiter.refund(&7, second));
    assert_eq!(limiter.peek(&7, 0).remaining(), 1, "a got back more than 1");
    to(1);
    assert_eq!(limiter.peek(&7, 0).remaining(), 0, "b was refunded");
    // At this instant: a admits its 1, b nothing: 3 + 1 + 8 + 1 = 13 = 4 + 8 + 1
    // (the one refunded unit).
    to(0);
    assert_eq!(drain(|| limiter.check(&7).is_allowed(), 100), 1);
    to(1);
    assert_eq!(drain(|| limiter.check(&7).is_allowed(), 100), 0);
}

#[test]
fn a_receipt_refunds_only_into_the_plan_that_charged_it() {
    macro_rules! on_storages {
        ($a:ty) => {
            receipts_across_moves::<$a, floodgate::Heap>();
            receipts_across_moves::<$a, floodgate::Inline>();
            receipts_across_moves::<$a, floodgate::Fingerprint>();
        };
    }
    on_storages!(Gcra);
    on_storages!(FixedWindow);
    on_storages!(SlidingWindow);
}

// ---------------------------------------------------------------------------------
// 3. A key flipping plans from two threads.
// ---------------------------------------------------------------------------------

/// Holds, on every algorithm and storage. Plans `a` (limit/burst 50 a minute) and
/// `b` (200); the resolver answers the other plan on every call, and two threads
/// check one key 5 000 times each at one instant (the clock never moves). Each
/// plan's table keeps its own state across the moves, so the key admits exactly
/// 50 + 200 = 250 however often it moves — not a burst per move. Metrics add up:
/// 250 allowed, 9 750 denied, 2 live entries.
fn flipping_key<A, St>()
where
    A: PlanAlgorithm + Send + Sync,
    St: Storage<u64, A::State> + Send + Sync,
    St::Table: Send + Sync,
{
    let plans: Plans = [
        ("a".to_owned(), Policy::per_minute(50).unwrap()),
        ("b".to_owned(), Policy::per_minute(200).unwrap()),
    ]
    .into_iter()
    .collect();
    let ids: Vec<PlanId> = plans.iter().map(|(id, _, _)| id).collect();
    let calls = AtomicU64::new(0);
    let (_, limiter) = plan_limiter::<St, A, _>(
        &plans,
        move |_: &u64| ids[(calls.fetch_add(1, Ordering::Relaxed) % 2) as usize],
        KeyedBuilder::default().capacity(64),
    );
    let barrier = Barrier::new(2);
    let admitted = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                barrier.wait();
                for _ in 0..5_000 {
                    if limiter.check(&42).is_allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let m = limiter.metrics();
    assert_eq!(admitted.load(Ordering::Relaxed), 250);
    assert_eq!((m.allowed, m.denied, m.live_keys), (250, 9_750, 2));
}

#[test]
fn a_key_flipping_plans_from_two_threads_admits_each_plans_limit_once() {
    macro_rules! on_storages {
        ($a:ty) => {
            flipping_key::<$a, floodgate::Heap>();
            flipping_key::<$a, floodgate::Inline>();
            flipping_key::<$a, floodgate::Fingerprint>();
        };
    }
    on_storages!(Gcra);
    on_storages!(FixedWindow);
    on_storages!(SlidingWindow);
}

// ---------------------------------------------------------------------------------
// 4. remove / reset, metrics and memory across tables.
// ---------------------------------------------------------------------------------

/// Holds. A key with entries in the first and last of three plans' tables (but not
/// the middle one, and the resolver now pointing at the middle): `remove` must
/// visit every table (a short-circuiting `any` would stop at the first and leave
/// the last entry, with its debt), and returns `true` once, then `false`.
fn remove_everywhere<St: Storage<u64, GcraState>>() {
    let plans = Plans::classic();
    let ids: Vec<PlanId> = plans.iter().map(|(id, _, _)| id).collect();
    let current = Arc::new(AtomicU32::new(0));
    let switch = Arc::clone(&current);
    let (_, limiter) = plan_limiter::<St, Gcra, _>(
        &plans,
        move |_: &u64| ids[switch.load(Ordering::Relaxed) as usize],
        KeyedBuilder::default().capacity(64),
    );
    current.store(0, Ordering::Relaxed);
    assert!(limiter.check_n(&5, 10).is_allowed());
    current.store(2, Ordering::Relaxed);
    assert!(limiter.check_n(&5, 1_000).is_allowed());
    let m = limiter.metrics();
    assert_eq!((m.allowed, m.live_keys), (2, 2));
    current.store(1, Ordering::Relaxed);
    assert!(limiter.remove(&5));
    assert!(!limiter.reset(&5));
    let m = limiter.metrics();
    assert_eq!((m.live_keys, m.removed), (0, 2));
    // Both old plans start fresh: the removal forgave one burst of each.
    current.store(0, Ordering::Relaxed);
    assert_eq!(limiter.peek(&5, 0).remaining(), 10);
    current.store(2, Ordering::Relaxed);
    assert_eq!(limiter.peek(&5, 0).remaining(), 1_000);
}

#[test]
fn remove_clears_a_key_from_every_plans_table() {
    each_storage!(St => { remove_everywhere::<St>(); });
}

/// Holds (was open). `memory_budget` capped one table's slot array, and a
/// `PlanLimiter` builds one table per plan from the same builder, so its slot
/// arrays took up to plans × budget, allocated at build: a budget of exactly one
/// table's slot array (capacity 750, one shard: 16 000 bytes) built a three-plan
/// limiter holding 48 000 bytes (3× the budget). The budget now bounds the tables
/// together: that build fails before allocating, naming the 48 000 bytes, and a
/// budget of three slot arrays builds.
#[test]
fn a_plan_limiters_memory_budget_bounds_all_its_tables() {
    let plans = Plans::classic();
    let (free, pro, ent) = classic_ids(&plans);
    let builder = KeyedBuilder::default().capacity(750).shards(1);
    let one = builder.slot_bytes().unwrap();
    let built: Result<PlanLimiter<u64, _>, _> = PlanLimiter::new(
        &plans,
        move |_: &u64| free,
        builder.clone().memory_budget(3 * one - 1),
    );
    assert_eq!(
        built.map(|_| ()).unwrap_err(),
        PlansError::Keyed(KeyedError::OverMemoryBudget {
            capacity: 750,
            slot_bytes: 3 * one,
            budget: 3 * one - 1,
        })
    );
    let limiter: PlanLimiter<u64, _> =
        PlanLimiter::new(&plans, move |_: &u64| free, builder.memory_budget(3 * one)).unwrap();
    let total: usize = [free, pro, ent]
        .iter()
        .map(|&p| limiter.table(p).slot_bytes())
        .sum();
    assert_eq!(total, 3 * one);
}

// ---------------------------------------------------------------------------------
// 5. Ids outside the plans.
// ---------------------------------------------------------------------------------

/// Holds, on every storage. A resolver that answers an id of a larger `Plans`
/// (index 4 of 5, for a limiter of 3 plans whose default was set to `pro`) is
/// routed to the default plan everywhere: `check`, `peek`, `charge`/`refund` (the
/// receipt refunds: same table), `table(bogus)` is the default's table, and a
/// runtime change of the default plan applies to it. Were check and refund to
/// route differently, the refund would be lost; were the bogus id indexed, it
/// would panic.
fn bogus_ids<St: Storage<u64, GcraState>>() {
    let mut plans = Plans::classic();
    plans.set_default("pro").unwrap();
    let pro = plans.id("pro").unwrap();
    let mut bigger = Plans::classic();
    for name in ["x", "y"] {
        bigger.insert(name, Policy::per_day(1).unwrap());
    }
    let bogus = bigger.id("y").unwrap();
    assert!(plans.name(bogus).is_none());
    let (_, limiter) = plan_limiter::<St, Gcra, _>(
        &plans,
        move |_: &u64| bogus,
        KeyedBuilder::default().capacity(64),
    );
    assert_eq!(limiter.check(&1).limit(), 100);
    let (d, receipt) = limiter.charge(&1, 50);
    assert!(d.is_allowed());
    assert_eq!(limiter.peek(&1, 0).remaining(), 49);
    assert!(limiter.refund(&1, receipt));
    assert_eq!(limiter.peek(&1, 0).remaining(), 99);
    assert_eq!(limiter.table(bogus).metrics().live_keys, 1);
    assert_eq!(limiter.table(pro).metrics().live_keys, 1);
    assert_eq!(limiter.metrics().live_keys, 1);
    limiter
        .set_policy(
            "pro",
            Policy::per_day(10_000).unwrap().with_burst(5).unwrap(),
        )
        .unwrap();
    assert_eq!(drain(|| limiter.check(&1).is_allowed(), 1_000), 4);
}

#[test]
fn an_id_outside_the_plans_is_the_default_plan_everywhere() {
    each_storage!(St => { bogus_ids::<St>(); });
}
