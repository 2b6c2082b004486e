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
use crate::method::for_each_method;
use crate::method::sliding_window_log::LogRing;
use crate::method::word::Reservation;
use crate::sync::Word;
use crate::{Algorithm, Decision, Rule};

/// The version of a plan's limits that a client's state was made under (see `PlanTable`).
///
/// 32 bits, so that it sits beside [`ClientState`]'s tag: a one-word state takes 16 bytes, and a
/// service entry with a `u64` key 24, the allocator's smallest chunk. The plan table refuses a
/// change that would take a plan past `Version::MAX`.
pub(crate) type Version = u32;

/// One client's state, and the version of its plan's limits it was made under (0 for the
/// per-limit states inside [`ClientState::Several`], whose own version is the one that counts).
#[derive(Debug)]
pub(crate) enum ClientState {
    /// The token bucket's TAT, or the fixed window's or the sliding window counter's packed word.
    Word(Version, Word),
    /// The sliding log's ring; boxed so that the one-word methods' entries stay small.
    Ring(Version, Box<LogRing<Word>>),
    /// One state per limit of a plan with several (see `SeveralLimits`).
    Several(Version, Box<SeveralLimits>),
}

// Where 64-bit atomics are native words, a one-word client's state is two words: the version
// sits beside the tag (see `Version`). Checked here, since an entry's size is its memory cost.
#[cfg(target_has_atomic = "64")]
const _: () = assert!(size_of::<ClientState>() == 16);

impl ClientState {
    /// The version of its plan's limits this state was made under.
    #[inline]
    pub(crate) fn version(&self) -> Version {
        match self {
            ClientState::Word(version, _)
            | ClientState::Ring(version, _)
            | ClientState::Several(version, _) => *version,
        }
    }

    /// The state's word, for the one-word methods (`None` for a state of another shape, which
    /// such a method answers as retired).
    #[inline]
    pub(crate) fn word(&self) -> Option<&Word> {
        match self {
            ClientState::Word(_, word) => Some(word),
            _ => None,
        }
    }

    /// This state, marked as made under `version`.
    pub(crate) fn made_under(mut self, version: Version) -> ClientState {
        match &mut self {
            ClientState::Word(made_under, _)
            | ClientState::Ring(made_under, _)
            | ClientState::Several(made_under, _) => *made_under = version,
        }
        self
    }
}

/// What the service needs of a method's constants, on a client's state of any shape: each
/// method implements it in its own file, and [`ClientParams`] dispatches to it.
pub(crate) trait ServiceMethod: Copy + Sized {
    /// Whether the method can give back permits it granted (see [`ServiceMethod::undo`]).
    const CAN_UNDO: bool;

    /// The constants of `rule`, with a timeline that starts at the clock reading `start_nanos`
    /// (the service's start), or why the method cannot honour the rule.
    fn new_for(rule: Rule, start_nanos: u64) -> Result<Self, RuleError>;

    /// The rule these constants enforce.
    fn rule(&self) -> Rule;

    /// The clock reading the method's timeline starts at.
    fn origin_nanos(&self) -> u64;

    /// The state of a client that has taken nothing yet, as of `since_nanos`: identical to a
    /// fresh one for any reading from then on, and stricter for earlier readings, so that it is
    /// at least as strict as any state retired as idle at or before `since_nanos`.
    fn fresh_state(&self, since_nanos: u64) -> ClientState;

    /// What a fresh state (as of `since_nanos`) would report, without keeping one: a peek, or
    /// with `zero_permits` an acquire of 0 permits.
    fn fresh_report(&self, zero_permits: bool, since_nanos: u64, clock: &impl Clock) -> Decision {
        let state = self.fresh_state(since_nanos);
        if zero_permits {
            self.acquire(&state, 0, clock)
        } else {
            self.peek(&state, clock)
        }
    }

    /// Takes `n` permits from `state` (a state of another shape answers as retired, so the
    /// service replaces it).
    fn acquire(&self, state: &ClientState, n: u64, clock: &impl Clock) -> Decision;

