//! loom models of the keyed table (bodies in `loom_keyed_models`, shared with the
//! compact table): insertion racing with lookup, and reclamation and eviction racing
//! with a decision on the same key.
//!
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p floodgate --release --test loom_keyed`
#![cfg(loom)]

mod loom_keyed_models;

use floodgate::{Gcra, KeyedLimiter, ManualClock};
use loom_keyed_models as models;

type Keyed = KeyedLimiter<u64, Gcra, ManualClock>;

#[test]
fn two_inserts_of_one_key_admit_once() {
    models::two_inserts_of_one_key_admit_once::<Keyed>();
}

#[test]
fn lookup_racing_with_insertion_sees_a_whole_entry() {
    models::lookup_racing_with_insertion_sees_a_whole_entry::<Keyed>();
}

#[test]
fn reclaiming_an_idle_key_loses_no_charge() {
    models::reclaiming_an_idle_key_loses_no_charge::<Keyed>();
}

#[test]
fn a_retired_slot_never_hands_its_state_to_another_key() {
    models::a_retired_slot_never_hands_its_state_to_another_key::<Keyed>();
}

#[test]
fn evicting_a_live_key_racing_with_its_decision() {
    models::evicting_a_live_key_racing_with_its_decision::<Keyed>();
}
