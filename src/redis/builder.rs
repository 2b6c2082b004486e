//! [`RedisRateLimiterBuilder`]: a Redis service's plans, connection and failure handling,
//! checked once.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use ::redis::Value;

use super::RedisError;
use super::batch::Batcher;
use super::connection::{Connection, ConnectionSettings, first_node_error, is_cluster_url};
use super::deny_cache::DenyCache;
use super::fallback::LocalFallback;
use super::limiter::GrantNames;
use super::limiter::{PlanEntry, RedisRateLimiter};
use super::policy::{Breakers, CircuitBreaker, FailurePolicy};
use super::script::{self, LimitSpec};
use super::stats::Counters;
use super::url::redact;
use crate::plans::{Plans, Together};
use crate::{Algorithm, Rule};

impl<P: Eq + fmt::Debug> RedisRateLimiter<P> {
    /// A builder for a limiter on the Redis at `url` applying `algorithm`.
    ///
    /// One server: `redis://[user:password@]host:port[/db]` (its primary: a replica is refused,
    /// see [`RedisError::ReadOnlyReplica`]). A Redis Cluster:
    /// `redis+cluster://[user:password@]host:port[,host:port...]`, naming any of its nodes (the
    /// client learns the others and follows `MOVED` and `ASK`). With TLS (feature `redis-tls`):
    /// `rediss://` and `rediss+cluster://`, trusting the system's roots or
    /// `RedisRateLimiterBuilder::tls_root_certificate`.
    pub fn builder(url: impl Into<String>, algorithm: Algorithm) -> RedisRateLimiterBuilder<P> {
        RedisRateLimiterBuilder {
            url: url.into(),
            algorithm,
            plans: Vec::new(),
            prefix: RedisRateLimiterBuilder::<P>::DEFAULT_PREFIX.to_owned(),
            timeout: RedisRateLimiterBuilder::<P>::DEFAULT_TIMEOUT,
            connect_timeout: RedisRateLimiterBuilder::<P>::DEFAULT_CONNECT_TIMEOUT,
            policy: FailurePolicy::Error,
            breaker: CircuitBreaker::default(),
            deny_cache: Some(RedisRateLimiterBuilder::<P>::DEFAULT_DENY_CACHE_CAPACITY),
            root_certificate: None,
            connections: 1,
            batch_size: 1,
        }
    }
}

/// Builds a [`RedisRateLimiter`]: its plans, and how it meets failure.
#[derive(Debug)]
pub struct RedisRateLimiterBuilder<P> {
    url: String,
    algorithm: Algorithm,
    plans: Vec<(P, Vec<Rule>)>,
    prefix: String,
    timeout: Duration,
    connect_timeout: Duration,
    policy: FailurePolicy,
    breaker: CircuitBreaker,
    deny_cache: Option<usize>,
    /// PEM, under feature `redis-tls` only.
    root_certificate: Option<Vec<u8>>,
    connections: usize,
    batch_size: usize,
}

impl<P> RedisRateLimiterBuilder<P> {
    /// The default bound on one round trip: a local Redis answers in well under a millisecond,
    /// and a rate limiter that waits longer than this costs its caller more than a fallback
    /// decision does.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

    /// The default bound on establishing a connection (the first one, and each reconnection).
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

    /// The default key prefix.
    pub const DEFAULT_PREFIX: &str = "tollgate";

    /// How many denials the deny cache holds by default (about 100 bytes each).
    pub const DEFAULT_DENY_CACHE_CAPACITY: usize = 100_000;
}

impl<P: Eq + fmt::Debug> RedisRateLimiterBuilder<P> {
    /// Adds `plan` with its `rule`.
    pub fn plan(self, plan: P, rule: Rule) -> Self {
        self.plan_limits(plan, [rule])
    }

    /// Adds `plan` with several limits (say 10 per second and 1000 per hour), decided together
    /// in one round trip: a request is granted only if every limit grants it, and then taken
    /// from all of them; a denial takes from none. The decision reported is the denial with the
    /// longest wait, or the allowance with the fewest permits left. At most
    /// [`RateLimiterService::MAX_LIMITS`](crate::RateLimiterService::MAX_LIMITS), as in process,
    /// so that a plan moves between the backends unchanged; unlike in process, the sliding window
    /// log may have several.
    pub fn plan_limits(mut self, plan: P, limits: impl IntoIterator<Item = Rule>) -> Self {
        self.plans.push((plan, limits.into_iter().collect()));
        self
    }

