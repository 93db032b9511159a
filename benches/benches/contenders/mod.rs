//! The GCRA contenders, shared by the criterion suite (`gcra.rs`) and the
//! instruction-count probe (`examples/decision_cost.rs`): floodgate's lock-free limiter,
//! its mutex twin, the textbook `Mutex<f64 bucket>`, governor and the floor, each behind
//! one "decide one unit now" call, configured for the allow or the deny path.
//!
//! This directory has no `main.rs`, so cargo does not take it for a bench target.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use floodgate::reference::TextbookTokenBucket;
use floodgate::{Clock, DefaultClock, Gcra, Policy, RateLimiter};
use governor::Quota;

/// The rate of the allow-path policy: 10^9 per second (`T` = 1 ns), far above what any
/// thread can ask for at tens of nanoseconds per decision.
const ALLOW_RATE: u32 = 1_000_000_000;

/// Which decision a path must produce on every call.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Path {
    /// A policy so generous it never denies.
    Allow,
    /// A policy drained before the run: every decision is a denial.
    Deny,
}

impl Path {
    pub fn name(self) -> &'static str {
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
pub trait Contender: Sync {
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
pub trait Visit {
    fn visit<C: Contender>(&mut self, name: &'static str, contender: C);
}

/// Hands every contender for `path` to `visitor`, each validated first and, on the deny
/// path, already drained.
pub fn for_each_contender(path: Path, with_floor: bool, visitor: &mut impl Visit) {
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
pub fn expect_path(name: &str, path: Path, unexpected: u64) {
    assert_eq!(
        unexpected,
        0,
        "{name} on the {} path: {unexpected} decisions went the other way; the benchmark policy is wrong",
        path.name()
    );
}
