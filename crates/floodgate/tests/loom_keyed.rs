//! loom models of the keyed table (bodies in `loom_keyed_models`, shared with the
//! compact table): insertion racing with lookup, reclamation and eviction racing
//! with a decision on the same key, and `remove` / `reset` racing with a check read
//! earlier or with a refund.
//!
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=4 cargo test -p floodgate --release --test loom_keyed`
#![cfg(loom)]

#[macro_use]
mod loom_keyed_models;
mod loom_seen;

use floodgate::{Gcra, KeyedLimiter, ManualClock};

type Keyed = KeyedLimiter<u64, Gcra, ManualClock>;

shared_keyed_models!(Keyed, floodgate::Heap);
