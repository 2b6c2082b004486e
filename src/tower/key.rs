//! Who the client is: [`KeyExtractor`] and the extractors that come with the layer.
//!
//! | extractor | key | for |
//! |---|---|---|
//! | [`ClientIp::peer`] | the TCP peer's address, IPv6 grouped by /64 | a server facing clients directly |
//! | [`ClientIp::behind_proxies`] | the rightmost address not in your trusted proxy ranges | a server behind load balancers or CDNs you run or pay for |
//! | [`HeaderKey`] | a header's value (`x-api-key`) | APIs with keys |
//! | [`key_fn`] | anything a closure returns | everything else |
//! | [`GlobalKey`] | one key for everyone | protecting a backend as a whole |
//! | [`KeyExtractor::or`] | the first extractor's key, else the second's | API key if given, else the address |
//!
//! An extractor that finds no key returns `None`, and the layer answers as its
//! [`on_missing_key`](super::RateLimitLayerBuilder::on_missing_key) setting says. Extractors
//! never panic: headers are untrusted input.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::Once;

use http::{Extensions, HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};

use super::addr::{Cidr, Grouping};
use super::error::InvalidHeaderName;
use super::forwarded::{ForwardedHeader, Walk, client_address};
use crate::sync::{Ordering, Word};

/// What the layer's hooks see of a request: everything but its body, so that hooks are written
/// once for every body type.
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'a> {
    method: &'a Method,
    uri: &'a Uri,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
}

impl<'a> RequestHead<'a> {
    /// The head of `request`.
    pub fn of<B>(request: &'a Request<B>) -> Self {
        RequestHead {
            method: request.method(),
            uri: request.uri(),
            headers: request.headers(),
            extensions: request.extensions(),
        }
    }

    /// The request's method.
    pub fn method(&self) -> &'a Method {
        self.method
    }

    /// The request's URI.
    pub fn uri(&self) -> &'a Uri {
        self.uri
    }

    /// The request's headers.
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The request's extensions (where servers put the peer's address).
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }
}

/// Finds the key that identifies a request's client.
///
/// # Examples
///
/// ```
/// use http::Request;
/// use tollgate::tower::{ClientKey, HeaderKey, KeyExtractor, RequestHead};
///
/// let by_api_key = HeaderKey::new("x-api-key")?;
/// let request = Request::builder().header("x-api-key", "pro-123").body(())?;
/// let key = by_api_key.extract(&RequestHead::of(&request));
/// assert_eq!(key, Some(ClientKey::Header("pro-123".parse()?)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait KeyExtractor {
    /// The key; the limiter's map holds one limiter per key and plan.
    type Key;

    /// The key of the request's client, or `None` when the request does not carry one.
    fn extract(&self, head: &RequestHead<'_>) -> Option<Self::Key>;

    /// Why [`extract`](KeyExtractor::extract) can find no key when the cause is in the server's
    /// setup rather than in the request (an address the server does not record), worded for the
    /// layer's answer to such a request; `None` (the default) when a request without a key is the
    /// client's doing.
    fn why_no_key(&self) -> Option<&'static str> {
        None
    }

    /// This extractor's key, or `other`'s when this one finds none.
    fn or<E>(self, other: E) -> Or<Self, E>
    where
        Self: Sized,
        E: KeyExtractor<Key = Self::Key>,
    {
        Or {
            first: self,
            second: other,
        }
    }
}

/// The key the built-in extractors produce, so that they combine with [`KeyExtractor::or`].
///
/// Keys of different kinds never collide: an API key that spells an address is not that address.
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientKey {
    /// Everyone ([`GlobalKey`]).
    Global,
    /// An address, grouped by its prefix ([`ClientIp`]).
    Ip(IpAddr),
    /// A header's value ([`HeaderKey`]).
    Header(HeaderValue),
    /// Every request that came through the trusted proxy at this address with a forwarding
    /// header unreadable where [`ClientIp::behind_proxies`] had to read it (or longer than it
    /// reads): limited together, and never with the proxy's own requests, which are keyed
    /// [`Ip`](ClientKey::Ip).
    UnreadableForwarding(IpAddr),
}

