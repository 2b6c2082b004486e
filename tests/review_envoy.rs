//! Attacks on the Envoy rate-limit service's promises, through its public API: each test states
//! a promise of `tollgate::envoy` (module docs, `RateLimitServer::decide`, the README) and tries
//! to break it.

mod redis_support;
mod rls_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::google::protobuf::UInt64Value;
use redis_support::RedisServer;
use rls_support::descriptor;
use tollgate::envoy::proto::rate_limit_response::Code;
use tollgate::envoy::proto::{RateLimitRequest, RateLimitResponse};
use tollgate::envoy::{RateLimitServer, RlsConfig, StateStore};
use tollgate::redis::FailurePolicy;

fn with_hits(mut descriptor: RateLimitDescriptor, hits: u64) -> RateLimitDescriptor {
    descriptor.hits_addend = Some(UInt64Value { value: hits });
    descriptor
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

fn config(yaml: &str) -> RlsConfig {
    RlsConfig::from_yaml_str("review.yaml", yaml).expect("the configuration is valid")
}

async fn in_process(yaml: &str) -> RateLimitServer {
    RateLimitServer::new(&config(yaml), StateStore::InProcess { clients: 1024 })
        .await
        .expect("the service builds")
}

fn on_redis(redis: &RedisServer, policy: FailurePolicy) -> StateStore {
    StateStore::Redis {
        url: redis.url(),
        policy,
        timeout: Duration::from_millis(500),
    }
}

async fn decide(
    server: &RateLimitServer,
    descriptors: Vec<RateLimitDescriptor>,
) -> RateLimitResponse {
    server
        .decide(&request("edge", descriptors))
        .await
        .expect("the request is decided")
}

fn ok(response: &RateLimitResponse) -> bool {
    response.overall_code == Code::Ok as i32
}

async fn oks(server: &RateLimitServer, descriptors: &[RateLimitDescriptor], times: usize) -> usize {
    let mut granted = 0;
    for _ in 0..times {
        if ok(&decide(server, descriptors.to_vec()).await) {
            granted += 1;
        }
    }
    granted
}

fn header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    response
        .response_headers_to_add
        .iter()
        .find(|header| header.key == name)
        .map(|header| header.value.as_str())
}

const METHODS: [&str; 4] = [
    "fixed_window",
    "token_bucket",
    "sliding_window_log",
    "sliding_window_counter",
];

// ---------------------------------------------------------------------------------------------
// All or nothing.

/// The same descriptor twice in one request: each copy is charged, and a request refused by
/// the second copy must charge none (no other request runs: the documented race cannot occur).
#[tokio::test]
async fn a_descriptor_given_twice_is_all_or_nothing_without_any_race() {
    let server = in_process(
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
    )
    .await;
    let user = descriptor(&[("user", "u")]);
    // Takes 2 of 3.
    assert!(ok(&decide(&server, vec![user.clone(), user.clone()]).await));
    // 1 left: two copies ask for 2, refused; nothing may be taken.
    assert!(!ok(&decide(&server, vec![user.clone(), user.clone()]).await));
    // So the last permit is still there.
    let last = decide(&server, vec![user.clone()]).await;
    assert!(
        ok(&last),
        "the refused request took the last permit: {last:?}"
    );
}

