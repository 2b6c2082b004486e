//! A multi-threaded stress oracle: each method's guarantee, checked over a whole concurrent
//! history.
//!
//! Worker threads acquire on one shared limiter while a driver thread moves a shared
//! [`FakeClock`] forward in small steps (it waits for a few attempts at each reading, so that
//! admissions are spread over hundreds of windows). Each worker records, for every admission, the
//! clock just before and just after its call. The fake clock only moves forward, so the time an
//! admission counts at lies in that interval: the token bucket uses its own reading; the log may
//! use the previous admission's time instead, a reading it acquired from the slot before this
//! call's `after`; the fixed window may count in the window another attempt already moved the
//! word to, from a reading made before this call's `after` (on x86-64, where loads are not
//! reordered with each other). The checks count only admissions whose whole interval lies in the
//! span they look at, which keeps them sound whatever the interleaving:
//!
//! - sliding window log: at most N in every half-open span of one window, with single permits
//!   and with batches of up to four racing them (each permit of a batch counted as an admission);
//! - token bucket: at most `N + floor(N * s / W)` in every closed span of length `s`;
//! - fixed window: at most N in every window aligned to the clock's origin;
//! - sliding window counter: in every aligned window, its admissions plus the previous window's
//!   weighted by the overlap left after its latest admission, rounded up, at most N (it counts a
//!   lagging reading in the newer window, as the fixed window does).
//!
//! With the clock frozen, every method admits exactly `min(N, attempts)` of many racing
//! attempts, as in the seed's check of 1,000 requests from 16 threads.
//!
//! The last tests plant bugs (a token bucket and a log that admit one too many, a fixed window
//! that loses racing updates, a counter that forgets the previous window) and check that the same
//! oracle reports each.

#[path = "support/reference.rs"]
mod reference;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use tollgate::{
    Clock, FakeClock, FixedWindow, Limiter, Rule, SlidingWindowCounter, SlidingWindowLog,
    TokenBucket,
};

use reference::RefSlidingWindowLog;

/// Worker threads per run: with the driver, twice the cores of a 2-core machine, so that workers
/// are both racing in parallel and preempted mid-attempt.
const WORKERS: usize = 3;

/// Attempts each worker makes at one clock reading, after which it yields until the clock moves:
/// the workers race in bursts at every step, and the driver is not starved of a core.
const ATTEMPTS_PER_WORKER: u64 = 4;

/// Attempts the driver waits for at each reading before it moves the clock on: all but one
/// worker's share (a preempted worker does not hold the run up), more than the limits used here,
/// so that every permit that comes back is taken at once.
const ATTEMPTS_PER_STEP: u64 = (WORKERS as u64 - 1) * ATTEMPTS_PER_WORKER;

/// Clock steps per run: 300 to 400 windows for each rule below.
const STEPS: u64 = 30_000;

/// A run stops early after this long, checking what it recorded; it normally takes well under.
const WALL_CAP: Duration = Duration::from_secs(3);

/// One run at a time: each gets both cores, and its contention does not depend on other tests.
static MACHINE: Mutex<()> = Mutex::new(());

fn machine() -> MutexGuard<'static, ()> {
    MACHINE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn rule(limit: u64, window_nanos: u64) -> Rule {
    Rule::new(limit, Duration::from_nanos(window_nanos)).unwrap()
}

/// One admission: the clock just before and just after the call that granted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Admission {
    before: u64,
    after: u64,
}

#[derive(Debug)]
struct History {
    /// Sorted by `before`.
    admissions: Vec<Admission>,
    attempts: u64,
    steps_taken: u64,
}

/// Keeps each worker's attempt counter on its own cache line, so that counting does not add
/// contention of its own.
#[derive(Default)]
#[repr(align(128))]
struct Counter(AtomicU64);

/// Runs `attempt` on [`WORKERS`] threads while the clock moves `STEPS` steps of `step_nanos`.
fn stress(clock: &FakeClock, step_nanos: u64, attempt: impl Fn() -> bool + Sync) -> History {
    stress_batches(clock, step_nanos, || u64::from(attempt()))
}

