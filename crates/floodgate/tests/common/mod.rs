//! Trace generators shared by the property tests, and `each_storage!`.
#![allow(dead_code)]

/// Runs `$body` once per keyed storage, with `$s` naming it (`#[macro_use] mod common;`).
#[allow(unused_macros)]
macro_rules! each_storage {
    ($s:ident => $body:block) => {{
        {
            type $s = floodgate::Heap;
            $body
        }
        {
            type $s = floodgate::Inline;
            $body
        }
        {
            type $s = floodgate::Fingerprint;
            $body
        }
    }};
}

use proptest::prelude::*;

/// The property tests' config: `default` cases, or `PROPTEST_CASES` where it is set.
/// proptest reads that variable only for a config left at its defaults, so a count
/// written in a test would ignore it: CI's ThreadSanitizer run shrinks every
/// property with it, and a campaign raises them.
pub fn cases(default: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok());
    ProptestConfig::with_cases(cases.unwrap_or(default))
}

/// Replays grants (instant, cost) in time order on a fresh GCRA of `policy`: every one
/// must be admitted. This is the bound every set of live (not given back) grants of a
/// shaper or a GCRA limiter must meet, whatever was reserved, cancelled or refunded.
pub fn conforms(
    policy: floodgate::Policy,
    grants: &[(floodgate::Nanos, u32)],
) -> Result<(), String> {
    let mut sorted = grants.to_vec();
    sorted.sort();
    let fresh = floodgate::RateLimiter::gcra_with_clock(policy, floodgate::ManualClock::new());
    for &(at, cost) in &sorted {
        if !fresh.check_n_at(at, cost).is_allowed() {
            return Err(format!("{cost} at {at:?} passes the limit: {sorted:?}"));
        }
    }
    Ok(())
}

/// One step of a trace: move the clock by `step` ns (negative: an earlier reading),
/// then check (or peek) `cost` units.
#[derive(Clone, Debug)]
pub struct Op {
    pub step: i64,
    pub cost: u32,
    pub peek: bool,
}

/// Steps mostly within a window, some across windows, some gaps of up to
/// `max_gap` ns, some readings up to a period earlier; costs 0, within the limit,
/// just above it and `u32::MAX`; a third of the operations are peeks.
pub fn op(period: u64, limit: u64, max_gap: u64) -> impl Strategy<Value = Op> {
    let p = period.min(i64::MAX as u64 / 4) as i64;
    let step = prop_oneof![
        6 => 0..=p / 4 + 1,
        3 => 0..=2 * p,
        1 => 0..=(max_gap.min(i64::MAX as u64) as i64),
        1 => -p..=0,
    ];
    let l = limit.min(u64::from(u32::MAX) - 4) as u32;
    let cost = prop_oneof![
        2 => Just(0u32),
        8 => 1..=l,
        1 => l + 1..=l + 3,
        1 => Just(u32::MAX),
    ];
    let peek = prop_oneof![2 => Just(false), 1 => Just(true)];
    (step, cost, peek).prop_map(|(step, cost, peek)| Op { step, cost, peek })
}

/// `now` moved by `step`, saturating at both ends of `u64`.
pub fn advance(now: u64, step: i64) -> u64 {
    if step >= 0 {
        now.saturating_add(step as u64)
    } else {
        now.saturating_sub(step.unsigned_abs())
    }
}

/// A keyed limiter of `capacity` keys over `shards` shards on storage `S`, driven
/// by `clock` (the keyed tests run one case on every storage).
pub fn keyed_on<A, S>(
    algorithm: A,
    clock: &floodgate::ManualClock,
    capacity: usize,
    shards: usize,
) -> floodgate::KeyedLimiter<u64, A, floodgate::ManualClock, S>
where
    A: floodgate::Algorithm,
    S: floodgate::Storage<u64, A::State>,
{
    floodgate::KeyedBuilder::new(algorithm)
        .capacity(capacity)
        .shards(shards)
        .clock(clock.clone())
        .build_in()
        .expect("valid configuration")
}

/// Runs the generic case `$case::<S>()` on every storage (`Heap`, `Inline`,
/// `Fingerprint`).
#[allow(unused_macros)] // not every test file that shares this module runs keyed cases
macro_rules! on_every_storage {
    ($case:ident) => {
        $case::<floodgate::Heap>();
        $case::<floodgate::Inline>();
        $case::<floodgate::Fingerprint>();
    };
}

/// A GCRA charged with every admission whether or not it fits, `interval` ns a unit:
/// what a plain limiter that had admitted the same requests would hold (the lease
/// tests' under-admission oracle).
pub struct Plain {
    pub burst: u64,
    pub interval: u64,
    pub tat: u64,
}

