//! The client's address behind trusted proxies, from `X-Forwarded-For` or `Forwarded`.
//!
//! Each proxy *appends* the address it received the request from, so the list reads from the
//! client (left) to the last proxy (right), and only the entries written by proxies you run can be
//! believed: everything left of them was written by whoever sent the request. The walk therefore
//! starts at the TCP peer and moves left only while the address in hand is a trusted proxy; the
//! first untrusted address is the client. The leftmost entry, which the client wrote itself, is
//! never taken on trust: with it a client picks its own key and escapes every limit.
//!
//! The walk is bounded ([`MAX_HOPS`]), and an entry that is not an address (a malformed or
//! non-ASCII header, `unknown`, an obfuscated `Forwarded` node) stops it at the last trusted hop:
//! such requests are then limited together under that proxy's address, which is strict rather
//! than open.

use std::net::IpAddr;

use http::HeaderMap;
use http::header::{FORWARDED, HeaderName};

use super::addr::{Cidr, canonical};

/// The most entries the walk reads: more proxies than any real chain has, few enough that a
/// header of megabytes costs no more than a short one.
pub(crate) const MAX_HOPS: usize = 32;

/// Which header carries the addresses proxies append.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (de facto standard; what most proxies write).
    #[default]
    XForwardedFor,
    /// `Forwarded: for=client, for=proxy1` (RFC 7239).
    Forwarded,
}

impl ForwardedHeader {
    fn name(self) -> HeaderName {
        match self {
            ForwardedHeader::XForwardedFor => HeaderName::from_static("x-forwarded-for"),
            ForwardedHeader::Forwarded => FORWARDED,
        }
    }
}

/// The client's address: `peer` if it is not a trusted proxy, else the rightmost address in
/// `header` that is not a trusted proxy (walking left past trusted ones), else the last trusted
/// hop reached.
pub(crate) fn client_address(
    peer: IpAddr,
    headers: &HeaderMap,
    header: ForwardedHeader,
    trusted: &[Cidr],
) -> IpAddr {
    let is_trusted = |address: IpAddr| trusted.iter().any(|range| range.contains(address));
    let mut current = canonical(peer);
    if !is_trusted(current) {
        return current;
    }
    let mut hops = 0;
    // Several header lines are one list, in order (RFC 9110, 5.3): walk them from the last.
    for line in headers.get_all(header.name()).iter().rev() {
        let Ok(line) = line.to_str() else {
            return current;
        };
        for entry in line.rsplit(',') {
            hops += 1;
            if hops > MAX_HOPS {
                return current;
            }
            let address = match header {
                ForwardedHeader::XForwardedFor => parse_node(entry),
                ForwardedHeader::Forwarded => forwarded_for(entry).and_then(parse_node),
            };
            let Some(address) = address else {
                return current;
            };
            current = canonical(address);
            if !is_trusted(current) {
                return current;
            }
        }
    }
    current
}

/// The `for=` value of one `Forwarded` element (`for=192.0.2.60;proto=http;by=203.0.113.43`).
fn forwarded_for(element: &str) -> Option<&str> {
    element.split(';').find_map(|pair| {
        let (name, value) = pair.trim().split_once('=')?;
        name.trim().eq_ignore_ascii_case("for").then_some(value)
    })
}

/// An address as proxies write it: `192.0.2.1`, `192.0.2.1:8080`, `2001:db8::1`,
/// `[2001:db8::1]`, `[2001:db8::1]:443`, optionally in double quotes (as `Forwarded` requires for
/// IPv6 and ports).
fn parse_node(text: &str) -> Option<IpAddr> {
    let text = text.trim();
    let text = match text.strip_prefix('"') {
        Some(rest) => rest.strip_suffix('"')?,
        None => text,
    };
    if let Ok(address) = text.parse::<IpAddr>() {
        return Some(address);
    }
    if let Some(rest) = text.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        if !(after.is_empty() || is_port(after.strip_prefix(':')?)) {
            return None;
        }
        return inside.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6);
    }
    let (host, port) = text.split_once(':')?;
    if !is_port(port) {
        return None;
    }
    host.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

