//! Forwarding headers behind a trusted proxy: what a client writes cannot choose its key, valid
//! lists read as valid, and the proxy's own requests never share a limit with its clients'.
//!
//! Keys are checked two ways: by the extractor on requests built here, and by raw HTTP/1.1 bytes
//! sent over loopback to a real axum server behind the layer (the bytes a proxy such as nginx
//! would pass on, non-ASCII ones included).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::routing::get;
use http::{HeaderValue, Request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate::tower::{
    Cidr, ClientIp, ClientKey, ForwardedHeader, KeyExtractor, PeerSource, RateLimitLayer,
    RequestHead,
};
use tollgate::{Algorithm, MonotonicClock, RateLimiterService, Rule};

const LIMIT: usize = 5;

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn trusted() -> Vec<Cidr> {
    vec!["10.0.0.0/8".parse().unwrap()]
}

/// The key `extractor` gives a request from the trusted proxy 10.0.0.1 carrying `lines` of
/// `header`.
fn key_of(extractor: &ClientIp, header: &str, lines: &[&[u8]]) -> Option<ClientKey> {
    let mut request = Request::get("/").body(()).unwrap();
    for line in lines {
        request.headers_mut().append(
            http::HeaderName::from_bytes(header.as_bytes()).unwrap(),
            HeaderValue::from_bytes(line).unwrap(),
        );
    }
    request
        .extensions_mut()
        .insert(SocketAddr::new(ip("10.0.0.1"), 443));
    extractor.extract(&RequestHead::of(&request))
}

fn xff_key(lines: &[&[u8]]) -> Option<ClientKey> {
    key_of(
        &ClientIp::behind_proxies(trusted()),
        "x-forwarded-for",
        lines,
    )
}

fn forwarded_key(lines: &[&[u8]]) -> Option<ClientKey> {
    let extractor = ClientIp::behind_proxies(trusted()).header(ForwardedHeader::Forwarded);
    key_of(&extractor, "forwarded", lines)
}

fn client(text: &str) -> Option<ClientKey> {
    Some(ClientKey::Ip(ip(text)))
}

#[test]
fn what_a_client_writes_left_of_the_appended_address_does_not_change_its_key() {
    for poison in [
        &b"\x80junk"[..],
        b"\xff\xfe\xfd",
        b"not an address",
        b"198.51.100.1, \xc3\x28, unknown",
        b"\"unclosed",
        b"[::1, 300.1.1.1, ::::, \"",
    ] {
        let shown = String::from_utf8_lossy(poison);
        let line = [poison, b", 203.0.113.9"].concat();
        assert_eq!(xff_key(&[&line]), client("203.0.113.9"), "{shown:?}");
        // The client's own line, then the proxy's: one list.
        assert_eq!(
            xff_key(&[poison, b"203.0.113.9"]),
            client("203.0.113.9"),
            "{shown:?}"
        );
        let line = [poison, b", for=203.0.113.9;proto=https"].concat();
        assert_eq!(forwarded_key(&[&line]), client("203.0.113.9"), "{shown:?}");
    }
}

#[test]
fn empty_list_elements_are_ignored() {
    for line in [
        &b"198.51.100.9, 203.0.113.5,"[..],
        b"198.51.100.9, 203.0.113.5, , ",
        b",198.51.100.9,,203.0.113.5",
    ] {
        let shown = String::from_utf8_lossy(line);
        assert_eq!(xff_key(&[line]), client("203.0.113.5"), "{shown:?}");
    }
    assert_eq!(
        forwarded_key(&[b"for=198.51.100.9, for=203.0.113.5,"]),
        client("203.0.113.5")
    );
    // nginx's `"$http_forwarded, for=$remote_addr"` when the client sent no `Forwarded`.
    assert_eq!(
        forwarded_key(&[b", for=203.0.113.5"]),
        client("203.0.113.5")
    );
}

#[test]
fn commas_in_quoted_strings_of_forwarded_do_not_split_elements() {
    assert_eq!(
        forwarded_key(&[b"for=198.51.100.9, for=203.0.113.5;ext=\"a, for=10.0.0.3\""]),
        client("203.0.113.5")
    );
    assert_eq!(
        forwarded_key(&[
            b"for=\"[2001:db8::1]:80\";ext=\"x, y\", for=203.0.113.5;ext=\"\\\", for=10.0.0.3\""
        ]),
        client("203.0.113.5")
    );
}

#[test]
fn several_lines_are_one_list_in_order() {
    assert_eq!(
        xff_key(&[b"198.51.100.9", b"203.0.113.5, 10.0.0.7", b"10.0.0.2"]),
        client("203.0.113.5")
    );
    assert_eq!(
        forwarded_key(&[b"for=198.51.100.9, for=203.0.113.5", b"for=10.0.0.2"]),
        client("203.0.113.5")
    );
}

#[test]
fn an_unreadable_entry_on_the_walk_has_a_key_apart_from_the_proxy_and_is_counted() {
    let extractor = ClientIp::behind_proxies(trusted());
    let counted = extractor.clone();
    let unreadable = Some(ClientKey::UnreadableForwarding(ip("10.0.0.1")));
    for line in [
        &b"203.0.113.5, garbage"[..],
        b"203.0.113.5, \xff",
        b"unknown",
    ] {
        let key = key_of(&extractor, "x-forwarded-for", &[line]);
        assert_eq!(key, unreadable, "{:?}", String::from_utf8_lossy(line));
        assert_ne!(key, key_of(&extractor, "x-forwarded-for", &[]));
    }
    assert_eq!(counted.unreadable_forwarding(), 3);
    // The entry after a trusted hop is unreadable: keyed by that hop, apart from it too.
    assert_eq!(
        key_of(&extractor, "x-forwarded-for", &[b"garbage, 10.0.0.2"]),
        Some(ClientKey::UnreadableForwarding(ip("10.0.0.2")))
    );
}

/// The peer as axum records it, named here so that these tests need no crate feature.
#[derive(Clone, Copy)]
struct AxumPeer;

impl PeerSource for AxumPeer {
    fn peer(&self, extensions: &http::Extensions) -> Option<IpAddr> {
        extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|info| info.0.ip())
    }
}

