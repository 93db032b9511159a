//! Keys: the borrowed forms a lookup may take ([`Lookup`], [`Pair`]) and the keys
//! that encode into the 64 bits of an inline slot ([`InlineKey`], IP addresses,
//! [`Ipv6Prefix`]).

use core::borrow::Borrow;
use core::hash::{Hash, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A form of key `K` that a lookup may take without building a `K`: it hashes as the
/// equal `K` hashes, compares with a stored `K`, and makes a `K` only when a new key
/// is inserted. So a check on a key already present allocates nothing.
///
/// Every `Q` that `K` borrows as implements it (`str` for `String`, `[u8]` for
/// `Vec<u8>`, `K` itself), and [`Pair`] for pairs of such forms (`(IpAddr, String)`
/// looked up by `Pair(&ip, "alice")`). Implement it for a borrowed form of your own
/// key type; `hash` must then feed the hasher exactly what `K`'s `hash` feeds it for
/// the equal key.
///
/// # Examples
///
/// ```
/// use floodgate::{KeyedLimiter, Pair, Policy};
/// use std::net::IpAddr;
/// let keyed: KeyedLimiter<(IpAddr, String)> = KeyedLimiter::gcra(Policy::per_hour(1)?);
/// let ip: IpAddr = "192.0.2.7".parse()?;
/// assert!(keyed.check(&Pair(&ip, "alice")).is_allowed()); // inserts (ip, "alice")
/// assert!(!keyed.check(&Pair(&ip, "alice")).is_allowed()); // found: no allocation
/// assert!(!keyed.check(&(ip, "alice".to_owned())).is_allowed()); // the owned key too
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Lookup<K>: Hash {
    /// Whether `key` is the key this form stands for.
    fn matches(&self, key: &K) -> bool;
    /// The owned key, for an insert.
    fn to_key(&self) -> K;
}

impl<K, Q> Lookup<K> for Q
where
    K: Borrow<Q>,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
    #[inline(always)]
    fn matches(&self, key: &K) -> bool {
        key.borrow() == self
    }

    fn to_key(&self) -> K {
        self.to_owned()
    }
}

/// A borrowed pair: looks up a tuple key `(A, B)` from borrowed parts, e.g.
/// `Pair(&ip, user)` with `user: &str` for a `(IpAddr, String)` key, without
/// allocating (see [`Lookup`]).
///
/// # Examples
///
/// ```
/// use floodgate::{Lookup, Pair};
/// let key = (7u64, "bob".to_owned());
/// assert!(Pair(&7u64, "bob").matches(&key));
/// assert_eq!(Pair(&7u64, "bob").to_key(), key);
/// ```
#[derive(Debug)]
pub struct Pair<'a, A: ?Sized, B: ?Sized>(pub &'a A, pub &'a B);

impl<A: ?Sized, B: ?Sized> Clone for Pair<'_, A, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A: ?Sized, B: ?Sized> Copy for Pair<'_, A, B> {}

/// As a tuple hashes: the first part, then the second.
impl<A: Hash + ?Sized, B: Hash + ?Sized> Hash for Pair<'_, A, B> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
        self.1.hash(state);
    }
}

impl<KA, KB, A, B> Lookup<(KA, KB)> for Pair<'_, A, B>
where
    A: Lookup<KA> + ?Sized,
    B: Lookup<KB> + ?Sized,
{
    #[inline(always)]
    fn matches(&self, key: &(KA, KB)) -> bool {
        self.0.matches(&key.0) && self.1.matches(&key.1)
    }

    fn to_key(&self) -> (KA, KB) {
        (self.0.to_key(), self.1.to_key())
    }
}

/// A key that encodes into 64 bits, injectively (two different keys never share an
/// encoding): the keys of [`Inline`](super::Inline) storage, which keeps the
/// encoding beside the state in one 128-bit slot.
///
/// Implemented for the integers of at most 64 bits, `bool`, `char`, `[u8; N]` for
/// `N ≤ 8`, [`Ipv4Addr`], [`IpAddr`] and [`Ipv6Prefix`].
///
/// # Examples
///
/// ```
/// use floodgate::InlineKey;
/// assert_eq!(7u64.to_bits(), 7);
/// assert_ne!([10u8, 0, 0, 1].to_bits(), [10u8, 0, 0, 2].to_bits());
/// ```
pub trait InlineKey: Copy + Send + Sync + 'static {
    /// The key's 64-bit encoding.
    fn to_bits(&self) -> u64;
}

macro_rules! inline_ints {
    ($($t:ty),*) => {$(
        impl InlineKey for $t {
            #[inline(always)]
            fn to_bits(&self) -> u64 {
                crate::receipt::to_bits(self)
            }
        }
    )*};
}

