//! Review (session 39, second pass) of `Charge::never_fits` / `never_fits_plan`, which
//! `RateLimitLayerBuilder::build` uses to refuse a rule whose cost can never be
//! admitted ([`ConfigError::Cost`], [`ConfigError::PlanCost`]).
//!
//! The promise pinned here, for every in-process limiter the crate can charge (GCRA,
//! live GCRA, fixed window, sliding window — global, keyed and per plan — and the
//! keyed sliding log), seeded random policies (per-nanosecond rates to periods of
//! years, burst 1 to large), costs 0, 1, capacity, capacity + 1, `u32::MAX` and
//! random, and clocks from 0 to the last instants of `u64` nanoseconds:
//!
//! * no false refusal: before 2^62 ns (the year 2116) `never_fits(cost)` is `Some`
//!   exactly when a fresh limiter, asked at the clock's reading, answers `cost`
//!   "never" (denied, no retry), and every cost up to the capacity fits;
//! * the refusal is what its message says, at any reading: `Some(capacity)` only for
//!   `cost > capacity`, and `capacity` is the policy's (a GCRA's burst, a window's or
//!   a log's limit). Found: at a `ManualClock` reading near `u64::MAX` ns, where a
//!   GCRA schedule can no longer be written and every cost is "never", the merged
//!   code refused cost 1 as `ConfigError::Cost { cost: 1, capacity: <burst> }`
//!   ("cost 1 is more than the N units its limiter admits at once").

use std::time::Duration;

use floodgate::keyed::plans::{PlanLimiter, Plans};
use floodgate::{
    Algorithm, FixedWindow, Gcra, KeyedBuilder, LiveGcra, ManualClock, Nanos, Policy, RateLimiter,
    SlidingWindow,
};
use floodgate_http::{Charge, ConfigError, Global, RateLimitLayer, Rule};

/// A small deterministic generator (xorshift64*), so a failure names its case.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform-ish in `[0, n)`, `n > 0`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A magnitude spread over many orders: `[1, 2^bits]`.
    fn spread(&mut self, max_bits: u32) -> u64 {
        let bits = self.below(u64::from(max_bits)) as u32;
        1 + self.below(1u64 << bits)
    }
}

/// A random valid policy: limit, period (1 ns to ~years), burst; `None` if refused.
fn policy(rng: &mut Rng) -> Option<Policy> {
    let limit = rng.spread(40);
    let period = Duration::from_nanos(rng.spread(60));
    let p = Policy::new(limit, period).ok()?;
    match rng.below(3) {
        0 => Some(p),
        1 => p.with_burst(1).ok(),
        _ => p.with_burst(rng.spread(40)).ok(),
    }
}

/// Clock readings: the epoch, ordinary instants, the edge of the sealed range, and
/// the last instants `u64` nanoseconds hold.
fn instant(rng: &mut Rng) -> u64 {
    match rng.below(6) {
        0 => 0,
        1 => rng.spread(62),
        2 => (1 << 62) - rng.spread(40),
        3 => u64::MAX - rng.below(1 << 20),
        4 => u64::MAX,
        _ => rng.next(),
    }
}

fn costs(rng: &mut Rng, capacity: u64) -> Vec<u32> {
    let clamp = |c: u64| u32::try_from(c).unwrap_or(u32::MAX);
    vec![
        0,
        1,
        clamp(capacity),
        clamp(capacity.saturating_add(1)),
        clamp(capacity.saturating_sub(1)),
        u32::MAX,
        rng.next() as u32,
        clamp(rng.below(capacity.saturating_add(2))),
    ]
}

/// What the limiter answered a fresh key `cost` at `t`: the promise's oracle.
fn never(decision: floodgate::Decision) -> bool {
    !decision.is_allowed() && decision.retry_after().is_none()
}

