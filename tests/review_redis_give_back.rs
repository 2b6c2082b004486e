//! An outside review of the Redis give-back protocol (`RedisRateLimiter::reserve`,
//! `reserve_at`, `give_back`; `scripts/plan.lua`'s "reserve" mode and `scripts/give_back.lua`)
//! and of the Envoy rate-limit service's use of it on Redis (`decide_remotely`,
//! `give_back_latest_first`), attacked through the public API only.
//!
//! Ten of these tests failed on the reviewed commit: a grant could be given back twice (in a
//! row, with a decision between, after a take-off, after a timeout and a retry), onto a key
//! rebuilt after a restart, under another client or limiter; a restored expiry could be 1 ms
//! short; and a denial cached before a give-back outlived it (on the node, and on another
//! node). Each now holds: a grant's record, consumed by its give-back; the grant's keys
//! checked; `PEXPIRETIME`; and a deny cache that forgets the client on a give-back or refund
//! and holds any denial a second at most.

mod redis_support;
mod rls_support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::google::protobuf::UInt64Value;
use redis::aio::MultiplexedConnection;
use redis_support::grants::{
    Limiter, YEAR, drain, limiter_with, multi_thread_runtime, per_year, reserve, take,
};
use redis_support::{DECISION_TIMEOUT, RedisServer, Rng};
use tollgate::envoy::proto::RateLimitRequest;
use tollgate::envoy::proto::rate_limit_response::Code;
use tollgate::envoy::{RateLimitServer, RlsConfig, StateStore};
use tollgate::redis::{FailurePolicy, GivenBack, RedisGrant, RedisRateLimiter};
use tollgate::{Algorithm, Rule};

async fn limiter(server: &RedisServer, algorithm: Algorithm, rules: Vec<Rule>) -> Limiter {
    redis_support::grants::limiter_on(&server.url(), algorithm, rules).await
}

async fn dump(connection: &mut MultiplexedConnection, key: &str) -> Option<Vec<u8>> {
    redis::cmd("DUMP")
        .arg(key)
        .query_async(connection)
        .await
        .unwrap()
}

/// The key's absolute expiry in Unix ms (-1 none, -2 missing).
async fn pexpiretime(connection: &mut MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PEXPIRETIME")
        .arg(key)
        .query_async(connection)
        .await
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// Claim 1: nothing landed since the grant: value and expiry exactly as before.

/// For every method, plans of one and of several limits, keys missing before and keys holding
/// state: a give-back with nothing landed (a peek may land: it writes nothing) restores every
/// key's `DUMP` (and answers `Restored`) and, with `expiry`, its absolute expiry
/// (`PEXPIRETIME`) exactly, on the server's clock. Many rounds, so that a script straddling a
/// millisecond is met.
fn nothing_landed(expiry: bool) {
    let server = RedisServer::start();
    multi_thread_runtime().block_on(async {
        let mut connection = server.connection().await;
        let mut failures = Vec::new();
        for algorithm in Algorithm::ALL {
            for several in [false, true] {
                let mut rules = vec![Rule::new(60_000, Duration::from_secs(3600)).unwrap()];
                if several {
                    rules.push(Rule::new(65_000, Duration::from_secs(86_400)).unwrap());
                }
                let limiter = limiter(&server, algorithm, rules).await;
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (algorithm as u64) ^ u64::from(several));
                for round in 0..400 {
                    let client = format!("c{round}");
                    if round % 3 != 0 {
                        for _ in 0..=rng.below(3) {
                            assert!(take(&limiter, &client, 1 + rng.below(3), None).await);
                        }
                    }
                    let keys = limiter.keys(&client, &"p").unwrap();
                    if several && round % 5 == 1 {
                        // One limit's key gone (expired, evicted), the other's kept.
                        let _: i64 = redis::cmd("DEL")
                            .arg(&keys[1])
                            .query_async(&mut connection)
                            .await
                            .unwrap();
                    }
                    let mut saved = Vec::new();
                    for key in &keys {
                        saved.push((dump(&mut connection, key).await, pexpiretime(&mut connection, key).await));
                    }
                    let grant = reserve(&limiter, &client, 1 + rng.below(4), None).await;
                    // Writes nothing: a peek.
                    let _ = limiter.peek(&client, &"p").await.unwrap();
                    let outcome = limiter.give_back(&client, &"p", &grant).await.unwrap();
                    let mut now = Vec::new();
                    for key in &keys {
                        now.push((dump(&mut connection, key).await, pexpiretime(&mut connection, key).await));
                    }
                    if !expiry && outcome.iter().any(|o| *o != GivenBack::Restored) {
                        failures.push(format!("{algorithm:?} several={several} round {round}: {outcome:?}"));
                    }
                    for (key, (was, is)) in keys.iter().zip(saved.iter().zip(&now)) {
                        if !expiry && was.0 != is.0 {
                            failures.push(format!("{algorithm:?} several={several} round {round}: {key} value differs"));
                        }
                        if expiry && was.1 != is.1 {
                            failures.push(format!(
                                "{algorithm:?} several={several} round {round}: {key} expired at {} ms before the grant, at {} ms ({:+} ms) after its give-back",
                                was.1, is.1, is.1 - was.1
                            ));
                        }
                    }
                }
            }
        }
        let later = failures.iter().filter(|f| f.contains("(+")).count();
        assert_eq!(later, 0, "restored expiries later than the key's own: {failures:#?}");
        let per_method: Vec<(Algorithm, usize)> = Algorithm::ALL
            .into_iter()
            .map(|a| (a, failures.iter().filter(|f| f.starts_with(&format!("{a:?} "))).count()))
            .collect();
        assert!(
            failures.is_empty(),
            "{} mismatches in the keys of {} give-backs ({per_method:?}), first: {:#?}",
            failures.len(),
            4 * 2 * 400,
            &failures[..failures.len().min(4)]
        );
    });
}

#[test]
fn a_give_back_with_nothing_landed_restores_the_value_exactly() {
    nothing_landed(false);
}