    /// Adds each plan with its rule.
    pub fn plans(mut self, rules: impl IntoIterator<Item = (P, Rule)>) -> Self {
        self.plans
            .extend(rules.into_iter().map(|(plan, rule)| (plan, vec![rule])));
        self
    }

    /// The first part of every key (default `tollgate`), to keep several services apart on one
    /// Redis.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The bound on one round trip (default [`Self::DEFAULT_TIMEOUT`], 50 ms); past it the request is
    /// decided by the failure policy.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The bound on establishing a connection (default [`Self::DEFAULT_CONNECT_TIMEOUT`], 1 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The most connections [`RedisRateLimiterBuilder::connections`] takes.
    pub const MAX_CONNECTIONS: usize = 256;

    /// How many connections to one server the limiter spreads its round trips over, in turn
    /// (default 1). One connection already pipelines every concurrent round trip; more let the
    /// client read and write their replies in parallel (on several of the runtime's threads),
    /// where one connection's reader is a bottleneck for many tasks. Each connects on its first
    /// round trip. From 1 to [`Self::MAX_CONNECTIONS`], and 1 for a cluster (whose client keeps
    /// one connection to each node).
    pub fn connections(mut self, connections: usize) -> Self {
        self.connections = connections;
        self
    }

    /// The largest batch [`RedisRateLimiterBuilder::batch_size`] takes. A call holds the
    /// server for its decisions' time together: batches of 8 took 130-250 µs of server time per
    /// call (`INFO commandstats`, 64 tasks, every method, on a shared 2-core machine), and the
    /// sliding log's costliest requests (about 0.14 ms each, on a log of 65,000 batches) would
    /// make about 1.1 ms. Larger batches would save the server little more: a call's fixed cost
    /// is already spread over 8.
    pub const MAX_BATCH_SIZE: usize = 8;

    /// Sends the decisions that wait for the server together, up to `size` in one script call
    /// (default 1: each decision a call of its own). Each decision is made exactly as a call of
    /// its own would make it at the batch's instant, in one atomic step with the others, and
    /// fails alone if its own decision fails; a call that fails fails each of its decisions
    /// alike, and is one failure to the circuit breaker. A lone request is sent at once, as a call of its own; under load each call
    /// carries the decisions that came while the last ones were on their way (at most 8 calls
    /// are on their way at once), which saves the server a call's fixed cost per decision:
    /// about 9k of a token bucket's 72k instructions (see BENCHMARKS.md). For a server whose
    /// time is what limits the fleet; where the client's processor is the limit, the queue's
    /// hand-offs cost about what they save. A single server only: from 1 to
    /// [`Self::MAX_BATCH_SIZE`], and 1 for a cluster, where different clients' keys live in
    /// different hash slots, which no one script call may span. Reserving calls
    /// ([`RedisRateLimiter::reserve`]) are never batched.
    pub fn batch_size(mut self, size: usize) -> Self {
        self.batch_size = size;
        self
    }

