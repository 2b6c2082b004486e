//! [`RateLimitBackend`]: what the layer asks for a decision, so that the in-process
//! [`RateLimiterService`] and a store shared between servers fit the same layer.

use std::fmt;
use std::future::{Future, Ready, ready};
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::time::Duration;

use crate::{Algorithm, Clock, Decision, RateLimiterService, ServiceError, Sweeper};

/// A source of decisions: takes `cost` permits for `key` under `plan`.
///
/// The future must be `Unpin` (box it if it is not): the layer polls it once in place, and only
/// if it is not ready moves it, with the request, into the response future. A backend whose
/// future is always ready, as the in-process service's, therefore costs the layer no allocation
/// and no clone of the inner service.
pub trait RateLimitBackend<K, P> {
    /// Why no decision could be made (an unknown plan; a store that cannot be reached).
    type Error: fmt::Display;
    /// The decision to come.
    type Future: Future<Output = Result<Decision, Self::Error>> + Unpin;

    /// Takes `cost` permits for `key` under `plan`'s rule, all or nothing.
    fn check(&self, key: &K, plan: &P, cost: u64) -> Self::Future;

    /// As [`check`](RateLimitBackend::check), for a caller that needs nothing of an allowed
    /// decision but that it was allowed (no `RateLimit` field will be sent): a backend may then
    /// report 0 permits left and skip the work of counting them. Refusals keep every figure.
    fn check_without_remaining(&self, key: &K, plan: &P, cost: u64) -> Self::Future {
        self.check(key, plan, cost)
    }

    /// For a plan of several limits, the `RateLimit-Policy` and `RateLimit` field values with
    /// one list item per limit, as they stand after the request's check (asked right after it);
    /// `None` where the decision's own figures say all (a plan of one limit), or the backend
    /// cannot tell without another round trip.
    fn limit_fields(&self, key: &K, plan: &P, policy: &str) -> Option<(String, String)> {
        let _ = (key, plan, policy);
        None
    }

    /// Starts sweeping idle clients out of the backend every `interval`, for a backend that keeps
    /// them in this process and can share itself with the sweeping thread; `None` for one with
    /// nothing to sweep, or that forgets idle clients by itself (a store whose keys expire). A
    /// layer over the backend starts this when it is built and stops it when it is dropped.
    ///
    /// The default is `None`; `Arc<B>` answers what [`start_shared_sweeper`] of `B` does, which
    /// for the in-process [`RateLimiterService`] is a [`Sweeper`].
    ///
    /// [`start_shared_sweeper`]: RateLimitBackend::start_shared_sweeper
    fn start_sweeper(&self, interval: Duration) -> Option<std::io::Result<Sweeper>> {
        let _ = interval;
        None
    }

    /// [`start_sweeper`](RateLimitBackend::start_sweeper) for the backend shared through this
    /// `Arc`, which a sweeping thread can hold (weakly) alongside its other users. The default is
    /// `None`.
    fn start_shared_sweeper(
        self: &Arc<Self>,
        interval: Duration,
    ) -> Option<std::io::Result<Sweeper>> {
        let _ = interval;
        None
    }
}

impl<K, P, C, S> RateLimitBackend<K, P> for RateLimiterService<K, P, C, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    P: Eq + fmt::Debug + Send + Sync + 'static,
    C: Clock + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    type Error = ServiceError;
    type Future = Ready<Result<Decision, ServiceError>>;

    #[inline]
    fn check(&self, key: &K, plan: &P, cost: u64) -> Self::Future {
        ready(self.acquire(key, plan, cost))
    }

    /// Plans of several limits send one list item per limit, from `ratelimit_headers`; one
    /// limit's fields come from its decision.
    fn limit_fields(&self, key: &K, plan: &P, policy: &str) -> Option<(String, String)> {
        if !self.has_several_limits(plan) {
            return None;
        }
        self.ratelimit_headers(key, plan, policy).ok()
    }

    /// The sliding log counts the permits left by searching its ring, which a caller that sends
    /// no remaining count need not pay for; the one-word methods report them for free.
    #[inline]
    fn check_without_remaining(&self, key: &K, plan: &P, cost: u64) -> Self::Future {
        if cost != 1 || self.algorithm() != Algorithm::SlidingWindowLog {
            return self.check(key, plan, cost);
        }
        ready(self.acquire_one_uncounted(key, plan))
    }

    /// A [`Sweeper`]: the service keeps every client it has seen until swept.
    fn start_shared_sweeper(
        self: &Arc<Self>,
        interval: Duration,
    ) -> Option<std::io::Result<Sweeper>> {
        Some(Sweeper::start(self, interval))
    }
}

impl<K, P, B: RateLimitBackend<K, P> + ?Sized> RateLimitBackend<K, P> for Arc<B> {
    type Error = B::Error;
    type Future = B::Future;

    #[inline]
    fn check(&self, key: &K, plan: &P, cost: u64) -> Self::Future {
        (**self).check(key, plan, cost)
    }

    #[inline]
    fn check_without_remaining(&self, key: &K, plan: &P, cost: u64) -> Self::Future {
        (**self).check_without_remaining(key, plan, cost)
    }

    fn limit_fields(&self, key: &K, plan: &P, policy: &str) -> Option<(String, String)> {
        (**self).limit_fields(key, plan, policy)
    }

    fn start_sweeper(&self, interval: Duration) -> Option<std::io::Result<Sweeper>> {
        B::start_shared_sweeper(self, interval)
    }
}
