//! Fixed window (window index and count in one word): concurrent acquires never put more than N
//! permits in one aligned window, whether they take the `fetch_add` fast path or the CAS loop,
//! across a window roll with readings on both sides of the edge, with a batch racing single
//! permits, and while an evictor retires the word (with a clock lagging the evictor's, and a
//! fast-path `fetch_add` landing on the retired word); an unconditional retire takes effect
//! exactly once; and every race is linearizable.
//!
//! An admission is checked in the window the limiter counted it in: a reading from the older
//! window that arrives after the roll is counted in the newer one, by design.

use tollgate::loom_support::WindowParams;

use crate::models::{LinearRace, Race, RetireNowRace, RetireRace, Won};
use crate::support::{WINDOW, at, rule};

const HALF: u64 = WINDOW / 2;
const QUARTER: u64 = WINDOW / 4;

/// A fixed window whose rule is `limit` per window.
pub(crate) fn window(limit: u64) -> WindowParams {
    WindowParams::new(rule(limit)).expect("the fixed window accepts the rule")
}

/// Three threads take one permit each in window 0, where a fresh word already is: all three
/// take the `fetch_add` fast path.
static THREE_IN_CURRENT_WINDOW: Race = Race {
    prefill: &[],
    threads: &[at(HALF, 1), at(HALF, 1), at(HALF, 1)],
    won: Won::Always(2),
    preemption_bound: 3,
};

#[test]
fn fixed_window_concurrent_acquires_never_exceed_limit() {
    THREE_IN_CURRENT_WINDOW.check(window(2));
}

/// Window 3 is full; one thread still reads window 3 while two read window 4 (one a quarter in).
/// Whoever rolls the word to window 4 first, the late reading is counted there.
pub(crate) static ROLL_WITH_LATE_READING: Race = Race {
    prefill: &[at(3 * WINDOW + HALF, 1), at(3 * WINDOW + HALF, 1)],
    threads: &[
        at(3 * WINDOW + HALF + QUARTER, 1),
        at(4 * WINDOW, 1),
        at(4 * WINDOW + QUARTER, 1),
    ],
    won: Won::AtMost(2),
    preemption_bound: 3,
};

#[test]
fn fixed_window_never_exceeds_limit_per_window_across_roll() {
    ROLL_WITH_LATE_READING.check(window(2));
}

/// Window 3 has one permit left; two single permits in window 3 (fast path) race a batch of two
/// that rolls the word to window 4.
static BATCH_ROLLS_UNDER_SINGLES: Race = Race {
    prefill: &[at(3 * WINDOW, 1)],
    threads: &[
        at(4 * WINDOW, 2),
        at(3 * WINDOW + HALF, 1),
        at(3 * WINDOW + HALF, 1),
    ],
    won: Won::AtMost(3),
    preemption_bound: 3,
};

#[test]
fn fixed_window_batch_racing_singles_never_exceeds_limit() {
    BATCH_ROLLS_UNDER_SINGLES.check(window(2));
}

/// Window 3 holds one permit of two; the evictor, reading window 4, may retire the word while a
/// thread still reading window 3 takes the fast path (its `fetch_add` may land on the retired
/// word) and another reads window 4.
static RETIRE_AFTER_WINDOW_ENDS: RetireRace = RetireRace {
    prefill: &[at(3 * WINDOW + HALF, 1)],
    retire_at: 4 * WINDOW,
    acquirers: &[at(3 * WINDOW + HALF + QUARTER, 1), at(4 * WINDOW, 1)],
    preemption_bound: 3,
};

#[test]
fn fixed_window_acquire_racing_retire_never_over_admits() {
    RETIRE_AFTER_WINDOW_ENDS.check(window(2));
}

/// Window 3 holds its one permit; the evictor, reading window 4, may retire the word while two
/// threads reading window 4 roll it there.
pub(crate) static RETIRE_RACING_ROLL: RetireRace = RetireRace {
    prefill: &[at(3 * WINDOW + HALF, 1)],
    retire_at: 4 * WINDOW,
    acquirers: &[at(4 * WINDOW, 1), at(4 * WINDOW + QUARTER, 1)],
    preemption_bound: 3,
};

#[test]
fn fixed_window_retire_racing_roll_never_over_admits() {
    RETIRE_RACING_ROLL.check(window(1));
}

/// Two threads retire a window of two that holds one permit, unconditionally, while a third takes
/// the other on the fast path.
static RETIRE_NOW_WHILE_ACQUIRING: RetireNowRace = RetireNowRace {
    prefill: &[at(HALF, 1)],
    acquirer: at(HALF + QUARTER, 1),
    preemption_bound: 3,
};

#[test]
fn fixed_window_unconditional_retire_takes_effect_once() {
    RETIRE_NOW_WHILE_ACQUIRING.check(window(2));
}

/// A fast-path single permit in window 3 races a batch that rolls the word to window 4.
static FAST_PATH_AND_ROLLING_BATCH: LinearRace = LinearRace {
    prefill: &[at(3 * WINDOW + HALF, 1)],
    threads: &[at(3 * WINDOW + HALF + QUARTER, 1), at(4 * WINDOW, 2)],
    preemption_bound: 3,
};

#[test]
fn fixed_window_fast_path_racing_roll_is_linearizable() {
    FAST_PATH_AND_ROLLING_BATCH.check(window(2));
}

/// Two fast-path permits race for the last one of a window: the loser's `fetch_add` still adds
/// to the count, which must not change any later answer.
static FAST_PATH_RACE_FOR_LAST: LinearRace = LinearRace {
    prefill: &[at(HALF, 1)],
    threads: &[at(HALF, 1), at(HALF + QUARTER, 1)],
    preemption_bound: 3,
};

#[test]
fn fixed_window_fast_path_race_for_last_permit_is_linearizable() {
    FAST_PATH_RACE_FOR_LAST.check(window(2));
}

/// Three threads: two readings in window 0 (one a batch) and one in window 1.
static THREE_ACROSS_EDGE: LinearRace = LinearRace {
    prefill: &[],
    threads: &[at(HALF, 1), at(WINDOW, 1), at(HALF + QUARTER, 2)],
    preemption_bound: 2,
};

#[test]
fn fixed_window_three_acquires_across_edge_are_linearizable() {
    THREE_ACROSS_EDGE.check(window(2));
}