/// A refused request of two descriptors: the other descriptor keeps every permit, and its
/// `limit_remaining` in the refusal says so (what it has, not what one more permit would leave).
#[tokio::test]
async fn a_refused_request_charges_the_other_descriptor_nothing() {
    let server = in_process(
        "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 10}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .await;
    let a = descriptor(&[("a", "x")]);
    let b = descriptor(&[("b", "x")]);
    assert!(ok(&decide(&server, vec![b.clone()]).await));
    for _ in 0..5 {
        assert!(!ok(&decide(&server, vec![a.clone(), b.clone()]).await));
    }
    // a still has all 10: nine more after this one.
    let alone = decide(&server, vec![a.clone()]).await;
    assert!(ok(&alone));
    assert_eq!(alone.statuses[0].limit_remaining, 9);
}

#[tokio::test]
async fn a_refusal_reports_the_untouched_descriptors_true_remaining() {
    let server = in_process(
        "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 10, name: a}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 1, name: b}\n",
    )
    .await;
    let a = descriptor(&[("a", "x")]);
    let b = descriptor(&[("b", "x")]);
    assert!(ok(&decide(&server, vec![b.clone()]).await));
    let refused = decide(&server, vec![a.clone(), b.clone()]).await;
    assert!(!ok(&refused));
    assert_eq!(
        refused.statuses[0].limit_remaining, 10,
        "a was charged nothing: {refused:?}"
    );
    let state = header(&refused, "ratelimit").expect("RateLimit field");
    assert!(state.contains("\"a\";r=10;"), "RateLimit: {state}");
}

/// Hits one more than a descriptor has left, beside another descriptor: refused, and the other
/// (listed first, so taken first if taken at all) keeps every permit. No other request runs.
#[tokio::test]
async fn hits_one_more_than_left_charge_the_other_descriptor_nothing() {
    for method in METHODS {
        let yaml = format!(
            "domain: edge\nmethod: {method}\ndescriptors:\n  - key: a\n    rate_limit: {{unit: hour, requests_per_unit: 10}}\n  - key: b\n    rate_limit: {{unit: hour, requests_per_unit: 5}}\n"
        );
        let server = in_process(&yaml).await;
        let a = descriptor(&[("a", "x")]);
        let b = descriptor(&[("b", "x")]);
        assert_eq!(
            oks(&server, std::slice::from_ref(&b), 2).await,
            2,
            "{method}"
        );
        let refused = decide(&server, vec![a.clone(), with_hits(b.clone(), 4)]).await;
        assert!(!ok(&refused), "{method}: 4 hits with 3 left");
        let alone = decide(&server, vec![a.clone()]).await;
        assert_eq!(
            alone.statuses[0].limit_remaining, 9,
            "{method}: the refused request charged a: {refused:?}"
        );
    }
}

/// Hits one more than the first descriptor has left: the look lets it pass, its taking is
/// refused, and the second descriptor must not be charged then.
#[tokio::test]
async fn hits_one_more_than_left_on_the_first_descriptor_charge_the_second_nothing() {
    let server = in_process(
        "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 5}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
    )
    .await;
    let a = descriptor(&[("a", "x")]);
    let b = descriptor(&[("b", "x")]);
    assert_eq!(oks(&server, std::slice::from_ref(&a), 2).await, 2);
    let refused = decide(&server, vec![with_hits(a.clone(), 4), b.clone()]).await;
    assert!(!ok(&refused), "4 hits with 3 left");
    let alone = decide(&server, vec![b.clone()]).await;
    assert_eq!(alone.statuses[0].limit_remaining, 9, "{refused:?}");
}

/// The same on Redis: hits one more than left on the second descriptor charge the first nothing.
#[tokio::test]
async fn hits_one_more_than_left_charge_the_other_descriptor_nothing_on_redis() {
    let redis = RedisServer::start();
    for method in ["fixed_window", "token_bucket"] {
        let yaml = format!(
            "domain: edge\nmethod: {method}\ndescriptors:\n  - key: a\n    rate_limit: {{unit: hour, requests_per_unit: 10}}\n  - key: b\n    rate_limit: {{unit: hour, requests_per_unit: 5}}\n"
        );
        let server = RateLimitServer::new(&config(&yaml), on_redis(&redis, FailurePolicy::Error))
            .await
            .expect("built");
        let a = descriptor(&[("a", method)]);
        let b = descriptor(&[("b", method)]);
        assert_eq!(
            oks(&server, std::slice::from_ref(&b), 2).await,
            2,
            "{method}"
        );
        let refused = decide(&server, vec![a.clone(), with_hits(b.clone(), 4)]).await;
        assert!(!ok(&refused), "{method}: 4 hits with 3 left");
        let alone = decide(&server, vec![a.clone()]).await;
        assert_eq!(
            alone.statuses[0].limit_remaining, 9,
            "{method}: {refused:?}"
        );
    }
}

/// Each method, sequential requests of two descriptors with random hits (20 clients, each run
/// down): a request is granted exactly when both have its hits left, and a refused one takes
/// nothing (checked against a model; the unit is an hour, so nothing refills meanwhile).
#[tokio::test]
async fn two_descriptors_with_random_hits_follow_the_all_or_nothing_model_for_every_method() {
    for method in METHODS {
        let yaml = format!(
            "domain: edge\nmethod: {method}\ndescriptors:\n  - key: a\n    rate_limit: {{unit: hour, requests_per_unit: 13}}\n  - key: b\n    rate_limit: {{unit: hour, requests_per_unit: 7}}\n"
        );
        let server = in_process(&yaml).await;
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for client in 0..20 {
            let client = client.to_string();
            let (mut left_a, mut left_b) = (13u64, 7u64);
            for step in 0..15 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let hits_a = seed % 4;
                let hits_b = (seed >> 8) % 4;
                let answer = decide(
                    &server,
                    vec![
                        with_hits(descriptor(&[("a", &client)]), hits_a),
                        with_hits(descriptor(&[("b", &client)]), hits_b),
                    ],
                )
                .await;
                let expected = hits_a <= left_a && hits_b <= left_b;
                assert_eq!(
                    ok(&answer),
                    expected,
                    "{method} client {client} step {step}: hits {hits_a}/{hits_b}, left \
                     {left_a}/{left_b}: {answer:?}"
                );
                if expected {
                    left_a -= hits_a;
                    left_b -= hits_b;
                }
            }
        }
    }
}

