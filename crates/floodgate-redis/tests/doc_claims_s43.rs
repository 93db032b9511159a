//! The refunds' promises of sessions 42–43 that no other test pins down, against a
//! `redis-server` of the test's own (`FLOODGATE_REQUIRE_REDIS=1` to fail where
//! none can run).
//!
//! * Crate docs, "Refunds": "A receipt names its limiter (the prefix and the
//!   limits): another limiter gives nothing back for it."
//! * `RedisLimiter::refund`: "Why Redis did not answer …, whatever the failure
//!   policy: a refund has no fallback"; "`false`, without a round trip, on a
//!   limiter with refunds off".
//! * `RedisLimiter::refund`: an error on "a timeout … (the refund may then have
//!   been made or not)"; "Safe to send again (after a timeout …)".
//! * `RedisLimiter::charge_n`: "`None` for … a cached or fallback verdict".
//! * The denial cache (`deny_cache.rs`): "another replica's refund is not seen, so
//!   the entry errs towards denying until its wait ends, never towards admitting".
//! * Crate docs, "Refunds", **State**: GCRA's refund state "(it then expires when
//!   the latest TAT has passed)", a refund that lowers the TAT included.
//! * `RedisLimiterBuilder::refunds`: "Turning them off again undoes nothing: a key
//!   charged with a receipt keeps the longer form (every write keeps it)".
//! * Crate docs, "Refunds", several limits: "A state found malformed at any key
//!   fails the run with nothing given back on any limit".

mod common;

use std::time::Duration;

use common::{runtime, RedisServer, ALGORITHMS};
use floodgate::Policy;
use floodgate_redis::{Algorithm, OnFailure, RedisLimitError, RedisLimiter, RedisLimiterBuilder};

/// `builder` with refunds on, under `prefix`, failing open, on `server`.
async fn on(server: &RedisServer, prefix: &str, builder: RedisLimiterBuilder) -> RedisLimiter {
    off(server, prefix, builder.refunds(true)).await
}

/// `builder` as it is (refunds off unless it turned them on), under `prefix`,
/// failing open with a timeout of 500 ms, on `server`.
async fn off(server: &RedisServer, prefix: &str, builder: RedisLimiterBuilder) -> RedisLimiter {
    let conn = floodgate_redis::connect(&server.url()).await.unwrap();
    builder
        .prefix(prefix)
        .timeout(Duration::from_millis(500))
        .on_failure(OnFailure::Open)
        .build(conn)
        .unwrap()
}

/// For every algorithm: a charge of 2 (of 5 an hour) under prefix `a:` is refused
/// by a limiter of the same prefix with another limit (6 an hour) and by one of the
/// same limit under another prefix — each would otherwise run the refund on the
/// receipt's own key — and given back by its own limiter, once.
///
/// Mutation seen failing: `refund_on` without its `receipt.issuer != self.issuer()`
/// check (the other limiters give the units back: `true`).
#[test]
fn a_receipt_of_another_limiter_gives_nothing_back() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    // An hour with a quarter of it left at least in the windows.
    let hour = common::an_hour(&server);
    runtime().block_on(async {
        let five = Policy::new(5, hour).unwrap();
        let six = Policy::new(6, hour).unwrap();
        for algorithm in ALGORITHMS {
            let own = on(&server, "a:", RedisLimiter::builder(algorithm, five)).await;
            let other_limit = on(&server, "a:", RedisLimiter::builder(algorithm, six)).await;
            let other_prefix = on(&server, "b:", RedisLimiter::builder(algorithm, five)).await;
            let key = format!("k-{algorithm:?}");
            let (v, receipt) = own.charge_n(&key, 2).await.unwrap();
            assert!(v.decision().is_allowed(), "{algorithm:?}");
            let receipt = receipt.expect("refunds on: a receipt");
            assert!(
                !other_limit.refund(&receipt).await.unwrap(),
                "{algorithm:?}"
            );
            assert!(
                !other_prefix.refund(&receipt).await.unwrap(),
                "{algorithm:?}"
            );
            let left = own.peek_n(&key, 0).await.unwrap().decision().remaining();
            assert_eq!(left, 3, "{algorithm:?}: nothing given back");
            assert!(own.refund(&receipt).await.unwrap(), "{algorithm:?}");
            assert!(!own.refund(&receipt).await.unwrap(), "{algorithm:?}");
            let left = own.peek_n(&key, 0).await.unwrap().decision().remaining();
            assert_eq!(left, 5, "{algorithm:?}: given back once");
        }
        // Several limits: a receipt of the pair is refused by either limit alone.
        let pair =
            || RedisLimiter::builder(Algorithm::Gcra, five).and(Algorithm::FixedWindow, five);
        let both = on(&server, "a:", pair()).await;
        let first_alone = on(&server, "a:", RedisLimiter::builder(Algorithm::Gcra, five)).await;
        let (_, receipt) = both.charge_n("pair", 1).await.unwrap();
        let receipt = receipt.expect("refunds on: a receipt");
        assert!(!first_alone.refund(&receipt).await.unwrap());
        assert!(both.refund(&receipt).await.unwrap());
    });
}

