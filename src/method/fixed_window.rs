//! [`FixedWindow`]: window index and count packed in one atomic word.
//!
//! Guarantee: at most N permits per window aligned to the clock's origin (so up to 2N in a
//! span of one window across an edge).
//!
//! The full statement, and how the code keeps it under any interleaving, are documented on
//! [`FixedWindow`], where users read them.

// The parameter types and `AtomicWord` are public only for the `loom` feature's re-exports.
#![cfg_attr(not(feature = "loom"), allow(unreachable_pub))]

use crate::clock::Clock;
use crate::decision::{Admit, Decision, Rejection, Retired};
use crate::error::RuleError;
use crate::method::Method;
use crate::method::standalone::{Standalone, Wraps};
use crate::method::word::{self, Reservation, Step};
use crate::sync::{AtomicWord, Ordering, OwnedWord};
use crate::{Algorithm, Rule};

/// Set on a word retired for eviction; no permit is granted from it.
const RETIRED: u64 = word::RETIRED_FLAG;

/// Room above N in the count field for the fast path's overshoot. A `fetch_add` that finds the
/// count already at N still adds 1 (and is denied); only threads that saw the count below N just
/// before their add can overshoot, so the overshoot is bounded by the number of threads racing on
/// one limiter at one instant. 2^20 of them would be needed to carry into the index.
const COUNT_HEADROOM: u64 = 1 << 20;

/// The constants of one rule: the window and the packed layout.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowParams {
    rule: Rule,
    /// Width of the count field, in bits.
    count_bits: u32,
    /// The largest window index the word can hold; later windows are clamped to it.
    max_index: u64,
    /// The clock reading window 0 starts at: the start of the window the limiter (or service)
    /// started in, so that windows stay aligned to the clock's origin while the horizon is
    /// counted from the limiter's start.
    origin_nanos: u64,
}

impl WindowParams {
    /// The same parameters for a window whose timeline starts at the clock reading
    /// `start_nanos` (its own start): window 0 is the one that reading falls in, aligned to the
    /// clock's origin, and the horizon lies [`RuleError::MIN_HORIZON`] or more after it.
    pub fn starting_at(self, start_nanos: u64) -> WindowParams {
        let window = self.rule.window_nanos();
        WindowParams {
            origin_nanos: start_nanos / window * window,
            ..self
        }
    }

    /// A clock reading as nanoseconds since window 0 starts; readings before it count as its
    /// start.
    #[inline]
    fn elapsed(&self, now_nanos: u64) -> u64 {
        now_nanos.saturating_sub(self.origin_nanos)
    }

    /// Chooses the layout for `rule`, or explains why it would not last.
    pub fn new(rule: Rule) -> Result<WindowParams, RuleError> {
        let limit = rule.limit();
        // The count field, with its headroom, must leave the top bit for the retired flag.
        let max_limit = (RETIRED - 1) - COUNT_HEADROOM;
        if limit > max_limit {
            return Err(RuleError::LimitTooLarge {
                algorithm: Algorithm::FixedWindow,
                limit,
                max: max_limit,
            });
        }
        let count_bits = u64::BITS - (limit + COUNT_HEADROOM).leading_zeros();
        let index_bits = 63u32.saturating_sub(count_bits);
        let max_index = (1u64 << index_bits) - 1;
        // One window less than the index can count: a limiter starts anywhere in its first
        // window (window 0 is the one its start falls in).
        let horizon_nanos = max_index as u128 * rule.window_nanos() as u128;
        if horizon_nanos < RuleError::MIN_HORIZON.as_nanos() {
            return Err(RuleError::HorizonTooShort {
                algorithm: Algorithm::FixedWindow,
                limit,
                window: rule.window(),
                horizon: std::time::Duration::from_nanos(
                    u64::try_from(horizon_nanos).unwrap_or(u64::MAX),
                ),
            });
        }
        Ok(WindowParams {
            rule,
            count_bits,
            max_index,
            origin_nanos: 0,
        })
    }

    #[inline]
    fn count_mask(&self) -> u64 {
        (1 << self.count_bits) - 1
    }

    #[inline]
    fn unpack(&self, word: u64) -> (u64, u64) {
        (
            (word & !RETIRED) >> self.count_bits,
            word & self.count_mask(),
        )
    }

