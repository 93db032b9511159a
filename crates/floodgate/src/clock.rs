//! Time: [`Nanos`], the [`Clock`] trait and its three clocks.
//!
//! Every algorithm takes `now` as an argument, so the clock is injected, never read
//! inside a transition. A decision costs exactly one clock read.
//!
//! | clock | source | cost | use |
//! |---|---|---|---|
//! | [`DefaultClock`] | quanta's TSC, anchored once to the Unix epoch, clamped per thread | one `rdtsc` + a thread-local compare | production |
//! | [`StdClock`] | `std::time::Instant` (system-wide monotonic) | one `clock_gettime` | where the TSC is not trusted |
//! | [`ManualClock`] | a shared counter moved by hand | one atomic load | tests, simulation, loom, Miri |
//!
//! # Time never moves a state backwards
//!
//! quanta's TSC reading can be *earlier* on another core than a reading just taken on
//! this one (unsynchronised TSCs; governor issue #299 is this bug in the wild). Two
//! defences stack:
//!
//! 1. every transition is monotone in its state: GCRA keeps `max(TAT, now)`, a window
//!    state never returns to an older window. An early reading can only make one
//!    decision slightly stricter; it never rewinds what others wrote.
//! 2. [`DefaultClock`] clamps per thread: each thread keeps its last reading in a
//!    thread-local and never returns less. This costs a thread-local load, a compare and
//!    a store into the thread's own cache line — no shared write on the hot path.
//!
//! What remains is the cross-core skew itself: two threads may see instants that
//! differ by the TSC offset between their cores (typically well under a microsecond on
//! one socket with an invariant TSC). A request on a "late" core is then judged up to
//! that skew early, which is never more permissive than the state other cores wrote.

use crate::sync::{AtomicU64, Ordering};
use core::fmt;
use core::time::Duration;

/// Nanoseconds since a clock's origin (the Unix epoch for [`DefaultClock`] and
/// [`StdClock`], zero for a fresh [`ManualClock`]).
///
/// A `u64` of nanoseconds spans 584 years. Converting any [`Duration`] saturates
/// instead of panicking, so `Nanos::from(Duration::MAX) == Nanos::MAX`.
///
/// # Examples
///
/// ```
/// use floodgate::Nanos;
/// use std::time::Duration;
///
/// let t = Nanos::from(Duration::from_millis(1500));
/// assert_eq!(t.as_u64(), 1_500_000_000);
/// assert_eq!(Nanos::from(Duration::MAX), Nanos::MAX);
/// assert_eq!(Duration::from(t), Duration::from_millis(1500));
/// ```
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, bytemuck::Pod, bytemuck::Zeroable,
)]
#[repr(transparent)]
pub struct Nanos(u64);

impl Nanos {
    /// The origin.
    pub const ZERO: Nanos = Nanos(0);
    /// The last representable instant (about 584 years after the origin).
    pub const MAX: Nanos = Nanos(u64::MAX);

    /// Wraps a count of nanoseconds.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(floodgate::Nanos::new(5).as_u64(), 5);
    /// ```
    #[inline]
    pub const fn new(nanos: u64) -> Nanos {
        Nanos(nanos)
    }

    /// The count of nanoseconds.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(floodgate::Nanos::from_secs(2).as_u64(), 2_000_000_000);
    /// ```
    #[inline]
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// Whole seconds, saturating at [`Nanos::MAX`].
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::Nanos;
    /// assert_eq!(Nanos::from_secs(u64::MAX), Nanos::MAX);
    /// ```
    #[inline]
    pub const fn from_secs(secs: u64) -> Nanos {
        Nanos(secs.saturating_mul(1_000_000_000))
    }

