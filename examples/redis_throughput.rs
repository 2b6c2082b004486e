//! Decisions per second against a Redis, with 1, 8 and 64 concurrent tasks on one
//! `RedisRateLimiter` (one multiplexed connection, or `--connections N` taken in turn), the round
//! trips each decision took, and what the local deny cache saves when one client is over its
//! limit.
//!
//! ```sh
//! redis-server --port 6399 --save "" --appendonly no &
//! cargo run --release --features redis --example redis_throughput -- --redis redis://127.0.0.1:6399
//! ```
//!
//! `--redis` takes any URL the builder does: `redis+cluster://host:port` for a Redis Cluster
//! (any of its nodes), `rediss://` for TLS (feature `redis-tls`). The empty script's floor is
//! measured on a single server's connection managers, as many as the limiter's connections.
//!
//! About 20 seconds. Allow-heavy: each task its own client under a limit it never reaches,
//! beside an empty script (`return 1`) called by as many tasks on one connection manager, and
//! each method's rate as a multiple of that floor.
//! Deny-heavy: every task the same client, over its limit for the whole run, with the deny cache
//! on and off.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate::redis::RedisRateLimiter;
use tollgate::{Algorithm, Rule};

#[path = "support/report.rs"]
mod report;

/// Each configuration runs this long.
const RUN_TIME: Duration = Duration::from_secs(1);

const TASK_COUNTS: [usize; 3] = [1, 8, 64];

struct Figures {
    per_second: f64,
    round_trips_per_decision: f64,
    /// Round trips that failed (a busy machine can miss the 50 ms timeout); not decisions.
    errors: u64,
}

impl Figures {
    fn cell(&self, precision: usize) -> String {
        let errors = if self.errors > 0 {
            format!(" {} err", self.errors)
        } else {
            String::new()
        };
        format!(
            " {:>13.0} ({:.precision$}){errors}",
            self.per_second, self.round_trips_per_decision
        )
    }
}

async fn measure(
    limiter: Arc<RedisRateLimiter<&'static str>>,
    tasks: usize,
    shared_client: bool,
) -> Figures {
    let stop = Arc::new(AtomicBool::new(false));
    let decisions = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let before = limiter.stats().round_trips;
    let run = format!("{:?}", Instant::now());
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (limiter, stop) = (Arc::clone(&limiter), Arc::clone(&stop));
        let (decisions, errors) = (Arc::clone(&decisions), Arc::clone(&errors));
        let client = if shared_client {
            format!("shared-{run}")
        } else {
            format!("task-{task}-{run}")
        };
        handles.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let counter = match limiter.acquire(&client, &"bench", 1).await {
                    Ok(_) => &decisions,
                    Err(_) => &errors,
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(RUN_TIME).await;
    stop.store(true, Ordering::Relaxed);
    for handle in handles {
        handle.await.expect("a task panicked");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let decisions = decisions.load(Ordering::Relaxed) as f64;
    let round_trips = (limiter.stats().round_trips - before) as f64;
    Figures {
        per_second: decisions / elapsed,
        round_trips_per_decision: round_trips / decisions.max(1.0),
        errors: errors.load(Ordering::Relaxed),
    }
}

/// Calls per second of an empty script (`return 1`) by `tasks` concurrent tasks on `connections`
/// connection managers (task `i` on the `i % connections`-th), as the limiter's: the floor a
/// decision's round trip cannot beat.
async fn empty_script_rate(
    url: &str,
    tasks: usize,
    connections: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    let client = redis::Client::open(url)?;
    let mut managers = Vec::with_capacity(connections);
    for _ in 0..connections {
        managers.push(client.get_connection_manager().await?);
    }
    let script = Arc::new(redis::Script::new("return 1"));
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (mut connection, script) = (managers[task % connections].clone(), Arc::clone(&script));
        let (stop, calls) = (Arc::clone(&stop), Arc::clone(&calls));
        handles.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let reply: redis::RedisResult<i64> = script.invoke_async(&mut connection).await;
                if reply.is_ok() {
                    calls.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(RUN_TIME).await;
    stop.store(true, Ordering::Relaxed);
    for handle in handles {
        handle.await?;
    }
    Ok(calls.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

#[tokio::main]
async fn main() -> ExitCode {
    report::exit_code(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut url = "redis://127.0.0.1:6379".to_owned();
    let mut connections = 1;
    while let Some(flag) = args.next() {
        match (flag.as_str(), args.next()) {
            ("--redis", Some(value)) => url = value,
            ("--connections", Some(value)) => {
                connections = value
                    .parse()
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| format!("--connections {value:?}: expected 1 or more"))?;
            }
            _ => {
                return Err(format!(
                    "usage: redis_throughput [--redis URL] [--connections N], not {flag}"
                )
                .into());
            }
        }
    }
    println!("{connections} connection(s) for the limiter and for the empty script\n");

    println!(
        "allow-heavy (a client per task, never limited): decisions/s (round trips per decision)"
    );
    println!(
        "{:<22} {:>22} {:>22} {:>22}",
        "method", "1 task", "8 tasks", "64 tasks"
    );
    // The floor needs a single server's connection; against a cluster the ratios read NaN.
    let on_one_server = !url.contains("+cluster://");
    let mut empty = Vec::new();
    for tasks in TASK_COUNTS {
        empty.push(if on_one_server {
            empty_script_rate(&url, tasks, connections).await?
        } else {
            f64::NAN
        });
    }
    let mut ratios = Vec::new();
    for algorithm in Algorithm::ALL {
        // Far above what a run can take, for every method (the log holds at most 65,536).
        let rule = Rule::per_hour(60_000)?;
        let limiter = Arc::new(
            RedisRateLimiter::builder(url.clone(), algorithm)
                .plan("bench", rule)
                .connections(connections)
                .build()
                .await?,
        );
        let mut row = format!("{:<22}", algorithm.to_string());
        let mut ratio_row = format!("{:<22}", algorithm.to_string());
        for (tasks, empty) in TASK_COUNTS.into_iter().zip(&empty) {
            let figures = measure(Arc::clone(&limiter), tasks, false).await;
            row += &figures.cell(2);
            ratio_row += &format!(" {:>21.2}x", figures.per_second / empty);
        }
        println!("{row}");
        ratios.push(ratio_row);
    }
    let mut row = format!("{:<22}", "empty script");
    for rate in &empty {
        row += &format!(" {rate:>13.0}        ");
    }
    println!("{row}");

    println!();
    println!("decisions/s against empty-script calls/s, same tasks, same connections each way");
    for row in ratios {
        println!("{row}");
    }

    println!();
    println!(
        "deny-heavy (one client over its limit), token bucket: decisions/s (round trips per decision)"
    );
    println!(
        "{:<22} {:>22} {:>22} {:>22}",
        "deny cache", "1 task", "8 tasks", "64 tasks"
    );
    for capacity in [
        tollgate::redis::RedisRateLimiterBuilder::<&str>::DEFAULT_DENY_CACHE_CAPACITY,
        0,
    ] {
        let limiter = Arc::new(
            RedisRateLimiter::builder(url.clone(), Algorithm::TokenBucket)
                .plan("bench", Rule::per_hour(1)?)
                .deny_cache(capacity)
                .connections(connections)
                .build()
                .await?,
        );
        let mut row = format!("{:<22}", if capacity > 0 { "on" } else { "off" });
        for tasks in TASK_COUNTS {
            row += &measure(Arc::clone(&limiter), tasks, true).await.cell(5);
        }
        println!("{row}");
    }
    Ok(())
}
