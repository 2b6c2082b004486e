//! The Redis backend on a real 3-master Redis Cluster on loopback, reached through a URL naming
//! one node: clients spread over every master each get exactly their limit, keys expire, a
//! denial writes nothing, scripts flushed from the masters are loaded again, and a killed master
//! gets the failure policy's answers while the live masters keep deciding; a grant given back
//! restores its keys on the master holding them.

mod redis_support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use redis_support::{DECISION_TIMEOUT, RedisCluster, RedisServer};
use tollgate::redis::{
    CircuitBreaker, FailurePolicy, GivenBack, RedisError, RedisRateLimiter, Source,
};
use tollgate::{Algorithm, Rule};

const CLIENTS: usize = 12;

fn client(index: usize) -> String {
    format!("client-{index}")
}

async fn limiter(
    cluster: &RedisCluster,
    algorithm: Algorithm,
    prefix: &str,
) -> RedisRateLimiter<&'static str> {
    RedisRateLimiter::builder(cluster.url(), algorithm)
        .timeout(DECISION_TIMEOUT)
        .plan_limits(
            "free",
            [Rule::per_hour(5).unwrap(), Rule::per_minute(4).unwrap()],
        )
        .key_prefix(prefix)
        .deny_cache(0)
        .build()
        .await
        .unwrap()
}

/// A plain connection to each node: a key is read on the node holding it (the others answer
/// `MOVED`).
async fn node_connections(cluster: &RedisCluster) -> Vec<::redis::aio::MultiplexedConnection> {
    let mut connections = Vec::new();
    for node in cluster.nodes() {
        connections.push(node.connection().await);
    }
    connections
}

/// The index of the node holding `key`, which must exist.
async fn node_of(connections: &mut [::redis::aio::MultiplexedConnection], key: &str) -> usize {
    for (index, connection) in connections.iter_mut().enumerate() {
        let exists = ::redis::cmd("EXISTS")
            .arg(key)
            .query_async::<i64>(connection)
            .await;
        if exists == Ok(1) {
            return index;
        }
    }
    panic!("no node holds {key}");
}

async fn dump(connection: &mut ::redis::aio::MultiplexedConnection, key: &str) -> Vec<u8> {
    ::redis::cmd("DUMP")
        .arg(key)
        .query_async(connection)
        .await
        .unwrap()
}

