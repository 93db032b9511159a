//! `replay --format nginx`: client addresses keyed as floodgate-http's extractors key
//! them (`PeerIp`, `ForwardedIp`), so that the replay predicts the layer.
//!
//! An address is canonicalized (an IPv4-mapped IPv6 address is its IPv4 address) and
//! masked to its group's prefix by [`IpGrouping::group`] itself: by default each IPv4
//! address is its own key and IPv6 clients share a key per /64. The key is written
//! as the group's first address, followed by `/N` where the group holds more than
//! one address (`2001:db8:1:2::/64`, `192.0.2.7`). A `$remote_addr` that is not an IP
//! address (`unix:`, say) is its own key, as written.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use floodgate_http::IpGrouping;

/// How client addresses become keys.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AddressKeys {
    grouping: IpGrouping,
    /// The IPv4 and IPv6 prefix lengths, as `grouping` masks them.
    v4: u32,
    v6: u32,
}

impl AddressKeys {
    /// Keys grouped by `grouping`.
    pub(crate) fn new(grouping: IpGrouping) -> AddressKeys {
        // The prefix lengths are read back from the grouping's own masks: all ones,
        // grouped, keeps exactly the prefix's bits.
        let v4 = match grouping.group(IpAddr::V4(Ipv4Addr::from(u32::MAX))) {
            IpAddr::V4(masked) => u32::from(masked).leading_ones(),
            IpAddr::V6(_) => 32,
        };
        let v6 = match grouping.group(IpAddr::V6(Ipv6Addr::from(u128::MAX))) {
            IpAddr::V6(masked) => u128::from(masked).leading_ones(),
            IpAddr::V4(_) => 128,
        };
        AddressKeys { grouping, v4, v6 }
    }

    /// The key for the client address `text`: its group, written into `buf`, or
    /// `text` itself when it is not an IP address.
    pub(crate) fn key<'a>(&self, text: &'a str, buf: &'a mut String) -> &'a str {
        let Ok(ip) = text.parse::<IpAddr>() else {
            return text;
        };
        let group = self.grouping.group(ip);
        let (prefix, bits) = match group {
            IpAddr::V4(_) => (self.v4, 32),
            IpAddr::V6(_) => (self.v6, 128),
        };
        buf.clear();
        // Writing into a `String` does not fail.
        let _ = write!(buf, "{group}");
        if prefix < bits {
            let _ = write!(buf, "/{prefix}");
        }
        buf
    }

    /// How addresses are grouped, for the summary.
    pub(crate) fn describe(&self) -> String {
        let per = |prefix: u32, bits: u32| {
            if prefix == bits {
                "each address".to_owned()
            } else {
                format!("per /{prefix}")
            }
        };
        format!(
            "client address: IPv4 {}, IPv6 {} (IPv4-mapped IPv6 as IPv4)",
            per(self.v4, 32),
            per(self.v6, 128)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(keys: &AddressKeys, text: &str) -> String {
        let mut buf = String::new();
        keys.key(text, &mut buf).to_owned()
    }

    #[test]
    fn the_default_is_the_layers_default() {
        let keys = AddressKeys::new(IpGrouping::default());
        assert_eq!((keys.v4, keys.v6), (32, 64));
        assert_eq!(key(&keys, "2001:db8:1:2:aaaa::1"), "2001:db8:1:2::/64");
        assert_eq!(key(&keys, "2001:db8:1:2::ffff"), "2001:db8:1:2::/64");
        assert_eq!(key(&keys, "2001:db8:1:3::1"), "2001:db8:1:3::/64");
        assert_eq!(key(&keys, "::ffff:192.0.2.7"), "192.0.2.7");
        assert_eq!(key(&keys, "192.0.2.7"), "192.0.2.7");
        for not_ip in [
            "unix:",
            "-",
            "[::1]",
            "2001:db8::1%eth0",
            "192.0.2.7:80",
            "",
        ] {
            assert_eq!(key(&keys, not_ip), not_ip);
        }
        assert_eq!(
            keys.describe(),
            "client address: IPv4 each address, IPv6 per /64 (IPv4-mapped IPv6 as IPv4)"
        );
    }

    #[test]
    fn other_prefixes_show_their_length() {
        let grouping = IpGrouping::default().v4_prefix(24).unwrap();
        let keys = AddressKeys::new(grouping.v6_prefix(128).unwrap());
        assert_eq!(key(&keys, "192.0.2.7"), "192.0.2.0/24");
        assert_eq!(key(&keys, "::ffff:192.0.2.7"), "192.0.2.0/24");
        assert_eq!(key(&keys, "2001:db8::1"), "2001:db8::1");
        let keys = AddressKeys::new(grouping.v4_prefix(0).unwrap().v6_prefix(0).unwrap());
        assert_eq!(key(&keys, "203.0.113.9"), "0.0.0.0/0");
        assert_eq!(key(&keys, "2001:db8::1"), "::/0");
        assert_eq!(
            keys.describe(),
            "client address: IPv4 per /0, IPv6 per /0 (IPv4-mapped IPv6 as IPv4)"
        );
    }
}
