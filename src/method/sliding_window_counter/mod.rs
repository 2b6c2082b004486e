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

#[cfg(test)]
mod tests;
mod weighting;

use crate::clock::Clock;
use crate::decision::{Admit, Decision, Rejection, Retired};
use crate::error::RuleError;
use crate::method::Method;
use crate::method::standalone::{Standalone, Wraps};
use crate::method::word::{self, Reservation, Step};
use crate::sync::{AtomicWord, Ordering, OwnedWord};
use crate::{Algorithm, Rule};
use weighting::Rolled;

/// Set on a word retired for eviction; no permit is granted from it.
const RETIRED: u64 = word::RETIRED_FLAG;

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

    /// Takes `n` permits (at most its count) off the current window's count, if window `index`
    /// is the stored window of a live word: an undo's, or a refund's (see `Method::undo`,
    /// `Method::refund`).
    fn take_off<A: AtomicWord>(&self, word: &A, index: u64, n: u64) {
        // Relaxed: see `word::update`.
        word::update(word, word.load(Ordering::Relaxed), |current| {
            let (stored, count, previous) = self.unpack(current);
            if current & RETIRED != 0 || stored != index || count == 0 {
                return Step::Answer(());
            }
            Step::Store(self.pack(stored, count.saturating_sub(n), previous), ())
        });
    }

    /// A clock reading as nanoseconds since window 0 starts, clamped to the horizon; readings
    /// before window 0 count as its start.
    #[inline]
    fn elapsed(&self, now_nanos: u64) -> u64 {
        now_nanos
            .saturating_sub(self.origin_nanos)
            .min(self.last_nanos)
    }

    /// The word of a counter that is empty from `since_nanos` on: identical to a fresh one for
    /// every reading from the start of that reading's window on, and for an earlier reading (a
    /// clock stepped back, another core's older reading) at least as strict as any word retired
    /// as idle at or before `since_nanos`. It stands in the window before, with nothing counted
    /// there and the window before that full: a reading from the window of `since_nanos` on rolls
    /// both away, and an earlier one weighs a full previous window, as it would weigh whatever a
    /// retired word's previous window held. A service seeds new clients with it.
    pub fn empty_since(&self, since_nanos: u64) -> u64 {
        let index = (self.elapsed(since_nanos) / self.rule.window_nanos()).min(self.max_index);
        match index {
            0 => self.pack(0, 0, 0),
            index => self.pack(index - 1, 0, self.rule.limit()),
        }
    }

    /// Retires the word whatever its state, as [`Method::retire_now`] does; the live word it
    /// retired (`None` if it already was).
    pub fn retire_returning<A: AtomicWord>(&self, word: &A) -> Option<u64> {
        word::retire_flagged_now(word)
    }

    /// The earliest clock reading a fresh word ([`empty_since`](CounterParams::empty_since))
    /// may be made as of and hold at most one limit's worth more than `word`, for every reading:
    /// the start of `word`'s current window. (Made as of it, the fresh word counts the window
    /// before as full, and refuses every earlier reading.)
    pub fn counted_up_to(&self, word: u64) -> u64 {
        let (index, _, _) = self.unpack(word);
        self.window_start(index)
    }

    /// The clock reading window `index` of the timeline starts at.
    fn window_start(&self, index: u64) -> u64 {
        self.origin_nanos
            .saturating_add(index.saturating_mul(self.rule.window_nanos()))
    }

    /// Of what `word` holds now (one load): its [`counted_up_to`](CounterParams::counted_up_to),
    /// and the earliest clock reading at which it is indistinguishable from a fresh word
    /// (`retire_if_idle` would retire it there and at every later reading, and at no earlier
    /// one): the start of its window if neither it nor the window before counts anything, of
    /// the next window if only the window before does, else of the one after; `None` when it is
    /// retired.
    pub fn counted_and_idle_from<A: AtomicWord>(&self, word: &A) -> Option<(u64, u64)> {
        // A snapshot, for an eviction's choice of victim only.
        let (index, current, previous) = self.unpack(word::load_live(word).ok()?);
        let windows_on = if current > 0 {
            2
        } else {
            u64::from(previous > 0)
        };
        let idle_index = index.saturating_add(windows_on);
        Some((self.window_start(index), self.window_start(idle_index)))
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
    limiter: Standalone<CounterParams, C>,
}

impl<C: Clock> SlidingWindowCounter<C> {
    /// An empty counter for `rule`, reading time from `clock`.
    pub fn new(rule: Rule, clock: C) -> Result<Self, RuleError> {
        Ok(SlidingWindowCounter {
            limiter: Standalone::new(rule, clock)?,
        })
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        self.limiter.clock()
    }
}

