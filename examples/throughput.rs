//! A quick look at throughput without criterion, in about ten seconds: decisions per second on
//! one limiter shared by 1, 2 and 4 threads, for each method and the mutex reference of the same
//! method, allow-heavy and deny-heavy.
//!
//! Run with `cargo run --release --example throughput`. The workloads and the thread harness are
//! the benchmark suite's own (`benches/tollgate/workload.rs`); `cargo bench` gives the careful
//! figures, this gives a feel in seconds.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tollgate::{Algorithm, MonotonicClock};

// The suite's ids, which name the workloads; the rest are the suite's and its report's.
#[allow(dead_code)]
#[path = "../benches/tollgate/ids.rs"]
mod ids;
#[path = "../tests/support/reference.rs"]
mod reference;
#[path = "../benches/tollgate/workload.rs"]
mod workload;

use workload::{TryAcquireOne, VisitLimiter, Workload, visit_limiters};

const THREAD_COUNTS: [usize; 3] = [1, 2, 4];

/// Each of the 36 configurations runs this long: about ten seconds in all.
const RUN_TIME: Duration = Duration::from_millis(250);

/// Attempts between two looks at the stop flag: enough that the look costs nothing, few enough
/// that a thread stops within microseconds.
const ATTEMPTS_PER_CHECK: u64 = 1024;

fn main() {
    let clock = MonotonicClock::new();
    println!(
        "decisions per second (millions), one limiter shared by all threads; \
         ratio = tollgate / mutex\n"
    );
    println!(
        "{:<20} {:<8} {:>7} {:>10} {:>10} {:>8}",
        "method", "workload", "threads", "tollgate", "mutex", "ratio"
    );
    for algorithm in Algorithm::ALL {
        for workload in Workload::ALL {
            let mut rates = Rates::default();
            visit_limiters(algorithm, workload, &clock, &mut rates);
            for threads in THREAD_COUNTS {
                let tollgate = rates.get("tollgate", threads);
                let mutex = rates.get("mutex", threads);
                println!(
                    "{:<20} {:<8} {:>7} {:>10.1} {:>10.1} {:>7.2}x",
                    algorithm.to_string(),
                    workload.name(),
                    threads,
                    tollgate / 1e6,
                    mutex / 1e6,
                    tollgate / mutex,
                );
            }
        }
    }
}

/// Decisions per second, by implementation and thread count.
#[derive(Default)]
struct Rates(HashMap<(String, usize), f64>);

impl Rates {
    fn get(&self, implementation: &str, threads: usize) -> f64 {
        self.0
            .get(&(implementation.to_owned(), threads))
            .copied()
            .unwrap_or(f64::NAN)
    }
}

impl VisitLimiter for Rates {
    fn visit<L: TryAcquireOne>(&mut self, implementation: &str, limiter: &L) {
        for threads in THREAD_COUNTS {
            let rate = decisions_per_second(limiter, threads);
            self.0.insert((implementation.to_owned(), threads), rate);
        }
    }
}

/// Runs `threads` threads on `limiter` for [`RUN_TIME`], all released at once, and returns the
/// decisions they made per second of the slowest thread's time. Stopping on a flag, rather than
/// after a fixed count, keeps each run to its time whatever the limiter's speed.
fn decisions_per_second<L: TryAcquireOne>(limiter: &L, threads: usize) -> f64 {
    let start_line = Barrier::new(threads + 1);
    let stop = AtomicBool::new(false);
    let (decisions, slowest) = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    start_line.wait();
                    let start = Instant::now();
                    let mut attempts = 0;
                    // Relaxed: the flag carries no data; a late look only runs one more batch.
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..ATTEMPTS_PER_CHECK {
                            black_box(limiter.try_acquire_one());
                        }
                        attempts += ATTEMPTS_PER_CHECK;
                    }
                    (attempts, start.elapsed())
                })
            })
            .collect();
        start_line.wait();
        std::thread::sleep(RUN_TIME);
        stop.store(true, Ordering::Relaxed);
        workers
            .into_iter()
            .map(|worker| worker.join().expect("a worker panicked"))
            .fold(
                (0, Duration::ZERO),
                |(total, slowest), (attempts, elapsed)| (total + attempts, slowest.max(elapsed)),
            )
    });
    decisions as f64 / slowest.as_secs_f64()
}
