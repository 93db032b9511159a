//! Session 44 review of the priority rule's peek (feature `queue`): a 429 from an
//! earlier rule peeks a later `PriorityRule` by running its arrival rule under the
//! queues' lock. Attacked differentially on Tokio's paused clock (which also drives
//! the limiters): over every small arrangement of waiters (tier bounds with and
//! without places, sheddable and unsheddable lower tiers, a holder asleep on its
//! slot, a head just woken by the holder's departure), the peek must
//!
//! * say what a real arrival in the same tier, polled in the same instant, meets:
//!   refused at once (the priority rule named in the 429's `RateLimit`, with the
//!   same `Retry-After` and the same `RateLimit` entry as the arrival's own 429) or
//!   not (queued, or admitted at once: the priority rule not shown);
//! * change nothing: every waiter's fate (status, and when it was answered), the
//!   arrival's, and the rule's counters are those of a twin run without the peek;
//! * tell a `Retry-After` that holds: the denied client, retrying after exactly
//!   that many seconds with nothing else arriving, is not refused by the priority
//!   rule.
#![cfg(feature = "queue")]

use std::future::{poll_fn, Future};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use floodgate::{KeyedLimiter, Policy, Shaper};
use floodgate_http::{from_fn, HeaderKey, PriorityRule, RateLimitLayer, RateLimitService, Rule};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tower::{Layer, Service};
#[path = "common/answer.rs"]
mod answer;
mod common;
use answer::Answer;
use common::{tier, tier_request, Hello, TestResult, TokioClock};

type PerUser = KeyedLimiter<String, floodgate::Gcra, TokioClock>;

/// One run's layer: a per-user rule of 1 per ms (a denial it gives alone is the
/// minimum `Retry-After: 1`), then "prio", 1 per 10 s with burst 1, `bounds` places
/// per tier.
struct Setup {
    start: Instant,
    per_user: Arc<PerUser>,
    layer: RateLimitLayer,
    svc: RateLimitService<Hello>,
}

fn setup(bounds: &[usize]) -> Result<Setup, Box<dyn std::error::Error>> {
    let start = Instant::now();
    let clock = TokioClock { start };
    let per_user: Arc<PerUser> = Arc::new(KeyedLimiter::gcra_with_clock(
        Policy::new(1, Duration::from_millis(1))?.with_burst(1)?,
        clock,
    ));
    let shaper = Shaper::with_clock(
        Policy::new(1, Duration::from_secs(10))?.with_burst(1)?,
        clock,
    );
    let layer = RateLimitLayer::builder()
        .rule(Rule::shared(
            "per-user",
            Arc::clone(&per_user),
            HeaderKey::new("x-user")?,
        )?)
        .priority(PriorityRule::new("prio", shaper, bounds, from_fn(tier))?)
        .build()?;
    let svc = layer.layer(Hello);
    Ok(Setup {
        start,
        per_user,
        layer,
        svc,
    })
}

/// How a request fared on its first poll, taken in the caller's instant (no other
/// task runs in between): answered at once, or still waiting.
enum First {
    Answered(Answer),
    Waiting(JoinHandle<Result<(u16, Duration), String>>),
}

/// Polls `who`'s request once, in the caller's instant; a request still waiting is
/// spawned to its end (its status and when it was answered).
async fn first_poll(s: &Setup, who: &str, tier: usize) -> Result<First, String> {
    let mut svc = s.svc.clone();
    let mut call = Box::pin(svc.call(tier_request(who, tier)));
    let polled = poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
    match polled {
        Poll::Ready(r) => {
            let response = r.map_err(|e| e.to_string())?;
            Ok(First::Answered(
                Answer::read(response).await.map_err(|e| e.to_string())?,
            ))
        }
        Poll::Pending => {
            let start = s.start;
            Ok(First::Waiting(tokio::spawn(async move {
                let response = call.await.map_err(|e| e.to_string())?;
                Ok((response.status().as_u16(), start.elapsed()))
            })))
        }
    }
}

/// The arrangement: waiters arrive one after another (user `u{i}`, tier `fills[i]`,
/// each let reach its queue), then the clock moves `advance` on (its own yield lets
/// the woken run once), and then the probes are taken in one instant.
#[derive(Clone, Debug)]
struct Case {
    bounds: &'static [usize],
    fills: Vec<usize>,
    advance: Duration,
    probe: usize,
}

