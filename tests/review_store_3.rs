//! Review of the insert's bucket pass (`needs_settling` / `settle_key_slots` / `claim_free` by
//! bucket) and the decision's unrolled probe, through the public API only: tiny stores of the
//! one-word methods, keys placed with an identity hasher so that their buckets collide on
//! purpose, a `FakeClock` that stands still while threads race, sweeps and rule changes (but in
//! the race of inserts and sweeps, where each inserting thread moves it on).
//!
//! Each check counts admissions exactly against what the limits allow: with the clock standing
//! still, a client may be granted at most its limit per version of the rules, plus at most one
//! limit per counted eviction.
//!
//! `REVIEW_STORE_3_MILLIS` sets how long each stress shape runs (default 1,200 ms).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use tollgate::{Algorithm, FakeClock, Rule, ServiceBuilder};

#[path = "support/stress.rs"]
mod stress;

use stress::{
    Identity, PLAN, PlacedService as Service, SPENT_AHEAD, STORE_METHODS, Watchdog, key_at,
    placed_service as service, serial, xorshift,
};

fn hammer_for() -> Duration {
    stress::hammer_for("REVIEW_STORE_3_MILLIS", 1_200)
}

fn hour_rule(limit: u64) -> Rule {
    Rule::new(limit, Duration::from_secs(3600)).unwrap()
}

/// Spends every permit of `key`; asserts it had exactly `limit`.
fn spend(service: &Service, key: u64, limit: u64) {
    let granted = (0..=limit)
        .filter(|_| service.allow(&key, &PLAN).unwrap())
        .count() as u64;
    assert_eq!(granted, limit, "key {key:#x}: a fresh client's permits");
}

// ---------------------------------------------------------------------------------------------
// (a) Concurrent first requests of one key make one state.
// ---------------------------------------------------------------------------------------------

/// Rounds of `threads` threads released together on one new key, each asking `limit + 1` times,
/// the clock standing still: the key is granted exactly `limit` (two states would grant up to
/// `threads * limit`), unless an eviction happened in the round (then at most one limit more per
/// eviction). Between rounds the clock moves past the window and the store is swept, so each
/// round's key finds free (or idle) slots. `home_other` places the round keys; `filler` spent
/// clients are put first in the key's buckets (so the key's free slot is the last ones, or in
/// the other bucket). With `sweeping`, a sweeper races the round.
fn first_requests_round(
    algorithm: Algorithm,
    capacity: usize,
    home_other: (usize, usize),
    fillers: usize,
    sweeping: bool,
    rounds: u64,
) -> Result<(), String> {
    const THREADS: usize = 3;
    let limit = 3;
    let clock = FakeClock::new();
    let service = service(algorithm, capacity, hour_rule(limit), &clock);
    let buckets = capacity / 8;
    let (home, other) = home_other;
    let stop = Arc::new(AtomicBool::new(false));
    let sweeper = sweeping.then(|| {
        let (service, stop) = (Arc::clone(&service), Arc::clone(&stop));
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                service.sweep();
                thread::yield_now();
            }
        })
    });
    let start = Arc::new(Barrier::new(THREADS + 1));
    let end = Arc::new(Barrier::new(THREADS + 1));
    let key_now = Arc::new(AtomicU64::new(0));
    let granted = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (service, start, end, key_now, granted) = (
                Arc::clone(&service),
                Arc::clone(&start),
                Arc::clone(&end),
                Arc::clone(&key_now),
                Arc::clone(&granted),
            );
            thread::spawn(move || {
                loop {
                    start.wait();
                    let key = key_now.load(Ordering::Acquire);
                    if key == 0 {
                        return;
                    }
                    for _ in 0..=limit {
                        // An error counts as no grant (the round's check then fails on the count).
                        if service.allow(&key, &PLAN).unwrap_or(false) {
                            granted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    end.wait();
                }
            })
        })
        .collect();
    let mut result = Ok(());
    let mut rounds_with_evictions = 0;
    for round in 0..rounds {
        // Fresh fillers in the key's buckets, spent (not idle: they stay while the round runs).
        clock.advance(Duration::from_secs(7200));
        service.sweep();
        for f in 0..fillers {
            let bucket = if f < 8 { home } else { other };
            let key = key_at(
                (1 << 38) | (round << 8) | (f as u64 + 1),
                bucket,
                bucket,
                buckets,
            );
            let spent = (0..=limit)
                .filter(|_| service.allow(&key, &PLAN).unwrap_or(false))
                .count() as u64;
            if spent != limit && result.is_ok() {
                result = Err(format!(
                    "{algorithm} capacity {capacity}: round {round}: filler {key:#x} granted \
                     {spent} of a fresh client's {limit}"
                ));
            }
        }
        if result.is_err() {
            break;
        }
        let key = key_at((1 << 39) | (round + 1), home, other, buckets);
        let evictions_before = service.evictions();
        granted.store(0, Ordering::Relaxed);
        key_now.store(key, Ordering::Release);
        start.wait();
        end.wait();
        let evictions = service.evictions() - evictions_before;
        let got = granted.load(Ordering::Relaxed);
        rounds_with_evictions += u64::from(evictions > 0);
        let ok = if evictions == 0 {
            got == limit
        } else {
            got <= limit * (1 + evictions)
        };
        if !ok && result.is_ok() {
            result = Err(format!(
                "{algorithm} capacity {capacity} buckets {home_other:?} fillers {fillers} sweeping \
                 {sweeping}: round {round}: key {key:#x} granted {got} of limit {limit} with \
                 {evictions} evictions in the round"
            ));
        }
    }
    key_now.store(0, Ordering::Release);
    start.wait();
    for worker in workers {
        worker.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(sweeper) = sweeper {
        sweeper.join().unwrap();
    }
    eprintln!(
        "first requests {algorithm} capacity {capacity} {home_other:?} fillers {fillers} sweeping \
         {sweeping}: {rounds} rounds, {rounds_with_evictions} with evictions"
    );
    result
}

