//! Borrowed lookups allocate nothing for a key already present: a `String` key
//! looked up by `&str`, a `(IpAddr, String)` key by `Pair(&ip, &str)`, on every
//! storage that takes such keys (`Heap`, `Fingerprint`), through `check`, `peek`,
//! `charge`, `refund` and the plan limiter. A counting global allocator proves it.
#![cfg(not(loom))]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::net::IpAddr;

use floodgate::keyed::plans::{PlanLimiter, Plans};
use floodgate::{
    Fingerprint, Gcra, Heap, KeyedBuilder, KeyedLimiter, ManualClock, Pair, Policy, Storage,
};

/// Counts this thread's allocations (the test harness allocates on its own threads).
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator unchanged; only counts on the side.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// Allocations made by `f`.
fn allocations_in(f: impl FnOnce()) -> u64 {
    let before = allocations();
    f();
    allocations() - before
}

fn limiter<K, S: Storage<K, floodgate::GcraState>>(
    clock: &ManualClock,
) -> KeyedLimiter<K, Gcra, ManualClock, S> {
    KeyedBuilder::new(Gcra::new(Policy::per_second(1_000_000).unwrap()))
        .capacity(1_000)
        .clock(clock.clone())
        .build_in()
        .unwrap()
}

fn string_keys<S: Storage<String, floodgate::GcraState>>() {
    let clock = ManualClock::new();
    let keyed = limiter::<String, S>(&clock);
    assert!(keyed.check("alice").is_allowed()); // the insert allocates the key
    let n = allocations_in(|| {
        for _ in 0..1_000 {
            assert!(keyed.check("alice").is_allowed());
            assert!(keyed.peek("alice", 1).is_allowed());
            let (decision, receipt) = keyed.charge("alice", 1);
            assert!(decision.is_allowed());
            assert!(keyed.refund("alice", receipt));
        }
    });
    assert_eq!(n, 0, "{} allocations", n);
}

fn pair_keys<S: Storage<(IpAddr, String), floodgate::GcraState>>() {
    let clock = ManualClock::new();
    let keyed = limiter::<(IpAddr, String), S>(&clock);
    let ip: IpAddr = "2001:db8::7".parse().unwrap();
    assert!(keyed.check(&Pair(&ip, "alice")).is_allowed());
    let n = allocations_in(|| {
        for _ in 0..1_000 {
            assert!(keyed.check(&Pair(&ip, "alice")).is_allowed());
            assert!(keyed.peek(&Pair(&ip, "alice"), 1).is_allowed());
            let (decision, receipt) = keyed.charge(&Pair(&ip, "alice"), 1);
            assert!(decision.is_allowed());
            assert!(keyed.refund(&Pair(&ip, "alice"), receipt));
        }
    });
    assert_eq!(n, 0, "{} allocations", n);
    // The borrowed form and the owned key are one key.
    assert_eq!(keyed.metrics().live_keys, 1);
    assert!(keyed.peek(&(ip, "alice".to_owned()), 1).is_allowed());
}

#[test]
fn a_present_string_key_allocates_nothing() {
    string_keys::<Heap>();
    string_keys::<Fingerprint>();
}

#[test]
fn a_present_pair_key_allocates_nothing() {
    pair_keys::<Heap>();
    pair_keys::<Fingerprint>();
}

#[test]
fn the_plan_limiter_looks_up_borrowed_keys_without_allocating() {
    let plans = Plans::classic();
    let pro = plans.id("pro").unwrap();
    let limiter: PlanLimiter<String, _, _> = PlanLimiter::new(
        &plans,
        move |_: &str| pro,
        KeyedBuilder::default().clock(ManualClock::new()),
    )
    .unwrap();
    assert!(limiter.check("alice").is_allowed());
    let n = allocations_in(|| {
        for _ in 0..10 {
            let _ = limiter.check("alice");
            let _ = limiter.peek("alice", 1);
            let (_, receipt) = limiter.charge("alice", 1);
            let _ = limiter.refund("alice", receipt);
        }
    });
    assert_eq!(n, 0, "{} allocations", n);
}
