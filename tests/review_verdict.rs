//! Review of f52ea47 ("a verdict is one word"): the tower layer, driven through its public API,
//! against a twin `RateLimiterService` fed the same requests on the same `FakeClock`.
//!
//! Every request's answer is compared with what the twin's `acquire` (and, for a plan of several
//! limits, `ratelimit_headers`) says in the same state: the status, `Retry-After`,
//! `RateLimit-Policy` and `RateLimit` on refusals (written here independently with `format!`
//! for a plan of one limit, so that the layer's integer writer is checked too), the fields on
//! allowed responses under `headers_on_allowed(true)` and their absence under `(false)`, the
//! shadow mark, the `on_limited` hook's decision, the layer's stats, and the backend's state
//! after every request (`peek`). Each method, costs 0, 1, > 1 and over the limit, plans of one
//! and of several limits.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tollgate::tower::{ClientKey, GlobalKey, RateLimitLayer, RateLimitStats, Shadow};
use tollgate::{Algorithm, Decision, FakeClock, RateLimiterService, Rule, ServiceBuilder};
use tower::{Layer as _, Service, ServiceExt};

type Svc = RateLimiterService<ClientKey, &'static str, FakeClock>;
type Backend = Arc<Svc>;

const PLAN: &str = "p";
const COST: &str = "x-cost";
const SEEN_MARK: &str = "x-seen-shadow-mark";

const METHODS: [Algorithm; 4] = [
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowLog,
    Algorithm::SlidingWindowCounter,
];

fn service(algorithm: Algorithm, clock: &FakeClock, limits: &[Rule]) -> Option<Svc> {
    ServiceBuilder::new(algorithm, clock.clone())
        .plan_limits(PLAN, limits.iter().copied())
        .count_decisions(true)
        .build()
        .ok()
}

/// How the layer under test is configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Enforce,
    Shadow,
    Hook,
}

#[derive(Debug, Clone, Copy)]
struct Config {
    on_allowed: bool,
    mode: Mode,
}

/// A response, as the test reads it.
#[derive(Debug)]
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|value| value.to_str().unwrap())
    }
}

/// The hook's record of each refusal it answered.
type Seen = Arc<Mutex<Vec<(Decision, String, HeaderMap)>>>;

/// A layer over `backend` with `config`, costs read from the `x-cost` header (default 1).
fn layer(
    backend: Backend,
    config: Config,
    seen: Seen,
) -> RateLimitLayer<Backend, GlobalKey, &'static str> {
    let mut builder = RateLimitLayer::builder(backend, GlobalKey, PLAN)
        .without_sweep()
        .headers_on_allowed(config.on_allowed)
        .cost_fn(|head| {
            head.headers()
                .get(COST)
                .and_then(|value| value.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        });
    match config.mode {
        Mode::Enforce => {}
        Mode::Shadow => builder = builder.shadow(Shadow::new(1.0, 0.0)),
        Mode::Hook => {
            builder = builder.on_limited(move |limited| {
                seen.lock().unwrap().push((
                    *limited.decision(),
                    limited.policy().to_owned(),
                    limited.headers().clone(),
                ));
                let mut response = Response::new(Bytes::from_static(b"hooked"));
                *response.status_mut() = StatusCode::IM_A_TEAPOT;
                response.headers_mut().extend(limited.headers().clone());
                response
            });
        }
    }
    builder.build()
}

/// The inner service: 200, echoing the shadow mark the layer put on the request (if any).
async fn inner(
    request: Request<Empty<Bytes>>,
) -> Result<Response<Empty<Bytes>>, std::convert::Infallible> {
    let mut response = Response::new(Empty::new());
    if let Some(mark) = request.headers().get("x-ratelimit-shadowed") {
        response.headers_mut().insert(SEEN_MARK, mark.clone());
    }
    Ok(response)
}

/// The layered service, called directly.
type LayeredService = tower::util::BoxCloneService<
    Request<Empty<Bytes>>,
    Response<tollgate::tower::ResponseBody<Empty<Bytes>>>,
    std::convert::Infallible,
>;

/// Where requests go: straight into the layered service, or over loopback to an axum server.
enum Driver {
    Direct(LayeredService),
    // Boxed: the client is several hundred bytes, the direct service two words.
    Loopback(SocketAddr, Box<Client<HttpConnector, Empty<Bytes>>>),
}

