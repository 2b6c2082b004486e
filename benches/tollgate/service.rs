//! The per-client service: tollgate's [`RateLimiterService`] (token bucket, `u64` client keys)
//! against governor's keyed limiter (a `DashMap` of GCRA words) and the seed design's
//! `Mutex<HashMap<client, reference bucket>>`, all three with a randomly seeded SipHash hasher.
//!
//! - `service_lookup/token_bucket/{implementation}/{clients}`: a request from a known client,
//!   picked at random among 10 000 or 1 000 000 pre-populated ones, so the larger map is mostly
//!   cache misses.
//! - `service_lookup_shared/token_bucket/{implementation}/{threads}`: the same lookups among
//!   10 000 clients, made by 1, 2 and 4 threads at once on one map, each thread with its own
//!   sequence of clients; aggregate requests per second (each sample spawns its threads once,
//!   releases them together and counts the slowest).
//! - `service_first_request/token_bucket/{implementation}`: a request from a client the map has
//!   never seen, which makes its limiter. Each batch of 10 000 goes into a fresh, default-sized
//!   map, so the cost includes the map's growth, and does not depend on how many iterations
//!   criterion asks for.

use std::cell::OnceCell;
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use tollgate::{Algorithm, MonotonicClock, RateLimiterService, Rule, ServiceBuilder};

use crate::contended::{OnCpuShare, time_work_on_threads};
use crate::ids::{
    FIRST_REQUEST_GROUP, GOVERNOR, LOOKUP_CLIENTS, MUTEX, SERVICE_LOOKUP_GROUP,
    SHARED_LOOKUP_CLIENTS, SHARED_LOOKUP_GROUP, SHARED_LOOKUP_THREADS, TOLLGATE,
};
use crate::peers::{self, GovernorKeyed};
use crate::reference::RefTokenBucket;
use crate::workload::{self, Workload};

/// First requests timed per fresh map (see the module docs).
const FIRST_REQUEST_BATCH: u64 = 10_000;

pub(crate) fn bench(c: &mut Criterion) {
    let rule = workload::rule(Algorithm::TokenBucket, Workload::AllowHeavy);

    let mut group = c.benchmark_group(SERVICE_LOOKUP_GROUP);
    group.throughput(Throughput::Elements(1));
    for clients in LOOKUP_CLIENTS {
        bench_lookup(&mut group, TOLLGATE, clients, || {
            TollgateService::new(Algorithm::TokenBucket, rule, clients)
        });
        bench_lookup(&mut group, GOVERNOR, clients, || {
            GovernorKeyed::keyed(peers::quota(rule))
        });
        bench_lookup(&mut group, MUTEX, clients, || MutexMap::new(rule));
    }
    group.finish();

    let mut group = c.benchmark_group(SHARED_LOOKUP_GROUP);
    for threads in SHARED_LOOKUP_THREADS {
        // One iteration is one request on each thread.
        group.throughput(Throughput::Elements(threads as u64));
        bench_shared_lookup(&mut group, TOLLGATE, threads, || {
            TollgateService::new(Algorithm::TokenBucket, rule, SHARED_LOOKUP_CLIENTS)
        });
        bench_shared_lookup(&mut group, GOVERNOR, threads, || {
            GovernorKeyed::keyed(peers::quota(rule))
        });
        bench_shared_lookup(&mut group, MUTEX, threads, || MutexMap::new(rule));
    }
    group.finish();

    let mut group = c.benchmark_group(FIRST_REQUEST_GROUP);
    group.throughput(Throughput::Elements(1));
    bench_first_request(&mut group, TOLLGATE, || {
        TollgateService::new(Algorithm::TokenBucket, rule, FIRST_REQUEST_BATCH)
    });
    bench_first_request(&mut group, GOVERNOR, || {
        GovernorKeyed::keyed(peers::quota(rule))
    });
    bench_first_request(&mut group, MUTEX, || MutexMap::new(rule));
    group.finish();
}

fn bench_lookup<M: KeyedLimiter>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    implementation: &str,
    clients: u64,
    make: impl Fn() -> M,
) {
    // Made on the first sample, not before: a filtered-out benchmark never pays for a million
    // inserts. Dropped with the closure when this benchmark is done.
    let populated = OnceCell::new();
    group.bench_function(BenchmarkId::new(implementation, clients), move |b| {
        let map = populated.get_or_init(|| populated_with(make(), clients));
        let mut picker = ClientPicker::new(clients);
        b.iter(|| map.allow(picker.next_client()));
    });
}

/// `map` after one first request from each of `clients` clients, every one admitted.
fn populated_with<M: KeyedLimiter>(map: M, clients: u64) -> M {
    let admitted = (0..clients).filter(|&client| map.allow(client)).count();
    assert_eq!(admitted as u64, clients, "every first request is admitted");
    map
}

