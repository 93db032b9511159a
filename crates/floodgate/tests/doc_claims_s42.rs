//! The hot-key modes' promises added on 2026-12-06, attacked where no other test
//! looks:
//!
//! * `LeasedGcra::report`: "the units of its own unexpired lease plus the central
//!   word's remaining, at most the burst, with the central word's reset … never
//!   more than this thread could be admitted at once".
//! * `HotKeyLimiter::report`: "a cold key's state (its `peek(key, 0)`), a hot key's
//!   `LeasedGcra::report`".
//! * `LeasedGcra::charge`: "a denial or cost 0 hold none: their refund gives
//!   nothing back".
//!
//! A `ManualClock`, one thread unless said: exact values.

use std::time::Duration;

use floodgate::{HotKeyLimiter, HotKeys, KeyedBuilder, LeasedGcra, ManualClock, Nanos, Policy};

/// 1 000 a second (`T` = 1 ms), burst `burst`, leases of 10 living 50 ms; a shard
/// for every thread the test binary runs (owner indices are the process's).
fn leased(burst: u64, clock: &ManualClock) -> LeasedGcra<ManualClock> {
    LeasedGcra::builder(
        Policy::per_second(1_000)
            .unwrap()
            .with_burst(burst)
            .unwrap(),
    )
    .shards(64)
    .lease_size(10)
    .lifetime(Duration::from_millis(50))
    .build_with_clock(clock.clone())
    .unwrap()
}

/// A lease outlives the central booking it came from (the central word refills
/// while the lease still holds its units): the lease's units plus the central
/// word's remaining pass the burst, and the report is capped there. What it shows
/// this thread can take at once; one more it cannot. (The cap is also
/// `Decision::remaining`'s, which never passes the limit, so dropping the report's
/// own `.min(burst)` changes nothing.) Mutation that fails it: `report_at` reading
/// the lease at the expiry clock's 0 (`self.own_units(0)`: no lease counted, 90
/// shown where 99 can be taken).
#[test]
fn a_report_is_at_most_the_burst_and_what_this_thread_can_take_at_once() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let l = leased(100, &clock);
    assert!(l.check().is_allowed()); // leases 10 (central: 90), spends 1
    assert_eq!(l.units_on_lease(), 9);
    assert_eq!(l.report().remaining(), 99);
    // 10 ms on: the central booking of the lease's 10 units has passed (central
    // 100), the lease (50 ms) still holds its 9.
    clock.advance(Duration::from_millis(10));
    assert_eq!(l.peek(0).remaining(), 100);
    let report = l.report();
    assert_eq!(report.remaining(), 100, "{report:?}");
    assert_eq!(report.limit(), 100);
    assert_eq!(report.reset_after(), l.peek(0).reset_after());
    let cost = u32::try_from(report.remaining()).unwrap();
    assert!(l.peek(cost).is_allowed());
    assert!(!l.peek(cost + 1).is_allowed());
    assert!(l.check_n(cost).is_allowed(), "the report's units, at once");
    // Afterwards: nothing to show but what the central word holds back, and the
    // report again what a check of that many would be.
    let report = l.report();
    assert!(l
        .peek(u32::try_from(report.remaining()).unwrap())
        .is_allowed());
    assert!(!l
        .peek(u32::try_from(report.remaining()).unwrap() + 1)
        .is_allowed());
}

