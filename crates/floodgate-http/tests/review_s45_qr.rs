//! Session 45 adversarial review of one reservation per queued request (qreceipt):
//! `QueueRule::start` and `PriorityRule`'s immediate path now make one reservation
//! and convert it (`Reservation::into_receipt`) where they took a free slot with a
//! plain charge. Over seeded sequences on a `ManualClock` (waits slept on Tokio's
//! paused clock), each rule is checked against the pre-merge algorithm run on a
//! twin shaper — a charge first, a reservation only when it is refused — for the
//! status, the queue's schedule after every request (refunds when a later rule
//! denies, cancellations when a waiting request is dropped) and, for a request that
//! went at once, the figures the queue reports. Each test prints its transcript
//! (status and rate-limit headers per request, `--nocapture`), which was diffed
//! against the same test run on the pre-merge source (VERIFICATION.md, revqr).
#![cfg(feature = "queue")]

use std::future::{poll_fn, Future};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use floodgate::{Clock, Decision, Gcra, KeyedLimiter, ManualClock, Nanos, Policy, Receipt, Shaper};
use floodgate_http::{
    from_fn, HeaderKey, PriorityRule, QueueRule, RateLimitLayer, RateLimitService, Rule,
};
use http::{HeaderMap, Request, StatusCode};
use tower::{Layer, Service};

mod common;
use common::{Hello, Rng, TestResult};

type Gate = KeyedLimiter<String, Gcra, ManualClock>;

/// The "gate" after the queueing rule: one unit an hour per `x-user`, with user
/// "blocked" spent up front, so it denies exactly the requests of "blocked" (a
/// fresh user each other request).
fn gate(clock: &ManualClock) -> Result<Arc<Gate>, Box<dyn std::error::Error>> {
    let gate: Arc<Gate> = Arc::new(KeyedLimiter::gcra_with_clock(
        Policy::new(1, Duration::from_secs(3600))?.with_burst(1)?,
        clock.clone(),
    ));
    assert!(gate.charge("blocked", 1).0.is_allowed());
    Ok(gate)
}

fn request(user: &str, tier: usize) -> Request<()> {
    Request::get("/")
        .header("x-user", user)
        .header("x-tier", tier.to_string())
        .body(())
        .unwrap_or_default()
}

/// A response's status and rate-limit headers, one transcript line.
fn line(step: usize, status: StatusCode, headers: &HeaderMap) -> String {
    let mut shown: Vec<String> = headers
        .iter()
        .filter(|(name, _)| {
            let name = name.as_str();
            name.contains("ratelimit") || name == "retry-after"
        })
        .map(|(name, value)| format!("{name}={}", value.to_str().unwrap_or("?")))
        .collect();
    shown.sort();
    format!("transcript {step} {} {}", status.as_u16(), shown.join(" "))
}

/// Sends `req` and answers its status and headers; `drop_waiting`: poll it once and
/// drop it if it is still pending (a client gone while it waits).
async fn send(
    svc: &RateLimitService<Hello>,
    req: Request<()>,
    drop_waiting: bool,
) -> Result<Option<(StatusCode, HeaderMap)>, Box<dyn std::error::Error>> {
    let mut svc = svc.clone();
    let mut call = Box::pin(svc.call(req));
    if drop_waiting {
        let answer = poll_fn(|cx| {
            Poll::Ready(match call.as_mut().poll(cx) {
                Poll::Ready(answer) => Some(answer),
                Poll::Pending => None,
            })
        })
        .await;
        return match answer {
            Some(answer) => {
                let response = answer?;
                Ok(Some((response.status(), response.headers().clone())))
            }
            None => Ok(None),
        };
    }
    let response = call.await?;
    Ok(Some((response.status(), response.headers().clone())))
}

/// The pre-merge queue rule on `twin`: a free slot taken with `charge_at` (its
/// figures the schedule peeked right after), else a reservation within
/// `max_delay`. Answers whether it admits, the receipt of a slot taken at once,
/// whether it waits, and the figures of a slot taken at once.
fn queue_before(
    twin: &Shaper<ManualClock>,
    cost: u32,
    max_delay: Duration,
) -> (
    bool,
    Option<Receipt>,
    Option<floodgate::Reservation>,
    Option<Decision>,
) {
    let now = twin.clock().now();
    let (admitted, receipt) = twin.charge_at(now, cost);
    if admitted.is_allowed() {
        let figures = twin.peek_reserve_at(now, 0, max_delay).decision();
        return (true, Some(receipt), None, Some(figures));
    }
    match twin.reserve_at(now, cost, max_delay) {
        Ok(r) if r.delay().is_zero() => (true, None, None, Some(r.decision())),
        Ok(r) => (true, None, Some(r), None),
        Err(_) => (false, None, None, None),
    }
}

