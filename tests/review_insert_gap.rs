//! Review of the gap in a first request's insert into a full store (commits 6b0892c, 36f0257):
//! the insert lets its bucket's lock go, reads the clock, then takes the lock again and makes
//! its passes anew (`insert_reusing`) before it claims a free slot or reuses one; where the
//! plan's limits changed while the clock was read, it reuses nothing, and the decision looks
//! again under the limits in force. Public API only.
//!
//! Each scenario puts work *inside* that gap through the user's clock: a hook runs on a chosen
//! reading of a chosen thread (for a first request into a full store, its first reading is the
//! insert's, taken with the lock let go). The hook runs either before the reading is taken (the
//! insert then reads the clock as it stands after the hook), or after it (a slow clock: the
//! insert gets a reading older than everything the hook did). In the gap: other first requests
//! of the same key (on other threads, all meeting there, or on the same thread, from inside the
//! clock), the key inserted then evicted, a sweep and a refill, rule changes (to another rule,
//! to several limits and back) with the store refilled under the new rule.
//!
//! What they hold the service to (its documented promises): a key ends with one state (at one
//! clock instant, its grants never pass one limit unless it was evicted, and each eviction is
//! counted); an evicted client gains at most one limit's worth, once per counted eviction; a
//! reuse never resets an active client silently; `len()` never exceeds the capacity; no panic,
//! no hang, no error for a known plan.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex, PoisonError};
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

/// 4 permits a second.
const LIMIT: u64 = 4;
const WINDOW: Duration = Duration::from_secs(1);

/// The capacity of every service here: one bucket, the home and other bucket of every key.
const CAPACITY: usize = 8;

/// How long any wait of these tests may take before the test fails as hung.
const PATIENCE: Duration = Duration::from_secs(30);

type Hook = Box<dyn FnOnce()>;

/// When a hook runs relative to the reading it is attached to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum When {
    /// Before the reading is taken: the reading sees what the hook did.
    Before,
    /// After the reading is taken, which is then returned: a slow clock, whose reading is older
    /// than everything the hook did.
    After,
}

thread_local! {
    /// Readings this thread has taken.
    static READINGS: Cell<u64> = const { Cell::new(0) };
    /// A hook to run at this thread's reading of that number.
    static AT_READING: RefCell<Option<(u64, When, Hook)>> = const { RefCell::new(None) };
    /// Whether this thread yields at each reading (widens the gap between the insert's lock
    /// let go and taken again).
    static YIELDING: Cell<bool> = const { Cell::new(false) };
}

/// A [`FakeClock`] read through per-thread scripts (see [`When`]).
#[derive(Debug, Clone, Default)]
struct GapClock(FakeClock);

impl Clock for GapClock {
    fn now_nanos(&self) -> u64 {
        let number = READINGS.with(|readings| {
            readings.set(readings.get() + 1);
            readings.get()
        });
        if YIELDING.with(Cell::get) {
            thread::yield_now();
        }
        let hook = AT_READING.with(|at| {
            let mut at = at.borrow_mut();
            match at.as_ref() {
                Some((nth, _, _)) if *nth == number => {
                    at.take().map(|(_, when, hook)| (when, hook))
                }
                _ => None,
            }
        });
        match hook {
            Some((When::Before, hook)) => {
                hook();
                self.0.now_nanos()
            }
            Some((When::After, hook)) => {
                let reading = self.0.now_nanos();
                hook();
                reading
            }
            None => self.0.now_nanos(),
        }
    }
}

/// Runs `hook` at this thread's next reading.
fn at_next_reading(when: When, hook: impl FnOnce() + 'static) {
    let at = READINGS.with(Cell::get) + 1;
    AT_READING.with(|slot| *slot.borrow_mut() = Some((at, when, Box::new(hook))));
}

/// Whether this thread's hook has run (or none was set).
fn hook_ran() -> bool {
    AT_READING.with(|slot| slot.borrow().is_none())
}

type Service = RateLimiterService<u64, &'static str, GapClock>;

fn rule() -> Rule {
    Rule::new(LIMIT, WINDOW).unwrap()
}

