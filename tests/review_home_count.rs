//! The home lock's count read before the look at home (8b5ee78): a decision reads its home
//! bucket's insert-lock word before its look there; where that look finds no tag of the key's,
//! the full lookup takes that word (not a fresh one), looks at the other bucket alone on its
//! first pass, and its insert skips its passes over the buckets where it takes the lock at the
//! same count. Public API only.
//!
//! A key's first request is parked at its first clock reading (a `ParkingClock`): for a key
//! with no tag in either bucket, that is the reading taken after both looks, right before the
//! insert takes the lock. While it is parked, the same key is inserted (at home, in the other
//! bucket), other keys of the same home fill both buckets, a rule changes, a sweep runs, or a
//! second first request of the key is parked beside it; then they are resumed in turn. The
//! keys are placed by an identity hasher in a table of two buckets (16 slots). Each test
//! asserts exact grants per key, `len()`, `evictions()` and the plan's decision counts.
//!
//! Races (bounded rounds started on a spun flag): first requests of one fresh key from three
//! threads in a table full of active clients (every round evicts exactly once, and grants
//! exactly what a single-threaded twin service grants), first requests of one fresh key
//! racing other keys of its home bucket, with sweeps between rounds, and single first requests
//! of one fresh key from more threads than cores.
//!
//! Checked against faults planted by hand in the store: an insert that skips its passes
//! whatever the count fails the three deterministic tests where the key's state is put while
//! a first request is parked, and the neighbours' race; a full lookup that leaves the home
//! bucket out of every pass (not its first alone) fails those and the rule change's test (the
//! request gives up: `UnstableKey`). The count read after the look at home, not before (as
//! `StoreFault::HoldingsReadAfterTheLook`), has no window a hook reaches: the race of single
//! first requests catches it in most runs on a loaded two-core machine (a few rounds in
//! 60,000), not every run.

use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use tollgate::{Algorithm, Clock, FakeClock, RateLimiterService, Rule, ServiceBuilder};

#[path = "support/grants.rs"]
mod grants;
#[path = "support/park.rs"]
mod park;
#[path = "support/race.rs"]
mod race;
#[path = "support/stress.rs"]
mod stress;

use grants::grants_until_denied;
use park::{PARK_AT_READING, Parked, ParkingClock, park_request};
use race::{off_rounds, race_rounds_read};
use stress::{Identity, PLAN, STORE_METHODS, key_at, serial};

const LIMIT: u64 = 3;
const WINDOW: Duration = Duration::from_secs(1);
/// Two buckets of 8.
const CAPACITY: usize = 16;
const BUCKETS: usize = 2;

fn rule(limit: u64) -> Rule {
    Rule::new(limit, WINDOW).unwrap()
}

/// The key of fingerprint `fingerprint` (its low 40 bits, distinct per key) whose home is
/// bucket 0 and whose other bucket is bucket 1 (under [`Identity`], the key is its hash).
fn key_home0_other1(fingerprint: u64) -> u64 {
    key_at(fingerprint, 0, 1, BUCKETS)
}

type Service = RateLimiterService<u64, &'static str, ParkingClock, Identity>;

fn service(algorithm: Algorithm, clock: &FakeClock, limit: u64) -> Arc<Service> {
    Arc::new(
        ServiceBuilder::new(algorithm, ParkingClock(clock.clone()))
            .plan(PLAN, rule(limit))
            .capacity(CAPACITY)
            .hasher(Identity)
            .count_decisions(true)
            .build::<u64>()
            .unwrap(),
    )
}

/// A first request of `key` on a thread of its own, parked at its first clock reading.
fn park_first_request(service: &Arc<Service>, key: u64) -> Parked<bool> {
    let service = Arc::clone(service);
    park_request(&PARK_AT_READING, 1, "at its first reading", move || {
        service.allow(&key, &PLAN).unwrap()
    })
}

