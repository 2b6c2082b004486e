//! A second round of attacks on the Envoy rate-limit service, aimed at its decision protocol
//! for requests of several descriptors (look at every limit, refuse taking nothing, else take
//! from each): every method against an all-or-nothing model, `Retry-After`, Redis failure
//! policies, concurrency, and the request path's panics.

mod redis_support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::google::protobuf::UInt64Value;
use redis_support::RedisServer;
use tollgate::envoy::proto::rate_limit_response::Code;
use tollgate::envoy::proto::{RateLimitRequest, RateLimitResponse};
use tollgate::envoy::{RateLimitServer, RlsConfig, StateStore};
use tollgate::redis::FailurePolicy;

const METHODS: [&str; 4] = [
    "fixed_window",
    "token_bucket",
    "sliding_window_log",
    "sliding_window_counter",
];

fn descriptor(key: &str, value: &str, hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: key.to_owned(),
            value: value.to_owned(),
        }],
        hits_addend: Some(UInt64Value { value: hits }),
        ..RateLimitDescriptor::default()
    }
}

fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

fn config(yaml: &str) -> RlsConfig {
    RlsConfig::from_yaml_str("review.yaml", yaml).expect("the configuration is valid")
}

async fn in_process(yaml: &str) -> RateLimitServer {
    RateLimitServer::new(&config(yaml), StateStore::InProcess { clients: 4096 })
        .await
        .expect("the service builds")
}

async fn on_redis(redis: &RedisServer, yaml: &str, policy: FailurePolicy) -> RateLimitServer {
    let store = StateStore::Redis {
        url: redis.url(),
        policy,
        timeout: Duration::from_millis(500),
    };
    RateLimitServer::new(&config(yaml), store)
        .await
        .expect("the service builds on Redis")
}

async fn decide(
    server: &RateLimitServer,
    descriptors: Vec<RateLimitDescriptor>,
) -> RateLimitResponse {
    server
        .decide(&request(descriptors))
        .await
        .expect("the request is decided")
}

fn ok(response: &RateLimitResponse) -> bool {
    response.overall_code == Code::Ok as i32
}

fn retry_after(response: &RateLimitResponse) -> Option<u64> {
    response
        .response_headers_to_add
        .iter()
        .find(|header| header.key == "retry-after")
        .map(|header| header.value.parse().expect("Retry-After is whole seconds"))
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

// ---------------------------------------------------------------------------------------------
// Every method against the all-or-nothing model.

/// Day- and week-long limits: nothing refills while the test runs, so each limit is a counter.
/// `b` is replaced by `r` when both match; `s` is shadowed; `m` has two limits; `z` refuses
/// everything; `u` is unlimited.
fn model_yaml(method: &str) -> String {
    let several = several_limits_method(method);
    format!(
        "domain: edge
method: {method}
descriptors:
  - key: a
    rate_limit: {{unit: day, requests_per_unit: 5}}
  - key: b
    rate_limit: {{unit: day, requests_per_unit: 3, name: nb}}
  - key: r
    rate_limit: {{unit: day, requests_per_unit: 4, name: nr, replaces: [{{name: nb}}]}}
  - key: s
    shadow_mode: true
    rate_limit: {{unit: day, requests_per_unit: 2}}
  - key: m
    method: {several}
    limits:
      - {{unit: day, requests_per_unit: 6}}
      - {{unit: week, requests_per_unit: 4}}
  - key: z
    rate_limit: {{unit: day, requests_per_unit: 0}}
  - key: u
    rate_limit: {{unlimited: true}}
"
    )
}

/// The sliding window log enforces one limit only (a build error otherwise): a descriptor of
/// several limits then uses the sliding window counter.
fn several_limits_method(method: &str) -> &str {
    if method == "sliding_window_log" {
        "sliding_window_counter"
    } else {
        method
    }
}

/// What each key's limit allows (`None`: unlimited; `Some(0)`: everything refused).
fn model_limit(key: &str) -> Option<u64> {
    match key {
        "a" => Some(5),
        "b" => Some(3),
        "r" => Some(4),
        "s" => Some(2),
        "m" => Some(4),
        "z" => Some(0),
        _ => None,
    }
}

/// The model's answer to `asked` (key, hits) on `left`, charging it when granted: refused
/// exactly when some applied limit that is not shadowed is asked more, over the request, than
/// it has left; a refusal charges nothing; a grant charges each applied descriptor (a shadowed
/// one only where its own hits fit, one copy after another).
fn model_decide(left: &mut HashMap<&'static str, u64>, asked: &[(&'static str, u64)]) -> bool {
    let replaced = asked.iter().any(|(key, _)| *key == "r");
    let applied: Vec<(&str, u64)> = asked
        .iter()
        .copied()
        .filter(|(key, _)| !(replaced && *key == "b"))
        .collect();
    let mut totals: HashMap<&str, u64> = HashMap::new();
    for (key, hits) in &applied {
        *totals.entry(key).or_default() += hits;
    }
    let refused = totals.iter().any(|(key, total)| {
        *key != "s" && *total > 0 && model_limit(key).is_some_and(|_| *total > left[key])
    });
    if refused {
        return false;
    }
    for (key, hits) in applied {
        if model_limit(key).is_none() || key == "z" {
            continue;
        }
        let have = left.get_mut(key).expect("a limited key");
        if hits <= *have {
            *have -= hits;
        }
    }
    true
}

