//! How the examples end: on an error, its message and the messages of its causes, as people
//! read them (`Display`), one line each, and a failing exit status. A `main` that returns the
//! error instead prints its `Debug` form (`InvalidField { plan: Some("free"), ... }`), which is
//! for programmers, not for whoever runs the example.

use std::error::Error;
use std::process::ExitCode;

/// Prints `error: <message>` to stderr, then `caused by: <message>` for each error in its
/// `source()` chain whose message the lines before do not already contain (tollgate's errors
/// repeat their cause's message in their own), and returns a failing exit status; `Ok` is a
/// successful one.
pub(crate) fn exit_code(result: Result<(), Box<dyn Error>>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprint!("{}", error_lines(error.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// The lines [`exit_code`] prints for `error`, each ending in a newline.
fn error_lines(error: &dyn Error) -> String {
    let mut lines = format!("error: {error}\n");
    let mut cause = error.source();
    while let Some(source) = cause {
        let message = source.to_string();
        if !lines.contains(&message) {
            lines += &format!("caused by: {message}\n");
        }
        cause = source.source();
    }
    lines
}
