//! "Never admit beyond a limit": the review's over-admissions, each as a test that
//! failed before its fix — composite refunds that gave back another request's units,
//! reclamation judged at a later reading than a decision, eviction that forgave heavy
//! window users — and the charge-first login pattern under parallel guesses. Every
//! keyed case runs on every storage (`Heap`, `Inline`, `Fingerprint`).
#![cfg(not(loom))]

#[macro_use]
mod common;

use floodgate::keyed::composite::check_all;
use floodgate::{
    Algorithm, Clock, FixedWindow, Gcra, KeyedBuilder, KeyedLimiter, ManualClock, Nanos, Policy,
    RateLimiter, Shaper, SlidingLog, SlidingWindow, Storage,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

/// A second limit that denies every request for the whole test.
fn exhausted(clock: &ManualClock) -> RateLimiter<Gcra, ManualClock> {
    let daily = Policy::new(1, Duration::from_secs(86_400 * 365)).unwrap();
    let limiter = RateLimiter::gcra_with_clock(daily, clock.clone());
    assert!(limiter.check().is_allowed());
    limiter
}

#[test]
fn a_window_refund_never_takes_a_later_windows_unit() {
    // 3 per second. A composite charges window 0 and is denied by the second limit;
    // before its refund lands, another request opens window 1. The refund must give
    // back nothing there: window 1 then admits exactly 3.
    let clock = ManualClock::starting_at(Nanos::new(S - 1));
    let fw = FixedWindow::new(Policy::per_second(3).unwrap()).unwrap();
    let window = RateLimiter::with_clock(fw, clock.clone());
    let (charged, receipt) = window.charge(1);
    assert!(charged.is_allowed());
    clock.advance(Duration::from_nanos(1));
    assert!(window.check().is_allowed()); // window 1: 1 of 3
    assert!(!window.refund(receipt));
    let admitted = 1 + (0..5).filter(|_| window.check().is_allowed()).count();
    assert_eq!(admitted, 3);

    // The same through check_all, keyed and direct, for both window algorithms.
    let sw = SlidingWindow::new(Policy::per_second(3).unwrap()).unwrap();
    let sliding = RateLimiter::with_clock(sw, clock.clone());
    let keyed = KeyedBuilder::new(fw)
        .clock(clock.clone())
        .build::<u64>()
        .unwrap();
    clock.set(Nanos::new(10 * S - 1));
    let strict = exhausted(&clock);
    assert!(!check_all(&[&sliding, &keyed.limit(&7), &strict], 1).is_allowed());
    clock.set(Nanos::new(12 * S));
    for _ in 0..3 {
        assert!(sliding.check().is_allowed());
        assert!(keyed.check(&7).is_allowed());
    }
    assert!(!sliding.check().is_allowed());
    assert!(!keyed.check(&7).is_allowed());
}

#[test]
fn a_gcra_refund_never_erases_a_later_booking() {
    // 1 per ms, burst 1: a charge at 0 books [0, 1 ms). The clock passes it; a request
    // at 5 ms books [5, 6 ms). The late refund must not move the TAT back below 6 ms.
    let clock = ManualClock::new();
    let gcra = RateLimiter::gcra_with_clock(
        Policy::new(1, Duration::from_millis(1)).unwrap(),
        clock.clone(),
    );
    let (_, receipt) = gcra.charge(1);
    clock.set(Nanos::new(5 * MS));
    assert!(gcra.check().is_allowed());
    assert!(!gcra.refund(receipt));
    assert!(
        !gcra.check().is_allowed(),
        "two admissions at one instant, burst 1"
    );
    assert_eq!(gcra.state().tat(), Nanos::new(6 * MS));

    // A refund that follows its charge before the clock moves gives back all of it.
    let (_, receipt) = gcra.charge_at(Nanos::new(6 * MS), 1);
    assert!(gcra.refund(receipt));
    assert_eq!(gcra.state().tat(), Nanos::new(6 * MS));
}

#[test]
fn a_receipt_refunds_only_its_own_limiter_and_key() {
    let clock = ManualClock::new();
    let policy = Policy::per_second(1).unwrap();
    let a = RateLimiter::gcra_with_clock(policy, clock.clone());
    let b = RateLimiter::gcra_with_clock(policy, clock.clone());
    assert!(b.check().is_allowed());
    let (_, receipt) = a.charge(1);
    assert!(!b.refund(receipt), "another limiter's receipt");
    assert!(!b.check().is_allowed());

    each_storage!(S => {
        let keyed = KeyedBuilder::new(Gcra::new(policy))
            .clock(clock.clone())
            .build_in::<u64, S>()
            .unwrap();
        let other = KeyedBuilder::new(Gcra::new(policy))
            .clock(clock.clone())
            .build_in::<u64, S>()
            .unwrap();
        assert!(keyed.check(&2).is_allowed());
        let (_, receipt) = keyed.charge(&1, 1);
        assert!(!keyed.refund(&2, receipt), "another key's receipt");
        assert!(!keyed.check(&2).is_allowed());
        let (_, receipt) = keyed.charge(&3, 1);
        assert!(!other.refund(&3, receipt), "another limiter's receipt");
        let (_, receipt) = keyed.charge(&4, 1);
        assert!(keyed.refund(&4, receipt), "its own");
        assert!(keyed.check(&4).is_allowed());
    });
}

#[test]
fn a_refund_never_lands_on_a_recreated_entry() {
    // One shard of capacity 2: charge key 1, then evict it by filling the shard with
    // live keys, re-create it with another request's charge, then refund the first
    // charge. The re-created entry never held it: nothing comes back.
    let clock = ManualClock::new();
    let gcra = Gcra::new(Policy::per_minute(1).unwrap().with_burst(2).unwrap());
    each_storage!(S => {
        let keyed = KeyedBuilder::new(gcra)
            .capacity(2)
            .shards(1)
            .clock(clock.clone())
            .build_in::<u64, S>()
            .unwrap();
        let (_, receipt) = keyed.charge(&1, 1);
        for k in 2..8 {
            assert!(keyed.check_n(&k, 2).is_allowed());
        }
        assert!(keyed.metrics().evicted > 0);
        assert!(keyed.check_n(&1, 2).is_allowed()); // re-created and full
        assert!(!keyed.refund(&1, receipt));
        assert!(!keyed.check(&1).is_allowed());
    });
}

/// The review's thread test: two threads run composites that a second limit always
/// denies (so every charge is refunded), a third uses the shared window directly,
/// while the clock crosses window edges. Every window admits at most L.
#[test]
fn racing_refunds_never_overfill_a_window() {
    const L: u64 = 50;
    const P: u64 = 1_000_000; // 1 ms windows
    const WINDOWS: u64 = 400;
    let clock = ManualClock::new();
    let fw = FixedWindow::new(Policy::new(L, Duration::from_nanos(P)).unwrap()).unwrap();
    let sw = SlidingWindow::new(Policy::new(L, Duration::from_nanos(P)).unwrap()).unwrap();
    let fixed = RateLimiter::with_clock(fw, clock.clone());
    let sliding = RateLimiter::with_clock(sw, clock.clone());
    let strict = exhausted(&clock);
    let stop = AtomicBool::new(false);
    // The direct thread's admissions per window.
    let per_window: Vec<AtomicU64> = (0..WINDOWS + 2).map(|_| AtomicU64::new(0)).collect();
    let sliding_admitted = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    assert!(!check_all(&[&fixed, &sliding, &strict], 1).is_allowed());
                }
            });
        }
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let now = clock.now();
                let d = fixed.check_n_at(now, 1);
                if d.is_allowed() {
                    // The window it counted in ends at now + reset_after (a reading
                    // behind the state counts in the state's newer window).
                    let end = now.as_u64() + d.reset_after_nanos();
                    per_window[((end - 1) / P) as usize].fetch_add(1, Ordering::Relaxed);
                }
                if sliding.check_n_at(now, 1).is_allowed() {
                    sliding_admitted.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        for _ in 0..WINDOWS * 4 {
            clock.advance(Duration::from_nanos(P / 4));
            std::thread::sleep(Duration::from_micros(50));
        }
        stop.store(true, Ordering::Relaxed);
    });
    let worst = per_window.iter().map(|c| c.load(Ordering::Relaxed)).max();
    assert!(worst.unwrap_or(0) <= L, "a window admitted {worst:?} > {L}");
    // The sliding estimate never exceeds L in any window either, so over the run it
    // admits at most L per window plus one window's worth at the start.
    let elapsed_windows = clock.now().as_u64() / P + 1;
    assert!(sliding_admitted.load(Ordering::Relaxed) <= (elapsed_windows + 1) * L);
}

