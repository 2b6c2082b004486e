//! An outside review of the eviction change of commit 18e0099 (an eviction publishes where its
//! victim's counts end, `counted_up_to`, in `evicted_up_to`), through the public API only.
//!
//! The main oracle is a *twin*: every (client, version of the plan's rule) has a standalone
//! limiter of the same method and rule, made at the service's start (so with the service's
//! origin), asked the same permits at the same readings. A client that is never evicted is
//! never granted more than its twin (idle reuse and sweeps make fresh states at least as strict);
//! an evicted one at most one limit more per counted eviction (the sliding window counter: two).
//! The sum over clients of what they gained over their twins is held to that bound times the
//! evictions counted while the version was the plan's.
//!
//! The second oracle is availability: the instant new clients are made as of never runs ahead
//! of the latest clock reading any request, peek or sweep used, so a client the service does not
//! hold is reported with its whole limit at that reading.
//!
//! Negative control: with this file run against the parent commit (18e0099^, the eviction
//! publishing only the evicting insert's reading), `a_client_evicted_again_and_again_...`,
//! `an_eviction_racing_the_clients_requests_at_older_readings` and both `hot_scripts_...` tests
//! fail; the untargeted `scripts_...` and the long races do not (their sweeps and inserts publish
//! late readings early, which hides that bug), so they are a check of everything else only.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use tollgate::{
    Algorithm, AnyLimiter, Clock, FakeClock, Limiter, LimiterFactory, RateLimiterService, Rule,
    ServiceBuilder,
};

#[path = "support/stress.rs"]
mod stress;

use stress::{Watchdog, serial, xorshift};

const PLAN: &str = "p";
const SEC: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;
/// The window of every rule here.
const W: u64 = SEC;
/// The service's start: not on a window edge, so that the origins are not 0.
const START: u64 = 5 * SEC + 333_333_333;

const STORE_METHODS: [Algorithm; 3] = [
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowCounter,
];

fn at(nanos: u64) -> Duration {
    Duration::from_nanos(nanos)
}

/// What one counted eviction may give back (the documented bound, one permit at a time).
fn per_eviction(algorithm: Algorithm, limit: u64) -> u64 {
    match algorithm {
        Algorithm::SlidingWindowCounter => 2 * limit,
        _ => limit,
    }
}

/// The rule of version `v`: the limit alternates between `base` and `base + 1`, so that each
/// change is one.
fn rule_of(base: u64, v: usize) -> Rule {
    Rule::new(base + (v % 2) as u64, Duration::from_nanos(W)).unwrap()
}

type Service = RateLimiterService<u64, &'static str, FakeClock>;

fn service(algorithm: Algorithm, capacity: usize, rule: Rule, clock: &FakeClock) -> Service {
    ServiceBuilder::new(algorithm, clock.clone())
        .plan(PLAN, rule)
        .capacity(capacity)
        .build::<u64>()
        .unwrap()
}

/// The twins: one standalone limiter per (client, version), made at the service's start.
struct Twins {
    algorithm: Algorithm,
    clock: FakeClock,
    limiters: HashMap<(u64, usize), AnyLimiter<FakeClock>>,
}

impl Twins {
    fn new(algorithm: Algorithm) -> Twins {
        Twins {
            algorithm,
            clock: FakeClock::new(),
            limiters: HashMap::new(),
        }
    }

    /// Whether the twin of (`key`, `version`) grants `n` at `reading`.
    fn acquire(&mut self, key: u64, version: usize, rule: Rule, reading: u64, n: u64) -> bool {
        let Twins {
            algorithm,
            clock,
            limiters,
        } = self;
        let twin = limiters.entry((key, version)).or_insert_with(|| {
            clock.set(at(START));
            LimiterFactory::new(*algorithm)
                .create(rule, clock.clone())
                .unwrap()
        });
        clock.set(at(reading));
        twin.try_acquire_n(n).is_allowed()
    }
}

/// One client's grants: reading, permits, `reset_after` in nanoseconds.
type Grants = Vec<(u64, u64, u64)>;

/// The permits of one client's `grants` (reading, permits, `reset_after` in nanoseconds) beyond
/// what one limiter of `limit` per window may grant: the fixed window and the counter at most
/// `limit` per aligned window, each grant counted in the window its `reset_after` names (the end
/// of that window; the counter's, the start of the window after next); the token bucket at most
/// `limit + floor(limit * s / W)` in the grants whose readings lie in any span `s` (the worst
/// span's overflow).
fn ledger_excess(algorithm: Algorithm, limit: u64, grants: &[(u64, u64, u64)]) -> u64 {
    match algorithm {
        Algorithm::TokenBucket => {
            let mut sorted = grants.to_vec();
            sorted.sort_unstable();
            let (l, w) = (i128::from(limit), i128::from(W));
            let (mut cum, mut min_b, mut worst) = (0_i128, i128::MAX, i128::MIN);
            for &(t, n, _) in &sorted {
                let t = i128::from(t);
                min_b = min_b.min(cum * w - t * l);
                cum += i128::from(n);
                worst = worst.max(cum * w - t * l - min_b);
            }
            if sorted.is_empty() || worst <= l * w {
                0
            } else {
                u64::try_from((worst - l * w + w - 1) / w).unwrap()
            }
        }
        _ => {
            let after = if algorithm == Algorithm::FixedWindow {
                1
            } else {
                2
            };
            let mut per_window: HashMap<u64, u64> = HashMap::new();
            for &(t, n, reset) in grants {
                let end = t + reset;
                assert!(
                    end.is_multiple_of(W),
                    "a reset off a window edge: {t} + {reset}"
                );
                *per_window.entry(end / W - after).or_default() += n;
            }
            per_window.values().map(|c| c.saturating_sub(limit)).sum()
        }
    }
}