impl Driver {
    async fn direct(layer: &RateLimitLayer<Backend, GlobalKey, &'static str>) -> Driver {
        let service = layer.layer(tower::service_fn(inner));
        Driver::Direct(tower::util::BoxCloneService::new(service))
    }

    async fn loopback(layer: &RateLimitLayer<Backend, GlobalKey, &'static str>) -> Driver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .route(
                "/hello",
                axum::routing::get(|headers: HeaderMap| async move {
                    let mut response = Response::new(axum::body::Body::from("hello"));
                    if let Some(mark) = headers.get("x-ratelimit-shadowed") {
                        response.headers_mut().insert(SEEN_MARK, mark.clone());
                    }
                    response
                }),
            )
            .layer(layer.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Driver::Loopback(
            addr,
            Box::new(Client::builder(TokioExecutor::new()).build_http()),
        )
    }

    async fn send(&mut self, cost: Option<u64>) -> Reply {
        let mut request = Request::get("/hello");
        if let Some(cost) = cost {
            request = request.header(COST, cost.to_string());
        }
        match self {
            Driver::Direct(service) => {
                let request = request.body(Empty::new()).unwrap();
                let response = service.ready().await.unwrap().call(request).await.unwrap();
                let (parts, body) = response.into_parts();
                let _ = body.collect().await;
                Reply {
                    status: parts.status,
                    headers: parts.headers,
                }
            }
            Driver::Loopback(addr, client) => {
                let request = request
                    .uri(format!("http://{addr}/hello"))
                    .body(Empty::new())
                    .unwrap();
                let response = client.request(request).await.unwrap();
                let (parts, body) = response.into_parts();
                let _ = body.collect().await.unwrap();
                Reply {
                    status: parts.status,
                    headers: parts.headers,
                }
            }
        }
    }
}

fn seconds_up(duration: Duration) -> u128 {
    duration.as_nanos().div_ceil(1_000_000_000)
}

fn sf(value: u64) -> u64 {
    value.min(Decision::MAX_FIELD_INTEGER)
}

/// `RateLimit-Policy` and `RateLimit` of a plan of one limit, written with `format!`.
fn single_fields(decision: &Decision) -> (String, String) {
    (
        format!(
            "\"{PLAN}\";q={};w={}",
            sf(decision.limit()),
            seconds_up(decision.window()).max(1)
        ),
        format!(
            "\"{PLAN}\";r={};t={}",
            sf(decision.remaining()),
            seconds_up(decision.reset_after())
        ),
    )
}

/// `Retry-After` of a refusal, written with `format!`.
fn retry_after(decision: &Decision) -> Option<String> {
    (decision.is_denied() && decision.rejection().is_none())
        .then(|| seconds_up(decision.retry_after()).max(1).to_string())
}

/// The layer under test, its twin, and what was seen so far.
struct Rig {
    clock: FakeClock,
    limits: Vec<Rule>,
    config: Config,
    layer: RateLimitLayer<Backend, GlobalKey, &'static str>,
    twin: Svc,
    driver: Driver,
    seen: Seen,
    /// What the layer's stats should read.
    expected: RateLimitStats,
    hooked: usize,
}

impl Rig {
    async fn new(
        algorithm: Algorithm,
        limits: &[Rule],
        config: Config,
        loopback: bool,
    ) -> Option<Rig> {
        let clock = FakeClock::new();
        let backend = Arc::new(service(algorithm, &clock, limits)?);
        let twin = service(algorithm, &clock, limits)?;
        let seen = Seen::default();
        let layer = layer(backend, config, Arc::clone(&seen));
        let driver = if loopback {
            Driver::loopback(&layer).await
        } else {
            Driver::direct(&layer).await
        };
        Some(Rig {
            clock,
            limits: limits.to_vec(),
            config,
            layer,
            twin,
            driver,
            seen,
            expected: RateLimitStats::default(),
            hooked: 0,
        })
    }

    /// The fields a response reports of `decision` in the twin's current state.
    fn fields(&self, decision: &Decision) -> (String, String) {
        if self.limits.len() == 1 {
            let fields = single_fields(decision);
            // The library's own writer agrees with `format!`.
            assert_eq!(
                (
                    decision.ratelimit_policy_header(PLAN).unwrap(),
                    decision.ratelimit_header(PLAN).unwrap()
                ),
                fields
            );
            fields
        } else {
            self.twin
                .ratelimit_headers(&ClientKey::Global, &PLAN, PLAN)
                .unwrap()
        }
    }

