//! A key-rotating flood through the client store: millions of distinct keys, each making one
//! request, pass through one plan of capacity 1,000,000 while two threads hammer a few hot
//! clients, for each one-word method (the token bucket, the fixed window, the sliding window
//! counter). The fake clock stands still within a phase and moves on by ten windows between
//! phases, so every state of an earlier phase is idle (indistinguishable from fresh) and every
//! state of the current phase is not.
//!
//! What must hold throughout:
//! - each hot client is granted exactly its limit in every phase: never more (no state lost or
//!   shared), never fewer (the store reuses idle flood states, and evicts only the state closest
//!   to fresh, which an exhausted hot client never is);
//! - every flood key's first request is granted (a new client starts fresh);
//! - the store holds at most its capacity, and the process's resident memory grows by at most
//!   the capacity's 17 bytes per client plus 16 MiB, whatever number of keys went through;
//! - evictions: in the quiet phases (an eighth of the capacity per phase) every key finds an idle
//!   or free slot among its 16 but in the rare pair of buckets that one phase's keys fill
//!   (well under one per 10,000 keys); in the last phase, which brings more keys than the store
//!   holds, at least the excess is evicted, since no state of that phase is idle.
//!
//! Each flood runs in a process of its own, so that its resident memory is measured from a process
//! that held no other flood's table, and the tests take one lock, so that the floods do not share
//! the cores. The last test plants a hot client granted once too often and checks that the oracle
//! reports it.

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use tollgate::{Algorithm, FakeClock, RateLimiterService, Rule, ServiceBuilder};

type Service = RateLimiterService<u64, &'static str, FakeClock>;

/// The service's one plan.
const PLAN: &str = "flood";
/// Requests each client may make per window, hot or not.
const LIMIT: u64 = 4;
const WINDOW: Duration = Duration::from_millis(100);
/// How far the clock moves between phases: every method's state is idle this long after its
/// last request.
const PHASE_STEP: Duration = Duration::from_secs(1);
/// Hot clients: keys `0..HOT`; flood keys start at `FLOOD_BASE`.
const HOT: usize = 4;
const FLOOD_BASE: u64 = 1 << 32;
/// Threads sharing each phase's flood keys, each of which also asks for every hot client once
/// per `HOT_EVERY` of its flood keys.
const THREADS: usize = 2;
const HOT_EVERY: usize = 64;
/// Slack on top of the store's 17 bytes per client of capacity: the test harness, threads and
/// the allocator's own bookkeeping.
const RSS_SLACK: u64 = 16 << 20;

/// Serializes the tests of this file, one flood at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The shape of one flood.
#[derive(Debug, Clone, Copy)]
struct Flood {
    capacity: usize,
    /// Distinct flood keys in all, the last phase's included.
    keys: u64,
    /// Keys per quiet phase.
    keys_per_phase: u64,
    /// Keys of the last phase, more than the store holds.
    last_phase_keys: u64,
}

impl Flood {
    /// `keys` through a store of 1,000,000: quiet phases of an eighth of it, then a last phase of
    /// a quarter more than it.
    fn of(keys: u64) -> Flood {
        let capacity = 1_000_000;
        Flood {
            capacity,
            keys,
            keys_per_phase: capacity as u64 / 8,
            last_phase_keys: capacity as u64 * 5 / 4,
        }
    }

    /// The store's slots: the capacity rounded up to whole buckets of 8.
    fn slots(&self) -> u64 {
        self.capacity.next_multiple_of(8) as u64
    }
}

/// What a flood came to.
#[derive(Debug)]
struct FloodReport {
    /// Evictions over the quiet phases, and over the last phase.
    quiet_evictions: u64,
    last_phase_evictions: u64,
    /// The most clients held at the end of a phase.
    most_held: usize,
    /// Resident memory before the service was built and at the end (Linux only).
    resident: Option<(u64, u64)>,
}

