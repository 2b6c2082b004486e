//! [`AnyParams`]: one limit's constants, of whichever method a setting names, deciding on a
//! client's state of any shape. What the service and the factory use to run a method they know
//! only by its [`Algorithm`].
//!
//! Each operation matches the constants (and the state's shape) to the method's own [`Method`]
//! impl. A state of another shape than the method keeps (left from before a rule change) answers
//! as retired ([`Retired`]), so that the service replaces it.

use super::Method;
use super::client_state::{ClientState, StateRef};
use super::fixed_window::WindowParams;
use super::sliding_window_counter::CounterParams;
use super::sliding_window_log::LogParams;
use super::token_bucket::GcraParams;
use super::word::Reservation;
use crate::clock::Clock;
use crate::decision::{Admit, Retired};
use crate::error::RuleError;
use crate::sync::{AtomicWord, Word};
use crate::{Algorithm, Decision, Rejection, Rule};

/// One limit's constants, for any method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AnyParams {
    TokenBucket(GcraParams),
    FixedWindow(WindowParams),
    SlidingWindowLog(LogParams),
    SlidingWindowCounter(CounterParams),
}

/// The arms of a match on `AnyParams`: `$body` with `$params` bound to the method's constants.
macro_rules! on_params {
    ($any:expr, $params:ident => $body:expr) => {
        match $any {
            AnyParams::TokenBucket($params) => $body,
            AnyParams::FixedWindow($params) => $body,
            AnyParams::SlidingWindowLog($params) => $body,
            AnyParams::SlidingWindowCounter($params) => $body,
        }
    };
}

/// The arms of a match on `AnyParams` and a state (anything that is a [`StateRef`]): `$body` with `$params` bound to the
/// method's constants and `$state` to the state's shape that method keeps, else `$other`.
macro_rules! on_state {
    ($any:expr, $client:expr, $params:ident, $state:ident => $body:expr, else $other:expr) => {
        match ($any, $client.into()) {
            (AnyParams::TokenBucket($params), StateRef::Word($state)) => $body,
            (AnyParams::FixedWindow($params), StateRef::Word($state)) => $body,
            (AnyParams::SlidingWindowCounter($params), StateRef::Word($state)) => $body,
            (AnyParams::SlidingWindowLog($params), StateRef::Ring($state)) => $body,
            _ => $other,
        }
    };
}

impl AnyParams {
    /// The constants of `rule` for `algorithm`, with a timeline that starts at the clock reading
    /// `start_nanos`, or why the method cannot honour the rule.
    pub(crate) fn new(
        algorithm: Algorithm,
        rule: Rule,
        start_nanos: u64,
    ) -> Result<AnyParams, RuleError> {
        Ok(match algorithm {
            Algorithm::TokenBucket => AnyParams::TokenBucket(Method::new(rule, start_nanos)?),
            Algorithm::FixedWindow => AnyParams::FixedWindow(Method::new(rule, start_nanos)?),
            Algorithm::SlidingWindowLog => {
                AnyParams::SlidingWindowLog(Method::new(rule, start_nanos)?)
            }
            Algorithm::SlidingWindowCounter => {
                AnyParams::SlidingWindowCounter(Method::new(rule, start_nanos)?)
            }
        })
    }

    /// The method these constants are for.
    pub(crate) fn algorithm(&self) -> Algorithm {
        match self {
            AnyParams::TokenBucket(_) => Algorithm::TokenBucket,
            AnyParams::FixedWindow(_) => Algorithm::FixedWindow,
            AnyParams::SlidingWindowLog(_) => Algorithm::SlidingWindowLog,
            AnyParams::SlidingWindowCounter(_) => Algorithm::SlidingWindowCounter,
        }
    }

    /// The rule these constants enforce.
    pub(crate) fn rule(&self) -> Rule {
        on_params!(self, params => Method::rule(params))
    }

    /// Whether this method can undo a grant (see [`Method::undo`]).
    pub(crate) fn can_undo(&self) -> bool {
        match self {
            AnyParams::TokenBucket(_) => GcraParams::CAN_UNDO,
            AnyParams::FixedWindow(_) => WindowParams::CAN_UNDO,
            AnyParams::SlidingWindowLog(_) => LogParams::CAN_UNDO,
            AnyParams::SlidingWindowCounter(_) => CounterParams::CAN_UNDO,
        }
    }

