//! Attacks on the salted client store (each holding's state word XORed with a keyed mix of its
//! tag) through the public API: tiny stores (one bucket of 8 slots, or two) whose slots change
//! hands all the time (rule changes, sweeps, evictions, reuse), many more threads than cores,
//! rule changes racing the requests, and looks (`peek`, headers) racing both.
//!
//! Every rule a plan is given is unique (its window differs from every other version's by a few
//! microseconds), so a decision's `limit()` and `window()` name the version it was made under.
//! Per (client, version) and aligned window, grants may be at most that version's limit (the
//! token bucket: at most twice its limit in an aligned window, its burst plus one window's
//! refill; with the clock standing still, at most its limit); each eviction may add one limit's
//! worth for the client it evicted, so the excess over all (client, version, window) is bounded
//! by the evictions times the largest limit. The limits alternate between count-field widths
//! (the sliding window counter's layout depends on them), at the service's first window where
//! the layouts' words coincide, as in `loom-tests/store_layouts.rs`.
//!
//! A look may never report more remaining than its limit, nor a rule the plan never had, nor
//! (with the clock standing still and no eviction) more remaining than the limit less what the
//! client was granted under that rule before the look began. A watchdog aborts a run that hangs.
//!
//! `REVIEW_SALT_MILLIS` sets how long each test hammers (default 2,500 ms).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use tollgate::{Algorithm, Decision, FakeClock, RateLimiterService, Rule, ServiceBuilder};

#[path = "support/stress.rs"]
mod stress;

use stress::{Watchdog, serial, xorshift};

type Service = RateLimiterService<u64, &'static str, FakeClock>;

const PLAN: &str = "salted";
/// Limits of successive versions: count fields of 3, 2, 3, 2, 4, 2, 3, 1, 4 and 2 bits.
const LIMITS: [u64; 10] = [5, 2, 7, 3, 15, 2, 4, 1, 9, 2];
const MAX_LIMIT: u64 = 15;
/// Versions one service goes through (the plan allows 65,535 changes).
const MAX_VERSIONS: usize = 20_000;

fn hammer_for() -> Duration {
    stress::hammer_for("REVIEW_SALT_MILLIS", 2_500)
}

/// The rule of version `v`: a limit of `LIMITS`, and a window of `base` plus `v` microseconds.
fn rule_of(v: usize, base: Duration) -> Rule {
    Rule::new(
        LIMITS[v % LIMITS.len()],
        base + Duration::from_micros(v as u64),
    )
    .expect("a rule")
}

/// The version whose rule a decision reports.
fn version_of(decision: &Decision, base: Duration) -> usize {
    let micros = decision
        .window()
        .checked_sub(base)
        .unwrap_or_else(|| panic!("a window no version has: {decision:?}"))
        .as_micros() as usize;
    assert_eq!(
        decision.limit(),
        LIMITS[micros % LIMITS.len()],
        "a limit no version has with that window: {decision:?}"
    );
    micros
}

#[derive(Debug, Clone, Copy)]
struct Shape {
    algorithm: Algorithm,
    capacity: usize,
    /// Distinct client keys `0..keys`.
    keys: u64,
    workers: usize,
    /// Whether the clock moves (by a quarter of the base window at a time).
    moving: bool,
    /// Sweeps per rule change, about.
    sweep_every: usize,
    /// Spins between two rule changes (a random number below it).
    pause: u32,
}

/// What one shape's runs came to.
#[derive(Debug, Default)]
struct Outcome {
    versions: usize,
    grants: u64,
    evictions: u64,
    /// Over every (client, version, window): grants beyond what the bound allows.
    excess: u64,
    worst: Option<(u64, usize, u64, u64, u64)>,
    peeks: u64,
    look_failures: Vec<String>,
}

/// Grants per (client, version, aligned window of that version).
type Grants = HashMap<(u64, usize, u64), u64>;

fn run(shape: Shape, for_how_long: Duration) -> Outcome {
    let start = Instant::now();
    let mut outcome = Outcome::default();
    while start.elapsed() < for_how_long {
        let left = for_how_long.saturating_sub(start.elapsed());
        one_service(shape, left.max(Duration::from_millis(50)), &mut outcome);
    }
    outcome
}

