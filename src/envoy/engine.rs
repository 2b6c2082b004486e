//! The running configuration: each domain's descriptor tree with a limiter per limited
//! descriptor, and the decision of one `ShouldRateLimit` request on it.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

use super::config::{DescriptorNode, Limits, RlsConfig, Unit, UnitLimit, ValueMatch};
use super::metrics::DescriptorMetrics;
use crate::headers::{LimitFigures, PreparedFields};
use crate::method::several_limits::SeveralLimits;
use crate::redis::{FailurePolicy, RedisError, RedisGrant, RedisRateLimiter, Source};
use crate::service::Grant;
use crate::verdict::Reported;
use crate::{Algorithm, Decision, MonotonicClock, RateLimiterService, Rule, ServiceBuilder};

/// The Redis key prefix of the service's limits.
pub(crate) const KEY_PREFIX: &str = "tollgate-rls";

/// The one plan of a descriptor's in-process service: each limited descriptor has a service of
/// its own, so that a reload replaces one descriptor's limits without touching another's.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct DescriptorPlan;

impl fmt::Debug for DescriptorPlan {
    /// How a plan's error names it: the descriptor is named beside it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(the descriptor's)")
    }
}

type InProcess = RateLimiterService<String, DescriptorPlan, MonotonicClock>;

/// Where the limits' state is kept.
#[derive(Clone)]
pub enum StateStore {
    /// In this process, `clients` per limited descriptor (the most clients, here distinct
    /// values, each descriptor holds; see [`ServiceBuilder::capacity`]).
    InProcess {
        /// Clients per limited descriptor.
        clients: usize,
    },
    /// On Redis: every instance given the same URL shares each limit.
    Redis {
        /// The server or cluster (see [`RedisRateLimiter::builder`]).
        url: String,
        /// What a decision does when Redis does not answer.
        policy: FailurePolicy,
        /// Time allowed per round trip.
        timeout: Duration,
    },
}

impl fmt::Debug for StateStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateStore::InProcess { clients } => f
                .debug_struct("InProcess")
                .field("clients", clients)
                .finish(),
            StateStore::Redis {
                policy, timeout, ..
            } => f
                .debug_struct("Redis")
                .field("url", &"(redacted)")
                .field("policy", policy)
                .field("timeout", timeout)
                .finish(),
        }
    }
}

/// A limited descriptor's limiter.
pub(crate) enum Limiter {
    InProcess(Arc<InProcess>),
    /// The plan named `plan` of the method's Redis limiter.
    Redis {
        limiter: Arc<RedisRateLimiter<String>>,
        plan: String,
    },
}

/// What a matched descriptor gets, made ready.
pub(crate) enum Enforced {
    Unlimited,
    Blocked(Unit),
    Limited {
        method: Algorithm,
        limits: Vec<UnitLimit>,
        limiter: Limiter,
    },
}

/// A configured descriptor entry, made ready.
pub(crate) struct Node {
    identity: String,
    key: String,
    value: ValueMatch,
    pub(crate) limit: Option<NodeLimit>,
    pub(crate) shadow_mode: bool,
    children: Vec<Node>,
}

pub(crate) struct NodeLimit {
    pub(crate) enforced: Enforced,
    pub(crate) name: Option<String>,
    pub(crate) replaces: Vec<String>,
    /// The name the `RateLimit` fields give this limit: its own, else its descriptor's path,
    /// made printable.
    pub(crate) policy: String,
    /// The fields of its configured limits, written once (none without limits).
    pub(crate) fields: Option<PreparedFields>,
    pub(crate) metrics: DescriptorMetrics,
}

impl NodeLimit {
    /// Whether its state is on Redis (a decision is a round trip).
    pub(crate) fn is_remote(&self) -> bool {
        matches!(
            self.enforced,
            Enforced::Limited {
                limiter: Limiter::Redis { .. },
                ..
            }
        )
    }
}

/// The running configuration.
pub(crate) struct Snapshot {
    domains: HashMap<String, Domain>,
}

/// One domain, made ready.
pub(crate) struct Domain {
    /// The method of the limits that requests' descriptors bring (see [`Overrides`]).
    pub(crate) method: Algorithm,
    pub(crate) nodes: Vec<Node>,
}

/// What a reload keeps: each in-process descriptor's service by its domain, path, method and
/// limits, so a descriptor whose limits did not change keeps its clients' state.
type Kept = HashMap<(String, String, Algorithm, Vec<UnitLimit>), Arc<InProcess>>;

