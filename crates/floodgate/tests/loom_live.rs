//! loom model of `LiveGcra`'s policy change: a `set_policy` racing a decision never
//! lets the decision see a mix of the two policies' words (the sequence lock), and a
//! change racing a charge keeps the charge on the state it wrote.
//!
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=4 cargo test -p floodgate --release --test loom_live`
#![cfg(loom)]

mod loom_seen;
use loom_seen::Seen;

use std::sync::Arc;
use std::time::Duration;

use floodgate::{Algorithm, GcraState, LiveGcra, ManualClock, Nanos, Policy, RateLimiter};

fn policy(limit: u64, burst: u64) -> Policy {
    Policy::per_second(limit)
        .and_then(|p| p.with_burst(burst))
        .expect("valid policy")
}

/// On a fresh state, `(limit, reset_after)` is (1, 1 s) under one policy and
/// (10, 100 ms) under the other; any mix of their words reports neither.
#[test]
fn a_change_racing_a_decision_shows_one_whole_policy() {
    let seen = Seen::new(&["old policy", "new policy"]);
    let s = seen.clone();
    loom::model(move || {
        let live = Arc::new(LiveGcra::new(policy(1, 1)));
        let writer = {
            let live = Arc::clone(&live);
            loom::thread::spawn(move || live.set_policy(policy(10, 10)))
        };
        let (d, _) = live.decide(GcraState::default(), Nanos::from_secs(5), 1);
        let seen = (d.limit(), d.reset_after());
        assert!(
            seen == (1, Duration::from_secs(1)) || seen == (10, Duration::from_millis(100)),
            "{seen:?}"
        );
        writer.join().unwrap();
        assert_eq!(live.policy(), policy(10, 10));
        s.saw_if(seen.0 == 10, 1, 0);
    });
    seen.assert_each("a_change_racing_a_decision_shows_one_whole_policy");
}

/// Two changes racing: the last one to take the update lock wins, whole.
#[test]
fn racing_changes_leave_one_of_them_whole() {
    let seen = Seen::new(&["the main thread's change won", "the spawned thread's won"]);
    let s = seen.clone();
    loom::model(move || {
        let live = Arc::new(LiveGcra::new(policy(1, 1)));
        let other = {
            let live = Arc::clone(&live);
            loom::thread::spawn(move || live.set_policy(policy(10, 10)))
        };
        live.set_policy(policy(5, 2));
        other.join().unwrap();
        let now = live.policy();
        assert!(now == policy(10, 10) || now == policy(5, 2), "{now:?}");
        s.saw_if(now == policy(10, 10), 1, 0);
    });
    seen.assert_each("racing_changes_leave_one_of_them_whole");
}

/// A check racing a change admits under one policy or the other: with burst 1 at
/// 1/s before and burst 2 after, two checks at one instant admit 1 or 2, never more.
#[test]
fn checks_racing_a_change_admit_within_the_larger_policy() {
    let seen = Seen::new(&["one admitted (change late)", "two admitted (change first)"]);
    let s = seen.clone();
    loom::model(move || {
        let limiter = Arc::new(RateLimiter::with_clock(
            LiveGcra::new(policy(1, 1)),
            ManualClock::starting_at(Nanos::from_secs(5)),
        ));
        let writer = {
            let limiter = Arc::clone(&limiter);
            loom::thread::spawn(move || limiter.algorithm().set_policy(policy(1, 2)))
        };
        let a = limiter.check().is_allowed();
        let b = limiter.check().is_allowed();
        writer.join().unwrap();
        // A fresh state admits under both; the second only if the change came first.
        let admitted = u64::from(a) + u64::from(b);
        assert!(a && admitted <= 2);
        // The state holds exactly what was admitted: under the new burst of 2,
        // another unit fits now if and only if one was left.
        assert_eq!(limiter.check().is_allowed(), admitted < 2);
        s.saw(admitted as usize - 1);
    });
    seen.assert_each("checks_racing_a_change_admit_within_the_larger_policy");
}
