//! The layer over real HTTP/1.1 on loopback: an axum (or plain hyper) server on port
//! 0, a raw `TcpStream` client (so it can send any bytes), time from `ManualClock`.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use floodgate::{
    AsyncLimit, Decision, Gcra, KeyedBuilder, KeyedLimiter, ManualClock, Policy, RateLimiter,
};
use floodgate_http::{
    ForwardedIp, Global, HeaderKey, HeaderOptions, IpGrouping, KeyExtractor, OnLimiterError,
    OnMissingKey, PartitionKeyHasher, PeerAddr, PeerIp, RateLimitLayer, ResetFormat, RoutePath,
    Rule, Strategy, TrustedProxies,
};
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower::{Layer, Service};

mod common;
use common::{Down, Hello, TestResult};

/// `ConnectInfo<SocketAddr>`, as axum's `into_make_service_with_connect_info` inserts it.
fn connect_info(ext: &http::Extensions) -> Option<IpAddr> {
    ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip())
}

fn peer_ip() -> PeerIp {
    PeerIp::new().lookup(connect_info)
}

fn keyed<K: std::hash::Hash + Eq + Send + Sync + 'static>(
    policy: Policy,
    clock: &ManualClock,
) -> KeyedLimiter<K, Gcra, ManualClock> {
    KeyedBuilder::new(Gcra::new(policy))
        .clock(clock.clone())
        .build()
        .expect("test limiter")
}

/// A layer of one rule, `name`: `policy` per client IP under `strategy`, the IP taken
/// by `extractor`, with `headers`.
fn ip_layer<E: KeyExtractor<Key = IpAddr>>(
    name: &str,
    policy: Policy,
    strategy: Strategy,
    clock: &ManualClock,
    extractor: E,
    headers: HeaderOptions,
) -> Result<RateLimitLayer, Box<dyn std::error::Error>> {
    let rule = Rule::new(name, keyed::<IpAddr>(policy, clock), extractor)?.strategy(strategy);
    Ok(RateLimitLayer::builder()
        .rule(rule)
        .headers(headers)
        .build()?)
}

/// [`ip_layer`]: a hard rule "client" of `per_minute` requests, default headers.
fn client_layer<E: KeyExtractor<Key = IpAddr>>(
    per_minute: u64,
    clock: &ManualClock,
    extractor: E,
) -> Result<RateLimitLayer, Box<dyn std::error::Error>> {
    let policy = Policy::per_minute(per_minute)?;
    let headers = HeaderOptions::default();
    ip_layer("client", policy, Strategy::Hard, clock, extractor, headers)
}

/// Serves `layer` around `GET /` and `GET /other` on 127.0.0.1:0.
async fn serve(layer: RateLimitLayer, with_connect_info: bool) -> SocketAddr {
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/other", get(|| async { "other" }))
        .layer(layer);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        if with_connect_info {
            let svc = app.into_make_service_with_connect_info::<SocketAddr>();
            axum::serve(listener, svc).await
        } else {
            axum::serve(listener, app).await
        }
    });
    addr
}

struct Reply {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| std::str::from_utf8(v).expect("ASCII header"))
    }

    fn num(&self, name: &str) -> u64 {
        self.header(name)
            .unwrap_or_else(|| panic!("no {name} in {:?}", self.header_names()))
            .parse()
            .expect("integer header")
    }

    fn header_names(&self) -> Vec<&str> {
        self.headers.iter().map(|(n, _)| n.as_str()).collect()
    }
}

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {:?} {:?}",
            self.status,
            self.header_names(),
            self.body
        )
    }
}

/// One HTTP/1.1 request with raw header lines; reads the whole reply.
async fn send(addr: SocketAddr, path: &str, headers: &[(&str, &[u8])]) -> Reply {
    let mut req =
        format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n").into_bytes();
    for (name, value) in headers {
        req.extend_from_slice(name.as_bytes());
        req.extend_from_slice(b": ");
        req.extend_from_slice(value);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"\r\n");
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(&req).await.expect("write");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read");
    parse_reply(&raw)
}

