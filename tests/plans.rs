//! The plan model: every mistake in a list of plans is one `PlanError`, and the in-process
//! service, the Redis service and the settings answer the same mistake with the same one.
#![cfg(all(feature = "redis", feature = "settings"))]

use tollgate::redis::{RedisError, RedisRateLimiter};
use tollgate::{
    Algorithm, FakeClock, PlanError, RateLimiterService, Rule, RuleError, ServiceBuilder,
    ServiceError, Settings, SettingsError,
};

/// One plan of a list as the three entry points are given it.
type Plan = (&'static str, Vec<Rule>);

/// What the in-process service says of `plans` under `algorithm`.
fn service(algorithm: Algorithm, plans: &[Plan]) -> Result<(), PlanError> {
    let mut builder = ServiceBuilder::new(algorithm, FakeClock::new());
    for (plan, limits) in plans {
        builder = builder.plan_limits(*plan, limits.iter().copied());
    }
    match builder.build::<u64>() {
        Ok(_) => Ok(()),
        Err(ServiceError::Plan(error)) => Err(error),
        Err(other) => panic!("not a plan mistake: {other:?}"),
    }
}

/// What the Redis service says of `plans` under `algorithm` (without connecting).
fn redis(algorithm: Algorithm, plans: &[Plan]) -> Result<(), PlanError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let _inside = runtime.enter();
    let mut builder = RedisRateLimiter::builder("redis://127.0.0.1:1", algorithm);
    for (plan, limits) in plans {
        builder = builder.plan_limits(*plan, limits.iter().copied());
    }
    match builder.build_lazy() {
        Ok(_) => Ok(()),
        Err(RedisError::Plan(error)) => Err(error),
        Err(other) => panic!("not a plan mistake: {other:?}"),
    }
}

