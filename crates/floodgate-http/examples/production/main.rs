//! A production-shaped API server behind floodgate-http: per-client-IP limits behind
//! a trusted proxy, per-API-key plans, brute-force protection on `POST /login`, a
//! global limit, a shadow rule on trial and a soft rule that only warns; every
//! response carries the `RateLimit` / `RateLimit-Policy` fields, a 429 `Retry-After`.
//!
//! ```text
//! cargo run -p floodgate-http --example production -- --listen 127.0.0.1:0 \
//!     --trusted-proxy 127.0.0.1 [--redis redis://127.0.0.1:6379/]
//! ```
//!
//! The first line on stdout is the bound address. With `--redis`, the `per-ip` limit
//! lives in Redis (prefix `production:`), so every replica started with the same URL
//! shares it. The rules are listed in `app.rs`.

mod app;

use std::net::SocketAddr;

use floodgate::DefaultClock;

const USAGE: &str = "usage: production [--listen ADDR] [--trusted-proxy NET] [--redis URL]";

struct Args {
    listen: SocketAddr,
    trusted_proxy: String,
    redis: Option<String>,
}

fn args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let (mut listen, mut trusted_proxy, mut redis) =
        ("127.0.0.1:3000".to_owned(), "127.0.0.1".to_owned(), None);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--listen" => listen = value("--listen")?,
            "--trusted-proxy" => trusted_proxy = value("--trusted-proxy")?,
            "--redis" => redis = Some(value("--redis")?),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}; {USAGE}")),
        }
    }
    let listen = listen
        .parse()
        .map_err(|e| format!("--listen {listen:?}: {e}"))?;
    Ok(Args {
        listen,
        trusted_proxy,
        redis,
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), app::Error> {
    let args = match args() {
        Ok(args) => args,
        Err(msg) => {
            eprintln!("{msg}");
            std::process::exit(2);
        }
    };
    let per_ip = match &args.redis {
        Some(url) => app::redis_per_ip(url, "production:", app::policy(app::PER_IP)?).await?,
        None => app::Shared::Local,
    };
    let (router, _layer) = app::app(DefaultClock::new(), &args.trusted_proxy, per_ip)?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("{}", listener.local_addr()?);
    app::serve(listener, router).await?;
    Ok(())
}
