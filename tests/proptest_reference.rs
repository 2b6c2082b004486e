//! Every lock-free limiter against the plain mutex reference of its method, step for step.
//!
//! Single-threaded: a scenario is a rule, a start time and a random sequence of steps, each
//! either moving a [`FakeClock`] (by a tiny amount, about one or a few tokens' refill, about one
//! window, or hours) or asking for `n` permits (mostly 1, sometimes 0, the whole limit, one more,
//! or any number up to one more). Rules range from nanosecond to hour windows, including limits that do not divide the
//! window (3 per second, 7 per 10 ms) and ones that put the token bucket in its fallback mode
//! (999 per second).
//!
//! Checked for each method:
//! - each decision equals the reference's (a batch takes all its permits at one time or none, in
//!   every method), and `remaining()` equals the reference's available
//!   permits after the step (for the token bucket's fallback mode, which may refill a hair slower
//!   than the rule: every admission is one the exact reference also grants, and `remaining()` is
//!   never above the reference's);
//! - requests the method can never grant are rejections of the documented kind;
//! - `peek()` changes nothing, and reports what one permit would get;
//! - `retry_after()` of a denial is exact: one nanosecond earlier the request is still denied,
//!   at that moment it is granted.
//!
//! The last tests plant a bug in a limiter (among them a sliding log whose batches are not all or
//! nothing) and check that the same comparison finds it.

#[path = "support/reference.rs"]
mod reference;

use std::cell::Cell;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{
    Config, FileFailurePersistence, RngAlgorithm, TestCaseResult, TestError, TestRng, TestRunner,
};
use tollgate::{
    AnyLimiter, Clock, Decision, FakeClock, FixedWindow, Limiter, Rejection, Rule, RuleError,
    SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};

use reference::{RefFixedWindow, RefSlidingWindowCounter, RefSlidingWindowLog, RefTokenBucket};

const HOUR: u64 = 3_600_000_000_000;
const DAY: u64 = 24 * HOUR;

/// Cases per property: the whole file runs in about five seconds in release.
const CASES: u32 = 10_000;

fn config() -> ProptestConfig {
    let default = ProptestConfig::default();
    ProptestConfig {
        // `PROPTEST_CASES` still asks for a deeper run.
        cases: if std::env::var_os("PROPTEST_CASES").is_some() {
            default.cases
        } else {
            CASES
        },
        // Keep failure persistence on, so that a failing case is saved (commit the file) and
        // replayed first on every later run. The default, `SourceParallel`, looks for a lib.rs or
        // main.rs in a folder above this file, finds none, and falls back with a warning to
        // `tests/proptest_reference.proptest-regressions`; naming the file keeps the usual
        // `proptest-regressions/` folder, beside this file. Cargo runs tests from the package
        // root, which the path is relative to.
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/proptest-regressions/proptest_reference.txt",
        ))),
        ..default
    }
}

// ---------- Scenarios ----------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Move the clock forward by this many nanoseconds.
    Advance(u64),
    /// Ask for this many permits at once.
    Acquire(u64),
}

#[derive(Debug, Clone)]
struct Scenario {
    rule: Rule,
    /// Where the clock starts: windows are aligned to its origin, not to the first request.
    start: u64,
    steps: Vec<Step>,
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).expect("windows fit in u64 nanoseconds")
}

fn rules() -> impl Strategy<Value = Rule> {
    let limit = prop_oneof![8 => 1..=50u64, 1 => Just(999u64)];
    let window = prop_oneof![
        1 => 1..=100u64,                     // nanoseconds: some rules allow several per ns
        2 => 1_000..=1_000_000u64,           // microseconds to a millisecond
        2 => 1_000_000..=1_000_000_000u64,   // milliseconds to a second
        1 => prop_oneof![Just(10_000_000u64), Just(1_000_000_000), Just(60_000_000_000)],
        1 => HOUR..=5 * HOUR,
    ];
    // Rules a real deployment would write, including ones whose limit does not divide the window.
    let named = prop_oneof![
        Just((3, 1_000_000_000)),
        Just((7, 10_000_000)),
        Just((999, 1_000_000_000)),
        Just((1_000, 1_000_000_000)),
        Just((50, HOUR)),
        Just((1, 1)),
    ];
    prop_oneof![4 => (limit, window), 1 => named]
        .prop_map(|(limit, window)| Rule::new(limit, Duration::from_nanos(window)).unwrap())
}

