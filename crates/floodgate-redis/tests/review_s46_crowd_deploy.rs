//! A rolling deploy of the crowd records (session 46): the previous scripts
//! (`fixtures/common_s46.lua`, `fixtures/gcra_s46.lua`,
//! `fixtures/sliding_log_s46.lua`: `git show 410abd5:crates/floodgate-redis/src/lua/…`;
//! the windows' own files and the drivers did not change) and the new ones serve
//! one key in turn. The previous scripts remember 8 refunds of every key and read
//! any number on the windows and GCRA: on a key of more, written by the new ones,
//! their refund trims the records to 8 and raises the floor (a conservative
//! loss). The previous log refuses a key of more than 10 refund members as
//! malformed, so the new log still keeps 8 records besides those it prunes. No
//! state either version writes is malformed to the other, and no receipt gives
//! back twice, whichever version sends it.

mod common;

use common::s46::{
    COMMON_NOW, COMMON_S46, FIXED_WINDOW, GCRA_NOW, GCRA_S46, SLIDING_LOG_NOW, SLIDING_LOG_S46,
    SLIDING_WINDOW,
};
use common::s48::{FIXED_WINDOW_S48, SLIDING_WINDOW_S48};
use common::{charge_driver, refund_driver, RedisServer, GIVEN_TIME};
use redis::Value;

/// One version's given-time charge and refund scripts of one algorithm, and the
/// limit's two parameters (P and L; T and B).
struct Version {
    charge: String,
    refund: String,
    params: [u64; 2],
}

impl Version {
    fn of(common: &str, algorithm: &str, function: &str, params: [u64; 2]) -> Version {
        Version {
            charge: [GIVEN_TIME, common, algorithm, &charge_driver(function)].concat(),
            refund: [
                GIVEN_TIME,
                common,
                algorithm,
                &refund_driver(&format!("{function}_refund")),
            ]
            .concat(),
            params,
        }
    }
}

/// The new and the previous version of `algorithm` ("gcra", "fixed_window",
/// "sliding_window", "sliding_log"), at 100 per hour (GCRA: T = 36 s, B = 100).
fn versions(algorithm: &str) -> (Version, Version) {
    let hour = 3_600_000_000;
    let (now, before, params) = match algorithm {
        "gcra" => (GCRA_NOW, GCRA_S46, [hour / 100, 100]),
        "fixed_window" => (FIXED_WINDOW, FIXED_WINDOW_S48, [hour, 100]),
        "sliding_window" => (SLIDING_WINDOW, SLIDING_WINDOW_S48, [hour, 100]),
        _ => (SLIDING_LOG_NOW, SLIDING_LOG_S46, [hour, 100]),
    };
    (
        Version::of(COMMON_NOW, now, algorithm, params),
        Version::of(COMMON_S46, before, algorithm, params),
    )
}

/// `common::eval`, its reply (an error fails the test).
fn eval(server: &RedisServer, script: &str, key: &str, args: &[u64]) -> Value {
    common::eval(server, script, key, args).unwrap_or_else(|e| panic!("a reply: {e}"))
}

fn int(v: &Value) -> u64 {
    match v {
        Value::Int(i) => u64::try_from(*i).expect("a whole number"),
        other => panic!("not an integer: {other:?}"),
    }
}

/// A charge of 1 at `now` by `v`: its receipt's numbers (admitted).
fn charge(server: &RedisServer, v: &Version, key: &str, now: u64) -> Vec<u64> {
    let [a, b] = v.params;
    let Value::Array(items) = eval(server, &v.charge, key, &[now, 1, 1, a, b]) else {
        panic!("not a decision");
    };
    assert_eq!(int(&items[0]), 1, "admitted");
    items[5..].iter().map(int).collect()
}

/// The units left at `now` (a charge of 0).
fn left(server: &RedisServer, v: &Version, key: &str, now: u64) -> u64 {
    let [a, b] = v.params;
    let Value::Array(items) = eval(server, &v.charge, key, &[now, 0, 1, a, b]) else {
        panic!("not a decision");
    };
    int(&items[2])
}

/// A refund of `receipt` at `now` by `v`: what it gave back.
fn refund(server: &RedisServer, v: &Version, key: &str, receipt: &[u64], now: u64) -> u64 {
    let mut args = vec![now];
    args.extend_from_slice(receipt);
    if receipt.len() == 4 {
        // GCRA: T and B.
        args.extend_from_slice(&v.params);
    } else {
        // The windows and the log: P.
        args.push(v.params[0]);
    }
    int(&eval(server, &v.refund, key, &args))
}

/// 20 charges of one key by the new script (the log's: 12 at one instant, 8 a
/// microsecond apart), then refunds of every one (the first 12 by the new script,
/// the rest by either version in turn), the previous version reading the key
/// after each, then every receipt sent again by both: no reply is an
/// error, the second refunds give back nothing, the units left are the limit
/// less what was charged and not given back, and every first refund but those
/// the previous version's floor refused gave back (at least the crowd's first 9).
///
/// Mutations seen failing: the new log keeping `REFUNDS_KEPT_WIDE` records (the
/// previous log's read fails: "too many"); `window_records` returning none (a
/// window receipt gives back twice).
#[test]
fn both_versions_share_a_key_of_many_records() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let hour = 3_600_000_000u64;
    let t0 = hour * 1000 + 1_000_000;
    for algorithm in ["gcra", "fixed_window", "sliding_window", "sliding_log"] {
        let (new, old) = versions(algorithm);
        let key = format!("deploy:{algorithm}");
        let log = algorithm == "sliding_log";
        let mut receipts = Vec::new();
        for i in 0..20u64 {
            let at = if log && i >= 12 { t0 + i } else { t0 };
            receipts.push(charge(&server, &new, &key, at));
        }
        let t = t0 + 20;
        assert_eq!(left(&server, &new, &key, t), 80, "{algorithm}");
        // The crowd's first 12 by the new script alone, then the other 8 from the
        // middle out, every third by the previous one; the previous one reads
        // the key after each.
        let mut order: Vec<usize> = (12..20).collect();
        let mut shuffled: Vec<usize> = (0..12).collect();
        while !order.is_empty() {
            shuffled.push(order.remove(order.len() / 2));
        }
        let mut back = 0;
        let mut gave = 0;
        for (k, &i) in shuffled.iter().enumerate() {
            let v = if k >= 12 && k % 3 == 2 { &old } else { &new };
            let units = refund(&server, v, &key, &receipts[i], t);
            left(&server, &old, &key, t);
            assert!(
                units
                    <= if algorithm == "gcra" {
                        new.params[0]
                    } else {
                        1
                    }
            );
            if units > 0 {
                gave += 1;
            }
            back += units;
        }
        assert!(gave >= 9, "{algorithm}: {gave} refunds gave back");
        for r in &receipts {
            assert_eq!(
                refund(&server, &new, &key, r, t),
                0,
                "{algorithm}: again (new)"
            );
            assert_eq!(
                refund(&server, &old, &key, r, t),
                0,
                "{algorithm}: again (old)"
            );
        }
        // GCRA: the TAT t0 + 20 T less what came back, read at t = t0 + 20 us.
        let units_back = if algorithm == "gcra" {
            ((back + (t - t0)) / new.params[0]).min(20)
        } else {
            back
        };
        assert_eq!(left(&server, &new, &key, t), 80 + units_back, "{algorithm}");
        assert_eq!(left(&server, &old, &key, t), 80 + units_back, "{algorithm}");
    }
}