/// Asks for `key` until denied (at most `up_to + 1` asks); how many permits it got.
fn spend<C: Clock, S: BuildHasher>(
    service: &RateLimiterService<u64, &'static str, C, S>,
    key: u64,
    up_to: u64,
) -> u64 {
    grants_until_denied(up_to, || service.allow(&key, &PLAN).unwrap())
}

/// (allowed, denied) under the plan.
fn counts<C: Clock, S: BuildHasher>(
    service: &RateLimiterService<u64, &'static str, C, S>,
) -> (u64, u64) {
    let stats = service.stats(&PLAN).expect("counted");
    (stats.allowed, stats.denied)
}

/// `n` keys of home 0 and other 1, fingerprints `0x1000 + base + i`, spent at the clock's
/// current reading (all active): they fill bucket 0, then bucket 1.
fn spent_fillers(service: &Service, base: u64, n: u64) -> Vec<u64> {
    (0..n)
        .map(|i| {
            let key = key_home0_other1(0x1000 + base + i);
            assert_eq!(spend(service, key, LIMIT), LIMIT, "filler {i}");
            key
        })
        .collect()
}

/// A service whose home bucket 0 is full: one filler idle (its permit back), then seven
/// active ones (spent at the clock's reading); the active fillers.
fn home_full_one_idle(algorithm: Algorithm) -> (Arc<Service>, Vec<u64>) {
    let clock = FakeClock::starting_at(Duration::from_secs(10));
    let service = service(algorithm, &clock, LIMIT);
    let idle = key_home0_other1(0x2000);
    assert!(service.allow(&idle, &PLAN).unwrap());
    clock.advance(Duration::from_secs(10));
    let active = spent_fillers(&service, 0, 7);
    (service, active)
}

// ---------------------------------------------------------------------------------------------
// Deterministic: parked first requests.
// ---------------------------------------------------------------------------------------------

/// Two first requests of K, each parked after its look (no state of K anywhere, both home
/// counts read at the same count), resumed one after the other. The first inserts K; the
/// second takes the lock at a later count and must make its passes, find K's state and decide
/// on it: K gets exactly one limit between the two and what follows, one state.
///
/// Three layouts of K's buckets: both free (K goes home), home full of active clients (K goes
/// to its other bucket's free slots), both full (the first insert evicts one client, the second
/// must not evict another).
#[test]
fn two_first_requests_parked_after_their_look_share_one_state() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        for fillers in [0, 8, 16] {
            let clock = FakeClock::starting_at(Duration::from_secs(10));
            let service = service(algorithm, &clock, LIMIT);
            spent_fillers(&service, 0, fillers);
            let key = key_home0_other1(0xAB_CDEF);
            let first = park_first_request(&service, key);
            let second = park_first_request(&service, key);
            let (a, b) = (first.resume(), second.resume());
            let after = spend(&service, key, LIMIT);
            let expected_evictions = u64::from(fillers == 16);
            assert_eq!(
                (
                    a,
                    b,
                    u64::from(a) + u64::from(b) + after,
                    service.len(),
                    service.evictions()
                ),
                (
                    true,
                    true,
                    LIMIT,
                    (fillers as usize + 1).min(CAPACITY),
                    expected_evictions
                ),
                "{algorithm}, {fillers} fillers: first, second, K's grants, len, evictions"
            );
            assert_eq!(
                counts(&service),
                (fillers * LIMIT + LIMIT, fillers + 1),
                "{algorithm}, {fillers} fillers: allowed, denied (one denial per filler)"
            );
        }
    }
}