fn one_service(shape: Shape, for_how_long: Duration, outcome: &mut Outcome) {
    let base = if shape.moving {
        Duration::from_secs(10)
    } else {
        Duration::from_secs(3_600)
    };
    let step = base / 4;
    let clock = FakeClock::new();
    let service: Arc<Service> = Arc::new(
        ServiceBuilder::new(shape.algorithm, clock.clone())
            .plan(PLAN, rule_of(0, base))
            .capacity(shape.capacity)
            .count_decisions(true)
            .build::<u64>()
            .expect("a service"),
    );
    let keys = shape.keys as usize;
    // Grants under each (client, version) so far, for the looks' bound (clock standing still).
    let granted: Arc<Vec<AtomicU64>> = Arc::new(
        (0..keys * MAX_VERSIONS)
            .map(|_| AtomicU64::new(0))
            .collect(),
    );
    let current = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let dog = Watchdog::start(for_how_long + Duration::from_secs(60), format!("{shape:?}"));

    let workers: Vec<_> = (0..shape.workers)
        .map(|w| {
            let service = Arc::clone(&service);
            let granted = Arc::clone(&granted);
            let stop = Arc::clone(&stop);
            let clock = clock.clone();
            thread::spawn(move || {
                let mut seed = 0x9E37_79B9_7F4A_7C15_u64 ^ ((w as u64 + 1) << 32);
                let mut grants: Grants = HashMap::new();
                let mut decisions = 0_u64;
                while !stop.load(Ordering::Relaxed) {
                    let random = xorshift(&mut seed);
                    let key = random % shape.keys;
                    let n = if random >> 60 == 0 { 2 } else { 1 };
                    let before = clock.now_nanos_public();
                    let decision = service.acquire(&key, &PLAN, n).expect("a decision");
                    let after = clock.now_nanos_public();
                    decisions += 1;
                    let v = version_of(&decision, base);
                    assert!(
                        decision.remaining() <= decision.limit(),
                        "a decision reports more than its limit: {decision:?}"
                    );
                    if decision.is_allowed() {
                        granted[key as usize * MAX_VERSIONS + v].fetch_add(n, Ordering::SeqCst);
                        let window = decision.window().as_nanos() as u64;
                        let index = if before / window == after / window {
                            before / window
                        } else {
                            // The clock moved during the decision: the window is unknown.
                            u64::MAX
                        };
                        *grants.entry((key, v, index)).or_default() += n;
                    }
                }
                (grants, decisions)
            })
        })
        .collect();

    let lookers: Vec<_> = (0..2)
        .map(|l| {
            let service = Arc::clone(&service);
            let granted = Arc::clone(&granted);
            let current = Arc::clone(&current);
            let stop = Arc::clone(&stop);
            thread::spawn(move || {
                let mut seed = 0xD1B5_4A32_D192_ED03_u64 ^ ((l as u64 + 7) << 40);
                let mut failures = Vec::new();
                let mut peeks = 0_u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = xorshift(&mut seed) % shape.keys;
                    let v0 = current.load(Ordering::SeqCst);
                    let before = granted[key as usize * MAX_VERSIONS + v0].load(Ordering::SeqCst);
                    let peeked = service.peek(&key, &PLAN).expect("a peek");
                    peeks += 1;
                    let v = version_of(&peeked, base);
                    if peeked.remaining() > peeked.limit() {
                        failures.push(format!("peek beyond its limit: {peeked:?}"));
                    }
                    // An eviction may start the client afresh: the bound holds while none
                    // has happened (read after the look).
                    if !shape.moving
                        && v == v0
                        && before + peeked.remaining() > peeked.limit()
                        && service.evictions() == 0
                    {
                        failures.push(format!(
                            "key {key} version {v}: granted {before} before a peek that reports \
                             {} remaining of {}",
                            peeked.remaining(),
                            peeked.limit()
                        ));
                    }
                    let (policy, ratelimit) = service
                        .ratelimit_headers(&key, &PLAN, "p")
                        .expect("headers");
                    if let Some(failure) = check_headers(&policy, &ratelimit) {
                        failures.push(failure);
                    }
                }
                (failures, peeks)
            })
        })
        .collect();

    // The driver: rule changes, sweeps, and (when the clock moves) the clock.
    let began = Instant::now();
    let mut seed = 0x2545_F491_4F6C_DD1D_u64;
    let mut v = 0;
    while v + 1 < MAX_VERSIONS && began.elapsed() < for_how_long {
        let spins = (xorshift(&mut seed) % u64::from(shape.pause.max(1))) as u32;
        for _ in 0..spins {
            std::hint::spin_loop();
        }
        if spins.is_multiple_of(7) {
            thread::yield_now();
        }
        v += 1;
        service
            .set_rule(&PLAN, rule_of(v, base))
            .expect("a rule change");
        current.store(v, Ordering::SeqCst);
        if shape.sweep_every > 0 && xorshift(&mut seed).is_multiple_of(shape.sweep_every as u64) {
            service.sweep();
        }
        if shape.moving && v % 16 == 0 {
            clock.advance(step);
        }
    }
    stop.store(true, Ordering::SeqCst);

    let mut all: Grants = HashMap::new();
    let mut decisions = 0;
    for worker in workers {
        let (grants, made) = worker.join().expect("a worker panicked");
        decisions += made;
        for (at, count) in grants {
            *all.entry(at).or_default() += count;
        }
    }
    for looker in lookers {
        let (failures, peeks) = looker.join().expect("a looker panicked");
        outcome.peeks += peeks;
        outcome.look_failures.extend(failures);
    }
    dog.finish();

    let evictions = service.evictions();
    // Quiet now: what each client's look reports against what it was granted under the
    // current rule (the clock standing still).
    if !shape.moving && evictions == 0 {
        for key in 0..shape.keys {
            let peeked = service.peek(&key, &PLAN).unwrap();
            let pv = version_of(&peeked, base);
            assert_eq!(
                pv, v,
                "a quiet look reports another version than the current"
            );
            let g = granted[key as usize * MAX_VERSIONS + v].load(Ordering::SeqCst);
            if g + peeked.remaining() > peeked.limit() {
                outcome.look_failures.push(format!(
                    "quiet: key {key} granted {g} under version {v}, peek reports {} of {}",
                    peeked.remaining(),
                    peeked.limit()
                ));
            }
        }
    }
    assert!(
        service.len() <= shape.capacity.div_ceil(8) * 8,
        "the store holds more clients than slots"
    );
    let stats = service.stats(&PLAN).expect("stats");
    assert_eq!(
        stats.allowed + stats.denied,
        decisions,
        "stats count every decision"
    );

    for (&(key, version, index), &count) in &all {
        outcome.grants += count;
        if index == u64::MAX {
            continue;
        }
        let limit = LIMITS[version % LIMITS.len()];
        let bound = if shape.algorithm == Algorithm::TokenBucket && shape.moving {
            2 * limit
        } else {
            limit
        };
        if count > bound {
            outcome.excess += count - bound;
            if outcome
                .worst
                .is_none_or(|(.., worst)| count - bound > worst)
            {
                outcome.worst = Some((key, version, index, count, count - bound));
            }
        }
    }
    outcome.evictions += evictions;
    outcome.versions += v + 1;
}

