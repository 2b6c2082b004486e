//! [`SlidingWindowLog`]: a fixed-capacity ring of atomic timestamps.
//!
//! Guarantee: at most N permits in every span of one window, wherever it starts.
//!
//! The full statement, and how the code keeps it under any interleaving, are documented on
//! [`SlidingWindowLog`], where users read them.

// The parameter types and `AtomicWord` are public only for the `loom` feature's re-exports.
#![cfg_attr(not(feature = "loom"), allow(unreachable_pub))]

mod ring;

use crossbeam_utils::Backoff;

use crate::clock::Clock;
use crate::decision::{Admit, Decision, Rejection, Retired};
use crate::error::RuleError;
use crate::method::Method;
use crate::method::standalone::{Standalone, Wraps};
use crate::sync::{AtomicWord, Ordering, OwnedWord};
use crate::{Algorithm, Rule};
pub use ring::LogRing;
use ring::{
    EXPIRY_MASK, LAP_MARK, RETIRED_EXPIRY, RunStop, Snapshot, index_of, is_retired, lap_mark,
};

/// The constants of one rule.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogParams {
    rule: Rule,
    /// Slots in the ring: the rule's limit.
    capacity: u64,
    /// The latest admission time the ring can record; later readings are clamped to it, and
    /// time then stands still (no slot expires), so the ring denies rather than wraps.
    latest_time: u64,
    /// The clock reading time 0 stands for: the limiter's (or service's) start, so that the
    /// horizon is counted from there, wherever the clock's own origin lies.
    origin_nanos: u64,
}

impl LogParams {
    /// The same parameters for a log whose timeline starts at the clock reading `origin_nanos`
    /// (its own start): readings before it count as its start, and its horizon lies
    /// [`RuleError::MIN_HORIZON`] or more after it.
    pub fn starting_at(self, origin_nanos: u64) -> LogParams {
        LogParams {
            origin_nanos,
            ..self
        }
    }

    /// How long from `now` until a slot expiring at `expiry` is free: never (`u64::MAX`) for an
    /// expiry past the latest admission time, where time stands still and no slot expires.
    #[inline]
    fn wait_until(&self, expiry: u64, now: u64) -> u64 {
        if expiry > self.latest_time {
            u64::MAX
        } else {
            expiry - now.min(expiry)
        }
    }

    /// A clock reading as nanoseconds since the log's origin.
    #[inline]
    fn elapsed(&self, now_nanos: u64) -> u64 {
        now_nanos.saturating_sub(self.origin_nanos)
    }

    /// The most permits a sliding window log accepts: 65 536 (512 KiB of slots per client).
    pub const MAX_LIMIT: u64 = 1 << 16;

    /// Checks that the ring can honour `rule`.
    pub fn new(rule: Rule) -> Result<LogParams, RuleError> {
        if rule.limit() > Self::MAX_LIMIT {
            return Err(RuleError::LimitTooLarge {
                algorithm: Algorithm::SlidingWindowLog,
                limit: rule.limit(),
                max: Self::MAX_LIMIT,
            });
        }
        let latest_time = (RETIRED_EXPIRY - 1).saturating_sub(rule.window_nanos());
        if u128::from(latest_time) < RuleError::MIN_HORIZON.as_nanos() {
            return Err(RuleError::HorizonTooShort {
                algorithm: Algorithm::SlidingWindowLog,
                limit: rule.limit(),
                window: rule.window(),
                horizon: std::time::Duration::from_nanos(latest_time),
            });
        }
        Ok(LogParams {
            rule,
            capacity: rule.limit(),
            latest_time,
            origin_nanos: 0,
        })
    }

    /// One permit at `now` (elapsed time), as [`Method::acquire`] takes it, with every figure
    /// of its decision but, unless `count_remaining`, the permits left after an admission (a
    /// search of the ring, which an allowed decision then reports as 0).
    #[inline]
    fn decide_one<A: AtomicWord>(
        &self,
        ring: &LogRing<A>,
        now: u64,
        count_remaining: bool,
    ) -> Result<Decision, Retired> {
        Ok(match self.claim_one(ring, now) {
            OneClaim::Retired => return Err(Retired),
            OneClaim::Denied { expiry, latest } => {
                let retry_after = self.wait_until(expiry, now);
                let reset_after = latest.saturating_sub(now);
                Decision::denied(self.rule, 0, retry_after, reset_after)
            }
            OneClaim::Claimed { head, time } => {
                let remaining = if count_remaining {
                    let oldest = ring.index_after(index_of(head), 1);
                    self.expired_after(ring, oldest, ring.capacity() - 1, time)
                } else {
                    0
                };
                let reset_after = (time + self.rule.window_nanos()).saturating_sub(now);
                Decision::allowed(self.rule, remaining, reset_after)
            }
        })
    }

