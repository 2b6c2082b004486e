//! Client addresses: [`Cidr`] ranges, IPv4-mapped IPv6 normalised to IPv4, and grouping of an
//! address by its network prefix.
//!
//! One client rarely has one address: an IPv6 host is handed a whole /64 (or more) and can pick a
//! fresh address in it for every request, so an address keyed as is can be walked around at will.
//! Addresses are therefore grouped by prefix before they become keys. An IPv4-mapped IPv6 address
//! (`::ffff:192.0.2.1`, what a dual-stack socket reports for an IPv4 peer) is turned back into IPv4
//! *first*: masked as IPv6 to /64, every IPv4 client would share one key.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// A range of addresses written `address/prefix` (`10.0.0.0/8`, `2001:db8::/32`), or one address
/// (`192.0.2.1`, a /32 or /128).
///
/// An IPv4-mapped IPv6 address matches an IPv4 range, and an IPv4-mapped range is read as IPv4,
/// so a dual-stack socket's view of an IPv4 peer is judged as that peer.
///
/// # Examples
///
/// ```
/// use std::net::IpAddr;
/// use tollgate::tower::Cidr;
///
/// let private: Cidr = "10.0.0.0/8".parse()?;
/// assert!(private.contains("10.1.2.3".parse::<IpAddr>()?));
/// assert!(private.contains("::ffff:10.1.2.3".parse::<IpAddr>()?));
/// assert!(!private.contains("11.0.0.1".parse::<IpAddr>()?));
/// assert!("10.0.0.0/33".parse::<Cidr>().is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    /// The network address, with the host bits cleared.
    network: IpAddr,
    prefix: u8,
}

/// A [`Cidr`] that could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidCidr {
    text: String,
}

impl fmt::Display for InvalidCidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "address range {:?} is invalid: expected an address and an optional prefix length \
             (at most 32 for IPv4, 128 for IPv6), like \"10.0.0.0/8\" or \"2001:db8::/32\"",
            self.text
        )
    }
}

impl std::error::Error for InvalidCidr {}

impl Cidr {
    /// The range of `prefix` leading bits of `address`.
    ///
    /// # Errors
    ///
    /// When `prefix` is longer than the address (32 bits for IPv4, 128 for IPv6).
    pub fn new(address: IpAddr, prefix: u8) -> Result<Cidr, InvalidCidr> {
        let (address, prefix) = match address {
            // A mapped range is an IPv4 range: its first 96 bits are the mapping prefix.
            IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() && prefix >= 96 => {
                (canonical(address), prefix - 96)
            }
            _ => (address, prefix),
        };
        let bits = match address {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        if prefix > bits {
            return Err(InvalidCidr {
                text: format!("{address}/{prefix}"),
            });
        }
        Ok(Cidr {
            network: mask(address, prefix),
            prefix,
        })
    }

    /// The network address (host bits cleared).
    pub fn network(&self) -> IpAddr {
        self.network
    }

    /// The prefix length in bits.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `address` is in the range (IPv4-mapped IPv6 addresses are judged as IPv4).
    pub fn contains(&self, address: IpAddr) -> bool {
        let address = canonical(address);
        match (self.network, address) {
            (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_)) => {
                mask(address, self.prefix) == self.network
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = InvalidCidr;

    fn from_str(text: &str) -> Result<Cidr, InvalidCidr> {
        let invalid = || InvalidCidr {
            text: text.to_owned(),
        };
        let (address, prefix) = match text.trim().split_once('/') {
            Some((address, prefix)) => {
                // `u8::from_str` accepts a leading `+`; a prefix is digits only.
                if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(invalid());
                }
                (address, Some(prefix.parse::<u8>().map_err(|_| invalid())?))
            }
            None => (text.trim(), None),
        };
        let address: IpAddr = address.parse().map_err(|_| invalid())?;
        let prefix = prefix.unwrap_or(match address {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        });
        Cidr::new(address, prefix).map_err(|_| invalid())
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// `address`, with an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) turned into IPv4.
///
/// Only the mapped form: the deprecated IPv4-compatible form (`::a.b.c.d`) is a real IPv6 address
/// range, and `::1` must stay the IPv6 loopback.
#[inline]
pub(crate) fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => address,
        },
        v4 => v4,
    }
}

/// `address` with all but its first `prefix` bits cleared (a prefix at or past the address's
/// length keeps it whole).
#[inline]
pub(crate) fn mask(address: IpAddr, prefix: u8) -> IpAddr {
    match address {
        IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from(u32::from(v4) & ipv4_mask(prefix))),
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & ipv6_mask(prefix))),
    }
}

