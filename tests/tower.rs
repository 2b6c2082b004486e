//! The tower layer over loopback: real axum servers on 127.0.0.1:0, a real HTTP client, and a
//! fake clock moved by the tests (no test waits on real time for a limit).
//!
//! The rules are those of `examples/settings/plans.toml` (sliding window log; `free` 5 per second,
//! `pro` 50 per second), read as the examples read them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::routing::get;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tollgate::tower::{
    BodyFormat, ClientIp, ClientKey, Fallback, GlobalKey, HeaderKey, KeyExtractor, RateLimitLayer,
    RateLimitLayerBuilder, Shadow,
};
use tollgate::{Algorithm, FakeClock, RateLimiterService, Rule, Settings};

type Backend = Arc<RateLimiterService<ClientKey, &'static str, FakeClock>>;
type Layer<X> = RateLimitLayer<Backend, X, &'static str>;

const FREE_LIMIT: usize = 5;

/// A layer builder over the example settings, read by `clock`.
fn builder<X: KeyExtractor<Key = ClientKey>>(
    clock: &FakeClock,
    extractor: X,
) -> RateLimitLayerBuilder<Backend, X, &'static str> {
    let settings = Settings::from_path(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/settings/plans.toml"
    ))
    .expect("the example settings are valid");
    RateLimitLayer::from_settings(
        &settings,
        clock.clone(),
        [("free", "free"), ("pro", "pro")],
        extractor,
        "free",
    )
    .expect("the example settings have plans free and pro")
}

/// The peer address as axum records it.
fn peer() -> impl KeyExtractor<Key = ClientKey> + Clone + Send + Sync + 'static {
    ClientIp::peer().peer_source(|extensions| {
        extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|info| info.0.ip())
    })
}

/// The `x-api-key` field, else the peer address.
fn api_key_or_peer() -> impl KeyExtractor<Key = ClientKey> + Clone + Send + Sync + 'static {
    HeaderKey::new(HeaderName::from_static("x-api-key")).or(peer())
}

/// `builder`'s layer with the plan `pro` for an API key that starts with `pro-` (the default
/// plan for any other), and the fields on allowed responses too.
fn by_api_key<X: KeyExtractor<Key = ClientKey>>(
    builder: RateLimitLayerBuilder<Backend, X, &'static str>,
) -> Layer<X> {
    builder
        .plan_fn(|head| {
            let key = head.headers().get("x-api-key")?.as_bytes();
            key.starts_with(b"pro-").then_some("pro")
        })
        .headers_on_allowed(true)
        .build()
}

/// `GET /hello` answers `hello`, and says whether the request was marked by shadow mode.
fn app() -> Router {
    Router::new().route(
        "/hello",
        get(|headers: HeaderMap| async move {
            match headers.get("x-ratelimit-shadowed") {
                Some(mark) => format!("hello (shadowed: {})", mark.to_str().unwrap_or("?")),
                None => "hello".to_owned(),
            }
        }),
    )
}

/// Serves `app()` behind `layer` on a fresh loopback port.
async fn serve<X>(layer: Layer<X>) -> SocketAddr
where
    X: KeyExtractor<Key = ClientKey> + Send + Sync + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = app().layer(layer);
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

/// Serves `app()` behind `layer` without recording the peer's address.
async fn serve_without_peer<X>(layer: Layer<X>) -> SocketAddr
where
    X: KeyExtractor<Key = ClientKey> + Send + Sync + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = app().layer(layer);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|value| value.to_str().unwrap())
    }
}