/// Shadow mode mixed in: a shadowed descriptor over its limit neither refuses nor blocks the
/// others' charge; a refusal by a real limit charges the shadowed one nothing either.
#[tokio::test]
async fn shadowed_descriptors_never_refuse_and_are_not_charged_by_a_refusal() {
    let server = in_process(
        "domain: edge\ndescriptors:\n  - key: s\n    shadow_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 2}\n  - key: r\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
    )
    .await;
    let s = descriptor(&[("s", "x")]);
    let r = descriptor(&[("r", "x")]);
    // 3 granted: shadow goes over after 2 but never refuses.
    assert_eq!(oks(&server, &[s.clone(), r.clone()], 5).await, 3);
    let answer = decide(&server, vec![s.clone()]).await;
    assert!(ok(&answer), "shadow mode answers OK");
    assert!(header(&answer, "retry-after").is_none());
}

/// A descriptor of 0 hits takes nothing and is never refused, even beside a refusing one, and
/// absurd hits do not panic.
#[tokio::test]
async fn zero_and_absurd_hits_neither_panic_nor_charge() {
    let server = in_process(
        "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 2}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
    )
    .await;
    let a = descriptor(&[("a", "x")]);
    let b = descriptor(&[("b", "x")]);
    for _ in 0..5 {
        assert!(ok(&decide(&server, vec![with_hits(a.clone(), 0)]).await));
    }
    assert!(!ok(
        &decide(&server, vec![with_hits(a.clone(), u64::MAX)]).await
    ));
    assert!(!ok(&decide(
        &server,
        vec![with_hits(a.clone(), u64::MAX), with_hits(b.clone(), 1)]
    )
    .await));
    assert!(!ok(&decide(&server, vec![with_hits(a.clone(), 3)]).await));
    assert_eq!(oks(&server, std::slice::from_ref(&a), 5).await, 2);
    assert_eq!(oks(&server, std::slice::from_ref(&b), 5).await, 2);
    let mut big = request("edge", vec![a.clone()]);
    big.hits_addend = u32::MAX;
    assert!(!ok(&server.decide(&big).await.expect("decided")));
}

/// `replaces` with two limits naming each other: both are dropped, as envoyproxy/ratelimit
/// drops every limit some matched limit replaces; a limit replacing itself is dropped too.
#[tokio::test]
async fn replaces_cycles_drop_both_as_envoyproxy_ratelimit_does() {
    let server = in_process(
        "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1, name: na, replaces: [{name: nb}]}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 1, name: nb, replaces: [{name: na}]}\n",
    )
    .await;
    let a = descriptor(&[("a", "x")]);
    let b = descriptor(&[("b", "x")]);
    assert_eq!(oks(&server, std::slice::from_ref(&a), 3).await, 1);
    assert_eq!(oks(&server, &[a.clone(), b.clone()], 3).await, 3);
}

// ---------------------------------------------------------------------------------------------
// Concurrency.

/// Many tasks on a multi-threaded runtime, each request of two descriptors (a shared one and a
/// per-task one): no limit ever grants more than it allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_never_exceed_any_limit() {
    for method in METHODS {
        let yaml = format!(
            "domain: edge\nmethod: {method}\ndescriptors:\n  - key: shared\n    rate_limit: {{unit: hour, requests_per_unit: 50}}\n  - key: own\n    rate_limit: {{unit: hour, requests_per_unit: 10}}\n"
        );
        let server = in_process(&yaml).await;
        let granted = Arc::new(AtomicU64::new(0));
        let per_task: Vec<_> = (0..8)
            .map(|task| {
                let server = server.clone();
                let granted = Arc::clone(&granted);
                tokio::spawn(async move {
                    let mut mine = 0u64;
                    for _ in 0..40 {
                        let answer = decide(
                            &server,
                            vec![
                                descriptor(&[("shared", "s")]),
                                descriptor(&[("own", &task.to_string())]),
                            ],
                        )
                        .await;
                        if ok(&answer) {
                            mine += 1;
                            granted.fetch_add(1, Ordering::Relaxed);
                        }
                        tokio::task::yield_now().await;
                    }
                    mine
                })
            })
            .collect();
        for handle in per_task {
            let mine = handle.await.expect("no panic");
            assert!(
                mine <= 10,
                "{method}: a task's own limit of 10 granted {mine}"
            );
        }
        let total = granted.load(Ordering::Relaxed);
        assert!(
            total <= 50,
            "{method}: the shared limit of 50 granted {total}"
        );
        // 8 tasks of 10 each want 80 > 50: the shared limit is reached, exactly.
        assert_eq!(
            total, 50,
            "{method}: all or nothing should leave nothing unspent"
        );
    }
}