/// What the settings say of `plans` under `algorithm`, written as JSON (which, unlike TOML,
/// can name a plan twice), then of the service built from them.
fn settings(algorithm: Algorithm, plans: &[Plan]) -> Result<(), PlanError> {
    let plans: Vec<String> = plans
        .iter()
        .map(|(plan, limits)| {
            let limits: Vec<String> = limits
                .iter()
                .map(|rule| {
                    format!(
                        r#"{{"limit": {}, "window": "{}ns"}}"#,
                        rule.limit(),
                        rule.window().as_nanos()
                    )
                })
                .collect();
            format!(r#""{plan}": {{"limits": [{}]}}"#, limits.join(", "))
        })
        .collect();
    let text = format!(
        r#"{{"algorithm": "{}", "plans": {{{}}}}}"#,
        algorithm.name(),
        plans.join(", ")
    );
    let plan_error = |error| match error {
        SettingsError::Plan(error) => error,
        other => panic!("not a plan mistake: {other:?}"),
    };
    let settings = Settings::from_json_str(&text).map_err(plan_error)?;
    settings
        .build_service::<u64, _>(FakeClock::new())
        .map(|_| ())
        .map_err(plan_error)
}

/// The mistake each entry point finds in `plans`, all three the same.
fn same_mistake(algorithm: Algorithm, plans: &[Plan]) -> PlanError {
    let error = service(algorithm, plans).expect_err("the service takes the plans");
    assert_eq!(redis(algorithm, plans), Err(error.clone()), "Redis");
    assert_eq!(settings(algorithm, plans), Err(error.clone()), "settings");
    error
}

fn per_second(limit: u64) -> Rule {
    Rule::per_second(limit).unwrap()
}

#[test]
fn sound_plans_are_taken_by_all_three() {
    let plans = [
        ("free", vec![per_second(5)]),
        ("pro", vec![per_second(50), Rule::per_hour(10_000).unwrap()]),
    ];
    for algorithm in [Algorithm::TokenBucket, Algorithm::FixedWindow] {
        assert_eq!(service(algorithm, &plans), Ok(()));
        assert_eq!(redis(algorithm, &plans), Ok(()));
        assert_eq!(settings(algorithm, &plans), Ok(()));
    }
}

#[test]
fn no_plans_is_a_mistake() {
    let error = same_mistake(Algorithm::TokenBucket, &[]);
    assert_eq!(error, PlanError::NoPlans);
    assert_eq!(
        error.to_string(),
        "no plans given: give at least one plan with a limit and a window"
    );
}

#[test]
fn more_plans_than_a_service_tells_apart_is_a_mistake() {
    let plans: Vec<Plan> = (0..=65_536)
        .map(|plan| (&*format!("p{plan}").leak(), vec![per_second(1)]))
        .collect();
    let error = same_mistake(Algorithm::FixedWindow, &plans);
    assert_eq!(
        error,
        PlanError::TooManyPlans {
            count: 65_537,
            max: 65_536
        }
    );
    assert_eq!(error.to_string(), "65537 plans given: give at most 65536");
}

#[test]
fn a_plan_twice_is_a_mistake() {
    let error = same_mistake(
        Algorithm::TokenBucket,
        &[
            ("free", vec![per_second(5)]),
            ("pro", vec![per_second(50)]),
            ("free", vec![per_second(6)]),
        ],
    );
    assert_eq!(
        error,
        PlanError::DuplicatePlan {
            plan: "\"free\"".into()
        }
    );
    assert_eq!(
        error.to_string(),
        "plan \"free\" is given twice: give each plan once"
    );
}

#[test]
fn more_limits_than_a_plan_may_have_is_a_mistake() {
    let limits = (1..=5).map(per_second).collect();
    let error = same_mistake(Algorithm::TokenBucket, &[("pro", limits)]);
    assert_eq!(
        error,
        PlanError::LimitCount {
            plan: "\"pro\"".into(),
            count: 5,
            max: RateLimiterService::<u64, &str, FakeClock>::MAX_LIMITS
        }
    );
    assert_eq!(
        error.to_string(),
        "plan \"pro\" has 5 limits: a plan has at least 1 and at most 4"
    );
}

#[test]
fn a_plan_without_limits_is_a_mistake_to_both_services() {
    // The settings cannot write it: an empty `limits` list is a mistake of the field.
    let plans = [("pro", vec![])];
    let expected = PlanError::LimitCount {
        plan: "\"pro\"".into(),
        count: 0,
        max: 4,
    };
    assert_eq!(
        service(Algorithm::TokenBucket, &plans),
        Err(expected.clone())
    );
    assert_eq!(redis(Algorithm::TokenBucket, &plans), Err(expected));
}

#[test]
fn a_limit_twice_is_a_mistake() {
    let error = same_mistake(
        Algorithm::FixedWindow,
        &[(
            "pro",
            vec![
                per_second(10),
                Rule::per_hour(1_000).unwrap(),
                per_second(10),
            ],
        )],
    );
    assert_eq!(
        error,
        PlanError::DuplicateLimit {
            plan: "\"pro\"".into(),
            position: 2,
            rule: per_second(10)
        }
    );
    assert!(
        error.to_string().starts_with("plan \"pro\": limits[2]: "),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .ends_with("is given twice: give each limit once")
    );
}

#[test]
fn a_rule_the_method_cannot_honour_is_a_mistake_naming_its_position() {
    let huge = Rule::per_hour(1_000_000).unwrap();
    let too_large = RuleError::LimitTooLarge {
        algorithm: Algorithm::SlidingWindowLog,
        limit: 1_000_000,
        max: 65_536,
    };
    let one = same_mistake(Algorithm::SlidingWindowLog, &[("bulk", vec![huge])]);
    assert_eq!(
        one,
        PlanError::InvalidRule {
            plan: "\"bulk\"".into(),
            position: None,
            source: too_large.clone()
        }
    );
    assert!(
        one.to_string()
            .starts_with("plan \"bulk\": limit 1000000 is too large")
    );
    // The counter takes several limits everywhere: the bad one is named by its position.
    let huge = Rule::per_hour(1 << 31).unwrap();
    let several = same_mistake(
        Algorithm::SlidingWindowCounter,
        &[("bulk", vec![per_second(10), huge])],
    );
    assert!(
        matches!(
            &several,
            PlanError::InvalidRule { plan, position: Some(1), source: RuleError::LimitTooLarge { .. } }
                if plan == "\"bulk\""
        ),
        "{several:?}"
    );
    assert!(
        several
            .to_string()
            .starts_with("plan \"bulk\": limits[1]: limit 2147483648")
    );
}

#[test]
fn several_limits_under_the_sliding_log_are_a_mistake_in_process_only() {
    let plans = [("pro", vec![per_second(10), Rule::per_hour(1_000).unwrap()])];
    let expected = PlanError::SeveralLimitsUnsupported {
        plan: "\"pro\"".into(),
        algorithm: Algorithm::SlidingWindowLog,
    };
    assert_eq!(
        service(Algorithm::SlidingWindowLog, &plans),
        Err(expected.clone())
    );
    // The settings are read whichever backend they are for; the in-process service built from
    // them refuses the plan as it refuses it given directly.
    assert_eq!(settings(Algorithm::SlidingWindowLog, &plans), Err(expected));
    // Redis decides all of a plan's limits in one script.
    assert_eq!(redis(Algorithm::SlidingWindowLog, &plans), Ok(()));
}

#[test]
fn a_rule_change_is_checked_as_the_plans_are() {
    let service = ServiceBuilder::new(Algorithm::TokenBucket, FakeClock::new())
        .plan("pro", per_second(10))
        .build::<u64>()
        .unwrap();
    let error = service
        .set_limits(&"pro", [per_second(10), per_second(10)])
        .unwrap_err();
    assert_eq!(
        error,
        ServiceError::Plan(PlanError::DuplicateLimit {
            plan: "\"pro\"".into(),
            position: 1,
            rule: per_second(10)
        })
    );
    assert_eq!(service.rule(&"pro"), Some(per_second(10)));
}

#[test]
fn each_error_wrapping_a_plan_mistake_says_it_and_gives_it_as_source() {
    use std::error::Error;
    let mistake = PlanError::NoPlans;
    let wrapped: [Box<dyn Error>; 3] = [
        Box::new(ServiceError::Plan(mistake.clone())),
        Box::new(RedisError::Plan(mistake.clone())),
        Box::new(SettingsError::Plan(mistake.clone())),
    ];
    for error in wrapped {
        assert_eq!(error.to_string(), mistake.to_string());
        let source = error.source().expect("the plan mistake");
        assert_eq!(source.downcast_ref::<PlanError>(), Some(&mistake));
    }
}