/// K's first request parked after its look; K's first request on this thread inserts K (at
/// home, or in the other bucket when the home is full) and spends the limit. Resumed, the
/// parked insert must find that state: denied, one state, no eviction.
#[test]
fn a_state_put_while_a_first_request_is_parked_is_found() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        for fillers in [0, 8] {
            let clock = FakeClock::starting_at(Duration::from_secs(10));
            let service = service(algorithm, &clock, LIMIT);
            spent_fillers(&service, 0, fillers);
            let key = key_home0_other1(0x77_7777);
            let parked = park_first_request(&service, key);
            assert_eq!(
                spend(&service, key, LIMIT),
                LIMIT,
                "{algorithm}: in the gap"
            );
            let late = parked.resume();
            assert_eq!(
                (
                    late,
                    spend(&service, key, LIMIT),
                    service.len(),
                    service.evictions()
                ),
                (false, 0, fillers as usize + 1, 0),
                "{algorithm}, {fillers} fillers: parked, after, len, evictions"
            );
            assert_eq!(
                counts(&service),
                (fillers * LIMIT + LIMIT, fillers + 3),
                "{algorithm}, {fillers} fillers: allowed, denied (one denial per filler)"
            );
        }
    }
}

/// Home bucket full (one filler idle, seven active), K parked after its look; K's state is
/// put in the other bucket by this thread and spent, then a sweep frees the idle filler's slot
/// at home. Resumed, the parked insert (its count moved) finds a free slot at home but must
/// find K's state in the other bucket first: denied, one state of K.
#[test]
fn a_state_put_in_the_other_bucket_then_a_home_slot_swept_is_found() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        let (service, active) = home_full_one_idle(algorithm);
        let key = key_home0_other1(0x55_5555);
        let parked = park_first_request(&service, key);
        assert_eq!(
            spend(&service, key, LIMIT),
            LIMIT,
            "{algorithm}: in the gap"
        );
        assert_eq!((service.len(), service.evictions()), (9, 0), "{algorithm}");
        assert_eq!(service.sweep(), 1, "{algorithm}: the idle filler swept");
        let late = parked.resume();
        assert_eq!(
            (
                late,
                spend(&service, key, LIMIT),
                service.len(),
                service.evictions()
            ),
            (false, 0, 8, 0),
            "{algorithm}: parked, after, len, evictions"
        );
        for filler in active {
            assert_eq!(spend(&service, filler, LIMIT), 0, "{algorithm}: filler");
        }
    }
}

/// The same without a parked request: home full (one filler idle, seven active), K's first
/// request puts its state in the other bucket (its home lock's word says from then on that an
/// insert went outside home) and K spends its limit; a sweep frees the idle filler's slot at
/// home. K's next request finds no tag of its own at home and a free slot there: it must probe
/// the other bucket all the same, not put a second state at home. Denied; a key of the same
/// home that never came is a fresh client (at home), and K's state stays the one.
#[test]
fn a_state_put_in_the_other_bucket_is_found_once_a_home_slot_is_free() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        let (service, active) = home_full_one_idle(algorithm);
        let key = key_home0_other1(0x55_5555);
        assert_eq!(spend(&service, key, LIMIT), LIMIT, "{algorithm}: K");
        assert_eq!(service.sweep(), 1, "{algorithm}: the idle filler swept");
        assert_eq!(
            (spend(&service, key, LIMIT), service.len()),
            (0, 8),
            "{algorithm}: K after the sweep, len"
        );
        let newcomer = key_home0_other1(0x66_6666);
        assert_eq!(
            (spend(&service, newcomer, LIMIT), service.len()),
            (LIMIT, 9),
            "{algorithm}: a new key of K's home, len"
        );
        assert_eq!(
            (spend(&service, key, LIMIT), service.evictions()),
            (0, 0),
            "{algorithm}: K again, evictions"
        );
        for filler in active {
            assert_eq!(spend(&service, filler, LIMIT), 0, "{algorithm}: filler");
        }
    }
}

