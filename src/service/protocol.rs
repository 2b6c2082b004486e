//! The service's protocol on its client maps: finding a client's state (or putting a fresh
//! one), using it only under the plan's current limits, replacing a retired one, and the sweep
//! that retires and removes idle ones. The states themselves, and every decision on them, are
//! the methods' (`crate::method`).
//!
//! [`decide`] and [`sweep`] are written once, generic over the map ([`ClientMap`]), the plan
//! ([`Pinned`]: its clients and its current limits), the request ([`Request`]: the methods'
//! part of a decision) and the word the sweep publishes its reading in. The service runs them
//! with papaya's map, the plan table and [`AnyParams`]; the loom models (`loom-tests/service.rs`,
//! `loom-tests/rule_change.rs`) run the very same functions with a loom map and loom states.

// The protocol is public (doc-hidden) only for the `loom` feature's models.
#![cfg_attr(not(feature = "loom"), allow(unreachable_pub))]

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;

use super::client_map::ClientMap;
use super::plan_table::{PinnedPlan, PlanHead};
use super::stats::DecisionCounts;
use super::store::{Holding, SlotWord, WordLimit, WordRequest};
use crate::Decision;
use crate::clock::{Clock, Reading};
use crate::decision::{Admit, Retired};
use crate::method::any::AnyParams;
use crate::method::client_state::{ClientState, StateRef, Version};
#[cfg(feature = "envoy")]
use crate::method::several_limits::Reservations;
use crate::method::several_limits::SeveralLimits;
#[cfg(feature = "envoy")]
use crate::method::word::Reservation;
use crate::sync::{AtomicWord, Ordering, Word};
#[cfg(feature = "tower")]
use crate::verdict::{Reported, Verdict};

/// What a service call answers: a whole [`Decision`], only whether one permit was granted
/// (which builds no figures: `allow` pays for nothing it does not return), or, for the tower
/// layer, a `Verdict` (`Checked`) or a decision with every figure a response reports
/// (`Reporting`).
pub(super) trait Answer: Sized {
    /// Whether the answer keeps its grant to give it back (see `WordRequest::KEEPS_GRANTS`).
    const KEEPS_GRANTS: bool = false;
    /// `Retired` when the state is retired (the caller moves to a fresh one).
    fn acquire<A: AtomicWord>(
        params: &AnyParams,
        state: StateRef<'_, A>,
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
    /// The answer, told where the state it was decided on lives (for an answer that keeps its
    /// grant to give it back: `Reserving`); the others ignore it.
    #[inline(always)]
    fn held_at(self, held: HeldAt) -> Self {
        let _ = held;
        self
    }
}

/// Where a decision's state lives, so that a grant made on it can be given back to that state
/// alone (see `RateLimiterService::give_back`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeldAt {
    /// Not told yet.
    #[cfg(feature = "envoy")]
    Unknown,
    /// A holding of a slot of the plan's store.
    Slot(Holding),
    /// An entry of the plan's map: its address (the entry's identity while the map holds it),
    /// and the version of the plan's limits it was made under.
    Entry { address: usize, version: Version },
}