/// A give-back with nothing landed restores each key's expiry to the millisecond (it was 1 ms
/// short when read as `TIME` plus `PTTL`; now `PEXPIRETIME`).
#[test]
fn a_give_back_with_nothing_landed_restores_the_expiry_exactly() {
    nothing_landed(true);
}

/// A grant that took a limit's last permits, then denials (which write nothing) and peeks:
/// the give-back is still exact, for every method.
#[test]
fn denials_and_peeks_after_a_grant_do_not_stop_an_exact_give_back() {
    let server = RedisServer::start();
    multi_thread_runtime().block_on(async {
        let mut connection = server.connection().await;
        for algorithm in Algorithm::ALL {
            let limiter = limiter(&server, algorithm, vec![per_year(3)]).await;
            for (case, at) in [None, Some(1_800_000_000_000_000_u64)]
                .into_iter()
                .enumerate()
            {
                let client = format!("d{case}");
                assert!(take(&limiter, &client, 1, at).await);
                let key = limiter.keys(&client, &"p").unwrap().remove(0);
                let before = dump(&mut connection, &key).await;
                let grant = reserve(&limiter, &client, 2, at).await;
                for later in [0, 1_000, 5_000_000] {
                    let at = at.map(|at| at + later);
                    assert!(
                        !take(&limiter, &client, 1, at).await,
                        "{algorithm:?}: spent"
                    );
                    match at {
                        Some(at) => drop(limiter.peek_at(&client, &"p", at).await.unwrap()),
                        None => drop(limiter.peek(&client, &"p").await.unwrap()),
                    }
                }
                let outcome = limiter.give_back(&client, &"p", &grant).await.unwrap();
                assert_eq!(outcome, vec![GivenBack::Restored], "{algorithm:?} {at:?}");
                assert_eq!(
                    dump(&mut connection, &key).await,
                    before,
                    "{algorithm:?} {at:?}"
                );
                assert_eq!(
                    drain(&limiter, &client, at, 5).await,
                    2,
                    "{algorithm:?} {at:?}"
                );
            }
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Claim 2: after other decisions, no over-admission; many grants, given back in any order.

#[derive(Debug, Clone, Copy)]
enum Op {
    Take {
        at: u64,
        n: u64,
    },
    Reserve {
        at: u64,
        n: u64,
    },
    /// Gives back the outstanding grant of this index (modulo how many there are).
    GiveBack {
        pick: u64,
    },
}

const W_US: u64 = 1_000_000;

/// A key's value as `DUMP` gives it; `None` for a missing key.
type KeyValue = Option<Vec<u8>>;
const BASE_US: u64 = 1_700_000_000 * W_US;

/// Random histories of takings, reservations and give-backs (each grant at most once, in any
/// order, interleaved), at non-decreasing injected times, on one client: the admissions that
/// stand (takings granted, grants not given back) must all pass again on a fresh client at
/// their own times (else the limit granted more than it allows), and at later probe times the
/// client may be no more generous than that fresh client.
fn model_check(
    algorithm: Algorithm,
    several: bool,
    histories: usize,
    seed: u64,
    blind_restore: bool,
) -> Result<(), String> {
    let server = RedisServer::start();
    let runtime = multi_thread_runtime();
    runtime.block_on(async {
        let mut connection = server.connection().await;
        let mut rules = vec![Rule::new(5, Duration::from_micros(W_US)).unwrap()];
        if several {
            rules.push(Rule::new(8, Duration::from_micros(3 * W_US)).unwrap());
        }
        let limiter = limiter(&server, algorithm, rules).await;
        let mut rng = Rng(seed);
        for case in 0..histories {
            let client = format!("m{case}");
            let mut at = BASE_US + rng.below(W_US);
            let mut ops = Vec::new();
            let mut standing: Vec<(u64, u64, Option<usize>)> = Vec::new();
            // Each outstanding grant, with its keys' values from before it (for the planted
            // blind restore).
            let mut outstanding: Vec<(usize, RedisGrant, Vec<KeyValue>)> = Vec::new();
            for step in 0..14 {
                at += match rng.below(4) {
                    0 => 0,
                    1 => rng.below(50_000),
                    2 => rng.below(400_000),
                    _ => rng.below(1_300_000),
                };
                let op = match rng.below(5) {
                    0 | 1 => Op::Reserve {
                        at,
                        n: 1 + rng.below(3),
                    },
                    2 => Op::Take {
                        at,
                        n: 1 + rng.below(2),
                    },
                    _ => Op::GiveBack { pick: rng.next() },
                };
                ops.push(op);
                match op {
                    Op::Take { at, n } => {
                        if take(&limiter, &client, n, Some(at)).await {
                            standing.push((at, n, None));
                        }
                    }
                    Op::Reserve { at, n } => {
                        let mut before = Vec::new();
                        for key in limiter.keys(&client, &"p").unwrap() {
                            before.push(dump(&mut connection, &key).await);
                        }
                        let (answer, grant) =
                            limiter.reserve_at(&client, &"p", n, at).await.unwrap();
                        if answer.decision().is_allowed() {
                            standing.push((at, n, Some(step)));
                            outstanding.push((step, grant.expect("a grant"), before));
                        }
                    }
                    Op::GiveBack { pick } => {
                        if !outstanding.is_empty() {
                            let index = (pick % outstanding.len() as u64) as usize;
                            let (id, grant, before) = outstanding.remove(index);
                            if blind_restore {
                                let keys = limiter.keys(&client, &"p").unwrap();
                                for (key, value) in keys.iter().zip(&before) {
                                    let command = match value {
                                        Some(value) => {
                                            let mut restore = redis::cmd("RESTORE");
                                            restore.arg(key).arg(0).arg(value).arg("REPLACE");
                                            restore
                                        }
                                        None => {
                                            let mut delete = redis::cmd("DEL");
                                            delete.arg(key);
                                            delete
                                        }
                                    };
                                    let _: redis::Value =
                                        command.query_async(&mut connection).await.unwrap();
                                }
                            } else {
                                limiter.give_back(&client, &"p", &grant).await.unwrap();
                            }
                            // Given back: the request it was made for is refused, whatever
                            // the limit keeps of it (a kept grant only makes the client
                            // stricter than the reference).
                            standing.retain(|(_, _, of)| *of != Some(id));
                        }
                    }
                }
            }
            // The standing admissions, replayed on a fresh client: each must pass.
            let reference = format!("r{case}");
            for &(at, n, _) in &standing {
                if !take(&limiter, &reference, n, Some(at)).await {
                    return Err(format!(
                        "{algorithm:?} several={several} case {case}: the admissions that stand \
                         ({standing:?}) exceed the limit: {n} at {at} does not pass again; \
                         history {ops:?}"
                    ));
                }
            }
            for probe in [0, 300_000, 1_000_000, 2_500_000] {
                let at = at + probe;
                let got = limiter.peek_at(&client, &"p", at).await.unwrap().decision();
                let want = limiter
                    .peek_at(&reference, &"p", at)
                    .await
                    .unwrap()
                    .decision();
                if (got.is_allowed() && !want.is_allowed()) || got.remaining() > want.remaining() {
                    return Err(format!(
                        "{algorithm:?} several={several} case {case}: at +{probe} us the client \
                         ({got:?}) is more generous than its standing admissions allow \
                         ({want:?}); history {ops:?}, standing {standing:?}"
                    ));
                }
            }
        }
        Ok(())
    })
}

#[test]
fn many_interleaved_grants_given_back_in_any_order_never_over_admit() {
    for algorithm in Algorithm::ALL {
        for several in [false, true] {
            if let Err(failure) = model_check(
                algorithm,
                several,
                250,
                0xDEAD_BEEF ^ algorithm as u64,
                false,
            ) {
                panic!("{failure}");
            }
        }
    }
}

/// Negative control of the checker above: with every give-back planted as a blind restore
/// (the keys' values from before the grant put back whatever landed since), it finds an
/// over-admission.
#[test]
fn the_model_checker_catches_a_blind_restore() {
    for algorithm in Algorithm::ALL {
        let failure = model_check(algorithm, false, 250, 0xDEAD_BEEF ^ algorithm as u64, true)
            .expect_err("a blind restore must be caught");
        assert!(
            failure.contains("exceed the limit") || failure.contains("more generous"),
            "{failure}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Claim 3: a grant is never given back twice.

/// Where another decision `D` lands around a grant given back twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Landing {
    /// No `D`: the two give-backs one after the other.
    Nowhere,
    /// `D` between the two give-backs.
    BetweenGiveBacks,
    /// `D` between the grant and its first give-back.
    BeforeFirstGiveBack,
}

/// Takes `P` (1 permit), reserves `A` (1), gives `A` back twice (with `D`, 1 permit, landing
/// where `landing` says), then counts the permits still granted: with the limit of 3, what
/// stands (P, D if any, and whatever is granted afterwards) must be at most 3.
async fn double_give_back(
    limiter: &Limiter,
    client: &str,
    at: Option<u64>,
    landing: Landing,
) -> Result<(), String> {
    assert!(take(limiter, client, 1, at).await, "P");
    let grant = reserve(limiter, client, 1, at).await;
    if landing == Landing::BeforeFirstGiveBack {
        assert!(take(limiter, client, 1, at).await, "D");
    }
    let first = limiter.give_back(client, &"p", &grant).await.unwrap();
    if landing == Landing::BetweenGiveBacks {
        assert!(take(limiter, client, 1, at).await, "D");
    }
    let second = limiter.give_back(client, &"p", &grant).await.unwrap();
    let more = drain(limiter, client, at, 5).await;
    let standing = 1 + u64::from(landing != Landing::Nowhere) + more;
    if standing > 3 {
        return Err(format!(
            "give-backs answered {first:?} then {second:?}; then {more} more granted: \
             {standing} admissions stand under a limit of 3"
        ));
    }
    Ok(())
}

fn double_give_back_every_method(landing: Landing) {
    let server = RedisServer::start();
    multi_thread_runtime().block_on(async {
        let mut failures = Vec::new();
        for algorithm in Algorithm::ALL {
            let limiter = limiter(&server, algorithm, vec![per_year(3)]).await;
            // The real clock, and one injected instant for every call (a reading no older than
            // the latest: the same).
            for (case, at) in [None, Some(1_800_000_000_000_000_u64)]
                .into_iter()
                .enumerate()
            {
                let client = format!("twice{case}");
                if let Err(failure) = double_give_back(&limiter, &client, at, landing).await {
                    failures.push(format!(
                        "{algorithm:?} (injected time: {}): {failure}",
                        at.is_some()
                    ));
                }
            }
        }
        assert!(failures.is_empty(), "{failures:#?}");
    });
}

/// A grant given back twice in a row is given back once: the second call finds its record
/// consumed (before the record, the windows took the permits off again, erasing the admission
/// made before the grant).
#[test]
fn a_grant_given_back_twice_in_a_row_is_given_back_once() {
    double_give_back_every_method(Landing::Nowhere);
}

/// After the first give-back, another decision can write the very value the grant wrote; the
/// second call, its record consumed, leaves it (before the record, it restored the value from
/// before, erasing the other decision's admission).
#[test]
fn a_grant_given_back_twice_with_a_decision_between_is_given_back_once() {
    double_give_back_every_method(Landing::BetweenGiveBacks);
}

/// The same when the first give-back took the permits off a window.
#[test]
fn a_grant_taken_off_then_given_back_again_is_given_back_once() {
    double_give_back_every_method(Landing::BeforeFirstGiveBack);
}

/// Concurrency: tasks on two limiters (two nodes) sharing one key reserve, take, and give their
/// own grants back (each once), racing one another. Every admission that stands must fit the
/// limit; for the windows the key's count is exactly what stands.
#[test]
fn racing_reservations_and_give_backs_never_over_admit() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        const LIMIT: u64 = 40;
        for algorithm in Algorithm::ALL {
            let nodes = [
                Arc::new(limiter(&server, algorithm, vec![per_year(LIMIT)]).await),
                Arc::new(limiter(&server, algorithm, vec![per_year(LIMIT)]).await),
            ];
            let standing = Arc::new(AtomicU64::new(0));
            let mut tasks = Vec::new();
            for task in 0..8_u64 {
                let limiter = Arc::clone(&nodes[(task % 2) as usize]);
                let standing = Arc::clone(&standing);
                tasks.push(tokio::spawn(async move {
                    let mut rng = Rng(0x1234_5678 + task * 7919);
                    let mut held: Vec<(u64, RedisGrant)> = Vec::new();
                    for _ in 0..120 {
                        match rng.below(4) {
                            0 => {
                                let n = 1 + rng.below(2);
                                if limiter.acquire("shared", &"p", n).await.unwrap().is_allowed() {
                                    standing.fetch_add(n, Ordering::SeqCst);
                                }
                            }
                            1 | 2 => {
                                let n = 1 + rng.below(3);
                                let (answer, grant) = limiter.reserve("shared", &"p", n).await.unwrap();
                                if answer.decision().is_allowed() {
                                    standing.fetch_add(n, Ordering::SeqCst);
                                    held.push((n, grant.unwrap()));
                                }
                            }
                            _ => {
                                if !held.is_empty() {
                                    let at = rng.below(held.len() as u64) as usize;
                                    let (n, grant) = held.swap_remove(at);
                                    limiter.give_back("shared", &"p", &grant).await.unwrap();
                                    standing.fetch_sub(n, Ordering::SeqCst);
                                }
                            }
                        }
                    }
                    // Half the tasks give everything they hold back at the end.
                    if task % 2 == 0 {
                        for (n, grant) in held {
                            limiter.give_back("shared", &"p", &grant).await.unwrap();
                            standing.fetch_sub(n, Ordering::SeqCst);
                        }
                    }
                }));
            }
            for task in tasks {
                task.await.unwrap();
            }
            let standing = standing.load(Ordering::SeqCst);
            let remaining = nodes[0].peek("shared", &"p").await.unwrap().remaining();
            let more = remaining; // what a fresh request could still take
            assert!(
                standing + more <= LIMIT,
                "{algorithm:?}: {standing} permits stand and {more} are still offered, over the limit of {LIMIT}"
            );
            if matches!(algorithm, Algorithm::FixedWindow | Algorithm::SlidingWindowCounter) {
                assert_eq!(
                    LIMIT - remaining,
                    standing,
                    "{algorithm:?}: the window counts exactly what stands"
                );
            }
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Claim 5: other ways in.

/// A key lost between the grant and its give-back (a restart without persistence) and written
/// again by another decision with the same value: the grant's record was lost with it, so the
/// give-back leaves the key (before the record, it restored the value from before, erasing the
/// other decision's admission).
#[test]
fn a_give_back_after_a_restart_leaves_an_admission_made_since() {
    let mut server = RedisServer::start();
    let runtime = multi_thread_runtime();
    let mut failures = Vec::new();
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
        let limiter = runtime.block_on(limiter(&server, algorithm, vec![per_year(3)]));
        let grant = runtime.block_on(reserve(&limiter, "lost", 1, None));
        server.restart();
        // The first round trips may meet the old connection.
        let d = runtime.block_on(async {
            for _ in 0..50 {
                if let Ok(answer) = limiter.decide("lost", &"p", 1).await {
                    return answer.decision().is_allowed();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            panic!("the limiter never reconnected");
        });
        assert!(d, "a fresh key after the restart grants");
        let (outcome, more) = runtime.block_on(async {
            let outcome = limiter.give_back("lost", &"p", &grant).await.unwrap();
            (outcome, drain(&limiter, "lost", None, 5).await)
        });
        if 1 + more > 3 {
            failures.push(format!(
                "{algorithm:?}: after the restart 1 admission, then the lost grant's give-back \
                 ({outcome:?}), then {more} more: {} since the loss under a limit of 3",
                1 + more
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Holds: a grant whose keys were lost (a restart without persistence) and nothing written
/// since: the give-back writes nothing (no key without an expiry is left behind).
#[test]
fn a_give_back_after_a_restart_with_nothing_since_writes_nothing() {
    let mut server = RedisServer::start();
    let runtime = multi_thread_runtime();
    let limiters: Vec<Limiter> = Algorithm::ALL
        .into_iter()
        .map(|algorithm| {
            runtime.block_on(limiter(
                &server,
                algorithm,
                vec![per_year(3), Rule::new(5, YEAR * 2).unwrap()],
            ))
        })
        .collect();
    let grants: Vec<RedisGrant> = limiters
        .iter()
        .map(|limiter| runtime.block_on(reserve(limiter, "gone", 2, None)))
        .collect();
    server.restart();
    runtime.block_on(async {
        let mut connection = server.connection().await;
        for (limiter, grant) in limiters.iter().zip(&grants) {
            let mut outcome = None;
            for _ in 0..50 {
                if let Ok(answer) = limiter.give_back("gone", &"p", grant).await {
                    outcome = Some(answer);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let outcome = outcome.expect("the limiter reconnects");
            assert_eq!(
                outcome,
                vec![GivenBack::Kept; 2],
                "{:?}",
                limiter.algorithm()
            );
            let size: i64 = redis::cmd("DBSIZE")
                .query_async(&mut connection)
                .await
                .unwrap();
            assert_eq!(
                size,
                0,
                "{:?}: the give-back wrote a key",
                limiter.algorithm()
            );
        }
    });
}

/// A grant given back under another client's name is refused (the grant names its keys), and
/// that client, which spent its limit, gets nothing back.
#[test]
fn a_grant_given_back_under_another_client_is_refused() {
    let server = RedisServer::start();
    multi_thread_runtime().block_on(async {
        let mut failures = Vec::new();
        for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
            let limiter = limiter(&server, algorithm, vec![per_year(3)]).await;
            assert_eq!(drain(&limiter, "bob", None, 5).await, 3);
            let grant = reserve(&limiter, "alice", 1, None).await;
            let answer = limiter.give_back("bob", &"p", &grant).await;
            assert!(
                matches!(
                    answer,
                    Err(tollgate::redis::RedisError::ForeignGrant { .. })
                ),
                "{algorithm:?}: {answer:?}"
            );
            let bob_gets = drain(&limiter, "bob", None, 5).await;
            if bob_gets > 0 {
                failures.push(format!(
                    "{algorithm:?}: alice's grant given back as bob's answered {answer:?}, and \
                     bob, who spent his 3, got {bob_gets} more"
                ));
            }
        }
        assert!(failures.is_empty(), "{failures:#?}");
    });
}

/// A grant given back to another limiter (another node's configuration, another method's
/// limiter in the Envoy service) is refused: its keys are not that limiter's.
#[test]
fn a_grant_given_back_to_another_limiter_is_refused() {
    let server = RedisServer::start();
    multi_thread_runtime().block_on(async {
        let first = limiter_with(
            &server.url(),
            Algorithm::FixedWindow,
            &[("a", vec![per_year(3)])],
        )
        .await;
        let second = limiter_with(
            &server.url(),
            Algorithm::FixedWindow,
            &[("b", vec![per_year(3)])],
        )
        .await;
        let mut spent = 0;
        while second.acquire("bob", &"b", 1).await.unwrap().is_allowed() {
            spent += 1;
        }
        assert_eq!(spent, 3);
        let (_, grant) = first.reserve("bob", &"a", 1).await.unwrap();
        let grant = grant.unwrap();
        let answer = second.give_back("bob", &"b", &grant).await;
        assert!(
            matches!(
                answer,
                Err(tollgate::redis::RedisError::ForeignGrant { .. })
            ),
            "{answer:?}"
        );
        let again = second.acquire("bob", &"b", 1).await.unwrap();
        assert!(
            again.is_denied(),
            "a grant of limiter `a` given back to limiter `b` answered {answer:?}, and bob, who \
             spent his 3 under `b`, was granted again"
        );
    });
}

/// Holds: a grant given back under another plan of its own limiter is refused, and touches
/// nothing.
#[test]
fn a_grant_given_back_under_another_plan_of_its_limiter_is_refused() {
    let server = RedisServer::start();
    multi_thread_runtime().block_on(async {
        let limiter = limiter_with(
            &server.url(),
            Algorithm::FixedWindow,
            &[("a", vec![per_year(3)]), ("b", vec![per_year(3)])],
        )
        .await;
        let (_, grant) = limiter.reserve("bob", &"a", 1).await.unwrap();
        let grant = grant.unwrap();
        for _ in 0..3 {
            assert!(limiter.acquire("bob", &"b", 1).await.unwrap().is_allowed());
        }
        assert!(limiter.give_back("bob", &"b", &grant).await.is_err());
        assert!(limiter.acquire("bob", &"b", 1).await.unwrap().is_denied());
    });
}

/// Holds: a key replaced by another program's value (another type, or a string) between the
/// grant and its give-back is left as that program wrote it.
#[test]
fn a_give_back_never_overwrites_another_programs_key() {
    let server = RedisServer::start();
    multi_thread_runtime().block_on(async {
        let mut connection = server.connection().await;
        for algorithm in Algorithm::ALL {
            let limiter = limiter(
                &server,
                algorithm,
                vec![per_year(3), Rule::new(9, YEAR * 2).unwrap()],
            )
            .await;
            for (case, foreign) in ["string", "list", "hash"].into_iter().enumerate() {
                let client = format!("f{case}");
                let grant = reserve(&limiter, &client, 1, None).await;
                let key = limiter.keys(&client, &"p").unwrap().remove(1);
                let _: () = redis::cmd("DEL")
                    .arg(&key)
                    .query_async(&mut connection)
                    .await
                    .unwrap();
                match foreign {
                    "string" => redis::cmd("SET")
                        .arg(&key)
                        .arg("theirs")
                        .query_async::<()>(&mut connection)
                        .await
                        .unwrap(),
                    "list" => redis::cmd("RPUSH")
                        .arg(&key)
                        .arg("theirs")
                        .query_async::<()>(&mut connection)
                        .await
                        .unwrap(),
                    _ => redis::cmd("HSET")
                        .arg(&key)
                        .arg("x")
                        .arg("theirs")
                        .query_async::<()>(&mut connection)
                        .await
                        .unwrap(),
                }
                let theirs = dump(&mut connection, &key).await;
                let outcome = limiter.give_back(&client, &"p", &grant).await;
                assert_eq!(
                    dump(&mut connection, &key).await,
                    theirs,
                    "{algorithm:?} {foreign}: {outcome:?}"
                );
                assert_eq!(
                    pexpiretime(&mut connection, &key).await,
                    -1,
                    "{algorithm:?} {foreign}"
                );
            }
        }
    });
}

/// Holds: a grant whose keys expired (a short window), then a new decision: the give-back
/// leaves the new key as it is, with its expiry, for every method.
#[test]
fn a_give_back_after_the_key_expired_leaves_the_new_key_alone() {
    let server = RedisServer::start();
    multi_thread_runtime().block_on(async {
        let mut connection = server.connection().await;
        for algorithm in Algorithm::ALL {
            let limiter = limiter(
                &server,
                algorithm,
                // Long enough that the new key outlives the checks below on a loaded machine.
                vec![Rule::new(2, Duration::from_millis(400)).unwrap()],
            )
            .await;
            let grant = reserve(&limiter, "x", 1, None).await;
            tokio::time::sleep(Duration::from_millis(900)).await;
            let key = limiter.keys("x", &"p").unwrap().remove(0);
            assert_eq!(
                dump(&mut connection, &key).await,
                None,
                "{algorithm:?}: expired"
            );
            assert!(take(&limiter, "x", 1, None).await);
            let value = dump(&mut connection, &key).await;
            let expiry = pexpiretime(&mut connection, &key).await;
            assert!(expiry > 0, "{algorithm:?}: a written key expires");
            let outcome = limiter.give_back("x", &"p", &grant).await.unwrap();
            assert_eq!(outcome, vec![GivenBack::Kept], "{algorithm:?}");
            assert_eq!(dump(&mut connection, &key).await, value, "{algorithm:?}");
            assert_eq!(
                pexpiretime(&mut connection, &key).await,
                expiry,
                "{algorithm:?}"
            );
        }
    });
}

/// Holds: every key a give-back leaves (restored, taken off, kept) still expires.
#[test]
fn every_key_left_by_give_backs_still_expires() {
    let server = RedisServer::start();
    multi_thread_runtime().block_on(async {
        let mut connection = server.connection().await;
        for algorithm in Algorithm::ALL {
            let limiter = limiter(
                &server,
                algorithm,
                vec![per_year(50), Rule::new(80, YEAR * 2).unwrap()],
            )
            .await;
            let mut rng = Rng(77 + algorithm as u64);
            let mut held = Vec::new();
            for _ in 0..60 {
                match rng.below(3) {
                    0 => {
                        let _ = take(&limiter, "e", 1, None).await;
                    }
                    1 => {
                        if let (answer, Some(grant)) = limiter.reserve("e", &"p", 1).await.unwrap()
                        {
                            assert!(answer.decision().is_allowed());
                            held.push(grant);
                        }
                    }
                    _ => {
                        if !held.is_empty() {
                            let at = rng.below(held.len() as u64) as usize;
                            let grant = held.swap_remove(at);
                            limiter.give_back("e", &"p", &grant).await.unwrap();
                        }
                    }
                }
                for key in limiter.keys("e", &"p").unwrap() {
                    let expiry = pexpiretime(&mut connection, &key).await;
                    assert!(expiry != -1, "{algorithm:?}: {key} has no expiry");
                }
            }
        }
    });
}

/// Holds: the largest fixed-window limit (2^53) and the largest grant: reserved, another permit
/// can not pass; given back, the whole limit passes again.
#[test]
fn a_grant_of_the_largest_limit_is_given_back_exactly() {
    let server = RedisServer::start();
    multi_thread_runtime().block_on(async {
        let max = Limiter::MAX_FIXED_WINDOW_LIMIT;
        let limiter = limiter(&server, Algorithm::FixedWindow, vec![per_year(max)]).await;
        let grant = reserve(&limiter, "h", max, None).await;
        assert!(!take(&limiter, "h", 1, None).await);
        assert_eq!(
            limiter.give_back("h", &"p", &grant).await.unwrap(),
            vec![GivenBack::Restored]
        );
        let a = reserve(&limiter, "h", max - 1, None).await;
        assert!(take(&limiter, "h", 1, None).await);
        assert_eq!(
            limiter.give_back("h", &"p", &a).await.unwrap(),
            vec![GivenBack::TakenOff]
        );
        assert_eq!(limiter.peek("h", &"p").await.unwrap().remaining(), max - 1);
        // A grant over the limit is refused and gives nothing to give back.
        let (answer, grant) = limiter.reserve("h", &"p", u64::MAX).await.unwrap();
        assert!(answer.decision().is_denied() && grant.is_none());
    });
}

// ---------------------------------------------------------------------------------------------
// Claim 4: the Envoy service on Redis.

const ENVOY_YAML: &str = r#"
domain: gb
descriptors:
  - key: a
    method: fixed_window
    limits:
      - {unit: year, requests_per_unit: 7}
      - {unit: day, requests_per_unit: 6}
  - key: b
    method: token_bucket
    rate_limit: {unit: year, requests_per_unit: 5}
  - key: c
    method: sliding_window_counter
    limits:
      - {unit: year, requests_per_unit: 6}
      - {unit: week, requests_per_unit: 9}
  - key: d
    method: sliding_window_log
    rate_limit: {unit: year, requests_per_unit: 5}
  - key: s
    method: fixed_window
    shadow_mode: true
    rate_limit: {unit: year, requests_per_unit: 1}
"#;

/// The tightest of each limited descriptor's limits (its bound per round).
const BOUNDS: [(&str, u64); 4] = [("a", 6), ("b", 5), ("c", 6), ("d", 5)];

fn descriptor(key: &str, value: &str, hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: key.to_owned(),
            value: value.to_owned(),
        }],
        hits_addend: hits.map(|value| UInt64Value { value }),
        ..RateLimitDescriptor::default()
    }
}

/// Four threads race in each round on one client value per round, sending requests of two or
/// three descriptors (mixed methods, several limits, a descriptor sent twice, shadow mode,
/// per-descriptor and per-request hits). Per round and descriptor, the permits of the requests
/// answered OK must fit its limit; and at the end, the windows' keys count exactly what the
/// requests answered OK took (a refused request is charged to none).
#[test]
fn envoy_on_redis_racing_requests_never_over_grant_and_refusals_charge_no_window() {
    const THREADS: usize = 4;
    const ROUNDS: usize = 200;
    let redis = RedisServer::start();
    let runtime = multi_thread_runtime();
    let config = RlsConfig::from_yaml_str("gb.yaml", ENVOY_YAML).expect("valid");
    let store = StateStore::Redis {
        url: redis.url(),
        policy: FailurePolicy::Error,
        timeout: Duration::from_secs(5),
    };
    // Two instances sharing the Redis state, as a fleet does.
    let servers = [
        runtime
            .block_on(RateLimitServer::new(&config, store.clone()))
            .expect("the service builds on Redis"),
        runtime
            .block_on(RateLimitServer::new(&config, store))
            .expect("the service builds on Redis"),
    ];
    let barrier = Arc::new(Barrier::new(THREADS));
    // Per round, per descriptor key: permits of the requests answered OK.
    let granted: Arc<Mutex<HashMap<(usize, String), u64>>> = Arc::default();
    let workers: Vec<_> = (0..THREADS)
        .map(|thread| {
            let server = servers[thread % 2].clone();
            let (barrier, granted) = (Arc::clone(&barrier), Arc::clone(&granted));
            thread::spawn(move || {
                let runtime = rls_support::runtime();
                let mut rng = Rng(0xABCD_0000 + thread as u64 * 104_729);
                for round in 0..ROUNDS {
                    let value = format!("r{round}");
                    barrier.wait();
                    for _ in 0..4 {
                        let keys = ["a", "b", "c", "d", "s"];
                        let count = 2 + rng.below(2) as usize;
                        let mut descriptors = Vec::new();
                        let request_hits = if rng.below(4) == 0 { 2 } else { 0 };
                        for _ in 0..count {
                            let key = keys[rng.below(keys.len() as u64) as usize];
                            let hits = match rng.below(3) {
                                0 => None,
                                1 => Some(1),
                                _ => Some(2),
                            };
                            descriptors.push(descriptor(key, &value, hits));
                        }
                        let request = RateLimitRequest {
                            domain: "gb".to_owned(),
                            descriptors: descriptors.clone(),
                            hits_addend: request_hits,
                        };
                        let response = runtime.block_on(server.decide(&request)).expect("decided");
                        if response.overall_code == Code::Ok as i32 {
                            let mut granted = granted.lock().unwrap();
                            for d in &descriptors {
                                let hits = d
                                    .hits_addend
                                    .as_ref()
                                    .map_or(u64::from(request_hits.max(1)), |h| h.value.max(1));
                                *granted
                                    .entry((round, d.entries[0].key.clone()))
                                    .or_default() += hits;
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("a worker panicked");
    }
    let granted = granted.lock().unwrap().clone();
    let mut over = Vec::new();
    for round in 0..ROUNDS {
        for (key, bound) in BOUNDS {
            let got = granted.get(&(round, key.to_owned())).copied().unwrap_or(0);
            if got > bound {
                over.push(format!(
                    "round {round}: descriptor {key} granted {got} of {bound}"
                ));
            }
        }
    }
    assert!(over.is_empty(), "{over:#?}");
    // The windows' keys: each counts exactly what the OK requests took.
    runtime.block_on(async {
        let mut connection = redis.connection().await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("tollgate-rls:*")
            .query_async(&mut connection)
            .await
            .unwrap();
        let mut charged: HashMap<(String, String), u64> = HashMap::new();
        for key in keys {
            // tollgate-rls:{<plan>:r<round>}:<method>:<limit>/<window>us
            let method = key.rsplit(':').nth(1).unwrap().to_owned();
            let rule = key.rsplit(':').next().unwrap().to_owned();
            let round = key
                .split(":r")
                .nth(1)
                .and_then(|r| r.split('}').next())
                .unwrap()
                .to_owned();
            if method == "fw" || method == "swc" {
                let c: Option<u64> = redis::cmd("HGET")
                    .arg(&key)
                    .arg("c")
                    .query_async(&mut connection)
                    .await
                    .unwrap();
                charged.insert((round, format!("{method} {rule}")), c.unwrap_or(0));
            }
        }
        let mut wrong = Vec::new();
        for ((round, what), c) in &charged {
            let descriptor = if what.starts_with("fw 7/") || what.starts_with("fw 6/") {
                "a"
            } else if what.starts_with("fw 1/") {
                "s"
            } else {
                "c"
            };
            if descriptor == "s" {
                continue;
            }
            let round: usize = round.parse().unwrap();
            let ok = granted
                .get(&(round, descriptor.to_owned()))
                .copied()
                .unwrap_or(0);
            if *c != ok {
                wrong.push(format!(
                    "round {round}: {what} counts {c}, the OK requests took {ok}"
                ));
            }
        }
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut connection)
            .await
            .unwrap();
        let calls = |command: &str| {
            stats
                .lines()
                .find(|line| line.starts_with(&format!("cmdstat_{command}:")))
                .and_then(|line| line.split("calls=").nth(1))
                .and_then(|rest| rest.split(',').next())
                .map_or(0, |calls| calls.parse::<u64>().unwrap())
        };
        // Grants were given back (`give_back.lua`'s RESTORE or DEL: nothing else calls them).
        assert!(
            calls("restore") + calls("del") > 0,
            "no grant was given back: the race did not test the give-back"
        );
        assert!(!charged.is_empty());
        assert!(
            wrong.is_empty(),
            "{} of {}: {wrong:#?}",
            wrong.len(),
            charged.len()
        );
    });
}

// ---------------------------------------------------------------------------------------------
// Deny cache.

/// A client denied while a grant held its last permit is not refused from this node's deny
/// cache once the grant is given back: the node forgets its cached denial of the client.
#[test]
fn a_denial_cached_before_a_give_back_does_not_outlive_it() {
    let server = RedisServer::start();
    multi_thread_runtime().block_on(async {
        let mut failures = Vec::new();
        for algorithm in Algorithm::ALL {
            // The default deny cache.
            let limiter = RedisRateLimiter::builder(server.url(), algorithm)
                .plan_limits("p", vec![per_year(3)])
                .timeout(DECISION_TIMEOUT)
                .build()
                .await
                .unwrap();
            assert!(limiter.acquire("z", &"p", 2).await.unwrap().is_allowed());
            let (_, grant) = limiter.reserve("z", &"p", 1).await.unwrap();
            let grant = grant.unwrap();
            let denied = limiter.decide("z", &"p", 1).await.unwrap();
            assert!(denied.decision().is_denied());
            assert_eq!(
                limiter.give_back("z", &"p", &grant).await.unwrap(),
                vec![GivenBack::Restored]
            );
            let peek = limiter.peek("z", &"p").await.unwrap();
            let after = limiter.decide("z", &"p", 1).await.unwrap();
            if after.decision().is_denied() {
                failures.push(format!(
                    "{algorithm:?}: after the give-back Redis offers {} (peek allowed: {}), yet \
                     the request is denied by {:?}, retry in {:?}",
                    peek.remaining(),
                    peek.is_allowed(),
                    after.source(),
                    after.decision().retry_after()
                ));
            }
        }
        assert!(failures.is_empty(), "{failures:#?}");
    });
}

const LOCKOUT_YAML: &str = r#"
domain: lock
method: fixed_window
descriptors:
  - key: a
    rate_limit: {unit: year, requests_per_unit: 3}
  - key: b
    rate_limit: {unit: year, requests_per_unit: 1}
"#;

/// The Envoy service on Redis, with another instance sharing the keys (played here by a
/// `RedisRateLimiter` on the same key, as the other instance's reserving call would). The other
/// instance's request reserves `a`'s last permit; this instance's request `[a]` meets it, is
/// denied by Redis, and `a` enters this instance's deny cache (its denial lasts to the end of
/// the year). The other request is refused by another of its descriptors and gives `a`'s permit
/// back: this instance holds its cached denial a second at most, then grants `[a]` again.
#[test]
fn envoy_on_redis_a_give_back_elsewhere_is_seen_within_the_deny_caches_hold() {
    let redis = RedisServer::start();
    multi_thread_runtime().block_on(async {
        let config = RlsConfig::from_yaml_str("lock.yaml", LOCKOUT_YAML).expect("valid");
        let store = StateStore::Redis {
            url: redis.url(),
            policy: FailurePolicy::Error,
            timeout: Duration::from_secs(5),
        };
        let server = RateLimitServer::new(&config, store)
            .await
            .expect("builds on Redis");
        let ok = async |descriptors: Vec<RateLimitDescriptor>| {
            let request = RateLimitRequest {
                domain: "lock".to_owned(),
                descriptors,
                hits_addend: 0,
            };
            server.decide(&request).await.expect("decided").overall_code == Code::Ok as i32
        };
        assert!(ok(vec![descriptor("a", "v", None)]).await);
        assert!(ok(vec![descriptor("a", "v", None)]).await);
        let mut connection = redis.connection().await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("tollgate-rls:*:1:v}:fw:3/*")
            .query_async(&mut connection)
            .await
            .unwrap();
        assert_eq!(keys.len(), 1, "{keys:?}");
        let plan = keys[0]["tollgate-rls:{".len()..]
            .split(':')
            .next()
            .unwrap()
            .to_owned();
        let other = RedisRateLimiter::builder(redis.url(), Algorithm::FixedWindow)
            .key_prefix("tollgate-rls")
            .plan_limits(plan.clone(), vec![per_year(3)])
            .timeout(DECISION_TIMEOUT)
            .build()
            .await
            .unwrap();
        assert_eq!(
            other.keys("1:v", &plan).unwrap(),
            keys,
            "the other instance's key is `a`'s"
        );
        let (_, grant) = other.reserve("1:v", &plan, 1).await.unwrap();
        let grant = grant.expect("the last permit");
        assert!(
            !ok(vec![descriptor("a", "v", None)]).await,
            "held by the other's grant"
        );
        assert_eq!(
            other.give_back("1:v", &plan, &grant).await.unwrap(),
            vec![GivenBack::Restored]
        );
        let offered = other.peek("1:v", &plan).await.unwrap().remaining();
        assert_eq!(offered, 1);
        // Refused from the cache at first, then asked of Redis once the hold ends (1 s).
        let started = std::time::Instant::now();
        while !ok(vec![descriptor("a", "v", None)]).await {
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "Redis offers `a` {offered} permit again, yet this instance still refuses `[a]`"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Failure policies.

/// Holds: while Redis does not answer, a reservation is answered by the failure policy with
/// no grant to give back (FailOpen allows, FailClosed denies, Local decides in process), and
/// Redis's own state is untouched by what the policy answered once Redis is back (what a
/// timed-out round trip took is applied there, as documented: it only makes the limit
/// stricter).
#[test]
fn a_reservation_answered_by_a_failure_policy_has_nothing_to_give_back() {
    use tollgate::redis::Source;
    let server = RedisServer::start();
    multi_thread_runtime().block_on(async {
        for (policy, source, allowed) in [
            (FailurePolicy::FailOpen, Source::FailOpen, true),
            (FailurePolicy::FailClosed, Source::FailClosed, false),
            (FailurePolicy::Local { share: 1.0 }, Source::Local, true),
        ] {
            let limiter = RedisRateLimiter::builder(server.url(), Algorithm::FixedWindow)
                .plan_limits("p", vec![per_year(3)])
                .timeout(Duration::from_millis(100))
                .failure_policy(policy)
                .build()
                .await
                .unwrap();
            let client = format!("{source:?}");
            server.pause();
            let reserved = limiter.reserve(&client, &"p", 1).await;
            server.resume();
            let (answer, grant) = reserved.unwrap();
            assert_eq!(answer.source(), source, "{policy:?}");
            assert_eq!(answer.decision().is_allowed(), allowed, "{policy:?}");
            assert!(
                grant.is_none(),
                "{policy:?}: a policy's answer has no grant"
            );
            // Let the breaker's one failure pass and Redis run what it was sent.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let remaining = limiter.peek(&client, &"p").await.unwrap().remaining();
            assert!(remaining <= 3, "{policy:?}");
        }
    });
}

/// A give-back sent to a stalled server times out, and the server runs it once it goes on; a
/// retry (which the error invites: the grant may or may not have been given back) then finds
/// the record consumed and gives nothing more: what stands never passes the limit.
#[test]
fn a_timed_out_give_back_may_be_retried_and_gives_back_once() {
    let server = RedisServer::start();
    multi_thread_runtime().block_on(async {
        let limiter = RedisRateLimiter::builder(server.url(), Algorithm::FixedWindow)
            .plan_limits("p", vec![per_year(3)])
            .timeout(Duration::from_millis(100))
            .deny_cache(0)
            .build()
            .await
            .unwrap();
        assert!(take(&limiter, "t", 1, None).await, "P");
        let grant = reserve(&limiter, "t", 1, None).await;
        server.pause();
        let first = limiter.give_back("t", &"p", &grant).await;
        server.resume();
        assert!(
            first.is_err(),
            "a stalled server times the give-back out: {first:?}"
        );
        assert!(
            matches!(first, Err(tollgate::redis::RedisError::Timeout { .. })),
            "a timeout is reported as one: {first:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The caller, told the grant may not have been given back, tries again.
        let second = limiter.give_back("t", &"p", &grant).await.unwrap();
        let more = drain(&limiter, "t", None, 5).await;
        assert!(
            more < 3,
            "after a timed-out give-back and its retry ({second:?}), {more} more were granted \
             beside P: {} stand under a limit of 3",
            1 + more
        );
    });
}
