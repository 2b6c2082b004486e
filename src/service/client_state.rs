//! The per-client state the service keeps, separate from the per-plan constants.
//!
//! A standalone limiter holds its rule's constants, its state and a clock. The service holds the
//! constants once per plan and the clock once in all, so each client costs only its state: one
//! word for the token bucket, the fixed window and the sliding window counter, a ring for the
//! sliding log.

use super::several_limits::SeveralLimits;
use crate::clock::Clock;
use crate::decision::Admit;
use crate::error::RuleError;
use crate::method::fixed_window::WindowParams;
use crate::method::sliding_window_counter::CounterParams;
use crate::method::sliding_window_log::{LogParams, LogRing};
use crate::method::token_bucket::GcraParams;
use crate::sync::Word;
use crate::{Algorithm, Decision, Rule};

/// How many words a plan's constants take in the plan table (see `ClientParams::to_words`).
pub(crate) const PARAM_WORDS: usize = 6;

/// One plan's constants, for the service's method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientParams {
    TokenBucket(GcraParams),
    FixedWindow(WindowParams),
    SlidingWindowLog(LogParams),
    SlidingWindowCounter(CounterParams),
}

/// One client's state.
#[derive(Debug)]
pub(crate) enum ClientState {
    /// The token bucket's TAT, or the fixed window's or the sliding window counter's packed word.
    Word(Word),
    /// The sliding log's ring; boxed so that the one-word methods' entries stay one word.
    Ring(Box<LogRing<Word>>),
    /// One state per limit of a plan with several (see `SeveralLimits`).
    Several(Box<SeveralLimits>),
}

impl ClientParams {
    /// The constants of `rule` for `algorithm`, with a timeline that starts at the clock reading
    /// `start_nanos` (the service's start), or why the method cannot honour the rule.
    pub(crate) fn new(
        algorithm: Algorithm,
        rule: Rule,
        start_nanos: u64,
    ) -> Result<ClientParams, RuleError> {
        Ok(match algorithm {
            Algorithm::TokenBucket => {
                ClientParams::TokenBucket(GcraParams::new(rule)?.starting_at(start_nanos))
            }
            Algorithm::FixedWindow => {
                ClientParams::FixedWindow(WindowParams::new(rule)?.starting_at(start_nanos))
            }
            Algorithm::SlidingWindowLog => {
                ClientParams::SlidingWindowLog(LogParams::new(rule)?.starting_at(start_nanos))
            }
            Algorithm::SlidingWindowCounter => ClientParams::SlidingWindowCounter(
                CounterParams::new(rule)?.starting_at(start_nanos),
            ),
        })
    }

    /// The constants as plain words, for the plan table.
    pub(crate) fn to_words(self) -> [u64; PARAM_WORDS] {
        match self {
            ClientParams::TokenBucket(params) => params.to_words(),
            ClientParams::FixedWindow(params) => params.to_words(),
            ClientParams::SlidingWindowLog(params) => params.to_words(),
            ClientParams::SlidingWindowCounter(params) => params.to_words(),
        }
    }

    /// The inverse of [`ClientParams::to_words`], for `algorithm`.
    #[inline]
    pub(crate) fn from_words(
        algorithm: Algorithm,
        words: [u64; PARAM_WORDS],
    ) -> Option<ClientParams> {
        Some(match algorithm {
            Algorithm::TokenBucket => ClientParams::TokenBucket(GcraParams::from_words(words)?),
            Algorithm::FixedWindow => ClientParams::FixedWindow(WindowParams::from_words(words)?),
            Algorithm::SlidingWindowLog => {
                ClientParams::SlidingWindowLog(LogParams::from_words(words)?)
            }
            Algorithm::SlidingWindowCounter => {
                ClientParams::SlidingWindowCounter(CounterParams::from_words(words)?)
            }
        })
    }

    /// The method these constants are for.
    pub(crate) fn algorithm(&self) -> Algorithm {
        match self {
            ClientParams::TokenBucket(_) => Algorithm::TokenBucket,
            ClientParams::FixedWindow(_) => Algorithm::FixedWindow,
            ClientParams::SlidingWindowLog(_) => Algorithm::SlidingWindowLog,
            ClientParams::SlidingWindowCounter(_) => Algorithm::SlidingWindowCounter,
        }
    }

    pub(crate) fn rule(&self) -> Rule {
        match self {
            ClientParams::TokenBucket(params) => params.rule(),
            ClientParams::FixedWindow(params) => params.rule(),
            ClientParams::SlidingWindowLog(params) => params.rule(),
            ClientParams::SlidingWindowCounter(params) => params.rule(),
        }
    }

