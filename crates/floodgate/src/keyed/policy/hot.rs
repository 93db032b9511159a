//! [`HotKeyLimiter`]: keyed GCRA whose hot keys scale across cores.
//!
//! Every admission of a key writes that key's state word, so a key that every core
//! hits (a big tenant, one API key behind a load balancer) is one cache line moving
//! between cores on every decision — the hot-key problem of the global limit, one
//! key at a time. A `HotKeyLimiter` runs each key as the keyed table's exact GCRA
//! until the key turns **hot**, then moves its schedule into a
//! [`LeasedGcra`] of its own (the hot-key mode of the direct
//! limiter: per-core leases of units taken from the key's central word), and moves
//! it back when asked or when its slot is wanted for a hotter key.
//!
//! # How a key is routed
//!
//! A hot key's state word in the table is **sealed**: its top bit is set (a real
//! schedule never sets it before the year 2116) and it names the key's slot and the
//! promotion's generation. A check reads the key's word as usual; a cold key's check
//! is the table's exact GCRA plus a test of that bit and, with detection on, a
//! thread-local sample counter: about 1.2× the keyed table's instructions per check
//! (callgrind, 10 000 inline `u64` keys: 287 against 237). A sealed word writes nothing
//! (a read of a shared line, not a transfer) and sends the check to the slot's
//! lease limiter. So the table holds every key, hot or cold, and a hot key's word is
//! never idle, never reclaimed, and the last choice of an eviction sample.
//!
//! # Promotion and demotion (one at a time, under a lock of their own)
//!
//! * **Promote:** publish the slot's entry (closed), seal the key's word with one
//!   CAS — which takes the key's schedule `TAT` as it stands — then open the entry's
//!   central word at that `TAT`. Every unit admitted before the seal is in the
//!   `TAT`; every unit after it comes from the entry's central word.
//! * **Demote:** close the entry (its central word goes to the end of time: a
//!   refill is denied), which returns the central `TAT` with every unit ever leased
//!   in it, then unseal the key's word to that `TAT`, unpublish the slot and free the
//!   entry through the epoch. Units left on shard leases may still be spent by
//!   checks already on their way; they were counted in the `TAT`, so nothing is
//!   admitted twice.
//!
//! A check that meets a key between two of these steps waits (spinning, then
//! yielding) until the thread taking them finishes: a promoting thread descheduled
//! mid-way holds that key's checks for as long. Each retry after a wait reads the
//! clock again (only a check that waited pays for it), so the check is decided at
//! a reading taken after its last wait, not at the one it took first. Entries are found
//! through an epoch-protected pointer and checked against the word's generation,
//! so a check never spends another key's units.
//!
//! # The bound
//!
//! A cold key is exact. A hot key admits as its [`LeasedGcra`]
//! does: over any interval, at most what its central GCRA allows plus the units out
//! on lease at the interval's start (at most `shards × lease size`), and it
//! under-admits by at most the units stranded in idle shards for at most one lease
//! lifetime. A hot key's check is judged at the instant the table judges a cold
//! key's: `max(reading, the shard's latest removal instant)`, so a reading taken
//! before a removal never finds the key's fresh schedule in the past (each removal
//! forgives at most one burst, hot or cold: [`KeyedLimiter::remove`]). A check
//! that waited out a promotion or demotion is judged so at a reading taken after
//! its last wait: it spends a lease only if the lease is unexpired there, and a
//! denial's wait is the schedule's at that reading — within the burst, plus only
//! what the clock moved between that reading and the latest admission (as for
//! any check), not what it moved during the wait. A key with
//! units out on lease is never idle (its slot is not reused
//! while they are valid). The hot-key mode is the one mode exempt from exact
//! admission. [`charge`](HotKeyLimiter::charge) and
//! [`refund`](HotKeyLimiter::refund) are offered: a cold key's are the keyed
//! table's (exact); a hot key's are its lease limiter's: back to the lease the
//! units were spent from (on the charging thread, while it is unexpired, never above
//! the lease size), else the part of the charge's booking still ahead of the clock
//! back to the central word (see [`LeasedGcra::refund`]), so the bound holds with a
//! charge still refundable counted as out on lease. A hot refund that a demotion
//! overtakes (its units land on the lease after the demotion closed its central
//! word and counted them spent) takes them back off the lease and answers `false`;
//! a refund to the central word gives nothing once the word is closed.
//!
//! # Detection
//!
//! With detection on (the default), each thread samples one cold check in
//! `sample_every` (a thread-local counter, no shared write) into a small table of
//! candidates under a lock taken with `try_lock` (a busy lock skips the sample). A
//! key sampled `samples` times from at least `threads` threads within one `window`
//! is promoted if a slot is free or held by an idle key. [`HotKeyLimiter::promote`]
//! and [`HotKeyLimiter::demote`] do it by hand.
//!
//! # Examples
//!
//! ```
//! use floodgate::{HotKeys, HotKeyLimiter, KeyedBuilder, ManualClock, Policy};
//! let clock = ManualClock::new();
//! let per_tenant = HotKeyLimiter::new(
//!     Policy::per_second(1_000)?.with_burst(100)?,
//!     KeyedBuilder::default().capacity(10_000).clock(clock.clone()),
//!     HotKeys::default().lease_size(10),
//! )?;
//! assert!(per_tenant.check("small").is_allowed());
//! assert!(per_tenant.promote("big")); // or let detection find it
//! assert!(per_tenant.is_hot("big"));
//! assert!(per_tenant.check("big").is_allowed()); // spent from this core's lease
//! assert!(per_tenant.demote("big"));
//! assert_eq!(per_tenant.check("big").remaining(), 89); // the lease's 10 units count
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use core::fmt;
use core::marker::PhantomData;
use core::time::Duration;

use crossbeam_utils::{Backoff, CachePadded};

use crate::algorithm::{Algorithm, Charged};
use crate::clock::{Clock, DefaultClock, Nanos};
use crate::decision::Decision;
use crate::gcra::{Gcra, GcraState};
use crate::keyed::key::Lookup;
use crate::keyed::limiter::{KeyedBuilder, KeyedError, KeyedLimiter, KeyedMetrics};
use crate::keyed::storage::{table_hasher, Heap, Salt, Storage};
use crate::lease::{LeaseBuilder, LeaseError, LeasedGcra};
use crate::policy::Policy;
use crate::receipt::Receipt;
use crate::sync::{lock, pin, retire, thread_index, AtomicPtr, AtomicU64, Mutex, Ordering};

/// The most hot keys a limiter holds: fewer than the 8 keys an eviction samples, so
/// a sample of a shard holding at least 8 keys always holds a cold one.
pub const MAX_HOT_KEYS: usize = 7;

/// The top bit: a sealed word (a hot key's), never a real schedule's.
const SEALED: u64 = 1 << 63;
/// Low bits of a sealed word: the slot.
const SLOT_BITS: u32 = 3;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
const _: () = assert!(MAX_HOT_KEYS as u64 <= SLOT_MASK);

/// The sealed word of `slot` at promotion `generation`.
fn seal_word(slot: usize, generation: u64) -> u64 {
    SEALED | ((generation << SLOT_BITS) & !SEALED) | slot as u64
}

/// `(slot, generation bits)` of a sealed word.
fn seal_parts(word: u64) -> (usize, u64) {
    ((word & SLOT_MASK) as usize, word & !SEALED)
}

/// What one table decision does to a key's word.
#[derive(Clone, Copy, Debug)]
enum Mode {
    /// A check: GCRA on a cold word; a sealed word is reported, not written.
    Decide,
    /// A promotion: the word becomes this sealed word.
    Seal(u64),
    /// A demotion: a word sealed as `word` becomes the schedule `tat`.
    Unseal { word: u64, tat: u64 },
}

