//! What every limiter is chosen for, as tests against the public API: bursts and refills, one
//! limiter per client and one rule per plan, the window-edge burst, and racing threads.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tollgate::{Algorithm, FakeClock, RateLimiterService, Rule};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    Free,
    Pro,
}

type Service = RateLimiterService<String, Tier, FakeClock>;

fn service(algorithm: Algorithm, clock: &FakeClock) -> Service {
    let rules = [
        (
            Tier::Free,
            Rule::new(5, Duration::from_millis(1_000)).unwrap(),
        ),
        (
            Tier::Pro,
            Rule::new(50, Duration::from_millis(1_000)).unwrap(),
        ),
    ];
    RateLimiterService::new(algorithm, rules, clock.clone()).unwrap()
}

fn count(service: &Service, client: &str, tier: Tier, n: usize) -> usize {
    (0..n)
        .filter(|_| service.allow(client, &tier).unwrap())
        .count()
}

#[test]
fn token_bucket_burst_of_10_lets_5_through() {
    let clock = FakeClock::new();
    let tb = service(Algorithm::TokenBucket, &clock);
    assert_eq!(count(&tb, "alice", Tier::Free, 10), 5);
}

#[test]
fn token_bucket_refills_exactly_one_token_in_200ms() {
    let clock = FakeClock::new();
    let tb = service(Algorithm::TokenBucket, &clock);
    assert_eq!(count(&tb, "alice", Tier::Free, 10), 5);
    clock.advance(Duration::from_millis(200));
    assert_eq!(count(&tb, "alice", Tier::Free, 10), 1);
    // And not a moment sooner: 199 ms after that, nothing more.
    clock.advance(Duration::from_millis(199));
    assert_eq!(count(&tb, "alice", Tier::Free, 10), 0);
}

#[test]
fn clients_have_their_own_limiters() {
    for algorithm in Algorithm::ALL {
        let clock = FakeClock::new();
        let service = service(algorithm, &clock);
        assert_eq!(count(&service, "alice", Tier::Free, 10), 5, "{algorithm}");
        assert_eq!(count(&service, "bob", Tier::Free, 10), 5, "{algorithm}");
        assert_eq!(service.len(), 2);
    }
}

#[test]
fn each_plan_gets_its_own_rule() {
    for algorithm in Algorithm::ALL {
        let clock = FakeClock::new();
        let service = service(algorithm, &clock);
        assert_eq!(count(&service, "carol", Tier::Pro, 60), 50, "{algorithm}");
        assert_eq!(count(&service, "dan", Tier::Free, 60), 5, "{algorithm}");
    }
}

fn edge_burst(algorithm: Algorithm) -> usize {
    // t = 1990 ms: the last 10 ms of window [1000, 2000).
    let clock = FakeClock::starting_at(Duration::from_millis(1_990));
    let service = service(algorithm, &clock);
    let end_of_window = count(&service, "dave", Tier::Free, 5);
    clock.advance(Duration::from_millis(20));
    end_of_window + count(&service, "dave", Tier::Free, 5)
}

#[test]
fn fixed_window_lets_double_the_limit_through_across_an_edge() {
    assert_eq!(edge_burst(Algorithm::FixedWindow), 10);
}

#[test]
fn sliding_log_holds_the_edge_burst_to_the_limit() {
    assert_eq!(edge_burst(Algorithm::SlidingWindowLog), 5);
}

#[test]
fn thousand_requests_from_16_threads_at_one_instant_allow_exactly_the_limit() {
    for algorithm in Algorithm::ALL {
        for _trial in 0..20 {
            let service = Arc::new(service(algorithm, &FakeClock::new()));
            let allowed = Arc::new(AtomicUsize::new(0));
            let threads: Vec<_> = (0..16)
                .map(|thread| {
                    let service = Arc::clone(&service);
                    let allowed = Arc::clone(&allowed);
                    std::thread::spawn(move || {
                        let share = 1_000 / 16 + usize::from(thread < 1_000 % 16);
                        for _ in 0..share {
                            if service.allow("frank", &Tier::Pro).unwrap() {
                                // Relaxed: read after every thread is joined.
                                allowed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    })
                })
                .collect();
            for thread in threads {
                thread.join().unwrap();
            }
            assert_eq!(allowed.load(Ordering::Relaxed), 50, "{algorithm}");
            assert_eq!(service.len(), 1, "one limiter for frank");
        }
    }
}
