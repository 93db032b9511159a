//! The sliding log against its exact model (a plain `Vec` of timestamps) on random
//! traces, against the textbook `Vec` + `retain` log where they coincide, and under
//! threads with a frozen clock.
#![cfg(not(loom))]

use floodgate::reference::{ExactSlidingLog, TextbookSlidingLog};
use floodgate::{ManualClock, Nanos, Policy, SlidingLog};
use proptest::prelude::*;

mod common;
use common::{advance, op, Op};
use std::time::Duration;

fn case() -> impl Strategy<Value = (u64, u64, u64, Vec<Op>)> {
    let period = prop_oneof![Just(1u64), Just(10), Just(1_000), Just(1_000_000_007)];
    (period, 1u64..=30).prop_flat_map(|(p, l)| {
        let l = l.min(p);
        (
            Just(p),
            Just(l),
            prop_oneof![Just(0u64), 0u64..1 << 62, (u64::MAX - (1 << 40))..=u64::MAX],
            proptest::collection::vec(op(p, l, 1000 * p), 1..80),
        )
    })
}

proptest! {
    #![proptest_config(crate::common::cases(300))]

    #[test]
    fn log_and_model_agree((period, limit, start, ops) in case()) {
        let policy = Policy::new(limit, Duration::from_nanos(period)).unwrap();
        let log = SlidingLog::with_clock(policy, ManualClock::new());
        let mut model = ExactSlidingLog::new(limit, period).unwrap();
        let mut now = start;
        for (i, o) in ops.iter().enumerate() {
            now = advance(now, o.step);
            let t = Nanos::new(now);
            let (ours, theirs) = if o.peek {
                (log.peek_at(t, o.cost), model.peek(now, o.cost))
            } else {
                (log.check_n_at(t, o.cost), model.check(now, o.cost))
            };
            prop_assert_eq!(ours, theirs, "step {} at {}: {:?}", i, now, o);
            prop_assert!(log.entries() as u64 <= limit);
            prop_assert_eq!(log.is_idle(t), model.peek(now, 0).remaining() == limit
                && model.peek(now, 0).reset_after_nanos() == 0);
        }
    }

    /// For single units and readings that never go back, the textbook log is exact too.
    #[test]
    fn textbook_log_agrees_for_single_units(
        limit in 1usize..20,
        steps in proptest::collection::vec(0u64..400, 1..200),
    ) {
        let period = 1000;
        let log = SlidingLog::with_clock(
            Policy::new(limit as u64, Duration::from_nanos(period)).unwrap(),
            ManualClock::new(),
        );
        let mut textbook = TextbookSlidingLog::new(limit, period);
        let mut now = 0;
        for step in steps {
            now += step;
            prop_assert_eq!(
                log.check_n_at(Nanos::new(now), 1).is_allowed(),
                textbook.allow(now),
                "at {}", now
            );
        }
    }
}

#[test]
fn threads_under_a_frozen_clock_admit_exactly_the_limit() {
    for limit in [1, 7, 100] {
        let clock = ManualClock::starting_at(Nanos::from_secs(1_700_000_000));
        let log = SlidingLog::with_clock(Policy::per_minute(limit).unwrap(), clock);
        let admitted: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..300).filter(|_| log.check().is_allowed()).count() as u64))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(admitted, limit);
        assert_eq!(log.peek(0).remaining(), 0);
        assert!(log.entries() as u64 <= limit);
    }
}
