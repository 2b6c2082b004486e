//! [`RateLimitLayer`] and its builder.

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Response};
use tower_layer::Layer;

use super::backend::{KnownPlan, RateLimitBackend};
use super::error::SetupError;
use super::fields::PolicyValue;
use super::key::{KeyExtractor, RequestHead};
use super::response::{BodyFormat, Fallback, Limited, PolicyName, PolicyNames};
use super::service::RateLimit;
use super::stats::{Counters, RateLimitStats, Sampler, Shadow};
use crate::{Clock, RateLimiterService, Settings, Sweeper};

type PlanFn<P> = dyn Fn(&RequestHead<'_>) -> Option<P> + Send + Sync;
type CostFn = dyn Fn(&RequestHead<'_>) -> u64 + Send + Sync;
type LimitedFn = dyn Fn(&Limited<'_>) -> Response<Bytes> + Send + Sync;
/// The builder [`RateLimitLayer::from_settings`] returns.
type SettingsBuilder<K, P, C, X> = RateLimitLayerBuilder<Arc<RateLimiterService<K, P, C>>, X, P>;

/// The request header that marks a request let through by shadow mode although over its limit;
/// its value is the `RateLimit` field the client would have been sent. Removed from every request
/// the layer sees before it adds its own, so that the upstream can trust it.
pub const SHADOWED_HEADER: HeaderName = HeaderName::from_static("x-ratelimit-shadowed");

/// How often a layer sweeps idle clients out of an in-process service it shares (see
/// [`RateLimitLayerBuilder::build`]): often enough that memory follows the number of active
/// clients within seconds, rarely enough that the sweep's walk over the map costs nothing
/// measurable.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(10);

/// Everything a layer's services share, behind one `Arc`.
pub(crate) struct Config<Bk, X, P> {
    pub(crate) backend: Bk,
    pub(crate) extractor: X,
    pub(crate) default_plan: P,
    /// The default plan as the backend looked it up when the layer was built.
    pub(crate) known_default: Option<KnownPlan>,
    pub(crate) policy_names: PolicyNames<P>,
    /// The default plan's `RateLimit-Policy` value, once a response has written it.
    pub(crate) default_policy_value: PolicyValue,
    pub(crate) plan_fn: Option<Box<PlanFn<P>>>,
    pub(crate) cost_fn: Option<Box<CostFn>>,
    pub(crate) on_limited: Option<Box<LimitedFn>>,
    pub(crate) body_format: BodyFormat,
    pub(crate) headers_on_allowed: bool,
    pub(crate) on_missing_key: Fallback,
    pub(crate) on_error: Fallback,
    pub(crate) sampler: Sampler,
    pub(crate) shadow_header: HeaderName,
    pub(crate) counters: Counters,
    /// Held for its lifetime: the sweeping thread stops when the last service is dropped.
    pub(crate) sweeper: Option<Sweeper>,
}

impl<Bk: fmt::Debug, X: fmt::Debug, P: fmt::Debug> fmt::Debug for Config<Bk, X, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("backend", &self.backend)
            .field("extractor", &self.extractor)
            .field("default_plan", &self.default_plan)
            .field("known_default", &self.known_default)
            .field("policy_names", &self.policy_names)
            .field("plan_fn", &self.plan_fn.is_some())
            .field("cost_fn", &self.cost_fn.is_some())
            .field("on_limited", &self.on_limited.is_some())
            .field("body_format", &self.body_format)
            .field("headers_on_allowed", &self.headers_on_allowed)
            .field("on_missing_key", &self.on_missing_key)
            .field("on_error", &self.on_error)
            .field("sampler", &self.sampler)
            .field("sweeper", &self.sweeper.is_some())
            .finish()
    }
}

/// A [`Layer`] that limits requests per client: over its limit, a client is answered `429 Too
/// Many Requests` (or gRPC `RESOURCE_EXHAUSTED`) with `Retry-After` and the IETF `RateLimit`
/// fields, and the inner service is not called.
///
/// Cheap to clone (one `Arc`); every service it makes shares one backend, so a limit holds across
/// connections and clones. Made with [`RateLimitLayer::from_settings`],
/// [`RateLimitLayer::builder`] or [`RateLimitLayer::builder_display_names`]; whichever made it, a
/// layer over an in-process service it shares (an `Arc<RateLimiterService>`) sweeps its idle
/// clients out for as long as it lives.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use tollgate::tower::{ClientIp, ClientKey, RateLimitLayer};
/// use tollgate::{MonotonicClock, RateLimiterService, Rule};
///
/// let service = Arc::new(RateLimiterService::<ClientKey, _>::new(
///     "token_bucket".parse()?, // the method, named as a settings file names it
///     [("free", Rule::per_second(5)?)],
///     MonotonicClock::new(),
/// )?);
/// let layer = RateLimitLayer::builder(service, ClientIp::peer(), "free")
///     .headers_on_allowed(true)
///     .build();
/// // axum::Router::new().route(...).layer(layer)
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RateLimitLayer<Bk, X, P> {
    config: Arc<Config<Bk, X, P>>,
}

impl<Bk, X, P> Clone for RateLimitLayer<Bk, X, P> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            config: Arc::clone(&self.config),
        }
    }
}