/// The server gone: under `OnFailure::Open` a charge is a fallback admission with
/// no receipt, and a refund is an error (not a fallback `false`, not a made-up
/// `true`); a limiter with refunds off answers `Ok(false)` at once — no round trip,
/// or it too would fail.
///
/// Mutation seen failing: `refund` answering through the failure policy
/// (`refund_on(..).await.or(Ok(false))`): `Ok(false)` where an error is promised.
#[test]
fn a_refund_has_no_fallback_and_refunds_off_make_no_round_trip() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let policy = Policy::per_hour(5).unwrap();
    let with = rt.block_on(on(
        &server,
        "f:",
        RedisLimiter::builder(Algorithm::Gcra, policy),
    ));
    let without = rt.block_on(off(
        &server,
        "f:",
        RedisLimiter::builder(Algorithm::Gcra, policy),
    ));
    let (v, receipt) = rt.block_on(with.charge_n("k", 1)).unwrap();
    assert!(v.decision().is_allowed());
    let receipt = receipt.expect("refunds on: a receipt");
    server.kill();
    let refund = rt.block_on(with.refund(&receipt));
    assert!(refund.is_err(), "no fallback for a refund: {refund:?}");
    let (v, none) = rt.block_on(with.charge_n("k", 1)).unwrap();
    assert!(v.is_fallback() && v.decision().is_allowed(), "{v:?}");
    assert!(none.is_none(), "a fallback verdict carries no receipt");
    // Refunds off: the same receipt (same prefix and limit) is answered without
    // Redis.
    assert!(!rt.block_on(without.refund(&receipt)).unwrap());
}

/// Two replicas with a denial cache: B caches Redis's denial of "k"; A's refund
/// then makes room in Redis, which B does not see — B goes on denying from its
/// cache (never admitting on a stale entry), while A, whose cache held nothing,
/// is admitted by Redis.
///
/// Mutation seen failing: `DenyCache::lookup` never answering (B asks Redis and is
/// admitted).
#[test]
fn another_replicas_refund_leaves_a_cached_denial_denying() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        // A burst of 2, one more an hour.
        let policy = Policy::per_hour(1).and_then(|p| p.with_burst(2)).unwrap();
        let replica = || async {
            let conn = floodgate_redis::connect(&server.url()).await.unwrap();
            RedisLimiter::builder(Algorithm::Gcra, policy)
                .prefix("dc:")
                .timeout(Duration::from_secs(1))
                .on_failure(OnFailure::Error)
                .deny_cache(16)
                .refunds(true)
                .build(conn)
                .unwrap()
        };
        let (a, b) = (replica().await, replica().await);
        let (_, first) = a.charge_n("k", 1).await.unwrap();
        assert!(a.charge_n("k", 1).await.unwrap().0.decision().is_allowed());
        let denied = b.check_n("k", 1).await.unwrap();
        assert!(!denied.decision().is_allowed() && !denied.is_cached());
        assert_eq!(b.cached_denials(), 1);
        assert!(a.refund(&first.expect("a receipt")).await.unwrap());
        let stale = b.check_n("k", 1).await.unwrap();
        assert!(
            stale.is_cached() && !stale.decision().is_allowed(),
            "{stale:?}"
        );
        let (v, none) = b.charge_n("k", 1).await.unwrap();
        assert!(
            v.is_cached() && none.is_none(),
            "a cached verdict: no receipt"
        );
        assert!(a.check_n("k", 1).await.unwrap().decision().is_allowed());
    });
}

