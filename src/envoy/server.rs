//! [`RateLimitServer`]: `ShouldRateLimit` answered on the running configuration.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use futures_util::future::{join_all, try_join_all};
use tonic::{Request, Response, Status};

use super::BuildError;
use super::config::{RlsConfig, Unit, UnitLimit};
use super::engine::{self, Enforced, NodeLimit, Outcome, Snapshot, StateStore, Taken};
use super::metrics::{self, Counted};
use super::overrides::{self, OverrideError, Overrides};
use crate::headers::{LimitFigures, RateLimitFields};
use crate::service::Grant;
use crate::{Algorithm, Decision};

/// Envoy's rate-limit service on tollgate's methods.
///
/// Cheap to clone: clones share the running configuration and the limits' state. Serve it
/// with [`RateLimitServer::into_service`] on a tonic server; change its configuration with
/// [`RateLimitServer::reload`] while it serves.
#[derive(Clone)]
pub struct RateLimitServer {
    inner: Arc<Inner>,
}

struct Inner {
    current: ArcSwap<Snapshot>,
    store: StateStore,
    /// Reloads one at a time, so that each keeps what the one before it made.
    reloading: tokio::sync::Mutex<()>,
    requests: metrics::RequestMetrics,
    /// The limiters of the limits that requests' descriptors bring, kept across reloads.
    overrides: Overrides,
}

impl std::fmt::Debug for RateLimitServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitServer")
            .field("store", &self.inner.store)
            .finish_non_exhaustive()
    }
}

/// One matched, limited descriptor of a request.
struct Matched<'a> {
    index: usize,
    limit: &'a NodeLimit,
    shadow_mode: bool,
    client: String,
    hits: u64,
    /// The permits the whole request asks of this limit and client: `hits`, plus those of every
    /// other descriptor of the request that reaches the same limit with the same values (Envoy
    /// sends the same descriptor twice when two of a route's rate limits make it).
    asked: u64,
}

/// What a descriptor's decision came to.
// The large variant is the usual one, its figures inline so that a decision allocates none:
// boxing it would put one allocation back per descriptor.
#[allow(clippy::large_enum_variant)]
enum Result_ {
    /// Granted (or, shadowed, let through) with these figures; `taken` whether permits were
    /// taken.
    Decided {
        outcome: Outcome,
        over: bool,
        taken: bool,
        /// When the refused request could pass, if it ever can.
        retry_after: Option<Duration>,
    },
    /// `requests_per_unit: 0`: over whenever the request asks anything of it.
    Blocked { unit: Unit, over: bool },
    /// Unlimited.
    Unlimited,
    /// Not decided: an earlier descriptor refused the request.
    Skipped,
}

impl RateLimitServer {
    /// The most descriptors one request may have (a route's rate limits make a handful): the
    /// work of a request grows with the square of its descriptors, which a bound keeps small.
    pub const MAX_DESCRIPTORS: usize = 256;

    /// The most distinct limits that requests' descriptors may bring (`RateLimitDescriptor.limit`)
    /// over the service's life, over all domains and methods: each gets a limiter of its own (in
    /// process, of the store's `clients`), and a route's actions bring a handful. A request
    /// bringing one more is answered `RESOURCE_EXHAUSTED`.
    pub const MAX_BROUGHT_LIMITS: usize = 64;

    /// A service answering by `config`, its state kept in `store`.
    ///
    /// # Errors
    ///
    /// [`BuildError`] when a descriptor's limits cannot be enforced (a limit out of the method's
    /// bounds), when the Redis store's settings cannot make a limiter (its URL, a timeout of 0,
    /// a local share out of (0, 1]), or when Redis cannot be reached to load the scripts.
    pub async fn new(config: &RlsConfig, store: StateStore) -> Result<Self, BuildError> {
        let snapshot = Snapshot::build(config, &store, None).await?;
        let overrides = Overrides::new(store.clone()).map_err(BuildError::Redis)?;
        Ok(RateLimitServer {
            inner: Arc::new(Inner {
                current: ArcSwap::from_pointee(snapshot),
                store: store.clone(),
                reloading: tokio::sync::Mutex::new(()),
                requests: metrics::RequestMetrics::register(),
                overrides,
            }),
        })
    }

