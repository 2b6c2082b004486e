//! Giving back a grant on Redis (`RedisRateLimiter::reserve` and `give_back`), checked against
//! the same history without the grant.
//!
//! Each script runs alone on Redis, so a history of script calls on one client is every
//! interleaving there is. For every method, the checker replays every history of a small
//! grammar (calls before the grant; the grant; calls between it and its give-back: takings, and
//! another grant given back before it; with readings in earlier windows as well as later ones,
//! as a server's clock stepped back gives) on one client, and on a reference client the same
//! history with only the admissions the client kept: without the grant, its give-back, and
//! whatever the client refused or gave back. After the give-back, at every probe time, the
//! client must be no more generous than the reference (a permit it grants, the reference
//! grants; never more left): the limit goes on counting every admission that stands. When
//! nothing landed between the grant and its give-back, it must be exactly the reference (every
//! figure equal, and every limit restored).
//!
//! The checker catches the two planted give-backs: one that restores the value from before
//! the grant whatever landed since (it hands out again what later takings took), and one that
//! gives nothing back.

mod redis_support;

use std::time::Duration;

use redis_support::{DECISION_TIMEOUT, RedisServer};
use tollgate::redis::{GivenBack, RedisRateLimiter};
use tollgate::{Algorithm, Decision, Rule};

const LIMIT: u64 = 5;
const WINDOW_US: u64 = 1_000_000;
/// An injected clock's start, aligned to the window.
const BASE_US: u64 = 1_700_000_000 * WINDOW_US;
/// The times calls are made at (offsets from `BASE_US`): early and late in a window, in the
/// next, and two windows on.
const TIMES: [u64; 4] = [100_000, 600_000, 1_200_000, 2_700_000];
/// The times the outcome is probed at: every call's time, and later.
const PROBES: [u64; 6] = [100_000, 600_000, 1_200_000, 1_900_000, 2_700_000, 4_500_000];

/// One call of a history.
#[derive(Debug, Clone, Copy)]
enum Call {
    /// Takes `n` permits at `at`.
    Take { at: u64, n: u64 },
    /// Takes `n` permits at `at` by a reserving call, and gives them back at once (a grant of
    /// another request, given back before the one under check: latest first).
    ReserveAndGiveBack { at: u64, n: u64 },
}

#[derive(Debug, Clone)]
struct History {
    before: Vec<Call>,
    reserve_at: u64,
    reserve_n: u64,
    between: Vec<Call>,
}

/// How the checked client's grant is given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GiveBack {
    /// `RedisRateLimiter::give_back`.
    Real,
    /// A planted bug: the key's value from before the grant restored whatever landed since.
    Blind,
    /// A planted bug: nothing given back.
    Nothing,
}

fn histories() -> Vec<History> {
    let mut betweens: Vec<Vec<Call>> = vec![Vec::new()];
    for at in TIMES {
        for n in [1, 3] {
            betweens.push(vec![Call::Take { at, n }]);
            betweens.push(vec![Call::ReserveAndGiveBack { at, n }]);
            for second in TIMES {
                betweens.push(vec![Call::Take { at, n }, Call::Take { at: second, n: 2 }]);
            }
        }
    }
    let befores = [Vec::new(), vec![Call::Take { at: TIMES[0], n: 3 }]];
    let mut all = Vec::new();
    for before in &befores {
        for reserve_at in TIMES {
            for reserve_n in [1, 3] {
                for between in &betweens {
                    all.push(History {
                        before: before.clone(),
                        reserve_at,
                        reserve_n,
                        between: between.clone(),
                    });
                }
            }
        }
    }
    all
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The limiter under check: its plan `p` has the one limit of `LIMIT` per window, or, with
/// `several`, also a second limit of 8 per three windows (a give-back then restores or takes
/// off each limit's key).
async fn limiter(
    server: &RedisServer,
    algorithm: Algorithm,
    several: bool,
) -> RedisRateLimiter<&'static str> {
    let mut rules = vec![Rule::new(LIMIT, Duration::from_micros(WINDOW_US)).unwrap()];
    if several {
        rules.push(Rule::new(8, Duration::from_micros(3 * WINDOW_US)).unwrap());
    }
    RedisRateLimiter::builder(server.url(), algorithm)
        .plan_limits("p", rules)
        .timeout(DECISION_TIMEOUT)
        .build()
        .await
        .expect("the limiter builds")
}