fn steps_for(rule: Rule) -> impl Strategy<Value = Step> {
    let limit = rule.limit();
    let window = nanos(rule.window());
    let around = |center: u64| center.saturating_sub(2)..=center.saturating_add(2);
    // Around k tokens' refill time (k*W/N, rounded down), where a permit comes back.
    let around_tokens = (1..=3u64, -2..=2i64).prop_map(move |(k, delta)| {
        let refill = u128::from(k) * u128::from(window) / u128::from(limit);
        u64::try_from(refill).unwrap().saturating_add_signed(delta)
    });
    let advance = prop_oneof![
        3 => 0..=3u64,
        3 => around_tokens,
        2 => around(window),
        1 => 0..=window.saturating_mul(2),
        1 => HOUR..=2 * DAY,
    ]
    .prop_map(Step::Advance);
    let acquire = prop_oneof![
        6 => Just(1),
        1 => Just(0),
        1 => Just(limit),
        1 => Just(limit + 1),
        1 => 0..=limit + 1,
    ]
    .prop_map(Step::Acquire);
    prop_oneof![1 => advance, 2 => acquire]
}

fn scenarios() -> impl Strategy<Value = Scenario> {
    rules().prop_flat_map(|rule| {
        let window = nanos(rule.window());
        (
            Just(rule),
            prop_oneof![Just(0), 0..=window.saturating_mul(3)],
            prop::collection::vec(steps_for(rule), 1..=60),
        )
            .prop_map(|(rule, start, steps)| Scenario { rule, start, steps })
    })
}

// ---------- Limiters under test and their references ----------

/// The reference models' common surface.
trait Reference {
    fn try_acquire_n(&self, n: u64) -> bool;
    /// Whole permits available now.
    fn available(&self) -> u64;
}

macro_rules! impl_reference {
    ($($model:ident),*) => {$(
        impl<C: Clock> Reference for $model<C> {
            fn try_acquire_n(&self, n: u64) -> bool {
                $model::try_acquire_n(self, n)
            }
            fn available(&self) -> u64 {
                $model::available(self)
            }
        }
    )*};
}

impl_reference!(
    RefTokenBucket,
    RefFixedWindow,
    RefSlidingWindowLog,
    RefSlidingWindowCounter
);

#[derive(Debug, Clone, Copy)]
enum Method {
    TokenBucket,
    FixedWindow,
    SlidingWindowLog,
    SlidingWindowCounter,
}

/// Every method, for the properties they all share.
const METHODS: [Method; 4] = [
    Method::TokenBucket,
    Method::FixedWindow,
    Method::SlidingWindowLog,
    Method::SlidingWindowCounter,
];

/// How closely a limiter must follow its reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Agreement {
    /// The same decision and the same `remaining()`, every step.
    Exact,
    /// Only admissions the exact reference also grants (the token bucket's fallback mode). The
    /// reference is given only the requests the limiter granted: refilling at least as fast, it
    /// then always holds at least as many tokens, so it must grant each of them too.
    NeverMore,
}

/// A limiter and its reference, both reading `clock`.
struct Pair<L> {
    limiter: L,
    reference: Box<dyn Reference>,
    clock: FakeClock,
    agreement: Agreement,
}

