//! Review: attacks on refunds (`is_negative_hits`: `RateLimiterService::refund`,
//! `Method::refund`, `store::with_state`) and on the eviction guard of the give-back
//! (`store::give_back`), through the public API only.

mod rls_support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::google::protobuf::UInt64Value;
use rls_support::{descriptor, in_process as server, runtime};
use tollgate::envoy::proto::rate_limit_response::Code;
use tollgate::envoy::proto::{RateLimitRequest, RateLimitResponse};
use tollgate::envoy::{RateLimitServer, RlsConfig};

fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "refund".to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

fn with_hits(key: &str, value: &str, hits: u64) -> RateLimitDescriptor {
    let mut made = descriptor(&[(key, value)]);
    made.hits_addend = Some(UInt64Value { value: hits });
    made
}

fn take(key: &str, value: &str) -> RateLimitDescriptor {
    with_hits(key, value, 1)
}

fn refund(key: &str, value: &str, hits: u64) -> RateLimitDescriptor {
    let mut made = with_hits(key, value, hits);
    made.is_negative_hits = true;
    made
}

fn decide(
    runtime: &tokio::runtime::Runtime,
    server: &RateLimitServer,
    request: &RateLimitRequest,
) -> RateLimitResponse {
    runtime
        .block_on(server.decide(request))
        .expect("the request is decided")
}

fn is_ok(response: &RateLimitResponse) -> bool {
    response.overall_code == Code::Ok as i32
}

/// Sends `descriptor` alone `tries` times; how many were answered OK.
fn oks(
    runtime: &tokio::runtime::Runtime,
    server: &RateLimitServer,
    descriptor: &RateLimitDescriptor,
    tries: u64,
) -> u64 {
    let request = request(vec![descriptor.clone()]);
    (0..tries)
        .filter(|_| is_ok(&decide(runtime, server, &request)))
        .count() as u64
}

fn give(
    runtime: &tokio::runtime::Runtime,
    server: &RateLimitServer,
    descriptor: RateLimitDescriptor,
) {
    let response = decide(runtime, server, &request(vec![descriptor]));
    assert!(is_ok(&response), "a refund is answered OK");
}

const REFUNDING: [&str; 3] = ["token_bucket", "fixed_window", "sliding_window_counter"];
const ALL: [&str; 4] = [
    "token_bucket",
    "fixed_window",
    "sliding_window_counter",
    "sliding_window_log",
];

fn yaml(method: &str, unit: &str, limit: u64) -> String {
    if method == "sliding_window_log" {
        return format!(
            "domain: refund\nmethod: {method}\ndescriptors:\n  - key: user\n    rate_limit: {{unit: {unit}, requests_per_unit: {limit}}}\n"
        );
    }
    format!(
        "domain: refund\nmethod: {method}\ndescriptors:\n  - key: user\n    rate_limit: {{unit: {unit}, requests_per_unit: {limit}}}\n  - key: tiers\n    limits:\n      - {{unit: {unit}, requests_per_unit: {limit}}}\n      - {{unit: year, requests_per_unit: {}}}\n",
        limit * 3
    )
}

/// Take 0, refund n (n up to u64::MAX): nothing more than a fresh limit.
#[test]
fn a_refund_to_an_unspent_client_gives_nothing() {
    const LIMIT: u64 = 5;
    let rt = runtime();
    for method in ALL {
        for n in [1, 5, 100, u64::MAX] {
            let server = server(&rt, &yaml(method, "year", LIMIT), 4096);
            give(&rt, &server, refund("user", "ann", n));
            // Once more, now that a first taking made a state: a fresh state, refunded.
            assert_eq!(
                oks(&rt, &server, &take("user", "ann"), 1),
                1,
                "{method} n={n}"
            );
            give(&rt, &server, refund("user", "ann", n));
            let more = oks(&rt, &server, &take("user", "ann"), 3 * LIMIT);
            // The sliding log takes nothing back: the first permit stays counted.
            let expected = if method == "sliding_window_log" {
                LIMIT - 1
            } else {
                LIMIT
            };
            assert_eq!(
                more, expected,
                "{method}: take 1, refund {n}: {more} more passed of a limit of {LIMIT}"
            );
        }
    }
}

