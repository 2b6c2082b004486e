//! The tower layer's added time per request, against tower_governor doing the same job, and the
//! bare inner service as the baseline, all in one run.
//!
//! Each iteration makes a request carrying axum's `ConnectInfo` (the peer address both layers key
//! on), calls the service and polls its future once (the inner service answers at once). The
//! layer's cost is its figure minus the bare service's; the summary printed at the end gives
//! each layer's added nanoseconds and tollgate's as a fraction of tower_governor's.
//!
//! Both layers do the same work by default: key by the peer address, decide, pass an allowed
//! request on untouched (no rate-limit fields on allowed responses: tollgate's
//! `headers_on_allowed` and tower_governor's `use_headers` are both off), and refuse with 429 and
//! `Retry-After` (tollgate adds `RateLimit-Policy` and `RateLimit`, tower_governor
//! `x-ratelimit-after`). The criterion groups compare these defaults.
//!
//! A second, paired measurement follows criterion's: the variants timed in turn in short
//! batches, medians over many rounds, which holds up on a machine shared with other work. It
//! reports the defaults, then both layers sending their fields on allowed responses too
//! (tollgate's `RateLimit-Policy` and `RateLimit`, tower_governor's `x-ratelimit-limit` and
//! `x-ratelimit-remaining`), then tollgate's layer over a backend with a fixed answer (the layer's
//! own cost, without a limiter's).
//!
//! `cargo bench --features tower --bench tower` (about a minute).

use std::future::Future;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use criterion::Criterion;
use governor::clock::QuantaInstant;
use governor::middleware::{NoOpMiddleware, StateInformationMiddleware};
use http::{Request, Response};
use tollgate::tower::{
    ClientIp, ClientKey, Figures, PeerSource, RateLimitBackend, RateLimitLayer, Verdict,
};
use tollgate::{Algorithm, MonotonicClock, RateLimiterService, Rule};
use tower::{Layer, Service};
use tower_governor::GovernorLayer;
use tower_governor::governor::{GovernorConfig, GovernorConfigBuilder};
use tower_governor::key_extractor::PeerIpKeyExtractor;

/// Distinct clients in the many-clients case: more than fit in a core's L1, fewer than make the
/// maps' growth part of the figure.
const CLIENTS: usize = 1024;

/// An inner service that answers at once with an empty 200.
#[derive(Debug, Clone, Copy)]
struct Immediate;

impl Service<Request<Body>> for Immediate {
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Response<Body>, std::convert::Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Body>) -> Self::Future {
        std::future::ready(Ok(Response::new(Body::empty())))
    }
}

fn inner() -> Immediate {
    Immediate
}

fn request(peer: IpAddr) -> Request<Body> {
    let mut request = Request::new(Body::empty());
    request
        .extensions_mut()
        .insert(ConnectInfo(SocketAddr::new(peer, 40_000)));
    request
}

/// [`request`], with the header fields a browser's request carries: what a layer's look at the
/// request's headers costs on a real one (tollgate's removes a client's shadow mark from every
/// request).
fn browser_request(peer: IpAddr) -> Request<Body> {
    let mut request = request(peer);
    let headers = request.headers_mut();
    for (name, value) in [
        ("host", "api.example.com"),
        (
            "user-agent",
            "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0",
        ),
        (
            "accept",
            "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
        ),
        ("accept-language", "en-US,en;q=0.5"),
        ("accept-encoding", "gzip, deflate, br, zstd"),
        ("connection", "keep-alive"),
        ("cookie", "session=3f2a9c41d7e84b0c"),
        ("upgrade-insecure-requests", "1"),
    ] {
        headers.insert(name, http::HeaderValue::from_static(value));
    }
    request
}

/// One request through `service`, its future polled once.
#[inline]
fn once<S: Service<Request<Body>>>(service: &mut S, request: Request<Body>) {
    let mut cx = Context::from_waker(Waker::noop());
    let _ = service.poll_ready(&mut cx);
    let future = pin!(service.call(request));
    match future.poll(&mut cx) {
        Poll::Ready(response) => {
            black_box(response.is_ok());
        }
        Poll::Pending => panic!("every service here answers at once"),
    }
}

/// The peer address as axum records it.
#[derive(Debug, Clone, Copy)]
struct ConnectInfoPeer;

impl PeerSource for ConnectInfoPeer {
    #[inline]
    fn peer(&self, extensions: &http::Extensions) -> Option<IpAddr> {
        extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|info| info.0.ip())
    }
}

type TollgateLayer = RateLimitLayer<
    Arc<RateLimiterService<ClientKey, &'static str>>,
    ClientIp<ConnectInfoPeer>,
    &'static str,
