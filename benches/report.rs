//! Writes `BENCHMARKS.md` from the results of `cargo bench`: criterion's estimates under
//! `target/criterion` (or `$CARGO_TARGET_DIR/criterion`, or `$CRITERION_HOME`) and the tables the
//! suite writes beside them (`memory.json`, `run.json`).
//!
//! ```text
//! cargo bench
//! cargo bench --bench report [-- <criterion dir> [<output>]]
//! ```
//!
//! Every figure is criterion's median over its samples (the machine this runs on is shared and
//! noisy; the median shrugs off the samples a neighbour disturbed). Ratios compare figures from
//! the same run. The targets at the end are the project's performance goals; each is checked
//! against this run's figures.
//!
//! It refuses (a failing exit status, the file left as it was) when the directory lacks any
//! result it reports, `memory.json` or `run.json`: after another bench alone (`--bench tower`),
//! say, it would otherwise write a file of empty cells.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::Value;

const METHODS: [(&str, &str); 4] = [
    ("token_bucket", "token bucket"),
    ("fixed_window", "fixed window"),
    ("sliding_window_log", "sliding window log"),
    ("sliding_window_counter", "sliding window counter"),
];
const THREAD_COUNTS: [u64; 3] = [1, 2, 4];
const CLIENT_COUNTS: [u64; 2] = [10_000, 1_000_000];

type Error = Box<dyn std::error::Error>;

/// The command that produces every result the report needs.
const PRODUCING_COMMAND: &str = "cargo bench --bench tollgate";

fn main() -> ExitCode {
    // `cargo bench` passes its own flags (`--bench`) to a harness-less target: skip them.
    let mut args = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with("--"));
    let criterion_dir = args
        .next()
        .map_or_else(default_criterion_dir, PathBuf::from);
    let output = args
        .next()
        .map_or_else(|| PathBuf::from("BENCHMARKS.md"), PathBuf::from);
    match write_report(&criterion_dir, &output) {
        Ok(benchmarks) => {
            println!("wrote {} from {benchmarks} benchmarks", output.display());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The ids of every criterion result the report reads.
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

/// Where criterion wrote its results, found as the benchmarks find it (`benches/tollgate`'s
/// `output_directory`): `CRITERION_HOME`, else `criterion` in `CARGO_TARGET_DIR` or `target`.
fn default_criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home);
    }
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| PathBuf::from("target"), PathBuf::from)
        .join("criterion")
}

