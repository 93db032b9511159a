//! What one decision's atomics cost on this machine, apart from everything else: the
//! write each keyed contender makes per decision, timed alone over words visited in a
//! scrambled order — 2^14 by default (cache-resident, as 10^4 keys are), or 2^N for a
//! third argument N (2^20 16-byte words are 16 MiB: a 10^6-key table's footprint).
//!
//! ```text
//! cargo run -p floodgate-benches --profile bench --example atomic_cost -- 50000000 5
//! cargo run -p floodgate-benches --profile bench --example atomic_cost -- 20000000 5 20
//! ```
//!
//! Arguments: operations per round, rounds, and optionally log2 of the words per array
//! (8 to 26). Rows:
//!
//! * `load` — one relaxed 64-bit load (the loop and the address, no write);
//! * `u64 load + CAS` — the keyed floor's write, and governor's per-key state update;
//! * `u128 load + CAS` — floodgate's inline slot (key and state in one 128-bit word,
//!   `portable-atomic`: `cmpxchg16b`, dispatched at run time unless the build enables
//!   the `cmpxchg16b` target feature);
//! * `lock word RMW x2 + u64 load + CAS` — the shape of governor's keyed check: the
//!   DashMap shard's read lock taken and released (one atomic read-modify-write each)
//!   around the state's CAS (256 lock words, cache-resident at any size, as a table's
//!   few shard locks are);
//! * `u128 load` — the inline slot's read alone (a probe step);
//! * `u64 load + CAS, 16-byte stride` — the 64-bit write over an array of 16-byte
//!   pairs: the same footprint as the `u128` array, so that the two differ only in the
//!   instruction;
//! * `u128 CAS, no load` — `cmpxchg16b` alone, on words of its own that stay zero
//!   (it expects zero, so it always succeeds and writes);
//! * `clock + …` — the `u64`, `u128` and locked rows with a decision's clock read
//!   before each (floodgate's `DefaultClock`), the value written depending on it as
//!   a GCRA step's does (`max(word, now) + 1`): what the wider write costs beside the
//!   time-stamp counter read every decision makes;
//! * `clock + u64 CAS, 16-byte stride` and `clock + pin + u64 CAS, 16-byte stride` —
//!   the write of an inline slot whose state half were CASed alone as 64 bits (the
//!   key half beside it, the same footprint as the `u128` row), bare and under a
//!   crossbeam-epoch pin (what the heap storage's readers take, and what a slot
//!   reused only after a grace period would need): the estimate of what that redesign
//!   could buy before its ABA argument is written (issue 10, BENCHMARKS.md).
//!
//! The rows alternate within each round; the median and range over rounds are printed.

use std::hint::black_box;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use crossbeam_epoch as epoch;
use floodgate::{Clock, DefaultClock};
use floodgate_bench::median_and_range;
use portable_atomic::AtomicU128;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Words per array unless the third argument says otherwise: 2^14, cache-resident
/// (256 KiB of 16-byte words).
const DEFAULT_LOG2_WORDS: u64 = 14;

/// The lock words of the locked row: as many as before the word count became an
/// argument (one per 64 of 2^14 words), and cache-resident at any word count, as a
/// table's few shard locks are.
const LOCKS: usize = 256;

/// The word operation `i` visits among `2^log2` (a multiplicative hash of `i`: a
/// scrambled order).
#[inline(always)]
fn index(i: u64, log2: u32) -> usize {
    (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - log2)) as usize
}

/// A decision's write on `word` (a `u64` or `u128` atomic): load it, then CAS it to
/// the next value.
macro_rules! bump {
    ($word:expr) => {{
        let word = &$word;
        let current = word.load(Ordering::Relaxed);
        let _ = black_box(word.compare_exchange_weak(
            current,
            current + 1,
            Ordering::AcqRel,
            Ordering::Relaxed,
        ));
    }};
}

/// A decision's write on `word` after a clock reading `now`: load it, then CAS it to
/// `max(word, now) + 1` (the stored value depends on the reading, as GCRA's does).
macro_rules! step {
    ($word:expr, $now:expr) => {{
        let word = &$word;
        let now = $now;
        let current = word.load(Ordering::Relaxed);
        let _ = black_box(word.compare_exchange_weak(
            current,
            current.max(now) + 1,
            Ordering::AcqRel,
            Ordering::Relaxed,
        ));
    }};
}

/// Nanoseconds per operation of `op` over `ops` operations.
fn time(ops: u64, mut op: impl FnMut(u64)) -> f64 {
    let start = Instant::now();
    for i in 0..ops {
        op(i);
    }
    start.elapsed().as_nanos() as f64 / ops as f64
}

