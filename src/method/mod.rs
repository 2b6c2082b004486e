//! The methods, and one client's state under them: everything a decision needs, below the
//! service and unaware of it.
//!
//! - One file per method, each stating its guarantee and writing out its [`Method`] impl:
//!   `token_bucket.rs` ([`TokenBucket`]), `fixed_window.rs` ([`FixedWindow`]),
//!   `sliding_window_log/` ([`SlidingWindowLog`]), `sliding_window_counter.rs`
//!   ([`SlidingWindowCounter`]).
//! - `word.rs`: the compare-and-swap loop every one-word method's decisions run through, the
//!   reservation that undoes a grant, and retiring a word for eviction.
//! - `standalone.rs`: the public limiters' common body (a method's state, its constants, a
//!   clock).
//! - `any.rs` ([`AnyParams`](any::AnyParams)): one limit's constants of whichever method a
//!   setting names, deciding on a client's state of any shape (`client_state.rs`), and
//!   `several_limits.rs`: a plan of several limits, all or nothing. The service stores and finds
//!   these states; it never looks inside them.

pub(crate) mod any;
pub(crate) mod client_state;
pub(crate) mod fixed_window;
pub(crate) mod several_limits;
pub(crate) mod sliding_window_counter;
pub(crate) mod sliding_window_log;
pub(crate) mod standalone;
pub(crate) mod token_bucket;
pub(crate) mod word;

#[cfg(doc)]
use crate::{FixedWindow, SlidingWindowCounter, SlidingWindowLog, TokenBucket};

use crate::clock::Clock;
use crate::decision::{Admit, Decision, Retired};
use crate::error::RuleError;
use crate::rule::Rule;
use crate::sync::{AtomicWord, OwnedWord, Word};
use word::Reservation;

/// A method: its constants for one rule, deciding on one client's state. Each method's file
/// writes out its impl, the method's whole logic; the public limiters (`standalone.rs`) and the
/// service's dispatch (`any.rs`) both run it, on the crate's atomic word, and the `loom`
/// feature's models run the very same impl on loom's.
///
/// A decision on a state that has been retired (by a service's sweep or a rule change) answers
/// `Err(Retired)`, and the caller moves to a fresh state; a public limiter's state is never
/// retired.
// Public (and hidden) only for the `loom` feature's re-exports.
#[doc(hidden)]
#[cfg_attr(not(feature = "loom"), allow(unreachable_pub))]
pub trait Method: Copy + Sized {
    /// One client's state over the atomic word `A`: the word itself, or a ring of them.
    type State<A: AtomicWord>: std::fmt::Debug + Send + Sync;

    /// Whether the method can undo a grant (see [`Method::undo`]).
    const CAN_UNDO: bool;

    /// The constants of `rule`, with a timeline that starts at the clock reading `start_nanos`,
    /// or why the method cannot honour the rule.
    fn new(rule: Rule, start_nanos: u64) -> Result<Self, RuleError>;

    /// The rule these constants enforce.
    fn rule(&self) -> Rule;

    /// The clock reading the method's timeline starts at.
    fn origin_nanos(&self) -> u64;

    /// The state of a client that has taken nothing yet, as of `since_nanos`: identical to a
    /// fresh one for any reading from then on, and stricter for earlier readings, so that it is
    /// at least as strict as any state retired as idle at or before `since_nanos`.
    fn fresh<A: OwnedWord>(&self, since_nanos: u64) -> Self::State<A>;

    /// What a fresh state (as of `since_nanos`) would report, without keeping one: a peek, or
    /// with `zero_permits` an acquire of 0 permits.
    fn fresh_report(&self, zero_permits: bool, since_nanos: u64, clock: &impl Clock) -> Decision {
        let state = self.fresh::<Word>(since_nanos);
        let report = if zero_permits {
            self.acquire(&state, 0, clock)
        } else {
            self.peek(&state, clock)
        };
        never_retired(report)
    }

    /// Takes `n` permits from `state` if all are available now (see
    /// [`Limiter::try_acquire_n`](crate::Limiter::try_acquire_n)).
    fn acquire<A: AtomicWord>(
        &self,
        state: &Self::State<A>,
        n: u64,
        clock: &impl Clock,
    ) -> Result<Decision, Retired>;

    /// Takes one permit if one is available now, answering only whether.
    fn acquire_one<A: AtomicWord>(
        &self,
        state: &Self::State<A>,
        clock: &impl Clock,
    ) -> Result<Admit, Retired>;

