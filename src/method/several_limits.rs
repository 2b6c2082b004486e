//! [`SeveralLimits`]: one client's state under a plan of several limits ("10 per second and
//! 1,000 per hour"), enforced together, all or nothing.
//!
//! # Guarantee
//!
//! A request is granted only if every limit grants it, and then it has taken from every limit.
//! A refused request leaves every limit as it was, for every reading: it first looks at every
//! limit, taking nothing, and one that some limit refuses at its reading writes nothing at all.
//! Only when another request takes the permits between that look and the taking can a limit
//! refuse after others granted; those grants are then undone, each by restoring the word it
//! replaced while no other decision has landed on it (exact for every reading), or else by
//! taking the permits off the window they were counted in, where they are kept if that window
//! has rolled or another grant has landed on a token bucket since (they refill or expire as any
//! permit does).
//!
//! A taking that moves a window forward is made last, after every limit that may still refuse.
//! Such a taking cannot be undone once another request's decision has landed on the moved word
//! (an undo would forget that decision), and the window would stay moved: a reading older than
//! it would then be counted in the newer window. Taken last, it is followed only by takings of
//! its own kind, and a fixed window that moves always grants; so a window stays moved by a
//! refused request only when two of its limits move in one request and a racing request fills
//! the second between the look and the taking.
//!
//! No limit ever grants more than its own method's guarantee allows: each limit's state is the
//! method's own lock-free state, and a reservation that is given back only ever *delays*
//! permits. The cost: while a reservation is held (from its taking until the refusal by another
//! limit is known and it is undone, a few atomic operations), another request may see that limit
//! short by the reserved permits and be refused where it would otherwise have passed, at most
//! the permits of the reservations in flight at that moment.
//!
//! # Eviction
//!
//! The limits' states are never retired one by one (an entry retired in part would forget what
//! its other limits hold). A *gate* word covers them all: it holds the instant by which every
//! granted permit will have left its limit (`busy_until`), and each granting request moves it
//! later with a compare-and-swap *after* taking from every limit, its commit point. The sweep
//! retires the entry by swapping the gate to RETIRED only if `busy_until` has passed, with one
//! compare-and-swap on the same word: a request whose commit comes first keeps the entry alive;
//! one whose commit finds the gate retired gives its permits back and starts afresh, as a request
//! meeting a retired single-limit state does.

// `Gate` is public only for the `loom` feature's re-exports.
#![cfg_attr(not(feature = "loom"), allow(unreachable_pub))]

use super::any::AnyParams;
use super::client_state::ClientState;
use crate::clock::{Clock, Reading};
use crate::decision::{Decision, Retired};
use crate::method::word::{self, Reservation, Step};
use crate::sync::{AtomicWord, Ordering, OwnedWord, Word};

/// The gate of a retired entry.
const RETIRED: u64 = u64::MAX;

/// One client's states under a plan of several limits, and the gate that retires them together.
#[derive(Debug)]
pub(crate) struct SeveralLimits {
    gate: Gate<Word>,
    states: Box<[ClientState]>,
}

/// The word that retires a client's limits together: the clock reading by which every granted
/// permit has left its limit (`busy_until`), or RETIRED. Generic over the atomic word so that
/// loom can check it.
#[doc(hidden)]
#[derive(Debug)]
pub struct Gate<A> {
    word: A,
}

impl<A: OwnedWord> Gate<A> {
    /// An open gate: nothing granted yet.
    pub fn new() -> Self {
        Gate { word: A::new(0) }
    }
}

impl<A: AtomicWord> Gate<A> {
    /// Whether the gate is retired (an early exit only: [`Gate::commit`] decides).
    pub fn is_retired(&self) -> bool {
        // Relaxed: see above.
        self.word.load(Ordering::Relaxed) == RETIRED
    }