/// The `r` (remaining) of rule `name`'s member of the `RateLimit` header, when shown.
fn remaining(headers: &HeaderMap, name: &str) -> Option<u64> {
    let member = format!("\"{name}\";");
    headers
        .get("ratelimit")
        .and_then(|v| v.to_str().ok())?
        .split(", ")
        .find_map(|m| m.strip_prefix(member.as_str()))?
        .split(';')
        .find_map(|p| p.strip_prefix("r="))
        .and_then(|r| r.parse().ok())
}

/// One step's arrival: the clock moved up to 250 ms (a third of the steps), and
/// whether the request is "blocked"'s (a quarter of them: the gate denies it), with
/// its user (a fresh one otherwise).
fn arrival(rng: &mut Rng, clock: &ManualClock, seed: u64, step: usize) -> (bool, String) {
    if rng.below(3) == 0 {
        clock.advance(Duration::from_nanos(rng.below(250_000_000)));
    }
    let blocked = rng.below(4) == 0;
    let user = if blocked {
        "blocked".to_owned()
    } else {
        format!("u{seed}-{step}")
    };
    (blocked, user)
}

/// Prints the answer's transcript line and checks its status: 200 when the
/// queueing rule admits and the gate does, a 429 otherwise; for a request the gate
/// let through whose slot was taken at once (`immediate`: the rule and the
/// pre-merge figures), the rule's `r` is the figures' remaining.
fn check_answer(
    step: usize,
    (status, headers): &(StatusCode, HeaderMap),
    (admitted, blocked): (bool, bool),
    immediate: Option<(&str, Decision)>,
    ctx: &str,
) {
    println!("{}", line(step, *status, headers));
    let want = if admitted && !blocked {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    assert_eq!(*status, want, "{ctx}: {headers:?}");
    if let (Some((rule, figures)), false) = (immediate, blocked) {
        let shown = remaining(headers, rule);
        assert_eq!(shown, Some(figures.remaining()), "{ctx}: {headers:?}");
    }
}

/// A global queue then the gate, over seeded sequences: the layer's status and
/// its queue's schedule after each request are the pre-merge algorithm's on a twin
/// (with the twin's receipt refunded when the gate denies and its reservation
/// cancelled when a waiting request is dropped); a request that went at once shows
/// the remaining units the pre-merge figures counted.
#[tokio::test(start_paused = true)]
async fn a_queue_answers_as_before_over_seeded_sequences() -> TestResult {
    for seed in 1..=40u64 {
        let mut rng = Rng(seed);
        let burst = 1 + rng.below(3);
        let cost = rng.below(burst + 1) as u32; // 0 (takes nothing) up to the burst
        let max_delay = [
            Duration::ZERO,
            Duration::from_millis(150),
            Duration::from_secs(1),
        ][rng.below(3) as usize];
        let policy = Policy::per_second(10)?.with_burst(burst)?;
        let clock = ManualClock::starting_at(Nanos::from_secs(100));
        let queue = Arc::new(Shaper::with_clock(policy, clock.clone()));
        let twin = Shaper::with_clock(policy, clock.clone());
        let layer = RateLimitLayer::builder()
            .queue(QueueRule::shared("queue", Arc::clone(&queue), max_delay)?.cost(cost))
            .rule(Rule::shared(
                "gate",
                gate(&clock)?,
                HeaderKey::new("x-user")?,
            )?)
            .build()?;
        let svc = layer.layer(Hello);
        println!("transcript seed {seed} burst {burst} cost {cost} max_delay {max_delay:?}");
        for step in 0..60 {
            let (blocked, user) = arrival(&mut rng, &clock, seed, step);
            let drop_waiting = rng.below(3) == 0;
            let ctx = format!("seed {seed} step {step}");
            let (admitted, receipt, waiting, figures) = queue_before(&twin, cost, max_delay);
            let answer = send(&svc, request(&user, 0), drop_waiting).await?;
            match (answer, waiting) {
                (None, Some(reservation)) => {
                    // Dropped while it waited: the layer cancelled, so does the twin.
                    let _ = twin.cancel(reservation);
                    println!("transcript {step} dropped");
                }
                (None, None) => panic!("{ctx}: pending, but the twin's slot was free"),
                (Some(answer), waiting) => {
                    let immediate = figures.filter(|_| waiting.is_none());
                    let immediate = immediate.map(|f| ("queue", f));
                    check_answer(step, &answer, (admitted, blocked), immediate, &ctx);
                    if let (true, Some(receipt)) = (blocked, receipt) {
                        let _ = twin.refund(receipt);
                    }
                    // A slot waited for stays taken: the twin drops (keeps) its
                    // reservation at the end of this arm.
                }
            }
            assert_eq!(queue.state(), twin.state(), "{ctx}: the queue's schedule");
        }
    }
    Ok(())
}

/// A priority rule then the gate, requests sent one at a time (so nobody waits
/// when one arrives), over seeded sequences: the immediate path reserves within no
/// delay and converts; the pre-merge rule charged. The status and the shaper's
/// schedule after each request are the pre-merge algorithm's on a twin (a free slot
/// charged, and refunded when the gate denies; any other slot waited for in the
/// tier and kept), and a request that went at once shows the charge's remaining.
#[tokio::test(start_paused = true)]
async fn a_priority_rules_immediate_path_answers_as_before() -> TestResult {
    for seed in 1..=40u64 {
        let mut rng = Rng(seed << 32);
        let burst = 1 + rng.below(3);
        let cost = rng.below(burst + 1) as u32; // 0 (takes nothing) up to the burst
        let bounds: &[usize] = [&[0usize][..], &[1, 1], &[0, 2]][rng.below(3) as usize];
        let policy = Policy::per_second(10)?.with_burst(burst)?;
        let clock = ManualClock::starting_at(Nanos::from_secs(100));
        let shaper = Arc::new(Shaper::with_clock(policy, clock.clone()));
        let twin = Shaper::with_clock(policy, clock.clone());
        let layer = RateLimitLayer::builder()
            .priority(
                PriorityRule::shared(
                    "priority",
                    Arc::clone(&shaper),
                    bounds,
                    from_fn(common::tier),
                )?
                .cost(cost),
            )
            .rule(Rule::shared(
                "gate",
                gate(&clock)?,
                HeaderKey::new("x-user")?,
            )?)
            .build()?;
        let svc = layer.layer(Hello);
        println!("transcript seed {seed} burst {burst} cost {cost} bounds {bounds:?}");
        for step in 0..60 {
            let (blocked, user) = arrival(&mut rng, &clock, seed, step);
            let tier = rng.below(bounds.len() as u64) as usize;
            let ctx = format!("seed {seed} step {step} tier {tier}");
            let now = twin.clock().now();
            let (charged, receipt) = twin.charge_at(now, cost);
            // Not free: it joins its tier when there is a place and waits its slot.
            let admitted = charged.is_allowed() || bounds[tier] > 0;
            if !charged.is_allowed() && bounds[tier] > 0 {
                let _kept = twin.reserve_at(now, cost, Duration::MAX).expect("fits");
            }
            let answer = send(&svc, request(&user, tier), false)
                .await?
                .expect("not dropped");
            let immediate = charged.is_allowed().then_some(("priority", charged));
            check_answer(step, &answer, (admitted, blocked), immediate, &ctx);
            if blocked {
                let _ = twin.refund(receipt);
            }
            assert_eq!(shaper.state(), twin.state(), "{ctx}: the shaper's schedule");
        }
    }
    Ok(())
}

/// The documented immediate path, by numbers (10 a second, burst 1, tiers of 0 and
/// 1 places): a free slot goes at once; a later rule's denial gives it back (the
/// next request goes at once too); with the slot taken, a tier-0 request has no
/// place and is refused with the wait until a plain check after the booked
/// schedule would pass (100 ms: `Retry-After: 1`); a tier-1 request waits its
/// slot; a cost above the burst is refused when the layer is built.
#[tokio::test(start_paused = true)]
async fn a_priority_rules_immediate_path_refuses_and_gives_back_as_documented() -> TestResult {
    let clock = ManualClock::starting_at(Nanos::from_secs(100));
    let shaper = Arc::new(Shaper::with_clock(
        Policy::per_second(10)?.with_burst(1)?,
        clock.clone(),
    ));
    let layer = RateLimitLayer::builder()
        .priority(PriorityRule::shared(
            "priority",
            Arc::clone(&shaper),
            &[0, 1],
            from_fn(common::tier),
        )?)
        .rule(Rule::shared(
            "gate",
            gate(&clock)?,
            HeaderKey::new("x-user")?,
        )?)
        .build()?;
    let svc = layer.layer(Hello);
    let idle = clock.now();
    let ask = |user: &str, tier| send(&svc, request(user, tier), false);
    // Taken at once, then given back when the gate denies.
    let (status, _) = ask("blocked", 0).await?.expect("answered");
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        shaper.state().tat().max(idle),
        idle,
        "the gate's denial gave the slot back"
    );
    let (status, _) = ask("a", 0).await?.expect("answered");
    assert_eq!(status, StatusCode::OK);
    let booked = shaper.state();
    assert_eq!(booked.tat(), Nanos::new(100_100_000_000));
    // The slot is taken: tier 0 has no place.
    let (status, headers) = ask("b", 0).await?.expect("answered");
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        headers.get("retry-after").and_then(|v| v.to_str().ok()),
        Some("1")
    );
    assert_eq!(shaper.state(), booked, "a refusal reserves nothing");
    // Tier 1 waits for the 100 ms slot and keeps it.
    let (status, _) = ask("c", 1).await?.expect("answered");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(shaper.state().tat(), Nanos::new(100_200_000_000));
    // A cost above the burst: refused when the layer is built.
    let built = RateLimitLayer::builder()
        .priority(
            PriorityRule::shared("priority", Arc::clone(&shaper), &[1], from_fn(common::tier))?
                .cost(2),
        )
        .build();
    assert!(built.is_err());
    Ok(())
}