fn parse_reply(raw: &[u8]) -> Reply {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("end of head");
    let head = &raw[..end];
    let mut lines = head
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let status_line = std::str::from_utf8(lines.next().expect("status line")).expect("ASCII");
    let status = status_line
        .split(' ')
        .nth(1)
        .expect("status code")
        .parse()
        .expect("numeric status");
    let headers = lines
        .map(|l| {
            let colon = l.iter().position(|&b| b == b':').expect("header colon");
            let name = String::from_utf8_lossy(&l[..colon]).to_ascii_lowercase();
            let value = l[colon + 1..].trim_ascii().to_vec();
            (name, value)
        })
        .collect();
    let body = String::from_utf8_lossy(&raw[end + 4..]).into_owned();
    Reply {
        status,
        headers,
        body,
    }
}

/// A parsed Structured Field list of items with parameters:
/// `"name";k=v;k=v, "other";k=v`.
fn sf_list(value: &str) -> Vec<(String, Vec<(String, String)>)> {
    value
        .split(',')
        .map(|member| {
            let mut parts = member.trim().split(';');
            let name = parts.next().expect("item");
            let name = name
                .strip_prefix('"')
                .and_then(|n| n.strip_suffix('"'))
                .unwrap_or_else(|| panic!("item {name:?} is not an sf-string"));
            let params = parts
                .map(|p| {
                    let (k, v) = p.split_once('=').expect("parameter with a value");
                    (k.to_owned(), v.to_owned())
                })
                .collect();
            (name.to_owned(), params)
        })
        .collect()
}

fn sf_param<'a>(
    list: &'a [(String, Vec<(String, String)>)],
    item: &str,
    key: &str,
) -> Option<&'a str> {
    list.iter()
        .find(|(n, _)| n == item)?
        .1
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn headers_on_2xx_and_429_parse_back() -> TestResult {
    let clock = ManualClock::new();
    let policy = Policy::per_minute(2)?; // T = 30 s, B = 2, window 60 s
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("per-ip", keyed::<IpAddr>(policy, &clock), peer_ip())?.window_of(&policy))
        .build()?;
    let addr = serve(layer.clone(), true).await;

    let r = send(addr, "/", &[]).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, "ok");
    assert_eq!(r.num("x-ratelimit-limit"), 2);
    assert_eq!(r.num("x-ratelimit-remaining"), 1);
    assert_eq!(r.num("x-ratelimit-reset"), 30);
    assert_eq!(r.header("ratelimit-policy"), Some(r#""per-ip";q=2;w=60"#));
    assert_eq!(r.header("ratelimit"), Some(r#""per-ip";r=1;t=30"#));
    assert_eq!(r.header("retry-after"), None);

    let r = send(addr, "/", &[]).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.num("x-ratelimit-remaining"), 0);
    let limit = sf_list(r.header("ratelimit").expect("RateLimit"));
    assert_eq!(sf_param(&limit, "per-ip", "r"), Some("0"));
    assert_eq!(sf_param(&limit, "per-ip", "t"), Some("60"));

    let r = send(addr, "/", &[]).await;
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.num("retry-after"), 30);
    assert_eq!(r.num("x-ratelimit-limit"), 2);
    assert_eq!(r.num("x-ratelimit-remaining"), 0);
    assert_eq!(r.num("x-ratelimit-reset"), 60);
    let policy_list = sf_list(r.header("ratelimit-policy").expect("RateLimit-Policy"));
    assert_eq!(sf_param(&policy_list, "per-ip", "q"), Some("2"));
    assert_eq!(sf_param(&policy_list, "per-ip", "w"), Some("60"));
    assert!(r.body.contains("per-ip"), "{r:?}");
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));

    clock.advance(Duration::from_secs(30));
    let r = send(addr, "/", &[]).await;
    assert_eq!(r.status, 200, "{r:?}");

    let stats = layer.rule_stats("per-ip").expect("rule");
    assert_eq!((stats.allowed, stats.denied), (3, 1));
    Ok(())
}

