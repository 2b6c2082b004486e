//! Bad input on the entry points not covered elsewhere; the README's "Bad input" table lists
//! every row with the test that checks it.

use std::sync::Arc;
use std::time::Duration;

use tollgate::{
    Algorithm, FakeClock, PlanError, RateLimiterService, Rule, ServiceBuilder, ServiceError,
    Sweeper,
};

fn service() -> Arc<RateLimiterService<u64, u32, FakeClock>> {
    Arc::new(
        RateLimiterService::new(
            Algorithm::TokenBucket,
            [(1, Rule::per_second(5).unwrap())],
            FakeClock::new(),
        )
        .unwrap(),
    )
}

#[test]
fn set_rule_for_an_unknown_plan_is_an_error() {
    let error = service()
        .set_rule(&2, Rule::per_second(5).unwrap())
        .unwrap_err();
    assert_eq!(error, ServiceError::UnknownPlan { plan: "2".into() });
}

#[test]
fn a_sweeper_with_a_zero_interval_is_refused() {
    let error = Sweeper::start(&service(), Duration::ZERO).unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
    assert!(error.to_string().contains("interval 0s is invalid"));
}

#[test]
fn an_unknown_algorithm_name_is_an_error_listing_the_known_ones() {
    let error = "leaky_bucket".parse::<Algorithm>().unwrap_err();
    assert_eq!(
        error.to_string(),
        "algorithm \"leaky_bucket\" is unknown: expected one of token_bucket, fixed_window, \
         sliding_window_log, sliding_window_counter"
    );
    for algorithm in Algorithm::ALL {
        assert_eq!(algorithm.name().parse::<Algorithm>(), Ok(algorithm));
    }
}

#[test]
fn more_plans_than_a_service_can_tell_apart_is_an_error() {
    let rule = Rule::per_second(1).unwrap();
    let error = ServiceBuilder::new(Algorithm::FixedWindow, FakeClock::new())
        .plans((0..=65_536u32).map(|plan| (plan, rule)))
        .build::<u64>()
        .unwrap_err();
    assert_eq!(
        error,
        ServiceError::Plan(PlanError::TooManyPlans {
            count: 65_537,
            max: 65_536
        })
    );
}

#[test]
fn a_capacity_beyond_what_can_be_allocated_up_front_is_an_error() {
    for capacity in [
        usize::MAX,
        ServiceBuilder::<u32, FakeClock>::MAX_CAPACITY + 1,
    ] {
        let error = ServiceBuilder::new(Algorithm::TokenBucket, FakeClock::new())
            .plan(1u32, Rule::per_second(5).unwrap())
            .capacity(capacity)
            .build::<u64>()
            .unwrap_err();
        assert_eq!(
            error,
            ServiceError::CapacityTooLarge {
                capacity,
                max: 1 << 28
            }
        );
        assert!(error.to_string().contains("at most 268435456"), "{error}");
    }
}

#[test]
fn a_capacity_of_zero_is_an_error() {
    let error = ServiceBuilder::new(Algorithm::TokenBucket, FakeClock::new())
        .plan(1u32, Rule::per_second(5).unwrap())
        .capacity(0)
        .build::<u64>()
        .unwrap_err();
    assert_eq!(error, ServiceError::CapacityZero);
    assert!(error.to_string().contains("capacity 0"), "{error}");
    assert!(error.to_string().contains("at least 1"), "{error}");
    // One is enough: the table rounds up to a bucket, and a full one evicts.
    let service = ServiceBuilder::new(Algorithm::TokenBucket, FakeClock::new())
        .plan(1u32, Rule::per_second(5).unwrap())
        .capacity(1)
        .build::<u64>()
        .unwrap();
    for client in 0..100u64 {
        assert!(service.allow(&client, &1).unwrap());
    }
    assert!(service.len() <= 8, "{} held", service.len());
}

/// A key whose `Hash` changes between calls (a hash of a mutable field): every other call
/// hashes it elsewhere, so that a lookup finds the entry its removal then misses.
#[derive(Debug)]
struct UnstableKey {
    id: u64,
    hashes: std::sync::atomic::AtomicU64,
}

impl Clone for UnstableKey {
    fn clone(&self) -> Self {
        UnstableKey {
            id: self.id,
            hashes: std::sync::atomic::AtomicU64::new(
                self.hashes.load(std::sync::atomic::Ordering::Relaxed),
            ),
        }
    }
}

impl PartialEq for UnstableKey {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for UnstableKey {}

impl std::hash::Hash for UnstableKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let calls = self
            .hashes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        (self.id, calls % 2).hash(state);
    }
}

#[test]
fn a_key_whose_hash_changes_is_answered_not_spun_on_after_a_rule_change() {
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
    ] {
        let service: Arc<RateLimiterService<UnstableKey, u32, FakeClock>> = Arc::new(
            RateLimiterService::new(
                algorithm,
                [(1, Rule::per_second(5).unwrap())],
                FakeClock::new(),
            )
            .unwrap(),
        );
        let key = UnstableKey {
            id: 7,
            hashes: std::sync::atomic::AtomicU64::new(0),
        };
        // The first request puts the entry under one of the key's two hashes.
        service.allow(&key, &1).unwrap();
        service.set_rule(&1, Rule::per_second(6).unwrap()).unwrap();
        // On another thread, so that a spin fails the test instead of hanging it.
        let (answered, answer) = std::sync::mpsc::channel();
        let requester = Arc::clone(&service);
        std::thread::spawn(move || {
            let _ = answered.send(requester.allow(&key, &1));
        });
        let answer = answer
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("{algorithm:?}: no answer within 5 s: the lookup spins"));
        // Any answer will do (the key may also be found consistently by chance); an error must
        // be the typed one, naming the plan.
        if let Err(error) = answer {
            assert!(
                matches!(&error, ServiceError::UnstableKey { plan, .. } if plan == "1"),
                "{algorithm:?}: {error:?}"
            );
            assert!(error.to_string().contains("`Hash`"), "{error}");
        }
    }
}
