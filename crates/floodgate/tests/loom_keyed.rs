//! loom models of the keyed table (bodies in `loom_keyed_models`, shared with the
//! compact table): insertion racing with lookup, reclamation and eviction racing
//! with a decision on the same key, and `remove` / `reset` racing with a check read
//! earlier or with a refund.
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

#[test]
fn removing_a_key_racing_a_check_read_earlier() {
    models::a_removal_racing_a_check_read_earlier::<Keyed>(models::Removal::Remove);
}

#[test]
fn resetting_a_key_racing_a_check_read_earlier() {
    models::a_removal_racing_a_check_read_earlier::<Keyed>(models::Removal::Reset);
}

#[test]
fn a_refund_racing_a_removal_never_lands_on_the_new_state() {
    models::a_refund_racing_a_removal_never_lands_on_the_new_state::<Keyed>(
        models::Removal::Remove,
    );
}

#[test]
fn a_refund_racing_a_reset_never_lands_on_the_new_state() {
    models::a_refund_racing_a_removal_never_lands_on_the_new_state::<Keyed>(models::Removal::Reset);
}
