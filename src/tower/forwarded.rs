//! The client's address behind trusted proxies, from `X-Forwarded-For` or `Forwarded`.
//!
//! Each proxy *appends* the address it received the request from, so the list reads from the
//! client (left) to the last proxy (right), and only the entries written by proxies you run can be
//! believed: everything left of them was written by whoever sent the request. The walk therefore
//! starts at the TCP peer and moves left only while the address in hand is a trusted proxy; the
//! first untrusted address is the client. The leftmost entry, which the client wrote itself, is
//! never taken on trust: with it a client picks its own key and escapes every limit.
//!
//! The list is read element by element from the right, on the header's bytes: what the client
//! wrote left of the entries your proxies appended (non-ASCII bytes, an unclosed quote, garbage)
//! is never looked at unless the walk gets there, so it cannot change the key. Empty elements are
//! skipped (RFC 9110, 5.6.1), commas and semicolons inside the quoted strings of `Forwarded` do
//! not split (RFC 7239), and several header lines are one list, in order (RFC 9110, 5.3).
//!
//! The walk is bounded ([`MAX_HOPS`]). An element it needs that is not an address (garbage, not
//! UTF-8, `unknown`, an obfuscated `Forwarded` node), or a chain longer than the bound, ends it at
//! [`Walk::Unreadable`]: such requests are limited together under the last trusted hop reached, a
//! key of its own that never shares a limit with that proxy's own requests (its health checks,
//! which carry no forwarding header and are keyed by its address).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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

/// Where the walk from the peer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Walk {
    /// The client: the peer if it is not trusted, else the first untrusted address of the chain,
    /// else (every entry trusted) its leftmost.
    Client(IpAddr),
    /// The entry the walk needed after this trusted hop could not be read, or the chain was
    /// longer than [`MAX_HOPS`].
    Unreadable(IpAddr),
}

/// The client's address: `peer` if it is not a trusted proxy, else the rightmost address in
/// `header` that is not a trusted proxy (walking left past trusted ones).
pub(crate) fn client_address(
    peer: IpAddr,
    headers: &HeaderMap,
    header: ForwardedHeader,
    trusted: &[Cidr],
) -> Walk {
    let is_trusted = |address: IpAddr| trusted.iter().any(|range| range.contains(address));
    let mut current = canonical(peer);
    if !is_trusted(current) {
        return Walk::Client(current);
    }
    let mut hops = 0;
    // Several header lines are one list, in order: walk them from the last.
    for line in headers.get_all(header.name()).iter().rev() {
        let elements = ElementsFromRight {
            rest: Some(line.as_bytes()),
            quoted_strings: header == ForwardedHeader::Forwarded,
        };
        for element in elements {
            hops += 1;
            if hops > MAX_HOPS {
                return Walk::Unreadable(current);
            }
            let address = match header {
                ForwardedHeader::XForwardedFor => parse_node(element),
                ForwardedHeader::Forwarded => forwarded_for(element).and_then(parse_node),
            };
            let Some(address) = address else {
                return Walk::Unreadable(current);
            };
            current = canonical(address);
            if !is_trusted(current) {
                return Walk::Client(current);
            }
        }
    }
    Walk::Client(current)
}

/// The non-empty elements of one header line, from the last to the first, trimmed of
/// whitespace.
///
/// With `quoted_strings`, a comma inside a quoted string does not split: scanning leftwards, a
/// closing quote is matched with the nearest quote to its left that no backslash escapes (an even
/// run of backslashes before it). A quote never closed takes the rest of the line, leftwards, as
/// one element. Either way an element is found from the bytes right of it only, so what a client
/// wrote further left cannot change how the entries its proxies appended are split.
struct ElementsFromRight<'a> {
    /// The part of the line not yet split; `None` once its first element was returned.
    rest: Option<&'a [u8]>,
    quoted_strings: bool,
}