/// K parked after its look (both buckets empty); this thread fills both of K's buckets with
/// sixteen active clients of K's home (each insert moves K's home count). Resumed, the parked
/// insert finds no free slot and evicts exactly one client: K is granted, exactly one eviction,
/// exactly one filler reads fresh afterwards, and K's limit is spent once.
#[test]
fn other_keys_filling_both_buckets_while_parked_cost_exactly_one_eviction() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(Duration::from_secs(10));
        let service = service(algorithm, &clock, LIMIT);
        let key = key_home0_other1(0x33_3333);
        let parked = park_first_request(&service, key);
        let fillers = spent_fillers(&service, 0, 16);
        assert_eq!((service.len(), service.evictions()), (16, 0), "{algorithm}");
        let late = parked.resume();
        assert_eq!(
            (late, service.len(), service.evictions()),
            (true, 16, 1),
            "{algorithm}: parked, len, evictions"
        );
        assert_eq!(
            spend(&service, key, LIMIT),
            LIMIT - 1,
            "{algorithm}: K after its first grant"
        );
        let fresh: Vec<u64> = fillers
            .iter()
            .copied()
            .filter(|filler| service.peek(filler, &PLAN).unwrap().remaining() != 0)
            .collect();
        assert_eq!(fresh.len(), 1, "{algorithm}: fillers read fresh: {fresh:?}");
        assert_eq!(
            counts(&service),
            (16 * LIMIT + LIMIT, 16 + 1),
            "{algorithm}: allowed, denied (one denial per filler)"
        );
    }
}

/// K parked after its look under limits of 3; this thread fills both of K's buckets with
/// sixteen active clients, then changes the rule to 2. Resumed, the parked insert (its limits
/// replaced) must look again under the new rule and reuse a state of the earlier rule, not
/// evict: K gets exactly the new limit, no eviction, and each filler starts afresh once.
/// With K's own request in the gap too (under the new rule), the parked insert must find it.
#[test]
fn a_rule_change_while_parked_reuses_a_stale_slot_and_starts_the_client_once() {
    let _serial = serial();
    const NEW: u64 = 2;
    for algorithm in STORE_METHODS {
        for key_in_the_gap in [false, true] {
            let clock = FakeClock::starting_at(Duration::from_secs(10));
            let service = service(algorithm, &clock, LIMIT);
            let key = key_home0_other1(0x44_4444);
            let parked = park_first_request(&service, key);
            let fillers = spent_fillers(&service, 0, 16);
            service.set_rule(&PLAN, rule(NEW)).unwrap();
            let mut granted = 0;
            if key_in_the_gap {
                granted += spend(&service, key, LIMIT + NEW);
            }
            granted += u64::from(parked.resume());
            granted += spend(&service, key, LIMIT + NEW);
            assert_eq!(
                (granted, service.len(), service.evictions()),
                (NEW, 16, 0),
                "{algorithm}, K in the gap: {key_in_the_gap}: K's grants, len, evictions"
            );
            // Each filler of the earlier rule (or displaced by K): afresh under the new one, once.
            let again: Vec<u64> = fillers
                .iter()
                .map(|&filler| spend(&service, filler, LIMIT + NEW))
                .collect();
            assert_eq!(
                again.iter().filter(|&&g| g == NEW).count(),
                16,
                "{algorithm}, K in the gap: {key_in_the_gap}: fillers' grants {again:?}"
            );
            // Seventeen keys in sixteen slots, all active now: the last filler to come back
            // evicts one client, and only it.
            assert_eq!(
                service.evictions(),
                1,
                "{algorithm}, K in the gap: {key_in_the_gap}"
            );
        }
    }
}