    /// Answers by `config` from now on. Every descriptor whose domain, path, method and limits
    /// are unchanged keeps its clients' state (in process: the same limiter; on Redis: the same
    /// keys); a changed or new one starts afresh. Requests being decided finish on the
    /// configuration they started with.
    ///
    /// # Errors
    ///
    /// As [`RateLimitServer::new`]; the configuration in use then stays.
    pub async fn reload(&self, config: &RlsConfig) -> Result<(), BuildError> {
        let _one_at_a_time = self.inner.reloading.lock().await;
        let previous = self.inner.current.load_full();
        let result = Snapshot::build(config, &self.inner.store, Some(&previous)).await;
        metrics::record_reload(result.is_ok());
        self.inner.current.store(Arc::new(result?));
        Ok(())
    }

    /// The limiter of each limit that `request`'s descriptors bring, in order, made now where
    /// none was. A refund takes no room: it uses the limit's limiter if one was made, else on
    /// Redis one for this request alone (another instance may have charged the shared state),
    /// and in process none (`None`: nothing to give back). Every brought limit is read before
    /// any limiter is made, and the missing ones are made all or none: a request refused here
    /// takes no room among [`RateLimitServer::MAX_BROUGHT_LIMITS`].
    fn brought_limits(
        &self,
        request: &RateLimitRequest,
        method: Algorithm,
    ) -> Result<Vec<Option<Arc<NodeLimit>>>, Status> {
        // (descriptor index, limit, whether it is taken from: not a refund)
        let mut brought = Vec::new();
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            let Some(limit) = &descriptor.limit else {
                continue;
            };
            let limit = overrides::brought_limit(limit)
                .map_err(|why| Status::invalid_argument(format!("descriptor {index}: {why}")))?;
            brought.push((index, limit, !descriptor.is_negative_hits));
        }
        if brought.is_empty() {
            return Ok(Vec::new());
        }
        let needed: Vec<UnitLimit> = brought
            .iter()
            .filter(|(_, _, needed)| *needed)
            .map(|(_, limit, _)| *limit)
            .collect();
        let overrides = &self.inner.overrides;
        let made = overrides
            .get_or_make_all(
                &request.domain,
                method,
                &needed,
                RateLimitServer::MAX_BROUGHT_LIMITS,
            )
            .map_err(|(at, error)| {
                let (index, limit, _) = brought
                    .iter()
                    .filter(|(_, _, needed)| *needed)
                    .nth(at)
                    .copied()
                    .expect("the position of one of the limits asked");
                match error {
                    OverrideError::Full => Status::resource_exhausted(format!(
                        "descriptor {index}: its limit ({} per {}) would be one more than the {} \
                         distinct limits requests may bring (RateLimitServer::MAX_BROUGHT_LIMITS)",
                        limit.requests_per_unit,
                        limit.unit.name(),
                        RateLimitServer::MAX_BROUGHT_LIMITS
                    )),
                    OverrideError::Unenforceable(why) => Status::invalid_argument(format!(
                        "descriptor {index}: its limit ({} per {}) cannot be enforced by the \
                         domain's method: {why}",
                        limit.requests_per_unit,
                        limit.unit.name()
                    )),
                }
            })?;
        let mut made = made.into_iter();
        Ok(brought
            .iter()
            .map(|(_, limit, needed)| {
                if *needed {
                    made.next()
                } else {
                    overrides.for_one_refund(&request.domain, method, *limit)
                }
            })
            .collect())
    }

    /// This service, for a tonic server.
    pub fn into_service(self) -> RateLimitServiceServer<RateLimitServer> {
        RateLimitServiceServer::new(self)
    }

    /// Decides one request (what [`RateLimitService::should_rate_limit`] answers).
    ///
    /// Each descriptor is matched against the request's domain as envoyproxy/ratelimit matches
    /// it. Its permits are its own `hits_addend` when set, else the request's, where 0 means 1.
    /// A descriptor with `is_negative_hits` is a refund, answered OK: in process, its permits
    /// are given back to its client's state by each method's own rule, never past what the
    /// limit still counts (the token bucket moves back to full at most, the windows take them
    /// off the current window's count; the sliding log, whose slots record admissions, and a
    /// client the service does not hold get nothing); on Redis, by the same rules, in one round
    /// trip made before the request's decision (see `RedisRateLimiter::refund`). A refund of a
    /// brought limit takes no room among [`RateLimitServer::MAX_BROUGHT_LIMITS`] (on Redis, an
    /// instance that made no limiter for it refunds through one made for that request alone),
    /// and one of a limit the method cannot enforce gives nothing (nothing could take from it).
    ///
    /// A request is decided **all or nothing**: when any of its descriptors is over its limit,
    /// none is charged (envoyproxy/ratelimit charges every descriptor, so refused traffic spends
    /// the quotas of the others). A request of one limited descriptor is one decision; one of
    /// several first looks at each limit, taking nothing, and is refused at once if any would
    /// refuse; else it takes from each. When another request takes the last permits of a limit
    /// between that look and the taking, the request is refused there:
    ///
    /// - in process, every grant it made before is given back to the very state it was made on
    ///   (a client evicted or a rule changed meanwhile took it away already; in a descriptor's
    ///   fixed table, any eviction there since the taking keeps the grant, since the slot's
    ///   next holdings could not all be told apart from the client's own), exactly while no
    ///   other decision has landed on that state since, and otherwise as far as the method can
    ///   without leaving the limit more generous than had the grant not been made: the fixed
    ///   window and the sliding window counter take the permits off the window they were
    ///   counted in, the token bucket keeps them (they refill at its rate). The sliding log
    ///   cannot give back: its descriptors are taken last, so only a request with two of them
    ///   can keep a grant of the first.
    /// - on Redis, the takings are made together (their round trips overlap), each reading
    ///   its keys' values before and after its grant, and every grant is given back: exactly
    ///   while no other decision has landed on its keys since (their values from before are
    ///   restored, with their expiry), and otherwise as in process (the windows take the
    ///   permits off the window they were counted in; the token bucket and the sliding log
    ///   keep them). A give-back whose round trip fails may keep its grant. A taking whose
    ///   round trip fails (under `FailurePolicy::Error`) fails the request, and the others'
    ///   grants are given back.
    ///
    /// No limit ever grants more than it allows.
    ///
    /// # Errors
    ///
    /// `INVALID_ARGUMENT` for a request without a domain or descriptors, or with more than
    /// [`RateLimitServer::MAX_DESCRIPTORS`], or a descriptor that brings a limit whose unit is
    /// not a unit, or takes from a limit that the domain's method cannot enforce (the message
    /// names the descriptor and why); `RESOURCE_EXHAUSTED` for a request taking from a limit
    /// past [`RateLimitServer::MAX_BROUGHT_LIMITS`] (checked before whether its new limits can
    /// be enforced); `UNAVAILABLE` when a
    /// Redis round trip fails under [`FailurePolicy::Error`](crate::redis::FailurePolicy)
    /// (Envoy then applies its `failure_mode_deny`). A request answered with an error is charged
    /// to none of its descriptors (and so, under Envoy's default `failure_mode_deny: false`,
    /// passes uncounted).
    pub async fn decide(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        let started = Instant::now();
        let answer = self.decide_inner(request).await;
        let over = match &answer {
            Ok(response) => Some(response.overall_code == Code::OverLimit as i32),
            Err(_) => None,
        };
        self.inner
            .requests
            .record(over, started.elapsed().as_secs_f64());
        answer
    }

    async fn decide_inner(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        if request.domain.is_empty() {
            return Err(Status::invalid_argument("the request's domain is empty"));
        }
        if request.descriptors.is_empty() {
            return Err(Status::invalid_argument("the request has no descriptors"));
        }
        if request.descriptors.len() > RateLimitServer::MAX_DESCRIPTORS {
            return Err(Status::invalid_argument(format!(
                "the request has {} descriptors, more than the {} one request may have",
                request.descriptors.len(),
                RateLimitServer::MAX_DESCRIPTORS
            )));
        }
        let snapshot = self.inner.current.load_full();
        let mut statuses = vec![ok_status(); request.descriptors.len()];
        let Some(domain) = snapshot.domain(&request.domain) else {
            // An unknown domain limits nothing, as envoyproxy/ratelimit answers.
            return Ok(response(Code::Ok, statuses, Vec::new()));
        };
        let brought = self.brought_limits(request, domain.method)?;
        let mut brought = brought.iter();

        let mut matched = Vec::with_capacity(request.descriptors.len());
        // Refunds on Redis, made together before the decision (in process, at once).
        let mut remote_refunds = Vec::new();
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            // A limit the descriptor brings applies in place of the configured one, matched or
            // not, never shadowed, its client all of the entries.
            let (limit, shadow_mode, client) = if descriptor.limit.is_some() {
                let Some(limit) = brought.next().and_then(Option::as_deref) else {
                    continue;
                };
                (
                    limit,
                    false,
                    engine::brought_client_key(&descriptor.entries),
                )
            } else {
                let Some(node) = engine::find(&domain.nodes, &descriptor.entries) else {
                    continue;
                };
                let Some(limit) = &node.limit else {
                    continue;
                };
                (
                    limit,
                    node.shadow_mode,
                    engine::client_key(&descriptor.entries),
                )
            };
            if descriptor.is_negative_hits {
                // A refund: answered OK, whatever the request's other descriptors get.
                if let Enforced::Limited { limiter, .. } = &limit.enforced {
                    let hits = engine::hits_of(descriptor, request.hits_addend);
                    if limit.is_remote() {
                        remote_refunds.push(async move {
                            // A refund whose round trip fails gives nothing back; the request
                            // is answered as ever.
                            let _given = limiter.refund(&client, hits).await;
                        });
                    } else {
                        limiter.refund_now(&client, hits);
                    }
                }
                continue;
            }
            matched.push(Matched {
                index,
                limit,
                shadow_mode,
                client,
                hits: engine::hits_of(descriptor, request.hits_addend),
                asked: 0,
            });
        }
        if !remote_refunds.is_empty() {
            join_all(remote_refunds).await;
        }
        // A matched limit that another matched limit replaces is not applied.
        let replaced: Vec<&str> = matched
            .iter()
            .flat_map(|m| m.limit.replaces.iter().map(String::as_str))
            .collect();
        matched.retain(|m| {
            m.limit
                .name
                .as_deref()
                .is_none_or(|name| !replaced.contains(&name))
        });

        for at in 0..matched.len() {
            let this = &matched[at];
            let asked = matched
                .iter()
                .filter(|other| {
                    std::ptr::eq(other.limit, this.limit) && other.client == this.client
                })
                .fold(0, |sum: u64, other| sum.saturating_add(other.hits));
            matched[at].asked = asked;
        }

        let limited = matched
            .iter()
            .filter(|m| matches!(m.limit.enforced, Enforced::Limited { .. }))
            .count();
        let blocked = matched
            .iter()
            .any(|m| !m.shadow_mode && matches!(m.limit.enforced, Enforced::Blocked(_)));
        // A request of several descriptors (or one limited by a limit of 0) is looked at
        // first: if some limit would refuse it, it takes nothing from any.
        let look_first = blocked || limited > 1;
        let (results, refused) = if matched.iter().any(|m| m.limit.is_remote()) {
            // Boxed: the round trips' future stays out of the in-process decision's.
            Box::pin(decide_remotely(&matched, look_first))
                .await
                .map_err(unavailable)?
        } else {
            decide_in_process(&matched, look_first)
        };

        // Sized for a few descriptors' items, so that writing them does not grow the strings.
        let mut policy = String::with_capacity(128);
        let mut state = String::with_capacity(128);
        let mut retry_after = Duration::ZERO;
        // A refusing descriptor that no later request passes: the request gets no Retry-After.
        let mut never = false;
        for (m, result) in matched.iter().zip(&results) {
            let entries = &request.descriptors[m.index].entries;
            let status = &mut statuses[m.index];
            match result {
                Result_::Unlimited | Result_::Skipped => {}
                Result_::Blocked { unit, over } => {
                    never |= *over && !m.shadow_mode;
                    m.limit
                        .metrics
                        .record(entries, m.hits, counted(m, *over, None));
                    *status = DescriptorStatus {
                        code: code_of(*over && !m.shadow_mode) as i32,
                        current_limit: Some(rate_limit(m.limit, 0, *unit)),
                        limit_remaining: 0,
                        duration_until_reset: Some(proto_duration(unit.duration())),
                        quota: None,
                    };
                }
                Result_::Decided {
                    outcome,
                    over,
                    taken,
                    retry_after: wait,
                } => {
                    let decision = &outcome.decision;
                    if *taken || *over {
                        m.limit
                            .metrics
                            .record(entries, m.hits, counted(m, *over, Some(decision)));
                    }
                    let refusing = *over && !m.shadow_mode;
                    if refusing {
                        match wait {
                            Some(wait) => retry_after = retry_after.max(*wait),
                            None => never = true,
                        }
                    }
                    *status = DescriptorStatus {
                        code: code_of(refusing) as i32,
                        current_limit: Some(current_limit(m.limit, decision)),
                        limit_remaining: u32::try_from(decision.remaining()).unwrap_or(u32::MAX),
                        duration_until_reset: Some(proto_duration(decision.reset_after())),
                        quota: None,
                    };
                    if !m.shadow_mode {
                        let prepared = m.limit.fields.as_ref().is_some_and(|fields| {
                            fields.append(&mut policy, &mut state, &outcome.figures)
                        });
                        if !prepared {
                            append_fields(
                                &mut policy,
                                &mut state,
                                &m.limit.policy,
                                &outcome.figures,
                            );
                        }
                    }
                }
            }
        }
        let mut headers = Vec::with_capacity(3);
        if !policy.is_empty() {
            headers.push(header("ratelimit-policy", policy));
            headers.push(header("ratelimit", state));
        }
        if refused && !never && !retry_after.is_zero() {
            headers.push(header(
                "retry-after",
                retry_after
                    .as_nanos()
                    .div_ceil(1_000_000_000)
                    .max(1)
                    .to_string(),
            ));
        }
        Ok(response(code_of(refused), statuses, headers))
    }
}