    /// What to answer when Redis fails (default [`FailurePolicy::Error`]).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// When the circuit opens and probes (default: after 3 failures, probing every 500 ms).
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.breaker = breaker;
        self
    }

    /// Holds up to `capacity` denials in the local deny cache (default
    /// [`Self::DEFAULT_DENY_CACHE_CAPACITY`]); `0` turns it off.
    pub fn deny_cache(mut self, capacity: usize) -> Self {
        self.deny_cache = (capacity > 0).then_some(capacity);
        self
    }

    /// Trusts the certificate authority in `pem` (a PEM certificate) for `rediss://` URLs,
    /// instead of the system's roots: for a server whose certificate a private CA signed.
    #[cfg(feature = "redis-tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-tls")))]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_certificate = Some(pem.into());
        self
    }

    /// Connects, checks that the server takes writes, loads the scripts (on every master of a
    /// cluster), and returns the limiter. Needs a tokio runtime.
    ///
    /// # Errors
    ///
    /// A setting or plan the limiter cannot honour (see [`RedisError`]), an invalid URL, a
    /// server that cannot be reached ([`RedisError::Connect`]), refuses the credentials
    /// ([`RedisError::Authentication`]), shows a certificate that is not trusted
    /// ([`RedisError::UntrustedCertificate`]) or is a replica
    /// ([`RedisError::ReadOnlyReplica`]).
    pub async fn build(self) -> Result<RedisRateLimiter<P>, RedisError> {
        // A connection, then one round trip for the role and one per script.
        let bound = self
            .connect_timeout
            .saturating_add(self.timeout.saturating_mul(4));
        let (connect_timeout, response_timeout) = (self.connect_timeout, self.timeout);
        let root_certificate = self.root_certificate.clone();
        let limiter = self.build_lazy()?;
        let batching = limiter.batcher.is_some();
        let mut connection = limiter.connections[0].clone();
        let url = limiter.url.clone();
        let connect = async {
            // A cluster's client sends writes to masters only; one server must be a master.
            if !connection.is_cluster() && is_replica(&mut connection).await? {
                return Ok(false);
            }
            for algorithm in Algorithm::ALL {
                script::script_for(algorithm)
                    .load_async(&mut connection)
                    .await?;
                if batching {
                    script::batch_script_for(algorithm)
                        .load_async(&mut connection)
                        .await?;
                }
            }
            script::GIVE_BACK.load_async(&mut connection).await?;
            script::REFUND.load_async(&mut connection).await?;
            Ok::<bool, ::redis::RedisError>(true)
        };
        match tokio::time::timeout(bound, connect).await {
            Ok(Ok(true)) => Ok(limiter),
            Ok(Ok(false)) => Err(RedisError::ReadOnlyReplica { url }),
            Ok(Err(source)) => {
                // A cluster's client says only that no node could be reached; one node's own
                // connection tells why, where it is a certificate or credentials.
                let settings = ConnectionSettings {
                    url: &url,
                    response_timeout,
                    connect_timeout,
                    root_certificate: root_certificate.as_deref(),
                };
                let cause = match first_node_error(&settings).await {
                    Some(cause) if is_named_cause(&cause) => cause,
                    _ => source,
                };
                Err(connect_error(url, cause))
            }
            Err(_) => Err(RedisError::Timeout { after: bound }),
        }
    }

    /// The limiter, without connecting: the first request connects, and until Redis answers
    /// the failure policy decides. Must be called within a tokio runtime.
    ///
    /// # Errors
    ///
    /// A setting or plan the limiter cannot honour (see [`RedisError`]), or an invalid URL.
    pub fn build_lazy(self) -> Result<RedisRateLimiter<P>, RedisError> {
        let url = redact(&self.url);
        if !is_valid_name(&self.prefix) {
            return Err(RedisError::InvalidName {
                what: "key prefix",
                name: self.prefix,
            });
        }
        for (field, value) in [
            ("timeout", self.timeout),
            ("connect timeout", self.connect_timeout),
        ] {
            if value.is_zero() {
                return Err(RedisError::InvalidSetting {
                    field,
                    value: format!("{value:?}"),
                    bound: "it must be at least 1ns (tens of milliseconds are typical)",
                });
            }
        }
        if !(1..=Self::MAX_CONNECTIONS).contains(&self.connections) {
            return Err(RedisError::InvalidSetting {
                field: "connections",
                value: self.connections.to_string(),
                bound: "from 1 to RedisRateLimiterBuilder::MAX_CONNECTIONS (256)",
            });
        }
        if self.connections > 1 && is_cluster_url(&self.url) {
            return Err(RedisError::InvalidSetting {
                field: "connections",
                value: self.connections.to_string(),
                bound: "1 for a cluster, whose client keeps one connection to each node",
            });
        }
        if !(1..=Self::MAX_BATCH_SIZE).contains(&self.batch_size) {
            return Err(RedisError::InvalidSetting {
                field: "batch size",
                value: self.batch_size.to_string(),
                bound: "from 1 to RedisRateLimiterBuilder::MAX_BATCH_SIZE (8)",
            });
        }
        if self.batch_size > 1 && is_cluster_url(&self.url) {
            return Err(RedisError::InvalidSetting {
                field: "batch size",
                value: self.batch_size.to_string(),
                bound: "1 for a cluster, where different clients' keys live in different hash \
                        slots, which one script call cannot span",
            });
        }
        if self.batch_size > 1 && tokio::runtime::Handle::try_current().is_err() {
            return Err(RedisError::InvalidSetting {
                field: "batch size",
                value: self.batch_size.to_string(),
                bound: "1 outside a tokio runtime: batching starts a task on the runtime the \
                        limiter is built in",
            });
        }
        if self.breaker.failures == 0 {
            return Err(RedisError::InvalidSetting {
                field: "circuit breaker failures",
                value: "0".to_owned(),
                bound: "at least 1 failure must open the circuit",
            });
        }
        let share = match self.policy {
            FailurePolicy::Local { share } => {
                if !(share > 0.0 && share <= 1.0) {
                    return Err(RedisError::InvalidSetting {
                        field: "local share",
                        value: share.to_string(),
                        bound: "it must be above 0 and at most 1",
                    });
                }
                Some(share)
            }
            _ => None,
        };
        let plans = checked_plans(self.algorithm, self.plans)?;

        let local = match share {
            Some(share) => Some(LocalFallback::new(self.algorithm, &plans, share)?),
            None => None,
        };

        if !cfg!(feature = "redis-tls") && self.url.starts_with("rediss") {
            return Err(RedisError::InvalidSetting {
                field: "url",
                value: url,
                bound: "a TLS URL (rediss://) needs tollgate's feature `redis-tls`",
            });
        }
        let settings = ConnectionSettings {
            url: &self.url,
            response_timeout: self.timeout,
            connect_timeout: self.connect_timeout,
            root_certificate: self.root_certificate.as_deref(),
        };
        let connections = (0..self.connections)
            .map(|_| Connection::open(&settings))
            .collect::<Result<Box<[Connection]>, _>>()
            .map_err(|source| match source.kind() {
                ::redis::ErrorKind::InvalidClientConfig => RedisError::InvalidUrl {
                    url: url.clone(),
                    source,
                },
                _ => connect_error(url.clone(), source),
            })?;

        let counters = Arc::new(Counters::default());
        let batcher = (self.batch_size > 1).then(|| {
            Batcher::start(
                connections.clone(),
                self.algorithm,
                self.batch_size,
                self.timeout,
                Arc::clone(&counters),
            )
        });
        Ok(RedisRateLimiter {
            algorithm: self.algorithm,
            plans,
            prefix: self.prefix,
            url,
            connections,
            next_connection: AtomicUsize::new(0),
            timeout: self.timeout,
            policy: self.policy,
            breaker: Breakers::new(self.breaker, is_cluster_url(&self.url)),
            deny_cache: self.deny_cache.map(DenyCache::new),
            local,
            counters,
            grant_names: GrantNames::new(),
            batch_size: self.batch_size,
            batcher,
        })
    }
}

