//! The layer's `RateLimit-Policy` field is always the one a fresh write for the response would
//! send, though the layer keeps its default plan's value once written: after rule changes back
//! and forth, between one limit and several, of a quota alone, of a window alone (also one that
//! rounds to the same whole seconds), of the limits' order, of a later limit only, of their
//! count; for the first response after a change; for plans chosen per request (the default plan
//! itself, or another plan of the same limits); under custom policy names (one that changes
//! between responses too); on the out-of-line path; and while threads send requests as another
//! changes the rule.
//!
//! Each test drives the layer's `tower::Service` with `http::Request`s over an upstream that
//! answers at once, under every method that can hold the rules. Every expected text is checked
//! against what a new layer, over a new service built with the rule, sends on its first response;
//! every response's `RateLimit` field must name the same items, in the same order, as its
//! `RateLimit-Policy` field. The fake clocks are never moved.

use std::collections::HashSet;
use std::convert::Infallible;
use std::fmt;
use std::future::{Future, Ready, ready};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::Empty;
use tollgate::tower::{
    ClientKey, Figures, HeaderKey, RateLimitBackend, RateLimitLayer, RateLimitLayerBuilder,
    ResponseBody, Verdict,
};
use tollgate::{Algorithm, FakeClock, RateLimiterService, Rule, ServiceBuilder, Settings};
use tower::{Layer as _, Service, ServiceExt};

type Backend = Arc<RateLimiterService<ClientKey, &'static str, FakeClock>>;

/// The header the tests key requests by.
const API_KEY: &str = "x-api-key";
/// The header naming the plan `plan_fn` chooses (none: the default plan).
const PLAN: &str = "x-plan";
/// More requests than any limit of the tests allows before a refusal.
const ENOUGH: usize = 20;

/// The upstream: answers 200 at once.
#[derive(Debug, Clone, Copy)]
struct Upstream;

impl Service<Request<()>> for Upstream {
    type Response = Response<Empty<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        ready(Ok(Response::new(Empty::new())))
    }
}

/// What a response says of the limit.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Answer {
    status: StatusCode,
    policy: Option<String>,
    state: Option<String>,
}

impl Answer {
    /// The `RateLimit-Policy` field, which the test expects to be there; checks that the
    /// `RateLimit` field names the same items in the same order.
    fn policy(&self) -> &str {
        let policy = self.policy.as_deref().expect("a RateLimit-Policy field");
        let state = self.state.as_deref().expect("a RateLimit field");
        assert_eq!(item_names(policy), item_names(state), "{policy} / {state}");
        policy
    }
}

/// The quoted names of a field's items, in order.
fn item_names(field: &str) -> Vec<&str> {
    field
        .split(", ")
        .map(|item| item.split_once(';').map_or(item, |(name, _)| name))
        .collect()
}

/// Sends a request keyed `key`, under the plan `plan` if any, through `service`.
async fn send<S>(service: &mut S, key: &str, plan: Option<&str>) -> Answer
where
    S: Service<Request<()>, Response = Response<ResponseBody<Empty<Bytes>>>, Error = Infallible>,
{
    let mut request = Request::builder().header(API_KEY, key);
    if let Some(plan) = plan {
        request = request.header(PLAN, plan);
    }
    let request = request.body(()).expect("a request");
    let response = service.ready().await.unwrap().call(request).await.unwrap();
    let field = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|value| value.to_str().expect("ASCII").to_owned())
    };
    Answer {
        status: response.status(),
        policy: field("ratelimit-policy"),
        state: field("ratelimit"),
    }
}

/// Sends requests keyed `key` through `service` until one is refused: the policy field of each
/// response that has one (the allowed ones' only with `headers_on_allowed`), the refusal's last.
async fn until_refused<S>(service: &mut S, key: &str, plan: Option<&str>) -> Vec<String>
where
    S: Service<Request<()>, Response = Response<ResponseBody<Empty<Bytes>>>, Error = Infallible>,
{
    let mut policies = Vec::new();
    for _ in 0..ENOUGH {
        let answer = send(service, key, plan).await;
        if answer.policy.is_some() {
            policies.push(answer.policy().to_owned());
        }
        if answer.status == StatusCode::TOO_MANY_REQUESTS {
            return policies;
        }
        assert_eq!(answer.status, StatusCode::OK);
    }
    panic!("no refusal in {ENOUGH} requests for {key}");
}