#[tonic::async_trait]
impl RateLimitService for RateLimitServer {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.decide(request.get_ref()).await.map(Response::new)
    }
}

/// Decides `matched` in process, where every limiter decides now: looks first when
/// `look_first`, then, unless a look refused, takes from each in turn. A taking refused after
/// all (another request took the last permits between the look and the taking) stops the
/// request, and every grant made before it is given back, so that the refused request is
/// charged nothing.
///
/// The takings that can be given back exactly come first, then those that move a window
/// forward (a grant that rolled a window is undone exactly only while no other decision has
/// landed on it; taken last, it is followed only by others of its kind, and a window's roll
/// always grants), then the sliding log's, which cannot be undone (a request with two of them
/// keeps the first's grant when the second is refused after its look; see
/// `RateLimitServer::decide`).
fn decide_in_process(matched: &[Matched<'_>], look_first: bool) -> (Vec<Result_>, bool) {
    let mut looks = Vec::new();
    let mut order = Vec::new();
    if look_first {
        looks.reserve_exact(matched.len());
        order.reserve_exact(matched.len());
    }
    if look_first {
        for (at, m) in matched.iter().enumerate() {
            let (look, when) = look_now(m);
            looks.push(look);
            order.push((when, at));
        }
        if refuses(matched, &looks) {
            return (looks, true);
        }
    }
    if let [only] = matched {
        // Nothing to give back to: one decision.
        let result = take_now(only);
        let refused = refuses(matched, std::slice::from_ref(&result));
        return (vec![result], refused);
    }
    if order.is_empty() {
        // Not looked at: at most one descriptor takes, so nothing is given back.
        order = (0..matched.len())
            .map(|at| (TakeOrder::default(), at))
            .collect();
    }
    order.sort_unstable();
    // Each descriptor reports its look until it is taken (one not taken after a refusal reports
    // its look, as a refusal at the look does); one not looked at (a request of one taking)
    // reports nothing until then.
    let mut results = looks;
    if results.is_empty() {
        results = matched.iter().map(|_| Result_::Skipped).collect();
    }
    // The grants made, each with the look its taking replaced.
    let mut grants = Vec::with_capacity(matched.len());
    let mut refused = false;
    for (_, at) in order {
        let m = &matched[at];
        let (result, grant) = reserve_now(m);
        let refusing = !m.shadow_mode && is_over(&result);
        let look = std::mem::replace(&mut results[at], result);
        if refusing {
            refused = true;
            // Every grant of the request given back, the latest first (two grants on one state,
            // from a descriptor sent twice, are then each restored exactly): each such
            // descriptor reports its look again.
            for (given, grant, look) in grants.drain(..).rev() {
                give_back_now(&matched[given], &grant);
                results[given] = look;
            }
            break;
        }
        if let Some(grant) = grant {
            grants.push((at, grant, look));
        }
    }
    (results, refused)
}

/// When a descriptor is taken among its request's (the lesser first): by what a give-back can
/// do for it, then by how close its look found it to refusing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
struct TakeOrder {
    /// 0 for a descriptor whose grant can be given back exactly, 1 for one whose taking would
    /// move a window forward, 2 for the sliding log's, which cannot be given back.
    undo: u8,
    /// The fewest permits any of its limits would have left after the taking: the descriptor
    /// most likely to be refused by a racing request is taken first, before any grant that
    /// its refusal would have to give back.
    slack: u64,
}

/// Takes `m`'s permits, in process, with the grant to give back (see `Limiter::reserve_now`).
fn reserve_now(m: &Matched<'_>) -> (Result_, Option<Grant>) {
    match &m.limit.enforced {
        Enforced::Limited { limiter, .. } => match limiter.reserve_now(&m.client, m.hits) {
            Some((outcome, grant)) => (taken(outcome), grant),
            // Not reached, as in `look_now`.
            None => (Result_::Unlimited, None),
        },
        _ => (without_limiter(m), None),
    }
}

/// Gives back `grant`, made by `reserve_now(m)`.
fn give_back_now(m: &Matched<'_>, grant: &Grant) {
    if let Enforced::Limited { limiter, .. } = &m.limit.enforced {
        limiter.give_back_now(&m.client, grant);
    }
}

/// Decides `matched` when some limiter is on Redis: the looks, then the takings, each set
/// together, so that their round trips overlap. A taking refused after all (another request
/// took the last permits between the look and the taking) refuses the request, and every grant
/// the other takings made is given back (see `RedisRateLimiter::give_back`: exactly while no
/// other decision has landed on the grant's keys), each descriptor then reporting its look.
async fn decide_remotely(
    matched: &[Matched<'_>],
    look_first: bool,
) -> Result<(Vec<Result_>, bool), crate::redis::RedisError> {
    if !look_first {
        // At most one descriptor takes: nothing to give back.
        let takings = try_join_all(matched.iter().map(take)).await?;
        let refused = refuses(matched, &takings);
        return Ok((takings, refused));
    }
    let mut results = try_join_all(matched.iter().map(look)).await?;
    if refuses(matched, &results) {
        return Ok((results, true));
    }
    let mut takings = Vec::with_capacity(matched.len());
    let mut failed = None;
    for taking in join_all(matched.iter().map(reserve)).await {
        match taking {
            Ok(taking) => takings.push(taking),
            Err(error) => {
                failed.get_or_insert(error);
                takings.push((Result_::Skipped, None));
            }
        }
    }
    if let Some(error) = failed {
        // The request fails (`UNAVAILABLE`): what its other takings granted is given back.
        let grants = takings
            .into_iter()
            .enumerate()
            .filter_map(|(at, (_, grant))| grant.map(|grant| (at, grant)))
            .collect();
        give_back_latest_first(matched, grants).await;
        return Err(error);
    }
    let refused = matched
        .iter()
        .zip(&takings)
        .any(|(m, (result, _))| !m.shadow_mode && is_over(result));
    let mut grants = Vec::new();
    for (at, (result, grant)) in takings.into_iter().enumerate() {
        match grant {
            Some(grant) if refused => grants.push((at, grant)),
            // Taken and kept, or refused: the taking's figures.
            _ => results[at] = result,
        }
    }
    if refused {
        give_back_latest_first(matched, grants).await;
    }
    Ok((results, refused))
}

/// Gives back every grant of `grants`, each made for `matched[at]`, one after the other, each
/// one before any it was made after (two takings of one descriptor sent twice are each restored
/// exactly; takings run together, so their order is read from the grants). A failed give-back
/// keeps its grant: the request is refused either way.
async fn give_back_latest_first(matched: &[Matched<'_>], mut grants: Vec<(usize, Taken)>) {
    let same_state = |a: usize, b: usize| {
        std::ptr::eq(matched[a].limit, matched[b].limit) && matched[a].client == matched[b].client
    };
    // In process, takings were made in the order of `matched`: the latest is the last.
    grants.reverse();
    while !grants.is_empty() {
        let next = (0..grants.len())
            .find(|&i| {
                let (at, Taken::Redis(grant)) = &grants[i] else {
                    return true;
                };
                !grants.iter().any(|(other_at, other)| {
                    matches!(other, Taken::Redis(later) if same_state(*at, *other_at) && later.follows(grant))
                })
            })
            // Unreachable (a grant cannot follow itself or close a cycle); in order then.
            .unwrap_or(0);
        let (at, grant) = grants.remove(next);
        let m = &matched[at];
        if let Enforced::Limited { limiter, .. } = &m.limit.enforced {
            let _kept_on_failure = limiter.give_back(&m.client, &grant).await;
        }
    }
}

/// Takes `m`'s permits, with the grant to give back (see `Limiter::reserve`).
async fn reserve(m: &Matched<'_>) -> Result<(Result_, Option<Taken>), crate::redis::RedisError> {
    Ok(match &m.limit.enforced {
        Enforced::Limited { limiter, .. } => {
            let (outcome, grant) = limiter.reserve(&m.client, m.hits).await?;
            (taken(outcome), grant)
        }
        _ => (without_limiter(m), None),
    })
}

/// The answer of a descriptor that has no limiter: unlimited, or blocked (over whenever the
/// request asks anything of it); the same for a look and a taking.
fn without_limiter(m: &Matched<'_>) -> Result_ {
    match &m.limit.enforced {
        Enforced::Blocked(unit) => Result_::Blocked {
            unit: *unit,
            over: m.asked > 0,
        },
        _ => Result_::Unlimited,
    }
}

/// What `m` would get now, taking nothing, in process; and when to take it.
fn look_now(m: &Matched<'_>) -> (Result_, TakeOrder) {
    match &m.limit.enforced {
        Enforced::Limited {
            limiter, method, ..
        } => match limiter.peek_now(&m.client) {
            Some((each, rolls)) => {
                let undo = match method {
                    Algorithm::SlidingWindowLog => 2,
                    _ => u8::from(rolls),
                };
                let slack = each
                    .iter()
                    .map(|decision| decision.remaining().saturating_sub(m.asked))
                    .min()
                    .unwrap_or(0);
                (looked(m, each, true), TakeOrder { undo, slack })
            }
            // Not reached: a request is decided here only when every limiter is in process.
            None => (Result_::Unlimited, TakeOrder::default()),
        },
        _ => (without_limiter(m), TakeOrder::default()),
    }
}

/// Takes `m`'s permits, in process.
fn take_now(m: &Matched<'_>) -> Result_ {
    match &m.limit.enforced {
        Enforced::Limited { limiter, .. } => match limiter.acquire_now(&m.client, m.hits) {
            Some(outcome) => taken(outcome),
            // Not reached, as in `look_now`.
            None => Result_::Unlimited,
        },
        _ => without_limiter(m),
    }
}

/// What `m` would get now, taking nothing.
async fn look(m: &Matched<'_>) -> Result<Result_, crate::redis::RedisError> {
    Ok(match &m.limit.enforced {
        Enforced::Limited { limiter, .. } => {
            let (each, counted) = limiter.peek(&m.client).await?;
            looked(m, each, counted)
        }
        _ => without_limiter(m),
    })
}

/// Takes `m`'s permits.
async fn take(m: &Matched<'_>) -> Result<Result_, crate::redis::RedisError> {
    Ok(match &m.limit.enforced {
        Enforced::Limited { limiter, .. } => taken(limiter.acquire(&m.client, m.hits).await?),
        _ => without_limiter(m),
    })
}

/// A look's answer, from what one permit would get from each of the descriptor's limits
/// (`each`, at least one), whose `remaining` counts what is left when `counted` (a failure
/// policy's grant says nothing of what is left).
fn looked(m: &Matched<'_>, each: Vec<Decision>, counted: bool) -> Result_ {
    let asked = m.asked;
    // A limit refuses the request if it refuses one permit, or has less left than asked.
    let refuses =
        |decision: &Decision| decision.is_denied() || (counted && asked > decision.remaining());
    let over = asked > 0 && each.iter().any(refuses);
    // Never early: a refusing limit's own wait for one permit; for more, the wait until it is
    // whole again. None when some limit is smaller than what is asked: it never passes.
    let never = each.iter().any(|decision| asked > decision.limit());
    let wait = |decision: &Decision| {
        if asked <= 1 {
            decision.retry_after()
        } else {
            decision.retry_after().max(decision.reset_after())
        }
    };
    let retry_after = each.iter().filter(|d| refuses(d)).map(wait).max();
    // The descriptor's status reports the limit that refuses longest, else the one with the
    // fewest permits left.
    let reported = each
        .iter()
        .filter(|d| refuses(d))
        .max_by_key(|d| wait(d))
        .or_else(|| each.iter().min_by_key(|d| d.remaining()))
        .copied();
    let figures = each.iter().map(LimitFigures::of).collect();
    match reported {
        Some(decision) => Result_::Decided {
            outcome: Outcome { decision, figures },
            over,
            taken: false,
            retry_after: if over && !never { retry_after } else { None },
        },
        // A limiter answers for each of its limits, at least one.
        None => Result_::Unlimited,
    }
}

/// A taking's answer.
fn taken(outcome: Outcome) -> Result_ {
    let over = outcome.decision.is_denied();
    let wait = outcome.decision.retry_after();
    Result_::Decided {
        outcome,
        over,
        taken: !over,
        retry_after: (over && wait != Duration::MAX).then_some(wait),
    }
}

/// Whether any descriptor that is not shadowed refuses.
fn refuses(matched: &[Matched<'_>], results: &[Result_]) -> bool {
    matched
        .iter()
        .zip(results)
        .any(|(m, result)| !m.shadow_mode && is_over(result))
}

fn is_over(result: &Result_) -> bool {
    match result {
        Result_::Unlimited | Result_::Skipped => false,
        Result_::Blocked { over, .. } | Result_::Decided { over, .. } => *over,
    }
}

fn counted(m: &Matched<'_>, over: bool, decision: Option<&Decision>) -> Counted {
    match (over, m.shadow_mode, decision) {
        (true, true, _) => Counted::Shadowed,
        (true, false, _) => Counted::OverLimit,
        (false, _, Some(decision)) => Counted::Within {
            remaining: decision.remaining(),
            limit: decision.limit(),
        },
        (false, _, None) => Counted::Within {
            remaining: 0,
            limit: 0,
        },
    }
}

fn unavailable(error: crate::redis::RedisError) -> Status {
    Status::unavailable(format!("the rate-limit state is unavailable: {error}"))
}

fn code_of(over: bool) -> Code {
    if over { Code::OverLimit } else { Code::Ok }
}

fn ok_status() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        ..DescriptorStatus::default()
    }
}

fn response(
    code: Code,
    statuses: Vec<DescriptorStatus>,
    headers: Vec<HeaderValue>,
) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code as i32,
        statuses,
        response_headers_to_add: headers,
        ..RateLimitResponse::default()
    }
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
        ..HeaderValue::default()
    }
}

