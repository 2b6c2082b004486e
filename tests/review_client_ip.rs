//! `ClientIp`'s keys attacked through the public API: the direct path (no trusted proxies) and
//! the walk through trusted proxies, for every prefix length a `u8` can carry, against a
//! reference written here bit by bit.
#![cfg(feature = "tower")]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use http::Request;
use proptest::prelude::*;
use tollgate::tower::{Cidr, ClientIp, ClientKey, KeyExtractor, RequestHead};

// ---------------------------------------------------------------------------------------------
// The reference: byte by byte, no shifts of whole words, no `to_ipv4_mapped`.

/// `::ffff:a.b.c.d` becomes `a.b.c.d`; every other IPv6 address (`::1`, `::a.b.c.d`,
/// `64:ff9b::a.b.c.d`, `::ffff:0:a.b.c.d`) stays IPv6.
fn ref_canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => {
            let o = v6.octets();
            if o[..10].iter().all(|&b| b == 0) && o[10] == 0xff && o[11] == 0xff {
                IpAddr::V4(Ipv4Addr::new(o[12], o[13], o[14], o[15]))
            } else {
                address
            }
        }
        v4 => v4,
    }
}

/// Clears every bit at index `prefix` or later (bit 0 the most significant of `octets[0]`).
fn ref_keep(octets: &mut [u8], prefix: u8) {
    for (i, octet) in octets.iter_mut().enumerate() {
        for bit in 0..8 {
            if i * 8 + bit >= usize::from(prefix) {
                *octet &= !(0x80u8 >> bit);
            }
        }
    }
}

/// The key `ClientIp` with these prefixes must give the client at `address`.
fn ref_key(address: IpAddr, v4_prefix: u8, v6_prefix: u8) -> IpAddr {
    match ref_canonical(address) {
        IpAddr::V4(v4) => {
            let mut o = v4.octets();
            ref_keep(&mut o, v4_prefix);
            IpAddr::V4(Ipv4Addr::from(o))
        }
        IpAddr::V6(v6) => {
            let mut o = v6.octets();
            ref_keep(&mut o, v6_prefix);
            IpAddr::V6(Ipv6Addr::from(o))
        }
    }
}

// ---------------------------------------------------------------------------------------------

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// A request from `peer` (if any, as a `SocketAddr` extension) with `forwarded` as its
/// `X-Forwarded-For` (if any).
fn request(peer: Option<IpAddr>, forwarded: Option<&str>) -> Request<()> {
    let mut request = Request::new(());
    if let Some(peer) = peer {
        request
            .extensions_mut()
            .insert(SocketAddr::new(peer, 40_000));
    }
    if let Some(forwarded) = forwarded {
        request
            .headers_mut()
            .insert("x-forwarded-for", forwarded.parse().unwrap());
    }
    request
}

fn key<E: KeyExtractor<Key = ClientKey>>(
    extractor: &E,
    peer: Option<IpAddr>,
    forwarded: Option<&str>,
) -> Option<ClientKey> {
    extractor.extract(&RequestHead::of(&request(peer, forwarded)))
}