inline_ints!(u8, u16, u32, u64, i8, i16, i32, i64, usize, isize);

impl InlineKey for bool {
    #[inline(always)]
    fn to_bits(&self) -> u64 {
        u64::from(*self)
    }
}

impl InlineKey for char {
    #[inline(always)]
    fn to_bits(&self) -> u64 {
        u64::from(u32::from(*self))
    }
}

impl<const N: usize> InlineKey for [u8; N] {
    #[inline(always)]
    fn to_bits(&self) -> u64 {
        const { assert!(N <= 8, "an inline key holds at most 8 bytes") };
        let mut bytes = [0u8; 8];
        bytes[..N].copy_from_slice(self);
        u64::from_le_bytes(bytes)
    }
}

/// An IPv4 address, exactly: its 32 bits.
impl InlineKey for Ipv4Addr {
    #[inline(always)]
    fn to_bits(&self) -> u64 {
        u64::from(u32::from(*self))
    }
}

/// The top 32 bits of an IPv4 address's [`IpAddr`] encoding: the /32 `ffff:ffff::`,
/// inside IPv6 multicast (`ff00::/8`), which no client connects from.
const V4_IN_MULTICAST: u64 = 0xffff_ffff << 32;

/// An IP address from a dual-stack socket: IPv4 exactly, IPv6 by its /64 prefix.
///
/// An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) is the IPv4 address
/// ([`IpAddr::to_canonical`]), so IPv4 clients on a dual-stack socket keep their own
/// keys. An IPv6 address is its /64 prefix (its top 64 bits: one host usually holds a
/// whole /64, and adjacent /64s are often other customers'), an IPv4 address its 32
/// bits under the top 32 bits all set — the /64 prefix `ffff:ffff:a.b:c.d::` it
/// would have inside `ffff:ffff::/32`. So only IPv6 addresses inside
/// `ffff:ffff::/32` share keys with IPv4 ones: multicast addresses (`ff00::/8`),
/// which are never a packet's source, so no client connects from one. No 64-bit
/// encoding can hold every IPv4 address and every /64 apart; this one gives the
/// collision to addresses no client has and no grouping yields: the unspecified
/// `::` and `0.0.0.0` (a fallback key), the loopback `::1`, and the group address
/// of a coarse IPv6 grouping (`::` for /0: a prefix under /32 clears the last of
/// the top 32 bits) are keys apart from every IPv4 address's. Key an IPv6-only
/// listener on [`Ipv6Prefix`] for another prefix length (at most 64 bits).
///
/// # Examples
///
/// ```
/// use floodgate::InlineKey;
/// use std::net::IpAddr;
/// let v4: IpAddr = "192.0.2.7".parse()?;
/// let mapped: IpAddr = "::ffff:192.0.2.7".parse()?;
/// assert_eq!(v4.to_bits(), mapped.to_bits()); // the same client
/// let a: IpAddr = "2001:db8::1".parse()?;
/// let b: IpAddr = "2001:db8::2".parse()?;
/// let next: IpAddr = "2001:db8:0:1::1".parse()?;
/// assert_eq!(a.to_bits(), b.to_bits()); // one /64: one key
/// assert_ne!(a.to_bits(), next.to_bits()); // the adjacent /64: another
/// assert_ne!(a.to_bits(), v4.to_bits());
/// let (any_v4, any_v6): (IpAddr, IpAddr) = ("0.0.0.0".parse()?, "::".parse()?);
/// assert_ne!(any_v4.to_bits(), any_v6.to_bits()); // two keys, as on the heap
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
impl InlineKey for IpAddr {
    #[inline(always)]
    fn to_bits(&self) -> u64 {
        match self.to_canonical() {
            IpAddr::V4(v4) => V4_IN_MULTICAST | u64::from(u32::from(v4)),
            IpAddr::V6(v6) => (u128::from(v6) >> 64) as u64,
        }
    }
}

/// An IPv6 key grouped by a prefix of at most 64 bits (/64 by default: one host
/// typically owns a whole /64), stored inline.
///
/// Two addresses with the same prefix are the same key. Keep one prefix length per
/// limiter: the encoding is the prefix's bits, so `2001:db8::/32` and
/// `2001:db8::/48` would be the same key.
///
/// # Examples
///
/// ```
/// use floodgate::{Gcra, Ipv6Prefix, KeyedBuilder, Policy};
/// use std::net::Ipv6Addr;
/// let per_net = KeyedBuilder::new(Gcra::new(Policy::per_hour(1)?)).build_inline::<Ipv6Prefix>()?;
/// let a: Ipv6Addr = "2001:db8:0:1::1".parse()?;
/// let b: Ipv6Addr = "2001:db8:0:1::ffff".parse()?;
/// assert!(per_net.check(&Ipv6Prefix::new(a)).is_allowed());
/// assert!(!per_net.check(&Ipv6Prefix::new(b)).is_allowed()); // the same /64
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ipv6Prefix(u64);

