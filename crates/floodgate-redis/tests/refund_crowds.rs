//! Crowds of refunds on one key (session 46): a crowd of charges of one key made
//! before any of its refunds notes one ledger, and a key that forgot one of the
//! crowd's refunds raised its floor past every other. The windows remember the
//! refunds of their current window up to 64, GCRA up to its burst (8 to 64), and
//! the sliding log forgets the refunds of receipts that can give back nothing
//! again (no member left at their instant, an instant no charge logs at again):
//! a crowd turned away gets its budget back in any order, and no receipt gives
//! back twice however many records were pruned or dropped since its refund.

mod common;

use common::{runtime, with_refunds, RedisServer};
use floodgate::Policy;
use floodgate_redis::{Algorithm, RedisLimiter, RedisReceipt};

/// The units `key` has left at `t` (a peek of 0).
async fn left(l: &RedisLimiter, key: &str, t: u64) -> u64 {
    l.peek_n_at_micros(key, 0, t).await.unwrap().remaining()
}

/// `n` charges of 1 on `key`, the i-th at `t0 + i * step` (all admitted): their
/// receipts.
async fn crowd(l: &RedisLimiter, key: &str, n: u64, t0: u64, step: u64) -> Vec<RedisReceipt> {
    let mut receipts = Vec::new();
    for i in 0..n {
        let (d, r) = l.charge_n_at_micros(key, 1, t0 + i * step).await.unwrap();
        assert!(d.is_allowed(), "charge {i}");
        receipts.push(r.expect("a receipt"));
    }
    receipts
}

/// The receipts in the order a crowd's refunds may land: from the middle out.
fn shuffled(mut receipts: Vec<RedisReceipt>) -> Vec<RedisReceipt> {
    let mut out = Vec::new();
    while !receipts.is_empty() {
        out.push(receipts.remove(receipts.len() / 2));
    }
    out
}

/// Twelve charges of one key at once (one reading: GCRA and the windows; twelve
/// readings a microsecond apart: the log), all refunded, from the middle out
/// (GCRA latest booking first): the whole limit of 20 is back on every algorithm.
///
/// Mutations seen failing: `REFUNDS_KEPT_WIDE` not passed in `window_refund` (the
/// windows keep 8: 17 left); `gcra_kept` returning `REFUNDS_KEPT` (17 left); the
/// log's records never pruned (`live` every record: 17 left).
#[test]
fn a_crowd_of_twelve_refunded_in_any_order_gets_the_whole_limit_back() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let t0 = 3_600_000_000 * 1000 + 1_000_000;
    for (algorithm, policy, step) in [
        (Algorithm::Gcra, Policy::per_hour(20).unwrap(), 0),
        (Algorithm::FixedWindow, Policy::per_hour(20).unwrap(), 0),
        (Algorithm::SlidingWindow, Policy::per_hour(20).unwrap(), 0),
        (Algorithm::SlidingLog, Policy::per_hour(20).unwrap(), 1),
    ] {
        let l = with_refunds(&rt, &server, common::builder(algorithm, policy), true);
        rt.block_on(async {
            let key = &format!("crowd-{algorithm:?}");
            let receipts = crowd(&l, key, 12, t0, step).await;
            let t = t0 + 12 * step;
            assert_eq!(left(&l, key, t).await, 8, "{algorithm:?}");
            // GCRA latest booking first (exact in process too: a refund of a later
            // booking first may move an earlier one, which its shift then bounds).
            let order = match algorithm {
                Algorithm::Gcra => receipts.into_iter().rev().collect(),
                _ => shuffled(receipts),
            };
            for r in order {
                assert!(l.refund_at_micros(&r, t).await.unwrap(), "{algorithm:?}");
            }
            assert_eq!(left(&l, key, t).await, 20, "{algorithm:?}");
        });
    }
}

