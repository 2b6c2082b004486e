//! The suite's benchmark ids, made in one place: the suite measures under them, and the report
//! (`cargo xtask report criterion`, which includes this file by path) reads them, so neither
//! spells one out.
//!
//! An id is criterion's `full_id`:
//!
//! - `clock/{clock}`
//! - `single_thread_{workload}/{method}/{implementation}`
//! - `contended_{workload}/{method}/{implementation}/{threads}`
//! - `service_lookup/token_bucket/{implementation}/{clients}`
//! - `service_lookup_shared/token_bucket/{implementation}/{threads}`
//! - `service_first_request/token_bucket/{implementation}`
//!
//! `{method}` is [`Algorithm::name`]; the methods measured are [`Algorithm::ALL`].

use tollgate::Algorithm;

/// tollgate's limiters, as the user builds them.
pub(crate) const TOLLGATE: &str = "tollgate";
/// The seed design's limiter of the same method behind a `std::sync::Mutex`.
pub(crate) const MUTEX: &str = "mutex";
/// governor's limiter (the token bucket's algorithm only).
pub(crate) const GOVERNOR: &str = "governor";
/// tollgate's token bucket reading `CoarseClock`.
pub(crate) const TOLLGATE_COARSE: &str = "tollgate_coarse";
/// tollgate's token bucket answering a whole `Decision` (`try_acquire_n(1)`).
pub(crate) const TOLLGATE_DECISION: &str = "tollgate_decision";

/// The clocks read alone: tollgate's `MonotonicClock` and `CoarseClock`, governor's
/// `QuantaClock`, and `std::time::Instant::now`.
pub(crate) const CLOCK_MONOTONIC: &str = "tollgate_monotonic";
pub(crate) const CLOCK_COARSE: &str = "tollgate_coarse";
pub(crate) const CLOCK_GOVERNOR: &str = "governor_quanta";
pub(crate) const CLOCK_STD_INSTANT: &str = "std_instant";

/// Threads sharing one limiter in the contended benchmarks.
pub(crate) const CONTENDED_THREADS: [usize; 3] = [1, 2, 4];
/// Clients in the map of the lookup benchmarks.
pub(crate) const LOOKUP_CLIENTS: [u64; 2] = [10_000, 1_000_000];
/// Threads sharing one map in the shared lookup benchmarks.
pub(crate) const SHARED_LOOKUP_THREADS: [usize; 3] = [1, 2, 4];
/// Clients in the map the shared lookup benchmarks share.
pub(crate) const SHARED_LOOKUP_CLIENTS: u64 = 10_000;

/// What most attempts in a measurement get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Workload {
    /// A rule so generous that no attempt is denied: the cost of an admission.
    AllowHeavy,
    /// A limiter exhausted for an hour: the cost of a denial.
    DenyHeavy,
}

impl Workload {
    pub(crate) const ALL: [Workload; 2] = [Workload::AllowHeavy, Workload::DenyHeavy];

    /// The word used in benchmark ids and tables.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Workload::AllowHeavy => "allow",
            Workload::DenyHeavy => "deny",
        }
    }
}

pub(crate) const CLOCK_GROUP: &str = "clock";

pub(crate) fn clock(clock: &str) -> String {
    format!("{CLOCK_GROUP}/{clock}")
}

pub(crate) fn single_thread_group(workload: Workload, method: Algorithm) -> String {
    format!("single_thread_{}/{}", workload.name(), method.name())
}

pub(crate) fn single_thread(workload: Workload, method: Algorithm, implementation: &str) -> String {
    format!("{}/{implementation}", single_thread_group(workload, method))
}

pub(crate) fn contended_group(workload: Workload, method: Algorithm) -> String {
    format!("contended_{}/{}", workload.name(), method.name())
}

pub(crate) fn contended(
    workload: Workload,
    method: Algorithm,
    implementation: &str,
    threads: usize,
) -> String {
    format!(
        "{}/{implementation}/{threads}",
        contended_group(workload, method)
    )
}

pub(crate) const SERVICE_LOOKUP_GROUP: &str = "service_lookup/token_bucket";

pub(crate) fn service_lookup(implementation: &str, clients: u64) -> String {
    format!("{SERVICE_LOOKUP_GROUP}/{implementation}/{clients}")
}

pub(crate) const SHARED_LOOKUP_GROUP: &str = "service_lookup_shared/token_bucket";

pub(crate) fn shared_lookup(implementation: &str, threads: usize) -> String {
    format!("{SHARED_LOOKUP_GROUP}/{implementation}/{threads}")
}

pub(crate) const FIRST_REQUEST_GROUP: &str = "service_first_request/token_bucket";

pub(crate) fn first_request(implementation: &str) -> String {
    format!("{FIRST_REQUEST_GROUP}/{implementation}")
}
