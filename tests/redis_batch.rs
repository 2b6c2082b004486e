//! Batched decisions (`RedisRateLimiterBuilder::batch_size`) against real `redis-server`s: each
//! decision of a batch replies and writes exactly as a call of its own, made in the batch's
//! order, would; a request whose own decision fails fails alone; concurrent tasks on the real
//! clock are admitted exactly the limit; settings a batch cannot honour are named.
//!
//! The reference: the same requests through a limiter that does not batch, one call each, in
//! the order of the batch, on twin keys (another key prefix) of the same server, with the same
//! injected times.

mod redis_support;

use std::sync::Arc;
use std::time::Duration;

use ::redis::Value;
use redis_support::{DECISION_TIMEOUT, RedisServer, Rng, join_all};
use tollgate::redis::{Answer, RedisError, RedisRateLimiter, RedisRateLimiterBuilder};
use tollgate::{Algorithm, Rule};

type Redis = RedisRateLimiter<&'static str>;

/// An injected clock's start: 2025-01-01 in microseconds since the Unix epoch.
const EPOCH_2025_US: u64 = 1_735_689_600_000_000;

/// The plans each method is tried with: one limit, and two of different windows.
fn plans() -> [(&'static str, Vec<Rule>); 2] {
    [
        (
            "one",
            vec![Rule::new(5, Duration::from_millis(100)).unwrap()],
        ),
        (
            "two",
            vec![
                Rule::new(3, Duration::from_millis(40)).unwrap(),
                Rule::new(7, Duration::from_millis(250)).unwrap(),
            ],
        ),
    ]
}

async fn limiter(server: &RedisServer, algorithm: Algorithm, prefix: &str, batch: usize) -> Redis {
    let mut builder = RedisRateLimiter::builder(server.url(), algorithm)
        .key_prefix(prefix)
        .batch_size(batch)
        .timeout(DECISION_TIMEOUT);
    for (plan, rules) in plans() {
        builder = builder.plan_limits(plan, rules);
    }
    builder.build().await.unwrap()
}

/// One request of a history.
#[derive(Debug, Clone, Copy)]
struct Step {
    client: &'static str,
    plan: &'static str,
    n: u64,
    peek: bool,
    at_us: u64,
}

async fn ask(limiter: &Redis, step: Step) -> Result<Answer, RedisError> {
    if step.peek {
        limiter.peek_at(step.client, &step.plan, step.at_us).await
    } else {
        limiter
            .decide_at(step.client, &step.plan, step.n, step.at_us)
            .await
    }
}

/// What a key holds, comparable between twins: the value (a hash without its incarnation `i`,
/// the server's time when the key was made) and whether it has an expiry.
async fn key_state(connection: &mut ::redis::aio::MultiplexedConnection, key: &str) -> String {
    let kind: String = ::redis::cmd("TYPE")
        .arg(key)
        .query_async(connection)
        .await
        .unwrap();
    let value: Value = match kind.as_str() {
        "string" => ::redis::cmd("GET")
            .arg(key)
            .query_async(connection)
            .await
            .unwrap(),
        "hash" => ::redis::cmd("HMGET")
            .arg(key)
            .arg("w")
            .arg("c")
            .arg("p")
            .query_async(connection)
            .await
            .unwrap(),
        "zset" => ::redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(connection)
            .await
            .unwrap(),
        _ => Value::Nil,
    };
    let ttl: i64 = ::redis::cmd("PTTL")
        .arg(key)
        .query_async(connection)
        .await
        .unwrap();
    format!("{kind} {value:?} expires: {}", ttl > 0)
}

/// Runs `steps` as one batch (all asked at once, so that they wait together) on `batched`, and
/// one by one in the same order on `alone`; checks every answer and every key alike.
async fn compare(
    server: &RedisServer,
    algorithm: Algorithm,
    batched: &Redis,
    alone: &Redis,
    steps: &[Step],
    context: &str,
) {
    let answers = join_all(steps.iter().map(|&step| ask(batched, step))).await;
    for (at, (&step, answer)) in steps.iter().zip(answers).enumerate() {
        let reference = ask(alone, step).await;
        assert_eq!(
            format!("{answer:?}"),
            format!("{reference:?}"),
            "{algorithm}, {context}, request {at}: {step:?}"
        );
    }
    let mut connection = server.connection().await;
    for (plan, _) in plans() {
        for client in CLIENTS {
            let batched_keys = batched.keys(client, &plan).unwrap();
            let alone_keys = alone.keys(client, &plan).unwrap();
            for (batched_key, alone_key) in batched_keys.iter().zip(&alone_keys) {
                assert_eq!(
                    key_state(&mut connection, batched_key).await,
                    key_state(&mut connection, alone_key).await,
                    "{algorithm}, {context}: {batched_key} against {alone_key}"
                );
            }
        }
    }
}

const CLIENTS: [&str; 3] = ["ana", "bo", "cy"];

/// The largest batch: a round of 32 requests leaves in four calls, on their way together.
const MAX_BATCH: usize = RedisRateLimiterBuilder::<&str>::MAX_BATCH_SIZE;

/// Random histories in rounds of up to 32 requests asked together (so in batches of up to
/// `MAX_BATCH`, several calls on their way at once) on three clients and two plans, each
/// request at its own injected time (mostly moving on, sometimes back), of 0 to 3 permits or a
/// peek: every answer and every key as with calls alone.
#[tokio::test]
async fn a_batch_decides_each_request_as_its_own_call_would() {
    let server = RedisServer::start();
    let mut rng = Rng(0x5EED_BA7C);
    for algorithm in Algorithm::ALL {
        let batched = limiter(&server, algorithm, "batched", MAX_BATCH).await;
        let alone = limiter(&server, algorithm, "alone", 1).await;
        let mut now = EPOCH_2025_US + rng.below(1_000_000);
        for round in 0..12 {
            let size = rng.range(2, 32) as usize;
            let steps: Vec<Step> = (0..size)
                .map(|_| {
                    now += rng.pick(&[0, 0, 1, 7, 1_000, 9_999, 40_000]);
                    let at_us = if rng.chance(5) {
                        now.saturating_sub(rng.below(50_000))
                    } else {
                        now
                    };
                    Step {
                        client: rng.pick(&CLIENTS),
                        plan: rng.pick(&["one", "two"]),
                        n: rng.upto(3),
                        peek: rng.chance(10),
                        at_us,
                    }
                })
                .collect();
            compare(
                &server,
                algorithm,
                &batched,
                &alone,
                &steps,
                &format!("round {round}"),
            )
            .await;
        }
        let stats = batched.stats();
        assert!(
            stats.round_trips * 3 <= stats.redis_decisions,
            "{algorithm}: calls of three decisions or more on average, not {} calls for {} \
             decisions",
            stats.round_trips,
            stats.redis_decisions
        );
    }
}

/// A request whose own decision fails fails alone: with the server out of memory
/// (`maxmemory` reached under `noeviction`), the requests that write (acquires) get the
/// server's `OOM` error and the ones that do not (peeks, and 0 permits) their figures, in one
/// batch; as calls alone they get the same.
#[tokio::test]
async fn a_request_whose_write_fails_fails_alone_in_its_batch() {
    let server = RedisServer::start();
    for algorithm in Algorithm::ALL {
        let batched = limiter(&server, algorithm, "batched", MAX_BATCH).await;
        let alone = limiter(&server, algorithm, "alone", 1).await;
        let mut connection = server.connection().await;
        let _: () = ::redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(1)
            .query_async(&mut connection)
            .await
            .unwrap();
        let steps: Vec<Step> = (0..12)
            .map(|i| Step {
                client: CLIENTS[i % 3],
                plan: "one",
                n: [1, 0, 2][i % 3],
                peek: i % 4 == 3,
                at_us: EPOCH_2025_US + i as u64 * 1_000,
            })
            .collect();
        let answers = join_all(steps.iter().map(|&step| ask(&batched, step))).await;
        let mut failed = 0;
        for (at, (&step, answer)) in steps.iter().zip(answers).enumerate() {
            let reference = ask(&alone, step).await;
            let writes = step.n > 0 && !step.peek;
            match (&answer, &reference) {
                (
                    Err(RedisError::Command { source }),
                    Err(RedisError::Command { source: other }),
                ) => {
                    assert!(
                        writes,
                        "{algorithm}: request {at} fails, though it writes nothing"
                    );
                    assert_eq!(source.code(), Some("OOM"), "{algorithm}: {source}");
                    assert_eq!(other.code(), Some("OOM"), "{algorithm}: {other}");
                    failed += 1;
                }
                (Ok(answer), Ok(reference)) => {
                    assert!(
                        !writes,
                        "{algorithm}: request {at} passes, though its write fails"
                    );
                    assert_eq!(answer, reference, "{algorithm}, request {at}");
                }
                _ => panic!("{algorithm}, request {at}: {answer:?}, alone {reference:?}"),
            }
        }
        assert_eq!(failed, 6, "{algorithm}: the six acquires of permits fail");
        let _: () = ::redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(0)
            .query_async(&mut connection)
            .await
            .unwrap();
        assert!(
            batched.stats().round_trips <= 2,
            "12 requests in two calls: {:?}",
            batched.stats()
        );
    }
}

/// 64 tasks on the real clock, sharing 8 clients of 100 permits an hour, ask 4,000 times: each
/// client is admitted exactly 100, by calls that carried several decisions each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_tasks_are_admitted_exactly_the_limit() {
    let server = RedisServer::start();
    for (at, algorithm) in Algorithm::ALL.into_iter().enumerate() {
        let limiter = Arc::new(
            RedisRateLimiter::builder(server.url(), algorithm)
                .key_prefix(format!("tasks{at}"))
                .plan("hour", Rule::new(100, Duration::from_secs(3600)).unwrap())
                .batch_size(RedisRateLimiterBuilder::<&str>::MAX_BATCH_SIZE)
                .deny_cache(0)
                .timeout(DECISION_TIMEOUT)
                .build()
                .await
                .unwrap(),
        );
        let tasks: Vec<_> = (0..64)
            .map(|task| {
                let limiter = Arc::clone(&limiter);
                tokio::spawn(async move {
                    let mut admitted = [0u64; 8];
                    for i in 0..63 {
                        let client = (task + i) % 8;
                        let name = format!("client{client}");
                        if limiter.allow(&name, &"hour").await.unwrap() {
                            admitted[client] += 1;
                        }
                    }
                    admitted
                })
            })
            .collect();
        let mut admitted = [0u64; 8];
        for task in tasks {
            for (total, own) in admitted.iter_mut().zip(task.await.unwrap()) {
                *total += own;
            }
        }
        assert_eq!(admitted, [100; 8], "{algorithm}");
        let stats = limiter.stats();
        assert_eq!(stats.redis_decisions, 64 * 63, "{algorithm}: {stats:?}");
        assert!(
            stats.round_trips < stats.redis_decisions / 2,
            "{algorithm}: calls carried several decisions each: {stats:?}"
        );
    }
}

