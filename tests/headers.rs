//! Response header values, against worked examples computed by hand.

use std::time::Duration;

use tollgate::{
    Algorithm, Decision, FakeClock, FixedWindow, Limiter, LimiterFactory, PlanError, Rule,
    ServiceBuilder, ServiceError, SlidingWindowLog, TokenBucket,
};

#[test]
fn fixed_window_100_per_minute_40_taken_15_seconds_before_the_edge() {
    // Window [0 s, 60 s); at 45 s, 40 of 100 are taken: 60 remain, the window resets in 15 s.
    let clock = FakeClock::starting_at(Duration::from_secs(45));
    let window = FixedWindow::new(Rule::per_minute(100).unwrap(), clock).unwrap();
    let decision = window.try_acquire_n(40);
    assert_eq!(
        decision.ratelimit_policy_header("free").unwrap(),
        r#""free";q=100;w=60"#
    );
    assert_eq!(
        decision.ratelimit_header("free").unwrap(),
        r#""free";r=60;t=15"#
    );
    assert_eq!(decision.retry_after_header(), None);
}

#[test]
fn token_bucket_10_per_second_emptied_then_denied() {
    // 10 per second: one token every 100 ms. After 10 at t = 0 the next waits 100 ms, which
    // Retry-After rounds up to 1 s; the bucket is full again after 1 s.
    let bucket = TokenBucket::new(Rule::per_second(10).unwrap(), FakeClock::new()).unwrap();
    assert!(bucket.try_acquire_n(10).is_allowed());
    let denied = bucket.try_acquire_n(1);
    assert_eq!(denied.retry_after(), Duration::from_millis(100));
    assert_eq!(denied.retry_after_header().as_deref(), Some("1"));
    assert_eq!(denied.ratelimit_header("api").unwrap(), r#""api";r=0;t=1"#);
}

#[test]
fn token_bucket_2_per_minute_waits_30_seconds() {
    let bucket = TokenBucket::new(Rule::per_minute(2).unwrap(), FakeClock::new()).unwrap();
    assert!(bucket.try_acquire_n(2).is_allowed());
    let denied = bucket.try_acquire_n(1);
    assert_eq!(denied.retry_after_header().as_deref(), Some("30"));
    // Two tokens to refill, 30 s each.
    assert_eq!(denied.ratelimit_header("api").unwrap(), r#""api";r=0;t=60"#);
}

#[test]
fn sliding_log_3_per_90_seconds() {
    // Admissions at 0, 10 and 20 s; at 30 s the oldest leaves the window at 90 s (60 s away) and
    // the newest at 110 s (80 s away).
    let clock = FakeClock::new();
    let log = SlidingWindowLog::new(
        Rule::new(3, Duration::from_secs(90)).unwrap(),
        clock.clone(),
    )
    .unwrap();
    for _ in 0..3 {
        assert!(log.try_acquire());
        clock.advance(Duration::from_secs(10));
    }
    let denied = log.try_acquire_n(1);
    assert_eq!(denied.retry_after_header().as_deref(), Some("60"));
    assert_eq!(denied.ratelimit_header("log").unwrap(), r#""log";r=0;t=80"#);
    assert_eq!(
        denied.ratelimit_policy_header("log").unwrap(),
        r#""log";q=3;w=90"#
    );
}

#[test]
fn windows_under_a_second_round_up_to_one() {
    let window = FixedWindow::new(
        Rule::new(5, Duration::from_millis(500)).unwrap(),
        FakeClock::new(),
    )
    .unwrap();
    let decision = window.peek();
    assert_eq!(
        decision.ratelimit_policy_header("burst").unwrap(),
        r#""burst";q=5;w=1"#
    );
    assert_eq!(
        decision.ratelimit_header("burst").unwrap(),
        r#""burst";r=5;t=1"#
    );
}

#[test]
fn policy_names_are_quoted_and_escaped_or_refused() {
    let decision = TokenBucket::new(Rule::per_second(1).unwrap(), FakeClock::new())
        .unwrap()
        .peek();
    assert_eq!(
        decision.ratelimit_policy_header(r#"a"b\c"#).unwrap(),
        r#""a\"b\\c";q=1;w=1"#
    );
    for bad in ["", "é", "tab\there", "line\n"] {
        let error = decision.ratelimit_header(bad).unwrap_err();
        assert!(error.to_string().contains("printable ASCII"), "{bad:?}");
    }
}

#[test]
fn a_request_that_can_never_pass_gets_no_retry_after() {
    let bucket = TokenBucket::new(Rule::per_second(5).unwrap(), FakeClock::new()).unwrap();
    let rejected = bucket.try_acquire_n(6);
    assert!(rejected.rejection().is_some());
    assert_eq!(rejected.retry_after_header(), None);
}

/// The largest Structured Field Integer (RFC 9651, section 3.3.1: at most 15 digits).
const MAX_SF_INTEGER: u64 = 999_999_999_999_999;

/// A century of 365.25-day years.
const CENTURY: Duration = Duration::from_secs(36_525 * 86_400);

/// One member of a `RateLimit` or `RateLimit-Policy` field: its name and integer parameters.
type Member = (String, Vec<(String, u64)>);

/// `field` read strictly as a Structured Field List (RFC 9651, section 4.2) of Strings with
/// Integer parameters, as a conforming parser reads it: any other shape, or an integer of more
/// than 15 digits, is an error (a parser then drops the whole field).
fn parse_sf_list(field: &str) -> Result<Vec<Member>, String> {
    let bytes = field.as_bytes();
    let mut at = 0;
    let mut members = Vec::new();
    loop {
        // The item: a String.
        if bytes.get(at) != Some(&b'"') {
            return Err(format!("no string at {at} in {field:?}"));
        }
        at += 1;
        let mut name = String::new();
        loop {
            match bytes.get(at) {
                Some(b'"') => break,
                Some(b'\\') => match bytes.get(at + 1) {
                    Some(&escaped @ (b'"' | b'\\')) => {
                        name.push(char::from(escaped));
                        at += 1;
                    }
                    _ => return Err(format!("bad escape at {at} in {field:?}")),
                },
                Some(&byte @ 0x20..=0x7e) => name.push(char::from(byte)),
                _ => return Err(format!("unterminated string in {field:?}")),
            }
            at += 1;
        }
        at += 1;
        // Its parameters: `;key=integer`.
        let mut parameters = Vec::new();
        while bytes.get(at) == Some(&b';') {
            at += 1;
            let key_start = at;
            if !matches!(bytes.get(at), Some(b'a'..=b'z' | b'*')) {
                return Err(format!("bad key at {at} in {field:?}"));
            }
            while let Some(b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*') = bytes.get(at) {
                at += 1;
            }
            let key = field[key_start..at].to_owned();
            if bytes.get(at) != Some(&b'=') {
                return Err(format!("parameter {key} has no value in {field:?}"));
            }
            at += 1;
            let digits_start = at;
            while bytes.get(at).is_some_and(u8::is_ascii_digit) {
                at += 1;
            }
            let digits = &field[digits_start..at];
            if digits.is_empty() || digits.len() > 15 {
                return Err(format!(
                    "parameter {key} is not an integer of 1 to 15 digits: {:?} in {field:?}",
                    &field[digits_start..]
                ));
            }
            parameters.push((key, digits.parse().unwrap()));
        }
        members.push((name, parameters));
        while let Some(b' ' | b'\t') = bytes.get(at) {
            at += 1;
        }
        match bytes.get(at) {
            None => return Ok(members),
            Some(b',') => at += 1,
            Some(_) => return Err(format!("junk at {at} in {field:?}")),
        }
        while let Some(b' ' | b'\t') = bytes.get(at) {
            at += 1;
        }
        if at == bytes.len() {
            return Err(format!("trailing comma in {field:?}"));
        }
    }
}

#[test]
fn the_strict_parser_refuses_what_a_conforming_parser_drops() {
    assert_eq!(
        parse_sf_list(r#""a\"b";q=999999999999999;w=1, "c";r=0"#),
        Ok(vec![
            (
                r#"a"b"#.to_owned(),
                vec![("q".to_owned(), MAX_SF_INTEGER), ("w".to_owned(), 1)]
            ),
            ("c".to_owned(), vec![("r".to_owned(), 0)]),
        ])
    );
    for invalid in [
        r#""a";q=1000000000000000"#,
        r#""a";q=1152921504606846976"#,
        r#""a";q="#,
        r#""a";q=1.5"#,
        r#""a";q=1,"#,
        r#"a;q=1"#,
        r#""a";Q=1"#,
    ] {
        assert!(parse_sf_list(invalid).is_err(), "{invalid}");
    }
}

/// Whole seconds in `d`, rounded up.
fn ceil_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Checks that both fields of `decision` parse, and say its figures, each clamped to the largest
/// integer.
fn assert_fields_are_valid(decision: &Decision, context: &str) {
    let clamp = |value: u64| value.min(MAX_SF_INTEGER);
    let policy = decision.ratelimit_policy_header("p").unwrap();
    let expected_policy = vec![(
        "p".to_owned(),
        vec![
            ("q".to_owned(), clamp(decision.limit())),
            (
                "w".to_owned(),
                clamp(ceil_seconds(decision.window()).max(1)),
            ),
        ],
    )];
    assert_eq!(parse_sf_list(&policy), Ok(expected_policy), "{context}");
    let ratelimit = decision.ratelimit_header("p").unwrap();
    let expected_ratelimit = vec![(
        "p".to_owned(),
        vec![
            ("r".to_owned(), clamp(decision.remaining())),
            ("t".to_owned(), clamp(ceil_seconds(decision.reset_after()))),
        ],
    )];
    assert_eq!(
        parse_sf_list(&ratelimit),
        Ok(expected_ratelimit),
        "{context}"
    );
}

#[test]
fn a_fixed_window_of_limit_2_pow_60_writes_valid_fields() {
    let limit = 1 << 60;
    let window = FixedWindow::new(
        Rule::new(limit, Rule::MAX_WINDOW).unwrap(),
        FakeClock::new(),
    )
    .unwrap();
    let decision = window.try_acquire_n(3);
    assert!(decision.is_allowed());
    assert_eq!(
        decision.ratelimit_policy_header("huge").unwrap(),
        r#""huge";q=999999999999999;w=9223372037"#
    );
    assert_eq!(
        decision.ratelimit_header("huge").unwrap(),
        r#""huge";r=999999999999999;t=9223372037"#
    );
    assert_eq!(Decision::MAX_FIELD_INTEGER, MAX_SF_INTEGER);
}

#[test]
fn ten_to_the_15_per_century_writes_valid_fields_for_every_method_that_takes_it() {
    let rule = Rule::new(10u64.pow(15), CENTURY).unwrap();
    let mut methods = Vec::new();
    for algorithm in Algorithm::ALL {
        let Ok(limiter) = LimiterFactory::new(algorithm).create(rule, FakeClock::new()) else {
            continue;
        };
        methods.push(algorithm);
        let decision = limiter.peek();
        assert_fields_are_valid(&decision, &format!("{algorithm:?} peek"));
        let policy = decision.ratelimit_policy_header("p").unwrap();
        assert_eq!(
            policy, r#""p";q=999999999999999;w=3155760000"#,
            "{algorithm:?}"
        );
    }
    assert!(
        methods.contains(&Algorithm::TokenBucket) && methods.contains(&Algorithm::FixedWindow),
        "{methods:?}"
    );
}

/// The largest value `accepts` takes from `accepted` up to `most`, by bisection: one accepted
/// with the next refused (each method's bounds are monotonic in the limit or the window, but for
/// the token bucket's, whose exactness depends on common factors: one local maximum there).
fn largest_accepted(mut accepted: u64, most: u64, accepts: impl Fn(u64) -> bool) -> u64 {
    assert!(accepts(accepted));
    if accepts(most) {
        return most;
    }
    let mut refused = most;
    while refused - accepted > 1 {
        let middle = accepted + (refused - accepted) / 2;
        if accepts(middle) {
            accepted = middle;
        } else {
            refused = middle;
        }
    }
    accepted
}

/// Whether `algorithm` takes a limit of `limit` per `window`.
fn accepts(algorithm: Algorithm, limit: u64, window: Duration) -> bool {
    Rule::new(limit, window).is_ok_and(|rule| LimiterFactory::new(algorithm).check(rule).is_ok())
}

/// The largest limit `algorithm` accepts with `window`, or `None` when it accepts not even 1.
fn max_limit(algorithm: Algorithm, window: Duration) -> Option<u64> {
    accepts(algorithm, 1, window)
        .then(|| largest_accepted(1, u64::MAX, |limit| accepts(algorithm, limit, window)))
}

/// The longest window `algorithm` accepts with a limit of 1.
fn max_window(algorithm: Algorithm) -> Duration {
    let max_nanos = u64::try_from(Rule::MAX_WINDOW.as_nanos()).unwrap();
    let nanos = largest_accepted(1_000_000_000, max_nanos, |nanos| {
        accepts(algorithm, 1, Duration::from_nanos(nanos))
    });
    Duration::from_nanos(nanos)
}

#[test]
fn every_method_at_its_largest_limits_and_windows_writes_valid_fields() {
    for algorithm in Algorithm::ALL {
        let longest = max_window(algorithm);
        let mut rules = vec![Rule::new(1, longest).unwrap()];
        for window in [
            Duration::from_secs(1),
            Duration::from_secs(3600),
            CENTURY,
            longest,
        ] {
            if let Some(limit) = max_limit(algorithm, window) {
                rules.push(Rule::new(limit, window).unwrap());
            }
        }
        for rule in rules {
            let context = format!("{algorithm:?} {rule:?}");
            let limiter = LimiterFactory::new(algorithm)
                .create(rule, FakeClock::new())
                .unwrap();
            assert_fields_are_valid(&limiter.peek(), &format!("{context}: peek"));
            assert_fields_are_valid(&limiter.try_acquire_n(1), &format!("{context}: one"));
            // Everything else taken, then one more: denied, the reset far away for long windows.
            let rest = rule.limit() - 1;
            if rest > 0 {
                let taken = limiter.try_acquire_n(rest);
                assert_fields_are_valid(&taken, &format!("{context}: the rest"));
            }
            let denied = limiter.try_acquire_n(1);
            assert!(denied.is_denied(), "{context}");
            assert_fields_are_valid(&denied, &format!("{context}: denied"));
            if rule.window() == longest {
                assert!(
                    ceil_seconds(denied.reset_after()) > 1_000_000,
                    "{context}: {denied:?}"
                );
            }
        }
    }
}

#[test]
fn a_services_fields_for_plans_of_several_huge_limits_are_valid() {
    for algorithm in Algorithm::ALL {
        let mut limits = Vec::new();
        for window in [Duration::from_secs(1), CENTURY, max_window(algorithm)] {
            if let Some(limit) = max_limit(algorithm, window)
                && let Ok(rule) = Rule::new(limit, window)
                && !limits.contains(&rule)
            {
                limits.push(rule);
            }
        }
        let service = match ServiceBuilder::new(algorithm, FakeClock::new())
            .plan_limits("huge", limits.clone())
            .plan("one", limits[limits.len() - 1])
            .build::<u64>()
        {
            Ok(service) => service,
            // This method keeps one limit per plan: the single-limit plan is checked below.
            Err(ServiceError::Plan(PlanError::SeveralLimitsUnsupported { .. })) => {
                ServiceBuilder::new(algorithm, FakeClock::new())
                    .plan("huge", limits[0])
                    .plan("one", limits[limits.len() - 1])
                    .build::<u64>()
                    .unwrap()
            }
            Err(error) => panic!("{algorithm:?}: {error}"),
        };
        for plan in ["huge", "one"] {
            for step in ["fresh", "after one"] {
                let (policy, ratelimit) = service.ratelimit_headers(&7, &plan, plan).unwrap();
                let context = format!("{algorithm:?} {plan} {step}: {policy} / {ratelimit}");
                let policy = parse_sf_list(&policy).unwrap_or_else(|e| panic!("{context}: {e}"));
                let ratelimit =
                    parse_sf_list(&ratelimit).unwrap_or_else(|e| panic!("{context}: {e}"));
                assert_eq!(policy.len(), ratelimit.len(), "{context}");
                assert!(
                    policy.iter().any(|(_, parameters)| parameters
                        .iter()
                        .any(|(key, value)| key == "q" && *value == MAX_SF_INTEGER))
                        || algorithm == Algorithm::SlidingWindowLog
                        || algorithm == Algorithm::SlidingWindowCounter,
                    "{context}: a limit above 15 digits is written as the largest integer"
                );
                assert!(service.allow(&7, &plan).unwrap(), "{context}");
            }
        }
    }
}
