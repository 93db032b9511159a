//! A multi-threaded adversarial review (2026-12-05): real threads on a shared
//! `ManualClock` that a ticker thread moves, where each decision is made at a reading
//! taken *before* a stall (spins and yields), so decisions commit with readings out of
//! order across threads. Refunds, cancellations, policy changes, removals and
//! reclamation race them. Each test checks a bound that holds whatever the order:
//!
//! * GCRA and everything built on it: the admissions still held (not given back),
//!   replayed at their readings (a reservation: at its slot) on a fresh GCRA, conform
//!   — equivalently, over every interval `[a, b]` of readings they total at most
//!   `B + (b − a)/T`;
//! * the fixed window: no window holds more than `L` units;
//! * the sliding window counter: no admission sees an estimate above `L`;
//! * the sliding log: no span of `P` holds more than `L` units.
//!
//! Each check is sound with partial refunds: a unit whose refund reports success is
//! dropped from what the check counts, which only makes the bound easier to meet.
//! No test measures time; sizes keep each under a few seconds in a debug build.

#[macro_use]
mod common;
mod race;

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use common::conforms;
use floodgate::keyed::composite::{check_all, Limit};
use floodgate::{
    Clock, Decision, FixedWindow, Gcra, KeyedBuilder, KeyedLimiter, LiveGcra, ManualClock, Nanos,
    Policy, RateLimiter, Receipt, Shaper, SlidingLog, SlidingWindow, Storage,
};
use race::{policy, race, stall, Rng, MAX_TICKS};

const WORKERS: usize = 3;
const OPS: usize = 3_000;

/// Every worker charges at a stale reading, keeps some receipts and refunds some of
/// them later (the limit reads its own clock for a refund, as the cells do). Returns
/// the admissions still held: `(reading, cost)`.
fn charges_and_refunds<L: Limit + Sync + ?Sized>(
    limit: &L,
    clock: &ManualClock,
    step: u64,
    max_cost: u32,
    side: impl Fn(&mut Rng) + Sync,
) -> Vec<(Nanos, u32)> {
    charges_and_refunds_judged(limit, clock, step, max_cost, side)
        .into_iter()
        .map(|(at, _, cost)| (at, cost))
        .collect()
}

/// [`charges_and_refunds`] where an admission at `reading` may have been judged at a
/// later instant (a keyed table judges a reading at `max(reading, the shard's last
/// removal instant)`): each held admission as `(reading, latest, cost)`, `latest`
/// being the clock read once the charge returned, no earlier than the instant it was
/// judged at.
fn charges_and_refunds_judged<L: Limit + Sync + ?Sized>(
    limit: &L,
    clock: &ManualClock,
    step: u64,
    max_cost: u32,
    side: impl Fn(&mut Rng) + Sync,
) -> Vec<(Nanos, Nanos, u32)> {
    race(clock, step, WORKERS, side, |i| {
        let mut rng = Rng::new(i as u64 + 1);
        let mut held: Vec<(Nanos, Nanos, u32, Receipt)> = Vec::new();
        let mut kept = Vec::new();
        for _ in 0..OPS {
            let reading = clock.now();
            stall(&mut rng);
            let cost = 1 + rng.below(u64::from(max_cost)) as u32;
            let (d, receipt) = limit.charge_at(reading, cost);
            if d.is_allowed() {
                held.push((reading, clock.now(), cost, receipt));
            }
            if !held.is_empty() && rng.below(3) == 0 {
                stall(&mut rng);
                let pick = rng.below(held.len() as u64) as usize;
                let (at, latest, cost, receipt) = held.swap_remove(pick);
                if !limit.refund(receipt) {
                    kept.push((at, latest, cost));
                }
            }
        }
        kept.extend(
            held.into_iter()
                .map(|(at, latest, cost, _)| (at, latest, cost)),
        );
        kept
    })
    .concat()
}