/// K parked after its look; K's state put and spent by this thread, the clock moves on two
/// windows (K idle) and a sweep frees K's slot (its reading published for fresh states). The
/// parked request (its reading older than the sweep's) must be decided on one fresh state at a
/// reading of its own: granted once, then the rest of one limit; one state.
#[test]
fn a_state_put_and_swept_while_parked_leaves_one_fresh_state() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(Duration::from_secs(10));
        let service = service(algorithm, &clock, LIMIT);
        let key = key_home0_other1(0x66_6666);
        let parked = park_first_request(&service, key);
        assert_eq!(
            spend(&service, key, LIMIT),
            LIMIT,
            "{algorithm}: in the gap"
        );
        clock.advance(3 * WINDOW);
        assert_eq!(service.sweep(), 1, "{algorithm}: K swept");
        assert_eq!(service.len(), 0);
        let late = parked.resume();
        assert_eq!(
            (
                late,
                spend(&service, key, LIMIT),
                service.len(),
                service.evictions()
            ),
            (true, LIMIT - 1, 1, 0),
            "{algorithm}: parked, after, len, evictions"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Races.
// ---------------------------------------------------------------------------------------------

type PlainService = RateLimiterService<u64, &'static str, FakeClock, Identity>;

fn plain_service(algorithm: Algorithm, clock: &FakeClock, limit: u64) -> Arc<PlainService> {
    Arc::new(
        ServiceBuilder::new(algorithm, clock.clone())
            .plan(PLAN, rule(limit))
            .capacity(CAPACITY)
            .hasher(Identity)
            .count_decisions(true)
            .build::<u64>()
            .unwrap(),
    )
}

/// Between rounds (and before the first): the clock moves on three windows (the round's clients
/// are then idle) and a sweep frees their slots.
fn sweep_after_windows(clock: &FakeClock) -> impl Fn(&PlainService) + Send + Sync + 'static {
    let clock = clock.clone();
    move |service| {
        clock.advance(3 * WINDOW);
        service.sweep();
    }
}

/// Both of a key's buckets full of active clients, the clock still: each round, three threads
/// ask for one fresh key (home 0, other 1) until denied. Every round must evict exactly once
/// (the racing inserts of the key are serialized by its home lock; the later ones must find the
/// first one's state), grant exactly what a twin service asked by one thread grants, and leave
/// the table full. The plan's counts add up to the answers.
#[test]
fn first_requests_of_one_key_racing_in_a_full_table_evict_once_and_grant_one_limit() {
    let _serial = serial();
    const THREADS: usize = 3;
    const ROUNDS: usize = 3_000;
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(Duration::from_secs(10));
        let service = plain_service(algorithm, &clock, LIMIT);
        let twin = plain_service(algorithm, &clock, LIMIT);
        let key_of = |round: usize| key_home0_other1(0x10_0000 + round as u64);
        for i in 0..16 {
            let filler = key_home0_other1(0x1000 + i);
            assert_eq!(spend(&*service, filler, LIMIT), LIMIT);
            assert_eq!(spend(&*twin, filler, LIMIT), LIMIT);
        }
        // The twin's grants per round, asked by one thread.
        let reference: Vec<u64> = (0..ROUNDS)
            .map(|round| spend(&*twin, key_of(round), LIMIT))
            .collect();
        assert_eq!(twin.evictions(), ROUNDS as u64, "{algorithm}: the twin");
        let keys: Vec<u64> = (0..ROUNDS).map(key_of).collect();
        let (answers, states) = race_rounds_read(
            &service,
            THREADS,
            ROUNDS,
            |service| (service.len(), service.evictions()),
            |_| {},
            move |service, _, round| spend(service, keys[round], LIMIT),
        );
        let grants: Vec<u64> = answers.iter().map(|a| a.iter().sum()).collect();
        assert_eq!(
            off_rounds(&grants, |round, &g| g == reference[round]),
            (0, vec![]),
            "{algorithm}: rounds granted other than the twin (round, grants); twin {:?}",
            &reference[..5]
        );
        assert_eq!(
            off_rounds(&states, |round, &(len, evictions)| len == CAPACITY
                && evictions == round as u64 + 1),
            (0, vec![]),
            "{algorithm}: rounds ending with other than a full table and one eviction more \
             (round, (len, evictions))"
        );
        // Every grant counted; one denial per filler, and one per thread and round.
        let granted: u64 = grants.iter().sum();
        assert_eq!(
            counts(&*service),
            (16 * LIMIT + granted, (THREADS * ROUNDS) as u64 + 16),
            "{algorithm}: allowed, denied"
        );
    }
}

