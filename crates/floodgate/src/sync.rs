//! The one place that names the atomics.
//!
//! Every atomic in the crate comes from here. Under `cfg(loom)` the module swaps in
//! loom's model-checked types, so the same code is explored by `loom::model`; otherwise
//! it re-exports `core`'s atomics and the `atomic` crate's typed [`Atomic<T>`].
//!
//! A downstream crate that runs loom over its own code and builds with
//! `RUSTFLAGS="--cfg loom"` gets floodgate's atomics swapped too (use
//! [`ManualClock`](crate::clock::ManualClock) there: the TSC clock is not available
//! under loom).

#[cfg(not(loom))]
mod imp {
    pub(crate) use atomic::Atomic;
    pub(crate) use core::sync::atomic::{fence, AtomicPtr, AtomicU64, Ordering};
    pub(crate) use crossbeam_epoch::{pin, Guard};
    pub(crate) use portable_atomic::AtomicU128;
    pub(crate) use std::sync::{Mutex, MutexGuard};

    /// Frees `ptr` (a `Box::into_raw`) once no thread pinned now can still read it.
    ///
    /// # Safety
    ///
    /// `ptr` came from `Box::into_raw`, is retired once, and is no longer reachable
    /// from any shared location: only threads pinned before this call may hold it.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn retire<T: Send + 'static>(guard: &Guard, ptr: *mut T) {
        struct SendPtr<T>(*mut T);
        // SAFETY: the pointee is `Send`; the pointer travels to the thread that
        // finally drops it, and nothing else touches it by then.
        unsafe impl<T: Send> Send for SendPtr<T> {}
        let owned = SendPtr(ptr);
        // SAFETY: the caller guarantees the pointer is unreachable for threads that
        // pin after this call; crossbeam-epoch runs the closure only once every thread
        // pinned now has unpinned. `T: 'static` so running it later is sound.
        unsafe {
            guard.defer_unchecked(move || {
                let owned = owned;
                drop(Box::from_raw(owned.0));
            });
        }
    }
}

#[cfg(loom)]
mod imp {
    use core::marker::PhantomData;
    pub(crate) use loom::sync::atomic::{fence, AtomicPtr, AtomicU64, Ordering};
    pub(crate) use loom::sync::{Mutex, MutexGuard};

    /// Epoch stand-in under loom: a pin is nothing and a retired entry is leaked.
    ///
    /// The models check the state hand-off of the keyed table (which never needs the
    /// memory back); memory reclamation itself is crossbeam-epoch's, model-checked there.
    pub(crate) struct Guard;

    /// Pins nothing (see [`Guard`]).
    pub(crate) fn pin() -> Guard {
        Guard
    }