/// GCRA that knows sealed words: the table's algorithm (see the [module
/// docs](self)). What a decision met travels back in the decision the table returns
/// for the key itself (an eviction's judgments of other keys return nothing to the
/// caller): a sealed word as a denial whose `reset_after` is the word (a real
/// schedule's is below 2^63 ns), a seal's replaced schedule as the step's
/// `reset_after`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HotGcra {
    gcra: Gcra,
    mode: Mode,
}

impl HotGcra {
    fn new(gcra: Gcra, mode: Mode) -> HotGcra {
        HotGcra { gcra, mode }
    }

    /// A sealed word's answer to a plain decision: nothing left; as an eviction
    /// order, every unit in use and the latest reset: the last choice. Its
    /// `retry_after` is the instant `now` the table judged the decision at (the
    /// reading, or the shard's latest removal instant if later), for the hot key's
    /// lease limiter to decide at.
    fn sealed(&self, word: u64, now: Nanos) -> Decision {
        let burst = self.gcra.policy().burst();
        Decision::deny(burst, 0, 1, word, now.as_u64())
    }

    /// The answer to a promotion's or demotion's own step (never seen by a user),
    /// carrying `schedule`.
    fn step(&self, schedule: u64) -> Decision {
        let burst = self.gcra.policy().burst();
        Decision::allow(burst, 0, 1, schedule)
    }

    /// A decision on a sealed word, or a promotion's or demotion's step (kept out of
    /// line: a cold key's check never comes here).
    #[cold]
    #[inline(never)]
    fn step_or_sealed(&self, state: GcraState, now: Nanos) -> (Decision, Option<GcraState>) {
        let tat = state.tat().as_u64();
        let sealed = tat & SEALED != 0;
        match self.mode {
            Mode::Unseal { word, tat: to } if sealed && word == tat => {
                (self.step(to), Some(GcraState::from_tat(Nanos::new(to))))
            }
            _ if sealed => (self.sealed(tat, now), None),
            Mode::Seal(word) => (self.step(tat), Some(GcraState::from_tat(Nanos::new(word)))),
            Mode::Unseal { .. } | Mode::Decide => (self.step(0), None),
        }
    }
}

/// The sealed word a table decision reports, if it met one, and the instant the table
/// judged it at: `now`, or the shard's latest removal instant if that is later (a
/// hot key's check is judged there, as a cold key's is, so a reading taken before a
/// removal never finds the key's fresh schedule in the past).
fn sealed_in(decision: &Decision, now: Nanos) -> Option<(u64, Nanos)> {
    let word = decision.reset_after_nanos();
    let judged = Nanos::new(decision.retry_after_nanos().unwrap_or(0)).max(now);
    (!decision.is_allowed() && word & SEALED != 0).then_some((word, judged))
}

impl Algorithm for HotGcra {
    type State = GcraState;

    #[inline(always)]
    fn decide(&self, state: GcraState, now: Nanos, cost: u32) -> (Decision, Option<GcraState>) {
        if state.tat().as_u64() & SEALED != 0 || !matches!(self.mode, Mode::Decide) {
            return self.step_or_sealed(state, now);
        }
        match self.gcra.decide(state, now, cost) {
            // A schedule that would reach the sealed bit (a clock past 2^62 ns, the
            // year 2116): never admitted, so no word is ever mistaken for one.
            (_, Some(next)) if next.tat().as_u64() & SEALED != 0 => {
                let burst = self.gcra.policy().burst();
                (Decision::never(burst, 0, 1, 0), None)
            }
            outcome => outcome,
        }
    }

    #[inline]
    fn is_idle(&self, state: GcraState, now: Nanos) -> bool {
        state.tat().as_u64() & SEALED == 0 && self.gcra.is_idle(state, now)
    }

    fn refund(
        &self,
        state: GcraState,
        charge: &Charged<GcraState>,
        shift: u64,
        now: Nanos,
    ) -> Option<(GcraState, u64)> {
        if state.tat().as_u64() & SEALED != 0 {
            return None;
        }
        self.gcra.refund(state, charge, shift, now)
    }

    fn refund_moves_later(
        &self,
        state: GcraState,
        charge: &Charged<GcraState>,
        shift: u64,
    ) -> bool {
        self.gcra.refund_moves_later(state, charge, shift)
    }
}

/// How a [`HotKeyLimiter`] leases and detects (see the [module docs](self)).
///
/// # Examples
///
/// ```
/// use floodgate::HotKeys;
/// use std::time::Duration;
/// let hot = HotKeys::default()
///     .slots(2)
///     .lease_size(32)
///     .lease_lifetime(Duration::from_micros(500))
///     .detection(64, Duration::from_millis(10), 16, 2);
/// let manual = HotKeys::default().manual(); // only promote() makes a key hot
/// # let _ = (hot, manual);
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct HotKeys {
    slots: usize,
    shards: Option<usize>,
    lease_size: Option<u32>,
    lifetime: Duration,
    detect: Option<Detect>,
}

#[derive(Clone, Copy, Debug)]
struct Detect {
    /// A power of two: one cold check in this many is sampled per thread.
    sample_every: u32,
    window: u64,
    samples: u32,
    threads: u32,
}

impl Default for HotKeys {
    /// 4 slots; leases as [`LeasedGcra::builder`](crate::LeasedGcra::builder)'s
    /// defaults (one shard per core, burst ÷ (4 × shards) units, 1 ms); detection on:
    /// 1 cold check in 64 sampled per thread, a key sampled 16 times from 2 threads
    /// within 10 ms turns hot (about 100 000 checks a second from several cores).
    fn default() -> Self {
        HotKeys {
            slots: 4,
            shards: None,
            lease_size: None,
            lifetime: Duration::from_millis(1),
            detect: Some(Detect {
                sample_every: 64,
                window: 10_000_000,
                samples: 16,
                threads: 2,
            }),
        }
    }
}

impl HotKeys {
    /// How many keys can be hot at once (1 to [`MAX_HOT_KEYS`]).
    pub fn slots(mut self, slots: usize) -> Self {
        self.slots = slots;
        self
    }

    /// Lease shards per hot key (see [`LeaseBuilder::shards`]).
    pub fn lease_shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// Units per lease (see [`LeaseBuilder::lease_size`]).
    pub fn lease_size(mut self, units: u32) -> Self {
        self.lease_size = Some(units);
        self
    }

    /// How long unspent leased units stay spendable (see [`LeaseBuilder::lifetime`]).
    pub fn lease_lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = lifetime;
        self
    }

    /// Detection: one cold check in `sample_every` (rounded up to a power of two, at
    /// most 2^31) sampled per thread; a key sampled `samples` times from at least
    /// `threads` threads within `window` turns hot.
    pub fn detection(
        mut self,
        sample_every: u32,
        window: Duration,
        samples: u32,
        threads: u32,
    ) -> Self {
        self.detect = Some(Detect {
            sample_every: sample_every.clamp(1, 1 << 31).next_power_of_two(),
            window: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX),
            samples: samples.max(1),
            threads: threads.clamp(1, 64),
        });
        self
    }

    /// No detection: keys turn hot only by [`HotKeyLimiter::promote`].
    pub fn manual(mut self) -> Self {
        self.detect = None;
        self
    }

    fn lease(&self, policy: Policy) -> LeaseBuilder {
        // A hot key's schedule stays below the sealed bit, as a cold key's does
        // (`HotGcra::decide`): a demotion writes it back into the table.
        let mut lease = LeasedGcra::builder(policy)
            .lifetime(self.lifetime)
            .max_tat(SEALED - 1);
        if let Some(shards) = self.shards {
            lease = lease.shards(shards);
        }
        if let Some(size) = self.lease_size {
            lease = lease.lease_size(size);
        }
        lease
    }
}

