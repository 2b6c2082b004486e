//! The service's plans: each plan's clients, its limits (replaceable at runtime) and its
//! decision counts.
//!
//! Requests read a plan's limits on every decision, so reads take no lock and never wait for a
//! writer. Each version of a plan's limits is an immutable [`PlanVersion`], published whole
//! through one atomic pointer and copied out by the reader. A version is never freed while the
//! table lives: a change keeps the version it replaces (one `PlanVersion`, a few hundred bytes),
//! so a read needs no guard, and a plan changes at most `Version::MAX` (65,535) times. Changes
//! are rare and serialized by a mutex that readers never touch.
//!
//! Each plan's clients are kept in one of two places, by the shape of their state: a
//! [`ClientStore`] of fixed size for one-word states (one limit of the token bucket, the fixed
//! window or the sliding window counter), and a papaya map for the others (the sliding log's
//! rings, and the states of a plan of several limits), whose entries are allocated one by one.

// The one module with unsafe code: the reads and the reclamation of published versions, each
// block with why it is sound.
#![allow(unsafe_code)]

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicPtr};

use papaya::LocalGuard;

use super::protocol::ClientEntry;
use super::stats::{DecisionCounts, PlanStats};
use super::store::{ClientStore, StoreHead, StorePlan};
use crate::method::any::AnyParams;
use crate::method::client_state::Version;
use crate::method::several_limits::SeveralLimits;
use crate::sync::{Ordering, Word};
use crate::{Algorithm, Rule, RuleError};

/// One version of a plan's limits, never changed once published.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlanVersion {
    version: Version,
    count: usize,
    limits: [AnyParams; SeveralLimits::MAX_LIMITS],
}

impl PlanVersion {
    /// `limits` (1 to [`SeveralLimits::MAX_LIMITS`] of them) as version `version`.
    fn new(version: Version, limits: &[AnyParams]) -> PlanVersion {
        let mut all = [limits[0]; SeveralLimits::MAX_LIMITS];
        all[..limits.len()].copy_from_slice(limits);
        PlanVersion {
            version,
            count: limits.len(),
            limits: all,
        }
    }

    /// This version's number: 0 for the plan's first limits, one more at each change.
    #[inline]
    pub(crate) fn version(&self) -> Version {
        self.version
    }

    /// The first limit: the whole of a plan with one.
    #[inline]
    pub(crate) fn first(&self) -> &AnyParams {
        &self.limits[0]
    }

    /// Whether the plan has several limits.
    #[inline]
    pub(crate) fn has_several(&self) -> bool {
        self.count > 1
    }

    /// The limits, in the order they were given.
    #[inline]
    pub(crate) fn as_slice(&self) -> &[AnyParams] {
        &self.limits[..self.count]
    }
}

/// The part of a [`PlanVersion`] a decision reads first (see [`PinnedPlan::head`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlanHead {
    /// The version's number.
    pub(crate) version: Version,
    /// Whether the plan has several limits.
    pub(crate) several: bool,
    /// The first limit: the whole of a plan with one.
    pub(crate) first: AnyParams,
}

/// One plan: its name, its clients, its current limits, its counts.
struct PlanEntry<K, P, S> {
    plan: P,
    /// Clients whose state is not one word (see the module's docs).
    clients: papaya::HashMap<K, ClientEntry, S>,
    /// Clients whose state is one word; `None` where the service's method keeps none (the
    /// sliding log).
    store: Option<ClientStore<Word>>,
    /// The current [`PlanVersion`], a `Box` of it, owned by the table (see [`read_version`]):
    /// freed when the table is dropped; replaced ones are kept in [`PlanTable::replaced`].
    current: AtomicPtr<PlanVersion>,
    /// `None` unless the service was built to count decisions.
    counts: Option<DecisionCounts>,
    /// Whether the plan has ever had several limits (whose clients the map holds); never reset.
    had_several: AtomicBool,
}

impl<K, P, S> Drop for PlanEntry<K, P, S> {
    fn drop(&mut self) {
        let current = *self.current.get_mut();
        // SAFETY: `current` came from `Box::into_raw` (see `PlanTable::new` and
        // `PlanTable::set_limits`) and is the table's own: a replaced version is moved into
        // `PlanTable::replaced`, the current one never is. `&mut self` means that no
        // reader holds it any more.
        drop(unsafe { Box::from_raw(current) });
    }
}

