//! [`SlidingWindowCounter`]: the counts of the current and the previous window packed in one
//! atomic word, the previous one weighted by how much of it the sliding window still covers.
//!
//! Guarantee: at most N permits per window aligned to the clock's origin, and at most
//! `2N - ceil(2N/W)` (W in nanoseconds, at least 2) in any span of one window; in between, the
//! weighted estimate of the last window never exceeds N.
//!
//! The full statement, and how the code keeps it under any interleaving, are documented on
//! [`SlidingWindowCounter`], where users read them.

// The parameter types and `AtomicWord` are public only for the `loom` feature's re-exports.
#![cfg_attr(not(feature = "loom"), allow(unreachable_pub))]

use crossbeam_utils::CachePadded;

use crate::clock::Clock;
use crate::decision::{Admit, Decision, Rejection};
use crate::error::RuleError;
use crate::method::word::{self, Reservation, Step};
use crate::method::{one_word_method, one_word_service_method, standalone_limiter};
use crate::sync::{AtomicWord, Ordering, Word};
use crate::{Algorithm, Rule};

/// Set on a word retired for eviction; no permit is granted from it.
const RETIRED: u64 = 1 << 63;

/// The widest count field: two of them must leave at least one bit of window index below the
/// retired flag (`1 + 1 + 2 * 31 = 64`).
const MAX_COUNT_BITS: u32 = 31;

/// The largest limit the word holds: a count never exceeds the limit, so no headroom is needed
/// (there is no `fetch_add` path; every change is a compare-and-swap of a checked word).
const MAX_LIMIT: u64 = (1 << MAX_COUNT_BITS) - 1;

/// A wait that no amount of waiting ends: the answer past the word's horizon, where time stands
/// still. About 584 years; a caller that honours it never comes back early.
const NEVER: u64 = u64::MAX;

/// The constants of one rule: the window and the packed layout.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterParams {
    rule: Rule,
    /// Width of each count field, in bits.
    count_bits: u32,
    /// The largest window index the word can hold.
    max_index: u64,
    /// The latest instant the word tells apart, in nanoseconds since window 0 starts (the last
    /// nanosecond of window `max_index`). Later readings are clamped to it: time then stands
    /// still, so the counts never wrap (nor expire).
    last_nanos: u64,
    /// The clock reading window 0 starts at: the start of the window the limiter (or service)
    /// started in, so that windows stay aligned to the clock's origin while the horizon is
    /// counted from the limiter's start.
    origin_nanos: u64,
}

/// The word's counts carried to the window of one reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rolled {
    /// The window the reading is counted in.
    index: u64,
    /// Permits granted in that window.
    current: u64,
    /// Permits granted in the window before it.
    previous: u64,
    /// Nanoseconds from the start of that window to the instant the reading is counted at.
    elapsed: u64,
}

impl CounterParams {
    /// The same parameters for a counter whose timeline starts at the clock reading
    /// `start_nanos` (its own start): window 0 is the one that reading falls in, aligned to the
    /// clock's origin, and the horizon lies [`RuleError::MIN_HORIZON`] or more after it.
    pub fn starting_at(self, start_nanos: u64) -> CounterParams {
        let window = self.rule.window_nanos();
        CounterParams {
            origin_nanos: start_nanos / window * window,
            ..self
        }
    }

    /// Chooses the layout for `rule`, or explains why it would not last.
    pub fn new(rule: Rule) -> Result<CounterParams, RuleError> {
        let limit = rule.limit();
        if limit > MAX_LIMIT {
            return Err(RuleError::LimitTooLarge {
                algorithm: Algorithm::SlidingWindowCounter,
                limit,
                max: MAX_LIMIT,
            });
        }
        let count_bits = u64::BITS - limit.leading_zeros();
        // At least 1: count_bits <= 31.
        let index_bits = 63 - 2 * count_bits;
        let max_index = (1u64 << index_bits) - 1;
        let horizon_nanos = (u128::from(max_index) + 1) * u128::from(rule.window_nanos());
        if horizon_nanos < RuleError::MIN_HORIZON.as_nanos() {
            return Err(RuleError::HorizonTooShort {
                algorithm: Algorithm::SlidingWindowCounter,
                limit,
                window: rule.window(),
                horizon: std::time::Duration::from_nanos(
                    u64::try_from(horizon_nanos).unwrap_or(u64::MAX),
                ),
            });
        }
        Ok(CounterParams {
            rule,
            count_bits,
            max_index,
            last_nanos: u64::try_from(horizon_nanos - 1).unwrap_or(u64::MAX),
            origin_nanos: 0,
        })
    }

