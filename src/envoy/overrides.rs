//! The limits that requests' descriptors bring (`RateLimitDescriptor.limit`, which Envoy's
//! route actions set from static values or a request's dynamic metadata).
//!
//! envoyproxy/ratelimit applies such a limit in place of the configured one to any descriptor
//! of a known domain, matched in the configuration or not, never shadowed, counted per domain
//! and entries. Here the same: each distinct limit (its unit and requests per unit) under the
//! domain's method gets a limiter of its own, made on the first request that brings it and kept
//! across reloads; its clients are the descriptors' entries, keys and values. Two descriptors of
//! the same entries that bring different limits are counted apart, and apart from the
//! configured limit of those entries (envoyproxy/ratelimit counts them together).
//!
//! The limiters are few (a route's actions bring a handful of limits), so the table is bounded:
//! [`RateLimitServer::MAX_BROUGHT_LIMITS`](super::RateLimitServer::MAX_BROUGHT_LIMITS) over all
//! domains, each in process holding the store's clients. A request's missing limiters are made
//! all or none, after all its limits were read: a request bringing one more than the bound is
//! refused with `RESOURCE_EXHAUSTED` (before its new limits are checked for what the method can
//! enforce) and takes no room, and none is decided by a limit it did not ask for. A refund takes
//! no room: in process a limit never made has nothing to give back; on Redis, where another
//! instance may have taken from it, a limiter is made for that refund alone. On Redis every
//! limiter shares the connections of one made with the service, whose settings are checked
//! then. In process, memory is the store's clients per limiter, as for a configured
//! descriptor: under the sliding window log, each client's ring of 8 bytes per permit of the
//! brought limit, in a map that grows past `clients` (see `ServiceBuilder::capacity`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;

use super::config::{Unit, UnitLimit};
use super::engine::{self, Enforced, Limiter, NodeLimit, StateStore};
use super::metrics::DescriptorMetrics;
use crate::Algorithm;
use crate::redis::{RedisError, RedisRateLimiter};

/// Each domain's brought limits by method and limit.
type Table = HashMap<String, HashMap<(Algorithm, UnitLimit), Arc<NodeLimit>>>;

/// The limiters of the limits that requests bring.
pub(crate) struct Overrides {
    /// Read without a lock; replaced whole when a limiter is made (rarely: a few times in a
    /// service's life).
    made: ArcSwap<Table>,
    /// Held while limiters are made, so that one limit gets one limiter.
    making: Mutex<()>,
    store: StateStore,
    /// On Redis: the limiter whose connections, timeout and failure policy every brought
    /// limit's limiter shares (made, and its settings checked, with the service).
    base: Option<Arc<RedisRateLimiter<String>>>,
}

/// Why a brought limit has no limiter.
#[derive(Debug)]
pub(crate) enum OverrideError {
    /// The service holds [`RateLimitServer::MAX_BROUGHT_LIMITS`](super::RateLimitServer) already.
    Full,
    /// The domain's method cannot enforce it; the message says why.
    Unenforceable(String),
}

/// Entries of a Redis deny cache per brought limit (each cache is allocated whole).
const DENY_CACHE_PER_LIMIT: usize = 4_096;

impl Overrides {
    /// The table for `store`.
    ///
    /// # Errors
    ///
    /// On Redis, settings no limiter can be made with (a URL, a timeout, a failure policy):
    /// named now, not at the first request that brings a limit.
    pub(crate) fn new(store: StateStore) -> Result<Overrides, RedisError> {
        let base = match &store {
            StateStore::InProcess { .. } => None,
            StateStore::Redis {
                url,
                policy,
                timeout,
            } => Some(Arc::new(
                RedisRateLimiter::<String>::builder(url.clone(), Algorithm::FixedWindow)
                    .failure_policy(*policy)
                    .timeout(*timeout)
                    .key_prefix(engine::KEY_PREFIX)
                    .deny_cache(0)
                    .plan(
                        "base".to_owned(),
                        crate::Rule::per_second(1).expect("a valid rule"),
                    )
                    .build_lazy()?,
            )),
        };
        Ok(Overrides {
            made: ArcSwap::from_pointee(Table::new()),
            making: Mutex::new(()),
            store,
            base,
        })
    }