impl<Bk: fmt::Debug, X: fmt::Debug, P: fmt::Debug> fmt::Debug for RateLimitLayer<Bk, X, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("config", &self.config)
            .finish()
    }
}

impl<Bk, X, P> RateLimitLayer<Bk, X, P> {
    /// A builder for a layer asking `backend` for decisions, keying requests with `extractor`,
    /// and limiting each by `default_plan` unless [`plan_fn`](RateLimitLayerBuilder::plan_fn)
    /// picks another. The `RateLimit` fields name each plan by its [`PolicyName`].
    pub fn builder(backend: Bk, extractor: X, default_plan: P) -> RateLimitLayerBuilder<Bk, X, P>
    where
        P: PolicyName,
    {
        Self::builder_naming(backend, extractor, default_plan, PolicyNames::own())
    }

    /// As [`RateLimitLayer::builder`], for plans named in the `RateLimit` fields by their
    /// `Display` form (written when a field is sent): a plan enum needs no [`PolicyName`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::fmt;
    /// use std::sync::Arc;
    /// use tollgate::tower::{ClientKey, GlobalKey, RateLimitLayer};
    /// use tollgate::{MonotonicClock, RateLimiterService, Rule};
    ///
    /// #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    /// enum Plan { Free, Pro }
    ///
    /// impl fmt::Display for Plan {
    ///     fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    ///         f.write_str(match self { Plan::Free => "free", Plan::Pro => "pro" })
    ///     }
    /// }
    ///
    /// let service = Arc::new(RateLimiterService::<ClientKey, _>::new(
    ///     "token_bucket".parse()?, // the method, named as a settings file names it
    ///     [(Plan::Free, Rule::per_second(5)?), (Plan::Pro, Rule::per_second(50)?)],
    ///     MonotonicClock::new(),
    /// )?);
    /// let layer = RateLimitLayer::builder_display_names(service, GlobalKey, Plan::Free).build();
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder_display_names(
        backend: Bk,
        extractor: X,
        default_plan: P,
    ) -> RateLimitLayerBuilder<Bk, X, P>
    where
        P: fmt::Display,
    {
        Self::builder_naming(backend, extractor, default_plan, PolicyNames::display())
    }

    fn builder_naming(
        backend: Bk,
        extractor: X,
        default_plan: P,
        policy_names: PolicyNames<P>,
    ) -> RateLimitLayerBuilder<Bk, X, P> {
        RateLimitLayerBuilder {
            sweep_by_default: true,
            config: Config {
                backend,
                extractor,
                default_plan,
                known_default: None,
                policy_names,
                default_policy_value: PolicyValue::default(),
                plan_fn: None,
                cost_fn: None,
                on_limited: None,
                body_format: BodyFormat::Text,
                headers_on_allowed: false,
                on_missing_key: Fallback::Reject(http::StatusCode::BAD_REQUEST),
                on_error: Fallback::Reject(http::StatusCode::SERVICE_UNAVAILABLE),
                sampler: Sampler::new(Shadow::OFF),
                shadow_header: SHADOWED_HEADER,
                counters: Counters::new(),
                sweeper: None,
            },
        }
    }

    /// What the layer has done so far, summed over every service it made.
    pub fn stats(&self) -> RateLimitStats {
        self.config.counters.totals()
    }

    /// The backend that decides.
    pub fn backend(&self) -> &Bk {
        &self.config.backend
    }

    /// The default plan as the backend found it when the layer was built.
    #[cfg(test)]
    pub(crate) fn known_default(&self) -> Option<KnownPlan> {
        self.config.known_default
    }
}

