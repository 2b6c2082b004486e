//! Where the benchmarks leave their results, and the source revision they were measured at:
//! shared by the harnesses that write the results and the report (`cargo xtask report`) that
//! reads them, both of which include this file by path.
//!
//! Relative paths are the package's root: cargo runs benchmarks there, and the report runs
//! there too.

use std::path::PathBuf;
use std::process::Command;

/// Cargo's target directory: `CARGO_TARGET_DIR`, else `target`.
pub(crate) fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from)
}

/// Criterion's output directory, found the way criterion finds it (short of asking cargo):
/// `CRITERION_HOME`, else `criterion` in the target directory. The suite's own tables land
/// beside criterion's results.
pub(crate) fn criterion_dir() -> PathBuf {
    std::env::var_os("CRITERION_HOME").map_or_else(|| target_dir().join("criterion"), PathBuf::from)
}

/// In [`criterion_dir`]: the suite's heap per idle client, which criterion cannot measure.
pub(crate) const MEMORY_JSON: &str = "memory.json";

/// In [`criterion_dir`]: the run's conditions (source, load, each contended benchmark's share of
/// time on a core).
pub(crate) const RUN_JSON: &str = "run.json";

/// The instruction counts of the last full run of `--bench instructions`, beside callgrind's
/// files.
pub(crate) fn instructions_json() -> PathBuf {
    target_dir().join("instructions").join("instructions.json")
}

/// The figures of the last run of `--bench footprint`.
pub(crate) fn footprint_json() -> PathBuf {
    target_dir().join("footprint").join("footprint.json")
}

/// The commit the source is at, and whether `src/` differs from it, by asking git (best effort:
/// "unknown" without it).
pub(crate) fn source_revision() -> String {
    let Some(commit) = command_output("git", &["rev-parse", "--short", "HEAD"]) else {
        return "unknown".to_owned();
    };
    match command_output("git", &["status", "--porcelain", "--", "src"]) {
        Some(changes) if changes.is_empty() => format!("commit {commit}"),
        _ => format!("commit {commit} with uncommitted changes in src/"),
    }
}

/// What `program args` prints, trimmed, if it runs and succeeds.
pub(crate) fn command_output(program: &str, args: &[&str]) -> Option<String> {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}