    /// Claims the slot at `head` for one admission at `now` (elapsed time), if the admission
    /// L places back has left the window: the single permit's side of the protocol documented
    /// on [`SlidingWindowLog`]. Inlined into each caller, which builds only the answer it needs.
    #[inline(always)]
    fn claim_one<A: AtomicWord>(&self, ring: &LogRing<A>, now: u64) -> OneClaim {
        let backoff = Backoff::new();
        loop {
            let Snapshot { head, slot, latest } = ring.snapshot();
            if is_retired(latest) || is_retired(slot) {
                return OneClaim::Retired;
            }
            let mark = lap_mark(head);
            if slot & LAP_MARK == mark {
                // Claimed in this lap already; `head` lags behind the claim. Help it on.
                ring.help_head_past(head);
                continue;
            }
            let latest = latest & EXPIRY_MASK;
            let latest_time = latest.saturating_sub(self.rule.window_nanos());
            let time = now.max(latest_time).min(self.latest_time);
            let expiry = slot & EXPIRY_MASK;
            if expiry > time {
                return OneClaim::Denied { expiry, latest };
            }
            let claimed = mark | (time + self.rule.window_nanos());
            // AcqRel: the claim publishes this admission's time to whoever next reads the slot,
            // through it or through `head` (see `snapshot`). Failure: another thread claimed the
            // slot first; start over from a fresh snapshot.
            if ring
                .slot_at(head)
                .compare_exchange(slot, claimed, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                // A failure to move `head` on means a helper did it.
                ring.help_head_past(head);
                return OneClaim::Claimed { head, time };
            }
            backoff.spin();
        }
    }

    /// Claims `n` slots (1 < n ≤ the ring's capacity) for one admission time, or none: the
    /// batch's side of the protocol documented on [`SlidingWindowLog`] under "Batches".
    fn acquire_batch<A: AtomicWord>(
        &self,
        ring: &LogRing<A>,
        n: u64,
        now: u64,
    ) -> Result<Decision, Retired> {
        let window = self.rule.window_nanos();
        let backoff = Backoff::new();
        loop {
            let Snapshot { head, slot, latest } = ring.snapshot();
            if is_retired(latest) || is_retired(slot) {
                return Err(Retired);
            }
            if slot & LAP_MARK == lap_mark(head) {
                ring.help_head_past(head);
                continue;
            }
            let latest_expiry = latest & EXPIRY_MASK;
            let time = now
                .max(latest_expiry.saturating_sub(window))
                .min(self.latest_time);
            // The slots from `head` on are sorted by expiry, so n of them are free iff the n-th is.
            let last = ring.position_after(head, n - 1);
            // Acquire: as for the slots in `snapshot`.
            let last_slot = ring.slot_at(last).load(Ordering::Acquire);
            if is_retired(last_slot) {
                return Err(Retired);
            }
            if last_slot & LAP_MARK == lap_mark(last) {
                // Claimed in its lap already: the ring has moved on since the snapshot, and the
                // next one will see it.
                A::wait_for_writer();
                continue;
            }
            let last_expiry = last_slot & EXPIRY_MASK;
            let reset_after = latest_expiry.saturating_sub(now);
            if last_expiry > time {
                let remaining = self.expired_after(ring, index_of(head), n - 1, time);
                let retry_after = self.wait_until(last_expiry, now);
                return Ok(Decision::denied(
                    self.rule,
                    remaining,
                    retry_after,
                    reset_after,
                ));
            }
            let expiry = time + window;
            let (taken, stop) = ring.claim_run(head, slot, n, time, expiry);
            let Some(stop) = stop else {
                let after_last = ring.index_after(index_of(last), 1);
                let remaining = self.expired_after(ring, after_last, ring.capacity() - n, time);
                return Ok(Decision::allowed(
                    self.rule,
                    remaining,
                    expiry - now.min(expiry),
                ));
            };
            // Never below the admission before the batch, nor below any expiry the claims
            // replaced (each was at most `time`): see "Batches" on `SlidingWindowLog`.
            ring.give_back(head, taken, expiry, latest_expiry.max(time));
            match stop {
                RunStop::Retired => return Err(Retired),
                // Another claim landed inside the run: try again from where the ring is now.
                RunStop::Taken => backoff.spin(),
                // Only after the ring has come round during the run (see "Batches").
                RunStop::Live(expiry) => {
                    return Ok(Decision::denied(
                        self.rule,
                        0,
                        self.wait_until(expiry, now),
                        reset_after,
                    ));
                }
            }
        }
    }

