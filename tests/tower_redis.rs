//! The tower layer over a `RedisRateLimiter` against a throwaway `redis-server`: in process, its
//! answers within and over the limit and under each failure policy once the server is gone; and
//! as users run it, two `api_server` processes started with `--redis` sharing one limit.
//!
//! The processes are this test binary run again with the example's `serve` (the example is
//! compiled in, as `tests/api_server.rs` does): see [`api_server_process`].

mod redis_support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::redis::AsyncCommands;
use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use redis_support::{DECISION_TIMEOUT, RedisServer};
use tollgate::redis::{FailurePolicy, RedisRateLimiter};
use tollgate::tower::{RateLimitLayer, RedisBackend, key_fn};
use tollgate::{Algorithm, Rule};
use tower::{Layer, Service, ServiceExt};

#[allow(dead_code)]
#[path = "../examples/api_server.rs"]
mod api_server;

/// The variable that makes [`api_server_process`] serve: the example's arguments, one a line.
const SERVE_ARGS: &str = "TOLLGATE_TEST_API_SERVER_ARGS";

// ---------------------------------------------------------------------------------------------
// The layer in process.

/// A limit of 3 a minute: no test request waits on a window.
const LIMIT: u64 = 3;

async fn limiter(url: &str, policy: FailurePolicy) -> Arc<RedisRateLimiter<&'static str>> {
    let limiter = RedisRateLimiter::builder(url, Algorithm::SlidingWindowLog)
        .timeout(DECISION_TIMEOUT)
        .plan("free", Rule::new(LIMIT, Duration::from_secs(60)).unwrap())
        .failure_policy(policy)
        .build()
        .await
        .unwrap();
    Arc::new(limiter)
}

/// A service answering `hello` behind a layer over `limiter`, keyed by the `x-client` header's
/// text.
fn limited(
    limiter: Arc<RedisRateLimiter<&'static str>>,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<impl http_body::Body<Data = Bytes, Error: std::fmt::Debug>>,
    Error = std::convert::Infallible,
> + Clone {
    let by_client = key_fn(|head: &tollgate::tower::RequestHead<'_>| {
        let value = head.headers().get("x-client")?;
        Some(value.to_str().ok()?.to_owned())
    });
    let layer = RateLimitLayer::builder(RedisBackend::new(limiter), by_client, "free")
        .headers_on_allowed(true)
        .build();
    layer.layer(tower::service_fn(|_: Request<Full<Bytes>>| async {
        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(b"hello"))))
    }))
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Reply {
    /// The response's status, headers and whole body.
    async fn read<B>(response: Response<B>) -> Reply
    where
        B: http_body::Body<Data = Bytes, Error: std::fmt::Debug>,
    {
        let (parts, body) = response.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|value| value.to_str().unwrap())
    }

    /// `Retry-After`, which must be whole seconds, at least 1.
    fn retry_after(&self) -> u64 {
        let seconds: u64 = self
            .header("retry-after")
            .expect("a refusal says when to retry")
            .parse()
            .unwrap();
        assert!(seconds >= 1, "Retry-After is never 0");
        seconds
    }
}

