//! Review of df52588 (an eviction chose, among the states alike at the insert's reading, the
//! one with the most permits available at `reached`, the latest reading the bucket's states'
//! counts show a decision took), through the public API only, and of the choice that replaced
//! it: among states alike at the insert's reading, the one whose own counts end earliest (the
//! least recently used).
//!
//! The case df52588 fixed (review_reuse_reading's held request): keys 1..=7 idle since 0.4 s,
//! key 8 (last slot) spent at 10.5 s, a first request whose reading (0.5 s) lags them all finds
//! nothing idle at its reading and evicts; the tie at 0.5 s must not go to key 8.
//!
//! The tests here aim at one state's counts running ahead of every other decision (a thread
//! whose clock is ahead, a clock stepped back afterwards). They also race inserts at skewed
//! readings against the hot client they must not reset, a rule change and sweeps against a
//! held insert, and readings at the clock's far end.
//!
//! What they hold the service to: a new client's insert never resets a client that is active at
//! the readings taken since while another slot is idle at all of them (as review_reuse_reading's
//! fixed test states it: `[evictions <= 1, key 8's peek 0, key 8's grants after 0]`); a client
//! gains at most one limit's worth per counted eviction (two under the sliding window counter);
//! no panic, no hang, no `Err`; `len()` within capacity.
//!
//! # Findings (at df52588)
//!
//! `a_state_counted_ahead_never_makes_a_lagging_insert_evict_the_active_client` (and its twins
//! `a_held_request_and_a_state_counted_ahead_never_evict_the_active_client`, with a request held
//! after its second reading, and `a_clock_stepped_back_never_makes_a_held_request_evict_the_active_client`,
//! with one shared clock stepped back from 12.5 s to 10.5 s) failed for every method and every
//! skew tried (2 s, 1 h, ~292 years ahead) with `[evictions, key 8's peek, key 8's grants after]
//! = [1, 4, 4]`. One key (7) decided at a reading ahead of the others'; `reached` was that
//! reading, where keys 1..=6 *and* the active key 8 (spent at 10.5 s) all show their full limit,
//! so the tie went to the last slot, key 8, as at 7bb2351. Key 8 was then granted its limit again
//! at 10.5 s (8 grants at one reading under a limit of 4: within the bound of one limit per
//! counted eviction, but the reset df52588 set out to prevent). In the race with a thread 2 s
//! ahead, the hot client was reset in 12 of 20 token-bucket runs and 1 of 20 sliding-window-
//! counter runs. Ordering ties by each state's own counts (the earliest end first, 6ed6a86), and
//! then taking first, of the states idle at the latest reading known, the one idle from the
//! earliest (review_victim_2 found the windowed methods' counts misleading), passes all of them,
//! and the race asserts no reset with a thread ahead too.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

const PLAN: &str = "p";

/// 4 permits a second (the token bucket's emission interval is 250 ms).
const LIMIT: u64 = 4;
const WINDOW: Duration = Duration::from_secs(1);

/// One bucket of 8 slots: every key's home and other bucket.
const ONE_BUCKET: usize = 8;

/// A first request into a full store: its first reading is taken before the insert's lock, its
/// second with the lock let go once no slot was free.
const SECOND_READING: u64 = 2;

/// How far ahead the skewed thread's clock reads: 2 s (just past the active key's window), an
/// hour, and the far end of what an `i64` offset reaches (about 292 years).
const AHEAD_NANOS: [i64; 3] = [2_000_000_000, 3_600_000_000_000, i64::MAX];

/// How far behind the lagging inserter's clock reads (10.5 s on the shared clock reads 0.5 s).
const BEHIND_NANOS: i64 = -10_000_000_000;

type Hook = Box<dyn FnOnce()>;

