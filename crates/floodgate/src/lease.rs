//! A hot key that scales across cores: GCRA with per-shard leases.
//!
//! A plain [`RateLimiter`](crate::RateLimiter) writes one word on every admission;
//! when every core decides on the same key, that word's cache line moves between cores
//! on every decision and throughput cannot pass one line transfer per decision.
//! [`LeasedGcra`] keeps the same central GCRA word but lets each shard (by default one
//! per core, see [`LeaseBuilder::shards`]) take a small batch of units from it with
//! one CAS — a **lease** — and spend them on its own padded word. Unspent units
//! **expire** after a short lifetime; a shard that goes back to the central word first
//! counts its own unexpired units, so none is lost.
//!
//! # Owned shards
//!
//! Each shard has one writer: the live thread whose **owner index** is that shard's
//! number. Indices are small and recycled: no two live threads hold the same one, a
//! thread's exit frees its index, and the next thread to decide takes the lowest free
//! one. So a spend is a plain load and store on a word no other thread writes, with
//! no atomic read-modify-write. A thread whose index is not below the shard count (more
//! threads deciding at once than shards) owns no shard: it decides on the central word
//! alone, an exact GCRA decision. Size `shards` to the threads that decide — the
//! default, one per core, fits a runtime with one worker per core. A thread keeps its
//! index until it exits, so one that decided only once (a start-up check on the main
//! thread) still holds a shard: count it, or make that check from a thread that
//! exits. Only decisions on leased limiters (this type, or a hot key of a
//! [`HotKeyLimiter`](crate::HotKeyLimiter)) and [`owns_shard`](LeasedGcra::owns_shard)
//! take an index: a thread that decides on keyed limiters alone holds none.
//! [`check_on`](LeasedGcra::check_on) decides on any shard, given `&mut self`.
//!
//! # The bound (the one mode exempt from exact admission)
//!
//! Every admitted unit was taken from the central word no later than it was admitted,
//! at a clock reading no later than its admission's: a lease remembers when it was
//! taken (its expiry less the lifetime), and a decision whose reading is older — a
//! thread that read the clock, then took over the owner index of a thread that has
//! leased since — spends nothing from it (to the lease's 65.5 µs tick). A reading
//! no lease can be dated at — before the limiter was built (its origin: for a hot
//! key, its promotion), or so late that a lease's expiry would pass the 44-bit tick
//! field (36 years on) — decides on the central word alone, exactly. The central
//! word is an exact GCRA (capacity B, emission interval T). Hence, over any interval
//! `[a, b]` of readings:
//!
//! ```text
//! admitted in [a, b]  ≤  B + ⌊(b − a) / T⌋  +  units out on lease at a
//! ```
//!
//! and the units out on lease are at most `shards × lease size` (a shard has one
//! writer, and a refill leaves it fewer units than one lease). A refill admits from
//! the central word whatever it can give (at least the cost, at most the lease
//! size), so a request is denied only when this shard's lease and the central word
//! together hold fewer units than it costs: it **under-admits** (against a plain
//! GCRA fed the same admissions) by at most the units stranded in
//! other shards' leases, and a stranded unit stays stranded for at most one lease
//! lifetime (then it expires; its charge drains from the central word at the rate T,
//! like any admission's).
//!
//! # What a decision reports
//!
//! `limit` is the burst B. `remaining` is, on a lease spend, the units left in this
//! shard's lease (a lower bound on what could be admitted now: other shards and the
//! central word may hold more); on a refill or a denial, this shard's lease units plus
//! the central word's remaining. `reset_after` on a lease spend is the lease's remaining
//! lifetime; otherwise the central word's. `retry_after` on a denial is the central
//! word's wait for the **whole cost**, not just for the units this shard is short of:
//! this shard's lease may expire first, and the retry may be decided on another
//! shard holding fewer units (another thread, or no shard at all). After that wait
//! the central word alone holds the cost, so absent other traffic a retry admits on
//! any shard. (It can overstate the wait for a retry on this shard while its lease
//! lives: a conservative promise.) `check(0)` reports the central word
//! and writes nothing; [`report`](LeasedGcra::report) is a refill's view at cost 0
//! (this shard's lease units plus the central word's remaining, the central word's
//! reset), what floodgate-http shows a client.
//!
//! # Receipts and refunds
//!
//! [`charge`](LeasedGcra::charge) decides as [`check_n`](LeasedGcra::check_n) does and
//! hands back a receipt; [`refund`](LeasedGcra::refund) gives its units back to the
//! lease they were spent from — on the calling thread's shard, while that lease is
//! unexpired, never above the lease size (what the lease has no room for goes to
//! the central word) — or else, on any thread (a task that moved
//! threads between its charge and a later rule's denial), to the central word: the
//! part of the refill's booking the clock has not yet reached, as a plain GCRA
//! refund gives back, nothing once the clock has passed it or while the central
//! word is closed. A refunded charge is not an admission, and the bound above holds
//! with a charge still refundable counted as out on lease (see
//! [`refund`](LeasedGcra::refund) for both ways back). A charge the central word
//! decided alone holds nothing to give back.
//!
//! # Clocks
//!
//! Refills read the limiter's clock (`C`, by default the TSC) for the central GCRA
//! word. Lease expiry reads an **expiry clock**: [`Expiry::Fresh`] is the same clock
//! (one TSC read per decision), [`Expiry::Coarse`] is a [`CoarseClock`], a
//! process-wide word the crate's own upkeep thread refreshes every [`COARSE_TICK`]: a
//! decision spending a valid lease then reads no TSC at all. Its staleness is at most
//! one tick plus however long the upkeep thread waits for a core; a stale expiry
//! clock only lets a lease live that much longer (it never changes the admission
//! bound, which holds whatever the lifetime). The expiry clock counts from an origin
//! of its own, and the two clocks may disagree either way about how much time has
//! passed. Should it ever step back, a lease it had seen expire can be spent again:
//! the bound then holds with every unit the shards hold (expired or not) counted as
//! out on lease at `a` — still at most `shards × lease size` — and, with receipts,
//! every charge whose receipt is outstanding at `a` (it may go back to a lease
//! the clock had seen expire: see [`refund`](LeasedGcra::refund)).
//!
//! "Out on lease at `a`" is read at an instant when no decision is in flight. With
//! the coarse clock, a thread that has not yet seen the upkeep thread's newest tick
//! may still spend a lease that tick has expired: such a lease counts as out on
//! lease at `a` (read the bound with every unit the shards hold and every receipt
//! outstanding, as for a clock that steps back — at most `shards × lease size`
//! when no receipt is outstanding); only the under-admission's
//! "one lease lifetime" stretches by the staleness above.
//! (Loom models: `tests/loom_lease_coarse.rs`.)
//!
//! # Memory ordering
//!
//! Both words publish nothing but themselves: every decision's access is `Relaxed`,
//! but for a refill's CAS on the central word, `Release`, and a refund's to the
//! central word, an `Acquire` load and an `AcqRel` CAS: a refund whose CAS lands
//! after a refill's then reads that refill's note of the central refund ledger as
//! past, as a cell's refund does (see [`refund`](LeasedGcra::refund), "Back to the
//! central word"; free on x86, where every locked CAS is a full barrier). The central
//! word is updated through the crate's one CAS loop (a failed CAS hands back the
//! current value); a shard word by its one writer's plain store. Units move central →
//! lease by a CAS on the central word followed by a store to the shard word; between
//! the two they are held by the refilling thread. When an index passes from an exited
//! thread to a new one, the registry's mutex orders the old owner's last store before
//! the new owner's first load.
//!
//! # Examples
//!
//! ```
//! use floodgate::{LeasedGcra, ManualClock, Policy};
//!
//! let policy = Policy::per_second(1_000)?.with_burst(100)?;
//! let mut leased = LeasedGcra::builder(policy)
//!     .shards(2)
//!     .lease_size(10)
//!     .build_with_clock(ManualClock::new())?;
//! let first = leased.check_on(0, 1); // takes a lease of 10 from the central word
//! assert!(first.is_allowed());
//! assert_eq!(leased.units_on_lease(), 9);
//! let second = leased.check_on(0, 1); // spends locally
//! assert_eq!(second.remaining(), 8);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use core::time::Duration;

use crossbeam_utils::CachePadded;

use crate::algorithm::Charged;
use crate::cell::{refund_word, update_word, update_word_ordered, SerialLedger, WholeGrowth};
use crate::clock::{Clock, DefaultClock, Nanos};
use crate::decision::Decision;
use crate::gcra::{Gcra, GcraState};
use crate::policy::Policy;
use crate::receipt::{Owner, Receipt};
use crate::sync::{owner_index, owner_index_if_taken, Atomic, AtomicU64, Ordering};
use crate::Algorithm;