/// `None` when the headers' figures are possible: `r` at most `q`, `t` a number.
fn check_headers(policy: &str, ratelimit: &str) -> Option<String> {
    let field = |text: &str, name: &str| -> Option<u64> {
        text.split(';')
            .find_map(|part| part.trim().strip_prefix(name))
            .and_then(|value| value.parse().ok())
    };
    let (Some(q), Some(r), Some(_t)) = (
        field(policy, "q="),
        field(ratelimit, "r="),
        field(ratelimit, "t="),
    ) else {
        return Some(format!("unreadable headers: {policy:?} / {ratelimit:?}"));
    };
    (r > q).then(|| format!("headers report {r} remaining of {q}: {policy:?} / {ratelimit:?}"))
}

/// The clock reading, through the public `Clock` trait.
trait NowNanos {
    fn now_nanos_public(&self) -> u64;
}

impl NowNanos for FakeClock {
    fn now_nanos_public(&self) -> u64 {
        tollgate::Clock::now_nanos(self)
    }
}

fn check(shape: Shape) {
    let _one = serial();
    let outcome = run(shape, hammer_for());
    eprintln!(
        "{:?} cap {} keys {} moving {}: {} versions, {} grants, {} evictions, {} looks, excess {}",
        shape.algorithm,
        shape.capacity,
        shape.keys,
        shape.moving,
        outcome.versions,
        outcome.grants,
        outcome.evictions,
        outcome.peeks,
        outcome.excess
    );
    assert!(
        outcome.look_failures.is_empty(),
        "{} impossible looks, first ones: {:#?}",
        outcome.look_failures.len(),
        &outcome.look_failures[..outcome.look_failures.len().min(5)]
    );
    assert!(
        outcome.excess <= outcome.evictions * MAX_LIMIT,
        "over-admission: {} grants beyond the rules over {} evictions (worst: key, version, \
         window, granted, excess = {:?})",
        outcome.excess,
        outcome.evictions,
        outcome.worst
    );
}

