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

use std::future::{ready, Future};
use std::net::{IpAddr, SocketAddr};

use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use floodgate::keyed::plans::{PlanId, PlanLimiter, Plans};
use floodgate::{
    AsyncLimit, Clock, Decision, KeyedBuilder, KeyedLimiter, Policy, RateLimiter, Receipt,
};
use floodgate_http::{Charge, Global, HeaderKey, OnMissingKey, PeerIp, RateLimitLayer, Rule};

/// The plan limiter behind the [`AsyncLimit`] trait the layer consumes.
struct PlanLimit<R>(PlanLimiter<String, R>);

impl<R> AsyncLimit<String> for PlanLimit<R>
where
    R: Fn(&String) -> PlanId + Send + Sync,
{
    type Error = std::convert::Infallible;

    fn check_n(
        &self,
        key: &String,
        cost: u32,
    ) -> impl Future<Output = Result<Decision, Self::Error>> + Send {
        let now = self.0.keyed().clock().now();
        ready(Ok(self.0.check_n_at(key, now, cost)))
    }

    fn peek_n(
        &self,
        key: &String,
        cost: u32,
    ) -> impl Future<Output = Result<Decision, Self::Error>> + Send {
        ready(Ok(self.0.peek(key, cost)))
    }
}

/// In-process, so a request another rule denies is not charged here either.
impl<R> Charge<String> for PlanLimit<R>
where
    R: Fn(&String) -> PlanId + Send + Sync,
{
    fn charge(&self, key: &String, cost: u32) -> (Decision, Receipt) {
        self.0.charge(key, cost)
    }

    fn refund(&self, key: &String, receipt: Receipt) -> bool {
        self.0.refund(key, receipt)
    }
}

fn listen_arg() -> Result<SocketAddr, String> {
    let mut args = std::env::args().skip(1);
    let mut listen = "127.0.0.1:3000".to_owned();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => listen = args.next().ok_or("--listen needs an address")?,
            "-h" | "--help" => {
                return Err("usage: api_server [--listen ADDR]  (port 0 picks a free port)".into())
            }
            other => return Err(format!("unknown argument {other:?}; try --help")),
        }
    }
    listen
        .parse()
        .map_err(|e| format!("--listen {listen:?}: {e}"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listen = match listen_arg() {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("{msg}");
            std::process::exit(2);
        }
    };

    let per_ip_policy = Policy::per_minute(10)?.with_burst(10)?;
    let per_ip: KeyedLimiter<IpAddr> = KeyedLimiter::gcra(per_ip_policy);

    let plans = Plans::classic();
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
    let plan = PlanLimit(PlanLimiter::new(&plans, resolver, KeyedBuilder::new(()))?);

    let global_policy = Policy::per_second(1_000)?;
    let global = RateLimiter::gcra(global_policy);

    let peer = PeerIp::new().lookup(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()));
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("per-ip", per_ip, peer)?.window_of(&per_ip_policy))
        .rule(
            // Plans differ in window, so `w` is not advertised for this rule.
            Rule::new("plan", plan, HeaderKey::new("x-api-key")?)?
                .on_missing_key(OnMissingKey::Fallback("anonymous".to_owned())),
        )
        .rule(Rule::new("global", global, Global)?.window_of(&global_policy))
        .build()?;

    let stats_layer = layer.clone();
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route(
            "/stats",
            get(move || {
                let text: String = stats_layer
                    .stats()
                    .iter()
                    .map(|s| {
                        format!(
                            "{} allowed={} denied={} soft={} shadow={} bad_key={} errors={}\n",
                            s.name, s.allowed, s.denied, s.soft, s.shadow, s.bad_key, s.errors
                        )
                    })
                    .collect();
                async move { text }
            }),
        )
        .layer(layer);

    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!("{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