/// Why a [`HotKeyLimiter`] could not be built.
///
/// # Examples
///
/// ```
/// use floodgate::{HotKeyError, HotKeys, HotKeyLimiter, KeyedBuilder, Policy};
/// let err = HotKeyLimiter::<u64>::new(Policy::per_second(10)?, KeyedBuilder::default(), HotKeys::default().slots(9))
///     .unwrap_err();
/// assert_eq!(err, HotKeyError::Slots(9));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HotKeyError {
    /// The key table's configuration.
    Keyed(KeyedError),
    /// The lease settings.
    Lease(LeaseError),
    /// Hot slots outside `1..=MAX_HOT_KEYS`.
    Slots(usize),
    /// Fewer than 8 keys of capacity per shard: an eviction sample could then hold
    /// only hot keys.
    KeysPerShard {
        /// The table's capacity.
        capacity: usize,
        /// Its shards.
        shards: usize,
    },
}

impl fmt::Display for HotKeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HotKeyError::Keyed(e) => write!(f, "{e}"),
            HotKeyError::Lease(e) => write!(f, "{e}"),
            HotKeyError::Slots(n) => {
                write!(f, "{n} hot slots: use 1 to {MAX_HOT_KEYS}")
            }
            HotKeyError::KeysPerShard { capacity, shards } => write!(
                f,
                "a capacity of {capacity} keys over {shards} shards leaves fewer than 8 per shard"
            ),
        }
    }
}

impl std::error::Error for HotKeyError {}

/// Promotions and demotions so far, and the keys hot now.
///
/// # Examples
///
/// ```
/// use floodgate::{HotKeys, HotKeyLimiter, KeyedBuilder, Policy};
/// let limiter = HotKeyLimiter::<u64>::new(Policy::per_second(100)?, KeyedBuilder::default(), HotKeys::default())?;
/// assert!(limiter.promote(&7));
/// let m = limiter.hot_metrics();
/// assert_eq!((m.hot_keys, m.promotions, m.demotions), (1, 1, 0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HotMetrics {
    /// Keys hot now.
    pub hot_keys: u64,
    /// Keys made hot so far.
    pub promotions: u64,
    /// Keys made cold again so far.
    pub demotions: u64,
}

/// One hot key: the key, its promotion's generation, its lease limiter, and whether
/// that limiter's central word holds the key's schedule (open) yet or still.
struct HotEntry<K, C: Clock> {
    key: K,
    generation: u64,
    leased: LeasedGcra<C>,
    open: AtomicU64,
}

impl<K, C: Clock> HotEntry<K, C> {
    fn is_open(&self) -> bool {
        // Acquire: pairs with the promotion's Release store after it set the
        // central word, so a check that sees it open sees the key's schedule there.
        self.open.load(Ordering::Acquire) == 1
    }

    /// A hot charge's refund on this entry, the key's open entry when the caller
    /// saw it: the units back on this thread's lease while the key is hot. A
    /// demotion may close the entry's central word between the caller's look and
    /// the lease's store; after the close the key's schedule (every unit leased
    /// counted as spent) is the table's, so the units are taken back off the lease
    /// and the answer is `false` ([`LeasedGcra::refund_unless_closed_at`]).
    fn refund(&self, judged: Nanos, receipt: Receipt) -> bool {
        self.leased.refund_unless_closed_at(judged, receipt)
    }
}

/// A hot slot: the published entry, or null.
type Slot<K, C> = CachePadded<AtomicPtr<HotEntry<K, C>>>;

/// A key sampled by detection.
#[derive(Clone, Copy, Debug, Default)]
struct Candidate {
    hash: u64,
    samples: u32,
    threads: u64,
}

/// What promotions and demotions share, under one lock.
struct Admin {
    generation: u64,
    window_start: u64,
    candidates: [Candidate; 16],
    promotions: u64,
    demotions: u64,
}

impl Admin {
    /// Records a sample of `hash` from `thread`; whether the key is now hot.
    fn record(&mut self, hash: u64, thread: usize, now: u64, detect: Detect) -> bool {
        if now < self.window_start || now - self.window_start >= detect.window {
            self.candidates = [Candidate::default(); 16];
            self.window_start = now;
        }
        let i = self
            .candidates
            .iter()
            .position(|c| c.hash == hash && c.samples > 0)
            .unwrap_or_else(|| {
                (0..self.candidates.len())
                    .min_by_key(|&i| self.candidates[i].samples)
                    .unwrap_or(0)
            });
        let c = &mut self.candidates[i];
        if c.hash != hash || c.samples == 0 {
            *c = Candidate {
                hash,
                samples: 0,
                threads: 0,
            };
        }
        c.samples = c.samples.saturating_add(1);
        c.threads |= 1 << (thread % 64);
        let hot = c.samples >= detect.samples && c.threads.count_ones() >= detect.threads;
        if hot {
            *c = Candidate::default();
        }
        hot
    }
}

/// Keyed GCRA whose hot keys run on per-core leases: see the [module docs](self).
pub struct HotKeyLimiter<K, C = DefaultClock, S = Heap>
where
    C: Clock,
    S: Storage<K, GcraState>,
{
    keyed: KeyedLimiter<K, HotGcra, C, S>,
    gcra: Gcra,
    hot: HotKeys,
    slots: Box<[Slot<K, C>]>,
    admin: Mutex<Admin>,
    hasher: ahash::RandomState,
    /// The limiter owns its entries (through raw pointers).
    _owns: PhantomData<Box<HotEntry<K, C>>>,
}

impl<K, C> HotKeyLimiter<K, C>
where
    K: core::hash::Hash + Eq + Clone + Send + 'static,
    C: Clock + Clone + 'static,
    Heap: Storage<K, GcraState>,
{
    /// A limiter running `policy` for every key, with the capacity, shards and clock
    /// of `table`, and hot keys as `hot` says.
    ///
    /// # Errors
    ///
    /// A [`HotKeyError`] naming the bad setting.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{HotKeys, HotKeyLimiter, KeyedBuilder, Policy};
    /// let limiter = HotKeyLimiter::<String>::new(Policy::per_second(5)?, KeyedBuilder::default(), HotKeys::default())?;
    /// assert_eq!(limiter.check("alice").remaining(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(
        policy: Policy,
        table: KeyedBuilder<(), C>,
        hot: HotKeys,
    ) -> Result<Self, HotKeyError> {
        Self::new_in(policy, table, hot)
    }
}