const ONE_WORD: [Algorithm; 3] = [
    Algorithm::SlidingWindowCounter,
    Algorithm::FixedWindow,
    Algorithm::TokenBucket,
];

/// Eight clients in one bucket of eight slots: no eviction, so every (client, version) is held
/// to its limit exactly, while rule changes every few microseconds retire and reinsert every
/// client (the slots change hands among them) and sweeps free the idle ones.
#[test]
fn one_bucket_of_clients_racing_rule_changes_never_passes_a_version_limit() {
    for algorithm in ONE_WORD {
        check(Shape {
            algorithm,
            capacity: 1,
            keys: 8,
            workers: 12,
            moving: false,
            sweep_every: 4,
            pause: 4_000,
        });
    }
}

/// Rule changes as fast as the driver can make them, with few sweeps: a decision that found its
/// slot is likely to be descheduled across a change.
#[test]
fn rule_changes_back_to_back_never_pass_a_version_limit() {
    for algorithm in ONE_WORD {
        check(Shape {
            algorithm,
            capacity: 2,
            keys: 6,
            workers: 16,
            moving: false,
            sweep_every: 64,
            pause: 50,
        });
    }
}

/// Three times more clients than slots: evictions all the time; the excess over all (client,
/// version) is bounded by one limit per eviction.
#[test]
fn evicting_stores_racing_rule_changes_gain_at_most_one_limit_per_eviction() {
    for algorithm in ONE_WORD {
        for capacity in [8, 16] {
            check(Shape {
                algorithm,
                capacity,
                keys: 3 * capacity as u64,
                workers: 12,
                moving: false,
                sweep_every: 8,
                pause: 2_000,
            });
        }
    }
}

/// The clock moves a quarter window every 16 rule changes: states go idle and are swept or
/// reused, windows roll; per (client, version, aligned window) at most the limit (the token
/// bucket: twice it), plus one limit per eviction.
#[test]
fn moving_windows_racing_rule_changes_and_sweeps_never_pass_a_window_limit() {
    for algorithm in ONE_WORD {
        for (capacity, keys) in [(1, 8), (8, 20)] {
            check(Shape {
                algorithm,
                capacity,
                keys,
                workers: 12,
                moving: true,
                sweep_every: 4,
                pause: 2_000,
            });
        }
    }
}