impl Hash for ClientKey {
    /// One write per key: the default hasher's cost is per call as much as per byte. (Keys of
    /// different kinds may hash alike; equality still tells them apart.)
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        match self {
            ClientKey::Global => state.write_u8(0),
            // `write_usize` is the width the standard hasher takes fastest.
            ClientKey::Ip(IpAddr::V4(address)) => state.write_usize(u32::from(*address) as usize),
            ClientKey::Ip(IpAddr::V6(address)) => {
                let bits = u128::from(*address);
                state.write_u64((bits >> 64) as u64);
                state.write_u64(bits as u64);
            }
            ClientKey::Header(value) => state.write(value.as_bytes()),
            ClientKey::UnreadableForwarding(proxy) => {
                state.write_u8(3);
                match proxy {
                    IpAddr::V4(address) => state.write_u32(u32::from(*address)),
                    IpAddr::V6(address) => state.write_u128(u128::from(*address)),
                }
            }
        }
    }
}

impl Clone for ClientKey {
    /// A header value is copied into its own buffer: the value read from a request shares the
    /// connection's read buffer, and a key kept in the limiter's map must not hold that alive.
    /// (The layer clones a key only when the client's limiter is first made.)
    fn clone(&self) -> Self {
        match self {
            ClientKey::Global => ClientKey::Global,
            ClientKey::Ip(address) => ClientKey::Ip(*address),
            ClientKey::UnreadableForwarding(proxy) => ClientKey::UnreadableForwarding(*proxy),
            ClientKey::Header(value) => ClientKey::Header(
                HeaderValue::from_bytes(value.as_bytes()).unwrap_or_else(|_| value.clone()),
            ),
        }
    }
}

impl fmt::Display for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientKey::Global => f.write_str("global"),
            ClientKey::Ip(address) => write!(f, "{address}"),
            ClientKey::Header(value) => write!(f, "{}", String::from_utf8_lossy(value.as_bytes())),
            ClientKey::UnreadableForwarding(proxy) => {
                write!(f, "unreadable forwarding header via {proxy}")
            }
        }
    }
}

/// Where a server records the TCP peer's address among a request's extensions.
///
/// Implemented by [`ConnectionPeer`] (the default: where hyper-util, axum and tonic servers put
/// it) and by every `Fn(&Extensions) -> Option<IpAddr>`.
pub trait PeerSource {
    /// The peer's address, if the request carries it.
    fn peer(&self, extensions: &Extensions) -> Option<IpAddr>;

    /// What [`peer`](PeerSource::peer) looks for and how a server provides it, for the answer to
    /// a request without it.
    fn missing_peer(&self) -> &'static str {
        "the peer's address is not among the request's extensions where the peer source given to \
         `ClientIp` looks for it"
    }
}

impl<F: Fn(&Extensions) -> Option<IpAddr>> PeerSource for F {
    #[inline]
    fn peer(&self, extensions: &Extensions) -> Option<IpAddr> {
        self(extensions)
    }
}

/// The TCP peer's address wherever the servers this crate knows record it, in this order:
///
/// - a [`SocketAddr`] (or [`IpAddr`]) extension: what a hyper or hyper-util server loop inserts
///   itself (`request.extensions_mut().insert(peer)`, see `examples/reverse_proxy.rs`);
/// - axum's `ConnectInfo<SocketAddr>`, with tollgate's feature `axum`: serve the router with
///   `into_make_service_with_connect_info::<SocketAddr>()`;
/// - tonic's `TcpConnectInfo`, with tollgate's feature `tonic`: tonic's server inserts it for
///   every request on a TCP connection (`Server::builder().layer(...)` sees it).
///
/// Other servers (TLS connection info, Unix sockets) name theirs with
/// [`ClientIp::peer_source`]. A request where none is found has no key, and the layer's answer
/// to it says what was looked for ([`KeyExtractor::why_no_key`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct ConnectionPeer;

/// What [`ConnectionPeer`] looks for, worded for the answer to a request without it.
const CONNECTION_PEER_MISSING: &str = "the peer's address is not among the request's \
     extensions: ClientIp looks for a `SocketAddr` or `IpAddr` extension, axum's \
     `ConnectInfo<SocketAddr>` (with tollgate's feature `axum`; serve with \
     `into_make_service_with_connect_info::<SocketAddr>()`) and tonic's `TcpConnectInfo` (with \
     tollgate's feature `tonic`); elsewhere, insert the peer's `SocketAddr` into each request's \
     extensions, or name where it is with `ClientIp::peer_source`";

impl PeerSource for ConnectionPeer {
    #[inline]
    fn peer(&self, extensions: &Extensions) -> Option<IpAddr> {
        if let Some(address) = extensions.get::<SocketAddr>() {
            return Some(address.ip());
        }
        if let Some(address) = extensions.get::<IpAddr>() {
            return Some(*address);
        }
        #[cfg(feature = "axum")]
        if let Some(info) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
            return Some(info.0.ip());
        }
        #[cfg(feature = "tonic")]
        if let Some(address) = extensions
            .get::<tonic::transport::server::TcpConnectInfo>()
            .and_then(|info| info.remote_addr())
        {
            return Some(address.ip());
        }
        None
    }

    fn missing_peer(&self) -> &'static str {
        CONNECTION_PEER_MISSING
    }
}

