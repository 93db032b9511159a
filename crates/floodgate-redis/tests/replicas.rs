//! Two proxy replicas share one limit through Redis, end to end over real HTTP: each
//! replica is floodgate-http's layer on an axum server of its own (a loopback port),
//! with `RedisLimiter`s on connections of its own, all under one key prefix; clients
//! spread their requests over both.
//!
//! Rates are slow (per hour) so that nothing refills during a test, and a window's
//! period is chosen so that Redis's clock stands in the middle half of the current
//! window ([`mid_window_period`]): no window ends during a test, so every count is
//! exact.

mod common;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::http::request::Parts;
use axum::http::Extensions;
use axum::routing::get;
use axum::Router;
use common::{build_prefixed, runtime, RedisServer, ALGORITHMS};
use floodgate::Policy;
use floodgate_http::{
    from_fn, ForwardedIp, HeaderKey, KeyError, OnLimiterError, RateLimitLayer, Rule, RuleStats,
    TrustedProxies,
};
use floodgate_redis::{Algorithm, OnFailure, RedisLimiter, RedisLimiterBuilder, Verdict};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;

/// The request header that names the client: the key of the per-client rules.
const CLIENT: &str = "x-client";

/// The most one request may take on a loaded machine: generous, no speed claim.
const PATIENCE: Duration = Duration::from_secs(20);

/// One hour in seconds: the slow rates' interval.
const HOUR: u64 = 3_600;

/// A response as the client saw it (header names in lower case).
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Header `name` as an integer; fails the test without it.
    fn num(&self, name: &str) -> u64 {
        self.header(name)
            .unwrap_or_else(|| panic!("no {name} in {self:?}"))
            .parse()
            .unwrap_or_else(|_| panic!("{name} is not an integer in {self:?}"))
    }

    /// Parameter `param` of member `rule` of the `RateLimit` field
    /// (`"rule";r=1;t=60, ...`), where there is one.
    fn rate_limit(&self, rule: &str, param: &str) -> Option<u64> {
        let quoted = format!("\"{rule}\"");
        let member = self
            .header("ratelimit")?
            .split(',')
            .map(str::trim)
            .find(|m| m.split(';').next() == Some(quoted.as_str()))?;
        member
            .split(';')
            .filter_map(|p| p.split_once('='))
            .find(|(k, _)| *k == param)
            .map(|(_, v)| v.parse().expect("an integer parameter"))
    }

    /// The rule names of the `RateLimit` field's members, in order.
    fn rate_limit_rules(&self) -> Vec<&str> {
        self.header("ratelimit").map_or_else(Vec::new, |v| {
            v.split(',')
                .filter_map(|m| m.trim().split(';').next())
                .map(|n| n.trim_matches('"'))
                .collect()
        })
    }
}

/// `GET /` from client `client` over a connection of its own.
async fn get_as(addr: SocketAddr, client: &str) -> Reply {
    send(addr, &[(CLIENT, client)]).await
}

