//! Builds a service from a settings file (placeholder until the settings module lands).
fn main() {}
