//! The client store's slot tags, through the public API: each held client is known by a
//! 40-bit fingerprint of its key's hash (the low bits, 0 taken as 1), kept in its slot's tag
//! beside the version of the rules its state was made under, a generation that counts the
//! slot's holdings (wrapping at 64), a bit for a slot being filled and a bit for a state being
//! retired. With an identity hasher (a key is its hash) the tests choose keys whose fingerprints
//! sit at the edges of that field (1, the top bit alone, all ones, pairs one bit apart in the
//! lowest or the highest bit, a hash whose low 40 bits are 0) and check, by exact counts of
//! granted permits under a fake clock:
//!
//! - that each fingerprint is a client of its own, that keys of one fingerprint in one bucket
//!   share one state whatever their other bits, and that the zero fingerprint is the one;
//! - that sweeps, rule changes, idle reuse and evictions keep every other client's state, and
//!   still do after each slot has changed hands more than 64 times (its generation wrapped);
//! - that a decision held while its slot changes hands (1, 2, 63, 64, 65 or 128 times) never
//!   charges the key that took the slot, even one whose fingerprint is one bit away from its
//!   own, and still charges its own key exactly where that key came back to the slot;
//! - that sweeps racing each key's first grant change no count (each key gets exactly the
//!   limit, neither one less for a dropped grant nor more for a second state), and that sweeps
//!   and rule changes racing decisions never give a key more than the limits in force allow;
//! - and that [`MonotonicClock`] reads quanta's nanoseconds since the clock's origin, and
//!   drives the store as a fake clock does.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use tollgate::{
    Algorithm, Clock, FakeClock, MonotonicClock, RateLimiterService, Rule, ServiceBuilder,
};

#[path = "support/park.rs"]
mod park;
#[path = "support/race.rs"]
mod race;
#[path = "support/stress.rs"]
mod stress;

use park::{PARK_AT_READING, ParkingClock, park_request};
use race::race_rounds;
use stress::{Identity, PLAN, PlacedService, STORE_METHODS, key_at, placed_service, serial};

/// The permits of the plan's rule in most tests.
const LIMIT: u64 = 4;
/// The window of that rule: long, so that a fake clock that is not moved refills nothing.
const WINDOW: Duration = Duration::from_secs(3600);
/// The top bit of a fingerprint.
const TOP: u64 = 1 << 39;
/// A fingerprint of all ones.
const ALL: u64 = (1 << 40) - 1;
/// A fingerprint with neither its lowest nor its top bit set.
const F: u64 = 0x5A_C3E1_9B74;

/// Two groups of eight fingerprints at the edges of the tag's field: each group's keys fill one
/// bucket, and within a group several differ in the lowest bit or the top bit alone.
const EDGES: [[u64; 8]; 2] = [
    [TOP, 1, TOP | 1, F, F ^ 1, F ^ TOP, ALL, ALL ^ 1],
    [
        ALL ^ TOP,
        2,
        3,
        F ^ ALL,
        F ^ ALL ^ 1,
        0x55_5555_5555,
        0xAA_AAAA_AAAA,
        TOP | 2,
    ],
];

/// Seven fingerprints of clients that hold a bucket's other slots while one slot changes hands:
/// distinct from each other, from `F` and from those of the keys that pass through that slot
/// (some of which are one bit away from `F` or from one of these).
const ANCHORS: [u64; 7] = [
    TOP,
    2,
    ALL,
    0x55_5555_5555,
    0x12_3456_789A,
    F ^ ALL,
    0x3C_0000_0000,
];

/// How long a scenario may take before it fails as hung (a thread waiting for a tag that never
/// settles): far more than any takes.
const PATIENCE: Duration = Duration::from_secs(20);

/// The key of fingerprint `fingerprint` (the low 40 bits of the hash) and high bits `high`
/// (under [`Identity`], the key is its hash; in a store of one bucket the high bits place
/// nothing).
fn key(fingerprint: u64, high: u64) -> u64 {
    (high << 40) | fingerprint
}

fn rule(limit: u64) -> Rule {
    Rule::new(limit, WINDOW).unwrap()
}

