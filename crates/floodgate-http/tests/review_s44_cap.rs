//! Session 44 review (feature `queue`): attacks on the refund-task cap
//! (`RateLimitLayerBuilder::max_refund_tasks`) and on the counting of refunds a
//! dropped request's task did not make.
//!
//! Two laws are checked after every attack: every place a task took comes back
//! (the layer spawns exactly its cap again, and refuses one more), and every
//! remote charge is either given back or counted once in its rule's `errors`.
//!
//! The remote limit is the in-memory double of `common/remote.rs` ([`Remote`]),
//! wrapped here where a refund must misbehave in ways the double does not
//! ([`Wrapped`]). The queue that makes a request wait stands on a `ManualClock`,
//! and the runtimes are Tokio's paused ones: no test sleeps for real.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use floodgate::{AsyncLimit, AsyncReceipt, Decision, ManualClock, Policy, RateLimiter, Shaper};
use floodgate_http::{
    Global, HeaderKey, QueueRule, RateLimitLayer, RateLimitLayerBuilder, RefundTask, Rule, Strategy,
};
use http::{Request, StatusCode};
use tokio::runtime::Runtime;
use tower::{Layer, Service, ServiceExt};
mod common;
#[path = "common/remote.rs"]
mod remote;
use common::{Hello, TestResult};
use remote::{
    a_served_then_b, dropped_while_queued, from, on_threads, paused_runtime, per_user, Remote,
    Unreachable,
};

/// What [`Spawner`] does with the task it is handed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Mode {
    /// Keeps it, unrun, for the test to run or drop ([`Spawner::take`]).
    Keep,
    /// Runs it inline, in the drop that made it, polling until it ends (a
    /// synchronous executor, yielding the thread between polls), then drops it.
    Inline,
    /// Polls it once and drops it.
    PollOnceThenDrop,
    /// Panics before it looks at the task.
    PanicFirst,
    /// Keeps it, then panics.
    KeepThenPanic,
    /// Drops it unrun (a bounded pool that refuses it).
    Refuse,
}

const MODES: [Mode; 6] = [
    Mode::Keep,
    Mode::Inline,
    Mode::PollOnceThenDrop,
    Mode::PanicFirst,
    Mode::KeepThenPanic,
    Mode::Refuse,
];

/// A refund spawner whose behaviour the test switches between drops.
#[derive(Clone)]
struct Spawner {
    mode: Arc<AtomicU8>,
    kept: Arc<Mutex<Vec<RefundTask>>>,
    /// Tasks being run inline now, and the most seen at once.
    running: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

impl Spawner {
    fn new(mode: Mode) -> Spawner {
        Spawner {
            mode: Arc::new(AtomicU8::new(mode as u8)),
            kept: Arc::default(),
            running: Arc::default(),
            most: Arc::default(),
        }
    }

    fn set(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }

    fn mode(&self) -> Mode {
        let n = self.mode.load(Ordering::SeqCst);
        MODES
            .into_iter()
            .find(|m| *m as u8 == n)
            .unwrap_or(Mode::Keep)
    }

    /// `builder` with this spawner.
    fn on(&self, builder: RateLimitLayerBuilder) -> RateLimitLayerBuilder {
        let this = self.clone();
        builder.refund_spawner(move |task| this.spawn(task))
    }

    fn keep(&self, task: RefundTask) {
        if let Ok(mut kept) = self.kept.lock() {
            kept.push(task);
        }
    }

    fn spawn(&self, mut task: RefundTask) {
        match self.mode() {
            Mode::Keep => self.keep(task),
            Mode::Inline => {
                // The double's refund ends on its second poll; a bound, not a spin.
                // The thread yields between polls, so that threads dropping at once
                // overlap while a task holds its place.
                let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
                self.most.fetch_max(now, Ordering::SeqCst);
                for _ in 0..64 {
                    if poll_once(&mut task).is_ready() {
                        break;
                    }
                    std::thread::yield_now();
                }
                self.running.fetch_sub(1, Ordering::SeqCst);
            }
            Mode::PollOnceThenDrop => {
                let _ = poll_once(&mut task);
            }
            Mode::PanicFirst => panic!("the test's spawner panics before it runs the task"),
            Mode::KeepThenPanic => {
                self.keep(task);
                panic!("the test's spawner panics after keeping the task");
            }
            Mode::Refuse => drop(task),
        }
    }