impl Plain {
    pub fn charge(&mut self, now: u64, cost: u32) {
        self.tat = self.tat.max(now) + u64::from(cost) * self.interval;
    }

    /// Whole units it could admit at `now`.
    pub fn available(&self, now: u64) -> u64 {
        (now + self.burst * self.interval).saturating_sub(self.tat.max(now)) / self.interval
    }
}

/// A leased limiter's denial of `cost` at `now`: only for want of units stranded in
/// leases, so a plain GCRA charged with the same admissions (`plain`) holds fewer
/// than `cost +` the units the leases hold (on a trace where no lease expires,
/// every unit taken from the central word is admitted or held).
pub fn denied_for_stranded_units(
    limiter: &floodgate::LeasedGcra<floodgate::ManualClock>,
    now: u64,
    cost: u32,
    plain: &Plain,
) {
    let available = plain.available(now);
    let held = limiter.units_held();
    assert!(
        available < u64::from(cost) + held,
        "denied {cost} at {now}: a plain GCRA has {available}, leases hold {held}"
    );
}

/// A leased limiter's builder at 1 000 a second (T = 1 ms) with burst `burst`:
/// `shards` shards, leases of `lease` units living `lifetime`.
pub fn lease_builder(
    burst: u64,
    lease: u32,
    shards: usize,
    lifetime: std::time::Duration,
) -> floodgate::LeaseBuilder {
    floodgate::LeasedGcra::builder(
        floodgate::Policy::per_second(1_000)
            .unwrap()
            .with_burst(burst)
            .unwrap(),
    )
    .shards(shards)
    .lease_size(lease)
    .lifetime(lifetime)
}

/// Runs `$body` on every storage, catching each one's panic, then fails with all
/// of their messages (so one report shows every storage). `mod common` must sit at
/// the test crate's root.
#[allow(unused_macros)] // not every test file that shares this module runs keyed cases
macro_rules! every_storage_reporting {
    ($s:ident => $body:block) => {{
        let mut failures: Vec<String> = Vec::new();
        {
            type $s = floodgate::Heap;
            if let Err(e) = std::panic::catch_unwind(|| $body) {
                failures.push(common::panic_text(e));
            }
        }
        {
            type $s = floodgate::Inline;
            if let Err(e) = std::panic::catch_unwind(|| $body) {
                failures.push(common::panic_text(e));
            }
        }
        {
            type $s = floodgate::Fingerprint;
            if let Err(e) = std::panic::catch_unwind(|| $body) {
                failures.push(common::panic_text(e));
            }
        }
        assert!(
            failures.is_empty(),
            "{} storage(s) failed:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }};
}

/// A caught panic's message (empty when it carried none).
pub fn panic_text(e: Box<dyn std::any::Any + Send>) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// A policy of 1..=1000 per second with a burst of 1..=8 (the reservation traces).
pub fn shaper_policy() -> impl Strategy<Value = floodgate::Policy> {
    (1u64..=1_000, 1u64..=8).prop_map(|(rate, burst)| {
        floodgate::Policy::per_second(rate)
            .and_then(|p| p.with_burst(burst))
            .expect("a valid policy")
    })
}

/// Reservation costs: 0, 1, up to the burst, just above it and `u32::MAX`.
pub fn reservation_cost(burst: u32) -> impl Strategy<Value = u32> {
    prop_oneof![
        2 => Just(0u32),
        4 => Just(1u32),
        6 => 1..=burst,
        2 => burst + 1..=burst + 3,
        1 => Just(u32::MAX),
    ]
}

/// Reservation bounds: 0, up to a few seconds, and unbounded.
pub fn reservation_bound() -> impl Strategy<Value = std::time::Duration> {
    prop_oneof![
        2 => Just(std::time::Duration::ZERO),
        6 => (0u64..3_000_000_000).prop_map(std::time::Duration::from_nanos),
        1 => Just(std::time::Duration::MAX),
    ]
}

/// `n` divided by `FLOODGATE_STRESS_DIVISOR` (default 1, never below one round).
/// `.ci/run` sets it under ThreadSanitizer, which makes every step of a stress test
/// several times dearer: the same races (and, for seed loops, the same kind of
/// trace) run fewer times over.
pub fn stress_rounds(n: u64) -> u64 {
    let divisor = std::env::var("FLOODGATE_STRESS_DIVISOR")
        .ok()
        .and_then(|d| d.parse::<u64>().ok())
        .filter(|&d| d > 0)
        .unwrap_or(1);
    (n / divisor).max(1)
}