/// A service whose plan's store is one bucket of 8 slots, every key in it.
fn one_bucket(algorithm: Algorithm, limit: u64) -> (FakeClock, Arc<PlacedService>) {
    let clock = FakeClock::starting_at(Duration::from_secs(10));
    let service = placed_service(algorithm, 8, rule(limit), &clock);
    (clock, service)
}

/// Permits granted to `key` one at a time until one is refused (at most a few more than any
/// limit here).
fn spend<C: Clock>(service: &RateLimiterService<u64, &'static str, C, Identity>, key: u64) -> u64 {
    let mut granted = 0;
    while granted < 64 && service.allow(&key, &PLAN).unwrap() {
        granted += 1;
    }
    granted
}

/// `run` on a thread of its own, failing where it does not end within [`PATIENCE`].
fn within(what: String, run: impl FnOnce() + Send + 'static) {
    within_for(PATIENCE, what, run);
}

/// `run` on a thread of its own, failing where it does not end within `patience`.
fn within_for(patience: Duration, what: String, run: impl FnOnce() + Send + 'static) {
    let handle = thread::spawn(run);
    let started = Instant::now();
    while !handle.is_finished() {
        assert!(started.elapsed() < patience, "{what}: hung");
        thread::sleep(Duration::from_millis(2));
    }
    if let Err(panic) = handle.join() {
        std::panic::resume_unwind(panic);
    }
}

/// Checks that every key of `keys` has spent its state: refused, and none left by a peek.
fn all_spent(service: &PlacedService, keys: &[u64], what: &str) {
    for &key in keys {
        let peeked = service.peek(&key, &PLAN).unwrap();
        assert_eq!(
            peeked.remaining(),
            0,
            "{what}: {key:#x} keeps its spent state"
        );
        assert!(!service.allow(&key, &PLAN).unwrap(), "{what}: {key:#x}");
    }
}

/// Each key of a bucket full of edge fingerprints is a client of its own: it gets exactly the
/// limit, its state is found again (by decisions and peeks), a sweep keeps the spent states and
/// frees all eight once they are idle, and every key then gets exactly one fresh limit again.
#[test]
fn each_edge_fingerprint_is_a_client_of_its_own() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        for (group, fingerprints) in EDGES.into_iter().enumerate() {
            within(format!("{algorithm}, group {group}"), move || {
                let (clock, service) = one_bucket(algorithm, LIMIT);
                let keys: Vec<u64> = fingerprints
                    .iter()
                    .enumerate()
                    .map(|(at, &fingerprint)| key(fingerprint, at as u64 + 1))
                    .collect();
                let what = format!("{algorithm}, group {group}");
                for &key in &keys {
                    assert_eq!(spend(&service, key), LIMIT, "{what}: {key:#x}");
                }
                all_spent(&service, &keys, &what);
                assert_eq!((service.len(), service.evictions()), (8, 0), "{what}");
                assert_eq!(service.sweep(), 0, "{what}: no spent state is idle");
                all_spent(&service, &keys, &what);
                clock.advance(3 * WINDOW);
                assert_eq!(service.sweep(), 8, "{what}: every idle state swept");
                assert_eq!(service.len(), 0, "{what}");
                for &key in keys.iter().rev() {
                    assert_eq!(spend(&service, key), LIMIT, "{what}: {key:#x} afresh");
                }
                all_spent(&service, &keys, &what);
                assert_eq!((service.len(), service.evictions()), (8, 0), "{what}");
            });
        }
    }
}

