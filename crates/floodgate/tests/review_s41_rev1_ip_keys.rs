//! Review (session 41, rev1) of `InlineKey for IpAddr` on inline storage: keys a
//! user actually writes into an `IpAddr` table besides client addresses — the
//! fallback key `0.0.0.0` of floodgate-http's `OnMissingKey` example, and the
//! group addresses of a coarse `IpGrouping` (`0.0.0.0` for an IPv4 /0, `::` for an
//! IPv6 /0) — are buckets of their own, as on heap storage.

use std::net::IpAddr;

use floodgate::{Gcra, Heap, Inline, KeyedBuilder, KeyedLimiter, ManualClock, Policy, Storage};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// One unit per hour for each key, a burst of 1: a key's second check in the same
/// instant is denied, another key's first is allowed.
fn per_ip<S: Storage<IpAddr, floodgate::GcraState>>() -> KeyedLimiter<IpAddr, Gcra, ManualClock, S>
{
    KeyedBuilder::new(Gcra::new(Policy::per_hour(1).unwrap()))
        .clock(ManualClock::new())
        .build_in::<IpAddr, S>()
        .unwrap()
}

/// Whether `b`'s first check is denied after `a` spent its burst: `a` and `b` share
/// a bucket.
fn share<S: Storage<IpAddr, floodgate::GcraState>>(a: &str, b: &str) -> bool {
    let limiter = per_ip::<S>();
    assert!(limiter.check(&ip(a)).is_allowed(), "{a}");
    !limiter.check(&ip(b)).is_allowed()
}

/// A rule's requests without a key share the fallback bucket `0.0.0.0` (the
/// layer's documented `OnMissingKey::Fallback(Ipv4Addr::UNSPECIFIED)`); a client on
/// the IPv6 loopback (a health check on `[::1]`) is a client of its own, not a
/// request without a key — on heap storage, and so on inline storage.
#[test]
fn an_ipv6_loopback_client_does_not_spend_the_fallback_bucket_of_0_0_0_0() {
    for client in ["::1", "::", "::a00:1"] {
        assert!(!share::<Heap>("0.0.0.0", client), "heap: {client}");
        assert!(!share::<Inline>("0.0.0.0", client), "inline: {client}");
    }
}

/// `IpGrouping` with an IPv6 prefix of /0 to /2 groups every global IPv6 client
/// (2000::/3) into `::`; with an IPv4 prefix of /0 to /7, `1.2.3.4` is grouped into
/// `0.0.0.0`. Two families, two buckets — on inline storage as on heap storage
/// (the /1 groups likewise).
#[test]
fn coarse_ipv4_and_ipv6_groups_stay_two_buckets_on_inline_storage() {
    for (v4_group, v6_group) in [("0.0.0.0", "::"), ("128.0.0.0", "8000::")] {
        assert!(!share::<Heap>(v4_group, v6_group));
        assert!(
            !share::<Inline>(v4_group, v6_group),
            "all IPv4 clients and all IPv6 clients share one bucket"
        );
        assert!(!share::<Inline>(v6_group, v4_group));
    }
}

/// The addresses an encoding of 64 bits must give to collisions are none a client
/// connects from nor any group address: IPv6 multicast (`ff00::/8`) is never a
/// source address. Every other address keeps its /64 apart from every IPv4 one.
#[test]
fn ipv4_clients_share_no_bucket_with_any_unicast_ipv6_network() {
    for (v4, v6) in [
        ("0.0.0.0", "::"),
        ("0.0.0.1", "::1"),
        ("10.0.0.1", "::a00:1"),
        ("10.0.0.1", "0:0:a00:1::"),
        ("10.0.0.1", "0:1:a00:1::"),
        ("192.0.2.7", "64:ff9b::c000:207"),
        ("192.0.2.7", "::ffff:0:c000:207"), // IPv4-translated (SIIT): IPv6, /64 `::`
        ("255.255.255.255", "ffff:fffe:ffff:ffff::"),
    ] {
        assert!(!share::<Inline>(v4, v6), "{v4} and {v6}");
        assert!(!share::<Inline>(v6, v4), "{v6} and {v4}");
    }
    // An IPv4-mapped address is its IPv4 address (an inline key canonicalizes; a
    // heap key is the address as given, which floodgate-http canonicalizes first).
    assert!(share::<Inline>("192.0.2.7", "::ffff:192.0.2.7"));
}