#[tokio::test]
async fn retry_after_rounds_up() -> TestResult {
    let clock = ManualClock::new();
    let policy = Policy::new(1, Duration::from_secs(2))?; // one per 2 s, burst 1
    let layer = RateLimitLayer::builder()
        .rule(Rule::new(
            "slow",
            RateLimiter::gcra_with_clock(policy, clock.clone()),
            Global,
        )?)
        .build()?;
    let addr = serve(layer, false).await;
    assert_eq!(send(addr, "/", &[]).await.status, 200);
    clock.advance(Duration::from_millis(100));
    let r = send(addr, "/", &[]).await; // 1.9 s to wait
    assert_eq!(
        (r.status, r.header("retry-after")),
        (429, Some("2")),
        "{r:?}"
    );
    clock.advance(Duration::from_millis(1_600));
    let r = send(addr, "/", &[]).await; // 300 ms to wait
    assert_eq!(
        (r.status, r.header("retry-after")),
        (429, Some("1")),
        "{r:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_request_that_never_fits_has_no_retry_after() -> TestResult {
    use floodgate::keyed::plans::{PlanLimiter, Plans};

    // A cost above the key's plan's burst, within another plan's: the layer builds
    // (some plan admits the cost) and says "not on your plan" to the tiny plan's
    // keys with the never-fits status.
    let clock = ManualClock::new();
    let mut plans = Plans::new();
    let tiny = plans.insert("tiny", Policy::per_second(2)?);
    plans.insert("roomy", Policy::per_second(10)?);
    let big = |never_status| -> Result<RateLimitLayer, Box<dyn std::error::Error>> {
        let limiter = PlanLimiter::new(
            &plans,
            move |_: &()| tiny,
            KeyedBuilder::default().clock(clock.clone()),
        )?;
        Ok(RateLimitLayer::builder()
            .rule(Rule::new("big", limiter, Global)?.cost(3))
            .never_status(never_status)
            .build()?)
    };
    let layer = big(StatusCode::TOO_MANY_REQUESTS)?;
    let addr = serve(layer.clone(), false).await;
    let r = send(addr, "/", &[]).await;
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.header("retry-after"), None);
    assert!(r.body.contains("can never be admitted"), "{r:?}");
    assert_eq!(r.num("x-ratelimit-limit"), 2);
    assert_eq!(layer.stats()[0].denied, 1);

    let addr = serve(big(StatusCode::PAYLOAD_TOO_LARGE)?, false).await;
    let r = send(addr, "/", &[]).await;
    assert_eq!((r.status, r.header("retry-after")), (413, None), "{r:?}");
    Ok(())
}

