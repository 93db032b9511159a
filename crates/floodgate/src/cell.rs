//! The cell driver: runs an [`Algorithm`] on shared memory. One CAS loop
//! ([`update_word`] and friends) owns every `compare_exchange` on a state word; two
//! cells run any algorithm:
//!
//! * [`AtomicCell`]: the state in one cache-padded atomic word, updated by a
//!   `compare_exchange_weak` loop — lock-free;
//! * [`LockedCell`]: the same transition under a `Mutex` — the mutex twin, the
//!   apples-to-apples baseline for benchmarks and an oracle for tests.
//!
//! The keyed tables drive the same loop over their own words ([`CasWord`]). Memory
//! ordering: see [`crate::algorithm`].

use crossbeam_utils::CachePadded;

use crate::algorithm::{Algorithm, Charged};
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::sync::{lock, Atomic, AtomicU64, Mutex, MutexGuard, Ordering};

/// Runs one decision on an atomic word and returns what it wrote, if anything.
///
/// The CAS is `Release` (see [`RefundLedger`]): a refund that later sees this state
/// also sees the ledger as it was when the charge read it.
#[inline(always)]
pub(crate) fn charge_on<A: Algorithm + ?Sized>(
    algorithm: &A,
    word: &Atomic<A::State>,
    now: Nanos,
    cost: u32,
) -> (Decision, Option<Charged<A::State>>) {
    update_word_ordered(word, Ordering::Release, |before| {
        let (decision, next) = algorithm.decide(before, now, cost);
        let charge = next.map(|after| Charged {
            before,
            after,
            at: now,
            cost,
        });
        ((decision, charge), in_registers(next, before))
    })
}

/// What refunds have given back on one state word (or one keyed shard), so that a
/// later refund knows how far its own booking may have moved: the total alone, one
/// atomic word that a charge loads and nothing else writes but a refund holding its
/// owner's lock (see "Who serialises it").
///
/// A GCRA refund lowers the TAT and with it every booking made after the refunded
/// one; a receipt taken before that refund would then describe its booking where it
/// no longer is. So a charge notes the ledger before its CAS, and a refund —
/// serialised with every other update of the ledger — bounds its booking's move by
/// what the ledger has grown since, applies itself, then adds what it gave back.
///
/// The cells and the keyed shards bound it more closely with a record of their
/// latest refunds ([`RecentRefunds`]; the lease limiter's central word keeps none,
/// [`WholeGrowth`], and takes the whole growth): a refund whose booking ended at the
/// `TAT` it wrote over — nothing booked after it, [`Algorithm::refund_moves_later`]
/// — moved no other booking, and a booking made after it started from the schedule
/// it left, so it is not recorded and counts in no later refund's shift. That is the
/// refund of the latest booking, the common case of refunds out of their charges'
/// order (the later of two charges refunded first; queued reservations cancelled
/// from the last): the earlier charge's refund then gives back its whole booking,
/// where the whole growth would count the later refund as having moved it. A refund
/// that moved later bookings still counts in every later refund's shift, also one of
/// a booking made before its own (which it did not move): a bound, not the exact
/// move.
///
/// # Who serialises it
///
/// Every update goes through [`settle`](Self::settle) (or [`settle_total`], for a
/// total kept under a lock), which takes the owner's record by `&mut`: the record
/// lives under the one lock that serialises the owner's refunds, so holding it is
/// holding that lock, and each owner has that lock and no other for its refunds:
///
/// * a direct [`AtomicCell`] and the lease limiter's central word: a
///   [`SerialLedger`], the total beside a `Mutex` around the record (the cell's
///   resets and replacements take the same lock);
/// * a [`LockedCell`]: its state lock, with the total and the record beside the
///   state;
/// * a keyed shard: the shard's writer lock, whose writer-side bookkeeping holds
///   the record (the total sits on the shard's readers' line, for the charges).
///
/// # Memory ordering
///
/// A charge reads the ledger (`Relaxed`) before its `Release` CAS; a refund's CAS on
/// the same word is `AcqRel` and runs after every earlier refund's ledger update
/// (the owner's lock). A refund whose CAS lands after a charge's thus reads from
/// that charge's release sequence, so the charge's ledger read happens before the
/// refund's ledger update and cannot have seen it: the growth since the charge
/// covers every refund that moved its booking.
///
/// # Keyed shards: only the key's own refunds
///
/// A keyed shard keeps one ledger for all its keys, but a refund moves only the
/// bookings of its own key: each key has its own state word, and a refund's CAS
/// lands on that word alone (a heap entry's word; an inline slot whose CAS compares
/// the key half — with [`Fingerprint`](crate::Fingerprint), the keys of one
/// fingerprint share the word and the tag). A word that stops being the key's (a removal, reclamation,
/// eviction, then perhaps a re-creation) voids every receipt taken before: the
/// receipt carries the shard's removal generation and a refund gives back nothing
/// once it moved. So the shift a keyed refund needs is only what refunds of the
/// **same key** gave back since its charge. The shard remembers its latest refunds
/// that moved a later booking ([`RecentRefunds`], under the shard's writer lock,
/// which also serialises the ledger's updates): each one's key tag, the ledger
/// before it and what it moved. A refund whose note is at or past the oldest total
/// the record still covers sums what the refunds since its note with its key's tag
/// moved ([`settle`](Self::settle)); otherwise it takes the whole shard's growth,
/// as above. Both are at least the move of the key's own booking, so the bound
/// stays a bound (a direct cell keeps the same record, one tag for all its
/// refunds):
///
/// * every refund after the note that moved a later booking is in the record when
///   the note is at or past the record's reach (the total after the newest refund
///   it dropped): refunds are recorded in ledger order, and one before the note
///   ended at or before it (a refund that moved nothing is not recorded: it moved
///   no booking; nor is one whose booking ended at the `TAT` it wrote over: every
///   booking still held then lay below that end — a later one would have raised
///   the `TAT` past it, and refunds never lower the `TAT` below a booking still
///   held — and one made after it starts from the schedule it left.
///   [`Algorithm::refund_moves_later`] reads the refunded booking moved down by
///   its whole shift, the lowest it can be, so it says "nobody" only when nothing
///   can be above);
/// * a refund of this key after the note — the only kind that moved its booking,
///   which the ordering argument above places after the note in the ledger's
///   modification order — has its key's tag and starts at or past the note;
/// * two keys with one tag (a hash tag that collides) sum each other's refunds too,
///   and a record that no longer reaches back takes the whole shard's growth: both
///   only make the shift larger, which gives back less, never more;
/// * the note is still one `Relaxed` load of the total and the charge writes
///   nothing more: the record is read and written only under the lock that
///   serialises the ledger's updates, in the same critical section as the update it
///   describes, so a refund reads a record consistent with the total it loads.
///
/// Totals are `u64` and wrap; the record places each by its distance from its
/// reach, which assumes, as the whole-shard shift does, that a shard gives back
/// less than `2^64` ns between a charge and its refund.
pub(crate) struct RefundLedger {
    given_back: AtomicU64,
}

