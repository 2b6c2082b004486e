//! What a rate limiter is chosen for, shown on tollgate and checked: bursts and refills, one
//! limiter per client and one rule per plan, the window-edge burst on every window method, and
//! exactly the limit under racing threads. Exits non-zero on any failure.
//!
//! Run with `cargo run --release --example demo`.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tollgate::{Algorithm, FakeClock, RateLimiterService, Rule, RuleError, ServiceError};

#[path = "support/report.rs"]
mod report;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    Free,
    Pro,
}

type Service = RateLimiterService<String, Tier, FakeClock>;

fn rules() -> Result<[(Tier, Rule); 2], RuleError> {
    Ok([
        (Tier::Free, Rule::new(5, Duration::from_millis(1_000))?),
        (Tier::Pro, Rule::new(50, Duration::from_millis(1_000))?),
    ])
}

fn service(algorithm: Algorithm, clock: &FakeClock) -> Result<Service, Box<dyn std::error::Error>> {
    Ok(RateLimiterService::new(algorithm, rules()?, clock.clone())?)
}

/// How many of `n` requests from `client` on `tier` are allowed.
fn count(service: &Service, client: &str, tier: Tier, n: usize) -> Result<usize, ServiceError> {
    let mut allowed = 0;
    for _ in 0..n {
        if service.allow(client, &tier)? {
            allowed += 1;
        }
    }
    Ok(allowed)
}

fn check(ok: bool, what: &str) {
    println!("{}{what}", if ok { "  ok  " } else { "  FAIL " });
    if !ok {
        std::process::exit(1);
    }
}

fn main() -> ExitCode {
    report::exit_code(run())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let clock = FakeClock::new();
    let tb = service(Algorithm::TokenBucket, &clock)?;
    check(
        count(&tb, "alice", Tier::Free, 10)? == 5,
        "token bucket: a burst of 10 lets 5 through (bucket size 5)",
    );
    clock.advance(Duration::from_millis(200));
    check(
        count(&tb, "alice", Tier::Free, 10)? == 1,
        "token bucket: 200 ms later exactly 1 token has refilled (5 per 1000 ms)",
    );
    check(
        count(&tb, "bob", Tier::Free, 10)? == 5,
        "per client: bob has his own bucket, alice's use does not affect him",
    );
    check(
        count(&tb, "carol", Tier::Pro, 60)? == 50,
        "per tier: a PRO client gets 50",
    );

    // t = 1990 ms: the last 10 ms of window [1000, 2000).
    let c2 = FakeClock::starting_at(Duration::from_millis(1_990));
    let fw = service(Algorithm::FixedWindow, &c2)?;
    let end_of_window = count(&fw, "dave", Tier::Free, 5)?;
    c2.advance(Duration::from_millis(20)); // t = 2010 ms: window [2000, 3000) has started
    let start_of_next = count(&fw, "dave", Tier::Free, 5)?;
    check(
        end_of_window + start_of_next == 10,
        "fixed window: 10 requests pass within 20 ms across a window edge, double the limit",
    );

    // The same two bursts, 20 ms apart.
    let c3 = FakeClock::starting_at(Duration::from_millis(1_990));
    let sw = service(Algorithm::SlidingWindowLog, &c3)?;
    let a = count(&sw, "erin", Tier::Free, 5)?;
    c3.advance(Duration::from_millis(20));
    let b = count(&sw, "erin", Tier::Free, 5)?;
    check(
        a + b == 5,
        "sliding window log: the same edge burst is held to 5, the true limit",
    );

    // The same two bursts again: 10 ms into the next window, the last window's 5 still weigh
    // ceil(5 * 990 / 1000) = 5.
    let c4 = FakeClock::starting_at(Duration::from_millis(1_990));
    let sc = service(Algorithm::SlidingWindowCounter, &c4)?;
    let a = count(&sc, "grace", Tier::Free, 5)?;
    c4.advance(Duration::from_millis(20));
    let b = count(&sc, "grace", Tier::Free, 5)?;
    check(
        (a, b) == (5, 0),
        "sliding window counter: the same edge burst is held to 5, the last window weighed in",
    );

    // 1,000 requests from 16 threads, all at one frozen instant.
    let conc = Arc::new(service(Algorithm::TokenBucket, &FakeClock::new())?);
    let allowed = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..16)
        .map(|thread| {
            let conc = Arc::clone(&conc);
            let allowed = Arc::clone(&allowed);
            std::thread::spawn(move || -> Result<(), ServiceError> {
                // 1,000 requests split over 16 threads: the first 8 take 63, the rest 62.
                let share = 1_000 / 16 + usize::from(thread < 1_000 % 16);
                for _ in 0..share {
                    if conc.allow("frank", &Tier::Pro)? {
                        // Relaxed: a tally read after every thread is joined.
                        allowed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(())
            })
        })
        .collect();
    for thread in threads {
        thread.join().map_err(|_| "a request thread panicked")??;
    }
    check(
        allowed.load(Ordering::Relaxed) == 50,
        "concurrency: 1,000 requests from 16 threads at one instant, exactly 50 allowed",
    );
    Ok(())
}