fn service(algorithm: Algorithm, clock: &FakeClock) -> Arc<Service> {
    Arc::new(
        ServiceBuilder::new(algorithm, GapClock(clock.clone()))
            .plan(PLAN, rule())
            .capacity(CAPACITY)
            .build::<u64>()
            .unwrap(),
    )
}

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// Asks for `key` until denied (at most `up_to + 1` asks); how many single permits it got.
fn spend_up_to(service: &Service, key: u64, up_to: u64) -> u64 {
    grants_until_denied(up_to, || service.allow(&key, &PLAN).unwrap())
}

fn spend(service: &Service, key: u64) -> u64 {
    spend_up_to(service, key, LIMIT)
}

/// Each of `keys` spends its whole limit (asserted) at the clock's reading.
fn fill_spent(service: &Service, keys: impl IntoIterator<Item = u64>, limit: u64) {
    for key in keys {
        assert_eq!(
            spend_up_to(service, key, limit),
            limit,
            "key {key}: a fresh client"
        );
    }
}

/// What a peek at each of `keys` reports remaining (a peek makes no state).
fn remaining(service: &Service, keys: impl IntoIterator<Item = u64>) -> Vec<u64> {
    keys.into_iter()
        .map(|key| service.peek(&key, &PLAN).unwrap().remaining())
        .collect()
}

/// How many of `peeks` are `full` (a client reset) and how many are 0 (still spent).
fn reset_and_spent(peeks: &[u64], full: u64) -> (usize, usize) {
    (
        peeks.iter().filter(|&&left| left == full).count(),
        peeks.iter().filter(|&&left| left == 0).count(),
    )
}

/// One test at a time where threads park or race.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner)
}

fn wait_for(receiver: &Receiver<()>, what: &str) {
    receiver
        .recv_timeout(PATIENCE)
        .unwrap_or_else(|_| panic!("timed out: {what}"));
}

/// Runs `body` on a thread of its own and fails if it does not finish within [`PATIENCE`] (a
/// hang shows as a failure; the hung thread is left behind).
fn watched<T: Send + 'static>(what: &str, body: impl FnOnce() -> T + Send + 'static) -> T {
    let (done_tx, done_rx) = channel();
    let handle = thread::spawn(move || {
        let value = body();
        let _ = done_tx.send(());
        value
    });
    match done_rx.recv_timeout(PATIENCE) {
        Ok(()) => handle.join().unwrap(),
        // The body panicked (its sender dropped unsent): its panic, shown.
        Err(RecvTimeoutError::Disconnected) => match handle.join() {
            Ok(value) => value,
            Err(panic) => std::panic::resume_unwind(panic),
        },
        Err(RecvTimeoutError::Timeout) => panic!("{what}: hung for {PATIENCE:?}"),
    }
}

/// A first request of `key` on another thread that parks at its first reading (the insert's,
/// into a full store, with the lock let go), taken `when`: returns once it has parked, with the
/// sender that resumes it and its join handle (its answer, and whether the hook ran).
fn parked_first_request(
    service: &Arc<Service>,
    key: u64,
    when: When,
) -> (Sender<()>, thread::JoinHandle<(bool, bool)>) {
    let (parked_tx, parked_rx) = channel::<()>();
    let (resume_tx, resume_rx) = channel::<()>();
    let request = {
        let service = Arc::clone(service);
        thread::spawn(move || {
            at_next_reading(when, move || {
                parked_tx.send(()).unwrap();
                resume_rx.recv().unwrap();
            });
            let granted = service.allow(&key, &PLAN).unwrap();
            (granted, hook_ran())
        })
    };
    wait_for(
        &parked_rx,
        "the first request parks at its insert's reading",
    );
    (resume_tx, request)
}

/// Resumes a parked request and joins it, within [`PATIENCE`].
fn resume(resume: Sender<()>, request: thread::JoinHandle<(bool, bool)>) -> bool {
    resume.send(()).unwrap();
    let started = Instant::now();
    while !request.is_finished() {
        assert!(started.elapsed() < PATIENCE, "the resumed request hung");
        thread::sleep(millis(1));
    }
    let (granted, parked) = request.join().unwrap();
    assert!(parked, "the request parked at its insert's reading");
    granted
}

