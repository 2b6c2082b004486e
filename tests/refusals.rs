//! A refusal never makes a limiter more generous, for any reading.
//!
//! For random histories of requests at random readings (so that the clock often steps back),
//! each refused request is checked by probes: the answer a request of 1 to 3 permits gets at
//! many readings around the refusal (the refusal's own, readings just before and after it, and
//! every reading of the history), once in a replay of the history up to the refusal and once in a
//! replay that includes it. The second may never be more generous than the first: not allowed
//! where the first is refused, not more permits left, not a shorter wait.
//!
//! Every method is checked, as a standalone limiter and as a service's plan, with one limit and
//! (for the methods that take them) with two. `checker_catches_a_refusal_that_rolls_a_window` runs
//! the same check on a plainly written plan of two fixed windows whose refusal gives back its
//! permits but leaves the window it rolled forward, and shows the check failing on it.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tollgate::{
    Algorithm, Decision, FakeClock, Limiter, LimiterFactory, RateLimiterService, Rule,
    ServiceBuilder,
};

/// One request: `n` permits at a reading of `at_ms` milliseconds.
#[derive(Debug, Clone, Copy)]
struct Request {
    at_ms: u64,
    n: u64,
}

/// What a probe compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Answer {
    allowed: bool,
    remaining: u64,
    retry_after: Duration,
}

impl From<Decision> for Answer {
    fn from(decision: Decision) -> Self {
        Answer {
            allowed: decision.is_allowed(),
            remaining: decision.remaining(),
            retry_after: decision.retry_after(),
        }
    }
}

impl Answer {
    /// Whether this answer gives the client more than `other` does.
    fn is_more_generous_than(&self, other: &Answer) -> bool {
        match (self.allowed, other.allowed) {
            (true, false) => true,
            (false, true) => false,
            (true, true) => self.remaining > other.remaining,
            (false, false) => self.retry_after < other.retry_after,
        }
    }
}

/// Something that answers requests at given readings, and can be rebuilt by replaying them.
trait Subject {
    /// A fresh subject, with its clock at 0.
    fn fresh(&self) -> Box<dyn Fn(Request) -> Answer + '_>;
}

/// A standalone limiter of `algorithm` for `rule`.
struct Standalone {
    algorithm: Algorithm,
    rule: Rule,
}

impl Subject for Standalone {
    fn fresh(&self) -> Box<dyn Fn(Request) -> Answer + '_> {
        let clock = FakeClock::new();
        let limiter = LimiterFactory::new(self.algorithm)
            .create(self.rule, clock.clone())
            .expect("the strategy makes rules every method takes");
        Box::new(move |request: Request| {
            clock.set(Duration::from_millis(request.at_ms));
            limiter.try_acquire_n(request.n).into()
        })
    }
}

/// A service of `algorithm` whose one plan has `limits`, with one client.
struct Service {
    algorithm: Algorithm,
    limits: Vec<Rule>,
}

impl Subject for Service {
    fn fresh(&self) -> Box<dyn Fn(Request) -> Answer + '_> {
        let clock = FakeClock::new();
        let service: RateLimiterService<u64, &'static str, FakeClock> =
            ServiceBuilder::new(self.algorithm, clock.clone())
                .plan_limits("plan", self.limits.iter().copied())
                .build()
                .expect("the strategy makes plans every method takes");
        Box::new(move |request: Request| {
            clock.set(Duration::from_millis(request.at_ms));
            service
                .acquire(&7, &"plan", request.n)
                .expect("a known plan")
                .into()
        })
    }
}

/// Replays `history` on a fresh `subject`, then answers `probe`.
fn answer_after(subject: &dyn Subject, history: &[Request], probe: Request) -> Answer {
    let decide = subject.fresh();
    for request in history {
        decide(*request);
    }
    decide(probe)
}

/// The readings probed around a refusal at `at_ms`.
fn probe_readings(history: &[Request], at_ms: u64) -> Vec<u64> {
    let mut readings: Vec<u64> = [0, 1, 10, 100, 400, 999, 1_000, 1_001, 2_500]
        .iter()
        .flat_map(|offset| [at_ms.saturating_sub(*offset), at_ms + offset])
        .chain(history.iter().map(|request| request.at_ms))
        .collect();
    readings.sort_unstable();
    readings.dedup();
    readings
}

