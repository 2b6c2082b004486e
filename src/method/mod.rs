//! The methods' shared machinery. Each method keeps its state in atomics and decides with a pure
//! function of that state; what they share is written once here.
//!
//! - One file per method, each stating its guarantee: `token_bucket.rs` ([`TokenBucket`]),
//!   `fixed_window.rs` ([`FixedWindow`]), `sliding_window_log.rs` ([`SlidingWindowLog`]),
//!   `sliding_window_counter.rs` ([`SlidingWindowCounter`]).
//! - `word.rs`: the compare-and-swap loop every one-word method's decisions run through, and
//!   retiring a word for eviction.
//! - [`Method`] and `standalone_limiter!`: a method's constants deciding on its state, and the
//!   public limiter wrapped around them (state, constants and clock), written once for all.

pub(crate) mod fixed_window;
pub(crate) mod sliding_window_counter;
pub(crate) mod sliding_window_log;
pub(crate) mod token_bucket;
pub(crate) mod word;

#[cfg(doc)]
use crate::{FixedWindow, SlidingWindowCounter, SlidingWindowLog, TokenBucket};

use crate::clock::Clock;
use crate::decision::Decision;
use crate::rule::Rule;

/// A method's constants for one rule, deciding on one client's state: what the public limiters
/// and the service both run.
pub(crate) trait Method {
    /// One client's state (an atomic word, or a ring of them).
    type State;

    /// Takes `n` permits from `state` if all are available now (see
    /// [`Limiter::try_acquire_n`](crate::Limiter::try_acquire_n)).
    fn acquire(&self, state: &Self::State, n: u64, clock: &impl Clock) -> Decision;

    /// Takes one permit if one is available now, answering only whether.
    fn try_acquire(&self, state: &Self::State, clock: &impl Clock) -> bool;

    /// What one permit would get now, taking nothing.
    fn peek(&self, state: &Self::State, clock: &impl Clock) -> Decision;

    /// The rule these constants enforce.
    fn rule(&self) -> Rule;
}

/// The public limiter's accessors and its [`Limiter`](crate::Limiter) impl, for a struct with
/// fields `state` (the method's state on its own cache line), `params` (a [`Method`]) and
/// `clock`.
macro_rules! standalone_limiter {
    ($limiter:ident) => {
        impl<C: $crate::Clock> $limiter<C> {
            /// The clock this limiter reads.
            pub fn clock(&self) -> &C {
                &self.clock
            }
        }

        impl<C: $crate::Clock> $crate::Limiter for $limiter<C> {
            #[inline]
            fn try_acquire(&self) -> bool {
                $crate::method::Method::try_acquire(&self.params, &self.state, &self.clock)
            }

            #[inline]
            fn try_acquire_n(&self, n: u64) -> $crate::Decision {
                $crate::method::Method::acquire(&self.params, &self.state, n, &self.clock)
            }

            #[inline]
            fn peek(&self) -> $crate::Decision {
                $crate::method::Method::peek(&self.params, &self.state, &self.clock)
            }

            fn rule(&self) -> $crate::Rule {
                $crate::method::Method::rule(&self.params)
            }
        }
    };
}
pub(crate) use standalone_limiter;

/// The [`Method`] impl of a one-word method's constants, whose state is one atomic word on its
/// own cache line, from their inherent `acquire`, `acquire_one`, `peek` and `rule` field.
macro_rules! one_word_method {
    ($params:ty) => {
        impl $crate::method::Method for $params {
            type State = crossbeam_utils::CachePadded<$crate::sync::Word>;

            #[inline]
            fn acquire(
                &self,
                state: &Self::State,
                n: u64,
                clock: &impl $crate::Clock,
            ) -> $crate::Decision {
                <$params>::acquire(self, &**state, n, clock)
            }

            #[inline]
            fn try_acquire(&self, state: &Self::State, clock: &impl $crate::Clock) -> bool {
                self.acquire_one(&**state, clock) == $crate::decision::Admit::Granted
            }

            #[inline]
            fn peek(&self, state: &Self::State, clock: &impl $crate::Clock) -> $crate::Decision {
                <$params>::peek(self, &**state, clock)
            }

            fn rule(&self) -> $crate::Rule {
                self.rule
            }
        }
    };
}
pub(crate) use one_word_method;

