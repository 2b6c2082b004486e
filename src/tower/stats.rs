//! The layer's counts ([`RateLimitStats`]) and shadow-mode sampling ([`Shadow`]).
//!
//! Counting costs each request one uncontended atomic add per count on a per-thread shard, so no
//! cache line is written by every core. Sampling is deterministic: of every million requests
//! exactly the configured number are checked, spread evenly, which makes shadow runs repeatable
//! and testable.

use crossbeam_utils::CachePadded;

use crate::service::stats::thread_shard;
use crate::sync::{Ordering, Word};

/// Counts of what the layer did since it was made. Like Envoy's local rate limit statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RateLimitStats {
    /// Requests the layer saw.
    pub requests: u64,
    /// Requests checked against their limit (all of them, unless shadow mode samples).
    pub checked: u64,
    /// Checked requests within their limit.
    pub allowed: u64,
    /// Checked requests over their limit, enforced or not.
    pub limited: u64,
    /// Limited requests refused (the rest were let through, marked for the upstream).
    pub enforced: u64,
    /// Requests without a client key.
    pub unkeyed: u64,
    /// Requests whose check failed (an unknown plan; a backend that could not answer).
    pub errors: u64,
}

/// Which count a request lands in: exactly one each.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Count {
    /// Not checked (shadow mode's sample left it out).
    Unchecked = 0,
    Allowed,
    /// Over the limit and let through (shadow mode).
    Shadowed,
    /// Over the limit and refused.
    Enforced,
    Unkeyed,
    Errors,
}

const COUNTS: usize = 6;
/// Shards: a power of two, enough that the threads of a busy server rarely share one.
const SHARDS: usize = 16;

/// Per-thread sharded counters.
#[derive(Debug)]
pub(crate) struct Counters {
    shards: Box<[CachePadded<[Word; COUNTS]>]>,
}

impl Counters {
    pub(crate) fn new() -> Self {
        Counters {
            shards: (0..SHARDS)
                .map(|_| CachePadded::new(std::array::from_fn(|_| Word::new(0))))
                .collect(),
        }
    }

    #[inline]
    pub(crate) fn add(&self, count: Count) {
        let shard = &self.shards[thread_shard() % SHARDS];
        // Relaxed: a statistic; nothing is ordered by it.
        shard[count as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn totals(&self) -> RateLimitStats {
        let mut totals = [0u64; COUNTS];
        for shard in self.shards.iter() {
            for (total, word) in totals.iter_mut().zip(shard.iter()) {
                // Relaxed: a statistic; a sum that is slightly stale is fine.
                *total += word.load(Ordering::Relaxed);
            }
        }
        let [unchecked, allowed, shadowed, enforced, unkeyed, errors] = totals;
        let checked = allowed + shadowed + enforced + unkeyed + errors;
        RateLimitStats {
            requests: unchecked + checked,
            checked,
            allowed,
            limited: shadowed + enforced,
            enforced,
            unkeyed,
            errors,
        }
    }
}

/// Parts per million: the unit of [`Shadow`]'s fractions.
const MILLION: u64 = 1_000_000;

/// Shadow mode, as Envoy's local rate limit has it: check a fraction of requests, and refuse a
/// fraction of those found over their limit; the others go through marked with a request header,
/// so the upstream (and its logs) see what a limit would have done before it is switched on.
///
/// # Examples
///
/// ```
/// use tollgate::tower::Shadow;
///
/// let observe_only = Shadow::new(1.0, 0.0); // check everything, refuse nothing
/// let canary = Shadow::new(0.1, 0.5);       // check 10%, refuse half of those over the limit
/// # let _ = (observe_only, canary);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shadow {
    checked_ppm: u64,
    enforced_ppm: u64,
}

impl Shadow {
    /// Checks `checked` of all requests and refuses `enforced` of those over their limit (each a
    /// fraction from 0 to 1; values outside are clamped, NaN is 0).
    pub fn new(checked: f64, enforced: f64) -> Self {
        Shadow {
            checked_ppm: ppm(checked),
            enforced_ppm: ppm(enforced),
        }
    }

    /// Every request checked and every limited one refused: no shadow at all.
    pub(crate) const OFF: Shadow = Shadow {
        checked_ppm: MILLION,
        enforced_ppm: MILLION,
    };
}

fn ppm(fraction: f64) -> u64 {
    if fraction.is_nan() {
        return 0;
    }
    // In range after the clamp, so the cast neither saturates nor wraps.
    (fraction.clamp(0.0, 1.0) * MILLION as f64).round() as u64
}

/// Deterministic samplers for one layer's shadow mode.
#[derive(Debug)]
pub(crate) struct Sampler {
    shadow: Shadow,
    checked_seen: CachePadded<Word>,
    enforced_seen: CachePadded<Word>,
}

impl Sampler {
    pub(crate) fn new(shadow: Shadow) -> Self {
        Sampler {
            shadow,
            checked_seen: CachePadded::new(Word::new(0)),
            enforced_seen: CachePadded::new(Word::new(0)),
        }
    }

    /// Whether the next request is checked.
    #[inline]
    pub(crate) fn check_next(&self) -> bool {
        sample(&self.checked_seen, self.shadow.checked_ppm)
    }

    /// Whether the next limited request is refused.
    #[inline]
    pub(crate) fn enforce_next(&self) -> bool {
        sample(&self.enforced_seen, self.shadow.enforced_ppm)
    }
}

/// Whether the next event is in the sample of `ppm` per million: the n-th event is in when
/// `floor((n+1)·ppm/10⁶)` passes `floor(n·ppm/10⁶)`, so any run of a million holds exactly `ppm`.
#[inline]
fn sample(seen: &Word, ppm: u64) -> bool {
    match ppm {
        0 => false,
        // All or nothing: no shared counter written on the common path.
        MILLION => true,
        _ => {
            // Relaxed: only the count matters, which the RMW keeps exact.
            let n = u128::from(seen.fetch_add(1, Ordering::Relaxed));
            let ppm = u128::from(ppm);
            let million = u128::from(MILLION);
            (n + 1) * ppm / million > n * ppm / million
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_takes_exactly_the_fraction_spread_evenly() {
        let sampler = Sampler::new(Shadow::new(0.25, 0.0));
        let picks: Vec<bool> = (0..8).map(|_| sampler.check_next()).collect();
        assert_eq!(
            picks,
            [false, false, false, true, false, false, false, true]
        );
        let taken = (0..1_000_000).filter(|_| sampler.check_next()).count();
        assert_eq!(taken, 250_000);
        assert!(!sampler.enforce_next());
    }

    #[test]
    fn fractions_are_clamped() {
        assert_eq!(Shadow::new(2.0, -1.0), Shadow::new(1.0, 0.0));
        assert_eq!(Shadow::new(f64::NAN, 1.0), Shadow::new(0.0, 1.0));
        assert_eq!(Shadow::new(1.0, 1.0), Shadow::OFF);
    }

    #[test]
    fn counts_add_up_across_threads() {
        let counters = Counters::new();
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..1000 {
                        counters.add(Count::Unchecked);
                        counters.add(Count::Shadowed);
                    }
                });
            }
        });
        let totals = counters.totals();
        assert_eq!(totals.requests, 8000);
        assert_eq!(totals.checked, 4000);
        assert_eq!(totals.limited, 4000);
        assert_eq!((totals.allowed, totals.enforced), (0, 0));
    }
}