    #[inline]
    fn pack(&self, index: u64, count: u64) -> u64 {
        (index << self.count_bits) | count
    }

    /// The word of a window that is empty from `since_nanos` on: the window then current, with
    /// nothing granted; an earlier reading is counted in it. At least as strict as any word whose
    /// window was over at `since_nanos`. A service seeds new clients with it.
    pub fn empty_since(&self, since_nanos: u64) -> u64 {
        match self.index_at(self.elapsed(since_nanos)) {
            // The window before, full: any reading from window `index` on starts it afresh, and
            // an earlier one is denied, as it would be by a word retired at `since_nanos`.
            index @ 1.. => self.pack(index - 1, self.rule.limit()),
            0 => self.pack(0, 0),
        }
    }

    /// Retires the word whatever its state, as [`Method::retire_now`] does; the live word it
    /// retired (`None` if it already was).
    pub fn retire_returning<A: AtomicWord>(&self, word: &A) -> Option<u64> {
        word::retire_flagged_now(word)
    }

    /// The earliest clock reading a fresh word ([`empty_since`](WindowParams::empty_since)) may
    /// be made as of and hold at most one limit's worth more than `word`, for every reading: the
    /// start of `word`'s window. (Made as of it, the fresh word starts that window empty and
    /// refuses every earlier reading.)
    pub fn counted_up_to(&self, word: u64) -> u64 {
        let (index, _) = self.unpack(word);
        self.window_start(index)
    }

    /// The clock reading window `index` of the timeline starts at.
    fn window_start(&self, index: u64) -> u64 {
        self.origin_nanos
            .saturating_add(index.saturating_mul(self.rule.window_nanos()))
    }

    /// Of what `word` holds now (one load): its [`counted_up_to`](WindowParams::counted_up_to),
    /// and the earliest clock reading at which it is indistinguishable from a fresh word
    /// (`retire_if_idle` would retire it there and at every later reading, and at no earlier
    /// one): the start of its window if it counts nothing, else of the next; `None` when it is
    /// retired.
    pub fn counted_and_idle_from<A: AtomicWord>(&self, word: &A) -> Option<(u64, u64)> {
        // A snapshot, for an eviction's choice of victim only.
        let (index, count) = self.unpack(word::load_live(word).ok()?);
        let idle_index = index.saturating_add(u64::from(count > 0));
        Some((self.window_start(index), self.window_start(idle_index)))
    }

    #[inline]
    fn index_at(&self, now_nanos: u64) -> u64 {
        (now_nanos / self.rule.window_nanos()).min(self.max_index)
    }

    /// Whether `now_nanos` lies in window `index`: two multiplications' worth, no division.
    #[inline]
    fn is_within(&self, index: u64, now_nanos: u64) -> bool {
        let start = index.saturating_mul(self.rule.window_nanos());
        now_nanos >= start && now_nanos - start < self.rule.window_nanos()
    }

    /// The window of `now_nanos`, if it is later than window `stored` (clamped at the horizon,
    /// where time stands still).
    #[inline]
    fn newer_index(&self, stored: u64, now_nanos: u64) -> Option<u64> {
        let stored_end = (stored + 1).saturating_mul(self.rule.window_nanos());
        if now_nanos < stored_end {
            return None;
        }
        let now_index = self.index_at(now_nanos);
        (now_index > stored).then_some(now_index)
    }

    /// Takes `n` permits (at most its count) off window `index`, if that is the stored window
    /// of a live word: an undo's, or a refund's (see `Method::undo`, `Method::refund`).
    fn take_off<A: AtomicWord>(&self, word: &A, index: u64, n: u64) {
        // Relaxed: see `word::update`.
        word::update(word, word.load(Ordering::Relaxed), |current| {
            let (stored, count) = self.unpack(current);
            if current & RETIRED != 0 || stored != index || count == 0 {
                return Step::Answer(());
            }
            Step::Store(self.pack(stored, count.saturating_sub(n)), ())
        });
    }

