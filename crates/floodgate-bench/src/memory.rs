//! Bytes per key: the heap each keyed contender holds for its keys.
//!
//! [`Counting`] wraps the binary's global allocator (mimalloc in `floodgate bench`,
//! the system allocator in a test) and counts, per thread, the bytes allocated minus
//! the bytes freed. [`footprint`] builds a keyed contender's table
//! ([`matrix::keyed_tables`](crate::matrix::keyed_tables)) for `N` keys, inserts them
//! all, and divides what the table's thread left allocated by `N`.
//!
//! The figures are payload bytes, as asked of the allocator (`Layout::size`): the
//! allocator's own rounding to size classes and its page metadata are not included,
//! and neither is memory a contender gets from the OS without the allocator. They are
//! deterministic for a given key count (no clock, no thread races), unlike time.
//!
//! Counting per thread keeps the count exact while other threads allocate (the test
//! harness runs tests on several threads) and costs the allocator one thread-local
//! add, never a shared write: a binary can keep [`Counting`] installed while it
//! measures time. Every table here is built and filled on the calling thread; a table
//! that allocated on threads of its own would be under-counted.
//!
//! # Examples
//!
//! ```
//! use floodgate_bench::matrix::keyed_tables;
//! use floodgate_bench::memory::{footprint, Counting};
//!
//! #[global_allocator]
//! static GLOBAL: Counting<std::alloc::System> = Counting::new(std::alloc::System);
//!
//! fn main() {
//!     for table in keyed_tables() {
//!         let f = footprint(&table, 1_000);
//!         println!("{:<22} {:>6.1} B/key", f.id, f.bytes_per_key());
//!         assert!(f.bytes_per_key() > 0.0);
//!     }
//! }
//! ```

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::hint::black_box;

use floodgate::{Clock, DefaultClock};

use crate::harness::Budget;
use crate::matrix::{KeyedTable, Setup};

thread_local! {
    /// Bytes allocated minus bytes freed by this thread through [`Counting`]
    /// (wrapping: a thread may free what another allocated).
    static NET: Cell<isize> = const { Cell::new(0) };
}

/// Adds `bytes` (negative: freed) to this thread's count. A thread whose locals are
/// gone (it is exiting) counts nothing.
fn count(bytes: isize) {
    let _ = NET.try_with(|net| net.set(net.get().wrapping_add(bytes)));
}

/// A global allocator that forwards every call to `A` unchanged and counts, per
/// thread, the bytes allocated minus the bytes freed ([`allocated_by`] reads it).
///
/// Install it around whatever allocator the binary uses:
///
/// ```
/// use floodgate_bench::memory::{allocated_by, Counting};
///
/// #[global_allocator]
/// static GLOBAL: Counting<std::alloc::System> = Counting::new(std::alloc::System);
///
/// fn main() {
///     let (buffer, bytes) = allocated_by(|| vec![0u8; 4096]);
///     assert_eq!(bytes, 4096);
///     drop(buffer);
/// }
/// ```
///
/// It needs native thread-locals (Linux, macOS, Windows): a thread-local that
/// allocated on first use would call back into the allocator.
#[derive(Debug)]
pub struct Counting<A> {
    inner: A,
}

impl<A> Counting<A> {
    /// Counts what `inner` allocates.
    pub const fn new(inner: A) -> Counting<A> {
        Counting { inner }
    }
}

