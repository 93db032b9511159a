//! An axum API behind floodgate-http.
//!
//! ```text
//! cargo run -p floodgate-http --example api_server -- --listen 127.0.0.1:0
//! ```
//!
//! The first line on stdout is the bound address. Every response carries both header
//! families. Rules, checked in order:
//!
//! 1. `per-ip` — 10 per minute per client IP, burst 10 (hard);
//! 2. `plan` — per API key (`X-Api-Key`) by plan: keys starting `pro_` get the pro plan,
//!    `ent_` enterprise, any other key the free plan; requests without a key share the
//!    free-plan bucket `anonymous`;
//! 3. `global` — 1000 per second for the whole server.
//!
//! `GET /stats` shows the per-rule counters.
//!
//! Options:
//!
//! * `--trusted-proxy NET` — the server sits behind a load balancer in `NET` (e.g.
//!   `127.0.0.1/32`): `per-ip` keys on the rightmost `X-Forwarded-For` address (one
//!   trusted hop) when the peer is in `NET`, else on the peer;
//! * `--no-limits` — serve the same routes without the layer (a baseline to measure
//!   the layer against);
//! * `--never-deny` — the same rules at 10^9 per second, burst 10^9 (every plan too):
//!   every request is admitted and still pays for every rule and both header
//!   families (the layer's cost on the requests a proxy forwards).

use std::net::{IpAddr, SocketAddr};

use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use floodgate::keyed::plans::{PlanLimiter, Plans};
use floodgate::{KeyedBuilder, KeyedLimiter, Policy, RateLimiter};
use floodgate_http::{
    ForwardedIp, Global, HeaderKey, OnMissingKey, PeerIp, RateLimitLayer, Rule, TrustedProxies,
};

struct Args {
    listen: SocketAddr,
    trusted_proxy: Option<String>,
    no_limits: bool,
    never_deny: bool,
}

const USAGE: &str =
    "usage: api_server [--listen ADDR] [--trusted-proxy NET] [--no-limits] [--never-deny]  (port 0 picks a free port)";

fn args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let mut listen = "127.0.0.1:3000".to_owned();
    let mut trusted_proxy = None;
    let mut no_limits = false;
    let mut never_deny = false;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => listen = args.next().ok_or("--listen needs an address")?,
            "--trusted-proxy" => {
                trusted_proxy = Some(args.next().ok_or("--trusted-proxy needs a network")?)
            }
            "--no-limits" => no_limits = true,
            "--never-deny" => never_deny = true,
            "-h" | "--help" => {
                // Asked for: the usage on stdout and status 0, not an error.
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}; try --help")),
        }
    }
    Ok(Args {
        listen: listen
            .parse()
            .map_err(|e| format!("--listen {listen:?}: {e}"))?,
        trusted_proxy,
        no_limits,
        never_deny,
    })
}

/// `ConnectInfo<SocketAddr>`, as `into_make_service_with_connect_info` inserts it.
fn connect_info(ext: &http::Extensions) -> Option<IpAddr> {
    ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = match args() {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("{msg}");
            std::process::exit(2);
        }
    };

    // `--never-deny`: every rule at a rate no client reaches.
    let unreachable = Policy::per_second(1_000_000_000)?.with_burst(1_000_000_000)?;
    let pick = |policy: Policy| if args.never_deny { unreachable } else { policy };
    let per_ip_policy = pick(Policy::per_minute(10)?.with_burst(10)?);
    let per_ip: KeyedLimiter<IpAddr> = KeyedLimiter::gcra(per_ip_policy);

    let mut plans = Plans::classic();
    if args.never_deny {
        for name in ["free", "pro", "enterprise"] {
            plans.insert(name, unreachable);
        }
    }
    let (free, pro, enterprise) = (
        plans.id("free").ok_or("no free plan")?,
        plans.id("pro").ok_or("no pro plan")?,
        plans.id("enterprise").ok_or("no enterprise plan")?,
    );
    let resolver = move |key: &String| {
        if key.starts_with("pro_") {
            pro
        } else if key.starts_with("ent_") {
            enterprise
        } else {
            free
        }
    };
    let plan = PlanLimiter::new(&plans, resolver, KeyedBuilder::default())?;

    let global_policy = pick(Policy::per_second(1_000)?);
    let global = RateLimiter::gcra(global_policy);

    let builder = RateLimitLayer::builder();
    let builder = match &args.trusted_proxy {
        Some(net) => {
            let client = ForwardedIp::x_forwarded_for(TrustedProxies::new([net.as_str()])?, 1)
                .lookup(connect_info);
            builder.rule(Rule::new("per-ip", per_ip, client)?.window_of(&per_ip_policy))
        }
        None => {
            let peer = PeerIp::new().lookup(connect_info);
            builder.rule(Rule::new("per-ip", per_ip, peer)?.window_of(&per_ip_policy))
        }
    };
    let layer = builder
        .rule(
            // Plans differ in window, so `w` is not advertised for this rule.
            Rule::new("plan", plan, HeaderKey::new("x-api-key")?)?
                .on_missing_key(OnMissingKey::Fallback("anonymous".to_owned())),
        )
        .rule(Rule::new("global", global, Global)?.window_of(&global_policy))
        .build()?;

    let stats_layer = layer.clone();
    let routes = Router::new().route("/", get(|| async { "hello\n" })).route(
        "/stats",
        get(move || {
            let text: String = stats_layer
                .stats()
                .iter()
                .map(|s| format!("{s}\n"))
                .collect();
            async move { text }
        }),
    );
    let app = if args.no_limits {
        routes
    } else {
        routes.layer(layer)
    };

    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
