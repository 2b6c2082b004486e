//! The seed's edge cases and the defined outcomes of unusual input, for every method.

use std::time::Duration;

use tollgate::{
    Algorithm, AnyLimiter, FakeClock, Limiter, LimiterFactory, PlanError, RateLimiterService,
    Rejection, Rule, RuleError, ServiceError, TokenBucket,
};

fn limiter(algorithm: Algorithm, rule: Rule, clock: &FakeClock) -> AnyLimiter<FakeClock> {
    LimiterFactory::new(algorithm)
        .create(rule, clock.clone())
        .unwrap()
}

fn burst(limiter: &impl Limiter, attempts: usize) -> usize {
    (0..attempts).filter(|_| limiter.try_acquire()).count()
}

#[test]
fn an_hour_of_silence_refills_only_to_the_limit() {
    for algorithm in Algorithm::ALL {
        let clock = FakeClock::new();
        let limiter = limiter(algorithm, Rule::per_second(5).unwrap(), &clock);
        assert_eq!(burst(&limiter, 10), 5, "{algorithm}");
        clock.advance(Duration::from_secs(3_600));
        assert_eq!(burst(&limiter, 100), 5, "{algorithm}: after an hour");
    }
}

#[test]
fn a_clock_set_backwards_never_grants_extra() {
    for algorithm in Algorithm::ALL {
        let clock = FakeClock::starting_at(Duration::from_secs(100));
        let limiter = limiter(algorithm, Rule::per_second(5).unwrap(), &clock);
        assert_eq!(burst(&limiter, 10), 5, "{algorithm}");
        for back_to in [
            Duration::from_millis(99_500),
            Duration::from_secs(1),
            Duration::ZERO,
        ] {
            clock.set(back_to);
            assert_eq!(
                burst(&limiter, 10),
                0,
                "{algorithm}: clock set back to {back_to:?}"
            );
            assert!(limiter.peek().is_denied(), "{algorithm}");
        }
        // Time resumes from where the limiter last saw it: one window later, a full quota (two for
        // the sliding window counter, whose next window still weighs the burst's in full at its
        // start).
        let recovered = match algorithm {
            Algorithm::SlidingWindowCounter => 102,
            _ => 101,
        };
        clock.set(Duration::from_secs(recovered));
        assert_eq!(
            burst(&limiter, 10),
            5,
            "{algorithm}: after the clock recovers"
        );
    }
}

#[test]
fn a_clock_at_its_far_end_never_panics_nor_admits_without_bound() {
    for algorithm in Algorithm::ALL {
        let clock = FakeClock::new();
        let limiter = limiter(algorithm, Rule::per_second(5).unwrap(), &clock);
        clock.set(Duration::MAX);
        let first = burst(&limiter, 10);
        assert!(first <= 5, "{algorithm}: {first}");
        clock.set(Duration::MAX); // time stands still at the horizon
        assert_eq!(burst(&limiter, 10), 0, "{algorithm}");
        let _ = limiter.peek();
        let _ = limiter.try_acquire_n(5);
    }
}

#[test]
fn try_acquire_n_is_all_or_nothing() {
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
    ] {
        let clock = FakeClock::new();
        let limiter = limiter(algorithm, Rule::per_second(5).unwrap(), &clock);
        assert!(limiter.try_acquire_n(3).is_allowed(), "{algorithm}");
        let denied = limiter.try_acquire_n(3);
        assert!(denied.is_denied(), "{algorithm}");
        assert_eq!(
            denied.remaining(),
            2,
            "{algorithm}: the denial took nothing"
        );
        assert!(denied.rejection().is_none());
        assert!(limiter.try_acquire_n(2).is_allowed(), "{algorithm}");
        assert!(!limiter.try_acquire(), "{algorithm}");
    }
}

#[test]
fn zero_permits_are_always_granted_and_take_nothing() {
    for algorithm in Algorithm::ALL {
        let clock = FakeClock::new();
        let limiter = limiter(algorithm, Rule::per_second(3).unwrap(), &clock);
        let probe = limiter.try_acquire_n(0);
        assert!(probe.is_allowed(), "{algorithm}");
        assert_eq!(probe.remaining(), 3, "{algorithm}");
        assert_eq!(burst(&limiter, 10), 3, "{algorithm}");
        let exhausted = limiter.try_acquire_n(0);
        assert!(exhausted.is_allowed(), "{algorithm}");
        assert_eq!(exhausted.remaining(), 0, "{algorithm}");
    }
}

