//! Live rule changes racing requests and sweeps: a read of a plan's rule never mixes versions
//! (so no decision runs under another rule's constants, and none panics), and a change grants a
//! client at most one window's worth of the new rule beyond what it had used, even to requests
//! that were in flight when it happened.

use std::cell::RefCell;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use tollgate::{Algorithm, Clock, FakeClock, MonotonicClock, RateLimiterService, Rule};

#[path = "support/park.rs"]
mod park;
use park::{PARK_AT_READING, Park, ParkingClock, park_at, step_towards_park};

/// A client key whose `Hash` parks the hashing thread at its `n`th hash, when that thread has
/// asked for it: a stand-in for the thread being preempted at that point of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ParkingKey(u64);

thread_local! {
    static PARK: RefCell<Option<Park>> = const { RefCell::new(None) };
}

/// On this thread, park at the `nth` clock reading of a `ParkingClock` from now on.
fn park_at_reading(nth: usize) -> (Receiver<()>, Sender<()>) {
    park_at(&PARK_AT_READING, nth)
}

impl Hash for ParkingKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        step_towards_park(&PARK);
        self.0.hash(state);
    }
}

/// On this thread, park at the `nth` hash of a `ParkingKey` from now on.
fn park_at_hash(nth: usize) -> (Receiver<()>, Sender<()>) {
    park_at(&PARK, nth)
}

type ParkingService = RateLimiterService<ParkingKey, &'static str, FakeClock>;

/// The review's reproduction, made deterministic: five grants, then `in_flight` requests that
/// are preempted right after they start (at their first hash: the map lookup), a rule change (to
/// the same rule) and a sweep, then the in-flight requests resume, then ten more requests, all
/// at one instant. At most ten may be granted: five before, and one window's worth after.
fn granted_across_a_change_with_requests_in_flight(algorithm: Algorithm) -> usize {
    let clock = FakeClock::new();
    let rule = Rule::per_second(5).unwrap();
    let service: Arc<ParkingService> =
        Arc::new(RateLimiterService::new(algorithm, [("free", rule)], clock).unwrap());
    let client = ParkingKey(7);
    let mut granted = (0..5)
        .filter(|_| service.allow(&client, &"free").unwrap())
        .count();

    let mut in_flight = Vec::new();
    let mut resumes = Vec::new();
    for _ in 0..5 {
        let (ready_tx, ready_rx) = channel();
        let service = Arc::clone(&service);
        let client = client.clone();
        in_flight.push(std::thread::spawn(move || {
            let (parked, resume) = park_at_hash(1);
            ready_tx.send((parked, resume)).unwrap();
            service.allow(&client, &"free").unwrap()
        }));
        let (parked, resume) = ready_rx.recv().unwrap();
        parked
            .recv_timeout(Duration::from_secs(10))
            .expect("the request parks at its hash");
        resumes.push(resume);
    }
    service.set_rule(&"free", rule).unwrap();
    service.sweep();
    for resume in resumes {
        resume.send(()).unwrap();
    }
    granted += in_flight
        .into_iter()
        .map(|request| request.join().unwrap())
        .filter(|&allowed| allowed)
        .count();
    granted += (0..10)
        .filter(|_| service.allow(&client, &"free").unwrap())
        .count();
    granted
}

#[test]
fn requests_in_flight_across_a_rule_change_and_a_sweep_never_start_the_client_afresh_twice() {
    for algorithm in Algorithm::ALL {
        let granted = granted_across_a_change_with_requests_in_flight(algorithm);
        assert!(
            granted <= 10,
            "{algorithm}: {granted} granted in one instant, at most 10 may be"
        );
        assert!(granted >= 5, "{algorithm}: the new rule grants afresh");
    }
}

/// A service of one plan, "free" at 5 per second, with one other client known; for the one-word
/// methods, the plan has had two limits for a while, so that a first request's insert is preceded
/// by a lookup of the client in the plan's map (the retirement of a state made while the plan had
/// several limits), which hashes the key: the point at which the tests below park it.
fn service_with_a_known_client(
    algorithm: Algorithm,
) -> Arc<RateLimiterService<ParkingKey, &'static str, ParkingClock>> {
    let old = Rule::per_second(5).unwrap();
    let service: Arc<RateLimiterService<ParkingKey, &str, ParkingClock>> = Arc::new(
        RateLimiterService::new(algorithm, [("free", old)], ParkingClock::default()).unwrap(),
    );
    if algorithm != Algorithm::SlidingWindowLog {
        service
            .set_limits(&"free", [old, Rule::per_minute(100).unwrap()])
            .unwrap();
    }
    // Another client first, so that the map has a table and its lookups hash.
    assert!(service.allow(&ParkingKey(1), &"free").unwrap());
    service.set_rule(&"free", old).unwrap();
    service
}