impl RefundLedger {
    pub(crate) fn new() -> RefundLedger {
        RefundLedger {
            given_back: AtomicU64::new(0),
        }
    }

    /// The ledger as a charge notes it (before its CAS).
    #[inline(always)]
    pub(crate) fn note(&self) -> u64 {
        self.given_back.load(Ordering::Relaxed)
    }

    /// Runs `refund` for a booking of the key tagged `tag` whose charge noted
    /// `noted`, and adds what it gave back to the total ([`settle_total`]).
    /// `record` is the owner's record, kept under the lock that serialises this
    /// ledger's updates (see "Who serialises it"). Returns whether `refund` ran
    /// to the end (`Some`).
    pub(crate) fn settle(
        &self,
        record: &mut impl Record,
        tag: u64,
        noted: u64,
        refund: impl FnOnce(u64) -> Option<(u64, bool)>,
    ) -> bool {
        let total = self.given_back.load(Ordering::Relaxed);
        match settle_total(record, tag, noted, total, refund) {
            Some(moved) => {
                self.given_back
                    .store(total.wrapping_add(moved), Ordering::Relaxed);
                true
            }
            None => false,
        }
    }
}

/// One refund's bookkeeping with the ledger at `total`, under the lock that
/// serialises the ledger's updates: runs `refund` with the shift its booking may
/// have moved since `noted` — what `record` holds of the refunds tagged `tag`
/// since, or the whole growth `total − noted` when it cannot tell (see
/// [`RefundLedger`]) — and remembers the refund when it gave something back and
/// may have moved a booking made after its own (`refund`'s flag,
/// [`Algorithm::refund_moves_later`]): one that moved nobody counts in no later
/// refund's shift. Returns what `refund` gave back, for the caller to add to the
/// total; `None` if it gave back nothing and wrote nothing.
pub(crate) fn settle_total(
    record: &mut impl Record,
    tag: u64,
    noted: u64,
    total: u64,
    refund: impl FnOnce(u64) -> Option<(u64, bool)>,
) -> Option<u64> {
    let shift = record
        .shift(tag, noted, total)
        .unwrap_or_else(|| total.wrapping_sub(noted));
    let (moved, later) = refund(shift)?;
    if moved != 0 && later {
        record.record(tag, total, moved);
    }
    Some(moved)
}

/// What an owner remembers of its latest refunds, read and written only under the
/// lock that serialises its ledger's updates (see [`RefundLedger`]).
pub(crate) trait Record {
    /// What refunds tagged `tag` gave back since the ledger stood at `noted` (now
    /// `total`), or `None` if the record cannot tell (the refund then takes the
    /// whole growth).
    fn shift(&self, tag: u64, noted: u64, total: u64) -> Option<u64>;
    /// Remembers a refund tagged `tag` that moved `moved` (> 0) from the ledger's
    /// `before`.
    fn record(&mut self, tag: u64, before: u64, moved: u64);
}