/// A hash whose low 40 bits are 0 has the fingerprint 1: in one bucket, such keys and a key of
/// fingerprint 1 are one client (one limit between them), distinct from fingerprint 2; in
/// disjoint buckets they are two.
#[test]
fn the_zero_fingerprint_is_the_fingerprint_one() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        within(format!("{algorithm}"), move || {
            let (_clock, service) = one_bucket(algorithm, LIMIT);
            let zero = key(0, 5);
            assert_eq!(spend(&service, zero), LIMIT, "{algorithm}");
            assert_eq!(spend(&service, key(1, 6)), 0, "{algorithm}: fingerprint 1");
            assert_eq!(spend(&service, 0), 0, "{algorithm}: the key 0");
            assert_eq!(spend(&service, key(0, 0xAB_CDEF)), 0, "{algorithm}");
            assert_eq!(service.len(), 1, "{algorithm}: one client");
            assert_eq!(
                spend(&service, key(2, 5)),
                LIMIT,
                "{algorithm}: fingerprint 2"
            );
            assert_eq!(
                spend(&service, key(3, 5)),
                LIMIT,
                "{algorithm}: fingerprint 3"
            );
            assert_eq!((service.len(), service.evictions()), (3, 0), "{algorithm}");

            // Two buckets: a zero-fingerprint key whose buckets are both 0, a key of
            // fingerprint 1 whose buckets are both 1.
            let clock = FakeClock::starting_at(Duration::from_secs(10));
            let service = placed_service(algorithm, 16, rule(LIMIT), &clock);
            let zero = (1..)
                .map(|high| key(0, high))
                .find(|&k| stress::bucket_of(k, 2) == 0 && stress::other_of(k, 2) == 0)
                .unwrap();
            let one = key_at(1, 1, 1, 2);
            assert_eq!(spend(&service, zero), LIMIT, "{algorithm}: zero, bucket 0");
            assert_eq!(spend(&service, one), LIMIT, "{algorithm}: one, bucket 1");
            assert_eq!(spend(&service, zero), 0, "{algorithm}");
            assert_eq!((service.len(), service.evictions()), (2, 0), "{algorithm}");
        });
    }
}

/// Keys of one fingerprint in one bucket share one state whatever their other bits (the 41st
/// bit of the hash and above are not the fingerprint's): one limit between them.
#[test]
fn keys_of_one_fingerprint_share_one_state_whatever_their_high_bits() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        within(format!("{algorithm}"), move || {
            let (_clock, service) = one_bucket(algorithm, LIMIT);
            for (at, fingerprint) in [F, TOP, ALL, 1, F ^ 1, TOP | 1].into_iter().enumerate() {
                let what = format!("{algorithm}: {fingerprint:#x}");
                assert_eq!(spend(&service, key(fingerprint, 2)), LIMIT, "{what}");
                for high in [3, 0x80_0000, 0xFF_FFFF, 1] {
                    assert_eq!(
                        spend(&service, key(fingerprint, high)),
                        0,
                        "{what}: {high:#x}"
                    );
                }
                assert_eq!(service.len(), at + 1, "{what}");
            }
            assert_eq!(service.evictions(), 0, "{algorithm}");
        });
    }
}

/// Seventy rule changes on buckets full of edge fingerprints, the stale states freed by a sweep
/// or by each key's next look, in alternate orders: every slot takes more than 64 states (its
/// generation wraps), and after every change each key gets exactly the new limit, no more, one
/// state each (no eviction, eight clients).
#[test]
fn rule_changes_past_a_wrapped_generation_give_each_key_one_fresh_state() {
    let _serial = serial();
    const LIMITS: [u64; 6] = [2, 5, 3, 7, 1, 4];
    for algorithm in STORE_METHODS {
        for (group, fingerprints) in EDGES.into_iter().enumerate() {
            within(format!("{algorithm}, group {group}"), move || {
                let (_clock, service) = one_bucket(algorithm, LIMIT);
                let mut keys: Vec<u64> = fingerprints
                    .iter()
                    .enumerate()
                    .map(|(at, &fingerprint)| key(fingerprint, 7 * at as u64 + 3))
                    .collect();
                for &key in &keys {
                    assert_eq!(spend(&service, key), LIMIT);
                }
                for round in 0..70 {
                    let limit = LIMITS[round % LIMITS.len()];
                    let what = format!("{algorithm}, group {group}, round {round}");
                    service.set_rule(&PLAN, rule(limit)).unwrap();
                    if round % 2 == 0 {
                        assert_eq!(service.sweep(), 8, "{what}: the stale states swept");
                        assert_eq!(service.len(), 0, "{what}");
                    }
                    if round % 3 == 0 {
                        keys.reverse();
                    } else {
                        keys.rotate_left(3);
                    }
                    for &key in &keys {
                        assert_eq!(spend(&service, key), limit, "{what}: {key:#x}");
                    }
                    all_spent(&service, &keys, &what);
                    assert_eq!((service.len(), service.evictions()), (8, 0), "{what}");
                }
            });
        }
    }
}

