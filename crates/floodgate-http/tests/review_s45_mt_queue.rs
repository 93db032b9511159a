//! Session 45 (httpmt): the queueing rules and the refund-task cap under
//! concurrency. The shapers stand on a `ManualClock` (a request that must wait
//! sleeps on Tokio's clock for minutes, and is dropped long before), the runtime is
//! multi-threaded (4 workers), and the drops come from many tasks at once.
//!
//! Findings (the core's refund and cancellation rules, which the queues use;
//! `queue.rs` was not to be edited this session):
//!
//! * an immediate queue slot given back after a later charge's slot was given back
//!   came back as nothing (as `review_s45_mt.rs`'s GCRA finding): one client's
//!   refusal, racing another's, took a shared queue's slot away from every client.
//!   **Fixed** (session 45, "order": the refund of the schedule's last booking no
//!   longer counts in a later refund's shift):
//!   [`two_immediate_slots_given_back_out_of_order`];
//! * waiters that all leave (a crowd behind one client timeout) leave every slot
//!   but one held when they leave in join order (open): a cancellation keeps the
//!   units reserved after it, and nothing recovers them once the others cancel
//!   too. The next client queues behind the ghosts, or is refused as if the queue
//!   were full ([`waiters_that_all_leave_leave_no_slot_held`], `QueueRule` and
//!   `KeyedQueueRule`, ignored). In the reverse order they used to as well (each
//!   cancellation counted the earlier ones as maybe having moved it); **fixed** by
//!   the same change: [`waiters_that_all_leave_last_first_leave_no_slot_held`].
#![cfg(feature = "queue")]

use std::future::poll_fn;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use floodgate::{FixedWindow, KeyedLimiter, ManualClock, Policy, Shaper};
use floodgate_http::{
    from_fn, HeaderKey, KeyedQueueRule, PriorityRule, QueueRule, RateLimitLayer,
    RateLimitLayerBuilder, RateLimitService, ResponseFuture, Rule,
};
use http::Request;
use tower::{Layer, Service, ServiceExt};
mod common;
#[path = "common/remote.rs"]
mod remote;
#[path = "common/tasks.rs"]
mod tasks;
use common::{key_of, Hello};
use remote::{per_user, Remote};
use tasks::{at_once, deny_at_the_gate, runtime, Gate};

type Error = Box<dyn std::error::Error + Send + Sync>;
type TestResult = Result<(), Error>;

type Window = KeyedLimiter<u64, FixedWindow, ManualClock>;

/// A keyed fixed window of `limit` an hour on a clock of its own (standing).
fn window(limit: u64) -> Result<Arc<Window>, Error> {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(7 * 3600));
    Ok(Arc::new(
        floodgate::KeyedBuilder::new(FixedWindow::new(Policy::per_hour(limit)?)?)
            .clock(clock)
            .build::<u64>()?,
    ))
}

/// A layer builder whose first rule is "per-key", `per_key` on `x-key`.
fn with_per_key(per_key: &Arc<Window>) -> Result<RateLimitLayerBuilder, Error> {
    Ok(RateLimitLayer::builder().rule(Rule::shared(
        "per-key",
        Arc::clone(per_key),
        from_fn(key_of),
    )?))
}

fn keyed(key: u64) -> Result<Request<()>, String> {
    Request::get("/")
        .header("x-key", key.to_string())
        .body(())
        .map_err(|e| e.to_string())
}

