//! Adversarial review (session 40) of the leased mode's receipts and refunds:
//! `LeasedGcra::charge`/`refund`/`peek` and `HotKeyLimiter::charge`/`refund`.
//!
//! * A refund of a charge whose lease has expired never lets a later interval admit
//!   beyond the documented bound (the central GCRA's allowance plus the units out on
//!   lease at the interval's start, counting the charges still refundable then).
//! * On a clock that jumps forward and steps back, refunds create no unit (every
//!   unit admitted net of refunds, or held on a lease, was taken from the central
//!   word) and a shard never holds more than one lease.
//! * A hot key's charges and refunds from many threads, while another thread
//!   promotes and demotes it, never admit beyond the burst on a standing clock.
//! * A cold receipt kept across a promotion and a demotion is judged by the keyed
//!   table (exact: the charge's booking still ahead of the clock).
#![cfg(not(loom))]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

mod common;
#[allow(dead_code)] // the harness's generator only
mod race;

use floodgate::{
    Clock, HotKeyLimiter, HotKeys, Inline, KeyedBuilder, LeasedGcra, ManualClock, Nanos, Policy,
    Receipt,
};
use race::Rng;

/// A clock a test sets anywhere, backwards included.
#[derive(Default)]
struct Jumpy(AtomicU64);

impl Jumpy {
    fn set(&self, t: u64) {
        self.0.store(t, Ordering::Relaxed);
    }
}

impl Clock for Jumpy {
    fn now(&self) -> Nanos {
        Nanos::new(self.0.load(Ordering::Relaxed))
    }
}

const MS: u64 = 1_000_000;
/// An expiry tick (2^16 ns).
const TICK: u64 = 1 << 16;

/// A leased limiter of 64 shards (one per thread that decides: each test thread
/// owns one) with leases of `lease` units living `lifetime` ns.
fn leased<C: Clock>(policy: Policy, lease: u32, lifetime: u64, clock: C) -> LeasedGcra<C> {
    LeasedGcra::builder(policy)
        .shards(64)
        .lease_size(lease)
        .lifetime(Duration::from_nanos(lifetime))
        .build_with_clock(clock)
        .unwrap()
}

/// 1 000 a second (one unit a millisecond), burst `burst`.
fn per_ms(burst: u64) -> Policy {
    Policy::per_second(1_000)
        .unwrap()
        .with_burst(burst)
        .unwrap()
}

/// One charge of a run: its reading, its cost, whether it was admitted and not
/// refunded, and (if refunded) the op at which the refund gave it back.
struct Op {
    at: u64,
    cost: u64,
    admitted: bool,
    units_on_lease_before: u64,
    refunded_at_op: Option<usize>,
}

/// The scenario behind the randomized check below, by hand: a charge from a lease
/// that has expired is refunded at the start of a fresh interval; the interval may
/// admit only the central word's allowance (nothing was on lease at its start).
#[test]
fn a_refund_of_an_expired_leases_charge_admits_nothing_beyond_the_bound() {
    const BURST: u64 = 10;
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let policy = Policy::per_second(1).unwrap().with_burst(BURST).unwrap();
    let l = leased(policy, 5, MS, clock.clone());
    let (d, old) = l.charge(5); // a lease of 5, spent out
    assert!(d.is_allowed() && old.is_charged());
    clock.advance(Duration::from_secs(10)); // the central word is full again
    assert_eq!(
        l.units_on_lease(),
        0,
        "the interval starts with nothing on lease"
    );
    let mut admitted = 0;
    let (d, _) = l.charge(1); // a new lease of 5: 4 left
    admitted += u64::from(d.is_allowed());
    let back = l.refund(old);
    while l.check().is_allowed() {
        admitted += 1;
    }
    assert!(
        admitted <= BURST,
        "admitted {admitted} > {BURST} on a standing clock (refund: {back})"
    );
    assert!(!back, "the charge's lease has expired");
    assert_eq!(admitted, BURST);
}