    /// The tasks kept since the last call.
    fn take(&self) -> Vec<RefundTask> {
        self.kept
            .lock()
            .map(|mut kept| std::mem::take(&mut *kept))
            .unwrap_or_default()
    }
}

/// Polls `task` once, with a waker that does nothing.
fn poll_once(task: &mut RefundTask) -> Poll<()> {
    task.as_mut().poll(&mut Context::from_waker(Waker::noop()))
}

/// The remote per-user rule "per-user" on `remote`, then a global queue of
/// `burst` requests at once (then one per 100 ms) on a standing clock, waiting at
/// most 1 s: once `burst` requests are served, every later one waits.
fn remote_then_queue_of(
    remote: &Arc<Remote>,
    burst: u64,
) -> Result<RateLimitLayerBuilder, Box<dyn std::error::Error>> {
    let shaper = Shaper::with_clock(
        Policy::per_second(10)?.with_burst(burst)?,
        ManualClock::new(),
    );
    Ok(RateLimitLayer::builder()
        .rule(per_user("per-user", remote)?)
        .queue(QueueRule::new("queue", shaper, Duration::from_secs(1))?))
}

/// `who` is served by `layer` on `rt`.
fn served(rt: &Runtime, layer: &RateLimitLayer, who: &str) -> TestResult {
    rt.block_on(async {
        let response = layer.layer(Hello).oneshot(from(who)).await?;
        assert_eq!(response.status(), StatusCode::OK, "{who} is served");
        Ok(())
    })
}

/// The `errors` of the rule `name`.
fn errors_of(layer: &RateLimitLayer, name: &str) -> u64 {
    layer.rule_stats(name).map_or(u64::MAX, |s| s.errors)
}

/// The first law: the layer (its queue's slot held) spawns exactly `cap` tasks
/// again and refuses one more, counting it; run, the `cap` tasks give their
/// charges back. Leaves `spawner` keeping tasks.
fn spawns_its_cap_again(
    rt: &Runtime,
    layer: &RateLimitLayer,
    spawner: &Spawner,
    remote: &Remote,
    cap: usize,
    tag: &str,
) -> TestResult {
    spawner.set(Mode::Keep);
    let before = errors_of(layer, "per-user");
    let users: Vec<String> = (0..=cap).map(|i| format!("{tag}-cap-{i}")).collect();
    for user in &users {
        dropped_while_queued(rt, layer, user)?;
    }
    let kept = spawner.take();
    assert_eq!(
        kept.len(),
        cap,
        "after {tag}: the layer spawns its cap again"
    );
    assert_eq!(
        errors_of(layer, "per-user"),
        before + 1,
        "after {tag}: one beyond the cap is refused, counted"
    );
    for task in kept {
        rt.block_on(task);
    }
    let back = users.iter().filter(|u| remote.left(u) == 3).count();
    assert_eq!(
        back, cap,
        "after {tag}: the cap's tasks gave their charges back"
    );
    Ok(())
}

/// Every way a spawner can end a task — run inline to its end, polled once and
/// dropped, a panic before it looks at the task, kept then a panic, dropped unrun,
/// kept and run later; and, run inline, a refund that fails remotely or panics —
/// each charge is given back or counted once in `errors`, and every place comes
/// back: the layer spawns exactly its cap again after each.
///
/// Mutations seen failing: the place given back a second time when the task's
/// refunds end (a `release` in `poll` on `Ready`, besides the drop: the count
/// wraps below 0, every later task refused); the place given back only by a task
/// dropped with refunds pending (inline: "no place"); the task's drop counting
/// every refund it was made with rather than those pending (inline: `errors` 1);
/// a failed refund kept in `pending` after it is counted (counted twice, the
/// remote-down case: `errors` 2).
#[test]
fn every_way_a_task_ends_gives_its_place_back_and_counts_once() -> TestResult {
    const CAP: usize = 2;
    let remote = Remote::new()?;
    let spawner = Spawner::new(Mode::Keep);
    let layer = spawner
        .on(remote_then_queue_of(&remote, 1)?)
        .max_refund_tasks(CAP)
        .build()?;
    let rt = paused_runtime()?;
    served(&rt, &layer, "a")?;
    spawns_its_cap_again(&rt, &layer, &spawner, &remote, CAP, "start")?;
    // (mode, the remote's refund fails, it panics, given back, counted)
    let cases = [
        (Mode::Inline, false, false, true, 0),
        (Mode::PollOnceThenDrop, false, false, false, 1),
        (Mode::PanicFirst, false, false, false, 1),
        (Mode::Refuse, false, false, false, 1),
        (Mode::Inline, true, false, false, 1),
        (Mode::Inline, false, true, false, 1),
    ];
    for (i, (mode, down, panics, given_back, counted)) in cases.into_iter().enumerate() {
        let who = format!("case-{i}");
        let tag = format!("{mode:?} (down {down}, panics {panics})");
        spawner.set(mode);
        remote.down.store(down, Ordering::SeqCst);
        remote.panics.store(panics, Ordering::SeqCst);
        let before = errors_of(&layer, "per-user");
        dropped_while_queued(&rt, &layer, &who)?;
        remote.down.store(false, Ordering::SeqCst);
        remote.panics.store(false, Ordering::SeqCst);
        assert!(spawner.take().is_empty(), "{tag}: nothing kept");
        let left = if given_back { 3 } else { 2 };
        assert_eq!(remote.left(&who), left, "{tag}: given back or taken");
        assert_eq!(
            errors_of(&layer, "per-user") - before,
            counted,
            "{tag}: counted once, or not at all"
        );
        spawns_its_cap_again(&rt, &layer, &spawner, &remote, CAP, &tag)?;
    }
    // Kept, then the spawner panics: the task still runs later, nothing counted.
    for (mode, who) in [(Mode::KeepThenPanic, "kept-panic"), (Mode::Keep, "kept")] {
        spawner.set(mode);
        let before = errors_of(&layer, "per-user");
        dropped_while_queued(&rt, &layer, who)?;
        let kept = spawner.take();
        assert_eq!(kept.len(), 1, "{mode:?}: the task is kept");
        for task in kept {
            rt.block_on(task);
        }
        assert_eq!(remote.left(who), 3, "{mode:?}: run later, given back");
        assert_eq!(
            errors_of(&layer, "per-user"),
            before,
            "{mode:?}: nothing counted"
        );
        spawns_its_cap_again(&rt, &layer, &spawner, &remote, CAP, &format!("{mode:?}"))?;
    }
    Ok(())
}

/// A remote limit on [`Remote`] whose receipts and refunds can misbehave:
/// `bomb` makes a receipt that is dropped unspent panic (a user's limiter whose
/// refund state panics when dropped); `silent` makes a refund reach the remote
/// (the charge given back) and then never hear its reply (a round trip whose
/// answer is lost).
struct Wrapped {
    remote: Arc<Remote>,
    bomb: Arc<AtomicBool>,
    silent: AtomicBool,
}

/// A [`Wrapped`] receipt: the double's own, and whether to panic when dropped
/// unspent.
struct Bomb {
    receipt: Option<AsyncReceipt>,
    armed: Arc<AtomicBool>,
}

impl Drop for Bomb {
    fn drop(&mut self) {
        if self.receipt.is_some() && self.armed.load(Ordering::SeqCst) {
            panic!("the test's receipt panics when dropped unspent");
        }
    }
}

impl AsyncLimit<String> for Wrapped {
    type Error = Unreachable;

