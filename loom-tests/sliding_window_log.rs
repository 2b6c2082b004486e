//! Sliding window log (a ring of N timestamps, claimed slot by slot): concurrent acquires never
//! put more than N permits in any span of one window, at one instant, across a lap wrap of the
//! ring with skewed clocks, and while an evictor retires the ring (with a clock lagging the
//! evictor's); an unconditional retire takes effect exactly once; and a batch, which the ring
//! rejects, takes nothing from racing single permits.
//!
//! An admission is checked at the time the ring recorded it: never earlier than the latest
//! admission, so a reading that lags behind another thread's is recorded at that thread's time.
//! The guarantee is over recorded times. Over raw readings it does not hold under any skew: with
//! N = 2, two admissions at 0, one read at W, then one whose clock lags a little and reads 0.9W
//! (recorded at W) put three raw readings in `[0, W)`.

use tollgate::loom_support::LogParams;

use crate::models::{Race, RetireNowRace, RetireRace, Won};
use crate::support::{WINDOW, at, rule};

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

/// A batch of two, which the ring rejects, races two single permits for a ring of two.
static BATCH_AND_SINGLES: Race = Race {
    prefill: &[],
    threads: &[at(5 * WINDOW, 2), at(5 * WINDOW, 1), at(5 * WINDOW, 1)],
    won: Won::Always(2),
    preemption_bound: 2,
};

#[test]
fn sliding_log_rejected_batch_takes_nothing_from_racing_singles() {
    BATCH_AND_SINGLES.check(log(2));
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