impl<'a> Iterator for ElementsFromRight<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        loop {
            let rest = self.rest?;
            let mut end = rest.len();
            let element = loop {
                let Some(last) = end.checked_sub(1) else {
                    self.rest = None;
                    break rest;
                };
                match rest[last] {
                    b',' => {
                        self.rest = Some(&rest[..last]);
                        break &rest[last + 1..];
                    }
                    b'"' if self.quoted_strings => match opening_quote(&rest[..last]) {
                        Some(opening) => end = opening,
                        None => {
                            self.rest = None;
                            break rest;
                        }
                    },
                    _ => end = last,
                }
            };
            let element = element.trim_ascii();
            if !element.is_empty() {
                return Some(element);
            }
        }
    }
}

/// Where the quoted string that ends right after `before` opens: the last quote in `before` not
/// escaped by a backslash.
fn opening_quote(before: &[u8]) -> Option<usize> {
    let mut end = before.len();
    while let Some(quote) = before[..end].iter().rposition(|&b| b == b'"') {
        let backslashes = before[..quote]
            .iter()
            .rev()
            .take_while(|&&b| b == b'\\')
            .count();
        if backslashes % 2 == 0 {
            return Some(quote);
        }
        end = quote;
    }
    None
}

/// The `for=` value of one `Forwarded` element (`for=192.0.2.60;proto=http;by=203.0.113.43`),
/// or `None` when it has none or more than one (RFC 7239 allows each parameter once).
fn forwarded_for(element: &[u8]) -> Option<&[u8]> {
    let mut found = None;
    let pairs = Pairs {
        rest: Some(element),
    };
    for pair in pairs {
        let Some(equals) = pair.iter().position(|&b| b == b'=') else {
            continue;
        };
        if pair[..equals].trim_ascii().eq_ignore_ascii_case(b"for") {
            if found.is_some() {
                return None;
            }
            found = Some(pair[equals + 1..].trim_ascii());
        }
    }
    found
}

/// The `;`-separated pairs of a `Forwarded` element, split outside quoted strings.
struct Pairs<'a> {
    rest: Option<&'a [u8]>,
}

impl<'a> Iterator for Pairs<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let rest = self.rest?;
        let mut quoted = false;
        let mut escaped = false;
        for (at, &byte) in rest.iter().enumerate() {
            match byte {
                _ if escaped => escaped = false,
                b'\\' if quoted => escaped = true,
                b'"' => quoted = !quoted,
                b';' if !quoted => {
                    self.rest = Some(&rest[at + 1..]);
                    return Some(&rest[..at]);
                }
                _ => {}
            }
        }
        self.rest = None;
        Some(rest)
    }
}

