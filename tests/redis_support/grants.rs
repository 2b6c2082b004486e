//! Helpers for the tests of the Redis give-back protocol (`RedisRateLimiter::reserve`,
//! `give_back`): a limiter of one plan `"p"` with no deny cache, and takings, reservations and
//! drains at the server's time or an injected one.

use std::time::Duration;

use super::DECISION_TIMEOUT;
use tollgate::redis::{RedisGrant, RedisRateLimiter};
use tollgate::{Algorithm, Rule};

pub(crate) type Limiter = RedisRateLimiter<&'static str>;

pub(crate) const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

pub(crate) fn per_year(limit: u64) -> Rule {
    Rule::new(limit, YEAR).unwrap()
}

/// A runtime of two workers, for tests that race tasks on Redis.
pub(crate) fn multi_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// A limiter at `url` of `plans`, with no deny cache (every decision asks Redis).
pub(crate) async fn limiter_with(
    url: &str,
    algorithm: Algorithm,
    plans: &[(&'static str, Vec<Rule>)],
) -> Limiter {
    let mut builder = RedisRateLimiter::builder(url.to_owned(), algorithm)
        .timeout(DECISION_TIMEOUT)
        .deny_cache(0);
    for (plan, rules) in plans {
        builder = builder.plan_limits(*plan, rules.clone());
    }
    builder.build().await.expect("the limiter builds")
}

/// A limiter at `url` of the one plan `"p"` of `rules`.
pub(crate) async fn limiter_on(url: &str, algorithm: Algorithm, rules: Vec<Rule>) -> Limiter {
    limiter_with(url, algorithm, &[("p", rules)]).await
}

/// Whether `n` permits of plan `"p"` are granted to `client` (at `at` µs, else now).
pub(crate) async fn take(limiter: &Limiter, client: &str, n: u64, at: Option<u64>) -> bool {
    match at {
        Some(at) => limiter.decide_at(client, &"p", n, at).await,
        None => limiter.decide(client, &"p", n).await,
    }
    .unwrap()
    .decision()
    .is_allowed()
}

/// A granted reservation of `n` permits of plan `"p"` for `client` (at `at` µs, else now).
pub(crate) async fn reserve(
    limiter: &Limiter,
    client: &str,
    n: u64,
    at: Option<u64>,
) -> RedisGrant {
    let (answer, grant) = match at {
        Some(at) => limiter.reserve_at(client, &"p", n, at).await,
        None => limiter.reserve(client, &"p", n).await,
    }
    .unwrap();
    assert!(answer.decision().is_allowed(), "the reservation is granted");
    grant.expect("a grant from Redis")
}

/// How many single permits `client` still gets (at most `cap` asked).
pub(crate) async fn drain(limiter: &Limiter, client: &str, at: Option<u64>, cap: u64) -> u64 {
    let mut got = 0;
    for _ in 0..cap {
        if !take(limiter, client, 1, at).await {
            break;
        }
        got += 1;
    }
    got
}
