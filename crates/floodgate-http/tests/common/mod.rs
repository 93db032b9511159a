//! What the layer tests share: an inner service that always answers, and Tokio's
//! clock as a limiter's clock (so a paused runtime drives both the waits and the
//! limits, and no test sleeps for real).
#![allow(dead_code)]

use std::convert::Infallible;
use std::fmt;
use std::future::{ready, Future, Ready};
use std::task::{Context, Poll};

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use floodgate::keyed::plans::{PlanId, PlanLimiter, Plans};
use floodgate::{
    AsyncLimit, Clock, Decision, KeyedBuilder, ManualClock, Nanos, Policy, PolicyError,
};
use floodgate_http::{KeyError, RateLimitService};
use http::request::Parts;
use http::{Request, Response};
use tokio::time::Instant;
use tower::{Service, ServiceExt};

/// An inner service that answers every request `200 ok`, whatever its body.
#[derive(Clone)]
pub struct Hello;

impl<B> Service<Request<B>> for Hello {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<B>) -> Self::Future {
        ready(Ok(Response::new("ok".to_owned())))
    }
}

/// The tier from `x-tier` (0 = free, 1 = pro), for the priority rules.
pub fn tier(parts: &Parts) -> Result<usize, KeyError> {
    parts
        .headers
        .get("x-tier")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or(KeyError::missing("x-tier"))
}

/// A request from user `who` (`x-user`) in tier `tier` (`x-tier`).
pub fn tier_request(who: &str, tier: usize) -> Request<()> {
    Request::get("/")
        .header("x-user", who)
        .header("x-tier", tier.to_string())
        .body(())
        .unwrap_or_default()
}

/// Tokio's clock, in nanoseconds since `start`.
#[derive(Clone, Copy)]
pub struct TokioClock {
    pub start: Instant,
}

impl Clock for TokioClock {
    fn now(&self) -> Nanos {
        Nanos::new(u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }
}

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A plan resolver over `String` keys.
pub type Resolver = Box<dyn Fn(&String) -> PlanId + Send + Sync>;
/// The plan limiter of [`tiers`].
pub type Tiers = PlanLimiter<String, Resolver, ManualClock>;

/// `free` 10 a minute (burst 10: `w` = 60 s), `pro` 100 a minute with burst 20
/// (`w` = 12 s), and a resolver that counts its calls in `calls` and answers
/// `pick(n)` on call `n` (from 0).
pub fn tiers(
    clock: &ManualClock,
    calls: &Arc<AtomicU32>,
    pick: fn(u32, PlanId, PlanId) -> PlanId,
) -> Result<Tiers, String> {
    let policy = |p: Result<Policy, PolicyError>| p.map_err(|e| e.to_string());
    let mut plans = Plans::new();
    let free = plans.insert("free", policy(Policy::per_minute(10))?);
    let pro = plans.insert(
        "pro",
        policy(Policy::per_minute(100).and_then(|p| p.with_burst(20)))?,
    );
    let calls = Arc::clone(calls);
    let resolver: Resolver =
        Box::new(move |_: &String| pick(calls.fetch_add(1, Ordering::SeqCst), free, pro));
    PlanLimiter::new(
        &plans,
        resolver,
        KeyedBuilder::default().clock(clock.clone()),
    )
    .map_err(|e| e.to_string())
}

/// A remote limiter whose backend is down: every call fails.
pub struct Down;

/// [`Down`]'s error.
#[derive(Debug)]
pub struct Unreachable;

impl fmt::Display for Unreachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("backend unreachable")
    }
}

impl std::error::Error for Unreachable {}

impl AsyncLimit<()> for Down {
    type Error = Unreachable;

    fn check_n(
        &self,
        _: &(),
        _: u32,
    ) -> impl Future<Output = Result<Decision, Unreachable>> + Send {
        ready(Err(Unreachable))
    }

    fn peek_n(&self, _: &(), _: u32) -> impl Future<Output = Result<Decision, Unreachable>> + Send {
        ready(Err(Unreachable))
    }
}

/// The request's key: the `x-key` header.
pub fn key_of(parts: &Parts) -> Result<u64, KeyError> {
    parts
        .headers
        .get("x-key")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or(KeyError::Missing {
            what: "x-key".into(),
        })
}

/// The client named by the `x-client` header (a number).
pub fn client(parts: &Parts) -> Result<u64, KeyError> {
    parts
        .headers
        .get("x-client")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or(KeyError::Missing {
            what: "x-client".into(),
        })
}

/// SplitMix64: a seeded, reproducible stream.
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}

/// The plan limiter of [`even_free_odd_pro`].
pub type EvenOdd = PlanLimiter<u64, Box<dyn Fn(&u64) -> PlanId + Send + Sync>, ManualClock>;

/// A plan limiter on `clock`: even keys on plan `free`, odd keys on plan `pro`.
pub fn even_free_odd_pro(
    clock: &ManualClock,
    free: Policy,
    pro: Policy,
) -> Result<EvenOdd, Box<dyn std::error::Error>> {
    let mut plans = Plans::new();
    let free = plans.insert("free", free);
    let pro = plans.insert("pro", pro);
    let resolver: Box<dyn Fn(&u64) -> PlanId + Send + Sync> =
        Box::new(move |k: &u64| if k % 2 == 0 { free } else { pro });
    Ok(PlanLimiter::new(
        &plans,
        resolver,
        KeyedBuilder::default().clock(clock.clone()),
    )?)
}

/// A keyed limiter over `u64` keys running `algorithm` on `clock`.
pub fn keyed<A: floodgate::Algorithm>(
    algorithm: A,
    clock: &ManualClock,
) -> Result<floodgate::KeyedLimiter<u64, A, ManualClock>, Box<dyn std::error::Error>> {
    Ok(KeyedBuilder::new(algorithm)
        .clock(clock.clone())
        .build::<u64>()?)
}

/// Sends one request with `x-key: key` through `svc`: its status and headers.
pub async fn send_key(
    svc: &RateLimitService<Hello>,
    key: u64,
) -> Result<(u16, http::HeaderMap), Box<dyn std::error::Error>> {
    let req = Request::builder()
        .header("x-key", key.to_string())
        .body(())?;
    let resp = svc.clone().oneshot(req).await?;
    Ok((resp.status().as_u16(), resp.headers().clone()))
}