#[test]
fn more_permits_than_the_limit_are_rejected_for_good() {
    for algorithm in Algorithm::ALL {
        let clock = FakeClock::new();
        let limiter = limiter(algorithm, Rule::per_second(5).unwrap(), &clock);
        let decision = limiter.try_acquire_n(6);
        assert!(decision.is_denied(), "{algorithm}");
        assert_eq!(decision.retry_after(), Duration::MAX, "{algorithm}");
        assert_eq!(
            decision.rejection(),
            Some(Rejection::ExceedsLimit {
                requested: 6,
                limit: 5
            }),
            "{algorithm}"
        );
        assert_eq!(
            burst(&limiter, 10),
            5,
            "{algorithm}: the rejection took nothing"
        );
    }
}

#[test]
fn sliding_log_batches_are_all_or_nothing_at_one_time() {
    let clock = FakeClock::new();
    let limiter = limiter(
        Algorithm::SlidingWindowLog,
        Rule::per_second(5).unwrap(),
        &clock,
    );
    let first = limiter.try_acquire_n(3);
    assert!(first.is_allowed(), "{first:?}");
    assert_eq!(first.remaining(), 2);

    // Two permits left: a batch of three is denied and takes none of them.
    let denied = limiter.try_acquire_n(3);
    assert!(denied.is_denied(), "{denied:?}");
    assert_eq!(denied.rejection(), None);
    assert_eq!(denied.remaining(), 2);
    assert_eq!(denied.retry_after(), Duration::from_secs(1));
    assert_eq!(
        limiter.peek().remaining(),
        2,
        "the denied batch took nothing"
    );

    clock.advance(Duration::from_millis(500));
    let second = limiter.try_acquire_n(2);
    assert!(second.is_allowed(), "{second:?}");
    assert_eq!(second.remaining(), 0);

    // Across the window's edge: the first three leave it at 1 s, the last two at 1.5 s.
    clock.advance(Duration::from_millis(499));
    let early = limiter.try_acquire_n(3);
    assert!(early.is_denied(), "{early:?}");
    assert_eq!(early.retry_after(), Duration::from_millis(1));
    clock.advance(Duration::from_millis(1));
    let on_time = limiter.try_acquire_n(3);
    assert!(on_time.is_allowed(), "{on_time:?}");
    assert_eq!(on_time.remaining(), 0);
    assert_eq!(on_time.reset_after(), Duration::from_secs(1));
    let one_more = limiter.try_acquire_n(1);
    assert!(
        one_more.is_denied(),
        "5 in [0.5 s, 1.5 s) already: {one_more:?}"
    );
    assert_eq!(one_more.retry_after(), Duration::from_millis(500));

    clock.advance(Duration::from_millis(500));
    assert!(limiter.try_acquire_n(2).is_allowed());
    assert_eq!(burst(&limiter, 10), 0);
}

#[test]
fn peek_takes_nothing() {
    for algorithm in Algorithm::ALL {
        let clock = FakeClock::new();
        let limiter = limiter(algorithm, Rule::per_second(2).unwrap(), &clock);
        for _ in 0..5 {
            let peek = limiter.peek();
            assert!(peek.is_allowed(), "{algorithm}");
            assert_eq!(peek.remaining(), 2, "{algorithm}");
        }
        assert_eq!(burst(&limiter, 5), 2, "{algorithm}");
        let peek = limiter.peek();
        assert!(peek.is_denied(), "{algorithm}");
        assert!(peek.retry_after() > Duration::ZERO, "{algorithm}");
    }
}

#[test]
fn a_denial_says_exactly_when_to_retry() {
    for algorithm in Algorithm::ALL {
        let clock = FakeClock::new();
        let limiter = limiter(algorithm, Rule::per_second(4).unwrap(), &clock);
        assert_eq!(burst(&limiter, 4), 4);
        let denied = limiter.try_acquire_n(1);
        let wait = denied.retry_after();
        let expected = match algorithm {
            Algorithm::TokenBucket => Duration::from_millis(250),
            // The next window, once the 4 weigh ceil(4 * (W - e) / W) <= 3: a quarter into it.
            Algorithm::SlidingWindowCounter => Duration::from_millis(1_250),
            _ => Duration::from_secs(1),
        };
        assert_eq!(wait, expected, "{algorithm}");
        clock.advance(wait - Duration::from_nanos(1));
        assert!(!limiter.try_acquire(), "{algorithm}: a nanosecond early");
        clock.advance(Duration::from_nanos(1));
        assert!(limiter.try_acquire(), "{algorithm}: on time");
    }
}

