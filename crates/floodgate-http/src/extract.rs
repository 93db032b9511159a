//! Client keys from a request: the [`KeyExtractor`] trait and its implementations.
//!
//! | extractor | key | from |
//! |---|---|---|
//! | [`PeerIp`] | [`IpAddr`] (grouped) | the connection's peer address in the request extensions |
//! | [`ForwardedIp`] | [`IpAddr`] (grouped) | `X-Forwarded-For` or `Forwarded` (RFC 7239), trusting only configured proxies |
//! | [`HeaderKey`] | [`String`] | one header's value (an API key) |
//! | [`RoutePath`] | [`String`] | the request path |
//! | [`Global`] | `()` | nothing: one bucket for every request |
//! | [`FromFn`] | any | a closure over the request head |
//!
//! An extractor never panics on input: a missing, malformed (not an address, not
//! visible ASCII) or oversized value is a [`KeyError`], which the rule turns into a
//! `400` or a fallback bucket ([`OnMissingKey`](crate::OnMissingKey)).
//!
//! IP keys are canonical ([`IpAddr::to_canonical`]: an IPv4-mapped IPv6 address is its
//! IPv4 address) and grouped by prefix ([`IpGrouping`]: IPv6 by /64 by default, since
//! one host usually holds a whole /64).

use core::fmt;
use core::hash::Hash;
use core::marker::PhantomData;
use core::str::FromStr;
use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use http::header::{HeaderMap, HeaderName};
use http::request::Parts;
use http::Extensions;

use crate::error::ConfigError;

/// Why no key could be taken from a request.
///
/// # Examples
///
/// ```
/// use floodgate_http::{KeyError, KeyExtractor, PeerIp};
/// let (parts, ()) = http::Request::new(()).into_parts();
/// let err = PeerIp::new().extract(&parts).unwrap_err();
/// assert!(matches!(err, KeyError::Missing { .. }));
/// assert_eq!(err.to_string(), "missing client key: peer address");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The value the key comes from is absent.
    Missing {
        /// What was looked for.
        what: Cow<'static, str>,
    },
    /// The value is there but unusable.
    Malformed {
        /// What was read.
        what: Cow<'static, str>,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The value is longer than the configured bound.
    Oversized {
        /// What was read.
        what: Cow<'static, str>,
        /// Its length in bytes.
        len: usize,
        /// The bound.
        max: usize,
    },
}

impl KeyError {
    /// A [`KeyError::Missing`].
    pub fn missing(what: impl Into<Cow<'static, str>>) -> KeyError {
        KeyError::Missing { what: what.into() }
    }

    /// A [`KeyError::Malformed`].
    pub fn malformed(what: impl Into<Cow<'static, str>>, reason: &'static str) -> KeyError {
        KeyError::Malformed {
            what: what.into(),
            reason,
        }
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::Missing { what } => write!(f, "missing client key: {what}"),
            KeyError::Malformed { what, reason } => {
                write!(f, "malformed client key: {what}: {reason}")
            }
            KeyError::Oversized { what, len, max } => {
                write!(
                    f,
                    "oversized client key: {what} is {len} bytes, at most {max} accepted"
                )
            }
        }
    }
}

impl std::error::Error for KeyError {}

/// Takes a rate-limit key from a request head.
///
/// # Examples
///
/// ```
/// use floodgate_http::{KeyError, KeyExtractor};
/// use http::request::Parts;
///
/// /// The tenant from a path `/t/{tenant}/...`.
/// struct Tenant;
/// impl KeyExtractor for Tenant {
///     type Key = String;
///     fn extract(&self, parts: &Parts) -> Result<String, KeyError> {
///         let mut segments = parts.uri.path().split('/').skip(1);
///         match (segments.next(), segments.next()) {
///             (Some("t"), Some(t)) if !t.is_empty() => Ok(t.to_owned()),
///             _ => Err(KeyError::missing("tenant path segment")),
///         }
///     }
/// }
/// let (parts, ()) = http::Request::get("/t/acme/x").body(()).unwrap().into_parts();
/// assert_eq!(Tenant.extract(&parts).unwrap(), "acme");
/// ```
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key a limiter is consulted with.
    type Key: Hash + Eq + Send + Sync + 'static;

    /// The key for this request, or why there is none.
    ///
    /// It must be a function of the request head alone: for a request a later rule
    /// denies, the layer calls it again to give the charge back to the same key
    /// (a key drawn at random, or from a counter, would refund another key or none).
    ///
    /// A keyed table holds each key it stores, with whatever heap memory the key
    /// owns (a `String`'s bytes), which its memory budget does not count: bound a
    /// key's length where it is read, as [`HeaderKey`] (256 bytes by default) and
    /// [`RoutePath`] (1 KiB) do, and answer a longer one [`KeyError::Oversized`] (a
    /// `400`, which charges nothing and stores nothing).
    ///
    /// # Errors
    ///
    /// A [`KeyError`] when the value the key comes from is missing, malformed or
    /// oversized.
    fn extract(&self, parts: &Parts) -> Result<Self::Key, KeyError>;
}

/// The peer's socket address, as a plain hyper server inserts it into the request
/// extensions (axum's `ConnectInfo` is read with [`PeerIp::lookup`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// Reads the peer IP from request extensions.
pub type PeerLookup = fn(&Extensions) -> Option<IpAddr>;

/// The default [`PeerLookup`]: a [`PeerAddr`], else a bare [`SocketAddr`], else a bare
/// [`IpAddr`] extension.
///
/// # Examples
///
/// ```
/// use floodgate_http::{default_peer_lookup, PeerAddr};
/// let mut ext = http::Extensions::new();
/// assert_eq!(default_peer_lookup(&ext), None);
/// ext.insert(PeerAddr("192.0.2.1:443".parse().unwrap()));
/// assert_eq!(default_peer_lookup(&ext), Some("192.0.2.1".parse().unwrap()));
/// ```
pub fn default_peer_lookup(ext: &Extensions) -> Option<IpAddr> {
    ext.get::<PeerAddr>()
        .map(|p| p.0.ip())
        .or_else(|| ext.get::<SocketAddr>().map(SocketAddr::ip))
        .or_else(|| ext.get::<IpAddr>().copied())
}

/// How client addresses are grouped into keys: IPv4 addresses by a `/v4` prefix
/// (default /32: each address), IPv6 by a `/v6` prefix (default /64: one subnet, as
/// one host usually holds a whole /64). Addresses are canonicalized first.
///
/// # Examples
///
/// ```
/// use floodgate_http::IpGrouping;
/// use std::net::IpAddr;
/// let g = IpGrouping::default();
/// let ip = |s: &str| s.parse::<IpAddr>().unwrap();
/// assert_eq!(g.group(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
/// assert_eq!(g.group(ip("::ffff:192.0.2.7")), ip("192.0.2.7"));
/// let g = IpGrouping::default().v4_prefix(24)?;
/// assert_eq!(g.group(ip("192.0.2.7")), ip("192.0.2.0"));
/// # Ok::<(), floodgate_http::ConfigError>(())
/// ```
///
/// # With inline storage
///
/// The grouped key is kept as it is on [`Heap`](floodgate::Heap) storage (the
/// default) and, up to the documented collision odds, on
/// [`Fingerprint`](floodgate::Fingerprint) storage. On [`Inline`](floodgate::Inline)
/// storage (`build_inline`) an `IpAddr` key keeps an IPv6 address's /64 prefix
/// ([`InlineKey`](floodgate::InlineKey) for `IpAddr`), so IPv6 clients share a key
/// per /64 **whatever the grouping**: the default /64 and any coarser grouping are
/// kept as they are (down to /0: the IPv4 and IPv6 groups stay apart, as on the
/// heap), a finer one (a `/v6` over 64, up to /128) is one bucket per /64.
/// For a grouping finer than /64, keep `IpAddr` keys on heap or fingerprint storage.
///
/// ```
/// use floodgate::InlineKey;
/// use floodgate_http::IpGrouping;
/// use std::net::IpAddr;
/// let ip = |s: &str| s.parse::<IpAddr>().unwrap();
/// let g = IpGrouping::default();
/// let (a, b) = (g.group(ip("2001:db8::1")), g.group(ip("2001:db8:0:1::1")));
/// assert_ne!(a.to_bits(), b.to_bits()); // two /64s: two inline keys
/// let g = IpGrouping::default().v6_prefix(128)?;
/// let (a, b) = (g.group(ip("2001:db8::1")), g.group(ip("2001:db8::2")));
/// assert_ne!(a, b); // two hosts: two keys
/// assert_eq!(a.to_bits(), b.to_bits()); // one /64: one inline key
/// let g = IpGrouping::default().v4_prefix(0)?.v6_prefix(0)?;
/// let (v4, v6) = (g.group(ip("192.0.2.7")), g.group(ip("2001:db8::1")));
/// assert_ne!(v4.to_bits(), v6.to_bits()); // all IPv4, all IPv6: two inline keys
/// # Ok::<(), floodgate_http::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpGrouping {
    v4: u8,
    v6: u8,
}

