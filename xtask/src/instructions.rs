//! The section of BENCHMARKS.md with the instruction counts, written from the figures the last
//! full runs of the instruction harness kept, one per build profile (`release.json`,
//! `release-lto.json` in `target/instructions/`).
//!
//! The cases are the harness's (`benches/instructions/cases.rs`), read from the figures: a case
//! is named `{row}/{implementation}` and says what its row is called; a row shows tollgate's
//! case beside governor's, where there is one, in each profile.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use crate::results::{RELEASE, RELEASE_LTO, instructions_json};
use crate::section::{self, Error, thousands};

/// The command that produces the figures of the default release profile; with
/// `--profile release-lto`, those of release with thin LTO.
const PRODUCING_COMMAND: &str = "cargo bench --package tollgate-instructions";

/// Writes the section of the figures in `figures_dir` (one file per profile) into `output`.
pub(crate) fn write_section(figures_dir: &Path, output: &Path) -> Result<(), Error> {
    let [release, release_lto] = [RELEASE, RELEASE_LTO].map(|profile| {
        let path = figures_dir.join(instructions_json(profile).file_name().expect("a file name"));
        read_figures(&path, profile)
    });
    let section = render(&release?, &release_lto?)?;
    section::INSTRUCTIONS.write(output, &section)
}

/// The figures the harness built in `profile` kept in `path`.
fn read_figures(path: &Path, profile: &str) -> Result<Value, Error> {
    let command = if profile == RELEASE {
        PRODUCING_COMMAND.to_owned()
    } else {
        format!("{PRODUCING_COMMAND} --profile {profile}")
    };
    let text = std::fs::read_to_string(path).map_err(|error| {
        format!(
            "cannot read {} ({error}): run `{command}` (about a minute, needs valgrind), then \
             this again",
            path.display()
        )
    })?;
    let figures: Value =
        serde_json::from_str(&text).map_err(|error| format!("{}: {error}", path.display()))?;
    if figures["profile"].as_str() != Some(profile) {
        return Err(format!(
            "{}: figures of profile {}, not {profile}",
            path.display(),
            figures["profile"]
        )
        .into());
    }
    Ok(figures)
}

/// One line of the table: per profile (default release, thin LTO), tollgate's and governor's.
struct Row<'a> {
    label: &'a str,
    tollgate: [Option<f64>; 2],
    governor: [Option<f64>; 2],
}