/// No record: every refund takes the whole growth since its note. The lease
/// limiter's central word keeps none: each receipt of one lease is judged as the
/// last units of the same refill's booking (see [`LeasedGcra::refund`], "Back to
/// the central word"), so the refund of a booking that ends at the `TAT` still
/// moves the booking the next receipt of that lease is judged against, and the
/// lease's bound rests on the `TAT` staying at or past that booking's end less the
/// shift, which needs every central refund since in it. (With the record instead,
/// `lease_central_refunds::only_the_part_of_the_booking_still_ahead_comes_back`
/// and `lease_refunds::a_refund_puts_the_units_back_on_their_lease_never_above_the_lease_size`
/// fail: a second receipt of one lease then reads its booking unmoved.)
///
/// [`LeasedGcra::refund`]: crate::LeasedGcra::refund
pub(crate) struct WholeGrowth;

impl Record for WholeGrowth {
    fn shift(&self, _tag: u64, _noted: u64, _total: u64) -> Option<u64> {
        None
    }

    fn record(&mut self, _tag: u64, _before: u64, _moved: u64) {}
}

/// A refund ledger that its own lock serialises, with the owner's record under
/// that lock (see [`RefundLedger`], "Who serialises it"): a direct
/// [`AtomicCell`]'s ([`RecentRefunds`], one tag), whose resets and replacements
/// take the same lock, and the lease limiter's central word's ([`WholeGrowth`]).
/// The lock is the owner's only one for its refunds.
///
/// `repr(C)`: the total first, so that in an [`AtomicCell`] it follows the word and
/// the generation on the word's own cache line.
#[repr(C)]
pub(crate) struct SerialLedger<R> {
    ledger: RefundLedger,
    record: Mutex<R>,
}

impl<R: Record> SerialLedger<R> {
    pub(crate) fn new(record: R) -> SerialLedger<R> {
        SerialLedger {
            ledger: RefundLedger::new(),
            record: Mutex::new(record),
        }
    }

    /// The ledger as a charge notes it (before its CAS): one `Relaxed` load.
    #[inline(always)]
    pub(crate) fn note(&self) -> u64 {
        self.ledger.note()
    }

    /// Runs `refund` (given how far the charge's booking may have moved since
    /// `noted`) under the lock, and records what it gave back
    /// ([`RefundLedger::settle`], one tag).
    pub(crate) fn refund(
        &self,
        noted: u64,
        refund: impl FnOnce(u64) -> Option<(u64, bool)>,
    ) -> bool {
        self.ledger
            .settle(&mut *lock(&self.record), 0, noted, refund)
    }

    /// The lock, for a step that must not interleave with a refund and gives back
    /// nothing (a cell's reset or replacement).
    pub(crate) fn serial(&self) -> MutexGuard<'_, R> {
        lock(&self.record)
    }
}

/// How many refunds a keyed shard remembers (see [`RecentRefunds`]).
pub(crate) const RECENT_REFUNDS: usize = 8;

/// One remembered refund: its key's tag, the ledger before it and what it moved
/// (never 0: a refund that moved nothing, or moved no booking but its own, is not
/// remembered; an unused entry reads 0).
#[derive(Clone, Copy, Default)]
struct Recent {
    tag: u64,
    before: u64,
    moved: u64,
}

/// The latest refunds of a keyed shard (or a direct cell) that moved a later
/// booking, oldest dropped first, and the ledger total from which it holds every
/// such refund (its reach): written and read only under the lock that serialises
/// the ledger's updates (the shard's writer lock, a cell's [`SerialLedger`] or
/// state lock; see [`RefundLedger`]'s docs). It lives under that lock, allocated
/// with its owner: a refund allocates nothing (208 bytes a shard, against at least
/// 64 keys a shard; in a direct cell it shares the state word's padded block, see
/// [`AtomicCell`]).
pub(crate) struct RecentRefunds {
    ring: [Recent; RECENT_REFUNDS],
    /// The entry the next refund overwrites: the oldest once the ring is full.
    next: usize,
    /// The total after the newest dropped refund (at first, the total when the
    /// record began): every refund from it on is in the ring.
    reach: u64,
}

impl RecentRefunds {
    /// An empty record of the refunds from the ledger's `total` on (0 for a new
    /// ledger).
    pub(crate) fn starting_at(total: u64) -> RecentRefunds {
        RecentRefunds {
            ring: [Recent::default(); RECENT_REFUNDS],
            next: 0,
            reach: total,
        }
    }
}

impl Record for RecentRefunds {
    /// What refunds of keys tagged `tag` gave back since the ledger stood at `noted`
    /// (now `total`), or `None` if the ring no longer holds every refund since.
    /// Totals wrap: each is placed by its distance from the reach.
    fn shift(&self, tag: u64, noted: u64, total: u64) -> Option<u64> {
        let at = |total: u64| total.wrapping_sub(self.reach);
        let since = at(noted);
        if since > at(total) {
            return None;
        }
        Some(
            self.ring
                .iter()
                .filter(|r| r.moved != 0 && r.tag == tag && at(r.before) >= since)
                .fold(0, |shift: u64, r| shift.saturating_add(r.moved)),
        )
    }

    /// Remembers a refund of the key tagged `tag` that moved `moved` (> 0) from the
    /// ledger's `before`, dropping the oldest if the ring is full.
    fn record(&mut self, tag: u64, before: u64, moved: u64) {
        let oldest = &mut self.ring[self.next];
        if oldest.moved != 0 {
            self.reach = oldest.before.wrapping_add(oldest.moved);
        }
        *oldest = Recent { tag, before, moved };
        self.next = (self.next + 1) % RECENT_REFUNDS;
    }
}

