//! [`LocalFallback`]: in-process services holding a share of each plan's limits, which decide
//! while Redis cannot (under [`FailurePolicy::Local`](super::FailurePolicy::Local)).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use super::RedisError;
use super::limiter::{Mode, PlanEntry};
use crate::method::several_limits::combined;
use crate::{
    Algorithm, Decision, LimiterFactory, MonotonicClock, PlanError, RateLimiterService, Rule,
};

/// The local fallback sweeps idle clients every this many of its decisions, so an outage with
/// many distinct clients does not grow its memory without bound.
const SWEEP_EVERY: u64 = 1_024;

/// One in-process service per limit position (every plan's first limit in the first service,
/// and so on), plans named by their index, each limit cut to the node's share.
#[derive(Debug)]
pub(super) struct LocalFallback {
    services: Vec<RateLimiterService<String, usize>>,
    decisions: AtomicU64,
}

impl LocalFallback {
    /// The services for `plans` under `algorithm`, with `share` of each limit.
    pub(super) fn new<P: fmt::Debug>(
        algorithm: Algorithm,
        plans: &[PlanEntry<P>],
        share: f64,
    ) -> Result<Self, RedisError> {
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
                // A plan mistake as the plans' own check words it, naming the local rule.
                let invalid = |source| {
                    PlanError::invalid_rule(&entry.plan, entry.limits.len(), position, source)
                };
                let local_rule = Rule::new(limit, rule.window()).map_err(invalid)?;
                LimiterFactory::new(algorithm)
                    .check(local_rule)
                    .map_err(invalid)?;
                rules.push((index, local_rule));
            }
            let service = RateLimiterService::new(algorithm, rules, MonotonicClock::new())
                .map_err(|error| RedisError::InvalidSetting {
                    field: "local fallback",
                    value: error.to_string(),
                    bound: "the in-process service must accept every plan's share",
                })?;
            services.push(service);
        }
        Ok(LocalFallback {
            services,
            decisions: AtomicU64::new(0),
        })
    }

    /// The decision for `client` under the plan at `index`: its limits taken one after another,
    /// stopping at the first denial (one already taken stays taken: the fallback can
    /// under-admit, never over-admit). `None` only for a plan with no limit, which a built
    /// limiter never has.
    pub(super) fn decide(
        &self,
        index: usize,
        client: &str,
        n: u64,
        mode: Mode,
    ) -> Option<Decision> {
        // Relaxed: a sweep schedule, nothing more.
        let count = self.decisions.fetch_add(1, Ordering::Relaxed);
        if count % SWEEP_EVERY == SWEEP_EVERY - 1 {
            for service in &self.services {
                service.sweep();
            }
        }
        let mut decisions = Vec::with_capacity(self.services.len());
        for service in &self.services {
            let result = match mode {
                Mode::Acquire | Mode::Reserve => service.acquire(client, &index, n),
                Mode::Peek => service.peek(client, &index),
            };
            match result {
                Ok(decision) if decision.is_denied() => return Some(decision),
                Ok(decision) => decisions.push(decision),
                // The plan has fewer limits than this position.
                Err(_) => {}
            }
        }
        let mut decisions = decisions.into_iter();
        Some(combined(decisions.next()?, decisions))
    }
}