>;

fn tollgate_layer(rule: Rule) -> TollgateLayer {
    tollgate_layer_with(rule, false)
}

/// [`tollgate_layer`], sending the `RateLimit-Policy` and `RateLimit` fields on allowed responses
/// too when `headers_on_allowed` (by default only refusals carry them).
fn tollgate_layer_with(rule: Rule, headers_on_allowed: bool) -> TollgateLayer {
    // The default capacity (65 536 clients per plan) holds the `CLIENTS` addresses many times
    // over: none is evicted or loses its slot, so every request is a lookup.
    let service = RateLimiterService::new(
        Algorithm::TokenBucket,
        [("bench", rule)],
        MonotonicClock::new(),
    )
    .expect("a valid rule");
    let key = ClientIp::peer().peer_from(ConnectInfoPeer);
    // No sweeper thread: tower_governor's layer runs none either, and the clients here stay.
    RateLimitLayer::builder(Arc::new(service), key, "bench")
        .headers_on_allowed(headers_on_allowed)
        .without_sweep()
        .build()
}

/// tollgate's rule for a case: always limited after the first request (1 per hour), or never
/// within a run (2^40 per hour).
fn rule(limited: bool) -> Rule {
    if limited {
        Rule::per_hour(1).expect("a valid rule")
    } else {
        Rule::new(1 << 40, Duration::from_secs(3600)).expect("a valid rule")
    }
}

/// tower_governor's configuration for the same job: limited after the first request (a period of
/// one permit per 3600 s with a burst of 1), or never (1 per ns with a full burst).
fn governor_config(
    limited: bool,
) -> GovernorConfig<PeerIpKeyExtractor, NoOpMiddleware<QuantaInstant>> {
    governor_builder(limited)
        .finish()
        .expect("a valid governor configuration")
}

/// [`governor_config`] with tower_governor's `use_headers`: allowed responses carry
/// `x-ratelimit-limit` and `x-ratelimit-remaining`, refusals also `x-ratelimit-remaining`.
fn governor_config_with_headers(
    limited: bool,
) -> GovernorConfig<PeerIpKeyExtractor, StateInformationMiddleware> {
    governor_builder(limited)
        .use_headers()
        .finish()
        .expect("a valid governor configuration")
}

fn governor_builder(
    limited: bool,
) -> GovernorConfigBuilder<PeerIpKeyExtractor, NoOpMiddleware<QuantaInstant>> {
    let mut builder = GovernorConfigBuilder::default();
    if limited {
        builder.per_second(3600).burst_size(1);
    } else {
        builder.per_nanosecond(1).burst_size(u32::MAX);
    }
    builder.key_extractor(PeerIpKeyExtractor)
}

fn addresses() -> Vec<IpAddr> {
    (0..CLIENTS as u32)
        .map(|n| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n)))
        .collect()
}

fn benches(c: &mut Criterion) {
    let one = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 9));
    let many = addresses();
    for (case, limited) in [
        ("allow_one_client", false),
        ("allow_1024_clients", false),
        ("deny", true),
    ] {
        let mut group = c.benchmark_group(format!("tower/{case}"));
        let clients: &[IpAddr] = if case == "allow_1024_clients" {
            &many
        } else {
            std::slice::from_ref(&one)
        };

        let mut bare = inner();
        let mut next = 0;
        group.bench_function("bare", |b| {
            b.iter(|| {
                next = (next + 1) % clients.len();
                once(&mut bare, request(clients[next]));
            })
        });

        let mut tollgate = tollgate_layer(rule(limited)).layer(inner());
        once(&mut tollgate, request(one));
        group.bench_function("tollgate", |b| {
            b.iter(|| {
                next = (next + 1) % clients.len();
                once(&mut tollgate, request(clients[next]));
            })
        });

        let mut governor = GovernorLayer::new(Arc::new(governor_config(limited))).layer(inner());
        once(&mut governor, request(one));
        group.bench_function("tower_governor", |b| {
            b.iter(|| {
                next = (next + 1) % clients.len();
                once(&mut governor, request(clients[next]));
            })
        });
        group.finish();
    }
}

