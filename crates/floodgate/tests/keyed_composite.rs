//! Composite limits (refunds, the most restrictive decision) and the brute-force
//! login pattern.
#![cfg(not(loom))]

use std::net::IpAddr;
use std::time::Duration;

use floodgate::keyed::composite::{check_all, Limit};
use floodgate::keyed::plans::{PlanLimiter, Plans};
use floodgate::{
    FixedWindow, Gcra, KeyedBuilder, KeyedLimiter, ManualClock, Nanos, Policy, RateLimiter,
    SlidingWindow,
};

fn keyed<K: std::hash::Hash + Eq + Send + Sync + 'static>(
    policy: Policy,
    clock: &ManualClock,
) -> KeyedLimiter<K, Gcra, ManualClock> {
    KeyedBuilder::new(Gcra::new(policy))
        .capacity(1_000)
        .clock(clock.clone())
        .build()
        .unwrap()
}

#[test]
fn a_denial_charges_nothing_anywhere() {
    let clock = ManualClock::new();
    let global = RateLimiter::gcra_with_clock(Policy::per_second(100).unwrap(), clock.clone());
    let user = keyed::<u64>(
        Policy::per_second(10).unwrap().with_burst(3).unwrap(),
        &clock,
    );
    let endpoint = keyed::<&str>(Policy::per_second(50).unwrap(), &clock);
    let mut admitted = 0;
    for _ in 0..10 {
        if check_all(&[&global, &user.limit(&1), &endpoint.limit(&"/a")], 1).is_allowed() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 3);
    // Only the 3 admitted requests were charged.
    assert_eq!(global.peek(0).remaining(), 97);
    assert_eq!(endpoint.peek(&"/a", 0).remaining(), 47);
    // Refunds are exact: the state equals that of a limiter charged 3 times.
    let twin = RateLimiter::gcra_with_clock(Policy::per_second(100).unwrap(), clock.clone());
    for _ in 0..3 {
        let _ = twin.check();
    }
    assert_eq!(global.state(), twin.state());
}

#[test]
fn window_limits_denied_elsewhere_keep_their_counts() {
    // 1:15 into the clock: window 1 of the per-minute windows.
    let clock = ManualClock::starting_at(Nanos::from_secs(75));
    let per_minute = |l| Policy::per_minute(l).unwrap();
    let window = RateLimiter::with_clock(FixedWindow::new(per_minute(5)).unwrap(), clock.clone());
    let sliding =
        RateLimiter::with_clock(SlidingWindow::new(per_minute(5)).unwrap(), clock.clone());
    let per_user: KeyedLimiter<u64, FixedWindow, ManualClock> =
        KeyedBuilder::new(FixedWindow::new(per_minute(10)).unwrap())
            .capacity(1_000)
            .clock(clock.clone())
            .build()
            .unwrap();
    // Two units per minute, charged last: it denies the third request.
    let strict = RateLimiter::gcra_with_clock(per_minute(2), clock.clone());
    let limits: [&dyn Limit; 4] = [&window, &sliding, &per_user.limit(&7), &strict];
    assert!(check_all(&limits, 1).is_allowed());
    clock.advance(Duration::from_secs(1));
    assert!(check_all(&limits, 1).is_allowed());
    for _ in 0..3 {
        clock.advance(Duration::from_secs(1));
        let denied = check_all(&limits, 1);
        assert!(!denied.is_allowed());
    }
    // The windows were charged and refunded three times: their counts are unchanged.
    let fw = window.algorithm();
    assert_eq!(
        (fw.window_of(window.state()), fw.count_of(window.state())),
        (1, 2)
    );
    assert_eq!(window.peek(0).remaining(), 3);
    assert_eq!(sliding.algorithm().fields(sliding.state()), (1, 0, 2));
    assert_eq!(sliding.peek(0).remaining(), 3);
    assert_eq!(per_user.peek(&7, 0).remaining(), 8);
    // A larger cost is refunded whole too.
    let denied = check_all(&limits, 3);
    assert!(!denied.is_allowed());
    assert_eq!(fw.count_of(window.state()), 2);
    assert_eq!(sliding.algorithm().fields(sliding.state()), (1, 0, 2));
    assert_eq!(per_user.peek(&7, 0).remaining(), 8);
}

