//! Attacks on the Redis backend's protocols through the public API, against real
//! `redis-server`s: the sliding log script against in-process logs (several limits, equal
//! instants, clocks stepped back, more than 16 expired batches), another program's keys under
//! the plan's names, the deny cache, the circuit breaker's single probe, a cluster with clients
//! whose names hold braces, and the tower backend's client names.

mod redis_support;

use std::sync::Arc;
use std::time::Duration;

use ::redis::AsyncCommands;
use redis_support::{DECISION_TIMEOUT, RedisCluster, RedisServer, Rng};
use tollgate::redis::{CircuitBreaker, FailurePolicy, RedisError, RedisRateLimiter, Source};
use tollgate::tower::RedisClientName;
use tollgate::{Algorithm, Decision, FakeClock, Limiter, Rule, SlidingWindowLog};

const SECOND_US: u64 = 1_000_000;

/// One request of a history: at `at_us`, `n` permits, or a peek.
#[derive(Debug, Clone, Copy)]
struct Request {
    at_us: u64,
    n: u64,
    peek: bool,
}

/// What the plan's limits answer together, as the Redis limiter documents it: the refusal with
/// the longest wait if any limit refuses, else the grant with the fewest permits left.
fn combined(decisions: &[Decision]) -> Decision {
    let mut combined = decisions[0];
    for &decision in &decisions[1..] {
        combined = match (combined.is_denied(), decision.is_denied()) {
            (false, true) => decision,
            (true, true) if decision.retry_after() > combined.retry_after() => decision,
            (false, false) if decision.remaining() < combined.remaining() => decision,
            _ => combined,
        };
    }
    combined
}

/// The decision of in-process logs, one per rule, for `request` after the granted `history`
/// (each replayed into a fresh log whose clock starts at `start_us`).
fn reference(rules: &[Rule], start_us: u64, history: &[(u64, u64)], request: Request) -> Decision {
    let decisions: Vec<Decision> = rules
        .iter()
        .map(|&rule| {
            let clock = FakeClock::starting_at(Duration::from_micros(start_us));
            let log = SlidingWindowLog::new(rule, clock.clone()).unwrap();
            for &(at_us, n) in history {
                clock.set(Duration::from_micros(at_us));
                assert!(log.try_acquire_n(n).is_allowed(), "replay of a grant");
            }
            clock.set(Duration::from_micros(request.at_us));
            if request.peek {
                log.peek()
            } else {
                log.try_acquire_n(request.n)
            }
        })
        .collect();
    combined(&decisions)
}

/// Plays `requests` through a Redis sliding log of the plan `rules` (injected time) and through
/// in-process logs, requiring equal decisions at every step and each key to hold at most its
/// limit's batches.
async fn play(
    server: &RedisServer,
    connection: &mut ::redis::aio::MultiplexedConnection,
    client: &str,
    rules: &[Rule],
    start_us: u64,
    requests: &[Request],
) -> Result<(), String> {
    let redis = RedisRateLimiter::builder(server.url(), Algorithm::SlidingWindowLog)
        .timeout(DECISION_TIMEOUT)
        .plan_limits("plan", rules.iter().copied())
        .build()
        .await
        .unwrap();
    let keys = redis.keys(client, &"plan").unwrap();
    let mut granted: Vec<(u64, u64)> = Vec::new();
    for (i, &request) in requests.iter().enumerate() {
        let expected = reference(rules, start_us, &granted, request);
        let got = if request.peek {
            redis.peek_at(client, &"plan", request.at_us).await
        } else {
            redis
                .decide_at(client, &"plan", request.n, request.at_us)
                .await
        }
        .map_err(|error| format!("step {i}: {error}"))?
        .decision();
        if got != expected {
            return Err(format!(
                "step {i} ({request:?}) under {rules:?}:\n redis     {got:?}\n in-process {expected:?}\n history {:?}",
                &requests[..=i]
            ));
        }
        if !request.peek && request.n > 0 && got.is_allowed() {
            granted.push((request.at_us, request.n));
        }
        for (key, rule) in keys.iter().zip(rules) {
            let batches: u64 = connection.zcard(key).await.unwrap();
            if batches > rule.limit() {
                return Err(format!(
                    "step {i}: {key} holds {batches} batches, above its limit {}",
                    rule.limit()
                ));
            }
        }
    }
    Ok(())
}