    /// The rule these parameters enforce.
    #[cfg(feature = "loom")]
    pub fn rule(&self) -> Rule {
        self.rule
    }

    #[inline]
    fn count_mask(&self) -> u64 {
        (1 << self.count_bits) - 1
    }

    /// `(window index, current count, previous count)`.
    #[inline]
    fn unpack(&self, word: u64) -> (u64, u64, u64) {
        (
            (word & !RETIRED) >> (2 * self.count_bits),
            (word >> self.count_bits) & self.count_mask(),
            word & self.count_mask(),
        )
    }

    #[inline]
    fn pack(&self, index: u64, current: u64, previous: u64) -> u64 {
        (index << (2 * self.count_bits)) | (current << self.count_bits) | previous
    }

    /// A clock reading as nanoseconds since window 0 starts, clamped to the horizon; readings
    /// before window 0 count as its start.
    #[inline]
    fn elapsed(&self, now_nanos: u64) -> u64 {
        now_nanos
            .saturating_sub(self.origin_nanos)
            .min(self.last_nanos)
    }

    /// The word of a counter that is empty from `since_nanos` on: the window then current, with
    /// nothing granted in it or the one before; an earlier reading is counted at its start. At
    /// least as strict as any word that was empty at `since_nanos`. A service seeds new clients
    /// with it.
    pub fn empty_since(&self, since_nanos: u64) -> u64 {
        let index = self.elapsed(since_nanos) / self.rule.window_nanos();
        self.pack(index.min(self.max_index), 0, 0)
    }

    /// The counts of `word` as of the reading `now` (already counted from window 0 and clamped).
    /// A reading in a window older than the stored one (a stale or stepped-back clock) is
    /// counted at the start of the stored window, where the previous window weighs most: it
    /// never resets a count. Only a reading past the stored window's end pays for a division.
    #[inline]
    fn roll(&self, word: u64, now: u64) -> Rolled {
        let window = self.rule.window_nanos();
        let (stored, current, previous) = self.unpack(word);
        let stored_start = stored.saturating_mul(window);
        if now < stored_start {
            return Rolled {
                index: stored,
                current,
                previous,
                elapsed: 0,
            };
        }
        let elapsed = now - stored_start;
        if elapsed < window {
            return Rolled {
                index: stored,
                current,
                previous,
                elapsed,
            };
        }
        let index = now / window;
        Rolled {
            index,
            current: 0,
            // The stored window's count weighs on the next window only.
            previous: if index == stored + 1 { current } else { 0 },
            elapsed: now % window,
        }
    }

    /// Whether the previous window's weighted count, rounded up, fits in `room` permits:
    /// `ceil(previous * (W - elapsed) / W) <= room`, without a division.
    #[inline]
    fn weighted_fits(&self, rolled: &Rolled, room: u64) -> bool {
        let window = u128::from(self.rule.window_nanos());
        // elapsed < W, so the weight is 1..=W; both products fit in 128 bits.
        let overlap = window - u128::from(rolled.elapsed);
        u128::from(rolled.previous) * overlap <= u128::from(room) * window
    }

    /// The previous window's count weighted by the part of it the sliding window still covers,
    /// rounded up: `ceil(previous * (W - elapsed) / W)`, at most `previous`.
    #[inline]
    fn weighted_previous(&self, rolled: &Rolled) -> u64 {
        let window = self.rule.window_nanos();
        let overlap = window - rolled.elapsed;
        match rolled.previous.checked_mul(overlap) {
            Some(product) => product.div_ceil(window),
            // At most `previous`, which fits.
            None => {
                (u128::from(rolled.previous) * u128::from(overlap)).div_ceil(u128::from(window))
                    as u64
            }
        }
    }

