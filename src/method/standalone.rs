//! The body every public limiter shares: one client's state on its own cache line, the
//! method's constants and a clock. Each public type wraps one and writes out its
//! [`Limiter`](crate::Limiter) impl, so that a reader of a method's file sees all of it.

use crossbeam_utils::CachePadded;

use super::Method;
use crate::clock::Clock;
use crate::decision::{Admit, Decision};
use crate::error::RuleError;
use crate::rule::Rule;

/// A method's state, its constants and its clock.
#[derive(Debug)]
pub(crate) struct Standalone<M: Method, C> {
    /// On its own cache line, so that limiters allocated side by side do not share one.
    state: CachePadded<M::State>,
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

    /// See [`Limiter::try_acquire`](crate::Limiter::try_acquire).
    #[inline]
    pub(crate) fn try_acquire(&self) -> bool {
        self.params.acquire_one(&self.state, &self.clock) == Admit::Granted
    }

    /// See [`Limiter::try_acquire_n`](crate::Limiter::try_acquire_n).
    #[inline]
    pub(crate) fn try_acquire_n(&self, n: u64) -> Decision {
        self.params.acquire(&self.state, n, &self.clock)
    }

    /// See [`Limiter::peek`](crate::Limiter::peek).
    #[inline]
    pub(crate) fn peek(&self) -> Decision {
        self.params.peek(&self.state, &self.clock)
    }

    /// See [`Limiter::rule`](crate::Limiter::rule).
    pub(crate) fn rule(&self) -> Rule {
        self.params.rule()
    }
}