/// The GCRA bound when each admission is known to have been judged somewhere in
/// `[reading, latest]`: for every `a` and `b` up to `spans` intervals apart, the units
/// of the admissions with `reading ≥ a` and `latest ≤ b` (judged within `[a, b]`
/// whatever their exact instant) total at most `B + ⌊(b − a)/T⌋`.
fn within_gcra_bound(p: Policy, held: &[(Nanos, Nanos, u32)], spans: u64) -> Result<(), String> {
    let t = p.interval_nanos();
    let mut by_reading: Vec<(u64, u64, u64)> = held
        .iter()
        .map(|&(r, l, c)| (r.as_u64(), l.as_u64(), u64::from(c)))
        .collect();
    by_reading.sort_unstable();
    for (i, &(a, _, _)) in by_reading.iter().enumerate() {
        let horizon = a.saturating_add(spans * t);
        let mut inside: Vec<(u64, u64)> = by_reading[i..]
            .iter()
            .take_while(|&&(r, _, _)| r <= horizon)
            .filter(|&&(_, l, _)| l <= horizon)
            .map(|&(_, l, c)| (l, c))
            .collect();
        inside.sort_unstable();
        let mut units = 0;
        for &(b, c) in &inside {
            units += c;
            let bound = p.burst() + (b - a) / t;
            if units > bound {
                return Err(format!(
                    "{units} units judged within [{a}, {b}] ns pass B + (b − a)/T = {bound}"
                ));
            }
        }
    }
    Ok(())
}

const T: u64 = 1_000_000; // 1 ms

/// GCRA on the atomic cell and on the mutex twin, a token bucket whose rate does not
/// divide (T rounded up), the shaper's immediate charges: stale readings and refunds
/// never let the held admissions pass the policy.
#[test]
fn gcra_front_ends_with_stale_readings_and_refunds_conform() {
    let p = policy(1, Duration::from_nanos(T), 4);
    let clock = ManualClock::new();
    let atomic = RateLimiter::gcra_with_clock(p, clock.clone());
    conforms(p, &charges_and_refunds(&atomic, &clock, T, 3, |_| ())).unwrap();

    let clock = ManualClock::new();
    let locked = RateLimiter::locked_with_clock(Gcra::new(p), clock.clone());
    conforms(p, &charges_and_refunds(&locked, &clock, T, 3, |_| ())).unwrap();

    // 7 units every 3 ms: T = ⌈3 ms / 7⌉.
    let bucket = Gcra::token_bucket(5, 7, Duration::from_millis(3)).unwrap();
    let clock = ManualClock::new();
    let tb = RateLimiter::with_clock(bucket, clock.clone());
    conforms(
        bucket.policy(),
        &charges_and_refunds(&tb, &clock, T / 2, 3, |_| ()),
    )
    .unwrap();

    let clock = ManualClock::new();
    let shaper = Shaper::with_clock(p, clock.clone());
    conforms(p, &charges_and_refunds(&shaper, &clock, T, 3, |_| ())).unwrap();
}

/// `LiveGcra` with the ticker flipping its policy between a generous and a tight one
/// while workers charge at stale readings and refund: what is held conforms to the
/// generous policy (its `T` is the smallest, its `τ` the largest).
#[test]
fn live_gcra_policy_flips_racing_stale_charges_and_refunds_conform() {
    let generous = policy(4, Duration::from_nanos(4 * T), 8); // T = 1 ms, τ = 8 ms
    let tight = policy(1, Duration::from_nanos(2 * T), 2); // T = 2 ms, τ = 4 ms
    let clock = ManualClock::new();
    let live = RateLimiter::with_clock(LiveGcra::new(generous), clock.clone());
    let flips = AtomicU64::new(0);
    let held = charges_and_refunds(&live, &clock, T, 3, |rng| {
        if rng.below(2) == 0 {
            let n = flips.fetch_add(1, Ordering::Relaxed);
            live.algorithm()
                .set_policy(if n % 2 == 0 { tight } else { generous });
        }
    });
    assert!(flips.load(Ordering::Relaxed) > 0);
    conforms(generous, &held).unwrap();
}