    /// Leaks `ptr` (see [`Guard`]).
    ///
    /// # Safety
    ///
    /// Same contract as the epoch version; leaking is always sound.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn retire<T: Send + 'static>(_guard: &Guard, ptr: *mut T) {
        let _ = ptr;
    }

    /// loom twin of `atomic::Atomic<T>` for 8-byte plain-old-data `T`.
    ///
    /// The value is stored as its bit pattern in a loom `AtomicU64`; `bytemuck`
    /// converts both ways, so every operation is one loom atomic operation.
    pub(crate) struct Atomic<T> {
        bits: AtomicU64,
        _marker: PhantomData<T>,
    }

    impl<T: bytemuck::Pod> Atomic<T> {
        const SIZE_OK: () = assert!(core::mem::size_of::<T>() == 8);

        fn to_bits(v: T) -> u64 {
            let () = Self::SIZE_OK;
            bytemuck::cast(v)
        }

        fn from_bits(v: u64) -> T {
            bytemuck::cast(v)
        }

        pub(crate) fn new(v: T) -> Self {
            Self {
                bits: AtomicU64::new(Self::to_bits(v)),
                _marker: PhantomData,
            }
        }

        pub(crate) fn load(&self, order: Ordering) -> T {
            Self::from_bits(self.bits.load(order))
        }

        pub(crate) fn store(&self, v: T, order: Ordering) {
            self.bits.store(Self::to_bits(v), order);
        }

        pub(crate) fn compare_exchange_weak(
            &self,
            current: T,
            new: T,
            success: Ordering,
            failure: Ordering,
        ) -> Result<T, T> {
            self.bits
                .compare_exchange_weak(Self::to_bits(current), Self::to_bits(new), success, failure)
                .map(Self::from_bits)
                .map_err(Self::from_bits)
        }
    }

    /// loom twin of a 128-bit atomic: loom has none, so a loom mutex makes each
    /// operation one indivisible step. It models the interleavings the compact keyed
    /// table's protocol allows (every slot operation is one atomic step on real
    /// hardware too); it is stronger than `Relaxed`, which the table never relies on
    /// for anything but the slot word itself.
    pub(crate) struct AtomicU128(Mutex<u128>);

    impl AtomicU128 {
        pub(crate) fn new(v: u128) -> Self {
            Self(Mutex::new(v))
        }

        pub(crate) fn load(&self, _order: Ordering) -> u128 {
            *super::lock(&self.0)
        }

        pub(crate) fn store(&self, v: u128, _order: Ordering) {
            *super::lock(&self.0) = v;
        }

        pub(crate) fn compare_exchange_weak(
            &self,
            current: u128,
            new: u128,
            _success: Ordering,
            _failure: Ordering,
        ) -> Result<u128, u128> {
            let mut word = super::lock(&self.0);
            if *word == current {
                *word = new;
                Ok(current)
            } else {
                Err(*word)
            }
        }
    }

    impl<T: bytemuck::Pod + core::fmt::Debug> core::fmt::Debug for Atomic<T> {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            f.debug_tuple("Atomic")
                .field(&self.load(Ordering::Relaxed))
                .finish()
        }
    }
}

pub(crate) use imp::*;

/// Locks a mutex, recovering the data if a panicking thread poisoned it.
///
/// Every state guarded here is a `Copy` word that is written whole, so a panic
/// elsewhere can never leave it half-updated: poisoning carries no information.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(not(loom))]
    {
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    #[cfg(loom)]
    {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A number no earlier call in this process returned: an identity for objects whose
/// address may be reused after they are dropped (a [`Shaper`](crate::Shaper) and the
/// reservations it grants, a limiter and the refund receipts it issues).
///
/// A plain std atomic under every cfg, loom included: the number is an identity, not
/// a synchronisation point, so there is nothing to model-check (and a loom atomic in a
/// `static` could not outlive one model execution). 2^64 numbers never run out: at
/// one per nanosecond they last 584 years.
pub(crate) fn unique_id() -> u64 {
    static NEXT: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);
    // Relaxed: only uniqueness matters, which the RMW's total order gives.
    NEXT.fetch_add(1, core::sync::atomic::Ordering::Relaxed)
}

/// A small per-thread index (0, 1, 2, … in first-use order, never freed): the hot-key
/// detector's thread bit, where two threads sharing one costs detection accuracy
/// only. (The keyed decision counters use [`stripe_index`], which live threads never
/// share.)
///
/// Plain std atomics: the index is an identity, not a synchronisation point. Under
/// loom it is always 0, so that every model execution touches the same words.
#[cfg(loom)]
pub(crate) fn thread_index() -> usize {
    0
}

/// A small per-thread index (0, 1, 2, … in first-use order) for the hot-key detector.
#[cfg(not(loom))]
pub(crate) fn thread_index() -> usize {
    static NEXT: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);
    std::thread_local! {
        static INDEX: core::cell::Cell<usize> = const { core::cell::Cell::new(usize::MAX) };
    }
    INDEX.with(|index| {
        let mut i = index.get();
        if i == usize::MAX {
            // Relaxed: only uniqueness matters, which the RMW's total order gives.
            i = NEXT.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
            index.set(i);
        }
        i
    })
}

/// What [`owner_index`] returns on a thread that has no index (one whose thread-local
/// storage is being torn down): larger than any shard count, so it owns nothing.
pub(crate) const NO_OWNER: usize = usize::MAX;