impl Answer for Decision {
    #[inline]
    fn acquire<A: AtomicWord>(
        params: &AnyParams,
        state: StateRef<'_, A>,
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
    fn acquire<A: AtomicWord>(
        params: &AnyParams,
        state: StateRef<'_, A>,
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

/// A [`Verdict`] for a layer that reports refusals only
/// ([`Figures::OnRefusal`](crate::verdict::Figures::OnRefusal)): a grant is
/// [`Verdict::allowed`], which carries nothing; a refusal carries its decision and, for a plan of
/// several limits, each limit's figures. A sliding log's single permit is taken without counting
/// the permits left (a search of its ring, which would cost more than the decision).
#[cfg(feature = "tower")]
pub(super) struct Checked(pub(super) Verdict);

#[cfg(feature = "tower")]
impl Answer for Checked {
    // Always inlined, as `AnyParams::acquire_one_quiet` and the token bucket's under it, into the
    // tower layer's decision: out of line, each call passed its state and answer through memory
    // (23 of an allowed request's instructions in `benches/tower.rs`).
    #[inline(always)]
    fn acquire<A: AtomicWord>(
        params: &AnyParams,
        state: StateRef<'_, A>,
        n: u64,
        clock: &impl Clock,
    ) -> Result<Self, Retired> {
        if n == 1 {
            params
                .acquire_one_quiet(state, clock, Verdict::allowed, Verdict::from)
                .map(Checked)
        } else {
            Ok(Checked::from_decision(params.acquire(state, n, clock)?))
        }
    }
    fn acquire_several(
        several: &SeveralLimits,
        limits: &[AnyParams],
        n: u64,
        clock: &impl Clock,
    ) -> Result<Self, Retired> {
        let decision = several.acquire(limits, n, clock)?;
        Ok(Checked(if decision.is_allowed() {
            Verdict::allowed()
        } else {
            Verdict::from(with_each_limit(decision, several, limits, clock))
        }))
    }
    #[inline]
    fn from_decision(decision: Decision) -> Self {
        // A grant's figures are left in the decision, unread: once inlined, a grant builds none.
        Checked(crate::method::quiet(
            decision,
            Verdict::allowed,
            Verdict::from,
        ))
    }
    #[inline]
    fn is_allowed(&self) -> bool {
        self.0.is_allowed()
    }
}

/// A decision with every figure a response reports
/// ([`Figures::Always`](crate::verdict::Figures::Always), and Envoy's answers): for a plan of
/// several limits, each limit's figures, read in the same lookup.
#[cfg(feature = "tower")]
pub(super) struct Reporting(pub(super) Reported);

#[cfg(feature = "tower")]
impl Answer for Reporting {
    #[inline]
    fn acquire<A: AtomicWord>(
        params: &AnyParams,
        state: StateRef<'_, A>,
        n: u64,
        clock: &impl Clock,
    ) -> Result<Self, Retired> {
        Ok(Reporting(Reported::from(params.acquire(state, n, clock)?)))
    }
    fn acquire_several(
        several: &SeveralLimits,
        limits: &[AnyParams],
        n: u64,
        clock: &impl Clock,
    ) -> Result<Self, Retired> {
        let decision = several.acquire(limits, n, clock)?;
        Ok(Reporting(with_each_limit(decision, several, limits, clock)))
    }
    #[inline]
    fn from_decision(decision: Decision) -> Self {
        Reporting(Reported::from(decision))
    }
    #[inline]
    fn is_allowed(&self) -> bool {
        self.0.decision().is_allowed()
    }
}

/// `decision` with each limit's figures, read right after it from the same entry.
/// (Should a sweep retire the entry in between, the decision's own figures stand in for the
/// list.)
#[cfg(feature = "tower")]
fn with_each_limit(
    decision: Decision,
    several: &SeveralLimits,
    limits: &[AnyParams],
    clock: &impl Clock,
) -> Reported {
    match several.peek_each(limits, clock) {
        Ok(each) => Reported::with_each_limit(decision, each),
        Err(Retired) => Reported::from(decision),
    }
}

/// A decision with every limit's figures (as `Reporting`), and for a grant of `n > 0`
/// permits by methods that can undo one, the [`Grant`] to give it back with.
#[cfg(feature = "envoy")]
pub(super) struct Reserving(pub(super) Reported, pub(super) Option<Grant>);

/// A grant that [`RateLimiterService::give_back`](crate::RateLimiterService) can undo: what it
/// took, when, and from which state.
#[cfg(feature = "envoy")]
#[derive(Debug, Clone)]
pub(crate) struct Grant {
    pub(super) n: u64,
    /// The clock reading the grant was decided at.
    pub(super) now_nanos: u64,
    pub(super) taken: Taken,
    pub(super) held: HeldAt,
}

/// What a [`Grant`] took.
#[cfg(feature = "envoy")]
#[derive(Debug, Clone)]
pub(super) enum Taken {
    /// From a one-limit state: its decision and reservation.
    One(Decision, Reservation),
    /// From each limit of a plan of several (boxed: four limits' worth).
    Several(Box<Reservations>),
}

#[cfg(feature = "envoy")]
impl Answer for Reserving {
    const KEEPS_GRANTS: bool = true;

    #[inline]
    fn acquire<A: AtomicWord>(
        params: &AnyParams,
        state: StateRef<'_, A>,
        n: u64,
        clock: &impl Clock,
    ) -> Result<Self, Retired> {
        // One reading, kept with the grant: an undo locates the window a grant was counted in
        // from the reading it was decided at.
        let now_nanos = clock.now_nanos();
        let (decision, reservation) = params.reserve(state, n, &Reading(now_nanos))?;
        let grant = reservation
            .filter(|_| n > 0 && decision.is_allowed())
            .map(|reservation| Grant {
                n,
                now_nanos,
                taken: Taken::One(decision, reservation),
                held: HeldAt::Unknown,
            });
        Ok(Reserving(Reported::from(decision), grant))
    }
    fn acquire_several(
        several: &SeveralLimits,
        limits: &[AnyParams],
        n: u64,
        clock: &impl Clock,
    ) -> Result<Self, Retired> {
        let now_nanos = clock.now_nanos();
        let (decision, reservations) = several.reserve(limits, n, now_nanos)?;
        let grant = reservations.map(|reservations| Grant {
            n,
            now_nanos,
            taken: Taken::Several(Box::new(reservations)),
            held: HeldAt::Unknown,
        });
        let reported = with_each_limit(decision, several, limits, clock);
        Ok(Reserving(reported, grant))
    }
    #[inline]
    fn from_decision(decision: Decision) -> Self {
        Reserving(Reported::from(decision), None)
    }
    #[inline]
    fn is_allowed(&self) -> bool {
        self.0.decision().is_allowed()
    }
    #[inline]
    fn held_at(mut self, held: HeldAt) -> Self {
        if let Some(grant) = &mut self.1 {
            grant.held = held;
        }
        self
    }
}

/// One client's limiter under one plan: the state, marked with the version of the plan's limits
/// it was made under.
#[derive(Debug)]
pub(crate) struct ClientEntry {
    pub(super) state: ClientState,
}

/// Something made under one version of a plan's limits: a client's entry, or the limits a
/// request read.
#[doc(hidden)]
pub trait Versioned {
    /// The version of the plan's limits.
    fn version(&self) -> Version;
}

impl Versioned for ClientEntry {
    /// The version of the plan's limits this entry was made under.
    #[inline]
    fn version(&self) -> Version {
        self.state.version()
    }
}

impl Versioned for PlanHead {
    #[inline]
    fn version(&self) -> Version {
        self.version
    }
}

/// A plan pinned for one decision or one sweep: its map of clients with a guard of it held, and
/// its current limits, read anew at every [`Pinned::head`] (a rule change may publish new ones
/// at any time). What [`decide`] and [`sweep`] need of a plan, beside its clients' states.
#[doc(hidden)]
pub trait Pinned {
    /// The client key.
    type Key: Hash + Eq;
    /// One client's entry.
    type Entry: Versioned;
    /// The plan's map of clients.
    type Map: ClientMap<Self::Key, Self::Entry>;
    /// What a request reads first of the plan's current limits.
    type Head: Versioned;

    /// The plan's clients.
    fn clients(&self) -> &Self::Map;

    /// The guard every call on [`Pinned::clients`] is made with.
    fn guard(&self) -> &MapGuard<'_, Self>;

    /// The plan's current limits, as they are now.
    fn head(&self) -> Self::Head;

    /// Retires `entry`, made under an earlier version than `head`'s, whatever it holds, so
    /// that no request can be granted on it any more.
    fn retire_now(&self, head: &Self::Head, entry: &Self::Entry);

    /// Retires `entry`, made under `head`'s version, if it is indistinguishable from a fresh
    /// one at `now_nanos`; whether it did.
    fn retire_if_idle(&self, head: &Self::Head, entry: &Self::Entry, now_nanos: u64) -> bool;
}

/// The guard of a pinned plan's map.
#[doc(hidden)]
pub type MapGuard<'m, P> =
    <<P as Pinned>::Map as ClientMap<<P as Pinned>::Key, <P as Pinned>::Entry>>::Guard<'m>;

/// What a request for a client the map does not hold does (see [`Request::fresh`]).
#[doc(hidden)]
#[derive(Debug)]
pub enum Fresh<E, A> {
    /// Put this entry, unless another request has put one meanwhile, and decide on the one
    /// the map then holds.
    Entry(E),
    /// The answer, with no entry made (an attempt that takes nothing whatever the state: of 0
    /// permits, or of more than a limit).
    Answer(A),
    /// The plan's limits changed since the head was read: look the client up again.
    Changed,
}

/// What a request's decision on a live entry came to (see [`Request::acquire`]).
#[doc(hidden)]
#[derive(Debug)]
pub enum Acquired<A> {
    /// The answer.
    Answer(A),
    /// The plan's limits changed since the head was read: look the client up again.
    Changed,
}

/// One request's part of a decision: the methods' decisions on the entry [`decide`] found, and
/// the entry it makes for a client the map does not hold.
#[doc(hidden)]
pub trait Request<P: Pinned + ?Sized> {
    /// What the request answers.
    type Answer;

    /// For a client the map does not hold: an entry made under `head` (marked with its
    /// version) as of the clock reading `since_nanos` (see `evicted_up_to`), or the answer
    /// without one.
    fn fresh(&self, pinned: &P, head: &P::Head, since_nanos: u64) -> Fresh<P::Entry, Self::Answer>;

    /// Decides on `entry`, made under `head`'s version; [`Retired`] when the entry is retired (a
    /// sweep evicted it), which granted nothing.
    fn acquire(
        &self,
        pinned: &P,
        head: &P::Head,
        entry: &P::Entry,
    ) -> Result<Acquired<Self::Answer>, Retired>;
}

/// The most times one decision looks its client up. Each lookup after the first follows a
/// change that another thread made meanwhile (a rule change, a sweep), so a consistent key is
/// decided within a few; a key whose `Hash` changes between calls can find a stale entry that
/// its removal then misses, again and again, and is answered with
/// [`ServiceError::UnstableKey`](crate::ServiceError::UnstableKey) instead of a spin.
pub(crate) const MAX_LOOKUP_TRIES: u32 = 1_000;

/// Counts one more lookup by a decision that has made `lookups`; false once that would pass
/// [`MAX_LOOKUP_TRIES`].
#[cold]
fn may_look_again(lookups: &mut u32) -> bool {
    *lookups += 1;
    *lookups <= MAX_LOOKUP_TRIES
}

/// The instant new limiters are made as of: the latest clock reading any sweep retired
/// limiters at (or an eviction's victim had counted permits up to), kept in `evicted_up_to`
/// (the service's), so that a limiter replacing a retired one is at least as strict for every
/// reading, even one older than the sweep's.
#[inline]
pub(crate) fn made_as_of<W: AtomicWord>(evicted_up_to: &W) -> u64 {
    // Relaxed: a thread replacing a retired limiter has already synchronized with the retiring
    // sweep (see `decide`); any other thread may see an older value, which only matters for
    // readings older than a sweep it has not met.
    evicted_up_to.load(Ordering::Relaxed)
}

/// A decision for `client` under the plan `pinned`: finds the client's entry (or puts a fresh
/// one), uses it only if it was made under the plan's current limits, and replaces one that is
/// retired or made under earlier limits.
///
/// # Errors
///
/// `give_up()`'s, after [`MAX_LOOKUP_TRIES`] lookups.
#[doc(hidden)]
#[inline(always)]
pub fn decide<P, Q, R, W, E>(
    pinned: &P,
    client: &Q,
    request: &R,
    evicted_up_to: &W,
    give_up: impl FnOnce() -> E,
) -> Result<R::Answer, E>
where
    P: Pinned + ?Sized,
    P::Key: Borrow<Q>,
    Q: Hash + Eq + ToOwned<Owned = P::Key> + ?Sized,
    R: Request<P>,
    W: AtomicWord,
{
    let (clients, guard) = (pinned.clients(), pinned.guard());
    // Lookups after the first are counted only where they are made, off the first pass.
    let mut lookups = 1;
    loop {
        let entry = match clients.get(client, guard) {
            Some(entry) => entry,
            None => {
                let head = pinned.head();
                match request.fresh(pinned, &head, made_as_of(evicted_up_to)) {
                    // Two first requests may both get here; the map keeps exactly one entry,
                    // and both use it.
                    Fresh::Entry(fresh) => {
                        clients.get_or_insert_with(client.to_owned(), || fresh, guard)
                    }
                    Fresh::Answer(answer) => return Ok(answer),
                    Fresh::Changed => {
                        if may_look_again(&mut lookups) {
                            continue;
                        }
                        break;
                    }
                }
            }
        };
        // The plan is read *after* the entry is found (or put) in the map, and the entry is
        // used only if it was made under the version this read returns. A rule change retires
        // the client's old entry only after the new version is in place, so an entry put after
        // that retirement by a request that read the plan before the change is always seen here
        // as made under an earlier version: it never grants, and the client cannot start afresh
        // twice across one change.
        let head = pinned.head();
        if entry.version() != head.version() {
            if entry.version() < head.version() {
                // Made under an earlier rule of the plan: retire it, so that no request still
                // holding it can be granted on it, and start afresh under the current rule.
                pinned.retire_now(&head, entry);
                remove_entry(pinned, client, entry);
            }
            // (A later version than this read cannot be: whoever made the entry read its
            // version before putting it where this lookup found it. Read again regardless.)
            if may_look_again(&mut lookups) {
                continue;
            }
            break;
        }
        match request.acquire(pinned, &head, entry) {
            Ok(Acquired::Answer(answer)) => return Ok(answer),
            Ok(Acquired::Changed) => {}
            Err(Retired) => {
                // Acquire: pairs with the Release of the retiring exchange, so the sweep's
                // `evicted_up_to` is seen when the fresh limiter is made.
                W::fence(Ordering::Acquire);
                // Evicted under our feet: drop the retired entry (if no one has yet) and use a
                // fresh one. The retired state granted nothing, so nothing is counted twice.
                remove_entry(pinned, client, entry);
            }
        }
        if may_look_again(&mut lookups) {
            continue;
        }
        break;
    }
    Err(give_up())
}

/// The sweep ([`RateLimiterService::sweep`](crate::RateLimiterService::sweep)): publishes
/// `now_nanos` in `evicted_up_to`, then in each of `plans` retires every entry that is idle at
/// `now_nanos` or made under an earlier version of its plan's limits, and removes it if it is
/// still the client's entry; returns how many it removed. Each retirement is an exchange on the
/// entry's own state, the word(s) an acquire changes, so an entry that is admitting is never
/// retired, and a request that meets a retired one moves to a fresh one, made as of this
/// reading (see [`made_as_of`]).
#[doc(hidden)]
pub fn sweep<P, W>(evicted_up_to: &W, now_nanos: u64, plans: impl IntoIterator<Item = P>) -> usize
where
    P: Pinned,
    W: AtomicWord,
{
    // Relaxed: published to acquirers by the Release of each retiring exchange below.
    evicted_up_to.fetch_max(now_nanos, Ordering::Relaxed);
    let mut removed = 0;
    for pinned in plans {
        for (client, entry) in pinned.clients().iter(pinned.guard()) {
            let head = pinned.head();
            let retired = if entry.version() == head.version() {
                pinned.retire_if_idle(&head, entry, now_nanos)
            } else {
                // Its next request would start it afresh anyway.
                pinned.retire_now(&head, entry);
                true
            };
            if retired && remove_entry(&pinned, client, entry) {
                removed += 1;
            }
        }
    }
    removed
}

/// Removes `entry`, if it is still the one in the map under `client`; returns whether it was.
fn remove_entry<P, Q>(pinned: &P, client: &Q, entry: &P::Entry) -> bool
where
    P: Pinned + ?Sized,
    P::Key: Borrow<Q>,
    Q: Hash + Eq + ?Sized,
{
    // Pointer identity: another thread may already have put a fresh entry in its place.
    pinned
        .clients()
        .remove_if_same(client, entry, pinned.guard())
}

/// The service's plan: papaya's map of [`ClientEntry`], the plan table's versioned limits.
impl<K: Hash + Eq, S: BuildHasher> Pinned for PinnedPlan<'_, K, S> {
    type Key = K;
    type Entry = ClientEntry;
    type Map = papaya::HashMap<K, ClientEntry, S>;
    type Head = PlanHead;

    #[inline]
    fn clients(&self) -> &Self::Map {
        PinnedPlan::clients(self)
    }

    #[inline]
    fn guard(&self) -> &papaya::LocalGuard<'_> {
        PinnedPlan::guard(self)
    }

    #[inline]
    fn head(&self) -> PlanHead {
        PinnedPlan::head(self)
    }

    fn retire_now(&self, head: &PlanHead, entry: &ClientEntry) {
        head.first.retire_now(&entry.state);
    }

    fn retire_if_idle(&self, head: &PlanHead, entry: &ClientEntry, now_nanos: u64) -> bool {
        match &entry.state {
            ClientState::Several(_, several) => several.retire_if_idle(now_nanos),
            state => head.first.retire_if_idle(state, now_nanos),
        }
    }
}

/// A service call's request: `n` permits at `clock`'s reading, answered as `T`, each answer
/// counted in the plan's decision counts (where the service keeps them) where it is made.
pub(super) struct Asking<'c, T, C> {
    pub(super) n: u64,
    pub(super) clock: &'c C,
    /// Read once the answer is made (not kept through the decision).
    pub(super) counts: &'c Option<DecisionCounts>,
    pub(super) answer: PhantomData<T>,
}