/// One refund on a state word: `Acquire` load and `AcqRel` CAS (see
/// [`RefundLedger`]), the clock read after each load of the state, so every
/// admission the refund sees was decided at a reading no later than its own (with a
/// clock that is monotone across threads). `live` rejects a state that must not be
/// touched (a keyed table's dead word). Returns how far it moved later bookings and
/// whether any booking was after its own on the state it wrote over
/// ([`Algorithm::refund_moves_later`]).
pub(crate) fn refund_word<W, A>(
    algorithm: &A,
    word: &W,
    charge: &Charged<A::State>,
    shift: u64,
    mut now: impl FnMut() -> Nanos,
    live: impl Fn(&A::State) -> bool,
) -> Option<(u64, bool)>
where
    A: Algorithm + ?Sized,
    W: CasWord<Value = A::State> + ?Sized,
{
    update_word_from_ordered(word, word.load_acquire(), Ordering::AcqRel, |state| {
        if !live(&state) {
            return (None, None);
        }
        match algorithm.refund(state, charge, shift, now()) {
            Some((next, moved)) if live(&next) => {
                let later = algorithm.refund_moves_later(state, charge, shift);
                (Some((moved, later)), Some(next))
            }
            _ => (None, None),
        }
    })
}

/// Runs one decision on an atomic word (see [`update_word`]).
///
/// One clock reading (`now`) serves every retry. The CAS is `Release` so that a
/// refund that sees this admission also sees the clock reading it was decided at
/// (see [`RefundLedger`]); on x86 every locked CAS is a full barrier, so this costs
/// nothing there.
#[inline(always)]
pub(crate) fn decide_on<A: Algorithm + ?Sized>(
    algorithm: &A,
    word: &Atomic<A::State>,
    now: Nanos,
    cost: u32,
) -> Decision {
    update_word_ordered(word, Ordering::Release, |current| {
        let (decision, next) = algorithm.decide(current, now, cost);
        (decision, in_registers(next, current))
    })
}

/// A word [`update_word`] can drive: a load and a weak compare-exchange.
pub(crate) trait CasWord {
    /// The value the word holds.
    type Value: Copy;
    /// Loads the current value (`Relaxed`).
    fn load_now(&self) -> Self::Value;
    /// Loads the current value with `Acquire` (refunds).
    fn load_acquire(&self) -> Self::Value;
    /// One weak CAS with `success` ordering (failure: `Relaxed`, or `Acquire` when
    /// `success` acquires); `Err` hands back the current value.
    fn cas_weak(
        &self,
        current: Self::Value,
        new: Self::Value,
        success: Ordering,
    ) -> Result<Self::Value, Self::Value>;
}

/// The failure ordering that goes with a success ordering.
#[inline(always)]
pub(crate) fn failure_of(success: Ordering) -> Ordering {
    match success {
        Ordering::AcqRel | Ordering::Acquire | Ordering::SeqCst => Ordering::Acquire,
        _ => Ordering::Relaxed,
    }
}

impl<S: bytemuck::Pod> CasWord for Atomic<S> {
    type Value = S;

    #[inline(always)]
    fn load_now(&self) -> S {
        // Relaxed: see the module docs; the word publishes nothing but itself.
        self.load(Ordering::Relaxed)
    }

    #[inline(always)]
    fn load_acquire(&self) -> S {
        self.load(Ordering::Acquire)
    }

    #[inline(always)]
    fn cas_weak(&self, current: S, new: S, success: Ordering) -> Result<S, S> {
        self.compare_exchange_weak(current, new, success, failure_of(success))
    }
}

/// A borrowed word is the word (a keyed table's lookup hands out `&` its state word).
impl<W: CasWord + ?Sized> CasWord for &W {
    type Value = W::Value;

    #[inline(always)]
    fn load_now(&self) -> W::Value {
        (**self).load_now()
    }

    #[inline(always)]
    fn load_acquire(&self) -> W::Value {
        (**self).load_acquire()
    }

    #[inline(always)]
    fn cas_weak(
        &self,
        current: W::Value,
        new: W::Value,
        success: Ordering,
    ) -> Result<W::Value, W::Value> {
        (**self).cas_weak(current, new, success)
    }
}

/// `next` as a step whose result holds a [`Decision`] hands it to the loop: the same
/// value, rebuilt from a flag and a state (`current` when there is nothing to write),
/// so that it is a select rather than a branch.
///
/// A step is a closure, simplified on its own before it is inlined into the loop, and
/// a result that large comes back through memory. An
/// algorithm leaves its `Option` in one of two shapes — a tag alone (nothing to write)
/// or a tag and a state — and LLVM sinks the last store of each branch into one store
/// through a pointer chosen between them; once inlined, that store keeps the result
/// out of registers. In the direct limiter the tag was then stored and compared in
/// memory and the new state stored and reloaded just before the CAS, every decision
/// (BENCHMARKS.md, "The CAS loop's result in registers"). A step calls this on every
/// path that leaves it, an early return included.
#[inline(always)]
pub(crate) fn in_registers<V: Copy>(next: Option<V>, current: V) -> Option<V> {
    let (write, value) = match next {
        Some(next) => (true, next),
        None => (false, current),
    };
    write.then_some(value)
}

