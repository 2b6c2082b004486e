//! [`RedisRateLimiter`]: the per-client service, with its state in Redis.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::RedisError;
use super::deny_cache::DenyCache;
use super::policy::{Breaker, CircuitBreaker, FailurePolicy, Gate, ProbeGuard, Source};
use super::script::{self, CODE_ALLOWED, CODE_DENIED, CODE_WRONG_TYPE, LimitSpec};
use super::stats::{Counters, RedisStats};
use crate::{Algorithm, Decision, MonotonicClock, RateLimiterService, Rule};

/// The default bound on one round trip: a local Redis answers in well under a millisecond, and a
/// rate limiter that waits longer than this costs its caller more than a fallback decision does.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// The default bound on establishing a connection (the first one, and each reconnection).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "tollgate";

/// How many denials the deny cache holds by default (about 100 bytes each).
pub const DEFAULT_DENY_CACHE_CAPACITY: usize = 100_000;

/// The local fallback sweeps idle clients every this many of its decisions, so an outage with
/// many distinct clients does not grow its memory without bound.
const LOCAL_SWEEP_EVERY: u64 = 1_024;

/// What a request got, and which path decided it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "an answer says whether the request may proceed"]
pub struct Answer {
    decision: Decision,
    source: Source,
}

impl Answer {
    /// The decision, as the in-process service would report it.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// Which path decided: Redis, the deny cache, or the failure policy.
    pub fn source(&self) -> Source {
        self.source
    }
}

/// One plan: its key name and its limits, each with the key suffix that names it.
#[derive(Debug)]
struct PlanEntry<P> {
    plan: P,
    name: String,
    limits: Vec<(LimitSpec, String)>,
}

/// Rate limits many clients across a fleet, each by the rules of its plan, with the state in
/// Redis: every node sharing one Redis enforces one limit together.
///
/// The same plans, rules, methods and [`Decision`]s as [`RateLimiterService`] (so the response
/// headers work unchanged), asked asynchronously. See the [module docs](super) for the
/// guarantees and the key layout.
///
/// # Examples
///
/// ```no_run
/// use tollgate::redis::{FailurePolicy, RedisRateLimiter};
/// use tollgate::{Algorithm, Rule};
///
/// #[derive(Debug, PartialEq, Eq)]
/// enum Tier { Free, Pro }
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = RedisRateLimiter::builder("redis://127.0.0.1:6379", Algorithm::TokenBucket)
///     .plan(Tier::Free, Rule::per_second(5)?)
///     .plan(Tier::Pro, Rule::per_second(50)?)
///     .failure_policy(FailurePolicy::Local { share: 0.25 }) // four nodes
///     .build()
///     .await?;
/// let decision = limiter.acquire("alice", &Tier::Free, 1).await?;
/// if decision.is_denied() {
///     println!("retry in {:?}", decision.retry_after());
/// }
/// # Ok(())
/// # }
/// ```
pub struct RedisRateLimiter<P> {
    algorithm: Algorithm,
    plans: Vec<PlanEntry<P>>,
    prefix: String,
    url: String,
    connection: ConnectionManager,
    timeout: Duration,
    policy: FailurePolicy,
    breaker: Breaker,
    deny_cache: Option<DenyCache>,
    /// The local fallback: one in-process service per limit position (a plan's first limits in
    /// the first service, and so on), plans named by their index.
    local: Vec<RateLimiterService<String, usize>>,
    local_decisions: AtomicU64,
    counters: Counters,
}

impl<P: fmt::Debug> fmt::Debug for RedisRateLimiter<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRateLimiter")
            .field("algorithm", &self.algorithm)
            .field("plans", &self.plans)
            .field("prefix", &self.prefix)
            .field("url", &self.url)
            .field("timeout", &self.timeout)
            .field("policy", &self.policy)
            .field("breaker", &self.breaker)
            .field("deny_cache", &self.deny_cache.as_ref().map(DenyCache::len))
            .field("stats", &self.counters.snapshot())
            .finish_non_exhaustive()
    }
}

/// Whether a script may commit (`acquire`) or only report (`peek`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Acquire,
    Peek,
}

impl Mode {
    fn arg(self) -> &'static str {
        match self {
            Mode::Acquire => "acquire",
            Mode::Peek => "peek",
        }
    }
}