/// A service of `algorithm` with the plans `plans`, each of its limits (quotas and windows in
/// milliseconds).
fn service(algorithm: Algorithm, plans: &[(&'static str, &[(u64, u64)])]) -> Backend {
    let mut builder = ServiceBuilder::new(algorithm, FakeClock::new());
    for &(plan, limits) in plans {
        builder = builder.plan_limits(plan, rules(limits));
    }
    Arc::new(builder.build().expect("a service"))
}

/// A builder of a layer over `backend` limiting by `free` unless the request's `x-plan` names
/// another plan.
fn builder(backend: &Backend) -> RateLimitLayerBuilder<Backend, HeaderKey, &'static str> {
    let extractor = HeaderKey::new(HeaderName::from_static(API_KEY));
    RateLimitLayer::builder(Arc::clone(backend), extractor, "free").plan_fn(|head| {
        match head.headers().get(PLAN)?.as_bytes() {
            b"free" => Some("free"),
            b"twin" => Some("twin"),
            b"pro" => Some("pro"),
            other => panic!("no plan {other:?}"),
        }
    })
}

/// What a new layer sends on its first response under a plan named `plan` of `limits`, over a
/// new service of `algorithm`: a write with no history.
async fn fresh_policy(algorithm: Algorithm, plan: &'static str, limits: &[(u64, u64)]) -> String {
    let backend = service(algorithm, &[(plan, limits)]);
    let extractor = HeaderKey::new(HeaderName::from_static(API_KEY));
    let layer = RateLimitLayer::builder(backend, extractor, plan)
        .headers_on_allowed(true)
        .without_sweep()
        .build();
    let answer = send(&mut layer.layer(Upstream), "fresh", None).await;
    assert_eq!(answer.status, StatusCode::OK);
    answer.policy().to_owned()
}

/// Limits (each a quota and a window in milliseconds), and the `RateLimit-Policy` value of a
/// plan `free` of them.
type Step = (&'static [(u64, u64)], &'static str);

/// The rules of `limits`, each a quota and a window in milliseconds.
fn rules(limits: &[(u64, u64)]) -> Vec<Rule> {
    limits
        .iter()
        .map(|&(limit, millis)| Rule::new(limit, Duration::from_millis(millis)).expect("a rule"))
        .collect()
}

const A: Step = (&[(5, 1_000)], r#""free";q=5;w=1"#);
/// [`A`]'s window, another quota.
const B: Step = (&[(6, 1_000)], r#""free";q=6;w=1"#);
/// [`A`]'s quota, another window.
const C: Step = (&[(5, 2_000)], r#""free";q=5;w=2"#);
/// [`C`]'s quota and text, another window.
const D: Step = (&[(5, 1_500)], r#""free";q=5;w=2"#);
const SEVERAL: Step = (
    &[(2, 1_000), (7, 60_000)],
    r#""free-1s";q=2;w=1, "free-1m";q=7;w=60"#,
);
/// [`SEVERAL`]'s limits in the other order.
const REVERSED: Step = (
    &[(7, 60_000), (2, 1_000)],
    r#""free-1m";q=7;w=60, "free-1s";q=2;w=1"#,
);
/// [`SEVERAL`] with another quota of its second limit.
const SECOND_QUOTA: Step = (
    &[(2, 1_000), (8, 60_000)],
    r#""free-1s";q=2;w=1, "free-1m";q=8;w=60"#,
);
/// [`SEVERAL`] with another window of its second limit.
const SECOND_WINDOW: Step = (
    &[(2, 1_000), (7, 120_000)],
    r#""free-1s";q=2;w=1, "free-2m";q=7;w=120"#,
);
/// [`SEVERAL`] and one limit more.
const THREE: Step = (
    &[(2, 1_000), (7, 60_000), (9, 3_600_000)],
    r#""free-1s";q=2;w=1, "free-1m";q=7;w=60, "free-1h";q=9;w=3600"#,
);
/// [`A`] and one limit more.
const A_AND_MORE: Step = (
    &[(5, 1_000), (7, 60_000)],
    r#""free-1s";q=5;w=1, "free-1m";q=7;w=60"#,
);
/// Two limits of one window.
const SAME_WINDOW: Step = (
    &[(3, 1_000), (4, 1_000)],
    r#""free-1s-0";q=3;w=1, "free-1s-1";q=4;w=1"#,
);
/// [`SAME_WINDOW`]'s limits in the other order.
const SAME_WINDOW_REVERSED: Step = (
    &[(4, 1_000), (3, 1_000)],
    r#""free-1s-0";q=4;w=1, "free-1s-1";q=3;w=1"#,
);
/// A first window of 1.5 s, written `w=2`.
const ODD_WINDOW: Step = (
    &[(5, 1_500), (7, 60_000)],
    r#""free-1500ms";q=5;w=2, "free-1m";q=7;w=60"#,
);
/// [`ODD_WINDOW`]'s `w=2` of a window of 2 s.
const EVEN_WINDOW: Step = (
    &[(5, 2_000), (7, 60_000)],
    r#""free-2s";q=5;w=2, "free-1m";q=7;w=60"#,
);

/// The sequences of rules the default plan is given, the first when the layer is built.
const SEQUENCES: &[&[Step]] = &[
    &[A, B, A, C, A, D, C, A],
    &[A, SEVERAL, A, REVERSED, A],
    &[A, A_AND_MORE, A],
    &[A_AND_MORE, A, A_AND_MORE],
    &[SEVERAL, REVERSED, SEVERAL, A, SEVERAL],
    &[SEVERAL, SECOND_QUOTA, SEVERAL, SECOND_WINDOW, SEVERAL],
    &[SEVERAL, THREE, SEVERAL],
    &[THREE, SEVERAL, THREE],
    &[SAME_WINDOW, SAME_WINDOW_REVERSED, SAME_WINDOW],
    &[ODD_WINDOW, EVEN_WINDOW, ODD_WINDOW],
];

/// Whether `algorithm` can hold every rule of `sequence` (the sliding window log holds one
/// limit a plan).
fn holds(algorithm: Algorithm, sequence: &[Step]) -> bool {
    algorithm != Algorithm::SlidingWindowLog || sequence.iter().all(|(limits, _)| limits.len() == 1)
}

/// Every step's text is what a layer with no history sends for its rules.
#[tokio::test]
async fn the_expected_texts_are_those_of_a_fresh_write() {
    for algorithm in Algorithm::ALL {
        for &sequence in SEQUENCES
            .iter()
            .filter(|sequence| holds(algorithm, sequence))
        {
            for &(limits, text) in sequence {
                let fresh = fresh_policy(algorithm, "free", limits).await;
                assert_eq!(fresh, text, "{algorithm:?}");
            }
        }
    }
}

/// Under each sequence of rules, every response of the default plan, allowed and refused, of a
/// layer sending the fields on allowed responses and of one sending them on refusals alone (its
/// first value written by a refusal), sends the rule in force.
#[tokio::test]
async fn each_rule_of_the_default_plan_is_sent_as_its_own_text() {
    for algorithm in Algorithm::ALL {
        for (n, &sequence) in SEQUENCES.iter().enumerate() {
            if !holds(algorithm, sequence) {
                continue;
            }
            let backend = service(algorithm, &[("free", sequence[0].0)]);
            let mut shows = builder(&backend)
                .headers_on_allowed(true)
                .without_sweep()
                .build()
                .layer(Upstream);
            let mut quiet = builder(&backend).without_sweep().build().layer(Upstream);
            for (step, &(limits, text)) in sequence.iter().enumerate() {
                let at = format!("{algorithm:?}, sequence {n}, step {step}");
                backend
                    .set_limits(&"free", rules(limits))
                    .unwrap_or_else(|error| panic!("{at}: {error}"));
                // The quiet layer first: its first value is written by a refusal.
                let refused = until_refused(&mut quiet, &format!("quiet-{step}"), None).await;
                assert_eq!(refused, [text], "{at}");
                let policies = until_refused(&mut shows, &format!("shows-{step}"), None).await;
                assert!(policies.len() > 1, "{at}");
                for policy in policies {
                    assert_eq!(policy, text, "{at}");
                }
            }
        }
    }
}

/// A rule changed before the layer's first response: that response, and every later one, sends
/// the rule in force, not the one the layer was built under.
#[tokio::test]
async fn the_first_response_after_a_rule_change_sends_the_new_rule() {
    for algorithm in [Algorithm::TokenBucket, Algorithm::FixedWindow] {
        for (built, changed) in [(A, SEVERAL), (SEVERAL, A), (A, C), (SEVERAL, REVERSED)] {
            let backend = service(algorithm, &[("free", built.0)]);
            let mut shows = builder(&backend)
                .headers_on_allowed(true)
                .without_sweep()
                .build()
                .layer(Upstream);
            let mut quiet = builder(&backend).without_sweep().build().layer(Upstream);
            backend.set_limits(&"free", rules(changed.0)).unwrap();
            let answer = send(&mut shows, "first", None).await;
            assert_eq!(answer.policy(), changed.1, "{algorithm:?}");
            assert_eq!(until_refused(&mut quiet, "quiet", None).await, [changed.1]);
            backend.set_limits(&"free", rules(built.0)).unwrap();
            for key in ["again", "more"] {
                for policy in until_refused(&mut shows, key, None).await {
                    assert_eq!(policy, built.1, "{algorithm:?}");
                }
                assert_eq!(until_refused(&mut quiet, key, None).await, [built.1]);
            }
        }
    }
}

/// A plan chosen per request writes its own name, whether it is the default plan itself or
/// another of the same limits, before and after the default plan's value is kept, and across
/// rule changes of either.
#[tokio::test]
async fn a_plan_chosen_per_request_sends_its_own_name_and_rule() {
    for algorithm in Algorithm::ALL {
        let backend = service(
            algorithm,
            &[("free", A.0), ("twin", A.0), ("pro", &[(50, 1_000)])],
        );
        let mut layer = builder(&backend)
            .headers_on_allowed(true)
            .without_sweep()
            .build()
            .layer(Upstream);
        let twin_a = r#""twin";q=5;w=1"#;
        // The first response under another plan of the same limits, then under the default plan
        // chosen, then under the default plan.
        assert_eq!(send(&mut layer, "1", Some("twin")).await.policy(), twin_a);
        assert_eq!(send(&mut layer, "2", Some("free")).await.policy(), A.1);
        assert_eq!(send(&mut layer, "3", None).await.policy(), A.1);
        assert_eq!(send(&mut layer, "4", Some("twin")).await.policy(), twin_a);
        assert_eq!(
            send(&mut layer, "5", Some("pro")).await.policy(),
            r#""pro";q=50;w=1"#
        );
        // The default plan's rule changes: chosen or not, it sends the new one; the twin, the
        // old one under its own name.
        backend.set_rule(&"free", rules(B.0)[0]).unwrap();
        for plan in [None, Some("free"), None] {
            for policy in until_refused(&mut layer, &format!("b-{plan:?}"), plan).await {
                assert_eq!(policy, B.1, "{algorithm:?}, {plan:?}");
            }
        }
        for policy in until_refused(&mut layer, "twin", Some("twin")).await {
            assert_eq!(policy, twin_a, "{algorithm:?}");
        }
        // The twin takes the default plan's new rule, the default plan its first again.
        backend.set_rule(&"twin", rules(B.0)[0]).unwrap();
        backend.set_rule(&"free", rules(A.0)[0]).unwrap();
        for (plan, text) in [
            (Some("twin"), r#""twin";q=6;w=1"#),
            (None, A.1),
            (Some("free"), A.1),
        ] {
            for policy in until_refused(&mut layer, &format!("a-{plan:?}"), plan).await {
                assert_eq!(policy, text, "{algorithm:?}, {plan:?}");
            }
        }
    }
}

/// A layer whose first response is under the default plan chosen per request: the default
/// plan's later responses, after a rule change, send the new rule.
#[tokio::test]
async fn the_default_plan_chosen_first_then_changed_sends_the_new_rule() {
    let backend = service(Algorithm::TokenBucket, &[("free", SEVERAL.0)]);
    let mut layer = builder(&backend)
        .headers_on_allowed(true)
        .without_sweep()
        .build()
        .layer(Upstream);
    assert_eq!(
        send(&mut layer, "1", Some("free")).await.policy(),
        SEVERAL.1
    );
    backend.set_limits(&"free", rules(REVERSED.0)).unwrap();
    for policy in until_refused(&mut layer, "2", None).await {
        assert_eq!(policy, REVERSED.1);
    }
    assert_eq!(
        send(&mut layer, "3", Some("free")).await.policy(),
        REVERSED.1
    );
}

/// Whether [`Plan::Free`] is named by its second name.
static RENAMED: AtomicBool = AtomicBool::new(false);

/// A plan named by its `Display` form, [`Plan::Free`]'s changing with [`RENAMED`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Plan {
    Free,
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if RENAMED.load(Ordering::Relaxed) {
            r#"Free "tier" \ 1"#
        } else {
            "basic plan"
        })
    }
}

/// Names given by the plans' `Display` form, one that changes between responses, or by a
/// settings file: each response sends the name it is given now, with the rule in force.
#[tokio::test]
async fn custom_policy_names_are_sent_as_given_with_the_rule_in_force() {
    let backend = Arc::new(
        ServiceBuilder::new(Algorithm::FixedWindow, FakeClock::new())
            .plan_limits(Plan::Free, rules(A.0))
            .build::<ClientKey>()
            .unwrap(),
    );
    let extractor = HeaderKey::new(HeaderName::from_static(API_KEY));
    let mut layer =
        RateLimitLayer::builder_display_names(Arc::clone(&backend), extractor, Plan::Free)
            .headers_on_allowed(true)
            .without_sweep()
            .build()
            .layer(Upstream);
    let renamed = r#""Free \"tier\" \\ 1";q=5;w=1"#;
    for (name, step, text) in [
        (false, A, r#""basic plan";q=5;w=1"#),
        (true, A, renamed),
        (false, A, r#""basic plan";q=5;w=1"#),
        (
            false,
            SEVERAL,
            r#""basic plan-1s";q=2;w=1, "basic plan-1m";q=7;w=60"#,
        ),
        (
            true,
            SEVERAL,
            r#""Free \"tier\" \\ 1-1s";q=2;w=1, "Free \"tier\" \\ 1-1m";q=7;w=60"#,
        ),
        (true, A, renamed),
        (false, A, r#""basic plan";q=5;w=1"#),
    ] {
        RENAMED.store(name, Ordering::Relaxed);
        backend.set_limits(&Plan::Free, rules(step.0)).unwrap();
        for policy in until_refused(&mut layer, &format!("{name}-{}", step.1), None).await {
            assert_eq!(policy, text);
        }
    }

    let settings = Settings::from_toml_str(
        r#"
        algorithm = "sliding_window_counter"

        [plans.basic]
        limit = 5
        window = "1s"
        "#,
    )
    .unwrap();
    let extractor = HeaderKey::new(HeaderName::from_static(API_KEY));
    let layer = RateLimitLayer::from_settings(
        &settings,
        FakeClock::new(),
        [("basic", "free")],
        extractor,
        "free",
    )
    .unwrap()
    .without_sweep()
    .headers_on_allowed(true)
    .build();
    let backend = Arc::clone(layer.backend());
    let mut layer = layer.layer(Upstream);
    for (step, text) in [
        (A, r#""basic";q=5;w=1"#),
        (C, r#""basic";q=5;w=2"#),
        (A, r#""basic";q=5;w=1"#),
        (SEVERAL, r#""basic-1s";q=2;w=1, "basic-1m";q=7;w=60"#),
        (A, r#""basic";q=5;w=1"#),
    ] {
        backend.set_limits(&"free", rules(step.0)).unwrap();
        for policy in until_refused(&mut layer, step.1, None).await {
            assert_eq!(policy, text);
        }
    }
}

/// A backend that answers only after yielding to the runtime once: the layer then checks the
/// request out of line.
#[derive(Debug, Clone)]
struct Deferred(Backend);

impl RateLimitBackend<ClientKey, &'static str> for Deferred {
    type Error = <Backend as RateLimitBackend<ClientKey, &'static str>>::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Verdict, Self::Error>> + Send>>;

    fn check(
        &self,
        key: &ClientKey,
        plan: &&'static str,
        cost: u64,
        figures: Figures,
    ) -> Self::Future {
        let check = self.0.check(key, plan, cost, figures);
        Box::pin(async move {
            tokio::task::yield_now().await;
            check.await
        })
    }
}

/// Checked out of line, the default plan's responses send the rule in force too.
#[tokio::test]
async fn a_request_checked_later_sends_the_rule_in_force() {
    for sequence in [&SEQUENCES[1], &SEQUENCES[5], &SEQUENCES[6]] {
        let backend = service(Algorithm::TokenBucket, &[("free", sequence[0].0)]);
        let extractor = HeaderKey::new(HeaderName::from_static(API_KEY));
        let deferred = Deferred(Arc::clone(&backend));
        let mut layer = RateLimitLayer::builder(deferred, extractor, "free")
            .headers_on_allowed(true)
            .build()
            .layer(Upstream);
        for (step, &(limits, text)) in sequence.iter().enumerate() {
            backend.set_limits(&"free", rules(limits)).unwrap();
            for policy in until_refused(&mut layer, &format!("{step}"), None).await {
                assert_eq!(policy, text, "step {step}");
            }
        }
    }
}

/// Threads send requests while another changes the default plan's rule back and forth, waiting
/// after each change for a response that was checked after it: every response sends one of the
/// rules' texts (its `RateLimit` items the same), every rule's text is sent, and once the
/// changes are done, every response sends the last rule.
#[test]
fn responses_during_rule_changes_send_one_rule_each_and_then_the_last() {
    const SENDERS: usize = 3;
    const ROUNDS: usize = 200;
    let steps = [A, SEVERAL, REVERSED, B, SECOND_QUOTA, THREE, C, A_AND_MORE];
    let last = SECOND_WINDOW;
    let texts: HashSet<&str> = steps.iter().chain([&last]).map(|&(_, text)| text).collect();
    let backend = service(Algorithm::TokenBucket, &[("free", A.0)]);
    let layer = builder(&backend)
        .headers_on_allowed(true)
        .without_sweep()
        .build();
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
    };
    let changing = AtomicBool::new(true);
    let answered = AtomicUsize::new(0);
    let seen = std::thread::scope(|scope| {
        let senders: Vec<_> = (0..SENDERS)
            .map(|sender| {
                let (layer, changing, answered) = (&layer, &changing, &answered);
                scope.spawn(move || {
                    let mut service = layer.layer(Upstream);
                    let mut seen = HashSet::new();
                    runtime().block_on(async {
                        let mut n = 0;
                        while changing.load(Ordering::Relaxed) {
                            let key = format!("{sender}-{}", n % 8);
                            let answer = send(&mut service, &key, None).await;
                            seen.insert(answer);
                            answered.fetch_add(1, Ordering::Relaxed);
                            n += 1;
                        }
                    });
                    seen
                })
            })
            .collect();
        for round in 0..ROUNDS {
            let (limits, _) = steps[round % steps.len()];
            backend.set_limits(&"free", rules(limits)).unwrap();
            // Each sender has at most one request in flight: the last of these was checked
            // after the change.
            let mark = answered.load(Ordering::Relaxed);
            while answered.load(Ordering::Relaxed) < mark + SENDERS + 1 {
                std::thread::yield_now();
            }
        }
        backend.set_limits(&"free", rules(last.0)).unwrap();
        changing.store(false, Ordering::Relaxed);
        senders
            .into_iter()
            .flat_map(|sender| sender.join().expect("a sender"))
            .collect::<Vec<Answer>>()
    });
    for answer in &seen {
        let policy = answer.policy();
        assert!(texts.contains(policy), "{policy}");
    }
    for (_, text) in steps {
        assert!(
            seen.iter().any(|answer| answer.policy() == text),
            "{text} was never sent"
        );
    }
    let mut service = layer.layer(Upstream);
    runtime().block_on(async {
        for key in ["after-1", "after-2"] {
            for policy in until_refused(&mut service, key, None).await {
                assert_eq!(policy, last.1);
            }
        }
    });
}
