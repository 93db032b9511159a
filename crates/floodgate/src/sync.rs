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
    pub(crate) use core::sync::atomic::{AtomicU64, Ordering};
    pub(crate) use std::sync::{Mutex, MutexGuard};
}

#[cfg(loom)]
mod imp {
    use core::marker::PhantomData;
    pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
    pub(crate) use loom::sync::{Mutex, MutexGuard};

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
