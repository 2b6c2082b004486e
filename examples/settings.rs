//! A service built from a settings file, answering as a proxy would: allowed or 429, with the
//! `Retry-After`, `RateLimit-Policy` and `RateLimit` values for each response.
//!
//! Run with `cargo run --release --features settings --example settings [path/to/settings.toml]`;
//! without a path it reads `examples/settings/plans.toml`.

use std::process::ExitCode;
use std::time::Duration;

use tollgate::{FakeClock, Settings};

#[path = "support/report.rs"]
mod report;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    Free,
    Pro,
}

impl Tier {
    fn name(self) -> &'static str {
        match self {
            Tier::Free => "free",
            Tier::Pro => "pro",
        }
    }
}

fn main() -> ExitCode {
    report::exit_code(run())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/examples/settings/plans.toml").to_owned()
    });
    let settings = Settings::from_path(&path)?;
    println!("{path}: {}", settings.algorithm());
    for (plan, rules) in settings.plans() {
        let rules: Vec<String> = rules.iter().map(ToString::to_string).collect();
        println!("  plan {plan}: {}", rules.join(" and "));
    }

    // A fake clock so the run is the same every time; a server uses MonotonicClock::new().
    let clock = FakeClock::starting_at(Duration::from_millis(1_990));
    let service = settings.build_service_with_plans::<String, _, _>(
        clock.clone(),
        [
            (Tier::Free.name(), Tier::Free),
            (Tier::Pro.name(), Tier::Pro),
        ],
    )?;

    let (mut allowed, mut denied) = (0, 0);
    for (label, advance) in [("burst", 0), ("20 ms later", 20), ("1 s later", 1_000)] {
        clock.advance(Duration::from_millis(advance));
        println!("\n{label}: 6 requests from alice (free)");
        for _ in 0..6 {
            let decision = service.acquire("alice", &Tier::Free, 1)?;
            let status = if decision.is_allowed() { "200" } else { "429" };
            if decision.is_allowed() {
                allowed += 1;
            } else {
                denied += 1;
            }
            let retry_after = decision
                .retry_after_header()
                .map(|seconds| format!("  Retry-After: {seconds}"))
                .unwrap_or_default();
            println!(
                "  {status}  RateLimit-Policy: {}  RateLimit: {}{retry_after}",
                decision.ratelimit_policy_header(Tier::Free.name())?,
                decision.ratelimit_header(Tier::Free.name())?,
            );
        }
    }
    println!("\nplan free: {allowed} allowed, {denied} denied");
    Ok(())
}
