//! A clock set by hand to any instant, earlier ones too (shared by the `keyed` and
//! `plans` targets, each of which includes this file as a module): `ManualClock::set`
//! silently ignores an earlier instant, so it can neither step a table's clock back nor
//! follow a model to the instant a table judges at (its shard's `max(now, R)`, which
//! moves back and forth between shards once readings run ahead of the clock).
#![allow(dead_code)]

use floodgate::{Clock, Nanos};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Debug, Default)]
pub(crate) struct AnyClock(Arc<AtomicU64>);

impl AnyClock {
    pub(crate) fn set(&self, t: Nanos) {
        self.0.store(t.as_u64(), Ordering::Relaxed);
    }

    pub(crate) fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.set(Nanos::new(self.now().as_u64().saturating_add(by)));
    }
}

impl Clock for AnyClock {
    fn now(&self) -> Nanos {
        Nanos::new(self.0.load(Ordering::Relaxed))
    }
}
