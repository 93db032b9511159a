//! Which outcomes a loom model reached, counted over every execution loom explored.
//!
//! A model whose assertions tell outcomes apart (a read before or after a write, the
//! thread that won a race) proves nothing about an outcome loom never reached: a
//! thread that only reads may never be preempted at the interesting point, and the
//! model then runs in one order however high the preemption bound. A [`Seen`] is
//! counted with std atomics outside the model (loom does not reset them between
//! executions), and [`Seen::assert_each`] after `loom::model` fails unless every
//! named outcome was reached at least once, so a model cannot go blind silently.
#![allow(dead_code)] // each file uses what it needs

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

/// Counts of each named outcome over a model's executions.
#[derive(Clone)]
pub struct Seen {
    names: &'static [&'static str],
    counts: Arc<[AtomicUsize]>,
}

impl Seen {
    /// No outcome seen yet, of the outcomes `names` (indexed as given).
    pub fn new(names: &'static [&'static str]) -> Self {
        Seen {
            names,
            counts: names.iter().map(|_| AtomicUsize::new(0)).collect(),
        }
    }

    /// An execution reached outcome `i` (an index into the names).
    pub fn saw(&self, i: usize) {
        self.counts[i].fetch_add(1, Relaxed);
    }

    /// An execution reached outcome `i` if `cond`, outcome `j` otherwise.
    pub fn saw_if(&self, cond: bool, i: usize, j: usize) {
        self.saw(if cond { i } else { j });
    }

    /// How often each outcome was reached, by name.
    pub fn counts(&self) -> Vec<(&'static str, usize)> {
        self.names
            .iter()
            .zip(self.counts.iter())
            .map(|(&n, c)| (n, c.load(Relaxed)))
            .collect()
    }

    /// Fails, naming `model` and the counts, unless every outcome was reached.
    pub fn assert_each(&self, model: &str) {
        self.assert_each_of(model, &(0..self.names.len()).collect::<Vec<_>>());
    }

    /// Fails, naming `model` and the counts, unless each outcome in `wanted` (the
    /// ones some order reaches, where not every named outcome can be) was reached.
    pub fn assert_each_of(&self, model: &str, wanted: &[usize]) {
        let counts = self.counts();
        eprintln!("{model}: {counts:?}");
        assert!(
            wanted.iter().all(|&i| counts[i].1 > 0),
            "{model}: loom did not reach every outcome the model tells apart \
             (wanted {wanted:?}): {counts:?}"
        );
    }
}

/// The step names of [`Span::placement`]'s outcomes, for a [`Seen`].
pub const PLACEMENTS: &[&str] = &[
    "the racing step all before the other",
    "the racing step across the other",
    "the racing step all after the other",
];

/// Where one thread's step fell against another thread's step in an execution, for a
/// model whose result does not tell: the stepping thread marks the step's start and
/// end ([`Span::begin`], [`Span::end`]), the racing thread reads the mark before and
/// after its own step, and [`Span::placement`] names the order. The marks are
/// read-modify-writes, so each reads the latest mark (the schedule's order, not a
/// stale value loom could pick for a plain load), and `Relaxed`, so they order
/// nothing in the model (no happens-before the code under test does not make itself).
pub struct Span {
    mark: loom::sync::atomic::AtomicU8,
}

impl Default for Span {
    fn default() -> Self {
        Span {
            mark: loom::sync::atomic::AtomicU8::new(0),
        }
    }
}

impl Span {
    /// The stepping thread starts its step.
    pub fn begin(&self) {
        self.mark.swap(1, loom::sync::atomic::Ordering::Relaxed);
    }

    /// The stepping thread has ended its step.
    pub fn end(&self) {
        self.mark.swap(2, loom::sync::atomic::Ordering::Relaxed);
    }

    /// The mark now (0: not begun, 1: begun, 2: ended), read by the racing thread.
    pub fn mark(&self) -> u8 {
        self.mark
            .fetch_add(0, loom::sync::atomic::Ordering::Relaxed)
    }

    /// The index into [`PLACEMENTS`] of a racing step that read `before` and `after`
    /// with [`Span::mark`] around itself.
    pub fn placement(before: u8, after: u8) -> usize {
        match (before, after) {
            (_, 0) => 0,
            (2, _) => 2,
            _ => 1,
        }
    }
}

/// The distinct results a model's executions ended in, for a model with no outcome
/// its assertions tell apart (an unconditional account): results that differ between
/// executions show that loom ran the racing steps in more than one order.
#[derive(Clone, Default)]
pub struct Kinds {
    counts: Arc<std::sync::Mutex<std::collections::BTreeMap<String, usize>>>,
}

impl Kinds {
    /// An execution ended in `result`.
    pub fn saw(&self, result: impl std::fmt::Debug) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        *counts.entry(format!("{result:?}")).or_default() += 1;
    }

    /// Fails, naming `model` and the results, unless executions ended in at least
    /// `least` distinct results.
    pub fn assert_at_least(&self, model: &str, least: usize) {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        eprintln!("{model}: {counts:?}");
        assert!(
            counts.len() >= least,
            "{model}: loom's executions ended in {} distinct results, not the {least} its \
             orders give: {counts:?}",
            counts.len()
        );
    }
}
