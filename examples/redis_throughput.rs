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
//! `--batch N` sends up to N waiting decisions in one script call
//! (`RedisRateLimiterBuilder::batch_size`; a single server only).
//!
//! `--redis` takes any URL the builder does: `redis+cluster://host:port` for a Redis Cluster
//! (any of its nodes), `rediss://` for TLS (feature `redis-tls`). The empty script's floor is
//! measured on a single server's connection managers, as many as the limiter's connections.
//!
//! About 25 seconds. Allow-heavy: each task its own client under a limit it never reaches,
//! beside an empty script (`return 1`) and a GCRA script of the usual shape (`TIME`, `GET`,
//! `SET`: what a bare token bucket costs) called by as many tasks on as many connection
//! managers, and each one's rate as a multiple of the empty script's, the floor.
//! Deny-heavy: every task the same client, over its limit for the whole run, with the deny cache
//! on and off.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate::redis::RedisRateLimiter;
use tollgate::{Algorithm, Rule};

#[path = "support/gcra.rs"]
mod gcra;
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

/// A script measured beside the limiter: the empty one, the floor a decision's round trip
/// cannot beat, or a GCRA script of the usual shape (`TIME`, `GET`, `SET`), what a bare token
/// bucket costs on the same round trip.
#[derive(Clone, Copy, PartialEq)]
enum Bare {
    Empty,
    Gcra,
}

