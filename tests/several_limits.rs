//! Plans of several limits, enforced together: a request is granted only if every limit grants
//! it, and a refused request keeps nothing from any limit.

use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use tollgate::{
    Algorithm, Clock, FakeClock, PlanError, RateLimiterService, Rule, ServiceBuilder, ServiceError,
};

#[path = "support/reference.rs"]
mod reference;

use reference::{RefFixedWindow, RefSlidingWindowCounter, RefTokenBucket};

/// "3 per second and 5 per 10 seconds".
fn limits() -> [Rule; 2] {
    [
        Rule::per_second(3).unwrap(),
        Rule::new(5, Duration::from_secs(10)).unwrap(),
    ]
}

const METHODS: [Algorithm; 3] = [
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowCounter,
];

/// The methods whose timelines the hand-written expectations below spell out; the sliding
/// window counter's weighting is held to its reference by the property test.
const SPELLED_OUT: [Algorithm; 2] = [Algorithm::TokenBucket, Algorithm::FixedWindow];

fn service(
    algorithm: Algorithm,
    clock: &FakeClock,
) -> RateLimiterService<u64, &'static str, FakeClock> {
    ServiceBuilder::new(algorithm, clock.clone())
        .plan_limits("pro", limits())
        .plan("free", Rule::per_second(1).unwrap())
        .build()
        .unwrap()
}

/// The combined rule, plainly: under one lock, grant iff every limit has `n` available, then
/// take from each.
enum Reference<C> {
    TokenBucket(Vec<RefTokenBucket<C>>),
    FixedWindow(Vec<RefFixedWindow<C>>),
    SlidingWindowCounter(Vec<RefSlidingWindowCounter<C>>),
}

struct Combined<C> {
    limits: Mutex<Reference<C>>,
}

impl<C: Clock + Clone> Combined<C> {
    fn new(algorithm: Algorithm, clock: &C) -> Self {
        let limits = match algorithm {
            Algorithm::TokenBucket => Reference::TokenBucket(
                limits()
                    .map(|rule| RefTokenBucket::new(rule, clock.clone()))
                    .into(),
            ),
            Algorithm::FixedWindow => Reference::FixedWindow(
                limits()
                    .map(|rule| RefFixedWindow::new(rule, clock.clone()))
                    .into(),
            ),
            _ => Reference::SlidingWindowCounter(
                limits()
                    .map(|rule| RefSlidingWindowCounter::new(rule, clock.clone()))
                    .into(),
            ),
        };
        Combined {
            limits: Mutex::new(limits),
        }
    }

    fn try_acquire_n(&self, n: u64) -> bool {
        match &*self.limits.lock().unwrap() {
            Reference::TokenBucket(limits) => {
                limits.iter().all(|limit| limit.available() >= n)
                    && limits.iter().all(|limit| limit.try_acquire_n(n))
            }
            Reference::FixedWindow(limits) => {
                limits.iter().all(|limit| limit.available() >= n)
                    && limits.iter().all(|limit| limit.try_acquire_n(n))
            }
            Reference::SlidingWindowCounter(limits) => {
                limits.iter().all(|limit| limit.available() >= n)
                    && limits.iter().all(|limit| limit.try_acquire_n(n))
            }
        }
    }
}

#[test]
fn a_plan_of_two_limits_grants_exactly_what_both_allow_over_time() {
    for algorithm in SPELLED_OUT {
        let clock = FakeClock::new();
        let service = service(algorithm, &clock);
        let mut granted = Vec::new();
        for _second in 0..12 {
            granted.push(
                (0..10)
                    .filter(|_| service.allow(&1, &"pro").unwrap())
                    .count(),
            );
            clock.advance(Duration::from_secs(1));
        }
        // 3 in the first second, 2 in the next (5 per 10 s), then what the 10-second limit
        // allows: the fixed window's resets at 10 s; the bucket refills one every 2 s.
        match algorithm {
            Algorithm::FixedWindow => {
                assert_eq!(granted, [3, 2, 0, 0, 0, 0, 0, 0, 0, 0, 3, 2], "{algorithm}")
            }
            Algorithm::TokenBucket => {
                assert_eq!(granted, [3, 2, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0], "{algorithm}")
            }
            // The counter weighs the previous 10 seconds' 5 by how much of them still overlap.
            _ => assert_eq!(
                &granted[..10],
                [3, 2, 0, 0, 0, 0, 0, 0, 0, 0],
                "{algorithm}"
            ),
        }
    }
}

