//! Shaping: reservations against an exact model, nginx's `limit_req` arithmetic
//! replayed against its mapping, slots served in reservation order under threads,
//! blocking and async waits.
#![cfg(not(loom))]

use floodgate::reference::{ExactShaper, ExactSlot};
use floodgate::{ManualClock, Nanos, Policy, Reservation, ShapeError, Shaper};
use proptest::prelude::*;
use std::time::Duration;

const MS: u64 = 1_000_000;

/// nginx's `ngx_http_limit_req` for one key, in its own units: `excess` in
/// thousandths of a request, time in milliseconds, `rate` in thousandths per second.
/// Returns the delay in ms, or `None` for a rejection (503).
struct NginxLimitReq {
    rate: i64,
    burst: i64,
    delay: i64,
    node: Option<(i64, i64)>,
}

impl NginxLimitReq {
    /// `rate=r r/s burst=b` plus `nodelay` or `delay=d` (`None`: delay everything).
    fn new(per_second: i64, burst: i64, delay: Option<i64>, nodelay: bool) -> Self {
        let delay = if nodelay { burst } else { delay.unwrap_or(0) };
        NginxLimitReq {
            rate: per_second * 1000,
            burst: burst * 1000,
            delay: delay * 1000,
            node: None,
        }
    }

    fn request(&mut self, now_ms: i64) -> Option<i64> {
        let excess = match self.node {
            // A new node starts with excess 0.
            None => 0,
            Some((excess, last)) => {
                let ms = (now_ms - last).max(0);
                let e = (excess - self.rate * ms / 1000 + 1000).max(0);
                if e > self.burst {
                    return None;
                }
                e
            }
        };
        self.node = Some((excess, now_ms));
        Some(if excess <= self.delay {
            0
        } else {
            (excess - self.delay) * 1000 / self.rate
        })
    }
}

/// floodgate's mapping of the same directive (see the `shaping` module docs).
fn mapped(
    per_second: u64,
    burst: u64,
    delay: Option<u64>,
    nodelay: bool,
) -> (Shaper<ManualClock>, Duration) {
    let t = Duration::from_nanos(1_000_000_000 / per_second);
    let (capacity, max_delay) = if nodelay {
        (burst + 1, Duration::ZERO)
    } else {
        let d = delay.unwrap_or(0);
        (d + 1, t * (burst - d) as u32)
    };
    let policy = Policy::per_second(per_second)
        .unwrap()
        .with_burst(capacity)
        .unwrap();
    (Shaper::with_clock(policy, ManualClock::new()), max_delay)
}

fn replay(
    per_second: u64,
    burst: u64,
    delay: Option<u64>,
    nodelay: bool,
    arrivals_ms: &[u64],
) -> Vec<Option<u64>> {
    let mut nginx = NginxLimitReq::new(
        per_second as i64,
        burst as i64,
        delay.map(|d| d as i64),
        nodelay,
    );
    let (shaper, max_delay) = mapped(per_second, burst, delay, nodelay);
    let mut out = Vec::new();
    for &at in arrivals_ms {
        let ours = shaper
            .reserve_at(Nanos::new(at * MS), 1, max_delay)
            .ok()
            .map(|r| r.delay().as_millis() as u64);
        let theirs = nginx.request(at as i64).map(|d| d as u64);
        assert_eq!(ours, theirs, "request at {at} ms");
        out.push(ours);
    }
    out
}

#[test]
fn nginx_burst_queues() {
    // limit_req rate=10r/s burst=5: 8 at once → the first now, 5 queued 100 ms apart,
    // 2 rejected; at 250 ms the queue has drained by 2 (excess 5 − 2.5 + 1 = 3.5).
    let got = replay(10, 5, None, false, &[0, 0, 0, 0, 0, 0, 0, 0, 250]);
    assert_eq!(
        got,
        [
            Some(0),
            Some(100),
            Some(200),
            Some(300),
            Some(400),
            Some(500),
            None,
            None,
            Some(350)
        ]
    );
}

#[test]
fn nginx_burst_nodelay() {
    // burst=5 nodelay: 6 at once pass immediately, then one per 100 ms.
    let got = replay(10, 5, None, true, &[0, 0, 0, 0, 0, 0, 0, 99, 100]);
    assert_eq!(
        got,
        [
            Some(0),
            Some(0),
            Some(0),
            Some(0),
            Some(0),
            Some(0),
            None,
            None,
            Some(0)
        ]
    );
}

