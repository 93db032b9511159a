//! Adversarial review (session 40) of a plan limiter's one-resolver-run surface
//! (`charge_plan`, `receipt_plan`, `refund_in`, `peek_in`, `peek_plan`) and of the
//! hot-key fix for a check or peek racing a demotion (`is_central_closed`).
//!
//! * A receipt names the table that issued it, among plans with equal policies,
//!   and no other limiter's; a refund in the wrong plan or for the wrong key gives
//!   back nothing; an id the resolver made up is the default plan everywhere.
//! * Under a resolver that answers a different plan on each call, with refunds in
//!   the right plan, the wrong plan, through the resolver and never, no plan's table
//!   admits beyond its limit (GCRA and both windows), and every charge's reported
//!   plan is the one its receipt names.
//! * Real threads: checks, charges and peeks of a hot key racing promotions and
//!   demotions never answer with the closed central word's wait (the end of time).
#![cfg(not(loom))]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod common;

use floodgate::keyed::plans::{PlanAlgorithm, PlanId, PlanLimiter, Plans};
use floodgate::keyed::Heap;
use floodgate::{
    Clock, Decision, FixedWindow, Gcra, HotKeyLimiter, HotKeys, KeyedBuilder, KeyedLimiter,
    ManualClock, Nanos, Policy, SlidingWindow,
};

type Error = Box<dyn std::error::Error>;
type TestResult = Result<(), Error>;

type Resolver = Box<dyn Fn(&u64) -> PlanId + Send + Sync>;
type Tiers<A> = PlanLimiter<u64, Resolver, ManualClock, Heap, A>;

/// xorshift64*: a reproducible stream of choices for a seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Three plans with the same policy: only the tables (their receipts' issuers)
/// tell them apart.
#[test]
fn receipt_plan_names_the_issuing_table_among_identical_plans() -> TestResult {
    let mut plans = Plans::new();
    let ids = [
        plans.insert("a", Policy::per_minute(10)?),
        plans.insert("b", Policy::per_minute(10)?),
        plans.insert("c", Policy::per_minute(10)?),
    ];
    let resolver: Resolver = Box::new(move |k: &u64| ids[(*k % 3) as usize]);
    let tiers: Tiers<Gcra> = PlanLimiter::new_in(
        &plans,
        resolver,
        KeyedBuilder::default().clock(ManualClock::new()),
    )?;
    let other: Tiers<Gcra> = PlanLimiter::new_in(
        &plans,
        Box::new(move |_: &u64| ids[0]) as Resolver,
        KeyedBuilder::default().clock(ManualClock::new()),
    )?;
    let plain = KeyedLimiter::<u64>::gcra(Policy::per_minute(10)?);
    for key in 0..6u64 {
        let (charged, receipt) = tiers.charge_plan(&key, 1);
        assert!(charged.decision.is_allowed());
        assert_eq!(charged.plan, ids[(key % 3) as usize], "key {key}");
        assert_eq!(
            tiers.receipt_plan(&receipt),
            Some(charged.plan),
            "key {key}"
        );
        assert_eq!(other.receipt_plan(&receipt), None, "key {key}");
        // A denied charge's receipt still names the table that decided it.
        let (denied, receipt) = tiers.charge_plan(&key, 11);
        assert!(!denied.decision.is_allowed());
        assert_eq!(tiers.receipt_plan(&receipt), Some(denied.plan), "key {key}");
    }
    let (_, foreign) = plain.charge(&1, 1);
    assert_eq!(tiers.receipt_plan(&foreign), None);
    Ok(())
}

/// `free` (burst 10) and `pro` (burst 20), a minute's refill, and a resolver that
/// always answers `free`.
fn free_and_pro() -> Result<(Tiers<Gcra>, PlanId, PlanId), Error> {
    let mut plans = Plans::new();
    let free = plans.insert("free", Policy::per_minute(10)?);
    let pro = plans.insert("pro", Policy::per_minute(100)?.with_burst(20)?);
    let tiers = PlanLimiter::new_in(
        &plans,
        Box::new(move |_: &u64| free) as Resolver,
        KeyedBuilder::default().clock(ManualClock::new()),
    )?;
    Ok((tiers, free, pro))
}

