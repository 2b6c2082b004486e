//! governor, the leading Rust rate limiter (GCRA in one `AtomicU64`, the same algorithm as the
//! token bucket), set up to enforce the same rules as the limiters it is compared with.

use std::num::NonZeroU32;

use governor::Quota;
use tollgate::Rule;

use crate::workload::TryAcquireOne;

/// governor's direct (single-state) limiter on its default clock, `quanta`'s counter: the same
/// source as [`tollgate::MonotonicClock`].
pub(crate) type GovernorDirect = governor::DefaultDirectRateLimiter;

/// governor's keyed limiter: one GCRA word per key in a `DashMap` with its default hasher,
/// std's randomly seeded SipHash-1-3 (the function the service's default `SipState` computes).
pub(crate) type GovernorKeyed = governor::DefaultKeyedRateLimiter<u64>;

/// The quota that enforces `rule`: a burst of the rule's limit, refilled one permit per
/// `window / limit`. Exact for the rules measured here (1 ns and 36 s per permit).
pub(crate) fn quota(rule: Rule) -> Quota {
    let limit = u32::try_from(rule.limit()).expect("governor's burst is a u32");
    let burst = NonZeroU32::new(limit).expect("a rule's limit is never 0");
    Quota::with_period(rule.window() / limit)
        .expect("a benchmark rule refills at most one permit per nanosecond")
        .allow_burst(burst)
}

impl TryAcquireOne for GovernorDirect {
    #[inline]
    fn try_acquire_one(&self) -> bool {
        self.check().is_ok()
    }
}