impl<K, C, S> HotKeyLimiter<K, C, S>
where
    K: core::hash::Hash + Eq + Clone + Send + 'static,
    C: Clock + Clone + 'static,
    S: Storage<K, GcraState>,
{
    /// [`new`](HotKeyLimiter::new) on storage `S` (e.g. [`Inline`](crate::Inline) for
    /// `u64` or `IpAddr` keys).
    ///
    /// # Errors
    ///
    /// As [`new`](HotKeyLimiter::new).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{HotKeys, HotKeyLimiter, Inline, KeyedBuilder, Policy};
    /// let limiter: HotKeyLimiter<u64, _, Inline> =
    ///     HotKeyLimiter::new_in(Policy::per_second(5)?, KeyedBuilder::default(), HotKeys::default())?;
    /// assert!(limiter.check(&1).is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new_in(
        policy: Policy,
        table: KeyedBuilder<(), C>,
        hot: HotKeys,
    ) -> Result<Self, HotKeyError> {
        if hot.slots == 0 || hot.slots > MAX_HOT_KEYS {
            return Err(HotKeyError::Slots(hot.slots));
        }
        let gcra = Gcra::new(policy);
        let seed = table.seed();
        let table = table.settle_clock();
        let keyed = table
            .algorithm(HotGcra::new(gcra, Mode::Decide))
            .build_in::<K, S>()
            .map_err(HotKeyError::Keyed)?;
        if keyed.capacity() / keyed.shards() < 8 {
            return Err(HotKeyError::KeysPerShard {
                capacity: keyed.capacity(),
                shards: keyed.shards(),
            });
        }
        // The lease settings are checked once here; every promotion builds the same.
        hot.lease(policy)
            .build_with_clock(keyed.clock().clone())
            .map_err(HotKeyError::Lease)?;
        Ok(HotKeyLimiter {
            keyed,
            gcra,
            slots: (0..hot.slots)
                .map(|_| CachePadded::new(AtomicPtr::new(core::ptr::null_mut())))
                .collect(),
            hot,
            admin: Mutex::new(Admin {
                generation: 0,
                window_start: 0,
                candidates: [Candidate::default(); 16],
                promotions: 0,
                demotions: 0,
            }),
            hasher: table_hasher(seed, Salt::HotSample),
            _owns: PhantomData,
        })
    }

    /// Decides one unit for `key` now, consuming it if allowed.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{HotKeys, HotKeyLimiter, KeyedBuilder, Policy};
    /// let limiter = HotKeyLimiter::<u64>::new(Policy::per_hour(1)?, KeyedBuilder::default(), HotKeys::default())?;
    /// assert!(limiter.check(&1).is_allowed());
    /// assert!(!limiter.check(&1).is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn check<Q>(&self, key: &Q) -> Decision
    where
        Q: Lookup<K> + ?Sized,
    {
        self.check_n_at(key, self.keyed.clock().now(), 1)
    }

    /// Decides `cost` units for `key` now.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{HotKeys, HotKeyLimiter, KeyedBuilder, Policy};
    /// let limiter = HotKeyLimiter::<u64>::new(Policy::per_second(5)?, KeyedBuilder::default(), HotKeys::default())?;
    /// assert_eq!(limiter.check_n(&1, 5).remaining(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn check_n<Q>(&self, key: &Q, cost: u32) -> Decision
    where
        Q: Lookup<K> + ?Sized,
    {
        self.check_n_at(key, self.keyed.clock().now(), cost)
    }

    /// Decides `cost` units for `key` at `now` (read from this limiter's clock).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{HotKeys, HotKeyLimiter, KeyedBuilder, ManualClock, Nanos, Policy};
    /// let limiter = HotKeyLimiter::<u64, _>::new(Policy::per_second(1)?, KeyedBuilder::default().clock(ManualClock::new()), HotKeys::default())?;
    /// assert!(limiter.check_n_at(&1, Nanos::from_secs(1), 1).is_allowed());
    /// assert!(limiter.check_n_at(&1, Nanos::from_secs(2), 1).is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn check_n_at<Q>(&self, key: &Q, now: Nanos, cost: u32) -> Decision
    where
        Q: Lookup<K> + ?Sized,
    {
        let decision = self
            .keyed
            .decide_uncounted(self.keyed.algorithm(), key, now, cost);
        match sealed_in(&decision, now) {
            None => {
                self.keyed.count(decision.is_allowed());
                self.sample(key, now);
                decision
            }
            Some((word, judged)) => self.check_hot(word, judged, key, now, cost),
        }
    }

    /// A check that met the sealed `word`, which the table judged at `judged`: the
    /// slot's lease limiter at that instant, or (while a promotion or demotion of the
    /// key is half-way) a wait and another routing.
    #[inline(never)]
    fn check_hot<Q>(&self, word: u64, judged: Nanos, key: &Q, now: Nanos, cost: u32) -> Decision
    where
        Q: Lookup<K> + ?Sized,
    {
        let hot = |leased: &LeasedGcra<C>, at| (leased.check_n_at(at, cost), ());
        let cold = |now| {
            let decision = self
                .keyed
                .decide_uncounted(self.keyed.algorithm(), key, now, cost);
            (decision, ())
        };
        self.route_hot(word, judged, now, cost, hot, cold).0
    }

    /// [`check_hot`](Self::check_hot) with the receipt of the charge.
    #[inline(never)]
    fn charge_hot<Q>(
        &self,
        word: u64,
        judged: Nanos,
        key: &Q,
        now: Nanos,
        cost: u32,
    ) -> (Decision, Receipt)
    where
        Q: Lookup<K> + ?Sized,
    {
        let hot = |leased: &LeasedGcra<C>, at| leased.charge_at(at, cost);
        let cold = |now| self.keyed.charge_uncounted(key, now, cost);
        self.route_hot(word, judged, now, cost, hot, cold)
    }

    /// The routing of a decision that met the sealed `word`: `hot` on the slot's
    /// lease limiter at `judged`, or (while a promotion or demotion of the key is
    /// half-way) a wait and `cold`, the table's decision again at a fresh reading of
    /// the clock, until one answers. Counts the answer. `cost` is the decision's: a
    /// report (cost 0) writes nothing.
    #[inline(always)]
    fn route_hot<R>(
        &self,
        mut word: u64,
        mut judged: Nanos,
        mut now: Nanos,
        cost: u32,
        hot: impl Fn(&LeasedGcra<C>, Nanos) -> (Decision, R),
        cold: impl Fn(Nanos) -> (Decision, R),
    ) -> (Decision, R) {
        let backoff = Backoff::new();
        loop {
            let decided = self.on_entry(word, |entry| {
                let (decision, r) = hot(&entry.leased, judged);
                // A denial by a central word closed meanwhile (a demotion under way)
                // is no answer: route the check again. The word itself says so: the
                // entry's flag, cleared before the word is closed, may still read
                // open here (the word's reads are Relaxed and order nothing), and
                // the denial would reach the caller with a wait to the end of time.
                // Nor is a report (cost 0, nothing written) the closed word gave: its
                // reset is the end of time. An admission of a positive cost met a
                // closed word only on this thread's lease (a refill it denies), and
                // its units are spent: it is the answer.
                let closed = entry.leased.is_central_closed();
                let answer = (decision.is_allowed() && (cost > 0 || !closed))
                    || (entry.is_open() && !closed);
                answer.then_some((decision, r))
            });
            if let Some((decision, r)) = decided {
                self.keyed.count(decision.is_allowed());
                return (decision, r);
            }
            wait(&backoff);
            now = self.reading_after_wait(now);
            let (decision, r) = cold(now);
            match sealed_in(&decision, now) {
                None => {
                    self.keyed.count(decision.is_allowed());
                    return (decision, r);
                }
                Some(again) => (word, judged) = again,
            }
        }
    }

    /// Decides `cost` units for `key` now, as [`check_n`](Self::check_n), with the
    /// receipt a [`refund`](Self::refund) needs.
    ///
    /// A cold key's receipt is the keyed table's ([`KeyedLimiter::charge`]); a hot
    /// key's is its lease limiter's ([`LeasedGcra::charge`]: it holds a charge when
    /// the units came from the calling thread's shard lease).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{HotKeys, HotKeyLimiter, KeyedBuilder, ManualClock, Policy};
    /// let limiter = HotKeyLimiter::<u64, _>::new(
    ///     Policy::per_second(1)?.with_burst(10)?,
    ///     KeyedBuilder::default().clock(ManualClock::new()),
    ///     HotKeys::default().lease_size(4).manual(),
    /// )?;
    /// let (_, cold) = limiter.charge(&1, 1);
    /// assert!(limiter.refund(&1, cold)); // exact, as the keyed table's
    /// assert!(limiter.promote(&1));
    /// let (_, hot) = limiter.charge(&1, 1); // leases 4, spends 1
    /// assert!(limiter.refund(&1, hot)); // back on this thread's lease
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charge<Q>(&self, key: &Q, cost: u32) -> (Decision, Receipt)
    where
        Q: Lookup<K> + ?Sized,
    {
        let now = self.keyed.clock().now();
        let (decision, receipt) = self.keyed.charge_uncounted(key, now, cost);
        match sealed_in(&decision, now) {
            None => {
                self.keyed.count(decision.is_allowed());
                self.sample(key, now);
                (decision, receipt)
            }
            Some((word, judged)) => self.charge_hot(word, judged, key, now, cost),
        }
    }

    /// Gives back what the charge behind `receipt` still provably holds for `key`;
    /// returns whether anything came back.
    ///
    /// * A receipt of a cold charge: the keyed table's refund
    ///   ([`KeyedLimiter::refund`], with its refund ledger) while the key is cold;
    ///   nothing while it is hot (its schedule is the lease limiter's). After a
    ///   demotion the schedule, the charge's booking in it, is the table's again,
    ///   and so is the refund: the part of the booking still ahead of the clock.
    /// * A receipt of a hot charge: [`LeasedGcra::refund`] on the key's lease
    ///   limiter — back to the lease the units were spent from, on the calling
    ///   thread's shard, while that lease is unexpired, never above the lease size;
    ///   else (another thread, an expired or replaced lease) the part of the
    ///   charge's booking still ahead of the clock back to the central word —
    ///   while the key is still hot under the same promotion. Nothing after a
    ///   demotion (its schedule, every leased unit in it, went back to the table)
    ///   or a later promotion (a new lease limiter), or for another key. A refund a demotion overtakes — it found the key hot,
    ///   and its units reach the lease after the demotion closed the lease
    ///   limiter's central word, which counted them spent — takes them back off
    ///   the lease (no check spends them) and answers `false`. `true` means the
    ///   units reached the lease while the key was hot (a later demotion counts
    ///   them spent, as it does every unit out on lease).
    ///
    /// A refunded hot charge is not an admission, and the hot key's bound holds
    /// with "units out on lease" counting refundable charges (see
    /// [`LeasedGcra::refund`], "The bound with refunds").
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{HotKeys, HotKeyLimiter, KeyedBuilder, ManualClock, Policy};
    /// let limiter = HotKeyLimiter::<u64, _>::new(
    ///     Policy::per_second(1)?.with_burst(10)?,
    ///     KeyedBuilder::default().clock(ManualClock::new()),
    ///     HotKeys::default().lease_size(4).manual(),
    /// )?;
    /// assert!(limiter.promote(&1));
    /// let (_, hot) = limiter.charge(&1, 1);
    /// assert!(limiter.demote(&1));
    /// assert!(!limiter.refund(&1, hot)); // the lease's units went back in the schedule
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund<Q>(&self, key: &Q, receipt: Receipt) -> bool
    where
        Q: Lookup<K> + ?Sized,
    {
        if self.keyed.issued(&receipt) {
            return self.keyed.refund(key, receipt);
        }
        let now = self.keyed.clock().now();
        let Some((word, judged)) = sealed_in(
            &self.keyed.peek_with(self.keyed.algorithm(), key, now, 0),
            now,
        ) else {
            return false;
        };
        self.on_entry(word, |entry| Some(entry.refund(judged, receipt)))
            .unwrap_or(false)
    }

    /// What a check of `cost` would decide now, writing nothing; for a hot key, this
    /// thread's lease and the key's central word ([`LeasedGcra::peek`]: allowed
    /// as the check would be; an allowed `remaining` what the check would leave this
    /// thread: its lease units less the cost plus what the central word keeps after
    /// the part of the cost the lease does not cover — a refill's view, where a lease
    /// spend reports only its lease's units left). [`AsyncLimit::peek_n`] answers this.
    ///
    /// [`AsyncLimit::peek_n`]: crate::AsyncLimit::peek_n
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{HotKeys, HotKeyLimiter, KeyedBuilder, Policy};
    /// let limiter = HotKeyLimiter::<u64>::new(Policy::per_second(3)?, KeyedBuilder::default(), HotKeys::default())?;
    /// assert_eq!(limiter.peek(&1, 1), limiter.check(&1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek<Q>(&self, key: &Q, cost: u32) -> Decision
    where
        Q: Lookup<K> + ?Sized,
    {
        self.read_routed(key, cost, |leased, judged| leased.peek_at(judged, cost))
    }

    /// What `key` shows a client now, writing nothing: a cold key's state (its
    /// `peek(key, 0)`), a hot key's [`LeasedGcra::report`] — this thread's lease
    /// units plus the key's central word, with the central word's reset — where a
    /// lease spend reports only its lease's units and lifetime. floodgate-http shows
    /// it for a hot-key rule's admissions.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{HotKeys, HotKeyLimiter, KeyedBuilder, ManualClock, Policy};
    /// let limiter = HotKeyLimiter::<u64, _>::new(
    ///     Policy::per_second(1)?.with_burst(10)?,
    ///     KeyedBuilder::default().clock(ManualClock::new()),
    ///     HotKeys::default().lease_size(4).manual(),
    /// )?;
    /// assert!(limiter.promote(&1));
    /// assert!(limiter.check(&1).is_allowed()); // leases 4, spends 1
    /// assert_eq!(limiter.check(&1).remaining(), 2); // a spend: the lease's units
    /// assert_eq!(limiter.report(&1).remaining(), 8); // 2 on the lease + 6
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn report<Q>(&self, key: &Q) -> Decision
    where
        Q: Lookup<K> + ?Sized,
    {
        self.read_routed(key, 0, |leased, judged| leased.report_at(judged))
    }

    /// A read of `key` that writes nothing: the table's `peek` at `cost` for a cold
    /// key, `hot` on its lease limiter at the judged instant for a hot one.
    fn read_routed<Q>(
        &self,
        key: &Q,
        cost: u32,
        hot: impl Fn(&LeasedGcra<C>, Nanos) -> Decision,
    ) -> Decision
    where
        Q: Lookup<K> + ?Sized,
    {
        let mut now = self.keyed.clock().now();
        let backoff = Backoff::new();
        loop {
            let decision = self.keyed.peek_with(self.keyed.algorithm(), key, now, cost);
            let Some((word, judged)) = sealed_in(&decision, now) else {
                return decision;
            };
            // As in `check_hot`: a read that met a central word a demotion closed
            // after the entry was seen open is no answer, allowed or not (it writes
            // nothing, and an allowed one would report the closed word's reset, the
            // end of time).
            if let Some(decision) = self.on_entry(word, |entry| {
                let decision = hot(&entry.leased, judged);
                (!entry.leased.is_central_closed()).then_some(decision)
            }) {
                return decision;
            }
            wait(&backoff);
            now = self.reading_after_wait(now);
        }
    }

    /// The reading a decision that waited out a promotion or demotion is decided at
    /// next: the clock read again (never before `before`, the reading it waited
    /// at). Only a wait pays for it. A decision at the reading taken before the
    /// wait would judge a schedule other threads moved meanwhile as if no time had
    /// passed: a denial's wait longer than the burst by the clock's movement, and
    /// a lease that expired during the wait spent once more.
    #[cold]
    fn reading_after_wait(&self, before: Nanos) -> Nanos {
        self.keyed.clock().now().max(before)
    }

    /// Runs `f` on the open entry `word` names; `None` when there is none open under
    /// that generation (a promotion or demotion under way) or `f` declines.
    #[allow(unsafe_code)]
    fn on_entry<R>(&self, word: u64, f: impl FnOnce(&HotEntry<K, C>) -> Option<R>) -> Option<R> {
        let (slot, _) = seal_parts(word);
        // Pinned until this returns, after `f` has run.
        let _guard = pin();
        // Acquire: pairs with the promotion's Release publication of the entry.
        let ptr = self.slots.get(slot)?.load(Ordering::Acquire);
        // SAFETY: a non-null slot pointer came from `Box::into_raw` in `promote`;
        // `demote` unpublishes it before retiring it through the epoch, and this
        // thread pinned before loading it, so the entry is not freed while `_guard`
        // lives (the limiter's `Drop` frees the rest with `&mut self`: no reader).
        let entry = unsafe { ptr.as_ref() }?;
        if seal_word(slot, entry.generation) == word && entry.is_open() {
            f(entry)
        } else {
            None
        }
    }

    /// Samples a cold check for detection (see the [module docs](self)).
    #[inline]
    fn sample<Q>(&self, key: &Q, now: Nanos)
    where
        Q: Lookup<K> + ?Sized,
    {
        let Some(detect) = self.hot.detect else {
            return;
        };
        if !sampled(detect.sample_every) {
            return;
        }
        self.sample_slow(key, now, detect);
    }

    #[cold]
    fn sample_slow<Q>(&self, key: &Q, now: Nanos, detect: Detect)
    where
        Q: Lookup<K> + ?Sized,
    {
        let Some(mut admin) = try_lock(&self.admin) else {
            return;
        };
        let hash = self.hasher.hash_one(key);
        if admin.record(hash, thread_index(), now.as_u64(), detect) {
            self.promote_locked(&mut admin, key, now);
        }
    }

    /// Makes `key` hot now, if it is not already and a slot is free or held by an
    /// idle key (which is demoted first); returns whether `key` is hot.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{HotKeys, HotKeyLimiter, KeyedBuilder, ManualClock, Policy};
    /// let limiter = HotKeyLimiter::<u64, _>::new(
    ///     Policy::per_second(100)?,
    ///     KeyedBuilder::default().clock(ManualClock::new()),
    ///     HotKeys::default().slots(1),
    /// )?;
    /// assert!(limiter.promote(&1));
    /// let _ = limiter.check(&1); // units out on lease: key 1 is not idle
    /// assert!(!limiter.promote(&2)); // the one slot is busy
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn promote<Q>(&self, key: &Q) -> bool
    where
        Q: Lookup<K> + ?Sized,
    {
        let mut admin = lock(&self.admin);
        self.promote_locked(&mut admin, key, self.keyed.clock().now())
    }

    #[allow(unsafe_code)]
    fn promote_locked<Q>(&self, admin: &mut Admin, key: &Q, now: Nanos) -> bool
    where
        Q: Lookup<K> + ?Sized,
    {
        if self.sealed_word(key, now).is_some() {
            return true;
        }
        let Some(slot) = self.free_slot(admin, now) else {
            return false;
        };
        let Ok(leased) = self
            .hot
            .lease(self.gcra.policy())
            .build_with_clock(self.keyed.clock().clone())
        else {
            return false; // checked at build: the same settings cannot fail now
        };
        admin.generation += 1;
        let word = seal_word(slot, admin.generation);
        let entry = Box::into_raw(Box::new(HotEntry {
            key: key.to_key(),
            generation: admin.generation,
            leased,
            open: AtomicU64::new(0),
        }));
        // Release: a check that finds the pointer sees the entry's fields.
        self.slots[slot].store(entry, Ordering::Release);
        let sealer = HotGcra::new(self.gcra, Mode::Seal(word));
        let step = self.keyed.decide_uncounted(&sealer, key, now, 0);
        let schedule = step.reset_after_nanos();
        if !step.is_allowed() || self.sealed_word(key, now) != Some(word) {
            // The table refused the key (full, and nothing to evict): stay cold.
            self.slots[slot].store(core::ptr::null_mut(), Ordering::Release);
            let guard = pin();
            // SAFETY: `entry` came from `Box::into_raw` above and is unpublished; only
            // threads pinned now can still hold it, and the epoch frees it after them.
            unsafe { retire(&guard, entry) };
            return false;
        }
        // SAFETY: published above; only this thread (holding the admin lock) retires.
        let entry = unsafe { &*entry };
        entry
            .leased
            .open_central(GcraState::from_tat(Nanos::new(schedule)));
        // Release: a check that sees the entry open sees its central word.
        entry.open.store(1, Ordering::Release);
        admin.promotions += 1;
        true
    }

    /// A free slot, or one whose key is idle (demoted to free it).
    #[allow(unsafe_code)]
    fn free_slot(&self, admin: &mut Admin, now: Nanos) -> Option<usize> {
        if let Some(free) = self
            .slots
            .iter()
            .position(|s| s.load(Ordering::Acquire).is_null())
        {
            return Some(free);
        }
        let idle = self.slots.iter().position(|s| {
            // SAFETY: non-null slots hold live entries; only the admin lock's holder
            // (this thread) retires them.
            unsafe { s.load(Ordering::Acquire).as_ref() }.is_some_and(|e| e.leased.is_idle(now))
        })?;
        self.demote_slot(admin, idle, now);
        Some(idle)
    }

    /// The sealed word `key` holds, if it is hot.
    fn sealed_word<Q>(&self, key: &Q, now: Nanos) -> Option<u64>
    where
        Q: Lookup<K> + ?Sized,
    {
        sealed_in(
            &self.keyed.peek_with(self.keyed.algorithm(), key, now, 0),
            now,
        )
        .map(|(w, _)| w)
    }

    /// Makes `key` cold again: its schedule (every unit ever leased included) goes
    /// back to the table. Returns whether it was hot.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{HotKeys, HotKeyLimiter, KeyedBuilder, ManualClock, Policy};
    /// let limiter = HotKeyLimiter::<u64, _>::new(
    ///     Policy::per_second(1)?.with_burst(10)?,
    ///     KeyedBuilder::default().clock(ManualClock::new()),
    ///     HotKeys::default().lease_size(4),
    /// )?;
    /// assert!(limiter.promote(&1));
    /// assert!(limiter.check(&1).is_allowed()); // leases 4 units, spends 1
    /// assert!(limiter.demote(&1));
    /// assert!(!limiter.demote(&1));
    /// assert_eq!(limiter.peek(&1, 0).remaining(), 6); // the 3 unspent count as spent
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn demote<Q>(&self, key: &Q) -> bool
    where
        Q: Lookup<K> + ?Sized,
    {
        let mut admin = lock(&self.admin);
        self.demote_locked(&mut admin, key)
    }

    #[allow(unsafe_code)]
    fn demote_locked<Q>(&self, admin: &mut Admin, key: &Q) -> bool
    where
        Q: Lookup<K> + ?Sized,
    {
        let now = self.keyed.clock().now();
        let Some(word) = self.sealed_word(key, now) else {
            return false;
        };
        let (slot, _) = seal_parts(word);
        // SAFETY: as in `free_slot`.
        let ours = unsafe { self.slots[slot].load(Ordering::Acquire).as_ref() }
            .is_some_and(|e| seal_word(slot, e.generation) == word);
        if ours {
            self.demote_slot(admin, slot, now);
        }
        ours
    }

    /// Demotes the key in `slot` (occupied).
    #[allow(unsafe_code)]
    fn demote_slot(&self, admin: &mut Admin, slot: usize, now: Nanos) {
        let ptr = self.slots[slot].load(Ordering::Acquire);
        // SAFETY: as in `free_slot`.
        let Some(entry) = (unsafe { ptr.as_ref() }) else {
            return;
        };
        entry.open.store(0, Ordering::Release);
        let schedule = entry.leased.close_central().tat().as_u64();
        let word = seal_word(slot, entry.generation);
        let unsealer = HotGcra::new(
            self.gcra,
            Mode::Unseal {
                word,
                tat: schedule,
            },
        );
        let _ = self.keyed.decide_uncounted(&unsealer, &entry.key, now, 0);
        self.slots[slot].store(core::ptr::null_mut(), Ordering::Release);
        let guard = pin();
        // SAFETY: `ptr` came from `Box::into_raw` in `promote_locked`, is now
        // unpublished, and is retired once (the admin lock serialises demotions).
        unsafe { retire(&guard, ptr) };
        admin.demotions += 1;
    }

    /// Whether `key` is hot now.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{HotKeys, HotKeyLimiter, KeyedBuilder, Policy};
    /// let limiter = HotKeyLimiter::<u64>::new(Policy::per_second(100)?, KeyedBuilder::default(), HotKeys::default())?;
    /// assert!(!limiter.is_hot(&1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_hot<Q>(&self, key: &Q) -> bool
    where
        Q: Lookup<K> + ?Sized,
    {
        self.sealed_word(key, self.keyed.clock().now()).is_some()
    }

    /// Deletes `key` (demoting it first if hot) and returns whether it had an entry:
    /// [`KeyedLimiter::remove`].
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{HotKeys, HotKeyLimiter, KeyedBuilder, Policy};
    /// let limiter = HotKeyLimiter::<u64>::new(Policy::per_second(1)?, KeyedBuilder::default(), HotKeys::default())?;
    /// assert!(limiter.check(&1).is_allowed());
    /// assert!(limiter.remove(&1));
    /// assert!(limiter.check(&1).is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn remove<Q>(&self, key: &Q) -> bool
    where
        Q: Lookup<K> + ?Sized,
    {
        let mut admin = lock(&self.admin);
        self.demote_locked(&mut admin, key);
        self.keyed.remove(key)
    }

    /// The table's counters (every decision, hot or cold, counted once).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{HotKeys, HotKeyLimiter, KeyedBuilder, Policy};
    /// let limiter = HotKeyLimiter::<u64>::new(Policy::per_hour(1)?, KeyedBuilder::default(), HotKeys::default())?;
    /// let _ = (limiter.check(&1), limiter.check(&1));
    /// let m = limiter.metrics();
    /// assert_eq!((m.allowed, m.denied, m.live_keys), (1, 1, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn metrics(&self) -> KeyedMetrics {
        self.keyed.metrics()
    }

    /// Hot keys now, promotions and demotions so far.
    pub fn hot_metrics(&self) -> HotMetrics {
        let admin = lock(&self.admin);
        HotMetrics {
            hot_keys: self
                .slots
                .iter()
                .filter(|s| !s.load(Ordering::Acquire).is_null())
                .count() as u64,
            promotions: admin.promotions,
            demotions: admin.demotions,
        }
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        self.keyed.clock()
    }

    /// The policy every key runs (hot keys' central words included).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{HotKeys, HotKeyLimiter, KeyedBuilder, Policy};
    /// let policy = Policy::per_second(5)?;
    /// let limiter = HotKeyLimiter::<u64>::new(policy, KeyedBuilder::default(), HotKeys::default())?;
    /// assert_eq!(limiter.policy(), policy);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn policy(&self) -> Policy {
        self.gcra.policy()
    }
}

