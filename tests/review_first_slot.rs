//! Review of e628463: the lookup of a known client decides on the first slot of its home bucket
//! whose tag carries its fingerprint, and leaves every other case to the full lookup. Keys of one
//! 40-bit fingerprint placed by an identity hasher, stale first slots, a first slot that changes
//! hands while a decision on it is parked, and a race of one fingerprint over several homes.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tollgate::{Algorithm, Clock, FakeClock, RateLimiterService, Rule, ServiceBuilder};

#[path = "support/park.rs"]
mod park;
#[path = "support/stress.rs"]
mod stress;

use park::{PARK_AT_READING, ParkingClock, park_at, parked_or_none};
use stress::Identity;

const FP_MASK: u64 = (1 << 40) - 1;
const F: u64 = 0xAB_CDEF_1234;

fn home(hash: u64, buckets: u64) -> u64 {
    ((u128::from(hash) * u128::from(buckets)) >> 64) as u64
}
fn other(hash: u64, buckets: u64) -> u64 {
    home(
        (hash ^ (hash >> 31)).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        buckets,
    )
}
/// The first key of fingerprint `fp` (low bits) whose home and other buckets (of `buckets`)
/// satisfy `want`, searching high bits from `from`.
fn key_with(fp: u64, buckets: u64, from: u64, want: impl Fn(u64, u64) -> bool) -> u64 {
    (from..)
        .map(|high| (high << 40) | fp)
        .find(|&k| want(home(k, buckets), other(k, buckets)))
        .unwrap()
}

fn spend<C: Clock>(s: &RateLimiterService<u64, &'static str, C, Identity>, key: u64) -> u64 {
    let mut granted = 0;
    while granted <= 20 && s.allow(&key, &"p").unwrap() {
        granted += 1;
    }
    granted
}

/// Two keys of one fingerprint, A (home 0, other 1) and B (home 1). Bucket 0 is full of active
/// clients, so A's state goes to bucket 1 at slot 2 (after two fillers): B's home look's first
/// fingerprint slot is A's. They share one state: one limit between them. After a rule change
/// that first slot is stale: B's look retires it and falls through, and they share one fresh
/// state under the new rule. `len` and `evictions` as expected throughout.
#[test]
fn keys_of_one_fingerprint_across_homes_share_one_limit_through_stale_first_slots() {
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
    ] {
        let clock = FakeClock::starting_at(Duration::from_secs(10));
        let s = ServiceBuilder::new(algorithm, clock.clone())
            .plan("p", Rule::per_hour(5).unwrap())
            .capacity(16)
            .hasher(Identity)
            .build::<u64>()
            .unwrap();
        let mut from = 1;
        let mut next = |fp: u64, want: &dyn Fn(u64, u64) -> bool| {
            let k = key_with(fp, 2, from, want);
            from = (k >> 40) + 1;
            k
        };
        for i in 0..8 {
            let k = next(0x100 + i, &|h, _| h == 0);
            assert!(s.allow(&k, &"p").unwrap());
        }
        for i in 0..2 {
            let k = next(0x200 + i, &|h, _| h == 1);
            assert!(s.allow(&k, &"p").unwrap());
        }
        let a = next(F, &|h, o| h == 0 && o == 1);
        let b = next(F, &|h, _| h == 1);
        assert_eq!(spend(&s, a), 5, "{algorithm}: A");
        assert_eq!(spend(&s, b), 0, "{algorithm}: B shares A's state");
        assert_eq!((s.len(), s.evictions()), (11, 0), "{algorithm}");
        for (round, limit) in [3_u64, 4, 2].into_iter().enumerate() {
            s.set_rule(&"p", Rule::per_hour(limit).unwrap()).unwrap();
            let (first, second) = if round % 2 == 0 { (b, a) } else { (a, b) };
            let g1 = spend(&s, first);
            let g2 = spend(&s, second);
            assert_eq!(g1 + g2, limit, "{algorithm}: round {round}: {g1} + {g2}");
            assert_eq!(s.peek(&a, &"p").unwrap().remaining(), 0);
            assert_eq!(s.peek(&b, &"p").unwrap().remaining(), 0);
            assert_eq!(
                (s.len(), s.evictions()),
                (11, 0),
                "{algorithm}: round {round}"
            );
        }
    }
}

