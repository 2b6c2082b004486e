//! The body every public limiter shares: one client's state on its own cache line, the
//! method's constants and a clock; and the one [`Limiter`] impl every public limiter gets, by
//! exposing its body (see [`Wraps`]).

use crossbeam_utils::CachePadded;

use super::{Method, never_retired};
use crate::clock::Clock;
use crate::decision::{Admit, Decision};
use crate::error::RuleError;
use crate::limiter::Limiter;
use crate::rule::Rule;
use crate::sync::Word;

/// A method's state, its constants and its clock.
#[derive(Debug)]
pub(crate) struct Standalone<M: Method, C> {
    /// On its own cache line, so that limiters allocated side by side do not share one.
    state: CachePadded<M::State<Word>>,
    params: M,
    clock: C,
}

impl<M: Method, C: Clock> Standalone<M, C> {
    /// A fresh limiter for `rule` whose timeline starts at the clock's reading now.
    pub(crate) fn new(rule: Rule, clock: C) -> Result<Self, RuleError> {
        let params = M::new(rule, clock.now_nanos())?;
        Ok(Standalone {
            // Fresh from the timeline's start: nothing granted, for any reading.
            state: CachePadded::new(params.fresh(0)),
            params,
            clock,
        })
    }

    /// The method's constants.
    pub(crate) fn params(&self) -> &M {
        &self.params
    }

    /// The clock this limiter reads.
    pub(crate) fn clock(&self) -> &C {
        &self.clock
    }
}

/// A public limiter: one method's [`Standalone`] body under a name of its own. Implementing it
/// is all a public limiter type does to get [`Limiter`]. Crate-private, so no other type can.
pub(crate) trait Wraps {
    /// The method the limiter runs.
    type Method: Method;
    /// The clock it reads.
    type Clock: Clock;
    /// Its body.
    fn standalone(&self) -> &Standalone<Self::Method, Self::Clock>;
}

// A standalone state is never retired: nothing retires it (see `never_retired`).
impl<L: Wraps> Limiter for L {
    #[inline]
    fn try_acquire(&self) -> bool {
        let Standalone {
            state,
            params,
            clock,
        } = self.standalone();
        let answer = params.acquire_one::<Word>(state, clock);
        debug_assert!(
            answer.is_ok(),
            "a state that nothing retires answered as retired"
        );
        // Compared whole rather than through `never_retired`: a retired state would take no
        // permit either, so a method that tells retired from denied only on its denying path
        // (as the token bucket does) pays nothing for it here.
        answer == Ok(Admit::Granted)
    }

    #[inline]
    fn try_acquire_n(&self, n: u64) -> Decision {
        let Standalone {
            state,
            params,
            clock,
        } = self.standalone();
        never_retired(params.acquire::<Word>(state, n, clock))
    }

    #[inline]
    fn peek(&self) -> Decision {
        let Standalone {
            state,
            params,
            clock,
        } = self.standalone();
        never_retired(params.peek::<Word>(state, clock))
    }

    fn rule(&self) -> Rule {
        self.standalone().params.rule()
    }
}