/// Seven clients and a new one each round; between rounds the clock moves past every window, so
/// every state is idle, and each insert takes an idle client's slot (uncounted), which makes
/// that client take another's in turn: for 150 rounds (every slot past a wrapped generation),
/// each key gets exactly one limit a round, with no eviction and eight clients.
#[test]
fn idle_reuse_past_a_wrapped_generation_changes_no_answer() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        within(format!("{algorithm}"), move || {
            let (clock, service) = one_bucket(algorithm, LIMIT);
            let anchors: Vec<u64> = ANCHORS
                .iter()
                .enumerate()
                .map(|(at, &fingerprint)| key(fingerprint, at as u64 + 1))
                .collect();
            for round in 0..150_u64 {
                let what = format!("{algorithm}, round {round}");
                let newcomer = key(passing_fingerprint(round as usize), round + 100);
                assert_eq!(spend(&service, newcomer), LIMIT, "{what}: the new key");
                for &anchor in &anchors {
                    assert_eq!(spend(&service, anchor), LIMIT, "{what}: {anchor:#x}");
                }
                all_spent(&service, &anchors, &what);
                all_spent(&service, &[newcomer], &what);
                assert_eq!((service.len(), service.evictions()), (8, 0), "{what}");
                clock.advance(3 * WINDOW);
            }
        });
    }
}

/// The fingerprint of the `nth` key to pass through a slot beside [`ANCHORS`]: one bit away from
/// `F` (in the lowest bit, the top bit, or both) or another; never an anchor's, and never the
/// one before's.
fn passing_fingerprint(nth: usize) -> u64 {
    match nth % 4 {
        0 => F ^ 1,
        1 => F ^ TOP,
        2 => F ^ TOP ^ 1,
        _ => 0x3C_0000_0000 | (nth as u64 + 1),
    }
}

/// A service on a [`ParkingClock`], its store of `capacity`.
type ParkingService = RateLimiterService<u64, &'static str, ParkingClock, Identity>;

fn parking_service(algorithm: Algorithm, capacity: usize) -> Arc<ParkingService> {
    Arc::new(
        ServiceBuilder::new(
            algorithm,
            ParkingClock(FakeClock::starting_at(Duration::from_secs(10))),
        )
        .plan(PLAN, rule(LIMIT))
        .capacity(capacity)
        .hasher(Identity)
        .build::<u64>()
        .unwrap(),
    )
}

/// How many times a held decision's slot changes hands.
const CHANGES: [u64; 6] = [1, 2, 63, 64, 65, 128];

/// A decision of client C (one permit taken, in the last slot of a bucket whose seven others
/// hold spent clients) is held at its clock reading, once it has found C's slot. Meanwhile the
/// slot changes hands `changes` times by evictions (each counted, the seven others kept), the
/// last to C itself. Resumed, the decision is C's, on C's state as it is now: granted, and C
/// then has exactly the rest of one limit.
fn held_decision_back_to_its_key(algorithm: Algorithm, changes: u64) {
    let what = format!("{algorithm}, {changes} changes back to the key");
    let service = parking_service(algorithm, 8);
    let anchors: Vec<u64> = ANCHORS
        .iter()
        .map(|&fingerprint| key(fingerprint, 9))
        .collect();
    for &anchor in &anchors {
        assert_eq!(spend(&service, anchor), LIMIT, "{what}");
    }
    let c = key(F, 0x77);
    assert!(service.allow(&c, &PLAN).unwrap(), "{what}");
    let held = {
        let service = Arc::clone(&service);
        park_request(&PARK_AT_READING, 1, "at its reading", move || {
            service.allow(&c, &PLAN).unwrap()
        })
    };
    for nth in 1..changes {
        let passing = key(passing_fingerprint(nth as usize), nth + 1000);
        assert!(service.allow(&passing, &PLAN).unwrap(), "{what}: {nth}");
        assert_eq!(service.evictions(), nth, "{what}: {nth}");
    }
    assert!(service.allow(&c, &PLAN).unwrap(), "{what}: C back");
    assert_eq!(service.evictions(), changes, "{what}");
    assert!(held.resume(), "{what}: the held decision, on C's state");
    assert_eq!(spend(&service, c), LIMIT - 2, "{what}: C's state after it");
    assert_eq!((service.len(), service.evictions()), (8, changes), "{what}");
    for &anchor in &anchors {
        assert_eq!(spend(&service, anchor), 0, "{what}: {anchor:#x} kept");
    }
}