impl<L: Limiter> Pair<L> {
    /// Pairs `limiter`, of `method` and reading `clock`, with the reference of that method.
    fn new(method: Method, clock: FakeClock, limiter: L, agreement: Agreement) -> Self {
        let rule = limiter.rule();
        let reference: Box<dyn Reference> = match method {
            Method::TokenBucket => Box::new(RefTokenBucket::new(rule, clock.clone())),
            Method::FixedWindow => Box::new(RefFixedWindow::new(rule, clock.clone())),
            Method::SlidingWindowLog => Box::new(RefSlidingWindowLog::new(rule, clock.clone())),
            Method::SlidingWindowCounter => {
                Box::new(RefSlidingWindowCounter::new(rule, clock.clone()))
            }
        };
        Pair {
            limiter,
            reference,
            clock,
            agreement,
        }
    }
}

fn start_clock(scenario: &Scenario) -> FakeClock {
    FakeClock::starting_at(Duration::from_nanos(scenario.start))
}

fn agreement_of(bucket: &TokenBucket<FakeClock>) -> Agreement {
    if bucket.is_exact() {
        Agreement::Exact
    } else {
        Agreement::NeverMore
    }
}

/// A limiter of `method` for the scenario, or `None` when the method refuses the rule for a
/// documented reason (a fixed window's or a sliding window counter's index would wrap within ten
/// years for nanosecond windows;
/// a token bucket cannot represent several permits per nanosecond outside its exact mode).
fn limiter(
    method: Method,
    scenario: &Scenario,
    clock: &FakeClock,
) -> Option<AnyLimiter<FakeClock>> {
    let rule = scenario.rule;
    let made = match method {
        Method::TokenBucket => TokenBucket::new(rule, clock.clone()).map(AnyLimiter::TokenBucket),
        Method::FixedWindow => FixedWindow::new(rule, clock.clone()).map(AnyLimiter::FixedWindow),
        Method::SlidingWindowLog => {
            SlidingWindowLog::new(rule, clock.clone()).map(AnyLimiter::SlidingWindowLog)
        }
        Method::SlidingWindowCounter => {
            SlidingWindowCounter::new(rule, clock.clone()).map(AnyLimiter::SlidingWindowCounter)
        }
    };
    match made {
        Ok(limiter) => Some(limiter),
        Err(RuleError::RateTooHigh { .. }) if matches!(method, Method::TokenBucket) => None,
        Err(RuleError::HorizonTooShort { .. })
            if matches!(method, Method::FixedWindow | Method::SlidingWindowCounter) =>
        {
            None
        }
        Err(error) => panic!("{method:?} refused {rule:?}: {error}"),
    }
}

fn pair(method: Method, scenario: &Scenario) -> Option<Pair<AnyLimiter<FakeClock>>> {
    let clock = start_clock(scenario);
    let limiter = limiter(method, scenario, &clock)?;
    let agreement = match &limiter {
        AnyLimiter::TokenBucket(bucket) => agreement_of(bucket),
        _ => Agreement::Exact,
    };
    Some(Pair::new(method, clock, limiter, agreement))
}

fn expected_rejection(n: u64, limit: u64) -> Option<Rejection> {
    (n > limit).then_some(Rejection::ExceedsLimit {
        requested: n,
        limit,
    })
}

// ---------- The properties ----------

