//! Running the service for real: idle eviction that clients cannot notice and that keeps memory
//! bounded under endless new clients, live rule changes and plan moves, and per-plan counts.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tollgate::{
    Algorithm, FakeClock, Limiter, LimiterFactory, PlanError, PlanStats, RateLimiterService,
    Rejection, Rule, ServiceBuilder, ServiceError, Sweeper,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    Free,
    Pro,
}

type Service = RateLimiterService<u64, Plan, FakeClock>;

fn service(algorithm: Algorithm, clock: &FakeClock, free: Rule) -> Service {
    RateLimiterService::new(
        algorithm,
        [
            (Plan::Free, free),
            (Plan::Pro, Rule::per_second(50).unwrap()),
        ],
        clock.clone(),
    )
    .unwrap()
}

fn burst(service: &Service, client: u64, plan: Plan, attempts: usize) -> usize {
    (0..attempts)
        .filter(|_| service.allow(&client, &plan).unwrap())
        .count()
}

#[test]
fn sweep_removes_only_clients_indistinguishable_from_fresh_ones() {
    for algorithm in Algorithm::ALL {
        let clock = FakeClock::new();
        let service = service(algorithm, &clock, Rule::per_second(5).unwrap());
        assert_eq!(burst(&service, 1, Plan::Free, 5), 5);
        assert_eq!(burst(&service, 2, Plan::Free, 1), 1);
        assert_eq!(
            service.sweep(),
            0,
            "{algorithm}: both are within their window"
        );
        assert_eq!(service.len(), 2);
        clock.advance(Duration::from_secs(1));
        if algorithm == Algorithm::SlidingWindowCounter {
            // The next window still weighs the last one's permits; the one after does not.
            assert_eq!(
                service.sweep(),
                0,
                "{algorithm}: the next window weighs both"
            );
            clock.advance(Duration::from_secs(1));
        }
        assert_eq!(
            service.sweep(),
            2,
            "{algorithm}: a window later both are as new"
        );
        assert!(service.is_empty());
        assert_eq!(burst(&service, 1, Plan::Free, 10), 5, "{algorithm}");
    }
}

#[test]
fn eviction_is_invisible_to_clients() {
    for algorithm in Algorithm::ALL {
        let rule = Rule::new(3, Duration::from_millis(100)).unwrap();
        let (swept_clock, kept_clock) = (FakeClock::new(), FakeClock::new());
        let swept = service(algorithm, &swept_clock, rule);
        let kept = service(algorithm, &kept_clock, rule);
        let mut removed = 0;
        for step in 0u64..5_000 {
            // A deterministic mix of clients, gaps and batch sizes.
            let client = (step * 7919) % 11;
            let n = [1, 1, 1, 0, 2][(step % 5) as usize];
            let gap = Duration::from_millis((step * 31) % 47);
            let a = swept.acquire(&client, &Plan::Free, n).unwrap();
            let b = kept.acquire(&client, &Plan::Free, n).unwrap();
            assert_eq!(a, b, "{algorithm}: step {step}");
            swept_clock.advance(gap);
            kept_clock.advance(gap);
            if step % 3 == 0 {
                removed += swept.sweep();
            }
        }
        assert!(
            removed > 1_000,
            "{algorithm}: eviction was exercised ({removed})"
        );
    }
}

#[test]
fn a_rule_change_applies_from_each_clients_next_request() {
    for algorithm in Algorithm::ALL {
        let clock = FakeClock::new();
        let service = service(algorithm, &clock, Rule::per_second(5).unwrap());
        assert_eq!(burst(&service, 1, Plan::Free, 3), 3);
        service
            .set_rule(&Plan::Free, Rule::per_second(8).unwrap())
            .unwrap();
        assert_eq!(
            service.rule(&Plan::Free),
            Some(Rule::per_second(8).unwrap())
        );
        // The client starts afresh under the new rule: it gains at most the new limit, one
        // window's worth, and never keeps its old quota on top.
        assert_eq!(burst(&service, 1, Plan::Free, 20), 8, "{algorithm}");
        assert_eq!(
            burst(&service, 2, Plan::Free, 20),
            8,
            "{algorithm}: a new client"
        );
        service
            .set_rule(&Plan::Free, Rule::per_second(2).unwrap())
            .unwrap();
        assert_eq!(
            burst(&service, 1, Plan::Free, 20),
            2,
            "{algorithm}: lowered"
        );
        // Other plans are untouched.
        assert_eq!(burst(&service, 3, Plan::Pro, 60), 50, "{algorithm}");
    }
}

