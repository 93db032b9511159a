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