    /// The state of a client that has taken nothing yet, as of `since_nanos`: identical to a
    /// fresh one for any reading from then on, and stricter for earlier readings, so that it is
    /// at least as strict as any state retired as idle at or before `since_nanos`.
    pub(crate) fn fresh_state(&self, since_nanos: u64) -> ClientState {
        match self {
            ClientParams::TokenBucket(params) => {
                ClientState::Word(Word::new(params.full_since(since_nanos)))
            }
            ClientParams::FixedWindow(params) => {
                ClientState::Word(Word::new(params.empty_since(since_nanos)))
            }
            ClientParams::SlidingWindowLog(params) => {
                ClientState::Ring(Box::new(LogRing::empty_since(params, since_nanos)))
            }
            ClientParams::SlidingWindowCounter(params) => {
                ClientState::Word(Word::new(params.empty_since(since_nanos)))
            }
        }
    }

    /// What a fresh state (as of `since_nanos`) would report, without keeping one, for a client
    /// the service does not hold: a peek, or with `zero_permits` an acquire of 0 permits.
    pub(crate) fn fresh_report(
        &self,
        zero_permits: bool,
        since_nanos: u64,
        clock: &impl Clock,
    ) -> Decision {
        // A ring is an allocation (up to 512 KiB), not to be made for a client that may never
        // come back; the one-word states cost nothing to make and ask.
        if let ClientParams::SlidingWindowLog(params) = self {
            return params.fresh_report(zero_permits, since_nanos, clock);
        }
        let state = self.fresh_state(since_nanos);
        if zero_permits {
            self.acquire(&state, 0, clock, true)
        } else {
            self.peek(&state, clock)
        }
    }

    /// Takes `n` permits from `state`. `count_remaining: false` lets the sliding log skip counting
    /// the permits left (an allowed decision then reports 0), for callers that only ask
    /// "allowed?".
    #[inline]
    pub(crate) fn acquire(
        &self,
        state: &ClientState,
        n: u64,
        clock: &impl Clock,
        count_remaining: bool,
    ) -> Decision {
        match (self, state) {
            (ClientParams::TokenBucket(params), ClientState::Word(word)) => {
                params.acquire(word, n, clock)
            }
            (ClientParams::FixedWindow(params), ClientState::Word(word)) => {
                params.acquire(word, n, clock)
            }
            (ClientParams::SlidingWindowLog(params), ClientState::Ring(ring)) => {
                params.acquire_counting(ring, n, clock, count_remaining)
            }
            (ClientParams::SlidingWindowCounter(params), ClientState::Word(word)) => {
                params.acquire(word, n, clock)
            }
            // A state of another method's shape: treat it as retired so the service replaces it.
            _ => Decision::retired(self.rule()),
        }
    }

    /// Takes one permit from `state`, answering only whether.
    #[inline]
    pub(crate) fn acquire_one(&self, state: &ClientState, clock: &impl Clock) -> Admit {
        match (self, state) {
            (ClientParams::TokenBucket(params), ClientState::Word(word)) => {
                params.acquire_one(word, clock)
            }
            (ClientParams::FixedWindow(params), ClientState::Word(word)) => {
                params.acquire_one(word, clock)
            }
            (ClientParams::SlidingWindowLog(params), ClientState::Ring(ring)) => {
                let decision = params.acquire_counting(ring, 1, clock, false);
                if decision.is_retired() {
                    Admit::Retired
                } else if decision.is_allowed() {
                    Admit::Granted
                } else {
                    Admit::Denied
                }
            }
            (ClientParams::SlidingWindowCounter(params), ClientState::Word(word)) => {
                params.acquire_one(word, clock)
            }
            _ => Admit::Retired,
        }
    }

    /// Gives back `n` permits that `granted` (an allowed decision from `state`, made at
    /// `now_nanos`) took. Exact for the one-word methods; `None` for a method that cannot give
    /// permits back (a plan with several limits refuses it when it is made).
    pub(crate) fn undo(
        &self,
        state: &ClientState,
        n: u64,
        granted: &Decision,
        now_nanos: u64,
    ) -> Option<()> {
        match (self, state) {
            (ClientParams::TokenBucket(params), ClientState::Word(word)) => {
                params.undo(word, n, granted, now_nanos);
                Some(())
            }
            (ClientParams::FixedWindow(params), ClientState::Word(word)) => {
                params.undo(word, n, granted, now_nanos);
                Some(())
            }
            (ClientParams::SlidingWindowCounter(params), ClientState::Word(word)) => {
                params.undo(word, n, granted, now_nanos);
                Some(())
            }
            _ => None,
        }
    }

