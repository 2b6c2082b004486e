//! The report against small results laid out as the benchmarks leave them: it writes every part
//! from a complete set, and refuses an incomplete criterion run, naming what is missing and the
//! command that produces it, with the file left as it was.

use std::path::{Path, PathBuf};

use crate::{criterion, footprint, instructions, section};

/// A fresh directory under the system's temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("tollgate-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes a criterion result for `id` (`group/function[/value]`) as criterion lays it out.
fn write_result(criterion_dir: &Path, id: &str, median_ns: f64) {
    let dir = criterion_dir.join(id).join("new");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("benchmark.json"),
        format!(r#"{{"full_id": "{id}", "throughput": null}}"#),
    )
    .unwrap();
    std::fs::write(
        dir.join("estimates.json"),
        format!(r#"{{"median": {{"point_estimate": {median_ns}}}}}"#),
    )
    .unwrap();
}

/// Writes `memory.json` and `run.json` as the suite does.
fn write_suite_tables(criterion_dir: &Path) {
    std::fs::write(
        criterion_dir.join("memory.json"),
        r#"{"idle_clients": 100000, "rule": "100 per 1s", "rows": [
            {"method": "token_bucket", "implementation": "tollgate", "requested_bytes_per_client": 48.0,
             "malloc_bytes_per_client": 56.0, "allocations_per_client": 1.0},
            {"method": "token_bucket", "implementation": "governor", "requested_bytes_per_client": 24.0,
             "malloc_bytes_per_client": 24.0, "allocations_per_client": 0.0}
        ]}"#,
    )
    .unwrap();
    std::fs::write(
        criterion_dir.join("run.json"),
        r#"{"source": "commit 0000000", "snapshots": [], "on_cpu_share": {}}"#,
    )
    .unwrap();
}

const PREVIOUS_REPORT: &str = "# Benchmarks\n\nthe previous run's figures\n";

/// The instruction harness's figures of one profile.
fn instructions_figures(profile: &str, governor_allow: f64) -> String {
    format!(
        r#"{{
  "source": "commit 0000000",
  "profile": "{profile}",
  "valgrind": "valgrind-3.19.0",
  "rustc": "rustc 1.95.0",
  "loop_per_round": 4.0,
  "per_decision_rounds": [1000, 11000],
  "lookup_clients": 10000,
  "first_request_batch": 10000,
  "cases": [
    {{"name": "token_bucket_allow/tollgate", "label": "token bucket, allow", "per_decision": 61.04}},
    {{"name": "token_bucket_allow/governor", "label": "token bucket, allow", "per_decision": {governor_allow:.1}}},
    {{"name": "fixed_window_allow/tollgate", "label": "fixed window, allow", "per_decision": 40.0}}
  ]
}}"#
    )
}

/// Writes the instruction harness's figures of both profiles into `dir`, as the harness does.
fn write_instructions_figures(dir: &Path) {
    std::fs::write(
        dir.join("release.json"),
        instructions_figures("release", 96.0),
    )
    .unwrap();
    std::fs::write(
        dir.join("release-lto.json"),
        instructions_figures("release-lto", 48.0),
    )
    .unwrap();
}

const FOOTPRINT_FIGURES: &str = r#"{
  "source": "commit 0000000",
  "clients": 1000000,
  "flood_keys": 10000000,
  "flood_bound_bytes": 33554432.0,
  "runs": 3,
  "subjects": [
    {"subject": "tollgate", "resident_bytes_per_client": 70.0, "nanos_per_first_request": 700.0,
     "clients_held": 923000.0, "evictions": 0.0, "resident_growth_bytes": 70000000.0},
    {"subject": "governor", "resident_bytes_per_client": 35.0, "nanos_per_first_request": 350.0,
     "clients_held": 1000000.0, "evictions": 0.0, "resident_growth_bytes": 35000000.0},
    {"subject": "flood", "resident_bytes_per_client": 17.0, "nanos_per_first_request": 700.0,
     "clients_held": 1000000.0, "evictions": 5.0, "resident_growth_bytes": 17825792.0}
  ]
}"#;

