//! Response header values, against worked examples computed by hand.

use std::time::Duration;

use tollgate::{FakeClock, FixedWindow, Limiter, Rule, SlidingWindowLog, TokenBucket};

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