/// For clients on every master and every method: a grant of a plan of two limits, given back
/// with nothing landed between, leaves each key's value (`DUMP`) as it was before the grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_given_back_on_every_master_restore_each_key() {
    let cluster = RedisCluster::start();
    let mut connections = node_connections(&cluster).await;
    for algorithm in Algorithm::ALL {
        let prefix = format!("give-back-{algorithm}");
        let redis = limiter(&cluster, algorithm, &prefix).await;
        let mut nodes = BTreeSet::new();
        for index in 0..CLIENTS {
            let client = client(index);
            // A permit taken first, so that the keys hold a value before the grant.
            let first = redis.decide(&client, &"free", 1).await.unwrap();
            assert!(first.decision().is_allowed(), "{algorithm}: {first:?}");
            let keys = redis.keys(&client, &"free").unwrap();
            let node = node_of(&mut connections, &keys[0]).await;
            nodes.insert(node);
            let mut before = Vec::new();
            for key in &keys {
                before.push(dump(&mut connections[node], key).await);
            }
            let (answer, grant) = redis.reserve(&client, &"free", 2).await.unwrap();
            assert!(answer.decision().is_allowed(), "{algorithm}: {answer:?}");
            let grant = grant.expect("Redis granted: the grant is kept");
            let given = redis.give_back(&client, &"free", &grant).await.unwrap();
            assert_eq!(given, [GivenBack::Restored; 2], "{algorithm}, {client}");
            for (key, before) in keys.iter().zip(&before) {
                assert_eq!(
                    &dump(&mut connections[node], key).await,
                    before,
                    "{algorithm}: {key} is not as it was before the grant"
                );
            }
        }
        assert_eq!(nodes.len(), 3, "{algorithm}: clients on every master");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_on_every_master_get_exactly_their_limit_and_denials_write_nothing() {
    let cluster = RedisCluster::start();
    let mut connections = node_connections(&cluster).await;
    for algorithm in Algorithm::ALL {
        let prefix = format!("spread-{algorithm}");
        let redis = limiter(&cluster, algorithm, &prefix).await;
        for index in 0..CLIENTS {
            let mut admitted = 0;
            for _ in 0..7 {
                let answer = redis.decide(&client(index), &"free", 1).await.unwrap();
                assert_eq!(answer.source(), Source::Redis, "{algorithm}");
                admitted += u64::from(answer.decision().is_allowed());
            }
            assert_eq!(admitted, 4, "{algorithm}: {} of 7", client(index));
        }
        let mut holders = BTreeSet::new();
        for index in 0..CLIENTS {
            let keys = redis.keys(&client(index), &"free").unwrap();
            let node = node_of(&mut connections, &keys[0]).await;
            holders.insert(node);
            for key in &keys {
                assert_eq!(node_of(&mut connections, key).await, node, "one slot");
                let ttl: i64 = ::redis::cmd("PTTL")
                    .arg(key)
                    .query_async(&mut connections[node])
                    .await
                    .unwrap();
                assert!(ttl > 0, "{algorithm}: {key} has no expiry (PTTL {ttl})");
            }
            // Every client is over its limit: a denial leaves its keys as they were.
            let before = [
                dump(&mut connections[node], &keys[0]).await,
                dump(&mut connections[node], &keys[1]).await,
            ];
            let answer = redis.decide(&client(index), &"free", 1).await.unwrap();
            assert!(answer.decision().is_denied(), "{algorithm}");
            let after = [
                dump(&mut connections[node], &keys[0]).await,
                dump(&mut connections[node], &keys[1]).await,
            ];
            assert_eq!(before, after, "{algorithm}: a denial changed {keys:?}");
        }
        assert_eq!(holders.len(), 3, "{algorithm}: keys on nodes {holders:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_flushed_from_every_master_are_loaded_again_through_the_cluster() {
    let cluster = RedisCluster::start();
    let redis = limiter(&cluster, Algorithm::TokenBucket, "flushed").await;
    let mut connections = node_connections(&cluster).await;
    for connection in &mut connections {
        let _: () = ::redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(connection)
            .await
            .unwrap();
    }
    // EVALSHA meets NOSCRIPT on each master; the script is loaded again and the call retried.
    for index in 0..CLIENTS {
        let answer = redis.decide(&client(index), &"free", 1).await.unwrap();
        assert_eq!(answer.source(), Source::Redis);
        assert!(answer.decision().is_allowed());
    }
    // A limiter built lazily connects on its first request.
    let lazy = RedisRateLimiter::builder(cluster.url(), Algorithm::FixedWindow)
        .plan("free", Rule::per_hour(1).unwrap())
        .key_prefix("lazy")
        .build_lazy()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let first = loop {
        match lazy.decide("late", &"free", 1).await {
            Ok(answer) => break answer,
            Err(error) => assert!(Instant::now() < deadline, "never connected: {error}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(first.source(), Source::Redis);
    assert!(first.decision().is_allowed());
    assert!(!lazy.allow("late", &"free").await.unwrap());
}

async fn faulty(
    cluster: &RedisCluster,
    policy: FailurePolicy,
    prefix: &str,
) -> RedisRateLimiter<&'static str> {
    RedisRateLimiter::builder(cluster.url(), Algorithm::FixedWindow)
        .plan("free", Rule::per_hour(3).unwrap())
        .key_prefix(prefix)
        .failure_policy(policy)
        .deny_cache(0)
        .timeout(Duration::from_millis(50))
        .circuit_breaker(CircuitBreaker {
            failures: 3,
            cool_down: Duration::from_millis(200),
        })
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_gets_the_policy_answers_and_the_live_masters_keep_their_limits() {
    let mut cluster = RedisCluster::start();
    let policies = [
        FailurePolicy::Error,
        FailurePolicy::FailOpen,
        FailurePolicy::FailClosed,
    ];
    let mut limiters = Vec::new();
    for policy in policies {
        limiters.push(faulty(&cluster, policy, &format!("{policy:?}")).await);
    }
    // Each client's first permit, and the node holding its keys.
    let mut connections = node_connections(&cluster).await;
    let mut homes = Vec::new();
    for redis in &limiters {
        let mut home = Vec::new();
        for index in 0..CLIENTS {
            assert!(redis.allow(&client(index), &"free").await.unwrap());
            let key = redis.keys(&client(index), &"free").unwrap().remove(0);
            home.push(node_of(&mut connections, &key).await);
        }
        homes.push(home);
    }
    drop(connections);
    let killed = 1;
    cluster.kill(killed);

    for (redis, home) in limiters.iter().zip(&homes) {
        let policy = redis.failure_policy();
        let mut live_admitted = [1u64; CLIENTS];
        let mut live_redis_answers = 0;
        // Round robin over the clients, as requests from many clients come.
        for _ in 0..5 {
            for index in 0..CLIENTS {
                let started = Instant::now();
                let answer = redis.decide(&client(index), &"free", 1).await;
                assert!(
                    started.elapsed() < Duration::from_secs(1),
                    "{policy:?}: a dead master held a request"
                );
                let on_dead_node = home[index] == killed;
                match (policy, answer) {
                    (FailurePolicy::Error, Err(error)) => assert!(
                        matches!(
                            error,
                            RedisError::Command { .. }
                                | RedisError::Timeout { .. }
                                | RedisError::CircuitOpen { .. }
                        ),
                        "{error}"
                    ),
                    (_, Ok(answer)) if answer.source() == Source::Redis => {
                        assert!(!on_dead_node, "{policy:?}: Redis answered for a dead node");
                        live_redis_answers += 1;
                        live_admitted[index] += u64::from(answer.decision().is_allowed());
                    }
                    (FailurePolicy::FailOpen, Ok(answer)) => {
                        assert_eq!(answer.source(), Source::FailOpen);
                        assert!(answer.decision().is_allowed());
                    }
                    (FailurePolicy::FailClosed, Ok(answer)) => {
                        assert_eq!(answer.source(), Source::FailClosed);
                        assert!(answer.decision().is_denied());
                    }
                    (policy, answer) => panic!("{policy:?} answered {answer:?}"),
                }
            }
        }
        // The live masters kept deciding, and kept each of their clients to its limit.
        let live_clients = home.iter().filter(|&&node| node != killed).count();
        assert!(live_clients > 0 && live_clients < CLIENTS, "{home:?}");
        assert_eq!(
            live_redis_answers,
            live_clients * 5,
            "{policy:?}: every request of a live master's client is decided by Redis; {:?}",
            redis.stats()
        );
        for (index, admitted) in live_admitted.iter().enumerate() {
            if home[index] != killed {
                assert!(
                    *admitted <= 3,
                    "{policy:?}: {} got {admitted}",
                    client(index)
                );
            }
        }
        println!(
            "{policy:?}: {live_redis_answers} Redis answers to {live_clients} live clients over \
             5 rounds; {:?}",
            redis.stats()
        );
    }
}

/// A cluster's circuit breakers are per hash slot: a killed master's clients are
/// short-circuited once their circuits open (no timeout per request), while every request of the
/// live masters' clients is still decided by Redis. (With one breaker for the whole cluster, the
/// live masters' successes hold it closed, and every request of the dead master's clients waits
/// out its timeout; or, opened, it would refuse the live masters Redis.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_masters_circuits_open_for_its_slots_alone() {
    const ROUNDS: usize = 8;
    let mut cluster = RedisCluster::start();
    let redis = RedisRateLimiter::builder(cluster.url(), Algorithm::FixedWindow)
        .plan("free", Rule::per_hour(100).unwrap())
        .key_prefix("per-slot")
        .failure_policy(FailurePolicy::FailOpen)
        .deny_cache(0)
        .timeout(Duration::from_millis(50))
        .circuit_breaker(CircuitBreaker {
            failures: 3,
            // Longer than the test: an opened circuit stays open.
            cool_down: Duration::from_secs(60),
        })
        .build()
        .await
        .unwrap();
    let mut connections = node_connections(&cluster).await;
    let mut home = Vec::new();
    for index in 0..CLIENTS {
        assert!(redis.allow(&client(index), &"free").await.unwrap());
        let key = redis.keys(&client(index), &"free").unwrap().remove(0);
        home.push(node_of(&mut connections, &key).await);
    }
    drop(connections);
    let killed = 0;
    cluster.kill(killed);
    let dead_clients = home.iter().filter(|&&node| node == killed).count();
    assert!(dead_clients > 0 && dead_clients < CLIENTS, "{home:?}");

    for round in 0..ROUNDS {
        for (index, node) in home.iter().enumerate() {
            let answer = redis.decide(&client(index), &"free", 1).await.unwrap();
            if *node == killed {
                assert_eq!(answer.source(), Source::FailOpen, "round {round}");
            } else {
                assert_eq!(
                    answer.source(),
                    Source::Redis,
                    "round {round}: a live master's client was refused Redis; {:?}",
                    redis.stats()
                );
            }
        }
    }
    // Each dead client's circuit opened after at most 3 failed rounds (clients may share a
    // group, which opens sooner); every later request of it was short-circuited.
    let stats = redis.stats();
    assert!(stats.circuit_opens >= 1, "{stats:?}");
    assert!(
        stats.short_circuits >= (dead_clients * (ROUNDS - 3)) as u64,
        "{dead_clients} dead clients over {ROUNDS} rounds: {stats:?}"
    );
    assert_eq!(
        stats.fallbacks,
        stats.short_circuits + stats.errors,
        "every fallback was a short circuit or a failed round trip: {stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_master_costs_its_clients_at_most_the_timeout_and_the_others_nothing() {
    let cluster = RedisCluster::start();
    let redis = faulty(&cluster, FailurePolicy::Error, "paused").await;
    let mut connections = node_connections(&cluster).await;
    let mut home = Vec::new();
    for index in 0..CLIENTS {
        assert!(redis.allow(&client(index), &"free").await.unwrap());
        let key = redis.keys(&client(index), &"free").unwrap().remove(0);
        home.push(node_of(&mut connections, &key).await);
    }
    let paused = 2;
    let _paused = cluster.pause(paused);
    // Clients on the live masters first: Redis answers them within the timeout, never waiting
    // on the paused master.
    for index in (0..CLIENTS).filter(|&index| home[index] != paused) {
        let answer = redis.decide(&client(index), &"free", 1).await.unwrap();
        assert_eq!(answer.source(), Source::Redis);
    }
    let on_paused = (0..CLIENTS).find(|&index| home[index] == paused).unwrap();
    let started = Instant::now();
    let error = redis
        .decide(&client(on_paused), &"free", 1)
        .await
        .unwrap_err();
    assert!(matches!(error, RedisError::Timeout { .. }), "{error:?}");
    // The timeout is 50 ms; the bound leaves room for a loaded machine's scheduling.
    assert!(
        started.elapsed() < Duration::from_millis(150),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_cluster_url_without_nodes_is_an_invalid_url() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let error = RedisRateLimiter::builder("redis+cluster://", Algorithm::TokenBucket)
        .plan("free", Rule::per_second(1).unwrap())
        .build_lazy()
        .unwrap_err();
    assert!(matches!(error, RedisError::InvalidUrl { .. }), "{error:?}");
    // A server outside any cluster, named as a cluster: a clear connection error.
    let server = RedisServer::start();
    let url = format!("redis+cluster://127.0.0.1:{}", server.port());
    let error = runtime
        .block_on(
            RedisRateLimiter::builder(url, Algorithm::TokenBucket)
                .plan("free", Rule::per_second(1).unwrap())
                .build(),
        )
        .unwrap_err();
    assert!(matches!(error, RedisError::Connect { .. }), "{error:?}");
}