#[test]
fn a_refund_in_the_wrong_plan_or_for_the_wrong_key_gives_back_nothing() -> TestResult {
    let (tiers, free, pro) = free_and_pro()?;
    let (_, first) = tiers.charge_plan(&7, 5);
    let (_, second) = tiers.charge_plan(&7, 5);
    assert_eq!(tiers.peek_in(free, &7, 0).decision.remaining(), 0);
    // Pro's table never charged key 7: nothing comes back there, nor in free.
    assert!(!tiers.refund_in(pro, &7, first));
    assert_eq!(tiers.peek_in(pro, &7, 0).decision.remaining(), 20);
    assert_eq!(tiers.peek_in(free, &7, 0).decision.remaining(), 0);
    // Key 8's entry in free's table is not key 7's charge.
    assert!(tiers.check(&8).is_allowed());
    assert!(!tiers.refund_in(free, &8, second));
    assert_eq!(tiers.peek_in(free, &8, 0).decision.remaining(), 9);
    assert_eq!(tiers.peek_in(free, &7, 0).decision.remaining(), 0);
    // The right plan and key: back.
    let (_, third) = tiers.charge_plan(&9, 4);
    assert!(tiers.refund_in(free, &9, third));
    assert_eq!(tiers.peek_in(free, &9, 0).decision.remaining(), 10);
    Ok(())
}

#[test]
fn an_id_the_resolver_made_up_is_the_default_plan_everywhere() -> TestResult {
    let mut plans = Plans::new();
    let free = plans.insert("free", Policy::per_minute(10)?);
    let _pro = plans.insert("pro", Policy::per_minute(100)?.with_burst(20)?);
    let default = plans.default_plan().ok_or("no default")?;
    // An id from a larger set of plans: not one of these.
    let mut more = Plans::new();
    for name in ["a", "b", "c", "d", "e"] {
        more.insert(name, Policy::per_minute(1)?);
    }
    let made_up = more.id("e").ok_or("no e")?;
    let tiers: Tiers<Gcra> = PlanLimiter::new_in(
        &plans,
        Box::new(move |_: &u64| made_up) as Resolver,
        KeyedBuilder::default().clock(ManualClock::new()),
    )?;
    let (charged, receipt) = tiers.charge_plan(&1, 3);
    assert_eq!(charged.plan, default);
    assert_eq!(charged.policy, plans.policy(default).ok_or("no policy")?);
    assert_eq!(charged.decision.limit(), charged.policy.burst());
    assert_eq!(tiers.receipt_plan(&receipt), Some(default));
    let peeked = tiers.peek_in(made_up, &1, 0);
    assert_eq!((peeked.plan, peeked.decision.remaining()), (default, 7));
    assert_eq!(tiers.peek_plan(&1, 0), peeked);
    assert!(tiers.refund_in(made_up, &1, receipt));
    assert_eq!(tiers.peek_in(free, &1, 0).decision.remaining(), 10);
    Ok(())
}

#[test]
fn peeks_in_a_plan_insert_nothing_and_charge_costs_at_the_edges_never_panic() -> TestResult {
    let (tiers, free, pro) = free_and_pro()?;
    for cost in [0, 1, 10, 11, 20, 21, u32::MAX] {
        let _ = tiers.peek_in(pro, &1, cost);
        let _ = tiers.peek_plan(&2, cost);
    }
    assert_eq!(tiers.table(free).metrics().live_keys, 0);
    assert_eq!(tiers.table(pro).metrics().live_keys, 0);
    for cost in [0, 11, u32::MAX] {
        let (charged, receipt) = tiers.charge_plan_at(&3, Nanos::new(u64::MAX), cost);
        assert!(!receipt.is_charged(), "cost {cost}: {charged:?}");
        if cost > 10 {
            assert_eq!(charged.decision.retry_after(), None, "never fits: {cost}");
        }
        assert!(!tiers.refund_in(free, &3, receipt));
    }
    assert_eq!(tiers.peek_in(free, &3, 0).decision.remaining(), 10);
    Ok(())
}