/// A prefix length over 64 bits ([`Ipv6Prefix::with_len`]).
///
/// # Examples
///
/// ```
/// use floodgate::Ipv6Prefix;
/// assert!(Ipv6Prefix::with_len("2001:db8::1".parse()?, 65).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixTooLong {
    /// The length asked for.
    pub len: u8,
}

impl core::fmt::Display for PrefixTooLong {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "an inline IPv6 prefix holds at most 64 bits, not {}",
            self.len
        )
    }
}

impl std::error::Error for PrefixTooLong {}

impl Ipv6Prefix {
    /// The /64 of `addr`.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::Ipv6Prefix;
    /// assert_eq!(Ipv6Prefix::new("2001:db8::1".parse()?), Ipv6Prefix::new("2001:db8::2".parse()?));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(addr: Ipv6Addr) -> Ipv6Prefix {
        Ipv6Prefix((u128::from(addr) >> 64) as u64)
    }

    /// The first `len` bits of `addr` (`len ≤ 64`; 0 puts every address in one key).
    ///
    /// # Errors
    ///
    /// [`PrefixTooLong`] for `len > 64`.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::Ipv6Prefix;
    /// let a = Ipv6Prefix::with_len("2001:db8:1::1".parse()?, 32)?;
    /// let b = Ipv6Prefix::with_len("2001:db8:2::1".parse()?, 32)?;
    /// assert_eq!(a, b);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_len(addr: Ipv6Addr, len: u8) -> Result<Ipv6Prefix, PrefixTooLong> {
        if len > 64 {
            return Err(PrefixTooLong { len });
        }
        let top = (u128::from(addr) >> 64) as u64;
        let mask = if len == 0 { 0 } else { u64::MAX << (64 - len) };
        Ok(Ipv6Prefix(top & mask))
    }

    /// The prefix's bits, high-aligned (the address's first 64 bits, masked).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::Ipv6Prefix;
    /// assert_eq!(Ipv6Prefix::new("2001:db8::1".parse()?).bits(), 0x2001_0db8_0000_0000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bits(&self) -> u64 {
        self.0
    }
}