    /// Nanoseconds from `now_nanos` to the end of window `index`.
    #[inline]
    fn until_end_of(&self, index: u64, now_nanos: u64) -> u64 {
        let end = (index + 1)
            .checked_mul(self.rule.window_nanos())
            .filter(|end| index < self.max_index && self.origin_nanos.checked_add(*end).is_some());
        match end {
            Some(end) => end.saturating_sub(now_nanos),
            // The last window the word can count, or one that ends past the clock's last reading:
            // time stands still in it, so it never ends (a denial there is for good, and says so).
            None => u64::MAX,
        }
    }

    /// The pure decision: what taking `n` permits at `now_nanos` from `word` answers, and the
    /// word to store if it must change. `word` must not be retired. (The limiter itself calls
    /// `decide_elapsed` with a reading it has already counted from window 0.)
    #[cfg(any(test, feature = "loom"))]
    #[inline]
    pub fn decide(&self, word: u64, now_nanos: u64, n: u64) -> (Decision, Option<u64>) {
        self.decide_elapsed(word, self.elapsed(now_nanos), n)
    }

    /// [`WindowParams::decide`], for a reading already counted from window 0.
    #[inline]
    fn decide_elapsed(&self, word: u64, now: u64, n: u64) -> (Decision, Option<u64>) {
        let limit = self.rule.limit();
        let (stored_index, count) = self.unpack(word);
        // A reading in an older window than the stored one (a stale or stepped-back clock) is
        // counted in the stored window: it never resets the count. Only a reading past the
        // stored window's end pays for a division.
        let (index, used) = match self.newer_index(stored_index, now) {
            Some(now_index) => (now_index, 0),
            None => (stored_index, count.min(limit)),
        };
        let until_end = self.until_end_of(index, now);
        if n > limit {
            let rejection = Rejection::ExceedsLimit {
                requested: n,
                limit,
            };
            let quota = Decision::allowed(self.rule, limit - used, until_end);
            return (quota.into_rejected(rejection), None);
        }
        if used + n > limit {
            let decision = Decision::denied(self.rule, limit - used, until_end, until_end);
            return (decision, None);
        }
        let decision = Decision::allowed(self.rule, limit - used - n, until_end);
        // n = 0 takes nothing, so it writes nothing.
        (decision, (n > 0).then(|| self.pack(index, used + n)))
    }

    /// The compare-and-swap loop of a decision at `now` (counted from window 0), from `current`.
    #[inline]
    fn decide_on<A: AtomicWord>(
        &self,
        word: &A,
        current: u64,
        now: u64,
        n: u64,
    ) -> Result<(Decision, Option<Reservation>), Retired> {
        word::decide(
            word,
            current,
            |current| current & RETIRED != 0,
            |current| self.decide_elapsed(current, now, n),
        )
    }

    /// Whether one permit at `now` (counted from window 0) may take the fast path on the word
    /// `current`: it is live, its window is the reading's, and it has room for one more.
    #[inline]
    fn has_room_now(&self, current: u64, now: u64) -> bool {
        let (index, count) = self.unpack(current);
        current & RETIRED == 0 && count < self.rule.limit() && self.is_within(index, now)
    }

    /// The fast path: one `fetch_add` instead of a CAS loop, which never retries under
    /// contention. Exact: the add is granted iff the count it replaced was below N, and an add
    /// that lands in a newer window (another thread rolled it over) counts in that window.
    #[inline]
    fn acquire_one_in_current_window<A: AtomicWord>(
        &self,
        word: &A,
        now_nanos: u64,
    ) -> Result<Decision, Retired> {
        // Relaxed: see `acquire`.
        let previous = word.fetch_add(1, Ordering::Relaxed);
        if previous & RETIRED != 0 {
            return Err(Retired);
        }
        let (index, count) = self.unpack(previous);
        let limit = self.rule.limit();
        // As `decide` reports it: the end of the window the permit was counted in, from this
        // reading (so both paths answer alike for the same word and reading).
        let until_end = self.until_end_of(index, now_nanos);
        Ok(if count < limit {
            Decision::allowed(self.rule, limit - count - 1, until_end)
        } else {
            Decision::denied(self.rule, 0, until_end, until_end)
        })
    }
}