impl Default for IpGrouping {
    fn default() -> IpGrouping {
        IpGrouping { v4: 32, v6: 64 }
    }
}

impl IpGrouping {
    /// Groups IPv4 addresses by a `/len` prefix (`0`: every IPv4 client shares one
    /// key; `32`: each address is its own).
    ///
    /// # Errors
    ///
    /// [`ConfigError::Prefix`] when `len > 32`.
    pub fn v4_prefix(self, len: u8) -> Result<IpGrouping, ConfigError> {
        if len > 32 {
            return Err(ConfigError::Prefix {
                family: "ipv4",
                len,
            });
        }
        Ok(IpGrouping { v4: len, ..self })
    }

    /// Groups IPv6 addresses by a `/len` prefix (`0`: every IPv6 client shares one
    /// key; `128`: each address is its own).
    ///
    /// # Errors
    ///
    /// [`ConfigError::Prefix`] when `len > 128`.
    pub fn v6_prefix(self, len: u8) -> Result<IpGrouping, ConfigError> {
        if len > 128 {
            return Err(ConfigError::Prefix {
                family: "ipv6",
                len,
            });
        }
        Ok(IpGrouping { v6: len, ..self })
    }

    /// The key for `ip`: canonicalized, then masked to its group's prefix.
    pub fn group(&self, ip: IpAddr) -> IpAddr {
        match ip.to_canonical() {
            IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask32(self.v4))),
            IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask128(self.v6))),
        }
    }
}

fn mask32(len: u8) -> u32 {
    u32::MAX
        .checked_shl(32 - u32::from(len.min(32)))
        .unwrap_or(0)
}

fn mask128(len: u8) -> u128 {
    u128::MAX
        .checked_shl(128 - u32::from(len.min(128)))
        .unwrap_or(0)
}

/// The connection's peer IP: the key for clients that connect directly.
///
/// The address is read from the request extensions ([`default_peer_lookup`], or
/// [`lookup`](PeerIp::lookup) for axum's `ConnectInfo`); none there is
/// [`KeyError::Missing`], never a panic.
///
/// # Examples
///
/// ```
/// use floodgate_http::{KeyExtractor, PeerAddr, PeerIp};
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(PeerAddr("[::ffff:10.1.2.3]:5000".parse().unwrap()));
/// let (parts, ()) = req.into_parts();
/// assert_eq!(PeerIp::new().extract(&parts).unwrap(), "10.1.2.3".parse::<std::net::IpAddr>().unwrap());
/// ```
///
/// With axum (`Router::into_make_service_with_connect_info::<SocketAddr>()`):
///
/// ```
/// use axum::extract::ConnectInfo;
/// use floodgate_http::{KeyExtractor, PeerIp};
/// use std::net::SocketAddr;
/// let peer = PeerIp::new().lookup(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()));
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(ConnectInfo("192.0.2.8:1234".parse::<SocketAddr>().unwrap()));
/// let (parts, ()) = req.into_parts();
/// assert_eq!(peer.extract(&parts).unwrap().to_string(), "192.0.2.8");
/// ```
#[derive(Clone, Copy, Debug)]
pub struct PeerIp {
    lookup: PeerLookup,
    grouping: IpGrouping,
}

impl Default for PeerIp {
    fn default() -> PeerIp {
        PeerIp::new()
    }
}

impl PeerIp {
    /// Reads [`default_peer_lookup`], groups by [`IpGrouping::default`].
    pub fn new() -> PeerIp {
        PeerIp {
            lookup: default_peer_lookup,
            grouping: IpGrouping::default(),
        }
    }

    /// Reads the peer with `lookup` instead.
    pub fn lookup(self, lookup: PeerLookup) -> PeerIp {
        PeerIp { lookup, ..self }
    }

    /// Groups addresses with `grouping`.
    pub fn grouping(self, grouping: IpGrouping) -> PeerIp {
        PeerIp { grouping, ..self }
    }
}

impl KeyExtractor for PeerIp {
    type Key = IpAddr;

    fn extract(&self, parts: &Parts) -> Result<IpAddr, KeyError> {
        (self.lookup)(&parts.extensions)
            .map(|ip| self.grouping.group(ip))
            .ok_or(KeyError::missing("peer address"))
    }
}

/// An IP network, `ADDR/PREFIX` or a single `ADDR`.
///
/// Addresses are canonicalized before they are matched (an IPv4-mapped IPv6 address,
/// `::ffff:a.b.c.d`, is its IPv4 address), and so is a network written in the mapped
/// form: `::ffff:10.0.0.0/104` is the IPv4 network `10.0.0.0/8` (the prefix less the
/// 96 bits of `::ffff:0:0/96`), and a mapped address without a prefix is one IPv4
/// address. A mapped network with a prefix under /96 (`::ffff:0:0/95`, or
/// `::ffff:10.0.0.0/8`, which in IPv6 is `::/8`) would hold IPv6 addresses outside
/// the mapped range as well, so it is refused: write the IPv4 network, or the IPv6
/// one with its own address.
///
/// # Examples
///
/// ```
/// use floodgate_http::IpNet;
/// let net: IpNet = "10.0.0.0/8".parse()?;
/// assert!(net.contains("10.200.0.1".parse().unwrap()));
/// assert!(net.contains("::ffff:10.0.0.1".parse().unwrap()));
/// assert!(!net.contains("11.0.0.1".parse().unwrap()));
/// assert!("10.0.0.0/33".parse::<IpNet>().is_err());
/// assert_eq!("::ffff:10.0.0.0/104".parse::<IpNet>()?, net);
/// assert!("::ffff:0:0/95".parse::<IpNet>().is_err());
/// # Ok::<(), floodgate_http::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// Whether `ip` (canonicalized) lies in this network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let m = mask32(self.prefix);
                u32::from(net) & m == u32::from(ip) & m
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let m = mask128(self.prefix);
                u128::from(net) & m == u128::from(ip) & m
            }
            _ => false,
        }
    }
}