/// [`stress`] for attempts that may take several permits: `attempt` returns how many it took,
/// each recorded as one admission with the attempt's interval.
fn stress_batches(clock: &FakeClock, step_nanos: u64, attempt: impl Fn() -> u64 + Sync) -> History {
    let stop = AtomicBool::new(false);
    let counters: [Counter; WORKERS] = Default::default();
    let start = Barrier::new(WORKERS + 1);
    let total = || -> u64 {
        counters
            .iter()
            .map(|counter| counter.0.load(Ordering::Relaxed))
            .sum()
    };
    let (stop, start, attempt) = (&stop, &start, &attempt);

    thread::scope(|scope| {
        let workers: Vec<_> = counters
            .iter()
            .map(|counter| {
                scope.spawn(move || {
                    let mut admitted = Vec::new();
                    let (mut reading, mut made) = (clock.now_nanos(), 0);
                    start.wait();
                    // Relaxed: the flag only ends the loop; the history is returned by `join`.
                    while !stop.load(Ordering::Relaxed) {
                        let before = clock.now_nanos();
                        if before != reading {
                            (reading, made) = (before, 0);
                        }
                        if made == ATTEMPTS_PER_WORKER {
                            thread::yield_now();
                            continue;
                        }
                        made += 1;
                        let permits = attempt();
                        let after = clock.now_nanos();
                        for _ in 0..permits {
                            admitted.push(Admission { before, after });
                        }
                        counter.0.fetch_add(1, Ordering::Relaxed);
                    }
                    admitted
                })
            })
            .collect();

        start.wait();
        let deadline = Instant::now() + WALL_CAP;
        let (mut steps_taken, mut counted) = (0, 0);
        'drive: while steps_taken < STEPS {
            while total() < counted + ATTEMPTS_PER_STEP {
                if Instant::now() > deadline {
                    break 'drive;
                }
                thread::yield_now();
            }
            // Counted before the move: the workers have a whole quota each at the new reading,
            // more than the driver waits for, whatever they did since.
            counted = total();
            clock.advance(Duration::from_nanos(step_nanos));
            steps_taken += 1;
        }
        stop.store(true, Ordering::Relaxed);

        let mut admissions: Vec<Admission> = workers
            .into_iter()
            .flat_map(|worker| worker.join().unwrap())
            .collect();
        admissions.sort_unstable();
        History {
            admissions,
            attempts: total(),
            steps_taken,
        }
    })
}

// ---------- The oracle: each method's guarantee over a history ----------

/// Sliding window log: at most `limit` admissions in any span `[a, a + window)`.
fn check_every_window(history: &History, limit: u64, window: u64) -> Result<(), String> {
    let admissions = &history.admissions;
    // A densest span can start at some admission's `before`: moving its start right, up to the
    // first admission inside, loses none of them.
    for (i, first) in admissions.iter().enumerate() {
        let end = first.before + window;
        let inside = admissions[i..]
            .iter()
            .take_while(|admission| admission.before < end)
            .filter(|admission| admission.after < end)
            .count() as u64;
        if inside > limit {
            return Err(format!(
                "{inside} admissions within [{}, {end}) ns: the limit is {limit} per {window} ns",
                first.before
            ));
        }
    }
    Ok(())
}

/// Token bucket: at most `limit + floor(limit * s / window)` admissions in any span `[a, a + s]`.
fn check_every_span(history: &History, limit: u64, window: u64) -> Result<(), String> {
    let by_before = &history.admissions;
    let mut by_after = by_before.clone();
    by_after.sort_unstable_by_key(|admission| admission.after);
    // A densest span starts at some admission's `before` and ends at some admission's `after`.
    let mut previous_start = None;
    for start in by_before.iter().map(|admission| admission.before) {
        if previous_start.replace(start) == Some(start) {
            continue;
        }
        let first = by_after.partition_point(|admission| admission.after < start);
        let mut inside = 0u64;
        for admission in by_after[first..].iter().filter(|a| a.before >= start) {
            inside += 1;
            let span = admission.after - start;
            // inside <= limit + floor(limit * span / window), in integers.
            if inside > limit
                && u128::from(inside - limit) * u128::from(window)
                    > u128::from(limit) * u128::from(span)
            {
                return Err(format!(
                    "{inside} admissions within [{start}, {}] ns: a bucket of {limit} per \
                     {window} ns allows {}",
                    admission.after,
                    u128::from(limit) + u128::from(limit) * u128::from(span) / u128::from(window)
                ));
            }
        }
    }
    Ok(())
}