/// Random charges, immediate and delayed refunds on a clock moving forward in
/// random steps (some past a lease's lifetime): over every interval of readings
/// `[a, b]`, the admissions not refunded are at most `B + ⌊(b − a)/T⌋` plus the
/// units on lease at `a` plus the refunds, made in the interval, of charges before
/// it whose lease was still unexpired at `a` (the bound with refunds of
/// `LeasedGcra::refund`). One thread decides, so one shard holds units: never more
/// than a lease.
#[test]
fn refunds_on_a_forward_jumping_clock_keep_the_leased_bound() {
    const BURST: u64 = 12;
    const T: u64 = MS; // 1 000 a second
    const LEASE: u32 = 4;
    const LIFETIME: u64 = 2 * MS;
    for seed in 1..=12u64 {
        let clock = ManualClock::starting_at(Nanos::from_secs(1));
        let l = leased(per_ms(BURST), LEASE, LIFETIME, clock.clone());
        let mut rng = Rng::new(seed);
        let mut ops: Vec<Op> = Vec::new();
        let mut kept: Vec<(usize, Receipt)> = Vec::new();
        for step in 0..600usize {
            match rng.below(12) {
                0 => {
                    clock.advance(Duration::from_nanos(rng.below(3 * MS)));
                }
                1 => {
                    clock.advance(Duration::from_nanos(rng.below(40) * TICK / 8));
                }
                // Long enough for the central word to fill up again.
                2 => {
                    clock.advance(Duration::from_nanos(BURST * T + rng.below(4 * MS)));
                }
                _ => {}
            }
            // Delayed refunds of kept receipts (some of leases since expired).
            if !kept.is_empty() && rng.below(2) == 0 {
                let (i, receipt) = kept.swap_remove(rng.below(kept.len() as u64) as usize);
                if l.refund(receipt) {
                    ops[i].refunded_at_op = Some(ops.len());
                }
            }
            let before = l.units_on_lease();
            let at = clock.now().as_u64();
            let cost = 1 + rng.below(u64::from(LEASE) + 2) as u32;
            let (d, receipt) = l.charge(cost);
            let i = ops.len();
            ops.push(Op {
                at,
                cost: u64::from(cost),
                admitted: d.is_allowed(),
                units_on_lease_before: before,
                refunded_at_op: None,
            });
            if d.is_allowed() {
                match rng.below(3) {
                    0 => {
                        let back = l.refund(receipt);
                        if back {
                            ops[i].refunded_at_op = Some(i + 1);
                        }
                    }
                    1 => kept.push((i, receipt)),
                    _ => {}
                }
            }
            assert!(
                l.units_held() <= u64::from(LEASE),
                "seed {seed} step {step}: {} units held on one shard",
                l.units_held()
            );
        }
        // Every interval of ops [i, j] (readings nondecreasing).
        for i in 0..ops.len() {
            let a = ops[i].at;
            let mut net = 0u64;
            let mut slack = ops[i].units_on_lease_before;
            let mut refunds_in: Vec<usize> = Vec::new();
            for (j, op) in ops.iter().enumerate().skip(i) {
                if op.admitted && op.refunded_at_op.is_none() {
                    net += op.cost;
                }
                // Refunds made at op j (before charge j) of charges before i whose
                // lease could still be unexpired at `a`.
                refunds_in.clear();
                for (k, earlier) in ops.iter().enumerate().take(i) {
                    if earlier.refunded_at_op == Some(j)
                        && earlier.at + LIFETIME + TICK > a
                        && j > i
                    {
                        refunds_in.push(k);
                    }
                }
                slack += refunds_in.iter().map(|&k| ops[k].cost).sum::<u64>();
                let b = op.at;
                let bound = BURST + (b - a) / T + slack;
                assert!(
                    net <= bound,
                    "seed {seed}: ops {i}..={j} ([{a}, {b}] ns) admitted {net} > {bound}"
                );
            }
        }
    }
}

