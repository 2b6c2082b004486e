//! Sliding window log (a ring of N timestamps, claimed slot by slot): concurrent acquires never
//! put more than N permits in any span of one window, at one instant, across a lap wrap of the
//! ring with skewed clocks, and while an evictor retires the ring (with a clock lagging the
//! evictor's); an unconditional retire takes effect exactly once; and a batch (all its permits at
//! one time, or none) racing single permits, an evictor or an unconditional retire keeps the same
//! bound, and once the threads are done, the ring reports what it grants, and a denied batch has
//! left no admission behind.
//!
//! An admission is checked at the time the ring recorded it: never earlier than the latest
//! admission, so a reading that lags behind another thread's is recorded at that thread's time.
//! The guarantee is over recorded times. Over raw readings it does not hold under any skew: with
//! N = 2, two admissions at 0, one read at W, then one whose clock lags a little and reads 0.9W
//! (recorded at W) put three raw readings in `[0, W)`.

use loom::sync::Arc;
use loom::thread;
use tollgate::loom_support::{LogParams, LogRing};

use crate::models::{Race, RetireNowRace, RetireRace, Won, prefill};
use crate::support::{
    Admission, Answer, Attempt, FixedClock, Method, WINDOW, assert_within_bound, at, explore, rule,
};

const HALF: u64 = WINDOW / 2;
const QUARTER: u64 = WINDOW / 4;

/// A sliding window log whose rule is `limit` per window.
pub(crate) fn log(limit: u64) -> LogParams {
    LogParams::new(rule(limit)).expect("the sliding log accepts the rule")
}

/// Three threads take one permit each, at one instant, from an empty ring of two.
static THREE_AT_ONE_INSTANT: Race = Race {
    prefill: &[],
    threads: &[at(5 * WINDOW, 1), at(5 * WINDOW, 1), at(5 * WINDOW, 1)],
    won: Won::Always(2),
    preemption_bound: 2,
};

#[test]
fn sliding_log_concurrent_acquires_never_exceed_limit() {
    THREE_AT_ONE_INSTANT.check(log(2));
}

/// A ring of two after three admissions (at 0, W/2, W): head is at position 3, the last slot of
/// lap 1, so the racing claims wrap into lap 2. Three skewed readings from 3W/2 to 2W.
static LAP_WRAP_WITH_SKEW: Race = Race {
    prefill: &[at(0, 1), at(HALF, 1), at(WINDOW, 1)],
    threads: &[
        at(WINDOW + HALF, 1),
        at(2 * WINDOW, 1),
        at(WINDOW + HALF + QUARTER, 1),
    ],
    won: Won::AtMost(2),
    preemption_bound: 2,
};

#[test]
fn sliding_log_never_exceeds_limit_across_lap_wrap_with_skewed_clocks() {
    LAP_WRAP_WITH_SKEW.check(log(2));
}

/// A ring of one after one admission at 0: every claim starts a new lap. Two readings, at W and
/// a half window later: whichever lands first, the other is within its window.
pub(crate) static LAP_WRAP_OF_ONE_SLOT: Race = Race {
    prefill: &[at(0, 1)],
    threads: &[at(WINDOW, 1), at(WINDOW + HALF, 1)],
    won: Won::Always(1),
    preemption_bound: 3,
};

#[test]
fn sliding_log_of_one_never_exceeds_limit_across_lap_wrap() {
    LAP_WRAP_OF_ONE_SLOT.check(log(1));
}

/// A batch of two races two single permits for an empty ring of two, all at one instant. A
/// single that lands between the batch's two claims makes it give its first slot back; the other
/// single may still find that slot claimed (and be denied, the undo's cost) or take it.
static BATCH_AND_SINGLES: Race = Race {
    prefill: &[],
    threads: &[at(5 * WINDOW, 2), at(5 * WINDOW, 1), at(5 * WINDOW, 1)],
    won: Won::AtMost(2),
    preemption_bound: 1,
};

#[test]
fn sliding_log_batch_racing_singles_never_exceeds_limit() {
    BATCH_AND_SINGLES.check(log(2));
}

/// A method that can say how many permits it has at a given reading, taking nothing.
pub(crate) trait Reports: Method {
    /// The permits available at `now`: `remaining` of an attempt for 0 permits.
    fn available(&self, state: &Self::State, now: u64) -> u64;
}

impl Reports for LogParams {
    fn available(&self, ring: &LogRing<loom::sync::atomic::AtomicU64>, now: u64) -> u64 {
        let decided = tollgate::loom_support::Method::acquire(self, ring, 0, &FixedClock(now));
        decided.expect("nothing retires this ring").remaining()
    }
}

/// Threads racing on one ring, one of them with a batch, and then the ring as they left it,
/// checked by the main thread alone:
///
/// - at `settle_at` (after the race), the permits it reports are exactly the permits a drain of
///   single attempts then gets: the figures are true, even after an undo;
/// - at `clear_at`, once every admission made before the race has left the window (and with it
///   the cost of any undo), a drain gets exactly what a log holding only the admissions made
///   would grant: a denied batch left no admission behind.
///
/// Every admission, the drains' included, is held to the bound.
#[derive(Debug)]
pub(crate) struct SettledRace {
    pub(crate) prefill: &'static [Attempt],
    pub(crate) threads: &'static [Attempt],
    pub(crate) settle_at: u64,
    pub(crate) clear_at: u64,
    pub(crate) preemption_bound: usize,
}