#[test]
fn concurrent_first_requests_of_one_key_make_one_state() {
    let _serial = serial();
    let dog = Watchdog::start(Duration::from_secs(300), "first requests".into());
    for algorithm in STORE_METHODS {
        // One bucket: home and other the same (no other bucket at all).
        // Two buckets: key's state in its home (no fillers), in the home's last slot (7 fillers),
        // or in the other bucket (8 fillers fill the home).
        for (capacity, pair, fillers, sweeping) in [
            (8, (0, 0), 0, false),
            (8, (0, 0), 7, true),
            (16, (0, 1), 0, false),
            (16, (1, 0), 7, false),
            (16, (0, 1), 8, false),
            (16, (1, 0), 8, true),
            (32, (2, 3), 12, true),
        ] {
            first_requests_round(algorithm, capacity, pair, fillers, sweeping, 400).unwrap();
        }
    }
    dog.finish();
}

// ---------------------------------------------------------------------------------------------
// Free slots are taken before anything is evicted, home bucket or other.
// ---------------------------------------------------------------------------------------------

/// Sequential and exact: with the other bucket full of spent clients, new keys fill their home's
/// free slots without an eviction; with the home full, they fill the other's; and keys whose two
/// buckets are one fill it. Every spent client stays spent.
#[test]
fn new_keys_take_free_slots_of_either_bucket_before_evicting() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        let limit = 2;
        let clock = FakeClock::new();
        let service = service(algorithm, 32, hour_rule(limit), &clock);
        let buckets = 4;
        let mut fingerprint = 0;
        let mut spent = Vec::new();
        // `count` new keys of buckets `home` and `other`, each spent.
        let mut spend_new = |count, home, other| {
            for _ in 0..count {
                fingerprint += 1;
                let key = key_at(fingerprint, home, other, buckets);
                spend(&service, key, limit);
                spent.push(key);
            }
        };
        // Bucket 1 full.
        spend_new(8, 1, 1);
        // Keys of home 0, other 1: bucket 0's free slots.
        spend_new(8, 0, 1);
        assert_eq!(service.evictions(), 0, "{algorithm}: home 0 had free slots");
        // Keys of home 3 (empty), other 0 (full) and home 2, other 3.
        spend_new(4, 3, 0);
        spend_new(4, 2, 3);
        // Keys of home 2 (4 free), other 3 (4 free): fill both.
        spend_new(8, 2, 3);
        assert_eq!(service.len(), 32, "{algorithm}");
        assert_eq!(
            service.evictions(),
            0,
            "{algorithm}: a new key evicted while its buckets had a free slot"
        );
        let regranted = spent
            .iter()
            .filter(|key| service.allow(*key, &PLAN).unwrap())
            .count();
        assert_eq!(regranted, 0, "{algorithm}: a spent client was reset");
        // A one-bucket store: every key's two buckets are one.
        let one = self::service(algorithm, 8, hour_rule(limit), &clock);
        for key in 1..=8u64 {
            spend(&one, key, limit);
        }
        assert_eq!(
            one.evictions(),
            0,
            "{algorithm}: the one bucket had free slots"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// (b) A slot being freed by a sweep is waited for, not an active client evicted.
// ---------------------------------------------------------------------------------------------

/// Every slot of the keys' buckets but one per inserting thread holds a spent client (spent at a
/// reading far ahead, so that it stays spent and never idle at the race's readings). Inserting
/// threads keep asking for one permit, each on its own keys, moving the clock on by two windows
/// before each request, so that the state their last request made is idle by then: `same_keys`
/// re-asks a small set of keys (so the key's own idle state, in the bucket, is what the sweepers
/// retire: `needs_settling` is true by the fingerprint), otherwise a new key every time (true
/// only by a retiring bit). Two inserters use a bucket each: a reading taken before the other's
/// requests would see its states, made at later readings, as not idle, and an eviction there
/// would be due. Sweepers (more threads than cores, so one is often descheduled holding a
/// retiring bit) keep freeing the idle states. Nothing may be evicted, and every spent client
/// stays spent.
fn swept_slot_never_makes_an_insert_evict(
    algorithm: Algorithm,
    capacity: usize,
    inserters: usize,
    sweepers: usize,
    same_keys: bool,
    for_how_long: Duration,
) -> Result<(), String> {
    let limit = 2;
    let window = Duration::from_millis(1);
    let clock = FakeClock::new();
    let service = service(
        algorithm,
        capacity,
        Rule::new(limit, window).unwrap(),
        &clock,
    );
    let buckets = capacity / 8;
    // The buckets of inserter `t`'s keys (home, other), its free slot in the last of them: the
    // pair (0, 1) for one inserter of two buckets, else a bucket of its own.
    let pair_of = |t: usize| match (buckets, inserters) {
        (1, _) => (0, 0),
        (_, 1) => (0, 1),
        _ => (t % buckets, t % buckets),
    };
    let spent: Vec<u64> = (0..buckets)
        .flat_map(|bucket| {
            let free = (0..inserters).filter(|&t| pair_of(t).1 == bucket).count();
            (0..8 - free).map(move |i| (bucket, i))
        })
        .map(|(bucket, i)| {
            key_at(
                (1 << 39) | (bucket * 8 + i + 1) as u64,
                bucket,
                bucket,
                buckets,
            )
        })
        .collect();
    assert_eq!(spent.len(), capacity - inserters);
    clock.set(SPENT_AHEAD);
    for &key in &spent {
        spend(&service, key, limit);
    }
    clock.set(Duration::ZERO);
    assert_eq!(service.evictions(), 0);
    let stop = Arc::new(AtomicBool::new(false));
    let inserting: Vec<_> = (0..inserters)
        .map(|t| {
            let (service, stop, clock) = (Arc::clone(&service), Arc::clone(&stop), clock.clone());
            let (home, other) = pair_of(t);
            thread::spawn(move || {
                let mut n = 0u64;
                let mut seed = 0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1);
                let mut first_eviction = None;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let serial = if same_keys { 1 + n % 2 } else { n };
                    let key = key_at(((t as u64 + 1) << 36) | serial, home, other, buckets);
                    // The state this thread's last request made is idle from here on (the
                    // sliding window counter weighs the window before the current one).
                    clock.advance(2 * window);
                    // Granted unless an eviction took a spent client: its counts end a million
                    // seconds on, and so would every new state's start (the count of evictions
                    // checked at the end tells).
                    let _ = service.allow(&key, &PLAN).expect("a decision");
                    // A pause of varying length: the idle state sits for the sweepers to take,
                    // and the next insert meets their retiring bit at every phase.
                    for _ in 0..(xorshift(&mut seed) % 512) {
                        std::hint::spin_loop();
                    }
                    if first_eviction.is_none() && service.evictions() > 0 {
                        first_eviction = Some(n);
                    }
                }
                (n, first_eviction)
            })
        })
        .collect();
    let sweeping: Vec<_> = (0..sweepers)
        .map(|_| {
            let (service, stop) = (Arc::clone(&service), Arc::clone(&stop));
            thread::spawn(move || {
                let (mut sweeps, mut freed) = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    freed += service.sweep() as u64;
                    sweeps += 1;
                }
                (sweeps, freed)
            })
        })
        .collect();
    thread::sleep(for_how_long);
    stop.store(true, Ordering::Relaxed);
    let (mut inserts, mut first) = (0, Vec::new());
    for thread in inserting {
        let (n, f) = thread.join().unwrap();
        inserts += n;
        first.push(f);
    }
    let (mut sweeps, mut freed) = (0, 0);
    for thread in sweeping {
        let (s, f) = thread.join().unwrap();
        sweeps += s;
        freed += f;
    }
    let evictions = service.evictions();
    let reset = spent
        .iter()
        .filter(|key| service.allow(*key, &PLAN).unwrap())
        .count();
    eprintln!(
        "swept slot {algorithm} capacity {capacity} inserters {inserters} sweepers {sweepers} same \
         keys {same_keys}: {inserts} requests, {sweeps} sweeps freed {freed}, evictions \
         {evictions} (first after {first:?}), spent clients reset {reset}"
    );
    if evictions == 0 && reset == 0 {
        Ok(())
    } else {
        Err(format!(
            "{algorithm} capacity {capacity} inserters {inserters} same keys {same_keys}: \
             {evictions} evictions, {reset} spent clients reset, while every insert had a slot \
             idle, free or being freed ({inserts} requests, {sweeps} sweeps, first eviction after \
             {first:?})"
        ))
    }
}

