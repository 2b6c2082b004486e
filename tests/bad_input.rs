//! Bad input on the entry points not covered elsewhere; the README's "Bad input" table lists
//! every row with the test that checks it.

use std::sync::Arc;
use std::time::Duration;

use tollgate::{
    Algorithm, FakeClock, RateLimiterService, Rule, ServiceBuilder, ServiceError, Sweeper,
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
        ServiceError::TooManyPlans {
            count: 65_537,
            max: 65_536
        }
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