    async fn check_n(&self, key: &String, cost: u32) -> Result<Decision, Unreachable> {
        self.remote.check_n(key, cost).await
    }

    async fn peek_n(&self, key: &String, cost: u32) -> Result<Decision, Unreachable> {
        self.remote.peek_n(key, cost).await
    }

    async fn charge_n(
        &self,
        key: &String,
        cost: u32,
    ) -> Result<(Decision, AsyncReceipt), Unreachable> {
        let (decision, receipt) = self.remote.charge_n(key, cost).await?;
        if !receipt.is_charged() {
            return Ok((decision, receipt));
        }
        let bomb = Bomb {
            receipt: Some(receipt),
            armed: Arc::clone(&self.bomb),
        };
        Ok((decision, AsyncReceipt::new(bomb)))
    }

    async fn refund(&self, key: &String, receipt: AsyncReceipt) -> Result<bool, Unreachable> {
        let Some(mut bomb) = receipt.into_inner::<Bomb>() else {
            return Ok(false);
        };
        let Some(inner) = bomb.receipt.take() else {
            return Ok(false);
        };
        let given_back = self.remote.refund(key, inner).await?;
        if self.silent.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        Ok(given_back)
    }
}

impl Wrapped {
    fn new(remote: &Arc<Remote>) -> Arc<Wrapped> {
        Arc::new(Wrapped {
            remote: Arc::clone(remote),
            bomb: Arc::new(AtomicBool::new(false)),
            silent: AtomicBool::new(false),
        })
    }