/// The bits of an IPv4 address its first `prefix` bits keep (all of them from 32 on).
fn ipv4_mask(prefix: u8) -> u32 {
    u32::MAX
        .checked_shl(32 - u32::from(prefix.min(32)))
        .unwrap_or(0)
}

/// The bits of an IPv6 address its first `prefix` bits keep (all of them from 128 on).
fn ipv6_mask(prefix: u8) -> u128 {
    u128::MAX
        .checked_shl(128 - u32::from(prefix.min(128)))
        .unwrap_or(0)
}

/// How addresses are grouped into keys: the bits of each family's address that a key keeps,
/// as masks made once, so that a request's key is one `and`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grouping {
    ipv4_mask: u32,
    ipv6_mask: u128,
}

impl Grouping {
    /// One key per IPv4 address, one per IPv6 /64 (the size of one subnet, which a single host
    /// may own whole).
    pub(crate) const DEFAULT: Grouping = Grouping {
        ipv4_mask: u32::MAX,
        ipv6_mask: u128::MAX << 64,
    };

    /// Keeps the first `bits` of an IPv4 address (at most 32).
    pub(crate) fn with_ipv4_prefix(self, bits: u8) -> Grouping {
        Grouping {
            ipv4_mask: ipv4_mask(bits),
            ..self
        }
    }

    /// Keeps the first `bits` of an IPv6 address (at most 128).
    pub(crate) fn with_ipv6_prefix(self, bits: u8) -> Grouping {
        Grouping {
            ipv6_mask: ipv6_mask(bits),
            ..self
        }
    }

    /// The key for `address`: normalised, then masked to its family's prefix.
    #[inline]
    pub(crate) fn key(&self, address: IpAddr) -> IpAddr {
        match canonical(address) {
            IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from(u32::from(v4) & self.ipv4_mask)),
            IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & self.ipv6_mask)),
        }
    }
}

impl fmt::Debug for Grouping {
    /// The prefix lengths, as they were set.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grouping")
            .field("ipv4_prefix", &self.ipv4_mask.leading_ones())
            .field("ipv6_prefix", &self.ipv6_mask.leading_ones())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn ranges_parse_with_and_without_a_prefix() {
        let range: Cidr = "10.1.2.3/8".parse().unwrap();
        assert_eq!(range.network(), ip("10.0.0.0"));
        assert_eq!(range.prefix(), 8);
        assert_eq!(range.to_string(), "10.0.0.0/8");
        let host: Cidr = "2001:db8::1".parse().unwrap();
        assert_eq!(host.prefix(), 128);
        assert!(host.contains(ip("2001:db8::1")));
        assert!(!host.contains(ip("2001:db8::2")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("255.255.255.255")));
        assert!(!all.contains(ip("::1")));
    }

    #[test]
    fn malformed_ranges_are_refused() {
        for text in [
            "",
            "/8",
            "10.0.0.0/",
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/+8",
            "10.0.0.0/-1",
            "10.0.0/8",
            "host/8",
            "10.0.0.0/8/8",
            "10.0.0.0/256",
        ] {
            assert!(text.parse::<Cidr>().is_err(), "{text:?} was accepted");
        }
    }

