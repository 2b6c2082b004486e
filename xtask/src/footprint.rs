//! The section of BENCHMARKS.md on a million clients, written from the figures the last run of
//! `cargo bench --bench footprint` kept (`footprint.json`).

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use crate::section::{self, Error};

/// The command that produces the figures.
const PRODUCING_COMMAND: &str = "cargo bench --bench footprint";

/// The subject every other is compared with.
const BASELINE: &str = "governor";

/// Writes the section of the figures in `figures_json` into `output`.
pub(crate) fn write_section(figures_json: &Path, output: &Path) -> Result<(), Error> {
    let text = std::fs::read_to_string(figures_json).map_err(|error| {
        format!(
            "cannot read {} ({error}): run `{PRODUCING_COMMAND}` (about a minute), then this \
             again",
            figures_json.display()
        )
    })?;
    let figures: Value = serde_json::from_str(&text)
        .map_err(|error| format!("{}: {error}", figures_json.display()))?;
    let section =
        render(&figures).map_err(|error| format!("{}: {error}", figures_json.display()))?;
    section::FOOTPRINT.write(output, &section)
}

/// The section, markers included.
pub(crate) fn render(figures: &Value) -> Result<String, Error> {
    let subjects = figures["subjects"].as_array().ok_or("no subjects")?;
    let figure = |subject: &Value, field: &str| {
        subject[field].as_f64().ok_or_else(|| {
            format!(
                "{}: no {field}",
                subject["subject"].as_str().unwrap_or("a subject")
            )
        })
    };
    let baseline = subjects
        .iter()
        .find(|subject| subject["subject"] == BASELINE)
        .ok_or_else(|| format!("no figures for {BASELINE}"))?;
    let (baseline_bytes, baseline_nanos) = (
        figure(baseline, "resident_bytes_per_client")?,
        figure(baseline, "nanos_per_first_request")?,
    );
    let mut out = format!(
        "{}\n## A million clients\n\nGenerated from `{PRODUCING_COMMAND}` by `cargo xtask \
         report footprint`; do not edit by hand. Source: {}.\n\n\
         Each subject in a process of its own makes {} clients by one request each (`u64` \
         keys, token bucket / GCRA, *100 per 1s*, each with its default randomly seeded SipHash); \
         medians of {} interleaved runs. *Resident bytes per idle client*: the growth of the \
         process's resident set (`VmRSS`) over the number of clients, allocator headers and the \
         map's spare capacity included. *ns per first request*: the same loop's wall time over the \
         number of clients (one shared machine: compare the ratios of one run). *papaya floor*: a \
         `papaya::HashMap<u64, AtomicU64>` with blocking resizes, filled the same way, the least \
         a client map built on papaya takes.\n\n\
         | subject | resident bytes per idle client | vs governor | ns per first request | vs governor |\n\
         |---|---:|---:|---:|---:|\n",
        section::FOOTPRINT.begin,
        figures["source"].as_str().ok_or("no source")?,
        figures["clients"].as_u64().ok_or("no clients")?,
        figures["runs"].as_u64().ok_or("no runs")?,
    );
    for subject in subjects {
        let (bytes, nanos) = (
            figure(subject, "resident_bytes_per_client")?,
            figure(subject, "nanos_per_first_request")?,
        );
        let _ = writeln!(
            out,
            "| {} | {bytes:.1} | {:.2}x | {nanos:.0} | {:.2}x |",
            subject["subject"]
                .as_str()
                .ok_or("a subject without a name")?,
            bytes / baseline_bytes,
            nanos / baseline_nanos,
        );
    }
    out.push_str(section::FOOTPRINT.end);
    Ok(out)
}