    /// The clock reading by which the permits `granted` (an allowed decision, made at
    /// `now_nanos`) reports will all have left: its `reset_after`, counted from the reading as
    /// the method counts it (a reading before the method's origin counts as the origin).
    pub(crate) fn busy_until(&self, granted: &Decision, now_nanos: u64) -> u64 {
        let origin = match self {
            ClientParams::TokenBucket(params) => params.origin_nanos(),
            ClientParams::FixedWindow(params) => params.origin_nanos(),
            ClientParams::SlidingWindowCounter(params) => params.origin_nanos(),
            // Not among the methods a plan of several limits takes.
            ClientParams::SlidingWindowLog(_) => 0,
        };
        now_nanos
            .max(origin)
            .saturating_add(crate::clock::duration_to_nanos(granted.reset_after()))
    }

    /// Whether this method can give back permits it granted (see [`ClientParams::undo`]).
    pub(crate) fn can_undo(&self) -> bool {
        matches!(
            self,
            ClientParams::TokenBucket(_)
                | ClientParams::FixedWindow(_)
                | ClientParams::SlidingWindowCounter(_)
        )
    }

    /// What taking `n` permits from `state` now would answer, taking nothing.
    pub(crate) fn dry_run(&self, state: &ClientState, n: u64, clock: &impl Clock) -> Decision {
        match (self, state) {
            (ClientParams::TokenBucket(params), ClientState::Word(word)) => {
                params.dry_run(word, n, clock)
            }
            (ClientParams::FixedWindow(params), ClientState::Word(word)) => {
                params.dry_run(word, n, clock)
            }
            (ClientParams::SlidingWindowCounter(params), ClientState::Word(word)) => {
                params.dry_run(word, n, clock)
            }
            _ => self.peek(state, clock),
        }
    }

    #[inline]
    pub(crate) fn peek(&self, state: &ClientState, clock: &impl Clock) -> Decision {
        match (self, state) {
            (ClientParams::TokenBucket(params), ClientState::Word(word)) => {
                params.peek(word, clock)
            }
            (ClientParams::FixedWindow(params), ClientState::Word(word)) => {
                params.peek(word, clock)
            }
            (ClientParams::SlidingWindowLog(params), ClientState::Ring(ring)) => {
                params.peek(ring, clock)
            }
            (ClientParams::SlidingWindowCounter(params), ClientState::Word(word)) => {
                params.peek(word, clock)
            }
            _ => Decision::retired(self.rule()),
        }
    }

    /// Retires `state` whatever it holds, so that no acquire can succeed on it any more (for a
    /// client that moved to another plan or rule). `self` may be any plan's constants: only the
    /// method matters.
    pub(crate) fn retire_now(&self, state: &ClientState) {
        match (self, state) {
            (ClientParams::TokenBucket(_), ClientState::Word(word)) => {
                GcraParams::retire_now(word);
            }
            (ClientParams::FixedWindow(_), ClientState::Word(word)) => {
                WindowParams::retire_now(word);
            }
            (ClientParams::SlidingWindowCounter(_), ClientState::Word(word)) => {
                CounterParams::retire_now(word);
            }
            (_, ClientState::Ring(ring)) => {
                ring.retire(None);
            }
            (_, ClientState::Several(several)) => {
                several.retire_now();
            }
            // A one-word state under the log's constants cannot arise; nothing to retire.
            (ClientParams::SlidingWindowLog(_), ClientState::Word(_)) => {}
        }
    }

    /// Retires `state` if it is indistinguishable from a fresh one at `now_nanos`.
    pub(crate) fn retire_if_idle(&self, state: &ClientState, now_nanos: u64) -> bool {
        match (self, state) {
            (ClientParams::TokenBucket(params), ClientState::Word(word)) => {
                params.retire_if_full(word, now_nanos)
            }
            (ClientParams::FixedWindow(params), ClientState::Word(word)) => {
                params.retire_if_idle(word, now_nanos)
            }
            (ClientParams::SlidingWindowLog(params), ClientState::Ring(ring)) => {
                params.retire_if_idle(ring.as_ref(), now_nanos)
            }
            (ClientParams::SlidingWindowCounter(params), ClientState::Word(word)) => {
                params.retire_if_idle(word, now_nanos)
            }
            _ => false,
        }
    }
}