/// Reloads running alongside the requests: an unchanged limit is never reset or doubled (a
/// changed other descriptor and a reordered list do not count as changes to it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reloads_under_traffic_never_reset_an_unchanged_limit() {
    let first = "domain: edge\ndescriptors:\n  - key: shared\n    rate_limit: {unit: hour, requests_per_unit: 30}\n  - key: other\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";
    let second = "domain: edge\ndescriptors:\n  - key: other\n    rate_limit: {unit: hour, requests_per_unit: 7}\n  - key: shared\n    rate_limit: {unit: hour, requests_per_unit: 30}\n";
    let server = in_process(first).await;
    let configs = [config(first), config(second)];
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Reloads done so far: the requests wait on it now and then, so that reloads land among
    // them however the runtime schedules the tasks (on two cores the requests could otherwise
    // all be answered before the first reload ended).
    let reloaded = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let reloader = {
        let server = server.clone();
        let stop = Arc::clone(&stop);
        let reloaded = Arc::clone(&reloaded);
        tokio::spawn(async move {
            let mut reloads = 0usize;
            while !stop.load(Ordering::Relaxed) {
                server.reload(&configs[reloads % 2]).await.expect("reloads");
                reloads += 1;
                reloaded.store(reloads, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
            reloads
        })
    };
    let granted = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let server = server.clone();
            let granted = Arc::clone(&granted);
            let reloaded = Arc::clone(&reloaded);
            tokio::spawn(async move {
                for request in 0..40 {
                    // At requests 10, 20 and 30, at least 1, 2 and 3 reloads have ended.
                    while reloaded.load(Ordering::Relaxed) < request / 10 {
                        tokio::task::yield_now().await;
                    }
                    if ok(&decide(&server, vec![descriptor(&[("shared", "s")])]).await) {
                        granted.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("no panic");
    }
    stop.store(true, Ordering::Relaxed);
    let reloads = reloader.await.expect("no panic");
    assert!(reloads > 2, "reloads ran: {reloads}");
    assert_eq!(granted.load(Ordering::Relaxed), 30);
}

// ---------------------------------------------------------------------------------------------
// Matching and clients.

/// Values that look like the client key's encoding (lengths, ':'), different entry counts and
/// prefixes: no two different descriptors share a client, and one descriptor is one client.
#[tokio::test]
async fn crafted_values_never_share_or_split_a_client() {
    let server = in_process(
        "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n    descriptors:\n      - key: j\n        rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: p\n    value: \"ab*\"\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .await;
    let cases: Vec<Vec<(&str, &str)>> = vec![
        vec![("k", "1:a")],
        vec![("k", "a")],
        vec![("k", "3:1:a")],
        vec![("k", "")],
        vec![("k", "1"), ("j", "a")],
        vec![("k", "1:a"), ("j", "")],
        vec![("k", ""), ("j", "1:a")],
        vec![("k", "1:"), ("j", "a")],
        vec![("p", "ab")],
        vec![("p", "abc")],
        vec![("p", "ab:c")],
    ];
    for entries in &cases {
        let answer = decide(&server, vec![descriptor(entries)]).await;
        assert!(
            ok(&answer),
            "{entries:?} shares a client with an earlier one"
        );
    }
    for entries in &cases {
        let answer = decide(&server, vec![descriptor(entries)]).await;
        assert!(!ok(&answer), "{entries:?} was not counted as one client");
    }
}

/// Exact before prefix before key-only, whatever their order in the file; the first matching
/// prefix when two prefixes match; a limit only where the last entry lands.
#[tokio::test]
async fn exact_before_prefix_before_key_only_in_any_order() {
    let server = in_process(
        "domain: edge\ndescriptors:\n  - key: path\n    rate_limit: {unit: hour, requests_per_unit: 5, name: any}\n  - key: path\n    value: \"/a*\"\n    rate_limit: {unit: hour, requests_per_unit: 3, name: prefix}\n  - key: path\n    value: /api\n    rate_limit: {unit: hour, requests_per_unit: 1, name: exact}\n",
    )
    .await;
    let name = |response: &RateLimitResponse| {
        response.statuses[0]
            .current_limit
            .as_ref()
            .map(|limit| limit.name.clone())
    };
    assert_eq!(
        name(&decide(&server, vec![descriptor(&[("path", "/api")])]).await).as_deref(),
        Some("exact")
    );
    assert_eq!(
        name(&decide(&server, vec![descriptor(&[("path", "/apx")])]).await).as_deref(),
        Some("prefix")
    );
    assert_eq!(
        name(&decide(&server, vec![descriptor(&[("path", "/b")])]).await).as_deref(),
        Some("any")
    );
    // An empty request entry list, and an unknown domain, limit nothing.
    assert!(ok(&decide(&server, vec![descriptor(&[])]).await));
    let other = server
        .decide(&request("elsewhere", vec![descriptor(&[("path", "/api")])]))
        .await
        .expect("decided");
    assert!(ok(&other));
}

/// Two different descriptors whose paths print alike (a key holding `=` or `.`) keep their
/// own limits, in process and on Redis.
#[tokio::test]
async fn descriptors_whose_paths_print_alike_keep_their_own_limits_in_process() {
    let yaml = "domain: edge\ndescriptors:\n  - key: a\n    value: x\n    descriptors:\n      - key: b\n        rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: a=x.b\n    rate_limit: {unit: hour, requests_per_unit: 4}\n";
    let server = in_process(yaml).await;
    let dotted = [descriptor(&[("a=x.b", "v")])];
    assert_eq!(oks(&server, &dotted, 6).await, 4);
    server.reload(&config(yaml)).await.expect("reloads");
    assert_eq!(oks(&server, &[descriptor(&[("a=x.b", "w")])], 6).await, 4);
}

#[tokio::test]
async fn descriptors_whose_paths_print_alike_keep_their_own_limits_on_redis() {
    let redis = RedisServer::start();
    let yaml = "domain: edge\ndescriptors:\n  - key: a\n    value: x\n    descriptors:\n      - key: b\n        rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: a=x.b\n    rate_limit: {unit: hour, requests_per_unit: 4}\n";
    let server = RateLimitServer::new(&config(yaml), on_redis(&redis, FailurePolicy::Error))
        .await
        .expect("a valid configuration builds on Redis");
    assert_eq!(oks(&server, &[descriptor(&[("a=x.b", "v")])], 6).await, 4);
    assert_eq!(
        oks(&server, &[descriptor(&[("a", "x"), ("b", "v")])], 6).await,
        1
    );
}

// ---------------------------------------------------------------------------------------------
// Configuration.

#[test]
fn mistaken_configurations_are_refused_with_their_place_and_never_panic() {
    let cases: &[(&str, &str)] = &[
        ("requests_per_unit: -1", "requests_per_unit"),
        ("requests_per_unit: 1.5", "requests_per_unit"),
        (
            "requests_per_unit: 18446744073709551616",
            "requests_per_unit",
        ),
        ("requests_per_unit: \"ten\"", "requests_per_unit"),
        ("unit: fortnight, requests_per_unit: 1", "unit"),
        ("requests_per_unit: 1", "unit"),
        ("unit: second", "requests_per_unit"),
        (
            "unit: second, requests_per_unit: 1, replaces: [{name: ghost}]",
            "replaces",
        ),
        ("unit: second, requests_per_unit: 1, name: \"\"", "name"),
        ("unit: second, requests_per_unit: 1, colour: red", "colour"),
    ];
    for (limit, field) in cases {
        let yaml = format!("domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {{{limit}}}\n");
        let error =
            RlsConfig::from_yaml_str("review.yaml", &yaml).expect_err(&format!("refused: {limit}"));
        let text = error.to_string();
        assert!(text.contains("review.yaml"), "{limit}: {text}");
        assert!(text.contains(field), "{limit}: no field {field} in {text}");
    }
    // Deep nesting past the bound, and far past serde's own recursion.
    for depth in [17usize, 200] {
        let mut yaml = String::from("domain: edge\ndescriptors:\n");
        for level in 0..depth {
            let indent = "  ".repeat(2 * level);
            yaml.push_str(&format!(
                "{indent}  - key: k{level}\n{indent}    descriptors:\n"
            ));
        }
        yaml.push_str(&format!("{}  - key: last\n", "  ".repeat(2 * depth)));
        assert!(
            RlsConfig::from_yaml_str("review.yaml", &yaml).is_err(),
            "depth {depth}"
        );
    }
    // Alias expansion (a "billion laughs") does not hang or panic.
    let laughs = "a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e]\ng: [*f, *f, *f, *f, *f, *f, *f, *f]\ndomain: edge\n";
    assert!(RlsConfig::from_yaml_str("review.yaml", laughs).is_err());
    // Not a mapping at all.
    for text in [
        "- 1\n- 2\n",
        "42\n",
        "domain: [edge]\n",
        "\u{feff}domain: edge\ndescriptors: 3\n",
    ] {
        assert!(
            RlsConfig::from_yaml_str("review.yaml", text).is_err(),
            "{text:?}"
        );
    }
}

/// A limit above what the answer's `requests_per_unit` (a u32 in Envoy's proto) can carry is
/// either refused when read, or reported as it is.
#[tokio::test]
async fn a_limit_beyond_the_protos_u32_is_refused_or_reported_truly() {
    let yaml = "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5000000000}\n";
    let Ok(config) = RlsConfig::from_yaml_str("review.yaml", yaml) else {
        return;
    };
    let server = RateLimitServer::new(&config, StateStore::InProcess { clients: 8 })
        .await
        .expect("built");
    let answer = decide(&server, vec![descriptor(&[("k", "v")])]).await;
    let limit = answer.statuses[0].current_limit.as_ref().expect("a limit");
    assert_eq!(
        u64::from(limit.requests_per_unit),
        5_000_000_000,
        "{answer:?}"
    );
}

/// Unicode names, many domains, one name on two descriptors: read, served, and the fields stay
/// printable ASCII.
#[tokio::test]
async fn unicode_names_and_many_domains_are_served_with_printable_fields() {
    let mut yaml = String::new();
    for index in 0..200 {
        yaml.push_str(&format!(
            "---\ndomain: d{index}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: 2}}\n"
        ));
    }
    yaml.push_str("---\ndomain: édge\ndescriptors:\n  - key: ключ\n    value: \"значение\"\n    rate_limit: {unit: minute, requests_per_unit: 1, name: \"имя \\\"q\\\" \\\\\"}\n  - key: k2\n    rate_limit: {unit: minute, requests_per_unit: 1, name: \"имя \\\"q\\\" \\\\\"}\n");
    let config = RlsConfig::from_yaml_str("review.yaml", &yaml).expect("valid");
    let server = RateLimitServer::new(&config, StateStore::InProcess { clients: 8 })
        .await
        .expect("built");
    let answer = server
        .decide(&request(
            "édge",
            vec![
                descriptor(&[("ключ", "значение")]),
                descriptor(&[("k2", "x")]),
            ],
        ))
        .await
        .expect("decided");
    assert!(ok(&answer));
    for name in ["ratelimit-policy", "ratelimit"] {
        let value = header(&answer, name).expect("field present");
        assert!(
            value.bytes().all(|b| (0x20..=0x7e).contains(&b)),
            "{name}: {value}"
        );
        assert_eq!(value.matches("\";").count(), 2, "{name}: {value}");
    }
    let d199 = server
        .decide(&request("d199", vec![descriptor(&[("k", "v")])]))
        .await
        .expect("decided");
    assert_eq!(d199.statuses[0].limit_remaining, 1);
}

// ---------------------------------------------------------------------------------------------
// The answer.

/// For each method: after k grants of 3, `limit_remaining` is 3 - k, `current_limit` is
/// 3/minute, `duration_until_reset` within a minute (two for the sliding counter); a refusal
/// has 0 remaining and a Retry-After of at least 1 second; the fields are Structured Field
/// items.
#[tokio::test]
async fn figures_and_fields_are_true_for_every_method() {
    for method in METHODS {
        let yaml = format!(
            "domain: edge\nmethod: {method}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: 3, name: lim}}\n"
        );
        let server = in_process(&yaml).await;
        let d = [descriptor(&[("k", "v")])];
        for k in 1..=3u32 {
            let answer = decide(&server, d.to_vec()).await;
            assert!(ok(&answer), "{method}");
            let status = &answer.statuses[0];
            assert_eq!(status.limit_remaining, 3 - k, "{method} after {k}");
            let limit = status.current_limit.as_ref().expect("limit");
            assert_eq!((limit.requests_per_unit, limit.unit), (3, 2), "{method}");
            let reset = status.duration_until_reset.as_ref().expect("reset");
            // The sliding counter's permits all return only when the previous window's weight
            // has gone too: up to two windows.
            let most = if method == "sliding_window_counter" {
                120
            } else {
                60
            };
            assert!(
                reset.seconds <= most && (reset.seconds, reset.nanos) > (0, 0),
                "{method}: {reset:?}"
            );
            assert_eq!(
                header(&answer, "ratelimit-policy"),
                Some("\"lim\";q=3;w=60"),
                "{method}"
            );
            let state = header(&answer, "ratelimit").expect("state");
            assert!(
                state.starts_with(&format!("\"lim\";r={};t=", 3 - k)),
                "{method}: {state}"
            );
        }
        let refused = decide(&server, d.to_vec()).await;
        assert!(!ok(&refused), "{method}");
        assert_eq!(refused.statuses[0].limit_remaining, 0);
        let retry: u64 = header(&refused, "retry-after")
            .unwrap_or_else(|| panic!("{method}: no Retry-After"))
            .parse()
            .expect("delta-seconds");
        // The sliding counter frees a permit once the previous window's weight has dropped
        // enough: within two windows.
        assert!((1..=120).contains(&retry), "{method}: Retry-After {retry}");
    }
}

/// Several limits on one descriptor: `current_limit` names the one that refused.
#[tokio::test]
async fn several_limits_report_the_binding_one() {
    let server = in_process(
        "domain: edge\nmethod: sliding_window_counter\ndescriptors:\n  - key: k\n    limits:\n      - {unit: minute, requests_per_unit: 2}\n      - {unit: hour, requests_per_unit: 100}\n",
    )
    .await;
    let d = [descriptor(&[("k", "v")])];
    assert_eq!(oks(&server, &d, 2).await, 2);
    let refused = decide(&server, d.to_vec()).await;
    let limit = refused.statuses[0].current_limit.as_ref().expect("limit");
    assert_eq!((limit.requests_per_unit, limit.unit), (2, 2));
}

/// A refusal always carries Retry-After (at least 1): also when a request of two descriptors is
/// refused because one asks more hits than it has left.
#[tokio::test]
async fn a_refusal_by_looking_carries_retry_after() {
    let server = in_process(
        "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 10}\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
    )
    .await;
    let a = descriptor(&[("a", "x")]);
    let b = descriptor(&[("b", "x")]);
    assert_eq!(oks(&server, std::slice::from_ref(&b), 2).await, 2);
    let refused = decide(&server, vec![a.clone(), with_hits(b.clone(), 5)]).await;
    assert!(!ok(&refused));
    let retry = header(&refused, "retry-after");
    assert!(
        retry.is_some_and(|value| value.parse::<u64>().is_ok_and(|s| s >= 1)),
        "Retry-After {retry:?} in {refused:?}"
    );
}

/// A refusal by `requests_per_unit: 0` carries no Retry-After: no later request passes either
/// (as a request asking more than its limit gets none), while `duration_until_reset` still
/// tells Envoy the unit.
#[tokio::test]
async fn a_refusal_by_a_blocked_descriptor_carries_no_retry_after() {
    let server = in_process(
        "domain: edge\ndescriptors:\n  - key: banned\n    rate_limit: {unit: minute, requests_per_unit: 0}\n",
    )
    .await;
    let refused = decide(&server, vec![descriptor(&[("banned", "x")])]).await;
    assert!(!ok(&refused));
    assert!(header(&refused, "retry-after").is_none(), "{refused:?}");
    assert_eq!(
        refused.statuses[0]
            .duration_until_reset
            .as_ref()
            .map(|d| d.seconds),
        Some(60)
    );
}

/// Bad requests: an empty domain or no descriptors is INVALID_ARGUMENT; huge values and many
/// descriptors are decided without a panic.
#[tokio::test]
async fn hostile_requests_are_answered_without_a_panic() {
    let server = in_process(
        "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100000}\n",
    )
    .await;
    let empty = server
        .decide(&request("", vec![descriptor(&[("k", "v")])]))
        .await;
    assert_eq!(
        empty.expect_err("refused").code(),
        tonic::Code::InvalidArgument
    );
    let none = server.decide(&request("edge", Vec::new())).await;
    assert_eq!(
        none.expect_err("refused").code(),
        tonic::Code::InvalidArgument
    );
    let long = "x".repeat(1 << 20);
    assert!(ok(&decide(&server, vec![descriptor(&[("k", &long)])]).await));
    // As many descriptors as a request may have are decided; more are refused as invalid.
    let most = RateLimitServer::MAX_DESCRIPTORS;
    let many: Vec<_> = (0..most)
        .map(|i| descriptor(&[("k", &i.to_string())]))
        .collect();
    let answer = decide(&server, many).await;
    assert!(ok(&answer));
    assert_eq!(answer.statuses.len(), most);
    let too_many: Vec<_> = (0..2000)
        .map(|i| descriptor(&[("k", &i.to_string())]))
        .collect();
    let error = server.decide(&request("edge", too_many)).await;
    assert_eq!(
        error.expect_err("refused").code(),
        tonic::Code::InvalidArgument
    );
}

// ---------------------------------------------------------------------------------------------
// Redis.

/// Two servers of one configuration on one Redis, many tasks each: the shared limit grants
/// exactly its count across both, two descriptors per request.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_servers_on_one_redis_share_each_limit_exactly() {
    let redis = RedisServer::start();
    let yaml = "domain: edge\nmethod: sliding_window_log\ndescriptors:\n  - key: shared\n    rate_limit: {unit: hour, requests_per_unit: 40}\n  - key: own\n    rate_limit: {unit: hour, requests_per_unit: 8}\n";
    let mut servers = Vec::new();
    for _ in 0..2 {
        servers.push(
            RateLimitServer::new(&config(yaml), on_redis(&redis, FailurePolicy::Error))
                .await
                .expect("built"),
        );
    }
    let granted = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|task| {
            let server = servers[task % 2].clone();
            let granted = Arc::clone(&granted);
            tokio::spawn(async move {
                let mut mine = 0;
                for _ in 0..12 {
                    let answer = decide(
                        &server,
                        vec![
                            descriptor(&[("shared", "s")]),
                            descriptor(&[("own", &(task / 2).to_string())]),
                        ],
                    )
                    .await;
                    if ok(&answer) {
                        mine += 1;
                        granted.fetch_add(1, Ordering::Relaxed);
                    }
                }
                (task / 2, mine)
            })
        })
        .collect();
    let mut per_own = [0u64; 4];
    for task in tasks {
        let (own, mine) = task.await.expect("no panic");
        per_own[own] += mine;
    }
    for (own, count) in per_own.iter().enumerate() {
        assert!(*count <= 8, "own {own} granted {count} of 8");
    }
    let total = granted.load(Ordering::Relaxed);
    assert!(total <= 32, "shared granted {total}");
}

/// The documented reload promise on Redis: a changed limit starts afresh, an unchanged one
/// keeps its state.
#[tokio::test]
async fn a_reload_on_redis_keeps_unchanged_limits_and_restarts_changed_ones() {
    let redis = RedisServer::start();
    let before = "domain: edge\ndescriptors:\n  - key: same\n    rate_limit: {unit: hour, requests_per_unit: 3}\n  - key: changed\n    rate_limit: {unit: hour, requests_per_unit: 3}\n";
    let after = "domain: edge\ndescriptors:\n  - key: same\n    rate_limit: {unit: hour, requests_per_unit: 3}\n  - key: changed\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";
    let server = RateLimitServer::new(&config(before), on_redis(&redis, FailurePolicy::Error))
        .await
        .expect("built");
    let same = [descriptor(&[("same", "x")])];
    let changed = [descriptor(&[("changed", "x")])];
    assert_eq!(oks(&server, &same, 3).await, 3);
    assert_eq!(oks(&server, &changed, 3).await, 3);
    server.reload(&config(after)).await.expect("reloads");
    assert_eq!(oks(&server, &same, 3).await, 0, "unchanged: kept");
    assert_eq!(
        oks(&server, &changed, 10).await,
        5,
        "changed: afresh, as documented"
    );
}

/// Redis down, under each failure policy: Error answers UNAVAILABLE, open grants, closed
/// refuses; never a panic.
#[tokio::test]
async fn redis_down_answers_by_the_failure_policy() {
    let mut redis = RedisServer::start();
    let yaml = "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 3}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 3}\n";
    let mut servers = Vec::new();
    for policy in [
        FailurePolicy::Error,
        FailurePolicy::FailOpen,
        FailurePolicy::FailClosed,
    ] {
        servers.push(
            RateLimitServer::new(&config(yaml), on_redis(&redis, policy))
                .await
                .expect("built"),
        );
    }
    redis.kill();
    for descriptors in [
        vec![descriptor(&[("a", "x")])],
        vec![descriptor(&[("a", "x")]), descriptor(&[("b", "x")])],
    ] {
        let error = servers[0]
            .decide(&request("edge", descriptors.clone()))
            .await;
        assert_eq!(
            error.expect_err("unavailable").code(),
            tonic::Code::Unavailable
        );
        assert!(ok(&decide(&servers[1], descriptors.clone()).await));
        assert!(!ok(&decide(&servers[2], descriptors.clone()).await));
    }
}

/// Absurd in-process capacities are a build error, not a panic or an allocation failure.
#[tokio::test]
async fn absurd_client_capacities_are_refused_when_built() {
    let config = config(
        "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    );
    for clients in [0, usize::MAX, usize::MAX / 17] {
        let built = RateLimitServer::new(&config, StateStore::InProcess { clients }).await;
        assert!(built.is_err(), "clients {clients} built");
    }
}

/// A reload on Redis that changes only a descriptor's method: the descriptor starts afresh under
/// its new method (its limits changed as the docs count changes), and never errors on the state
/// the old method left in Redis.
#[tokio::test]
async fn a_method_change_on_redis_starts_afresh_without_errors() {
    let redis = RedisServer::start();
    let yaml = |method: &str| {
        format!(
            "domain: edge\nmethod: {method}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: 3}}\n"
        )
    };
    let server = RateLimitServer::new(
        &config(&yaml("fixed_window")),
        on_redis(&redis, FailurePolicy::Error),
    )
    .await
    .expect("built");
    let d = [descriptor(&[("k", "v")])];
    assert_eq!(oks(&server, &d, 2).await, 2);
    for method in [
        "token_bucket",
        "sliding_window_log",
        "sliding_window_counter",
        "fixed_window",
    ] {
        server
            .reload(&config(&yaml(method)))
            .await
            .expect("reloads");
        let mut granted = 0;
        for _ in 0..5 {
            let answer = server
                .decide(&request("edge", d.to_vec()))
                .await
                .unwrap_or_else(|status| panic!("{method}: {status:?}"));
            granted += usize::from(ok(&answer));
        }
        assert!(granted <= 3, "{method}: {granted} of 3");
    }
}