#[test]
fn a_denied_request_leaves_every_limit_unchanged() {
    for algorithm in SPELLED_OUT {
        let clock = FakeClock::new();
        let service = service(algorithm, &clock);
        assert!(service.acquire(&1, &"pro", 3).unwrap().is_allowed());
        clock.advance(Duration::from_secs(1));
        // The per-second limit has 3 again, the 10-second one 2: 3 is refused by the second.
        let before = service.ratelimit_headers(&1, &"pro", "pro").unwrap();
        let refused = service.acquire(&1, &"pro", 3).unwrap();
        assert!(refused.is_denied(), "{algorithm}");
        assert_eq!(
            refused.limit(),
            5,
            "{algorithm}: the refusing limit is reported"
        );
        assert_eq!(refused.remaining(), 2, "{algorithm}");
        let after = service.ratelimit_headers(&1, &"pro", "pro").unwrap();
        assert_eq!(before, after, "{algorithm}: nothing was kept");
        assert!(
            service.acquire(&1, &"pro", 2).unwrap().is_allowed(),
            "{algorithm}"
        );
    }
}

#[test]
fn the_decision_reports_the_closest_limit_and_the_longest_wait() {
    let clock = FakeClock::new();
    let service = service(Algorithm::TokenBucket, &clock);
    let first = service.acquire(&1, &"pro", 1).unwrap();
    // 2 left of the per-second limit, 4 of the other: the closest to exhaustion is reported.
    assert_eq!((first.limit(), first.remaining()), (3, 2));
    assert!(service.acquire(&1, &"pro", 2).unwrap().is_allowed());
    // One more: only the per-second bucket refuses; it refills a token in 1/3 s.
    let denied = service.acquire(&1, &"pro", 1).unwrap();
    assert_eq!(denied.limit(), 3);
    assert_eq!(denied.retry_after(), Duration::from_nanos(333_333_334));
    // Three more: both refuse, the per-second one for 1 s, the 10-second one for 2 s.
    let denied = service.acquire(&1, &"pro", 3).unwrap();
    assert_eq!(
        (denied.limit(), denied.retry_after()),
        (5, Duration::from_secs(2))
    );
    assert_eq!(denied.retry_after_header().as_deref(), Some("2"));
    let (policy, ratelimit) = service.ratelimit_headers(&1, &"pro", "pro").unwrap();
    assert_eq!(policy, r#""pro-1s";q=3;w=1, "pro-10s";q=5;w=10"#);
    assert_eq!(ratelimit, r#""pro-1s";r=0;t=1, "pro-10s";r=2;t=6"#);
    let (policy, ratelimit) = service.ratelimit_headers(&1, &"free", "free").unwrap();
    assert_eq!(
        (policy.as_str(), ratelimit.as_str()),
        (r#""free";q=1;w=1"#, r#""free";r=1;t=0"#)
    );
}

#[test]
fn many_threads_on_one_client_never_exceed_either_limit() {
    for algorithm in METHODS {
        for _ in 0..20 {
            let clock = FakeClock::new();
            let service = Arc::new(service(algorithm, &clock));
            let start = Arc::new(Barrier::new(4));
            let threads: Vec<_> = (0..4)
                .map(|thread| {
                    let (service, start) = (Arc::clone(&service), Arc::clone(&start));
                    std::thread::spawn(move || {
                        start.wait();
                        (0..50)
                            .map(|attempt| {
                                let n = 1 + (thread + attempt) % 2;
                                if service.acquire(&1, &"pro", n).unwrap().is_allowed() {
                                    n
                                } else {
                                    0
                                }
                            })
                            .sum::<u64>()
                    })
                })
                .collect();
            let granted: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
            assert!(
                granted <= 3,
                "{algorithm}: {granted} permits at one instant, limit 3"
            );
            // Undone reservations may refuse others, but not all of them: some are granted.
            assert!(granted >= 1, "{algorithm}");
        }
    }
}

#[test]
fn a_plan_cannot_have_no_limits_too_many_or_several_under_the_sliding_log() {
    let none = ServiceBuilder::new(Algorithm::TokenBucket, FakeClock::new())
        .plan_limits("pro", [])
        .build::<u64>()
        .unwrap_err();
    assert!(
        matches!(
            none,
            ServiceError::Plan(PlanError::LimitCount {
                count: 0,
                max: 4,
                ..
            })
        ),
        "{none:?}"
    );
    let five = ServiceBuilder::new(Algorithm::TokenBucket, FakeClock::new())
        .plan_limits("pro", [Rule::per_second(1).unwrap(); 5])
        .build::<u64>()
        .unwrap_err();
    assert!(
        five.to_string()
            .contains("has 5 limits: a plan has at least 1 and at most 4"),
        "{five}"
    );
    let log = ServiceBuilder::new(Algorithm::SlidingWindowLog, FakeClock::new())
        .plan_limits("pro", limits())
        .build::<u64>()
        .unwrap_err();
    assert!(
        matches!(
            log,
            ServiceError::Plan(PlanError::SeveralLimitsUnsupported { .. })
        ),
        "{log:?}"
    );
    let bad = ServiceBuilder::new(Algorithm::SlidingWindowLog, FakeClock::new())
        .plan_limits("pro", [Rule::per_second(1 << 20).unwrap()])
        .build::<u64>()
        .unwrap_err();
    assert!(
        matches!(bad, ServiceError::Plan(PlanError::InvalidRule { .. })),
        "{bad:?}"
    );
}

#[test]
fn limits_change_live_and_sweeps_evict_only_idle_clients() {
    for algorithm in SPELLED_OUT {
        let clock = FakeClock::new();
        let service = service(algorithm, &clock);
        assert_eq!(
            (0..10)
                .filter(|_| service.allow(&1, &"pro").unwrap())
                .count(),
            3
        );
        clock.advance(Duration::from_secs(2));
        assert_eq!(
            service.sweep(),
            0,
            "{algorithm}: the 10-second limit still holds usage"
        );
        // The fixed window has 2 left of its 10 seconds; the bucket has refilled one more.
        let expected = if algorithm == Algorithm::FixedWindow {
            2
        } else {
            3
        };
        assert_eq!(
            (0..10)
                .filter(|_| service.allow(&1, &"pro").unwrap())
                .count(),
            expected
        );
        clock.advance(Duration::from_secs(30));
        assert_eq!(service.sweep(), 1, "{algorithm}: idle under both limits");
        service
            .set_limits(&"pro", [Rule::per_second(2).unwrap()])
            .unwrap();
        assert_eq!(
            service.limits(&"pro").unwrap(),
            [Rule::per_second(2).unwrap()]
        );
        assert_eq!(
            (0..10)
                .filter(|_| service.allow(&1, &"pro").unwrap())
                .count(),
            2
        );
        service.set_limits(&"pro", limits()).unwrap();
        assert_eq!(
            (0..10)
                .filter(|_| service.allow(&1, &"pro").unwrap())
                .count(),
            3
        );
    }
}

#[derive(Debug, Clone)]
enum Step {
    Advance(u64),
    Acquire(u64),
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            (0u64..3_000).prop_map(|ms| Step::Advance(ms * 1_000_000)),
            (0u64..=6).prop_map(Step::Acquire),
        ],
        1..120,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Decision for decision, the service's plan of two limits answers as the combined rule does.
    #[test]
    fn a_plan_of_two_limits_answers_as_the_combined_reference(
        algorithm in prop::sample::select(METHODS.to_vec()),
        steps in steps(),
    ) {
        let clock = FakeClock::new();
        let service = service(algorithm, &clock);
        let reference = Combined::new(algorithm, &clock);
        for (index, step) in steps.iter().enumerate() {
            match *step {
                Step::Advance(nanos) => clock.advance(Duration::from_nanos(nanos)),
                Step::Acquire(n) => {
                    let decision = service.acquire(&1, &"pro", n).unwrap();
                    let expected = n <= 3 && reference.try_acquire_n(n);
                    prop_assert_eq!(decision.is_allowed(), expected, "step {}: {:?}", index, step);
                }
            }
        }
    }
}

/// A give-back racing a later grant on a token bucket that had refilled must not take that
/// grant's permits too: a churn thread's refused reservations (3 permits, refused by the second
/// limit) race single grants. Within 6 ms a "4 per second" limit grants at most 4.
#[test]
fn a_give_back_racing_a_later_grant_never_over_admits() {
    use std::sync::atomic::{AtomicBool, Ordering};
    for algorithm in METHODS {
        let clock = FakeClock::new();
        let service = Arc::new(
            ServiceBuilder::new(algorithm, clock.clone())
                .plan_limits(
                    "p",
                    [
                        Rule::per_second(4).unwrap(),
                        // Refuses 3 at once (above its limit), grants single permits freely.
                        Rule::new(2, Duration::from_millis(1)).unwrap(),
                    ],
                )
                .build::<u64>()
                .unwrap(),
        );
        let stop = Arc::new(AtomicBool::new(false));
        let churn = {
            let (service, stop) = (Arc::clone(&service), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    assert!(service.acquire(&1, &"p", 3).unwrap().is_denied());
                }
            })
        };
        let start = std::time::Instant::now();
        let mut rounds = 0u64;
        while start.elapsed() < Duration::from_millis(1_500) {
            rounds += 1;
            clock.set(Duration::from_secs(20 * rounds - 10)); // a full bucket, and the churn on it
            for _ in 0..50 {
                std::hint::spin_loop();
            }
            clock.advance(Duration::from_secs(10));
            let mut granted = 0;
            for _ in 0..6 {
                granted += (0..3)
                    .filter(|_| service.acquire(&1, &"p", 1).unwrap().is_allowed())
                    .count();
                clock.advance(Duration::from_millis(1));
            }
            assert!(
                granted <= 4,
                "{algorithm}, round {rounds}: {granted} in 6 ms, limit 4/s"
            );
        }
        stop.store(true, Ordering::Relaxed);
        churn.join().unwrap();
    }
}