    /// See [`Method::fresh`]; the state is marked as made under version 0.
    pub(crate) fn fresh_state(&self, since_nanos: u64) -> ClientState {
        match self {
            AnyParams::TokenBucket(params) => {
                ClientState::Word(0, Method::fresh(params, since_nanos))
            }
            AnyParams::FixedWindow(params) => {
                ClientState::Word(0, Method::fresh(params, since_nanos))
            }
            AnyParams::SlidingWindowCounter(params) => {
                ClientState::Word(0, Method::fresh(params, since_nanos))
            }
            AnyParams::SlidingWindowLog(params) => {
                ClientState::Ring(0, Box::new(Method::fresh(params, since_nanos)))
            }
        }
    }

    /// See [`Method::fresh`], for a one-word method: the word's value, with no state made;
    /// `None` for the sliding log, whose state is a ring.
    pub(crate) fn fresh_word(&self, since_nanos: u64) -> Option<u64> {
        match self {
            AnyParams::TokenBucket(params) => {
                Some(Method::fresh::<Word>(params, since_nanos).into_inner())
            }
            AnyParams::FixedWindow(params) => {
                Some(Method::fresh::<Word>(params, since_nanos).into_inner())
            }
            AnyParams::SlidingWindowCounter(params) => {
                Some(Method::fresh::<Word>(params, since_nanos).into_inner())
            }
            AnyParams::SlidingWindowLog(_) => None,
        }
    }

    /// See [`Method::fresh_report`].
    pub(crate) fn fresh_report(
        &self,
        zero_permits: bool,
        since_nanos: u64,
        clock: &impl Clock,
    ) -> Decision {
        on_params!(self, params => Method::fresh_report(params, zero_permits, since_nanos, clock))
    }

    /// The answer to `n` permits for a client that has no state, where the attempt takes
    /// nothing whatever the state: `n = 0`, or `n` above the limit, which is never granted (see
    /// [`Limiter::try_acquire_n`](crate::Limiter::try_acquire_n)). It is what a fresh state (as
    /// of `since_nanos`) answers, made without one, so that such an attempt neither takes a
    /// place in a service's store nor evicts a client to make one. `None` where `n` may be
    /// granted.
    // The test inlined into every first request (a request of one, `allow`'s and the tower
    // layer's, compiles to nothing); the answer out of line.
    #[inline(always)]
    pub(crate) fn answer_taking_nothing(
        &self,
        n: u64,
        since_nanos: u64,
        clock: &impl Clock,
    ) -> Option<Decision> {
        self.takes_nothing(n)
            .then(|| self.fresh_answer_taking_nothing(n, since_nanos, clock))
    }

    /// Whether an attempt of `n` permits takes nothing whatever the state: `n = 0`, or `n`
    /// above the limit.
    #[inline(always)]
    pub(crate) fn takes_nothing(&self, n: u64) -> bool {
        // A limit is at least 1, so one permit is never above it: told first, so that a
        // request of one compiles to nothing here.
        n != 1 && (n == 0 || n > self.rule().limit())
    }

    /// [`answer_taking_nothing`](AnyParams::answer_taking_nothing)'s answer.
    #[inline(never)]
    fn fresh_answer_taking_nothing(
        &self,
        n: u64,
        since_nanos: u64,
        clock: &impl Clock,
    ) -> Decision {
        let report = self.fresh_report(true, since_nanos, clock);
        if n == 0 {
            return report;
        }
        // Every method refuses an attempt above its limit with the report of an attempt of
        // nothing, and writes nothing.
        report.into_rejected(Rejection::ExceedsLimit {
            requested: n,
            limit: self.rule().limit(),
        })
    }

    /// See [`Method::acquire`].
    #[inline]
    pub(crate) fn acquire<'s, A: AtomicWord + 's>(
        &self,
        state: impl Into<StateRef<'s, A>>,
        n: u64,
        clock: &impl Clock,
    ) -> Result<Decision, Retired> {
        on_state!(self, state, params, state => Method::acquire(params, state, n, clock),
            else Err(Retired))
    }

    /// See [`Method::acquire_one`].
    #[inline(always)]
    pub(crate) fn acquire_one<'s, A: AtomicWord + 's>(
        &self,
        state: impl Into<StateRef<'s, A>>,
        clock: &impl Clock,
    ) -> Result<Admit, Retired> {
        on_state!(self, state, params, state => Method::acquire_one(params, state, clock),
            else Err(Retired))
    }

    /// See [`Method::acquire_one_quiet`].
    #[cfg(feature = "tower")]
    // Always inlined: the tower layer's grant path (see `Checked::acquire`).
    #[inline(always)]
    pub(crate) fn acquire_one_quiet<'s, A: AtomicWord + 's, T>(
        &self,
        state: impl Into<StateRef<'s, A>>,
        clock: &impl Clock,
        granted: impl Fn() -> T,
        refused: impl Fn(Decision) -> T,
    ) -> Result<T, Retired> {
        on_state!(self, state, params, state =>
            Method::acquire_one_quiet(params, state, clock, &granted, &refused),
            else Err(Retired))
    }

