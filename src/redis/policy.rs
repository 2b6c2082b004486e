//! [`FailurePolicy`]: what a decision is when Redis cannot make it, and the circuit breaker that
//! keeps a dead Redis from costing every request a timeout.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::clock::duration_to_nanos;

/// What a [`RedisRateLimiter`](super::RedisRateLimiter) answers when Redis fails (an error, a
/// timeout) or the circuit breaker is open.
///
/// Whatever the policy, a failure never panics and never queues requests without bound: each
/// round trip is bounded by the request timeout, and an open circuit sends none.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Return the error ([`RedisError::Timeout`](super::RedisError::Timeout),
    /// [`CircuitOpen`](super::RedisError::CircuitOpen), ...) and let the caller choose.
    Error,
    /// Allow the request: availability over limits. The decision reports 0 remaining.
    FailOpen,
    /// Deny the request: limits over availability. The decision asks the client to retry after
    /// the circuit's cool-down.
    FailClosed,
    /// Decide in process, each node on its own, with `share` (in (0, 1]) of each limit, rounded
    /// down but at least 1: with `share = 1/nodes` a fleet admits at most what Redis would
    /// (per window of an outage). The node's in-process state is its own, kept across outages
    /// (what it granted during one is not known to Redis), and swept of idle clients.
    Local {
        /// The fraction of each limit a node grants on its own.
        share: f64,
    },
}

/// Which path answered a request (see [`Answer::source`](super::Answer::source)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source {
    /// Redis, in one round trip.
    Redis,
    /// The local deny cache: a denial Redis gave earlier, still in force.
    DenyCache,
    /// No round trip needed: the request can never be granted (see
    /// [`Decision::rejection`](crate::Decision::rejection)).
    Rejected,
    /// [`FailurePolicy::FailOpen`].
    FailOpen,
    /// [`FailurePolicy::FailClosed`].
    FailClosed,
    /// [`FailurePolicy::Local`].
    Local,
}

/// When the circuit breaker opens and probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitBreaker {
    /// Consecutive failed round trips that open the circuit.
    pub failures: u32,
    /// How long an open circuit sends nothing before one request probes Redis.
    pub cool_down: Duration,
}

impl Default for CircuitBreaker {
    /// Opens after 3 consecutive failures (one is a blip, three an outage), probes every 500 ms
    /// (a restarted Redis is used again within half a second).
    fn default() -> Self {
        CircuitBreaker {
            failures: 3,
            cool_down: Duration::from_millis(500),
        }
    }
}

/// What the breaker lets a request do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gate {
    /// Closed: ask Redis.
    Closed,
    /// Half-open: this request is the one probe.
    Probe,
    /// Open: do not ask; the next probe may go in `retry_in`.
    Open { retry_in: Duration },
}

/// The breaker's state, lock-free: a failure count, the instant the circuit stays open until
/// (0: closed), and whether a probe is out.
#[derive(Debug)]
pub(super) struct Breaker {
    settings: CircuitBreaker,
    origin: Instant,
    failures: AtomicU32,
    /// Nanoseconds after `origin`; 0 when closed.
    open_until: AtomicU64,
    probing: AtomicBool,
}

impl Breaker {
    pub(super) fn new(settings: CircuitBreaker) -> Breaker {
        Breaker {
            settings,
            origin: Instant::now(),
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
        }
    }

    pub(super) fn cool_down(&self) -> Duration {
        self.settings.cool_down
    }

    fn now(&self) -> u64 {
        // At least 1, so that 0 keeps meaning closed.
        duration_to_nanos(self.origin.elapsed()).max(1)
    }

    pub(super) fn gate(&self) -> Gate {
        // Relaxed throughout: each field is a hint read on its own; a stale read costs at most
        // one extra round trip or one extra fallback, never a wrong decision.
        let until = self.open_until.load(Ordering::Relaxed);
        if until == 0 {
            return Gate::Closed;
        }
        let now = self.now();
        if now < until {
            return Gate::Open {
                retry_in: Duration::from_nanos(until - now),
            };
        }
        // Cooled down: exactly one request probes; the rest keep falling back meanwhile.
        if self
            .probing
            .compare_exchange(false, true, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            Gate::Probe
        } else {
            Gate::Open {
                retry_in: Duration::ZERO,
            }
        }
    }