/// One hot key in a keyed table on every storage, charged at stale readings and
/// refunded, while the ticker floods its shard with short-lived keys (so the table
/// reclaims idle keys on insert), removes some of them (each removal moves the
/// shard's generation and its removal instant) and reclaims idle keys by hand. No
/// live key is ever evicted (the flood keys go idle within a few ticks), so the hot
/// key's held admissions must conform exactly.
#[test]
fn a_keyed_hot_key_conforms_through_floods_removals_and_reclamation() {
    fn case<S: Storage<u64, floodgate::GcraState>>() {
        let p = policy(1, Duration::from_nanos(T), 4);
        let clock = ManualClock::new();
        let table: KeyedLimiter<u64, Gcra, ManualClock, S> =
            common::keyed_on(Gcra::new(p), &clock, 128, 1);
        let next_key = AtomicU64::new(1_000);
        let calls = AtomicU64::new(0);
        let side = |rng: &mut Rng| {
            // The flood runs while the clock moves (the ticker's first `MAX_TICKS`
            // calls): once it stands, new keys would stay booked and fill the table.
            let flooding = calls.fetch_add(1, Ordering::Relaxed) < MAX_TICKS;
            for _ in 0..2 * usize::from(flooding) {
                let k = next_key.fetch_add(1, Ordering::Relaxed);
                let _ = table.check(&k);
            }
            match rng.below(8) {
                0 => {
                    let back = 1 + rng.below(12);
                    let _ = table.remove(&(next_key.load(Ordering::Relaxed) - back));
                }
                1 => {
                    let _ = table.reclaim_idle();
                }
                _ => {}
            }
        };
        let hot = table.limit(&7u64);
        let held = charges_and_refunds_judged(&hot, &clock, T / 2, 3, side);
        let m = table.metrics();
        assert_eq!(m.evicted, 0, "the hot key may only be reclaimed: {m:?}");
        assert!(m.reclaimed > 0 && m.removed > 0, "{m:?}");
        within_gcra_bound(p, &held, 64).unwrap();
    }
    on_every_storage!(case);
}

/// A [`Limit`] at a reading taken before the call (stale), that records what it still
/// holds after a composite's rollback: one per thread and limit.
struct Stale<'a, L: ?Sized> {
    inner: &'a L,
    reading: Cell<Nanos>,
    pending: Cell<Option<Grant>>,
    kept: RefCell<Vec<Grant>>,
}

/// An admission a [`Stale`] limit still holds: its reading, its cost, and the end of
/// the window it counted in (a window's `reading + reset_after`).
#[derive(Clone, Copy, Debug)]
struct Grant {
    at: Nanos,
    cost: u32,
    end: u64,
}

impl<'a, L: Limit + ?Sized> Stale<'a, L> {
    fn new(inner: &'a L) -> Self {
        Stale {
            inner,
            reading: Cell::new(Nanos::ZERO),
            pending: Cell::new(None),
            kept: RefCell::new(Vec::new()),
        }
    }

    /// After the composite: a charge it did not refund is still held.
    fn settle(&self) {
        if let Some(grant) = self.pending.take() {
            self.kept.borrow_mut().push(grant);
        }
    }

    /// What it still holds, as `(reading, cost)`.
    fn held(self) -> Vec<(Nanos, u32)> {
        self.kept
            .into_inner()
            .iter()
            .map(|g| (g.at, g.cost))
            .collect()
    }
}

impl<L: Limit + ?Sized> Limit for Stale<'_, L> {
    fn now(&self) -> Nanos {
        self.reading.get()
    }

    fn charge_at(&self, now: Nanos, cost: u32) -> (Decision, Receipt) {
        let (d, receipt) = self.inner.charge_at(now, cost);
        if d.is_allowed() && cost > 0 {
            self.pending.set(Some(Grant {
                at: now,
                cost,
                end: now.as_u64() + d.reset_after_nanos(),
            }));
        }
        (d, receipt)
    }

    fn peek_at(&self, now: Nanos, cost: u32) -> Decision {
        self.inner.peek_at(now, cost)
    }

    fn refund(&self, receipt: Receipt) -> bool {
        let grant = self.pending.take();
        let given_back = self.inner.refund(receipt);
        if !given_back {
            self.kept.borrow_mut().extend(grant);
        }
        given_back
    }
}