    /// See [`Method::peek`].
    #[inline]
    pub(crate) fn peek<'s, A: AtomicWord + 's>(
        &self,
        state: impl Into<StateRef<'s, A>>,
        clock: &impl Clock,
    ) -> Result<Decision, Retired> {
        on_state!(self, state, params, state => Method::peek(params, state, clock),
            else Err(Retired))
    }

    /// See [`Method::dry_run`].
    pub(crate) fn dry_run<'s, A: AtomicWord + 's>(
        &self,
        state: impl Into<StateRef<'s, A>>,
        n: u64,
        clock: &impl Clock,
    ) -> Result<Decision, Retired> {
        on_state!(self, state, params, state => Method::dry_run(params, state, n, clock),
            else Err(Retired))
    }

    /// See [`Method::would_roll`].
    pub(crate) fn would_roll<'s, A: AtomicWord + 's>(
        &self,
        state: impl Into<StateRef<'s, A>>,
        clock: &impl Clock,
    ) -> bool {
        on_state!(self, state, params, state => Method::would_roll(params, state, clock),
            else false)
    }

    /// See [`Method::reserve`].
    #[inline]
    pub(crate) fn reserve<'s, A: AtomicWord + 's>(
        &self,
        state: impl Into<StateRef<'s, A>>,
        n: u64,
        clock: &impl Clock,
    ) -> Result<(Decision, Option<Reservation>), Retired> {
        on_state!(self, state, params, state => Method::reserve(params, state, n, clock),
            else Err(Retired))
    }

    /// See [`Method::undo`].
    pub(crate) fn undo<'s, A: AtomicWord + 's>(
        &self,
        state: impl Into<StateRef<'s, A>>,
        n: u64,
        granted: &Decision,
        reservation: Reservation,
        now_nanos: u64,
    ) {
        on_state!(self, state, params, state =>
            Method::undo(params, state, n, granted, reservation, now_nanos), else ())
    }

    /// See [`Method::refund`].
    #[cfg(feature = "envoy")]
    pub(crate) fn refund<'s, A: AtomicWord + 's>(
        &self,
        state: impl Into<StateRef<'s, A>>,
        n: u64,
        clock: &impl Clock,
    ) {
        on_state!(self, state, params, state => Method::refund(params, state, n, clock),
            else ())
    }

    /// The clock reading by which the permits `granted` (an allowed decision, made at
    /// `now_nanos`) reports will all have left: its `reset_after`, counted from the reading as
    /// the method counts it (a reading before the method's origin counts as the origin).
    pub(crate) fn busy_until(&self, granted: &Decision, now_nanos: u64) -> u64 {
        let origin = on_params!(self, params => Method::origin_nanos(params));
        now_nanos
            .max(origin)
            .saturating_add(crate::clock::duration_to_nanos(granted.reset_after()))
    }

    /// Retires `state` whatever it holds, so that no acquire can succeed on it any more (for a
    /// client that moved to another plan or rule). Returns whether this call did (false if it
    /// already was).
    pub(crate) fn retire_now<'s, A: AtomicWord + 's>(
        &self,
        state: impl Into<StateRef<'s, A>>,
    ) -> bool {
        let state = state.into();
        if let StateRef::Several(several) = state {
            return several.retire_now();
        }
        on_state!(self, state, params, state => Method::retire_now(params, state), else false)
    }

    /// Of a one-word `state` as it holds now (one load): where its counts run up to (the
    /// method's `counted_up_to`), and the earliest clock reading at which it is
    /// indistinguishable from a fresh one; `None` when it is retired, and for the sliding log,
    /// whose state is no word.
    pub(crate) fn counted_and_idle_from<A: AtomicWord>(&self, state: &A) -> Option<(u64, u64)> {
        match self {
            AnyParams::TokenBucket(params) => params.counted_and_idle_from(state),
            AnyParams::FixedWindow(params) => params.counted_and_idle_from(state),
            AnyParams::SlidingWindowCounter(params) => params.counted_and_idle_from(state),
            AnyParams::SlidingWindowLog(_) => None,
        }
    }

