//! The sliding log's reader limit apart from its writer's (session 47, step 1 of
//! raising how many refund records a log keeps): the new script reads a key of up
//! to 64 records (`LOG_REFUNDS_READ`, `common.lua`) and still writes at most 8
//! (`REFUNDS_KEPT`), so a key it writes reads under the previous scripts
//! (`fixtures/sliding_log_s46.lua`, and `fixtures/sliding_log_s47.lua` with
//! `fixtures/common_s47.lua`: `git show 69ea949:crates/floodgate-redis/src/lua/…`),
//! and a key a later version writes with more records (step 2: the builder's
//! `wide_log_refunds`, session 54) reads under it.
//! Those keys are planted here member by member, in the form the script writes:
//! `plant` is checked against the script's own members first.

mod common;

use common::s46::{COMMON_NOW, COMMON_S46, SLIDING_LOG_NOW, SLIDING_LOG_S46};
use common::s47::{COMMON_S47, SLIDING_LOG_S47};
use common::{charge_driver, members, refund_driver, RedisServer, GIVEN_TIME};
use redis::Value;

/// An hour, in microseconds: the period P of every log here (limit 100).
const HOUR: u64 = 3_600_000_000;
const LIMIT: u64 = 100;
/// The crowd's instant.
const T0: u64 = HOUR * 1000 + 1_000_000;

/// One version's given-time charge and refund scripts of the log.
struct Version {
    charge: String,
    refund: String,
}

fn version(common: &str, log: &str) -> Version {
    Version {
        charge: [GIVEN_TIME, common, log, &charge_driver("sliding_log")].concat(),
        refund: [
            GIVEN_TIME,
            common,
            log,
            &refund_driver("sliding_log_refund"),
        ]
        .concat(),
    }
}

fn new() -> Version {
    version(COMMON_NOW, SLIDING_LOG_NOW)
}

/// The new script with `wide_log_refunds` on (step 2: the log's refund keeps 64
/// records).
fn wide() -> Version {
    let flag = "local WIDE_LOG = true\n";
    let given_time = GIVEN_TIME.replace("local WIDE_LOG = false\n", flag);
    assert!(given_time.contains(flag));
    let v = version(COMMON_NOW, SLIDING_LOG_NOW);
    Version {
        charge: v.charge.replacen(GIVEN_TIME, &given_time, 1),
        refund: v.refund.replacen(GIVEN_TIME, &given_time, 1),
    }
}