impl Snapshot {
    /// Makes `config` ready on `store`, keeping the state of every descriptor of `previous`
    /// whose limits are unchanged.
    pub(crate) async fn build(
        config: &RlsConfig,
        store: &StateStore,
        previous: Option<&Snapshot>,
    ) -> Result<Snapshot, super::BuildError> {
        let mut kept = Kept::new();
        if let Some(previous) = previous {
            for (domain, ready) in &previous.domains {
                keep(domain, &ready.nodes, &mut kept);
            }
        }
        // Redis: one limiter per method, one plan per limited descriptor.
        let mut redis_plans: HashMap<Algorithm, Vec<(String, Vec<Rule>)>> = HashMap::new();
        if matches!(store, StateStore::Redis { .. }) {
            for domain in &config.domains {
                collect_redis_plans(&domain.domain, &domain.descriptors, &mut redis_plans);
            }
        }
        let mut redis = HashMap::new();
        if let StateStore::Redis {
            url,
            policy,
            timeout,
        } = store
        {
            for (method, plans) in redis_plans {
                let mut builder = RedisRateLimiter::<String>::builder(url.clone(), method)
                    .failure_policy(*policy)
                    .timeout(*timeout)
                    .key_prefix(KEY_PREFIX);
                for (plan, rules) in plans {
                    builder = builder.plan_limits(plan, rules);
                }
                let limiter = builder.build().await.map_err(super::BuildError::Redis)?;
                redis.insert(method, Arc::new(limiter));
            }
        }
        let mut domains = HashMap::with_capacity(config.domains.len());
        for domain in &config.domains {
            let ready = Ready {
                domain: &domain.domain,
                store,
                kept: &kept,
                redis: &redis,
            };
            let nodes = ready.nodes(&domain.descriptors)?;
            domains.insert(
                domain.domain.clone(),
                Domain {
                    method: domain.method,
                    nodes,
                },
            );
        }
        Ok(Snapshot { domains })
    }

    /// The domain, if it is known.
    pub(crate) fn domain(&self, domain: &str) -> Option<&Domain> {
        self.domains.get(domain)
    }
}

fn keep(domain: &str, nodes: &[Node], kept: &mut Kept) {
    for node in nodes {
        if let Some(NodeLimit {
            enforced:
                Enforced::Limited {
                    method,
                    limits,
                    limiter: Limiter::InProcess(service),
                },
            ..
        }) = &node.limit
        {
            kept.insert(
                (
                    domain.to_owned(),
                    node.identity.clone(),
                    *method,
                    limits.clone(),
                ),
                Arc::clone(service),
            );
        }
        keep(domain, &node.children, kept);
    }
}

/// The Redis plan name of a descriptor: `kind` (`d` for a configured descriptor, `o` for a limit
/// a request brings) and a fixed hash of its domain and identity (a Redis plan name may hold no
/// `{`, `}` or `:`), the same on every instance and across reloads, so instances given one
/// configuration share each limit.
pub(crate) fn redis_plan_name(kind: char, domain: &str, identity: &str) -> String {
    // FNV-1a over an injective encoding: the domain's length, then both texts.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let length = domain.len().to_le_bytes();
    for byte in length
        .iter()
        .chain(domain.as_bytes())
        .chain(identity.as_bytes())
    {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{kind}{hash:016x}")
}

pub(crate) fn rules_of(limits: &[UnitLimit]) -> Vec<Rule> {
    limits
        .iter()
        .map(|limit| {
            limit
                .rule()
                .expect("checked when the configuration was read")
        })
        .collect()
}

fn collect_redis_plans(
    domain: &str,
    nodes: &[DescriptorNode],
    plans: &mut HashMap<Algorithm, Vec<(String, Vec<Rule>)>>,
) {
    for node in nodes {
        if let Some(limit) = &node.limit
            && let Limits::Limited { method, limits } = &limit.limits
        {
            plans.entry(*method).or_default().push((
                redis_plan_name('d', domain, &node.identity),
                rules_of(limits),
            ));
        }
        collect_redis_plans(domain, &node.children, plans);
    }
}

struct Ready<'a> {
    domain: &'a str,
    store: &'a StateStore,
    kept: &'a Kept,
    redis: &'a HashMap<Algorithm, Arc<RedisRateLimiter<String>>>,
}

