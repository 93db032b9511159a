//! Refunds out of their charges' order (session 45, "order"): a refund of the
//! booking at the end of the schedule moves no other booking, so it does not count
//! in the shift of a later refund — of an earlier booking — on the same state.
//! Before, every refund since a charge's note counted: an earlier charge refunded
//! after a later one gave back nothing, and queued reservations cancelled from the
//! last to the first kept all their slots but the last.
//!
//! Every test compares with what the admissions kept alone leave (never more
//! permissive) and asserts the exact count given back.

use std::time::Duration;

use floodgate::{
    Fingerprint, Gcra, GcraState, Heap, Inline, KeyedBuilder, KeyedLimiter, ManualClock, Nanos,
    Policy, RateLimiter, Shaper, Storage,
};

const S: u64 = 1_000_000_000;

/// `per` units a second, burst `burst`.
fn policy(per: u64, burst: u64) -> Policy {
    Policy::per_second(per).unwrap().with_burst(burst).unwrap()
}

/// How many units of one `check` admits now, one after another.
fn drain(mut check: impl FnMut() -> bool) -> u64 {
    let mut n = 0;
    while check() {
        n += 1;
        assert!(n <= 1_000, "admits without end");
    }
    n
}

/// Two units charged at once (burst 3), the later refunded first: both come back,
/// on the direct limiter, its mutex twin and the shaper's immediate charges.
///
/// Mutation seen failing: the refund that moved nobody recorded like any other
/// (`settle_total` recording whatever `refund_moves_later` says; since session 46 also
/// each cell alone: `AtomicCell::refund` or `LockedCell::refund` passing `true` for the
/// flag): 2 left, not 3.
#[test]
fn two_charges_refunded_last_first_give_back_both() {
    let t = Nanos::new(10 * S);
    let direct = RateLimiter::gcra_with_clock(policy(1, 3), ManualClock::starting_at(t));
    let twin = RateLimiter::locked_with_clock(Gcra::new(policy(1, 3)), ManualClock::starting_at(t));
    for (name, limiter) in [("direct", &direct as &dyn Charges), ("mutex twin", &twin)] {
        let (a, b) = (limiter.take(), limiter.take());
        assert!(limiter.give(b), "{name}: the later charge's refund");
        assert!(
            limiter.give(a),
            "{name}: the earlier charge's refund gave nothing back"
        );
        assert_eq!(limiter.left(), 3, "{name}: every unit back, no more");
    }
    let shaper = Shaper::with_clock(policy(1, 3), ManualClock::starting_at(t));
    let (da, a) = shaper.charge(1);
    let (db, b) = shaper.charge(1);
    assert!(da.is_allowed() && db.is_allowed());
    assert!(shaper.refund(b));
    assert!(
        shaper.refund(a),
        "shaper: the earlier charge's refund gave nothing back"
    );
    assert_eq!(drain(|| shaper.charge(1).0.is_allowed()), 3);
}

/// What the direct limiter and its twin share here.
trait Charges {
    fn take(&self) -> floodgate::Receipt;
    fn give(&self, receipt: floodgate::Receipt) -> bool;
    fn left(&self) -> u64;
}

impl<S: floodgate::StateCell<GcraState>> Charges for RateLimiter<Gcra, ManualClock, S> {
    fn take(&self) -> floodgate::Receipt {
        let (d, r) = self.charge(1);
        assert!(d.is_allowed());
        r
    }
    fn give(&self, receipt: floodgate::Receipt) -> bool {
        self.refund(receipt)
    }
    fn left(&self) -> u64 {
        drain(|| self.check().is_allowed())
    }
}

/// A held slot then `n` queued reservations (one a second, burst 1, reserving up
/// to an hour ahead), all cancelled from the last to the first: every waiter's slot
/// comes back, the held one stays (the next reservation waits one slot).
///
/// Mutation seen failing: `Gcra::refund_moves_later`/`CancelRule::refund_moves_later`
/// always `true` (the rule before): only the last waiter's slot came back.
#[test]
fn queued_reservations_cancelled_last_first_give_back_every_slot() {
    let n = 24;
    let shaper = Shaper::with_clock(policy(1, 1), ManualClock::starting_at(Nanos::new(10 * S)));
    let hour = Duration::from_secs(3600);
    assert!(shaper.charge(1).0.is_allowed(), "the held slot");
    let waiting: Vec<_> = (0..n).map(|_| shaper.reserve(1, hour).unwrap()).collect();
    for (i, r) in waiting.iter().enumerate() {
        assert_eq!(r.ready_at(), Nanos::new((11 + i as u64) * S));
    }
    for r in waiting.into_iter().rev() {
        assert_eq!(shaper.cancel(r), 1, "a waiter's slot did not come back");
    }
    let next = shaper.reserve(1, hour).unwrap();
    assert_eq!(
        next.ready_at(),
        Nanos::new(11 * S),
        "only the held slot is taken"
    );
}