    #[test]
    fn mapped_ipv6_addresses_match_ipv4_ranges() {
        let range: Cidr = "192.0.2.0/24".parse().unwrap();
        assert!(range.contains(ip("::ffff:192.0.2.77")));
        // A range written in the mapped form is the IPv4 range.
        let mapped: Cidr = "::ffff:192.0.2.0/120".parse().unwrap();
        assert_eq!(mapped, range);
        assert!(mapped.contains(ip("192.0.2.5")));
    }

    #[test]
    fn mapped_addresses_are_normalised_but_compatible_and_loopback_are_not() {
        assert_eq!(canonical(ip("::ffff:203.0.113.9")), ip("203.0.113.9"));
        assert_eq!(canonical(ip("::1")), ip("::1"));
        assert_eq!(canonical(ip("::203.0.113.9")), ip("::203.0.113.9"));
    }

    #[test]
    fn prefixes_keep_their_bits_from_none_to_all() {
        let grouping = Grouping::DEFAULT.with_ipv4_prefix(24).with_ipv6_prefix(48);
        assert_eq!(grouping.key(ip("198.51.100.77")), ip("198.51.100.0"));
        assert_eq!(grouping.key(ip("2001:db8:1:2::1")), ip("2001:db8:1::"));
        assert_eq!(grouping.key(ip("::ffff:198.51.100.77")), ip("198.51.100.0"));
        assert_eq!(
            format!("{grouping:?}"),
            "Grouping { ipv4_prefix: 24, ipv6_prefix: 48 }"
        );
        let none = Grouping::DEFAULT.with_ipv4_prefix(0).with_ipv6_prefix(0);
        assert_eq!(none.key(ip("198.51.100.77")), ip("0.0.0.0"));
        assert_eq!(none.key(ip("2001:db8::1")), ip("::"));
        let all = Grouping::DEFAULT
            .with_ipv4_prefix(200)
            .with_ipv6_prefix(200);
        assert_eq!(all.key(ip("198.51.100.77")), ip("198.51.100.77"));
        assert_eq!(all.key(ip("2001:db8::1")), ip("2001:db8::1"));
        assert_eq!(
            format!("{all:?}"),
            "Grouping { ipv4_prefix: 32, ipv6_prefix: 128 }"
        );
    }

    #[test]
    fn grouping_masks_ipv6_to_its_prefix_and_keeps_ipv4_whole() {
        let grouping = Grouping::DEFAULT;
        assert_eq!(
            grouping.key(ip("2001:db8:1:2:aaaa::1")),
            grouping.key(ip("2001:db8:1:2:ffff::9"))
        );
        assert_ne!(
            grouping.key(ip("2001:db8:1:2::1")),
            grouping.key(ip("2001:db8:1:3::1"))
        );
        assert_eq!(
            grouping.key(ip("2001:db8:1:2:3:4:5:6")),
            ip("2001:db8:1:2::")
        );
        // Two IPv4 clients behind a dual-stack socket stay apart.
        assert_eq!(grouping.key(ip("::ffff:198.51.100.1")), ip("198.51.100.1"));
        assert_ne!(
            grouping.key(ip("::ffff:198.51.100.1")),
            grouping.key(ip("::ffff:198.51.100.2"))
        );
    }

    #[test]
    fn masks_at_the_ends_of_the_range() {
        assert_eq!(mask(ip("203.0.113.9"), 0), ip("0.0.0.0"));
        assert_eq!(mask(ip("203.0.113.9"), 32), ip("203.0.113.9"));
        assert_eq!(mask(ip("203.0.113.9"), 200), ip("203.0.113.9"));
        assert_eq!(mask(ip("2001:db8::1"), 0), ip("::"));
        assert_eq!(mask(ip("2001:db8::1"), 128), ip("2001:db8::1"));
        assert_eq!(mask(ip("2001:db8:ffff::1"), 48), ip("2001:db8:ffff::"));
    }
}