    /// Sends one request of `cost` (`None`: the default cost, 1), checks everything about its
    /// answer against the twin, and answers whether it was admitted (passed unmarked).
    async fn send(&mut self, cost: Option<u64>) -> bool {
        let n = cost.unwrap_or(1);
        let context = format!(
            "{:?} {:?} cost {n} at {:?}",
            self.twin.algorithm(),
            self.config,
            self.clock_reading()
        );
        let decision = self.twin.acquire(&ClientKey::Global, &PLAN, n).unwrap();
        let (policy, state) = self.fields(&decision);
        let reply = self.driver.send(cost).await;
        self.expected.requests += 1;
        self.expected.checked += 1;
        let admitted = if decision.is_allowed() {
            self.expected.allowed += 1;
            assert_eq!(reply.status, StatusCode::OK, "{context}");
            assert_eq!(reply.header(SEEN_MARK), None, "{context}: no shadow mark");
            assert_eq!(reply.header("retry-after"), None, "{context}");
            if self.config.on_allowed {
                assert_eq!(
                    reply.header("ratelimit-policy"),
                    Some(policy.as_str()),
                    "{context}: allowed, policy field"
                );
                assert_eq!(
                    reply.header("ratelimit"),
                    Some(state.as_str()),
                    "{context}: allowed, state field"
                );
            } else {
                assert_eq!(reply.header("ratelimit-policy"), None, "{context}");
                assert_eq!(reply.header("ratelimit"), None, "{context}");
            }
            true
        } else {
            self.expected.limited += 1;
            match self.config.mode {
                Mode::Shadow => {
                    assert_eq!(reply.status, StatusCode::OK, "{context}: shadowed");
                    assert_eq!(
                        reply.header(SEEN_MARK),
                        Some(state.as_str()),
                        "{context}: the shadow mark"
                    );
                    for name in ["retry-after", "ratelimit", "ratelimit-policy"] {
                        assert_eq!(reply.header(name), None, "{context}: shadowed, no {name}");
                    }
                }
                Mode::Enforce | Mode::Hook => {
                    self.expected.enforced += 1;
                    let status = if self.config.mode == Mode::Hook {
                        StatusCode::IM_A_TEAPOT
                    } else {
                        StatusCode::TOO_MANY_REQUESTS
                    };
                    assert_eq!(reply.status, status, "{context}");
                    assert_eq!(
                        reply.header("retry-after"),
                        retry_after(&decision).as_deref(),
                        "{context}: retry-after"
                    );
                    assert_eq!(
                        reply.header("retry-after").map(str::to_owned),
                        decision.retry_after_header(),
                        "{context}: retry-after as the decision writes it"
                    );
                    assert_eq!(
                        reply.header("ratelimit-policy"),
                        Some(policy.as_str()),
                        "{context}: refused, policy field"
                    );
                    assert_eq!(
                        reply.header("ratelimit"),
                        Some(state.as_str()),
                        "{context}: refused, state field"
                    );
                    assert_eq!(reply.header(SEEN_MARK), None, "{context}");
                    if self.config.mode == Mode::Hook {
                        let seen = self.seen.lock().unwrap();
                        assert_eq!(seen.len(), self.hooked + 1, "{context}: the hook ran once");
                        let (hook_decision, hook_policy, hook_headers) = &seen[self.hooked];
                        assert_eq!(hook_decision, &decision, "{context}: Limited::decision");
                        assert_eq!(hook_policy, PLAN, "{context}");
                        assert_eq!(
                            hook_headers.get("ratelimit").map(|v| v.to_str().unwrap()),
                            Some(state.as_str()),
                            "{context}: Limited::headers"
                        );
                        self.hooked += 1;
                    }
                }
            }
            false
        };
        // The layer took exactly what the twin took.
        assert_eq!(
            self.layer
                .backend()
                .peek(&ClientKey::Global, &PLAN)
                .unwrap(),
            self.twin.peek(&ClientKey::Global, &PLAN).unwrap(),
            "{context}: the backend's state after the request"
        );
        assert_eq!(
            self.layer
                .backend()
                .ratelimit_headers(&ClientKey::Global, &PLAN, PLAN)
                .unwrap(),
            self.twin
                .ratelimit_headers(&ClientKey::Global, &PLAN, PLAN)
                .unwrap(),
            "{context}: each limit's state after the request"
        );
        assert_eq!(
            self.layer.stats(),
            self.expected,
            "{context}: the layer's stats"
        );
        assert_eq!(
            self.layer.backend().stats(&PLAN),
            self.twin.stats(&PLAN),
            "{context}: the plan's decision counts"
        );
        if self.config.mode != Mode::Hook {
            assert!(self.seen.lock().unwrap().is_empty());
        }
        admitted && !(self.config.mode == Mode::Shadow && decision.is_denied())
    }