/// The crate's only `compare_exchange` loop: applies `step` to the word until the
/// state it wants written is written, or it wants nothing written.
///
/// `step` maps the current state to an outcome and the state to store (`None`:
/// nothing to write). A failed CAS hands back the current value, which the next round
/// reuses instead of reloading, at once: no backoff, so a thread that lost a race is
/// not starved by the one that won (see the loop for the measured tail). Every caller (decisions, the keyed tables'
/// retirement, refunds) goes through here; a step whose result holds a
/// [`Decision`] builds its `next` with [`in_registers`].
#[inline(always)]
pub(crate) fn update_word<W, R>(word: &W, step: impl FnMut(W::Value) -> (R, Option<W::Value>)) -> R
where
    W: CasWord + ?Sized,
{
    update_word_from(word, word.load_now(), step)
}

/// [`update_word`] with a `success` ordering for the CAS.
#[inline(always)]
pub(crate) fn update_word_ordered<W, R>(
    word: &W,
    success: Ordering,
    step: impl FnMut(W::Value) -> (R, Option<W::Value>),
) -> R
where
    W: CasWord + ?Sized,
{
    update_word_from_ordered(word, word.load_now(), success, step)
}

/// [`update_word`] from a value of the word the caller has just loaded (a lookup that
/// read the word to find it saves the second load; a stale value only costs a failed
/// CAS, which hands back the current one).
#[inline(always)]
pub(crate) fn update_word_from<W, R>(
    word: &W,
    current: W::Value,
    step: impl FnMut(W::Value) -> (R, Option<W::Value>),
) -> R
where
    W: CasWord + ?Sized,
{
    update_word_from_ordered(word, current, Ordering::Relaxed, step)
}

/// The loop itself, with a `success` ordering for the CAS.
#[inline(always)]
pub(crate) fn update_word_from_ordered<W, R>(
    word: &W,
    mut current: W::Value,
    success: Ordering,
    mut step: impl FnMut(W::Value) -> (R, Option<W::Value>),
) -> R
where
    W: CasWord + ?Sized,
{
    #[cfg(feature = "cas-stats")]
    let mut retries = 0u64;
    loop {
        let (outcome, next) = step(current);
        let Some(next) = next else {
            #[cfg(feature = "cas-stats")]
            crate::cas_stats::record(retries);
            return outcome;
        };
        match word.cas_weak(current, next, success) {
            Ok(_) => {
                #[cfg(feature = "cas-stats")]
                crate::cas_stats::record(retries);
                return outcome;
            }
            Err(actual) => {
                current = actual;
                #[cfg(feature = "cas-stats")]
                {
                    retries += 1;
                }
                // No backoff: the failed CAS handed back the current value, so the
                // retry is one transition and one CAS away. Spinning after a failure
                // (crossbeam's `Backoff`, up to 64 pauses) let the other thread win
                // round after round on the line it holds: the same hot-key
                // throughput at 2 threads, but p99 3.2 µs against 170 ns without
                // (`floodgate bench --latency`, BENCHMARKS.md).
            }
        }
    }
}

/// Where a limiter keeps its state: an [`AtomicCell`] or its mutex twin [`LockedCell`].
///
/// # Examples
///
/// ```
/// use floodgate::{AtomicCell, Gcra, LockedCell, Nanos, Policy, StateCell};
///
/// let gcra = Gcra::new(Policy::per_second(1)?);
/// let a = AtomicCell::fresh();
/// let l = LockedCell::fresh();
/// let now = Nanos::from_secs(1);
/// assert_eq!(a.apply(&gcra, now, 1), l.apply(&gcra, now, 1));
/// assert_eq!(a.load(), l.load());
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
pub trait StateCell<S>: Send + Sync {
    /// A cell holding the fresh (all-zero) state.
    fn fresh() -> Self;
    /// The current state.
    fn load(&self) -> S;
    /// Overwrites the state (used when a policy changes or a test sets a state up).
    fn store(&self, state: S);
    /// Decides and, when the transition says so, writes the new state.
    fn apply<A: Algorithm<State = S>>(&self, algorithm: &A, now: Nanos, cost: u32) -> Decision;
    /// [`apply`](StateCell::apply), also returning what the admission wrote (`None`
    /// when it wrote nothing: a denial, cost 0) and the refund ledger as it stood,
    /// for a later [`refund`](StateCell::refund).
    fn charge<A: Algorithm<State = S>>(
        &self,
        algorithm: &A,
        now: Nanos,
        cost: u32,
    ) -> (Decision, Option<(Charged<S>, u64)>);
    /// Gives back what `charge` (whose ledger note is `noted`, taken at
    /// [`generation`](StateCell::generation) `generation`) still provably holds
    /// ([`Algorithm::refund`]), reading the instant from `now` after the state is
    /// loaded. Refunds and resets are serialised. A charge from before the latest
    /// [`reset`](StateCell::reset) gives back nothing. Returns whether anything came
    /// back.
    fn refund<A: Algorithm<State = S>>(
        &self,
        algorithm: &A,
        charge: &Charged<S>,
        noted: u64,
        generation: u64,
        now: impl FnMut() -> Nanos,
    ) -> bool;
    /// How many [`reset`](StateCell::reset)s this cell has seen. A charge reads it
    /// before its write and hands it to its refund.
    ///
    /// `Acquire`: a charge that reads a reset's generation writes after that
    /// reset's fresh state, so no charge can be wiped by a reset it has already seen.
    fn generation(&self) -> u64;
    /// Back to the fresh state, invalidating every outstanding charge: a refund of
    /// a charge taken before the reset gives back nothing. Serialised with refunds.
    fn reset(&self);
    /// Replaces the state with `f(state)` as one step (a policy change), serialised
    /// with refunds and resets, and invalidates every outstanding charge (the new
    /// state may be in another algorithm's packing, where a receipt means nothing).
    ///
    /// Decisions may run concurrently: `f` sees the latest state and the CAS retries
    /// if a decision moved it.
    fn replace(&self, f: impl FnMut(S) -> S);
}