#[tokio::test]
async fn shadow_never_blocks_but_counts() -> TestResult {
    let clock = ManualClock::new();
    let policy = Policy::per_minute(1)?;
    let trial = |headers| {
        ip_layer(
            "trial",
            policy,
            Strategy::Shadow,
            &clock,
            peer_ip(),
            headers,
        )
    };
    let layer = trial(HeaderOptions::default())?;
    let addr = serve(layer.clone(), true).await;
    for _ in 0..3 {
        let r = send(addr, "/", &[]).await;
        assert_eq!(r.status, 200, "{r:?}");
        // A shadow rule alters no header by default.
        for h in [
            "ratelimit",
            "ratelimit-policy",
            "x-ratelimit-limit",
            "x-ratelimit-exceeded",
            "retry-after",
        ] {
            assert_eq!(r.header(h), None, "{h} in {r:?}");
        }
    }
    let s = layer.rule_stats("trial").expect("rule");
    assert_eq!((s.allowed, s.shadow, s.denied, s.soft), (1, 2, 0, 0));

    // Shown when asked.
    let layer = trial(HeaderOptions::default().include_shadow(true))?;
    let addr = serve(layer, true).await;
    let r = send(addr, "/", &[]).await;
    assert_eq!(r.header("ratelimit"), Some(r#""trial";r=0;t=60"#), "{r:?}");
    Ok(())
}

#[tokio::test]
async fn soft_passes_and_is_marked() -> TestResult {
    let clock = ManualClock::new();
    let policy = Policy::per_minute(1)?;
    let layer = ip_layer(
        "soft cap",
        policy,
        Strategy::Soft,
        &clock,
        peer_ip(),
        HeaderOptions::default(),
    )?;
    let addr = serve(layer.clone(), true).await;
    let r = send(addr, "/", &[]).await;
    assert_eq!(
        (r.status, r.header("x-ratelimit-exceeded")),
        (200, None),
        "{r:?}"
    );
    let r = send(addr, "/", &[]).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, "ok");
    assert_eq!(r.header("x-ratelimit-exceeded"), Some(r#""soft cap""#));
    assert_eq!(r.header("warning"), None);
    assert_eq!(r.header("retry-after"), None);
    assert_eq!(r.num("x-ratelimit-remaining"), 0);
    let s = layer.rule_stats("soft cap").expect("rule");
    assert_eq!((s.allowed, s.soft, s.denied), (1, 1, 0));
    Ok(())
}

#[tokio::test]
async fn several_rules_stop_at_the_first_hard_denial() -> TestResult {
    let clock = ManualClock::new();
    let per_client = Policy::per_minute(1)?;
    let per_endpoint = Policy::per_minute(100)?;
    let global = Policy::per_second(1_000)?;
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::new("client", keyed::<IpAddr>(per_client, &clock), peer_ip())?
                .window_of(&per_client),
        )
        .rule(Rule::new(
            "endpoint",
            keyed::<String>(per_endpoint, &clock),
            RoutePath::new(),
        )?)
        .rule(
            Rule::new(
                "global",
                RateLimiter::gcra_with_clock(global, clock.clone()),
                Global,
            )?
            .window_of(&global),
        )
        .build()?;
    let addr = serve(layer.clone(), true).await;
    let r = send(addr, "/", &[]).await;
    assert_eq!(r.status, 200);
    let list = sf_list(r.header("ratelimit").expect("RateLimit"));
    let names: Vec<&str> = list.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["client", "endpoint", "global"]);
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(r#""client";q=1;w=60, "endpoint";q=100, "global";q=1000;w=1"#)
    );
    // The legacy trio shows the tightest rule.
    assert_eq!(r.num("x-ratelimit-limit"), 1);

    let r = send(addr, "/other", &[]).await;
    assert_eq!(r.status, 429, "{r:?}");
    // The walk stopped at "client": nothing after it was charged or counted.
    let stats = layer.stats();
    assert_eq!((stats[0].allowed, stats[0].denied), (1, 1));
    assert_eq!((stats[1].allowed, stats[2].allowed), (1, 1));
    assert_eq!(sf_list(r.header("ratelimit").expect("RateLimit")).len(), 1);
    Ok(())
}

/// A partition-key hasher, so a test can see which key a rule used.
fn pk_of(hasher: &PartitionKeyHasher, ip: &str) -> String {
    let bytes = hasher.hash(&ip.parse::<IpAddr>().expect("test address"));
    let mut s = String::from(":");
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            s.push(if i <= c.len() {
                char::from(A[((n >> shift) & 63) as usize])
            } else {
                '='
            });
        }
    }
    s.push(':');
    s
}

async fn forwarded_server(
    trusted: &[&str],
    hops: usize,
    hasher: &PartitionKeyHasher,
) -> Result<SocketAddr, Box<dyn std::error::Error>> {
    let clock = ManualClock::new();
    let xff =
        ForwardedIp::x_forwarded_for(TrustedProxies::new(trusted)?, hops).lookup(connect_info);
    let layer = ip_layer(
        "client",
        Policy::per_minute(100)?,
        Strategy::Hard,
        &clock,
        xff,
        HeaderOptions::default().partition_key(hasher.clone()),
    )?;
    Ok(serve(layer, true).await)
}

fn pk_in(r: &Reply) -> String {
    let list = sf_list(
        r.header("ratelimit")
            .unwrap_or_else(|| panic!("no RateLimit in {r:?}")),
    );
    sf_param(&list, "client", "pk").expect("pk").to_owned()
}

