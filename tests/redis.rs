//! The Redis backend against a real `redis-server` (started per test on a free loopback port):
//! decisions equal to the in-process limiters', a fleet that never over-admits, keys that
//! expire, failure policies under a killed, paused and restarted server, and bad input.

mod redis_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ::redis::AsyncCommands;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redis_support::{DECISION_TIMEOUT, RedisServer};
use tollgate::redis::{
    CircuitBreaker, FailurePolicy, RedisError, RedisRateLimiter, RedisRateLimiterBuilder, Source,
};
use tollgate::{
    Algorithm, Decision, FakeClock, FixedWindow, Limiter, PlanError, Rule, SlidingWindowCounter,
    SlidingWindowLog, TokenBucket,
};

const ALGORITHMS: [Algorithm; 4] = Algorithm::ALL;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn limiter(
    server: &RedisServer,
    algorithm: Algorithm,
    rule: Rule,
) -> RedisRateLimiter<&'static str> {
    RedisRateLimiter::builder(server.url(), algorithm)
        .plan("free", rule)
        // These tests check decisions, not failures: a round trip slowed by a loaded machine
        // must not fail them (the fault tests below set their own timeouts).
        .timeout(DECISION_TIMEOUT)
        .build()
        .await
        .unwrap()
}

fn in_process(algorithm: Algorithm, rule: Rule, clock: FakeClock) -> Box<dyn Limiter> {
    match algorithm {
        Algorithm::TokenBucket => Box::new(TokenBucket::new(rule, clock).unwrap()),
        Algorithm::FixedWindow => Box::new(FixedWindow::new(rule, clock).unwrap()),
        Algorithm::SlidingWindowCounter => {
            Box::new(SlidingWindowCounter::new(rule, clock).unwrap())
        }
        _ => Box::new(SlidingWindowLog::new(rule, clock).unwrap()),
    }
}

/// One step of a history: wait `advance_us` (or, with `back`, step the clock back by as much,
/// as a server clock corrected by NTP would), then take `n` permits (or peek).
#[derive(Debug, Clone)]
struct Step {
    advance_us: u64,
    back: bool,
    n: u64,
    peek: bool,
}

/// Each request's `n` is drawn from `batches`.
fn history(
    limit: u64,
    window_us: u64,
    batches: BoxedStrategy<u64>,
) -> impl Strategy<Value = Vec<Step>> {
    // Waits from nothing to two windows, mostly short, so that histories both exhaust and refill.
    let advance = prop_oneof![
        3 => Just(0u64),
        4 => 0..=window_us / limit.max(1),
        2 => 0..=window_us * 2,
    ];
    let step = (
        advance,
        prop::bool::weighted(0.1),
        batches,
        prop::bool::weighted(0.1),
    )
        .prop_map(|(advance_us, back, n, peek)| Step {
            // The replay keeps the clock within one window behind its latest reading: the
            // token bucket script caps a debt beyond two windows (it denies either way, but
            // reports a shorter wait) where the in-process bucket keeps it whole.
            advance_us,
            back,
            n,
            peek,
        });
    prop::collection::vec(step, 1..40)
}

/// Windows in whole microseconds, some sharing few factors with the limit.
fn rule() -> impl Strategy<Value = Rule> {
    let window_us = prop_oneof![
        Just(100_000u64),
        Just(250_000),
        Just(1_000_000),
        Just(3_000_000),
        Just(7_000_000),
        Just(60_000_000),
    ];
    (1u64..=12, window_us)
        .prop_map(|(limit, window_us)| Rule::new(limit, Duration::from_micros(window_us)).unwrap())
}

/// Replays random histories with injected time through the Redis scripts and the in-process
/// limiter, and requires the same decision at every step.
fn equals_in_process(algorithm: Algorithm) {
    replay(algorithm, rule(), Just(0), |_, _| u64::MAX, 256);
}

/// [`equals_in_process`] for rules from `rules`, the clocks of both starting at a time from
/// `starts` (in microseconds since the Unix epoch, to which both align their windows) and never
/// passing `last(rule, start)`.
fn replay(
    algorithm: Algorithm,
    rules: impl Strategy<Value = Rule>,
    starts: impl Strategy<Value = u64>,
    last: impl Fn(Rule, u64) -> u64,
    cases: u32,
) {
    let any_batch = |limit: u64| (0..=limit + 1).boxed();
    replay_with(algorithm, rules, starts, last, any_batch, cases);
}

