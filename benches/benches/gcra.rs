//! GCRA side by side: floodgate's lock-free limiter, its mutex twin, the textbook
//! `Mutex<f64 bucket>`, governor, and the floor (one clock read + one CAS).
//!
//! Groups (benchmark ids are `<group>/<case>/<contender>`):
//!
//! * `uncontended/allow/*` — one thread, a policy so generous it never denies;
//! * `uncontended/deny/*` — one thread, a policy drained before the run (1 per hour);
//! * `contended/hot_key_2t/*` — two threads on one limiter, allow path; the time is per
//!   operation of the pair, so criterion's throughput is the total decisions per second.
//!
//! Every contender reads the allow bit of each decision and counts the unexpected ones;
//! a run that denied on the allow path (or admitted on the deny path) panics, so a
//! misconfigured policy cannot produce a flattering number.
//!
//! Run: `cargo bench -p floodgate-benches --bench gcra`; for tables over several
//! interleaved runs, `benches/run-interleaved.sh`.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use floodgate::reference::TextbookTokenBucket;
use floodgate::{Clock, DefaultClock, Gcra, Policy, RateLimiter};
use floodgate_benches::run_threads;
use governor::Quota;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Threads in the contended run.
const THREADS: usize = 2;

/// The rate of the allow-path policy: 10^9 per second (`T` = 1 ns), far above what any
/// thread can ask for at tens of nanoseconds per decision.
const ALLOW_RATE: u32 = 1_000_000_000;

/// Which decision a path must produce on every call.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path {
    Allow,
    Deny,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Allow => "allow",
            Path::Deny => "deny",
        }
    }

    /// Floodgate's policy: never exhausted (`Allow`), or 1 per hour (`Deny`).
    fn policy(self) -> Policy {
        let policy = match self {
            // B·T = 2^40 ns ≈ 18 minutes of credit on top of the 1 ns refill.
            Path::Allow => {
                Policy::per_second(u64::from(ALLOW_RATE)).and_then(|p| p.with_burst(1 << 40))
            }
            Path::Deny => Policy::per_hour(1),
        };
        policy.expect("benchmark policies are valid")
    }

    /// The same limits as a governor quota.
    fn quota(self) -> Quota {
        match self {
            Path::Allow => Quota::per_second(nonzero(ALLOW_RATE)).allow_burst(NonZeroU32::MAX),
            Path::Deny => Quota::per_hour(nonzero(1)),
        }
    }

    /// The same limits as the textbook `f64` token bucket, created at `now`.
    fn textbook(self, now: u64) -> TextbookTokenBucket {
        match self {
            Path::Allow => TextbookTokenBucket::new(
                (1u64 << 40) as f64,
                f64::from(ALLOW_RATE),
                Duration::from_secs(1),
                now,
            ),
            Path::Deny => TextbookTokenBucket::new(1.0, 1.0, Duration::from_secs(3600), now),
        }
    }
}

fn nonzero(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("non-zero quota")
}

/// One contender: a limiter behind a uniform "decide one unit now" call.
trait Contender: Sync {
    /// Decides one request now; `true` if admitted.
    fn decide(&self) -> bool;
}

/// floodgate's lock-free limiter (and, with another cell type, its mutex twin).
impl<S> Contender for RateLimiter<Gcra, DefaultClock, S>
where
    S: floodgate::StateCell<floodgate::GcraState>,
{
    #[inline]
    fn decide(&self) -> bool {
        self.check().is_allowed()
    }
}

/// The seed article's bucket behind a std `Mutex`, fed the same clock as floodgate.
struct TextbookMutex {
    clock: DefaultClock,
    bucket: Mutex<TextbookTokenBucket>,
}

impl Contender for TextbookMutex {
    #[inline]
    fn decide(&self) -> bool {
        // Clock read outside the lock, as floodgate's mutex twin does.
        let now = self.clock.now().as_u64();
        let mut bucket = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        bucket.allow(now, 1.0)
    }
}

/// governor's direct limiter on its default (quanta) clock.
impl Contender for governor::DefaultDirectRateLimiter {
    #[inline]
    fn decide(&self) -> bool {
        self.check().is_ok()
    }
}

/// The floor: one quanta clock read (the read governor's clock does) and one
/// uncontended CAS of the reading into an atomic word. No limiter can do less.
struct Floor {
    clock: quanta::Clock,
    word: AtomicU64,
}