    fn clock_reading(&self) -> Duration {
        use tollgate::Clock;
        Duration::from_nanos(self.clock.now_nanos())
    }

    /// Sends `count` requests of `cost` and answers how many were admitted.
    async fn burst(&mut self, cost: Option<u64>, count: usize) -> usize {
        let mut admitted = 0;
        for _ in 0..count {
            if self.send(cost).await {
                admitted += 1;
            }
        }
        admitted
    }
}

fn configs() -> Vec<Config> {
    let mut configs = Vec::new();
    for on_allowed in [false, true] {
        for mode in [Mode::Enforce, Mode::Shadow, Mode::Hook] {
            configs.push(Config { on_allowed, mode });
        }
    }
    configs
}

/// A history of each cost through a layer: exact admissions per window, then partial refills.
async fn run_history(rig: &mut Rig, quota: u64, window: Duration) {
    for cost in [None, Some(1), Some(2), Some(3)] {
        let n = cost.unwrap_or(1);
        // A fresh client (never seen, or swept) asking for nothing.
        rig.send(Some(0)).await;
        // Fresh: exactly `quota / n` admitted, whatever follows.
        let admitted = rig.burst(cost, (quota / n) as usize + 3).await;
        assert_eq!(
            admitted as u64,
            quota / n,
            "{:?} {:?}: admitted at cost {n} in a fresh window",
            rig.twin.algorithm(),
            rig.config
        );
        // Cost 0 on an exhausted limit: allowed, takes nothing.
        rig.burst(Some(0), 2).await;
        // More than the quota at once: never grantable, no Retry-After.
        rig.send(Some(quota + 1)).await;
        // Partial refills, in steps that cross whole and fractional seconds.
        for step in [1_300, 700, 2_000, 1, 999] {
            rig.clock.advance(Duration::from_millis(step));
            rig.burst(cost, 2).await;
            rig.send(Some(0)).await;
        }
        // Up to just before, at, and just after the end of the first window: refusals with
        // waits under a second, and the first admissions' expiry.
        for step in [
            window - Duration::from_millis(5_200),
            Duration::from_millis(150),
            Duration::from_millis(49),
            Duration::from_millis(1),
            Duration::from_millis(60),
        ] {
            rig.clock.advance(step);
            rig.burst(cost, 2).await;
            rig.send(Some(0)).await;
        }
        // Two whole windows on: fresh again for every method, and swept from both services.
        rig.clock.advance(2 * window);
        let swept = rig.layer.backend().sweep();
        assert_eq!(swept, rig.twin.sweep());
    }
}

#[tokio::test]
async fn every_method_and_cost_through_the_layer_matches_the_service_one_limit() {
    let window = Duration::from_secs(10);
    let quota = 6;
    for algorithm in METHODS {
        for config in configs() {
            let mut rig = Rig::new(
                algorithm,
                &[Rule::new(quota, window).unwrap()],
                config,
                false,
            )
            .await
            .expect("a service of one limit");
            run_history(&mut rig, quota, window).await;
        }
    }
}

#[tokio::test]
async fn every_method_and_cost_through_the_layer_matches_the_service_several_limits() {
    let limits = [
        Rule::new(4, Duration::from_secs(2)).unwrap(),
        Rule::new(7, Duration::from_secs(10)).unwrap(),
    ];
    let mut tried = 0;
    for algorithm in METHODS {
        for config in configs() {
            let Some(mut rig) = Rig::new(algorithm, &limits, config, false).await else {
                continue;
            };
            tried += 1;
            // The tightest limit decides a fresh burst.
            run_history(&mut rig, 4, Duration::from_secs(10)).await;
        }
    }
    assert!(tried >= 3 * 6, "at least three methods take several limits");
}

#[tokio::test]
async fn three_limits_with_a_shared_window_are_named_and_reported() {
    let limits = [
        Rule::new(3, Duration::from_secs(1)).unwrap(),
        Rule::new(5, Duration::from_secs(1)).unwrap(),
        Rule::new(9, Duration::from_secs(60)).unwrap(),
    ];
    for algorithm in METHODS {
        for config in configs() {
            let Some(mut rig) = Rig::new(algorithm, &limits, config, false).await else {
                continue;
            };
            run_history(&mut rig, 3, Duration::from_secs(60)).await;
        }
    }
}