fn main() -> ExitCode {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (ops, rounds, log2) = match args[..] {
        [ops, rounds] => (ops, rounds, DEFAULT_LOG2_WORDS),
        [ops, rounds, log2] => (ops, rounds, log2),
        _ => {
            eprintln!("usage: atomic_cost <operations per round> <rounds> [log2 of the words]");
            return ExitCode::from(2);
        }
    };
    if ops == 0 || rounds == 0 {
        eprintln!("every argument must be positive");
        return ExitCode::from(2);
    }
    if !(8..=26).contains(&log2) {
        eprintln!("log2 of the words must be 8 to 26");
        return ExitCode::from(2);
    }
    let log2 = log2 as u32;
    let words = 1usize << log2;
    let narrow: Vec<AtomicU64> = (0..words).map(|_| AtomicU64::new(0)).collect();
    let wide: Vec<AtomicU128> = (0..words).map(|_| AtomicU128::new(0)).collect();
    // The CAS-alone row's own words: they stay zero, so its CAS always succeeds.
    let zeros: Vec<AtomicU128> = (0..words).map(|_| AtomicU128::new(0)).collect();
    let pairs: Vec<[AtomicU64; 2]> = (0..words)
        .map(|_| [AtomicU64::new(0), AtomicU64::new(0)])
        .collect();
    let locks: Vec<AtomicUsize> = (0..LOCKS).map(|_| AtomicUsize::new(0)).collect();

    let load = |i: u64| {
        black_box(narrow[index(i, log2)].load(Ordering::Relaxed));
    };
    let cas64 = |i: u64| bump!(narrow[index(i, log2)]);
    let cas128 = |i: u64| bump!(wide[index(i, log2)]);
    let load128 = |i: u64| {
        black_box(wide[index(i, log2)].load(Ordering::Relaxed));
    };
    let cas64_wide_stride = |i: u64| bump!(pairs[index(i, log2)][1]);
    let cas128_alone = |i: u64| {
        let word = &zeros[index(i, log2)];
        let _ = black_box(word.compare_exchange(0, 0, Ordering::AcqRel, Ordering::Relaxed));
    };
    let locked = |i: u64| {
        let slot = index(i, log2);
        let lock = &locks[slot % LOCKS];
        black_box(lock.fetch_add(4, Ordering::Acquire));
        bump!(narrow[slot]);
        black_box(lock.fetch_sub(4, Ordering::Release));
    };
    let clock = DefaultClock::new();
    let clock_cas64 = |i: u64| step!(narrow[index(i, log2)], clock.now().as_u64());
    let clock_cas128 = |i: u64| step!(wide[index(i, log2)], u128::from(clock.now().as_u64()));
    let clock_locked = |i: u64| {
        let now = clock.now().as_u64();
        let slot = index(i, log2);
        let lock = &locks[slot % LOCKS];
        black_box(lock.fetch_add(4, Ordering::Acquire));
        step!(narrow[slot], now);
        black_box(lock.fetch_sub(4, Ordering::Release));
    };
    let clock_cas64_wide_stride = |i: u64| step!(pairs[index(i, log2)][1], clock.now().as_u64());
    let clock_pin_cas64_wide_stride = |i: u64| {
        let now = clock.now().as_u64();
        let guard = epoch::pin();
        step!(pairs[index(i, log2)][1], now);
        drop(black_box(guard));
    };

    let names = [
        "load",
        "u64 load + CAS",
        "u128 load + CAS",
        "lock word RMW x2 + u64 load + CAS",
        "u128 load",
        "u64 load + CAS, 16-byte stride",
        "u128 CAS, no load",
        "clock + u64 load + CAS",
        "clock + u128 load + CAS",
        "clock + lock word RMW x2 + u64 CAS",
        "clock + u64 CAS, 16-byte stride",
        "clock + pin + u64 CAS, 16-byte stride",
    ];
    let mut figures: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    for round in 1..=rounds {
        // Rotate the order between rounds, so no row always runs first.
        for k in 0..names.len() {
            let row = (k + round as usize) % names.len();
            let ns = match row {
                0 => time(ops, load),
                1 => time(ops, cas64),
                2 => time(ops, cas128),
                3 => time(ops, locked),
                4 => time(ops, load128),
                5 => time(ops, cas64_wide_stride),
                6 => time(ops, cas128_alone),
                7 => time(ops, clock_cas64),
                8 => time(ops, clock_cas128),
                9 => time(ops, clock_locked),
                10 => time(ops, clock_cas64_wide_stride),
                _ => time(ops, clock_pin_cas64_wide_stride),
            };
            figures[row].push(ns);
        }
    }
    for (name, ns) in names.iter().zip(figures) {
        println!("{name:<40} {} ns", median_and_range(ns));
    }
    ExitCode::SUCCESS
}