/// A fixed window: at most N permits per window aligned to the clock's origin.
///
/// Lock-free: one `AtomicU64` (on its own cache line); a single permit in the current window is
/// one `fetch_add` (a compare-and-swap for a service's client, whose word is stored salted).
///
/// # Guarantee
///
/// Windows are aligned to the clock's origin: `[0, W)`, `[W, 2W)`, ... At most N permits are
/// granted per aligned window. That is *not* at most N in every span of length W: N at the end of
/// one window and N at the start of the next pass within a moment, 2N in all (the edge burst the
/// [sliding window log](crate::SlidingWindowLog) exists to prevent). A reading from a clock that
/// stepped back is counted in the newest window seen, never resets it.
///
/// # How
///
/// One `AtomicU64`, laid out as
///
/// ```text
/// [63] retired · [62 .. C] window index · [C-1 .. 0] permits granted in that window
/// ```
///
/// with the count's width `C` chosen from the limit, leaving room for 2^20 racing threads to
/// overshoot it on the fast path without carrying into the index. A general attempt is
/// a compare-and-swap loop; a single permit in the current window takes the fast path, one
/// `fetch_add` that is granted iff the count it replaced was below N.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::{FakeClock, FixedWindow, Limiter, Rule};
///
/// let clock = FakeClock::starting_at(Duration::from_millis(1_990));
/// let window = FixedWindow::new(Rule::per_second(5)?, clock.clone())?;
/// let end_of_window = (0..5).filter(|_| window.try_acquire()).count();
/// clock.advance(Duration::from_millis(20)); // a new window starts at 2 000 ms
/// let start_of_next = (0..5).filter(|_| window.try_acquire()).count();
/// assert_eq!(end_of_window + start_of_next, 10); // twice the limit within 20 ms
/// # Ok::<(), tollgate::RuleError>(())
/// ```
#[derive(Debug)]
pub struct FixedWindow<C = crate::MonotonicClock> {
    limiter: Standalone<WindowParams, C>,
}

impl<C: Clock> FixedWindow<C> {
    /// An empty window for `rule`, reading time from `clock`.
    ///
    /// # Errors
    ///
    /// [`RuleError::LimitTooLarge`] when the count would reach the retired flag,
    /// [`RuleError::HorizonTooShort`] when the packed window index would wrap within
    /// [`RuleError::MIN_HORIZON`].
    pub fn new(rule: Rule, clock: C) -> Result<Self, RuleError> {
        Ok(FixedWindow {
            limiter: Standalone::new(rule, clock)?,
        })
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        self.limiter.clock()
    }
}

// What gives `FixedWindow` the `Limiter` trait (see `Wraps`).
impl<C: Clock> Wraps for FixedWindow<C> {
    type Method = WindowParams;
    type Clock = C;

    fn standalone(&self) -> &Standalone<WindowParams, C> {
        &self.limiter
    }
}

impl Method for WindowParams {
    type State<A: AtomicWord> = A;

    const CAN_UNDO: bool = true;

    fn new(rule: Rule, start_nanos: u64) -> Result<Self, RuleError> {
        Ok(WindowParams::new(rule)?.starting_at(start_nanos))
    }

    fn rule(&self) -> Rule {
        self.rule
    }

    fn origin_nanos(&self) -> u64 {
        self.origin_nanos
    }

    fn fresh<A: OwnedWord>(&self, since_nanos: u64) -> A {
        A::new(self.empty_since(since_nanos))
    }

    #[inline]
    fn acquire<A: AtomicWord>(
        &self,
        word: &A,
        n: u64,
        clock: &impl Clock,
    ) -> Result<Decision, Retired> {
        // Relaxed, for every access to the word: the decision depends on this one word only, and
        // read-modify-writes of one word are totally ordered, so each grant sees every earlier
        // one. No other memory is published through it.
        let current = word.load(Ordering::Relaxed);
        let now = self.elapsed(clock.now_nanos());
        if n == 1 && self.has_room_now(current, now) {
            return self.acquire_one_in_current_window(word, now);
        }
        // One clock reading per attempt, kept on a retry (see `GcraParams`' `acquire`).
        Ok(self.decide_on(word, current, now, n)?.0)
    }

    /// [`Method::acquire`], also returning what a grant changed, so that a plan of several
    /// limits can undo it exactly (see [`Method::undo`]).
    #[inline]
    fn reserve<A: AtomicWord>(
        &self,
        word: &A,
        n: u64,
        clock: &impl Clock,
    ) -> Result<(Decision, Option<Reservation>), Retired> {
        let now = self.elapsed(clock.now_nanos());
        // Relaxed: see `acquire`.
        self.decide_on(word, word.load(Ordering::Relaxed), now, n)
    }