// ------------------------------------------------------------------------------------------
// 1. Scripts: a full store, readings in any order (lagging by a few ms, stepped back windows,
//    ahead), sweeps, rule changes, requests of 0, 1, n and more than the limit; twin oracle and
//    availability oracle after every step.
// ------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
struct Shape {
    algorithm: Algorithm,
    capacity: usize,
    keys: u64,
    limit: u64,
    max_n: u64,
    rule_changes: bool,
    sweeps: bool,
    steps: usize,
}

#[derive(Debug, Default, Clone, Copy)]
struct Totals {
    grants: u64,
    twin_grants: u64,
    gained: u64,
    evictions: u64,
    versions: u64,
    stricter_peeks: u64,
    over: u64,
}

/// A reading around `latest` (which it may move on).
fn reading(rng: &mut u64, latest: &mut u64) -> u64 {
    let r = xorshift(rng);
    match r % 20 {
        0..=5 => {
            *latest += xorshift(rng) % (W / 3);
            *latest
        }
        6..=9 => *latest,
        // A few milliseconds behind: another core's reading.
        10..=13 => latest.saturating_sub(xorshift(rng) % (5 * MS)).max(START),
        // Whole windows behind: a clock stepped back.
        14..=16 => latest.saturating_sub(xorshift(rng) % (4 * W)).max(START),
        // Ahead of the latest (which stays): a reading another core took later.
        17 => *latest + xorshift(rng) % W,
        // Just before the current window's edge.
        _ => (*latest / W * W)
            .saturating_sub(1 + xorshift(rng) % 3)
            .max(START),
    }
}

fn script(shape: Shape, seed: u64, totals: &mut Totals) -> Vec<String> {
    let mut failures = Vec::new();
    let mut rng = seed | 1;
    let clock = FakeClock::new();
    clock.set(at(START));
    let algorithm = shape.algorithm;
    let mut v = 0_usize;
    let svc = service(algorithm, shape.capacity, rule_of(shape.limit, v), &clock);
    let mut twins = Twins::new(algorithm);
    let mut grants: HashMap<(u64, usize), (u64, u64)> = HashMap::new();
    let mut ledger: HashMap<(u64, usize), Grants> = HashMap::new();
    let mut evictions_in = vec![0_u64];
    let mut evictions_seen = 0;
    let mut latest = START;
    let mut max_reading = START;
    let mut fresh_key = 1_u64 << 60;
    for step in 0..shape.steps {
        let now = reading(&mut rng, &mut latest);
        let limit = rule_of(shape.limit, v).limit();
        clock.set(at(now));
        max_reading = max_reading.max(now);
        match xorshift(&mut rng) % 100 {
            80..=87 if shape.sweeps => {
                svc.sweep();
            }
            88..=91 => {
                let key = xorshift(&mut rng) % shape.keys;
                let peeked = svc.peek(&key, &PLAN).unwrap();
                assert!(peeked.remaining() <= peeked.limit());
            }
            92..=93 if shape.rule_changes => {
                v += 1;
                evictions_in.push(0);
                svc.set_rule(&PLAN, rule_of(shape.limit, v)).unwrap();
            }
            _ => {
                // A hot client half the time.
                let key = if xorshift(&mut rng).is_multiple_of(2) {
                    0
                } else {
                    xorshift(&mut rng) % shape.keys
                };
                let n = match xorshift(&mut rng) % 40 {
                    0 => 0,
                    1 | 2 => limit + 1,
                    _ => 1 + xorshift(&mut rng) % shape.max_n.min(limit),
                };
                let decision = svc.acquire(&key, &PLAN, n).unwrap();
                let allowed = decision.is_allowed();
                if allowed && n > 0 {
                    let reset = u64::try_from(decision.reset_after().as_nanos()).unwrap();
                    ledger.entry((key, v)).or_default().push((now, n, reset));
                }
                let twin = twins.acquire(key, v, rule_of(shape.limit, v), now, n);
                let entry = grants.entry((key, v)).or_default();
                if allowed {
                    entry.0 += n;
                    totals.grants += n;
                }
                if twin {
                    entry.1 += n;
                    totals.twin_grants += n;
                }
            }
        }
        let evictions = svc.evictions();
        evictions_in[v] += evictions - evictions_seen;
        totals.evictions += evictions - evictions_seen;
        evictions_seen = evictions;
        // Availability: a client the service does not hold, at the latest reading used so far,
        // has its whole limit; a few milliseconds behind it, count how often it has less.
        let limit = rule_of(shape.limit, v).limit();
        clock.set(at(max_reading));
        fresh_key += 1;
        let peeked = svc.peek(&fresh_key, &PLAN).unwrap();
        if peeked.remaining() != limit && failures.len() < 8 {
            failures.push(format!(
                "seed {seed:#x} step {step}: a new client at the latest reading {max_reading} \
                 has {} of {limit}",
                peeked.remaining()
            ));
        }
        clock.set(at(max_reading.saturating_sub(2 * MS).max(START)));
        if svc.peek(&fresh_key, &PLAN).unwrap().remaining() < limit {
            totals.stricter_peeks += 1;
        }
    }
    totals.versions += v as u64 + 1;
    // The twin oracle, per version.
    let slack = if shape.max_n > 1 && algorithm == Algorithm::TokenBucket {
        // Under requests of several permits a token bucket's grant of n can overshoot by n - 1
        // (documented), once per client.
        (shape.max_n - 1) * shape.keys
    } else {
        0
    };
    // Under requests of several permits, all or nothing, the counter's twin is no oracle: a
    // stricter state that refuses a request of n can grant more later, its windows weighing
    // less (seen with no eviction at all). The ledger holds it instead.
    let twin_oracle = shape.max_n == 1 || algorithm != Algorithm::SlidingWindowCounter;
    for (version, &evictions) in evictions_in.iter().enumerate() {
        let limit = rule_of(shape.limit, version).limit();
        let over: u64 = ledger
            .iter()
            .filter(|((_, gv), _)| *gv == version)
            .map(|(_, grants)| ledger_excess(algorithm, limit, grants))
            .sum();
        totals.over += over;
        let allowed = (per_eviction(algorithm, limit) + shape.max_n - 1) * evictions;
        if over > allowed {
            failures.push(format!(
                "seed {seed:#x} version {version}: {over} permits beyond the method's \
                 per-window (span) bound; {evictions} evictions allow {allowed}"
            ));
        }
        if !twin_oracle {
            continue;
        }
        let mut gained = 0;
        let mut worst = String::new();
        for (&(key, gv), &(by_service, by_twin)) in &grants {
            if gv == version && by_service > by_twin {
                gained += by_service - by_twin;
                worst = format!("client {key}: {by_service} permits, its twin {by_twin}");
            }
        }
        totals.gained += gained;
        let allowed = per_eviction(algorithm, limit) * evictions + slack;
        if gained > allowed {
            failures.push(format!(
                "seed {seed:#x} version {version}: the clients gained {gained} permits over \
                 their twins; {evictions} evictions allow {allowed} ({worst})"
            ));
        }
    }
    failures
}

