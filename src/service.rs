//! [`RateLimiterService`]: one limiter per client, made on the client's first request.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash, RandomState};

use papaya::ResizeMode;

use crate::client_state::{ClientParams, ClientState};
use crate::clock::Clock;
use crate::error::ServiceError;
use crate::{Algorithm, Decision, LimiterFactory, MonotonicClock, Rule};

/// One client's entry in the map: which plan its state follows, and the state.
#[derive(Debug)]
struct ClientEntry {
    plan: usize,
    state: ClientState,
}

/// One plan and its rule's constants.
#[derive(Debug)]
struct Plan<P> {
    plan: P,
    params: ClientParams,
}

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
    factory: LimiterFactory,
    plans: Box<[Plan<P>]>,
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
            .field("algorithm", &self.factory.algorithm())
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
        self.factory.algorithm()
    }

    /// The rule of `plan`, if the service has it.
    pub fn rule(&self, plan: &P) -> Option<Rule> {
        self.plans
            .iter()
            .find(|entry| entry.plan == *plan)
            .map(|entry| entry.params.rule())
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

    #[inline]
    fn plan_index(&self, plan: &P) -> Result<usize, ServiceError> {
        self.plans
            .iter()
            .position(|entry| entry.plan == *plan)
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
    #[inline]
    pub fn acquire<Q>(&self, client: &Q, plan: &P, n: u64) -> Result<Decision, ServiceError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let plan_index = self.plan_index(plan)?;
        let params = &self.plans[plan_index].params;
        let clients = self.clients.pin();
        loop {
            let entry = match clients.get(client) {
                Some(entry) => entry,
                // Two first requests may both get here; the map keeps exactly one entry, and
                // both use it.
                None => clients.get_or_insert_with(client.to_owned(), || ClientEntry {
                    plan: plan_index,
                    state: params.fresh_state(),
                }),
            };
            if entry.plan != plan_index {
                // The client moved to another plan: it starts afresh under the new rule.
                self.replace(&clients, client, entry);
                continue;
            }
            let decision = params.acquire(&entry.state, n, &self.clock);
            if decision.is_retired() {
                // Evicted under our feet: drop the retired entry (if no one has yet) and use a
                // fresh one. The retired state granted nothing, so nothing is counted twice.
                self.replace(&clients, client, entry);
                continue;
            }
            return Ok(decision);
        }
    }

    /// Reports, taking nothing, what one permit for `client` under `plan` would get now. A client
    /// the service does not hold is reported as fresh, and is not added.
    pub fn peek<Q>(&self, client: &Q, plan: &P) -> Result<Decision, ServiceError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let plan_index = self.plan_index(plan)?;
        let params = &self.plans[plan_index].params;
        let clients = self.clients.pin();
        if let Some(entry) = clients.get(client)
            && entry.plan == plan_index
        {
            let decision = params.peek(&entry.state, &self.clock);
            if !decision.is_retired() {
                return Ok(decision);
            }
        }
        Ok(params.peek(&params.fresh_state(), &self.clock))
    }

    /// Removes every client whose limiter is indistinguishable from a fresh one (a full bucket,
    /// a window that is over, a log whose entries have all expired), and returns how many.
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
            let params = &self.plans[entry.plan].params;
            if params.retire_if_idle(&entry.state, now) {
                let _ = clients.remove_if(client, |_, current| std::ptr::eq(current, entry));
                removed += 1;
            }
        }
        removed
    }

    /// Removes `entry` for `client`, if it is still the one in the map.
    fn replace<Q, G: papaya::Guard>(
        &self,
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
        let mut plans: Vec<Plan<P>> = Vec::with_capacity(self.plans.len());
        for (plan, rule) in self.plans {
            if plans.iter().any(|existing| existing.plan == plan) {
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
            plans.push(Plan { plan, params });
        }
        // Blocking resizes: the default incremental mode, filled by inserts, was measured to leave
        // lookups about ten times slower and to collapse multi-threaded throughput.
        let clients = papaya::HashMap::builder()
            .hasher(self.hasher)
            .capacity(self.capacity)
            .resize_mode(ResizeMode::Blocking)
            .build();
        Ok(RateLimiterService {
            factory: LimiterFactory::new(self.algorithm),
            plans: plans.into_boxed_slice(),
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