    /// [`Method::acquire`] for `n = 1`, answering only whether (no [`Decision`] is built).
    #[inline]
    fn acquire_one<A: AtomicWord>(&self, word: &A, clock: &impl Clock) -> Result<Admit, Retired> {
        // Relaxed, for every access to the word: see `acquire`.
        let current = word.load(Ordering::Relaxed);
        let now = self.elapsed(clock.now_nanos());
        let limit = self.rule.limit();
        if self.has_room_now(current, now) {
            // The fast path, as `acquire_one_in_current_window` takes it.
            let previous = word.fetch_add(1, Ordering::Relaxed);
            return if previous & RETIRED != 0 {
                Err(Retired)
            } else if self.unpack(previous).1 < limit {
                Ok(Admit::Granted)
            } else {
                Ok(Admit::Denied)
            };
        }
        word::update(word, current, |current| {
            if current & RETIRED != 0 {
                return Step::Answer(Err(Retired));
            }
            // As `decide_elapsed` for n = 1.
            let (stored_index, count) = self.unpack(current);
            let (index, used) = match self.newer_index(stored_index, now) {
                Some(now_index) => (now_index, 0),
                None => (stored_index, count.min(limit)),
            };
            if used >= limit {
                Step::Answer(Ok(Admit::Denied))
            } else {
                Step::Store(self.pack(index, used + 1), Ok(Admit::Granted))
            }
        })
    }

    /// Undoes the grant that made `reservation` (a reservation across several limits that
    /// another limit refused, `granted` its decision, made at `now_nanos`).
    ///
    /// While the word is still the one the grant stored, the word it replaced is stored again:
    /// exact for every reading, even where the grant had rolled the window forward (a reading of
    /// the window before is then counted in that window again, as it was). Once another decision
    /// has landed, the `n` permits are taken off the window the grant was counted in (the one
    /// where its `reset_after` ends), if that is still the stored one; a window that has rolled
    /// over since has nothing to give back.
    fn undo<A: AtomicWord>(
        &self,
        word: &A,
        n: u64,
        granted: &Decision,
        reservation: Reservation,
        now_nanos: u64,
    ) {
        if word::restore(word, reservation) {
            return;
        }
        let end = self
            .elapsed(now_nanos)
            .saturating_add(granted.reset_after_units());
        let Some(index) = (end / self.rule.window_nanos()).checked_sub(1) else {
            return;
        };
        self.take_off(word, index.min(self.max_index), n);
    }

    /// Takes `n` permits off the count of the stored window while it is the reading's; a window
    /// that has ended has nothing left to refund, and one later than the reading (stored by a
    /// decision whose reading came after this refund's) was not the one refunded.
    fn refund<A: AtomicWord>(&self, word: &A, n: u64, clock: &impl Clock) {
        self.take_off(word, self.index_at(self.elapsed(clock.now_nanos())), n);
    }

    /// Whether the reading lies past the stored window.
    fn would_roll<A: AtomicWord>(&self, word: &A, clock: &impl Clock) -> bool {
        // Relaxed: a snapshot of one word; the caller orders its takings by it, and a word that
        // moves meanwhile only makes the order less useful, never a decision wrong.
        let (stored, _) = self.unpack(word.load(Ordering::Relaxed) & !RETIRED);
        self.newer_index(stored, self.elapsed(clock.now_nanos()))
            .is_some()
    }

    #[inline]
    fn dry_run<A: AtomicWord>(
        &self,
        word: &A,
        n: u64,
        clock: &impl Clock,
    ) -> Result<Decision, Retired> {
        let current = word::load_live(word)?;
        Ok(self
            .decide_elapsed(current, self.elapsed(clock.now_nanos()), n)
            .0)
    }

    #[inline]
    fn peek<A: AtomicWord>(&self, word: &A, clock: &impl Clock) -> Result<Decision, Retired> {
        let now = self.elapsed(clock.now_nanos());
        word::peek(
            word,
            |current| current & RETIRED != 0,
            |current, n| self.decide_elapsed(current, now, n).0,
        )
    }

