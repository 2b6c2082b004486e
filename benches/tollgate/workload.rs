//! The workloads: which rule each measurement uses, and how a limiter is brought into the state
//! the measurement needs.
//!
//! Shared by the criterion benches and `examples/throughput.rs` (which include this file by
//! path), so that both measure the same thing.

use std::time::Duration;

use tollgate::{
    Algorithm, Clock, FixedWindow, Limiter, Rule, SlidingWindowCounter, SlidingWindowLog,
    TokenBucket,
};

use crate::ids::{MUTEX, TOLLGATE};
use crate::reference::{
    RefFixedWindow, RefSlidingWindowCounter, RefSlidingWindowLog, RefTokenBucket,
};

pub(crate) use crate::ids::Workload;

/// One permit per nanosecond, with a burst of a full second's worth: no thread here can ask
/// faster than the bucket refills, and the fixed window's count (30 bits for this limit) still
/// leaves an index that lasts 272 years.
const GENEROUS_LIMIT_PER_SECOND: u64 = 1_000_000_000;

/// The sliding log's ring holds one slot per permit and is capped at 65 536 slots, so it cannot
/// take a per-second limit in the billions. An admission is allowed when the slot it reuses (the
/// admission one lap of the ring earlier) has left the window. A lap of 1 024 admissions takes
/// at least 10 µs even at 100 M decisions/s, ten times the 1 µs window, so every slot has always
/// expired when the ring comes round: the allow path, with a ring small enough for L1.
const LOG_SLOTS: u64 = 1024;
const LOG_WINDOW: Duration = Duration::from_micros(1);

/// The sliding window counter's two counts share one word with the window index, so a count has
/// at most 31 bits, and a limit in the billions per second would wrap the index within days. Its
/// allow path is measured within one very long window instead: 2^31 - 1 permits per 292 years,
/// which no measurement here (a few seconds at under 100 M decisions/s) can use up. The hot path
/// is the same as in a short window; only the roll to a new window, once per window, is left out.
const COUNTER_LIMIT: u64 = (1 << 31) - 1;

/// The rule of the deny-heavy workload for every method: once the limiter has granted these 100
/// permits, it denies for an hour, far longer than any measurement.
const EXHAUSTED_LIMIT_PER_HOUR: u64 = 100;

/// The rule `algorithm` is measured with under `workload`.
pub(crate) fn rule(algorithm: Algorithm, workload: Workload) -> Rule {
    let rule = match (workload, algorithm) {
        (Workload::AllowHeavy, Algorithm::SlidingWindowLog) => Rule::new(LOG_SLOTS, LOG_WINDOW),
        (Workload::AllowHeavy, Algorithm::SlidingWindowCounter) => {
            Rule::new(COUNTER_LIMIT, Rule::MAX_WINDOW)
        }
        (Workload::AllowHeavy, _) => Rule::per_second(GENEROUS_LIMIT_PER_SECOND),
        (Workload::DenyHeavy, _) => Rule::per_hour(EXHAUSTED_LIMIT_PER_HOUR),
    };
    rule.expect("the benchmark rules are valid")
}

/// One attempt at one permit: the operation every benchmark times, whatever the limiter.
pub(crate) trait TryAcquireOne: Sync {
    fn try_acquire_one(&self) -> bool;
}

impl<C: Clock> TryAcquireOne for TokenBucket<C> {
    #[inline]
    fn try_acquire_one(&self) -> bool {
        self.try_acquire()
    }
}

impl<C: Clock> TryAcquireOne for FixedWindow<C> {
    #[inline]
    fn try_acquire_one(&self) -> bool {
        self.try_acquire()
    }
}

impl<C: Clock> TryAcquireOne for SlidingWindowLog<C> {
    #[inline]
    fn try_acquire_one(&self) -> bool {
        self.try_acquire()
    }
}

impl<C: Clock> TryAcquireOne for SlidingWindowCounter<C> {
    #[inline]
    fn try_acquire_one(&self) -> bool {
        self.try_acquire()
    }
}

impl<C: Clock + Sync> TryAcquireOne for RefSlidingWindowCounter<C> {
    #[inline]
    fn try_acquire_one(&self) -> bool {
        self.try_acquire()
    }
}