    /// Converts a [`Duration`], saturating at [`Nanos::MAX`]; never panics.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::Nanos;
    /// use std::time::Duration;
    /// assert_eq!(Nanos::from_duration(Duration::from_secs(1)).as_u64(), 1_000_000_000);
    /// assert_eq!(Nanos::from_duration(Duration::MAX), Nanos::MAX);
    /// ```
    #[inline]
    pub const fn from_duration(d: Duration) -> Nanos {
        let n = d.as_nanos();
        if n > u64::MAX as u128 {
            Nanos::MAX
        } else {
            Nanos(n as u64)
        }
    }

    /// This instant (or span) as a [`Duration`].
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::Nanos;
    /// use std::time::Duration;
    /// assert_eq!(Nanos::new(1_000).as_duration(), Duration::from_micros(1));
    /// ```
    #[inline]
    pub const fn as_duration(self) -> Duration {
        Duration::from_nanos(self.0)
    }

    /// `self + d`, saturating at [`Nanos::MAX`].
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::Nanos;
    /// use std::time::Duration;
    /// assert_eq!(Nanos::MAX.saturating_add(Duration::from_secs(1)), Nanos::MAX);
    /// ```
    #[inline]
    #[must_use]
    pub const fn saturating_add(self, d: Duration) -> Nanos {
        Nanos(self.0.saturating_add(Nanos::from_duration(d).0))
    }

    /// The span from `earlier` to `self`, or zero if `earlier` is later.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::Nanos;
    /// assert_eq!(Nanos::new(10).saturating_since(Nanos::new(4)), Nanos::new(6));
    /// assert_eq!(Nanos::new(4).saturating_since(Nanos::new(10)), Nanos::ZERO);
    /// ```
    #[inline]
    #[must_use]
    pub const fn saturating_since(self, earlier: Nanos) -> Nanos {
        Nanos(self.0.saturating_sub(earlier.0))
    }
}

impl From<Duration> for Nanos {
    #[inline]
    fn from(d: Duration) -> Nanos {
        Nanos::from_duration(d)
    }
}

impl From<Nanos> for Duration {
    #[inline]
    fn from(n: Nanos) -> Duration {
        n.as_duration()
    }
}

impl fmt::Debug for Nanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ns", self.0)
    }
}

/// A source of [`Nanos`].
///
/// Implementations must be cheap (this is read once per decision) and should never
/// go backwards. A decision stays exact if they do (every transition is monotone in
/// its state): a backwards step only makes decisions stricter than they need to be.
/// A **refund** is exact only when every admission it sees was decided at a reading
/// no later than the refund's own (it reads the clock after loading the state, which
/// gives this with any clock that is monotone across threads). A clock that goes back
/// between an admission and a later refund — or an instant passed to a `*_at` method
/// ahead of the clock — can let that refund give back schedule the admission had
/// already passed: at most the refunded charge's own units, once.
///
/// # Examples
///
/// A clock of your own, e.g. driven by an event loop's cached "now":
///
/// ```
/// use floodgate::{Clock, Nanos};
/// use std::sync::atomic::{AtomicU64, Ordering};
///
/// struct Cached(AtomicU64);
/// impl Clock for Cached {
///     fn now(&self) -> Nanos {
///         Nanos::new(self.0.load(Ordering::Relaxed))
///     }
/// }
/// assert_eq!(Cached(AtomicU64::new(7)).now(), Nanos::new(7));
/// ```
pub trait Clock: Send + Sync {
    /// The current instant.
    fn now(&self) -> Nanos;
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    #[inline]
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| Nanos::from_duration(d).as_u64())
}

struct TscAnchor {
    clock: quanta::Clock,
    raw_origin: u64,
    unix_origin: u64,
}

static TSC_ANCHOR: std::sync::OnceLock<TscAnchor> = std::sync::OnceLock::new();

std::thread_local! {
    /// This thread's last [`DefaultClock`] reading: the per-thread clamp.
    static LAST_TSC_READING: core::cell::Cell<u64> = const { core::cell::Cell::new(0) };
}

