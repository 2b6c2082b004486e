//! The counter's estimate: a word's counts carried to the window of a reading, the previous
//! window weighted by how much of it the sliding window still covers, and the waits that
//! follow from it (see [`SlidingWindowCounter`](crate::SlidingWindowCounter)).

use super::{CounterParams, NEVER};

/// The word's counts carried to the window of one reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Rolled {
    /// The window the reading is counted in.
    pub(super) index: u64,
    /// Permits granted in that window.
    pub(super) current: u64,
    /// Permits granted in the window before it.
    pub(super) previous: u64,
    /// Nanoseconds from the start of that window to the instant the reading is counted at.
    pub(super) elapsed: u64,
}

impl CounterParams {
    /// The counts of `word` as of the reading `now` (already counted from window 0 and clamped).
    /// A reading in a window older than the stored one (a stale or stepped-back clock) is
    /// counted at the start of the stored window, where the previous window weighs most: it
    /// never resets a count. Only a reading past the stored window's end pays for a division.
    #[inline]
    pub(super) fn roll(&self, word: u64, now: u64) -> Rolled {
        let window = self.rule.window_nanos();
        let (stored, current, previous) = self.unpack(word);
        let stored_start = stored.saturating_mul(window);
        if now < stored_start {
            return Rolled {
                index: stored,
                current,
                previous,
                elapsed: 0,
            };
        }
        let elapsed = now - stored_start;
        if elapsed < window {
            return Rolled {
                index: stored,
                current,
                previous,
                elapsed,
            };
        }
        let index = now / window;
        Rolled {
            index,
            current: 0,
            // The stored window's count weighs on the next window only.
            previous: if index == stored + 1 { current } else { 0 },
            elapsed: now % window,
        }
    }

    /// Whether the previous window's weighted count, rounded up, fits in `room` permits:
    /// `ceil(previous * (W - elapsed) / W) <= room`, without a division.
    #[inline]
    pub(super) fn weighted_fits(&self, rolled: &Rolled, room: u64) -> bool {
        let window = u128::from(self.rule.window_nanos());
        // elapsed < W, so the weight is 1..=W; both products fit in 128 bits.
        let overlap = window - u128::from(rolled.elapsed);
        u128::from(rolled.previous) * overlap <= u128::from(room) * window
    }

    /// The previous window's count weighted by the part of it the sliding window still covers,
    /// rounded up: `ceil(previous * (W - elapsed) / W)`, at most `previous`.
    #[inline]
    pub(super) fn weighted_previous(&self, rolled: &Rolled) -> u64 {
        let window = self.rule.window_nanos();
        let overlap = window - rolled.elapsed;
        match rolled.previous.checked_mul(overlap) {
            Some(product) => product.div_ceil(window),
            // At most `previous`, which fits.
            None => {
                (u128::from(rolled.previous) * u128::from(overlap)).div_ceil(u128::from(window))
                    as u64
            }
        }
    }

    /// The instant (in nanoseconds since window 0) `nanos` into window `index`, or `None` past
    /// the horizon, where time stands still and it never comes.
    #[inline]
    pub(super) fn instant(&self, index: u64, nanos: u64) -> Option<u64> {
        index
            .checked_mul(self.rule.window_nanos())
            .and_then(|start| start.checked_add(nanos))
            .filter(|&instant| instant <= self.last_nanos)
    }

    /// Nanoseconds from the reading `now` until the estimate is 0 if nothing more is taken: the
    /// start of the window after next while the current window holds a permit, the start of the
    /// next while only the previous one does, now if neither does. [`NEVER`] past the horizon.
    #[inline]
    pub(super) fn reset_after(&self, rolled: &Rolled, now: u64) -> u64 {
        let windows_left = if rolled.current > 0 {
            2
        } else if rolled.previous > 0 {
            1
        } else {
            return 0;
        };
        rolled
            .index
            .checked_add(windows_left)
            .and_then(|index| self.instant(index, 0))
            .map_or(NEVER, |reset_at| reset_at.saturating_sub(now))
    }

    /// Nanoseconds from the reading `now` until `n` permits (at most N) fit, if nothing more is
    /// taken: the first instant at which `ceil(previous' * (W - elapsed') / W) + current' + n`
    /// is at most N. [`NEVER`] past the horizon.
    ///
    /// While `current + n <= N`, that instant lies in this window, or at the start of the next
    /// (where the estimate is `current`): the weight must fall to
    /// `floor((N - current - n) * W / previous)` nanoseconds. Otherwise it lies in the next
    /// window, where `current` weighs as the previous count, or at the start of the one after
    /// (where the estimate is 0): the weight must fall to `floor((N - n) * W / current)`.
    /// Either weight is below the one now, as the request is denied now.
    #[inline]
    pub(super) fn retry_after(&self, rolled: &Rolled, n: u64, now: u64) -> u64 {
        let limit = self.rule.limit();
        let window = self.rule.window_nanos();
        let (index, weighing, room) = if rolled.current + n <= limit {
            (rolled.index, rolled.previous, limit - rolled.current - n)
        } else {
            (rolled.index.saturating_add(1), rolled.current, limit - n)
        };
        // `weighing` > 0: with nothing to weigh the request would fit. The quotient is below W
        // (the request does not fit at the weight now, or `room` < `weighing`), so it fits u64.
        let weight = (u128::from(room) * u128::from(window) / u128::from(weighing.max(1)))
            .min(u128::from(window)) as u64;
        self.instant(index, window - weight)
            .map_or(NEVER, |allowed_at| allowed_at.saturating_sub(now))
    }
}
