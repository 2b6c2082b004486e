//! [`RedisBackend`]: the layer's decisions made by a [`RedisRateLimiter`], so that every server
//! sharing one Redis enforces one limit per client together (features `tower` and `redis`).
//! Its guarantees are stated on the type.

use std::fmt::{self, Write as _};
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;

use super::backend::RateLimitBackend;
use super::key::ClientKey;
use crate::redis::{RedisError, RedisRateLimiter};
use crate::verdict::{Figures, Reported, Verdict};

/// A [`RateLimitBackend`] over a shared [`RedisRateLimiter`]: give it to
/// [`RateLimitLayer::builder`](super::RateLimitLayer::builder) as an in-process service is
/// given. Cheap to clone (one `Arc`).
///
/// The layer's services hold the limiter through this `Arc`, and each request's check holds a
/// clone of it until Redis answers, so that the check can outlive the call that started it (as
/// a tower service's future must).
///
/// # Guarantees
///
/// - **One limit across servers.** Each request is one [`RedisRateLimiter::decide`] for the
///   request's key, plan and cost: the limiter's guarantees (one atomic round trip, the Redis
///   server's clock, a local deny cache) are the layer's.
/// - **Distinct keys, distinct clients.** A key is written into the limiter's client name by
///   [`RedisClientName`], injectively for each key type: two keys of one type never share a name,
///   so never share a limit. Names are visible ASCII without `{`, `}` or spaces, so a client's
///   keys keep one Redis Cluster hash tag.
/// - **The failure policy, as HTTP answers.** What the limiter's
///   [`FailurePolicy`](crate::redis::FailurePolicy) decides, the layer answers:
///
///   | policy | a request while Redis fails |
///   |---|---|
///   | `FailOpen` | let through (with [`headers_on_allowed`](super::RateLimitLayerBuilder::headers_on_allowed), fields saying 0 left) |
///   | `FailClosed` | `429 Too Many Requests`, `Retry-After` the circuit's cool-down in whole seconds rounded up (never 0), and the `RateLimit` fields saying 0 left: the limiter refused it |
///   | `Local { share }` | as the in-process decision with its share of each limit says |
///   | `Error` | the layer's [`on_error`](super::RateLimitLayerBuilder::on_error) answer, by default `503 Service Unavailable` with the one-line body `rate limit check failed` and no `Retry-After` (gRPC: `UNAVAILABLE`) |
///
///   Errors no policy answers (an unknown plan, a key holding another program's value) get the
///   `on_error` answer under every policy.
/// - **The fields.** A verdict carries the decision's figures, so `RateLimit-Policy`,
///   `RateLimit` and `Retry-After` are written as for the in-process service. For a plan of
///   several limits decided by Redis the fields list each limit ([`Answer::each_limit`]), as the
///   in-process service does; an answer from the deny cache or the failure policy knows the
///   deciding limit only (the refusal with the longest wait), and lists that one.
///
///   [`Answer::each_limit`]: crate::redis::Answer::each_limit
///
/// The check runs on the task serving the request (it needs a tokio runtime, which axum, hyper
/// and tonic servers have) and is boxed: a round trip waits on I/O, and the layer takes its
/// pending path, which boxes the request's future anyway.
///
/// # Examples
///
/// ```no_run
/// use std::sync::Arc;
/// use tollgate::redis::{FailurePolicy, RedisRateLimiter};
/// use tollgate::tower::{ClientIp, RateLimitLayer, RedisBackend};
/// use tollgate::{Algorithm, Rule};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = RedisRateLimiter::builder("redis://10.0.0.5:6379", Algorithm::TokenBucket)
///     .plan("free", Rule::per_second(5)?)
///     .failure_policy(FailurePolicy::FailClosed)
///     .build()
///     .await?;
/// let layer = RateLimitLayer::builder(RedisBackend::new(Arc::new(limiter)), ClientIp::peer(), "free")
///     .headers_on_allowed(true)
///     .build();
/// // axum::Router::new().route(...).layer(layer)
/// # let _ = layer;
/// # Ok(())
/// # }
/// ```
pub struct RedisBackend<P> {
    limiter: Arc<RedisRateLimiter<P>>,
}