/// `GET /` with `headers` over a connection of its own.
async fn send(addr: SocketAddr, headers: &[(&str, &str)]) -> Reply {
    let mut request = String::from("GET / HTTP/1.1\r\nHost: replica\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    };
    let raw = tokio::time::timeout(PATIENCE, exchange)
        .await
        .unwrap_or_else(|_| panic!("no reply from {addr} within {PATIENCE:?}"))
        .expect("an HTTP exchange on loopback");
    let text = String::from_utf8(raw).expect("a UTF-8 reply");
    let (head, body) = text.split_once("\r\n\r\n").expect("a reply head");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// The peer's address, as axum's connect info carries it.
fn connect_info(extensions: &Extensions) -> Option<std::net::IpAddr> {
    extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
}

/// A proxy replica: the layer around `GET /` ("ok") on a loopback port of its own.
struct Replica {
    addr: SocketAddr,
    layer: RateLimitLayer,
}

impl Replica {
    fn serve(rt: &Runtime, layer: RateLimitLayer) -> Replica {
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer.clone());
        let addr = rt.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("a local address");
            let app = app.into_make_service_with_connect_info::<SocketAddr>();
            tokio::spawn(async move { axum::serve(listener, app).await });
            addr
        });
        Replica { addr, layer }
    }

    /// A replica whose layer holds one hard rule, "shared", on `limiter`, keyed on the
    /// client header.
    fn shared(rt: &Runtime, limiter: Arc<RedisLimiter>, on_error: OnLimiterError) -> Replica {
        let layer = RateLimitLayer::builder()
            .rule(per_client("shared", limiter))
            .on_limiter_error(on_error)
            .build()
            .expect("a valid layer");
        Replica::serve(rt, layer)
    }

    fn get(&self, rt: &Runtime, client: &str) -> Reply {
        rt.block_on(get_as(self.addr, client))
    }

    fn stats(&self, rule: &str) -> RuleStats {
        self.layer.rule_stats(rule).expect("a rule of the layer")
    }
}

/// The counters of `rule` summed over `replicas`: (allowed, denied, errors).
fn total(replicas: &[Replica], rule: &str) -> (u64, u64, u64) {
    replicas
        .iter()
        .map(|r| r.stats(rule))
        .fold((0, 0, 0), |t, s| {
            (t.0 + s.allowed, t.1 + s.denied, t.2 + s.errors)
        })
}

/// A limiter as the replicas build it: keys under `prefix`, Redis's failures handed to
/// the layer (its `OnLimiterError` decides and counts them), and a timeout no loaded
/// machine reaches, so that no fallback ever stands in for Redis's decision.
fn replica_builder(algorithm: Algorithm, policy: Policy, prefix: &str) -> RedisLimiterBuilder {
    RedisLimiter::builder(algorithm, policy)
        .prefix(prefix)
        .timeout(Duration::from_secs(5))
        .on_failure(OnFailure::Error)
}

/// A hard rule on `limiter` keyed on the client header.
fn per_client(name: &str, limiter: Arc<RedisLimiter>) -> Rule<RedisLimiter, HeaderKey> {
    let key = HeaderKey::new(CLIENT).expect("a header name");
    Rule::remote_shared(name, limiter, key).expect("a rule name")
}

/// Two replicas of one proxy, each with a limiter of its own from `builder` (its own
/// connection) behind one hard rule, "shared", keyed on the client header.
fn pair(
    rt: &Runtime,
    server: &RedisServer,
    builder: &RedisLimiterBuilder,
    on_error: OnLimiterError,
) -> [Replica; 2] {
    [0, 1].map(|_| {
        let limiter = Arc::new(build_prefixed(rt, server, builder.clone()));
        Replica::shared(rt, limiter, on_error)
    })
}

/// `clients` clients at once, each sending `each` requests as `client`, alternating
/// between the replicas (client `i` starts at replica `i % 2`). Every reply.
fn crowd(
    rt: &Runtime,
    replicas: &[Replica; 2],
    client: &str,
    (clients, each): (usize, usize),
) -> Vec<Reply> {
    let addrs = [replicas[0].addr, replicas[1].addr];
    let clients = (0..clients).map(|i| {
        let client = client.to_owned();
        async move {
            let mut replies = Vec::with_capacity(each);
            for j in 0..each {
                replies.push(get_as(addrs[(i + j) % 2], &client).await);
            }
            replies
        }
    });
    at_once(rt, clients).into_iter().flatten().collect()
}

/// Runs `tasks` at once on `rt`; their outputs, in order.
fn at_once<F>(rt: &Runtime, tasks: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    rt.block_on(async {
        let running: Vec<_> = tasks.into_iter().map(tokio::spawn).collect();
        let mut outputs = Vec::with_capacity(running.len());
        for task in running {
            outputs.push(task.await.expect("a task"));
        }
        outputs
    })
}

