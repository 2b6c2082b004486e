//! A descriptor's own limit (`RateLimitDescriptor.limit`), through the service's public API:
//! applied in place of the configured one to any descriptor of a known domain, never shadowed,
//! its clients told apart by keys and values, under the domain's method, all or nothing with the
//! request's other descriptors, kept across reloads, bounded in number; on a real Redis, shared
//! by two instances.

mod redis_support;
mod rls_support;

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::google::protobuf::UInt64Value;
use redis_support::RedisServer;
use rls_support::{bringing, descriptor};
use tollgate::envoy::proto::rate_limit_response::Code;
use tollgate::envoy::proto::{RateLimitRequest, RateLimitResponse};
use tollgate::envoy::{RateLimitServer, RlsConfig, StateStore};
use tollgate::redis::FailurePolicy;

const CONFIG: &str = "
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
";

/// envoy.type.v3.RateLimitUnit's numbers.
const SECOND: i32 = 1;
const MINUTE: i32 = 2;
const HOUR: i32 = 3;

async fn server_on(yaml: &str, store: StateStore) -> RateLimitServer {
    let config = RlsConfig::from_yaml_str("test.yaml", yaml).expect("the configuration is valid");
    RateLimitServer::new(&config, store)
        .await
        .expect("the service builds")
}

async fn server(yaml: &str) -> RateLimitServer {
    server_on(yaml, StateStore::InProcess { clients: 64 }).await
}

async fn try_decide(
    server: &RateLimitServer,
    domain: &str,
    descriptors: &[RateLimitDescriptor],
) -> Result<RateLimitResponse, tonic::Status> {
    server
        .decide(&RateLimitRequest {
            domain: domain.to_owned(),
            descriptors: descriptors.to_vec(),
            hits_addend: 0,
        })
        .await
}

async fn decide(
    server: &RateLimitServer,
    descriptors: &[RateLimitDescriptor],
) -> RateLimitResponse {
    try_decide(server, "edge", descriptors)
        .await
        .expect("the request is decided")
}

/// How many of `times` identical requests are answered OK.
async fn oks(server: &RateLimitServer, descriptors: &[RateLimitDescriptor], times: usize) -> usize {
    let mut ok = 0;
    for _ in 0..times {
        if decide(server, descriptors).await.overall_code == Code::Ok as i32 {
            ok += 1;
        }
    }
    ok
}

#[tokio::test]
async fn a_brought_limit_applies_in_place_of_the_configured_one() {
    let server = server(CONFIG).await;
    let brought = [bringing(&[("remote_address", "10.0.0.1")], 5, MINUTE)];
    assert_eq!(oks(&server, &brought, 8).await, 5);
    let answer = decide(&server, &brought).await;
    let status = &answer.statuses[0];
    assert_eq!(status.code, Code::OverLimit as i32);
    let current = status.current_limit.as_ref().expect("the limit applied");
    assert_eq!(
        (current.requests_per_unit, current.unit),
        (5, MINUTE),
        "the answer names the brought limit"
    );
    // The configured limit of the same address is its own: 3 per minute, untouched.
    let configured = [descriptor(&[("remote_address", "10.0.0.1")])];
    assert_eq!(oks(&server, &configured, 5).await, 3);
}

#[tokio::test]
async fn a_brought_limit_applies_to_a_descriptor_the_configuration_does_not_match() {
    let server = server(CONFIG).await;
    let unmatched = [descriptor(&[("tenant", "acme")])];
    assert_eq!(
        oks(&server, &unmatched, 10).await,
        10,
        "not configured: unlimited"
    );
    let brought = [bringing(&[("tenant", "acme")], 2, HOUR)];
    assert_eq!(oks(&server, &brought, 5).await, 2);
    // Nested entries of no configured path too.
    let nested = [bringing(&[("tenant", "acme"), ("user", "ann")], 1, HOUR)];
    assert_eq!(oks(&server, &nested, 3).await, 1);
}

#[tokio::test]
async fn a_brought_limit_is_never_shadowed() {
    let server = server(CONFIG).await;
    let shadowed = [descriptor(&[("path", "/a")])];
    assert_eq!(
        oks(&server, &shadowed, 4).await,
        4,
        "the configured limit is shadowed"
    );
    let brought = [bringing(&[("path", "/a")], 2, MINUTE)];
    assert_eq!(
        oks(&server, &brought, 4).await,
        2,
        "the brought one refuses"
    );
}