/// Waits until `count` reaches `parties`, within [`PATIENCE`] (a barrier that fails rather than
/// hangs when a party never comes).
fn meet(count: &AtomicUsize, parties: usize) {
    count.fetch_add(1, Ordering::SeqCst);
    let started = Instant::now();
    while count.load(Ordering::SeqCst) < parties {
        assert!(
            started.elapsed() < PATIENCE,
            "only {} of {parties} met in the gap",
            count.load(Ordering::SeqCst)
        );
        thread::yield_now();
    }
}

// ---------------------------------------------------------------------------------------------
// The same key, twice or more in the gap.
// ---------------------------------------------------------------------------------------------

/// A full bucket of spent clients at one instant; six first requests of one new key, on six
/// threads, all held inside the gap until every one of them is there (each let its lock go and
/// reads the clock: no state for the key exists yet). Released together, the first to take the
/// lock again reuses a slot (one eviction); every other must find that state in its second
/// passes. So: exactly `LIMIT` of the six granted, one eviction, one spent client reset, and the
/// key left spent.
#[test]
fn first_requests_of_one_key_all_inside_the_gap_make_one_state() {
    let _serial = serial();
    const THREADS: usize = 6;
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(millis(500));
        let service = service(algorithm, &clock);
        fill_spent(&service, 1..=8, LIMIT);
        let met = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..THREADS)
            .map(|_| {
                let (service, met) = (Arc::clone(&service), Arc::clone(&met));
                thread::spawn(move || {
                    at_next_reading(When::Before, move || meet(&met, THREADS));
                    let granted = service.allow(&100, &PLAN).unwrap();
                    assert!(
                        hook_ran(),
                        "each request met the others in its insert's gap"
                    );
                    granted
                })
            })
            .collect();
        let granted = watched("six first requests of one key", move || {
            threads
                .into_iter()
                .map(|thread| u64::from(thread.join().unwrap()))
                .sum::<u64>()
        });
        let peeks = remaining(&service, 1..=8);
        assert_eq!(
            (granted, service.evictions(), reset_and_spent(&peeks, LIMIT)),
            (LIMIT, 1, (1, 7)),
            "{algorithm}: grants to the key, evictions, (reset, spent) of the others {peeks:?}"
        );
        assert_eq!(
            spend(&service, 100),
            0,
            "{algorithm}: the key's one state is spent"
        );
        assert_eq!(service.len(), CAPACITY, "{algorithm}");
        assert_eq!(service.evictions(), 1, "{algorithm}");
    }
}

/// The same race, on one thread: the clock, at the insert's reading (the lock let go), asks the
/// service for the same new key until it is denied. The inner request inserts the key (one
/// eviction) and spends its limit; the outer insert, back under the lock, must find that state
/// and be denied on it.
#[test]
fn the_same_key_asked_from_inside_the_clock_shares_one_state() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        let (outer, inner, evictions, peeks, after, len) =
            watched("a re-entrant clock", move || {
                let clock = FakeClock::starting_at(millis(500));
                let service = service(algorithm, &clock);
                fill_spent(&service, 1..=8, LIMIT);
                let inner = Arc::new(AtomicU64::new(u64::MAX));
                {
                    let (service, inner) = (Arc::clone(&service), Arc::clone(&inner));
                    at_next_reading(When::Before, move || {
                        inner.store(spend(&service, 100), Ordering::SeqCst);
                    });
                }
                let outer = service.allow(&100, &PLAN).unwrap();
                assert!(hook_ran(), "the clock ran its requests");
                (
                    outer,
                    inner.load(Ordering::SeqCst),
                    service.evictions(),
                    remaining(&service, 1..=8),
                    spend(&service, 100),
                    service.len(),
                )
            });
        assert_eq!(
            (
                inner,
                outer,
                after,
                evictions,
                reset_and_spent(&peeks, LIMIT),
                len
            ),
            (LIMIT, false, 0, 1, (1, 7), CAPACITY),
            "{algorithm}: inner grants, outer answer, grants after, evictions, (reset, spent) \
             {peeks:?}, len"
        );
    }
}