/// Keys a request by its client's IP address: the TCP peer, or the address behind trusted
/// proxies. IPv6 addresses are grouped by a prefix (/64 by default) and IPv4-mapped IPv6 addresses
/// are read as IPv4 first.
///
/// The peer address is read by [`ConnectionPeer`]: a `SocketAddr` extension, axum's
/// `ConnectInfo<SocketAddr>` (feature `axum`) or tonic's `TcpConnectInfo` (feature `tonic`). With
/// axum:
///
/// ```
/// # #[cfg(feature = "axum")] {
/// use std::net::SocketAddr;
/// use tollgate::tower::ClientIp;
///
/// let key = ClientIp::peer();
/// let app = axum::Router::new(); // .layer(RateLimitLayer::builder(backend, key, plan).build())
/// let make_service = app.into_make_service_with_connect_info::<SocketAddr>();
/// # let _ = (key, make_service);
/// # }
/// ```
///
/// A server that records the peer elsewhere names its own [`PeerSource`]
/// ([`peer_source`](ClientIp::peer_source)). A request where the peer is not found has no key;
/// the layer's answer to it says what was looked for, and the first such request in a process
/// writes the same to standard error.
#[derive(Clone)]
pub struct ClientIp<S = ConnectionPeer> {
    peer: S,
    grouping: Grouping,
    /// Empty for the peer itself.
    trusted: Arc<[Cidr]>,
    header: ForwardedHeader,
    /// Requests keyed [`ClientKey::UnreadableForwarding`], shared by clones.
    unreadable: Arc<Word>,
}

impl<S> fmt::Debug for ClientIp<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientIp")
            .field("grouping", &self.grouping)
            .field("trusted", &self.trusted)
            .field("header", &self.header)
            .field("unreadable", &self.unreadable_forwarding())
            .finish_non_exhaustive()
    }
}

impl ClientIp {
    /// The TCP peer's address. Forwarding headers are ignored: anyone can write them.
    pub fn peer() -> Self {
        ClientIp {
            peer: ConnectionPeer,
            grouping: Grouping::DEFAULT,
            trusted: Arc::from([]),
            header: ForwardedHeader::XForwardedFor,
            unreadable: Arc::new(Word::new(0)),
        }
    }

    /// The client's address as the proxies in `trusted` report it in `X-Forwarded-For`: the peer,
    /// if it is not a trusted proxy; else the header walked from the right past every trusted
    /// address, to the first one that is not (see the [module docs](super) on why never the
    /// leftmost). A request from an untrusted peer is keyed by the peer, whatever it claims.
    ///
    /// The header is read element by element from the right, on its bytes: what a client wrote
    /// left of the entries your proxies appended is never read, so a proxy that appends to the
    /// client's own line (nginx's `$proxy_add_x_forwarded_for`) keys the client by the address it
    /// appended, whatever the client wrote. Empty elements are skipped; several lines of the
    /// header are one list. An entry the walk needs that is not an address (garbage, `unknown`,
    /// an obfuscated `Forwarded` node), or a chain of more than 32 trusted hops, keys the request
    /// [`ClientKey::UnreadableForwarding`] of the last trusted hop reached: such requests share
    /// one limit, never the proxy's own, and are counted
    /// ([`unreadable_forwarding`](ClientIp::unreadable_forwarding)).
    pub fn behind_proxies(trusted: impl IntoIterator<Item = Cidr>) -> Self {
        ClientIp {
            trusted: trusted.into_iter().collect(),
            ..ClientIp::peer()
        }
    }
}

impl<S> ClientIp<S> {
    /// How many requests this extractor (and its clones) keyed
    /// [`ClientKey::UnreadableForwarding`]: a figure that grows means a proxy in the trusted
    /// ranges writes what cannot be read, or clients reach the walk's path.
    pub fn unreadable_forwarding(&self) -> u64 {
        // Relaxed: a statistic; nothing is ordered by it.
        self.unreadable.load(Ordering::Relaxed)
    }
}

