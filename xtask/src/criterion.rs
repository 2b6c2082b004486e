//! The part of BENCHMARKS.md that criterion's figures fill, written from the results of `cargo
//! bench --bench tollgate`: criterion's estimates under its output directory and the tables the
//! suite writes beside them (`memory.json`, `run.json`). The ids it reads are the suite's own
//! (`benches/tollgate/ids.rs`).
//!
//! Every figure is criterion's median over its samples (the machine this runs on is shared and
//! noisy; the median shrugs off the samples a neighbour disturbed). Ratios compare figures from
//! the same run. The targets at the end are the project's performance goals; each is checked
//! against this run's figures.
//!
//! It refuses (an error, the file left as it was) when the directory lacks any result it
//! reports, `memory.json` or `run.json`: after another bench alone (`--bench tower`), say, it
//! would otherwise write a file of empty cells. It rewrites the file but for the sections the
//! other harnesses' figures fill, which it keeps.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;
use tollgate::Algorithm;

use crate::ids::{
    self, CONTENDED_THREADS, GOVERNOR, LOOKUP_CLIENTS, MUTEX, SHARED_LOOKUP_CLIENTS,
    SHARED_LOOKUP_THREADS, TOLLGATE, TOLLGATE_COARSE, TOLLGATE_DECISION, Workload,
};
use crate::results::{MEMORY_JSON, RUN_JSON};
use crate::section::{self, Error};

use targets::DISTURBED_BELOW;

mod targets;

/// The command that produces every result the report needs.
const PRODUCING_COMMAND: &str = "cargo bench --bench tollgate";

/// The ids of every criterion result the report reads.
#[cfg(test)]
pub(crate) fn needed_results() -> BTreeSet<String> {
    let report = Report {
        results: &Results {
            by_id: HashMap::new(),
        },
        memory: None,
        conditions: None,
        missing: RefCell::default(),
    };
    report.render();
    report.missing.into_inner()
}

/// Writes the report of the results under `criterion_dir` to `output`, keeping the sections of
/// the other harnesses that `output` holds, and returns how many benchmarks it read; refuses,
/// writing nothing, when any result, `memory.json` or `run.json` the report needs is missing,
/// naming them and [`PRODUCING_COMMAND`].
pub(crate) fn write_report(criterion_dir: &Path, output: &Path) -> Result<usize, Error> {
    let results = Results::load(criterion_dir)?;
    let read_json = |name: &str| -> Result<Option<Value>, Error> {
        std::fs::read_to_string(criterion_dir.join(name))
            .ok()
            .map(|text| serde_json::from_str::<Value>(&text))
            .transpose()
            .map_err(|error| format!("{}: {error}", criterion_dir.join(name).display()).into())
    };
    let memory = read_json(MEMORY_JSON)?;
    let conditions = read_json(RUN_JSON)?;

    let report = Report {
        results: &results,
        memory: memory.as_ref(),
        conditions: conditions.as_ref(),
        missing: RefCell::default(),
    };
    let text = report.render();
    let mut missing: Vec<String> = report.missing.into_inner().into_iter().collect();
    for (name, value) in [(MEMORY_JSON, &memory), (RUN_JSON, &conditions)] {
        if value.is_none() {
            missing.push(name.to_owned());
        }
    }
    if !missing.is_empty() {
        const SHOWN: usize = 5;
        let more = missing.len().saturating_sub(SHOWN);
        missing.truncate(SHOWN);
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        return Err(format!(
            "{} lacks results the report needs ({}{more}): run `{PRODUCING_COMMAND}` (about 9 \
             minutes), then this again; {} was left as it was",
            criterion_dir.display(),
            missing.join(", "),
            output.display()
        )
        .into());
    }
    let kept = std::fs::read_to_string(output).unwrap_or_default();
    std::fs::write(output, section::with_sections_of(&text, &kept))?;
    Ok(results.by_id.len())
}

/// One benchmark's result.
#[derive(Debug, Clone, Copy)]
struct Measurement {
    /// Median time of one iteration.
    nanos_per_iteration: f64,
    /// Decisions per iteration (the thread count, for the contended benchmarks).
    decisions_per_iteration: f64,
}