#[test]
fn after_the_tower_bench_alone_the_report_refuses_and_keeps_the_file() {
    let dir = TempDir::new("report-tower-only");
    let criterion_dir = dir.0.join("criterion");
    write_result(&criterion_dir, "tower/check_alone/tollgate", 36.0);
    let output = dir.0.join("BENCHMARKS.md");
    std::fs::write(&output, PREVIOUS_REPORT).unwrap();

    let error = criterion::write_report(&criterion_dir, &output)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("run `cargo bench --bench tollgate`"),
        "{error}"
    );
    assert!(error.contains("clock/"), "names what is missing: {error}");
    assert!(
        error.contains("memory.json") || error.contains("more"),
        "{error}"
    );
    assert_eq!(std::fs::read_to_string(&output).unwrap(), PREVIOUS_REPORT);
}

#[test]
fn a_run_with_every_result_is_written() {
    let dir = TempDir::new("report-complete");
    let criterion_dir = dir.0.join("criterion");
    let needed = criterion::needed_results();
    assert!(needed.len() > 50, "{} results needed", needed.len());
    for id in &needed {
        write_result(&criterion_dir, id, 10.0);
    }
    write_suite_tables(&criterion_dir);
    let output = dir.0.join("BENCHMARKS.md");

    // One result fewer is refused, naming it.
    let first = needed.iter().next().unwrap().clone();
    std::fs::remove_dir_all(criterion_dir.join(&first)).unwrap();
    let error = criterion::write_report(&criterion_dir, &output)
        .unwrap_err()
        .to_string();
    assert!(error.contains(&first), "{error}");
    assert!(!output.exists());

    write_result(&criterion_dir, &first, 10.0);
    assert_eq!(
        criterion::write_report(&criterion_dir, &output).unwrap(),
        needed.len()
    );
    let written = std::fs::read_to_string(&output).unwrap();
    assert!(
        written.contains("| token bucket | 10.0 ns | 10.0 ns | 10.0 ns |"),
        "{written}"
    );
    assert!(
        written.contains("| sliding window log | tollgate | 100.0 | 100.0 | 100.0 |"),
        "{written}"
    );
    assert!(!written.contains("not measured"), "{written}");
}

#[test]
fn the_report_reads_the_ids_the_suite_measures_under() {
    let needed = criterion::needed_results();
    for id in [
        "clock/tollgate_monotonic",
        "single_thread_allow/token_bucket/tollgate_decision",
        "single_thread_deny/sliding_window_counter/mutex",
        "contended_deny/fixed_window/tollgate/4",
        "contended_allow/token_bucket/governor/2",
        "service_lookup/token_bucket/governor/1000000",
        "service_lookup_shared/token_bucket/mutex/4",
        "service_first_request/token_bucket/tollgate",
    ] {
        assert!(needed.contains(id), "{id} not among {needed:?}");
    }
}

#[test]
fn each_part_keeps_the_others() {
    let dir = TempDir::new("report-parts");
    let output = dir.0.join("BENCHMARKS.md");
    std::fs::write(&output, PREVIOUS_REPORT).unwrap();
    let instructions_dir = dir.0.join("instructions");
    std::fs::create_dir_all(&instructions_dir).unwrap();
    write_instructions_figures(&instructions_dir);
    let footprint_json = dir.0.join("footprint.json");
    std::fs::write(&footprint_json, FOOTPRINT_FIGURES).unwrap();

    instructions::write_section(&instructions_dir, &output).unwrap();
    footprint::write_section(&footprint_json, &output).unwrap();
    let written = std::fs::read_to_string(&output).unwrap();
    assert!(written.starts_with(PREVIOUS_REPORT), "{written}");
    assert!(
        written.contains("| token bucket, allow | 61.0 | 96.0 | 0.64x | 61.0 | 48.0 | 1.27x |\n"),
        "{written}"
    );
    assert!(
        written.contains("| fixed window, allow | 40.0 | — |  | 40.0 | — |  |\n"),
        "{written}"
    );
    assert!(
        written.contains("(4.0 in release, 4.0 with thin LTO)"),
        "{written}"
    );
    assert!(
        written.contains("| tollgate | 70.0 | 2.00x | 700 | 2.00x | 923000 | 0 |\n"),
        "{written}"
    );
    assert!(
        written.contains("| flood | 17.0 | 0.49x | 700 | 2.00x | 1000000 | 5 |\n"),
        "{written}"
    );
    assert!(
        written.contains("The flood's resident growth: 17.0 MiB, within its bound of 32.0 MiB"),
        "{written}"
    );

    // A section written by hand after them.
    let hand_written = format!(
        "{}\n## The Redis backend\n\nfigures of another harness\n{}",
        section::HAND_WRITTEN.begin,
        section::HAND_WRITTEN.end
    );
    std::fs::write(&output, format!("{written}\n{hand_written}\n")).unwrap();
    let written = std::fs::read_to_string(&output).unwrap();

    // The criterion part rewrites the file and keeps every section, in place.
    let criterion_dir = dir.0.join("criterion");
    for id in criterion::needed_results() {
        write_result(&criterion_dir, &id, 10.0);
    }
    write_suite_tables(&criterion_dir);
    criterion::write_report(&criterion_dir, &output).unwrap();
    let rewritten = std::fs::read_to_string(&output).unwrap();
    assert!(!rewritten.contains("the previous run's figures"));
    let sections = &written[written.find(section::INSTRUCTIONS.begin).unwrap()..];
    assert!(rewritten.ends_with(sections), "{rewritten}");
    assert!(
        rewritten.contains("figures of another harness"),
        "{rewritten}"
    );

    // Rewriting a section replaces it.
    instructions::write_section(&instructions_dir, &output).unwrap();
    assert_eq!(std::fs::read_to_string(&output).unwrap(), rewritten);
}