impl<P: Eq + fmt::Debug> RedisRateLimiter<P> {
    /// A builder for a limiter on the Redis at `url` (`redis://[user:password@]host:port[/db]`)
    /// applying `algorithm`.
    pub fn builder(url: impl Into<String>, algorithm: Algorithm) -> RedisRateLimiterBuilder<P> {
        RedisRateLimiterBuilder {
            url: url.into(),
            algorithm,
            plans: Vec::new(),
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            policy: FailurePolicy::Error,
            breaker: CircuitBreaker::default(),
            deny_cache: Some(DEFAULT_DENY_CACHE_CAPACITY),
        }
    }

    /// The method this limiter applies.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The rules of `plan` (one, unless it was given several), if the limiter has it.
    pub fn rules(&self, plan: &P) -> Option<Vec<Rule>> {
        let entry = self.plans.iter().find(|entry| entry.plan == *plan)?;
        Some(entry.limits.iter().map(|(spec, _)| spec.rule()).collect())
    }

    /// The policy applied when Redis fails.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.policy
    }

    /// How the limiter's decisions were made so far.
    pub fn stats(&self) -> RedisStats {
        self.counters.snapshot()
    }

    /// The Redis keys holding `client`'s state under `plan`, one per limit (see the key layout
    /// in the [module docs](super)).
    ///
    /// # Errors
    ///
    /// [`RedisError::UnknownPlan`] for a plan the limiter does not have.
    pub fn keys(&self, client: &str, plan: &P) -> Result<Vec<String>, RedisError> {
        let (_, entry) = self.plan_entry(plan)?;
        Ok(self.keys_of(entry, client))
    }

    /// Takes one permit for `client` under `plan`; `Ok(false)` when it is denied.
    ///
    /// # Errors
    ///
    /// As [`RedisRateLimiter::decide`].
    pub async fn allow(&self, client: &str, plan: &P) -> Result<bool, RedisError> {
        Ok(self.acquire(client, plan, 1).await?.is_allowed())
    }

    /// Takes `n` permits for `client` under `plan`, all or nothing, in one round trip (or none:
    /// see [`Source`]). Every method takes batches, the sliding log included (its `n`
    /// admissions are logged at one instant). `n = 0` reports what is available and takes
    /// nothing; `n` above the limit (above any one limit of a plan of several) can never be
    /// granted and is rejected as in process, with the quota a round trip of 0 permits reads.
    ///
    /// # Errors
    ///
    /// As [`RedisRateLimiter::decide`].
    pub async fn acquire(&self, client: &str, plan: &P, n: u64) -> Result<Decision, RedisError> {
        Ok(self.decide(client, plan, n).await?.decision)
    }

    /// [`RedisRateLimiter::acquire`], with the path that decided.
    ///
    /// # Errors
    ///
    /// [`RedisError::UnknownPlan`] for a plan the limiter does not have;
    /// [`RedisError::WrongType`] when a key holds another program's value; and, under
    /// [`FailurePolicy::Error`] only, the failure ([`RedisError::Timeout`],
    /// [`RedisError::CircuitOpen`], [`RedisError::Command`]). The other policies answer a failure
    /// with a decision.
    pub async fn decide(&self, client: &str, plan: &P, n: u64) -> Result<Answer, RedisError> {
        self.decide_inner(client, plan, n, Mode::Acquire, None)
            .await
    }

    /// Reports, taking nothing, what one permit for `client` under `plan` would get now.
    ///
    /// # Errors
    ///
    /// As [`RedisRateLimiter::decide`].
    pub async fn peek(&self, client: &str, plan: &P) -> Result<Decision, RedisError> {
        Ok(self
            .decide_inner(client, plan, 1, Mode::Peek, None)
            .await?
            .decision)
    }

    /// [`RedisRateLimiter::decide`] at `now_us` microseconds instead of the server's clock, for
    /// tests that replay a history. Skips the deny cache (it runs on the real clock).
    ///
    /// # Errors
    ///
    /// As [`RedisRateLimiter::decide`].
    #[doc(hidden)]
    pub async fn decide_at(
        &self,
        client: &str,
        plan: &P,
        n: u64,
        now_us: u64,
    ) -> Result<Answer, RedisError> {
        self.decide_inner(client, plan, n, Mode::Acquire, Some(now_us))
            .await
    }

    /// [`RedisRateLimiter::peek`] at `now_us` microseconds (see [`RedisRateLimiter::decide_at`]).
    ///
    /// # Errors
    ///
    /// As [`RedisRateLimiter::decide`].
    #[doc(hidden)]
    pub async fn peek_at(&self, client: &str, plan: &P, now_us: u64) -> Result<Answer, RedisError> {
        self.decide_inner(client, plan, 1, Mode::Peek, Some(now_us))
            .await
    }

    fn plan_entry(&self, plan: &P) -> Result<(usize, &PlanEntry<P>), RedisError> {
        self.plans
            .iter()
            .enumerate()
            .find(|(_, entry)| entry.plan == *plan)
            .ok_or_else(|| RedisError::UnknownPlan {
                plan: format!("{plan:?}"),
            })
    }

    fn keys_of(&self, entry: &PlanEntry<P>, client: &str) -> Vec<String> {
        // Every key of one client under one plan shares the hash tag `{plan:client}`, so one
        // script can touch them all on Redis Cluster.
        entry
            .limits
            .iter()
            .map(|(_, suffix)| format!("{}:{{{}:{}}}:{}", self.prefix, entry.name, client, suffix))
            .collect()
    }

    async fn decide_inner(
        &self,
        client: &str,
        plan: &P,
        n: u64,
        mode: Mode,
        now_us: Option<u64>,
    ) -> Result<Answer, RedisError> {
        // Answers from the deny cache or the fallback complete without waiting; spending the
        // task's budget lets tokio preempt a task that loops on them, as it would on I/O.
        tokio::task::coop::consume_budget().await;
        let (index, entry) = self.plan_entry(plan)?;
        if mode == Mode::Acquire
            && let Some(rejected) = entry.limits.iter().find_map(|(spec, _)| spec.reject(n))
        {
            Counters::bump(&self.counters.rejections);
            // A request that can never pass still reports the real quota, as in process: one
            // round trip of 0 permits (which writes nothing). Without it, the rejection stands
            // with no figures.
            let quota = Box::pin(self.decide_inner(client, plan, 0, Mode::Acquire, now_us)).await;
            let decision = match (quota, rejected.rejection()) {
                (Ok(quota), Some(rejection)) => quota.decision.into_rejected(rejection),
                _ => rejected,
            };
            return Ok(Answer {
                decision,
                source: Source::Rejected,
            });
        }
        // The deny cache answers on the real clock only, and only what takes permits.
        let cache = self
            .deny_cache
            .as_ref()
            .filter(|_| mode == Mode::Acquire && n > 0 && now_us.is_none());
        let cache_key = cache.map(|_| format!("{index}:{client}"));
        if let (Some(cache), Some(key)) = (cache, &cache_key)
            && let Some(decision) = cache.get(key, n)
        {
            Counters::bump(&self.counters.cache_hits);
            return Ok(Answer {
                decision,
                source: Source::DenyCache,
            });
        }

        let gate = self.breaker.gate();
        if let Gate::Open { retry_in } = gate {
            Counters::bump(&self.counters.short_circuits);
            return self.fall_back(
                index,
                entry,
                client,
                n,
                mode,
                RedisError::CircuitOpen { retry_in },
            );
        }
        let probe = ProbeGuard::new(&self.breaker, gate);
        let keys = self.keys_of(entry, client);
        let sent_at = cache.map(DenyCache::now);
        let reply = self.round_trip(entry, &keys, n, mode, now_us).await;
        let is_probe = probe.is_probe();
        probe.disarm();
        let reply = match reply {
            Ok(reply) => {
                self.breaker.success(is_probe);
                reply
            }
            Err(error) => {
                Counters::bump(&self.counters.errors);
                if matches!(error, RedisError::Timeout { .. }) {
                    Counters::bump(&self.counters.timeouts);
                }
                if self.breaker.failure(is_probe) {
                    Counters::bump(&self.counters.circuit_opens);
                }
                return self.fall_back(index, entry, client, n, mode, error);
            }
        };
        let decision = Self::read_reply(entry, &keys, &reply)?;
        Counters::bump(&self.counters.redis_decisions);
        if decision.is_denied()
            && let (Some(cache), Some(key), Some(sent_at)) = (cache, cache_key, sent_at)
        {
            cache.insert(key, n, sent_at, &decision);
        }
        Ok(Answer {
            decision,
            source: Source::Redis,
        })
    }

    /// One script call, bounded by the timeout.
    async fn round_trip(
        &self,
        entry: &PlanEntry<P>,
        keys: &[String],
        n: u64,
        mode: Mode,
        now_us: Option<u64>,
    ) -> Result<Vec<i64>, RedisError> {
        let script = script::script_for(self.algorithm);
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(key);
        }
        let now_arg = now_us.map(|now| now.to_string()).unwrap_or_default();
        invocation.arg(n).arg(mode.arg()).arg(now_arg);
        for (spec, _) in &entry.limits {
            spec.push_args(&mut invocation);
        }
        Counters::bump(&self.counters.round_trips);
        let mut connection = self.connection.clone();
        // EVALSHA; on NOSCRIPT (a restarted or flushed server) the client loads the script and
        // retries, once.
        let call = invocation.invoke_async::<Vec<i64>>(&mut connection);
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(source)) if source.is_timeout() => Err(RedisError::Timeout {
                after: self.timeout,
            }),
            Ok(Err(source)) => Err(RedisError::Command { source }),
            Err(_) => Err(RedisError::Timeout {
                after: self.timeout,
            }),
        }
    }

    /// The plan's decision from a script's reply: the denial with the longest wait if any limit
    /// denied, else the allowance with the fewest permits left.
    fn read_reply(
        entry: &PlanEntry<P>,
        keys: &[String],
        reply: &[i64],
    ) -> Result<Decision, RedisError> {
        let bad_reply = || RedisError::BadReply {
            reply: format!("{reply:?}"),
        };
        match reply.first().copied() {
            Some(CODE_WRONG_TYPE) => {
                let index = reply.get(1).and_then(|&i| usize::try_from(i).ok());
                let key = index
                    .and_then(|i| keys.get(i.wrapping_sub(1)))
                    .ok_or_else(bad_reply)?;
                return Err(RedisError::WrongType { key: key.clone() });
            }
            Some(CODE_ALLOWED | CODE_DENIED) => {}
            _ => return Err(bad_reply()),
        }
        let mut figures = reply.get(3..).ok_or_else(bad_reply)?;
        let expected: usize = entry
            .limits
            .iter()
            .map(|(spec, _)| spec.figure_count())
            .sum();
        if figures.len() != expected {
            return Err(bad_reply());
        }
        let decisions = entry.limits.iter().map(|(spec, _)| {
            let (own, rest) = figures.split_at(spec.figure_count());
            figures = rest;
            spec.decision(own)
        });
        combine(decisions).ok_or_else(bad_reply)
    }

    /// The failure policy's answer.
    fn fall_back(
        &self,
        index: usize,
        entry: &PlanEntry<P>,
        client: &str,
        n: u64,
        mode: Mode,
        error: RedisError,
    ) -> Result<Answer, RedisError> {
        let Some((first, _)) = entry.limits.first() else {
            return Err(error);
        };
        let rule = first.rule();
        let (decision, source) = match self.policy {
            FailurePolicy::Error => return Err(error),
            FailurePolicy::FailOpen => (Decision::allowed(rule, 0, 0), Source::FailOpen),
            FailurePolicy::FailClosed => {
                let retry = duration_nanos(self.breaker.cool_down());
                let window = rule.window_nanos();
                (Decision::denied(rule, 0, retry, window), Source::FailClosed)
            }
            FailurePolicy::Local { .. } => {
                (self.local_decision(index, client, n, mode), Source::Local)
            }
        };
        Counters::bump(&self.counters.fallbacks);
        Ok(Answer { decision, source })
    }

    /// The in-process fallback: the plan's limits taken one after another, stopping at the first
    /// denial (one already taken stays taken: the fallback can under-admit, never over-admit).
    fn local_decision(&self, index: usize, client: &str, n: u64, mode: Mode) -> Decision {
        // Relaxed: a sweep schedule, nothing more.
        let count = self.local_decisions.fetch_add(1, Ordering::Relaxed);
        if count % LOCAL_SWEEP_EVERY == LOCAL_SWEEP_EVERY - 1 {
            for service in &self.local {
                service.sweep();
            }
        }
        let mut decisions = Vec::with_capacity(self.local.len());
        for service in &self.local {
            let result = match mode {
                Mode::Acquire => service.acquire(client, &index, n),
                Mode::Peek => service.peek(client, &index),
            };
            match result {
                Ok(decision) if decision.is_denied() => return decision,
                Ok(decision) => decisions.push(decision),
                // The plan has fewer limits than this position.
                Err(_) => {}
            }
        }
        combine(decisions.into_iter()).unwrap_or_else(|| {
            // Unreachable: every plan has a first limit, in the first service.
            let rule = self.plans[index].limits[0].0.rule();
            Decision::denied(rule, 0, rule.window_nanos(), rule.window_nanos())
        })
    }
}

