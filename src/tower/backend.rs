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

    /// `plan` looked up once, ahead of the requests under it, for
    /// [`check_known`](RateLimitBackend::check_known): the layer asks this for its default plan
    /// when it is built. `None`, the default, for a backend with nothing to look up.
    fn known_plan(&self, plan: &P) -> Option<KnownPlan> {
        let _ = plan;
        None
    }

    /// [`check`](RateLimitBackend::check) of `plan`, which this backend's
    /// [`known_plan`](RateLimitBackend::known_plan) answered `known` for: the same verdict,
    /// without looking `plan` up again. The default is `check`.
    fn check_known(
        &self,
        key: &K,
        plan: &P,
        known: KnownPlan,
        cost: u64,
        figures: Figures,
    ) -> Self::Future {
        let _ = known;
        self.check(key, plan, cost, figures)
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

/// A plan a backend looked up once ([`RateLimitBackend::known_plan`]): for the in-process
/// [`RateLimiterService`], the plan's place in its table, so that a request under the layer's
/// default plan is not compared with each plan in turn (for a `&str` plan, a comparison of its
/// bytes). Only the service that made it uses the place; another looks the plan up as usual.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownPlan {
    /// The number of the service that found it.
    service: u64,
    /// Its index in that service's plan table.
    index: usize,
}