    /// A request's commit point, after it has taken from every limit: moves `busy_until` on to
    /// at least `busy_until`. False when the gate was retired first: the request must give its
    /// permits back.
    pub fn commit(&self, busy_until: u64) -> bool {
        let busy_until = busy_until.min(RETIRED - 1);
        // Relaxed: the gate's exchanges are totally ordered with the sweep's, which is all the
        // commit needs; the limits' own words carry the permits.
        word::update(&self.word, self.word.load(Ordering::Relaxed), |gate| {
            if gate == RETIRED {
                Step::Answer(false)
            } else if gate >= busy_until {
                Step::Answer(true)
            } else {
                Step::Store(busy_until, true)
            }
        })
    }

    /// Retires the gate whatever it holds.
    pub fn retire_now(&self) -> bool {
        word::retire_now(&self.word, |gate| (gate != RETIRED).then_some(RETIRED)).is_some()
    }

    /// Retires the gate if every committed permit has left its limit by `now_nanos`. One
    /// exchange on the word commits move: a commit that lands first keeps the gate open.
    pub fn retire_if_idle(&self, now_nanos: u64) -> bool {
        word::retire_if(&self.word, |busy_until| {
            (busy_until != RETIRED && busy_until <= now_nanos).then_some(RETIRED)
        })
    }
}

#[cfg(feature = "loom")]
impl<A: AtomicWord> Gate<A> {
    /// [`Gate::retire_if_idle`] with its exchange replaced by a check and a blind store: a
    /// commit between the two is lost. Kept for the loom model's negative control, which must
    /// catch it.
    pub fn retire_if_idle_by_blind_store(&self, now_nanos: u64) -> bool {
        let busy_until = self.word.load(Ordering::Relaxed);
        if busy_until == RETIRED || busy_until > now_nanos {
            return false;
        }
        let _ = self.word.compare_exchange(
            self.word.load(Ordering::Relaxed),
            RETIRED,
            word::RETIRE_ORDERING,
            Ordering::Relaxed,
        );
        true
    }
}

impl<A: OwnedWord> Default for Gate<A> {
    fn default() -> Self {
        Self::new()
    }
}

/// What a grant took from each limit of a plan of several (by limit, in the plan's order): the
/// limit's decision and its [`Reservation`].
pub(crate) type Reservations = [Option<(Decision, Reservation)>; SeveralLimits::MAX_LIMITS];

impl SeveralLimits {
    /// The most limits one plan may have: enough for the usual tiers (per second, minute, hour
    /// and day), and few enough for a request's reservations to live on its stack.
    pub(crate) const MAX_LIMITS: usize = 4;

    /// A fresh state for `limits`, as of `since_nanos` (see `AnyParams::fresh_state`).
    pub(crate) fn fresh(limits: &[AnyParams], since_nanos: u64) -> SeveralLimits {
        SeveralLimits {
            gate: Gate::new(),
            states: limits
                .iter()
                .map(|limit| limit.fresh_state(since_nanos))
                .collect(),
        }
    }

    fn is_retired(&self) -> bool {
        self.gate.is_retired()
    }

    /// Takes `n` permits from every limit, or from none. `Retired` when the entry is retired
    /// (the caller moves to a fresh one).
    #[inline]
    pub(crate) fn acquire(
        &self,
        limits: &[AnyParams],
        n: u64,
        clock: &impl Clock,
    ) -> Result<Decision, Retired> {
        self.reserve(limits, n, clock.now_nanos())
            .map(|(decision, _)| decision)
    }