/// The oracle for readings earlier than a reclamation: the keyed limiter answers as an
/// unbounded map of un-keyed limiters would at `max(reading, reclamation instant)`.
fn check_reclamation_oracle<A, S>(algorithm: A)
where
    A: Algorithm + Copy + 'static,
    S: Storage<u64, A::State>,
{
    let clock = ManualClock::new();
    let keyed = KeyedBuilder::new(algorithm)
        .shards(1)
        .clock(clock.clone())
        .build_in::<u64, S>()
        .unwrap();
    let check = |at: Nanos| keyed.check_n_at(&1, at, 1);
    let reclaim = || keyed.reclaim_idle();
    let model = RateLimiter::with_clock(algorithm, ManualClock::new());
    let mut reclaimed_at = Nanos::ZERO;
    let steps: [(u64, bool); 7] = [
        (10 * S, false),
        (10 * S + 200 * MS, false),
        (11 * S, true), // reclaim at 11 s
        (10 * S + 500 * MS, false),
        (10 * S + 600 * MS, false),
        (11 * S + 500 * MS, false),
        (11 * S + 600 * MS, false),
    ];
    for (at, reclaim_now) in steps {
        let at = Nanos::new(at);
        if reclaim_now {
            clock.set(at);
            if reclaim() > 0 {
                reclaimed_at = at;
                // The unbounded model forgets nothing: the key was idle.
            }
            continue;
        }
        let expected = model.check_n_at(at.max(reclaimed_at), 1);
        assert_eq!(
            check(at),
            expected,
            "at {at:?} ({})",
            core::any::type_name::<S>()
        );
    }
}