/// Calls per second of `bare` by `tasks` concurrent tasks on `connections` connection managers
/// (task `i` on the `i % connections`-th), as the limiter's; the GCRA script's calls each on the
/// task's own key, allowed throughout.
async fn bare_script_rate(
    url: &str,
    bare: Bare,
    tasks: usize,
    connections: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    let client = redis::Client::open(url)?;
    let mut managers = Vec::with_capacity(connections);
    for _ in 0..connections {
        managers.push(client.get_connection_manager().await?);
    }
    let source = match bare {
        Bare::Empty => "return 1",
        Bare::Gcra => gcra::GCRA,
    };
    let script = Arc::new(redis::Script::new(source));
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let run = format!("{:?}", Instant::now());
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (mut connection, script) = (managers[task % connections].clone(), Arc::clone(&script));
        let (stop, calls) = (Arc::clone(&stop), Arc::clone(&calls));
        let key = format!("bench-gcra-{task}-{run}");
        handles.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let invocation = match bare {
                    Bare::Empty => script.prepare_invoke(),
                    Bare::Gcra => gcra::allowed_call(&script, &key),
                };
                let reply: redis::RedisResult<redis::Value> =
                    invocation.invoke_async(&mut connection).await;
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

/// Rounds of the paired one-task measurement, and the time each subject runs in a round.
const PAIRED_ROUNDS: usize = 21;
const PAIRED_SLICE: Duration = Duration::from_millis(100);

/// One task's round trips, paired: the empty script, the GCRA script and each method's decisions
/// take turns in short slices, round after round, each slice's rate a multiple of the empty
/// script's in the same round; the median of each subject's multiples. A shared machine's load
/// moves every rate from one second to the next, and the turns see nearly the same load.
async fn paired_one_task(
    url: &str,
    limiters: &[(Algorithm, Arc<RedisRateLimiter<&'static str>>)],
) -> Result<(), Box<dyn std::error::Error>> {
    let mut connection = redis::Client::open(url)?.get_connection_manager().await?;
    let (empty, gcra_script) = (
        redis::Script::new("return 1"),
        redis::Script::new(gcra::GCRA),
    );
    let run = format!("{:?}", Instant::now());
    let key = format!("bench-gcra-paired-{run}");
    let client = format!("paired-{run}");
    // One rate per subject and round: the empty script first, then the GCRA script and the
    // methods.
    let mut multiples = vec![Vec::with_capacity(PAIRED_ROUNDS); 1 + limiters.len()];
    for _ in 0..PAIRED_ROUNDS {
        let mut rates = Vec::with_capacity(2 + limiters.len());
        for subject in 0..2 + limiters.len() {
            let started = Instant::now();
            let mut calls = 0u64;
            while started.elapsed() < PAIRED_SLICE {
                match subject {
                    0 => {
                        let _: i64 = empty.invoke_async(&mut connection).await?;
                    }
                    1 => {
                        let _: redis::Value = gcra::allowed_call(&gcra_script, &key)
                            .invoke_async(&mut connection)
                            .await?;
                    }
                    method => {
                        let (algorithm, limiter) = &limiters[method - 2];
                        if !limiter.acquire(&client, &"bench", 1).await?.is_allowed() {
                            return Err(
                                format!("{algorithm}: a paired decision was refused").into()
                            );
                        }
                    }
                }
                calls += 1;
            }
            rates.push(calls as f64 / started.elapsed().as_secs_f64());
        }
        for (multiples, rate) in multiples.iter_mut().zip(&rates[1..]) {
            multiples.push(rate / rates[0]);
        }
    }
    println!(
        "one task, paired ({PAIRED_ROUNDS} rounds of {} ms each): median multiple of the empty \
         script's calls/s (lowest, highest)",
        PAIRED_SLICE.as_millis()
    );
    let names = std::iter::once("GCRA script".to_owned())
        .chain(limiters.iter().map(|(algorithm, _)| algorithm.to_string()));
    for (name, mut multiples) in names.zip(multiples) {
        multiples.sort_by(f64::total_cmp);
        println!(
            "{name:<22} {:>8.2}x ({:.2}-{:.2})",
            multiples[multiples.len() / 2],
            multiples[0],
            multiples[multiples.len() - 1]
        );
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    report::exit_code(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut url = "redis://127.0.0.1:6379".to_owned();
    let mut connections = 1;
    let mut batch_size = 1;
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
            ("--batch", Some(value)) => {
                batch_size = value
                    .parse()
                    .map_err(|_| format!("--batch {value:?}: expected a batch size"))?;
            }
            _ => {
                return Err(format!(
                    "usage: redis_throughput [--redis URL] [--connections N] [--batch N], not {flag}"
                )
                .into());
            }
        }
    }
    println!(
        "{connections} connection(s) for the limiter and for the empty script; batches of up to \
         {batch_size} decisions\n"
    );

    println!(
        "allow-heavy (a client per task, never limited): decisions/s (round trips per decision)"
    );
    println!(
        "{:<22} {:>22} {:>22} {:>22}",
        "method", "1 task", "8 tasks", "64 tasks"
    );
    // The floor needs a single server's connection; against a cluster the ratios read NaN.
    let on_one_server = !url.contains("+cluster://");
    let (mut empty, mut gcra) = (Vec::new(), Vec::new());
    for tasks in TASK_COUNTS {
        for (bare, rates) in [(Bare::Empty, &mut empty), (Bare::Gcra, &mut gcra)] {
            rates.push(if on_one_server {
                bare_script_rate(&url, bare, tasks, connections).await?
            } else {
                f64::NAN
            });
        }
    }
    let mut ratios = Vec::new();
    let mut limiters = Vec::new();
    for algorithm in Algorithm::ALL {
        // Far above what a run can take, for every method (the log holds at most 65,536).
        let rule = Rule::per_hour(60_000)?;
        let limiter = Arc::new(
            RedisRateLimiter::builder(url.clone(), algorithm)
                .plan("bench", rule)
                .connections(connections)
                .batch_size(batch_size)
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
        limiters.push((algorithm, limiter));
    }
    for (name, rates) in [("empty script", &empty), ("GCRA script", &gcra)] {
        let mut row = format!("{name:<22}");
        for rate in rates {
            row += &format!(" {rate:>13.0}        ");
        }
        println!("{row}");
    }

    println!();
    println!("decisions/s against empty-script calls/s, same tasks, same connections each way");
    for row in ratios {
        println!("{row}");
    }
    let mut row = format!("{:<22}", "GCRA script");
    for (gcra, empty) in gcra.iter().zip(&empty) {
        row += &format!(" {:>21.2}x", gcra / empty);
    }
    println!("{row}");

    if on_one_server && connections == 1 {
        println!();
        paired_one_task(&url, &limiters).await?;
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
                .batch_size(batch_size)
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
