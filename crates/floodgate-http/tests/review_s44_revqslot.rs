//! Session 44 review of the immediate queue slot given back when a later rule
//! denies (qslot): a refund must give back at most the immediate slot, never a slot
//! a request queued behind it holds, so the services a queue lets through stay
//! within its policy however refunds, cancellations and waits interleave.
#![cfg(feature = "queue")]

use std::time::Duration;

use floodgate::{Gcra, KeyedLimiter, ManualClock, Nanos, Policy, Receipt, Reservation, Shaper};

mod common;

/// A small deterministic generator (an LCG), so a failure replays.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n.max(1)
    }
}

/// The first window in which `served` (instant, units) lets through more than a
/// policy of one unit per `interval` with `burst` allows: `burst + ⌊len / interval⌋`
/// units in any closed window of length `len`.
fn over_policy(served: &[(u64, u64)], interval: u64, burst: u64) -> Option<(u64, u64, u64)> {
    let mut served = served.to_vec();
    served.sort_unstable();
    for (i, &(from, _)) in served.iter().enumerate() {
        let mut units = 0;
        for &(to, n) in &served[i..] {
            units += n;
            if units > burst + (to - from) / interval {
                return Some((from, to, units));
            }
        }
    }
    None
}

/// An immediate slot whose request is still held by a later rule.
struct Held {
    at: u64,
    cost: u64,
    receipt: Receipt,
}

/// A reservation waiting for its slot: a shaper's, or a keyed limiter's receipt.
struct Waiting {
    slot: u64,
    cost: u64,
    reservation: Result<Reservation, Receipt>,
}

/// The queue under test: `QueueRule`'s shaper, or `KeyedQueueRule`'s keyed
/// limiter (every request on key "k").
enum Queue {
    Shaper(Shaper<ManualClock>),
    Keyed(KeyedLimiter<String, Gcra, ManualClock>),
}

impl Queue {
    /// An arrival at `now` as the rule takes it: a free slot with its receipt
    /// (`Ok`), a later slot (`Err`: its delay and what cancels it), or `None`.
    #[allow(clippy::type_complexity)]
    fn arrive(
        &self,
        now: u64,
        cost: u32,
        max_delay: Duration,
    ) -> Option<Result<Receipt, (Duration, Result<Reservation, Receipt>)>> {
        let at = Nanos::new(now);
        match self {
            Queue::Shaper(shaper) => {
                let (decision, receipt) = shaper.charge_at(at, cost);
                if decision.is_allowed() {
                    return Some(Ok(receipt));
                }
                let reservation = shaper.reserve_at(at, cost, max_delay).ok()?;
                Some(Err((reservation.delay(), Ok(reservation))))
            }
            Queue::Keyed(keyed) => {
                let (_, delay, receipt) = keyed.reserve_at("k", at, cost, max_delay).ok()?;
                if delay.is_zero() {
                    Some(Ok(receipt))
                } else {
                    Some(Err((delay, Err(receipt))))
                }
            }
        }
    }

    /// A held immediate slot given back (a later rule denied its request).
    fn refund(&self, receipt: Receipt) {
        let _ = match self {
            Queue::Shaper(shaper) => shaper.refund(receipt),
            Queue::Keyed(keyed) => keyed.refund("k", receipt),
        };
    }

    /// A waiting request gone before its slot.
    fn cancel(&self, reservation: Result<Reservation, Receipt>) {
        match (self, reservation) {
            (Queue::Shaper(shaper), Ok(r)) => {
                let _ = shaper.cancel(r);
            }
            (Queue::Keyed(keyed), Err(receipt)) => {
                let _ = keyed.refund("k", receipt);
            }
            _ => unreachable!("a reservation of the other queue"),
        }
    }
}

