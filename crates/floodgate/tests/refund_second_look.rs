//! A second look at GCRA's refund rule (fab9fcc: a refund keeps spent the schedule
//! booked after its charge whose slots may still be ahead of `now`).
//!
//! * `schedules`: random mixes of immediate admissions (some at earlier readings, as
//!   another thread's), charges, bookings, reservations and give-backs in any order,
//!   on every GCRA front end — [`Shaper`], [`RateLimiter`] over [`Gcra`] and over
//!   [`LiveGcra`] (bursts changed at runtime), and the keyed limiter on every storage
//!   with two keys in one shard (so one key's refunds move the other's ledger). The
//!   units still granted must always conform to GCRA(T, τ), replayed on a fresh
//!   limiter in slot order.
//! * The login pattern and the composite rollback must still give back a whole charge
//!   when nothing booked since waits for a later slot.
#![cfg(not(loom))]

mod common;
use common::conforms;

use floodgate::{
    Clock, Fingerprint, Gcra, Heap, Inline, KeyedBuilder, KeyedLimiter, LiveGcra, ManualClock,
    Nanos, Policy, RateLimiter, Receipt, Reservation, Shaper, Storage,
};
use std::time::Duration;

/// What gives a grant back.
enum Handle {
    Receipt(Receipt),
    Reservation(Reservation),
}

/// One GCRA front end under attack, driven on a manual clock.
trait Sut {
    fn clock(&self) -> &ManualClock;
    /// An immediate admission at `at` (≤ now) with a receipt.
    fn charge(&self, key: u64, at: Nanos, cost: u32) -> Option<Handle>;
    /// A booking at `now`: its slot and receipt.
    fn book(&self, key: u64, now: Nanos, cost: u32) -> Option<(Nanos, Handle)>;
    /// A reservation within `max_delay` (a booking where there is none).
    fn reserve(
        &self,
        key: u64,
        now: Nanos,
        cost: u32,
        max_delay: Duration,
    ) -> Option<(Nanos, Handle)>;
    /// Gives a grant back at `now` (the clock's reading).
    fn give_back(&self, key: u64, now: Nanos, handle: Handle);
    /// Changes the burst at runtime, if this front end can.
    fn set_burst(&self, _burst: u64) -> bool {
        false
    }
}

struct ShaperSut(Shaper<ManualClock>, ManualClock);

impl Sut for ShaperSut {
    fn clock(&self) -> &ManualClock {
        &self.1
    }
    fn charge(&self, _: u64, at: Nanos, cost: u32) -> Option<Handle> {
        let (d, r) = self.0.charge_at(at, cost);
        d.is_allowed().then_some(Handle::Receipt(r))
    }
    fn book(&self, _: u64, now: Nanos, cost: u32) -> Option<(Nanos, Handle)> {
        let (d, delay, r) = self.0.book_at(now, cost);
        d.is_allowed()
            .then(|| (now.saturating_add(delay), Handle::Receipt(r)))
    }
    fn reserve(&self, _: u64, now: Nanos, cost: u32, max: Duration) -> Option<(Nanos, Handle)> {
        let r = self.0.reserve_at(now, cost, max).ok()?;
        Some((r.ready_at(), Handle::Reservation(r)))
    }
    fn give_back(&self, _: u64, now: Nanos, handle: Handle) {
        match handle {
            Handle::Receipt(r) => {
                let _ = self.0.refund(r);
            }
            Handle::Reservation(r) => {
                let _ = self.0.cancel_at(now, r);
            }
        }
    }
}

/// A direct limiter over `Gcra` or `LiveGcra`.
struct DirectSut<A: floodgate::Algorithm<State = floodgate::GcraState>> {
    limiter: RateLimiter<A, ManualClock>,
    live: Option<(u64, u64)>, // (limit, period ns) for set_burst
}