    /// One permit, as `acquire` takes it, for a caller that reports refusals only: a grant is
    /// answered `granted()`, with no figures (none is counted where counting costs work, as the
    /// sliding log's search of its ring does), and a refusal `refused(decision)`, with the whole
    /// decision `acquire` would give. Once inlined, a grant builds no [`Decision`].
    #[cfg(feature = "tower")]
    #[inline]
    fn acquire_one_quiet<A: AtomicWord, T>(
        &self,
        state: &Self::State<A>,
        clock: &impl Clock,
        granted: impl Fn() -> T,
        refused: impl Fn(Decision) -> T,
    ) -> Result<T, Retired> {
        Ok(quiet(self.acquire(state, 1, clock)?, granted, refused))
    }

    /// What one permit would get now, taking nothing.
    fn peek<A: AtomicWord>(
        &self,
        state: &Self::State<A>,
        clock: &impl Clock,
    ) -> Result<Decision, Retired>;

    /// What taking `n` permits now would answer, taking nothing.
    fn dry_run<A: AtomicWord>(
        &self,
        state: &Self::State<A>,
        n: u64,
        clock: &impl Clock,
    ) -> Result<Decision, Retired>;

    /// Whether taking permits from `state` at the clock's reading would move it into a later
    /// window than the one it holds: a write that an undo cannot take back once another
    /// decision has landed on it, which is why a plan of several limits takes such limits last
    /// (see `SeveralLimits::acquire`). False for a method without windows.
    fn would_roll<A: AtomicWord>(&self, state: &Self::State<A>, clock: &impl Clock) -> bool {
        let _ = (state, clock);
        false
    }

    /// [`Method::acquire`], also returning what a grant changed, for [`Method::undo`]; `None`
    /// beside a grant for a method that cannot undo one.
    fn reserve<A: AtomicWord>(
        &self,
        state: &Self::State<A>,
        n: u64,
        clock: &impl Clock,
    ) -> Result<(Decision, Option<Reservation>), Retired> {
        Ok((self.acquire(state, n, clock)?, None))
    }

    /// Undoes the grant of `n` permits that made `reservation` (`granted` its decision, made at
    /// `now_nanos`): exactly while no other decision has landed on the state since, and never
    /// by more than the grant took. Nothing for a method that cannot.
    fn undo<A: AtomicWord>(
        &self,
        state: &Self::State<A>,
        n: u64,
        granted: &Decision,
        reservation: Reservation,
        now_nanos: u64,
    ) {
        let _ = (state, n, granted, reservation, now_nanos);
    }

    /// Gives `n` permits back to `state` at the clock's reading: a refund of permits taken
    /// earlier (Envoy's `is_negative_hits`), never past what the method still counts, so that
    /// the state never becomes more generous than a fresh one. Nothing on a retired state
    /// (whatever it counted left with it), nor for a method that cannot (the sliding log,
    /// whose slots record admissions).
    #[cfg_attr(not(feature = "envoy"), allow(dead_code))]
    fn refund<A: AtomicWord>(&self, state: &Self::State<A>, n: u64, clock: &impl Clock) {
        let _ = (state, n, clock);
    }

    /// Retires `state` whatever it holds, so that no acquire succeeds on it any more. Returns
    /// whether this call did it (false if it already was).
    fn retire_now<A: AtomicWord>(&self, state: &Self::State<A>) -> bool;

    /// Retires `state` if it is indistinguishable from a fresh one at `now_nanos`; returns
    /// whether it did.
    fn retire_if_idle<A: AtomicWord>(&self, state: &Self::State<A>, now_nanos: u64) -> bool;
}

/// A quiet answer ([`Method::acquire_one_quiet`]) made from a whole `decision`: `granted()` for
/// a grant, whose figures go unread, and `refused(decision)` for a refusal.
#[cfg(feature = "tower")]
#[inline]
pub(crate) fn quiet<T>(
    decision: Decision,
    granted: impl FnOnce() -> T,
    refused: impl FnOnce(Decision) -> T,
) -> T {
    if decision.is_allowed() {
        granted()
    } else {
        refused(decision)
    }
}

/// The answer of a state that no one retires: a public limiter's (only a service's sweep or
/// rule change retires states, and only its own), or a fresh one made for a single report.
#[inline(always)]
pub(crate) fn never_retired<T>(answer: Result<T, Retired>) -> T {
    match answer {
        Ok(answer) => answer,
        Err(Retired) => unreachable!("a state that nothing retires answered as retired"),
    }
}