/// On a clock stepping back and forth, refunds create no unit: the units admitted
/// (net of refunds) plus those held on leases never pass what the central word can
/// have handed out over the span of readings, `B + ⌊(max − min)/T⌋`; and the one
/// deciding thread's shard never holds more than one lease.
#[test]
fn refunds_on_a_clock_stepping_back_create_no_unit() {
    const BURST: u64 = 16;
    const T: u64 = MS;
    const LEASE: u32 = 5;
    for seed in 1..=12u64 {
        let clock = Arc::new(Jumpy::default());
        let start = 5_000 * MS;
        clock.set(start);
        let l = leased(per_ms(BURST), LEASE, MS, Arc::clone(&clock));
        let mut rng = Rng::new(seed + 1_000);
        let (mut min, mut max) = (start, start);
        let mut now = start;
        let mut net = 0u64;
        let mut kept: Vec<Receipt> = Vec::new();
        for step in 0..800 {
            match rng.below(6) {
                0 => now += rng.below(3 * MS),
                // Back, sometimes before the limiter's origin.
                1 => now = now.saturating_sub(rng.below(3 * MS)),
                _ => {}
            }
            clock.set(now);
            min = min.min(now);
            max = max.max(now);
            if !kept.is_empty() && rng.below(3) == 0 {
                let receipt = kept.swap_remove(rng.below(kept.len() as u64) as usize);
                let cost = u64::from(receipt.cost());
                if l.refund(receipt) {
                    net -= cost;
                }
            }
            let cost = 1 + rng.below(u64::from(LEASE) + 3) as u32;
            let (d, receipt) = l.charge(cost);
            if d.is_allowed() {
                net += u64::from(cost);
                match rng.below(3) {
                    0 => {
                        let back = l.refund(receipt);
                        if back {
                            net -= u64::from(cost);
                        }
                    }
                    1 => kept.push(receipt),
                    _ => {}
                }
            }
            let held = l.units_held();
            assert!(
                held <= u64::from(LEASE),
                "seed {seed} step {step}: {held} units held"
            );
            let handed_out = BURST + (max - min) / T;
            assert!(
                net + held <= handed_out,
                "seed {seed} step {step}: admitted {net} + held {held} > {handed_out}"
            );
        }
    }
}

fn hot(clock: &ManualClock, burst: u64, lease: u32) -> HotKeyLimiter<u64, ManualClock, Inline> {
    HotKeyLimiter::new_in(
        Policy::per_second(1).unwrap().with_burst(burst).unwrap(),
        KeyedBuilder::default().clock(clock.clone()),
        HotKeys::default()
            .lease_size(lease)
            .lease_shards(64)
            .slots(2)
            .manual(),
    )
    .unwrap()
}

/// A cold charge kept across a promotion and a demotion: while the key is hot its
/// refund gives nothing back; once it is cold again the keyed table judges it
/// exactly (the part of the charge's booking still ahead of the clock, as for any
/// cold refund), never the lease's unspent units.
#[test]
fn a_cold_receipt_across_a_promotion_and_a_demotion_is_judged_by_the_table() {
    const BURST: u64 = 20; // one unit a second
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let h = hot(&clock, BURST, 4);
    let (d, cold) = h.charge(&1, 3); // books [1 s, 4 s)
    assert!(d.is_allowed());
    let (_, cold_while_hot) = h.charge(&1, 1); // books [4 s, 5 s)
    assert!(h.promote(&1));
    assert!(
        !h.refund(&1, cold_while_hot),
        "the schedule is the lease limiter's"
    );
    for _ in 0..5 {
        assert!(h.check(&1).is_allowed()); // two leases of 4: the schedule at 13 s
    }
    clock.advance(Duration::from_secs(1)); // 2 s: one unit of `cold` has passed
    assert!(h.demote(&1)); // 3 unspent units counted as spent
    assert_eq!(h.peek(&1, 0).remaining(), 22 - 13);
    assert!(
        h.refund(&1, cold),
        "the key is cold again: the table's refund"
    );
    // The two units of `cold` still ahead of the clock, no more.
    assert_eq!(h.peek(&1, 0).remaining(), 22 - 11);
}

