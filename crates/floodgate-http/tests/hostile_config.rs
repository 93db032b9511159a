//! Configurations a user can get wrong and inputs a client or a proxy controls, where
//! no other test looks: each is refused at build time naming what is wrong, or has
//! the meaning the documentation gives it.
//!
//! * `RateLimitLayerBuilder::never_status`: the never-fits answer is a client or
//!   server error (4xx, 5xx); anything else is refused by `build`.
//! * `ForwardedIp`: an RFC 7239 node with an obfuscated port names its address; the
//!   length bound counts the header's bytes, one line or several alike.
//! * `RateLimitLayer`: a layer without rules passes every request unmarked; a request
//!   passed to the inner service keeps its charge, whatever the service answers.
//! * `Strategy::Soft` and `Strategy::Shadow` never block: a missing key or a failed
//!   limiter on such a rule skips it.
//! * An extractor's length bound of 0 (`HeaderKey`, `RoutePath`, `ForwardedIp`),
//!   which no key fits under, is refused naming the bound.
//! * A rule whose cost its in-process limiter can never admit (above a GCRA burst, a
//!   window's or a log's limit) is refused by `build`, whatever its strategy; on a
//!   plan limiter, a cost above any plan's capacity is refused naming the plan; a
//!   remote limiter, which cannot tell without a request, is not.

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::net::IpAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use floodgate::{KeyedLimiter, ManualClock, Policy, RateLimiter};
use floodgate_http::{
    ConfigError, ForwardedIp, Global, HeaderKey, KeyError, OnLimiterError, RateLimitLayer, Rule,
    Strategy, TrustedProxies,
};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use tower::{Layer, Service, ServiceExt};
mod common;
use common::{Down, Hello, TestResult};

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

fn lines(name: &'static str, values: &[&str]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for v in values {
        h.append(name, HeaderValue::from_str(v).expect("test header value"));
    }
    h
}

/// Asserts that `extractor`, behind the trusted peer 10.0.0.1, finds the entry
/// `sent` in header `name` malformed.
fn assert_malformed(extractor: &ForwardedIp, name: &'static str, sent: &str) {
    let h = lines(name, &[sent]);
    assert!(
        matches!(
            extractor.client_ip(ip("10.0.0.1"), &h),
            Err(KeyError::Malformed { .. })
        ),
        "{name}: {sent}"
    );
}

fn one_per_second(
    clock: &ManualClock,
) -> Result<RateLimiter<floodgate::Gcra, ManualClock>, floodgate::PolicyError> {
    Ok(RateLimiter::gcra_with_clock(
        Policy::per_second(1)?,
        clock.clone(),
    ))
}

#[test]
fn a_never_fits_status_that_is_no_error_is_refused() -> TestResult {
    let layer = |status| {
        RateLimitLayer::builder()
            .rule(Rule::new(
                "r",
                one_per_second(&ManualClock::new())?,
                Global,
            )?)
            .never_status(status)
            .build()
            .map_err(Box::<dyn std::error::Error>::from)
    };
    for status in [
        StatusCode::OK,
        StatusCode::NO_CONTENT,
        StatusCode::SWITCHING_PROTOCOLS,
        StatusCode::FOUND,
        StatusCode::NOT_MODIFIED,
    ] {
        let err = layer(status).expect_err("a status that is no error is refused");
        let err = err.downcast::<ConfigError>()?;
        assert_eq!(
            *err,
            ConfigError::NeverStatus {
                status: status.as_u16()
            }
        );
        assert!(
            err.to_string().contains(status.as_str()),
            "the error names the status: {err}"
        );
    }
    for status in [
        StatusCode::BAD_REQUEST,
        StatusCode::PAYLOAD_TOO_LARGE,
        StatusCode::TOO_MANY_REQUESTS,
        StatusCode::SERVICE_UNAVAILABLE,
    ] {
        layer(status)?;
    }
    Ok(())
}

