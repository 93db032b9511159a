//! The `production` example's router over loopback: a real HTTP/1.1 client stands in
//! for the trusted proxy at 127.0.0.1 and names each client in `X-Forwarded-For`.
//! Time is a `ManualClock` that moves only when a test advances it, so every number
//! is exact; the Redis test uses a limit of 30 a day, so the server's real clock
//! cannot refill it during the test (its waits alone move by the seconds it takes).

#[allow(dead_code)]
#[path = "../examples/production/app.rs"]
mod app;

#[path = "common/answer.rs"]
mod answer;
use answer::Answer;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use floodgate::{ManualClock, Policy};
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;

use app::Error;

type TestResult = Result<(), Error>;

/// The example's router served on 127.0.0.1:0, and a client for it.
struct Server {
    addr: SocketAddr,
    layer: floodgate_http::RateLimitLayer,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Server {
    async fn start(clock: &ManualClock, per_ip: app::Shared) -> Result<Server, Error> {
        let (router, layer) = app::app(clock.clone(), "127.0.0.1", per_ip)?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(app::serve(listener, router));
        let client = Client::builder(TokioExecutor::new()).build_http();
        Ok(Server {
            addr,
            layer,
            client,
        })
    }

    /// `method path` for the client at `ip` (none: `""`, a request of the proxy's
    /// own), with API key `key` (if any) and `body`.
    async fn send(
        &self,
        method: Method,
        path: &str,
        ip: &str,
        key: Option<&str>,
        body: &str,
    ) -> Result<Answer, Error> {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr));
        if !ip.is_empty() {
            req = req.header("x-forwarded-for", ip);
        }
        if let Some(key) = key {
            req = req.header("x-api-key", key);
        }
        let req = req.body(Full::new(Bytes::from(body.to_owned())))?;
        Answer::read(self.client.request(req).await?).await
    }

    async fn get(&self, ip: &str, key: Option<&str>) -> Result<Answer, Error> {
        self.send(Method::GET, "/", ip, key, "").await
    }

    async fn login(&self, ip: &str, user: &str, password: &str) -> Result<Answer, Error> {
        let body = format!("user={user}&password={password}");
        self.send(Method::POST, "/login", ip, Some("ent_login"), &body)
            .await
    }

    fn stats(&self, rule: &str) -> Result<floodgate_http::RuleStats, Error> {
        Ok(self.layer.rule_stats(rule).ok_or("no such rule")?)
    }
}