    /// The instant (in nanoseconds since window 0) `nanos` into window `index`, or `None` past
    /// the horizon, where time stands still and it never comes.
    #[inline]
    fn instant(&self, index: u64, nanos: u64) -> Option<u64> {
        index
            .checked_mul(self.rule.window_nanos())
            .and_then(|start| start.checked_add(nanos))
            .filter(|&instant| instant <= self.last_nanos)
    }

    /// Nanoseconds from the reading `now` until the estimate is 0 if nothing more is taken: the
    /// start of the window after next while the current window holds a permit, the start of the
    /// next while only the previous one does, now if neither does. [`NEVER`] past the horizon.
    #[inline]
    fn reset_after(&self, rolled: &Rolled, now: u64) -> u64 {
        let windows_left = if rolled.current > 0 {
            2
        } else if rolled.previous > 0 {
            1
        } else {
            return 0;
        };
        rolled
            .index
            .checked_add(windows_left)
            .and_then(|index| self.instant(index, 0))
            .map_or(NEVER, |reset_at| reset_at.saturating_sub(now))
    }

    /// Nanoseconds from the reading `now` until `n` permits (at most N) fit, if nothing more is
    /// taken: the first instant at which `ceil(previous' * (W - elapsed') / W) + current' + n`
    /// is at most N. [`NEVER`] past the horizon.
    ///
    /// While `current + n <= N`, that instant lies in this window, or at the start of the next
    /// (where the estimate is `current`): the weight must fall to
    /// `floor((N - current - n) * W / previous)` nanoseconds. Otherwise it lies in the next
    /// window, where `current` weighs as the previous count, or at the start of the one after
    /// (where the estimate is 0): the weight must fall to `floor((N - n) * W / current)`.
    /// Either weight is below the one now, as the request is denied now.
    #[inline]
    fn retry_after(&self, rolled: &Rolled, n: u64, now: u64) -> u64 {
        let limit = self.rule.limit();
        let window = self.rule.window_nanos();
        let (index, weighing, room) = if rolled.current + n <= limit {
            (rolled.index, rolled.previous, limit - rolled.current - n)
        } else {
            (rolled.index.saturating_add(1), rolled.current, limit - n)
        };
        // `weighing` > 0: with nothing to weigh the request would fit. The quotient is below W
        // (the request does not fit at the weight now, or `room` < `weighing`), so it fits u64.
        let weight = (u128::from(room) * u128::from(window) / u128::from(weighing.max(1)))
            .min(u128::from(window)) as u64;
        self.instant(index, window - weight)
            .map_or(NEVER, |allowed_at| allowed_at.saturating_sub(now))
    }

    /// The pure decision: what taking `n` permits at `now_nanos` from `word` answers, and the
    /// word to store if it must change. `word` must not be retired.
    // For the unit tests and the loom models; the limiters, which clamp the reading once per
    // attempt, call `decide_elapsed`.
    #[cfg_attr(not(feature = "loom"), allow(dead_code))]
    #[inline]
    pub fn decide(&self, word: u64, now_nanos: u64, n: u64) -> (Decision, Option<u64>) {
        self.decide_elapsed(word, self.elapsed(now_nanos), n)
    }

    /// [`CounterParams::decide`], for a reading already counted from window 0 and clamped.
    #[inline]
    fn decide_elapsed(&self, word: u64, now: u64, n: u64) -> (Decision, Option<u64>) {
        let limit = self.rule.limit();
        let rolled = self.roll(word, now);
        let room = limit.saturating_sub(rolled.current);
        if n > limit || n == 0 {
            // Takes nothing, so it writes nothing; reports what the counter holds.
            let available = room.saturating_sub(self.weighted_previous(&rolled));
            let quota = Decision::allowed(self.rule, available, self.reset_after(&rolled, now));
            if n == 0 {
                return (quota, None);
            }
            let rejection = Rejection::ExceedsLimit {
                requested: n,
                limit,
            };
            return (quota.into_rejected(rejection), None);
        }
        if n <= room && self.weighted_fits(&rolled, room - n) {
            let taken = Rolled {
                current: rolled.current + n,
                ..rolled
            };
            // Fits: the weighted count is at most `room - n`.
            let remaining = room - n - self.weighted_previous(&rolled);
            let decision = Decision::allowed(self.rule, remaining, self.reset_after(&taken, now));
            let new = self.pack(taken.index, taken.current, taken.previous);
            return (decision, Some(new));
        }
        let available = room.saturating_sub(self.weighted_previous(&rolled));
        let decision = Decision::denied(
            self.rule,
            available,
            self.retry_after(&rolled, n, now),
            self.reset_after(&rolled, now),
        );
        (decision, None)
    }

