//! [`ServiceBuilder`]: a service's plans, hasher, capacity and counting, checked once.

use std::fmt;
use std::hash::{BuildHasher, Hash};

use papaya::ResizeMode;

use super::plan_table::PlanTable;
use super::rate_limiter::RateLimiterService;
use crate::clock::Clock;
use crate::error::ServiceError;
use crate::method::any::AnyParams;
use crate::plans::{Plans, Together, limits_of};
use crate::sync::Word;
use crate::{Algorithm, PlanError, Rule, SipState};

/// Builds a [`RateLimiterService`] with a chosen hasher or capacity.
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
pub struct ServiceBuilder<P, C, S = SipState> {
    algorithm: Algorithm,
    clock: C,
    plans: Vec<(P, Vec<Rule>)>,
    hasher: S,
    /// Clients per plan; `None` for [`ServiceBuilder::DEFAULT_CAPACITY`].
    capacity: Option<usize>,
    count_decisions: bool,
}

impl<P: Eq + fmt::Debug, C: Clock> ServiceBuilder<P, C> {
    /// A builder for a service applying `algorithm` with `clock`.
    pub fn new(algorithm: Algorithm, clock: C) -> Self {
        ServiceBuilder {
            algorithm,
            clock,
            plans: Vec::new(),
            hasher: SipState::new(),
            capacity: None,
            count_decisions: false,
        }
    }
}

impl<P: Eq + fmt::Debug, C: Clock, S: BuildHasher + Clone> ServiceBuilder<P, C, S> {
    /// The most clients a service may hold over all its plans: 2^28, whose tables take 4.25 GiB
    /// up front with a one-word method.
    pub const MAX_CAPACITY: usize = 1 << 28;

    /// The clients each plan holds unless [`ServiceBuilder::capacity`] says otherwise: 65,536
    /// (about 1.1 MiB per plan with a one-word method), or fewer where more than 4,096 plans
    /// would take the service past [`ServiceBuilder::MAX_CAPACITY`].
    pub const DEFAULT_CAPACITY: usize = 1 << 16;

    /// Adds `plan` with its `rule`.
    pub fn plan(mut self, plan: P, rule: Rule) -> Self {
        self.plans.push((plan, vec![rule]));
        self
    }

    /// Adds `plan` with several limits, enforced together: a request is granted only if every
    /// limit grants it, and then takes from all (see [`RateLimiterService`]). At most
    /// [`RateLimiterService::MAX_LIMITS`]; the token bucket, the fixed window and the sliding window
    /// counter take several.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Algorithm, FakeClock, Rule, ServiceBuilder};
    ///
    /// let clock = FakeClock::new();
    /// let service = ServiceBuilder::new(Algorithm::TokenBucket, clock.clone())
    ///     .plan_limits("free", [Rule::per_second(3)?, Rule::new(5, Duration::from_secs(10))?])
    ///     .build::<u64>()?;
    /// let burst = (0..10).filter(|_| service.allow(&1, &"free").unwrap()).count();
    /// assert_eq!(burst, 3); // the per-second limit
    /// clock.advance(Duration::from_secs(1));
    /// let later = (0..10).filter(|_| service.allow(&1, &"free").unwrap()).count();
    /// assert_eq!(later, 2); // the 10-second limit: 5 in all
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
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

    /// Hashes client keys with `hasher` instead of the default randomly seeded one. Each plan's
    /// map gets a clone of it.
    ///
    /// The default, [`SipState`], computes what std's `RandomState` does (SipHash-1-3 of the
    /// key's bytes under random keys, the hash std's authors document as resistant to HashDoS,
    /// keys chosen to collide), with less work per integer: keep it wherever clients choose
    /// their keys, as they do in a proxy (addresses, API keys, header values). Where they cannot
    /// (identifiers the server assigned), a faster hasher pays: with
    /// `foldhash::fast::RandomState`, which its authors call "minimally DoS-resistant" and
    /// advise against where someone may reverse-engineer the seed of a long-running process, a
    /// lookup among 10 000 `u64` keys executes roughly 200 instructions instead of roughly 295
    /// (350 with std's `RandomState`; BENCHMARKS.md, "Instructions per decision").
    pub fn hasher<T: BuildHasher>(self, hasher: T) -> ServiceBuilder<P, C, T> {
        ServiceBuilder {
            algorithm: self.algorithm,
            clock: self.clock,
            plans: self.plans,
            hasher,
            capacity: self.capacity,
            count_decisions: self.count_decisions,
        }
    }