#[tokio::test]
async fn forwarded_ip_hops_trust_and_spoofing() -> TestResult {
    let hasher = PartitionKeyHasher::new([9; 16]);
    let xff: &[(&str, &[u8])] = &[("x-forwarded-for", b"6.6.6.6, 203.0.113.7, 127.0.0.9")];

    // (trusted networks, hops, the client the rule must key on):
    // 0 hops: the peer, whatever the header says; 1 hop: the entry our (trusted) peer
    // appended; 2 (or more) hops: 127.0.0.9 is a trusted proxy, so the client is the
    // entry before it, and the spoofed leftmost 6.6.6.6 is never used; a peer
    // (127.0.0.1) outside the trusted networks: the header is ignored.
    for (trusted, hops, client) in [
        ("127.0.0.0/8", 0, "127.0.0.1"),
        ("127.0.0.0/8", 1, "127.0.0.9"),
        ("127.0.0.0/8", 2, "203.0.113.7"),
        ("127.0.0.0/8", 9, "203.0.113.7"),
        ("10.0.0.0/8", 2, "127.0.0.1"),
    ] {
        let addr = forwarded_server(&[trusted], hops, &hasher).await?;
        assert_eq!(
            pk_in(&send(addr, "/", xff).await),
            pk_of(&hasher, client),
            "trusting {trusted}, {hops} hops"
        );
    }

    // RFC 7239 `Forwarded`.
    let clock = ManualClock::new();
    let fwd = ForwardedIp::forwarded(TrustedProxies::new(["127.0.0.0/8"])?, 1).lookup(connect_info);
    let layer = ip_layer(
        "client",
        Policy::per_minute(100)?,
        Strategy::Hard,
        &clock,
        fwd,
        HeaderOptions::default().partition_key(hasher.clone()),
    )?;
    let addr = serve(layer, true).await;
    let r = send(
        addr,
        "/",
        &[(
            "forwarded",
            br#"for=6.6.6.6, for="[2001:db8::7]:443";proto=https"#,
        )],
    )
    .await;
    assert_eq!(pk_in(&r), pk_of(&hasher, "2001:db8::"));
    Ok(())
}

#[tokio::test]
async fn a_trusted_peer_without_the_header_is_keyed_on_itself_when_asked() -> TestResult {
    let hasher = PartitionKeyHasher::new([9; 16]);
    let headers = HeaderOptions::default().partition_key(hasher.clone());
    let layer =
        |trusted: &str, lenient: bool| -> Result<RateLimitLayer, Box<dyn std::error::Error>> {
            let xff = ForwardedIp::x_forwarded_for(TrustedProxies::new([trusted])?, 1)
                .lookup(connect_info);
            let xff = if lenient {
                xff.peer_when_header_absent()
            } else {
                xff
            };
            let policy = Policy::per_minute(1)?;
            ip_layer(
                "client",
                policy,
                Strategy::Hard,
                &ManualClock::new(),
                xff,
                headers.clone(),
            )
        };
    let client: &[(&str, &[u8])] = &[("x-forwarded-for", b"203.0.113.7")];

    // On, the peer (127.0.0.1) trusted: its own requests are one bucket, limited as one.
    let on = layer("127.0.0.0/8", true)?;
    let addr = serve(on.clone(), true).await;
    let r = send(addr, "/", &[]).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(pk_in(&r), pk_of(&hasher, "127.0.0.1"));
    assert_eq!(send(addr, "/", &[]).await.status, 429);
    // A forwarded client keeps its own bucket, apart from the proxy's.
    let r = send(addr, "/", client).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(pk_in(&r), pk_of(&hasher, "203.0.113.7"));
    // A present but malformed header is still a 400.
    let r = send(addr, "/", &[("x-forwarded-for", b"999.0.0.1")]).await;
    assert_eq!(r.status, 400, "{r:?}");
    let s = on.stats();
    assert_eq!((s[0].allowed, s[0].denied, s[0].bad_key), (2, 1, 1));

    // Off (the default): the same request is a 400 for its missing key.
    let addr = serve(layer("127.0.0.0/8", false)?, true).await;
    let r = send(addr, "/", &[]).await;
    assert_eq!(r.status, 400, "{r:?}");
    assert!(
        r.body.contains("missing client key: X-Forwarded-For"),
        "{r:?}"
    );

    // An untrusted peer is its own key, header or not, with the option or without.
    for lenient in [true, false] {
        let addr = serve(layer("10.0.0.0/8", lenient)?, true).await;
        let r = send(addr, "/", client).await;
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(pk_in(&r), pk_of(&hasher, "127.0.0.1"), "lenient: {lenient}");
        assert_eq!(send(addr, "/", &[]).await.status, 429, "lenient: {lenient}");
    }
    Ok(())
}

