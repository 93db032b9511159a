//! Keyed limiting: one limit per key (IP, user, API key, endpoint), millions of keys,
//! bounded memory.
//!
//! [`KeyedLimiter<K, A, C, S>`] keeps one state word per key in a sharded table (see
//! the design below) and runs any [`Algorithm`](crate::Algorithm) on it. Its last type
//! parameter is the storage ([`Storage`]), the way governor's
//! `RateLimiter<K, S: StateStore, C>` varies its store; every feature below works on
//! each:
//!
//! * [`Heap`] (the default, [`KeyedBuilder::build`]): heap entries for any
//!   `Hash + Eq` key, looked up by borrowed forms ([`Lookup`]: `&str` for `String`,
//!   [`Pair`] for pairs) without allocating for a key already present;
//! * [`Inline`] ([`KeyedBuilder::build_inline`]): keys that encode into 64 bits
//!   ([`InlineKey`]: integers, `[u8; N ≤ 8]`, `Ipv4Addr`, `IpAddr`, [`Ipv6Prefix`])
//!   sit in the slot next to the state: no heap entry, no epoch and one cache miss
//!   per lookup, in ≈ 21.8 bytes per key (see "Inline storage" below);
//! * [`Fingerprint`] (opt-in, [`KeyedBuilder::build_fingerprint`]): any `Hash` key
//!   as a 64-bit keyed hash in the inline slot, with documented collision odds.
//!
//! Around them (the policy features):
//!
//! * [`plans`]: per-key quotas (`free`, `pro`, `enterprise`) on GCRA or either window,
//!   loadable from TOML, with a resolver from key to plan and runtime quota changes
//!   that keep every key's state;
//! * [`log`]: the exact sliding log per key ([`KeyedSlidingLog`]): a log is many
//!   words, so its keys sit in sharded maps under one mutex per shard, with the same
//!   capacity and reclamation rules, evicting the lightest key of a ranking of the
//!   whole shard;
//! * [`hot`]: keyed GCRA whose hot keys (found by sampling, or named) move to
//!   per-core leases ([`HotKeyLimiter`]), so one key hit by every core scales;
//! * [`composite`]: several limits (global, per user, per endpoint) as one decision —
//!   if any denies, none is charged;
//! * brute-force protection, below.
//!
//! # Design
//!
//! * **Shards**: a power of two of them (by default 4 × `available_parallelism()`,
//!   rounded up, at most one per 64 keys of capacity), each `CachePadded`; keys are
//!   hashed once with `ahash` (random per-process seeds: no HashDoS) and the high hash
//!   bits pick the shard.
//! * **Hot path for a known key**: an epoch pin (a thread-local write), a linear probe
//!   over a fixed slot array comparing hash tags, one key comparison, and the
//!   algorithm's CAS on the key's own state word. No lock, no allocation, no other
//!   shared write. A *new* key takes its shard's mutex once, to be inserted.
//! * **Exact keys**: slots point to heap entries holding the key itself; two
//!   different keys never share a state.
//! * **Bounded memory**: the slot array is sized once from the capacity (load factor
//!   ≤ 3/4) and never grows; at most [`KeyedLimiter::max_keys`] entries exist (the
//!   capacity plus a slack for uneven hashing across shards). Memory is
//!   `slots × 16 bytes + live keys × size_of::<(K, state)>()` plus allocator overhead
//!   (for `u64` keys: ≈ 21.8 + 16 bytes of payload per key at full capacity) and the
//!   heap memory the keys own (a `String`'s bytes: bound keys' lengths), plus
//!   removed entries waiting for the epoch to free them — pins last one lookup, so
//!   that backlog stays small: the 10 M-key flood test peaks at 38.6 bytes per key
//!   of capacity, all included. A build whose slot array would pass the
//!   [memory budget](KeyedBuilder::memory_budget) (4 GiB by default) is refused with
//!   [`KeyedError::OverMemoryBudget`] before anything is allocated.
//! * **Capacity means capacity**: a table holds `capacity` keys, idle or live,
//!   without reclaiming, evicting or re-inserting any of them, so clients under
//!   their rate — idle between requests — keep their entries. Each shard's share
//!   carries a headroom for uneven hashing, sized by Bernstein's inequality so that
//!   the chance of `capacity` keys overflowing any shard is below 2^-40 (2.2 % more
//!   slots at 125 000 keys per shard, 23 % at 1 250; none with one shard).
//! * **Reclamation without a call**: when an insert finds its shard at its full
//!   share, a clock hand inspects a few slots and drops idle keys (state equal
//!   to a fresh one at `now`, e.g. GCRA `TAT ≤ now`): lossless. The hand steps
//!   through the slots in an order spread over the shard, so that the keys it
//!   drops leave no long run of occupied slots for probes to walk. Each shard records
//!   the latest instant it removed a key at, and every decision in the shard is made
//!   at `max(reading, that instant)`: a reading taken before the removal (a thread
//!   preempted between its clock read and its check, a core whose TSC reads early,
//!   `check_n_at` with an older time) is answered exactly as an unbounded map of
//!   un-keyed limiters would answer at that instant, never from a fresh state at an
//!   earlier one; its `reset_after` and `retry_after` count from that instant too
//!   (the clock has passed it), not from the earlier reading — unlike an un-keyed
//!   limiter's reading behind its own state, whose waits count from the reading.
//!   A denied or cost-0
//!   request for an unknown key stores nothing, so it inserts nothing.
//! * **Eviction when full**: if the hand's walk meets only live keys, the whole
//!   shard is searched for idle keys first (one pass under its lock) and every idle
//!   one is reclaimed; a live key is evicted only if that pass finds none. Passes are
//!   amortized: the next is due once the last is paid for by ⌊share / 8⌋ removals
//!   (the idle keys it reclaimed, then the live evictions since), so a flood of
//!   unique live keys costs one pass per ⌊share / 8⌋ inserts. Until then the walk's
//!   sample is evicted from without a pass: a key that went idle since the last pass
//!   may wait for the hand while live keys go. In shards of fewer than 16 keys every
//!   eviction follows a pass at its own insert (with one thread; `evict_sampled` in
//!   `keyed/storage/mod.rs` states the rule exactly). The key
//!   evicted is the one whose loss forgives least of a sample of 8, counted
//!   ([`KeyedMetrics::evicted`]): the fewest units in use now (`limit − remaining`),
//!   then the least `reset_after` — so a heavy user is never evicted while a
//!   lighter key is in the sample, whatever the algorithm, as long as the table's
//!   keys share one policy; [plans] give each plan a table of its own for that
//!   reason (see [`plans`]). The victim is taken only if
//!   it forgives no more than when it was ranked: decisions CAS states without the
//!   shard lock, and one that charged the victim meanwhile — or a hot-key promotion
//!   that sealed it — keeps it, and the next slots are sampled. *Accuracy cost*: an evicted key forgets its state,
//!   so its next request sees a fresh key — up to one extra burst for that key. This
//!   happens only when nearly as many keys are live at once as the capacity (a shard
//!   evicts only after a pass found more than 7/8 of its share live, idleness
//!   judged at the inserting request's reading); size the
//!   capacity for your live set (≈ keys seen within the longest `reset_after`).
//! * **Retirement is exact under races**: a key is removed by first CASing its state
//!   word to a reserved *dead* word; a concurrent decision either lands before (the
//!   reclaimer sees it and re-judges) or fails its CAS, sees *dead* and retries on
//!   the locked path. A removed slot never hands one key's state to another (loom:
//!   `tests/loom_keyed.rs`; the full look's pass racing checks and peeks of keys it
//!   moves or that a check makes live: `tests/loom_keyed_look.rs`).
//!
//! ## Why this design
//!
//! A per-shard sequence lock over inline keys would be cheaper to read, but a reader
//! comparing a key while a writer overwrites that slot is a data race on the key's
//! memory — undefined behaviour for any key, and a use-after-free for a `String`.
//! Heap entries behind an epoch make every key comparison read memory that cannot be
//! freed or rewritten under the reader, for any `K`. The price is one pointer chase
//! per lookup, the pin, and 16 bytes of slot plus the entry per key (≈ 34.5 bytes per
//! `u64` key at 1 M keys, payload only). Reader-count locks (DashMap) are avoided on
//! purpose: their shared write on every read is what makes two threads on distinct
//! keys slower than one.
//!
//! ## Inline storage
//!
//! For keys that encode into 64 bits the race above disappears: the key is not
//! memory to compare but bits in an atomic word. [`Inline`] storage keeps each
//! slot as one 128-bit atomic `(key bits, state bits)`; a lookup is one load of one
//! slot, a decision one 128-bit CAS on it. Empty is the state half all ones (the
//! reserved dead word), so every key bit pattern is usable. Slots are reused in
//! place and nothing is freed, so no epoch is needed; the CAS compares the key too,
//! so a reader holding a stale view of a slot that another key has since taken can
//! never charge that key (the proof is in the table's source; loom models in
//! `tests/loom_keyed_compact.rs`). Same sizing, reclamation, eviction, metrics,
//! receipts and refunds as the heap storage (shared code; a refund's CAS compares the
//! key half too): 16 bytes × 4/3 load × ≈ 2 % shard slack ≈ 21.8
//! bytes per key of capacity, all of it allocated at build (the 10 M-key flood test
//! peaks at 22.2 bytes per key, all included).
//!
//! # Layout
//!
//! The module's files are its floors, and imports point down: `storage` (the
//! shard machinery every storage shares, then `heap` and `inline`, the slot arrays),
//! `key` (lookup forms and inline encodings), `limiter` (the one limiter type,
//! builder, metrics, errors, written once over the storage's table), `log` (the keyed
//! sliding log: its own sharded maps, the same capacity and removal rules), then
//! `policy/`, the features built on the limiter: `plans` (and `config`, its TOML
//! loader, which reaches `plans` and never the reverse), `composite` and `hot`. Their
//! public paths stay `keyed::{plans, composite, hot}`.
//!
//! # Memory ordering
//!
//! State words are `Relaxed` (see [`Algorithm`](crate::Algorithm)). Slot publication is Release/Acquire
//! (entry before pointer before tag); entries are freed through crossbeam-epoch; a
//! per-shard sequence number (Release/Acquire with an Acquire fence) lets a `peek`
//! trust a miss. Writers serialise on the shard mutex.
//!
//! # Brute-force protection
//!
//! "At most 5 failed logins per 5 minutes per (IP, user)": charge first, refund on a
//! success. [`charge`](KeyedLimiter::charge) counts the attempt the moment it
//! arrives, so N parallel guesses cannot all pass a gate that none of them has yet
//! charged (a `peek` first would let them); a right password hands the
//! [`Receipt`](crate::Receipt) back ([`refund`](KeyedLimiter::refund)), so the
//! attempt does not count as a failure.
//!
//! ```
//! use floodgate::{KeyedLimiter, ManualClock, Policy};
//! use std::net::IpAddr;
//! use std::time::Duration;
//!
//! let clock = ManualClock::new();
//! let failures: KeyedLimiter<(IpAddr, String), _, _> =
//!     floodgate::KeyedBuilder::new(floodgate::Gcra::new(Policy::new(5, Duration::from_secs(300))?))
//!         .clock(clock.clone())
//!         .build()?;
//!
//! let login = |ip: IpAddr, user: &str, password_ok: bool| -> Result<(), Option<Duration>> {
//!     let key = (ip, user.to_owned());
//!     let (gate, receipt) = failures.charge(&key, 1);
//!     if !gate.is_allowed() {
//!         return Err(gate.retry_after()); // locked out: do not even check the password
//!     }
//!     if password_ok {
//!         let _ = failures.refund(&key, receipt); // not a failure: give it back
//!         return Ok(());
//!     }
//!     Err(None) // the charge stays: one failure counted
//! };
//!
//! let ip: IpAddr = "192.0.2.7".parse()?;
//! for _ in 0..5 {
//!     assert_eq!(login(ip, "alice", false), Err(None));
//! }
//! // The sixth attempt is refused before the password check, even the right one.
//! assert_eq!(login(ip, "alice", true), Err(Some(Duration::from_secs(60))));
//! assert_eq!(login(ip, "bob", true), Ok(())); // other users are unaffected
//! clock.advance(Duration::from_secs(60));
//! assert_eq!(login(ip, "alice", true), Ok(()));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A key of (IP, user) alone lets many addresses guess one account, and one address
//! try a few passwords on every account. In production, limit the failures per user
//! **and** per IP as one composite: [`charge_all`](composite::charge_all) charges both
//! or neither (an attempt refused for the user costs the address nothing), and
//! [`refund_all`](composite::refund_all) gives both back on a success. Other users'
//! refunds in between take nothing from it while the shard has made at most 8 refunds
//! since the charge; on a shard busier than that during the password check a refund
//! counts them all as its own and may give back less, so a success can now and then
//! stay counted as a failure — more shards ([`KeyedBuilder::shards`]) make that rarer
//! (see [`KeyedLimiter::refund`]).
//! Refund rather than [`reset`](KeyedLimiter::reset) on a success: a reset of a
//! per-user key would also forgive an attacker's failures every time the owner logs
//! in.
//!
//! ```
//! use floodgate::{charge_all, refund_all, KeyedLimiter, Limit, ManualClock, Policy, PolicyId};
//! use std::net::IpAddr;
//!
//! let clock = ManualClock::new();
//! let per_user: KeyedLimiter<String, _, _> =
//!     KeyedLimiter::gcra_with_clock(Policy::per_hour(5)?, clock.clone());
//! let per_ip: KeyedLimiter<IpAddr, _, _> =
//!     KeyedLimiter::gcra_with_clock(Policy::per_hour(20)?, clock.clone());
//! let (user_id, ip_id) = (PolicyId::new(1), PolicyId::new(2));
//!
//! let login = |ip: IpAddr, user: &str, password_ok: bool| -> Result<(), &'static str> {
//!     // The address first: an address already refused never touches the user's
//!     // limit (no charge of the victim's allowance to roll back).
//!     let limits = [
//!         &per_ip.limit(&ip).with_policy_id(ip_id) as &dyn Limit,
//!         &per_user.limit(user).with_policy_id(user_id),
//!     ];
//!     let (gate, receipt) = charge_all(&limits, 1);
//!     if !gate.is_allowed() {
//!         return Err(if gate.policy() == user_id {
//!             "too many failures for this user"
//!         } else {
//!             "too many failures from this address"
//!         });
//!     }
//!     if password_ok {
//!         refund_all(&limits, receipt);
//!         return Ok(());
//!     }
//!     Err("wrong password")
//! };
//!
//! // Five addresses, one guess each: the account is locked for all of them.
//! for last in 1..=5u8 {
//!     assert_eq!(login(IpAddr::from([198, 51, 100, last]), "alice", false), Err("wrong password"));
//! }
//! let home: IpAddr = "192.0.2.1".parse()?;
//! assert_eq!(login(home, "alice", true), Err("too many failures for this user"));
//! // That refusal cost `home` nothing, and a success costs nothing either.
//! assert_eq!(login(home, "bob", true), Ok(()));
//! assert_eq!(per_ip.peek(&home, 0).remaining(), 20);
//! // The owner's success gave back only her own attempt: the lockout stands.
//! assert_eq!(per_user.peek("alice", 0).remaining(), 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod key;
mod limiter;
pub mod log;
mod policy;
mod storage;

pub use policy::{composite, hot, plans};

pub use hot::{HotKeyError, HotKeyLimiter, HotKeys, HotMetrics, MAX_HOT_KEYS};
pub use key::{InlineKey, Ipv6Prefix, Lookup, Pair, PrefixTooLong};
pub use limiter::{
    KeyedBuilder, KeyedError, KeyedLimiter, KeyedMetrics, DEFAULT_CAPACITY, DEFAULT_MEMORY_BUDGET,
    MAX_CAPACITY,
};
pub use log::KeyedSlidingLog;
pub use storage::{Fingerprint, Heap, Inline, Storage};
