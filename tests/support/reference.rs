//! Reference limiters: the seed design's `synchronized` classes, written plainly in Rust with one
//! `std::sync::Mutex` per limiter.
//!
//! Two uses, one copy: the property tests compare every lock-free limiter with these, decision
//! for decision, and the benchmarks measure them as the mutex baseline (`benches/` includes this
//! file by path). They read the same [`Clock`] as the limiters under test.
//!
//! Unlike the seed, time arithmetic is exact: the token bucket counts tokens in units of
//! `1 / window_ns` with 128-bit integers instead of a `double`, so the reference has no rounding
//! of its own. A reading earlier than the last one counts as no time passing.

#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;
use std::sync::Mutex;

use tollgate::{Clock, Rule};

/// Locks `mutex`, ignoring poisoning: a reference limiter's state is valid after any panic.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The seed's `TokenBucket`: capacity N, refilled N per window, starting full.
#[derive(Debug)]
pub struct RefTokenBucket<C> {
    limit: u64,
    window: u64,
    clock: C,
    /// (tokens × window_ns, time of the last refill in ns).
    state: Mutex<(u128, u64)>,
}

impl<C: Clock> RefTokenBucket<C> {
    pub fn new(rule: Rule, clock: C) -> Self {
        let window = rule.window().as_nanos() as u64;
        let full = u128::from(rule.limit()) * u128::from(window);
        let last = clock.now_nanos();
        RefTokenBucket {
            limit: rule.limit(),
            window,
            clock,
            state: Mutex::new((full, last)),
        }
    }

    fn refill(&self, state: &mut (u128, u64)) {
        let now = self.clock.now_nanos();
        let elapsed = now.saturating_sub(state.1);
        let full = u128::from(self.limit) * u128::from(self.window);
        // Refill for the time that passed: N tokens per window, N*elapsed in our units.
        state.0 = full.min(state.0 + u128::from(elapsed) * u128::from(self.limit));
        state.1 = state.1.max(now);
    }

    pub fn try_acquire_n(&self, n: u64) -> bool {
        let mut state = lock(&self.state);
        self.refill(&mut state);
        let cost = u128::from(n) * u128::from(self.window);
        if state.0 >= cost {
            state.0 -= cost;
            true
        } else {
            false
        }
    }

    pub fn try_acquire(&self) -> bool {
        self.try_acquire_n(1)
    }

    /// Whole tokens available now.
    pub fn available(&self) -> u64 {
        let mut state = lock(&self.state);
        self.refill(&mut state);
        (state.0 / u128::from(self.window)) as u64
    }
}

/// The seed's `FixedWindow`: windows aligned to the clock's origin.
#[derive(Debug)]
pub struct RefFixedWindow<C> {
    limit: u64,
    window: u64,
    clock: C,
    /// (start of the current window in ns, permits granted in it); `None` before the first.
    state: Mutex<Option<(u64, u64)>>,
}

impl<C: Clock> RefFixedWindow<C> {
    pub fn new(rule: Rule, clock: C) -> Self {
        RefFixedWindow {
            limit: rule.limit(),
            window: rule.window().as_nanos() as u64,
            clock,
            state: Mutex::new(None),
        }
    }

    fn current(&self, state: &mut Option<(u64, u64)>) -> (u64, u64) {
        let now = self.clock.now_nanos();
        let start = now - now % self.window;
        match *state {
            // A new window (never an older one): forget the old count.
            Some((window_start, count)) if window_start >= start => (window_start, count),
            _ => (start, 0),
        }
    }

    pub fn try_acquire_n(&self, n: u64) -> bool {
        let mut state = lock(&self.state);
        let (start, count) = self.current(&mut state);
        *state = Some((start, count));
        if count + n <= self.limit {
            *state = Some((start, count + n));
            true
        } else {
            false
        }
    }

    pub fn try_acquire(&self) -> bool {
        self.try_acquire_n(1)
    }

    pub fn available(&self) -> u64 {
        let mut state = lock(&self.state);
        let (_, count) = self.current(&mut state);
        self.limit - count
    }
}

/// The seed's `SlidingWindowLog`: the time of every admission within the last window.
#[derive(Debug)]
pub struct RefSlidingWindowLog<C> {
    limit: u64,
    window: u64,
    clock: C,
    log: Mutex<VecDeque<u64>>,
}

impl<C: Clock> RefSlidingWindowLog<C> {
    pub fn new(rule: Rule, clock: C) -> Self {
        RefSlidingWindowLog {
            limit: rule.limit(),
            window: rule.window().as_nanos() as u64,
            clock,
            log: Mutex::new(VecDeque::new()),
        }
    }

    /// Forgets admissions that have left the window; returns the time an admission now takes
    /// (never earlier than the previous admission).
    fn expire(&self, log: &mut VecDeque<u64>) -> u64 {
        let now = self.clock.now_nanos().max(log.back().copied().unwrap_or(0));
        while log
            .front()
            .is_some_and(|&oldest| now - oldest >= self.window)
        {
            log.pop_front();
        }
        now
    }

    /// Takes `n` permits, all at one time, or none.
    pub fn try_acquire_n(&self, n: u64) -> bool {
        let mut log = lock(&self.log);
        let now = self.expire(&mut log);
        if (log.len() as u64).saturating_add(n) <= self.limit {
            log.extend((0..n).map(|_| now));
            true
        } else {
            false
        }
    }

    pub fn try_acquire(&self) -> bool {
        self.try_acquire_n(1)
    }

    pub fn available(&self) -> u64 {
        let mut log = lock(&self.log);
        self.expire(&mut log);
        self.limit - log.len() as u64
    }
}

/// The sliding window counter: the permits of the current aligned window plus those of the
/// previous one, weighted by the part of it the sliding window still covers, rounded up. Exact
/// rational arithmetic in 128-bit integers; a reading earlier than the current window counts at
/// its start.
#[derive(Debug)]
pub struct RefSlidingWindowCounter<C> {
    limit: u64,
    window: u64,
    clock: C,
    /// (index of the current window, permits granted in it, permits granted in the one before).
    state: Mutex<(u64, u64, u64)>,
}

impl<C: Clock> RefSlidingWindowCounter<C> {
    pub fn new(rule: Rule, clock: C) -> Self {
        RefSlidingWindowCounter {
            limit: rule.limit(),
            window: rule.window().as_nanos() as u64,
            clock,
            state: Mutex::new((0, 0, 0)),
        }
    }

    /// Moves the counts to the window of the current reading (never back); returns the estimate
    /// at that reading.
    fn estimate(&self, state: &mut (u64, u64, u64)) -> u64 {
        let now = self.clock.now_nanos();
        let index = now / self.window;
        if index > state.0 {
            let previous = if index == state.0 + 1 { state.1 } else { 0 };
            *state = (index, 0, previous);
        }
        // A reading behind the current window weighs as its start.
        let into = if index < state.0 {
            0
        } else {
            now % self.window
        };
        let overlap = u128::from(self.window - into);
        let weighted = (u128::from(state.2) * overlap).div_ceil(u128::from(self.window));
        weighted as u64 + state.1
    }

    pub fn try_acquire_n(&self, n: u64) -> bool {
        let mut state = lock(&self.state);
        if self.estimate(&mut state) + n <= self.limit {
            state.1 += n;
            true
        } else {
            false
        }
    }

    pub fn try_acquire(&self) -> bool {
        self.try_acquire_n(1)
    }

    pub fn available(&self) -> u64 {
        let mut state = lock(&self.state);
        self.limit.saturating_sub(self.estimate(&mut state))
    }
}
