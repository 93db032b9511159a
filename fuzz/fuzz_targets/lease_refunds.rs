//! `LeasedGcra`'s receipts and refunds across real threads, held to the documented
//! bound and to the claims its proof rests on ("Back to the central word", "A full
//! lease" in `LeasedGcra::refund`).
//!
//! Four threads (the fuzzer's and three helpers kept for the process, so four fixed
//! owner indices) charge, check and refund on one limiter of 1, 2 or 4 shards (so a
//! thread may own no shard), burst 1 to 8, leases of 1 to B units living one 65.5 µs
//! tick to 200 ms, T of 1, 7 or 50 ms. A receipt is refunded on any thread, the
//! charging one or another (back to the central word), after any clock moves (its
//! lease expired, replaced by a refill that carried units over, its booking partly
//! or wholly passed), into a lease with or without room (a full lease: the rest to
//! the central word), costs 0 to 7 (above the lease size too). The limiter's clock
//! (refills, central refunds) only moves forward: a refund is exact only under the
//! `Clock` premise, every admission it sees read no later than it. Where the input
//! asks, lease expiry reads a coarse clock of its own (`Expiry::Coarse` over quanta's
//! mock) that lags the refill clock by an amount the input moves both ways (ahead of
//! it too, and a larger lag steps it back), stalls and resumes, and reads before
//! the limiter's origin when far behind: leases dated at ticks behind later ones,
//! receipts of expired leases refunded into leases of their tick again.
//!
//! Every operation runs alone (a helper's job is awaited), so between operations
//! the target reads the limiter quiescent: `units_held` (every unit in a shard word,
//! expired or not) and the central word's deficit `TAT − now` (`peek(0)`'s reset,
//! exact to the nanosecond). Per event (a charge, a check or a refund, each at the
//! clock's reading then) it keeps the reading, the deficit and the units held before
//! it, and the costs of the receipts outstanding before it. Checked:
//!
//! * **A refund** gives back no more than its charge: `lease units back · T +
//!   central nanoseconds back ≤ cost · T` (the lease part read from `units_held`,
//!   the central part from the deficit at one reading); answers `true` exactly when
//!   something came back; puts nothing on a lease from a thread other than the
//!   charging one (another owner index, another shard); never raises the deficit.
//!   A decision never lowers it, and no shard holds more than the lease size.
//! * **The central refunds of earlier receipts** (the docs' bound argument): for
//!   every event `i` (reading `a`) and every later central refund of a receipt
//!   charged before `i` that gave anything back, everything central refunds gave
//!   back from `i` up to and including it is at most the deficit before `i`.
//! * **The documented bound** (issue 14's): over every run of events `i..=j`
//!   (readings `a ≤ b`), units admitted less the costs of the charges made in it
//!   and refunded (`true`) in it `≤ B + ⌊(b − a)/T⌋ +` the units on lease before
//!   `i` (with the coarse expiry clock every unit held, expired or not) `+` the costs of the receipts outstanding before `i` that are still refundable to
//!   their lease: with the fresh expiry clock, those charged less than a lease
//!   lifetime (in 65.5 µs ticks) before `a`, whose lease may be unexpired at `a`;
//!   with the coarse one every receipt outstanding (it may step back, and a
//!   receipt of a lease expired at `a` can go back to it: the docs' "Clocks").
#![no_main]

#[path = "common/clock.rs"]
mod clock;

use arbitrary::Arbitrary;
use clock::AnyClock;
use floodgate::lease::{CoarseClock, Expiry};
use floodgate::{LeasedGcra, Nanos, Policy, Receipt};
use libfuzzer_sys::fuzz_target;
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::Duration;

#[derive(Arbitrary, Debug)]
enum Op {
    /// `charge(cost % 8)` on thread `thread % 4`; the receipt is kept.
    Charge { thread: u8, cost: u8 },
    /// `check_n(cost % 8)` on thread `thread % 4` (an admission without a receipt).
    Check { thread: u8, cost: u8 },
    /// Refunds outstanding receipt `pick` (modulo their number) on thread `thread % 4`.
    Refund { thread: u8, pick: u8 },
    /// The clock moves on `step × 25 µs`.
    Advance { step: u16 },
    /// The coarse expiry clock's lag behind the refill clock, in 25 µs (negative:
    /// ahead of it); raising it steps the expiry clock back.
    Lag { lag: i16 },
    /// Stalls the coarse expiry clock, or lets it move again.
    Stall,
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// Bits 0–2: the burst − 1; bits 3–4: T.
    policy: u8,
    lease: u8,
    lifetime: u8,
    /// Bits 0–1: the shards; bit 7: the coarse expiry clock.
    shards: u8,
    ops: Vec<Op>,
}

