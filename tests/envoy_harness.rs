//! The Envoy harness (tests/envoy_support/) against the real Envoy binary, with no rate-limit
//! service listening: what Envoy does when its rate-limit service is unreachable, in each failure
//! mode, and that the bootstrap's route, trusted hops and rate-limit actions are what Envoy runs.

mod envoy_support;

use envoy_support::{Action, Envoy, EnvoyConfig, HeaderMatch, HttpClient, Upstream, free_port};

/// Requests each test sends through Envoy.
const REQUESTS: usize = 5;

/// An Envoy whose rate-limit service port is closed, limiting per client address.
fn config_without_service(upstream: &Upstream) -> EnvoyConfig {
    EnvoyConfig::new("harness", free_port(), upstream.port())
        .rate_limit(vec![Action::RemoteAddress])
}

#[test]
fn failure_mode_allow_lets_requests_through_when_the_service_is_down() {
    let upstream = Upstream::start();
    let envoy = Envoy::start(&config_without_service(&upstream).failure_mode_deny(false));
    eprintln!("Envoy was LIVE after {:?}", envoy.startup_time());

    let counts = envoy_support::statuses(envoy.http_port(), REQUESTS, &[]);

    assert_eq!(counts.get(&200), Some(&REQUESTS), "statuses: {counts:?}");
    assert_eq!(upstream.served(), REQUESTS as u64);
    assert_eq!(envoy.ratelimit_stat("error"), REQUESTS as u64);
    assert_eq!(
        envoy.ratelimit_stat("failure_mode_allowed"),
        REQUESTS as u64
    );
    assert_eq!(envoy.ratelimit_stat("ok"), 0);
    assert_eq!(envoy.ratelimit_stat("over_limit"), 0);
}

#[test]
fn failure_mode_deny_refuses_with_500_when_the_service_is_down() {
    let upstream = Upstream::start();
    let envoy = Envoy::start(&config_without_service(&upstream).failure_mode_deny(true));

    let counts = envoy_support::statuses(envoy.http_port(), REQUESTS, &[]);

    // Envoy's `status_on_error` default: 500, with an empty body.
    assert_eq!(counts.get(&500), Some(&REQUESTS), "statuses: {counts:?}");
    assert_eq!(
        upstream.served(),
        0,
        "a refused request reached the upstream"
    );
    assert_eq!(envoy.ratelimit_stat("error"), REQUESTS as u64);
    assert_eq!(envoy.ratelimit_stat("failure_mode_allowed"), 0);
}

/// The upstream echoes what Envoy forwarded: with one trusted hop, the last `x-forwarded-for`
/// address is the client's, the address the `remote_address` action sends; without, the peer is.
#[test]
fn a_trusted_hop_makes_the_forwarded_address_the_client() {
    let upstream = Upstream::start();
    let envoy = Envoy::start(&config_without_service(&upstream).xff_num_trusted_hops(1));

    let mut client = HttpClient::new(envoy.http_port());
    let reply = client.request("/echo", &[("x-forwarded-for", "203.0.113.7")]);

    assert_eq!(reply.status, 200);
    assert_eq!(reply.body_text(), "upstream");
    assert_eq!(
        reply.header("x-echo-x-envoy-external-address"),
        Some("203.0.113.7")
    );
    // Envoy appends the peer to what it forwards (for a loopback peer, its own node address).
    let forwarded = reply.header("x-echo-x-forwarded-for").unwrap_or_default();
    assert!(forwarded.starts_with("203.0.113.7,"), "{forwarded}");

    let envoy = Envoy::start(&config_without_service(&upstream));
    let mut client = HttpClient::new(envoy.http_port());
    let reply = client.request("/echo", &[("x-forwarded-for", "203.0.113.7")]);
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.header("x-echo-x-envoy-external-address"),
        Some("127.0.0.1")
    );
}

/// Envoy asks the service only for requests that give at least one descriptor: a missing header
/// drops a `request_headers` descriptor, and with nothing to ask, failure mode deny lets the
/// request through. Every action kind is accepted by Envoy.
#[test]
fn envoy_asks_only_for_requests_that_give_a_descriptor() {
    let upstream = Upstream::start();
    let config = EnvoyConfig::new("harness", free_port(), upstream.port())
        .failure_mode_deny(true)
        .rate_limit(vec![
            Action::request_header("x-user", "user"),
            Action::generic_key("per-user"),
        ])
        .rate_limit(vec![
            Action::HeaderValueMatch {
                descriptor_value: "beta".to_string(),
                headers: vec![
                    HeaderMatch::Present("x-beta".to_string()),
                    HeaderMatch::Exact("x-plan".to_string(), "gold".to_string()),
                ],
            },
            Action::RequestHeaders {
                header_name: "x-region".to_string(),
                descriptor_key: "region".to_string(),
                skip_if_absent: true,
            },
            Action::GenericKey {
                descriptor_value: "v".to_string(),
                descriptor_key: Some("k".to_string()),
            },
        ]);
    let envoy = Envoy::start(&config);
    let mut client = HttpClient::new(envoy.http_port());

    // No descriptor: no call, so no error to deny on.
    assert_eq!(client.request("/", &[]).status, 200);
    assert_eq!(client.request("/", &[("x-beta", "1")]).status, 200);
    assert_eq!(
        client
            .request("/", &[("x-beta", "1"), ("x-plan", "silver")])
            .status,
        200
    );
    assert_eq!(upstream.served(), 3);
    assert_eq!(envoy.ratelimit_stat("error"), 0);

    // A descriptor from either entry: a call, which fails, so the request is refused.
    assert_eq!(client.request("/", &[("x-user", "ann")]).status, 500);
    assert_eq!(
        client
            .request("/", &[("x-beta", "1"), ("x-plan", "gold")])
            .status,
        500
    );
    assert_eq!(upstream.served(), 3);
    assert_eq!(envoy.ratelimit_stat("error"), 2);
}

/// A bootstrap Envoy rejects fails the test at once, with Envoy's own words.
#[test]
#[should_panic(expected = "Envoy exited while starting")]
fn a_bootstrap_envoy_rejects_fails_with_its_log() {
    Envoy::start_yaml("static_resources: { listeners: [ { name: 7, no_such_field: true } ] }\n");
}
