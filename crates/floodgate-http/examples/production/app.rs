//! The `production` example's service, apart from `main` so that its test serves the
//! very same router on loopback with a [`ManualClock`](floodgate::ManualClock).
//!
//! Rules of the layer, checked in order on `GET /` and `POST /login` (`GET /health`
//! and `GET /stats` are outside it):
//!
//! 1. `per-ip` (hard): [`PER_IP`] per client IP, the client taken from
//!    `X-Forwarded-For` behind one trusted proxy; in process, or through Redis when
//!    the replicas share it ([`Shared::Redis`]: a Redis failure skips the rule for
//!    that request and counts in its `errors`);
//! 2. `per-ip-next` (shadow): [`PER_IP_NEXT`], a tighter limit on trial: it counts
//!    what it would deny and never blocks;
//! 3. `per-ip-warn` (soft): [`PER_IP_WARN`]: past it a request still passes, marked
//!    `X-RateLimit-Exceeded: "per-ip-warn"` (its only header: the rate-limit fields
//!    speak of the rules that can refuse);
//! 4. `plan` (hard): per API key (`X-Api-Key`) by plan: `ent_…` enterprise,
//!    `pro_…` pro, any other key free; requests without a key share one free-plan
//!    bucket, keyed `""` (a key no client can send);
//! 5. `global` (hard): [`GLOBAL`] for the whole replica.
//!
//! `POST /login` (body `user=NAME&password=SECRET`) adds brute-force protection in
//! the handler, where the user name is known: [`LOGIN_PER_USER`] failures per user
//! name and [`LOGIN_PER_IP`] per client IP, charged as one composite before the
//! password is checked ([`floodgate::charge_all`]: both or neither) and given back
//! when it was right ([`floodgate::refund_all`]).
//!
//! Two things to weigh before copying it. A per-user limit lets anyone who knows a
//! user name lock that account out for the limit's wait, from any addresses: the
//! price of stopping guesses spread over many addresses. A service that cannot
//! accept it keys that limit by (user, client network), or answers a locked account
//! with a second factor rather than a refusal. And the user table is a demo: a real
//! service stores password hashes (argon2, scrypt) and compares them in constant
//! time; the limiter only caps how many guesses reach that comparison.

use std::future::ready;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::to_bytes;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use floodgate::keyed::plans::{PlanLimiter, Plans};
use floodgate::{
    charge_all, refund_all, Clock, Gcra, GcraState, Heap, KeyedBuilder, KeyedLimiter, Limit,
    Policy, PolicyId, RateLimiter, Storage,
};
use floodgate_http::{
    ForwardedIp, Global, HeaderKey, HeaderOptions, KeyExtractor, OnLimiterError, OnMissingKey,
    RateLimitLayer, Rule, Strategy, TrustedProxies,
};
use floodgate_redis::RedisLimiter;

/// A configuration or start-up error, for `?` in `main` and in tests.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// `per-ip`: 120 a minute, at most 30 at once.
pub const PER_IP: (u64, Duration, u64) = (120, Duration::from_secs(60), 30);
/// `per-ip-next` (shadow): 60 a minute, at most 10 at once.
pub const PER_IP_NEXT: (u64, Duration, u64) = (60, Duration::from_secs(60), 10);
/// `per-ip-warn` (soft): 90 a minute, at most 20 at once.
pub const PER_IP_WARN: (u64, Duration, u64) = (90, Duration::from_secs(60), 20);
/// `global`: 10 000 a second for the replica.
pub const GLOBAL: (u64, Duration, u64) = (10_000, Duration::from_secs(1), 10_000);
/// Failed logins per user name: 5 per 15 minutes.
pub const LOGIN_PER_USER: (u64, Duration, u64) = (5, Duration::from_secs(900), 5);
/// Failed logins per client IP, whatever the user name: 20 per 15 minutes.
pub const LOGIN_PER_IP: (u64, Duration, u64) = (20, Duration::from_secs(900), 20);

/// `(limit, period, burst)` as a policy.
pub fn policy((limit, period, burst): (u64, Duration, u64)) -> Result<Policy, Error> {
    Ok(Policy::new(limit, period)?.with_burst(burst)?)
}

/// The plans: free 10 a minute (burst 5), pro 100 a minute (burst 20), enterprise
/// 1000 a minute (burst 100); free is the default.
pub fn plans() -> Result<Plans, Error> {
    let mut plans = Plans::new();
    plans.insert("free", Policy::per_minute(10)?.with_burst(5)?);
    plans.insert("pro", Policy::per_minute(100)?.with_burst(20)?);
    plans.insert("enterprise", Policy::per_minute(1_000)?.with_burst(100)?);
    Ok(plans)
}