    /// The remote rule "per-user" on `self`, then a global queue of one request at
    /// once on a standing clock.
    fn then_queue(
        self: &Arc<Wrapped>,
    ) -> Result<RateLimitLayerBuilder, Box<dyn std::error::Error>> {
        let shaper = Shaper::with_clock(Policy::per_second(10)?.with_burst(1)?, ManualClock::new());
        Ok(RateLimitLayer::builder()
            .rule(Rule::remote_shared(
                "per-user",
                Arc::clone(self),
                HeaderKey::new("x-user")?,
            )?)
            .queue(QueueRule::new("queue", shaper, Duration::from_secs(1))?))
    }
}

/// A task dropped unrun whose refund panics when dropped (the limiter's receipt
/// does): the charge is counted once and the task's place still comes back — the
/// count and the place are settled before any of the limiter's code runs in the
/// drop, so a panic there (caught around the spawner) leaks nothing.
///
/// Seen failing before the fix: the place given back after the refunds were
/// dropped (the drop unwound before it: "no place" for every later task, the cap
/// lost for good). Mutation seen failing after it: the place given back after
/// the pending refunds are dropped (as before the fix).
#[test]
fn a_refund_that_panics_when_dropped_does_not_leak_its_place() -> TestResult {
    let remote = Remote::new()?;
    let wrapped = Wrapped::new(&remote);
    let spawner = Spawner::new(Mode::Refuse);
    let layer = spawner
        .on(wrapped.then_queue()?)
        .max_refund_tasks(1)
        .build()?;
    let rt = paused_runtime()?;
    served(&rt, &layer, "a")?;
    wrapped.bomb.store(true, Ordering::SeqCst);
    dropped_while_queued(&rt, &layer, "b")?;
    wrapped.bomb.store(false, Ordering::SeqCst);
    assert_eq!(remote.left("b"), 2, "b's charge stays taken");
    assert_eq!(errors_of(&layer, "per-user"), 1, "counted once");
    spawns_its_cap_again(&rt, &layer, &spawner, &remote, 1, "a panicking drop")?;
    Ok(())
}

/// A refund that panics when dropped, where the layer itself drops it — the
/// request dropped outside any runtime with no spawner (the task dropped unrun),
/// or refused at the cap — panics nowhere out of the request's drop: the drop runs
/// where a panic would unwind out of the dropped response future (or abort, were
/// it already unwinding). Each charge is counted once, and the place of the
/// dropped task comes back (the next request's refund, dropped on a runtime, is
/// spawned and gives its charge back).
///
/// Seen failing before the fix: the panic unwound out of both drops. Mutation
/// seen failing after it: either drop not caught (the drop panics).
#[test]
fn a_refund_that_panics_when_dropped_by_the_layer_panics_out_of_no_drop() -> TestResult {
    for cap in [1, 0] {
        let remote = Remote::new()?;
        let wrapped = Wrapped::new(&remote);
        let layer = wrapped.then_queue()?.max_refund_tasks(cap).build()?;
        let rt = paused_runtime()?;
        served(&rt, &layer, "a")?;
        let b = remote::waiting_b(&rt, &layer)?;
        wrapped.bomb.store(true, Ordering::SeqCst);
        let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(b)));
        wrapped.bomb.store(false, Ordering::SeqCst);
        assert!(dropped.is_ok(), "cap {cap}: b's drop does not panic");
        assert_eq!(remote.left("b"), 2, "cap {cap}: b's charge stays taken");
        assert_eq!(errors_of(&layer, "per-user"), 1, "cap {cap}: counted once");
        if cap == 1 {
            dropped_while_queued(&rt, &layer, "c")?;
            assert_eq!(remote.left("c"), 3, "the place came back: c's refund ran");
            assert_eq!(errors_of(&layer, "per-user"), 1);
        }
    }
    Ok(())
}