impl FromStr for IpNet {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<IpNet, ConfigError> {
        let bad = |reason| ConfigError::Network {
            text: text.to_owned(),
            reason,
        };
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let written = addr
            .parse::<IpAddr>()
            .map_err(|_| bad("not an IP address"))?;
        let (max, too_long) = if written.is_ipv4() {
            (
                32,
                "the prefix is longer than an IPv4 address (at most /32)",
            )
        } else {
            (
                128,
                "the prefix is longer than an IPv6 address (at most /128)",
            )
        };
        let prefix = match prefix {
            None => max,
            Some(p) if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) => {
                return Err(bad("the prefix length is not a decimal number"));
            }
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or(bad(too_long))?,
        };
        // The prefix counts the bits of the address as written; a mapped address
        // stands for its IPv4 address, whose bits are the last 32 of 128.
        let addr = written.to_canonical();
        let prefix = match (written, addr) {
            (IpAddr::V6(_), IpAddr::V4(_)) => prefix.checked_sub(96).ok_or(bad(
                "an IPv4-mapped network takes a prefix from /96 to /128 (a shorter one \
                 also holds IPv6 addresses outside ::ffff:0:0/96): write the IPv4 network \
                 (::ffff:10.0.0.0/104 is 10.0.0.0/8) or the IPv6 one",
            ))?,
            _ => prefix,
        };
        Ok(IpNet { addr, prefix })
    }
}

/// The networks whose hosts are trusted proxies. Networks may overlap; an address
/// with bits set past its prefix (`10.0.0.1/8`) names the network it lies in
/// (`10.0.0.0/8`).
///
/// # Examples
///
/// ```
/// use floodgate_http::TrustedProxies;
/// let t = TrustedProxies::new(["10.0.0.0/8", "fd00::/8", "192.0.2.10"])?;
/// assert!(t.contains("192.0.2.10".parse().unwrap()));
/// assert!(!t.contains("192.0.2.11".parse().unwrap()));
/// assert!(TrustedProxies::new(["10.0.0.0/8", "nonsense"]).is_err());
/// # Ok::<(), floodgate_http::ConfigError>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
}

impl TrustedProxies {
    /// Parses every network.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Network`] naming the first one that does not parse.
    pub fn new<I, S>(nets: I) -> Result<TrustedProxies, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let nets = nets
            .into_iter()
            .map(|s| s.as_ref().parse())
            .collect::<Result<_, _>>()?;
        Ok(TrustedProxies { nets })
    }

    /// Whether `ip` is in one of the networks.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.nets.iter().any(|n| n.contains(ip))
    }
}

/// Which forwarding header [`ForwardedIp`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForwardingHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`.
    XForwardedFor,
    /// `Forwarded: for=client, for=proxy1` (RFC 7239).
    Forwarded,
}

/// The default bound on the forwarding header's total length, in bytes.
pub const DEFAULT_MAX_FORWARDED_LEN: usize = 4096;

/// The client IP behind trusted reverse proxies.
///
/// The header is believed only when the peer is a trusted proxy, and then only for
/// `hops` proxies, counted from the right (the *rightmost-untrusted* rule):
///
/// * `hops == 0`, or the peer is not in the trusted networks: the peer is the client
///   (whatever the header says — a client cannot spoof its way past the limit);
/// * otherwise the header's entries are read from the right: an entry that is not a
///   trusted proxy is the client; a trusted one is skipped while fewer than `hops`
///   entries have been read; the `hops`-th entry is the client whatever it is. A
///   shorter chain ends at its leftmost entry. Entries further left are never read
///   (nor parsed, nor split): a spoofed leftmost value is never used, and nothing a
///   client sends there (bytes that are not visible ASCII, an open quote, padding)
///   can turn the key into an error, which would move the client into a fallback
///   bucket ([`OnMissingKey::Fallback`](crate::OnMissingKey::Fallback)).
///
/// A trusted peer that sends no header (unless
/// [`peer_when_header_absent`](ForwardedIp::peer_when_header_absent)), an entry read
/// that is not visible ASCII or
/// not an address (RFC 7239 `unknown` and obfuscated nodes included), or one that
/// lies further from the header's right end than the bound
/// ([`DEFAULT_MAX_FORWARDED_LEN`] bytes of the lines' values, counted together) is a
/// [`KeyError`]. Several header lines count as one list, in order; the bound counts
/// their bytes alone, whichever lines the entries are on. Entries may carry a port
/// (`192.0.2.1:80`, `[2001:db8::1]:80`; in `Forwarded` also an obfuscated one,
/// `"192.0.2.1:_p"`, as RFC 7239 allows), never an empty one; an IPv6 zone id
/// (`fe80::1%eth0`) is dropped.
///
/// # Examples
///
/// ```
/// use floodgate_http::{ForwardedIp, TrustedProxies};
/// use std::net::IpAddr;
/// let ip = |s: &str| s.parse::<IpAddr>().unwrap();
/// let xff = ForwardedIp::x_forwarded_for(TrustedProxies::new(["10.0.0.0/8"])?, 1);
/// let mut headers = http::HeaderMap::new();
/// headers.insert("x-forwarded-for", "6.6.6.6, 203.0.113.9".parse().unwrap());
/// // From the load balancer: the entry it appended.
/// assert_eq!(xff.client_ip(ip("10.0.0.2"), &headers), Ok(ip("203.0.113.9")));
/// // Straight from the internet: the header is ignored.
/// assert_eq!(xff.client_ip(ip("198.51.100.1"), &headers), Ok(ip("198.51.100.1")));
/// # Ok::<(), floodgate_http::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct ForwardedIp {
    header: ForwardingHeader,
    trusted: TrustedProxies,
    hops: usize,
    lookup: PeerLookup,
    grouping: IpGrouping,
    max_len: usize,
    peer_when_header_absent: bool,
}

impl ForwardedIp {
    /// Reads `X-Forwarded-For` behind `hops` trusted proxies.
    pub fn x_forwarded_for(trusted: TrustedProxies, hops: usize) -> ForwardedIp {
        ForwardedIp::new(ForwardingHeader::XForwardedFor, trusted, hops)
    }

    /// Reads `Forwarded` (RFC 7239) behind `hops` trusted proxies.
    pub fn forwarded(trusted: TrustedProxies, hops: usize) -> ForwardedIp {
        ForwardedIp::new(ForwardingHeader::Forwarded, trusted, hops)
    }

    /// Reads `header` behind `hops` trusted proxies.
    pub fn new(header: ForwardingHeader, trusted: TrustedProxies, hops: usize) -> ForwardedIp {
        ForwardedIp {
            header,
            trusted,
            hops,
            lookup: default_peer_lookup,
            grouping: IpGrouping::default(),
            max_len: DEFAULT_MAX_FORWARDED_LEN,
            peer_when_header_absent: false,
        }
    }

    /// Reads the peer with `lookup` (see [`PeerIp::lookup`]).
    pub fn lookup(self, lookup: PeerLookup) -> ForwardedIp {
        ForwardedIp { lookup, ..self }
    }

    /// Groups addresses with `grouping`.
    pub fn grouping(self, grouping: IpGrouping) -> ForwardedIp {
        ForwardedIp { grouping, ..self }
    }

    /// Reads at most the header's last `max_len` bytes (its lines together): an entry
    /// needed beyond them is a [`KeyError::Oversized`].
    ///
    /// # Errors
    ///
    /// [`ConfigError::MaxLen`] when `max_len` is 0: no entry fits, so every request
    /// from a trusted proxy would lose its key.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_http::{ConfigError, ForwardedIp, TrustedProxies};
    /// let xff = ForwardedIp::x_forwarded_for(TrustedProxies::new(["10.0.0.0/8"])?, 1);
    /// let _short = xff.clone().max_len(512)?;
    /// assert!(matches!(xff.max_len(0), Err(ConfigError::MaxLen { max_len: 0, .. })));
    /// # Ok::<(), floodgate_http::ConfigError>(())
    /// ```
    pub fn max_len(self, max_len: usize) -> Result<ForwardedIp, ConfigError> {
        nonzero_len("ForwardedIp::max_len", max_len)?;
        Ok(ForwardedIp { max_len, ..self })
    }