/// About an hour, in whole seconds, such that Redis's clock now stands in the middle
/// half of its current window (windows are aligned to the epoch): at least a quarter
/// of an hour passes before the window ends.
fn mid_window_period(server: &RedisServer) -> Duration {
    mid_window_periods(server)
        .next()
        .expect("a period in the middle of its window")
}

/// [`mid_window_period`]'s periods, shortest first.
fn mid_window_periods(server: &RedisServer) -> impl Iterator<Item = Duration> {
    common::mid_window_periods(server, Duration::from_secs(HOUR))
}

/// `limit` per about an hour: GCRA a burst of `limit` and one more an hour; the
/// windows and the log `limit` per `period`.
fn slow_policy(algorithm: Algorithm, limit: u64, period: Duration) -> Policy {
    match algorithm {
        Algorithm::Gcra => Policy::per_hour(1).and_then(|p| p.with_burst(limit)),
        _ => Policy::new(limit, period),
    }
    .expect("a valid policy")
}

/// How many times Redis ran a script by its SHA1 (`EVALSHA`) so far.
fn script_runs(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "commandstats"]);
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a call count"))
}

/// The 429 a hard rule `rule` answers when it denies, with every field the layer
/// documents; returns its `Retry-After`.
fn assert_denied(r: &Reply, rule: &str, limit: u64) -> u64 {
    assert_eq!(r.status, 429, "{r:?}");
    let retry = r.num("retry-after");
    assert!(retry >= 1, "{r:?}");
    assert_eq!(
        r.body,
        format!("rate limit \"{rule}\" exceeded; retry after {retry} s\n")
    );
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    assert_eq!(r.num("x-ratelimit-limit"), limit, "{r:?}");
    assert_eq!(r.num("x-ratelimit-remaining"), 0, "{r:?}");
    let reset = r.num("x-ratelimit-reset");
    assert!(reset >= retry, "full again before one fits: {r:?}");
    assert_eq!(r.rate_limit(rule, "r"), Some(0), "{r:?}");
    assert_eq!(r.rate_limit(rule, "t"), Some(reset), "{r:?}");
    let quota = format!("\"{rule}\";q={limit}");
    assert!(
        r.header("ratelimit-policy")
            .is_some_and(|p| p.contains(&quota)),
        "{r:?}"
    );
    retry
}

#[test]
fn concurrent_clients_on_two_replicas_are_admitted_exactly_the_shared_limit() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    const LIMIT: u64 = 8;
    const CLIENTS: (usize, usize) = (32, 2);
    let requests = (CLIENTS.0 * CLIENTS.1) as u64;
    let period = mid_window_period(&server);
    for algorithm in ALGORITHMS {
        let policy = slow_policy(algorithm, LIMIT, period);
        let builder = replica_builder(algorithm, policy, "replicas:");
        let replicas = pair(&rt, &server, &builder, OnLimiterError::FailClosed);
        let replies = crowd(&rt, &replicas, &format!("{algorithm:?}"), CLIENTS);

        // Exactly the limit, and each admission saw one counter: the remaining counts
        // the two replicas report are LIMIT - 1 down to 0, each once.
        let mut remaining: Vec<u64> = replies
            .iter()
            .filter(|r| r.status == 200)
            .map(|r| r.num("x-ratelimit-remaining"))
            .collect();
        remaining.sort_unstable();
        assert_eq!(
            remaining,
            (0..LIMIT).collect::<Vec<_>>(),
            "{algorithm:?}: the remaining counts of the admitted requests"
        );
        // Every other reply is the rule's 429, with a wait of at most two periods
        // (the sliding window's: into the next window, then a share of it).
        for r in replies.iter().filter(|r| r.status != 200) {
            let retry = assert_denied(r, "shared", LIMIT);
            assert!(retry <= 2 * period.as_secs(), "{algorithm:?}: {r:?}");
        }
        assert_eq!(
            total(&replicas, "shared"),
            (LIMIT, requests - LIMIT, 0),
            "{algorithm:?}: (allowed, denied, errors) over both replicas"
        );
    }
}