thread_local! {
    /// Readings this thread has taken.
    static READINGS: Cell<u64> = const { Cell::new(0) };
    /// A hook run just after this thread's reading of that number is taken (a thread held once
    /// it has read).
    static AFTER_READING: RefCell<Option<(u64, Hook)>> = const { RefCell::new(None) };
    /// Added to every reading this thread takes (a core whose counter is ahead or behind).
    static OFFSET_NANOS: Cell<i64> = const { Cell::new(0) };
    /// Where set, every reading this thread takes (a clock at its far end).
    static READ_AS: Cell<Option<u64>> = const { Cell::new(None) };
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
        let reading = READ_AS.with(Cell::get).unwrap_or_else(|| {
            self.0
                .now_nanos()
                .saturating_add_signed(OFFSET_NANOS.with(Cell::get))
        });
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

/// Runs `hook` just after this thread's `nth` reading from now (1: the next one).
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

/// The most one client may be granted per counted eviction.
fn per_eviction(algorithm: Algorithm) -> u64 {
    if algorithm == Algorithm::SlidingWindowCounter {
        2 * LIMIT
    } else {
        LIMIT
    }
}

/// A one-bucket service of `algorithm`, and a tally of the decisions asked of it through
/// [`Harness::allow`], to hold `stats()` to.
struct Harness {
    algorithm: Algorithm,
    clock: FakeClock,
    service: Service,
    allowed: AtomicU64,
    denied: AtomicU64,
}

impl Harness {
    fn new(algorithm: Algorithm, start: Duration) -> Arc<Self> {
        Self::with_limit(algorithm, start, LIMIT)
    }

    fn with_limit(algorithm: Algorithm, start: Duration, limit: u64) -> Arc<Self> {
        let clock = FakeClock::starting_at(start);
        let service = ServiceBuilder::new(algorithm, ScriptedClock(clock.clone()))
            .plan(PLAN, Rule::new(limit, WINDOW).unwrap())
            .capacity(ONE_BUCKET)
            .count_decisions(true)
            .build::<u64>()
            .unwrap();
        Arc::new(Harness {
            algorithm,
            clock,
            service,
            allowed: AtomicU64::new(0),
            denied: AtomicU64::new(0),
        })
    }

    fn set(&self, ms: u64) {
        self.clock.set(millis(ms));
    }

    /// One permit for `key` (an `Err` fails the test), tallied.
    fn allow(&self, key: u64) -> bool {
        let granted = self
            .service
            .allow(&key, &PLAN)
            .unwrap_or_else(|error| panic!("{}: key {key}: {error}", self.algorithm));
        let tally = if granted { &self.allowed } else { &self.denied };
        tally.fetch_add(1, Ordering::Relaxed);
        granted
    }

    /// Asks for `key` until denied: its single permits granted (at most `up_to + 1`).
    fn spend_up_to(&self, key: u64, up_to: u64) -> u64 {
        let mut granted = 0;
        while granted <= up_to && self.allow(key) {
            granted += 1;
        }
        granted
    }

    fn spend(&self, key: u64) -> u64 {
        self.spend_up_to(key, LIMIT)
    }

    fn fill_spent(&self, keys: impl IntoIterator<Item = u64>) {
        for key in keys {
            assert_eq!(
                self.spend(key),
                LIMIT,
                "{}: key {key}: a fresh client's permits",
                self.algorithm
            );
        }
    }

    /// What `keys` peek left (on this thread's clock: peeks insert nothing).
    fn remaining(&self, keys: impl IntoIterator<Item = u64>) -> Vec<u64> {
        keys.into_iter()
            .map(|key| self.service.peek(&key, &PLAN).unwrap().remaining())
            .collect()
    }

    /// `stats()` counted every tallied decision, once; `len()` within the store's capacity.
    fn check_counts(&self, what: &str) {
        let stats = self.service.stats(&PLAN).unwrap();
        assert_eq!(
            (stats.allowed, stats.denied),
            (
                self.allowed.load(Ordering::Relaxed),
                self.denied.load(Ordering::Relaxed)
            ),
            "{}, {what}: stats (allowed, denied) against the decisions asked",
            self.algorithm
        );
        assert!(
            self.service.len() <= ONE_BUCKET,
            "{}, {what}: len {} (at most {ONE_BUCKET})",
            self.algorithm,
            self.service.len()
        );
    }
}

/// One test at a time where threads park or race (each wants both cores).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner)
}

const WATCHDOG: Duration = Duration::from_secs(10);

