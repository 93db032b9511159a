//! Plans: TOML loading, errors, the resolver, runtime quota changes that keep every
//! key's state, and plans on every algorithm (GCRA and both windows) and storage,
//! against one un-keyed limiter per key.
#![cfg(not(loom))]

#[macro_use]
mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use floodgate::keyed::plans::{PlanAlgorithm, PlanId, PlanLimiter, Plans, PlansError};
use floodgate::keyed::Heap;
use floodgate::{
    DurationError, FixedWindow, Gcra, KeyedBuilder, ManualClock, Nanos, Policy, PolicyError,
    RateLimiter, SlidingWindow, Storage,
};
use proptest::prelude::*;

const CLASSIC: &str = r#"
default = "free"

[plans.free]
limit = 100
period = "1d"
burst = 10

[plans.pro]
limit = 10000
period = "24h"
burst = 100

[plans.enterprise]
limit = 1000000
period = "1d"
burst = 1000
"#;

#[test]
fn toml_classic_equals_the_builtin_table() {
    let loaded = Plans::from_toml(CLASSIC).unwrap();
    let classic = Plans::classic();
    assert_eq!(loaded.len(), 3);
    for (_, name, policy) in classic.iter() {
        assert_eq!(
            loaded.policy(loaded.id(name).unwrap()),
            Some(policy),
            "{name}"
        );
    }
    assert_eq!(loaded.name(loaded.default_plan().unwrap()), Some("free"));
}

#[test]
fn burst_defaults_to_limit() {
    let plans = Plans::from_toml("[plans.x]\nlimit = 5\nperiod = \"5m\"\n").unwrap();
    let p = plans.policy(plans.id("x").unwrap()).unwrap();
    assert_eq!(p, Policy::new(5, Duration::from_secs(300)).unwrap());
}

#[test]
fn toml_errors_are_typed() {
    let err = |text: &str| Plans::from_toml(text).unwrap_err();
    assert!(matches!(err("[plans.x\n"), PlansError::Toml { .. }));
    assert!(matches!(
        err("[plans.x]\nlimit = 5\n"),
        PlansError::Toml { .. }
    ));
    assert!(matches!(
        err("[plans.x]\nlimit = -5\nperiod = \"1s\"\n"),
        PlansError::Toml { .. }
    ));
    assert!(matches!(
        err("[plans.x]\nlimit = 5\nperiod = \"1s\"\ncolour = 1\n"),
        PlansError::Toml { .. }
    ));
    assert_eq!(
        err("[plans.x]\nlimit = 5\nperiod = \"1 fortnight\"\n"),
        PlansError::Period {
            plan: "x".into(),
            error: DurationError::UnknownUnit {
                unit: "fortnight".into()
            }
        }
    );
    assert!(matches!(
        err("[plans.x]\nlimit = 0\nperiod = \"1s\"\n"),
        PlansError::Policy { plan, error: PolicyError::Zero { .. } } if plan == "x"
    ));
    assert!(matches!(
        err("[plans.x]\nlimit = 5\nperiod = \"0s\"\n"),
        PlansError::Policy { .. }
    ));
    assert_eq!(
        err("default = \"gold\"\n[plans.x]\nlimit = 5\nperiod = \"1s\"\n"),
        PlansError::UnknownPlan {
            name: "gold".into()
        }
    );
    // Displays name the plan.
    let shown = err("[plans.x]\nlimit = 5\nperiod = \"1y\"\n").to_string();
    assert!(
        shown.contains("\"x\"") && shown.contains("period"),
        "{shown}"
    );
}

#[test]
fn no_plans_no_limiter() {
    let err = PlanLimiter::<u64, _>::new(
        &Plans::new(),
        |_: &u64| unreachable_plan(),
        KeyedBuilder::default(),
    )
    .unwrap_err();
    assert_eq!(err, PlansError::NoPlans);
}

fn unreachable_plan() -> floodgate::keyed::plans::PlanId {
    Plans::classic().default_plan().unwrap()
}