/// The calling thread's **owner index**: no two live threads hold the same one, and
/// an index freed by a thread's exit goes to the next thread that asks, lowest first,
/// so the live threads that decide hold the smallest indices (0, 1, 2, …). A
/// [`LeasedGcra`](crate::LeasedGcra) lets the thread holding index `i` own shard `i`
/// and write it with plain loads and stores.
///
/// Why a recycled index is still owned by one thread at a time: a thread frees its
/// index in a thread-local destructor, under the registry's mutex, after its last
/// use of the index (a later call on that thread, from another destructor, finds the
/// index gone and gets [`NO_OWNER`]); the next thread takes it under the same mutex.
/// The mutex orders the old owner's last stores before the new owner's first loads.
///
/// Indices are taken only by threads that decide on a leased limiter (direct, or a
/// hot key's). A keyed limiter's decision counters rank threads in a registry of
/// their own ([`stripe_index`]), so a thread that only ever decides on keyed
/// limiters — a start-up check on the main thread — holds no lease shard.
#[cfg(not(loom))]
#[inline]
pub(crate) fn owner_index() -> usize {
    owners::index::<{ owners::LEASES }>()
}

/// The calling thread's owner index if it has taken one, else [`NO_OWNER`]: for
/// reads (a peek), which must not take a shard from the threads that decide.
#[cfg(not(loom))]
#[inline]
pub(crate) fn owner_index_if_taken() -> usize {
    owners::taken::<{ owners::LEASES }>()
}

/// The calling thread's **stripe index**, for a keyed limiter's decision counters:
/// handed out, kept and recycled as [`owner_index`] is (no two live threads hold the
/// same one, lowest free first), from a registry of its own.
#[cfg(not(loom))]
#[inline]
pub(crate) fn stripe_index() -> usize {
    owners::index::<{ owners::STRIPES }>()
}

/// The calling thread's stripe index as it stands: the index if it has taken one,
/// else a number past any stripe count (`usize::MAX - 1` before it asks,
/// [`NO_OWNER`] in its thread-local teardown). A keyed decision's counter reads this
/// and falls back to [`stripe_index`] only when it is past the stripes, so the hot
/// path spends one comparison on both cases.
#[cfg(not(loom))]
#[inline]
pub(crate) fn stripe_index_as_is() -> usize {
    owners::as_is::<{ owners::STRIPES }>()
}

#[cfg(not(loom))]
mod owners {
    use core::cell::Cell;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    use std::sync::Mutex;

    use super::NO_OWNER;

    /// The registry of lease shard owners ([`owner_index`](super::owner_index)).
    pub(super) const LEASES: usize = 0;
    /// The registry of keyed decision counters ([`stripe_index`](super::stripe_index)).
    pub(super) const STRIPES: usize = 1;

    /// Not asked for yet on this thread.
    const UNSET: usize = usize::MAX - 1;

    struct Registry {
        /// The lowest index never handed out.
        next: usize,
        /// Indices freed by exited threads.
        free: BinaryHeap<Reverse<usize>>,
    }

    impl Registry {
        const fn new() -> Mutex<Registry> {
            Mutex::new(Registry {
                next: 0,
                free: BinaryHeap::new(),
            })
        }
    }

    /// One registry per kind of index: each ranks only the threads that asked it.
    static REGISTRY: [Mutex<Registry>; 2] = [Registry::new(), Registry::new()];

    /// Frees the thread's indices when its thread-local storage is torn down.
    struct Release;

    impl Drop for Release {
        fn drop(&mut self) {
            for (kind, registry) in REGISTRY.iter().enumerate() {
                // INDEX has no destructor, so it is still readable here.
                let index = INDEX.with(|i| i[kind].replace(NO_OWNER));
                if index < UNSET {
                    super::lock(registry).free.push(Reverse(index));
                }
            }
        }
    }

    std::thread_local! {
        static INDEX: [Cell<usize>; 2] = const { [Cell::new(UNSET), Cell::new(UNSET)] };
        static RELEASE: Release = const { Release };
    }

    #[inline]
    pub(super) fn index<const KIND: usize>() -> usize {
        let index = INDEX.with(|i| i[KIND].get());
        if index != UNSET {
            index
        } else {
            take(KIND)
        }
    }

