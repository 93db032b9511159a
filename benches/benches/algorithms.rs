//! Every algorithm side by side: floodgate's lock-free cell vs its mutex twin vs the
//! textbook version under a `Mutex` (`textbook_mutex`), one thread (`uncontended`) and
//! two threads on one hot key (`contended/hot_key_2t`), on the allow path and the deny
//! path. The uncontended allow groups also hold floodgate's GCRA and the floor (one
//! clock read + one CAS), so the report shows every word-sized algorithm's cost as a
//! ratio to GCRA's. `benches/run-interleaved.sh` tables it with `SUITES=algorithms`.
//!
//! Every contender reads the same clock ([`DefaultClock`]) once per decision.
//!
//! * allow path: 1000 per 5 µs (2·10⁸/s, beyond what the loop can ask for), so every
//!   request is admitted and every decision writes;
//! * deny path: 1 per hour, exhausted before measuring, so every request is denied and
//!   nothing is written.
//!
//! Quick sanity run: `cargo bench -p floodgate-benches --bench algorithms --
//! --warm-up-time 1 --measurement-time 1 uncontended/fixed`.

// `criterion_group!` expands to an undocumented `pub fn`.
#![allow(missing_docs)]

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion};
use floodgate::reference::{
    TextbookFixedWindow, TextbookSlidingLog, TextbookSlidingWindow, TextbookTokenBucket,
};
use floodgate::{
    Algorithm, Clock, DefaultClock, FixedWindow, Gcra, Policy, RateLimiter, Shaper, SlidingLog,
    SlidingWindow,
};
use floodgate_benches::run_threads;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Admits everything the loop can ask for.
fn allow_policy() -> Policy {
    Policy::new(1000, Duration::from_micros(5)).expect("valid policy")
}

/// Denies everything after one admission.
fn deny_policy() -> Policy {
    Policy::per_hour(1).expect("valid policy")
}

#[derive(Clone, Copy, PartialEq, Eq)]
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

    fn policy(self) -> Policy {
        match self {
            Path::Allow => allow_policy(),
            Path::Deny => deny_policy(),
        }
    }
}

/// Benchmarks `decide` on `threads` threads at once (1: plain `iter`). With several
/// threads, [`run_threads`] runs `iters` decisions on each behind a start barrier and
/// the sample is the elapsed time over `threads`: the wall time per decision of the
/// whole machine, as in the GCRA suite.
fn contender<F: Fn() -> bool + Sync>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    id: &str,
    threads: usize,
    path: Path,
    decide: F,
) {
    // Exhaust the deny path before measuring; check the path is the one we claim.
    if path == Path::Deny {
        let _ = decide();
    }
    assert_eq!(
        decide(),
        path == Path::Allow,
        "{id}: not on the {} path",
        path.name()
    );
    if threads == 1 {
        group.bench_function(id, |b| b.iter(|| black_box(decide())));
        return;
    }
    group.bench_function(id, |b| {
        b.iter_custom(|iters| {
            let elapsed = run_threads(threads, iters, |_| {
                || {
                    black_box(decide());
                }
            });
            elapsed / threads as u32
        })
    });
}

fn group_name(threads: usize, algorithm: &str, path: Path) -> String {
    let kind = if threads == 1 {
        "uncontended".to_string()
    } else {
        format!("contended/hot_key_{threads}t")
    };
    format!("{kind}/{algorithm}/{}", path.name())
}

