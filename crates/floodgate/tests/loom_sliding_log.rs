//! loom model of the sliding log: racing checks are linearizable against the plain
//! `Vec` model and the ring never holds more than the limit.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=4 cargo test -p floodgate --release --test loom_sliding_log`
#![cfg(loom)]

mod linearize;

use floodgate::reference::ExactSlidingLog;
use floodgate::{Decision, ManualClock, Nanos, Policy, SlidingLog};
use linearize::some_order_matches;
use loom::sync::Arc;
use loom::thread;
use std::time::Duration;

#[test]
fn three_threads_race_on_a_log_of_two() {
    loom::model(|| {
        let log = Arc::new(SlidingLog::with_clock(
            Policy::new(2, Duration::from_nanos(100)).unwrap(),
            ManualClock::new(),
        ));
        // One unit already logged at 10; the race at 50, 110 (it expired) and 60.
        assert!(log.check_n_at(Nanos::new(10), 1).is_allowed());
        let ops = [(50, 1), (110, 1), (60, 1)];
        let handles: Vec<_> = ops
            .iter()
            .map(|&(now, cost)| {
                let log = Arc::clone(&log);
                thread::spawn(move || log.check_n_at(Nanos::new(now), cost))
            })
            .collect();
        let decisions: Vec<Decision> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(log.entries() <= 2);
        let mut model = ExactSlidingLog::new(2, 100).unwrap();
        let _ = model.check(10, 1);
        assert!(some_order_matches(
            &model,
            &ops,
            &decisions,
            |m, &(t, n)| m.check(t, n)
        ));
    });
}