/// A refund whose round trip reached the remote (the charge given back there)
/// but whose reply never came, its task dropped by a runtime shutting down: the
/// layer cannot tell it was made, so it is counted in `errors` — though the
/// charge is back. The docs say such a charge *may* stay taken, not that it does.
///
/// Mutation seen failing: the task's drop not counting its pending refunds
/// (`errors` 0).
#[test]
fn a_refund_dropped_after_it_reached_the_remote_is_counted_though_made() -> TestResult {
    let remote = Remote::new()?;
    let wrapped = Wrapped::new(&remote);
    let layer = wrapped.then_queue()?.max_refund_tasks(1).build()?;
    let first = paused_runtime()?;
    served(&first, &layer, "a")?;
    wrapped.silent.store(true, Ordering::SeqCst);
    dropped_while_queued(&first, &layer, "b")?;
    assert_eq!(remote.left("b"), 3, "the refund reached the remote");
    assert_eq!(errors_of(&layer, "per-user"), 0, "its reply is awaited");
    drop(first);
    assert_eq!(remote.left("b"), 3, "the charge is back");
    assert_eq!(
        errors_of(&layer, "per-user"),
        1,
        "not known to be made: counted"
    );
    Ok(())
}

/// Two remote rules, then a global rule that turns the request away (429): the
/// first rule's refund fails at once, the second's round trip is slow, and the
/// client goes away during it. The failure is counted once (by the request's own
/// refund path), the slow refund goes on in one task with one place; with no
/// place (`max_refund_tasks(0)`) it is counted instead — each rule once.
///
/// Mutations seen failing: a failed refund kept in `pending` after it is counted
/// (the task polls it again: a panic, `errors` 2); the task's drop counting every
/// refund it was made with (cap 1: `slow` counted though given back).
#[test]
fn a_429_with_two_remote_rules_dropped_half_refunded_counts_each_once() -> TestResult {
    for cap in [1, 0] {
        let down = Remote::new()?;
        let slow = Remote::new()?;
        down.down.store(true, Ordering::SeqCst);
        slow.slow.store(true, Ordering::SeqCst);
        let global = RateLimiter::gcra_with_clock(Policy::per_hour(1)?, ManualClock::new());
        let spawner = Spawner::new(Mode::Keep);
        let layer = spawner
            .on(RateLimitLayer::builder()
                .rule(per_user("down", &down)?)
                .rule(per_user("slow", &slow)?)
                .rule(Rule::new("global", global, Global)?))
            .max_refund_tasks(cap)
            .build()?;
        let rt = paused_runtime()?;
        rt.block_on(async {
            let b = a_served_then_b(&mut layer.layer(Hello)).await?;
            let timed_out = tokio::time::timeout(Duration::from_millis(10), b)
                .await
                .is_err();
            assert!(timed_out, "b's slow refund is under way when it is dropped");
            Ok::<_, Box<dyn std::error::Error>>(())
        })?;
        assert_eq!(errors_of(&layer, "down"), 1, "cap {cap}: the failure, once");
        assert_eq!(down.left("b"), 2);
        let kept = spawner.take();
        assert_eq!(kept.len(), cap, "cap {cap}: one task, or none");
        for task in kept {
            rt.block_on(task);
        }
        let (left, counted) = if cap == 1 { (3, 0) } else { (2, 1) };
        assert_eq!(slow.left("b"), left, "cap {cap}: slow's charge");
        assert_eq!(
            errors_of(&layer, "slow"),
            counted,
            "cap {cap}: slow's count"
        );
        assert_eq!(errors_of(&layer, "down"), 1, "cap {cap}: still once");
    }
    Ok(())
}

