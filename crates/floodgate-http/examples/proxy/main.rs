//! A hyper reverse proxy limiting each client IP behind a trusted load balancer.
//!
//! ```text
//! cargo run -p floodgate-http --example proxy -- --listen 127.0.0.1:0 --upstream 127.0.0.1:3000
//! ```
//!
//! The first line on stdout is the bound address. Each client IP gets 10 requests per
//! minute (burst 10); the client IP is the rightmost `X-Forwarded-For` address when the
//! peer is the load balancer at 127.0.0.1 (one trusted hop), else the peer itself, so a
//! client cannot pick its own key by sending the header. Every response carries both
//! header families; a denial is a 429 with `Retry-After`.

mod serve;

use std::net::SocketAddr;

use floodgate::{DefaultClock, Policy};

struct Args {
    listen: SocketAddr,
    upstream: SocketAddr,
}

const USAGE: &str = "usage: proxy [--listen ADDR] --upstream ADDR  (port 0 picks a free port)";

fn args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let mut listen = "127.0.0.1:8080".to_owned();
    let mut upstream = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => listen = args.next().ok_or("--listen needs an address")?,
            "--upstream" => upstream = Some(args.next().ok_or("--upstream needs an address")?),
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}; try --help")),
        }
    }
    let upstream = upstream.ok_or(USAGE)?;
    Ok(Args {
        listen: listen
            .parse()
            .map_err(|e| format!("--listen {listen:?}: {e}"))?,
        upstream: upstream
            .parse()
            .map_err(|e| format!("--upstream {upstream:?}: {e}"))?,
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args = match args() {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("{msg}");
            std::process::exit(2);
        }
    };
    let layer = serve::per_client_layer(
        Policy::per_minute(10)?.with_burst(10)?,
        DefaultClock::default(),
    )?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("{}", listener.local_addr()?);
    serve::serve(listener, args.upstream, layer).await?;
    Ok(())
}