/// The same on a keyed queue (`KeyedLimiter::reserve` and its receipt's refund),
/// every storage, with another key of the shard queued and cancelled in between
/// (its refunds are another key's: they move nothing of this key's).
fn keyed_queue<St: Storage<u64, GcraState>>() {
    let n = 12;
    let t = Nanos::new(10 * S);
    let keyed: KeyedLimiter<u64, Gcra, ManualClock, St> =
        KeyedBuilder::new(Gcra::new(policy(1, 1)))
            .shards(1)
            .clock(ManualClock::starting_at(t))
            .build_in::<u64, St>()
            .unwrap();
    let hour = Duration::from_secs(3600);
    let (q, other) = (7u64, 8u64);
    assert!(keyed.check(&q).is_allowed(), "the held slot");
    let mut waiting = Vec::new();
    for i in 0..n {
        let (_, delay, receipt) = keyed.reserve(&q, 1, hour).unwrap();
        assert_eq!(delay, Duration::from_secs(1 + i));
        let (_, _, theirs) = keyed.reserve(&other, 1, hour).unwrap();
        waiting.push((receipt, theirs));
    }
    for (receipt, theirs) in waiting.into_iter().rev() {
        assert!(keyed.refund(&other, theirs), "the other key's last waiter");
        assert!(
            keyed.refund(&q, receipt),
            "a waiter's slot did not come back"
        );
    }
    let (_, delay, _) = keyed.reserve(&q, 1, hour).unwrap();
    assert_eq!(delay, Duration::from_secs(1), "only the held slot is taken");
    let (_, delay, _) = keyed.reserve(&other, 1, hour).unwrap();
    assert_eq!(delay, Duration::ZERO, "every other-key slot came back");
}

/// Mutation seen failing: as the shaper's (the keyed refund's moved-nobody flag
/// ignored): 11 slots held, not 1.
#[test]
fn keyed_queue_cancelled_last_first_gives_back_every_slot() {
    keyed_queue::<Heap>();
    keyed_queue::<Inline>();
    keyed_queue::<Fingerprint>();
}

/// Refunds of two keys of one shard interleaved, out of order, with the clock
/// moving: each key ends exactly as its kept admissions alone leave it, never more
/// permissive (every storage).
fn interleaved<St: Storage<u64, GcraState>>() {
    let t = Nanos::new(10 * S);
    let clock = ManualClock::starting_at(t);
    let keyed: KeyedLimiter<u64, Gcra, ManualClock, St> =
        KeyedBuilder::new(Gcra::new(policy(1, 4)))
            .shards(1)
            .clock(clock.clone())
            .build_in::<u64, St>()
            .unwrap();
    let (a, b) = (1u64, 2u64);
    let charge = |k: u64| {
        let (d, r) = keyed.charge(&k, 1);
        assert!(d.is_allowed());
        r
    };
    let (a1, b1, a2, b2, a3) = (charge(a), charge(b), charge(a), charge(b), charge(a));
    // a: [10, 11), [11, 12), [12, 13); b: [10, 11), [11, 12).
    assert!(keyed.refund(&a, a3), "a's last");
    assert!(keyed.refund(&b, b1), "b's first: moves b2, not a's");
    assert!(keyed.refund(&a, a1), "a's first, after a's last");
    clock.set(Nanos::new(10 * S + S / 2));
    assert!(keyed.refund(&b, b2), "b's second, half passed: half of it");
    // a kept a2 (admitted at 10 s, now [10 s, 11 s)): 3 left at 10.5 s.
    assert_eq!(drain(|| keyed.check(&a).is_allowed()), 3);
    // b kept nothing: b2's booking, moved to [10 s, 11 s) by b1's refund, half
    // passed, its other half given back: 4 at 10.5 s (the burst).
    assert_eq!(drain(|| keyed.check(&b).is_allowed()), 4);
    let _ = a2;
}

/// Mutation seen failing: the tag compare in `RecentRefunds::shift` dropped (b's
/// first refund counted in a's first's shift): a's first refund gave nothing.
#[test]
fn interleaved_refunds_of_two_keys_stay_exact() {
    interleaved::<Heap>();
    interleaved::<Inline>();
    interleaved::<Fingerprint>();
}