fn proxies() -> [Cidr; 2] {
    ["10.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()]
}

/// The direct extractor and one behind `proxies()`, with the same prefixes.
fn both(v4: u8, v6: u8) -> (ClientIp, ClientIp) {
    (
        ClientIp::peer().ipv4_prefix(v4).ipv6_prefix(v6),
        ClientIp::behind_proxies(proxies())
            .ipv4_prefix(v4)
            .ipv6_prefix(v6),
    )
}

/// Checks the key of `client` on every path against the reference; `Err` names what differed.
fn check(v4: u8, v6: u8, client: IpAddr) -> Result<(), String> {
    let (direct, proxied) = both(v4, v6);
    let want = Some(ClientKey::Ip(ref_key(client, v4, v6)));
    let text = client.to_string();
    let after_a_lie = format!("1.2.3.4, {text}, fd00::1, 10.0.0.1");
    let cases: [(&str, &ClientIp, IpAddr, Option<&str>); 7] = [
        ("direct", &direct, client, None),
        // A forwarding header is nobody's word without trusted proxies.
        (
            "direct, spoofed XFF",
            &direct,
            client,
            Some("203.0.113.1, 2001:db8::1"),
        ),
        ("trusted IPv4 proxy", &proxied, ip("10.1.2.3"), Some(&text)),
        (
            "trusted mapped proxy",
            &proxied,
            ip("::ffff:10.1.2.3"),
            Some(&text),
        ),
        ("trusted IPv6 proxy", &proxied, ip("fd00::7"), Some(&text)),
        // From the right: what the client wrote left of its own entry is never read.
        (
            "two trusted hops after a lie",
            &proxied,
            ip("10.9.9.9"),
            Some(&after_a_lie),
        ),
        // Not a trusted proxy: keyed by itself, whatever it writes.
        (
            "untrusted peer, spoofed XFF",
            &proxied,
            client,
            Some("10.0.0.1, 1.2.3.4"),
        ),
    ];
    for (path, extractor, peer, forwarded) in cases {
        // Behind proxies, a client inside the trusted ranges is one more hop; the walk ends on
        // it all the same (the header has nothing left of it), except in the lie case.
        if path == "two trusted hops after a lie" && proxies().iter().any(|r| r.contains(client)) {
            continue;
        }
        if path == "untrusted peer, spoofed XFF" && proxies().iter().any(|r| r.contains(client)) {
            continue;
        }
        let got = key(extractor, Some(peer), forwarded);
        if got != want {
            return Err(format!(
                "v4 /{v4}, v6 /{v6}, client {client}, {path}: got {got:?}, want {want:?}"
            ));
        }
        let head_request = request(Some(peer), forwarded);
        let address = extractor.address(&RequestHead::of(&head_request));
        if address.map(ClientKey::Ip) != want {
            return Err(format!(
                "v4 /{v4}, v6 /{v6}, client {client}, {path}: address() {address:?}, want {want:?}"
            ));
        }
    }
    Ok(())
}

/// Addresses at the edges: all zeros, all ones, the mapped, compatible and loopback forms, and
/// neighbours of the mapped prefix that are not it.
fn edge_addresses() -> Vec<IpAddr> {
    [
        "0.0.0.0",
        "255.255.255.255",
        "198.51.100.77",
        "127.0.0.1",
        "128.0.0.1",
        "::",
        "::1",
        "::2",
        "::203.0.113.9",          // IPv4-compatible: stays IPv6
        "::ffff:198.51.100.77",   // mapped: IPv4
        "::ffff:0.0.0.0",         // mapped: IPv4 0.0.0.0
        "::ffff:255.255.255.255", // mapped: IPv4 broadcast
        "::fffe:198.51.100.77",   // next to the mapped prefix: IPv6
        "::1:ffff:198.51.100.77", // ditto
        "::ffff:0:198.51.100.77", // IPv4-translated (RFC 2765): IPv6
        "64:ff9b::198.51.100.77", // NAT64: IPv6
        "2001:db8:1:2:3:4:5:6",
        "fe80::1",
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        "8000::",
        "::8000:0:0:0",
    ]
    .iter()
    .map(|text| ip(text))
    .collect()
}

#[test]
fn every_prefix_length_on_every_path_matches_the_reference() {
    let addresses = edge_addresses();
    for prefix in 0..=255u8 {
        for client in &addresses {
            // Each family's prefix swept while the other is at its default, at 0 and at the top.
            for (v4, v6) in [
                (prefix, 64),
                (32, prefix),
                (prefix, prefix),
                (prefix, 0),
                (0, prefix),
                (prefix, 255),
                (255, prefix),
            ] {
                check(v4, v6, *client).unwrap();
            }
        }
    }
}

#[test]
fn the_mapped_loopback_and_compatible_forms() {
    let default = ClientIp::peer();
    let k = |text: &str| key(&default, Some(ip(text)), None);
    // Mapped is IPv4, and each IPv4 client apart (not one /64 for all of them).
    assert_eq!(
        k("::ffff:198.51.100.1"),
        Some(ClientKey::Ip(ip("198.51.100.1")))
    );
    assert_ne!(k("::ffff:198.51.100.1"), k("::ffff:198.51.100.2"));
    assert_eq!(k("::ffff:198.51.100.1"), k("198.51.100.1"));
    // `::1` and `::a.b.c.d` stay IPv6 (and so share the /64 `::`).
    assert_eq!(k("::1"), Some(ClientKey::Ip(ip("::"))));
    assert_eq!(k("::203.0.113.9"), Some(ClientKey::Ip(ip("::"))));
    let whole = ClientIp::peer().ipv6_prefix(128);
    assert_eq!(
        key(&whole, Some(ip("::1")), None),
        Some(ClientKey::Ip(ip("::1")))
    );
    assert_eq!(
        key(&whole, Some(ip("::203.0.113.9")), None),
        Some(ClientKey::Ip(ip("::203.0.113.9")))
    );
    assert_ne!(
        key(&whole, Some(ip("::203.0.113.9")), None),
        key(&whole, Some(ip("203.0.113.9")), None)
    );
}

#[test]
fn setters_are_independent_and_the_last_one_wins() {
    let v4 = ip("198.51.100.77");
    let v6 = ip("2001:db8:1:2:3:4:5:6");
    for a in [0u8, 1, 7, 8, 24, 31, 32, 33, 64, 127, 128, 129, 200, 255] {
        for b in [0u8, 1, 16, 32, 48, 63, 64, 65, 127, 128, 200, 255] {
            // Set, then set again: only the last value counts.
            let extractor = ClientIp::peer()
                .ipv4_prefix(b)
                .ipv6_prefix(a)
                .ipv4_prefix(a)
                .ipv6_prefix(b);
            assert_eq!(
                key(&extractor, Some(v4), None),
                Some(ClientKey::Ip(ref_key(v4, a, 0))),
                "ipv4 /{a} after /{b}"
            );
            assert_eq!(
                key(&extractor, Some(v6), None),
                Some(ClientKey::Ip(ref_key(v6, 0, b))),
                "ipv6 /{b} after /{a}"
            );
        }
    }
}

#[test]
fn the_peer_from_an_ip_addr_extension_or_a_peer_source_is_keyed_alike() {
    for client in edge_addresses() {
        for (v4, v6) in [(24, 48), (32, 64), (0, 0), (255, 255)] {
            let want = Some(ClientKey::Ip(ref_key(client, v4, v6)));
            let mut request = Request::new(());
            request.extensions_mut().insert(client);
            let head = RequestHead::of(&request);
            let direct = ClientIp::peer().ipv4_prefix(v4).ipv6_prefix(v6);
            assert_eq!(direct.extract(&head), want, "{client} as IpAddr");
            let sourced = ClientIp::peer()
                .ipv4_prefix(v4)
                .ipv6_prefix(v6)
                .peer_source(move |_: &http::Extensions| Some(client));
            assert_eq!(
                sourced.extract(&RequestHead::of(&Request::new(()))),
                want,
                "{client} from a peer source"
            );
        }
    }
}

#[test]
fn a_request_without_its_peer_has_no_key_on_either_path() {
    let (direct, proxied) = both(24, 48);
    for forwarded in [None, Some("198.51.100.7"), Some("198.51.100.7, 10.0.0.1")] {
        assert_eq!(key(&direct, None, forwarded), None, "{forwarded:?}");
        assert_eq!(key(&proxied, None, forwarded), None, "{forwarded:?}");
        let empty = request(None, forwarded);
        assert_eq!(direct.address(&RequestHead::of(&empty)), None);
        assert_eq!(proxied.address(&RequestHead::of(&empty)), None);
    }
    assert!(direct.why_no_key().is_some());
    assert!(proxied.why_no_key().is_some());
    let none = ClientIp::peer().peer_source(|_: &http::Extensions| None);
    assert_eq!(key(&none, Some(ip("198.51.100.7")), None), None);
    // Nothing counted as unreadable forwarding on any of these.
    assert_eq!(direct.unreadable_forwarding(), 0);
    assert_eq!(proxied.unreadable_forwarding(), 0);
}

#[test]
fn unreadable_forwarding_is_still_keyed_by_the_proxy_and_counted() {
    let (direct, proxied) = both(24, 48);
    // Without trusted proxies garbage is never read.
    assert_eq!(
        key(&direct, Some(ip("10.1.2.3")), Some("garbage")),
        Some(ClientKey::Ip(ip("10.1.2.0")))
    );
    assert_eq!(direct.unreadable_forwarding(), 0);
    assert_eq!(
        key(&proxied, Some(ip("10.1.2.3")), Some("garbage")),
        Some(ClientKey::UnreadableForwarding(ip("10.1.2.3")))
    );
    assert_eq!(proxied.unreadable_forwarding(), 1);
    // The empty list of proxies is the direct path.
    let empty = ClientIp::behind_proxies([]).ipv4_prefix(24);
    assert_eq!(
        key(&empty, Some(ip("10.1.2.3")), Some("198.51.100.7")),
        Some(ClientKey::Ip(ip("10.1.2.0")))
    );
}

#[test]
fn debug_shows_the_prefixes_as_set_and_clamped() {
    assert_eq!(
        format!("{:?}", ClientIp::peer()),
        "ClientIp { grouping: Grouping { ipv4_prefix: 32, ipv6_prefix: 64 }, trusted: [], \
         header: XForwardedFor, unreadable: 0, .. }"
    );
    for v4 in 0..=255u8 {
        for v6 in [
            0u8, 1, 31, 32, 33, 63, 64, 65, 96, 127, 128, 129, 200, 255, v4,
        ] {
            let text = format!("{:?}", ClientIp::peer().ipv4_prefix(v4).ipv6_prefix(v6));
            let want = format!(
                "Grouping {{ ipv4_prefix: {}, ipv6_prefix: {} }}",
                v4.min(32),
                v6.min(128)
            );
            assert!(text.contains(&want), "/{v4} /{v6}: {text}");
        }
    }
}

// ---------------------------------------------------------------------------------------------

fn any_address() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<u32>().prop_map(|a| IpAddr::V4(Ipv4Addr::from(a))),
        any::<u128>().prop_map(|a| IpAddr::V6(Ipv6Addr::from(a))),
        any::<u32>().prop_map(|a| IpAddr::V6(Ipv4Addr::from(a).to_ipv6_mapped())),
        any::<u32>().prop_map(|a| IpAddr::V6(Ipv6Addr::from(u128::from(a)))),
        // Near the mapped prefix: bits 80..96 anything.
        (any::<u16>(), any::<u32>())
            .prop_map(|(m, a)| IpAddr::V6(Ipv6Addr::from((u128::from(m) << 32) | u128::from(a)))),
    ]
}

