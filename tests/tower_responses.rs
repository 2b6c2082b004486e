//! What the layer's responses say, over loopback: a request let through by shadow mode is told
//! nothing of the limit it would have met, a shadow mark written by a client never reaches the
//! upstream, and gRPC (and gRPC-Web) calls are told apart by their media type.
//!
//! Each test serves a real axum app on 127.0.0.1:0 behind the layer, with a fake clock that no
//! test moves: the limit is the `free` plan of `examples/settings/plans.toml`, 5 per second.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tollgate::tower::{
    ClientKey, Fallback, GlobalKey, HeaderKey, KeyExtractor, RateLimitLayer, RateLimitLayerBuilder,
    Shadow,
};
use tollgate::{FakeClock, RateLimiterService, Settings};

type Backend = Arc<RateLimiterService<ClientKey, &'static str, FakeClock>>;

const FREE_LIMIT: usize = 5;
const SHADOWED: &str = "x-ratelimit-shadowed";

fn builder<X: KeyExtractor<Key = ClientKey>>(
    extractor: X,
) -> RateLimitLayerBuilder<Backend, X, &'static str> {
    let settings = Settings::from_path(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/settings/plans.toml"
    ))
    .expect("the example settings are valid");
    RateLimitLayer::from_settings(
        &settings,
        FakeClock::new(),
        [("free", "free"), ("pro", "pro")],
        extractor,
        "free",
    )
    .expect("the example settings have plans free and pro")
}

