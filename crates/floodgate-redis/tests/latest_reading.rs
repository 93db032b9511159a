//! A GCRA refund is judged no earlier than the key's latest reading (the largest
//! server time an admission on it was judged at), kept as the first record of the
//! receipts form: a `TIME` that stepped back frees no schedule a later admission
//! had passed, on the one-limit and the multi-limit refund; a state without the
//! reading (written before it) is refunded at `TIME` as before; a version that
//! does not know the reading still parses every state written with it; a
//! reading no script writes is malformed. See VERIFICATION.md, "session 45: a
//! Redis GCRA refund judged no earlier than the key's latest reading".

mod common;

use common::{runtime, with_refunds, RedisServer};
use floodgate::Policy;
use floodgate_redis::{Algorithm, RedisLimiter, RedisLimiterBuilder};

/// 5 a second, burst 5: T = 200 ms, B·T = 1 s.
fn five() -> Policy {
    Policy::per_second(5).unwrap().with_burst(5).unwrap()
}

/// GCRA of [`five`] alone, refunds `on` (or off), keys prefixed `test:`.
fn gcra_five(rt: &tokio::runtime::Runtime, server: &RedisServer, on: bool) -> RedisLimiter {
    with_refunds(rt, server, common::builder(Algorithm::Gcra, five()), on)
}

/// 10 s and 10.5 s, in microseconds.
const TEN: u64 = 10_000_000;
const TEN_HALF: u64 = 10_500_000;

/// The GCRA state at `key` split at its `:` (the receipts form: TAT, ledger,
/// latest TAT, floor, incarnation, records).
fn fields(server: &RedisServer, key: &str) -> Vec<String> {
    let state: String = server.cmd(&["GET", key]);
    state.split(':').map(str::to_owned).collect()
}

/// Whether `state` is one a version of this crate without the latest reading
/// parses (its `gcra_read` and `refund_ids`, session 44): the plain `TAT`, or six
/// `:`-separated fields, five of them digits and the sixth records
/// `digits/digits[digits/]*` joined by `,`.
fn read_by_a_version_without_the_reading(state: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if digits(state) {
        return true;
    }
    let parts: Vec<&str> = state.split(':').collect();
    if parts.len() != 6 || !parts[..5].iter().all(|p| digits(p)) {
        return false;
    }
    parts[5].is_empty()
        || parts[5].split(',').all(|record| {
            let mut it = record.splitn(3, '/');
            let (a, b) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
            let rest = it.next().unwrap_or("");
            digits(a) && digits(b) && rest.bytes().all(|c| c.is_ascii_digit() || c == b'/')
        })
}

/// The attack of session 44 (`review_s44_redis::a_gcra_refund_at_a_time_stepped_back_…`)
/// on the multi-limit scripts (`multi.lua`'s charges, `multi_refund.lua`'s
/// refund): GCRA 5 a second, burst 5, beside a fixed window of 1000 an hour that
/// never binds. 3 units at 10 s (booked to 10.6 s), 2 at 10.5 s (on to 11 s);
/// the first charge refunded at a `TIME` of 10 s is judged at 10.5 s, the key's
/// latest reading: 0.1 s given back, the TAT at 10.9 s, and at 10.5 s exactly 3
/// admitted — the in-process refund's answer on a clock in order.
///
/// Fails if the refund is judged at `TIME` (`local at = now` without the clamp
/// to `st.reading` in `gcra_refund`): 0.6 s given back, the TAT at 10.4 s, 5
/// admitted at 10.5 s.
#[test]
fn a_multi_limit_refund_at_a_time_stepped_back_frees_no_later_admissions_schedule() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let builder = common::builder(Algorithm::Gcra, five())
        .and(Algorithm::FixedWindow, Policy::per_hour(1000).unwrap());
    let l = with_refunds(&rt, &server, builder, true);
    rt.block_on(async {
        let (a, r) = l.charge_n_at_micros("multi", 3, TEN).await.unwrap();
        assert_eq!((a.is_allowed(), a.remaining()), (true, 2));
        let (b, _) = l.charge_n_at_micros("multi", 2, TEN_HALF).await.unwrap();
        assert_eq!((b.is_allowed(), b.remaining()), (true, 2));
        assert!(l.refund_at_micros(&r.unwrap(), TEN).await.unwrap());
        let left = l.peek_n_at_micros("multi", 0, TEN_HALF).await.unwrap();
        assert_eq!(left.remaining(), 3, "{left:?}");
        assert!(!l
            .check_n_at_micros("multi", 4, TEN_HALF)
            .await
            .unwrap()
            .is_allowed());
        assert!(l
            .check_n_at_micros("multi", 3, TEN_HALF)
            .await
            .unwrap()
            .is_allowed());
    });
}