fn is_valid_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['{', '}', ':'])
}

/// Whether the server is a replica, by `ROLE`. A user whose ACL does not allow `ROLE` is not
/// asked: a replica then shows at the first grant, whose `READONLY` reply names it alike.
async fn is_replica(connection: &mut Connection) -> Result<bool, ::redis::RedisError> {
    let role = match ::redis::cmd("ROLE")
        .query_async::<Vec<Value>>(connection)
        .await
    {
        Ok(role) => role,
        Err(error) if error.code() == Some("NOPERM") => return Ok(false),
        Err(error) => return Err(error),
    };
    Ok(match role.first() {
        Some(Value::BulkString(name)) => name.as_slice() == b"slave",
        Some(Value::SimpleString(name)) => name == "slave",
        _ => false,
    })
}

/// Classifies a failure to connect.
fn connect_error(url: String, source: ::redis::RedisError) -> RedisError {
    if are_credentials_refused(&source) {
        RedisError::Authentication { url, source }
    } else if is_untrusted_certificate(&source) {
        RedisError::UntrustedCertificate { url, source }
    } else {
        RedisError::Connect { url, source }
    }
}

/// Whether the server refused the credentials.
fn are_credentials_refused(source: &::redis::RedisError) -> bool {
    source.kind() == ::redis::ErrorKind::AuthenticationFailed
        || matches!(source.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
}

/// Whether a failure to connect has a cause of its own error: refused credentials or an
/// untrusted certificate.
fn is_named_cause(source: &::redis::RedisError) -> bool {
    are_credentials_refused(source) || is_untrusted_certificate(source)
}

/// Whether TLS failed on the server's certificate: rustls names such a failure "invalid peer
/// certificate" (an unknown issuer, an expired certificate, another host's name).
fn is_untrusted_certificate(source: &::redis::RedisError) -> bool {
    let mut cause: Option<&dyn std::error::Error> = Some(source);
    while let Some(error) = cause {
        if error.to_string().contains("invalid peer certificate") {
            return true;
        }
        cause = error.source();
    }
    false
}

#[cfg(feature = "envoy")]
impl<P> RedisRateLimiter<P> {
    /// A limiter of `algorithm` with `plans`, on this one's connections: the same server or
    /// cluster, key prefix, timeout and failure policy, with a circuit breaker of the same
    /// settings and a deny cache of `deny_cache` entries (none for 0) of its own. For limits made
    /// while serving (the Envoy service's descriptor overrides): no connection is opened.
    ///
    /// # Errors
    ///
    /// A plan the limiter cannot honour, as [`RedisRateLimiterBuilder::build_lazy`] names it.
    pub(crate) fn sibling<Q: Eq + fmt::Debug>(
        &self,
        algorithm: Algorithm,
        plans: Vec<(Q, Vec<Rule>)>,
        deny_cache: usize,
    ) -> Result<RedisRateLimiter<Q>, RedisError> {
        let plans = checked_plans(algorithm, plans)?;
        let local = match self.policy {
            FailurePolicy::Local { share } => Some(LocalFallback::new(algorithm, &plans, share)?),
            _ => None,
        };
        // Made while serving, so within the runtime the parent's batches run on.
        let counters = Arc::new(Counters::default());
        let batcher = self.batcher.is_some().then(|| {
            Batcher::start(
                self.connections.clone(),
                algorithm,
                self.batch_size,
                self.timeout,
                Arc::clone(&counters),
            )
        });
        Ok(RedisRateLimiter {
            algorithm,
            plans,
            prefix: self.prefix.clone(),
            url: self.url.clone(),
            connections: self.connections.clone(),
            next_connection: AtomicUsize::new(0),
            timeout: self.timeout,
            policy: self.policy,
            // The same connections: the same nodes, whose failures every sibling shares.
            breaker: self.breaker.clone(),
            deny_cache: (deny_cache > 0).then(|| DenyCache::new(deny_cache)),
            local,
            counters,
            grant_names: GrantNames::new(),
            batch_size: self.batch_size,
            batcher,
        })
    }
}

/// `plans` checked for `algorithm`: Redis's own bounds first (key names, whole microseconds,
/// integers Lua keeps exact), so that a rule Redis cannot represent is named as such; then the
/// plans as every backend checks them, which bound the in-process fallback and the scripts'
/// counts.
fn checked_plans<P: fmt::Debug + Eq>(
    algorithm: Algorithm,
    plans: Vec<(P, Vec<Rule>)>,
) -> Result<Vec<PlanEntry<P>>, RedisError> {
    let mut entries = Vec::with_capacity(plans.len());
    for (plan, rules) in &plans {
        let debug = format!("{plan:?}");
        let name = debug.trim_matches('"').to_owned();
        if !is_valid_name(&name) {
            return Err(RedisError::InvalidName {
                what: "plan name",
                name,
            });
        }
        let limits = rules
            .iter()
            .map(|&rule| {
                let spec = LimitSpec::new(algorithm, rule, &debug)?;
                Ok((spec, spec.key_suffix()))
            })
            .collect::<Result<Vec<_>, RedisError>>()?;
        entries.push((name, limits));
    }
    let checked = Plans::new(algorithm, Together::Atomically, plans)?;
    Ok(checked
        .into_vec()
        .into_iter()
        .zip(entries)
        .map(|((plan, _), (name, limits))| PlanEntry { plan, name, limits })
        .collect())
}