impl<A: floodgate::Algorithm<State = floodgate::GcraState> + 'static> Sut for DirectSut<A> {
    fn clock(&self) -> &ManualClock {
        self.limiter.clock()
    }
    fn charge(&self, _: u64, at: Nanos, cost: u32) -> Option<Handle> {
        let (d, r) = self.limiter.charge_at(at, cost);
        d.is_allowed().then_some(Handle::Receipt(r))
    }
    fn book(&self, _: u64, now: Nanos, cost: u32) -> Option<(Nanos, Handle)> {
        let (d, delay, r) = self.limiter.book_at(now, cost)?;
        d.is_allowed()
            .then(|| (now.saturating_add(delay), Handle::Receipt(r)))
    }
    fn reserve(&self, key: u64, now: Nanos, cost: u32, _: Duration) -> Option<(Nanos, Handle)> {
        self.book(key, now, cost)
    }
    fn give_back(&self, _: u64, _: Nanos, handle: Handle) {
        if let Handle::Receipt(r) = handle {
            let _ = self.limiter.refund(r);
        }
    }
    fn set_burst(&self, burst: u64) -> bool {
        let Some((limit, period)) = self.live else {
            return false;
        };
        let any: &dyn std::any::Any = self.limiter.algorithm();
        let Some(live) = any.downcast_ref::<LiveGcra>() else {
            return false;
        };
        live.set_policy(policy(limit, period, burst));
        true
    }
}

struct KeyedSut<St: Storage<u64, floodgate::GcraState>> {
    keyed: KeyedLimiter<u64, Gcra, ManualClock, St>,
}

impl<St: Storage<u64, floodgate::GcraState>> Sut for KeyedSut<St> {
    fn clock(&self) -> &ManualClock {
        self.keyed.clock()
    }
    fn charge(&self, key: u64, at: Nanos, cost: u32) -> Option<Handle> {
        let (d, r) = self.keyed.charge_at(&key, at, cost);
        d.is_allowed().then_some(Handle::Receipt(r))
    }
    fn book(&self, key: u64, now: Nanos, cost: u32) -> Option<(Nanos, Handle)> {
        let (d, delay, r) = self.keyed.book_at(&key, now, cost)?;
        d.is_allowed()
            .then(|| (now.saturating_add(delay), Handle::Receipt(r)))
    }
    fn reserve(&self, key: u64, now: Nanos, cost: u32, max: Duration) -> Option<(Nanos, Handle)> {
        let (_, delay, r) = self.keyed.reserve_at(&key, now, cost, max).ok()?;
        Some((now.saturating_add(delay), Handle::Receipt(r)))
    }
    fn give_back(&self, key: u64, _: Nanos, handle: Handle) {
        if let Handle::Receipt(r) = handle {
            let _ = self.keyed.refund(&key, r);
        }
    }
}

fn policy(limit: u64, period: u64, burst: u64) -> Policy {
    Policy::new(limit, Duration::from_nanos(period))
        .unwrap()
        .with_burst(burst)
        .unwrap()
}

mod schedules {
    use super::*;
    use proptest::prelude::*;

    const P: u64 = 1_000;

    #[derive(Clone, Debug)]
    pub(super) enum Op {
        Advance(u64),
        /// An immediate admission kept for good, at `behind` ns before now.
        Check {
            key: u64,
            cost: u32,
            behind: u64,
        },
        /// An immediate admission with a receipt, at `behind` ns before now.
        Charge {
            key: u64,
            cost: u32,
            behind: u64,
        },
        Book {
            key: u64,
            cost: u32,
        },
        Reserve {
            key: u64,
            cost: u32,
            max_delay: u64,
        },
        /// Give back a live grant (index modulo their number).
        GiveBack(usize),
        /// A new burst at runtime (front ends that can).
        SetBurst(u64),
    }