/// Where the `per-ip` limit lives.
pub enum Shared {
    /// In this process: each replica counts its own.
    Local,
    /// In Redis, shared by every replica built on the same prefix: the limiter and
    /// the policy it was built with (for the headers' window).
    Redis(Box<RedisLimiter>, Policy),
}

/// The `per-ip` limit at `per_ip` through the Redis at `url`, on keys under `prefix`.
pub async fn redis_per_ip(url: &str, prefix: &str, per_ip: Policy) -> Result<Shared, Error> {
    let conn = floodgate_redis::connect(url).await?;
    let limiter = RedisLimiter::builder(floodgate_redis::Algorithm::Gcra, per_ip)
        .prefix(prefix)
        .timeout(Duration::from_millis(200))
        // Redis down: the error reaches the layer, which counts it in the rule's
        // `errors` and skips the rule (its `OnLimiterError::FailOpen`).
        // `OnFailure::Open` here would admit too, but the layer would count those
        // admissions as `allowed`, and the outage would not show.
        .on_failure(floodgate_redis::OnFailure::Error)
        .build(conn)?;
    Ok(Shared::Redis(Box::new(limiter), per_ip))
}

/// `ConnectInfo<SocketAddr>`, as `into_make_service_with_connect_info` inserts it.
fn connect_info(ext: &http::Extensions) -> Option<IpAddr> {
    ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip())
}

/// How many keys each per-client table holds (IPs, user names). Past that, the
/// table makes room by evicting a key whose loss forgives the fewest units; memory
/// never grows past it.
pub const KEYS: usize = 100_000;

/// A GCRA table of [`KEYS`] keys on `clock`.
fn table<K, C: Clone>(policy: Policy, clock: &C) -> Result<KeyedLimiter<K, Gcra, C>, Error>
where
    Heap: Storage<K, GcraState>,
{
    Ok(KeyedBuilder::new(Gcra::new(policy))
        .capacity(KEYS)
        .clock(clock.clone())
        .build()?)
}

/// The client IP: the entry the trusted proxy appended to `X-Forwarded-For`, or the
/// peer itself when it is not the proxy.
pub fn client_ip(trusted_proxy: &str) -> Result<ForwardedIp, Error> {
    Ok(ForwardedIp::x_forwarded_for(TrustedProxies::new([trusted_proxy])?, 1).lookup(connect_info))
}

/// The service: its router (to serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`) and its rate-limit layer
/// (whose `stats` it serves at `GET /stats`, beside `GET /health`, both outside the
/// limits).
pub fn app<C>(
    clock: C,
    trusted_proxy: &str,
    per_ip: Shared,
) -> Result<(Router, RateLimitLayer), Error>
where
    C: Clock + Clone + 'static,
{
    let client = client_ip(trusted_proxy)?;
    let keyed = |p: Policy| table::<IpAddr, C>(p, &clock);

    let per_ip_policy = policy(PER_IP)?;
    let per_ip_rule = |builder: floodgate_http::RateLimitLayerBuilder| -> Result<_, Error> {
        Ok(match per_ip {
            Shared::Local => builder.rule(
                Rule::new("per-ip", keyed(per_ip_policy)?, client.clone())?
                    .window_of(&per_ip_policy),
            ),
            Shared::Redis(redis, redis_policy) => builder.rule(
                Rule::remote("per-ip", *redis, client.clone())?
                    .window_of(&redis_policy)
                    // Redis down: skip this rule (counted in its `errors`); the
                    // in-process rules still hold.
                    .on_limiter_error(OnLimiterError::FailOpen),
            ),
        })
    };

    let next_policy = policy(PER_IP_NEXT)?;
    let warn_policy = policy(PER_IP_WARN)?;
    let plans = plans()?;
    let (free, pro, enterprise) = (
        plans.id("free").ok_or("no free plan")?,
        plans.id("pro").ok_or("no pro plan")?,
        plans.id("enterprise").ok_or("no enterprise plan")?,
    );
    let resolver = move |key: &String| {
        if key.starts_with("ent_") {
            enterprise
        } else if key.starts_with("pro_") {
            pro
        } else {
            free
        }
    };
    let per_key = PlanLimiter::new(
        &plans,
        resolver,
        KeyedBuilder::default().capacity(KEYS).clock(clock.clone()),
    )?;
    let global_policy = policy(GLOBAL)?;

    let layer = per_ip_rule(RateLimitLayer::builder())?
        .rule(
            Rule::new("per-ip-next", keyed(next_policy)?, client.clone())?
                .window_of(&next_policy)
                .strategy(Strategy::Shadow),
        )
        .rule(
            Rule::new("per-ip-warn", keyed(warn_policy)?, client.clone())?
                .window_of(&warn_policy)
                .strategy(Strategy::Soft),
        )
        .rule(
            // Plans differ in window: each request's member advertises its key's plan's.
            Rule::new("plan", per_key, HeaderKey::new("x-api-key")?)?
                .on_missing_key(OnMissingKey::Fallback(String::new())),
        )
        .rule(
            Rule::new(
                "global",
                RateLimiter::gcra_with_clock(global_policy, clock.clone()),
                Global,
            )?
            .window_of(&global_policy),
        )
        // The soft rule warns through `X-RateLimit-Exceeded` only: shown, it would put
        // `X-RateLimit-Remaining: 0` on requests `per-ip` still admits.
        .headers(HeaderOptions::default().include_soft(false))
        .build()?;

    let login = Arc::new(Login {
        per_user: table(policy(LOGIN_PER_USER)?, &clock)?,
        per_ip: keyed(policy(LOGIN_PER_IP)?)?,
        client,
        users: vec![("alice".to_owned(), "correct horse".to_owned())],
    });

    let stats = layer.clone();
    let limited = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/login", post(login_handler::<C>))
        .with_state(login)
        .layer(layer.clone());
    // Outside the layer: a flood that spends the `global` budget must not fail the
    // balancer's health checks (it would take this replica out of rotation). Inside,
    // they would also need `ForwardedIp::peer_when_header_absent`: they come from the
    // trusted proxy itself, with no `X-Forwarded-For`, which `per-ip` answers 400.
    let operations = Router::new()
        .route("/health", get(|| async { "ok\n" }))
        .route("/stats", get(move || ready(stats_text(&stats))));
    Ok((limited.merge(operations), layer))
}