    /// Takes `n` permits from the counter word `word`, if all are available now.
    #[inline]
    pub fn acquire<A: AtomicWord>(&self, word: &A, n: u64, clock: &impl Clock) -> Decision {
        self.reserve(word, n, clock).0
    }

    /// [`CounterParams::acquire`], also returning what a grant changed, so that a plan of
    /// several limits can undo it exactly (see [`CounterParams::undo`]).
    #[inline]
    pub fn reserve<A: AtomicWord>(
        &self,
        word: &A,
        n: u64,
        clock: &impl Clock,
    ) -> (Decision, Option<Reservation>) {
        // One clock reading per attempt, kept on a retry (see `GcraParams::acquire`).
        let now = self.elapsed(clock.now_nanos());
        // Relaxed: see `word::update`.
        word::decide(
            word,
            word.load(Ordering::Relaxed),
            |current| current & RETIRED != 0,
            || Decision::retired(self.rule),
            |current| self.decide_elapsed(current, now, n),
        )
    }

    /// Takes one permit if one is available now: [`CounterParams::acquire`] for `n = 1`,
    /// answering only whether (no [`Decision`] is built, and no division is made), for callers
    /// that ask nothing more.
    #[inline]
    pub(crate) fn acquire_one<A: AtomicWord>(&self, word: &A, clock: &impl Clock) -> Admit {
        // One clock reading per attempt: see `acquire`.
        let now = self.elapsed(clock.now_nanos());
        let limit = self.rule.limit();
        // Relaxed: see `word::update`.
        word::update(word, word.load(Ordering::Relaxed), |current| {
            if current & RETIRED != 0 {
                return Step::Answer(Admit::Retired);
            }
            // As `decide_elapsed` for n = 1.
            let rolled = self.roll(current, now);
            if rolled.current >= limit || !self.weighted_fits(&rolled, limit - rolled.current - 1) {
                Step::Answer(Admit::Denied)
            } else {
                let new = self.pack(rolled.index, rolled.current + 1, rolled.previous);
                Step::Store(new, Admit::Granted)
            }
        })
    }

    /// Undoes the grant that made `reservation` (a reservation across several limits that
    /// another limit refused, `granted` its decision, made at `now_nanos`).
    ///
    /// While the word is still the one the grant stored, the word it replaced is stored again:
    /// exact for every reading, even where the grant had rolled the windows forward. Once
    /// another decision has landed, the `n` permits are taken off the window they were counted
    /// in, if that is still the current one. After a grant its window holds a permit, so its
    /// `reset_after` ends at the start of the window after next: that names the window. Once it
    /// has rolled, the permits weigh only as the previous window's and are left (stricter, never
    /// more generous).
    pub fn undo<A: AtomicWord>(
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
        let reset_at = self
            .elapsed(now_nanos)
            .saturating_add(granted.reset_after_units());
        let Some(granted_in) = (reset_at / self.rule.window_nanos()).checked_sub(2) else {
            return;
        };
        // Relaxed: see `word::update`.
        word::update(word, word.load(Ordering::Relaxed), |current| {
            let (index, count, previous) = self.unpack(current);
            if current & RETIRED != 0 || index != granted_in {
                return Step::Answer(());
            }
            Step::Store(self.pack(index, count.saturating_sub(n), previous), ())
        });
    }

