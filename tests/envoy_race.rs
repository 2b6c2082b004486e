//! All or nothing under a race, in process and on Redis: requests of two descriptors, each
//! client's own (`user`) and one shared by every thread (`round`), race for the shared one's last
//! permits. A request refused at its taking of the shared descriptor (in process taken last; on
//! Redis taken together with the client's own), after its look found a permit there, has taken
//! its own descriptor's permit already; that grant is given back. So each client's own limit is
//! charged exactly its requests answered OK, for every method that can give a grant back, and
//! every round grants exactly the shared limit. (With the give-back taken out, 13 of 15 runs of
//! the in-process tests failed, and every run of the Redis ones: the race is frequent, not
//! certain, in a run.)

mod redis_support;
mod rls_support;

use std::time::Duration;

use std::sync::{Arc, Barrier};
use std::thread;

use redis_support::RedisServer;
use rls_support::{in_process, request, runtime};
use tollgate::envoy::proto::RateLimitRequest;
use tollgate::envoy::proto::rate_limit_response::Code;
use tollgate::envoy::{RateLimitServer, RlsConfig, StateStore};
use tollgate::redis::FailurePolicy;

/// Threads racing in each round.
const THREADS: usize = 4;
/// Rounds, each a shared limit of its own.
const ROUNDS: usize = 5_000;
/// Rounds on Redis, where each request is four round trips.
const REDIS_ROUNDS: usize = 1_000;
/// Requests per thread and round: more than the round's limit in all.
const TRIES: usize = 2;
/// The round's shared limit.
const SHARED: u64 = 3;
/// Each client's own limit: never what refuses a request here (and within the sliding log's
/// bound).
const OWN: u64 = 60_000;

/// The client's own descriptor under `method`; the shared one under the sliding log, which the
/// service takes last (it cannot give a grant back), so that a refusal there always follows a
/// grant of the client's own.
fn config(method: &str) -> String {
    format!(
        r#"
domain: race
method: {method}
descriptors:
  - key: user
    rate_limit: {{unit: year, requests_per_unit: {OWN}}}
  - key: round
    method: sliding_window_log
    rate_limit: {{unit: day, requests_per_unit: {SHARED}}}
"#
    )
}

fn decide(
    runtime: &tokio::runtime::Runtime,
    server: &RateLimitServer,
    request: &RateLimitRequest,
) -> (bool, u32) {
    let response = runtime
        .block_on(server.decide(request))
        .expect("the request is decided");
    let own_remaining = response.statuses[0].limit_remaining;
    (response.overall_code == Code::Ok as i32, own_remaining)
}

/// Runs the race on `method`, each request carrying the client's own descriptor `copies` times
/// (Envoy sends a descriptor twice when two of a route's rate limits make it), and checks each
/// client's charge against its OK answers.
fn race(method: &str, copies: usize) {
    let runtime = runtime();
    let server = in_process(&runtime, &config(method), 4096);
    race_on(&runtime, &server, method, copies, ROUNDS);
}

/// [`race`], with the limits' state on a Redis server of its own.
fn race_on_redis(method: &str, copies: usize) {
    let redis = RedisServer::start();
    // The connections' tasks run on this runtime's workers while the racing threads wait on
    // their round trips.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let config = RlsConfig::from_yaml_str("race.yaml", &config(method)).expect("valid");
    let store = StateStore::Redis {
        url: redis.url(),
        policy: FailurePolicy::Error,
        timeout: Duration::from_secs(5),
    };
    let server = runtime
        .block_on(RateLimitServer::new(&config, store))
        .expect("the service builds on Redis");
    race_on(&runtime, &server, method, copies, REDIS_ROUNDS);
}

