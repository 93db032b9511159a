//! Waiting on one key of a keyed limiter, on every storage (`Heap`, `Inline`,
//! `Fingerprint`): GCRA books the key's own schedule (first come, first served, no
//! slot handed out twice, however many threads book at once), a dropped async wait
//! gives its booking back, a removal voids a booking's receipt, and the windows wait
//! by checking and sleeping.
#![cfg(not(loom))]

#[macro_use]
mod common;

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use floodgate::{
    Clock, FixedWindow, Gcra, GcraState, Jitter, KeyedBuilder, KeyedLimiter, ManualClock, Nanos,
    Policy, Storage, WaitError,
};

type Keyed<S> = KeyedLimiter<u64, Gcra, ManualClock, S>;

/// 10 per second, burst 1: consecutive slots 100 ms apart.
fn keyed<S: Storage<u64, GcraState>>(clock: &ManualClock) -> Keyed<S> {
    let gcra = Gcra::new(
        Policy::per_second(10)
            .and_then(|p| p.with_burst(1))
            .expect("valid policy"),
    );
    common::keyed_on(gcra, clock, 64, 2)
}

/// Compiles only for a `Send` value.
fn send<T: Send>(_: &T) {}

const SLOT: Duration = Duration::from_millis(100);

#[test]
fn bookings_follow_each_keys_own_schedule() {
    on_every_storage!(bookings_follow_each_keys_own_schedule_on);
}

fn bookings_follow_each_keys_own_schedule_on<S: Storage<u64, GcraState>>() {
    let clock = ManualClock::starting_at(Nanos::from_secs(100));
    let keyed = keyed::<S>(&clock);
    let now = clock.now();
    for n in 0..5u32 {
        let (decision, wait, _) = keyed.book_at(&1, now, 1).expect("GCRA books");
        assert!(decision.is_allowed());
        assert_eq!(wait, SLOT * n, "booking {n} of key 1");
    }
    // Another key has its own schedule.
    assert_eq!(keyed.book_at(&2, now, 1).map(|b| b.1), Some(Duration::ZERO));
    // A cost above the burst never fits: denied, nothing booked.
    let (never, wait, _) = keyed.book_at(&1, now, 2).expect("GCRA books");
    assert!(!never.is_allowed() && never.retry_after().is_none() && wait.is_zero());
    assert_eq!(keyed.book_at(&1, now, 1).map(|b| b.1), Some(SLOT * 5));
}

#[test]
fn threads_booking_one_key_never_share_a_slot() {
    on_every_storage!(threads_booking_one_key_never_share_a_slot_on);
}

fn threads_booking_one_key_never_share_a_slot_on<S: Storage<u64, GcraState>>() {
    const THREADS: u32 = 4;
    const EACH: u32 = 50;
    let clock = ManualClock::starting_at(Nanos::from_secs(100));
    let keyed = keyed::<S>(&clock);
    let now = clock.now();
    let waits = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                let mine: Vec<Duration> = (0..EACH)
                    .map(|_| keyed.book_at(&7, now, 1).expect("GCRA books").1)
                    .collect();
                waits.lock().unwrap().extend(mine);
            });
        }
    });
    let waits: BTreeSet<Duration> = waits.into_inner().unwrap().into_iter().collect();
    // Every booking got its own slot: exactly the first THREADS × EACH slots.
    let expected: BTreeSet<Duration> = (0..THREADS * EACH).map(|n| SLOT * n).collect();
    assert_eq!(waits, expected);
}

#[test]
fn a_dropped_async_wait_gives_its_booking_back() {
    on_every_storage!(a_dropped_async_wait_gives_its_booking_back_on);
}