/// Sixty charges of one key at one reading (a limit of 100; the log's a
/// microsecond apart), all refunded, then 30 more charged and refunded: 90
/// refunds, each giving back (charge order: exact on GCRA at one reading); the
/// windows and GCRA (burst 100: 64 remembered) dropped 26 records of the first
/// crowd, raising the floor past its ledger, and the log pruned nearly all of its.
/// After 30 more charges no receipt gives back again, and the units left stay 70.
///
/// Mutations seen failing: the floor check left out of `refundable` (`noted <
/// floor` never refuses: a dropped record's receipt gives back again, fixed
/// window); `window_records` returning none (the window's receipt 0 again); the
/// log's records never pruned (its crowd's refunds refused past 9).
#[test]
fn a_receipt_refunded_once_never_gives_back_again_however_many_records_went() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let t0 = 3_600_000_000 * 1000 + 1_000_000;
    for (algorithm, step) in [
        (Algorithm::Gcra, 0),
        (Algorithm::FixedWindow, 0),
        (Algorithm::SlidingWindow, 0),
        (Algorithm::SlidingLog, 1),
    ] {
        let policy = Policy::per_hour(100).unwrap();
        let l = with_refunds(&rt, &server, common::builder(algorithm, policy), true);
        rt.block_on(async {
            let key = &format!("many-{algorithm:?}");
            let mut receipts = crowd(&l, key, 60, t0, step).await;
            let t = t0 + 60 * step;
            for r in &receipts {
                assert!(l.refund_at_micros(r, t).await.unwrap(), "{algorithm:?}");
            }
            let second = crowd(&l, key, 30, t, step).await;
            let t = t + 30 * step;
            for r in &second {
                assert!(l.refund_at_micros(r, t).await.unwrap(), "{algorithm:?}");
            }
            receipts.extend(second);
            assert_eq!(left(&l, key, t).await, 100, "{algorithm:?}");
            // Thirty more charges: units a second refund could take.
            let _more = crowd(&l, key, 30, t, step).await;
            let t = t + 30 * step;
            assert_eq!(left(&l, key, t).await, 70, "{algorithm:?}");
            for (i, r) in receipts.iter().enumerate() {
                assert!(
                    !l.refund_at_micros(r, t).await.unwrap(),
                    "{algorithm:?}: receipt {i} again"
                );
            }
            assert_eq!(left(&l, key, t).await, 70, "{algorithm:?}");
        });
    }
}

/// The log keeps the record of a receipt whose instant still holds units of
/// another charge at that instant (units at one instant are interchangeable):
/// three charges at 1 s, one at 2 s; the first two refunded (the second's refund,
/// at the same instant, prunes the records), then the one at 2 s (which prunes
/// them again): the first two sent again take nothing of the third's unit.
///
/// Mutations seen failing: the pruning's member check left out (`rx >= logged`
/// alone: every record before `logged` forgotten); the refund's own instant taken
/// as emptied (`if rx == x then holds = false end`).
#[test]
fn a_log_record_is_kept_while_its_instant_holds_units() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let policy = Policy::per_hour(10).unwrap();
    let l = with_refunds(
        &rt,
        &server,
        common::builder(Algorithm::SlidingLog, policy),
        true,
    );
    rt.block_on(async {
        let key = "shared";
        let a = crowd(&l, key, 3, 1_000_000, 0).await;
        let b = crowd(&l, key, 1, 2_000_000, 0).await;
        assert!(l.refund_at_micros(&a[0], 2_000_000).await.unwrap());
        assert!(l.refund_at_micros(&a[1], 2_000_000).await.unwrap());
        assert!(!l.refund_at_micros(&a[0], 2_000_000).await.unwrap());
        assert!(l.refund_at_micros(&b[0], 2_000_000).await.unwrap());
        assert_eq!(left(&l, key, 2_000_000).await, 9);
        assert!(!l.refund_at_micros(&a[0], 2_000_000).await.unwrap());
        assert!(!l.refund_at_micros(&a[1], 2_000_000).await.unwrap());
        assert_eq!(left(&l, key, 2_000_000).await, 9);
    });
}

