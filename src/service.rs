//! [`RateLimiterService`]: one limiter per client, made on the client's first request.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash, RandomState};

use papaya::ResizeMode;

use crate::client_state::{ClientParams, ClientState};
use crate::clock::Clock;
use crate::error::ServiceError;
use crate::plan_table::{MAX_PLANS, PlanTable, PlanVersion};
use crate::{Algorithm, Decision, MonotonicClock, PlanStats, Rule};

/// One client's entry in the map: which plan (and version of its rule) the state follows, and
/// the state.
#[derive(Debug)]
struct ClientEntry {
    plan: PlanVersion,
    state: ClientState,
}

/// How many times one request replaces a client's entry that follows another plan before it
/// settles for the entry as it is. Only requests that name different plans for one client at
/// the same moment get there.
const MAX_PLAN_CONFLICTS: u32 = 4;

/// Rate limits many clients, each by the rule of its plan.
///
/// The service owns one limiter per client, made on the client's first request (exactly one,
/// even when first requests race), with the method the service was built for and the rule of the
/// plan the request names. Clients are kept in a lock-free [`papaya::HashMap`]; a request for a
/// known client is a lookup and the limiter's own lock-free decision.
///
/// - `K`: the client key (an IP address, an API key...). Requests look it up by any borrowed form
///   (`&str` for `String` keys) without copying; the key is copied once, on the first request.
/// - `P`: the plan, the user's own type (an enum like `Tier { Free, Pro }`). Plans are found by
///   equality among the service's few plans.
/// - `C`: the clock, shared by every client so that all agree on window alignment.
/// - `S`: the hasher. The default is randomly seeded, so clients cannot pick keys that collide
///   (client keys are attacker-controlled input in a proxy).
///
/// # Examples
///
/// ```
/// use tollgate::{Algorithm, FakeClock, RateLimiterService, Rule};
///
/// #[derive(Debug, PartialEq, Eq)]
/// enum Tier { Free, Pro }
///
/// let service = RateLimiterService::new(
///     Algorithm::TokenBucket,
///     [(Tier::Free, Rule::per_second(5)?), (Tier::Pro, Rule::per_second(50)?)],
///     FakeClock::new(),
/// )?;
/// let allowed = (0..10).filter(|_| service.allow("alice", &Tier::Free).unwrap()).count();
/// assert_eq!(allowed, 5);
/// assert!(service.allow("bob", &Tier::Pro)?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RateLimiterService<K, P, C = MonotonicClock, S = RandomState> {
    plans: PlanTable<P>,
    clock: C,
    clients: papaya::HashMap<K, ClientEntry, S>,
}

impl<K, P, C, S> fmt::Debug for RateLimiterService<K, P, C, S>
where
    K: Hash + Eq,
    P: fmt::Debug,
    C: fmt::Debug,
    S: BuildHasher,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiterService")
            .field("plans", &self.plans)
            .field("clock", &self.clock)
            .field("clients", &self.clients.len())
            .finish()
    }
}

impl<K, P, C> RateLimiterService<K, P, C>
where
    K: Hash + Eq,
    P: Eq + fmt::Debug,
    C: Clock,
{
    /// A service applying `algorithm`, with one rule per plan, reading time from `clock`.
    ///
    /// Errors when no plan is given, when a plan is given twice, or when the method cannot honour
    /// a plan's rule (the error names the plan).
    pub fn new(
        algorithm: Algorithm,
        rules: impl IntoIterator<Item = (P, Rule)>,
        clock: C,
    ) -> Result<Self, ServiceError> {
        ServiceBuilder::new(algorithm, clock).plans(rules).build()
    }
}