#[test]
fn the_resolver_picks_each_keys_plan() {
    let clock = ManualClock::new();
    let plans = Plans::classic();
    let (free, pro, enterprise) = (
        plans.id("free").unwrap(),
        plans.id("pro").unwrap(),
        plans.id("enterprise").unwrap(),
    );
    let limiter = PlanLimiter::new(
        &plans,
        move |key: &String| match key.split('_').next() {
            Some("pro") => pro,
            Some("ent") => enterprise,
            _ => free,
        },
        KeyedBuilder::default().clock(clock.clone()).capacity(100),
    )
    .unwrap();
    let twins: Vec<(String, RateLimiter<Gcra, ManualClock>)> =
        [("free_a", free), ("pro_b", pro), ("ent_c", enterprise)]
            .into_iter()
            .map(|(k, id)| {
                (
                    k.to_owned(),
                    RateLimiter::gcra_with_clock(plans.policy(id).unwrap(), clock.clone()),
                )
            })
            .collect();
    for round in 0..3_000u32 {
        for (key, twin) in &twins {
            let cost = round % 3;
            assert_eq!(
                limiter.check_n_at(key, floodgate::Clock::now(&clock), cost),
                twin.check_n(cost),
                "{key} {round}"
            );
        }
        clock.advance(Duration::from_millis(700));
    }
}

#[test]
fn changing_a_quota_keeps_every_keys_state() {
    let clock = ManualClock::new();
    let plans = Plans::classic();
    let free = plans.id("free").unwrap();
    let limiter = PlanLimiter::new(
        &plans,
        move |_: &u64| free,
        KeyedBuilder::default().clock(clock.clone()),
    )
    .unwrap();
    // Key 1 spends its whole burst of 10: TAT = now + 10 × 864 s.
    for _ in 0..10 {
        assert!(limiter.check(&1).is_allowed());
    }
    assert!(!limiter.check(&1).is_allowed());
    // New quota: 200/day (T = 432 s), burst 10. The TAT is kept, so key 1 is still
    // booked 8 640 s ahead: it has 0 left until now + 8 640 − 10·432 = 4 320 s.
    limiter
        .set_policy(
            "free",
            Policy::per_day(200).unwrap().with_burst(10).unwrap(),
        )
        .unwrap();
    assert_eq!(limiter.policy("free").unwrap().limit(), 200);
    let denied = limiter.check(&1);
    assert!(!denied.is_allowed());
    assert_eq!(
        denied.retry_after(),
        Some(Duration::from_secs(8_640 - 10 * 432 + 432))
    );
    // A fresh key gets the new burst at once.
    assert_eq!(limiter.check(&2).remaining(), 9);
    // Shrinking the burst clamps remaining to the new burst.
    limiter
        .set_policy("free", Policy::per_day(100).unwrap().with_burst(3).unwrap())
        .unwrap();
    assert_eq!(limiter.peek(&3, 0).remaining(), 3);
    assert_eq!(
        limiter.set_policy("gold", Policy::per_day(1).unwrap()),
        Err(PlansError::UnknownPlan {
            name: "gold".into()
        })
    );
}

/// `plans` lists every plan in plan order with its policy as it is at the call: a
/// change through `set_policy` (GCRA) or `set_policy_mut` (a window) shows in the
/// next copy, not in one taken before; the default plan is the table's.
#[test]
fn the_plans_a_limiter_lists_are_its_plans_as_they_are_now() {
    let mut plans = small_plans();
    plans.set_default("b").unwrap();
    let b = plans.id("b").unwrap();
    let gcra =
        PlanLimiter::<u64, _>::new(&plans, move |_: &u64| b, KeyedBuilder::default()).unwrap();
    let before = gcra.plans();
    assert_eq!(before, plans);
    assert_eq!(before.default_plan(), Some(b));
    let changed = Policy::per_second(7).unwrap().with_burst(2).unwrap();
    gcra.set_policy("a", changed).unwrap();
    let after = gcra.plans();
    assert_eq!(after.policy(after.id("a").unwrap()), Some(changed));
    assert_eq!(
        before.policy(before.id("a").unwrap()),
        plans.policy(plans.id("a").unwrap())
    );
    let names: Vec<_> = after
        .iter()
        .map(|(id, name, _)| (id, name.to_owned()))
        .collect();
    let expected: Vec<_> = plans
        .iter()
        .map(|(id, name, _)| (id, name.to_owned()))
        .collect();
    assert_eq!(names, expected);

    let mut window = PlanLimiter::<u64, _, _, _, FixedWindow>::fixed_window(
        &plans,
        move |_: &u64| b,
        KeyedBuilder::default(),
    )
    .unwrap();
    window.set_policy_mut("b", changed).unwrap();
    let listed = window.plans();
    assert_eq!(listed.policy(b), Some(changed));
    assert_eq!(listed.len(), plans.len());
}