    /// Keys a trusted peer's own requests on the peer: when the forwarding header is
    /// **absent** and the peer is a trusted proxy, the key is the peer's address
    /// (grouped as configured) instead of a [`KeyError::Missing`] (a `400` for a hard
    /// rule). Off by default.
    ///
    /// This is for a load balancer's health checks and other requests it makes
    /// itself: it sends them without the header it appends to the requests it
    /// forwards. Only absence counts: a header present but malformed, oversized, or
    /// holding only empty entries is still a [`KeyError`], and an untrusted peer is
    /// its own key with or without the option.
    ///
    /// # Trade-off
    ///
    /// Every request a trusted proxy sends without the header shares **one** bucket,
    /// the proxy's. A client cannot reach it by dropping the header (the proxy appends
    /// one to what it forwards; a client that connects directly is an untrusted peer,
    /// keyed on its own address as before); but a proxy that forwards some requests
    /// without appending the header puts all of their clients into that one bucket,
    /// where without this option they would be answered `400`. Give the rule a limit
    /// that suits the proxy's own traffic, or key those paths by a separate rule.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_http::{ForwardedIp, TrustedProxies};
    /// use std::net::IpAddr;
    /// let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    /// let trusted = TrustedProxies::new(["10.0.0.0/8"])?;
    /// let no_header = http::HeaderMap::new();
    /// // Off: the load balancer's health check has no client key.
    /// let strict = ForwardedIp::x_forwarded_for(trusted.clone(), 1);
    /// assert!(strict.client_ip(ip("10.0.0.2"), &no_header).is_err());
    /// // On: it is keyed on the load balancer itself.
    /// let xff = ForwardedIp::x_forwarded_for(trusted, 1).peer_when_header_absent();
    /// assert_eq!(xff.client_ip(ip("10.0.0.2"), &no_header), Ok(ip("10.0.0.2")));
    /// // A malformed header is still an error.
    /// let mut bad = http::HeaderMap::new();
    /// bad.insert("x-forwarded-for", "999.0.0.1".parse().unwrap());
    /// assert!(xff.client_ip(ip("10.0.0.2"), &bad).is_err());
    /// # Ok::<(), floodgate_http::ConfigError>(())
    /// ```
    pub fn peer_when_header_absent(self) -> ForwardedIp {
        ForwardedIp {
            peer_when_header_absent: true,
            ..self
        }
    }

    fn header_name(&self) -> (HeaderName, &'static str) {
        match self.header {
            ForwardingHeader::XForwardedFor => (
                HeaderName::from_static("x-forwarded-for"),
                "X-Forwarded-For",
            ),
            ForwardingHeader::Forwarded => (http::header::FORWARDED, "Forwarded"),
        }
    }

    /// The client IP (canonical, not grouped) for a request from `peer` with
    /// `headers`: see the [type docs](ForwardedIp) for the rule.
    ///
    /// # Errors
    ///
    /// A [`KeyError`] when the header is needed and missing, malformed or oversized.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> Result<IpAddr, KeyError> {
        let peer = peer.to_canonical();
        if self.hops == 0 || !self.trusted.contains(peer) {
            return Ok(peer);
        }
        let (name, label) = self.header_name();
        let lines: Vec<&[u8]> = headers
            .get_all(&name)
            .iter()
            .map(|v| v.as_bytes())
            .collect();
        if lines.is_empty() {
            if self.peer_when_header_absent {
                return Ok(peer);
            }
            return Err(KeyError::missing(format!("{label} from a trusted proxy")));
        }
        // Quoted strings are RFC 7239's; an X-Forwarded-For entry is a bare address.
        let quoted = self.header == ForwardingHeader::Forwarded;
        let mut client = None;
        let mut read = 0usize;
        // The bytes of the lines right of the one being read: an element's distance
        // from the header's right end counts the lines' bytes alone, so one line and
        // the same list split over several lines are bounded alike.
        let mut right = 0usize;
        for line in lines.iter().rev() {
            for (start, element) in rsplit_list(line, quoted) {
                let distance = right.saturating_add(line.len() - start);
                if distance > self.max_len {
                    return Err(KeyError::Oversized {
                        what: label.into(),
                        len: lines.iter().fold(0usize, |n, l| n.saturating_add(l.len())),
                        max: self.max_len,
                    });
                }
                let element = visible_ascii(element)
                    .ok_or_else(|| KeyError::malformed(label, "not visible ASCII"))?
                    .trim_matches([' ', '\t']);
                if element.is_empty() {
                    continue;
                }
                let ip = match self.header {
                    ForwardingHeader::XForwardedFor => parse_node(element, false),
                    ForwardingHeader::Forwarded => forwarded_for(element),
                }
                .map_err(|reason| KeyError::malformed(label, reason))?
                .to_canonical();
                read += 1;
                client = Some(ip);
                if read >= self.hops || !self.trusted.contains(ip) {
                    return Ok(ip);
                }
            }
            right = right.saturating_add(line.len());
        }
        client.ok_or(KeyError::missing(format!(
            "{label} entry from a trusted proxy"
        )))
    }
}

impl KeyExtractor for ForwardedIp {
    type Key = IpAddr;

    fn extract(&self, parts: &Parts) -> Result<IpAddr, KeyError> {
        let peer = (self.lookup)(&parts.extensions).ok_or(KeyError::missing("peer address"))?;
        self.client_ip(peer, &parts.headers)
            .map(|ip| self.grouping.group(ip))
    }
}

/// A header's bytes as text when they are visible ASCII (or tabs), as
/// [`HeaderValue::to_str`](http::HeaderValue::to_str) accepts them.
fn visible_ascii(bytes: &[u8]) -> Option<&str> {
    if bytes
        .iter()
        .all(|&b| b == b'\t' || (0x20..0x7f).contains(&b))
    {
        core::str::from_utf8(bytes).ok()
    } else {
        None
    }
}

/// The elements of a header list, from the **right**, each with where it starts in
/// `line`: cut on commas, outside double quotes when `quoted` (RFC 9110 §5.6.1; a
/// quote after an odd run of backslashes is escaped). Scanned lazily right to left,
/// so what lies left of the elements taken (what a client sent before the proxies
/// appended theirs) is never looked at, and an open quote or a stray byte there
/// cannot change how they are cut.
fn rsplit_list(line: &[u8], quoted: bool) -> impl Iterator<Item = (usize, &[u8])> {
    let mut end = Some(line.len());
    core::iter::from_fn(move || {
        let stop = end?;
        let mut in_quotes = false;
        for i in (0..stop).rev() {
            match line[i] {
                b'"' if quoted => {
                    let backslashes = line[..i].iter().rev().take_while(|&&b| b == b'\\').count();
                    if backslashes % 2 == 0 {
                        in_quotes = !in_quotes;
                    }
                }
                b',' if !in_quotes => {
                    end = Some(i);
                    return Some((i + 1, &line[i + 1..stop]));
                }
                _ => {}
            }
        }
        end = None;
        Some((0, &line[..stop]))
    })
}