impl<S: PeerSource> ClientIp<S> {
    /// Reads the proxies' chain from `header` instead of `X-Forwarded-For`.
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Groups IPv6 addresses by their first `bits` (default 64; 128 keys each address apart).
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.grouping.ipv6_prefix = bits.min(128);
        self
    }

    /// Groups IPv4 addresses by their first `bits` (default 32: each address apart).
    pub fn ipv4_prefix(mut self, bits: u8) -> Self {
        self.grouping.ipv4_prefix = bits.min(32);
        self
    }

    /// Reads the peer's address with `source` instead of [`ConnectionPeer`].
    pub fn peer_source<F>(self, source: F) -> ClientIp<F>
    where
        F: Fn(&Extensions) -> Option<IpAddr>,
    {
        self.peer_from(source)
    }

    /// Reads the peer's address with a named [`PeerSource`] (a type, where a closure cannot be
    /// named).
    pub fn peer_from<T: PeerSource>(self, source: T) -> ClientIp<T> {
        ClientIp {
            peer: source,
            grouping: self.grouping,
            trusted: self.trusted,
            header: self.header,
            unreadable: self.unreadable,
        }
    }

    /// The client's address, grouped; `None` when the peer's address is not recorded, or when
    /// the forwarding header could not be read where the walk needed it (which
    /// [`extract`](KeyExtractor::extract) keys [`ClientKey::UnreadableForwarding`]).
    #[inline]
    pub fn address(&self, head: &RequestHead<'_>) -> Option<IpAddr> {
        match self.walk(head)? {
            Walk::Client(client) => Some(self.grouping.key(client)),
            Walk::Unreadable(_) => None,
        }
    }

    #[inline]
    fn walk(&self, head: &RequestHead<'_>) -> Option<Walk> {
        let Some(peer) = self.peer.peer(head.extensions()) else {
            self.report_missing_peer();
            return None;
        };
        Some(if self.trusted.is_empty() {
            Walk::Client(peer)
        } else {
            client_address(peer, head.headers(), self.header, &self.trusted)
        })
    }

    /// Says once per process, on standard error, that the peer is not where it is looked for:
    /// a server set up so answers every request 400, and the cause is in its setup.
    #[cold]
    fn report_missing_peer(&self) {
        static REPORTED: Once = Once::new();
        REPORTED.call_once(|| {
            eprintln!(
                "tollgate: a request has no client key: {}",
                self.peer.missing_peer()
            );
        });
    }
}

impl<S: PeerSource> KeyExtractor for ClientIp<S> {
    type Key = ClientKey;

    #[inline]
    fn extract(&self, head: &RequestHead<'_>) -> Option<ClientKey> {
        Some(match self.walk(head)? {
            Walk::Client(client) => ClientKey::Ip(self.grouping.key(client)),
            Walk::Unreadable(proxy) => {
                // Relaxed: a statistic; nothing is ordered by it.
                self.unreadable.fetch_add(1, Ordering::Relaxed);
                ClientKey::UnreadableForwarding(proxy)
            }
        })
    }

    fn why_no_key(&self) -> Option<&'static str> {
        Some(self.peer.missing_peer())
    }
}

/// Keys a request by the value of one header (an API key). A request without the header, with it
/// empty or longer than the maximum, has no key.
///
/// # Examples
///
/// ```
/// use tollgate::tower::HeaderKey;
///
/// let by_api_key = HeaderKey::new("x-api-key")?;
/// assert!(HeaderKey::new("x api key").is_err());
/// # Ok::<(), tollgate::tower::InvalidHeaderName>(())
/// ```
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
    max_len: usize,
}

impl HeaderKey {
    /// The longest value taken by default: room for any real API key, and a bound on what one
    /// client can make the limiter's map hold.
    pub const DEFAULT_MAX_LEN: usize = 256;

    /// Keys by the value of the header `name`: given as text (`"x-api-key"`, any case), the
    /// extractor or an [`InvalidHeaderName`] error; given as an `http::HeaderName`, the extractor.
    // `Self` for a `HeaderName`, a `Result` for text: text may not be a header name.
    #[allow(clippy::new_ret_no_self)]
    pub fn new<N: HeaderKeyName>(name: N) -> N::Made {
        name.make()
    }

    fn named(name: HeaderName) -> Self {
        HeaderKey {
            name,
            max_len: Self::DEFAULT_MAX_LEN,
        }
    }

    /// Values longer than `max_len` bytes are no key.
    pub fn max_len(mut self, max_len: usize) -> Self {
        self.max_len = max_len;
        self
    }
}

/// What [`HeaderKey::new`] takes: a header name as text, which may be invalid, or an
/// `http::HeaderName`, which cannot.
pub trait HeaderKeyName: sealed::Sealed {
    /// What [`HeaderKey::new`] returns for this name.
    type Made;

    /// The extractor keyed by this name.
    fn make(self) -> Self::Made;
}