#[test]
fn each_replica_answers_from_the_state_both_share() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    const LIMIT: u64 = 6;
    let period = mid_window_period(&server);
    for algorithm in ALGORITHMS {
        let policy = slow_policy(algorithm, LIMIT, period);
        let builder = replica_builder(algorithm, policy, "replicas:");
        let replicas = pair(&rt, &server, &builder, OnLimiterError::FailClosed);
        let client = format!("{algorithm:?}");
        let mut resets = Vec::new();
        for i in 0..LIMIT {
            let r = replicas[(i % 2) as usize].get(&rt, &client);
            assert_eq!((r.status, r.body.as_str()), (200, "ok"), "{r:?}");
            // Replica i % 2 counts the admissions of the other one too.
            let left = LIMIT - 1 - i;
            assert_eq!(r.num("x-ratelimit-remaining"), left, "{algorithm:?}: {r:?}");
            assert_eq!(r.rate_limit("shared", "r"), Some(left), "{r:?}");
            resets.push(r.num("x-ratelimit-reset"));
        }
        for replica in &replicas {
            assert_denied(&replica.get(&rt, &client), "shared", LIMIT);
        }
        if algorithm == Algorithm::Gcra {
            // Full again after one interval per admission, wherever it was admitted
            // (less the seconds the test has taken; the header rounds up).
            for (i, reset) in (1..).zip(resets) {
                let full = i * HOUR;
                assert!((full - 60..=full).contains(&reset), "{i}: {reset} s");
            }
        }
    }
}

