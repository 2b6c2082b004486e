//! The project's tasks beside the crate: for now, writing BENCHMARKS.md from what the benchmarks
//! measured. The benchmarks (`benches/`) measure and keep their figures; this writes them up.
//!
//! ```text
//! cargo xtask report criterion      # after `cargo bench --bench tollgate`
//! cargo xtask report instructions   # after `cargo bench --package tollgate-instructions`,
//!                                   # with and without `--profile release-lto`
//! cargo xtask report footprint      # after `cargo bench --bench footprint`
//! ```
//!
//! Each writes its part of BENCHMARKS.md and leaves the others as they are. After the part's
//! name, `[<results> [<output>]]` name another results folder (criterion's, or the instruction
//! harness's, with a file per profile) or file (the footprint's) and another output than the
//! workspace's BENCHMARKS.md.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod criterion;
mod footprint;
// The suite's ids, which the report reads.
#[path = "../../benches/tollgate/ids.rs"]
mod ids;
mod instructions;
// Where the benchmarks leave their figures; the source revision is theirs to record.
#[allow(dead_code)]
#[path = "../../benches/support/results.rs"]
mod results;
mod section;
#[cfg(test)]
mod tests;

const USAGE: &str =
    "usage: cargo xtask report criterion|instructions|footprint [<results> [<output>]]";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Vec<String>) -> Result<(), section::Error> {
    let [task, part, paths @ ..] = args.as_slice() else {
        return Err(USAGE.into());
    };
    if task != "report" || paths.len() > 2 {
        return Err(USAGE.into());
    }
    // Paths on the command line are the caller's; the benchmarks' are the workspace root's
    // (cargo runs benchmarks there), which this then works in.
    let given: Vec<PathBuf> = paths
        .iter()
        .map(std::path::absolute)
        .collect::<Result<_, _>>()?;
    std::env::set_current_dir(workspace_root())?;
    let output = given
        .get(1)
        .cloned()
        .unwrap_or_else(|| PathBuf::from("BENCHMARKS.md"));
    let results = given.first().cloned();
    match part.as_str() {
        "criterion" => {
            let dir = results.unwrap_or_else(results::criterion_dir);
            let benchmarks = criterion::write_report(&dir, &output)?;
            println!("wrote {} from {benchmarks} benchmarks", output.display());
        }
        "instructions" => {
            let figures = results.unwrap_or_else(results::instructions_dir);
            instructions::write_section(&figures, &output)?;
            println!("wrote the instruction counts into {}", output.display());
        }
        "footprint" => {
            let figures = results.unwrap_or_else(results::footprint_json);
            footprint::write_section(&figures, &output)?;
            println!("wrote the footprint into {}", output.display());
        }
        _ => return Err(USAGE.into()),
    }
    Ok(())
}

/// The workspace's root, where BENCHMARKS.md is: this package's parent.
fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace")
}
