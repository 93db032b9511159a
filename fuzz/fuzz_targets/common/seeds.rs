//! Fixed hash seeds (shared by the `keyed` and `plans` targets, each of which includes
//! this file as a module): every keyed table of the process spreads keys over its
//! shards (and fingerprints them) the same way, so that a multi-shard failure
//! reproduces from its input alone.
//!
//! A table's `ahash::RandomState::new()` mixes fixed keys with a per-table seed from
//! `ahash`'s random source. Under `--cfg fuzzing` (cargo-fuzz sets it) the fixed keys
//! are constants rather than read from the OS; this source makes the per-table seed
//! a constant too.

struct FixedSeeds;

impl ahash::random_state::RandomSource for FixedSeeds {
    fn gen_hasher_seed(&self) -> usize {
        0x5eed
    }
}

/// Fixes the seeds; call it first in every run (it acts once per process, before any
/// table exists).
pub(crate) fn fix_hash_seeds() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        assert!(
            ahash::random_state::set_random_source(FixedSeeds).is_ok(),
            "a hasher was made before the seeds were fixed"
        );
    });
}