#[test]
fn a_forwarded_node_with_an_obfuscated_port_names_its_address() {
    let trusted = TrustedProxies::new(["10.0.0.0/8"]).expect("test networks");
    let one = ForwardedIp::forwarded(trusted.clone(), 1);
    let peer = ip("10.0.0.1");
    // RFC 7239 §6: node = nodename [ ":" node-port ], node-port = port / obfport.
    for (sent, want) in [
        (r#"for="192.0.2.43:_abc""#, "192.0.2.43"),
        (r#"for="192.0.2.43:_x.y-z_1""#, "192.0.2.43"),
        (r#"for="[2001:db8::1]:_p""#, "2001:db8::1"),
        (r#"for="[2001:db8::1]:8080""#, "2001:db8::1"),
    ] {
        let h = lines("forwarded", &[sent]);
        assert_eq!(one.client_ip(peer, &h), Ok(ip(want)), "{sent}");
    }
    // An obfport is "_" and at least one more character of its set; a port is digits.
    for sent in [
        r#"for="192.0.2.43:_""#,
        r#"for="192.0.2.43:_a b""#,
        r#"for="192.0.2.43:""#,
        r#"for="[2001:db8::1]:""#,
        r#"for="[2001:db8::1]:_""#,
    ] {
        assert_malformed(&one, "forwarded", sent);
    }
    // X-Forwarded-For has no obfuscated ports, nor empty ones.
    let xff = ForwardedIp::x_forwarded_for(trusted, 1);
    for sent in ["192.0.2.43:_abc", "192.0.2.43:", "[2001:db8::1]:"] {
        assert_malformed(&xff, "x-forwarded-for", sent);
    }
}

#[test]
fn the_length_bound_is_the_same_for_one_line_and_for_several() {
    let trusted = TrustedProxies::new(["10.0.0.0/8"]).expect("test networks");
    let peer = ip("10.0.0.1");
    for (name, one_line, split) in [
        (
            "x-forwarded-for",
            &["203.0.113.1,10.0.0.2,10.0.0.3"][..],
            &["203.0.113.1", "10.0.0.2", "10.0.0.3"][..],
        ),
        (
            "forwarded",
            &["for=203.0.113.1,for=10.0.0.2,for=10.0.0.3"][..],
            &["for=203.0.113.1", "for=10.0.0.2", "for=10.0.0.3"][..],
        ),
    ] {
        for values in [one_line, split] {
            let len: usize = values.iter().map(|v| v.len()).sum();
            let h = lines(name, values);
            let header = if name == "forwarded" {
                ForwardedIp::forwarded(trusted.clone(), 3)
            } else {
                ForwardedIp::x_forwarded_for(trusted.clone(), 3)
            };
            // Exactly the header's length: every entry lies within the bound.
            assert_eq!(
                header
                    .clone()
                    .max_len(len)
                    .expect("a bound above 0")
                    .client_ip(peer, &h),
                Ok(ip("203.0.113.1")),
                "{values:?} within {len} bytes"
            );
            // One byte less: the leftmost entry read lies beyond it.
            let err = header
                .max_len(len - 1)
                .expect("a bound above 0")
                .client_ip(peer, &h)
                .unwrap_err();
            assert!(
                matches!(err, KeyError::Oversized { len: l, max, .. } if l == len && max == len - 1),
                "{values:?}: {err}"
            );
        }
    }
}

#[tokio::test]
async fn a_layer_without_rules_passes_every_request_unmarked() -> TestResult {
    let layer = RateLimitLayer::builder().build()?;
    assert!(layer.stats().is_empty());
    let resp = layer.layer(Hello).oneshot(Request::new(())).await?;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.headers().is_empty(), "{:?}", resp.headers());
    Ok(())
}

/// An inner service that fails every request, or panics on it.
#[derive(Clone)]
struct Fails {
    panic: bool,
}

impl<B> Service<Request<B>> for Fails {
    type Response = Response<String>;
    type Error = &'static str;
    type Future = Ready<Result<Response<String>, &'static str>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), &'static str>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<B>) -> Self::Future {
        assert!(!self.panic, "the inner service panics");
        ready(Err("the inner service failed"))
    }
}

#[tokio::test]
async fn a_request_the_inner_service_fails_keeps_its_charge() -> TestResult {
    for panic in [false, true] {
        let clock = ManualClock::new();
        let limiter = Arc::new(one_per_second(&clock)?);
        let layer = RateLimitLayer::builder()
            .rule(Rule::shared("r", Arc::clone(&limiter), Global)?)
            .build()?;
        let svc = layer.layer(Fails { panic });
        let outcome = tokio::spawn(svc.oneshot(Request::new(()))).await;
        if panic {
            assert!(outcome.expect_err("the task panicked").is_panic());
        } else {
            assert_eq!(outcome?.err(), Some("the inner service failed"));
        }
        // The request reached the service: its unit stays taken.
        assert_eq!(limiter.peek(0).remaining(), 0, "panic: {panic}");
        let resp = layer
            .layer(Hello)
            .oneshot(Request::new(()))
            .await
            .map_err(|e: Infallible| e)?;
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(layer.stats()[0].allowed, 1);
    }
    Ok(())
}

/// A soft or shadow rule never blocks: not for a request without its key (with
/// `OnMissingKey::Reject`), nor when its limiter fails (with `FailClosed`). Each is
/// counted, the rule is skipped, and a hard rule after it still decides.
#[tokio::test]
async fn soft_and_shadow_rules_never_block_for_a_missing_key_or_a_failed_limiter() -> TestResult {
    for strategy in [Strategy::Soft, Strategy::Shadow] {
        let clock = ManualClock::new();
        // No request here has the key: the clock of this limiter never matters.
        let per_key: KeyedLimiter<String> = KeyedLimiter::gcra(Policy::per_second(1)?);
        let layer = RateLimitLayer::builder()
            .rule(Rule::new("per-key", per_key, HeaderKey::new("x-api-key")?)?.strategy(strategy))
            .rule(Rule::remote("down", Down, Global)?.strategy(strategy))
            .rule(Rule::new("global", one_per_second(&clock)?, Global)?)
            .on_limiter_error(OnLimiterError::FailClosed)
            .build()?;
        let svc = layer.layer(Hello);
        let resp = svc.clone().oneshot(Request::new(())).await?;
        assert_eq!(resp.status(), StatusCode::OK, "{strategy:?}");
        let stats = layer.stats();
        assert_eq!((stats[0].bad_key, stats[0].allowed), (1, 0), "{strategy:?}");
        assert_eq!(stats[1].errors, 1, "{strategy:?}");
        assert_eq!(stats[2].allowed, 1, "{strategy:?}");
        // The hard rule after them still denies.
        let resp = svc.oneshot(Request::new(())).await?;
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS, "{strategy:?}");
    }
    Ok(())
}

#[test]
fn a_trusted_network_is_digits_after_the_slash_and_nothing_else() {
    for bad in [
        "10.0.0.0/+8",
        "10.0.0.0/ 8",
        "10.0.0.0/8 ",
        "::/+0",
        "10.0.0.0/-0",
    ] {
        let err = TrustedProxies::new([bad]).expect_err(bad);
        assert!(
            matches!(&err, ConfigError::Network { text, .. } if text == bad),
            "{bad}: {err}"
        );
    }
    // Overlapping networks and host bits past the prefix are accepted.
    let t = TrustedProxies::new(["10.0.0.1/8", "10.1.0.0/16", "10.0.0.0/8"]).expect("networks");
    assert!(t.contains(ip("10.200.0.1")));
    assert!(!t.contains(ip("11.0.0.1")));
}

/// A queue's `max_delay` of zero queues nothing (what is not free now is refused
/// with `Retry-After`); one of `Duration::MAX` bounds nothing (every request waits
/// for its slot), on one queue and per key alike.
#[cfg(feature = "queue")]
#[tokio::test(start_paused = true)]
async fn a_queue_bound_of_zero_or_of_centuries_has_its_plain_meaning() -> TestResult {
    use common::TokioClock;
    use floodgate::Shaper;
    use floodgate_http::{KeyedQueueRule, QueueRule};
    use std::time::Duration;
    use tokio::time::Instant;

    // 10 per second, one at a time: slots 100 ms apart.
    let policy = Policy::per_second(10)?.with_burst(1)?;
    for max_delay in [Duration::ZERO, Duration::MAX] {
        let start = Instant::now();
        let clock = TokioClock { start };
        let key = HeaderKey::new("x-api-key")?;
        let layers = [
            RateLimitLayer::builder()
                .queue(QueueRule::new(
                    "q",
                    Shaper::with_clock(policy, clock),
                    max_delay,
                )?)
                .build()?,
            RateLimitLayer::builder()
                .queue_per_key(KeyedQueueRule::new(
                    "q",
                    key,
                    floodgate::KeyedBuilder::new(floodgate::Gcra::new(policy))
                        .clock(clock)
                        .build()?,
                    max_delay,
                )?)
                .build()?,
        ];
        for layer in layers {
            let svc = layer.layer(Hello);
            let calls: Vec<_> = (0..3)
                .map(|_| {
                    let req = Request::get("/").header("x-api-key", "k").body(())?;
                    Ok(tokio::spawn(svc.clone().oneshot(req)))
                })
                .collect::<Result<_, http::Error>>()?;
            let mut answers = Vec::new();
            for call in calls {
                let resp = call.await??;
                let retry = resp.headers().get("retry-after").cloned();
                answers.push((resp.status().as_u16(), start.elapsed(), retry));
            }
            if max_delay.is_zero() {
                assert_eq!(answers[0].0, 200);
                for (status, at, retry) in &answers[1..] {
                    assert_eq!((*status, *at), (429, Duration::ZERO));
                    assert_eq!(retry.as_ref().map(|v| v.to_str().ok()), Some(Some("1")));
                }
            } else {
                for (i, (status, at, _)) in answers.iter().enumerate() {
                    assert_eq!(*status, 200, "request {i}");
                    assert!(
                        *at >= Duration::from_millis(100) * (i as u32),
                        "request {i}: {at:?}"
                    );
                }
            }
        }
    }
    Ok(())
}

#[test]
fn an_ipv6_zone_id_is_dropped_in_every_form_of_the_address() {
    let trusted = TrustedProxies::new(["10.0.0.0/8"]).expect("test networks");
    let xff = ForwardedIp::x_forwarded_for(trusted.clone(), 1);
    let fwd = ForwardedIp::forwarded(trusted, 1);
    let peer = ip("10.0.0.1");
    // Before, only "[fe80::1%2]:80" parsed (the standard library's socket address
    // takes a numeric zone), while the same address bare or bracketed was malformed.
    for sent in [
        "fe80::1%eth0",
        "fe80::1%2",
        "[fe80::1%eth0]",
        "[fe80::1%eth0]:80",
        "[fe80::1%2]:80",
        "[fe80::1%25en0]:8080",
    ] {
        let h = lines("x-forwarded-for", &[sent]);
        assert_eq!(xff.client_ip(peer, &h), Ok(ip("fe80::1")), "{sent}");
        let h = lines("forwarded", &[&format!("for=\"{sent}\"")]);
        assert_eq!(fwd.client_ip(peer, &h), Ok(ip("fe80::1")), "{sent}");
    }
    // A zone is one or more unreserved characters, after an IPv6 address only.
    for sent in [
        "fe80::1%",
        "[fe80::1%]:80",
        "fe80::1%et h0",
        "fe80::1%eth0:80",
        "192.0.2.1%eth0",
        "[192.0.2.1%eth0]:80",
    ] {
        assert_malformed(&xff, "x-forwarded-for", sent);
    }
}

#[test]
fn a_pseudo_header_or_an_invalid_name_is_no_header_key() {
    for name in [":authority", ":path", "", "x api key", "x-api-key\r\n", "é"] {
        let err = HeaderKey::new(name).expect_err(name);
        assert_eq!(
            err,
            ConfigError::HeaderName {
                name: name.to_owned()
            }
        );
    }
    // Names are case-insensitive: any case reads the same field.
    let key = HeaderKey::new("X-Api-Key").expect("a valid name");
    let (parts, ()) = Request::get("/")
        .header("x-api-key", "k")
        .body(())
        .expect("request")
        .into_parts();
    assert_eq!(
        floodgate_http::KeyExtractor::extract(&key, &parts),
        Ok("k".to_owned())
    );
}

#[test]
fn route_paths_at_and_around_the_bound_and_in_every_request_form() -> TestResult {
    use floodgate_http::{KeyExtractor, RoutePath};

    let head = |uri: &str, method: http::Method| -> Result<http::request::Parts, http::Error> {
        Ok(Request::builder()
            .method(method)
            .uri(uri)
            .body(())?
            .into_parts()
            .0)
    };
    let at = format!("/{}", "a".repeat(1023));
    let over = format!("/{}", "a".repeat(1024));
    let path = RoutePath::new();
    assert_eq!(path.extract(&head(&at, http::Method::GET)?)?, at);
    assert_eq!(
        path.extract(&head(&format!("{over}?q=1"), http::Method::GET)?),
        Err(KeyError::Oversized {
            what: "path".into(),
            len: 1025,
            max: 1024
        })
    );
    // The query is no part of the key; asterisk- and authority-form requests have
    // keys of their own, never an error.
    assert_eq!(path.extract(&head("/a?b=c", http::Method::GET)?)?, "/a");
    assert_eq!(path.extract(&head("*", http::Method::OPTIONS)?)?, "*");
    let connect = head("example.com:443", http::Method::CONNECT)?;
    assert_eq!(path.extract(&connect)?, "");
    Ok(())
}

#[test]
fn a_length_bound_of_zero_is_refused_naming_the_bound() -> TestResult {
    use floodgate_http::RoutePath;

    let trusted = TrustedProxies::new(["10.0.0.0/8"])?;
    let errors = [
        HeaderKey::new("x-api-key")?.max_len(0).map(drop),
        RoutePath::new().max_len(0).map(drop),
        ForwardedIp::x_forwarded_for(trusted.clone(), 1)
            .max_len(0)
            .map(drop),
        ForwardedIp::forwarded(trusted.clone(), 1)
            .max_len(0)
            .map(drop),
    ];
    let fields = [
        "HeaderKey::max_len",
        "RoutePath::max_len",
        "ForwardedIp::max_len",
        "ForwardedIp::max_len",
    ];
    for (err, field) in errors.into_iter().zip(fields) {
        let err = err.expect_err(field);
        assert_eq!(err, ConfigError::MaxLen { field, max_len: 0 });
        assert!(
            err.to_string().starts_with(&format!("{field} 0: ")),
            "{err}"
        );
    }
    // One byte is a bound: a one-byte key passes it, a two-byte one does not.
    let key = HeaderKey::new("x-api-key")?.max_len(1)?;
    let head = |v: &str| -> Result<http::request::Parts, http::Error> {
        Ok(Request::get("/")
            .header("x-api-key", v)
            .body(())?
            .into_parts()
            .0)
    };
    assert_eq!(
        floodgate_http::KeyExtractor::extract(&key, &head("k")?),
        Ok("k".to_owned())
    );
    assert!(matches!(
        floodgate_http::KeyExtractor::extract(&key, &head("kk")?),
        Err(KeyError::Oversized { len: 2, max: 1, .. })
    ));
    assert!(RoutePath::new().max_len(1).is_ok());
    assert!(ForwardedIp::forwarded(trusted, 1).max_len(1).is_ok());
    Ok(())
}

/// The layer of one rule, or why it cannot be built.
fn build_one<L, E>(rule: Rule<L, E>) -> Result<RateLimitLayer, ConfigError>
where
    L: floodgate::AsyncLimit<E::Key> + 'static,
    E: floodgate_http::KeyExtractor,
{
    RateLimitLayer::builder().rule(rule).build()
}

/// The rule `make(cost)` builds at a cost of `capacity`, and is refused at one more,
/// naming its rule, the cost and `capacity`.
fn fits_up_to<L, E>(
    capacity: u32,
    make: impl Fn(u32) -> Result<Rule<L, E>, Box<dyn std::error::Error>>,
) -> TestResult
where
    L: floodgate::AsyncLimit<E::Key> + 'static,
    E: floodgate_http::KeyExtractor,
{
    build_one(make(capacity)?)?;
    let err = build_one(make(capacity + 1)?).expect_err("a cost above the capacity");
    assert!(
        matches!(&err, ConfigError::Cost { cost, capacity: c, .. } if *cost == capacity + 1 && *c == u64::from(capacity)),
        "{err}"
    );
    Ok(())
}

/// On every strategy, the rule `make(cost)` builds at each cost of `fits` and is
/// refused at each of `refused` with its error.
fn judged_on_every_strategy<L, E>(
    make: impl Fn(u32) -> Result<Rule<L, E>, Box<dyn std::error::Error>>,
    fits: &[u32],
    refused: &[(u32, ConfigError)],
) -> TestResult
where
    L: floodgate::AsyncLimit<E::Key> + 'static,
    E: floodgate_http::KeyExtractor,
{
    for strategy in [Strategy::Hard, Strategy::Soft, Strategy::Shadow] {
        for &cost in fits {
            build_one(make(cost)?.strategy(strategy))?;
        }
        for (cost, error) in refused {
            let err = build_one(make(*cost)?.strategy(strategy)).expect_err("refused");
            assert_eq!(&err, error, "{strategy:?}");
        }
    }
    Ok(())
}

#[test]
fn a_cost_no_key_can_ever_pay_is_refused_when_built() -> TestResult {
    use floodgate::{FixedWindow, KeyedBuilder, SlidingWindow};

    let clock = ManualClock::new();
    let cost_error = |rule: &str, cost, capacity| ConfigError::Cost {
        rule: rule.to_owned(),
        cost,
        capacity,
    };
    // GCRA: the burst (4 of 10 a minute), on every strategy.
    let gcra = || -> Result<_, floodgate::PolicyError> {
        Ok(RateLimiter::gcra_with_clock(
            Policy::per_minute(10)?.with_burst(4)?,
            clock.clone(),
        ))
    };
    judged_on_every_strategy(
        |cost| Ok(Rule::new("burst", gcra()?, Global)?.cost(cost)),
        &[4, 0],
        &[
            (5, cost_error("burst", 5, 4)),
            (u32::MAX, cost_error("burst", u32::MAX, 4)),
        ],
    )?;
    let err = build_one(Rule::new("burst", gcra()?, Global)?.cost(5)).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"rule "burst": cost 5 is more than the 4 units its limiter admits at once, so no request could ever pass"#
    );
    // The windows: their limit (the burst is not theirs).
    let policy = Policy::per_minute(10)?.with_burst(2)?;
    fits_up_to(10, |cost| {
        let fixed = RateLimiter::fixed_window_with_clock(policy, clock.clone())?;
        Ok(Rule::new("fixed", fixed, Global)?.cost(cost))
    })?;
    fits_up_to(10, |cost| {
        let sliding = RateLimiter::sliding_window_with_clock(policy, clock.clone())?;
        Ok(Rule::new("sliding", sliding, Global)?.cost(cost))
    })?;
    // Per key: a keyed GCRA, a keyed window, the keyed log.
    let key = || HeaderKey::new("x-api-key");
    let keyed_gcra: KeyedLimiter<String, floodgate::Gcra, ManualClock> =
        KeyedBuilder::new(floodgate::Gcra::new(Policy::per_second(3)?))
            .clock(clock.clone())
            .build()?;
    assert_eq!(
        build_one(Rule::new("per-key", keyed_gcra, key()?)?.cost(4)).unwrap_err(),
        cost_error("per-key", 4, 3)
    );
    let keyed_window: KeyedLimiter<String, FixedWindow, ManualClock> =
        KeyedBuilder::new(FixedWindow::new(Policy::per_second(3)?)?)
            .clock(clock.clone())
            .build()?;
    build_one(Rule::new("per-key", keyed_window, key()?)?.cost(3))?;
    let keyed_sliding: KeyedLimiter<String, SlidingWindow, ManualClock> =
        KeyedBuilder::new(SlidingWindow::new(Policy::per_second(3)?)?)
            .clock(clock.clone())
            .build()?;
    assert_eq!(
        build_one(Rule::new("per-key", keyed_sliding, key()?)?.cost(4)).unwrap_err(),
        cost_error("per-key", 4, 3)
    );
    fits_up_to(5, |cost| {
        let log = KeyedBuilder::default()
            .clock(clock.clone())
            .capacity(16)
            .sliding_log::<String>(Policy::per_second(5)?)?;
        Ok(Rule::new("log", log, key()?)?.cost(cost))
    })?;
    // The second rule of a layer is judged as the first: it is named.
    let err = RateLimitLayer::builder()
        .rule(Rule::new("fits", gcra()?, Global)?.cost(4))
        .rule(Rule::new("never", gcra()?, Global)?.cost(9))
        .build()
        .unwrap_err();
    assert_eq!(err, cost_error("never", 9, 4));
    Ok(())
}