/// A plan's client map with a guard of it held: what a request needs for its lookup, and the
/// plan's limits read under the same guard.
pub(crate) struct PinnedPlan<'t, K, S> {
    clients: &'t papaya::HashMap<K, ClientEntry, S>,
    guard: LocalGuard<'t>,
    current: &'t AtomicPtr<PlanVersion>,
    has_store: bool,
}

impl<'t, K, S> PinnedPlan<'t, K, S> {
    /// Whether the plan keeps its one-word clients in a store (then its map holds only the
    /// clients of several limits).
    #[inline]
    pub(crate) fn has_store(&self) -> bool {
        self.has_store
    }

    /// The plan's clients.
    #[inline]
    pub(crate) fn clients(&self) -> &'t papaya::HashMap<K, ClientEntry, S> {
        self.clients
    }

    /// The guard every call on [`PinnedPlan::clients`] is made with.
    #[inline]
    pub(crate) fn guard(&self) -> &LocalGuard<'t> {
        &self.guard
    }

    /// What a decision under the plan's current limits needs first (see [`head_of`]).
    #[inline]
    pub(crate) fn head(&self) -> PlanHead {
        head_of(self.current)
    }

    /// The plan's current limits, whole, with their version (see [`read_version`]).
    #[inline]
    pub(crate) fn limits(&self) -> PlanVersion {
        read_version(self.current)
    }
}

/// The version `current` (a plan entry's) points to, borrowed for as long as the table is.
#[inline]
fn current_version(current: &AtomicPtr<PlanVersion>) -> &PlanVersion {
    // Acquire: pairs with the Release of the swap that published the version, so its contents
    // are seen whole.
    let version = current.load(Ordering::Acquire);
    // SAFETY: `version` is never null (the table publishes only boxes), and points to a version
    // that is either the current one or one replaced since it was loaded; the table frees
    // neither while it lives (a replaced one is kept in `PlanTable::replaced`, the current one is
    // freed by the plan entry's drop), and `current` borrows the table (it is a plan entry's
    // field), so the reference cannot outlive the version. Published versions are never written
    // again.
    unsafe { &*version }
}

/// The version `current` points to, copied whole.
#[inline]
fn read_version(current: &AtomicPtr<PlanVersion>) -> PlanVersion {
    *current_version(current)
}

/// What a decision under the plan's current limits (at `current`) needs first, copied out as
/// [`read_version`] copies the whole: the version, whether the plan has several limits (then
/// read them all), and the first limit.
#[inline]
fn head_of(current: &AtomicPtr<PlanVersion>) -> PlanHead {
    let version = current_version(current);
    PlanHead {
        version: version.version,
        several: version.count > 1,
        first: version.limits[0],
    }
}

/// A plan's one-word clients ([`ClientStore`]) with its current limits, for a decision.
#[derive(Clone, Copy)]
pub(crate) struct StoredPlan<'t> {
    pub(crate) store: &'t ClientStore<Word>,
    current: &'t AtomicPtr<PlanVersion>,
}

impl<'t> StorePlan for StoredPlan<'t> {
    /// Borrowed from the version, which the table keeps: a decision copies nothing of it.
    type Limit = &'t AnyParams;

    #[inline]
    fn head(&self) -> StoreHead<&'t AnyParams> {
        let version = current_version(self.current);
        StoreHead {
            version: version.version,
            kept: version.count == 1,
            limit: &version.limits[0],
        }
    }
}

/// A plan's limits have changed `Version::MAX` times, as many versions as a client's state can
/// tell apart.
#[derive(Debug)]
pub(crate) struct TooManyChanges;

/// The plans of one service: each plan's clients and limits, found by the plan's index.
pub(crate) struct PlanTable<K, P, S> {
    algorithm: Algorithm,
    /// The clock reading the service started at: every rule's timeline starts there (see
    /// `AnyParams::new`).
    start_nanos: u64,
    plans: Box<[PlanEntry<K, P, S>]>,
    /// Every version a change replaced (each from `Box::into_raw`), kept as the pointer it was
    /// published as until the table is dropped (see the module's docs): not as a `Box`, which
    /// would claim it unique while readers still hold references to it. Its lock serializes rule
    /// changes, and is never taken on a decision.
    replaced: Mutex<Vec<AtomicPtr<PlanVersion>>>,
}

impl<K, P, S> Drop for PlanTable<K, P, S> {
    fn drop(&mut self) {
        let replaced = self
            .replaced
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for version in replaced.drain(..) {
            // SAFETY: each came from `Box::into_raw` (see `set_limits`), was put here once, when
            // it was swapped out, and is freed once, here; `&mut self` means that no reader holds
            // it any more.
            drop(unsafe { Box::from_raw(version.into_inner()) });
        }
    }
}

