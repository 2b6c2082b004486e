//! One limiter shared by 1, 2 and 4 threads: aggregate decisions per second, allow-heavy and
//! deny-heavy, for each method against the mutex reference, with governor beside the token
//! bucket. (This machine may have fewer cores than threads: 4 threads on 2 cores measure
//! oversubscription, which a server under load also sees.)
//!
//! Each sample spawns its threads once, releases them together, and counts the slowest thread's
//! time (see [`time_on_threads`]); criterion's throughput is set to the thread count, so its
//! "elements per second" is the aggregate decisions per second.
//!
//! This machine is shared, so each benchmark also records how much of its threads' time they
//! spent on a core (see [`OnCpuShare`]): near 100% with threads no more than the cores, and
//! lower when a neighbour's load made them take turns, which the report shows beside the figure.
//!
//! Ids: `contended_{allow,deny}/{method}/{implementation}/{threads}` (see [`ids`]).

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use tollgate::{Algorithm, MonotonicClock};

use crate::ids::{self, CONTENDED_THREADS, GOVERNOR};
use crate::peers::{self, GovernorDirect};
use crate::workload::{self, TryAcquireOne, VisitLimiter, Workload, prepare, visit_limiters};

/// Shorter than the single-thread measurements: there are seven times as many of these, and
/// a sample of many thousand decisions per thread is already long against scheduling noise.
const MEASUREMENT_TIME: Duration = Duration::from_secs(2);

/// Runs every contended benchmark, and returns each one's share of time on a core, by id.
pub(crate) fn bench(c: &mut Criterion) -> Vec<(String, f64)> {
    let clock = MonotonicClock::new();
    let mut on_cpu_shares = Vec::new();
    for workload in Workload::ALL {
        for algorithm in Algorithm::ALL {
            let mut group = c.benchmark_group(ids::contended_group(workload, algorithm));
            group.measurement_time(MEASUREMENT_TIME);
            let mut timer = TimeSharedByThreads {
                group: &mut group,
                workload,
                algorithm,
                on_cpu_shares: &mut on_cpu_shares,
            };
            visit_limiters(algorithm, workload, &clock, &mut timer);
            if algorithm == Algorithm::TokenBucket {
                let rule = workload::rule(algorithm, workload);
                let governor = GovernorDirect::direct(peers::quota(rule));
                prepare(workload, &governor);
                timer.visit(GOVERNOR, &governor);
            }
            group.finish();
        }
    }
    on_cpu_shares
}

/// Times each limiter it is shown at every thread count.
struct TimeSharedByThreads<'a, 'c> {
    group: &'a mut BenchmarkGroup<'c, WallTime>,
    workload: Workload,
    algorithm: Algorithm,
    on_cpu_shares: &'a mut Vec<(String, f64)>,
}

impl VisitLimiter for TimeSharedByThreads<'_, '_> {
    fn visit<L: TryAcquireOne>(&mut self, implementation: &str, limiter: &L) {
        for threads in CONTENDED_THREADS {
            let mut share = OnCpuShare::default();
            // One iteration is one decision on each thread.
            self.group.throughput(Throughput::Elements(threads as u64));
            self.group.bench_with_input(
                BenchmarkId::new(implementation, threads),
                &threads,
                |b, &threads| {
                    b.iter_custom(|iterations| {
                        time_on_threads(limiter, threads, iterations, &mut share)
                    })
                },
            );
            if let Some(share) = share.value() {
                let id = ids::contended(self.workload, self.algorithm, implementation, threads);
                self.on_cpu_shares.push((id, share));
            }
        }
    }
}

/// How much of its threads' time a benchmark spent on a core: their CPU time over the span
/// each sample was timed for, times the thread count, summed over the samples. 1.0 is every
/// thread on a core all the time (a little less in practice: a thread that finishes before the
/// slowest one leaves the core early).
#[derive(Debug, Default)]
pub(crate) struct OnCpuShare {
    /// CPU time of the benchmark threads while timed.
    cpu_nanos: u128,
    /// The timed spans times the thread count.
    thread_nanos: u128,
    /// Set once a thread's CPU time could not be read.
    unreadable: bool,
}

impl OnCpuShare {
    fn value(&self) -> Option<f64> {
        (!self.unreadable && self.thread_nanos > 0)
            .then(|| self.cpu_nanos as f64 / self.thread_nanos as f64)
    }
}

/// The time the calling thread has run on a core, in nanoseconds: the scheduler's own count
/// (`se.sum_exec_runtime`, in milliseconds to six places, in `/proc/thread-self/sched`).
/// `None` where the kernel does not publish it.
fn thread_cpu_nanos() -> Option<u64> {
    // The count is brought up to date when the thread passes through the scheduler; without
    // this, it lags by up to a timer tick, a tenth of a short sample.
    std::thread::yield_now();
    let sched = std::fs::read_to_string("/proc/thread-self/sched").ok()?;
    let millis: f64 = sched
        .lines()
        .find(|line| line.starts_with("se.sum_exec_runtime"))?
        .rsplit(':')
        .next()?
        .trim()
        .parse()
        .ok()?;
    Some((millis * 1e6) as u64)
}

/// Runs `iterations` attempts on each of `threads` threads sharing `limiter`, all released at
/// once by a barrier, and returns the slowest thread's time: the span in which all
/// `threads * iterations` decisions were made. Spawning, and reading each thread's CPU time into
/// `share`, are outside the timed span.
fn time_on_threads<L: TryAcquireOne>(
    limiter: &L,
    threads: usize,
    iterations: u64,
    share: &mut OnCpuShare,
) -> Duration {
    time_work_on_threads(threads, iterations, share, |_| {
        || {
            black_box(limiter.try_acquire_one());
        }
    })
}

/// Runs `iterations` rounds of the work `make_work(thread)` returns on each of `threads`
/// threads, made in the thread and started together; the slowest thread's time, with the
/// threads' time on a core added to `share`.
pub(crate) fn time_work_on_threads<W: FnMut()>(
    threads: usize,
    iterations: u64,
    share: &mut OnCpuShare,
    make_work: impl Fn(usize) -> W + Sync,
) -> Duration {
    let start_line = Barrier::new(threads);
    let timed: Vec<(Duration, Option<u64>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                let (start_line, make_work) = (&start_line, &make_work);
                scope.spawn(move || {
                    let mut work = make_work(thread);
                    start_line.wait();
                    let cpu_before = thread_cpu_nanos();
                    let start = Instant::now();
                    for _ in 0..iterations {
                        work();
                    }
                    let elapsed = start.elapsed();
                    let cpu = thread_cpu_nanos()
                        .zip(cpu_before)
                        .map(|(after, before)| after.saturating_sub(before));
                    (elapsed, cpu)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.join().expect("a benchmark thread panicked"))
            .collect()
    });
    let slowest = timed
        .iter()
        .map(|&(elapsed, _)| elapsed)
        .max()
        .unwrap_or_default();
    for &(_, cpu) in &timed {
        match cpu {
            Some(nanos) => share.cpu_nanos += u128::from(nanos),
            None => share.unreadable = true,
        }
    }
    share.thread_nanos += slowest.as_nanos() * threads as u128;
    slowest
}
