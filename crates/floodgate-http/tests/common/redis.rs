//! A `redis-server` of the test's own on a free loopback port, for the tests of
//! remote rules on Redis (remote_refunds.rs, review_s46_redis.rs).
#![allow(dead_code)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` on a free loopback port, killed on drop; `None` (after a loud
/// line) where none is installed, unless `FLOODGATE_REQUIRE_REDIS=1`.
pub struct Redis(Child, u16);

impl Redis {
    pub fn start() -> Option<Redis> {
        let installed = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !installed {
            assert!(
                std::env::var("FLOODGATE_REQUIRE_REDIS").as_deref() != Ok("1"),
                "FLOODGATE_REQUIRE_REDIS=1 but redis-server is not on PATH"
            );
            eprintln!("SKIPPED: redis-server is not on PATH; this test did not run");
            return None;
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(Redis(child, port))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.1)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