/// An admission at a `TIME` behind the key's latest reading (a clock stepped
/// back) keeps the latest reading, and a refund after it is judged there. 1 unit
/// at 10 s (booked to 10.2 s, the receipt), 1 at 10.5 s (to 10.7 s), 1 at 10 s
/// again (to 10.9 s): the first refunded at 10 s gives nothing back — its booking
/// lies before 10.5 s — and 3 are left at 10.5 s.
///
/// Fails if a write takes `now` as the reading (`local reading = now` without the
/// max with `st.reading` in `gcra_write`): the reading falls to 10 s, the refund
/// gives back 0.2 s and 4 are left at 10.5 s.
#[test]
fn an_admission_behind_the_latest_reading_keeps_it() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let g = gcra_five(&rt, &server, true);
    rt.block_on(async {
        let (_, r) = g.charge_n_at_micros("behind", 1, TEN).await.unwrap();
        assert!(g
            .check_n_at_micros("behind", 1, TEN_HALF)
            .await
            .unwrap()
            .is_allowed());
        let c = g.check_n_at_micros("behind", 1, TEN).await.unwrap();
        assert_eq!((c.is_allowed(), c.remaining()), (true, 0));
        assert_eq!(fields(&server, "test:behind")[5], format!("0/0/{TEN_HALF}"));
        assert!(!g.refund_at_micros(&r.unwrap(), TEN).await.unwrap());
        let left = g.peek_n_at_micros("behind", 0, TEN_HALF).await.unwrap();
        assert_eq!(left.remaining(), 3, "{left:?}");
    });
}

/// A refund keeps the latest reading: 3 units at 10 s (receipt A, booked to 10.6
/// s), 2 at 10.5 s (receipt B), B refunded at 10.5 s (0.4 s back, the TAT at
/// 10.6 s), then A at a `TIME` of 10 s: judged at 10.5 s, it gives back the 0.1
/// s of its booking still ahead of that reading (B's refund, of the schedule's
/// last booking, moved nobody and is not in A's shift, as in process since
/// session 46), the TAT at 10.5 s: 2 left at 10 s, 5 at 10.5 s.
///
/// Fails if the refund writes its records without the reading
/// (`reading_record(st.reading, kept)` → `kept` in `gcra_refund`): A is then
/// judged at 10 s, gives back 0.6 s, the TAT at 10 s, and 5 are left at 10 s.
#[test]
fn a_refund_keeps_the_latest_reading() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let g = gcra_five(&rt, &server, true);
    rt.block_on(async {
        let (_, a) = g.charge_n_at_micros("kept", 3, TEN).await.unwrap();
        let (_, b) = g.charge_n_at_micros("kept", 2, TEN_HALF).await.unwrap();
        assert!(g.refund_at_micros(&b.unwrap(), TEN_HALF).await.unwrap());
        let f = fields(&server, "test:kept");
        assert!(f[5].starts_with(&format!("0/0/{TEN_HALF},")), "{f:?}");
        assert!(g.refund_at_micros(&a.unwrap(), TEN).await.unwrap());
        let left = g.peek_n_at_micros("kept", 0, TEN).await.unwrap();
        assert_eq!(left.remaining(), 2, "{left:?}");
        let left = g.peek_n_at_micros("kept", 0, TEN_HALF).await.unwrap();
        assert_eq!(left.remaining(), 5, "{left:?}");
    });
}