fn fresh_left() -> HashMap<&'static str, u64> {
    ["a", "b", "r", "s", "m", "z"]
        .into_iter()
        .map(|key| (key, model_limit(key).expect("limited")))
        .collect()
}

/// Sequential random requests of 1 to 4 descriptors (duplicates, shadowed, replaced, blocked,
/// unlimited, several limits; hits 0 to limit + 1) for one client each run: every answer is the
/// model's, so a request that fits is never refused and a refused one charges nothing.
async fn follows_the_model(server: &RateLimitServer, method: &str, seed: u64) {
    const KEYS: [&str; 7] = ["a", "b", "r", "s", "m", "z", "u"];
    let mut rng = Rng(seed);
    for client in 0..12 {
        // One Redis serves every method's run, and a descriptor's keys do not name the method.
        let client = format!("{method}-{client}");
        let mut left = fresh_left();
        for step in 0..14 {
            let count = 1 + rng.below(4) as usize;
            let mut asked = Vec::new();
            for _ in 0..count {
                // z (everything refused) rarely, so that the others are decided too.
                let key = loop {
                    let key = KEYS[rng.below(KEYS.len() as u64) as usize];
                    if key != "z" || rng.below(4) == 0 {
                        break key;
                    }
                };
                let bound = model_limit(key).unwrap_or(3).max(1);
                let hits = match key {
                    "z" => rng.below(2),
                    _ => rng.below(bound + 2),
                };
                asked.push((key, hits));
            }
            let before = left.clone();
            let expected = model_decide(&mut left, &asked);
            let descriptors = asked
                .iter()
                .map(|(key, hits)| descriptor(key, &client, *hits))
                .collect();
            let answer = decide(server, descriptors).await;
            assert_eq!(
                ok(&answer),
                expected,
                "{method} {client} step {step}: asked {asked:?} with {before:?} left: {answer:?}"
            );
        }
    }
}

#[tokio::test]
async fn every_method_follows_the_all_or_nothing_model_in_process() {
    for (seed, method) in METHODS.into_iter().enumerate() {
        let server = in_process(&model_yaml(method)).await;
        follows_the_model(&server, method, 0x9e37_79b9_7f4a_7c15 ^ seed as u64).await;
    }
}