    /// The limiter of `limit` in `domain` under `method`, if one was made.
    pub(crate) fn find(
        &self,
        domain: &str,
        method: Algorithm,
        limit: UnitLimit,
    ) -> Option<Arc<NodeLimit>> {
        self.made
            .load()
            .get(domain)
            .and_then(|limits| limits.get(&(method, limit)))
            .cloned()
    }

    /// The limiter of each of `limits` in `domain` under `method`, in order, made now where none
    /// was: all of them, or none (the error names the position of the limit that could not be
    /// made), so that a request refused here takes no room among the `most` the table holds.
    pub(crate) fn get_or_make_all(
        &self,
        domain: &str,
        method: Algorithm,
        limits: &[UnitLimit],
        most: usize,
    ) -> Result<Vec<Arc<NodeLimit>>, (usize, OverrideError)> {
        let found: Option<Vec<_>> = limits
            .iter()
            .map(|limit| self.find(domain, method, *limit))
            .collect();
        if let Some(found) = found {
            return Ok(found);
        }
        // A panic while making them leaves nothing half made: the table is replaced whole.
        let _one_at_a_time = self.making.lock().unwrap_or_else(PoisonError::into_inner);
        let table = self.made.load_full();
        let known = table.get(domain);
        let mut missing: Vec<(usize, UnitLimit)> = Vec::new();
        for (at, limit) in limits.iter().enumerate() {
            let made = known.is_some_and(|known| known.contains_key(&(method, *limit)));
            if !made && !missing.iter().any(|(_, other)| other == limit) {
                missing.push((at, *limit));
            }
        }
        let held = table.values().map(HashMap::len).sum::<usize>();
        if let Some(&(at, _)) = missing.get(most.saturating_sub(held)) {
            return Err((at, OverrideError::Full));
        }
        let mut next = Table::clone(&table);
        let made = next.entry(domain.to_owned()).or_default();
        for (at, limit) in missing {
            let limiter = self
                .make(domain, method, limit, DENY_CACHE_PER_LIMIT)
                .map_err(|error| (at, error))?;
            made.insert((method, limit), Arc::new(limiter));
        }
        let all = limits
            .iter()
            .map(|limit| Arc::clone(&made[&(method, *limit)]))
            .collect();
        self.made.store(Arc::new(next));
        Ok(all)
    }

    /// On Redis, a limiter of `limit` for one request's refund where this instance made none:
    /// not kept, and taking no room (another instance may have charged the shared state). `None`
    /// in process (no request took from it here: nothing to give back), or for a limit the
    /// method cannot enforce (no request could take from it anywhere).
    pub(crate) fn for_one_refund(
        &self,
        domain: &str,
        method: Algorithm,
        limit: UnitLimit,
    ) -> Option<Arc<NodeLimit>> {
        if let Some(made) = self.find(domain, method, limit) {
            return Some(made);
        }
        self.base.as_ref()?;
        self.make(domain, method, limit, 0).ok().map(Arc::new)
    }

    /// A limiter of `limit`, with a Redis deny cache of `deny_cache` entries (none for 0).
    fn make(
        &self,
        domain: &str,
        method: Algorithm,
        limit: UnitLimit,
        deny_cache: usize,
    ) -> Result<NodeLimit, OverrideError> {
        let UnitLimit {
            unit,
            requests_per_unit,
        } = limit;
        let policy = format!("{requests_per_unit}-per-{}", unit.name());
        let metrics = DescriptorMetrics::new(domain, &format!("(brought {policy})"), false);
        if requests_per_unit == 0 {
            return Ok(NodeLimit {
                enforced: Enforced::Blocked(unit),
                name: None,
                replaces: Vec::new(),
                policy,
                fields: None,
                metrics,
            });
        }
        let limits = vec![limit];
        let limiter = match &self.store {
            StateStore::InProcess { clients } => engine::in_process(method, &limits, *clients)
                .map_err(OverrideError::Unenforceable)?,
            StateStore::Redis { .. } => {
                let base = self.base.as_ref().expect("made with the table on Redis");
                let plan = engine::redis_plan_name(
                    'o',
                    domain,
                    &format!("{method:?}/{requests_per_unit}/{}", unit.name()),
                );
                let plans = vec![(plan.clone(), engine::rules_of(&limits))];
                // Every error of a sibling is a plan the method cannot hold: the settings were
                // checked with the base.
                let limiter = base
                    .sibling(method, plans, deny_cache)
                    .map_err(|error| OverrideError::Unenforceable(error.to_string()))?;
                Limiter::Redis {
                    limiter: Arc::new(limiter),
                    plan,
                }
            }
        };
        Ok(NodeLimit {
            fields: engine::prepared_fields(&policy, &limits),
            enforced: Enforced::Limited {
                method,
                limits,
                limiter,
            },
            name: None,
            replaces: Vec::new(),
            policy,
            metrics,
        })
    }
}

