//! loom model checks (filled in by the model suite).
