//! The tower layer's added time per request, against tower_governor doing the same job, and the
//! bare inner service as the baseline, all in one run.
//!
//! Each iteration makes a request carrying axum's `ConnectInfo` (the peer address both layers key
//! on), calls the service and polls its future once (the inner service answers at once). The
//! layer's cost is its figure minus the bare service's; the summary printed at the end gives
//! each layer's added nanoseconds and tollgate's as a fraction of tower_governor's.
//!
//! A second, paired measurement follows criterion's: the three variants timed in turn in short
//! batches, medians over many rounds, which holds up on a machine shared with other work.
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
use governor::middleware::NoOpMiddleware;
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
    let mut builder = GovernorConfigBuilder::default();
    if limited {
        builder.per_second(3600).burst_size(1);
    } else {
        builder.per_nanosecond(1).burst_size(u32::MAX);
    }
    builder
        .key_extractor(PeerIpKeyExtractor)
        .finish()
        .expect("a valid governor configuration")
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
/// limiter's.
#[derive(Debug, Clone, Copy)]
struct FixedDecision(tollgate::Decision);

impl RateLimitBackend<ClientKey, &'static str> for FixedDecision {
    type Error = tollgate::ServiceError;
    type Future = std::future::Ready<Result<Verdict, tollgate::ServiceError>>;

    fn check(&self, _: &ClientKey, _: &&'static str, _: u64, _: Figures) -> Self::Future {
        std::future::ready(Ok(Verdict::from(self.0)))
    }
}

/// Rounds of the paired measurement, and requests per variant per round: short batches in
/// turn, so that a disturbance (another build on the machine) falls on all three variants alike,
/// and the median of many rounds discards it.
const ROUNDS: usize = 301;
const BATCH: usize = 2_000;

/// The variants of one case, timed in turn in short batches; prints each one's median ns per
/// request and the layers' added time over the bare service.
fn paired(case: &str, clients: &[IpAddr], limited: bool) {
    let mut bare = inner();
    let mut tollgate = tollgate_layer(rule(limited)).layer(inner());
    let mut governor = GovernorLayer::new(Arc::new(governor_config(limited))).layer(inner());
    let decision = RateLimiterService::<ClientKey, _>::new(
        Algorithm::TokenBucket,
        [("bench", rule(limited))],
        MonotonicClock::new(),
    )
    .expect("a valid rule")
    .acquire(&ClientKey::Global, &"bench", if limited { 2 } else { 1 })
    .expect("a known plan");
    let mut shell = RateLimitLayer::builder(
        FixedDecision(decision),
        ClientIp::peer().peer_from(ConnectInfoPeer),
        "bench",
    )
    .build()
    .layer(inner());
    for &client in clients {
        once(&mut tollgate, request(client));
        once(&mut governor, request(client));
    }
    let mut samples = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
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
                _ => once(&mut shell, request),
            }
        }
        start.elapsed().as_nanos() as f64 / BATCH as f64
    };
    for round in 0..ROUNDS {
        // Rotate the order, so that no variant always follows the same one.
        for step in 0..4 {
            let variant = (round + step) % 4;
            let ns = batch(variant);
            samples[variant].push(ns);
        }
    }
    let [bare, tollgate, governor, shell] = samples.map(|mut ns| {
        ns.sort_by(f64::total_cmp);
        ns[ns.len() / 2]
    });
    println!(
        "paired {case}: bare {bare:.1} ns, tollgate {tollgate:.1} ns (+{:.1}), tower_governor \
         {governor:.1} ns (+{:.1}); tollgate's added time is {:.2}x tower_governor's",
        tollgate - bare,
        governor - bare,
        (tollgate - bare) / (governor - bare)
    );
    println!(
        "paired {case}: the layer alone (a backend with a fixed answer) adds {:.1} ns",
        shell - bare
    );
}

fn main() {
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