/// The integer writer at 0, 9, 10, 99, 100 and beyond, in every field.
#[tokio::test]
async fn header_integers_at_every_digit_boundary() {
    let window = Duration::from_secs(100);
    for algorithm in METHODS {
        for on_allowed in [false, true] {
            for mode in [Mode::Enforce, Mode::Hook] {
                let config = Config { on_allowed, mode };
                let mut rig =
                    Rig::new(algorithm, &[Rule::new(100, window).unwrap()], config, false)
                        .await
                        .unwrap();
                // Remaining 100 (cost 0), 99, 90, 10, 9, 0; resets and waits of 1 to 100 s.
                for cost in [0, 1, 9, 80, 1, 9, 0] {
                    rig.send(Some(cost)).await;
                }
                assert!(!rig.send(Some(1)).await);
                for step in [1, 8, 1, 89, 1] {
                    rig.clock.advance(Duration::from_secs(step));
                    rig.send(Some(10)).await;
                    rig.send(Some(1)).await;
                    rig.send(Some(0)).await;
                }
                // And a fresh limit's full figures.
                rig.clock.advance(3 * window);
                rig.send(Some(0)).await;
                rig.send(Some(100)).await;
                rig.send(Some(101)).await;
            }
        }
    }
}

/// Limits far beyond a header's usual digits: 2^40 per hour, and 10^15 and beyond (clamped).
#[tokio::test]
async fn big_limits_are_written_in_full_or_clamped() {
    for limit in [
        1u64 << 40,
        999_999_999_999_999,
        1_000_000_000_000_000,
        1 << 62,
    ] {
        for algorithm in [
            Algorithm::TokenBucket,
            Algorithm::FixedWindow,
            Algorithm::SlidingWindowCounter,
        ] {
            let Ok(rule) = Rule::new(limit, Duration::from_secs(3_600)) else {
                continue;
            };
            for on_allowed in [false, true] {
                let config = Config {
                    on_allowed,
                    mode: Mode::Enforce,
                };
                let Some(mut rig) = Rig::new(algorithm, &[rule], config, false).await else {
                    continue;
                };
                rig.send(None).await;
                rig.send(Some(limit / 2)).await;
                rig.send(Some(limit / 2)).await;
                rig.send(Some(1)).await;
                rig.send(Some(0)).await;
                rig.clock.advance(Duration::from_secs(1));
                rig.send(Some(1)).await;
                rig.send(Some(limit)).await;
            }
        }
    }
}

/// The fields of the big rule, spelled out once.
#[tokio::test]
async fn a_limit_of_two_to_the_forty_spells_its_fields() {
    for algorithm in [Algorithm::TokenBucket, Algorithm::FixedWindow] {
        let config = Config {
            on_allowed: true,
            mode: Mode::Enforce,
        };
        let rule = Rule::new(1 << 40, Duration::from_secs(3_600)).unwrap();
        let mut rig = Rig::new(algorithm, &[rule], config, false).await.unwrap();
        let reply = rig.driver.send(Some(1)).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(
            reply.header("ratelimit-policy"),
            Some(r#""p";q=1099511627776;w=3600"#)
        );
        assert_eq!(
            reply
                .header("ratelimit")
                .map(|v| v.split(";t=").next().unwrap().to_owned()),
            Some(r#""p";r=1099511627775"#.to_owned()),
            "{algorithm:?}"
        );
    }
}

/// The same histories over loopback, through axum and a hyper client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_loopback_every_method_and_cost_matches_the_service() {
    let window = Duration::from_secs(10);
    for algorithm in METHODS {
        for on_allowed in [false, true] {
            for mode in [Mode::Enforce, Mode::Shadow] {
                let config = Config { on_allowed, mode };
                let mut rig = Rig::new(algorithm, &[Rule::new(6, window).unwrap()], config, true)
                    .await
                    .unwrap();
                run_history(&mut rig, 6, window).await;
                let limits = [
                    Rule::new(4, Duration::from_secs(2)).unwrap(),
                    Rule::new(7, window).unwrap(),
                ];
                if let Some(mut rig) = Rig::new(algorithm, &limits, config, true).await {
                    run_history(&mut rig, 4, window).await;
                }
            }
        }
    }
}

/// A backend answering a reported grant (`Verdict::from(decision)`) and one answering
/// `Verdict::allowed()` for the same grant must be treated alike, except that only the reported
/// one can give fields (and only under `headers_on_allowed(true)`).
#[derive(Clone)]
struct Answering {
    service: Backend,
    quiet: bool,
}

impl tollgate::tower::RateLimitBackend<ClientKey, &'static str> for Answering {
    type Error = tollgate::ServiceError;
    type Future = std::future::Ready<Result<tollgate::tower::Verdict, tollgate::ServiceError>>;

    fn check(
        &self,
        key: &ClientKey,
        plan: &&'static str,
        cost: u64,
        _: tollgate::tower::Figures,
    ) -> Self::Future {
        std::future::ready(self.service.acquire(key, plan, cost).map(|decision| {
            if self.quiet && decision.is_allowed() {
                tollgate::tower::Verdict::allowed()
            } else {
                tollgate::tower::Verdict::from(decision)
            }
        }))
    }
}