/// The largest lease: the units field's width.
pub const MAX_LEASE: u32 = (1 << UNITS_BITS) - 1;
/// The most shards a limiter takes.
pub const MAX_SHARDS: usize = 1 << 12;
/// How often the coarse expiry clock is refreshed (its staleness bound when its upkeep
/// thread runs on time).
pub const COARSE_TICK: Duration = Duration::from_millis(1);
/// Expiry ticks are 2^16 ns (65.536 µs): 44 bits of them last 36 years.
const TICK_SHIFT: u32 = 16;
const UNITS_BITS: u32 = 20;
const UNITS_MASK: u64 = (1 << UNITS_BITS) - 1;
const EXPIRY_MAX: u64 = (1 << (64 - UNITS_BITS)) - 1;
const _: () = assert!(UNITS_BITS + (64 - UNITS_BITS) == 64);

/// One shard's lease: unspent units (low 20 bits) and the expiry tick (high 44 bits,
/// ticks of 2^16 ns since the limiter's origin). All zero: no lease.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
struct Lease(u64);

impl Lease {
    const fn new(units: u32, expires: u64) -> Lease {
        let expires = if expires > EXPIRY_MAX {
            EXPIRY_MAX
        } else {
            expires
        };
        Lease((expires << UNITS_BITS) | (units as u64 & UNITS_MASK))
    }

    const fn units(self) -> u32 {
        (self.0 & UNITS_MASK) as u32
    }

    const fn expires(self) -> u64 {
        self.0 >> UNITS_BITS
    }

    /// The units still spendable at `tick` (0 once expired).
    const fn valid_units(self, tick: u64) -> u32 {
        if tick < self.expires() {
            self.units()
        } else {
            0
        }
    }

    /// The units a decision at `tick` may spend: those of a lease that has not
    /// expired and was taken no later than `tick` (it expires `lifetime` ticks after
    /// it was taken). A reading older than the lease — a thread that read the clock,
    /// then took over the owner index of a thread that had leased since — spends
    /// nothing from it: every unit is admitted at a reading no earlier than the one
    /// it was taken from the central word at (to the tick).
    const fn spendable_units(self, tick: u64, lifetime: u64) -> u32 {
        if self.is_spendable(tick, lifetime) {
            self.units()
        } else {
            0
        }
    }

    /// Whether a decision at `tick` may spend from this lease (see
    /// [`spendable_units`](Self::spendable_units)), however many units it holds.
    const fn is_spendable(self, tick: u64, lifetime: u64) -> bool {
        // `expires − tick` in 1..=lifetime, in one comparison (wrapping).
        self.expires().wrapping_sub(tick).wrapping_sub(1) < lifetime
    }

    /// Spends `cost` at `tick`, if the lease is spendable then and holds that much.
    fn spend(self, tick: u64, lifetime: u64, cost: u32) -> Option<Lease> {
        let units = self.spendable_units(tick, lifetime);
        (units >= cost).then(|| Lease::new(units - cost, self.expires()))
    }
}

/// One shard: its lease word and, for the receipts of the charges spent from it,
/// where on the central schedule its units were booked. One writer (the thread
/// owning the shard's index, or a caller holding `&mut`); the lease word comes
/// first, so a spend addresses it as before (a spend touches no other field).
struct Shard {
    lease: Atomic<Lease>,
    /// The earliest end, on the central schedule, of a refill booking whose units
    /// the lease may hold (see [`LeasedGcra::refund`], "Back to the central word").
    booked: AtomicU64,
    /// The central refund ledger as the refill that made `booked`'s booking noted it
    /// (before its CAS), or an older note.
    noted: AtomicU64,
    /// The lease word a refill that spent units carried over from an earlier
    /// booking left (0: none, or a refund to the lease has since changed the
    /// lease's units): a charge that leaves this word is that refill's own, whose
    /// units span both bookings, and is judged against `spanned_booked`.
    spanned: AtomicU64,
    /// For the refill's own charge when it spent carried units: the earliest end of
    /// a booking among them and the new one.
    spanned_booked: AtomicU64,
    /// The ledger note that goes with `spanned_booked` (the older one).
    spanned_noted: AtomicU64,
}

impl Shard {
    fn new() -> Shard {
        Shard {
            lease: Atomic::new(Lease::default()),
            booked: AtomicU64::new(0),
            noted: AtomicU64::new(0),
            spanned: AtomicU64::new(0),
            spanned_booked: AtomicU64::new(0),
            spanned_noted: AtomicU64::new(0),
        }
    }
}

/// Which clock decides whether a lease has expired.
#[derive(Debug)]
pub enum Expiry {
    /// The limiter's own clock, read on every decision.
    Fresh,
    /// A [`CoarseClock`] (refreshed every [`COARSE_TICK`] by an upkeep thread): no
    /// TSC read while a lease is valid.
    Coarse(CoarseClock),
}

/// A coarse reading of time, in nanoseconds since the clock was made: the word
/// the crate's upkeep thread refreshes every [`COARSE_TICK`] (see [`new`](Self::new)).
#[cfg(not(loom))]
#[derive(Debug)]
pub struct CoarseClock {
    source: CoarseSource,
    origin: u64,
}

/// Where a [`CoarseClock`] reads.
#[cfg(not(loom))]
#[derive(Debug)]
enum CoarseSource {
    /// The upkeep thread's word ([`UPKEEP_NANOS`]).
    Upkeep,
    /// A quanta clock read on every reading (`now`), in nanoseconds since `anchor`.
    Clock {
        clock: quanta::Clock,
        anchor: quanta::Instant,
    },
}

/// The upkeep thread's word: nanoseconds since that thread started, as of its last
/// tick.
#[cfg(not(loom))]
static UPKEEP_NANOS: AtomicU64 = AtomicU64::new(0);

/// Starts the upkeep thread that refreshes [`UPKEEP_NANOS`] (once); whether it runs.
/// The thread is the crate's own, not quanta's `Upkeep`: quanta allows one of those
/// per process, and one that another library started first keeps quanta's recent
/// time at that library's interval, or stops keeping it.
#[cfg(not(loom))]
fn upkeep() -> bool {
    static STARTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let started = STARTED.get_or_init(|| {
        let clock = quanta::Clock::new();
        let start = clock.now();
        std::thread::Builder::new()
            .name("floodgate-coarse-clock".into())
            .spawn(move || loop {
                std::thread::sleep(COARSE_TICK);
                let since = clock.now().saturating_duration_since(start).as_nanos();
                // Relaxed: the word publishes nothing but itself.
                UPKEEP_NANOS.store(since as u64, Ordering::Relaxed);
            })
            .is_ok()
    });
    *started
}

#[cfg(not(loom))]
impl CoarseClock {
    /// Starts the process-wide upkeep thread (once; later calls share it) and anchors
    /// the clock at its latest tick. If the thread cannot be started, readings are
    /// quanta's fresh time (correct, just not coarse).
    ///
    /// # Examples
    ///
    /// ```
    /// let coarse = floodgate::lease::CoarseClock::new();
    /// let a = coarse.nanos();
    /// assert!(coarse.nanos() >= a);
    /// ```
    pub fn new() -> CoarseClock {
        if upkeep() {
            CoarseClock {
                source: CoarseSource::Upkeep,
                // Relaxed: the word publishes nothing but itself.
                origin: UPKEEP_NANOS.load(Ordering::Relaxed),
            }
        } else {
            CoarseClock::with_clock(quanta::Clock::new())
        }
    }

    /// A clock reading `clock` itself on every reading (its `now`), anchored at
    /// `clock.now()`. For tests: over [`quanta::Clock::mock`], a reading is the
    /// mock's value less its value here (0 below it), which the test moves by hand —
    /// stale, stalled, jumping ahead or stepping back — independently of the
    /// limiter's own clock. Over a real clock it reads the TSC (fresh, not coarse:
    /// what [`CoarseClock::new`] falls back to).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::lease::CoarseClock;
    ///
    /// let (clock, mock) = quanta::Clock::mock();
    /// mock.increment(5_000);
    /// let coarse = CoarseClock::with_clock(clock);
    /// assert_eq!(coarse.nanos(), 0);
    /// mock.increment(70_000);
    /// assert_eq!(coarse.nanos(), 70_000);
    /// mock.decrement(71_000);
    /// assert_eq!(coarse.nanos(), 0, "before its anchor");
    /// ```
    pub fn with_clock(clock: quanta::Clock) -> CoarseClock {
        let anchor = clock.now();
        CoarseClock {
            source: CoarseSource::Clock { clock, anchor },
            origin: 0,
        }
    }

