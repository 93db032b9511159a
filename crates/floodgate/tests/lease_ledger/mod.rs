//! The lease tests' ledger: what a quiescent look at a [`LeasedGcra`] finds, and the
//! accounts asserted between two such looks (`a` before some decisions, `b` after):
//! no unit counted twice, and the module's bound.
#![allow(dead_code)]

use std::time::Duration;

use floodgate::{LeasedGcra, ManualClock, Nanos, Policy};

/// A limiter of `burst` at 1/s over `shards` shards of leases of `lease` units that
/// live an hour, on a manual clock standing at 10 s.
pub fn limiter(burst: u64, lease: u32, shards: usize) -> LeasedGcra<ManualClock> {
    let clock = ManualClock::starting_at(Nanos::new(10_000_000_000));
    limiter_on(&clock, 1, burst, lease, shards)
}

/// A limiter of `burst` at `per_second`/s over `shards` shards of leases of `lease`
/// units that live an hour, on `clock`.
pub fn limiter_on(
    clock: &ManualClock,
    per_second: u64,
    burst: u64,
    lease: u32,
    shards: usize,
) -> LeasedGcra<ManualClock> {
    LeasedGcra::builder(
        Policy::per_second(per_second)
            .unwrap()
            .with_burst(burst)
            .unwrap(),
    )
    .shards(shards)
    .lease_size(lease)
    .lifetime(Duration::from_secs(3_600))
    .build_with_clock(clock.clone())
    .unwrap()
}

/// A quiescent look at a limiter (no decision in flight).
#[derive(Clone, Copy, Debug)]
pub struct Look {
    /// The central word's remaining (a report: nothing written).
    pub central: u64,
    /// Units unexpired at the looking thread's expiry reading.
    pub on_lease: u64,
    /// Units the shard words hold, expired or not.
    pub held: u64,
}

/// Looks at `limiter` (`&mut`: nothing decides meanwhile).
pub fn look(limiter: &mut LeasedGcra<ManualClock>) -> Look {
    Look {
        central: limiter.check_on(0, 0).remaining(),
        on_lease: limiter.units_on_lease(),
        held: limiter.units_held(),
    }
}

/// Between looks `a` and `b`, with `admitted` units admitted and the refill clock
/// moved `refills` whole T, `out` of the units at `a` spendable later (on lease, or
/// held where the expiry clock may step back): every unit admitted or held at `b` was
/// held at `a` or handed out by the central word since (none counted twice), and
/// admitted ≤ the central word's remaining at `a` + `refills` + `out`.
pub fn assert_accounted(
    limiter: &LeasedGcra<ManualClock>,
    (a, b): (Look, Look),
    admitted: u64,
    refills: u64,
    out: u64,
    context: &str,
) {
    let handed_out = (a.central + refills)
        .checked_sub(b.central)
        .unwrap_or_else(|| {
            panic!("{context}: the central word gained more than its clock gave: {a:?} {b:?}")
        });
    assert!(
        admitted + b.held <= a.held + handed_out,
        "{context}: a unit counted twice: admitted {admitted}, held {} at b, at a {a:?}, the \
         central word handed out {handed_out}",
        b.held
    );
    assert!(
        admitted <= a.central + refills + out,
        "{context}: admitted {admitted} past the central word's {} + {refills} T + {out} out \
         at a",
        a.central
    );
    assert!(
        admitted <= limiter.policy().burst() + refills + out,
        "{context}: admitted {admitted} past B + {refills} T + {out}"
    );
    assert!(
        b.held <= limiter.shard_count() as u64 * u64::from(limiter.lease_size()),
        "{context}: shards hold {} units",
        b.held
    );
}

/// Under loom: one model thread per entry of `costs`, each deciding its costs in
/// order on `limiter`, while the calling thread runs `meanwhile`; the units they
/// admitted, together, once all have exited.
#[cfg(loom)]
pub fn admitted_on_threads(
    limiter: &loom::sync::Arc<LeasedGcra<ManualClock>>,
    costs: &[&'static [u32]],
    meanwhile: impl FnOnce(),
) -> u64 {
    admitted_on_threads_marked(limiter, costs, |_| 0, meanwhile).0
}

/// [`admitted_on_threads`], with the deciding thread of `costs[i]` reading `mark(i)`
/// just before its first decision and just after its last (a `loom_seen::Span`'s
/// mark, say, that `meanwhile` moves around a step of its own; a constant for a
/// thread whose placement the model does not ask, which adds no step to loom's
/// search): the units admitted, and each thread's two readings, in the order of
/// `costs`.
#[cfg(loom)]
pub fn admitted_on_threads_marked<M>(
    limiter: &loom::sync::Arc<LeasedGcra<ManualClock>>,
    costs: &[&'static [u32]],
    mark: M,
    meanwhile: impl FnOnce(),
) -> (u64, Vec<(u8, u8)>)
where
    M: Fn(usize) -> u8 + Clone + Send + 'static,
{
    let handles: Vec<_> = costs
        .iter()
        .enumerate()
        .map(|(i, &costs)| {
            let limiter = loom::sync::Arc::clone(limiter);
            let mark = mark.clone();
            loom::thread::spawn(move || {
                let before = mark(i);
                let admitted = costs
                    .iter()
                    .filter(|&&c| limiter.check_n(c).is_allowed())
                    .map(|&c| u64::from(c))
                    .sum::<u64>();
                (admitted, (before, mark(i)))
            })
        })
        .collect();
    meanwhile();
    let mut admitted = 0;
    let mut marks = Vec::with_capacity(handles.len());
    for h in handles {
        let (units, read) = h.join().unwrap();
        admitted += units;
        marks.push(read);
    }
    (admitted, marks)
}

/// On a standing clock, once every deciding thread has exited: the central word
/// handed out exactly the burst, and every unit is admitted (net of refunds), held
/// on a lease (at most `shards × lease`), or still in the central word.
pub fn assert_conserved(
    mut lim: LeasedGcra<ManualClock>,
    admitted: u64,
    burst: u64,
    lease: u32,
    shards: usize,
) {
    let central = lim.check_on(0, 0).remaining();
    let held = lim.units_held();
    assert!(admitted <= burst, "admitted {admitted} > burst {burst}");
    assert_eq!(
        admitted + held + central,
        burst,
        "admitted {admitted} + held {held} + central {central}"
    );
    assert!(held <= shards as u64 * u64::from(lease));
}
