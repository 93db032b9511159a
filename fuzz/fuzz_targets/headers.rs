//! floodgate-http's extractors and renderers on arbitrary input: never a panic, and
//! what they produce is well formed.
//!
//! * forwarded-IP extraction (`X-Forwarded-For` and RFC 7239 `Forwarded`, any bytes,
//!   any number of lines, any hop count): an untrusted peer is always its own client;
//!   a result is always canonical;
//! * the API-key extractor: a key is non-empty visible ASCII within the bound;
//! * policy names and the IETF renderers: every accepted name renders to a valid
//!   header value whose integers stay within the Structured Field range;
//! * `Retry-After` from any decision: absent when allowed or never, at least 1 else;
//! * IP grouping is idempotent for any prefix.
#![no_main]

use arbitrary::Arbitrary;
use floodgate::Decision;
use floodgate_http::{
    legacy_headers, render_limit, render_policy, retry_after, ForwardedIp, HeaderKey,
    IpGrouping, KeyExtractor, LimitItem, PolicyItem, PolicyName, ResetFormat, TrustedProxies,
    MAX_SF_INTEGER,
};
use http::{HeaderMap, HeaderValue, Request};
use libfuzzer_sys::fuzz_target;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, UNIX_EPOCH};

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    peer: [u8; 16],
    peer_is_v4: bool,
    hops: u8,
    forwarded_lines: Vec<&'a [u8]>,
    use_rfc7239: bool,
    api_keys: Vec<&'a [u8]>,
    name: &'a str,
    numbers: [u64; 4],
    allowed: bool,
    retry: Option<u64>,
    v4_prefix: u8,
    v6_prefix: u8,
    pk: Option<[u8; 16]>,
}

fuzz_target!(|input: Input<'_>| {
    let peer = if input.peer_is_v4 {
        IpAddr::V4(Ipv4Addr::new(input.peer[0], input.peer[1], input.peer[2], input.peer[3]))
    } else {
        IpAddr::V6(Ipv6Addr::from(input.peer))
    };
    let trusted = TrustedProxies::new(["10.0.0.0/8", "fd00::/8", "127.0.0.1"]).unwrap();
    let name = if input.use_rfc7239 { "forwarded" } else { "x-forwarded-for" };
    let mut headers = HeaderMap::new();
    for line in &input.forwarded_lines {
        if let Ok(v) = HeaderValue::from_bytes(line) {
            headers.append(name, v);
        }
    }
    let hops = usize::from(input.hops % 8);
    let extractor = if input.use_rfc7239 {
        ForwardedIp::forwarded(trusted.clone(), hops)
    } else {
        ForwardedIp::x_forwarded_for(trusted.clone(), hops)
    };
    match extractor.client_ip(peer, &headers) {
        Ok(ip) => {
            assert_eq!(ip, ip.to_canonical());
            if hops == 0 || !trusted.contains(peer) {
                assert_eq!(ip, peer.to_canonical());
            }
        }
        Err(e) => {
            assert!(hops > 0 && trusted.contains(peer), "{e}");
            assert!(!e.to_string().is_empty());
        }
    }

    let mut req = Request::new(());
    for key in &input.api_keys {
        if let Ok(v) = HeaderValue::from_bytes(key) {
            req.headers_mut().append("x-api-key", v);
        }
    }
    let (parts, ()) = req.into_parts();
    if let Ok(key) = HeaderKey::new("x-api-key").unwrap().max_len(64).unwrap().extract(&parts) {
        assert!(!key.is_empty() && key.len() <= 64);
        assert!(key.bytes().all(|b| (0x20..0x7f).contains(&b) || b == b'\t'));
    }

    if let Ok(name) = PolicyName::new(input.name) {
        let [q, w, r, t] = input.numbers;
        let pk = input.pk.as_ref().map(|k| &k[..]);
        let mut policy = String::new();
        render_policy(&mut policy, &[PolicyItem { name: &name, quota: q, window: Some(w), partition_key: pk }]);
        let mut limit = String::new();
        render_limit(&mut limit, &[LimitItem { name: &name, remaining: r, reset: t, partition_key: pk }]);
        for field in [&policy, &limit] {
            assert!(HeaderValue::from_str(field).is_ok(), "{field:?}");
            assert!(field.starts_with('"'));
            // Every parameter after the name's closing quote is `;k=<int>` or `;pk=:<b64>:`.
            let name_len = field[1..]
                .char_indices()
                .scan(false, |escaped, (i, c)| {
                    let end = !*escaped && c == '"';
                    *escaped = !*escaped && c == '\\';
                    Some((i, end))
                })
                .find(|&(_, end)| end)
                .map(|(i, _)| i)
                .expect("closing quote");
            for param in field[name_len + 2..].split(';').skip(1) {
                let (k, v) = param.split_once('=').expect("k=v");
                if k == "pk" {
                    assert!(v.starts_with(':') && v.ends_with(':') && v.len() == 26);
                } else {
                    let n: u64 = v.parse().expect("integer");
                    assert!(n <= MAX_SF_INTEGER);
                }
            }
        }
    }

    let [limit, remaining, reset, _] = input.numbers;
    let d = Decision::new(
        input.allowed,
        limit,
        remaining,
        Duration::from_nanos(reset),
        input.retry.map(Duration::from_nanos),
    );
    match retry_after(&d) {
        Some(v) => {
            assert!(!d.is_allowed());
            let secs: u64 = v.to_str().unwrap().parse().unwrap();
            assert!(secs >= 1);
        }
        None => assert!(d.is_allowed() || d.retry_after().is_none()),
    }
    let mut out = HeaderMap::new();
    let now = UNIX_EPOCH.checked_add(Duration::from_nanos(reset)).unwrap_or(UNIX_EPOCH);
    legacy_headers(&mut out, &d, ResetFormat::UnixEpoch, now);
    legacy_headers(&mut out, &d, ResetFormat::Seconds, UNIX_EPOCH);

    if let Ok(g) = IpGrouping::default().v4_prefix(input.v4_prefix % 40) {
        if let Ok(g) = g.v6_prefix(input.v6_prefix % 140) {
            let once = g.group(peer);
            assert_eq!(g.group(once), once);
        }
    }
});