fn random_rules(rng: &mut Rng) -> Vec<Rule> {
    const LIMITS: [u64; 9] = [1, 2, 3, 5, 8, 13, 20, 40, 100];
    const WINDOWS: [u64; 5] = [100_000, 250_000, 1_000_000, 3_000_000, 7_000_000];
    let count = 1 + rng.upto(2) as usize;
    let mut rules: Vec<Rule> = Vec::new();
    while rules.len() < count {
        let limit = LIMITS[rng.upto(LIMITS.len() as u64 - 1) as usize];
        let window = WINDOWS[rng.upto(WINDOWS.len() as u64 - 1) as usize];
        let rule = Rule::new(limit, Duration::from_micros(window)).unwrap();
        if !rules.contains(&rule) {
            rules.push(rule);
        }
    }
    rules
}

/// A history of 20 to 120 requests from `start_us`: equal instants, short and long waits,
/// steps back of up to two of the longest windows (never before `start_us`), batches from 0 to
/// the smallest limit, and peeks.
fn random_requests(rng: &mut Rng, rules: &[Rule], start_us: u64) -> Vec<Request> {
    let smallest = rules.iter().map(|rule| rule.limit()).min().unwrap();
    let shortest = rules
        .iter()
        .map(|r| r.window().as_micros() as u64)
        .min()
        .unwrap();
    let longest = rules
        .iter()
        .map(|r| r.window().as_micros() as u64)
        .max()
        .unwrap();
    let largest = rules.iter().map(|rule| rule.limit()).max().unwrap();
    let mut now = start_us;
    let length = 20 + rng.upto(100) as usize;
    (0..length)
        .map(|_| {
            let kind = rng.upto(99);
            now = match kind {
                0..=29 => now,
                30..=59 => now + rng.upto(shortest / largest + 1),
                60..=79 => now + rng.upto(shortest),
                80..=89 => now + rng.upto(2 * longest),
                _ => now.saturating_sub(rng.upto(2 * longest)).max(start_us),
            };
            let n = match rng.upto(9) {
                0 => 0,
                1..=6 => 1,
                _ => rng.upto(smallest),
            };
            Request {
                at_us: now,
                n,
                peek: rng.chance(10),
            }
        })
        .collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The sliding log script against in-process logs, one per limit, combined as the limiter
/// documents: seeded random plans of one to three limits and random histories.
#[test]
fn sliding_log_plans_of_several_limits_decide_as_in_process_logs_over_seeded_histories() {
    let server = RedisServer::start();
    let runtime = runtime();
    let cases: u64 = std::env::var("REVIEW_CASES")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(300);
    runtime.block_on(async {
        let mut connection = server.connection().await;
        let mut failures = Vec::new();
        for seed in 1..=cases {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let rules = random_rules(&mut rng);
            let start_us = 1_700_000_000 * SECOND_US + rng.upto(SECOND_US);
            let requests = random_requests(&mut rng, &rules, start_us);
            let client = format!("seed-{seed}");
            if let Err(failure) = play(
                &server,
                &mut connection,
                &client,
                &rules,
                start_us,
                &requests,
            )
            .await
            {
                failures.push(format!("seed {seed}: {failure}"));
            }
        }
        assert!(
            failures.is_empty(),
            "{} of {cases} histories differ; first:\n{}",
            failures.len(),
            failures[0]
        );
    });
}

/// Forty single admissions, then a wait that lets 30 of them leave (a commit drops 16), then
/// requests at one instant until refused, a step back, and requests after the rest leave: the
/// running totals of the batches kept must still count exactly.
#[test]
fn sliding_log_past_sixteen_expired_batches_counts_exactly() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let mut connection = server.connection().await;
        for rules in [
            vec![Rule::new(50, Duration::from_secs(1)).unwrap()],
            vec![
                Rule::new(50, Duration::from_secs(1)).unwrap(),
                Rule::new(45, Duration::from_millis(1_500)).unwrap(),
            ],
        ] {
            let start = 1_700_000_000 * SECOND_US;
            let mut requests: Vec<Request> = (0..40)
                .map(|i| Request {
                    at_us: start + i * 1_000,
                    n: 1,
                    peek: false,
                })
                .collect();
            // At start + 1 s + 29 ms the admissions of 0..=29 ms have left.
            let later = start + SECOND_US + 29_000;
            for (at_us, n, peek) in [
                (later, 1, false),
                (later, 0, false),
                (later, 1, true),
                (later, 5, false),
                (later, 5, false),
                (later, 3, false),
                (later, 3, false),
                (later, 1, false),
                (later - 400_000, 1, false),
                (later + 5_000, 2, false),
                (later + 20_000, 1, true),
                (later + 20_000, 7, false),
                (later + 2 * SECOND_US, 40, false),
                (later + 2 * SECOND_US, 1, true),
            ] {
                requests.push(Request { at_us, n, peek });
            }
            let client = format!("sixteen-{}", rules.len());
            play(&server, &mut connection, &client, &rules, start, &requests)
                .await
                .unwrap();
        }
    });
}