/// Take the limit, refund limit+100 or u64::MAX: at most the limit comes back.
#[test]
fn a_refund_past_what_was_taken_gives_back_at_most_the_limit() {
    const LIMIT: u64 = 4;
    let rt = runtime();
    for method in ALL {
        for n in [LIMIT + 100, u64::MAX, u64::MAX - 1, u64::MAX / 2 + 1] {
            let server = server(&rt, &yaml(method, "year", LIMIT), 4096);
            assert_eq!(oks(&rt, &server, &take("user", "bob"), LIMIT), LIMIT);
            for _ in 0..3 {
                give(&rt, &server, refund("user", "bob", n));
            }
            let more = oks(&rt, &server, &take("user", "bob"), 3 * LIMIT);
            let expected = if method == "sliding_window_log" {
                0
            } else {
                LIMIT
            };
            assert_eq!(
                more, expected,
                "{method}: spent {LIMIT}, refunded {n} thrice, then {more} passed"
            );
        }
    }
}

/// Hits taken with a large hits_addend, then a refund of u64::MAX: at most the limit again.
#[test]
fn a_huge_refund_after_a_large_taking_gives_back_at_most_the_limit() {
    const LIMIT: u64 = 1_000;
    let rt = runtime();
    for method in REFUNDING {
        let server = server(&rt, &yaml(method, "year", LIMIT), 4096);
        assert!(is_ok(&decide(
            &rt,
            &server,
            &request(vec![with_hits("user", "big", LIMIT)])
        )));
        give(&rt, &server, refund("user", "big", u64::MAX));
        assert!(
            is_ok(&decide(
                &rt,
                &server,
                &request(vec![with_hits("user", "big", LIMIT)])
            )),
            "{method}: the whole limit back"
        );
        assert!(
            !is_ok(&decide(
                &rt,
                &server,
                &request(vec![with_hits("user", "big", 1)])
            )),
            "{method}: one past the refunded limit"
        );
        // Attempts of more than the limit (refused) and refunds of everything interleaved.
        give(&rt, &server, refund("user", "big", u64::MAX));
        assert!(!is_ok(&decide(
            &rt,
            &server,
            &request(vec![with_hits("user", "big", LIMIT + 1)])
        )));
        assert!(!is_ok(&decide(
            &rt,
            &server,
            &request(vec![with_hits("user", "big", u64::MAX)])
        )));
        let more = oks(&rt, &server, &take("user", "big"), LIMIT + 10);
        assert_eq!(more, LIMIT, "{method}");
    }
}

/// A client of several limits: take the tighter limit, refund everything: at most each limit
/// comes back (the tighter one passes exactly its limit; the looser one never exceeds its own).
#[test]
fn a_refund_to_a_client_of_several_limits_gives_back_at_most_each_limit() {
    const LIMIT: u64 = 4;
    let rt = runtime();
    for method in REFUNDING {
        let server = server(&rt, &yaml(method, "year", LIMIT), 4096);
        assert_eq!(oks(&rt, &server, &take("tiers", "t"), 10 * LIMIT), LIMIT);
        give(&rt, &server, refund("tiers", "t", u64::MAX));
        assert_eq!(
            oks(&rt, &server, &take("tiers", "t"), 10 * LIMIT),
            LIMIT,
            "{method}: second"
        );
        give(&rt, &server, refund("tiers", "t", u64::MAX));
        assert_eq!(
            oks(&rt, &server, &take("tiers", "t"), 10 * LIMIT),
            LIMIT,
            "{method}: third"
        );
        // The looser yearly limit (3 * LIMIT) counted 12 permits, refunded 8 of them: its own
        // count is now LIMIT * 3 - (2 * LIMIT refunded) ... every refund of u64::MAX zeroes
        // each limit's count, so the tiers pass LIMIT each time; never more.
        give(&rt, &server, refund("tiers", "t", 2));
        assert_eq!(
            oks(&rt, &server, &take("tiers", "t"), 10 * LIMIT),
            2,
            "{method}: a refund of 2"
        );
        // A client of several limits that took nothing gets nothing from a refund.
        give(&rt, &server, refund("tiers", "fresh", u64::MAX));
        assert_eq!(
            oks(&rt, &server, &take("tiers", "fresh"), 10 * LIMIT),
            LIMIT,
            "{method}: fresh"
        );
    }
}

