//! The benchmark suite: tollgate's limiters against the seed design's mutex limiters
//! (`tests/support/reference.rs`, the one copy the property tests also use) and against governor,
//! all measured in the same run.
//!
//! - [`single_thread`]: ns per allowed and per denied decision, one limiter, one thread; and the
//!   clocks alone.
//! - [`contended`]: aggregate decisions per second on one limiter shared by 1, 2 and 4 threads.
//! - [`service`]: the per-client service: lookups among 10 000 and 1 000 000 clients, and first
//!   requests.
//! - [`memory`]: heap per idle client, printed after the timings (criterion cannot measure it).
//!
//! Run `cargo bench --bench tollgate` (about nine minutes), or `cargo bench --bench tollgate --
//! <filter>` for a part; then `cargo xtask report criterion` writes `BENCHMARKS.md` from
//! criterion's results, `memory.json` and `run.json`. The ids are made in [`ids`].

use std::time::Duration;

use criterion::Criterion;

mod alloc_counter;
mod conditions;
mod contended;
// Some ids only the report reads.
#[allow(dead_code)]
mod ids;
mod memory;
mod peers;
// The one copy of the mutex references, shared with the property tests.
#[path = "../../tests/support/reference.rs"]
mod reference;
// Shared with the report, which reads what the suite leaves there.
#[allow(dead_code)]
#[path = "../support/results.rs"]
mod results;
mod service;
mod single_thread;
mod workload;

#[global_allocator]
static ALLOCATOR: alloc_counter::CountingAllocator = alloc_counter::CountingAllocator;

/// A modest budget per benchmark, so that the whole suite runs in minutes: these routines take
/// nanoseconds, and a few seconds of samples pin them down better than this machine's noise does.
fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Only a measuring run leaves files for the report: `cargo test --benches` and `--test` run
    // each benchmark once, and `--list` and `--profile-time` measure nothing.
    let measuring = args.iter().any(|arg| arg == "--bench")
        && !args
            .iter()
            .any(|arg| ["--test", "--list", "--profile-time"].contains(&arg.as_str()));
    let mut criterion = config();
    let mut run = measuring.then(conditions::Run::start);
    single_thread::bench(&mut criterion);
    if let Some(run) = &mut run {
        run.snapshot("before the contended benchmarks");
    }
    let on_cpu_shares = contended::bench(&mut criterion);
    if let Some(run) = &mut run {
        run.snapshot("after the contended benchmarks");
        run.on_cpu_shares(on_cpu_shares);
    }
    service::bench(&mut criterion);
    if memory_report_selected(&args) {
        memory::report(measuring);
    }
    if let Some(run) = run {
        run.finish(&results::criterion_dir());
    }
    criterion.final_summary();
}

/// Whether the command line selects the memory report: when it names no benchmark filter, or a
/// filter that is part of its id (criterion's filters are regular expressions; a plain substring
/// covers the ways this one is asked for). `--list` only lists criterion's benchmarks.
fn memory_report_selected(args: &[String]) -> bool {
    // Criterion's options that take a value: that value is not a filter.
    const TAKES_VALUE: [&str; 19] = [
        "--color",
        "-c",
        "--save-baseline",
        "-s",
        "--baseline",
        "-b",
        "--baseline-lenient",
        "--load-baseline",
        "--format",
        "--output-format",
        "--sample-size",
        "--warm-up-time",
        "--measurement-time",
        "--nresamples",
        "--noise-threshold",
        "--confidence-level",
        "--significance-level",
        "--profile-time",
        "--plotting-backend",
    ];
    if args.iter().any(|arg| arg == "--list") {
        return false;
    }
    let filters: Vec<&str> = args
        .iter()
        .enumerate()
        .filter(|&(index, arg)| {
            !arg.starts_with('-')
                && (index == 0 || !TAKES_VALUE.contains(&args[index - 1].as_str()))
        })
        .map(|(_, filter)| filter.as_str())
        .collect();
    filters.is_empty() || filters.iter().any(|filter| memory::ID.contains(filter))
}
