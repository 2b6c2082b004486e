//! [`TokenBucket`]: exact GCRA in one atomic word.
//!
//! Guarantee: an exact token bucket; at most `N + floor(N*s/W)` permits in any span `s`, and
//! never more than N at once.
//!
//! The full statement, and how the code keeps it under any interleaving, are documented on
//! [`TokenBucket`], where users read them.

// The parameter types and `AtomicWord` are public only for the `loom` feature's re-exports.
#![cfg_attr(not(feature = "loom"), allow(unreachable_pub))]

use std::num::{NonZeroU32, NonZeroU64};

use crate::clock::Clock;
use crate::decision::{Admit, Decision, Rejection, Retired, Scale};
use crate::error::RuleError;
use crate::method::Method;
use crate::method::standalone::{Standalone, Wraps};
use crate::method::word::{self, Reservation, Step};
use crate::sync::{AtomicWord, Ordering, OwnedWord};
use crate::{Algorithm, Rule};

/// The TAT of a retired bucket: no acquire can succeed from it (see `retire_if_idle`).
const RETIRED: u64 = u64::MAX;

/// The fallback mode's rounding may make the refill at most 1/1000 slower than the rule; a rule
/// it would round more (above about 10^7 permits per second of window) is refused.
const MAX_SLOWDOWN_DENOMINATOR: u128 = 1_000;

/// The largest full bucket, in ticks.
const MAX_BURST_TICKS: u64 = 1 << 62;

/// The latest instant a bucket can tell apart, in ticks. A later reading is clamped to it: time
/// then stands still, so the bucket stops refilling rather than wrapping (which could grant
/// without bound). With `now <= 2^63` and a TAT at most `N*T <= 2^62` ahead of it, no sum below
/// can overflow, nor reach `RETIRED`.
const HORIZON_TICKS: u64 = 1 << 63;

/// The constants of one rule, in ticks. Immutable, shared by every state that follows the rule.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcraParams {
    rule: Rule,
    /// Ticks per nanosecond (`N / g`, or 1 in the fallback mode).
    ticks_per_nano: u64,
    /// One token's refill time, in ticks.
    token_ticks: u64,
    /// A full bucket's refill time (`N * T`), in ticks.
    burst_ticks: u64,
    /// The largest debt (TAT ahead of now) that still has room for one more token:
    /// `N*T - T`, made once here for the one-permit decision.
    max_debt_for_one: u64,
    /// The longest time after the origin, in nanoseconds, whose ticks lie within the horizon
    /// (`HORIZON_TICKS / ticks_per_nano`): comparing a reading with it clamps to the horizon
    /// without checking the multiplication for overflow.
    horizon_nanos: u64,
    /// The clock reading tick 0 stands for: the limiter's (or service's) start, so that the
    /// horizon is counted from there, wherever the clock's own origin lies.
    origin_nanos: u64,
    /// `ticks_per_nano` and `token_ticks` as the units decisions report in (see [`Decision`]),
    /// made once here rather than on every decision.
    scale: Scale,
}