#[tokio::test]
async fn ipv6_prefix_grouping_and_ipv4_mapped() -> TestResult {
    let clock = ManualClock::new();
    let xff =
        ForwardedIp::x_forwarded_for(TrustedProxies::new(["127.0.0.1"])?, 1).lookup(connect_info);
    let layer = client_layer(1, &clock, xff)?;
    let addr = serve(layer, true).await;
    let from = |ip: &'static str| [("x-forwarded-for", ip.as_bytes())];
    assert_eq!(send(addr, "/", &from("2001:db8:1:2::1")).await.status, 200);
    // Same /64: same bucket.
    assert_eq!(
        send(addr, "/", &from("2001:db8:1:2:ffff::9")).await.status,
        429
    );
    // Next /64: its own bucket.
    assert_eq!(send(addr, "/", &from("2001:db8:1:3::1")).await.status, 200);
    // IPv4-mapped IPv6 is its IPv4 address.
    assert_eq!(send(addr, "/", &from("192.0.2.1")).await.status, 200);
    assert_eq!(send(addr, "/", &from("::ffff:192.0.2.1")).await.status, 429);

    // /128 when asked: each address its own bucket.
    let xff = ForwardedIp::x_forwarded_for(TrustedProxies::new(["127.0.0.1"])?, 1)
        .lookup(connect_info)
        .grouping(IpGrouping::default().v6_prefix(128)?);
    let layer = client_layer(1, &clock, xff)?;
    let addr = serve(layer, true).await;
    assert_eq!(send(addr, "/", &from("2001:db8::1")).await.status, 200);
    assert_eq!(send(addr, "/", &from("2001:db8::2")).await.status, 200);
    Ok(())
}

#[tokio::test]
async fn bad_input_gets_a_clear_answer() -> TestResult {
    let clock = ManualClock::new();
    let xff =
        ForwardedIp::x_forwarded_for(TrustedProxies::new(["127.0.0.0/8"])?, 1).lookup(connect_info);
    let layer = client_layer(100, &clock, xff)?;
    let addr = serve(layer.clone(), true).await;

    let r = send(addr, "/", &[("x-forwarded-for", b"\xff\xfe\x80")]).await;
    assert_eq!(r.status, 400, "{r:?}");
    assert!(
        r.body.contains("X-Forwarded-For: not visible ASCII"),
        "{r:?}"
    );

    let r = send(addr, "/", &[("x-forwarded-for", b"999.0.0.1")]).await;
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.body.contains("not an IP address"), "{r:?}");

    // One entry longer than the 4096 bytes read from the right.
    let long = "1".repeat(5_000);
    let r = send(addr, "/", &[("x-forwarded-for", long.as_bytes())]).await;
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.body.contains("oversized"), "{r:?}");

    let r = send(addr, "/", &[]).await;
    assert_eq!(r.status, 400, "{r:?}");
    assert!(
        r.body.contains("missing client key: X-Forwarded-For"),
        "{r:?}"
    );
    assert_eq!(layer.stats()[0].bad_key, 4);

    // No peer address at all (a server without connect info).
    let layer = client_layer(100, &clock, peer_ip())?;
    let addr = serve(layer, false).await;
    let r = send(addr, "/", &[]).await;
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.body.contains("missing client key: peer address"), "{r:?}");

    // API keys: non-UTF-8, oversized and missing; then a fallback bucket.
    let layer = RateLimitLayer::builder()
        .rule(Rule::new(
            "key",
            keyed::<String>(Policy::per_minute(1)?, &clock),
            HeaderKey::new("x-api-key")?.max_len(16)?,
        )?)
        .build()?;
    let addr = serve(layer, false).await;
    for (value, want) in [
        (&b"caf\xc3\xa9"[..], "not visible ASCII"),
        (b"0123456789abcdefg", "oversized"),
    ] {
        let r = send(addr, "/", &[("x-api-key", value)]).await;
        assert_eq!(r.status, 400, "{r:?}");
        assert!(r.body.contains(want), "{r:?}");
    }
    assert_eq!(send(addr, "/", &[]).await.status, 400);
    assert_eq!(send(addr, "/", &[("x-api-key", b"k1")]).await.status, 200);

    let layer = RateLimitLayer::builder()
        .rule(
            Rule::new(
                "key",
                keyed::<String>(Policy::per_minute(1)?, &clock),
                HeaderKey::new("x-api-key")?,
            )?
            .on_missing_key(OnMissingKey::Fallback("anonymous".to_owned())),
        )
        .build()?;
    let addr = serve(layer.clone(), false).await;
    assert_eq!(send(addr, "/", &[]).await.status, 200);
    // The fallback bucket is shared by every keyless request.
    assert_eq!(send(addr, "/", &[("x-api-key", b"\x80")]).await.status, 429);
    assert_eq!(send(addr, "/", &[("x-api-key", b"k1")]).await.status, 200);
    let s = layer.stats();
    assert_eq!((s[0].bad_key, s[0].allowed, s[0].denied), (2, 2, 1));
    Ok(())
}

