//! An outside review's attacks on the per-client service (`RateLimiterService`) through its
//! public API only: clock readings that go backwards or arrive out of order across threads
//! (after refusals, evictions, sweeps and rule changes), rule changes (one limit and several)
//! racing decisions, a full store flooded while a hot client is hammered, every method, and
//! acquires of 0, 1, n and more than the limit.
//!
//! The oracles use only what the service answers. Each grant's `Decision` tells where it was
//! counted: the fixed window's `reset_after` ends with the window the permits were counted in,
//! the sliding window counter's at the start of the window after next, the sliding log's one
//! window after the admission's time; the token bucket is checked on readings alone (its TAT
//! rises by `n * T` per grant and stays within a full bucket of the reading, so the permits of
//! the grants whose readings lie in any span `s` are at most `N + floor(N * s / W)`, in whatever
//! order the readings come). Each version of a plan's rules is unique (its window differs by a
//! few microseconds), so a decision names the version it was made under, and each version is
//! checked as a limiter of its own. A counted eviction may add one limit's worth (the documented
//! exception); nothing else may.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use tollgate::{Algorithm, Clock, Decision, FakeClock, RateLimiterService, Rule, ServiceBuilder};

#[path = "support/stress.rs"]
mod stress;

use stress::{Watchdog, serial, xorshift};

const PLAN: &str = "p";
const SEC: u64 = 1_000_000_000;

fn at(nanos: u64) -> Duration {
    Duration::from_nanos(nanos)
}

// ------------------------------------------------------------------------------------------
// Ledgers: what each method may grant, from the grants' readings and reported figures.
// ------------------------------------------------------------------------------------------

/// One grant of the client under watch: its reading, its permits, its `reset_after`.
#[derive(Debug, Clone, Copy)]
struct Grant {
    t: u64,
    n: u64,
    reset: u64,
}

impl Grant {
    fn of(t: u64, n: u64, decision: &Decision) -> Grant {
        Grant {
            t,
            n,
            reset: u64::try_from(decision.reset_after().as_nanos()).unwrap_or(u64::MAX),
        }
    }
}

/// The permits granted beyond what one limiter of `limit` per `window` may grant, over
/// `grants` (all under one version of the rules, for one client), with a note on the worst
/// place.
fn excess(algorithm: Algorithm, limit: u64, window: u64, grants: &[Grant]) -> (u64, String) {
    match algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingWindowCounter => {
            let windows_after = if algorithm == Algorithm::FixedWindow {
                1
            } else {
                2
            };
            let mut per_window: BTreeMap<u64, u64> = BTreeMap::new();
            for grant in grants {
                let end = grant.t + grant.reset;
                let counted_in = (end / window)
                    .checked_sub(windows_after)
                    .expect("a counted window");
                assert_eq!(end % window, 0, "a reset that is no window edge: {grant:?}");
                assert!(
                    counted_in >= grant.t / window,
                    "counted in a window older than its reading: {grant:?}"
                );
                *per_window.entry(counted_in).or_default() += grant.n;
            }
            let over: u64 = per_window.values().map(|c| c.saturating_sub(limit)).sum();
            let worst = per_window
                .iter()
                .max_by_key(|(_, c)| **c)
                .map(|(k, c)| format!("window {k}: {c} of {limit}"))
                .unwrap_or_default();
            (over, worst)
        }
        Algorithm::TokenBucket => {
            // Permits of the grants whose readings lie in [x, y] at most L + floor((y-x) L / W):
            // sum * W <= L * W + (y - x) * L, over every span, in one pass over sorted readings.
            let mut sorted: Vec<Grant> = grants.to_vec();
            sorted.sort_by_key(|g| g.t);
            let (l, w) = (i128::from(limit), i128::from(window));
            let mut cum: i128 = 0;
            let mut min_b: Option<(i128, u64)> = None;
            let mut worst: (i128, u64, u64) = (i128::MIN, 0, 0);
            for grant in &sorted {
                let t = i128::from(grant.t);
                let b = cum * w - t * l;
                if min_b.is_none_or(|(m, _)| b < m) {
                    min_b = Some((b, grant.t));
                }
                cum += i128::from(grant.n);
                let a = cum * w - t * l;
                let (m, from) = min_b.unwrap();
                if a - m > worst.0 {
                    worst = (a - m, from, grant.t);
                }
            }
            if sorted.is_empty() || worst.0 <= l * w {
                return (0, String::new());
            }
            let over = ((worst.0 - l * w) + w - 1) / w;
            let (from, to) = (worst.1, worst.2);
            let granted: u64 = sorted
                .iter()
                .filter(|g| g.t >= from && g.t <= to)
                .map(|g| g.n)
                .sum();
            let bound = limit + (to - from) as u128 as u64 * limit / window;
            (
                over as u64,
                format!("readings {from}..={to}: {granted} permits, bound {bound}"),
            )
        }
        _ => {
            assert_eq!(algorithm, Algorithm::SlidingWindowLog);
            let mut times: Vec<u64> = Vec::new();
            for grant in grants {
                let time = (grant.t + grant.reset)
                    .checked_sub(window)
                    .expect("an admission time");
                assert!(time >= grant.t, "admitted before its reading: {grant:?}");
                times.extend(std::iter::repeat_n(time, grant.n as usize));
            }
            times.sort_unstable();
            let mut worst = (0_u64, 0_u64);
            let mut j = 0;
            for i in 0..times.len() {
                while j < times.len() && times[j] < times[i] + window {
                    j += 1;
                }
                let inside = (j - i) as u64;
                if inside > worst.0 {
                    worst = (inside, times[i]);
                }
            }
            (
                worst.0.saturating_sub(limit),
                format!("{} admissions in [{}, +W)", worst.0, worst.1),
            )
        }
    }
}

