//! Composite charges with receipts (`charge_all` / `refund_all`): all or nothing, and
//! a refund gives back at most each limit's own charge — across limit kinds, after
//! the key's entry was removed or evicted, and under many threads.
#![cfg(not(loom))]

use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use floodgate::keyed::composite::{charge_all, refund_all, Limit};
use floodgate::keyed::log::KeyedSlidingLog;
use floodgate::keyed::plans::{PlanLimiter, Plans};
use floodgate::{
    Algorithm, Decision, FixedWindow, Gcra, Heap, KeyedBuilder, KeyedLimiter, ManualClock, Nanos,
    Policy, PolicyId, RateLimiter, Receipt, SlidingLog, Storage,
};

/// A keyed limiter of `algorithm` on `clock` (heap storage, default capacity).
fn keyed<K, A>(algorithm: A, clock: &ManualClock) -> KeyedLimiter<K, A, ManualClock>
where
    A: Algorithm,
    Heap: Storage<K, A::State>,
{
    KeyedBuilder::new(algorithm)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// `limit` units per `period`, one window per key.
fn windows<K>(
    limit: u64,
    period: Duration,
    clock: &ManualClock,
) -> KeyedLimiter<K, FixedWindow, ManualClock>
where
    Heap: Storage<K, <FixedWindow as Algorithm>::State>,
{
    keyed(
        FixedWindow::new(Policy::new(limit, period).unwrap()).unwrap(),
        clock,
    )
}

/// `limit` units per `period`, one exact log per key.
fn logs<K: Hash + Eq + Clone>(
    limit: u64,
    period: Duration,
    clock: &ManualClock,
) -> KeyedSlidingLog<K, ManualClock> {
    KeyedBuilder::default()
        .clock(clock.clone())
        .sliding_log::<K>(Policy::new(limit, period).unwrap())
        .unwrap()
}

/// `burst` failed logins per 15 minutes per user name.
fn per_user(burst: u64, clock: &ManualClock) -> KeyedLimiter<String, Gcra, ManualClock> {
    keyed(
        Gcra::new(Policy::new(burst, Duration::from_secs(900)).unwrap()),
        clock,
    )
}

/// Every limit kind in one composite: a success gives every charge back, a failure
/// keeps every one.
#[test]
fn a_success_gives_back_every_limit_kind_and_a_failure_keeps_them() {
    let clock = ManualClock::new();
    let gcra = RateLimiter::gcra_with_clock(Policy::per_minute(10).unwrap(), clock.clone());
    let log = SlidingLog::with_clock(Policy::per_minute(10).unwrap(), clock.clone());
    let window: KeyedLimiter<u32, FixedWindow, ManualClock> =
        windows(10, Duration::from_secs(60), &clock);
    let keyed_log = logs::<String>(10, Duration::from_secs(60), &clock);
    let plans = Plans::classic();
    let free = plans.id("free").unwrap();
    let plan = PlanLimiter::new(
        &plans,
        move |_: &u64| free,
        KeyedBuilder::default().clock(clock.clone()),
    )
    .unwrap();
    let (user, ip) = ("alice".to_owned(), 7u64);
    let limits = [
        &gcra as &dyn Limit,
        &log,
        &window.limit(&3),
        &keyed_log.limit(&user),
        &plan.limit(&ip),
    ];
    let remaining = || -> Vec<u64> { limits.iter().map(|l| l.peek(0).remaining()).collect() };
    let full = remaining();

    let (admitted, receipt) = charge_all(&limits, 2);
    assert!(admitted.is_allowed() && receipt.is_charged());
    let charged: Vec<u64> = full.iter().map(|r| r - 2).collect();
    assert_eq!(remaining(), charged);
    assert_eq!(refund_all(&limits, receipt), limits.len());
    assert_eq!(remaining(), full);

    // A failure keeps its charge on every limit.
    let (admitted, _kept) = charge_all(&limits, 2);
    assert!(admitted.is_allowed());
    assert_eq!(remaining(), charged);
}

/// A denial leaves no limit charged, and its receipt holds nothing to give back.
#[test]
fn a_denial_charges_nothing_and_its_receipt_gives_nothing() {
    let clock = ManualClock::new();
    // A window: its refunds are exact while the window stands (a GCRA refund after
    // the denial's own rollback may give back less, by the refund ledger's rule).
    let wide = RateLimiter::fixed_window_with_clock(Policy::per_minute(10).unwrap(), clock.clone())
        .unwrap();
    let users = per_user(1, &clock);
    let tight = users.limit("alice");
    let limits = [&wide as &dyn Limit, &tight];

    let (first, held) = charge_all(&limits, 1);
    assert!(first.is_allowed());
    assert_eq!(wide.peek(0).remaining(), 9);
    let (denied, nothing) = charge_all(&limits, 1);
    assert!(!denied.is_allowed());
    assert!(!nothing.is_charged());
    assert_eq!(
        wide.peek(0).remaining(),
        9,
        "the denial's charge on `wide` stayed"
    );
    assert_eq!(refund_all(&limits, nothing), 0);
    assert_eq!(wide.peek(0).remaining(), 9);
    assert!(!users.peek("alice", 1).is_allowed());

    // The admission's receipt still gives back exactly its own unit.
    assert_eq!(refund_all(&limits, held), 2);
    assert_eq!(wide.peek(0).remaining(), 10);
    assert_eq!(users.peek("alice", 0).remaining(), 1);
}

/// A refund gives back the composite's own units and no one else's: units charged
/// by other requests since stay charged, and receipts handed to the wrong limits give
/// nothing.
#[test]
fn a_refund_is_at_most_its_own_charge() {
    let clock = ManualClock::new();
    let users = per_user(10, &clock);
    let window: KeyedLimiter<u32, FixedWindow, ManualClock> =
        windows(10, Duration::from_secs(60), &clock);
    let (alice, ip) = (users.limit("alice"), window.limit(&1));
    let limits = [&alice as &dyn Limit, &ip];

    let (mine, receipt) = charge_all(&limits, 2);
    assert!(mine.is_allowed());
    let (theirs, _kept) = charge_all(&limits, 3);
    assert!(theirs.is_allowed());
    // In the wrong order each receipt meets another limit: nothing comes back.
    let (again, swapped) = charge_all(&limits, 1);
    assert!(again.is_allowed());
    assert_eq!(refund_all(&[&ip, &alice], swapped), 0);
    assert_eq!(users.peek("alice", 0).remaining(), 4);
    assert_eq!(window.peek(&1, 0).remaining(), 4);

    assert_eq!(refund_all(&limits, receipt), 2);
    assert_eq!(users.peek("alice", 0).remaining(), 6);
    assert_eq!(window.peek(&1, 0).remaining(), 6);
}

/// The per-user entry is removed (a `reset`) between the charge and the refund, and
/// an attacker spends the new entry: the refund gives nothing back to it, only to the
/// per-address limit, whose entry is the charge's own.
#[test]
fn a_refund_after_the_key_was_removed_gives_the_new_entry_nothing() {
    let clock = ManualClock::new();
    let users = per_user(5, &clock);
    let ips: KeyedLimiter<u32, Gcra, ManualClock> =
        keyed(Gcra::new(Policy::per_hour(20).unwrap()), &clock);
    let (alice, home) = (users.limit("alice"), ips.limit(&1));
    let limits = [&alice as &dyn Limit, &home];

    let (owner, receipt) = charge_all(&limits, 1);
    assert!(owner.is_allowed());
    assert!(users.reset("alice"));
    for _ in 0..5 {
        assert!(users.check("alice").is_allowed()); // the attacker's guesses
    }
    assert_eq!(refund_all(&limits, receipt), 1);
    assert!(
        !users.peek("alice", 1).is_allowed(),
        "the attacker's guess was forgiven"
    );
    assert_eq!(ips.peek(&1, 0).remaining(), 20);
}

/// A flood of unique user names evicts the owner's entry between her charge and her
/// refund; the attacker then spends the re-created entry. The refund must not give
/// the attacker's units back.
#[test]
fn a_refund_after_the_key_was_evicted_gives_the_new_entry_nothing() {
    let clock = ManualClock::new();
    let users: KeyedLimiter<String, Gcra, ManualClock> =
        KeyedBuilder::new(Gcra::new(Policy::per_hour(5).unwrap()))
            .capacity(16)
            .shards(1)
            .clock(clock.clone())
            .build()
            .unwrap();
    let global = RateLimiter::gcra_with_clock(Policy::per_hour(1_000).unwrap(), clock.clone());
    let alice = users.limit("alice");
    let limits = [&global as &dyn Limit, &alice];

    let (owner, receipt) = charge_all(&limits, 1);
    assert!(owner.is_allowed());
    for n in 0..200 {
        let _ = users.check_n(format!("flood{n}").as_str(), 5);
    }
    assert_eq!(
        users.peek("alice", 0).remaining(),
        5,
        "alice's entry was not evicted: the test proves nothing"
    );
    for _ in 0..5 {
        assert!(users.check("alice").is_allowed());
    }
    assert_eq!(refund_all(&limits, receipt), 1);
    assert!(
        !users.peek("alice", 1).is_allowed(),
        "the attacker's guess was forgiven"
    );
    assert_eq!(global.peek(0).remaining(), 1_000);
}

const USERS: usize = 3;

/// Many threads, each round one composite for one of [`USERS`] users under a frozen
/// clock: `round(user, cost, give_back)` charges it and, when `give_back`, refunds
/// it, answering `None` for a denial and otherwise whether every limit gave its
/// units back. Returns the units each user's admissions still hold (admitted, and
/// not or not wholly given back) and how many composites were given back whole.
fn hammer(round: &(dyn Fn(usize, u32, bool) -> Option<bool> + Sync)) -> (Vec<u64>, u64) {
    const THREADS: u64 = 8;
    const ROUNDS: u64 = 400;
    let held: Vec<AtomicU64> = (0..USERS).map(|_| AtomicU64::new(0)).collect();
    let whole = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (held, whole) = (&held, &whole);
            scope.spawn(move || {
                for n in 0..ROUNDS {
                    let user = ((t + n) % USERS as u64) as usize;
                    let cost = (n % 2 + 1) as u32;
                    match round(user, cost, n % 2 == 0) {
                        None => {}
                        Some(true) => {
                            whole.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(false) => {
                            held[user].fetch_add(u64::from(cost), Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    let held: Vec<u64> = held.iter().map(|h| h.load(Ordering::Relaxed)).collect();
    let whole = whole.load(Ordering::Relaxed);
    assert!(whole > 0, "no composite was given back");
    assert!(
        held.iter().all(|&h| h > 0),
        "a user holds nothing: {held:?}"
    );
    (held, whole)
}

/// `charge_all`, then `refund_all` when `give_back`, for [`hammer`].
fn charge_and_maybe_refund(limits: &[&dyn Limit], cost: u32, give_back: bool) -> Option<bool> {
    let (decision, receipt) = charge_all(limits, cost);
    if !decision.is_allowed() {
        assert!(!receipt.is_charged(), "a denial kept a receipt");
        return None;
    }
    Some(give_back && refund_all(limits, receipt) == limits.len())
}

/// Counting limits (windows and logs, direct and keyed) give a charge back exactly
/// while its window stands, so under threads each must end holding exactly the units
/// of the admissions not given back: a denial that left a charge behind, or a refund
/// of another request's units, would break it.
#[test]
fn many_threads_on_counting_limits_end_exactly_at_what_they_hold() {
    let clock = ManualClock::new();
    let window =
        RateLimiter::fixed_window_with_clock(Policy::per_hour(40).unwrap(), clock.clone()).unwrap();
    let log = SlidingLog::with_clock(Policy::per_hour(30).unwrap(), clock.clone());
    let windows: KeyedLimiter<usize, FixedWindow, ManualClock> =
        windows(15, Duration::from_secs(3600), &clock);
    let logs = logs::<usize>(12, Duration::from_secs(3600), &clock);
    let (held, _) = hammer(&|user, cost, give_back| {
        let limits = [
            &window as &dyn Limit,
            &logs.limit(&user),
            &windows.limit(&user),
            &(&log).with_policy_id(PolicyId::new(4)),
        ];
        charge_and_maybe_refund(&limits, cost, give_back)
    });
    let total: u64 = held.iter().sum();
    for (user, &units) in held.iter().enumerate() {
        assert_eq!(logs.peek(&user, 0).remaining(), 12 - units, "user {user}");
        assert_eq!(
            windows.peek(&user, 0).remaining(),
            15 - units,
            "user {user}"
        );
    }
    assert_eq!(window.peek(0).remaining(), 40 - total);
    assert_eq!(log.peek(0).remaining(), 30 - total);
}

/// One limit of a composite that tells whether its own refund gave anything back:
/// `refund_all` counts the limits that did, not which.
struct Tally<'a> {
    inner: &'a dyn Limit,
    gave: std::sync::atomic::AtomicBool,
}

impl<'a> Tally<'a> {
    fn new(inner: &'a dyn Limit) -> Self {
        Tally {
            inner,
            gave: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn gave(&self) -> bool {
        self.gave.load(Ordering::Relaxed)
    }
}

impl Limit for Tally<'_> {
    fn now(&self) -> Nanos {
        self.inner.now()
    }
    fn charge_at(&self, now: Nanos, cost: u32) -> (Decision, Receipt) {
        self.inner.charge_at(now, cost)
    }
    fn peek_at(&self, now: Nanos, cost: u32) -> Decision {
        self.inner.peek_at(now, cost)
    }
    fn refund(&self, receipt: Receipt) -> bool {
        let gave = self.inner.refund(receipt);
        self.gave.store(gave, Ordering::Relaxed);
        gave
    }
}

/// GCRA limits (direct and keyed) may give back less than a charge when refunds race
/// (never more): under threads none may end more permissive than the units its
/// admissions still hold allow. Each limit's refunds race others on their own state:
/// the direct limit's (one ledger for every user) and the keyed one's (per key) give
/// back independently, so each limit is held to the admissions whose refund on *that*
/// limit gave nothing back (a refund that gave anything may have given its whole
/// charge).
#[test]
fn many_threads_on_gcra_limits_never_give_back_more_than_they_hold() {
    let clock = ManualClock::new();
    let gcra = RateLimiter::gcra_with_clock(Policy::per_hour(40).unwrap(), clock.clone());
    let users: KeyedLimiter<usize, Gcra, ManualClock> =
        keyed(Gcra::new(Policy::per_hour(12).unwrap()), &clock);
    let user_held: Vec<AtomicU64> = (0..USERS).map(|_| AtomicU64::new(0)).collect();
    let gcra_held = AtomicU64::new(0);
    hammer(&|user, cost, give_back| {
        let key = users.limit(&user);
        let (by_user, by_all) = (Tally::new(&key), Tally::new(&gcra));
        let limits = [&by_user as &dyn Limit, &by_all];
        let out = charge_and_maybe_refund(&limits, cost, give_back);
        if out.is_some() {
            if !by_user.gave() {
                user_held[user].fetch_add(u64::from(cost), Ordering::Relaxed);
            }
            if !by_all.gave() {
                gcra_held.fetch_add(u64::from(cost), Ordering::Relaxed);
            }
        }
        out
    });
    for (user, held) in user_held.iter().enumerate() {
        let held = held.load(Ordering::Relaxed);
        assert!(
            held > 0,
            "user {user} holds nothing: the bound proves nothing"
        );
        assert!(
            held <= 12,
            "user {user} holds {held} units under a burst of 12"
        );
        assert!(users.peek(&user, 0).remaining() <= 12 - held, "user {user}");
    }
    let gcra_held = gcra_held.load(Ordering::Relaxed);
    assert!(
        gcra_held <= 40,
        "the direct limit holds {gcra_held} units under 40"
    );
    assert!(gcra.peek(0).remaining() <= 40 - gcra_held);
}