impl Contender for Floor {
    #[inline]
    fn decide(&self) -> bool {
        let now = self.clock.delta_as_nanos(0, self.clock.raw());
        let current = self.word.load(Ordering::Relaxed);
        self.word
            .compare_exchange_weak(
                current,
                black_box(now),
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
    }
}

/// Receives each contender by value, so every benchmark loop is monomorphised for its
/// contender (no virtual call in any measured loop, the floor included).
trait Visit {
    fn visit<C: Contender>(&mut self, name: &'static str, contender: C);
}

/// Hands every contender for `path` to `visitor`, each validated first and, on the deny
/// path, already drained.
fn for_each_contender(path: Path, with_floor: bool, visitor: &mut impl Visit) {
    let clock = DefaultClock::new();
    visit_checked(visitor, path, "floodgate", RateLimiter::gcra(path.policy()));
    visit_checked(
        visitor,
        path,
        "mutex_twin",
        RateLimiter::locked_with_clock(Gcra::new(path.policy()), DefaultClock::new()),
    );
    visit_checked(
        visitor,
        path,
        "textbook_mutex",
        TextbookMutex {
            clock,
            bucket: Mutex::new(path.textbook(clock.now().as_u64())),
        },
    );
    visit_checked(
        visitor,
        path,
        "governor",
        governor::RateLimiter::direct(path.quota()),
    );
    if with_floor {
        let floor = Floor {
            clock: quanta::Clock::new(),
            word: AtomicU64::new(0),
        };
        visit_checked(visitor, path, "floor", floor);
    }
}

fn visit_checked<C: Contender>(visitor: &mut impl Visit, path: Path, name: &'static str, c: C) {
    // Validate the set-up: the first decision is an admission on both paths (the deny
    // path spends its only unit here; the floor has no deny path).
    assert!(c.decide(), "{name}: the first request must be admitted");
    if path == Path::Deny {
        assert!(!c.decide(), "{name}: the deny path must be drained");
    }
    visitor.visit(name, c);
}

/// Panics if a run produced a decision its path forbids.
fn expect_path(name: &str, path: Path, unexpected: u64) {
    assert_eq!(
        unexpected,
        0,
        "{name} on the {} path: {unexpected} decisions went the other way; the benchmark policy is wrong",
        path.name()
    );
}

type Group<'a> = BenchmarkGroup<'a, WallTime>;

/// One thread, one decision per iteration.
struct Uncontended<'g, 'c> {
    group: &'g mut Group<'c>,
    path: Path,
}

impl Visit for Uncontended<'_, '_> {
    fn visit<C: Contender>(&mut self, name: &'static str, contender: C) {
        let expected = self.path == Path::Allow;
        let mut unexpected = 0u64;
        self.group
            .bench_function(format!("{}/{name}", self.path.name()), |b| {
                b.iter(|| {
                    if contender.decide() != expected {
                        unexpected += 1;
                    }
                });
            });
        expect_path(name, self.path, unexpected);
    }
}

/// `THREADS` threads on one limiter (the hot key), allow path.
struct HotKey<'g, 'c> {
    group: &'g mut Group<'c>,
}

impl Visit for HotKey<'_, '_> {
    fn visit<C: Contender>(&mut self, name: &'static str, contender: C) {
        let denied = AtomicU64::new(0);
        self.group
            .bench_function(format!("hot_key_{THREADS}t/{name}"), |b| {
                b.iter_custom(|iters| {
                    let elapsed = run_threads(THREADS, iters, |_| {
                        || {
                            if !contender.decide() {
                                // Never taken on the allow path: no shared write in the loop.
                                denied.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    });
                    // `iters` decisions per thread: the wall time per decision of the
                    // whole machine is the elapsed time over THREADS · iters.
                    elapsed / THREADS as u32
                });
            });
        expect_path(name, Path::Allow, denied.load(Ordering::Relaxed));
    }
}

fn uncontended(c: &mut Criterion) {
    let mut group = c.benchmark_group("uncontended");
    group.throughput(Throughput::Elements(1));
    for path in [Path::Allow, Path::Deny] {
        // The floor has no denial to measure: it is the allow path's reference.
        let mut visitor = Uncontended {
            group: &mut group,
            path,
        };
        for_each_contender(path, path == Path::Allow, &mut visitor);
    }
    group.finish();
}

fn contended(c: &mut Criterion) {
    let mut group = c.benchmark_group("contended");
    // The time reported is per decision of the whole machine, so the throughput shown
    // is the total decisions per second of all threads.
    group.throughput(Throughput::Elements(1));
    for_each_contender(Path::Allow, false, &mut HotKey { group: &mut group });
    group.finish();
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    uncontended(&mut criterion);
    contended(&mut criterion);
    criterion.final_summary();
}