impl<K, P, C, S> RateLimiterService<K, P, C, S>
where
    K: Hash + Eq,
    P: Eq + fmt::Debug,
    C: Clock,
    S: BuildHasher,
{
    /// The method this service applies.
    pub fn algorithm(&self) -> Algorithm {
        self.plans.algorithm()
    }

    /// The current rule of `plan`, if the service has it.
    pub fn rule(&self, plan: &P) -> Option<Rule> {
        let index = self.plans.index_of(plan)?;
        Some(self.plans.read(index).1.rule())
    }

    /// The service's plans, in the order they were given.
    pub fn plans(&self) -> impl Iterator<Item = &P> {
        self.plans.plans()
    }

    /// The clock this service reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// How many clients the service holds a limiter for.
    pub fn len(&self) -> usize {
        self.clients.len()
    }

    /// Whether the service holds no client.
    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    /// Counts of allowed and denied decisions under `plan` since the service was made, or `None`
    /// for a plan the service does not have. Counting costs each decision one uncontended atomic
    /// add on a per-thread shard.
    pub fn stats(&self, plan: &P) -> Option<PlanStats> {
        Some(self.plans.stats(self.plans.index_of(plan)?))
    }

    /// Replaces `plan`'s rule, from each of its clients' next request on.
    ///
    /// A client whose state was made under the old rule starts afresh under the new one: what it
    /// used under the old rule is forgotten. The change can therefore grant a client at most one
    /// window's worth of the new rule beyond what it had already used; no more, because the old
    /// state is retired (no request can still be granted on it) before the fresh one is made.
    ///
    /// Errors when the service has no such plan, or its method cannot honour `rule`.
    pub fn set_rule(&self, plan: &P, rule: Rule) -> Result<(), ServiceError> {
        let index = self.plan_index(plan)?;
        self.plans
            .set_rule(index, rule)
            .map_err(|source| ServiceError::InvalidRule {
                plan: format!("{plan:?}"),
                source,
            })
    }

    #[inline]
    fn plan_index(&self, plan: &P) -> Result<usize, ServiceError> {
        self.plans
            .index_of(plan)
            .ok_or_else(|| ServiceError::UnknownPlan {
                plan: format!("{plan:?}"),
            })
    }

    /// Takes one permit for `client` under `plan`'s rule; `Ok(false)` when it is denied.
    ///
    /// The client's limiter is made on its first request. Errors only when `plan` has no rule.
    #[inline]
    pub fn allow<Q>(&self, client: &Q, plan: &P) -> Result<bool, ServiceError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.acquire(client, plan, 1)
            .map(|decision| decision.is_allowed())
    }

    /// Takes `n` permits for `client` under `plan`'s rule, all or nothing (see
    /// [`Limiter::try_acquire_n`](crate::Limiter::try_acquire_n) for `n = 0` and `n` above the
    /// limit).
    ///
    /// A client's plan is the one its requests name: a request naming another plan than the
    /// client's last one moves the client to it, and the client starts afresh under the new rule
    /// (as after [`RateLimiterService::set_rule`]). Requests for one client that name different
    /// plans at the same moment are decided under one of those plans.
    #[inline]
    pub fn acquire<Q>(&self, client: &Q, plan: &P, n: u64) -> Result<Decision, ServiceError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let index = self.plan_index(plan)?;
        let (mut version, mut params) = self.plans.read(index);
        let clients = self.clients.pin();
        let mut conflicts = 0;
        loop {
            let entry = match clients.get(client) {
                Some(entry) => entry,
                // Two first requests may both get here; the map keeps exactly one entry, and
                // both use it.
                None => clients.get_or_insert_with(client.to_owned(), || ClientEntry {
                    plan: version,
                    state: params.fresh_state(),
                }),
            };
            let (entry_version, entry_params) = if entry.plan == version {
                (version, params)
            } else {
                // The entry follows another plan, or another version of this plan's rule.
                (version, params) = self.plans.read(index);
                let entry_current = self.plans.read(entry.plan.index());
                if entry.plan == version {
                    // Our reading of the plan was older than the entry.
                    (version, params)
                } else if conflicts >= MAX_PLAN_CONFLICTS && entry_current.0 == entry.plan {
                    // Other requests keep moving this client to another plan at this very
                    // moment: settle for the entry's plan rather than retry without end.
                    entry_current
                } else {
                    // Retire first, so no request still holding the entry can be granted on it,
                    // then make way for a fresh entry under our plan's current rule.
                    params.retire_now(&entry.state);
                    Self::remove_entry(&clients, client, entry);
                    conflicts += 1;
                    continue;
                }
            };
            let decision = entry_params.acquire(&entry.state, n, &self.clock);
            if decision.is_retired() {
                // Evicted under our feet: drop the retired entry (if no one has yet) and use a
                // fresh one. The retired state granted nothing, so nothing is counted twice.
                Self::remove_entry(&clients, client, entry);
                continue;
            }
            self.plans
                .record(entry_version.index(), decision.is_allowed());
            return Ok(decision);
        }
    }

    /// Reports, taking nothing, what one permit for `client` under `plan` would get now. A client
    /// the service does not hold (or holds under another plan or rule) is reported as fresh, and
    /// nothing is added or changed.
    pub fn peek<Q>(&self, client: &Q, plan: &P) -> Result<Decision, ServiceError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let index = self.plan_index(plan)?;
        let (version, params) = self.plans.read(index);
        let clients = self.clients.pin();
        if let Some(entry) = clients.get(client)
            && entry.plan == version
        {
            let decision = params.peek(&entry.state, &self.clock);
            if !decision.is_retired() {
                return Ok(decision);
            }
        }
        Ok(params.peek(&params.fresh_state(), &self.clock))
    }

    /// Removes every client whose limiter is indistinguishable from a fresh one (a full bucket,
    /// a window that is over, a log whose entries have all expired), and every client whose plan's
    /// rule has changed since its last request; returns how many.
    ///
    /// Invisible to clients: each limiter is first *retired* by an exchange on its own state, the
    /// same word(s) an acquire changes, so a limiter that is admitting is never removed, and an
    /// acquire that meets a retired limiter moves to a fresh one, which answers exactly as the
    /// retired one would have. Memory therefore stays bounded by the clients active within one
    /// window, however many distinct clients pass through.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now_nanos();
        let clients = self.clients.pin();
        let mut removed = 0;
        for (client, entry) in clients.iter() {
            let (version, params) = self.plans.read(entry.plan.index());
            let retired = if version == entry.plan {
                params.retire_if_idle(&entry.state, now)
            } else {
                // Its next request would start it afresh anyway.
                params.retire_now(&entry.state);
                true
            };
            if retired {
                Self::remove_entry(&clients, client, entry);
                removed += 1;
            }
        }
        removed
    }

    /// Removes `entry` for `client`, if it is still the one in the map.
    fn remove_entry<Q, G: papaya::Guard>(
        clients: &papaya::HashMapRef<'_, K, ClientEntry, S, G>,
        client: &Q,
        entry: &ClientEntry,
    ) where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // Pointer identity: another thread may already have put a fresh entry in its place.
        let _ = clients.remove_if(client, |_, current| std::ptr::eq(current, entry));
    }
}

