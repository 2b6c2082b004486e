//! Envoy's global rate-limit service on tollgate's methods (feature `envoy`).
//!
//! Envoy's `envoy.filters.http.ratelimit` filter (and its network and Thrift kin) asks an
//! external service, over gRPC, whether each request may pass:
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, with a *domain* and a list of
//! *descriptors*, each a list of key/value entries that the route's actions made (the client's
//! address, a header's value, a fixed key). [`RateLimitServer`] answers it from a configuration
//! in envoyproxy/ratelimit's YAML ([`RlsConfig`]), so an existing configuration moves over
//! unchanged; the `tollgate-rls` binary serves it with the standard gRPC health service and
//! Prometheus metrics.
//!
//! # What it guarantees
//!
//! - **Matching** as envoyproxy/ratelimit matches: entry by entry down the configured tree, a
//!   descriptor of the entry's key and value before one whose value ends in `*` and prefixes
//!   it, before one of the key alone; a key-only descriptor gives each value its own limit; the
//!   limit applied is that of the descriptor the request's last entry reaches. `replaces`,
//!   `unlimited`, `shadow_mode` (decided and counted, answered OK) and `requests_per_unit: 0`
//!   (everything refused) behave as there.
//! - **Each limit is exact** by its method: the fixed window (the default, as
//!   envoyproxy/ratelimit's), the token bucket, the sliding window log or counter, chosen per
//!   domain or descriptor (`method:`); several limits on one descriptor (`limits:`, under every
//!   method but the sliding window log) are enforced together, all or nothing.
//! - **All or nothing across descriptors**: a request refused by any of its descriptors is
//!   charged to none: refused at a look that takes nothing, or, when a racing request takes the
//!   last permits between the look and the taking, with every grant it made given back to the
//!   state it was made on, in process and on Redis (see [`RateLimitServer::decide`] for how
//!   exactly each method gives back, and when a grant is kept: in process, a second
//!   sliding-log descriptor's; on Redis, one another decision landed on before the give-back,
//!   under the token bucket or the sliding log). envoyproxy/ratelimit charges every descriptor
//!   of a refused request.
//! - **The answer Envoy uses**: the overall code, each descriptor's code, `current_limit`,
//!   `limit_remaining` and `duration_until_reset`, and the IETF `RateLimit-Policy` and
//!   `RateLimit` fields (one item per limited descriptor, shadowed ones left out) plus
//!   `Retry-After` on a refusal that a later request could pass (never early; none for a
//!   request asking more than a limit, or refused by `requests_per_unit: 0`), as
//!   `response_headers_to_add`.
//! - **Reload without reset**: [`RateLimitServer::reload`] swaps the configuration while
//!   requests are decided; a descriptor whose limits did not change keeps its clients' state.
//! - **State** in process ([`StateStore::InProcess`], one instance), or on Redis
//!   ([`StateStore::Redis`]: every instance shares each limit), with the Redis backend's
//!   failure policy; under [`FailurePolicy::Error`](crate::redis::FailurePolicy::Error) a
//!   failed round trip answers `UNAVAILABLE`, and Envoy's own `failure_mode_deny` decides.
//! - **A descriptor's own limit** (`RateLimitDescriptor.limit`, which Envoy's route actions set
//!   from static values or a request's dynamic metadata) applies in place of the configured
//!   one, as envoyproxy/ratelimit applies it: to any descriptor of a known domain, matched in
//!   the configuration or not, never shadowed, its clients told apart by the descriptor's
//!   entries (keys and values), under the domain's method; `requests_per_unit: 0` refuses
//!   everything. Each distinct limit gets a limiter of its own on its first request, kept
//!   across reloads, up to [`RateLimitServer::MAX_BROUGHT_LIMITS`]; a request bringing one more
//!   is answered `RESOURCE_EXHAUSTED`, and one whose unit is not a unit, or whose limit the
//!   method cannot enforce, `INVALID_ARGUMENT` (such a request takes no room among them). A
//!   refund of a brought limit takes no room either, and on Redis reaches the state every
//!   instance shares, from any instance. Unlike
//!   envoyproxy/ratelimit, a brought limit is counted apart from the configured limit of the
//!   same entries and from another limit brought for them.

mod config;
mod engine;
mod metrics;
mod overrides;
mod server;

use std::fmt;

pub use config::{
    ConfigError, DescriptorLimit, DescriptorNode, DomainConfig, Limits, RlsConfig, Unit, UnitLimit,
    ValueMatch,
};
pub use engine::StateStore;
pub use server::RateLimitServer;

/// Envoy's protos for the service, as this module uses them (from the `envoy-types` crate).
pub use envoy_types::pb::envoy::service::ratelimit::v3 as proto;

/// Why a configuration could not be made ready to serve.
#[derive(Debug)]
#[non_exhaustive]
pub enum BuildError {
    /// A descriptor's limits that its method cannot enforce.
    Descriptor {
        /// The descriptor's domain.
        domain: String,
        /// The descriptor's path in the configuration.
        path: String,
        /// What is wrong with its limits.
        source: String,
    },
    /// Redis could not be reached, or refused the plans.
    Redis(crate::redis::RedisError),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::Descriptor {
                domain,
                path,
                source,
            } => write!(f, "domain {domain:?}: descriptor {path}: {source}"),
            BuildError::Redis(error) => write!(f, "redis: {error}"),
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BuildError::Redis(error) => Some(error),
            BuildError::Descriptor { .. } => None,
        }
    }
}
