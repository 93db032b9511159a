//! loom model of the shaper: racing reservations get distinct slots in a sequential
//! order, and a racing cancellation refunds what the exact model says; the receipt
//! of a reservation granted with no delay (`Reservation::into_receipt`), refunded
//! while another reservation races it, gives back only what one of the two orders
//! would.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=4 cargo test -p floodgate --release --test loom_shaping`
#![cfg(loom)]

mod linearize;
mod loom_seen;

use loom_seen::Seen;

use floodgate::reference::ExactShaper;
use floodgate::{ManualClock, Nanos, Policy, Shaper};
use linearize::some_order_matches;
use loom::sync::Arc;
use loom::thread;
use std::time::Duration;

const T: u64 = 100;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Reserve,
    CancelFirst,
}

#[test]
fn reservations_and_a_cancel_race() {
    let seen = Seen::new(&["cancel refused", "cancel freed the slot"]);
    let s = seen.clone();
    loom::model(move || {
        let policy = Policy::new(1, Duration::from_nanos(T)).unwrap();
        let shaper = Arc::new(Shaper::with_clock(policy, ManualClock::new()));
        let max = Duration::from_nanos(10 * T);
        // Booked before the race: now, then T (its slot is still ahead at 0).
        let _ = shaper.reserve_at(Nanos::ZERO, 1, max).unwrap();
        let first = shaper.reserve_at(Nanos::ZERO, 1, max).unwrap();
        let mut model = ExactShaper::new(1, T, 1).unwrap();
        let _ = model.reserve(0, 1, 10 * T).unwrap();
        let model_first = model.reserve(0, 1, 10 * T).unwrap();

        let a = {
            let s = Arc::clone(&shaper);
            thread::spawn(move || {
                s.reserve_at(Nanos::ZERO, 1, max)
                    .map(|r| r.ready_at().as_u64())
                    .ok()
            })
        };
        let b = {
            let s = Arc::clone(&shaper);
            thread::spawn(move || {
                s.reserve_at(Nanos::ZERO, 1, max)
                    .map(|r| r.ready_at().as_u64())
                    .ok()
            })
        };
        let c = {
            let s = Arc::clone(&shaper);
            thread::spawn(move || Some(u64::from(s.cancel_at(Nanos::ZERO, first))))
        };
        let observed = [a.join().unwrap(), b.join().unwrap(), c.join().unwrap()];
        // Two reservations never share a slot.
        assert_ne!(observed[0], observed[1]);
        let ops = [Op::Reserve, Op::Reserve, Op::CancelFirst];
        assert!(
            some_order_matches(&model, &ops, &observed, |m, op| match op {
                Op::Reserve => m.reserve(0, 1, 10 * T).ok().map(|s| s.ready_at),
                Op::CancelFirst => Some(m.cancel(0, model_first)),
            }),
            "{observed:?}"
        );
        s.saw(observed[2].unwrap() as usize);
    });
    seen.assert_each("reservations_and_a_cancel_race");
}

/// A free slot reserved and converted to its receipt, then refunded while another
/// request reserves: in either order the two agree with a sequential run — refund
/// first: the slot comes back and the reservation takes it now (0); reservation
/// first: it books the next slot (`T`), which then waits after the receipt's
/// booking, so GCRA's refund rule gives nothing back. Never both (a refund under a
/// booked slot would hand the same instants out twice), and the schedule ends where
/// the sequential order leaves it.
#[test]
fn an_immediate_reservations_receipt_races_a_reservation() {
    let seen = Seen::new(&["refund first", "reservation first"]);
    let s = seen.clone();
    loom::model(move || {
        let policy = Policy::new(1, Duration::from_nanos(T)).unwrap();
        let shaper = Arc::new(Shaper::with_clock(policy, ManualClock::new()));
        let max = Duration::from_nanos(10 * T);
        let receipt = shaper
            .reserve_at(Nanos::ZERO, 1, max)
            .unwrap()
            .into_receipt()
            .unwrap();
        let refund = {
            let s = Arc::clone(&shaper);
            thread::spawn(move || s.refund(receipt))
        };
        let reserve = {
            let s = Arc::clone(&shaper);
            thread::spawn(move || {
                s.reserve_at(Nanos::ZERO, 1, max)
                    .map(|r| r.ready_at().as_u64())
                    .ok()
            })
        };
        let observed = (refund.join().unwrap(), reserve.join().unwrap());
        let tat = shaper.state().tat().as_u64();
        match observed {
            (true, Some(0)) => assert_eq!(tat, T),
            (false, Some(slot)) if slot == T => assert_eq!(tat, 2 * T),
            other => panic!("no sequential order gives {other:?} (TAT {tat})"),
        }
        s.saw(usize::from(!observed.0));
    });
    seen.assert_each("an_immediate_reservations_receipt_races_a_reservation");
}