/// The greatest common divisor (Euclid), for the exact tick scale.
pub(crate) fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl GcraParams {
    /// The same parameters for a bucket whose timeline starts at the clock reading
    /// `origin_nanos` (its own start): readings before it count as its start, and its horizon
    /// lies [`RuleError::MIN_HORIZON`] or more after it.
    pub fn starting_at(self, origin_nanos: u64) -> GcraParams {
        GcraParams {
            origin_nanos,
            ..self
        }
    }

    /// Derives the tick scale for `rule`, or explains why the bucket cannot honour it.
    pub fn new(rule: Rule) -> Result<GcraParams, RuleError> {
        let limit = rule.limit();
        let window = rule.window_nanos();
        let min_horizon = crate::clock::duration_to_nanos(RuleError::MIN_HORIZON);

        let g = gcd(limit, window);
        let exact_ticks_per_nano = limit / g;
        if let Some(burst) = exact_ticks_per_nano.checked_mul(window)
            && burst <= MAX_BURST_TICKS
            && HORIZON_TICKS / exact_ticks_per_nano >= min_horizon
        {
            return Ok(GcraParams::with_ticks(
                rule,
                exact_ticks_per_nano,
                window / g,
            ));
        }

        // Fallback: the finest tick that still lasts the horizon and rounds each token's refill
        // by at most 1/1000, each token rounded up to whole ticks so the bucket never refills
        // faster than the rule. The rounding error is not monotonic in the tick (it depends on
        // `window * ticks mod limit`), so every tick is tried, finest first: at most 29 of them.
        let max_ticks_per_nano = HORIZON_TICKS / min_horizon;
        let mut bucket_too_large = false;
        for ticks_per_nano in (1..=max_ticks_per_nano).rev() {
            let window_ticks = u128::from(window) * u128::from(ticks_per_nano);
            let token_ticks = window_ticks.div_ceil(u128::from(limit));
            let burst = token_ticks * u128::from(limit);
            if burst > u128::from(MAX_BURST_TICKS) {
                bucket_too_large = true;
                continue;
            }
            // How much slower than the rule the rounding makes the refill.
            if (burst - window_ticks) * MAX_SLOWDOWN_DENOMINATOR > window_ticks {
                continue;
            }
            // Fits: token_ticks <= burst <= 2^62.
            return Ok(GcraParams::with_ticks(
                rule,
                ticks_per_nano,
                token_ticks as u64,
            ));
        }
        if bucket_too_large
            && limit <= window
            && window.div_ceil(limit).saturating_mul(limit) > MAX_BURST_TICKS
        {
            // Even at one tick per nanosecond the full bucket, each token's refill rounded up
            // to whole nanoseconds, overflows: only windows over 146 years get here. The longest
            // window that fits is the largest multiple of the limit within the bound (a rate
            // above one permit per nanosecond is too fine instead, below).
            return Err(RuleError::WindowTooLong {
                window: rule.window(),
                max: std::time::Duration::from_nanos(MAX_BURST_TICKS / limit * limit),
            });
        }
        Err(RuleError::RateTooHigh {
            algorithm: Algorithm::TokenBucket,
            limit,
            window: rule.window(),
        })
    }

    /// The parameters for `rule` at `ticks_per_nano` (at most `HORIZON_TICKS / MIN_HORIZON`, 29)
    /// with one token `token_ticks` long (a full bucket, `limit * token_ticks`, at most 2^62):
    /// both checked by [`GcraParams::new`], which alone calls this.
    fn with_ticks(rule: Rule, ticks_per_nano: u64, token_ticks: u64) -> GcraParams {
        // Both are at least 1 and ticks_per_nano fits in 32 bits, as the caller checked; `MIN`
        // (1) stands in should either ever fail that.
        let scale = Scale {
            ticks_per_nano: u32::try_from(ticks_per_nano)
                .ok()
                .and_then(NonZeroU32::new)
                .unwrap_or(NonZeroU32::MIN),
            permit: NonZeroU64::new(token_ticks).unwrap_or(NonZeroU64::MIN),
        };
        GcraParams {
            rule,
            ticks_per_nano,
            token_ticks,
            burst_ticks: token_ticks * rule.limit(),
            max_debt_for_one: token_ticks * (rule.limit() - 1),
            horizon_nanos: HORIZON_TICKS / ticks_per_nano,
            origin_nanos: 0,
            scale,
        }
    }

    /// Whether the refill rate is the rule's exactly (see [`TokenBucket`]).
    pub fn is_exact(&self) -> bool {
        self.token_ticks.checked_mul(self.rule.limit())
            == self.ticks_per_nano.checked_mul(self.rule.window_nanos())
    }

    /// The TAT of a bucket that is full from `since_nanos` on, and holds any earlier reading to
    /// what it would have been owed by then: at least as strict as any bucket that was full at
    /// `since_nanos`. A service seeds new clients with it (see `RateLimiterService::sweep`).
    pub fn full_since(&self, since_nanos: u64) -> u64 {
        self.now_ticks(since_nanos)
    }

    /// A clock reading in ticks since the bucket's origin, clamped to the horizon.
    #[inline]
    fn now_ticks(&self, now_nanos: u64) -> u64 {
        let nanos = now_nanos.saturating_sub(self.origin_nanos);
        // `nanos * ticks_per_nano <= HORIZON_TICKS` exactly when `nanos <= horizon_nanos` (its
        // floor), so the product is used only when it cannot have wrapped: the same clamp as a
        // saturating multiplication and a `min`, without the overflow check.
        if nanos > self.horizon_nanos {
            HORIZON_TICKS
        } else {
            nanos.wrapping_mul(self.ticks_per_nano)
        }
    }

    /// The units decisions report in: ticks, and token-sized parts of the bucket (divided only
    /// when a caller asks for the figures; see [`Decision`]).
    #[inline]
    fn scale(&self) -> Scale {
        self.scale
    }

    /// The one-permit paths' compare-and-swap at the reading `now_nanos` (one reading per
    /// attempt, as in `acquire`): a grant answers `granted()`, a TAT too far ahead for one more
    /// token `refused(TAT)`, a retired word `Retired`.
    #[inline(always)]
    fn take_one<A: AtomicWord, T>(
        &self,
        tat: &A,
        now_nanos: u64,
        granted: impl Fn() -> T,
        refused: impl Fn(u64) -> T,
    ) -> Result<T, Retired> {
        let now = self.now_ticks(now_nanos);
        // As `decide` for n = 1 (which never exceeds the limit): the debt after the grant,
        // `max(TAT, now) - now + T`, must fit in a full bucket, `N*T`; that is, the TAT may lie
        // at most `N*T - T` ahead of `now`. `now <= 2^63` and `N*T <= 2^62`, so no sum wraps.
        let latest_tat = now + self.max_debt_for_one;
        // Relaxed: see `word::update`.
        word::update(tat, tat.load(Ordering::Relaxed), |current| {
            if current > latest_tat {
                // A retired word (`u64::MAX`) lies beyond every `latest_tat`, so it is told
                // apart here, off the granting path.
                return Step::Answer(if current == RETIRED {
                    Err(Retired)
                } else {
                    Ok(refused(current))
                });
            }
            // The grant moves the TAT one token on from `max(TAT, now)`: at most `now + N*T`.
            Step::Store(current.max(now) + self.token_ticks, Ok(granted()))
        })
    }

    /// [`decide`](GcraParams::decide)'s refusal of one permit at `now_nanos` from a bucket whose
    /// TAT is `tat`, for [`Method::acquire_one_quiet`]: out of line, so that the grant's path,
    /// which builds no decision, stays small enough to be inlined into the service's lookup.
    #[cfg(feature = "tower")]
    #[cold]
    #[inline(never)]
    fn refusal_of_one(&self, tat: u64, now_nanos: u64) -> Decision {
        self.decide(tat, now_nanos, 1).0
    }

    /// Retires the bucket whatever its state, as [`Method::retire_now`] does; the TAT it retired
    /// (`None` if it already was).
    pub fn retire_returning<A: AtomicWord>(&self, tat: &A) -> Option<u64> {
        word::retire_now(tat, |current| (current != RETIRED).then_some(RETIRED))
    }

    /// The earliest clock reading a fresh bucket ([`full_since`](GcraParams::full_since)) may be
    /// made as of and hold at most one limit's worth more than the bucket whose TAT is `tat`,
    /// for every reading: the instant its TAT was a full bucket ago (`TAT - N * T`), rounded up
    /// to a nanosecond. It is no later than the reading of the grant that stored the TAT, which
    /// left at most a full bucket of debt.
    pub fn counted_up_to(&self, tat: u64) -> u64 {
        self.reading_at_tick(tat.saturating_sub(self.burst_ticks))
    }

    /// The earliest clock reading at or after tick `ticks` of the timeline.
    fn reading_at_tick(&self, ticks: u64) -> u64 {
        self.origin_nanos
            .saturating_add(ticks.div_ceil(self.ticks_per_nano))
    }

    /// Of the TAT `tat` holds now (one load): its [`counted_up_to`](GcraParams::counted_up_to),
    /// and the earliest clock reading at which the bucket is full, indistinguishable from a
    /// fresh one (`retire_if_idle` would retire it there and at every later reading, and at no
    /// earlier one); `None` when it is retired.
    pub fn counted_and_idle_from<A: AtomicWord>(&self, tat: &A) -> Option<(u64, u64)> {
        // Relaxed: a snapshot, for an eviction's choice of victim only.
        let current = tat.load(Ordering::Relaxed);
        (current != RETIRED).then(|| (self.counted_up_to(current), self.reading_at_tick(current)))
    }

    /// The pure decision: what taking `n` permits at `now_nanos` from a bucket whose TAT is `tat`
    /// answers, and the TAT to store if it must change.
    #[inline]
    pub fn decide(&self, tat: u64, now_nanos: u64, n: u64) -> (Decision, Option<u64>) {
        let now = self.now_ticks(now_nanos);
        // A TAT ahead of `now` is the debt still being refilled; one behind is a full bucket.
        let base = tat.max(now);
        let debt = base - now;
        if n == 0 || n > self.rule.limit() {
            // Takes nothing, so it writes nothing, even when a clock that stepped back makes the
            // debt exceed a full bucket; it reports what the bucket holds.
            let available = self.burst_ticks.saturating_sub(debt);
            let decision = Decision::allowed_in(self.rule, self.scale(), available, debt);
            if n == 0 {
                return (decision, None);
            }
            let rejection = Rejection::ExceedsLimit {
                requested: n,
                limit: self.rule.limit(),
            };
            return (decision.into_rejected(rejection), None);
        }
        // n <= N, so n*T <= N*T <= 2^62, and debt <= N*T unless the clock stepped back:
        // saturating only matters for a corrupt word, and then it denies.
        let new_debt = debt.saturating_add(n * self.token_ticks);
        if new_debt <= self.burst_ticks {
            let remaining = self.burst_ticks - new_debt;
            let decision = Decision::allowed_in(self.rule, self.scale(), remaining, new_debt);
            (decision, Some(now + new_debt))
        } else {
            let remaining = self.burst_ticks.saturating_sub(debt);
            let retry_after = new_debt - self.burst_ticks;
            let decision =
                Decision::denied_in(self.rule, self.scale(), remaining, retry_after, debt);
            (decision, None)
        }
    }
}