/// What one run saw.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    /// The peek's 429: status, `Retry-After`, and the "prio" entry of `RateLimit`.
    peek: Option<(u16, Option<String>, Option<String>)>,
    /// The real arrival's first poll: answered at once (status, `Retry-After`,
    /// "prio" entry), or waiting.
    arrival: Option<(u16, Option<String>, Option<String>)>,
    /// Every request's end: fills in order, then the arrival: status and instant.
    ends: Vec<(u16, Duration)>,
    prio_stats: Option<floodgate_http::RuleStats>,
}

/// The `RateLimit` header's item for "prio", if shown.
fn prio_item(a: &Answer) -> Option<String> {
    let limits = a.header("ratelimit")?;
    limits
        .split(',')
        .map(str::trim)
        .find(|item| item.starts_with("\"prio\""))
        .map(str::to_owned)
}

fn summary(a: &Answer) -> (u16, Option<String>, Option<String>) {
    (
        a.status.as_u16(),
        a.header("retry-after").map(str::to_owned),
        prio_item(a),
    )
}

async fn let_run() {
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
}

/// `case`'s layer with its waiters arrived, the clock `advance`d.
async fn arrange(case: &Case) -> Result<(Setup, Vec<First>), Box<dyn std::error::Error>> {
    let s = setup(case.bounds)?;
    let mut fills = Vec::new();
    for (i, &t) in case.fills.iter().enumerate() {
        fills.push(first_poll(&s, &format!("u{i}"), t).await?);
        let_run().await;
    }
    tokio::time::advance(case.advance).await;
    Ok((s, fills))
}

/// One run of `case`: with the peek (`peek`) or without, then the real arrival.
async fn run(case: &Case, peek: bool) -> Result<Seen, Box<dyn std::error::Error>> {
    let (s, fills) = arrange(case).await?;
    // From here to the arrival's first poll no other task runs.
    let mut seen_peek = None;
    if peek {
        // "x" spent on the per-user rule (for a millisecond): denied there, so the
        // priority rule is only peeked.
        let _ = s.per_user.check(&"x".to_owned());
        match first_poll(&s, "x", case.probe).await? {
            First::Answered(a) => {
                assert_eq!(a.status, 429, "{case:?}: {}", a.body);
                seen_peek = Some(summary(&a));
            }
            First::Waiting(_) => return Err(format!("{case:?}: the denial waited").into()),
        }
    }
    let arrival = first_poll(&s, "y", case.probe).await?;
    let seen_arrival = match &arrival {
        First::Answered(a) => Some(summary(a)),
        First::Waiting(_) => None,
    };
    let mut ends = Vec::new();
    for f in fills.into_iter().chain(std::iter::once(arrival)) {
        ends.push(match f {
            First::Answered(a) => (a.status.as_u16(), Duration::ZERO),
            First::Waiting(task) => task.await??,
        });
    }
    Ok(Seen {
        peek: seen_peek,
        arrival: seen_arrival,
        ends,
        prio_stats: s.layer.rule_stats("prio"),
    })
}

/// The denied client waits exactly its `Retry-After` and comes back: the priority
/// rule does not refuse it at once (it may queue it).
async fn retry_after_holds(case: &Case) -> Result<(), Box<dyn std::error::Error>> {
    let (s, fills) = arrange(case).await?;
    let _ = s.per_user.check(&"x".to_owned());
    let First::Answered(denied) = first_poll(&s, "x", case.probe).await? else {
        return Err(format!("{case:?}: the denial waited").into());
    };
    let secs: u64 = denied.header("retry-after").unwrap_or("0").parse()?;
    if prio_item(&denied).is_some() {
        tokio::time::sleep(Duration::from_secs(secs)).await;
        match first_poll(&s, "x", case.probe).await? {
            First::Answered(a) => assert!(
                a.status == 200 || prio_item(&a).is_none(),
                "{case:?}: told Retry-After: {secs}, refused by the priority rule after it: {} {:?}",
                a.status,
                a.header("retry-after")
            ),
            First::Waiting(task) => assert_eq!(task.await??.0, 200, "{case:?}"),
        }
    }
    for f in fills {
        if let First::Waiting(task) = f {
            let _ = task.await??;
        }
    }
    Ok(())
}