/// The production clock: quanta's TSC, anchored once to the Unix epoch, clamped per
/// thread so that no thread ever sees it go backwards.
///
/// The anchor (one `SystemTime` reading paired with one TSC reading, plus quanta's
/// calibration) is taken once per process, by the first [`DefaultClock::new`], and
/// shared by every `DefaultClock`; a reading is then
/// `unix_origin + (tsc − tsc_origin) · scale`. Fixed windows therefore align to
/// wall-clock seconds, minutes, hours and days, and a reset instant is a Unix time.
/// Later wall-clock adjustments (NTP slews, leap seconds) do not move it.
///
/// The clock holds a reference to that anchor, so a reading does not check whether
/// the anchor exists yet.
///
/// See the [module docs](self) for the per-thread clamp and the cross-core skew
/// that remains. Not usable under Miri (quanta executes CPUID): use [`ManualClock`].
///
/// # Examples
///
/// ```
/// use floodgate::{Clock, DefaultClock};
/// let clock = DefaultClock::new();
/// let a = clock.now();
/// let b = clock.now();
/// assert!(b >= a);
/// // Anchored to the Unix epoch: after 2020-01-01.
/// assert!(a.as_u64() > 1_577_836_800_000_000_000);
/// ```
#[derive(Clone, Copy)]
pub struct DefaultClock {
    anchor: &'static TscAnchor,
}

impl DefaultClock {
    /// The process-wide TSC clock (calibrated and anchored by the first call).
    pub fn new() -> DefaultClock {
        let anchor = TSC_ANCHOR.get_or_init(|| {
            let clock = quanta::Clock::new();
            let raw_origin = clock.raw();
            TscAnchor {
                clock,
                raw_origin,
                unix_origin: unix_now(),
            }
        });
        DefaultClock { anchor }
    }
}

impl Default for DefaultClock {
    fn default() -> Self {
        DefaultClock::new()
    }
}

impl fmt::Debug for DefaultClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DefaultClock")
            .field("unix_origin", &Nanos(self.anchor.unix_origin))
            .finish_non_exhaustive()
    }
}

impl Clock for DefaultClock {
    #[inline]
    fn now(&self) -> Nanos {
        let anchor = self.anchor;
        let since = anchor
            .clock
            .delta_as_nanos(anchor.raw_origin, anchor.clock.raw());
        let reading = anchor.unix_origin.saturating_add(since);
        let clamped = LAST_TSC_READING.with(|last| {
            let v = reading.max(last.get());
            last.set(v);
            v
        });
        Nanos(clamped)
    }
}

/// A clock on `std::time::Instant`: monotonic system-wide (no cross-core skew), anchored
/// to the Unix epoch when created; each reading is a `clock_gettime` call, slower than
/// the TSC.
///
/// # Examples
///
/// ```
/// use floodgate::{Clock, StdClock};
/// let clock = StdClock::new();
/// assert!(clock.now() <= clock.now());
/// ```
#[derive(Clone, Copy, Debug)]
pub struct StdClock {
    origin: std::time::Instant,
    unix_origin: u64,
}

impl StdClock {
    /// A clock anchored to the Unix epoch now.
    pub fn new() -> StdClock {
        StdClock {
            origin: std::time::Instant::now(),
            unix_origin: unix_now(),
        }
    }
}

impl Default for StdClock {
    fn default() -> Self {
        StdClock::new()
    }
}

impl Clock for StdClock {
    #[inline]
    fn now(&self) -> Nanos {
        Nanos(self.unix_origin).saturating_add(self.origin.elapsed())
    }
}

