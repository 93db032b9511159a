//! Bytes per key through the counting allocator: what it counts, and each keyed
//! table's footprint at 100 000 keys (every table holds at least a key word and a
//! state word per key; floodgate's inline storage at most the 24 bytes per key the
//! README claims at 1 million keys).

use std::alloc::System;

use floodgate_bench::matrix::keyed_tables;
use floodgate_bench::memory::{allocated_by, counting, footprint, Counting};

#[global_allocator]
static GLOBAL: Counting<System> = Counting::new(System);

#[test]
fn allocations_reallocations_and_frees_are_counted_per_thread() {
    assert!(counting());
    let (kept, bytes) = allocated_by(|| {
        // Grown by reallocation from 1 element, then shrunk to fit.
        let mut v: Vec<u64> = Vec::with_capacity(1);
        v.extend(0..1_000);
        v.shrink_to_fit();
        let _freed = vec![0u8; 1 << 16];
        v
    });
    assert_eq!((kept.len(), bytes), (1_000, 8_000));
    let (_, freed) = allocated_by(|| drop(kept));
    assert_eq!(freed, -8_000);
    // Another thread's megabyte is its own: only the spawn's bookkeeping lands here.
    let (theirs, here) = allocated_by(|| {
        std::thread::spawn(|| vec![1u8; 1 << 20])
            .join()
            .expect("the thread runs")
    });
    assert_eq!(theirs.len(), 1 << 20);
    assert!(here < 1 << 16, "{here}");
}

#[test]
fn every_keyed_table_holds_at_least_two_words_per_key_and_inline_at_most_24_bytes() {
    const KEYS: u64 = 100_000;
    let footprints: Vec<_> = keyed_tables()
        .iter()
        .map(|table| footprint(table, KEYS))
        .collect();
    for f in &footprints {
        eprintln!("{:<22} {:>6.1} B/key", f.id, f.bytes_per_key());
        assert_eq!(f.keys, KEYS);
        // A u64 key and an 8-byte state (or a 64-bit fingerprint and the state).
        assert!(f.bytes_per_key() >= 16.0, "{f:?}");
    }
    let inline = footprints
        .iter()
        .find(|f| f.id == "floodgate_inline")
        .expect("the inline table is measured");
    assert!(inline.bytes_per_key() <= 24.0, "{inline:?}");
}