const THREADS: usize = 4;
const MAX_OPS: usize = 300;
const START: u64 = 1_000_000_000_000;
const STEP: u64 = 25_000;
/// A lease's tick: 2^16 ns.
const TICK: u64 = 1 << 16;

/// A job for a helper thread.
type Job = Box<dyn FnOnce() + Send>;

/// The helper threads, spawned once in order after the fuzzer's thread took an owner
/// index, each taking one before the next starts: four threads of fixed indices.
fn helpers() -> &'static [Mutex<mpsc::Sender<Job>>] {
    static HELPERS: OnceLock<Vec<Mutex<mpsc::Sender<Job>>>> = OnceLock::new();
    HELPERS.get_or_init(|| {
        let probe = Arc::new(
            LeasedGcra::builder(Policy::per_second(1).unwrap())
                .shards(1)
                .build_with_clock(AnyClock::default())
                .unwrap(),
        );
        let _ = probe.owns_shard();
        (1..THREADS)
            .map(|_| {
                let (job_tx, job_rx) = mpsc::channel::<Job>();
                std::thread::spawn(move || {
                    for job in job_rx {
                        job();
                    }
                });
                let helper = Mutex::new(job_tx);
                let probe = Arc::clone(&probe);
                run_on(&helper, move || probe.owns_shard());
                helper
            })
            .collect()
    })
}

fn run_on<R: Send + 'static>(
    helper: &Mutex<mpsc::Sender<Job>>,
    job: impl FnOnce() -> R + Send + 'static,
) -> R {
    let (answer_tx, answer_rx) = mpsc::channel();
    let job: Job = Box::new(move || {
        let _ = answer_tx.send(job());
    });
    helper.lock().unwrap().send(job).unwrap();
    answer_rx.recv().unwrap()
}

/// Runs `job` on thread `thread` (0: this one).
fn on_thread<R: Send + 'static>(thread: usize, job: impl FnOnce() -> R + Send + 'static) -> R {
    match thread {
        0 => job(),
        t => run_on(&helpers()[t - 1], job),
    }
}

/// The coarse expiry clock (`Expiry::Coarse` over quanta's mock): it reads the
/// refill reading less the lag (never below 0) unless stalled, counted from the mock
/// at `START` (the limiter's origin is `START + 1 s` on it).
struct CoarseDrive {
    mock: Arc<quanta::Mock>,
    value: u64,
    lag: i64,
    stalled: bool,
}

impl CoarseDrive {
    fn new() -> (CoarseDrive, Expiry) {
        let (clock, mock) = quanta::Clock::mock();
        mock.increment(START);
        let expiry = Expiry::Coarse(CoarseClock::with_clock(clock));
        mock.increment(1_000_000_000);
        let drive = CoarseDrive {
            mock,
            value: START + 1_000_000_000,
            lag: 0,
            stalled: false,
        };
        (drive, expiry)
    }

    fn follow(&mut self, base: u64) {
        if self.stalled {
            return;
        }
        let to = base.saturating_add_signed(-self.lag * STEP as i64);
        if to > self.value {
            self.mock.increment(to - self.value);
        } else {
            self.mock.decrement(self.value - to);
        }
        self.value = to;
    }
}

/// One event: a charge, a check or a refund, and the limiter before it.
#[derive(Debug, Default)]
struct Event {
    reading: u64,
    /// The central word's `TAT − reading` before the event.
    deficit: u64,
    /// `units_held` before the event.
    held: u64,
    /// The units out on lease before the event, for the bound: with the fresh expiry
    /// clock the unexpired ones (`units_on_lease`), with the coarse one every unit
    /// held (it may step back: the docs' "Clocks").
    on_lease: u64,
    /// The costs of the receipts outstanding before the event: every one with the
    /// coarse expiry clock; with the fresh one, those whose lease may be unexpired
    /// (charged less than a lifetime of ticks before, to the tick: the lease they
    /// were spent from was taken no later than the charge, so it expires by then).
    outstanding: u64,
    admitted: u64,
    /// A refund: the event of its charge, that charge's cost, the answer and the
    /// nanoseconds the central word gave back.
    refund: Option<(usize, u64, bool, u64)>,
}

/// An outstanding receipt: the event and thread of its charge.
struct Held {
    event: usize,
    thread: usize,
    receipt: Receipt,
}