/// Runs the scenario's steps on the pair and compares every decision with the reference.
fn agrees_with_reference<L: Limiter>(pair: &Pair<L>, steps: &[Step]) -> TestCaseResult {
    let limit = pair.limiter.rule().limit();
    for (index, &step) in steps.iter().enumerate() {
        let n = match step {
            Step::Advance(by) => {
                pair.clock.advance(Duration::from_nanos(by));
                continue;
            }
            Step::Acquire(n) => n,
        };
        let at = pair.clock.now_nanos();
        let decision = pair.limiter.try_acquire_n(n);
        let context = format!("step {index} (acquire {n} at {at} ns): {decision:?}");

        let expected = match pair.agreement {
            Agreement::Exact => pair.reference.try_acquire_n(n),
            // The reference takes only what the limiter took, so that both follow one history.
            Agreement::NeverMore => decision.is_allowed() && pair.reference.try_acquire_n(n),
        };
        prop_assert_eq!(decision.is_allowed(), expected, "{}", context);

        let rejection = expected_rejection(n, limit);
        prop_assert_eq!(decision.rejection(), rejection, "{}", context);
        if rejection.is_some() {
            // `remaining()` means nothing for a request that can never be granted.
            prop_assert_eq!(decision.retry_after(), Duration::MAX, "{}", context);
            continue;
        }
        if decision.is_allowed() {
            prop_assert_eq!(decision.retry_after(), Duration::ZERO, "{}", context);
        }
        // After an admission both have taken n; after a denial neither has taken anything.
        let available = pair.reference.available();
        match pair.agreement {
            Agreement::Exact => prop_assert_eq!(decision.remaining(), available, "{}", context),
            Agreement::NeverMore => prop_assert!(
                decision.remaining() <= available,
                "{context}: reference has {available}"
            ),
        }
    }
    Ok(())
}

/// A denied request is granted exactly `retry_after()` later, and not a nanosecond sooner.
fn retry_after_is_exact(
    limiter: &impl Limiter,
    clock: &FakeClock,
    steps: &[Step],
) -> TestCaseResult {
    for (index, &step) in steps.iter().enumerate() {
        let n = match step {
            Step::Advance(by) => {
                clock.advance(Duration::from_nanos(by));
                continue;
            }
            Step::Acquire(n) => n,
        };
        let denied = limiter.try_acquire_n(n);
        if denied.is_allowed() || denied.rejection().is_some() {
            continue;
        }
        let context = format!(
            "step {index} (acquire {n} at {} ns): {denied:?}",
            clock.now_nanos()
        );
        let wait = nanos(denied.retry_after());
        prop_assert!(wait >= 1, "{}", context);

        clock.advance(Duration::from_nanos(wait - 1));
        let early = limiter.try_acquire_n(n);
        prop_assert!(
            early.is_denied(),
            "{context}: granted 1 ns early: {early:?}"
        );
        prop_assert_eq!(early.retry_after(), Duration::from_nanos(1), "{}", context);

        clock.advance(Duration::from_nanos(1));
        let on_time = limiter.try_acquire_n(n);
        prop_assert!(
            on_time.is_allowed(),
            "{context}: still denied on time: {on_time:?}"
        );
    }
    Ok(())
}

/// Two limiters on one clock take the same steps; one is peeked at before every attempt. Their
/// decisions must be identical, and each peek must report what one permit would get.
fn peek_changes_nothing(method: Method, scenario: &Scenario) -> TestCaseResult {
    let clock = start_clock(scenario);
    let (Some(peeked), Some(untouched)) = (
        limiter(method, scenario, &clock),
        limiter(method, scenario, &clock),
    ) else {
        return Ok(());
    };
    for (index, &step) in scenario.steps.iter().enumerate() {
        let n = match step {
            Step::Advance(by) => {
                clock.advance(Duration::from_nanos(by));
                continue;
            }
            Step::Acquire(n) => n,
        };
        let peek = peeked.peek();
        prop_assert_eq!(peeked.peek(), peek, "step {}: a second peek differs", index);
        prop_assert_eq!(
            untouched.peek(),
            peek,
            "step {}: peeking changed the state",
            index
        );
        prop_assert_eq!(
            peek.is_allowed(),
            peek.remaining() >= 1,
            "step {}: {:?}",
            index,
            peek
        );

        let decision = peeked.try_acquire_n(n);
        prop_assert_eq!(
            decision,
            untouched.try_acquire_n(n),
            "step {}: acquire {}",
            index,
            n
        );
        if n == 1 {
            let context = format!("step {index}: peek {peek:?}, then {decision:?}");
            prop_assert_eq!(decision.is_allowed(), peek.is_allowed(), "{}", context);
            if decision.is_allowed() {
                prop_assert_eq!(decision.remaining() + 1, peek.remaining(), "{}", context);
            } else {
                // A denied peek is the denial the attempt itself gets, wait included.
                prop_assert_eq!(decision, peek, "{}", context);
            }
        }
    }
    Ok(())
}