/// A prefix length, with the interesting ones often.
fn any_prefix() -> impl Strategy<Value = u8> {
    prop_oneof![
        any::<u8>(),
        0u8..=33,
        prop::sample::select(vec![0u8, 1, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255]),
    ]
}

/// Whether two addresses agree on their family and the first bits the prefixes keep.
fn ref_same_client(a: IpAddr, b: IpAddr, v4: u8, v6: u8) -> bool {
    match (ref_canonical(a), ref_canonical(b)) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let bits = u32::from(v4.min(32));
            (0..bits).all(|i| {
                (a.octets()[i as usize / 8] ^ b.octets()[i as usize / 8]) & (0x80 >> (i % 8)) == 0
            })
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let bits = u32::from(v6.min(128));
            (0..bits).all(|i| {
                (a.octets()[i as usize / 8] ^ b.octets()[i as usize / 8]) & (0x80 >> (i % 8)) == 0
            })
        }
        _ => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn random_clients_and_prefixes_match_the_reference(
        client in any_address(),
        v4 in any_prefix(),
        v6 in any_prefix(),
    ) {
        if let Err(why) = check(v4, v6, client) {
            prop_assert!(false, "{}", why);
        }
    }

    /// Two clients share a key exactly when they share the prefix (so no one can pick a key out
    /// of its own prefix, nor split its prefix into several keys), on both paths.
    #[test]
    fn two_clients_share_a_key_exactly_when_they_share_the_prefix(
        a in any_address(),
        b in any_address(),
        v4 in any_prefix(),
        v6 in any_prefix(),
    ) {
        let (direct, proxied) = both(v4, v6);
        let same = ref_same_client(a, b, v4, v6);
        prop_assert_eq!(key(&direct, Some(a), None) == key(&direct, Some(b), None), same);
        let (ta, tb) = (a.to_string(), b.to_string());
        let through = |c: &str| key(&proxied, Some(ip("10.0.0.1")), Some(c));
        prop_assert_eq!(through(&ta) == through(&tb), same);
    }

    /// Whatever an untrusted peer writes, its key is its own.
    #[test]
    fn an_untrusted_peer_cannot_steer_its_key(
        peer in any_address(),
        claimed in any_address(),
        v4 in any_prefix(),
        v6 in any_prefix(),
    ) {
        prop_assume!(!proxies().iter().any(|range| range.contains(peer)));
        let (direct, proxied) = both(v4, v6);
        let want = Some(ClientKey::Ip(ref_key(peer, v4, v6)));
        let forwarded = format!("{claimed}, 10.0.0.1");
        prop_assert_eq!(key(&direct, Some(peer), Some(&forwarded)), want.clone());
        prop_assert_eq!(key(&proxied, Some(peer), Some(&forwarded)), want);
    }
}