impl<K, P, C, X> RateLimitLayer<Arc<RateLimiterService<K, P, C>>, X, P>
where
    K: Hash + Eq + Send + Sync + 'static,
    P: Clone + Eq + fmt::Debug + Send + Sync + 'static,
    C: Clock + 'static,
    X: KeyExtractor<Key = K>,
{
    /// A builder for a layer over a service made from `settings` (the plans and windows of a
    /// settings file, each file plan name paired with the program's plan value in `plans`), with
    /// idle clients swept out every [`DEFAULT_SWEEP_INTERVAL`] for as long as the layer lives.
    /// The `RateLimit` fields name each plan as the settings file does: a plan enum needs no
    /// [`PolicyName`].
    ///
    /// # Errors
    ///
    /// When the settings do not match `plans` (see
    /// [`Settings::build_service_with_plans`]), or the sweeping thread cannot start.
    pub fn from_settings<'n>(
        settings: &Settings,
        clock: C,
        plans: impl IntoIterator<Item = (&'n str, P)>,
        extractor: X,
        default_plan: P,
    ) -> Result<SettingsBuilder<K, P, C, X>, SetupError> {
        let plans: Vec<(&str, P)> = plans.into_iter().collect();
        let names = plans
            .iter()
            .map(|(name, plan)| (plan.clone(), Box::from(*name)))
            .collect();
        let service = Arc::new(settings.build_service_with_plans(clock, plans)?);
        RateLimitLayer::builder_naming(service, extractor, default_plan, PolicyNames::table(names))
            .sweep_every(DEFAULT_SWEEP_INTERVAL)
            .map_err(SetupError::Sweeper)
    }
}

impl<S, Bk, X, P> Layer<S> for RateLimitLayer<Bk, X, P> {
    type Service = RateLimit<S, Bk, X, P>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, Arc::clone(&self.config))
    }
}

/// Builds a [`RateLimitLayer`]; made by [`RateLimitLayer::builder`].
pub struct RateLimitLayerBuilder<Bk, X, P> {
    config: Config<Bk, X, P>,
    /// Whether [`build`](RateLimitLayerBuilder::build) starts the backend's sweep, if it has one
    /// and none was started yet.
    sweep_by_default: bool,
}

impl<Bk: fmt::Debug, X: fmt::Debug, P: fmt::Debug> fmt::Debug for RateLimitLayerBuilder<Bk, X, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("config", &self.config)
            .field("sweep_by_default", &self.sweep_by_default)
            .finish()
    }
}