    /// Counts allowed and denied decisions per plan, for [`RateLimiterService::stats`]: one
    /// uncontended atomic add on a per-thread shard per decision. Off unless asked for.
    pub fn count_decisions(mut self, count: bool) -> Self {
        self.count_decisions = count;
        self
    }

    /// The most clients each plan holds (each plan has its own table, so that a lookup hashes
    /// only the client's key), rounded up to a multiple of 8. With the token bucket, the fixed
    /// window or the sliding window counter, each plan's table is allocated when the service is
    /// built, 17 bytes per client of capacity, and never grows: a new client whose slots are all
    /// taken reuses an idle client's slot (no answer changes), else evicts the client closest to
    /// fresh among the 16 slots its key may use (of those idle at the latest reading the request
    /// or the slots' states show, the one idle longest; where none is, the most permits left at
    /// the request's reading, then the least recently used), counted by
    /// [`RateLimiterService::evictions`](crate::RateLimiterService::evictions). An evicted
    /// client starts afresh on its next request, which can give it at most one limit's worth
    /// more, once, in permits asked one at a time (under the sliding window counter, two where
    /// its readings reach back into the window before its last). An attempt that takes nothing
    /// whatever the state (of 0 permits, or of more than the limit) makes no state for a new
    /// client, so it takes no place and evicts no one. The sliding log's clients, and those of a
    /// plan of several limits, are kept in a map presized to `capacity`, which grows past it as
    /// clients arrive.
    ///
    /// [`build`](ServiceBuilder::build) refuses 0, and more than
    /// [`ServiceBuilder::MAX_CAPACITY`] over all plans.
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.capacity = Some(capacity);
        self
    }

    /// The service, or the first problem with its plans or capacity.
    ///
    /// # Errors
    ///
    /// [`ServiceError::CapacityTooLarge`], or [`ServiceError::Plan`] with the first mistake in
    /// the plans (none, more than the service can tell apart, one twice, a plan's limits too
    /// few, too many, repeated, or not honoured by the method, naming the plan).
    pub fn build<K: Hash + Eq>(self) -> Result<RateLimiterService<K, P, C, S>, ServiceError> {
        let plan_count = self.plans.len().max(1);
        let most_per_plan = Self::MAX_CAPACITY / plan_count;
        let capacity = match self.capacity {
            None => Self::DEFAULT_CAPACITY.min(most_per_plan),
            Some(0) => return Err(ServiceError::CapacityZero),
            Some(capacity) if capacity.saturating_mul(plan_count) > Self::MAX_CAPACITY => {
                return Err(ServiceError::CapacityTooLarge {
                    capacity,
                    max: most_per_plan,
                });
            }
            Some(capacity) => capacity,
        };
        let checked = Plans::new(self.algorithm, Together::GivingBack, self.plans)?;
        // Every rule's timeline starts here, so that a limiter's horizon is counted from the
        // service's start, wherever the clock's origin lies.
        let start_nanos = self.clock.now_nanos();
        let plans = checked
            .into_vec()
            .into_iter()
            .map(|(plan, rules)| {
                let limits = limits_of(&plan, &rules, Together::GivingBack, |rule| {
                    AnyParams::new(self.algorithm, rule, start_nanos)
                })?;
                Ok((plan, limits))
            })
            .collect::<Result<Vec<_>, PlanError>>()?;
        // Blocking resizes: the default incremental mode, filled by inserts, was measured to leave
        // lookups about ten times slower and to collapse multi-threaded throughput.
        // Only the sliding log keeps every client in a map; under the other methods the map holds
        // only the clients of plans of several limits, and starts small.
        let map_capacity = if self.algorithm == Algorithm::SlidingWindowLog {
            capacity
        } else {
            0
        };
        let hasher = self.hasher;
        let new_map = || {
            papaya::HashMap::builder()
                .hasher(hasher.clone())
                .capacity(map_capacity)
                .resize_mode(ResizeMode::Blocking)
                .build()
        };
        Ok(RateLimiterService {
            evicted_up_to: Word::new(0),
            plans: PlanTable::new(
                self.algorithm,
                start_nanos,
                plans,
                self.count_decisions,
                capacity,
                new_map,
            ),
            clock: self.clock,
            hasher,
            #[cfg(feature = "tower")]
            id: next_service_id(),
        })
    }
}

/// A number no other service of this process has.
#[cfg(feature = "tower")]
fn next_service_id() -> u64 {
    // Not `crate::sync`'s atomic: a count outside every modelled protocol, which loom's
    // statics could not hold.
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // Relaxed: only uniqueness matters, which the read-modify-write gives.
    NEXT.fetch_add(1, Ordering::Relaxed)
}
