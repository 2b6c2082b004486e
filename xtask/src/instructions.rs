//! The section of BENCHMARKS.md with the instruction counts, written from the figures the last
//! full run of `cargo bench --bench instructions` kept (`instructions.json`).
//!
//! The cases are the harness's (`benches/instructions/cases.rs`), read from the figures: a case
//! is named `{row}/{implementation}` and says what its row is called; a row shows tollgate's
//! case beside governor's, where there is one.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use crate::section::{self, Error, thousands};

/// The command that produces the figures.
const PRODUCING_COMMAND: &str = "cargo bench --bench instructions";

/// Writes the section of the figures in `figures_json` into `output`.
pub(crate) fn write_section(figures_json: &Path, output: &Path) -> Result<(), Error> {
    let text = std::fs::read_to_string(figures_json).map_err(|error| {
        format!(
            "cannot read {} ({error}): run `{PRODUCING_COMMAND}` (a few minutes, needs \
             valgrind), then this again",
            figures_json.display()
        )
    })?;
    let figures: Value = serde_json::from_str(&text)
        .map_err(|error| format!("{}: {error}", figures_json.display()))?;
    let section =
        render(&figures).map_err(|error| format!("{}: {error}", figures_json.display()))?;
    section::INSTRUCTIONS.write(output, &section)
}

/// One line of the table.
struct Row<'a> {
    label: &'a str,
    tollgate: Option<f64>,
    governor: Option<f64>,
}

/// The section, markers included.
pub(crate) fn render(figures: &Value) -> Result<String, Error> {
    let text = |field: &str| figures[field].as_str().ok_or_else(|| format!("no {field}"));
    let number = |field: &str| figures[field].as_u64().ok_or_else(|| format!("no {field}"));
    let [fewer, more] = [0, 1].map(|index| figures["per_decision_rounds"][index].as_u64());
    let (Some(fewer), Some(more)) = (fewer, more) else {
        return Err("no per_decision_rounds".into());
    };
    let loop_per_round = figures["loop_per_round"]
        .as_f64()
        .ok_or("no loop_per_round")?;

    let mut rows: Vec<(&str, Row<'_>)> = Vec::new();
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
                        tollgate: None,
                        governor: None,
                    },
                ));
                rows.len() - 1
            }
        };
        let row = &mut rows[index].1;
        match implementation {
            "tollgate" => row.tollgate = Some(per_decision),
            "governor" => row.governor = Some(per_decision),
            other => return Err(format!("{name}: no column for {other}").into()),
        }
    }

    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}\n\
         ## Instructions per decision\n\n\
         Generated from `{PRODUCING_COMMAND}` by `cargo xtask report instructions`; do not edit \
         by hand. Source: {}. Counted by callgrind ({}), built by {}.\n\n\
         Instructions executed per decision, on one thread: exact, and (but for the default \
         hasher's rows, below) the same on every run of the same build, where the timings \
         above move with the machine's load; the figure \
         to judge a change of the hot path by. They do not show cache misses, contention or \
         what each instruction costs, so they complement the timings rather than replace them. \
         Each is the count over {} decisions less the count over {} (set-up and one-time \
         costs cancel), divided by the {} between, less the counting loop's own {:.1} per \
         round. tollgate reads `MonotonicClock`, governor its default \
         `QuantaClock`: both read quanta's counter.\n\n\
         *allow*: 10⁹ per second for the token bucket (full again at every decision), 10⁹ per \
         hour for the fixed window, 65 536 per hour for the sliding log and 10⁶ per hour for \
         the sliding window counter (more than a run takes). *deny*: 1 per hour, its one permit taken before counting. *whole `Decision`*: \
         `try_acquire_n(1)`, keeping what response headers need, instead of `try_acquire`. \
         governor has only GCRA, the token bucket's algorithm.\n\n\
         *service*: token bucket, `u64` keys, one plan: `RateLimiterService::allow` against \
         governor's keyed limiter (`check_key` on a `DashMap`), both with the same hasher: \
         their default (std's SipHash-1-3 with random keys, which move entries and so probe \
         lengths: these rows move by up to about 1% from run to run; every other row is \
         exact), or foldhash with a fixed seed. A lookup is a request from one of {} clients \
         already in the map, taken in turn; a first request makes the client's limiter, {} \
         of them into a fresh default-sized map (its growth included), counted over two such \
         batches after a first.\n",
        section::INSTRUCTIONS.begin,
        text("source")?,
        text("valgrind")?,
        text("rustc")?,
        thousands(more),
        thousands(fewer),
        thousands(more - fewer),
        loop_per_round,
        thousands(number("lookup_clients")?),
        thousands(number("first_request_batch")?),
    );
    let _ = writeln!(
        out,
        "| case | tollgate | governor | tollgate / governor |\n|---|---:|---:|---:|"
    );
    for (_, row) in &rows {
        let Some(tollgate) = row.tollgate else {
            continue;
        };
        let (governor_cell, ratio_cell) = match row.governor {
            Some(governor) => (
                format!("{governor:.1}"),
                format!("{:.2}x", tollgate / governor),
            ),
            None => ("—".to_owned(), String::new()),
        };
        let _ = writeln!(
            out,
            "| {} | {tollgate:.1} | {governor_cell} | {ratio_cell} |",
            row.label
        );
    }
    out.push_str(section::INSTRUCTIONS.end);
    Ok(out)
}