impl<Bk, X, P> RateLimitLayerBuilder<Bk, X, P> {
    /// Picks each request's plan with `plan_fn`; `None` means the default plan. The plan is
    /// picked for every request: a plan type that is cheap to make (an enum, a `&'static str`)
    /// keeps it free.
    pub fn plan_fn(
        mut self,
        plan_fn: impl Fn(&RequestHead<'_>) -> Option<P> + Send + Sync + 'static,
    ) -> Self {
        self.config.plan_fn = Some(Box::new(plan_fn));
        self
    }

    /// Charges each request `cost_fn`'s permits instead of 1 (0 lets a request through without
    /// taking any; more than the plan's limit is refused for good).
    pub fn cost_fn(
        mut self,
        cost_fn: impl Fn(&RequestHead<'_>) -> u64 + Send + Sync + 'static,
    ) -> Self {
        self.config.cost_fn = Some(Box::new(cost_fn));
        self
    }

    /// Also sends `RateLimit-Policy` and `RateLimit` on responses within the limit (default: only
    /// on refusals). Costs a few small allocations per request: the decision the fields are
    /// written from, and the fields. A request let through by shadow
    /// mode although over its limit gets neither, nor `Retry-After`: its response says what the
    /// client may do, and it was not refused.
    pub fn headers_on_allowed(mut self, on: bool) -> Self {
        self.config.headers_on_allowed = on;
        self
    }

    /// The body of the layer's own 429 (default [`BodyFormat::Text`]).
    pub fn body_format(mut self, format: BodyFormat) -> Self {
        self.config.body_format = format;
        self
    }

    /// Answers requests over their limit with `on_limited`'s response instead of the layer's
    /// own (see [`Limited::default_response`] to start from it). The response is sent as is: add
    /// [`Limited::headers`] to keep the `Retry-After` and `RateLimit` fields.
    pub fn on_limited(
        mut self,
        on_limited: impl Fn(&Limited<'_>) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.config.on_limited = Some(Box::new(on_limited));
        self
    }

    /// What to do with a request whose client key cannot be found. Default:
    /// `Fallback::Reject(StatusCode::BAD_REQUEST)`, because letting unidentified requests through
    /// unlimited would let any client escape its limit by hiding what identifies it.
    pub fn on_missing_key(mut self, fallback: Fallback) -> Self {
        self.config.on_missing_key = fallback;
        self
    }

    /// What to do when the backend cannot decide (a plan without a rule; a shared store that
    /// cannot be reached). Default: `Fallback::Reject(StatusCode::SERVICE_UNAVAILABLE)`.
    pub fn on_error(mut self, fallback: Fallback) -> Self {
        self.config.on_error = fallback;
        self
    }

    /// Runs in shadow mode: checks and refuses only the fractions `shadow` says (default: every
    /// request checked, every limited one refused). A limited request let through is marked for
    /// the upstream with the [shadow header](RateLimitLayerBuilder::shadow_header); its client is
    /// sent no rate-limit field at all.
    pub fn shadow(mut self, shadow: Shadow) -> Self {
        self.config.sampler = Sampler::new(shadow);
        self
    }

    /// The request header marking requests let through by shadow mode (default
    /// [`SHADOWED_HEADER`]). The layer removes it from every request it sees before adding its
    /// own, so a mark the upstream receives was written by the layer, never by a client.
    ///
    /// Give each layer of a stack a name of its own: a layer inside another removes the outer
    /// one's mark as it would a client's. And never the name of a field a key is read from
    /// ([`HeaderKey`](super::HeaderKey)): it is removed before the key is read. Only the
    /// request's header fields are cleaned, not its trailers: an upstream should read the mark
    /// from the header fields alone.
    pub fn shadow_header(mut self, name: HeaderName) -> Self {
        self.config.shadow_header = name;
        self
    }

    /// Leaves idle clients in the backend: for a service that is swept elsewhere (by a
    /// [`Sweeper`] of its own, or another layer over it).
    pub fn without_sweep(mut self) -> Self {
        self.sweep_by_default = false;
        self.config.sweeper = None;
        self
    }

    /// The layer. Unless [`without_sweep`](RateLimitLayerBuilder::without_sweep) or
    /// [`sweep_every`](RateLimitLayerBuilder::sweep_every) said otherwise, it sweeps idle clients
    /// out of its backend every [`DEFAULT_SWEEP_INTERVAL`] for as long as it lives, if the
    /// backend keeps them in this process and shares them (an `Arc<RateLimiterService>`; see
    /// [`RateLimitBackend::start_sweeper`]). Should the OS refuse the sweeping thread, the layer
    /// works without it and says so on stderr, once.
    pub fn build(mut self) -> RateLimitLayer<Bk, X, P>
    where
        X: KeyExtractor,
        Bk: RateLimitBackend<X::Key, P>,
    {
        if self.sweep_by_default && self.config.sweeper.is_none() {
            match self.config.backend.start_sweeper(DEFAULT_SWEEP_INTERVAL) {
                Some(Ok(sweeper)) => self.config.sweeper = Some(sweeper),
                // Not worth failing the server for (idle clients then stay in memory until their
                // limiter is used again), but not silently either.
                Some(Err(error)) => eprintln!(
                    "tollgate: the rate-limit layer cannot start its sweep of idle clients \
                     ({error}): they stay in memory; build it with sweep_every to see this error"
                ),
                None => {}
            }
        }
        self.config.known_default = self.config.backend.known_plan(&self.config.default_plan);
        RateLimitLayer {
            config: Arc::new(self.config),
        }
    }
}

impl<K, P, C, S, X> RateLimitLayerBuilder<Arc<RateLimiterService<K, P, C, S>>, X, P>
where
    K: Hash + Eq + Send + Sync + 'static,
    P: Eq + fmt::Debug + Send + Sync + 'static,
    C: Clock + 'static,
    S: std::hash::BuildHasher + Send + Sync + 'static,
{
    /// Sweeps idle clients out of the service every `interval` (instead of
    /// [`DEFAULT_SWEEP_INTERVAL`]), on a thread that lives as long as the layer (see [`Sweeper`]).
    ///
    /// # Errors
    ///
    /// When `interval` is zero or the thread cannot start.
    pub fn sweep_every(mut self, interval: Duration) -> std::io::Result<Self> {
        self.config.sweeper = Some(Sweeper::start(&self.config.backend, interval)?);
        Ok(self)
    }
}
