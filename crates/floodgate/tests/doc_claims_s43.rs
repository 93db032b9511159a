//! The keyed sliding log's eviction order as its module docs state it (session 43):
//! "a log evicted is the key whose loss forgives least (fewest units counting, then
//! fewest entries)". `review_s43_bound.rs` covers the first order (units) and the
//! ranking over the whole shard; this covers the second.

use std::time::Duration;

use floodgate::{KeyedBuilder, ManualClock, Policy};

/// A full shard of two keys, each with 2 units counting: "merged" in one entry (a
/// charge of 2), "spread" in two (two charges 1 ms apart). A third key evicts the
/// one of fewer entries, "merged"; "spread" keeps its 2 units.
///
/// Mutation seen failing: the weight's second field reversed
/// (`usize::MAX - ring.len()` where a sweep ranks and where an eviction re-checks a
/// ranked key): "spread" evicted instead.
#[test]
fn among_keys_of_equal_units_the_one_of_fewest_entries_is_evicted() {
    let clock = ManualClock::new();
    let log = KeyedBuilder::default()
        .capacity(2)
        .shards(1)
        .clock(clock.clone())
        .sliding_log::<&str>(Policy::per_second(5).expect("a valid policy"))
        .expect("a valid log");
    assert!(log.check_n(&"merged", 2).is_allowed());
    assert!(log.check(&"spread").is_allowed());
    clock.advance(Duration::from_millis(1));
    assert!(log.check(&"spread").is_allowed());
    assert_eq!(log.peek(&"merged", 0).remaining(), 3);
    assert_eq!(log.peek(&"spread", 0).remaining(), 3);
    assert!(log.check(&"new").is_allowed());
    assert_eq!(
        log.peek(&"merged", 0).remaining(),
        5,
        "merged (1 entry) was evicted"
    );
    assert_eq!(
        log.peek(&"spread", 0).remaining(),
        3,
        "spread (2 entries) is kept"
    );
    assert_eq!(log.metrics().evicted, 1);
}

/// `AsyncLimit`'s defaults (session 42, `async_limit.rs`): "The default checks and
/// returns an empty receipt …: a limit that cannot refund keeps every charge", and
/// "The default gives back nothing (`Ok(false)`)". An in-process limiter behind the
/// trait keeps the defaults: its charge of 2 is a plain check, and a refund of the
/// empty receipt gives nothing back.
///
/// Mutation seen failing: the default `charge_n` returning
/// `AsyncReceipt::new(())` (a charged receipt), and the default `refund` answering
/// `Ok(true)`.
#[test]
fn the_async_traits_defaults_keep_every_charge() {
    use floodgate::{AsyncLimit, RateLimiter};
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let limiter = RateLimiter::gcra_with_clock(
        Policy::per_hour(3).expect("a valid policy"),
        ManualClock::new(),
    );
    rt.block_on(async {
        let (d, receipt) = AsyncLimit::<()>::charge_n(&limiter, &(), 2)
            .await
            .expect("infallible");
        assert!(d.is_allowed());
        assert!(!receipt.is_charged(), "a limit without refunds: no receipt");
        let given = AsyncLimit::<()>::refund(&limiter, &(), receipt)
            .await
            .expect("infallible");
        assert!(!given, "the default refund gives nothing back");
    });
    assert_eq!(limiter.peek(0).remaining(), 1, "the charge of 2 stays");
}
