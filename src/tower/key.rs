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
use std::net::IpAddr;

use http::{Extensions, HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};

#[cfg(doc)]
use super::client_ip::ClientIp;
use super::error::InvalidHeaderName;

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
    // Always inlined into the service's hash of the key, so that the hasher's state stays in
    // registers rather than passing through memory to a call.
    #[inline(always)]
    fn hash<H: Hasher>(&self, state: &mut H) {
        // The most common key first, apart: one test of its tags, where a `match` of every kind
        // is a jump through a table.
        if let ClientKey::Ip(IpAddr::V4(address)) = self {
            // One integer write, which the default hasher (`SipState`) folds in at once.
            return state.write_usize(u32::from(*address) as usize);
        }
        match self {
            ClientKey::Global => state.write_u8(0),
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

    /// A hasher that keeps the writes it is given.
    #[derive(Default)]
    struct Writes(Vec<String>);

    impl Hasher for Writes {
        fn write(&mut self, bytes: &[u8]) {
            self.0.push(format!("bytes {bytes:?}"));
        }

        fn write_u8(&mut self, value: u8) {
            self.0.push(format!("u8 {value}"));
        }

        fn write_u32(&mut self, value: u32) {
            self.0.push(format!("u32 {value}"));
        }

        fn write_u64(&mut self, value: u64) {
            self.0.push(format!("u64 {value}"));
        }

        fn write_u128(&mut self, value: u128) {
            self.0.push(format!("u128 {value}"));
        }

        fn write_usize(&mut self, value: usize) {
            self.0.push(format!("usize {value}"));
        }

        fn finish(&self) -> u64 {
            0
        }
    }

    #[test]
    fn each_kind_of_key_hashes_as_its_writes() {
        let writes = |key: ClientKey| {
            let mut hasher = Writes::default();
            key.hash(&mut hasher);
            hasher.0
        };
        let v4 = IpAddr::from([192, 0, 2, 7]);
        let v6 = IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, 1]);
        assert_eq!(writes(ClientKey::Global), ["u8 0"]);
        assert_eq!(
            writes(ClientKey::Ip(v4)),
            [format!("usize {}", 0xc000_0207_u32)]
        );
        assert_eq!(
            writes(ClientKey::Ip(v6)),
            ["u64 2306139568115548160", "u64 1"]
        );
        assert_eq!(
            writes(ClientKey::Header(HeaderValue::from_static("k"))),
            ["bytes [107]"]
        );
        assert_eq!(
            writes(ClientKey::UnreadableForwarding(v4)),
            ["u8 3", &format!("u32 {}", 0xc000_0207_u32)]
        );
        assert_eq!(
            writes(ClientKey::UnreadableForwarding(v6)),
            ["u8 3", &format!("u128 {}", (0x2001_0db8_u128 << 96) | 1)]
        );
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
