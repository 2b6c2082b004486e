//! Resident memory per idle client and time per first request at 1 000 000 clients: tollgate's
//! service beside governor's keyed limiter, each subject in a process of its own.
//!
//! ```text
//! cargo bench --bench footprint                # 3 interleaved runs of each subject, medians
//! cargo bench --bench footprint -- 5            # 5 runs of each
//! cargo xtask report footprint                  # writes the last run's section of BENCHMARKS.md
//! ```
//!
//! A run keeps its figures in `target/footprint/footprint.json` (see
//! `benches/support/results.rs`), from which the report writes its section.
//!
//! Each child process reads its resident set (`VmRSS` in `/proc/self/status`), makes one limiter
//! per client by one request each (`u64` keys, token bucket / GCRA, "100 per second", both with
//! their default randomly seeded SipHash), and reads its resident set again: the difference over
//! the number of clients is what an idle client costs, the allocator's headers and the map's
//! spare capacity included, which is what a process pays. The same loop's wall time over the
//! number of clients is the time of one first request. Subjects alternate, so that a neighbour's
//! load falls on all of them alike; the ratios of one run are the figures to compare.
//!
//! tollgate's table is allocated when the service is built, 17 bytes per client of capacity, and
//! never grows: a new client whose 16 slots (its key's two buckets) are all taken reuses an idle
//! client's slot, else evicts one. *tollgate* is given a capacity of exactly the 1 000 000
//! clients, the bound the issue's target speaks of: it holds a little fewer than all of them
//! (the table prints how many, and how many were evicted). *tollgate, 4x capacity* is given
//! four times as much, which held every client in our runs: what holding all 1 000 000 costs.
//!
//! *flood*: 10 000 000 distinct keys, one request each, through a service of capacity 1 000 000
//! (one plan, token bucket): its resident growth must stay within the table (capacity × 17 B)
//! plus 16 MiB, whatever number of keys passes through.
//!
//! *papaya floor*: a `papaya::HashMap<u64, AtomicU64>` filled the same way, the least any client
//! map built on papaya can take (with blocking resizes), the store the service used before.

use std::hint::black_box;
use std::process::{Command, ExitCode};
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use tollgate::{Algorithm, MonotonicClock, RateLimiterService, Rule, ServiceBuilder};

// Shared with the report, which reads what this harness leaves there.
#[allow(dead_code)]
#[path = "support/results.rs"]
mod results;

const CLIENTS: u64 = 1_000_000;
/// Distinct keys through the flood subject's service of capacity `CLIENTS`.
const FLOOD_KEYS: u64 = 10_000_000;
/// What a client of capacity costs in tollgate's table (16 bytes of slot, 1 of lock).
const TABLE_BYTES_PER_CLIENT: u64 = 17;
/// What the flood may grow past its table.
const FLOOD_SLACK_BYTES: u64 = 16 << 20;
const SUBJECTS: [&str; 5] = [
    "tollgate",
    "tollgate-4x",
    "governor",
    "papaya-floor",
    "flood",
];
const CHILD: &str = "--child";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(CHILD) {
        let Some(subject) = args.get(1) else {
            eprintln!("usage: {CHILD} <subject>");
            return ExitCode::FAILURE;
        };
        return match measure(subject) {
            Ok(measured) => {
                println!(
                    "{} {} {} {} {}",
                    measured.growth_bytes,
                    measured.elapsed.as_nanos(),
                    measured.requests,
                    measured.held,
                    measured.evictions
                );
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("{subject}: {error}");
                ExitCode::FAILURE
            }
        };
    }
    // `cargo bench` passes `--bench`; a number is the run count.
    let runs = args
        .iter()
        .find_map(|arg| arg.parse::<usize>().ok())
        .unwrap_or(3);
    if args.iter().any(|arg| arg == "--test") || !args.iter().any(|arg| arg == "--bench") {
        // `cargo test --benches`: this harness has no unit tests to run.
        return ExitCode::SUCCESS;
    }
    if args.iter().any(|arg| arg == "--write") {
        eprintln!(
            "error: the report writes BENCHMARKS.md now: run `cargo bench --bench footprint`, \
             then `cargo xtask report footprint`"
        );
        return ExitCode::FAILURE;
    }
    match run_all(runs) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Runs every subject `runs` times, interleaved, prints the medians, and keeps them for the