/// A token bucket: capacity N (the rule's limit), refilled N per window, starting full.
///
/// Lock-free: one `AtomicU64` (on its own cache line) updated by a compare-and-swap loop; a denied
/// attempt only reads it.
///
/// # Guarantee
///
/// A bucket of capacity N (the rule's limit) that refills N tokens per window W, starting full.
/// In any span of length `s`, at most `N + floor(N * s / W)` permits are granted, and a client
/// that waits gets exactly the tokens the refill rate owes it, never more than N at once (an hour
/// of silence is a full bucket, not an hour of requests).
///
/// # How
///
/// A token bucket is exactly GCRA: the state is one number, the *theoretical arrival time* (TAT),
/// the instant at which the bucket would be full again. Granting `n` permits at `now` moves it to
/// `max(TAT, now) + n*T` (T: one token's refill time), allowed iff that lies at most one window
/// (`N*T`) ahead of `now`. The word is updated by a compare-and-swap loop; a denial only reads.
///
/// Time is kept in integer *ticks* so that T is exact: with `g = gcd(N, W_ns)`, one tick is
/// `g/N` ns, one token is `T = W_ns/g` ticks and a full bucket `N*T` ticks. When that scale would
/// overflow within [`RuleError::MIN_HORIZON`] of uptime (an N that shares few factors with W, such
/// as 999 per second), the bucket falls back to the finest tick that lasts that long (1/29 ns),
/// with each token's refill rounded up to whole ticks: it may then refill slower than the rule,
/// by at most 1/1000 (rules that would round more are refused), never faster.
/// [`TokenBucket::is_exact`] says which mode a bucket is in.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::{FakeClock, Limiter, Rule, TokenBucket};
///
/// let clock = FakeClock::new();
/// let bucket = TokenBucket::new(Rule::per_second(5)?, clock.clone())?;
/// assert_eq!((0..10).filter(|_| bucket.try_acquire()).count(), 5);
/// clock.advance(Duration::from_millis(200)); // one token's refill time
/// assert_eq!((0..10).filter(|_| bucket.try_acquire()).count(), 1);
/// # Ok::<(), tollgate::RuleError>(())
/// ```
#[derive(Debug)]
pub struct TokenBucket<C = crate::MonotonicClock> {
    limiter: Standalone<GcraParams, C>,
}