#[tokio::test]
async fn clients_of_a_brought_limit_are_told_apart_by_keys_and_values() {
    let server = server(CONFIG).await;
    let first = [bringing(&[("user", "ann")], 1, HOUR)];
    let other_key = [bringing(&[("team", "ann")], 1, HOUR)];
    let other_value = [bringing(&[("user", "bob")], 1, HOUR)];
    // Keys and values that would run together without their lengths.
    let joined = [bringing(&[("user", "ann"), ("x", "")], 1, HOUR)];
    let split = [bringing(&[("user", "ann:x"), ("", "")], 1, HOUR)];
    for descriptors in [&first, &other_key, &other_value, &joined, &split] {
        assert_eq!(oks(&server, descriptors, 3).await, 1, "{descriptors:?}");
    }
    // Limits brought for the same entries are counted apart.
    let another_limit = [bringing(&[("user", "ann")], 2, HOUR)];
    assert_eq!(oks(&server, &another_limit, 3).await, 2);
}

#[tokio::test]
async fn a_brought_limit_of_zero_refuses_and_an_unknown_domain_limits_nothing() {
    let server = server(CONFIG).await;
    let zero = [bringing(&[("user", "ann")], 0, SECOND)];
    let answer = decide(&server, &zero).await;
    assert_eq!(answer.overall_code, Code::OverLimit as i32);
    let elsewhere = try_decide(&server, "nowhere", &zero)
        .await
        .expect("decided");
    assert_eq!(elsewhere.overall_code, Code::Ok as i32);
}

#[tokio::test]
async fn a_brought_limit_whose_unit_is_not_one_is_an_invalid_argument_naming_the_descriptor() {
    let server = server(CONFIG).await;
    for unit in [0, 8, -1] {
        let request = [
            descriptor(&[("remote_address", "10.0.0.9")]),
            bringing(&[("user", "ann")], 3, unit),
        ];
        let error = try_decide(&server, "edge", &request)
            .await
            .expect_err("refused");
        assert_eq!(error.code(), tonic::Code::InvalidArgument, "unit {unit}");
        assert!(
            error.message().contains("descriptor 1") && error.message().contains("unit"),
            "{}",
            error.message()
        );
    }
    // Nothing was charged: the configured limit still has all 3.
    let configured = [descriptor(&[("remote_address", "10.0.0.9")])];
    assert_eq!(oks(&server, &configured, 5).await, 3);
}

#[tokio::test]
async fn past_the_most_brought_limits_a_new_one_is_resource_exhausted() {
    let server = server(CONFIG).await;
    let most = u32::try_from(RateLimitServer::MAX_BROUGHT_LIMITS).unwrap();
    for requests_per_unit in 1..=most {
        let brought = [bringing(&[("user", "ann")], requests_per_unit, HOUR)];
        assert_eq!(oks(&server, &brought, 1).await, 1);
    }
    let one_more = [bringing(&[("user", "ann")], most + 1, HOUR)];
    let error = try_decide(&server, "edge", &one_more)
        .await
        .expect_err("one limit too many");
    assert_eq!(error.code(), tonic::Code::ResourceExhausted);
    assert!(
        error.message().contains("MAX_BROUGHT_LIMITS"),
        "{}",
        error.message()
    );
    // The limits made still decide: 1 per hour, spent.
    let known = [bringing(&[("user", "ann")], 1, HOUR)];
    assert_eq!(oks(&server, &known, 1).await, 0);
    let known = [bringing(&[("user", "bob")], 1, HOUR)];
    assert_eq!(oks(&server, &known, 2).await, 1);
}

#[tokio::test]
async fn a_request_refused_by_its_brought_limit_charges_none_of_its_descriptors() {
    let server = server(CONFIG).await;
    let address = descriptor(&[("remote_address", "10.0.0.2")]);
    let brought = bringing(&[("user", "ann")], 1, HOUR);
    let both = [address.clone(), brought.clone()];
    assert_eq!(oks(&server, &both, 3).await, 1);
    // Refused twice by the brought limit, the address was charged once: 2 left.
    assert_eq!(oks(&server, std::slice::from_ref(&address), 5).await, 2);
    // And the other way round: the address spent, the brought limit of another user untouched.
    let other = bringing(&[("user", "bob")], 1, HOUR);
    assert_eq!(oks(&server, &[address, other.clone()], 2).await, 0);
    assert_eq!(oks(&server, &[other], 2).await, 1);
}