fn split_outside_quotes(s: &str, sep: u8) -> impl DoubleEndedIterator<Item = &str> {
    let bytes = s.as_bytes();
    let mut cuts = Vec::new();
    let mut quoted = false;
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate() {
        if escaped {
            escaped = false;
        } else if quoted && b == b'\\' {
            escaped = true;
        } else if b == b'"' {
            quoted = !quoted;
        } else if !quoted && b == sep {
            cuts.push(i);
        }
    }
    let mut pieces = Vec::with_capacity(cuts.len() + 1);
    let mut start = 0;
    for cut in cuts {
        // Cuts are at ASCII separators, so both sides are char boundaries.
        pieces.push(s.get(start..cut).unwrap_or(""));
        start = cut + 1;
    }
    pieces.push(s.get(start..).unwrap_or(""));
    pieces.into_iter()
}

/// An address with an optional port: `192.0.2.1`, `192.0.2.1:80`, `2001:db8::1`,
/// `[2001:db8::1]`, `[2001:db8::1]:80`; with `obfuscated_port` (RFC 7239 §6.3, the
/// `Forwarded` header's nodes) the port may also be an obfuscated identifier,
/// `192.0.2.1:_abc`. A port is never empty. An IPv6 address may carry a zone id
/// (`fe80::1%eth0`, bare or bracketed), which is dropped.
fn parse_node(text: &str, obfuscated_port: bool) -> Result<IpAddr, &'static str> {
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Ok(ip);
    }
    let bracketed = |s: &str| {
        s.strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .and_then(zoned_v6)
    };
    if let Some(ip) = zoned_v6(text).or_else(|| bracketed(text)) {
        return Ok(IpAddr::V6(ip));
    }
    if let Some((host, port)) = text.rsplit_once(':') {
        let digits = !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit());
        if digits || (obfuscated_port && is_obfuscated(port)) {
            if let Ok(ip) = host.parse::<Ipv4Addr>() {
                return Ok(IpAddr::V4(ip));
            }
            if let Some(ip) = bracketed(host) {
                return Ok(IpAddr::V6(ip));
            }
        }
    }
    Err("an entry is not an IP address")
}

/// An IPv6 address, with or without a zone id (RFC 6874: `%` and one or more
/// unreserved or percent-encoded characters), the zone dropped.
fn zoned_v6(text: &str) -> Option<Ipv6Addr> {
    let (addr, zone) = match text.split_once('%') {
        Some((addr, zone)) => (addr, Some(zone)),
        None => (text, None),
    };
    let zone_ok = zone.is_none_or(|z| {
        !z.is_empty()
            && z.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'%'))
    });
    addr.parse().ok().filter(|_| zone_ok)
}

/// An RFC 7239 obfuscated identifier: `"_" 1*(ALPHA / DIGIT / "." / "_" / "-")`.
fn is_obfuscated(text: &str) -> bool {
    text.strip_prefix('_').is_some_and(|rest| {
        !rest.is_empty()
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    })
}

/// The `for=` node of one RFC 7239 `Forwarded` element.
fn forwarded_for(element: &str) -> Result<IpAddr, &'static str> {
    for pair in split_outside_quotes(element, b';') {
        let Some((name, value)) = pair.split_once('=') else {
            continue;
        };
        if !name.trim_matches([' ', '\t']).eq_ignore_ascii_case("for") {
            continue;
        }
        let value = value.trim_matches([' ', '\t']);
        let value = match value.strip_prefix('"') {
            Some(rest) => rest
                .strip_suffix('"')
                .ok_or("an unterminated quoted for= value")?,
            None => value,
        };
        if value.eq_ignore_ascii_case("unknown") || value.starts_with('_') {
            return Err("for= names no IP address (unknown or obfuscated)");
        }
        return parse_node(value, true).map_err(|_| "a for= value is not an IP address");
    }
    Err("an element has no for= parameter")
}

/// A header's value as the key (an API key): visible ASCII, at most
/// [`max_len`](HeaderKey::max_len) bytes (256 by default), present exactly once
/// (a second line of it is a [`KeyError::Malformed`], so a client cannot choose
/// which of two values counts).
///
/// Pseudo-header names (`:authority`, `:path`) are no field names and are refused:
/// an HTTP/2 or HTTP/3 request carries its host in `:authority`, which is the
/// request URI's authority, with no `Host` field; key by host with [`from_fn`] over
/// `parts.uri.authority()` rather than `HeaderKey::new("host")`.
///
/// The value is the client's claim: nothing here checks that it is a real key, so a
/// client that sends a new value with each request gets a fresh bucket each time.
/// Put a per-client-IP rule before this one, or key on an identity an
/// authentication layer has verified ([`from_fn`] over the extension it inserts).
/// An empty or blank value is [`KeyError::Missing`], never the key `""`: a fallback
/// bucket named `""` ([`OnMissingKey::Fallback`](crate::OnMissingKey::Fallback)) is
/// one no client can name, where one such as `"anonymous"` is one any client can
/// send.
///
/// # Examples
///
/// ```
/// use floodgate_http::{HeaderKey, KeyError, KeyExtractor};
/// let key = HeaderKey::new("x-api-key")?;
/// let (blank, ()) = http::Request::get("/").header("x-api-key", " ").body(()).unwrap().into_parts();
/// assert!(matches!(key.extract(&blank), Err(KeyError::Missing { .. })));
/// let (parts, ()) = http::Request::get("/").header("x-api-key", "k-123").body(()).unwrap().into_parts();
/// assert_eq!(key.extract(&parts).unwrap(), "k-123");
/// # Ok::<(), floodgate_http::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct HeaderKey {
    name: HeaderName,
    max_len: usize,
}

impl HeaderKey {
    /// Reads header `name`.
    ///
    /// # Errors
    ///
    /// [`ConfigError::HeaderName`] when `name` is not a valid field name.
    pub fn new(name: &str) -> Result<HeaderKey, ConfigError> {
        let name =
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| ConfigError::HeaderName {
                name: name.to_owned(),
            })?;
        Ok(HeaderKey { name, max_len: 256 })
    }

    /// Rejects values longer than `max_len` bytes (256 by default).
    ///
    /// # Errors
    ///
    /// [`ConfigError::MaxLen`] when `max_len` is 0: no value fits (an empty one is
    /// no key either), so a hard rule would answer every request `400`.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_http::{ConfigError, HeaderKey};
    /// let key = HeaderKey::new("x-api-key")?.max_len(64)?;
    /// # let _ = key;
    /// assert_eq!(
    ///     HeaderKey::new("x-api-key")?.max_len(0).unwrap_err(),
    ///     ConfigError::MaxLen { field: "HeaderKey::max_len", max_len: 0 }
    /// );
    /// # Ok::<(), floodgate_http::ConfigError>(())
    /// ```
    pub fn max_len(self, max_len: usize) -> Result<HeaderKey, ConfigError> {
        nonzero_len("HeaderKey::max_len", max_len)?;
        Ok(HeaderKey { max_len, ..self })
    }
}

impl KeyExtractor for HeaderKey {
    type Key = String;

    fn extract(&self, parts: &Parts) -> Result<String, KeyError> {
        let what = || Cow::Owned(format!("header {}", self.name));
        let mut values = parts.headers.get_all(&self.name).iter();
        let value = values
            .next()
            .ok_or_else(|| KeyError::Missing { what: what() })?;
        if values.next().is_some() {
            return Err(KeyError::Malformed {
                what: what(),
                reason: "it appears more than once",
            });
        }
        if value.len() > self.max_len {
            return Err(KeyError::Oversized {
                what: what(),
                len: value.len(),
                max: self.max_len,
            });
        }
        let text = value.to_str().map_err(|_| KeyError::Malformed {
            what: what(),
            reason: "not visible ASCII",
        })?;
        let text = text.trim_matches([' ', '\t']);
        if text.is_empty() {
            return Err(KeyError::Missing { what: what() });
        }
        Ok(text.to_owned())
    }
}