#[test]
fn the_most_restrictive_decision_wins() {
    let clock = ManualClock::new();
    let slow = RateLimiter::gcra_with_clock(Policy::per_minute(1).unwrap(), clock.clone());
    let fast = RateLimiter::gcra_with_clock(Policy::per_second(1).unwrap(), clock.clone());
    let roomy = RateLimiter::gcra_with_clock(Policy::per_second(10).unwrap(), clock.clone());
    // All admit: the least remaining (0, from slow and fast; slow resets later).
    let d = check_all(&[&roomy, &fast, &slow], 1);
    assert!(d.is_allowed());
    assert_eq!(
        (d.remaining(), d.reset_after()),
        (0, Duration::from_secs(60))
    );
    // fast denies first; slow, only peeked, denies with the longer wait: its decision wins.
    let d = check_all(&[&roomy, &fast, &slow], 1);
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after(), Some(Duration::from_secs(60)));
    assert_eq!(roomy.peek(0).remaining(), 9); // refunded
                                              // A cost beyond one limit's capacity: "never" is the most restrictive.
    let d = check_all(&[&slow, &roomy], 5);
    assert_eq!(d.retry_after(), None);
    // An empty composite admits.
    assert!(check_all(&[], 1).is_allowed());
}

#[test]
fn plan_limits_compose_too() {
    let clock = ManualClock::new();
    let plans = Plans::classic();
    let free = plans.id("free").unwrap();
    let per_key = PlanLimiter::new(
        &plans,
        move |_: &String| free,
        KeyedBuilder::default().clock(clock.clone()),
    )
    .unwrap();
    let global = RateLimiter::gcra_with_clock(Policy::per_second(5).unwrap(), clock.clone());
    let key = "k".to_owned();
    for _ in 0..5 {
        assert!(check_all(&[&per_key.limit(&key), &global], 1).is_allowed());
    }
    // The global limit denies: the plan limit gets its unit back.
    assert!(!check_all(&[&per_key.limit(&key), &global], 1).is_allowed());
    assert_eq!(per_key.peek(&key, 0).remaining(), 5);
    let limit = per_key.limit(&key);
    assert_eq!(limit.peek_at(limit.now(), 0).remaining(), 5);
}

/// The login pattern: peek(1) before the password check, check(1) on failure only.
struct Login {
    failures: KeyedLimiter<(IpAddr, String), Gcra, ManualClock>,
}

#[derive(Debug, PartialEq)]
enum Outcome {
    Welcome,
    WrongPassword,
    LockedOut(Duration),
}

impl Login {
    fn attempt(&self, ip: IpAddr, user: &str, password_ok: bool) -> Outcome {
        let key = (ip, user.to_owned());
        let gate = self.failures.peek(&key, 1);
        if !gate.is_allowed() {
            return Outcome::LockedOut(gate.retry_after().unwrap_or(Duration::MAX));
        }
        if password_ok {
            return Outcome::Welcome;
        }
        let _ = self.failures.check(&key);
        Outcome::WrongPassword
    }
}

#[test]
fn five_failures_per_five_minutes_per_ip_and_user() {
    let clock = ManualClock::new();
    let login = Login {
        failures: keyed(Policy::new(5, Duration::from_secs(300)).unwrap(), &clock),
    };
    let ip: IpAddr = "198.51.100.4".parse().unwrap();
    let other_ip: IpAddr = "198.51.100.5".parse().unwrap();

    // Successful logins and peeks insert nothing.
    for _ in 0..100 {
        assert_eq!(login.attempt(ip, "alice", true), Outcome::Welcome);
    }
    assert_eq!(login.failures.metrics().live_keys, 0);

    for _ in 0..5 {
        assert_eq!(login.attempt(ip, "alice", false), Outcome::WrongPassword);
    }
    // Locked out — even with the right password, which is not even checked.
    assert_eq!(
        login.attempt(ip, "alice", true),
        Outcome::LockedOut(Duration::from_secs(60))
    );
    assert_eq!(
        login.attempt(ip, "alice", false),
        Outcome::LockedOut(Duration::from_secs(60))
    );
    // Lockouts charge nothing: the wait does not grow.
    clock.advance(Duration::from_secs(30));
    assert_eq!(
        login.attempt(ip, "alice", true),
        Outcome::LockedOut(Duration::from_secs(30))
    );
    // Other (ip, user) pairs are unaffected.
    assert_eq!(login.attempt(other_ip, "alice", true), Outcome::Welcome);
    assert_eq!(login.attempt(ip, "bob", true), Outcome::Welcome);
    // One failure's worth of time later, one more attempt is allowed.
    clock.advance(Duration::from_secs(30));
    assert_eq!(login.attempt(ip, "alice", false), Outcome::WrongPassword);
    assert!(matches!(
        login.attempt(ip, "alice", true),
        Outcome::LockedOut(_)
    ));
    // After five quiet minutes the key is idle again and gets reclaimed by itself.
    clock.advance(Duration::from_secs(300));
    assert_eq!(login.attempt(ip, "alice", true), Outcome::Welcome);
    assert_eq!(login.failures.reclaim_idle(), 1);
    let m = login.failures.metrics();
    assert_eq!((m.allowed, m.denied, m.live_keys), (6, 0, 0));
}