#[test]
fn readings_earlier_than_a_reclamation_are_judged_at_it() {
    let gcra = Gcra::new(Policy::per_second(1).unwrap());
    let fixed = FixedWindow::new(Policy::per_second(2).unwrap()).unwrap();
    let sliding = SlidingWindow::new(Policy::per_second(2).unwrap()).unwrap();
    each_storage!(S => {
        check_reclamation_oracle::<_, S>(gcra);
        check_reclamation_oracle::<_, S>(fixed);
        check_reclamation_oracle::<_, S>(sliding);
    });
}

/// A shard full of live keys: the victim is never a key whose loss forgives more
/// than another key of the sample — a heavy user survives any flood of light keys.
fn check_heavy_user_survives<A, St>(algorithm: A, heavy_cost: u32)
where
    A: Algorithm + Copy + 'static,
    St: Storage<u64, A::State>,
{
    let clock = ManualClock::starting_at(Nanos::new(10 * S));
    let keyed: KeyedLimiter<u64, A, ManualClock, St> = KeyedBuilder::new(algorithm)
        .capacity(16)
        .shards(1)
        .clock(clock.clone())
        .build_in()
        .unwrap();
    assert!(keyed.check_n(&0, heavy_cost).is_allowed());
    let heavy_left = keyed.peek(&0, 0).remaining();
    for k in 1..2_000u64 {
        assert!(keyed.check(&k).is_allowed());
    }
    assert!(keyed.metrics().evicted > 1_000);
    assert_eq!(
        keyed.peek(&0, 0).remaining(),
        heavy_left,
        "the heavy key was evicted"
    );
}

