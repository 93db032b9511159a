//! loom models of the *full look* for idle keys (`evict_sampled` in the keyed
//! storage): an insert into a shard at its share, whose hand and sample meet only
//! live keys, passes over every slot of the shard and reclaims every idle key
//! (unlinking each by backward shift) instead of evicting a live one — while a
//! lock-free reader of another key of the same shard runs. On every storage (`Heap`,
//! `Inline`, `Fingerprint`):
//!
//! * a check of a key the look's backward shift moves — once, or twice by a look
//!   that reclaims two idle keys ahead of it in its cluster (the pass looks again
//!   at a slot a key shifted into) — keeps its charge and the earlier one (never
//!   lost, never counted twice, never a half-moved entry);
//! * a peek of that key sees its charge wherever the shift has got to (a miss while
//!   keys move is retried under the lock);
//! * a key that an earlier check made live at the inserting decision's reading is
//!   never reclaimed by the look: its charge stands.
//!
//! Each model asserts the look ran in every execution (`KeyedLimiter::full_looks`,
//! a counter compiled under loom only), and fails unless loom ran the racing reader
//! before, across and after the look (or both orders of the race it tells apart).
//!
//! The shard is one of 10 keys (14 slots) — the least a look can happen in: the
//! hand's sweep passes 4 slots and the sample must meet 8 live keys before the idle
//! one — or of 16 keys (22 slots) for the key moved twice ([`TWO_IDLE`]). Which
//! slots hold which keys is searched for once a storage and shape ([`layout`]),
//! with the look counter as the test, so the models do not depend on the hand's
//! stride.
//!
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=4 CARGO_TARGET_DIR=target/loom cargo test -p floodgate --release --test loom_keyed_look`
#![cfg(loom)]

#[allow(unused_macros)] // this file runs its own models, not the shared ones
#[macro_use]
mod loom_keyed_models;
mod loom_seen;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use floodgate::{
    Fingerprint, Gcra, GcraState, Heap, Inline, KeyedBuilder, KeyedLimiter, ManualClock, Nanos,
    Policy, Storage,
};
use loom_keyed_models::{home, Placement};
use loom_seen::{Seen, Span, PLACEMENTS};

/// The shard a model runs on: its share of keys (one shard: the capacity) and how
/// many idle keys of one home the look reclaims ahead of the key it moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    share: usize,
    idle: usize,
}

/// The least shard a look can happen in: the hand's sweep passes 4 slots and the
/// sample must meet 8 live keys before the idle one.
const ONE_IDLE: Shape = Shape { share: 10, idle: 1 };

/// Two idle keys in adjacent slots, both past a sample of 8 live keys: the hand's
/// stride spreads neighbouring slots over its walk, so this needs a bigger shard.
/// The look reclaims the first, the key behind them shifts back one slot, the pass
/// looks at that slot again, reclaims the second, and the key shifts once more.
const TWO_IDLE: Shape = Shape { share: 16, idle: 2 };

impl Shape {
    /// Its slots: the share plus one empty slot per three keys (the headroom).
    fn slots(self) -> usize {
        self.share + self.share.div_ceil(3)
    }
}

type Table<St> = KeyedLimiter<u64, Gcra, ManualClock, St>;

/// A one-shard table of `share` keys, one per second, of burst `burst`.
fn table<St>(share: usize, burst: u64, clock: &ManualClock) -> Arc<Table<St>>
where
    St: Storage<u64, GcraState>,
{
    let policy = Policy::per_second(1).unwrap().with_burst(burst).unwrap();
    Arc::new(
        KeyedBuilder::new(Gcra::new(policy))
            .capacity(share)
            .shards(1)
            .clock(clock.clone())
            .build_in::<u64, St>()
            .unwrap(),
    )
}

/// Which keys a model puts where: the `idle` keys, all of one home, in that slot
/// and the next ones, `behind` (same home) in the slot after them, so that
/// unlinking each idle key shifts `behind` back one slot, and `fillers` each in
/// its own home slot. Inserting `newcomer` into the full shard makes a full look
/// that reclaims the idle keys (and nothing else).
#[derive(Clone, Debug)]
struct Layout {
    shape: Shape,
    idle: Vec<u64>,
    behind: u64,
    fillers: Vec<u64>,
    newcomer: u64,
}

impl Layout {
    /// Fills `keyed`: the idle keys charged at 0 s (idle from 1 s), `behind` and
    /// the fillers at `live_at` (live at 1 s).
    fn fill<St>(&self, keyed: &Table<St>, live_at: Nanos)
    where
        St: Storage<u64, GcraState>,
    {
        for k in &self.idle {
            assert!(keyed.check_n_at(k, Nanos::new(0), 1).is_allowed());
        }
        assert!(keyed.check_n_at(&self.behind, live_at, 1).is_allowed());
        for f in &self.fillers {
            assert!(keyed.check_n_at(f, live_at, 1).is_allowed());
        }
        assert_eq!(keyed.metrics().live_keys, self.shape.share as u64);
    }

    /// The table for this layout, of burst `burst`.
    fn table<St>(&self, burst: u64, clock: &ManualClock) -> Arc<Table<St>>
    where
        St: Storage<u64, GcraState>,
    {
        table::<St>(self.shape.share, burst, clock)
    }
}

/// The search's answers, by storage (type name) and shape.
#[allow(clippy::type_complexity)]
static LAYOUTS: Mutex<Vec<(&'static str, Shape, Layout)>> = Mutex::new(Vec::new());

/// A layout of `shape` in which the newcomer's insert makes a full look on storage
/// `St`: the idle keys in slots `p…` with the hand's sweep and the first 8 keys of
/// the sample all live. Found by trying placements (the first idle key's slot,
/// which slots stay empty, in a fixed pseudo-random order) each in a one-thread
/// model until one makes exactly one look (which reclaims).
fn layout<St>(shape: Shape) -> Layout
where
    St: Placement + Storage<u64, GcraState> + 'static,
{
    let name = std::any::type_name::<St>();
    let cached = LAYOUTS
        .lock()
        .unwrap()
        .iter()
        .find(|(n, s, _)| *n == name && *s == shape)
        .map(|(_, _, l)| l.clone());
    if let Some(found) = cached {
        return found;
    }
    let slots = shape.slots();
    let per_home = shape.idle + 1;
    // Keys by home slot, each used once.
    let mut by_home: Vec<Vec<u64>> = vec![Vec::new(); slots];
    for k in 100..50_000u64 {
        let h = home::<St>(k, slots as u64) as usize;
        if by_home[h].len() < per_home {
            by_home[h].push(k);
        }
    }
    assert!(by_home.iter().all(|keys| keys.len() == per_home));
    let mut x: u64 = 0x5EED;
    let mut next = |n: usize| {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (x >> 33) as usize % n
    };
    for _ in 0..20_000 {
        let p = next(slots);
        let cluster: Vec<usize> = (0..per_home).map(|d| (p + d) % slots).collect();
        // The slots the fillers take: every other slot but as many as stay empty.
        let mut rest: Vec<usize> = (0..slots).filter(|s| !cluster.contains(s)).collect();
        let fillers = shape.share - per_home;
        while rest.len() > fillers {
            let drop = next(rest.len());
            rest.remove(drop);
        }
        let candidate = Layout {
            shape,
            idle: by_home[p][..shape.idle].to_vec(),
            behind: by_home[p][shape.idle],
            fillers: rest.iter().map(|&s| by_home[s][0]).collect(),
            newcomer: 1,
        };
        if makes_one_look::<St>(&candidate) {
            eprintln!("{name}: {candidate:?} (the first idle key's slot {p})");
            LAYOUTS
                .lock()
                .unwrap()
                .push((name, shape, candidate.clone()));
            return candidate;
        }
    }
    panic!("no placement of {shape:?} ({slots} slots) makes a full look on {name}");
}

/// Whether inserting the newcomer into `layout` makes one full look that reclaims
/// something (one thread: one execution).
fn makes_one_look<St>(layout: &Layout) -> bool
where
    St: Storage<u64, GcraState> + 'static,
{
    let ok = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (l, o) = (layout.clone(), Arc::clone(&ok));
    loom::model(move || {
        let clock = ManualClock::starting_at(Nanos::from_secs(1));
        let keyed = l.table::<St>(1, &clock);
        l.fill(&keyed, Nanos::from_secs(1));
        assert!(keyed
            .check_n_at(&l.newcomer, Nanos::from_secs(1), 1)
            .is_allowed());
        let m = keyed.metrics();
        // A look ran only if the hand's sweep and the sample met no idle key, so it
        // found them all. Nothing more is asked (the models assert the counts): a
        // search that asked more would pick, under a mutation of the look, a layout
        // hiding it.
        let looked = keyed.full_looks() == 1 && m.reclaimed > 0;
        o.store(looked, std::sync::atomic::Ordering::Relaxed);
    });
    ok.load(std::sync::atomic::Ordering::Relaxed)
}

/// Runs one look model on storage `St`: in each execution a table of burst
/// `burst` filled as the storage's [`layout`] says (the fillers charged at
/// `live_at`), a reader thread running `read` on it while this thread inserts the
/// newcomer at 1 s (the insert that looks); then `judge` asserts what must hold of
/// the table, the reader's answer and where the reader fell against the insert (an
/// index into [`PLACEMENTS`]), and names the outcome reached (an index into
/// `outcomes`). Fails unless every outcome was reached.
fn model_the_look<St, R>(
    model: &'static str,
    outcomes: &'static [&'static str],
    shape: Shape,
    (burst, live_at): (u64, Nanos),
    read: fn(&Table<St>, &Layout) -> R,
    judge: fn(&Table<St>, &Layout, R, usize) -> usize,
) where
    St: Placement + Storage<u64, GcraState> + 'static,
    R: Send + 'static,
{
    let layout = Arc::new(layout::<St>(shape));
    let seen = Seen::new(outcomes);
    let s = seen.clone();
    loom::model(move || {
        let clock = ManualClock::starting_at(Nanos::from_secs(1));
        let keyed = layout.table::<St>(burst, &clock);
        layout.fill(&keyed, live_at);
        let (other, keys) = (Arc::clone(&keyed), Arc::clone(&layout));
        let span = Arc::new(Span::default());
        let marks = Arc::clone(&span);
        let t = loom::thread::spawn(move || {
            let before = marks.mark();
            let answer = read(&other, &keys);
            (answer, Span::placement(before, marks.mark()))
        });
        span.begin();
        let newcomer = keyed.check_n_at(&layout.newcomer, Nanos::from_secs(1), 1);
        span.end();
        let (answer, placement) = t.join().unwrap();
        assert!(newcomer.is_allowed());
        s.saw(judge(&keyed, &layout, answer, placement));
    });
    seen.assert_each(model);
}

/// A check of the key the look shifts back, racing the look: burst 2, the key
/// charged once at 1 s, checked again at 1 s by the reader. Both charges stand
/// wherever the shift was when the reader ran (a third is denied), the look evicted
/// nothing and every filler kept its charge. On `TWO_IDLE` the key is moved twice
/// by one look.
fn a_key_the_look_moves_keeps_every_charge<St>(shape: Shape)
where
    St: Placement + Storage<u64, GcraState> + 'static,
{
    model_the_look::<St, _>(
        "a_key_the_look_moves_keeps_every_charge",
        PLACEMENTS,
        shape,
        (2, Nanos::from_secs(1)),
        |keyed, layout| keyed.check_n_at(&layout.behind, Nanos::from_secs(1), 1),
        |keyed, layout, checked, placement| {
            assert!(checked.is_allowed(), "burst 2: the second charge admits");
            assert_eq!(
                checked.remaining(),
                0,
                "the first charge was lost: {checked:?}"
            );
            // Both charges stand: a third is denied until 2 s.
            let third = keyed.peek_at(&layout.behind, Nanos::from_secs(1), 1);
            assert_eq!(
                third.retry_after(),
                Some(Duration::from_secs(1)),
                "{third:?}"
            );
            let m = keyed.metrics();
            assert_eq!(keyed.full_looks(), 1);
            let idle = layout.idle.len() as u64;
            assert_eq!((m.reclaimed, m.evicted), (idle, 0), "{m:?}");
            assert_eq!(m.live_keys, (layout.shape.share as u64) - idle + 1);
            // The idle keys are gone (fresh: 2 units), every filler keeps its unit.
            for k in &layout.idle {
                assert!(keyed.peek_at(k, Nanos::from_secs(1), 2).is_allowed());
            }
            for f in &layout.fillers {
                assert!(!keyed.peek_at(f, Nanos::from_secs(1), 2).is_allowed());
            }
            placement
        },
    );
}

/// A peek of the key the look shifts back, racing the look: it was charged at 1 s
/// (burst 1), so a peek at 1 s is denied for 1 s wherever the shift was — a miss
/// while the look moves keys must not be trusted as a fresh key.
fn a_peek_of_a_key_the_look_moves_sees_its_charge<St>()
where
    St: Placement + Storage<u64, GcraState> + 'static,
{
    model_the_look::<St, _>(
        "a_peek_of_a_key_the_look_moves_sees_its_charge",
        PLACEMENTS,
        ONE_IDLE,
        (1, Nanos::from_secs(1)),
        |keyed, layout| keyed.peek_at(&layout.behind, Nanos::from_secs(1), 1),
        |keyed, _, peeked, placement| {
            assert_eq!(
                peeked.retry_after(),
                Some(Duration::from_secs(1)),
                "the peek missed a live key the look moved: {peeked:?}"
            );
            let m = keyed.metrics();
            assert_eq!(keyed.full_looks(), 1);
            assert_eq!((m.reclaimed, m.evicted), (1, 0), "{m:?}");
            placement
        },
    );
}

/// The idle key checked at 1 s while the newcomer's insert at 1 s looks: burst 1,
/// the other keys charged at ½ s (live at 1 s, ½ s from fresh: lighter than any key
/// charged at 1 s). Either the look reclaimed the idle key first and the check
/// inserted it again (evicting one of the keys charged at ½ s after a second look
/// that found nothing), or the check made it live first and the look, finding
/// nothing idle, evicted one of them. Never is the key reclaimed once live: its
/// charge stands in both orders.
fn a_key_made_live_before_the_look_is_never_reclaimed<St>()
where
    St: Placement + Storage<u64, GcraState> + 'static,
{
    model_the_look::<St, _>(
        "a_key_made_live_before_the_look_is_never_reclaimed",
        &["checked first (the look found nothing)", "the look first"],
        ONE_IDLE,
        (1, Nanos::new(500_000_000)),
        |keyed, layout| keyed.check_n_at(&layout.idle[0], Nanos::from_secs(1), 1),
        |keyed, layout, checked, _| {
            assert!(checked.is_allowed(), "idle (or fresh) at 1 s: {checked:?}");
            // The check's charge stands: denied until 2 s. A look that reclaimed the
            // key after the check made it live would leave it fresh here.
            let again = keyed.peek_at(&layout.idle[0], Nanos::from_secs(1), 1);
            assert_eq!(
                again.retry_after(),
                Some(Duration::from_secs(1)),
                "{again:?}"
            );
            // One key charged at ½ s went in either order, never the newcomer.
            let m = keyed.metrics();
            assert_eq!(m.evicted, 1, "{m:?}");
            assert_eq!(m.live_keys, layout.shape.share as u64);
            let newcomer = keyed.peek_at(&layout.newcomer, Nanos::from_secs(1), 1);
            assert_eq!(newcomer.retry_after(), Some(Duration::from_secs(1)));
            let looks = keyed.full_looks();
            if m.reclaimed == 0 {
                assert_eq!(looks, 1, "one look, which found nothing");
            } else {
                assert_eq!((m.reclaimed, looks), (1, 2), "{m:?}");
            }
            usize::from(m.reclaimed > 0)
        },
    );
}

/// The look models as `#[test]`s on storage `$storage`, in module `$name`.
macro_rules! look_models {
    ($name:ident, $storage:ty) => {
        mod $name {
            #[test]
            fn a_key_the_look_moves_keeps_every_charge() {
                super::a_key_the_look_moves_keeps_every_charge::<$storage>(super::ONE_IDLE);
            }

            #[test]
            fn a_key_the_look_moves_twice_keeps_every_charge() {
                super::a_key_the_look_moves_keeps_every_charge::<$storage>(super::TWO_IDLE);
            }

            #[test]
            fn a_peek_of_a_key_the_look_moves_sees_its_charge() {
                super::a_peek_of_a_key_the_look_moves_sees_its_charge::<$storage>();
            }

            #[test]
            fn a_key_made_live_before_the_look_is_never_reclaimed() {
                super::a_key_made_live_before_the_look_is_never_reclaimed::<$storage>();
            }
        }
    };
}

look_models!(heap, super::Heap);
look_models!(inline, super::Inline);
look_models!(fingerprint, super::Fingerprint);