/// A clock moved by hand, for tests and simulation.
///
/// Clones share one reading (an `Arc` of an atomic), so a test can hold one clone and
/// give another to a limiter. It never goes backwards: [`set`](ManualClock::set) to an
/// earlier instant is ignored. Works under loom and Miri.
///
/// # Examples
///
/// ```
/// use floodgate::{Clock, ManualClock, Nanos};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let shared = clock.clone();
/// clock.advance(Duration::from_secs(2));
/// assert_eq!(shared.now(), Nanos::from_secs(2));
/// clock.set(Nanos::from_secs(1)); // earlier: ignored
/// assert_eq!(shared.now(), Nanos::from_secs(2));
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    now: std::sync::Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at [`Nanos::ZERO`].
    pub fn new() -> ManualClock {
        ManualClock::starting_at(Nanos::ZERO)
    }

    /// A clock at `t`.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Clock, ManualClock, Nanos};
    /// assert_eq!(ManualClock::starting_at(Nanos::new(9)).now(), Nanos::new(9));
    /// ```
    pub fn starting_at(t: Nanos) -> ManualClock {
        ManualClock {
            now: std::sync::Arc::new(AtomicU64::new(t.0)),
        }
    }

    /// Moves the clock forward by `d` (saturating at [`Nanos::MAX`]) and returns the
    /// new reading.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Nanos};
    /// use std::time::Duration;
    /// let clock = ManualClock::new();
    /// assert_eq!(clock.advance(Duration::from_nanos(3)), Nanos::new(3));
    /// ```
    pub fn advance(&self, d: Duration) -> Nanos {
        let step = Nanos::from_duration(d).0;
        // Relaxed: the reading publishes no other memory; concurrent advances add up
        // because each is one read-modify-write.
        let mut cur = self.now.load(Ordering::Relaxed);
        loop {
            let next = cur.saturating_add(step);
            match self
                .now
                .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Nanos(next),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Moves the clock to `t` if `t` is later than its reading; returns the reading
    /// after the call.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Nanos};
    /// let clock = ManualClock::new();
    /// assert_eq!(clock.set(Nanos::new(10)), Nanos::new(10));
    /// assert_eq!(clock.set(Nanos::new(5)), Nanos::new(10));
    /// ```
    pub fn set(&self, t: Nanos) -> Nanos {
        let before = self.now.fetch_max(t.0, Ordering::Relaxed);
        Nanos(before.max(t.0))
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> Nanos {
        Nanos(self.now.load(Ordering::Relaxed))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn duration_conversions_saturate() {
        assert_eq!(Nanos::from(Duration::MAX), Nanos::MAX);
        assert_eq!(
            Nanos::from(Duration::from_secs(u64::MAX / 1_000_000_000 + 1)),
            Nanos::MAX
        );
        assert_eq!(Nanos::from(Duration::new(1, 5)).as_u64(), 1_000_000_005);
        assert_eq!(Nanos::MAX.saturating_add(Duration::MAX), Nanos::MAX);
        assert_eq!(Duration::from(Nanos::MAX), Duration::from_nanos(u64::MAX));
    }

    #[test]
    fn manual_clock_never_goes_backwards() {
        let c = ManualClock::starting_at(Nanos::new(100));
        assert_eq!(c.set(Nanos::new(50)), Nanos::new(100));
        assert_eq!(c.now(), Nanos::new(100));
        assert_eq!(c.advance(Duration::MAX), Nanos::MAX);
        assert_eq!(c.advance(Duration::from_secs(1)), Nanos::MAX);
    }

    #[test]
    #[cfg_attr(miri, ignore = "quanta executes CPUID")]
    fn default_clock_is_monotone_per_thread_and_anchored() {
        let c = DefaultClock::new();
        let wall = unix_now();
        let mut prev = c.now();
        for _ in 0..10_000 {
            let t = c.now();
            assert!(t >= prev);
            prev = t;
        }
        // Anchored to the Unix epoch: within a minute of the system clock.
        assert!(prev.as_u64().abs_diff(wall) < 60_000_000_000);
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Instant under Miri is slow but fine; kept for symmetry"
    )]
    fn std_clock_is_anchored() {
        let c = StdClock::new();
        assert!(c.now().as_u64().abs_diff(unix_now()) < 60_000_000_000);
    }
}