/// A key's DUMP and PTTL, or nothing for a missing key.
async fn snapshot(
    connection: &mut ::redis::aio::MultiplexedConnection,
    key: &str,
) -> (Option<Vec<u8>>, i64) {
    let dump: Option<Vec<u8>> = ::redis::cmd("DUMP")
        .arg(key)
        .query_async(connection)
        .await
        .unwrap();
    let ttl: i64 = connection.pttl(key).await.unwrap();
    (dump, ttl)
}

/// Whether two snapshots of one key show no write: the same value, and a TTL that only counted
/// down meanwhile (by less than 5 s), or the same absence of one.
fn unchanged(before: &(Option<Vec<u8>>, i64), after: &(Option<Vec<u8>>, i64)) -> bool {
    before.0 == after.0
        && if before.1 < 0 {
            before.1 == after.1
        } else {
            after.1 <= before.1 && before.1 - after.1 < 5_000
        }
}

/// Writes a value of a type `algorithm` does not read under `key`.
async fn write_foreign(
    connection: &mut ::redis::aio::MultiplexedConnection,
    algorithm: Algorithm,
    key: &str,
    kind: usize,
) -> &'static str {
    let _: () = connection.del(key).await.unwrap();
    match (kind, algorithm) {
        (0, _) => {
            let _: () = connection.set(key, "another program's").await.unwrap();
            "string"
        }
        (1, _) => {
            let _: () = connection.rpush(key, "a").await.unwrap();
            "list"
        }
        (_, Algorithm::SlidingWindowLog) => {
            let _: () = connection.hset(key, "f", "v").await.unwrap();
            "hash"
        }
        _ => {
            let _: () = connection.zadd(key, "m", 1).await.unwrap();
            "sorted set"
        }
    }
}