fn policy(input: &Input) -> (Policy, u64, u64) {
    let burst = u64::from(input.policy % 8) + 1;
    let t = match (input.policy >> 3) % 3 {
        0 => 1_000_000,
        1 => 7_000_000,
        _ => 50_000_000,
    };
    let policy = Policy::new(1, Duration::from_nanos(t))
        .and_then(|p| p.with_burst(burst))
        .unwrap();
    assert_eq!(policy.interval_nanos(), t);
    (policy, burst, t)
}

fn lifetime(input: &Input) -> Duration {
    Duration::from_nanos(match input.lifetime % 5 {
        0 => TICK,
        1 => 300_000,
        2 => 2_000_000,
        3 => 20_000_000,
        _ => 200_000_000,
    })
}

fuzz_target!(|input: Input| {
    helpers();
    let (policy, burst, t) = policy(&input);
    let lease_size = u32::from(input.lease) % burst as u32 + 1;
    let shards = 1usize << (input.shards % 3);
    let clock = AnyClock::default();
    clock.set(Nanos::new(START));
    let builder = LeasedGcra::builder(policy)
        .shards(shards)
        .lease_size(lease_size)
        .lifetime(lifetime(&input));
    let (mut coarse, leased) = if input.shards & 0x80 != 0 {
        let (drive, expiry) = CoarseDrive::new();
        (
            Some(drive),
            builder.build_with(clock.clone(), expiry).unwrap(),
        )
    } else {
        (None, builder.build_with_clock(clock.clone()).unwrap())
    };
    let leased = Arc::new(leased);
    // The fresh expiry clock's ticks (its origin is `START`) and the lease lifetime's.
    let tick = |reading: u64| (reading - START) >> 16;
    let life = (lifetime(&input).as_nanos() >> 16) as u64;
    let deficit = || leased.peek(0).reset_after_nanos();
    let mut base = START;
    let mut events: Vec<Event> = Vec::new();
    let mut held: Vec<Held> = Vec::new();
    // Refunds: to the lease, to the central word, both, nothing; on another thread.
    let mut stats = [0u64; 5];
    for op in input.ops.iter().take(MAX_OPS) {
        match *op {
            Op::Advance { step } => {
                base += u64::from(step) * STEP;
                continue;
            }
            Op::Lag { lag } => {
                if let Some(c) = coarse.as_mut() {
                    c.lag = i64::from(lag);
                }
                continue;
            }
            Op::Stall => {
                if let Some(c) = coarse.as_mut() {
                    c.stalled = !c.stalled;
                }
                continue;
            }
            Op::Refund { .. } if held.is_empty() => continue,
            _ => {}
        }
        clock.set(Nanos::new(base));
        if let Some(c) = coarse.as_mut() {
            c.follow(base);
        }
        let mut event = Event {
            reading: base,
            deficit: deficit(),
            held: leased.units_held(),
            on_lease: if coarse.is_some() {
                leased.units_held()
            } else {
                leased.units_on_lease()
            },
            outstanding: held
                .iter()
                .filter(|h| coarse.is_some() || tick(base) < tick(events[h.event].reading) + life)
                .map(|h| u64::from(h.receipt.cost()))
                .sum(),
            ..Event::default()
        };
        let index = events.len();
        match *op {
            Op::Charge { thread, cost } | Op::Check { thread, cost } => {
                let thread = usize::from(thread) % THREADS;
                let cost = u32::from(cost % 8);
                let l = Arc::clone(&leased);
                let (allowed, receipt) = if let Op::Charge { .. } = *op {
                    let (d, receipt) = on_thread(thread, move || l.charge(cost));
                    if receipt.is_charged() {
                        assert!(
                            d.is_allowed() && receipt.cost() == cost,
                            "{d:?} {receipt:?}"
                        );
                    }
                    (d.is_allowed(), Some(receipt))
                } else {
                    (
                        on_thread(thread, move || l.check_n(cost)).is_allowed(),
                        None,
                    )
                };
                if allowed {
                    event.admitted = u64::from(cost);
                }
                let after = deficit();
                assert!(
                    after >= event.deficit,
                    "a decision lowered the central deficit: {} to {after}",
                    event.deficit
                );
                if let Some(receipt) = receipt.filter(Receipt::is_charged) {
                    held.push(Held {
                        event: index,
                        thread,
                        receipt,
                    });
                }
            }
            Op::Refund { thread, pick } => {
                let thread = usize::from(thread) % THREADS;
                let h = held.remove(usize::from(pick) % held.len());
                let cost = u64::from(h.receipt.cost());
                let l = Arc::clone(&leased);
                let receipt = h.receipt;
                let answer = on_thread(thread, move || l.refund(receipt));
                let (held_after, deficit_after) = (leased.units_held(), deficit());
                assert!(
                    held_after >= event.held && deficit_after <= event.deficit,
                    "a refund took units: held {} to {held_after}, deficit {} to {deficit_after}",
                    event.held,
                    event.deficit
                );
                let on_lease = held_after - event.held;
                let central = event.deficit - deficit_after;
                assert!(
                    bound_only() || on_lease * t + central <= cost * t,
                    "a refund of {cost} (charged at event {} on thread {}, refunded on {thread}) \
                     gave back {on_lease} to the lease and {central} ns to the central word \
                     (T = {t})",
                    h.event,
                    h.thread
                );
                assert!(
                    bound_only() || answer == (on_lease > 0 || central > 0),
                    "refund of event {}: answer {answer}, {on_lease} on lease, {central} ns",
                    h.event
                );
                assert!(
                    on_lease == 0 || thread == h.thread,
                    "thread {thread} refunded {on_lease} to a lease for thread {}",
                    h.thread
                );
                event.refund = Some((h.event, cost, answer, central));
                let kind = match (on_lease > 0, central > 0) {
                    (true, false) => 0,
                    (false, true) => 1,
                    (true, true) => 2,
                    (false, false) => 3,
                };
                stats[kind] += 1;
                stats[4] += u64::from(thread != h.thread);
            }
            _ => unreachable!(),
        }
        let now_held = leased.units_held();
        assert!(
            now_held <= shards as u64 * u64::from(lease_size),
            "{now_held} units held on {shards} shards of leases of {lease_size}"
        );
        events.push(event);
    }
    if !bound_only() {
        check_central_refunds(&events);
    }
    check_bound(&events, burst, t);
    if std::env::var_os("LEASE_REFUNDS_STATS").is_some() {
        // What a corpus reaches: `LEASE_REFUNDS_STATS=1 lease_refunds -runs=0 corpus/lease_refunds`.
        let [lease, central, both, nothing, across] = stats;
        eprintln!(
            "shards {shards} lease {lease_size} B {burst} coarse {} refunds: to the lease \
             {lease}, central {central}, both (a full lease) {both}, nothing {nothing}; \
             on another thread {across}",
            coarse.is_some()
        );
    }
});