impl<C: Clock + Sync> TryAcquireOne for RefTokenBucket<C> {
    #[inline]
    fn try_acquire_one(&self) -> bool {
        self.try_acquire()
    }
}

impl<C: Clock + Sync> TryAcquireOne for RefFixedWindow<C> {
    #[inline]
    fn try_acquire_one(&self) -> bool {
        self.try_acquire()
    }
}

impl<C: Clock + Sync> TryAcquireOne for RefSlidingWindowLog<C> {
    #[inline]
    fn try_acquire_one(&self) -> bool {
        self.try_acquire()
    }
}

/// Receives each limiter under test, one concrete type at a time (so the timed loop is
/// monomorphised, with no virtual call in it).
pub(crate) trait VisitLimiter {
    /// `implementation` is [`TOLLGATE`] or [`MUTEX`].
    fn visit<L: TryAcquireOne>(&mut self, implementation: &str, limiter: &L);
}

/// Makes tollgate's limiter of `algorithm` and the mutex reference of the same method, both with
/// the workload's rule and reading `clock`, puts each in the state the workload needs, and hands
/// each to `visitor`.
pub(crate) fn visit_limiters<C: Clock + Clone + Sync>(
    algorithm: Algorithm,
    workload: Workload,
    clock: &C,
    visitor: &mut impl VisitLimiter,
) {
    let rule = rule(algorithm, workload);
    let clock = clock.clone();
    match algorithm {
        Algorithm::TokenBucket => {
            visit_prepared(
                workload,
                TOLLGATE,
                &TokenBucket::new(rule, clock.clone()).expect("valid rule"),
                visitor,
            );
            visit_prepared(workload, MUTEX, &RefTokenBucket::new(rule, clock), visitor);
        }
        Algorithm::FixedWindow => {
            visit_prepared(
                workload,
                TOLLGATE,
                &FixedWindow::new(rule, clock.clone()).expect("valid rule"),
                visitor,
            );
            visit_prepared(workload, MUTEX, &RefFixedWindow::new(rule, clock), visitor);
        }
        Algorithm::SlidingWindowLog => {
            visit_prepared(
                workload,
                TOLLGATE,
                &SlidingWindowLog::new(rule, clock.clone()).expect("valid rule"),
                visitor,
            );
            visit_prepared(
                workload,
                MUTEX,
                &RefSlidingWindowLog::new(rule, clock),
                visitor,
            );
        }
        Algorithm::SlidingWindowCounter => {
            visit_prepared(
                workload,
                TOLLGATE,
                &SlidingWindowCounter::new(rule, clock.clone()).expect("valid rule"),
                visitor,
            );
            visit_prepared(
                workload,
                MUTEX,
                &RefSlidingWindowCounter::new(rule, clock),
                visitor,
            );
        }
        other => panic!("no benchmark set-up for {other}"),
    }
}

fn visit_prepared<L: TryAcquireOne>(
    workload: Workload,
    implementation: &str,
    limiter: &L,
    visitor: &mut impl VisitLimiter,
) {
    prepare(workload, limiter);
    visitor.visit(implementation, limiter);
}

/// Puts a fresh `limiter` in the state `workload` measures, and checks that it answers as the
/// workload says: a set-up mistake would otherwise time the wrong path without a word.
pub(crate) fn prepare(workload: Workload, limiter: &impl TryAcquireOne) {
    const CHECKED_ATTEMPTS: usize = 10_000;
    let expect_allowed = match workload {
        Workload::AllowHeavy => true,
        Workload::DenyHeavy => {
            let granted = (0..=EXHAUSTED_LIMIT_PER_HOUR)
                .take_while(|_| limiter.try_acquire_one())
                .count();
            assert_eq!(
                granted as u64, EXHAUSTED_LIMIT_PER_HOUR,
                "a fresh limiter must grant exactly its limit before denying"
            );
            false
        }
    };
    let unexpected = (0..CHECKED_ATTEMPTS)
        .filter(|_| limiter.try_acquire_one() != expect_allowed)
        .count();
    assert_eq!(
        unexpected,
        0,
        "{} workload: {unexpected} of {CHECKED_ATTEMPTS} attempts got the other answer",
        workload.name()
    );
}