/// Runs `steps` arrivals on a shaper the way `QueueRule` uses it (a plain charge
/// for a free slot, kept with its receipt; else a reservation within `max_delay`),
/// with the held immediate slots later refunded (a later rule denied) or kept
/// (served), and waiting reservations cancelled (the client went away) or served at
/// their slot; `refunds` turns the refunds and cancellations on; `keyed`: on a
/// keyed limiter as `KeyedQueueRule` uses it (a reservation, whose receipt is kept
/// when it has no delay). The services.
fn simulate(seed: u64, burst: u64, steps: usize, refunds: bool, keyed: bool) -> Vec<(u64, u64)> {
    const T: u64 = 10_000;
    let clock = ManualClock::new();
    let policy = Policy::new(1, Duration::from_nanos(T))
        .and_then(|p| p.with_burst(burst))
        .unwrap_or_else(|e| unreachable!("a valid policy: {e}"));
    let queue = if keyed {
        Queue::Keyed(KeyedLimiter::gcra_with_clock(policy, clock.clone()))
    } else {
        Queue::Shaper(Shaper::with_clock(policy, clock.clone()))
    };
    let max_delay = Duration::from_nanos(6 * T);
    let mut rng = Lcg(seed);
    let mut now = 0;
    let mut held: Vec<Held> = Vec::new();
    let mut waiting: Vec<Waiting> = Vec::new();
    let mut served = Vec::new();
    for _ in 0..steps {
        now += rng.below(T / 2);
        clock.set(Nanos::new(now));
        // Slots that have come are served.
        waiting.retain(|w| {
            let come = w.slot <= now;
            if come {
                served.push((w.slot, w.cost));
            }
            !come
        });
        match rng.below(4) {
            // An arrival (cost 1, sometimes the whole burst).
            0 | 1 => {
                let cost = if rng.below(4) == 0 { burst } else { 1 };
                let cost32 = u32::try_from(cost).unwrap_or(u32::MAX);
                match queue.arrive(now, cost32, max_delay) {
                    Some(Ok(receipt)) => held.push(Held {
                        at: now,
                        cost,
                        receipt,
                    }),
                    Some(Err((delay, reservation))) => waiting.push(Waiting {
                        slot: now + u64::try_from(delay.as_nanos()).unwrap_or(0),
                        cost,
                        reservation,
                    }),
                    None => {}
                }
            }
            // A held request's later rule answers: denied (refund) or admitted.
            2 if !held.is_empty() => {
                let i = usize::try_from(rng.below(held.len() as u64)).unwrap_or(0);
                let h = held.swap_remove(i);
                if refunds && rng.below(2) == 0 {
                    queue.refund(h.receipt);
                } else {
                    served.push((h.at, h.cost));
                }
            }
            // A waiting client goes away before its slot.
            3 if refunds && !waiting.is_empty() => {
                let i = usize::try_from(rng.below(waiting.len() as u64)).unwrap_or(0);
                let w = waiting.swap_remove(i);
                queue.cancel(w.reservation);
            }
            _ => {}
        }
    }
    served.extend(held.iter().map(|h| (h.at, h.cost)));
    served.extend(waiting.iter().map(|w| (w.slot, w.cost)));
    served
}

/// The checker itself: with no refunds nor cancellations every schedule stays
/// within the policy, and a schedule one unit over it is caught.
#[test]
fn the_window_check_accepts_plain_gcra_and_catches_one_unit_over() {
    for burst in 1..=4 {
        for seed in 0..50 {
            for keyed in [false, true] {
                let served = simulate(seed, burst, 200, false, keyed);
                assert_eq!(over_policy(&served, 10_000, burst), None, "seed {seed}");
            }
        }
    }
    // Burst 2, one per 10 µs: two at 0 and one at 10 µs is the policy, one more is not.
    assert_eq!(over_policy(&[(0, 2), (10_000, 1)], 10_000, 2), None);
    assert!(over_policy(&[(0, 2), (9_999, 1)], 10_000, 2).is_some());
}

/// Immediate slots refunded while requests wait behind them (and waiting requests
/// cancelled): the services stay within the policy in every window.
#[test]
fn refunds_of_immediate_slots_never_let_more_through_than_the_policy() {
    for burst in 1..=4 {
        for seed in 0..400 {
            for keyed in [false, true] {
                let served = simulate(seed, burst, 200, true, keyed);
                assert_eq!(
                    over_policy(&served, 10_000, burst),
                    None,
                    "burst {burst}, seed {seed}, keyed {keyed}"
                );
            }
        }
    }
}

mod through_the_layer {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use floodgate::{KeyedLimiter, Policy, Shaper};
    use floodgate_http::{
        from_fn, HeaderKey, KeyedQueueRule, PriorityRule, QueueRule, RateLimitLayer,
        RateLimitService, Rule,
    };
    use tokio::time::Instant;
    use tower::{Layer, Service};

    use super::common::{tier, tier_request, Hello, TokioClock};

    type PerUser = KeyedLimiter<String, floodgate::Gcra, TokioClock>;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    /// The queueing rule that takes "a"'s slot at once.
    #[derive(Clone, Copy, Debug)]
    enum First {
        Queue,
        KeyedQueue,
        Priority,
    }

    /// How "a"'s request ends after its immediate slot, while it waits in "hold".
    #[derive(Clone, Copy, Debug)]
    enum End {
        /// "per-key" denies it when its hold slot comes (4 s): the slot is refunded.
        Denied,
        /// The client goes away at 2 s (a timeout drops the request's future).
        Dropped,
    }

    /// `first` as "queue" (1 per 10 s, burst 1, waiting up to a minute; the
    /// priority rule has 8 places in tier 0), then "hold" (a queue keyed on
    /// `x-user`, 1 per 4 s, "a"'s slot already taken: "a" waits 4 s, anyone else
    /// goes at once), then "per-key" (1 an hour on `x-user`, "a"'s unit spent).
    fn layer(first: First) -> Result<RateLimitService<Hello>, Error> {
        layer_with(first, &[8])
    }