#[test]
fn quota_changes_race_with_decisions_safely() {
    // Readers never see a torn policy: every decision's limit is one of the two bursts.
    let plans = Plans::classic();
    let free = plans.id("free").unwrap();
    let limiter = PlanLimiter::new(
        &plans,
        move |_: &u64| free,
        KeyedBuilder::default().capacity(1_000),
    )
    .unwrap();
    let a = Policy::per_day(100).unwrap().with_burst(10).unwrap();
    let b = Policy::per_second(1_000_000)
        .unwrap()
        .with_burst(7)
        .unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..2_000 {
                limiter
                    .set_policy("free", if i % 2 == 0 { b } else { a })
                    .unwrap();
            }
        });
        s.spawn(|| {
            for key in 0..20_000u64 {
                let limit = limiter.check(&(key % 500)).limit();
                assert!(limit == 10 || limit == 7, "torn policy: burst {limit}");
                let p = limiter.policy("free").unwrap();
                assert!(p == a || p == b, "torn policy {p:?}");
            }
        });
    });
}

/// Plans for the differential test: short windows so that traces cross many.
fn small_plans() -> Plans {
    let mut plans = Plans::new();
    plans.insert("a", Policy::new(3, Duration::from_secs(1)).unwrap());
    plans.insert("b", Policy::new(5, Duration::from_secs(2)).unwrap());
    plans.insert(
        "c",
        Policy::new(10, Duration::from_millis(500))
            .unwrap()
            .with_burst(4)
            .unwrap(),
    );
    plans
}

/// Policies a plan may change to: the same periods as `small_plans` with other
/// limits, and other periods.
fn new_policy(i: usize) -> Policy {
    [
        Policy::new(2, Duration::from_secs(1)).unwrap(),
        Policy::new(8, Duration::from_secs(2)).unwrap(),
        Policy::new(4, Duration::from_millis(300)).unwrap(),
        Policy::new(6, Duration::from_secs(3))
            .unwrap()
            .with_burst(2)
            .unwrap(),
    ][i % 4]
}

#[derive(Clone, Debug)]
enum PlanOp {
    Advance(u64),
    Check { key: u64, cost: u32 },
    Peek { key: u64, cost: u32 },
    Remove { key: u64 },
    SetPolicy { plan: usize, policy: usize },
}

fn plan_op() -> impl Strategy<Value = PlanOp> {
    prop_oneof![
        4 => (0u64..700_000_000).prop_map(PlanOp::Advance),
        8 => (0u64..9, 0u32..5).prop_map(|(key, cost)| PlanOp::Check { key, cost }),
        2 => (0u64..9, 0u32..5).prop_map(|(key, cost)| PlanOp::Peek { key, cost }),
        1 => (0u64..9).prop_map(|key| PlanOp::Remove { key }),
        1 => (0usize..3, 0usize..4).prop_map(|(plan, policy)| PlanOp::SetPolicy { plan, policy }),
    ]
}