impl<T: Answer, C> Asking<'_, T, C> {
    /// Counts `answer`, and answers it.
    #[inline(always)]
    fn counted(&self, answer: T) -> T {
        if let Some(counts) = self.counts {
            counts.record(answer.is_allowed());
        }
        answer
    }
}

/// The answer of a request on a plan's map when the plan's current limits keep its clients in
/// the plan's store instead (it has changed to one limit): the caller decides there.
#[derive(Debug)]
pub(super) struct InStore;

impl<K, S, T, C> Request<PinnedPlan<'_, K, S>> for Asking<'_, T, C>
where
    K: Hash + Eq,
    S: BuildHasher,
    T: Answer,
    C: Clock,
{
    type Answer = Result<T, InStore>;

    #[inline]
    fn fresh(
        &self,
        pinned: &PinnedPlan<'_, K, S>,
        head: &PlanHead,
        since_nanos: u64,
    ) -> Fresh<ClientEntry, Result<T, InStore>> {
        let (version, state) = if head.several {
            let limits = pinned.limits();
            if !limits.has_several() {
                // Changed to one limit since the head was read.
                return Fresh::Changed;
            }
            let fresh = SeveralLimits::fresh(limits.as_slice(), since_nanos);
            // An attempt that takes nothing whatever the state (0 permits, or more than one of
            // the limits ever grants) is answered from the fresh state, which is then dropped.
            let takes_nothing = limits
                .as_slice()
                .iter()
                .any(|limit| limit.takes_nothing(self.n));
            if takes_nothing
                && let Ok(answer) =
                    T::acquire_several(&fresh, limits.as_slice(), self.n, self.clock)
            {
                return Fresh::Answer(Ok(self.counted(answer)));
            }
            (limits.version(), ClientState::Several(0, Box::new(fresh)))
        } else {
            if pinned.has_store() {
                return Fresh::Answer(Err(InStore));
            }
            let params = head.first;
            if let Some(decision) = params.answer_taking_nothing(self.n, since_nanos, self.clock) {
                return Fresh::Answer(Ok(self.counted(T::from_decision(decision))));
            }
            (head.version, params.fresh_state(since_nanos))
        };
        Fresh::Entry(ClientEntry {
            state: state.made_under(version),
        })
    }

    #[inline(always)]
    fn acquire(
        &self,
        pinned: &PinnedPlan<'_, K, S>,
        head: &PlanHead,
        entry: &ClientEntry,
    ) -> Result<Acquired<Result<T, InStore>>, Retired> {
        let answer = match &entry.state {
            ClientState::Several(_, several) if head.several => {
                let limits = pinned.limits();
                if limits.version() != head.version {
                    return Ok(Acquired::Changed);
                }
                T::acquire_several(several, limits.as_slice(), self.n, self.clock)?
            }
            state => T::acquire(&head.first, state.into(), self.n, self.clock)?,
        };
        let held = HeldAt::Entry {
            address: std::ptr::from_ref(entry) as usize,
            version: head.version,
        };
        Ok(Acquired::Answer(Ok(self.counted(answer.held_at(held)))))
    }
}