async fn ask<S, B>(service: &S, client: &str) -> Reply
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>, Error = std::convert::Infallible>
        + Clone,
    B: http_body::Body<Data = Bytes, Error: std::fmt::Debug>,
{
    let request = Request::get("/hello")
        .header("x-client", client)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = service.clone().oneshot(request).await.unwrap();
    Reply::read(response).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_over_redis_answers_the_limit_then_429_with_the_fields() {
    let server = RedisServer::start();
    let limiter = limiter(&server.url(), FailurePolicy::Error).await;
    let service = limited(Arc::clone(&limiter));
    for n in 0..LIMIT {
        let reply = ask(&service, "alice").await;
        assert_eq!(
            (reply.status, reply.body.as_str()),
            (StatusCode::OK, "hello"),
            "{n}"
        );
        assert_eq!(reply.header("ratelimit-policy"), Some(r#""free";q=3;w=60"#));
        let left = LIMIT - n - 1;
        assert_eq!(
            reply.header("ratelimit"),
            Some(format!(r#""free";r={left};t=60"#).as_str())
        );
    }
    for _ in 0..2 {
        let reply = ask(&service, "alice").await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
        assert!((59..=60).contains(&reply.retry_after()));
        assert_eq!(reply.header("ratelimit-policy"), Some(r#""free";q=3;w=60"#));
        let field = reply.header("ratelimit").unwrap();
        assert!(field.starts_with(r#""free";r=0;t="#), "{field}");
    }
    // Another key is another client; a key that only looks like another's name is not it.
    for client in ["bob", "alice%", "ip:alice"] {
        assert_eq!(
            ask(&service, client).await.status,
            StatusCode::OK,
            "{client}"
        );
    }
    // The state is in Redis, under the stated client name (text escaped: `%` is `%25`).
    let mut connection = server.connection().await;
    for client in ["alice", "alice%25"] {
        let keys = limiter.keys(client, &"free").unwrap();
        let exists: bool = connection.exists(&keys[0]).await.unwrap();
        assert!(exists, "{keys:?}");
    }
    assert_eq!(limiter.stats().fallbacks, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_gone_each_failure_policy_gives_its_documented_answer() {
    let mut server = RedisServer::start();
    let url = server.url();
    let fail_open = limited(limiter(&url, FailurePolicy::FailOpen).await);
    let fail_closed = limited(limiter(&url, FailurePolicy::FailClosed).await);
    let error = limited(limiter(&url, FailurePolicy::Error).await);
    for service in [&fail_open, &fail_closed, &error] {
        assert_eq!(ask(service, "carol").await.status, StatusCode::OK);
    }
    server.kill();
    // Several requests each: the first ones fail on the connection, the later ones on the open
    // circuit; every one gets the policy's answer.
    for n in 0..5 {
        let reply = ask(&fail_open, "carol").await;
        assert_eq!(
            (reply.status, reply.body.as_str()),
            (StatusCode::OK, "hello"),
            "{n}"
        );

        let reply = ask(&fail_closed, "carol").await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{n}");
        reply.retry_after();
        assert!(reply.header("ratelimit").unwrap().contains("r=0"));

        let reply = ask(&error, "carol").await;
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{n}");
        assert_eq!(reply.header("retry-after"), None);
        assert!(
            reply.body.contains("rate limit check failed"),
            "{}",
            reply.body
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Two api_server processes sharing one Redis.

/// Serves the example when [`SERVE_ARGS`] is set (the test binary run again as an `api_server`
/// process); does nothing otherwise. Ignored, so that only the processes run it.
#[test]
#[ignore = "run by the two-process test as its servers"]
fn api_server_process() {
    let Ok(args) = std::env::var(SERVE_ARGS) else {
        return;
    };
    let options = api_server::options(args.lines().map(str::to_owned)).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(api_server::serve(options)).unwrap();
}

/// An `api_server` process, killed when dropped.
struct ApiServer {
    child: Child,
    addr: SocketAddr,
}

impl ApiServer {
    /// Starts one on a free loopback port with `args`, trusting the loopback as its proxy.
    fn start(args: &[&str]) -> ApiServer {
        let mut all = vec!["--listen", "127.0.0.1:0", "--trust", "127.0.0.1/32"];
        all.extend_from_slice(args);
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["api_server_process", "--exact", "--ignored", "--nocapture"])
            .env(SERVE_ARGS, all.join("\n"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        // The example prints its address once it listens.
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let addr = loop {
            let line = lines
                .next()
                .expect("the api_server process ended before listening")
                .unwrap();
            if let Some((_, addr)) = line.split_once("listening on http://") {
                break addr.trim().parse().unwrap();
            }
        };
        ApiServer { child, addr }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Settings for the example: its plans with a minute's window, so that no request waits on one.
fn settings_file(free: u64, pro: u64) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "tollgate-tower-redis-{}-{free}-{pro}.toml",
        std::process::id()
    ));
    let text = format!(
        "algorithm = \"sliding_window_log\"\n\
         [plans.free]\nlimit = {free}\nwindow = \"1m\"\n\
         [plans.pro]\nlimit = {pro}\nwindow = \"1m\"\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

async fn get(
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
    Reply::read(response).await
}

/// Sends `requests` alternately to `servers` as one client; the statuses, in order.
async fn alternate(
    servers: &[ApiServer; 2],
    requests: usize,
    headers: &[(&str, &str)],
) -> Vec<Reply> {
    let client = Client::builder(TokioExecutor::new()).build_http();
    let mut replies = Vec::with_capacity(requests);
    for n in 0..requests {
        replies.push(get(&client, servers[n % 2].addr, headers).await);
    }
    replies
}

const FREE: usize = 5;
const PRO: usize = 8;
/// A key of `examples/settings/api_keys.toml`, on the pro plan.
const PRO_KEY: &str = "pro-4e8a2f61b0d93c57";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_api_server_processes_on_one_redis_share_each_limit() {
    let redis = RedisServer::start();
    let settings = settings_file(FREE as u64, PRO as u64);
    let args = [
        "--settings",
        settings.to_str().unwrap(),
        "--redis",
        &redis.url(),
    ];
    let servers = [ApiServer::start(&args), ApiServer::start(&args)];
    let started = Instant::now();

    let anonymous = [("x-forwarded-for", "198.51.100.7")];
    let replies = alternate(&servers, 2 * FREE + 1, &anonymous).await;
    for (n, reply) in replies.iter().enumerate() {
        assert_eq!(
            reply.header("ratelimit-policy"),
            Some(r#""free";q=5;w=60"#),
            "{n}"
        );
        if n < FREE {
            assert_eq!(
                (reply.status, reply.body.as_str()),
                (StatusCode::OK, "hello\n"),
                "{n}"
            );
            let left = FREE - n - 1;
            assert_eq!(
                reply.header("ratelimit"),
                Some(format!(r#""free";r={left};t=60"#).as_str()),
                "{n}"
            );
        } else {
            assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{n}");
            assert!((1..=60).contains(&reply.retry_after()), "{n}");
            let field = reply.header("ratelimit").unwrap();
            assert!(field.starts_with(r#""free";r=0;t="#), "{n}: {field}");
        }
    }
    // A key of the table: its plan and its own limit, shared as well.
    let replies = alternate(&servers, PRO + 3, &[("x-api-key", PRO_KEY)]).await;
    let statuses: Vec<StatusCode> = replies.iter().map(|reply| reply.status).collect();
    let mut expected = vec![StatusCode::OK; PRO];
    expected.resize(PRO + 3, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(statuses, expected);
    assert_eq!(
        replies[0].header("ratelimit-policy"),
        Some(r#""pro";q=8;w=60"#)
    );
    assert!(
        started.elapsed() < Duration::from_secs(50),
        "the window must not have moved during the test"
    );

    // In Redis, under the stated names: the address and the key, each with its plan.
    let mut connection = redis.connection().await;
    let mut keys: Vec<String> = connection.keys("tollgate:*").await.unwrap();
    keys.sort();
    assert_eq!(
        keys,
        [
            "tollgate:{Free:ip:198.51.100.7}:swlb:5/60000000us",
            &format!("tollgate:{{Pro:key:{PRO_KEY}}}:swlb:8/60000000us"),
        ]
    );
    std::fs::remove_file(settings).unwrap();
}

/// The control: without `--redis` each process keeps its own limit, and the same requests get
/// the limit from each, which the shared test would catch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_api_server_processes_without_redis_each_admit_the_limit() {
    let settings = settings_file(FREE as u64, PRO as u64 + 1);
    let args = ["--settings", settings.to_str().unwrap()];
    let servers = [ApiServer::start(&args), ApiServer::start(&args)];
    let replies = alternate(
        &servers,
        2 * FREE + 1,
        &[("x-forwarded-for", "198.51.100.7")],
    )
    .await;
    let admitted = replies
        .iter()
        .filter(|reply| reply.status == StatusCode::OK)
        .count();
    assert_eq!(admitted, 2 * FREE);
    std::fs::remove_file(settings).unwrap();
}

/// `--redis-failure`: with the server killed, each process answers its policy's way: `error`
/// 503, `open` 200, `closed` 429 with a `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_servers_whose_redis_is_down_answer_as_their_failure_policies_say() {
    let mut redis = RedisServer::start();
    // A plan size of its own: the settings file is named by the sizes, per process.
    let settings = settings_file(FREE as u64, PRO as u64 + 2);
    let url = redis.url();
    let start = |policy: &str| {
        ApiServer::start(&[
            "--settings",
            settings.to_str().unwrap(),
            "--redis",
            &url,
            "--redis-failure",
            policy,
        ])
    };
    let servers = [
        (StatusCode::SERVICE_UNAVAILABLE, start("error")),
        (StatusCode::OK, start("open")),
        (StatusCode::TOO_MANY_REQUESTS, start("closed")),
    ];
    redis.kill();
    let client = Client::builder(TokioExecutor::new()).build_http();
    for (expected, server) in &servers {
        let reply = get(&client, server.addr, &[("x-forwarded-for", "198.51.100.9")]).await;
        assert_eq!(reply.status, *expected, "{}", reply.body);
        if *expected == StatusCode::TOO_MANY_REQUESTS {
            assert!(reply.retry_after() >= 1, "a refusal says when to come back");
        }
    }
    std::fs::remove_file(settings).unwrap();
}

/// A plan of several limits over Redis lists each limit in the fields, as in process: the
/// figures of every limit come back with the decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_over_redis_lists_each_limit_of_a_plan_of_several() {
    let server = RedisServer::start();
    let limiter = RedisRateLimiter::builder(server.url(), Algorithm::FixedWindow)
        .timeout(DECISION_TIMEOUT)
        .plan_limits(
            "free",
            [
                Rule::new(LIMIT, Duration::from_secs(60)).unwrap(),
                Rule::new(5, Duration::from_secs(3600)).unwrap(),
            ],
        )
        .build()
        .await
        .unwrap();
    let service = limited(Arc::new(limiter));
    let reply = ask(&service, "carol").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.header("ratelimit-policy"),
        Some(r#""free-1m";q=3;w=60, "free-1h";q=5;w=3600"#)
    );
    let field = reply.header("ratelimit").unwrap();
    assert!(
        field.starts_with(r#""free-1m";r=2;t="#) && field.contains(r#", "free-1h";r=4;t="#),
        "{field}"
    );
    for _ in 1..LIMIT {
        assert_eq!(ask(&service, "carol").await.status, StatusCode::OK);
    }
    let refused = ask(&service, "carol").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let field = refused.header("ratelimit").unwrap();
    assert!(
        field.starts_with(r#""free-1m";r=0;t="#) && field.contains(r#", "free-1h";r=2;t="#),
        "{field}"
    );
}