impl Ready<'_> {
    fn nodes(&self, nodes: &[DescriptorNode]) -> Result<Vec<Node>, super::BuildError> {
        nodes.iter().map(|node| self.node(node)).collect()
    }

    fn node(&self, node: &DescriptorNode) -> Result<Node, super::BuildError> {
        let limit = match &node.limit {
            None => None,
            Some(limit) => {
                let enforced = match &limit.limits {
                    Limits::Unlimited => Enforced::Unlimited,
                    Limits::Blocked(unit) => Enforced::Blocked(*unit),
                    Limits::Limited { method, limits } => Enforced::Limited {
                        method: *method,
                        limits: limits.clone(),
                        limiter: self.limiter(node, *method, limits)?,
                    },
                };
                let policy = policy_name(limit.name.as_deref().unwrap_or(&node.path));
                let fields = match &limit.limits {
                    Limits::Limited { limits, .. } => prepared_fields(&policy, limits),
                    _ => None,
                };
                Some(NodeLimit {
                    enforced,
                    name: limit.name.clone(),
                    replaces: limit.replaces.clone(),
                    policy,
                    fields,
                    metrics: DescriptorMetrics::new(self.domain, &node.path, node.detailed_metric),
                })
            }
        };
        Ok(Node {
            identity: node.identity.clone(),
            key: node.key.clone(),
            value: node.value.clone(),
            limit,
            shadow_mode: node.shadow_mode,
            children: self.nodes(&node.children)?,
        })
    }

    fn limiter(
        &self,
        node: &DescriptorNode,
        method: Algorithm,
        limits: &[UnitLimit],
    ) -> Result<Limiter, super::BuildError> {
        match self.store {
            StateStore::InProcess { clients } => {
                let key = (
                    self.domain.to_owned(),
                    node.identity.clone(),
                    method,
                    limits.to_vec(),
                );
                if let Some(service) = self.kept.get(&key) {
                    return Ok(Limiter::InProcess(Arc::clone(service)));
                }
                in_process(method, limits, *clients).map_err(|source| {
                    super::BuildError::Descriptor {
                        domain: self.domain.to_owned(),
                        path: node.path.clone(),
                        source,
                    }
                })
            }
            StateStore::Redis { .. } => Ok(Limiter::Redis {
                limiter: Arc::clone(
                    self.redis
                        .get(&method)
                        .expect("a Redis limiter is made for every method in use"),
                ),
                plan: redis_plan_name('d', self.domain, &node.identity),
            }),
        }
    }
}

/// The `RateLimit` fields of `limits` under the name `policy`, written once.
pub(crate) fn prepared_fields(policy: &str, limits: &[UnitLimit]) -> Option<PreparedFields> {
    let figures: Vec<LimitFigures> = rules_of(limits)
        .iter()
        .map(|rule| LimitFigures::of(&Decision::allowed(*rule, 0, 0)))
        .collect();
    PreparedFields::new(policy, &figures).ok()
}

/// An in-process limiter of `limits` by `method`, holding `clients` clients; the error names
/// what the method cannot enforce.
pub(crate) fn in_process(
    method: Algorithm,
    limits: &[UnitLimit],
    clients: usize,
) -> Result<Limiter, String> {
    let service = ServiceBuilder::new(method, MonotonicClock::new())
        .plan_limits(DescriptorPlan, rules_of(limits))
        .capacity(clients)
        .build::<String>()
        .map_err(|source| source.to_string())?;
    Ok(Limiter::InProcess(Arc::new(service)))
}

/// `text` made a Structured Field String: printable ASCII, anything else as `?`.
fn policy_name(text: &str) -> String {
    let name: String = text
        .chars()
        .map(|c| if (' '..='~').contains(&c) { c } else { '?' })
        .collect();
    if name.is_empty() {
        "limit".to_owned()
    } else {
        name
    }
}

/// The configured descriptor that a request's descriptor matches, as envoyproxy/ratelimit
/// matches it: entry by entry down the tree, a node of the entry's key and exact value before
/// one whose value the entry's starts with, before one of the key alone; the limit is that of
/// the node the last entry reaches.
pub(crate) fn find<'a>(nodes: &'a [Node], entries: &[Entry]) -> Option<&'a Node> {
    let mut level = nodes;
    let mut found = None;
    for entry in entries {
        let exact = level.iter().find(|node| {
            node.key == entry.key
                && matches!(&node.value, ValueMatch::Exact(v) if *v == entry.value)
        });
        let node = exact
            .or_else(|| {
                level.iter().find(|node| {
                    node.key == entry.key
                        && matches!(&node.value, ValueMatch::Prefix(p) if entry.value.starts_with(p.as_str()))
                })
            })
            .or_else(|| {
                level
                    .iter()
                    .find(|node| node.key == entry.key && node.value == ValueMatch::Any)
            })?;
        found = Some(node);
        level = &node.children;
    }
    found
}