#[test]
fn nginx_two_stage_delay() {
    // burst=5 delay=2: 3 at once without delay, 3 more delayed 100, 200, 300 ms, then 503.
    let got = replay(10, 5, Some(2), false, &[0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(
        got,
        [
            Some(0),
            Some(0),
            Some(0),
            Some(100),
            Some(200),
            Some(300),
            None
        ]
    );
}

proptest! {
    #[test]
    fn nginx_mappings_agree_on_random_arrivals(
        burst in 0u64..8,
        delay in 0u64..8,
        mode in 0u8..3,
        gaps in proptest::collection::vec(prop_oneof![3 => Just(0u64), 5 => 0u64..150, 1 => 0u64..2000], 1..60),
    ) {
        let mut t = 0;
        let arrivals: Vec<u64> = gaps.iter().map(|g| { t += g; t }).collect();
        match mode {
            0 => { replay(10, burst, None, false, &arrivals); }
            1 => { replay(10, burst, None, true, &arrivals); }
            _ => { replay(10, burst, Some(delay.min(burst)), false, &arrivals); }
        }
    }

    /// The lock-free shaper, its mutex twin and the exact model agree on reservations
    /// and cancellations, with readings that sometimes go back in time.
    #[test]
    fn atomic_twin_and_model_agree(
        limit in 1u64..20,
        burst in 1u64..6,
        ops in proptest::collection::vec((-100i64..300, 0u32..8, 0u64..2_000, any::<bool>()), 1..80),
    ) {
        let period = 1_000 * MS;
        let policy = Policy::new(limit, Duration::from_nanos(period)).unwrap().with_burst(burst).unwrap();
        let atomic = Shaper::with_clock(policy, ManualClock::new());
        let locked = Shaper::locked_with_clock(policy, ManualClock::new());
        let mut model = ExactShaper::new(limit, period, burst).unwrap();
        let mut held: Vec<(Reservation, Reservation, ExactSlot)> = Vec::new();
        let mut now = 1_000_000 * MS;
        for (step_ms, cost, max_ms, cancel) in ops {
            now = now.saturating_add_signed(step_ms * MS as i64);
            let t = Nanos::new(now);
            if cancel && !held.is_empty() {
                let (a, l, m) = held.remove(step_ms.unsigned_abs() as usize % held.len());
                let back = atomic.cancel_at(t, a);
                prop_assert_eq!(back, locked.cancel_at(t, l));
                prop_assert_eq!(u64::from(back), model.cancel(now, m));
            } else {
                let max = Duration::from_millis(max_ms);
                let (a, l) = (atomic.reserve_at(t, cost, max), locked.reserve_at(t, cost, max));
                let m = model.reserve(now, cost, max_ms * MS);
                match (a, l, m) {
                    (Ok(a), Ok(l), Ok(m)) => {
                        // The same slot (each reservation belongs to its own shaper).
                        prop_assert_eq!(
                            (a.ready_at(), a.delay(), a.cost(), a.decision()),
                            (l.ready_at(), l.delay(), l.cost(), l.decision())
                        );
                        prop_assert_eq!(a.ready_at().as_u64(), m.ready_at);
                        prop_assert!(a.ready_at() >= t);
                        held.push((a, l, m));
                    }
                    (Err(ShapeError::TooLong { retry_after }), Err(e), Err(Some(wait))) => {
                        prop_assert_eq!(e, ShapeError::TooLong { retry_after });
                        prop_assert_eq!(retry_after.as_nanos() as u64, wait);
                    }
                    (Err(ShapeError::Never { .. }), Err(ShapeError::Never { .. }), Err(None)) => {}
                    other => prop_assert!(false, "disagree: {:?}", other),
                }
            }
            prop_assert_eq!(atomic.state(), locked.state());
        }
    }
}

#[test]
fn threads_are_served_in_reservation_order_without_overlap() {
    // Frozen clock, burst 1, T = 1 ms: 4 × 25 reservations get the 100 slots 0..99 ms,
    // each exactly once.
    let start = Nanos::from_secs(1_700_000_000);
    let shaper = Shaper::with_clock(
        Policy::per_second(1000).unwrap().with_burst(1).unwrap(),
        ManualClock::starting_at(start),
    );
    let mut slots: Vec<u64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    for _ in 0..25 {
                        let r = shaper.reserve(1, Duration::from_secs(1)).unwrap();
                        mine.push(r.delay().as_nanos() as u64);
                    }
                    // Within one thread, later reservations never get earlier slots.
                    assert!(mine.windows(2).all(|w| w[0] < w[1]));
                    mine
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    slots.sort_unstable();
    let expected: Vec<u64> = (0..100).map(|k| k * MS).collect();
    assert_eq!(slots, expected);
}

#[test]
fn wait_sleeps_for_the_slot_and_refuses_without_consuming() {
    // A frozen manual clock: each wait books the next 1 ms slot and sleeps for it.
    let shaper = Shaper::with_clock(
        Policy::per_second(1000).unwrap().with_burst(1).unwrap(),
        ManualClock::new(),
    );
    let max = Duration::from_millis(5);
    let waited: Vec<Duration> = (0..3).map(|_| shaper.wait(1, max).unwrap()).collect();
    assert_eq!(
        waited,
        [
            Duration::ZERO,
            Duration::from_millis(1),
            Duration::from_millis(2)
        ]
    );
    let before = shaper.state();
    assert_eq!(
        shaper.wait(1, Duration::from_millis(2)),
        Err(ShapeError::TooLong {
            retry_after: Duration::from_millis(1)
        })
    );
    assert_eq!(shaper.state(), before);
}

#[cfg(feature = "tokio")]
#[test]
fn until_ready_sleeps_until_the_slot_and_cancels_when_dropped() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let shaper = Shaper::with_clock(
            Policy::per_second(10).unwrap().with_burst(1).unwrap(),
            ManualClock::new(),
        );
        let max = Duration::from_secs(1);
        let start = tokio::time::Instant::now();
        assert_eq!(shaper.until_ready(1, max).await, Ok(Duration::ZERO));
        assert_eq!(
            shaper.until_ready(1, max).await,
            Ok(Duration::from_millis(100))
        );
        // Tokio's paused clock moved exactly to the slot: one sleep_until, no polling.
        assert_eq!(start.elapsed(), Duration::from_millis(100));
        // A waiter dropped before its slot gives its units back.
        let before = shaper.state();
        let gave_up =
            tokio::time::timeout(Duration::from_millis(50), shaper.until_ready(1, max)).await;
        assert!(gave_up.is_err());
        assert_eq!(shaper.state(), before);
        assert_eq!(
            shaper.until_ready(2, max).await,
            Err(ShapeError::Never { cost: 2, burst: 1 })
        );
    });
}