/// The property: no refusal in `history` makes `subject` more generous at any probe.
fn no_refusal_helps_any_reading(
    subject: &dyn Subject,
    history: &[Request],
) -> Result<(), TestCaseError> {
    let decide = subject.fresh();
    let answers: Vec<Answer> = history.iter().map(|request| decide(*request)).collect();
    let refusals = answers
        .iter()
        .enumerate()
        .filter(|(_, answer)| !answer.allowed);
    for (at, _) in refusals {
        let request = history[at];
        for reading in probe_readings(history, request.at_ms) {
            for n in 1..=3 {
                let probe = Request { at_ms: reading, n };
                let before = answer_after(subject, &history[..at], probe);
                let after = answer_after(subject, &history[..=at], probe);
                prop_assert!(
                    !after.is_more_generous_than(&before),
                    "the refusal of {request:?} (request {at}) made a probe of {n} at {reading} ms \
                     more generous: {before:?} before it, {after:?} after"
                );
            }
        }
    }
    Ok(())
}

fn requests() -> impl Strategy<Value = Vec<Request>> {
    prop::collection::vec(
        (0u64..6_000, 0u64..=4).prop_map(|(at_ms, n)| Request { at_ms, n }),
        1..16,
    )
}

/// A short rule: 1 to 4 permits per 1, 2 or 3 seconds.
fn short_rule() -> impl Strategy<Value = Rule> {
    (1u64..=4, 1u64..=3).prop_map(|(limit, seconds)| {
        Rule::new(limit, Duration::from_secs(seconds)).expect("a valid rule")
    })
}

/// A longer rule for a plan's second limit: 2 to 6 permits per 5 or 10 seconds.
fn long_rule() -> impl Strategy<Value = Rule> {
    (2u64..=6, prop::sample::select(vec![5u64, 10])).prop_map(|(limit, seconds)| {
        Rule::new(limit, Duration::from_secs(seconds)).expect("a valid rule")
    })
}

const EVERY_METHOD: [Algorithm; 4] = [
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowLog,
    Algorithm::SlidingWindowCounter,
];

/// The methods that take plans of several limits.
const SEVERAL_LIMIT_METHODS: [Algorithm; 3] = [
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowCounter,
];

proptest! {
    #![proptest_config(Config::with_cases(256))]

    #[test]
    fn a_standalone_limiters_refusal_helps_no_reading(
        method in prop::sample::select(EVERY_METHOD.to_vec()),
        rule in short_rule(),
        history in requests(),
    ) {
        no_refusal_helps_any_reading(&Standalone { algorithm: method, rule }, &history)?;
    }

    #[test]
    fn a_service_plans_refusal_helps_no_reading(
        method in prop::sample::select(EVERY_METHOD.to_vec()),
        rule in short_rule(),
        history in requests(),
    ) {
        no_refusal_helps_any_reading(&Service { algorithm: method, limits: vec![rule] }, &history)?;
    }

    #[test]
    fn a_refusal_by_one_of_two_limits_helps_no_reading(
        method in prop::sample::select(SEVERAL_LIMIT_METHODS.to_vec()),
        first in short_rule(),
        second in long_rule(),
        history in requests(),
    ) {
        no_refusal_helps_any_reading(
            &Service { algorithm: method, limits: vec![first, second] },
            &history,
        )?;
    }
}

/// The history an outside review found: "2 per second and 3 per hour" on the fixed window;
/// 2 granted at 0.5 s; at 1.5 s a request of 2 is refused by the hourly limit; a reading of
/// 0.6 s must then still be refused, as it is without the refusal.
#[test]
fn a_refused_request_leaves_no_window_rolled_forward_for_an_older_reading() {
    for method in SEVERAL_LIMIT_METHODS {
        let subject = Service {
            algorithm: method,
            limits: vec![Rule::per_second(2).unwrap(), Rule::per_hour(3).unwrap()],
        };
        let history = [Request { at_ms: 500, n: 2 }, Request { at_ms: 1_500, n: 2 }];
        let decide = subject.fresh();
        assert!(
            decide(history[0]).allowed,
            "{method:?}: the first 2 fit both limits"
        );
        assert!(
            !decide(history[1]).allowed,
            "{method:?}: the hourly limit has 1 left"
        );
        let older = Request { at_ms: 600, n: 1 };
        let without = answer_after(&subject, &history[..1], older);
        let with = answer_after(&subject, &history, older);
        assert!(
            !with.is_more_generous_than(&without),
            "{method:?}: the refusal made a reading of 0.6 s more generous: {without:?} without \
             it, {with:?} with it"
        );
    }
}

/// A plan of fixed windows whose refusal gives its permits back but keeps the window the grant
/// rolled forward: what the service did before refusals looked before they took.
struct RollingGiveBack {
    limits: Vec<Rule>,
}