/// A batch size a limiter cannot honour is named, with its bound, when the limiter is built:
/// none at all, one past the largest, and batching on a cluster, whose clients' keys live in
/// different hash slots. Outside a runtime, where no task can send the batches, too.
#[tokio::test]
async fn a_batch_size_out_of_bounds_is_named() {
    let rule = Rule::new(5, Duration::from_secs(1)).unwrap();
    let largest = RedisRateLimiterBuilder::<&str>::MAX_BATCH_SIZE;
    for (url, size) in [
        ("redis://127.0.0.1:1", 0),
        ("redis://127.0.0.1:1", largest + 1),
        ("redis+cluster://127.0.0.1:1", 2),
    ] {
        let built = RedisRateLimiter::builder(url, Algorithm::TokenBucket)
            .plan("free", rule)
            .batch_size(size)
            .build_lazy();
        match built {
            Err(RedisError::InvalidSetting {
                field,
                value,
                bound,
            }) => {
                assert_eq!(field, "batch size");
                assert_eq!(value, size.to_string());
                assert!(!bound.is_empty());
            }
            other => panic!("{url}, batch size {size}: {other:?}"),
        }
    }
    let limiter = RedisRateLimiter::builder("redis://127.0.0.1:1", Algorithm::TokenBucket)
        .plan("free", rule)
        .batch_size(largest)
        .build_lazy()
        .unwrap();
    assert_eq!(limiter.batch_size(), largest);
    let outside = std::thread::spawn(move || {
        RedisRateLimiter::builder("redis://127.0.0.1:1", Algorithm::TokenBucket)
            .plan("free", rule)
            .batch_size(2)
            .build_lazy()
            .map(|_| ())
    })
    .join()
    .unwrap();
    assert!(
        matches!(
            outside,
            Err(RedisError::InvalidSetting {
                field: "batch size",
                ..
            })
        ),
        "{outside:?}"
    );
}