/// A state from before the latest reading — the six fields with no reading
/// record, and the plain `TAT` — is read: its refund is judged at `TIME`, as
/// before (nothing better is known: the latest TAT bounds the latest reading only
/// from above, and judged there a refund gives nothing back), and its next
/// admission starts the reading. 3 units at 10 s and 2 at 10.5 s, the reading
/// record then removed by hand (the state a version without it wrote): the first
/// refunded at 10 s gives back 0.6 s, 5 left at 10.5 s. A plain `TAT` (a limiter
/// with refunds off) charged with a receipt at 10.5 s gets the reading 10.5 s.
///
/// Fails if a state without the reading record is malformed (a refund or charge
/// error), or if a write over it keeps it without one (`reading_record` with no
/// reading: the last assertions).
#[test]
fn a_state_without_a_latest_reading_is_refunded_at_time_as_before() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let g = gcra_five(&rt, &server, true);
    let plain = gcra_five(&rt, &server, false);
    rt.block_on(async {
        let (_, r) = g.charge_n_at_micros("old", 3, TEN).await.unwrap();
        let (b, _) = g.charge_n_at_micros("old", 2, TEN_HALF).await.unwrap();
        assert!(b.is_allowed());
        let mut f = fields(&server, "test:old");
        assert_eq!(f.len(), 6, "{f:?}");
        assert_eq!(f[5], format!("0/0/{TEN_HALF}"));
        f[5].clear();
        let six = f.join(":");
        let _: () = server.cmd(&["SET", "test:old", &six]);
        assert!(g.refund_at_micros(&r.unwrap(), TEN).await.unwrap());
        let f = fields(&server, "test:old");
        // 0.6 s given back: the TAT from 11 s to 10.4 s, the ledger 600 000 µs.
        assert_eq!(
            (f[0].as_str(), f[1].as_str()),
            ("10400000", "600000"),
            "{f:?}"
        );
        assert!(!f[5].starts_with("0/0/"), "no reading is made up: {f:?}");
        let left = g.peek_n_at_micros("old", 0, TEN_HALF).await.unwrap();
        assert_eq!(left.remaining(), 5, "{left:?}");
        // The next admission starts the reading, the records kept after it.
        assert!(g
            .check_n_at_micros("old", 1, TEN_HALF)
            .await
            .unwrap()
            .is_allowed());
        let f = fields(&server, "test:old");
        let records: Vec<&str> = f[5].split(',').collect();
        assert_eq!(records.len(), 2, "{f:?}");
        assert_eq!(records[0], format!("0/0/{TEN_HALF}"));
        assert!(records[1].starts_with("0/"), "{f:?}");

        // The plain form: a limiter with refunds off, then one with them on.
        assert!(plain
            .check_n_at_micros("plain", 2, TEN)
            .await
            .unwrap()
            .is_allowed());
        let state: String = server.cmd(&["GET", "test:plain"]);
        assert_eq!(state, "10400000");
        let (d, _) = g.charge_n_at_micros("plain", 1, TEN_HALF).await.unwrap();
        assert!(d.is_allowed());
        let f = fields(&server, "test:plain");
        assert_eq!(f[5], format!("0/0/{TEN_HALF}"), "{f:?}");
    });
}

