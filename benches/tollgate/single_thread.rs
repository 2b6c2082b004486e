//! One limiter, one thread: the cost of one decision on the allow path and on the deny path, for
//! each method against the mutex reference of the same method, with governor beside the token
//! bucket (the same algorithm). Also the clocks alone, since a clock read is most of a decision.
//!
//! Ids: `single_thread_{allow,deny}/{method}/{implementation}`, `clock/{clock}` (see [`ids`]).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use governor::clock::Clock as _;
use tollgate::{Algorithm, Clock, CoarseClock, Limiter, MonotonicClock, TokenBucket};

use crate::ids::{self, GOVERNOR, TOLLGATE_COARSE, TOLLGATE_DECISION};
use crate::peers::{self, GovernorDirect};
use crate::workload::{self, TryAcquireOne, VisitLimiter, Workload, prepare, visit_limiters};

/// The coarse clock's refresh interval: the one the targets are stated for.
const COARSE_INTERVAL: Duration = Duration::from_millis(1);

pub(crate) fn bench(c: &mut Criterion) {
    let clock = MonotonicClock::new();
    // One coarse clock (one refreshing thread) serves every measurement; should its thread not
    // start, the coarse rows are left out rather than failing the run.
    let coarse = match CoarseClock::start(COARSE_INTERVAL) {
        Ok(coarse) => Some(coarse),
        Err(error) => {
            eprintln!("coarse clock measurements skipped: {error}");
            None
        }
    };
    bench_clocks(c, &clock, coarse.as_ref());

    for workload in Workload::ALL {
        for algorithm in Algorithm::ALL {
            let mut group = c.benchmark_group(ids::single_thread_group(workload, algorithm));
            group.throughput(Throughput::Elements(1));
            let mut timer = TimeOneThread { group: &mut group };
            visit_limiters(algorithm, workload, &clock, &mut timer);
            if algorithm == Algorithm::TokenBucket {
                bench_token_bucket_peers(&mut timer, workload, &clock, coarse.as_ref());
            }
            group.finish();
        }
    }
}

/// The token bucket's extra rows: governor (the same algorithm), the coarse clock, and the full
/// `Decision` (what a proxy needs for its response headers) instead of a bare yes or no.
fn bench_token_bucket_peers(
    timer: &mut TimeOneThread<'_, '_>,
    workload: Workload,
    clock: &MonotonicClock,
    coarse: Option<&CoarseClock>,
) {
    let rule = workload::rule(Algorithm::TokenBucket, workload);

    let governor = GovernorDirect::direct(peers::quota(rule));
    prepare(workload, &governor);
    timer.visit(GOVERNOR, &governor);

    if let Some(coarse) = coarse {
        let bucket = TokenBucket::new(rule, coarse.clone()).expect("valid rule");
        prepare(workload, &bucket);
        timer.visit(TOLLGATE_COARSE, &bucket);
    }

    let bucket = TokenBucket::new(rule, clock.clone()).expect("valid rule");
    prepare(workload, &bucket);
    timer
        .group
        .bench_function(TOLLGATE_DECISION, |b| b.iter(|| bucket.try_acquire_n(1)));
}

/// Times each limiter it is shown, one attempt per iteration.
struct TimeOneThread<'g, 'c> {
    group: &'g mut BenchmarkGroup<'c, WallTime>,
}

impl VisitLimiter for TimeOneThread<'_, '_> {
    fn visit<L: TryAcquireOne>(&mut self, implementation: &str, limiter: &L) {
        self.group
            .bench_function(implementation, |b| b.iter(|| limiter.try_acquire_one()));
    }
}

/// One reading of each clock: the floor under every decision that reads it.
fn bench_clocks(c: &mut Criterion, clock: &MonotonicClock, coarse: Option<&CoarseClock>) {
    let mut group = c.benchmark_group(ids::CLOCK_GROUP);
    group.bench_function(ids::CLOCK_MONOTONIC, |b| b.iter(|| clock.now_nanos()));
    if let Some(coarse) = coarse {
        group.bench_function(ids::CLOCK_COARSE, |b| b.iter(|| coarse.now_nanos()));
    }
    let governor_clock = governor::clock::QuantaClock::default();
    group.bench_function(ids::CLOCK_GOVERNOR, |b| b.iter(|| governor_clock.now()));
    group.bench_function(ids::CLOCK_STD_INSTANT, |b| {
        b.iter(|| black_box(Instant::now()))
    });
    group.finish();
}