fn bench_shared_lookup<M: KeyedLimiter>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    implementation: &str,
    threads: usize,
    make: impl Fn() -> M,
) {
    // Made on the first sample, as in `bench_lookup`.
    let populated = OnceCell::new();
    group.bench_function(BenchmarkId::new(implementation, threads), move |b| {
        let map = populated.get_or_init(|| populated_with(make(), SHARED_LOOKUP_CLIENTS));
        b.iter_custom(|iterations| {
            // The share of time on a core is not reported for these.
            let mut share = OnCpuShare::default();
            time_work_on_threads(threads, iterations, &mut share, |thread| {
                let mut picker = ClientPicker::seeded(SHARED_LOOKUP_CLIENTS, thread as u64);
                move || {
                    black_box(map.allow(picker.next_client()));
                }
            })
        });
    });
}

fn bench_first_request<M: KeyedLimiter>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    implementation: &str,
    make: impl Fn() -> M,
) {
    group.bench_function(implementation, |b| {
        b.iter_custom(|iterations| {
            let batches = iterations.div_ceil(FIRST_REQUEST_BATCH);
            let mut timed = Duration::ZERO;
            for _ in 0..batches {
                let map = make();
                let start = Instant::now();
                for client in 0..FIRST_REQUEST_BATCH {
                    black_box(map.allow(client));
                }
                timed += start.elapsed();
                // Dropping the map is not part of a first request.
                drop(map);
            }
            // Every batch is full; scale to the iterations asked for.
            timed.mul_f64(iterations as f64 / (batches * FIRST_REQUEST_BATCH) as f64)
        });
    });
}

/// A limiter keyed by client: one request from `client`, allowed or not.
pub(crate) trait KeyedLimiter: Sync {
    fn allow(&self, client: u64) -> bool;
}

/// The plan every benchmark client is on.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    Standard,
}

/// tollgate's service with one plan, on the production clock and the default hasher.
pub(crate) struct TollgateService(RateLimiterService<u64, Plan, MonotonicClock>);

impl TollgateService {
    /// A service for `clients` clients, with a capacity of four times their number. Its table
    /// is allocated up front and never grows: a new client whose 16 slots (its key's two
    /// buckets) are all taken reuses an idle client's slot or evicts one, and a lookup of a
    /// client so dropped would time an insert. A capacity of exactly the clients held 92% of
    /// 10 000, twice 99.98%, four times every one of 1 000 000 (the instruction harness checks
    /// it on the same keys).
    pub(crate) fn new(algorithm: Algorithm, rule: Rule, clients: u64) -> Self {
        Self::with_capacity(algorithm, rule, 4 * clients)
    }

    /// A service of `capacity` clients.
    pub(crate) fn with_capacity(algorithm: Algorithm, rule: Rule, capacity: u64) -> Self {
        let service = ServiceBuilder::new(algorithm, MonotonicClock::new())
            .plan(Plan::Standard, rule)
            .capacity(usize::try_from(capacity).expect("the clients fit in memory"))
            .build()
            .expect("the benchmark rules are valid for every method");
        TollgateService(service)
    }
}

impl KeyedLimiter for TollgateService {
    #[inline]
    fn allow(&self, client: u64) -> bool {
        self.0
            .allow(&client, &Plan::Standard)
            .expect("the plan has a rule")
    }
}

impl KeyedLimiter for GovernorKeyed {
    #[inline]
    fn allow(&self, client: u64) -> bool {
        self.check_key(&client).is_ok()
    }
}

/// The seed design's service: one lock around the map, and one around each client's bucket.
pub(crate) struct MutexMap {
    rule: Rule,
    clients: Mutex<HashMap<u64, RefTokenBucket<&'static MonotonicClock>>>,
}

impl MutexMap {
    pub(crate) fn new(rule: Rule) -> Self {
        MutexMap {
            rule,
            clients: Mutex::new(HashMap::new()),
        }
    }
}

impl KeyedLimiter for MutexMap {
    #[inline]
    fn allow(&self, client: u64) -> bool {
        // One clock for every bucket, as in the other two, rather than a copy per client.
        static CLOCK: OnceLock<MonotonicClock> = OnceLock::new();
        let clock = CLOCK.get_or_init(MonotonicClock::new);
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        clients
            .entry(client)
            .or_insert_with(|| RefTokenBucket::new(self.rule, clock))
            .try_acquire()
    }
}

/// Picks clients uniformly from `0..clients` with xorshift64*, a few cycles and no memory: the
/// pick must not cost more than the lookup it feeds, nor miss the cache itself.
struct ClientPicker {
    state: u64,
    clients: u64,
}

impl ClientPicker {
    fn new(clients: u64) -> Self {
        Self::seeded(clients, 0)
    }

    /// The `stream`-th of several independent sequences (one per thread).
    fn seeded(clients: u64, stream: u64) -> Self {
        // Any non-zero seed; fixed so that every implementation sees the same sequences.
        ClientPicker {
            state: 0x9E37_79B9_7F4A_7C15 ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03),
            clients,
        }
    }

    #[inline]
    fn next_client(&mut self) -> u64 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        let random = self.state.wrapping_mul(0x2545_F491_4F6C_DD1D);
        // Lemire's multiply-shift: uniform in 0..clients without a division.
        ((u128::from(random) * u128::from(self.clients)) >> 64) as u64
    }
}