/// [`replay`], each request's `n` drawn from `batches(limit)` instead of any `n` up to the
/// limit + 1.
fn replay_with(
    algorithm: Algorithm,
    rules: impl Strategy<Value = Rule>,
    starts: impl Strategy<Value = u64>,
    last: impl Fn(Rule, u64) -> u64,
    batches: fn(u64) -> BoxedStrategy<u64>,
    cases: u32,
) {
    let server = RedisServer::start();
    let runtime = runtime();
    let case = AtomicU64::new(0);
    let strategy = (rules, starts).prop_flat_map(|(rule, start_us)| {
        let window_us = rule.window().as_micros() as u64;
        let steps = history(rule.limit(), window_us, batches(rule.limit()));
        (Just(rule), Just(start_us), steps)
    });
    let mut runner = TestRunner::new(Config::with_cases(cases));
    let result = runner.run(&strategy, |(rule, start_us, steps)| {
        if algorithm == Algorithm::TokenBucket
            && !TokenBucket::new(rule, FakeClock::new()).unwrap().is_exact()
        {
            // The in-process bucket rounds such rules; the script stays exact.
            return Ok(());
        }
        let client = format!("case-{}", case.fetch_add(1, Ordering::Relaxed));
        runtime.block_on(async {
            let redis = limiter(&server, algorithm, rule).await;
            let clock = FakeClock::starting_at(Duration::from_micros(start_us));
            let local = in_process(algorithm, rule, clock.clone());
            let mut now_us: u64 = start_us;
            let mut latest_us: u64 = start_us;
            let window_us = rule.window().as_micros() as u64;
            let last_us = last(rule, start_us);
            for (i, step) in steps.iter().enumerate() {
                now_us = if step.back {
                    // No further back than one window behind the latest reading (see `history`),
                    // nor before the window the in-process limiter started in (its time counts
                    // from there: an earlier reading is read as that window's start).
                    now_us
                        .saturating_sub(step.advance_us)
                        .max(latest_us.saturating_sub(window_us))
                        .max(start_us / window_us * window_us)
                } else {
                    (now_us + step.advance_us).min(last_us)
                };
                latest_us = latest_us.max(now_us);
                clock.set(Duration::from_micros(now_us));
                let (expected, got) = if step.peek {
                    let got = redis.peek_at(&client, &"free", now_us).await.unwrap();
                    (local.peek(), got)
                } else {
                    let got = redis
                        .decide_at(&client, &"free", step.n, now_us)
                        .await
                        .unwrap();
                    (local.try_acquire_n(step.n), got)
                };
                prop_assert_eq!(
                    got.decision(),
                    expected,
                    "step {} of {:?} under {:?} at {} us",
                    i,
                    steps,
                    rule,
                    now_us
                );
            }
            Ok::<(), TestCaseError>(())
        })
    });
    if let Err(error) = result {
        panic!("{error}");
    }
}

#[test]
fn token_bucket_script_decides_as_the_in_process_bucket() {
    equals_in_process(Algorithm::TokenBucket);
}

#[test]
fn fixed_window_script_decides_as_the_in_process_window() {
    equals_in_process(Algorithm::FixedWindow);
}

#[test]
fn sliding_log_script_decides_as_the_in_process_log() {
    equals_in_process(Algorithm::SlidingWindowLog);
}

/// Batches of up to the largest limit the log takes, small and large mixed so that many
/// batches are live at once and a refusal's leaving admission lies deep among them.
#[test]
fn sliding_log_script_decides_as_the_in_process_log_for_large_batches() {
    let max = SlidingWindowLog::<FakeClock>::MAX_LIMIT;
    let limit = prop_oneof![Just(max), 13u64..=5_000];
    let window_us = prop_oneof![Just(1_000_000u64), Just(7_000_000)];
    let rules = (limit, window_us)
        .prop_map(|(limit, window_us)| Rule::new(limit, Duration::from_micros(window_us)).unwrap());
    let batches = |limit: u64| {
        prop_oneof![
            1 => 0..=limit + 1,
            3 => 1..=limit / 10,
            1 => limit / 3..=limit / 2,
        ]
        .boxed()
    };
    replay_with(
        Algorithm::SlidingWindowLog,
        rules,
        Just(0),
        |_, _| u64::MAX,
        batches,
        64,
    );
}

#[test]
fn sliding_window_counter_script_decides_as_the_in_process_counter() {
    equals_in_process(Algorithm::SlidingWindowCounter);
}

