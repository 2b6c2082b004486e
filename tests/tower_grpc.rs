//! The layer in front of a real tonic server (the `grpc_health` example's: the standard health
//! service), keyed by the peer's address as tonic records it, on a fake clock: a real tonic client
//! gets `ResourceExhausted` at the limit, and calls are told to be gRPC by their media type, in
//! any case (`Application/gRPC` is gRPC, `application/grpcfoo` is not).

use std::net::SocketAddr;
use std::time::Duration;

use http::{Request, StatusCode};
use tokio::net::TcpListener;
use tollgate::{FakeClock, Settings};
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tower::{Service, ServiceExt};

#[allow(dead_code)]
#[path = "../examples/grpc_health.rs"]
mod grpc_health;

const FREE_LIMIT: usize = 5;

/// The example's server on a fresh loopback port, on `clock`; and a channel to it.
async fn serve(clock: &FakeClock) -> (grpc_health::Layer<FakeClock>, Channel) {
    let settings = Settings::from_path(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/settings/plans.toml"
    ))
    .unwrap();
    let layer = grpc_health::layer(&settings, clock.clone()).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(grpc_health::serve(listener, layer.clone()));
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    (layer, channel)
}

fn check() -> HealthCheckRequest {
    HealthCheckRequest {
        service: String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tonic_client_gets_resource_exhausted_at_the_limit() {
    let clock = FakeClock::new();
    let (layer, channel) = serve(&clock).await;
    let mut client = HealthClient::new(channel);
    for call in 0..FREE_LIMIT {
        let response = client.check(check()).await.unwrap_or_else(|status| {
            panic!("call {call}: {status:?} (is the peer found under tonic?)")
        });
        assert_eq!(response.into_inner().status(), ServingStatus::Serving);
    }
    let status = client.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(status.message(), "rate limit exceeded");
    let stats = layer.stats();
    assert_eq!((stats.allowed, stats.enforced, stats.unkeyed), (5, 1, 0));
    // A second later the client's window has moved on.
    clock.advance(Duration::from_secs(1));
    assert!(client.check(check()).await.is_ok());
}

/// The answer to the call after `FREE_LIMIT` calls, all with `content-type: content_type`, sent
/// as raw HTTP/2 requests: its HTTP status and its `grpc-status`.
async fn answer_at_the_limit(content_type: &str) -> (StatusCode, Option<String>) {
    let (_layer, mut channel) = serve(&FakeClock::new()).await;
    let mut last = None;
    for _ in 0..=FREE_LIMIT {
        let request = Request::post("/grpc.health.v1.Health/Check")
            .header("content-type", content_type)
            .header("te", "trailers")
            .body(tonic::body::Body::empty())
            .unwrap();
        let response = channel.ready().await.unwrap().call(request).await.unwrap();
        let grpc_status = response
            .headers()
            .get("grpc-status")
            .map(|value| value.to_str().unwrap().to_owned());
        last = Some((response.status(), grpc_status));
    }
    last.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_are_told_by_their_media_type_in_any_case() {
    for content_type in [
        "Application/gRPC",
        "application/grpc+proto",
        "APPLICATION/GRPC",
    ] {
        assert_eq!(
            answer_at_the_limit(content_type).await,
            (StatusCode::OK, Some("8".to_owned())),
            "{content_type}"
        );
    }
    for content_type in ["application/grpcfoo", "application/grpc-webx"] {
        assert_eq!(
            answer_at_the_limit(content_type).await,
            (StatusCode::TOO_MANY_REQUESTS, None),
            "{content_type}"
        );
    }
}