/// Immediate slots only (a queue of 6 an hour, burst 6, that waits at most 1 ms:
/// a slot 10 minutes away is refused), then a per-key window of 1 an hour over 20
/// keys: 8 tasks × 30 requests at once. The queue never admits more than its burst,
/// no key more than once, and a slot given back never hands out more than the
/// queue had: the requests passed plus the slots left are at most 6.
///
/// Each 200's queue `remaining` is never above what the passed requests before it
/// left.
///
/// Mutations seen failing: the queue's refund giving back more than the charge
/// (`QueueRule::refund` resetting the shaper: the slots of requests that passed
/// come back too); the immediate slot shown as the schedule before its charge
/// (`QueueRule::start` peeking the schedule before `charge_at`).
#[test]
fn immediate_queue_slots_racing_later_denials_never_exceed_the_burst() -> TestResult {
    let rt = runtime()?;
    for seed in 0..3u64 {
        let shaper = Arc::new(Shaper::with_clock(Policy::per_hour(6)?, ManualClock::new()));
        let per_key = window(1)?;
        let layer = RateLimitLayer::builder()
            .queue(QueueRule::shared(
                "queue",
                Arc::clone(&shaper),
                Duration::from_millis(1),
            )?)
            .rule(Rule::shared(
                "per-key",
                Arc::clone(&per_key),
                from_fn(key_of),
            )?)
            .build()?;
        let svc = layer.layer(Hello);
        let all = rt.block_on(at_once(8, |t| {
            let svc = svc.clone();
            async move {
                let mut rng = common::Rng(seed * 100 + t as u64);
                let mut out = Vec::new();
                for _ in 0..30 {
                    let key = rng.below(20);
                    let resp = svc
                        .clone()
                        .oneshot(keyed(key)?)
                        .await
                        .map_err(|e| -> String { match e {} })?;
                    // The queue's `r` in `RateLimit`.
                    let r = resp
                        .headers()
                        .get("ratelimit")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.split("\"queue\";r=").nth(1))
                        .and_then(|v| v.split(';').next()?.parse::<u64>().ok());
                    out.push((key, resp.status().as_u16(), r));
                    tokio::task::yield_now().await;
                }
                Ok(out)
            }
        }))?;
        let passed: Vec<u64> = all
            .iter()
            .filter(|(_, s, _)| *s == 200)
            .map(|(k, _, _)| *k)
            .collect();
        assert!(passed.len() <= 6, "{passed:?}");
        // Each 200's queue `r`, most first: the i-th at most 5 − i (every slot of
        // an earlier passed request still taken when it was shown).
        let mut shown: Vec<u64> = all
            .iter()
            .filter(|(_, s, _)| *s == 200)
            .map(|(_, _, r)| r.ok_or("no queue member"))
            .collect::<Result<_, _>>()?;
        shown.sort_unstable_by(|a, b| b.cmp(a));
        for (i, r) in (0u64..).zip(&shown) {
            assert!(*r <= 5 - i, "queue remaining overstated: {shown:?}");
        }
        for k in 0..20 {
            let n = passed.iter().filter(|p| **p == k).count() as u64;
            assert!(n <= 1, "key {k} passed {n} times");
            assert_eq!(per_key.peek(&k, 0).remaining(), 1 - n, "key {k}");
        }
        let mut left = 0;
        while shaper.charge(1).0.is_allowed() {
            left += 1;
        }
        assert!(
            passed.len() + left <= 6,
            "{} passed, {left} left",
            passed.len()
        );
        let stats = layer.stats();
        assert_eq!(stats[1].allowed, passed.len() as u64);
        assert_eq!(stats[0].queued, 0, "nobody waited");
    }
    Ok(())
}

/// Two requests take a queue's two immediate slots (burst 2) and are held by the
/// gate; then turned away: every slot should be free again.
fn two_slots_given_back(order: [&str; 2]) -> Result<u32, String> {
    let shaper = Arc::new(Shaper::with_clock(
        Policy::per_hour(2).map_err(|e| e.to_string())?,
        ManualClock::new(),
    ));
    let gate = Arc::new(Gate::default());
    let layer = RateLimitLayer::builder()
        .queue(
            QueueRule::shared("queue", Arc::clone(&shaper), Duration::from_millis(1))
                .map_err(|e| e.to_string())?,
        )
        .rule(
            Rule::remote_shared(
                "gate",
                Arc::clone(&gate),
                HeaderKey::new("x-req").map_err(|e| e.to_string())?,
            )
            .map_err(|e| e.to_string())?,
        )
        .build()
        .map_err(|e| e.to_string())?;
    let mut svc = layer.layer(Hello);
    deny_at_the_gate(&mut svc, &gate, order, || {
        let now = floodgate::Clock::now(shaper.clock());
        assert!(!shaper.peek_at(now, 1).is_allowed(), "both slots taken");
    })?;
    let mut free = 0;
    while shaper.charge(1).0.is_allowed() {
        free += 1;
    }
    Ok(free)
}

/// In their charges' order, both immediate slots come back.
///
/// Mutation seen failing: the queue's refund ignored (`QueueRule::refund` not
/// calling `Shaper::refund`, by `let _ = receipt`: no slot free).
#[test]
fn two_immediate_slots_given_back_in_order() -> TestResult {
    assert_eq!(two_slots_given_back(["a", "b"])?, 2);
    Ok(())
}

/// Out of their charges' order (b's refusal first, as a concurrent later rule may
/// answer), both immediate slots come back too (session 45, "order"; before, "a"'s
/// did not: one slot free of two, for every client of the queue).
///
/// Mutation seen failing: `Gcra::refund_moves_later` always `true` (the shift
/// before: 1 free).
#[test]
fn two_immediate_slots_given_back_out_of_order() -> TestResult {
    assert_eq!(two_slots_given_back(["b", "a"])?, 2);
    Ok(())
}