/// One run of random charges and refunds of a few keys on a plan limiter of
/// algorithm `A` whose resolver answers a plan chosen by the run (a different one
/// from call to call, as upgrades racing every request would), the clock standing
/// still: per plan's table and key, what was admitted less what came back never
/// exceeds the plan's limit, and every charge reports the plan its receipt names.
fn plans_never_admit_beyond_their_limits<A: PlanAlgorithm>(seed: u64) -> TestResult {
    let mut plans = Plans::new();
    let ids = [
        plans.insert("small", Policy::per_minute(3)?),
        plans.insert("mid", Policy::per_minute(5)?),
        plans.insert("big", Policy::per_minute(8)?),
    ];
    let limits: Vec<u64> = ids
        .iter()
        .map(|id| {
            let p = plans.policy(*id).expect("inserted");
            if A::POLICY_FREE_STATE {
                p.burst()
            } else {
                p.limit()
            }
        })
        .collect();
    let pick = Arc::new(AtomicU64::new(seed));
    let resolver: Resolver = {
        let pick = Arc::clone(&pick);
        Box::new(move |_: &u64| ids[(pick.fetch_add(1, Ordering::Relaxed) % 3) as usize])
    };
    let tiers: Tiers<A> = PlanLimiter::new_in(
        &plans,
        resolver,
        KeyedBuilder::default().clock(ManualClock::new()),
    )?;
    let mut rng = Rng::new(seed);
    // Net units admitted, per (plan index, key).
    let mut net = [[0i64; 2]; 3];
    let mut held = Vec::new();
    for step in 0..200 {
        let key = rng.below(2);
        match rng.below(6) {
            0..=2 => {
                pick.store(rng.next(), Ordering::Relaxed);
                let (charged, receipt) = tiers.charge_plan(&key, 1);
                let plan = ids
                    .iter()
                    .position(|id| *id == charged.plan)
                    .ok_or("a plan not in the set")?;
                assert_eq!(tiers.receipt_plan(&receipt), Some(charged.plan));
                assert_eq!(charged.decision.limit(), limits[plan], "step {step}");
                if charged.decision.is_allowed() {
                    net[plan][key as usize] += 1;
                }
                held.push((plan, key, receipt));
            }
            3 if !held.is_empty() => {
                // The right plan, found from the receipt (the layer's refund).
                let (plan, key, receipt) = held.swap_remove(rng.below(held.len() as u64) as usize);
                let named = tiers.receipt_plan(&receipt).ok_or("no plan")?;
                assert_eq!(named, ids[plan]);
                if tiers.refund_in(named, &key, receipt) {
                    net[plan][key as usize] -= 1;
                }
            }
            4 if !held.is_empty() => {
                // Another plan, or another key: nothing may come back anywhere.
                let (plan, key, receipt) = held.swap_remove(rng.below(held.len() as u64) as usize);
                let (into, for_key) = if rng.below(2) == 0 {
                    ((plan + 1 + rng.below(2) as usize) % 3, key)
                } else {
                    (plan, 1 - key)
                };
                assert!(
                    !tiers.refund_in(ids[into], &for_key, receipt),
                    "step {step}: a refund in plan {into} for key {for_key} of plan {plan}'s charge for key {key}"
                );
            }
            5 if !held.is_empty() => {
                // Through the resolver (whatever plan it answers now).
                let (plan, key, receipt) = held.swap_remove(rng.below(held.len() as u64) as usize);
                pick.store(rng.next(), Ordering::Relaxed);
                if tiers.refund(&key, receipt) {
                    net[plan][key as usize] -= 1;
                }
            }
            _ => {}
        }
        for (plan, per_key) in net.iter().enumerate() {
            for (key, n) in per_key.iter().enumerate() {
                assert!(
                    *n <= limits[plan] as i64,
                    "seed {seed} step {step}: plan {plan} key {key} holds {n} units, limit {}",
                    limits[plan]
                );
                // What the table shows agrees: nothing beyond the limit is left.
                let shown = tiers.peek_in(ids[plan], &(key as u64), 0).decision;
                assert!(
                    shown.remaining() as i64 <= limits[plan] as i64 - n,
                    "seed {seed} step {step}: plan {plan} key {key}: {n} held, {shown:?}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn gcra_plans_never_admit_beyond_their_bursts_under_refund_games() -> TestResult {
    for seed in 0..common::stress_rounds(64) {
        plans_never_admit_beyond_their_limits::<Gcra>(seed)?;
    }
    Ok(())
}

#[test]
fn fixed_window_plans_never_admit_beyond_their_limits_under_refund_games() -> TestResult {
    for seed in 0..common::stress_rounds(64) {
        plans_never_admit_beyond_their_limits::<FixedWindow>(seed)?;
    }
    Ok(())
}

#[test]
fn sliding_window_plans_never_admit_beyond_their_limits_under_refund_games() -> TestResult {
    for seed in 0..common::stress_rounds(64) {
        plans_never_admit_beyond_their_limits::<SlidingWindow>(seed)?;
    }
    Ok(())
}

/// Burst 10 at 1/s, leases of 2 on 4 shards, no detection: with the clock still,
/// any true denial waits at most the burst's 10 s.
fn hot_limiter(clock: &ManualClock) -> Result<HotKeyLimiter<u64, ManualClock>, Error> {
    Ok(HotKeyLimiter::new(
        Policy::per_second(1)?.with_burst(10)?,
        KeyedBuilder::default().clock(clock.clone()),
        HotKeys::default().lease_size(2).lease_shards(4).manual(),
    )?)
}

/// A true answer of a burst-10-at-1/s schedule for the clock reading `before` the
/// call (a call that waited for a promotion or demotion decides at the instant it
/// read first, so its wait may be longer by the time the clock moved meanwhile):
/// never the closed central word's reset or wait, the end of time.
fn judge(what: &str, clock: &ManualClock, decide: impl FnOnce() -> Decision) {
    let before = clock.now();
    let d = decide();
    let moved = clock.now().as_u64() - before.as_u64();
    let bound = Duration::from_secs(11) + Duration::from_nanos(moved);
    if let Some(wait) = d.retry_after() {
        assert!(wait <= bound, "{what}: {d:?}, clock moved {moved} ns");
    }
    assert!(
        d.reset_after() <= bound,
        "{what}: {d:?}, clock moved {moved} ns"
    );
}

/// Real threads (not only loom's): checks, charges with refunds and peeks of a hot
/// key on three threads while a fourth promotes and demotes it, the clock moving a
/// little between steps so some checks are admitted and most reach the central word.
#[test]
fn hot_key_decisions_racing_demotions_on_real_threads_are_true_answers() -> TestResult {
    let clock = ManualClock::new();
    let limiter = Arc::new(hot_limiter(&clock)?);
    let stop = Arc::new(AtomicBool::new(false));
    let mut racers = Vec::new();
    for role in 0..3u32 {
        let (limiter, stop, clock) = (Arc::clone(&limiter), Arc::clone(&stop), clock.clone());
        racers.push(std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) || n < 1_000 {
                match role {
                    0 => {
                        judge("check", &clock, || limiter.check(&1));
                        judge("check_n(0)", &clock, || limiter.check_n(&1, 0));
                    }
                    1 => {
                        let mut held = None;
                        judge("charge", &clock, || {
                            let (d, receipt) = limiter.charge(&1, 1);
                            held = Some(receipt);
                            d
                        });
                        if let Some(receipt) = held {
                            let _ = limiter.refund(&1, receipt);
                        }
                    }
                    _ => {
                        judge("peek(1)", &clock, || limiter.peek(&1, 1));
                        judge("peek(0)", &clock, || limiter.peek(&1, 0));
                    }
                }
                n += 1;
            }
            n
        }));
    }
    for step in 0..1_000u64 {
        assert!(limiter.promote(&1), "step {step}");
        std::thread::yield_now();
        assert!(limiter.demote(&1), "step {step}");
        if step % 8 == 0 {
            clock.advance(Duration::from_millis(500));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for racer in racers {
        let n = racer.join().map_err(|_| "a racing thread panicked")?;
        assert!(n >= 1_000);
    }
    let m = limiter.hot_metrics();
    assert_eq!((m.promotions, m.demotions, m.hot_keys), (1_000, 1_000, 0));
    Ok(())
}

/// A window plan's charge refunded in its plan after the window rolled over gives
/// nothing back into the new window: that window still admits only its limit.
#[test]
fn a_window_plans_refund_after_the_rollover_frees_nothing_in_the_new_window() -> TestResult {
    let mut plans = Plans::new();
    let small = plans.insert("small", Policy::per_minute(5)?);
    let clock = ManualClock::new();
    let tiers: Tiers<FixedWindow> = PlanLimiter::new_in(
        &plans,
        Box::new(move |_: &u64| small) as Resolver,
        KeyedBuilder::default().clock(clock.clone()),
    )?;
    let mut old = Vec::new();
    for _ in 0..5 {
        let (charged, receipt) = tiers.charge_plan(&1, 1);
        assert!(charged.decision.is_allowed());
        old.push(receipt);
    }
    clock.advance(Duration::from_secs(60));
    for n in 0..5 {
        assert!(tiers.charge_plan(&1, 1).0.decision.is_allowed(), "unit {n}");
    }
    for receipt in old {
        let plan = tiers.receipt_plan(&receipt).ok_or("no plan")?;
        assert!(!tiers.refund_in(plan, &1, receipt));
    }
    let after = tiers.charge_plan(&1, 1).0.decision;
    assert!(
        !after.is_allowed(),
        "a sixth unit in the new window: {after:?}"
    );
    assert_eq!(tiers.peek_in(small, &1, 0).decision.remaining(), 0);
    Ok(())
}

/// A hot key's clock jumped to the far end of time (past the sealed bit, then to
/// `u64::MAX` ns): every call answers (no panic, no endless re-routing on a word
/// mistaken for a closed one), within a generous deadline.
#[test]
fn a_hot_key_at_the_end_of_time_answers_every_call() -> TestResult {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let run = || -> TestResult {
            let clock = ManualClock::new();
            let limiter = hot_limiter(&clock)?;
            assert!(limiter.promote(&1));
            assert!(limiter.check(&1).is_allowed());
            for at in [1u64 << 62, (1 << 63) - 1, 1 << 63, u64::MAX - 1, u64::MAX] {
                clock.set(Nanos::new(at));
                for cost in [0, 1, 10, 11] {
                    let _ = limiter.check_n(&1, cost);
                    let _ = limiter.peek(&1, cost);
                    let (_, receipt) = limiter.charge(&1, cost);
                    let _ = limiter.refund(&1, receipt);
                }
                let _ = limiter.promote(&1);
                let _ = limiter.demote(&1);
                let _ = limiter.promote(&2);
                let _ = limiter.check(&2);
            }
            Ok(())
        };
        let _ = done.send(run().map_err(|e| e.to_string()));
    });
    finished
        .recv_timeout(Duration::from_secs(60))
        .map_err(|_| "a call at the end of time never answered (or panicked)")??;
    Ok(())
}
