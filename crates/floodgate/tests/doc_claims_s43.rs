//! Promises of sessions 42–43 in floodgate that no other test pins down: the keyed
//! sliding log's eviction order as its module docs state it ("the key whose loss
//! forgives least (fewest units counting, then fewest entries)", "the evictions
//! until the next sweep take them lightest first"; `review_s43_bound.rs` covers the
//! order by units and the ranking over the whole shard), and `AsyncLimit`'s
//! defaults.

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

/// The keyed log's module docs: "each sweep ranks the eighth of the shard's keys
/// that are lightest, and the evictions until the next sweep take them lightest
/// first". A full shard of 16 keys, key `i` holding `i + 1` units: the sweep ranks
/// keys 0 and 1; the first insert evicts key 0, the second key 1 (from the same
/// ranking: the new key of 1 unit, unranked, stays) — never the heavier first.
///
/// Mutation seen failing: the sweep's `ranked.reverse()` dropped (`pop` then takes
/// the heaviest ranked key): key 1 evicted first.
#[test]
fn evictions_take_the_ranked_keys_lightest_first() {
    let log = KeyedBuilder::default()
        .capacity(16)
        .shards(1)
        .clock(ManualClock::new())
        .sliding_log::<u32>(Policy::per_second(20).expect("a valid policy"))
        .expect("a valid log");
    for key in 0..16u32 {
        assert!(log.check_n(&key, key + 1).is_allowed());
    }
    assert!(log.check(&100).is_allowed());
    assert_eq!(log.metrics().evicted, 1);
    assert_eq!(log.peek(&0, 0).remaining(), 20, "key 0 (1 unit) evicted");
    assert_eq!(log.peek(&1, 0).remaining(), 18, "key 1 (2 units) kept");
    assert!(log.check(&101).is_allowed());
    assert_eq!(log.metrics().evicted, 2);
    assert_eq!(log.peek(&1, 0).remaining(), 20, "key 1 evicted next");
    assert_eq!(
        log.peek(&100, 0).remaining(),
        19,
        "the unranked new key stays"
    );
    for key in 2..16u32 {
        assert_eq!(log.peek(&key, 0).remaining(), u64::from(19 - key));
    }
}