/// The request path as the key (per endpoint). Raw paths are chosen by the client:
/// behind a router prefer its matched route (axum's `MatchedPath`, through
/// [`from_fn`]) so that `/users/1` and `/users/2` share a bucket. The query is no
/// part of the key; every `CONNECT` (authority-form) request shares the key `""`,
/// and `OPTIONS *` has the key `*`.
///
/// # Examples
///
/// ```
/// use floodgate_http::{KeyExtractor, RoutePath};
/// let (parts, ()) = http::Request::get("/search?q=x").body(()).unwrap().into_parts();
/// assert_eq!(RoutePath::new().extract(&parts).unwrap(), "/search");
/// ```
#[derive(Clone, Copy, Debug)]
pub struct RoutePath {
    max_len: usize,
}

impl Default for RoutePath {
    fn default() -> RoutePath {
        RoutePath::new()
    }
}

impl RoutePath {
    /// Paths up to 1024 bytes.
    pub fn new() -> RoutePath {
        RoutePath { max_len: 1024 }
    }

    /// Rejects paths longer than `max_len` bytes.
    ///
    /// # Errors
    ///
    /// [`ConfigError::MaxLen`] when `max_len` is 0: no path fits but a `CONNECT`
    /// request's empty one, so a hard rule would answer every other request `400`.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_http::{ConfigError, RoutePath};
    /// let path = RoutePath::new().max_len(128)?;
    /// # let _ = path;
    /// assert!(matches!(RoutePath::new().max_len(0), Err(ConfigError::MaxLen { .. })));
    /// # Ok::<(), floodgate_http::ConfigError>(())
    /// ```
    pub fn max_len(self, max_len: usize) -> Result<RoutePath, ConfigError> {
        nonzero_len("RoutePath::max_len", max_len)?;
        Ok(RoutePath { max_len })
    }
}

/// `Ok` for a length bound some key fits under (not 0); else [`ConfigError::MaxLen`]
/// naming `field`.
fn nonzero_len(field: &'static str, max_len: usize) -> Result<(), ConfigError> {
    if max_len == 0 {
        return Err(ConfigError::MaxLen { field, max_len });
    }
    Ok(())
}

impl KeyExtractor for RoutePath {
    type Key = String;

    fn extract(&self, parts: &Parts) -> Result<String, KeyError> {
        let path = parts.uri.path();
        if path.len() > self.max_len {
            return Err(KeyError::Oversized {
                what: "path".into(),
                len: path.len(),
                max: self.max_len,
            });
        }
        Ok(path.to_owned())
    }
}

/// One bucket for every request: the key is `()` (use it with a
/// [`RateLimiter`](floodgate::RateLimiter), which ignores keys).
///
/// # Examples
///
/// ```
/// use floodgate_http::{Global, KeyExtractor};
/// let (parts, ()) = http::Request::new(()).into_parts();
/// assert_eq!(Global.extract(&parts), Ok(()));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Global;

impl KeyExtractor for Global {
    type Key = ();

    fn extract(&self, _parts: &Parts) -> Result<(), KeyError> {
        Ok(())
    }
}

/// A closure as an extractor: see [`from_fn`].
pub struct FromFn<F, K> {
    f: F,
    key: PhantomData<fn() -> K>,
}

impl<F: Clone, K> Clone for FromFn<F, K> {
    fn clone(&self) -> Self {
        FromFn {
            f: self.f.clone(),
            key: PhantomData,
        }
    }
}

impl<F, K> fmt::Debug for FromFn<F, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FromFn { .. }")
    }
}

/// Any closure over the request head as an extractor.
///
/// # Examples
///
/// ```
/// use floodgate_http::{from_fn, KeyError, KeyExtractor};
/// let method = from_fn(|parts: &http::request::Parts| -> Result<String, KeyError> {
///     Ok(parts.method.as_str().to_owned())
/// });
/// let (parts, ()) = http::Request::post("/").body(()).unwrap().into_parts();
/// assert_eq!(method.extract(&parts).unwrap(), "POST");
/// ```
pub fn from_fn<F, K>(f: F) -> FromFn<F, K>
where
    F: Fn(&Parts) -> Result<K, KeyError>,
{
    FromFn {
        f,
        key: PhantomData,
    }
}