    fn op(keys: u64) -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0..3 * P).prop_map(Op::Advance),
            2 => (0..keys, 1..=3u32, prop_oneof![Just(0u64), 0..2 * P])
                .prop_map(|(key, cost, behind)| Op::Check { key, cost, behind }),
            3 => (0..keys, 1..=3u32, prop_oneof![Just(0u64), 0..2 * P])
                .prop_map(|(key, cost, behind)| Op::Charge { key, cost, behind }),
            3 => (0..keys, 1..=3u32).prop_map(|(key, cost)| Op::Book { key, cost }),
            3 => (0..keys, 1..=3u32, 0..8 * P)
                .prop_map(|(key, cost, max_delay)| Op::Reserve { key, cost, max_delay }),
            5 => any::<usize>().prop_map(Op::GiveBack),
            1 => (1..=5u64).prop_map(Op::SetBurst),
        ]
    }

    /// Runs `ops`; after each, every key's live grants must conform to GCRA with the
    /// interval and the largest burst ever in force.
    pub(super) fn run(
        sut: &dyn Sut,
        clock: &ManualClock,
        limit: u64,
        burst: u64,
        ops: &[Op],
    ) -> Result<(), String> {
        let mut widest = burst;
        let mut current = burst;
        // (key, proceeds at, cost, what gives it back: None for a unit kept for good)
        let mut live: Vec<(u64, Nanos, u32, Option<Handle>)> = Vec::new();
        for op in ops {
            let now = clock.now();
            let fit = |c: u32| c.min(current as u32);
            match *op {
                Op::Advance(d) => {
                    clock.advance(Duration::from_nanos(d));
                }
                Op::Check { key, cost, behind } => {
                    let at = Nanos::new(now.as_u64().saturating_sub(behind));
                    if sut.charge(key, at, fit(cost)).is_some() {
                        live.push((key, at, fit(cost), None));
                    }
                }
                Op::Charge { key, cost, behind } => {
                    let at = Nanos::new(now.as_u64().saturating_sub(behind));
                    if let Some(h) = sut.charge(key, at, fit(cost)) {
                        live.push((key, at, fit(cost), Some(h)));
                    }
                }
                Op::Book { key, cost } => {
                    if let Some((at, h)) = sut.book(key, now, fit(cost)) {
                        live.push((key, at, fit(cost), Some(h)));
                    }
                }
                Op::Reserve {
                    key,
                    cost,
                    max_delay,
                } => {
                    let max = Duration::from_nanos(max_delay);
                    if let Some((at, h)) = sut.reserve(key, now, fit(cost), max) {
                        live.push((key, at, fit(cost), Some(h)));
                    }
                }
                Op::GiveBack(pick) => {
                    let held: Vec<usize> =
                        (0..live.len()).filter(|&i| live[i].3.is_some()).collect();
                    if !held.is_empty() {
                        let (key, _, _, h) = live.remove(held[pick % held.len()]);
                        if let Some(h) = h {
                            sut.give_back(key, now, h);
                        }
                    }
                }
                Op::SetBurst(b) => {
                    if sut.set_burst(b) {
                        current = b;
                        widest = widest.max(b);
                    }
                }
            }
            let oracle = policy(limit, P, widest);
            for key in 0..2 {
                let grants: Vec<(Nanos, u32)> = live
                    .iter()
                    .filter(|g| g.0 == key)
                    .map(|g| (g.1, g.2))
                    .collect();
                conforms(oracle, &grants).map_err(|e| format!("key {key}: {e}"))?;
            }
        }
        Ok(())
    }

    fn keyed<St: Storage<u64, floodgate::GcraState>>(
        limit: u64,
        burst: u64,
        ops: &[Op],
    ) -> Result<(), String> {
        let clock = ManualClock::new();
        let keyed = KeyedBuilder::new(Gcra::new(policy(limit, P, burst)))
            .clock(clock.clone())
            .shards(1)
            .build_in::<u64, St>()
            .unwrap();
        run(&KeyedSut { keyed }, &clock, limit, burst, ops)
    }

    pub(super) fn every_front_end(limit: u64, burst: u64, ops: &[Op]) -> Result<(), String> {
        let clock = ManualClock::new();
        let shaper = ShaperSut(
            Shaper::with_clock(policy(limit, P, burst), clock.clone()),
            clock,
        );
        run(&shaper, shaper.clock(), limit, burst, ops).map_err(|e| format!("shaper: {e}"))?;
        let direct = DirectSut {
            limiter: RateLimiter::gcra_with_clock(policy(limit, P, burst), ManualClock::new()),
            live: None,
        };
        run(&direct, direct.clock(), limit, burst, ops).map_err(|e| format!("gcra: {e}"))?;
        let live = DirectSut {
            limiter: RateLimiter::with_clock(
                LiveGcra::new(policy(limit, P, burst)),
                ManualClock::new(),
            ),
            live: Some((limit, P)),
        };
        run(&live, live.clock(), limit, burst, ops).map_err(|e| format!("live: {e}"))?;
        keyed::<Heap>(limit, burst, ops).map_err(|e| format!("heap: {e}"))?;
        keyed::<Inline>(limit, burst, ops).map_err(|e| format!("inline: {e}"))?;
        keyed::<Fingerprint>(limit, burst, ops).map_err(|e| format!("fingerprint: {e}"))?;
        Ok(())
    }

    proptest! {
        #![proptest_config(crate::common::cases(1_500))]

        /// Limits 1..=3 per 1 µs (T = 1000, 500 and 334 ns: one rounds up), bursts
        /// up to 5, costs up to 3, up to 40 operations.
        #[test]
        fn live_grants_conform_on_every_front_end(
            limit in 1u64..=3,
            burst in 1u64..=5,
            ops in proptest::collection::vec(op(2), 1..40),
        ) {
            if let Err(e) = every_front_end(limit, burst, &ops) {
                prop_assert!(false, "{}", e);
            }
        }
    }
}