#[test]
fn redis_down_is_answered_as_configured_and_a_restart_recovers() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    const BURST: u64 = 5;
    let policy = slow_policy(Algorithm::Gcra, BURST, Duration::ZERO);
    let closed_wait = Duration::from_secs(7);
    // (name, the limiter's failure policy, the layer's): each a pair of replicas.
    let configs = [
        ("strict", OnFailure::Error, OnLimiterError::FailClosed),
        ("lenient", OnFailure::Error, OnLimiterError::FailOpen),
        ("fallback-open", OnFailure::Open, OnLimiterError::FailClosed),
        (
            "fallback-closed",
            OnFailure::Closed {
                retry_after: closed_wait,
            },
            OnLimiterError::FailClosed,
        ),
    ];
    let pairs: Vec<(&'static str, [Replica; 2])> = configs
        .iter()
        .map(|&(name, on_failure, on_error)| {
            let builder =
                replica_builder(Algorithm::Gcra, policy, "replicas:").on_failure(on_failure);
            (name, pair(&rt, &server, &builder, on_error))
        })
        .collect();
    for (name, replicas) in &pairs {
        for (i, replica) in replicas.iter().enumerate() {
            let r = replica.get(&rt, name);
            assert_eq!(r.status, 200, "{name}: {r:?}");
            assert_eq!(r.rate_limit("shared", "r"), Some(BURST - 1 - i as u64));
        }
    }

    server.kill();
    // What each replica answers while Redis is down (and while it comes back).
    let down = |name: &str, r: &Reply| match name {
        // The layer's documented answer to a hard rule's failed limiter: 503, no
        // rate-limit field (there is no decision to show).
        "strict" => {
            assert_eq!(r.status, 503, "{r:?}");
            assert_eq!(r.body, "rate limit \"shared\" is unavailable\n");
            assert_eq!(r.header("retry-after"), None, "{r:?}");
            assert_eq!(r.header("ratelimit"), None, "{r:?}");
        }
        // Skipped: passed on, the rule absent from the headers.
        "lenient" => {
            assert_eq!((r.status, r.body.as_str()), (200, "ok"), "{r:?}");
            assert_eq!(r.header("ratelimit"), None, "{r:?}");
            assert_eq!(r.header("x-ratelimit-limit"), None, "{r:?}");
        }
        // The limiter's fallback comes through `AsyncLimit` as a decision: the layer
        // cannot tell it from Redis's and fails open whatever its own policy says.
        "fallback-open" => {
            assert_eq!((r.status, r.body.as_str()), (200, "ok"), "{r:?}");
            assert_eq!(r.num("x-ratelimit-limit"), BURST, "{r:?}");
            assert_eq!(r.num("x-ratelimit-remaining"), 0, "{r:?}");
            assert_eq!(r.header("ratelimit"), Some("\"shared\";r=0;t=0"));
        }
        // ... and the fail-closed fallback as a denial: 429 with its wait.
        "fallback-closed" => {
            let retry = assert_denied(r, "shared", BURST);
            assert_eq!(retry, closed_wait.as_secs(), "{r:?}");
        }
        _ => unreachable!("a configuration above"),
    };
    // Two requests to every replica, all at once: a call that finds the connection
    // broken waits for the reconnection attempts (within the limiter's timeout).
    let asked: Vec<(&'static str, SocketAddr)> = pairs
        .iter()
        .flat_map(|(name, replicas)| replicas.iter().flat_map(|r| [(*name, r.addr); 2]))
        .collect();
    let replies = at_once(&rt, asked.iter().map(|&(name, addr)| get_as(addr, name)));
    for (&(name, _), r) in asked.iter().zip(&replies) {
        down(name, r);
    }
    let errors = |name: &str| {
        pairs
            .iter()
            .find(|p| p.0 == name)
            .map(|p| total(&p.1, "shared"))
    };
    // (allowed, denied, errors) over each pair: only the limiters that hand their
    // failures to the layer are counted as errors.
    assert_eq!(errors("strict"), Some((2, 0, 4)));
    assert_eq!(errors("lenient"), Some((2, 0, 4)));
    assert_eq!(errors("fallback-open"), Some((6, 0, 0)));
    assert_eq!(errors("fallback-closed"), Some((2, 4, 0)));

    // Back on the same port, empty (no persistence): each replica recovers by itself,
    // and the charges taken before the crash are gone.
    server.restart();
    for (name, replicas) in &pairs {
        for (i, replica) in replicas.iter().enumerate() {
            let left = BURST - 1 - i as u64;
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                let r = replica.get(&rt, name);
                if r.status == 200 && r.rate_limit("shared", "r") == Some(left) {
                    break;
                }
                down(name, &r);
                assert!(
                    std::time::Instant::now() < deadline,
                    "{name}: replica {i} did not recover"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

#[test]
fn a_later_rules_denial_gives_the_earlier_remote_rules_charge_back() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let global_policy = slow_policy(Algorithm::Gcra, 10, Duration::ZERO);
    let client_policy = slow_policy(Algorithm::Gcra, 2, Duration::ZERO);
    // Every request's key for the global rule.
    let everyone = || from_fn(|_: &Parts| Ok::<_, KeyError>("all"));
    // Two replicas whose layers check a global limit and a per-client one, in the
    // order `global_first` says; each rule under a prefix of its own.
    let replicas = |global_first: bool, prefix: &str| {
        let global_prefix = format!("{prefix}global:");
        let client_prefix = format!("{prefix}client:");
        let global = replica_builder(Algorithm::Gcra, global_policy, &global_prefix).refunds(true);
        let client = replica_builder(Algorithm::Gcra, client_policy, &client_prefix).refunds(true);
        let replicas = [0, 1].map(|_| {
            let global = build_prefixed(&rt, &server, global.clone());
            let global = Rule::remote("global", global, everyone()).expect("a rule name");
            let client = per_client(
                "client",
                Arc::new(build_prefixed(&rt, &server, client.clone())),
            );
            let layer = if global_first {
                RateLimitLayer::builder().rule(global).rule(client)
            } else {
                RateLimitLayer::builder().rule(client).rule(global)
            };
            Replica::serve(&rt, layer.build().expect("a valid layer"))
        });
        // A third view of the global limit, to read it without the layer.
        (replicas, build_prefixed(&rt, &server, global))
    };
    let global_left = |view: &RedisLimiter| {
        let verdict = rt.block_on(view.peek_n("all", 0)).expect("Redis decides");
        verdict.decision().remaining()
    };

    // Global first: the three requests "client" denies are charged on the global
    // limit and given back (session 42: remote GCRA refunds). The headers show the
    // global rule as of its check (7 left, the refund not yet made).
    let (pair, view) = replicas(true, "replicas:a:");
    for i in 0..5 {
        let r = pair[i % 2].get(&rt, "c");
        let (status, client_left) = if i < 2 { (200, 1 - i as u64) } else { (429, 0) };
        assert_eq!(r.status, status, "{i}: {r:?}");
        assert_eq!(r.rate_limit_rules(), ["global", "client"], "{r:?}");
        assert_eq!(
            r.rate_limit("global", "r"),
            Some(9 - i.min(2) as u64),
            "{i}: {r:?}"
        );
        assert_eq!(r.rate_limit("client", "r"), Some(client_left), "{i}: {r:?}");
    }
    assert_eq!(global_left(&view), 8);
    // The counters count an admission later given back as allowed.
    assert_eq!(total(&pair, "global"), (5, 0, 0));
    assert_eq!(total(&pair, "client"), (2, 3, 0));
    // A client named like the global key has a bucket of its own (the rules' prefixes
    // differ): one request is one global charge.
    let r = pair[0].get(&rt, "all");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.rate_limit("global", "r"), Some(7), "{r:?}");
    assert_eq!(r.rate_limit("client", "r"), Some(1), "{r:?}");

    // Per client first (as the layer advises): a client stopped by its own limit
    // spends none of the global one, and the 429 shows only the rules walked.
    let (pair, view) = replicas(false, "replicas:b:");
    for i in 0..5 {
        let r = pair[i % 2].get(&rt, "c");
        if i < 2 {
            assert_eq!(r.status, 200, "{i}: {r:?}");
            assert_eq!(r.rate_limit_rules(), ["client", "global"], "{r:?}");
        } else {
            assert_denied(&r, "client", 2);
            assert_eq!(r.rate_limit_rules(), ["client"], "{r:?}");
        }
    }
    assert_eq!(global_left(&view), 8);
    assert_eq!(total(&pair, "global"), (2, 0, 0));
    assert_eq!(total(&pair, "client"), (2, 3, 0));
}

#[test]
fn a_replica_that_cached_a_denial_neither_admits_nor_asks_redis() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    const LIMIT: u64 = 4;
    let policy = slow_policy(Algorithm::Gcra, LIMIT, Duration::ZERO);
    let builder = replica_builder(Algorithm::Gcra, policy, "replicas:");
    // Replica 0 caches denials; replica 1 asks Redis every time.
    let cached = Arc::new(build_prefixed(&rt, &server, builder.clone().deny_cache(64)));
    let uncached = Arc::new(build_prefixed(&rt, &server, builder));
    let replicas = [&cached, &uncached]
        .map(|limiter| Replica::shared(&rt, Arc::clone(limiter), OnLimiterError::FailClosed));

    let replies = crowd(&rt, &replicas, "c", (32, 2));
    let admitted = replies.iter().filter(|r| r.status == 200).count() as u64;
    assert_eq!(admitted, LIMIT);
    assert_eq!(total(&replicas, "shared"), (LIMIT, 64 - LIMIT, 0));
    assert_eq!(cached.cached_denials(), 1);
    assert_eq!(uncached.cached_denials(), 0);

    // The caching replica answers from its cache: a 429 with the wait Redis gave,
    // and no script run.
    let before = script_runs(&server);
    for _ in 0..5 {
        let retry = assert_denied(&replicas[0].get(&rt, "c"), "shared", LIMIT);
        assert!((HOUR - 60..=HOUR).contains(&retry), "{retry} s");
    }
    assert_eq!(
        script_runs(&server),
        before,
        "the cached replica asked Redis"
    );
    // The other one still decides through Redis, one run per request.
    for _ in 0..5 {
        let retry = assert_denied(&replicas[1].get(&rt, "c"), "shared", LIMIT);
        assert!((HOUR - 60..=HOUR).contains(&retry), "{retry} s");
    }
    assert_eq!(script_runs(&server), before + 5);
    // Another client is not denied by the cached one's entry.
    assert_eq!(replicas[0].get(&rt, "d").status, 200);
}

#[test]
fn replicas_whose_windows_have_other_periods_share_one_count() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    const LIMIT: u64 = 3;
    // A rolling deploy that changes a window's period: for a while one replica runs
    // the old policy and one the new, on the same keys.
    let mut periods = mid_window_periods(&server);
    let (old, new) = (periods.next(), periods.next());
    let (old, new) = old.zip(new).expect("two periods");
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let replicas = [old, new].map(|period| {
            let policy = slow_policy(algorithm, LIMIT, period);
            let limiter = build_prefixed(
                &rt,
                &server,
                replica_builder(algorithm, policy, "replicas:"),
            );
            Replica::shared(&rt, Arc::new(limiter), OnLimiterError::FailClosed)
        });
        // A client whose requests the load balancer spreads over both.
        let client = format!("{algorithm:?}");
        let statuses: Vec<u16> = (0..10)
            .map(|i| replicas[i % 2].get(&rt, &client).status)
            .collect();
        let admitted = statuses.iter().filter(|&&s| s == 200).count() as u64;
        assert_eq!(admitted, LIMIT, "{algorithm:?}: {statuses:?}");
        assert!(
            statuses.iter().all(|&s| s == 200 || s == 429),
            "{statuses:?}"
        );
    }
}