impl<P> RedisBackend<P> {
    /// The backend deciding with `limiter`, which the program may go on using (its stats, its
    /// own decisions) through its other `Arc`s.
    pub fn new(limiter: Arc<RedisRateLimiter<P>>) -> Self {
        RedisBackend { limiter }
    }

    /// The limiter that decides.
    pub fn limiter(&self) -> &Arc<RedisRateLimiter<P>> {
        &self.limiter
    }
}

impl<P> Clone for RedisBackend<P> {
    fn clone(&self) -> Self {
        RedisBackend {
            limiter: Arc::clone(&self.limiter),
        }
    }
}

impl<P: fmt::Debug> fmt::Debug for RedisBackend<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("limiter", &self.limiter)
            .finish()
    }
}

impl<P> From<Arc<RedisRateLimiter<P>>> for RedisBackend<P> {
    fn from(limiter: Arc<RedisRateLimiter<P>>) -> Self {
        RedisBackend::new(limiter)
    }
}

impl<P> From<RedisRateLimiter<P>> for RedisBackend<P> {
    fn from(limiter: RedisRateLimiter<P>) -> Self {
        RedisBackend::new(Arc::new(limiter))
    }
}

/// The future of a [`RedisBackend`]'s check.
type Check = Pin<Box<dyn Future<Output = Result<Verdict, RedisError>> + Send>>;

impl<K, P> RateLimitBackend<K, P> for RedisBackend<P>
where
    K: RedisClientName,
    P: Clone + Eq + fmt::Debug + Send + Sync + 'static,
{
    type Error = RedisError;
    type Future = Check;

    /// One [`RedisRateLimiter::decide`] for the client named by `key` (see
    /// [`RedisClientName`]). Every figure comes with the decision; under
    /// [`Figures::OnRefusal`] a grant's are dropped ([`Verdict::allowed`]).
    fn check(&self, key: &K, plan: &P, cost: u64, figures: Figures) -> Check {
        let limiter = Arc::clone(&self.limiter);
        let client = key.client_name();
        let plan = plan.clone();
        Box::pin(async move {
            let answer = limiter.decide(&client, &plan, cost).await?;
            let decision = answer.decision();
            if figures == Figures::OnRefusal && decision.is_allowed() {
                return Ok(Verdict::allowed());
            }
            Ok(Verdict::from(match answer.each_limit() {
                [] => Reported::from(decision),
                each => Reported::with_each_limit(decision, each.iter().copied()),
            }))
        })
    }
}

/// How a key of the layer names its client in Redis: the `client` of
/// [`RedisRateLimiter::decide`], which becomes part of the client's Redis keys.
///
/// Injective for each type: two different keys of one type write different names. Names are
/// visible ASCII (`!` to `~`) without `{` and `}`: text is written with every other byte, and
/// `%`, `{` and `}`, escaped as `%` and two upper-case hex digits (`a b` is `a%20b`), so an
/// escape cannot be confused with the text.
///
/// | key | name |
/// |---|---|
/// | [`ClientKey::Global`] | `global` |
/// | [`ClientKey::Ip`], [`IpAddr`] | `ip:` and the address (`ip:192.0.2.7`, `ip:2001:db8::`) |
/// | [`ClientKey::Header`] | `key:` and the value, escaped (`key:pro-123`) |
/// | [`ClientKey::UnreadableForwarding`] | `fwd:` and the proxy's address |
/// | `str`, `String`, `Box<str>`, `Arc<str>` | the text, escaped |
/// | `u64`, `u32` | the number in decimal |
///
/// An address is named alike as a `ClientKey` and as an `IpAddr`: the same client whichever
/// extractor found it.
pub trait RedisClientName {
    /// Appends this key's name to `name`.
    fn write_client_name(&self, name: &mut String);

    /// This key's name.
    fn client_name(&self) -> String {
        let mut name = String::new();
        self.write_client_name(&mut name);
        name
    }
}

impl RedisClientName for ClientKey {
    fn write_client_name(&self, name: &mut String) {
        match self {
            ClientKey::Global => name.push_str("global"),
            ClientKey::Ip(address) => address.write_client_name(name),
            ClientKey::Header(value) => {
                name.push_str("key:");
                write_escaped(value.as_bytes(), name);
            }
            ClientKey::UnreadableForwarding(proxy) => {
                // Writing to a `String` cannot fail.
                let _ = write!(name, "fwd:{proxy}");
            }
        }
    }
}