/// The denial with the longest wait, else the allowance with the fewest permits left.
fn combine(decisions: impl Iterator<Item = Decision>) -> Option<Decision> {
    decisions.reduce(|best, next| match (best.is_denied(), next.is_denied()) {
        (true, true) if next.retry_after() > best.retry_after() => next,
        (false, true) => next,
        (false, false) if next.remaining() < best.remaining() => next,
        _ => best,
    })
}

fn duration_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
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
}

impl<P: Eq + fmt::Debug> RedisRateLimiterBuilder<P> {
    /// Adds `plan` with its `rule`.
    pub fn plan(self, plan: P, rule: Rule) -> Self {
        self.plan_with_limits(plan, [rule])
    }

    /// Adds each plan with its rule.
    pub fn plans(mut self, rules: impl IntoIterator<Item = (P, Rule)>) -> Self {
        self.plans
            .extend(rules.into_iter().map(|(plan, rule)| (plan, vec![rule])));
        self
    }

    /// Adds `plan` with several limits (say 10 per second and 1000 per hour), decided together
    /// in one round trip: a request is granted only if every limit grants it, and then taken
    /// from all of them; a denial takes from none. The decision reported is the denial with the
    /// longest wait, or the allowance with the fewest permits left.
    pub fn plan_with_limits(mut self, plan: P, rules: impl IntoIterator<Item = Rule>) -> Self {
        self.plans.push((plan, rules.into_iter().collect()));
        self
    }