impl Measurement {
    fn nanos_per_decision(self) -> f64 {
        self.nanos_per_iteration / self.decisions_per_iteration
    }

    fn decisions_per_second(self) -> f64 {
        self.decisions_per_iteration * 1e9 / self.nanos_per_iteration
    }
}

/// Every benchmark criterion has a result for, by its full id (`group/function[/value]`).
struct Results {
    by_id: HashMap<String, Measurement>,
}

impl Results {
    fn load(criterion_dir: &Path) -> Result<Results, Error> {
        let mut by_id = HashMap::new();
        let mut pending = vec![criterion_dir.to_path_buf()];
        while let Some(dir) = pending.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries {
                let path = entry?.path();
                if path.is_dir() {
                    pending.push(path);
                } else if path
                    .file_name()
                    .is_some_and(|name| name == "benchmark.json")
                    && path.parent().and_then(Path::file_name) == Some("new".as_ref())
                {
                    let (id, measurement) = read_measurement(&path)?;
                    by_id.insert(id, measurement);
                }
            }
        }
        Ok(Results { by_id })
    }

    fn get(&self, id: &str) -> Option<Measurement> {
        self.by_id.get(id).copied()
    }
}

/// Reads `new/benchmark.json` (the id and throughput) and `new/estimates.json` beside it.
fn read_measurement(benchmark_json: &Path) -> Result<(String, Measurement), Error> {
    let benchmark: Value = serde_json::from_str(&std::fs::read_to_string(benchmark_json)?)?;
    let estimates: Value = serde_json::from_str(&std::fs::read_to_string(
        benchmark_json.with_file_name("estimates.json"),
    )?)?;
    let id = benchmark["full_id"]
        .as_str()
        .ok_or_else(|| format!("{}: no full_id", benchmark_json.display()))?
        .to_owned();
    let nanos_per_iteration = estimates["median"]["point_estimate"]
        .as_f64()
        .ok_or_else(|| format!("{id}: no median estimate"))?;
    let decisions_per_iteration = benchmark["throughput"]["Elements"].as_f64().unwrap_or(1.0);
    Ok((
        id,
        Measurement {
            nanos_per_iteration,
            decisions_per_iteration,
        },
    ))
}

struct Report<'a> {
    results: &'a Results,
    memory: Option<&'a Value>,
    /// `run.json`: the machine's load at the start and end of the run.
    conditions: Option<&'a Value>,
    /// The ids the report asked for that the results lack.
    missing: RefCell<BTreeSet<String>>,
}

