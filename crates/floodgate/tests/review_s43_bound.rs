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
    let admitted: Vec<AtomicU64> = (0..REAL).map(|_| AtomicU64::new(0)).collect();
    let over = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (limiter, admitted, over) = (&limiter, &admitted, &over);
            s.spawn(move || {
                for i in 0..PER_THREAD {
                    let key = t * PER_THREAD + i;
                    assert!(
                        limiter.check(&key).is_allowed(),
                        "a fresh key has its burst"
                    );
                    if i % 4 == 0 {
                        let r = (i / 4 + t) % REAL;
                        if limiter.check(&(u64::MAX - r)).is_allowed() {
                            admitted[r as usize].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    // Sampled while the flood runs, not only after it.
                    if i % 512 == 0 {
                        let live = limiter.metrics().live_keys as usize;
                        if live > limiter.max_keys() {
                            over.fetch_max(live as u64, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    let counts: Vec<u64> = admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect();
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
    nothing_stored_inserts_nothing::<Heap>();
    nothing_stored_inserts_nothing::<Inline>();
    nothing_stored_inserts_nothing::<Fingerprint>();
}

/// The keyed sliding log under a threaded flood of unique `String` keys (one unit
/// each) while real keys are checked: at most `max_keys` logs, at most `L` entries
/// per log (so `entries() ≤ L × max_keys`), and each real key admitted exactly `L`
/// times (the clock stands still: nothing expires, an eviction would forgive).
#[test]
#[cfg_attr(miri, ignore)]
fn a_threaded_flood_of_unique_keys_keeps_the_keyed_log_within_l_entries_per_key() {
    const L: u64 = 5;
    let clock = ManualClock::new();
    let log = KeyedBuilder::default()
        .capacity(256)
        .shards(4)
        .clock(clock.clone())
        .sliding_log::<String>(Policy::per_second(L).expect("a valid policy"))
        .expect("a valid log");
    let admitted: Vec<AtomicU64> = (0..REAL).map(|_| AtomicU64::new(0)).collect();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (log, admitted) = (&log, &admitted);
            s.spawn(move || {
                for i in 0..PER_THREAD / 4 {
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
                    if log.check(real.as_str()).is_allowed() {
                        admitted[r as usize].fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let counts: Vec<u64> = admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect();
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