impl<C: Clock> TokenBucket<C> {
    /// A full bucket for `rule`, reading time from `clock`.
    ///
    /// # Errors
    ///
    /// [`RuleError::RateTooHigh`] when no tick scale that lasts [`RuleError::MIN_HORIZON`] keeps the
    /// refill within 1/1000 of the rule, [`RuleError::WindowTooLong`] when the full bucket cannot be
    /// counted.
    pub fn new(rule: Rule, clock: C) -> Result<Self, RuleError> {
        Ok(TokenBucket {
            limiter: Standalone::new(rule, clock)?,
        })
    }

    /// Whether the refill rate is the rule's exactly, or rounded down (see [`TokenBucket`]).
    pub fn is_exact(&self) -> bool {
        self.limiter.params().is_exact()
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        self.limiter.clock()
    }
}

// What gives `TokenBucket` the `Limiter` trait (see `Wraps`).
impl<C: Clock> Wraps for TokenBucket<C> {
    type Method = GcraParams;
    type Clock = C;

    fn standalone(&self) -> &Standalone<GcraParams, C> {
        &self.limiter
    }
}

impl Method for GcraParams {
    type State<A: AtomicWord> = A;

    const CAN_UNDO: bool = true;

    fn new(rule: Rule, start_nanos: u64) -> Result<Self, RuleError> {
        Ok(GcraParams::new(rule)?.starting_at(start_nanos))
    }

