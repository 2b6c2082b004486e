//! [`RedisStats`]: what a [`RedisRateLimiter`](super::RedisRateLimiter) did, counted.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counts of how a [`RedisRateLimiter`](super::RedisRateLimiter)'s decisions were made, since it
/// was built. A snapshot: each counter is read on its own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisStats {
    /// Scripts sent to Redis (one per decision that needed Redis, or one per batch of them:
    /// see [`RedisRateLimiterBuilder::batch_size`](super::RedisRateLimiterBuilder::batch_size)).
    pub round_trips: u64,
    /// Decisions Redis answered.
    pub redis_decisions: u64,
    /// Denials answered by the local deny cache, without a round trip.
    pub cache_hits: u64,
    /// Requests that can never be granted (more permits than the limit), answered without one.
    pub rejections: u64,
    /// Decisions made by the failure policy (Redis failed, or the circuit was open).
    pub fallbacks: u64,
    /// Round trips that failed (errors and timeouts).
    pub errors: u64,
    /// Of those, the ones that timed out.
    pub timeouts: u64,
    /// Requests not sent because the circuit was open.
    pub short_circuits: u64,
    /// Times a circuit opened (on a cluster, each hash slot has its own: see
    /// [`CircuitBreaker`](super::CircuitBreaker)).
    pub circuit_opens: u64,
}

/// The live counters.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) round_trips: AtomicU64,
    pub(super) redis_decisions: AtomicU64,
    pub(super) cache_hits: AtomicU64,
    pub(super) rejections: AtomicU64,
    pub(super) fallbacks: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) timeouts: AtomicU64,
    pub(super) short_circuits: AtomicU64,
    pub(super) circuit_opens: AtomicU64,
}

impl Counters {
    pub(super) fn bump(counter: &AtomicU64) {
        // Relaxed: a statistic; nothing is published through it.
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self) -> RedisStats {
        // Relaxed: see `bump`.
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        RedisStats {
            round_trips: read(&self.round_trips),
            redis_decisions: read(&self.redis_decisions),
            cache_hits: read(&self.cache_hits),
            rejections: read(&self.rejections),
            fallbacks: read(&self.fallbacks),
            errors: read(&self.errors),
            timeouts: read(&self.timeouts),
            short_circuits: read(&self.short_circuits),
            circuit_opens: read(&self.circuit_opens),
        }
    }
}