/// The decisions alone, without any layer: what each layer's figure owes to its limiter.
fn checks_alone(c: &mut Criterion) {
    let one = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 9));
    let mut group = c.benchmark_group("tower/check_alone");
    let service = RateLimiterService::<ClientKey, _>::new(
        Algorithm::TokenBucket,
        [(
            "bench",
            Rule::new(1 << 40, Duration::from_secs(3600)).expect("a valid rule"),
        )],
        MonotonicClock::new(),
    )
    .expect("a valid rule");
    let key = ClientKey::Ip(one);
    group.bench_function("tollgate", |b| {
        b.iter(|| black_box(service.acquire(black_box(&key), &"bench", 1).is_ok()))
    });
    let governor =
        governor::RateLimiter::keyed(governor::Quota::per_second(std::num::NonZeroU32::MAX));
    group.bench_function("governor", |b| {
        b.iter(|| black_box(governor.check_key(black_box(&one)).is_ok()))
    });
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args()
}

/// A backend that answers every check with one fixed decision: the layer's own cost, without a
/// limiter's. As the in-process service does, a grant whose figures are not asked for is
/// [`Verdict::allowed`] (nothing boxed), and the error type is boxed.
#[derive(Debug, Clone, Copy)]
struct FixedDecision(tollgate::Decision);

impl RateLimitBackend<ClientKey, &'static str> for FixedDecision {
    type Error = Box<tollgate::ServiceError>;
    type Future = std::future::Ready<Result<Verdict, Box<tollgate::ServiceError>>>;

    fn check(&self, _: &ClientKey, _: &&'static str, _: u64, figures: Figures) -> Self::Future {
        std::future::ready(Ok(
            if self.0.is_allowed() && figures == Figures::OnRefusal {
                Verdict::allowed()
            } else {
                Verdict::from(self.0)
            },
        ))
    }
}

/// A layer over a [`FixedDecision`]: allowing every request, or refusing every one.
fn shell_layer(
    limited: bool,
) -> RateLimitLayer<FixedDecision, ClientIp<ConnectInfoPeer>, &'static str> {
    let service = RateLimiterService::<ClientKey, _>::new(
        Algorithm::TokenBucket,
        [("bench", rule(limited))],
        MonotonicClock::new(),
    )
    .expect("a valid rule");
    // The second request of a limited client is refused as every one after it is, with a wait.
    let decision = (0..2)
        .map(|_| service.acquire(&ClientKey::Global, &"bench", 1))
        .last()
        .expect("two requests")
        .expect("a known plan");
    RateLimitLayer::builder(
        FixedDecision(decision),
        ClientIp::peer().peer_from(ConnectInfoPeer),
        "bench",
    )
    .build()
}

/// Rounds of the paired measurement, and requests per variant per round: short batches in
/// turn, so that a disturbance (another build on the machine) falls on all three variants alike,
/// and the median of many rounds discards it.
const ROUNDS: usize = 301;
const BATCH: usize = 2_000;

/// The variants of one case, timed in turn in short batches; prints each one's median ns per
/// request and the layers' added time over the bare service: first with each layer's defaults
/// (neither sends rate-limit fields on an allowed response), then with both sending them
/// (tollgate's `headers_on_allowed`, tower_governor's `use_headers`).
fn paired(case: &str, clients: &[IpAddr], limited: bool) {
    const VARIANTS: usize = 6;
    let mut bare = inner();
    let mut tollgate = tollgate_layer(rule(limited)).layer(inner());
    let mut governor = GovernorLayer::new(Arc::new(governor_config(limited))).layer(inner());
    let mut shell = shell_layer(limited).layer(inner());
    let mut tollgate_fields = tollgate_layer_with(rule(limited), true).layer(inner());
    let mut governor_fields =
        GovernorLayer::new(Arc::new(governor_config_with_headers(limited))).layer(inner());
    for &client in clients {
        once(&mut tollgate, request(client));
        once(&mut governor, request(client));
        once(&mut tollgate_fields, request(client));
        once(&mut governor_fields, request(client));
    }
    let mut samples: [Vec<f64>; VARIANTS] = Default::default();
    let mut next = 0;
    let mut batch = |variant: usize| {
        let start = std::time::Instant::now();
        for _ in 0..BATCH {
            next = (next + 1) % clients.len();
            let request = request(clients[next]);
            match variant {
                0 => once(&mut bare, request),
                1 => once(&mut tollgate, request),
                2 => once(&mut governor, request),
                3 => once(&mut shell, request),
                4 => once(&mut tollgate_fields, request),
                _ => once(&mut governor_fields, request),
            }
        }
        start.elapsed().as_nanos() as f64 / BATCH as f64
    };
    for round in 0..ROUNDS {
        // Rotate the order, so that no variant always follows the same one.
        for step in 0..VARIANTS {
            let variant = (round + step) % VARIANTS;
            let ns = batch(variant);
            samples[variant].push(ns);
        }
    }
    let [
        bare,
        tollgate,
        governor,
        shell,
        tollgate_fields,
        governor_fields,
    ] = samples.map(|mut ns| {
        ns.sort_by(f64::total_cmp);
        ns[ns.len() / 2]
    });
    println!(
        "paired {case}, defaults (no fields on allowed responses): bare {bare:.1} ns, tollgate \
         {tollgate:.1} ns (+{:.1}), tower_governor {governor:.1} ns (+{:.1}); tollgate's added \
         time is {:.2}x tower_governor's",
        tollgate - bare,
        governor - bare,
        (tollgate - bare) / (governor - bare)
    );
    println!(
        "paired {case}, fields on allowed responses too (headers_on_allowed / use_headers): \
         tollgate {tollgate_fields:.1} ns (+{:.1}), tower_governor {governor_fields:.1} ns \
         (+{:.1}); tollgate's added time is {:.2}x tower_governor's",
        tollgate_fields - bare,
        governor_fields - bare,
        (tollgate_fields - bare) / (governor_fields - bare)
    );
    println!(
        "paired {case}: tollgate's layer alone (defaults, a backend with a fixed answer) adds \
         {:.1} ns",
        shell - bare
    );
}

