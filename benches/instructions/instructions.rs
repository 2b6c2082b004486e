//! Instructions per decision, counted by callgrind: tollgate beside governor, exact and the same on
//! every run of one build, where the criterion suite's timings move with the machine's load.
//!
//! ```text
//! cargo bench --package tollgate-instructions                         # default release profile
//! cargo bench --package tollgate-instructions --profile release-lto   # release with thin LTO
//! cargo xtask report instructions                                     # both into BENCHMARKS.md
//! ```
//!
//! A run of every case keeps its figures in `target/instructions/<profile>.json` (see
//! `benches/support/results.rs`), one file per build profile, from which the report writes its
//! section of BENCHMARKS.md.
//!
//! Needs valgrind (`apt-get install -y valgrind`); a run takes about a minute.
//!
//! Built as a user's program is: this harness is a package of its own, so that the workspace's
//! Cargo.toml can set its codegen units alone. The generic code of tollgate and governor that a
//! case calls is instantiated here, and whether it is inlined into the case's loop depends on the
//! unit its instance lands in; in a large crate that changes with unrelated code (governor's
//! `check` counted 96 or 54 from one build to the next). The units are fixed so that each
//! library counts what a small program's plain loop counts in the same profile. Each case's
//! round calls the library as such a loop does, with no `black_box` around the limiter or its
//! answer (its atomic operations cannot be optimised away; a `black_box` would add its own stores
//! and loads).
//!
//! How: this binary runs itself under `valgrind --tool=callgrind`, once per case and round count,
//! as `measure <case> <rounds>`. That child sets the case up, then makes `rounds` rounds in
//! `counted_rounds`, the only code callgrind counts (`--collect-atstart=no --toggle-collect`).
//! The difference between two round counts, divided by the decisions between them, cancels what
//! is paid once (set-up, lazy symbol binding, thread-local initialisation) and leaves the cost of
//! one decision; the loop's own instructions, measured by a case that decides nothing, are taken
//! off. The callgrind files stay in `target/instructions/<profile>/` for `callgrind_annotate`.
//!
//! Other arguments: words select the cases whose names contain one of them (the figures of such
//! a run are printed, not kept); `--list` names the cases. Without `--bench` (as `cargo test
//! --benches` runs it) or with `--test`, each case runs once natively, without valgrind, to check
//! that it answers as it should.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

#[path = "cases.rs"]
mod cases;
// Shared with the report, which reads what this harness leaves there.
#[allow(dead_code)]
#[path = "../support/results.rs"]
mod results;

use cases::{CASES, Case, EMPTY_LOOP, FIRST_REQUEST_BATCH, LOOKUP_CLIENTS, PER_DECISION_ROUNDS};

/// The first argument of a child run: `measure <case> <rounds>`.
const MEASURE: &str = "measure";

/// The workspace's root, two folders above this package's.
const WORKSPACE_ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// The build profiles the report shows, by the folder cargo builds each into.
const PROFILES: [&str; 2] = [results::RELEASE, results::RELEASE_LTO];