impl Subject for RollingGiveBack {
    fn fresh(&self) -> Box<dyn Fn(Request) -> Answer + '_> {
        // Per limit: (window index, permits counted in it).
        let windows = std::cell::RefCell::new(vec![(0u64, 0u64); self.limits.len()]);
        Box::new(move |request: Request| {
            let mut windows = windows.borrow_mut();
            let now = Duration::from_millis(request.at_ms).as_nanos() as u64;
            for taken in 0..self.limits.len() {
                let rule = self.limits[taken];
                let index = now / rule.window().as_nanos() as u64;
                let (stored, count) = &mut windows[taken];
                if index > *stored {
                    (*stored, *count) = (index, 0);
                }
                if *count + request.n > rule.limit() {
                    for (window, _) in windows.iter_mut().zip(0..taken) {
                        window.1 -= request.n;
                    }
                    return Answer {
                        allowed: false,
                        remaining: 0,
                        retry_after: Duration::from_secs(1),
                    };
                }
                *count += request.n;
            }
            Answer {
                allowed: true,
                remaining: 0,
                retry_after: Duration::ZERO,
            }
        })
    }
}

#[test]
fn checker_catches_a_refusal_that_rolls_a_window() {
    let mut runner = TestRunner::new(Config::with_cases(256));
    let subject = RollingGiveBack {
        limits: vec![Rule::per_second(2).unwrap(), Rule::per_hour(3).unwrap()],
    };
    let outcome = runner.run(&requests(), |history| {
        no_refusal_helps_any_reading(&subject, &history)
    });
    assert!(
        outcome.is_err(),
        "the check passed a plan whose refusal leaves a window rolled forward"
    );
}

/// A service whose clients' states a sweep may evict between requests, beside one that never
/// sweeps and takes only what the first granted: the first may never answer more generously, at
/// any reading (a state made after a sweep stands for the evicted one, which an older reading
/// must still find as strict).
#[derive(Debug, Clone, Copy)]
enum Step {
    Request(Request),
    Sweep { at_ms: u64 },
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            4 => (0u64..6_000, 0u64..=4).prop_map(|(at_ms, n)| Step::Request(Request { at_ms, n })),
            1 => (0u64..12_000).prop_map(|at_ms| Step::Sweep { at_ms }),
        ],
        1..24,
    )
}