/// Fixed window: at most `limit` admissions in any window `[k * window, (k + 1) * window)`.
fn check_aligned_windows(history: &History, limit: u64, window: u64) -> Result<(), String> {
    let mut per_window = BTreeMap::<u64, u64>::new();
    for admission in &history.admissions {
        let index = admission.before / window;
        // An interval across an edge could have been counted in either window.
        if admission.after / window == index {
            *per_window.entry(index).or_default() += 1;
        }
    }
    match per_window.into_iter().find(|&(_, count)| count > limit) {
        Some((index, count)) => Err(format!(
            "{count} admissions within window {index} ([{}, {}) ns): the limit is {limit}",
            index * window,
            (index + 1) * window
        )),
        None => Ok(()),
    }
}

/// Sliding window counter: in every aligned window k, `C + ceil(P * (W - e) / W) <= limit`, with
/// C its admissions, P those of window k-1 and `e` the latest offset into window k any of them was
/// counted at. Only admissions whose whole interval lies in one window are counted (fewer
/// admissions only lower the sum), and `e` is taken from their `after` (a later offset only
/// lowers the weight), so the check is sound whatever the interleaving.
fn check_weighted_windows(history: &History, limit: u64, window: u64) -> Result<(), String> {
    // Window index -> (admissions, latest offset of an `after` into the window).
    let mut per_window = BTreeMap::<u64, (u64, u64)>::new();
    for admission in &history.admissions {
        let index = admission.before / window;
        if admission.after / window == index {
            let entry = per_window.entry(index).or_default();
            entry.0 += 1;
            entry.1 = entry.1.max(admission.after % window);
        }
    }
    for (&index, &(current, latest)) in &per_window {
        let previous = index
            .checked_sub(1)
            .and_then(|before| per_window.get(&before))
            .map_or(0, |&(count, _)| count);
        let weighted =
            (u128::from(previous) * u128::from(window - latest)).div_ceil(u128::from(window));
        if weighted + u128::from(current) > u128::from(limit) {
            return Err(format!(
                "{current} admissions within window {index} beside {previous} in the one before, \
                 weighing {weighted} at {latest} ns in: the limit is {limit}"
            ));
        }
    }
    Ok(())
}

/// Asserts that the run exercised many window edges, so that passing means something.
fn assert_covered(history: &History, step_nanos: u64, window: u64) {
    let windows = history.steps_taken * step_nanos / window;
    assert!(
        windows >= 20 && history.admissions.len() >= 100,
        "the run covered only {windows} windows and {} admissions in {} attempts",
        history.admissions.len(),
        history.attempts
    );
}

// ---------- The limiters under stress ----------

/// 8 per 10 µs, stepped by 97 ns: a log entry expires between two steps at odd offsets.
const LOG: (u64, u64, u64) = (8, 10_000, 97);
/// 7 per 10 µs (a token every 1 428.57 ns), stepped by 137 ns: refills at fractional instants.
const BUCKET: (u64, u64, u64) = (7, 10_000, 137);
/// 8 per 100 µs (the shortest windows the fixed window accepts are about 72 µs), stepped by
/// 997 ns.
const WINDOW: (u64, u64, u64) = (8, 100_000, 997);

#[test]
fn sliding_log_never_exceeds_limit_in_any_window() {
    let _machine = machine();
    let (limit, window, step) = LOG;
    let clock = FakeClock::new();
    let log = SlidingWindowLog::new(rule(limit, window), clock.clone()).unwrap();
    let history = stress(&clock, step, || log.try_acquire());
    assert_covered(&history, step, window);
    check_every_window(&history, limit, window).unwrap();
}

#[test]
fn sliding_log_with_batches_never_exceeds_limit_in_any_window() {
    let _machine = machine();
    let (limit, window, step) = LOG;
    let clock = FakeClock::new();
    let log = SlidingWindowLog::new(rule(limit, window), clock.clone()).unwrap();
    // Attempts for 1, 2, 3 and 4 permits in turn, so that batches race single permits and each
    // other.
    let attempts = AtomicU64::new(0);
    let history = stress_batches(&clock, step, || {
        // Relaxed: only spreads the sizes; no other memory depends on it.
        let n = 1 + attempts.fetch_add(1, Ordering::Relaxed) % 4;
        if log.try_acquire_n(n).is_allowed() {
            n
        } else {
            0
        }
    });
    assert_covered(&history, step, window);
    check_every_window(&history, limit, window).unwrap();
}