/// A multi-limit receipt (GCRA, then a fixed window) refunded over a fixed-window
/// key that something else overwrote: the run fails, and the GCRA part, before it,
/// was not given back either (its 2 units stay taken once the bad key is gone).
/// Before session 43's revlist review the parts before the malformed one were
/// given back while the call failed.
///
/// Mutation seen failing: `multi_refund.lua` without its check pass (each limit
/// refunded as it is read): the GCRA part is given back (5 left, not 3).
#[test]
fn a_multi_limit_refund_over_a_malformed_part_gives_nothing_back() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let five = Policy::per_hour(5).unwrap();
        let both = on(
            &server,
            "mp:",
            RedisLimiter::builder(Algorithm::Gcra, five).and(Algorithm::FixedWindow, five),
        )
        .await;
        let (_, receipt) = both.charge_n("u", 2).await.unwrap();
        let receipt = receipt.expect("refunds on: a receipt");
        let keys = both.redis_keys("u");
        server.cmd::<()>(&["SET", &keys[1], "not a window"]);
        let refund = both.refund(&receipt).await;
        assert!(refund.is_err(), "{refund:?}");
        server.cmd::<()>(&["DEL", &keys[1]]);
        let left = both.peek_n("u", 0).await.unwrap().decision().remaining();
        assert_eq!(
            left, 3,
            "the GCRA part was given back while the call failed"
        );
    });
}

/// GCRA, 5 an hour (a unit every 12 min): charges of 1 and 2 book the key 36 min
/// ahead; the refund of the 2 lowers its TAT to 12 min ahead, and the key still
/// lives until the latest TAT (36 min), not the lowered one.
///
/// Mutation seen failing: `gcra_refund` writing the state with the time to live
/// `tat - now` (the lowered TAT) instead of `st.hi - now`: about 12 min left.
#[test]
fn a_gcra_refund_keeps_the_key_until_its_latest_tat() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let l = on(
            &server,
            "ttl:",
            RedisLimiter::builder(Algorithm::Gcra, Policy::per_hour(5).unwrap()),
        )
        .await;
        assert!(l.charge_n("g", 1).await.unwrap().0.decision().is_allowed());
        let (_, r) = l.charge_n("g", 2).await.unwrap();
        let key = l.redis_keys("g").remove(0);
        let pttl = || -> i64 { server.cmd(&["PTTL", &key]) };
        let minute = 60_000;
        let before = pttl();
        assert!(
            before > 35 * minute && before <= 36 * minute,
            "PTTL {before}"
        );
        assert!(l.refund(&r.expect("a receipt")).await.unwrap());
        let left = l.peek_n("g", 0).await.unwrap().decision().remaining();
        assert_eq!(left, 4, "the 2 units came back");
        let after = pttl();
        assert!(after > 35 * minute && after <= before, "PTTL {after}");
    });
}