/// A policy raised at runtime between a booking and a refund. Burst 3 (τ = 3 s at 1
/// per second): a charge at 0 books [0, 1 s), a waiter books 3 units at 0 with its
/// slot at 1 s. The burst goes up to 4 (τ = 4 s); the charge is refunded at 0. Judged
/// with the new τ, the waiter's schedule (ending at 4 s) looks as if its slot had come
/// (4 s − τ = 0), so the refund moved the schedule under it, and another booking of 1
/// unit was handed 1 s as well: 5 units at one instant, past even the widest burst
/// ever in force.
#[test]
fn a_raised_burst_never_frees_a_waiters_slot() {
    let live = RateLimiter::with_clock(LiveGcra::new(policy(1, 1_000, 3)), ManualClock::new());
    let t0 = Nanos::ZERO;
    let (d, charge) = live.charge_at(t0, 1);
    assert!(d.is_allowed());
    let (d, delay, _waiter) = live.book_at(t0, 3).unwrap();
    assert!(d.is_allowed());
    let waiter = t0.saturating_add(delay);
    assert_eq!(waiter, Nanos::new(1_000));
    live.algorithm().set_policy(policy(1, 1_000, 4));
    let _ = live.refund(charge);
    let (d, delay, _next) = live.book_at(t0, 2).unwrap();
    assert!(d.is_allowed());
    let next = t0.saturating_add(delay);
    conforms(policy(1, 1_000, 4), &[(waiter, 3), (next, 2)]).unwrap();
}

/// Two cancellations in a row (`Shaper::cancel`, the `x/time/rate` rule). Burst 3 at
/// 1 per µs: 3 units now, then reservations A (3 units, slot 3 µs), B (3, slot 6 µs)
/// and C (1, slot 7 µs). Cancelling B keeps 1 of its units spent (C was reserved
/// after it) and gives 2 back; cancelling A then counts the units reserved after it
/// from the TAT as it is now — 2, B's spent unit and C — and gives 1 back. But B's
/// cancellation had already moved those 2 units down the schedule without moving C's
/// slot: the schedule now ends 3 µs before C's real one, and a new reservation of 3 is
/// handed C's slot, 4 units at 7 µs under a burst of 3. Found by the existing
/// proptest `live_reservations_conform_whatever_is_cancelled` on a new seed (not
/// fab9fcc's rule: no GCRA refund is involved).
#[test]
fn two_cancellations_never_hand_out_a_later_reservations_slot() {
    let policy = policy(1, 1_000, 3);
    let shaper = Shaper::with_clock(policy, ManualClock::new());
    let t0 = Nanos::ZERO;
    let max = Duration::from_micros(10);
    let (d, _now) = shaper.charge_at(t0, 3);
    assert!(d.is_allowed());
    let a = shaper.reserve_at(t0, 3, max).unwrap();
    let b = shaper.reserve_at(t0, 3, max).unwrap();
    let c = shaper.reserve_at(t0, 1, max).unwrap();
    assert_eq!(
        (a.ready_at(), b.ready_at(), c.ready_at()),
        (Nanos::new(3_000), Nanos::new(6_000), Nanos::new(7_000))
    );
    assert_eq!(shaper.cancel_at(t0, b), 2);
    let _ = shaper.cancel_at(t0, a);
    let next = shaper.reserve_at(t0, 3, max).unwrap();
    conforms(policy, &[(t0, 3), (c.ready_at(), 1), (next.ready_at(), 3)]).unwrap();
}

