//! # floodgate
//!
//! Lock-free rate limiting for programs on the request path. A decision costs one
//! clock read and one compare-and-swap on one 64-bit word.
//!
//! ```
//! use floodgate::{ManualClock, Policy, RateLimiter};
//! use std::time::Duration;
//!
//! // 100 requests per minute, at most 10 at once.
//! let policy = Policy::per_minute(100)?.with_burst(10)?;
//! let clock = ManualClock::new(); // RateLimiter::gcra(policy) uses the TSC clock
//! let limiter = RateLimiter::gcra_with_clock(policy, clock.clone());
//!
//! for _ in 0..10 {
//!     assert!(limiter.check().is_allowed());
//! }
//! let denied = limiter.check();
//! assert!(!denied.is_allowed());
//! assert_eq!(denied.retry_after(), Some(Duration::from_millis(600)));
//!
//! clock.advance(Duration::from_millis(600));
//! assert!(limiter.check().is_allowed());
//! # Ok::<(), floodgate::PolicyError>(())
//! ```
//!
//! ## Algorithms
//!
//! | algorithm | type | state | trade-off |
//! |---|---|---|---|
//! | GCRA (token bucket, leaky bucket as a meter) | [`Gcra`] | one word | smooth rate with a burst; the default |
//! | fixed window | [`FixedWindow`] | one word | simplest counters, aligned to the clock; allows 2·L across an edge |
//! | sliding window counter | [`SlidingWindow`] | one word | weighted two-window estimate; no edge spike, approximate |
//! | sliding log | [`SlidingLog`] | `O(L)` ring, short mutex | exact; memory per key grows with `L` |
//! | leaky bucket as a queue | [`Shaper`] | one word | requests wait for their slot (`reserve`, `wait`, `until_ready`; `peek_reserve` looks without reserving) |
//!
//! The word-sized ones run in [`RateLimiter`] (lock-free) and [`LockedRateLimiter`]
//! (the mutex twin); each module states its exact semantics.
//!
//! ## Design
//!
//! * Every word-sized algorithm is a **pure transition** ([`Algorithm::decide`]) over
//!   a `Copy` state that packs into 64 bits. One driver runs it in an [`AtomicCell`]
//!   (`compare_exchange_weak` loop, no write on a denial) and the same transition runs
//!   behind a `Mutex` in a [`LockedCell`] — the mutex twin. The sliding log, whose
//!   state is a ring of up to `L` instants, runs under a short mutex of its own.
//! * [`reference`](mod@reference) holds oracles written apart from the transitions: exact models
//!   (equality) and the textbook `f64` versions (baselines).
//! * Time is injected ([`Clock`]): the TSC [`DefaultClock`] anchored to the Unix
//!   epoch and clamped per thread, [`StdClock`], and [`ManualClock`] for tests.
//! * No input panics: policies are validated once ([`PolicyError`]), and the
//!   arithmetic after that is bounded or saturating.
//!
//! ## Model checking
//!
//! Built with `RUSTFLAGS="--cfg loom"`, every atomic in this crate is loom's (see
//! the `sync` module), so a downstream crate that runs loom over its own code explores
//! floodgate's interleavings too — use [`ManualClock`] there.

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod algorithm;
mod async_limit;
#[cfg(feature = "cas-stats")]
pub mod cas_stats;
mod cell;
pub mod clock;
mod decision;
mod duration;
pub mod fixed_window;
pub mod gcra;
pub mod keyed;
pub mod lease;
mod limiter;
mod live;
mod policy;
pub mod receipt;
pub mod reference;
pub mod shaping;
pub mod sliding_log;
pub mod sliding_window;
mod sync;
pub mod waiting;
pub mod window;

pub use algorithm::{Algorithm, Charged};
pub use async_limit::{AsyncLimit, AsyncReceipt};
pub use cell::{AtomicCell, LockedCell, StateCell};
pub use clock::{Clock, DefaultClock, ManualClock, Nanos, StdClock};
pub use decision::{Decision, PolicyId};
pub use duration::{parse_duration, DurationError};
pub use fixed_window::{FixedWindow, FixedWindowState};
pub use gcra::{Gcra, GcraState, LeakyBucket, TokenBucket};
pub use keyed::composite::{
    charge_all, check_all, check_all_indexed, refund_all, CompositeReceipt, Identified, Limit,
};
pub use keyed::{
    Fingerprint, Heap, HotKeyError, HotKeyLimiter, HotKeys, HotMetrics, Inline, InlineKey,
    Ipv6Prefix, KeyedBuilder, KeyedError, KeyedLimiter, KeyedMetrics, KeyedSlidingLog, Lookup,
    Pair, PrefixTooLong, Storage, DEFAULT_CAPACITY, DEFAULT_MEMORY_BUDGET, MAX_CAPACITY,
};
pub use lease::{LeaseBuilder, LeaseError, LeasedGcra};
pub use limiter::{LockedRateLimiter, RateLimiter};
pub use live::LiveGcra;
pub use policy::{Policy, PolicyError, MAX_SPAN_NANOS};
pub use receipt::Receipt;
pub use shaping::{LockedShaper, Reservation, ReservationPeek, ShapeError, Shaper};
pub use sliding_log::SlidingLog;
pub use sliding_window::{SlidingWindow, SlidingWindowState};
pub use waiting::{Jitter, Wait, WaitError};
pub use window::YEAR_NANOS;

/// Compile-time proof that the public limiters can be shared across threads.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<RateLimiter<Gcra>>();
    assert_send_sync::<LockedRateLimiter<Gcra>>();
    assert_send_sync::<RateLimiter<Gcra, ManualClock>>();
    assert_send_sync::<Decision>();
    assert_send_sync::<LeasedGcra>();
    assert_send_sync::<KeyedLimiter<u64>>();
    assert_send_sync::<KeyedLimiter<String, Gcra, ManualClock>>();
    assert_send_sync::<KeyedLimiter<u64, Gcra, DefaultClock, Inline>>();
    assert_send_sync::<KeyedLimiter<std::net::IpAddr, FixedWindow, ManualClock, Inline>>();
    assert_send_sync::<KeyedLimiter<String, Gcra, DefaultClock, Fingerprint>>();
    assert_send_sync::<keyed::plans::PlanLimiter<u64, fn(&u64) -> keyed::plans::PlanId>>();
    assert_send_sync::<
        keyed::plans::PlanLimiter<
            u64,
            fn(&u64) -> keyed::plans::PlanId,
            DefaultClock,
            Inline,
            SlidingWindow,
        >,
    >();
    assert_send_sync::<keyed::plans::PlanTable<'static, u64, Gcra, DefaultClock, Heap>>();
    assert_send_sync::<RateLimiter<FixedWindow>>();
    assert_send_sync::<RateLimiter<SlidingWindow>>();
    assert_send_sync::<SlidingLog>();
    assert_send_sync::<KeyedSlidingLog<String, DefaultClock>>();
    assert_send_sync::<HotKeyLimiter<String>>();
    assert_send_sync::<HotKeyLimiter<u64, ManualClock, Inline>>();
    assert_send_sync::<Shaper>();
    assert_send_sync::<LockedShaper>();
    assert_send_sync::<Reservation>();
    assert_send_sync::<ReservationPeek>();
};