/// A request decided on a one-word state in a plan's store.
impl<T, C> WordRequest<Word, &AnyParams> for Asking<'_, T, C>
where
    T: Answer,
    C: Clock,
{
    const KEEPS_GRANTS: bool = T::KEEPS_GRANTS;
    type Answer = T;

    #[inline(always)]
    fn acquire(&self, limit: &&AnyParams, state: &SlotWord<'_, Word>) -> Result<T, Retired> {
        T::acquire(limit, StateRef::Word(state), self.n, self.clock)
            .map(|answer| answer.held_at(HeldAt::Slot(state.holding())))
    }

    #[inline(always)]
    fn acquire_at(
        &self,
        limit: &&AnyParams,
        state: &SlotWord<'_, Word>,
        now_nanos: u64,
    ) -> Result<T, Retired> {
        T::acquire(limit, StateRef::Word(state), self.n, &Reading(now_nanos))
            .map(|answer| answer.held_at(HeldAt::Slot(state.holding())))
    }

    #[inline(always)]
    fn answered(&self, answer: T) -> T {
        self.counted(answer)
    }

    // Always inlined, as the test it makes (`AnyParams::answer_taking_nothing`): a request of
    // one compiles to nothing here, where a call out of line made each first request pass its
    // arguments (thin LTO did not inline it).
    #[inline(always)]
    fn without_state(&self, limit: &&AnyParams, since_nanos: u64) -> Option<T> {
        let decision = limit.answer_taking_nothing(self.n, since_nanos, self.clock)?;
        Some(self.counted(T::from_decision(decision)))
    }
}