/// The builder judges the limiter's capacity, not its state: a shared limiter that
/// is spent now still admits the cost once it refills.
#[test]
fn a_spent_shared_limiter_is_no_reason_to_refuse_a_cost() -> TestResult {
    let clock = ManualClock::new();
    let limiter = Arc::new(RateLimiter::gcra_with_clock(
        Policy::per_minute(10)?.with_burst(4)?,
        clock.clone(),
    ));
    assert!(limiter.check_n(4).is_allowed());
    assert!(!limiter.check_n(1).is_allowed());
    build_one(Rule::shared("spent", Arc::clone(&limiter), Global)?.cost(4))?;
    Ok(())
}

/// Plans whose capacities differ under GCRA (the burst) and under a window (the
/// limit): gold 50 / 50, basic 5 / 60, trial 3 / 10, intro 3 / 20, in that order.
fn four_plans() -> Result<floodgate::keyed::plans::Plans, floodgate::PolicyError> {
    let mut plans = floodgate::keyed::plans::Plans::new();
    plans.insert("gold", Policy::per_second(50)?);
    plans.insert("basic", Policy::per_minute(60)?.with_burst(5)?);
    plans.insert("trial", Policy::per_minute(10)?.with_burst(3)?);
    plans.insert("intro", Policy::per_minute(20)?.with_burst(3)?);
    Ok(plans)
}