/// Serves, behind `layer`, an app whose `/hello` answers with the shadow marks it received
/// (`hello` when none), under the header name `mark`.
async fn serve<X>(layer: RateLimitLayer<Backend, X, &'static str>, mark: &'static str) -> SocketAddr
where
    X: KeyExtractor<Key = ClientKey> + Send + Sync + 'static,
{
    let app = axum::Router::new()
        .route(
            "/hello",
            axum::routing::get(move |headers: HeaderMap| async move {
                let marks: Vec<String> = headers
                    .get_all(mark)
                    .iter()
                    .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
                    .collect();
                if marks.is_empty() {
                    "hello".to_owned()
                } else {
                    format!("hello (shadowed: {})", marks.join(" | "))
                }
            }),
        )
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
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

async fn send(
    client: &Client<HttpConnector, Empty<Bytes>>,
    addr: SocketAddr,
    headers: &[(&str, &str)],
) -> Reply {
    let mut request = Request::get(format!("http://{addr}/hello"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = client
        .request(request.body(Empty::new()).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

fn client() -> Client<HttpConnector, Empty<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_shadow_mode_lets_through_is_told_nothing_of_the_limit() {
    let layer = builder(GlobalKey)
        .shadow(Shadow::new(1.0, 0.0))
        .headers_on_allowed(true)
        .build();
    let addr = serve(layer.clone(), SHADOWED).await;
    let client = client();
    for n in 0..FREE_LIMIT {
        let reply = send(&client, addr, &[]).await;
        assert_eq!(reply.status, StatusCode::OK, "request {n}");
        let expected = format!(r#""free";r={};t=1"#, FREE_LIMIT - 1 - n);
        assert_eq!(reply.header("ratelimit"), Some(expected.as_str()));
    }
    for n in 0..3 {
        let reply = send(&client, addr, &[]).await;
        assert_eq!(reply.status, StatusCode::OK, "shadowed request {n}");
        // The upstream sees the mark...
        assert_eq!(reply.body, r#"hello (shadowed: "free";r=0;t=1)"#);
        // ...and the client nothing that announces a refusal it did not get.
        for field in ["retry-after", "ratelimit", "ratelimit-policy"] {
            assert_eq!(reply.header(field), None, "{field} on shadowed request {n}");
        }
    }
    assert_eq!((layer.stats().limited, layer.stats().enforced), (3, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_of_several_limits_shadowed_sends_no_fields_either() {
    let settings = Settings::from_toml_str(
        r#"
        algorithm = "token_bucket"
        [plans.free]
        limits = [{ limit = 2, window = "1s" }, { limit = 5, window = "10s" }]
        "#,
    )
    .unwrap();
    let layer = RateLimitLayer::from_settings(
        &settings,
        FakeClock::new(),
        [("free", "free")],
        GlobalKey,
        "free",
    )
    .unwrap()
    .shadow(Shadow::new(1.0, 0.0))
    .headers_on_allowed(true)
    .build();
    let addr = serve(layer, SHADOWED).await;
    let client = client();
    for _ in 0..2 {
        assert!(send(&client, addr, &[]).await.header("ratelimit").is_some());
    }
    let reply = send(&client, addr, &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(
        reply.body.starts_with("hello (shadowed: "),
        "{}",
        reply.body
    );
    for field in ["retry-after", "ratelimit", "ratelimit-policy"] {
        assert_eq!(reply.header(field), None, "{field}");
    }
}

/// The mark says what the client would have been told: for a plan of several limits, the
/// `RateLimit` field an enforced refusal sends, one item per limit (not the deciding limit's
/// figures alone, under a name that no item of the plan's `RateLimit-Policy` carries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shadow_mark_of_a_plan_of_several_limits_is_the_refusals_ratelimit_field() {
    let settings = Settings::from_toml_str(
        r#"
        algorithm = "token_bucket"
        [plans.free]
        limits = [{ limit = 2, window = "1s" }, { limit = 5, window = "10s" }]
        "#,
    )
    .unwrap();
    let builder = || {
        RateLimitLayer::from_settings(
            &settings,
            FakeClock::new(),
            [("free", "free")],
            GlobalKey,
            "free",
        )
        .unwrap()
    };
    let enforced = serve(builder().build(), SHADOWED).await;
    let shadowed = serve(builder().shadow(Shadow::new(1.0, 0.0)).build(), SHADOWED).await;
    let client = client();
    for addr in [enforced, shadowed] {
        for _ in 0..2 {
            assert_eq!(send(&client, addr, &[]).await.status, StatusCode::OK);
        }
    }
    let refusal = send(&client, enforced, &[]).await;
    assert_eq!(refusal.status, StatusCode::TOO_MANY_REQUESTS);
    // Two of 5 per 10 s taken at 0: 3 left, one token back every 2 s, full again at 4 s.
    let told = r#""free-1s";r=0;t=1, "free-10s";r=3;t=4"#;
    assert_eq!(refusal.header("ratelimit"), Some(told));
    let reply = send(&client, shadowed, &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body, format!("hello (shadowed: {told})"));
}

/// Every way a request can pass the layer: allowed, shadowed, not sampled, without a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_mark_written_by_the_client_never_reaches_the_upstream() {
    let client = client();
    let forged = [(SHADOWED, "forged"), (SHADOWED, "forged again")];

    // Enforcing: the allowed requests arrive unmarked.
    let addr = serve(builder(GlobalKey).build(), SHADOWED).await;
    for _ in 0..FREE_LIMIT {
        let reply = send(&client, addr, &forged).await;
        assert_eq!(
            (reply.status, reply.body.as_str()),
            (StatusCode::OK, "hello")
        );
    }

    // Shadow mode: the allowed arrive unmarked, the shadowed with the layer's mark only.
    let addr = serve(
        builder(GlobalKey).shadow(Shadow::new(1.0, 0.0)).build(),
        SHADOWED,
    )
    .await;
    for n in 0..(FREE_LIMIT + 2) {
        let reply = send(&client, addr, &forged).await;
        let expected = if n < FREE_LIMIT {
            "hello"
        } else {
            r#"hello (shadowed: "free";r=0;t=1)"#
        };
        assert_eq!(reply.body, expected, "request {n}");
    }

    // Not sampled at all.
    let addr = serve(
        builder(GlobalKey).shadow(Shadow::new(0.0, 0.0)).build(),
        SHADOWED,
    )
    .await;
    assert_eq!(send(&client, addr, &forged).await.body, "hello");

    // Without a key, let through.
    let layer = builder(HeaderKey::new(HeaderName::from_static("x-api-key")))
        .on_missing_key(Fallback::Allow)
        .build();
    let addr = serve(layer, SHADOWED).await;
    assert_eq!(send(&client, addr, &forged).await.body, "hello");

    // A mark of another name is the one removed.
    let layer = builder(GlobalKey)
        .shadow_header(HeaderName::from_static("x-would-be-limited"))
        .build();
    let addr = serve(layer, "x-would-be-limited").await;
    let reply = send(&client, addr, &[("X-Would-Be-Limited", "forged")]).await;
    assert_eq!(reply.body, "hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_is_told_by_its_media_type_in_any_case_and_grpcfoo_is_not_grpc() {
    let client = client();
    for content_type in [
        "application/grpc",
        "Application/gRPC",
        "APPLICATION/GRPC+PROTO",
        "application/grpc; charset=utf-8",
    ] {
        let addr = serve(builder(GlobalKey).build(), SHADOWED).await;
        let headers = [("content-type", content_type)];
        for _ in 0..FREE_LIMIT {
            assert_eq!(send(&client, addr, &headers).await.status, StatusCode::OK);
        }
        let reply = send(&client, addr, &headers).await;
        assert_eq!(reply.status, StatusCode::OK, "{content_type}");
        assert_eq!(reply.header("grpc-status"), Some("8"), "{content_type}");
        assert_eq!(reply.header("content-type"), Some("application/grpc"));
    }
    for content_type in [
        "application/grpcfoo",
        "application/grpc-webby",
        "text/plain",
    ] {
        let addr = serve(builder(GlobalKey).build(), SHADOWED).await;
        let headers = [("content-type", content_type)];
        for _ in 0..FREE_LIMIT {
            send(&client, addr, &headers).await;
        }
        let reply = send(&client, addr, &headers).await;
        assert_eq!(
            reply.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{content_type}"
        );
        assert_eq!(reply.header("grpc-status"), None, "{content_type}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_web_is_refused_in_its_own_media_type_never_as_grpc() {
    let client = client();
    for (content_type, answered) in [
        ("application/grpc-web", "application/grpc-web"),
        ("application/grpc-web+proto", "application/grpc-web+proto"),
        ("application/grpc-web-text", "application/grpc-web-text"),
        (
            "Application/gRPC-Web-Text+proto",
            "application/grpc-web-text+proto",
        ),
    ] {
        let addr = serve(builder(GlobalKey).build(), SHADOWED).await;
        let headers = [("content-type", content_type)];
        for _ in 0..FREE_LIMIT {
            send(&client, addr, &headers).await;
        }
        let reply = send(&client, addr, &headers).await;
        assert_eq!(reply.status, StatusCode::OK, "{content_type}");
        assert_eq!(reply.header("grpc-status"), Some("8"), "{content_type}");
        assert_eq!(
            reply.header("content-type"),
            Some(answered),
            "{content_type}"
        );
    }
    // A request without a key gets grpc-web's answer too.
    let addr = serve(
        builder(HeaderKey::new(HeaderName::from_static("x-api-key"))).build(),
        SHADOWED,
    )
    .await;
    let reply = send(
        &client,
        addr,
        &[("content-type", "application/grpc-web+proto")],
    )
    .await;
    assert_eq!(reply.header("grpc-status"), Some("3"));
    assert_eq!(
        reply.header("content-type"),
        Some("application/grpc-web+proto")
    );
}