    /// What taking `n` permits at the clock's reading would answer, taking nothing.
    #[inline]
    pub(crate) fn dry_run<A: AtomicWord>(&self, word: &A, n: u64, clock: &impl Clock) -> Decision {
        // Relaxed: a snapshot of one word.
        let current = word.load(Ordering::Relaxed) & !RETIRED;
        self.decide_elapsed(current, self.elapsed(clock.now_nanos()), n)
            .0
    }

    /// What one permit would get now, taking nothing.
    #[inline]
    pub fn peek<A: AtomicWord>(&self, word: &A, clock: &impl Clock) -> Decision {
        let now = self.elapsed(clock.now_nanos());
        word::peek(
            word,
            |current| current & RETIRED != 0,
            || Decision::retired(self.rule),
            |current, n| self.decide_elapsed(current, now, n).0,
        )
    }

    /// Retires the word whatever its state (for a client that moved to another rule). Returns
    /// whether this call did it (false if it already was).
    pub fn retire_now<A: AtomicWord>(word: &A) -> bool {
        word::retire_now(word, |current| {
            (current & RETIRED == 0).then_some(current | RETIRED)
        })
    }

    /// Retires the word if its estimate is 0 at `now_nanos`: nothing granted in the window of
    /// that reading nor in the one before (any count weighs at least one permit, rounded up), so
    /// it is indistinguishable from a fresh word. Returns whether it did. Retiring and acquiring
    /// are read-modify-writes of the same word, so exactly one of them wins.
    pub fn retire_if_idle<A: AtomicWord>(&self, word: &A, now_nanos: u64) -> bool {
        let now = self.elapsed(now_nanos);
        word::retire_if(word, |current| {
            let rolled = self.roll(current, now);
            (current & RETIRED == 0 && rolled.current == 0 && rolled.previous == 0)
                .then_some(current | RETIRED)
        })
    }
}

