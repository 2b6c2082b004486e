//! A fleet of nodes sharing one Redis: each node its own `RedisRateLimiter` (its own connection),
//! many tasks per node, one client. The fleet admits what one limiter would: exactly the limit
//! over a window longer than the run.
//!
//! ```sh
//! cargo run --release --features redis --example fleet -- --redis redis://127.0.0.1:6379 \
//!     --nodes 4 --algorithm fixed_window --limit 100 --window 1h --requests 10000
//! ```
//!
//! Options (all optional): `--redis URL` (`redis://host:port`, `redis+cluster://host:port[,...]`
//! naming any node of a Redis Cluster, or `rediss://` with feature `redis-tls`), `--nodes N` (4), `--tasks T` per node (8),
//! `--algorithm token_bucket|fixed_window|sliding_window_log|sliding_window_counter`
//! (fixed_window), `--limit N` (100), `--window 1h|30m|10s|500ms` (1h), `--requests R` (10000),
//! `--client NAME` (a fresh name per run). The last line printed is `admitted A of R`.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tollgate::redis::RedisRateLimiter;
use tollgate::{Algorithm, Rule};

#[path = "support/report.rs"]
mod report;

#[derive(Debug)]
struct Options {
    redis: String,
    nodes: u64,
    tasks: u64,
    algorithm: Algorithm,
    limit: u64,
    window: Duration,
    requests: u64,
    client: String,
}

fn parse_window(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("window {text:?} has no unit: use ms, s, m, h or d"))?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("window {text:?} does not start with a whole number"))?;
    let unit_secs = match unit {
        "ms" => return Ok(Duration::from_millis(number)),
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => {
            return Err(format!(
                "window unit {unit:?} is unknown: use ms, s, m, h or d"
            ));
        }
    };
    Ok(Duration::from_secs(number.saturating_mul(unit_secs)))
}

fn parse() -> Result<Options, String> {
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis());
    let mut options = Options {
        redis: "redis://127.0.0.1:6379".to_owned(),
        nodes: 4,
        tasks: 8,
        algorithm: Algorithm::FixedWindow,
        limit: 100,
        window: Duration::from_secs(3_600),
        requests: 10_000,
        client: format!("fleet-{}-{stamp}", std::process::id()),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag} {value:?} is not a whole number"))
        };
        match flag.as_str() {
            "--redis" => options.redis = value.clone(),
            "--nodes" => options.nodes = number()?.max(1),
            "--tasks" => options.tasks = number()?.max(1),
            "--algorithm" => options.algorithm = value.parse().map_err(|e| format!("{e}"))?,
            "--limit" => options.limit = number()?,
            "--window" => options.window = parse_window(&value)?,
            "--requests" => options.requests = number()?,
            "--client" => options.client = value.clone(),
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(options)
}

#[tokio::main]
async fn main() -> ExitCode {
    report::exit_code(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let options = &parse()?;
    let rule = Rule::new(options.limit, options.window)?;
    let mut nodes = Vec::new();
    for _ in 0..options.nodes {
        let node = RedisRateLimiter::builder(options.redis.clone(), options.algorithm)
            .plan("fleet", rule)
            .build()
            .await?;
        nodes.push(Arc::new(node));
    }
    println!(
        "{} nodes x {} tasks, {}, {rule}, client {}",
        options.nodes, options.tasks, options.algorithm, options.client
    );

    // Requests are handed out from one counter, so the nodes share the load as they keep up.
    let next = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for node in &nodes {
        for _ in 0..options.tasks {
            let (node, next, admitted) =
                (Arc::clone(node), Arc::clone(&next), Arc::clone(&admitted));
            let (requests, client) = (options.requests, options.client.clone());
            tasks.push(tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < requests {
                    if node.allow(&client, &"fleet").await? {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok::<(), tollgate::redis::RedisError>(())
            }));
        }
    }
    for task in tasks {
        task.await??;
    }
    let elapsed = started.elapsed();
    for (i, node) in nodes.iter().enumerate() {
        let stats = node.stats();
        println!(
            "node {i}: {} round trips, {} deny-cache hits, {} fallbacks",
            stats.round_trips, stats.cache_hits, stats.fallbacks
        );
    }
    println!(
        "{:.0} decisions/s over {elapsed:.2?}",
        options.requests as f64 / elapsed.as_secs_f64()
    );
    println!(
        "admitted {} of {}",
        admitted.load(Ordering::Relaxed),
        options.requests
    );
    Ok(())
}
