//! Review: attacks on the limits that requests' descriptors bring (`RateLimitDescriptor.limit`),
//! through the service's public API only (`RateLimitServer::decide`, `reload`).
//!
//! Each test names the promise it tries to break: the bullet "A descriptor's own limit" of
//! `tollgate::envoy`, the module docs of `src/envoy/overrides.rs` (as they surface in
//! `RateLimitServer::MAX_BROUGHT_LIMITS`), and `RateLimitServer::decide` (all or nothing across
//! descriptors, refunds with `is_negative_hits`, give-backs on Redis, "no limit ever grants
//! more than it allows").
//!
//! Two tests failed on the commit reviewed (6a4efcb); both pass now (a refund on Redis makes
//! its brought limit's limiter; a request's limiters are made all or none, after all its limits
//! were read):
//!
//! - `on_redis_a_refund_reaches_a_brought_limit_another_instance_charged`: on Redis, a refund
//!   of a brought limit is dropped by an instance that has not yet decided a request bringing
//!   that limit (it only looks its limiter up), although the state it should reach is shared on
//!   Redis and another instance charged it. A configured descriptor's refund does reach it.
//! - `a_request_that_is_not_decided_takes_no_room_among_the_brought_limits`: a request refused
//!   whole (`RESOURCE_EXHAUSTED`, `INVALID_ARGUMENT`) still makes limiters for its other
//!   descriptors' limits, which count against `MAX_BROUGHT_LIMITS` for the service's life; one
//!   request of 65 new limits fills the table. Surprising rather than contrary to the docs.

mod redis_support;
mod rls_support;

use std::collections::HashSet;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use redis_support::RedisServer;
use rls_support::{bringing, descriptor, refund, with_hits};
use tollgate::envoy::proto::rate_limit_response::Code;
use tollgate::envoy::proto::{RateLimitRequest, RateLimitResponse};
use tollgate::envoy::{RateLimitServer, RlsConfig, StateStore};
use tollgate::redis::FailurePolicy;

// ---------------------------------------------------------------------------------------------
// Helpers.

/// envoy.type.v3.RateLimitUnit's numbers.
const SECOND: i32 = 1;
const MINUTE: i32 = 2;
const HOUR: i32 = 3;
/// Every unit, with its name in messages and its length in seconds.
const UNITS: [(i32, &str, u64); 7] = [
    (1, "second", 1),
    (2, "minute", 60),
    (3, "hour", 3_600),
    (4, "day", 86_400),
    (5, "month", 30 * 86_400),
    (6, "year", 365 * 86_400),
    (7, "week", 7 * 86_400),
];

const METHODS: [&str; 4] = [
    "fixed_window",
    "token_bucket",
    "sliding_window_log",
    "sliding_window_counter",
];

fn config(yaml: &str) -> RlsConfig {
    RlsConfig::from_yaml_str("review.yaml", yaml).expect("the configuration is valid")
}

async fn server_on(yaml: &str, store: StateStore) -> RateLimitServer {
    RateLimitServer::new(&config(yaml), store)
        .await
        .expect("the service builds")
}

async fn in_process(yaml: &str) -> RateLimitServer {
    server_on(yaml, StateStore::InProcess { clients: 1024 }).await
}

fn redis_store(redis: &RedisServer) -> StateStore {
    StateStore::Redis {
        url: redis.url(),
        policy: FailurePolicy::Error,
        timeout: Duration::from_secs(5),
    }
}

/// A domain `edge` of `method` and no configured descriptor.
fn bare(method: &str) -> String {
    format!("domain: edge\nmethod: {method}\ndescriptors: []\n")
}

fn request(domain: &str, descriptors: &[RateLimitDescriptor]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors.to_vec(),
        hits_addend: 0,
    }
}

async fn try_decide(
    server: &RateLimitServer,
    descriptors: &[RateLimitDescriptor],
) -> Result<RateLimitResponse, tonic::Status> {
    server.decide(&request("edge", descriptors)).await
}

async fn decide(
    server: &RateLimitServer,
    descriptors: &[RateLimitDescriptor],
) -> RateLimitResponse {
    try_decide(server, descriptors)
        .await
        .unwrap_or_else(|status| panic!("decided, not {status:?}"))
}

fn ok(response: &RateLimitResponse) -> bool {
    response.overall_code == Code::Ok as i32
}

async fn oks(server: &RateLimitServer, descriptors: &[RateLimitDescriptor], times: usize) -> usize {
    let mut granted = 0;
    for _ in 0..times {
        if ok(&decide(server, descriptors).await) {
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

/// `threads` OS threads, released together, each deciding `each` requests made by
/// `make(thread, i)` on a runtime of its own (in process only: a decision there never awaits).
/// Each request with what it was answered.
fn race(
    server: &RateLimitServer,
    threads: usize,
    each: usize,
    make: impl Fn(usize, usize) -> Vec<RateLimitDescriptor> + Sync,
) -> Vec<(usize, usize, Result<RateLimitResponse, tonic::Status>)> {
    let barrier = Barrier::new(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                let server = server.clone();
                let barrier = &barrier;
                let make = &make;
                scope.spawn(move || {
                    let runtime = rls_support::runtime();
                    let requests: Vec<_> = (0..each).map(|i| make(thread, i)).collect();
                    barrier.wait();
                    requests
                        .into_iter()
                        .enumerate()
                        .map(|(i, descriptors)| {
                            let answer = runtime.block_on(try_decide(&server, &descriptors));
                            (thread, i, answer)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|handle| handle.join().expect("no thread panicked"))
            .collect()
    })
}

/// As [`race`], on tokio tasks of the current (multi-threaded) runtime: for Redis, whose
/// connections live on it.
async fn race_tasks(
    servers: &[RateLimitServer],
    tasks: usize,
    each: usize,
    make: impl Fn(usize, usize) -> Vec<RateLimitDescriptor> + Send + Sync + 'static,
) -> Vec<(usize, usize, Result<RateLimitResponse, tonic::Status>)> {
    let make = Arc::new(make);
    let barrier = Arc::new(tokio::sync::Barrier::new(tasks));
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let server = servers[task % servers.len()].clone();
            let make = Arc::clone(&make);
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                let mut answers = Vec::with_capacity(each);
                for i in 0..each {
                    let descriptors = make(task, i);
                    let answer = try_decide(&server, &descriptors).await;
                    answers.push((task, i, answer));
                    tokio::task::yield_now().await;
                }
                answers
            })
        })
        .collect();
    let mut all = Vec::new();
    for handle in handles {
        all.extend(handle.await.expect("no task panicked"));
    }
    all
}

fn granted(answers: &[(usize, usize, Result<RateLimitResponse, tonic::Status>)]) -> usize {
    answers
        .iter()
        .filter(|(_, _, answer)| {
            ok(answer
                .as_ref()
                .unwrap_or_else(|status| panic!("decided, not {status:?}")))
        })
        .count()
}

// ---------------------------------------------------------------------------------------------
// One limit, one limiter, never more than its requests per unit.

/// "Each distinct limit gets a limiter of its own on its first request": threads racing on the
/// first requests of one limit must not each make one (which would split its count and grant a
/// multiple of it).
#[test]
fn racing_first_requests_of_one_limit_share_one_limiter() {
    let runtime = rls_support::runtime();
    for method in METHODS {
        for round in 0..4 {
            let server = runtime.block_on(in_process(&bare(method)));
            let answers = race(&server, 8, 6, |_, _| {
                vec![bringing(&[("user", "ann")], 10, HOUR)]
            });
            assert_eq!(
                granted(&answers),
                10,
                "{method} round {round}: a limit of 10 per hour, 48 racing requests"
            );
        }
    }
}

/// `MAX_BROUGHT_LIMITS` "over the service's life": racing first requests of 96 distinct limits
/// make exactly 64 limiters; the others are `RESOURCE_EXHAUSTED` naming the descriptor and the
/// bound, and stay so; the 64 made keep deciding.
#[test]
fn racing_first_requests_never_make_more_than_the_most_limits() {
    let runtime = rls_support::runtime();
    let most = RateLimitServer::MAX_BROUGHT_LIMITS;
    let server = runtime.block_on(in_process(&bare("fixed_window")));
    // Each thread brings its own limit (thread + 1 per hour) at index 1, after a configured-less
    // unlimited descriptor.
    let answers = race(&server, 96, 1, |thread, _| {
        vec![
            descriptor(&[("free", "x")]),
            bringing(&[("user", "ann")], thread as u32 + 1, HOUR),
        ]
    });
    let mut made = HashSet::new();
    let mut exhausted = HashSet::new();
    for (thread, _, answer) in &answers {
        match answer {
            Ok(response) => {
                assert!(
                    ok(response),
                    "the first request of a limit of {} is granted",
                    thread + 1
                );
                made.insert(*thread as u32 + 1);
            }
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
                let message = status.message();
                assert!(
                    message.contains("descriptor 1")
                        && message.contains(&format!("({} per hour)", thread + 1))
                        && message.contains(&most.to_string()),
                    "the message names the descriptor, its limit and the bound: {message}"
                );
                exhausted.insert(*thread as u32 + 1);
            }
        }
    }
    assert_eq!(
        made.len(),
        most,
        "limiters made by 96 racing first requests"
    );
    assert_eq!(exhausted.len(), 96 - most);
    runtime.block_on(async {
        for requests_per_unit in 1..=96u32 {
            let again = [bringing(&[("user", "bob")], requests_per_unit, HOUR)];
            let answer = try_decide(&server, &again).await;
            if made.contains(&requests_per_unit) {
                assert!(
                    ok(&answer.expect("decided")),
                    "{requests_per_unit}: made, it decides"
                );
            } else {
                assert_eq!(
                    answer.expect_err("still one too many").code(),
                    tonic::Code::ResourceExhausted
                );
            }
        }
    });
}

