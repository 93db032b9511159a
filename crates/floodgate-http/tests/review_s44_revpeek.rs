//! Session 44 review of the queue peeks (feature `queue`): a 429 from an earlier
//! rule peeks a later `PriorityRule` (its arrival rule run under the queues' lock)
//! or `QueueRule` / `KeyedQueueRule` (the core's reservation peek). Attacked
//! differentially on Tokio's paused clock (which also drives the limiters): over
//! every small arrangement of waiters (tier bounds with and without places,
//! sheddable and unsheddable lower tiers, a holder asleep on its slot, the clock
//! at exactly the holder's slot; queues of 0 to 4 with bounds below, at and
//! beyond their slots; costs of 1 and 2, bursts of 1 to 3), the peek must
//!
//! * say what a real arrival in the same tier, polled in the same instant, meets:
//!   refused at once (the later rule shown in the 429's `RateLimit`, with the same
//!   `Retry-After` and the same `RateLimit` entry as the arrival's own 429) or not
//!   (queued, or admitted at once: the later rule not shown);
//! * change nothing: every waiter's fate (status, and when it was answered), the
//!   arrival's, and the rule's counters are those of a twin run without the peek;
//! * tell a `Retry-After` that holds: the denied client, retrying after exactly
//!   that many seconds with nothing else arriving, is admitted (at once by a
//!   priority rule, within `max_delay` by a queue).
#![cfg(feature = "queue")]

use std::future::{poll_fn, Future};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use floodgate::{KeyedLimiter, Policy, Shaper};
use floodgate_http::{
    from_fn, HeaderKey, KeyedQueueRule, PriorityRule, QueueRule, RateLimitLayer, RateLimitService,
    Rule,
};
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
/// minimum `Retry-After: 1`), then "later" ([`Later`]).
struct Setup {
    start: Instant,
    per_user: Arc<PerUser>,
    layer: RateLimitLayer,
    svc: RateLimitService<Hello>,
}

fn setup(case: &Case) -> Result<Setup, Box<dyn std::error::Error>> {
    let (burst, cost) = case.shape;
    let start = Instant::now();
    let clock = TokioClock { start };
    let per_user: Arc<PerUser> = Arc::new(KeyedLimiter::gcra_with_clock(
        Policy::new(1, Duration::from_millis(1))?.with_burst(1)?,
        clock,
    ));
    let policy = Policy::new(1, Duration::from_secs(10))?.with_burst(burst)?;
    let builder = RateLimitLayer::builder().rule(Rule::shared(
        "per-user",
        Arc::clone(&per_user),
        HeaderKey::new("x-user")?,
    )?);
    let builder = match case.later {
        Later::Priority => builder.priority(
            PriorityRule::new(
                "later",
                Shaper::with_clock(policy, clock),
                case.bounds,
                from_fn(tier),
            )?
            .cost(cost),
        ),
        Later::Queue(max_delay) => builder.queue(
            QueueRule::new("later", Shaper::with_clock(policy, clock), max_delay)?.cost(cost),
        ),
        Later::KeyedQueue(max_delay) => {
            let keyed: KeyedLimiter<String, floodgate::Gcra, TokioClock> =
                KeyedLimiter::gcra_with_clock(policy, clock);
            builder.queue_per_key(
                KeyedQueueRule::new("later", HeaderKey::new("x-tier")?, keyed, max_delay)?
                    .cost(cost),
            )
        }
    };
    let layer = builder.build()?;
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
    /// The later rule.
    later: Later,
    /// The later rule's burst and cost.
    shape: (u64, u32),
    bounds: &'static [usize],
    fills: Vec<usize>,
    advance: Duration,
    probe: usize,
}

/// The rule after the per-user one, "later", on a GCRA of 1 per 10 s.
#[derive(Clone, Copy, Debug)]
enum Later {
    /// A `PriorityRule` with the case's bounds.
    Priority,
    /// A `QueueRule` with this `max_delay` (one tier).
    Queue(Duration),
    /// A `KeyedQueueRule` on `x-tier` with this `max_delay` (one tier, one key).
    KeyedQueue(Duration),
}

/// What one run saw.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    /// The peek's 429: status, `Retry-After`, and the "later" entry of `RateLimit`.
    peek: Option<(u16, Option<String>, Option<String>)>,
    /// The real arrival's first poll: answered at once (status, `Retry-After`,
    /// "later" entry), or waiting.
    arrival: Option<(u16, Option<String>, Option<String>)>,
    /// Every request's end: fills in order, then the arrival: status and instant.
    ends: Vec<(u16, Duration)>,
    later_stats: Option<floodgate_http::RuleStats>,
}

/// The `RateLimit` header's item for "later", if shown.
fn later_item(a: &Answer) -> Option<String> {
    let limits = a.header("ratelimit")?;
    limits
        .split(',')
        .map(str::trim)
        .find(|item| item.starts_with("\"later\""))
        .map(str::to_owned)
}

fn summary(a: &Answer) -> (u16, Option<String>, Option<String>) {
    (
        a.status.as_u16(),
        a.header("retry-after").map(str::to_owned),
        later_item(a),
    )
}

async fn let_run() {
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
}

/// `case`'s layer with its waiters arrived, the clock `advance`d.
async fn arrange(case: &Case) -> Result<(Setup, Vec<First>), Box<dyn std::error::Error>> {
    let s = setup(case)?;
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
        // later rule is only peeked.
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
        later_stats: s.layer.rule_stats("later"),
    })
}