/// Plays `call` on `client`; whether it took permits and kept them.
async fn play(limiter: &RedisRateLimiter<&'static str>, client: &str, call: Call) -> bool {
    match call {
        Call::Take { at, n } => limiter
            .decide_at(client, &"p", n, BASE_US + at)
            .await
            .unwrap()
            .decision()
            .is_allowed(),
        Call::ReserveAndGiveBack { at, n } => {
            let (_, grant) = limiter
                .reserve_at(client, &"p", n, BASE_US + at)
                .await
                .unwrap();
            if let Some(grant) = grant {
                limiter.give_back(client, &"p", &grant).await.unwrap();
            }
            false
        }
    }
}

/// Replays `history` on a client of its own and on a reference client without the grant, and
/// compares them after the give-back; the first difference found, if any.
async fn check(
    limiter: &RedisRateLimiter<&'static str>,
    connection: &mut redis::aio::MultiplexedConnection,
    case: usize,
    history: &History,
    give_back: GiveBack,
) -> Result<(), String> {
    let (client, reference) = (format!("c{case}"), format!("r{case}"));
    for &call in &history.before {
        play(limiter, &client, call).await;
        play(limiter, &reference, call).await;
    }
    let key = limiter.keys(&client, &"p").unwrap().remove(0);
    let saved: Option<Vec<u8>> = redis::cmd("DUMP")
        .arg(&key)
        .query_async(connection)
        .await
        .unwrap();
    let (answer, grant) = limiter
        .reserve_at(
            &client,
            &"p",
            history.reserve_n,
            BASE_US + history.reserve_at,
        )
        .await
        .unwrap();
    assert_eq!(
        grant.is_some(),
        answer.decision().is_allowed(),
        "a grant is kept exactly when Redis granted"
    );
    // The reference takes what the client was granted and kept: the admissions the limit
    // must go on counting. (A taking the grant made the client refuse is not one of them.)
    for &call in &history.between {
        if play(limiter, &client, call).await {
            play(limiter, &reference, call).await;
        }
    }
    let mut outcome = None;
    if let Some(grant) = &grant {
        match give_back {
            GiveBack::Real => {
                outcome = Some(limiter.give_back(&client, &"p", grant).await.unwrap());
            }
            GiveBack::Blind => {
                let () = match &saved {
                    Some(value) => redis::cmd("RESTORE")
                        .arg(&key)
                        .arg(0)
                        .arg(value.as_slice())
                        .arg("REPLACE")
                        .query_async(connection)
                        .await
                        .unwrap(),
                    None => redis::cmd("DEL")
                        .arg(&key)
                        .query_async::<i64>(connection)
                        .await
                        .map(drop)
                        .unwrap(),
                };
            }
            GiveBack::Nothing => {}
        }
    }
    let untouched = history.between.is_empty();
    if untouched
        && let Some(outcome) = &outcome
        && outcome.iter().any(|limit| *limit != GivenBack::Restored)
    {
        return Err(format!("{history:?}: nothing landed, yet {outcome:?}"));
    }
    // The latest reading the client's key has seen. A reading older than that (a server's
    // clock stepped back) is counted by each method's own rule in the state the later ones
    // left, with the grant or without it (a window counts it in its stored window): there the
    // give-back is held to exactness alone, when nothing landed.
    let latest = history
        .before
        .iter()
        .chain(&history.between)
        .map(|call| match *call {
            Call::Take { at, .. } | Call::ReserveAndGiveBack { at, .. } => at,
        })
        .chain([history.reserve_at])
        .max()
        .unwrap_or(0);
    for probe in PROBES {
        if !untouched && probe < latest {
            continue;
        }
        let at = BASE_US + probe;
        let got = limiter.peek_at(&client, &"p", at).await.unwrap().decision();
        let want = limiter
            .peek_at(&reference, &"p", at)
            .await
            .unwrap()
            .decision();
        let same = |d: &Decision| {
            (
                d.is_allowed(),
                d.remaining(),
                d.retry_after(),
                d.reset_after(),
            )
        };
        if untouched && same(&got) != same(&want) {
            return Err(format!(
                "{history:?}: nothing landed between the grant and its give-back, yet at \
                 +{probe} us the client gets {got:?}, the reference {want:?}"
            ));
        }
        if (got.is_allowed() && !want.is_allowed()) || got.remaining() > want.remaining() {
            return Err(format!(
                "{history:?}: at +{probe} us the client is more generous ({got:?}) than had \
                 the grant not been made ({want:?})"
            ));
        }
    }
    Ok(())
}