/// A script (`script` or `hot_script`) of `shape` for each of `seeds` seeds, until eight
/// failures.
fn run_scripts(shape: Shape, seeds: u64, script: fn(Shape, u64, &mut Totals) -> Vec<String>) {
    let mut totals = Totals::default();
    let mut failures = Vec::new();
    for seed in 1..=seeds {
        failures.extend(script(
            shape,
            seed.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            &mut totals,
        ));
        if failures.len() >= 8 {
            break;
        }
    }
    eprintln!("{shape:?}: {totals:?}");
    assert!(failures.is_empty(), "{shape:?}\n{failures:#?}");
}

/// One permit at a time, a store of one bucket (eight slots) and eleven clients: every
/// method's clients gain at most the documented bound per counted eviction, and new clients are
/// whole at the latest reading.
#[test]
fn scripts_of_single_permits_hold_the_bound_per_eviction() {
    for algorithm in STORE_METHODS {
        for limit in [1, 3] {
            run_scripts(
                Shape {
                    algorithm,
                    capacity: 8,
                    keys: 11,
                    limit,
                    max_n: 1,
                    rule_changes: false,
                    sweeps: true,
                    steps: 400,
                },
                400,
                script,
            );
        }
    }
}

/// As above, with rule changes (each version its own twins and evictions) and two buckets.
#[test]
fn scripts_with_rule_changes_and_two_buckets_hold_the_bound_per_eviction() {
    for algorithm in STORE_METHODS {
        run_scripts(
            Shape {
                algorithm,
                capacity: 16,
                keys: 20,
                limit: 2,
                max_n: 1,
                rule_changes: true,
                sweeps: true,
                steps: 500,
            },
            300,
            script,
        );
    }
}

/// Requests of several permits (up to 3 of a limit of 4 or 5).
#[test]
fn scripts_of_several_permits_hold_the_bound_per_eviction() {
    for algorithm in STORE_METHODS {
        run_scripts(
            Shape {
                algorithm,
                capacity: 8,
                keys: 10,
                limit: 4,
                max_n: 3,
                rule_changes: true,
                sweeps: true,
                steps: 400,
            },
            400,
            script,
        );
    }
}