/// The layer of the cancellation tests: "per-key" (a keyed window of 1 an hour)
/// then "queue" (1 every 10 minutes, burst 1, waiting up to 5 hours), both
/// standing; "a" (key 1 000) has taken the queue's slot.
struct Waiting {
    per_key: Arc<Window>,
    shaper: Arc<Shaper<ManualClock>>,
    svc: RateLimitService<Hello>,
}

fn waiting(priority: bool) -> Result<Waiting, Error> {
    let per_key = window(1)?;
    let shaper = Arc::new(Shaper::with_clock(
        Policy::per_hour(6)?.with_burst(1)?,
        ManualClock::new(),
    ));
    let builder = with_per_key(&per_key)?;
    let builder = if priority {
        // One tier of 32 places: every request in tier 0.
        let tier = from_fn(|_: &http::request::Parts| Ok::<usize, floodgate_http::KeyError>(0));
        builder.priority(PriorityRule::shared(
            "queue",
            Arc::clone(&shaper),
            &[32],
            tier,
        )?)
    } else {
        builder.queue(QueueRule::shared(
            "queue",
            Arc::clone(&shaper),
            Duration::from_secs(5 * 3600),
        )?)
    };
    let svc = builder.build()?.layer(Hello);
    Ok(Waiting {
        per_key,
        shaper,
        svc,
    })
}

/// The delay of a reservation of one unit now, in whole 10-minute slots: 1 when
/// only "a"'s slot is held.
fn slots_ahead(shaper: &Shaper<ManualClock>) -> Result<u64, Error> {
    let r = shaper.reserve(1, Duration::from_secs(24 * 3600))?;
    let slots = r.delay().as_secs() / 600;
    shaper.cancel(r);
    Ok(slots)
}

/// Polls `fut` once: whether it is still pending.
async fn pending(fut: &mut ResponseFuture<String, std::convert::Infallible>) -> bool {
    poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_pending())).await
}

/// 24 requests (keys 0..24) from 8 tasks join the queue behind "a", each charged in
/// "per-key"; then all 8 tasks drop theirs at once, each task from the last joined
/// to the first. Every earlier charge comes back (the per-key window counts are
/// exact), and the queue never gives back a slot still held: "a"'s slot stays. A
/// `QueueRule` keeps ghost slots (the open finding: printed); a `PriorityRule`,
/// whose head alone holds a reservation, keeps exactly "a"'s.
///
/// Mutations seen failing: the dropped request's in-process refunds removed
/// (`Held`'s drop not calling `give_back`: the keys stay spent); the queue's
/// cancellation giving back a slot it should keep (`CancelOnDrop` resetting the
/// shaper: "a"'s slot freed); the priority waiter's drop not cancelling its
/// reservation (`Leave`: 2 held).
#[test]
fn concurrent_drops_mid_queue_give_back_every_earlier_charge() -> TestResult {
    for priority in [false, true] {
        let held = drop_24_at_once(priority)?;
        if priority {
            assert_eq!(held, 1, "the priority rule keeps a's slot alone");
        } else {
            assert!(held >= 1, "a's slot is held");
            eprintln!("queue slots held after every waiter left: {held} (1 is a's)");
        }
    }
    Ok(())
}

/// [`concurrent_drops_mid_queue_give_back_every_earlier_charge`] on a `QueueRule`
/// or a `PriorityRule`: the slots held afterwards.
fn drop_24_at_once(priority: bool) -> Result<u64, Error> {
    let rt = runtime()?;
    let w = waiting(priority)?;
    rt.block_on(async {
        let a = w.svc.clone().oneshot(keyed(1_000)?).await;
        assert_eq!(a.map(|r| r.status().as_u16()), Ok(200));
        let joined = Arc::new(tokio::sync::Barrier::new(9));
        let handles: Vec<_> = (0..8u64)
            .map(|t| {
                let (svc, joined) = (w.svc.clone(), Arc::clone(&joined));
                tokio::spawn(async move {
                    let mut futs = Vec::new();
                    for i in 0..3 {
                        let mut svc = svc.clone();
                        let mut fut = ServiceExt::<Request<()>>::ready(&mut svc)
                            .await
                            .map_err(|e| -> String { match e {} })?
                            .call(keyed(t * 3 + i)?);
                        if !pending(&mut fut).await {
                            return Err("a request did not wait".to_owned());
                        }
                        futs.push(fut);
                    }
                    joined.wait().await; // every request waits
                    joined.wait().await; // the test has looked
                    while let Some(last) = futs.pop() {
                        drop(last);
                    }
                    Ok::<_, String>(())
                })
            })
            .collect();
        joined.wait().await;
        for k in 0..24 {
            assert_eq!(w.per_key.peek(&k, 0).remaining(), 0, "key {k} charged");
        }
        joined.wait().await;
        for h in handles {
            h.await??;
        }
        Ok::<_, Error>(())
    })?;
    for k in 0..24 {
        assert_eq!(w.per_key.peek(&k, 0).remaining(), 1, "key {k} given back");
    }
    slots_ahead(&w.shaper)
}