/// Threads charge a hot key and refund at once (a later rule's denial) or a few
/// charges later (across promotions) while
/// another thread promotes and demotes it over and over, on a standing clock: the
/// key never admits more than its burst, net of the refunds that reported success:
/// what it admitted plus what its schedule has left is at most the burst.
#[test]
fn hot_charges_and_refunds_under_promotion_churn_never_pass_the_burst() {
    // Never exhausted: every promotion keeps leasing, so refunds keep landing.
    const BURST: u64 = 1_000_000;
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    // Leases of one unit and charges of one: a demotion strands no unspent unit and
    // a refund tops its lease up whole, so next to nothing is lost and a unit a
    // refund created would show.
    let h = Arc::new(hot(&clock, BURST, 1));
    let stop = Arc::new(AtomicBool::new(false));
    let flips = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(4));
    let churn = {
        let (h, stop, start, flips) = (h.clone(), stop.clone(), start.clone(), flips.clone());
        thread::spawn(move || {
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                let _ = h.promote(&1);
                thread::sleep(Duration::from_micros(200)); // hot most of the time
                let _ = h.demote(&1);
                flips.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let workers: Vec<_> = (0..3u64)
        .map(|_| {
            let (h, start, flips) = (h.clone(), start.clone(), flips.clone());
            thread::spawn(move || {
                start.wait();
                let mut net = 0u64;
                let mut i = 0u64;
                // Receipts refunded a few charges later (across promotions).
                let mut later = std::collections::VecDeque::new();
                // At least 20 000 charges, and on through 200 promotions.
                while i < 20_000 || flips.load(Ordering::Relaxed) < 200 {
                    i += 1;
                    let cost = 1;
                    let (d, receipt) = h.charge(&1, cost);
                    if !d.is_allowed() {
                        continue;
                    }
                    net += u64::from(cost);
                    match i % 4 {
                        0 | 2 => {
                            let back = h.refund(&1, receipt);
                            if back {
                                net -= u64::from(cost);
                            }
                        }
                        1 => later.push_back((cost, receipt)),
                        _ => {}
                    }
                    if later.len() > 8 {
                        let (cost, receipt) = later.pop_front().unwrap();
                        if h.refund(&1, receipt) {
                            net -= u64::from(cost);
                        }
                    }
                }
                net
            })
        })
        .collect();
    let net: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    stop.store(true, Ordering::Relaxed);
    churn.join().unwrap();
    assert!(flips.load(Ordering::Relaxed) >= 200);
    let _ = h.demote(&1);
    let left = h.peek(&1, 0).remaining();
    assert!(
        net + left <= BURST,
        "admitted {net} + remaining {left} > burst {BURST}"
    );
}

/// A report (cost 0) on a hot key while another thread promotes and demotes it:
/// every answer is the key's schedule, never the closed central word a demotion
/// leaves behind (whose "reset" is the end of time: a `RateLimit` reset of 584
/// years in a layer's response). Peeks (of a lease's units too), checks and
/// charges alike.
#[test]
fn reports_on_a_hot_key_under_demotion_churn_never_read_the_closed_word() {
    const BURST: u64 = 20; // one unit a second: τ = 20 s
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let h = Arc::new(hot(&clock, BURST, 4));
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (h, stop) = (h.clone(), stop.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = h.promote(&1);
                let _ = h.demote(&1);
            }
        })
    };
    let tau = Duration::from_secs(BURST);
    let mut bad = Vec::new();
    for i in 0..common::stress_rounds(2_000_000) as u32 {
        let d = match i % 5 {
            0 => h.peek(&1, 0),
            1 => h.check_n(&1, 0),
            2 => h.charge(&1, 0).0,
            // Keeps a unit on this thread's lease, then peeks at it.
            3 => h.charge(&1, 1).0,
            _ => h.peek(&1, 1),
        };
        if d.reset_after() > tau || (!d.is_allowed() && i % 5 < 3) {
            bad.push((i % 5, d));
            if bad.len() > 4 {
                break;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    churn.join().unwrap();
    assert!(bad.is_empty(), "reports read off a closed word: {bad:?}");
}

/// `peek` allows exactly what the next `check_n` on the same thread allows
/// (`AsyncLimit::peek_n` on the hot-key modes: a `LeasedGcra`, a hot and a cold key), on a clock jumping both ways and
/// before the limiter's origin, whatever the lease holds: costs 0 to past the burst.
#[test]
fn a_peek_allows_what_the_next_check_on_this_thread_allows() {
    const BURST: u64 = 9;
    for seed in 1..=8u64 {
        let clock = Arc::new(Jumpy::default());
        let start = 5 * MS;
        clock.set(start);
        let l = leased(per_ms(BURST), 4, MS, Arc::clone(&clock));
        let h = HotKeyLimiter::<u64, _, Inline>::new_in(
            per_ms(BURST),
            KeyedBuilder::default().clock(Arc::clone(&clock)),
            HotKeys::default()
                .lease_size(4)
                .lease_shards(64)
                .lease_lifetime(Duration::from_millis(1))
                .manual(),
        )
        .unwrap();
        assert!(h.promote(&0));
        let mut rng = Rng::new(seed + 2_000);
        let mut now = start;
        for step in 0..3_000 {
            match rng.below(5) {
                0 => now += rng.below(2 * MS),
                1 => now = now.saturating_sub(rng.below(MS)),
                _ => {}
            }
            clock.set(now);
            let cost = rng.below(BURST + 2) as u32;
            let key = rng.below(2); // key 0 hot, key 1 cold
            let (peek, check) = match rng.below(2) {
                0 => (l.peek(cost), l.check_n(cost)),
                _ => (h.peek(&key, cost), h.check_n(&key, cost)),
            };
            assert_eq!(
                peek.is_allowed(),
                check.is_allowed(),
                "seed {seed} step {step}: cost {cost} at {now}: peek {peek:?}, check {check:?}"
            );
        }
    }
}
