//! A reply lost after Redis ran the script: a proxy between the limiter and Redis
//! forwards one `EVALSHA` and then, instead of its reply, closes the connection.
//! The call may fail, but it must not have been charged twice — on one server, and
//! on a Cluster, whose client would re-send a request whose connection broke.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{runtime, RedisServer};
use floodgate::Policy;
use floodgate_redis::{Algorithm, Connection, OnFailure, RedisLimiter, Verdict};

/// A loopback TCP proxy to a Redis port that, when armed, lets the next `EVALSHA`
/// through and drops its connection when the reply comes back.
struct Proxy {
    port: u16,
    armed: Arc<AtomicBool>,
    dropped: Arc<AtomicUsize>,
}

impl Proxy {
    /// Listens on a free port; each client it accepts is connected to the port in
    /// `upstream` (set once the server has one).
    fn start(upstream: Arc<AtomicU16>) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let armed = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicUsize::new(0));
        let (a, d) = (Arc::clone(&armed), Arc::clone(&dropped));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let to = upstream.load(Ordering::SeqCst);
                let Ok(server) = TcpStream::connect(("127.0.0.1", to)) else {
                    continue;
                };
                pipe(client, server, Arc::clone(&a), Arc::clone(&d));
            }
        });
        Proxy {
            port,
            armed,
            dropped,
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

/// Copies both ways between `client` and `server`; a client's `EVALSHA` sent while
/// `armed` dooms the connection: its next reply is dropped with it.
fn pipe(client: TcpStream, server: TcpStream, armed: Arc<AtomicBool>, dropped: Arc<AtomicUsize>) {
    let doomed = Arc::new(AtomicBool::new(false));
    let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    let up_doomed = Arc::clone(&doomed);
    std::thread::spawn(move || {
        let mut buf = [0_u8; 64 * 1024];
        while let Ok(n @ 1..) = c_in.read(&mut buf) {
            let evalsha = buf[..n]
                .windows(7)
                .any(|w| w.eq_ignore_ascii_case(b"EVALSHA"));
            if evalsha && armed.swap(false, Ordering::SeqCst) {
                up_doomed.store(true, Ordering::SeqCst);
            }
            if s_out.write_all(&buf[..n]).is_err() {
                return;
            }
        }
        let _ = s_out.shutdown(Shutdown::Both);
    });
    let (mut s_in, mut c_out) = (server, client);
    std::thread::spawn(move || {
        let mut buf = [0_u8; 64 * 1024];
        while let Ok(n @ 1..) = s_in.read(&mut buf) {
            if doomed.load(Ordering::SeqCst) {
                dropped.fetch_add(1, Ordering::SeqCst);
                break;
            }
            if c_out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = c_out.shutdown(Shutdown::Both);
        let _ = s_in.shutdown(Shutdown::Both);
    });
}

/// GCRA, a burst of 10 a day: nothing refills during the test.
fn policy() -> Policy {
    Policy::per_day(1).and_then(|p| p.with_burst(10)).unwrap()
}

/// The units `key` has spent, by a peek on a fresh limiter.
fn spent<C: Connection>(rt: &tokio::runtime::Runtime, limiter: &RedisLimiter<C>, key: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match rt.block_on(limiter.peek_n(key, 0)) {
            Ok(Verdict::Decided(d)) => return d.limit() - d.remaining(),
            other => {
                assert!(Instant::now() < deadline, "no peek: {other:?}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Loads the script, loses the reply of one check of cost 1, and returns how many
/// units that check spent.
fn lose_one_reply<C: Connection>(
    rt: &tokio::runtime::Runtime,
    proxy: &Proxy,
    connect: impl Fn() -> C,
) -> u64 {
    let build = || {
        RedisLimiter::builder(Algorithm::Gcra, policy())
            .prefix("test:")
            .timeout(Duration::from_secs(5))
            .on_failure(OnFailure::Error)
            .build(connect())
            .unwrap()
    };
    let limiter = build();
    assert_eq!(spent(rt, &limiter, "warm-up"), 0, "the script is loaded");
    proxy.armed.store(true, Ordering::SeqCst);
    let outcome = rt.block_on(limiter.check_n("k", 1));
    assert_eq!(
        proxy.dropped.load(Ordering::SeqCst),
        1,
        "the proxy did not drop the reply: {outcome:?}"
    );
    spent(rt, &build(), "k")
}

/// A proxy in front of a fresh server of its own; `None` where none can run.
fn proxied_server() -> Option<(Proxy, RedisServer)> {
    let upstream = Arc::new(AtomicU16::new(0));
    let proxy = Proxy::start(Arc::clone(&upstream));
    let server = RedisServer::start()?;
    upstream.store(server.port(), Ordering::SeqCst);
    Some((proxy, server))
}

#[test]
fn a_lost_reply_is_charged_once_on_one_server() {
    let Some((proxy, _server)) = proxied_server() else {
        return;
    };
    let rt = runtime();
    let url = proxy.url();
    let connect = || rt.block_on(floodgate_redis::connect(&url)).unwrap();
    assert_eq!(lose_one_reply(&rt, &proxy, connect), 1);
}

/// A one-node cluster that announces the proxy's port, so that every connection
/// the cluster client opens, after the slot map too, goes through the proxy.
#[test]
fn a_lost_reply_is_charged_once_on_a_cluster() {
    let upstream = Arc::new(AtomicU16::new(0));
    let proxy = Proxy::start(Arc::clone(&upstream));
    let dir = std::env::temp_dir().join(format!(
        "floodgate-lost-replies-{}-{}",
        std::process::id(),
        proxy.port
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let announce = proxy.port.to_string();
    let Some(server) = RedisServer::start_with(|port| {
        let conf = dir.join(format!("nodes-{port}.conf"));
        vec![
            "--cluster-enabled".into(),
            "yes".into(),
            "--cluster-config-file".into(),
            conf.display().to_string(),
            "--cluster-announce-ip".into(),
            "127.0.0.1".into(),
            "--cluster-announce-port".into(),
            announce.clone(),
        ]
    }) else {
        return;
    };
    upstream.store(server.port(), Ordering::SeqCst);
    let _: () = server.cmd(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]);
    let deadline = Instant::now() + Duration::from_secs(15);
    while !server
        .cmd::<String>(&["CLUSTER", "INFO"])
        .contains("cluster_state:ok")
    {
        assert!(Instant::now() < deadline, "the cluster did not form");
        std::thread::sleep(Duration::from_millis(50));
    }
    let rt = runtime();
    let url = proxy.url();
    let connect = || {
        rt.block_on(floodgate_redis::connect_cluster(&[&url]))
            .unwrap()
    };
    let spent = lose_one_reply(&rt, &proxy, connect);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(spent, 1, "one check of cost 1 spent {spent} units");
}

/// A refund whose reply is lost after Redis ran it, sent again: the server gives
/// the charge back once (session 42). Sent again over the reconnected limiter, the
/// receipt is recognised as refunded and gives nothing more.
#[test]
fn a_refund_whose_reply_is_lost_gives_back_once_when_sent_again() {
    let Some((proxy, _server)) = proxied_server() else {
        return;
    };
    let rt = runtime();
    let url = proxy.url();
    let build = || {
        let conn = rt.block_on(floodgate_redis::connect(&url)).unwrap();
        RedisLimiter::builder(Algorithm::Gcra, policy())
            .refunds(true)
            .prefix("test:")
            .timeout(Duration::from_secs(5))
            .on_failure(OnFailure::Error)
            .build(conn)
            .unwrap()
    };
    let limiter = build();
    // Both scripts loaded first: the lost reply is a refund's that ran.
    let (_, warm) = rt.block_on(limiter.charge_n("warm-up", 1)).unwrap();
    assert!(rt.block_on(limiter.refund(&warm.unwrap())).unwrap());
    // Two units on "k"; the second's booking lies ahead of the clock.
    assert!(rt
        .block_on(limiter.check_n("k", 1))
        .unwrap()
        .decision()
        .is_allowed());
    let (_, r) = rt.block_on(limiter.charge_n("k", 1)).unwrap();
    let r = r.unwrap();
    assert_eq!(spent(&rt, &limiter, "k"), 2);
    proxy.armed.store(true, Ordering::SeqCst);
    let lost = rt.block_on(limiter.refund(&r));
    assert_eq!(
        proxy.dropped.load(Ordering::SeqCst),
        1,
        "not dropped: {lost:?}"
    );
    assert_eq!(spent(&rt, &build(), "k"), 1, "the refund ran");
    // Sent again (the limiter reconnects): nothing more comes back.
    let deadline = Instant::now() + Duration::from_secs(10);
    let again = loop {
        match rt.block_on(limiter.refund(&r)) {
            Ok(again) => break again,
            Err(e) => {
                assert!(Instant::now() < deadline, "no refund answered: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    assert!(!again);
    assert_eq!(spent(&rt, &build(), "k"), 1);
}
