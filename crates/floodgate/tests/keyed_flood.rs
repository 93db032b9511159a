//! A flood of 10 million unique keys through a limiter with capacity 1 million (on
//! every storage: `Heap`, `Inline`, `Fingerprint`): the heap never grows
//! past the bound, keys that stayed live keep their decisions, and a check on a known
//! key allocates nothing.
//!
//! Too slow unoptimised; run it with
//! `cargo test -p floodgate --release --test keyed_flood` (CI does).
#![cfg(not(loom))]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use floodgate::{
    Decision, Gcra, GcraState, KeyedBuilder, KeyedError, KeyedLimiter, KeyedMetrics, ManualClock,
    Policy, RateLimiter, Storage,
};

/// Counts live heap bytes and their peak (process-wide: an upper bound on what the
/// table holds), and this thread's allocations (the test harness allocates on its own
/// threads, which must not count against "a known key allocates nothing").
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: forwards to the system allocator unchanged; only counts on the side.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const CAPACITY: usize = 1_000_000;
const FLOOD: u64 = 10_000_000;
const KEPT: u64 = 1_000;

/// The two tests share the allocator's counters: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// What the flood needs of a keyed limiter over `u64` keys.
trait Flooded {
    fn check(&self, key: u64) -> Decision;
    fn check_n(&self, key: u64, cost: u32) -> Decision;
    fn peek(&self, key: u64, cost: u32) -> Decision;
    fn metrics(&self) -> KeyedMetrics;
    fn max_keys(&self) -> usize;
    fn slot_bytes(&self) -> usize;
    /// Heap bytes per key of capacity: the slot array's share plus any entry.
    fn bytes_per_key(&self) -> usize;
}

// The slot array's share plus one heap entry per key (none for inline slots).
impl<S: Storage<u64, GcraState>> Flooded for KeyedLimiter<u64, Gcra, ManualClock, S> {
    fn check(&self, key: u64) -> Decision {
        KeyedLimiter::check(self, &key)
    }
    fn check_n(&self, key: u64, cost: u32) -> Decision {
        KeyedLimiter::check_n(self, &key, cost)
    }
    fn peek(&self, key: u64, cost: u32) -> Decision {
        KeyedLimiter::peek(self, &key, cost)
    }
    fn metrics(&self) -> KeyedMetrics {
        KeyedLimiter::metrics(self)
    }
    fn max_keys(&self) -> usize {
        KeyedLimiter::max_keys(self)
    }
    fn slot_bytes(&self) -> usize {
        KeyedLimiter::slot_bytes(self)
    }
    fn bytes_per_key(&self) -> usize {
        self.slot_bytes().div_ceil(CAPACITY) + self.entry_bytes()
    }
}

/// 1 per second, burst 1 000: a flood key books 1 s, a kept key 500 s, so the kept
/// keys are never the closest to idle.
fn gcra() -> Gcra {
    Gcra::new(Policy::per_second(1).unwrap().with_burst(1_000).unwrap())
}

#[test]
#[cfg_attr(debug_assertions, ignore = "run with --release")]
fn ten_million_keys_through_one_million_slots() {
    flood(|b| b.build::<u64>());
}

#[test]
#[cfg_attr(debug_assertions, ignore = "run with --release")]
fn ten_million_keys_through_one_million_inline_slots() {
    flood(|b| b.build_inline::<u64>());
}

#[test]
#[cfg_attr(debug_assertions, ignore = "run with --release")]
fn ten_million_keys_through_one_million_fingerprint_slots() {
    flood(|b| b.build_fingerprint::<u64>());
}

fn flood<L: Flooded>(build: impl FnOnce(KeyedBuilder<Gcra, ManualClock>) -> Result<L, KeyedError>) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let clock = ManualClock::new();
    let baseline = LIVE.load(Ordering::Relaxed);
    PEAK.store(baseline, Ordering::Relaxed);
    let limiter = build(
        KeyedBuilder::new(gcra())
            .capacity(CAPACITY)
            .clock(clock.clone()),
    )
    .unwrap();
    let gcra = gcra();
    let slot_bytes = limiter.slot_bytes();
    let bytes_per_key = limiter.bytes_per_key();
    let bound = 2 * CAPACITY * bytes_per_key;

    // The kept keys and their twins.
    let kept: Vec<RateLimiter<Gcra, ManualClock>> = (0..KEPT)
        .map(|_| RateLimiter::with_clock(gcra, clock.clone()))
        .collect();
    for (key, twin) in kept.iter().enumerate() {
        let key = u64::MAX - key as u64;
        assert_eq!(limiter.check_n(key, 500), twin.check_n(500));
    }

    for i in 0..FLOOD {
        assert!(limiter.check(i).is_allowed());
        if i % 10 == 0 {
            clock.advance(Duration::from_nanos(1_000));
        }
        if i % 1_000_000 == 0 {
            // A kept key, checked while the flood runs: same decision as its twin.
            let k = (i / 1_000_000) as usize;
            assert_eq!(limiter.check(u64::MAX - k as u64), kept[k].check());
        }
    }
    let peak = PEAK.load(Ordering::Relaxed) - baseline;
    let m = limiter.metrics();
    eprintln!(
        "capacity {CAPACITY}, slots {slot_bytes} B, bytes/key {bytes_per_key}, \
         heap peak {peak} B ({:.1} B/key), bound {bound} B, {m:?}",
        peak as f64 / CAPACITY as f64
    );
    assert!(peak >= slot_bytes, "the counting allocator saw the table");
    assert!(peak <= bound, "heap peak {peak} B exceeds {bound} B");
    assert!(m.live_keys as usize <= limiter.max_keys());
    assert_eq!(m.live_keys + m.reclaimed + m.evicted, FLOOD + KEPT);

    // Every kept key stayed live and decides exactly like its twin.
    for (key, twin) in kept.iter().enumerate() {
        let key = u64::MAX - key as u64;
        assert_eq!(limiter.peek(key, 1), twin.peek(1), "kept key {key}");
        assert_eq!(limiter.check_n(key, 3), twin.check_n(3), "kept key {key}");
    }

    // The hot path for known keys allocates nothing.
    let before = allocations();
    for round in 0..10u64 {
        for key in 0..KEPT {
            let _ = limiter.check(u64::MAX - key);
            let _ = limiter.peek(u64::MAX - key - round, 1);
        }
    }
    assert_eq!(allocations(), before);
}
