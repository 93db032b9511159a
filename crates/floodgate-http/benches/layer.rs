//! `Service::call` with and without the rate-limit layer, in one group so the report
//! shows the layer's cost as a ratio.
//!
//! Per-client-IP GCRA over 10 000 clients (round-robin), a policy that never denies
//! (one million per second per client), an inner service that answers at once.
//! Every contender builds the same request (path, peer-address extension), so the
//! difference is the layer: key extraction, the keyed decision, the boxed future and
//! the header rendering (`layer_no_headers` leaves the rendering out).
//!
//! ```text
//! cargo bench -p floodgate-http --bench layer
//! ```
//!
//! On a shared or loaded machine, count instructions instead: with
//! `FLOODGATE_LAYER_CALLS=<contender>:<calls>` set (contender `bare`, `both` or
//! `none`), the binary warms the contender up (every client seen once), then makes
//! `<calls>` calls inside `counted_calls`, which callgrind can measure alone:
//!
//! ```text
//! cargo bench -p floodgate-http --bench layer --no-run
//! FLOODGATE_LAYER_CALLS=both:100000 valgrind --tool=callgrind \
//!     --toggle-collect='*counted_calls*' target/release/deps/layer-<hash>
//! ```
//!
//! Instructions per call are the total over `<calls>`; the layer's cost is a
//! contender's figure less `bare`'s.

// `criterion_group!` expands to an undocumented `pub fn`.
#![allow(missing_docs)]

use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use criterion::{criterion_group, Criterion};
use floodgate::{Gcra, KeyedBuilder, KeyedLimiter, Policy};
use floodgate_http::{HeaderOptions, PeerAddr, PeerIp, RateLimitLayer, Rule};
use http::{Request, Response};
use tower::{Layer, Service};

const CLIENTS: u32 = 10_000;

#[derive(Clone)]
struct Hello;

impl Service<Request<()>> for Hello {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        ready(Ok(Response::new(String::new())))
    }
}

/// Polls a future that is ready at once (every future here is).
fn now<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("an in-process call was not ready on its first poll"),
    }
}

fn request(i: u32) -> Request<()> {
    let ip = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | (i % CLIENTS)));
    let mut req = Request::get("/").body(()).expect("static request");
    req.extensions_mut()
        .insert(PeerAddr(SocketAddr::new(ip, 4000)));
    req
}

fn layer(headers: HeaderOptions) -> RateLimitLayer {
    let policy = Policy::per_second(1_000_000).expect("policy");
    let limiter: KeyedLimiter<IpAddr> = KeyedBuilder::new(Gcra::new(policy))
        .capacity(2 * CLIENTS as usize)
        .build()
        .expect("limiter");
    RateLimitLayer::builder()
        .rule(
            Rule::new("per-ip", limiter, PeerIp::new())
                .expect("rule")
                .window_of(&policy),
        )
        .headers(headers)
        .build()
        .expect("layer")
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("layer/uncontended");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));

    let mut bare = Hello;
    let mut i = 0u32;
    g.bench_function("bare", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            black_box(now(bare.call(request(i))))
        })
    });

    let mut full = layer(HeaderOptions::default()).layer(Hello);
    g.bench_function("layer_both_header_families", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            let resp = now(full.call(request(i)));
            debug_assert!(resp.as_ref().is_ok_and(|r| r.status() == 200));
            black_box(resp)
        })
    });

    let mut quiet = layer(HeaderOptions::default().legacy(None).ietf(false)).layer(Hello);
    g.bench_function("layer_no_headers", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            black_box(now(quiet.call(request(i))))
        })
    });
    g.finish();
}

/// `calls` calls of `service`, the only code callgrind counts
/// (`--toggle-collect='*counted_calls*'`).
#[inline(never)]
fn counted_calls<S>(service: &mut S, first: u32, calls: u32)
where
    S: Service<Request<()>>,
{
    for i in first..first.wrapping_add(calls) {
        let _ = black_box(now(service.call(request(i))));
    }
}

/// The instruction-count mode: `<contender>:<calls>`.
fn count(spec: &str) {
    let (contender, calls) = spec
        .split_once(':')
        .and_then(|(c, n)| Some((c, n.parse::<u32>().ok()?)))
        .expect("FLOODGATE_LAYER_CALLS is <bare|both|none>:<calls>");
    fn run<S: Service<Request<()>>>(mut service: S, calls: u32) {
        // Every client once (the keyed table's entries are created here), then the
        // counted calls.
        warm_up(&mut service);
        counted_calls(&mut service, CLIENTS, calls);
    }
    fn warm_up<S: Service<Request<()>>>(service: &mut S) {
        for i in 0..CLIENTS {
            let _ = black_box(now(service.call(request(i))));
        }
    }
    match contender {
        "bare" => run(Hello, calls),
        "both" => run(layer(HeaderOptions::default()).layer(Hello), calls),
        "none" => run(
            layer(HeaderOptions::default().legacy(None).ietf(false)).layer(Hello),
            calls,
        ),
        other => panic!("unknown contender {other:?}: bare, both or none"),
    }
}

criterion_group!(benches, bench);

fn main() {
    match std::env::var("FLOODGATE_LAYER_CALLS") {
        Ok(spec) => count(&spec),
        Err(_) => {
            benches();
            Criterion::default().configure_from_args().final_summary();
        }
    }
}