/// A sliding window counter: the permits of the current window plus those of the previous
/// window, weighted by how much of it the sliding window still covers, at most N.
///
/// Lock-free: one `AtomicU64` (on its own cache line) updated by a compare-and-swap loop; a
/// denied attempt only reads it. Eight bytes per client, like the token bucket and the fixed
/// window, and much smoother than the fixed window across an edge; not as strict as the
/// [sliding window log](crate::SlidingWindowLog), which pays 8 bytes per permit for that.
///
/// # The estimate
///
/// Windows are aligned to the clock's origin: `[0, W)`, `[W, 2W)`, ... At a reading `e`
/// nanoseconds into window k, with `C` permits granted in window k and `P` in window k-1, the
/// sliding window `(t - W, t]` still covers `W - e` nanoseconds of window k-1, and the estimate
/// of the permits in it is
///
/// ```text
/// estimate = ceil(P * (W - e) / W) + C
/// ```
///
/// (integers; the weighted part rounded up, so that the estimate is never below the count it
/// stands for if window k-1's permits were spread evenly). `n` permits are granted iff
/// `estimate + n <= N`.
///
/// # Guarantee
///
/// Instants here are those a grant is counted at: its reading, or the start of the stored window
/// for a reading behind it (see below).
///
/// 1. Every grant at `e` into window k keeps `ceil(P * (W - e) / W) + C <= N`, counting itself.
/// 2. So at most N permits are granted per aligned window (the weighted part is never negative).
/// 3. In any span `[s, s + W)` of one window, at most `2N - ceil(2N / W)` permits are granted
///    (W in nanoseconds; for `W = 1` a span is one aligned window, so at most N). The span
///    holds the end of window k-1, at most `P <= N` permits, and the first `e <= W - 2`
///    nanoseconds of window k, where the last grant needed `C <= N - ceil(P * (W - e) / W)`:
///    in all at most `P + N - ceil(2P / W)`, largest at `P = N`. That worst case is reached by N
///    permits in the last nanosecond of a window and the rest two nanoseconds before the next
///    one ends: for 5 per second, 9 permits within 1 second, where the fixed window lets 10
///    through within 2 nanoseconds.
/// 4. With window k-1's permits spread evenly over it, the estimate is at least the true count
///    of the sliding window, which is then at most N.
///
/// These hold under any interleaving: an attempt reads the word, decides from what it read, and
/// writes only by a compare-and-swap from that very word, so every grant is checked against all
/// the grants before it. A reading from a clock that stepped back (or a thread whose reading is
/// older than the word) is counted at the start of the stored window, where the previous window
/// weighs most: it never resets a count and never grants more than the stored window allows.
/// Past the word's horizon ([`RuleError::MIN_HORIZON`] or more after the limiter's start) time
/// stands still at the horizon's last nanosecond: the counts neither wrap nor expire.
///
/// # What a decision reports
///
/// - `remaining`: `N - estimate` after the decision, the permits a next request could take at
///   this same instant.
/// - `retry_after` (denied): exactly the wait until the estimate first lets the same request
///   through if nothing else is taken, computed in integers: waiting one nanosecond less is
///   still denied. Past the horizon, where that instant never comes, about 584 years
///   (`u64::MAX` nanoseconds), never a small wait that would be a lie.
/// - `reset_after`: until the estimate is 0 (all N available): the start of the window after
///   next while the current window holds a permit, the start of the next while only the
///   previous one does, zero when neither does.
///
/// `try_acquire_n(n)` is all-or-nothing for `n <= N`; `n > N` is rejected with the quota the
/// counter holds; `n = 0` reports it and writes nothing.
///
/// # How
///
/// One `AtomicU64`, laid out as
///
/// ```text
/// [63] retired · [62 .. 2C] window index · [2C-1 .. C] count of that window · [C-1 .. 0] count of the window before
/// ```
///
/// with the counts' width `C` the bits of N (a count never exceeds N), so N is at most
/// `2^31 - 1`; rules whose index would wrap within [`RuleError::MIN_HORIZON`] are refused. An
/// attempt in a later window rolls the word: from the next window, the current count becomes the
/// previous one; from any later one, both are 0.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::{FakeClock, Limiter, Rule, SlidingWindowCounter};
///
/// let clock = FakeClock::starting_at(Duration::from_millis(1_990));
/// let counter = SlidingWindowCounter::new(Rule::per_second(5)?, clock.clone())?;
/// let end_of_window = (0..5).filter(|_| counter.try_acquire()).count();
/// clock.advance(Duration::from_millis(20)); // 10 ms into the next window
/// let start_of_next = (0..5).filter(|_| counter.try_acquire()).count();
/// // The 5 permits of the last window still weigh ceil(5 * 990 / 1000) = 5.
/// assert_eq!((end_of_window, start_of_next), (5, 0));
/// clock.advance(Duration::from_millis(500)); // 510 ms in: they weigh ceil(2.45) = 3
/// assert_eq!((0..5).filter(|_| counter.try_acquire()).count(), 2);
/// # Ok::<(), tollgate::RuleError>(())
/// ```
#[derive(Debug)]
pub struct SlidingWindowCounter<C = crate::MonotonicClock> {
    state: CachePadded<Word>,
    params: CounterParams,
    clock: C,
}

impl<C: Clock> SlidingWindowCounter<C> {
    /// An empty counter for `rule`, reading time from `clock`.
    pub fn new(rule: Rule, clock: C) -> Result<Self, RuleError> {
        let params = CounterParams::new(rule)?.starting_at(clock.now_nanos());
        Ok(SlidingWindowCounter {
            state: CachePadded::new(Word::new(0)),
            params,
            clock,
        })
    }
}

standalone_limiter!(SlidingWindowCounter);

