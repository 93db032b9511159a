//! Keyed limiting side by side: floodgate's `KeyedLimiter` on each storage (heap
//! entries; `u64` keys inline; fingerprints) vs governor's keyed
//! limiter (default DashMap hasher, and ahash) vs `Mutex<HashMap<u64, GCRA state>>`
//! vs `DashMap<u64, AtomicU64>` (the same GCRA transition in both), over 10 thousand
//! and 1 million `u64` keys, uniform and Zipf(1.0), on 1 thread and on 2 threads with
//! distinct keys (each its own 10k, then its own 500k, in one shared limiter).
//!
//! Every key is inserted before measuring: this is the known-key hot path. Also
//! prints the heap bytes per key of each contender at 1 million keys (a counting
//! allocator around mimalloc; payload bytes, not allocator overhead).
//!
//! `cargo bench -p floodgate-benches --bench keyed` (`-- --quick` for a sanity run).

use std::alloc::{GlobalAlloc, Layout};
use std::collections::HashMap;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use dashmap::DashMap;
use floodgate::{
    Algorithm, Clock, DefaultClock, Gcra, GcraState, KeyedBuilder, KeyedLimiter, Nanos, Policy,
    Storage,
};
use rand::{rngs::StdRng, Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};

/// mimalloc, counting live bytes for the bytes-per-key report.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to mimalloc unchanged; only counts on the side.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// One per second with a burst of 10^9: every check is admitted (a decision with a
/// CAS, the path that matters) and every key stays live — booked ahead of the clock —
/// for the whole run, so floodgate never reclaims a key mid-benchmark and every
/// contender measures the known-key path.
fn policy() -> Policy {
    Policy::per_second(1)
        .and_then(|p| p.with_burst(BURST.into()))
        .expect("valid policy")
}

const BURST: u32 = 1_000_000_000;

fn quota() -> governor::Quota {
    governor::Quota::per_second(NonZeroU32::new(1).expect("non-zero"))
        .allow_burst(NonZeroU32::new(BURST).expect("non-zero"))
}

/// One contender: check one key now.
trait Contender: Sync {
    fn check(&self, key: u64) -> bool;
}

struct Floodgate(KeyedLimiter<u64>);

impl Contender for Floodgate {
    #[inline]
    fn check(&self, key: u64) -> bool {
        self.0.check(&key).is_allowed()
    }
}

struct FloodgateCompact<S: Storage<u64, GcraState>>(KeyedLimiter<u64, Gcra, DefaultClock, S>);

impl<S: Storage<u64, GcraState>> Contender for FloodgateCompact<S> {
    #[inline]
    fn check(&self, key: u64) -> bool {
        self.0.check(&key).is_allowed()
    }
}

struct Governor<S: std::hash::BuildHasher + Clone + Default + Send + Sync>(
    governor::RateLimiter<
        u64,
        governor::state::keyed::DashMapStateStore<u64, S>,
        governor::clock::DefaultClock,
    >,
);

impl<S: std::hash::BuildHasher + Clone + Default + Send + Sync> Contender for Governor<S> {
    #[inline]
    fn check(&self, key: u64) -> bool {
        self.0.check_key(&key).is_ok()
    }
}

/// The same GCRA transition over a `Mutex<HashMap>`.
struct MutexMap {
    gcra: Gcra,
    clock: DefaultClock,
    map: Mutex<HashMap<u64, GcraState>>,
}

impl Contender for MutexMap {
    #[inline]
    fn check(&self, key: u64) -> bool {
        let now = self.clock.now();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let state = map.entry(key).or_default();
        let (decision, next) = self.gcra.decide(*state, now, 1);
        if let Some(next) = next {
            *state = next;
        }
        decision.is_allowed()
    }
}

/// The same GCRA transition on a `DashMap<u64, AtomicU64>` (shard read lock + CAS).
struct DashAtomic {
    gcra: Gcra,
    clock: DefaultClock,
    map: DashMap<u64, AtomicU64>,
}

