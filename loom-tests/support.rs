//! What every model shares: a clock frozen per thread, the methods behind one trait, the bound
//! each method guarantees, and the loom runner.
//!
//! The models never read the crate's public limiters: they drive the core state machines that
//! `tollgate::loom_support` instantiates with loom's atomics, so the code under check is the very
//! code the public limiters run.

use std::time::Duration;

use loom::sync::atomic::AtomicU64;
use tollgate::loom_support::{
    CounterParams, GcraParams, LogParams, LogRing, Method as Core, Retired, WindowParams,
};
use tollgate::{Clock, Decision, Rule};

/// The window of every rule in the models: one second. The fixed window refuses windows whose
/// packed index would wrap within ten years, so nanosecond-sized windows are not an option.
pub(crate) const WINDOW: u64 = 1_000_000_000;

/// A rule of `limit` permits per [`WINDOW`].
pub(crate) fn rule(limit: u64) -> Rule {
    Rule::new(limit, Duration::from_nanos(WINDOW)).expect("a model's rule is valid")
}

/// A clock that always reads `self.0`: inside a model each thread has its own fixed reading, and
/// different readings on different threads model clock skew.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FixedClock(pub(crate) u64);

impl Clock for FixedClock {
    fn now_nanos(&self) -> u64 {
        self.0
    }
}

/// Explores every interleaving of `model` with at most `preemption_bound` preemptions. The
/// models' assertions print what the failing execution did (each thread's answer, every
/// admission's time).
pub(crate) fn explore(preemption_bound: usize, model: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(preemption_bound);
    builder.check(model);
}

/// One attempt in a model: `n` permits at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Attempt {
    pub(crate) now: u64,
    pub(crate) n: u64,
}

/// An attempt for `n` permits at `now`.
pub(crate) const fn at(now: u64, n: u64) -> Attempt {
    Attempt { now, n }
}

/// A granted attempt: when the limiter counted it, and how many permits it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Admission {
    pub(crate) time: u64,
    pub(crate) permits: u64,
}

/// What an attempt got, as far as the models care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    Admitted(Admission),
    Denied,
    /// The state was retired for eviction; the caller moves to a fresh one.
    Retired,
}

impl Answer {
    pub(crate) fn admission(self) -> Option<Admission> {
        match self {
            Answer::Admitted(admission) => Some(admission),
            Answer::Denied | Answer::Retired => None,
        }
    }
}

/// The guarantee a method makes over the times its admissions were counted at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bound {
    /// Token bucket: at most `N + floor(N * s / W)` permits in any closed span of length `s`.
    RefillRate,
    /// Fixed window: at most N permits per window `[kW, (k+1)W)`.
    PerAlignedWindow,
    /// Sliding log: at most N permits in every span `[t, t + W)`.
    EverySpanOfOneWindow,
    /// Sliding window counter: in every window k, with C permits in it, P in window k-1 and the
    /// latest admission `e` into it, `ceil(P * (W - e) / W) + C <= N`. (The last admission made
    /// in window k, at some `e' <= e`, was checked against all of C and a weight at least this
    /// one.) It implies at most N per aligned window.
    WeightedEstimate,
}

/// Panics with "over-admitted" if `admissions` break `bound` for `rule`.
pub(crate) fn assert_within_bound(bound: Bound, rule: Rule, admissions: &[Admission]) {
    let limit = u128::from(rule.limit());
    let window = u128::from(duration_nanos(rule.window()));
    let permits_in = |keep: &dyn Fn(u64) -> bool| -> u128 {
        admissions
            .iter()
            .filter(|admission| keep(admission.time))
            .map(|admission| u128::from(admission.permits))
            .sum()
    };
    for first in admissions {
        let start = first.time;
        match bound {
            Bound::RefillRate => {
                for last in admissions.iter().filter(|last| last.time >= start) {
                    let end = last.time;
                    let taken = permits_in(&|time| (start..=end).contains(&time));
                    let allowed = limit + limit * u128::from(end - start) / window;
                    assert!(
                        taken <= allowed,
                        "over-admitted: {taken} permits in [{start}, {end}], the bucket allows \
                         {allowed}; admissions: {admissions:?}"
                    );
                }
            }
            Bound::PerAlignedWindow => {
                let index = u128::from(start) / window;
                let taken = permits_in(&|time| u128::from(time) / window == index);
                assert!(
                    taken <= limit,
                    "over-admitted: {taken} permits in window {index}, limit {limit}; \
                     admissions: {admissions:?}"
                );
            }
            Bound::WeightedEstimate => {
                let index = u128::from(start) / window;
                let in_window = |time: u64| u128::from(time) / window == index;
                let current = permits_in(&in_window);
                let previous = permits_in(&|time| u128::from(time) / window + 1 == index);
                let latest = admissions
                    .iter()
                    .filter(|admission| in_window(admission.time))
                    .map(|admission| u128::from(admission.time) % window)
                    .max()
                    .unwrap_or(0);
                let estimate = (previous * (window - latest)).div_ceil(window) + current;
                assert!(
                    estimate <= limit,
                    "over-admitted: window {index} holds {current} permits beside {previous} in \
                     the one before, weighing {estimate} at {latest} ns in, limit {limit}; \
                     admissions: {admissions:?}"
                );
            }
            Bound::EverySpanOfOneWindow => {
                let end = u128::from(start) + window;
                let taken = permits_in(&|time| (u128::from(start)..end).contains(&time.into()));
                assert!(
                    taken <= limit,
                    "over-admitted: {taken} permits in [{start}, {end}), limit {limit}; \
                     admissions: {admissions:?}"
                );
            }
        }
    }
}