#[test]
fn a_slot_being_swept_is_waited_for_never_an_active_client_evicted() {
    let _serial = serial();
    let each = hammer_for() / 4;
    let dog = Watchdog::start(each * 40 + Duration::from_secs(60), "swept slot".into());
    let mut failures = Vec::new();
    for algorithm in STORE_METHODS {
        for (capacity, inserters, sweepers) in [(8, 1, 2), (16, 1, 2), (16, 2, 2)] {
            for same_keys in [true, false] {
                if let Err(failure) = swept_slot_never_makes_an_insert_evict(
                    algorithm, capacity, inserters, sweepers, same_keys, each,
                ) {
                    failures.push(failure);
                }
            }
        }
    }
    dog.finish();
    assert!(failures.is_empty(), "{failures:#?}");
}

// ---------------------------------------------------------------------------------------------
// (c) Rule changes: a grant is made under the limits of its own version, at most their worth.
// ---------------------------------------------------------------------------------------------

/// The limits of version `v` (0 the builder's): one limit, or (every third version) two; every
/// rule's window unique to its version, so that a grant's `window()` names the version that
/// decided it.
fn limits_of(v: u64) -> Vec<Rule> {
    let window = |k: u64| Duration::from_secs(3600 * (k + 1)) + Duration::from_micros(v);
    let first = 2 + v % 4;
    if v % 3 == 2 {
        vec![
            Rule::new(first, window(0)).unwrap(),
            Rule::new(first + 2, window(1)).unwrap(),
        ]
    } else {
        vec![Rule::new(first, window(0)).unwrap()]
    }
}

