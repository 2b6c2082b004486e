//! Token bucket (GCRA in one word): concurrent acquires never exceed the refill bound (at most
//! `N + floor(N * s / W)` permits in any span `s`), at one instant, with skewed clocks, with a
//! batch racing single permits, and while an evictor retires the bucket (with a clock lagging the
//! evictor's); an unconditional retire takes effect exactly once; and every race is
//! linearizable: its decisions and final TAT are those of some sequential order.

use tollgate::loom_support::GcraParams;

use crate::models::{LinearRace, Race, RetireNowRace, RetireRace, Won};
use crate::support::{WINDOW, at, rule};

const HALF: u64 = WINDOW / 2;
const QUARTER: u64 = WINDOW / 4;

/// A bucket whose rule is `limit` per window.
pub(crate) fn bucket(limit: u64) -> GcraParams {
    GcraParams::new(rule(limit)).expect("the bucket accepts the rule")
}

/// Three threads take one permit each, at one instant, from a full bucket of two.
pub(crate) static THREE_AT_ONE_INSTANT: Race = Race {
    prefill: &[],
    threads: &[at(5 * WINDOW, 1), at(5 * WINDOW, 1), at(5 * WINDOW, 1)],
    won: Won::Always(2),
    preemption_bound: 3,
};

#[test]
fn token_bucket_concurrent_acquires_never_exceed_limit() {
    THREE_AT_ONE_INSTANT.check(bucket(2));
}

/// An emptied bucket of two (one token per half window), then three readings spread over the
/// next half window, in any order: a later reading that lands first leaves the earlier ones
/// more debt.
static SKEWED_AFTER_EMPTYING: Race = Race {
    prefill: &[at(0, 2)],
    threads: &[at(HALF, 1), at(HALF + QUARTER, 1), at(WINDOW, 1)],
    won: Won::AtMost(2),
    preemption_bound: 3,
};

#[test]
fn token_bucket_skewed_clocks_never_exceed_refill_rate() {
    SKEWED_AFTER_EMPTYING.check(bucket(2));
}

/// A batch of two races two single permits for a full bucket of two.
static BATCH_AND_SINGLES: Race = Race {
    prefill: &[],
    threads: &[at(5 * WINDOW, 2), at(5 * WINDOW, 1), at(5 * WINDOW, 1)],
    won: Won::Always(2),
    preemption_bound: 3,
};

#[test]
fn token_bucket_batch_racing_singles_never_exceeds_limit() {
    BATCH_AND_SINGLES.check(bucket(2));
}

/// A bucket of one, emptied at W/4, is full again at 5W/4, when the evictor may retire it. One
/// thread's clock lags the evictor's (it reads W), another reads 7W/4.
static RETIRE_WHEN_FULL_AGAIN: RetireRace = RetireRace {
    prefill: &[at(QUARTER, 1)],
    retire_at: WINDOW + QUARTER,
    acquirers: &[at(WINDOW, 1), at(WINDOW + HALF + QUARTER, 1)],
    preemption_bound: 3,
};

#[test]
fn token_bucket_acquire_racing_retire_never_over_admits() {
    RETIRE_WHEN_FULL_AGAIN.check(bucket(1));
}

/// Two threads retire a full bucket of one unconditionally while a third takes its permit.
static RETIRE_NOW_WHILE_ACQUIRING: RetireNowRace = RetireNowRace {
    prefill: &[],
    acquirer: at(WINDOW, 1),
    preemption_bound: 3,
};

#[test]
fn token_bucket_unconditional_retire_takes_effect_once() {
    RETIRE_NOW_WHILE_ACQUIRING.check(bucket(1));
}

/// Two threads at one instant race for the last token of a bucket of two.
pub(crate) static LAST_TOKEN_AT_ONE_INSTANT: LinearRace = LinearRace {
    prefill: &[at(0, 1)],
    threads: &[at(0, 1), at(0, 1)],
    preemption_bound: 3,
};

#[test]
fn token_bucket_race_for_last_token_is_linearizable() {
    LAST_TOKEN_AT_ONE_INSTANT.check(bucket(2));
}

/// Two threads at one instant each take one of the two tokens of a full bucket: both win, so
/// only the final TAT tells a lost update apart.
pub(crate) static BOTH_TOKENS_AT_ONE_INSTANT: LinearRace = LinearRace {
    prefill: &[],
    threads: &[at(0, 1), at(0, 1)],
    preemption_bound: 3,
};

#[test]
fn token_bucket_two_winners_at_one_instant_are_linearizable() {
    BOTH_TOKENS_AT_ONE_INSTANT.check(bucket(2));
}

/// A batch and a single permit with skewed readings, on a bucket with one token left.
static SKEWED_BATCH_AND_SINGLE: LinearRace = LinearRace {
    prefill: &[at(0, 1)],
    threads: &[at(HALF, 2), at(QUARTER, 1)],
    preemption_bound: 3,
};

#[test]
fn token_bucket_skewed_batch_and_single_are_linearizable() {
    SKEWED_BATCH_AND_SINGLE.check(bucket(2));
}

/// Three threads with three readings and a batch, on a full bucket of two.
static THREE_SKEWED: LinearRace = LinearRace {
    prefill: &[],
    threads: &[at(0, 1), at(HALF, 1), at(QUARTER, 2)],
    preemption_bound: 2,
};

#[test]
fn token_bucket_three_skewed_acquires_are_linearizable() {
    THREE_SKEWED.check(bucket(2));
}