/// GCRA and the floor, in the uncontended allow groups, for the ratios.
fn references(group: &mut BenchmarkGroup<'_, WallTime>, threads: usize, path: Path) {
    if threads != 1 || path != Path::Allow {
        return;
    }
    let gcra = RateLimiter::new(Gcra::new(path.policy()));
    contender(group, "gcra", threads, path, || gcra.check().is_allowed());
    let clock = DefaultClock::new();
    let word = AtomicU64::new(0);
    contender(group, "floor", threads, path, || {
        let now = clock.now().as_u64();
        let cur = word.load(Ordering::Relaxed);
        word.compare_exchange(cur, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    });
}

/// One window algorithm's group: floodgate's cell, its mutex twin and the textbook
/// window (`textbook` builds it from limit, period and now; `allow` asks it).
fn window<A, T, F>(
    c: &mut Criterion,
    name: &str,
    threads: usize,
    path: Path,
    engine: fn(Policy) -> A,
    textbook: fn(u64, u64, u64) -> T,
    allow: F,
) where
    A: Algorithm,
    T: Send,
    F: Fn(&mut T, u64, u64) -> bool + Sync,
{
    let mut group = c.benchmark_group(group_name(threads, name, path));
    let policy = path.policy();
    let atomic = RateLimiter::new(engine(policy));
    contender(&mut group, "floodgate", threads, path, || {
        atomic.check().is_allowed()
    });
    let twin = RateLimiter::locked_with_clock(engine(policy), DefaultClock::new());
    contender(&mut group, "mutex_twin", threads, path, || {
        twin.check().is_allowed()
    });
    let clock = DefaultClock::new();
    let textbook = Mutex::new(textbook(
        policy.limit(),
        policy.period_nanos(),
        clock.now().as_u64(),
    ));
    contender(&mut group, "textbook_mutex", threads, path, || {
        let now = clock.now().as_u64();
        allow(&mut textbook.lock().expect("unpoisoned"), now, 1)
    });
    references(&mut group, threads, path);
    group.finish();
}

fn fixed_window(c: &mut Criterion, threads: usize, path: Path) {
    window(
        c,
        "fixed_window",
        threads,
        path,
        |policy| FixedWindow::new(policy).expect("fits"),
        TextbookFixedWindow::new,
        TextbookFixedWindow::allow,
    );
}

fn sliding_window(c: &mut Criterion, threads: usize, path: Path) {
    window(
        c,
        "sliding_window",
        threads,
        path,
        |policy| SlidingWindow::new(policy).expect("fits"),
        TextbookSlidingWindow::new,
        TextbookSlidingWindow::allow,
    );
}

fn sliding_log(c: &mut Criterion, threads: usize, path: Path) {
    let mut group = c.benchmark_group(group_name(threads, "sliding_log", path));
    let policy = path.policy();
    let log = SlidingLog::new(policy);
    contender(&mut group, "floodgate", threads, path, || {
        log.check().is_allowed()
    });
    let clock = DefaultClock::new();
    let textbook = Mutex::new(TextbookSlidingLog::new(
        policy.limit() as usize,
        policy.period_nanos(),
    ));
    contender(&mut group, "textbook_mutex", threads, path, || {
        let now = clock.now().as_u64();
        textbook.lock().expect("unpoisoned").allow(now)
    });
    group.finish();
}

fn shaping(c: &mut Criterion, threads: usize, path: Path) {
    let mut group = c.benchmark_group(group_name(threads, "shaping", path));
    let policy = path.policy();
    // Allow: slots within a second are granted; deny: no wait is accepted.
    let max_delay = match path {
        Path::Allow => Duration::from_secs(1),
        Path::Deny => Duration::ZERO,
    };
    let atomic = Shaper::new(policy);
    contender(&mut group, "floodgate", threads, path, || {
        atomic.reserve(1, max_delay).is_ok()
    });
    let twin = Shaper::locked_with_clock(policy, DefaultClock::new());
    contender(&mut group, "mutex_twin", threads, path, || {
        twin.reserve(1, max_delay).is_ok()
    });
    let clock = DefaultClock::new();
    let bucket = Mutex::new(TextbookTokenBucket::new(
        policy.burst() as f64,
        policy.limit() as f64,
        policy.period(),
        clock.now().as_u64(),
    ));
    contender(&mut group, "textbook_mutex", threads, path, || {
        let now = clock.now().as_u64();
        bucket.lock().expect("unpoisoned").allow(now, 1.0)
    });
    group.finish();
}

fn all(c: &mut Criterion) {
    for threads in [1, 2] {
        for path in [Path::Allow, Path::Deny] {
            fixed_window(c, threads, path);
            sliding_window(c, threads, path);
            sliding_log(c, threads, path);
            shaping(c, threads, path);
        }
    }
}

criterion_group!(benches, all);
criterion_main!(benches);