#[tokio::test]
async fn every_method_follows_the_all_or_nothing_model_on_redis() {
    let redis = RedisServer::start();
    for (seed, method) in METHODS.into_iter().enumerate() {
        let server = on_redis(&redis, &model_yaml(method), FailurePolicy::Error).await;
        follows_the_model(&server, method, 0x2545_f491_4f6c_dd1d ^ seed as u64).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Retry-After.

fn per_second_yaml(method: &str) -> String {
    format!(
        "domain: edge
method: {method}
descriptors:
  - key: a
    rate_limit: {{unit: second, requests_per_unit: 4}}
  - key: big
    rate_limit: {{unit: hour, requests_per_unit: 1000}}
"
    )
}

/// A request of several permits refused by looking: after its Retry-After, the same request
/// passes (each method; 3 of 4 taken, the request asks 3 with another descriptor).
async fn retry_after_is_not_early(server: RateLimitServer, method: &'static str) {
    let client = "r";
    assert!(ok(&decide(&server, vec![descriptor("a", client, 3)]).await));
    let refused_request = vec![descriptor("a", client, 3), descriptor("big", client, 1)];
    let refused = decide(&server, refused_request.clone()).await;
    assert!(!ok(&refused), "{method}: 1 of 4 left, 3 asked: {refused:?}");
    let wait = retry_after(&refused).unwrap_or_else(|| panic!("{method}: no Retry-After"));
    tokio::time::sleep(Duration::from_secs(wait)).await;
    let again = decide(&server, refused_request).await;
    assert!(
        ok(&again),
        "{method}: refused again after its Retry-After of {wait}s: {again:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_of_a_multi_permit_look_is_never_early() {
    let redis = RedisServer::start();
    let mut runs = Vec::new();
    for method in METHODS {
        let local = in_process(&per_second_yaml(method)).await;
        let remote = on_redis(&redis, &per_second_yaml(method), FailurePolicy::Error).await;
        runs.push(tokio::spawn(retry_after_is_not_early(local, method)));
        runs.push(tokio::spawn(retry_after_is_not_early(remote, method)));
    }
    for run in runs {
        run.await.expect("no failure");
    }
}

/// A descriptor of two limits, one per second and one per minute, whose per-second limit is
/// spent: a request of 4 with another descriptor is refused; after its Retry-After the
/// per-second limit is whole, but the per-minute one has 3 left, so the request must not be
/// told to come back then.
async fn retry_after_waits_for_every_limit(
    server: RateLimitServer,
    label: &'static str,
    descriptors: Vec<RateLimitDescriptor>,
) -> Option<String> {
    assert!(ok(&decide(&server, vec![descriptor("d", "x", 5)]).await));
    let refused = decide(&server, descriptors.clone()).await;
    assert!(!ok(&refused), "{label}: {refused:?}");
    let wait = retry_after(&refused).unwrap_or_else(|| panic!("{label}: no Retry-After"));
    if wait >= 30 {
        return None;
    }
    tokio::time::sleep(Duration::from_secs(wait)).await;
    let again = decide(&server, descriptors).await;
    (!ok(&again)).then(|| {
        format!(
            "{label}: Retry-After {wait}s was early, the per-minute limit has 3 of 4 asked: \
             {again:?}"
        )
    })
}

const TWO_LIMITS: &str = "domain: edge
descriptors:
  - key: d
    limits:
      - {unit: second, requests_per_unit: 5}
      - {unit: minute, requests_per_unit: 8}
  - key: big
    rate_limit: {unit: hour, requests_per_unit: 1000}
";

async fn retry_after_of_a_descriptor_of_two_limits(
    descriptors: Vec<RateLimitDescriptor>,
) -> Vec<String> {
    let redis = RedisServer::start();
    let local = in_process(TWO_LIMITS).await;
    let remote = on_redis(&redis, TWO_LIMITS, FailurePolicy::Error).await;
    let (a, b) = tokio::join!(
        retry_after_waits_for_every_limit(local, "in process", descriptors.clone()),
        retry_after_waits_for_every_limit(remote, "on redis", descriptors),
    );
    a.into_iter().chain(b).collect()
}

#[tokio::test]
async fn retry_after_of_a_look_waits_for_every_limit_of_the_descriptor() {
    let wrong = retry_after_of_a_descriptor_of_two_limits(vec![
        descriptor("d", "x", 4),
        descriptor("big", "x", 1),
    ])
    .await;
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The same descriptor alone (one decision, no look): the service's own Retry-After.
#[tokio::test]
async fn retry_after_of_one_descriptor_of_two_limits_is_never_early() {
    let wrong = retry_after_of_a_descriptor_of_two_limits(vec![descriptor("d", "x", 4)]).await;
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A request that can never pass carries no Retry-After, also when another of its descriptors
/// is over a limit that would refill: one blocked by `requests_per_unit: 0`, one asking more
/// than its limit.
#[tokio::test]
async fn no_retry_after_when_some_descriptor_can_never_pass() {
    let yaml = "domain: edge
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: z
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: c
    rate_limit: {unit: second, requests_per_unit: 2}
";
    let redis = RedisServer::start();
    let mut wrong = Vec::new();
    for (label, server) in [
        ("in process", in_process(yaml).await),
        (
            "on redis",
            on_redis(&redis, yaml, FailurePolicy::Error).await,
        ),
    ] {
        assert!(ok(&decide(&server, vec![descriptor("a", "x", 1)]).await));
        let never = [
            // Blocked by `requests_per_unit: 0`.
            vec![descriptor("a", "x", 1), descriptor("z", "x", 1)],
            // 3 asked of a limit of 2.
            vec![descriptor("a", "x", 1), descriptor("c", "x", 3)],
            // 2 and 2 asked of a limit of 2, by one descriptor given twice.
            vec![
                descriptor("a", "x", 1),
                descriptor("c", "x", 2),
                descriptor("c", "x", 2),
            ],
        ];
        for (case, descriptors) in never.into_iter().enumerate() {
            let refused = decide(&server, descriptors).await;
            assert!(!ok(&refused), "{label} case {case}");
            if let Some(wait) = retry_after(&refused) {
                wrong.push(format!(
                    "{label} case {case}: Retry-After {wait}: {refused:?}"
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "can never pass:\n{}", wrong.join("\n"));
}

/// A descriptor of limits 3 per second and 5 per minute, 3 taken a second ago: the per-minute
/// limit binds (2 left) and a request of 4 is refused; it exceeds the per-second limit, so it
/// can never pass, and gets no Retry-After (as alone it gets none).
#[tokio::test]
async fn no_retry_after_for_hits_above_a_limit_that_does_not_bind() {
    let yaml = "domain: edge
method: token_bucket
descriptors:
  - key: d
    limits:
      - {unit: second, requests_per_unit: 3}
      - {unit: minute, requests_per_unit: 5}
  - key: big
    rate_limit: {unit: hour, requests_per_unit: 1000}
";
    let redis = RedisServer::start();
    let servers = [
        ("in process", in_process(yaml).await),
        (
            "on redis",
            on_redis(&redis, yaml, FailurePolicy::Error).await,
        ),
    ];
    for (_, server) in &servers {
        assert!(ok(&decide(server, vec![descriptor("d", "x", 3)]).await));
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut wrong = Vec::new();
    for (label, server) in &servers {
        let alone = decide(server, vec![descriptor("d", "x", 4)]).await;
        let with_other = decide(
            server,
            vec![descriptor("d", "x", 4), descriptor("big", "x", 1)],
        )
        .await;
        assert!(!ok(&alone) && !ok(&with_other), "{label}");
        assert_eq!(retry_after(&alone), None, "{label} alone: {alone:?}");
        if let Some(wait) = retry_after(&with_other) {
            wrong.push(format!("{label}: Retry-After {wait}: {with_other:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "4 > 3 per second can never pass:\n{}",
        wrong.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// Redis failure policies.

const TWO: &str = "domain: edge
descriptors:
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 3}
";

/// Redis down, requests of two descriptors with several hits: Error is UNAVAILABLE, FailOpen
/// grants what fits a limit (and refuses what can never pass), FailClosed refuses.
#[tokio::test]
async fn failure_policies_with_several_descriptors_and_hits() {
    let mut redis = RedisServer::start();
    let error = on_redis(&redis, TWO, FailurePolicy::Error).await;
    let open = on_redis(&redis, TWO, FailurePolicy::FailOpen).await;
    let closed = on_redis(&redis, TWO, FailurePolicy::FailClosed).await;
    // Spend some on Redis first: the outage must not answer by stale state.
    assert!(ok(&decide(&open, vec![descriptor("a", "x", 3)]).await));
    redis.kill();
    for (hits_a, hits_b) in [(1, 1), (3, 3), (2, 0), (0, 3)] {
        let descriptors = vec![descriptor("a", "x", hits_a), descriptor("b", "x", hits_b)];
        let answer = error.decide(&request(descriptors.clone())).await;
        assert_eq!(
            answer.expect_err("unavailable").code(),
            tonic::Code::Unavailable
        );
        let granted = decide(&open, descriptors.clone()).await;
        assert!(ok(&granted), "fail open {hits_a}/{hits_b}: {granted:?}");
        let refused = decide(&closed, descriptors.clone()).await;
        let nothing_asked = hits_a == 0 && hits_b == 0;
        assert_eq!(
            ok(&refused),
            nothing_asked,
            "fail closed {hits_a}/{hits_b}: {refused:?}"
        );
    }
    let never = vec![descriptor("a", "x", 4), descriptor("b", "x", 1)];
    assert!(
        !ok(&decide(&open, never.clone()).await),
        "4 of a limit of 3"
    );
    assert!(!ok(&decide(&closed, never).await));
}

/// Under the local fallback, an outage's requests of two descriptors are all or nothing on the
/// node's own state: a refusal charges the other descriptor nothing.
#[tokio::test]
async fn the_local_fallback_is_all_or_nothing_too() {
    let mut redis = RedisServer::start();
    let server = on_redis(&redis, TWO, FailurePolicy::Local { share: 1.0 }).await;
    redis.kill();
    let mut left = [3u64, 3];
    for (step, (hits_a, hits_b)) in [(2, 1), (2, 1), (1, 2), (1, 1), (0, 1), (1, 0), (0, 1)]
        .into_iter()
        .enumerate()
    {
        let expected = hits_a <= left[0] && hits_b <= left[1];
        let answer = decide(
            &server,
            vec![descriptor("a", "x", hits_a), descriptor("b", "x", hits_b)],
        )
        .await;
        assert_eq!(
            ok(&answer),
            expected,
            "step {step}: {hits_a}/{hits_b} with {left:?} left: {answer:?}"
        );
        if expected {
            left[0] -= hits_a;
            left[1] -= hits_b;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Concurrency.

const SHARED: &str = "domain: edge
method: METHOD
descriptors:
  - key: p
    rate_limit: {unit: hour, requests_per_unit: 30}
  - key: q
    rate_limit: {unit: hour, requests_per_unit: 20}
  - key: t
    method: SEVERAL
    limits:
      - {unit: hour, requests_per_unit: 25}
      - {unit: day, requests_per_unit: 15}
";

/// Many tasks, each request a random mix of the shared limits (duplicates and several hits
/// included): summing each granted request's hits per limit, no limit grants more than it
/// allows.
async fn never_over_granted(server: RateLimitServer, label: String) {
    let granted: Arc<[AtomicU64; 3]> = Arc::new(Default::default());
    let tasks: Vec<_> = (0..8u64)
        .map(|task| {
            let server = server.clone();
            let granted = Arc::clone(&granted);
            tokio::spawn(async move {
                let mut rng = Rng(0x1234_5678_9abc_def1 ^ (task + 1).wrapping_mul(0x9e37_79b9));
                for _ in 0..40 {
                    let count = 1 + rng.below(3) as usize;
                    let mut sums = [0u64; 3];
                    let descriptors = (0..count)
                        .map(|_| {
                            let which = rng.below(3) as usize;
                            let hits = 1 + rng.below(3);
                            sums[which] += hits;
                            descriptor(["p", "q", "t"][which], "shared", hits)
                        })
                        .collect();
                    if ok(&decide(&server, descriptors).await) {
                        for (total, sum) in granted.iter().zip(sums) {
                            total.fetch_add(sum, Ordering::Relaxed);
                        }
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("no panic");
    }
    let totals: Vec<u64> = granted.iter().map(|t| t.load(Ordering::Relaxed)).collect();
    for (total, limit) in totals.iter().zip([30, 20, 15]) {
        assert!(
            *total <= limit,
            "{label}: granted {totals:?} of [30, 20, 15]"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_mixed_requests_never_over_grant_any_limit() {
    let redis = RedisServer::start();
    for method in METHODS {
        let yaml = SHARED
            .replace("METHOD", method)
            .replace("SEVERAL", several_limits_method(method));
        never_over_granted(in_process(&yaml).await, format!("{method} in process")).await;
        let remote = on_redis(&redis, &yaml, FailurePolicy::Error).await;
        never_over_granted(remote, format!("{method} on redis")).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Panics on the request path.

/// Duplicates of absurd hits (the sum overflows), hits at every bound, request-level hits,
/// descriptors without entries or with empty keys, refunds, thousands of copies of one limited
/// descriptor: answered without a panic, every method, in process and on Redis.
#[tokio::test]
async fn hostile_multi_descriptor_requests_never_panic() {
    let redis = RedisServer::start();
    for method in METHODS {
        let yaml = model_yaml(method);
        let servers = [
            in_process(&yaml).await,
            on_redis(&redis, &yaml, FailurePolicy::Error).await,
        ];
        for server in &servers {
            let huge = vec![
                descriptor("a", "x", u64::MAX),
                descriptor("a", "x", u64::MAX),
                descriptor("m", "x", u64::MAX / 2 + 1),
                descriptor("m", "x", u64::MAX / 2 + 1),
            ];
            assert!(!ok(&decide(server, huge).await), "{method}");
            let empty = RateLimitDescriptor::default();
            let mut refund = descriptor("a", "x", 1_000);
            refund.is_negative_hits = true;
            let answer = decide(
                server,
                vec![
                    empty,
                    descriptor("", "", 1),
                    refund,
                    descriptor("u", "x", u64::MAX),
                ],
            )
            .await;
            assert!(ok(&answer), "{method}: {answer:?}");
            let copies = vec![descriptor("a", "y", 0); RateLimitServer::MAX_DESCRIPTORS];
            assert!(ok(&decide(server, copies).await), "{method}");
            let mut big = request(vec![descriptor("s", "x", 1), descriptor("a", "z", 1)]);
            for d in &mut big.descriptors {
                d.hits_addend = None;
            }
            big.hits_addend = u32::MAX;
            let answer = server.decide(&big).await.expect("decided");
            assert!(!ok(&answer), "{method}: {answer:?}");
            assert_eq!(
                retry_after(&answer),
                None,
                "{method}: can never pass: {answer:?}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A look against a single decision, with real time (per-second limits, partly refilled).

fn refilling_yaml(method: &str) -> String {
    format!(
        "domain: edge
method: {method}
descriptors:
  - key: d
    rate_limit: {{unit: second, requests_per_unit: 7}}
  - key: big
    rate_limit: {{unit: hour, requests_per_unit: 1000}}
"
    )
}

/// Two clients of one history (the same takes, back to back), then the same hits asked by a
/// single decision for one and, just after, by a request of two descriptors (a look, then the
/// takings) for the other, which has had as long to refill: the look must grant whatever the
/// single decision granted, and its refusal must leave the other descriptor untouched.
async fn look_agrees_with_one_decision(
    server: RateLimitServer,
    label: String,
    seed: u64,
) -> Vec<String> {
    let mut rng = Rng(seed);
    let mut wrong = Vec::new();
    for round in 0..6 {
        let (x, y) = (format!("x{seed}-{round}"), format!("y{seed}-{round}"));
        for _ in 0..1 + rng.below(4) {
            let hits = 1 + rng.below(4);
            decide(&server, vec![descriptor("d", &x, hits)]).await;
            decide(&server, vec![descriptor("d", &y, hits)]).await;
            tokio::time::sleep(Duration::from_millis(rng.below(350))).await;
        }
        let hits = 1 + rng.below(7);
        let single = decide(&server, vec![descriptor("d", &y, hits)]).await;
        let look = decide(
            &server,
            vec![descriptor("big", &x, 1), descriptor("d", &x, hits)],
        )
        .await;
        if ok(&single) && !ok(&look) {
            wrong.push(format!(
                "{label} round {round}: {hits} granted alone, refused beside another: {look:?}"
            ));
        }
        if !ok(&look) && look.statuses[0].limit_remaining != 1000 {
            wrong.push(format!(
                "{label} round {round}: a refusal charged `big`: {look:?}"
            ));
        }
    }
    wrong
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_look_grants_what_a_single_decision_grants_as_limits_refill() {
    let redis = RedisServer::start();
    let mut runs = Vec::new();
    for (index, method) in METHODS.into_iter().enumerate() {
        let local = in_process(&refilling_yaml(method)).await;
        let remote = on_redis(&redis, &refilling_yaml(method), FailurePolicy::Error).await;
        for task in 0..6u64 {
            let seed = 0x5851_f42d_4c95_7f2d ^ ((index as u64) << 8 | task);
            runs.push(tokio::spawn(look_agrees_with_one_decision(
                local.clone(),
                format!("{method} in process"),
                seed,
            )));
            runs.push(tokio::spawn(look_agrees_with_one_decision(
                remote.clone(),
                format!("{method} on redis"),
                seed.rotate_left(17),
            )));
        }
    }
    let mut wrong = Vec::new();
    for run in runs {
        wrong.extend(run.await.expect("no panic"));
    }
    assert!(
        wrong.is_empty(),
        "{} wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// One request of many descriptors (a gRPC message of a few megabytes holds hundreds of
/// thousands): its work grows with the square of its descriptors, so the service bounds them
/// (`RateLimitServer::MAX_DESCRIPTORS`) and refuses a larger request as invalid, naming the bound.
#[tokio::test]
async fn a_request_of_too_many_descriptors_is_refused_as_invalid() {
    let server = in_process(
        "domain: edge
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 1000000}
",
    )
    .await;
    let most = RateLimitServer::MAX_DESCRIPTORS;
    let descriptors = |count: usize| -> Vec<_> {
        (0..count)
            .map(|i| descriptor("k", &i.to_string(), 1))
            .collect()
    };
    assert!(ok(&decide(&server, descriptors(most)).await));
    for count in [most + 1, 40_000] {
        let error = server
            .decide(&request(descriptors(count)))
            .await
            .expect_err("too many descriptors");
        assert_eq!(error.code(), tonic::Code::InvalidArgument);
        assert!(
            error.message().contains(&most.to_string()),
            "{}",
            error.message()
        );
    }
}

/// A configuration of several limits under the sliding window log means the same on both
/// stores: a configuration mistake, named by place (in process a log cannot give back a claimed
/// slot, so it cannot enforce several limits together).
#[test]
fn several_limits_under_the_sliding_log_are_refused_alike_for_both_stores() {
    let yaml = "domain: edge
method: sliding_window_log
descriptors:
  - key: m
    limits:
      - {unit: second, requests_per_unit: 5}
      - {unit: hour, requests_per_unit: 100}
";
    let error = tollgate::envoy::RlsConfig::from_yaml_str("test.yaml", yaml)
        .expect_err("refused before any store is chosen");
    assert!(
        error.place().ends_with("descriptors[0] (m): limits"),
        "{error}"
    );
}