#[test]
fn figures_that_are_not_there_are_named() {
    let dir = TempDir::new("report-no-figures");
    let output = dir.0.join("BENCHMARKS.md");
    std::fs::write(&output, PREVIOUS_REPORT).unwrap();
    let error = instructions::write_section(&dir.0, &output)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("run `cargo bench --package tollgate-instructions`"),
        "{error}"
    );
    // One profile's figures without the other's: the missing one is named, with its command.
    std::fs::write(
        dir.0.join("release.json"),
        instructions_figures("release", 50.0),
    )
    .unwrap();
    let error = instructions::write_section(&dir.0, &output)
        .unwrap_err()
        .to_string();
    assert!(error.contains("release-lto.json"), "{error}");
    assert!(
        error.contains("run `cargo bench --package tollgate-instructions --profile release-lto`"),
        "{error}"
    );
    let error = footprint::write_section(&dir.0.join("footprint.json"), &output)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("run `cargo bench --bench footprint`"),
        "{error}"
    );
    assert_eq!(std::fs::read_to_string(&output).unwrap(), PREVIOUS_REPORT);
}

#[test]
fn instruction_figures_of_different_sources_or_profiles_are_refused() {
    let dir = TempDir::new("report-mismatched-figures");
    let output = dir.0.join("BENCHMARKS.md");
    std::fs::write(&output, PREVIOUS_REPORT).unwrap();
    write_instructions_figures(&dir.0);
    let lto = dir.0.join("release-lto.json");
    let figures = std::fs::read_to_string(&lto).unwrap();

    std::fs::write(&lto, figures.replace("0000000", "1111111")).unwrap();
    let error = instructions::write_section(&dir.0, &output)
        .unwrap_err()
        .to_string();
    assert!(error.contains("differ in source"), "{error}");

    std::fs::write(&lto, figures.replace("release-lto", "release")).unwrap();
    let error = instructions::write_section(&dir.0, &output)
        .unwrap_err()
        .to_string();
    assert!(error.contains("not release-lto"), "{error}");
    assert_eq!(std::fs::read_to_string(&output).unwrap(), PREVIOUS_REPORT);
}

#[test]
fn the_sections_of_the_other_harnesses_are_kept() {
    let dir = TempDir::new("report-keeps-sections");
    let criterion_dir = dir.0.join("criterion");
    for id in criterion::needed_results() {
        write_result(&criterion_dir, &id, 10.0);
    }
    write_suite_tables(&criterion_dir);
    let sections = "<!-- instructions:begin -->\n## Instructions per decision\n\nfigures\n\
                    <!-- instructions:end -->\n\n<!-- footprint:begin -->\n## A million \
                    clients\n\nfigures\n<!-- footprint:end -->\n";
    let output = dir.0.join("BENCHMARKS.md");
    std::fs::write(&output, format!("{PREVIOUS_REPORT}\n{sections}")).unwrap();

    criterion::write_report(&criterion_dir, &output).unwrap();
    let written = std::fs::read_to_string(&output).unwrap();
    assert!(!written.contains("the previous run's figures"), "{written}");
    assert!(written.contains("## Memory per client"), "{written}");
    assert!(written.ends_with(&format!("\n\n{sections}")), "{written}");
}
