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
//! *papaya floor*: a `papaya::HashMap<u64, AtomicU64>` filled the same way, the least any client
//! map built on papaya can take (with blocking resizes, as the service's maps).

use std::hint::black_box;
use std::process::{Command, ExitCode};
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use tollgate::{Algorithm, MonotonicClock, RateLimiterService, Rule};

// Shared with the report, which reads what this harness leaves there.
#[allow(dead_code)]
#[path = "support/results.rs"]
mod results;

const CLIENTS: u64 = 1_000_000;
const SUBJECTS: [&str; 3] = ["tollgate", "governor", "papaya-floor"];
const CHILD: &str = "--child";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(CHILD) {
        let Some(subject) = args.get(1) else {
            eprintln!("usage: {CHILD} <subject>");
            return ExitCode::FAILURE;
        };
        return match measure(subject) {
            Ok((bytes, per_request)) => {
                println!("{bytes} {}", per_request.as_nanos());
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
            let mut fields = text.split_whitespace().map(str::parse::<f64>);
            match (fields.next(), fields.next()) {
                (Some(Ok(b)), Some(Ok(n))) => {
                    bytes[index].push(b);
                    nanos[index].push(n);
                }
                _ => return Err(format!("{subject}: unexpected output {text:?}")),
            }
        }
    }
    let median = |values: &mut Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let bytes: Vec<f64> = bytes.iter_mut().map(median).collect();
    let nanos: Vec<f64> = nanos.iter_mut().map(median).collect();
    println!(
        "{:<14} {:>32} {:>22}",
        "subject", "resident bytes per idle client", "ns per first request"
    );
    for (index, subject) in SUBJECTS.iter().enumerate() {
        println!(
            "{subject:<14} {:>32.1} {:>22.0}",
            bytes[index], nanos[index]
        );
    }
    let subjects: Vec<serde_json::Value> = SUBJECTS
        .iter()
        .enumerate()
        .map(|(index, subject)| {
            serde_json::json!({
                "subject": subject,
                "resident_bytes_per_client": bytes[index],
                "nanos_per_first_request": nanos[index],
            })
        })
        .collect();
    let figures = serde_json::json!({
        "source": results::source_revision(),
        "clients": CLIENTS,
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

/// The child's side: bytes per client and time per first request for `subject`.
fn measure(subject: &str) -> Result<(f64, Duration), String> {
    let before = resident_bytes()?;
    let (elapsed, keep) = match subject {
        "tollgate" => {
            let service: RateLimiterService<u64, &str> = RateLimiterService::new(
                Algorithm::TokenBucket,
                [("plan", Rule::per_second(100).map_err(|e| e.to_string())?)],
                MonotonicClock::new(),
            )
            .map_err(|error| error.to_string())?;
            let start = Instant::now();
            for client in 0..CLIENTS {
                if !service.allow(&client, &"plan").map_err(|e| e.to_string())? {
                    return Err(format!("client {client} denied its first request"));
                }
            }
            let elapsed = start.elapsed();
            if service.len() as u64 != CLIENTS {
                return Err(format!("{} clients held", service.len()));
            }
            (elapsed, Box::new(service) as Box<dyn std::any::Any>)
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
            (elapsed, Box::new(limiter) as Box<dyn std::any::Any>)
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
            (elapsed, Box::new(map) as Box<dyn std::any::Any>)
        }
        other => return Err(format!("no subject called {other}")),
    };
    let after = resident_bytes()?;
    black_box(&keep);
    Ok((
        after.saturating_sub(before) as f64 / CLIENTS as f64,
        elapsed / CLIENTS as u32,
    ))
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
