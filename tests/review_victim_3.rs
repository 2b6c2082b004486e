//! Review of the eviction rule that takes first, of the states idle at `reached` (the latest
//! reading known to have been taken: the insert's, the one published for evictions, and every
//! one the bucket's states' counts show), the one idle from the earliest reading, and where none
//! is, the most permits available at the insert's reading, then the least recently counted
//! (`Candidate::victim_key` in `src/service/store.rs`), through the public API only.
//!
//! The tests aim at what `reached` cannot see and at what inflates it: readings taken since a
//! held insert's reading that write nothing to the bucket (a peek, a refused request of several
//! permits, a decision under another plan), a state whose counts run far ahead (a thread
//! reading ahead), and seeded runs of two threads with their own readings, with rule changes and
//! sweeps, checked decision by decision against a twin service that never evicts.
//!
//! What they hold the service to (the store's module docs, the README's "Full is a stated
//! policy", `ServiceBuilder::capacity`): an evicted client gains at most one limit's worth per
//! counted eviction (two under the sliding window counter); a new client's insert never resets
//! a client that is active at the readings taken since its reading while another slot holds a
//! client idle at all of them; no panic, no hang, no `Err`; `len()` within capacity.
//!
//! # Findings
//!
//! 1. Sliding window counter: a reading taken since a held insert's reading that writes nothing
//!    to the bucket's states is not in `reached`, and the fallback (most permits at the
//!    insert's reading) does not order the counter's states as their idleness does. Limit 4 per
//!    1 s, one bucket of 8: keys 1..=7 spend 4 at 9.5 s (word `(window 9, 4, 0)`: idle from
//!    11 s), key 8 takes 1 at 10.1 s (`(10, 1, 0)`: idle from 12 s). Key 100's first request
//!    reads 10.2 s and is held after its second reading; at 11.1 s key 8 asks for 4 permits and
//!    is refused (3 left: its window 10 weighs ceil(0.9) = 1), or is only peeked, or a client of
//!    another plan is decided there. At 11.1 s, the only reading taken since, keys 1..=7 are
//!    idle (4 left each) and key 8 is active (3 left). At 10.2 s none is idle and
//!    `reached` = 10.2 s (the refused request and the peek write nothing, and the other plan's
//!    state is in another store), so the fallback takes the most permits there: key 8's 3
//!    against keys 1..=7's ceil(4 * 0.8) = 4 weighed, 0 left. Key 8 is evicted:
//!    `[evictions, key 8's peek at 11.1 s during the hold, key 8's grants at 11.1 s after]` is
//!    `[1, 3, 4]` against the control's `[0, 3, 3]`, for each of the three readings since
//!    (`an_unrecorded_reading_since_never_gets_the_active_counter_client_reset`). It stays within
//!    the bound (one permit gained, the bound test passes). A decision since that writes key 1's
//!    state (counts at window 11) puts 11 s in `reached` and key 8 is kept
//!    (`a_recorded_reading_since_keeps_the_active_counter_client`, passes). The token bucket and
//!    the fixed window order their states at the insert's reading as their idleness does (the
//!    later TAT, the later window, is never idle first), and seeded runs of unrecorded
//!    readings since find no break for them (600 seeds each). Under the sliding window counter
//!    the same runs find 3 breaks in 600 (seeds 148, 400 and 576), each a reset of this kind, e.g.
//!    seed 148: a clock stepped back to 9.0 s for the insert, after a sweep published 10.55 s;
//!    keys 4 and 7 hold `(window 9, 4, 0)` (idle from 11 s), key 5 `(10, 2, 1)` (idle from
//!    12 s); the only reading since is a decision under the other plan at 11.6 s, where keys 4
//!    and 7 are idle and key 5 is active (3 left); `reached` = 10.55 s, where none is idle, and
//!    at 9.0 s key 5 (judged at the start of its window 10) shows 1 left against keys 4 and 7's
//!    0, so key 5 is evicted (it peeks 4 at 11.6 s against the control's 3). (All three seeded
//!    breaks have their reading since under the other plan.) This breaks the promise as worded
//!    ("active at the readings taken since", any reading the service took); it is not one if
//!    the promise is meant only for readings the bucket's states or `evicted_up_to` show.
//!    The store's module docs, the README and `ServiceBuilder::capacity` now state the promise
//!    for the readings the bucket's states show, and this case as its limit; the two tests stay
//!    ignored as its record.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::Duration;

use tollgate::{Algorithm, Clock, FakeClock, RateLimiterService, Rule, ServiceBuilder};

/// The methods whose clients live in the fixed store.
const STORE_METHODS: [Algorithm; 3] = [
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowCounter,
];

/// The plan under test, and another plan of the same service (a store of its own).
const PLAN: &str = "p";
const OTHER_PLAN: &str = "q";

