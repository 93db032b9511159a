//! Plans: TOML loading, errors, the resolver, and runtime quota changes that keep
//! every key's GCRA state.
#![cfg(not(loom))]

use std::time::Duration;

use floodgate::keyed::plans::{PlanLimiter, Plans, PlansError};
use floodgate::{DurationError, Gcra, KeyedBuilder, ManualClock, Policy, PolicyError, RateLimiter};

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
