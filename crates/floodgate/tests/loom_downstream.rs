//! What a downstream crate gets: a proxy that embeds floodgate and model-checks its
//! own code with loom. Built with `RUSTFLAGS="--cfg loom"`, floodgate's atomics are
//! loom's too, so loom explores the interleavings inside `check` as well as the
//! proxy's own; the proxy uses the `ManualClock`, which works under loom.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=4 cargo test -p floodgate --release --test loom_downstream`
#![cfg(loom)]

mod loom_seen;
use loom_seen::Seen;

use floodgate::{Gcra, ManualClock, Nanos, Policy, RateLimiter};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

/// A toy gateway: counts requests it forwarded and requests it rejected with 429.
struct Gateway {
    limiter: RateLimiter<Gcra, ManualClock>,
    forwarded: AtomicUsize,
    rejected: AtomicUsize,
}

impl Gateway {
    fn handle(&self) -> u16 {
        if self.limiter.check().is_allowed() {
            self.forwarded.fetch_add(1, Ordering::Relaxed);
            200
        } else {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            429
        }
    }
}

#[test]
fn gateway_forwards_exactly_the_burst() {
    let seen = Seen::new(&["spawned thread forwarded", "main thread forwarded"]);
    let s = seen.clone();
    loom::model(move || {
        let policy = Policy::per_minute(1).unwrap().with_burst(1).unwrap();
        let gateway = Arc::new(Gateway {
            limiter: RateLimiter::gcra_with_clock(
                policy,
                ManualClock::starting_at(Nanos::from_secs(1)),
            ),
            forwarded: AtomicUsize::new(0),
            rejected: AtomicUsize::new(0),
        });
        let other = {
            let gateway = Arc::clone(&gateway);
            thread::spawn(move || gateway.handle())
        };
        let mine = gateway.handle();
        let theirs = other.join().unwrap();
        let mut statuses = [mine, theirs];
        statuses.sort_unstable();
        assert_eq!(statuses, [200, 429]);
        assert_eq!(gateway.forwarded.load(Ordering::Relaxed), 1);
        assert_eq!(gateway.rejected.load(Ordering::Relaxed), 1);
        s.saw_if(mine == 200, 1, 0);
    });
    seen.assert_each("gateway_forwards_exactly_the_burst");
}