/// The client of a descriptor that brings its own limit: its entries' keys and values, each
/// with its length (the entries are not those of one configured descriptor, whose keys are
/// fixed, so the keys tell clients apart too).
pub(crate) fn brought_client_key(entries: &[Entry]) -> String {
    counted_texts(
        entries
            .iter()
            .flat_map(|entry| [entry.key.as_str(), entry.value.as_str()]),
    )
}

/// The client of a matched descriptor: its entries' values, each with its length, so that no
/// two lists of values make one client.
pub(crate) fn client_key(entries: &[Entry]) -> String {
    counted_texts(entries.iter().map(|entry| entry.value.as_str()))
}

/// `texts` joined, each after its length and a `:`, so that no two lists of texts join alike.
fn counted_texts<'a>(texts: impl Iterator<Item = &'a str> + Clone) -> String {
    let mut key = String::with_capacity(texts.clone().map(|text| text.len() + 4).sum());
    for text in texts {
        // Writing to a String does not fail.
        let _ = crate::headers::write_integer(&mut key, text.len() as u64);
        key.push(':');
        key.push_str(text);
    }
    key
}

/// The permits a descriptor asks for: its own `hits_addend` when set, else the request's, where
/// 0 means 1.
pub(crate) fn hits_of(descriptor: &RateLimitDescriptor, request_hits: u32) -> u64 {
    match &descriptor.hits_addend {
        Some(hits) => hits.value,
        None => u64::from(request_hits.max(1)),
    }
}

/// A grant a refused request gives back, where it was made.
pub(crate) enum Taken {
    InProcess(Grant),
    Redis(RedisGrant),
}

/// One limited descriptor's answer: the decision and each limit's figures.
pub(crate) struct Outcome {
    pub(crate) decision: Decision,
    pub(crate) figures: EachLimit,
}

/// Each limit's figures of one descriptor, in order, kept inline: a descriptor has at most
/// `SeveralLimits::MAX_LIMITS` limits, and a decision then answers without allocating.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct EachLimit {
    items: [LimitFigures; SeveralLimits::MAX_LIMITS],
    len: usize,
}

impl std::ops::Deref for EachLimit {
    type Target = [LimitFigures];

    fn deref(&self) -> &[LimitFigures] {
        &self.items[..self.len]
    }
}

impl FromIterator<LimitFigures> for EachLimit {
    /// The first `SeveralLimits::MAX_LIMITS` items (a plan has no more limits).
    fn from_iter<I: IntoIterator<Item = LimitFigures>>(iter: I) -> Self {
        let mut each = EachLimit::default();
        for (slot, figures) in each.items.iter_mut().zip(iter) {
            *slot = figures;
            each.len += 1;
        }
        each
    }
}

impl Limiter {
    /// In process: takes `hits` for `client` now. `None` for a limiter on Redis.
    pub(crate) fn acquire_now(&self, client: &str, hits: u64) -> Option<Outcome> {
        match self {
            Limiter::InProcess(service) => {
                let reported = service
                    .acquire_reported(client, &DescriptorPlan, hits)
                    .expect("the service has its one plan");
                Some(outcome_of(&reported))
            }
            Limiter::Redis { .. } => None,
        }
    }

    /// In process: takes `hits` for `client` now, as [`Limiter::acquire_now`], with the grant
    /// to give back should another descriptor of the request refuse it (none for the sliding
    /// log, which cannot undo one). `None` for a limiter on Redis.
    pub(crate) fn reserve_now(&self, client: &str, hits: u64) -> Option<(Outcome, Option<Grant>)> {
        match self {
            Limiter::InProcess(service) => {
                let (reported, grant) = service
                    .reserve_reported(client, &DescriptorPlan, hits)
                    .expect("the service has its one plan");
                Some((outcome_of(&reported), grant))
            }
            Limiter::Redis { .. } => None,
        }
    }

    /// In process: gives back `grant`, made by [`Limiter::reserve_now`] for `client` (see
    /// `RateLimiterService::give_back` for what it restores).
    pub(crate) fn give_back_now(&self, client: &str, grant: &Grant) {
        if let Limiter::InProcess(service) = self {
            service.give_back(client, &DescriptorPlan, grant);
        }
    }

    /// In process: gives `hits` permits back to `client` (a refund: see
    /// `RateLimiterService::refund`). Nothing on Redis (see [`Limiter::refund`]).
    pub(crate) fn refund_now(&self, client: &str, hits: u64) {
        if let Limiter::InProcess(service) = self {
            let _found = service
                .refund(client, &DescriptorPlan, hits)
                .expect("the service has its one plan");
        }
    }