// ------------------------------------------------------------------------------------------
// 1. An eviction made at a reading older than the evicted client's: started afresh as of that
//    reading, the client spends again every window it had already spent.
// ------------------------------------------------------------------------------------------

/// Hammers `key` with `tries` single permits at `reading`, recording its grants.
fn hammer_at(
    service: &RateLimiterService<u64, &'static str, FakeClock>,
    clock: &FakeClock,
    key: u64,
    reading: u64,
    tries: usize,
    grants: &mut Vec<Grant>,
) {
    clock.set(at(reading));
    for _ in 0..tries {
        let decision = service.acquire(&key, &PLAN, 1).expect("a decision");
        if decision.is_allowed() {
            grants.push(Grant::of(reading, 1, &decision));
        }
    }
}

/// The script: the hot client (key 0, the last of one full bucket's eight slots; the seven
/// others spent at `back`) takes single permits at each reading of `walk`; then, at the older
/// reading `back` (a clock stepped back, or another core's reading behind), a new client asks
/// for a permit (when `evict`): its insert evicts the hot client, the closest to fresh there
/// (and the hot client's return evicts the new client's state, a second eviction). Then the hot
/// client walks the same readings again. Returns its grants and the evictions counted.
fn evicted_at_an_older_reading(
    algorithm: Algorithm,
    limit: u64,
    walk: &[u64],
    back: u64,
    evict: bool,
) -> (Vec<Grant>, u64) {
    let clock = FakeClock::new();
    let service = ServiceBuilder::new(algorithm, clock.clone())
        .plan(PLAN, Rule::new(limit, Duration::from_secs(1)).unwrap())
        .capacity(8)
        .build::<u64>()
        .unwrap();
    let hot = 0_u64;
    clock.set(at(back));
    for key in 1..=7 {
        while service.allow(&key, &PLAN).unwrap() {}
    }
    let mut grants = Vec::new();
    for &reading in walk {
        hammer_at(&service, &clock, hot, reading, 10, &mut grants);
    }
    assert_eq!(service.evictions(), 0);
    clock.set(at(back));
    assert!(
        !service.allow(&hot, &PLAN).unwrap(),
        "spent as of its latest reading"
    );
    if evict {
        // Granted or not: the new state is made as of where the evicted one's counts end.
        let _ = service.allow(&100, &PLAN).unwrap();
    }
    for &reading in walk {
        hammer_at(&service, &clock, hot, reading, 10, &mut grants);
    }
    (grants, service.evictions())
}

/// For each store method: the hot client's permits in the run with the eviction beyond those of
/// its twin run without it, against one limit per counted eviction.
fn check_older_eviction(limit: u64, walk: &[u64], back: u64) -> Vec<String> {
    let mut failures = Vec::new();
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
    ] {
        let (grants, evictions) = evicted_at_an_older_reading(algorithm, limit, walk, back, true);
        let (twin, none) = evicted_at_an_older_reading(algorithm, limit, walk, back, false);
        assert_eq!(none, 0);
        let permits = grants.len() as u64;
        let gained = permits.saturating_sub(twin.len() as u64);
        let (over, worst) = excess(algorithm, limit, SEC, &grants);
        let allowed = limit * evictions;
        eprintln!(
            "{algorithm:?}: {permits} permits (twin without the eviction {}), gained {gained}, \
             {over} beyond the per-window/span bound; {evictions} evictions, allowed {allowed}; \
             {worst}",
            twin.len()
        );
        if gained > allowed || over > allowed {
            failures.push(format!(
                "{algorithm:?}: gained {gained} permits over its twin ({over} beyond the \
                 method's bound: {worst}) from {evictions} counted eviction(s): at most \
                 {allowed}"
            ));
        }
    }
    failures
}