/// Every GCRA state a charge, a refund and a multi-limit charge write with the
/// latest reading is one a version of this crate without it parses (six fields,
/// the reading a record of the records' form): a rolling upgrade leaves the old
/// replicas reading the keys the new ones wrote. The reading record is never a
/// receipt's id (those are `noted/end`, two numbers).
///
/// Fails if the reading is written as a seventh field (`':' .. fmt(reading)`
/// after the records in `gcra_write`).
#[test]
fn a_state_with_the_latest_reading_is_read_by_a_version_without_it() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let one = gcra_five(&rt, &server, true);
    let multi: RedisLimiterBuilder = common::builder(Algorithm::Gcra, five())
        .and(Algorithm::FixedWindow, Policy::per_hour(1000).unwrap());
    let multi = with_refunds(&rt, &server, multi, true);
    rt.block_on(async {
        // 12 charges, each refunded at once: the records fill past what a key
        // remembers.
        let mut states = Vec::new();
        for i in 0..12_u64 {
            let t = TEN + i * 300_000;
            let (_, r) = one.charge_n_at_micros("compat", 1, t).await.unwrap();
            states.push(server.cmd::<String>(&["GET", "test:compat"]));
            assert!(one.refund_at_micros(&r.unwrap(), t).await.unwrap());
            states.push(server.cmd::<String>(&["GET", "test:compat"]));
        }
        let (_, r) = multi.charge_n_at_micros("compat", 1, TEN).await.unwrap();
        let key = multi.redis_keys("compat").remove(0);
        states.push(server.cmd::<String>(&["GET", &key]));
        multi.refund_at_micros(&r.unwrap(), TEN).await.unwrap();
        states.push(server.cmd::<String>(&["GET", &key]));
        for state in &states {
            assert!(read_by_a_version_without_the_reading(state), "{state}");
            let records = state.split(':').nth(5).unwrap();
            let first = records.split(',').next().unwrap();
            assert!(first.starts_with("0/0/"), "{state}");
            // Receipt ids, each refund of the last booking (here every one)
            // followed by its note (session 46).
            for id in records.split(',').skip(1) {
                let note = id.starts_with("0/1/") && id.matches('/').count() == 3;
                assert!(
                    note || id.matches('/').count() == 1,
                    "a receipt id: {state}"
                );
            }
        }
        // 8 receipts remembered after the reading, at most, and a note each.
        let last = &states[23];
        assert_eq!(
            last.split(':').nth(5).unwrap().split(',').count(),
            17,
            "{last}"
        );
    });
}

/// A reading record no script writes is a malformed state: a charge and a
/// refund over it fail with an error naming the key, and write nothing. A
/// reading at or past 2^53, one not before the latest TAT (an admission at a
/// reading books past it), and a reading record that is not a record of its own.
///
/// Fails if `gcra_read` drops its check that the reading lies before the latest
/// TAT (`reading >= h`), or lets the tail after the reading through unchecked.
#[test]
fn a_latest_reading_no_script_writes_is_malformed() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let g = gcra_five(&rt, &server, true);
    rt.block_on(async {
        let (_, r) = g.charge_n_at_micros("bad", 3, TEN).await.unwrap();
        let r = r.unwrap();
        let f = fields(&server, "test:bad");
        let head = f[..5].join(":");
        let hi = &f[2];
        for records in [
            "0/0/9007199254740992".to_owned(),
            "0/0/99999999999999999999".to_owned(),
            format!("0/0/{hi}"),
            format!("0/0/{}", hi.parse::<u64>().unwrap() + 1),
            "0/0/5/7".to_owned(),
            "0/0/5,".to_owned(),
        ] {
            let bad = format!("{head}:{records}");
            let _: () = server.cmd(&["SET", "test:bad", &bad]);
            let e = g.refund_at_micros(&r, TEN).await.unwrap_err().to_string();
            assert!(
                e.contains("malformed") && e.contains("test:bad"),
                "{bad}: {e}"
            );
            let e = g
                .check_n_at_micros("bad", 1, TEN)
                .await
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("malformed") && e.contains("test:bad"),
                "{bad}: {e}"
            );
            assert_eq!(server.cmd::<String>(&["GET", "test:bad"]), bad);
        }
        // Put back, the receipt gives back once.
        let good = format!("{head}:0/0/{TEN}");
        let _: () = server.cmd(&["SET", "test:bad", &good]);
        assert!(g.refund_at_micros(&r, TEN).await.unwrap());
        assert!(!g.refund_at_micros(&r, TEN).await.unwrap());
    });
}