#[test]
fn setting_the_rule_a_plan_already_has_resets_no_client() {
    for algorithm in Algorithm::ALL {
        let clock = FakeClock::new();
        let service = service(algorithm, &clock, Rule::per_second(5).unwrap());
        assert_eq!(burst(&service, 1, Plan::Free, 20), 5, "{algorithm}");
        // A configuration reloaded unchanged, as single limits and as a list of one.
        service
            .set_rule(&Plan::Free, Rule::per_second(5).unwrap())
            .unwrap();
        service
            .set_limits(&Plan::Free, [Rule::per_second(5).unwrap()])
            .unwrap();
        assert_eq!(
            burst(&service, 1, Plan::Free, 20),
            0,
            "{algorithm}: the client kept its use"
        );
        // A real change still starts it afresh.
        service
            .set_rule(&Plan::Free, Rule::per_second(6).unwrap())
            .unwrap();
        assert_eq!(burst(&service, 1, Plan::Free, 20), 6, "{algorithm}");
    }
}

#[test]
fn a_rule_change_is_checked_against_the_method() {
    let clock = FakeClock::new();
    let service = service(
        Algorithm::SlidingWindowLog,
        &clock,
        Rule::per_second(5).unwrap(),
    );
    let error = service
        .set_rule(&Plan::Free, Rule::per_second(1 << 20).unwrap())
        .unwrap_err();
    assert!(
        matches!(error, ServiceError::Plan(PlanError::InvalidRule { ref plan, .. }) if plan == "Free")
    );
    assert_eq!(
        service.rule(&Plan::Free),
        Some(Rule::per_second(5).unwrap())
    );
}

#[test]
fn rule_changes_racing_requests_never_grant_more_than_one_window_per_change() {
    for algorithm in Algorithm::ALL {
        let clock = FakeClock::new(); // frozen: nothing refills
        let service = Arc::new(service(algorithm, &clock, Rule::per_second(5).unwrap()));
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let (service, stop) = (Arc::clone(&service), Arc::clone(&stop));
                std::thread::spawn(move || {
                    let mut allowed = 0;
                    // Relaxed: a stop flag; the join orders the result.
                    while !stop.load(Ordering::Relaxed) {
                        allowed += usize::from(service.allow(&7, &Plan::Free).unwrap());
                    }
                    allowed
                })
            })
            .collect();
        let changes = 50;
        for change in 0..changes {
            let limit = 5 + change % 2;
            service
                .set_rule(&Plan::Free, Rule::per_second(limit).unwrap())
                .unwrap();
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Relaxed);
        let allowed: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
        // The first rule, then at most the new limit (at most 6) per change.
        let bound = 5 + 6 * changes as usize;
        assert!(allowed <= bound, "{algorithm}: {allowed} > {bound}");
    }
}

#[test]
fn a_client_moved_to_another_plan_starts_afresh_there_and_keeps_its_use_of_the_old_one() {
    for algorithm in Algorithm::ALL {
        let clock = FakeClock::new();
        let service = service(algorithm, &clock, Rule::per_second(5).unwrap());
        assert_eq!(burst(&service, 1, Plan::Free, 3), 3);
        assert_eq!(
            burst(&service, 1, Plan::Pro, 100),
            50,
            "{algorithm}: upgraded"
        );
        // Back on Free within the window: what it used there still counts.
        assert_eq!(
            burst(&service, 1, Plan::Free, 10),
            2,
            "{algorithm}: downgraded"
        );
        assert_eq!(service.len(), 2);
        // Alternating plans request by request grants no more than each plan's own limit.
        let alternating = (0..200)
            .filter(|step| {
                let plan = if step % 2 == 0 { Plan::Free } else { Plan::Pro };
                service.allow(&2, &plan).unwrap()
            })
            .count();
        assert_eq!(alternating, 5 + 50, "{algorithm}");
    }
}

#[test]
fn stats_count_each_plans_decisions() {
    let clock = FakeClock::new();
    let uncounted = service(Algorithm::TokenBucket, &clock, Rule::per_second(5).unwrap());
    burst(&uncounted, 1, Plan::Free, 8);
    assert_eq!(uncounted.stats(&Plan::Free), None, "counting is asked for");
    let service: Service = ServiceBuilder::new(Algorithm::TokenBucket, clock.clone())
        .plan(Plan::Free, Rule::per_second(5).unwrap())
        .plan(Plan::Pro, Rule::per_second(50).unwrap())
        .count_decisions(true)
        .build()
        .unwrap();
    burst(&service, 1, Plan::Free, 8);
    burst(&service, 2, Plan::Pro, 3);
    let _ = service.acquire(&3, &Plan::Free, 9).unwrap(); // rejected: above the limit
    assert_eq!(
        service.stats(&Plan::Free),
        Some(PlanStats {
            allowed: 5,
            denied: 4
        })
    );
    assert_eq!(
        service.stats(&Plan::Pro),
        Some(PlanStats {
            allowed: 3,
            denied: 0
        })
    );
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let service = &service;
            move || burst(service, 9, Plan::Pro, 1_000)
        })
        .collect();
    std::thread::scope(|scope| {
        for thread in threads {
            scope.spawn(thread);
        }
    });
    let pro = service.stats(&Plan::Pro).unwrap();
    assert_eq!(
        pro.allowed + pro.denied,
        4_003,
        "no decision lost across threads"
    );
    assert_eq!(pro.allowed, 53);
}

