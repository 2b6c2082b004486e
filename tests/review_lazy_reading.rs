//! Review of the insert's clock readings (a first request reads the clock once where it claims
//! a free slot, twice where it must reuse one), through the public API only.
//!
//! A first request reads the clock before its insert takes its bucket's lock; where no slot is
//! free, the insert lets the lock go, reads the clock again, and makes its passes again under
//! the lock; `reuse` decides at that reading which states are idle and publishes it in the
//! service's `evicted_up_to` before it retires a state; the fresh state is made as of
//! `evicted_up_to`, and the request is decided on it at the same reading (unless the state is
//! made as of a later one: the request's lookup then decides on it at a reading of its own). These tests aim at that reading: clocks
//! scripted per thread and per reading (a reading later or earlier than the other clients',
//! a thread parked inside it while the store, the rules or the clock change, a clock that panics
//! or re-enters the service there), with stores so small that every first request must reuse a
//! slot.
//!
//! What they hold the service to (its documented promises): a client whose slot is reused as
//! idle is answered as it would have been (never more generously, even at a reading older than
//! the reuse's); an evicted client gains at most one limit's worth, once per counted eviction;
//! a flood of new keys never resets a client that is still active while idle ones exist; a rule
//! change grants at most one window of the new rule beyond what was used; the store holds at
//! most its capacity.
//!
//! `REVIEW_LAZY_READING_MILLIS` sets how long each phase of the racing test runs (default 25).

use std::cell::{Cell, RefCell};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::Command;
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

/// The plan of every service here.
const PLAN: &str = "p";

/// Limit and window of the tests' rule: 4 permits a second (the token bucket's emission interval
/// is 250 ms).
const LIMIT: u64 = 4;
const WINDOW: Duration = Duration::from_secs(1);

/// A hook run on this thread at one of its clock readings.
type Hook = Box<dyn FnOnce()>;

thread_local! {
    /// Added to every reading this thread takes (a core whose counter is ahead or behind).
    static OFFSET_NANOS: Cell<i64> = const { Cell::new(0) };
    /// Readings this thread has taken of any `ScriptedClock`.
    static READINGS: Cell<u64> = const { Cell::new(0) };
    /// A hook to run at this thread's reading of that number, before the reading is taken.
    static AT_READING: RefCell<Option<(u64, Hook)>> = const { RefCell::new(None) };
}

/// A [`FakeClock`] read through per-thread scripts: each thread's readings are counted, moved by
/// the thread's offset, and one of them may first run a hook (park the thread, move the clock,
/// panic, call the service again).
#[derive(Debug, Clone, Default)]
struct ScriptedClock(FakeClock);

impl Clock for ScriptedClock {
    fn now_nanos(&self) -> u64 {
        let number = READINGS.with(|readings| {
            readings.set(readings.get() + 1);
            readings.get()
        });
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
        let offset = OFFSET_NANOS.with(Cell::get);
        self.0.now_nanos().saturating_add_signed(offset)
    }
}

/// This thread's readings so far.
fn readings() -> u64 {
    READINGS.with(Cell::get)
}

/// Runs `hook` at this thread's `nth` reading from now (1: the next one).
fn at_reading(nth: u64, hook: impl FnOnce() + 'static) {
    let at = readings() + nth;
    AT_READING.with(|slot| *slot.borrow_mut() = Some((at, Box::new(hook))));
}

/// Whether this thread's hook has run (or none was set).
fn hook_ran() -> bool {
    AT_READING.with(|slot| slot.borrow().is_none())
}

/// Moves this thread's readings by `offset` (signed nanoseconds).
fn set_offset(offset: i64) {
    OFFSET_NANOS.with(|cell| cell.set(offset));
}

type Service = RateLimiterService<u64, &'static str, ScriptedClock>;

fn rule() -> Rule {
    Rule::new(LIMIT, WINDOW).unwrap()
}