/// Every history under `algorithm`, with `give_back`, on a plan of one limit or `several`;
/// the first failure, if any.
fn run(algorithm: Algorithm, give_back: GiveBack, several: bool) -> Result<usize, String> {
    let server = RedisServer::start();
    runtime().block_on(async {
        let limiter = limiter(&server, algorithm, several).await;
        let mut connection = server.connection().await;
        let histories = histories();
        for (case, history) in histories.iter().enumerate() {
            check(&limiter, &mut connection, case, history, give_back).await?;
        }
        Ok(histories.len())
    })
}

fn passes(algorithm: Algorithm, several: bool) {
    match run(algorithm, GiveBack::Real, several) {
        Ok(histories) => assert_eq!(histories, 784, "the grammar's histories"),
        Err(failure) => panic!("{algorithm:?} (several limits: {several}): {failure}"),
    }
}

#[test]
fn a_token_bucket_grant_given_back_leaves_no_more_than_without_it() {
    passes(Algorithm::TokenBucket, false);
}

#[test]
fn a_fixed_window_grant_given_back_leaves_no_more_than_without_it() {
    passes(Algorithm::FixedWindow, false);
}

#[test]
fn a_sliding_window_log_grant_given_back_leaves_no_more_than_without_it() {
    passes(Algorithm::SlidingWindowLog, false);
}

#[test]
fn a_sliding_window_counter_grant_given_back_leaves_no_more_than_without_it() {
    passes(Algorithm::SlidingWindowCounter, false);
}

#[test]
fn a_grant_of_a_plan_of_several_limits_given_back_leaves_no_more_than_without_it() {
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
    ] {
        passes(algorithm, true);
    }
}

/// Negative control: restoring the value from before the grant after other takings landed hands
/// their permits out again, and the checker says so, for every method.
#[test]
fn the_checker_catches_a_give_back_that_ignores_later_takings() {
    for algorithm in Algorithm::ALL {
        let failure =
            run(algorithm, GiveBack::Blind, false).expect_err("a blind restore must be caught");
        assert!(
            failure.contains("more generous"),
            "{algorithm:?}: {failure}"
        );
    }
}

/// Negative control: a give-back that does nothing leaves the grant taken, and the checker says
/// so, for every method.
#[test]
fn the_checker_catches_a_give_back_that_gives_nothing() {
    for algorithm in Algorithm::ALL {
        let failure =
            run(algorithm, GiveBack::Nothing, false).expect_err("a kept grant must be caught");
        assert!(
            failure.contains("nothing landed between"),
            "{algorithm:?}: {failure}"
        );
    }
}

