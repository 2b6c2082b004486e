//! What every one-word method shares: the compare-and-swap loop its decisions run through, and
//! retiring the word for eviction.
//!
//! A one-word method decides with a pure step, `current word -> answer, and the word to store if
//! it must change`; [`update`] runs that step against the atomic word until its exchange lands
//! (or the step answers without a write). Every decision, grant, give-back and retirement of the
//! token bucket, the fixed window and the sliding window counter goes through it. A grant made
//! for a plan of several limits also returns its [`Reservation`], which undoes it exactly while
//! nothing else has touched the word.

// `Reservation` is public only for the `loom` feature's models.
#![cfg_attr(not(feature = "loom"), allow(unreachable_pub))]

use crossbeam_utils::Backoff;

use crate::decision::{Decision, Retired};
use crate::sync::{AtomicWord, Ordering};

/// The ordering of a retiring exchange. Release: a service writes the instant it retired at
/// before retiring, and an acquirer that meets the retired word (and then an Acquire fence) must
/// see it when it makes the replacement (see `RateLimiterService::sweep`).
pub(crate) const RETIRE_ORDERING: Ordering = Ordering::Release;

/// What one step of a decision says about the word it read.
pub(crate) enum Step<T> {
    /// The answer, with nothing to write (a denial, a look, a retired word).
    Answer(T),
    /// The answer, if this word replaces the one read.
    Store(u64, T),
}

/// Runs `step` on `word`, starting from `current` (a load the caller already made), until it
/// answers without a write or its write lands; a failed exchange runs it again on the word it
/// found.
///
/// Relaxed, for every access: each method's decision depends on its one word only, and
/// read-modify-writes of one word are totally ordered, so no two grants can both see the same
/// word. No other memory is published through it.
// Always inlined: a CAS loop around its caller's step; called out of line, the lookup of a known
// client passed its state through memory (about 30 instructions in the default release profile).
#[inline(always)]
pub(crate) fn update<A: AtomicWord, T>(
    word: &A,
    mut current: u64,
    mut step: impl FnMut(u64) -> Step<T>,
) -> T {
    let backoff = Backoff::new();
    loop {
        match step(current) {
            Step::Answer(answer) => return answer,
            Step::Store(new, answer) => {
                match word.compare_exchange_weak(current, new, Ordering::Relaxed, Ordering::Relaxed)
                {
                    Ok(_) => return answer,
                    Err(actual) => current = actual,
                }
            }
        }
        backoff.spin();
    }
}

/// What a grant changed on its word: the word it replaced and the word it stored. While the
/// word still holds what the grant stored, no other decision has landed since (or every one that
/// did has been given back), and storing the replaced word again undoes the grant exactly: for
/// every reading, the state answers as if the grant had never been made.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    before: u64,
    after: u64,
}

impl Reservation {
    /// The word the grant replaced (for the loom models' negative controls, which restore it
    /// without checking).
    #[cfg(feature = "loom")]
    pub fn before(&self) -> u64 {
        self.before
    }
}

/// A decision on `word` from `decide` (the pure step: the answer, and the word to store if it
/// must change), run until its write lands; a retired word (`is_retired`) answers `Retired`.
/// Returns the decision, and what a write changed (see [`Reservation`]).
#[inline]
pub(crate) fn decide<A: AtomicWord>(
    word: &A,
    current: u64,
    is_retired: impl Fn(u64) -> bool,
    decide: impl Fn(u64) -> (Decision, Option<u64>),
) -> Result<(Decision, Option<Reservation>), Retired> {
    update(word, current, |current| {
        if is_retired(current) {
            return Step::Answer(Err(Retired));
        }
        match decide(current) {
            (decision, Some(after)) => {
                let reservation = Reservation {
                    before: current,
                    after,
                };
                Step::Store(after, Ok((decision, Some(reservation))))
            }
            (decision, None) => Step::Answer(Ok((decision, None))),
        }
    })
}

/// Undoes the grant that made `reservation`, if the word still holds what it stored; returns
/// whether it did. One strong exchange: it fails only when another decision (or a retirement)
/// has changed the word since, and then the caller's give-back must leave that one's effect.
#[inline]
pub(crate) fn restore<A: AtomicWord>(word: &A, reservation: Reservation) -> bool {
    // Relaxed: as every access to a method's word (see `update`).
    word.compare_exchange(
        reservation.after,
        reservation.before,
        Ordering::Relaxed,
        Ordering::Relaxed,
    )
    .is_ok()
}

/// What one permit would get now from `word`, taking nothing: `decide(word, n)` for `n = 0`
/// (the permits available) when one is, for `n = 1` (the wait) when none is; `Retired` for a
/// retired word.
#[inline]
pub(crate) fn peek<A: AtomicWord>(
    word: &A,
    is_retired: impl Fn(u64) -> bool,
    decide: impl Fn(u64, u64) -> Decision,
) -> Result<Decision, Retired> {
    // Relaxed: a snapshot of one word.
    let current = word.load(Ordering::Relaxed);
    if is_retired(current) {
        return Err(Retired);
    }
    let available = decide(current, 0);
    let one = decide(current, 1);
    Ok(if one.is_allowed() { available } else { one })
}

/// Retires `word` whatever it holds: `retired` gives the retired form of a live word, `None`
/// for one retired already. Returns the live word this call retired (`None` if it already was).
pub(crate) fn retire_now<A: AtomicWord>(
    word: &A,
    retired: impl Fn(u64) -> Option<u64>,
) -> Option<u64> {
    // Relaxed load: the exchange below decides.
    let mut current = word.load(Ordering::Relaxed);
    while let Some(new) = retired(current) {
        // Release: see `RETIRE_ORDERING`.
        match word.compare_exchange_weak(current, new, RETIRE_ORDERING, Ordering::Relaxed) {
            Ok(_) => return Some(current),
            Err(actual) => current = actual,
        }
    }
    None
}

/// Retires `word` if `idle` says it is indistinguishable from a fresh one, giving its retired
/// form; one exchange, so exactly one of this and a racing acquire wins. Returns whether it did.
pub(crate) fn retire_if<A: AtomicWord>(word: &A, idle: impl Fn(u64) -> Option<u64>) -> bool {
    // Relaxed load: the exchange below decides.
    let current = word.load(Ordering::Relaxed);
    idle(current).is_some_and(|retired| {
        // Release: see `RETIRE_ORDERING`.
        word.compare_exchange(current, retired, RETIRE_ORDERING, Ordering::Relaxed)
            .is_ok()
    })
}

/// The flag the fixed window and the sliding window counter retire their packed word with: the
/// top bit, which their layouts leave free, set over whatever the word holds.
pub(crate) const RETIRED_FLAG: u64 = 1 << 63;

/// Retires a word that carries [`RETIRED_FLAG`], whatever it holds. Returns the live word this
/// call retired (`None` if it already was).
pub(crate) fn retire_flagged_now<A: AtomicWord>(word: &A) -> Option<u64> {
    retire_now(word, |current| {
        (current & RETIRED_FLAG == 0).then_some(current | RETIRED_FLAG)
    })
}

/// A snapshot of a word that carries [`RETIRED_FLAG`]: what it holds, or `Retired`.
#[inline]
pub(crate) fn load_live<A: AtomicWord>(word: &A) -> Result<u64, Retired> {
    // Relaxed: a snapshot of one word.
    let current = word.load(Ordering::Relaxed);
    if current & RETIRED_FLAG != 0 {
        Err(Retired)
    } else {
        Ok(current)
    }
}