fn wait_for(receiver: &Receiver<()>, what: &str) {
    receiver
        .recv_timeout(WATCHDOG)
        .unwrap_or_else(|_| panic!("timed out after {WATCHDOG:?}: {what}"));
}

/// `run` on a thread of its own whose clock reads `offset` nanoseconds off the shared one,
/// watched: a hang fails the test (the thread is left spinning until the test binary exits).
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

/// A first request of `key` on another thread (its clock `offset` off the shared one), held
/// just after its second reading: returns once it is held, with the sender that resumes it and
/// its handle (whether it was granted, whether it was held).
fn held_after_second_reading(
    harness: &Arc<Harness>,
    key: u64,
    offset: i64,
) -> (Sender<()>, thread::JoinHandle<(bool, bool)>) {
    let (held_tx, held_rx) = channel::<()>();
    let (resume_tx, resume_rx) = channel::<()>();
    let request = {
        let harness = Arc::clone(harness);
        thread::spawn(move || {
            set_offset(offset);
            after_reading(SECOND_READING, move || {
                held_tx.send(()).unwrap();
                resume_rx.recv().unwrap();
            });
            let granted = harness.allow(key);
            (granted, hook_ran())
        })
    };
    wait_for(
        &held_rx,
        "the first request is held after its second reading",
    );
    (resume_tx, request)
}

/// Waits (watched) for a resumed request; whether it was granted (it must have been held).
fn finish(request: thread::JoinHandle<(bool, bool)>) -> bool {
    let (done_tx, done_rx) = channel();
    let waiter = thread::spawn(move || {
        let outcome = request.join().expect("the request does not panic");
        let _ = done_tx.send(());
        outcome
    });
    wait_for(&done_rx, "the resumed request completes");
    let (granted, held) = waiter.join().unwrap();
    assert!(held, "the request was held after its second reading");
    granted
}

/// Keys 1..=8 spend their limit at 0.4 s (slots 0..=7 in that order); at 10.5 s (the clock left
/// there) key 8, in the last slot, spends its limit again. Keys 1..=7 idle, key 8 active.
fn seven_idle_then_eight_active(harness: &Harness) {
    harness.set(400);
    harness.fill_spent(1..=8);
    harness.set(10_500);
    harness.fill_spent([8]);
    assert_eq!(
        harness.remaining(1..=8),
        [LIMIT, LIMIT, LIMIT, LIMIT, LIMIT, LIMIT, LIMIT, 0],
        "{}: seven idle, key 8 active",
        harness.algorithm
    );
}

/// Key 7 spends its limit on a thread whose clock reads `ahead` nanoseconds ahead (its state's
/// counts then run to a reading no other decision took).
fn spend_ahead(harness: &Arc<Harness>, key: u64, ahead: i64) {
    let granted = {
        let harness = Arc::clone(harness);
        on_thread("a decision at a reading ahead", ahead, move || {
            harness.spend(key)
        })
    };
    assert_eq!(
        granted, LIMIT,
        "{}: key {key} at a reading {ahead} ns ahead (idle there)",
        harness.algorithm
    );
}

/// Key 100's first request on a thread whose clock lags by 10 s (its reading 0.5 s: every
/// state shows nothing left there, so it evicts); what came of it for key 8:
/// `[evictions, key 8's peek, key 8's grants after]`, on the shared clock (10.5 s), with keys
/// 1..=6 checked untouched or fresh.
fn lagging_insert_outcome(harness: &Arc<Harness>) -> [u64; 3] {
    {
        let harness = Arc::clone(harness);
        on_thread("a lagging first request", BEHIND_NANOS, move || {
            harness.allow(100)
        });
    }
    let outcome = [
        harness.service.evictions(),
        harness.remaining([8])[0],
        harness.spend(8),
    ];
    assert_eq!(
        harness.remaining(1..=6),
        vec![LIMIT; 6],
        "{}: keys 1..=6 (one of them evicted, or reused) after",
        harness.algorithm
    );
    harness.check_counts("a lagging insert");
    outcome
}

fn key_8_kept(outcome: [u64; 3]) -> bool {
    let [evictions, peek, grants] = outcome;
    evictions <= 1 && [peek, grants] == [0, 0]
}

