//! The configuration parsers: any bytes given to the TOML plan loader and to the
//! duration parser yield a value or an error, never a panic. A duration that parses
//! round-trips through its nanosecond spelling; plans that load have valid policies
//! (the constructors' invariants hold: `L·T` and `B·T` at most 2^62 ns).
#![no_main]

use floodgate::keyed::plans::Plans;
use floodgate::{parse_duration, MAX_SPAN_NANOS};
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(d) = parse_duration(text) {
        let nanos = u64::try_from(d.as_nanos()).expect("a parsed duration fits u64 nanoseconds");
        assert_eq!(
            parse_duration(&format!("{nanos}ns")),
            Ok(Duration::from_nanos(nanos))
        );
    }
    if let Ok(plans) = Plans::from_toml(text) {
        for (_, _, policy) in plans.iter() {
            let t = policy.interval_nanos();
            assert!(policy.limit() >= 1 && policy.burst() >= 1 && t >= 1);
            assert!(u128::from(policy.limit()) * u128::from(t) <= u128::from(MAX_SPAN_NANOS));
            assert!(u128::from(policy.burst()) * u128::from(t) <= u128::from(MAX_SPAN_NANOS));
        }
    }
});