    /// [`layer`], the priority rule with `places` per tier.
    fn layer_with(first: First, places: &[usize]) -> Result<RateLimitService<Hello>, Error> {
        let clock = TokioClock {
            start: Instant::now(),
        };
        let policy = Policy::new(1, Duration::from_secs(10))?.with_burst(1)?;
        let max_delay = Duration::from_secs(60);
        let builder = RateLimitLayer::builder();
        let builder = match first {
            First::Queue => builder.queue(QueueRule::shared(
                "queue",
                Arc::new(Shaper::with_clock(policy, clock)),
                max_delay,
            )?),
            First::KeyedQueue => builder.queue_per_key(KeyedQueueRule::shared(
                "queue",
                HeaderKey::new("x-tier")?,
                Arc::new(KeyedLimiter::gcra_with_clock(policy, clock)),
                max_delay,
            )?),
            First::Priority => builder.priority(PriorityRule::shared(
                "queue",
                Arc::new(Shaper::with_clock(policy, clock)),
                places,
                from_fn(tier),
            )?),
        };
        let hold: Arc<PerUser> = Arc::new(KeyedLimiter::gcra_with_clock(
            Policy::new(1, Duration::from_secs(4))?.with_burst(1)?,
            clock,
        ));
        assert!(hold.check("a").is_allowed());
        let per_key: Arc<PerUser> =
            Arc::new(KeyedLimiter::gcra_with_clock(Policy::per_hour(1)?, clock));
        assert!(per_key.check("a").is_allowed());
        let layer = builder
            .queue_per_key(KeyedQueueRule::shared(
                "hold",
                HeaderKey::new("x-user")?,
                hold,
                max_delay,
            )?)
            .rule(Rule::shared("per-key", per_key, HeaderKey::new("x-user")?)?)
            .build()?;
        Ok(layer.layer(Hello))
    }

    /// Services: (seconds since the start, who).
    type Log = Arc<Mutex<Vec<(u64, String)>>>;

    /// Sends `who`'s request on its own task, logging its service (a 200) and
    /// returning its status (`None`: dropped after `give_up`).
    fn spawn(
        svc: &RateLimitService<Hello>,
        who: &'static str,
        start: Instant,
        log: &Log,
        give_up: Option<Duration>,
    ) -> tokio::task::JoinHandle<Result<Option<u16>, String>> {
        spawn_in(svc, (who, 0), start, log, give_up)
    }