fn duration_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).expect("a model's window fits in u64")
}

/// A rate-limiting method as the models drive it: a state, and attempts on it at a given time.
///
/// Implemented for the crate's core state machines below, and for the deliberately broken
/// variants in `negative_controls`, so that both run through the very same models.
pub(crate) trait Method: Copy + Send + Sync + 'static {
    type State: Send + Sync + 'static;

    /// The guarantee the models check.
    const BOUND: Bound;

    fn rule(&self) -> Rule;

    /// The state of a client that has taken nothing.
    fn fresh_state(&self) -> Self::State;

    /// Tries to take `n` permits from `state` with the clock reading `now`.
    fn acquire(&self, state: &Self::State, n: u64, now: u64) -> Answer;
}

/// A method whose state can be retired for eviction.
pub(crate) trait Evictable: Method {
    /// Retires `state` if it is indistinguishable from a fresh one at `now`.
    fn retire_if_idle(&self, state: &Self::State, now: u64) -> bool;

    /// Retires `state` whatever it holds (a client that moved to another rule); whether this
    /// call did it.
    fn retire_now(&self, state: &Self::State) -> bool;

    /// The state of a client that has taken nothing, made as of `since`: the service makes a
    /// replacement for an evicted client as of the latest sweep's reading, so that it is no more
    /// generous than the retired one to a reading older than the sweep's.
    fn fresh_state_since(&self, since: u64) -> Self::State;

    /// Whether `state` has been retired, taking nothing.
    fn state_is_retired(&self, state: &Self::State, now: u64) -> bool;
}

/// A method whose whole state is one word changed only by a pure decision, so that a sequential
/// history can be replayed without any atomics.
pub(crate) trait OneWord: Method<State = AtomicU64> {
    /// The full decision of an attempt, as `acquire` takes it.
    fn acquire_decision(&self, word: &AtomicU64, n: u64, now: u64) -> Result<Decision, Retired>;

    /// The pure step: the decision from `word`, and the word to store if it changes.
    fn decide(&self, word: u64, now: u64, n: u64) -> (Decision, Option<u64>);
}

/// The answer for `decision`, counted at `time` when allowed.
pub(crate) fn answer(decision: &Decision, n: u64, time: u64) -> Answer {
    if decision.is_allowed() {
        Answer::Admitted(Admission { time, permits: n })
    } else {
        Answer::Denied
    }
}

/// The answer for what an attempt on a state that may be retired got: [`Answer::Retired`], or
/// as [`answer`] says, counted at `counted_at` of the decision when allowed.
pub(crate) fn answer_or_retired(
    decided: Result<Decision, Retired>,
    n: u64,
    counted_at: impl FnOnce(&Decision) -> u64,
) -> Answer {
    match decided {
        Ok(decision) => answer(&decision, n, counted_at(&decision)),
        Err(Retired) => Answer::Retired,
    }
}

/// When a window-based method counted an admission made at `now`: the limiter may count a
/// reading that lags its state at the state's time (the fixed window counts it in the newest
/// window seen, the log never records a time before the latest admission). Its decision reports
/// that time through `reset_after`, measured from `now`, as `Decision::reset_after` documents:
/// the end of the window it counted in (fixed window), or the counted time plus one window (log).
pub(crate) fn counted_time(decision: &Decision, now: u64) -> u64 {
    let reset_at = now + duration_nanos(decision.reset_after());
    now.max(reset_at.saturating_sub(duration_nanos(decision.window())))
}

impl Method for GcraParams {
    type State = AtomicU64;
    const BOUND: Bound = Bound::RefillRate;