/// Resident memory of this process (`VmRSS`), in bytes; `None` where `/proc` does not say.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Runs `flood` through a fresh service of `algorithm`, asking through `allow` (the service's
/// own answer, or a planted bug's); the first breach found, or what the flood came to.
fn flood_oracle(
    algorithm: Algorithm,
    flood: Flood,
    allow: impl Fn(&Service, u64) -> bool + Sync,
) -> Result<FloodReport, String> {
    let base = resident_bytes();
    let clock = FakeClock::new();
    let service: Service = ServiceBuilder::new(algorithm, clock.clone())
        .plan(PLAN, Rule::new(LIMIT, WINDOW).unwrap())
        .capacity(flood.capacity)
        .build()
        .unwrap();
    let mut first_key = FLOOD_BASE;
    let mut phase = 0;
    let mut most_held = 0;
    let quiet_keys = flood.keys - flood.last_phase_keys;
    let mut run = |keys: u64, exhaust_first: bool| {
        let grants = run_phase(&service, &allow, first_key, keys, exhaust_first)
            .map_err(|breach| format!("{algorithm}, phase {phase}: {breach}"))?;
        for (hot, granted) in grants.into_iter().enumerate() {
            if granted != LIMIT {
                return Err(format!(
                    "{algorithm}, phase {phase}: hot client {hot} was granted {granted} times, \
                     its limit is {LIMIT}"
                ));
            }
        }
        let held = service.len();
        if held as u64 > flood.slots() {
            return Err(format!(
                "{algorithm}, phase {phase}: {held} clients held, capacity {}",
                flood.capacity
            ));
        }
        most_held = most_held.max(held);
        first_key += keys;
        phase += 1;
        clock.advance(PHASE_STEP);
        Ok(())
    };
    let mut flooded = 0;
    while flooded < quiet_keys {
        let keys = flood.keys_per_phase.min(quiet_keys - flooded);
        run(keys, false)?;
        flooded += keys;
    }
    let quiet_evictions = service.evictions();
    // Every state of the last phase is active once made; the hot clients take their whole
    // limit before the flood starts, so that, with nothing left, they are never the state
    // closest to fresh.
    run(flood.last_phase_keys, true)?;
    let last_phase_evictions = service.evictions() - quiet_evictions;
    let resident = base.zip(resident_bytes());
    drop(service);

    let report = FloodReport {
        quiet_evictions,
        last_phase_evictions,
        most_held,
        resident,
    };
    if quiet_evictions > quiet_keys / 10_000 {
        return Err(format!(
            "{algorithm}: {quiet_evictions} evictions over {quiet_keys} keys in quiet phases, \
             where idle slots abound: {report:?}"
        ));
    }
    // No state of the last phase is idle while the clock stands still, and none is retired but
    // by an eviction: all but the slots' worth were evicted.
    let excess = flood.last_phase_keys - (flood.slots() - HOT as u64);
    if last_phase_evictions < excess {
        return Err(format!(
            "{algorithm}: {last_phase_evictions} evictions in a last phase of {} keys through \
             {} slots, fewer than the {excess} it must take: {report:?}",
            flood.last_phase_keys,
            flood.slots()
        ));
    }
    if let Some((before, after)) = resident {
        let bound = flood.capacity as u64 * 17 + RSS_SLACK;
        if after.saturating_sub(before) > bound {
            return Err(format!(
                "{algorithm}: resident memory grew from {before} to {after} bytes, by {} \
                 (bound {bound}): {report:?}",
                after.saturating_sub(before)
            ));
        }
    }
    Ok(report)
}

