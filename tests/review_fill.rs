//! Review of a first request's fill (a4abbf4, e3c263b), through the public API only: the request
//! reads the clock once, *before* its insert takes the bucket's lock; the insert takes a slot
//! (free, reused as idle, or evicted), reads the plan's limits again, and decides the request on
//! the fresh state at that one reading before it publishes the slot (unless the state is made as
//! of a later reading, `evicted_up_to`: then it is published undecided and the lookup decides).
//!
//! The tests aim at that reading: a clock whose reading is taken and *then* the thread parks (a
//! thread preempted, or waiting for the bucket's lock, between its reading and its insert), so
//! that the insert works at a reading older than everything done meanwhile; readings moved per
//! thread (a core behind or ahead of the sweeper's); rule changes between one limit and several
//! while the request is parked; many threads racing first requests of one key against a
//! sweeper whose readings run ahead.
//!
//! What they hold the service to (its documented promises): no eviction while an idle or free
//! slot is among the key's buckets (`evictions()` counts only clients that were not idle), so a
//! flood never resets an active client while idle ones exist, and a new client then gets its
//! limit; a rule change starts a client afresh at most once; `peek` agrees with the request that
//! follows it; `stats()` counts every decision; `len()` never exceeds capacity; no error, no
//! hang.
//!
//! # Findings (at e3c263b), and where they stand
//!
//! Four tests failed, every method alike: an insert judged which states are idle, and picked its
//! eviction victim, at the request's one reading, taken after its look but before its insert
//! took the bucket's lock. A request held between the two (preempted, or a slow clock) found
//! states that other requests used *after* its reading and that are idle *now*; none was idle at
//! its reading, and each showed nothing left there. So it evicted (counted) where it should have
//! reused an idle slot, and of the tie at nothing left `max_by_key` took the last slot, which may
//! hold a client active now. In `a_stale_reading_never_evicts_an_active_client_while_idle_ones_exist`:
//! keys 1..=7 spend their 4 at 0.4 s, the new client reads 0.5 s and is held, key 8 spends its 4
//! at 10.5 s (keys 1..=7 idle then, peeking 4 left each), the insert resumes: 1 eviction, of key
//! 8, which was then granted 4 more at 10.5 s (8 at one reading, limit 4) while seven idle slots
//! were there.
//!
//! - `a_reading_taken_before_the_store_filled_reuses_a_slot_idle_now` and
//!   `a_stale_reading_never_evicts_an_active_client_while_idle_ones_exist` pass at a4abbf4's
//!   parent (11c96c4) and failed at a4abbf4 and e3c263b: the store had a free slot at the
//!   reading, and the parent read the clock for an insert only once it had found none.
//! - `a_stale_reading_reuses_a_slot_idle_now_without_an_eviction` and
//!   `a_reading_into_a_full_store_never_evicts_an_active_client_while_idle_ones_exist` failed at
//!   the parent too: the store was full at the reading, which the parent took with its lock let
//!   go, so a request held there was alike.
//!
//! Since the insert reads the clock again, with its lock let go, where it finds no free slot
//! (and judges idleness and decides at that reading), all four pass: the request held here is
//! held at its first reading. A thread held at that second reading is the parent's case, still
//! open: a reading of its own older than what others did since.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Barrier, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use tollgate::{Algorithm, Clock, FakeClock, RateLimiterService, Rule, ServiceBuilder};
#[path = "support/grants.rs"]
mod grants;
use grants::grants_until_denied;

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

/// One bucket: every key's home and other bucket.
const ONE_BUCKET: usize = 8;

type Hook = Box<dyn FnOnce()>;

thread_local! {
    /// Readings this thread has taken.
    static READINGS: Cell<u64> = const { Cell::new(0) };
    /// A hook run at this thread's reading of that number, *after* the reading is taken (which
    /// is then returned: a reading older than everything the hook did).
    static AT_READING: RefCell<Option<(u64, Hook)>> = const { RefCell::new(None) };
    /// Added to every reading this thread takes (a core whose counter is ahead or behind).
    static OFFSET_NANOS: Cell<i64> = const { Cell::new(0) };
}