/// The denied client waits exactly its `Retry-After` and comes back: admitted (at
/// once for a priority rule) when the 429 showed the later rule.
async fn retry_after_holds(case: &Case) -> Result<bool, Box<dyn std::error::Error>> {
    let (s, fills) = arrange(case).await?;
    let _ = s.per_user.check(&"x".to_owned());
    let First::Answered(denied) = first_poll(&s, "x", case.probe).await? else {
        return Err(format!("{case:?}: the denial waited").into());
    };
    let secs: u64 = denied.header("retry-after").unwrap_or("0").parse()?;
    if later_item(&denied).is_some() {
        tokio::time::sleep(Duration::from_secs(secs)).await;
        // The waiters due at this instant go first.
        let_run().await;
        match first_poll(&s, "x", case.probe).await? {
            First::Answered(a) => assert_eq!(
                a.status,
                200,
                "{case:?}: told Retry-After: {secs}, then {:?} {:?}",
                a.header("retry-after"),
                a.body
            ),
            // A queue's slot may still be up to `max_delay` away; a priority
            // rule's waiters ahead have all gone.
            First::Waiting(task) => {
                if matches!(case.later, Later::Priority) {
                    return Err(format!("{case:?}: told Retry-After: {secs}, then queued").into());
                }
                assert_eq!(task.await??.0, 200, "{case:?}: told Retry-After: {secs}");
            }
        }
    }
    for f in fills {
        if let First::Waiting(task) = f {
            let _ = task.await??;
        }
    }
    Ok(later_item(&denied).is_some())
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

/// The later rule's burst and cost: one unit a slot; a burst of 2 (two go at
/// once); 2 units a request in a burst of 3.
const SHAPES: [(u64, u32); 3] = [(1, 1), (2, 1), (3, 2)];

/// The queues' `max_delay`s: none (go at once or be refused), within one slot, a
/// slot and a half, beyond two slots.
const QUEUE_BOUNDS: [Duration; 4] = [
    Duration::ZERO,
    Duration::from_secs(5),
    Duration::from_secs(15),
    Duration::from_secs(25),
];

/// The priority rule's places per tier.
const BOUNDS: &[&[usize]] = &[
    &[0, 1],
    &[1, 1],
    &[1, 2],
    &[2, 0, 1],
    &[0, 1, 1],
    &[1, 1, 0],
];

/// Instants: at once; exactly when the first holder's slot comes (with a burst of
/// 1: it leaves, the next head is woken); 5 s into the next slot.
const ADVANCES: &[Duration] = &[
    Duration::ZERO,
    Duration::from_secs(10),
    Duration::from_secs(15),
];

/// Every case: each bound set, each sequence of up to three waiters, each instant,
/// each tier.
fn grid() -> Vec<Case> {
    let mut cases = Vec::new();
    let mut push = |later, shape, bounds: &'static [usize], len| {
        for fills in sequences(bounds.len(), len) {
            for &advance in ADVANCES {
                for probe in 0..bounds.len() {
                    cases.push(Case {
                        later,
                        shape,
                        bounds,
                        fills: fills.clone(),
                        advance,
                        probe,
                    });
                }
            }
        }
    };
    for shape in SHAPES {
        for &bounds in BOUNDS {
            // Beyond one unit a slot, the two-tier bounds only.
            if shape == (1, 1) || bounds.len() == 2 {
                push(Later::Priority, shape, bounds, 3);
            }
        }
        for max_delay in QUEUE_BOUNDS {
            push(Later::Queue(max_delay), shape, &[1], 4);
            push(Later::KeyedQueue(max_delay), shape, &[1], 4);
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
/// peek shows "later" where the arrival queues; the per-key queue peeking without
/// its bound (`peek_reserve_at(key, now, cost, Duration::ZERO)` in
/// `KeyedQueueRule::peek`): `Retry-After` differs from the arrival's 429.
#[tokio::test(start_paused = true)]
async fn a_later_queues_peek_is_the_arrivals_answer_and_changes_nothing() -> TestResult {
    let cases = grid();
    let mut refused = 0;
    for case in &cases {
        let peeked = run(case, true).await?;
        let twin = run(case, false).await?;
        assert_eq!(peeked.ends, twin.ends, "{case:?}: the peek changed a fate");
        assert_eq!(peeked.arrival, twin.arrival, "{case:?}");
        assert_eq!(peeked.later_stats, twin.later_stats, "{case:?}: counted");
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

/// The `Retry-After` of a 429 showing the later rule holds: after it, with nothing
/// else arriving, the same request is not refused (`priority.rs`: the waiters ahead
/// have taken their slots and it is admitted at once; `queue.rs`: its slot is at
/// most `max_delay` away, so it is queued at most that long).
///
/// Mutation seen failing: the refusal counting one waiter fewer ahead
/// (`refusal(ahead.saturating_sub(1), ..)` in the arrival rule): the retry comes a
/// slot early and the full tier refuses it again.
#[tokio::test(start_paused = true)]
async fn a_later_queues_retry_after_holds() -> TestResult {
    let mut told = 0;
    for case in &grid() {
        told += usize::from(retry_after_holds(case).await?);
    }
    assert!(told > 0);
    Ok(())
}