    /// The first part of every key (default `tollgate`), to keep several services apart on one
    /// Redis.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The bound on one round trip (default [`DEFAULT_TIMEOUT`], 50 ms); past it the request is
    /// decided by the failure policy.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The bound on establishing a connection (default [`DEFAULT_CONNECT_TIMEOUT`], 1 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
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
    /// [`DEFAULT_DENY_CACHE_CAPACITY`]); `0` turns it off.
    pub fn deny_cache(mut self, capacity: usize) -> Self {
        self.deny_cache = (capacity > 0).then_some(capacity);
        self
    }

    /// Connects, loads the scripts, and returns the limiter. Needs a tokio runtime.
    ///
    /// # Errors
    ///
    /// A setting or plan the limiter cannot honour (see [`RedisError`]), an invalid URL, a
    /// server that cannot be reached ([`RedisError::Connect`]) or refuses the credentials
    /// ([`RedisError::Authentication`]).
    pub async fn build(self) -> Result<RedisRateLimiter<P>, RedisError> {
        // A connection, then one round trip per script.
        let bound = self
            .connect_timeout
            .saturating_add(self.timeout.saturating_mul(3));
        let limiter = self.build_lazy()?;
        let mut connection = limiter.connection.clone();
        let url = limiter.url.clone();
        let connect = async {
            for algorithm in Algorithm::ALL {
                script::script_for(algorithm)
                    .load_async(&mut connection)
                    .await?;
            }
            Ok::<(), ::redis::RedisError>(())
        };
        match tokio::time::timeout(bound, connect).await {
            Ok(Ok(())) => Ok(limiter),
            Ok(Err(source)) => Err(connect_error(url, source)),
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
        if self.plans.is_empty() {
            return Err(RedisError::NoPlans);
        }

        let mut plans: Vec<PlanEntry<P>> = Vec::with_capacity(self.plans.len());
        for (plan, rules) in self.plans {
            let debug = format!("{plan:?}");
            if plans.iter().any(|entry| entry.plan == plan) {
                return Err(RedisError::DuplicatePlan { plan: debug });
            }
            let name = debug.trim_matches('"').to_owned();
            if !is_valid_name(&name) {
                return Err(RedisError::InvalidName {
                    what: "plan name",
                    name,
                });
            }
            if rules.is_empty() {
                return Err(RedisError::InvalidLimits {
                    plan: debug,
                    reason: "no rule given: a plan needs at least one",
                });
            }
            let mut limits: Vec<(LimitSpec, String)> = Vec::with_capacity(rules.len());
            for rule in rules {
                let spec = LimitSpec::new(self.algorithm, rule, &debug)?;
                let suffix = spec.key_suffix();
                if limits.iter().any(|(_, existing)| *existing == suffix) {
                    return Err(RedisError::InvalidLimits {
                        plan: debug,
                        reason: "the same rule is given twice",
                    });
                }
                limits.push((spec, suffix));
            }
            plans.push(PlanEntry { plan, name, limits });
        }

        let local = match share {
            Some(share) => local_services(self.algorithm, &plans, share)?,
            None => Vec::new(),
        };

        let client =
            ::redis::Client::open(self.url.as_str()).map_err(|source| RedisError::InvalidUrl {
                url: url.clone(),
                source,
            })?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.timeout))
            .set_connection_timeout(Some(self.connect_timeout))
            // Reconnection is retried by the next requests (the circuit breaker paces them),
            // not by a long backoff inside the client that would hold requests up.
            .set_number_of_retries(1);
        let connection = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|source| connect_error(url.clone(), source))?;

        Ok(RedisRateLimiter {
            algorithm: self.algorithm,
            plans,
            prefix: self.prefix,
            url,
            connection,
            timeout: self.timeout,
            policy: self.policy,
            breaker: Breaker::new(self.breaker),
            deny_cache: self.deny_cache.map(DenyCache::new),
            local,
            local_decisions: AtomicU64::new(0),
            counters: Counters::default(),
        })
    }
}