impl InlineKey for Ipv6Prefix {
    #[inline(always)]
    fn to_bits(&self) -> u64 {
        self.0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ip_encoding_tells_the_families_apart_outside_multicast() {
        // IPv4: the 32 bits, exactly, under the top 32 bits all set.
        for v4 in ["0.0.0.0", "255.255.255.255", "10.0.0.1", "192.0.2.7"] {
            assert_eq!(ip(v4).to_bits() >> 32, 0xffff_ffff, "{v4}");
            assert_eq!(
                ip(v4).to_bits() as u32,
                u32::from(v4.parse::<Ipv4Addr>().unwrap())
            );
        }
        // IPv6 outside `ffff:ffff::/32` (every address a client can connect from,
        // and every group address of a grouping under /32): the top 32 bits of its
        // encoding are not all set, so it is no IPv4 address's.
        for v6 in [
            "2001:db8::1",
            "ff02::1",
            "fe80::1",
            "fc00::1",
            "64:ff9b::c000:207",
            "0:1::1",
            "::",
            "::1",
            "::a00:1",
            "::ffff:0:a00:1",
        ] {
            assert_ne!(ip(v6).to_bits() >> 32, 0xffff_ffff, "{v6}");
        }
        // NAT64's embedding of 192.0.2.7 is another key than 192.0.2.7 itself, and
        // the unspecified, loopback and IPv4-compatible addresses (one /64, `::`)
        // are no IPv4 address's key, `0.0.0.0`'s included.
        assert_ne!(ip("64:ff9b::c000:207").to_bits(), ip("192.0.2.7").to_bits());
        for v6 in ["::", "::1", "::a00:1"] {
            assert_eq!(ip(v6).to_bits(), 0, "{v6}");
            assert_ne!(ip(v6).to_bits(), ip("0.0.0.0").to_bits(), "{v6}");
        }
        // Inside `ffff:ffff::/32` (multicast, never a source): the collision.
        assert_eq!(ip("ffff:ffff:a00:1::").to_bits(), ip("10.0.0.1").to_bits());
        // Distinct IPv4 addresses, distinct /64s: distinct keys.
        assert_ne!(ip("10.0.0.1").to_bits(), ip("10.0.0.2").to_bits());
        assert_ne!(ip("2001:db8::").to_bits(), ip("2001:db8:0:1::").to_bits());
        assert_ne!(ip("2001:db8::").to_bits(), ip("2001:db9::").to_bits());
    }

    #[test]
    fn distinct_ipv4_addresses_and_ipv6_networks_never_share_a_key() {
        // splitmix64: pseudo-random IPv4 addresses and IPv6 /64s outside
        // `ffff:ffff::/32`.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        // Each round: a /64 outside `ffff:ffff::/32`, a host in it and one in the
        // adjacent /64, the /64 of its low half inside `::/32` (the loopback's
        // range), and the IPv4 addresses that are the /64's own halves — the
        // likeliest collisions of a 64-bit encoding.
        let mut seen = std::collections::HashMap::new();
        // Fewer rounds under Miri (CI's `miri` step runs the lib tests; each round
        // is the same code).
        let rounds = if cfg!(miri) { 64 } else { 20_000 };
        for _ in 0..rounds {
            let net = next();
            if net >> 32 == 0xffff_ffff {
                continue;
            }
            // Bit 63 of the host set: never an IPv4-mapped address.
            let host = next() | (1 << 63);
            let v6 =
                |net: u64| IpAddr::V6(Ipv6Addr::from((u128::from(net) << 64) | u128::from(host)));
            let v4 = |bits: u64| IpAddr::V4(Ipv4Addr::from(bits as u32));
            let low = net & 0xffff_ffff;
            let clients = [
                (v6(net), (1u128 << 64) | u128::from(net)),
                (v6(net ^ 1), (1u128 << 64) | u128::from(net ^ 1)),
                (v6(low), (1u128 << 64) | u128::from(low)),
                (v4(net >> 32), u128::from(net >> 32)),
                (v4(net), u128::from(net as u32)),
            ];
            for (addr, group) in clients {
                if let Some(other) = seen.insert(addr.to_bits(), group) {
                    assert_eq!(other, group, "{addr} shares a key with another client");
                }
            }
        }
    }

    #[test]
    fn mapped_addresses_are_ipv4() {
        assert_eq!(ip("::ffff:192.0.2.7").to_bits(), ip("192.0.2.7").to_bits());
        assert_eq!(
            IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)).to_bits(),
            V4_IN_MULTICAST | u64::from(u32::from(Ipv4Addr::new(192, 0, 2, 7)))
        );
    }

    #[test]
    fn ipv6_groups_by_prefix() {
        let a: Ipv6Addr = "2001:db8:0:1::1".parse().unwrap();
        let b: Ipv6Addr = "2001:db8:0:1:ffff:ffff:ffff:ffff".parse().unwrap();
        let c: Ipv6Addr = "2001:db8:0:2::1".parse().unwrap();
        assert_eq!(Ipv6Prefix::new(a), Ipv6Prefix::new(b));
        assert_ne!(Ipv6Prefix::new(a), Ipv6Prefix::new(c));
        assert_eq!(
            Ipv6Prefix::with_len(a, 48).unwrap(),
            Ipv6Prefix::with_len(c, 48).unwrap()
        );
        assert_eq!(Ipv6Prefix::with_len(a, 64).unwrap(), Ipv6Prefix::new(a));
        assert_eq!(Ipv6Prefix::with_len(a, 0).unwrap().bits(), 0);
        assert_eq!(Ipv6Prefix::with_len(a, 65), Err(PrefixTooLong { len: 65 }));
        // An `IpAddr` key groups by /64, as `Ipv6Prefix::new`: the /64s 0 and 1
        // are two keys.
        assert_eq!(IpAddr::V6(a).to_bits(), IpAddr::V6(b).to_bits());
        assert_eq!(IpAddr::V6(a).to_bits(), Ipv6Prefix::new(a).to_bits());
        assert_ne!(
            IpAddr::V6(a).to_bits(),
            IpAddr::V6("2001:db8:0:0::9".parse().unwrap()).to_bits()
        );
        assert_ne!(IpAddr::V6(a).to_bits(), IpAddr::V6(c).to_bits());
    }

    #[test]
    fn borrowed_pairs_hash_and_compare_as_the_owned_tuple() {
        let state = ahash::RandomState::with_seeds(1, 2, 3, 4);
        let key = (ip("192.0.2.7"), "alice".to_owned());
        let borrowed = Pair(&key.0, "alice");
        assert_eq!(state.hash_one(&key), state.hash_one(borrowed));
        assert!(borrowed.matches(&key));
        assert!(!Pair(&key.0, "bob").matches(&key));
        assert_eq!(borrowed.to_key(), key);
    }
}