fn a_dropped_async_wait_gives_its_booking_back_on<S: Storage<u64, GcraState>>() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    let clock = ManualClock::starting_at(Nanos::from_secs(100));
    let keyed = keyed::<S>(&clock);
    rt.block_on(async {
        // The first unit is free; the second waits 100 ms for its slot.
        let first = keyed.until_key_ready_with(&3, 1, Jitter::NONE, tokio::time::sleep);
        assert_eq!(first.await, Ok(Duration::ZERO));
        let second = keyed.until_key_ready_with(&3, 1, Jitter::NONE, tokio::time::sleep);
        send(&second); // it can be spawned on a multi-thread runtime
                       // Given up after 10 ms (the manual clock has not moved: the slot is ahead).
        let gave_up = tokio::time::timeout(Duration::from_millis(10), second).await;
        assert!(gave_up.is_err(), "the slot is 100 ms away");
    });
    // The dropped wait's booking came back: the next one gets its slot, not the one
    // after it.
    let now = clock.now();
    assert_eq!(keyed.book_at(&3, now, 1).map(|b| b.1), Some(SLOT));
    // A wait that completes keeps its units.
    rt.block_on(async {
        let waited = keyed
            .until_key_ready_with(&4, 1, Jitter::NONE, tokio::time::sleep)
            .await;
        assert_eq!(waited, Ok(Duration::ZERO));
    });
    assert_eq!(keyed.book_at(&4, now, 1).map(|b| b.1), Some(SLOT));
}

#[test]
fn a_removal_voids_a_bookings_receipt() {
    on_every_storage!(a_removal_voids_a_bookings_receipt_on);
}

fn a_removal_voids_a_bookings_receipt_on<S: Storage<u64, GcraState>>() {
    let clock = ManualClock::starting_at(Nanos::from_secs(100));
    let keyed = keyed::<S>(&clock);
    let now = clock.now();
    let _free = keyed.book_at(&5, now, 1).expect("GCRA books");
    let (_, wait, receipt) = keyed.book_at(&5, now, 1).expect("GCRA books");
    assert_eq!(wait, SLOT);
    assert!(keyed.reset(&5));
    // The key's fresh state must not be credited with the old booking.
    assert!(!keyed.refund(&5, receipt));
    assert_eq!(keyed.peek(&5, 1).remaining(), 0, "the check after a reset");
    let (_, wait, receipt) = keyed.book_at(&5, now, 1).expect("GCRA books");
    assert_eq!(wait, Duration::ZERO);
    // Without a removal in between, an unreached booking comes back whole.
    let (_, later, later_receipt) = keyed.book_at(&5, now, 1).expect("GCRA books");
    assert_eq!(later, SLOT);
    assert!(keyed.refund(&5, later_receipt));
    assert_eq!(keyed.book_at(&5, now, 1).map(|b| b.1), Some(SLOT));
    drop(receipt);
}

#[test]
fn windows_wait_by_checking_and_sleeping() {
    on_every_storage!(windows_wait_by_checking_and_sleeping_on);
}

fn windows_wait_by_checking_and_sleeping_on<S>()
where
    S: Storage<u64, <FixedWindow as floodgate::Algorithm>::State>,
{
    let clock = ManualClock::starting_at(Nanos::from_secs(100));
    let window = FixedWindow::new(Policy::per_second(2).expect("valid policy")).expect("valid");
    let keyed: KeyedLimiter<u64, FixedWindow, ManualClock, S> = KeyedBuilder::new(window)
        .capacity(16)
        .clock(clock.clone())
        .build_in()
        .expect("valid configuration");
    // Windows cannot book ahead.
    assert!(keyed.book_at(&1, clock.now(), 1).is_none());
    let sleep = |d: Duration| {
        clock.advance(d);
    };
    assert_eq!(
        keyed.wait_key_with(&1, 1, Jitter::NONE, sleep),
        Ok(Duration::ZERO)
    );
    assert_eq!(
        keyed.wait_key_with(&1, 1, Jitter::NONE, sleep),
        Ok(Duration::ZERO)
    );
    // The window is full: the waiter sleeps to the next one and is admitted there.
    assert_eq!(
        keyed.wait_key_with(&1, 1, Jitter::NONE, sleep),
        Ok(Duration::from_secs(1))
    );
    assert_eq!(
        keyed.wait_key_with(&1, 3, Jitter::NONE, sleep),
        Err(WaitError::Never { cost: 3 })
    );
}