/// Client 9's first request, parked where `park` says; then the rule changes to 3 per second,
/// and (if `others_while_parked`) ten of the client's requests are made; then the parked one
/// resumes, and ten more are made, all at one instant. Returns how many were granted.
fn granted_to_a_first_request_parked_across_a_change(
    algorithm: Algorithm,
    park: fn(Algorithm) -> (Receiver<()>, Sender<()>),
    others_while_parked: bool,
) -> usize {
    let service = service_with_a_known_client(algorithm);
    let client = ParkingKey(9);
    let (ready_tx, ready_rx) = channel();
    let first = {
        let service = Arc::clone(&service);
        let client = client.clone();
        std::thread::spawn(move || {
            ready_tx.send(park(algorithm)).unwrap();
            service.allow(&client, &"free").unwrap()
        })
    };
    let (parked, resume) = ready_rx.recv().unwrap();
    parked
        .recv_timeout(Duration::from_secs(10))
        .expect("the first request parks");
    service
        .set_rule(&"free", Rule::per_second(3).unwrap())
        .unwrap();
    let mut granted = 0;
    if others_while_parked {
        granted += (0..10)
            .filter(|_| service.allow(&client, &"free").unwrap())
            .count();
    }
    resume.send(()).unwrap();
    granted += usize::from(first.join().unwrap());
    granted += (0..10)
        .filter(|_| service.allow(&client, &"free").unwrap())
        .count();
    granted
}

/// A client that appears during a change: a first request preempted between its read of the
/// plan and its insert, while the rule changes (and, in one variant, other requests make the
/// client under the new rule), never adds a second fresh start nor grants under the old rule.
#[test]
fn a_first_request_preempted_before_its_insert_does_not_start_a_second_limiter() {
    for algorithm in Algorithm::ALL {
        for others_while_parked in [false, true] {
            let granted = granted_to_a_first_request_parked_across_a_change(
                algorithm,
                // The one-word store: hash 1, the store's place; hash 2, the plan map's lookup
                // that precedes the insert. The sliding log's map: hash 1, the lookup (finds
                // nothing); hash 2, the insert.
                |_| park_at_hash(2),
                others_while_parked,
            );
            assert_eq!(
                granted, 3,
                "{algorithm}, others while parked: {others_while_parked}: one window of the \
                 new rule in one instant"
            );
        }
    }
}

/// A first request preempted later, at its decision's reading of the clock (after its state was
/// made under the old rule, before it is decided on), may be granted under the old rule: its
/// lookup came before the change. Then the change grants one window of the new rule beyond
/// that, and no more: never a second fresh start, even where other requests made the client
/// under the new rule while it was parked.
#[test]
fn a_first_request_preempted_at_its_decision_is_granted_at_most_once_beyond_the_new_window() {
    for algorithm in Algorithm::ALL {
        for others_while_parked in [false, true] {
            let granted = granted_to_a_first_request_parked_across_a_change(
                algorithm,
                |_| park_at_reading(1),
                others_while_parked,
            );
            assert!(
                (3..=4).contains(&granted),
                "{algorithm}, others while parked: {others_while_parked}: {granted} granted; \
                 one window of the new rule, and at most the one request decided under the old"
            );
        }
    }
}