/// Another program's key at any place of a plan of three limits: every call is
/// `RedisError::WrongType` naming it, and no key of the plan changes, for every method, even
/// where the other limits would grant and commit; the errors never open the circuit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_key_anywhere_in_a_plan_is_named_and_nothing_is_written() {
    let server = RedisServer::start();
    let mut connection = server.connection().await;
    for algorithm in Algorithm::ALL {
        let redis = RedisRateLimiter::builder(server.url(), algorithm)
            .timeout(DECISION_TIMEOUT)
            .plan_limits(
                "plan",
                [
                    Rule::per_second(10).unwrap(),
                    Rule::per_minute(20).unwrap(),
                    Rule::new(30, Duration::from_secs(3_600)).unwrap(),
                ],
            )
            .circuit_breaker(CircuitBreaker {
                failures: 1,
                cool_down: Duration::from_secs(60),
            })
            .build()
            .await
            .unwrap();
        for foreign in 0..3 {
            for kind in 0..3 {
                let client = format!("victim-{foreign}-{kind}");
                let keys = redis.keys(&client, &"plan").unwrap();
                // Our own state in every key first, so that a commit would change each.
                assert!(redis.allow(&client, &"plan").await.unwrap());
                let what = write_foreign(&mut connection, algorithm, &keys[foreign], kind).await;
                let mut before = Vec::new();
                for key in &keys {
                    before.push(snapshot(&mut connection, key).await);
                }
                let now_us = {
                    let (seconds, micros): (u64, u64) = ::redis::cmd("TIME")
                        .query_async(&mut connection)
                        .await
                        .unwrap();
                    seconds * SECOND_US + micros
                };
                let calls: Vec<(&str, Result<Decision, RedisError>)> = vec![
                    ("acquire 1", redis.acquire(&client, &"plan", 1).await),
                    ("acquire 3", redis.acquire(&client, &"plan", 3).await),
                    ("acquire 0", redis.acquire(&client, &"plan", 0).await),
                    ("peek", redis.peek(&client, &"plan").await),
                    (
                        "decide_at",
                        redis
                            .decide_at(&client, &"plan", 1, now_us)
                            .await
                            .map(|answer| answer.decision()),
                    ),
                    (
                        "peek_at",
                        redis
                            .peek_at(&client, &"plan", now_us)
                            .await
                            .map(|answer| answer.decision()),
                    ),
                ];
                for (call, result) in calls {
                    match result {
                        Err(RedisError::WrongType { key }) => assert_eq!(
                            key, keys[foreign],
                            "{algorithm}, {call}: names the foreign {what}"
                        ),
                        other => {
                            panic!("{algorithm}, {call}, a {what} at limit {foreign}: {other:?}")
                        }
                    }
                }
                for (key, before) in keys.iter().zip(before) {
                    let after = snapshot(&mut connection, key).await;
                    assert!(
                        unchanged(&before, &after),
                        "{algorithm}: {key} changed beside a foreign {what} at limit {foreign}: \
                         {before:?} then {after:?}"
                    );
                }
            }
        }
        let answer = redis.decide("bystander", &"plan", 1).await.unwrap();
        assert_eq!(answer.source(), Source::Redis, "{algorithm}");
        assert_eq!(redis.stats().circuit_opens, 0, "{algorithm}");
    }
}

/// Another program's *sorted set* under a sliding log key (the type the log reads, so no
/// WRONGTYPE) makes the script raise a Lua error. That is the client's own error, naming its
/// key, under every policy: counted as a failed round trip, three requests of that one client
/// in a row opened the circuit for every client, and under `FailOpen` let everyone through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_clients_unreadable_log_is_its_own_error_and_opens_no_circuit() {
    let server = RedisServer::start();
    let mut connection = server.connection().await;
    let redis = RedisRateLimiter::builder(server.url(), Algorithm::SlidingWindowLog)
        .timeout(DECISION_TIMEOUT)
        .plan("free", Rule::per_minute(1).unwrap())
        .failure_policy(FailurePolicy::FailOpen)
        .build()
        .await
        .unwrap();
    let key = redis.keys("victim", &"free").unwrap().remove(0);
    let _: () = connection.zadd(&key, "not-a-batch", 1).await.unwrap();
    let mut sources = Vec::new();
    for _ in 0..5 {
        sources.push(redis.decide("victim", &"free", 1).await.map(|a| a.source()));
    }
    for source in &sources {
        assert!(
            matches!(source, Err(RedisError::UnreadableValue { keys, .. }) if keys.as_slice() == std::slice::from_ref(&key)),
            "the victim's own error, naming its key: {source:?}"
        );
    }
    assert_eq!(redis.stats().circuit_opens, 0);
    // The bystander has used its one permit a minute: Redis must deny the second.
    assert!(redis.allow("bystander", &"free").await.unwrap());
    let bystander = redis.decide("bystander", &"free", 1).await.unwrap();
    assert_eq!(
        (bystander.source(), bystander.decision().is_denied()),
        (Source::Redis, true),
        "a bystander after the victim's calls ({sources:?}); stats {:?}",
        redis.stats()
    );
}