#[test]
fn replicas_of_another_algorithm_on_the_same_keys_cannot_decide() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    const LIMIT: u64 = 3;
    // A rolling deploy from the fixed window to the sliding window on one prefix: the
    // new replicas find a state they cannot read (a malformed-state error) for as
    // long as the old replicas keep it alive.
    let period = mid_window_period(&server);
    let replica = |algorithm, on_failure| {
        let policy = slow_policy(algorithm, LIMIT, period);
        let builder = replica_builder(algorithm, policy, "replicas:").on_failure(on_failure);
        let limiter = Arc::new(build_prefixed(&rt, &server, builder));
        Replica::shared(&rt, limiter, OnLimiterError::FailClosed)
    };
    let old = replica(Algorithm::FixedWindow, OnFailure::Error);
    let new = replica(Algorithm::SlidingWindow, OnFailure::Error);
    let new_open = replica(Algorithm::SlidingWindow, OnFailure::Open);
    for i in 0..LIMIT {
        let r = old.get(&rt, "c");
        assert_eq!(r.rate_limit("shared", "r"), Some(LIMIT - 1 - i), "{r:?}");
        // Fail closed (the layer's 503) ...
        let r = new.get(&rt, "c");
        assert_eq!(r.status, 503, "{r:?}");
        // ... or, under the limiter's default fail-open policy, admitted every time:
        // change the prefix with the algorithm.
        let r = new_open.get(&rt, "c");
        assert_eq!(
            (r.status, r.num("x-ratelimit-remaining")),
            (200, 0),
            "{r:?}"
        );
    }
    assert_denied(&old.get(&rt, "c"), "shared", LIMIT);
    assert_eq!(new_open.get(&rt, "c").status, 200);
    assert_eq!(new.stats("shared").errors, LIMIT);
}

