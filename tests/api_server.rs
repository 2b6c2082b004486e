//! The `api_server` example as its users run it, served on loopback with a fake clock: a plan
//! comes only with a key of its table, an invented or over-long key is an anonymous client keyed
//! by address, and its shadow-mode route tells clients nothing and the upstream the truth.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tollgate::{FakeClock, Settings};

#[allow(dead_code)]
#[path = "../examples/api_server.rs"]
mod api_server;

use api_server::ApiKeys;

/// A key of `examples/settings/api_keys.toml`, on the pro plan.
const PRO_KEY: &str = "pro-4e8a2f61b0d93c57";
const FREE_LIMIT: usize = 5;
const PRO_LIMIT: usize = 50;

fn example_file(name: &str) -> String {
    format!("{}/examples/settings/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// The example's app on a fresh loopback port, trusting the loopback as its proxy (as
/// `--trust 127.0.0.1/32` does), on a clock no test moves.
async fn serve() -> SocketAddr {
    let settings = Settings::from_path(example_file("plans.toml")).unwrap();
    let keys = Arc::new(ApiKeys::from_path(&example_file("api_keys.toml")).unwrap());
    let trusted = ["127.0.0.1/32".parse().unwrap()];
    let app = api_server::app(&settings, FakeClock::new(), keys, &trusted).unwrap();
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

async fn get(
    client: &Client<HttpConnector, Empty<Bytes>>,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let mut request = Request::get(format!("http://{addr}{path}"));
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
async fn an_invented_key_is_an_anonymous_client_on_the_free_plan() {
    let addr = serve().await;
    let client = client();
    let from = ("x-forwarded-for", "198.51.100.7");
    for n in 0..FREE_LIMIT {
        // A new made-up `pro-` key each time: no new limit, no pro plan.
        let key = format!("pro-invented-{n}");
        let reply = get(&client, addr, "/hello", &[from, ("x-api-key", &key)]).await;
        assert_eq!(reply.status, StatusCode::OK, "request {n}");
        assert_eq!(reply.header("ratelimit-policy"), Some(r#""free";q=5;w=1"#));
    }
    let reply = get(
        &client,
        addr,
        "/hello",
        &[from, ("x-api-key", "pro-one-more")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    // An over-long key is no key either: the same address, the same free limit.
    let long_key = format!("pro-{}", "x".repeat(400));
    let reply = get(&client, addr, "/hello", &[from, ("x-api-key", &long_key)]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.header("ratelimit-policy"), Some(r#""free";q=5;w=1"#));
    // Another address behind the proxy is another client.
    let reply = get(
        &client,
        addr,
        "/hello",
        &[("x-forwarded-for", "198.51.100.8")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_the_table_gets_its_plan_and_its_own_limit() {
    let addr = serve().await;
    let client = client();
    // Two addresses share the key's limit: the key is the client.
    for n in 0..PRO_LIMIT {
        let from = format!("203.0.113.{}", n % 2);
        let headers = [("x-forwarded-for", from.as_str()), ("x-api-key", PRO_KEY)];
        let reply = get(&client, addr, "/hello", &headers).await;
        assert_eq!(reply.status, StatusCode::OK, "request {n}");
        assert_eq!(reply.header("ratelimit-policy"), Some(r#""pro";q=50;w=1"#));
    }
    let reply = get(&client, addr, "/hello", &[("x-api-key", PRO_KEY)]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    // The address itself, without the key, is still an anonymous client with its own limit.
    let reply = get(
        &client,
        addr,
        "/hello",
        &[("x-forwarded-for", "203.0.113.0")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shadow_route_tells_clients_nothing_and_the_upstream_the_truth() {
    let addr = serve().await;
    let client = client();
    let headers = [
        ("x-forwarded-for", "198.51.100.9"),
        ("x-ratelimit-shadowed", "forged"),
    ];
    for n in 0..FREE_LIMIT {
        let reply = get(&client, addr, "/shadow", &headers).await;
        assert_eq!(
            (reply.status, reply.body.as_str()),
            (StatusCode::OK, "hello\n"),
            "{n}"
        );
    }
    let reply = get(&client, addr, "/shadow", &headers).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body, "hello (shadowed: \"free\";r=0;t=1)\n");
    for field in ["retry-after", "ratelimit", "ratelimit-policy"] {
        assert_eq!(reply.header(field), None, "{field}");
    }
    // The enforcing route never passes a client's mark on either.
    let reply = get(&client, addr, "/hello", &headers).await;
    assert_eq!(reply.body, "hello\n");
}

#[test]
fn a_key_file_with_an_unknown_plan_or_an_unsendable_key_is_refused() {
    let directory = std::env::temp_dir();
    let long_key = format!("[keys]\n\"{}\" = \"pro\"\n", "k".repeat(257));
    let cases = [
        (
            "gold",
            "[keys]\n\"k-1\" = \"gold\"\n",
            "plan \"gold\" of a key is unknown",
        ),
        (
            "long",
            long_key.as_str(),
            "key 1 of 257 bytes is invalid: a key is 1 to 256 visible ASCII characters",
        ),
        (
            "space",
            "[keys]\n\"k 1\" = \"pro\"\n",
            "key 1 of 3 bytes is invalid",
        ),
        (
            "empty",
            "[keys]\n\"\" = \"pro\"\n",
            "key 1 of 0 bytes is invalid",
        ),
    ];
    for (name, text, expected) in cases {
        let path = directory.join(format!(
            "tollgate-api-keys-{}-{name}.toml",
            std::process::id()
        ));
        std::fs::write(&path, text).unwrap();
        let error = ApiKeys::from_path(path.to_str().unwrap()).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert!(error.contains(expected), "{name}: {error}");
    }
}