one_word_method!(CounterParams);
one_word_service_method!(CounterParams, fresh: empty_since, idle: retire_if_idle);

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const SECOND: u64 = 1_000_000_000;

    fn params(limit: u64, window: Duration) -> CounterParams {
        CounterParams::new(Rule::new(limit, window).unwrap()).unwrap()
    }

    #[test]
    fn the_counts_take_the_bits_of_the_limit_and_the_index_the_rest() {
        let counter = params(5, Duration::from_secs(1));
        assert_eq!(counter.count_bits, 3);
        assert_eq!(counter.max_index, (1 << 57) - 1);
        let word = counter.pack(123_456, 5, 4);
        assert_eq!(counter.unpack(word), (123_456, 5, 4));
        assert_eq!(counter.unpack(word | RETIRED), (123_456, 5, 4));
        let widest = params(MAX_LIMIT, Rule::MAX_WINDOW);
        let word = widest.pack(widest.max_index, MAX_LIMIT, MAX_LIMIT);
        assert_eq!(
            word & RETIRED,
            0,
            "a full word leaves the retired flag clear"
        );
        assert_eq!(
            widest.unpack(word),
            (widest.max_index, MAX_LIMIT, MAX_LIMIT)
        );
    }

    #[test]
    fn rules_the_word_cannot_hold_for_ten_years_are_refused() {
        let too_many = CounterParams::new(Rule::per_hour(MAX_LIMIT + 1).unwrap());
        assert!(matches!(
            too_many,
            Err(RuleError::LimitTooLarge { max: MAX_LIMIT, .. })
        ));
        // 31-bit counts leave one index bit: two hours.
        let short = CounterParams::new(Rule::per_hour(MAX_LIMIT).unwrap());
        assert!(matches!(short, Err(RuleError::HorizonTooShort { .. })));
        let fine = CounterParams::new(Rule::new(50, Duration::from_nanos(1)).unwrap());
        assert!(matches!(fine, Err(RuleError::HorizonTooShort { .. })));
    }

    #[test]
    fn the_previous_window_weighs_by_its_overlap_rounded_up() {
        let counter = params(10, Duration::from_secs(1));
        let word = counter.pack(3, 0, 0);
        // 7 permits in window 3, then readings in window 4.
        let (_, word) = counter.decide(word, 3 * SECOND + 10, 7);
        let word = word.unwrap();
        // A quarter into window 4: ceil(7 * 0.75) = ceil(5.25) = 6, so 4 are left.
        let (quarter, _) = counter.decide(word, 4 * SECOND + SECOND / 4, 0);
        assert_eq!(quarter.remaining(), 4);
        let (five, _) = counter.decide(word, 4 * SECOND + SECOND / 4, 5);
        assert!(five.is_denied());
        let (four, stored) = counter.decide(word, 4 * SECOND + SECOND / 4, 4);
        assert!(four.is_allowed());
        assert_eq!(four.remaining(), 0);
        assert_eq!(stored, Some(counter.pack(4, 4, 7)));
        // Once the overlap is at most 5/7 of the window, the 7 weigh 5 and 5 are left.
        let (later, _) = counter.decide(word, 4 * SECOND + 2 * SECOND / 7 + 1, 0);
        assert_eq!(later.remaining(), 5);
    }

    /// Takes permits one at a time at `now` until one is denied; how many were granted.
    fn take_all(counter: &CounterParams, word: &mut u64, now: u64) -> u64 {
        let mut granted = 0;
        while let (decision, Some(new)) = counter.decide(*word, now, 1) {
            assert!(decision.is_allowed());
            *word = new;
            granted += 1;
        }
        granted
    }

    #[test]
    fn the_worst_span_of_one_window_holds_2n_minus_ceil_2n_over_w() {
        for (limit, window) in [(5, SECOND), (4, 4)] {
            let counter = params(limit, Duration::from_nanos(window));
            let mut word = 0;
            // N in the last nanosecond of window 0, then what is left two nanoseconds before
            // window 1 ends: all within the span [W - 1, 2W - 1).
            let at_end = take_all(&counter, &mut word, window - 1);
            let before_next_end = take_all(&counter, &mut word, 2 * window - 2);
            assert_eq!(at_end, limit);
            assert_eq!(
                at_end + before_next_end,
                2 * limit - (2 * limit).div_ceil(window),
                "{limit} per {window} ns"
            );
        }
    }

    #[test]
    fn a_window_rolls_its_count_into_the_previous_one_and_later_ones_forget_both() {
        let counter = params(5, Duration::from_secs(1));
        let word = counter.pack(3, 4, 2);
        assert_eq!(
            counter.roll(word, 4 * SECOND + 7),
            Rolled {
                index: 4,
                current: 0,
                previous: 4,
                elapsed: 7
            }
        );
        assert_eq!(
            counter.roll(word, 5 * SECOND + 7),
            Rolled {
                index: 5,
                current: 0,
                previous: 0,
                elapsed: 7
            }
        );
    }

    #[test]
    fn a_stale_reading_is_counted_at_the_start_of_the_newest_window() {
        let counter = params(2, Duration::from_secs(1));
        let stored = counter.pack(5, 1, 2);
        // A reading in window 4 (behind the stored window 5) neither resets nor escapes the counts:
        // it is weighed as at the start of window 5, where the previous window counts in full.
        let rolled = counter.roll(stored, 4 * SECOND + SECOND / 2);
        assert_eq!((rolled.index, rolled.elapsed), (5, 0));
        let (stale, new) = counter.decide(stored, 4 * SECOND + SECOND / 2, 1);
        assert!(stale.is_denied());
        assert_eq!(new, None);
    }

    #[test]
    fn retry_after_is_the_first_instant_the_estimate_admits() {
        let counter = params(10, Duration::from_secs(1));
        // 7 previous, 3 current at 0.25 s: ceil(5.25) + 3 = 9; 2 more wait until the weight is
        // floor(5 * 1e9 / 7) ns.
        let word = counter.pack(4, 3, 7);
        let now = 4 * SECOND + SECOND / 4;
        let (denied, _) = counter.decide(word, now, 2);
        let wait = u64::try_from(denied.retry_after().as_nanos()).unwrap();
        assert_eq!(now + wait, 4 * SECOND + SECOND - 5 * SECOND / 7);
        assert!(counter.decide(word, now + wait - 1, 2).0.is_denied());
        assert!(counter.decide(word, now + wait, 2).0.is_allowed());
        // 8 do not fit beside the 3 of this window at all: wait for the next, where the 3 weigh
        // ceil(3 * (W - e) / W) <= 2, at e = W - floor(2e9 / 3).
        let (denied, _) = counter.decide(word, now, 8);
        let wait = u64::try_from(denied.retry_after().as_nanos()).unwrap();
        assert_eq!(now + wait, 5 * SECOND + SECOND - 2 * SECOND / 3);
        assert!(counter.decide(word, now + wait - 1, 8).0.is_denied());
        assert!(counter.decide(word, now + wait, 8).0.is_allowed());
        // All 10 wait until the window after next, where both counts are gone.
        let (denied, _) = counter.decide(word, now, 10);
        assert_eq!(now + nanos(denied.retry_after()), 6 * SECOND);
        assert_eq!(now + nanos(denied.reset_after()), 6 * SECOND);
    }

    fn nanos(duration: Duration) -> u64 {
        u64::try_from(duration.as_nanos()).unwrap()
    }

    #[test]
    fn at_the_horizon_time_stands_still_and_a_denial_says_it_is_for_good() {
        // 17-bit counts leave 29 index bits: 2^29 seconds, 17 years.
        let counter = params(100_000, Duration::from_secs(1));
        assert_eq!(counter.max_index, (1 << 29) - 1);
        assert_eq!(counter.last_nanos, (1 << 29) * SECOND - 1);
        let (all, word) = counter.decide(0, u64::MAX, 100_000);
        assert!(all.is_allowed());
        let word = word.unwrap();
        assert_eq!(counter.unpack(word), (counter.max_index, 100_000, 0));
        assert_eq!(all.reset_after(), Duration::from_nanos(u64::MAX));
        let (denied, new) = counter.decide(word, u64::MAX, 1);
        assert!(denied.is_denied());
        assert_eq!(new, None);
        assert_eq!(denied.retry_after(), Duration::from_nanos(u64::MAX));
    }

    #[test]
    fn an_idle_word_retires_and_a_busy_one_does_not() {
        let counter = params(2, Duration::from_secs(1));
        let word = Word::new(counter.pack(3, 1, 0));
        // Window 4 still weighs window 3's permit.
        assert!(!counter.retire_if_idle(&word, 4 * SECOND + SECOND / 2));
        assert!(counter.retire_if_idle(&word, 5 * SECOND));
        assert!(
            counter
                .acquire(&word, 1, &crate::FakeClock::new())
                .is_retired()
        );
    }
}