/// The section, markers included, from the figures of the default release build and of the
/// build with thin LTO.
pub(crate) fn render(release: &Value, release_lto: &Value) -> Result<String, Error> {
    let text = |field: &str| release[field].as_str().ok_or_else(|| format!("no {field}"));
    let number = |field: &str| release[field].as_u64().ok_or_else(|| format!("no {field}"));
    // Both runs must have counted the same source the same way to share a table.
    for field in [
        "source",
        "valgrind",
        "rustc",
        "per_decision_rounds",
        "lookup_clients",
        "first_request_batch",
    ] {
        if release[field] != release_lto[field] {
            return Err(format!(
                "the two profiles' runs differ in {field} ({} and {}): run both again",
                release[field], release_lto[field]
            )
            .into());
        }
    }
    let [fewer, more] = [0, 1].map(|index| release["per_decision_rounds"][index].as_u64());
    let (Some(fewer), Some(more)) = (fewer, more) else {
        return Err("no per_decision_rounds".into());
    };
    let [loop_release, loop_lto] = [release, release_lto].map(|figures| {
        figures["loop_per_round"]
            .as_f64()
            .ok_or("no loop_per_round")
    });
    let (loop_release, loop_lto) = (loop_release?, loop_lto?);

    let mut rows: Vec<(&str, Row<'_>)> = Vec::new();
    for (profile, figures) in [release, release_lto].into_iter().enumerate() {
        for case in figures["cases"].as_array().ok_or("no cases")? {
            let name = case["name"].as_str().ok_or("a case without a name")?;
            let per_decision = case["per_decision"]
                .as_f64()
                .ok_or_else(|| format!("{name}: no per_decision"))?;
            let (row_id, implementation) = name
                .split_once('/')
                .ok_or_else(|| format!("{name}: not `row/implementation`"))?;
            let index = match rows.iter().position(|(id, _)| *id == row_id) {
                Some(index) => index,
                None => {
                    rows.push((
                        row_id,
                        Row {
                            label: case["label"].as_str().unwrap_or(row_id),
                            tollgate: [None; 2],
                            governor: [None; 2],
                        },
                    ));
                    rows.len() - 1
                }
            };
            let row = &mut rows[index].1;
            match implementation {
                "tollgate" => row.tollgate[profile] = Some(per_decision),
                "governor" => row.governor[profile] = Some(per_decision),
                other => return Err(format!("{name}: no column for {other}").into()),
            }
        }
    }

    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}\n\
         ## Instructions per decision\n\n\
         Generated from `{PRODUCING_COMMAND}` (the default release profile) and \
         `{PRODUCING_COMMAND} --profile {RELEASE_LTO}` (release with thin LTO) by `cargo xtask \
         report instructions`; do not edit by hand. Source: {}. Counted by callgrind ({}), \
         built by {}.\n\n\
         Instructions executed per decision, on one thread: exact, and (but for the default \
         hasher's rows, below) the same on every run of the same build, where the timings \
         above move with the machine's load; the figure \
         to judge a change of the hot path by. They do not show cache misses, contention or \
         what each instruction costs, so they complement the timings rather than replace them. \
         Each is the count over {} decisions less the count over {} (set-up and one-time \
         costs cancel), divided by the {} between, less the counting loop's own instructions \
         per round ({:.1} in release, {:.1} with thin LTO). tollgate reads `MonotonicClock`, \
         governor its default `QuantaClock`: both read quanta's counter.\n\n\
         *How each is compiled*: *release* is the workspace's release profile as cargo sets it \
         (opt-level 3, 16 codegen units per crate, no LTO across crates); *thin LTO* is the \
         same with `lto = \"thin\"` (the `{RELEASE_LTO}` profile). tollgate, governor and every \
         other dependency keep those settings. The harness's own crate, where the generic code \
         each case calls (tollgate's limiters, governor's `check`) is instantiated, as it is in \
         a user's program, has its codegen units fixed so that each library counts what a \
         small program's plain loop (`limiter.try_acquire()` or `limiter.check().is_ok()`, \
         counted in a loop) counts in the same profile (checked on the token bucket's rows: \
         within 2 instructions): one unit in release, units left unmerged with thin LTO. Left to the defaults, a crate of many \
         cases has its units merged differently as unrelated code changes, and governor's \
         `check` counted 96 or 54 from one build to the next. Even in a small program, whether \
         `check` is inlined into its caller depends on the unit its instance lands in, and so \
         on the rest of the program: in release, a plain loop counted governor's allowed \
         decision at 50 (inlined, its clock read a call) in one small program and 89 (a call) \
         in the same program with two more cases; the release columns give governor the \
         inlined, lower count, as one unit does. With thin LTO both programs counted 59 (a \
         call), as units left unmerged do; with thin LTO and one codegen unit governor counts \
         42 allowed and 35 denied, against tollgate's 48 and 45. tollgate counted the same in \
         every one of these builds, its `try_acquire` inlined whole, clock read included.\n\n\
         *allow*: 10⁹ per second for the token bucket (full again at every decision), 10⁹ per \
         hour for the fixed window, 65 536 per hour for the sliding log and 10⁶ per hour for \
         the sliding window counter (more than a run takes). *deny*: 1 per hour, its one permit \
         taken before counting. *whole `Decision`*: `try_acquire_n(1)`, keeping what response \
         headers need, instead of `try_acquire`. governor has only GCRA, the token bucket's \
         algorithm.\n\n\
         *service*: token bucket, `u64` keys, one plan: `RateLimiterService::allow` against \
         governor's keyed limiter (`check_key` on a `DashMap`), each with its default hasher, \
         both SipHash-1-3 of the key's bytes under random keys (tollgate's `SipState`, \
         governor's std `RandomState`; *std RandomState*: both with governor's; the keys \
         move entries and so probe lengths: these rows move by up to about 1% from run to run; \
         every other row is exact), or both with foldhash with a fixed seed. A lookup is a request from one of {} clients \
         (or of 1 000 000) already in the map, taken in turn; a first request makes the \
         client's limiter, {} of them into a fresh map, counted over two such batches after a \
         first: governor's default-sized (its growth included), tollgate's of capacity four \
         times the clients (allocated when the service is built, not counted; a capacity of \
         exactly the clients would not hold them all, and a lookup of a client that lost its \
         slot would count an insert). *Into a full store*: a first request into a service of \
         capacity 8 192 whose every slot holds an idle client, so that it reuses one (the path \
         of a flood of new keys through a service at its capacity; governor's map has no \
         capacity, and grows instead). A ratio above 1.00x is a case where tollgate executes \
         more instructions than governor.\n",
        section::INSTRUCTIONS.begin,
        text("source")?,
        text("valgrind")?,
        text("rustc")?,
        thousands(more),
        thousands(fewer),
        thousands(more - fewer),
        loop_release,
        loop_lto,
        thousands(number("lookup_clients")?),
        thousands(number("first_request_batch")?),
    );
    let _ = writeln!(
        out,
        "| case | tollgate, release | governor, release | tollgate / governor, release \
         | tollgate, thin LTO | governor, thin LTO | tollgate / governor, thin LTO |\n\
         |---|---:|---:|---:|---:|---:|---:|"
    );
    for (_, row) in &rows {
        let _ = write!(out, "| {} |", row.label);
        for profile in 0..2 {
            let cell = |figure: Option<f64>| figure.map_or("—".to_owned(), |f| format!("{f:.1}"));
            let ratio = match (row.tollgate[profile], row.governor[profile]) {
                (Some(tollgate), Some(governor)) => format!("{:.2}x", tollgate / governor),
                _ => String::new(),
            };
            let _ = write!(
                out,
                " {} | {} | {ratio} |",
                cell(row.tollgate[profile]),
                cell(row.governor[profile])
            );
        }
        out.push('\n');
    }
    out.push_str(section::INSTRUCTIONS.end);
    Ok(out)
}