#[tokio::test]
async fn a_reported_grant_and_a_quiet_grant_pass_alike() {
    for quiet in [false, true] {
        for on_allowed in [false, true] {
            for shadow in [false, true] {
                let clock = FakeClock::new();
                let service = Arc::new(
                    service(
                        Algorithm::TokenBucket,
                        &clock,
                        &[Rule::per_second(3).unwrap()],
                    )
                    .unwrap(),
                );
                let backend = Answering {
                    service: Arc::clone(&service),
                    quiet,
                };
                let mut builder = RateLimitLayer::builder(backend, GlobalKey, PLAN)
                    .without_sweep()
                    .headers_on_allowed(on_allowed);
                if shadow {
                    builder = builder.shadow(Shadow::new(1.0, 0.0));
                }
                let layer = builder.build();
                let mut svc = layer.layer(tower::service_fn(inner));
                let context = format!("quiet {quiet}, on_allowed {on_allowed}, shadow {shadow}");
                for n in 0..5 {
                    let response = svc
                        .ready()
                        .await
                        .unwrap()
                        .call(Request::new(Empty::new()))
                        .await
                        .unwrap();
                    let headers = response.headers();
                    if n < 3 {
                        assert_eq!(response.status(), StatusCode::OK, "{context} {n}");
                        assert!(headers.get(SEEN_MARK).is_none(), "{context} {n}");
                        let expected =
                            (on_allowed && !quiet).then(|| format!("\"p\";r={};t=1", 2 - n));
                        assert_eq!(
                            headers
                                .get("ratelimit")
                                .map(|v| v.to_str().unwrap().to_owned()),
                            expected,
                            "{context} {n}"
                        );
                    } else if shadow {
                        assert_eq!(response.status(), StatusCode::OK, "{context} {n}");
                        assert_eq!(
                            headers.get(SEEN_MARK).map(|v| v.to_str().unwrap()),
                            Some("\"p\";r=0;t=1"),
                            "{context} {n}"
                        );
                        assert!(headers.get("ratelimit").is_none(), "{context} {n}");
                        assert!(headers.get("retry-after").is_none(), "{context} {n}");
                    } else {
                        assert_eq!(
                            response.status(),
                            StatusCode::TOO_MANY_REQUESTS,
                            "{context} {n}"
                        );
                        assert_eq!(
                            headers.get("retry-after").map(|v| v.to_str().unwrap()),
                            Some("1"),
                            "{context} {n}"
                        );
                    }
                }
                let stats = layer.stats();
                assert_eq!(
                    (stats.requests, stats.checked, stats.allowed, stats.limited),
                    (5, 5, 3, 2),
                    "{context}"
                );
                assert_eq!(stats.enforced, if shadow { 0 } else { 2 }, "{context}");
            }
        }
    }
}

/// The verdict's public accessors agree with one another for every kind of answer.
#[test]
fn verdict_accessors_agree() {
    use tollgate::tower::Verdict;
    let rule = Rule::per_second(2).unwrap();
    let clock = FakeClock::new();
    let bucket = tollgate::TokenBucket::new(rule, clock).unwrap();
    use tollgate::Limiter as _;
    let granted = bucket.try_acquire_n(1);
    let refused = bucket.try_acquire_n(2);
    assert!(granted.is_allowed() && refused.is_denied());
    let quiet = Verdict::allowed();
    assert!(quiet.is_allowed());
    assert_eq!(quiet.decision(), None);
    assert_eq!(quiet, Verdict::allowed());
    let reported = Verdict::from(granted);
    assert!(reported.is_allowed());
    assert_eq!(reported.decision(), Some(&granted));
    let refusal = Verdict::from(refused);
    assert!(!refusal.is_allowed());
    assert_eq!(refusal.decision(), Some(&refused));
    assert_eq!(refusal.clone(), refusal);
    assert_ne!(refusal, quiet);
    assert_eq!(size_of::<Verdict>(), size_of::<usize>());
    assert_eq!(size_of::<Option<Verdict>>(), size_of::<usize>() * 2);
}