// ---------------------------------------------------------------------------------------------
// The case df52588 fixed, by a lagging thread instead of a held one (control).
// ---------------------------------------------------------------------------------------------

/// Keys 1..=7 idle since 0.4 s, key 8 (last slot) spent at 10.5 s; key 100's first request on a
/// thread whose clock lags 10 s (reading 0.5 s, where every state is spent) evicts one: the tie
/// at 0.5 s is broken at 10.5 s, where only key 8 is spent, so an idle key is taken. Expected per
/// method: `[evictions, key 8's peek, key 8's grants after]` = `[at most 1, 0, 0]`.
#[test]
fn a_lagging_insert_takes_a_client_idle_since_not_the_active_one() {
    let _serial = serial();
    let outcomes: Vec<(Algorithm, [u64; 3])> = STORE_METHODS
        .into_iter()
        .map(|algorithm| {
            let harness = Harness::new(algorithm, millis(400));
            seven_idle_then_eight_active(&harness);
            (algorithm, lagging_insert_outcome(&harness))
        })
        .collect();
    assert!(
        outcomes.iter().all(|(_, outcome)| key_8_kept(*outcome)),
        "[evictions, key 8's peek, key 8's grants after] per method: {outcomes:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// One state counted ahead of every other decision.
// ---------------------------------------------------------------------------------------------

/// As the control, but key 7 (slot 6) has spent its limit on a thread whose clock reads ahead
/// (2 s, an hour, ~292 years) before the lagging insert. Key 8 is active at every reading but
/// that one (10.5 s); keys 1..=6 are idle at every reading taken after the insert's (10.5 s and
/// the one ahead). Expected per method and skew: `[at most 1, 0, 0]`, as in the control.
#[test]
fn a_state_counted_ahead_never_makes_a_lagging_insert_evict_the_active_client() {
    let _serial = serial();
    let mut outcomes = Vec::new();
    for algorithm in STORE_METHODS {
        for ahead in AHEAD_NANOS {
            let harness = Harness::new(algorithm, millis(400));
            seven_idle_then_eight_active(&harness);
            spend_ahead(&harness, 7, ahead);
            outcomes.push((algorithm, ahead, lagging_insert_outcome(&harness)));
        }
    }
    assert!(
        outcomes.iter().all(|(.., outcome)| key_8_kept(*outcome)),
        "[evictions, key 8's peek, key 8's grants after] per (method, ns ahead): {outcomes:?}"
    );
}

/// review_reuse_reading's fixed test with one more decision: keys 1..=8 spend at 0.4 s; key
/// 100's first request is held just after its second reading (0.5 s); at 10.5 s key 8 spends its
/// limit again, and key 7 spends its limit on a thread 2 s ahead; the request resumes.
/// Expected per method: `[at most 1, 0, 0]`, as df52588 makes it without key 7's decision.
#[test]
fn a_held_request_and_a_state_counted_ahead_never_evict_the_active_client() {
    let _serial = serial();
    let outcomes: Vec<(Algorithm, [u64; 3])> = STORE_METHODS
        .into_iter()
        .map(|algorithm| {
            let harness = Harness::new(algorithm, millis(400));
            harness.fill_spent(1..=8);
            harness.set(500);
            let (resume, request) = held_after_second_reading(&harness, 100, 0);
            harness.set(10_500);
            harness.fill_spent([8]);
            spend_ahead(&harness, 7, AHEAD_NANOS[0]);
            resume.send(()).unwrap();
            finish(request);
            let outcome = [
                harness.service.evictions(),
                harness.remaining([8])[0],
                harness.spend(8),
            ];
            harness.check_counts("a held request and a state counted ahead");
            (algorithm, outcome)
        })
        .collect();
    assert!(
        outcomes.iter().all(|(_, outcome)| key_8_kept(*outcome)),
        "[evictions, key 8's peek, key 8's grants after] per method: {outcomes:?}"
    );
}

/// The same with one shared clock stepped back instead of a thread ahead: keys 1..=8 spend at
/// 0.4 s; key 100's first request is held just after its second reading (0.5 s); the clock
/// moves to 12.5 s, where key 7 spends its limit, then steps back to 10.5 s, where key 8 spends
/// its limit; the request resumes. Expected per method: `[at most 1, 0, 0]`.
#[test]
fn a_clock_stepped_back_never_makes_a_held_request_evict_the_active_client() {
    let _serial = serial();
    let outcomes: Vec<(Algorithm, [u64; 3])> = STORE_METHODS
        .into_iter()
        .map(|algorithm| {
            let harness = Harness::new(algorithm, millis(400));
            harness.fill_spent(1..=8);
            harness.set(500);
            let (resume, request) = held_after_second_reading(&harness, 100, 0);
            harness.set(12_500);
            harness.fill_spent([7]);
            harness.set(10_500);
            harness.fill_spent([8]);
            resume.send(()).unwrap();
            finish(request);
            let outcome = [
                harness.service.evictions(),
                harness.remaining([8])[0],
                harness.spend(8),
            ];
            harness.check_counts("a held request and a clock stepped back");
            (algorithm, outcome)
        })
        .collect();
    assert!(
        outcomes.iter().all(|(_, outcome)| key_8_kept(*outcome)),
        "[evictions, key 8's peek, key 8's grants after] per method: {outcomes:?}"
    );
}

/// The same reset bounded: after the lagging insert that follows a state counted ahead, key 8 is
/// granted at 10.5 s at most one limit per counted eviction (two under the sliding window
/// counter) beyond the limit it spent, whatever the skew; keys 1..=7 never more than their
/// limit at 10.5 s plus the same.
#[test]
fn a_state_counted_ahead_gives_the_evicted_client_one_limit_per_eviction_at_most() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        for ahead in AHEAD_NANOS {
            let harness = Harness::new(algorithm, millis(400));
            seven_idle_then_eight_active(&harness);
            spend_ahead(&harness, 7, ahead);
            {
                let harness = Arc::clone(&harness);
                on_thread("lagging first requests", BEHIND_NANOS, move || {
                    for key in 100..104 {
                        harness.allow(key);
                    }
                });
            }
            let evictions = harness.service.evictions();
            let after_8 = harness.spend_up_to(8, LIMIT * 10);
            assert!(
                evictions <= 4 && after_8 <= per_eviction(algorithm) * evictions,
                "{algorithm}, {ahead} ns ahead: key 8 granted {after_8} more at 10.5 s after \
                 {evictions} evictions (4 inserts)"
            );
            let after_7 = harness.spend_up_to(7, LIMIT * 10);
            assert!(
                after_7 <= per_eviction(algorithm) * evictions,
                "{algorithm}, {ahead} ns ahead: key 7 (spent ahead) granted {after_7} at 10.5 s \
                 after {evictions} evictions"
            );
            harness.check_counts("lagging inserts after a state counted ahead");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Racing inserts at skewed readings against the hot client.
// ---------------------------------------------------------------------------------------------

/// One race: seven idle clients and the hot key 8 (spent at 10.5 s); at once, a thread lagging
/// 10 s inserts 8 new keys (every one an eviction or a reuse at 0.5 s), a thread `ahead` ns ahead
/// (if any) spends keys 1..=3, and the hot client asks on the shared clock. Returns key 8's
/// grants at 10.5 s after its first limit, and the evictions.
fn race_once(algorithm: Algorithm, ahead: Option<i64>) -> (u64, u64) {
    let harness = Harness::new(algorithm, millis(400));
    seven_idle_then_eight_active(&harness);
    let stop = Arc::new(AtomicBool::new(false));
    let spawn = |offset: i64, run: Box<dyn FnOnce(&Harness) -> u64 + Send>| {
        let harness = Arc::clone(&harness);
        thread::spawn(move || {
            set_offset(offset);
            run(&harness)
        })
    };
    let lagging = spawn(
        BEHIND_NANOS,
        Box::new(|harness| {
            for key in 100..108 {
                harness.allow(key);
            }
            0
        }),
    );
    let ahead_thread = ahead.map(|ahead| {
        spawn(
            ahead,
            Box::new(|harness| {
                for key in 1..=3 {
                    harness.spend(key);
                }
                0
            }),
        )
    });
    let hot = {
        let stop = Arc::clone(&stop);
        spawn(
            0,
            Box::new(move |harness| {
                let mut granted = 0;
                while !stop.load(Ordering::Relaxed) {
                    granted += u64::from(harness.allow(8));
                    thread::yield_now();
                }
                granted
            }),
        )
    };
    let (done_tx, done_rx) = channel();
    let joiner = thread::spawn(move || {
        lagging.join().expect("the lagging thread does not panic");
        if let Some(ahead_thread) = ahead_thread {
            ahead_thread
                .join()
                .expect("the thread ahead does not panic");
        }
        let _ = done_tx.send(());
    });
    wait_for(&done_rx, "the racing inserts complete");
    joiner.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    let during = hot.join().expect("the hot thread does not panic");
    let after = harness.spend_up_to(8, LIMIT * 20);
    harness.check_counts("racing inserts at skewed readings");
    (during + after, harness.service.evictions())
}

/// 20 races per method, with no thread ahead and with one 2 s ahead: the hot key 8 is granted at
/// 10.5 s, after its first limit, at most one limit per counted eviction (two under the sliding
/// window counter), and is never reset at all: of the states spent at the lagging reading, the
/// inserts take those idle from the earliest readings (keys 4..=7, idle since 0.4 s, then the new
/// keys of the lagging thread), never key 8, used at 10.5 s (nor keys 1..=3, used ahead).
#[test]
fn racing_skewed_inserts_give_the_hot_client_one_limit_per_eviction_at_most() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        for ahead in [None, Some(AHEAD_NANOS[0])] {
            let mut resets = 0;
            for run in 0..20 {
                let (hot, evictions) = race_once(algorithm, ahead);
                assert!(
                    hot <= per_eviction(algorithm) * evictions,
                    "{algorithm}, ahead {ahead:?}, run {run}: the hot client granted {hot} more \
                     at 10.5 s after {evictions} evictions"
                );
                resets += u64::from(hot > 0);
            }
            assert_eq!(
                resets, 0,
                "{algorithm}, ahead {ahead:?}: races in which the hot client, active at every \
                 reading, was granted again with idle clients in the bucket"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A rule change and sweeps while an insert is held after its reading.
// ---------------------------------------------------------------------------------------------

/// Keys 1..=8 spend at 0.4 s; key 100's first request is held after its second reading
/// (0.5 s); the rule changes (limit 3), and key 8 spends the new limit at 10.5 s; the request
/// resumes. Every other state is of the earlier rule (reused before any eviction): nothing is
/// evicted, key 8 keeps its spent state, and key 100 was decided under the new rule.
#[test]
fn a_rule_change_while_an_insert_is_held_leaves_the_active_client_spent() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        let harness = Harness::new(algorithm, millis(400));
        harness.fill_spent(1..=8);
        harness.set(500);
        let (resume, request) = held_after_second_reading(&harness, 100, 0);
        harness
            .service
            .set_rule(&PLAN, Rule::new(3, WINDOW).unwrap())
            .unwrap();
        harness.set(10_500);
        assert_eq!(harness.spend_up_to(8, 3), 3, "{algorithm}: key 8, new rule");
        spend_ahead_up_to(&harness, 7, AHEAD_NANOS[0], 3);
        resume.send(()).unwrap();
        finish(request);
        let outcome = (
            harness.service.evictions(),
            harness.remaining([8])[0],
            harness.spend_up_to(8, 3),
            harness.spend_up_to(100, 3),
        );
        assert!(
            outcome.0 == 0 && outcome.1 == 0 && outcome.2 == 0 && outcome.3 <= 3,
            "{algorithm}: (evictions, key 8's peek, key 8's grants after, key 100's grants \
             after) = {outcome:?}"
        );
        harness.check_counts("a rule change while an insert is held");
    }
}

fn spend_ahead_up_to(harness: &Arc<Harness>, key: u64, ahead: i64, limit: u64) {
    let granted = {
        let harness = Arc::clone(harness);
        on_thread("a decision at a reading ahead", ahead, move || {
            harness.spend_up_to(key, limit)
        })
    };
    assert_eq!(granted, limit, "{}: key {key} ahead", harness.algorithm);
}

/// Keys 1..=8 spend at 0.4 s; key 100's first request is held after its second reading
/// (0.5 s); at 10.5 s key 8 spends its limit and a sweep frees the seven idle slots; key 7
/// (freed) spends on a thread 2 s ahead; the request resumes. A slot is free: no eviction, key 8
/// untouched.
#[test]
fn a_sweep_while_an_insert_is_held_leaves_a_free_slot_and_the_active_client() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        let harness = Harness::new(algorithm, millis(400));
        harness.fill_spent(1..=8);
        harness.set(500);
        let (resume, request) = held_after_second_reading(&harness, 100, 0);
        harness.set(10_500);
        harness.fill_spent([8]);
        let swept = harness.service.sweep();
        spend_ahead(&harness, 7, AHEAD_NANOS[0]);
        resume.send(()).unwrap();
        finish(request);
        let outcome = (
            swept,
            harness.service.evictions(),
            harness.remaining([8])[0],
            harness.spend(8),
        );
        assert_eq!(
            outcome,
            (7, 0, 0, 0),
            "{algorithm}: (swept, evictions, key 8's peek, key 8's grants after)"
        );
        harness.check_counts("a sweep while an insert is held");
    }
}

/// A sweep on a thread whose clock reads 2 s ahead retires the active key 8 too (idle at that
/// reading), and publishes that reading: key 8's next state is made as of it, so on the shared
/// clock (10.5 s) key 8 gains nothing; nor does a lagging insert after it.
#[test]
fn a_sweep_ahead_gives_the_active_client_nothing_back() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        let harness = Harness::new(algorithm, millis(400));
        seven_idle_then_eight_active(&harness);
        let swept = {
            let harness = Arc::clone(&harness);
            on_thread("a sweep ahead", AHEAD_NANOS[0], move || {
                harness.service.sweep()
            })
        };
        {
            let harness = Arc::clone(&harness);
            on_thread("a lagging first request", BEHIND_NANOS, move || {
                harness.allow(100)
            });
        }
        let outcome = (swept, harness.service.evictions(), harness.spend(8));
        assert!(
            outcome.0 <= ONE_BUCKET && outcome.1 == 0 && outcome.2 == 0,
            "{algorithm}: (swept, evictions, key 8's grants at 10.5 s after) = {outcome:?}"
        );
        harness.check_counts("a sweep ahead");
    }
}

