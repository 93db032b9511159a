//! loom models of the fingerprint storage (the inline slot keyed by a 64-bit keyed
//! hash of the key): the shared keyed models (`loom_keyed_models`: insertion racing
//! with lookup, reclamation and eviction racing with a decision, a retired slot never
//! handing its state to another key, removal and reset racing with a check or a
//! refund) on `Fingerprint`, whose slot holds the fingerprint where the inline
//! storage holds the key's own bits. The slot-level models that place keys at
//! chosen slots (reuse, backward-shift moves) are the inline storage's
//! (`loom_keyed_compact`): the slot code is the same, only the encoding differs.
//!
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=4 cargo test -p floodgate --release --test loom_keyed_fingerprint`
#![cfg(loom)]

#[macro_use]
mod loom_keyed_models;
mod loom_seen;

use floodgate::{Fingerprint, Gcra, KeyedLimiter, ManualClock};

type Fingerprinted = KeyedLimiter<u64, Gcra, ManualClock, Fingerprint>;

shared_keyed_models!(Fingerprinted, floodgate::Fingerprint);