/// A client moving from a plan's map back to its store: its plan has two limits, and a request
/// that found the client's state in the map (and read the plan) is preempted before it decides;
/// the plan changes back to one limit, and the client's next requests are decided in the store,
/// on a fresh state. The parked request must then not be granted on the map's state: it was
/// retired before the fresh one was made. (One window of the new rule beyond the four already
/// used, as a change promises: nine in all.)
#[test]
fn a_request_holding_the_map_state_across_a_change_to_one_limit_is_not_granted_on_it() {
    for algorithm in Algorithm::ALL {
        if algorithm == Algorithm::SlidingWindowLog {
            // Its plans have one limit (and live in the map) whatever their changes.
            continue;
        }
        let five = Rule::per_second(5).unwrap();
        let service: Arc<RateLimiterService<ParkingKey, &str, ParkingClock>> = Arc::new(
            RateLimiterService::new(algorithm, [("free", five)], ParkingClock::default()).unwrap(),
        );
        service
            .set_limits(&"free", [five, Rule::per_minute(100).unwrap()])
            .unwrap();
        let client = ParkingKey(3);
        let mut granted = (0..4)
            .filter(|_| service.allow(&client, &"free").unwrap())
            .count();
        let (ready_tx, ready_rx) = channel();
        let holding = {
            let service = Arc::clone(&service);
            let client = client.clone();
            std::thread::spawn(move || {
                // The map's decision reads the clock once it has found the state and read the
                // plan, before it takes from the state.
                ready_tx.send(park_at_reading(1)).unwrap();
                service.allow(&client, &"free").unwrap()
            })
        };
        let (parked, resume) = ready_rx.recv().unwrap();
        parked
            .recv_timeout(Duration::from_secs(10))
            .expect("the request parks at its decision");
        service.set_rule(&"free", five).unwrap();
        granted += (0..10)
            .filter(|_| service.allow(&client, &"free").unwrap())
            .count();
        resume.send(()).unwrap();
        granted += usize::from(holding.join().unwrap());
        assert_eq!(
            granted, 9,
            "{algorithm}: four before the change, then one window of the new rule; the \
             request holding the retired map state is not granted on it"
        );
    }
}

