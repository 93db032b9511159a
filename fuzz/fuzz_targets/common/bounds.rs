//! The bound each algorithm's admissions are held to, over the admissions still held
//! (shared by the `refunds` and `keyed` targets, each of which includes this file as
//! a module; a target may use only part of it).
#![allow(dead_code)]

use floodgate::{Decision, ManualClock, Nanos, Policy, RateLimiter};

/// The bound an algorithm is held to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Gcra,
    Fixed,
    Sliding,
    Log,
}

/// An admission still held: where it counts and how much.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Grant {
    pub(crate) id: u64,
    /// GCRA: the instant it was judged at (a booking: its slot); fixed window and
    /// sliding counter: its window's index; sliding log: the instant it is logged at.
    pub(crate) at: u64,
    pub(crate) cost: u64,
}

/// One limit's held admissions and the bound they must meet.
pub(crate) struct Oracle {
    pub(crate) kind: Kind,
    /// GCRA: the policy the held admissions must conform to (the most generous one a
    /// `LiveGcra` has had).
    pub(crate) policy: Policy,
    pub(crate) limit: u64,
    pub(crate) period: u64,
    /// Windows: the latest window any admission counted in; the log: the latest
    /// instant any admission was logged at (refunded or not: states never go back).
    pub(crate) latest: Option<u64>,
    pub(crate) held: Vec<Grant>,
    pub(crate) next: u64,
    /// Whether `latest` is known, so that where an admission counts is checked against
    /// it (a keyed key that may have been evicted unseen has lost it).
    pub(crate) contract: bool,
}

impl Oracle {
    pub(crate) fn new(kind: Kind, policy: Policy) -> Oracle {
        Oracle {
            kind,
            policy,
            limit: policy.limit(),
            period: policy.period_nanos(),
            latest: None,
            held: Vec::new(),
            next: 0,
            contract: true,
        }
    }

    /// Forgets every admission: the state they counted in was removed (a keyed key
    /// evicted or removed starts afresh).
    pub(crate) fn forget(&mut self) {
        self.held.clear();
        self.latest = None;
        self.contract = true;
    }

    /// Records an admission of `cost` judged at `judged` (a booking: ready at `slot`)
    /// with decision `d`, asserts the bound, and returns the grant's id (`None` when
    /// it took nothing).
    pub(crate) fn admit(
        &mut self,
        judged: u64,
        slot: Option<u64>,
        d: &Decision,
        cost: u32,
    ) -> Option<u64> {
        if !d.is_allowed() || cost == 0 {
            return None;
        }
        let p = self.period;
        // In `u128`: a window near the top of `u64` may end past it.
        let end = u128::from(judged) + u128::from(d.reset_after_nanos());
        let narrow = |x: u128| u64::try_from(x).expect("an instant or window index");
        let (at, elapsed, want) = match self.kind {
            Kind::Gcra => (slot.unwrap_or(judged), 0, None),
            Kind::Fixed => {
                // The window ending at `end`; a reading behind the state's window counts
                // in the state's.
                let w = narrow((end - 1) / u128::from(p));
                (w, 0, Some((judged / p).max(self.latest.unwrap_or(0))))
            }
            Kind::Sliding => {
                // After an admission `cur > 0`: reset_after runs to the end of window w + 1.
                let w = narrow(end / u128::from(p)).saturating_sub(2);
                let e = if judged / p == w { judged - w * p } else { 0 };
                (w, e, Some((judged / p).max(self.latest.unwrap_or(0))))
            }
            Kind::Log => {
                let t = narrow(end.saturating_sub(u128::from(p)));
                (t, 0, Some(judged.max(self.latest.unwrap_or(0))))
            }
        };
        let id = self.next;
        self.next += 1;
        self.held.push(Grant {
            id,
            at,
            cost: u64::from(cost),
        });
        self.check(at, elapsed);
        if let Some(want) = want.filter(|_| self.contract) {
            assert_eq!(
                at, want,
                "{:?}: admission judged at {judged} counted at {at}, not {want}: {d:?}",
                self.kind
            );
            self.latest = Some(want);
        }
        Some(id)
    }

    /// The bound over the held admissions, after an admission that counts at `at`.
    pub(crate) fn check(&self, at: u64, elapsed: u64) {
        let (l, p) = (self.limit, self.period);
        match self.kind {
            Kind::Gcra => {
                let mut grants: Vec<(u64, u64)> =
                    self.held.iter().map(|g| (g.at, g.cost)).collect();
                grants.sort_unstable();
                let fresh = RateLimiter::gcra_with_clock(self.policy, ManualClock::new());
                for &(t, cost) in &grants {
                    assert!(
                        fresh.check_n_at(Nanos::new(t), cost as u32).is_allowed(),
                        "{cost} at {t} ns passes {:?}: held {grants:?}",
                        self.policy
                    );
                }
            }
            Kind::Fixed => {
                let units: u64 = self.in_window(at);
                assert!(
                    units <= l,
                    "window {at} holds {units} > {l}: {:?}",
                    self.held
                );
            }
            Kind::Sliding => {
                let prev = at.checked_sub(1).map_or(0, |w| self.in_window(w));
                let cur = self.in_window(at);
                let weighted = (u128::from(prev) * u128::from(p - elapsed) / u128::from(p)) as u64;
                assert!(
                    weighted + cur <= l,
                    "window {at} at {elapsed} ns in: prev {prev}, cur {cur} > {l}: {:?}",
                    self.held
                );
            }
            Kind::Log => {
                let mut units: Vec<(u64, u64)> = self.held.iter().map(|g| (g.at, g.cost)).collect();
                units.sort_unstable();
                let (mut from, mut sum) = (0, 0);
                for (i, &(t, cost)) in units.iter().enumerate() {
                    sum += cost;
                    while t - units[from].0 >= p {
                        sum -= units[from].1;
                        from += 1;
                    }
                    if units.get(i + 1).is_some_and(|&(next, _)| next == t) {
                        continue;
                    }
                    assert!(
                        sum <= l,
                        "{sum} units within P = {p} ns before {t} ns: {units:?}"
                    );
                }
            }
        }
    }

    pub(crate) fn in_window(&self, w: u64) -> u64 {
        self.held.iter().filter(|g| g.at == w).map(|g| g.cost).sum()
    }

    /// Drops grant `id` (its refund succeeded); whether it was held.
    pub(crate) fn release(&mut self, id: u64) -> bool {
        let before = self.held.len();
        self.held.retain(|g| g.id != id);
        self.held.len() < before
    }
}