/// Whether `text` is a port number (or the `Forwarded` obfuscated port form `_abc`).
fn is_port(text: &str) -> bool {
    !text.is_empty()
        && (text.bytes().all(|b| b.is_ascii_digit()) && text.len() <= 5
            || text.starts_with('_')
                && text[1..]
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn trusted() -> Vec<Cidr> {
        vec!["10.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()]
    }

    fn xff(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append("x-forwarded-for", HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn nodes_parse_in_every_form_proxies_write() {
        assert_eq!(parse_node(" 192.0.2.1 "), Some(ip("192.0.2.1")));
        assert_eq!(parse_node("192.0.2.1:8080"), Some(ip("192.0.2.1")));
        assert_eq!(parse_node("2001:db8::1"), Some(ip("2001:db8::1")));
        assert_eq!(parse_node("[2001:db8::1]"), Some(ip("2001:db8::1")));
        assert_eq!(parse_node("[2001:db8::1]:443"), Some(ip("2001:db8::1")));
        assert_eq!(parse_node("\"[2001:db8::1]:443\""), Some(ip("2001:db8::1")));
        assert_eq!(parse_node("\"192.0.2.1:_hidden\""), Some(ip("192.0.2.1")));
        for bad in [
            "",
            "unknown",
            "_hidden",
            "192.0.2.1:",
            "192.0.2.1:99999999",
            "[2001:db8::1",
            "[2001:db8::1]x",
            "[192.0.2.1]",
            "\"192.0.2.1",
            "192.0.2.256",
            "example.com:80",
        ] {
            assert_eq!(parse_node(bad), None, "{bad:?} was read as an address");
        }
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_the_header_says() {
        let headers = xff(&["203.0.113.1"]);
        let peer = ip("198.51.100.7");
        assert_eq!(
            client_address(peer, &headers, ForwardedHeader::XForwardedFor, &trusted()),
            peer
        );
    }

    #[test]
    fn the_rightmost_untrusted_address_is_the_client() {
        // The client sent "1.1.1.1" itself; 203.0.113.5 is what the first trusted proxy saw.
        let headers = xff(&["1.1.1.1, 203.0.113.5, 10.0.0.2"]);
        assert_eq!(
            client_address(
                ip("10.0.0.1"),
                &headers,
                ForwardedHeader::XForwardedFor,
                &trusted()
            ),
            ip("203.0.113.5")
        );
    }

    #[test]
    fn several_header_lines_are_walked_as_one_list_from_the_last() {
        let headers = xff(&["1.1.1.1, 203.0.113.5", "10.0.0.3", "10.0.0.2"]);
        assert_eq!(
            client_address(
                ip("10.0.0.1"),
                &headers,
                ForwardedHeader::XForwardedFor,
                &trusted()
            ),
            ip("203.0.113.5")
        );
    }

    #[test]
    fn garbage_stops_the_walk_at_the_last_trusted_hop() {
        let headers = xff(&["203.0.113.5, garbage, 10.0.0.2"]);
        assert_eq!(
            client_address(
                ip("10.0.0.1"),
                &headers,
                ForwardedHeader::XForwardedFor,
                &trusted()
            ),
            ip("10.0.0.2")
        );
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-forwarded-for",
            HeaderValue::from_bytes(b"203.0.113.5, \xff\xfe").unwrap(),
        );
        assert_eq!(
            client_address(
                ip("10.0.0.1"),
                &headers,
                ForwardedHeader::XForwardedFor,
                &trusted()
            ),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn a_chain_of_only_trusted_hops_ends_at_its_leftmost() {
        let headers = xff(&["10.9.9.9, 10.0.0.2"]);
        assert_eq!(
            client_address(
                ip("10.0.0.1"),
                &headers,
                ForwardedHeader::XForwardedFor,
                &trusted()
            ),
            ip("10.9.9.9")
        );
        // No header at all: the trusted peer itself.
        assert_eq!(
            client_address(
                ip("10.0.0.1"),
                &HeaderMap::new(),
                ForwardedHeader::XForwardedFor,
                &trusted()
            ),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn the_walk_is_bounded() {
        let long = vec!["10.0.0.9"; MAX_HOPS + 10].join(",");
        let headers = xff(&[&format!("203.0.113.5,{long}")]);
        assert_eq!(
            client_address(
                ip("10.0.0.1"),
                &headers,
                ForwardedHeader::XForwardedFor,
                &trusted()
            ),
            ip("10.0.0.9")
        );
    }

    #[test]
    fn forwarded_elements_are_read_by_their_for_parameter() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "forwarded",
            HeaderValue::from_static(
                "for=1.1.1.1, For=\"[2001:db8:cafe::17]:4711\";proto=https, by=10.0.0.1;for=10.0.0.2",
            ),
        );
        assert_eq!(
            client_address(
                ip("10.0.0.1"),
                &headers,
                ForwardedHeader::Forwarded,
                &trusted()
            ),
            ip("2001:db8:cafe::17")
        );
        // The `X-Forwarded-For` source ignores `Forwarded`.
        assert_eq!(
            client_address(
                ip("10.0.0.1"),
                &headers,
                ForwardedHeader::XForwardedFor,
                &trusted()
            ),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn mapped_addresses_in_the_chain_are_judged_as_ipv4() {
        let headers = xff(&["203.0.113.5, ::ffff:10.0.0.2"]);
        assert_eq!(
            client_address(
                ip("::ffff:10.0.0.1"),
                &headers,
                ForwardedHeader::XForwardedFor,
                &trusted()
            ),
            ip("203.0.113.5")
        );
    }
}