/// The login pattern (charge, refund on success) and a composite's rollback give back
/// the whole charge when nothing booked since waits for a slot, even when other
/// requests (some with earlier readings, as other threads') were admitted between the
/// charge and the refund: afterwards the limiter is exactly as the others alone left
/// it. On every GCRA front end.
#[test]
fn a_refund_past_immediate_admissions_gives_back_the_whole_charge() {
    let s = 1_000_000_000u64;
    let policy = policy(1, s, 5);
    let t = Nanos::new(10 * s);
    let earlier = Nanos::new(10 * s - s / 3);
    // (front end name, remaining after the refund, remaining with the others alone)
    let mut seen = Vec::new();
    {
        let limiter = RateLimiter::gcra_with_clock(policy, ManualClock::new());
        limiter.clock().set(t);
        let twin = RateLimiter::gcra_with_clock(policy, ManualClock::new());
        assert!(twin.check_n_at(earlier, 1).is_allowed());
        assert!(twin.check_n_at(t, 2).is_allowed());
        let (d, receipt) = limiter.charge_at(t, 2);
        assert!(d.is_allowed());
        assert!(limiter.check_n_at(earlier, 1).is_allowed());
        assert!(limiter.check_n_at(t, 2).is_allowed());
        assert!(limiter.refund(receipt));
        seen.push((
            "gcra",
            limiter.peek_at(t, 0).remaining(),
            twin.peek_at(t, 0).remaining(),
        ));
    }
    {
        let clock = ManualClock::new();
        clock.set(t);
        let shaper = Shaper::with_clock(policy, clock);
        let (d, receipt) = shaper.charge_at(t, 2);
        assert!(d.is_allowed());
        assert!(shaper.charge_at(earlier, 1).0.is_allowed());
        assert!(shaper.charge_at(t, 2).0.is_allowed());
        assert!(shaper.refund(receipt));
        seen.push(("shaper", shaper.peek_at(t, 0).remaining(), 2));
    }
    fn keyed<St: Storage<u64, floodgate::GcraState>>(
        policy: Policy,
        t: Nanos,
        earlier: Nanos,
    ) -> u64 {
        let clock = ManualClock::new();
        clock.set(t);
        let keyed = KeyedBuilder::new(Gcra::new(policy))
            .clock(clock)
            .build_in::<u64, St>()
            .unwrap();
        let (d, receipt) = keyed.charge_at(&1, t, 2);
        assert!(d.is_allowed());
        assert!(keyed.check_n_at(&1, earlier, 1).is_allowed());
        assert!(keyed.check_n_at(&1, t, 2).is_allowed());
        assert!(keyed.refund(&1, receipt));
        keyed.peek_at(&1, t, 0).remaining()
    }
    seen.push(("heap", keyed::<Heap>(policy, t, earlier), 2));
    seen.push(("inline", keyed::<Inline>(policy, t, earlier), 2));
    seen.push(("fingerprint", keyed::<Fingerprint>(policy, t, earlier), 2));
    for (name, after, alone) in seen {
        assert_eq!(after, alone, "{name}: the refund kept part of its charge");
    }

    // The composite: a global limit admits, a per-user one denies; the global charge
    // is rolled back whole.
    let clock = ManualClock::new();
    clock.set(t);
    let global = RateLimiter::gcra_with_clock(policy, clock.clone());
    let user = RateLimiter::gcra_with_clock(self::policy(1, s, 1), clock);
    assert!(global.check_n_at(earlier, 2).is_allowed());
    assert!(user.check_n_at(t, 1).is_allowed());
    let before = global.peek_at(t, 0).remaining();
    assert!(!floodgate::check_all(&[&global, &user], 1).is_allowed());
    assert_eq!(global.peek_at(t, 0).remaining(), before);
}

/// Concurrent rollbacks on a busy limit (what `check_all` does under a flood a
/// per-user limit denies): X, C and D are charged in turn, X is refunded (so C's
/// booking moves down by up to T: `shift = T`), another request F is admitted at
/// once, then C is refunded. No booking waits — every unit was admitted at once —
/// yet since fab9fcc C gets nothing back: F's schedule, within `shift` of
/// `now + τ`, may be a waiter's for all the rule can tell. Before fab9fcc the whole
/// unit came back. Never more permissive (no over-admission), but a busy global
/// limit keeps a unit of every such rollback until the clock catches up. Session 45
/// ("order") leaves a refund of the schedule's last booking out of later shifts;
/// X's refund here moved D, booked after X, so it still counts in C's shift, and
/// the cell cannot tell F (booked after X's refund: it moved nowhere) from D.
#[test]
#[ignore = "conservative loss, documented (\"exactly n·T when ... no refund that moved a later booking came between\"); X's refund moved D, and telling F (unmoved) from D needs each booking's place in the word's order, a wider change"]
fn a_rollback_after_another_rollback_gives_back_its_charge() {
    let s = 1_000_000_000u64;
    let clock = ManualClock::new();
    let t = Nanos::new(10 * s);
    clock.set(t);
    let global = RateLimiter::gcra_with_clock(policy(1, s, 3), clock);
    let (_, x) = global.charge_at(t, 1);
    let (_, c) = global.charge_at(t, 1);
    let (d, _kept) = global.charge_at(t, 1);
    assert!(d.is_allowed());
    assert!(global.refund(x));
    assert!(global.check_n_at(t, 1).is_allowed());
    assert!(global.refund(c), "the rollback gave nothing back");
    assert_eq!(global.peek_at(t, 0).remaining(), 1);
}