/// The lock-free cell: one cache-padded atomic word.
///
/// `CachePadded` keeps the word off its neighbours' cache lines (128 bytes on
/// x86_64), so a hot limiter never false-shares with another. The word shares its
/// padded block only with its own refund bookkeeping (256 bytes in all on x86_64
/// Linux, for a state of up to 16 bytes): the ledger's total and the generation,
/// which a charge loads beside the word it writes, and the refunds' lock and
/// record, which only refunds, resets and replacements touch — each of which also
/// writes the word. `apply` reads and writes the word alone.
///
/// # Examples
///
/// ```
/// use floodgate::{AtomicCell, Gcra, Nanos, Policy, StateCell};
/// let gcra = Gcra::new(Policy::per_second(1)?);
/// let cell = AtomicCell::fresh();
/// assert!(cell.apply(&gcra, Nanos::ZERO, 1).is_allowed());
/// assert!(!cell.apply(&gcra, Nanos::ZERO, 1).is_allowed());
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
pub struct AtomicCell<S> {
    cell: CachePadded<Bookkept<S>>,
}

/// An [`AtomicCell`]'s state word and its refund bookkeeping, in one padded block;
/// `repr(C)`: the word first, then what a charge loads (the generation, the ledger's
/// total), then the lock and the record.
#[repr(C)]
struct Bookkept<S> {
    word: Atomic<S>,
    /// Resets and replacements so far ([`StateCell::generation`]); written under
    /// the ledger's lock.
    generation: AtomicU64,
    /// What refunds gave back and the latest refunds that moved a later booking
    /// ([`RecentRefunds`], one tag), under the lock that serialises refunds, resets
    /// and replacements: the cell's only lock. `charge` loads the total; `apply`
    /// touches none of it.
    ledger: SerialLedger<RecentRefunds>,
}

impl<S: bytemuck::Pod + Send + Sync> StateCell<S> for AtomicCell<S> {
    fn fresh() -> Self {
        AtomicCell {
            cell: CachePadded::new(Bookkept {
                word: Atomic::new(bytemuck::Zeroable::zeroed()),
                generation: AtomicU64::new(0),
                ledger: SerialLedger::new(RecentRefunds::starting_at(0)),
            }),
        }
    }

    #[inline]
    fn load(&self) -> S {
        self.cell.word.load(Ordering::Relaxed)
    }

    fn store(&self, state: S) {
        self.cell.word.store(state, Ordering::Relaxed);
    }

    #[inline(always)]
    fn apply<A: Algorithm<State = S>>(&self, algorithm: &A, now: Nanos, cost: u32) -> Decision {
        decide_on(algorithm, &self.cell.word, now, cost)
    }

    #[inline]
    fn charge<A: Algorithm<State = S>>(
        &self,
        algorithm: &A,
        now: Nanos,
        cost: u32,
    ) -> (Decision, Option<(Charged<S>, u64)>) {
        let noted = self.cell.ledger.note();
        let (decision, charge) = charge_on(algorithm, &self.cell.word, now, cost);
        (decision, charge.map(|c| (c, noted)))
    }

    fn refund<A: Algorithm<State = S>>(
        &self,
        algorithm: &A,
        charge: &Charged<S>,
        noted: u64,
        generation: u64,
        now: impl FnMut() -> Nanos,
    ) -> bool {
        let cell = &*self.cell;
        cell.ledger.refund(noted, |shift| {
            // Relaxed: resets write the generation under the ledger's lock, held here.
            if cell.generation.load(Ordering::Relaxed) != generation {
                return None;
            }
            refund_word(algorithm, &cell.word, charge, shift, now, |_| true)
        })
    }

    #[inline]
    fn generation(&self) -> u64 {
        // Acquire: pairs with the Release bump in `replace` (see the trait docs).
        self.cell.generation.load(Ordering::Acquire)
    }

    fn reset(&self) {
        self.replace(|_| bytemuck::Zeroable::zeroed());
    }

    fn replace(&self, mut f: impl FnMut(S) -> S) {
        let cell = &*self.cell;
        // Serialised with refunds; nothing given back, so the ledger stays as it is.
        let _serial = cell.ledger.serial();
        // The new state first (an RMW: ordered after every decision it saw), then
        // the generation (Release): a charge that reads the new generation writes
        // after the new state.
        update_word_ordered(&cell.word, Ordering::AcqRel, |state| ((), Some(f(state))));
        let g = cell.generation.load(Ordering::Relaxed);
        cell.generation.store(g.wrapping_add(1), Ordering::Release);
    }
}

