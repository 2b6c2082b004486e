//! Rate limiting for HTTP and gRPC servers: a [tower] layer over a [`RateLimiterService`]
//! (feature `tower`).
//!
//! [`RateLimitLayer`] works with anything built on tower and `http` 1: `axum::Router::layer`,
//! hyper services (through `hyper_util::service::TowerToHyperService`) and tonic servers. It is
//! generic over request and response bodies and cheap to clone.
//!
//! For each request the layer
//! 1. finds the client's key with a [`KeyExtractor`] (the peer address grouped by prefix, the
//!    address behind trusted proxies, an API key header, a closure, one global key);
//! 2. picks the plan ([`plan_fn`](RateLimitLayerBuilder::plan_fn), else the default) and the cost
//!    ([`cost_fn`](RateLimitLayerBuilder::cost_fn), else 1 permit);
//! 3. asks its [`RateLimitBackend`], once: the [`Verdict`] says whether the request is allowed
//!    and, where the response reports it, holds the decision and, for a plan of several limits,
//!    each limit's figures for the header fields (the in-process service answers at once, from one
//!    lookup, and for a grant that reports nothing without allocating);
//! 4. within the limit, calls the inner service; over it, answers `429 Too Many Requests` with
//!    `Retry-After` (whole seconds rounded up, never 0) and the `RateLimit-Policy` / `RateLimit`
//!    fields of draft-ietf-httpapi-ratelimit-headers-11, or, for a gRPC call, HTTP 200 with
//!    `grpc-status: 8` (`RESOURCE_EXHAUSTED`).
//!
//! With feature `redis`, a [`RedisBackend`] makes the decisions in Redis, so that several servers
//! share each client's limit; its failure policy becomes HTTP answers (fail open passes, fail
//! closed answers 429, an error answers 503: see the table there).
//!
//! # Guarantees
//!
//! - A client never gets more than its plan allows, however many connections or service clones
//!   carry its requests: all share the backend.
//! - No request panics the layer or gets a bare 500: a request without a key gets the
//!   [`on_missing_key`](RateLimitLayerBuilder::on_missing_key) answer (default 400), a failed
//!   check the [`on_error`](RateLimitLayerBuilder::on_error) answer (default 503); hostile
//!   headers (huge, malformed, not UTF-8) are bounded and parsed without trust.
//! - Forwarding headers are read only from peers in the trusted proxy ranges, walked from the
//!   right: a client cannot choose its own key by writing `X-Forwarded-For`.
//!
//! # Shadow mode
//!
//! [`Shadow`] checks a fraction of requests and refuses a fraction of those over their limit;
//! the rest go through with an [`x-ratelimit-shadowed`](SHADOWED_HEADER) request header, and
//! [`RateLimitLayer::stats`] counts what would have happened. Shadow mode is invisible to
//! clients: a request let through gets no `Retry-After` and no `RateLimit` fields (even with
//! [`headers_on_allowed`](RateLimitLayerBuilder::headers_on_allowed)), and the layer removes a
//! client's own `x-ratelimit-shadowed` from every request, so the upstream can trust the mark.
//!
//! [tower]: https://docs.rs/tower
//! [`RateLimiterService`]: crate::RateLimiterService

mod addr;
mod backend;
mod body;
mod client_ip;
mod error;
mod fields;
mod forwarded;
mod future;
mod key;
mod layer;
#[cfg(feature = "redis")]
mod redis;
mod response;
mod service;
mod stats;

pub use crate::verdict::{Figures, Verdict};
pub use addr::{Cidr, InvalidCidr};
pub use backend::{KnownPlan, RateLimitBackend};
pub use body::ResponseBody;
pub use client_ip::{ClientIp, ConnectionPeer, PeerSource};
pub use error::{InvalidHeaderName, SetupError};
pub use forwarded::ForwardedHeader;
pub use future::ResponseFuture;
pub use key::{
    ClientKey, GlobalKey, HeaderKey, HeaderKeyName, KeyExtractor, KeyFn, Or, RequestHead, key_fn,
};
pub use layer::{DEFAULT_SWEEP_INTERVAL, RateLimitLayer, RateLimitLayerBuilder, SHADOWED_HEADER};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis::{RedisBackend, RedisClientName};
pub use response::{BodyFormat, Fallback, Limited, PolicyName};
pub use service::RateLimit;
pub use stats::{RateLimitStats, Shadow};