/// `TOWER_BENCH_LOOP=<variant>,<case>`: only `LOOP_REQUESTS` requests through one variant
/// (`bare`, `tollgate`, `tower_governor`, `shell`, `tollgate_fields`, `tower_governor_fields`;
/// cases as the groups name them), in [`measured_loop`], for counting its
/// instructions under callgrind (`valgrind --tool=callgrind --toggle-collect='*measured_loop*'`),
/// which a shared machine does not disturb.
const LOOP_REQUESTS: usize = 100_000;

#[inline(never)]
fn measured_loop<S: Service<Request<Body>>>(service: &mut S, clients: &[IpAddr]) {
    for n in 0..LOOP_REQUESTS {
        once(service, request(clients[n % clients.len()]));
    }
}

/// [`measured_loop`] with [`browser_request`]'s requests: a loop of its own, so that the other
/// cases' loop is compiled as it always was.
#[inline(never)]
fn measured_loop_browser<S: Service<Request<Body>>>(service: &mut S, client: IpAddr) {
    for _ in 0..LOOP_REQUESTS {
        once(service, browser_request(client));
    }
}

fn instruction_loop(spec: &str) {
    let (variant, case) = spec
        .split_once(',')
        .expect("TOWER_BENCH_LOOP=<variant>,<case>");
    let limited = case == "deny";
    let clients = if case == "allow_1024_clients" {
        addresses()
    } else {
        vec![IpAddr::V4(Ipv4Addr::new(203, 0, 113, 9))]
    };
    // `allow_browser_headers`: one client, its requests with a browser's header fields.
    let browser = case == "allow_browser_headers";
    fn run<S: Service<Request<Body>>>(mut service: S, clients: &[IpAddr], browser: bool) {
        for &client in clients {
            once(&mut service, request(client));
        }
        if browser {
            measured_loop_browser(&mut service, clients[0]);
        } else {
            measured_loop(&mut service, clients);
        }
    }
    match variant {
        "bare" => run(inner(), &clients, browser),
        "tollgate" => run(
            tollgate_layer(rule(limited)).layer(inner()),
            &clients,
            browser,
        ),
        "tower_governor" => run(
            GovernorLayer::new(Arc::new(governor_config(limited))).layer(inner()),
            &clients,
            browser,
        ),
        "shell" => run(shell_layer(limited).layer(inner()), &clients, browser),
        "tollgate_fields" => run(
            tollgate_layer_with(rule(limited), true).layer(inner()),
            &clients,
            browser,
        ),
        "tower_governor_fields" => run(
            GovernorLayer::new(Arc::new(governor_config_with_headers(limited))).layer(inner()),
            &clients,
            browser,
        ),
        _ => panic!("unknown variant {variant}"),
    }
}

fn main() {
    if let Ok(spec) = std::env::var("TOWER_BENCH_LOOP") {
        instruction_loop(&spec);
        return;
    }
    let mut criterion = config();
    benches(&mut criterion);
    checks_alone(&mut criterion);
    criterion.final_summary();
    // Only a measuring run: `cargo test --benches` runs each benchmark once and wants no more.
    if std::env::args().any(|arg| arg == "--bench") {
        let one = [IpAddr::V4(Ipv4Addr::new(203, 0, 113, 9))];
        paired("allow_one_client", &one, false);
        paired("allow_1024_clients", &addresses(), false);
        paired("deny", &one, true);
    }
}