/// The version a decision's rule belongs to.
fn version_of(rule_window: Duration) -> u64 {
    (rule_window.as_micros() % 3_600_000_000) as u64
}

/// Threads hammer few keys placed in colliding buckets of a tiny store while a driver changes
/// the limits (moving the plan between one limit and several) and a sweeper sweeps, the clock
/// standing still: each grant names its version by its window, and the grants of each (client,
/// version) beyond the version's binding limit are, over all, at most one limit per eviction.
fn rule_changes_racing(
    algorithm: Algorithm,
    capacity: usize,
    keys: usize,
    for_how_long: Duration,
) -> Result<(), String> {
    let clock = FakeClock::new();
    let service = Arc::new(
        ServiceBuilder::new(algorithm, clock.clone())
            .plan_limits(PLAN, limits_of(0))
            .capacity(capacity)
            .hasher(Identity)
            .build::<u64>()
            .unwrap(),
    );
    let buckets = capacity / 8;
    // Keys whose buckets overlap: all share bucket 0.
    let keyset: Arc<Vec<u64>> = Arc::new(
        (0..keys)
            .map(|i| {
                let (home, other) = match (buckets, i % 3) {
                    (1, _) => (0, 0),
                    (_, 0) => (0, 0),
                    (_, 1) => (0, 1 + i % (buckets - 1)),
                    _ => (1 + i % (buckets - 1), 0),
                };
                key_at((i as u64) + 1, home, other, buckets)
            })
            .collect(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let hammers: Vec<_> = (0..3u64)
        .map(|h| {
            let (service, stop, keyset) =
                (Arc::clone(&service), Arc::clone(&stop), Arc::clone(&keyset));
            thread::spawn(move || {
                let mut grants: HashMap<(u64, u64), u64> = HashMap::new();
                let mut bad = Vec::new();
                let mut seed = 0x2545_F491_4F6C_DD1D ^ (h + 1);
                while !stop.load(Ordering::Relaxed) {
                    let key = keyset[(xorshift(&mut seed) % keyset.len() as u64) as usize];
                    let decision = service.acquire(&key, &PLAN, 1).unwrap();
                    if decision.is_allowed() {
                        let v = version_of(decision.window());
                        let known = limits_of(v).iter().any(|r| {
                            r.limit() == decision.limit() && r.window() == decision.window()
                        });
                        if !known && bad.len() < 5 {
                            bad.push(format!(
                                "a grant under limit {} window {:?}, no version's",
                                decision.limit(),
                                decision.window()
                            ));
                        }
                        *grants.entry((key, v)).or_default() += 1;
                    }
                }
                (grants, bad)
            })
        })
        .collect();
    let sweeping = {
        let (service, stop) = (Arc::clone(&service), Arc::clone(&stop));
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                service.sweep();
                thread::yield_now();
            }
        })
    };
    let began = Instant::now();
    let mut v = 0;
    while began.elapsed() < for_how_long && v < 60_000 {
        v += 1;
        service.set_limits(&PLAN, limits_of(v)).unwrap();
        for _ in 0..20 {
            std::hint::spin_loop();
        }
        if v % 4 == 0 {
            thread::yield_now();
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut grants: HashMap<(u64, u64), u64> = HashMap::new();
    let mut bad = Vec::new();
    for hammer in hammers {
        let (g, b) = hammer.join().unwrap();
        for (k, n) in g {
            *grants.entry(k).or_default() += n;
        }
        bad.extend(b);
    }
    sweeping.join().unwrap();
    let evictions = service.evictions();
    let largest = 2 + 3;
    let excess: u64 = grants
        .iter()
        .map(|(&(_, ver), &g)| {
            let binding = limits_of(ver).iter().map(Rule::limit).min().unwrap();
            g.saturating_sub(binding)
        })
        .sum();
    let total: u64 = grants.values().sum();
    eprintln!(
        "rule changes {algorithm} capacity {capacity} keys {keys}: {v} versions, {total} grants, \
         excess {excess}, evictions {evictions}"
    );
    if !bad.is_empty() {
        return Err(format!("{algorithm}: {bad:?}"));
    }
    if excess > evictions * largest {
        return Err(format!(
            "{algorithm} capacity {capacity} keys {keys}: {excess} grants beyond their version's \
             limit, {evictions} evictions ({v} versions)"
        ));
    }
    Ok(())
}

#[test]
fn rule_changes_racing_requests_and_sweeps_grant_each_version_at_most_its_limit() {
    let _serial = serial();
    let each = hammer_for() / 3;
    let dog = Watchdog::start(each * 20 + Duration::from_secs(60), "rule changes".into());
    for algorithm in STORE_METHODS {
        for (capacity, keys) in [(8, 6), (8, 8), (16, 12), (16, 16)] {
            rule_changes_racing(algorithm, capacity, keys, each).unwrap();
        }
    }
    dog.finish();
}

// ---------------------------------------------------------------------------------------------
// (d) Evictions: the closest to fresh is taken, and every reset is counted.
// ---------------------------------------------------------------------------------------------

/// Half the slots of the keys' buckets hold spent clients (no permit left: the farthest from
/// fresh), asked again all the time by two threads; two flooders put new clients in the other
/// half (each takes one permit of four, or asks for five and takes none), evicting among
/// themselves; a sweeper sweeps; the clock stands still. A spent client must never be granted
/// (it would be a client evicted while one closer to fresh sat in its buckets), and the flood must
/// have evicted (the race ran).
fn spent_clients_against_a_flood(
    algorithm: Algorithm,
    capacity: usize,
    for_how_long: Duration,
) -> Result<(), String> {
    let limit = 4;
    let clock = FakeClock::new();
    let service = service(algorithm, capacity, hour_rule(limit), &clock);
    let buckets = capacity / 8;
    let pair = move |i: usize| {
        if buckets == 1 {
            (0, 0)
        } else {
            (i % buckets, (i + 1) % buckets)
        }
    };
    let spent: Arc<Vec<u64>> = Arc::new(
        (0..capacity / 2)
            .map(|i| {
                let (h, o) = pair(i);
                key_at((1 << 37) | (i as u64 + 1), h, o, buckets)
            })
            .collect(),
    );
    for &key in spent.iter() {
        spend(&service, key, limit);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let regranted = Arc::new(AtomicU64::new(0));
    let hammers: Vec<_> = (0..2u64)
        .map(|h| {
            let (service, stop, spent, regranted) = (
                Arc::clone(&service),
                Arc::clone(&stop),
                Arc::clone(&spent),
                Arc::clone(&regranted),
            );
            thread::spawn(move || {
                let mut i = h as usize;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    if service.allow(&spent[i % spent.len()], &PLAN).unwrap() {
                        regranted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let flooders: Vec<_> = (0..2u64)
        .map(|f| {
            let (service, stop) = (Arc::clone(&service), Arc::clone(&stop));
            thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let (h, o) = pair(n as usize);
                    let key = key_at(((f + 1) << 34) | n, h, o, buckets);
                    let asked = if n.is_multiple_of(3) { limit + 1 } else { 1 };
                    let decision = service.acquire(&key, &PLAN, asked).unwrap();
                    assert_eq!(
                        decision.is_allowed(),
                        asked == 1,
                        "a new client's first request"
                    );
                }
                n
            })
        })
        .collect();
    let sweeping = {
        let (service, stop) = (Arc::clone(&service), Arc::clone(&stop));
        thread::spawn(move || {
            let mut freed = 0;
            while !stop.load(Ordering::Relaxed) {
                freed += service.sweep();
                thread::yield_now();
            }
            freed
        })
    };
    thread::sleep(for_how_long);
    stop.store(true, Ordering::Relaxed);
    for t in hammers {
        t.join().unwrap();
    }
    let flood: u64 = flooders.into_iter().map(|t| t.join().unwrap()).sum();
    let freed = sweeping.join().unwrap();
    let evictions = service.evictions();
    let at_end: u64 = spent
        .iter()
        .filter(|key| service.allow(*key, &PLAN).unwrap())
        .count() as u64;
    let regranted = regranted.load(Ordering::Relaxed);
    eprintln!(
        "spent vs flood {algorithm} capacity {capacity}: {flood} flood clients, evictions \
         {evictions}, sweeps freed {freed}, spent re-granted {regranted} (at the end {at_end})"
    );
    if regranted + at_end > 0 || evictions == 0 {
        return Err(format!(
            "{algorithm} capacity {capacity}: spent clients re-granted {regranted} during the \
             flood and {at_end} after it, {evictions} evictions (a spent client evicted while a \
             flood client closer to fresh sat in its buckets, or no eviction at all)"
        ));
    }
    Ok(())
}

#[test]
fn spent_clients_against_a_flood_and_sweeps_are_never_the_ones_evicted() {
    let _serial = serial();
    let each = hammer_for() / 3;
    let dog = Watchdog::start(each * 20 + Duration::from_secs(60), "spent vs flood".into());
    for algorithm in STORE_METHODS {
        for capacity in [8, 16, 32] {
            spent_clients_against_a_flood(algorithm, capacity, each).unwrap();
        }
    }
    dog.finish();
}

/// One permit per client, the clock standing still: a client is fresh or spent. Threads hammer
/// three times as many keys as slots, all of whose buckets collide (homes and others among two
/// buckets), while a sweeper sweeps. Every reset of a spent client shows as a grant beyond its
/// first, or as the client reported fresh at the end: those are at most the evictions counted.
#[test]
fn every_reset_of_a_spent_client_in_colliding_buckets_is_counted() {
    let _serial = serial();
    let each = hammer_for() / 3;
    let dog = Watchdog::start(each * 20 + Duration::from_secs(60), "resets counted".into());
    for algorithm in STORE_METHODS {
        for capacity in [8, 16] {
            let clock = FakeClock::new();
            let service = service(algorithm, capacity, hour_rule(1), &clock);
            let buckets = capacity / 8;
            let keys: Arc<Vec<u64>> = Arc::new(
                (0..3 * capacity)
                    .map(|i| {
                        let (h, o) = if buckets == 1 {
                            (0, 0)
                        } else {
                            (i % 2, (i / 2) % 2)
                        };
                        key_at(i as u64 + 1, h, o, buckets)
                    })
                    .collect(),
            );
            let stop = Arc::new(AtomicBool::new(false));
            let workers: Vec<_> = (0..3u64)
                .map(|t| {
                    let (service, stop, keys) =
                        (Arc::clone(&service), Arc::clone(&stop), Arc::clone(&keys));
                    thread::spawn(move || {
                        let mut granted = vec![0u64; keys.len()];
                        let mut seed = 0x5851_F42D_4C95_7F2D ^ (t + 1);
                        while !stop.load(Ordering::Relaxed) {
                            let at = (xorshift(&mut seed) % keys.len() as u64) as usize;
                            granted[at] += u64::from(service.allow(&keys[at], &PLAN).unwrap());
                        }
                        granted
                    })
                })
                .collect();
            let sweeping = {
                let (service, stop) = (Arc::clone(&service), Arc::clone(&stop));
                thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        service.sweep();
                        thread::yield_now();
                    }
                })
            };
            thread::sleep(each);
            stop.store(true, Ordering::Relaxed);
            let mut granted = vec![0u64; keys.len()];
            for w in workers {
                for (g, n) in granted.iter_mut().zip(w.join().unwrap()) {
                    *g += n;
                }
            }
            sweeping.join().unwrap();
            let evictions = service.evictions();
            let extra: u64 = granted.iter().map(|g| g.saturating_sub(1)).sum();
            let fresh_at_end = keys
                .iter()
                .zip(&granted)
                .filter(|&(key, &g)| g > 0 && service.peek(key, &PLAN).unwrap().remaining() == 1)
                .count() as u64;
            eprintln!(
                "resets {algorithm} capacity {capacity}: evictions {evictions}, extra grants \
                 {extra}, fresh at the end {fresh_at_end}"
            );
            assert!(
                evictions > 0,
                "{algorithm}: the race ran without an eviction"
            );
            assert!(
                extra + fresh_at_end <= evictions,
                "{algorithm} capacity {capacity}: {extra} grants beyond one per key and \
                 {fresh_at_end} keys fresh again, but {evictions} evictions counted"
            );
        }
    }
    dog.finish();
}