/// `request`, decided only under a limit of the method `METHOD` (an [`Algorithm`] as `u8`): the
/// service's own method, which a lookup of a known client names in its type. The lookup's code
/// then holds that method's decision alone. With every method's, the others' called out of line,
/// each lookup kept its slot's word in memory for them and saved the registers that their calls
/// would clobber, whichever method decided. Under a limit of another method (which the service
/// never has), the state answers as retired: nothing is written, and the request goes on to the
/// full lookup, where every method decides (see `RateLimiterService::decide_in`).
///
/// [`Algorithm`]: crate::Algorithm
pub(super) struct OfMethod<'r, R, const METHOD: u8>(pub(super) &'r R);

impl<'a, R, const METHOD: u8> WordRequest<Word, &'a AnyParams> for OfMethod<'_, R, METHOD>
where
    R: WordRequest<Word, &'a AnyParams>,
{
    const KEEPS_GRANTS: bool = R::KEEPS_GRANTS;
    type Answer = R::Answer;

    #[inline(always)]
    fn acquire(
        &self,
        limit: &&'a AnyParams,
        state: &SlotWord<'_, Word>,
    ) -> Result<R::Answer, Retired> {
        if limit.algorithm() as u8 == METHOD {
            self.0.acquire(limit, state)
        } else {
            Err(Retired)
        }
    }

    #[inline(always)]
    fn acquire_at(
        &self,
        limit: &&'a AnyParams,
        state: &SlotWord<'_, Word>,
        now_nanos: u64,
    ) -> Result<R::Answer, Retired> {
        if limit.algorithm() as u8 == METHOD {
            self.0.acquire_at(limit, state, now_nanos)
        } else {
            Err(Retired)
        }
    }

    #[inline(always)]
    fn answered(&self, answer: R::Answer) -> R::Answer {
        self.0.answered(answer)
    }

    #[inline(always)]
    fn without_state(&self, limit: &&'a AnyParams, since_nanos: u64) -> Option<R::Answer> {
        self.0.without_state(limit, since_nanos)
    }
}