impl<K, P, C, S> RateLimitBackend<K, P> for RateLimiterService<K, P, C, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    P: Eq + fmt::Debug + Send + Sync + 'static,
    C: Clock + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    /// Boxed: an error is rare, and a [`ServiceError`] inline (88 bytes) makes every result the
    /// layer moves as large, where a boxed one leaves it two words, in registers.
    type Error = Box<ServiceError>;
    type Future = Ready<Result<Verdict, Box<ServiceError>>>;

    /// One lookup, which answers the decision and, for a plan of several limits, reads each
    /// limit's figures from the client's entry right after it.
    #[inline]
    fn check(&self, key: &K, plan: &P, cost: u64, figures: Figures) -> Self::Future {
        ready(
            self.acquire_verdict(key, plan, cost, figures)
                .map_err(Box::new),
        )
    }

    fn known_plan(&self, plan: &P) -> Option<KnownPlan> {
        self.plan_found(plan)
            .map(|(service, index)| KnownPlan { service, index })
    }

    #[inline]
    fn check_known(
        &self,
        key: &K,
        plan: &P,
        known: KnownPlan,
        cost: u64,
        figures: Figures,
    ) -> Self::Future {
        ready(
            self.acquire_verdict_in(key, plan, (known.service, known.index), cost, figures)
                .map_err(Box::new),
        )
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

    fn known_plan(&self, plan: &P) -> Option<KnownPlan> {
        (**self).known_plan(plan)
    }

    #[inline]
    fn check_known(
        &self,
        key: &K,
        plan: &P,
        known: KnownPlan,
        cost: u64,
        figures: Figures,
    ) -> Self::Future {
        (**self).check_known(key, plan, known, cost, figures)
    }

    fn start_sweeper(&self, interval: Duration) -> Option<std::io::Result<Sweeper>> {
        B::start_shared_sweeper(self, interval)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Algorithm, FakeClock, Rule};

    /// A service of plans `one` (1 a second) and `five` (5 a second), in the order given.
    fn service(plans: [&'static str; 2]) -> RateLimiterService<u64, &'static str, FakeClock> {
        let rule = |plan| Rule::per_second(if plan == "one" { 1 } else { 5 }).expect("a rule");
        RateLimiterService::new(
            Algorithm::TokenBucket,
            plans.map(|plan| (plan, rule(plan))),
            FakeClock::new(),
        )
        .expect("valid plans")
    }

    /// Requests of client 7 under `plan` granted out of 10, each checked by `check`.
    fn granted(check: impl Fn() -> Ready<Result<Verdict, Box<ServiceError>>>) -> usize {
        (0..10)
            .filter(|_| check().into_inner().expect("a known plan").is_allowed())
            .count()
    }

    #[test]
    fn a_known_plan_decides_as_its_plan_does() {
        for plan in ["one", "five"] {
            let (looked_up, known) = (service(["one", "five"]), service(["one", "five"]));
            let found = known.known_plan(&plan).expect("the service has the plan");
            let by_name = granted(|| looked_up.check(&7, &plan, 1, Figures::OnRefusal));
            let by_place = granted(|| known.check_known(&7, &plan, found, 1, Figures::OnRefusal));
            assert_eq!(
                (by_place, by_name),
                (by_name, if plan == "one" { 1 } else { 5 })
            );
            let always = granted(|| known.check_known(&8, &plan, found, 1, Figures::Always));
            assert_eq!(always, by_name, "{plan}: with the figures of every verdict");
        }
    }

    /// A plan known to one service is at another place in another's table: that service looks
    /// the plan up by its name rather than decide under whichever plan is at that place.
    #[test]
    fn a_plan_known_to_another_service_is_looked_up_by_name() {
        let (first, second) = (service(["one", "five"]), service(["five", "one"]));
        let found = first.known_plan(&"one").expect("the service has the plan");
        assert_eq!(second.known_plan(&"one").map(|known| known.index), Some(1));
        assert_eq!(
            found.index, 0,
            "at the place of `five` in the second service"
        );
        let granted = granted(|| second.check_known(&7, &"one", found, 1, Figures::OnRefusal));
        assert_eq!(granted, 1, "the second service's `one`, not its `five`");
    }

    #[test]
    fn an_unknown_plan_is_not_known() {
        assert_eq!(service(["one", "five"]).known_plan(&"ten"), None);
    }
}

/// The layer's default plan, decided at the place its backend found for it.
#[cfg(test)]
mod layer_tests {
    use std::convert::Infallible;
    use std::future::Future;
    use std::pin::pin;
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};

    use http::{Request, Response, StatusCode};
    use tower::{Layer, Service, service_fn};

    use crate::tower::{ClientKey, GlobalKey, RateLimitLayer};
    use crate::{Algorithm, FakeClock, RateLimiterService, Rule};

    /// Statuses of 10 requests through a layer whose default plan is `default`, over a service of
    /// plans `one` (1 a second) then `five` (5 a second).
    fn statuses(default: &'static str) -> (bool, Vec<StatusCode>) {
        let service = Arc::new(
            RateLimiterService::<ClientKey, _, _>::new(
                Algorithm::TokenBucket,
                [
                    ("one", Rule::per_second(1).expect("a rule")),
                    ("five", Rule::per_second(5).expect("a rule")),
                ],
                FakeClock::new(),
            )
            .expect("valid plans"),
        );
        let layer = RateLimitLayer::builder(service, GlobalKey, default)
            .without_sweep()
            .build();
        let known = layer.known_default().is_some();
        let mut through = layer.layer(service_fn(|_: Request<()>| async {
            Ok::<_, Infallible>(Response::new(()))
        }));
        let mut cx = Context::from_waker(Waker::noop());
        let statuses = (0..10)
            .map(|_| {
                let future = pin!(through.call(Request::new(())));
                match future.poll(&mut cx) {
                    Poll::Ready(Ok(response)) => response.status(),
                    Poll::Ready(Err(never)) => match never {},
                    Poll::Pending => panic!("the in-process backend answers at once"),
                }
            })
            .collect();
        (known, statuses)
    }

    #[test]
    fn the_default_plan_is_found_once_and_decides_as_itself() {
        for (default, limit) in [("one", 1), ("five", 5)] {
            let (known, statuses) = statuses(default);
            assert!(known, "{default}: found when the layer was built");
            let allowed = statuses.iter().filter(|status| status.is_success()).count();
            assert_eq!(allowed, limit, "{default}: {statuses:?}");
            assert!(
                statuses[limit..]
                    .iter()
                    .all(|status| *status == StatusCode::TOO_MANY_REQUESTS),
                "{default}: {statuses:?}"
            );
        }
    }
}