/// report.
fn run_all(runs: usize) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|error| error.to_string())?;
    let mut bytes: Vec<Vec<f64>> = vec![Vec::new(); SUBJECTS.len()];
    let mut nanos: Vec<Vec<f64>> = vec![Vec::new(); SUBJECTS.len()];
    let mut growth: Vec<Vec<f64>> = vec![Vec::new(); SUBJECTS.len()];
    // Clients held and evicted, of the last run (they hardly move from run to run).
    let mut held = vec![0_f64; SUBJECTS.len()];
    let mut evictions = vec![0_f64; SUBJECTS.len()];
    for _ in 0..runs {
        for (index, subject) in SUBJECTS.iter().enumerate() {
            let output = Command::new(&exe)
                .args([CHILD, subject])
                .output()
                .map_err(|error| format!("{subject}: {error}"))?;
            if !output.status.success() {
                return Err(format!(
                    "{subject}: {}",
                    String::from_utf8_lossy(&output.stderr)
                ));
            }
            let text = String::from_utf8_lossy(&output.stdout);
            let fields: Vec<f64> = text
                .split_whitespace()
                .map(str::parse::<f64>)
                .collect::<Result<_, _>>()
                .map_err(|_| format!("{subject}: unexpected output {text:?}"))?;
            let [grown, elapsed, requests, clients_held, evicted] = fields[..] else {
                return Err(format!("{subject}: unexpected output {text:?}"));
            };
            // Per client the subject holds space for: the flood's are its capacity.
            let clients = if *subject == "flood" {
                CLIENTS as f64
            } else {
                requests
            };
            bytes[index].push(grown / clients);
            nanos[index].push(elapsed / requests);
            growth[index].push(grown);
            held[index] = clients_held;
            evictions[index] = evicted;
        }
    }
    let median = |values: &mut Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let bytes: Vec<f64> = bytes.iter_mut().map(median).collect();
    let nanos: Vec<f64> = nanos.iter_mut().map(median).collect();
    let growth: Vec<f64> = growth.iter_mut().map(median).collect();
    println!(
        "{:<14} {:>32} {:>22} {:>14} {:>12}",
        "subject",
        "resident bytes per idle client",
        "ns per first request",
        "clients held",
        "evictions"
    );
    for (index, subject) in SUBJECTS.iter().enumerate() {
        println!(
            "{subject:<14} {:>32.1} {:>22.0} {:>14} {:>12}",
            bytes[index], nanos[index], held[index], evictions[index]
        );
    }
    let flood = SUBJECTS
        .iter()
        .position(|subject| *subject == "flood")
        .expect("a flood subject");
    let flood_bound = (CLIENTS * TABLE_BYTES_PER_CLIENT + FLOOD_SLACK_BYTES) as f64;
    println!(
        "flood: {FLOOD_KEYS} keys at capacity {CLIENTS}: resident growth {:.1} MiB, bound {:.1} MiB",
        growth[flood] / f64::from(1 << 20),
        flood_bound / f64::from(1 << 20)
    );
    let subjects: Vec<serde_json::Value> = SUBJECTS
        .iter()
        .enumerate()
        .map(|(index, subject)| {
            serde_json::json!({
                "subject": subject,
                "resident_bytes_per_client": bytes[index],
                "nanos_per_first_request": nanos[index],
                "resident_growth_bytes": growth[index],
                "clients_held": held[index],
                "evictions": evictions[index],
            })
        })
        .collect();
    let figures = serde_json::json!({
        "source": results::source_revision(),
        "clients": CLIENTS,
        "flood_keys": FLOOD_KEYS,
        "flood_bound_bytes": flood_bound,
        "runs": runs,
        "subjects": subjects,
    });
    let path = results::footprint_json();
    let written =
        std::fs::create_dir_all(path.parent().expect("a file in a folder")).and_then(|()| {
            std::fs::write(
                &path,
                serde_json::to_string_pretty(&figures).expect("a JSON value prints"),
            )
        });
    written.map_err(|error| format!("cannot write {}: {error}", path.display()))?;
    eprintln!(
        "footprint: kept in {}; `cargo xtask report footprint` writes them into BENCHMARKS.md",
        path.display()
    );
    Ok(())
}