    /// Records a successful round trip: the circuit closes.
    pub(super) fn success(&self, probe: bool) {
        self.failures.store(0, Ordering::Relaxed);
        self.open_until.store(0, Ordering::Relaxed);
        if probe {
            self.probing.store(false, Ordering::Relaxed);
        }
    }

    /// Records a failed round trip; returns whether it opened the circuit.
    pub(super) fn failure(&self, probe: bool) -> bool {
        let reopen = self
            .now()
            .saturating_add(duration_to_nanos(self.settings.cool_down));
        if probe {
            self.open_until.store(reopen, Ordering::Relaxed);
            self.probing.store(false, Ordering::Relaxed);
            return false;
        }
        let failures = self
            .failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        failures >= self.settings.failures
            && self
                .open_until
                .compare_exchange(0, reopen, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

/// Releases the probe if the request carrying it is dropped before it reports (a caller that
/// gave up on its future): counted as a failure, so the circuit stays open for another cool-down
/// rather than never probing again.
#[derive(Debug)]
pub(super) struct ProbeGuard<'a> {
    breaker: Option<&'a Breaker>,
}

impl<'a> ProbeGuard<'a> {
    pub(super) fn new(breaker: &'a Breaker, gate: Gate) -> ProbeGuard<'a> {
        ProbeGuard {
            breaker: (gate == Gate::Probe).then_some(breaker),
        }
    }

    pub(super) fn is_probe(&self) -> bool {
        self.breaker.is_some()
    }

    /// The probe reported; nothing to release.
    pub(super) fn disarm(mut self) {
        self.breaker = None;
    }
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if let Some(breaker) = self.breaker {
            breaker.failure(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker(cool_down: Duration) -> Breaker {
        Breaker::new(CircuitBreaker {
            failures: 3,
            cool_down,
        })
    }

    #[test]
    fn the_circuit_opens_after_the_consecutive_failures_only() {
        let breaker = breaker(Duration::from_secs(60));
        assert!(!breaker.failure(false));
        assert!(!breaker.failure(false));
        breaker.success(false);
        assert!(!breaker.failure(false));
        assert!(!breaker.failure(false));
        assert_eq!(breaker.gate(), Gate::Closed);
        assert!(breaker.failure(false), "the third in a row opens it");
        assert!(matches!(breaker.gate(), Gate::Open { retry_in } if retry_in > Duration::ZERO));
        assert!(!breaker.failure(false), "opening is reported once");
    }

    #[test]
    fn a_cooled_down_circuit_lets_exactly_one_probe_through() {
        let breaker = breaker(Duration::from_millis(1));
        for _ in 0..3 {
            breaker.failure(false);
        }
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(breaker.gate(), Gate::Probe);
        assert!(
            matches!(breaker.gate(), Gate::Open { .. }),
            "one probe at a time"
        );
        // The probe fails: open for another cool-down, then probe again.
        breaker.failure(true);
        assert!(matches!(breaker.gate(), Gate::Open { .. }));
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(breaker.gate(), Gate::Probe);
        breaker.success(true);
        assert_eq!(breaker.gate(), Gate::Closed);
    }

    #[test]
    fn a_probe_dropped_before_it_reports_does_not_jam_the_circuit() {
        let breaker = breaker(Duration::from_millis(1));
        for _ in 0..3 {
            breaker.failure(false);
        }
        std::thread::sleep(Duration::from_millis(5));
        let gate = breaker.gate();
        assert_eq!(gate, Gate::Probe);
        drop(ProbeGuard::new(&breaker, gate));
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(
            breaker.gate(),
            Gate::Probe,
            "a new probe after the cool-down"
        );
    }
}