/// An address as proxies write it: `192.0.2.1`, `192.0.2.1:8080`, `2001:db8::1`,
/// `[2001:db8::1]`, `[2001:db8::1]:443`, optionally in double quotes (as `Forwarded` requires for
/// IPv6 and ports). Anything else, bytes that are not UTF-8 included, is `None`.
fn parse_node(node: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(node).ok()?.trim();
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
        return inside.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    let (host, port) = text.split_once(':')?;
    if !is_port(port) {
        return None;
    }
    host.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
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

    /// A header map with one line of `name` per value, in order.
    fn lines(name: &str, values: &[&[u8]]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(value).unwrap(),
            );
        }
        headers
    }

    fn xff(values: &[&str]) -> HeaderMap {
        let values: Vec<&[u8]> = values.iter().map(|value| value.as_bytes()).collect();
        lines("x-forwarded-for", &values)
    }

    /// The walk behind the trusted proxy 10.0.0.1.
    fn walk(headers: &HeaderMap, header: ForwardedHeader) -> Walk {
        client_address(ip("10.0.0.1"), headers, header, &trusted())
    }

    fn client(text: &str) -> Walk {
        Walk::Client(ip(text))
    }

    #[test]
    fn nodes_parse_in_every_form_proxies_write() {
        let node = |text: &str| parse_node(text.as_bytes());
        assert_eq!(node(" 192.0.2.1 "), Some(ip("192.0.2.1")));
        assert_eq!(node("192.0.2.1:8080"), Some(ip("192.0.2.1")));
        assert_eq!(node("2001:db8::1"), Some(ip("2001:db8::1")));
        assert_eq!(node("[2001:db8::1]"), Some(ip("2001:db8::1")));
        assert_eq!(node("[2001:db8::1]:443"), Some(ip("2001:db8::1")));
        assert_eq!(node("\"[2001:db8::1]:443\""), Some(ip("2001:db8::1")));
        assert_eq!(node("\"192.0.2.1:_hidden\""), Some(ip("192.0.2.1")));
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
            assert_eq!(node(bad), None, "{bad:?} was read as an address");
        }
        assert_eq!(parse_node(b"192.0.2.1\xff"), None);
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_the_header_says() {
        let headers = xff(&["203.0.113.1"]);
        let peer = ip("198.51.100.7");
        assert_eq!(
            client_address(peer, &headers, ForwardedHeader::XForwardedFor, &trusted()),
            Walk::Client(peer)
        );
    }

    #[test]
    fn the_rightmost_untrusted_address_is_the_client() {
        // The client sent "1.1.1.1" itself; 203.0.113.5 is what the first trusted proxy saw.
        let headers = xff(&["1.1.1.1, 203.0.113.5, 10.0.0.2"]);
        assert_eq!(
            walk(&headers, ForwardedHeader::XForwardedFor),
            client("203.0.113.5")
        );
    }

    #[test]
    fn several_header_lines_are_walked_as_one_list_from_the_last() {
        let headers = xff(&["1.1.1.1, 203.0.113.5", "10.0.0.3", "10.0.0.2"]);
        assert_eq!(
            walk(&headers, ForwardedHeader::XForwardedFor),
            client("203.0.113.5")
        );
        let headers = lines(
            "forwarded",
            &[
                b"for=1.1.1.1, for=203.0.113.5",
                b"for=10.0.0.3",
                b"for=10.0.0.2",
            ],
        );
        assert_eq!(
            walk(&headers, ForwardedHeader::Forwarded),
            client("203.0.113.5")
        );
    }

    #[test]
    fn what_the_client_wrote_left_of_the_appended_entry_cannot_change_the_key() {
        // A proxy appending the peer to the client's own line (nginx's
        // `$proxy_add_x_forwarded_for`): the client's part is never read.
        for poison in [
            &b"\x80junk"[..],
            b"\xff\xfe",
            b"garbage",
            b"\"unclosed",
            b"10.0.0.7, \xc3\x28",
            b"[::1, 300.1.1.1, ::::, \"",
        ] {
            let mut line = poison.to_vec();
            line.extend_from_slice(b", 203.0.113.9");
            assert_eq!(
                walk(
                    &lines("x-forwarded-for", &[&line]),
                    ForwardedHeader::XForwardedFor
                ),
                client("203.0.113.9"),
                "{:?}",
                String::from_utf8_lossy(&line)
            );
            let mut line = poison.to_vec();
            line.extend_from_slice(b", for=203.0.113.9;proto=https");
            assert_eq!(
                walk(&lines("forwarded", &[&line]), ForwardedHeader::Forwarded),
                client("203.0.113.9"),
                "{:?}",
                String::from_utf8_lossy(&line)
            );
        }
    }

    #[test]
    fn an_unreadable_entry_on_the_walk_ends_it_apart_from_the_hop() {
        let headers = xff(&["203.0.113.5, garbage, 10.0.0.2"]);
        assert_eq!(
            walk(&headers, ForwardedHeader::XForwardedFor),
            Walk::Unreadable(ip("10.0.0.2"))
        );
        let headers = lines("x-forwarded-for", &[b"203.0.113.5, \xff\xfe"]);
        assert_eq!(
            walk(&headers, ForwardedHeader::XForwardedFor),
            Walk::Unreadable(ip("10.0.0.1"))
        );
        for element in [
            &b"for=unknown"[..],
            b"for=_hidden",
            b"by=10.0.0.9;proto=https",
            b"for=10.0.0.9;for=203.0.113.5",
            b"for=\"\xc3\x28\"",
            b"for=\"unclosed",
        ] {
            let headers = lines("forwarded", &[element]);
            assert_eq!(
                walk(&headers, ForwardedHeader::Forwarded),
                Walk::Unreadable(ip("10.0.0.1")),
                "{:?}",
                String::from_utf8_lossy(element)
            );
        }
    }

    #[test]
    fn empty_elements_are_skipped() {
        for line in [
            "198.51.100.9, 203.0.113.5,",
            "198.51.100.9, 203.0.113.5, ,",
            ",,198.51.100.9,,203.0.113.5 ,\t,",
        ] {
            assert_eq!(
                walk(&xff(&[line]), ForwardedHeader::XForwardedFor),
                client("203.0.113.5"),
                "{line:?}"
            );
        }
        // A line of nothing but separators adds no entry; the next line is read.
        assert_eq!(
            walk(
                &xff(&["203.0.113.5", " , ,"]),
                ForwardedHeader::XForwardedFor
            ),
            client("203.0.113.5")
        );
        let headers = lines("forwarded", &[b", for=203.0.113.5,"]);
        assert_eq!(
            walk(&headers, ForwardedHeader::Forwarded),
            client("203.0.113.5")
        );
    }

    #[test]
    fn commas_and_semicolons_in_quoted_strings_do_not_split() {
        let headers = lines(
            "forwarded",
            &[b"for=198.51.100.9, for=203.0.113.5;ext=\"a, b; c=\\\"d, e\\\"\", for=10.0.0.2"],
        );
        assert_eq!(
            walk(&headers, ForwardedHeader::Forwarded),
            client("203.0.113.5")
        );
        // An escaped backslash before the closing quote: the quote still closes.
        let headers = lines(
            "forwarded",
            &[b"for=203.0.113.5;ext=\"x\\\\\", for=10.0.0.2"],
        );
        assert_eq!(
            walk(&headers, ForwardedHeader::Forwarded),
            client("203.0.113.5")
        );
    }

    #[test]
    fn a_chain_of_only_trusted_hops_ends_at_its_leftmost() {
        let headers = xff(&["10.9.9.9, 10.0.0.2"]);
        assert_eq!(
            walk(&headers, ForwardedHeader::XForwardedFor),
            client("10.9.9.9")
        );
        // No header at all: the trusted peer itself.
        assert_eq!(
            walk(&HeaderMap::new(), ForwardedHeader::XForwardedFor),
            client("10.0.0.1")
        );
    }

    #[test]
    fn the_walk_is_bounded() {
        let long = vec!["10.0.0.9"; MAX_HOPS + 10].join(",");
        let headers = xff(&[&format!("203.0.113.5,{long}")]);
        assert_eq!(
            walk(&headers, ForwardedHeader::XForwardedFor),
            Walk::Unreadable(ip("10.0.0.9"))
        );
        let exactly = vec!["10.0.0.9"; MAX_HOPS - 1].join(",");
        let headers = xff(&[&format!("203.0.113.5,{exactly}")]);
        assert_eq!(
            walk(&headers, ForwardedHeader::XForwardedFor),
            client("203.0.113.5")
        );
    }

    #[test]
    fn forwarded_elements_are_read_by_their_for_parameter() {
        let headers = lines(
            "forwarded",
            &[b"for=1.1.1.1, For=\"[2001:db8:cafe::17]:4711\";proto=https, by=10.0.0.1;for=10.0.0.2"],
        );
        assert_eq!(
            walk(&headers, ForwardedHeader::Forwarded),
            client("2001:db8:cafe::17")
        );
        // The `X-Forwarded-For` source ignores `Forwarded`.
        assert_eq!(
            walk(&headers, ForwardedHeader::XForwardedFor),
            client("10.0.0.1")
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
            client("203.0.113.5")
        );
    }
}
