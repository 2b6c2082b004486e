//! The conditions of a run, recorded at its start, around the multi-threaded measurements, and at
//! its end: this machine is shared, and a
//! neighbour's load changes every figure, the multi-threaded ones most. The report prints them
//! beside the tables so that a reader can tell a quiet run from a disturbed one.
//!
//! - the 1-minute load average (`/proc/loadavg`, where there is one);
//! - how much faster two threads do independent work than one: 2.0 when two cores are free for
//!   this process, 1.0 when the threads must take turns on one;
//! - which commit the source was at.

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

/// What the run measured, and under what load.
#[derive(Debug)]
pub(crate) struct Run {
    source: String,
    /// Snapshots by when they were taken, in order.
    snapshots: Vec<(&'static str, Conditions)>,
    /// Each contended benchmark's share of its threads' time on a core, by id.
    on_cpu_shares: Vec<(String, f64)>,
}

impl Run {
    /// Records the source and the load as the run starts (the source right after the build,
    /// so that it is the one the benchmarks were built from).
    pub(crate) fn start() -> Run {
        Run {
            source: crate::results::source_revision(),
            snapshots: vec![("start", Conditions::now())],
            on_cpu_shares: Vec::new(),
        }
    }

    /// Records the contended benchmarks' shares of time on a core.
    pub(crate) fn on_cpu_shares(&mut self, shares: Vec<(String, f64)>) {
        self.on_cpu_shares = shares;
    }

    /// Records the load now, as `when` (the multi-threaded measurements are the ones a
    /// neighbour disturbs most, so they are bracketed by snapshots of their own).
    pub(crate) fn snapshot(&mut self, when: &'static str) {
        self.snapshots.push((when, Conditions::now()));
    }

    /// Records the load as the run ends, and writes `run.json` to `directory`.
    pub(crate) fn finish(mut self, directory: &Path) {
        self.snapshot("end");
        let snapshots: Vec<String> = self
            .snapshots
            .iter()
            .map(|(when, conditions)| {
                format!("    {{\"when\": \"{when}\", {}}}", conditions.fields())
            })
            .collect();
        let shares: Vec<String> = self
            .on_cpu_shares
            .iter()
            .map(|(id, share)| format!("    \"{id}\": {share:.3}"))
            .collect();
        let json = format!(
            "{{\n  \"source\": \"{}\",\n  \"snapshots\": [\n{}\n  ],\n  \"on_cpu_share\": {{\n{}\n  }}\n}}\n",
            self.source,
            snapshots.join(",\n"),
            shares.join(",\n")
        );
        let path = directory.join(crate::results::RUN_JSON);
        let written = std::fs::create_dir_all(directory).and_then(|()| std::fs::write(&path, json));
        if let Err(error) = written {
            eprintln!("could not write {}: {error}", path.display());
        }
    }
}

/// A snapshot of the machine's load.
#[derive(Debug, Clone, Copy)]
struct Conditions {
    load_average: Option<f64>,
    parallel_speedup: f64,
}

impl Conditions {
    fn now() -> Conditions {
        Conditions {
            load_average: load_average(),
            parallel_speedup: parallel_speedup(),
        }
    }

    /// The JSON fields of this snapshot.
    fn fields(self) -> String {
        let load = self
            .load_average
            .map_or_else(|| "null".to_owned(), |load| format!("{load:.2}"));
        format!(
            "\"load_average\": {load}, \"parallel_speedup\": {:.2}",
            self.parallel_speedup
        )
    }
}

fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Two threads' rate on independent work over one thread's, best of a few tries (a try that a
/// neighbour interrupted says less about the machine than the best one).
fn parallel_speedup() -> f64 {
    const TRIES: usize = 3;
    (0..TRIES)
        .map(|_| {
            let alone = timed_spin();
            let together = std::thread::scope(|scope| {
                let other = scope.spawn(timed_spin);
                let mine = timed_spin();
                mine.max(other.join().expect("the spinning thread panicked"))
            });
            2.0 * alone.as_secs_f64() / together.as_secs_f64()
        })
        .fold(0.0, f64::max)
}

/// About 20 ms of arithmetic that touches no shared memory.
fn timed_spin() -> Duration {
    const STEPS: u64 = 20_000_000;
    let start = Instant::now();
    let mut state = 1u64;
    for step in 0..STEPS {
        state = black_box(
            state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(step),
        );
    }
    black_box(state);
    start.elapsed()
}
