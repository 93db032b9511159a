//! Session 43 review ("bound"): the keyed tables under hostile floods. Each test is an
//! attack on one promise of the docs — a flood of unique keys never grows a table
//! past its bound and never pushes a real key past its limit; a request that stores
//! nothing (a denial, cost 0) inserts nothing; a keyed sliding log holds at most `L`
//! entries per key — measured by the table's own counters (`metrics`, `max_keys`,
//! `entries`), never by timing. The clocks are manual and stand still, so every
//! bound below is exact, whatever the threads' interleaving.
#![cfg(not(loom))]

use std::sync::atomic::{AtomicU64, Ordering};

use floodgate::{
    Fingerprint, Gcra, GcraState, Heap, Inline, KeyedBuilder, KeyedLimiter, ManualClock, Policy,
    Storage,
};

/// Runs a test generic over the storage on each of them.
macro_rules! on_every_storage {
    ($f:ident) => {{
        $f::<Heap>();
        $f::<Inline>();
        $f::<Fingerprint>();
    }};
}

/// Threads flooding unique keys.
const THREADS: u64 = 4;
/// Unique keys per thread.
const PER_THREAD: u64 = 6_000;
/// Real keys, checked between the flood's keys.
const REAL: u64 = 4;
/// Every real key's burst (the clock stands still: nothing refills).
const BURST: u32 = 40;

fn gcra() -> Gcra {
    Gcra::new(
        Policy::per_minute(60)
            .and_then(|p| p.with_burst(u64::from(BURST)))
            .expect("a valid policy"),
    )
}

/// A table of 512 keys over 4 shards, on `clock`.
fn table<St: Storage<u64, GcraState>>(
    clock: &ManualClock,
) -> KeyedLimiter<u64, Gcra, ManualClock, St> {
    KeyedBuilder::new(gcra())
        .capacity(512)
        .shards(4)
        .clock(clock.clone())
        .build_in::<u64, St>()
        .expect("a valid table")
}

/// A keyed log of `limit` per second for `capacity` keys over `shards` shards, on a
/// clock that stands still.
fn log_of<K: std::hash::Hash + Eq + Clone>(
    capacity: usize,
    shards: usize,
    limit: u64,
) -> floodgate::KeyedSlidingLog<K, ManualClock> {
    KeyedBuilder::default()
        .capacity(capacity)
        .shards(shards)
        .clock(ManualClock::new())
        .sliding_log::<K>(Policy::per_second(limit).expect("a valid policy"))
        .expect("a valid log")
}