/// In the gap, the key is inserted by another request (one eviction, one permit used: it is
/// then the state closest to fresh), and evicted by a new client's first request (a second
/// eviction). The parked insert, back under the lock, finds no state of its key, evicts the
/// state closest to fresh (the new client's: a third) and puts a fresh one: every count exact.
#[test]
fn the_key_inserted_then_evicted_inside_the_gap_is_put_once_more_and_counted() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(millis(500));
        let service = service(algorithm, &clock);
        fill_spent(&service, 1..=8, LIMIT);
        let (resume_tx, request) = parked_first_request(&service, 100, When::Before);
        assert!(
            service.allow(&100, &PLAN).unwrap(),
            "{algorithm}: the key, in the gap"
        );
        assert_eq!(service.peek(&100, &PLAN).unwrap().remaining(), LIMIT - 1);
        assert!(
            service.allow(&200, &PLAN).unwrap(),
            "{algorithm}: a new client, in the gap"
        );
        assert_eq!(
            service.evictions(),
            2,
            "{algorithm}: the key was the one evicted"
        );
        let granted = resume(resume_tx, request);
        let peeks = remaining(&service, 1..=8);
        assert_eq!(
            (
                granted,
                service.evictions(),
                remaining(&service, [100, 200]),
                reset_and_spent(&peeks, LIMIT),
                service.len(),
            ),
            (true, 3, vec![LIMIT - 1, LIMIT], (1, 7), CAPACITY),
            "{algorithm}: the parked request, evictions, [key, new client] remaining, (reset, \
             spent) {peeks:?}, len"
        );
    }
}

/// Rounds of races, no barrier: in each, four threads ask a new key `LIMIT` times each, with
/// every clock reading yielding (the gap widened), at one standing instant, in a full bucket
/// of spent clients. Each round the key must be granted exactly `LIMIT` (one state) and cost
/// exactly one eviction (a second state would cost a second).
#[test]
fn rounds_of_one_key_racing_in_the_gap_cost_one_eviction_and_one_limit_each() {
    let _serial = serial();
    const THREADS: usize = 4;
    const ROUNDS: u64 = 150;
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(millis(500));
        let service = service(algorithm, &clock);
        fill_spent(&service, 1..=8, LIMIT);
        let outcome = {
            let service = Arc::clone(&service);
            watched("rounds of races", move || {
                let mut per_round = Vec::new();
                for round in 0..ROUNDS {
                    let key = 1_000 + round;
                    let start = Arc::new(AtomicUsize::new(0));
                    let threads: Vec<_> = (0..THREADS)
                        .map(|_| {
                            let (service, start) = (Arc::clone(&service), Arc::clone(&start));
                            thread::spawn(move || {
                                YIELDING.with(|yielding| yielding.set(true));
                                meet(&start, THREADS);
                                (0..LIMIT)
                                    .filter(|_| service.allow(&key, &PLAN).unwrap())
                                    .count() as u64
                            })
                        })
                        .collect();
                    let granted: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
                    per_round.push((granted, service.evictions(), service.len()));
                }
                per_round
            })
        };
        let expected: Vec<(u64, u64, usize)> = (0..ROUNDS)
            .map(|round| (LIMIT, round + 1, CAPACITY))
            .collect();
        assert_eq!(
            outcome, expected,
            "{algorithm}: per round (grants to its key, evictions so far, len)"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Readings older than the gap's work (a slow clock).
// ---------------------------------------------------------------------------------------------

/// Every client used one permit at 0.5 s; at 10.5 s (all idle) a new client's insert reads the
/// clock, slowly: its reading is 10.5 s, but meanwhile the clock reached 20.5 s and every client
/// spent its limit there. Back under the lock at its stale reading, the insert must not take
/// any of those states as idle (each spent a limit after the reading): it evicts exactly one,
/// counted; the new client is granted at 20.5 s, and one client only is reset.
#[test]
fn a_reading_older_than_the_gap_work_never_reuses_an_active_client_as_idle() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(millis(500));
        let service = service(algorithm, &clock);
        for key in 1..=8 {
            assert!(service.allow(&key, &PLAN).unwrap());
        }
        clock.set(millis(10_500));
        let (resume_tx, request) = parked_first_request(&service, 100, When::After);
        clock.set(millis(20_500));
        fill_spent(&service, 1..=8, LIMIT);
        assert_eq!(service.evictions(), 0, "{algorithm}: known clients only");
        let granted = resume(resume_tx, request);
        let peeks = remaining(&service, 1..=8);
        assert_eq!(
            (
                granted,
                service.evictions(),
                reset_and_spent(&peeks, LIMIT),
                1 + spend(&service, 100),
                service.len(),
            ),
            (true, 1, (1, 7), LIMIT, CAPACITY),
            "{algorithm}: new client, evictions, (reset, spent) {peeks:?}, its grants, len"
        );
    }
}

