//! loom model of the sliding log: racing checks are linearizable against the plain
//! `Vec` model and the ring never holds more than the limit.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=4 cargo test -p floodgate --release --test loom_sliding_log`
#![cfg(loom)]

mod linearize;
mod loom_seen;

use loom_seen::Seen;

use floodgate::reference::ExactSlidingLog;
use floodgate::{Decision, ManualClock, Nanos, Policy, SlidingLog};
use linearize::some_order_matches;
use loom::sync::Arc;
use loom::thread;
use std::time::Duration;

/// The race: one unit each at 50, 110 (the unit logged at 10 expired) and 60.
const OPS: [(u64, u32); 3] = [(50, 1), (110, 1), (60, 1)];

#[test]
fn three_threads_race_on_a_log_of_two() {
    // Which of the checks at 50, 110 and 60 were admitted, as bits (1: admitted).
    let seen = Seen::new(&["000", "001", "010", "011", "100", "101", "110", "111"]);
    let s = seen.clone();
    loom::model(move || {
        let log = Arc::new(SlidingLog::with_clock(
            Policy::new(2, Duration::from_nanos(100)).unwrap(),
            ManualClock::new(),
        ));
        // One unit already logged at 10; the race at 50, 110 (it expired) and 60.
        assert!(log.check_n_at(Nanos::new(10), 1).is_allowed());
        let ops = OPS;
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
        s.saw(
            decisions
                .iter()
                .fold(0, |acc, d| acc * 2 + usize::from(d.is_allowed())),
        );
    });
    // The admission patterns some sequential order gives: each must have been seen.
    let mut wanted = Vec::new();
    for order in [
        [0, 1, 2],
        [0, 2, 1],
        [1, 0, 2],
        [1, 2, 0],
        [2, 0, 1],
        [2, 1, 0],
    ] {
        let mut model = ExactSlidingLog::new(2, 100).unwrap();
        let _ = model.check(10, 1);
        let mut allowed = [false; 3];
        for i in order {
            allowed[i] = model.check(OPS[i].0, OPS[i].1).is_allowed();
        }
        wanted.push(allowed.iter().fold(0, |acc, &a| acc * 2 + usize::from(a)));
    }
    wanted.sort_unstable();
    wanted.dedup();
    seen.assert_each_of("three_threads_race_on_a_log_of_two", &wanted);
}
