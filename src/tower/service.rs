//! [`RateLimit`]: the middleware service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use tower_service::Service;

use super::backend::RateLimitBackend;
use super::body::ResponseBody;
use super::fields::{LimitFields, PolicyValue, ratelimit_value};
use super::future::{ResponseFuture, answer, pass};
use super::key::{KeyExtractor, RequestHead};
use super::layer::Config;
use super::response::{Fallback, Limited, Protocol, default_response, refusal};
use super::stats::{Count, RateLimitStats};
use crate::verdict::{Figures, Verdict};

/// Rate limits the requests to `S`; made by [`RateLimitLayer`](super::RateLimitLayer).
///
/// Each request is keyed, given a plan and a cost, and checked; within its limit it goes to `S`,
/// over it the layer answers itself and `S` is not called. The check never panics and never
/// answers a bare 500: a request without a key and a failed check get the answers the layer was
/// configured with.
pub struct RateLimit<S, Bk, X, P> {
    inner: S,
    config: Arc<Config<Bk, X, P>>,
}

impl<S: Clone, Bk, X, P> Clone for RateLimit<S, Bk, X, P> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: fmt::Debug, Bk: fmt::Debug, X: fmt::Debug, P: fmt::Debug> fmt::Debug
    for RateLimit<S, Bk, X, P>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

impl<S, Bk, X, P> RateLimit<S, Bk, X, P> {
    pub(crate) fn new(inner: S, config: Arc<Config<Bk, X, P>>) -> Self {
        RateLimit { inner, config }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// What the layer has done so far, summed over every service it made.
    pub fn stats(&self) -> RateLimitStats {
        self.config.counters.totals()
    }
}

/// What to do with a request once its check is done.
enum Action {
    /// Call the inner service, adding these fields to its response.
    Pass(Option<Box<LimitFields>>),
    /// Answer with this. (Boxed, as the fields: the common path then moves a few words, not
    /// a few hundred bytes.)
    Answer(Box<Response<Bytes>>),
}

impl<Bk, X, P> Config<Bk, X, P> {
    /// Which verdicts' figures the layer's responses report.
    fn figures(&self) -> Figures {
        if self.headers_on_allowed {
            Figures::Always
        } else {
            Figures::OnRefusal
        }
    }

    /// The default plan's kept `RateLimit-Policy` value, for a request under the default plan.
    fn kept_policy_value(&self, default_plan: bool) -> Option<&PolicyValue> {
        default_plan.then_some(&self.default_policy_value)
    }

    /// What to do with `request` after its check answered `checked`, under the policy named
    /// `policy` (the default plan's if `default_plan`).
    fn action<B, E: fmt::Display>(
        &self,
        checked: Result<Verdict, E>,
        request: &mut Request<B>,
        policy: &str,
        default_plan: bool,
    ) -> Action {
        let verdict = match checked {
            Ok(verdict) => verdict,
            Err(_) => {
                self.counters.add(Count::Errors);
                return self.fall_back(self.on_error, request, "rate limit check failed");
            }
        };
        let reported = match verdict.reported() {
            Some(reported) if reported.decision().is_denied() => reported,
            allowed => {
                self.counters.add(Count::Allowed);
                return Action::Pass(allowed.filter(|_| self.headers_on_allowed).map(|reported| {
                    let kept = self.kept_policy_value(default_plan);
                    Box::new(LimitFields::of(reported, policy, kept))
                }));
            }
        };
        if self.sampler.enforce_next() {
            self.counters.add(Count::Enforced);
            let protocol = Protocol::of(request.headers());
            let response = match &self.on_limited {
                Some(on_limited) => on_limited(&Limited::new(reported, policy, protocol)),
                None => default_response(
                    reported,
                    policy,
                    self.kept_policy_value(default_plan),
                    &protocol,
                    self.body_format,
                ),
            };
            return Action::Answer(Box::new(response));
        }
        self.counters.add(Count::Shadowed);
        // Shadow mode: through, but marked for the upstream with what the client would have been
        // told. The client is told nothing: its response carries no `Retry-After` and no
        // `RateLimit` fields, which would announce a refusal it did not get (and make a
        // well-behaved client back off from a limit that is not enforced).
        let mark =
            ratelimit_value(reported, policy).unwrap_or(const { HeaderValue::from_static("1") });
        request
            .headers_mut()
            .insert(self.shadow_header.clone(), mark);
        Action::Pass(None)
    }