    #[inline]
    pub(super) fn as_is<const KIND: usize>() -> usize {
        INDEX.with(|i| i[KIND].get())
    }

    #[inline]
    pub(super) fn taken<const KIND: usize>() -> usize {
        match INDEX.with(|i| i[KIND].get()) {
            UNSET => NO_OWNER,
            index => index,
        }
    }

    #[cold]
    fn take(kind: usize) -> usize {
        // Registers the destructor first: a thread whose storage is already being torn
        // down gets no index (nothing would free it).
        if RELEASE.try_with(|_| ()).is_err() {
            INDEX.with(|i| i[kind].set(NO_OWNER));
            return NO_OWNER;
        }
        let index = {
            let mut registry = super::lock(&REGISTRY[kind]);
            match registry.free.pop() {
                Some(Reverse(index)) => index,
                None => {
                    let index = registry.next;
                    registry.next += 1;
                    index
                }
            }
        };
        INDEX.with(|i| i[kind].set(index));
        index
    }
}

/// Under loom: the model thread's index, taken or not (see [`owner_index`]).
#[cfg(loom)]
pub(crate) fn owner_index_if_taken() -> usize {
    owner_index()
}

/// Under loom: the model thread's number in its execution (the model's main thread
/// is 0, spawned threads 1, 2, … in spawn order), distinct for live threads as the
/// real index is. Model threads never exit while another takes their index, so
/// recycling is not modelled here; `tests/lease_owners.rs` tries it on real threads.
#[cfg(loom)]
pub(crate) fn owner_index() -> usize {
    let id = format!("{:?}", loom::thread::current().id());
    id.trim_start_matches("ThreadId(")
        .trim_end_matches(')')
        .parse()
        .unwrap_or(NO_OWNER)
}

/// Under loom: the model thread's number, as [`owner_index`].
#[cfg(loom)]
pub(crate) fn stripe_index() -> usize {
    owner_index()
}

/// Under loom: the model thread's number, as [`owner_index`].
#[cfg(loom)]
pub(crate) fn stripe_index_as_is() -> usize {
    owner_index()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{owner_index, owner_index_if_taken};
    use std::sync::{Arc, Barrier};

    #[test]
    fn live_threads_hold_distinct_owner_indices() {
        let barrier = Arc::new(Barrier::new(8));
        let mut indices: Vec<usize> = (0..8)
            .map(|_| {
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    let index = owner_index();
                    barrier.wait(); // all eight alive at once
                    assert_eq!(owner_index(), index, "an index is kept for life");
                    index
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        indices.sort_unstable();
        indices.dedup();
        assert_eq!(indices.len(), 8);
    }

    #[test]
    fn a_stripe_index_takes_no_lease_shard() {
        // A thread that counts keyed decisions ranks in the stripes' registry only:
        // the next thread to decide on a leased limiter still finds the lowest lease
        // index free.
        let (counted, owner) = std::thread::spawn(|| {
            let stripe = super::stripe_index();
            (stripe, owner_index_if_taken())
        })
        .join()
        .unwrap();
        assert_ne!(counted, super::NO_OWNER);
        assert_eq!(owner, super::NO_OWNER);
    }

    #[test]
    fn a_read_takes_no_index() {
        let (before, after) = std::thread::spawn(|| {
            let before = owner_index_if_taken();
            let index = owner_index();
            (before, (index, owner_index_if_taken()))
        })
        .join()
        .unwrap();
        assert_eq!(before, super::NO_OWNER);
        assert_eq!(after.0, after.1);
    }

    #[test]
    #[cfg_attr(miri, ignore = "500 threads one after another: slow under Miri")]
    fn an_exited_threads_index_is_taken_again() {
        // One thread at a time: without recycling the last would hold index ≥ 500.
        // Other tests running beside this one hold a few indices at most. Both kinds:
        // a thread's exit frees its lease index and its stripe index.
        for index in [owner_index, super::stripe_index] {
            let last = (0..500)
                .map(|_| std::thread::spawn(index).join().unwrap())
                .max()
                .unwrap();
            assert!(last < 64, "index {last} after 500 threads that each exited");
        }
    }
}
