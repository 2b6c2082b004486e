//! The counter's arithmetic, checked on its pure decision: the layout, the weighting of the
//! previous window, the worst span, stale readings, waits and the horizon.

use std::time::Duration;

use super::*;
use crate::sync::Word;

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
    assert_eq!(
        counter.acquire(&word, 1, &crate::FakeClock::new()),
        Err(Retired)
    );
}

/// An empty word of window 5 (a refund's) is idle at readings of window 5 and later, never at
/// one of window 4: there it would count the reading at window 5's start, where a fresh word
/// made as of the reading gives window 4 a limit of its own.
#[test]
fn an_empty_word_of_a_later_window_is_not_idle_at_an_older_reading() {
    let counter = params(2, Duration::from_secs(1));
    let word = Word::new(counter.pack(5, 0, 0));
    assert!(!Method::retire_if_idle(
        &counter,
        &word,
        4 * SECOND + SECOND / 2
    ));
    assert!(Method::retire_if_idle(&counter, &word, 5 * SECOND));
    let word = Word::new(counter.pack(5, 1, 0));
    assert!(!Method::retire_if_idle(
        &counter,
        &word,
        6 * SECOND + SECOND / 2
    ));
    assert!(Method::retire_if_idle(&counter, &word, 7 * SECOND));
}