fn a_sweep_helps_no_reading(
    algorithm: Algorithm,
    limits: &[Rule],
    steps: &[Step],
) -> Result<(), TestCaseError> {
    let service = |clock: &FakeClock| -> RateLimiterService<u64, &'static str, FakeClock> {
        ServiceBuilder::new(algorithm, clock.clone())
            .plan_limits("plan", limits.iter().copied())
            .build()
            .expect("the strategy makes plans every method takes")
    };
    let (swept_clock, kept_clock) = (FakeClock::new(), FakeClock::new());
    let (swept, kept) = (service(&swept_clock), service(&kept_clock));
    let at = |at_ms: u64| {
        swept_clock.set(Duration::from_millis(at_ms));
        kept_clock.set(Duration::from_millis(at_ms));
    };
    for (index, step) in steps.iter().enumerate() {
        match *step {
            Step::Sweep { at_ms } => {
                at(at_ms);
                swept.sweep();
            }
            Step::Request(request) => {
                at(request.at_ms);
                let after_sweeps = Answer::from(swept.acquire(&7, &"plan", request.n).unwrap());
                if after_sweeps.allowed {
                    let without = Answer::from(kept.acquire(&7, &"plan", request.n).unwrap());
                    prop_assert!(
                        !after_sweeps.is_more_generous_than(&without),
                        "step {index}, {request:?}: {after_sweeps:?} after sweeps, {without:?} \
                         without"
                    );
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(Config::with_cases(256))]

    #[test]
    fn a_state_made_after_a_sweep_helps_no_older_reading(
        method in prop::sample::select(EVERY_METHOD.to_vec()),
        rule in short_rule(),
        steps in steps(),
    ) {
        a_sweep_helps_no_reading(method, &[rule], &steps)?;
    }

    #[test]
    fn a_state_of_two_limits_made_after_a_sweep_helps_no_older_reading(
        method in prop::sample::select(SEVERAL_LIMIT_METHODS.to_vec()),
        first in short_rule(),
        second in long_rule(),
        steps in steps(),
    ) {
        a_sweep_helps_no_reading(method, &[first, second], &steps)?;
    }
}

/// The sliding window counter's case an outside review found: 2 per 10 ms, 2 granted at 5 ms,
/// a sweep at 45 ms evicts the client; a reading of 5 ms must still be refused.
#[test]
fn a_counter_made_after_a_sweep_still_refuses_an_older_reading() {
    let ms = Duration::from_millis;
    for limits in [
        vec![Rule::new(2, ms(10)).unwrap()],
        vec![Rule::new(2, ms(10)).unwrap(), Rule::new(3, ms(20)).unwrap()],
    ] {
        let clock = FakeClock::new();
        let service: RateLimiterService<u64, &'static str, FakeClock> =
            ServiceBuilder::new(Algorithm::SlidingWindowCounter, clock.clone())
                .plan_limits("plan", limits.clone())
                .build()
                .unwrap();
        clock.set(ms(5));
        assert!(service.acquire(&1, &"plan", 2).unwrap().is_allowed());
        clock.set(ms(45));
        assert_eq!(service.sweep(), 1, "the client is idle at 45 ms");
        clock.set(ms(5));
        let older = service.acquire(&1, &"plan", 2).unwrap();
        assert!(older.is_denied(), "{limits:?}: {older:?}");
    }
}

std::thread_local! {
    /// The reading of this thread's requests, for `ThreadClock`.
    static READING: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A clock that reads what its thread set: each thread's requests carry their own reading, as
/// cores whose clocks disagree would.
#[derive(Debug, Clone, Copy)]
struct ThreadClock;

impl tollgate::Clock for ThreadClock {
    fn now_nanos(&self) -> u64 {
        READING.with(std::cell::Cell::get)
    }
}

/// The race an outside review found: a request at a newer reading (R) rolls the short limit's
/// window forward, a racing request at an older reading (O) lands on the rolled word, then R is
/// refused by the long limit. Taken last, the roll now comes after every limit that can refuse,
/// so a refused R never leaves a rolled window for a later request (P) at the older reading.
#[test]
fn a_refusal_racing_an_older_reading_leaves_no_window_rolled() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    let keys: u64 = std::env::var("TOLLGATE_RACE_KEYS")
        .ok()
        .and_then(|keys| keys.parse().ok())
        .unwrap_or(20_000);
    const OLDER_THREADS: usize = 2;
    const SECOND: u64 = 1_000_000_000;
    for (method, prefill_at, old, new) in [
        (
            Algorithm::FixedWindow,
            SECOND / 2,
            SECOND / 2,
            3 * SECOND / 2,
        ),
        (
            Algorithm::SlidingWindowCounter,
            9 * SECOND / 10,
            12 * SECOND / 10,
            5 * SECOND / 2,
        ),
    ] {
        let service: Arc<RateLimiterService<u64, &'static str, ThreadClock>> = Arc::new(
            ServiceBuilder::new(method, ThreadClock)
                .plan_limits(
                    "plan",
                    [Rule::per_second(3).unwrap(), Rule::per_hour(5).unwrap()],
                )
                .build()
                .unwrap(),
        );
        // The key R is on (0: none yet, u64::MAX: done).
        let current = Arc::new(AtomicU64::new(0));
        let older_requests: Vec<_> = (0..OLDER_THREADS)
            .map(|_| {
                let (service, current) = (Arc::clone(&service), Arc::clone(&current));
                std::thread::spawn(move || {
                    READING.with(|reading| reading.set(old));
                    loop {
                        // Relaxed: the key is all the racing thread needs; the states are atomics.
                        match current.load(Ordering::Relaxed) {
                            u64::MAX => break,
                            0 => std::hint::spin_loop(),
                            key => {
                                let _ = service.acquire(&key, &"plan", 1);
                            }
                        }
                    }
                })
            })
            .collect();
        let mut refused = Vec::new();
        for key in 1..=keys {
            READING.with(|reading| reading.set(prefill_at));
            assert!(service.acquire(&key, &"plan", 3).unwrap().is_allowed());
            current.store(key, Ordering::Relaxed);
            READING.with(|reading| reading.set(new));
            if service.acquire(&key, &"plan", 2).unwrap().is_denied() {
                refused.push(key);
            }
        }
        current.store(u64::MAX, Ordering::Relaxed);
        for thread in older_requests {
            thread.join().unwrap();
        }
        READING.with(|reading| reading.set(old));
        for key in refused {
            let later = service.acquire(&key, &"plan", 1).unwrap();
            assert!(
                later.is_denied(),
                "{method:?}, key {key}: a refused request left the window rolled, and a later \
                 request at the older reading was granted: {later:?}"
            );
        }
    }
}
