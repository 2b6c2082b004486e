//! Adversarial checks of the plans' client stores through the public API: tiny capacities (so
//! evictions and slot reuse happen all the time) racing requests, rule changes, moves between one
//! limit and several, and sweeps; hashers that make every key one fingerprint; and the figures
//! (`peek`, `len`, `evictions`) against what decisions do.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tollgate::{Algorithm, FakeClock, Rule, ServiceBuilder};

#[path = "support/stress.rs"]
mod stress;

use stress::Identity;

/// Every key hashes to one value: one fingerprint, one home bucket.
#[derive(Debug, Clone, Default)]
struct ConstantHasher;

impl Hasher for ConstantHasher {
    fn finish(&self) -> u64 {
        0x1234_5678_9abc_def0
    }
    fn write(&mut self, _: &[u8]) {}
}

impl BuildHasher for ConstantHasher {
    type Hasher = ConstantHasher;
    fn build_hasher(&self) -> ConstantHasher {
        ConstantHasher
    }
}

fn rule(limit: u64, window_secs: u64) -> Rule {
    Rule::new(limit, Duration::from_secs(window_secs)).unwrap()
}

/// The limits a plan is switched between: one limit, or several (the least binds).
fn configurations(algorithm: Algorithm, several: bool) -> Vec<Vec<Rule>> {
    let mut all = vec![vec![rule(2, 1)], vec![rule(5, 1)], vec![rule(9, 1)]];
    if several && algorithm != Algorithm::SlidingWindowLog {
        all.push(vec![rule(3, 1), rule(7, 2)]);
        all.push(vec![rule(6, 1), rule(4, 2)]);
    }
    all
}

fn binding(limits: &[Rule]) -> u64 {
    limits.iter().map(Rule::limit).min().unwrap()
}