/// Writes the report of the results under `criterion_dir` to `output` and returns how many
/// benchmarks it read; refuses, writing nothing, when any result, `memory.json` or `run.json`
/// the report needs is missing, naming them and [`PRODUCING_COMMAND`].
pub(crate) fn write_report(criterion_dir: &Path, output: &Path) -> Result<usize, Error> {
    let results = Results::load(criterion_dir)?;
    let read_json = |name: &str| -> Result<Option<Value>, Error> {
        std::fs::read_to_string(criterion_dir.join(name))
            .ok()
            .map(|text| serde_json::from_str::<Value>(&text))
            .transpose()
            .map_err(|error| format!("{}: {error}", criterion_dir.join(name).display()).into())
    };
    let memory = read_json("memory.json")?;
    let conditions = read_json("run.json")?;

    let report = Report {
        results: &results,
        memory: memory.as_ref(),
        conditions: conditions.as_ref(),
        missing: RefCell::default(),
    };
    let text = report.render();
    let mut missing: Vec<String> = report.missing.into_inner().into_iter().collect();
    for (name, value) in [("memory.json", &memory), ("run.json", &conditions)] {
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
    std::fs::write(output, text)?;
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

/// A performance goal, checked against one ratio or figure of the run.
struct Target {
    goal: String,
    measured: Option<f64>,
    /// How the measured figure reads (`1.23x`, `4.5 ns`...).
    unit: &'static str,
    bound: Bound,
    /// For a multi-threaded target: the lowest share of time on a core among the lock-free
    /// measurements it rests on (see [`DISTURBED_BELOW`]).
    on_cpu_share: Option<f64>,
}

/// Below this share of time on a core, the threads of a lock-free measurement (which never
/// sleep) were kept off their cores by something else: the figure is flagged as disturbed.
/// (A mutex's threads sleep while they wait for the lock, so its own share says nothing.)
const DISTURBED_BELOW: f64 = 0.85;

#[derive(Clone, Copy)]
enum Bound {
    AtMost(f64),
    AtLeast(f64),
}

impl Target {
    fn met(&self) -> Option<bool> {
        Some(match self.bound {
            Bound::AtMost(bound) => self.measured? <= bound,
            Bound::AtLeast(bound) => self.measured? >= bound,
        })
    }

    fn verdict(&self) -> String {
        let verdict = match self.met() {
            None => "not measured",
            Some(true) => "met",
            Some(false) => "**missed**",
        };
        match self.on_cpu_share {
            Some(share) if share < DISTURBED_BELOW => format!(
                "{verdict} (disturbed: threads on a core {:.0}% of the time)",
                share * 100.0
            ),
            _ => verdict.to_owned(),
        }
    }
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
             Generated from one run of `cargo bench` by \
             `cargo bench --bench report`; do not edit by hand.\n\n\
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

    fn targets(&self, out: &mut String) {
        let single = |workload: &str, implementation: &str| {
            self.nanos(&format!(
                "single_thread_{workload}/token_bucket/{implementation}"
            ))
        };
        let contended = |workload: &str, method: &str, implementation: &str, threads: u64| {
            self.per_second(&format!(
                "contended_{workload}/{method}/{implementation}/{threads}"
            ))
        };
        let lookup = |implementation: &str, clients: u64| {
            self.nanos(&format!(
                "service_lookup/token_bucket/{implementation}/{clients}"
            ))
        };
        let shared_lookup = |implementation: &str, threads: u64| {
            self.per_second(&format!(
                "service_lookup_shared/token_bucket/{implementation}/{threads}"
            ))
        };
        let first_request = |implementation: &str| {
            self.nanos(&format!(
                "service_first_request/token_bucket/{implementation}"
            ))
        };

        let lowest_share = |ids: &[String]| {
            ids.iter()
                .map(|id| self.on_cpu_share(id))
                .collect::<Option<Vec<f64>>>()
                .and_then(|shares| shares.into_iter().reduce(f64::min))
        };

        let mut targets = Vec::new();
        for workload in ["allow", "deny"] {
            targets.push(Target {
                goal: format!("token bucket, one thread, {workload}: time vs governor"),
                measured: ratio(single(workload, "tollgate"), single(workload, "governor")),
                unit: "x",
                bound: Bound::AtMost(1.0),
                on_cpu_share: None,
            });
        }
        for (workload, speedup) in [("allow", 1.3), ("deny", 2.0)] {
            targets.push(Target {
                goal: format!("token bucket, one thread, {workload}: speed-up over mutex"),
                measured: ratio(single(workload, "mutex"), single(workload, "tollgate")),
                unit: "x",
                bound: Bound::AtLeast(speedup),
                on_cpu_share: None,
            });
        }
        // governor is a token bucket; the fixed window, one `fetch_add` per admission, is held
        // to more. (The sliding log does more per admission than either, and has no target here.)
        for ((method, name), over_governor) in METHODS.into_iter().take(2).zip([1.2, 1.5]) {
            targets.push(Target {
                goal: format!("{name}, 2 threads, allow: throughput vs governor"),
                measured: ratio(
                    contended("allow", method, "tollgate", 2),
                    contended("allow", "token_bucket", "governor", 2),
                ),
                unit: "x",
                bound: Bound::AtLeast(over_governor),
                on_cpu_share: lowest_share(&[
                    format!("contended_allow/{method}/tollgate/2"),
                    "contended_allow/token_bucket/governor/2".to_owned(),
                ]),
            });
        }
        // The sliding log's ring is the most contended state (one slot per admission, the head
        // moved on by every one): held to the mutex reference, where the others are held to more.
        for threads in [2, 4] {
            targets.push(Target {
                goal: format!("sliding window log, {threads} threads, allow: throughput vs mutex"),
                measured: ratio(
                    contended("allow", "sliding_window_log", "tollgate", threads),
                    contended("allow", "sliding_window_log", "mutex", threads),
                ),
                unit: "x",
                bound: Bound::AtLeast(1.0),
                on_cpu_share: lowest_share(&[format!(
                    "contended_allow/sliding_window_log/tollgate/{threads}"
                )]),
            });
        }
        for (method, name) in METHODS {
            targets.push(Target {
                goal: format!("{name}, 2 threads, deny: throughput vs its own 1 thread"),
                measured: ratio(
                    contended("deny", method, "tollgate", 2),
                    contended("deny", method, "tollgate", 1),
                ),
                unit: "x",
                bound: Bound::AtLeast(1.8),
                on_cpu_share: lowest_share(&[format!("contended_deny/{method}/tollgate/2")]),
            });
            targets.push(Target {
                goal: format!("{name}, 2 threads, deny: throughput vs mutex"),
                measured: ratio(
                    contended("deny", method, "tollgate", 2),
                    contended("deny", method, "mutex", 2),
                ),
                unit: "x",
                bound: Bound::AtLeast(10.0),
                on_cpu_share: lowest_share(&[format!("contended_deny/{method}/tollgate/2")]),
            });
        }
        for clients in CLIENT_COUNTS {
            targets.push(Target {
                goal: format!("service lookup, {clients} clients: time vs governor keyed"),
                measured: ratio(lookup("tollgate", clients), lookup("governor", clients)),
                unit: "x",
                bound: Bound::AtMost(1.0),
                on_cpu_share: None,
            });
        }
        targets.push(Target {
            goal: "service lookup, 10000 clients, 2 threads: throughput vs governor keyed"
                .to_owned(),
            measured: ratio(shared_lookup("tollgate", 2), shared_lookup("governor", 2)),
            unit: "x",
            bound: Bound::AtLeast(1.5),
            on_cpu_share: None,
        });
        targets.push(Target {
            goal: "service first request: time vs governor keyed".to_owned(),
            measured: ratio(first_request("tollgate"), first_request("governor")),
            unit: "x",
            bound: Bound::AtMost(1.0),
            on_cpu_share: None,
        });
        targets.push(Target {
            goal: "heap requested per idle client, 100 000 clients (token bucket): vs governor \
                   keyed (resident memory at 1 000 000: see \"A million clients\")"
                .to_owned(),
            measured: ratio(
                self.memory_per_client("token_bucket", "tollgate", "requested_bytes_per_client"),
                self.memory_per_client("token_bucket", "governor", "requested_bytes_per_client"),
            ),
            unit: "x",
            bound: Bound::AtMost(2.0),
            on_cpu_share: None,
        });
        for (workload, bound) in [("allow", 10.0), ("deny", 2.0)] {
            targets.push(Target {
                goal: format!("token bucket, coarse clock, {workload}: ns per decision"),
                measured: single(workload, "tollgate_coarse"),
                unit: " ns",
                bound: Bound::AtMost(bound),
                on_cpu_share: None,
            });
        }

        let met = targets.iter().filter(|t| t.met() == Some(true)).count();
        let _ = writeln!(
            out,
            "## Targets\n\n{met} of {} met in this run. Ratios of time: lower is better; \
             ratios of throughput and speed-ups: higher is better.\n",
            targets.len()
        );
        let _ = writeln!(
            out,
            "| target | measured | goal | verdict |\n|---|---:|---:|---|"
        );
        for target in &targets {
            let (relation, bound) = match target.bound {
                Bound::AtMost(bound) => ("≤", bound),
                Bound::AtLeast(bound) => ("≥", bound),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {relation} {bound}{} | {} |",
                target.goal,
                target
                    .measured
                    .map_or_else(|| "—".to_owned(), |v| format!("{v:.2}{}", target.unit)),
                target.unit,
                target.verdict()
            );
        }
        out.push('\n');
    }

    fn clocks(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "## Clocks\n\nOne reading, the floor under every decision that takes one.\n\n\
             | clock | ns per reading |\n|---|---:|"
        );
        for (id, name) in [
            (
                "tollgate_monotonic",
                "tollgate `MonotonicClock` (quanta counter)",
            ),
            ("tollgate_coarse", "tollgate `CoarseClock` (1 ms upkeep)"),
            ("governor_quanta", "governor `QuantaClock`"),
            ("std_instant", "`std::time::Instant::now`"),
        ] {
            let _ = writeln!(
                out,
                "| {name} | {} |",
                ns(self.nanos(&format!("clock/{id}")))
            );
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
        for workload in ["allow", "deny"] {
            let _ = writeln!(
                out,
                "### {workload}\n\n\
                 | method | tollgate | mutex | governor | speed-up over mutex | time vs governor |\n\
                 |---|---:|---:|---:|---:|---:|"
            );
            for (method, name) in METHODS {
                let id = |implementation: &str| {
                    self.nanos(&format!(
                        "single_thread_{workload}/{method}/{implementation}"
                    ))
                };
                // governor has only the token bucket's algorithm.
                let governor = (method == "token_bucket").then(|| id("governor")).flatten();
                let (tollgate, mutex) = (id("tollgate"), id("mutex"));
                let _ = writeln!(
                    out,
                    "| {name} | {} | {} | {} | {} | {} |",
                    ns(tollgate),
                    ns(mutex),
                    ns(governor),
                    times(ratio(mutex, tollgate)),
                    times(ratio(tollgate, governor)),
                );
                if method == "token_bucket" {
                    for (variant, label) in [
                        ("tollgate_coarse", "token bucket, coarse clock"),
                        ("tollgate_decision", "token bucket, full `Decision`"),
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
        for workload in ["allow", "deny"] {
            let _ = writeln!(
                out,
                "### {workload}\n\n\
                 | method | implementation | 1 thread | 2 threads | 4 threads | on a core, 2 threads \
                 | 2 threads vs 1 | 2 threads vs mutex | 2 threads vs governor |\n\
                 |---|---|---:|---:|---:|---:|---:|---:|---:|"
            );
            let governor_2 =
                self.per_second(&format!("contended_{workload}/token_bucket/governor/2"));
            for (method, name) in METHODS {
                let implementations: &[&str] = if method == "token_bucket" {
                    &["tollgate", "mutex", "governor"]
                } else {
                    &["tollgate", "mutex"]
                };
                let mutex_2 = self.per_second(&format!("contended_{workload}/{method}/mutex/2"));
                for implementation in implementations {
                    let at = |threads: u64| {
                        self.per_second(&format!(
                            "contended_{workload}/{method}/{implementation}/{threads}"
                        ))
                    };
                    let per_thread_count = THREAD_COUNTS.map(|threads| millions(at(threads)));
                    let (vs_mutex, vs_governor) = if *implementation == "tollgate" {
                        (
                            times(ratio(at(2), mutex_2)),
                            times(ratio(at(2), governor_2)),
                        )
                    } else {
                        (String::new(), String::new())
                    };
                    let on_cpu = self
                        .on_cpu_share(&format!("contended_{workload}/{method}/{implementation}/2"))
                        .map_or_else(String::new, |share| format!("{:.0}%", share * 100.0));
                    let _ = writeln!(
                        out,
                        "| {name} | {implementation} | {} | {} | {} | {on_cpu} | {} | {vs_mutex} \
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
             SipHash. *tollgate*: `RateLimiterService` (papaya map); *governor*: its keyed \
             limiter (`DashMap`); *mutex*: `Mutex<HashMap<u64, mutex bucket>>`. A lookup is a \
             request from a known client picked at random; a first request makes the client's \
             limiter, in batches of 10 000 into a fresh default-sized map (growth included).\n\n\
             | case | tollgate | governor | mutex | time vs governor | speed-up over mutex |\n\
             |---|---:|---:|---:|---:|---:|"
        );
        let mut cases: Vec<(String, String)> = CLIENT_COUNTS
            .iter()
            .map(|clients| {
                (
                    format!("lookup, {clients} clients"),
                    format!("service_lookup/token_bucket/{{}}/{clients}"),
                )
            })
            .collect();
        cases.push((
            "first request".to_owned(),
            "service_first_request/token_bucket/{}".to_owned(),
        ));
        for (case, pattern) in cases {
            let id = |implementation: &str| self.nanos(&pattern.replace("{}", implementation));
            let (tollgate, governor, mutex) = (id("tollgate"), id("governor"), id("mutex"));
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
            "\nShared by threads: aggregate lookups per second (millions) among 10 000 clients, \
             every thread on one map with its own random sequence of clients; each sample spawns \
             its threads once, starts them together, and counts the slowest.\n\n\
             | threads | tollgate | governor | mutex | throughput vs governor | vs mutex |\n\
             |---:|---:|---:|---:|---:|---:|"
        );
        for threads in [1, 2, 4] {
            let id = |implementation: &str| {
                self.per_second(&format!(
                    "service_lookup_shared/token_bucket/{implementation}/{threads}"
                ))
            };
            let (tollgate, governor, mutex) = (id("tollgate"), id("governor"), id("mutex"));
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

    /// A figure of `memory.json`, recording it as missing when the file is there without it
    /// (a missing file is reported on its own).
    fn memory_per_client(&self, method: &str, implementation: &str, field: &str) -> Option<f64> {
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
             Heap per idle client: the growth of a default-sized map while {} clients of rule \
             *{}* make one request each, divided by their number (the map's table included). \
             *with malloc headers* adds glibc's per-allocation header and rounding, which \
             designs that allocate per client pay and designs with inline entries do not.\n\n\
             | method | implementation | bytes requested | with malloc headers | allocations |\n\
             |---|---|---:|---:|---:|",
            memory["idle_clients"],
            memory["rule"].as_str().unwrap_or("?"),
        );
        for row in memory["rows"].as_array().into_iter().flatten() {
            let method = row["method"].as_str().unwrap_or("?");
            let name = METHODS
                .iter()
                .find(|(id, _)| *id == method)
                .map_or(method, |(_, name)| name);
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