#[tokio::test]
async fn limiter_errors_fail_closed_or_open() -> TestResult {
    let layer = RateLimitLayer::builder()
        .rule(Rule::remote("remote", Down, Global)?)
        .build()?;
    let addr = serve(layer.clone(), false).await;
    let r = send(addr, "/", &[]).await;
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(layer.stats()[0].errors, 1);

    let layer = RateLimitLayer::builder()
        .rule(Rule::remote("remote", Down, Global)?)
        .on_limiter_error(OnLimiterError::FailOpen)
        .build()?;
    let addr = serve(layer, false).await;
    let r = send(addr, "/", &[]).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("ratelimit"), None);
    Ok(())
}

#[tokio::test]
async fn epoch_reset_and_only_ietf() -> TestResult {
    let clock = ManualClock::new();
    let policy = Policy::per_minute(2)?;
    let layer = RateLimitLayer::builder()
        .rule(Rule::new(
            "r",
            RateLimiter::gcra_with_clock(policy, clock.clone()),
            Global,
        )?)
        .headers(HeaderOptions::default().legacy(Some(ResetFormat::UnixEpoch)))
        .build()?;
    let addr = serve(layer, false).await;
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let r = send(addr, "/", &[]).await;
    let after = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    // reset_after is 30 s: the epoch value lies in [before + 30, after + 31].
    let reset = r.num("x-ratelimit-reset");
    assert!(
        (before + 30..=after + 31).contains(&reset),
        "{reset} vs {before}..{after}"
    );

    let layer = RateLimitLayer::builder()
        .rule(Rule::new(
            "r",
            RateLimiter::gcra_with_clock(policy, clock.clone()),
            Global,
        )?)
        .headers(HeaderOptions::default().legacy(None))
        .build()?;
    let addr = serve(layer, false).await;
    let r = send(addr, "/", &[]).await;
    assert_eq!(r.header("x-ratelimit-limit"), None);
    assert_eq!(r.header("ratelimit"), Some(r#""r";r=1;t=30"#));
    Ok(())
}

#[tokio::test]
async fn plain_hyper_server() -> TestResult {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .rule(Rule::shared(
            "per-ip",
            Arc::new(keyed::<IpAddr>(Policy::per_minute(1)?, &clock)),
            PeerIp::new(),
        )?)
        .build()?;
    let service = layer.layer(Hello);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, peer)) = listener.accept().await {
            let service = service.clone();
            let hyper_service =
                hyper::service::service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(PeerAddr(peer));
                    let mut service = service.clone();
                    async move { service.call(req).await }
                });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), hyper_service),
            );
        }
    });
    let r = send(addr, "/", &[]).await;
    assert_eq!((r.status, r.body.as_str()), (200, "ok"), "{r:?}");
    assert_eq!(r.header("ratelimit"), Some(r#""per-ip";r=0;t=60"#));
    let r = send(addr, "/", &[]).await;
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.num("retry-after"), 60);
    Ok(())
}