/// The review's panic: readers of a sliding-log plan racing bursts of rule changes (limits 1, 64
/// and 8) must never see one version's number with another's constants (the ring would be
/// indexed past its end). Real time, real threads, half a second.
#[test]
fn readers_racing_bursts_of_rule_changes_never_panic_nor_mix_rules() {
    for algorithm in Algorithm::ALL {
        let service: Arc<RateLimiterService<u64, &str, MonotonicClock>> = Arc::new(
            RateLimiterService::new(
                algorithm,
                [("free", Rule::per_second(8).unwrap())],
                MonotonicClock::new(),
            )
            .unwrap(),
        );
        let stop = Arc::new(AtomicBool::new(false));
        let start = Arc::new(Barrier::new(7));
        let decisions = Arc::new(AtomicUsize::new(0));
        let readers: Vec<_> = (0..6u64)
            .map(|client| {
                let (service, stop, start, decisions) = (
                    Arc::clone(&service),
                    Arc::clone(&stop),
                    Arc::clone(&start),
                    Arc::clone(&decisions),
                );
                std::thread::spawn(move || {
                    start.wait();
                    while !stop.load(Ordering::Relaxed) {
                        let decision = service.acquire(&client, &"free", 1).unwrap();
                        // Every decision names a rule the plan has had, with figures inside it.
                        assert!([1, 64, 8].contains(&decision.limit()), "{decision:?}");
                        assert!(decision.remaining() <= decision.limit(), "{decision:?}");
                        for _ in 0..32 {
                            let peek = service.peek(&client, &"free").unwrap();
                            assert!(peek.remaining() <= peek.limit(), "{peek:?}");
                        }
                        decisions.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        start.wait();
        let until = Instant::now() + Duration::from_millis(500);
        while Instant::now() < until {
            for limit in [1, 64, 8] {
                service
                    .set_rule(&"free", Rule::per_second(limit).unwrap())
                    .unwrap();
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        stop.store(true, Ordering::Relaxed);
        for reader in readers {
            reader.join().expect("no reader panicked");
        }
        assert!(decisions.load(Ordering::Relaxed) > 0, "{algorithm}");
    }
}

/// A clock whose origin is decades ago (the Unix epoch, say) is a legitimate clock: the service
/// counts its horizon from its own start, so every rule keeps working.
#[test]
fn a_service_on_a_clock_counting_from_the_epoch_keeps_refilling() {
    for algorithm in Algorithm::ALL {
        let clock = FakeClock::starting_at(Duration::from_secs(1_700_000_000));
        let service: RateLimiterService<u64, &str, FakeClock> = RateLimiterService::new(
            algorithm,
            [("free", Rule::per_second(7).unwrap())],
            clock.clone(),
        )
        .unwrap();
        // A full quota a window later; two for the sliding window counter, whose next window
        // still weighs the last one's permits.
        let full_again = match algorithm {
            Algorithm::SlidingWindowCounter => Duration::from_secs(2),
            _ => Duration::from_secs(1),
        };
        for round in 0..5 {
            let granted = (0..20)
                .filter(|_| service.allow(&1, &"free").unwrap())
                .count();
            assert_eq!(granted, 7, "{algorithm}, round {round}");
            let denied = service.acquire(&1, &"free", 1).unwrap();
            assert!(denied.retry_after() <= full_again, "{denied:?}");
            clock.advance(full_again);
        }
        assert!(clock.now_nanos() > 1_700_000_000_000_000_000);
    }
}

/// What the oracle drives: the service, or a variant with a planted bug.
trait UnderTest: Send + Sync {
    fn allow(&self, client: u64, plan: &'static str) -> bool;
    fn set_rule(&self, plan: &'static str, rule: Rule);
    fn sweep(&self);
}

type OracleService = RateLimiterService<u64, &'static str, FakeClock>;

impl UnderTest for OracleService {
    fn allow(&self, client: u64, plan: &'static str) -> bool {
        RateLimiterService::allow(self, &client, &plan).unwrap()
    }
    fn set_rule(&self, plan: &'static str, rule: Rule) {
        RateLimiterService::set_rule(self, &plan, rule).unwrap();
    }
    fn sweep(&self) {
        RateLimiterService::sweep(self);
    }
}

/// The planted bug: one denial in 500 is reported as a grant.
struct OverAdmitting {
    service: OracleService,
    denials: AtomicUsize,
}

impl UnderTest for OverAdmitting {
    fn allow(&self, client: u64, plan: &'static str) -> bool {
        UnderTest::allow(&self.service, client, plan)
            || self.denials.fetch_add(1, Ordering::Relaxed) % 500 == 499
    }
    fn set_rule(&self, plan: &'static str, rule: Rule) {
        UnderTest::set_rule(&self.service, plan, rule);
    }
    fn sweep(&self) {
        UnderTest::sweep(&self.service);
    }
}

const PLANS: [&str; 2] = ["free", "pro"];
const CLIENTS: u64 = 3;
/// Longer than every window the oracle uses, so each phase starts with every client fresh.
const PHASE_STEP: Duration = Duration::from_secs(10);

/// Threads hammer three clients, each request naming one of two plans (so clients move between
/// plans all the time), while a driver changes the plans' rules and sweeps, racing them, and
/// moves the clock on by more than any window between phases (the clock is still within a phase,
/// so no refill muddies the count). Within one phase, a client may be granted under a plan at
/// most the limit in force when the phase began plus, for each change made during the phase, the
/// new rule's limit: the guarantee of `set_rule`. Returns the first breach found.
fn rule_change_oracle(
    algorithm: Algorithm,
    make: impl Fn(OracleService) -> Box<dyn UnderTest>,
) -> Result<(), String> {
    const PHASES: usize = 60;
    let limits = [2, 5, 9, 3];
    let clock = FakeClock::new();
    let service = RateLimiterService::new(
        algorithm,
        PLANS.map(|plan| (plan, Rule::per_second(limits[0]).unwrap())),
        clock.clone(),
    )
    .unwrap();
    let service: Arc<dyn UnderTest> = Arc::from(make(service));
    // Held shared by every request, exclusively by the clock's move: a phase's grants are
    // counted in that phase. (Rule changes and sweeps take no part in it: they race requests.)
    let phase_gate = Arc::new(std::sync::RwLock::new(0usize));
    let stop = Arc::new(AtomicBool::new(false));
    let attempts = Arc::new(AtomicUsize::new(0));
    // grants[phase][client][plan]
    let grants = Arc::new(
        (0..PHASES)
            .map(|_| {
                (0..CLIENTS)
                    .map(|_| [AtomicUsize::new(0), AtomicUsize::new(0)])
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>(),
    );
    let hammers: Vec<_> = (0..3u64)
        .map(|thread| {
            let (service, gate, stop, grants, attempts) = (
                Arc::clone(&service),
                Arc::clone(&phase_gate),
                Arc::clone(&stop),
                Arc::clone(&grants),
                Arc::clone(&attempts),
            );
            std::thread::spawn(move || {
                let mut step = thread;
                while !stop.load(Ordering::Relaxed) {
                    step = step
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let client = (step >> 33) % CLIENTS;
                    let plan = ((step >> 40) % 2) as usize;
                    let phase = gate.read().unwrap();
                    if *phase < PHASES && service.allow(client, PLANS[plan]) {
                        grants[*phase][client as usize][plan].fetch_add(1, Ordering::Relaxed);
                    }
                    attempts.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    // allowance[phase][plan]: the limit in force at the phase's start plus each change's.
    let mut allowance = vec![[0u64; 2]; PHASES];
    let mut in_force = [limits[0]; 2];
    let mut turn = 0usize;
    for allowed in allowance.iter_mut() {
        *allowed = in_force;
        for _ in 0..20 {
            turn += 1;
            let plan = turn % 2;
            if turn.is_multiple_of(3) {
                let limit = limits[turn % limits.len()];
                service.set_rule(PLANS[plan], Rule::per_second(limit).unwrap());
                in_force[plan] = limit;
                allowed[plan] += limit;
            } else {
                service.sweep();
            }
            // Let the requests race each step, however the threads are scheduled.
            let seen = attempts.load(Ordering::Relaxed);
            while attempts.load(Ordering::Relaxed) < seen + 10 {
                std::thread::yield_now();
            }
        }
        let mut gate = phase_gate.write().unwrap();
        clock.advance(PHASE_STEP);
        *gate += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for hammer in hammers {
        hammer.join().expect("no request panicked");
    }
    let mut granted_in_all = 0;
    for (phase, clients) in grants.iter().enumerate() {
        for (client, plans) in clients.iter().enumerate() {
            for plan in 0..2 {
                let granted = plans[plan].load(Ordering::Relaxed) as u64;
                granted_in_all += granted;
                if granted > allowance[phase][plan] {
                    return Err(format!(
                        "{algorithm}: phase {phase}, client {client}, plan {}: {granted} granted, \
                         at most {} allowed",
                        PLANS[plan], allowance[phase][plan]
                    ));
                }
            }
        }
    }
    assert!(granted_in_all > 0, "{algorithm}: the hammer made no grant");
    Ok(())
}

#[test]
fn rule_changes_plan_moves_and_sweeps_racing_requests_keep_every_rules_guarantee() {
    for algorithm in Algorithm::ALL {
        rule_change_oracle(algorithm, |service| Box::new(service)).unwrap();
    }
}

#[test]
fn the_rule_change_oracle_catches_a_planted_over_admission() {
    let breach = rule_change_oracle(Algorithm::TokenBucket, |service| {
        Box::new(OverAdmitting {
            service,
            denials: AtomicUsize::new(0),
        })
    });
    assert!(breach.is_err(), "the planted over-admission went unseen");
}

/// A sliding-log peek racing rule changes (which retire the client's ring) never reports a
/// retiring mark as an expiry: every figure stays within the one-second window.
#[test]
fn a_sliding_log_peek_racing_rule_changes_reports_only_true_waits() {
    let clock = FakeClock::starting_at(Duration::from_secs(1_000));
    let rule = Rule::per_second(1).unwrap();
    let service: Arc<RateLimiterService<u64, u8, FakeClock>> = Arc::new(
        RateLimiterService::new(Algorithm::SlidingWindowLog, [(0u8, rule)], clock).unwrap(),
    );
    assert!(service.allow(&1, &0).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let changer = {
        let (service, stop) = (Arc::clone(&service), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                service.set_rule(&0, rule).unwrap();
                let _ = service.allow(&1, &0).unwrap();
            }
        })
    };
    let until = Instant::now() + Duration::from_millis(1_500);
    let mut peeks = 0u64;
    while Instant::now() < until {
        peeks += 1;
        let peek = service.peek(&1, &0).unwrap();
        assert!(
            peek.retry_after() <= Duration::from_secs(1)
                && peek.reset_after() <= Duration::from_secs(1),
            "after {peeks} peeks: {peek:?}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    changer.join().unwrap();
}

/// A request refused for good (more than the limit) by a sliding log that a sweep has just
/// retired is answered from the fresh ring that replaces it, with its real quota.
#[test]
fn a_sliding_log_refusal_from_a_ring_being_swept_reports_the_fresh_quota() {
    for n in [6u64, 9] {
        let clock = FakeClock::new();
        let service: Arc<ParkingService> = Arc::new(
            RateLimiterService::new(
                Algorithm::SlidingWindowLog,
                [("free", Rule::per_second(5).unwrap())],
                clock.clone(),
            )
            .unwrap(),
        );
        let client = ParkingKey(7);
        assert!(service.allow(&client, &"free").unwrap());
        clock.advance(Duration::from_secs(2));
        let expected = service.acquire(&client, &"free", n).unwrap();
        let (ready_tx, ready_rx) = channel();
        let sweeper = {
            let service = Arc::clone(&service);
            std::thread::spawn(move || {
                // The sweep's one hash: its removal, after it has retired the ring.
                let (parked, resume) = park_at_hash(1);
                ready_tx.send((parked, resume)).unwrap();
                service.sweep()
            })
        };
        let (parked, resume) = ready_rx.recv().unwrap();
        parked
            .recv_timeout(Duration::from_secs(10))
            .expect("the sweep parks at its removal");
        let observed = service.acquire(&client, &"free", n).unwrap();
        resume.send(()).unwrap();
        // The request removed the retired ring itself, and made no state in its place (more
        // than the limit takes nothing): the sweep finds nothing left to remove.
        assert_eq!(sweeper.join().unwrap(), 0);
        assert_eq!(service.len(), 0);
        assert_eq!(
            observed.remaining(),
            expected.remaining(),
            "n = {n}: {observed:?}"
        );
        assert_eq!(observed.rejection(), expected.rejection(), "n = {n}");
    }
}

/// A clock that changes the plan's rule from inside a decision, on the deciding thread: the
/// version the decision read is retired under its feet, by its own thread. Every figure must
/// still come from one whole version (a read of a freed version would show the allocator's
/// junk, which this clock writes over freed memory).
#[test]
fn a_clock_that_changes_the_rule_during_a_decision_reads_only_whole_versions() {
    use std::sync::Mutex;

    type Service = RateLimiterService<u64, &'static str, ReentrantClock>;
    static SERVICE: Mutex<Option<&'static Service>> = Mutex::new(None);
    static ARMED: AtomicBool = AtomicBool::new(false);

    #[derive(Debug)]
    struct ReentrantClock;

    impl Clock for ReentrantClock {
        fn now_nanos(&self) -> u64 {
            if ARMED.swap(false, Ordering::SeqCst) {
                let service = SERVICE.lock().unwrap().expect("the service is set");
                for change in 0..300 {
                    let limit = if change % 2 == 0 { 5 } else { 7 };
                    service
                        .set_rule(&"p", Rule::per_second(limit).unwrap())
                        .unwrap();
                }
                // Reuse freed memory, so that a read of a freed version shows.
                let junk: Vec<Box<[u64; 32]>> =
                    (0..2000).map(|_| Box::new([u64::MAX; 32])).collect();
                drop(junk);
            }
            1_000_000_000
        }
    }

    for algorithm in Algorithm::ALL {
        let service: &'static Service = Box::leak(Box::new(
            RateLimiterService::new(
                algorithm,
                [("p", Rule::per_second(3).unwrap())],
                ReentrantClock,
            )
            .unwrap(),
        ));
        *SERVICE.lock().unwrap() = Some(service);
        let whole = |decision: &tollgate::Decision, target: u64| {
            [target, 5, 7].contains(&decision.limit())
                && decision.window() == Duration::from_secs(1)
                && decision.remaining() <= decision.limit()
        };
        for round in 0..10 {
            let target = if round % 2 == 0 { 3 } else { 9 };
            service
                .set_rule(&"p", Rule::per_second(target).unwrap())
                .unwrap();
            // The client's entry, made under `target`.
            let _made = service.acquire(&1, &"p", 1).unwrap();
            ARMED.store(true, Ordering::SeqCst);
            let decision = service.acquire(&1, &"p", 1).unwrap();
            assert!(!ARMED.load(Ordering::SeqCst), "the clock ran its changes");
            assert!(whole(&decision, target), "{algorithm}: {decision:?}");
            ARMED.store(true, Ordering::SeqCst);
            let peek = service.peek(&1, &"p").unwrap();
            assert!(whole(&peek, target), "{algorithm}: {peek:?}");
            ARMED.store(true, Ordering::SeqCst);
            service.allow(&2, &"p").unwrap();
            ARMED.store(true, Ordering::SeqCst);
            service.ratelimit_headers(&1, &"p", "p").unwrap();
            ARMED.store(true, Ordering::SeqCst);
            service.sweep();
            ARMED.store(false, Ordering::SeqCst);
        }
    }
}