/// A reading before the service's start counts as its start; the eviction gate must count it
/// the same way, or a sweep would forget usage the limits still hold.
#[test]
fn a_sweep_after_a_reading_before_the_start_forgets_nothing() {
    for algorithm in METHODS {
        let clock = FakeClock::starting_at(Duration::from_millis(5_500));
        let service = ServiceBuilder::new(algorithm, clock.clone())
            .plan_limits(
                "p",
                [
                    Rule::per_second(3).unwrap(),
                    Rule::new(100, Duration::from_secs(1)).unwrap(),
                ],
            )
            .build::<u64>()
            .unwrap();
        clock.set(Duration::from_millis(1_000)); // the clock steps back before the start
        let first = (0..5)
            .filter(|_| service.acquire(&0, &"p", 1).unwrap().is_allowed())
            .count();
        clock.set(Duration::from_millis(5_500));
        assert!(service.peek(&0, &"p").unwrap().is_denied(), "{algorithm}");
        assert_eq!(
            service.sweep(),
            0,
            "{algorithm}: the limits still hold {first} permits"
        );
        let after = (0..5)
            .filter(|_| service.acquire(&0, &"p", 1).unwrap().is_allowed())
            .count();
        assert_eq!(after, 0, "{algorithm}");
    }
}

/// A refused request whose reading is behind the stored window gives back what it took from
/// the window it was counted in.
#[test]
fn a_refused_request_with_a_stale_reading_keeps_nothing() {
    for algorithm in METHODS {
        let clock = FakeClock::starting_at(Duration::from_millis(500));
        let service = ServiceBuilder::new(algorithm, clock.clone())
            .plan_limits(
                "p",
                [
                    Rule::per_second(10).unwrap(),
                    Rule::new(4, Duration::from_secs(100)).unwrap(),
                ],
            )
            .build::<u64>()
            .unwrap();
        clock.set(Duration::from_millis(1_500));
        assert!(service.acquire(&1, &"p", 1).unwrap().is_allowed());
        clock.set(Duration::from_millis(500)); // a window back
        assert!(service.acquire(&1, &"p", 8).unwrap().is_denied()); // the second limit refuses
        clock.set(Duration::from_millis(1_500));
        let three = service.acquire(&1, &"p", 3).unwrap();
        assert!(
            three.is_allowed(),
            "{algorithm}: the refused request kept permits: {three:?}"
        );
    }
}
