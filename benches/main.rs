//! Benchmarks (filled in by the benchmark suite).
fn main() {}
