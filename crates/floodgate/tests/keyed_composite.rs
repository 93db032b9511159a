//! Composite limits (refunds, the most restrictive decision) and the brute-force
//! login pattern.
#![cfg(not(loom))]

use std::net::IpAddr;
use std::time::Duration;

use floodgate::keyed::composite::{check_all, check_all_indexed, Limit};
use floodgate::keyed::plans::{PlanId, PlanLimiter, Plans};
use floodgate::{
    FixedWindow, Gcra, KeyedBuilder, KeyedLimiter, ManualClock, Nanos, Policy, PolicyId,
    RateLimiter, Shaper, SlidingLog, SlidingWindow,
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

/// Every key on the classic "free" plan.
fn free_plan(clock: &ManualClock) -> PlanLimiter<String, impl Fn(&str) -> PlanId, ManualClock> {
    let plans = Plans::classic();
    let free = plans.id("free").unwrap();
    PlanLimiter::new(
        &plans,
        move |_: &str| free,
        KeyedBuilder::default().clock(clock.clone()),
    )
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
    let per_key = free_plan(&clock);
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

#[test]
fn a_denial_carries_the_denying_limits_id() {
    let clock = ManualClock::new();
    let per_second = |n| Policy::per_second(n).unwrap();
    let global = RateLimiter::gcra_with_clock(per_second(100), clock.clone());
    let user = keyed::<u64>(per_second(10).with_burst(3).unwrap(), &clock);
    let endpoint = keyed::<&str>(per_second(50).with_burst(5).unwrap(), &clock);
    let (g, u, e) = (PolicyId::new(10), PolicyId::new(20), PolicyId::new(30));
    let request = |who: u64, path: &'static str| {
        check_all_indexed(
            &[
                &(&global).with_policy_id(g),
                &user.limit(&who).with_policy_id(u),
                &endpoint.limit(&path).with_policy_id(e),
            ],
            1,
        )
    };
    // Admissions carry the tightest limit's id: user 1 has 2 of 3 left, /a 4 of 5.
    let (d, i) = request(1, "/a");
    assert!(d.is_allowed());
    assert_eq!((d.policy(), i, d.remaining()), (u, Some(1), 2));
    for _ in 0..2 {
        assert!(request(1, "/a").0.is_allowed());
    }
    // The per-user limit (second) denies.
    let (d, i) = request(1, "/a");
    assert!(!d.is_allowed());
    assert_eq!((d.policy(), i), (u, Some(1)));
    // Other users drain /a (5 in all); the endpoint limit (third) denies user 2.
    assert!(request(2, "/a").0.is_allowed());
    assert!(request(3, "/a").0.is_allowed());
    let (d, i) = request(4, "/a");
    assert!(!d.is_allowed());
    assert_eq!((d.policy(), i), (e, Some(2)));
    // The charges of the denied requests were refunded (5 of 100 taken).
    assert_eq!(global.peek(0).remaining(), 95);
    assert_eq!(user.peek(&4, 0).remaining(), 3);
    // The unlabelled limiters answer with no id.
    assert_eq!(global.peek(1).policy(), PolicyId::UNSET);
}

#[test]
fn a_later_limits_longer_wait_names_that_limit() {
    let clock = ManualClock::new();
    let slow = RateLimiter::gcra_with_clock(Policy::per_minute(1).unwrap(), clock.clone());
    let fast = RateLimiter::gcra_with_clock(Policy::per_second(1).unwrap(), clock.clone());
    let limits = [
        &(&fast).with_policy_id(PolicyId::new(1)) as &dyn Limit,
        &(&slow).with_policy_id(PolicyId::new(2)),
    ];
    assert!(check_all(&limits, 1).is_allowed());
    // fast is charged first and denies; slow, only peeked, would wait longer.
    let (d, i) = check_all_indexed(&limits, 1);
    assert_eq!(
        (d.is_allowed(), d.policy(), i),
        (false, PolicyId::new(2), Some(1))
    );
    assert_eq!(d.retry_after(), Some(Duration::from_secs(60)));
    // A cost beyond the first limit's capacity: "never" names it.
    let (d, i) = check_all_indexed(&limits, 2);
    assert_eq!(
        (d.retry_after(), d.policy(), i),
        (None, PolicyId::new(1), Some(0))
    );
    assert_eq!(check_all_indexed(&[], 1), (check_all(&[], 1), None));
}

#[test]
fn every_limit_kind_takes_an_id() {
    let clock = ManualClock::new();
    let policy = Policy::per_second(2).unwrap();
    let log = SlidingLog::with_clock(policy, clock.clone());
    let shaper = Shaper::with_clock(policy, clock.clone());
    let window = RateLimiter::with_clock(FixedWindow::new(policy).unwrap(), clock.clone());
    let per_plan = free_plan(&clock);
    let id = PolicyId::new(u32::MAX);
    let limits: [&dyn Limit; 4] = [
        &(&log).with_policy_id(id),
        &(&shaper).with_policy_id(id),
        &(&window).with_policy_id(id),
        &per_plan.limit("k").with_policy_id(id),
    ];
    for limit in limits {
        assert_eq!(limit.check().policy(), id);
        assert_eq!(limit.peek(1).policy(), id);
        let (d, receipt) = limit.charge(1);
        assert_eq!(d.policy(), id);
        assert!(limit.refund(receipt));
        if let Some((d, _, receipt)) = limit.book_at(limit.now(), 1) {
            assert_eq!(d.policy(), id);
            assert!(limit.refund(receipt));
        }
    }
    // The limiters themselves are unchanged.
    assert_eq!(shaper.peek(1).policy(), PolicyId::UNSET);
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