/// The bound is over all domains and methods: 32 limits in one domain, 32 in another, then one
/// more anywhere (a third domain, or an old limit under a method a reload gave the domain) is
/// refused; a request refused so charges its configured descriptor nothing.
#[tokio::test]
async fn the_bound_counts_every_domain_and_method() {
    let yaml = "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n---\ndomain: b\ndescriptors: []\n---\ndomain: c\ndescriptors: []\n";
    let server = in_process(yaml).await;
    for (domain, from) in [("a", 1u32), ("b", 33)] {
        for requests_per_unit in from..from + 32 {
            let answer = server
                .decide(&request(
                    domain,
                    &[bringing(&[("u", "x")], requests_per_unit, HOUR)],
                ))
                .await
                .expect("within the bound");
            assert!(ok(&answer));
        }
    }
    let one_more = server
        .decide(&request("c", &[bringing(&[("u", "x")], 1, HOUR)]))
        .await
        .expect_err("the 65th limit, in a third domain");
    assert_eq!(one_more.code(), tonic::Code::ResourceExhausted);
    // Domain a under another method: its old limits are new ones.
    let changed = yaml.replacen("domain: a\n", "domain: a\nmethod: token_bucket\n", 1);
    server.reload(&config(&changed)).await.expect("reloads");
    let configured = descriptor(&[("k", "v")]);
    let error = server
        .decide(&request(
            "a",
            &[configured.clone(), bringing(&[("u", "x")], 1, HOUR)],
        ))
        .await
        .expect_err("the same limit under another method is one more");
    assert_eq!(error.code(), tonic::Code::ResourceExhausted);
    assert!(
        error.message().contains("descriptor 1"),
        "{}",
        error.message()
    );
    // Refused whole: the configured descriptor still has both its permits.
    let mut left = 0;
    for _ in 0..3 {
        if ok(&server
            .decide(&request("a", std::slice::from_ref(&configured)))
            .await
            .unwrap())
        {
            left += 1;
        }
    }
    assert_eq!(
        left, 2,
        "the refused request charged its configured descriptor"
    );
}

/// Requests of an unknown domain make no limiter ("any descriptor of a known domain").
#[tokio::test]
async fn requests_of_unknown_domains_make_no_limiters() {
    let server = in_process(&bare("fixed_window")).await;
    for requests_per_unit in 1..=100u32 {
        let answer = server
            .decide(&request(
                "nowhere",
                &[bringing(&[("u", "x")], requests_per_unit, HOUR)],
            ))
            .await
            .expect("an unknown domain limits nothing");
        assert!(ok(&answer));
    }
    let most = RateLimitServer::MAX_BROUGHT_LIMITS as u32;
    for requests_per_unit in 1..=most {
        let brought = [bringing(&[("u", "x")], requests_per_unit, MINUTE)];
        assert!(ok(&decide(&server, &brought).await), "{requests_per_unit}");
    }
}

/// A request that is not decided (refused whole as `RESOURCE_EXHAUSTED` or `INVALID_ARGUMENT`)
/// still makes limiters for its other descriptors, which then count against
/// `MAX_BROUGHT_LIMITS` for the service's life: one request of 65 descriptors, each bringing a
/// limit never seen, is refused and yet fills the table, so that every later request bringing
/// any new limit is `RESOURCE_EXHAUSTED` though no decided request ever brought one. The docs
/// say a request bringing one more is refused "never decided by a limit it did not ask for",
/// and that each limit gets a limiter "on its first request"; they do not say that a refused
/// request's limits take room. (Reported as surprising rather than as a broken promise.)
#[tokio::test]
async fn a_request_that_is_not_decided_takes_no_room_among_the_brought_limits() {
    let most = RateLimitServer::MAX_BROUGHT_LIMITS as u32;
    // One request, 65 new limits.
    let server = in_process(&bare("fixed_window")).await;
    let flood: Vec<_> = (1..=most + 1)
        .map(|requests_per_unit| bringing(&[("u", "x")], requests_per_unit, HOUR))
        .collect();
    let error = try_decide(&server, &flood)
        .await
        .expect_err("65 new limits");
    assert_eq!(error.code(), tonic::Code::ResourceExhausted);
    assert!(
        error.message().contains("descriptor 64"),
        "{}",
        error.message()
    );
    let first = try_decide(&server, &[bringing(&[("u", "x")], 1_000, HOUR)]).await;
    // A bad unit beside a new limit.
    let server = in_process(&bare("fixed_window")).await;
    for requests_per_unit in 1..most {
        assert!(ok(&decide(
            &server,
            &[bringing(&[("u", "x")], requests_per_unit, HOUR)]
        )
        .await));
    }
    let error = try_decide(
        &server,
        &[
            bringing(&[("u", "x")], most, HOUR),
            bringing(&[("u", "y")], 1, 42),
        ],
    )
    .await
    .expect_err("unit 42 is none");
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    assert!(
        error.message().contains("descriptor 1"),
        "{}",
        error.message()
    );
    let second = try_decide(&server, &[bringing(&[("u", "x")], most + 1, HOUR)]).await;
    assert!(
        first.is_ok() && second.is_ok(),
        "after a refused request of 65 new limits, the first limit a decided request brings: \
         {:?}; after 63 decided and a refused request with a bad unit, the 64th: {:?}",
        first.err(),
        second.err()
    );
}