#[test]
fn eviction_takes_the_key_whose_loss_forgives_least() {
    let policy = Policy::per_hour(100).unwrap();
    each_storage!(St => {
        check_heavy_user_survives::<_, St>(Gcra::new(policy), 90);
        check_heavy_user_survives::<_, St>(FixedWindow::new(policy).unwrap(), 90);
        check_heavy_user_survives::<_, St>(SlidingWindow::new(policy).unwrap(), 90);
    });
}

#[test]
fn parallel_login_guesses_never_pass_the_limit() {
    // 5 failures per 5 minutes per user; 8 threads guess wrong passwords at once.
    // Charge first, refund on success: exactly 5 guesses reach the password check.
    let clock = ManualClock::new();
    let failures: KeyedLimiter<String, Gcra, ManualClock> =
        KeyedBuilder::new(Gcra::new(Policy::new(5, Duration::from_secs(300)).unwrap()))
            .clock(clock.clone())
            .build()
            .unwrap();
    let checked = Mutex::new(0u32);
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                for _ in 0..20 {
                    let (gate, receipt) = failures.charge("alice", 1);
                    if !gate.is_allowed() {
                        continue;
                    }
                    *checked.lock().unwrap() += 1;
                    let password_ok = false;
                    if password_ok {
                        let _ = failures.refund("alice", receipt);
                    }
                }
            });
        }
    });
    assert_eq!(*checked.lock().unwrap(), 5);
    // A success gives its charge back: the user is not locked out by their own login.
    let (gate, receipt) = failures.charge("bob", 1);
    assert!(gate.is_allowed());
    assert!(failures.refund("bob", receipt));
    assert_eq!(failures.peek("bob", 0).remaining(), 5);
}

