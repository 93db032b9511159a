//! The reverse proxy itself, shared by the `proxy` example and its loopback test
//! (`tests/proxy.rs` includes this file): it limits each client IP, as read from
//! `X-Forwarded-For` behind one trusted load balancer, and forwards what it admits.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use floodgate::{Clock, Gcra, KeyedBuilder, Policy};
use floodgate_http::{ForwardedIp, PeerAddr, RateLimitLayer, Rule, TrustedProxies};
use http::header::{HeaderName, HeaderValue, HOST};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{Layer, Service};

/// The body the proxy answers with: the upstream's, or its own short error.
pub type ProxyBody = Either<Incoming, Full<Bytes>>;

/// The load balancer in front of the proxy; its `X-Forwarded-For` entry is the last
/// one the proxy trusts.
pub const TRUSTED_BALANCER: &str = "127.0.0.1/32";

/// Headers that describe one hop, not the message (RFC 9110 §7.6.1); never forwarded.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The per-client-IP limit: `policy` per client, the client being the rightmost
/// `X-Forwarded-For` address when the peer is the trusted balancer (one hop). A
/// request from elsewhere is keyed by its peer address.
///
/// # Errors
///
/// A configuration error (it cannot happen with these constants; returned, not unwrapped).
pub fn per_client_layer<C: Clock + 'static>(
    policy: Policy,
    clock: C,
) -> Result<RateLimitLayer, Box<dyn std::error::Error + Send + Sync>> {
    let per_client = KeyedBuilder::new(Gcra::new(policy))
        .clock(clock)
        .build::<IpAddr>()?;
    let client_ip = ForwardedIp::x_forwarded_for(TrustedProxies::new([TRUSTED_BALANCER])?, 1);
    Ok(RateLimitLayer::builder()
        .rule(Rule::new("per-client", per_client, client_ip)?.window_of(&policy))
        .build()?)
}

/// Forwards each request to `upstream` over a pooled HTTP/1.1 client.
#[derive(Clone)]
pub struct Forward {
    upstream: SocketAddr,
    client: Client<HttpConnector, Incoming>,
}

impl Forward {
    /// A forwarder to `upstream`.
    pub fn new(upstream: SocketAddr) -> Forward {
        Forward {
            upstream,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }
}

fn bad_gateway(text: String) -> Response<ProxyBody> {
    let mut resp = Response::new(Either::Right(Full::new(Bytes::from(text))));
    *resp.status_mut() = StatusCode::BAD_GATEWAY;
    resp
}

impl Service<Request<Incoming>> for Forward {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let client = self.client.clone();
        let upstream = self.upstream;
        Box::pin(async move {
            let (mut parts, body) = req.into_parts();
            let path = parts
                .uri
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_owned();
            parts.uri = match Uri::try_from(format!("http://{upstream}{path}")) {
                Ok(uri) => uri,
                Err(e) => return Ok(bad_gateway(format!("bad upstream URI: {e}\n"))),
            };
            for name in HOP_BY_HOP {
                parts.headers.remove(name);
            }
            // Append the peer, as every proxy on the path does.
            if let Some(PeerAddr(peer)) = parts.extensions.get::<PeerAddr>().copied() {
                let xff = HeaderName::from_static("x-forwarded-for");
                let joined = match parts.headers.get(&xff).and_then(|v| v.to_str().ok()) {
                    Some(earlier) => format!("{earlier}, {}", peer.ip()),
                    None => peer.ip().to_string(),
                };
                if let Ok(v) = HeaderValue::try_from(joined) {
                    parts.headers.insert(xff, v);
                }
            }
            if let Ok(host) = HeaderValue::try_from(upstream.to_string()) {
                parts.headers.insert(HOST, host);
            }
            match client.request(Request::from_parts(parts, body)).await {
                Ok(resp) => Ok(resp.map(Either::Left)),
                Err(e) => Ok(bad_gateway(format!("upstream {upstream}: {e}\n"))),
            }
        })
    }
}

/// Serves the proxy on `listener` until it fails: each connection's requests go
/// through `layer`, then to `upstream`.
///
/// # Errors
///
/// The listener's accept error.
pub async fn serve(
    listener: TcpListener,
    upstream: SocketAddr,
    layer: RateLimitLayer,
) -> std::io::Result<()> {
    let service = layer.layer(Forward::new(upstream));
    loop {
        let (stream, peer) = listener.accept().await?;
        let service = service.clone();
        let per_request = hyper::service::service_fn(move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(PeerAddr(peer));
            let mut service = service.clone();
            async move { service.call(req).await }
        });
        tokio::spawn(
            hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), per_request),
        );
    }
}