impl SettledRace {
    pub(crate) fn check<M: Reports>(&'static self, method: M) {
        explore(self.preemption_bound, move || {
            let state = Arc::new(method.fresh_state());
            let mut admissions = prefill(method, &state, self.prefill);
            let threads: Vec<_> = self
                .threads
                .iter()
                .map(|&attempt| {
                    let state = Arc::clone(&state);
                    thread::spawn(move || method.acquire(&state, attempt.n, attempt.now))
                })
                .collect();
            for thread in threads {
                let answer = thread.join().expect("an acquiring thread panicked");
                assert_ne!(answer, Answer::Retired, "nothing retires this state");
                admissions.extend(answer.admission());
            }
            assert_within_bound(M::BOUND, method.rule(), &admissions);
            let raced = admissions.clone();

            let reported = method.available(&state, self.settle_at);
            let drained = drain(method, &state, self.settle_at, &mut admissions);
            assert_eq!(
                reported, drained,
                "the ring reports {reported} permits at {} but grants {drained}; admissions: \
                 {raced:?}",
                self.settle_at
            );

            let live = admissions
                .iter()
                .filter(|admission| admission.time + WINDOW > self.clear_at)
                .map(|admission| admission.permits)
                .sum::<u64>();
            let expected = method.rule().limit().saturating_sub(live);
            let held = admissions.clone();
            let drained = drain(method, &state, self.clear_at, &mut admissions);
            assert_eq!(
                drained, expected,
                "a denied batch left an admission behind: {drained} permits at {}, where a log \
                 holding {held:?} grants {expected}",
                self.clear_at
            );
            assert_within_bound(M::BOUND, method.rule(), &admissions);
        });
    }
}

/// Takes single permits at `now` until one is denied; returns how many it got, adding them to
/// `admissions`.
fn drain<M: Method>(method: M, state: &M::State, now: u64, admissions: &mut Vec<Admission>) -> u64 {
    let mut drained = 0;
    while let Some(admission) = method.acquire(state, 1, now).admission() {
        admissions.push(admission);
        drained += 1;
        assert!(drained <= method.rule().limit(), "a drain never ends");
    }
    drained
}

/// A ring of three after one admission at 0; at W/2 a batch of two races a single permit. When
/// the single lands between the batch's two claims, the batch gives its first slot back (which
/// stays used until the admission at 0 leaves the window, at W) and is denied.
pub(crate) static BATCH_INTERRUPTED_BY_A_SINGLE: SettledRace = SettledRace {
    prefill: &[at(0, 1)],
    threads: &[at(HALF, 2), at(HALF, 1)],
    settle_at: HALF,
    clear_at: WINDOW,
    preemption_bound: 3,
};

#[test]
fn sliding_log_batch_interrupted_by_a_single_leaves_no_admission_and_true_figures() {
    BATCH_INTERRUPTED_BY_A_SINGLE.check(log(3));
}

/// A ring of two whose newest admission (at W/2) expires at 3W/2, when the evictor may retire
/// it. One thread's clock lags the evictor's (it reads 5W/4), another reads 7W/4.
static RETIRE_WHEN_ALL_EXPIRED: RetireRace = RetireRace {
    prefill: &[at(0, 1), at(HALF, 1)],
    retire_at: WINDOW + HALF,
    acquirers: &[at(WINDOW + QUARTER, 1), at(WINDOW + HALF + QUARTER, 1)],
    preemption_bound: 2,
};

#[test]
fn sliding_log_acquire_racing_retire_never_over_admits() {
    RETIRE_WHEN_ALL_EXPIRED.check(log(2));
}

/// Two threads retire a ring of one unconditionally while a third takes its one permit.
static RETIRE_NOW_WHILE_ACQUIRING: RetireNowRace = RetireNowRace {
    prefill: &[],
    acquirer: at(WINDOW, 1),
    preemption_bound: 2,
};

#[test]
fn sliding_log_unconditional_retire_takes_effect_once() {
    RETIRE_NOW_WHILE_ACQUIRING.check(log(1));
}

/// A batch whose clock lags the evictor's by a window races it and a single permit on an empty
/// ring of two: the evictor retires the ring before the batch or after it (the batch's
/// admissions have expired by its reading), or finds the single's admission and leaves the ring
/// be; a batch that meets the retired ring moves to the fresh one, which denies its lagging
/// reading. (A retire between the batch's two claims takes two preemptions here, over a minute
/// of checking; `RETIRE_NOW_WHILE_TAKING_A_BATCH` reaches one with a single preemption.)
static RETIRE_RACING_A_BATCH: RetireRace = RetireRace {
    prefill: &[],
    retire_at: 2 * WINDOW,
    acquirers: &[at(WINDOW, 2), at(2 * WINDOW + HALF, 1)],
    preemption_bound: 1,
};

#[test]
fn sliding_log_batch_racing_retire_never_over_admits() {
    RETIRE_RACING_A_BATCH.check(log(2));
}

/// Two threads retire a ring of two unconditionally while a third takes a batch of two: the
/// batch gets both permits before the retire or is told the ring is retired, never denied, also
/// when the retire lands between its two claims (the batch then gives its first slot back).
static RETIRE_NOW_WHILE_TAKING_A_BATCH: RetireNowRace = RetireNowRace {
    prefill: &[],
    acquirer: at(WINDOW, 2),
    preemption_bound: 1,
};

#[test]
fn sliding_log_unconditional_retire_racing_a_batch_takes_effect_once() {
    RETIRE_NOW_WHILE_TAKING_A_BATCH.check(log(2));
}