/// 4 permits a second (the token bucket's emission interval is 250 ms).
const LIMIT: u64 = 4;
const WINDOW: Duration = Duration::from_secs(1);

/// One bucket of 8 slots: every key's home and other bucket.
const ONE_BUCKET: usize = 8;

/// A first request into a full store: its first reading is taken before the insert's lock, its
/// second with the lock let go once no slot was free.
const SECOND_READING: u64 = 2;

/// The new client whose first request is held.
const NEW_KEY: u64 = 100;

type Hook = Box<dyn FnOnce()>;

thread_local! {
    /// Readings this thread has taken.
    static READINGS: Cell<u64> = const { Cell::new(0) };
    /// A hook run just after this thread's reading of that number is taken.
    static AFTER_READING: RefCell<Option<(u64, Hook)>> = const { RefCell::new(None) };
    /// Added to every reading this thread takes (a core whose counter is behind or ahead).
    static OFFSET_NANOS: Cell<i64> = const { Cell::new(0) };
}

/// A [`FakeClock`] read through per-thread scripts (see `AFTER_READING`, `OFFSET_NANOS`).
#[derive(Debug, Clone, Default)]
struct ScriptedClock(FakeClock);

impl Clock for ScriptedClock {
    fn now_nanos(&self) -> u64 {
        let number = READINGS.with(|readings| {
            readings.set(readings.get() + 1);
            readings.get()
        });
        let reading = self
            .0
            .now_nanos()
            .saturating_add_signed(OFFSET_NANOS.with(Cell::get));
        let hook = AFTER_READING.with(|at| {
            let mut at = at.borrow_mut();
            match at.as_ref() {
                Some((nth, _)) if *nth == number => at.take().map(|(_, hook)| hook),
                _ => None,
            }
        });
        if let Some(hook) = hook {
            hook();
        }
        reading
    }
}

fn after_reading(nth: u64, hook: impl FnOnce() + 'static) {
    let at = READINGS.with(Cell::get) + nth;
    AFTER_READING.with(|slot| *slot.borrow_mut() = Some((at, Box::new(hook))));
}

fn hook_ran() -> bool {
    AFTER_READING.with(|slot| slot.borrow().is_none())
}

fn set_offset(offset: i64) {
    OFFSET_NANOS.with(|cell| cell.set(offset));
}

type Service = RateLimiterService<u64, &'static str, ScriptedClock>;

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// The most one client may gain per counted eviction.
fn per_eviction(algorithm: Algorithm) -> u64 {
    if algorithm == Algorithm::SlidingWindowCounter {
        2 * LIMIT
    } else {
        LIMIT
    }
}

/// A service of `algorithm` (plans `p` and `q`, each with a store of `capacity`), and a tally
/// of the decisions asked of each plan, to hold `stats()` to.
struct Harness {
    algorithm: Algorithm,
    capacity: usize,
    clock: FakeClock,
    service: Service,
    /// `[allowed, denied]` of plan `p`, then of plan `q`.
    tally: [[AtomicU64; 2]; 2],
}

impl Harness {
    fn with_capacity(algorithm: Algorithm, start_ms: u64, capacity: usize) -> Arc<Self> {
        let clock = FakeClock::starting_at(millis(start_ms));
        let rule = Rule::new(LIMIT, WINDOW).unwrap();
        let service = ServiceBuilder::new(algorithm, ScriptedClock(clock.clone()))
            .plan(PLAN, rule)
            .plan(OTHER_PLAN, rule)
            .capacity(capacity)
            .count_decisions(true)
            .build::<u64>()
            .unwrap();
        Arc::new(Harness {
            algorithm,
            capacity,
            clock,
            service,
            tally: Default::default(),
        })
    }

    fn new(algorithm: Algorithm, start_ms: u64) -> Arc<Self> {
        Harness::with_capacity(algorithm, start_ms, ONE_BUCKET)
    }

    fn set(&self, ms: u64) {
        self.clock.set(millis(ms));
    }

    /// `n` permits for `key` under `plan`, all or nothing (an `Err` fails the test), tallied.
    fn acquire_in(&self, plan: &'static str, key: u64, n: u64) -> bool {
        let granted = self
            .service
            .acquire(&key, &plan, n)
            .unwrap_or_else(|error| panic!("{}: {plan} key {key}: {error}", self.algorithm))
            .is_allowed();
        let plan_index = usize::from(plan == OTHER_PLAN);
        let tally = &self.tally[plan_index][usize::from(!granted)];
        tally.fetch_add(1, Ordering::Relaxed);
        granted
    }

    fn acquire(&self, key: u64, n: u64) -> bool {
        self.acquire_in(PLAN, key, n)
    }

    fn allow(&self, key: u64) -> bool {
        self.acquire(key, 1)
    }