/// The deny cache answers only the client, plan and permits it holds a denial for: fewer
/// permits, another plan and other clients go to Redis, in a cache of one bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deny_cache_answers_only_what_was_denied() {
    let server = RedisServer::start();
    for algorithm in Algorithm::ALL {
        for capacity in [1, 4, 100_000] {
            let redis = RedisRateLimiter::builder(server.url(), algorithm)
                .timeout(DECISION_TIMEOUT)
                .plan("a", Rule::per_minute(3).unwrap())
                .plan("b", Rule::per_minute(3).unwrap())
                .deny_cache(capacity)
                .key_prefix(format!("cache{capacity}"))
                .build()
                .await
                .unwrap();
            let answer = redis.decide("c", &"a", 2).await.unwrap();
            assert!(answer.decision().is_allowed());
            let denied = redis.decide("c", &"a", 2).await.unwrap();
            assert!(denied.decision().is_denied(), "{algorithm}");
            assert_eq!(denied.source(), Source::Redis);
            let fewer = redis.decide("c", &"a", 1).await.unwrap();
            assert_eq!(fewer.source(), Source::Redis, "{algorithm}: fewer permits");
            assert!(fewer.decision().is_allowed(), "{algorithm}: one was left");
            for n in [2, 3] {
                let more = redis.decide("c", &"a", n).await.unwrap();
                assert!(more.decision().is_denied());
                assert_eq!(more.source(), Source::DenyCache, "{algorithm}, {capacity}");
            }
            let other_plan = redis.decide("c", &"b", 3).await.unwrap();
            assert_eq!(other_plan.source(), Source::Redis, "{algorithm}: plan b");
            assert!(other_plan.decision().is_allowed());
            // Clients whose names could be confused with "c" under another plan index.
            for client in ["1:c", "0:c", "c ", ""] {
                let answer = redis.decide(client, &"a", 3).await.unwrap();
                assert_eq!(answer.source(), Source::Redis, "{algorithm}: {client:?}");
                assert!(answer.decision().is_allowed(), "{algorithm}: {client:?}");
            }
            // Many clients denied: whatever the cache keeps or drops, answers stay true.
            for i in 0..40 {
                let client = format!("many-{i}");
                assert!(
                    redis
                        .decide(&client, &"a", 3)
                        .await
                        .unwrap()
                        .decision()
                        .is_allowed()
                );
                assert!(
                    redis
                        .decide(&client, &"a", 1)
                        .await
                        .unwrap()
                        .decision()
                        .is_denied()
                );
            }
            for i in 0..80 {
                let client = format!("many-{i}");
                let answer = redis.decide(&client, &"a", 1).await.unwrap();
                assert_eq!(
                    answer.decision().is_denied(),
                    i < 40,
                    "{algorithm}: {client}"
                );
            }
        }
    }
}

/// Once the circuit is open and cooled down, exactly one request probes however many arrive
/// together; the rest are answered by the policy without a round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cooled_down_circuit_sends_one_probe_among_many_concurrent_requests() {
    let mut server = RedisServer::start();
    let cool_down = Duration::from_millis(200);
    let redis = Arc::new(
        RedisRateLimiter::builder(server.url(), Algorithm::TokenBucket)
            .plan("free", Rule::per_second(100).unwrap())
            .circuit_breaker(CircuitBreaker {
                failures: 2,
                cool_down,
            })
            .timeout(Duration::from_millis(100))
            .build()
            .await
            .unwrap(),
    );
    server.kill();
    let mut opened = false;
    for _ in 0..20 {
        if let Err(RedisError::CircuitOpen { .. }) = redis.decide("x", &"free", 1).await {
            opened = true;
            break;
        }
    }
    assert!(opened, "{:?}", redis.stats());
    for round in 0..3 {
        tokio::time::sleep(cool_down + Duration::from_millis(20)).await;
        let before = redis.stats().round_trips;
        let calls = (0..64).map(|i| {
            let redis = Arc::clone(&redis);
            tokio::spawn(async move { redis.decide(&format!("c{i}"), &"free", 1).await })
        });
        let results = futures_join(calls.collect()).await;
        let trips = redis.stats().round_trips - before;
        assert_eq!(trips, 1, "round {round}: {:?}", redis.stats());
        let open = results
            .iter()
            .filter(|result| matches!(result, Err(RedisError::CircuitOpen { .. })))
            .count();
        assert_eq!(open, 63, "round {round}: {results:?}");
    }
}

async fn futures_join<T>(handles: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut results = Vec::with_capacity(handles.len());
    for handle in handles {
        results.push(handle.await.unwrap());
    }
    results
}