/// The log keeps the record of a receipt at the latest instant a unit was logged
/// at, though no member is left there: a later charge at an earlier reading logs
/// there (no earlier than that instant). A charge at 1 s, one at 2 s; the one at 2 s
/// refunded (its member gone, `logged` 2 s), then the one at 1 s (whose refund
/// prunes the records); a charge read at 1.5 s logs at 2 s: the receipt of 2 s sent
/// again takes nothing of it.
///
/// Mutation seen failing: the pruning's `rx >= logged` left out (the record at 2 s
/// forgotten: the second refund takes the new charge's unit).
#[test]
fn a_log_record_at_the_latest_logged_instant_is_kept() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let policy = Policy::per_hour(10).unwrap();
    let l = with_refunds(
        &rt,
        &server,
        common::builder(Algorithm::SlidingLog, policy),
        true,
    );
    rt.block_on(async {
        let key = "latest";
        let a = crowd(&l, key, 1, 1_000_000, 0).await;
        let b = crowd(&l, key, 1, 2_000_000, 0).await;
        assert!(l.refund_at_micros(&b[0], 2_000_000).await.unwrap());
        assert!(l.refund_at_micros(&a[0], 2_000_000).await.unwrap());
        let _c = crowd(&l, key, 1, 1_500_000, 0).await;
        assert_eq!(left(&l, key, 2_000_000).await, 9);
        assert!(!l.refund_at_micros(&b[0], 2_000_000).await.unwrap());
        assert_eq!(left(&l, key, 2_000_000).await, 9);
    });
}

/// A window forgets the records of its older windows without raising the floor:
/// 60 charges in one hour's window refunded (60 remembered), then two windows on
/// 12 charges all refunded from the middle out: every one comes back, the state
/// keeps the 12 records of its window alone, and no receipt of either window
/// gives back again.
///
/// Mutations seen failing: `window_records` returning every record (the state
/// keeps 64 records: 52 of the older window); `window_records` returning none (the new window's receipts
/// give back twice).
#[test]
fn a_window_forgets_the_records_of_its_older_windows() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let hour = 3_600_000_000;
    let t0 = hour * 1000 + 1_000_000;
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let policy = Policy::per_hour(100).unwrap();
        let l = with_refunds(&rt, &server, common::builder(algorithm, policy), true);
        let redis_key = l.redis_keys(&format!("windows-{algorithm:?}")).remove(0);
        rt.block_on(async {
            let key = &format!("windows-{algorithm:?}");
            let old = crowd(&l, key, 60, t0, 0).await;
            for r in &old {
                assert!(l.refund_at_micros(r, t0).await.unwrap(), "{algorithm:?}");
            }
            // Two windows on: the sliding window's previous count is 0.
            let t1 = t0 + 2 * hour;
            let new = crowd(&l, key, 12, t1, 0).await;
            assert_eq!(left(&l, key, t1).await, 88, "{algorithm:?}");
            for r in shuffled(new.clone()) {
                assert!(l.refund_at_micros(&r, t1).await.unwrap(), "{algorithm:?}");
            }
            assert_eq!(left(&l, key, t1).await, 100, "{algorithm:?}");
            let _more = crowd(&l, key, 20, t1, 0).await;
            for r in old.iter().chain(&new) {
                assert!(!l.refund_at_micros(r, t1).await.unwrap(), "{algorithm:?}");
            }
            assert_eq!(left(&l, key, t1).await, 80, "{algorithm:?}");
        });
        let state: String = server.cmd(&["GET", &redis_key]);
        let records = state.rsplit(':').next().unwrap();
        assert_eq!(records.split(',').count(), 12, "{algorithm:?}: {state}");
    }
}