    /// Asks for `key` one permit at a time until denied: the permits granted.
    fn spend(&self, key: u64) -> u64 {
        let mut granted = 0;
        while granted <= 4 * LIMIT && self.allow(key) {
            granted += 1;
        }
        granted
    }

    fn sweep(&self) -> usize {
        self.service.sweep()
    }

    /// What `key` peeks left at this thread's reading (a peek changes nothing).
    fn remaining(&self, key: u64) -> u64 {
        self.service
            .peek(&key, &PLAN)
            .unwrap_or_else(|error| panic!("{}: peek of key {key}: {error}", self.algorithm))
            .remaining()
    }

    /// `stats()` counted every tallied decision; `len()` within the stores' capacity.
    fn check_counts(&self, what: &str) {
        for (plan_index, plan) in [PLAN, OTHER_PLAN].into_iter().enumerate() {
            let stats = self.service.stats(&plan).unwrap();
            let [allowed, denied] = &self.tally[plan_index];
            assert_eq!(
                (stats.allowed, stats.denied),
                (
                    allowed.load(Ordering::Relaxed),
                    denied.load(Ordering::Relaxed)
                ),
                "{}, {what}: stats (allowed, denied) of plan {plan} against the decisions asked",
                self.algorithm
            );
        }
        assert!(
            self.service.len() <= 2 * self.capacity,
            "{}, {what}: len {} (at most {} over two plans)",
            self.algorithm,
            self.service.len(),
            2 * self.capacity
        );
    }
}

/// One test at a time where threads park (each wants both cores).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner)
}

const WATCHDOG: Duration = Duration::from_secs(8);

fn wait_for<T>(receiver: &Receiver<T>, what: &str) -> T {
    receiver
        .recv_timeout(WATCHDOG)
        .unwrap_or_else(|_| panic!("timed out after {WATCHDOG:?}: {what}"))
}

/// `run` on a thread of its own whose clock reads `offset` nanoseconds off the shared one,
/// watched: a hang fails the test.
fn on_thread<T: Send + 'static>(
    what: &str,
    offset: i64,
    run: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (done_tx, done_rx) = channel();
    let handle = thread::spawn(move || {
        set_offset(offset);
        let outcome = run();
        let _ = done_tx.send(());
        outcome
    });
    wait_for(&done_rx, what);
    handle.join().expect("the watched thread does not panic")
}

/// What a request started by [`held_after_second_reading`] did first.
enum Started {
    /// Held just after its second reading: the sender resumes it.
    Held(Sender<()>, thread::JoinHandle<bool>),
    /// Done without being held (it found a free slot, or a state of its own): granted or not.
    Done(bool),
}

/// A first request of `key` (one permit) on another thread on the shared clock, held just after
/// its second reading, which it takes only where no slot is free.
fn held_after_second_reading(harness: &Arc<Harness>, key: u64) -> Started {
    let (event_tx, event_rx) = channel::<Option<bool>>();
    let (resume_tx, resume_rx) = channel::<()>();
    let request = {
        let harness = Arc::clone(harness);
        thread::spawn(move || {
            let held_tx = event_tx.clone();
            after_reading(SECOND_READING, move || {
                held_tx.send(None).unwrap();
                resume_rx.recv().unwrap();
            });
            let granted = harness.allow(key);
            if !hook_ran() {
                let _ = event_tx.send(Some(granted));
            }
            granted
        })
    };
    match wait_for(&event_rx, "the first request is held or done") {
        None => Started::Held(resume_tx, request),
        Some(granted) => {
            request.join().expect("the request does not panic");
            Started::Done(granted)
        }
    }
}