/// Refunds to clients the service does not hold make no state: at capacity 8, a spent client
/// stays spent through thousands of refunds to distinct unknown clients (an inserted state would
/// evict it, or a refund landing on it would un-spend it).
#[test]
fn refunds_to_unknown_clients_make_no_state_and_touch_no_other() {
    const LIMIT: u64 = 3;
    let rt = runtime();
    for method in REFUNDING {
        let server = server(&rt, &yaml(method, "year", LIMIT), 8);
        for at in 0..4 {
            assert_eq!(
                oks(&rt, &server, &take("user", &format!("spent{at}")), LIMIT),
                LIMIT
            );
        }
        for at in 0..5_000 {
            give(
                &rt,
                &server,
                refund("user", &format!("nobody{at}"), u64::MAX),
            );
        }
        for at in 0..4 {
            assert_eq!(
                oks(
                    &rt,
                    &server,
                    &take("user", &format!("spent{at}")),
                    2 * LIMIT
                ),
                0,
                "{method}: spent{at} un-spent by refunds to other clients"
            );
        }
    }
}

/// At capacity 8 with clients churning (evictions), a refund to an evicted client never lands on
/// the client that took its slot: each new client spends its limit, every earlier client is
/// refunded everything, and the new one must stay spent.
#[test]
fn refunds_to_evicted_clients_never_land_on_the_next_holder() {
    const LIMIT: u64 = 2;
    let rt = runtime();
    for method in REFUNDING {
        let server = server(&rt, &yaml(method, "year", LIMIT), 8);
        let mut leaks = Vec::new();
        for at in 0..600_usize {
            let me = format!("c{at}");
            assert_eq!(
                oks(&rt, &server, &take("user", &me), LIMIT),
                LIMIT,
                "{method}: c{at} fresh"
            );
            for back in at.saturating_sub(40)..at {
                give(&rt, &server, refund("user", &format!("c{back}"), u64::MAX));
            }
            if oks(&rt, &server, &take("user", &me), 1) != 0 {
                leaks.push(at);
            }
        }
        assert!(
            leaks.is_empty(),
            "{method}: refunds to other clients un-spent {leaks:?}"
        );
    }
}

