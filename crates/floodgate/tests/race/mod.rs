//! The harness of the multi-threaded adversarial reviews (`mt_adversarial*.rs`): real
//! threads on a shared `ManualClock` that a ticker moves, each decision made at a
//! reading taken before a stall, so decisions commit with readings out of order.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use floodgate::{ManualClock, Policy};

/// Clock moves per run: at most `MAX_TICKS · step` ns of virtual time.
pub const MAX_TICKS: u64 = 20_000;

/// xorshift64*: each thread its own stream.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The gap between a thread's clock reading and its decision: a few spins, and now
/// and then a yield (on two cores, another thread then runs a whole decision or the
/// ticker moves the clock in between).
pub fn stall(rng: &mut Rng) {
    for _ in 0..rng.below(48) {
        std::hint::spin_loop();
    }
    if rng.below(6) == 0 {
        std::thread::yield_now();
    }
}

/// Runs `workers` threads of `work(thread index)` while a ticker moves `clock` by
/// 1..=`step` ns at a time, exactly [`MAX_TICKS`] times, and runs `side` after each
/// move and after each turn of its loop once the clock stands; returns what the
/// workers return, in thread order.
///
/// The ticker runs until the workers are done *and* it has made all its moves, so
/// every run moves the clock `MAX_TICKS` times and runs `side` at least as often,
/// whatever the schedule: a ticker that starts only after the workers finished
/// (a loaded machine) still floods, flips or reclaims what a test's `side` does.
/// Whether those moves overlap the workers is the schedule's sample.
pub fn race<T: Send>(
    clock: &ManualClock,
    step: u64,
    workers: usize,
    side: impl Fn(&mut Rng) + Sync,
    work: impl Fn(usize) -> T + Sync,
) -> Vec<T> {
    let running = AtomicUsize::new(workers);
    std::thread::scope(|s| {
        let ticker = s.spawn(|| {
            let mut rng = Rng::new(0xC10C);
            let mut ticks = 0;
            while ticks < MAX_TICKS || running.load(Ordering::Acquire) > 0 {
                // A bounded run of virtual time (the window checks size their
                // counters by it): then the clock stands and the workers finish.
                if ticks < MAX_TICKS {
                    clock.advance(Duration::from_nanos(1 + rng.below(step)));
                    ticks += 1;
                }
                side(&mut rng);
                stall(&mut rng);
            }
        });
        let handles: Vec<_> = (0..workers)
            .map(|i| {
                let (work, running) = (&work, &running);
                s.spawn(move || {
                    let out = work(i);
                    running.fetch_sub(1, Ordering::Release);
                    out
                })
            })
            .collect();
        let out = handles
            .into_iter()
            .map(|h| h.join().expect("a worker never panics"))
            .collect();
        ticker.join().expect("the ticker never panics");
        out
    })
}

/// `limit` per `period`, burst `burst`.
pub fn policy(limit: u64, period: Duration, burst: u64) -> Policy {
    Policy::new(limit, period)
        .and_then(|p| p.with_burst(burst))
        .expect("a valid policy")
}