    /// Takes one permit from `state`, answering only whether.
    fn acquire_one(&self, state: &ClientState, clock: &impl Clock) -> Admit;

    /// One permit, as `acquire` takes it, except that an allowed decision may report 0
    /// permits left where counting them costs more than the decision (the sliding log's search
    /// of its ring): for callers that send no remaining count.
    #[cfg(feature = "tower")]
    fn acquire_one_uncounted(&self, state: &ClientState, clock: &impl Clock) -> Decision {
        self.acquire(state, 1, clock)
    }

    /// What one permit would get now, taking nothing.
    fn peek(&self, state: &ClientState, clock: &impl Clock) -> Decision;

    /// Retires `state` whatever it holds.
    fn retire_now(&self, state: &ClientState);

    /// Retires `state` if it is indistinguishable from a fresh one at `now_nanos`.
    fn retire_if_idle(&self, state: &ClientState, now_nanos: u64) -> bool;

    /// Takes `n` permits from `state`, as `acquire` does, also returning what a grant changed
    /// (for [`ServiceMethod::undo`]); `None` beside a grant for a method that cannot give back.
    fn reserve(
        &self,
        state: &ClientState,
        n: u64,
        clock: &impl Clock,
    ) -> (Decision, Option<Reservation>) {
        (self.acquire(state, n, clock), None)
    }

    /// Undoes the grant of `n` permits that made `reservation` (`granted` its decision from
    /// `state`, made at `now_nanos`); `None` for a method that cannot.
    fn undo(
        &self,
        state: &ClientState,
        n: u64,
        granted: &Decision,
        reservation: Reservation,
        now_nanos: u64,
    ) -> Option<()> {
        let _ = (state, n, granted, reservation, now_nanos);
        None
    }

    /// What taking `n` permits from `state` now would answer, taking nothing.
    fn dry_run(&self, state: &ClientState, n: u64, clock: &impl Clock) -> Decision {
        let _ = n;
        self.peek(state, clock)
    }
}