impl HeaderKeyName for HeaderName {
    type Made = HeaderKey;

    fn make(self) -> HeaderKey {
        HeaderKey::named(self)
    }
}

impl HeaderKeyName for &str {
    type Made = Result<HeaderKey, InvalidHeaderName>;

    fn make(self) -> Result<HeaderKey, InvalidHeaderName> {
        HeaderName::from_bytes(self.as_bytes())
            .map(HeaderKey::named)
            .map_err(|_| InvalidHeaderName::new(self))
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for http::HeaderName {}
    impl Sealed for &str {}
}

impl KeyExtractor for HeaderKey {
    type Key = ClientKey;

    fn extract(&self, head: &RequestHead<'_>) -> Option<ClientKey> {
        let value = head.headers().get(&self.name)?;
        let len = value.as_bytes().len();
        (len > 0 && len <= self.max_len).then(|| ClientKey::Header(value.clone()))
    }
}

/// One key for every request: a limit on the service as a whole.
#[derive(Debug, Clone, Copy, Default)]
pub struct GlobalKey;

impl KeyExtractor for GlobalKey {
    type Key = ClientKey;

    #[inline]
    fn extract(&self, _: &RequestHead<'_>) -> Option<ClientKey> {
        Some(ClientKey::Global)
    }
}

/// An extractor from a closure; see [`key_fn`].
#[derive(Clone)]
pub struct KeyFn<F> {
    f: F,
}

impl<F> fmt::Debug for KeyFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyFn").finish_non_exhaustive()
    }
}

/// Keys requests by what `f` returns.
///
/// # Examples
///
/// ```
/// use tollgate::tower::{KeyExtractor, RequestHead, key_fn};
///
/// // One limit per tenant, named by the first path segment.
/// let by_tenant = key_fn(|head: &RequestHead<'_>| {
///     head.uri().path().split('/').nth(1).filter(|s| !s.is_empty()).map(str::to_owned)
/// });
/// let request = http::Request::get("/acme/orders").body(())?;
/// assert_eq!(by_tenant.extract(&RequestHead::of(&request)).as_deref(), Some("acme"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn key_fn<F, K>(f: F) -> KeyFn<F>
where
    F: Fn(&RequestHead<'_>) -> Option<K>,
{
    KeyFn { f }
}

impl<F, K> KeyExtractor for KeyFn<F>
where
    F: Fn(&RequestHead<'_>) -> Option<K>,
{
    type Key = K;

    #[inline]
    fn extract(&self, head: &RequestHead<'_>) -> Option<K> {
        (self.f)(head)
    }
}

/// The first extractor's key, else the second's; see [`KeyExtractor::or`].
#[derive(Debug, Clone)]
pub struct Or<A, B> {
    first: A,
    second: B,
}

impl<A, B> KeyExtractor for Or<A, B>
where
    A: KeyExtractor,
    B: KeyExtractor<Key = A::Key>,
{
    type Key = A::Key;

    #[inline]
    fn extract(&self, head: &RequestHead<'_>) -> Option<A::Key> {
        self.first
            .extract(head)
            .or_else(|| self.second.extract(head))
    }

    /// The second's reason, else the first's: with an API key or else the address, a request
    /// without the key is the client's doing; one without the address is not.
    fn why_no_key(&self) -> Option<&'static str> {
        self.second.why_no_key().or_else(|| self.first.why_no_key())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(extractor: &HeaderKey, name: &str, value: &str) -> Option<ClientKey> {
        let request = Request::get("/").header(name, value).body(()).unwrap();
        extractor.extract(&RequestHead::of(&request))
    }

    #[test]
    fn a_header_key_is_named_by_text_in_any_case() {
        let by_text = HeaderKey::new("X-Api-Key").unwrap();
        assert_eq!(
            key_of(&by_text, "x-api-key", "pro-123"),
            Some(ClientKey::Header(HeaderValue::from_static("pro-123")))
        );
        let by_name = HeaderKey::new(HeaderName::from_static("x-api-key"));
        assert_eq!(
            key_of(&by_name, "x-api-key", "pro-123"),
            key_of(&by_text, "x-api-key", "pro-123")
        );
    }

    #[test]
    fn text_that_is_no_header_name_is_a_typed_error() {
        for bad in ["", "x api key", "x-api-key:", "é", "x\napi"] {
            let error = HeaderKey::new(bad).unwrap_err();
            assert_eq!(error, InvalidHeaderName::new(bad));
            let message = error.to_string();
            assert!(
                message.contains(&format!("{bad:?}")) && message.contains("is invalid"),
                "{message}"
            );
        }
    }
}
