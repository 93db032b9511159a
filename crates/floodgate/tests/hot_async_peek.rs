//! `AsyncLimit::peek_n` on the hot-key modes ([`LeasedGcra`], [`HotKeyLimiter`]) is
//! the limiter's own `peek`, decision for decision, and what a hot peek's
//! `remaining` reports beside a check's: this thread's lease units plus what the
//! central word keeps after the part of the cost the lease does not cover.
#![cfg(not(loom))]

use core::future::Future;
use core::pin::pin;
use core::task::{Context, Poll, Waker};
use std::time::Duration;

use floodgate::{
    AsyncLimit, Decision, HotKeyLimiter, HotKeys, Inline, KeyedBuilder, LeasedGcra, ManualClock,
    Nanos, Policy,
};

/// The in-process futures are ready on their first poll.
fn ready_now<F: Future>(f: F) -> F::Output {
    match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("an in-process limit was not ready at once"),
    }
}

const BURST: u64 = 10;

/// Burst 10 at 1/ms.
fn policy() -> Policy {
    Policy::per_second(1_000)
        .and_then(|p| p.with_burst(BURST))
        .expect("valid policy")
}

/// Leases of 4 units living 1 ms, a shard for every thread the tests run.
fn leased(clock: &ManualClock) -> LeasedGcra<ManualClock> {
    LeasedGcra::builder(policy())
        .shards(64)
        .lease_size(4)
        .lifetime(Duration::from_millis(1))
        .build_with_clock(clock.clone())
        .expect("valid lease settings")
}

/// Key 0 hot (leases as [`leased`]'s), key 1 cold.
fn hot(clock: &ManualClock) -> HotKeyLimiter<u64, ManualClock, Inline> {
    let limiter = HotKeyLimiter::new_in(
        policy(),
        KeyedBuilder::default().capacity(64).clock(clock.clone()),
        HotKeys::default()
            .manual()
            .lease_shards(64)
            .lease_size(4)
            .lease_lifetime(Duration::from_millis(1)),
    )
    .expect("valid configuration");
    assert!(limiter.promote(&0));
    limiter
}

/// Every cost from 0 to past the burst: the async peek is the sync peek.
fn peeks_agree(step: usize, sync: impl Fn(u32) -> Decision, r#async: impl Fn(u32) -> Decision) {
    for cost in 0..=BURST as u32 + 1 {
        assert_eq!(r#async(cost), sync(cost), "step {step}, cost {cost}");
    }
}

/// Through checks that take, spend and exhaust leases and a clock that lets leases
/// expire and the central word refill, `peek_n` answers as `peek` at every cost:
/// on a `LeasedGcra`, a hot key and a cold key.
#[test]
fn peek_n_is_the_sync_peek_on_the_hot_key_modes() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let (l, h) = (leased(&clock), hot(&clock));
    let costs = [1, 2, 0, 5, 1, 1, 11, 3, 1, 4];
    for (step, cost) in costs.into_iter().cycle().take(60).enumerate() {
        peeks_agree(
            step,
            |c| l.peek(c),
            |c| ready_now(AsyncLimit::<u64>::peek_n(&l, &9, c)).unwrap(),
        );
        for key in [0, 1] {
            peeks_agree(
                step,
                |c| h.peek(&key, c),
                |c| ready_now(AsyncLimit::peek_n(&h, &key, c)).unwrap(),
            );
        }
        let _ = (l.check_n(cost), h.check_n(&0, cost), h.check_n(&1, cost));
        if step % 7 == 6 {
            clock.advance(Duration::from_micros(1_500)); // leases expire, 1.5 units back
        }
    }
}

/// A hot peek's allowed `remaining` is what the check would leave this thread: its
/// lease units less the cost, plus what the central word keeps after the cost's
/// shortfall (the units the lease does not cover), at most the burst — a refill's
/// view. A check reports its own view: a lease spend only its lease's units left, a
/// refill its lease's units plus the central word's after the refill (the peek's).
/// Exact values, the clock standing still, for `LeasedGcra::peek`, a hot key's
/// `peek` and both through `peek_n`.
#[test]
fn a_hot_peeks_remaining_is_the_lease_plus_what_the_central_word_keeps() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let (l, h) = (leased(&clock), hot(&clock));
    type Step<'a> = &'a dyn Fn(u32) -> Decision;
    let limits: [(&str, Step, Step, Step); 2] = [
        ("leased", &|c| l.check_n(c), &|c| l.peek(c), &|c| {
            ready_now(AsyncLimit::<u64>::peek_n(&l, &0, c)).unwrap()
        }),
        ("hot key", &|c| h.check_n(&0, c), &|c| h.peek(&0, c), &|c| {
            ready_now(AsyncLimit::peek_n(&h, &0, c)).unwrap()
        }),
    ];
    for (name, check, peek, peek_n) in limits {
        let remaining = |d: Decision| (d.is_allowed(), d.remaining());
        // A refill: leases 4, spends 1; 3 on the lease, 6 in the central word.
        assert_eq!(remaining(check(1)), (true, 9), "{name}");
        // The lease covers 1: (3 − 1) + 6, where the check (a spend) shows its
        // lease's 2.
        assert_eq!(remaining(peek(1)), (true, 8), "{name}");
        assert_eq!(remaining(peek_n(1)), (true, 8), "{name}");
        assert_eq!(remaining(check(1)), (true, 2), "{name}");
        // 5 with 2 on the lease: 0 + (6 − 3), as the check (a refill taking 4)
        // shows: 1 on the lease + 2 in the central word.
        assert_eq!(remaining(peek(5)), (true, 3), "{name}");
        assert_eq!(remaining(peek_n(5)), (true, 3), "{name}");
        assert_eq!(remaining(check(5)), (true, 3), "{name}");
        // Denied, nothing written: the peek's and the check's reports are equal.
        assert_eq!(peek(4), check(4), "{name}");
        assert_eq!(peek_n(4), peek(4), "{name}");
        // Cost 0: the central word's report, from either.
        assert_eq!(peek(0), check(0), "{name}");
        assert_eq!(peek(0).remaining(), 2, "{name}");
    }
}