/// The promise for one answer of `never_fits`, `fresh_never` being what a fresh
/// limiter answered at `t` and `capacity` the policy's.
fn judge(what: &str, t: u64, cost: u32, capacity: u64, fresh_never: bool, got: Option<u64>) {
    let case = format!("{what}: t={t} cost={cost} capacity={capacity}");
    // Before 2^62 ns no schedule nears `u64::MAX`; later, a GCRA whose schedule would
    // pass it answers "never" for any cost, which is the clock's, not the cost's.
    if t < 1 << 62 || u64::from(cost) > capacity {
        assert_eq!(
            got.is_some(),
            fresh_never,
            "consistent with the limiter: {case}"
        );
    }
    if let Some(reported) = got {
        assert!(
            u64::from(cost) > reported,
            "refused as above a capacity it is not above (reported {reported}): {case}"
        );
        assert_eq!(reported, capacity, "the policy's capacity: {case}");
    }
    if u64::from(cost) > capacity {
        assert_eq!(got, Some(capacity), "above the capacity: {case}");
    } else if t < 1 << 62 {
        assert_eq!(got, None, "a false refusal before 2^62 ns: {case}");
    }
}

/// A global and a keyed limiter on `algorithm`, fresh at `t`, for each cost.
fn global_and_keyed<A>(what: &str, algorithm: impl Fn() -> A, capacity: u64, t: u64, rng: &mut Rng)
where
    A: Algorithm + Send + Sync + 'static,
{
    for cost in costs(rng, capacity) {
        let clock = ManualClock::starting_at(Nanos::new(t));
        let global = RateLimiter::with_clock(algorithm(), clock.clone());
        let got = Charge::<()>::never_fits(&global, cost);
        let fresh = RateLimiter::with_clock(algorithm(), clock.clone());
        judge(what, t, cost, capacity, never(fresh.check_n(cost)), got);

        let keyed = KeyedBuilder::new(algorithm())
            .clock(clock.clone())
            .capacity(16)
            .build::<u64>()
            .expect("keyed limiter");
        let got = Charge::<u64>::never_fits(&keyed, cost);
        judge(what, t, cost, capacity, never(keyed.check_n(&7, cost)), got);
    }
}

#[test]
fn never_fits_matches_a_fresh_limiter_for_every_algorithm() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut cases, mut windows, mut sliding, mut logs) = (0, 0, 0, 0);
    while cases < 400 {
        let Some(p) = policy(&mut rng) else { continue };
        cases += 1;
        let t = instant(&mut rng);
        global_and_keyed("gcra", || Gcra::new(p), p.burst(), t, &mut rng);
        global_and_keyed("live gcra", || LiveGcra::new(p), p.burst(), t, &mut rng);
        if let Ok(w) = FixedWindow::new(p) {
            windows += 1;
            global_and_keyed("fixed window", || w, p.limit(), t, &mut rng);
        }
        if let Ok(w) = SlidingWindow::new(p) {
            sliding += 1;
            global_and_keyed("sliding window", || w, p.limit(), t, &mut rng);
        }
        if let Ok(log) = KeyedBuilder::default()
            .clock(ManualClock::starting_at(Nanos::new(t)))
            .capacity(4)
            .sliding_log::<u64>(p)
        {
            logs += 1;
            for cost in costs(&mut rng, p.limit()) {
                let got = Charge::<u64>::never_fits(&log, cost);
                let fresh = never(log.peek(&1, cost));
                judge("sliding log", t, cost, p.limit(), fresh, got);
            }
        }
    }
    // Every kind was tried on a good share of the policies.
    assert!(
        windows > 40 && sliding > 40 && logs > 40,
        "fixed {windows}, sliding {sliding}, logs {logs} of {cases}"
    );
}