/// A server on a fresh loopback port behind a layer of `LIMIT` requests per hour per client,
/// which trusts 127.0.0.1 as its proxy; and the extractor (its counts shared with the layer's).
async fn serve_behind_trusted_loopback() -> (SocketAddr, ClientIp<AxumPeer>) {
    let service = RateLimiterService::<ClientKey, _>::new(
        Algorithm::SlidingWindowLog,
        [("free", Rule::per_hour(LIMIT as u64).unwrap())],
        MonotonicClock::new(),
    )
    .unwrap();
    let extractor = ClientIp::behind_proxies(["127.0.0.1/32".parse().unwrap()]).peer_from(AxumPeer);
    let layer = RateLimitLayer::builder(Arc::new(service), extractor.clone(), "free").build();
    let app = Router::new()
        .route("/hello", get(|| async { "hello" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    (addr, extractor)
}

/// The status code of `GET /hello` sent as raw bytes with `header_lines` (each `name: value`,
/// bytes as given).
async fn status(addr: SocketAddr, header_lines: &[&[u8]]) -> u16 {
    let mut request = b"GET /hello HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n".to_vec();
    for line in header_lines {
        request.extend_from_slice(line);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"\r\n");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(&request).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8_lossy(&response);
    text.split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_line_is_keyed_as_the_clean_one_and_the_proxy_keeps_its_own_limit() {
    let (addr, _) = serve_behind_trusted_loopback().await;
    // The client's quota, spent with lines it poisoned itself (as nginx passes them on).
    for _ in 0..LIMIT {
        assert_eq!(
            status(addr, &[b"x-forwarded-for: \x80junk, 203.0.113.9"]).await,
            200
        );
    }
    assert_eq!(status(addr, &[b"x-forwarded-for: 203.0.113.9"]).await, 429);
    assert_eq!(
        status(addr, &[b"x-forwarded-for: \xffother, 203.0.113.9"]).await,
        429
    );
    // The proxy's own health check is not the client.
    assert_eq!(status(addr, &[]).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_chains_never_spend_the_proxys_own_limit() {
    let (addr, extractor) = serve_behind_trusted_loopback().await;
    for _ in 0..2 * LIMIT {
        status(addr, &[b"x-forwarded-for: 203.0.113.9, garbage"]).await;
    }
    assert_eq!(extractor.unreadable_forwarding(), 2 * LIMIT as u64);
    assert_eq!(status(addr, &[b"x-forwarded-for: unknown"]).await, 429);
    for _ in 0..LIMIT {
        assert_eq!(status(addr, &[]).await, 200);
    }
    assert_eq!(status(addr, &[]).await, 429);
}
