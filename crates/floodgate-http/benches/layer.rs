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

// `criterion_group!` expands to an undocumented `pub fn`.
#![allow(missing_docs)]

use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
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

criterion_group!(benches, bench);
criterion_main!(benches);