/// Over a walk of checks, refunds and clock steps, the report never passes the
/// burst, is this thread's unexpired lease plus the central word's remaining, and a
/// check of its `remaining` on this thread would be admitted (its peek, decision for
/// decision the check's). Mutation that fails it: as above.
#[test]
fn a_report_never_promises_more_than_this_thread_can_take() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let l = leased(40, &clock);
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut held = Vec::new();
    for step in 0..4_000 {
        match next() % 8 {
            0..=3 => {
                let (d, receipt) = l.charge(u32::try_from(next() % 12).unwrap());
                if d.is_allowed() && receipt.is_charged() {
                    held.push(receipt);
                }
            }
            4 if !held.is_empty() => {
                let i = usize::try_from(next() % held.len() as u64).unwrap();
                let _ = l.refund(held.swap_remove(i));
            }
            _ => {
                clock.advance(Duration::from_micros(next() % 4_000));
            }
        }
        let report = l.report();
        assert!(report.remaining() <= 40, "step {step}: {report:?}");
        // One thread: its lease is every unexpired lease.
        let central = l.peek(0);
        assert_eq!(
            report.remaining(),
            (central.remaining() + l.units_on_lease()).min(40),
            "step {step}"
        );
        assert_eq!(report.reset_after(), central.reset_after(), "step {step}");
        let cost = u32::try_from(report.remaining()).unwrap();
        assert!(
            l.peek(cost).is_allowed(),
            "step {step}: report {report:?}, peek {:?}",
            l.peek(cost)
        );
    }
}

/// A denial and a cost of 0 hold no charge, and their refund gives nothing back
/// and changes nothing. Mutations that fail it: `charge_on` without `cost > 0`
/// (a cost-0 receipt charged), and without `decision.is_allowed()` (a denial's).
#[test]
fn a_denial_or_a_cost_of_0_holds_nothing_to_give_back() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let l = leased(20, &clock);
    let (d, zero) = l.charge(0);
    assert!(d.is_allowed() && !zero.is_charged(), "{d:?} {zero:?}");
    let (d, all) = l.charge(20);
    assert!(d.is_allowed() && all.is_charged());
    let (d, denied) = l.charge(5);
    assert!(!d.is_allowed() && !denied.is_charged(), "{d:?} {denied:?}");
    let (d, never) = l.charge(21);
    assert!(!d.is_allowed() && !never.is_charged());
    let before = (l.report(), l.units_on_lease(), l.peek(0));
    for receipt in [zero, denied, never] {
        assert!(!l.refund(receipt));
    }
    assert_eq!((l.report(), l.units_on_lease(), l.peek(0)), before);
}

/// A cold key's report is its `peek(key, 0)`; a hot key's is its lease limiter's
/// report (this thread's lease units plus the central word's remaining), where its
/// peek at 0 is the central word alone. Mutation that fails it: `report` answering
/// `peek(key, 0)` for a hot key too (3 shown, not 6).
#[test]
fn a_hot_key_limiters_report_is_the_cold_peek_or_the_lease_report() {
    let clock = ManualClock::starting_at(Nanos::from_secs(1));
    let h = HotKeyLimiter::<u64, _>::new(
        Policy::per_second(1).unwrap().with_burst(10).unwrap(),
        KeyedBuilder::default().clock(clock.clone()),
        HotKeys::default().lease_size(4).lease_shards(64).manual(),
    )
    .unwrap();
    // Cold: a key never seen, then one that spent 3.
    assert_eq!(h.report(&1), h.peek(&1, 0));
    assert_eq!(h.report(&1).remaining(), 10);
    assert!(h.check_n(&1, 3).is_allowed());
    assert_eq!(h.report(&1), h.peek(&1, 0));
    assert_eq!(h.report(&1).remaining(), 7);
    // Hot: leases 4 of the 7, spends 1.
    assert!(h.promote(&1));
    assert!(h.check(&1).is_allowed());
    assert_eq!(h.peek(&1, 0).remaining(), 3, "the central word");
    assert_eq!(h.report(&1).remaining(), 6, "3 on the lease + 3");
    assert_eq!(h.report(&1).reset_after(), h.peek(&1, 0).reset_after());
    // Another thread holds no lease of key 1: its report is the central word's.
    let elsewhere = std::thread::scope(|s| s.spawn(|| h.report(&1)).join().unwrap());
    assert_eq!(elsewhere.remaining(), 3);
    // Demoted: cold again, the leased units spent.
    assert!(h.demote(&1));
    assert_eq!(h.report(&1), h.peek(&1, 0));
    assert_eq!(h.report(&1).remaining(), 3);
}
