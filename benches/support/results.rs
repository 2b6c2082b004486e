//! Where the benchmarks leave their results, and the source revision they were measured at:
//! shared by the harnesses that write the results and the report (`cargo xtask report`) that
//! reads them, both of which include this file by path.
//!
//! Relative paths are the workspace's root: cargo runs the root package's benchmarks there, the
//! instruction harness (a package of its own) and the report move there.

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

/// The build profile of the default release build, as cargo names its folder (`cargo bench`
/// builds in the bench profile, which inherits release, into `release`).
pub(crate) const RELEASE: &str = "release";

/// The build profile of release with thin LTO (the workspace's Cargo.toml).
pub(crate) const RELEASE_LTO: &str = "release-lto";

/// Where the instruction harness keeps its figures (one file per build profile) and callgrind's
/// files.
pub(crate) fn instructions_dir() -> PathBuf {
    target_dir().join("instructions")
}

/// The instruction counts of the last full run of the instruction harness built in `profile`.
pub(crate) fn instructions_json(profile: &str) -> PathBuf {
    instructions_dir().join(format!("{profile}.json"))
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