/// Whether `LEASE_REFUNDS_BOUND_ONLY` is set: the per-refund checks (no more back
/// than the charge, the answer) and the central refunds' check are skipped, so that a mutation can be
/// seen caught by the documented bound alone.
fn bound_only() -> bool {
    static ONLY: OnceLock<bool> = OnceLock::new();
    *ONLY.get_or_init(|| std::env::var_os("LEASE_REFUNDS_BOUND_ONLY").is_some())
}

/// The central refunds of receipts charged before event `i`: with everything central
/// refunds gave back since `i`, at most the deficit before `i` (see
/// `LeasedGcra::refund`, "Back to the central word").
fn check_central_refunds(events: &[Event]) {
    for (i, first) in events.iter().enumerate() {
        let mut given = 0u64;
        for (k, e) in events.iter().enumerate().skip(i) {
            let Some((charged, _, _, central)) = e.refund else {
                continue;
            };
            given += central;
            if charged < i && central > 0 {
                assert!(
                    given <= first.deficit,
                    "central refunds from event {i} to {k} (of a receipt charged at {charged}) \
                     gave back {given} ns > the deficit {} before event {i}",
                    first.deficit
                );
            }
        }
    }
}

/// The documented bound over every run of events.
fn check_bound(events: &[Event], burst: u64, t: u64) {
    for (i, first) in events.iter().enumerate() {
        let (mut admitted, mut refunded) = (0u64, 0u64);
        for (j, e) in events.iter().enumerate().skip(i) {
            admitted += e.admitted;
            if let Some((charged, cost, true, _)) = e.refund {
                if charged >= i {
                    refunded += cost;
                }
            }
            let allowed =
                burst + (e.reading - first.reading) / t + first.on_lease + first.outstanding;
            assert!(
                admitted.saturating_sub(refunded) <= allowed,
                "events {i}..={j}: {admitted} admitted, {refunded} of it refunded, > {allowed} \
                 (B {burst}, span {} ns, T {t}, on lease {}, outstanding {})",
                e.reading - first.reading,
                first.on_lease,
                first.outstanding
            );
        }
    }
}