/// A hot client's script: seven fillers spent at [`FAR`] (never idle, never evicted), the hot
/// client (key 0) in the last slot, and new clients (each asking once, never again) inserted at
/// readings that often lag: each eviction such an insert counts takes the hot client (or the
/// untouched state of the insert before, which no one asks with again), and the hot client's own
/// inserts evict only such states. So the hot client alone may gain, by the bound per eviction
/// counted at a new client's insert: a tight oracle. Sweeps and rule changes (after which the
/// fillers are spent again) mixed in.
fn hot_script(shape: Shape, seed: u64, totals: &mut Totals) -> Vec<String> {
    let mut failures = Vec::new();
    let mut rng = seed | 1;
    let clock = FakeClock::new();
    clock.set(at(START));
    let algorithm = shape.algorithm;
    let mut v = 0_usize;
    let svc = service(algorithm, 8, rule_of(shape.limit, v), &clock);
    let spend_fillers = |svc: &Service| {
        clock.set(at(FAR));
        for key in 1..=7 {
            while svc.allow(&key, &PLAN).unwrap() {}
        }
    };
    spend_fillers(&svc);
    let mut twins = Twins::new(algorithm);
    let (mut by_service, mut by_twin) = (vec![0_u64], vec![0_u64]);
    let mut hot_grants: Vec<Grants> = vec![Vec::new()];
    let mut hot_evictions = vec![0_u64];
    let mut evictions_seen = svc.evictions();
    let mut latest = START;
    let mut new_key = 1_000_u64;
    let trace = std::env::var("TRACE_HOT").is_ok_and(|t| t == format!("{seed:#x}{algorithm:?}"));
    for step in 0..shape.steps {
        let now = reading(&mut rng, &mut latest);
        let limit = rule_of(shape.limit, v).limit();
        clock.set(at(now));
        let mut by_new_client = false;
        match xorshift(&mut rng) % 100 {
            0..=14 => {
                new_key += 1;
                by_new_client = true;
                let n = if xorshift(&mut rng).is_multiple_of(2) {
                    1
                } else {
                    limit + 1
                };
                let allowed = svc.acquire(&new_key, &PLAN, n).unwrap().is_allowed();
                if trace {
                    eprintln!("{step} t={now}: new client {new_key} asks {n}: {allowed}");
                }
            }
            15..=18 if shape.sweeps => {
                let freed = svc.sweep();
                if trace {
                    eprintln!("{step} t={now}: sweep freed {freed}");
                }
            }
            19 if shape.rule_changes => {
                v += 1;
                svc.set_rule(&PLAN, rule_of(shape.limit, v)).unwrap();
                spend_fillers(&svc);
                by_service.push(0);
                by_twin.push(0);
                hot_grants.push(Vec::new());
                hot_evictions.push(0);
                if trace {
                    eprintln!("{step} t={now}: rule change to v{v}");
                }
            }
            _ => {
                let n = 1 + xorshift(&mut rng) % shape.max_n.min(limit);
                let decision = svc.acquire(&0, &PLAN, n).unwrap();
                let twin = twins.acquire(0, v, rule_of(shape.limit, v), now, n);
                if decision.is_allowed() {
                    by_service[v] += n;
                    let reset = u64::try_from(decision.reset_after().as_nanos()).unwrap();
                    hot_grants[v].push((now, n, reset));
                }
                if twin {
                    by_twin[v] += n;
                }
                if trace {
                    eprintln!(
                        "{step} t={now}: hot asks {n}: {}, twin {twin}",
                        decision.is_allowed()
                    );
                }
            }
        }
        let evictions = svc.evictions();
        if by_new_client {
            hot_evictions[v] += evictions - evictions_seen;
        }
        totals.evictions += evictions - evictions_seen;
        evictions_seen = evictions;
    }
    totals.versions += v as u64 + 1;
    for version in 0..=v {
        let limit = rule_of(shape.limit, version).limit();
        totals.grants += by_service[version];
        totals.twin_grants += by_twin[version];
        let gained = by_service[version].saturating_sub(by_twin[version]);
        totals.gained += gained;
        let over = ledger_excess(algorithm, limit, &hot_grants[version]);
        totals.over += over;
        let evictions = hot_evictions[version];
        let allowed = per_eviction(algorithm, limit) * evictions;
        let twin_oracle = shape.max_n == 1 || algorithm != Algorithm::SlidingWindowCounter;
        let slack = if algorithm == Algorithm::TokenBucket {
            shape.max_n - 1
        } else {
            0
        };
        if twin_oracle && gained > allowed + slack {
            failures.push(format!(
                "seed {seed:#x} version {version}: the hot client gained {gained} permits over \
                 its twin ({} against {}); {evictions} evictions of it allow {allowed}",
                by_service[version], by_twin[version]
            ));
        }
        if over > (per_eviction(algorithm, limit) + shape.max_n - 1) * evictions {
            failures.push(format!(
                "seed {seed:#x} version {version}: {over} permits beyond the method's \
                 per-window (span) bound; {evictions} evictions of it"
            ));
        }
    }
    failures
}

/// One permit at a time: the hot client gains at most the bound per eviction of it.
#[test]
fn hot_scripts_of_single_permits_hold_the_bound_per_eviction_of_the_client() {
    for algorithm in STORE_METHODS {
        for limit in [1, 3] {
            for sweeps in [false, true] {
                run_scripts(
                    Shape {
                        algorithm,
                        capacity: 8,
                        keys: 1,
                        limit,
                        max_n: 1,
                        rule_changes: sweeps,
                        sweeps,
                        steps: 500,
                    },
                    300,
                    hot_script,
                );
            }
        }
    }
}

/// Several permits at a time (the token bucket's overshoot of n - 1 allowed once).
#[test]
fn hot_scripts_of_several_permits_hold_the_bound_per_eviction_of_the_client() {
    for algorithm in STORE_METHODS {
        run_scripts(
            Shape {
                algorithm,
                capacity: 8,
                keys: 1,
                limit: 4,
                max_n: 3,
                rule_changes: true,
                sweeps: true,
                steps: 500,
            },
            300,
            hot_script,
        );
    }
}

// ------------------------------------------------------------------------------------------
// 2. Targeted: one client evicted again and again at a reading stepped back, walking its
//    windows again each time; an eviction at a reading a few milliseconds behind, and what new
//    clients of the lagging thread then get.
// ------------------------------------------------------------------------------------------

/// Far ahead of every other reading: fillers spent there are never idle, and have nothing left
/// at any earlier reading (they are never evicted: of states equally far from fresh, an
/// eviction takes the last slot's).
const FAR: u64 = 1_000 * W;

/// Seven fillers spent at [`FAR`] fill slots 0 to 6; the client under watch (key 0) takes
/// slot 7, the last, which an eviction takes among states equally far from fresh.
fn full_store(algorithm: Algorithm, rule: Rule, clock: &FakeClock) -> Service {
    let svc = service(algorithm, 8, rule, clock);
    clock.set(at(FAR));
    for key in 1..=7 {
        while svc.allow(&key, &PLAN).unwrap() {}
    }
    svc
}

/// The client walks single permits over windows 10 to 19 (`tries` at each reading), then, `rounds`
/// times, a new client evicts it at `back` and it walks them all again. Its permits beyond its
/// twin's (asked the same at the same readings), and the evictions counted.
fn walked_again(algorithm: Algorithm, limit: u64, back: u64, rounds: u64) -> (u64, u64, u64) {
    let clock = FakeClock::new();
    clock.set(at(START));
    let rule = Rule::new(limit, Duration::from_nanos(W)).unwrap();
    let svc = full_store(algorithm, rule, &clock);
    let mut twins = Twins::new(algorithm);
    let walk: Vec<u64> = (10..20).map(|k| k * W + W / 2).collect();
    let (mut by_service, mut by_twin) = (0, 0);
    let mut walk_once = |svc: &Service| {
        for &reading in &walk {
            for _ in 0..limit + 2 {
                clock.set(at(reading));
                by_service += u64::from(svc.allow(&0, &PLAN).unwrap());
                by_twin += u64::from(twins.acquire(0, 0, rule, reading, 1));
            }
        }
    };
    walk_once(&svc);
    for round in 0..rounds {
        clock.set(at(back));
        // A new client's first permit (granted or not: its state is made as of where the
        // evicted client's counts end, which may be after `back`).
        let evictor = 100 + round;
        let _ = svc.allow(&evictor, &PLAN).unwrap();
        walk_once(&svc);
    }
    (by_service, by_twin, svc.evictions())
}