/// The in-process services of the local fallback, with `share` of each limit.
fn local_services<P: fmt::Debug>(
    algorithm: Algorithm,
    plans: &[PlanEntry<P>],
    share: f64,
) -> Result<Vec<RateLimiterService<String, usize>>, RedisError> {
    let positions = plans
        .iter()
        .map(|entry| entry.limits.len())
        .max()
        .unwrap_or(0);
    let mut services = Vec::with_capacity(positions);
    for position in 0..positions {
        let mut rules = Vec::new();
        for (index, entry) in plans.iter().enumerate() {
            let Some((spec, _)) = entry.limits.get(position) else {
                continue;
            };
            let rule = spec.rule();
            // The share is a setting, not state: rounding it down keeps the fleet within the
            // limit; at least 1 keeps every plan usable.
            let limit = ((rule.limit() as f64 * share) as u64).max(1);
            let invalid = |source| RedisError::InvalidRule {
                plan: format!("{:?}", entry.plan),
                source,
            };
            let local_rule = Rule::new(limit, rule.window()).map_err(invalid)?;
            script::check_in_process(algorithm, local_rule).map_err(invalid)?;
            rules.push((index, local_rule));
        }
        let service =
            RateLimiterService::new(algorithm, rules, MonotonicClock::new()).map_err(|error| {
                RedisError::InvalidSetting {
                    field: "local fallback",
                    value: error.to_string(),
                    bound: "the in-process service must accept every plan's share",
                }
            })?;
        services.push(service);
    }
    Ok(services)
}