/// Clients active in the current window keep their states while idle ones are there to reuse:
/// four exhausted clients and four idle ones fill a bucket; four new clients (many threads
/// racing them, and the exhausted ones asking all along, with sweeps) take the idle slots,
/// evict no one, and the exhausted clients stay refused.
#[test]
fn active_clients_are_not_evicted_while_idle_slots_remain() {
    let _one = serial();
    let window = Duration::from_secs(10);
    let deadline = Instant::now() + hammer_for();
    let mut rounds = 0;
    while Instant::now() < deadline || rounds < 20 {
        rounds += 1;
        for algorithm in ONE_WORD {
            let clock = FakeClock::new();
            let service: Arc<Service> = Arc::new(
                ServiceBuilder::new(algorithm, clock.clone())
                    .plan(PLAN, Rule::new(3, window).unwrap())
                    .capacity(8)
                    .build::<u64>()
                    .unwrap(),
            );
            // Keys 100..104 take one permit, then go idle: the clock moves two windows.
            for key in 100..104 {
                assert!(service.allow(&key, &PLAN).unwrap());
            }
            clock.advance(2 * window);
            // Keys 0..4 exhaust their limit in the current window.
            for key in 0..4 {
                for _ in 0..3 {
                    assert!(service.allow(&key, &PLAN).unwrap());
                }
                assert!(!service.allow(&key, &PLAN).unwrap());
            }
            let stop = Arc::new(AtomicBool::new(false));
            let hot: Vec<_> = (0..6)
                .map(|t| {
                    let service = Arc::clone(&service);
                    let stop = Arc::clone(&stop);
                    thread::spawn(move || {
                        let mut granted = 0;
                        let mut i = t;
                        while !stop.load(Ordering::Relaxed) {
                            granted += u64::from(service.allow(&(i % 4), &PLAN).unwrap());
                            i += 1;
                            if i.is_multiple_of(64) {
                                service.sweep();
                            }
                        }
                        granted
                    })
                })
                .collect();
            // Four new clients, each from its own thread, racing.
            let new: Vec<_> = (200..204)
                .map(|key| {
                    let service = Arc::clone(&service);
                    thread::spawn(move || service.allow(&key, &PLAN).unwrap())
                })
                .collect();
            for thread in new {
                assert!(
                    thread.join().unwrap(),
                    "a new client's first request is granted"
                );
            }
            thread::sleep(Duration::from_millis(2));
            stop.store(true, Ordering::Relaxed);
            let hot_grants: u64 = hot.into_iter().map(|t| t.join().unwrap()).sum();
            assert_eq!(
                service.evictions(),
                0,
                "{algorithm:?}: an active client was evicted while idle slots remained"
            );
            assert_eq!(
                hot_grants, 0,
                "{algorithm:?}: an exhausted client was granted again"
            );
            for key in 200..204 {
                let peeked = service.peek(&key, &PLAN).unwrap();
                assert_eq!(
                    peeked.remaining(),
                    2,
                    "{algorithm:?}: new client {key}'s state"
                );
            }
        }
    }
}

/// A sweep racing a new client's insert, aimed at the instant a sweep holds the one idle slot of
/// a full bucket (its retiring bit set) while the insert looks for a slot to reuse: the insert
/// must not evict one of the seven active clients (the idle slot is there, or free a moment
/// later). Token bucket, one bucket of 8 slots: seven clients kept exhausted, and each round the
/// clock moves on so that the last round's new client (one permit taken) is idle, then a new
/// client comes, while two threads sweep without pause.
#[test]
fn a_sweep_racing_an_insert_never_makes_it_evict_an_active_client() {
    let _one = serial();
    let window = Duration::from_secs(10);
    let clock = FakeClock::new();
    let service: Arc<Service> = Arc::new(
        ServiceBuilder::new(Algorithm::TokenBucket, clock.clone())
            .plan(PLAN, Rule::new(3, window).unwrap())
            .capacity(8)
            .build::<u64>()
            .unwrap(),
    );
    let exhaust = |service: &Service| {
        for key in 0..7 {
            while service.allow(&key, &PLAN).unwrap() {}
        }
    };
    exhaust(&service);
    assert!(service.allow(&1_000, &PLAN).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let sweeper_count = std::env::var("REVIEW_SALT_SWEEPERS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(2);
    let sweepers: Vec<_> = (0..sweeper_count)
        .map(|_| {
            let (service, stop) = (Arc::clone(&service), Arc::clone(&stop));
            thread::spawn(move || {
                let mut sweeps = 0_u64;
                while !stop.load(Ordering::Relaxed) {
                    service.sweep();
                    sweeps += 1;
                }
                sweeps
            })
        })
        .collect();
    let deadline = Instant::now() + hammer_for();
    let mut rounds = 0_u64;
    let mut first_eviction = None;
    while Instant::now() < deadline || rounds < 10_000 {
        rounds += 1;
        // The last new client's one permit is back: idle. The seven stay active (at most one
        // permit back of three), and are exhausted again below.
        clock.advance(Duration::from_secs(4));
        assert!(
            service.allow(&(1_000 + rounds), &PLAN).unwrap(),
            "a new client is granted"
        );
        if service.evictions() != 0 {
            first_eviction = Some(rounds);
            break;
        }
        exhaust(&service);
    }
    stop.store(true, Ordering::Relaxed);
    let sweeps: u64 = sweepers.into_iter().map(|t| t.join().unwrap()).sum();
    eprintln!("{rounds} rounds, {sweeps} sweeps, first eviction: {first_eviction:?}");
    assert_eq!(
        first_eviction, None,
        "an active client was evicted while the bucket's idle slot was being swept"
    );
}
