//! GCRA refunds out of their charges' order (session 46): a refund of the
//! schedule's last booking moved nobody, so Redis, as the in-process limiter
//! since session 45, leaves it out of every later refund's shift (`gcra.lua`,
//! `lone_note`): refunds made latest booking first give everything back. Every
//! case runs on two Redis clients (limiters on connections of their own) sharing
//! one key and on the in-process limiter at the same readings, its refunds judged
//! at the latest reading a charge was admitted at, as Redis judges them
//! ([`common::AtLatestReading`]); every decision and every refund's answer must
//! be the same, and the schedule is checked in microseconds. See VERIFICATION.md,
//! "session 46: Redis GCRA refunds in any order".

mod common;

use common::{runtime, with_refunds, AtLatestReading, InProcess, Reading, RedisServer};
use floodgate::{Gcra, Nanos, Policy, RateLimiter, Receipt};
use floodgate_redis::{Algorithm, RedisLimiter, RedisReceipt};

/// T = 1 ms, B = 100: a refund is never clipped by the burst here (every booking
/// lies within `now + B·T`), so what it gives back is set by the order and the
/// clock alone.
fn policy() -> Policy {
    Policy::per_second(1000).unwrap().with_burst(100).unwrap()
}

/// 10 s in microseconds.
const TEN: u64 = 10_000_000;

/// A charge's receipts on both sides.
type Receipts = (Receipt, RedisReceipt);

/// Two Redis clients on one key and the in-process limiter they must agree with.
struct Twin {
    rt: tokio::runtime::Runtime,
    clients: [RedisLimiter; 2],
    local: AtLatestReading<RateLimiter<Gcra, Reading>>,
    key: &'static str,
}

impl Twin {
    fn new(server: &RedisServer, key: &'static str) -> Twin {
        let rt = runtime();
        let client = || {
            with_refunds(
                &rt,
                server,
                common::builder(Algorithm::Gcra, policy()),
                true,
            )
        };
        let clients = [client(), client()];
        let clock = Reading::default();
        let local =
            AtLatestReading::new(RateLimiter::gcra_with_clock(policy(), clock.clone()), clock);
        Twin {
            rt,
            clients,
            local,
            key,
        }
    }

    /// Sets the in-process clock to `us`.
    fn at(&self, us: u64) -> Nanos {
        let now = Nanos::new(us * 1_000);
        self.local.clock.set(now);
        now
    }

    /// Client `c` charges `cost` at `us`: admitted on both sides, the same
    /// schedule after it.
    fn charge(&self, c: usize, cost: u32, us: u64) -> Receipts {
        let now = self.at(us);
        let local = self.local.charge_at(now, cost);
        let (d, r) = self
            .rt
            .block_on(self.clients[c].charge_n_at_micros(self.key, cost, us))
            .unwrap();
        assert!(d.is_allowed() && local.is_charged(), "charge at {us}");
        assert_eq!(
            self.ahead(us),
            self.local_ahead(now),
            "after the charge at {us}"
        );
        (local, r.expect("admitted with a receipt"))
    }

    /// Client `c` gives `r` back at `us`: the same answer on both sides, the
    /// microseconds of schedule the key holds after it the same; returns the
    /// answer. The Redis receipt sent again by either client gives nothing more.
    fn refund(&self, c: usize, (r, rr): Receipts, us: u64) -> bool {
        let now = self.at(us);
        let back = self.local.refund(r);
        let remote = &self.clients[c];
        let rback = self.rt.block_on(remote.refund_at_micros(&rr, us)).unwrap();
        assert_eq!(rback, back, "refund at {us}");
        for again in &self.clients {
            assert!(!self.rt.block_on(again.refund_at_micros(&rr, us)).unwrap());
        }
        assert_eq!(
            self.ahead(us),
            self.local_ahead(now),
            "after the refund at {us}"
        );
        back
    }

    /// The schedule Redis holds ahead of `us` (the TAT less `us`, µs).
    fn ahead(&self, us: u64) -> u128 {
        let d = self
            .rt
            .block_on(self.clients[0].peek_n_at_micros(self.key, 0, us))
            .unwrap();
        d.reset_after().as_micros()
    }

    fn local_ahead(&self, now: Nanos) -> u128 {
        self.local.peek_at(now, 0).reset_after().as_micros()
    }
}