impl<S: bytemuck::Pod + core::fmt::Debug + Send + Sync> core::fmt::Debug for AtomicCell<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_tuple("AtomicCell").field(&self.load()).finish()
    }
}

/// The mutex twin: the same transition behind a `std::sync::Mutex`.
///
/// # Examples
///
/// ```
/// use floodgate::{Gcra, LockedCell, Nanos, Policy, StateCell};
/// let gcra = Gcra::new(Policy::per_second(1)?);
/// let cell = LockedCell::fresh();
/// assert!(cell.apply(&gcra, Nanos::ZERO, 1).is_allowed());
/// assert!(!cell.apply(&gcra, Nanos::ZERO, 1).is_allowed());
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
pub struct LockedCell<S> {
    /// The state and its refund bookkeeping under the cell's one lock, which
    /// serialises refunds with everything else.
    state: CachePadded<Mutex<Locked<S>>>,
}

/// What a [`LockedCell`]'s lock guards.
struct Locked<S> {
    state: S,
    /// What refunds gave back (the ledger's total: see [`RefundLedger`]).
    given_back: u64,
    /// [`StateCell::generation`].
    generation: u64,
    /// The latest refunds that moved a later booking ([`RecentRefunds`], one tag).
    recent: RecentRefunds,
}

impl<S: bytemuck::Pod + Send + Sync> StateCell<S> for LockedCell<S> {
    fn fresh() -> Self {
        LockedCell {
            state: CachePadded::new(Mutex::new(Locked {
                state: bytemuck::Zeroable::zeroed(),
                given_back: 0,
                generation: 0,
                recent: RecentRefunds::starting_at(0),
            })),
        }
    }

    fn load(&self) -> S {
        lock(&self.state).state
    }

    fn store(&self, state: S) {
        lock(&self.state).state = state;
    }

    #[inline]
    fn apply<A: Algorithm<State = S>>(&self, algorithm: &A, now: Nanos, cost: u32) -> Decision {
        self.charge(algorithm, now, cost).0
    }

    #[inline]
    fn charge<A: Algorithm<State = S>>(
        &self,
        algorithm: &A,
        now: Nanos,
        cost: u32,
    ) -> (Decision, Option<(Charged<S>, u64)>) {
        let mut guard = lock(&self.state);
        let (before, noted) = (guard.state, guard.given_back);
        let (decision, next) = algorithm.decide(before, now, cost);
        let charge = next.map(|after| {
            guard.state = after;
            let charge = Charged {
                before,
                after,
                at: now,
                cost,
            };
            (charge, noted)
        });
        (decision, charge)
    }

    fn refund<A: Algorithm<State = S>>(
        &self,
        algorithm: &A,
        charge: &Charged<S>,
        noted: u64,
        generation: u64,
        mut now: impl FnMut() -> Nanos,
    ) -> bool {
        let mut guard = lock(&self.state);
        let locked = &mut *guard;
        if locked.generation != generation {
            return false;
        }
        let (total, before) = (locked.given_back, locked.state);
        let state = &mut locked.state;
        let settled = settle_total(&mut locked.recent, 0, noted, total, |shift| {
            let (next, moved) = algorithm.refund(before, charge, shift, now())?;
            *state = next;
            Some((moved, algorithm.refund_moves_later(before, charge, shift)))
        });
        match settled {
            Some(moved) => {
                locked.given_back = total.wrapping_add(moved);
                true
            }
            None => false,
        }
    }

    fn generation(&self) -> u64 {
        lock(&self.state).generation
    }

    fn reset(&self) {
        self.replace(|_| bytemuck::Zeroable::zeroed());
    }

    fn replace(&self, mut f: impl FnMut(S) -> S) {
        let mut guard = lock(&self.state);
        guard.state = f(guard.state);
        guard.generation = guard.generation.wrapping_add(1);
    }
}

impl<S: bytemuck::Pod + core::fmt::Debug + Send + Sync> core::fmt::Debug for LockedCell<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_tuple("LockedCell").field(&self.load()).finish()
    }
}