mod counterfactual {
    //! The refund invariant as a property: after any sequence of charges, checks and
    //! refunds (readings in order, as the cells read them), the state is never more
    //! permissive than the state the other admissions alone produce — the same
    //! admitted requests replayed on a fresh limiter without every refunded charge.
    use super::*;
    use floodgate::keyed::composite::Limit;
    use floodgate::Receipt;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        /// Advance the clock, then charge `cost` (keeping the receipt).
        Charge { advance: u64, cost: u32 },
        /// Refund the receipt kept at this index (mod the number kept), if any left.
        Refund { advance: u64, pick: usize },
    }

    fn op(period: u64) -> impl Strategy<Value = Op> {
        let advance = prop_oneof![Just(0u64), 0..period / 4, 0..2 * period];
        prop_oneof![
            3 => (advance.clone(), 0u32..4).prop_map(|(advance, cost)| Op::Charge { advance, cost }),
            2 => (advance, any::<usize>()).prop_map(|(advance, pick)| Op::Refund { advance, pick }),
        ]
    }

    /// Runs `ops` on a direct limiter, its mutex twin and a keyed limiter (one key);
    /// asserts the invariant after every step.
    fn check<A: Algorithm + Copy + 'static>(
        algorithm: A,
        capacity: u32,
        ops: &[Op],
    ) -> Result<(), TestCaseError> {
        let model = move || -> Box<dyn Limit> {
            Box::new(RateLimiter::with_clock(algorithm, ManualClock::new()))
        };
        let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
        let direct = RateLimiter::with_clock(algorithm, clock.clone());
        check_on(&direct, &clock, &model, capacity, ops)?;
        let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
        let twin = RateLimiter::locked_with_clock(algorithm, clock.clone());
        check_on(&twin, &clock, &model, capacity, ops)?;
        each_storage!(St => {
            let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
            let keyed = KeyedBuilder::new(algorithm)
                .clock(clock.clone())
                .build_in::<u64, St>()
                .unwrap();
            check_on(&keyed.limit(&7), &clock, &model, capacity, ops)?;
        });
        Ok(())
    }

    fn check_on(
        real: &dyn Limit,
        clock: &ManualClock,
        model: &dyn Fn() -> Box<dyn Limit>,
        capacity: u32,
        ops: &[Op],
    ) -> Result<(), TestCaseError> {
        // (index into the log, receipt) of charges not yet refunded.
        let mut held: Vec<(usize, Receipt)> = Vec::new();
        // Every admitted charge: (reading, cost, refunded).
        let mut log: Vec<(Nanos, u32, bool)> = Vec::new();
        for op in ops {
            match *op {
                Op::Charge { advance, cost } => {
                    clock.advance(Duration::from_nanos(advance));
                    let (decision, receipt) = real.charge_at(clock.now(), cost);
                    if decision.is_allowed() && receipt.is_charged() {
                        log.push((clock.now(), cost, false));
                        held.push((log.len() - 1, receipt));
                    }
                }
                Op::Refund { advance, pick } => {
                    clock.advance(Duration::from_nanos(advance));
                    if held.is_empty() {
                        continue;
                    }
                    let (index, receipt) = held.remove(pick % held.len());
                    let _ = real.refund(receipt);
                    log[index].2 = true;
                }
            }
            // The other admissions alone, on a fresh limiter.
            let model = model();
            for &(at, cost, refunded) in &log {
                if !refunded {
                    prop_assert!(
                        model.check_n_at(at, cost).is_allowed(),
                        "the others alone would deny an admission at {:?}",
                        at
                    );
                }
            }
            let now = clock.now();
            for cost in 1..=capacity {
                let (r, m) = (real.peek_at(now, cost), model.peek_at(now, cost));
                prop_assert!(
                    !r.is_allowed() || m.is_allowed(),
                    "cost {} admitted at {:?} where the others alone deny it",
                    cost,
                    now
                );
            }
            prop_assert!(real.peek_at(now, 0).remaining() <= model.peek_at(now, 0).remaining());
        }
        Ok(())
    }

    const P: u64 = 1_000_000;

    proptest! {
        #[test]
        fn gcra_refunds_give_back_only_their_own(
            limit in 1u64..5, burst in 1u64..5,
            ops in proptest::collection::vec(op(P), 1..40),
        ) {
            let policy = Policy::new(limit, Duration::from_nanos(P)).unwrap().with_burst(burst).unwrap();
            check(Gcra::new(policy), burst as u32 + 1, &ops)?;
        }

        #[test]
        fn window_refunds_give_back_only_their_own(
            limit in 1u64..6,
            ops in proptest::collection::vec(op(P), 1..40),
        ) {
            let policy = Policy::new(limit, Duration::from_nanos(P)).unwrap();
            check(FixedWindow::new(policy).unwrap(), limit as u32 + 1, &ops)?;
            check(SlidingWindow::new(policy).unwrap(), limit as u32 + 1, &ops)?;
        }

        #[test]
        fn sliding_log_refunds_give_back_only_their_own(
            limit in 1u64..6,
            ops in proptest::collection::vec(op(P), 1..40),
        ) {
            let policy = Policy::new(limit, Duration::from_nanos(P)).unwrap();
            let model = move || -> Box<dyn Limit> {
                Box::new(SlidingLog::with_clock(policy, ManualClock::new()))
            };
            let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
            let log = SlidingLog::with_clock(policy, clock.clone());
            check_on(&log, &clock, &model, limit as u32 + 1, &ops)?;
            let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
            let keyed = KeyedBuilder::default()
                .clock(clock.clone())
                .sliding_log::<u64>(policy)
                .unwrap();
            check_on(&keyed.limit(&7), &clock, &model, limit as u32 + 1, &ops)?;
        }

        #[test]
        fn shaper_refunds_give_back_only_their_own(
            limit in 1u64..5, burst in 1u64..5,
            ops in proptest::collection::vec(op(P), 1..40),
        ) {
            let policy = Policy::new(limit, Duration::from_nanos(P)).unwrap().with_burst(burst).unwrap();
            let model = move || -> Box<dyn Limit> {
                Box::new(RateLimiter::with_clock(Gcra::new(policy), ManualClock::new()))
            };
            let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
            let shaper = Shaper::with_clock(policy, clock.clone());
            check_on(&shaper, &clock, &model, burst as u32 + 1, &ops)?;
            let clock = ManualClock::starting_at(Nanos::from_secs(1_000));
            let twin = Shaper::locked_with_clock(policy, clock.clone());
            check_on(&twin, &clock, &model, burst as u32 + 1, &ops)?;
        }
    }
}
