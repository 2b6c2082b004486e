//! The service's protocol on its client maps: finding a client's state (or putting a fresh
//! one), using it only under the plan's current limits, replacing a retired one, and the sweep
//! that retires and removes idle ones. The states themselves, and every decision on them, are
//! the methods' (`crate::method`).

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};

use super::RateLimiterService;
use super::plan_table::{PinnedPlan, PlanVersion};
use crate::Decision;
use crate::clock::Clock;
use crate::decision::{Admit, Retired};
use crate::error::ServiceError;
use crate::method::any::AnyParams;
use crate::method::client_state::{ClientState, Version};
use crate::method::several_limits::SeveralLimits;
use crate::sync::{AtomicWord, Ordering, Word};
#[cfg(feature = "tower")]
use crate::verdict::Verdict;

/// What a service call answers: a whole [`Decision`], only whether one permit was granted
/// (which builds no figures: `allow` pays for nothing it does not return), or, for the tower
/// layer, a `Verdict` (`Checked`).
pub(super) trait Answer: Sized {
    /// `Retired` when the state is retired (the caller moves to a fresh one).
    fn acquire(
        params: &AnyParams,
        state: &ClientState,
        n: u64,
        clock: &impl Clock,
    ) -> Result<Self, Retired>;
    /// Takes `n` permits from every limit of a plan of several, or from none; `Retired` when
    /// the entry is retired.
    #[inline]
    fn acquire_several(
        several: &SeveralLimits,
        limits: &[AnyParams],
        n: u64,
        clock: &impl Clock,
    ) -> Result<Self, Retired> {
        several.acquire(limits, n, clock).map(Self::from_decision)
    }
    fn from_decision(decision: Decision) -> Self;
    fn is_allowed(&self) -> bool;
}

impl Answer for Decision {
    #[inline]
    fn acquire(
        params: &AnyParams,
        state: &ClientState,
        n: u64,
        clock: &impl Clock,
    ) -> Result<Self, Retired> {
        params.acquire(state, n, clock)
    }
    #[inline]
    fn from_decision(decision: Decision) -> Self {
        decision
    }
    #[inline]
    fn is_allowed(&self) -> bool {
        Decision::is_allowed(self)
    }
}

impl Answer for Admit {
    /// One permit (`n` is always 1 here).
    #[inline(always)]
    fn acquire(
        params: &AnyParams,
        state: &ClientState,
        _n: u64,
        clock: &impl Clock,
    ) -> Result<Self, Retired> {
        params.acquire_one(state, clock)
    }
    #[inline]
    fn from_decision(decision: Decision) -> Self {
        if decision.is_allowed() {
            Admit::Granted
        } else {
            Admit::Denied
        }
    }
    #[inline]
    fn is_allowed(&self) -> bool {
        *self == Admit::Granted
    }
}

/// A [`Verdict`]: the decision with, for a plan of several limits, each limit's figures read
/// in the same lookup. An allowed one has them only if `GRANT_FIGURES`; without, as
/// [`Figures::OnRefusal`](crate::verdict::Figures::OnRefusal) allows, a grant under several
/// limits lists none, and a sliding log's single permit is taken without counting the permits
/// left (a search of its ring, which would cost more than the decision).
#[cfg(feature = "tower")]
pub(super) struct Checked<const GRANT_FIGURES: bool>(pub(super) Verdict);

#[cfg(feature = "tower")]
impl<const GRANT_FIGURES: bool> Answer for Checked<GRANT_FIGURES> {
    #[inline]
    fn acquire(
        params: &AnyParams,
        state: &ClientState,
        n: u64,
        clock: &impl Clock,
    ) -> Result<Self, Retired> {
        let decision = if GRANT_FIGURES || n != 1 {
            params.acquire(state, n, clock)?
        } else {
            params.acquire_one_uncounted(state, clock)?
        };
        Ok(Checked(Verdict::from(decision)))
    }
    fn acquire_several(
        several: &SeveralLimits,
        limits: &[AnyParams],
        n: u64,
        clock: &impl Clock,
    ) -> Result<Self, Retired> {
        let decision = several.acquire(limits, n, clock)?;
        // Read right after the decision, from the same entry. (Should a sweep retire the entry
        // in between, the decision's own figures stand in for the list.)
        let each = (GRANT_FIGURES || decision.is_denied())
            .then(|| several.peek_each(limits, clock).ok())
            .flatten();
        Ok(Checked(match each {
            Some(each) => Verdict::with_each_limit(decision, each),
            None => Verdict::from(decision),
        }))
    }
    #[inline]
    fn from_decision(decision: Decision) -> Self {
        Checked(Verdict::from(decision))
    }
    #[inline]
    fn is_allowed(&self) -> bool {
        self.0.decision().is_allowed()
    }
}

