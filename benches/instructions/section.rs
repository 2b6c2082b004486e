//! A generated section of BENCHMARKS.md, and the source revision its figures come from: shared
//! by the benchmark harnesses that write one.

use std::path::Path;
use std::process::Command;

/// Replaces the section of the file at `path` between the markers `begin` and `end` (which
/// `section` starts and ends with), or appends it when the file has no such section yet (as
/// after the criterion report rewrote the file).
pub(crate) fn write_marked_section(
    path: &Path,
    begin: &str,
    end: &str,
    section: &str,
) -> Result<(), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
    let updated = match (text.find(begin), text.find(end)) {
        (Some(first), Some(last)) if first < last => {
            format!("{}{section}{}", &text[..first], &text[last + end.len()..])
        }
        (None, None) => format!("{}\n\n{section}\n", text.trim_end()),
        _ => {
            return Err(format!(
                "{} has one of {begin} and {end} without the other, or in the wrong order: \
                 mend it by hand",
                path.display()
            ));
        }
    };
    std::fs::write(path, updated)
        .map_err(|error| format!("cannot write {}: {error}", path.display()))
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