    /// [`SeveralLimits::acquire`] at the clock reading `now`, also returning, for a grant of
    /// `n > 0` permits, what it took from each limit, for [`SeveralLimits::give_back`].
    pub(crate) fn reserve(
        &self,
        limits: &[AnyParams],
        n: u64,
        now: u64,
    ) -> Result<(Decision, Option<Reservations>), Retired> {
        if self.is_retired() {
            return Err(Retired);
        }
        let reading = Reading(now);
        if n == 0 {
            let each =
                self.each_answer(limits, |limit, state| limit.acquire(state, 0, &reading))?;
            let mut each = each.into_iter().flatten();
            let first = each.next().ok_or(Retired)?;
            return Ok((closest_to_exhaustion(first, each), None));
        }
        // First a look at every limit, taking nothing: a request that some limit refuses at
        // this reading is refused without a write, so a refusal leaves every limit exactly as
        // it was (a grant followed by a give-back could leave a window rolled forward, where an
        // older reading would then count afresh).
        // Every limit's look is kept: a refusal reports the longest wait over all of them.
        let looked = self.each_answer(limits, |limit, state| limit.dry_run(state, n, &reading))?;
        let each_look = looked.iter().flatten().copied();
        if let Some(refused) = each_look.clone().find(Decision::is_denied) {
            if refused.rejection().is_some() {
                return Ok((refused, None));
            }
            return Ok((combined(refused, each_look), None));
        }
        let mut rolls = [false; SeveralLimits::MAX_LIMITS];
        for (at, (limit, state)) in limits.iter().zip(self.states.iter()).enumerate() {
            rolls[at] = limit.would_roll(state, &reading);
        }
        // Then the takings, those that move a window forward last. Once another request's
        // decision lands on a word a taking rolled forward, undoing the taking cannot roll it
        // back; taken last, such a taking is followed only by others of its kind, and a fixed
        // window's roll always grants, so it is given back only if two limits roll in one
        // request and a racing request fills the second between the look and the taking.
        let count = limits.len().min(SeveralLimits::MAX_LIMITS);
        let order = (0..count)
            .filter(|&at| !rolls[at])
            .chain((0..count).filter(|&at| rolls[at]));
        let mut granted = [None; SeveralLimits::MAX_LIMITS];
        for at in order {
            let (limit, state) = (&limits[at], &self.states[at]);
            let taken = limit.reserve(state, n, &reading);
            if let Ok((decision, Some(reservation))) = taken
                && decision.is_allowed()
            {
                granted[at] = Some((decision, reservation));
                continue;
            }
            // Refused after all (another request took the permits since the look), or, were a
            // state retired, unusable: give back what the limits taken before it granted, then
            // report the longest wait over every limit.
            self.give_back(limits, n, &granted, now);
            let (decision, _) = taken?;
            return Ok((self.refusal(limits, n, decision, &reading)?, None));
        }
        // The commit: move the gate to the instant every permit has left its limit, unless the
        // sweep retired it meanwhile.
        let busy_until = limits
            .iter()
            .zip(&granted)
            .filter_map(|(limit, granted)| Some(limit.busy_until(&granted.as_ref()?.0, now)))
            .max()
            .unwrap_or(now);
        if !self.gate.commit(busy_until) {
            self.give_back(limits, n, &granted, now);
            return Err(Retired);
        }
        let mut each = granted.iter().flatten().map(|(decision, _)| *decision);
        let first = each.next().ok_or(Retired)?;
        Ok((closest_to_exhaustion(first, each), Some(granted)))
    }

    /// Refunds `n` permits to every limit (see `Method::refund`).
    #[cfg(feature = "envoy")]
    pub(crate) fn refund(&self, limits: &[AnyParams], n: u64, clock: &impl Clock) {
        let reading = Reading(clock.now_nanos());
        for (limit, state) in limits.iter().zip(self.states.iter()) {
            limit.refund(state, n, &reading);
        }
    }

    /// Whether taking from every limit now would move any limit's window forward.
    pub(crate) fn would_roll(&self, limits: &[AnyParams], clock: &impl Clock) -> bool {
        let reading = Reading(clock.now_nanos());
        limits
            .iter()
            .zip(self.states.iter())
            .any(|(limit, state)| limit.would_roll(state, &reading))
    }

    /// Each limit's `answer`, in the plan's order; `Retired` if any limit's state answers so.
    fn each_answer(
        &self,
        limits: &[AnyParams],
        answer: impl Fn(&AnyParams, &ClientState) -> Result<Decision, Retired>,
    ) -> Result<[Option<Decision>; SeveralLimits::MAX_LIMITS], Retired> {
        let mut each = [None; SeveralLimits::MAX_LIMITS];
        for (at, (limit, state)) in limits.iter().zip(self.states.iter()).enumerate() {
            each[at] = Some(answer(limit, state)?);
        }
        Ok(each)
    }

