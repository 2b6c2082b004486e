//! A fixed load on a Redis: `--tasks` concurrent tasks (default 64), each making `--decisions`
//! decisions (default 100) for a client of its own under a limit it never reaches, on one
//! `RedisRateLimiter` with batches of up to `--batch` decisions (default 1); then the rate, and
//! how many decisions each script call carried. Made to be counted: a fixed number of
//! decisions, so that the instructions of two runs of different sizes, the client's or a
//! `redis-server`'s under callgrind, differ by the cost of the decisions between them.
//!
//! ```sh
//! redis-server --port 6399 --save "" --appendonly no &
//! cargo run --release --features redis --example redis_fixed_load -- \
//!     --redis redis://127.0.0.1:6399 --batch 8 --method token_bucket
//! ```
//!
//! The server's instructions per decision (as BENCHMARKS.md reports them): start the server
//! under `valgrind --tool=callgrind --callgrind-out-file=server.out redis-server ... --hz 1`,
//! run this once to warm it, `redis-cli flushall`, `callgrind_control -z`, run this with
//! `--decisions 20`, `callgrind_control -d`, and again with `--decisions 60`; the difference of
//! the two dumps over the 2,560 decisions between them.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::redis::RedisRateLimiter;
use tollgate::{Algorithm, Rule};

#[path = "support/report.rs"]
mod report;

#[tokio::main]
async fn main() -> ExitCode {
    report::exit_code(run().await)
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut url = "redis://127.0.0.1:6379".to_owned();
    let (mut tasks, mut decisions, mut batch) = (64_usize, 100_u64, 1_usize);
    let mut algorithm = Algorithm::TokenBucket;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} takes a value"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag} {value:?}: expected a whole number"))
        };
        match flag.as_str() {
            "--redis" => url = value.clone(),
            "--tasks" => tasks = usize::try_from(number()?)?,
            "--decisions" => decisions = number()?,
            "--batch" => batch = usize::try_from(number()?)?,
            "--method" => algorithm = value.parse()?,
            _ => {
                return Err(format!(
                    "usage: redis_fixed_load [--redis URL] [--tasks N] [--decisions N] \
                     [--batch N] [--method NAME], not {flag}"
                )
                .into());
            }
        }
    }
    let limiter = Arc::new(
        RedisRateLimiter::builder(url, algorithm)
            // Far above what a run takes, for every method (the log holds at most 65,536).
            .plan("load", Rule::per_hour(60_000)?)
            .batch_size(batch)
            .timeout(Duration::from_secs(10))
            .build()
            .await?,
    );
    let start = Instant::now();
    let mut handles = Vec::with_capacity(tasks);
    for task in 0..tasks {
        let limiter = Arc::clone(&limiter);
        let client = format!("load-{task}-{start:?}");
        handles.push(tokio::spawn(async move {
            for _ in 0..decisions {
                match limiter.allow(&client, &"load").await {
                    Ok(true) => {}
                    Ok(false) => return Err(format!("{client} refused below its limit")),
                    Err(error) => return Err(format!("{client}: {error}")),
                }
            }
            Ok(())
        }));
    }
    for handle in handles {
        handle.await??;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let stats = limiter.stats();
    println!(
        "{algorithm}, batches of up to {batch}: {} decisions in {:.3} s ({:.0}/s), {} calls \
         ({:.2} decisions a call)",
        stats.redis_decisions,
        elapsed,
        stats.redis_decisions as f64 / elapsed,
        stats.round_trips,
        stats.redis_decisions as f64 / stats.round_trips as f64
    );
    Ok(())
}
