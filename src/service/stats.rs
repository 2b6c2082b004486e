//! Decision counts per plan, for [`RateLimiterService::stats`](crate::RateLimiterService::stats).

use crossbeam_utils::CachePadded;

use crate::sync::{Ordering, Word};

/// Counts of decisions for one plan, spread over cache-line-sized shards so that threads do not
/// write one shared line on every decision.
#[derive(Debug)]
pub(super) struct DecisionCounts {
    shards: Box<[CachePadded<[Word; 2]>]>,
}

const ALLOWED: usize = 0;
const DENIED: usize = 1;

impl DecisionCounts {
    pub(super) fn new(shards: usize) -> Self {
        DecisionCounts {
            shards: (0..shards)
                .map(|_| CachePadded::new([Word::new(0), Word::new(0)]))
                .collect(),
        }
    }

    #[inline]
    pub(super) fn record(&self, allowed: bool) {
        let shard = &self.shards[thread_shard() & (self.shards.len() - 1)];
        // Relaxed: a statistic; nothing is ordered by it.
        shard[if allowed { ALLOWED } else { DENIED }].fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn totals(&self) -> (u64, u64) {
        self.shards.iter().fold((0, 0), |(allowed, denied), shard| {
            // Relaxed: a statistic; a sum that is slightly stale is fine.
            (
                allowed + shard[ALLOWED].load(Ordering::Relaxed),
                denied + shard[DENIED].load(Ordering::Relaxed),
            )
        })
    }
}

/// This thread's shard number, handed out once per thread in turn (callers reduce it to their
/// own shard count).
#[inline]
pub(crate) fn thread_shard() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    SHARD.with(|shard| {
        if shard.get() == usize::MAX {
            // Relaxed: only uniqueness matters, which the RMW gives.
            shard.set(NEXT.fetch_add(1, Ordering::Relaxed) & (usize::MAX >> 1));
        }
        shard.get()
    })
}

/// A snapshot of one plan's decision counts since the service started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PlanStats {
    /// Decisions that granted the permits asked for.
    pub allowed: u64,
    /// Decisions that did not (denied for now, or rejected for good).
    pub denied: u64,
}