#[test]
fn decisions_report_the_rule_and_the_reset() {
    let clock = FakeClock::starting_at(Duration::from_millis(1_250));
    let window = limiter(
        Algorithm::FixedWindow,
        Rule::per_second(10).unwrap(),
        &clock,
    );
    let decision = window.try_acquire_n(4);
    assert_eq!(decision.limit(), 10);
    assert_eq!(decision.window(), Duration::from_secs(1));
    assert_eq!(decision.remaining(), 6);
    assert_eq!(decision.reset_after(), Duration::from_millis(750));

    let bucket = limiter(
        Algorithm::TokenBucket,
        Rule::per_second(10).unwrap(),
        &clock,
    );
    let decision = bucket.try_acquire_n(4);
    assert_eq!(decision.remaining(), 6);
    assert_eq!(decision.reset_after(), Duration::from_millis(400));
}

#[test]
fn bad_rules_are_errors_that_name_the_field_and_bound() {
    let zero_limit = Rule::new(0, Duration::from_secs(1)).unwrap_err();
    assert_eq!(zero_limit, RuleError::ZeroLimit);
    assert!(zero_limit.to_string().contains("limit 0"));

    let zero_window = Rule::new(5, Duration::ZERO).unwrap_err();
    assert_eq!(zero_window, RuleError::ZeroWindow);
    assert!(zero_window.to_string().contains("window"));

    let too_long = Rule::new(5, Duration::MAX).unwrap_err();
    assert!(matches!(too_long, RuleError::WindowTooLong { .. }));
    assert!(too_long.to_string().contains("at most"));

    let factory = LimiterFactory::new(Algorithm::SlidingWindowLog);
    let too_many = factory
        .create(Rule::per_second(1 << 20).unwrap(), FakeClock::new())
        .unwrap_err();
    assert_eq!(
        too_many,
        RuleError::LimitTooLarge {
            algorithm: Algorithm::SlidingWindowLog,
            limit: 1 << 20,
            max: 65_536
        }
    );
    assert!(too_many.to_string().contains("at most 65536"));

    let window_wraps = LimiterFactory::new(Algorithm::FixedWindow)
        .check(Rule::new(1 << 40, Duration::from_millis(1)).unwrap())
        .unwrap_err();
    assert!(matches!(window_wraps, RuleError::HorizonTooShort { .. }));
    assert!(window_wraps.to_string().contains("limit 1099511627776"));

    let too_fine = LimiterFactory::new(Algorithm::TokenBucket)
        .check(Rule::new(u64::MAX, Duration::from_nanos(7)).unwrap())
        .unwrap_err();
    assert!(matches!(too_fine, RuleError::RateTooHigh { .. }));
}