impl RedisClientName for IpAddr {
    /// `Display`'s form, which is canonical (RFC 5952 for IPv6): one text per address.
    fn write_client_name(&self, name: &mut String) {
        let _ = write!(name, "ip:{self}");
    }
}

impl RedisClientName for str {
    fn write_client_name(&self, name: &mut String) {
        write_escaped(self.as_bytes(), name);
    }
}

impl RedisClientName for String {
    fn write_client_name(&self, name: &mut String) {
        self.as_str().write_client_name(name);
    }
}

impl RedisClientName for Box<str> {
    fn write_client_name(&self, name: &mut String) {
        (**self).write_client_name(name);
    }
}

impl RedisClientName for Arc<str> {
    fn write_client_name(&self, name: &mut String) {
        (**self).write_client_name(name);
    }
}

impl RedisClientName for u64 {
    fn write_client_name(&self, name: &mut String) {
        let _ = write!(name, "{self}");
    }
}

impl RedisClientName for u32 {
    fn write_client_name(&self, name: &mut String) {
        let _ = write!(name, "{self}");
    }
}

impl<T: RedisClientName + ?Sized> RedisClientName for &T {
    fn write_client_name(&self, name: &mut String) {
        (**self).write_client_name(name);
    }
}

/// Appends `bytes` to `name`, each visible ASCII byte but `%`, `{` and `}` as itself and every
/// other byte as `%XX`. Injective: `%` starts exactly the escapes, each of fixed length.
fn write_escaped(bytes: &[u8], name: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    name.reserve(bytes.len());
    for &byte in bytes {
        if byte.is_ascii_graphic() && !matches!(byte, b'%' | b'{' | b'}') {
            name.push(char::from(byte));
        } else {
            name.push('%');
            name.push(char::from(HEX[usize::from(byte >> 4)]));
            name.push(char::from(HEX[usize::from(byte & 0x0F)]));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use http::HeaderValue;
    use proptest::prelude::*;

    use super::*;

    fn header(bytes: &[u8]) -> ClientKey {
        ClientKey::Header(HeaderValue::from_bytes(bytes).unwrap())
    }

    #[test]
    fn each_kind_of_key_has_its_own_name() {
        let v4 = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7));
        let v6 = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0));
        let cases = [
            (ClientKey::Global, "global"),
            (ClientKey::Ip(v4), "ip:192.0.2.7"),
            (ClientKey::Ip(v6), "ip:2001:db8::"),
            (ClientKey::UnreadableForwarding(v4), "fwd:192.0.2.7"),
            (header(b"pro-123"), "key:pro-123"),
            // A header that spells another kind's name is not that kind.
            (header(b"global"), "key:global"),
            (header(b"a b%{}\xff"), "key:a%20b%25%7B%7D%FF"),
        ];
        for (key, expected) in cases {
            assert_eq!(key.client_name(), expected, "{key:?}");
        }
        assert_eq!(v4.client_name(), ClientKey::Ip(v4).client_name());
        assert_eq!("a%b".client_name(), "a%25b");
        assert_eq!(String::from("%25").client_name(), "%2525");
        assert_eq!(7u64.client_name(), "7");
    }

    proptest! {
        #[test]
        fn distinct_texts_have_distinct_names(a: Vec<u8>, b: Vec<u8>) {
            let (mut name_a, mut name_b) = (String::new(), String::new());
            write_escaped(&a, &mut name_a);
            write_escaped(&b, &mut name_b);
            prop_assert_eq!(a == b, name_a == name_b);
            let visible = name_a
                .bytes()
                .all(|byte| byte.is_ascii_graphic() && !matches!(byte, b'{' | b'}'));
            prop_assert!(visible, "{:?}", name_a);
        }

        #[test]
        fn distinct_addresses_have_distinct_names(a: IpAddr, b: IpAddr) {
            prop_assert_eq!(a == b, a.client_name() == b.client_name());
        }
    }
}