/// Composites whose limits deny at different moments (a global GCRA, a keyed GCRA, a
/// fixed window), every thread deciding at a stale reading: the rollbacks never let
/// any single limit's held admissions pass it.
#[test]
fn composite_rollbacks_at_stale_readings_never_pass_any_limit() {
    let global_p = policy(2, Duration::from_nanos(T), 6); // T = 0.5 ms, τ = 3 ms
    let user_p = policy(1, Duration::from_nanos(T), 3); // T = 1 ms, τ = 3 ms
    let window_p = Policy::new(5, Duration::from_nanos(4 * T)).unwrap();
    let clock = ManualClock::new();
    let global = RateLimiter::gcra_with_clock(global_p, clock.clone());
    let users: KeyedLimiter<u64, Gcra, ManualClock> =
        common::keyed_on(Gcra::new(user_p), &clock, 16, 1);
    let window = RateLimiter::with_clock(FixedWindow::new(window_p).unwrap(), clock.clone());
    let user = users.limit(&1u64);
    let per_window: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    let out = race(
        &clock,
        T / 2,
        WORKERS,
        |_| (),
        |i| {
            let mut rng = Rng::new(0xA11 + i as u64);
            let g = Stale::new(&global);
            let u = Stale::new(&user);
            let w = Stale::new(&window);
            for _ in 0..OPS {
                let reading = clock.now();
                for s in [&g.reading, &u.reading, &w.reading] {
                    s.set(reading);
                }
                stall(&mut rng);
                let cost = 1 + rng.below(2) as u32;
                // Three orders: each limit is sometimes charged first, sometimes
                // rolled back.
                let _ = match rng.below(3) {
                    0 => check_all(&[&g, &u, &w], cost),
                    1 => check_all(&[&w, &g, &u], cost),
                    _ => check_all(&[&u, &w, &g], cost),
                };
                g.settle();
                u.settle();
                w.settle();
            }
            let mut counts = per_window.lock().unwrap();
            for g in w.kept.into_inner() {
                // The window it counted in ends at `end` (a reading behind the state
                // counts in the state's newer window).
                let idx = ((g.end - 1) / (4 * T)) as usize;
                if counts.len() <= idx {
                    counts.resize(idx + 1, 0);
                }
                counts[idx] += u64::from(g.cost);
            }
            (g.held(), u.held())
        },
    );
    let (g_kept, u_kept): (Vec<_>, Vec<_>) = out.into_iter().unzip();
    conforms(global_p, &g_kept.concat()).unwrap();
    conforms(user_p, &u_kept.concat()).unwrap();
    let counts = per_window.into_inner().unwrap();
    assert!(counts.iter().all(|&c| c <= 5), "{counts:?}");
    assert!(counts.iter().sum::<u64>() > 0);
}

/// An admission on a window or log limiter, with what locates its count.
#[derive(Clone, Copy, Debug)]
struct Counted {
    reading: u64,
    cost: u64,
    /// `reading + reset_after` of the admission.
    end: u64,
    /// The units the checker counted in the admission's window once it was added
    /// (never more than the state held at that moment).
    seen: u64,
    /// Whether a refund gave it back.
    refunded: bool,
}

/// Workers charge at stale readings and refund some charges later; each admission's
/// units are added to `counter(admission)` after its charge, and taken off before a
/// refund (put back if the refund fails), so a counter never holds more than the
/// state it shadows. Returns every admission, those given back marked.
fn window_race<L: Limit + Sync + ?Sized>(
    limit: &L,
    clock: &ManualClock,
    step: u64,
    max_cost: u32,
    counter: impl Fn(u64, u64) -> Option<&'static AtomicU64> + Sync,
) -> Vec<Counted> {
    race(
        clock,
        step,
        WORKERS,
        |_| (),
        |i| {
            let mut rng = Rng::new(0x51DE + i as u64);
            let mut held: Vec<(Counted, Receipt)> = Vec::new();
            let mut kept = Vec::new();
            for _ in 0..OPS {
                let reading = clock.now().as_u64();
                stall(&mut rng);
                let cost = 1 + rng.below(u64::from(max_cost)) as u32;
                let (d, receipt) = limit.charge_at(Nanos::new(reading), cost);
                if d.is_allowed() {
                    let end = reading + d.reset_after_nanos();
                    let cost = u64::from(cost);
                    let seen = counter(reading, end)
                        .map_or(0, |c| c.fetch_add(cost, Ordering::SeqCst) + cost);
                    held.push((
                        Counted {
                            reading,
                            cost,
                            end,
                            seen,
                            refunded: false,
                        },
                        receipt,
                    ));
                }
                if !held.is_empty() && rng.below(3) == 0 {
                    stall(&mut rng);
                    let pick = rng.below(held.len() as u64) as usize;
                    let (c, receipt) = held.swap_remove(pick);
                    let slot = counter(c.reading, c.end);
                    if let Some(s) = slot {
                        s.fetch_sub(c.cost, Ordering::SeqCst);
                    }
                    let refunded = limit.refund(receipt);
                    if !refunded {
                        if let Some(s) = slot {
                            s.fetch_add(c.cost, Ordering::SeqCst);
                        }
                    }
                    kept.push(Counted { refunded, ..c });
                }
            }
            kept.extend(held.into_iter().map(|(c, _)| c));
            kept
        },
    )
    .concat()
}