impl Report<'_> {
    fn render(&self) -> String {
        let mut out = String::new();
        self.header(&mut out);
        self.targets(&mut out);
        self.clocks(&mut out);
        self.single_thread(&mut out);
        self.contended(&mut out);
        self.service(&mut out);
        self.memory(&mut out);
        out
    }

    /// The result of `id`, recording it as missing when there is none.
    fn measurement(&self, id: &str) -> Option<Measurement> {
        let measurement = self.results.get(id);
        if measurement.is_none() {
            self.missing.borrow_mut().insert(id.to_owned());
        }
        measurement
    }

    fn nanos(&self, id: &str) -> Option<f64> {
        self.measurement(id).map(Measurement::nanos_per_decision)
    }

    /// The share of its threads' time a contended benchmark spent on a core (`run.json`).
    fn on_cpu_share(&self, id: &str) -> Option<f64> {
        self.conditions?["on_cpu_share"][id].as_f64()
    }

    fn per_second(&self, id: &str) -> Option<f64> {
        self.measurement(id).map(Measurement::decisions_per_second)
    }

    fn header(&self, out: &mut String) {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|info| {
                info.lines()
                    .find_map(|line| line.strip_prefix("model name"))
                    .map(|model| model.trim_start_matches([' ', '\t', ':']).to_owned())
            })
            .unwrap_or_else(|| "unknown CPU".to_owned());
        let cpus = std::thread::available_parallelism().map_or(0, usize::from);
        let _ = writeln!(
            out,
            "# Benchmarks\n\n\
             Generated from one run of `{PRODUCING_COMMAND}` by \
             `cargo xtask report criterion`; do not edit by hand.\n\n\
             Machine: {cpu}, {cpus} logical CPUs. Source: {}. Figures are criterion's medians. \
             *tollgate* is this crate, *mutex* the seed design's limiters behind a \
             `std::sync::Mutex` (`tests/support/reference.rs`), *governor* the governor crate \
             (GCRA, the same algorithm as the token bucket). Everything reads the CPU's counter \
             through `quanta` unless marked *coarse* (`CoarseClock`, refreshed every 1 ms).\n",
            self.conditions
                .and_then(|conditions| conditions["source"].as_str())
                .unwrap_or("unknown")
        );
        if let Some(conditions) = self.conditions {
            let snapshots: Vec<String> = conditions["snapshots"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|snapshot| {
                    let load = snapshot["load_average"]
                        .as_f64()
                        .map_or_else(|| "unknown".to_owned(), |load| format!("{load:.2}"));
                    format!(
                        "| {} | {load} | {:.2}x |",
                        snapshot["when"].as_str().unwrap_or("?"),
                        snapshot["parallel_speedup"].as_f64().unwrap_or(f64::NAN)
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "Run conditions: this machine is shared, and a neighbour's load changes the \
                 figures, the multi-threaded ones most. *Two threads vs one* is how much faster \
                 two threads did independent work than one thread: 2.00x when both cores were \
                 free, 1.00x when the threads had to take turns on one. The multi-threaded \
                 figures mean most when it is near 2 on both sides of them; a snapshot cannot \
                 show a disturbance that came and went between two of them.\n\n\
                 | when | load average (1 min) | two threads vs one |\n|---|---:|---:|\n{}\n",
                snapshots.join("\n")
            );
        }
    }

    fn clocks(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "## Clocks\n\nOne reading, the floor under every decision that takes one.\n\n\
             | clock | ns per reading |\n|---|---:|"
        );
        for (clock, name) in [
            (
                ids::CLOCK_MONOTONIC,
                "tollgate `MonotonicClock` (quanta counter)",
            ),
            (ids::CLOCK_COARSE, "tollgate `CoarseClock` (1 ms upkeep)"),
            (ids::CLOCK_GOVERNOR, "governor `QuantaClock`"),
            (ids::CLOCK_STD_INSTANT, "`std::time::Instant::now`"),
        ] {
            let _ = writeln!(out, "| {name} | {} |", ns(self.nanos(&ids::clock(clock))));
        }
        out.push('\n');
    }

    fn single_thread(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "## One limiter, one thread\n\n\
             ns per decision (`try_acquire`). *allow*: a rule so generous nothing is denied \
             (10⁹ per second; the sliding log, capped at 65 536 slots, 1 024 per µs so that its \
             slots have always expired when the ring comes round; the sliding window counter, \
             whose counts have at most 31 bits, 2³¹ − 1 per 292 years). *deny*: a limiter exhausted \
             for an hour (100 per hour).\n"
        );
        for workload in Workload::ALL {
            let _ = writeln!(
                out,
                "### {}\n\n\
                 | method | tollgate | mutex | governor | speed-up over mutex | time vs governor |\n\
                 |---|---:|---:|---:|---:|---:|",
                workload.name()
            );
            for method in Algorithm::ALL {
                let id = |implementation: &str| {
                    self.nanos(&ids::single_thread(workload, method, implementation))
                };
                // governor has only the token bucket's algorithm.
                let token_bucket = method == Algorithm::TokenBucket;
                let governor = token_bucket.then(|| id(GOVERNOR)).flatten();
                let (tollgate, mutex) = (id(TOLLGATE), id(MUTEX));
                let _ = writeln!(
                    out,
                    "| {method} | {} | {} | {} | {} | {} |",
                    ns(tollgate),
                    ns(mutex),
                    ns(governor),
                    times(ratio(mutex, tollgate)),
                    times(ratio(tollgate, governor)),
                );
                if token_bucket {
                    for (variant, label) in [
                        (TOLLGATE_COARSE, "token bucket, coarse clock"),
                        (TOLLGATE_DECISION, "token bucket, full `Decision`"),
                    ] {
                        let value = id(variant);
                        let _ = writeln!(
                            out,
                            "| {label} | {} | | | {} | {} |",
                            ns(value),
                            times(ratio(mutex, value)),
                            times(ratio(value, governor)),
                        );
                    }
                }
            }
            out.push('\n');
        }
    }

    fn contended(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "## One limiter shared by threads\n\n\
             Aggregate decisions per second (millions), all threads on one limiter; each \
             sample spawns its threads once, starts them together, and counts the slowest. \
             With 4 threads on fewer cores, threads also wait for a core. *On a core, 2 \
             threads*: the share of the two threads' time they spent running; near 100% for a \
             lock-free limiter on a quiet machine, below {:.0}% a sign that a neighbour took a \
             core (a mutex's threads sleep while they wait, so theirs is lower anyway).\n",
            DISTURBED_BELOW * 100.0
        );
        for workload in Workload::ALL {
            let _ = writeln!(
                out,
                "### {}\n\n\
                 | method | implementation | 1 thread | 2 threads | 4 threads | on a core, 2 threads \
                 | 2 threads vs 1 | 2 threads vs mutex | 2 threads vs governor |\n\
                 |---|---|---:|---:|---:|---:|---:|---:|---:|",
                workload.name()
            );
            let per_second = |method: Algorithm, implementation: &str, threads: usize| {
                self.per_second(&ids::contended(workload, method, implementation, threads))
            };
            let governor_2 = per_second(Algorithm::TokenBucket, GOVERNOR, 2);
            for method in Algorithm::ALL {
                let implementations: &[&str] = if method == Algorithm::TokenBucket {
                    &[TOLLGATE, MUTEX, GOVERNOR]
                } else {
                    &[TOLLGATE, MUTEX]
                };
                let mutex_2 = per_second(method, MUTEX, 2);
                for &implementation in implementations {
                    let at = |threads: usize| per_second(method, implementation, threads);
                    let per_thread_count = CONTENDED_THREADS.map(|threads| millions(at(threads)));
                    let (vs_mutex, vs_governor) = if implementation == TOLLGATE {
                        (
                            times(ratio(at(2), mutex_2)),
                            times(ratio(at(2), governor_2)),
                        )
                    } else {
                        (String::new(), String::new())
                    };
                    let on_cpu = self
                        .on_cpu_share(&ids::contended(workload, method, implementation, 2))
                        .map_or_else(String::new, |share| format!("{:.0}%", share * 100.0));
                    let _ = writeln!(
                        out,
                        "| {method} | {implementation} | {} | {} | {} | {on_cpu} | {} | {vs_mutex} \
                         | {vs_governor} |",
                        per_thread_count[0],
                        per_thread_count[1],
                        per_thread_count[2],
                        times(ratio(at(2), at(1))),
                    );
                }
            }
            out.push('\n');
        }
    }

    fn service(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "## The per-client service\n\n\
             ns per request, token bucket, `u64` client keys, every map with a randomly seeded \
             SipHash. *tollgate*: `RateLimiterService` (its fixed table, of a capacity four \
             times the clients, allocated when the service is built); *governor*: its keyed \
             limiter (`DashMap`); *mutex*: `Mutex<HashMap<u64, mutex bucket>>`. A lookup is a \
             request from a known client picked at random; a first request makes the client's \
             limiter, in batches of 10 000 into a fresh map, made before the timing: \
             default-sized (its growth timed), or tollgate's table (the first touch of its pages \
             timed).\n\n\
             | case | tollgate | governor | mutex | time vs governor | speed-up over mutex |\n\
             |---|---:|---:|---:|---:|---:|"
        );
        type IdOf<'a> = Box<dyn Fn(&str) -> String + 'a>;
        let mut cases: Vec<(String, IdOf<'_>)> = LOOKUP_CLIENTS
            .iter()
            .map(|&clients| {
                let id: IdOf<'_> =
                    Box::new(move |implementation| ids::service_lookup(implementation, clients));
                (format!("lookup, {clients} clients"), id)
            })
            .collect();
        cases.push(("first request".to_owned(), Box::new(ids::first_request)));
        for (case, id_of) in cases {
            let id = |implementation: &str| self.nanos(&id_of(implementation));
            let (tollgate, governor, mutex) = (id(TOLLGATE), id(GOVERNOR), id(MUTEX));
            let _ = writeln!(
                out,
                "| {case} | {} | {} | {} | {} | {} |",
                ns(tollgate),
                ns(governor),
                ns(mutex),
                times(ratio(tollgate, governor)),
                times(ratio(mutex, tollgate)),
            );
        }
        let _ = writeln!(
            out,
            "\nShared by threads: aggregate lookups per second (millions) among {} clients, \
             every thread on one map with its own random sequence of clients; each sample spawns \
             its threads once, starts them together, and counts the slowest.\n\n\
             | threads | tollgate | governor | mutex | throughput vs governor | vs mutex |\n\
             |---:|---:|---:|---:|---:|---:|",
            section::thousands(SHARED_LOOKUP_CLIENTS)
        );
        for threads in SHARED_LOOKUP_THREADS {
            let id = |implementation: &str| {
                self.per_second(&ids::shared_lookup(implementation, threads))
            };
            let (tollgate, governor, mutex) = (id(TOLLGATE), id(GOVERNOR), id(MUTEX));
            let _ = writeln!(
                out,
                "| {threads} | {} | {} | {} | {} | {} |",
                millions(tollgate),
                millions(governor),
                millions(mutex),
                times(ratio(tollgate, governor)),
                times(ratio(tollgate, mutex)),
            );
        }
        out.push('\n');
    }

    /// A figure of `memory.json` for the token bucket, recording it as missing when the file is
    /// there without it (a missing file is reported on its own).
    fn memory_per_client(&self, implementation: &str, field: &str) -> Option<f64> {
        let method = Algorithm::TokenBucket.name();
        let memory = self.memory?;
        let figure = memory["rows"].as_array()?.iter().find_map(|row| {
            (row["method"] == method && row["implementation"] == implementation)
                .then(|| row[field].as_f64())
                .flatten()
        });
        if figure.is_none() {
            self.missing.borrow_mut().insert(format!(
                "memory.json: {field} of {method}, {implementation}"
            ));
        }
        figure
    }

    fn memory(&self, out: &mut String) {
        let Some(memory) = self.memory else {
            let _ = writeln!(out, "## Memory per client\n\nNot measured in this run.\n");
            return;
        };
        let _ = writeln!(
            out,
            "## Memory per client\n\n\
             Heap per idle client: the heap a map made empty (tollgate's service at a capacity \
             of exactly the clients, its fixed table allocated when built) holds once {} \
             clients of rule *{}* have made one request each, divided by their number (the \
             map's table included). \
             *with malloc headers* adds glibc's per-allocation header and rounding, which \
             designs that allocate per client pay and designs with inline entries do not.\n\n\
             | method | implementation | bytes requested | with malloc headers | allocations |\n\
             |---|---|---:|---:|---:|",
            memory["idle_clients"],
            memory["rule"].as_str().unwrap_or("?"),
        );
        for row in memory["rows"].as_array().into_iter().flatten() {
            let method = row["method"].as_str().unwrap_or("?");
            let name = method
                .parse::<Algorithm>()
                .map_or_else(|_| method.to_owned(), |algorithm| algorithm.to_string());
            let _ = writeln!(
                out,
                "| {name} | {} | {:.1} | {:.1} | {:.2} |",
                row["implementation"].as_str().unwrap_or("?"),
                row["requested_bytes_per_client"]
                    .as_f64()
                    .unwrap_or(f64::NAN),
                row["malloc_bytes_per_client"].as_f64().unwrap_or(f64::NAN),
                row["allocations_per_client"].as_f64().unwrap_or(f64::NAN),
            );
        }
        out.push('\n');
    }
}

fn ratio(numerator: Option<f64>, denominator: Option<f64>) -> Option<f64> {
    Some(numerator? / denominator?)
}

fn ns(value: Option<f64>) -> String {
    value.map_or_else(|| "—".to_owned(), |v| format!("{v:.1} ns"))
}

fn millions(value: Option<f64>) -> String {
    value.map_or_else(|| "—".to_owned(), |v| format!("{:.1}", v / 1e6))
}

fn times(value: Option<f64>) -> String {
    value.map_or_else(String::new, |v| format!("{v:.2}x"))
}