#[test]
fn token_bucket_never_exceeds_burst_plus_refill_in_any_span() {
    let _machine = machine();
    let (limit, window, step) = BUCKET;
    let clock = FakeClock::new();
    let bucket = TokenBucket::new(rule(limit, window), clock.clone()).unwrap();
    assert!(bucket.is_exact());
    let history = stress(&clock, step, || bucket.try_acquire());
    assert_covered(&history, step, window);
    check_every_span(&history, limit, window).unwrap();
}

#[test]
fn fixed_window_never_exceeds_limit_in_an_aligned_window() {
    let _machine = machine();
    let (limit, window, step) = WINDOW;
    let clock = FakeClock::new();
    let fixed = FixedWindow::new(rule(limit, window), clock.clone()).unwrap();
    let history = stress(&clock, step, || fixed.try_acquire());
    assert_covered(&history, step, window);
    check_aligned_windows(&history, limit, window).unwrap();
}

#[test]
fn sliding_window_counter_never_exceeds_its_weighted_estimate() {
    let _machine = machine();
    // The fixed window's rule and steps: the counter holds it for as long.
    let (limit, window, step) = WINDOW;
    let clock = FakeClock::new();
    let counter = SlidingWindowCounter::new(rule(limit, window), clock.clone()).unwrap();
    let history = stress(&clock, step, || counter.try_acquire());
    assert_covered(&history, step, window);
    check_weighted_windows(&history, limit, window).unwrap();
}