/// Per plan: `never_fits_plan` names a plan exactly when a fresh key of every plan
/// is answered "never", and the largest capacity among them (the first among
/// equals).
fn plan_case<A>(
    what: &str,
    limiter: &PlanLimiter<
        u64,
        impl Fn(&u64) -> floodgate::keyed::plans::PlanId + Send + Sync,
        ManualClock,
        floodgate::Heap,
        A,
    >,
    plans: &Plans,
    capacity_of: fn(&Policy) -> u64,
    t: u64,
    rng: &mut Rng,
) where
    A: floodgate::keyed::plans::PlanAlgorithm,
    floodgate::Heap: floodgate::Storage<u64, A::State>,
{
    let max_capacity = plans
        .iter()
        .map(|(_, _, p)| capacity_of(&p))
        .max()
        .unwrap_or(0);
    for cost in costs(rng, max_capacity) {
        let got = Charge::<u64>::never_fits_plan(limiter, cost);
        let mut expected: Option<(String, u64)> = None;
        let mut every_plan_refuses = true;
        for (i, (_, name, p)) in plans.iter().enumerate() {
            let capacity = capacity_of(&p);
            let fresh_never = never(limiter.peek(&(i as u64), cost));
            let case = format!("{what} plan {name}: t={t} cost={cost} capacity={capacity}");
            if u64::from(cost) <= capacity && t < 1 << 62 {
                assert!(
                    !fresh_never,
                    "a fresh key is refused below its capacity: {case}"
                );
            }
            let above = u64::from(cost) > capacity;
            assert!(
                !above || fresh_never,
                "a fresh key admitted above its capacity: {case}"
            );
            every_plan_refuses &= above;
            if above && expected.as_ref().is_none_or(|(_, c)| capacity > *c) {
                expected = Some((name.to_owned(), capacity));
            }
        }
        if !every_plan_refuses {
            expected = None;
        }
        assert_eq!(got, expected, "{what}: t={t} cost={cost}");
        if let Some((_, capacity)) = &got {
            assert!(
                u64::from(cost) > *capacity,
                "{what}: t={t} cost={cost} refused at {capacity}"
            );
        }
        assert_eq!(
            Charge::<u64>::never_fits(limiter, cost),
            got.map(|(_, c)| c)
        );
    }
}

#[test]
fn never_fits_plan_matches_fresh_keys_of_every_plan() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut cases = 0;
    while cases < 150 {
        let mut plans = Plans::new();
        let count = 1 + rng.below(3);
        for i in 0..count {
            if let Some(p) = policy(&mut rng) {
                plans.insert(&format!("p{i}"), p);
            }
        }
        if plans.is_empty() {
            continue;
        }
        cases += 1;
        let ids: Vec<_> = plans.iter().map(|(id, _, _)| id).collect();
        let t = instant(&mut rng);
        let table = || {
            KeyedBuilder::default()
                .clock(ManualClock::starting_at(Nanos::new(t)))
                .capacity(16)
        };
        let ids2 = ids.clone();
        let resolve = move |k: &u64| ids2[*k as usize % ids2.len()];
        if let Ok(l) = PlanLimiter::new(&plans, resolve.clone(), table()) {
            plan_case("gcra", &l, &plans, |p| p.burst(), t, &mut rng);
        }
        if let Ok(l) = PlanLimiter::fixed_window(&plans, resolve.clone(), table()) {
            plan_case("fixed window", &l, &plans, |p| p.limit(), t, &mut rng);
        }
        if let Ok(l) = PlanLimiter::sliding_window(&plans, resolve, table()) {
            plan_case("sliding window", &l, &plans, |p| p.limit(), t, &mut rng);
        }
    }
}

/// The user-visible end: at the last instants of the clock, a layer whose cost is
/// within the burst is not refused with an error saying the cost is above it.
#[test]
fn a_cost_within_the_burst_is_never_refused_as_above_it() {
    let policy = Policy::per_second(10)
        .and_then(|p| p.with_burst(5))
        .expect("policy");
    for t in [
        0,
        1 << 40,
        (1 << 62) - 1,
        u64::MAX - 1_000_000_000,
        u64::MAX,
    ] {
        let limiter =
            RateLimiter::with_clock(Gcra::new(policy), ManualClock::starting_at(Nanos::new(t)));
        let built = RateLimitLayer::builder()
            .rule(Rule::new("r", limiter, Global).expect("rule").cost(5))
            .build();
        if let Err(ConfigError::Cost { cost, capacity, .. }) = &built {
            panic!("t={t}: cost {cost} refused as above capacity {capacity}");
        }
    }
}