/// A 429 whose remote refund ends in the request's own future hands no task to
/// the spawner and takes no place: the one place of `max_refund_tasks(1)` is
/// still there for the next request, dropped during its refund.
///
/// Mutation seen failing: `spawn_refunds` without its early return for no
/// refunds (an empty task kept, holding the place: "c" refused).
#[test]
fn a_429_whose_refund_ends_takes_no_place() -> TestResult {
    let remote = Remote::new()?;
    let spawner = Spawner::new(Mode::Keep);
    let layer = spawner
        .on(remote::slow_remote_then_global(&remote)?)
        .max_refund_tasks(1)
        .build()?;
    let rt = paused_runtime()?;
    rt.block_on(async {
        let mut svc = layer.layer(Hello);
        let b = a_served_then_b(&mut svc).await?.await?;
        assert_eq!(b.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(remote.left("b"), 3, "b's refund ended");
        let c = ServiceExt::<Request<()>>::ready(&mut svc)
            .await?
            .call(from("c"));
        let timed_out = tokio::time::timeout(Duration::from_millis(10), c)
            .await
            .is_err();
        assert!(timed_out, "c's refund is under way when it is dropped");
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    let kept = spawner.take();
    assert_eq!(kept.len(), 1, "only c's task, in the one place");
    for task in kept {
        rt.block_on(task);
    }
    assert_eq!(remote.left("c"), 3);
    assert_eq!(errors_of(&layer, "per-user"), 0);
    Ok(())
}

/// Requests served take no place, and neither does a soft remote rule's denial
/// (uncharged, nothing to give back): with one place, after three served requests
/// (the third past the soft rule's limit), a request dropped while it waits gets
/// its task, holding only the hard rule's refund; and after it, the next one too.
///
/// Mutation seen failing: `Held::keep` taking a place it never gives back (a
/// count on the admit path: "u" refused, `errors` 1).
#[test]
fn served_and_uncharged_requests_take_no_place() -> TestResult {
    let remote = Remote::new()?;
    let soft = Remote::new()?;
    let spawner = Spawner::new(Mode::Keep);
    let layer = spawner
        .on(RateLimitLayer::builder()
            .rule(per_user("soft", &soft)?.strategy(Strategy::Soft).cost(2))
            .rule(per_user("per-user", &remote)?)
            .queue(QueueRule::new(
                "queue",
                Shaper::with_clock(Policy::per_second(10)?.with_burst(3)?, ManualClock::new()),
                Duration::from_secs(1),
            )?))
        .max_refund_tasks(1)
        .build()?;
    let rt = paused_runtime()?;
    for who in ["u", "u", "v"] {
        served(&rt, &layer, who)?;
    }
    assert_eq!(
        (soft.left("u"), remote.left("u")),
        (1, 1),
        "u's second: soft denied"
    );
    dropped_while_queued(&rt, &layer, "u")?;
    let kept = spawner.take();
    assert_eq!(kept.len(), 1, "u's task");
    for task in kept {
        rt.block_on(task);
    }
    assert_eq!(
        (soft.left("u"), remote.left("u")),
        (1, 1),
        "only the hard charge back"
    );
    dropped_while_queued(&rt, &layer, "w")?;
    let kept = spawner.take();
    assert_eq!(kept.len(), 1, "w's task: u's place came back");
    for task in kept {
        rt.block_on(task);
    }
    assert_eq!((soft.left("w"), remote.left("w")), (3, 3));
    assert_eq!(
        (errors_of(&layer, "soft"), errors_of(&layer, "per-user")),
        (0, 0)
    );
    Ok(())
}

/// [`places_taken_and_given_back_at_once_add_up`]: threads, drops on each, places.
const THREADS: usize = 4;
const EACH: usize = 40;
const CAP: usize = 2;

/// Threads drop requests at once, each task run inline to its end or refused at
/// the cap of two: places are taken and given back concurrently. However they
/// interleave, every refund is made or counted, once (the second law, summed over
/// the drops), and afterwards the layer spawns exactly its cap again (no place lost
/// or doubled).
///
/// Mutations seen failing: the at-cap refusal not counting its refunds (the sum
/// short of the drops); a place taken by a load, a check, a `yield_now` and an add
/// instead of one read-modify-write (three at once: every run seen); a place given
/// back by a load, a `yield_now` and a store (a lost update: 4 runs of 7). Without
/// the `yield_now` in the mutation neither was seen failing: these need an
/// interleaving no schedule forces, and this test is no proof of atomicity.
#[test]
fn places_taken_and_given_back_at_once_add_up() -> TestResult {
    let spawner = Spawner::new(Mode::Inline);
    let remote = Remote::new()?;
    let layer = spawner
        .on(remote_then_queue_of(&remote, 1)?)
        .max_refund_tasks(CAP)
        .build()?;
    served(&paused_runtime()?, &layer, "a")?;
    on_threads(THREADS, |t, rt| {
        (0..EACH).try_for_each(|i| dropped_while_queued(rt, &layer, &format!("t{t}-{i}")))
    })?;
    // Every drop was charged: its refund reached the remote (`refunds`; the
    // double's keyed limit may then give back less than the charge, conservatively,
    // when other keys of its shard were refunded meanwhile) or was counted.
    let made = u64::from(remote.refunds.load(Ordering::SeqCst));
    let drops = u64::try_from(THREADS * EACH)?;
    assert_eq!(
        made + errors_of(&layer, "per-user"),
        drops,
        "every refund made or counted, once"
    );
    // A task runs inline while it holds its place: never more at once than the cap.
    let most = spawner.most.load(Ordering::SeqCst);
    assert!((1..=CAP).contains(&most), "{most} at once: at most the cap");
    let rt = paused_runtime()?;
    spawns_its_cap_again(&rt, &layer, &spawner, &remote, CAP, "the threads")?;
    Ok(())
}