/// Builds a [`RateLimiterService`] with a chosen hasher or initial capacity.
///
/// # Examples
///
/// ```
/// use tollgate::{Algorithm, FakeClock, Rule, ServiceBuilder};
///
/// let service = ServiceBuilder::new(Algorithm::FixedWindow, FakeClock::new())
///     .plan("free", Rule::per_minute(100)?)
///     .plan("pro", Rule::per_minute(10_000)?)
///     .capacity(100_000)
///     .build::<u64>()?;
/// assert!(service.allow(&7, &"free")?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct ServiceBuilder<P, C, S = RandomState> {
    algorithm: Algorithm,
    clock: C,
    plans: Vec<(P, Rule)>,
    hasher: S,
    capacity: usize,
}

impl<P: Eq + fmt::Debug, C: Clock> ServiceBuilder<P, C> {
    /// A builder for a service applying `algorithm` with `clock`.
    pub fn new(algorithm: Algorithm, clock: C) -> Self {
        ServiceBuilder {
            algorithm,
            clock,
            plans: Vec::new(),
            hasher: RandomState::new(),
            capacity: 0,
        }
    }
}

impl<P: Eq + fmt::Debug, C: Clock, S: BuildHasher> ServiceBuilder<P, C, S> {
    /// Adds `plan` with its `rule`.
    pub fn plan(mut self, plan: P, rule: Rule) -> Self {
        self.plans.push((plan, rule));
        self
    }