// ---------------------------------------------------------------------------------------------
// All or nothing.

/// Descriptors of fillers in a request: each of its own client, one permit, so that a refused
/// request has many grants to give back and the racing window between the refusing
/// descriptor's look and its taking is long (its taking comes after all of theirs).
const FILLERS: usize = 100;

/// All or nothing under races, the brought limit refusing: each request carries a configured
/// descriptor of its own (one permit, never touched by another request), 100 configured fillers
/// of its own, and last a brought limit shared by all (taken last: the fillers and its own have
/// no slack left, and under the sliding log it is taken last anyway). A refused request must
/// charge its own descriptor and fillers nothing, whichever method the brought limit has (they
/// are under the token bucket, given back exactly while no other decision lands on them).
#[test]
fn racing_on_a_shared_brought_limit_a_refused_request_charges_its_own_descriptors_nothing() {
    let runtime = rls_support::runtime();
    for method in METHODS {
        let yaml = format!(
            "domain: edge\nmethod: {method}\ndescriptors:\n  - key: own\n    method: token_bucket\n    rate_limit: {{unit: hour, requests_per_unit: 1}}\n  - key: filler\n    method: token_bucket\n    rate_limit: {{unit: hour, requests_per_unit: 1}}\n"
        );
        let server = runtime.block_on(server_on(&yaml, StateStore::InProcess { clients: 16_384 }));
        for round in 0..3 {
            let answers = race(&server, 8, 12, |thread, i| {
                let mut descriptors =
                    vec![descriptor(&[("own", &format!("{round}-{thread}-{i}"))])];
                descriptors.extend(
                    (0..FILLERS)
                        .map(|k| descriptor(&[("filler", &format!("{round}-{thread}-{i}-{k}"))])),
                );
                descriptors.push(bringing(
                    &[("tenant", &format!("shared-{round}"))],
                    10,
                    HOUR,
                ));
                descriptors
            });
            assert_eq!(granted(&answers), 10, "{method}: the shared limit of 10");
            runtime.block_on(async {
            for (thread, i, answer) in &answers {
                let was_granted = ok(answer.as_ref().unwrap());
                let own = [descriptor(&[("own", &format!("{round}-{thread}-{i}"))])];
                let left = oks(&server, &own, 2).await;
                assert_eq!(
                    left,
                    usize::from(!was_granted),
                    "{method}: request {thread}-{i} (granted: {was_granted}) left its own descriptor {left}"
                );
                let filler =
                    [descriptor(&[("filler", &format!("{round}-{thread}-{i}-{}", FILLERS / 2))])];
                let left = oks(&server, &filler, 2).await;
                assert_eq!(
                    left,
                    usize::from(!was_granted),
                    "{method}: request {thread}-{i} (granted: {was_granted}) left a filler {left}"
                );
            }
        });
        }
    }
}

/// The other way round: each request brings a limit of its own (1 per hour) and 100 brought
/// fillers of its own, under the domain's method, beside a configured descriptor shared by all
/// (under the sliding log: taken last). A refused request must leave its brought limits whole.
/// Not under a domain of the sliding log: its brought limits would be sliding-log descriptors
/// beside the shared one, whose grants the docs say may be kept.
#[test]
fn racing_on_a_shared_configured_limit_a_refused_request_gives_its_brought_grants_back() {
    let runtime = rls_support::runtime();
    for method in ["fixed_window", "token_bucket", "sliding_window_counter"] {
        let yaml = format!(
            "domain: edge\nmethod: {method}\ndescriptors:\n  - key: shared\n    method: sliding_window_log\n    rate_limit: {{unit: hour, requests_per_unit: 10}}\n"
        );
        let server = runtime.block_on(server_on(&yaml, StateStore::InProcess { clients: 16_384 }));
        for round in 0..3 {
            let own = |thread: usize, i: usize| {
                bringing(&[("user", &format!("{round}-{thread}-{i}"))], 1, HOUR)
            };
            let filler = |thread: usize, i: usize, k: usize| {
                bringing(
                    &[("filler", &format!("{round}-{thread}-{i}-{k}"))],
                    1,
                    MINUTE,
                )
            };
            let answers = race(&server, 8, 12, |thread, i| {
                let mut descriptors = vec![
                    descriptor(&[("shared", &format!("s{round}"))]),
                    own(thread, i),
                ];
                descriptors.extend((0..FILLERS).map(|k| filler(thread, i, k)));
                descriptors
            });
            assert_eq!(granted(&answers), 10, "{method}: the shared limit of 10");
            runtime.block_on(async {
            for (thread, i, answer) in &answers {
                let was_granted = ok(answer.as_ref().unwrap());
                let left = oks(&server, &[own(*thread, *i)], 2).await;
                assert_eq!(
                    left,
                    usize::from(!was_granted),
                    "{method}: request {thread}-{i} (granted: {was_granted}) left its brought limit {left}"
                );
                let left = oks(&server, &[filler(*thread, *i, FILLERS / 2)], 2).await;
                assert_eq!(
                    left,
                    usize::from(!was_granted),
                    "{method}: request {thread}-{i} (granted: {was_granted}) left a brought filler {left}"
                );
            }
        });
        }
    }
}

/// The same brought limit sent twice in one request: the request asks both, and a request the
/// sum refuses is charged nothing.
#[tokio::test]
async fn a_brought_limit_sent_twice_is_asked_for_both() {
    for method in METHODS {
        let server = in_process(&bare(method)).await;
        let b = || bringing(&[("user", "ann")], 3, HOUR);
        let twice = [with_hits(b(), 2), with_hits(b(), 2)];
        let answer = decide(&server, &twice).await;
        assert!(!ok(&answer), "{method}: 2 + 2 of a limit of 3");
        assert_eq!(
            header(&answer, "retry-after"),
            None,
            "{method}: asking more than the limit is never passed: no Retry-After"
        );
        assert_eq!(
            oks(&server, &[with_hits(b(), 3)], 2).await,
            1,
            "{method}: the refused request charged the limit"
        );
        // And a request of 1 + 1 against one permit left elsewhere.
        let c = || bringing(&[("user", "bob")], 3, HOUR);
        assert!(ok(&decide(&server, &[with_hits(c(), 2)]).await));
        assert!(
            !ok(&decide(&server, &[c(), c()]).await),
            "{method}: 1 + 1 > 1 left"
        );
        assert_eq!(oks(&server, &[c()], 2).await, 1, "{method}");
    }
}

/// The same brought limit sent twice, racing: never more permits than the limit, and under the
/// fixed window (whose give-back takes its permits off the window) every permit not granted is
/// still there.
#[test]
fn racing_requests_bringing_one_limit_twice_never_exceed_it() {
    let runtime = rls_support::runtime();
    for method in METHODS {
        let server = runtime.block_on(in_process(&bare(method)));
        let b = || bringing(&[("user", "ann")], 41, HOUR);
        let answers = race(&server, 8, 10, |_, _| vec![b(), b()]);
        let pairs = granted(&answers);
        assert!(
            pairs * 2 <= 41,
            "{method}: {pairs} pairs granted of a limit of 41"
        );
        let left = runtime.block_on(oks(&server, &[b()], 45));
        assert!(
            pairs * 2 + left <= 41,
            "{method}: {pairs} pairs, then {left} more"
        );
        if method == "fixed_window" || method == "sliding_window_counter" {
            assert_eq!(pairs * 2 + left, 41, "{method}: permits lost to give-backs");
        }
    }
}