    fn rule(&self) -> Rule {
        Core::rule(self)
    }

    fn fresh_state(&self) -> AtomicU64 {
        AtomicU64::new(0)
    }

    fn acquire(&self, state: &AtomicU64, n: u64, now: u64) -> Answer {
        // The bucket's bound holds over the clock readings themselves: a reading behind the TAT
        // is only more debt.
        answer_or_retired(self.acquire_decision(state, n, now), n, |_| now)
    }
}

impl Evictable for GcraParams {
    fn retire_if_idle(&self, state: &AtomicU64, now: u64) -> bool {
        Core::retire_if_idle(self, state, now)
    }

    fn retire_now(&self, state: &AtomicU64) -> bool {
        Core::retire_now(self, state)
    }

    fn fresh_state_since(&self, since: u64) -> AtomicU64 {
        AtomicU64::new(self.full_since(since))
    }

    fn state_is_retired(&self, state: &AtomicU64, now: u64) -> bool {
        Core::peek(self, state, &FixedClock(now)).is_err()
    }
}

impl OneWord for GcraParams {
    fn acquire_decision(&self, word: &AtomicU64, n: u64, now: u64) -> Result<Decision, Retired> {
        Core::acquire(self, word, n, &FixedClock(now))
    }

    fn decide(&self, word: u64, now: u64, n: u64) -> (Decision, Option<u64>) {
        GcraParams::decide(self, word, now, n)
    }
}

impl Method for WindowParams {
    type State = AtomicU64;
    const BOUND: Bound = Bound::PerAlignedWindow;

    fn rule(&self) -> Rule {
        Core::rule(self)
    }

    fn fresh_state(&self) -> AtomicU64 {
        AtomicU64::new(0)
    }

    fn acquire(&self, state: &AtomicU64, n: u64, now: u64) -> Answer {
        let decided = self.acquire_decision(state, n, now);
        answer_or_retired(decided, n, |decision| counted_time(decision, now))
    }
}

impl Evictable for WindowParams {
    fn retire_if_idle(&self, state: &AtomicU64, now: u64) -> bool {
        Core::retire_if_idle(self, state, now)
    }

    fn retire_now(&self, state: &AtomicU64) -> bool {
        Core::retire_now(self, state)
    }

    fn fresh_state_since(&self, since: u64) -> AtomicU64 {
        AtomicU64::new(self.empty_since(since))
    }

    fn state_is_retired(&self, state: &AtomicU64, now: u64) -> bool {
        Core::peek(self, state, &FixedClock(now)).is_err()
    }
}

impl OneWord for WindowParams {
    fn acquire_decision(&self, word: &AtomicU64, n: u64, now: u64) -> Result<Decision, Retired> {
        Core::acquire(self, word, n, &FixedClock(now))
    }

    fn decide(&self, word: u64, now: u64, n: u64) -> (Decision, Option<u64>) {
        WindowParams::decide(self, word, now, n)
    }
}

/// When the sliding window counter counted an admission made at `now`: at `now`, or at the start
/// of the window the word had already moved to, for a reading that lags it. An allowed decision's
/// `reset_after`, measured from `now`, runs to the start of the window after next from the window
/// it counted in, as `SlidingWindowCounter`'s docs say.
pub(crate) fn counter_counted_time(decision: &Decision, now: u64) -> u64 {
    let reset_at = now.saturating_add(duration_nanos(decision.reset_after()));
    now.max(reset_at.saturating_sub(2 * duration_nanos(decision.window())))
}

impl Method for CounterParams {
    type State = AtomicU64;
    const BOUND: Bound = Bound::WeightedEstimate;

    fn rule(&self) -> Rule {
        Core::rule(self)
    }

    fn fresh_state(&self) -> AtomicU64 {
        AtomicU64::new(0)
    }

    fn acquire(&self, state: &AtomicU64, n: u64, now: u64) -> Answer {
        let decided = self.acquire_decision(state, n, now);
        answer_or_retired(decided, n, |decision| counter_counted_time(decision, now))
    }
}

impl Evictable for CounterParams {
    fn retire_if_idle(&self, state: &AtomicU64, now: u64) -> bool {
        Core::retire_if_idle(self, state, now)
    }

    fn retire_now(&self, state: &AtomicU64) -> bool {
        Core::retire_now(self, state)
    }

    fn fresh_state_since(&self, since: u64) -> AtomicU64 {
        AtomicU64::new(self.empty_since(since))
    }

    fn state_is_retired(&self, state: &AtomicU64, now: u64) -> bool {
        Core::peek(self, state, &FixedClock(now)).is_err()
    }
}