/// Threads (more than the machine's cores) hammer `clients` keys of one plan, while a driver
/// changes the plan's limits (between one and several when `several`) and sweeps, racing them;
/// the clock moves past every window between phases only. Within a phase, the grants over all
/// clients may be at most, per client, the limit in force at the phase's start plus each
/// change's, plus one limit (the largest) per eviction counted in the phase. With `shared`
/// (every key one fingerprint) all clients are one, and may have one client's worth in all.
/// `planted` reports one denial in 500 as a grant: the negative control.
fn oracle<S: BuildHasher + Clone + Send + Sync + 'static>(
    algorithm: Algorithm,
    capacity: usize,
    hasher: S,
    clients: u64,
    several: bool,
    shared: bool,
    planted: bool,
) -> Result<(), String> {
    const PHASES: usize = 12;
    let configs = configurations(algorithm, several);
    let largest = configs.iter().map(|c| binding(c)).max().unwrap();
    let clock = FakeClock::new();
    let service = Arc::new(
        ServiceBuilder::new(algorithm, clock.clone())
            .plan_limits("p", configs[0].clone())
            .capacity(capacity)
            .hasher(hasher)
            .build::<u64>()
            .unwrap(),
    );
    let gate = Arc::new(RwLock::new(0usize));
    let stop = Arc::new(AtomicBool::new(false));
    let attempts = Arc::new(AtomicUsize::new(0));
    let grants: Arc<Vec<AtomicU64>> = Arc::new((0..PHASES).map(|_| AtomicU64::new(0)).collect());
    let hammers: Vec<_> = (0..6u64)
        .map(|thread| {
            let (service, gate, stop, grants, attempts) = (
                Arc::clone(&service),
                Arc::clone(&gate),
                Arc::clone(&stop),
                Arc::clone(&grants),
                Arc::clone(&attempts),
            );
            std::thread::spawn(move || {
                let mut step = thread + 1;
                let mut denials = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    step = step
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let client = (step >> 33) % clients;
                    let phase = gate.read().unwrap();
                    let granted = *phase < PHASES && service.allow(&client, &"p").unwrap();
                    let planted = planted && !granted && {
                        denials += 1;
                        denials.is_multiple_of(500)
                    };
                    if *phase < PHASES && (granted || planted) {
                        grants[*phase].fetch_add(1, Ordering::Relaxed);
                    }
                    drop(phase);
                    attempts.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let per_client = if shared { 1 } else { clients };
    let mut allowance = [0u64; PHASES];
    let mut evictions_before = service.evictions();
    let mut in_force = binding(&configs[0]);
    let mut turn = 0usize;
    let mut result = Ok(());
    for phase in 0..PHASES {
        let mut allowed = in_force;
        for _ in 0..20 {
            turn += 1;
            if turn.is_multiple_of(3) {
                let next = &configs[(turn / 3) % configs.len()];
                service.set_limits(&"p", next.clone()).unwrap();
                in_force = binding(next);
                allowed += in_force;
            } else {
                service.sweep();
            }
            let seen = attempts.load(Ordering::Relaxed);
            while attempts.load(Ordering::Relaxed) < seen + 10 {
                std::thread::yield_now();
            }
        }
        let mut held = gate.write().unwrap();
        let evictions = service.evictions() - evictions_before;
        evictions_before += evictions;
        allowance[phase] = allowed * per_client + evictions * largest;
        let granted = grants[phase].load(Ordering::Relaxed);
        if granted > allowance[phase] && result.is_ok() {
            result = Err(format!(
                "{algorithm}, capacity {capacity}: phase {phase}: {granted} granted, at most {} \
                 allowed ({evictions} evictions)",
                allowance[phase]
            ));
        }
        clock.advance(Duration::from_secs(10));
        *held += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for hammer in hammers {
        hammer.join().expect("no request panicked");
    }
    assert!(grants.iter().any(|g| g.load(Ordering::Relaxed) > 0));
    if shared {
        assert_eq!(service.evictions(), 0, "one fingerprint is one client");
    }
    result
}

#[test]
fn tiny_stores_racing_rule_changes_and_sweeps_admit_no_more_than_changes_and_evictions_allow() {
    for algorithm in Algorithm::ALL {
        for capacity in [1, 8, 16] {
            oracle(
                algorithm,
                capacity,
                std::hash::RandomState::new(),
                24,
                false,
                false,
                false,
            )
            .unwrap();
        }
    }
}

#[test]
fn tiny_stores_racing_moves_between_one_limit_and_several_admit_no_more_than_allowed() {
    for algorithm in Algorithm::ALL {
        for capacity in [8, 16] {
            oracle(
                algorithm,
                capacity,
                std::hash::RandomState::new(),
                24,
                true,
                false,
                false,
            )
            .unwrap();
        }
    }
}

/// Few clients in a small store: no eviction, so the bound is the rule changes' alone, while
/// sweeps and changes free and reuse slots under the requests.
#[test]
fn few_clients_in_a_small_store_racing_changes_moves_and_sweeps_keep_the_exact_bound() {
    for algorithm in Algorithm::ALL {
        for several in [false, true] {
            oracle(
                algorithm,
                8,
                std::hash::RandomState::new(),
                3,
                several,
                false,
                false,
            )
            .unwrap();
        }
    }
}

#[test]
fn the_store_oracle_catches_a_planted_over_admission() {
    let breach = oracle(
        Algorithm::TokenBucket,
        8,
        std::hash::RandomState::new(),
        3,
        true,
        false,
        true,
    );
    assert!(breach.is_err(), "the planted over-admission went unseen");
}

#[test]
fn one_fingerprint_for_every_key_is_one_limit_across_rule_changes_and_sweeps() {
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
    ] {
        for capacity in [8, 16, 4096] {
            oracle(algorithm, capacity, ConstantHasher, 24, false, true, false).unwrap();
        }
    }
}

/// Sequentially, with evictions on every new client, rule changes and moves between one limit
/// and several: what `peek` reports is what the next `acquire` decides.
#[test]
fn peek_reports_what_the_next_decision_decides_through_evictions_and_changes() {
    for algorithm in Algorithm::ALL {
        let clock = FakeClock::new();
        let configs = configurations(algorithm, true);
        let service = ServiceBuilder::new(algorithm, clock.clone())
            .plan_limits("p", configs[0].clone())
            .capacity(8)
            .build::<u64>()
            .unwrap();
        let mut step = 7u64;
        for i in 0..4000u64 {
            step = step
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let client = (step >> 33) % 11;
            if i % 97 == 0 {
                let next = &configs[((step >> 20) as usize) % configs.len()];
                service.set_limits(&"p", next.clone()).unwrap();
            }
            if i % 131 == 0 {
                service.sweep();
            }
            if i % 7 == 0 {
                clock.advance(Duration::from_millis(130));
            }
            let peeked = service.peek(&client, &"p").unwrap();
            let (_, headers) = service.ratelimit_headers(&client, &"p", "p").unwrap();
            let decided = service.acquire(&client, &"p", 1).unwrap();
            assert_eq!(
                peeked.is_allowed(),
                decided.is_allowed(),
                "{algorithm} step {i} client {client}: peek {peeked:?}, decision {decided:?}"
            );
            if decided.is_allowed() {
                assert_eq!(
                    peeked.remaining(),
                    decided.remaining() + 1,
                    "{algorithm} step {i}: peek {peeked:?}, decision {decided:?}"
                );
            }
            let _ = headers;
        }
    }
}

/// Distinct clients that each take one permit and stay active fill a store of one bucket; each
/// one more evicts one, and `len` never passes the capacity.
#[test]
fn len_and_evictions_count_what_a_full_store_does() {
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
    ] {
        for capacity in [1, 8] {
            let service = ServiceBuilder::new(algorithm, FakeClock::new())
                .plan("p", rule(3, 3600))
                .capacity(capacity)
                .build::<u64>()
                .unwrap();
            for client in 0..100u64 {
                assert!(service.allow(&client, &"p").unwrap());
                assert!(service.len() <= 8, "{algorithm}: {} > 8", service.len());
            }
            assert_eq!(service.len(), 8, "{algorithm}");
            assert_eq!(service.evictions(), 92, "{algorithm}");
            // Idle clients are reused without being counted.
            let idle = ServiceBuilder::new(algorithm, FakeClock::new())
                .plan("p", rule(3, 3600))
                .capacity(capacity)
                .build::<u64>()
                .unwrap();
            for client in 0..100u64 {
                assert!(idle.acquire(&client, &"p", 0).unwrap().is_allowed());
            }
            assert_eq!(idle.evictions(), 0, "{algorithm}");
        }
    }
}

/// A hot client whose keys compete with others for one bucket is never granted more than one
/// limit per eviction counted, with many more threads than cores.
#[test]
fn hot_clients_in_one_full_bucket_gain_at_most_one_limit_per_eviction() {
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
    ] {
        let service = Arc::new(
            ServiceBuilder::new(algorithm, FakeClock::new())
                .plan("p", rule(5, 3600))
                .capacity(8)
                .build::<u64>()
                .unwrap(),
        );
        // Fill the bucket with exhausted clients.
        for client in 100..108u64 {
            while service.allow(&client, &"p").unwrap() {}
        }
        let granted = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8u64)
            .map(|thread| {
                let (service, granted) = (Arc::clone(&service), Arc::clone(&granted));
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        let client = (thread + i) % 4;
                        match service.allow(&client, &"p") {
                            Ok(true) => {
                                granted.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(false) => {}
                            Err(error) => panic!("{algorithm}: {error}"),
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let granted = granted.load(Ordering::Relaxed);
        let evictions = service.evictions();
        // 4 hot clients and 8 exhausted ones: each start afresh is a first request or follows
        // an eviction.
        assert!(
            granted <= 5 * (4 + evictions),
            "{algorithm}: {granted} granted, {evictions} evictions"
        );
    }
}

/// Two keys of one fingerprint whose home buckets differ (one shares the other's second bucket):
/// the first key's state sits in its home bucket, which the second key never probes, so each
/// keeps its own limit, as the store's docs say; neither is granted more than its own.
#[test]
fn keys_of_one_fingerprint_in_buckets_the_other_never_probes_each_keep_their_own_limit() {
    // Capacity 16: two buckets; a key's home is the hash's top bit.
    let remix = |hash: u64| (hash ^ (hash >> 31)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let bucket = |hash: u64| (hash >> 63) as usize;
    let fingerprint = 0x00ab_cdef_0123u64;
    // Find two hashes with this fingerprint, homes 0 and 1, sharing a bucket.
    let mut pair = None;
    'search: for a_high in 0..(1u64 << 20) {
        let a = (a_high << 40) | fingerprint;
        if bucket(a) != 0 {
            continue;
        }
        for b_high in (1u64 << 23)..(1u64 << 24) {
            let b = (b_high << 40) | fingerprint;
            if bucket(b) != 1 {
                continue;
            }
            // A's home is 0, its other is 1; B's home and other are 1: they share bucket 1.
            if bucket(remix(a)) == 1 && bucket(remix(b)) == 1 {
                pair = Some((a, b));
                break 'search;
            }
        }
    }
    let (a, b) = pair.expect("a pair");
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
    ] {
        let service = ServiceBuilder::new(algorithm, FakeClock::new())
            .plan("p", rule(5, 3600))
            .capacity(16)
            .hasher(Identity)
            .build::<u64>()
            .unwrap();
        let granted_a = (0..10).filter(|_| service.allow(&a, &"p").unwrap()).count();
        let granted_b = (0..10).filter(|_| service.allow(&b, &"p").unwrap()).count();
        assert_eq!(
            (granted_a, granted_b),
            (5, 5),
            "{algorithm}: each key of the fingerprint keeps its own limit"
        );
    }
}

/// A key whose `Hash` changes at every call: no panic, no hang, and the store stays bounded.
#[derive(Debug, PartialEq, Eq)]
struct Shifty(u64);

static SHIFT: AtomicU64 = AtomicU64::new(0);

impl Hash for Shifty {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self.0 ^ SHIFT.fetch_add(1, Ordering::Relaxed)).hash(state);
    }
}

impl Clone for Shifty {
    fn clone(&self) -> Self {
        Shifty(self.0)
    }
}

#[test]
fn keys_whose_hash_changes_neither_panic_nor_hang() {
    for algorithm in Algorithm::ALL {
        let clock = FakeClock::new();
        let two = if algorithm == Algorithm::SlidingWindowLog {
            vec![rule(4, 1)]
        } else {
            vec![rule(3, 1), rule(5, 2)]
        };
        let service = ServiceBuilder::new(algorithm, clock.clone())
            .plan_limits("one", [rule(3, 1)])
            .plan_limits("two", two)
            .capacity(8)
            .build::<Shifty>()
            .unwrap();
        for i in 0..2000u64 {
            let plan = if i % 2 == 0 { "one" } else { "two" };
            let _ = service.allow(&Shifty(i % 3), &plan);
            let _ = service.peek(&Shifty(i % 3), &plan);
            if i % 50 == 0 {
                service.sweep();
                clock.advance(Duration::from_millis(300));
            }
        }
    }
}

/// `acquire` of 0 permits "does not make a limiter for a client the service does not hold": so it
/// neither takes a slot nor evicts an active client (which would start that client afresh).
#[test]
fn an_attempt_of_zero_permits_by_a_new_client_makes_no_limiter_and_evicts_no_one() {
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
    ] {
        let service = ServiceBuilder::new(algorithm, FakeClock::new())
            .plan("p", rule(2, 3600))
            .capacity(8)
            .build::<u64>()
            .unwrap();
        assert!(service.acquire(&1000, &"p", 0).unwrap().is_allowed());
        let made = service.len();
        for client in 0..8u64 {
            while service.allow(&client, &"p").unwrap() {}
        }
        for probe in 2000..2100u64 {
            let _ = service.acquire(&probe, &"p", 0).unwrap();
        }
        let evictions = service.evictions();
        let regained = (0..8u64)
            .filter(|client| service.allow(client, &"p").unwrap())
            .count();
        assert_eq!(
            (made, evictions, regained),
            (0, 0, 0),
            "{algorithm}: (limiters a zero attempt made, evictions by zero attempts, permits \
             exhausted clients regained)"
        );
    }
}

/// Many more threads than cores, each asking for a new client at every call, in a store of one
/// bucket: every fresh state is the first one the next insert may reuse, yet no request gives up.
#[test]
fn a_flood_of_new_clients_on_one_bucket_never_gives_up() {
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
    ] {
        let service = Arc::new(
            ServiceBuilder::new(algorithm, FakeClock::new())
                .plan("p", rule(5, 3600))
                .capacity(8)
                .build::<u64>()
                .unwrap(),
        );
        let threads: Vec<_> = (0..8u64)
            .map(|thread| {
                let service = Arc::clone(&service);
                std::thread::spawn(move || {
                    for i in 0..50_000u64 {
                        let granted = service.allow(&(thread << 32 | i), &"p");
                        assert!(matches!(granted, Ok(true)), "{algorithm}: {granted:?}");
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
    }
}

/// A client swept as idle, then asked for at a clock set back into the window it used up, is
/// refused as its old limiter would have refused it; also when its slot was reused by another
/// client meanwhile.
#[test]
fn a_reading_older_than_a_sweep_is_not_admitted_by_the_fresh_state() {
    for algorithm in Algorithm::ALL {
        for reuse in [false, true] {
            let clock = FakeClock::starting_at(Duration::from_millis(500));
            let service = ServiceBuilder::new(algorithm, clock.clone())
                .plan("p", rule(3, 1))
                .capacity(8)
                .build::<u64>()
                .unwrap();
            while service.allow(&1, &"p").unwrap() {}
            clock.set(Duration::from_millis(3_000));
            assert!(service.sweep() >= 1 || algorithm == Algorithm::SlidingWindowLog);
            if reuse {
                for other in 100..140u64 {
                    service.allow(&other, &"p").unwrap();
                }
            }
            clock.set(Duration::from_millis(600));
            let decided = service.acquire(&1, &"p", 1).unwrap();
            assert!(
                decided.is_denied(),
                "{algorithm}, reuse {reuse}: {decided:?} at a reading the old limiter refused"
            );
        }
    }
}

/// A plan flipping between one limit and several as fast as it can, under requests from more
/// threads than cores: each flip moves every client between the store and the map, and no
/// request gives up or panics.
#[test]
fn requests_racing_a_plan_flipping_between_one_limit_and_several_never_give_up() {
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
    ] {
        let service = Arc::new(
            ServiceBuilder::new(algorithm, FakeClock::new())
                .plan("p", rule(5, 1))
                .capacity(8)
                .build::<u64>()
                .unwrap(),
        );
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..6u64)
            .map(|thread| {
                let (service, stop) = (Arc::clone(&service), Arc::clone(&stop));
                std::thread::spawn(move || {
                    let mut i = thread;
                    while !stop.load(Ordering::Relaxed) {
                        i += 1;
                        let client = i % 12;
                        let answer = service.acquire(&client, &"p", 1 + i % 2);
                        assert!(answer.is_ok(), "{algorithm}: {answer:?}");
                        let _ = service.peek(&client, &"p").unwrap();
                        let _ = service.ratelimit_headers(&client, &"p", "p").unwrap();
                    }
                })
            })
            .collect();
        for flip in 0..3_000u32 {
            let limits = if flip % 2 == 0 {
                vec![rule(5, 1), rule(9, 2)]
            } else {
                vec![rule(5, 1)]
            };
            service.set_limits(&"p", limits).unwrap();
            if flip % 100 == 0 {
                service.sweep();
            }
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Relaxed);
        for thread in threads {
            thread.join().unwrap();
        }
    }
}