/// A decision on K's first home slot is parked (at its clock reading, inside the decision)
/// while the rule changes, a sweep frees K's stale slot, Z (another key, same home, another
/// fingerprint, or the same one with `same_fp`) takes that slot, and K is inserted afresh in a
/// later slot and spent. Resumed, the parked decision's first slot is no longer K's holding: it
/// must fall through to the full lookup and find K's spent state (refused), charging Z nothing
/// (unless Z shares K's fingerprint, where it is K's state as the store sees it).
#[test]
fn a_parked_decision_whose_first_slot_changed_hands_falls_through_to_the_current_state() {
    for same_fp in [false, true] {
        for algorithm in [
            Algorithm::TokenBucket,
            Algorithm::FixedWindow,
            Algorithm::SlidingWindowCounter,
        ] {
            let clock = ParkingClock(FakeClock::starting_at(Duration::from_secs(10)));
            let s = Arc::new(
                ServiceBuilder::new(algorithm, clock.clone())
                    .plan("p", Rule::per_hour(5).unwrap())
                    .capacity(8)
                    .hasher(Identity)
                    .build::<u64>()
                    .unwrap(),
            );
            let k = (1 << 40) | F;
            let z = (2 << 40) | if same_fp { F } else { F ^ 1 };
            assert!(s.allow(&k, &"p").unwrap());
            let parked = {
                let s = Arc::clone(&s);
                let (tx, rx) = std::sync::mpsc::channel();
                let handle = std::thread::spawn(move || {
                    tx.send(park_at(&PARK_AT_READING, 1)).unwrap();
                    let granted = s.allow(&k, &"p").unwrap();
                    assert!(parked_or_none(&PARK_AT_READING));
                    granted
                });
                let (parked_rx, resume_tx) = rx.recv().unwrap();
                parked_rx.recv().unwrap();
                (handle, resume_tx)
            };
            s.set_rule(&"p", Rule::per_hour(3).unwrap()).unwrap();
            s.sweep();
            assert_eq!(s.len(), 0, "{algorithm}: the stale state swept");
            let z_granted = if same_fp {
                0
            } else {
                u64::from(s.allow(&z, &"p").unwrap())
            };
            let k_granted = spend(&s, k);
            let (handle, resume) = parked;
            resume.send(()).unwrap();
            let late = handle.join().unwrap();
            assert_eq!(
                k_granted + u64::from(late),
                3,
                "{algorithm}, same_fp {same_fp}: K's grants after the change ({k_granted} + late {late})"
            );
            if !same_fp {
                assert_eq!(z_granted, 1);
                assert_eq!(
                    s.peek(&z, &"p").unwrap().remaining(),
                    2,
                    "{algorithm}: Z charged"
                );
                assert_eq!(s.len(), 2, "{algorithm}");
            } else {
                assert_eq!(s.len(), 1, "{algorithm}");
            }
            assert_eq!(s.evictions(), 0);
        }
    }
}

fn rule(limit: u64) -> Rule {
    Rule::new(limit, Duration::from_secs(1)).unwrap()
}