/// A brought limit and a configured one of the same entries in one request: both apply, all or
/// nothing.
#[tokio::test]
async fn a_brought_and_a_configured_limit_of_the_same_entries_both_apply() {
    let server = in_process(
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 3}\n",
    )
    .await;
    let e1 = [("remote_address", "10.0.0.1")];
    // The configured one binds: 3 of 5; the brought one was charged those 3 only.
    let both = [descriptor(&e1), bringing(&e1, 5, HOUR)];
    assert_eq!(oks(&server, &both, 5).await, 3);
    assert_eq!(oks(&server, &[bringing(&e1, 5, HOUR)], 5).await, 2);
    // The brought one binds: 1 of 3; the configured one was charged that one only.
    let e2 = [("remote_address", "10.0.0.2")];
    let both = [bringing(&e2, 1, HOUR), descriptor(&e2)];
    assert_eq!(oks(&server, &both, 3).await, 1);
    assert_eq!(oks(&server, &[descriptor(&e2)], 5).await, 2);
}

/// A brought limit beside a shadowed configured descriptor: the brought one refuses; the
/// shadowed one is charged only by the granted request (a refused request is charged to none of
/// its descriptors).
#[tokio::test]
async fn a_request_refused_by_its_brought_limit_charges_a_shadowed_descriptor_nothing() {
    let server = in_process(
        "domain: edge\ndescriptors:\n  - key: path\n    shadow_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 5}\n",
    )
    .await;
    let shadowed = descriptor(&[("path", "/a")]);
    let request = [shadowed.clone(), bringing(&[("user", "ann")], 1, HOUR)];
    assert_eq!(oks(&server, &request, 3).await, 1);
    let alone = decide(&server, &[shadowed]).await;
    assert_eq!(
        alone.statuses[0].limit_remaining, 3,
        "5 less the granted request and this one"
    );
}

/// `replaces` goes with the configured limit a brought one displaces, and a brought limit (which
/// has no name) is never replaced, as envoyproxy/ratelimit has it.
#[tokio::test]
async fn replaces_goes_with_the_configured_limit_a_brought_one_displaces() {
    let yaml = "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1, name: na}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 10, replaces: [{name: na}]}\n";
    let server = in_process(yaml).await;
    // Configured: b replaces a, so 3 of 3.
    assert_eq!(
        oks(
            &server,
            &[descriptor(&[("a", "1")]), descriptor(&[("b", "1")])],
            3
        )
        .await,
        3
    );
    // b brings its own limit: its `replaces` is gone with its configured limit; a applies.
    let request = [descriptor(&[("a", "2")]), bringing(&[("b", "2")], 10, HOUR)];
    assert_eq!(oks(&server, &request, 3).await, 1);
    // a brings its own limit: b's `replaces` does not drop it.
    let request = [bringing(&[("a", "3")], 2, HOUR), descriptor(&[("b", "3")])];
    assert_eq!(oks(&server, &request, 4).await, 2);
}