    fn rule(&self) -> Rule {
        self.rule
    }

    fn origin_nanos(&self) -> u64 {
        self.origin_nanos
    }

    fn fresh<A: OwnedWord>(&self, since_nanos: u64) -> A {
        A::new(self.full_since(since_nanos))
    }

    #[inline]
    fn acquire<A: AtomicWord>(
        &self,
        tat: &A,
        n: u64,
        clock: &impl Clock,
    ) -> Result<Decision, Retired> {
        // The clock is read once per attempt, not again on a retry: a retry means another thread
        // moved the TAT, and a reading older than the state it meets only makes the decision
        // stricter. Re-reading (about 10 ns) inside the loop let the other core take the line
        // back every time, and two threads granting on one bucket ran 4x slower than this.
        Ok(self.reserve(tat, n, clock)?.0)
    }

    /// [`Method::acquire`], also returning what a grant changed, so that a plan of several
    /// limits can undo it exactly (see [`Method::undo`]).
    #[inline]
    fn reserve<A: AtomicWord>(
        &self,
        tat: &A,
        n: u64,
        clock: &impl Clock,
    ) -> Result<(Decision, Option<Reservation>), Retired> {
        let now = clock.now_nanos();
        // Relaxed: see `word::update`.
        word::decide(
            tat,
            tat.load(Ordering::Relaxed),
            |current| current == RETIRED,
            |current| self.decide(current, now, n),
        )
    }

    /// [`Method::acquire`] for `n = 1`, answering only whether (no [`Decision`] is built).
    #[inline]
    fn acquire_one<A: AtomicWord>(&self, tat: &A, clock: &impl Clock) -> Result<Admit, Retired> {
        self.take_one(tat, clock.now_nanos(), || Admit::Granted, |_| Admit::Denied)
    }

    /// [`Method::acquire_one`]'s compare-and-swap, answering a grant `granted()` and a refusal
    /// with the whole decision `acquire` would give, made from the TAT the refusal read and the
    /// same reading of the clock. A grant's figures (the debt, the permits left, the reset) are
    /// work a response without fields never reads: this is the tower layer's path for a request
    /// of one permit when allowed responses carry none.
    #[cfg(feature = "tower")]
    // Always inlined, its refusal kept out of line: the tower layer's grant path (see
    // `Checked::acquire` in the service).
    #[inline(always)]
    fn acquire_one_quiet<A: AtomicWord, T>(
        &self,
        tat: &A,
        clock: &impl Clock,
        granted: impl Fn() -> T,
        refused: impl Fn(Decision) -> T,
    ) -> Result<T, Retired> {
        let now_nanos = clock.now_nanos();
        self.take_one(tat, now_nanos, granted, |current| {
            refused(self.refusal_of_one(current, now_nanos))
        })
    }

    /// Undoes the grant that made `reservation` (a reservation across several limits that
    /// another limit refused), while the TAT is still the one it stored: no other grant has
    /// landed since, and the TAT it replaced answers every reading as if it had never been made.
    /// Once another grant has landed, that grant may have started from the clock rather than from
    /// this one's TAT (a bucket that had refilled meanwhile), and moving the TAT back would take
    /// that grant's permits too; the reservation's permits are then kept, and refill at the
    /// bucket's rate (stricter, never more generous). The reservation says all the give-back
    /// needs: the permits, the decision and its reading are taken as the other methods take them.
    fn undo<A: AtomicWord>(
        &self,
        tat: &A,
        _n: u64,
        _granted: &Decision,
        reservation: Reservation,
        _now_nanos: u64,
    ) {
        word::restore(tat, reservation);
    }