/// The previous versions: session 46's and the one before session 47's change.
fn previous() -> [(&'static str, Version); 2] {
    [
        ("s46", version(COMMON_S46, SLIDING_LOG_S46)),
        ("s47", version(COMMON_S47, SLIDING_LOG_S47)),
    ]
}

fn int(v: &Value) -> u64 {
    match v {
        Value::Int(i) => u64::try_from(*i).expect("a whole number"),
        other => panic!("not an integer: {other:?}"),
    }
}

/// A charge of 1 at `T0` by `v`: its receipt (instant, units, total, noted,
/// incarnation); admitted.
fn charge(server: &RedisServer, v: &Version, key: &str) -> Vec<u64> {
    let reply = common::eval(server, &v.charge, key, &[T0, 1, 1, HOUR, LIMIT]);
    let Ok(Value::Array(items)) = reply else {
        panic!("not a decision: {reply:?}");
    };
    assert_eq!(int(&items[0]), 1, "admitted");
    items[5..].iter().map(int).collect()
}

/// The units left at `T0` (a charge of 0), or the error.
fn left(server: &RedisServer, v: &Version, key: &str) -> Result<u64, String> {
    match common::eval(server, &v.charge, key, &[T0, 0, 1, HOUR, LIMIT]) {
        Ok(Value::Array(items)) => Ok(int(&items[2])),
        Ok(other) => panic!("not a decision: {other:?}"),
        Err(e) => Err(e.to_string()),
    }
}

/// A refund of `receipt` at `T0` by `v`: what it gave back, or the error.
fn refund(server: &RedisServer, v: &Version, key: &str, receipt: &[u64]) -> Result<u64, String> {
    let mut args = vec![T0];
    args.extend_from_slice(receipt);
    args.push(HOUR);
    common::eval(server, &v.refund, key, &args)
        .map(|v| int(&v))
        .map_err(|e| e.to_string())
}

/// The members at -inf.
fn refund_members(server: &RedisServer, key: &str) -> usize {
    members(server, key)
        .iter()
        .filter(|(_, s)| s == "-inf")
        .count()
}

/// A Redis server (none: the test passes, see `RedisServer::start`), the new
/// script, and the receipts of a crowd of `size` charged by it at `T0` on `key`.
fn crowd(key: &str, size: u64) -> Option<(RedisServer, Version, Vec<Vec<u64>>)> {
    let server = RedisServer::start()?;
    let v = new();
    let receipts = (0..size).map(|_| charge(&server, &v, key)).collect();
    Some((server, v, receipts))
}

/// Writes `key` as a log keeping `records` records or more writes it once the first
/// `refunded` receipts of a crowd of `size` charged at `T0` (incarnation `born`,
/// before any refund: each noted ledger 0) came back, one unit each: the member
/// at `T0` holding the rest, the head `refunds:ledger:0:born`, the logged
/// instant `T0` (with `logged`) and the records of the last `records` of them
/// (each `refunds:id:0/T0/total`).
fn plant(
    server: &RedisServer,
    key: &str,
    (size, refunded, records): (u64, u64, u64),
    born: u64,
    logged: bool,
) {
    let _: () = server.cmd(&["DEL", key]);
    let add = |member: String| {
        let _: i64 = server.cmd(&["ZADD", key, "-inf", &member]);
    };
    add(format!("refunds:{refunded}:0:{born}"));
    if logged {
        add(format!("refunds:logged:{T0}"));
    }
    for total in refunded - records + 1..=refunded {
        add(format!("refunds:id:0/{T0}/{total}"));
    }
    let rest = size - refunded;
    let _: i64 = server.cmd(&["ZADD", key, &T0.to_string(), &format!("{T0}:{rest}:{rest}")]);
}

/// `plant` writes what the new script writes after 8 refunds of a crowd at one
/// instant (so its wider keys are those a log keeping more would write); a key
/// of 9 to 64 records (up to 66 members at -inf, more than the previous scripts
/// read) reads under the new script and its refunds give back; a receipt already
/// given back gives nothing again; the new script's refund trims the records to
/// 8 (the floor raised: the rest of the crowd gives back nothing, the
/// conservative loss until step 2), after which the previous scripts read the
/// key again.
///
/// Mutations seen failing: `LOG_REFUNDS_READ` 8 (reads "too many"); the
/// receipts' count left at `REFUNDS_KEPT` alone (`#sort > REFUNDS_KEPT`:
/// "too many receipts"); the read's `LIMIT` left at `REFUNDS_KEPT + 3` (a
/// receipt not among the records read gives back twice); the log's refund
/// keeping `LOG_REFUNDS_READ` records (12 members at -inf, not 10).
#[test]
fn a_key_of_up_to_64_records_reads_and_refunds() {
    let size = 70;
    let key = "s47:wide";
    let Some((server, v, receipts)) = crowd(key, size) else {
        return;
    };
    let born = receipts[0][4];
    for r in &receipts[..8] {
        assert_eq!(refund(&server, &v, key, r), Ok(1));
    }
    let written = members(&server, key);
    plant(&server, key, (size, 8, 8), born, true);
    assert_eq!(
        members(&server, key),
        written,
        "plant: not as the script writes"
    );
    for k in [9, 10, 11, 30, 63, 64] {
        let k = k as usize;
        plant(&server, key, (size, k as u64, k as u64), born, true);
        assert_eq!(refund_members(&server, key), k + 2);
        for (name, old) in previous() {
            let e = left(&server, &old, key).expect_err("more than the previous scripts read");
            assert!(
                e.contains("malformed") && e.contains("too many"),
                "{name}: {e}"
            );
        }
        let before = LIMIT - (size - k as u64);
        assert_eq!(left(&server, &v, key), Ok(before), "{k} records");
        // Every receipt given back, whose record the key holds: nothing again.
        for r in &receipts[..k] {
            assert_eq!(refund(&server, &v, key, r), Ok(0), "{k} records: again");
        }
        assert_eq!(refund_members(&server, key), k + 2, "a refund of 0 wrote");
        assert_eq!(refund(&server, &v, key, &receipts[k]), Ok(1), "{k} records");
        assert_eq!(left(&server, &v, key), Ok(before + 1));
        // Trimmed to 8 records: the floor past the crowd's ledger.
        assert_eq!(refund_members(&server, key), 10, "{k} records: kept");
        assert_eq!(refund(&server, &v, key, &receipts[k + 1]), Ok(0));
        for (name, old) in previous() {
            assert_eq!(left(&server, &old, key), Ok(before + 1), "{name}");
            for r in &receipts[..k + 2] {
                assert_eq!(refund(&server, &old, key, r), Ok(0), "{name}");
            }
        }
        for r in &receipts[..k + 2] {
            assert_eq!(refund(&server, &v, key, r), Ok(0), "{k} records: again");
        }
        assert_eq!(left(&server, &v, key), Ok(before + 1));
    }
}

/// Past 64 records a key is malformed to the new script, its charge and its
/// refund, and neither writes it: 65 records with the head and the logged
/// instant (67 members at -inf: "too many"), and 65 with the head alone (66
/// members, within the members' bound: "too many receipts").
///
/// Mutations seen failing: `LOG_REFUNDS_READ` 65; the receipts' check left out.
#[test]
fn past_64_records_a_key_is_malformed_and_written_nothing() {
    let key = "s47:past";
    let Some((server, v, receipts)) = crowd(key, 80) else {
        return;
    };
    let born = receipts[0][4];
    for (logged, what) in [(true, "too many)"), (false, "too many receipts")] {
        plant(&server, key, (80, 65, 65), born, logged);
        let before = members(&server, key);
        let e = left(&server, &v, key).expect_err("malformed");
        assert!(
            e.contains("malformed") && e.contains(key) && e.contains(what),
            "{e}"
        );
        for r in &receipts[64..67] {
            let e = refund(&server, &v, key, r).expect_err("malformed");
            assert!(e.contains("malformed") && e.contains(what), "{e}");
        }
        let e = common::eval(&server, &v.charge, key, &[T0, 1, 1, HOUR, LIMIT])
            .expect_err("malformed")
            .to_string();
        assert!(e.contains("malformed"), "{e}");
        assert_eq!(members(&server, key), before, "a malformed key was written");
        // One record fewer, the same key reads.
        let _: i64 = server.cmd(&["ZREM", key, &format!("refunds:id:0/{T0}/1")]);
        assert_eq!(left(&server, &v, key), Ok(LIMIT - 15), "logged: {logged}");
    }
}

/// A crowd of 20 at one instant charged and refunded, one by one, by the new
/// script: after each refund the key holds at most 10 members at -inf, and both
/// previous scripts read it and refund its receipts without an error; every
/// receipt sent again by any version gives nothing back; the three read the same
/// units left.
///
/// Mutation seen failing: the log's refund keeping `LOG_REFUNDS_READ` records
/// (`record_refund(live, id, meta.floor, LOG_REFUNDS_READ)`: the previous
/// scripts' read, "too many", after the 9th refund). Step 2 makes exactly that
/// change behind `wide_log_refunds` (session 54, off by default): with the option
/// off this test holds as it is; `the_wide_log_keeps_64_records_which_the_narrow_one_reads`
/// is step 2's.
#[test]
fn a_key_the_new_log_writes_reads_under_the_previous_logs() {
    let key = "s47:deploy";
    let Some((server, v, receipts)) = crowd(key, 20) else {
        return;
    };
    let mut back = 0;
    for (i, r) in receipts.iter().enumerate() {
        back += refund(&server, &v, key, r).expect("a refund");
        assert!(
            refund_members(&server, key) <= 10,
            "after {} refunds",
            i + 1
        );
        for (name, old) in previous() {
            let units = left(&server, &old, key);
            assert_eq!(units, Ok(80 + back), "{name} after {} refunds", i + 1);
            assert_eq!(refund(&server, &old, key, r), Ok(0), "{name}: again");
        }
    }
    // The new script's first 9 give back; the 9th forgets the first record and
    // raises the floor past the crowd's ledger (the loss step 2 ends).
    assert_eq!(back, 9);
    for r in &receipts {
        assert_eq!(refund(&server, &v, key, r), Ok(0));
        for (name, old) in previous() {
            assert_eq!(refund(&server, &old, key, r), Ok(0), "{name}");
        }
    }
    assert_eq!(left(&server, &v, key), Ok(89));
    for (name, old) in previous() {
        assert_eq!(left(&server, &old, key), Ok(89), "{name}");
    }
}

/// Step 2 (session 54, `wide_log_refunds`): a crowd of 66 at one instant charged
/// and refunded, one by one, by the new script with the option on. After each
/// refund the key is exactly what `plant` writes for that many refunds keeping up
/// to 64 records (the 65th with the floor raised to 1; so the planted keys of the
/// tests above are the ones step 2 writes), the script with the option off reads it (the units left) and refunds
/// nothing twice; the first 65 give back (the 65th trims the records to 64 and
/// raises the floor past the crowd's ledger), the 66th nothing. The scripts from
/// before session 47 read the key until it holds 9 records and call it
/// malformed from then on: why the option waits until no replica runs them.
///
/// Mutations seen failing: `WIDE_LOG` ignored (the refund keeps 8: the key is not
/// the planted one after the 9th refund); `REFUNDS_KEPT_WIDE` 65 in the refund
/// (the 66th gives back: a key of 65 records, which no reader reads).
#[test]
fn the_wide_log_keeps_64_records_which_the_narrow_one_reads() {
    let key = "s54:wide";
    let Some(server) = RedisServer::start() else {
        return;
    };
    let (w, narrow) = (wide(), new());
    let receipts: Vec<Vec<u64>> = (0..66).map(|_| charge(&server, &w, key)).collect();
    let born = receipts[0][4];
    let mut back = 0;
    for (i, r) in receipts.iter().enumerate() {
        let refunded = i as u64 + 1;
        back += refund(&server, &w, key, r).expect("a refund");
        if refunded <= 65 {
            assert_eq!(back, refunded, "refund {refunded}");
            plant(
                &server,
                "planted",
                (66, refunded, refunded.min(64)),
                born,
                true,
            );
            if refunded == 65 {
                // The first record forgotten: the floor raised past its ledger, 0.
                let _: i64 = server.cmd(&["ZREM", "planted", &format!("refunds:65:0:{born}")]);
                let _: i64 =
                    server.cmd(&["ZADD", "planted", "-inf", &format!("refunds:65:1:{born}")]);
            }
            assert_eq!(
                members(&server, key),
                members(&server, "planted"),
                "after {refunded} refunds"
            );
        }
        assert_eq!(left(&server, &narrow, key), Ok(LIMIT - 66 + back));
        assert_eq!(refund(&server, &narrow, key, r), Ok(0), "again");
        for (name, old) in previous() {
            let read = left(&server, &old, key);
            if refunded <= 8 {
                assert_eq!(read, Ok(LIMIT - 66 + back), "{name} after {refunded}");
            } else {
                assert!(
                    read.as_ref().is_err_and(|e| e.contains("malformed")),
                    "{name} after {refunded}: {read:?}"
                );
            }
        }
    }
    assert_eq!(back, 65, "the 66th refund came after the floor rose");
    assert_eq!(refund_members(&server, key), 66, "64 records, head, logged");
}