/// Three charges at 10 s (1, 2 and 1 ms of schedule, by alternating clients)
/// given back latest first: each refund is of the schedule's last booking, so
/// each gives back its whole booking and the key is empty again, as in process.
///
/// Fails if no refund is noted as having moved nobody (`if st.tat <= e0` →
/// `if false` in `gcra_refund`): the third refund reads A's booking shifted by
/// the other two's 3 ms, all of it below the clock, and gives back nothing.
#[test]
fn refunds_latest_booking_first_give_every_booking_back() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let t = Twin::new(&server, "latest-first");
    let a = t.charge(0, 1, TEN);
    let b = t.charge(1, 2, TEN);
    let c = t.charge(0, 1, TEN);
    assert_eq!(t.ahead(TEN), 4_000);
    assert!(t.refund(1, c, TEN));
    assert_eq!(t.ahead(TEN), 3_000);
    assert!(t.refund(0, b, TEN));
    assert_eq!(t.ahead(TEN), 1_000);
    assert!(t.refund(1, a, TEN));
    assert_eq!(t.ahead(TEN), 0);
}

/// A refund with a booking after its own still counts in later shifts: A, B, C
/// at 10 s, A given back at 10 s (B and C move down by 1 ms), then B at 10.0005
/// s. B now lies at [10, 10.001) s, half of it passed: 0.5 ms back, 1.5 ms left
/// ahead of 10.0005 s. Then C (the last booking, [10.0005, 10.0015) s after
/// both moves) gives back its 1 ms.
///
/// Fails if every refund is noted as having moved nobody (`if st.tat <= e0` →
/// `if true`): B's refund reads B where it was charged, [10.001, 10.002) s, and
/// gives back 1 ms, leaving 0.5 ms ahead where C still holds 1 ms — 0.5 ms of
/// C's schedule handed out again.
#[test]
fn a_refund_that_moved_a_later_booking_still_counts() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let t = Twin::new(&server, "moved");
    let a = t.charge(0, 1, TEN);
    let b = t.charge(1, 1, TEN);
    let c = t.charge(0, 1, TEN);
    assert!(t.refund(0, a, TEN));
    assert_eq!(t.ahead(TEN), 2_000);
    assert!(t.refund(1, b, TEN + 500));
    assert_eq!(t.ahead(TEN + 500), 1_000);
    assert!(t.refund(0, c, TEN + 500));
    assert_eq!(t.ahead(TEN + 500), 0);
}

/// A refund that moved nobody counts in no later shift, but only in those of
/// receipts charged before it: A at 10 s given back (the last booking, noted),
/// the TAT falls behind the clock, B, C, D charged at 10.5 s from the clock
/// (each noting the ledger with A's 1 ms), B given back (C and D move down),
/// then C at 10.5005 s: C lies at [10.5, 10.501) s, 0.5 ms back, and the TAT at
/// 10.5015 s; then D, the last booking, its 1 ms.
///
/// Fails if a note counts for a receipt charged after it (`if before >= noted`
/// → `if true` in `lone_since`): C's shift loses A's 1 ms (its note is not
/// after C's charge), 0 where B's refund moved it 1 ms, and C gives back 1 ms,
/// the TAT at 10.501 s.
#[test]
fn a_refund_that_moved_nobody_counts_only_for_receipts_charged_before_it() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let t = Twin::new(&server, "behind");
    let a = t.charge(0, 1, TEN);
    assert!(t.refund(1, a, TEN));
    assert_eq!(t.ahead(TEN), 0);
    let now = TEN + 500_000;
    let b = t.charge(1, 1, now);
    let c = t.charge(0, 1, now);
    let d = t.charge(1, 1, now);
    assert!(t.refund(0, b, now));
    assert_eq!(t.ahead(now), 2_000);
    assert!(t.refund(1, c, now + 500));
    assert_eq!(t.ahead(now + 500), 1_000);
    assert!(t.refund(0, d, now + 500));
    assert_eq!(t.ahead(now + 500), 0);
}