/// Four waiters (keys 0..4) dropped one by one, in join order or (`rev`) the
/// reverse: the slots held afterwards, in 10-minute units ("a"'s is 1).
fn held_after_drops(priority: bool, rev: bool) -> Result<u64, Error> {
    let w = waiting(priority)?;
    a_then_four_leave(&w.svc, |k| Ok(keyed(k)?), rev)?;
    slots_ahead(&w.shaper)
}

/// "a" (key 1 000) is served by `svc`; then 4 requests (keys 0..4) wait behind it
/// and are dropped one by one, in join order or (`rev`) the reverse.
fn a_then_four_leave(
    svc: &RateLimitService<Hello>,
    req: impl Fn(u64) -> Result<Request<()>, Error>,
    rev: bool,
) -> TestResult {
    runtime()?.block_on(async {
        let a = svc.clone().oneshot(req(1_000)?).await;
        assert_eq!(a.map(|r| r.status().as_u16()), Ok(200));
        let mut futs = Vec::new();
        for k in 0..4 {
            let mut fut = svc.clone().call(req(k)?);
            assert!(pending(&mut fut).await, "{k} waits");
            futs.push(fut);
        }
        if rev {
            futs.reverse();
        }
        for fut in futs {
            drop(fut);
        }
        Ok(())
    })
}

/// A priority rule's waiters that all leave, in either order, leave only "a"'s
/// slot held: only the head of the queue holds a reservation, and nobody holds one
/// after it when it leaves (the others hold places, not slots). Checked clean.
///
/// Mutation seen failing: the priority waiter's drop not cancelling its
/// reservation (`Leave`'s drop dropping it: 2 held).
#[test]
fn priority_waiters_that_all_leave_leave_no_slot_held() -> TestResult {
    for rev in [false, true] {
        assert_eq!(held_after_drops(true, rev)?, 1, "rev {rev}");
    }
    Ok(())
}

/// Four waiters leaving, in either order, from a `QueueRule` and from a
/// `KeyedQueueRule`: the queue never gives back "a"'s slot (still held) nor keeps
/// more than the waiters reserved, and the last waiter's slot always comes back
/// (nobody holds a slot after it when it leaves last in join order; it is the
/// first to leave in the reverse order); every per-key charge comes back.
///
/// Mutations seen failing: `CancelOnDrop` not cancelling (its drop a no-op: 5
/// held); `RefundOnDrop` not refunding (the keyed queue: 5 held).
#[test]
fn waiters_leaving_keep_a_held_slot_and_give_back_the_last() -> TestResult {
    for rev in [false, true] {
        for (rule, held) in [
            ("queue", held_after_drops(false, rev)?),
            ("keyed queue", keyed_held_after_drops(rev)?),
        ] {
            assert!((1..=4).contains(&held), "{rule}, rev {rev}: {held} held");
        }
    }
    Ok(())
}

/// Waiters that all leave should leave only "a"'s slot held; in join order (the
/// order a crowd behind one client timeout leaves in) they leave 4 (3 ghosts):
/// each cancellation keeps the units reserved after it (`Shaper::cancel`), and
/// nothing gives those back once the later waiters cancel too. The next client
/// waits 30 minutes behind nobody (or, past `max_delay`, is refused). The same
/// with a `KeyedQueueRule` (`KeyedLimiter::refund`'s rule): 4 held.
#[test]
#[ignore = "open: waiters that all leave in join order keep all slots but one held (Shaper::cancel's and the keyed GCRA refund's rule: units reserved after a cancelled one stay spent)"]
fn waiters_that_all_leave_leave_no_slot_held() -> TestResult {
    assert_eq!(held_after_drops(false, false)?, 1, "join order");
    assert_eq!(keyed_held_after_drops(false)?, 1, "keyed, join order");
    Ok(())
}