/// A plan limiter's rule must fit at least one plan: a cost above every plan's
/// capacity (its GCRA burst, its window's limit) is refused naming the plan of the
/// largest capacity (the first in plan order among equals), whatever the strategy;
/// a cost within some plan's builds (the others' users get the never-fits status:
/// "not on your plan"). Plans are judged as they are at `build`.
#[test]
fn a_cost_above_every_plans_capacity_is_refused_naming_the_closest_plan() -> TestResult {
    use floodgate::keyed::plans::PlanLimiter;
    use floodgate::KeyedBuilder;

    let clock = ManualClock::new();
    let plans = four_plans()?;
    let gold = plans.id("gold").ok_or("gold")?;
    let table = || KeyedBuilder::default().clock(clock.clone());
    let gcra = || PlanLimiter::new(&plans, move |_: &()| gold, table());
    let plan_error = |plan: &str, cost, capacity| ConfigError::PlanCost {
        rule: "plan".to_owned(),
        plan: plan.to_owned(),
        cost,
        capacity,
    };
    judged_on_every_strategy(
        |cost| Ok(Rule::new("plan", gcra()?, Global)?.cost(cost)),
        // Above trial's, intro's and basic's bursts, within gold's: it builds.
        &[50, 6, 4, 3, 0],
        &[
            // Above every plan's: gold, the largest (not trial, the smallest).
            (51, plan_error("gold", 51, 50)),
            (u32::MAX, plan_error("gold", u32::MAX, 50)),
        ],
    )?;
    let err = build_one(Rule::new("plan", gcra()?, Global)?.cost(51)).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"rule "plan": cost 51 is more than the 50 units plan "gold" admits at once, and no plan admits more, so no request could ever pass; raise the plan's burst (a window plan's limit) to at least 51, or lower the rule's cost"#
    );
    // A window plan admits its limit (the burst is not its): basic's 60 is the
    // largest, so 55 (above every burst) builds.
    let window = |cost| -> Result<_, Box<dyn std::error::Error>> {
        let limiter = PlanLimiter::fixed_window(&plans, move |_: &()| gold, table())?;
        Ok(Rule::new("plan", limiter, Global)?.cost(cost))
    };
    build_one(window(60)?)?;
    build_one(window(55)?)?;
    assert_eq!(
        build_one(window(61)?).unwrap_err(),
        plan_error("basic", 61, 60)
    );
    // Judged as the plans are at build: with gold's burst lowered to basic's 5, a
    // cost of 6 fits no plan, and of the two at 5, gold comes first.
    let shared = Arc::new(gcra()?);
    shared.set_policy("gold", Policy::per_second(50)?.with_burst(5)?)?;
    let err = build_one(Rule::shared("plan", Arc::clone(&shared), Global)?.cost(6)).unwrap_err();
    assert_eq!(err, plan_error("gold", 6, 5));
    build_one(Rule::shared("plan", shared, Global)?.cost(5))?;
    Ok(())
}

/// A remote limiter cannot tell its capacity (a backend answers per request): the
/// builder takes it, and a request that can never fit is answered the never-fits
/// status.
#[tokio::test]
async fn a_remote_limiter_is_not_judged_when_built() -> TestResult {
    let clock = ManualClock::new();
    let remote = build_one(Rule::remote("remote", one_per_second(&clock)?, Global)?.cost(2))?;
    let resp = remote
        .layer(Hello)
        .call(Request::get("/").body(())?)
        .await?;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(resp.headers().get("retry-after").is_none());
    Ok(())
}
