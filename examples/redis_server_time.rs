//! What each decision costs the Redis server: microseconds of server time per script call
//! (`INFO commandstats`, `cmdstat_evalsha`) for every method, beside a GCRA script of the usual
//! shape and an empty script; then the server time and key size of the largest sliding-log
//! request (`SLOWLOG` with a threshold of 0, `MEMORY USAGE`), and the key of a log holding its
//! most batches.
//!
//! ```sh
//! redis-server --port 6399 --save "" --appendonly no &
//! cargo run --release --features redis --example redis_server_time -- --redis redis://127.0.0.1:6399
//! ```
//!
//! It resets the server's statistics and slow log (`CONFIG RESETSTAT`, `SLOWLOG RESET`) and
//! changes its slow-log threshold: point it at a server of its own.

use std::process::ExitCode;
use std::time::Instant;

use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, Script};
use tollgate::redis::RedisRateLimiter;
use tollgate::{Algorithm, Rule};

#[path = "support/gcra.rs"]
mod gcra;
#[path = "support/report.rs"]
mod report;

/// Calls measured per script.
const CALLS: u64 = 20_000;

/// Clients the calls cycle through, so that keys are read and written as in a fleet.
const CLIENTS: u64 = 1_000;

#[tokio::main]
async fn main() -> ExitCode {
    report::exit_code(run().await)
}

/// Microseconds per `EVALSHA` since the last `CONFIG RESETSTAT`.
async fn evalsha_usec_per_call(
    connection: &mut MultiplexedConnection,
) -> Result<f64, Box<dyn std::error::Error>> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(connection)
        .await?;
    let line = info
        .lines()
        .find(|line| line.starts_with("cmdstat_evalsha:"))
        .ok_or("no cmdstat_evalsha in INFO commandstats")?;
    let field = line
        .split(',')
        .find_map(|field| field.strip_prefix("usec_per_call="))
        .ok_or("no usec_per_call for evalsha")?;
    Ok(field.parse()?)
}

async fn reset_stats(connection: &mut MultiplexedConnection) -> redis::RedisResult<()> {
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(connection)
        .await
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut url = "redis://127.0.0.1:6379".to_owned();
    while let Some(flag) = args.next() {
        match (flag.as_str(), args.next()) {
            ("--redis", Some(value)) => url = value,
            _ => return Err(format!("usage: redis_server_time [--redis URL], not {flag}").into()),
        }
    }
    let mut connection = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;

    println!(
        "server time per call (INFO commandstats, cmdstat_evalsha usec_per_call), {CALLS} calls each"
    );
    // Allow-heavy: each client far below its limit, so every call commits.
    let rule = Rule::per_hour(60_000)?;
    let run = format!("{:?}", Instant::now());
    for algorithm in Algorithm::ALL {
        let limiter = RedisRateLimiter::builder(url.clone(), algorithm)
            .plan("bench", rule)
            .build()
            .await?;
        let _ = limiter.acquire("warm-up", &"bench", 1).await?;
        reset_stats(&mut connection).await?;
        for call in 0..CALLS {
            let client = format!("{run}-{}", call % CLIENTS);
            let _ = limiter.acquire(&client, &"bench", 1).await?;
        }
        let usec = evalsha_usec_per_call(&mut connection).await?;
        println!("{:<24} {usec:>6.2} us", algorithm.to_string());
    }
    for (name, source) in [
        ("GCRA, GET/SET shape", gcra::GCRA),
        ("empty (return 1)", "return 1"),
    ] {
        let script = Script::new(source);
        let _: redis::Value = gcra::allowed_call(&script, "warm-up")
            .invoke_async(&mut connection)
            .await?;
        reset_stats(&mut connection).await?;
        for call in 0..CALLS {
            let key = format!("gcra:{run}-{}", call % CLIENTS);
            let _: redis::Value = gcra::allowed_call(&script, &key)
                .invoke_async(&mut connection)
                .await?;
        }
        let usec = evalsha_usec_per_call(&mut connection).await?;
        println!("{name:<24} {usec:>6.2} us");
    }

    println!();
    let max = tollgate::SlidingWindowLog::<tollgate::MonotonicClock>::MAX_LIMIT;
    let limiter = RedisRateLimiter::builder(url.clone(), Algorithm::SlidingWindowLog)
        .plan("bench", Rule::per_hour(max)?)
        // Long enough to measure a request however long it takes.
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .await?;
    let client = format!("{run}-largest");
    let _ = limiter.acquire(&client, &"bench", 1).await?;
    let key = limiter.keys(&client, &"bench")?.remove(0);
    let _: () = connection.del(&key).await?;
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(0)
        .exec_async(&mut connection)
        .await?;
    redis::cmd("SLOWLOG")
        .arg("RESET")
        .exec_async(&mut connection)
        .await?;
    let decision = limiter.acquire(&client, &"bench", max).await?;
    let usec = slowlog_evalsha_usec(&mut connection).await?;
    let bytes: Option<u64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(&key)
        .query_async(&mut connection)
        .await?;
    println!(
        "sliding log, one request of n = {max} (allowed: {}): {usec} us of server time (SLOWLOG), key {} bytes (MEMORY USAGE)",
        decision.is_allowed(),
        bytes.unwrap_or(0)
    );

    // The most batches a log can hold: `limit` requests of one permit each.
    let client = format!("{run}-most-batches");
    let mut handles = Vec::new();
    let limiter = std::sync::Arc::new(limiter);
    for task in 0..64 {
        let (limiter, client) = (std::sync::Arc::clone(&limiter), client.clone());
        handles.push(tokio::spawn(async move {
            let mut granted = 0;
            for _ in (task..max).step_by(64) {
                if limiter.acquire(&client, &"bench", 1).await?.is_allowed() {
                    granted += 1;
                }
            }
            Ok::<u64, tollgate::redis::RedisError>(granted)
        }));
    }
    let mut granted = 0;
    for handle in handles {
        granted += handle.await??;
    }
    let key = limiter.keys(&client, &"bench")?.remove(0);
    let bytes: Option<u64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(&key)
        .query_async(&mut connection)
        .await?;
    redis::cmd("SLOWLOG")
        .arg("RESET")
        .exec_async(&mut connection)
        .await?;
    let decision = limiter.acquire(&client, &"bench", 1).await?;
    let usec = slowlog_evalsha_usec(&mut connection).await?;
    println!(
        "sliding log, {granted} requests of 1: key {} bytes (MEMORY USAGE); one more (allowed: {}) {usec} us of server time",
        bytes.unwrap_or(0),
        decision.is_allowed(),
    );
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(10_000)
        .exec_async(&mut connection)
        .await?;
    Ok(())
}

/// The longest `EVALSHA` in the slow log, in microseconds.
async fn slowlog_evalsha_usec(
    connection: &mut MultiplexedConnection,
) -> Result<i64, Box<dyn std::error::Error>> {
    let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(128)
        .query_async(connection)
        .await?;
    let mut longest = None;
    for entry in entries {
        let redis::Value::Array(fields) = entry else {
            continue;
        };
        let (Some(redis::Value::Int(usec)), Some(redis::Value::Array(argv))) =
            (fields.get(2), fields.get(3))
        else {
            continue;
        };
        let is_evalsha = matches!(argv.first(), Some(redis::Value::BulkString(name))
            if name.eq_ignore_ascii_case(b"evalsha"));
        if is_evalsha {
            longest = longest.max(Some(*usec));
        }
    }
    longest.ok_or_else(|| "no EVALSHA in the slow log".into())
}