/// Many threads refund u64::MAX to a spent client at once, while others take: the takers get at
/// most one limit more in all.
#[test]
fn concurrent_refund_floods_give_back_at_most_one_limit() {
    const LIMIT: u64 = 50;
    const THREADS: usize = 4;
    for method in REFUNDING {
        let rt = runtime();
        let server = server(&rt, &yaml(method, "year", LIMIT), 4096);
        assert_eq!(oks(&rt, &server, &take("user", "flood"), LIMIT), LIMIT);
        let barrier = Arc::new(Barrier::new(THREADS));
        let granted = Arc::new(AtomicU64::new(0));
        let workers: Vec<_> = (0..THREADS)
            .map(|thread| {
                let (server, barrier, granted) =
                    (server.clone(), Arc::clone(&barrier), Arc::clone(&granted));
                thread::spawn(move || {
                    let rt = runtime();
                    barrier.wait();
                    for _ in 0..400 {
                        if thread % 2 == 0 {
                            give(&rt, &server, refund("user", "flood", u64::MAX));
                        } else if oks(&rt, &server, &take("user", "flood"), 1) == 1 {
                            granted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().expect("a worker");
        }
        // Every refund of u64::MAX may zero the count: takers may be granted many times over
        // (each grant refunded after). What must hold: the state is never more generous than a
        // fresh one, so right now at most LIMIT more pass.
        let after = oks(&rt, &server, &take("user", "flood"), 3 * LIMIT);
        assert!(
            after <= LIMIT,
            "{method}: {after} passed after the flood, of {LIMIT}"
        );
        eprintln!(
            "{method}: granted {} during the flood",
            granted.load(Ordering::Relaxed)
        );
    }
}

/// Honest callers: each thread takes one permit and, on an OK answer, sometimes refunds it.
/// The limit's count must be exactly OKs - refunds (in one yearly window): a refund is never lost
/// nor doubled, and never more generous.
#[test]
fn honest_concurrent_refunds_are_counted_exactly() {
    const LIMIT: u64 = 600;
    const THREADS: usize = 4;
    for method in REFUNDING {
        let rt = runtime();
        let server = server(&rt, &yaml(method, "year", LIMIT), 4096);
        let barrier = Arc::new(Barrier::new(THREADS));
        let workers: Vec<_> = (0..THREADS)
            .map(|thread| {
                let (server, barrier) = (server.clone(), Arc::clone(&barrier));
                thread::spawn(move || {
                    let rt = runtime();
                    let (mut granted, mut refunded) = (0_u64, 0_u64);
                    barrier.wait();
                    for at in 0..500_u64 {
                        if oks(&rt, &server, &take("user", "shared"), 1) == 1 {
                            granted += 1;
                            if (at + thread as u64).is_multiple_of(3) {
                                give(&rt, &server, refund("user", "shared", 1));
                                refunded += 1;
                            }
                        }
                    }
                    (granted, refunded)
                })
            })
            .collect();
        let (mut granted, mut refunded) = (0, 0);
        for worker in workers {
            let (g, r) = worker.join().expect("a worker");
            granted += g;
            refunded += r;
        }
        let net = granted - refunded;
        assert!(net <= LIMIT, "{method}: net {net} of {LIMIT}");
        let after = oks(&rt, &server, &take("user", "shared"), 2 * LIMIT);
        if method == "token_bucket" {
            // The bucket refills over the year: a few nanoseconds' worth at most.
            assert!(
                after + net <= LIMIT + 1,
                "{method}: {granted} granted, {refunded} refunded, then {after} passed of {LIMIT}"
            );
        } else {
            assert_eq!(
                after + net,
                LIMIT,
                "{method}: {granted} granted, {refunded} refunded, then {after} passed of {LIMIT}"
            );
        }
    }
}

/// Refunds after a reload changed the limit: the state under the earlier limit is not the one
/// the later limit counts; a refund never makes the client more generous than a fresh one under
/// the current limit.
#[test]
fn refunds_after_reloads_give_back_at_most_the_current_limit() {
    let rt = runtime();
    for method in REFUNDING {
        let server = server(&rt, &yaml(method, "year", 10), 4096);
        assert_eq!(oks(&rt, &server, &take("user", "r"), 10), 10);
        let smaller = RlsConfig::from_yaml_str("s.yaml", &yaml(method, "year", 4)).expect("valid");
        let larger = RlsConfig::from_yaml_str("l.yaml", &yaml(method, "year", 10)).expect("valid");
        rt.block_on(server.reload(&smaller)).expect("a reload");
        give(&rt, &server, refund("user", "r", u64::MAX));
        let after = oks(&rt, &server, &take("user", "r"), 30);
        assert!(after <= 4, "{method}: {after} passed under a limit of 4");
        give(&rt, &server, refund("user", "r", u64::MAX));
        let again = oks(&rt, &server, &take("user", "r"), 30);
        assert!(
            again <= 4,
            "{method}: {again} passed under a limit of 4 after a refund"
        );
        rt.block_on(server.reload(&larger)).expect("a reload");
        give(&rt, &server, refund("user", "r", u64::MAX));
        let larger_after = oks(&rt, &server, &take("user", "r"), 30);
        assert!(
            larger_after <= 10,
            "{method}: {larger_after} passed under a limit of 10"
        );
        give(&rt, &server, refund("user", "r", 3));
        let three = oks(&rt, &server, &take("user", "r"), 30);
        assert!(three <= 3, "{method}: {three} passed after a refund of 3");
    }
}

/// Refunds racing reloads, from several threads: after it all, never more than one limit passes.
#[test]
fn refunds_racing_reloads_never_exceed_a_fresh_state() {
    for method in REFUNDING {
        let rt = runtime();
        let server = server(&rt, &yaml(method, "year", 8), 4096);
        let stop = Arc::new(AtomicBool::new(false));
        let reloader = {
            let (server, stop) = (server.clone(), Arc::clone(&stop));
            let a = RlsConfig::from_yaml_str("a.yaml", &yaml(method, "year", 8)).expect("valid");
            let b = RlsConfig::from_yaml_str("b.yaml", &yaml(method, "year", 5)).expect("valid");
            thread::spawn(move || {
                let rt = runtime();
                let mut at = 0_u64;
                while !stop.load(Ordering::Relaxed) {
                    rt.block_on(server.reload(if at.is_multiple_of(2) { &b } else { &a }))
                        .expect("reload");
                    at += 1;
                    thread::yield_now();
                }
                // End on the larger limit.
                rt.block_on(server.reload(&a)).expect("reload");
                at
            })
        };
        let workers: Vec<_> = (0..2)
            .map(|thread| {
                let server = server.clone();
                thread::spawn(move || {
                    let rt = runtime();
                    for _ in 0..2_000 {
                        if thread == 0 {
                            give(&rt, &server, refund("user", "rr", u64::MAX));
                        } else {
                            let _ = oks(&rt, &server, &take("user", "rr"), 1);
                        }
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().expect("a worker");
        }
        stop.store(true, Ordering::Relaxed);
        let reloads = reloader.join().expect("reloader");
        assert!(reloads > 0);
        give(&rt, &server, refund("user", "rr", u64::MAX));
        let after = oks(&rt, &server, &take("user", "rr"), 30);
        assert!(after <= 8, "{method}: {after} passed under a limit of 8");
    }
}

/// Waits until the wall clock is `lead_ms` past a second boundary.
fn just_after_a_second(lead_ms: u64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch");
    let into = now.subsec_millis() as u64;
    let wait = (1_000 + lead_ms - into) % 1_000;
    thread::sleep(std::time::Duration::from_millis(wait.max(1)));
}

/// Refunds racing a window boundary (`unit: second`): a refund after the window rolled gives the
/// next window nothing. Whatever the timing, right after a spend-and-refund at most LIMIT more
/// pass (a fresh window or the refunded one, never the two added up).
#[test]
fn refunds_at_a_second_boundary_never_exceed_the_limit() {
    const LIMIT: u64 = 5;
    let rt = runtime();
    for method in ["fixed_window", "sliding_window_counter", "token_bucket"] {
        let server = server(&rt, &yaml(method, "second", LIMIT), 4096);
        for round in 0..6 {
            let me = format!("b{round}");
            // Spend late in a second, refund across the boundary.
            just_after_a_second(980);
            let spent = oks(&rt, &server, &take("user", &me), LIMIT);
            give(&rt, &server, refund("user", &me, u64::MAX));
            give(&rt, &server, refund("user", &me, u64::MAX));
            let more = oks(&rt, &server, &take("user", &me), 3 * LIMIT);
            assert!(
                more <= LIMIT,
                "{method} round {round}: spent {spent}, refunded, then {more} passed of {LIMIT}"
            );
        }
    }
}

/// Several threads refund and take across second boundaries; no thread refunds more than it
/// took. Per second of wall clock, what passed minus what was refunded must stay within the
/// weighted allowance: checked loosely as total OKs <= LIMIT * (seconds + 2) + refunds.
#[test]
fn refunds_and_takings_across_boundaries_stay_within_the_windows() {
    const LIMIT: u64 = 20;
    const THREADS: usize = 3;
    for method in ["fixed_window", "sliding_window_counter"] {
        let rt = runtime();
        let server = server(&rt, &yaml(method, "second", LIMIT), 4096);
        let start = std::time::Instant::now();
        let workers: Vec<_> = (0..THREADS)
            .map(|thread| {
                let server = server.clone();
                thread::spawn(move || {
                    let rt = runtime();
                    let (mut granted, mut refunded) = (0_u64, 0_u64);
                    let deadline =
                        std::time::Instant::now() + std::time::Duration::from_millis(2_500);
                    let mut at = 0_u64;
                    while std::time::Instant::now() < deadline {
                        at += 1;
                        if oks(&rt, &server, &take("user", "edge"), 1) == 1 {
                            granted += 1;
                            if (at + thread as u64).is_multiple_of(2) {
                                give(&rt, &server, refund("user", "edge", 1));
                                refunded += 1;
                            }
                        }
                    }
                    (granted, refunded)
                })
            })
            .collect();
        let (mut granted, mut refunded) = (0, 0);
        for worker in workers {
            let (g, r) = worker.join().expect("a worker");
            granted += g;
            refunded += r;
        }
        let seconds = start.elapsed().as_secs() + 2;
        assert!(
            granted - refunded <= LIMIT * seconds,
            "{method}: {granted} granted, {refunded} refunded in {seconds} windows of {LIMIT}"
        );
    }
}