/// `ClientParams`, one variant per method of [`for_each_method`], each call dispatched to the
/// method's [`ServiceMethod`] impl.
macro_rules! client_params {
    ($($method:ident($params:ty)),* $(,)?) => {
        /// One plan's constants, for the service's method.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum ClientParams {
            $($method($params)),*
        }

        impl ClientParams {
            /// The constants of `rule` for `algorithm`, with a timeline that starts at the
            /// clock reading `start_nanos` (the service's start), or why the method cannot
            /// honour the rule.
            pub(crate) fn new(
                algorithm: Algorithm,
                rule: Rule,
                start_nanos: u64,
            ) -> Result<ClientParams, RuleError> {
                Ok(match algorithm {
                    $(Algorithm::$method => ClientParams::$method(
                        <$params as ServiceMethod>::new_for(rule, start_nanos)?,
                    ),)*
                })
            }

            /// The method these constants are for.
            pub(crate) fn algorithm(&self) -> Algorithm {
                match self {
                    $(ClientParams::$method(_) => Algorithm::$method,)*
                }
            }

            pub(crate) fn rule(&self) -> Rule {
                match self {
                    $(ClientParams::$method(params) => ServiceMethod::rule(params),)*
                }
            }

            /// See [`ServiceMethod::fresh_state`].
            pub(crate) fn fresh_state(&self, since_nanos: u64) -> ClientState {
                match self {
                    $(ClientParams::$method(params) => params.fresh_state(since_nanos),)*
                }
            }

            /// See [`ServiceMethod::fresh_report`].
            pub(crate) fn fresh_report(
                &self,
                zero_permits: bool,
                since_nanos: u64,
                clock: &impl Clock,
            ) -> Decision {
                match self {
                    $(ClientParams::$method(params) => {
                        ServiceMethod::fresh_report(params, zero_permits, since_nanos, clock)
                    })*
                }
            }

            /// Takes `n` permits from `state`.
            #[inline]
            pub(crate) fn acquire(&self, state: &ClientState, n: u64, clock: &impl Clock) -> Decision {
                match self {
                    $(ClientParams::$method(params) => {
                        ServiceMethod::acquire(params, state, n, clock)
                    })*
                }
            }

            /// Takes one permit from `state`, answering only whether.
            #[inline(always)]
            pub(crate) fn acquire_one(&self, state: &ClientState, clock: &impl Clock) -> Admit {
                match self {
                    $(ClientParams::$method(params) => {
                        ServiceMethod::acquire_one(params, state, clock)
                    })*
                }
            }

            /// See [`ServiceMethod::acquire_one_uncounted`].
            #[cfg(feature = "tower")]
            pub(crate) fn acquire_one_uncounted(
                &self,
                state: &ClientState,
                clock: &impl Clock,
            ) -> Decision {
                match self {
                    $(ClientParams::$method(params) => {
                        ServiceMethod::acquire_one_uncounted(params, state, clock)
                    })*
                }
            }

            /// See [`ServiceMethod::reserve`].
            #[inline]
            pub(crate) fn reserve(
                &self,
                state: &ClientState,
                n: u64,
                clock: &impl Clock,
            ) -> (Decision, Option<Reservation>) {
                match self {
                    $(ClientParams::$method(params) => {
                        ServiceMethod::reserve(params, state, n, clock)
                    })*
                }
            }

            /// Undoes the grant that made `reservation` (see [`ServiceMethod::undo`]); `None`
            /// for a method that cannot give permits back (a plan with several limits refuses
            /// it when it is made).
            pub(crate) fn undo(
                &self,
                state: &ClientState,
                n: u64,
                granted: &Decision,
                reservation: Reservation,
                now_nanos: u64,
            ) -> Option<()> {
                match self {
                    $(ClientParams::$method(params) => {
                        ServiceMethod::undo(params, state, n, granted, reservation, now_nanos)
                    })*
                }
            }

            /// The clock reading by which the permits `granted` (an allowed decision, made at
            /// `now_nanos`) reports will all have left: its `reset_after`, counted from the
            /// reading as the method counts it (a reading before the method's origin counts as
            /// the origin).
            pub(crate) fn busy_until(&self, granted: &Decision, now_nanos: u64) -> u64 {
                let origin = match self {
                    $(ClientParams::$method(params) => ServiceMethod::origin_nanos(params),)*
                };
                now_nanos
                    .max(origin)
                    .saturating_add(crate::clock::duration_to_nanos(granted.reset_after()))
            }

            /// Whether this method can give back permits it granted.
            pub(crate) fn can_undo(&self) -> bool {
                match self {
                    $(ClientParams::$method(_) => <$params as ServiceMethod>::CAN_UNDO,)*
                }
            }

            /// What taking `n` permits from `state` now would answer, taking nothing.
            pub(crate) fn dry_run(&self, state: &ClientState, n: u64, clock: &impl Clock) -> Decision {
                match self {
                    $(ClientParams::$method(params) => {
                        ServiceMethod::dry_run(params, state, n, clock)
                    })*
                }
            }

            /// What one permit would get now from `state`, taking nothing.
            #[inline]
            pub(crate) fn peek(&self, state: &ClientState, clock: &impl Clock) -> Decision {
                match self {
                    $(ClientParams::$method(params) => ServiceMethod::peek(params, state, clock),)*
                }
            }

            /// Retires `state` whatever it holds, so that no acquire can succeed on it any more
            /// (for a client that moved to another plan or rule).
            pub(crate) fn retire_now(&self, state: &ClientState) {
                if let ClientState::Several(_, several) = state {
                    several.retire_now();
                    return;
                }
                match self {
                    $(ClientParams::$method(params) => ServiceMethod::retire_now(params, state),)*
                }
            }

            /// Retires `state` if it is indistinguishable from a fresh one at `now_nanos`.
            pub(crate) fn retire_if_idle(&self, state: &ClientState, now_nanos: u64) -> bool {
                match self {
                    $(ClientParams::$method(params) => {
                        ServiceMethod::retire_if_idle(params, state, now_nanos)
                    })*
                }
            }
        }
    };
}

for_each_method!(client_params);