// What gives `SlidingWindowCounter` the `Limiter` trait (see `Wraps`).
impl<C: Clock> Wraps for SlidingWindowCounter<C> {
    type Method = CounterParams;
    type Clock = C;

    fn standalone(&self) -> &Standalone<CounterParams, C> {
        &self.limiter
    }
}

impl Method for CounterParams {
    type State<A: AtomicWord> = A;

    const CAN_UNDO: bool = true;

    fn new(rule: Rule, start_nanos: u64) -> Result<Self, RuleError> {
        Ok(CounterParams::new(rule)?.starting_at(start_nanos))
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
        Ok(self.reserve(word, n, clock)?.0)
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
        // One clock reading per attempt, kept on a retry (see `GcraParams`' `acquire`).
        let now = self.elapsed(clock.now_nanos());
        // Relaxed: see `word::update`.
        word::decide(
            word,
            word.load(Ordering::Relaxed),
            |current| current & RETIRED != 0,
            |current| self.decide_elapsed(current, now, n),
        )
    }

    /// [`Method::acquire`] for `n = 1`, answering only whether (no [`Decision`] is built, and no
    /// division is made).
    #[inline]
    fn acquire_one<A: AtomicWord>(&self, word: &A, clock: &impl Clock) -> Result<Admit, Retired> {
        // One clock reading per attempt: see `reserve`.
        let now = self.elapsed(clock.now_nanos());
        let limit = self.rule.limit();
        // Relaxed: see `word::update`.
        word::update(word, word.load(Ordering::Relaxed), |current| {
            if current & RETIRED != 0 {
                return Step::Answer(Err(Retired));
            }
            // As `decide_elapsed` for n = 1.
            let rolled = self.roll(current, now);
            if rolled.current >= limit || !self.weighted_fits(&rolled, limit - rolled.current - 1) {
                Step::Answer(Ok(Admit::Denied))
            } else {
                let new = self.pack(rolled.index, rolled.current + 1, rolled.previous);
                Step::Store(new, Ok(Admit::Granted))
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
        let reset_at = self
            .elapsed(now_nanos)
            .saturating_add(granted.reset_after_units());
        let Some(granted_in) = (reset_at / self.rule.window_nanos()).checked_sub(2) else {
            return;
        };
        self.take_off(word, granted_in, n);
    }

    /// Takes `n` permits off the current window's count while the stored window is the
    /// reading's; once it has rolled, its permits weigh only as the previous window's, and are
    /// left (stricter, never more generous); a stored window later than the reading (stored by
    /// a decision whose reading came after this refund's) was not the one refunded.
    fn refund<A: AtomicWord>(&self, word: &A, n: u64, clock: &impl Clock) {
        let now = self.elapsed(clock.now_nanos());
        self.take_off(word, now / self.rule.window_nanos(), n);
    }

    /// Whether the reading lies past the stored window.
    fn would_roll<A: AtomicWord>(&self, word: &A, clock: &impl Clock) -> bool {
        // Relaxed: a snapshot of one word; the caller orders its takings by it, and a word that
        // moves meanwhile only makes the order less useful, never a decision wrong.
        let current = word.load(Ordering::Relaxed) & !RETIRED;
        let (stored, _, _) = self.unpack(current);
        self.roll(current, self.elapsed(clock.now_nanos())).index != stored
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

    /// Retires the word if its estimate is 0 at `now_nanos`: nothing granted in the window of
    /// that reading nor in the one before (any count weighs at least one permit, rounded up), and
    /// its window not later than the reading's, so it is indistinguishable from a fresh word.
    /// Retiring and acquiring are read-modify-writes of the same word, so exactly one of them
    /// wins.
    fn retire_if_idle<A: AtomicWord>(&self, word: &A, now_nanos: u64) -> bool {
        let now = self.elapsed(now_nanos);
        word::retire_if(word, |current| {
            let rolled = self.roll(current, now);
            // A word of a window later than the reading's is never idle at it, even empty (a
            // refund's): it counts an older reading at its own window's start, where a fresh
            // word made as of the reading would give that reading's window a limit of its own.
            let (stored, _, _) = self.unpack(current);
            let ahead = now < stored.saturating_mul(self.rule.window_nanos());
            (current & RETIRED == 0 && !ahead && rolled.current == 0 && rolled.previous == 0)
                .then_some(current | RETIRED)
        })
    }
}
