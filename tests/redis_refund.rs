//! Refunds on Redis (`is_negative_hits`; `RedisRateLimiter::refund`) decide as the in-process
//! refunds do: random sequences of takings and refunds, sent to the Envoy service with its
//! state in process and to one with its state on a real Redis, get the same answers step by
//! step, for every method (limits of a year, so that no window ends and no token refills
//! within a run). The comparison catches a planted refund that gives nothing.

mod redis_support;
mod rls_support;

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::google::protobuf::UInt64Value;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redis_support::RedisServer;
use rls_support::descriptor;
use tollgate::envoy::proto::RateLimitRequest;
use tollgate::envoy::proto::rate_limit_response::Code;
use tollgate::envoy::{RateLimitServer, RlsConfig, StateStore};
use tollgate::redis::FailurePolicy;

const LIMIT: u64 = 6;

#[derive(Debug, Clone, Copy)]
enum Step {
    Take(u64),
    Refund(u64),
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            (1..=4_u64).prop_map(Step::Take),
            (1..=8_u64).prop_map(Step::Refund)
        ],
        1..24,
    )
}

fn config(method: &str) -> RlsConfig {
    let yaml = format!(
        "domain: edge\nmethod: {method}\ndescriptors:\n  - key: user\n    rate_limit: {{unit: year, requests_per_unit: {LIMIT}}}\n"
    );
    RlsConfig::from_yaml_str("refund.yaml", &yaml).expect("valid")
}

fn request(user: &str, step: Step) -> RateLimitRequest {
    let mut made: RateLimitDescriptor = descriptor(&[("user", user)]);
    let (hits, negative) = match step {
        Step::Take(n) => (n, false),
        Step::Refund(n) => (n, true),
    };
    made.hits_addend = Some(UInt64Value { value: hits });
    made.is_negative_hits = negative;
    RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![made],
        hits_addend: 0,
    }
}

/// What a step answers: OK or not, and, for OK, what the descriptor reports left. (A refusal's
/// figures on Redis may come from the node's deny cache, which keeps those of the refusal it
/// remembers: its decision stands, its `remaining` may be of an earlier state.)
async fn answer(server: &RateLimitServer, request: &RateLimitRequest) -> (bool, Option<u32>) {
    let response = server.decide(request).await.expect("decided");
    let ok = response.overall_code == Code::Ok as i32;
    (ok, ok.then_some(response.statuses[0].limit_remaining))
}

/// Runs random sequences under `method`, on Redis sending refunds only if `send_refunds`; the
/// first difference from in process, if any.
fn compare(method: &str, send_refunds: bool) -> Result<(), String> {
    let redis = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (in_process, on_redis) = runtime.block_on(async {
        let in_process =
            RateLimitServer::new(&config(method), StateStore::InProcess { clients: 4096 })
                .await
                .expect("builds");
        let store = StateStore::Redis {
            url: redis.url(),
            policy: FailurePolicy::Error,
            timeout: Duration::from_secs(5),
        };
        let on_redis = RateLimitServer::new(&config(method), store)
            .await
            .expect("builds on Redis");
        (in_process, on_redis)
    });
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::sync::atomic::AtomicU64::new(0);
    runner
        .run(&steps(), |steps| {
            // A client of its own per case (and per shrinking step).
            let user = format!(
                "u{}",
                case.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            );
            runtime.block_on(async {
                for (at, &step) in steps.iter().enumerate() {
                    let request = request(&user, step);
                    let want = answer(&in_process, &request).await;
                    if matches!(step, Step::Refund(_)) && !send_refunds {
                        continue;
                    }
                    let got = answer(&on_redis, &request).await;
                    prop_assert_eq!(
                        got,
                        want,
                        "{}: step {} ({:?}) of {:?}",
                        method,
                        at,
                        step,
                        steps
                    );
                }
                Ok::<(), TestCaseError>(())
            })
        })
        .map_err(|failure| failure.to_string())
}

#[test]
fn refunds_on_redis_decide_as_in_process_for_every_method() {
    for method in [
        "token_bucket",
        "fixed_window",
        "sliding_window_counter",
        "sliding_window_log",
    ] {
        if let Err(failure) = compare(method, true) {
            panic!("{failure}");
        }
    }
}

/// Negative control: with the refunds not sent to Redis (a refund that gives nothing), the
/// comparison fails for every method whose refunds give permits back.
#[test]
fn the_comparison_catches_a_refund_that_gives_nothing() {
    for method in ["token_bucket", "fixed_window", "sliding_window_counter"] {
        assert!(
            compare(method, false).is_err(),
            "{method}: a refund that gives nothing must be caught"
        );
    }
}