/// As [`held_decision_back_to_its_key`], in the first of two buckets (C's other bucket is the
/// second, empty), but the slot's last holder is Z, whose fingerprint is C's with `flip`
/// flipped (the lowest bit, the top bit, or both): after a multiple of 64 changes Z's tag
/// differs from the one the decision found in that bit alone. Resumed, the decision charges
/// Z nothing: it finds no state of C's and puts a fresh one in the second bucket, granted.
fn held_decision_to_a_near_key(algorithm: Algorithm, changes: u64, flip: u64) {
    let what = format!("{algorithm}, {changes} changes to a key {flip:#x} away");
    let service = parking_service(algorithm, 16);
    let anchors: Vec<u64> = ANCHORS
        .iter()
        .map(|&fingerprint| key_at(fingerprint, 0, 0, 2))
        .collect();
    for &anchor in &anchors {
        assert_eq!(spend(&service, anchor), LIMIT, "{what}");
    }
    let c = key_at(F, 0, 1, 2);
    assert!(service.allow(&c, &PLAN).unwrap(), "{what}");
    let held = {
        let service = Arc::clone(&service);
        park_request(&PARK_AT_READING, 1, "at its reading", move || {
            service.allow(&c, &PLAN).unwrap()
        })
    };
    for nth in 1..changes {
        // Never Z's fingerprint: Z would find that key's state and evict no one.
        let fingerprint = match passing_fingerprint(nth as usize) {
            fingerprint if fingerprint == F ^ flip => 0x3C_0000_0000 | (nth + 1),
            fingerprint => fingerprint,
        };
        let passing = key_at(fingerprint, 0, 0, 2);
        assert!(service.allow(&passing, &PLAN).unwrap(), "{what}: {nth}");
        assert_eq!(service.evictions(), nth, "{what}: {nth}");
    }
    let z = key_at(F ^ flip, 0, 0, 2);
    assert!(service.allow(&z, &PLAN).unwrap(), "{what}: Z");
    assert_eq!(service.evictions(), changes, "{what}");
    assert!(
        held.resume(),
        "{what}: the held decision, on a fresh state of C's"
    );
    assert_eq!(
        service.peek(&z, &PLAN).unwrap().remaining(),
        LIMIT - 1,
        "{what}: Z charged by C's decision"
    );
    assert_eq!(spend(&service, z), LIMIT - 1, "{what}: Z");
    assert_eq!(spend(&service, c), LIMIT - 1, "{what}: C");
    assert_eq!((service.len(), service.evictions()), (9, changes), "{what}");
    for &anchor in &anchors {
        assert_eq!(spend(&service, anchor), 0, "{what}: {anchor:#x} kept");
    }
}

#[test]
fn a_held_decision_is_its_own_keys_after_its_slot_changes_hands() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        for changes in CHANGES.into_iter().filter(|&changes| changes > 1) {
            within(format!("{algorithm}, {changes}"), move || {
                held_decision_back_to_its_key(algorithm, changes);
            });
        }
    }
}