/// The counter's products of a count and a time pass 2^53 (the script never forms them): large
/// limits, windows up to the longest the scripts take, prime ones among them, and times of today
/// since the Unix epoch, to which both align their windows.
#[test]
fn sliding_window_counter_script_stays_exact_past_2_to_the_53() {
    let window_us = prop_oneof![
        Just(999_999_937u64),
        Just(86_400_000_000),
        Just(1 << 42),
        Just(tollgate::redis::RedisRateLimiter::<&str>::MAX_WINDOW_MICROS),
    ];
    let limit = prop_oneof![
        Just(999_983u64),
        1u64..=1 << 16,
        1u64 << 20..=1 << 28,
        Just((1 << 30) - 1),
    ];
    let rules = (limit, window_us)
        .prop_map(|(limit, window_us)| Rule::new(limit, Duration::from_micros(window_us)).unwrap())
        .prop_filter("a rule the in-process counter keeps", |&rule| {
            SlidingWindowCounter::new(rule, FakeClock::new()).is_ok()
        });
    // 2025 to 2027.
    let starts = 1_735_689_600_000_000u64..1_798_761_600_000_000;
    // The clock stays where the script's integers are exact (the window after next starts
    // before 2^53 us), and two windows before the in-process counter's horizon (2^(63 - 2
    // bits(N)) windows from the start of the first), past which its time stands still and the
    // instants it reports never come.
    let last = |rule: Rule, start_us: u64| {
        let window_us = rule.window().as_micros() as u64;
        let index_bits = 63 - 2 * (u64::BITS - rule.limit().leading_zeros());
        let horizon_us = 1u64
            .checked_shl(index_bits)
            .and_then(|windows| (windows - 2).checked_mul(window_us))
            .and_then(|span| span.checked_add(start_us / window_us * window_us))
            .unwrap_or(u64::MAX);
        ((1u64 << 53) - 2 * window_us).min(horizon_us) - 1
    };
    replay(Algorithm::SlidingWindowCounter, rules, starts, last, 128);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_admits_exactly_the_limit_over_a_long_window() {
    let server = RedisServer::start();
    // The run takes well under a second: the counter's requests fall in one aligned hour, or
    // straddle an edge where the earlier hour's permits still weigh in full.
    for algorithm in ALGORITHMS {
        let rule = Rule::per_hour(100).unwrap();
        let mut nodes = Vec::new();
        for _ in 0..4 {
            nodes.push(Arc::new(limiter(&server, algorithm, rule).await));
        }
        let admitted = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for node in &nodes {
            for _ in 0..8 {
                let node = Arc::clone(node);
                let admitted = Arc::clone(&admitted);
                tasks.push(tokio::spawn(async move {
                    for _ in 0..50 {
                        if node.allow("shared-client", &"free").await.unwrap() {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }));
            }
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(
            admitted.load(Ordering::Relaxed),
            100,
            "{algorithm}: 1600 requests over 4 nodes"
        );
        // Every key the fleet left carries an expiry.
        let mut connection = server.connection().await;
        let keys: Vec<String> = connection.keys("tollgate:*").await.unwrap();
        assert!(!keys.is_empty());
        for key in keys {
            let ttl: i64 = connection.pttl(&key).await.unwrap();
            assert!(ttl > 0, "{key} has no expiry (PTTL {ttl})");
            let _: () = connection.del(&key).await.unwrap();
        }
    }
}

/// `connections(4)`: concurrent round trips spread over four connections to the server (its
/// `CLIENT LIST` shows them), and the fleet still admits exactly the limit; 0, more than the
/// most, and more than one for a cluster are refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_spread_over_several_connections_keep_the_limit() {
    let server = RedisServer::start();
    let mut inspect = server.connection().await;
    let clients_before = client_count(&mut inspect).await;
    let redis = Arc::new(
        RedisRateLimiter::builder(server.url(), Algorithm::SlidingWindowLog)
            .timeout(DECISION_TIMEOUT)
            .plan("free", Rule::per_hour(40).unwrap())
            .connections(4)
            .deny_cache(0)
            .build()
            .await
            .unwrap(),
    );
    let admitted = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (redis, admitted) = (Arc::clone(&redis), Arc::clone(&admitted));
            tokio::spawn(async move {
                for _ in 0..5 {
                    if redis.allow("shared-client", &"free").await.unwrap() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(
        admitted.load(Ordering::Relaxed),
        40,
        "80 requests, limit 40"
    );
    assert_eq!(
        client_count(&mut inspect).await - clients_before,
        4,
        "the limiter's connections"
    );

    for (connections, url) in [
        (0, server.url()),
        (
            RedisRateLimiterBuilder::<&str>::MAX_CONNECTIONS + 1,
            server.url(),
        ),
        (2, "redis+cluster://127.0.0.1:1".to_owned()),
    ] {
        let error = RedisRateLimiter::builder(url, Algorithm::TokenBucket)
            .plan("free", Rule::per_hour(40).unwrap())
            .connections(connections)
            .build_lazy()
            .unwrap_err();
        assert!(
            matches!(
                error,
                RedisError::InvalidSetting {
                    field: "connections",
                    ..
                }
            ),
            "{connections}: {error:?}"
        );
        assert!(
            error
                .to_string()
                .contains(&format!("connections {connections}")),
            "{error}"
        );
    }
}

/// How many clients the server has connected.
async fn client_count(connection: &mut ::redis::aio::MultiplexedConnection) -> usize {
    let list: String = ::redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(connection)
        .await
        .unwrap();
    list.lines().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_expire_once_indistinguishable_from_fresh() {
    let server = RedisServer::start();
    let mut connection = server.connection().await;
    for algorithm in ALGORITHMS {
        let rule = Rule::new(3, Duration::from_millis(200)).unwrap();
        let redis = limiter(&server, algorithm, rule).await;
        assert!(redis.allow("brief", &"free").await.unwrap());
        let key = redis.keys("brief", &"free").unwrap().remove(0);
        let ttl: i64 = connection.pttl(&key).await.unwrap();
        // The counter's permit still weighs through the next window: its key lasts until then,
        // and no longer.
        let (shortest, longest) = if algorithm == Algorithm::SlidingWindowCounter {
            (200, 401)
        } else {
            (0, 201)
        };
        assert!(
            ttl > shortest && ttl <= longest,
            "{algorithm}: {key} PTTL {ttl}"
        );
        tokio::time::sleep(Duration::from_millis(longest as u64 + 150)).await;
        let exists: bool = connection.exists(&key).await.unwrap();
        assert!(!exists, "{algorithm}: {key} outlived its window");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_writes_nothing() {
    let server = RedisServer::start();
    let mut connection = server.connection().await;
    for algorithm in ALGORITHMS {
        let rule = Rule::per_hour(2).unwrap();
        let redis = RedisRateLimiter::builder(server.url(), algorithm)
            .timeout(DECISION_TIMEOUT)
            .plan("free", rule)
            .deny_cache(0)
            .build()
            .await
            .unwrap();
        assert!(redis.allow("full", &"free").await.unwrap());
        assert!(redis.allow("full", &"free").await.unwrap());
        let key = redis.keys("full", &"free").unwrap().remove(0);
        let before: Vec<u8> = ::redis::cmd("DUMP")
            .arg(&key)
            .query_async(&mut connection)
            .await
            .unwrap();
        for _ in 0..5 {
            let answer = redis.decide("full", &"free", 1).await.unwrap();
            assert!(answer.decision().is_denied());
            assert_eq!(answer.source(), Source::Redis);
        }
        let after: Vec<u8> = ::redis::cmd("DUMP")
            .arg(&key)
            .query_async(&mut connection)
            .await
            .unwrap();
        assert_eq!(before, after, "{algorithm}: a denial changed {key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_with_several_limits_takes_from_all_or_none() {
    let server = RedisServer::start();
    let mut connection = server.connection().await;
    for algorithm in ALGORITHMS {
        let per_second = Rule::per_second(3).unwrap();
        let per_minute = Rule::per_minute(5).unwrap();
        let redis = RedisRateLimiter::builder(server.url(), algorithm)
            .timeout(DECISION_TIMEOUT)
            .plan_limits("free", [per_second, per_minute])
            .build()
            .await
            .unwrap();
        let keys = redis.keys("multi", &"free").unwrap();
        let at = |us: u64| redis.decide_at("multi", &"free", 1, us);
        // Second 0: the per-second limit denies the fourth; the per-minute one is not charged.
        for _ in 0..3 {
            assert!(at(0).await.unwrap().decision().is_allowed(), "{algorithm}");
        }
        let minute_before: Vec<u8> = ::redis::cmd("DUMP")
            .arg(&keys[1])
            .query_async(&mut connection)
            .await
            .unwrap();
        let denied = at(0).await.unwrap().decision();
        assert!(denied.is_denied());
        assert_eq!(
            denied.limit(),
            3,
            "{algorithm}: the per-second limit denied"
        );
        let minute_after: Vec<u8> = ::redis::cmd("DUMP")
            .arg(&keys[1])
            .query_async(&mut connection)
            .await
            .unwrap();
        assert_eq!(
            minute_before, minute_after,
            "{algorithm}: a denial charged the other limit"
        );
        // Second 2 (in second 1 the counter still weighs second 0's three): two more reach the
        // per-minute limit, which then denies.
        assert!(at(2_000_000).await.unwrap().decision().is_allowed());
        assert!(at(2_000_000).await.unwrap().decision().is_allowed());
        let denied = at(3_000_000).await.unwrap().decision();
        assert!(denied.is_denied());
        assert_eq!(
            denied.limit(),
            5,
            "{algorithm}: the per-minute limit denied"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_stepped_back_grants_nothing_extra() {
    let server = RedisServer::start();
    for algorithm in ALGORITHMS {
        let redis = limiter(&server, algorithm, Rule::per_second(2).unwrap()).await;
        let later = 10_000_000;
        assert!(
            redis
                .decide_at("skew", &"free", 1, later)
                .await
                .unwrap()
                .decision()
                .is_allowed()
        );
        assert!(
            redis
                .decide_at("skew", &"free", 1, later)
                .await
                .unwrap()
                .decision()
                .is_allowed()
        );
        // Earlier readings meet the stored state, not a fresh one.
        for earlier in [later - 1, later - 2_000_000, 0] {
            let decision = redis
                .decide_at("skew", &"free", 1, earlier)
                .await
                .unwrap()
                .decision();
            assert!(
                decision.is_denied(),
                "{algorithm} at {earlier} us: {decision:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deny_cache_answers_without_a_round_trip_until_the_retry_instant() {
    let server = RedisServer::start();
    for algorithm in ALGORITHMS {
        let redis = limiter(
            &server,
            algorithm,
            Rule::new(1, Duration::from_millis(300)).unwrap(),
        )
        .await;
        assert!(redis.allow("cached", &"free").await.unwrap());
        let first = redis.decide("cached", &"free", 1).await.unwrap();
        assert_eq!(first.source(), Source::Redis);
        assert!(first.decision().is_denied());
        let trips = redis.stats().round_trips;
        for _ in 0..100 {
            let answer = redis.decide("cached", &"free", 1).await.unwrap();
            assert_eq!(answer.source(), Source::DenyCache, "{algorithm}");
            assert!(answer.decision().retry_after() <= first.decision().retry_after());
        }
        assert_eq!(redis.stats().round_trips, trips);
        assert_eq!(redis.stats().cache_hits, 100);
        // Once the wait is over Redis is asked again, and grants.
        tokio::time::sleep(first.decision().retry_after() + Duration::from_millis(5)).await;
        let answer = redis.decide("cached", &"free", 1).await.unwrap();
        assert_eq!(answer.source(), Source::Redis);
        assert!(answer.decision().is_allowed(), "{algorithm}: {answer:?}");
    }
}

async fn faulty(server: &RedisServer, policy: FailurePolicy) -> RedisRateLimiter<&'static str> {
    RedisRateLimiter::builder(server.url(), Algorithm::TokenBucket)
        .plan("free", Rule::per_second(1_000).unwrap())
        .failure_policy(policy)
        .timeout(Duration::from_millis(50))
        .circuit_breaker(CircuitBreaker {
            failures: 3,
            cool_down: Duration::from_millis(200),
        })
        .build()
        .await
        .unwrap()
}

/// Asks until Redis answers again (the circuit's probe), within a few seconds.
async fn until_redis_answers(redis: &RedisRateLimiter<&'static str>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(answer) = redis.decide("resumed", &"free", 1).await
            && answer.source() == Source::Redis
        {
            return;
        }
        assert!(Instant::now() < deadline, "Redis was not used again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_policy_answers_as_promised_when_the_server_dies_and_resumes_after_a_restart() {
    let mut server = RedisServer::start();
    let policies = [
        FailurePolicy::Error,
        FailurePolicy::FailOpen,
        FailurePolicy::FailClosed,
        FailurePolicy::Local { share: 0.5 },
    ];
    let mut limiters = Vec::new();
    for policy in policies {
        let redis = faulty(&server, policy).await;
        assert_eq!(
            redis.decide("c", &"free", 1).await.unwrap().source(),
            Source::Redis
        );
        limiters.push(redis);
    }
    server.kill();
    for redis in &limiters {
        for _ in 0..20 {
            let started = Instant::now();
            let answer = redis.decide("c", &"free", 1).await;
            assert!(
                started.elapsed() < Duration::from_secs(1),
                "a dead Redis held a request"
            );
            match (redis.failure_policy(), answer) {
                (FailurePolicy::Error, Err(error)) => assert!(
                    matches!(
                        error,
                        RedisError::Command { .. }
                            | RedisError::Timeout { .. }
                            | RedisError::CircuitOpen { .. }
                    ),
                    "{error}"
                ),
                (FailurePolicy::FailOpen, Ok(answer)) => {
                    assert_eq!(answer.source(), Source::FailOpen);
                    assert!(answer.decision().is_allowed());
                }
                (FailurePolicy::FailClosed, Ok(answer)) => {
                    assert_eq!(answer.source(), Source::FailClosed);
                    assert!(answer.decision().is_denied());
                }
                (FailurePolicy::Local { .. }, Ok(answer)) => {
                    assert_eq!(answer.source(), Source::Local);
                    assert_eq!(answer.decision().limit(), 500, "half the limit");
                }
                (policy, answer) => panic!("{policy:?} answered {answer:?}"),
            }
        }
        let stats = redis.stats();
        assert!(stats.circuit_opens >= 1, "{stats:?}");
        assert!(
            stats.short_circuits > 0,
            "the open circuit still sent requests: {stats:?}"
        );
    }
    server.restart();
    for redis in &limiters {
        // The restarted server has no scripts loaded: NOSCRIPT, then a reload, then an answer.
        until_redis_answers(redis).await;
        assert!(redis.allow("after", &"free").await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_costs_at_most_the_timeout_then_nothing_until_it_resumes() {
    let server = RedisServer::start();
    let redis = faulty(&server, FailurePolicy::Local { share: 0.25 }).await;
    assert!(redis.allow("p", &"free").await.unwrap());
    server.pause();
    let started = Instant::now();
    for _ in 0..50 {
        let asked = Instant::now();
        let answer = redis.decide("p", &"free", 1).await.unwrap();
        let elapsed = asked.elapsed();
        assert!(elapsed < Duration::from_millis(500), "held {elapsed:?}");
        assert_eq!(answer.source(), Source::Local);
    }
    // Three timeouts open the circuit; afterwards only a probe every 200 ms waits for one.
    let stats = redis.stats();
    let probes = started.elapsed().as_millis() as u64 / 200 + 1;
    assert!(stats.timeouts >= 3, "{stats:?}");
    assert!(
        stats.timeouts <= 3 + probes,
        "{stats:?} in {:?}",
        started.elapsed()
    );
    assert!(stats.short_circuits >= 50 - 3 - probes, "{stats:?}");
    server.resume();
    until_redis_answers(&redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_a_clear_error_or_the_policy() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let error = RedisRateLimiter::builder(url.clone(), Algorithm::FixedWindow)
        .plan("free", Rule::per_second(5).unwrap())
        .build()
        .await
        .unwrap_err();
    assert!(matches!(error, RedisError::Connect { .. }), "{error:?}");
    assert!(error.to_string().contains(&url), "{error}");
    // Built lazily, the policy decides until Redis appears.
    let redis = RedisRateLimiter::builder(url, Algorithm::FixedWindow)
        .plan("free", Rule::per_second(5).unwrap())
        .failure_policy(FailurePolicy::FailClosed)
        .build_lazy()
        .unwrap();
    let answer = redis.decide("c", &"free", 1).await.unwrap();
    assert_eq!(answer.source(), Source::FailClosed);
    assert!(answer.decision().is_denied());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_an_authentication_error_that_hides_the_password() {
    let server = RedisServer::start_with(&["--requirepass", "right-one"]);
    let url = format!("redis://:wrong-one@127.0.0.1:{}", server.port());
    let error = RedisRateLimiter::builder(url, Algorithm::TokenBucket)
        .plan("free", Rule::per_second(5).unwrap())
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(error, RedisError::Authentication { .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(!message.contains("wrong-one"), "{message}");
    assert!(message.contains("password"), "{message}");
    let url = format!("redis://:right-one@127.0.0.1:{}", server.port());
    let redis = RedisRateLimiter::builder(url, Algorithm::TokenBucket)
        .timeout(DECISION_TIMEOUT)
        .plan("free", Rule::per_second(5).unwrap())
        .build()
        .await
        .unwrap();
    assert!(redis.allow("c", &"free").await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_type_is_a_typed_error_and_left_alone() {
    let server = RedisServer::start();
    let mut connection = server.connection().await;
    for algorithm in ALGORITHMS {
        let redis = limiter(&server, algorithm, Rule::per_second(5).unwrap()).await;
        let key = redis.keys("squatted", &"free").unwrap().remove(0);
        // A string where a hash (or sorted set) is expected; for the bucket, itself a string, one
        // that is no bucket.
        let _: () = connection.set(&key, "not ours").await.unwrap();
        let error = redis.acquire("squatted", &"free", 1).await.unwrap_err();
        match &error {
            RedisError::WrongType { key: named } => assert_eq!(*named, key),
            other => panic!("{algorithm}: {other:?}"),
        }
        assert!(error.to_string().contains(&key));
        let value: String = connection.get(&key).await.unwrap();
        assert_eq!(value, "not ours");
        let _: () = connection.del(&key).await.unwrap();
        // A hash where a string or a sorted set is expected (the bucket's read raises
        // WRONGTYPE itself).
        if !matches!(
            algorithm,
            Algorithm::TokenBucket | Algorithm::SlidingWindowLog
        ) {
            continue;
        }
        let _: () = connection.hset(&key, "t", "1").await.unwrap();
        let error = redis.acquire("squatted", &"free", 1).await.unwrap_err();
        match &error {
            RedisError::WrongType { key: named } => assert_eq!(*named, key),
            other => panic!("{algorithm}, hash: {other:?}"),
        }
        let value: String = connection.hget(&key, "t").await.unwrap();
        assert_eq!(value, "1");
        let _: () = connection.del(&key).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_the_scripts_cannot_keep_exact_are_refused_by_name() {
    let build = |algorithm, rule| {
        RedisRateLimiter::builder("redis://127.0.0.1:1", algorithm)
            .plan("free", rule)
            .build_lazy()
    };
    let sub_micro = Rule::new(5, Duration::from_nanos(1_500)).unwrap();
    let error = build(Algorithm::FixedWindow, sub_micro).unwrap_err();
    assert!(
        matches!(error, RedisError::WindowNotMicroseconds { .. }),
        "{error:?}"
    );
    // A prime limit per day: N * W_us ticks, far above 2^50.
    let prime_per_day = Rule::new(999_983, Duration::from_secs(86_400)).unwrap();
    let error = build(Algorithm::TokenBucket, prime_per_day).unwrap_err();
    assert!(matches!(error, RedisError::NotExact { .. }), "{error:?}");
    assert!(error.to_string().contains("1125899906842624"), "{error}");
    let huge_log = Rule::per_hour(1 << 20).unwrap();
    let error = build(Algorithm::SlidingWindowLog, huge_log).unwrap_err();
    assert!(
        matches!(error, RedisError::Plan(PlanError::InvalidRule { .. })),
        "{error:?}"
    );
    // The counter's bound on its limit (below 2^31) keeps its script's products exact.
    let huge_counter = Rule::per_hour(1 << 31).unwrap();
    let error = build(Algorithm::SlidingWindowCounter, huge_counter).unwrap_err();
    assert!(
        matches!(error, RedisError::Plan(PlanError::InvalidRule { .. })),
        "{error:?}"
    );
    let error = build(Algorithm::SlidingWindowCounter, sub_micro).unwrap_err();
    assert!(
        matches!(error, RedisError::WindowNotMicroseconds { .. }),
        "{error:?}"
    );
    let error = RedisRateLimiter::builder("redis://127.0.0.1:1", Algorithm::FixedWindow)
        .plan("free:tier", Rule::per_second(1).unwrap())
        .build_lazy()
        .unwrap_err();
    assert!(matches!(error, RedisError::InvalidName { .. }), "{error:?}");
    let error = RedisRateLimiter::builder("redis://127.0.0.1:1", Algorithm::FixedWindow)
        .plan("free", Rule::per_second(1).unwrap())
        .failure_policy(FailurePolicy::Local { share: 0.0 })
        .build_lazy()
        .unwrap_err();
    assert!(error.to_string().contains("local share 0"), "{error}");
    let error = RedisRateLimiter::<&str>::builder("not a url", Algorithm::FixedWindow)
        .plan("free", Rule::per_second(1).unwrap())
        .build_lazy()
        .unwrap_err();
    assert!(matches!(error, RedisError::InvalidUrl { .. }), "{error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_limits_above_2_to_the_53_are_refused_and_2_to_the_53_is_exact() {
    let window = Duration::from_secs(30 * 86_400);
    // 2^53 + 3 reads as 2^53 + 4 in Lua: it used to report more remaining than the limit.
    for limit in [(1 << 53) + 1, (1 << 53) + 3] {
        let rule = Rule::new(limit, window).unwrap();
        let error = RedisRateLimiter::builder("redis://127.0.0.1:1", Algorithm::FixedWindow)
            .plan("free", rule)
            .build_lazy()
            .unwrap_err();
        assert!(
            matches!(
                error,
                RedisError::NotExact { value, max, .. }
                    if value == u128::from(limit) && max == 1 << 53
            ),
            "{limit}: {error:?}"
        );
        assert!(error.to_string().contains("9007199254740992"), "{error}");
        assert!(error.to_string().contains("pick a lower limit"), "{error}");
    }

    // The largest limit accepted, and exact: a count of 1 plus a request of 2^53 is 2^53 + 1,
    // which a double rounds to 2^53, yet it is denied, as in process.
    let server = RedisServer::start();
    let limit: u64 = 1 << 53;
    let rule = Rule::new(limit, window).unwrap();
    let redis = limiter(&server, Algorithm::FixedWindow, rule).await;
    let now_us: u64 = 1_700_000_000_000_000;
    let clock = FakeClock::starting_at(Duration::from_micros(now_us));
    let local = FixedWindow::new(rule, clock).unwrap();
    let peek = redis
        .peek_at("big", &"free", now_us)
        .await
        .unwrap()
        .decision();
    assert_eq!(peek, local.peek());
    assert_eq!(peek.remaining(), limit);
    for (n, allowed, remaining) in [
        (1, true, limit - 1),
        (limit, false, limit - 1),
        (limit - 1, true, 0),
        (1, false, 0),
    ] {
        let got = redis
            .decide_at("big", &"free", n, now_us)
            .await
            .unwrap()
            .decision();
        assert_eq!(got, local.try_acquire_n(n), "{n}");
        assert_eq!(
            (got.is_allowed(), got.remaining()),
            (allowed, remaining),
            "{n}: {got:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sliding_log_grants_batches_as_in_process() {
    let server = RedisServer::start();
    let rule = Rule::per_second(5).unwrap();
    let redis = limiter(&server, Algorithm::SlidingWindowLog, rule).await;
    let now_us: u64 = 1_700_000_000_000_000;
    let local =
        SlidingWindowLog::new(rule, FakeClock::starting_at(Duration::from_micros(now_us))).unwrap();
    for (n, allowed, remaining) in [(3, true, 2), (3, false, 2), (2, true, 0)] {
        let got = redis
            .decide_at("batch", &"free", n, now_us)
            .await
            .unwrap()
            .decision();
        assert_eq!(got, local.try_acquire_n(n), "{n}");
        assert_eq!(
            (got.is_allowed(), got.remaining()),
            (allowed, remaining),
            "{n}: {got:?}"
        );
    }
}

/// The longest `EVALSHA` in the server's slow log, in microseconds.
async fn slowest_script_micros(connection: &mut ::redis::aio::MultiplexedConnection) -> i64 {
    let entries: Vec<::redis::Value> = ::redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(128)
        .query_async(connection)
        .await
        .unwrap();
    entries
        .iter()
        .filter_map(|entry| match entry {
            ::redis::Value::Array(fields) => match (fields.get(2), fields.get(3)) {
                (Some(::redis::Value::Int(micros)), Some(::redis::Value::Array(argv)))
                    if matches!(argv.first(), Some(::redis::Value::BulkString(name))
                        if name.eq_ignore_ascii_case(b"evalsha")) =>
                {
                    Some(*micros)
                }
                _ => None,
            },
            _ => None,
        })
        .max()
        .expect("an EVALSHA in the slow log")
}

/// A request of the largest `n` is one batch: it takes well under a millisecond of server time
/// (the fastest of three, so that a busy machine's preemption is not counted) and leaves a key
/// of a few dozen bytes; the next request is refused until that batch leaves, exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_log_request_of_the_largest_n_is_one_small_batch_and_blocks_no_one() {
    let server = RedisServer::start();
    let mut connection = server.connection().await;
    let max = SlidingWindowLog::<FakeClock>::MAX_LIMIT;
    let rule = Rule::per_hour(max).unwrap();
    let redis = limiter(&server, Algorithm::SlidingWindowLog, rule).await;
    let _: () = ::redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(0)
        .query_async(&mut connection)
        .await
        .unwrap();
    let mut fastest = i64::MAX;
    for client in ["a", "b", "c"] {
        let _: () = ::redis::cmd("SLOWLOG")
            .arg("RESET")
            .query_async(&mut connection)
            .await
            .unwrap();
        let granted = redis.acquire(client, &"free", max).await.unwrap();
        assert!(granted.is_allowed(), "{granted:?}");
        assert_eq!(granted.remaining(), 0);
        fastest = fastest.min(slowest_script_micros(&mut connection).await);
        let key = redis.keys(client, &"free").unwrap().remove(0);
        let bytes: u64 = ::redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&key)
            .query_async(&mut connection)
            .await
            .unwrap();
        assert!(bytes < 256, "{bytes} bytes");
        let refused = redis.acquire(client, &"free", 1).await.unwrap();
        assert!(refused.is_denied());
        // The batch leaves a window after it was admitted: within the last second of an hour.
        let wait = refused.retry_after();
        assert!(
            wait <= Duration::from_secs(3600) && wait > Duration::from_secs(3599),
            "{wait:?}"
        );
    }
    assert!(fastest < 1_000, "{fastest} us");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_can_never_pass_report_the_quota_and_unknown_plans_need_no_round_trip() {
    let server = RedisServer::start();
    let redis = limiter(
        &server,
        Algorithm::SlidingWindowLog,
        Rule::per_second(5).unwrap(),
    )
    .await;
    let error = redis.acquire("c", &"pro", 1).await.unwrap_err();
    assert!(matches!(error, RedisError::UnknownPlan { .. }), "{error:?}");
    assert_eq!(redis.stats().round_trips, 0);
    assert!(redis.allow("c", &"free").await.unwrap());
    let answer = redis.decide("c", &"free", 6).await.unwrap();
    assert_eq!(answer.source(), Source::Rejected);
    assert!(answer.decision().rejection().is_some());
    assert_eq!(answer.decision().remaining(), 4, "the real quota");
    let _: Decision = redis.peek("c", &"free").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plans_keys_share_one_cluster_slot_so_its_script_runs_on_a_cluster() {
    let dir = std::env::temp_dir().join(format!("tollgate-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let server =
        RedisServer::start_with(&["--cluster-enabled", "yes", "--dir", dir.to_str().unwrap()]);
    let mut connection = server.connection().await;
    // One node holding every slot: a cluster that still refuses a script whose keys span slots.
    let _: () = ::redis::cmd("CLUSTER")
        .arg("ADDSLOTSRANGE")
        .arg(0)
        .arg(16_383)
        .query_async(&mut connection)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info: String = ::redis::cmd("CLUSTER")
            .arg("INFO")
            .query_async(&mut connection)
            .await
            .unwrap();
        if info.contains("cluster_state:ok") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cluster never came up: {info}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let crossing = ::redis::cmd("EVAL")
        .arg("return 1")
        .arg(2)
        .arg("a")
        .arg("b")
        .query_async::<i64>(&mut connection)
        .await
        .unwrap_err();
    assert!(
        crossing.to_string().to_lowercase().contains("crossslot"),
        "{crossing}"
    );
    for algorithm in ALGORITHMS {
        let redis = RedisRateLimiter::builder(server.url(), algorithm)
            .timeout(DECISION_TIMEOUT)
            .plan_limits(
                "free",
                [Rule::per_second(3).unwrap(), Rule::per_minute(5).unwrap()],
            )
            .build()
            .await
            .unwrap();
        for _ in 0..3 {
            assert!(redis.allow("alice", &"free").await.unwrap(), "{algorithm}");
        }
        assert!(!redis.allow("alice", &"free").await.unwrap(), "{algorithm}");
        let mut slots = Vec::new();
        for key in redis.keys("alice", &"free").unwrap() {
            let slot: i64 = ::redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(&key)
                .query_async(&mut connection)
                .await
                .unwrap();
            slots.push(slot);
        }
        assert_eq!(slots.len(), 2);
        assert_eq!(slots[0], slots[1], "{algorithm}");
    }
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_falling_back_locally_keeps_to_the_limit_by_its_shares() {
    // No server at all: every node decides alone, with a quarter of the limit.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for algorithm in ALGORITHMS {
        let mut admitted = 0;
        for _ in 0..4 {
            let node = RedisRateLimiter::builder(format!("redis://127.0.0.1:{port}"), algorithm)
                .plan("free", Rule::per_hour(100).unwrap())
                .failure_policy(FailurePolicy::Local { share: 0.25 })
                .build_lazy()
                .unwrap();
            for _ in 0..100 {
                let answer = node.decide("shared", &"free", 1).await.unwrap();
                assert_eq!(answer.source(), Source::Local);
                admitted += u64::from(answer.decision().is_allowed());
            }
        }
        assert_eq!(admitted, 100, "{algorithm}");
    }
}