/// The function callgrind counts in (see `cases::counted_rounds`).
const COUNTED_FUNCTION: &str = "*counted_rounds*";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Cargo runs a benchmark in its package's folder; the results are the workspace's.
    if let Err(error) = std::env::set_current_dir(WORKSPACE_ROOT) {
        eprintln!("error: cannot enter the workspace's root {WORKSPACE_ROOT}: {error}");
        return ExitCode::FAILURE;
    }
    let result = if args.first().map(String::as_str) == Some(MEASURE) {
        measure_in_child(&args[1..])
    } else {
        Options::parse(&args).and_then(|options| options.run())
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The child's side: `<case> <rounds>`, run as told, its decisions checked.
fn measure_in_child(args: &[String]) -> Result<(), String> {
    let [name, rounds] = args else {
        return Err(format!("usage: {MEASURE} <case> <rounds>, not {args:?}"));
    };
    let case = cases::case(name).ok_or_else(|| format!("no case called {name}"))?;
    let rounds: u64 = rounds
        .parse()
        .map_err(|error| format!("rounds {rounds:?}: {error}"))?;
    run_case(case, rounds)
}

/// Runs `case` for `rounds` rounds and checks that they made the decisions the case says.
fn run_case(case: &Case, rounds: u64) -> Result<(), String> {
    let decisions = (case.run)(rounds).map_err(|error| format!("{}: {error}", case.name))?;
    let expected = rounds * case.decisions_per_round;
    if decisions != expected {
        return Err(format!(
            "{}: {decisions} decisions in {rounds} rounds, expected {expected}",
            case.name
        ));
    }
    Ok(())
}

/// What the command line asks for.
struct Options {
    /// Counting under valgrind, rather than a quick native check of each case.
    measuring: bool,
    /// Only name the cases (`cargo bench -- --list`).
    list: bool,
    /// Words selecting cases; none selects all.
    filters: Vec<String>,
}

impl Options {
    fn parse(args: &[String]) -> Result<Options, String> {
        let mut options = Options {
            measuring: false,
            list: false,
            filters: Vec::new(),
        };
        let mut test = false;
        for arg in args {
            match arg.as_str() {
                "--bench" => options.measuring = true,
                "--test" => test = true,
                "--write" => {
                    return Err("the report writes BENCHMARKS.md now: run \
                         `cargo bench --package tollgate-instructions` in each profile, then \
                         `cargo xtask report instructions`"
                        .to_owned());
                }
                "--list" => options.list = true,
                flag if flag.starts_with('-') => {
                    // `cargo bench -- <options>` hands the criterion suite's options to every
                    // bench target; none of them means anything here.
                    eprintln!("instructions: ignoring {flag}");
                }
                filter => options.filters.push(filter.to_owned()),
            }
        }
        options.measuring &= !test;
        Ok(options)
    }

    fn selects(&self, case: &Case) -> bool {
        self.filters.is_empty()
            || self
                .filters
                .iter()
                .any(|word| case.name.contains(word.as_str()))
    }

    fn run(&self) -> Result<(), String> {
        let selected: Vec<&Case> = CASES
            .iter()
            .filter(|case| case.name != EMPTY_LOOP && self.selects(case))
            .collect();
        if selected.is_empty() {
            eprintln!("instructions: no case matches {:?}", self.filters);
            return Ok(());
        }
        if self.list {
            for case in &selected {
                println!("{}: bench", case.name);
            }
            return Ok(());
        }
        if !self.measuring {
            for case in &selected {
                run_case(case, case.rounds[0])?;
                println!("instructions: {} answers as it should", case.name);
            }
            return Ok(());
        }

        let callgrind = Callgrind::find()?;
        let empty_loop = cases::case(EMPTY_LOOP).expect("the empty loop is a case");
        let loop_per_round = callgrind.per_decision(empty_loop)?;
        eprintln!("instructions: the counting loop takes {loop_per_round:.2} per round");
        let mut measured = Vec::new();
        for case in selected {
            let gross = callgrind.per_decision(case)?;
            // The loop runs once per round, and a round may make many decisions.
            let net = gross - loop_per_round / case.decisions_per_round as f64;
            eprintln!("instructions: {}: {net:.2} per decision", case.name);
            measured.push((case, net));
        }

        println!("{:<48} {:>12}", "case", "per decision");
        for (case, net) in &measured {
            println!("{:<48} {net:>12.1}", case.name);
        }
        if !self.filters.is_empty() {
            eprintln!("instructions: a run of some cases is printed, not kept for the report");
            return Ok(());
        }
        let path = results::instructions_json(&callgrind.profile);
        let figures = figures_json(&callgrind, loop_per_round, &measured);
        std::fs::write(&path, figures)
            .map_err(|error| format!("cannot write {}: {error}", path.display()))?;
        eprintln!(
            "instructions: kept in {}; `cargo xtask report instructions` writes them into \
             BENCHMARKS.md",
            path.display()
        );
        Ok(())
    }
}

/// The figures of a run of every case, and what they were counted under, for the report.
fn figures_json(callgrind: &Callgrind, loop_per_round: f64, measured: &[(&Case, f64)]) -> String {
    let cases: Vec<serde_json::Value> = measured
        .iter()
        .map(|(case, per_decision)| {
            serde_json::json!({
                "name": case.name,
                "label": case.label,
                "per_decision": per_decision,
            })
        })
        .collect();
    let figures = serde_json::json!({
        "source": results::source_revision(),
        "profile": callgrind.profile,
        "valgrind": callgrind.version,
        "rustc": rustc_version(),
        "loop_per_round": loop_per_round,
        "per_decision_rounds": PER_DECISION_ROUNDS,
        "lookup_clients": LOOKUP_CLIENTS,
        "first_request_batch": FIRST_REQUEST_BATCH,
        "cases": cases,
    });
    serde_json::to_string_pretty(&figures).expect("a JSON value prints")
}

/// The compiler's version, which the counts depend on (best effort: the `rustc` that cargo
/// runs here, normally the one that built this).
fn rustc_version() -> String {
    results::command_output("rustc", &["--version"])
        .and_then(|version| {
            // `rustc 1.95.0 (59807616e 2026-04-14)`: the name and number are enough.
            let mut words = version.split_whitespace();
            Some(format!("{} {}", words.next()?, words.next()?))
        })
        .unwrap_or_else(|| "an unknown rustc".to_owned())
}

/// Runs this binary's cases under callgrind.
struct Callgrind {
    /// valgrind's own account of its version, e.g. `valgrind-3.19.0`.
    version: String,
    /// This binary, run again as the child.
    executable: PathBuf,
    /// The build profile this binary was built in (see [`PROFILES`]).
    profile: String,
    /// Where callgrind's files go.
    out_dir: PathBuf,
}

impl Callgrind {
    /// Finds valgrind, or says how to install it.
    fn find() -> Result<Callgrind, String> {
        const INSTALL: &str = "install it with `apt-get install -y valgrind`";
        let output = Command::new("valgrind")
            .arg("--version")
            .output()
            .map_err(|error| format!("valgrind could not be run ({error}): {INSTALL}"))?;
        if !output.status.success() {
            return Err(format!(
                "`valgrind --version` failed ({}): {INSTALL}",
                output.status
            ));
        }
        let version = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        let executable = std::env::current_exe()
            .map_err(|error| format!("cannot find this benchmark's executable: {error}"))?;
        let profile = build_profile(&executable)?;
        let out_dir = results::instructions_dir().join(&profile);
        std::fs::create_dir_all(&out_dir)
            .map_err(|error| format!("cannot create {}: {error}", out_dir.display()))?;
        Ok(Callgrind {
            version,
            executable,
            profile,
            out_dir,
        })
    }

    /// Instructions per decision of `case`, the loop's own included.
    fn per_decision(&self, case: &Case) -> Result<f64, String> {
        let [fewer, more] = case.rounds;
        let base = self.count(case, fewer)?;
        let total = self.count(case, more)?;
        let extra = total
            .checked_sub(base)
            .filter(|&extra| extra > 0)
            .ok_or_else(|| {
                format!(
                    "{}: {more} rounds counted {total} instructions, {fewer} rounds {base}: \
                 more rounds must count more",
                    case.name
                )
            })?;
        Ok(extra as f64 / ((more - fewer) * case.decisions_per_round) as f64)
    }

    /// The instructions `rounds` rounds of `case` execute inside the counted function.
    fn count(&self, case: &Case, rounds: u64) -> Result<u64, String> {
        let out_file = self.out_dir.join(format!(
            "{}.{rounds}.callgrind",
            case.name.replace('/', ".")
        ));
        let output = Command::new("valgrind")
            .arg("--tool=callgrind")
            .arg("--collect-atstart=no")
            .arg(format!("--toggle-collect={COUNTED_FUNCTION}"))
            .arg(format!("--callgrind-out-file={}", out_file.display()))
            .arg(&self.executable)
            .args([MEASURE, case.name, &rounds.to_string()])
            .output()
            .map_err(|error| format!("valgrind could not be run: {error}"))?;
        if !output.status.success() {
            return Err(format!(
                "{} ({rounds} rounds) failed under valgrind ({}):\n{}",
                case.name,
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        let text = std::fs::read_to_string(&out_file)
            .map_err(|error| format!("cannot read {}: {error}", out_file.display()))?;
        let count = callgrind_total(&text).ok_or_else(|| {
            format!(
                "no instruction total in {} (callgrind's `summary:` line)",
                out_file.display()
            )
        })?;
        if count == 0 {
            return Err(format!(
                "callgrind counted nothing for {} in {}: is {COUNTED_FUNCTION} still in the \
                 binary under that name?",
                case.name,
                out_file.display()
            ));
        }
        Ok(count)
    }
}

/// The total of callgrind's only event (instructions) in its output file.
fn callgrind_total(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("summary:"))
        .and_then(|total| total.trim().parse().ok())
}

/// The profile `executable` was built in: cargo builds a benchmark into
/// `<target>/<profile folder>/deps/`, `release` for the default bench profile.
fn build_profile(executable: &Path) -> Result<String, String> {
    let profile = executable
        .parent()
        .and_then(Path::parent)
        .and_then(Path::file_name)
        .and_then(|name| name.to_str())
        .unwrap_or_default();
    if PROFILES.contains(&profile) {
        Ok(profile.to_owned())
    } else {
        Err(format!(
            "{} is not in a folder of the profiles the report shows ({}): run \
             `cargo bench --package tollgate-instructions [--profile {}]`",
            executable.display(),
            PROFILES.join(", "),
            results::RELEASE_LTO
        ))
    }
}