    /// Nanoseconds since this clock was made, as of the last upkeep tick.
    #[inline]
    pub fn nanos(&self) -> u64 {
        match &self.source {
            // Relaxed: the word publishes nothing but itself.
            CoarseSource::Upkeep => UPKEEP_NANOS
                .load(Ordering::Relaxed)
                .saturating_sub(self.origin),
            CoarseSource::Clock { clock, anchor } => Self::clock_nanos(clock, *anchor),
        }
    }

    /// A reading of a clock given to [`with_clock`](Self::with_clock): out of line,
    /// so that the upkeep word's reading stays small enough for decisions to
    /// inline.
    #[cold]
    #[inline(never)]
    fn clock_nanos(clock: &quanta::Clock, anchor: quanta::Instant) -> u64 {
        clock.now().saturating_duration_since(anchor).as_nanos() as u64
    }
}

#[cfg(not(loom))]
impl Default for CoarseClock {
    fn default() -> Self {
        CoarseClock::new()
    }
}

/// Under loom: the upkeep word, one per clock (a loom atomic cannot outlive one model
/// execution, as a `static` would), which the model moves with
/// [`upkeep`](Self::upkeep) in place of the upkeep thread. Clones share the word. A
/// reading is the same `Relaxed` load as the upkeep word's, so loom lets threads
/// read older ticks than one another, as they may on hardware.
#[cfg(loom)]
#[derive(Clone, Debug)]
pub struct CoarseClock {
    word: std::sync::Arc<AtomicU64>,
}

#[cfg(loom)]
impl CoarseClock {
    /// A clock at 0 that moves only when the model calls [`upkeep`](Self::upkeep).
    pub fn new() -> CoarseClock {
        CoarseClock {
            word: std::sync::Arc::new(AtomicU64::new(0)),
        }
    }

    /// What the upkeep thread does on each tick: stores `nanos` as the reading.
    pub fn upkeep(&self, nanos: u64) {
        // Relaxed: the word publishes nothing but itself (as the upkeep thread's).
        self.word.store(nanos, Ordering::Relaxed);
    }

    /// The last reading stored (or an older one: see the type's docs).
    #[inline]
    pub fn nanos(&self) -> u64 {
        // Relaxed: the word publishes nothing but itself.
        self.word.load(Ordering::Relaxed)
    }
}

#[cfg(loom)]
impl Default for CoarseClock {
    fn default() -> Self {
        CoarseClock::new()
    }
}

/// A configuration the builder refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseError {
    /// `lease_size` must be in 1..=min(burst, [`MAX_LEASE`]).
    LeaseSize {
        /// The value given.
        size: u32,
        /// The largest allowed for this policy.
        max: u32,
    },
    /// `shards` must be in 1..=[`MAX_SHARDS`].
    Shards(usize),
    /// `lifetime` must be at least one expiry tick (65.536 µs) and at most a year.
    Lifetime(Duration),
}

impl core::fmt::Display for LeaseError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            LeaseError::LeaseSize { size, max } => {
                write!(
                    f,
                    "lease_size {size} is outside 1..={max} (the burst and {MAX_LEASE})"
                )
            }
            LeaseError::Shards(n) => write!(f, "shards {n} is outside 1..={MAX_SHARDS}"),
            LeaseError::Lifetime(d) => {
                write!(f, "lifetime {d:?} is outside 65.536µs..=1 year")
            }
        }
    }
}

impl std::error::Error for LeaseError {}

/// Builds a [`LeasedGcra`].
#[derive(Debug)]
#[must_use]
pub struct LeaseBuilder {
    policy: Policy,
    shards: usize,
    lease_size: Option<u32>,
    lifetime: Duration,
    max_tat: u64,
}

impl LeaseBuilder {
    /// The latest schedule the central word may reach: a decision that would take it
    /// further is refused as "never" (a hot key's word must stay below the sealed
    /// bit, as a cold key's does).
    pub(crate) fn max_tat(mut self, max_tat: u64) -> Self {
        self.max_tat = max_tat;
        self
    }

    /// Shards (rounded up to a power of two): by default the available parallelism.
    /// A thread owns the shard numbered by its owner index (see the
    /// [module docs](self)); threads beyond the count decide on the central word.
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards;
        self
    }

    /// Units per lease: by default burst ÷ (4 × shards), at least 1 and at most 1024.
    pub fn lease_size(mut self, units: u32) -> Self {
        self.lease_size = Some(units);
        self
    }

    /// How long unspent units stay spendable (default 1 ms).
    pub fn lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = lifetime;
        self
    }

    /// With the default TSC clock and [`Expiry::Fresh`].
    ///
    /// # Errors
    ///
    /// A [`LeaseError`] naming the bad setting.
    pub fn build(self) -> Result<LeasedGcra, LeaseError> {
        self.build_with_clock(DefaultClock::new())
    }

    /// With the default TSC clock for refills and [`Expiry::Coarse`] for expiry.
    ///
    /// # Errors
    ///
    /// A [`LeaseError`] naming the bad setting.
    #[cfg(not(loom))]
    pub fn build_coarse(self) -> Result<LeasedGcra, LeaseError> {
        self.build_with(DefaultClock::new(), Expiry::Coarse(CoarseClock::new()))
    }

    /// With `clock` for refills and expiry ([`Expiry::Fresh`]).
    ///
    /// # Errors
    ///
    /// A [`LeaseError`] naming the bad setting.
    pub fn build_with_clock<C: Clock>(self, clock: C) -> Result<LeasedGcra<C>, LeaseError> {
        self.build_with(clock, Expiry::Fresh)
    }

    /// With `clock` for refills and `expiry` for lease expiry.
    ///
    /// # Errors
    ///
    /// A [`LeaseError`] naming the bad setting.
    pub fn build_with<C: Clock>(
        self,
        clock: C,
        expiry: Expiry,
    ) -> Result<LeasedGcra<C>, LeaseError> {
        if self.shards == 0 || self.shards > MAX_SHARDS {
            return Err(LeaseError::Shards(self.shards));
        }
        let shards = self.shards.next_power_of_two();
        let max = u32::try_from(self.policy.burst())
            .unwrap_or(u32::MAX)
            .min(MAX_LEASE);
        let default = (self.policy.burst() / (4 * shards as u64)).clamp(1, 1024) as u32;
        let size = self.lease_size.unwrap_or(default.min(max));
        if size == 0 || size > max {
            return Err(LeaseError::LeaseSize { size, max });
        }
        let ticks = (self.lifetime.as_nanos() >> TICK_SHIFT) as u64;
        if ticks == 0 || self.lifetime > Duration::from_secs(366 * 86_400) {
            return Err(LeaseError::Lifetime(self.lifetime));
        }
        let mut limiter = LeasedGcra {
            gcra: Gcra::new(self.policy),
            central: CachePadded::new(Atomic::new(GcraState::default())),
            shards: (0..shards)
                .map(|_| CachePadded::new(Shard::new()))
                .collect(),
            central_refunds: SerialLedger::new(WholeGrowth),
            mask: shards - 1,
            lease_size: size,
            lifetime_ticks: ticks,
            dated_span: (EXPIRY_MAX - ticks + 1) << TICK_SHIFT,
            max_tat: self.max_tat,
            clock,
            expiry,
            origin: 0,
            owner: Owner::new(),
        };
        limiter.origin = limiter.expiry_nanos().1;
        Ok(limiter)
    }
}

/// GCRA on one hot key with per-shard leases (see the [module docs](self)).
pub struct LeasedGcra<C: Clock = DefaultClock> {
    gcra: Gcra,
    central: CachePadded<Atomic<GcraState>>,
    shards: Box<[CachePadded<Shard>]>,
    /// What refunds to the central word have given back (see
    /// [`refund`](LeasedGcra::refund), "Back to the central word"): its lock
    /// serialises them, and a refill notes it before its CAS. It keeps no record of
    /// the latest refunds: each takes the whole growth since its note
    /// ([`WholeGrowth`]).
    central_refunds: SerialLedger<WholeGrowth>,
    mask: usize,
    lease_size: u32,
    lifetime_ticks: u64,
    /// How far past the origin a reading can still date a lease: its tick at most
    /// `EXPIRY_MAX − lifetime_ticks`, so that the lease's expiry fits its field
    /// (see `lease_tick`).
    dated_span: u64,
    /// The latest TAT the central word may take ([`LeaseBuilder::max_tat`]).
    max_tat: u64,
    clock: C,
    expiry: Expiry,
    origin: u64,
    /// The id this limiter's receipts carry.
    owner: Owner,
}

