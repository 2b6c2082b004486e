//! The report against small results laid out as the benchmarks leave them: it writes a complete
//! set, and refuses an incomplete criterion run, naming what is missing and the command that
//! produces it, with the file left as it was.

use std::path::{Path, PathBuf};

use crate::criterion;

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