fn client() -> Client<HttpConnector, Empty<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn send(
    client: &Client<HttpConnector, Empty<Bytes>>,
    addr: SocketAddr,
    headers: &[(&str, HeaderValue)],
) -> Reply {
    let mut request = Request::get(format!("http://{addr}/hello"));
    for (name, value) in headers {
        request = request.header(*name, value.clone());
    }
    let response: Response<_> = client
        .request(request.body(Empty::new()).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

async fn get_plain(client: &Client<HttpConnector, Empty<Bytes>>, addr: SocketAddr) -> Reply {
    send(client, addr, &[]).await
}

fn value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_over_the_limit_gets_429_with_exact_headers() {
    let clock = FakeClock::new();
    let layer = builder(&clock, peer()).build();
    let addr = serve(layer.clone()).await;
    let client = client();
    for n in 0..FREE_LIMIT {
        let reply = get_plain(&client, addr).await;
        assert_eq!(reply.status, StatusCode::OK, "request {n}");
        assert_eq!(reply.body, "hello");
        assert_eq!(reply.header("ratelimit"), None, "off by default on allowed");
    }
    let reply = get_plain(&client, addr).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(reply.header("ratelimit-policy"), Some(r#""free";q=5;w=1"#));
    assert_eq!(reply.header("ratelimit"), Some(r#""free";r=0;t=1"#));
    assert_eq!(
        reply.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(reply.body, "Too Many Requests: retry in 1 s\n");
    let stats = layer.stats();
    assert_eq!(
        (
            stats.requests,
            stats.checked,
            stats.allowed,
            stats.limited,
            stats.enforced
        ),
        (6, 6, 5, 1, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_retry_after_lets_the_next_request_through() {
    let clock = FakeClock::new();
    let addr = serve(builder(&clock, peer()).build()).await;
    let client = client();
    for _ in 0..FREE_LIMIT {
        assert_eq!(get_plain(&client, addr).await.status, StatusCode::OK);
    }
    clock.advance(Duration::from_millis(400));
    let refused = get_plain(&client, addr).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    // 600 ms left, rounded up to a whole second: never 0.
    assert_eq!(refused.header("retry-after"), Some("1"));
    clock.advance(Duration::from_millis(599));
    assert_eq!(
        get_plain(&client, addr).await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "1 ms early"
    );
    clock.advance(Duration::from_millis(1));
    assert_eq!(get_plain(&client, addr).await.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoofed_forwarded_for_from_an_untrusted_peer_does_not_change_the_key() {
    let clock = FakeClock::new();
    // Trusts only 10.0.0.0/8: the loopback peer is not a proxy of ours.
    let extractor =
        ClientIp::behind_proxies(["10.0.0.0/8".parse().unwrap()]).peer_source(|extensions| {
            extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|info| info.0.ip())
        });
    let addr = serve(builder(&clock, extractor).build()).await;
    let client = client();
    for n in 0..FREE_LIMIT {
        let spoof = value(&format!("198.51.100.{n}"));
        let reply = send(&client, addr, &[("x-forwarded-for", spoof)]).await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    let reply = send(
        &client,
        addr,
        &[("x-forwarded-for", value("198.51.100.200"))],
    )
    .await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    let reply = send(&client, addr, &[("forwarded", value("for=198.51.100.201"))]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_the_rightmost_untrusted_address_is_the_key() {
    let clock = FakeClock::new();
    // The loopback peer plays the trusted proxy.
    let extractor =
        ClientIp::behind_proxies(["127.0.0.0/8".parse().unwrap()]).peer_source(|extensions| {
            extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|info| info.0.ip())
        });
    let addr = serve(builder(&clock, extractor).build()).await;
    let client = client();
    // The client wrote a different leftmost entry each time; the proxy saw 203.0.113.5.
    for n in 0..FREE_LIMIT {
        let chain = value(&format!("198.51.100.{n}, 203.0.113.5"));
        let reply = send(&client, addr, &[("x-forwarded-for", chain)]).await;
        assert_eq!(reply.status, StatusCode::OK, "request {n}");
    }
    let chain = value("198.51.100.99, 203.0.113.5");
    let reply = send(&client, addr, &[("x-forwarded-for", chain)]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    // Another client behind the same proxy has its own limit.
    let reply = send(&client, addr, &[("x-forwarded-for", value("203.0.113.6"))]).await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ipv6_addresses_in_one_64_share_a_limit() {
    let clock = FakeClock::new();
    let extractor =
        ClientIp::behind_proxies(["127.0.0.1".parse().unwrap()]).peer_source(|extensions| {
            extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|info| info.0.ip())
        });
    let addr = serve(builder(&clock, extractor).build()).await;
    let client = client();
    for n in 0..FREE_LIMIT {
        // Alternating addresses within 2001:db8:1:2::/64.
        let address = if n % 2 == 0 {
            "2001:db8:1:2::1"
        } else {
            "[2001:db8:1:2:ffff:ffff:ffff:fffe]:443"
        };
        let reply = send(&client, addr, &[("x-forwarded-for", value(address))]).await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    let reply = send(
        &client,
        addr,
        &[("x-forwarded-for", value("2001:db8:1:2::77"))],
    )
    .await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    // The neighbouring /64 is another client.
    let reply = send(
        &client,
        addr,
        &[("x-forwarded-for", value("2001:db8:1:3::1"))],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    // And IPv4 clients written as mapped IPv6 stay apart from each other.
    let reply = send(
        &client,
        addr,
        &[("x-forwarded-for", value("::ffff:192.0.2.1"))],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_lets_everything_through_marks_and_counts() {
    let clock = FakeClock::new();
    let layer = builder(&clock, peer())
        .shadow(Shadow::new(1.0, 0.0))
        .build();
    let addr = serve(layer.clone()).await;
    let client = client();
    let mut marked = 0;
    for _ in 0..20 {
        let reply = get_plain(&client, addr).await;
        assert_eq!(reply.status, StatusCode::OK);
        if reply.body != "hello" {
            assert_eq!(reply.body, r#"hello (shadowed: "free";r=0;t=1)"#);
            marked += 1;
        }
    }
    assert_eq!(marked, 20 - FREE_LIMIT);
    let stats = layer.stats();
    assert_eq!(
        (
            stats.requests,
            stats.checked,
            stats.allowed,
            stats.limited,
            stats.enforced
        ),
        (20, 20, 5, 15, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_enforces_its_fraction_of_the_limited() {
    let clock = FakeClock::new();
    let layer = builder(&clock, peer())
        .shadow(Shadow::new(1.0, 0.5))
        .build();
    let addr = serve(layer.clone()).await;
    let client = client();
    let mut refused = 0;
    for _ in 0..(FREE_LIMIT + 10) {
        if get_plain(&client, addr).await.status == StatusCode::TOO_MANY_REQUESTS {
            refused += 1;
        }
    }
    assert_eq!(refused, 5);
    let stats = layer.stats();
    assert_eq!((stats.limited, stats.enforced), (10, 5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_connections_of_one_client_never_get_more_than_the_limit() {
    let clock = FakeClock::new();
    let addr = serve(builder(&clock, peer()).build()).await;
    for round in 0..3 {
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                tokio::spawn(async move {
                    // A client per task: each opens its own connection.
                    get_plain(&client(), addr).await.status
                })
            })
            .collect();
        let mut allowed = 0;
        for task in tasks {
            let status = task.await.unwrap();
            assert!(
                status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
                "{status}"
            );
            allowed += usize::from(status == StatusCode::OK);
        }
        assert_eq!(allowed, FREE_LIMIT, "round {round}");
        clock.advance(Duration::from_secs(1));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_headers_get_a_defined_answer() {
    let clock = FakeClock::new();
    let trusted =
        ClientIp::behind_proxies(["127.0.0.0/8".parse().unwrap()]).peer_source(|extensions| {
            extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|info| info.0.ip())
        });
    let extractor = HeaderKey::new(HeaderName::from_static("x-api-key")).or(trusted);
    let layer = builder(&clock, extractor)
        .plan_fn(|head| {
            let key = head.headers().get("x-api-key")?.to_str().ok()?;
            key.starts_with("pro-").then_some("pro")
        })
        .build();
    let addr = serve(layer.clone()).await;
    let client = client();
    let huge_chain = vec!["10.0.0.1"; 2000].join(",");
    let hostile = [
        ("x-forwarded-for", value(&huge_chain)),
        ("x-forwarded-for", value("[::1, 300.1.1.1, ::::, \"")),
        (
            "x-forwarded-for",
            HeaderValue::from_bytes(b"203.0.113.1, \xff\xfe\x80").unwrap(),
        ),
        (
            "forwarded",
            HeaderValue::from_bytes(b"for=\"\xc3\x28\";by=;;;,,,").unwrap(),
        ),
        ("x-api-key", value(&"k".repeat(10_000))),
        (
            "x-api-key",
            HeaderValue::from_bytes(b"pro-\xff\xfe").unwrap(),
        ),
    ];
    for (name, header) in &hostile {
        let reply = send(&client, addr, &[(name, header.clone())]).await;
        assert!(
            reply.status == StatusCode::OK || reply.status == StatusCode::TOO_MANY_REQUESTS,
            "{name}: {}",
            reply.status
        );
    }
    // The non-UTF-8 API key is a key of its own, of the default plan: its own limit of 5.
    let odd_key = HeaderValue::from_bytes(b"pro-\xff\xfe").unwrap();
    let statuses: Vec<StatusCode> = {
        let mut statuses = Vec::new();
        for _ in 0..FREE_LIMIT {
            statuses.push(
                send(&client, addr, &[("x-api-key", odd_key.clone())])
                    .await
                    .status,
            );
        }
        statuses
    };
    assert_eq!(
        statuses.iter().filter(|s| **s == StatusCode::OK).count(),
        FREE_LIMIT - 1,
        "one of the five was used above"
    );
    assert_eq!(layer.stats().errors, 0);
}

/// The default plan's `RateLimit-Policy` value is written by its first response and kept; a rule
/// change of the plan (several limits, then one again) is in the next response's fields,
/// allowed or refused, and a plan chosen per request has its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_field_follows_rule_changes_of_the_default_plan() {
    // A token bucket, which enforces several limits together (the example settings' sliding
    // log does not).
    let service = RateLimiterService::new(
        Algorithm::TokenBucket,
        [
            ("free", Rule::per_second(5).unwrap()),
            ("pro", Rule::per_second(50).unwrap()),
        ],
        FakeClock::new(),
    )
    .unwrap();
    let backend = Arc::new(service);
    let layer = by_api_key(RateLimitLayer::builder(
        Arc::clone(&backend),
        api_key_or_peer(),
        "free",
    ));
    let addr = serve(layer).await;
    let client = client();
    let policy_of = |key: &str| {
        let headers = [("x-api-key", value(key))];
        let (client, addr) = (client.clone(), addr);
        async move {
            let reply = send(&client, addr, &headers).await;
            let field = |name| reply.header(name).map(str::to_owned);
            (reply.status, field("ratelimit-policy"), field("ratelimit"))
        }
    };
    let policy = |text: &str| Some(text.to_owned());

    for n in 0..2 {
        let (status, policy_field, _) = policy_of("a").await;
        assert_eq!(status, StatusCode::OK, "request {n}");
        assert_eq!(policy_field, policy(r#""free";q=5;w=1"#), "request {n}");
    }
    let (_, pro, _) = policy_of("pro-1").await;
    assert_eq!(pro, policy(r#""pro";q=50;w=1"#));

    // Several limits: one item per limit, named by its window.
    backend
        .set_limits(
            &"free",
            [
                Rule::per_second(2).unwrap(),
                Rule::new(7, Duration::from_secs(60)).unwrap(),
            ],
        )
        .unwrap();
    let several = policy(r#""free-1s";q=2;w=1, "free-1m";q=7;w=60"#);
    for n in 0..2 {
        let (status, policy_field, state) = policy_of("b").await;
        assert_eq!(status, StatusCode::OK, "request {n}");
        assert_eq!(policy_field, several, "request {n}");
        let state = state.expect("a RateLimit field");
        let (first, second) = state.split_once(", ").expect("two items");
        assert!(
            first.starts_with(&format!(r#""free-1s";r={};"#, 1 - n)),
            "{state}"
        );
        assert!(
            second.starts_with(&format!(r#""free-1m";r={};"#, 6 - n)),
            "{state}"
        );
    }
    let (status, policy_field, _) = policy_of("b").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(policy_field, several, "the refusal's fields too");

    // One limit again, of another quota and window.
    backend
        .set_rule(&"free", Rule::new(3, Duration::from_secs(10)).unwrap())
        .unwrap();
    for n in 0..3 {
        let (status, policy_field, _) = policy_of("c").await;
        assert_eq!(status, StatusCode::OK, "request {n}");
        assert_eq!(policy_field, policy(r#""free";q=3;w=10"#), "request {n}");
    }
    let (status, policy_field, _) = policy_of("c").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(policy_field, policy(r#""free";q=3;w=10"#));
    let (_, pro, _) = policy_of("pro-1").await;
    assert_eq!(pro, policy(r#""pro";q=50;w=1"#));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_pick_their_plan_and_their_own_limit() {
    let clock = FakeClock::new();
    let layer = by_api_key(builder(&clock, api_key_or_peer()));
    let addr = serve(layer).await;
    let client = client();
    let pro = [("x-api-key", value("pro-42"))];
    for n in 0..50 {
        let reply = send(&client, addr, &pro).await;
        assert_eq!(reply.status, StatusCode::OK, "pro request {n}");
        let expected = format!(r#""pro";r={};t=1"#, 49 - n);
        assert_eq!(reply.header("ratelimit"), Some(expected.as_str()));
    }
    let reply = send(&client, addr, &pro).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.header("ratelimit-policy"), Some(r#""pro";q=50;w=1"#));
    // A free key and the keyless address each have their own free limit.
    let free = [("x-api-key", value("abc"))];
    let reply = send(&client, addr, &free).await;
    assert_eq!(reply.header("ratelimit-policy"), Some(r#""free";q=5;w=1"#));
    assert_eq!(reply.header("ratelimit"), Some(r#""free";r=4;t=1"#));
    let reply = get_plain(&client, addr).await;
    assert_eq!(reply.header("ratelimit"), Some(r#""free";r=4;t=1"#));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_key_is_refused_by_default_or_let_through_if_configured() {
    let clock = FakeClock::new();
    let refusing = builder(&clock, peer()).build();
    let addr = serve_without_peer(refusing.clone()).await;
    let client = client();
    let reply = get_plain(&client, addr).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    // The server records no peer address: the answer says what the key looked for.
    assert!(
        reply
            .body
            .starts_with("the peer's address is not among the request's extensions"),
        "{}",
        reply.body
    );
    assert_eq!(refusing.stats().unkeyed, 1);

    let open = builder(&clock, peer())
        .on_missing_key(Fallback::Allow)
        .build();
    let addr = serve_without_peer(open).await;
    for _ in 0..(FREE_LIMIT + 3) {
        assert_eq!(get_plain(&client, addr).await.status, StatusCode::OK);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_without_a_rule_gets_a_defined_answer() {
    let clock = FakeClock::new();
    let layer = builder(&clock, GlobalKey)
        .plan_fn(|_| Some("enterprise"))
        .build();
    let addr = serve(layer.clone()).await;
    let client = client();
    let reply = get_plain(&client, addr).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.body, "rate limit check failed\n");
    assert_eq!(layer.stats().errors, 1);

    let open = builder(&clock, GlobalKey)
        .plan_fn(|_| Some("enterprise"))
        .on_error(Fallback::Allow)
        .build();
    let addr = serve(open).await;
    assert_eq!(get_plain(&client, addr).await.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_over_the_limit_get_resource_exhausted() {
    let clock = FakeClock::new();
    let addr = serve(builder(&clock, GlobalKey).build()).await;
    let client = client();
    let grpc = [("content-type", value("application/grpc"))];
    for _ in 0..FREE_LIMIT {
        assert_eq!(send(&client, addr, &grpc).await.status, StatusCode::OK);
    }
    let reply = send(&client, addr, &grpc).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("grpc-status"), Some("8"));
    assert_eq!(reply.header("content-type"), Some("application/grpc"));
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(reply.body, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn problem_json_names_the_violated_policy() {
    let clock = FakeClock::new();
    let addr = serve(
        builder(&clock, GlobalKey)
            .body_format(BodyFormat::ProblemJson)
            .build(),
    )
    .await;
    let client = client();
    for _ in 0..FREE_LIMIT {
        get_plain(&client, addr).await;
    }
    let reply = get_plain(&client, addr).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        reply.body,
        r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,"violated-policies":["free"]}"#
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_response_hook_builds_the_answer() {
    let clock = FakeClock::new();
    let layer = builder(&clock, GlobalKey)
        .on_limited(|limited| {
            let mut response =
                Response::new(Bytes::from(format!("slow down, {} plan", limited.policy())));
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            response.headers_mut().extend(limited.headers().clone());
            response
        })
        .build();
    let addr = serve(layer).await;
    let client = client();
    for _ in 0..FREE_LIMIT {
        get_plain(&client, addr).await;
    }
    let reply = get_plain(&client, addr).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.body, "slow down, free plan");
    assert_eq!(reply.header("retry-after"), Some("1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_the_method_can_never_grant_is_refused_without_retry_after() {
    let clock = FakeClock::new();
    // The free plan allows 5 per second: 6 at once can never be granted.
    let layer = builder(&clock, GlobalKey).cost_fn(|_| 6).build();
    let addr = serve(layer).await;
    let reply = get_plain(&client(), addr).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.header("retry-after"), None);
    assert!(
        reply
            .body
            .starts_with("Too Many Requests: 6 permits requested")
    );
}

#[test]
fn the_layer_is_cheap_to_clone_and_shares_its_limits() {
    use tower::{Layer as _, Service, ServiceExt};
    let clock = FakeClock::new();
    let layer = builder(&clock, GlobalKey).build();
    let inner = tower::service_fn(|_: Request<()>| async {
        Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Empty::<Bytes>::new()))
    });
    let first = layer.layer(inner);
    let second = layer.clone().layer(inner);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let statuses: Vec<StatusCode> = runtime.block_on(async {
        let mut statuses = Vec::new();
        for n in 0..(2 * FREE_LIMIT) {
            let mut service = if n % 2 == 0 {
                first.clone()
            } else {
                second.clone()
            };
            let service = service.ready().await.unwrap();
            statuses.push(service.call(Request::new(())).await.unwrap().status());
        }
        statuses
    });
    let allowed = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(allowed, FREE_LIMIT);
    // The inner service stays reachable, as tower's own middleware has it.
    let _inner: &_ = first.get_ref();
    let _inner = second.into_inner();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_clients_are_swept_by_the_layer_itself() {
    let clock = FakeClock::new();
    let layer = builder(&clock, HeaderKey::new(HeaderName::from_static("x-api-key")))
        .sweep_every(Duration::from_millis(5))
        .unwrap()
        .build();
    let addr = serve(layer.clone()).await;
    let client = client();
    for n in 0..3 {
        let key = [("x-api-key", value(&format!("client-{n}")))];
        assert_eq!(send(&client, addr, &key).await.status, StatusCode::OK);
    }
    assert_eq!(layer.backend().len(), 3);
    // Past every client's window: all idle. The sweeper thread notices within a few of its
    // intervals; the wait is for that thread, not for any limit.
    clock.advance(Duration::from_secs(2));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !layer.backend().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} clients left",
            layer.backend().len()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A backend that answers only after yielding to the runtime once, as one over the network would.
#[derive(Debug, Clone)]
struct Deferred(Backend);

impl tollgate::tower::RateLimitBackend<ClientKey, &'static str> for Deferred {
    type Error = tollgate::ServiceError;
    type Future = std::pin::Pin<
        Box<dyn Future<Output = Result<tollgate::tower::Verdict, tollgate::ServiceError>> + Send>,
    >;

    fn check(
        &self,
        key: &ClientKey,
        plan: &&'static str,
        cost: u64,
        _: tollgate::tower::Figures,
    ) -> Self::Future {
        let (service, key, plan) = (Arc::clone(&self.0), key.clone(), *plan);
        Box::pin(async move {
            tokio::task::yield_now().await;
            service.acquire(&key, &plan, cost).map(Into::into)
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_answers_later_limits_the_same() {
    let clock = FakeClock::new();
    let service = Arc::clone(builder(&clock, GlobalKey).build().backend());
    let layer = RateLimitLayer::builder(Deferred(service), GlobalKey, "free")
        .headers_on_allowed(true)
        .build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = app().layer(layer.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = client();
    for n in 0..FREE_LIMIT {
        let reply = get_plain(&client, addr).await;
        assert_eq!(reply.status, StatusCode::OK);
        let expected = format!(r#""free";r={};t=1"#, FREE_LIMIT - 1 - n);
        assert_eq!(reply.header("ratelimit"), Some(expected.as_str()));
    }
    let reply = get_plain(&client, addr).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(reply.header("ratelimit"), Some(r#""free";r=0;t=1"#));
    assert_eq!(layer.stats().enforced, 1);
}

/// A backend that reports no grant: `Verdict::allowed()` for every request within the limit,
/// whatever the layer asks, and the decision for a refusal.
#[derive(Debug, Clone)]
struct QuietGrants(Backend);

impl tollgate::tower::RateLimitBackend<ClientKey, &'static str> for QuietGrants {
    type Error = tollgate::ServiceError;
    type Future = std::future::Ready<Result<tollgate::tower::Verdict, tollgate::ServiceError>>;

    fn check(
        &self,
        key: &ClientKey,
        plan: &&'static str,
        cost: u64,
        _: tollgate::tower::Figures,
    ) -> Self::Future {
        std::future::ready(self.0.acquire(key, plan, cost).map(|decision| {
            if decision.is_allowed() {
                tollgate::tower::Verdict::allowed()
            } else {
                decision.into()
            }
        }))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_reports_nothing_passes_without_fields_and_a_refusal_still_has_them() {
    let clock = FakeClock::new();
    let service = Arc::clone(builder(&clock, GlobalKey).build().backend());
    let layer = RateLimitLayer::builder(QuietGrants(service), GlobalKey, "free")
        .headers_on_allowed(true)
        .build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = app().layer(layer.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = client();
    for _ in 0..FREE_LIMIT {
        let reply = get_plain(&client, addr).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.header("ratelimit"), None);
        assert_eq!(reply.header("ratelimit-policy"), None);
    }
    let reply = get_plain(&client, addr).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(reply.header("ratelimit"), Some(r#""free";r=0;t=1"#));
    let stats = layer.stats();
    assert_eq!((stats.allowed, stats.enforced), (FREE_LIMIT as u64, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_of_several_limits_reports_each_in_the_fields() {
    let settings = Settings::from_toml_str(
        r#"
        algorithm = "token_bucket"
        [plans.free]
        limits = [{ limit = 3, window = "1s" }, { limit = 5, window = "10s" }]
        [plans.pro]
        limit = 50
        window = "1s"
        "#,
    )
    .unwrap();
    let clock = FakeClock::new();
    let layer = RateLimitLayer::from_settings(
        &settings,
        clock.clone(),
        [("free", "free"), ("pro", "pro")],
        peer(),
        "free",
    )
    .unwrap()
    .build();
    let addr = serve(layer).await;
    let client = client();
    for n in 0..3 {
        assert_eq!(
            get_plain(&client, addr).await.status,
            StatusCode::OK,
            "request {n}"
        );
    }
    let reply = get_plain(&client, addr).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        reply.header("ratelimit-policy"),
        Some(r#""free-1s";q=3;w=1, "free-10s";q=5;w=10"#)
    );
    assert_eq!(
        reply.header("ratelimit"),
        Some(r#""free-1s";r=0;t=1, "free-10s";r=2;t=6"#)
    );
    assert_eq!(reply.header("retry-after"), Some("1"));
}

/// A sliding log's single permits, taken for a response that reports refusals only: the limit
/// holds, grants report nothing, and refusals keep their exact figures.
#[test]
fn a_sliding_log_taken_without_its_remaining_count_keeps_the_limit_and_the_refusal_figures() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    use tollgate::tower::{Figures, RateLimitBackend};
    use tollgate::{Algorithm, Rule};

    fn now<F: Future>(future: F) -> F::Output {
        let mut future = std::pin::pin!(future);
        match future
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(output) => output,
            Poll::Pending => panic!("the in-process backend answers at once"),
        }
    }

    let clock = FakeClock::new();
    let service = RateLimiterService::<u64, &str, FakeClock>::new(
        Algorithm::SlidingWindowLog,
        [("free", Rule::per_second(3).unwrap())],
        clock.clone(),
    )
    .unwrap();
    for step in 0..3u64 {
        let verdict = now(service.check(&7, &"free", 1, Figures::OnRefusal)).unwrap();
        assert!(verdict.is_allowed(), "permit {step}");
        assert_eq!(verdict.decision(), None, "nothing to report");
        clock.advance(Duration::from_millis(100));
    }
    let verdict = now(service.check(&7, &"free", 1, Figures::OnRefusal)).unwrap();
    let refusal = verdict.decision().expect("a refusal reports its decision");
    assert!(refusal.is_denied());
    // The first admission, at 0, leaves the window at 1 s; the clock reads 300 ms.
    assert_eq!(refusal.retry_after(), Duration::from_millis(700));
    assert_eq!(refusal.limit(), 3);
    clock.advance(Duration::from_millis(700));
    assert!(
        now(service.check(&7, &"free", 1, Figures::OnRefusal))
            .unwrap()
            .is_allowed()
    );
    // The counted path agrees on what is left: the 2nd and 3rd admissions are still in.
    assert_eq!(service.peek(&7, &"free").unwrap().remaining(), 0);
    clock.advance(Duration::from_millis(100));
    assert_eq!(service.peek(&7, &"free").unwrap().remaining(), 1);
}