    fn fall_back<B>(&self, fallback: Fallback, request: &Request<B>, message: &str) -> Action {
        match fallback {
            Fallback::Allow => Action::Pass(None),
            Fallback::Reject(status) => Action::Answer(Box::new(refusal(
                status,
                &Protocol::of(request.headers()),
                message,
            ))),
        }
    }
}

impl<S, Bk, X, P, ReqB, ResB> Service<Request<ReqB>> for RateLimit<S, Bk, X, P>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: 'static,
    ReqB: Send + 'static,
    ResB: 'static,
    Bk: RateLimitBackend<X::Key, P> + Send + Sync + 'static,
    Bk::Future: Send + 'static,
    X: KeyExtractor + Send + Sync + 'static,
    P: Send + Sync + 'static,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResB, S::Error>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqB>) -> Self::Future {
        let config = &*self.config;
        // The shadow mark is the layer's alone: one a client wrote never reaches the upstream,
        // whatever becomes of the request, so that the upstream can trust it.
        remove_field(request.headers_mut(), &config.shadow_header);
        if !config.sampler.check_next() {
            config.counters.add(Count::Unchecked);
            return ResponseFuture::inner(self.inner.call(request), None);
        }
        let head = RequestHead::of(&request);
        let Some(key) = config.extractor.extract(&head) else {
            config.counters.add(Count::Unkeyed);
            // Where the cause is the server's setup (an address it does not record), the answer
            // says what was looked for, so that the mistake shows on the first request.
            let why = config
                .extractor
                .why_no_key()
                .unwrap_or("the request does not identify its client");
            return match config.fall_back(config.on_missing_key, &request, why) {
                Action::Pass(_) => ResponseFuture::inner(self.inner.call(request), None),
                Action::Answer(response) => ResponseFuture::answer(response),
            };
        };
        let chosen = config.plan_fn.as_ref().and_then(|plan_fn| plan_fn(&head));
        let cost = config.cost_fn.as_ref().map_or(1, |cost_fn| cost_fn(&head));
        let plan = chosen.as_ref().unwrap_or(&config.default_plan);
        let figures = config.figures();
        let mut check = match config.known_default.filter(|_| chosen.is_none()) {
            // The default plan, as the backend found it when the layer was built.
            Some(known) => config.backend.check_known(&key, plan, known, cost, figures),
            None => config.backend.check(&key, plan, cost, figures),
        };
        // One poll in place: the in-process backend is always ready, and then nothing is boxed
        // and the inner service is called without being cloned.
        let mut noop = Context::from_waker(Waker::noop());
        if let Poll::Ready(checked) = Pin::new(&mut check).poll(&mut noop) {
            // The common case, kept inline: allowed, nothing to add.
            if !config.headers_on_allowed
                && let Ok(verdict) = &checked
                && verdict.is_allowed()
            {
                config.counters.add(Count::Allowed);
                return ResponseFuture::inner(self.inner.call(request), None);
            }
            let policy = config.policy_names.name(plan);
            return match config.action(checked, &mut request, &policy, chosen.is_none()) {
                Action::Pass(fields) => ResponseFuture::inner(self.inner.call(request), fields),
                Action::Answer(response) => ResponseFuture::answer(response),
            };
        }
        let policy = config.policy_names.name(plan).into_owned();
        self.call_later(check, request, policy, chosen.is_none())
    }
}

/// Removes every `name` field from `headers`. A request seldom carries it, and the map's own
/// lookup hashes a name of the user's choosing byte by byte (about 170 instructions for
/// `x-ratelimit-shadowed`), where a comparison of names is a few (a tag for a standard name, a
/// length for most others): among a few fields, their names are compared first.
#[inline]
fn remove_field(headers: &mut HeaderMap, name: &HeaderName) {
    /// The most fields whose names are compared (some 10 instructions each) before the lookup.
    const COMPARED: usize = 16;
    if headers.keys_len() > COMPARED || headers.keys().any(|present| present == name) {
        headers.remove(name);
    }
}

impl<S, Bk, X, P> RateLimit<S, Bk, X, P> {
    /// The call of a request whose check is still pending: out of line, so the common path
    /// keeps the request in place instead of making room for this one's move into a box.
    #[cold]
    #[inline(never)]
    fn call_later<ReqB, ResB, F, E>(
        &mut self,
        check: F,
        mut request: Request<ReqB>,
        policy: String,
        default_plan: bool,
    ) -> ResponseFuture<S::Future, ResB, S::Error>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: 'static,
        ReqB: Send + 'static,
        ResB: 'static,
        F: Future<Output = Result<Verdict, E>> + Send + 'static,
        E: fmt::Display,
        Bk: Send + Sync + 'static,
        X: Send + Sync + 'static,
        P: Send + Sync + 'static,
    {
        // Take the service made ready by `poll_ready` along, leaving a clone in its place (the
        // usual tower pattern for a call that starts later).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = Arc::clone(&self.config);
        ResponseFuture::pending(Box::pin(async move {
            let checked = check.await;
            match config.action(checked, &mut request, &policy, default_plan) {
                Action::Pass(fields) => Ok(pass(inner.call(request).await?, fields)),
                Action::Answer(response) => Ok(answer(*response)),
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A map of `others` fields `x-other-<n>` (two values each), with `name` (two values) among
    /// them after `before` of them, or not at all.
    fn fields(others: usize, name: Option<(&HeaderName, usize)>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for n in 0..=others {
            if let Some((name, before)) = name
                && n == before
            {
                headers.append(name, HeaderValue::from_static("forged"));
                headers.append(name, HeaderValue::from_static("forged again"));
            }
            if n < others {
                let other = HeaderName::try_from(format!("x-other-{n}")).expect("a valid name");
                headers.append(&other, HeaderValue::from_static("1"));
                headers.append(other, HeaderValue::from_static("2"));
            }
        }
        headers
    }

    #[test]
    fn a_field_is_removed_with_all_its_values_wherever_it_is_and_nothing_else_is() {
        let custom = HeaderName::from_static("x-ratelimit-shadowed");
        let standard = http::header::FORWARDED;
        // Fewer fields than are compared, as many, and more (then the map's own lookup).
        for others in [0, 1, 7, 15, 16, 17, 40] {
            for name in [&custom, &standard] {
                for before in [0, others / 2, others] {
                    let mut headers = fields(others, Some((name, before)));
                    assert_eq!(headers.get_all(name).iter().count(), 2);
                    remove_field(&mut headers, name);
                    assert_eq!(
                        headers,
                        fields(others, None),
                        "{name} after {before} of {others} other fields"
                    );
                }
                let mut without = fields(others, None);
                remove_field(&mut without, name);
                assert_eq!(without, fields(others, None));
            }
        }
    }
}