/// A [`FakeClock`] read through per-thread scripts (see `AT_READING`, `OFFSET_NANOS`).
#[derive(Debug, Clone, Default)]
struct SlowClock(FakeClock);

impl Clock for SlowClock {
    fn now_nanos(&self) -> u64 {
        let number = READINGS.with(|readings| {
            readings.set(readings.get() + 1);
            readings.get()
        });
        let offset = OFFSET_NANOS.with(Cell::get);
        let reading = self.0.now_nanos().saturating_add_signed(offset);
        let hook = AT_READING.with(|at| {
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

/// Runs `hook` right after this thread's next reading is taken.
fn after_next_reading(hook: impl FnOnce() + 'static) {
    let at = READINGS.with(Cell::get) + 1;
    AT_READING.with(|slot| *slot.borrow_mut() = Some((at, Box::new(hook))));
}

fn hook_ran() -> bool {
    AT_READING.with(|slot| slot.borrow().is_none())
}

fn set_offset(offset: i64) {
    OFFSET_NANOS.with(|cell| cell.set(offset));
}

type Service = RateLimiterService<u64, &'static str, SlowClock>;

fn rule() -> Rule {
    Rule::new(LIMIT, WINDOW).unwrap()
}

fn service(algorithm: Algorithm, capacity: usize, clock: &FakeClock) -> Arc<Service> {
    Arc::new(
        ServiceBuilder::new(algorithm, SlowClock(clock.clone()))
            .plan(PLAN, rule())
            .capacity(capacity)
            .count_decisions(true)
            .build::<u64>()
            .unwrap(),
    )
}

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// Asks for `key` until denied: its single permits granted (a client granted past `LIMIT` shows
/// as `LIMIT + 1`).
fn spend(service: &Service, key: u64) -> u64 {
    grants_until_denied(LIMIT, || service.allow(&key, &PLAN).unwrap())
}

fn fill_spent(service: &Service, keys: impl IntoIterator<Item = u64>) {
    for key in keys {
        assert_eq!(
            spend(service, key),
            LIMIT,
            "key {key}: a fresh client's permits"
        );
    }
}

fn remaining(service: &Service, keys: impl IntoIterator<Item = u64>) -> Vec<u64> {
    keys.into_iter()
        .map(|key| service.peek(&key, &PLAN).unwrap().remaining())
        .collect()
}

/// One test at a time where threads park or race (each wants both cores).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner)
}

fn wait_for(receiver: &Receiver<()>, what: &str) {
    receiver
        .recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("timed out: {what}"));
}

/// A first request of `key` on another thread, parked right after its first clock reading
/// (the insert's, taken before the bucket's lock): returns once it has parked, with the sender
/// that resumes it and its handle (whether it was granted, whether it parked).
fn parked_first_request(
    service: &Arc<Service>,
    key: u64,
) -> (Sender<()>, thread::JoinHandle<(bool, bool)>) {
    let (parked_tx, parked_rx) = channel::<()>();
    let (resume_tx, resume_rx) = channel::<()>();
    let request = {
        let service = Arc::clone(service);
        thread::spawn(move || {
            after_next_reading(move || {
                parked_tx.send(()).unwrap();
                resume_rx.recv().unwrap();
            });
            let granted = service.allow(&key, &PLAN).unwrap();
            (granted, hook_ran())
        })
    };
    wait_for(
        &parked_rx,
        "the first request parks after its insert's reading",
    );
    (resume_tx, request)
}

/// Resumes a parked request; whether it was granted (it must have parked).
fn resume(resume: Sender<()>, request: thread::JoinHandle<(bool, bool)>) -> bool {
    resume.send(()).unwrap();
    let (tx, rx) = channel();
    let joiner = thread::spawn(move || {
        let joined = request.join();
        let _ = tx.send(());
        joined
    });
    wait_for(&rx, "the resumed request completes");
    let (granted, parked) = joiner.join().unwrap().expect("the request does not panic");
    assert!(parked, "the request parked at its insert's reading");
    granted
}

// ---------------------------------------------------------------------------------------------
// A reading older than the store: states idle now, not at the reading.
// ---------------------------------------------------------------------------------------------

/// What a held first request came to, per method: whether it was granted, the evictions
/// counted, the new client's grants after it (at the present reading), the store's `len()`.
type HeldOutcome = (bool, u64, u64, usize);

/// Keys 1..=8 spend their limit at 0.4 s (a full one-bucket store). A new client's request
/// reads the clock at 0.5 s and is held there (preempted before its insert's lock) until 10.5
/// s, when every state is idle (each peeks a full limit). Its insert must reuse an idle slot:
/// no eviction counted (`evictions()` counts only clients that were not idle, and none is), the
/// new client granted, then at most its limit at 10.5 s, the store at its capacity.
#[test]
fn a_stale_reading_reuses_a_slot_idle_now_without_an_eviction() {
    let _serial = serial();
    let outcomes: Vec<(Algorithm, HeldOutcome)> = STORE_METHODS
        .into_iter()
        .map(|algorithm| {
            let clock = FakeClock::starting_at(millis(400));
            let service = service(algorithm, ONE_BUCKET, &clock);
            fill_spent(&service, 1..=8);
            clock.set(millis(500));
            let (resume_tx, request) = parked_first_request(&service, 100);
            clock.set(millis(10_500));
            assert_eq!(
                remaining(&service, 1..=8),
                vec![LIMIT; 8],
                "{algorithm}: all idle"
            );
            let granted = resume(resume_tx, request);
            let outcome = (
                granted,
                service.evictions(),
                spend(&service, 100),
                service.len(),
            );
            (algorithm, outcome)
        })
        .collect();
    let held_to = |(granted, evictions, after, len): HeldOutcome| {
        granted && evictions == 0 && after <= LIMIT && len == ONE_BUCKET
    };
    assert!(
        outcomes.iter().all(|(_, outcome)| held_to(*outcome)),
        "(granted, evictions, grants after, len) per method: {outcomes:?}"
    );
}

/// As above, but the store is empty when the request reads the clock (0.5 s): it fills while
/// the request is held (keys 1..=8 spend their limit at 0.6 s), and by 10.5 s every state is
/// idle. (Before a4abbf4 a first request read the clock for its insert only once it had found
/// no free slot, under the store as it then was.)
#[test]
fn a_reading_taken_before_the_store_filled_reuses_a_slot_idle_now() {
    let _serial = serial();
    let outcomes: Vec<(Algorithm, HeldOutcome)> = STORE_METHODS
        .into_iter()
        .map(|algorithm| {
            let clock = FakeClock::starting_at(millis(500));
            let service = service(algorithm, ONE_BUCKET, &clock);
            let (resume_tx, request) = parked_first_request(&service, 100);
            clock.set(millis(600));
            fill_spent(&service, 1..=8);
            clock.set(millis(10_500));
            assert_eq!(
                remaining(&service, 1..=8),
                vec![LIMIT; 8],
                "{algorithm}: all idle"
            );
            let granted = resume(resume_tx, request);
            let outcome = (
                granted,
                service.evictions(),
                spend(&service, 100),
                service.len(),
            );
            (algorithm, outcome)
        })
        .collect();
    let held_to = |(granted, evictions, after, len): HeldOutcome| {
        granted && evictions == 0 && after <= LIMIT && len == ONE_BUCKET
    };
    assert!(
        outcomes.iter().all(|(_, outcome)| held_to(*outcome)),
        "(granted, evictions, grants after, len) per method: {outcomes:?}"
    );
}

/// Per method, what a held first request did to an active client (key 8, in the bucket's last
/// slot): whether the request was granted, the evictions counted, key 8's peek and its grants
/// after. Keys 1..=7 (and with `full_at_reading`, key 8 too) spend their limit at 0.4 s; a new
/// client reads the clock at 0.5 s and is held there; at 10.5 s, when keys 1..=7 are idle, key
/// 8 spends its limit (in the last free slot, or on its own idle state), then the request
/// resumes. At its reading (0.5 s) no state is idle and every one has nothing left, so an
/// eviction there picks the last slot of the tie: key 8.
fn held_request_against_an_active_client(full_at_reading: bool) -> Vec<(Algorithm, [u64; 4])> {
    STORE_METHODS
        .into_iter()
        .map(|algorithm| {
            let clock = FakeClock::starting_at(millis(400));
            let service = service(algorithm, ONE_BUCKET, &clock);
            fill_spent(&service, if full_at_reading { 1..=8 } else { 1..=7 });
            clock.set(millis(500));
            let (resume_tx, request) = parked_first_request(&service, 100);
            clock.set(millis(10_500));
            fill_spent(&service, [8]);
            assert_eq!(
                remaining(&service, 1..=7),
                vec![LIMIT; 7],
                "{algorithm}: idle now"
            );
            let granted = resume(resume_tx, request);
            let outcome = [
                u64::from(granted),
                service.evictions(),
                remaining(&service, [8])[0],
                spend(&service, 8),
            ];
            (algorithm, outcome)
        })
        .collect()
}

/// The store has a free slot when the held request reads the clock (keys 1..=7); by the time
/// its insert runs, key 8 has taken that slot and spent its limit at 10.5 s, and keys 1..=7 are
/// idle. The insert must reuse one of the seven idle slots: the active key 8 keeps its state
/// (peeks 0 left, refused), nothing is counted as an eviction, and the new client is granted.
/// (Passes at a4abbf4's parent, whose insert read the clock only after finding no free slot.)
#[test]
fn a_stale_reading_never_evicts_an_active_client_while_idle_ones_exist() {
    let _serial = serial();
    let outcomes = held_request_against_an_active_client(false);
    assert!(
        outcomes.iter().all(|(_, outcome)| *outcome == [1, 0, 0, 0]),
        "[new client granted, evictions, key 8's peek, key 8's grants after] per method: \
         {outcomes:?}"
    );
}

/// As above, with the store full already when the request reads the clock (keys 1..=8 spent
/// at 0.4 s; key 8 spends again at 10.5 s on its own idle state). (Fails at a4abbf4's parent
/// too: its insert read the clock with the lock let go, and a request held there is alike.)
#[test]
fn a_reading_into_a_full_store_never_evicts_an_active_client_while_idle_ones_exist() {
    let _serial = serial();
    let outcomes = held_request_against_an_active_client(true);
    assert!(
        outcomes.iter().all(|(_, outcome)| *outcome == [1, 0, 0, 0]),
        "[new client granted, evictions, key 8's peek, key 8's grants after] per method: \
         {outcomes:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Rule changes while a first request is held after its reading.
// ---------------------------------------------------------------------------------------------

/// The rule changes a held first request sees last: to two limits (the client's requests then
/// spend its entry in the plan's map), to two limits and back to one (they spend its new store
/// state), or to another single limit. The held request read the plan's one limit before the
/// change: it must not be granted under it on a state of its own (it meets the client's spent
/// state under the new limits and is refused), and the client gets one window of the new rules,
/// once.
#[test]
fn a_rule_change_while_a_first_request_is_held_after_its_reading_starts_the_client_once() {
    let _serial = serial();
    let two_limits = || {
        [
            Rule::new(2, WINDOW).unwrap(),
            Rule::new(5, millis(60_000)).unwrap(),
        ]
    };
    type Change<'a> = (&'a str, &'a dyn Fn(&Service) -> u64);
    let changes: [Change<'_>; 3] = [
        ("to two limits", &|service| {
            service.set_limits(&PLAN, two_limits()).unwrap();
            2
        }),
        ("to two limits and back to one", &|service| {
            service.set_limits(&PLAN, two_limits()).unwrap();
            assert_eq!(
                grants_until_denied(2, || service.allow(&100, &PLAN).unwrap()),
                2
            );
            service
                .set_rule(&PLAN, Rule::new(3, WINDOW).unwrap())
                .unwrap();
            3
        }),
        ("to another single limit", &|service| {
            service
                .set_rule(&PLAN, Rule::new(3, WINDOW).unwrap())
                .unwrap();
            3
        }),
    ];
    for algorithm in STORE_METHODS {
        for (name, change) in changes {
            for capacity in [ONE_BUCKET, 64] {
                let clock = FakeClock::starting_at(millis(500));
                let service = service(algorithm, capacity, &clock);
                let (resume_tx, request) = parked_first_request(&service, 100);
                let new_limit = change(&service);
                let spent = grants_until_denied(new_limit, || service.allow(&100, &PLAN).unwrap());
                let granted = resume(resume_tx, request);
                let after = grants_until_denied(new_limit, || service.allow(&100, &PLAN).unwrap());
                assert_eq!(
                    (spent, granted, after, service.evictions()),
                    (new_limit, false, 0, 0),
                    "{algorithm}, {name}, capacity {capacity}: grants under the new limits, the \
                     held request, grants after it, evictions"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Peek against the first request, with `evicted_up_to` ahead of or behind the reading.
// ---------------------------------------------------------------------------------------------

/// A sweep publishes a reading `lag` from the request's (a sweeper's core ahead or behind),
/// then a new client is peeked and asks for `n` permits (0 to `LIMIT + 1`) at the request's
/// reading: the fresh state is decided at the insert's reading where it is made as of a reading
/// no later, else published undecided and decided by the lookup. Either way the request agrees
/// with the peek (granted exactly where the peek reports at least `n` left, for `n` from 1 to
/// the limit), a second peek reports what is left after it, and `stats()` counts each decision
/// once.
#[test]
fn a_first_request_agrees_with_its_peek_whatever_reading_the_store_was_swept_at() {
    let _serial = serial();
    let base = millis(5_300);
    let lags_ms: [i64; 12] = [-1_500, -500, -1, 0, 1, 100, 249, 251, 300, 500, 900, 1_500];
    for algorithm in STORE_METHODS {
        for lag in lags_ms {
            let clock = FakeClock::starting_at(base);
            let service = service(algorithm, ONE_BUCKET, &clock);
            let (mut allowed, mut denied) = (0, 0);
            for n in 0..=LIMIT + 1 {
                let key = 1_000 + n;
                set_offset(lag * 1_000_000);
                service.sweep();
                set_offset(0);
                let before = service.peek(&key, &PLAN).unwrap();
                let decision = service.acquire(&key, &PLAN, n).unwrap();
                let after = service.peek(&key, &PLAN).unwrap();
                if decision.is_allowed() {
                    allowed += 1;
                } else {
                    denied += 1;
                }
                let what = format!("{algorithm}, sweep {lag} ms from the request, {n} permits");
                if (1..=LIMIT).contains(&n) {
                    assert_eq!(
                        decision.is_allowed(),
                        before.remaining() >= n,
                        "{what}: peek {before:?}, decision {decision:?}"
                    );
                }
                if n == 1 {
                    assert_eq!(
                        decision.is_allowed(),
                        before.is_allowed(),
                        "{what}: peek {before:?}, decision {decision:?}"
                    );
                }
                let taken = if decision.is_allowed() { n } else { 0 };
                assert_eq!(
                    after.remaining(),
                    before.remaining() - taken.min(before.remaining()),
                    "{what}: peek before {before:?}, decision {decision:?}, peek after {after:?}"
                );
            }
            let stats = service.stats(&PLAN).unwrap();
            assert_eq!(
                (stats.allowed, stats.denied),
                (allowed, denied),
                "{algorithm}, sweep {lag} ms from the request: stats"
            );
            assert!(service.len() <= ONE_BUCKET, "{algorithm}: len");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// First requests of one key racing a sweeper whose readings run ahead.
// ---------------------------------------------------------------------------------------------

/// How long each racing shape runs: `REVIEW_FILL_MILLIS`, default 1,000 ms.
fn race_for() -> Duration {
    let ms = std::env::var("REVIEW_FILL_MILLIS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(1_000);
    millis(ms)
}

/// Spent clients refilled every round, in the one-bucket store: with the round's key, two slots
/// are left spare (idle or free), so no insert ever needs to evict.
const HOT: u64 = 5;
const RACERS: usize = 2;

/// What a race saw.
#[derive(Debug, Default)]
struct Raced {
    rounds: u64,
    /// Rounds whose key was granted past its limit, and what it was granted.
    over: Vec<(u64, u64)>,
    errors: Vec<String>,
    evictions: u64,
    most_held: usize,
}

/// Rounds of one fresh key asked by [`RACERS`] threads at once (up to `LIMIT + 1` single
/// permits each), at a standing clock that moves 10 s between rounds, in a one-bucket store of
/// [`HOT`] spent clients, while a sweeper sweeps without a pause at readings `ahead_ms` ahead
/// (so a racer's fresh state is made as of a reading ahead of its own, published undecided, and
/// idle for the sweeper until the lookup decides on it).
fn race_one_key(algorithm: Algorithm, ahead_ms: i64) -> Raced {
    let clock = FakeClock::starting_at(millis(500));
    let service = service(algorithm, ONE_BUCKET, &clock);
    let stop = Arc::new(AtomicBool::new(false));
    let sweeper = {
        let (service, stop) = (Arc::clone(&service), Arc::clone(&stop));
        thread::spawn(move || {
            set_offset(ahead_ms * 1_000_000);
            while !stop.load(Ordering::Relaxed) {
                service.sweep();
            }
        })
    };
    let round_key = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(Barrier::new(RACERS + 1));
    let racers: Vec<_> = (0..RACERS)
        .map(|_| {
            let (service, stop) = (Arc::clone(&service), Arc::clone(&stop));
            let (round_key, barrier) = (Arc::clone(&round_key), Arc::clone(&barrier));
            thread::spawn(move || {
                let mut grants = Vec::new();
                let mut errors = Vec::new();
                loop {
                    barrier.wait();
                    if stop.load(Ordering::Relaxed) {
                        return (grants, errors);
                    }
                    let key = round_key.load(Ordering::Relaxed);
                    let mut granted = 0;
                    for _ in 0..=LIMIT {
                        match service.acquire(&key, &PLAN, 1) {
                            Ok(decision) => granted += u64::from(decision.is_allowed()),
                            Err(error) => errors.push(format!("key {key}: {error}")),
                        }
                    }
                    grants.push(granted);
                    barrier.wait();
                }
            })
        })
        .collect();
    let mut raced = Raced::default();
    let deadline = Instant::now() + race_for();
    while Instant::now() < deadline {
        clock.set(millis(500) + Duration::from_secs(10) * (raced.rounds as u32 + 1));
        for key in 1..=HOT {
            spend(&service, key);
        }
        round_key.store(1_000_000 + raced.rounds, Ordering::Relaxed);
        barrier.wait();
        barrier.wait();
        raced.most_held = raced.most_held.max(service.len());
        raced.rounds += 1;
    }
    stop.store(true, Ordering::Relaxed);
    barrier.wait();
    let mut per_round = vec![0; raced.rounds as usize];
    for racer in racers {
        let (grants, errors) = racer.join().expect("a racer does not panic");
        for (round, granted) in grants.into_iter().enumerate() {
            per_round[round] += granted;
        }
        raced.errors.extend(errors);
    }
    sweeper.join().expect("the sweeper does not panic");
    raced.over = (0..raced.rounds)
        .zip(per_round)
        .filter(|(_, granted)| *granted > LIMIT)
        .collect();
    raced.evictions = service.evictions();
    raced
}

/// The race above for every method, with the sweeper's readings 1 ms, 100 ms and 300 ms ahead
/// (a fresh state's grants at the racers' reading are then fewer than the limit, never more):
/// no round's key granted past its limit, no eviction (two slots are always idle or free), no
/// error, never more clients held than the capacity.
#[test]
fn first_requests_of_one_key_racing_a_sweeper_ahead_get_one_limit_and_evict_no_one() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        for ahead_ms in [1, 100, 300] {
            let raced = race_one_key(algorithm, ahead_ms);
            assert!(
                raced.rounds > 10,
                "{algorithm}, {ahead_ms} ms: too few rounds {raced:?}"
            );
            assert!(
                raced.over.is_empty()
                    && raced.errors.is_empty()
                    && raced.evictions == 0
                    && raced.most_held <= ONE_BUCKET,
                "{algorithm}, sweeper {ahead_ms} ms ahead: {} rounds, over the limit {:?}, \
                 errors {:?}, evictions {}, most held {}",
                raced.rounds,
                raced.over,
                raced.errors,
                raced.evictions,
                raced.most_held
            );
        }
    }
}