/// A give-back makes the client's state more generous: the node forgets its cached denial of
/// the client, so that the permits given back are granted at once (and not refused from the
/// cache until the denial would have ended).
#[test]
fn a_give_back_forgets_the_nodes_cached_denial_of_the_client() {
    let server = RedisServer::start();
    runtime().block_on(async {
        for algorithm in Algorithm::ALL {
            let limiter = RedisRateLimiter::builder(server.url(), algorithm)
                .timeout(DECISION_TIMEOUT)
                .plan("p", Rule::per_hour(5).unwrap())
                .key_prefix(format!("cache-{algorithm}"))
                .build()
                .await
                .unwrap();
            let (answer, grant) = limiter.reserve("ann", &"p", 5).await.unwrap();
            assert!(answer.decision().is_allowed(), "{algorithm}");
            let refused = limiter.decide("ann", &"p", 1).await.unwrap();
            assert!(refused.decision().is_denied(), "{algorithm}: spent");
            let given = limiter
                .give_back("ann", &"p", &grant.expect("granted"))
                .await
                .unwrap();
            assert_eq!(given, [GivenBack::Restored], "{algorithm}");
            let after = limiter.decide("ann", &"p", 1).await.unwrap();
            assert!(
                after.decision().is_allowed(),
                "{algorithm}: refused after the give-back ({:?}, from {:?})",
                after.decision(),
                after.source()
            );
        }
    });
}

/// A sliding log of the largest limit, full of batches of one permit: a grant on it is given
/// back exactly (the log's value as before, to the byte), though the reserving call reads only
/// the log's newest and oldest batches, not its whole value (tens of thousands of batches).
#[test]
fn a_grant_on_a_log_of_the_largest_limit_is_given_back_exactly() {
    const BATCHES: u64 = 65_000;
    let server = RedisServer::start();
    runtime().block_on(async {
        let limit = 65_536;
        let limiter = RedisRateLimiter::builder(server.url(), Algorithm::SlidingWindowLog)
            .plan("p", Rule::new(limit, Duration::from_secs(3_600)).unwrap())
            .timeout(DECISION_TIMEOUT)
            .build()
            .await
            .unwrap();
        let key = limiter.keys("big", &"p").unwrap().remove(0);
        let mut connection = server.connection().await;
        // The log as 65,000 grants of one permit, a microsecond apart, would write it: batch i
        // expires at start + i us, its running total i + 1.
        let start = BASE_US + 3_600 * 1_000_000;
        let mut pipe = redis::pipe();
        for chunk in (0..BATCHES).collect::<Vec<_>>().chunks(5_000) {
            let mut zadd = redis::cmd("ZADD");
            zadd.arg(&key);
            for &i in chunk {
                zadd.arg(start + i).arg(format!("{}:1", i + 1));
            }
            pipe.add_command(zadd).ignore();
        }
        pipe.cmd("PEXPIRE").arg(&key).arg(7_200_000).ignore();
        let () = pipe.query_async(&mut connection).await.unwrap();
        let before: Vec<u8> = redis::cmd("DUMP")
            .arg(&key)
            .query_async(&mut connection)
            .await
            .unwrap();
        let at = BASE_US + BATCHES + 10;
        let started = std::time::Instant::now();
        let (answer, grant) = limiter.reserve_at("big", &"p", 2, at).await.unwrap();
        let reserved_in = started.elapsed();
        assert!(answer.decision().is_allowed(), "{answer:?}");
        let started = std::time::Instant::now();
        let given = limiter
            .give_back("big", &"p", &grant.expect("granted"))
            .await
            .unwrap();
        let given_in = started.elapsed();
        assert_eq!(given, [GivenBack::Restored]);
        let after: Vec<u8> = redis::cmd("DUMP")
            .arg(&key)
            .query_async(&mut connection)
            .await
            .unwrap();
        assert!(before == after, "the log is not as it was before the grant");
        println!("reserve {reserved_in:?}, give_back {given_in:?} on {BATCHES} batches");
    });
}
