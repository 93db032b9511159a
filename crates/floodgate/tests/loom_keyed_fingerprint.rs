//! loom models of the fingerprint storage (the inline slot keyed by a 64-bit keyed
//! hash of the key): the shared keyed models (`loom_keyed_models`: insertion racing
//! with lookup, reclamation and eviction racing with a decision, a retired slot never
//! handing its state to another key, removal and reset racing with a check or a
//! refund) on `Fingerprint`, whose slot holds the fingerprint where the inline
//! storage holds the key's own bits. The slot-level models that place keys at
//! chosen slots (reuse, backward-shift moves) are the inline storage's
//! (`loom_keyed_compact`): the slot code is the same, only the encoding differs.
//!
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p floodgate --release --test loom_keyed_fingerprint`
#![cfg(loom)]

mod loom_keyed_models;

use floodgate::{Fingerprint, Gcra, KeyedLimiter, ManualClock};

type Fingerprinted = KeyedLimiter<u64, Gcra, ManualClock, Fingerprint>;

#[test]
fn two_inserts_of_one_key_admit_once() {
    loom_keyed_models::two_inserts_of_one_key_admit_once::<Fingerprinted>();
}

#[test]
fn lookup_racing_with_insertion_sees_a_whole_slot() {
    loom_keyed_models::lookup_racing_with_insertion_sees_a_whole_entry::<Fingerprinted>();
}

#[test]
fn reclaiming_an_idle_key_loses_no_charge() {
    loom_keyed_models::reclaiming_an_idle_key_loses_no_charge::<Fingerprinted>();
}

#[test]
fn a_retired_slot_never_hands_its_state_to_another_key() {
    loom_keyed_models::a_retired_slot_never_hands_its_state_to_another_key::<Fingerprinted>();
}

#[test]
fn evicting_a_live_key_racing_with_its_decision() {
    loom_keyed_models::evicting_a_live_key_racing_with_its_decision::<Fingerprinted>();
}

#[test]
fn removing_a_key_racing_a_check_read_earlier() {
    loom_keyed_models::a_removal_racing_a_check_read_earlier::<Fingerprinted>(
        loom_keyed_models::Removal::Remove,
    );
}

#[test]
fn resetting_a_key_racing_a_check_read_earlier() {
    loom_keyed_models::a_removal_racing_a_check_read_earlier::<Fingerprinted>(
        loom_keyed_models::Removal::Reset,
    );
}

#[test]
fn a_refund_racing_a_removal_never_lands_on_the_new_state() {
    loom_keyed_models::a_refund_racing_a_removal_never_lands_on_the_new_state::<Fingerprinted>(
        loom_keyed_models::Removal::Remove,
    );
}

#[test]
fn a_refund_racing_a_reset_never_lands_on_the_new_state() {
    loom_keyed_models::a_refund_racing_a_removal_never_lands_on_the_new_state::<Fingerprinted>(
        loom_keyed_models::Removal::Reset,
    );
}