/// A direct limiter's refund: `receipt` gives back through `cell` only if `owner`
/// issued it (and for no key), judged at `now()` read after the state is loaded.
pub(crate) fn refund_receipt<S, A, C>(
    cell: &C,
    algorithm: &A,
    owner: crate::receipt::Owner,
    receipt: crate::receipt::Receipt,
    now: impl FnMut() -> Nanos,
) -> bool
where
    S: bytemuck::Pod,
    A: Algorithm<State = S>,
    C: StateCell<S>,
{
    match receipt.charge_for(owner, 0) {
        Some(charge) => cell.refund(
            algorithm,
            &charge,
            receipt.noted(),
            receipt.generation(),
            now,
        ),
        None => false,
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{in_registers, RecentRefunds, RefundLedger, RECENT_REFUNDS};

    /// Refunds one key tagged `tag` noted at `noted`, moving `moved`; the shift it
    /// was given.
    fn refund(
        ledger: &RefundLedger,
        recent: &mut RecentRefunds,
        tag: u64,
        noted: u64,
        moved: u64,
    ) -> u64 {
        let mut seen = None;
        assert!(ledger.settle(recent, tag, noted, |shift| {
            seen = Some(shift);
            Some((moved, true))
        }));
        seen.unwrap()
    }

    /// Equal tags (two keys whose hash tags collide) count as one key: each sees the
    /// other's refunds, the shift of both — never less than its own key's.
    #[test]
    fn colliding_tags_count_each_others_refunds() {
        let ledger = RefundLedger::new();
        let mut recent = RecentRefunds::starting_at(0);
        let noted = ledger.note();
        assert_eq!(refund(&ledger, &mut recent, 7, noted, 100), 0);
        assert_eq!(refund(&ledger, &mut recent, 9, noted, 30), 0);
        assert_eq!(refund(&ledger, &mut recent, 7, noted, 50), 100);
        assert_eq!(refund(&ledger, &mut recent, 7, noted, 1), 150);
        assert_eq!(refund(&ledger, &mut recent, 9, noted, 1), 30);
        // A note taken after the first two sees only what came after it.
        assert_eq!(refund(&ledger, &mut recent, 7, 130, 1), 51);
        assert_eq!(ledger.note(), 183);
    }

    /// The totals wrap: a record that began just below `u64::MAX` still tells what
    /// came after a note from before the wrap and what came before it, and once it
    /// drops a refund from after the note, takes the whole growth since.
    #[test]
    fn the_record_places_totals_across_the_wrap() {
        let ledger = RefundLedger::new();
        ledger
            .given_back
            .store(u64::MAX - 10, crate::sync::Ordering::Relaxed);
        let mut recent = RecentRefunds::starting_at(u64::MAX - 10);
        let before = ledger.note();
        assert_eq!(refund(&ledger, &mut recent, 1, before, 6), 0);
        let noted = ledger.note();
        assert_eq!(noted, u64::MAX - 4);
        assert_eq!(refund(&ledger, &mut recent, 2, noted, 20), 0); // wraps to 15
        assert_eq!(ledger.note(), 15);
        // Key 1's refund came before `noted`; key 2's after it.
        assert_eq!(refund(&ledger, &mut recent, 1, noted, 1), 0);
        assert_eq!(refund(&ledger, &mut recent, 2, noted, 1), 20);
        assert_eq!(refund(&ledger, &mut recent, 2, before, 1), 21);
        // Fill the ring with other keys until the refunds after `before` drop out.
        for _ in 0..RECENT_REFUNDS {
            let total = ledger.note();
            refund(&ledger, &mut recent, 3, total, 2);
        }
        let total = ledger.note();
        assert_eq!(
            refund(&ledger, &mut recent, 2, noted, 1),
            total.wrapping_sub(noted),
            "a record that no longer reaches back must take the whole growth"
        );
    }

    /// A refund that moves nothing is not remembered: it takes no place in the ring
    /// that a later refund of another key would need.
    #[test]
    fn a_refund_that_moves_nothing_is_not_remembered() {
        let ledger = RefundLedger::new();
        let mut recent = RecentRefunds::starting_at(0);
        assert_eq!(refund(&ledger, &mut recent, 1, 0, 5), 0);
        for _ in 0..2 * RECENT_REFUNDS {
            assert!(ledger.settle(&mut recent, 2, 5, |_| Some((0, true))));
            assert!(ledger.settle(&mut recent, 2, 5, |_| Some((3, false))));
            assert!(!ledger.settle(&mut recent, 2, 5, |_| None));
        }
        // Key 1's refund is still in the ring: a refund of key 2 noted before it
        // sees none of it.
        assert_eq!(refund(&ledger, &mut recent, 2, 0, 1), 0);
    }

    /// A direct cell's word shares its padded block with its refund bookkeeping
    /// (session 46; 384 bytes before): 256 bytes, and the word, the generation and
    /// the ledger's total on the block's first 64-byte line.
    #[test]
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    fn a_direct_cell_keeps_its_bookkeeping_in_the_words_block() {
        use super::{AtomicCell, Bookkept, LockedCell, SerialLedger};
        use crate::gcra::GcraState;
        use core::mem::{offset_of, size_of};
        assert_eq!(size_of::<AtomicCell<GcraState>>(), 256);
        assert_eq!(size_of::<LockedCell<GcraState>>(), 256);
        assert_eq!(offset_of!(Bookkept<GcraState>, word), 0);
        let total = offset_of!(Bookkept<GcraState>, ledger)
            + offset_of!(SerialLedger<RecentRefunds>, ledger);
        assert!(
            total + size_of::<RefundLedger>() <= 64,
            "the total at {total}"
        );
        assert!(offset_of!(Bookkept<GcraState>, generation) + 8 <= 64);
    }

    #[test]
    fn in_registers_hands_back_what_the_step_wants_written() {
        assert_eq!(in_registers(Some(5u64), 3), Some(5));
        assert_eq!(in_registers(Some(3u64), 3), Some(3));
        assert_eq!(in_registers(None, 3u64), None);
        assert_eq!(in_registers(Some(0u64), u64::MAX), Some(0));
    }
}
