//! loom models of the per-key hot-key mode: a promotion or a demotion racing checks
//! of the key never admits more than the key's schedule holds (the seal takes the
//! schedule with one CAS; the demotion closes the central word before it unseals),
//! and a check that meets a step half-way waits for it rather than spending units
//! that are not there.
//!
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=4 cargo test -p floodgate --release --test loom_hot`
#![cfg(loom)]

use std::sync::Arc;

use floodgate::{HotKeyLimiter, HotKeys, KeyedBuilder, ManualClock, Nanos, Policy};

/// Burst 2 at 1/s, the clock standing still: two units in all, whatever the mode.
fn limiter() -> HotKeyLimiter<u64, ManualClock> {
    HotKeyLimiter::new(
        Policy::per_second(1)
            .and_then(|p| p.with_burst(2))
            .expect("valid policy"),
        KeyedBuilder::default()
            .capacity(64)
            .shards(1)
            .clock(ManualClock::starting_at(Nanos::from_secs(10))),
        HotKeys::default().manual().lease_shards(1).lease_size(1),
    )
    .expect("valid configuration")
}

#[test]
fn a_promotion_racing_checks_never_admits_beyond_the_schedule() {
    loom::model(|| {
        let limiter = Arc::new(limiter());
        let mut admitted = u32::from(limiter.check(&1).is_allowed());
        let promoter = {
            let limiter = Arc::clone(&limiter);
            loom::thread::spawn(move || assert!(limiter.promote(&1)))
        };
        admitted += u32::from(limiter.check(&1).is_allowed());
        admitted += u32::from(limiter.check(&1).is_allowed());
        promoter.join().unwrap();
        assert!(admitted <= 2, "admitted {admitted}");
        assert!(!limiter.check(&1).is_allowed() || admitted < 2);
    });
}

#[test]
fn a_demotion_racing_checks_never_admits_beyond_the_schedule() {
    loom::model(|| {
        let limiter = Arc::new(limiter());
        assert!(limiter.promote(&1));
        let mut admitted = u32::from(limiter.check(&1).is_allowed());
        let demoter = {
            let limiter = Arc::clone(&limiter);
            loom::thread::spawn(move || assert!(limiter.demote(&1)))
        };
        admitted += u32::from(limiter.check(&1).is_allowed());
        admitted += u32::from(limiter.check(&1).is_allowed());
        demoter.join().unwrap();
        assert!(admitted <= 2, "admitted {admitted}");
        // Cold again: the table holds every unit the leases took.
        assert!(!limiter.is_hot(&1));
        assert!(limiter.peek(&1, 0).remaining() <= u64::from(2 - admitted));
    });
}