impl Contender for DashAtomic {
    #[inline]
    fn check(&self, key: u64) -> bool {
        let now = self.clock.now();
        let word = match self.map.get(&key) {
            Some(word) => word,
            None => self
                .map
                .entry(key)
                .or_insert_with(|| AtomicU64::new(0))
                .downgrade(),
        };
        let mut current = word.load(Ordering::Relaxed);
        loop {
            let state = GcraState::from_tat(Nanos::new(current));
            let (decision, next) = self.gcra.decide(state, now, 1);
            let Some(next) = next else {
                return decision.is_allowed();
            };
            match word.compare_exchange_weak(
                current,
                next.tat().as_u64(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return decision.is_allowed(),
                Err(actual) => current = actual,
            }
        }
    }
}

fn contenders(capacity: usize) -> Vec<(&'static str, Box<dyn Contender>)> {
    vec![
        (
            "floodgate",
            Box::new(Floodgate(
                KeyedBuilder::new(Gcra::new(policy()))
                    .capacity(capacity)
                    .build()
                    .expect("valid"),
            )),
        ),
        (
            "floodgate-compact",
            Box::new(FloodgateCompact(
                KeyedBuilder::new(Gcra::new(policy()))
                    .capacity(capacity)
                    .build_inline()
                    .expect("valid"),
            )),
        ),
        (
            "floodgate-fingerprint",
            Box::new(FloodgateCompact(
                KeyedBuilder::new(Gcra::new(policy()))
                    .capacity(capacity)
                    .build_fingerprint()
                    .expect("valid"),
            )),
        ),
        (
            "governor",
            Box::new(Governor(governor::RateLimiter::dashmap_with_hasher(
                quota(),
                std::hash::RandomState::new(),
            ))),
        ),
        (
            "governor-ahash",
            Box::new(Governor(governor::RateLimiter::dashmap_with_hasher(
                quota(),
                ahash::RandomState::new(),
            ))),
        ),
        (
            "mutex-hashmap",
            Box::new(MutexMap {
                gcra: Gcra::new(policy()),
                clock: DefaultClock::new(),
                map: Mutex::new(HashMap::new()),
            }),
        ),
        (
            "dashmap-atomic",
            Box::new(DashAtomic {
                gcra: Gcra::new(policy()),
                clock: DefaultClock::new(),
                map: DashMap::new(),
            }),
        ),
    ]
}

/// A cyclic sequence of keys in `[base, base + n)`: uniform or Zipf(1.0), of a
/// power-of-two length.
fn keys(n: u64, base: u64, zipf: bool, seed: u64) -> Vec<u64> {
    let mut rng = StdRng::seed_from_u64(seed);
    // Long enough to touch (nearly) every key: a short cycle over a big table would
    // measure a cache-resident subset.
    let len = (2 * n as usize).next_power_of_two().max(1 << 16);
    if zipf {
        let dist = Zipf::new(n as f64, 1.0).expect("valid Zipf");
        (0..len)
            .map(|_| base + dist.sample(&mut rng) as u64 - 1)
            .collect()
    } else {
        (0..len).map(|_| base + rng.random_range(0..n)).collect()
    }
}

fn fill(c: &dyn Contender, keys: std::ops::Range<u64>) {
    for key in keys {
        black_box(c.check(key));
    }
}

fn uncontended(c: &mut Criterion) {
    for (n, label) in [(10_000u64, "10k"), (1_000_000, "1M")] {
        let all = contenders(n as usize);
        for (_, contender) in &all {
            fill(contender.as_ref(), 0..n);
        }
        for zipf in [false, true] {
            let dist = if zipf { "zipf" } else { "uniform" };
            let sequence = keys(n, 0, zipf, 1);
            let mut group = c.benchmark_group(format!("keyed/1-thread/{label}/{dist}"));
            group.throughput(Throughput::Elements(1));
            for (name, contender) in &all {
                group.bench_function(BenchmarkId::from_parameter(name), |b| {
                    let mut i = 0;
                    b.iter(|| {
                        i = (i + 1) & (sequence.len() - 1);
                        black_box(contender.check(sequence[i]))
                    });
                });
            }
            group.finish();
        }
    }
}

fn contended(c: &mut Criterion) {
    for (per_thread, label) in [(10_000u64, "10k-each"), (500_000, "500k-each")] {
        let all = contenders(2 * per_thread as usize);
        for (_, contender) in &all {
            fill(contender.as_ref(), 0..2 * per_thread);
        }
        for zipf in [false, true] {
            let dist = if zipf { "zipf" } else { "uniform" };
            let sequences = [
                keys(per_thread, 0, zipf, 1),
                keys(per_thread, per_thread, zipf, 2),
            ];
            let mut group = c.benchmark_group(format!("keyed/2-threads/{label}/{dist}"));
            // Two checks per iteration, one per thread: elements/s is the total.
            group.throughput(Throughput::Elements(2));
            for (name, contender) in &all {
                group.bench_function(BenchmarkId::from_parameter(name), |b| {
                    b.iter_custom(|iters| {
                        let start = Instant::now();
                        std::thread::scope(|s| {
                            for sequence in &sequences {
                                let contender = contender.as_ref();
                                s.spawn(move || {
                                    for i in 0..iters as usize {
                                        black_box(
                                            contender.check(sequence[i & (sequence.len() - 1)]),
                                        );
                                    }
                                });
                            }
                        });
                        start.elapsed()
                    });
                });
            }
            group.finish();
        }
    }
}

/// Heap bytes per key of each contender holding 1 million keys.
fn bytes_per_key() {
    const N: u64 = 1_000_000;
    eprintln!("heap bytes per key at {N} u64 keys (payload, excluding allocator overhead):");
    for index in 0..contenders(1).len() {
        let before = LIVE.load(Ordering::Relaxed);
        let mut all = contenders(N as usize);
        let (name, contender) = all.swap_remove(index);
        drop(all);
        fill(contender.as_ref(), 0..N);
        let bytes = LIVE.load(Ordering::Relaxed).saturating_sub(before);
        eprintln!("  {name:<22} {:>6.1}", bytes as f64 / N as f64);
        drop(contender);
    }
}

fn main() {
    bytes_per_key();
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    uncontended(&mut criterion);
    contended(&mut criterion);
    criterion.final_summary();
}