impl LeasedGcra {
    /// A builder for `policy` (see [`LeaseBuilder`] for the defaults).
    pub fn builder(policy: Policy) -> LeaseBuilder {
        LeaseBuilder {
            policy,
            shards: std::thread::available_parallelism().map_or(1, |n| n.get()),
            lease_size: None,
            lifetime: Duration::from_millis(1),
            max_tat: u64::MAX,
        }
    }
}

impl<C: Clock> LeasedGcra<C> {
    /// Decides one unit on the calling thread's shard (see [`check_n`](Self::check_n)).
    #[inline]
    pub fn check(&self) -> Decision {
        self.check_n(1)
    }

    /// Decides `cost` units: on the calling thread's own shard when its owner index
    /// is below the shard count, else on the central word alone (an exact GCRA
    /// decision, no lease).
    #[inline]
    pub fn check_n(&self, cost: u32) -> Decision {
        let (now, nanos) = self.expiry_nanos();
        self.decide(now, nanos, cost)
    }

    /// Decides `cost` units on shard `shard` (taken modulo the shard count), whoever
    /// owns it: `&mut self` makes the caller the only writer. For simulations and
    /// tests that replay several shards' traffic on one thread.
    #[inline]
    pub fn check_on(&mut self, shard: usize, cost: u32) -> Decision {
        let (now, nanos) = self.expiry_nanos();
        self.decide_owned(&self.shards[shard & self.mask], now, nanos, cost)
    }

    /// [`check_n`](LeasedGcra::check_n) with a clock reading the caller has taken
    /// from this limiter's clock (the expiry clock still decides expiry when it is
    /// [`Expiry::Coarse`]).
    #[inline]
    pub(crate) fn check_n_at(&self, now: Nanos, cost: u32) -> Decision {
        self.decide(Some(now), self.expiry_nanos_at(now), cost)
    }

