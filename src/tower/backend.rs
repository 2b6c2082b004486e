//! [`RateLimitBackend`]: what the layer asks for a decision, so that the in-process
//! [`RateLimiterService`] and a store shared between servers fit the same layer.

use std::fmt;
use std::future::{Future, Ready, ready};
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::time::Duration;

use crate::verdict::{Figures, Verdict};
use crate::{Clock, RateLimiterService, ServiceError, Sweeper};

/// A source of decisions: takes `cost` permits for `key` under `plan`, and answers with what
/// the response needs, in one call per request.
///
/// The future must be `Unpin` (box it if it is not): the layer polls it once in place, and only
/// if it is not ready moves it, with the request, into the response future. A backend whose
/// future is always ready, as the in-process service's, therefore costs the layer no allocation
/// and no clone of the inner service.
pub trait RateLimitBackend<K, P> {
    /// Why no decision could be made (an unknown plan; a store that cannot be reached).
    type Error: fmt::Display;
    /// The verdict to come.
    type Future: Future<Output = Result<Verdict, Self::Error>> + Unpin;

    /// Takes `cost` permits for `key` under `plan`'s limits, all or nothing. `figures` says which
    /// verdicts the response reports: under [`Figures::OnRefusal`] a grant may answer
    /// [`Verdict::allowed`], which reports nothing and costs nothing. A reported verdict carries
    /// the decision and, for a plan of several limits, each limit's figures as they stand after
    /// it (`Verdict::from(decision)` where the decision says all); a refusal is always reported.
    fn check(&self, key: &K, plan: &P, cost: u64, figures: Figures) -> Self::Future;

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
    type Future = Ready<Result<Verdict, ServiceError>>;

    /// One lookup, which answers the decision and, for a plan of several limits, reads each
    /// limit's figures from the client's entry right after it.
    #[inline]
    fn check(&self, key: &K, plan: &P, cost: u64, figures: Figures) -> Self::Future {
        ready(self.acquire_verdict(key, plan, cost, figures))
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
    fn check(&self, key: &K, plan: &P, cost: u64, figures: Figures) -> Self::Future {
        (**self).check(key, plan, cost, figures)
    }

    fn start_sweeper(&self, interval: Duration) -> Option<std::io::Result<Sweeper>> {
        B::start_shared_sweeper(self, interval)
    }
}