impl<K, P: std::fmt::Debug, S> std::fmt::Debug for PlanTable<K, P, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanTable")
            .field("algorithm", &self.algorithm)
            .field("plans", &self.plans().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl<K, P, S> PlanTable<K, P, S> {
    /// A table of `plans`, each already checked against `algorithm` with timelines starting at
    /// `start_nanos`, each with an empty client map from `new_map` and, unless the method is
    /// the sliding log, an empty store of `capacity` one-word clients. At most
    /// [`MAX_PLANS`](crate::plans::MAX_PLANS).
    pub(crate) fn new(
        algorithm: Algorithm,
        start_nanos: u64,
        plans: Vec<(P, Vec<AnyParams>)>,
        count_decisions: bool,
        capacity: usize,
        mut new_map: impl FnMut() -> papaya::HashMap<K, ClientEntry, S>,
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
                .map(|(plan, limits)| PlanEntry {
                    plan,
                    clients: new_map(),
                    store: (algorithm != Algorithm::SlidingWindowLog)
                        .then(|| ClientStore::new(capacity)),
                    current: AtomicPtr::new(Box::into_raw(Box::new(PlanVersion::new(0, &limits)))),
                    counts: count_decisions.then(|| DecisionCounts::new(shards)),
                    had_several: AtomicBool::new(limits.len() > 1),
                })
                .collect(),
            replaced: Mutex::new(Vec::new()),
        }
    }

    /// The method every plan's constants are for.
    pub(crate) fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The plans, in the order they were given.
    pub(crate) fn plans(&self) -> impl Iterator<Item = &P> {
        self.plans.iter().map(|entry| &entry.plan)
    }

    /// How many plans the table has.
    pub(crate) fn len(&self) -> usize {
        self.plans.len()
    }

    /// How many clients the table holds, over every plan (at some instant during the call, map
    /// by map and slot by slot).
    pub(crate) fn clients(&self) -> usize
    where
        K: std::hash::Hash + Eq,
        S: std::hash::BuildHasher,
    {
        self.plans
            .iter()
            .map(|entry| entry.clients.len() + entry.store.as_ref().map_or(0, ClientStore::clients))
            .sum()
    }

    /// How many one-word states inserts have evicted, over every plan.
    pub(crate) fn evictions(&self) -> u64 {
        self.plans
            .iter()
            .filter_map(|entry| entry.store.as_ref())
            .map(ClientStore::evictions)
            .sum()
    }

    /// Whether the plan at `index` has ever had several limits, as of the version last read by
    /// this thread (or a later one): if it has not, its map holds no client.
    #[inline]
    pub(crate) fn had_several(&self, index: usize) -> bool {
        // Relaxed: ordered after the caller's read of the plan's version (Acquire), which
        // `set_limits` publishes after setting the flag.
        self.plans[index].had_several.load(Ordering::Relaxed)
    }

    /// The one-word clients of the plan at `index`, with its current limits, if the method
    /// keeps any.
    #[inline]
    pub(crate) fn stored(&self, index: usize) -> Option<StoredPlan<'_>> {
        let entry = &self.plans[index];
        Some(StoredPlan {
            store: entry.store.as_ref()?,
            current: &entry.current,
        })
    }

    /// The client map of the plan at `index`, with a guard of it held, and the plan's limits
    /// readable under that guard.
    #[inline]
    pub(crate) fn pin(&self, index: usize) -> PinnedPlan<'_, K, S> {
        let entry = &self.plans[index];
        PinnedPlan {
            clients: &entry.clients,
            guard: entry.clients.guard(),
            current: &entry.current,
            has_store: entry.store.is_some(),
        }
    }

    /// The current limits of the plan at `index`.
    pub(crate) fn read(&self, index: usize) -> PlanVersion {
        read_version(&self.plans[index].current)
    }

    /// The constants `rule` would have in this table, or why the method cannot honour it.
    pub(crate) fn params_for(&self, rule: Rule) -> Result<AnyParams, RuleError> {
        AnyParams::new(self.algorithm, rule, self.start_nanos)
    }

    /// Replaces the limits of the plan at `index` (1 to [`SeveralLimits::MAX_LIMITS`] of them, already checked
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
        limits: &[AnyParams],
    ) -> Result<bool, TooManyChanges> {
        let mut replaced = self
            .replaced
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let entry = &self.plans[index];
        let current = read_version(&entry.current);
        // The same limits in another order are a change: the order is the plan's own (the
        // headers list the limits in it, and each client's states follow it).
        if current.as_slice() == limits {
            return Ok(false);
        }
        let Some(version) = current.version().checked_add(1) else {
            return Err(TooManyChanges);
        };
        if limits.len() > 1 {
            // Relaxed: published by the swap's Release below, with the version.
            entry.had_several.store(true, Ordering::Relaxed);
        }
        let next = Box::into_raw(Box::new(PlanVersion::new(version, limits)));
        // Release: publishes the new version's contents to readers' Acquire loads.
        let old = entry.current.swap(next, Ordering::Release);
        // Readers may still hold `old`: it is kept, not freed, until the table is dropped.
        replaced.push(AtomicPtr::new(old));
        Ok(true)
    }

    /// The decision counts of the plan at `index`, if the table counts them: read once per
    /// decision, once it has its answer, which it then counts in them.
    #[inline]
    pub(crate) fn counts(&self, index: usize) -> &Option<DecisionCounts> {
        &self.plans[index].counts
    }

    /// The decision counts of the plan at `index`, if the table counts them.
    pub(crate) fn stats(&self, index: usize) -> Option<PlanStats> {
        let (allowed, denied) = self.plans[index].counts.as_ref()?.totals();
        Some(PlanStats { allowed, denied })
    }
}

