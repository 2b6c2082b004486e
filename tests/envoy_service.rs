//! The `tollgate-rls` binary as Envoy meets it: a gRPC service on loopback with the standard
//! health service, Prometheus metrics, a configuration reloaded on change and on SIGHUP
//! without resetting unchanged limits, and several instances sharing limits through Redis.

mod redis_support;
mod rls_support;

use std::time::Duration;

use redis_support::RedisServer;
use rls_support::{ConfigFile, Rls, eventually, oks, request};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

const CONFIG: &str = "\
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: api_key
    method: token_bucket
    rate_limit: {unit: hour, requests_per_unit: 5}
";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

#[tokio::test]
async fn the_binary_serves_decisions_and_reports_serving_to_health_checks() {
    let config = ConfigFile::new(CONFIG);
    let rls = Rls::start(config.path(), &[]);
    let mut client = rls.client().await;
    let address = request("edge", &[&[("remote_address", "10.0.0.1")]]);
    assert_eq!(oks(&mut client, &address, 10).await, 3);

    let channel = tonic::transport::Channel::from_shared(format!("http://{}", rls.address()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let status = health
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .expect("the health service answers")
            .into_inner()
            .status;
        assert_eq!(status, 1, "SERVING for {service:?}");
    }
}

#[tokio::test]
async fn a_changed_file_and_sighup_reload_the_configuration_keeping_unchanged_limits() {
    let config = ConfigFile::new(CONFIG);
    let rls = Rls::start(config.path(), &["--watch-ms", "50"]);
    let mut client = rls.client().await;
    let address = request("edge", &[&[("remote_address", "10.0.0.1")]]);
    let key = request("edge", &[&[("api_key", "k")]]);
    assert_eq!(oks(&mut client, &address, 3).await, 3);
    assert_eq!(oks(&mut client, &key, 5).await, 5);

    // api_key's limit rises to 8: it starts afresh; remote_address's is unchanged and stays spent.
    config.rewrite(&CONFIG.replace("requests_per_unit: 5", "requests_per_unit: 8"));
    let reloaded = eventually(Duration::from_secs(10), async || {
        oks(&mut client, &key, 1).await == 1
    })
    .await;
    assert!(reloaded, "the changed file was not reloaded");
    assert_eq!(oks(&mut client, &key, 10).await, 7);
    assert_eq!(oks(&mut client, &address, 3).await, 0);

    // A mistaken file is reported and the configuration in use stays.
    config.rewrite(
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: eon}\n",
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(oks(&mut client, &address, 1).await, 0);
    assert_eq!(oks(&mut client, &key, 1).await, 0);

    // SIGHUP reloads at once, whatever the watch saw.
    config.rewrite(CONFIG);
    let slow = Rls::start(config.path(), &["--watch-ms", "3600000"]);
    let mut slow_client = slow.client().await;
    assert_eq!(oks(&mut slow_client, &key, 6).await, 5);
    config.rewrite(&CONFIG.replace("requests_per_unit: 5", "requests_per_unit: 9"));
    let status = std::process::Command::new("kill")
        .args(["-HUP", &slow.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let reloaded = eventually(Duration::from_secs(10), async || {
        oks(&mut slow_client, &key, 1).await == 1
    })
    .await;
    assert!(reloaded, "SIGHUP did not reload the configuration");
}

#[test]
fn a_mistaken_configuration_stops_the_binary_with_the_place() {
    let config = ConfigFile::new(
        "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: eon, requests_per_unit: 1}\n",
    );
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate-rls"))
        .arg("--config")
        .arg(config.path())
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "domain \"edge\": descriptors[0] (a): rate_limit.unit: \"eon\" is not a unit"
        ),
        "{stderr}"
    );
}

#[tokio::test]
async fn prometheus_metrics_count_hits_over_limit_and_decisions() {
    let config = ConfigFile::new(CONFIG);
    let metrics_port = free_port();
    let rls = Rls::start(
        config.path(),
        &["--metrics", &format!("127.0.0.1:{metrics_port}")],
    );
    let mut client = rls.client().await;
    let address = request("edge", &[&[("remote_address", "10.0.0.1")]]);
    assert_eq!(oks(&mut client, &address, 5).await, 3);
    let body = http_get(metrics_port, "/metrics");
    for line in [
        r#"tollgate_rls_hits_total{domain="edge",descriptor="remote_address"} 5"#,
        r#"tollgate_rls_over_limit_total{domain="edge",descriptor="remote_address"} 2"#,
        r#"tollgate_rls_within_limit_total{domain="edge",descriptor="remote_address"} 3"#,
        r#"tollgate_rls_requests_total{code="over_limit"} 2"#,
        r#"tollgate_rls_requests_total{code="ok"} 3"#,
        "tollgate_rls_decision_seconds_count 5",
    ] {
        assert!(body.contains(line), "{line} not in:\n{body}");
    }
}

/// The body of a plain HTTP/1.1 GET on loopback.
fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connects");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text.split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or(text)
}

#[tokio::test]
async fn two_instances_on_one_redis_share_each_limit() {
    let redis = RedisServer::start();
    let config = ConfigFile::new(CONFIG);
    let first = Rls::start(config.path(), &["--redis", &redis.url()]);
    let second = Rls::start(config.path(), &["--redis", &redis.url()]);
    let mut one = first.client().await;
    let mut two = second.client().await;
    let address = request("edge", &[&[("remote_address", "10.0.0.7")]]);
    let key = request("edge", &[&[("api_key", "shared")]]);
    let mut granted = 0;
    let mut granted_keys = 0;
    for _ in 0..6 {
        granted += oks(&mut one, &address, 1).await + oks(&mut two, &address, 1).await;
        granted_keys += oks(&mut one, &key, 1).await + oks(&mut two, &key, 1).await;
    }
    assert_eq!(granted, 3, "3 per hour in all, across both instances");
    assert_eq!(granted_keys, 5, "5 per hour in all, across both instances");

    // Refused by one descriptor, charged to none, on Redis as in process.
    let fresh = request("edge", &[&[("remote_address", "10.0.0.8")]]);
    let both = request(
        "edge",
        &[&[("remote_address", "10.0.0.8")], &[("api_key", "shared")]],
    );
    assert_eq!(oks(&mut one, &both, 4).await, 0);
    assert_eq!(oks(&mut two, &fresh, 5).await, 3);

    // Redis gone: under the default policy the service answers UNAVAILABLE, so that Envoy's
    // failure_mode_deny decides.
    // (A client Redis last refused may still be answered from the deny cache: ask for another.)
    drop(redis);
    let error = one
        .should_rate_limit(request("edge", &[&[("remote_address", "10.0.0.9")]]))
        .await
        .expect_err("no decision without Redis");
    assert_eq!(error.code(), tonic::Code::Unavailable, "{error}");
}