fn check_agreement(method: Method, scenario: &Scenario) -> TestCaseResult {
    match pair(method, scenario) {
        Some(pair) => agrees_with_reference(&pair, &scenario.steps),
        None => Ok(()),
    }
}

fn check_retry_after(method: Method, scenario: &Scenario) -> TestCaseResult {
    let clock = start_clock(scenario);
    match limiter(method, scenario, &clock) {
        Some(limiter) => retry_after_is_exact(&limiter, &clock, &scenario.steps),
        None => Ok(()),
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn token_bucket_decides_like_the_exact_reference(scenario in scenarios()) {
        check_agreement(Method::TokenBucket, &scenario)?;
    }

    #[test]
    fn fixed_window_decides_like_the_reference(scenario in scenarios()) {
        check_agreement(Method::FixedWindow, &scenario)?;
    }

    #[test]
    fn sliding_log_decides_like_the_reference(scenario in scenarios()) {
        check_agreement(Method::SlidingWindowLog, &scenario)?;
    }

    #[test]
    fn sliding_window_counter_decides_like_the_reference(scenario in scenarios()) {
        check_agreement(Method::SlidingWindowCounter, &scenario)?;
    }

    #[test]
    fn peek_never_changes_state_and_reports_the_next_permit(scenario in scenarios()) {
        for method in METHODS {
            peek_changes_nothing(method, &scenario)?;
        }
    }

    #[test]
    fn retry_after_of_a_denial_is_exact_to_the_nanosecond(scenario in scenarios()) {
        for method in METHODS {
            check_retry_after(method, &scenario)?;
        }
    }
}

// ---------- The checker catches planted bugs ----------

/// Runs `check` on generated scenarios with a fixed seed and no failure file (these failures
/// are planted), returning the minimal failing scenario if any.
fn find_failure(check: impl Fn(&Scenario) -> TestCaseResult) -> Option<Scenario> {
    let config = Config {
        cases: 1_000,
        failure_persistence: None,
        ..Config::default()
    };
    let rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
    match TestRunner::new_with_rng(config, rng).run(&scenarios(), |scenario| check(&scenario)) {
        Ok(()) => None,
        Err(TestError::Fail(_, minimal)) => Some(minimal),
        Err(TestError::Abort(reason)) => panic!("the runner gave up: {reason}"),
    }
}

/// Reads another clock one nanosecond ahead: windows end a nanosecond early.
#[derive(Debug, Clone)]
struct OneAhead(FakeClock);

impl Clock for OneAhead {
    fn now_nanos(&self) -> u64 {
        self.0.now_nanos() + 1
    }
}

#[test]
fn checker_catches_a_fixed_window_whose_windows_end_a_nanosecond_early() {
    let failure = find_failure(|scenario| {
        let clock = start_clock(scenario);
        let Ok(skewed) = FixedWindow::new(scenario.rule, OneAhead(clock.clone())) else {
            return Ok(());
        };
        let pair = Pair::new(Method::FixedWindow, clock, skewed, Agreement::Exact);
        agrees_with_reference(&pair, &scenario.steps)
    });
    let minimal = failure.expect("an off-by-one window boundary went unnoticed");
    // The same steps pass on the real fixed window: the failure is the planted bug's.
    assert!(
        check_agreement(Method::FixedWindow, &minimal).is_ok(),
        "{minimal:?}"
    );
}

/// A token bucket that, once it has refilled completely, grants one extra permit beyond its
/// capacity.
struct ExtraPermitAfterRefill {
    bucket: TokenBucket<FakeClock>,
    bonus: Cell<bool>,
}

impl Limiter for ExtraPermitAfterRefill {
    fn try_acquire_n(&self, n: u64) -> Decision {
        if self.bucket.peek().remaining() == self.bucket.rule().limit() {
            self.bonus.set(true);
        }
        let decision = self.bucket.try_acquire_n(n);
        if n == 1 && decision.is_denied() && decision.rejection().is_none() && self.bonus.take() {
            // Only the crate builds decisions; an attempt for 0 permits is always an allowed one.
            return self.bucket.try_acquire_n(0);
        }
        decision
    }

    fn peek(&self) -> Decision {
        self.bucket.peek()
    }

    fn rule(&self) -> Rule {
        self.bucket.rule()
    }
}

#[test]
fn checker_catches_a_token_bucket_with_one_permit_too_many() {
    let failure = find_failure(|scenario| {
        let clock = start_clock(scenario);
        let Ok(bucket) = TokenBucket::new(scenario.rule, clock.clone()) else {
            return Ok(());
        };
        let agreement = agreement_of(&bucket);
        let planted = ExtraPermitAfterRefill {
            bucket,
            bonus: Cell::new(false),
        };
        let pair = Pair::new(Method::TokenBucket, clock, planted, agreement);
        agrees_with_reference(&pair, &scenario.steps)
    });
    let minimal = failure.expect("an extra permit went unnoticed");
    assert!(
        check_agreement(Method::TokenBucket, &minimal).is_ok(),
        "{minimal:?}"
    );
}

#[test]
fn checker_catches_a_sliding_window_counter_that_reads_a_nanosecond_ahead() {
    // A nanosecond ahead, the previous window weighs a nanosecond less: the estimate drops early.
    let failure = find_failure(|scenario| {
        let clock = start_clock(scenario);
        let Ok(skewed) = SlidingWindowCounter::new(scenario.rule, OneAhead(clock.clone())) else {
            return Ok(());
        };
        let pair = Pair::new(
            Method::SlidingWindowCounter,
            clock,
            skewed,
            Agreement::Exact,
        );
        agrees_with_reference(&pair, &scenario.steps)
    });
    let minimal = failure.expect("a counter weighing a nanosecond early went unnoticed");
    assert!(
        check_agreement(Method::SlidingWindowCounter, &minimal).is_ok(),
        "{minimal:?}"
    );
}

/// A sliding log that takes a batch as single permits one after another, keeping those it got
/// when one is denied: a batch that is not all or nothing.
struct PermitByPermitBatches(SlidingWindowLog<FakeClock>);

impl Limiter for PermitByPermitBatches {
    fn try_acquire_n(&self, n: u64) -> Decision {
        if n < 2 || n > self.0.rule().limit() {
            return self.0.try_acquire_n(n);
        }
        let mut last = self.0.try_acquire_n(1);
        for _ in 1..n {
            if last.is_denied() {
                break;
            }
            last = self.0.try_acquire_n(1);
        }
        last
    }

    fn peek(&self) -> Decision {
        self.0.peek()
    }

    fn rule(&self) -> Rule {
        self.0.rule()
    }
}

#[test]
fn checker_catches_a_sliding_log_whose_batches_are_not_all_or_nothing() {
    let failure = find_failure(|scenario| {
        let clock = start_clock(scenario);
        let log = SlidingWindowLog::new(scenario.rule, clock.clone()).unwrap();
        let planted = PermitByPermitBatches(log);
        let pair = Pair::new(Method::SlidingWindowLog, clock, planted, Agreement::Exact);
        agrees_with_reference(&pair, &scenario.steps)
    });
    let minimal = failure.expect("a partly granted batch went unnoticed");
    assert!(
        check_agreement(Method::SlidingWindowLog, &minimal).is_ok(),
        "{minimal:?}"
    );
}