#[test]
fn the_sweeper_runs_in_the_background_and_stops_when_dropped() {
    let clock = FakeClock::new();
    let service = Arc::new(service(
        Algorithm::FixedWindow,
        &clock,
        Rule::per_second(5).unwrap(),
    ));
    for client in 0..100 {
        assert!(service.allow(&client, &Plan::Free).unwrap());
    }
    let sweeper = Sweeper::start(&service, Duration::from_millis(1)).unwrap();
    clock.advance(Duration::from_secs(1));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !service.is_empty() && Instant::now() < deadline {
        std::thread::yield_now();
    }
    assert!(service.is_empty(), "the sweeper removed the idle clients");
    drop(sweeper);
    for client in 0..10 {
        assert!(service.allow(&client, &Plan::Free).unwrap());
    }
    clock.advance(Duration::from_secs(1));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(service.len(), 10, "a dropped sweeper sweeps no more");
}

#[test]
fn eviction_grants_nothing_extra_to_a_clock_that_steps_back_past_the_sweep() {
    for algorithm in Algorithm::ALL {
        let clock = FakeClock::new();
        let service = service(algorithm, &clock, Rule::per_second(5).unwrap());
        clock.set(Duration::from_millis(999));
        assert_eq!(burst(&service, 1, Plan::Free, 10), 5);
        // The sweep, at 2 s, finds the client idle and evicts it; then a reading from before the
        // sweep (a clock stepped back, or a core whose counter lags) arrives.
        clock.set(Duration::from_secs(2));
        assert_eq!(service.sweep(), 1, "{algorithm}");
        clock.set(Duration::from_millis(999));
        let stale = burst(&service, 1, Plan::Free, 10);
        clock.set(Duration::from_millis(2_500));
        let current = burst(&service, 1, Plan::Free, 10);
        match algorithm {
            // The replacement holds the stale reading to what the sweep's instant allowed...
            Algorithm::TokenBucket | Algorithm::SlidingWindowLog => {
                assert_eq!((stale, current), (0, 5), "{algorithm}");
            }
            // ... and the fixed window counts it in the window the sweep saw begin, as it counts
            // any reading older than a window already begun: one window's limit in all.
            _ => assert_eq!(stale + current, 5, "{algorithm}"),
        }
    }
}

/// The figures of a decision, to compare two.
fn figures(decision: &tollgate::Decision) -> (bool, u64, Duration, Duration, Option<Rejection>) {
    (
        decision.is_allowed(),
        decision.remaining(),
        decision.retry_after(),
        decision.reset_after(),
        decision.rejection(),
    )
}

/// An attempt above the limit is never granted and takes nothing: a new client making one gets
/// the answer of a fresh limiter, and takes no place in the service, so that a flood of such
/// attempts by distinct keys neither grows the service nor evicts the clients it holds (which
/// would start them afresh).
#[test]
fn an_attempt_above_the_limit_by_a_new_client_makes_no_limiter_and_evicts_no_one() {
    let rule = Rule::new(3, Duration::from_secs(10)).unwrap();
    let wider = Rule::new(6, Duration::from_secs(60)).unwrap();
    for algorithm in Algorithm::ALL {
        for limits in [vec![rule], vec![rule, wider]] {
            if algorithm == Algorithm::SlidingWindowLog && limits.len() > 1 {
                continue; // the sliding log keeps one limit per plan
            }
            let clock = FakeClock::new();
            // One table of 8 slots (where the method keeps one).
            let service = ServiceBuilder::new(algorithm, clock.clone())
                .plan_limits(Plan::Free, limits.clone())
                .capacity(8)
                .build::<u64>()
                .unwrap();
            // Made with the service and never used: what a new client's state answers.
            let fresh = LimiterFactory::new(algorithm)
                .create(rule, clock.clone())
                .unwrap();
            // Into the second window: the fresh limiter's figures there are a new client's.
            clock.advance(Duration::from_secs(19));
            for client in 0..8u64 {
                assert_eq!(burst(&service, client, Plan::Free, 10), 3, "{algorithm}");
            }
            let held = service.len();
            for (new_client, n) in (1000..).zip([4, 5, 7, 1000, u64::MAX].repeat(20)) {
                let decision = service.acquire(&new_client, &Plan::Free, n).unwrap();
                assert_eq!(
                    figures(&decision),
                    figures(&fresh.try_acquire_n(n)),
                    "{algorithm}, {} limits: {n} permits for a new client",
                    limits.len()
                );
            }
            let regained = (0..8u64)
                .filter(|client| service.allow(client, &Plan::Free).unwrap())
                .count();
            assert_eq!(
                (service.len(), service.evictions(), regained),
                (held, 0, 0),
                "{algorithm}, {} limits: (clients held, evictions, permits regained by the \
                 clients held, all spent)",
                limits.len()
            );
        }
    }
}