/// The clock steps back nine windows at the eviction: the client spends all ten again.
#[test]
fn an_eviction_at_a_reading_stepped_back_gains_at_most_one_limit() {
    let walk: Vec<u64> = (10..20).map(|k| k * SEC + SEC / 2).collect();
    let failures = check_older_eviction(2, &walk, 10 * SEC + SEC / 2);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A reading only a millisecond behind the client's latest, across one window edge (two cores'
/// readings out of order): the client spends two windows again, twice the one limit.
#[test]
fn an_eviction_at_a_reading_a_millisecond_behind_gains_at_most_one_limit() {
    let ms = SEC / 1000;
    let walk = [11 * SEC - ms, 11 * SEC];
    let failures = check_older_eviction(2, &walk, 11 * SEC - ms);
    assert!(failures.is_empty(), "{failures:#?}");
}

// ------------------------------------------------------------------------------------------
// Versions of a plan's rules, each unique: a decision's window names its version.
// ------------------------------------------------------------------------------------------

/// The short window (plus `v` microseconds for version `v`).
const WA: u64 = SEC;
/// The long window of a plan of several limits: an hour, longer than any run's readings, so
/// that every reading lies in its window 0.
const WB: u64 = 3_600 * SEC;

fn short_limit(v: usize) -> u64 {
    [3, 2, 5, 1, 4][v % 5]
}

fn long_limit(v: usize) -> u64 {
    [6, 4, 9][v % 3]
}

/// Whether version `v` has several limits (never under the sliding log, which takes one).
fn is_several(algorithm: Algorithm, v: usize, several: bool) -> bool {
    several && algorithm != Algorithm::SlidingWindowLog && v % 3 == 2
}

/// The limits of version `v`.
fn limits_of(algorithm: Algorithm, v: usize, several: bool) -> Vec<Rule> {
    let micros = v as u64 * 1_000;
    let short = Rule::new(short_limit(v), at(WA + micros)).unwrap();
    if is_several(algorithm, v, several) {
        vec![short, Rule::new(long_limit(v), at(WB + micros)).unwrap()]
    } else {
        vec![short]
    }
}

/// The version a decision was made under, by its rule's window.
fn version_of(decision: &Decision) -> usize {
    let window = u64::try_from(decision.window().as_nanos()).unwrap();
    let base = if window >= WB { WB } else { WA };
    let micros = window - base;
    assert_eq!(micros % 1_000, 0, "a window no version has: {decision:?}");
    (micros / 1_000) as usize
}

/// Grants per (client, version).
type Ledger = HashMap<(u64, usize), Vec<Grant>>;

/// The permits beyond what version `v` allows one client, over its `grants` (a plan of several
/// limits: the long limit's window 0 holds every reading, so the fixed window and the counter
/// grant at most its limit in all; the token bucket is checked against each limit).
fn version_excess(
    algorithm: Algorithm,
    v: usize,
    several: bool,
    grants: &[Grant],
) -> (u64, String) {
    let micros = v as u64 * 1_000;
    if !is_several(algorithm, v, several) {
        return excess(algorithm, short_limit(v), WA + micros, grants);
    }
    if algorithm == Algorithm::TokenBucket {
        let (a, why_a) = excess(algorithm, short_limit(v), WA + micros, grants);
        let (b, why_b) = excess(algorithm, long_limit(v), WB + micros, grants);
        return (a.max(b), format!("short: {why_a}; long: {why_b}"));
    }
    let total: u64 = grants.iter().map(|g| g.n).sum();
    assert!(
        grants.iter().all(|g| g.t < WB),
        "a reading past the long window"
    );
    (
        total.saturating_sub(long_limit(v)),
        format!("{total} permits of the long limit {}", long_limit(v)),
    )
}

/// Every (client, version) of `ledger` against its bound; the excess over all of them, and the
/// worst.
fn ledger_excess(algorithm: Algorithm, several: bool, ledger: &Ledger) -> (u64, String) {
    let mut total = 0;
    let mut worst = (0, String::new());
    for (&(client, v), grants) in ledger {
        let (over, why) = version_excess(algorithm, v, several, grants);
        total += over;
        if over > worst.0 {
            worst = (over, format!("client {client}, version {v}: {why}"));
        }
    }
    (total, worst.1)
}

// ------------------------------------------------------------------------------------------
// 2. Deterministic scripts: one thread, a fake clock moved back and forth.
// ------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
struct ScriptShape {
    algorithm: Algorithm,
    capacity: usize,
    /// Clients other than the hot one (key 0).
    others: u64,
    /// Whether the other clients ask only at the latest reading so far (the hot client asks at
    /// any): then no insert evicts at a reading older than its victim's, and the documented
    /// bound of one limit per counted eviction must hold.
    others_at_latest: bool,
    rule_changes: bool,
    several: bool,
    steps: usize,
}

/// One script of `shape` from `seed`: failures found.
fn script(shape: ScriptShape, seed: u64) -> Vec<String> {
    let algorithm = shape.algorithm;
    let clock = FakeClock::new();
    let service: RateLimiterService<u64, &'static str, FakeClock> =
        ServiceBuilder::new(algorithm, clock.clone())
            .plan_limits(PLAN, limits_of(algorithm, 0, shape.several))
            .capacity(shape.capacity)
            .count_decisions(true)
            .build::<u64>()
            .unwrap();
    let mut rng = seed.max(1);
    let mut failures = Vec::new();
    let mut v = 0_usize;
    let mut now = 0_u64;
    let mut latest = 0_u64;
    let mut ledger: Ledger = HashMap::new();
    // Evictions counted while each version was the plan's.
    let mut evictions_in: Vec<u64> = vec![0];
    let mut evictions_seen = 0_u64;
    // The hot client's refusals (reading, permits) since the last change that may excuse a
    // later grant at an older reading.
    let mut refusals: Vec<(u64, u64)> = Vec::new();
    let mut decisions = 0_u64;
    let mut fresh_key = 1_000_000_u64;
    let hot = 0_u64;
    let note = |failures: &mut Vec<String>, what: String| {
        if failures.len() < 5 {
            failures.push(format!("{algorithm:?} seed {seed}: {what}"));
        }
    };
    for step in 0..shape.steps {
        let roll = xorshift(&mut rng) % 100;
        let limit = short_limit(v);
        match roll {
            // The hot client, at whatever the clock reads.
            0..35 => {
                let n = [0, 1, 1, 1, 2, limit, limit + 1][(xorshift(&mut rng) % 7) as usize];
                let decision = service.acquire(&hot, &PLAN, n).unwrap();
                decisions += 1;
                let dv = version_of(&decision);
                if dv != v {
                    note(
                        &mut failures,
                        format!("step {step}: version {dv}, plan at {v}"),
                    );
                }
                let max = limits_of(algorithm, v, shape.several)
                    .iter()
                    .map(Rule::limit)
                    .max()
                    .unwrap();
                if n > max && (decision.is_allowed() || decision.rejection().is_none()) {
                    note(
                        &mut failures,
                        format!("step {step}: {n} permits: {decision:?}"),
                    );
                }
                if decision.remaining() > decision.limit() {
                    note(
                        &mut failures,
                        format!("step {step}: remaining past the limit"),
                    );
                }
                if n == 0 {
                    continue;
                }
                if decision.is_allowed() {
                    if let Some(&(tr, nr)) = refusals.iter().find(|&&(tr, nr)| tr >= now && nr <= n)
                    {
                        note(
                            &mut failures,
                            format!(
                                "step {step}: {n} permits granted at {now} after {nr} were \
                                 refused at the later reading {tr}"
                            ),
                        );
                    }
                    if algorithm != Algorithm::TokenBucket {
                        // A grant at a later reading may roll a window forward, where an older
                        // reading then counts afresh (by design): its refusals are no evidence.
                        refusals.retain(|&(tr, _)| tr >= now);
                    }
                    ledger
                        .entry((hot, dv))
                        .or_default()
                        .push(Grant::of(now, n, &decision));
                } else {
                    refusals.push((now, n));
                }
            }
            // Another client.
            35..55 => {
                if shape.others_at_latest && now != latest {
                    continue;
                }
                let key = 1 + xorshift(&mut rng) % shape.others;
                let n = if xorshift(&mut rng).is_multiple_of(2) {
                    1
                } else {
                    limit
                };
                let decision = service.acquire(&key, &PLAN, n).unwrap();
                decisions += 1;
                if decision.is_allowed() && n > 0 {
                    ledger
                        .entry((key, version_of(&decision)))
                        .or_default()
                        .push(Grant::of(now, n, &decision));
                }
            }
            // The clock: on, back, or to the latest reading.
            55..72 => {
                now = match xorshift(&mut rng) % 4 {
                    0 | 1 => now + xorshift(&mut rng) % (2 * WA),
                    2 => now.saturating_sub(xorshift(&mut rng) % (4 * WA)),
                    _ => latest,
                };
                latest = latest.max(now);
                clock.set(at(now));
            }
            72..78 => {
                service.sweep();
            }
            78..83 if shape.rule_changes => {
                v += 1;
                service
                    .set_limits(&PLAN, limits_of(algorithm, v, shape.several))
                    .unwrap();
                evictions_in.push(0);
                refusals.clear();
            }
            // A first attempt of 0 permits makes no state and evicts no one.
            83..88 => {
                let (len, evictions) = (service.len(), service.evictions());
                fresh_key += 1;
                let decision = service.acquire(&fresh_key, &PLAN, 0).unwrap();
                decisions += 1;
                if !decision.is_allowed()
                    || service.len() != len
                    || service.evictions() != evictions
                {
                    note(
                        &mut failures,
                        format!("step {step}: a 0-permit first attempt changed the store"),
                    );
                }
            }
            // A look at the hot client, then the request it describes.
            _ => {
                let peeked = service.peek(&hot, &PLAN).unwrap();
                let decision = service.acquire(&hot, &PLAN, 1).unwrap();
                decisions += 1;
                if peeked.remaining() > peeked.limit() {
                    note(&mut failures, format!("step {step}: peek past the limit"));
                }
                let coherent = if peeked.remaining() >= 1 {
                    decision.is_allowed()
                } else {
                    decision.is_denied()
                };
                if !coherent && !is_several(algorithm, v, shape.several) {
                    note(
                        &mut failures,
                        format!("step {step} at {now}: peek {peeked:?} then {decision:?}"),
                    );
                }
                if decision.is_allowed() {
                    if let Some(&(tr, nr)) = refusals.iter().find(|&&(tr, nr)| tr >= now && nr <= 1)
                    {
                        note(
                            &mut failures,
                            format!(
                                "step {step}: 1 permit granted at {now} after {nr} were refused \
                                 at the later reading {tr}"
                            ),
                        );
                    }
                    if algorithm != Algorithm::TokenBucket {
                        refusals.retain(|&(tr, _)| tr >= now);
                    }
                    ledger
                        .entry((hot, version_of(&decision)))
                        .or_default()
                        .push(Grant::of(now, 1, &decision));
                } else {
                    refusals.push((now, 1));
                }
            }
        }
        let evictions = service.evictions();
        if evictions != evictions_seen {
            *evictions_in.last_mut().unwrap() += evictions - evictions_seen;
            evictions_seen = evictions;
            // An eviction may have started the hot client afresh.
            refusals.clear();
        }
        if service.len() > shape.capacity.div_ceil(8) * 8
            && algorithm != Algorithm::SlidingWindowLog
            && !shape.several
        {
            note(
                &mut failures,
                format!("step {step}: {} clients held", service.len()),
            );
        }
    }
    let stats = service.stats(&PLAN).unwrap();
    SCRIPT_TOTALS[0].fetch_add(stats.allowed, Ordering::Relaxed);
    SCRIPT_TOTALS[1].fetch_add(stats.denied, Ordering::Relaxed);
    SCRIPT_TOTALS[2].fetch_add(evictions_seen, Ordering::Relaxed);
    SCRIPT_TOTALS[3].fetch_add(v as u64, Ordering::Relaxed);
    if stats.allowed + stats.denied != decisions {
        note(
            &mut failures,
            format!("stats {stats:?} for {decisions} decisions"),
        );
    }
    // Each version: its excess over all clients, at most one limit per eviction counted while
    // it was the plan's.
    let mut per_version: BTreeMap<usize, (u64, String)> = BTreeMap::new();
    for (&(client, gv), grants) in &ledger {
        let (over, why) = version_excess(algorithm, gv, shape.several, grants);
        let entry = per_version.entry(gv).or_default();
        entry.0 += over;
        if over > 0 {
            entry.1 = format!("client {client}: {why}");
        }
    }
    for (gv, (over, why)) in per_version {
        let allowed = short_limit(gv) * evictions_in[gv];
        if over > allowed {
            note(
                &mut failures,
                format!(
                    "version {gv}: {over} permits beyond the bound, {} evictions allow {allowed}: \
                     {why}",
                    evictions_in[gv]
                ),
            );
        }
    }
    failures
}

/// Totals over a run of scripts: grants, refusals, evictions, rule changes.
static SCRIPT_TOTALS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

fn run_scripts(shape: ScriptShape, seeds: u64) {
    for total in &SCRIPT_TOTALS {
        total.store(0, Ordering::Relaxed);
    }
    let mut failures = Vec::new();
    for seed in 1..=seeds {
        failures.extend(script(shape, seed * 0x9E37_79B9));
        if failures.len() >= 8 {
            break;
        }
    }
    let totals: Vec<u64> = SCRIPT_TOTALS
        .iter()
        .map(|t| t.load(Ordering::Relaxed))
        .collect();
    eprintln!(
        "{:?} capacity {}: {} grants, {} refusals, {} evictions, {} rule changes",
        shape.algorithm, shape.capacity, totals[0], totals[1], totals[2], totals[3]
    );
    assert!(failures.is_empty(), "{shape:?}\n{failures:#?}");
}

const ALL_METHODS: [Algorithm; 4] = [
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowCounter,
    Algorithm::SlidingWindowLog,
];

/// No eviction (a store that holds every client): readings back and forth, sweeps, rule
/// changes between one limit and several, and attempts of 0, 1, 2, N and N + 1 permits. Each
/// (client, version) is held to one limiter's bound exactly, and no refusal is followed by a
/// grant of as many permits at an older reading (but where a grant at a later reading rolled a
/// window meanwhile, or the rules changed).
#[test]
fn scripts_of_readings_back_and_forth_with_sweeps_and_rule_changes() {
    for algorithm in ALL_METHODS {
        run_scripts(
            ScriptShape {
                algorithm,
                capacity: 1_024,
                others: 5,
                others_at_latest: false,
                rule_changes: true,
                several: true,
                steps: 600,
            },
            300,
        );
    }
}

/// A full store (one bucket of eight slots, twelve clients): evictions all the time. The other
/// clients ask only at the latest reading; the hot client anywhere, so its own inserts evict at
/// older readings, and it is evicted at the latest. One limit per counted eviction.
#[test]
fn scripts_in_a_full_store_hold_one_limit_per_counted_eviction() {
    for algorithm in ALL_METHODS {
        for rule_changes in [false, true] {
            run_scripts(
                ScriptShape {
                    algorithm,
                    capacity: 8,
                    others: 11,
                    others_at_latest: true,
                    rule_changes,
                    several: false,
                    steps: 600,
                },
                300,
            );
        }
    }
}

/// The ledgers report one permit too many, for every method (the oracle's negative control).
#[test]
fn the_ledgers_catch_one_permit_too_many() {
    for algorithm in ALL_METHODS {
        let clock = FakeClock::new();
        let service = ServiceBuilder::new(algorithm, clock.clone())
            .plan(PLAN, Rule::new(2, Duration::from_secs(1)).unwrap())
            .build::<u64>()
            .unwrap();
        let mut grants = Vec::new();
        // Readings back and forth inside and across windows: the honest grants pass.
        for reading in [
            5_100, 5_900, 5_300, 6_050, 5_950, 6_400, 7_700, 6_900, 7_800,
        ] {
            let reading = reading * SEC / 1_000;
            clock.set(at(reading));
            for _ in 0..3 {
                let decision = service.acquire(&1, &PLAN, 1).unwrap();
                if decision.is_allowed() {
                    grants.push(Grant::of(reading, 1, &decision));
                }
            }
        }
        assert!(grants.len() >= 4, "{algorithm:?}: {grants:?}");
        assert_eq!(
            excess(algorithm, 2, SEC, &grants).0,
            0,
            "{algorithm:?}: {grants:?}"
        );
        // One more, as if the last grant had been made twice.
        let last = *grants.last().unwrap();
        grants.push(last);
        assert!(
            excess(algorithm, 2, SEC, &grants).0 >= 1,
            "{algorithm:?}: {grants:?}"
        );
    }
}

// ------------------------------------------------------------------------------------------
// 3. Real threads: readings out of order across threads, sweeps, floods, rule changes.
// ------------------------------------------------------------------------------------------

thread_local! {
    /// This thread's offset from the shared fake time.
    static SKEW: Cell<i64> = const { Cell::new(0) };
    /// This thread's latest reading: after a decision, the one it decided at (a decision reads
    /// the clock last, after any reading its insert took).
    static LAST: Cell<u64> = const { Cell::new(0) };
}

/// A shared fake time, read by each thread with an offset of its own: readings out of order
/// across threads, as two cores' counters, a descheduled reader or a clock stepped back give.
#[derive(Debug, Clone)]
struct SkewClock(FakeClock);

impl Clock for SkewClock {
    fn now_nanos(&self) -> u64 {
        let reading = self.0.now_nanos().saturating_add_signed(SKEW.get());
        LAST.set(reading);
        reading
    }
}

type SkewService = RateLimiterService<u64, &'static str, SkewClock>;

/// What each key of a flood asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flood {
    /// One permit.
    One,
    /// Permits until refused: as far from fresh as a spent hot client.
    Spends,
    /// More than the limit: refused for good, and no state made for the key.
    TooMany,
}