    /// [`spawn`] in tier `tier` (`x-tier`).
    fn spawn_in(
        svc: &RateLimitService<Hello>,
        (who, tier): (&'static str, usize),
        start: Instant,
        log: &Log,
        give_up: Option<Duration>,
    ) -> tokio::task::JoinHandle<Result<Option<u16>, String>> {
        let mut svc = svc.clone();
        let log = Arc::clone(log);
        tokio::spawn(async move {
            let call = svc.call(tier_request(who, tier));
            let response = match give_up {
                Some(after) => match tokio::time::timeout(after, call).await {
                    Ok(r) => r,
                    Err(_) => return Ok(None),
                },
                None => call.await,
            }
            .map_err(|e| e.to_string())?;
            let status = response.status().as_u16();
            if status == 200 {
                let at = start.elapsed().as_secs();
                log.lock()
                    .map_err(|e| e.to_string())?
                    .push((at, who.to_owned()));
            }
            Ok(Some(status))
        })
    }

    /// A current-thread runtime on Tokio's paused clock.
    fn paused() -> std::io::Result<tokio::runtime::Runtime> {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
    }

    /// The services logged so far.
    fn services(log: &Log) -> Result<Vec<(u64, String)>, String> {
        Ok(log.lock().map_err(|e| e.to_string())?.clone())
    }

    /// The services `list` as the log holds them.
    fn at(list: &[(u64, &str)]) -> Vec<(u64, String)> {
        list.iter().map(|&(t, w)| (t, w.to_owned())).collect()
    }

    async fn let_tasks_run() {
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    }

    /// The brief's attack: "a" takes the queue's slot at once and waits in
    /// "hold"; "b", "c", "d" queue behind it (slots at 10, 20, 30 s); "a" is then
    /// denied by "per-key" (or dropped) while its slot has 6 s (8 s) still ahead,
    /// and that slot is given back. GCRA's refund rule keeps the slots booked after
    /// it: nothing comes back, "e" (arriving at 5 s) is served at 40 s, after "d",
    /// and each 10 s window serves one request, for each of the three rules.
    #[test]
    fn a_refund_behind_queued_requests_moves_no_slot_earlier() -> Result<(), Error> {
        for first in [First::Queue, First::KeyedQueue, First::Priority] {
            for end in [End::Denied, End::Dropped] {
                let runtime = paused()?;
                runtime.block_on(async {
                    let svc = layer(first)?;
                    let start = Instant::now();
                    let log: Log = Arc::default();
                    let give_up = match end {
                        End::Denied => None,
                        End::Dropped => Some(Duration::from_secs(2)),
                    };
                    let a = spawn(&svc, "a", start, &log, give_up);
                    let_tasks_run().await;
                    let mut rest = Vec::new();
                    for who in ["b", "c", "d"] {
                        rest.push(spawn(&svc, who, start, &log, None));
                        let_tasks_run().await;
                    }
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    let a = a.await??;
                    let expected = match end {
                        End::Denied => Some(429),
                        End::Dropped => None,
                    };
                    assert_eq!(a, expected, "{first:?} {end:?}: a");
                    rest.push(spawn(&svc, "e", start, &log, None));
                    for r in rest {
                        assert_eq!(r.await??, Some(200), "{first:?} {end:?}");
                    }
                    let (log, want) = (
                        services(&log)?,
                        at(&[(10, "b"), (20, "c"), (30, "d"), (40, "e")]),
                    );
                    assert_eq!(log, want, "{first:?} {end:?}");
                    Ok::<_, Error>(())
                })?;
            }
        }
        Ok(())
    }

    /// Attack 3's other half: "a" dropped (2 s) while it waits in "hold", with
    /// nobody queued behind it, gives its immediate slot back exactly once (the
    /// layer drains its receipts, and a receipt is neither `Clone` nor `Copy`):
    /// "e" (at 3 s) is served at once and "f" (at 3 s too) 10 s later, not at once
    /// (a second refund) nor at 10 s (no refund), for each of the three rules.
    #[test]
    fn a_dropped_request_gives_its_immediate_slot_back_once() -> Result<(), Error> {
        for first in [First::Queue, First::KeyedQueue, First::Priority] {
            let runtime = paused()?;
            runtime.block_on(async {
                let svc = layer(first)?;
                let start = Instant::now();
                let log: Log = Arc::default();
                let a = spawn(&svc, "a", start, &log, Some(Duration::from_secs(2)));
                tokio::time::sleep(Duration::from_secs(3)).await;
                assert_eq!(a.await??, None, "{first:?}: a dropped");
                let e = spawn(&svc, "e", start, &log, None);
                let_tasks_run().await;
                let f = spawn(&svc, "f", start, &log, None);
                assert_eq!(e.await??, Some(200), "{first:?}");
                assert_eq!(f.await??, Some(200), "{first:?}");
                let (log, want) = (services(&log)?, at(&[(3, "e"), (13, "f")]));
                assert_eq!(log, want, "{first:?}");
                Ok::<_, Error>(())
            })?;
        }
        Ok(())
    }

    /// Attack 2: a `PriorityRule`'s immediate slot refunded while requests wait in
    /// two tiers (2 places each), then a shed. "a" (tier 0) goes at once and is held;
    /// "b" (tier 0, the head: slot at 10 s), "c" (tier 0) and "d" (tier 1) wait; "a"
    /// is denied at 4 s and its slot refunded; "e" and "f" (tier 1) arrive at 5 s,
    /// and "f", finding tier 1's places taken, sheds "c" (the lowest tier's newest).
    /// The head keeps its slot, the higher tier goes first in FIFO order, one a
    /// slot: b 10 s, d 20 s, e 30 s, f 40 s; "c" is answered 429.
    #[test]
    fn a_priority_refund_among_waiters_keeps_order_shed_and_slots() -> Result<(), Error> {
        let runtime = paused()?;
        runtime.block_on(async {
            let svc = layer_with(First::Priority, &[2, 2])?;
            let start = Instant::now();
            let log: Log = Arc::default();
            let a = spawn(&svc, "a", start, &log, None);
            let_tasks_run().await;
            let mut served = Vec::new();
            for who in [("b", 0), ("c", 0), ("d", 1)] {
                served.push(spawn_in(&svc, who, start, &log, None));
                let_tasks_run().await;
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
            assert_eq!(a.await??, Some(429), "a denied by per-key");
            for who in [("e", 1), ("f", 1)] {
                served.push(spawn_in(&svc, who, start, &log, None));
                let_tasks_run().await;
            }
            let c = served.remove(1);
            assert_eq!(c.await??, Some(429), "c shed");
            assert_eq!(
                Instant::now() - start,
                Duration::from_secs(5),
                "shed at once"
            );
            for r in served {
                assert_eq!(r.await??, Some(200));
            }
            let (log, want) = (
                services(&log)?,
                at(&[(10, "b"), (20, "d"), (30, "e"), (40, "f")]),
            );
            assert_eq!(log, want);
            Ok::<_, Error>(())
        })
    }
}