/// Every method, once: its `Algorithm` variant (also the name of its public limiter) and its
/// constants' type. The service's dispatch (`ClientParams`) and `AnyLimiter` are both expanded
/// from this list by `$callback`, so a new method is its file, its `Algorithm` variant and one
/// line here.
macro_rules! for_each_method {
    ($callback:ident) => {
        $callback! {
            TokenBucket($crate::method::token_bucket::GcraParams),
            FixedWindow($crate::method::fixed_window::WindowParams),
            SlidingWindowLog($crate::method::sliding_window_log::LogParams),
            SlidingWindowCounter($crate::method::sliding_window_counter::CounterParams),
        }
    };
}
pub(crate) use for_each_method;

/// The [`ServiceMethod`](crate::service::client_state::ServiceMethod) impl of a one-word
/// method's constants (state `ClientState::Word`), from their inherent functions: `$fresh`
/// makes the word of a fresh client as of an instant, `$idle` retires a word that is as fresh.
macro_rules! one_word_service_method {
    ($params:ty, fresh: $fresh:ident, idle: $idle:ident) => {
        impl $crate::service::client_state::ServiceMethod for $params {
            const CAN_UNDO: bool = true;

            fn new_for(rule: $crate::Rule, start_nanos: u64) -> Result<Self, $crate::RuleError> {
                Ok(<$params>::new(rule)?.starting_at(start_nanos))
            }

            #[inline]
            fn rule(&self) -> $crate::Rule {
                self.rule
            }

            fn origin_nanos(&self) -> u64 {
                self.origin_nanos
            }

            fn fresh_state(&self, since_nanos: u64) -> $crate::service::client_state::ClientState {
                $crate::service::client_state::ClientState::Word(
                    0,
                    $crate::sync::Word::new(<$params>::$fresh(self, since_nanos)),
                )
            }

            #[inline]
            fn acquire(
                &self,
                state: &$crate::service::client_state::ClientState,
                n: u64,
                clock: &impl $crate::Clock,
            ) -> $crate::Decision {
                state.word().map_or_else(
                    || $crate::Decision::retired(self.rule),
                    |word| <$params>::acquire(self, word, n, clock),
                )
            }

            #[inline]
            fn acquire_one(
                &self,
                state: &$crate::service::client_state::ClientState,
                clock: &impl $crate::Clock,
            ) -> $crate::decision::Admit {
                match state.word() {
                    Some(word) => <$params>::acquire_one(self, word, clock),
                    None => $crate::decision::Admit::Retired,
                }
            }

            #[inline]
            fn peek(
                &self,
                state: &$crate::service::client_state::ClientState,
                clock: &impl $crate::Clock,
            ) -> $crate::Decision {
                state.word().map_or_else(
                    || $crate::Decision::retired(self.rule),
                    |word| <$params>::peek(self, word, clock),
                )
            }

            fn retire_now(&self, state: &$crate::service::client_state::ClientState) {
                if let Some(word) = state.word() {
                    <$params>::retire_now(word);
                }
            }

            fn retire_if_idle(
                &self,
                state: &$crate::service::client_state::ClientState,
                now_nanos: u64,
            ) -> bool {
                state
                    .word()
                    .is_some_and(|word| <$params>::$idle(self, word, now_nanos))
            }

            #[inline]
            fn reserve(
                &self,
                state: &$crate::service::client_state::ClientState,
                n: u64,
                clock: &impl $crate::Clock,
            ) -> ($crate::Decision, Option<$crate::method::word::Reservation>) {
                match state.word() {
                    Some(word) => <$params>::reserve(self, word, n, clock),
                    None => ($crate::Decision::retired(self.rule), None),
                }
            }

            fn undo(
                &self,
                state: &$crate::service::client_state::ClientState,
                n: u64,
                granted: &$crate::Decision,
                reservation: $crate::method::word::Reservation,
                now_nanos: u64,
            ) -> Option<()> {
                state
                    .word()
                    .map(|word| <$params>::undo(self, word, n, granted, reservation, now_nanos))
            }

            fn dry_run(
                &self,
                state: &$crate::service::client_state::ClientState,
                n: u64,
                clock: &impl $crate::Clock,
            ) -> $crate::Decision {
                state.word().map_or_else(
                    || $crate::Decision::retired(self.rule),
                    |word| <$params>::dry_run(self, word, n, clock),
                )
            }
        }
    };
}
pub(crate) use one_word_service_method;