impl OneWord for CounterParams {
    fn acquire_decision(&self, word: &AtomicU64, n: u64, now: u64) -> Result<Decision, Retired> {
        Core::acquire(self, word, n, &FixedClock(now))
    }

    fn decide(&self, word: u64, now: u64, n: u64) -> (Decision, Option<u64>) {
        CounterParams::decide(self, word, now, n)
    }
}

impl Method for LogParams {
    type State = LogRing<AtomicU64>;
    const BOUND: Bound = Bound::EverySpanOfOneWindow;

    fn rule(&self) -> Rule {
        Core::rule(self)
    }

    fn fresh_state(&self) -> LogRing<AtomicU64> {
        LogRing::new(self)
    }

    fn acquire(&self, state: &LogRing<AtomicU64>, n: u64, now: u64) -> Answer {
        let decided = Core::acquire(self, state, n, &FixedClock(now));
        answer_or_retired(decided, n, |decision| counted_time(decision, now))
    }
}

impl Evictable for LogParams {
    fn retire_if_idle(&self, state: &LogRing<AtomicU64>, now: u64) -> bool {
        Core::retire_if_idle(self, state, now)
    }

    fn retire_now(&self, state: &LogRing<AtomicU64>) -> bool {
        Core::retire_now(self, state)
    }

    fn fresh_state_since(&self, since: u64) -> LogRing<AtomicU64> {
        LogRing::empty_since(self, since)
    }

    fn state_is_retired(&self, state: &LogRing<AtomicU64>, now: u64) -> bool {
        Core::peek(self, state, &FixedClock(now)).is_err()
    }
}

#[test]
fn retired_decisions_are_told_from_denials() {
    // Check that a retired state answers `Retired` and a denial a denied decision, so that no
    // model silently treats one as the other.
    loom::model(|| {
        let params = GcraParams::new(rule(1)).expect("the bucket accepts the rule");
        let retired = AtomicU64::new(0);
        assert!(Core::retire_if_idle(&params, &retired, 0));
        assert_eq!(Method::acquire(&params, &retired, 1, 0), Answer::Retired);

        let emptied = AtomicU64::new(0);
        assert!(
            Method::acquire(&params, &emptied, 1, 0)
                .admission()
                .is_some()
        );
        assert_eq!(Method::acquire(&params, &emptied, 1, 0), Answer::Denied);
    });
}

/// `$name`: a one-word method's constants (`$params`) as a store's plan hands them out, whose
/// fresh word is `$fresh` of them (the store's `WordLimit`, through the method's own operations).
macro_rules! one_word_limit {
    ($name:ident, $params:ty, $fresh:ident) => {
        #[derive(Debug, Clone, Copy)]
        pub(crate) struct $name(pub(crate) $params);

        impl tollgate::loom_support::store::WordLimit for $name {
            fn fresh(&self, since_nanos: u64) -> u64 {
                self.0.$fresh(since_nanos)
            }

            fn retire_now<A: tollgate::loom_support::AtomicWord>(&self, state: &A) -> bool {
                tollgate::loom_support::Method::retire_now(&self.0, state)
            }

            fn retire_evicted<A: tollgate::loom_support::AtomicWord>(
                &self,
                state: &A,
            ) -> Option<u64> {
                self.0
                    .retire_returning(state)
                    .map(|word| self.0.counted_up_to(word))
            }

            fn counted_and_idle_from<A: tollgate::loom_support::AtomicWord>(
                &self,
                state: &A,
            ) -> Option<(u64, u64)> {
                self.0.counted_and_idle_from(state)
            }

            fn retire_if_idle<A: tollgate::loom_support::AtomicWord>(
                &self,
                state: &A,
                now_nanos: u64,
            ) -> bool {
                tollgate::loom_support::Method::retire_if_idle(&self.0, state, now_nanos)
            }

            fn available<A: tollgate::loom_support::AtomicWord>(
                &self,
                state: &A,
                now_nanos: u64,
            ) -> Option<u64> {
                let clock = crate::support::FixedClock(now_nanos);
                tollgate::loom_support::Method::peek(&self.0, state, &clock)
                    .ok()
                    .map(|decision| decision.remaining())
            }

            fn is_idle<A: tollgate::loom_support::AtomicWord>(
                &self,
                state: &A,
                now_nanos: u64,
            ) -> bool {
                let limit = tollgate::loom_support::Method::rule(&self.0).limit();
                self.available(state, now_nanos) == Some(limit)
            }
        }
    };
}
pub(crate) use one_word_limit;