    /// Adds each plan with its rule.
    pub fn plans(mut self, rules: impl IntoIterator<Item = (P, Rule)>) -> Self {
        self.plans.extend(rules);
        self
    }

    /// Hashes client keys with `hasher` instead of the default randomly seeded one.
    pub fn hasher<T: BuildHasher>(self, hasher: T) -> ServiceBuilder<P, C, T> {
        ServiceBuilder {
            algorithm: self.algorithm,
            clock: self.clock,
            plans: self.plans,
            hasher,
            capacity: self.capacity,
        }
    }

    /// Room for `capacity` clients before the map first grows.
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity;
        self
    }

    /// The service, or the first problem with its plans.
    pub fn build<K: Hash + Eq>(self) -> Result<RateLimiterService<K, P, C, S>, ServiceError> {
        if self.plans.is_empty() {
            return Err(ServiceError::NoPlans);
        }
        if self.plans.len() > MAX_PLANS {
            return Err(ServiceError::TooManyPlans {
                count: self.plans.len(),
                max: MAX_PLANS,
            });
        }
        let mut plans: Vec<(P, ClientParams)> = Vec::with_capacity(self.plans.len());
        for (plan, rule) in self.plans {
            if plans.iter().any(|(existing, _)| *existing == plan) {
                return Err(ServiceError::DuplicatePlan {
                    plan: format!("{plan:?}"),
                });
            }
            let params = ClientParams::new(self.algorithm, rule).map_err(|source| {
                ServiceError::InvalidRule {
                    plan: format!("{plan:?}"),
                    source,
                }
            })?;
            plans.push((plan, params));
        }
        // Blocking resizes: the default incremental mode, filled by inserts, was measured to leave
        // lookups about ten times slower and to collapse multi-threaded throughput.
        let clients = papaya::HashMap::builder()
            .hasher(self.hasher)
            .capacity(self.capacity)
            .resize_mode(ResizeMode::Blocking)
            .build();
        Ok(RateLimiterService {
            plans: PlanTable::new(self.algorithm, plans),
            clock: self.clock,
            clients,
        })
    }
}

/// Runs [`RateLimiterService::sweep`] on a background thread every `interval`; the thread stops
/// when this handle is dropped (or when the service is).
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tollgate::{Algorithm, FakeClock, RateLimiterService, Rule, Sweeper};
///
/// let service: Arc<RateLimiterService<u64, &str, FakeClock>> = Arc::new(
///     RateLimiterService::new(Algorithm::TokenBucket, [("free", Rule::per_second(5)?)], FakeClock::new())?,
/// );
/// let sweeper = Sweeper::start(&service, Duration::from_millis(100))?;
/// // ... serve requests ...
/// drop(sweeper); // stops and joins the thread
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Sweeper {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sweeper {
    /// Starts sweeping `service` every `interval`. The thread holds only a weak reference, so it
    /// never keeps the service alive. Errors only when the OS refuses a new thread.
    pub fn start<K, P, C, S>(
        service: &std::sync::Arc<RateLimiterService<K, P, C, S>>,
        interval: std::time::Duration,
    ) -> std::io::Result<Sweeper>
    where
        K: Hash + Eq + Send + Sync + 'static,
        P: Eq + fmt::Debug + Send + Sync + 'static,
        C: Clock + 'static,
        S: BuildHasher + Send + Sync + 'static,
    {
        let service = std::sync::Arc::downgrade(service);
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("tollgate-sweeper".into())
            .spawn(move || {
                // A timeout means "sweep now"; a message or a dropped sender means "stop".
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(interval)
                {
                    match service.upgrade() {
                        Some(service) => {
                            service.sweep();
                        }
                        None => return,
                    }
                }
            })?;
        Ok(Sweeper {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            // A sweep that panicked has nothing left to clean up; the join only waits for it.
            let _ = thread.join();
        }
    }
}