/// Threads hammer `clients` keys that all carry one fingerprint, spread over the homes of a
/// store of `capacity` (buckets of 8), while a driver changes the rule and sweeps. Each bucket
/// takes states of its own home lock's keys alone (no home fills), and each insert settles its
/// home: at most one current state per bucket. So per phase, grants are at most (limit in
/// force at the phase's start + each change's) per bucket, plus one limit per eviction.
fn one_fingerprint_over_homes(algorithm: Algorithm, capacity: usize) -> Result<(), String> {
    const PHASES: usize = 10;
    let limits = [2_u64, 5, 9, 3];
    let buckets = (capacity as u64).div_ceil(8);
    let largest = *limits.iter().max().unwrap();
    let clock = FakeClock::new();
    let service = Arc::new(
        ServiceBuilder::new(algorithm, clock.clone())
            .plan("p", rule(limits[0]))
            .capacity(capacity)
            .hasher(Identity)
            .build::<u64>()
            .unwrap(),
    );
    let keys: Arc<Vec<u64>> = Arc::new(
        (1..=24_u64)
            .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) & !FP_MASK) | F)
            .collect(),
    );
    let gate = Arc::new(RwLock::new(0usize));
    let stop = Arc::new(AtomicBool::new(false));
    let attempts = Arc::new(AtomicUsize::new(0));
    let grants: Arc<Vec<AtomicU64>> = Arc::new((0..PHASES).map(|_| AtomicU64::new(0)).collect());
    let hammers: Vec<_> = (0..4u64)
        .map(|thread| {
            let (service, gate, stop, grants, attempts, keys) = (
                Arc::clone(&service),
                Arc::clone(&gate),
                Arc::clone(&stop),
                Arc::clone(&grants),
                Arc::clone(&attempts),
                Arc::clone(&keys),
            );
            std::thread::spawn(move || {
                let mut step = thread + 1;
                while !stop.load(Ordering::Relaxed) {
                    step = step
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let client = keys[((step >> 33) % keys.len() as u64) as usize];
                    let phase = gate.read().unwrap();
                    if *phase < PHASES && service.allow(&client, &"p").unwrap() {
                        grants[*phase].fetch_add(1, Ordering::Relaxed);
                    }
                    drop(phase);
                    attempts.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let mut evictions_before = service.evictions();
    let mut in_force = limits[0];
    let mut turn = 0usize;
    let mut result = Ok(());
    for phase in 0..PHASES {
        let mut allowed = in_force;
        for _ in 0..30 {
            turn += 1;
            if turn.is_multiple_of(3) {
                in_force = limits[(turn / 3) % limits.len()];
                service.set_rule(&"p", rule(in_force)).unwrap();
                allowed += in_force;
            } else {
                service.sweep();
            }
            let seen = attempts.load(Ordering::Relaxed);
            while attempts.load(Ordering::Relaxed) < seen + 20 {
                std::thread::yield_now();
            }
        }
        let mut held = gate.write().unwrap();
        let evictions = service.evictions() - evictions_before;
        evictions_before += evictions;
        let tight = std::env::var("TIGHT").is_ok();
        let allowance = allowed * if tight { 1 } else { buckets } + evictions * largest;
        let granted = grants[phase].load(Ordering::Relaxed);
        if granted > allowance && result.is_ok() {
            result = Err(format!(
                "{algorithm}, capacity {capacity}: phase {phase}: {granted} granted, at most \
                 {allowance} allowed ({evictions} evictions)"
            ));
        }
        let len = service.len();
        if len as u64 > buckets * 2 && result.is_ok() {
            // Current states at most one per bucket; stale ones (not yet retired) may add.
            eprintln!("{algorithm}, capacity {capacity}: phase {phase}: len {len}");
        }
        clock.advance(Duration::from_secs(10));
        *held += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for hammer in hammers {
        hammer.join().unwrap();
    }
    if service.evictions() != 0 && result.is_ok() {
        result = Err(format!("{algorithm}: {} evictions", service.evictions()));
    }
    // Idle now: the keys' states, one per home at most.
    clock.advance(Duration::from_secs(10));
    let peeks: Vec<u64> = keys
        .iter()
        .map(|k| service.peek(k, &"p").unwrap().remaining())
        .collect();
    if peeks.iter().any(|&r| r != in_force) && result.is_ok() {
        result = Err(format!("{algorithm}: peeks {peeks:?}, rule {in_force}"));
    }
    result
}

#[test]
fn one_fingerprint_over_several_homes_racing_rule_changes_stays_within_one_limit_per_bucket() {
    for round in 0..3 {
        for algorithm in [
            Algorithm::TokenBucket,
            Algorithm::FixedWindow,
            Algorithm::SlidingWindowCounter,
        ] {
            for capacity in [16, 32] {
                if let Err(e) = one_fingerprint_over_homes(algorithm, capacity) {
                    panic!("round {round}: {e}");
                }
            }
        }
    }
}