/// The in-process limiter behind `AsyncLimit` alone, as a remote backend looks: no
/// refund.
struct NoRefund(Arc<RateLimiter<Gcra, ManualClock>>);

impl AsyncLimit<()> for NoRefund {
    type Error = Infallible;

    fn check_n(
        &self,
        key: &(),
        cost: u32,
    ) -> impl Future<Output = Result<Decision, Infallible>> + Send {
        AsyncLimit::<()>::check_n(&*self.0, key, cost)
    }

    fn peek_n(
        &self,
        key: &(),
        cost: u32,
    ) -> impl Future<Output = Result<Decision, Infallible>> + Send {
        AsyncLimit::<()>::peek_n(&*self.0, key, cost)
    }
}

#[tokio::test]
async fn in_process_rules_are_all_or_nothing_remote_ones_keep_their_charge() -> TestResult {
    let clock = ManualClock::new();
    let global = Arc::new(RateLimiter::gcra_with_clock(
        Policy::per_second(1_000)?,
        clock.clone(),
    ));
    let shadow = Arc::new(keyed::<IpAddr>(Policy::per_minute(100)?, &clock));
    let layer = RateLimitLayer::builder()
        .rule(Rule::shared("global", Arc::clone(&global), Global)?)
        .rule(Rule::shared("trial", Arc::clone(&shadow), peer_ip())?.strategy(Strategy::Shadow))
        .rule(Rule::new(
            "client",
            keyed::<IpAddr>(Policy::per_minute(1)?, &clock),
            peer_ip(),
        )?)
        .build()?;
    let addr = serve(layer.clone(), true).await;
    assert_eq!(send(addr, "/", &[]).await.status, 200);
    assert_eq!(send(addr, "/", &[]).await.status, 429);
    let r = send(addr, "/", &[]).await;
    assert_eq!(r.status, 429);
    // The 429 shows "global" after its refund: one unit taken, not two.
    assert_eq!(
        r.header("ratelimit"),
        Some(r#""global";r=999;t=1, "client";r=0;t=60"#)
    );
    // Only the admitted request stays charged to the rules before "client".
    assert_eq!(global.peek(0).remaining(), 999);
    let ip: IpAddr = "127.0.0.1".parse()?;
    assert_eq!(shadow.peek(&ip, 0).remaining(), 99);
    // An admission later refunded still counts as allowed.
    assert_eq!(layer.stats()[0].allowed, 3);

    let remote = Arc::new(RateLimiter::gcra_with_clock(
        Policy::per_second(1_000)?,
        clock.clone(),
    ));
    let layer = RateLimitLayer::builder()
        .rule(Rule::remote(
            "global",
            NoRefund(Arc::clone(&remote)),
            Global,
        )?)
        .rule(Rule::new(
            "client",
            keyed::<IpAddr>(Policy::per_minute(1)?, &clock),
            peer_ip(),
        )?)
        .build()?;
    let addr = serve(layer, true).await;
    assert_eq!(send(addr, "/", &[]).await.status, 200);
    assert_eq!(send(addr, "/", &[]).await.status, 429);
    let r = send(addr, "/", &[]).await;
    assert_eq!(r.status, 429);
    // A remote rule without refunds (the trait's defaults) keeps its charge, and
    // its numbers show it.
    assert_eq!(
        r.header("ratelimit"),
        Some(r#""global";r=997;t=1, "client";r=0;t=60"#)
    );
    // In order, stop at the first denial: that remote rule keeps every charge.
    assert_eq!(remote.peek(0).remaining(), 997);

    // A request rejected for a later rule's key is charged nowhere either.
    let layer = RateLimitLayer::builder()
        .rule(Rule::shared("global", Arc::clone(&global), Global)?)
        .rule(Rule::new(
            "key",
            keyed::<String>(Policy::per_minute(9)?, &clock),
            HeaderKey::new("x-api-key")?,
        )?)
        .build()?;
    let addr = serve(layer, true).await;
    assert_eq!(send(addr, "/", &[]).await.status, 400);
    assert_eq!(global.peek(0).remaining(), 999);
    Ok(())
}
