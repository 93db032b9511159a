//! What the clock read adds to one keyed decision: floodgate's keyed limiter and
//! governor's keyed store (DashMap, ahash), each with its production clock, with a
//! counter for a clock (no time-stamp counter read at all), and with the counter plus
//! a production clock read whose value is thrown away. One thread, `u64` keys idle
//! between visits (the matrix's GCRA policy), capacity = keys, inline storage.
//!
//! ```text
//! cargo run -p floodgate-benches --profile bench --example clock_cost -- 20000000 5 10000
//! ```
//!
//! Arguments: decisions per round, rounds, keys. The rows alternate within each
//! round; the median and range over rounds are printed, in ns per decision. If a
//! decision hid its clock read behind its other work (the read does not wait for
//! memory and nothing needs its value until the CAS), its "production clock" row
//! would cost what its "counter" row does; the "read, unused" row shows what the read
//! costs when nothing waits for its value.

use std::hint::black_box;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use floodgate::{Clock, DefaultClock, Gcra, Inline, KeyedBuilder, KeyedLimiter, Nanos};
use floodgate_bench::keys::key_for;
use floodgate_bench::matrix::{gcra_policy, governor_quota};
use floodgate_bench::median_and_range;
use governor::state::keyed::DashMapStateStore;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A clock that reads a counter the loop moves by a plain store (no read-modify-write,
/// no time-stamp counter): shared by both limiters' "counter" rows.
#[derive(Clone)]
struct Counter(Arc<AtomicU64>);

impl Counter {
    fn tick(&self) {
        let c = &self.0;
        c.store(c.load(Ordering::Relaxed) + 3, Ordering::Relaxed);
    }
}

impl Clock for Counter {
    fn now(&self) -> Nanos {
        Nanos::new(self.0.load(Ordering::Relaxed))
    }
}

impl governor::clock::Clock for Counter {
    type Instant = governor::nanos::Nanos;

    fn now(&self) -> Self::Instant {
        self.0.load(Ordering::Relaxed).into()
    }
}

/// governor's keyed store on the counter clock.
type GovernorOnCounter = governor::RateLimiter<
    u64,
    DashMapStateStore<u64, ahash::RandomState>,
    Counter,
    governor::middleware::NoOpMiddleware<governor::nanos::Nanos>,
>;

fn floodgate_on<C: Clock>(clock: C, keys: u64) -> KeyedLimiter<u64, Gcra, C, Inline> {
    KeyedBuilder::new(Gcra::new(gcra_policy()))
        .clock(clock)
        .capacity(keys as usize)
        .build_in::<u64, Inline>()
        .expect("a valid capacity")
}

fn main() -> ExitCode {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let [ops, rounds, keys] = args[..] else {
        eprintln!("usage: clock_cost <decisions per round> <rounds> <keys>");
        return ExitCode::from(2);
    };
    if ops == 0 || rounds == 0 || keys == 0 || keys > 1 << 26 {
        eprintln!("decisions and rounds must be positive, keys 1 to 2^26");
        return ExitCode::from(2);
    }
    let counter = Counter(Arc::new(AtomicU64::new(1)));
    let product = DefaultClock::new();
    let quanta = quanta::Clock::new();

    let fg = floodgate_on(product, keys);
    let fg_counter = floodgate_on(counter.clone(), keys);
    let fg_unused = floodgate_on(counter.clone(), keys);
    let gov =
        governor::RateLimiter::dashmap_with_hasher(governor_quota(), ahash::RandomState::new());
    let gov_store = || DashMapStateStore::with_hasher(ahash::RandomState::new());
    let gov_counter: GovernorOnCounter =
        governor::RateLimiter::new(governor_quota(), gov_store(), counter.clone());
    let gov_unused: GovernorOnCounter =
        governor::RateLimiter::new(governor_quota(), gov_store(), counter.clone());
    // Every key inserted before timing, as the matrix does.
    for k in 0..keys {
        let _ = (fg.check(&k), fg_counter.check(&k), fg_unused.check(&k));
        let _ = (
            gov.check_key(&k),
            gov_counter.check_key(&k),
            gov_unused.check_key(&k),
        );
    }

    type Row<'a> = (&'static str, Box<dyn Fn(u64) -> bool + 'a>);
    let rows: Vec<Row<'_>> = vec![
        (
            "floodgate, its clock",
            Box::new(|k| fg.check(&k).is_allowed()),
        ),
        (
            "floodgate, a counter",
            Box::new(|k| {
                counter.tick();
                fg_counter.check(&k).is_allowed()
            }),
        ),
        (
            "floodgate, a counter + its clock read, unused",
            Box::new(|k| {
                black_box(product.now());
                counter.tick();
                fg_unused.check(&k).is_allowed()
            }),
        ),
        (
            "governor, its clock",
            Box::new(|k| gov.check_key(&k).is_ok()),
        ),
        (
            "governor, a counter",
            Box::new(|k| {
                counter.tick();
                gov_counter.check_key(&k).is_ok()
            }),
        ),
        (
            "governor, a counter + its clock read, unused",
            Box::new(|k| {
                black_box(quanta.now());
                counter.tick();
                gov_unused.check_key(&k).is_ok()
            }),
        ),
        (
            "floodgate's clock read alone",
            Box::new(|_| {
                black_box(product.now());
                true
            }),
        ),
        (
            "governor's clock read alone",
            Box::new(|_| {
                black_box(quanta.now());
                true
            }),
        ),
    ];

    let mut ns: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    let mut op = 0u64;
    for _ in 0..rounds {
        for (row, (_, decide)) in rows.iter().enumerate() {
            let start = Instant::now();
            let mut allowed = 0u64;
            for _ in 0..ops {
                allowed += u64::from(decide(key_for(0, op, keys)));
                op = op.wrapping_add(1);
            }
            let elapsed = start.elapsed().as_nanos() as f64;
            black_box(allowed);
            ns[row].push(elapsed / ops as f64);
        }
    }
    println!(
        "{keys} keys, {ops} decisions a round, {rounds} rounds: ns per decision, median [min–max]"
    );
    for ((name, _), runs) in rows.iter().zip(ns) {
        println!("{name:48} {}", median_and_range(runs));
    }
    ExitCode::SUCCESS
}