    /// Undoes the grants in `granted` (by limit), each limit's own word restored exactly while
    /// no other decision has landed on it (see `word::Reservation`).
    pub(crate) fn give_back(
        &self,
        limits: &[AnyParams],
        n: u64,
        granted: &[Option<(Decision, Reservation)>],
        now: u64,
    ) {
        let each = limits.iter().zip(self.states.iter()).zip(granted);
        for ((limit, state), granted) in each {
            if let Some((decision, reservation)) = granted {
                // Every limit of a plan with several can give permits back (checked when the
                // plan was made).
                limit.undo(state, n, decision, *reservation, now);
            }
        }
    }

    /// The answer to a refused request: the refusing limit's figures, with the longest wait any
    /// limit asks for.
    fn refusal(
        &self,
        limits: &[AnyParams],
        n: u64,
        refused: Decision,
        reading: &Reading,
    ) -> Result<Decision, Retired> {
        if refused.rejection().is_some() {
            return Ok(refused);
        }
        let each = self.each_answer(limits, |limit, state| limit.dry_run(state, n, reading))?;
        Ok(combined(refused, each.into_iter().flatten()))
    }

    /// What one permit would get now from every limit, taking nothing.
    pub(crate) fn peek(
        &self,
        limits: &[AnyParams],
        clock: &impl Clock,
    ) -> Result<Decision, Retired> {
        let mut each = self.peek_each(limits, clock)?;
        let first = each.next().ok_or(Retired)?;
        Ok(combined(first, each))
    }

    /// Each limit's answer to a look at it now, taking nothing, in the plan's order; `Retired`
    /// when the entry is retired.
    pub(crate) fn peek_each(
        &self,
        limits: &[AnyParams],
        clock: &impl Clock,
    ) -> Result<impl Iterator<Item = Decision>, Retired> {
        if self.is_retired() {
            return Err(Retired);
        }
        let reading = Reading(clock.now_nanos());
        let each = self.each_answer(limits, |limit, state| limit.peek(state, &reading))?;
        Ok(each.into_iter().flatten())
    }

    /// Retires the entry whatever it holds (a client whose plan changed its limits).
    pub(crate) fn retire_now(&self) -> bool {
        self.gate.retire_now()
    }

    /// Retires the entry if every permit it granted has left its limit by `now_nanos`.
    pub(crate) fn retire_if_idle(&self, now_nanos: u64) -> bool {
        self.gate.retire_if_idle(now_nanos)
    }
}

/// Of `first` and the other allowed decisions, the one with the fewest permits left.
fn closest_to_exhaustion(first: Decision, others: impl Iterator<Item = Decision>) -> Decision {
    others.fold(first, |closest, decision| {
        if decision.remaining() < closest.remaining() {
            decision
        } else {
            closest
        }
    })
}

/// What a plan's limits answer together: the refusal with the longest wait if any limit
/// refuses, otherwise the grant with the fewest permits left. (The Redis service answers its
/// limits' replies, and its local fallback's decisions, with it too.)
pub(crate) fn combined(first: Decision, others: impl Iterator<Item = Decision>) -> Decision {
    others.fold(first, |combined, decision| {
        match (combined.is_denied(), decision.is_denied()) {
            (false, true) => decision,
            (true, true) if decision.retry_after() > combined.retry_after() => decision,
            (false, false) if decision.remaining() < combined.remaining() => decision,
            _ => combined,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rule;

    #[test]
    fn combined_reports_the_longest_refusal_else_the_tightest_grant() {
        let a = Rule::per_second(10).unwrap();
        let b = Rule::per_hour(100).unwrap();
        let granted = Decision::allowed(a, 9, 1);
        assert_eq!(
            combined(granted, [Decision::allowed(b, 3, 1)].into_iter()).remaining(),
            3
        );
        let mixed = [Decision::denied(b, 0, 5, 5), Decision::denied(a, 0, 9, 9)];
        let refused = combined(Decision::allowed(a, 0, 1), mixed.into_iter());
        assert_eq!(refused.retry_after().as_nanos(), 9);
    }
}