/// Every sequence of tiers below `tiers` of length at most `len`.
fn sequences(tiers: usize, len: usize) -> Vec<Vec<usize>> {
    let mut all = vec![Vec::new()];
    let mut last = vec![Vec::new()];
    for _ in 0..len {
        let mut next = Vec::new();
        for s in &last {
            for t in 0..tiers {
                let mut s = s.clone();
                s.push(t);
                next.push(s);
            }
        }
        all.extend(next.iter().cloned());
        last = next;
    }
    all
}

const BOUNDS: &[&[usize]] = &[
    &[0, 1],
    &[1, 1],
    &[1, 2],
    &[2, 0, 1],
    &[0, 1, 1],
    &[1, 1, 0],
];

/// Instants: at once; exactly when the first holder's slot comes (it leaves, the
/// next head is woken); 5 s into the next slot.
const ADVANCES: &[Duration] = &[
    Duration::ZERO,
    Duration::from_secs(10),
    Duration::from_secs(15),
];

/// Every case: each bound set, each sequence of up to three waiters, each instant,
/// each tier.
fn grid() -> Vec<Case> {
    let mut cases = Vec::new();
    for &bounds in BOUNDS {
        for fills in sequences(bounds.len(), 3) {
            for &advance in ADVANCES {
                for probe in 0..bounds.len() {
                    cases.push(Case {
                        bounds,
                        fills: fills.clone(),
                        advance,
                        probe,
                    });
                }
            }
        }
    }
    cases
}

/// The peek is the real arrival's answer in the same instant, and a twin run
/// without it ends every request the same way at the same instant.
///
/// Mutations seen failing: the peek shedding the victim it finds (`Join { shed:
/// Some(t) }` popping tier `t`'s newest waiter, as an arrival does): a shed waiter
/// answered 429 in the peeked run only; the peek counting a would-be-queued request
/// as refused (`Arrival::Join { shed: Some(_) }` mapped to the rule's refusal): the
/// peek names "prio" where the arrival queues.
#[tokio::test(start_paused = true)]
async fn a_priority_peek_is_the_arrivals_answer_and_changes_nothing() -> TestResult {
    let cases = grid();
    let mut refused = 0;
    for case in &cases {
        let peeked = run(case, true).await?;
        let twin = run(case, false).await?;
        assert_eq!(peeked.ends, twin.ends, "{case:?}: the peek changed a fate");
        assert_eq!(peeked.arrival, twin.arrival, "{case:?}");
        assert_eq!(peeked.prio_stats, twin.prio_stats, "{case:?}: counted");
        let Some((_, peek_retry, peek_item)) = peeked.peek.clone() else {
            return Err("no peek".into());
        };
        match &peeked.arrival {
            // Refused at once by the priority rule: the peek said so, as the
            // arrival's own 429 does.
            Some((429, retry, item)) => {
                refused += 1;
                assert!(item.is_some(), "{case:?}");
                assert_eq!(&peek_item, item, "{case:?}");
                assert_eq!(&peek_retry, retry, "{case:?}: Retry-After");
            }
            // Admitted at once or queued: the peek does not show it.
            _ => assert_eq!(peek_item, None, "{case:?}: {peeked:?}"),
        }
    }
    // The grid reaches both answers.
    assert!(
        refused > 0 && refused < cases.len(),
        "{refused} of {}",
        cases.len()
    );
    Ok(())
}

/// The `Retry-After` of a 429 naming the priority rule holds: after it, the same
/// request is not refused by the priority rule (nothing else arriving).
///
/// Mutation seen failing: the refusal counting one waiter fewer ahead
/// (`refusal(ahead.saturating_sub(1), ..)` in the arrival rule): the retry comes a
/// slot early and the full tier refuses it again.
#[tokio::test(start_paused = true)]
async fn a_priority_retry_after_holds() -> TestResult {
    for case in &grid() {
        retry_after_holds(case).await?;
    }
    Ok(())
}