/// Runs `step(thread, i)` for `i` in `0..steps` on each of `THREADS` threads; a
/// step answers the real key it had admitted, if any. Returns the admissions per
/// real key.
fn flood_threads(steps: u64, step: impl Fn(u64, u64) -> Option<u64> + Sync) -> Vec<u64> {
    let admitted: Vec<AtomicU64> = (0..REAL).map(|_| AtomicU64::new(0)).collect();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (step, admitted) = (&step, &admitted);
            s.spawn(move || {
                for i in 0..steps {
                    if let Some(r) = step(t, i) {
                        admitted[r as usize].fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect()
}

/// `THREADS` threads each insert `PER_THREAD` unique keys (one unit each) into a
/// table 50 times smaller, checking a real key (`u64::MAX - r`) every 4th key. The
/// clock stands still, so each real key may be admitted exactly `BURST` times: an
/// eviction of a real key would hand it a fresh burst (more admissions). The flood's
/// keys use one unit and real keys up to `BURST`, so an eviction ranked by the
/// units in use always takes a flood key; the table never holds more than
/// `max_keys`, and every insert is accounted for (live, reclaimed or evicted).
fn flood_with_real_keys<St: Storage<u64, GcraState>>() {
    let clock = ManualClock::new();
    let limiter = table::<St>(&clock);
    let over = AtomicU64::new(0);
    let counts = flood_threads(PER_THREAD, |t, i| {
        let key = t * PER_THREAD + i;
        assert!(
            limiter.check(&key).is_allowed(),
            "a fresh key has its burst"
        );
        // Sampled while the flood runs, not only after it.
        if i % 512 == 0 {
            let live = limiter.metrics().live_keys as usize;
            if live > limiter.max_keys() {
                over.fetch_max(live as u64, Ordering::Relaxed);
            }
        }
        let r = (i / 4 + t) % REAL;
        (i % 4 == 0 && limiter.check(&(u64::MAX - r)).is_allowed()).then_some(r)
    });
    assert_eq!(
        counts,
        vec![u64::from(BURST); REAL as usize],
        "each real key: exactly its burst, never a second one from an eviction"
    );
    assert_eq!(over.load(Ordering::Relaxed), 0, "a sample above max_keys");
    let m = limiter.metrics();
    assert!(m.live_keys as usize <= limiter.max_keys(), "{m:?}");
    assert!(m.evicted > 0, "the flood filled the table: {m:?}");
    assert_eq!(
        m.live_keys + m.reclaimed + m.evicted,
        THREADS * PER_THREAD + REAL,
        "every insert is live, reclaimed or evicted: {m:?}"
    );
    for r in 0..REAL {
        assert_eq!(
            limiter.peek(&(u64::MAX - r), 0).remaining(),
            0,
            "real key {r}"
        );
    }
}

#[test]
#[cfg_attr(miri, ignore)]
fn a_threaded_flood_of_unique_keys_never_gives_a_real_key_a_second_burst_on_heap() {
    flood_with_real_keys::<Heap>();
}

#[test]
#[cfg_attr(miri, ignore)]
fn a_threaded_flood_of_unique_keys_never_gives_a_real_key_a_second_burst_inline() {
    flood_with_real_keys::<Inline>();
}

#[test]
#[cfg_attr(miri, ignore)]
fn a_threaded_flood_of_unique_keys_never_gives_a_real_key_a_second_burst_on_fingerprints() {
    flood_with_real_keys::<Fingerprint>();
}

/// Requests that store nothing — denials (a cost above the burst, or a key's request
/// after its burst) and cost-0 checks — for unique keys from several threads: the
/// table stays empty but for the keys that were admitted something.
fn nothing_stored_inserts_nothing<St: Storage<u64, GcraState>>() {
    let clock = ManualClock::new();
    let limiter = table::<St>(&clock);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let limiter = &limiter;
            s.spawn(move || {
                for i in 0..PER_THREAD {
                    let key = t * PER_THREAD + i;
                    assert!(!limiter.check_n(&key, BURST + 1).is_allowed());
                    assert!(limiter.check_n(&key, 0).is_allowed());
                    let _ = limiter.peek(&key, 1);
                }
            });
        }
    });
    let m = limiter.metrics();
    assert_eq!(
        m.live_keys, 0,
        "nothing was stored, so nothing was inserted: {m:?}"
    );
    assert_eq!((m.evicted, m.reclaimed), (0, 0), "{m:?}");
    // A real key is then admitted its whole burst: the flood charged no one.
    let real = u64::MAX;
    let admitted = (0..2 * BURST)
        .filter(|_| limiter.check(&real).is_allowed())
        .count();
    assert_eq!(admitted, BURST as usize);
}

#[test]
#[cfg_attr(miri, ignore)]
fn denied_and_cost_zero_floods_of_unique_keys_insert_nothing_on_any_storage() {
    on_every_storage!(nothing_stored_inserts_nothing);
}

/// The keyed sliding log under a threaded flood of unique `String` keys (one unit
/// each) while real keys are checked: at most `max_keys` logs, at most `L` entries
/// per log (so `entries() ≤ L × max_keys`), and each real key admitted exactly `L`
/// times (the clock stands still: nothing expires, an eviction would forgive).
#[test]
#[cfg_attr(miri, ignore)]
fn a_threaded_flood_of_unique_keys_keeps_the_keyed_log_within_l_entries_per_key() {
    const L: u64 = 5;
    let log = log_of::<String>(256, 4, L);
    let counts = flood_threads(PER_THREAD / 4, |t, i| {
        assert!(log.check(format!("flood-{t}-{i}").as_str()).is_allowed());
        // Cost 0 and denials log nothing, for a new key or a known one.
        assert!(log
            .check_n(format!("zero-{t}-{i}").as_str(), 0)
            .is_allowed());
        assert!(!log
            .check_n(format!("over-{t}-{i}").as_str(), 6)
            .is_allowed());
        let r = (i + t) % REAL;
        let real = format!("real-{r}");
        assert!(log.check_n(real.as_str(), 0).is_allowed());
        log.check(real.as_str()).is_allowed().then_some(r)
    });
    assert_eq!(counts, vec![L; REAL as usize]);
    let m = log.metrics();
    assert!(m.live_keys as usize <= log.max_keys(), "{m:?}");
    assert!(m.evicted > 0, "the flood filled the table: {m:?}");
    // Only the keys that logged a unit were ever inserted (not the cost-0 nor the
    // denied ones): each is live, reclaimed or evicted.
    assert_eq!(
        m.live_keys + m.reclaimed + m.evicted,
        PER_THREAD + REAL,
        "{m:?}"
    );
    assert!(
        log.entries() <= L as usize * log.max_keys(),
        "{} entries for at most {} keys",
        log.entries(),
        log.max_keys()
    );
    // Every log holds at most one entry per instant, and the clock stood still.
    assert!(
        log.entries() <= m.live_keys as usize,
        "{} entries",
        log.entries()
    );
}

/// One key of a keyed log hit at ever later instants (every 250 ms, a period of 1 s,
/// `L` = 3), by requests of every cost (0, a unit, a denial above the limit): after
/// every request its log holds at most `L` entries, however long it runs — an entry
/// leaves at the first admission at or past `its instant + P` (a unit admitted at `t`
/// counts while `now < t + P`), so the admission at 1.25 s finds the 0.25 s one gone.
#[test]
fn one_keys_log_never_holds_more_than_l_entries_however_long_it_is_hit() {
    const L: u64 = 3;
    let clock = ManualClock::new();
    let log = KeyedBuilder::default()
        .clock(clock.clone())
        .sliding_log::<String>(Policy::per_second(L).expect("a valid policy"))
        .expect("a valid log");
    let mut admitted = 0;
    for step in 0..400u32 {
        clock.advance(std::time::Duration::from_millis(250));
        assert!(log.check_n("k", 0).is_allowed());
        if log.check("k").is_allowed() {
            admitted += 1;
        }
        assert!(!log.check_n("k", 4).is_allowed());
        assert!(
            log.entries() <= L as usize,
            "step {step}: {} entries",
            log.entries()
        );
    }
    // 100 s at 3 per second: every period its limit, from the first instant on.
    assert_eq!(admitted, 300);
}

/// A `HotKeyLimiter` flooded by threads with unique cold keys (a table of 64 keys:
/// every cold key stays booked, so inserts evict) while each thread also hits one
/// promoted key and one real cold key. The clock stands still: the cold real key is
/// admitted exactly its burst; the hot key at most its burst (its leases are carved
/// from it) and at least the burst less the units stranded on other threads' leases;
/// it stays hot — a sealed word ranks last in every eviction sample.
fn hot_key_under_a_threaded_flood<St: Storage<u64, GcraState>>() {
    const HOT: u64 = u64::MAX;
    const COLD: u64 = u64::MAX - 1;
    const LEASE: u32 = 2;
    let clock = ManualClock::starting_at(floodgate::Nanos::from_secs(1_000));
    let limiter: floodgate::HotKeyLimiter<u64, ManualClock, St> = floodgate::HotKeyLimiter::new_in(
        Policy::per_minute(60)
            .and_then(|p| p.with_burst(u64::from(BURST)))
            .expect("a valid policy"),
        KeyedBuilder::default()
            .capacity(64)
            .shards(2)
            .clock(clock.clone()),
        floodgate::HotKeys::default()
            .manual()
            .lease_shards(THREADS as usize)
            .lease_size(LEASE),
    )
    .expect("a valid limiter");
    assert!(limiter.promote(&HOT));
    let (hot, cold) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (limiter, hot, cold) = (&limiter, &hot, &cold);
            s.spawn(move || {
                for i in 0..PER_THREAD / 4 {
                    assert!(limiter.check(&(t * PER_THREAD + i)).is_allowed());
                    if limiter.check(&HOT).is_allowed() {
                        hot.fetch_add(1, Ordering::Relaxed);
                    }
                    if limiter.check(&COLD).is_allowed() {
                        cold.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let m = limiter.metrics();
    assert!(m.evicted > 0, "the flood filled the table: {m:?}");
    // The same table's bound, from a twin built alike.
    let max_keys = KeyedBuilder::new(gcra())
        .capacity(64)
        .shards(2)
        .build_in::<u64, St>()
        .expect("a valid table")
        .max_keys();
    assert!(
        m.live_keys as usize <= max_keys,
        "{m:?}, max_keys {max_keys}"
    );
    assert_eq!(cold.load(Ordering::Relaxed), u64::from(BURST), "{m:?}");
    let hot = hot.load(Ordering::Relaxed);
    let stranded = THREADS * u64::from(LEASE);
    assert!(
        hot <= u64::from(BURST) && hot + stranded >= u64::from(BURST),
        "hot key admitted {hot}"
    );
    assert!(
        limiter.is_hot(&HOT),
        "a sealed word is never an eviction's victim"
    );
}

#[test]
#[cfg_attr(miri, ignore)]
fn a_hot_key_keeps_its_bound_and_its_seal_under_a_threaded_flood_on_every_storage() {
    on_every_storage!(hot_key_under_a_threaded_flood);
}

/// A plan limiter (a GCRA table per plan) flooded by threads with unique `free`
/// keys while real `pro` keys are checked: each pro key is admitted exactly the pro
/// burst (the clock stands still), the free table evicts within its own bound, and
/// the pro table holds only the real keys — a flood of one plan never touches
/// another plan's table.
#[test]
#[cfg_attr(miri, ignore)]
fn a_threaded_flood_of_one_plans_unique_keys_never_reaches_another_plans_keys() {
    use floodgate::keyed::plans::{PlanLimiter, Plans};
    let mut plans = Plans::new();
    let policy = |limit: u64, burst: u64| {
        Policy::per_day(limit)
            .and_then(|p| p.with_burst(burst))
            .expect("a valid policy")
    };
    let free = plans.insert("free", policy(100, 10));
    let pro = plans.insert("pro", policy(10_000, u64::from(BURST)));
    let clock = ManualClock::new();
    let limiter = PlanLimiter::new(
        &plans,
        move |key: &u64| if *key >= u64::MAX - REAL { pro } else { free },
        KeyedBuilder::default()
            .capacity(256)
            .shards(2)
            .clock(clock.clone()),
    )
    .expect("a valid plan limiter");
    let counts = flood_threads(PER_THREAD / 2, |t, i| {
        assert!(limiter.check(&(t * PER_THREAD + i)).is_allowed());
        let r = (i + t) % REAL;
        limiter.check(&(u64::MAX - r)).is_allowed().then_some(r)
    });
    assert_eq!(counts, vec![u64::from(BURST); REAL as usize]);
    let (f, p) = (limiter.table(free), limiter.table(pro));
    let (fm, pm) = (f.metrics(), p.metrics());
    assert!(fm.evicted > 0, "the flood filled the free table: {fm:?}");
    assert!(fm.live_keys as usize <= f.max_keys(), "{fm:?}");
    assert_eq!(
        (pm.live_keys, pm.evicted, pm.reclaimed),
        (REAL, 0, 0),
        "{pm:?}"
    );
}

/// The keyed log's eviction must rank keys from all over a shard, not always the
/// same few: a quarter of a full table are real keys that have used their whole
/// limit, the rest a flood of unique keys using one unit each. Every eviction has
/// lighter keys to take, so no real key may be evicted — an evicted log forgets its
/// units, and its key is admitted `L` more (a login limit bypassed by flooding other
/// names). Before session 43 the sample was always the map's first 8 entries: once
/// the flood's keys there were gone, every insert evicted a real key, admitted up to
/// 1 663 times against a limit of 5.
#[test]
fn a_keyed_log_never_evicts_a_full_key_while_a_lighter_one_is_held() {
    const L: u64 = 5;
    let log = log_of::<u64>(64, 1, L);
    let real = 16u64;
    let mut admitted = vec![0u64; real as usize];
    for i in 0..20_000u64 {
        assert!(log.check(&(1_000 + i)).is_allowed());
        let r = i % real;
        if log.check(&r).is_allowed() {
            admitted[r as usize] += 1;
        }
    }
    assert_eq!(admitted, vec![L; real as usize]);
    let m = log.metrics();
    assert_eq!(m.live_keys + m.evicted, 20_000 + real, "{m:?}");
}

/// A key ranked light at a sweep and charged to its limit before its turn comes is
/// passed over: the next eviction takes a key that is light now (here the one new
/// key), never the key that has since used its limit.
#[test]
fn a_keyed_log_passes_over_a_ranked_key_charged_since() {
    const L: u32 = 5;
    let log = log_of::<u64>(64, 1, u64::from(L));
    // A full shard of one-unit keys; the next insert ranks them and evicts one.
    for key in 0..64u64 {
        assert!(log.check(&key).is_allowed());
    }
    assert!(log.check(&100).is_allowed());
    // Every key left uses its whole limit now, the ranked ones included (a key
    // still held has one unit counting; the evicted one would start afresh).
    let held: Vec<u64> = (0..64u64)
        .filter(|key| log.peek(key, 0).remaining() == u64::from(L - 1))
        .collect();
    assert_eq!(held.len(), 63, "one key was evicted for key 100");
    for key in &held {
        assert!(log.check_n(key, L - 1).is_allowed());
    }
    // One more insert: only key 100 is lighter than the limit.
    assert!(log.check(&101).is_allowed());
    for key in &held {
        assert!(!log.check(key).is_allowed(), "key {key} was evicted");
    }
    assert_eq!(
        log.peek(&100, 0).remaining(),
        u64::from(L),
        "key 100 was evicted"
    );
}
