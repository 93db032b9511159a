//! `IpAddr` keys at scale: floodgate's keyed limiter on inline storage against
//! governor's keyed store (DashMap, ahash: its fastest configuration), one thread.
//!
//! ```text
//! cargo run -p floodgate-benches --profile bench --example ip_keys -- 1000000 20000000 3
//! ```
//!
//! Arguments: addresses (capacity = addresses, as the README sizes a table), decisions
//! per timed round, rounds. Half the addresses are IPv4, half IPv6 in distinct /63
//! networks (an `IpAddr` key groups IPv6 by /64 — by /63 before stop 41, hence the
//! spacing, kept so that figures compare —, governor keys the whole address; one
//! host per network makes both see the same clients). Every address is checked once before
//! timing; each round then visits them in a scrambled order (precomputed), the contenders alternating
//! round by round. The policy is the matrix's idle one (10^9 per second, burst 1000):
//! every decision admits. Prints nanoseconds per decision per round and their median.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::num::NonZeroU32;
use std::process::ExitCode;
use std::time::Instant;

use floodgate::{Gcra, KeyedBuilder, Policy};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Client `i`: IPv4 for even `i`, an IPv6 host in its own /63 (so its own /64) for
/// odd `i`.
fn address(i: u64) -> IpAddr {
    if i % 2 == 0 {
        IpAddr::V4(Ipv4Addr::from(0x0A00_0000 | (i / 2) as u32))
    } else {
        let network = u128::from(0x2001_0db8_0000_0000_u64 | ((i / 2) << 1));
        IpAddr::V6(Ipv6Addr::from((network << 64) | 1))
    }
}

/// Nanoseconds per decision of `check` over `decisions` visits, walking `visits` (a
/// scrambled sequence of the addresses, read in order so that only the tables miss).
fn time(visits: &[IpAddr], decisions: u64, check: &dyn Fn(&IpAddr) -> bool) -> f64 {
    let start = Instant::now();
    let mut admitted = 0u64;
    for address in visits.iter().cycle().take(decisions as usize) {
        admitted += u64::from(check(address));
    }
    let ns = start.elapsed().as_nanos() as f64 / decisions as f64;
    assert_eq!(black_box(admitted), decisions, "every decision admits");
    ns
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> ExitCode {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let [count, decisions, rounds] = args[..] else {
        eprintln!("usage: ip_keys <addresses> <decisions per round> <rounds>");
        return ExitCode::from(2);
    };
    if count == 0 || decisions == 0 || rounds == 0 {
        eprintln!("every argument must be positive");
        return ExitCode::from(2);
    }
    let addresses: Vec<IpAddr> = (0..count).map(address).collect();
    let visits: Vec<IpAddr> = (0..count)
        .map(|op| address(op.wrapping_mul(0x9E37_79B9_7F4A_7C15) % count))
        .collect();
    let policy = Policy::per_second(1_000_000_000)
        .and_then(|p| p.with_burst(1_000))
        .expect("a valid policy");
    let floodgate = match KeyedBuilder::new(Gcra::new(policy))
        .capacity(count as usize)
        .build_inline::<IpAddr>()
    {
        Ok(keyed) => keyed,
        Err(e) => {
            eprintln!("floodgate: {e}");
            return ExitCode::from(2);
        }
    };
    let quota = governor::Quota::per_second(NonZeroU32::new(1_000_000_000).expect("non-zero"))
        .allow_burst(NonZeroU32::new(1_000).expect("non-zero"));
    let governor = governor::RateLimiter::dashmap_with_hasher(quota, ahash::RandomState::new());
    for a in &addresses {
        let _ = floodgate.check(a);
        let _ = governor.check_key(a);
    }
    let check_floodgate = |a: &IpAddr| floodgate.check(a).is_allowed();
    let check_governor = |a: &IpAddr| governor.check_key(a).is_ok();
    let (mut f, mut g) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        f.push(time(&visits, decisions, &check_floodgate));
        g.push(time(&visits, decisions, &check_governor));
        println!(
            "round {round}: floodgate {:.1} ns, governor {:.1} ns, ratio {:.2}",
            f[f.len() - 1],
            g[g.len() - 1],
            f[f.len() - 1] / g[g.len() - 1]
        );
    }
    let ratios: Vec<f64> = f.iter().zip(&g).map(|(f, g)| f / g).collect();
    println!(
        "{count} addresses: floodgate {:.1} ns, governor {:.1} ns per decision (medians); \
         floodgate's time / governor's: {:.2} (median of rounds)",
        median(f),
        median(g),
        median(ratios)
    );
    let metrics = floodgate.metrics();
    println!(
        "floodgate's table: {} live keys, {} reclaimed, {} evicted",
        metrics.live_keys, metrics.reclaimed, metrics.evicted
    );
    ExitCode::SUCCESS
}