    /// Moves the TAT back by `n` tokens, never behind the reading (a full bucket): a refund
    /// can make the bucket full, never fuller.
    fn refund<A: AtomicWord>(&self, tat: &A, n: u64, clock: &impl Clock) {
        let now = self.now_ticks(clock.now_nanos());
        let back = n.saturating_mul(self.token_ticks);
        // Relaxed: see `word::update`.
        word::update(tat, tat.load(Ordering::Relaxed), |current| {
            if current == RETIRED || current <= now {
                return Step::Answer(());
            }
            Step::Store(current.saturating_sub(back).max(now), ())
        });
    }

    #[inline]
    fn dry_run<A: AtomicWord>(
        &self,
        tat: &A,
        n: u64,
        clock: &impl Clock,
    ) -> Result<Decision, Retired> {
        // Relaxed: a snapshot of one word.
        match tat.load(Ordering::Relaxed) {
            RETIRED => Err(Retired),
            current => Ok(self.decide(current, clock.now_nanos(), n).0),
        }
    }

    #[inline]
    fn peek<A: AtomicWord>(&self, tat: &A, clock: &impl Clock) -> Result<Decision, Retired> {
        let now = clock.now_nanos();
        word::peek(
            tat,
            |current| current == RETIRED,
            |current, n| self.decide(current, now, n).0,
        )
    }

    /// Retires the bucket whatever its state (for a client that moved to another rule).
    fn retire_now<A: AtomicWord>(&self, tat: &A) -> bool {
        self.retire_returning(tat).is_some()
    }