/// One phase at a standing clock: `keys` flood keys from `first_key`, shared by the threads,
/// each asking for the hot clients as it goes (after the hot clients are exhausted on this
/// thread if `exhaust_first`). Returns each hot client's grants, or the first flood key denied.
fn run_phase(
    service: &Service,
    allow: &(impl Fn(&Service, u64) -> bool + Sync),
    first_key: u64,
    keys: u64,
    exhaust_first: bool,
) -> Result<[u64; HOT], String> {
    let mut grants = [0; HOT];
    if exhaust_first {
        for (hot, granted) in grants.iter_mut().enumerate() {
            for _ in 0..=LIMIT {
                *granted += u64::from(allow(service, hot as u64));
            }
        }
    }
    let per_thread: Vec<Result<[u64; HOT], String>> = thread::scope(|scope| {
        let threads: Vec<_> = (0..THREADS)
            .map(|thread| {
                scope.spawn(move || {
                    let mut grants = [0; HOT];
                    for (round, key) in (first_key + thread as u64..first_key + keys)
                        .step_by(THREADS)
                        .enumerate()
                    {
                        if round % HOT_EVERY == 0 {
                            for (hot, granted) in grants.iter_mut().enumerate() {
                                *granted += u64::from(allow(service, hot as u64));
                            }
                        }
                        if !allow(service, key) {
                            return Err(format!("flood key {key} was denied its first request"));
                        }
                    }
                    Ok(grants)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|thread| thread.join().unwrap())
            .collect()
    });
    for thread_grants in per_thread {
        for (total, granted) in grants.iter_mut().zip(thread_grants?) {
            *total += granted;
        }
    }
    Ok(grants)
}

/// The service's own answer.
fn honest(service: &Service, client: u64) -> bool {
    service.allow(&client, &PLAN).unwrap()
}

/// Set in the process a test starts to run its flood alone.
const IN_OWN_PROCESS: &str = "TOLLGATE_STORE_FLOOD_CHILD";

/// Runs a flood of `keys` through `algorithm`'s store in a process of its own (this test binary
/// again, running only `test`), so that its resident memory starts from a process that held no
/// other flood's service: the allocator keeps a freed table for reuse, which would hide the next
/// table's growth.
fn check_in_own_process(test: &str, algorithm: Algorithm, keys: u64) {
    if std::env::var_os(IN_OWN_PROCESS).is_some() {
        let started = Instant::now();
        let flood = Flood::of(keys);
        let report =
            flood_oracle(algorithm, flood, honest).unwrap_or_else(|breach| panic!("{breach}"));
        let grown = report
            .resident
            .map(|(before, after)| after.saturating_sub(before));
        eprintln!(
            "{algorithm}: {keys} keys through capacity {} in {:.1?}: at most {} held, \
             evictions {} in quiet phases and {} in the last, resident memory (before, after) \
             {:?}, grown {grown:?} bytes",
            flood.capacity,
            started.elapsed(),
            report.most_held,
            report.quiet_evictions,
            report.last_phase_evictions,
            report.resident,
        );
        return;
    }
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    let output = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(IN_OWN_PROCESS, "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    eprint!("{stderr}");
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{algorithm}: the flood failed or did not run ({}):\n{stdout}",
        output.status
    );
}

#[test]
fn token_bucket_hot_clients_hold_exactly_through_ten_million_keys() {
    check_in_own_process(
        "token_bucket_hot_clients_hold_exactly_through_ten_million_keys",
        Algorithm::TokenBucket,
        10_000_000,
    );
}

#[test]
fn fixed_window_hot_clients_hold_exactly_through_four_million_keys() {
    check_in_own_process(
        "fixed_window_hot_clients_hold_exactly_through_four_million_keys",
        Algorithm::FixedWindow,
        4_000_000,
    );
}

#[test]
fn sliding_window_counter_hot_clients_hold_exactly_through_four_million_keys() {
    check_in_own_process(
        "sliding_window_counter_hot_clients_hold_exactly_through_four_million_keys",
        Algorithm::SlidingWindowCounter,
        4_000_000,
    );
}

/// A hot client granted one request more than its limit, once: the oracle must say so.
#[test]
fn the_oracle_reports_a_hot_client_granted_once_too_often() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    let flood = Flood {
        capacity: 8_192,
        keys: 60_000,
        keys_per_phase: 1_024,
        last_phase_keys: 10_240,
    };
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
    ] {
        flood_oracle(algorithm, flood, honest).unwrap_or_else(|breach| panic!("{breach}"));
        let planted = AtomicBool::new(false);
        let breach = flood_oracle(algorithm, flood, |service, client| {
            honest(service, client) || (client == 1 && !planted.swap(true, Ordering::Relaxed))
        });
        assert!(
            breach
                .as_ref()
                .is_err_and(|breach| breach.contains("granted 5 times")),
            "{algorithm}: the planted extra grant went unseen: {breach:?}"
        );
    }
}
