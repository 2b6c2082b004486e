//! The service's plans: each plan's rule constants, replaceable at runtime, and its decision
//! counts.
//!
//! Requests read a plan's constants on every decision, so reads take no lock and never wait for
//! a writer: the constants sit in a [`VersionedWords`], whose every read returns one version's
//! constants whole with that version's number. Changes are rare and serialized by a mutex that
//! readers never touch.

use std::sync::Mutex;

use crossbeam_utils::CachePadded;

use crate::client_state::{ClientParams, PARAM_WORDS};
use crate::seqlock::VersionedWords;
use crate::sync::{Ordering, Word};
use crate::{Algorithm, Rule, RuleError};

/// Counts of decisions for one plan, spread over cache-line-sized shards so that threads do not
/// write one shared line on every decision.
#[derive(Debug)]
struct DecisionCounts {
    shards: Box<[CachePadded<[Word; 2]>]>,
}

const ALLOWED: usize = 0;
const DENIED: usize = 1;

impl DecisionCounts {
    fn new(shards: usize) -> Self {
        DecisionCounts {
            shards: (0..shards)
                .map(|_| CachePadded::new([Word::new(0), Word::new(0)]))
                .collect(),
        }
    }

    #[inline]
    fn record(&self, allowed: bool) {
        let shard = &self.shards[thread_shard() & (self.shards.len() - 1)];
        // Relaxed: a statistic; nothing is ordered by it.
        shard[if allowed { ALLOWED } else { DENIED }].fetch_add(1, Ordering::Relaxed);
    }

    fn totals(&self) -> (u64, u64) {
        self.shards.iter().fold((0, 0), |(allowed, denied), shard| {
            // Relaxed: a statistic; a sum that is slightly stale is fine.
            (
                allowed + shard[ALLOWED].load(Ordering::Relaxed),
                denied + shard[DENIED].load(Ordering::Relaxed),
            )
        })
    }
}

/// This thread's shard number, handed out once per thread in turn.
#[inline]
fn thread_shard() -> usize {
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

/// One plan: its name, its constants, its counts.
#[derive(Debug)]
struct PlanEntry<P> {
    plan: P,
    params: VersionedWords<Word, PARAM_WORDS>,
    counts: DecisionCounts,
}

/// The plans of one service.
#[derive(Debug)]
pub(crate) struct PlanTable<P> {
    algorithm: Algorithm,
    /// The clock reading the service started at: every rule's timeline starts there (see
    /// `ClientParams::new`).
    start_nanos: u64,
    plans: Box<[PlanEntry<P>]>,
    /// Serializes rule changes; never taken on a decision.
    change: Mutex<()>,
}

/// The most plans a service may have: a client's key in the map carries its plan's index in 16
/// bits.
pub(crate) const MAX_PLANS: usize = 1 << 16;

impl<P: Eq> PlanTable<P> {
    /// A table of `plans`, each already checked against `algorithm` with timelines starting at
    /// `start_nanos`. At most [`MAX_PLANS`].
    pub(crate) fn new(
        algorithm: Algorithm,
        start_nanos: u64,
        plans: Vec<(P, ClientParams)>,
    ) -> Self {
        let shards = std::thread::available_parallelism()
            .map_or(4, |cores| cores.get())
            .saturating_mul(2)
            .next_power_of_two();
        PlanTable {
            algorithm,
            start_nanos,
            plans: plans
                .into_iter()
                .map(|(plan, params)| PlanEntry {
                    plan,
                    params: VersionedWords::new(params.to_words()),
                    counts: DecisionCounts::new(shards),
                })
                .collect(),
            change: Mutex::new(()),
        }
    }

    /// The method every plan's constants are for.
    pub(crate) fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The index of `plan`, if the table has it. A linear search: services have few plans, and
    /// comparing a handful of small values beats hashing one.
    #[inline]
    pub(crate) fn index_of(&self, plan: &P) -> Option<usize> {
        self.plans.iter().position(|entry| entry.plan == *plan)
    }

    /// The plans, in the order they were given.
    pub(crate) fn plans(&self) -> impl Iterator<Item = &P> {
        self.plans.iter().map(|entry| &entry.plan)
    }

    /// The current constants of the plan at `index`, and their version (which changes with
    /// every rule change): always the constants of exactly that version.
    #[inline]
    pub(crate) fn read(&self, index: usize) -> (u64, ClientParams) {
        let entry = &self.plans[index];
        loop {
            let (version, words) = entry.params.read();
            // Always decodes: every version was written from valid constants of this method.
            if let Some(params) = ClientParams::from_words(self.algorithm, words) {
                return (version, params);
            }
        }
    }

    /// The constants `rule` would have in this table, or why the method cannot honour it.
    pub(crate) fn params_for(&self, rule: Rule) -> Result<ClientParams, RuleError> {
        ClientParams::new(self.algorithm, rule, self.start_nanos)
    }

    /// Replaces the rule of the plan at `index`. Clients under the plan follow the new rule from
    /// their next request.
    pub(crate) fn set_rule(&self, index: usize, rule: Rule) -> Result<(), RuleError> {
        let params = self.params_for(rule)?;
        let _writer = self
            .change
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.plans[index].params.write(params.to_words());
        Ok(())
    }

    /// Counts one decision for the plan at `index`.
    #[inline]
    pub(crate) fn record(&self, index: usize, allowed: bool) {
        self.plans[index].counts.record(allowed);
    }

    /// The decision counts of the plan at `index`.
    pub(crate) fn stats(&self, index: usize) -> PlanStats {
        let (allowed, denied) = self.plans[index].counts.totals();
        PlanStats { allowed, denied }
    }
}