/// One client's limiter under one plan: the state, marked with the version of the plan's limits
/// it was made under.
#[derive(Debug)]
pub(crate) struct ClientEntry {
    pub(super) state: ClientState,
}

impl ClientEntry {
    /// The version of the plan's limits this entry was made under.
    #[inline]
    pub(super) fn version(&self) -> Version {
        self.state.version()
    }
}

impl<K, P, C, S> RateLimiterService<K, P, C, S>
where
    K: Hash + Eq,
    P: Eq + fmt::Debug,
    C: Clock,
    S: BuildHasher,
{
    /// The most times one decision looks its client up. Each lookup after the first follows a
    /// change that another thread made meanwhile (a rule change, a sweep), so a consistent key is
    /// decided within a few; a key whose `Hash` changes between calls can find a stale entry that
    /// its removal then misses, again and again, and is answered with
    /// [`ServiceError::UnstableKey`] instead of a spin.
    const MAX_LOOKUP_TRIES: u32 = 1_000;

    /// Counts one more lookup by a decision that has made `lookups`; false once that would
    /// pass [`Self::MAX_LOOKUP_TRIES`].
    #[cold]
    fn may_look_again(lookups: &mut u32) -> bool {
        *lookups += 1;
        *lookups <= Self::MAX_LOOKUP_TRIES
    }

    /// [`RateLimiterService::acquire`], answering as `T` does (see [`Answer`]).
    #[inline]
    pub(super) fn decide<Q, T: Answer>(
        &self,
        client: &Q,
        plan: &P,
        n: u64,
    ) -> Result<T, ServiceError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let index = self.plan_index(plan)?;
        let pinned = self.plans.pin(index);
        let (clients, guard) = (pinned.clients(), pinned.guard());
        // Lookups after the first are counted only where they are made, off the first pass.
        let mut lookups = 1;
        loop {
            let entry = match clients.get(client, guard) {
                Some(entry) => entry,
                None => {
                    let head = pinned.head();
                    let (version, state) = if head.several {
                        let limits = pinned.limits();
                        if !limits.has_several() {
                            // Changed to one limit since the read above: start over.
                            if Self::may_look_again(&mut lookups) {
                                continue;
                            }
                            break;
                        }
                        let fresh = SeveralLimits::fresh(limits.as_slice(), self.made_as_of());
                        if n == 0
                            && let Ok(answer) =
                                T::acquire_several(&fresh, limits.as_slice(), 0, &self.clock)
                        {
                            self.plans.record(index, true);
                            return Ok(answer);
                        }
                        (limits.version(), ClientState::Several(0, Box::new(fresh)))
                    } else {
                        let params = head.first;
                        if n == 0 {
                            self.plans.record(index, true);
                            return Ok(T::from_decision(params.fresh_report(
                                true,
                                self.made_as_of(),
                                &self.clock,
                            )));
                        }
                        (head.version, params.fresh_state(self.made_as_of()))
                    };
                    // Two first requests may both get here; the map keeps exactly one entry,
                    // and both use it.
                    clients.get_or_insert_with(
                        client.to_owned(),
                        || ClientEntry {
                            state: state.made_under(version),
                        },
                        guard,
                    )
                }
            };
            // The plan is read *after* the entry is found (or put) in the map, and the entry is
            // used only if it was made under the version this read returns. A rule change
            // retires the client's old entry only after the new version is in place, so an
            // entry put after that retirement by a request that read the plan before the change
            // is always seen here as made under an earlier version: it never grants, and the
            // client cannot start afresh twice across one change.
            let head = pinned.head();
            let params = &head.first;
            if entry.version() != head.version {
                if entry.version() < head.version {
                    // Made under an earlier rule of the plan: retire it, so that no request
                    // still holding it can be granted on it, and start afresh under the current
                    // rule.
                    params.retire_now(&entry.state);
                    Self::remove_entry(&pinned, client, entry);
                }
                // (A later version than this read cannot be: whoever made the entry read its
                // version before putting it where this lookup found it. Read again regardless.)
                if Self::may_look_again(&mut lookups) {
                    continue;
                }
                break;
            }
            let answer = match &entry.state {
                ClientState::Several(_, several) if head.several => {
                    let limits = pinned.limits();
                    if limits.version() != head.version {
                        // Changed since the read above: start over from the lookup.
                        if Self::may_look_again(&mut lookups) {
                            continue;
                        }
                        break;
                    }
                    T::acquire_several(several, limits.as_slice(), n, &self.clock)
                }
                state => T::acquire(params, state, n, &self.clock),
            };
            let Ok(answer) = answer else {
                // Acquire: pairs with the Release of the retiring exchange, so the sweep's
                // `evicted_up_to` is seen when the fresh limiter is made.
                <Word as AtomicWord>::fence(Ordering::Acquire);
                // Evicted under our feet: drop the retired entry (if no one has yet) and use a
                // fresh one. The retired state granted nothing, so nothing is counted twice.
                Self::remove_entry(&pinned, client, entry);
                if Self::may_look_again(&mut lookups) {
                    continue;
                }
                break;
            };
            self.plans.record(index, answer.is_allowed());
            return Ok(answer);
        }
        Err(Self::unstable_key(plan))
    }

    /// The error of a decision that gave up looking its client up (see
    /// [`Self::MAX_LOOKUP_TRIES`]); out of line, so that the decision's own code stays small.
    #[cold]
    #[inline(never)]
    fn unstable_key(plan: &P) -> ServiceError {
        ServiceError::UnstableKey {
            plan: format!("{plan:?}"),
            tries: Self::MAX_LOOKUP_TRIES,
        }
    }

    /// The plan's current limits, and `client`'s entry if it was made under them: read once,
    /// after the lookup, as `decide` does (see there), so that every figure taken from them
    /// comes from one version.
    pub(super) fn current_entry<'p, Q>(
        pinned: &'p PinnedPlan<'_, K, S>,
        client: &Q,
    ) -> (PlanVersion, Option<&'p ClientEntry>)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let entry = pinned.clients().get(client, pinned.guard());
        let limits = pinned.limits();
        let entry = entry.filter(|entry| entry.version() == limits.version());
        (limits, entry)
    }

    /// The instant new limiters are made as of (see `evicted_up_to`).
    #[inline]
    pub(super) fn made_as_of(&self) -> u64 {
        // Relaxed: a thread replacing a retired limiter has already synchronized with the retiring
        // sweep (see `acquire`); any other thread may see an older value, which only matters for
        // readings older than a sweep it has not met.
        self.evicted_up_to.load(Ordering::Relaxed)
    }

    /// Removes every limiter that is indistinguishable from a fresh one (a full bucket, a window
    /// that is over, a log whose entries have all expired), and every one made under an earlier
    /// rule of its plan; returns how many.
    ///
    /// Invisible to clients: each limiter is first *retired* by an exchange on its own state, the
    /// same word(s) an acquire changes, so a limiter that is admitting is never removed, and an
    /// acquire that meets a retired limiter moves to a fresh one, made as of this sweep's clock
    /// reading, which answers as the retired one would have (and no more generously to a reading
    /// older than the sweep's). Memory therefore stays bounded by the clients active within one
    /// window, however many distinct clients pass through.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now_nanos();
        // Relaxed: published to acquirers by the Release of each retiring exchange below.
        self.evicted_up_to.fetch_max(now, Ordering::Relaxed);
        let mut removed = 0;
        for index in 0..self.plans.len() {
            let pinned = self.plans.pin(index);
            for (client, entry) in pinned.clients().iter(pinned.guard()) {
                let head = pinned.head();
                let params = &head.first;
                let retired = if entry.version() == head.version {
                    match &entry.state {
                        ClientState::Several(_, several) => several.retire_if_idle(now),
                        state => params.retire_if_idle(state, now),
                    }
                } else {
                    // Its next request would start it afresh anyway.
                    params.retire_now(&entry.state);
                    true
                };
                if retired && Self::remove_entry(&pinned, client.borrow(), entry) {
                    removed += 1;
                }
            }
        }
        removed
    }

    /// Removes `entry`, if it is still the one in the map under `client`; returns whether it was.
    fn remove_entry<Q>(pinned: &PinnedPlan<'_, K, S>, client: &Q, entry: &ClientEntry) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // Pointer identity: another thread may already have put a fresh entry in its place.
        matches!(
            pinned.clients().remove_if(
                client,
                |_, current| std::ptr::eq(current, entry),
                pinned.guard()
            ),
            Ok(Some(_))
        )
    }
}