/// The server blocked (scripts held by `CLIENT PAUSE ... WRITE` until the test
/// unpauses it) while a refund is sent with a timeout of 500 ms: the refund is a
/// `Timeout` error, not a wait for the server. Its command may still run once the
/// server is unpaused; sent again, the receipt gives the charge of 2 back once in
/// all: 4 units left, not 5 or 6.
///
/// Mutation seen failing: `refund_on` sending its script without the timeout
/// (`script::send` for `send_timed`): `Ok(true)` once the pause's 30 s cap ends.
#[test]
fn a_refund_times_out_and_is_safe_to_send_again() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let l = rt.block_on(on(
        &server,
        "to:",
        RedisLimiter::builder(Algorithm::Gcra, Policy::per_hour(5).unwrap()),
    ));
    assert!(rt
        .block_on(l.check_n("k", 1))
        .unwrap()
        .decision()
        .is_allowed());
    let (_, r) = rt.block_on(l.charge_n("k", 2)).unwrap();
    let r = r.expect("a receipt");
    // Every script (a write command) held until `CLIENT UNPAUSE`, the pause in
    // place once its +OK is read: a block the test ends, not the clock (a
    // `DEBUG SLEEP 2` had ended if this thread was descheduled 1.7 s). The 30 s
    // only bounds a refund sent without its timeout (`Ok(true)` then).
    let _: () = server.cmd(&["CLIENT", "PAUSE", "30000", "WRITE"]);
    let e = rt.block_on(l.refund(&r)).unwrap_err();
    assert!(matches!(e, RedisLimitError::Timeout { .. }), "{e}");
    let _: () = server.cmd(&["CLIENT", "UNPAUSE"]);
    // Sent again: given back by one of the two sends, once.
    let _ = rt.block_on(l.refund(&r)).unwrap();
    assert!(!rt.block_on(l.refund(&r)).unwrap());
    let left = rt
        .block_on(l.peek_n("k", 0))
        .unwrap()
        .decision()
        .remaining();
    assert_eq!(left, 4, "the 2 units back once: 4 of 5 (1 still charged)");
}

/// For GCRA and both windows (the sliding log: `sliding_log_refunds.rs`): a key
/// charged with a receipt, then written by a limiter with refunds off (a check of
/// 1), keeps its refund fields (more than the plain form's), and the receipt still
/// gives its 2 units back: 5 − 1 = 4 left.
///
/// Mutation seen failing: `gcra_write` writing the plain form whenever the run
/// issues no receipts (`if not ISSUING`): the GCRA key back to 1 field, its
/// receipt then giving nothing.
#[test]
fn a_write_with_refunds_off_keeps_the_refund_fields() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    // An hour with a quarter of it left at least in the windows.
    let hour = common::an_hour(&server);
    runtime().block_on(async {
        let five = Policy::new(5, hour).unwrap();
        for (algorithm, plain_fields) in [
            (Algorithm::Gcra, 1),
            (Algorithm::FixedWindow, 3),
            (Algorithm::SlidingWindow, 4),
        ] {
            let with = on(&server, "off:", RedisLimiter::builder(algorithm, five)).await;
            let without = off(&server, "off:", RedisLimiter::builder(algorithm, five)).await;
            let k = format!("k-{algorithm:?}");
            let (v, r) = with.charge_n(&k, 2).await.unwrap();
            let r = r.unwrap_or_else(|| panic!("{algorithm:?}: a receipt: {v:?}"));
            let v = without.check_n(&k, 1).await.unwrap();
            assert!(v.decision().is_allowed(), "{algorithm:?}");
            let key = with.redis_keys(&k).remove(0);
            let state: String = server.cmd(&["GET", &key]);
            assert!(
                state.split(':').count() > plain_fields,
                "{algorithm:?}: {state}"
            );
            assert!(with.refund(&r).await.unwrap(), "{algorithm:?}");
            let left = without.peek_n(&k, 0).await.unwrap().decision().remaining();
            assert_eq!(left, 4, "{algorithm:?}");
        }
    });
}