/// Waiters that all leave from the last to join to the first leave only "a"'s
/// slot held, from a `QueueRule` and a `KeyedQueueRule` (session 45, "order": the
/// cancellation of the schedule's last reservation moved nobody, so it no longer
/// counts in the next one's shift; before, 4 held).
///
/// Mutation seen failing: `refund_moves_later` always `true` on `Gcra` and on the
/// shaper's `CancelRule` (the shift before: 4 held).
#[test]
fn waiters_that_all_leave_last_first_leave_no_slot_held() -> TestResult {
    assert_eq!(held_after_drops(false, true)?, 1, "reverse order");
    assert_eq!(keyed_held_after_drops(true)?, 1, "keyed, reverse order");
    Ok(())
}

/// A keyed queue's waiters (all on queue key "q", each its own per-key window key)
/// dropped one by one, in join order or (`rev`) the reverse, behind "a": the slots
/// held afterwards on "q", in 10-minute units ("a"'s is 1).
fn keyed_held_after_drops(rev: bool) -> Result<u64, Error> {
    type Queue = KeyedLimiter<String, floodgate::Gcra, ManualClock>;
    let per_key = window(1)?;
    let queue: Arc<Queue> = Arc::new(KeyedLimiter::gcra_with_clock(
        Policy::per_hour(6)?.with_burst(1)?,
        ManualClock::new(),
    ));
    let layer = with_per_key(&per_key)?
        .queue_per_key(KeyedQueueRule::shared(
            "queue",
            HeaderKey::new("x-q")?,
            Arc::clone(&queue),
            Duration::from_secs(5 * 3600),
        )?)
        .build()?;
    let svc = layer.layer(Hello);
    let req = |k: u64| {
        Ok(Request::get("/")
            .header("x-key", k.to_string())
            .header("x-q", "q")
            .body(())?)
    };
    a_then_four_leave(&svc, req, rev)?;
    for k in 0..4 {
        assert_eq!(per_key.peek(&k, 0).remaining(), 1, "key {k} given back");
    }
    let (_, delay, _) = queue.reserve("q", 1, Duration::from_secs(24 * 3600))?;
    Ok(delay.as_secs() / 600)
}

/// The refund-task cap under drops from many tasks at once: a remote rule (the
/// double, whose refunds hang: `stuck`) then a queue that "a" holds; 24 requests
/// from 8 tasks wait, then all are dropped at once, with at most 3 refund tasks.
/// Exactly 3 are spawned (on the runtime, no spawner) and the other 21 are counted
/// in `errors`, their charges kept; when the runtime shuts down, the 3 hung tasks
/// are dropped and counted too: every dropped request's charge accounted for once.
///
/// Mutation seen failing: the cap not checked (`try_acquire` always taking a
/// place: 24 tasks spawned, no error counted at the drops).
#[test]
fn the_refund_task_cap_holds_under_concurrent_drops() -> TestResult {
    let remote = Remote::new().map_err(|e| e.to_string())?;
    remote.stuck.store(true, Ordering::SeqCst);
    let shaper = Arc::new(Shaper::with_clock(
        Policy::per_hour(6)?.with_burst(1)?,
        ManualClock::new(),
    ));
    let layer = RateLimitLayer::builder()
        .rule(per_user("per-user", &remote).map_err(|e| e.to_string())?)
        .queue(QueueRule::shared(
            "queue",
            Arc::clone(&shaper),
            Duration::from_secs(5 * 3600),
        )?)
        .max_refund_tasks(3)
        .build()?;
    let svc = layer.layer(Hello);
    let errors = || layer.rule_stats("per-user").map(|s| s.errors);
    let rt = runtime()?;
    rt.block_on(async {
        let a = svc.clone().oneshot(remote::from("a")).await;
        assert_eq!(a.map(|r| r.status().as_u16()), Ok(200));
        let dropped = at_once(8, |t| {
            let svc = svc.clone();
            async move {
                let mut futs = Vec::new();
                for i in 0..3 {
                    let mut fut = svc.clone().call(remote::from(&format!("u{t}-{i}")));
                    if !pending(&mut fut).await {
                        return Err("a request did not wait".to_owned());
                    }
                    futs.push(fut);
                }
                tokio::task::yield_now().await;
                drop(futs);
                Ok(vec![()])
            }
        })
        .await?;
        assert_eq!(dropped.len(), 8);
        // The spawned tasks run their refunds as far as they go (they hang).
        for _ in 0..16 {
            tokio::task::yield_now().await;
        }
        Ok::<_, Error>(())
    })?;
    assert_eq!(errors(), Some(21), "beyond the cap: counted, not spawned");
    assert_eq!(
        remote.refunds.load(Ordering::SeqCst),
        0,
        "every refund hangs"
    );
    drop(rt);
    assert_eq!(errors(), Some(24), "the hung tasks counted when dropped");
    Ok(())
}