/// On a cluster, a plan of several limits for clients whose names hold braces and colons: every
/// key of one client shares a slot, so each method decides (no CROSSSLOT) and keeps its limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_plans_of_several_limits_for_clients_named_with_braces() {
    let cluster = RedisCluster::start();
    for algorithm in Algorithm::ALL {
        let redis = RedisRateLimiter::builder(cluster.url(), algorithm)
            .timeout(DECISION_TIMEOUT)
            .plan_limits(
                "plan",
                [
                    Rule::per_minute(2).unwrap(),
                    Rule::new(3, Duration::from_secs(3_600)).unwrap(),
                ],
            )
            .build()
            .await
            .unwrap();
        for client in ["}", "{", "a}b{c", "{x}", "}{", ":{}:", "", "{plan:x}", "é}"] {
            for _ in 0..2 {
                let answer = redis.decide(client, &"plan", 1).await;
                assert!(
                    matches!(&answer, Ok(a) if a.decision().is_allowed()),
                    "{algorithm}, {client:?}: {answer:?}"
                );
            }
            let answer = redis.decide(client, &"plan", 1).await.unwrap();
            assert!(answer.decision().is_denied(), "{algorithm}, {client:?}");
        }
    }
}

/// The tower backend's names: texts that escape alike, and addresses written alike, stay
/// distinct clients in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tower_client_names_keep_distinct_keys_distinct_limits() {
    let server = RedisServer::start();
    let redis = RedisRateLimiter::builder(server.url(), Algorithm::FixedWindow)
        .timeout(DECISION_TIMEOUT)
        .plan("free", Rule::per_minute(1).unwrap())
        .build()
        .await
        .unwrap();
    let texts = ["a b", "a%20b", "a%2520b", "a\u{0}b", "a%00b", "{", "%7B"];
    let address: std::net::IpAddr = "1.2.3.4".parse().unwrap();
    let mapped: std::net::IpAddr = "::ffff:1.2.3.4".parse().unwrap();
    let mut names: Vec<String> = texts.iter().map(|text| text.client_name()).collect();
    names.push(address.client_name());
    names.push(mapped.client_name());
    for name in &names {
        assert!(
            redis.allow(name, &"free").await.unwrap(),
            "{name} shares a limit with an earlier name ({names:?})"
        );
    }
}

/// A log past 128 batches (Redis keeps it as a skip list, not a listpack): 300 single
/// admissions, 100 of them leaving, then batches deep into the log and refusals whose leaving
/// admission lies among hundreds of batches.
#[test]
fn sliding_log_of_hundreds_of_batches_decides_as_in_process() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let mut connection = server.connection().await;
        let rules = [Rule::new(500, Duration::from_secs(1)).unwrap()];
        let start = 1_700_000_000 * SECOND_US;
        let mut requests: Vec<Request> = (0..300)
            .map(|i| Request {
                at_us: start + i * 2_000,
                n: 1,
                peek: false,
            })
            .collect();
        let later = start + SECOND_US + 199_000;
        for (at_us, n, peek) in [
            (later, 250, false),
            (later, 60, false),
            (later, 1, true),
            (later, 50, false),
            (later + 1, 1, false),
            (later + 1_000, 1, false),
            (later + 10_000, 3, false),
            (later + 10_000, 1, true),
            (later + 150_000, 90, false),
            (later + 150_000, 1, true),
            (later - 300_000, 7, false),
            (later + 900_000, 500, false),
            (later + 3 * SECOND_US, 500, false),
            (later + 3 * SECOND_US, 0, false),
        ] {
            requests.push(Request { at_us, n, peek });
        }
        play(
            &server,
            &mut connection,
            "hundreds",
            &rules,
            start,
            &requests,
        )
        .await
        .unwrap();
    });
}