#[test]
fn a_held_decision_never_charges_a_key_one_bit_away_that_took_its_slot() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        for changes in CHANGES {
            for flip in [1, TOP, TOP | 1] {
                within(format!("{algorithm}, {changes}, {flip:#x}"), move || {
                    held_decision_to_a_near_key(algorithm, changes, flip);
                });
            }
        }
    }
}

/// Rounds of two threads deciding on a bucket full of edge fingerprints while a third sweeps
/// and changes the rule; before each round the clock moves past every window, so each state is
/// idle until its first grant, and a sweep that finds it idle races that grant. Each round, a
/// key is granted at most the sum of the limits in force during it (one state per version), no
/// client is ever evicted, and after the race each key gets exactly one fresh limit.
fn retirements_race(algorithm: Algorithm, rounds: usize) {
    const LIMITS: [u64; 3] = [1, 2, 3];
    let clock = FakeClock::starting_at(Duration::from_secs(10));
    let service = placed_service(
        algorithm,
        8,
        Rule::new(LIMITS[0], Duration::from_secs(1)).unwrap(),
        &clock,
    );
    let keys: Arc<Vec<u64>> = Arc::new(
        EDGES[0]
            .iter()
            .enumerate()
            .map(|(at, &fingerprint)| key(fingerprint, at as u64 + 11))
            .collect(),
    );
    let grants: Arc<Vec<AtomicU64>> = Arc::new((0..8).map(|_| AtomicU64::new(0)).collect());
    // The limits in force during the current round, and the number of changes so far.
    let in_force: Arc<Mutex<(Vec<u64>, usize)>> = Arc::new(Mutex::new((vec![LIMITS[0]], 0)));
    let failures: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let change = {
        let (service, in_force) = (Arc::clone(&service), Arc::clone(&in_force));
        move || {
            let mut in_force = in_force.lock().unwrap();
            in_force.1 += 1;
            let limit = LIMITS[in_force.1 % LIMITS.len()];
            in_force.0.push(limit);
            service
                .set_rule(&PLAN, Rule::new(limit, Duration::from_secs(1)).unwrap())
                .unwrap();
        }
    };
    let check = {
        let (service, grants, in_force, failures, keys) = (
            Arc::clone(&service),
            Arc::clone(&grants),
            Arc::clone(&in_force),
            Arc::clone(&failures),
            Arc::clone(&keys),
        );
        move |round: usize| {
            let mut in_force = in_force.lock().unwrap();
            let bound: u64 = in_force.0.iter().sum();
            for (at, granted) in grants.iter().enumerate() {
                let granted = granted.swap(0, Ordering::SeqCst);
                if granted > bound {
                    failures.lock().unwrap().push(format!(
                        "round {round}: {:#x} granted {granted} under limits {:?}",
                        keys[at], in_force.0
                    ));
                }
            }
            if service.evictions() != 0 {
                failures
                    .lock()
                    .unwrap()
                    .push(format!("round {round}: {} evictions", service.evictions()));
            }
            let last = *in_force.0.last().unwrap();
            in_force.0 = vec![last];
        }
    };
    {
        let (clock, change_between, check) = (clock.clone(), change.clone(), check.clone());
        let (service, keys, grants) =
            (Arc::clone(&service), Arc::clone(&keys), Arc::clone(&grants));
        race_rounds(
            3,
            rounds,
            move |round| {
                if round > 0 {
                    check(round - 1);
                }
                clock.advance(Duration::from_secs(3));
                if round % 3 == 1 {
                    change_between();
                }
            },
            move |thread, round| {
                if thread == 2 {
                    for step in 0..3 {
                        service.sweep();
                        if step < 2 && round % 2 == 0 {
                            change();
                        }
                        thread::yield_now();
                    }
                    return 0;
                }
                for pass in 0..6 {
                    for at in 0..8 {
                        let at = (at + 3 * thread + pass) % 8;
                        if service.allow(&keys[at], &PLAN).unwrap() {
                            grants[at].fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
                0
            },
        );
    }
    check(rounds - 1);
    let failures = failures.lock().unwrap();
    assert!(
        failures.is_empty(),
        "{algorithm}: {} rounds off: {:?}",
        failures.len(),
        &failures[..failures.len().min(10)]
    );
    service
        .set_rule(&PLAN, Rule::new(5, Duration::from_secs(1)).unwrap())
        .unwrap();
    for &key in keys.iter() {
        assert_eq!(
            spend(&service, key),
            5,
            "{algorithm}: {key:#x} after the race"
        );
    }
    assert_eq!((service.len(), service.evictions()), (8, 0), "{algorithm}");
}

#[test]
fn retirements_racing_decisions_keep_one_state_a_key() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        within(format!("{algorithm}"), move || {
            retirements_race(algorithm, 1_500)
        });
    }
}

/// Rounds of one thread asking for each key of a bucket of six edge fingerprints (two slots
/// free) a few more times than the limit, one key after another, while another thread sweeps
/// without pause until it is done. Before each round the clock moves past every window, so each
/// state is idle until its first grant, and the sweeps race those grants: a sweep takes a slot
/// whose state it read idle, finds it granting, and puts it back, while the next request for the
/// key looks for it. A sweep changes no answer: each round, each key is granted exactly the
/// limit (not one less for a grant dropped, not more for a second state), and no client is
/// evicted. Runs `rounds` rounds, in chunks, or fewer where `budget` runs out first (a loaded
/// machine); returns the rounds run and the rounds off.
fn sweeps_race(algorithm: Algorithm, rounds: usize, budget: Duration) -> (usize, Vec<String>) {
    const LIMIT: u64 = 2;
    const KEYS: usize = 6;
    const CHUNK: usize = 100;
    let clock = FakeClock::starting_at(Duration::from_secs(10));
    let service = placed_service(
        algorithm,
        8,
        Rule::new(LIMIT, Duration::from_secs(1)).unwrap(),
        &clock,
    );
    let keys: Arc<Vec<u64>> = Arc::new(
        EDGES[0][..KEYS]
            .iter()
            .enumerate()
            .map(|(at, &fingerprint)| key(fingerprint, at as u64 + 21))
            .collect(),
    );
    let grants: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let done = Arc::new(AtomicBool::new(false));
    let failures: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let check = {
        let (service, grants, failures, keys) = (
            Arc::clone(&service),
            Arc::clone(&grants),
            Arc::clone(&failures),
            Arc::clone(&keys),
        );
        move |round: usize| {
            for (at, granted) in grants.iter().enumerate() {
                let granted = granted.swap(0, Ordering::SeqCst);
                if granted != LIMIT {
                    failures.lock().unwrap().push(format!(
                        "{algorithm}, round {round}: {:#x} granted {granted}",
                        keys[at]
                    ));
                }
            }
            if service.evictions() != 0 {
                failures.lock().unwrap().push(format!(
                    "{algorithm}, round {round}: {} evictions",
                    service.evictions()
                ));
            }
        }
    };
    let started = Instant::now();
    let mut run = 0;
    while run < rounds && started.elapsed() < budget {
        let first = run;
        let (clock, check_between, done) = (clock.clone(), check.clone(), Arc::clone(&done));
        let (service, keys, grants, finished) = (
            Arc::clone(&service),
            Arc::clone(&keys),
            Arc::clone(&grants),
            Arc::clone(&done),
        );
        race_rounds(
            2,
            CHUNK,
            move |round| {
                if round > 0 {
                    check_between(first + round - 1);
                }
                done.store(false, Ordering::SeqCst);
                clock.advance(Duration::from_secs(3));
            },
            move |thread, _round| {
                if thread == 1 {
                    // Bounded, in case the other thread fails and never says it is done.
                    for _ in 0..1_000_000 {
                        service.sweep();
                        if finished.load(Ordering::SeqCst) {
                            break;
                        }
                    }
                    return 0;
                }
                for (at, key) in keys.iter().enumerate() {
                    for _ in 0..=LIMIT {
                        if service.allow(key, &PLAN).unwrap() {
                            grants[at].fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
                finished.store(true, Ordering::SeqCst);
                0
            },
        );
        run += CHUNK;
        check(run - 1);
    }
    let failures = std::mem::take(&mut *failures.lock().unwrap());
    (run, failures)
}

#[test]
fn sweeps_racing_first_grants_change_no_count() {
    let _serial = serial();
    // A longer run: TAG_LAYOUT_SWEEP_ROUNDS rounds, within TAG_LAYOUT_SWEEP_MILLIS a method.
    let rounds = std::env::var("TAG_LAYOUT_SWEEP_ROUNDS")
        .ok()
        .and_then(|rounds| rounds.parse().ok())
        .unwrap_or(20_000);
    let budget = stress::hammer_for("TAG_LAYOUT_SWEEP_MILLIS", 1_800);
    let failures = Arc::new(Mutex::new(Vec::new()));
    for algorithm in STORE_METHODS {
        let failures = Arc::clone(&failures);
        within_for(PATIENCE + 2 * budget, format!("{algorithm}"), move || {
            let (run, off) = sweeps_race(algorithm, rounds, budget);
            eprintln!("{algorithm}: {run} rounds, {} off", off.len());
            failures.lock().unwrap().extend(off);
        });
    }
    let failures = failures.lock().unwrap();
    assert!(
        failures.is_empty(),
        "{} rounds off: {:?}",
        failures.len(),
        &failures[..failures.len().min(12)]
    );
}

/// How far a reading of [`MonotonicClock`] may stray from the bracket of quanta's readings taken
/// around it: the counter's reads are not ordered with the instructions around them, and a
/// thread moved between cores reads another core's counter.
const CLOCK_SLACK_NANOS: u64 = 50_000;

/// Each reading of a [`MonotonicClock`] is quanta's conversion of the counts since the clock's
/// origin: between the nanoseconds quanta gives for the counts read around the reading, counted
/// from the counts read around the clock's construction, over 20 ms of readings (a scale off by
/// more than a quarter of a percent, or an origin not subtracted, is outside).
#[test]
fn the_monotonic_clock_reads_quanta_nanoseconds_since_its_origin() {
    let _serial = serial();
    let quanta = quanta::Clock::new();
    let before = quanta.raw();
    let clock = MonotonicClock::new();
    let after = quanta.raw();
    let copy = clock.clone();
    let mut readings = 0_u64;
    let mut last = 0;
    loop {
        let low = quanta.raw();
        let reading = if readings.is_multiple_of(2) {
            clock.now_nanos()
        } else {
            copy.now_nanos()
        };
        let high = quanta.raw();
        let (least, most) = (
            quanta.delta_as_nanos(after, low),
            quanta.delta_as_nanos(before, high),
        );
        assert!(
            least.saturating_sub(CLOCK_SLACK_NANOS) <= reading
                && reading <= most + CLOCK_SLACK_NANOS,
            "reading {readings}: {reading} ns, quanta's bracket {least}..={most} ns"
        );
        assert!(
            reading >= last,
            "reading {readings}: {reading} ns after {last} ns"
        );
        last = reading;
        readings += 1;
        if least > 20_000_000 {
            break;
        }
    }
    assert!(readings > 100, "{readings} readings");
}

/// A service on a [`MonotonicClock`] keeps the edge fingerprints apart as under a fake clock:
/// within a window of an hour, each key gets exactly the limit.
#[test]
fn a_service_on_the_monotonic_clock_grants_each_edge_key_its_limit() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        within(format!("{algorithm}"), move || {
            let service = ServiceBuilder::new(algorithm, MonotonicClock::new())
                .plan(PLAN, rule(LIMIT))
                .capacity(8)
                .hasher(Identity)
                .build::<u64>()
                .unwrap();
            let keys: Vec<u64> = EDGES[1]
                .iter()
                .map(|&fingerprint| key(fingerprint, 1))
                .collect();
            for &key in &keys {
                assert_eq!(spend(&service, key), LIMIT, "{algorithm}: {key:#x}");
            }
            for &key in &keys {
                assert_eq!(spend(&service, key), 0, "{algorithm}: {key:#x}");
            }
            assert_eq!((service.len(), service.evictions()), (8, 0), "{algorithm}");
        });
    }
}