#[test]
fn every_method_accepts_everyday_rules() {
    for algorithm in Algorithm::ALL {
        let factory = LimiterFactory::new(algorithm);
        for rule in [
            Rule::per_second(1),
            Rule::per_second(999),
            Rule::per_minute(100),
            Rule::per_hour(65_536),
            Rule::new(3, Duration::from_millis(1)),
            Rule::new(7, Duration::from_secs(86_400 * 365)),
        ] {
            let rule = rule.unwrap();
            assert_eq!(factory.check(rule), Ok(()), "{algorithm}: {rule}");
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    Free,
    Pro,
    Enterprise,
}

#[test]
fn a_plan_without_a_rule_is_an_error() {
    for algorithm in Algorithm::ALL {
        let service: RateLimiterService<String, Tier, FakeClock> = RateLimiterService::new(
            algorithm,
            [(Tier::Free, Rule::per_second(5).unwrap())],
            FakeClock::new(),
        )
        .unwrap();
        let error = service.allow("alice", &Tier::Enterprise).unwrap_err();
        assert_eq!(
            error,
            ServiceError::UnknownPlan {
                plan: "Enterprise".into()
            }
        );
        assert!(error.to_string().contains("plan Enterprise has no rule"));
        assert!(service.is_empty(), "a refused request makes no limiter");
    }
}

#[test]
fn bad_service_settings_are_errors_that_name_the_plan() {
    let no_plans =
        RateLimiterService::<u64, Tier, _>::new(Algorithm::TokenBucket, [], FakeClock::new());
    assert_eq!(
        no_plans.unwrap_err(),
        ServiceError::Plan(PlanError::NoPlans)
    );

    let twice = RateLimiterService::<u64, Tier, _>::new(
        Algorithm::TokenBucket,
        [
            (Tier::Pro, Rule::per_second(5).unwrap()),
            (Tier::Pro, Rule::per_second(6).unwrap()),
        ],
        FakeClock::new(),
    );
    assert_eq!(
        twice.unwrap_err(),
        ServiceError::Plan(PlanError::DuplicatePlan { plan: "Pro".into() })
    );

    let too_large = RateLimiterService::<u64, Tier, _>::new(
        Algorithm::SlidingWindowLog,
        [
            (Tier::Free, Rule::per_second(5).unwrap()),
            (Tier::Pro, Rule::per_second(1_000_000).unwrap()),
        ],
        FakeClock::new(),
    )
    .unwrap_err();
    assert!(
        matches!(&too_large, ServiceError::Plan(PlanError::InvalidRule { plan, position: None, .. }) if plan == "Pro")
    );
    assert!(too_large.to_string().starts_with("plan Pro: limit 1000000"));
}

#[test]
fn string_keys_are_looked_up_by_str_without_copying() {
    let service: RateLimiterService<String, Tier, FakeClock> = RateLimiterService::new(
        Algorithm::TokenBucket,
        [(Tier::Free, Rule::per_second(1).unwrap())],
        FakeClock::new(),
    )
    .unwrap();
    let client: &str = "203.0.113.9";
    assert!(service.allow(client, &Tier::Free).unwrap());
    assert!(!service.allow(client, &Tier::Free).unwrap());
    assert!(service.peek(client, &Tier::Free).unwrap().is_denied());
    assert!(service.peek("unseen", &Tier::Free).unwrap().is_allowed());
    assert_eq!(service.len(), 1, "peek does not add clients");
}

#[test]
fn a_client_moved_to_another_plan_follows_the_new_rule_from_its_next_request() {
    for algorithm in Algorithm::ALL {
        let clock = FakeClock::new();
        let service: RateLimiterService<u64, Tier, FakeClock> = RateLimiterService::new(
            algorithm,
            [
                (Tier::Free, Rule::per_second(2).unwrap()),
                (Tier::Pro, Rule::per_second(5).unwrap()),
            ],
            clock.clone(),
        )
        .unwrap();
        let burst = |tier| {
            (0..10)
                .filter(|_| service.allow(&1, &tier).unwrap())
                .count()
        };
        assert_eq!(burst(Tier::Free), 2, "{algorithm}");
        assert_eq!(burst(Tier::Pro), 5, "{algorithm}: upgraded");
        assert_eq!(
            burst(Tier::Free),
            0,
            "{algorithm}: back, with its use under Free kept"
        );
        assert_eq!(service.len(), 2, "one limiter per client and plan");
    }
}

#[test]
fn a_zero_permit_probe_is_granted_even_after_the_clock_steps_back() {
    for algorithm in Algorithm::ALL {
        let clock = FakeClock::starting_at(Duration::from_secs(1));
        let limiter = limiter(algorithm, Rule::per_second(5).unwrap(), &clock);
        assert_eq!(burst(&limiter, 5), 5);
        clock.set(Duration::ZERO);
        let probe = limiter.try_acquire_n(0);
        assert!(probe.is_allowed(), "{algorithm}");
        assert_eq!(probe.remaining(), 0, "{algorithm}");
    }
}

#[test]
fn a_fixed_window_refuses_limits_whose_count_would_reach_its_flag_bit() {
    let rule = Rule::new(
        (1 << 63) - (1 << 20),
        Duration::from_secs(20 * 365 * 86_400),
    )
    .unwrap();
    let error = LimiterFactory::new(Algorithm::FixedWindow)
        .check(rule)
        .unwrap_err();
    assert!(
        matches!(error, RuleError::LimitTooLarge { .. }),
        "{error:?}"
    );
}

#[test]
fn an_inexact_token_bucket_refills_at_most_a_thousandth_slower_and_never_faster() {
    for (limit, window) in [
        (999, Duration::from_secs(1)),
        (31, Duration::from_nanos(1_000_003)),
        (1_000_003, Duration::from_secs(3)),
        // The finest tick rounds this one by more than 1/1000, a coarser one does not.
        (29_029_001, Duration::from_secs(1)),
    ] {
        let clock = FakeClock::new();
        let bucket = TokenBucket::new(Rule::new(limit, window).unwrap(), clock.clone()).unwrap();
        assert!(!bucket.is_exact(), "{limit} per {window:?}");
        // Drain, then let 100 windows pass one token's time at a time.
        while bucket.try_acquire() {}
        let mut granted = 0u64;
        let steps = 100 * limit.min(10_000);
        let step = window * 100 / steps as u32;
        for _ in 0..steps {
            clock.advance(step);
            while bucket.try_acquire() {
                granted += 1;
            }
        }
        let owed = 100 * limit;
        assert!(
            granted <= owed,
            "{limit} per {window:?}: {granted} > {owed}"
        );
        assert!(
            granted * 1_000 >= owed * 999 - 1_000,
            "{limit} per {window:?}: {granted} of {owed}"
        );
    }
    let refused = LimiterFactory::new(Algorithm::TokenBucket)
        .check(Rule::new(100_000_007, Duration::from_millis(1)).unwrap())
        .unwrap_err();
    assert!(
        matches!(refused, RuleError::RateTooHigh { .. }),
        "{refused:?}"
    );
}

#[test]
fn a_sweeping_service_at_the_horizon_never_admits_more_than_once() {
    for algorithm in Algorithm::ALL {
        let clock = FakeClock::new();
        let service: RateLimiterService<u64, &str, FakeClock> = RateLimiterService::new(
            algorithm,
            [("free", Rule::per_second(5).unwrap())],
            clock.clone(),
        )
        .unwrap();
        clock.set(Duration::MAX); // time stands still there: nothing ever refills
        let mut granted = 0;
        for _ in 0..10 {
            granted += (0..10)
                .filter(|_| service.allow(&1, &"free").unwrap())
                .count();
            service.sweep();
        }
        assert_eq!(granted, 5, "{algorithm}: 5 of 100 attempts over 10 sweeps");
    }
}

#[test]
fn a_limiter_on_a_clock_counting_from_the_epoch_keeps_refilling() {
    let epoch_now = Duration::from_secs(1_700_000_000);
    for (algorithm, rule, step) in [
        (
            Algorithm::TokenBucket,
            Rule::per_second(7).unwrap(),
            Duration::from_secs(1),
        ),
        (
            Algorithm::TokenBucket,
            Rule::per_second(999).unwrap(),
            Duration::from_secs(1),
        ),
        (
            Algorithm::FixedWindow,
            Rule::new(1, Duration::from_micros(100)).unwrap(),
            Duration::from_micros(100),
        ),
        (
            Algorithm::SlidingWindowLog,
            Rule::per_second(7).unwrap(),
            Duration::from_secs(1),
        ),
    ] {
        let clock = FakeClock::starting_at(epoch_now);
        let limiter = limiter(algorithm, rule, &clock);
        for round in 0..5 {
            let granted = burst(&limiter, 2_000) as u64;
            assert!(
                granted == rule.limit() || (round > 0 && granted + 1 >= rule.limit()),
                "{algorithm} {rule}, round {round}: {granted}"
            );
            let denied = limiter.try_acquire_n(1);
            assert!(denied.is_denied());
            assert!(denied.retry_after() <= step, "{algorithm}: {denied:?}");
            clock.advance(step);
        }
    }
}

#[test]
fn a_request_above_the_limit_reports_the_real_quota() {
    for algorithm in Algorithm::ALL {
        let clock = FakeClock::new();
        let limiter = limiter(algorithm, Rule::per_second(100).unwrap(), &clock);
        let untouched = limiter.try_acquire_n(101);
        assert!(untouched.rejection().is_some(), "{algorithm}");
        assert_eq!(untouched.remaining(), 100, "{algorithm}: {untouched:?}");
        assert_eq!(
            untouched.ratelimit_header("free").unwrap(),
            limiter.peek().ratelimit_header("free").unwrap(),
            "{algorithm}: as a look at the limiter reports it"
        );
        assert_eq!(burst(&limiter, 40), 40);
        let used = limiter.try_acquire_n(101);
        assert_eq!(used.remaining(), 60, "{algorithm}: {used:?}");
        assert_eq!(
            used.reset_after(),
            limiter.peek().reset_after(),
            "{algorithm}"
        );
        assert!(!used.reset_after().is_zero(), "{algorithm}: {used:?}");
    }
}

#[test]
fn a_token_bucket_refusing_a_long_window_names_a_bound_the_window_breaks() {
    let window = Duration::from_nanos(1 << 62);
    let error = LimiterFactory::new(Algorithm::TokenBucket)
        .check(Rule::new(3, window).unwrap())
        .unwrap_err();
    let RuleError::WindowTooLong { max, .. } = error else {
        panic!("{error:?}");
    };
    assert!(max < window, "{error}");
    assert!(max > window - Duration::from_nanos(3), "{error}");
    // The bound itself is accepted.
    assert!(
        LimiterFactory::new(Algorithm::TokenBucket)
            .check(Rule::new(3, max).unwrap())
            .is_ok()
    );
}

#[test]
fn a_fixed_window_replaced_by_a_sweep_is_no_more_generous_to_an_older_reading() {
    let granted = |sweep: bool| {
        let start = Duration::from_secs(1_700_000_000);
        let clock = FakeClock::starting_at(start);
        let service: RateLimiterService<u64, &str, FakeClock> = RateLimiterService::new(
            Algorithm::FixedWindow,
            [("free", Rule::per_second(2).unwrap())],
            clock.clone(),
        )
        .unwrap();
        clock.advance(Duration::from_millis(900));
        let mut granted = burst_for(&service, 5);
        clock.advance(Duration::from_millis(150));
        if sweep {
            assert_eq!(service.sweep(), 1);
        }
        clock.set(start + Duration::from_millis(950)); // back into the first window
        granted += burst_for(&service, 5);
        granted
    };
    assert_eq!(granted(true), granted(false));
    assert_eq!(granted(false), 2);
}

fn burst_for(service: &RateLimiterService<u64, &str, FakeClock>, attempts: usize) -> usize {
    (0..attempts)
        .filter(|_| service.allow(&7, &"free").unwrap())
        .count()
}

#[test]
fn a_token_bucket_refused_for_rounding_says_so_rather_than_window_too_long() {
    let window: u64 = (1 << 61) + (1 << 40);
    let limit = window / 3 * 2 - 12_345;
    let error = LimiterFactory::new(Algorithm::TokenBucket)
        .check(Rule::new(limit, Duration::from_nanos(window)).unwrap())
        .unwrap_err();
    assert!(matches!(error, RuleError::RateTooHigh { .. }), "{error:?}");
}

#[test]
fn zero_permit_attempts_are_counted_for_known_and_unknown_clients_alike() {
    let service: RateLimiterService<u64, &str, FakeClock> =
        tollgate::ServiceBuilder::new(Algorithm::TokenBucket, FakeClock::new())
            .plan("free", Rule::per_second(2).unwrap())
            .count_decisions(true)
            .build()
            .unwrap();
    assert!(service.acquire(&1, &"free", 0).unwrap().is_allowed());
    assert!(service.allow(&2, &"free").unwrap());
    assert!(service.acquire(&2, &"free", 0).unwrap().is_allowed());
    assert_eq!(service.stats(&"free").unwrap().allowed, 3);
}

#[test]
fn a_fixed_window_pinned_at_its_horizon_says_its_denial_is_for_good() {
    let clock = FakeClock::new();
    let window = limiter(Algorithm::FixedWindow, Rule::per_second(2).unwrap(), &clock);
    clock.set(Duration::MAX);
    assert_eq!(burst(&window, 5), 2);
    let denied = window.try_acquire_n(1);
    assert!(denied.is_denied());
    assert!(
        denied.retry_after() > Duration::from_secs(100 * 365 * 24 * 3600),
        "{denied:?}"
    );
    clock.advance(denied.retry_after());
    assert!(
        window.try_acquire_n(1).is_denied(),
        "time stands still there"
    );
}

#[test]
fn a_sliding_log_pinned_at_its_horizon_says_its_denial_is_for_good() {
    let clock = FakeClock::new();
    let log = limiter(
        Algorithm::SlidingWindowLog,
        Rule::per_second(2).unwrap(),
        &clock,
    );
    clock.set(Duration::MAX);
    assert_eq!(burst(&log, 5), 2);
    for n in [1, 2] {
        let denied = log.try_acquire_n(n);
        assert!(denied.is_denied());
        assert!(
            denied.retry_after() > Duration::from_secs(100 * 365 * 24 * 3600),
            "n = {n}: {denied:?}"
        );
    }
    assert!(log.peek().retry_after() > Duration::from_secs(100 * 365 * 24 * 3600));
}