#[test]
fn forged_forwarding_entries_get_no_fresh_bucket_on_either_replica() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    const LIMIT: u64 = 3;
    const REQUESTS: usize = 12;
    let policy = slow_policy(Algorithm::Gcra, LIMIT, Duration::ZERO);
    // Both replicas behind a load balancer on loopback, which appends the address it
    // saw to X-Forwarded-For: one trusted hop.
    let replicas = [0, 1].map(|_| {
        let limiter = build_prefixed(
            &rt,
            &server,
            replica_builder(Algorithm::Gcra, policy, "replicas:"),
        );
        let trusted = TrustedProxies::new(["127.0.0.0/8"]).expect("a network");
        let client_ip = ForwardedIp::x_forwarded_for(trusted, 1).lookup(connect_info);
        let rule = Rule::remote("per-ip", limiter, client_ip).expect("a rule name");
        Replica::serve(
            &rt,
            RateLimitLayer::builder()
                .rule(rule)
                .build()
                .expect("a layer"),
        )
    });
    // An IPv4 client forging a new entry before the balancer's each time, and an
    // IPv6 client moving over the addresses of its /64.
    for ipv6 in [false, true] {
        let forwarded_for = |i: usize| match ipv6 {
            false => format!("10.0.{i}.1, 198.51.100.7"),
            true => format!("2001:db8:1:2::{:x}", i + 1),
        };
        let requests = (0..REQUESTS).map(|i| {
            let addr = replicas[i % 2].addr;
            let value = forwarded_for(i);
            async move { send(addr, &[("x-forwarded-for", &value)]).await }
        });
        let replies = at_once(&rt, requests);
        let admitted = replies.iter().filter(|r| r.status == 200).count() as u64;
        assert_eq!(admitted, LIMIT, "IPv6 {ipv6}: {replies:?}");
        for r in replies.iter().filter(|r| r.status != 200) {
            assert_denied(r, "per-ip", LIMIT);
        }
    }
}