/// The limit `brought` names, or why it names none.
pub(crate) fn brought_limit(brought: &RateLimitOverride) -> Result<UnitLimit, String> {
    // envoy.type.v3.RateLimitUnit's numbers (WEEK, 7, is newer than some copies of the proto).
    let unit = match brought.unit {
        1 => Unit::Second,
        2 => Unit::Minute,
        3 => Unit::Hour,
        4 => Unit::Day,
        5 => Unit::Month,
        6 => Unit::Year,
        7 => Unit::Week,
        other => {
            return Err(format!(
                "its limit's unit {other} is not one of SECOND (1), MINUTE (2), HOUR (3), \
                 DAY (4), MONTH (5), YEAR (6), WEEK (7)"
            ));
        }
    };
    Ok(UnitLimit {
        unit,
        requests_per_unit: u64::from(brought.requests_per_unit),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hourly(requests_per_unit: u64) -> UnitLimit {
        UnitLimit {
            unit: Unit::Hour,
            requests_per_unit,
        }
    }

    /// Threads racing to make the same limits each get the one limiter of each limit, and no
    /// more limiters than the bound are ever made.
    #[test]
    fn racing_first_requests_make_one_limiter_per_limit_and_stop_at_the_bound() {
        const MOST: usize = 24;
        const LIMITS: u64 = 40;
        let overrides = Overrides::new(StateStore::InProcess { clients: 4 }).expect("in process");
        let made: Vec<Vec<Option<Arc<NodeLimit>>>> = std::thread::scope(|scope| {
            let racers: Vec<_> = (0..4)
                .map(|thread| {
                    let overrides = &overrides;
                    scope.spawn(move || {
                        // Each thread walks every limit, in its own order (a multiplier
                        // prime to LIMITS).
                        let step = [1, 3, 7, 9][thread];
                        (0..LIMITS)
                            .map(|i| (i * step) % LIMITS + 1)
                            .map(|limit| {
                                let found = overrides.get_or_make_all(
                                    "edge",
                                    Algorithm::FixedWindow,
                                    &[hourly(limit)],
                                    MOST,
                                );
                                (limit, found.ok().map(|mut all| all.remove(0)))
                            })
                            .fold(vec![None; LIMITS as usize], |mut all, (limit, found)| {
                                all[limit as usize - 1] = found;
                                all
                            })
                    })
                })
                .collect();
            racers
                .into_iter()
                .map(|racer| racer.join().unwrap())
                .collect()
        });
        let table = overrides.made.load();
        let held = table.values().map(HashMap::len).sum::<usize>();
        assert_eq!(held, MOST, "the bound is reached and kept");
        for limit in 1..=LIMITS {
            let kept = overrides.find("edge", Algorithm::FixedWindow, hourly(limit));
            for (thread, seen) in made.iter().enumerate() {
                let seen = &seen[limit as usize - 1];
                match (&kept, seen) {
                    (Some(kept), Some(seen)) => assert!(
                        Arc::ptr_eq(kept, seen),
                        "thread {thread} got a second limiter for {limit}"
                    ),
                    // Refused at the bound: never made.
                    (None, None) => {}
                    // Once one is refused none is made, and a made one is found: a thread
                    // refused a limit that is kept was refused wrongly.
                    (Some(_), None) => panic!("thread {thread} was refused {limit}, which is kept"),
                    (None, Some(_)) => {
                        panic!("thread {thread} got a limiter for {limit} that is not kept")
                    }
                }
            }
        }
    }
}
