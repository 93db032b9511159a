//! One step of learning a keyed table's shards through the public API (shared by the
//! `keyed`, `refunds` and `hot_keys` targets, each of which includes this file as a
//! module): at instant `i + 1` the `i`-th key is charged a unit at reading 0, which the
//! table judges at its shard's latest removal R — the instant the probe removed the
//! previous key of that shard at, or 0 — and then removed (R of that shard becomes
//! `i + 1`).

use floodgate::{Decision, Nanos, Receipt};
use std::fmt::Display;

/// Probes `key` with the clock at `at` (`charge` at reading 0, then `remove`), and
/// returns its class: a new one if judged at 0, else the class of the key probed at
/// the instant it was judged at (`class_at` of that key's index), whose latest
/// removal (`known`) that instant must be. `known[class]` is then `at`.
#[allow(dead_code)] // the `hot_keys` target probes through `probe_judged`
pub(crate) fn probe_key(
    key: impl Display,
    at: Nanos,
    charge: impl FnOnce() -> (Decision, Receipt),
    remove: impl FnOnce() -> bool,
    known: &mut Vec<Nanos>,
    class_at: impl FnOnce(usize) -> usize,
) -> usize {
    let judge = || {
        let (d, receipt) = charge();
        assert!(
            d.is_allowed(),
            "probe: fresh key {key} refused a unit: {d:?}"
        );
        receipt.charged_at().expect("an admitted unit is charged")
    };
    probe_judged(&key, at, judge, remove, known, class_at)
}

/// [`probe_key`] for a table that gives no receipts: `judge` charges the key a unit
/// at reading 0 and returns the instant the table judged that unit at.
pub(crate) fn probe_judged(
    key: impl Display,
    at: Nanos,
    judge: impl FnOnce() -> Nanos,
    remove: impl FnOnce() -> bool,
    known: &mut Vec<Nanos>,
    class_at: impl FnOnce(usize) -> usize,
) -> usize {
    let judged = judge();
    assert!(remove(), "probe: key {key} is not in its table");
    let class = match judged.as_u64() {
        0 => {
            known.push(Nanos::ZERO);
            known.len() - 1
        }
        j => {
            let class = class_at(usize::try_from(j - 1).expect("an index"));
            assert_eq!(
                known[class], judged,
                "probe: key {key} judged at {judged:?}, not its shard's latest removal"
            );
            class
        }
    };
    known[class] = at;
    class
}