impl<F, K> KeyExtractor for FromFn<F, K>
where
    F: Fn(&Parts) -> Result<K, KeyError> + Send + Sync + 'static,
    K: Hash + Eq + Send + Sync + 'static,
{
    type Key = K;

    fn extract(&self, parts: &Parts) -> Result<K, KeyError> {
        (self.f)(parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    fn headers(name: &str, values: &[&[u8]]) -> HeaderMap {
        let mut h = HeaderMap::new();
        let name = HeaderName::from_bytes(name.as_bytes()).expect("test header name");
        for v in values {
            h.append(
                name.clone(),
                HeaderValue::from_bytes(v).expect("test header value"),
            );
        }
        h
    }

    fn trusted() -> TrustedProxies {
        TrustedProxies::new(["10.0.0.0/8", "fd00::/8"]).expect("test networks")
    }

    #[test]
    fn grouping_masks_and_canonicalizes() {
        let g = IpGrouping::default();
        assert_eq!(g.group(ip("2001:db8::1")), ip("2001:db8::"));
        assert_eq!(g.group(ip("2001:db8:0:0:ffff::1")), ip("2001:db8::"));
        assert_ne!(g.group(ip("2001:db8:0:1::1")), g.group(ip("2001:db8::1")));
        assert_eq!(g.group(ip("::ffff:1.2.3.4")), ip("1.2.3.4"));
        assert_eq!(g.group(ip("1.2.3.4")), ip("1.2.3.4"));
        let g = g.v6_prefix(128).unwrap().v4_prefix(0).unwrap();
        assert_eq!(g.group(ip("2001:db8::1")), ip("2001:db8::1"));
        assert_eq!(g.group(ip("1.2.3.4")), ip("0.0.0.0"));
        assert_eq!(
            IpGrouping::default()
                .v6_prefix(0)
                .unwrap()
                .group(ip("2001:db8::1")),
            ip("::")
        );
        assert!(IpGrouping::default().v6_prefix(129).is_err());
        assert!(IpGrouping::default().v4_prefix(33).is_err());
    }

    #[test]
    fn nets_parse_and_match() {
        let n: IpNet = "192.0.2.0/24".parse().unwrap();
        assert!(n.contains(ip("192.0.2.255")));
        assert!(!n.contains(ip("192.0.3.0")));
        assert!(!n.contains(ip("2001:db8::")));
        let n: IpNet = "::/0".parse().unwrap();
        assert!(n.contains(ip("2001:db8::")));
        // IPv4-mapped: matches as IPv4 only.
        assert!(!n.contains(ip("::ffff:1.2.3.4")));
        // Written IPv4-mapped: the IPv4 network of the prefix less 96 (addresses are
        // canonicalized before they are matched).
        let n: IpNet = "::ffff:10.0.0.0/104".parse().unwrap();
        assert_eq!(n, "10.0.0.0/8".parse().unwrap());
        assert!(n.contains(ip("10.1.1.1")));
        assert!(n.contains(ip("::ffff:10.255.0.1")));
        assert!(!n.contains(ip("11.0.0.0")));
        assert_eq!("::ffff:0:0/96".parse::<IpNet>(), "0.0.0.0/0".parse());
        assert_eq!("::ffff:192.0.2.9".parse::<IpNet>(), "192.0.2.9/32".parse());
        assert_eq!("::ffff:192.0.2.9/128".parse::<IpNet>(), "192.0.2.9".parse());
        // Under /96 the network holds IPv6 addresses outside the mapped range too
        // (`::ffff:10.0.0.0/8` is `::/8` in IPv6): refused, saying what to write.
        for straddling in ["::ffff:0:0/95", "::ffff:10.0.0.0/8", "::ffff:10.0.0.0/0"] {
            assert_eq!(
                straddling.parse::<IpNet>().unwrap_err().to_string(),
                format!(
                    "trusted network {straddling:?}: an IPv4-mapped network takes a prefix \
                     from /96 to /128 (a shorter one also holds IPv6 addresses outside \
                     ::ffff:0:0/96): write the IPv4 network (::ffff:10.0.0.0/104 is \
                     10.0.0.0/8) or the IPv6 one"
                ),
            );
        }
        // An IPv6 network that merely holds the mapped range is IPv6, as before: it
        // matches no canonicalized (IPv4) client.
        let n: IpNet = "::/64".parse().unwrap();
        assert!(!n.contains(ip("::ffff:10.0.0.1")));
        assert!(n.contains(ip("::1")));
        for bad in [
            "",
            "/8",
            "10.0.0.0/",
            "10.0.0.0/x",
            "10.0.0.0/33",
            "::/129",
            "::ffff:10.0.0.0/129",
            "x/1",
        ] {
            let err = bad.parse::<IpNet>().unwrap_err();
            assert!(matches!(err, ConfigError::Network { .. }), "{bad}");
        }
        // The message says what to change.
        let message = |text: &str| text.parse::<IpNet>().unwrap_err().to_string();
        assert_eq!(
            message("10.0.0.0/33"),
            r#"trusted network "10.0.0.0/33": the prefix is longer than an IPv4 address (at most /32)"#
        );
        assert_eq!(
            message("::/300"),
            r#"trusted network "::/300": the prefix is longer than an IPv6 address (at most /128)"#
        );
        assert_eq!(
            message("10.0.0.0/8x"),
            r#"trusted network "10.0.0.0/8x": the prefix length is not a decimal number"#
        );
    }

    #[test]
    fn xff_zero_one_two_hops() {
        let h = headers("x-forwarded-for", &[b"6.6.6.6, 198.51.100.7, 10.0.0.9"]);
        let zero = ForwardedIp::x_forwarded_for(trusted(), 0);
        assert_eq!(zero.client_ip(ip("10.0.0.1"), &h), Ok(ip("10.0.0.1")));
        let one = ForwardedIp::x_forwarded_for(trusted(), 1);
        // One hop: the entry the trusted peer appended, trusted or not.
        assert_eq!(one.client_ip(ip("10.0.0.1"), &h), Ok(ip("10.0.0.9")));
        let two = ForwardedIp::x_forwarded_for(trusted(), 2);
        assert_eq!(two.client_ip(ip("10.0.0.1"), &h), Ok(ip("198.51.100.7")));
        let five = ForwardedIp::x_forwarded_for(trusted(), 5);
        // Rightmost untrusted: 198.51.100.7; the spoofed 6.6.6.6 is never used.
        assert_eq!(five.client_ip(ip("10.0.0.1"), &h), Ok(ip("198.51.100.7")));
    }

    #[test]
    fn xff_untrusted_peer_and_spoofing() {
        let h = headers("x-forwarded-for", &[b"6.6.6.6"]);
        let two = ForwardedIp::x_forwarded_for(trusted(), 2);
        assert_eq!(two.client_ip(ip("203.0.113.5"), &h), Ok(ip("203.0.113.5")));
        // A spoofed leftmost value followed by the real client appended by our proxy.
        let h = headers("x-forwarded-for", &[b"10.0.0.3, 203.0.113.5"]);
        assert_eq!(two.client_ip(ip("10.0.0.1"), &h), Ok(ip("203.0.113.5")));
        // Garbage to the left of what is read is never parsed.
        let h = headers("x-forwarded-for", &[b"not an ip, ;;;, 203.0.113.5"]);
        assert_eq!(two.client_ip(ip("10.0.0.1"), &h), Ok(ip("203.0.113.5")));
    }

    #[test]
    fn xff_chain_shorter_than_hops_and_multiple_lines() {
        let three = ForwardedIp::x_forwarded_for(trusted(), 3);
        let h = headers("x-forwarded-for", &[b"10.0.0.7"]);
        assert_eq!(three.client_ip(ip("10.0.0.1"), &h), Ok(ip("10.0.0.7")));
        let h = headers("x-forwarded-for", &[b"203.0.113.1, 10.0.0.8", b"10.0.0.7"]);
        assert_eq!(three.client_ip(ip("10.0.0.1"), &h), Ok(ip("203.0.113.1")));
        let h = headers("x-forwarded-for", &[b" , 203.0.113.1 ,,"]);
        assert_eq!(three.client_ip(ip("10.0.0.1"), &h), Ok(ip("203.0.113.1")));
    }

    #[test]
    fn xff_ports_brackets_and_mapped() {
        let one = ForwardedIp::x_forwarded_for(trusted(), 1);
        for (v, want) in [
            ("192.0.2.1:8080", "192.0.2.1"),
            ("[2001:db8::1]:80", "2001:db8::1"),
            ("[2001:db8::1]", "2001:db8::1"),
            ("2001:db8::1", "2001:db8::1"),
            ("::ffff:192.0.2.9", "192.0.2.9"),
        ] {
            let h = headers("x-forwarded-for", &[v.as_bytes()]);
            assert_eq!(one.client_ip(ip("10.0.0.1"), &h), Ok(ip(want)), "{v}");
        }
        // A mapped peer is trusted as its IPv4 address.
        let h = headers("x-forwarded-for", &[b"192.0.2.1"]);
        assert_eq!(
            one.client_ip(ip("::ffff:10.0.0.1"), &h),
            Ok(ip("192.0.2.1"))
        );
    }

    #[test]
    fn xff_errors_are_clear() {
        let one = ForwardedIp::x_forwarded_for(trusted(), 1);
        let none = HeaderMap::new();
        assert!(matches!(
            one.client_ip(ip("10.0.0.1"), &none),
            Err(KeyError::Missing { .. })
        ));
        let h = headers("x-forwarded-for", &[b"999.1.1.1"]);
        assert!(matches!(
            one.client_ip(ip("10.0.0.1"), &h),
            Err(KeyError::Malformed { .. })
        ));
        let h = headers("x-forwarded-for", &[b"\xff\xfe"]);
        let err = one.client_ip(ip("10.0.0.1"), &h).unwrap_err();
        assert_eq!(
            err.to_string(),
            "malformed client key: X-Forwarded-For: not visible ASCII"
        );
        // The entry read lies beyond the last 4096 bytes.
        let long = "1".repeat(4800);
        let h = headers("x-forwarded-for", &[long.as_bytes()]);
        let err = one.client_ip(ip("10.0.0.1"), &h).unwrap_err();
        assert_eq!(
            err,
            KeyError::Oversized {
                what: "X-Forwarded-For".into(),
                len: 4800,
                max: 4096
            }
        );
        // So does a chain of trusted proxies read that far.
        let chain = "10.0.0.5,".repeat(600);
        let h = headers("x-forwarded-for", &[chain.as_bytes()]);
        let all = ForwardedIp::x_forwarded_for(trusted(), usize::MAX);
        assert!(matches!(
            all.client_ip(ip("10.0.0.1"), &h),
            Err(KeyError::Oversized { len: 5400, .. })
        ));
        let h = headers("x-forwarded-for", &[b" , "]);
        assert!(matches!(
            one.client_ip(ip("10.0.0.1"), &h),
            Err(KeyError::Missing { .. })
        ));
    }

    #[test]
    fn peer_when_header_absent_covers_absence_alone() {
        let none = HeaderMap::new();
        for header in [ForwardingHeader::XForwardedFor, ForwardingHeader::Forwarded] {
            let strict = ForwardedIp::new(header, trusted(), 1);
            let lenient = strict.clone().peer_when_header_absent();
            // Off by default: a trusted peer without the header has no key.
            assert!(matches!(
                strict.client_ip(ip("10.0.0.1"), &none),
                Err(KeyError::Missing { .. })
            ));
            // On: the trusted peer is its own key (canonical, as every key is).
            assert_eq!(lenient.client_ip(ip("10.0.0.1"), &none), Ok(ip("10.0.0.1")));
            assert_eq!(
                lenient.client_ip(ip("::ffff:10.0.0.1"), &none),
                Ok(ip("10.0.0.1"))
            );
            // An untrusted peer is its own key either way.
            for e in [&strict, &lenient] {
                assert_eq!(e.client_ip(ip("203.0.113.5"), &none), Ok(ip("203.0.113.5")));
            }
        }
        let strict = ForwardedIp::x_forwarded_for(trusted(), 1);
        let lenient = strict.clone().peer_when_header_absent();
        // Present: unchanged, whether usable, malformed, empty-listed or oversized.
        let long = "1".repeat(4800);
        for sent in [
            &b"203.0.113.7"[..],
            b"999.1.1.1",
            b"\xff",
            b" , ",
            long.as_bytes(),
        ] {
            let h = headers("x-forwarded-for", &[sent]);
            assert_eq!(
                lenient.client_ip(ip("10.0.0.1"), &h),
                strict.client_ip(ip("10.0.0.1"), &h),
                "{}",
                String::from_utf8_lossy(sent)
            );
        }
        let h = headers("x-forwarded-for", &[b" , "]);
        assert!(matches!(
            lenient.client_ip(ip("10.0.0.1"), &h),
            Err(KeyError::Missing { .. })
        ));
        // The other header does not count as this one.
        let h = headers("forwarded", &[b"for=203.0.113.7"]);
        assert_eq!(lenient.client_ip(ip("10.0.0.1"), &h), Ok(ip("10.0.0.1")));
        // Grouped like any key; no peer address at all is still missing.
        let grouped = lenient.grouping(IpGrouping::default().v4_prefix(8).unwrap());
        let mut req = http::Request::new(());
        req.extensions_mut().insert(ip("10.1.2.3"));
        let (parts, ()) = req.into_parts();
        assert_eq!(grouped.extract(&parts), Ok(ip("10.0.0.0")));
        let (parts, ()) = http::Request::new(()).into_parts();
        assert!(matches!(
            grouped.extract(&parts),
            Err(KeyError::Missing { .. })
        ));
    }

    #[test]
    fn what_a_client_sends_left_of_the_entries_read_is_never_looked_at() {
        // The trusted proxy appends the peer it saw to what the client sent: bytes
        // that are not visible ASCII, an open quote, or padding past the bound, all
        // on the client's side of the list, never make the key an error (which
        // would move the client into a fallback bucket).
        let padding = format!("{}, 203.0.113.5", "1.1.1.1, ".repeat(600));
        let xff = ForwardedIp::x_forwarded_for(trusted(), 1);
        let fwd = ForwardedIp::forwarded(trusted(), 1);
        for (extractor, name, sent) in [
            (&xff, "x-forwarded-for", &b"\xff\xfe, 203.0.113.5"[..]),
            (&xff, "x-forwarded-for", b"6.6.6.6, \", 203.0.113.5"),
            (&xff, "x-forwarded-for", padding.as_bytes()),
            (&fwd, "forwarded", b"for=\"\xff, for=203.0.113.5"),
            (&fwd, "forwarded", b"for=\"[2001:db8::1, for=203.0.113.5"),
            (&fwd, "forwarded", br#"for="a\", for=203.0.113.5"#),
        ] {
            let h = headers(name, &[sent]);
            assert_eq!(
                extractor.client_ip(ip("10.0.0.1"), &h),
                Ok(ip("203.0.113.5")),
                "{}",
                String::from_utf8_lossy(sent)
            );
        }
        let h = headers("x-forwarded-for", &[b"\xff\xfe", b"203.0.113.5"]);
        assert_eq!(xff.client_ip(ip("10.0.0.1"), &h), Ok(ip("203.0.113.5")));
        let one = fwd;
        // A quoted comma still does not split an element read from the right.
        let h = headers("forwarded", &[br#"for=203.0.113.5;x="a,\"b""#]);
        assert_eq!(one.client_ip(ip("10.0.0.1"), &h), Ok(ip("203.0.113.5")));
        // The entry read itself must be visible ASCII.
        let h = headers("x-forwarded-for", &[b"203.0.113.5, 10.0.0.\xff"]);
        let five = ForwardedIp::x_forwarded_for(trusted(), 5);
        assert!(matches!(
            five.client_ip(ip("10.0.0.1"), &h),
            Err(KeyError::Malformed { .. })
        ));
    }

    #[test]
    fn forwarded_rfc7239() {
        let two = ForwardedIp::forwarded(trusted(), 2);
        let h = headers(
            "forwarded",
            &[br#"for=6.6.6.6, for="[2001:db8:cafe::17]:4711";proto=https, For=10.0.0.5;by=10.0.0.1"#],
        );
        assert_eq!(
            two.client_ip(ip("10.0.0.1"), &h),
            Ok(ip("2001:db8:cafe::17"))
        );
        let one = ForwardedIp::forwarded(trusted(), 1);
        assert_eq!(one.client_ip(ip("10.0.0.1"), &h), Ok(ip("10.0.0.5")));
        let h = headers("forwarded", &[b"for=192.0.2.43:47011"]);
        assert_eq!(one.client_ip(ip("10.0.0.1"), &h), Ok(ip("192.0.2.43")));
        // A quoted comma does not split elements.
        let h = headers("forwarded", &[br#"for=192.0.2.1;x="a,b""#]);
        assert_eq!(one.client_ip(ip("10.0.0.1"), &h), Ok(ip("192.0.2.1")));
        for bad in [
            &b"for=unknown"[..],
            b"for=_hidden",
            b"proto=https",
            b"for=\"192.0.2.1",
            b"for=example.com",
        ] {
            let h = headers("forwarded", &[bad]);
            assert!(
                matches!(
                    one.client_ip(ip("10.0.0.1"), &h),
                    Err(KeyError::Malformed { .. })
                ),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn header_key_edges() {
        let key = HeaderKey::new("x-api-key").unwrap().max_len(8).unwrap();
        let parts = |vals: &[&[u8]]| {
            let mut req = http::Request::new(());
            for v in vals {
                req.headers_mut()
                    .append("x-api-key", HeaderValue::from_bytes(v).unwrap());
            }
            req.into_parts().0
        };
        assert_eq!(key.extract(&parts(&[b" abc "])).unwrap(), "abc");
        assert!(matches!(
            key.extract(&parts(&[])),
            Err(KeyError::Missing { .. })
        ));
        assert!(matches!(
            key.extract(&parts(&[b"  "])),
            Err(KeyError::Missing { .. })
        ));
        assert!(matches!(
            key.extract(&parts(&[b"a", b"b"])),
            Err(KeyError::Malformed { .. })
        ));
        assert!(matches!(
            key.extract(&parts(&[b"123456789"])),
            Err(KeyError::Oversized { len: 9, max: 8, .. })
        ));
        assert!(matches!(
            key.extract(&parts(&[b"\xc3\xa9"])),
            Err(KeyError::Malformed { .. })
        ));
        assert!(HeaderKey::new("bad header").is_err());
    }
}