/// A key at the cap: 100 charges at one reading, 64 refunded, then 10 more
/// charged and refunded (latest first; GCRA's each followed by its note): a window
/// keeps 64 records, GCRA (burst 100) 64 receipts and a note each; each state's length is within the bound its
/// numbers give (every number below 2^53: at most 16 digits; a window record 4 of
/// them, a GCRA receipt 2, a note 4, the fields before the records 6). `MEMORY
/// USAGE` is printed (`--nocapture`), not asserted (it depends on the allocator).
///
/// Mutations seen failing: `REFUNDS_KEPT_WIDE` raised to 65 (65 records);
/// `gcra_kept` without its cap (`B`: 74 receipts).
#[test]
fn a_key_at_the_cap_holds_64_records_within_their_bound() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let t0 = 3_600_000_000 * 1000 + 1_000_000;
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::Gcra,
    ] {
        let policy = Policy::per_hour(100).unwrap();
        let l = with_refunds(&rt, &server, common::builder(algorithm, policy), true);
        let key = format!("cap-{algorithm:?}");
        let redis_key = l.redis_keys(&key).remove(0);
        rt.block_on(async {
            let mut receipts = crowd(&l, &key, 100, t0, 0).await;
            receipts.reverse();
            for r in &receipts[..64] {
                assert!(l.refund_at_micros(r, t0).await.unwrap(), "{algorithm:?}");
            }
            // Ten more at a later ledger, refunded: ten records of the first
            // crowd dropped (the floor past its ledger).
            let mut more = crowd(&l, &key, 10, t0, 0).await;
            more.reverse();
            for r in &more {
                assert!(l.refund_at_micros(r, t0).await.unwrap(), "{algorithm:?}");
            }
        });
        let state: String = server.cmd(&["GET", &redis_key]);
        let records: Vec<&str> = state.rsplit(':').next().unwrap().split(',').collect();
        let (receipts, notes) = match algorithm {
            Algorithm::Gcra => {
                let notes = records.iter().filter(|r| r.starts_with("0/1/")).count();
                let reading = records.iter().filter(|r| r.starts_with("0/0/")).count();
                (records.len() - notes - reading, notes)
            }
            _ => (records.len(), 0),
        };
        assert_eq!(receipts, 64, "{algorithm:?}");
        let per_receipt = if algorithm == Algorithm::Gcra {
            2 * 17
        } else {
            4 * 17
        };
        let bound = 6 * 17 + 17 + 64 * per_receipt + notes * 4 * 17;
        assert!(
            state.len() <= bound,
            "{algorithm:?}: {} > {bound}",
            state.len()
        );
        let bytes: u64 = server.cmd(&["MEMORY", "USAGE", &redis_key]);
        eprintln!(
            "{algorithm:?} at the cap: {receipts} receipts, {notes} notes, {} bytes of state, MEMORY USAGE {bytes}",
            state.len()
        );
    }
}

/// A sliding log's crowd of 20 charges at one instant (a limit of 100), all
/// refunded: with `wide_log_refunds` every refund gives back and the whole limit
/// returns, on one limit and on a log beside a fixed window (the multi-limit
/// refund runs the same log refund); with the option off the 9th refund forgets
/// the first record and raises the floor past the crowd's ledger, so the log
/// gives 9 back and 89 units are left (the documented loss the option ends).
///
/// Mutation seen failing: the log's refund keeping `REFUNDS_KEPT` whatever
/// `WIDE_LOG` says (9 give back with the option on).
#[test]
fn a_log_crowd_at_one_instant_gives_all_back_with_wide_log_refunds() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let t0 = 3_600_000_000 * 1000 + 1_000_000;
    let policy = Policy::per_hour(100).unwrap();
    for (wide, multi) in [(true, false), (true, true), (false, false), (false, true)] {
        let mut builder = common::builder(Algorithm::SlidingLog, policy);
        if multi {
            builder = builder.and(Algorithm::FixedWindow, Policy::per_hour(1000).unwrap());
        }
        let builder = builder.wide_log_refunds(wide);
        let l = with_refunds(&rt, &server, builder, true);
        rt.block_on(async {
            let key = &format!("one-instant-{wide}-{multi}");
            let receipts = crowd(&l, key, 20, t0, 0).await;
            let mut back = 0;
            for r in shuffled(receipts) {
                back += u64::from(l.refund_at_micros(&r, t0).await.unwrap());
            }
            // A multi-limit refund answers `true` when any part gave back (the
            // window's does, 64 records kept): the log's part shows in what is left
            // (the tightest limit's units).
            let given = if wide || multi { 20 } else { 9 };
            let left_now = if wide { 100 } else { 89 };
            assert_eq!(back, given, "wide {wide}, multi {multi}");
            assert_eq!(
                left(&l, key, t0).await,
                left_now,
                "wide {wide}, multi {multi}"
            );
        });
    }
}