impl<K, P: Eq, S> PlanTable<K, P, S> {
    /// The index of `plan`, if the table has it. A linear search: services have few plans, and
    /// comparing a handful of small values beats hashing one.
    #[inline]
    pub(crate) fn index_of(&self, plan: &P) -> Option<usize> {
        self.plans.iter().position(|entry| entry.plan == *plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ServiceError;

    #[test]
    fn a_plan_changes_at_most_version_max_times_and_an_unchanged_setting_is_no_change() {
        let rule = |limit| Rule::per_second(limit).unwrap();
        let params = |limit| AnyParams::new(Algorithm::TokenBucket, rule(limit), 0).unwrap();
        let table: PlanTable<u64, &str, std::hash::RandomState> = PlanTable::new(
            Algorithm::TokenBucket,
            0,
            vec![("free", vec![params(5)])],
            false,
            8,
            papaya::HashMap::default,
        );
        // As if the plan had been changed `Version::MAX - 1` times.
        let last_but_one =
            Box::into_raw(Box::new(PlanVersion::new(Version::MAX - 1, &[params(5)])));
        let first = table.plans[0].current.swap(last_but_one, Ordering::AcqRel);
        // SAFETY: the table's own box, swapped out before any reader could load it.
        drop(unsafe { Box::from_raw(first) });
        assert_eq!(table.read(0).version(), Version::MAX - 1);

        assert!(matches!(table.set_limits(0, &[params(5)]), Ok(false)));
        assert!(matches!(table.set_limits(0, &[params(6)]), Ok(true)));
        assert_eq!(table.read(0).version(), Version::MAX);
        assert_eq!(table.read(0).first().rule(), rule(6));
        // One more would wrap, and an old client's state would pass for a current one.
        assert!(table.set_limits(0, &[params(7)]).is_err());
        assert_eq!(
            table.read(0).first().rule(),
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
        assert!(error.to_string().contains("65535"), "{error}");
    }

    #[test]
    fn readers_racing_changes_read_each_version_whole() {
        // Every version's limits are rules of `version + 1` per second, so a reader can tell a
        // mixed read; the changes retire thousands of versions while readers hold guards.
        let params = |limit| {
            AnyParams::new(Algorithm::TokenBucket, Rule::per_second(limit).unwrap(), 0).unwrap()
        };
        let table: PlanTable<u64, &str, std::hash::RandomState> = PlanTable::new(
            Algorithm::TokenBucket,
            0,
            vec![("plan", vec![params(1), params(1)])],
            false,
            8,
            papaya::HashMap::default,
        );
        // Fewer under Miri, which checks every access of every one.
        let changes: Version = if cfg!(miri) { 40 } else { 5_000 };
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    let mut last = 0;
                    while last < changes {
                        let pinned = table.pin(0);
                        let read = pinned.limits();
                        let limit = u64::from(read.version()) + 1;
                        for params in read.as_slice() {
                            assert_eq!(params.rule().limit(), limit);
                        }
                        assert!(read.version() >= last, "versions only move on");
                        last = read.version();
                    }
                });
            }
            for version in 1..=changes {
                let limit = u64::from(version) + 1;
                assert!(matches!(
                    table.set_limits(0, &[params(limit), params(limit)]),
                    Ok(true)
                ));
            }
        });
    }
}