/// A name that cannot be sent: refusals keep Retry-After and lose the fields; allowed
/// responses under headers_on_allowed(true) carry nothing either.
#[tokio::test]
async fn an_unsendable_policy_name_sends_no_fields_on_any_answer() {
    for on_allowed in [false, true] {
        let clock = FakeClock::new();
        let service = Arc::new(
            ServiceBuilder::new(Algorithm::FixedWindow, clock.clone())
                .plan("bad name\u{e9}", Rule::per_second(1).unwrap())
                .build::<ClientKey>()
                .unwrap(),
        );
        let layer = RateLimitLayer::builder(service, GlobalKey, "bad name\u{e9}")
            .without_sweep()
            .headers_on_allowed(on_allowed)
            .shadow(Shadow::new(1.0, 1.0))
            .build();
        let mut svc = layer.layer(tower::service_fn(inner));
        let first = svc
            .ready()
            .await
            .unwrap()
            .call(Request::new(Empty::new()))
            .await
            .unwrap();
        assert_eq!(first.status(), StatusCode::OK);
        assert!(first.headers().get("ratelimit").is_none());
        let second = svc
            .ready()
            .await
            .unwrap()
            .call(Request::new(Empty::new()))
            .await
            .unwrap();
        assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            second
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap()),
            Some("1")
        );
        assert!(second.headers().get("ratelimit").is_none());
        assert!(
            second
                .headers()
                .get(HeaderName::from_static("ratelimit-policy"))
                .is_none()
        );
    }
}

/// Two threads hammering one client through one layer: exactly the quota is admitted, and the
/// layer and the plan count what happened.
#[test]
fn concurrent_requests_admit_exactly_the_quota() {
    for algorithm in METHODS {
        for on_allowed in [false, true] {
            for cost in [1u64, 2] {
                let clock = FakeClock::new();
                let quota = 1_000;
                let backend = Arc::new(
                    service(
                        algorithm,
                        &clock,
                        &[Rule::new(quota, Duration::from_secs(3_600)).unwrap()],
                    )
                    .unwrap(),
                );
                let layer = layer(
                    Arc::clone(&backend),
                    Config {
                        on_allowed,
                        mode: Mode::Enforce,
                    },
                    Seen::default(),
                );
                let per_thread = quota as usize;
                let admitted: usize = std::thread::scope(|scope| {
                    let handles: Vec<_> = (0..2)
                        .map(|_| {
                            let svc = layer.layer(tower::service_fn(inner));
                            scope.spawn(move || {
                                let runtime = tokio::runtime::Builder::new_current_thread()
                                    .build()
                                    .unwrap();
                                runtime.block_on(async move {
                                    let mut svc = svc;
                                    let mut admitted = 0;
                                    for _ in 0..per_thread {
                                        let request = Request::builder()
                                            .header(COST, cost.to_string())
                                            .body(Empty::new())
                                            .unwrap();
                                        let response =
                                            svc.ready().await.unwrap().call(request).await.unwrap();
                                        let fields = response.headers().get("ratelimit").is_some();
                                        if response.status() == StatusCode::OK {
                                            assert_eq!(fields, on_allowed);
                                            admitted += 1;
                                        } else {
                                            assert_eq!(
                                                response.status(),
                                                StatusCode::TOO_MANY_REQUESTS
                                            );
                                            assert!(fields);
                                        }
                                    }
                                    admitted
                                })
                            })
                        })
                        .collect();
                    handles.into_iter().map(|h| h.join().unwrap()).sum()
                });
                let context = format!("{algorithm:?} on_allowed {on_allowed} cost {cost}");
                let admitted = admitted as u64;
                if algorithm == Algorithm::SlidingWindowLog && cost > 1 {
                    // Documented on `SlidingWindowLog` ("Batches"): a batch interrupted by another
                    // thread's claim may spend up to n - 1 slots without admitting: never more.
                    assert!(admitted <= quota / cost, "{context}: {admitted}");
                } else {
                    assert_eq!(admitted, quota / cost, "{context}");
                    assert_eq!(
                        backend.peek(&ClientKey::Global, &PLAN).unwrap().remaining(),
                        0,
                        "{context}"
                    );
                }
                let stats = layer.stats();
                assert_eq!(stats.allowed, admitted, "{context}");
                assert_eq!(stats.enforced, 2 * quota - admitted, "{context}");
                assert_eq!(
                    backend.stats(&PLAN).unwrap(),
                    tollgate::PlanStats {
                        allowed: admitted,
                        denied: 2 * quota - admitted
                    },
                    "{context}"
                );
            }
        }
    }
}

