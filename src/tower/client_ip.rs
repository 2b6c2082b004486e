//! Keys by the client's address: [`ClientIp`], and where it finds the TCP peer's address
//! ([`PeerSource`], [`ConnectionPeer`]).

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::Once;

use http::Extensions;

use super::addr::{Cidr, Grouping};
use super::forwarded::{ForwardedHeader, Walk, client_address};
use super::key::{ClientKey, KeyExtractor, RequestHead};
use crate::sync::{Ordering, Word};

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
        self.grouping = self.grouping.with_ipv6_prefix(bits);
        self
    }

    /// Groups IPv4 addresses by their first `bits` (default 32: each address apart).
    pub fn ipv4_prefix(mut self, bits: u8) -> Self {
        self.grouping = self.grouping.with_ipv4_prefix(bits);
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

    // Always inlined into the layer's call: the peer's key is a few instructions, and a call
    // would save and restore six registers around them.
    #[inline(always)]
    fn extract(&self, head: &RequestHead<'_>) -> Option<ClientKey> {
        // Without trusted proxies the key is the peer's: straight from it, with no walk.
        if self.trusted.is_empty() {
            let Some(peer) = self.peer.peer(head.extensions()) else {
                self.report_missing_peer();
                return None;
            };
            return Some(ClientKey::Ip(self.grouping.key(peer)));
        }
        self.extract_behind_proxies(head)
    }

    fn why_no_key(&self) -> Option<&'static str> {
        Some(self.peer.missing_peer())
    }
}

impl<S: PeerSource> ClientIp<S> {
    /// [`extract`](KeyExtractor::extract) with trusted proxies: out of line, so that the peer's
    /// own key, without a walk, stays small enough to be inlined into the layer's call.
    #[inline(never)]
    fn extract_behind_proxies(&self, head: &RequestHead<'_>) -> Option<ClientKey> {
        Some(match self.walk(head)? {
            Walk::Client(client) => ClientKey::Ip(self.grouping.key(client)),
            Walk::Unreadable(proxy) => {
                // Relaxed: a statistic; nothing is ordered by it.
                self.unreadable.fetch_add(1, Ordering::Relaxed);
                ClientKey::UnreadableForwarding(proxy)
            }
        })
    }
}