/// Per-window counters for a run (leaked: a test's worth of atomics).
fn counters(n: usize) -> &'static [AtomicU64] {
    Box::leak((0..n).map(|_| AtomicU64::new(0)).collect())
}

const L: u64 = 6;
const P: u64 = 4 * T;
/// Windows a run can reach: `MAX_TICKS` moves of at most `T / 2`, and one more.
const WINDOWS: usize = (MAX_TICKS * (T / 2) / P) as usize + 2;

/// The fixed window on the atomic cell and on the mutex twin: stale readings (counted
/// in the state's newer window) and refunds never put more than `L` units in a
/// window, at any moment.
#[test]
fn fixed_windows_with_stale_readings_and_refunds_never_overfill() {
    fn case<S: floodgate::StateCell<floodgate::FixedWindowState>>(
        limiter: &RateLimiter<FixedWindow, ManualClock, S>,
        clock: &ManualClock,
    ) {
        let per_window = counters(WINDOWS);
        let all = window_race(limiter, clock, T / 2, 3, |_, end| {
            per_window.get(((end - 1) / P) as usize)
        });
        let held: Vec<Counted> = all.into_iter().filter(|c| !c.refunded).collect();
        assert!(held.iter().all(|c| c.seen <= L), "a window passed {L}");
        let total: u64 = per_window.iter().map(|c| c.load(Ordering::SeqCst)).sum();
        assert_eq!(total, held.iter().map(|c| c.cost).sum::<u64>());
        assert!(per_window.iter().all(|c| c.load(Ordering::SeqCst) <= L));
    }
    let p = Policy::new(L, Duration::from_nanos(P)).unwrap();
    let clock = ManualClock::new();
    case(
        &RateLimiter::with_clock(FixedWindow::new(p).unwrap(), clock.clone()),
        &clock,
    );
    let clock = ManualClock::new();
    case(
        &RateLimiter::locked_with_clock(FixedWindow::new(p).unwrap(), clock.clone()),
        &clock,
    );
}

/// The sliding window counter. Admissions are judged at `max(reading, the stored
/// window's start)`; the last one to commit in window `w`, at elapsed `e`, saw
/// `⌊prev·(P − e)/P⌋ + cur ≤ L` with `prev` what window `w − 1` finally held and `cur`
/// at least what `w` finally holds, and `e` is at most the largest elapsed of any
/// admission in `w`.
#[test]
fn sliding_windows_with_stale_readings_and_refunds_never_pass_the_estimate() {
    let p = Policy::new(L, Duration::from_nanos(P)).unwrap();
    let clock = ManualClock::new();
    let limiter = RateLimiter::with_clock(SlidingWindow::new(p).unwrap(), clock.clone());
    let per_window = counters(WINDOWS);
    // After an admission cur > 0, so reset_after runs to the end of window w + 1.
    let window = |end: u64| (end / P).checked_sub(2);
    let all = window_race(&limiter, &clock, T / 2, 3, |_, end| {
        window(end).and_then(|w| per_window.get(w as usize))
    });
    let mut latest = vec![None::<u64>; WINDOWS];
    for c in &all {
        let w = window(c.end).expect("ends two windows on");
        // A reading behind the stored window is judged at its start.
        let e = if c.reading / P == w {
            c.reading - w * P
        } else {
            0
        };
        let slot = &mut latest[w as usize];
        *slot = Some(slot.map_or(e, |l| l.max(e)));
    }
    let held = |w: usize| per_window[w].load(Ordering::SeqCst);
    for (w, e) in latest.iter().enumerate() {
        let Some(e) = *e else { continue };
        let prev = w.checked_sub(1).map_or(0, held);
        let weighted = (u128::from(prev) * u128::from(P - e) / u128::from(P)) as u64;
        assert!(
            weighted + held(w) <= L,
            "window {w}: prev {prev} at {e} ns in, cur {}",
            held(w)
        );
    }
    assert!(all.iter().any(|c| c.refunded));
}