#[derive(Debug, Clone, Copy)]
struct RaceShape {
    algorithm: Algorithm,
    capacity: usize,
    hot_keys: u64,
    /// The second hammering thread reads up to this far behind (the first reads the time).
    hammer_behind: u64,
    /// The sweeper reads up to this far behind the time...
    sweeper_skew: u64,
    /// ...or up to this far ahead of it (a sweep far ahead makes every fresh state refuse the
    /// readings behind it: stricter, and a test of little use, so a little only).
    sweeper_ahead: u64,
    /// A thread of distinct new keys (at the time, no offset).
    flood: Option<Flood>,
    rule_changes: bool,
    several: bool,
    millis: u64,
}

/// One request of a hammering thread.
#[derive(Debug, Clone, Copy)]
struct Request {
    key: u64,
    start: u64,
    end: u64,
    t: u64,
    n: u64,
    allowed: bool,
}

#[derive(Debug, Default)]
struct RaceOutcome {
    grants: u64,
    refusals: u64,
    evictions: u64,
    versions: usize,
    sweeps: u64,
    flood_keys: u64,
    failures: Vec<String>,
}

fn race(shape: RaceShape) -> RaceOutcome {
    let algorithm = shape.algorithm;
    let base = FakeClock::new();
    let service: Arc<SkewService> = Arc::new(
        ServiceBuilder::new(algorithm, SkewClock(base.clone()))
            .plan_limits(PLAN, limits_of(algorithm, 0, shape.several))
            .capacity(shape.capacity)
            .count_decisions(true)
            .build::<u64>()
            .unwrap(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let sequence = Arc::new(AtomicU64::new(0));
    let current = Arc::new(AtomicU64::new(0));
    let decisions = Arc::new(AtomicU64::new(0));
    let dog = Watchdog::start(
        Duration::from_millis(shape.millis) + Duration::from_secs(60),
        format!("{shape:?}"),
    );
    let hammers: Vec<_> = (0..2_u64)
        .map(|h| {
            let (service, stop, sequence, current, decisions) = (
                Arc::clone(&service),
                Arc::clone(&stop),
                Arc::clone(&sequence),
                Arc::clone(&current),
                Arc::clone(&decisions),
            );
            thread::spawn(move || {
                let mut rng = 0x9E37_79B9_7F4A_7C15_u64 ^ (h + 1) << 20;
                let mut requests = Vec::new();
                let mut failures = Vec::new();
                let mut made = 0_u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = xorshift(&mut rng) % shape.hot_keys;
                    let skew = if h == 1 && shape.hammer_behind > 0 {
                        -((xorshift(&mut rng) % shape.hammer_behind) as i64)
                    } else {
                        0
                    };
                    SKEW.set(skew);
                    let v_before = current.load(Ordering::SeqCst) as usize;
                    let limit = short_limit(v_before);
                    let n = [0, 1, 1, 1, 1, 2, limit + 1][(xorshift(&mut rng) % 7) as usize];
                    let start = sequence.fetch_add(1, Ordering::SeqCst);
                    let decision = service.acquire(&key, &PLAN, n).unwrap();
                    let end = sequence.fetch_add(1, Ordering::SeqCst);
                    made += 1;
                    let t = LAST.get();
                    let v = version_of(&decision);
                    let v_after = current.load(Ordering::SeqCst) as usize;
                    if (v < v_before || v > v_after + 1) && failures.len() < 5 {
                        failures.push(format!(
                            "a decision under version {v} made between versions {v_before} and \
                             {v_after}: {decision:?}"
                        ));
                    }
                    if n > short_limit(v) && decision.is_allowed() && failures.len() < 5 {
                        failures.push(format!("{n} permits granted: {decision:?}"));
                    }
                    if n == 0 {
                        continue;
                    }
                    requests.push((
                        v,
                        Grant::of(t, n, &decision),
                        Request {
                            key,
                            start,
                            end,
                            t,
                            n,
                            allowed: decision.is_allowed(),
                        },
                    ));
                }
                decisions.fetch_add(made, Ordering::SeqCst);
                (requests, failures)
            })
        })
        .collect();
    let flood = shape.flood.map(|what| {
        let (service, stop, decisions) = (
            Arc::clone(&service),
            Arc::clone(&stop),
            Arc::clone(&decisions),
        );
        thread::spawn(move || {
            let mut key = 1_000_000_u64;
            let mut made = 0_u64;
            while !stop.load(Ordering::Relaxed) {
                key += 1;
                made += 1;
                match what {
                    Flood::One => {
                        service.allow(&key, &PLAN).unwrap();
                    }
                    Flood::Spends => {
                        while service.allow(&key, &PLAN).unwrap() {
                            made += 1;
                        }
                    }
                    Flood::TooMany => {
                        let decision = service.acquire(&key, &PLAN, 100).unwrap();
                        assert!(decision.rejection().is_some());
                    }
                }
            }
            decisions.fetch_add(made, Ordering::SeqCst);
            key - 1_000_000
        })
    });
    let sweeper = {
        let (service, stop) = (Arc::clone(&service), Arc::clone(&stop));
        thread::spawn(move || {
            let mut rng = 0xD1B5_4A32_D192_ED03_u64;
            let mut sweeps = 0_u64;
            while !stop.load(Ordering::Relaxed) {
                let span = shape.sweeper_skew + shape.sweeper_ahead + 1;
                SKEW.set((xorshift(&mut rng) % span) as i64 - shape.sweeper_skew as i64);
                service.sweep();
                sweeps += 1;
                thread::sleep(Duration::from_micros(200));
            }
            sweeps
        })
    };
    let changer = shape.rule_changes.then(|| {
        let (service, stop, current) = (
            Arc::clone(&service),
            Arc::clone(&stop),
            Arc::clone(&current),
        );
        thread::spawn(move || {
            let mut v = 0_usize;
            let mut rng = 0x2545_F491_4F6C_DD1D_u64;
            while !stop.load(Ordering::Relaxed) && v < 30_000 {
                for _ in 0..xorshift(&mut rng) % 2_000 {
                    std::hint::spin_loop();
                }
                v += 1;
                service
                    .set_limits(&PLAN, limits_of(algorithm, v, shape.several))
                    .unwrap();
                current.store(v as u64, Ordering::SeqCst);
            }
            v
        })
    });
    // The driver: the shared time moves on by a sixteenth of the short window every
    // millisecond.
    let began = Instant::now();
    while began.elapsed() < Duration::from_millis(shape.millis) {
        thread::sleep(Duration::from_millis(1));
        base.advance(at(WA / 16));
    }
    stop.store(true, Ordering::SeqCst);
    let mut outcome = RaceOutcome::default();
    let mut ledger: Ledger = HashMap::new();
    let mut all_requests = Vec::new();
    for hammer in hammers {
        let (requests, failures) = hammer.join().expect("a hammering thread panicked");
        outcome.failures.extend(failures);
        for (v, grant, request) in requests {
            if request.allowed {
                outcome.grants += request.n;
                ledger.entry((request.key, v)).or_default().push(grant);
            } else {
                outcome.refusals += 1;
            }
            all_requests.push((v, request));
        }
    }
    outcome.flood_keys = flood.map_or(0, |f| f.join().expect("the flood panicked"));
    outcome.sweeps = sweeper.join().expect("the sweeper panicked");
    outcome.versions = changer.map_or(0, |c| c.join().expect("the changer panicked")) + 1;
    dog.finish();
    outcome.evictions = service.evictions();
    let stats = service.stats(&PLAN).unwrap();
    let made = decisions.load(Ordering::SeqCst);
    if stats.allowed + stats.denied != made {
        outcome
            .failures
            .push(format!("stats {stats:?} for {made} decisions"));
    }
    if algorithm != Algorithm::SlidingWindowLog
        && !shape.several
        && service.len() > shape.capacity.div_ceil(8) * 8
    {
        outcome.failures.push(format!(
            "{} clients in {} slots",
            service.len(),
            shape.capacity
        ));
    }
    // Every (client, version) against one limiter's bound; a counted eviction may add one
    // limit's worth (of the largest short limit, not knowing whose).
    let (over, worst) = ledger_excess(algorithm, shape.several, &ledger);
    let allowed = outcome.evictions * 5;
    if over > allowed {
        outcome.failures.push(format!(
            "{over} permits beyond the bounds with {} evictions (allowing {allowed}): {worst}",
            outcome.evictions
        ));
    }
    // The token bucket: no grant at an older reading after a refusal of as many permits that
    // ended before it began (with no eviction, nothing excuses one).
    if algorithm == Algorithm::TokenBucket && outcome.evictions == 0 {
        outcome
            .failures
            .extend(refusal_then_older_grant(&all_requests));
    }
    outcome
}

/// Grants made at a reading no later than that of a refusal (same client and version, no more
/// permits asked) that had ended before the grant began.
fn refusal_then_older_grant(requests: &[(usize, Request)]) -> Vec<String> {
    let mut by_client: HashMap<(u64, usize), Vec<Request>> = HashMap::new();
    for &(v, request) in requests {
        by_client.entry((request.key, v)).or_default().push(request);
    }
    let mut failures = Vec::new();
    for ((key, v), requests) in by_client {
        // Refusals by end, with the latest reading refused so far for each size asked.
        let mut refusals: Vec<Request> = requests.iter().filter(|r| !r.allowed).copied().collect();
        refusals.sort_by_key(|r| r.end);
        let mut latest_refused = vec![[0_u64; 3]; refusals.len() + 1];
        for (i, refusal) in refusals.iter().enumerate() {
            let mut row = latest_refused[i];
            for (n, slot) in row.iter_mut().enumerate() {
                if refusal.n <= n as u64 {
                    *slot = (*slot).max(refusal.t + 1);
                }
            }
            latest_refused[i + 1] = row;
        }
        for grant in requests.iter().filter(|r| r.allowed && r.n <= 2) {
            let before = refusals.partition_point(|r| r.end < grant.start);
            let refused_at = latest_refused[before][grant.n as usize];
            if refused_at > grant.t && failures.len() < 5 {
                failures.push(format!(
                    "client {key} version {v}: {grant:?} granted after a refusal at the later \
                     reading {}",
                    refused_at - 1
                ));
            }
        }
    }
    failures
}

fn check_race(shape: RaceShape) {
    let _serial = serial();
    let outcome = race(shape);
    eprintln!(
        "{:?}: {} permits granted, {} refusals, {} evictions, {} versions, {} sweeps, {} flood \
         keys",
        shape.algorithm,
        outcome.grants,
        outcome.refusals,
        outcome.evictions,
        outcome.versions,
        outcome.sweeps,
        outcome.flood_keys
    );
    assert!(outcome.grants > 0);
    assert!(
        outcome.failures.is_empty(),
        "{shape:?}\n{:#?}",
        outcome.failures
    );
}

/// No eviction: two threads on four clients, one reading up to two windows behind the other;
/// a sweeper reading up to two windows behind or ahead of them.
fn skewed_readings(algorithm: Algorithm) {
    check_race(RaceShape {
        algorithm,
        capacity: 1_024,
        hot_keys: 4,
        hammer_behind: 2 * WA,
        sweeper_skew: 2 * WA,
        sweeper_ahead: WA / 8,
        flood: None,
        rule_changes: false,
        several: false,
        millis: 1_500,
    });
}

#[test]
fn skewed_readings_and_sweeps_token_bucket() {
    skewed_readings(Algorithm::TokenBucket);
}

#[test]
fn skewed_readings_and_sweeps_fixed_window() {
    skewed_readings(Algorithm::FixedWindow);
}

#[test]
fn skewed_readings_and_sweeps_sliding_window_counter() {
    skewed_readings(Algorithm::SlidingWindowCounter);
}

#[test]
fn skewed_readings_and_sweeps_sliding_window_log() {
    skewed_readings(Algorithm::SlidingWindowLog);
}

/// A full store (two buckets) flooded with new keys while two threads hammer two hot clients at
/// the time as it is (no offset): one limit per counted eviction. Floods of keys that take one
/// permit, and of keys that spend their limit (as far from fresh as the hot clients).
fn flooded(algorithm: Algorithm) {
    for (what, hammer_behind) in [
        (Flood::One, 0),
        (Flood::Spends, 0),
        (Flood::TooMany, 0),
        (Flood::TooMany, WA),
    ] {
        check_race(RaceShape {
            algorithm,
            capacity: 16,
            hot_keys: 2,
            hammer_behind,
            sweeper_skew: 0,
            sweeper_ahead: 0,
            flood: Some(what),
            rule_changes: false,
            several: false,
            millis: 700,
        });
    }
}

#[test]
fn a_flooded_store_token_bucket() {
    flooded(Algorithm::TokenBucket);
}

#[test]
fn a_flooded_store_fixed_window() {
    flooded(Algorithm::FixedWindow);
}

#[test]
fn a_flooded_store_sliding_window_counter() {
    flooded(Algorithm::SlidingWindowCounter);
}

/// Rule changes (one limit, and between one and several) racing decisions at readings out of
/// order (one thread up to half a window behind), and sweeps behind or ahead. No eviction: each
/// (client, version) is one limiter.
fn rule_changes(algorithm: Algorithm) {
    check_race(RaceShape {
        algorithm,
        capacity: 1_024,
        hot_keys: 3,
        hammer_behind: WA / 2,
        sweeper_skew: WA,
        sweeper_ahead: WA / 8,
        flood: None,
        rule_changes: true,
        several: true,
        millis: 1_500,
    });
}

#[test]
fn rule_changes_racing_skewed_decisions_token_bucket() {
    rule_changes(Algorithm::TokenBucket);
}

#[test]
fn rule_changes_racing_skewed_decisions_fixed_window() {
    rule_changes(Algorithm::FixedWindow);
}

#[test]
fn rule_changes_racing_skewed_decisions_sliding_window_counter() {
    rule_changes(Algorithm::SlidingWindowCounter);
}

#[test]
fn rule_changes_racing_skewed_decisions_sliding_window_log() {
    rule_changes(Algorithm::SlidingWindowLog);
}