// SAFETY: every method forwards to `inner` with the same arguments and returns its
// result unchanged, so `inner`'s guarantees are ours; the counting touches only a
// thread-local `Cell` (no allocation, no reentrancy).
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: our caller upholds `alloc`'s contract, which is `inner`'s.
        let ptr = unsafe { self.inner.alloc(layout) };
        if !ptr.is_null() {
            count(layout.size() as isize);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: our caller upholds `alloc_zeroed`'s contract, which is `inner`'s.
        let ptr = unsafe { self.inner.alloc_zeroed(layout) };
        if !ptr.is_null() {
            count(layout.size() as isize);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, that is from `inner`, with `layout`.
        unsafe { self.inner.dealloc(ptr, layout) };
        count(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from `inner` with `layout`; our caller upholds the rest
        // of `realloc`'s contract. Forwarding keeps `inner`'s in-place growth.
        let moved = unsafe { self.inner.realloc(ptr, layout, new_size) };
        if !moved.is_null() {
            count((new_size as isize).wrapping_sub(layout.size() as isize));
        }
        moved
    }
}

/// Runs `f` and returns its result with the bytes this thread allocated and did not
/// free meanwhile (negative if it freed more than it allocated). Zero for
/// everything when no [`Counting`] is the global allocator ([`counting`] tells).
///
/// # Examples
///
/// ```
/// use floodgate_bench::memory::{allocated_by, Counting};
///
/// #[global_allocator]
/// static GLOBAL: Counting<std::alloc::System> = Counting::new(std::alloc::System);
///
/// fn main() {
///     let (_, bytes) = allocated_by(|| {
///         let kept = vec![1u64; 100];
///         let _dropped = vec![0u8; 1 << 20];
///         kept
///     });
///     assert_eq!(bytes, 800);
/// }
/// ```
pub fn allocated_by<T>(f: impl FnOnce() -> T) -> (T, isize) {
    let before = NET.with(Cell::get);
    let out = f();
    (out, NET.with(Cell::get).wrapping_sub(before))
}

/// Whether this thread's allocations are counted: a [`Counting`] is the binary's
/// global allocator.
///
/// # Examples
///
/// ```
/// // A doctest binary keeps the system allocator.
/// assert!(!floodgate_bench::memory::counting());
/// ```
pub fn counting() -> bool {
    allocated_by(|| black_box(Box::new(0u64))).1 == 8
}

/// What one keyed table holds at a key count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Footprint {
    /// The table ([`KeyedTable::id`]).
    pub id: &'static str,
    /// Keys inserted.
    pub keys: u64,
    /// Bytes allocated and not freed while building the table and inserting the keys.
    pub bytes: isize,
}

impl Footprint {
    /// Bytes per key (0 for no keys).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_bench::memory::Footprint;
    /// let f = Footprint { id: "floodgate_inline", keys: 1_000, bytes: 18_500 };
    /// assert_eq!(f.bytes_per_key(), 18.5);
    /// ```
    pub fn bytes_per_key(&self) -> f64 {
        if self.keys == 0 {
            0.0
        } else {
            self.bytes as f64 / self.keys as f64
        }
    }
}

/// Builds `table` for `keys` keys, inserts them all, and counts the bytes it holds
/// (the table is dropped before returning). A build at one key comes first, uncounted,
/// so that what is allocated once per process or thread (the clock's calibration, an
/// epoch's registration) is not charged to the keys.
///
/// Counts nothing unless a [`Counting`] is the global allocator ([`counting`]).
///
/// # Examples
///
/// ```
/// use floodgate_bench::matrix::keyed_tables;
/// use floodgate_bench::memory::{footprint, Counting};
///
/// #[global_allocator]
/// static GLOBAL: Counting<std::alloc::System> = Counting::new(std::alloc::System);
///
/// fn main() {
///     let inline = keyed_tables().into_iter().find(|t| t.id == "floodgate_inline").unwrap();
///     let f = footprint(&inline, 10_000);
///     assert!(f.bytes_per_key() >= 16.0); // a 16-byte slot per key, and then some
/// }
/// ```
pub fn footprint(table: &KeyedTable, keys: u64) -> Footprint {
    let setup = |keys| Setup {
        threads: 1,
        keys,
        budget: Budget::Ops(0),
        seed: 0,
    };
    let _ = DefaultClock::new().now();
    drop((table.build)(&setup(1)));
    let (built, bytes) = allocated_by(|| (table.build)(&setup(keys)));
    drop(built);
    Footprint {
        id: table.id,
        keys,
        bytes,
    }
}