/// gRPC refusals, the text body, and a failed check, for each method at cost 1 (the quiet path)
/// and 2.
#[tokio::test]
async fn grpc_text_and_error_answers_take_the_refusal_figures() {
    for algorithm in METHODS {
        for cost in [1u64, 2] {
            let clock = FakeClock::new();
            let backend =
                Arc::new(service(algorithm, &clock, &[Rule::per_minute(4).unwrap()]).unwrap());
            let twin = service(algorithm, &clock, &[Rule::per_minute(4).unwrap()]).unwrap();
            let layer = RateLimitLayer::builder(Arc::clone(&backend), GlobalKey, PLAN)
                .without_sweep()
                .cost_fn(move |_| cost)
                .plan_fn(|head| head.headers().get("x-unknown").map(|_| "nope"))
                .build();
            let mut svc = layer.layer(tower::service_fn(inner));
            let context = format!("{algorithm:?} cost {cost}");
            let mut refused = [0; 2];
            for (n, grpc) in [false, true, false, true, true, false]
                .into_iter()
                .enumerate()
            {
                clock.advance(Duration::from_millis(2_300));
                let decision = twin.acquire(&ClientKey::Global, &PLAN, cost).unwrap();
                let mut request = Request::builder();
                if grpc {
                    request = request.header("content-type", "application/grpc");
                }
                let response = svc
                    .ready()
                    .await
                    .unwrap()
                    .call(request.body(Empty::new()).unwrap())
                    .await
                    .unwrap();
                let (parts, body) = response.into_parts();
                let body = body.collect().await.unwrap().to_bytes();
                let header = |name: &str| {
                    parts
                        .headers
                        .get(name)
                        .map(|v| v.to_str().unwrap().to_owned())
                };
                let context = format!("{context} request {n} grpc {grpc}");
                if decision.is_allowed() {
                    assert_eq!(parts.status, StatusCode::OK, "{context}");
                    assert_eq!(header("grpc-status"), None, "{context}");
                    assert_eq!(header("ratelimit"), None, "{context}");
                    continue;
                }
                refused[usize::from(grpc)] += 1;
                let (policy, state) = single_fields(&decision);
                assert_eq!(header("retry-after"), retry_after(&decision), "{context}");
                assert_eq!(header("ratelimit-policy"), Some(policy), "{context}");
                assert_eq!(header("ratelimit"), Some(state), "{context}");
                if grpc {
                    assert_eq!(parts.status, StatusCode::OK, "{context}");
                    assert_eq!(header("grpc-status").as_deref(), Some("8"), "{context}");
                } else {
                    assert_eq!(parts.status, StatusCode::TOO_MANY_REQUESTS, "{context}");
                    assert_eq!(
                        String::from_utf8(body.to_vec()).unwrap(),
                        format!(
                            "Too Many Requests: retry in {} s\n",
                            retry_after(&decision).unwrap()
                        ),
                        "{context}"
                    );
                }
            }
            assert!(refused[0] > 0 && refused[1] > 0, "{context}: {refused:?}");
            // A check that fails: the on_error answer, counted as an error, nothing taken.
            let before = backend.peek(&ClientKey::Global, &PLAN).unwrap();
            let response = svc
                .ready()
                .await
                .unwrap()
                .call(
                    Request::builder()
                        .header("x-unknown", "1")
                        .body(Empty::new())
                        .unwrap(),
                )
                .await
                .unwrap();
            assert_eq!(
                response.status(),
                StatusCode::SERVICE_UNAVAILABLE,
                "{context}"
            );
            assert!(response.headers().get("ratelimit").is_none(), "{context}");
            assert_eq!(
                backend.peek(&ClientKey::Global, &PLAN).unwrap(),
                before,
                "{context}"
            );
            let stats = layer.stats();
            assert_eq!((stats.requests, stats.errors), (7, 1), "{context}");
            assert_eq!(stats.allowed + stats.limited, 6, "{context}");
        }
    }
}