/// A brought limit of 0 beside a configured descriptor: refused, and the configured one charged
/// nothing; no Retry-After.
#[tokio::test]
async fn a_brought_limit_of_zero_refuses_the_whole_request_and_charges_nothing() {
    for method in METHODS {
        let yaml = format!(
            "domain: edge\nmethod: {method}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: 2}}\n"
        );
        let server = in_process(&yaml).await;
        let request = [
            descriptor(&[("k", "v")]),
            bringing(&[("u", "x")], 0, SECOND),
        ];
        for _ in 0..3 {
            let answer = decide(&server, &request).await;
            assert!(!ok(&answer), "{method}");
            assert_eq!(header(&answer, "retry-after"), None, "{method}");
            assert_eq!(answer.statuses[1].code, Code::OverLimit as i32);
        }
        assert_eq!(
            oks(&server, &[descriptor(&[("k", "v")])], 3).await,
            2,
            "{method}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Hits.

/// Absurd hits: u64::MAX, sums that overflow, the request's u32::MAX; none panics, a request
/// asking more than the limit is refused without Retry-After and charges nothing.
#[tokio::test]
async fn huge_hits_neither_panic_nor_charge() {
    for method in METHODS {
        let server = in_process(&bare(method)).await;
        let b = || bringing(&[("user", "ann")], 3, HOUR);
        let answer = decide(&server, &[with_hits(b(), u64::MAX)]).await;
        assert!(!ok(&answer), "{method}");
        assert_eq!(header(&answer, "retry-after"), None, "{method}");
        let half = u64::MAX / 2 + 1;
        assert!(!ok(&decide(
            &server,
            &[with_hits(b(), half), with_hits(b(), half)]
        )
        .await));
        let answer = server
            .decide(&RateLimitRequest {
                domain: "edge".into(),
                descriptors: vec![b()],
                hits_addend: u32::MAX,
            })
            .await
            .expect("decided");
        assert!(!ok(&answer), "{method}");
        assert_eq!(
            oks(&server, &[with_hits(b(), 3)], 2).await,
            1,
            "{method}: a refused absurd request charged the limit"
        );
    }
}

/// The largest limit asked whole by the request's own hits (u32::MAX of u32::MAX): granted once
/// under the fixed window (which holds any limit), then refused.
#[tokio::test]
async fn the_largest_limit_is_granted_whole_once() {
    let server = in_process(&bare("fixed_window")).await;
    let whole = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![bringing(&[("user", "ann")], u32::MAX, HOUR)],
        hits_addend: u32::MAX,
    };
    assert!(ok(&server.decide(&whole).await.unwrap()));
    let answer = server.decide(&whole).await.unwrap();
    assert!(!ok(&answer));
    assert_eq!(answer.statuses[0].limit_remaining, 0);
    let one = [bringing(&[("user", "ann")], u32::MAX, HOUR)];
    assert!(
        !ok(&decide(&server, &one).await),
        "nothing left after u32::MAX of u32::MAX"
    );
}

/// Hits of 0 ask nothing: answered OK, spent limit or not, alone or beside another descriptor,
/// and charge nothing.
#[tokio::test]
async fn zero_hits_ask_nothing() {
    for method in METHODS {
        let server = in_process(&bare(method)).await;
        let b = || bringing(&[("user", "ann")], 2, HOUR);
        let other = || bringing(&[("user", "bob")], 2, HOUR);
        assert!(ok(&decide(&server, &[with_hits(b(), 0)]).await), "{method}");
        assert!(
            ok(&decide(&server, &[with_hits(b(), 0), other()]).await),
            "{method}"
        );
        assert_eq!(
            oks(&server, &[b()], 3).await,
            2,
            "{method}: zero hits charged"
        );
        let alone = decide(&server, &[with_hits(b(), 0)]).await;
        assert!(
            ok(&alone),
            "{method}: 0 hits of a spent limit, alone: {alone:?}"
        );
        let beside = decide(&server, &[with_hits(b(), 0), other()]).await;
        assert!(
            ok(&beside),
            "{method}: 0 hits of a spent limit, beside another: {beside:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Units and bounds.

/// Every unit under every method, with the smallest and the largest limit: decided by exactly
/// that limit (the answer names it), or `INVALID_ARGUMENT` naming the descriptor and the limit
/// (and then charging the request's other descriptor nothing); never a panic.
#[tokio::test]
async fn every_unit_and_the_largest_limit_decide_or_name_the_descriptor() {
    for method in METHODS {
        let yaml = format!(
            "domain: edge\nmethod: {method}\ndescriptors:\n  - key: k\n    method: fixed_window\n    rate_limit: {{unit: hour, requests_per_unit: 1000}}\n"
        );
        let server = in_process(&yaml).await;
        let mut refused = 0;
        for (unit, name, _) in UNITS {
            for requests_per_unit in [1, 2, 7, 1000, u32::MAX] {
                let entries = [("user", "ann")];
                let request = [
                    descriptor(&[("k", "v")]),
                    bringing(&entries, requests_per_unit, unit),
                ];
                match try_decide(&server, &request).await {
                    Ok(answer) => {
                        assert!(ok(&answer), "{method} {requests_per_unit}/{name}");
                        let current = answer.statuses[1].current_limit.clone().unwrap();
                        assert_eq!(
                            (current.requests_per_unit, current.unit),
                            (requests_per_unit, unit),
                            "{method}: the answer names the brought limit"
                        );
                        assert_eq!(
                            u64::from(answer.statuses[1].limit_remaining),
                            u64::from(requests_per_unit) - 1,
                            "{method} {requests_per_unit}/{name}"
                        );
                        if requests_per_unit == 1 {
                            let answer = decide(&server, &request[1..]).await;
                            assert!(!ok(&answer), "{method} 1/{name}: one only");
                        }
                    }
                    Err(status) => {
                        refused += 1;
                        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
                        let message = status.message();
                        assert!(
                            message.contains("descriptor 1")
                                && message.contains(&format!("({requests_per_unit} per {name})")),
                            "{method}: {message}"
                        );
                        assert!(
                            requests_per_unit > 1000,
                            "{method}: {requests_per_unit} per {name} refused: {message}"
                        );
                    }
                }
            }
        }
        // Every granted request took one permit of `k`; every refused one none.
        let granted = (UNITS.len() * 5 - refused) as u32;
        let answer = decide(&server, &[descriptor(&[("k", "v")])]).await;
        assert_eq!(
            answer.statuses[0].limit_remaining,
            1000 - granted - 1,
            "{method}: {refused} refused requests"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Refunds.

/// Refunds never leave a brought limit more generous than its limit, however large; they reach
/// only the brought limit of their entries, not the configured one of the same entries (nor
/// the other way round).
#[tokio::test]
async fn refunds_of_a_brought_limit_never_exceed_it_nor_cross_to_the_configured_one() {
    for method in METHODS {
        let yaml = format!(
            "domain: edge\nmethod: {method}\ndescriptors:\n  - key: user\n    rate_limit: {{unit: hour, requests_per_unit: 2}}\n"
        );
        let server = in_process(&yaml).await;
        let entries = [("user", "ann")];
        let b = || bringing(&entries, 3, HOUR);
        // A huge refund after one permit was taken gives back that one at most (none under the
        // sliding log, whose slots record admissions).
        decide(&server, &[b()]).await;
        decide(&server, &[refund(b(), u64::MAX)]).await;
        let most = if method == "sliding_window_log" { 2 } else { 3 };
        assert_eq!(
            oks(&server, &[b()], 5).await,
            most,
            "{method}: after a refund of the one"
        );
        // Spent, then a huge refund: never more than the limit.
        decide(&server, &[refund(b(), u64::MAX)]).await;
        let after = oks(&server, &[b()], 5).await;
        let most = if method == "sliding_window_log" { 0 } else { 3 };
        assert!(
            after <= most,
            "{method}: {after} granted after a huge refund"
        );
        // The configured limit of the same entries: spent, then a refund of the brought one and
        // a refund of the configured one.
        assert_eq!(
            oks(&server, &[descriptor(&entries)], 3).await,
            2,
            "{method}"
        );
        decide(&server, &[refund(b(), 5)]).await;
        assert_eq!(
            oks(&server, &[descriptor(&entries)], 1).await,
            0,
            "{method}: the brought limit's refund reached the configured one"
        );
        let spent = oks(&server, &[b()], 5).await;
        decide(&server, &[refund(descriptor(&entries), 5)]).await;
        assert_eq!(
            oks(&server, &[b()], 5).await,
            0,
            "{method}: the configured refund reached the brought one (spent {spent})"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Reloads.

/// Reloads racing the requests of a brought limit (including its first ones): the limit is
/// neither reset nor split, whatever the reloads change elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reloads_racing_a_brought_limit_neither_reset_nor_split_it() {
    let first = "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";
    let second = "domain: edge\ndescriptors:\n  - key: other\n    rate_limit: {unit: minute, requests_per_unit: 7}\n---\ndomain: more\ndescriptors: []\n";
    let server = in_process(first).await;
    let configs = [config(first), config(second)];
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reloads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let reloader = {
        let server = server.clone();
        let stop = Arc::clone(&stop);
        let reloads = Arc::clone(&reloads);
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let done = reloads.load(std::sync::atomic::Ordering::Relaxed);
                server.reload(&configs[done % 2]).await.expect("reloads");
                reloads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
        })
    };
    // The deciders start once reloads run, and leave them room between requests.
    while reloads.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let server = server.clone();
            tokio::spawn(async move {
                let mut answers = Vec::new();
                for i in 0..12 {
                    let b = [bringing(&[("user", "ann")], 30, HOUR)];
                    answers.push((0, i, try_decide(&server, &b).await));
                    tokio::time::sleep(Duration::from_micros(300)).await;
                }
                answers
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.extend(task.await.expect("no panic"));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    reloader.await.expect("no panic");
    let reloads = reloads.load(std::sync::atomic::Ordering::Relaxed);
    assert!(reloads > 2, "reloads ran: {reloads}");
    assert_eq!(granted(&answers), 30);
}

/// A reload that drops the domain and one that brings it back: the brought limit kept its
/// state ("kept across reloads").
#[tokio::test]
async fn a_brought_limit_survives_its_domain_leaving_and_coming_back() {
    let yaml = bare("token_bucket");
    let server = in_process(&yaml).await;
    let b = [bringing(&[("user", "ann")], 3, HOUR)];
    assert_eq!(oks(&server, &b, 2).await, 2);
    server
        .reload(&config("domain: other\ndescriptors: []\n"))
        .await
        .unwrap();
    assert_eq!(
        oks(&server, &b, 5).await,
        5,
        "an unknown domain limits nothing"
    );
    server.reload(&config(&yaml)).await.unwrap();
    assert_eq!(oks(&server, &b, 3).await, 1, "one of 3 left");
}

// ---------------------------------------------------------------------------------------------
// On Redis.

/// Two instances racing on one brought limit, each method: exactly its limit, together.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_redis_two_instances_racing_grant_exactly_the_brought_limit() {
    let redis = RedisServer::start();
    for method in METHODS {
        let servers = [
            server_on(&bare(method), redis_store(&redis)).await,
            server_on(&bare(method), redis_store(&redis)).await,
        ];
        let user = format!("race-{method}");
        let answers = race_tasks(&servers, 8, 6, move |_, _| {
            vec![bringing(&[("user", &user)], 20, HOUR)]
        })
        .await;
        assert_eq!(
            granted(&answers),
            20,
            "{method}: 48 racing requests of a limit of 20"
        );
    }
}

/// On Redis, two instances racing, all or nothing both ways: a refused request leaves its own
/// descriptor (configured, then brought) whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_redis_a_refused_request_charges_none_of_its_descriptors_under_races() {
    let redis = RedisServer::start();
    for method in METHODS {
        let yaml = format!(
            "domain: edge\nmethod: {method}\ndescriptors:\n  - key: own\n    rate_limit: {{unit: hour, requests_per_unit: 1}}\n  - key: shared\n    rate_limit: {{unit: hour, requests_per_unit: 10}}\n"
        );
        let servers = [
            server_on(&yaml, redis_store(&redis)).await,
            server_on(&yaml, redis_store(&redis)).await,
        ];
        // The brought limit shared, each request's configured descriptor its own.
        let tag = method.to_owned();
        let answers = race_tasks(&servers, 8, 4, move |task, i| {
            vec![
                descriptor(&[("own", &format!("{tag}-{task}-{i}"))]),
                bringing(&[("tenant", &tag)], 10, HOUR),
            ]
        })
        .await;
        assert_eq!(
            granted(&answers),
            10,
            "{method}: the shared brought limit of 10"
        );
        for (task, i, answer) in &answers {
            let own = [descriptor(&[("own", &format!("{method}-{task}-{i}"))])];
            let left = oks(&servers[0], &own, 2).await;
            assert_eq!(
                left,
                usize::from(!ok(answer.as_ref().unwrap())),
                "{method}: request {task}-{i}: its own configured descriptor has {left} left"
            );
        }
        // The configured limit shared, each request's brought limit its own.
        let tag = method.to_owned();
        let own = move |task: usize, i: usize| {
            bringing(&[("user", &format!("{tag}-{task}-{i}"))], 1, HOUR)
        };
        let make = own.clone();
        let shared = format!("shared-{method}");
        let answers = race_tasks(&servers, 8, 4, move |task, i| {
            vec![make(task, i), descriptor(&[("shared", &shared)])]
        })
        .await;
        assert_eq!(
            granted(&answers),
            10,
            "{method}: the shared configured limit of 10"
        );
        for (task, i, answer) in &answers {
            let left = oks(&servers[1], &[own(*task, *i)], 2).await;
            assert_eq!(
                left,
                usize::from(!ok(answer.as_ref().unwrap())),
                "{method}: request {task}-{i}: its own brought limit has {left} left"
            );
        }
    }
}

/// On Redis, racing first requests of 80 distinct limits: 64 made, the rest
/// `RESOURCE_EXHAUSTED`; every one made decides (on the connections the first one opened).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_redis_racing_first_requests_make_at_most_the_bound() {
    let redis = RedisServer::start();
    let server = server_on(&bare("sliding_window_counter"), redis_store(&redis)).await;
    let answers = race_tasks(std::slice::from_ref(&server), 80, 1, |task, _| {
        vec![bringing(&[("user", "ann")], task as u32 + 1, HOUR)]
    })
    .await;
    let mut made = 0;
    for (task, _, answer) in &answers {
        match answer {
            Ok(response) => {
                assert!(ok(response), "{task}");
                made += 1;
            }
            Err(status) => assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}"),
        }
    }
    assert_eq!(made, RateLimitServer::MAX_BROUGHT_LIMITS);
}

/// On Redis: the same brought limit twice is asked for both; absurd hits and huge refunds
/// neither panic nor leave the limit more generous than it is.
#[tokio::test]
async fn on_redis_hits_and_refunds_of_a_brought_limit() {
    let redis = RedisServer::start();
    for method in METHODS {
        let server = server_on(&bare(method), redis_store(&redis)).await;
        let user = format!("hits-{method}");
        let b = || bringing(&[("user", &user)], 3, HOUR);
        assert!(!ok(&decide(
            &server,
            &[with_hits(b(), 2), with_hits(b(), 2)]
        )
        .await));
        assert!(
            !ok(&decide(&server, &[with_hits(b(), u64::MAX)]).await),
            "{method}"
        );
        assert_eq!(
            oks(&server, &[b()], 5).await,
            3,
            "{method}: nothing charged before"
        );
        decide(&server, &[refund(b(), u64::MAX)]).await;
        let after = oks(&server, &[b()], 5).await;
        let most = if method == "sliding_window_log" { 0 } else { 3 };
        assert!(
            after <= most,
            "{method}: {after} granted after a huge refund"
        );
    }
}

/// On Redis, every unit and the largest limit: decided by that limit, or `INVALID_ARGUMENT`
/// naming the descriptor and the limit; never a panic, never `UNAVAILABLE`.
#[tokio::test]
async fn on_redis_every_unit_and_the_largest_limit_decide_or_name_the_descriptor() {
    let redis = RedisServer::start();
    for method in METHODS {
        let server = server_on(&bare(method), redis_store(&redis)).await;
        for (unit, name, _) in UNITS {
            for requests_per_unit in [1, 1000, u32::MAX] {
                let user = format!("units-{method}");
                let request = [bringing(&[("user", &user)], requests_per_unit, unit)];
                match try_decide(&server, &request).await {
                    Ok(answer) => {
                        assert!(ok(&answer), "{method} {requests_per_unit}/{name}");
                        assert_eq!(
                            u64::from(answer.statuses[0].limit_remaining),
                            u64::from(requests_per_unit) - 1,
                            "{method} {requests_per_unit}/{name}"
                        );
                        if requests_per_unit == 1 {
                            assert!(!ok(&decide(&server, &request).await), "{method} 1/{name}");
                        }
                    }
                    Err(status) => {
                        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
                        assert!(
                            status.message().contains("descriptor 0")
                                && status
                                    .message()
                                    .contains(&format!("({requests_per_unit} per {name})")),
                            "{method}: {}",
                            status.message()
                        );
                        assert!(
                            requests_per_unit > 1000,
                            "{method} {requests_per_unit}/{name}"
                        );
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// More: Retry-After, configured nodes that limit nothing, hostile entries, Redis pairs.

/// "Retry-After on a refusal that a later request could pass (never early)": for a brought
/// limit of 2 per second, under every method, in process and on Redis, the request passes once
/// the Retry-After it was given has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retry_after_of_a_brought_limit_is_never_early() {
    let redis = RedisServer::start();
    let mut checks = Vec::new();
    for method in METHODS {
        for store in [StateStore::InProcess { clients: 64 }, redis_store(&redis)] {
            let server = server_on(&bare(method), store.clone()).await;
            checks.push(tokio::spawn(async move {
                let b = [bringing(&[("user", &format!("retry-{method}"))], 2, SECOND)];
                let mut refusal = None;
                for _ in 0..4 {
                    let answer = decide(&server, &b).await;
                    if !ok(&answer) {
                        refusal = Some(answer);
                        break;
                    }
                }
                let refusal = refusal.expect("2 per second refuses a third request at once");
                let wait: u64 = header(&refusal, "retry-after")
                    .unwrap_or_else(|| panic!("{method} {store:?}: a refusal a later request passes"))
                    .parse()
                    .expect("whole seconds");
                assert!(wait <= 2, "{method} {store:?}: Retry-After {wait}");
                tokio::time::sleep(Duration::from_secs(wait)).await;
                let answer = decide(&server, &b).await;
                assert!(
                    ok(&answer),
                    "{method} {store:?}: refused again {wait}s after a Retry-After of {wait}: {answer:?}"
                );
            }));
        }
    }
    for check in checks {
        check.await.expect("the check holds");
    }
}

/// A brought limit applies in place of a configured one that limits nothing (`unlimited`) or
/// refuses everything (`requests_per_unit: 0`).
#[tokio::test]
async fn a_brought_limit_replaces_unlimited_and_zero_configured_limits() {
    let server = in_process(
        "domain: edge\ndescriptors:\n  - key: free\n    rate_limit: {unlimited: true}\n  - key: closed\n    rate_limit: {unit: second, requests_per_unit: 0}\n",
    )
    .await;
    assert_eq!(oks(&server, &[descriptor(&[("free", "a")])], 5).await, 5);
    assert_eq!(
        oks(&server, &[bringing(&[("free", "a")], 2, HOUR)], 5).await,
        2
    );
    assert_eq!(oks(&server, &[descriptor(&[("closed", "a")])], 2).await, 0);
    assert_eq!(
        oks(&server, &[bringing(&[("closed", "a")], 2, HOUR)], 5).await,
        2
    );
}

/// Hostile entries under a brought limit: none, many, huge, and values that look like the
/// client key's encoding; each list of entries is one client of its own, in process and on
/// Redis, and nothing panics.
#[tokio::test]
async fn hostile_entries_of_a_brought_limit_are_clients_of_their_own() {
    let redis = RedisServer::start();
    let huge = "v".repeat(100_000);
    let many: Vec<(String, String)> = (0..300)
        .map(|i| (format!("k{i}"), format!("{i}")))
        .collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let lists: Vec<Vec<(&str, &str)>> = vec![
        vec![],
        vec![("", "")],
        vec![("", ""), ("", "")],
        vec![("k", huge.as_str())],
        many.clone(),
        vec![("1:k", "1:v")],
        vec![("1", "k1:1:v")],
        vec![("{k}", "}v{")],
        vec![("k", "v\0")],
        vec![("k", "v")],
        vec![("k", "v"), ("", "")],
    ];
    for store in [StateStore::InProcess { clients: 64 }, redis_store(&redis)] {
        let server = server_on(&bare("sliding_window_counter"), store.clone()).await;
        for entries in &lists {
            let b = [bringing(entries, 2, HOUR)];
            assert_eq!(
                oks(&server, &b, 3).await,
                2,
                "{store:?}: {} entries of up to {} bytes",
                entries.len(),
                entries
                    .iter()
                    .map(|(k, v)| k.len() + v.len())
                    .max()
                    .unwrap_or(0)
            );
        }
    }
}

/// On Redis, two instances racing requests that bring one limit twice: never more permits than
/// the limit, and under the fixed window every permit not granted is still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_redis_racing_requests_bringing_one_limit_twice_never_exceed_it() {
    let redis = RedisServer::start();
    for method in METHODS {
        let servers = [
            server_on(&bare(method), redis_store(&redis)).await,
            server_on(&bare(method), redis_store(&redis)).await,
        ];
        let user = format!("twice-{method}");
        let make_user = user.clone();
        let answers = race_tasks(&servers, 8, 5, move |_, _| {
            let b = bringing(&[("user", &make_user)], 41, HOUR);
            vec![b.clone(), b]
        })
        .await;
        let pairs = granted(&answers);
        assert!(
            pairs * 2 <= 41,
            "{method}: {pairs} pairs granted of a limit of 41"
        );
        // Counted on a third instance, whose deny cache holds nothing (the racers' caches may
        // hold a denial for up to 1 s, as documented).
        let third = server_on(&bare(method), redis_store(&redis)).await;
        let left = oks(&third, &[bringing(&[("user", &user)], 41, HOUR)], 45).await;
        assert!(
            pairs * 2 + left <= 41,
            "{method}: {pairs} pairs, then {left} more"
        );
        if method == "fixed_window" || method == "sliding_window_counter" {
            assert_eq!(pairs * 2 + left, 41, "{method}: permits lost to give-backs");
        }
    }
}

/// On Redis, a brought limit of 0 beside a configured descriptor refuses the request and
/// charges the configured one nothing.
#[tokio::test]
async fn on_redis_a_brought_limit_of_zero_charges_the_other_descriptor_nothing() {
    let redis = RedisServer::start();
    let yaml = "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";
    let server = server_on(yaml, redis_store(&redis)).await;
    let request = [
        descriptor(&[("k", "v")]),
        bringing(&[("u", "x")], 0, MINUTE),
    ];
    assert_eq!(oks(&server, &request, 3).await, 0);
    assert_eq!(oks(&server, &[descriptor(&[("k", "v")])], 3).await, 2);
}

/// A give-back on Redis made to happen without a race: instance A holds a cached denial of a
/// spent brought limit B (its deny cache); instance X refunds B, so that Redis has room again.
/// A request [C, B] on A then passes its look (a look reads Redis, never the cache), C's taking
/// is granted on Redis, and B's taking is refused by A's cache: the request is refused, and C's
/// grant must be given back exactly (no other decision landed on C's keys), whatever C is: a
/// fresh brought limit or a configured descriptor, under every method.
#[tokio::test]
async fn on_redis_a_deny_cache_refusal_after_the_look_gives_the_other_grant_back() {
    let redis = RedisServer::start();
    for method in METHODS {
        let yaml = format!(
            "domain: edge\nmethod: {method}\ndescriptors:\n  - key: own\n    rate_limit: {{unit: hour, requests_per_unit: 1}}\n"
        );
        let a = server_on(&yaml, redis_store(&redis)).await;
        let x = server_on(&yaml, redis_store(&redis)).await;
        for (round, c) in [
            bringing(&[("fresh", method)], 1, HOUR),
            descriptor(&[("own", method)]),
        ]
        .into_iter()
        .enumerate()
        {
            let b = bringing(&[("user", &format!("cached-{method}-{round}"))], 1, HOUR);
            // X brings B's limit once (for another user), so that its refund finds a limiter
            // (see `on_redis_a_refund_reaches_a_brought_limit_another_instance_charged`).
            decide(&x, &[bringing(&[("user", "someone else")], 1, HOUR)]).await;
            assert!(ok(&decide(&a, std::slice::from_ref(&b)).await), "{method}");
            assert!(
                !ok(&decide(&a, std::slice::from_ref(&b)).await),
                "{method}: spent, denial cached on A"
            );
            decide(&x, &[refund(b.clone(), 1)]).await;
            let answer = decide(&a, &[c.clone(), b.clone()]).await;
            if ok(&answer) {
                // The cache had let go (it holds a denial 1 s at most): nothing to check here.
                eprintln!("{method} round {round}: granted; the cache had expired");
                continue;
            }
            if method != "sliding_window_log" {
                // Redis had room for B: the refusal was the cache's, after the look.
                assert!(
                    ok(&decide(&x, std::slice::from_ref(&b)).await),
                    "{method}: B was refunded"
                );
            }
            assert_eq!(
                oks(&x, std::slice::from_ref(&c), 2).await,
                1,
                "{method} round {round}: the refused request charged its other descriptor \
                 {c:?} (answer {answer:?})"
            );
        }
    }
}

/// "No limit ever grants more than it allows", over time: a brought limit of 3 per second,
/// asked every 2 ms for 2.3 s, under every method, in process and on Redis. Each grant is known
/// to have been decided between the instants before and after its call, so a span shorter than
/// the method allows is measured without false alarms: the sliding log grants at most 3 in any
/// span of 1 s; the fixed window and the sliding window counter at most 6; the token bucket at
/// most 3 + k in any span shorter than k/3 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn brought_limits_hold_their_method_over_time() {
    let redis = RedisServer::start();
    let mut checks = Vec::new();
    for method in METHODS {
        for store in [StateStore::InProcess { clients: 64 }, redis_store(&redis)] {
            let server = server_on(&bare(method), store.clone()).await;
            checks.push(tokio::spawn(async move {
                let b = [bringing(&[("user", &format!("time-{method}"))], 3, SECOND)];
                let mut grants = Vec::new();
                let end = std::time::Instant::now() + Duration::from_millis(2_300);
                while std::time::Instant::now() < end {
                    let before = std::time::Instant::now();
                    let answer = decide(&server, &b).await;
                    let after = std::time::Instant::now();
                    if ok(&answer) {
                        grants.push((before, after));
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                let second = Duration::from_secs(1);
                // The most grants allowed in any span under 1 s, and under k/3 s for the bucket.
                let most_in_a_second = match method {
                    "sliding_window_log" => 3,
                    _ => 6,
                };
                for i in 0..grants.len() {
                    if let Some(last) = grants.get(i + most_in_a_second) {
                        let span = last.1 - grants[i].0;
                        assert!(
                            span >= second,
                            "{method} {store:?}: {} grants within {span:?} (at most {most_in_a_second} in 1 s)",
                            most_in_a_second + 1
                        );
                    }
                    if method == "token_bucket" {
                        for k in 1..=6u32 {
                            if let Some(last) = grants.get(i + 3 + k as usize) {
                                let span = last.1 - grants[i].0;
                                let least = second * k / 3;
                                assert!(
                                    span + Duration::from_millis(1) >= least,
                                    "{method} {store:?}: {} grants within {span:?}, under {least:?}",
                                    4 + k
                                );
                            }
                        }
                    }
                }
                assert!(grants.len() >= 6, "{method} {store:?}: only {} grants", grants.len());
                grants.len()
            }));
        }
    }
    for check in checks {
        check.await.expect("the check holds");
    }
}

/// On Redis "every instance shares each limit", and a refund gives permits back "by the same
/// rules, in one round trip": a refund of a brought limit must reach the state another instance
/// charged, as a refund of a configured descriptor does. Envoy sends a refund to whichever
/// instance its load balancer picks (and a restarted instance serves its predecessor's state).
#[tokio::test]
async fn on_redis_a_refund_reaches_a_brought_limit_another_instance_charged() {
    let redis = RedisServer::start();
    let mut dropped = Vec::new();
    // The sliding log gives nothing back by its own rule.
    for method in ["fixed_window", "token_bucket", "sliding_window_counter"] {
        let yaml = format!(
            "domain: edge\nmethod: {method}\ndescriptors:\n  - key: own\n    rate_limit: {{unit: hour, requests_per_unit: 1}}\n"
        );
        let a = server_on(&yaml, redis_store(&redis)).await;
        let x = server_on(&yaml, redis_store(&redis)).await;
        // A configured descriptor: charged on A, refunded on X, granted again.
        let configured = descriptor(&[("own", method)]);
        assert!(
            ok(&decide(&a, std::slice::from_ref(&configured)).await),
            "{method}"
        );
        decide(&x, &[refund(configured.clone(), 1)]).await;
        assert!(
            ok(&decide(&a, &[configured]).await),
            "{method}: a configured descriptor's refund on the other instance"
        );
        // A brought limit: the same.
        let brought = bringing(&[("user", method)], 1, HOUR);
        assert!(
            ok(&decide(&a, std::slice::from_ref(&brought)).await),
            "{method}"
        );
        let answer = decide(&x, &[refund(brought.clone(), 1)]).await;
        assert!(ok(&answer), "{method}: a refund is answered OK");
        let again = decide(&a, std::slice::from_ref(&brought)).await;
        if !ok(&again) {
            dropped.push(format!("{method}: {:?}", again.statuses[0]));
        }
        // Once X has brought the limit itself (for another user), its refunds reach it.
        let other = bringing(&[("user", &format!("{method}-other"))], 1, HOUR);
        assert!(
            ok(&decide(&a, std::slice::from_ref(&other)).await),
            "{method}"
        );
        decide(&x, &[bringing(&[("user", "anyone")], 1, HOUR)]).await;
        decide(&x, &[refund(other.clone(), 1)]).await;
        assert!(
            ok(&decide(&a, &[other]).await),
            "{method}: once X made the limiter, its refund reaches the state A charged"
        );
    }
    assert!(
        dropped.is_empty(),
        "the brought limit's refund on instance X (which had not brought that limit yet) was \
         dropped: 1 per hour, charged once on A, refunded once on X, then refused on A:\n{}",
        dropped.join("\n")
    );
}

/// On Redis, a brought limit first brought while Redis is down: the request is `UNAVAILABLE`
/// (under `FailurePolicy::Error`), nothing panics, and once Redis is back the limiter made then
/// (sharing its connections with every later one) decides exactly its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_limit_first_brought_while_redis_is_down_decides_once_it_is_back() {
    let mut redis = RedisServer::start();
    redis.kill();
    let store = StateStore::Redis {
        url: redis.url(),
        policy: FailurePolicy::Error,
        timeout: Duration::from_millis(300),
    };
    let server = server_on(&bare("fixed_window"), store).await;
    let b = [bringing(&[("user", "ann")], 3, HOUR)];
    let error = try_decide(&server, &b).await.expect_err("Redis is down");
    assert_eq!(error.code(), tonic::Code::Unavailable, "{error:?}");
    // A refund meanwhile is answered OK (its failed round trip gives nothing back).
    let answer = try_decide(&server, &[refund(b[0].clone(), 1)]).await;
    assert!(ok(&answer.expect("a refund is answered")));
    redis.restart();
    let back = rls_support::eventually(Duration::from_secs(10), async || {
        try_decide(&server, &[bringing(&[("user", "probe")], 3, HOUR)])
            .await
            .is_ok()
    })
    .await;
    assert!(
        back,
        "the limiter made while Redis was down never reached it again"
    );
    assert_eq!(oks(&server, &b, 5).await, 3);
    // A second limit, made now on the first one's connections.
    assert_eq!(
        oks(&server, &[bringing(&[("user", "ann")], 2, HOUR)], 4).await,
        2
    );
}

/// On a Redis Cluster: brought limits whose entries hold hash-tag braces, two of them in one
/// request (their keys on different slots), decide exactly and all or nothing, shared by two
/// instances.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster_brought_limits_with_braces_are_exact_and_all_or_nothing() {
    let cluster = redis_support::RedisCluster::start();
    let store = StateStore::Redis {
        url: cluster.url(),
        policy: FailurePolicy::Error,
        timeout: Duration::from_secs(5),
    };
    let a = server_on(&bare("token_bucket"), store.clone()).await;
    let x = server_on(&bare("token_bucket"), store).await;
    let tight = bringing(&[("user", "}{ann}")], 2, HOUR);
    let loose = bringing(&[("{team}", "{")], 10, HOUR);
    let both = [loose.clone(), tight.clone()];
    assert_eq!(oks(&a, &both, 2).await, 2);
    assert_eq!(oks(&x, &both, 3).await, 0, "the tight limit is spent");
    assert_eq!(
        oks(&x, std::slice::from_ref(&loose), 10).await,
        8,
        "refused requests charged nothing"
    );
    assert_eq!(oks(&a, &[tight], 1).await, 0);
}