    /// Retires the bucket if it is full at `now_nanos` (indistinguishable from a fresh one), so
    /// that it can be dropped without any client noticing.
    ///
    /// Retiring and acquiring are exchanges on the same word, so exactly one of them wins: an
    /// acquire either lands before (the bucket is no longer full, retiring fails) or meets the
    /// retired word and moves to a fresh bucket, which is equivalent.
    fn retire_if_idle<A: AtomicWord>(&self, tat: &A, now_nanos: u64) -> bool {
        let now = self.now_ticks(now_nanos);
        word::retire_if(tat, |current| {
            (current != RETIRED && current <= now).then_some(RETIRED)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn params(limit: u64, window: Duration) -> GcraParams {
        GcraParams::new(Rule::new(limit, window).unwrap()).unwrap()
    }

    #[test]
    fn ticks_are_nanoseconds_when_the_limit_divides_the_window() {
        let five_per_second = params(5, Duration::from_secs(1));
        assert_eq!(five_per_second.ticks_per_nano, 1);
        assert_eq!(five_per_second.token_ticks, 200_000_000);
        assert_eq!(five_per_second.burst_ticks, 1_000_000_000);
        assert!(five_per_second.is_exact());
    }

    #[test]
    fn ticks_are_finer_when_it_does_not() {
        // 3 per second: one tick is a third of a nanosecond, one token a second of ticks.
        let three_per_second = params(3, Duration::from_secs(1));
        assert_eq!(three_per_second.ticks_per_nano, 3);
        assert_eq!(three_per_second.token_ticks, 1_000_000_000);
        assert!(three_per_second.is_exact());
    }

    #[test]
    fn the_fallback_uses_the_finest_tick_that_lasts_the_horizon() {
        let odd = params(999, Duration::from_secs(1));
        assert_eq!(odd.ticks_per_nano, 29);
        assert_eq!(odd.token_ticks, 29_029_030); // ceil(29e9 / 999)
        assert!(!odd.is_exact());
        let horizon = Duration::from_nanos(HORIZON_TICKS / odd.ticks_per_nano);
        assert!(horizon >= RuleError::MIN_HORIZON);
    }

    #[test]
    fn decide_moves_the_arrival_time_by_one_token_per_permit() {
        let bucket = params(5, Duration::from_secs(1));
        let (first, tat) = bucket.decide(0, 0, 5);
        assert!(first.is_allowed());
        assert_eq!(first.remaining(), 0);
        assert_eq!(tat, Some(1_000_000_000));
        let (denied, unchanged) = bucket.decide(1_000_000_000, 0, 1);
        assert!(denied.is_denied());
        assert_eq!(unchanged, None, "a denial writes nothing");
        assert_eq!(denied.retry_after(), Duration::from_millis(200));
        let (later, tat) = bucket.decide(1_000_000_000, 200_000_000, 1);
        assert!(later.is_allowed());
        assert_eq!(tat, Some(1_200_000_000));
    }

    /// Rules in each tick scale: nanoseconds, a third of one, and the fallback's 1/29.
    fn scales() -> [GcraParams; 3] {
        [
            params(5, Duration::from_secs(1)),
            params(3, Duration::from_secs(1)),
            params(999, Duration::from_secs(1)),
        ]
    }

    #[test]
    fn now_ticks_clamps_to_the_horizon_as_a_saturating_product_would() {
        for bucket in scales().map(|bucket| bucket.starting_at(1_000)) {
            let edge = bucket.origin_nanos + bucket.horizon_nanos;
            for now_nanos in [0, 999, 1_000, 1_001, edge - 1, edge, edge + 1, u64::MAX] {
                let reference = now_nanos
                    .saturating_sub(bucket.origin_nanos)
                    .saturating_mul(bucket.ticks_per_nano)
                    .min(HORIZON_TICKS);
                assert_eq!(
                    bucket.now_ticks(now_nanos),
                    reference,
                    "{bucket:?} at {now_nanos}"
                );
            }
        }
    }

    /// `take` (a one-permit path) on every bucket of `scales` at readings around the clock's
    /// edges, from a TAT around every edge of the bucket: full, room for exactly one token,
    /// none, a TAT left by a clock that stepped back, and the largest TAT a grant can store.
    /// Each answer goes to `check` with `decide`'s decision for one permit; the word must then
    /// hold what `decide` stores (the TAT unchanged for a refusal), and a retired word answers
    /// `Retired` and stays retired.
    fn at_every_edge<T>(
        take: impl Fn(&GcraParams, &crate::sync::Word, &crate::clock::FakeClock) -> Result<T, Retired>,
        check: impl Fn(Result<T, Retired>, &Decision, &str),
    ) {
        use crate::sync::Word;

        for bucket in scales() {
            let clock = crate::clock::FakeClock::new();
            let token = bucket.token_ticks;
            let burst = bucket.burst_ticks;
            for now_nanos in [0, 1, 1 << 40, u64::MAX] {
                clock.set(Duration::from_nanos(now_nanos));
                let now = bucket.now_ticks(now_nanos);
                let tats = [
                    0,
                    now,
                    now + burst - token - 1,
                    now + burst - token,
                    now + burst - token + 1,
                    now + burst,
                    HORIZON_TICKS + burst,
                    RETIRED - 1,
                ];
                for tat in tats {
                    let context = format!("{bucket:?}: TAT {tat} at {now_nanos}");
                    let word = Word::new(tat);
                    let answer = take(&bucket, &word, &clock);
                    let (decision, stored) = bucket.decide(tat, now_nanos, 1);
                    check(answer, &decision, &context);
                    assert_eq!(
                        word.load(Ordering::Relaxed),
                        stored.unwrap_or(tat),
                        "{context}"
                    );
                }
                let retired = Word::new(RETIRED);
                assert!(take(&bucket, &retired, &clock).is_err(), "{bucket:?}");
                assert_eq!(retired.load(Ordering::Relaxed), RETIRED);
            }
        }
    }

    #[test]
    fn acquire_one_answers_as_decide_for_one_permit() {
        at_every_edge(
            |bucket, word, clock| bucket.acquire_one(word, clock),
            |answer, decision, context| {
                let expected = if decision.is_allowed() {
                    Admit::Granted
                } else {
                    Admit::Denied
                };
                assert_eq!(answer, Ok(expected), "{context}");
            },
        );
    }

    /// The tower layer's path: a grant stores what `decide` stores and says only that it was
    /// allowed; a refusal answers `decide`'s whole decision.
    #[cfg(feature = "tower")]
    #[test]
    fn acquire_one_quiet_grants_as_decide_and_refuses_with_its_decision() {
        at_every_edge(
            |bucket, word, clock| bucket.acquire_one_quiet(word, clock, || None, Some),
            |answer, decision, context| {
                let expected = decision.is_denied().then_some(*decision);
                assert_eq!(answer, Ok(expected), "{context}");
            },
        );
    }

    #[test]
    fn a_reading_past_the_horizon_stands_still_instead_of_wrapping() {
        let bucket = params(5, Duration::from_secs(1));
        let mut tat = 0;
        let mut granted = 0;
        for _ in 0..10 {
            let (decision, new) = bucket.decide(tat, u64::MAX, 1);
            granted += u64::from(decision.is_allowed());
            tat = new.unwrap_or(tat);
        }
        assert_eq!(granted, 5);
        assert!(tat < RETIRED);
    }
}