    /// Retires the word whatever its state (for a client that moved to another rule).
    fn retire_now<A: AtomicWord>(&self, word: &A) -> bool {
        self.retire_returning(word).is_some()
    }

    /// Retires the word if its window is over at `now_nanos`, or is the reading's own and empty
    /// (so it is indistinguishable from a fresh one). Retiring and acquiring are
    /// read-modify-writes of the same word, so exactly one of them wins.
    fn retire_if_idle<A: AtomicWord>(&self, word: &A, now_nanos: u64) -> bool {
        let now_index = self.index_at(self.elapsed(now_nanos));
        word::retire_if(word, |current| {
            let (index, count) = self.unpack(current);
            // A word of a window later than the reading's is never idle at it, even empty (a
            // refund's): it counts an older reading in its own window, where a fresh word made
            // as of the reading would give that reading's window a limit of its own.
            (current & RETIRED == 0 && (index < now_index || index == now_index && count == 0))
                .then_some(current | RETIRED)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn params(limit: u64, window: Duration) -> WindowParams {
        WindowParams::new(Rule::new(limit, window).unwrap()).unwrap()
    }

    #[test]
    fn the_count_field_leaves_headroom_above_the_limit() {
        let window = params(5, Duration::from_secs(1));
        assert_eq!(window.count_bits, 21); // 5 + 2^20 needs 21 bits
        assert_eq!(window.max_index, (1 << 42) - 1);
        let word = window.pack(123_456, 5);
        assert_eq!(window.unpack(word), (123_456, 5));
        assert_eq!(window.unpack(word | RETIRED), (123_456, 5));
    }

    /// An empty word of window 5 (a refund's) is idle at readings of window 5 and later, never
    /// at one of window 4: there it would count the reading in window 5, where a fresh word
    /// made as of the reading gives window 4 a limit of its own.
    #[test]
    fn an_empty_word_of_a_later_window_is_not_idle_at_an_older_reading() {
        let window = params(2, Duration::from_secs(1));
        let word = crate::sync::Word::new(window.pack(5, 0));
        assert!(!window.retire_if_idle(&word, 4_500_000_000));
        assert!(window.retire_if_idle(&word, 5_000_000_000));
        let word = crate::sync::Word::new(window.pack(5, 1));
        assert!(!window.retire_if_idle(&word, 5_999_999_999));
        assert!(window.retire_if_idle(&word, 6_000_000_000));
    }

    #[test]
    #[cfg(feature = "envoy")]
    fn a_refund_reaches_only_the_window_of_its_reading() {
        use crate::clock::FakeClock;
        let window = params(2, Duration::from_secs(1));
        let clock = FakeClock::new();
        clock.advance(Duration::from_millis(5_500));
        let word = crate::sync::Word::new(window.pack(5, 2));
        // A reading of window 4 (behind the stored window 5: a refund whose reading came
        // before a later decision's) gives nothing back to window 5.
        let stale = FakeClock::new();
        stale.advance(Duration::from_millis(4_500));
        window.refund(&word, 2, &stale);
        assert_eq!(window.unpack(word.load(Ordering::Relaxed)), (5, 2));
        // Nor does one of window 6, whose count starts at 0.
        let later = FakeClock::new();
        later.advance(Duration::from_millis(6_500));
        window.refund(&word, 2, &later);
        assert_eq!(window.unpack(word.load(Ordering::Relaxed)), (5, 2));
        // A reading of window 5 takes the permits off, down to 0 at most.
        window.refund(&word, 5, &clock);
        assert_eq!(window.unpack(word.load(Ordering::Relaxed)), (5, 0));
    }

    #[test]
    fn a_stale_reading_is_counted_in_the_newest_window() {
        let window = params(2, Duration::from_secs(1));
        let stored = window.pack(5, 2);
        // A reading in window 4 (behind the stored window 5) neither resets nor escapes the count.
        let (stale, new) = window.decide(stored, 4_500_000_000, 1);
        assert!(stale.is_denied());
        assert_eq!(new, None);
        // A reading in window 6 starts it afresh.
        let (fresh, new) = window.decide(stored, 6_000_000_000, 1);
        assert!(fresh.is_allowed());
        assert_eq!(new, Some(window.pack(6, 1)));
    }
}
