//! Admissions still held and the window bounds over them: what the targets that hold
//! admissions to a bound share (`refunds`, `plans`).

use floodgate::Decision;

/// An admission still held: where it counts and how much (each target says in what).
#[derive(Clone, Copy, Debug)]
pub struct Grant {
    pub id: u64,
    pub at: u64,
    pub cost: u64,
}

/// The fixed window (of `p` ns) that an admission judged at `judged` counts in: the
/// one its `reset_after` ends (a reading behind the state's window counts in the
/// state's).
pub fn fixed_window_of(judged: u64, d: &Decision, p: u64) -> u64 {
    (judged + d.reset_after_nanos()).saturating_sub(1) / p
}

/// The sliding counter's window (of `p` ns) that an admission judged at `judged`
/// counts in, and how far into it the admission was judged (0 when it was judged
/// behind it): after an admission `cur > 0`, and `reset_after` runs to the end of the
/// window after it.
pub fn sliding_window_of(judged: u64, d: &Decision, p: u64) -> (u64, u64) {
    let w = ((judged + d.reset_after_nanos()) / p).saturating_sub(2);
    let e = if judged / p == w { judged - w * p } else { 0 };
    (w, e)
}

/// The units held in window `w`.
pub fn in_window(held: &[Grant], w: u64) -> u64 {
    held.iter().filter(|g| g.at == w).map(|g| g.cost).sum()
}

/// Drops grant `id` (its refund succeeded); whether it was held.
pub fn release(held: &mut Vec<Grant>, id: u64) -> bool {
    let before = held.len();
    held.retain(|g| g.id != id);
    held.len() < before
}

/// The fixed window's bound: window `at` holds at most `limit` units.
pub fn assert_fixed(held: &[Grant], at: u64, limit: u64) {
    let units = in_window(held, at);
    assert!(
        units <= limit,
        "window {at} holds {units} > {limit}: {held:?}"
    );
}

/// The sliding counter's bound after an admission `e` ns into window `at` (of `p`
/// ns): `⌊prev·(P − e)/P⌋ + cur ≤ L`.
pub fn assert_sliding(held: &[Grant], at: u64, e: u64, p: u64, limit: u64) {
    let prev = at.checked_sub(1).map_or(0, |w| in_window(held, w));
    let cur = in_window(held, at);
    let weighted = (u128::from(prev) * u128::from(p - e) / u128::from(p)) as u64;
    assert!(
        weighted + cur <= limit,
        "window {at} at {e} ns in: prev {prev}, cur {cur} > {limit}: {held:?}"
    );
}