/// A service of `algorithm` whose plan holds `capacity` clients (8: one bucket, which every key
/// shares as its home and other bucket).
fn service(algorithm: Algorithm, capacity: usize, clock: &FakeClock) -> Arc<Service> {
    Arc::new(
        ServiceBuilder::new(algorithm, ScriptedClock(clock.clone()))
            .plan(PLAN, rule())
            .capacity(capacity)
            .build::<u64>()
            .unwrap(),
    )
}

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// Asks for `key` until denied; how many single permits it was granted (at most `LIMIT + 1`
/// asks, so a client granted past its limit shows as `LIMIT + 1`).
fn spend(service: &Service, key: u64) -> u64 {
    grants_until_denied(LIMIT, || service.allow(&key, &PLAN).unwrap())
}

/// Fills a one-bucket store with keys `keys`, each spending its limit at the clock's reading.
fn fill_spent(service: &Service, keys: impl IntoIterator<Item = u64>) {
    for key in keys {
        assert_eq!(
            spend(service, key),
            LIMIT,
            "key {key}: a fresh client's permits"
        );
    }
}

/// One test at a time where threads race or park (each wants both cores).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A request of `key` on another thread that parks at its first clock reading (for a first
/// request into a full store: the insert's, taken with the bucket's insert lock let go): returns
/// once it has parked, with the sender that resumes it and its join handle.
fn parked_first_request(
    service: &Arc<Service>,
    key: u64,
) -> (Sender<()>, thread::JoinHandle<(bool, bool)>) {
    let (parked_tx, parked_rx) = channel::<()>();
    let (resume_tx, resume_rx) = channel::<()>();
    let request = {
        let service = Arc::clone(service);
        thread::spawn(move || {
            at_reading(1, move || {
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

fn wait_for(receiver: &Receiver<()>, what: &str) {
    receiver
        .recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("timed out: {what}"));
}

// ---------------------------------------------------------------------------------------------
// How often a request reads the clock.
// ---------------------------------------------------------------------------------------------

/// The claim, counted: a first request that takes a free slot reads the clock once (the
/// reading it is decided at), one that must reuse a slot twice (the second, taken with the
/// insert's lock let go, judges which states are idle and is the one it is decided at); a known
/// client's request, an attempt of 0 permits by a new client, a peek and a sweep once each.
#[test]
fn a_first_request_reads_the_clock_once_unless_it_must_reuse_a_slot() {
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(millis(500));
        let service = service(algorithm, 8, &clock);
        let count = |what: &str, call: &dyn Fn()| {
            let before = readings();
            call();
            let taken = readings() - before;
            (what.to_owned(), taken)
        };
        let mut counted = vec![count("first request, free slot", &|| {
            service.allow(&1, &PLAN).unwrap();
        })];
        counted.push(count("known client", &|| {
            service.allow(&1, &PLAN).unwrap();
        }));
        counted.push(count("first request of n = 3, free slot", &|| {
            assert!(service.acquire(&2, &PLAN, 3).unwrap().is_allowed());
        }));
        for key in 3..=8 {
            service.allow(&key, &PLAN).unwrap();
        }
        counted.push(count("first request, full store", &|| {
            service.allow(&100, &PLAN).unwrap();
        }));
        counted.push(count("first request of n = 0, full store", &|| {
            assert!(service.acquire(&101, &PLAN, 0).unwrap().is_allowed());
        }));
        counted.push(count("peek of an unknown client", &|| {
            assert_eq!(service.peek(&102, &PLAN).unwrap().remaining(), LIMIT);
        }));
        counted.push(count("sweep", &|| {
            service.sweep();
        }));
        let expected = [1, 1, 1, 2, 1, 1, 1];
        let taken: Vec<u64> = counted.iter().map(|(_, taken)| *taken).collect();
        assert_eq!(
            taken, expected,
            "{algorithm}: readings per call {counted:?}"
        );
        assert_eq!(
            service.evictions(),
            1,
            "{algorithm}: the full store's one eviction"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The reuse publishes its reading, alone (no sweep anywhere).
// ---------------------------------------------------------------------------------------------

/// A spent client's slot, reused as idle by a new client (no sweep ever runs, so only the
/// reuse's lazy reading is published), then the clock stepped back into the window the client
/// used up: `peek` and the request both refuse it as its old state would have; and at the
/// reuse's reading it is answered exactly as before the reuse (nothing counted as an eviction).
#[test]
fn a_slot_reused_as_idle_without_a_sweep_refuses_a_reading_the_old_state_refused() {
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(millis(500));
        let service = service(algorithm, 8, &clock);
        assert_eq!(spend(&service, 1), LIMIT);
        clock.set(millis(5_000));
        // Seven active clients: one permit each at 5 s.
        for key in 2..=8 {
            assert!(service.allow(&key, &PLAN).unwrap());
        }
        let before = service.peek(&1, &PLAN).unwrap();
        assert_eq!(before.remaining(), LIMIT, "{algorithm}: idle at 5 s");
        // A new client: the store is full, and key 1's state is the one idle.
        assert!(service.allow(&100, &PLAN).unwrap());
        assert_eq!(
            service.evictions(),
            0,
            "{algorithm}: an idle slot was there"
        );
        assert_eq!(service.len(), 8, "{algorithm}");
        let after = service.peek(&1, &PLAN).unwrap();
        assert_eq!(
            (after.remaining(), after.is_allowed()),
            (before.remaining(), before.is_allowed()),
            "{algorithm}: an idle reuse changes no answer at its reading"
        );
        // Back into the window key 1 used up.
        clock.set(millis(600));
        let peeked = service.peek(&1, &PLAN).unwrap();
        assert_eq!(
            peeked.remaining(),
            0,
            "{algorithm}: {peeked:?} at a reading the old state refused"
        );
        // An attempt of 0 permits reports the same, and makes no state (no slot taken, no one
        // evicted from the full store).
        let nothing = service.acquire(&1, &PLAN, 0).unwrap();
        assert_eq!(
            (nothing.remaining(), service.evictions(), service.len()),
            (0, 0, 8),
            "{algorithm}: {nothing:?} for 0 permits at a reading the old state refused"
        );
        let decided = service.acquire(&1, &PLAN, 1).unwrap();
        assert!(
            decided.is_denied(),
            "{algorithm}: {decided:?} at a reading the old state refused"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// A first request parked inside its insert's reading.
// ---------------------------------------------------------------------------------------------

/// A full bucket: key 1 used one permit at 0.5 s (idle by 10.5 s), keys 2..=8 spent at 10.5 s. A
/// first request parks at its insert's reading; a sweep frees key 1's idle slot meanwhile. On
/// resuming, the insert must take the freed slot, not evict an active client: no eviction, every
/// spent client still refused, the store at its capacity.
#[test]
fn a_sweep_while_an_insert_reads_the_clock_frees_the_slot_it_takes() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(millis(500));
        let service = service(algorithm, 8, &clock);
        assert!(service.allow(&1, &PLAN).unwrap());
        clock.set(millis(10_500));
        fill_spent(&service, 2..=8);
        let (resume, request) = parked_first_request(&service, 100);
        assert_eq!(service.sweep(), 1, "{algorithm}: key 1's idle state swept");
        resume.send(()).unwrap();
        let (granted, parked) = request.join().unwrap();
        assert!(granted && parked, "{algorithm}: the new client granted");
        assert_eq!(
            service.evictions(),
            0,
            "{algorithm}: a freed slot was there"
        );
        assert_eq!(service.len(), 8, "{algorithm}");
        for key in 2..=8 {
            assert!(
                !service.allow(&key, &PLAN).unwrap(),
                "{algorithm}: key {key} was reset"
            );
        }
        assert_eq!(service.evictions(), 0, "{algorithm}");
    }
}

/// As above, but the plan's rule changes while the insert is parked (it read the plan's limits
/// before): the parked client and every spent client get exactly one window of the new rule,
/// nothing is evicted (every state is of the earlier rule, so each slot is reusable), and no
/// client is granted under the old rule after the change.
#[test]
fn a_rule_change_while_an_insert_reads_the_clock_grants_one_window_of_the_new_rule() {
    let _serial = serial();
    let new_limit = 2;
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(millis(500));
        let service = service(algorithm, 8, &clock);
        assert!(service.allow(&1, &PLAN).unwrap());
        clock.set(millis(10_500));
        fill_spent(&service, 2..=8);
        let (resume, request) = parked_first_request(&service, 100);
        service
            .set_rule(&PLAN, Rule::new(new_limit, WINDOW).unwrap())
            .unwrap();
        resume.send(()).unwrap();
        let (granted, parked) = request.join().unwrap();
        assert!(granted && parked, "{algorithm}: the new client granted");
        let mut granted_after = vec![(100, 1 + spend(&service, 100))];
        for key in 2..=8 {
            granted_after.push((key, spend(&service, key)));
        }
        let expected: Vec<(u64, u64)> = granted_after
            .iter()
            .map(|(key, _)| (*key, new_limit))
            .collect();
        assert_eq!(
            granted_after, expected,
            "{algorithm}: grants after the change, per key"
        );
        assert_eq!(service.evictions(), 0, "{algorithm}");
        assert_eq!(service.len(), 8, "{algorithm}");
    }
}

/// Moves this thread's next clock reading alone by `offset` (the reading after it is taken
/// without): for a first request into a full store, the insert's reading.
fn skew_next_reading(offset: i64) {
    at_reading(1, move || {
        set_offset(offset);
        at_reading(1, || set_offset(0));
    });
}

/// `call` with this thread's clock readings moved by `offset` (signed nanoseconds); the number
/// of readings it took.
fn with_readings_moved(offset: i64, call: impl FnOnce()) -> u64 {
    let before = readings();
    set_offset(offset);
    call();
    set_offset(0);
    readings() - before
}

/// Every client spent at 0.5 s. A new client's request reads 5.5 s (a core ahead), where every
/// state is idle, so its insert reuses key 1's slot as idle at a reading later than any other
/// client's, and its fresh state (made as of that reading) grants it there. Back at 0.6 s, inside
/// the window every client used up, key 1 (retired as idle) must be refused as its state would
/// have refused it, and the others gain at most one limit per counted eviction.
#[test]
fn a_reuse_at_a_later_reading_than_the_others_gives_a_retired_client_nothing() {
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(millis(500));
        let service = service(algorithm, 8, &clock);
        fill_spent(&service, 1..=8);
        let mut granted = false;
        let taken = with_readings_moved(5_000_000_000, || {
            granted = service.allow(&100, &PLAN).unwrap();
        });
        assert_eq!(
            taken, 2,
            "{algorithm}: two readings, the request's and the reuse's"
        );
        assert_eq!(
            service.evictions(),
            0,
            "{algorithm}: every state was idle at 5.5 s"
        );
        assert!(
            granted,
            "{algorithm}: a state made as of 5.5 s grants at 5.5 s"
        );
        clock.set(millis(600));
        let peeked: Vec<u64> = (1..=8)
            .map(|key| service.peek(&key, &PLAN).unwrap().remaining())
            .collect();
        assert_eq!(peeked, [0; 8], "{algorithm}: peeks at 0.6 s");
        let evictions_before = service.evictions();
        let key_1 = spend(&service, 1);
        assert_eq!(
            key_1, 0,
            "{algorithm}: key 1, retired as idle at 5.5 s, at 0.6 s"
        );
        let others: u64 = (2..=8).map(|key| spend(&service, key)).sum();
        let evicted = service.evictions() - evictions_before;
        assert!(
            others <= LIMIT * evicted,
            "{algorithm}: {others} granted to spent clients at 0.6 s, with {evicted} evictions"
        );
    }
}

/// The mirror image: every client spent at 5.5 s, and a new client's insert reads 0.6 s (a core
/// behind), where no state is idle, so it evicts one (counted). Its fresh state is made as of
/// where the victim's counts end, ahead of that reading: the insert publishes it undecided, and
/// the request's lookup decides on it at a reading of its own, 5.5 s. At
/// 5.5 s the new client gets at most its limit, and the spent clients together at most one
/// limit per counted eviction.
#[test]
fn a_reuse_at_an_earlier_reading_than_the_decisions_evicts_at_most_one_limit_per_count() {
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(millis(500));
        let service = service(algorithm, 8, &clock);
        clock.set(millis(5_500));
        fill_spent(&service, 1..=8);
        skew_next_reading(-4_900_000_000);
        let granted = service.allow(&100, &PLAN).unwrap();
        assert!(
            hook_ran(),
            "{algorithm}: two readings, the insert's and the decision's"
        );
        assert_eq!(service.evictions(), 1, "{algorithm}: nothing idle at 0.6 s");
        let newcomer = u64::from(granted) + spend(&service, 100);
        assert_eq!(newcomer, LIMIT, "{algorithm}: the new client at 5.5 s");
        let spent: u64 = (1..=8).map(|key| spend(&service, key)).sum();
        let evicted = service.evictions();
        // Each eviction resets one client, the new one or a spent one: together they gain at
        // most one limit per eviction past the new client's own first limit.
        assert!(
            spent + newcomer <= LIMIT * (1 + evicted),
            "{algorithm}: spent clients {spent}, new client {newcomer}, evictions {evicted}"
        );
        assert!(service.len() <= 8, "{algorithm}");
    }
}

// ---------------------------------------------------------------------------------------------
// A clock that panics, or calls the service again, inside the insert's reading.
// ---------------------------------------------------------------------------------------------

/// A clock that panics at the insert's reading: the
/// panic leaves no lock held and no slot taken. The next first request of the same bucket
/// completes, the spent clients keep their states, and the store still holds exactly its
/// capacity.
#[test]
fn a_clock_panicking_inside_the_insert_leaves_the_bucket_usable() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(millis(500));
        let service = service(algorithm, 8, &clock);
        fill_spent(&service, 1..=8);
        at_reading(1, || panic!("the clock fails inside the insert (planted)"));
        let outcome = catch_unwind(AssertUnwindSafe(|| service.allow(&100, &PLAN)));
        assert!(outcome.is_err(), "{algorithm}: the planted panic");
        assert!(hook_ran(), "{algorithm}");
        assert_eq!(
            service.evictions(),
            0,
            "{algorithm}: the panic came before any reuse"
        );
        assert_eq!(service.len(), 8, "{algorithm}");
        // The next first request on another thread, watched: a lock left held would hang it.
        let (done_tx, done_rx) = channel();
        let next = {
            let service = Arc::clone(&service);
            thread::spawn(move || {
                let granted = service.allow(&101, &PLAN).unwrap();
                done_tx.send(()).unwrap();
                granted
            })
        };
        wait_for(&done_rx, "a first request after the panic");
        assert!(
            next.join().unwrap(),
            "{algorithm}: the next new client granted"
        );
        assert_eq!(
            service.evictions(),
            1,
            "{algorithm}: it evicted one spent client"
        );
        assert_eq!(service.len(), 8, "{algorithm}");
        let reset: Vec<u64> = (1..=8)
            .filter(|key| service.peek(key, &PLAN).unwrap().remaining() > 0)
            .collect();
        assert!(
            reset.len() <= 1,
            "{algorithm}: clients reset {reset:?} by one eviction"
        );
    }
}

/// The environment variable under which a re-entrant clock's scenario runs in a child process
/// (where a hang can be killed without leaving a spinning thread in this one).
const CHILD: &str = "REVIEW_LAZY_READING_CHILD";

/// Runs the test `name` (this binary's) in a child process with [`CHILD`] set, and fails if it
/// fails or does not finish within 20 s (then kills it: only the child this test started).
fn in_child_process(name: &str) {
    let _serial = serial();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(20) {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        thread::sleep(millis(20));
    };
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let status = status.unwrap_or_else(|| {
        panic!("{name}: the scenario hung (killed after 20 s); it had printed:\n{stderr}")
    });
    assert!(
        status.success() && stdout.contains("1 passed"),
        "{name}: the scenario failed ({status}):\n{stdout}\n{stderr}"
    );
}

/// A clock that, at a new client's insert's reading, serves other calls of the same service on
/// the same thread: a sweep, a peek, a known client's request, a rule set to the rule it is.
/// Each completes, and the insert after them evicts one spent client (counted) for the new one.
#[test]
fn a_clock_calling_the_service_inside_the_insert_completes() {
    if std::env::var_os(CHILD).is_none() {
        in_child_process("a_clock_calling_the_service_inside_the_insert_completes");
        return;
    }
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(millis(500));
        let service = service(algorithm, 8, &clock);
        fill_spent(&service, 1..=8);
        let inner = Arc::new(Mutex::new(Vec::new()));
        {
            let (service, inner) = (Arc::clone(&service), Arc::clone(&inner));
            at_reading(1, move || {
                let mut seen = inner.lock().unwrap();
                seen.push(("sweep", service.sweep() as u64));
                seen.push(("peek", service.peek(&1, &PLAN).unwrap().remaining()));
                seen.push(("known", u64::from(service.allow(&2, &PLAN).unwrap())));
                service.set_rule(&PLAN, rule()).unwrap();
                seen.push(("set_rule", 1));
            });
        }
        let outer = service.allow(&100, &PLAN).unwrap();
        assert!(hook_ran(), "{algorithm}: the clock ran its calls");
        let seen = inner.lock().unwrap().clone();
        assert_eq!(
            seen,
            [("sweep", 0), ("peek", 0), ("known", 0), ("set_rule", 1)],
            "{algorithm}: inside the clock"
        );
        assert!(outer, "{algorithm}: the new client");
        assert_eq!(
            service.evictions(),
            1,
            "{algorithm}: one spent client evicted"
        );
    }
}

/// A clock that, at a new client's insert's reading, asks the same service for another new
/// client of the same bucket, on the same thread. The insert reads the clock with the bucket's
/// insert lock let go, so the inner request takes the lock and completes; were the reading
/// taken under the lock, the inner request would wait for a lock its own thread holds, and the
/// thread would spin for good (the child process is killed after 20 s). Each new client evicts
/// one spent client.
#[test]
fn a_clock_asking_for_a_new_client_inside_the_insert_completes() {
    if std::env::var_os(CHILD).is_none() {
        in_child_process("a_clock_asking_for_a_new_client_inside_the_insert_completes");
        return;
    }
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(millis(500));
        let service = service(algorithm, 8, &clock);
        fill_spent(&service, 1..=8);
        let inner = Arc::new(Mutex::new(None));
        {
            let (service, inner) = (Arc::clone(&service), Arc::clone(&inner));
            at_reading(1, move || {
                eprintln!("{algorithm}: the clock asks for a new client of the same bucket");
                let granted = service.allow(&200, &PLAN).unwrap();
                *inner.lock().unwrap() = Some(granted);
            });
        }
        let outer = service.allow(&100, &PLAN).unwrap();
        assert!(hook_ran(), "{algorithm}: the clock ran its request");
        assert_eq!(
            *inner.lock().unwrap(),
            Some(true),
            "{algorithm}: the inner new client"
        );
        assert!(outer, "{algorithm}: the outer new client");
        assert_eq!(
            service.evictions(),
            2,
            "{algorithm}: one spent client for each"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Racing: a flood whose insert readings are ahead of the hot clients' decisions.
// ---------------------------------------------------------------------------------------------

fn phase_length() -> Duration {
    let millis = std::env::var("REVIEW_LAZY_READING_MILLIS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(25);
    Duration::from_millis(millis)
}

/// What one racing run saw.
struct Raced {
    /// Per hot client, per phase: grants of `LIMIT` permits, and attempts.
    grants: Vec<Vec<u64>>,
    attempts: Vec<Vec<u64>>,
    evictions: u64,
    most_held: usize,
    flood_keys: u64,
}

const HOT: [u64; 2] = [1, 2];
const PHASES: usize = 16;

/// The base clock of phase `phase`: the middle of a window, one window after the last.
fn phase_reading(phase: usize) -> Duration {
    Duration::from_millis(10_500 + 1_000 * phase as u64)
}

/// A one-bucket store (capacity 8): two hot clients, each on its own thread, asking for their
/// whole limit at once (all or nothing) over and over at their clock's reading (offset 0); a
/// flooder making first requests of distinct keys (one permit each) with its readings moved by
/// `flood_offset`; with `sweeping`, a sweeper reading at the flooder's offset. The base clock
/// stands still within a phase and moves one window between phases, with every thread stopped.
fn race(algorithm: Algorithm, flood_offset: i64, sweeping: bool) -> Raced {
    let clock = FakeClock::starting_at(phase_reading(0));
    let service = service(algorithm, 8, &clock);
    let grants: Arc<Vec<Vec<AtomicU64>>> = Arc::new(
        HOT.iter()
            .map(|_| (0..PHASES).map(|_| AtomicU64::new(0)).collect())
            .collect(),
    );
    let attempts: Arc<Vec<Vec<AtomicU64>>> = Arc::new(
        HOT.iter()
            .map(|_| (0..PHASES).map(|_| AtomicU64::new(0)).collect())
            .collect(),
    );
    let workers = HOT.len() + 1 + usize::from(sweeping);
    let start = Arc::new(Barrier::new(workers + 1));
    let end = Arc::new(Barrier::new(workers + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    let phase_now = Arc::new(AtomicU64::new(0));
    let flood_keys = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    let worker = |body: Box<dyn Fn(usize) + Send>| {
        let (start, end, stop, finished, phase_now) = (
            Arc::clone(&start),
            Arc::clone(&end),
            Arc::clone(&stop),
            Arc::clone(&finished),
            Arc::clone(&phase_now),
        );
        thread::spawn(move || {
            loop {
                start.wait();
                if finished.load(Ordering::SeqCst) {
                    break;
                }
                let phase = phase_now.load(Ordering::SeqCst) as usize;
                while !stop.load(Ordering::Relaxed) {
                    body(phase);
                }
                end.wait();
            }
        })
    };
    for (index, &hot) in HOT.iter().enumerate() {
        let (service, grants, attempts) = (
            Arc::clone(&service),
            Arc::clone(&grants),
            Arc::clone(&attempts),
        );
        threads.push(worker(Box::new(move |phase| {
            let decision = service.acquire(&hot, &PLAN, LIMIT).unwrap();
            attempts[index][phase].fetch_add(1, Ordering::Relaxed);
            if decision.is_allowed() {
                grants[index][phase].fetch_add(1, Ordering::Relaxed);
            }
        })));
    }
    {
        let (service, flood_keys) = (Arc::clone(&service), Arc::clone(&flood_keys));
        threads.push(worker(Box::new(move |_| {
            set_offset(flood_offset);
            let key = 1_000 + flood_keys.fetch_add(1, Ordering::Relaxed);
            service.allow(&key, &PLAN).unwrap();
        })));
    }
    if sweeping {
        let service = Arc::clone(&service);
        threads.push(worker(Box::new(move |_| {
            set_offset(flood_offset);
            service.sweep();
            thread::yield_now();
        })));
    }
    let mut most_held = 0;
    for phase in 0..PHASES {
        clock.set(phase_reading(phase));
        phase_now.store(phase as u64, Ordering::SeqCst);
        stop.store(false, Ordering::SeqCst);
        start.wait();
        thread::sleep(phase_length());
        stop.store(true, Ordering::SeqCst);
        end.wait();
        most_held = most_held.max(service.len());
    }
    finished.store(true, Ordering::SeqCst);
    start.wait();
    for thread in threads {
        thread.join().unwrap();
    }
    let read = |counts: &Vec<Vec<AtomicU64>>| {
        counts
            .iter()
            .map(|per_phase| {
                per_phase
                    .iter()
                    .map(|count| count.load(Ordering::Relaxed))
                    .collect()
            })
            .collect()
    };
    Raced {
        grants: read(&grants),
        attempts: read(&attempts),
        evictions: service.evictions(),
        most_held,
        flood_keys: flood_keys.load(Ordering::Relaxed),
    }
}

/// What a client that is never reset is granted per phase: one attempt per phase where the
/// raced client made any (at a standing clock, attempts after the first change nothing), on a
/// service with room for every client.
fn twin(algorithm: Algorithm, attempts: &[u64]) -> Vec<u64> {
    let clock = FakeClock::starting_at(phase_reading(0));
    let service = service(algorithm, 64, &clock);
    (0..PHASES)
        .map(|phase| {
            clock.set(phase_reading(phase));
            u64::from(
                attempts[phase] > 0 && service.acquire(&1, &PLAN, LIMIT).unwrap().is_allowed(),
            )
        })
        .collect()
}

/// The flood reads the clock at the hot clients' reading (offset 0): each hot client is granted
/// exactly what a client never reset would be, phase by phase. A spent hot client is never the
/// state closest to fresh (the flood's states have `LIMIT - 1` left), and one whose slot is
/// reused as idle (a window later) is answered alike. With the flood's readings ahead (by 0.3,
/// 0.7, 1.2 and 2.5 windows), a hot client whose slot is reused as idle at the flood's later
/// reading, or evicted there, is never granted more than one limit in a phase.
#[test]
fn a_flood_reading_ahead_of_hot_clients_never_grants_them_past_their_limit() {
    let _serial = serial();
    let offsets: [i64; 5] = [0, 300_000_000, 700_000_000, 1_200_000_000, 2_500_000_000];
    for algorithm in STORE_METHODS {
        for &offset in &offsets {
            for sweeping in [false, true] {
                let raced = race(algorithm, offset, sweeping);
                let what = format!(
                    "{algorithm}, flood offset {offset} ns, sweeping {sweeping} ({} flood keys, \
                     {} evictions)",
                    raced.flood_keys, raced.evictions
                );
                eprintln!("{what}: grants {:?}", raced.grants);
                assert!(raced.most_held <= 8, "{what}: {} held", raced.most_held);
                assert!(raced.flood_keys > 0, "{what}: the flood ran");
                for (index, per_phase) in raced.grants.iter().enumerate() {
                    assert!(
                        raced.attempts[index].iter().all(|&attempts| attempts > 0),
                        "{what}: hot client {index} asked in every phase"
                    );
                    assert!(
                        per_phase.iter().all(|&grants| grants <= 1),
                        "{what}: hot client {index} granted past its limit in a phase: \
                         {per_phase:?}"
                    );
                    if offset == 0 {
                        assert_eq!(
                            per_phase,
                            &twin(algorithm, &raced.attempts[index]),
                            "{what}: hot client {index} against a client never reset"
                        );
                    }
                }
            }
        }
    }
}
