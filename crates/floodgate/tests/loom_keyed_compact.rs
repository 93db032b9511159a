//! loom models of the inline storage (keys inline in a 128-bit slot): the heap
//! storage's models (`loom_keyed_models`: insertion racing with lookup,
//! reclamation and eviction racing with a decision, removal and reset racing with a
//! check or a refund), plus a slot emptied and reused
//! by another key while a stale reader still holds the old key's view of it — the
//! reader's CAS must never land on the other key — and a key moved by
//! backward-shift deletion while a reader charges it.
//!
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=4 cargo test -p floodgate --release --test loom_keyed_compact`
#![cfg(loom)]

#[macro_use]
mod loom_keyed_models;
mod loom_seen;

use loom_seen::{Seen, Span, PLACEMENTS};

use std::sync::Arc;

use floodgate::{Gcra, Inline, KeyedBuilder, KeyedLimiter, ManualClock, Nanos, Policy};
use loom_keyed_models::Keyed as _;

type Compact = KeyedLimiter<u64, Gcra, ManualClock, Inline>;

shared_keyed_models!(Compact, Inline);

/// The home slot of `key` in a one-shard inline table of `slots` slots under loom.
fn home(key: u64, slots: u64) -> u64 {
    loom_keyed_models::home::<Inline>(key, slots)
}

#[test]
fn a_reused_slot_never_applies_one_keys_cas_to_another() {
    // Capacity 1: two slots. Key A is charged at 1 s (state: TAT 2 s). A reader
    // decides on A at 2 s lock-free: it reads the slot (A, 2 s) and CASes it to
    // (A, 3 s). Meanwhile key B arrives stamped 1 s: the table is full of a live key,
    // so A is evicted and B takes the same slot with exactly the state A had
    // (TAT 2 s). A reader that compared only the state word would now charge B.
    const A: u64 = 1;
    let b = (2..).find(|&k| home(k, 2) == home(A, 2)).unwrap();
    let seen = Seen::new(&["A decided before B evicted it", "A came back, B reclaimed"]);
    let s = seen.clone();
    loom::model(move || {
        let clock = ManualClock::starting_at(Nanos::from_secs(1));
        let keyed = Arc::new(Compact::build(1, &clock));
        assert!(keyed.check_n_at(&A, Nanos::from_secs(1), 1).is_allowed());
        let other = Arc::clone(&keyed);
        let t =
            loom::thread::spawn(move || other.check_n_at(&A, Nanos::from_secs(2), 1).is_allowed());
        assert!(keyed.check_n_at(&b, Nanos::from_secs(1), 1).is_allowed());
        assert!(t.join().unwrap(), "A is due at 2 s in every order");
        // B was charged once, at 1 s: at 2 s it admits again (TAT 2 s), or it was
        // reclaimed as idle when A came back (which is lossless). A stale CAS of A's
        // decision would have left B at TAT 3 s: denied here.
        assert!(keyed.peek_at(&b, Nanos::from_secs(2), 1).is_allowed());
        // A is evicted once in every order (before or after its charge).
        let m = keyed.metrics();
        assert_eq!(m.evicted, 1);
        s.saw_if(m.reclaimed > 0, 1, 0);
    });
    seen.assert_each("a_reused_slot_never_applies_one_keys_cas_to_another");
}

#[test]
fn a_key_moved_by_backward_shift_keeps_every_charge() {
    // Two keys with the same home in a three-slot table: the second sits behind the
    // first, and removing the first shifts it back while a reader charges it
    // lock-free. The charge must land in the key's state wherever it ends up.
    let two = (2..).find(|&k| home(k, 3) == home(1, 3)).unwrap();
    // The losing schedule needs three preemptions (the reader finds the key, the
    // writer copies it, the reader charges the old slot, the writer retires it):
    // this small model is explored with at least that bound whatever
    // LOOM_MAX_PREEMPTIONS says (CI's 4 is more).
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(model.preemption_bound.map_or(3, |b| b.max(3)));
    let seen = Seen::new(PLACEMENTS);
    let s = seen.clone();
    model.check(move || {
        let clock = ManualClock::starting_at(Nanos::from_secs(1));
        let gcra = Gcra::new(Policy::per_second(1).unwrap().with_burst(2).unwrap());
        let keyed: Arc<Compact> = Arc::new(
            KeyedBuilder::new(gcra)
                .capacity(2)
                .shards(1)
                .clock(clock.clone())
                .build_inline()
                .unwrap(),
        );
        // Key 1 charged at 0 s (idle by 1 s), `two` charged at 1 s.
        assert!(keyed.check_n_at(&1, Nanos::new(0), 1).is_allowed());
        assert!(keyed.check_n_at(&two, Nanos::from_secs(1), 1).is_allowed());
        let other = Arc::clone(&keyed);
        let span = Arc::new(Span::default());
        let marks = Arc::clone(&span);
        let t = loom::thread::spawn(move || {
            let before = marks.mark();
            let allowed = other.check_n_at(&two, Nanos::from_secs(1), 1).is_allowed();
            (allowed, Span::placement(before, marks.mark()))
        });
        // Reclaims key 1 (idle), shifting whatever follows it.
        span.begin();
        let reclaimed = keyed.reclaim_idle();
        span.end();
        let (allowed, placement) = t.join().unwrap();
        assert!(allowed, "burst 2: the second charge admits");
        s.saw(placement);
        assert_eq!(reclaimed, 1);
        // Both charges of `two` stand: a third is denied at 1 s.
        assert!(!keyed.peek_at(&two, Nanos::from_secs(1), 1).is_allowed());
        assert_eq!(keyed.metrics().live_keys, 1);
    });
    seen.assert_each("a_key_moved_by_backward_shift_keeps_every_charge");
}

#[test]
fn a_refund_racing_with_slot_reuse_never_lands_on_another_key() {
    // Capacity 1: two slots. Key A is charged at 1 s (TAT 2 s) and its receipt is
    // refunded while key B, stamped 1 s, evicts A and takes A's slot with the very
    // state A had. The refund's CAS compares the key half (and the receipt is void
    // once the shard removed a key): it gives A's unit back or nothing, never B's.
    const A: u64 = 1;
    let b = (2..).find(|&k| home(k, 2) == home(A, 2)).unwrap();
    let seen = Seen::new(&[
        "refund after the eviction (nothing back)",
        "refund before it",
    ]);
    let s = seen.clone();
    loom::model(move || {
        let clock = ManualClock::starting_at(Nanos::from_secs(1));
        let keyed = Arc::new(Compact::build(1, &clock));
        let (charged, receipt) = keyed.charge_at(&A, Nanos::from_secs(1), 1);
        assert!(charged.is_allowed());
        let other = Arc::clone(&keyed);
        let t = loom::thread::spawn(move || other.refund(&A, receipt));
        let b_first = keyed.check_n_at(&b, Nanos::from_secs(1), 1).is_allowed();
        let refunded = t.join().unwrap();
        assert!(b_first);
        // B holds its own charge in every order: a refund that landed on B would
        // leave it fresh, admitting again at 1 s.
        assert!(!keyed.peek_at(&b, Nanos::from_secs(1), 1).is_allowed());
        // A refund that went through ran before the eviction: A was idle then, so B's
        // insert reclaimed it instead of evicting it.
        let m = keyed.metrics();
        assert_eq!(m.reclaimed + m.evicted, 1);
        assert!(!refunded || m.reclaimed == 1);
        s.saw(usize::from(refunded));
    });
    seen.assert_each("a_refund_racing_with_slot_reuse_never_lands_on_another_key");
}