/// The limit that made `decision`: among the descriptor's, the one of its limit and window.
fn current_limit(limit: &NodeLimit, decision: &Decision) -> RateLimit {
    let unit_limit = match &limit.enforced {
        Enforced::Limited { limits, .. } => limits
            .iter()
            .find(|l| {
                l.requests_per_unit == decision.limit() && l.unit.duration() == decision.window()
            })
            .or(limits.first())
            .copied(),
        _ => None,
    };
    let UnitLimit {
        unit,
        requests_per_unit,
    } = unit_limit.unwrap_or(UnitLimit {
        unit: Unit::Second,
        requests_per_unit: decision.limit(),
    });
    rate_limit(limit, requests_per_unit, unit)
}

fn rate_limit(limit: &NodeLimit, requests_per_unit: u64, unit: Unit) -> RateLimit {
    RateLimit {
        name: limit.name.clone().unwrap_or_default(),
        requests_per_unit: u32::try_from(requests_per_unit).unwrap_or(u32::MAX),
        unit: proto_unit(unit) as i32,
    }
}

fn proto_unit(unit: Unit) -> rate_limit::Unit {
    match unit {
        Unit::Second => rate_limit::Unit::Second,
        Unit::Minute => rate_limit::Unit::Minute,
        Unit::Hour => rate_limit::Unit::Hour,
        Unit::Day => rate_limit::Unit::Day,
        Unit::Week => rate_limit::Unit::Week,
        Unit::Month => rate_limit::Unit::Month,
        Unit::Year => rate_limit::Unit::Year,
    }
}

fn proto_duration(duration: Duration) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(duration.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(duration.subsec_nanos()).unwrap_or(0),
    }
}

/// Appends one descriptor's items to the `RateLimit-Policy` and `RateLimit` values.
fn append_fields(policy: &mut String, state: &mut String, name: &str, figures: &[LimitFigures]) {
    // The name was made printable when the configuration was made ready.
    let Ok(fields) = RateLimitFields::new(name, figures) else {
        return;
    };
    if !policy.is_empty() {
        policy.push_str(", ");
        state.push_str(", ");
    }
    let _ = fields.write_policy(policy);
    let _ = fields.write_state(state);
}
