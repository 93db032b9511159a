//! loom model of refunds out of their charges' order (session 45, "order"): a
//! refund of the schedule's last booking moves no other booking, so it does not
//! count in the shift of a later refund on the same state — of an earlier booking
//! — which then gives back its whole unit; a refund that moved a later booking
//! still counts (a bound: the cell cannot tell which bookings it moved).
//!
//! Two units X and Y charged in turn on a still clock (burst 3, one a second);
//! X's refund and Y's refund race each other and a third charge K (kept). Every
//! interleaving ends in one of two exact outcomes:
//!
//! * K booked below Y's end, or X's refund first: both refunds give back their
//!   unit and the limiter admits exactly what K alone leaves (2 of 3); one more
//!   would be an over-give, one less the loss this session fixed;
//! * K booked after Y (before both refunds), then Y's refund, then X's: Y's refund
//!   moved K, so it counts in X's shift and X gives back nothing — the conservative
//!   loss still open (1 left; never more than K alone leaves).
//!
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=4 CARGO_TARGET_DIR=target/loom cargo test -p floodgate --release --test loom_refund_order`
#![cfg(loom)]

mod loom_seen;
use loom_seen::Seen;

use std::sync::Arc;

use floodgate::{
    Decision, Fingerprint, Gcra, GcraState, Heap, Inline, KeyedBuilder, KeyedLimiter, ManualClock,
    Nanos, Policy, RateLimiter, Receipt, Storage,
};

/// When every model starts.
const T0: Nanos = Nanos::from_secs(1);

/// One per second, a burst of 3.
fn policy() -> Policy {
    Policy::per_second(1).unwrap().with_burst(3).unwrap()
}

const OUTCOMES: &[&str] = &[
    "Y's refund first, Y still the last booking: both back",
    "X's refund first: both back",
    "K after Y, then Y's refund, then X's: X's unit kept (open)",
];

/// One limit the model runs on: a direct limiter or one key of a keyed table.
trait Limit: Send + Sync + 'static {
    fn charge(&self) -> (Decision, Receipt);
    fn refund(&self, receipt: Receipt) -> bool;
}

impl Limit for RateLimiter<Gcra, ManualClock> {
    fn charge(&self) -> (Decision, Receipt) {
        RateLimiter::charge(self, 1)
    }
    fn refund(&self, receipt: Receipt) -> bool {
        RateLimiter::refund(self, receipt)
    }
}

/// Key 1 of a keyed table; key 2 of the same shard is charged and refunded first
/// (another tag: its refund moves nothing of key 1's).
struct Key<St: Storage<u64, GcraState>>(KeyedLimiter<u64, Gcra, ManualClock, St>);

impl<St: Storage<u64, GcraState> + 'static> Limit for Key<St> {
    fn charge(&self) -> (Decision, Receipt) {
        self.0.charge(&1, 1)
    }
    fn refund(&self, receipt: Receipt) -> bool {
        self.0.refund(&1, receipt)
    }
}

/// Runs the model on the limit `make` builds, fresh each execution.
fn model<L: Limit>(name: &'static str, make: fn() -> L) {
    let seen = Seen::new(OUTCOMES);
    let s = seen.clone();
    loom::model(move || {
        let limit = Arc::new(make());
        let (dx, x) = limit.charge();
        let (dy, y) = limit.charge();
        assert!(dx.is_allowed() && dy.is_allowed());
        // Which refund ran first: each runs under this lock (refunds are serialised
        // by the limiter anyway; K's charge does not take it).
        let order = Arc::new(loom::sync::Mutex::new(Vec::new()));
        let refund = |name: char, receipt| {
            let (limit, order) = (Arc::clone(&limit), Arc::clone(&order));
            loom::thread::spawn(move || {
                let mut order = order.lock().unwrap();
                order.push(name);
                limit.refund(receipt)
            })
        };
        let tx = refund('x', x);
        let ty = refund('y', y);
        let (dk, _kept) = limit.charge();
        assert!(dk.is_allowed(), "the burst holds X, Y and K");
        let (back_x, back_y) = (tx.join().unwrap(), ty.join().unwrap());
        // K booked after Y's end: it saw neither refund (0 left after it).
        let k_after_y = dk.remaining() == 0;
        let y_first = order.lock().unwrap()[0] == 'y';
        let mut left = 0;
        while limit.charge().0.is_allowed() {
            left += 1;
        }
        assert!(back_y, "Y's refund gave nothing back");
        if k_after_y && y_first {
            assert!(
                !back_x,
                "X's refund gave back beside K, which Y's refund moved"
            );
            assert_eq!(left, 1, "X's unit kept, no more");
            s.saw(2);
        } else {
            assert!(back_x, "X's refund gave nothing back");
            assert_eq!(left, 2, "K alone leaves 2 of 3");
            s.saw(if y_first { 0 } else { 1 });
        }
    });
    seen.assert_each(name);
}

#[test]
fn an_earlier_refund_after_the_last_ones_gives_back_its_unit() {
    model("direct", || {
        RateLimiter::gcra_with_clock(policy(), ManualClock::starting_at(T0))
    });
}

fn keyed<St: Storage<u64, GcraState> + 'static>() -> Key<St> {
    let keyed = KeyedBuilder::new(Gcra::new(policy()))
        .capacity(4)
        .shards(1)
        .clock(ManualClock::starting_at(T0))
        .build_in::<u64, St>()
        .unwrap();
    let (d, other) = keyed.charge(&2, 1);
    assert!(d.is_allowed());
    assert!(keyed.refund(&2, other));
    Key(keyed)
}

#[test]
fn keyed_earlier_refund_after_the_last_ones_heap() {
    model("keyed heap", keyed::<Heap>);
}

#[test]
fn keyed_earlier_refund_after_the_last_ones_inline() {
    model("keyed inline", keyed::<Inline>);
}

#[test]
fn keyed_earlier_refund_after_the_last_ones_fingerprint() {
    model("keyed fingerprint", keyed::<Fingerprint>);
}