/// At 10.5 s every client (one permit at 0.5 s) is idle. A new client's insert reads the clock
/// slowly (10.5 s); meanwhile a sweep frees all eight slots and eight other new clients take
/// them and spend their limits, at 10.5 s. Back under the lock, no slot is free and none idle:
/// one eviction, counted, of a client of the refill; the swept clients answer as fresh ones.
#[test]
fn a_sweep_and_a_refill_inside_the_gap_leave_one_counted_eviction() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(millis(500));
        let service = service(algorithm, &clock);
        for key in 1..=8 {
            assert!(service.allow(&key, &PLAN).unwrap());
        }
        clock.set(millis(10_500));
        let (resume_tx, request) = parked_first_request(&service, 100, When::After);
        assert_eq!(service.sweep(), 8, "{algorithm}: every client idle");
        assert_eq!(service.len(), 0, "{algorithm}");
        fill_spent(&service, 11..=18, LIMIT);
        let granted = resume(resume_tx, request);
        let refill = remaining(&service, 11..=18);
        assert_eq!(
            (
                granted,
                service.evictions(),
                reset_and_spent(&refill, LIMIT),
                remaining(&service, 1..=8),
                1 + spend(&service, 100),
                service.len(),
            ),
            (true, 1, (1, 7), vec![LIMIT; 8], LIMIT, CAPACITY),
            "{algorithm}: new client, evictions, (reset, spent) of the refill {refill:?}, swept \
             clients, its grants, len"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Rule changes inside the gap (the insert holds the limits it read before).
// ---------------------------------------------------------------------------------------------

/// In the gap, the rule changes (4/s to 2/s) and every spent client comes back and spends the
/// new rule's 2: the bucket is full of states of the new version, which the parked insert (its
/// limits read before the change) cannot reuse under its old ones. It must neither hang nor
/// put a state of the old rule that is granted on: the decision inserts again under the new
/// rule, evicting one client (counted), and the new client gets exactly the new rule's limit.
#[test]
fn a_rule_change_and_a_refill_under_it_inside_the_gap() {
    let _serial = serial();
    const NEW_LIMIT: u64 = 2;
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(millis(500));
        let service = service(algorithm, &clock);
        fill_spent(&service, 1..=8, LIMIT);
        let (resume_tx, request) = parked_first_request(&service, 100, When::Before);
        service
            .set_rule(&PLAN, Rule::new(NEW_LIMIT, WINDOW).unwrap())
            .unwrap();
        fill_spent(&service, 1..=8, NEW_LIMIT);
        assert_eq!(
            service.evictions(),
            0,
            "{algorithm}: earlier rule's slots reused"
        );
        let granted = resume(resume_tx, request);
        let peeks = remaining(&service, 1..=8);
        assert_eq!(
            (
                granted,
                service.evictions(),
                reset_and_spent(&peeks, NEW_LIMIT),
                1 + spend(&service, 100),
                service.len(),
            ),
            (true, 1, (1, 7), NEW_LIMIT, CAPACITY),
            "{algorithm}: new client, evictions, (reset, spent) {peeks:?}, its grants, len"
        );
    }
}