    /// How many of the `count` slots from index `start` on (in ring order, oldest first) have
    /// expired at `time`. The slots are sorted by expiry, so a binary search finds the first live
    /// one. A snapshot: concurrent claims may change the answer right after.
    #[inline]
    fn expired_after<A: AtomicWord>(
        &self,
        ring: &LogRing<A>,
        start: usize,
        count: u64,
        time: u64,
    ) -> u64 {
        let (mut low, mut high) = (0, count);
        while low < high {
            let middle = low + (high - low) / 2;
            let index = ring.index_after(start, middle as usize);
            // Relaxed: an advisory count; no decision rests on it.
            let expiry = ring.slot(index).load(Ordering::Relaxed) & EXPIRY_MASK;
            if expiry <= time {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        low
    }

    /// The answer to `n` permits, more than the ring holds, reporting what it holds at `now`.
    fn reject<A: AtomicWord>(
        &self,
        ring: &LogRing<A>,
        n: u64,
        now: u64,
    ) -> Result<Decision, Retired> {
        let rejection = Rejection::ExceedsLimit {
            requested: n,
            limit: self.rule.limit().min(ring.capacity()),
        };
        // A retired ring answers as such: the service moves to a fresh one, and answers from it.
        Ok(self.peek_at(ring, now, true)?.into_rejected(rejection))
    }

    /// `available_only`: report as an allowed `n = 0` attempt (the permits available) even when
    /// none is.
    fn peek_at<A: AtomicWord>(
        &self,
        ring: &LogRing<A>,
        now: u64,
        available_only: bool,
    ) -> Result<Decision, Retired> {
        let Snapshot { head, slot, latest } = ring.snapshot();
        if is_retired(latest) || is_retired(slot) {
            return Err(Retired);
        }
        // If the slot at head was already claimed in this lap, the ring is one admission further
        // on than `head` says: that slot holds the latest admission, the next one the oldest.
        let (oldest, latest) = if slot & LAP_MARK == lap_mark(head) {
            (ring.index_after(index_of(head), 1), slot)
        } else {
            (index_of(head), latest)
        };
        let latest_time = (latest & EXPIRY_MASK).saturating_sub(self.rule.window_nanos());
        let time = now.max(latest_time).min(self.latest_time);
        let remaining = self.expired_after(ring, oldest, ring.capacity(), time);
        let reset_after = (latest & EXPIRY_MASK).saturating_sub(now);
        if remaining > 0 || available_only {
            return Ok(Decision::allowed(self.rule, remaining, reset_after));
        }
        let oldest_slot = ring.slot(oldest).load(Ordering::Relaxed);
        if is_retired(oldest_slot) {
            // Retired since the snapshot: its mark is no admission's expiry.
            return Err(Retired);
        }
        let expiry = oldest_slot & EXPIRY_MASK;
        Ok(Decision::denied(
            self.rule,
            0,
            self.wait_until(expiry, now),
            reset_after,
        ))
    }
}

/// What one permit's claim found (see `LogParams::claim_one`).
enum OneClaim {
    /// The ring has been retired.
    Retired,
    /// The slot at `head` had not expired: its `expiry`, and the `latest` admission's expiry.
    Denied { expiry: u64, latest: u64 },
    /// The slot at `head` was claimed for an admission at `time`.
    Claimed { head: u64, time: u64 },
}

/// A sliding window log: at most N permits in every span of length W.
///
/// Lock-free: a ring of N atomic timestamps; an admission is one compare-and-swap on its slot.
///
///
/// # Guarantee
///
/// At most N permits in *every* span of length W, wherever it starts: the edge burst a
/// [fixed window](crate::FixedWindow) lets through is held to N. This holds under any
/// interleaving of threads and any skew between their clock readings. Memory is one 8-byte slot
/// per permit of the limit, so the limit is capped at [`SlidingWindowLog::MAX_LIMIT`].
///
/// [`Limiter::try_acquire_n`](crate::Limiter::try_acquire_n) takes `n` permits (up to the limit) all at one admission time, or
/// none. In a ring no other thread touches meanwhile it answers exactly as a log kept under a
/// lock would. A batch that another thread's claim interrupts may spend up to `n - 1` slots
/// without admitting anything; see [Batches](#batches) for what that costs, and for how long.
///
/// # How
///
/// The ring has L = N slots; `head` is the position of the next admission (its lap and slot).
/// The admission at slot `i` of lap `k` replaces the one at slot `i` of lap `k - 1`. Each slot
/// word is
///
/// ```text
/// [63] lap mark · [62 .. 0] expiry: the admission's time + W, in nanoseconds
/// ```
///
/// where the lap mark alternates per pass over the ring so that a slot tells whether it has
/// already been claimed in the current lap. An admission at time `t` is allowed iff the slot's
/// expiry is at most `t`: the admission L places back has left the window.
///
/// **The claim is the compare-and-swap on the slot itself.** Each admission is one successful
/// exchange that raises its slot's expiry by at least W, so a span of length W holds at most one
/// admission per slot, at most L in all, whatever the interleaving. `head` is only a hint of which
/// slot to claim next; whoever sees the slot at `head` already claimed helps move `head` on. Slot
/// values only grow, but for a batch's undo (below), which never takes a slot below the value its
/// claim replaced: whatever value an exchange finds, no admission the slot recorded expires later.
/// An admission's time is never earlier than the previous admission's, which keeps the ring
/// sorted by time (and a stepped-back clock harmless).
///
/// # Batches
///
/// A batch of `n` permits at time `t` (the later of the reading and the latest admission's time,
/// as for one permit) first reads the `n`-th slot from `head`: the ring is sorted, so `n` slots
/// are free iff that one has expired at `t`. If it has not, the batch is denied having written
/// nothing, with `retry_after` the time until it expires (the earliest instant `n` slots can be
/// free) and `remaining` the slots free before it. Otherwise it claims the `n` slots one by one,
/// each with exactly a single admission's compare-and-swap at time `t`, moving `head` on after
/// each. If another claim takes one of them first, the batch undoes its claims (first slot
/// first) and tries again from a fresh snapshot.
///
/// **The undo.** An undone slot keeps this lap's mark, and its expiry becomes the later of the
/// latest admission's before the batch and `t`. It therefore stays used for this lap (no claim of
/// this lap, which only ever takes the slot at `head`, can take it), it is free in the next lap
/// from that expiry on, and the ring stays sorted, so `remaining`, `peek` and the evictor's test
/// of the latest admission stay exact. The bound is kept because a slot's expiry never drops
/// below that of an admission it recorded: the undone value is at least what the claim replaced
/// (at most `t`, or the claim would have failed). An undo that finds its slot taken by a later
/// lap's claim leaves it be.
///
/// **Its cost.** Only a batch interrupted by another claim undoes anything, so a ring used by one
/// thread at a time answers exactly like a log under a lock. An interrupted try spends at most
/// `n - 1` slots: while its claims stand, and after the undo until the latest admission before
/// the batch leaves the window (at most one window after `t`), they count as admissions, so the
/// log may deny up to `n - 1` permits per interrupted try that the limit would allow. It never
/// admits more. After that, the slots are free again as soon as `head` comes round to them.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::{FakeClock, Limiter, Rule, SlidingWindowLog};
///
/// let clock = FakeClock::starting_at(Duration::from_millis(1_990));
/// let log = SlidingWindowLog::new(Rule::per_second(5)?, clock.clone())?;
/// let before = (0..5).filter(|_| log.try_acquire()).count();
/// clock.advance(Duration::from_millis(20));
/// let after = (0..5).filter(|_| log.try_acquire()).count();
/// assert_eq!(before + after, 5); // the edge burst is held to the limit
/// # Ok::<(), tollgate::RuleError>(())
/// ```
#[derive(Debug)]
pub struct SlidingWindowLog<C = crate::MonotonicClock> {
    limiter: Standalone<LogParams, C>,
}

impl<C: Clock> SlidingWindowLog<C> {
    /// The most permits a sliding window log accepts (one 8-byte slot each).
    pub const MAX_LIMIT: u64 = LogParams::MAX_LIMIT;

    /// An empty log for `rule`, reading time from `clock`.
    ///
    /// # Errors
    ///
    /// [`RuleError::LimitTooLarge`] when the limit exceeds [`SlidingWindowLog::MAX_LIMIT`],
    /// [`RuleError::HorizonTooShort`] for a window too long to leave [`RuleError::MIN_HORIZON`] of
    /// time.
    pub fn new(rule: Rule, clock: C) -> Result<Self, RuleError> {
        Ok(SlidingWindowLog {
            limiter: Standalone::new(rule, clock)?,
        })
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        self.limiter.clock()
    }
}

// What gives `SlidingWindowLog` the `Limiter` trait (see `Wraps`).
impl<C: Clock> Wraps for SlidingWindowLog<C> {
    type Method = LogParams;
    type Clock = C;

    fn standalone(&self) -> &Standalone<LogParams, C> {
        &self.limiter
    }
}

impl Method for LogParams {
    type State<A: AtomicWord> = LogRing<A>;

    /// A claimed slot cannot be given back without unsorting the ring for other claims in flight
    /// (a batch undoes only its own run, before anyone else claims after it).
    const CAN_UNDO: bool = false;

    fn new(rule: Rule, start_nanos: u64) -> Result<Self, RuleError> {
        Ok(LogParams::new(rule)?.starting_at(start_nanos))
    }

    fn rule(&self) -> Rule {
        self.rule
    }

    fn origin_nanos(&self) -> u64 {
        self.origin_nanos
    }

    fn fresh<A: OwnedWord>(&self, since_nanos: u64) -> LogRing<A> {
        LogRing::empty_since(self, since_nanos)
    }

    /// What a ring that is empty since `since_nanos` would report, without making one: a ring
    /// is an allocation (up to 512 KiB), not to be made for a client that may never come back.
    fn fresh_report(&self, zero_permits: bool, since_nanos: u64, clock: &impl Clock) -> Decision {
        let now = self.elapsed(clock.now_nanos());
        let expiry = self.elapsed(since_nanos).min(self.latest_time);
        if now >= expiry {
            Decision::allowed(self.rule, self.capacity, 0)
        } else if zero_permits {
            Decision::allowed(self.rule, 0, expiry - now)
        } else {
            Decision::denied(self.rule, 0, expiry - now, expiry - now)
        }
    }

    /// Takes `n` permits at the clock's reading: one slot, if the admission L places back has
    /// left the window; `n` slots, all at one time or none (see "Batches" on
    /// [`SlidingWindowLog`]).
    #[inline]
    fn acquire<A: AtomicWord>(
        &self,
        ring: &LogRing<A>,
        n: u64,
        clock: &impl Clock,
    ) -> Result<Decision, Retired> {
        // One clock reading per attempt, kept on a retry (see `GcraParams`' `acquire`): the
        // admission's time is at least the latest admission's anyway.
        let now = self.elapsed(clock.now_nanos());
        match n {
            0 => return self.peek_at(ring, now, true),
            1 => {}
            _ if n <= self.rule.limit() && n <= ring.capacity() => {
                return self.acquire_batch(ring, n, now);
            }
            _ => return self.reject(ring, n, now),
        }
        self.decide_one(ring, now, true)
    }

    /// One permit, answering only whether: the same claim as [`Method::acquire`]'s, without the
    /// figures a [`Decision`] reports (counting the permits left is a search of the ring that
    /// "allowed?" does not need).
    #[inline]
    fn acquire_one<A: AtomicWord>(
        &self,
        ring: &LogRing<A>,
        clock: &impl Clock,
    ) -> Result<Admit, Retired> {
        let now = self.elapsed(clock.now_nanos());
        match self.claim_one(ring, now) {
            OneClaim::Retired => Err(Retired),
            OneClaim::Denied { .. } => Ok(Admit::Denied),
            OneClaim::Claimed { .. } => Ok(Admit::Granted),
        }
    }

    /// A grant's permits left are not counted (`decide_one` without its search of the ring).
    #[cfg(feature = "tower")]
    fn acquire_one_quiet<A: AtomicWord, T>(
        &self,
        ring: &LogRing<A>,
        clock: &impl Clock,
        granted: impl Fn() -> T,
        refused: impl Fn(Decision) -> T,
    ) -> Result<T, Retired> {
        let decision = self.decide_one(ring, self.elapsed(clock.now_nanos()), false)?;
        Ok(crate::method::quiet(decision, granted, refused))
    }

    #[inline]
    fn peek<A: AtomicWord>(
        &self,
        ring: &LogRing<A>,
        clock: &impl Clock,
    ) -> Result<Decision, Retired> {
        self.peek_at(ring, self.elapsed(clock.now_nanos()), false)
    }

    fn dry_run<A: AtomicWord>(
        &self,
        ring: &LogRing<A>,
        _n: u64,
        clock: &impl Clock,
    ) -> Result<Decision, Retired> {
        // Only plans of several limits look before they take, and the log takes none.
        self.peek(ring, clock)
    }

    fn retire_now<A: AtomicWord>(&self, ring: &LogRing<A>) -> bool {
        ring.retire(None)
    }

    /// Retires the ring if every admission has expired at `now_nanos`; see [`LogRing::retire`].
    fn retire_if_idle<A: AtomicWord>(&self, ring: &LogRing<A>, now_nanos: u64) -> bool {
        // Clamped as admissions' times are: at the horizon time stands still, so an admission
        // made there never expires, and the ring is never idle.
        ring.retire(Some(self.elapsed(now_nanos).min(self.latest_time)))
    }
}
