//! The service's plans: each plan's rule constants, replaceable at runtime, and its decision
//! counts.
//!
//! Requests read a plan's constants on every decision, so reads take no lock and never wait for
//! a writer: the constants sit in a [`VersionedWords`], whose every read returns one version's
//! constants whole with that version's number. Changes are rare and serialized by a mutex that
//! readers never touch.

use std::sync::Mutex;

use super::client_state::{ClientParams, PARAM_WORDS, Version};
use super::seqlock::VersionedWords;
use super::stats::{DecisionCounts, PlanStats};
use crate::sync::Word;
use crate::{Algorithm, Rule, RuleError};

/// The most limits one plan may have, enforced together (see `RateLimiterService`).
pub(crate) const MAX_LIMITS: usize = 4;

/// The words of a plan's first limit, and how many limits the plan has.
const FIRST_WORDS: usize = PARAM_WORDS + 1;
/// The words of a plan's other limits.
const OTHER_WORDS: usize = (MAX_LIMITS - 1) * PARAM_WORDS;

/// One plan: its name, its constants, its counts.
///
/// The first limit's constants and the plan's limit count sit in `first`, read on every
/// decision; the other limits' in `others`, read only for plans that have them. Each change
/// writes `others` and then `first`, so both reach the same version, and a reader of a plan with
/// several limits accepts the two reads only when their versions agree.
#[derive(Debug)]
struct PlanEntry<P> {
    plan: P,
    first: VersionedWords<Word, FIRST_WORDS>,
    others: VersionedWords<Word, OTHER_WORDS>,
    /// `None` unless the service was built to count decisions.
    counts: Option<DecisionCounts>,
}

/// A plan's limits at one version, as constants of the service's method.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlanLimits {
    count: usize,
    limits: [ClientParams; MAX_LIMITS],
}

impl PlanLimits {
    /// The limits, in the order they were given.
    #[inline]
    pub(crate) fn as_slice(&self) -> &[ClientParams] {
        &self.limits[..self.count]
    }
}

/// The words a plan's limits are stored as.
fn to_words(limits: &[ClientParams]) -> ([u64; FIRST_WORDS], [u64; OTHER_WORDS]) {
    let mut first = [0; FIRST_WORDS];
    first[..PARAM_WORDS].copy_from_slice(&limits[0].to_words());
    first[PARAM_WORDS] = limits.len() as u64;
    let mut others = [0; OTHER_WORDS];
    for (chunk, limit) in others.chunks_exact_mut(PARAM_WORDS).zip(&limits[1..]) {
        chunk.copy_from_slice(&limit.to_words());
    }
    (first, others)
}

