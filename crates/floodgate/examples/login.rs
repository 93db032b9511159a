//! Brute-force protection for a login endpoint: at most 5 failed attempts per
//! 5 minutes per (IP, username).
//!
//! Charge first, refund on success: `charge(key, 1)` before checking the password,
//! and `refund(key, receipt)` when it was right. A `peek` first would let N parallel
//! guesses all through the gate before any of them is counted; a charge counts each
//! guess the moment it arrives, so at most 5 ever reach the password check.
//!
//! Run with `cargo run -p floodgate --example login`.

use std::net::IpAddr;
use std::time::Duration;

use floodgate::{Gcra, KeyedBuilder, KeyedLimiter, ManualClock, Pair, Policy};

/// Outcome of one login attempt.
enum Login {
    Welcome,
    WrongPassword,
    TryAgainIn(Duration),
}

impl std::fmt::Display for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Login::Welcome => f.write_str("welcome"),
            Login::WrongPassword => f.write_str("wrong password"),
            Login::TryAgainIn(wait) => write!(f, "too many failures, try again in {wait:?}"),
        }
    }
}

struct Server {
    users: Vec<(&'static str, &'static str)>,
    failures: KeyedLimiter<(IpAddr, String), Gcra, ManualClock>,
}

impl Server {
    fn login(&self, ip: IpAddr, user: &str, password: &str) -> Login {
        // A borrowed key: a known (IP, user) pair is found without allocating.
        let key = Pair(&ip, user);
        let (gate, receipt) = self.failures.charge(&key, 1);
        if !gate.is_allowed() {
            // Do not even look at the password.
            return Login::TryAgainIn(gate.retry_after().unwrap_or(Duration::MAX));
        }
        if self.users.iter().any(|&(u, p)| u == user && p == password) {
            // Not a failure after all: give the attempt back.
            let _ = self.failures.refund(&key, receipt);
            return Login::Welcome;
        }
        Login::WrongPassword // the charge stays: one failure recorded
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let clock = ManualClock::new(); // a real server uses the default clock
    let server = Server {
        users: vec![("alice", "correct horse")],
        failures: KeyedBuilder::new(Gcra::new(Policy::new(5, Duration::from_secs(300))?))
            .capacity(100_000)
            .clock(clock.clone())
            .build()?,
    };
    let attacker: IpAddr = "203.0.113.9".parse()?;
    for guess in [
        "123456",
        "password",
        "qwerty",
        "letmein",
        "dragon",
        "correct horse",
    ] {
        println!("{guess:>14}: {}", server.login(attacker, "alice", guess));
    }
    clock.advance(Duration::from_secs(60));
    println!(
        "one minute later: {}",
        server.login(attacker, "alice", "correct horse")
    );
    let home: IpAddr = "192.0.2.1".parse()?;
    println!(
        "alice from home: {}",
        server.login(home, "alice", "correct horse")
    );
    println!("{:?}", server.failures.metrics());
    Ok(())
}