/// What one child measured.
struct Measured {
    /// Growth of the resident set over the loop.
    growth_bytes: u64,
    /// The loop's wall time.
    elapsed: Duration,
    /// First requests made (one per key).
    requests: u64,
    /// Clients held at the end.
    held: usize,
    /// Clients evicted (tollgate only).
    evictions: u64,
}

/// tollgate's service, token bucket *100 per 1s*, holding at most `capacity` clients.
fn tollgate_service(capacity: usize) -> Result<RateLimiterService<u64, &'static str>, String> {
    ServiceBuilder::new(Algorithm::TokenBucket, MonotonicClock::new())
        .plan("plan", Rule::per_second(100).map_err(|e| e.to_string())?)
        // The most clients the table holds, allocated up front: a subject given less than its
        // clients would drop some, and measure a fuller table than it claims.
        .capacity(capacity)
        .build()
        .map_err(|error| error.to_string())
}

/// The first request of each of `keys` clients; the wall time of the loop.
fn first_requests(
    service: &RateLimiterService<u64, &'static str>,
    keys: u64,
) -> Result<Duration, String> {
    let start = Instant::now();
    for client in 0..keys {
        if !service.allow(&client, &"plan").map_err(|e| e.to_string())? {
            return Err(format!("client {client} denied its first request"));
        }
    }
    Ok(start.elapsed())
}

/// The child's side: what `subject` measured.
fn measure(subject: &str) -> Result<Measured, String> {
    let before = resident_bytes()?;
    let capacity = usize::try_from(CLIENTS).map_err(|error| error.to_string())?;
    let (elapsed, requests, held, evictions, keep) = match subject {
        "tollgate" | "tollgate-4x" | "flood" => {
            let (capacity, keys) = match subject {
                "tollgate" => (capacity, CLIENTS),
                "tollgate-4x" => (4 * capacity, CLIENTS),
                _ => (capacity, FLOOD_KEYS),
            };
            let service = tollgate_service(capacity)?;
            let elapsed = first_requests(&service, keys)?;
            let (held, evictions) = (service.len(), service.evictions());
            (
                elapsed,
                keys,
                held,
                evictions,
                Box::new(service) as Box<dyn std::any::Any>,
            )
        }
        "governor" => {
            use governor::{Quota, RateLimiter};
            let quota = Quota::per_second(std::num::NonZeroU32::new(100).expect("not zero"));
            let limiter: governor::DefaultKeyedRateLimiter<u64> = RateLimiter::keyed(quota);
            let start = Instant::now();
            for client in 0..CLIENTS {
                if limiter.check_key(&client).is_err() {
                    return Err(format!("client {client} denied its first request"));
                }
            }
            let elapsed = start.elapsed();
            if limiter.len() as u64 != CLIENTS {
                return Err(format!("{} clients held", limiter.len()));
            }
            let held = limiter.len();
            (
                elapsed,
                CLIENTS,
                held,
                0,
                Box::new(limiter) as Box<dyn std::any::Any>,
            )
        }
        "papaya-floor" => {
            // Blocking resizes, as the service's maps.
            let map: papaya::HashMap<u64, AtomicU64> = papaya::HashMap::builder()
                .resize_mode(papaya::ResizeMode::Blocking)
                .build();
            let start = Instant::now();
            for client in 0..CLIENTS {
                black_box(
                    map.pin()
                        .get_or_insert_with(client, || AtomicU64::new(client)),
                );
            }
            let elapsed = start.elapsed();
            let held = map.len();
            (
                elapsed,
                CLIENTS,
                held,
                0,
                Box::new(map) as Box<dyn std::any::Any>,
            )
        }
        other => return Err(format!("no subject called {other}")),
    };
    let after = resident_bytes()?;
    black_box(&keep);
    Ok(Measured {
        growth_bytes: after.saturating_sub(before),
        elapsed,
        requests,
        held,
        evictions,
    })
}

/// This process's resident set, in bytes.
fn resident_bytes() -> Result<u64, String> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(|error| error.to_string())?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kilobytes| kilobytes.trim().parse::<u64>().ok())
        .map(|kilobytes| kilobytes * 1024)
        .ok_or_else(|| "no VmRSS in /proc/self/status".to_owned())
}
