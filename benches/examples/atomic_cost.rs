//! What one decision's atomics cost on this machine, apart from everything else: the
//! write each keyed contender makes per decision, timed alone over 16 384 words
//! visited in a scrambled order (cache-resident, as 10^4 keys are).
//!
//! ```text
//! cargo run -p floodgate-benches --profile bench --example atomic_cost -- 50000000 5
//! ```
//!
//! Arguments: operations per round, rounds. Rows:
//!
//! * `load` — one relaxed 64-bit load (the loop and the address, no write);
//! * `u64 load + CAS` — the keyed floor's write, and governor's per-key state update;
//! * `u128 load + CAS` — floodgate's inline slot (key and state in one 128-bit word,
//!   `portable-atomic`: `cmpxchg16b`, dispatched at run time unless the build enables
//!   the `cmpxchg16b` target feature);
//! * `lock word RMW ×2 + u64 load + CAS` — the shape of governor's keyed check: the
//!   DashMap shard's read lock taken and released (one atomic read-modify-write each)
//!   around the state's CAS.
//!
//! The rows alternate within each round; the median and range over rounds are printed.

use std::hint::black_box;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use portable_atomic::AtomicU128;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Words per array: a power of two, cache-resident (256 KiB of 16-byte words).
const WORDS: usize = 1 << 14;

/// The word operation `i` visits (a multiplicative hash of `i`: a scrambled order).
#[inline(always)]
fn index(i: u64) -> usize {
    (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 50) as usize & (WORDS - 1)
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
    let [ops, rounds] = args[..] else {
        eprintln!("usage: atomic_cost <operations per round> <rounds>");
        return ExitCode::from(2);
    };
    if ops == 0 || rounds == 0 {
        eprintln!("every argument must be positive");
        return ExitCode::from(2);
    }
    let narrow: Vec<AtomicU64> = (0..WORDS).map(|_| AtomicU64::new(0)).collect();
    let wide: Vec<AtomicU128> = (0..WORDS).map(|_| AtomicU128::new(0)).collect();
    // One lock word per 64 state words, as a table's shards share theirs.
    let locks: Vec<AtomicUsize> = (0..WORDS / 64).map(|_| AtomicUsize::new(0)).collect();

    let load = |i: u64| {
        black_box(narrow[index(i)].load(Ordering::Relaxed));
    };
    let cas64 = |i: u64| bump!(narrow[index(i)]);
    let cas128 = |i: u64| bump!(wide[index(i)]);
    let locked = |i: u64| {
        let slot = index(i);
        let lock = &locks[slot / 64];
        black_box(lock.fetch_add(4, Ordering::Acquire));
        bump!(narrow[slot]);
        black_box(lock.fetch_sub(4, Ordering::Release));
    };

    let names = [
        "load",
        "u64 load + CAS",
        "u128 load + CAS",
        "lock word RMW x2 + u64 load + CAS",
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
                _ => time(ops, locked),
            };
            figures[row].push(ns);
        }
    }
    for (name, mut ns) in names.iter().zip(figures) {
        ns.sort_by(f64::total_cmp);
        println!(
            "{name:<36} {:6.1} ns [{:.1}-{:.1}]",
            ns[ns.len() / 2],
            ns[0],
            ns[ns.len() - 1]
        );
    }
    ExitCode::SUCCESS
}