    /// Decides `cost` units as [`check_n`](Self::check_n) does, with the receipt a
    /// [`refund`](Self::refund) needs.
    ///
    /// The receipt holds a charge only when the units came from the calling
    /// thread's shard lease (a spend, or a refill). A
    /// decision on the central word alone — a thread that owns no shard, a reading
    /// no lease can be dated at — and a denial or cost 0 hold none: their refund
    /// gives nothing back.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{LeasedGcra, ManualClock, Policy};
    ///
    /// let leased = LeasedGcra::builder(Policy::per_second(1_000)?.with_burst(100)?)
    ///     .shards(4)
    ///     .lease_size(10)
    ///     .build_with_clock(ManualClock::new())?;
    /// let (decision, receipt) = leased.charge(3);
    /// assert!(decision.is_allowed() && receipt.is_charged());
    /// assert_eq!(leased.units_on_lease(), 7);
    /// assert!(leased.refund(receipt)); // back on this thread's lease
    /// assert_eq!(leased.units_on_lease(), 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn charge(&self, cost: u32) -> (Decision, Receipt) {
        let (now, nanos) = self.expiry_nanos();
        self.charge_on(now, nanos, cost)
    }

    /// [`charge`](Self::charge) with a clock reading the caller has taken from this
    /// limiter's clock (as [`check_n_at`](Self::check_n_at)).
    #[inline]
    pub(crate) fn charge_at(&self, now: Nanos, cost: u32) -> (Decision, Receipt) {
        self.charge_on(Some(now), self.expiry_nanos_at(now), cost)
    }

    /// A decision as `decide`'s, with its receipt: the lease the charge left in
    /// the calling thread's shard word (its only writer, so the words read after the
    /// decision are the ones the decision stored), and where that lease's units were
    /// booked on the central schedule.
    ///
    /// The receipt's key is 0 and its generation the shard's number; its charge's
    /// `before` is the shard's `booked` (the earliest end of a central booking whose
    /// units the lease may hold), `after` the lease word, and its ledger note the
    /// shard's `noted` (the central refund ledger as that booking's refill noted
    /// it) — or, for a refill's own charge that spent carried units (the lease word
    /// is the one that refill left, `spanned`), `spanned_booked` and
    /// `spanned_noted`: what [`refund`](Self::refund) needs on the shard's lease
    /// or, from any other thread, on the central word.
    fn charge_on(&self, now: Option<Nanos>, nanos: u64, cost: u32) -> (Decision, Receipt) {
        let index = owner_index();
        let Some(shard) = self.shards.get(index) else {
            let decision = self.decide_central(now, cost);
            return (decision, Receipt::new::<u64>(self.owner, 0, 0, None));
        };
        let decision = self.decide_owned(shard, now, nanos, cost);
        // A reading a lease can be dated at is decided on the lease (a spend or a
        // refill); any other on the central word alone (`refill`).
        let leased = self.lease_tick(nanos).is_some();
        let charge = (decision.is_allowed() && cost > 0 && leased).then(|| {
            let after = shard.lease.load(Ordering::Relaxed).0;
            // A refill that spent carried units: its own charge spans both bookings
            // (a later charge's units are all of the newer one).
            let (booked, noted) = if after == shard.spanned.load(Ordering::Relaxed) {
                (&shard.spanned_booked, &shard.spanned_noted)
            } else {
                (&shard.booked, &shard.noted)
            };
            let charge = Charged {
                before: booked.load(Ordering::Relaxed),
                after,
                at: Nanos::new(nanos),
                cost,
            };
            (charge, noted.load(Ordering::Relaxed))
        });
        (decision, Receipt::new(self.owner, 0, index as u64, charge))
    }

    /// Gives the units of the charge behind `receipt` back; returns whether anything
    /// came back.
    ///
    /// * **To the lease** they were spent from, when the calling thread owns the
    ///   charge's shard and that lease is still the shard's and spendable: never
    ///   above the lease size (a lease refill within the same 65.5 µs expiry tick
    ///   takes the same expiry, and a refund then lands on the new lease: still the
    ///   shard's own units, see below). The units a lease has no room for go to the
    ///   central word, as the refund of a charge of that many units of the same
    ///   booking (see "A full lease").
    /// * Otherwise **to the central word** — a thread that owns another shard or
    ///   none (a task that moved threads between its charge and a later rule's
    ///   denial), or the charging thread once that lease has expired or been
    ///   replaced, or is full — by the rule a plain GCRA refund follows
    ///   ([`Algorithm::refund`]): only the part of the
    ///   booking the clock has not reached comes back (see "Back to the central
    ///   word"). Nothing once the clock has passed it, nor while the central word is
    ///   closed (a hot key's demotion sealed it).
    ///
    /// Nothing comes back (`false`, conservative: never an admission beyond the
    /// bound) for a receipt of another limiter (a hot key's later promotion is a new
    /// limiter), or of a charge that took nothing or that the central word decided
    /// alone (a thread that owned no shard, a reading no lease can be dated at: it
    /// is in no lease). A receipt is consumed, so a charge comes back at most once.
    ///
    /// # The bound with refunds to the lease
    ///
    /// A refunded charge is not an admission. A unit given back is one this shard
    /// took from the central word and spent; it is spendable again only on this
    /// shard's unexpired lease, which never holds more than the lease size. So the
    /// module's bound holds with "units out on lease at `a`" counting, besides the
    /// units the shards hold, those of charges still refundable at `a` (made
    /// before `a` from a lease unexpired at `a`, receipt not yet settled): at an
    /// instant when no receipt is outstanding — a layer between requests — that is
    /// at most `shards × lease size`, as without refunds. Where the expiry clock
    /// may step back, or a thread may not yet have seen the coarse clock's newest
    /// tick (see the [module docs](self), "Clocks"), a receipt of a lease expired
    /// at `a` can still go back to it and be spent again: count every receipt
    /// outstanding at `a` (of a lease expired or not), as every unit the shards
    /// hold is counted there.
    ///
    /// # Back to the central word
    ///
    /// A unit spent from a lease and given back to the central word: the lease took
    /// it from the central word, spent it, and the central word gets it back — as if
    /// the refill had taken one unit fewer. That history is one the limiter could
    /// have run (the lease would have held one unit fewer, and every other spend
    /// still fits), and in it the bound holds as above; so it holds here as long as
    /// the central word after the refund is no more permissive than that history's.
    ///
    /// A refill at reading `r` booked `[s, e)` on the central schedule (`e − s` =
    /// the units taken × T). Taking `n` units fewer would have booked `[s, e − n·T)`:
    /// the schedules differ by `n·T` from then on, and that difference shrinks only
    /// where the smaller schedule fell idle — behind an admission's reading. Every
    /// later admission (and the refund itself: its reading is taken after it loads
    /// the central word, and is at least the caller's) reads at most `now`, and the
    /// real schedule stays at or past `e`, less what other central refunds have
    /// given back since the refill (at most `shift`, the ledger's growth since the
    /// refill noted it). So the difference at `now` is at least
    /// `min(n·T, (e − shift) − now)`: the refund gives back exactly that when it is
    /// positive — the plain GCRA refund of a charge whose booking was
    /// `[e − n·T, e)` — and nothing otherwise.
    ///
    /// For that the receipt carries `e` and the ledger's note, from the shard at the
    /// charge. The shard keeps, for its lease's units, the **earliest** end of a
    /// booking among those they came from and the **oldest** note:
    ///
    /// * A refill books `[s, e)` and its charge spends the lease's own spendable
    ///   units (fewer than its cost, or it would have been a spend) **first**, so
    ///   the units it leaves are all of its own booking: the shard takes `e` and
    ///   the refill's note, and a later charge from that lease is judged against
    ///   them, however many units the lease carried over. (The units are
    ///   fungible: which ones a charge "spent" is a choice, and this one makes a
    ///   refill that took `n` fewer a history that fits every later spend, since
    ///   the lease then held at least `n` of its units.)
    /// * The refill's own charge spent the carried units and some of the new
    ///   booking: it is judged against the earliest end among the carried units'
    ///   bookings and the new one, with the older note (the shard keeps these apart,
    ///   matched by the lease word the refill left, which no later charge leaves
    ///   unless a refund to the lease put units back; such a refund clears the
    ///   match). Conservative: with its whole cost against the new end it would
    ///   reach before `s`, into bookings another shard may have made in between.
    /// * A refund to the lease puts a receipt's units back, perhaps of an earlier
    ///   booking (a lease of the same expiry tick — which a refill at a reading
    ///   behind a later refill's, an owner's stale reading or a coarse clock's, may
    ///   have dated anew with a later booking): it lowers the shard's end and note
    ///   to its receipt's where those are earlier.
    ///
    /// Judged against an earlier end, and with a larger shift, a refund gives back
    /// no more than against the booking the units came from (conservative; exact
    /// when the lease's units are all of one booking).
    /// Refunds to the central word are serialised by the ledger's lock and written
    /// with an `AcqRel` CAS; a refill's note is read before its `Release` CAS, so
    /// a refund that moved a booking is never in the booking's note.
    ///
    /// The "history the limiter could have run" above is the argument for giving
    /// back *only* the part still ahead; the bound itself rests on less. `e` is
    /// the central word's TAT after a refill's CAS, and from then on the TAT is at
    /// least `e − shift` (admissions only raise it; every central refund that
    /// lowered it since is in the shift). A central refund gives back at most its
    /// charge's cost, and never lowers the TAT below its reading: its
    /// `(e − shift) − now` is at most the TAT's lead over `now` less what central
    /// refunds gave back since — so the central refunds after `a` of charges made
    /// before `a` give back, together, at most the central word's deficit at `a`
    /// (`TAT − a`, the units it is short of the burst), and the central word hands
    /// out at most `B + ⌊(b − a)/T⌋` in `[a, b]` plus the costs of the charges
    /// made in `[a, b]` and refunded to it (which are not admissions). That holds
    /// for any `e` and note taken from a refill's CAS and before it, which is why a
    /// booking judged too late (the stale-reading case above, before the lease
    /// refund lowered the shard's words) gave back units of a passed booking but
    /// no admission beyond the bound.
    ///
    /// # A full lease
    ///
    /// A charge of `n` units refunded to a lease with room for `k < n` puts `k` on
    /// the lease and gives the other `n − k` to the central word, judged against
    /// the same booking end `e` and ledger note as the whole charge would be, with
    /// the span `(n − k)·T`: the booking `[e − (n − k)·T, e)`, its **last**
    /// `n − k` units. That is the refund of a charge of `n − k` units spent from the
    /// same lease (every charge from a lease carries the shard's `e` and note,
    /// whatever its cost), so it gives back no more than one, by the arguments
    /// above; the `k` on the lease are a refund of a charge of `k` to a lease with
    /// room for them. Together they are the two refunds of a charge of `n` split in
    /// two, which the central word cannot tell from a charge of `k` and one of
    /// `n − k`. Why the last units and not `[e − n·T, e − k·T)`: the units kept on
    /// the lease stay booked on the central schedule, so from the central word's
    /// side the history is the refill taking `n − k` fewer units, which ends its
    /// booking `(n − k)·T` earlier — the same "as if the refill had taken fewer"
    /// as a whole charge's refund, whose span is also the booking's last units
    /// whatever units the charge spent. The bound holds for any booking end taken
    /// from a refill's CAS (the paragraph above), so this choice moves precision,
    /// not the bound. The central part's outcome does not change the answer: the
    /// lease took units, so `refund` returns `true`.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{LeasedGcra, ManualClock, Policy};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let leased = LeasedGcra::builder(Policy::per_second(1_000)?.with_burst(100)?)
    ///     .shards(4)
    ///     .lease_size(10)
    ///     .lifetime(Duration::from_millis(1))
    ///     .build_with_clock(clock.clone())?;
    /// let (_, receipt) = leased.charge(2); // books 10 units: [0, 10 ms)
    /// assert_eq!(leased.peek(0).remaining(), 90);
    /// // On another thread: back to the central word.
    /// let back = std::thread::scope(|s| s.spawn(|| leased.refund(receipt)).join().unwrap());
    /// assert!(back);
    /// assert_eq!(leased.peek(0).remaining(), 92);
    /// // Once the clock has passed the booking, nothing is the charge's any more.
    /// let (_, receipt) = leased.charge(1);
    /// clock.advance(Duration::from_millis(20));
    /// assert!(!leased.refund(receipt));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund(&self, receipt: Receipt) -> bool {
        let (now, nanos) = self.expiry_nanos();
        self.refund_on(now, nanos, receipt)
    }

    /// A refund at the expiry clock's `nanos` (and the limiter clock's `now`, when
    /// the caller has it): to the lease, else to the central word.
    fn refund_on(&self, now: Option<Nanos>, nanos: u64, receipt: Receipt) -> bool {
        self.refund_unless(now, nanos, receipt, || false)
    }

    /// [`refund_on`](Self::refund_on), with a lease refund taken back (the lease word
    /// put back as it was, the answer `false`) when `closed()` reads true once it is
    /// done: a [`HotKeyLimiter`](crate::HotKeyLimiter) demotion closed the central
    /// word meanwhile ([`refund_unless_closed_at`](Self::refund_unless_closed_at)).
    fn refund_unless(
        &self,
        now: Option<Nanos>,
        nanos: u64,
        receipt: Receipt,
        closed: impl FnOnce() -> bool,
    ) -> bool {
        let Some(charge) = receipt.charge_for::<u64>(self.owner, 0) else {
            return false;
        };
        let index = receipt.generation();
        // A refund takes no owner index: a thread without one owns no shard.
        if owner_index_if_taken() as u64 == index {
            if let Some((shard, before, rest)) =
                self.refund_to_lease(nanos, &charge, receipt.noted())
            {
                if closed() {
                    // The caller owns the shard: nothing was spent since the store.
                    // The rest would fail its CAS on the closed word: not tried.
                    shard.lease.store(before, Ordering::Relaxed);
                    return false;
                }
                if rest > 0 {
                    // The lease was filled to its size: the rest goes to the central
                    // word as the refund of a charge of `rest` units of the same
                    // booking — its last `rest` units (see `refund`, "A full
                    // lease"). Units came back either way.
                    let rest = Charged {
                        cost: rest,
                        ..charge
                    };
                    self.refund_to_central(now, &rest, receipt.noted());
                }
                return true;
            }
        }
        self.refund_to_central(now, &charge, receipt.noted())
    }

    /// Puts the charge's units back on the lease they were spent from, if the caller
    /// owns the charge's shard and that lease is still its and spendable, up to the
    /// lease size. Returns the shard, its lease word as it was before and the units
    /// the lease had no room for (for the central word), when it took any.
    ///
    /// The lease then holds units of the charge's booking (ending at or after
    /// `charge.before`, noted at or after `noted`), so the shard's `booked` and
    /// `noted` are lowered to the receipt's where those are earlier: a lease of the
    /// same expiry tick may have been dated again, by a refill at a reading behind a
    /// later refill's, with a later booking (see [`refund`](Self::refund), "Back to
    /// the central word").
    fn refund_to_lease(
        &self,
        nanos: u64,
        charge: &Charged<u64>,
        noted: u64,
    ) -> Option<(&Shard, Lease, u32)> {
        let shard: &Shard = self.shards.get(owner_index_if_taken())?;
        let tick = self.lease_tick(nanos)?;
        // The caller owns the shard: it is the word's only writer.
        let lease = shard.lease.load(Ordering::Relaxed);
        if lease.expires() != Lease(charge.after).expires()
            || !lease.is_spendable(tick, self.lifetime_ticks)
        {
            return None;
        }
        let units = lease
            .units()
            .saturating_add(charge.cost)
            .min(self.lease_size);
        if units <= lease.units() {
            return None;
        }
        let rest = charge.cost - (units - lease.units());
        shard
            .lease
            .store(Lease::new(units, lease.expires()), Ordering::Relaxed);
        // The caller owns the shard: it is the only writer of these words too. Lowered
        // for good, even if a demotion takes the units back (`refund_unless`): an
        // earlier end and an older note only give back less.
        if charge.before < shard.booked.load(Ordering::Relaxed) {
            shard.booked.store(charge.before, Ordering::Relaxed);
        }
        let total = self.central_refunds.note();
        let since = |note: u64| total.wrapping_sub(note);
        if since(noted) > since(shard.noted.load(Ordering::Relaxed)) {
            shard.noted.store(noted, Ordering::Relaxed);
        }
        // The lease's units are no longer the last refill's alone: a later charge
        // is judged against the (lowered) `booked`, never `spanned_booked`.
        shard.spanned.store(0, Ordering::Relaxed);
        Some((shard, lease, rest))
    }

    /// Gives the part of the charge's booking still ahead of the clock back to the
    /// central word (see [`refund`](Self::refund), "Back to the central word"):
    /// `charge.before` is the booking's end, `noted` the ledger's note at its refill.
    #[cold]
    fn refund_to_central(&self, now: Option<Nanos>, charge: &Charged<u64>, noted: u64) -> bool {
        let end = charge.before;
        let span = u64::from(charge.cost).saturating_mul(self.gcra.policy().interval_nanos());
        let booking = Charged {
            before: GcraState::from_tat(Nanos::new(end.saturating_sub(span))),
            after: GcraState::from_tat(Nanos::new(end)),
            at: Nanos::ZERO,
            cost: charge.cost,
        };
        // The reading is taken after each load of the central word, and is at least
        // the caller's: every admission the refund sees read no later.
        let reading = || {
            let clock = self.clock.now();
            now.map_or(clock, |now| now.max(clock))
        };
        let open = |state: &GcraState| state.tat().as_u64() != u64::MAX;
        self.central_refunds.refund(noted, |shift| {
            refund_word(&self.gcra, &*self.central, &booking, shift, reading, open)
        })
    }

    /// What a check of `cost` would decide now (see the [module docs](self), "What a
    /// decision reports"): `peek(0)` is the central word's report, as
    /// `check(0)` is; a positive cost is allowed when this thread's own lease holds
    /// it, or the central word holds what it is short of. Writes nothing and takes no
    /// owner index.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{LeasedGcra, ManualClock, Policy};
    ///
    /// let leased = LeasedGcra::builder(Policy::per_second(1_000)?.with_burst(100)?)
    ///     .shards(1)
    ///     .lease_size(10)
    ///     .build_with_clock(ManualClock::new())?;
    /// assert!(leased.check().is_allowed()); // leases 10, spends 1
    /// assert_eq!(leased.peek(0).remaining(), 90); // the central word
    /// assert_eq!(leased.peek(0), leased.check_n(0));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek(&self, cost: u32) -> Decision {
        self.peek_at(self.clock.now(), cost)
    }

    /// What this thread could spend now, as one report (writes nothing, takes no
    /// owner index): the units of its own unexpired lease plus the central word's
    /// remaining, at most the burst, with the central word's reset — the report a
    /// refill makes, at cost 0. Where a lease spend reports only its lease's units
    /// and lifetime (fast: no shared read), this is the view of the whole limit a
    /// client is shown (floodgate-http's leased rules): never more than this thread
    /// could be admitted at once, and the time until the central schedule is idle.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{LeasedGcra, ManualClock, Policy};
    ///
    /// let leased = LeasedGcra::builder(Policy::per_second(1_000)?.with_burst(100)?)
    ///     .shards(1)
    ///     .lease_size(10)
    ///     .build_with_clock(ManualClock::new())?;
    /// let spend = leased.check_n(2); // leases 10, spends 2
    /// assert!(leased.check().is_allowed()); // a spend: the lease's 7 left
    /// assert_eq!(leased.check_n(0).remaining(), 90); // the central word
    /// assert_eq!(leased.report().remaining(), 97); // 7 on this lease + 90
    /// assert_eq!(leased.report().reset_after(), leased.peek(0).reset_after());
    /// # let _ = spend;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn report(&self) -> Decision {
        self.report_at(self.clock.now())
    }

    /// [`report`](Self::report) at a reading of the limiter's clock.
    pub(crate) fn report_at(&self, now: Nanos) -> Decision {
        let own = self.own_units(self.expiry_nanos_at(now));
        let central = self.peek_at(now, 0);
        let remaining = central
            .remaining()
            .saturating_add(u64::from(own))
            .min(self.gcra.policy().burst());
        Decision::allow(central.limit(), remaining, 1, central.reset_after_nanos())
    }

    /// The units this thread's own lease holds, spendable at the expiry clock's
    /// `nanos` (0 for a thread that owns no shard, or a reading no lease can be
    /// dated at). Takes no owner index.
    fn own_units(&self, nanos: u64) -> u32 {
        match (
            self.shards.get(owner_index_if_taken()),
            self.lease_tick(nanos),
        ) {
            (Some(shard), Some(tick)) => shard
                .lease
                .load(Ordering::Relaxed)
                .spendable_units(tick, self.lifetime_ticks),
            _ => 0,
        }
    }

    /// The expiry clock's nanoseconds for a reading `now` of the limiter's clock.
    #[inline(always)]
    fn expiry_nanos_at(&self, now: Nanos) -> u64 {
        match &self.expiry {
            Expiry::Fresh => now.as_u64(),
            Expiry::Coarse(coarse) => coarse.nanos(),
        }
    }

    /// What [`check_n_at`](LeasedGcra::check_n_at) would decide, writing nothing:
    /// allowed when this thread's own shard holds `cost` units, or the central word
    /// holds what it is short of.
    pub(crate) fn peek_at(&self, now: Nanos, cost: u32) -> Decision {
        // A peek takes no owner index: a thread that only reads holds no shard.
        let own = self.own_units(self.expiry_nanos_at(now));
        let burst = self.gcra.policy().burst();
        let central = self.central.load(Ordering::Relaxed);
        if cost == 0 || u64::from(cost) > burst {
            // As a check: the central word's answer alone (see `refill`).
            return self.decide_capped(central, now, cost).0;
        }
        let short = cost.saturating_sub(own);
        let decision = self.decide_capped(central, now, short).0;
        // Allowed: what the check would leave (the central word's after the units
        // it is short of, and this lease's after the units it spends); denied: what
        // is there now (a denial takes nothing).
        let left_on_lease = if decision.is_allowed() {
            own.saturating_sub(cost)
        } else {
            own
        };
        let remaining = decision
            .remaining()
            .saturating_add(u64::from(left_on_lease))
            .min(burst);
        if decision.is_allowed() {
            return Decision::allow(burst, remaining, 1, decision.reset_after_nanos());
        }
        // As a refill's denial: the central word's wait for the whole cost.
        let whole = self.decide_capped(central, now, cost).0;
        match whole.retry_after_nanos() {
            Some(retry) => Decision::deny(burst, remaining, 1, decision.reset_after_nanos(), retry),
            None => Decision::never(burst, remaining, 1, decision.reset_after_nanos()),
        }
    }

    /// Sets the central word (a limiter taking over a key's schedule).
    pub(crate) fn open_central(&self, state: GcraState) {
        self.central.store(state, Ordering::Relaxed);
    }

    /// Closes the central word: every later refill is denied (its TAT is the end of
    /// time). Returns the schedule as it was: every unit ever leased is in it.
    pub(crate) fn close_central(&self) -> GcraState {
        update_word(&*self.central, |state| {
            (state, Some(GcraState::from_tat(Nanos::new(u64::MAX))))
        })
    }

    /// Whether the central word is closed ([`close_central`](Self::close_central)).
    /// A closed word is final (a refill it denies writes nothing), so by coherence a
    /// thread that read it closed reads it closed here too, whatever the ordering.
    pub(crate) fn is_central_closed(&self) -> bool {
        self.central.load(Ordering::Relaxed).tat().as_u64() == u64::MAX
    }

    /// Whether nothing is owed: the central schedule is idle at `now` and no shard
    /// holds an unexpired lease.
    pub(crate) fn is_idle(&self, now: Nanos) -> bool {
        self.central.load(Ordering::Relaxed).tat() <= now && self.units_on_lease() == 0
    }

    /// The calling thread's shard if it owns one, else the central word.
    #[inline(always)]
    fn decide(&self, now: Option<Nanos>, nanos: u64, cost: u32) -> Decision {
        match self.shards.get(owner_index()) {
            Some(shard) => self.decide_owned(shard, now, nanos, cost),
            None => self.decide_central(now, cost),
        }
    }

    /// A decision on `shard`'s lease word, whose only writer is the caller: the thread owning its
    /// index (see [`owner_index`]), or a caller holding `&mut self`. So a spend is a
    /// plain load and store, and no other thread's write can fall between them.
    /// (Other threads only read shard words: `units_on_lease`, `peek_at`.)
    #[inline(always)]
    fn decide_owned(&self, shard: &Shard, now: Option<Nanos>, nanos: u64, cost: u32) -> Decision {
        let word = &shard.lease;
        // A reading no lease can be dated at (`lease_tick`) takes the slow way, where
        // the central word decides alone and no lease is taken. The spend needs only
        // the origin test: a reading past the dated span holds no lease it could
        // spend early (none is taken there, and one taken before expires within
        // the field). One comparison, folded into the branch to `refill`, keeps the
        // spend small enough for callers to inline it (an early return of its own
        // cost 27 instructions a decision in the benchmark: its caller stopped
        // inlining it).
        let tick = nanos.wrapping_sub(self.origin) >> TICK_SHIFT;
        let lease = word.load(Ordering::Relaxed);
        if cost > 0 && nanos >= self.origin {
            if let Some(next) = lease.spend(tick, self.lifetime_ticks, cost) {
                word.store(next, Ordering::Relaxed);
                let left = next.expires().saturating_sub(tick) << TICK_SHIFT;
                return Decision::allow(
                    self.gcra.policy().burst(),
                    u64::from(next.units()),
                    1,
                    left,
                );
            }
        }
        self.refill(shard, lease, now, nanos, cost)
    }

    /// A thread without a shard: the central word decides alone, exactly.
    #[cold]
    fn decide_central(&self, now: Option<Nanos>, cost: u32) -> Decision {
        let now = now.unwrap_or_else(|| self.clock.now());
        update_word(&*self.central, |state| self.decide_capped(state, now, cost))
    }

    /// GCRA on the central word, refusing as "never" a decision that would take it
    /// past [`max_tat`](LeaseBuilder::max_tat).
    #[inline]
    fn decide_capped(
        &self,
        state: GcraState,
        now: Nanos,
        cost: u32,
    ) -> (Decision, Option<GcraState>) {
        match self.gcra.decide(state, now, cost) {
            (_, Some(next)) if next.tat().as_u64() > self.max_tat => {
                (Decision::never(self.gcra.policy().burst(), 0, 1, 0), None)
            }
            outcome => outcome,
        }
    }

    /// The central word's peek and a lease refill of `shard` (the slow path; the
    /// caller is the shard's only writer and has just read `lease` from its lease
    /// word), or, for a reading no lease can be dated at, the central word's decision
    /// alone.
    #[cold]
    fn refill(
        &self,
        shard: &Shard,
        lease: Lease,
        now: Option<Nanos>,
        nanos: u64,
        cost: u32,
    ) -> Decision {
        let Some(tick) = self.lease_tick(nanos) else {
            // A reading no lease can be dated at: the central word decides alone.
            return self.decide_central(now, cost);
        };
        let now = now.unwrap_or_else(|| self.clock.now());
        let burst = self.gcra.policy().burst();
        if cost == 0 || u64::from(cost) > burst {
            // A report (cost 0) or a cost that never fits: the central word's answer,
            // nothing written.
            return update_word(&*self.central, |state| {
                (self.decide_capped(state, now, cost).0, None)
            });
        }
        // This shard's own unexpired units count first: none is stranded here.
        let own = lease.spendable_units(tick, self.lifetime_ticks);
        let need = cost.saturating_sub(own);
        let want = self.lease_size.max(need);
        // Noted before the CAS, which is `Release` so that a central refund whose
        // CAS lands after it reads this note's past (as a cell's charge: see
        // `RefundLedger`). Cold path: the spend reads neither.
        let noted = self.central_refunds.note();
        let (taken, booked, central) = if need == 0 {
            (0, 0, None)
        } else {
            update_word_ordered(&*self.central, Ordering::Release, |state| {
                let available = self.gcra.decide(state, now, 0).0.remaining();
                if available < u64::from(need) {
                    // Denied. The wait shown is for the whole cost, not this
                    // shard's shortfall: this lease may expire first, and the
                    // client's retry may be decided on another shard with fewer
                    // units; after this wait the central word alone holds the cost
                    // (absent other traffic), so a refill on any shard admits it.
                    return ((0, 0, Some(self.decide_capped(state, now, cost).0)), None);
                }
                let take = u64::from(want).min(available) as u32;
                match self.decide_capped(state, now, take) {
                    (decision, None) => ((0, 0, Some(decision)), None),
                    (decision, Some(next)) => {
                        ((take, next.tat().as_u64(), Some(decision)), Some(next))
                    }
                }
            })
        };
        if taken == 0 && need > 0 {
            // Denied: the lease keeps its units and its expiry.
            let denial =
                central.unwrap_or_else(|| self.gcra.decide(GcraState::default(), now, cost).0);
            let remaining = denial.remaining().saturating_add(u64::from(own)).min(burst);
            return match denial.retry_after_nanos() {
                Some(retry) => {
                    Decision::deny(burst, remaining, 1, denial.reset_after_nanos(), retry)
                }
                None => Decision::never(burst, remaining, 1, denial.reset_after_nanos()),
            };
        }
        // `left < max(lease size, need)`, so it fits the units field; the cap is a
        // guard (a unit dropped is under-admission only).
        let left = (own + taken - cost).min(MAX_LEASE);
        let expires = tick.saturating_add(self.lifetime_ticks);
        let next = Lease::new(left, expires);
        if taken > 0 {
            // Where this booking ends on the central schedule, for the receipts of
            // charges spent from this lease. This charge spends the lease's own
            // `own < cost` units first, so the units left are all of this booking:
            // later charges are judged against its end and note. (An earlier
            // receipt refunded to this lease later — one of the same expiry tick —
            // lowers both to its own: `refund_to_lease`.) This charge's own units
            // span the carried ones' bookings and this one: it is judged against
            // the earliest end among them and the older note (`spanned_*`, matched
            // by the lease word it leaves).
            let old = shard.booked.load(Ordering::Relaxed);
            let old_noted = shard.noted.load(Ordering::Relaxed);
            shard.booked.store(booked, Ordering::Relaxed);
            shard.noted.store(noted, Ordering::Relaxed);
            if own > 0 {
                shard
                    .spanned_booked
                    .store(old.min(booked), Ordering::Relaxed);
                // Older than `noted`: the ledger only grows, and every note the
                // shard holds was read earlier by its owners.
                shard.spanned_noted.store(old_noted, Ordering::Relaxed);
                shard.spanned.store(next.0, Ordering::Relaxed);
            } else {
                shard.spanned.store(0, Ordering::Relaxed);
            }
        }
        shard.lease.store(next, Ordering::Relaxed);
        let central_remaining = central.map_or(0, |d| d.remaining());
        let reset = central.map_or(self.lifetime_ticks << TICK_SHIFT, |d| d.reset_after_nanos());
        Decision::allow(
            burst,
            central_remaining.saturating_add(u64::from(left)).min(burst),
            1,
            reset,
        )
    }

    /// The main clock's reading when the expiry clock is that clock, and the expiry
    /// clock's nanoseconds.
    #[inline(always)]
    fn expiry_nanos(&self) -> (Option<Nanos>, u64) {
        match &self.expiry {
            Expiry::Fresh => {
                let now = self.clock.now();
                (Some(now), now.as_u64())
            }
            Expiry::Coarse(coarse) => (None, coarse.nanos()),
        }
    }

    #[inline(always)]
    fn tick(&self, nanos: u64) -> u64 {
        nanos.saturating_sub(self.origin) >> TICK_SHIFT
    }

    /// The tick of `nanos` if a lease can be dated there: none before the origin
    /// (every such reading would be tick 0, so a lease taken at any of them would be
    /// spendable at every earlier one) nor so late that the lease's expiry would not
    /// fit its field (a capped expiry would make it spendable up to a lifetime
    /// before it was taken). Such a reading decides on the central word alone.
    #[inline(always)]
    fn lease_tick(&self, nanos: u64) -> Option<u64> {
        let since = nanos.checked_sub(self.origin)?;
        (since < self.dated_span).then_some(since >> TICK_SHIFT)
    }

    /// Units on unexpired leases, over all shards (reads every shard word).
    pub fn units_on_lease(&self) -> u64 {
        let tick = self.tick(self.expiry_nanos().1);
        self.shards
            .iter()
            .map(|w| u64::from(w.lease.load(Ordering::Relaxed).valid_units(tick)))
            .sum()
    }

    /// Units held by shard words, expired or not (expired ones are cleared when that
    /// shard next takes a lease): the units taken from the central word and not
    /// admitted.
    pub fn units_held(&self) -> u64 {
        self.shards
            .iter()
            .map(|w| u64::from(w.lease.load(Ordering::Relaxed).units()))
            .sum()
    }

    /// Whether the calling thread owns one of this limiter's shards (its owner index
    /// is below the shard count). A thread that does not decides on the central word
    /// alone: exact, and as fast as a plain limiter, but it does not scale. A server
    /// can check this on its workers to see that `shards` counts them all. A thread
    /// that has no index yet takes one here, as its first decision would.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{LeasedGcra, Policy};
    ///
    /// let leased = LeasedGcra::builder(Policy::per_second(1_000)?).shards(64).build()?;
    /// let owns = std::thread::spawn(move || leased.owns_shard()).join().unwrap();
    /// assert!(owns, "a short-lived thread among few");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn owns_shard(&self) -> bool {
        owner_index() < self.shards.len()
    }

    /// The number of shards (a power of two).
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Units per lease.
    pub fn lease_size(&self) -> u32 {
        self.lease_size
    }

    /// The policy.
    pub fn policy(&self) -> Policy {
        self.gcra.policy()
    }

    /// [`refund`](Self::refund) at a reading `now` of the limiter's clock, for a
    /// limiter whose central word a
    /// [`HotKeyLimiter`](crate::HotKeyLimiter) demotion may close meanwhile: if the
    /// word reads closed once a refund **to the lease** is done, the units are taken
    /// back off the calling thread's lease (its only writer, so nothing was spent in
    /// between) and the answer is `false`: the demotion counted them spent, and no
    /// check may spend them now. The closed word is final, so a refund that reads it
    /// open came back before the close, and its units are the lease's like any
    /// others. A refund **to the central word** needs no such step: its CAS fails on
    /// a closed word (nothing given back, `false`), and one that lands before the
    /// close is in the schedule the demotion hands to the table (`true`).
    pub(crate) fn refund_unless_closed_at(&self, now: Nanos, receipt: Receipt) -> bool {
        self.refund_unless(Some(now), self.expiry_nanos_at(now), receipt, || {
            self.is_central_closed()
        })
    }
}