impl<K, C, S> Drop for HotKeyLimiter<K, C, S>
where
    C: Clock,
    S: Storage<K, GcraState>,
{
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        for slot in self.slots.iter() {
            let ptr = slot.swap(core::ptr::null_mut(), Ordering::Acquire);
            if !ptr.is_null() {
                // SAFETY: a published entry from `Box::into_raw`, never retired (its
                // demotion would have unpublished it); `&mut self`: no reader is left.
                drop(unsafe { Box::from_raw(ptr) });
            }
        }
    }
}

impl<K, C, S> fmt::Debug for HotKeyLimiter<K, C, S>
where
    C: Clock + fmt::Debug,
    S: Storage<K, GcraState> + Default + fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HotKeyLimiter")
            .field("keyed", &self.keyed)
            .field("hot", &self.hot)
            .finish_non_exhaustive()
    }
}

/// Waits for a promotion or demotion step to end (under loom, a yield the model
/// checker sees).
fn wait(backoff: &Backoff) {
    #[cfg(not(loom))]
    backoff.snooze();
    #[cfg(loom)]
    {
        let _ = backoff;
        loom::thread::yield_now();
    }
}

/// The lock if it is free now (a poisoned lock is still taken: the admin state
/// holds no invariant a panic can break half-way).
fn try_lock<T>(mutex: &Mutex<T>) -> Option<crate::sync::MutexGuard<'_, T>> {
    match mutex.try_lock() {
        Ok(guard) => Some(guard),
        Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Whether this thread samples this check: one in `every` (a power of two).
#[cfg(not(loom))]
#[inline(always)]
fn sampled(every: u32) -> bool {
    std::thread_local! {
        static CHECKS: core::cell::Cell<u32> = const { core::cell::Cell::new(0) };
    }
    CHECKS.with(|checks| {
        let n = checks.get().wrapping_add(1);
        checks.set(n);
        n & (every - 1) == 0
    })
}

/// Under loom, detection never samples: the models promote by hand.
#[cfg(loom)]
fn sampled(_every: u32) -> bool {
    false
}

#[cfg(all(test, not(loom)))]
mod tests {
    //! The entries' memory: published, retired through the epoch, freed by `Drop`
    //! (Miri checks these runs for leaks of live entries and use after free).
    use super::*;
    use crate::clock::ManualClock;
    use crate::keyed::Inline;

    #[test]
    fn an_eviction_never_takes_a_word_sealed_after_it_was_ranked() {
        use crate::keyed::storage::{forgiven, judge, Take};
        let gcra = Gcra::new(Policy::per_second(1_000).unwrap().with_burst(50).unwrap());
        let table = HotGcra::new(gcra, Mode::Decide);
        let now = Nanos::from_secs(10);
        // Ranked cold, with one unit in use; sealed by a promotion before the take.
        let cold = gcra.decide(GcraState::default(), now, 1).1.unwrap();
        let ranked = forgiven(&table, cold, now);
        let sealed = GcraState::from_tat(Nanos::new(seal_word(3, 9)));
        let (how, write) = judge(&table, sealed, now, Take::Victim(ranked));
        assert!(!write, "a sealed word is the heaviest: kept");
        assert!(how == crate::keyed::storage::Retired::Kept);
        let (_, write) = judge(&table, cold, now, Take::Victim(ranked));
        assert!(write, "unchanged since ranked: taken");
    }

    fn limiter(slots: usize) -> HotKeyLimiter<u64, ManualClock, Inline> {
        HotKeyLimiter::new_in(
            Policy::per_second(1_000).unwrap().with_burst(50).unwrap(),
            KeyedBuilder::default()
                .capacity(64)
                .shards(1)
                .clock(ManualClock::starting_at(Nanos::from_secs(1))),
            HotKeys::default()
                .manual()
                .slots(slots)
                .lease_shards(2)
                .lease_size(3),
        )
        .unwrap()
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "crossbeam-epoch needs -Zmiri-permissive-provenance -Zmiri-tree-borrows -Zmiri-ignore-leaks; .ci/run runs these with --include-ignored"
    )]
    fn entries_are_freed_by_demotion_reuse_and_drop() {
        let limiter = limiter(2);
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..20u64 {
                    limiter.promote(&(i % 3));
                    limiter.demote(&((i + 1) % 3));
                }
            });
            for _ in 0..2 {
                s.spawn(|| {
                    for i in 0..60u64 {
                        let _ = limiter.check(&(i % 3));
                        let _ = limiter.peek(&(i % 3), 1);
                    }
                });
            }
        });
        let hot = limiter.hot_metrics();
        assert_eq!(hot.promotions - hot.demotions, hot.hot_keys);
        // Entries still published are freed when the limiter drops.
        assert!(limiter.promote(&7) || hot.hot_keys == 2);
    }

    /// A clock another thread moves, counting this limiter's reads of it.
    #[derive(Clone)]
    struct Watched {
        clock: ManualClock,
        reads: std::sync::Arc<std::sync::atomic::AtomicU64>,
    }

    impl Clock for Watched {
        fn now(&self) -> Nanos {
            let now = self.clock.now();
            // Counted after the reading: a thread that sees the count sees a
            // reading taken.
            self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            now
        }
    }

    /// Burst `burst` at 1/s, `lease` units a lease, a lease shard for every thread
    /// a test runs, the clock at 10 s.
    fn watched(burst: u64, lease: u32) -> (HotKeyLimiter<u64, Watched, Inline>, Watched) {
        let clock = Watched {
            clock: ManualClock::starting_at(Nanos::from_secs(10)),
            reads: Default::default(),
        };
        let limiter = HotKeyLimiter::new_in(
            Policy::per_second(1).unwrap().with_burst(burst).unwrap(),
            KeyedBuilder::default()
                .capacity(64)
                .shards(1)
                .clock(clock.clone()),
            HotKeys::default()
                .manual()
                .slots(1)
                .lease_shards(64)
                .lease_size(lease),
        )
        .unwrap();
        (limiter, clock)
    }

    /// The entry of the hot key 1 (slot 0), open or not.
    #[cfg(not(miri))]
    #[allow(unsafe_code)]
    fn entry_of<C: Clock + Clone + 'static>(
        limiter: &HotKeyLimiter<u64, C, Inline>,
    ) -> &HotEntry<u64, C> {
        let ptr = limiter.slots[0].load(Ordering::Acquire);
        // SAFETY: published by the test's promotion, and these tests never demote
        // it: it lives until the limiter drops, after the borrow ends.
        unsafe { ptr.as_ref() }.expect("key 1 is hot")
    }

    /// On another thread, `first`, then `check`, which meets key 1 half-way
    /// through a promotion (its entry published, not yet open); once that thread
    /// has read the clock for `check`, `meanwhile` runs here, then the entry
    /// opens. The check's decision.
    #[cfg(not(miri))]
    fn a_check_that_waits(
        limiter: &HotKeyLimiter<u64, Watched, Inline>,
        clock: &Watched,
        first: impl FnOnce() + Send,
        meanwhile: impl FnOnce(&HotEntry<u64, Watched>),
        check: impl FnOnce() -> Decision + Send,
    ) -> Decision {
        use std::sync::atomic::Ordering::SeqCst;
        let entry = entry_of(limiter);
        let (first_done, closed) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        std::thread::scope(|s| {
            let waiting = s.spawn(|| {
                first();
                first_done.wait();
                closed.wait();
                check()
            });
            first_done.wait();
            entry.open.store(0, Ordering::Release);
            let read = clock.reads.load(SeqCst);
            closed.wait();
            while clock.reads.load(SeqCst) == read {
                std::thread::yield_now();
            }
            meanwhile(entry);
            // The entry opens once the check has read the clock again, after
            // `meanwhile` (or, if it never reads it again, after a while): every
            // reading it can decide at then is `meanwhile`'s or later.
            let read = clock.reads.load(SeqCst);
            for _ in 0..100_000 {
                if clock.reads.load(SeqCst) != read {
                    break;
                }
                std::thread::yield_now();
            }
            entry.open.store(1, Ordering::Release);
            waiting.join().unwrap()
        })
    }

    /// A check (or a peek) that waited out a promotion decides at a reading taken
    /// after the wait: others' admissions at the clock's new time leave it a wait
    /// within the burst (2 s), not the burst plus the 10 s the clock moved (11 s,
    /// decided at the reading it took first).
    // Not under Miri: the waiting thread's clock readings are Relaxed loads of the
    // `ManualClock`, which Miri's weak-memory emulation may answer with the value
    // before another thread's advance when no happens-before orders them (a real
    // clock has no such staleness); the test would then fail at random.
    #[cfg(not(miri))]
    #[test]
    fn a_check_that_waited_decides_at_a_fresh_reading() {
        type Hot = HotKeyLimiter<u64, Watched, Inline>;
        let check: fn(&Hot) -> Decision = |limiter| limiter.check(&1);
        let peek: fn(&Hot) -> Decision = |limiter| limiter.peek(&1, 1);
        for (name, decide) in [("check", check), ("peek", peek)] {
            let (limiter, clock) = watched(2, 1);
            assert!(limiter.promote(&1));
            let d = a_check_that_waits(
                &limiter,
                &clock,
                || (),
                |entry| {
                    let later = clock.clock.advance(Duration::from_secs(10));
                    // Another thread's admissions, at the clock's new time: the burst.
                    assert!(entry.leased.check_n_at(later, 2).is_allowed());
                },
                || decide(&limiter),
            );
            assert!(!d.is_allowed(), "{name}: the burst is spent: {d:?}");
            let wait = d.retry_after().unwrap();
            assert!(
                wait <= Duration::from_secs(2),
                "{name}: a wait past the burst: {d:?}"
            );
        }
    }

    /// A check that waited out a promotion spends its lease only if the lease is
    /// unexpired at the reading it decides at, taken after the wait: a lease that
    /// expired during the wait (1 ms lifetime, the clock moved 10 ms) is not spent.
    // Not under Miri: the waiting thread's clock readings are Relaxed loads of the
    // `ManualClock`, which Miri's weak-memory emulation may answer with the value
    // before another thread's advance when no happens-before orders them (a real
    // clock has no such staleness); the test would then fail at random.
    #[cfg(not(miri))]
    #[test]
    fn a_check_that_waited_spends_no_lease_that_expired_meanwhile() {
        let (limiter, clock) = watched(3, 3);
        assert!(limiter.promote(&1));
        let d = a_check_that_waits(
            &limiter,
            &clock,
            // The thread's first check leases the whole burst: 2 units left on its
            // lease, none in the central word.
            || assert!(limiter.check(&1).is_allowed()),
            |_| {
                clock.clock.advance(Duration::from_millis(10));
            },
            || limiter.check(&1),
        );
        assert!(!d.is_allowed(), "an expired lease spent: {d:?}");
    }

    /// A refund that looked at the hot key before a demotion and stores its units
    /// on the lease after it: the key's schedule, every leased unit counted as
    /// spent, is the table's now, so the refund takes its units back off the lease
    /// and reports `false`; before the demotion, the same refund reports `true`.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "crossbeam-epoch needs -Zmiri-permissive-provenance -Zmiri-tree-borrows -Zmiri-ignore-leaks; .ci/run runs these with --include-ignored"
    )]
    fn a_refund_landing_after_a_demotion_reports_false() {
        let (limiter, clock) = watched(10, 4);
        for demoted in [false, true] {
            assert!(limiter.promote(&1));
            let (d, receipt) = limiter.charge(&1, 1);
            assert!(d.is_allowed() && receipt.is_charged(), "{d:?}");
            let now = clock.now();
            let word = limiter.sealed_word(&1, now).unwrap();
            let given = limiter.on_entry(word, |entry| {
                if demoted {
                    assert!(limiter.demote(&1));
                }
                let given = entry.refund(now, receipt);
                if demoted {
                    assert!(!given, "a refund the demotion overtook answered true");
                    // Taken back: the lease holds its 3 units, not 4, so a check
                    // still on its way to the closed lease cannot spend the unit.
                    let d = entry.leased.check_n_at(now, 4);
                    assert!(!d.is_allowed(), "a refund answered false spent: {d:?}");
                }
                Some(given)
            });
            assert_eq!(given, Some(!demoted), "demoted: {demoted}");
        }
        // The lease's 4 units (the second charge, 3 left on the lease) are in the
        // table's schedule, as every unit leased is.
        assert_eq!(limiter.peek(&1, 0).remaining(), 6);
    }

    #[test]
    fn sealed_words_name_slot_and_generation() {
        for (slot, generation) in [(0, 1), (6, 1 << 40), (3, u64::MAX >> 4)] {
            let word = seal_word(slot, generation);
            assert_ne!(word & SEALED, 0);
            assert_eq!(seal_parts(word).0, slot);
            assert_ne!(seal_word(slot, generation), seal_word(slot, generation + 1));
        }
    }
}