    /// Retires a one-word `state` whatever it holds, as [`AnyParams::retire_now`] does, for an
    /// eviction: the clock reading its counts run up to (the method's `counted_up_to` of the
    /// word it retired), `None` if it already was. The sliding log, whose state is no word,
    /// answers 0.
    pub(crate) fn retire_evicted<A: AtomicWord>(&self, state: &A) -> Option<u64> {
        match self {
            AnyParams::TokenBucket(params) => params
                .retire_returning(state)
                .map(|tat| params.counted_up_to(tat)),
            AnyParams::FixedWindow(params) => params
                .retire_returning(state)
                .map(|word| params.counted_up_to(word)),
            AnyParams::SlidingWindowCounter(params) => params
                .retire_returning(state)
                .map(|word| params.counted_up_to(word)),
            AnyParams::SlidingWindowLog(_) => self.retire_now(state).then_some(0),
        }
    }

    /// Retires `state` if it is indistinguishable from a fresh one at `now_nanos`.
    pub(crate) fn retire_if_idle<'s, A: AtomicWord + 's>(
        &self,
        state: impl Into<StateRef<'s, A>>,
        now_nanos: u64,
    ) -> bool {
        on_state!(self, state, params, state => Method::retire_if_idle(params, state, now_nanos),
            else false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Reading;
    use crate::sync::Ordering;
    use std::time::Duration;

    fn xorshift(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    /// The clock reading the timelines of the tests below start at.
    const ORIGIN: u64 = 3_700_000_000;

    /// Calls `check` for each one-word method under rules of a few limits and windows, with the
    /// method, the limit, the method's constants (their timeline starting at [`ORIGIN`]) and the
    /// window in nanoseconds.
    fn each_one_word_rule(mut check: impl FnMut(Algorithm, u64, &AnyParams, u64)) {
        let rules = [
            (5, Duration::from_secs(1)),
            (3, Duration::from_millis(7)),
            (1, Duration::from_secs(1)),
            (1_000, Duration::from_millis(250)),
        ];
        for algorithm in [
            Algorithm::TokenBucket,
            Algorithm::FixedWindow,
            Algorithm::SlidingWindowCounter,
        ] {
            for (limit, window) in rules {
                let rule = Rule::new(limit, window).expect("a valid rule");
                let params = AnyParams::new(algorithm, rule, ORIGIN).expect("a valid rule");
                let window = u64::try_from(window.as_nanos()).expect("a short window");
                check(algorithm, limit, &params, window);
            }
        }
    }

    /// `counted_and_idle_from`'s idle reading is exact for every one-word method: over states
    /// made by requests at readings in any order (fresh, refused, spent, refunded by none), a
    /// copy of the state is retired as idle (`retire_if_idle`) at that reading and at later
    /// ones, and at no earlier one.
    #[test]
    fn a_state_is_idle_from_its_idle_from_reading_on_and_not_before() {
        each_one_word_rule(|algorithm, limit, params, window| {
            let reading = |rng: &mut u64| ORIGIN + xorshift(rng) % (20 * window);
            for seed in 1..300_u64 {
                let rng = &mut seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let since = reading(rng);
                let state = Word::new(params.fresh_word(since).expect("a one-word method"));
                for _ in 0..xorshift(rng) % 24 {
                    let n = 1 + xorshift(rng) % limit.min(3);
                    // Granted or refused alike: the state is what the test reads.
                    let _decision = params
                        .acquire(&state, n, &Reading(reading(rng)))
                        .expect("a live state");
                }
                let context = format!("{algorithm:?}, {limit} per {window} ns, seed {seed}");
                let (counted_up_to, idle_from) =
                    params.counted_and_idle_from(&state).expect("a live state");
                assert!(
                    counted_up_to <= idle_from,
                    "{context}: counted up to {counted_up_to}"
                );
                let idle_at = |now: u64| {
                    let copy = Word::new(state.load(Ordering::Relaxed));
                    params.retire_if_idle(&copy, now)
                };
                let mut readings = vec![idle_from, idle_from.saturating_add(1)];
                readings.extend((0..8).map(|_| reading(rng)));
                if idle_from > 0 {
                    readings.push(idle_from - 1);
                }
                for now in readings {
                    assert_eq!(
                        idle_at(now),
                        now >= idle_from,
                        "{context}: idle from {idle_from}, retired as idle at {now}?"
                    );
                }
                let retired = Word::new(state.load(Ordering::Relaxed));
                params.retire_now(&retired);
                assert_eq!(
                    params.counted_and_idle_from(&retired),
                    None,
                    "{context}: retired"
                );
            }
        });
    }

    /// An evicted client's next state is made as of where its evicted one's counts end
    /// (`retire_evicted`): over any requests of one permit after the eviction, at readings in
    /// any order, it grants at most one limit more than the evicted state would have (its twin,
    /// kept on), and where the counts end is no later than the evicted state's last grant. Made
    /// as of the evicting insert's own reading instead, it gives back a limit for every window
    /// between. (Under requests of several permits, all or nothing, a token bucket's grant of
    /// `n` can overshoot the lead by `n - 1`, the evicted state having refused it with fewer
    /// left: one limit is the bound on what the eviction gives back, not on that rounding.)
    #[test]
    fn a_state_made_as_of_where_an_evicted_one_counts_up_to_grants_at_most_one_limit_more() {
        each_one_word_rule(|algorithm, limit, params, window| {
            let reading = |rng: &mut u64| ORIGIN + xorshift(rng) % (20 * window);
            let permits = |rng: &mut u64| 1 + xorshift(rng) % limit.min(3);
            for seed in 1..300_u64 {
                let rng = &mut seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let evicted = Word::new(params.fresh_word(0).expect("a one-word method"));
                let mut last_grant = ORIGIN;
                for _ in 0..xorshift(rng) % 24 {
                    let now = reading(rng);
                    let decision = params
                        .acquire(&evicted, permits(rng), &Reading(now))
                        .expect("a live state");
                    if decision.is_allowed() {
                        last_grant = last_grant.max(now);
                    }
                }
                let twin = Word::new(evicted.load(Ordering::Relaxed));
                let up_to = params
                    .retire_evicted(&evicted)
                    .expect("a live state is retired");
                let context = format!("{algorithm:?}, {limit} per {window} ns, seed {seed}");
                assert!(
                    up_to <= last_grant,
                    "{context}: counted up to {up_to}, after the last grant at {last_grant}"
                );
                assert_eq!(params.retire_evicted(&evicted), None, "{context}");
                let fresh = Word::new(params.fresh_word(up_to).expect("a one-word method"));
                let (mut by_fresh, mut by_twin) = (0, 0);
                for _ in 0..48 {
                    let now = reading(rng);
                    let granted = |word: &Word| {
                        params
                            .acquire(word, 1, &Reading(now))
                            .expect("a live state")
                            .is_allowed()
                    };
                    by_fresh += u64::from(granted(&fresh));
                    by_twin += u64::from(granted(&twin));
                }
                // The counter's fresh word also grants readings of the window before the
                // one it starts (a part of a limit, weighing that window as full), which the
                // evicted word may have refused: a second limit at most.
                let bound = match algorithm {
                    Algorithm::SlidingWindowCounter => 2 * limit,
                    _ => limit,
                };
                assert!(
                    by_fresh <= by_twin + bound,
                    "{context}: the fresh state granted {by_fresh} permits, the evicted one \
                         {by_twin}, more than {bound} apart"
                );
            }
        });
    }

    /// An attempt that takes nothing whatever the state (0 permits, or more than the limit) is
    /// answered without a state exactly as a fresh state made as of the same reading answers it,
    /// at any later or earlier reading, for every method; any other attempt is left to a state.
    #[test]
    fn an_attempt_taking_nothing_is_answered_as_a_fresh_state_answers_it() {
        for algorithm in Algorithm::ALL {
            for (limit, window) in [(5, 1_000_000_000), (3, 7_000_000), (1, 250_000_000)] {
                let rule = Rule::new(limit, Duration::from_nanos(window)).expect("a valid rule");
                let params = AnyParams::new(algorithm, rule, ORIGIN).expect("a valid rule");
                for seed in 1..200_u64 {
                    let rng = &mut seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    let since = ORIGIN + xorshift(rng) % (4 * window);
                    let now = ORIGIN + xorshift(rng) % (5 * window);
                    let n = match xorshift(rng) % 4 {
                        0 => 0,
                        1 => limit + 1 + xorshift(rng) % 10,
                        2 => u64::MAX,
                        _ => 1 + xorshift(rng) % limit,
                    };
                    let context = format!("{algorithm:?}, {limit} per {window} ns, seed {seed}");
                    let answer = params.answer_taking_nothing(n, since, &Reading(now));
                    if n != 0 && n <= limit {
                        assert!(answer.is_none(), "{context}: {n} permits may be granted");
                        continue;
                    }
                    let answer = answer.expect("an attempt taking nothing");
                    let state = params.fresh_state(since);
                    let from_state = params
                        .acquire(&state, n, &Reading(now))
                        .expect("a live state");
                    let figures = |decision: &Decision| {
                        (
                            decision.is_allowed(),
                            decision.remaining(),
                            decision.retry_after(),
                            decision.reset_after(),
                            decision.rejection(),
                        )
                    };
                    assert_eq!(
                        figures(&answer),
                        figures(&from_state),
                        "{context}: {n} permits since {since} at {now}"
                    );
                }
            }
        }
    }
}