impl<C: Clock> core::fmt::Debug for LeasedGcra<C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("LeasedGcra")
            .field("policy", &self.gcra.policy())
            .field("shards", &self.shards.len())
            .field("lease_size", &self.lease_size)
            .field("lifetime_ticks", &self.lifetime_ticks)
            .field("expiry", &self.expiry)
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::ManualClock;

    fn policy(burst: u64) -> Policy {
        Policy::per_second(1_000)
            .and_then(|p| p.with_burst(burst))
            .unwrap()
    }

    #[test]
    fn lease_packing_round_trips_and_expires() {
        let l = Lease::new(MAX_LEASE, EXPIRY_MAX + 5);
        assert_eq!((l.units(), l.expires()), (MAX_LEASE, EXPIRY_MAX));
        let l = Lease::new(7, 10);
        assert_eq!(l.valid_units(9), 7);
        assert_eq!(l.valid_units(10), 0);
        // Lifetime 4: taken at tick 6, spendable at ticks 6..=9.
        assert_eq!(l.spend(9, 4, 7), Some(Lease::new(0, 10)));
        assert_eq!(l.spend(9, 4, 8), None);
        assert_eq!(l.spend(10, 4, 1), None);
        assert_eq!(l.spend(6, 4, 1), Some(Lease::new(6, 10)));
        assert_eq!(l.spend(5, 4, 1), None, "a reading older than the lease");
        assert_eq!(l.spendable_units(5, 4), 0);
        assert_eq!(
            l.valid_units(5),
            7,
            "not expired: still counted as out on lease"
        );
        assert_eq!(Lease::default().valid_units(0), 0);
        assert_eq!(Lease::default().spendable_units(0, 4), 0);
    }

    #[test]
    #[cfg_attr(miri, ignore = "quanta executes CPUID")]
    fn the_builder_names_bad_settings() {
        let b = || LeasedGcra::builder(policy(10));
        assert_eq!(
            b().lease_size(11).build().unwrap_err(),
            LeaseError::LeaseSize { size: 11, max: 10 }
        );
        assert_eq!(
            b().lease_size(0).build().unwrap_err(),
            LeaseError::LeaseSize { size: 0, max: 10 }
        );
        assert_eq!(b().shards(0).build().unwrap_err(), LeaseError::Shards(0));
        assert_eq!(
            b().lifetime(Duration::from_micros(10)).build().unwrap_err(),
            LeaseError::Lifetime(Duration::from_micros(10))
        );
        let l = b().shards(3).build().unwrap();
        assert_eq!((l.shard_count(), l.lease_size()), (4, 1));
        assert!(b()
            .lease_size(11)
            .build()
            .unwrap_err()
            .to_string()
            .contains("lease_size 11"));
    }

    #[test]
    fn a_shard_spends_its_lease_without_the_central_word_then_refills() {
        let clock = ManualClock::new();
        let mut l = LeasedGcra::builder(policy(10))
            .shards(2)
            .lease_size(4)
            .build_with_clock(clock.clone())
            .unwrap();
        let d = l.check_on(0, 1);
        assert!(d.is_allowed());
        assert_eq!((d.limit(), d.remaining()), (10, 3 + 6));
        for left in [2, 1, 0] {
            assert_eq!(l.check_on(0, 1).remaining(), left);
        }
        assert_eq!(l.units_on_lease(), 0);
        // Shard 1 takes its own lease; shard 0 refills with what the central word has
        // left (2 of the 4 it wants: 4 + 4 + 2 = the burst of 10).
        assert!(l.check_on(1, 1).is_allowed());
        assert!(l.check_on(0, 2).is_allowed());
        assert_eq!(l.units_on_lease(), 3);
        assert_eq!(l.check_on(0, 0).remaining(), 0);
        // Shard 0 is out, and so is the central word: denied, retry when one unit is back.
        let denied = l.check_on(0, 1);
        assert!(!denied.is_allowed());
        assert_eq!(denied.retry_after(), Some(Duration::from_millis(1)));
        // Shard 1 has 3 and wants 4: it takes its 3 back, the central word has none to
        // add: denied, and its 3 are still on its lease.
        assert!(!l.check_on(1, 4).is_allowed());
        assert_eq!(l.units_on_lease(), 3);
        assert!(l.check_on(1, 3).is_allowed());
        assert_eq!(l.units_on_lease(), 0);
        // A cost above the burst is never admitted.
        assert_eq!(l.check_on(0, 11).retry_after(), None);
    }

    #[test]
    fn a_central_refund_on_a_closed_word_gives_nothing() {
        let l = LeasedGcra::builder(policy(10))
            .shards(4)
            .lease_size(4)
            .build_with_clock(ManualClock::new())
            .unwrap();
        let (d, receipt) = l.charge(1);
        assert!(d.is_allowed() && receipt.is_charged());
        let schedule = l.close_central();
        assert_eq!(schedule.tat().as_u64(), 4_000_000, "the lease's 4 units");
        let back = std::thread::scope(|s| s.spawn(|| l.refund(receipt)).join().unwrap());
        assert!(!back, "a hot key's demotion sealed the word");
        assert!(l.is_central_closed());
    }

    #[test]
    fn unspent_units_expire_after_the_lifetime() {
        let clock = ManualClock::new();
        let mut l = LeasedGcra::builder(policy(100))
            .shards(1)
            .lease_size(10)
            .lifetime(Duration::from_millis(1))
            .build_with_clock(clock.clone())
            .unwrap();
        assert!(l.check_on(0, 1).is_allowed());
        assert_eq!(l.units_on_lease(), 9);
        clock.advance(Duration::from_micros(1_100));
        assert_eq!(l.units_on_lease(), 0);
        assert_eq!(l.units_held(), 9);
        // The next decision refills; the expired units are gone.
        let d = l.check_on(0, 1);
        assert!(d.is_allowed());
        assert_eq!(l.units_held(), 9);
    }

    #[test]
    #[cfg_attr(miri, ignore = "quanta executes CPUID")]
    fn the_coarse_expiry_clock_spends_leases() {
        let l = LeasedGcra::builder(
            Policy::per_second(1_000_000_000)
                .unwrap()
                .with_burst(1_000)
                .unwrap(),
        )
        .shards(1)
        .lease_size(100)
        .build_coarse()
        .unwrap();
        let admitted = (0..1_000).filter(|_| l.check().is_allowed()).count();
        assert!(admitted > 0);
    }
}
