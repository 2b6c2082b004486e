//! The Redis backend's circuit breaker against a real `redis-server`: 64 tasks hammering a
//! healthy server never open it, a killed server opens it within the time its docs state, and a
//! restarted one closes it after a probe.

mod redis_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis_support::RedisServer;
use tollgate::redis::{CircuitBreaker, FailurePolicy, RedisError, RedisRateLimiter, Source};
use tollgate::{Algorithm, Rule};

const TASKS: usize = 64;

/// The defaults: a 50 ms timeout and the default breaker (3 failures, 500 ms cool-down).
async fn limiter(server: &RedisServer) -> Arc<RedisRateLimiter<&'static str>> {
    let limiter = RedisRateLimiter::builder(server.url(), Algorithm::TokenBucket)
        // High enough that every request is a round trip, none a cached denial.
        .plan("free", Rule::per_second(1_000_000_000).unwrap())
        .failure_policy(FailurePolicy::Error)
        .circuit_breaker(CircuitBreaker::default())
        .build()
        .await
        .unwrap();
    Arc::new(limiter)
}

/// `TASKS` tasks deciding for clients of their own, one request after another, until `stop`.
fn hammer(
    limiter: &Arc<RedisRateLimiter<&'static str>>,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<u64>> {
    (0..TASKS)
        .map(|task| {
            let limiter = Arc::clone(limiter);
            let stop = Arc::clone(stop);
            tokio::spawn(async move {
                let client = format!("task-{task}");
                let mut decisions = 0;
                while !stop.load(Ordering::Relaxed) {
                    let _ = limiter.decide(&client, &"free", 1).await;
                    decisions += 1;
                }
                decisions
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_on_a_healthy_server_never_open_the_circuit() {
    let server = RedisServer::start();
    let limiter = limiter(&server).await;
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = hammer(&limiter, &stop);
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let mut decisions = 0;
    for task in tasks {
        decisions += task.await.unwrap();
    }
    let stats = limiter.stats();
    eprintln!("{decisions} decisions: {stats:?}");
    assert!(stats.redis_decisions > 1_000, "{stats:?}");
    assert_eq!(stats.circuit_opens, 0, "opened with no fault: {stats:?}");
    assert_eq!(stats.short_circuits, 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_opens_the_circuit_in_the_stated_time_and_a_restart_closes_it() {
    let mut server = RedisServer::start();
    let limiter = limiter(&server).await;
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = hammer(&limiter, &stop);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(limiter.stats().circuit_opens, 0);

    server.kill();
    let killed = Instant::now();
    // The stated bound: `failures` timeouts (3 x 50 ms); the margin is for a loaded machine's
    // scheduling, not for the breaker.
    let stated = Duration::from_millis(150);
    let margin = Duration::from_millis(250);
    while limiter.stats().circuit_opens == 0 {
        assert!(
            killed.elapsed() < stated + margin,
            "not open {:?} after the kill: {:?}",
            killed.elapsed(),
            limiter.stats()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let opened_in = killed.elapsed();
    // Open: requests are answered without a round trip.
    let trips = limiter.stats().round_trips;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stats = limiter.stats();
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    eprintln!("opened {opened_in:?} after the kill: {stats:?}");
    assert_eq!(stats.circuit_opens, 1, "{stats:?}");
    assert!(stats.short_circuits > 0, "{stats:?}");
    assert!(
        stats.round_trips - trips <= TASKS as u64,
        "only the requests in flight and probes go out while open: {stats:?}"
    );
    match limiter.decide("after", &"free", 1).await {
        Err(RedisError::CircuitOpen { .. }) => {}
        other => panic!("expected the open circuit, got {other:?}"),
    }

    server.restart();
    let restarted = Instant::now();
    loop {
        if let Ok(answer) = limiter.decide("after", &"free", 1).await {
            assert_eq!(answer.source(), Source::Redis);
            break;
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(10),
            "Redis was not used again: {:?}",
            limiter.stats()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("closed {:?} after the restart", restarted.elapsed());
    // Closed: every request goes to Redis again.
    for _ in 0..100 {
        let answer = limiter.decide("after", &"free", 1).await.unwrap();
        assert_eq!(answer.source(), Source::Redis);
    }
    assert_eq!(limiter.stats().circuit_opens, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_hiccup_that_times_out_64_round_trips_does_not_open_the_circuit() {
    let server = RedisServer::start();
    let limiter = limiter(&server).await;
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = hammer(&limiter, &stop);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A 50 ms hiccup (a fork, a slow command): every round trip in flight times out together.
    server.pause();
    std::thread::sleep(Duration::from_millis(50));
    server.resume();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    let stats = limiter.stats();
    eprintln!("after a 50 ms hiccup: {stats:?}");
    assert!(
        stats.timeouts >= 3,
        "the hiccup timed nothing out, so the test proves nothing: {stats:?}"
    );
    assert_eq!(stats.circuit_opens, 0, "opened on one stall: {stats:?}");
    assert_eq!(stats.short_circuits, 0, "{stats:?}");
}
