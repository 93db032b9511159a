//! The coarse expiry clock beside another user of quanta's recent time: a library
//! that started quanta's own upkeep thread first, at an interval of its choosing
//! (here an hour). The coarse clock keeps its own tick whatever that thread does,
//! so a lease still expires after its lifetime plus a tick and scheduling delay.
//!
//! One test per binary: quanta's upkeep is process-wide, and this test needs its
//! thread started before any coarse clock.
#![cfg(not(loom))]

use std::time::{Duration, Instant};

use floodgate::lease::CoarseClock;
use floodgate::{LeasedGcra, Policy};

/// How long to wait for a reading that should come within a few milliseconds:
/// generous, for a loaded machine (no speed is asserted, only that it comes).
const PATIENCE: Duration = Duration::from_secs(10);

/// Polls `done` every millisecond until it holds or `PATIENCE` runs out.
fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < PATIENCE {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    done()
}

#[test]
#[cfg_attr(miri, ignore = "quanta executes CPUID")]
fn a_coarse_clock_keeps_time_beside_another_quanta_upkeep_thread() {
    let other = quanta::Upkeep::new(Duration::from_secs(3_600))
        .start()
        .expect("the first upkeep thread of the process");
    // Never dropped: that would wait out the thread's hour-long sleep (a failed
    // assertion below too, as it unwinds).
    std::mem::forget(other);
    let coarse = CoarseClock::new();
    let start = coarse.nanos();
    assert!(
        eventually(|| coarse.nanos() >= start + 10_000_000),
        "the coarse clock stood still for {PATIENCE:?}"
    );
    let leased = LeasedGcra::builder(Policy::per_second(1_000).unwrap().with_burst(100).unwrap())
        .shards(1)
        .lease_size(10)
        // Short beside `PATIENCE`, long beside a read just after the check.
        .lifetime(Duration::from_millis(500))
        .build_coarse()
        .unwrap();
    // The check took a lease, seen by a read just after it. A read later than the
    // lifetime (this thread or the upkeep thread descheduled: a 1 ms lifetime failed
    // so under ThreadSanitizer) finds it expired and proves nothing either way, so
    // the try is made again: a check that took no lease fails all 20.
    let seen = (0..20).any(|_| {
        assert!(leased.check().is_allowed());
        leased.units_on_lease() > 0
    });
    assert!(seen, "no check of 20 took a lease");
    assert!(
        eventually(|| leased.units_on_lease() == 0),
        "a lease of 500 ms still out after {PATIENCE:?}"
    );
}