/// Five rounds of evictions at a reading stepped back nine windows (and at one a millisecond
/// behind the latest, across its edge): never more than the bound per counted eviction.
#[test]
fn a_client_evicted_again_and_again_at_a_stepped_back_reading_gains_the_bound_per_eviction() {
    let mut failures = Vec::new();
    for algorithm in STORE_METHODS {
        for limit in [1, 2, 5] {
            for back in [10 * W + W / 2, 19 * W - MS, 15 * W] {
                let (by_service, by_twin, evictions) = walked_again(algorithm, limit, back, 5);
                let gained = by_service.saturating_sub(by_twin);
                // Each round evicts the client once; its return evicts the evictor's untouched
                // state (as of where the client's counts ended, so not idle at the walk's first
                // reading), which no one asks with again: the client may gain the bound once a
                // round.
                let allowed = per_eviction(algorithm, limit) * evictions.min(5);
                eprintln!(
                    "{algorithm:?} {limit}/s, evicted at {back}: {by_service} permits, twin \
                     {by_twin}, {evictions} evictions (allowed {allowed})"
                );
                if gained > allowed {
                    failures.push(format!(
                        "{algorithm:?} {limit}/s evicted at {back}: gained {gained}, \
                         {evictions} evictions allow {allowed}"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The client spends 100 per second at `latest`; another thread's new client, reading `lag`
/// behind, evicts it. What that new client's first permit gets, and what a new client reading
/// `d` behind the latest then has (peek), for each method: never less than the limit at the
/// latest reading, and the strictness of a lagging thread, printed.
#[test]
fn new_clients_of_a_thread_lagging_by_milliseconds() {
    let limit = 100;
    let rule = Rule::new(limit, Duration::from_nanos(W)).unwrap();
    let mut failures = Vec::new();
    for algorithm in STORE_METHODS {
        for latest in [10 * W + W / 2, 10 * W + 2 * MS] {
            for lag in [MS, 3 * MS] {
                let clock = FakeClock::new();
                clock.set(at(START));
                let svc = full_store(algorithm, rule, &clock);
                clock.set(at(latest));
                while svc.allow(&0, &PLAN).unwrap() {}
                clock.set(at(latest - lag));
                let first = svc.acquire(&100, &PLAN, 1).unwrap();
                let evictions = svc.evictions();
                let mut row = Vec::new();
                for (i, d) in [0, MS, 3 * MS, 5 * MS, 10 * MS].into_iter().enumerate() {
                    clock.set(at(latest - d));
                    let remaining = svc.peek(&(200 + i as u64), &PLAN).unwrap().remaining();
                    row.push(format!("-{}ms: {remaining}", d / MS));
                    if d == 0 && remaining != limit {
                        failures.push(format!(
                            "{algorithm:?} latest {latest}: a new client at the latest reading \
                             has {remaining} of {limit}"
                        ));
                    }
                }
                eprintln!(
                    "{algorithm:?}, latest {} ms into its window, evicted {} ms behind \
                     ({evictions} eviction): the evicting client's first permit {}; new \
                     clients {}",
                    (latest % W) / MS,
                    lag / MS,
                    if first.is_allowed() {
                        "granted".to_string()
                    } else {
                        format!("refused (retry after {:?})", first.retry_after())
                    },
                    row.join(", ")
                );
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

// ------------------------------------------------------------------------------------------
// 3. Arithmetic: a large origin and readings past the horizon.
// ------------------------------------------------------------------------------------------

/// The client spends its limit at `latest`; a new client at `latest - lag` evicts it; a new
/// client at `latest` (and at the clock's last reading) has its whole limit.
fn evicted_then_new_client_whole(
    algorithm: Algorithm,
    rule: Rule,
    start: u64,
    latest: u64,
    lag: u64,
) -> Result<(), String> {
    let clock = FakeClock::new();
    clock.set(at(start));
    let svc = service(algorithm, 8, rule, &clock);
    clock.set(at(latest - lag));
    for key in 1..=7 {
        while svc.allow(&key, &PLAN).unwrap() {}
    }
    clock.set(at(latest));
    let mut spent = 0;
    while svc.allow(&0, &PLAN).unwrap() {
        spent += 1;
        if spent > rule.limit() {
            return Err(format!("{algorithm:?}: {spent} granted under {rule:?}"));
        }
    }
    clock.set(at(latest - lag));
    // A new client's first permit, at the lagging reading: it evicts (granted or not).
    let _ = svc.allow(&100, &PLAN).unwrap();
    if svc.evictions() != 1 {
        return Err(format!("{algorithm:?}: {} evictions", svc.evictions()));
    }
    for (key, reading) in [(200, latest), (201, u64::MAX)] {
        clock.set(at(reading));
        let remaining = svc.peek(&key, &PLAN).unwrap().remaining();
        if remaining != rule.limit() {
            return Err(format!(
                "{algorithm:?} {rule:?}, start {start}, evicted with counts at {latest}: a new \
                 client at {reading} has {remaining} of {}",
                rule.limit()
            ));
        }
    }
    // And the evicted client, back at its latest reading, no more than a limit.
    clock.set(at(latest));
    let mut again = 0;
    while svc.allow(&0, &PLAN).unwrap() {
        again += 1;
        if again > per_eviction(algorithm, rule.limit()) {
            return Err(format!(
                "{algorithm:?}: {again} granted again after one eviction"
            ));
        }
    }
    Ok(())
}

/// A service started near the end of the clock (origin 2^64 - 100 s), and one whose readings
/// pass the token bucket's horizon (2^63 ticks: for 3 per second, a tick is a third of a
/// nanosecond, so about 97 years) and the fixed window's (2^42 - 1 windows of 100 us, 13.9
/// years): `counted_up_to` neither saturates ahead of the readings nor rounds past them.
#[test]
fn counted_up_to_with_a_large_origin_and_past_the_horizon() {
    let mut failures = Vec::new();
    let late = u64::MAX - 100 * SEC;
    for algorithm in STORE_METHODS {
        for limit in [1, 3, 7] {
            let rule = Rule::new(limit, Duration::from_nanos(W)).unwrap();
            for (latest, lag) in [(late + 50 * SEC + 123, 3 * MS), (u64::MAX - 1, W / 2)] {
                if let Err(e) = evicted_then_new_client_whole(algorithm, rule, late, latest, lag) {
                    failures.push(e);
                }
            }
        }
    }
    // The token bucket past its horizon: 3 per second, a third of a nanosecond per tick.
    let rule = Rule::new(3, Duration::from_nanos(W)).unwrap();
    let horizon = (1_u64 << 63) / 3;
    for (latest, lag) in [
        (horizon + 1, 0),
        (horizon + 2, 1),
        (horizon + 5 * SEC, 2 * SEC),
    ] {
        if let Err(e) =
            evicted_then_new_client_whole(Algorithm::TokenBucket, rule, 0, latest + START, lag)
        {
            failures.push(e);
        }
    }
    // The fixed window past its last index.
    let rule = Rule::new(3, Duration::from_micros(100)).unwrap();
    let last_window = ((1_u64 << 42) - 1) * 100_000;
    for (latest, lag) in [(last_window + 5, 3), (last_window + 3 * SEC, SEC)] {
        if let Err(e) = evicted_then_new_client_whole(Algorithm::FixedWindow, rule, 0, latest, lag)
        {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

// ------------------------------------------------------------------------------------------
// 4. Real threads: an evicting thread whose readings lag (a few ms, or windows), with sweeps,
//    racing the requests of the client it evicts, which read back and forth.
// ------------------------------------------------------------------------------------------

thread_local! {
    /// This thread's clock reading.
    static NOW: Cell<u64> = const { Cell::new(START) };
}

/// Each thread reads its own time: readings out of order across threads, exactly known.
#[derive(Debug, Clone, Copy)]
struct ThreadClock;

impl Clock for ThreadClock {
    fn now_nanos(&self) -> u64 {
        NOW.get()
    }
}

type ThreadService = RateLimiterService<u64, &'static str, ThreadClock>;

/// [`full_store`] on this thread's clock, shared between threads: a bucket of eight slots made
/// at [`START`], seven fillers spent at [`FAR`] (the clock left there).
fn full_thread_store(algorithm: Algorithm, rule: Rule) -> Arc<ThreadService> {
    NOW.set(START);
    let svc: Arc<ThreadService> = Arc::new(
        ServiceBuilder::new(algorithm, ThreadClock)
            .plan(PLAN, rule)
            .capacity(8)
            .build::<u64>()
            .unwrap(),
    );
    NOW.set(FAR);
    for key in 1..=7 {
        while svc.allow(&key, &PLAN).unwrap() {}
    }
    svc
}

#[derive(Debug, Clone, Copy)]
enum Walk {
    /// The client's time moves on a little each request, and now and then it reads up to
    /// `back` behind its latest; the other thread reads up to `lag` behind the client's latest.
    Forward { back: u64, lag: u64 },
    /// The client walks windows 10 to 19 again and again (its clock stepped back nine windows
    /// at each pass); the other thread reads in window 10 (its clock lags that much).
    Passes,
}

#[derive(Debug, Default)]
struct RaceOutcome {
    by_service: u64,
    by_twin: u64,
    requests: u64,
    evictions: u64,
    /// Evictions counted while the other thread's insert ran: the client's (or the untouched
    /// state of the insert before); the client's own inserts evict only the latter.
    at_inserts: u64,
    inserts: u64,
    refused_first: u64,
    max_reading: u64,
}

/// The client under watch (key 0, slot 7 of a full bucket whose fillers are spent at [`FAR`])
/// asks single permits on one thread, as `walk` says; its twin is asked the same. Another thread
/// inserts new clients (one permit each, once), each after the client asked a few times, and
/// sweeps now and then: its inserts evict the client while it asks.
fn race(algorithm: Algorithm, limit: u64, walk: Walk, millis: u64) -> RaceOutcome {
    let rule = Rule::new(limit, Duration::from_nanos(W)).unwrap();
    let svc = full_thread_store(algorithm, rule);
    let stop = Arc::new(AtomicBool::new(false));
    let latest = Arc::new(AtomicU64::new(10 * W));
    let evictor_max = Arc::new(AtomicU64::new(0));
    // The client's requests so far: the evicting thread waits for a few between its inserts, so
    // that most evictions take the client (not the untouched state of the insert before).
    let asked = Arc::new(AtomicU64::new(0));
    // Evictions at the other thread's inserts so far: the race runs on past its time until
    // there are enough to judge by (on a loaded machine the threads may take turns).
    let evicted_so_far = Arc::new(AtomicU64::new(0));
    // The client's requests when the other thread's last insert was made: the client waits for
    // the next insert once it is `CLIENT_AHEAD` requests past it. Otherwise, on a loaded machine
    // where the other thread starts late, the client's time can pass `FAR` (where the fillers
    // become idle and inserts reuse their slots instead of evicting) before the first insert,
    // and the race has nothing to judge by.
    let asked_at_insert = Arc::new(AtomicU64::new(0));
    let dog = Watchdog::start(
        Duration::from_millis(millis) + ENOUGH_EVICTIONS_WITHIN + Duration::from_secs(30),
        format!("{algorithm:?} race"),
    );
    let evictor = {
        let (svc, stop, latest, evictor_max, asked, evicted_so_far, asked_at_insert) = (
            Arc::clone(&svc),
            Arc::clone(&stop),
            Arc::clone(&latest),
            Arc::clone(&evictor_max),
            Arc::clone(&asked),
            Arc::clone(&evicted_so_far),
            Arc::clone(&asked_at_insert),
        );
        thread::spawn(move || {
            let mut rng = 0x2545_F491_4F6C_DD1D_u64;
            let (mut inserts, mut refused_first, mut at_inserts) = (0, 0, 0);
            let mut key = 1_000_u64;
            while !stop.load(Ordering::Relaxed) {
                let reading = match walk {
                    Walk::Forward { lag, .. } => latest
                        .load(Ordering::Relaxed)
                        .saturating_sub(xorshift(&mut rng) % (lag + 1)),
                    Walk::Passes => 10 * W + xorshift(&mut rng) % W,
                };
                NOW.set(reading);
                evictor_max.fetch_max(reading, Ordering::Relaxed);
                if xorshift(&mut rng).is_multiple_of(8) {
                    svc.sweep();
                    continue;
                }
                key += 1;
                inserts += 1;
                // One permit: a request for more than the limit inserts nothing.
                let before = svc.evictions();
                let decision = svc.acquire(&key, &PLAN, 1).unwrap();
                let evicted = svc.evictions() - before;
                at_inserts += evicted;
                evicted_so_far.fetch_add(evicted, Ordering::Relaxed);
                refused_first += u64::from(decision.is_denied());
                // One load for both: the client may run up to `CLIENT_AHEAD` past what is
                // stored here, so the wait below must end before that.
                let asked_then = asked.load(Ordering::Relaxed);
                asked_at_insert.store(asked_then, Ordering::Relaxed);
                // Let the client ask a few times between evictions (a pass or more of its walk).
                let between = match walk {
                    Walk::Forward { .. } => 5 + xorshift(&mut rng) % 100,
                    Walk::Passes => 50 + xorshift(&mut rng) % 300,
                };
                let until = asked_then + between;
                while asked.load(Ordering::Relaxed) < until && !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            }
            (inserts, refused_first, at_inserts)
        })
    };
    let mut outcome = RaceOutcome::default();
    let mut twins = Twins::new(algorithm);
    let mut rng = 0x9E37_79B9_7F4A_7C15_u64;
    let mut time = 10 * W;
    let deadline = Instant::now() + Duration::from_millis(millis);
    let give_up = deadline + ENOUGH_EVICTIONS_WITHIN;
    while Instant::now() < deadline
        || evicted_so_far.load(Ordering::Relaxed) <= ENOUGH_EVICTIONS && Instant::now() < give_up
    {
        let reading = match walk {
            Walk::Forward { back, .. } => {
                time += xorshift(&mut rng) % (W / 100);
                latest.store(time, Ordering::Relaxed);
                if xorshift(&mut rng).is_multiple_of(4) {
                    time - xorshift(&mut rng) % (back + 1)
                } else {
                    time
                }
            }
            Walk::Passes => {
                // Ten readings a window, windows 10 to 19, pass after pass.
                let position = outcome.requests % 100;
                10 * W + position / 10 * W + xorshift(&mut rng) % W
            }
        };
        // No further than `CLIENT_AHEAD` requests past the other thread's last insert (its wait
        // between inserts is shorter, so the two never wait for each other).
        while asked.load(Ordering::Relaxed)
            >= asked_at_insert.load(Ordering::Relaxed) + CLIENT_AHEAD
            && !evictor.is_finished()
        {
            thread::yield_now();
        }
        NOW.set(reading);
        outcome.max_reading = outcome.max_reading.max(reading);
        outcome.requests += 1;
        outcome.by_service += u64::from(svc.allow(&0, &PLAN).unwrap());
        outcome.by_twin += u64::from(twins.acquire(0, 0, rule, reading, 1));
        asked.fetch_add(1, Ordering::Relaxed);
    }
    stop.store(true, Ordering::Relaxed);
    let (inserts, refused_first, at_inserts) = evictor.join().unwrap();
    dog.finish();
    outcome.inserts = inserts;
    outcome.refused_first = refused_first;
    outcome.at_inserts = at_inserts;
    outcome.evictions = svc.evictions();
    outcome.max_reading = outcome.max_reading.max(evictor_max.load(Ordering::Relaxed));
    // Availability after the race: a new client at the latest reading has its whole limit.
    NOW.set(outcome.max_reading);
    let remaining = svc.peek(&u64::MAX, &PLAN).unwrap().remaining();
    assert_eq!(
        remaining, limit,
        "{algorithm:?}: a new client at the latest reading {} has {remaining} of {limit}",
        outcome.max_reading
    );
    outcome
}

/// How many requests the client of a race may make past the other thread's last insert: more
/// than that thread waits for between its inserts (fewer than 350).
const CLIENT_AHEAD: u64 = 1_000;

/// The evictions at the other thread's inserts a race needs to judge by (more than this), and
/// how long past its time it may run to see them.
const ENOUGH_EVICTIONS: u64 = 10;
const ENOUGH_EVICTIONS_WITHIN: Duration = Duration::from_secs(20);

fn check_race(algorithm: Algorithm, walk: Walk) {
    let _one = serial();
    for limit in [1, 4] {
        let outcome = race(algorithm, limit, walk, 1_000);
        let gained = outcome.by_service.saturating_sub(outcome.by_twin);
        let allowed = per_eviction(algorithm, limit) * outcome.at_inserts;
        eprintln!(
            "{algorithm:?} {limit}/s, {walk:?}: {outcome:?}, gained {gained}, allowed {allowed}"
        );
        assert!(
            outcome.at_inserts > ENOUGH_EVICTIONS,
            "too few evictions: {outcome:?}"
        );
        assert!(
            gained <= allowed,
            "{algorithm:?} {limit}/s, {walk:?}: the client gained {gained} permits over its \
             twin; {} evictions at the other thread's inserts allow {allowed} ({outcome:?})",
            outcome.at_inserts
        );
    }
}

const LAGGING_MS: Walk = Walk::Forward {
    back: 3 * W,
    lag: 5 * MS,
};

/// Evictions a few milliseconds behind the client's latest reading, the client reading up to
/// three windows back now and then.
#[test]
fn evictions_lagging_by_milliseconds_racing_the_client_token_bucket() {
    check_race(Algorithm::TokenBucket, LAGGING_MS);
}

#[test]
fn evictions_lagging_by_milliseconds_racing_the_client_fixed_window() {
    check_race(Algorithm::FixedWindow, LAGGING_MS);
}

#[test]
fn evictions_lagging_by_milliseconds_racing_the_client_sliding_window_counter() {
    check_race(Algorithm::SlidingWindowCounter, LAGGING_MS);
}

/// The client walks ten windows again and again; evictions at readings in the first.
#[test]
fn evictions_racing_a_client_whose_clock_steps_back_token_bucket() {
    check_race(Algorithm::TokenBucket, Walk::Passes);
}

#[test]
fn evictions_racing_a_client_whose_clock_steps_back_fixed_window() {
    check_race(Algorithm::FixedWindow, Walk::Passes);
}

#[test]
fn evictions_racing_a_client_whose_clock_steps_back_sliding_window_counter() {
    check_race(Algorithm::SlidingWindowCounter, Walk::Passes);
}

/// Round after round, on a new service each: the client spends its limit at 19.5 s (its state
/// then counts any earlier reading in window 19, so its twin refuses every reading below), then
/// asks single permits at readings walking windows 10 to 18, while another thread's new client
/// evicts it at a reading in window 10, landing somewhere among those requests. The client's
/// insert after the eviction races the eviction's publication of where its counts end: a fresh
/// state made without it would grant the client in every window it walks. Allowed: one limit per
/// counted eviction (and in fact none: no reading reaches window 19 again).
fn eviction_racing_requests_at_older_readings(algorithm: Algorithm, limit: u64, rounds: u64) {
    let rule = Rule::new(limit, Duration::from_nanos(W)).unwrap();
    let barrier = Arc::new(std::sync::Barrier::new(2));
    let slot: Arc<std::sync::Mutex<Option<Arc<ThreadService>>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let evictor = {
        let (barrier, slot, stop) = (Arc::clone(&barrier), Arc::clone(&slot), Arc::clone(&stop));
        thread::spawn(move || {
            let mut rng = 0x2545_F491_4F6C_DD1D_u64;
            loop {
                barrier.wait();
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let svc = slot.lock().unwrap().clone().unwrap();
                for _ in 0..xorshift(&mut rng) % 4_000 {
                    std::hint::spin_loop();
                }
                NOW.set(10 * W + xorshift(&mut rng) % W);
                // One permit: a request for more than the limit inserts nothing, and so evicts
                // no one, and the round waits for an eviction.
                let _decision = svc.acquire(&100, &PLAN, 1).unwrap();
                barrier.wait();
            }
        })
    };
    let dog = Watchdog::start(Duration::from_secs(60), format!("{algorithm:?} rounds"));
    let mut rng = 0x9E37_79B9_7F4A_7C15_u64;
    let (mut gained, mut evictions, mut rounds_with_eviction) = (0, 0, 0);
    let mut failures = Vec::new();
    for round in 0..rounds {
        let svc = full_thread_store(algorithm, rule);
        NOW.set(19 * W + W / 2);
        while svc.allow(&0, &PLAN).unwrap() {}
        *slot.lock().unwrap() = Some(Arc::clone(&svc));
        barrier.wait();
        let mut granted = 0;
        let mut asked_after = 0;
        // Until the eviction, and 200 requests after it.
        while asked_after < 200 {
            let seen = svc.evictions();
            NOW.set(10 * W + xorshift(&mut rng) % (9 * W));
            granted += u64::from(svc.allow(&0, &PLAN).unwrap());
            if seen > 0 {
                asked_after += 1;
            }
        }
        barrier.wait();
        let counted = svc.evictions();
        evictions += counted;
        rounds_with_eviction += u64::from(counted > 0);
        gained += granted;
        if granted > per_eviction(algorithm, limit) * counted && failures.len() < 5 {
            failures.push(format!(
                "round {round}: the client was granted {granted} permits at readings its twin \
                 refuses; {counted} evictions"
            ));
        }
    }
    stop.store(true, Ordering::Relaxed);
    barrier.wait();
    evictor.join().unwrap();
    dog.finish();
    eprintln!(
        "{algorithm:?} {limit}/s: {rounds} rounds, {rounds_with_eviction} with an eviction, \
         {evictions} evictions, {gained} permits granted at older readings"
    );
    assert!(
        failures.is_empty(),
        "{algorithm:?} {limit}/s: {failures:#?}"
    );
}

#[test]
fn an_eviction_racing_the_clients_requests_at_older_readings() {
    let _one = serial();
    for algorithm in STORE_METHODS {
        for limit in [1, 3] {
            eviction_racing_requests_at_older_readings(algorithm, limit, 1_500);
        }
    }
}
