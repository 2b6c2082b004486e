//! Sliding window counter (two windows' counts in one word): concurrent acquires never let the
//! weighted estimate exceed N (so never more than N per aligned window), at one reading, across
//! window rolls with readings that lag the word, and while an evictor retires the word (with a
//! clock lagging the evictor's); an unconditional retire takes effect exactly once; and a race
//! is linearizable.
//!
//! An admission is checked at the instant the counter counted it: a reading from an older window
//! than the word's is counted at the start of the word's window, by design.

use tollgate::loom_support::CounterParams;

use crate::models::{LinearRace, Race, RetireNowRace, RetireRace, Won};
use crate::support::{WINDOW, at, rule};

const HALF: u64 = WINDOW / 2;
const QUARTER: u64 = WINDOW / 4;

/// A sliding window counter whose rule is `limit` per window.
pub(crate) fn counter(limit: u64) -> CounterParams {
    CounterParams::new(rule(limit)).expect("the sliding window counter accepts the rule")
}

/// Window 3 holds one permit of two; three threads half-way into window 4, where it still
/// weighs `ceil(1 * 0.5) = 1`, race for the one permit left.
pub(crate) static THREE_HALF_WAY_INTO_NEXT: Race = Race {
    prefill: &[at(3 * WINDOW + HALF, 1)],
    threads: &[
        at(4 * WINDOW + HALF, 1),
        at(4 * WINDOW + HALF, 1),
        at(4 * WINDOW + HALF, 1),
    ],
    won: Won::Always(1),
    preemption_bound: 3,
};

#[test]
fn sliding_window_counter_concurrent_acquires_never_exceed_the_estimate() {
    THREE_HALF_WAY_INTO_NEXT.check(counter(2));
}

/// Window 3 is full; one thread still reads window 3, one reads three quarters into window 4
/// (where window 3 weighs 1) and one reads the start of window 5. Whichever rolls the word first,
/// the lagging readings are counted at the start of the word's window.
static ROLLS_WITH_LAGGING_READINGS: Race = Race {
    prefill: &[at(3 * WINDOW + HALF, 1), at(3 * WINDOW + HALF, 1)],
    threads: &[
        at(3 * WINDOW + HALF + QUARTER, 1),
        at(4 * WINDOW + HALF + QUARTER, 1),
        at(5 * WINDOW, 1),
    ],
    won: Won::AtMost(2),
    preemption_bound: 3,
};

#[test]
fn sliding_window_counter_never_exceeds_the_estimate_across_rolls() {
    ROLLS_WITH_LAGGING_READINGS.check(counter(2));
}

/// Window 3 holds one permit of two; the evictor, reading window 5 (where nothing weighs any
/// more), may retire the word while a thread reading window 4 (where that permit still weighs 1)
/// and another reading window 5 acquire.
static RETIRE_TWO_WINDOWS_LATER: RetireRace = RetireRace {
    prefill: &[at(3 * WINDOW + HALF, 1)],
    retire_at: 5 * WINDOW,
    acquirers: &[at(4 * WINDOW + HALF, 1), at(5 * WINDOW, 1)],
    preemption_bound: 3,
};

#[test]
fn sliding_window_counter_acquire_racing_retire_never_over_admits() {
    RETIRE_TWO_WINDOWS_LATER.check(counter(2));
}

/// Two threads retire a counter of two that holds one permit, unconditionally, while a third
/// takes the other.
static RETIRE_NOW_WHILE_ACQUIRING: RetireNowRace = RetireNowRace {
    prefill: &[at(HALF, 1)],
    acquirer: at(HALF + QUARTER, 1),
    preemption_bound: 3,
};

#[test]
fn sliding_window_counter_unconditional_retire_takes_effect_once() {
    RETIRE_NOW_WHILE_ACQUIRING.check(counter(2));
}

/// A single permit a quarter into window 4 races a batch of two half-way in, beside window 3's
/// one permit: whichever lands first decides what the other gets.
static SINGLE_AND_BATCH_AFTER_ROLL: LinearRace = LinearRace {
    prefill: &[at(3 * WINDOW + HALF, 1)],
    threads: &[at(4 * WINDOW + QUARTER, 1), at(4 * WINDOW + HALF, 2)],
    preemption_bound: 3,
};

#[test]
fn sliding_window_counter_single_racing_batch_is_linearizable() {
    SINGLE_AND_BATCH_AFTER_ROLL.check(counter(3));
}