/// The sliding log: each admission is logged at `reading + reset_after − P` (its
/// reading, or the newest entry's instant if later); the units still held never
/// number more than `L` in any span of `P` ending at one of them.
#[test]
fn the_sliding_log_with_stale_readings_and_refunds_never_passes_its_limit() {
    let p = Policy::new(L, Duration::from_nanos(P)).unwrap();
    let clock = ManualClock::new();
    let log = SlidingLog::with_clock(p, clock.clone());
    let all = window_race(&log, &clock, T / 2, 3, |_, _| None);
    let mut at: Vec<(u64, u64)> = all
        .iter()
        .filter(|c| !c.refunded)
        .map(|c| (c.end - P, c.cost))
        .collect();
    at.sort_unstable();
    let mut from = 0;
    let mut units = 0;
    for (i, &(t, cost)) in at.iter().enumerate() {
        units += cost;
        while t - at[from].0 >= P {
            units -= at[from].1;
            from += 1;
        }
        // Several admissions at one instant: count them all before judging.
        if at.get(i + 1).is_some_and(|&(next, _)| next == t) {
            continue;
        }
        assert!(
            units <= L,
            "{units} units within P before {t} ns: {:?}",
            &at[from..=i]
        );
    }
    assert!(!at.is_empty());
}

/// The sliding log's race in slow motion (limit 1 per 10 s): thread A reads the clock
/// at 5 s and is descheduled; meanwhile, at 10 s, thread B is admitted (which drops the
/// unit logged at 0 s: it no longer counts at 10 s) and refunds its charge. A then
/// decides at its reading of 5 s, where the unit from 0 s still counts: judged there
/// it must be denied; admitted, its unit must be logged at 10 s or later (judged where
/// the log already stood), or two units stand within 10 s. Every reading comes from
/// one monotone clock; A's is simply older than B's, as on any preempted thread.
#[test]
fn a_refund_never_lets_the_sliding_log_judge_behind_what_it_dropped() {
    const P: u64 = 10_000_000_000;
    // Where an admission at `reading` logged its unit (`reading + reset_after − P`).
    let logged_at = |reading: Nanos, d: Decision| reading.as_u64() + d.reset_after_nanos() - P;
    let clock = ManualClock::new();
    let log = SlidingLog::with_clock(
        Policy::new(1, Duration::from_nanos(P)).unwrap(),
        clock.clone(),
    );
    assert!(log.check().is_allowed()); // the unit at 0 s
    clock.advance(Duration::from_secs(5));
    let a_reading = clock.now(); // thread A reads 5 s, then stalls
    clock.advance(Duration::from_secs(5));
    let (b, receipt) = log.charge(1); // thread B at 10 s
    assert!(b.is_allowed());
    assert!(log.refund(receipt));
    let a = log.check_n_at(a_reading, 1);
    assert!(
        !a.is_allowed() || logged_at(a_reading, a) >= P,
        "logged within 10 s of the unit from 0 s: {a:?}"
    );

    // The keyed log, on the same ring.
    let clock = ManualClock::new();
    let keyed = KeyedBuilder::default()
        .clock(clock.clone())
        .sliding_log::<u64>(Policy::new(1, Duration::from_nanos(P)).unwrap())
        .unwrap();
    assert!(keyed.check(&1).is_allowed());
    clock.advance(Duration::from_secs(5));
    let a_reading = clock.now();
    clock.advance(Duration::from_secs(5));
    let (b, receipt) = keyed.charge(&1, 1);
    assert!(b.is_allowed());
    assert!(keyed.refund(&1, receipt));
    let a = keyed.check_n_at(&1, a_reading, 1);
    assert!(
        !a.is_allowed() || logged_at(a_reading, a) >= P,
        "keyed: logged within 10 s of the unit from 0 s: {a:?}"
    );
}