/// One line per rule: its counters.
fn stats_text(layer: &RateLimitLayer) -> String {
    layer.stats().iter().map(|s| format!("{s}\n")).collect()
}

/// What `POST /login` needs.
pub struct Login<C: Clock> {
    per_user: KeyedLimiter<String, Gcra, C>,
    per_ip: KeyedLimiter<IpAddr, Gcra, C>,
    client: ForwardedIp,
    users: Vec<(String, String)>,
}

/// `name=value&…` form fields, undecoded (enough for this example's clients).
fn field<'a>(body: &'a str, name: &str) -> Option<&'a str> {
    body.split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
}

fn answer(status: StatusCode, text: &str) -> Response {
    (status, format!("{text}\n")).into_response()
}

/// The policy ids that say which login limit refused an attempt.
const BY_USER: PolicyId = PolicyId::new(1);
const BY_IP: PolicyId = PolicyId::new(2);

/// Charge first (every guess counts the moment it arrives, so parallel guesses cannot
/// all pass the gate), check the password, refund when it was right.
async fn login_handler<C: Clock + 'static>(
    State(login): State<Arc<Login<C>>>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let ip = match login.client.extract(&parts) {
        Ok(ip) => ip,
        Err(e) => return answer(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let Ok(body) = to_bytes(body, 4 * 1024).await else {
        return answer(StatusCode::PAYLOAD_TOO_LARGE, "body over 4 KiB");
    };
    let body = String::from_utf8_lossy(&body);
    let (Some(user), Some(password)) = (field(&body, "user"), field(&body, "password")) else {
        return answer(StatusCode::BAD_REQUEST, "need user=…&password=…");
    };

    // One composite: both limits charged, or neither (an attempt refused for the
    // user never reached the password and costs the address nothing). The address
    // first: an address already refused never touches the user's limit.
    let limits = [
        &login.per_ip.limit(&ip).with_policy_id(BY_IP) as &dyn Limit,
        &login.per_user.limit(user).with_policy_id(BY_USER),
    ];
    let (gate, receipt) = charge_all(&limits, 1);
    if !gate.is_allowed() {
        return if gate.policy() == BY_USER {
            too_many(&gate, "too many failed logins for this user")
        } else {
            too_many(&gate, "too many failed logins from this address")
        };
    }
    // Demo only: plain text and `==` (see the module docs for what a service does).
    let known = login.users.iter().any(|(u, p)| u == user && p == password);
    if known {
        // Not a failure: both attempts come back (a `reset` of the user's key would
        // also forgive an attacker's failures each time the owner logs in).
        refund_all(&limits, receipt);
        return answer(StatusCode::OK, "welcome");
    }
    answer(StatusCode::UNAUTHORIZED, "wrong user or password")
}

/// 429 with `Retry-After` (rounded up, as the layer writes it). No `RateLimit`
/// member for the login limits: this layer replaces the rate-limit fields of every
/// response it passes with its own rules' (`Retry-After` it leaves alone); one
/// built with `HeaderOptions::keep_service_fields(true)` would keep such a member.
fn too_many(decision: &floodgate::Decision, text: &str) -> Response {
    let mut response = answer(StatusCode::TOO_MANY_REQUESTS, text);
    if let Some(value) = floodgate_http::retry_after(decision) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

/// Serves `router` on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, router: Router) -> std::io::Result<()> {
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}
