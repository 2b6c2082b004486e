//! The service's plans: each plan's rule constants, replaceable at runtime, and its decision
//! counts.
//!
//! Requests read a plan's constants on every decision, so reads take no lock and never wait for
//! a writer: each plan keeps two copies of its constants and a version number; a change writes the
//! copy that readers are *not* directed to, then moves the version. Each copy is guarded by a
//! sequence number, so the rare reader still on a copy that a second change is rewriting sees the
//! sequence move, and retries on the newer version. Changes are rare and serialized by a mutex that
//! readers never touch.

use std::sync::Mutex;
use std::sync::atomic::fence;

use crossbeam_utils::CachePadded;

use crate::client_state::ClientParams;
use crate::sync::{Ordering, Word};
use crate::{Algorithm, Rule, RuleError};

/// How many words a plan's constants take (see `ClientParams::to_words`).
const PARAM_WORDS: usize = 5;

/// One copy of a plan's constants, guarded by a sequence number that is odd while it is written.
#[derive(Debug)]
struct ParamsCopy {
    sequence: Word,
    words: [Word; PARAM_WORDS],
}

impl ParamsCopy {
    fn new(words: [u64; PARAM_WORDS]) -> Self {
        ParamsCopy {
            sequence: Word::new(0),
            words: words.map(Word::new),
        }
    }
}

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
    /// The version of the plan's constants; they live in `copies[version % 2]`.
    version: Word,
    copies: [ParamsCopy; 2],
    counts: DecisionCounts,
}

/// The plans of one service.
#[derive(Debug)]
pub(crate) struct PlanTable<P> {
    algorithm: Algorithm,
    plans: Box<[PlanEntry<P>]>,
    /// Serializes rule changes; never taken on a decision.
    change: Mutex<()>,
}

/// The most plans a service may have: a client's key in the map carries its plan's index in 16
/// bits.
pub(crate) const MAX_PLANS: usize = 1 << 16;

impl<P: Eq> PlanTable<P> {
    /// A table of `plans`, each already checked against `algorithm`. At most [`MAX_PLANS`].
    pub(crate) fn new(algorithm: Algorithm, plans: Vec<(P, ClientParams)>) -> Self {
        let shards = std::thread::available_parallelism()
            .map_or(4, |cores| cores.get())
            .saturating_mul(2)
            .next_power_of_two();
        PlanTable {
            algorithm,
            plans: plans
                .into_iter()
                .map(|(plan, params)| PlanEntry {
                    plan,
                    version: Word::new(0),
                    copies: [
                        ParamsCopy::new(params.to_words()),
                        ParamsCopy::new(params.to_words()),
                    ],
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
    /// every rule change).
    #[inline]
    pub(crate) fn read(&self, index: usize) -> (u64, ClientParams) {
        let entry = &self.plans[index];
        loop {
            // Acquire: pairs with the Release store of a change, so the copy it points to is
            // seen whole.
            let version = entry.version.load(Ordering::Acquire);
            let copy = &entry.copies[(version & 1) as usize];
            // Acquire: orders the word loads after it.
            let before = copy.sequence.load(Ordering::Acquire);
            if before & 1 == 1 {
                // A second change is rewriting this copy; the version has moved on.
                continue;
            }
            // Relaxed: validated by the sequence re-read below.
            let words = copy
                .words
                .each_ref()
                .map(|word| word.load(Ordering::Relaxed));
            // Acquire fence: if any word came from a later rewrite, the re-read below sees that
            // rewrite's odd sequence (it pairs with the writer's Release fence).
            fence(Ordering::Acquire);
            let after = copy.sequence.load(Ordering::Relaxed);
            if before == after
                && let Some(params) = ClientParams::from_words(self.algorithm, words)
            {
                return (version, params);
            }
        }
    }

    /// Replaces the rule of the plan at `index`. Clients under the plan follow the new rule from
    /// their next request.
    pub(crate) fn set_rule(&self, index: usize, rule: Rule) -> Result<(), RuleError> {
        let params = ClientParams::new(self.algorithm, rule)?;
        let entry = &self.plans[index];
        let _writer = self
            .change
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // Relaxed: changes are serialized by the mutex, which orders them.
        let version = entry.version.load(Ordering::Relaxed);
        let next = version.wrapping_add(1);
        let copy = &entry.copies[(next & 1) as usize];
        let sequence = copy.sequence.load(Ordering::Relaxed);
        // Relaxed store, then a Release fence: a reader that sees any of the words below also sees
        // this odd sequence (the reader's Acquire fence pairs with this one).
        copy.sequence.store(sequence + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        for (word, value) in copy.words.iter().zip(params.to_words()) {
            // Relaxed: published by the Release stores below.
            word.store(value, Ordering::Relaxed);
        }
        // Release: the words are complete before the sequence is even again...
        copy.sequence.store(sequence + 2, Ordering::Release);
        // ... and before readers are directed to this copy.
        entry.version.store(next, Ordering::Release);
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