/// Runs `ops` on a plan limiter of algorithm `A` on storage `S` (key `k` on plan
/// `k mod 3`) and on one `RateLimiter` per key built from its plan's policy, which
/// changes as `set_algorithm` carries state over; every decision must be equal.
fn plans_match_one_limiter_per_key<A, S>(ops: &[PlanOp])
where
    A: PlanAlgorithm,
    S: Storage<u64, A::State>,
{
    let clock = ManualClock::new();
    clock.set(Nanos::from_secs(1_000));
    let plans = small_plans();
    let ids: Vec<PlanId> = plans.iter().map(|(id, _, _)| id).collect();
    let resolve = {
        let ids = ids.clone();
        move |key: &u64| ids[(*key % 3) as usize]
    };
    let mut limiter: PlanLimiter<u64, _, ManualClock, S, A> = PlanLimiter::new_in(
        &plans,
        resolve,
        KeyedBuilder::default().clock(clock.clone()).capacity(64),
    )
    .unwrap();
    let mut policies: Vec<Policy> = plans.iter().map(|(_, _, p)| p).collect();
    let mut twins: HashMap<u64, RateLimiter<A, ManualClock>> = HashMap::new();
    let ensure =
        |twins: &mut HashMap<u64, RateLimiter<A, ManualClock>>, policies: &[Policy], key: u64| {
            twins.entry(key).or_insert_with(|| {
                let policy = policies[(key % 3) as usize];
                RateLimiter::with_clock(A::for_policy(policy).unwrap(), clock.clone())
            });
        };
    for (step, op) in ops.iter().enumerate() {
        match *op {
            PlanOp::Advance(ns) => {
                clock.advance(Duration::from_nanos(ns));
            }
            PlanOp::Check { key, cost } => {
                ensure(&mut twins, &policies, key);
                let expected = twins[&key].check_n(cost);
                assert_eq!(limiter.check_n(&key, cost), expected, "step {step}: {op:?}");
            }
            PlanOp::Peek { key, cost } => {
                ensure(&mut twins, &policies, key);
                let expected = twins[&key].peek(cost);
                assert_eq!(limiter.peek(&key, cost), expected, "step {step}: {op:?}");
            }
            PlanOp::Remove { key } => {
                limiter.remove(&key);
                twins.remove(&key);
            }
            PlanOp::SetPolicy { plan, policy } => {
                let policy = new_policy(policy);
                let name = plans.name(ids[plan]).unwrap().to_owned();
                limiter.set_policy_mut(&name, policy).unwrap();
                policies[plan] = policy;
                for (key, twin) in twins.iter_mut() {
                    if (*key % 3) as usize == plan {
                        twin.set_algorithm(A::for_policy(policy).unwrap());
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(crate::common::cases(64))]

    #[test]
    fn plans_on_every_algorithm_and_storage_match_one_limiter_per_key(
        ops in prop::collection::vec(plan_op(), 1..300)
    ) {
        macro_rules! on_storages {
            ($a:ty) => {
                plans_match_one_limiter_per_key::<$a, floodgate::Heap>(&ops);
                plans_match_one_limiter_per_key::<$a, floodgate::Inline>(&ops);
                plans_match_one_limiter_per_key::<$a, floodgate::Fingerprint>(&ops);
            };
        }
        on_storages!(Gcra);
        on_storages!(FixedWindow);
        on_storages!(SlidingWindow);
    }
}

#[test]
fn window_plans_count_each_plans_limit_per_window() {
    let clock = ManualClock::new();
    let plans = Plans::classic();
    let (free, pro) = (plans.id("free").unwrap(), plans.id("pro").unwrap());
    let limiter = PlanLimiter::fixed_window(
        &plans,
        move |key: &str| if key.starts_with("pro_") { pro } else { free },
        KeyedBuilder::default().clock(clock.clone()),
    )
    .unwrap();
    // A window counts the plan's limit (the burst is GCRA's notion): 100 a day free.
    assert!(limiter.check_n("anon", 100).is_allowed());
    assert!(!limiter.check("anon").is_allowed());
    assert!(limiter.check_n("pro_1", 10_000).is_allowed());
    assert!(!limiter.check("pro_1").is_allowed());
    // Each plan has its own table; the metrics add them up.
    assert_eq!(limiter.table(free).metrics().live_keys, 1);
    assert_eq!(limiter.table(pro).metrics().live_keys, 1);
    assert_eq!(limiter.metrics().live_keys, 2);
    assert_eq!(limiter.metrics().denied, 2);
    clock.advance(Duration::from_secs(86_400));
    assert_eq!(limiter.check("anon").remaining(), 99);
}

#[test]
fn a_window_plan_whose_period_changes_starts_fresh_and_is_never_stuck() {
    // The window index of a stored state means nothing under another period: the
    // change rewrites every key (`carry_over`) instead of leaving states that would
    // read as a window far ahead (and deny for years).
    let clock = ManualClock::new();
    clock.set(Nanos::from_secs(1_700_000_000));
    let plans: Plans = [("p".to_owned(), Policy::per_second(5).unwrap())]
        .into_iter()
        .collect();
    let p = plans.id("p").unwrap();
    let mut limiter = PlanLimiter::fixed_window(
        &plans,
        move |_: &u64| p,
        KeyedBuilder::default().clock(clock.clone()),
    )
    .unwrap();
    assert!(limiter.check_n(&1, 5).is_allowed());
    assert!(!limiter.check(&1).is_allowed());
    // Same period, lower limit: the 5 units stay counted (0 of 3 left).
    limiter
        .set_policy_mut("p", Policy::per_second(3).unwrap())
        .unwrap();
    assert!(!limiter.check(&1).is_allowed());
    // A longer period: a fresh window of the new policy.
    limiter
        .set_policy_mut("p", Policy::per_hour(7).unwrap())
        .unwrap();
    assert_eq!(limiter.check(&1).remaining(), 6);
    assert!(limiter.check_n(&1, 6).is_allowed());
    assert!(!limiter.check(&1).is_allowed());
    clock.advance(Duration::from_secs(3_600));
    assert!(limiter.check(&1).is_allowed(), "the next hour admits again");
    assert!(matches!(
        limiter.set_policy_mut("q", Policy::per_hour(1).unwrap()),
        Err(PlansError::UnknownPlan { .. })
    ));
}

/// Plans `small` (2 a minute) and `large` (4), and a resolver that answers the
/// plan index in the switch.
#[allow(clippy::type_complexity)]
fn two_plans_and_a_switch() -> (ManualClock, Plans, Arc<AtomicU32>, impl Fn(&u64) -> PlanId) {
    let plans: Plans = [
        ("small".to_owned(), Policy::per_minute(2).unwrap()),
        ("large".to_owned(), Policy::per_minute(4).unwrap()),
    ]
    .into_iter()
    .collect();
    let current = Arc::new(AtomicU32::new(0));
    let ids: Vec<PlanId> = plans.iter().map(|(id, _, _)| id).collect();
    let switch = Arc::clone(&current);
    let resolver = move |_: &u64| ids[switch.load(Ordering::Relaxed) as usize];
    (ManualClock::new(), plans, current, resolver)
}

/// Moves the key small → large → small → large, checking until denied on each.
fn admitted_while_moving(current: &AtomicU32, mut check: impl FnMut() -> bool) -> u32 {
    let mut admitted = 0;
    for plan in [0, 1, 0, 1] {
        current.store(plan, Ordering::Relaxed);
        while check() {
            admitted += 1;
        }
    }
    admitted
}

#[test]
fn a_key_moving_between_window_plans_forgives_at_most_one_window_per_move() {
    let (clock, plans, current, resolver) = two_plans_and_a_switch();
    let limiter = PlanLimiter::sliding_window(
        &plans,
        resolver,
        KeyedBuilder::default().clock(clock.clone()),
    )
    .unwrap();
    // Within one minute the key moves small → large → small → large.
    let admitted = admitted_while_moving(&current, || limiter.check(&9).is_allowed());
    // small: 2, large: 4, then each table still counts its own units: nothing more.
    assert_eq!(admitted, 6);
    // A receipt from one plan's table refunds nothing once the key has moved.
    current.store(0, Ordering::Relaxed);
    clock.advance(Duration::from_secs(120));
    let (decision, receipt) = limiter.charge(&9, 1);
    assert!(decision.is_allowed());
    current.store(1, Ordering::Relaxed);
    assert!(!limiter.refund(&9, receipt));
    // `remove` clears the key from every plan's table.
    assert!(limiter.remove(&9));
    assert_eq!(limiter.metrics().live_keys, 0);
}

#[test]
fn a_key_moving_between_gcra_plans_forgives_at_most_one_burst_per_move() {
    let (clock, plans, current, resolver) = two_plans_and_a_switch();
    let limiter: PlanLimiter<u64, _, _> = PlanLimiter::new(
        &plans,
        resolver,
        KeyedBuilder::default().clock(clock.clone()),
    )
    .unwrap();
    // At one instant the key moves small → large → small → large.
    let admitted = admitted_while_moving(&current, || limiter.check(&9).is_allowed());
    // small's burst of 2, large's of 4; moving back finds each plan's own schedule.
    assert_eq!(admitted, 6);
    assert_eq!(limiter.metrics().live_keys, 2);
    // Each table ranks and reclaims under its own plan: at 30 s small's schedule
    // has caught up (2 units at 30 s each), large's (4 at 15 s each) too.
    clock.advance(Duration::from_secs(30));
    current.store(0, Ordering::Relaxed);
    assert_eq!(limiter.peek(&9, 0).remaining(), 1);
    current.store(1, Ordering::Relaxed);
    assert_eq!(limiter.peek(&9, 0).remaining(), 2);
    // `remove` clears the key from every plan's table.
    assert!(limiter.remove(&9));
    assert_eq!(limiter.metrics().live_keys, 0);
}

/// Valid as a policy, but a sliding window counter's two counts of 20 bits leave
/// its window index too few bits to last a year at 1 ms windows.
fn too_fine_for_a_sliding_window() -> Policy {
    Policy::new(1_000_000, Duration::from_millis(1)).unwrap()
}

#[test]
fn a_plan_the_algorithm_cannot_run_is_named_in_the_error() {
    let plans: Plans = [("fine".to_owned(), too_fine_for_a_sliding_window())]
        .into_iter()
        .collect();
    let id = plans.id("fine").unwrap();
    let err = PlanLimiter::<u64, _, _, _, _>::sliding_window(
        &plans,
        move |_: &u64| id,
        KeyedBuilder::default(),
    )
    .unwrap_err();
    assert!(
        matches!(&err, PlansError::Policy { plan, .. } if plan == "fine"),
        "{err}"
    );
    // A change to such a policy is refused and changes nothing.
    let plans: Plans = [("fine".to_owned(), Policy::per_second(5).unwrap())]
        .into_iter()
        .collect();
    let mut limiter =
        PlanLimiter::sliding_window(&plans, move |_: &u64| id, KeyedBuilder::default()).unwrap();
    assert!(limiter.check_n(&1, 2).is_allowed());
    assert!(matches!(
        limiter.set_policy_mut("fine", too_fine_for_a_sliding_window()),
        Err(PlansError::Policy { .. })
    ));
    assert_eq!(limiter.policy("fine"), Some(Policy::per_second(5).unwrap()));
    assert_eq!(limiter.peek(&1, 0).remaining(), 3);
}

/// Charges key 9 four times under a resolver that answers the other plan (small,
/// then large) on every call: each charge runs the resolver once and reports the
/// plan it charged under, its policy, and a receipt that names that plan without
/// running it again.
fn charge_plan_reports_the_plan_that_charged<A: PlanAlgorithm>()
where
    Heap: Storage<u64, A::State>,
{
    let (clock, plans, _, _) = two_plans_and_a_switch();
    let ids: Vec<PlanId> = plans.iter().map(|(id, _, _)| id).collect();
    let calls = Arc::new(AtomicU32::new(0));
    let resolver = {
        let (calls, ids) = (Arc::clone(&calls), ids.clone());
        move |_: &u64| ids[(calls.fetch_add(1, Ordering::Relaxed) % 2) as usize]
    };
    let limiter: PlanLimiter<u64, _, ManualClock, Heap, A> =
        PlanLimiter::new_in(&plans, resolver, KeyedBuilder::default().clock(clock)).unwrap();
    // small admits 2 a minute, large 4: each plan's table counts down on its own.
    for (n, remaining) in [1, 3, 0, 2].into_iter().enumerate() {
        let (charged, receipt) = limiter.charge_plan(&9, 1);
        assert_eq!(calls.load(Ordering::Relaxed), n as u32 + 1, "charge {n}");
        let plan = ids[n % 2];
        assert_eq!(charged.plan, plan, "charge {n}");
        assert_eq!(Some(charged.policy), plans.policy(plan), "charge {n}");
        assert_eq!(
            charged.decision.limit(),
            charged.policy.limit(),
            "charge {n}"
        );
        assert_eq!(charged.decision.remaining(), remaining, "charge {n}");
        assert_eq!(limiter.receipt_plan(&receipt), Some(plan), "charge {n}");
    }
    // `peek_plan` too: one run, and the plan it answered (small again).
    let now = limiter.peek_plan(&9, 0);
    assert_eq!(calls.load(Ordering::Relaxed), 5);
    assert_eq!((now.plan, now.decision.remaining()), (ids[0], 0));
    assert_eq!(limiter.receipt_plan(&limiter.charge(&9, 0).1), Some(ids[1]));
}

#[test]
fn charge_plan_runs_the_resolver_once_and_reports_the_plan_that_charged() {
    charge_plan_reports_the_plan_that_charged::<Gcra>();
    charge_plan_reports_the_plan_that_charged::<FixedWindow>();
    charge_plan_reports_the_plan_that_charged::<SlidingWindow>();
}

/// A charge taken in `large` before the key moved to `small` is given back in
/// `large` by `refund_in` with the plan its receipt names (`refund`, which asks
/// the resolver, looks in `small` and gives back nothing).
fn a_receipt_is_refunded_in_the_plan_that_charged<A: PlanAlgorithm>()
where
    Heap: Storage<u64, A::State>,
{
    let (clock, plans, current, resolver) = two_plans_and_a_switch();
    let (small, large) = (plans.id("small").unwrap(), plans.id("large").unwrap());
    let limiter: PlanLimiter<u64, _, ManualClock, Heap, A> = PlanLimiter::new_in(
        &plans,
        resolver,
        KeyedBuilder::default().clock(clock.clone()),
    )
    .unwrap();
    current.store(1, Ordering::Relaxed);
    let (_, first) = limiter.charge(&9, 1);
    let (_, second) = limiter.charge(&9, 2);
    assert_eq!(limiter.peek_in(large, &9, 0).decision.remaining(), 1);
    current.store(0, Ordering::Relaxed);
    assert!(!limiter.refund(&9, first));
    assert_eq!(limiter.receipt_plan(&second), Some(large));
    assert!(limiter.refund_in(large, &9, second));
    let in_large = limiter.peek_in(large, &9, 0);
    assert_eq!((in_large.plan, in_large.decision.remaining()), (large, 3));
    assert_eq!(Some(in_large.policy), plans.policy(large));
    // small's table never saw the key.
    assert_eq!(limiter.peek_in(small, &9, 0).decision.remaining(), 2);
    // Another limiter's receipt names no plan here.
    let other: PlanLimiter<u64, _, ManualClock, Heap, A> = PlanLimiter::new_in(
        &plans,
        move |_: &u64| small,
        KeyedBuilder::default().clock(clock),
    )
    .unwrap();
    assert_eq!(limiter.receipt_plan(&other.charge(&9, 1).1), None);
}

#[test]
fn a_receipt_names_its_plan_and_is_refunded_there_after_the_key_moved() {
    a_receipt_is_refunded_in_the_plan_that_charged::<Gcra>();
    a_receipt_is_refunded_in_the_plan_that_charged::<FixedWindow>();
    a_receipt_is_refunded_in_the_plan_that_charged::<SlidingWindow>();
}

#[test]
fn a_window_plans_rewrite_voids_its_receipts_plan() {
    let (clock, plans, _, resolver) = two_plans_and_a_switch();
    let mut limiter =
        PlanLimiter::fixed_window(&plans, resolver, KeyedBuilder::default().clock(clock)).unwrap();
    let (_, receipt) = limiter.charge(&9, 1);
    assert_eq!(limiter.receipt_plan(&receipt), plans.id("small"));
    // Another period: the table is rewritten and its receipts give back nothing.
    limiter
        .set_policy_mut("small", Policy::per_hour(2).unwrap())
        .unwrap();
    assert_eq!(limiter.receipt_plan(&receipt), None);
}