/// In the gap the rule changes (all clients spent, none idle), nothing else: every client, the
/// parked one included, gets exactly the new rule's limit after the change, and the store holds
/// its capacity. (The parked insert, holding the old limits, may count one eviction of a state
/// the change had made stale; never more.)
#[test]
fn a_rule_change_alone_inside_the_gap_grants_one_window_of_the_new_rule() {
    let _serial = serial();
    const NEW_LIMIT: u64 = 2;
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(millis(500));
        let service = service(algorithm, &clock);
        fill_spent(&service, 1..=8, LIMIT);
        let (resume_tx, request) = parked_first_request(&service, 100, When::Before);
        service
            .set_rule(&PLAN, Rule::new(NEW_LIMIT, WINDOW).unwrap())
            .unwrap();
        let granted = resume(resume_tx, request);
        let evictions_at_resume = service.evictions();
        let mut grants = vec![u64::from(granted) + spend(&service, 100)];
        grants.extend((1..=8).map(|key| spend(&service, key)));
        assert_eq!(
            grants,
            vec![NEW_LIMIT; 9],
            "{algorithm}: the key, then keys 1..=8"
        );
        assert!(
            evictions_at_resume <= 1,
            "{algorithm}: {evictions_at_resume} evictions by one insert"
        );
        assert_eq!(service.len(), CAPACITY, "{algorithm}");
        eprintln!("{algorithm}: evictions counted by the parked insert: {evictions_at_resume}");
    }
}

/// In the gap the plan goes to two limits (its clients then live in its map), the key is
/// granted there, and the plan comes back to one limit (a third version). The parked insert,
/// holding the first version's limits, puts a state that must not be granted on: the key gets
/// exactly one limit of the restored rule after the change back, never the first version's
/// state nor its map state; no error, no hang, the store at its capacity.
#[test]
fn several_limits_and_back_inside_the_gap() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(millis(500));
        let service = service(algorithm, &clock);
        fill_spent(&service, 1..=8, LIMIT);
        let (resume_tx, request) = parked_first_request(&service, 100, When::Before);
        service
            .set_limits(
                &PLAN,
                [rule(), Rule::new(100, Duration::from_secs(60)).unwrap()],
            )
            .unwrap();
        assert_eq!(
            spend(&service, 100),
            LIMIT,
            "{algorithm}: the key under two limits"
        );
        service.set_limits(&PLAN, [rule()]).unwrap();
        let granted = resume(resume_tx, request);
        let evictions_at_resume = service.evictions();
        let key = u64::from(granted) + spend(&service, 100);
        let others: Vec<u64> = (1..=8).map(|key| spend(&service, key)).collect();
        assert_eq!(
            (key, others, service.len()),
            (LIMIT, vec![LIMIT; 8], CAPACITY),
            "{algorithm}: the key's grants after the change back, keys 1..=8, len"
        );
        assert!(
            evictions_at_resume <= 1,
            "{algorithm}: {evictions_at_resume} evictions by one insert"
        );
    }
}

/// The rule changes (4/s to 2/s) while a new client's insert is in the gap, every client
/// spent. Under the rule in force every state in the bucket is of an earlier rule: a reuse takes
/// one uncounted, as the same first request made just after the change does (the twin). The
/// parked insert should count no more evictions than its twin: an eviction counts a client
/// reset by the flood, and these were reset by the change already.
#[test]
fn a_rule_change_inside_the_gap_counts_no_eviction_the_request_after_it_would_not() {
    let _serial = serial();
    const NEW_LIMIT: u64 = 2;
    let mut seen = Vec::new();
    for algorithm in STORE_METHODS {
        let new_rule = Rule::new(NEW_LIMIT, WINDOW).unwrap();
        let twin = {
            let clock = FakeClock::starting_at(millis(500));
            let service = service(algorithm, &clock);
            fill_spent(&service, 1..=8, LIMIT);
            service.set_rule(&PLAN, new_rule).unwrap();
            let granted = service.allow(&100, &PLAN).unwrap();
            (granted, service.evictions())
        };
        let parked = {
            let clock = FakeClock::starting_at(millis(500));
            let service = service(algorithm, &clock);
            fill_spent(&service, 1..=8, LIMIT);
            let (resume_tx, request) = parked_first_request(&service, 100, When::Before);
            service.set_rule(&PLAN, new_rule).unwrap();
            let granted = resume(resume_tx, request);
            (granted, service.evictions())
        };
        seen.push((algorithm, parked, twin));
    }
    let expected: Vec<_> = seen
        .iter()
        .map(|&(algorithm, _, twin)| (algorithm, twin, twin))
        .collect();
    assert_eq!(
        seen, expected,
        "per method: (granted, evictions) of the insert parked across the change, then of its twin"
    );
}
