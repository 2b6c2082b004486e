//! `ClientIp::peer()` finds the peer's address on real servers as they are usually set up, with
//! no peer source named: axum served with `into_make_service_with_connect_info::<SocketAddr>()`
//! (feature `axum`) and tonic's server (feature `tonic`), each on a fresh loopback port. (A hyper
//! server loop that records the peer as a `SocketAddr` extension is `examples/reverse_proxy.rs`.)

use std::net::SocketAddr;
use std::sync::Arc;

use tollgate::tower::{ClientIp, ClientKey, KeyExtractor, RateLimitLayer};
use tollgate::{Algorithm, MonotonicClock, RateLimiterService, Rule};

const LIMIT: usize = 3;

type Layer =
    RateLimitLayer<Arc<RateLimiterService<ClientKey, &'static str>>, ClientIp, &'static str>;

/// `LIMIT` requests per hour per peer address.
fn layer() -> Layer {
    let service = RateLimiterService::<ClientKey, _>::new(
        Algorithm::SlidingWindowLog,
        [("free", Rule::per_hour(LIMIT as u64).unwrap())],
        MonotonicClock::new(),
    )
    .unwrap();
    RateLimitLayer::builder(Arc::new(service), ClientIp::peer(), "free").build()
}

/// The status codes of `count` plain `GET /hello` requests to `addr`, in order.
async fn statuses(addr: SocketAddr, count: usize) -> Vec<u16> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let mut statuses = Vec::new();
    for _ in 0..count {
        let request = http::Request::get(format!("http://{addr}/hello"))
            .body(http_body_util::Empty::new())
            .unwrap();
        statuses.push(client.request(request).await.unwrap().status().as_u16());
    }
    statuses
}

/// `LIMIT` times 200, then 429.
fn limited() -> Vec<u16> {
    let mut expected = vec![200; LIMIT];
    expected.push(429);
    expected
}

#[test]
fn a_missing_peer_is_explained_with_what_was_looked_for() {
    let why = ClientIp::peer().why_no_key().unwrap();
    for named in [
        "SocketAddr",
        "ConnectInfo<SocketAddr>",
        "into_make_service_with_connect_info::<SocketAddr>()",
        "TcpConnectInfo",
        "peer_source",
    ] {
        assert!(why.contains(named), "{why:?} does not name {named}");
    }
    // An API key else the address: a request without the address is what needs explaining.
    let either = tollgate::tower::HeaderKey::new("x-api-key")
        .unwrap()
        .or(ClientIp::peer());
    assert_eq!(either.why_no_key(), Some(why));
}

#[cfg(feature = "axum")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_with_connect_info_is_keyed_by_the_peer_out_of_the_box() {
    use axum::Router;
    use axum::routing::get;

    let layer = layer();
    let app = Router::new()
        .route("/hello", get(|| async { "hello" }))
        .layer(layer.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    assert_eq!(statuses(addr, LIMIT + 1).await, limited());
    assert_eq!(layer.stats().unkeyed, 0);
}

#[cfg(feature = "tonic")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic_is_keyed_by_the_peer_out_of_the_box() {
    use tonic::Code;
    use tonic::transport::Server;
    use tonic::transport::server::TcpIncoming;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    let layer = layer();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = Server::builder()
        .layer(layer.clone())
        .add_service(health)
        .serve_with_incoming(TcpIncoming::from(listener));
    tokio::spawn(async move { server.await.unwrap() });

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let mut codes = Vec::new();
    for _ in 0..=LIMIT {
        let answer = client
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await;
        codes.push(answer.map_or_else(|status| status.code(), |_| Code::Ok));
    }
    let mut expected = vec![Code::Ok; LIMIT];
    expected.push(Code::ResourceExhausted);
    assert_eq!(codes, expected);
    assert_eq!(layer.stats().unkeyed, 0);
}