fn is_valid_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['{', '}', ':'])
}

/// Classifies a failure to connect.
fn connect_error(url: String, source: ::redis::RedisError) -> RedisError {
    let refused_credentials = source.kind() == ::redis::ErrorKind::AuthenticationFailed
        || matches!(source.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"));
    if refused_credentials {
        RedisError::Authentication { url, source }
    } else {
        RedisError::Connect { url, source }
    }
}

/// `url` with the password, if any, replaced by `***`, fit for errors and logs.
fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &rest[..at];
    let user = userinfo.split_once(':').map_or("", |(user, _)| user);
    format!("{}{user}:***{}", &url[..scheme_end], &rest[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_the_password_only() {
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(
            redact("redis://:secret@127.0.0.1:6379/0"),
            "redis://:***@127.0.0.1:6379/0"
        );
        assert_eq!(
            redact("redis://user:secret@host:1"),
            "redis://user:***@host:1"
        );
    }

    #[test]
    fn combine_reports_the_longest_denial_else_the_tightest_allowance() {
        let a = Rule::per_second(10).unwrap();
        let b = Rule::per_hour(100).unwrap();
        let allowed = [Decision::allowed(a, 9, 1), Decision::allowed(b, 3, 1)];
        assert_eq!(combine(allowed.into_iter()).unwrap().remaining(), 3);
        let mixed = [
            Decision::allowed(a, 0, 1),
            Decision::denied(b, 0, 5, 5),
            Decision::denied(a, 0, 9, 9),
        ];
        assert_eq!(
            combine(mixed.into_iter()).unwrap().retry_after().as_nanos(),
            9
        );
    }
}