/// On the server's own clock, a log key expires when its newest batch leaves the window, and
/// not before: its TTL is at most the window (rounded up to a millisecond) after each grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_key_expires_with_its_newest_batch() {
    let server = RedisServer::start();
    let mut connection = server.connection().await;
    let window = Duration::from_millis(300);
    let redis = RedisRateLimiter::builder(server.url(), Algorithm::SlidingWindowLog)
        .timeout(DECISION_TIMEOUT)
        .plan("free", Rule::new(5, window).unwrap())
        .build()
        .await
        .unwrap();
    let key = redis.keys("ttl", &"free").unwrap().remove(0);
    for n in [1, 2, 1] {
        assert!(redis.acquire("ttl", &"free", n).await.unwrap().is_allowed());
        let ttl: i64 = connection.pttl(&key).await.unwrap();
        assert!(ttl > 250 && ttl <= 301, "TTL {ttl} ms after a grant");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(redis.acquire("ttl", &"free", 2).await.unwrap().is_denied());
    tokio::time::sleep(window + Duration::from_millis(20)).await;
    let exists: bool = connection.exists(&key).await.unwrap();
    assert!(!exists, "the log outlived its newest batch");
    assert!(redis.acquire("ttl", &"free", 5).await.unwrap().is_allowed());
}

/// With an injected time a step back joins the newest batch (its instant stands), and the key
/// is kept until that batch leaves: its TTL then covers the step back (plus the minute injected
/// times are kept longer), and a further grant past the window finds an empty log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_back_joins_the_newest_batch_and_the_key_lives_until_it_leaves() {
    let server = RedisServer::start();
    let mut connection = server.connection().await;
    let window_us = 2 * SECOND_US;
    let redis = RedisRateLimiter::builder(server.url(), Algorithm::SlidingWindowLog)
        .timeout(DECISION_TIMEOUT)
        .plan(
            "free",
            Rule::new(4, Duration::from_micros(window_us)).unwrap(),
        )
        .build()
        .await
        .unwrap();
    let key = redis.keys("back", &"free").unwrap().remove(0);
    let t = 1_700_000_000 * SECOND_US;
    let at = |n: u64, now: u64| redis.decide_at("back", &"free", n, now);
    assert!(
        at(1, t + window_us / 2)
            .await
            .unwrap()
            .decision()
            .is_allowed()
    );
    let joined = at(2, t).await.unwrap().decision();
    assert!(joined.is_allowed());
    assert_eq!(joined.remaining(), 1);
    assert_eq!(
        joined.reset_after(),
        Duration::from_micros(window_us * 3 / 2)
    );
    let batches: Vec<(String, u64)> = connection.zrange_withscores(&key, 0, -1).await.unwrap();
    assert_eq!(batches, vec![("3:3".to_owned(), t + window_us * 3 / 2)]);
    let ttl: i64 = connection.pttl(&key).await.unwrap();
    let expected = (window_us * 3 / 2 / 1_000) as i64 + 60_000;
    assert!(
        ttl > expected - 1_000 && ttl <= expected + 1,
        "TTL {ttl}, expected {expected}"
    );
    let denied = at(2, t).await.unwrap().decision();
    assert_eq!(
        denied.retry_after(),
        Duration::from_micros(window_us * 3 / 2)
    );
    assert!(
        at(4, t + window_us * 3 / 2)
            .await
            .unwrap()
            .decision()
            .is_allowed()
    );
}

/// A password holding a `/` (also `?`, `#` or `@`) left unencoded is never shown in an error's
/// text or its debug form: the redaction once ended the authority at the first `/`, inside the
/// password, and showed the URL whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_with_an_unencoded_slash_is_never_shown_in_errors() {
    let server = RedisServer::start();
    let port = server.port();
    let mut leaks = Vec::new();
    for scheme in ["redis", "redis+cluster"] {
        for password in ["pa/ssw0rd", "pa?ssw0rd", "pa#ssw0rd", "pa@ss/w0rd"] {
            let url = format!("{scheme}://user:{password}@127.0.0.1:{port}");
            let built = RedisRateLimiter::builder(url.clone(), Algorithm::TokenBucket)
                .plan("free", Rule::per_second(1).unwrap())
                .connect_timeout(Duration::from_millis(300))
                .build()
                .await;
            if let Err(error) = built {
                for shown in [error.to_string(), format!("{error:?}")] {
                    if shown.contains("w0rd") {
                        leaks.push(format!("{url}: {shown}"));
                    }
                }
            }
        }
    }
    assert!(
        leaks.is_empty(),
        "the password shows:\n{}",
        leaks.join("\n")
    );
}