/// Resumes a held request and waits (watched) for it: whether it was granted.
fn resume(started: Started) -> bool {
    match started {
        Started::Done(granted) => granted,
        Started::Held(resume_tx, request) => {
            resume_tx.send(()).unwrap();
            let (done_tx, done_rx) = channel();
            let waiter = thread::spawn(move || {
                let granted = request.join().expect("the request does not panic");
                let _ = done_tx.send(());
                granted
            });
            wait_for(&done_rx, "the resumed request completes");
            waiter.join().unwrap()
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A reading since the held insert's that writes nothing to the bucket.
// ---------------------------------------------------------------------------------------------

/// What is done at the reading taken since the held insert's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Since {
    /// Key 8 asks for its whole limit (refused where it is active: a refusal writes nothing).
    RefusedSeveral,
    /// Key 8 is only peeked (at that reading, as under every variant).
    Peek,
    /// A client of the other plan takes a permit (its state is in the other plan's store).
    OtherPlan,
    /// Key 1 takes a permit: a decision that writes a state of the bucket, so its window is in
    /// `reached`.
    Recorded,
}

const OLD_SPEND: u64 = 9_500;
const LIGHT_USE: u64 = 10_100;
const INSERT_READS: u64 = 10_200;
const SINCE: u64 = 11_100;

/// Keys 1..=7 spend their limit at 9.5 s, key 8 takes one permit at 10.1 s (last slot); key
/// 100's first request reads 10.2 s and is held after its second reading (where `held`; the
/// control makes no such request); at 11.1 s `since` is done and keys 1..=8 are peeked; the
/// request resumes. Returns `[evictions, key 8's peek at 11.1 s during the hold, key 8's grants
/// at 11.1 s after]` and the peeks of keys 1..=7 during the hold.
fn unrecorded_since_outcome(
    algorithm: Algorithm,
    since: Since,
    held: bool,
) -> ([u64; 3], Vec<u64>) {
    let harness = Harness::new(algorithm, OLD_SPEND);
    for key in 1..=7 {
        assert_eq!(harness.spend(key), LIMIT, "{algorithm}: key {key} at 9.5 s");
    }
    harness.set(LIGHT_USE);
    assert!(harness.allow(8), "{algorithm}: key 8 at 10.1 s");
    assert_eq!(
        harness.service.len(),
        ONE_BUCKET,
        "{algorithm}: a full bucket"
    );
    harness.set(INSERT_READS);
    let started = held.then(|| held_after_second_reading(&harness, NEW_KEY));
    harness.set(SINCE);
    match since {
        Since::RefusedSeveral => {
            // Granted only where key 8 is idle at 11.1 s; refused (nothing written) otherwise.
            harness.acquire(8, LIMIT);
        }
        Since::Peek => {}
        Since::OtherPlan => {
            assert!(harness.acquire_in(OTHER_PLAN, 1, 1), "{algorithm}: plan q");
        }
        Since::Recorded => {
            assert!(harness.allow(1), "{algorithm}: key 1 at 11.1 s");
        }
    }
    let peeked = harness.remaining(8);
    let others: Vec<u64> = (1..=7).map(|key| harness.remaining(key)).collect();
    if let Some(started) = started {
        assert!(
            matches!(started, Started::Held(..)),
            "{algorithm}: key 100's request was held after its second reading"
        );
        resume(started);
    }
    let after = harness.spend(8);
    harness.check_counts("an unrecorded reading since");
    ([harness.service.evictions(), peeked, after], others)
}

/// The scenario of finding 1 under the sliding window counter, for each reading since that
/// writes nothing to the bucket: at 11.1 s keys 1..=7 are idle (4 left each) and key 8 is
/// active (3 left), so key 8 must get at 11.1 s what it gets without key 100's request.
///
/// Fails: `[1, 3, 4]` against the control's `[0, 3, 3]` for each of the three.
#[test]
#[ignore = "finding: an unrecorded reading since (refused request of 4, peek, other plan) is not in `reached`; the counter client active there is evicted over 7 idle ones ([1, 3, 4] vs [0, 3, 3])"]
fn an_unrecorded_reading_since_never_gets_the_active_counter_client_reset() {
    let _serial = serial();
    let algorithm = Algorithm::SlidingWindowCounter;
    let mut outcomes = Vec::new();
    for since in [Since::RefusedSeveral, Since::Peek, Since::OtherPlan] {
        let (control, control_others) = unrecorded_since_outcome(algorithm, since, false);
        let (outcome, others) = unrecorded_since_outcome(algorithm, since, true);
        assert_eq!(control, [0, 3, 3], "{since:?}: the control");
        assert_eq!(control_others, vec![LIMIT; 7], "{since:?}: keys 1..=7 idle");
        assert_eq!(others, vec![LIMIT; 7], "{since:?}: keys 1..=7 idle");
        outcomes.push((since, outcome, control));
    }
    assert!(
        outcomes
            .iter()
            .all(|(_, outcome, control)| outcome[0] <= 1 && outcome[1..] == control[1..]),
        "(reading since, [evictions, key 8's peek at 11.1 s, grants after], control's): \
         {outcomes:?}"
    );
}

/// The same with a decision since that writes a state of the bucket (key 1 takes a permit at
/// 11.1 s: its counts show window 11): `reached` is then 11 s, where keys 2..=7 are idle, so one
/// of them is taken and key 8 keeps its state (`[1, 3, 3]`).
#[test]
fn a_recorded_reading_since_keeps_the_active_counter_client() {
    let _serial = serial();
    let algorithm = Algorithm::SlidingWindowCounter;
    let (control, _) = unrecorded_since_outcome(algorithm, Since::Recorded, false);
    let (outcome, _) = unrecorded_since_outcome(algorithm, Since::Recorded, true);
    assert_eq!(control, [0, 3, 3], "the control");
    assert_eq!(outcome, [1, 3, 3], "key 8 kept, one of keys 2..=7 evicted");
}

/// Every method, every reading since: key 8 gains at most one limit per counted eviction (two
/// under the sliding window counter) over the control, and one first request makes at most one
/// eviction.
#[test]
fn an_unrecorded_reading_since_gives_one_limit_per_eviction_at_most() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        for since in [
            Since::RefusedSeveral,
            Since::Peek,
            Since::OtherPlan,
            Since::Recorded,
        ] {
            let ([_, _, control], _) = unrecorded_since_outcome(algorithm, since, false);
            let ([evictions, _, after], _) = unrecorded_since_outcome(algorithm, since, true);
            assert!(
                evictions <= 1 && after <= control + per_eviction(algorithm) * evictions,
                "{algorithm}, {since:?}: {evictions} evictions, key 8 granted {after} at 11.1 s \
                 against {control}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A state counted far ahead inflates `reached`.
// ---------------------------------------------------------------------------------------------

/// How far ahead the skewed thread's clock reads: 3 s, 100 s, an hour.
const AHEAD_NANOS: [i64; 3] = [3_000_000_000, 100_000_000_000, 3_600_000_000_000];

/// Keys 1..=6 spend their limit at 9.5 s, key 7 at 10.15 s, key 8 takes one permit on a thread
/// whose clock reads `ahead` (or on the shared clock at 10.15 s where `ahead` is 0); key 100's
/// first request reads 10.2 s and is held; at 11.1 s keys 1..=8 are peeked (the readings taken
/// since); the request resumes. Returns the peeks of keys 1..=8 at 11.1 s during the hold and
/// after, and the evictions.
fn ahead_outcome(algorithm: Algorithm, ahead: i64, held: bool) -> (Vec<u64>, Vec<u64>, u64) {
    let harness = Harness::new(algorithm, OLD_SPEND);
    for key in 1..=6 {
        assert_eq!(harness.spend(key), LIMIT, "{algorithm}: key {key} at 9.5 s");
    }
    harness.set(10_150);
    assert_eq!(harness.spend(7), LIMIT, "{algorithm}: key 7 at 10.15 s");
    {
        let harness = Arc::clone(&harness);
        let granted = on_thread("key 8 on a thread ahead", ahead, move || harness.allow(8));
        assert!(
            granted,
            "{algorithm}: key 8's first permit, {ahead} ns ahead"
        );
    }
    harness.set(INSERT_READS);
    let started = held.then(|| held_after_second_reading(&harness, NEW_KEY));
    harness.set(SINCE);
    let during: Vec<u64> = (1..=8).map(|key| harness.remaining(key)).collect();
    let held_at_all = matches!(started, Some(Started::Held(..)));
    if let Some(started) = started {
        resume(started);
    }
    assert!(held_at_all || !held, "{algorithm}: key 100's request held");
    let after: Vec<u64> = (1..=8).map(|key| harness.remaining(key)).collect();
    harness.check_counts("a state counted ahead");
    (during, after, harness.service.evictions())
}

/// Key 8's counts run far ahead (a thread reading 3 s, 100 s, an hour ahead), so `reached` is
/// there, where keys 1..=7 are all idle. At 11.1 s, the reading taken since, keys 1..=6 are
/// idle; key 7 (spent at 10.15 s) and key 8 (counted ahead) are judged as the control judges
/// them. The victim must be one of keys 1..=6 (idle from the earliest reading): keys 7 and 8
/// peek at 11.1 s what they peek in the control; one eviction at most; no key gains more than
/// one limit per eviction.
#[test]
fn a_state_counted_far_ahead_never_gets_a_later_idle_client_taken_first() {
    let _serial = serial();
    let mut failures = Vec::new();
    for algorithm in STORE_METHODS {
        for ahead in AHEAD_NANOS {
            let (during, control, _) = ahead_outcome(algorithm, ahead, false);
            let (_, outcome, evictions) = ahead_outcome(algorithm, ahead, true);
            assert_eq!(during, control, "{algorithm}: peeks are no decisions");
            let gained_too_much = (0..8)
                .any(|index| outcome[index] > control[index] + per_eviction(algorithm) * evictions);
            // Keys 7 and 8 kept; a reset key among 1..=6 was idle at 11.1 s anyway.
            if evictions > 1 || gained_too_much || outcome[6..] != control[6..] {
                failures.push((algorithm, ahead, evictions, outcome, control));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "(method, ahead, evictions, peeks at 11.1 s, control's): {failures:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Seeded runs: readings since that the bucket does or does not see.
// ---------------------------------------------------------------------------------------------

/// A small deterministic generator (SplitMix64).
struct Seeded(u64);

impl Seeded {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A reading between 8 s and 12 s, in steps of 50 ms.
    fn reading(&mut self) -> u64 {
        8_000 + 50 * self.below(81)
    }

    fn permits(&mut self) -> u64 {
        1 + self.below(LIMIT)
    }
}

/// One step of a seeded run, replayed on both services.
#[derive(Debug, Clone, Copy)]
enum Step {
    Acquire {
        at: u64,
        key: u64,
        n: u64,
    },
    Sweep {
        at: u64,
    },
    /// A decision under the other plan.
    Other {
        at: u64,
        key: u64,
        n: u64,
    },
    Peek {
        at: u64,
        key: u64,
    },
}

impl Step {
    fn at(self) -> u64 {
        match self {
            Step::Acquire { at, .. }
            | Step::Sweep { at }
            | Step::Other { at, .. }
            | Step::Peek { at, .. } => at,
        }
    }

    fn run(self, harness: &Harness) {
        harness.set(self.at());
        match self {
            Step::Acquire { key, n, .. } => {
                harness.acquire(key, n);
            }
            Step::Sweep { .. } => {
                harness.sweep();
            }
            Step::Other { key, n, .. } => {
                harness.acquire_in(OTHER_PLAN, key, n);
            }
            Step::Peek { key, .. } => {
                harness.remaining(key);
            }
        }
    }
}

/// Keys 1..=8 take the bucket's slots, spends (and sweeps after which every key comes back) at
/// readings that step back and forth; key 100's first request reads `insert_at` and is held;
/// the `since` steps run (mostly ones that write nothing to the bucket: peeks, requests of
/// several permits, decisions under the other plan); the request resumes.
#[derive(Debug, Clone)]
struct Case {
    steps: Vec<Step>,
    insert_at: u64,
    since: Vec<Step>,
}

impl Case {
    fn new(seed: u64) -> Case {
        let mut rng = Seeded(seed);
        let mut steps = Vec::new();
        let start = rng.reading();
        for key in 1..=8 {
            let at = if rng.below(2) == 0 {
                start
            } else {
                rng.reading()
            };
            steps.push(Step::Acquire {
                at,
                key,
                n: rng.permits(),
            });
        }
        for _ in 0..rng.below(6) {
            if rng.below(4) == 0 {
                steps.push(Step::Sweep { at: rng.reading() });
                let back = rng.reading();
                for key in 1..=8 {
                    steps.push(Step::Acquire {
                        at: back,
                        key,
                        n: rng.permits(),
                    });
                }
            } else {
                steps.push(Step::Acquire {
                    at: rng.reading(),
                    key: 1 + rng.below(8),
                    n: rng.permits(),
                });
            }
        }
        let insert_at = rng.reading();
        let since = (0..1 + rng.below(3))
            .map(|_| {
                let at = insert_at + 50 * rng.below(61);
                let key = 1 + rng.below(8);
                match rng.below(4) {
                    0 => Step::Peek { at, key },
                    1 => Step::Other {
                        at,
                        key,
                        n: rng.permits(),
                    },
                    2 => Step::Acquire { at, key, n: LIMIT },
                    _ => Step::Acquire {
                        at,
                        key,
                        n: rng.permits(),
                    },
                }
            })
            .collect();
        Case {
            steps,
            insert_at,
            since,
        }
    }

    /// The readings taken since the insert's.
    fn since_readings(&self) -> Vec<u64> {
        let mut readings: Vec<u64> = self.since.iter().map(|step| step.at()).collect();
        readings.sort_unstable();
        readings.dedup();
        readings
    }
}

/// What a seeded run shows: each key's peeks at every reading since during the hold, each key's
/// peek at the latest reading since after, and the evictions.
#[derive(Debug, PartialEq, Eq)]
struct Ran {
    during: Vec<Vec<u64>>,
    after: Vec<u64>,
    evictions: u64,
    held: bool,
}

fn run_case(algorithm: Algorithm, case: &Case, insert: bool) -> Option<Ran> {
    let harness = Harness::new(algorithm, 8_000);
    for step in &case.steps {
        step.run(&harness);
    }
    if harness.service.len() != ONE_BUCKET {
        // A sweep left a slot free: no eviction to judge.
        return None;
    }
    assert_eq!(harness.service.evictions(), 0, "{algorithm}: {case:?}");
    harness.set(case.insert_at);
    let started = insert.then(|| held_after_second_reading(&harness, NEW_KEY));
    for step in &case.since {
        step.run(&harness);
    }
    let readings = case.since_readings();
    let during = readings
        .iter()
        .map(|&at| {
            harness.set(at);
            (1..=8).map(|key| harness.remaining(key)).collect()
        })
        .collect();
    let held = matches!(started, Some(Started::Held(..)));
    if let Some(started) = started {
        resume(started);
    }
    harness.set(*readings.last().unwrap());
    let after = (1..=8).map(|key| harness.remaining(key)).collect();
    harness.check_counts("a seeded run");
    Some(Ran {
        during,
        after,
        evictions: harness.service.evictions(),
        held,
    })
}

/// For each seed: the run with key 100's held request against the control without it. A key
/// that peeks more after than in the control was reset. Where it was active at every reading
/// taken since (less than its limit in the control's peeks) while another of keys 1..=8 was
/// idle at all of them, that is a break. Also: at most one eviction; no key gains past one
/// limit per eviction. Returns the breaks and the runs judged.
fn seeded_runs(algorithm: Algorithm, seeds: std::ops::Range<u64>) -> (Vec<String>, usize) {
    let mut breaks = Vec::new();
    let mut judged = 0;
    for seed in seeds {
        let case = Case::new(seed);
        let Some(control) = run_case(algorithm, &case, false) else {
            continue;
        };
        let outcome = run_case(algorithm, &case, true).expect("the same steps fill the bucket");
        assert_eq!(outcome.during, control.during, "{algorithm}, seed {seed}");
        assert!(
            outcome.evictions <= 1,
            "{algorithm}, seed {seed}: {} evictions for one first request",
            outcome.evictions
        );
        if !outcome.held {
            continue;
        }
        judged += 1;
        let active_throughout =
            |index: usize| control.during.iter().all(|peeks| peeks[index] < LIMIT);
        let idle_throughout =
            |index: usize| control.during.iter().all(|peeks| peeks[index] == LIMIT);
        for index in 0..8 {
            let (got, had) = (outcome.after[index], control.after[index]);
            assert!(
                got <= had + per_eviction(algorithm) * outcome.evictions,
                "{algorithm}, seed {seed}: key {} peeks {got} against the control's {had} \
                 after {} evictions: {case:?}",
                index + 1,
                outcome.evictions
            );
            if got > had && active_throughout(index) {
                let idle: Vec<usize> = (0..8)
                    .filter(|other| *other != index && idle_throughout(*other))
                    .map(|other| other + 1)
                    .collect();
                if !idle.is_empty() {
                    breaks.push(format!(
                        "seed {seed}: key {} reset ({had} -> {got}) though active at every \
                         reading since, while keys {idle:?} were idle at all of them: {case:?}",
                        index + 1
                    ));
                }
            }
        }
    }
    (breaks, judged)
}

const SEEDS: std::ops::Range<u64> = 0..600;

fn assert_no_break(algorithm: Algorithm) {
    let _serial = serial();
    let (breaks, judged) = seeded_runs(algorithm, SEEDS);
    assert!(
        judged >= 100,
        "{algorithm}: only {judged} runs held an insert"
    );
    let seeds: Vec<&str> = breaks
        .iter()
        .filter_map(|line| line.split(':').next())
        .collect();
    assert!(
        breaks.is_empty(),
        "{algorithm}: {} breaks in {judged} runs ({seeds:?}), first: {:?}",
        breaks.len(),
        breaks.first()
    );
}

/// Seeded runs with readings since that the bucket may not see, token bucket: no break.
#[test]
fn seeded_unrecorded_readings_since_never_reset_an_active_client_token_bucket() {
    assert_no_break(Algorithm::TokenBucket);
}

/// The same under the fixed window.
#[test]
fn seeded_unrecorded_readings_since_never_reset_an_active_client_fixed_window() {
    assert_no_break(Algorithm::FixedWindow);
}

/// The same under the sliding window counter (finding 1).
#[test]
#[ignore = "finding: seeded unrecorded readings since reset an active counter client beside idle ones: seeds 148, 400, 576 of 600 (finding 1)"]
fn seeded_unrecorded_readings_since_never_reset_an_active_client_sliding_window_counter() {
    assert_no_break(Algorithm::SlidingWindowCounter);
}

// ---------------------------------------------------------------------------------------------
// Two threads with their own readings, rule changes and sweeps, against a twin that never
// evicts.
// ---------------------------------------------------------------------------------------------

/// A thread whose clock reads `offset` off the shared one, running jobs one at a time.
struct Worker {
    jobs: Sender<Box<dyn FnOnce() + Send>>,
    done: Receiver<()>,
    handle: thread::JoinHandle<()>,
}

impl Worker {
    fn new(offset: i64) -> Worker {
        let (jobs, job_rx) = channel::<Box<dyn FnOnce() + Send>>();
        let (done_tx, done) = channel();
        let handle = thread::spawn(move || {
            set_offset(offset);
            for job in job_rx {
                job();
                let _ = done_tx.send(());
            }
        });
        Worker { jobs, done, handle }
    }

    fn run(&self, job: impl FnOnce() + Send + 'static) {
        self.jobs.send(Box::new(job)).unwrap();
        wait_for(&self.done, "a worker's job");
    }

    fn stop(self) {
        drop(self.jobs);
        self.handle.join().expect("the worker does not panic");
    }
}

/// The workers' clock offsets: the shared clock, 700 ms behind, 1.3 s ahead.
const OFFSETS: [i64; 3] = [0, -700_000_000, 1_300_000_000];

/// The plan's rules a run switches between (no limit above `LIMIT`).
fn rules() -> [Rule; 2] {
    [
        Rule::new(LIMIT, WINDOW).unwrap(),
        Rule::new(2, millis(500)).unwrap(),
    ]
}

#[derive(Debug, Clone, Copy)]
enum TwinStep {
    Acquire {
        worker: usize,
        at: u64,
        key: u64,
        n: u64,
    },
    Sweep {
        worker: usize,
        at: u64,
    },
    SetRule {
        rule: usize,
    },
}

fn twin_steps(seed: u64) -> Vec<TwinStep> {
    let mut rng = Seeded(seed ^ 0x5EED);
    let mut now: u64 = 8_000;
    (0..120)
        .map(|_| {
            // The shared clock mostly moves on, sometimes steps back.
            now = if rng.below(8) == 0 {
                now.saturating_sub(50 * rng.below(20)).max(8_000)
            } else {
                now + 25 * rng.below(8)
            };
            let worker = usize::try_from(rng.below(3)).unwrap();
            match rng.below(40) {
                0 => TwinStep::SetRule {
                    rule: usize::try_from(rng.below(2)).unwrap(),
                },
                1..=2 => TwinStep::Sweep { worker, at: now },
                _ => TwinStep::Acquire {
                    worker,
                    at: now,
                    // 16 keys over one bucket of 8: evictions.
                    key: 1 + rng.below(16),
                    n: if rng.below(3) == 0 { rng.permits() } else { 1 },
                },
            }
        })
        .collect()
}

/// Runs `steps` on `harness` with the workers, returning each key's cumulative grants after
/// each step and the evictions so far.
fn run_twin(harness: &Arc<Harness>, steps: &[TwinStep]) -> Vec<([u64; 17], u64)> {
    let workers: Vec<Worker> = OFFSETS.into_iter().map(Worker::new).collect();
    let mut granted = [0_u64; 17];
    let mut trace = Vec::new();
    for step in steps {
        match *step {
            TwinStep::Acquire { worker, at, key, n } => {
                harness.set(at);
                let (tx, rx) = channel();
                let h = Arc::clone(harness);
                workers[worker].run(move || {
                    let _ = tx.send(h.acquire(key, n));
                });
                if rx.recv().unwrap() {
                    granted[usize::try_from(key).unwrap()] += n;
                }
            }
            TwinStep::Sweep { worker, at } => {
                harness.set(at);
                let h = Arc::clone(harness);
                workers[worker].run(move || {
                    h.sweep();
                });
            }
            TwinStep::SetRule { rule } => {
                harness
                    .service
                    .set_rule(&PLAN, rules()[rule])
                    .expect("a valid rule");
            }
        }
        assert!(
            harness.service.len() <= 2 * harness.capacity,
            "{}: len {}",
            harness.algorithm,
            harness.service.len()
        );
        trace.push((granted, harness.service.evictions()));
    }
    for worker in workers {
        worker.stop();
    }
    harness.check_counts("a twin run");
    trace
}

/// Seeded runs of three threads with their own readings (the shared clock, 700 ms behind, 1.3 s
/// ahead, the shared clock stepping back at times), 16 keys over one bucket of 8, sweeps and
/// rule changes, against a twin service large enough never to evict: after every step, each
/// key's grants so far exceed the twin's by at most one limit per counted eviction so far (two
/// under the sliding window counter).
#[test]
fn threads_with_their_own_readings_gain_one_limit_per_eviction_at_most() {
    let _serial = serial();
    let mut evictions_seen = 0;
    for algorithm in STORE_METHODS {
        for seed in 0..25 {
            let steps = twin_steps(seed);
            let small = Harness::new(algorithm, 8_000);
            let large = Harness::with_capacity(algorithm, 8_000, 1 << 12);
            let outcome = run_twin(&small, &steps);
            let control = run_twin(&large, &steps);
            assert_eq!(
                large.service.evictions(),
                0,
                "{algorithm}, seed {seed}: the twin never evicts"
            );
            for (index, ((got, evictions), (had, _))) in outcome.iter().zip(&control).enumerate() {
                for key in 1..=16 {
                    assert!(
                        got[key] <= had[key] + per_eviction(algorithm) * evictions,
                        "{algorithm}, seed {seed}, step {index} ({:?}): key {key} granted {} \
                         against the twin's {} after {evictions} evictions",
                        steps[index],
                        got[key],
                        had[key]
                    );
                }
            }
            evictions_seen += outcome.last().unwrap().1;
        }
    }
    assert!(evictions_seen > 0, "the runs evicted");
}
