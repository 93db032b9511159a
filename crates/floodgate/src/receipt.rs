//! [`Receipt`]: what one charge took, so that a refund gives back that and nothing
//! else.
//!
//! A refund that carried only a cost could give back another request's units: the
//! state may have moved to a new window, or the schedule of a GCRA may have been
//! restarted by a later admission, since the charge. A receipt carries what the charge
//! wrote ([`Charged`]), which limiter wrote it (a process-unique id), and for a keyed
//! limiter which key and which incarnation of the key's entry, so that
//! [`Algorithm::refund`](crate::Algorithm::refund) can judge what is still provably the charge's own.

use crate::algorithm::Charged;
use crate::clock::Nanos;
use crate::sync::unique_id;

/// Proof of one charge, handed to a refund (see the [module docs](self)).
///
/// A refund consumes its receipt (it is neither `Clone` nor `Copy`), so a charge is
/// given back at most once; a receipt of another limiter (or another key) gives back
/// nothing. Receipts of a denial or of cost 0 hold no charge and refund nothing.
///
/// # Examples
///
/// ```
/// use floodgate::{ManualClock, Policy, RateLimiter};
/// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(1)?, ManualClock::new());
/// let (decision, receipt) = limiter.charge(1);
/// assert!(decision.is_allowed() && receipt.is_charged());
/// assert!(limiter.refund(receipt)); // the unit is back
/// assert!(limiter.check().is_allowed());
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
#[must_use = "a receipt that is dropped cannot refund its charge"]
#[derive(Debug, PartialEq, Eq)]
pub struct Receipt {
    /// The issuing limiter's id ([`Owner`]).
    owner: u64,
    /// The key's hash (0 for a direct limiter).
    key: u64,
    /// The key's shard removal generation at the charge (0 for a direct limiter).
    generation: u64,
    /// The refund ledger as the charge noted it (see [`Algorithm::refund`]'s shift).
    ///
    /// [`Algorithm::refund`]: crate::Algorithm::refund
    noted: u64,
    /// The charge, its states as bits; `None`: nothing was charged.
    charge: Option<Charged<u64>>,
}

impl Receipt {
    /// A receipt of `owner` for `key` (hash) at `generation` recording `charge` and
    /// the refund ledger it noted.
    pub(crate) fn new<S: bytemuck::Pod>(
        owner: Owner,
        key: u64,
        generation: u64,
        charge: Option<(Charged<S>, u64)>,
    ) -> Receipt {
        let noted = charge.map_or(0, |(_, noted)| noted);
        Receipt {
            owner: owner.0,
            key,
            generation,
            noted,
            charge: charge.map(|(c, _)| Charged {
                before: to_bits(&c.before),
                after: to_bits(&c.after),
                at: c.at,
                cost: c.cost,
            }),
        }
    }

    /// The charge, if this receipt is `owner`'s for `key` and holds one.
    pub(crate) fn charge_for<S: bytemuck::Pod>(
        &self,
        owner: Owner,
        key: u64,
    ) -> Option<Charged<S>> {
        if self.owner != owner.0 || self.key != key {
            return None;
        }
        self.charge.map(|c| Charged {
            before: from_bits(c.before),
            after: from_bits(c.after),
            at: c.at,
            cost: c.cost,
        })
    }

    /// Whether `owner` issued this receipt.
    pub(crate) fn is_owners(&self, owner: Owner) -> bool {
        self.owner == owner.0
    }

    /// The key's shard removal generation at the charge.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// The refund ledger as the charge noted it.
    pub(crate) fn noted(&self) -> u64 {
        self.noted
    }

    /// Whether the charge took anything (an admission of cost ≥ 1).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, RateLimiter};
    /// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(1)?, ManualClock::new());
    /// assert!(!limiter.charge(0).1.is_charged()); // cost 0 takes nothing
    /// assert!(limiter.charge(1).1.is_charged());
    /// assert!(!limiter.charge(1).1.is_charged()); // denied
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn is_charged(&self) -> bool {
        self.charge.is_some()
    }

    /// The units the charge took (0 when it took nothing).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Policy, RateLimiter};
    /// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(5)?, ManualClock::new());
    /// assert_eq!(limiter.charge(3).1.cost(), 3);
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn cost(&self) -> u32 {
        self.charge.map_or(0, |c| c.cost)
    }

    /// The clock reading the charge was decided at, if it took anything.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{ManualClock, Nanos, Policy, RateLimiter};
    /// let limiter = RateLimiter::gcra_with_clock(Policy::per_second(5)?, ManualClock::new());
    /// assert_eq!(limiter.charge_at(Nanos::from_secs(3), 1).1.charged_at(), Some(Nanos::from_secs(3)));
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn charged_at(&self) -> Option<Nanos> {
        self.charge.map(|c| c.at)
    }
}

/// A limiter's process-unique id, which its receipts carry. Drawn from a global
/// counter (not an address, which a later limiter may reuse after a drop).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Owner(u64);

impl Owner {
    /// A fresh id, never handed out before in this process.
    pub(crate) fn new() -> Owner {
        Owner(unique_id())
    }
}

/// A type's bytes zero-extended into a `u64` (`T` of more than 8 bytes does not
/// compile).
#[inline(always)]
pub(crate) fn to_bits<T: bytemuck::NoUninit>(value: &T) -> u64 {
    const {
        assert!(
            core::mem::size_of::<T>() <= 8,
            "a state or key word holds at most 8 bytes"
        )
    };
    let mut bytes = [0u8; 8];
    let src = bytemuck::bytes_of(value);
    bytes[..src.len()].copy_from_slice(src);
    u64::from_ne_bytes(bytes)
}

/// The inverse of [`to_bits`].
#[inline(always)]
pub(crate) fn from_bits<S: bytemuck::Pod>(bits: u64) -> S {
    const {
        assert!(
            core::mem::size_of::<S>() <= 8,
            "a state or key word holds at most 8 bytes"
        )
    };
    let mut state: S = bytemuck::Zeroable::zeroed();
    let len = core::mem::size_of::<S>();
    bytemuck::bytes_of_mut(&mut state).copy_from_slice(&bits.to_ne_bytes()[..len]);
    state
}