// ---------------------------------------------------------------------------------------------
// Readings at the clock's far end.
// ---------------------------------------------------------------------------------------------

/// A full bucket whose states were decided at readings up to `u64::MAX` (a clock at its far
/// end), then first requests at ordinary readings and at `u64::MAX`: no panic, no hang, no
/// `Err`, `len()` within capacity, at most one eviction per first request, and no client granted
/// past one limit plus one per eviction at one reading.
#[test]
fn readings_at_the_far_end_neither_panic_nor_overcount() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        let harness = Harness::new(algorithm, millis(400));
        seven_idle_then_eight_active(&harness);
        for key in 5..=7 {
            let harness = Arc::clone(&harness);
            on_thread("decisions at the far end", 0, move || {
                READ_AS.with(|read_as| read_as.set(Some(u64::MAX - key)));
                harness.spend_up_to(key, LIMIT * 4)
            });
        }
        let firsts = 8;
        for key in 200..200 + firsts {
            let harness = Arc::clone(&harness);
            on_thread("first requests", BEHIND_NANOS, move || {
                if key % 2 == 1 {
                    READ_AS.with(|read_as| read_as.set(Some(u64::MAX)));
                }
                harness.allow(key)
            });
        }
        let evictions = harness.service.evictions();
        let key_8 = harness.spend_up_to(8, LIMIT * 20);
        assert!(
            evictions <= firsts && key_8 <= per_eviction(algorithm) * evictions,
            "{algorithm}: {evictions} evictions for {firsts} first requests; key 8 granted \
             {key_8} more at 10.5 s"
        );
        harness.check_counts("readings at the far end");
    }
}