#[tokio::test]
async fn a_brought_limit_is_enforced_by_the_domains_method() {
    // A refund gives back under the fixed window and not under the sliding log: the method
    // shows.
    for (method, after_refund) in [("fixed_window", 1), ("sliding_window_log", 0)] {
        let yaml = format!("domain: edge\nmethod: {method}\ndescriptors: []\n");
        let server = server(&yaml).await;
        let brought = [bringing(&[("user", "ann")], 2, HOUR)];
        assert_eq!(oks(&server, &brought, 3).await, 2, "{method}");
        let mut refund = bringing(&[("user", "ann")], 2, HOUR);
        refund.is_negative_hits = true;
        refund.hits_addend = Some(UInt64Value { value: 1 });
        assert_eq!(
            decide(&server, &[refund]).await.overall_code,
            Code::Ok as i32
        );
        assert_eq!(
            oks(&server, &brought, 3).await,
            after_refund,
            "{method}: after a refund of 1"
        );
    }
}

#[tokio::test]
async fn a_refund_to_a_limit_never_brought_makes_no_limiter() {
    let server = server(CONFIG).await;
    let most = u32::try_from(RateLimitServer::MAX_BROUGHT_LIMITS).unwrap();
    // Refunds of limits no request brought: answered OK, and they take no room.
    for requests_per_unit in 1..=most {
        let mut refund = bringing(&[("user", "ann")], requests_per_unit, MINUTE);
        refund.is_negative_hits = true;
        assert_eq!(
            decide(&server, &[refund]).await.overall_code,
            Code::Ok as i32
        );
    }
    for requests_per_unit in 1..=most {
        let brought = [bringing(&[("user", "ann")], requests_per_unit, HOUR)];
        assert_eq!(oks(&server, &brought, 1).await, 1, "{requests_per_unit}");
    }
}

#[tokio::test]
async fn brought_limits_keep_their_state_across_a_reload() {
    let server = server(CONFIG).await;
    let brought = [bringing(&[("user", "ann")], 2, HOUR)];
    assert_eq!(oks(&server, &brought, 1).await, 1);
    let changed = CONFIG.replace("requests_per_unit: 3", "requests_per_unit: 4");
    let config = RlsConfig::from_yaml_str("changed.yaml", &changed).unwrap();
    server.reload(&config).await.unwrap();
    assert_eq!(
        oks(&server, &brought, 3).await,
        1,
        "one of 2 was spent before"
    );
}

fn redis_store(redis: &RedisServer) -> StateStore {
    StateStore::Redis {
        url: redis.url(),
        policy: FailurePolicy::Error,
        timeout: Duration::from_secs(5),
    }
}

#[tokio::test]
async fn on_redis_two_instances_share_a_brought_limit() {
    let redis = RedisServer::start();
    for method in [
        "fixed_window",
        "token_bucket",
        "sliding_window_counter",
        "sliding_window_log",
    ] {
        // A configuration with no limited descriptor: the brought limits make the only
        // connections.
        let yaml = format!("domain: edge\nmethod: {method}\ndescriptors: []\n");
        let first = server_on(&yaml, redis_store(&redis)).await;
        let second = server_on(&yaml, redis_store(&redis)).await;
        let brought = [bringing(&[("user", method)], 4, HOUR)];
        assert_eq!(oks(&first, &brought, 3).await, 3, "{method}");
        assert_eq!(oks(&second, &brought, 3).await, 1, "{method}: one left");
        assert_eq!(oks(&first, &brought, 2).await, 0, "{method}: spent");
        // A second limit made on the first's connections decides too.
        let other = [bringing(&[("user", method)], 1, MINUTE)];
        assert_eq!(oks(&second, &other, 2).await, 1, "{method}");
        assert_eq!(oks(&first, &other, 2).await, 0, "{method}");
        // All or nothing on Redis: refused by the spent limit, the fresh one is not charged.
        let fresh = bringing(&[("team", method)], 1, HOUR);
        assert_eq!(
            oks(&first, &[fresh.clone(), brought[0].clone()], 2).await,
            0
        );
        assert_eq!(oks(&second, &[fresh], 2).await, 1, "{method}");
    }
}