/// Each round: two threads ask for one fresh key K until denied while a third asks for three
/// other fresh keys of K's home bucket (each until denied), so that K's home count moves under
/// K's first requests. Between rounds the clock moves on three windows and a sweep frees the
/// round's states (all idle). Every key of every round: exactly its limit; four states at the
/// end of each round; no eviction; the plan's counts add up.
#[test]
fn first_requests_of_one_key_racing_inserts_of_its_home_neighbours_get_one_limit() {
    let _serial = serial();
    const ROUNDS: usize = 20_000;
    const NEIGHBOURS: u64 = 3;
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(Duration::from_secs(10));
        let service = plain_service(algorithm, &clock, LIMIT);
        let key = |round: usize, index: u64| key_home0_other1(1 + round as u64 * 4 + index);
        let keys: Arc<Vec<[u64; 4]>> = Arc::new(
            (0..ROUNDS)
                .map(|round| std::array::from_fn(|index| key(round, index as u64)))
                .collect(),
        );
        let (answers, lens) = race_rounds_read(
            &service,
            3,
            ROUNDS,
            PlainService::len,
            sweep_after_windows(&clock),
            move |service, thread, round| {
                let keys = &keys[round];
                if thread < 2 {
                    spend(service, keys[0], LIMIT)
                } else {
                    // Each neighbour's grants, 16 bits apiece.
                    (1..=NEIGHBOURS).fold(0, |packed, index| {
                        packed | spend(service, keys[index as usize], LIMIT) << (16 * (index - 1))
                    })
                }
            },
        );
        let per_key: Vec<Vec<u64>> = answers
            .iter()
            .map(|a| {
                let mut grants = vec![a[0] + a[1]];
                grants.extend((0..NEIGHBOURS).map(|i| (a[2] >> (16 * i)) & 0xffff));
                grants
            })
            .collect();
        assert_eq!(
            off_rounds(&per_key, |_, grants| grants.iter().all(|&g| g == LIMIT)),
            (0, vec![]),
            "{algorithm}: rounds where a key was not granted exactly its limit (round, grants: \
             K, then its neighbours)"
        );
        assert_eq!(
            off_rounds(&lens, |_, &len| len == 4),
            (0, vec![]),
            "{algorithm}: rounds ending with other than one state per key (round, len)"
        );
        assert_eq!(service.evictions(), 0, "{algorithm}: evictions");
        let allowed = ROUNDS as u64 * 4 * LIMIT;
        // K's two askers are each denied once; each neighbour once.
        assert_eq!(
            counts(&*service),
            (allowed, ROUNDS as u64 * (2 + NEIGHBOURS)),
            "{algorithm}: allowed, denied"
        );
    }
}

/// Single first requests of one fresh key (a limit of 1) from four threads at once (more
/// threads than the machine's two cores, so that a thread is preempted at any point of its
/// decision, the few instructions between its look at home and its reading of the home count
/// among them), in a table of two buckets; between rounds the clock moves on three windows and
/// a sweep frees the round's state. Every round: exactly one grant, and one state at its end.
#[test]
fn single_first_requests_of_one_key_from_four_threads_grant_once() {
    let _serial = serial();
    const THREADS: usize = 4;
    const ROUNDS: usize = 20_000;
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(Duration::from_secs(10));
        let service = plain_service(algorithm, &clock, 1);
        let keys: Vec<u64> = (0..ROUNDS)
            .map(|round| key_home0_other1(1 + round as u64))
            .collect();
        let (answers, lens) = race_rounds_read(
            &service,
            THREADS,
            ROUNDS,
            PlainService::len,
            sweep_after_windows(&clock),
            move |service, _, round| u64::from(service.allow(&keys[round], &PLAN).unwrap()),
        );
        assert_eq!(
            off_rounds(&answers, |_, a| a.iter().sum::<u64>() == 1),
            (0, vec![]),
            "{algorithm}: rounds not granted exactly once (round, answers by thread)"
        );
        assert_eq!(
            off_rounds(&lens, |_, &len| len == 1),
            (0, vec![]),
            "{algorithm}: rounds ending with other than one state (round, len)"
        );
        assert_eq!(
            (service.evictions(), counts(&*service)),
            (0, (ROUNDS as u64, ((THREADS - 1) * ROUNDS) as u64)),
            "{algorithm}: evictions, (allowed, denied)"
        );
    }
}
