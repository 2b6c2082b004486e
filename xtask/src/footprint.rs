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
    let clients = figures["clients"].as_u64().ok_or("no clients")?;
    let flood_keys = figures["flood_keys"].as_u64().ok_or("no flood_keys")?;
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
         a client map built on papaya takes. *tollgate*: a service of capacity {clients} \
         (its table, 17 bytes per client of capacity, allocated when built and touched as it \
         fills), which holds a little fewer than all of them: a client whose key's 16 slots are \
         taken reuses an idle client's slot (*clients held* says how many stay), else evicts one. \
         *tollgate-4x*: four times the capacity, which holds them all. *flood*: {flood_keys} \
         distinct keys, one request each, through a service of capacity {clients}: the bytes \
         are its growth over {clients}.\n\n\
         | subject | resident bytes per idle client | vs governor | ns per first request | vs governor | clients held | evictions |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
        section::FOOTPRINT.begin,
        figures["source"].as_str().ok_or("no source")?,
        clients,
        figures["runs"].as_u64().ok_or("no runs")?,
    );
    for subject in subjects {
        let (bytes, nanos) = (
            figure(subject, "resident_bytes_per_client")?,
            figure(subject, "nanos_per_first_request")?,
        );
        let _ = writeln!(
            out,
            "| {} | {bytes:.1} | {:.2}x | {nanos:.0} | {:.2}x | {:.0} | {:.0} |",
            subject["subject"]
                .as_str()
                .ok_or("a subject without a name")?,
            bytes / baseline_bytes,
            nanos / baseline_nanos,
            figure(subject, "clients_held")?,
            figure(subject, "evictions")?,
        );
    }
    if let Some(flood) = subjects
        .iter()
        .find(|subject| subject["subject"] == "flood")
    {
        let _ = writeln!(
            out,
            "\nThe flood's resident growth: {:.1} MiB, within its bound of {:.1} MiB (the table, \
             plus 16 MiB).",
            figure(flood, "resident_growth_bytes")? / f64::from(1 << 20),
            figures["flood_bound_bytes"]
                .as_f64()
                .ok_or("no flood_bound_bytes")?
                / f64::from(1 << 20),
        );
    }
    out.push_str(section::FOOTPRINT.end);
    Ok(out)
}