/// One limit's constants (borrowed from the plan's version), on a state word of the plan's
/// store.
impl WordLimit for &AnyParams {
    fn fresh(&self, since_nanos: u64) -> u64 {
        // Only the one-word methods have a store (a service of the sliding log makes none); the
        // retired word, should it ever be otherwise, grants nothing.
        self.fresh_word(since_nanos).unwrap_or(u64::MAX)
    }

    fn retire_now<A: AtomicWord>(&self, state: &A) -> bool {
        AnyParams::retire_now(self, state)
    }

    fn retire_evicted<A: AtomicWord>(&self, state: &A) -> Option<u64> {
        AnyParams::retire_evicted(self, state)
    }

    fn counted_and_idle_from<A: AtomicWord>(&self, state: &A) -> Option<(u64, u64)> {
        AnyParams::counted_and_idle_from(self, state)
    }

    fn retire_if_idle<A: AtomicWord>(&self, state: &A, now_nanos: u64) -> bool {
        AnyParams::retire_if_idle(self, state, now_nanos)
    }

    fn available<A: AtomicWord>(&self, state: &A, now_nanos: u64) -> Option<u64> {
        self.peek(state, &Reading(now_nanos))
            .ok()
            .map(|decision| decision.remaining())
    }

    fn is_idle<A: AtomicWord>(&self, state: &A, now_nanos: u64) -> bool {
        self.available(state, now_nanos) == Some(self.rule().limit())
    }
}