/// Makes `threads` threads race through `attempts` calls of `attempt`, released together, and
/// returns how many were granted.
fn admitted_at_one_instant(
    attempts: u64,
    threads: usize,
    attempt: impl Fn() -> bool + Sync,
) -> u64 {
    let tickets = AtomicU64::new(0);
    let admitted = AtomicU64::new(0);
    let start = Barrier::new(threads);
    thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                start.wait();
                // Relaxed: the counts are read after the threads are joined.
                while tickets.fetch_add(1, Ordering::Relaxed) < attempts {
                    if attempt() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    admitted.into_inner()
}

/// Trials of each frozen-clock check: each is a fresh limiter and a fresh race.
const FROZEN_TRIALS: usize = 50;

/// A frozen reading partway into a one-second window, so that nothing rolls over.
fn frozen_clock() -> FakeClock {
    FakeClock::starting_at(Duration::from_millis(1_500))
}

#[test]
fn every_method_admits_exactly_min_of_limit_and_attempts_at_a_frozen_instant() {
    let _machine = machine();
    // The seed's check (1,000 requests from 16 threads on a limit of 50), and one where the
    // limit is above the attempts, so that every attempt must pass.
    for (limit, attempts) in [(50, 1_000), (2_000, 1_000)] {
        let rule = rule(limit, 1_000_000_000);
        for trial in 0..FROZEN_TRIALS {
            let bucket = TokenBucket::new(rule, frozen_clock()).unwrap();
            let fixed = FixedWindow::new(rule, frozen_clock()).unwrap();
            let log = SlidingWindowLog::new(rule, frozen_clock()).unwrap();
            let counter = SlidingWindowCounter::new(rule, frozen_clock()).unwrap();
            let admitted = [
                admitted_at_one_instant(attempts, 16, || bucket.try_acquire()),
                admitted_at_one_instant(attempts, 16, || fixed.try_acquire()),
                admitted_at_one_instant(attempts, 16, || log.try_acquire()),
                admitted_at_one_instant(attempts, 16, || counter.try_acquire()),
            ];
            assert_eq!(
                admitted,
                [limit.min(attempts); 4],
                "token bucket, fixed window, sliding log, sliding window counter; trial \
                 {trial}: {attempts} attempts on {rule:?}"
            );
        }
    }
}

// ---------- The oracle catches planted bugs ----------

/// A fixed window built from a load and a plain store where a compare-and-swap belongs: two
/// attempts that load the same count both admit, and one of their increments is lost.
struct RacyWindow {
    limit: u64,
    window: u64,
    /// `[63 .. 32] window index · [31 .. 0] count`.
    word: AtomicU64,
    clock: FakeClock,
}

/// Spin-loop hints between the racy window's load and store (about a microsecond here).
const RACE_PAUSE: u32 = 100;

impl RacyWindow {
    fn try_acquire(&self) -> bool {
        let now_index = self.clock.now_nanos() / self.window;
        let word = self.word.load(Ordering::Relaxed);
        let (index, count) = (word >> 32, word & 0xffff_ffff);
        let (index, used) = if now_index > index {
            (now_index, 0)
        } else {
            (index, count)
        };
        if used >= self.limit {
            return false;
        }
        // The planted race: another attempt may have stored since the load above. The pause
        // stands for the work a real limiter does between the two, and makes the race show
        // within a short run.
        for _ in 0..RACE_PAUSE {
            std::hint::spin_loop();
        }
        self.word.store(index << 32 | (used + 1), Ordering::Relaxed);
        true
    }
}

/// The frozen-instant check, on the racy window. A lost update needs two threads between the
/// same load and store, so one trial may pass; on this machine about one trial in six fails, and
/// the budget allows hundreds.
#[test]
fn frozen_instant_check_catches_a_fixed_window_that_loses_racing_updates() {
    let _machine = machine();
    let budget = Instant::now() + Duration::from_secs(2);
    for trial in 1.. {
        let racy = RacyWindow {
            limit: 50,
            window: 1_000_000_000,
            word: AtomicU64::new(0),
            clock: frozen_clock(),
        };
        if admitted_at_one_instant(1_000, 16, || racy.try_acquire()) > 50 {
            return;
        }
        assert!(
            Instant::now() < budget,
            "a racy window went unnoticed in {trial} trials"
        );
    }
}

/// A GCRA bucket whose burst tolerance is one token too large: N + 1 permits from a full
/// bucket, at the right refill rate.
struct OneTooManyBucket {
    /// Theoretical arrival time, in ns.
    tat: AtomicU64,
    token_nanos: u64,
    burst_nanos: u64,
    clock: FakeClock,
}

impl OneTooManyBucket {
    fn try_acquire(&self) -> bool {
        let mut tat = self.tat.load(Ordering::Relaxed);
        loop {
            let now = self.clock.now_nanos();
            let new = tat.max(now) + self.token_nanos;
            // The planted bug: one token of slack on top of the burst.
            if new - now > self.burst_nanos + self.token_nanos {
                return false;
            }
            match self
                .tat
                .compare_exchange_weak(tat, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(actual) => tat = actual,
            }
        }
    }
}

#[test]
fn oracle_catches_a_token_bucket_that_bursts_one_too_many() {
    let _machine = machine();
    // 8 per 10 µs: a whole number of nanoseconds per token, as this simple bucket needs.
    let (limit, window, step) = (8, 10_000, 137);
    let clock = FakeClock::new();
    let planted = OneTooManyBucket {
        tat: AtomicU64::new(0),
        token_nanos: window / limit,
        burst_nanos: window,
        clock: clock.clone(),
    };
    let history = stress(&clock, step, || planted.try_acquire());
    assert!(check_every_span(&history, limit, window).is_err());
}

#[test]
fn oracle_catches_a_sliding_log_that_keeps_one_too_many() {
    let _machine = machine();
    let (limit, window, step) = LOG;
    let clock = FakeClock::new();
    // The reference log, holding one admission more than the rule it is checked against.
    let planted = RefSlidingWindowLog::new(rule(limit + 1, window), clock.clone());
    let history = stress(&clock, step, || planted.try_acquire());
    assert!(check_every_window(&history, limit, window).is_err());
}

#[test]
fn oracle_catches_a_counter_that_forgets_the_previous_window() {
    let _machine = machine();
    let (limit, window, step) = WINDOW;
    let clock = FakeClock::new();
    // A fixed window is a sliding window counter that weighs the previous window as nothing.
    let planted = FixedWindow::new(rule(limit, window), clock.clone()).unwrap();
    let history = stress(&clock, step, || planted.try_acquire());
    assert!(check_weighted_windows(&history, limit, window).is_err());
}