/// A plan's limits have changed `Version::MAX` times, as many versions as a client's state can
/// tell apart.
#[derive(Debug)]
pub(crate) struct TooManyChanges;

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
        plans: Vec<(P, Vec<ClientParams>)>,
        count_decisions: bool,
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
                .map(|(plan, limits)| {
                    let (first, others) = to_words(&limits);
                    PlanEntry {
                        plan,
                        first: VersionedWords::new(first),
                        others: VersionedWords::new(others),
                        counts: count_decisions.then(|| DecisionCounts::new(shards)),
                    }
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

    /// The current version of the plan at `index`, its first limit's constants, and how many
    /// limits it has: always of exactly that version. The whole of a single-limit plan.
    #[inline]
    pub(crate) fn read(&self, index: usize) -> (Version, ClientParams, usize) {
        let entry = &self.plans[index];
        loop {
            let (version, words) = entry.first.read();
            let mut limit = [0; PARAM_WORDS];
            limit.copy_from_slice(&words[..PARAM_WORDS]);
            // Always decodes: every version was written from valid constants of this method.
            if let Some(params) = ClientParams::from_words(self.algorithm, limit) {
                // Never truncates: `set_limits` stops at `Version::MAX`.
                return (version as Version, params, words[PARAM_WORDS] as usize);
            }
        }
    }

    /// Every limit of the plan at `index`, and their version.
    pub(crate) fn read_all(&self, index: usize) -> (Version, PlanLimits) {
        let entry = &self.plans[index];
        loop {
            let (version, first, count) = self.read(index);
            let mut limits = [first; MAX_LIMITS];
            let count = count.clamp(1, MAX_LIMITS);
            if count > 1 {
                let (others_version, words) = entry.others.read();
                if others_version != u64::from(version) {
                    // A change is under way (it writes `others` first): read both again.
                    continue;
                }
                let decoded = words
                    .chunks_exact(PARAM_WORDS)
                    .zip(&mut limits[1..count])
                    .all(|(chunk, limit)| {
                        let mut words = [0; PARAM_WORDS];
                        words.copy_from_slice(chunk);
                        ClientParams::from_words(self.algorithm, words)
                            .map(|params| *limit = params)
                            .is_some()
                    });
                if !decoded {
                    continue;
                }
            }
            return (version, PlanLimits { count, limits });
        }
    }

    /// The constants `rule` would have in this table, or why the method cannot honour it.
    pub(crate) fn params_for(&self, rule: Rule) -> Result<ClientParams, RuleError> {
        ClientParams::new(self.algorithm, rule, self.start_nanos)
    }

    /// Replaces the limits of the plan at `index` (1 to [`MAX_LIMITS`] of them, already checked
    /// by [`PlanTable::params_for`]), as a new version; clients under the plan follow them from
    /// their next request. Limits equal to the plan's current ones are no change: no new version,
    /// and `Ok(false)`.
    ///
    /// # Errors
    ///
    /// [`TooManyChanges`] when the plan is at `Version::MAX` already.
    pub(crate) fn set_limits(
        &self,
        index: usize,
        limits: &[ClientParams],
    ) -> Result<bool, TooManyChanges> {
        let (first, others) = to_words(limits);
        let entry = &self.plans[index];
        let _writer = self
            .change
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // No writer can run meanwhile, so these reads return the current version at once.
        let (version, current_first) = entry.first.read();
        if current_first == first && entry.others.read().1 == others {
            return Ok(false);
        }
        if version >= u64::from(Version::MAX) {
            return Err(TooManyChanges);
        }
        // `others` first: a reader that sees the new first version then finds `others` at it.
        entry.others.write(others);
        entry.first.write(first);
        Ok(true)
    }

    /// Counts one decision for the plan at `index`.
    #[inline]
    pub(crate) fn record(&self, index: usize, allowed: bool) {
        if let Some(counts) = &self.plans[index].counts {
            counts.record(allowed);
        }
    }

    /// The decision counts of the plan at `index`, if the table counts them.
    pub(crate) fn stats(&self, index: usize) -> Option<PlanStats> {
        let (allowed, denied) = self.plans[index].counts.as_ref()?.totals();
        Some(PlanStats { allowed, denied })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ServiceError;

    #[test]
    fn a_plan_changes_at_most_version_max_times_and_an_unchanged_setting_is_no_change() {
        let rule = |limit| Rule::per_second(limit).unwrap();
        let params = |limit| ClientParams::new(Algorithm::TokenBucket, rule(limit), 0).unwrap();
        let mut table = PlanTable::new(
            Algorithm::TokenBucket,
            0,
            vec![("free", vec![params(5)])],
            false,
        );
        // As if the plan had been changed `Version::MAX - 1` times.
        let (first, others) = to_words(&[params(5)]);
        let last_but_one = u64::from(Version::MAX) - 1;
        table.plans[0].first = VersionedWords::at_version(last_but_one, first);
        table.plans[0].others = VersionedWords::at_version(last_but_one, others);
        assert_eq!(table.read(0).0, Version::MAX - 1);

        assert!(matches!(table.set_limits(0, &[params(5)]), Ok(false)));
        assert!(matches!(table.set_limits(0, &[params(6)]), Ok(true)));
        assert_eq!(table.read(0).0, Version::MAX);
        assert_eq!(table.read(0).1.rule(), rule(6));
        // One more would wrap, and an old client's state would pass for a current one.
        assert!(table.set_limits(0, &[params(7)]).is_err());
        assert_eq!(
            table.read(0).1.rule(),
            rule(6),
            "the refused change left no trace"
        );
        // Setting what it has is still no change, and no error.
        assert!(matches!(table.set_limits(0, &[params(6)]), Ok(false)));

        let error = ServiceError::TooManyRuleChanges {
            plan: "\"free\"".to_owned(),
            max: u64::from(Version::MAX),
        };
        assert!(error.to_string().contains("plan \"free\""), "{error}");
        assert!(error.to_string().contains("4294967295"), "{error}");
    }
}