#[test]
fn a_redis_slower_than_the_timeout_admits_under_fail_open_and_still_charges() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    const LIMIT: u64 = 4;
    const REQUESTS: usize = 6;
    let policy = slow_policy(Algorithm::Gcra, LIMIT, Duration::ZERO);
    // The limiter's defaults, fail open, with a timeout far longer than a call to an
    // idle local Redis.
    let builder = RedisLimiter::builder(Algorithm::Gcra, policy)
        .prefix("replicas:")
        .timeout(Duration::from_secs(1));
    let replicas = pair(&rt, &server, &builder, OnLimiterError::FailClosed);
    let view = build_prefixed(&rt, &server, builder);
    // Load the script on the server and warm both connections.
    for replica in &replicas {
        assert_eq!(replica.get(&rt, "warm-up").status, 200);
    }

    // Redis stops answering the scripts (write commands, held by `CLIENT PAUSE ...
    // WRITE` until the test unpauses it; its +OK: in place): every call times out,
    // and the layer, handed the fallback as a decision, admits them all. A pause of
    // 4 s had ended if this thread was descheduled 3 s before the requests; the 30 s
    // only bounds a broken build.
    let _: () = server.cmd(&["CLIENT", "PAUSE", "30000", "WRITE"]);
    let requests = (0..REQUESTS).map(|i| get_as(replicas[i % 2].addr, "c"));
    for r in at_once(&rt, requests) {
        assert_eq!(
            (r.status, r.num("x-ratelimit-remaining")),
            (200, 0),
            "{r:?}"
        );
    }
    // The calls were sent: once Redis runs them (unpaused), they charge. The key is
    // full although no client was told so, and the next request is denied.
    let _: () = server.cmd(&["CLIENT", "UNPAUSE"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match rt.block_on(view.peek_n("c", 0)) {
            Ok(Verdict::Decided(d)) if d.remaining() == 0 => break,
            Ok(Verdict::Decided(d)) => assert!(
                std::time::Instant::now() < deadline,
                "the held calls did not charge: {d:?}"
            ),
            other => panic!("Redis's own answer expected: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_denied(&replicas[0].get(&rt, "c"), "shared", LIMIT);
    assert_eq!(total(&replicas, "shared"), (REQUESTS as u64 + 2, 1, 0));
}