#[tokio::test]
async fn per_ip_hard_soft_and_shadow_rules() -> TestResult {
    let clock = ManualClock::new();
    let server = Server::start(&clock, app::Shared::Local).await?;
    let key = Some("ent_1");

    for n in 1..=30u64 {
        let a = server.get("203.0.113.1", key).await?;
        assert_eq!(a.status, StatusCode::OK, "request {n}: {}", a.body);
        // Neither the shadow rule `per-ip-next` (burst 10) nor the soft rule
        // `per-ip-warn` is shown; neither blocks.
        assert_eq!(
            a.header("ratelimit-policy"),
            Some(r#""per-ip";q=30;w=15, "plan";q=100;w=6, "global";q=10000;w=1"#),
        );
        // The soft rule (burst 20) marks the requests past it, and lets them through.
        let marked = a.header("x-ratelimit-exceeded");
        assert_eq!(
            marked,
            (n > 20).then_some(r#""per-ip-warn""#),
            "request {n}"
        );
        // The trio and the members speak of the rules that can refuse: `per-ip` is
        // the tightest, with 30 - n left, past the soft rule's 20 too.
        let left = (30 - n).to_string();
        assert_eq!(a.header("x-ratelimit-remaining"), Some(left.as_str()));
        let hard = format!(r#""per-ip";r={left};"#);
        assert!(a.header("ratelimit").is_some_and(|v| v.starts_with(&hard)));
    }

    let a = server.get("203.0.113.1", key).await?;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "{}", a.body);
    // 120 a minute: one every 0.5 s, rounded up to whole seconds.
    assert_eq!(a.header("retry-after"), Some("1"));
    assert_eq!(a.header("x-ratelimit-limit"), Some("30"));
    assert_eq!(a.header("x-ratelimit-remaining"), Some("0"));
    assert!(
        a.header("ratelimit")
            .is_some_and(|v| v.starts_with(r#""per-ip";r=0;t=15"#)),
        "{:?}",
        a.header("ratelimit")
    );
    assert!(a.body.contains("per-ip"), "{}", a.body);

    // A spoofed leftmost entry changes nothing: the proxy's own entry is the client.
    let a = server.get("198.51.100.77, 203.0.113.1", key).await?;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "{}", a.body);
    // Another client has buckets of its own.
    let a = server.get("203.0.113.2", key).await?;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert!(a.header("x-ratelimit-exceeded").is_none());

    // Half a second later the first client has one request again.
    clock.advance(Duration::from_millis(500));
    let a = server.get("203.0.113.1", key).await?;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);

    let per_ip = server.stats("per-ip")?;
    assert_eq!((per_ip.allowed, per_ip.denied), (32, 2));
    // Requests 11..=30 and the one after the wait would have been denied by the
    // tighter limit on trial; it blocked none of them.
    let next = server.stats("per-ip-next")?;
    assert_eq!((next.shadow, next.denied), (21, 0));
    let warn = server.stats("per-ip-warn")?;
    assert_eq!((warn.soft, warn.denied), (11, 0));
    // `GET /stats` and `GET /health` are outside the limits: the balancer's own
    // requests, without `X-Forwarded-For`, pass.
    let a = server.send(Method::GET, "/stats", "", None, "").await?;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert!(
        a.body
            .contains("\nper-ip-next allowed=11 denied=0 soft=0 shadow=21 "),
        "{}",
        a.body
    );
    let a = server.send(Method::GET, "/health", "", None, "").await?;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    // The same request to a limited route is refused for its missing client key.
    let a = server.send(Method::GET, "/", "", None, "").await?;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.body);
    Ok(())
}

/// `count` requests from `ip` with `key` that pass, then one the plan denies.
async fn exhaust_plan(server: &Server, ip: &str, key: Option<&str>, count: u64) -> TestResult {
    for n in 1..=count {
        let a = server.get(ip, key).await?;
        assert_eq!(a.status, StatusCode::OK, "{key:?} request {n}: {}", a.body);
    }
    let a = server.get(ip, key).await?;
    assert_eq!(
        a.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{key:?}: {}",
        a.body
    );
    assert!(a.body.contains("\"plan\""), "{}", a.body);
    Ok(())
}

#[tokio::test]
async fn plans_differ_per_api_key() -> TestResult {
    let clock = ManualClock::new();
    let server = Server::start(&clock, app::Shared::Local).await?;

    // Each plan's quota is its burst, its window the burst's worth of intervals
    // (free 5 × 6 s, pro 20 × 0.6 s, enterprise 100 × 0.06 s).
    for (key, quota, window) in [("free_1", 5, 30), ("pro_1", 20, 12), ("ent_1", 100, 6)] {
        let a = server.get("192.0.2.1", Some(key)).await?;
        let policy = a.header("ratelimit-policy").ok_or("no RateLimit-Policy")?;
        assert!(
            policy.contains(&format!(r#""plan";q={quota};w={window}, "#)),
            "{key}: {policy}"
        );
    }

    // free 10 a minute: one every 6 s; pro 100 a minute: one every 0.6 s.
    exhaust_plan(&server, "192.0.2.10", Some("free_2"), 5).await?;
    let a = server.get("192.0.2.10", Some("free_2")).await?;
    assert_eq!(a.header("retry-after"), Some("6"));
    exhaust_plan(&server, "192.0.2.11", Some("pro_2"), 20).await?;
    let a = server.get("192.0.2.11", Some("pro_2")).await?;
    assert_eq!(a.header("retry-after"), Some("1"));

    // No key: one shared free bucket, whatever the client; a blank key is none.
    // A client cannot name that bucket: `anonymous` is just another free key.
    let a = server.get("192.0.2.19", Some("anonymous")).await?;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let a = server.get("192.0.2.19", Some(" ")).await?;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    for ip in ["192.0.2.20", "192.0.2.21", "192.0.2.22", "192.0.2.23"] {
        let a = server.get(ip, None).await?;
        assert_eq!(a.status, StatusCode::OK, "{ip}: {}", a.body);
    }
    let a = server.get("192.0.2.25", None).await?;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "{}", a.body);
    // The shared bucket's key ("") is on the free plan, and says so.
    let policy = a.header("ratelimit-policy").ok_or("no RateLimit-Policy")?;
    assert!(policy.contains(r#""plan";q=5;w=30"#), "{policy}");
    assert_eq!(server.stats("plan")?.bad_key, 6);

    // A denial by the plan is charged to no other rule: the client's per-ip bucket
    // holds the five admitted requests only.
    let a = server.get("192.0.2.10", Some("ent_3")).await?;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let limit = a.header("ratelimit").ok_or("no RateLimit")?;
    assert!(limit.starts_with(r#""per-ip";r=24;"#), "{limit}");
    Ok(())
}

#[tokio::test]
async fn login_locks_out_per_user_and_per_ip_and_success_costs_nothing() -> TestResult {
    let clock = ManualClock::new();
    let server = Server::start(&clock, app::Shared::Local).await?;
    let attacker = "198.51.100.9";

    // A right password is refunded: it never counts towards a lockout.
    for _ in 0..10 {
        let a = server.login("192.0.2.1", "alice", "correct horse").await?;
        assert_eq!((a.status, a.body.as_str()), (StatusCode::OK, "welcome\n"));
    }

    // Five wrong guesses for alice, then she is locked: not even the right password
    // is looked at.
    for _ in 0..5 {
        let a = server.login(attacker, "alice", "123456").await?;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{}", a.body);
    }
    for ip in [attacker, "192.0.2.1"] {
        let a = server.login(ip, "alice", "correct horse").await?;
        assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "{}", a.body);
        assert!(a.body.contains("for this user"), "{}", a.body);
        // 5 per 15 minutes: one every 180 s.
        assert_eq!(a.header("retry-after"), Some("180"));
        // The layer's fields describe its own rules, which admitted this request
        // (it replaces any the handler writes): the lockout speaks through
        // `Retry-After` and the body only.
        let limit = a.header("ratelimit").ok_or("no RateLimit")?;
        assert!(limit.starts_with(r#""per-ip";r="#), "{limit}");
        assert!(!limit.contains("login"), "{limit}");
    }

    // After one interval, one attempt is back; a success gives it back again.
    clock.advance(Duration::from_secs(180));
    for _ in 0..3 {
        let a = server.login("192.0.2.1", "alice", "correct horse").await?;
        assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    }
    let a = server.login(attacker, "alice", "654321").await?;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{}", a.body);
    let a = server.login("192.0.2.1", "alice", "correct horse").await?;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "{}", a.body);

    // Per IP: 20 failures per 15 minutes from one address, one back every 45 s,
    // over any user names. The attacker's five at 0 s and one at 180 s (which gave
    // four back) leave 18; the attempts refused for the user cost the address nothing.
    for n in 0..18 {
        let a = server.login(attacker, &format!("user{n}"), "x").await?;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{n}: {}", a.body);
    }
    let a = server.login(attacker, "bob", "x").await?;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "{}", a.body);
    assert!(a.body.contains("from this address"), "{}", a.body);
    assert_eq!(a.header("retry-after"), Some("45"));
    // Bob from elsewhere is not locked out.
    let a = server.login("192.0.2.2", "bob", "x").await?;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{}", a.body);

    // A login request without the form fields is refused before anything is charged.
    let a = server
        .send(Method::POST, "/login", "192.0.2.3", Some("ent_login"), "")
        .await?;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.body);
    Ok(())
}

/// A `redis-server` on a free loopback port, stopped on drop.
struct Redis {
    child: Child,
    url: String,
}

impl Redis {
    /// `None` (after a `SKIPPED` line on stderr) when `redis-server` is not on `PATH`
    /// and `FLOODGATE_REQUIRE_REDIS` is not `1`.
    async fn start() -> Result<Option<Redis>, Error> {
        // A port found free can be taken before the server binds it (the Redis tests
        // start servers of their own): try a few.
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let spawned = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .stdout(Stdio::null())
                .spawn();
            let child = match spawned {
                Ok(child) => child,
                Err(e) if std::env::var("FLOODGATE_REQUIRE_REDIS").as_deref() != Ok("1") => {
                    eprintln!("SKIPPED: redis-server: {e}");
                    return Ok(None);
                }
                Err(e) => return Err(format!("redis-server: {e}").into()),
            };
            let mut redis = Redis {
                child,
                url: format!("redis://127.0.0.1:{port}/"),
            };
            if redis.listening().await? {
                return Ok(Some(redis));
            }
        }
        Err("redis-server did not start on a free loopback port".into())
    }

    /// Waits until this very server answers on its port (generous: a loaded machine
    /// may take seconds to start it); `false` when it exits first (the port was
    /// taken: whatever answers there is another server).
    async fn listening(&mut self) -> Result<bool, Error> {
        let pid = format!("process_id:{}", self.child.id());
        for _ in 0..200 {
            if self.child.try_wait()?.is_some() {
                return Ok(false);
            }
            if let Ok(info) = server_info(&self.url).await {
                if info.lines().any(|l| l.trim() == pid) {
                    return Ok(true);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err("redis-server did not listen within 10 s".into())
    }
}

/// `INFO server` from the Redis at `url`.
async fn server_info(url: &str) -> Result<String, Error> {
    use floodgate_redis::redis;
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    Ok(redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await?)
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn two_replicas_share_the_per_ip_limit_through_redis() -> TestResult {
    let Some(redis) = Redis::start().await? else {
        return Ok(());
    };
    // 30 a day: the server's clock cannot give a unit back while the test runs.
    let per_ip = Policy::per_day(30)?;
    let clock = ManualClock::new();
    let replica = |prefix| app::redis_per_ip(&redis.url, prefix, per_ip);
    let a = Server::start(&clock, replica("production-test:").await?).await?;
    let b = Server::start(&clock, replica("production-test:").await?).await?;

    // 15 through each replica (each under its own soft rule's burst of 20).
    for n in 0..30u64 {
        let server = if n % 2 == 0 { &a } else { &b };
        let r = server.get("203.0.113.50", Some("ent_r")).await?;
        assert_eq!(r.status, StatusCode::OK, "request {n}: {}", r.body);
        let limit = r.header("ratelimit").ok_or("no RateLimit")?;
        assert!(
            limit.starts_with(&format!(r#""per-ip";r={};"#, 29 - n)),
            "{limit}"
        );
    }
    for server in [&a, &b] {
        let r = server.get("203.0.113.50", Some("ent_r")).await?;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.body);
        // One a day: 2880 s after the first of the 30, on Redis's clock (less the
        // seconds the test has taken since on a loaded machine; rounded up).
        let retry: u64 = r.header("retry-after").ok_or("no Retry-After")?.parse()?;
        assert!((2_820..=2_880).contains(&retry), "Retry-After {retry}");
    }
    // Another client is untouched.
    let r = b.get("203.0.113.51", Some("ent_r")).await?;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(a.stats("per-ip")?.errors + b.stats("per-ip")?.errors, 0);

    // Redis gone: the shared rule is skipped and counted, the in-process rules hold.
    drop(redis);
    let r = a.get("203.0.113.50", Some("ent_r")).await?;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let limit = r.header("ratelimit").ok_or("no RateLimit")?;
    assert!(limit.starts_with(r#""plan";r="#), "{limit}");
    assert_eq!(a.stats("per-ip")?.errors, 1);
    Ok(())
}