fn race_on(
    runtime: &tokio::runtime::Runtime,
    server: &RateLimitServer,
    method: &str,
    copies: usize,
    rounds: usize,
) {
    let barrier = Arc::new(Barrier::new(THREADS));
    let workers: Vec<_> = (0..THREADS)
        .map(|thread| {
            let (server, barrier) = (server.clone(), Arc::clone(&barrier));
            thread::spawn(move || {
                let runtime = rls_support::runtime();
                let user = format!("u{thread}");
                let mut oks = vec![0_u64; rounds];
                for (round, oks) in oks.iter_mut().enumerate() {
                    let round = round.to_string();
                    let own = [("user", user.as_str())];
                    let shared = [("round", round.as_str())];
                    let mut entries: Vec<&[(&str, &str)]> = vec![&own; copies];
                    entries.push(&shared);
                    let both = request("race", &entries);
                    barrier.wait();
                    for _ in 0..TRIES {
                        *oks += u64::from(decide(&runtime, &server, &both).0);
                    }
                }
                oks
            })
        })
        .collect();
    let per_thread: Vec<Vec<u64>> = workers
        .into_iter()
        .map(|worker| worker.join().expect("a worker panicked"))
        .collect();
    for round in 0..rounds {
        let granted: u64 = per_thread.iter().map(|oks| oks[round]).sum();
        assert_eq!(
            granted, SHARED,
            "{method}: round {round} granted {granted} of its shared limit of {SHARED}"
        );
    }
    for (thread, oks) in per_thread.iter().enumerate() {
        let answered_ok: u64 = oks.iter().sum();
        // One more request of the client's own descriptor alone: what it reports left.
        let (allowed, remaining) = decide(
            runtime,
            server,
            &request("race", &[&[("user", &format!("u{thread}"))]]),
        );
        assert!(
            allowed,
            "{method}: the client's own limit is far from spent"
        );
        let charged = OWN - 1 - u64::from(remaining);
        let answered_ok = answered_ok * copies as u64;
        assert_eq!(
            charged, answered_ok,
            "{method}: client u{thread} was charged {charged} permits for {answered_ok} requests \
             answered OK ({copies} each): a refused request kept a grant"
        );
    }
}

#[test]
fn a_request_refused_after_its_look_gives_back_under_the_token_bucket() {
    race("token_bucket", 1);
}

#[test]
fn a_request_refused_after_its_look_gives_back_under_the_fixed_window() {
    race("fixed_window", 1);
}

#[test]
fn a_request_refused_after_its_look_gives_back_under_the_sliding_window_counter() {
    race("sliding_window_counter", 1);
}

/// Two grants on one state in one request (its descriptor sent twice) are given back latest
/// first, so that each restores exactly what it took, even under the token bucket, which keeps
/// a grant another has landed after.
#[test]
fn a_descriptor_sent_twice_gives_back_both_grants_under_the_token_bucket() {
    race("token_bucket", 2);
}

#[test]
fn a_descriptor_sent_twice_gives_back_both_grants_under_the_fixed_window() {
    race("fixed_window", 2);
}

#[test]
fn on_redis_a_request_refused_after_its_look_gives_back_under_the_token_bucket() {
    race_on_redis("token_bucket", 1);
}

#[test]
fn on_redis_a_request_refused_after_its_look_gives_back_under_the_fixed_window() {
    race_on_redis("fixed_window", 1);
}

#[test]
fn on_redis_a_request_refused_after_its_look_gives_back_under_the_sliding_window_log() {
    race_on_redis("sliding_window_log", 1);
}

#[test]
fn on_redis_a_request_refused_after_its_look_gives_back_under_the_sliding_window_counter() {
    race_on_redis("sliding_window_counter", 1);
}

/// The takings of one request run together on Redis: the two grants of a descriptor sent
/// twice are given back in the order read from the grants themselves, latest first, so that
/// each restores exactly, even under the token bucket.
#[test]
fn on_redis_a_descriptor_sent_twice_gives_back_both_grants_under_the_token_bucket() {
    race_on_redis("token_bucket", 2);
}