    /// Gives `hits` permits back to `client` (a refund: see `RateLimiterService::refund` and
    /// `RedisRateLimiter::refund`). A failed round trip gives nothing back.
    pub(crate) async fn refund(&self, client: &str, hits: u64) -> Result<(), RedisError> {
        match self {
            Limiter::InProcess(_) => {
                self.refund_now(client, hits);
                Ok(())
            }
            Limiter::Redis { limiter, plan } => limiter.refund(client, plan, hits).await.map(drop),
        }
    }

    /// In process: what one permit for `client` would get now from each of the descriptor's
    /// limits, taking nothing, and whether a taking would move one of its windows forward (a
    /// write that an undo cannot take back once another decision lands on it: see
    /// `SeveralLimits::acquire`). `None` for a limiter on Redis.
    pub(crate) fn peek_now(&self, client: &str) -> Option<(Vec<Decision>, bool)> {
        match self {
            Limiter::InProcess(service) => Some(
                service
                    .peek_each_limit_and_roll(client, &DescriptorPlan)
                    .expect("the service has its one plan"),
            ),
            Limiter::Redis { .. } => None,
        }
    }

    /// Takes `hits` for `client`.
    pub(crate) async fn acquire(&self, client: &str, hits: u64) -> Result<Outcome, RedisError> {
        match self {
            Limiter::InProcess(_) => Ok(self
                .acquire_now(client, hits)
                .expect("an in-process limiter decides now")),
            Limiter::Redis { limiter, plan } => Ok(outcome_of_answer(
                &limiter.decide(client, plan, hits).await?,
            )),
        }
    }

    /// Takes `hits` for `client`, as [`Limiter::acquire`], with the grant to give back should
    /// another descriptor of the request refuse (none where nothing was taken, and none for the
    /// in-process sliding log, which cannot undo one).
    pub(crate) async fn reserve(
        &self,
        client: &str,
        hits: u64,
    ) -> Result<(Outcome, Option<Taken>), RedisError> {
        match self {
            Limiter::InProcess(_) => {
                let (outcome, grant) = self
                    .reserve_now(client, hits)
                    .expect("an in-process limiter decides now");
                Ok((outcome, grant.map(Taken::InProcess)))
            }
            Limiter::Redis { limiter, plan } => {
                let (answer, grant) = limiter.reserve(client, plan, hits).await?;
                Ok((outcome_of_answer(&answer), grant.map(Taken::Redis)))
            }
        }
    }

    /// Gives back `taken`, made by [`Limiter::reserve`] for `client` (see
    /// `RateLimiterService::give_back` and `RedisRateLimiter::give_back` for what each
    /// restores). A failed round trip keeps the grant.
    pub(crate) async fn give_back(&self, client: &str, taken: &Taken) -> Result<(), RedisError> {
        match (self, taken) {
            (Limiter::InProcess(_), Taken::InProcess(grant)) => {
                self.give_back_now(client, grant);
                Ok(())
            }
            (Limiter::Redis { limiter, plan }, Taken::Redis(grant)) => {
                limiter.give_back(client, plan, grant).await.map(drop)
            }
            // A grant is given back by the limiter that made it.
            _ => Ok(()),
        }
    }

    /// What one permit for `client` would get now from each of the descriptor's limits,
    /// taking nothing, and whether their `remaining` counts what is left (not so for a grant by
    /// a failure policy).
    pub(crate) async fn peek(&self, client: &str) -> Result<(Vec<Decision>, bool), RedisError> {
        match self {
            Limiter::InProcess(_) => Ok((
                self.peek_now(client)
                    .expect("an in-process limiter decides now")
                    .0,
                true,
            )),
            Limiter::Redis { limiter, plan } => {
                let answer = limiter.peek_answer(client, plan).await?;
                let each = if answer.each_limit().is_empty() {
                    vec![answer.decision()]
                } else {
                    answer.each_limit().to_vec()
                };
                Ok((each, answer.source() != Source::FailOpen))
            }
        }
    }
}

fn outcome_of_answer(answer: &crate::redis::Answer) -> Outcome {
    let decision = answer.decision();
    let figures = if answer.each_limit().is_empty() {
        std::iter::once(LimitFigures::of(&decision)).collect()
    } else {
        answer.each_limit().iter().map(LimitFigures::of).collect()
    };
    Outcome { decision, figures }
}

fn outcome_of(reported: &Reported) -> Outcome {
    Outcome {
        decision: *reported.decision(),
        figures: reported.with_limits(|each| each.iter().copied().collect()),
    }
}