/// A server clock that steps back: A and B at 10 s, C at 10.0015 s (the key's
/// latest reading), then C, B and A given back at a `TIME` of 9.999 s, judged
/// at 10.0015 s. C (the last booking) gives back its 1 ms, B, now the last
/// booking, gives back the 0.5 ms of [10.001, 10.002) s still ahead of the
/// reading, A nothing (its booking has passed the reading): the TAT stays at
/// the reading, never below it, as in process on a clock in order.
///
/// Fails if a refund is judged at `TIME` (the clamp to `st.reading` dropped from
/// `gcra_refund`): B gives back 1 ms and A 0.5 ms, the TAT at 10 s.
#[test]
fn refunds_at_a_time_stepped_back_stay_at_the_latest_reading() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let t = Twin::new(&server, "back");
    let a = t.charge(0, 1, TEN);
    let b = t.charge(1, 1, TEN);
    let c = t.charge(0, 1, TEN + 1_500);
    assert_eq!(t.ahead(TEN + 1_500), 1_500);
    let back = TEN - 1_000;
    assert!(t.refund(1, c, back));
    assert!(t.refund(0, b, back));
    assert!(!t.refund(1, a, back));
    assert_eq!(t.ahead(TEN + 1_500), 0);
    assert_eq!(t.ahead(TEN), 1_500);
}

/// Receipt ids stay unique: a refund that moved nobody still adds what it gave
/// back to the ledger every charge notes, so a charge booked where the refunded
/// one was (the TAT back at 10 s) carries another id and refunds; the first
/// receipt, sent again, gives nothing (checked in [`Twin::refund`]).
///
/// Fails if such a refund leaves the ledger as it was and writes no note (the
/// ledger of refunds that moved a booking only: `fmt(st.ledger + back)` →
/// `fmt(st.ledger + (st.tat <= e0 and 0 or back))` and `if st.tat <= e0` →
/// `if false` in `gcra_refund`, which passes every other test here): the second
/// charge notes the same ledger and ends at the same TAT, its id is the
/// first's, and its refund gives nothing.
#[test]
fn a_charge_booked_where_a_refunded_one_was_refunds_too() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let t = Twin::new(&server, "again");
    for client in [0, 1, 0] {
        let r = t.charge(client, 1, TEN);
        assert_eq!(t.ahead(TEN), 1_000);
        assert!(t.refund(1 - client, r, TEN));
        assert_eq!(t.ahead(TEN), 0);
    }
}

/// Notes no script writes (one that gives back nothing, one past the ledger,
/// two out of ledger order, one past 2^53) on the second limit of a multi-limit
/// key fail the multi-limit refund (`multi_refund.lua`) with an error naming that
/// key and write nothing on either key; with a sound note in their place (the
/// ledger's 10 µs given back by a refund that moved nobody, after the charge)
/// the refund gives back, once.
///
/// Fails if `lone_since` drops its checks (the `if before >= EXACT or …` reply):
/// the first state refunds, its note counting nothing.
#[test]
fn a_note_outside_the_ledger_is_malformed_and_writes_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let (l, keys, r) = common::two_gcra_limits_charged(&rt, &server, policy(), "m", TEN);
    rt.block_on(async {
        let first: String = server.cmd(&["GET", &keys[0]]);
        let state: String = server.cmd(&["GET", &keys[1]]);
        let f: Vec<&str> = state.split(':').collect();
        assert_eq!((f.len(), f[1]), (6, "0"), "{state}");
        // The ledger set to 10 µs (refunds since the charge, as the key tells
        // it), which the notes below claim parts of.
        let head = format!("{}:10:{}:{}:{}:{}", f[0], f[2], f[3], f[4], f[5]);
        let huge = "9".repeat(400);
        for notes in [
            "0/1/3/0".to_owned(),
            "0/1/5/6".to_owned(),
            "0/1/4/2,0/1/5/1".to_owned(),
            format!("0/1/{huge}/1"),
        ] {
            let bad = format!("{head},{notes}");
            let _: () = server.cmd(&["SET", &keys[1], &bad]);
            let e = l
                .refund_at_micros(&r, TEN)
                .await
                .expect_err(&bad)
                .to_string();
            assert!(
                e.contains("malformed state at key") && e.contains(&keys[1]),
                "{bad}: {e}"
            );
            assert_eq!(server.cmd::<String>(&["GET", &keys[1]]), bad);
            assert_eq!(server.cmd::<String>(&["GET", &keys[0]]), first);
        }
        let _: () = server.cmd(&["SET", &keys[1], &format!("{head},0/1/0/10")]);
        assert!(l.refund_at_micros(&r, TEN).await.unwrap());
        assert!(!l.refund_at_micros(&r, TEN).await.unwrap());
    });
}
