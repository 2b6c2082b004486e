//! [`RateLimiterService`]: one limiter per client and plan, made on the client's first request.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
use std::marker::PhantomData;

use super::builder::ServiceBuilder;
use super::client_map::ClientMap;
use super::plan_table::{PinnedPlan, PlanTable, PlanVersion};
use super::protocol::{self, Answer, Asking, MAX_LOOKUP_TRIES, OfMethod};
#[cfg(feature = "tower")]
use super::protocol::{Checked, Reporting};
#[cfg(feature = "envoy")]
use super::protocol::{Grant, HeldAt, Reserving, Taken};
use super::store::{self, StorePlan, Stored};
use crate::clock::Clock;
use crate::decision::Admit;
use crate::error::ServiceError;
use crate::headers::LimitFigures;
use crate::method::any::AnyParams;
#[cfg(feature = "envoy")]
use crate::method::client_state::ClientState;
use crate::method::client_state::{StateRef, Version};
use crate::method::several_limits::SeveralLimits;
use crate::plans::{Together, limits_of};
use crate::sync::Word;
#[cfg(feature = "envoy")]
use crate::verdict::Reported;
#[cfg(feature = "tower")]
use crate::verdict::{Figures, Verdict};
use crate::{Algorithm, Decision, MonotonicClock, PlanStats, Rule, SipState};

/// Rate limits many clients, each by the rule of its plan.
///
/// The service owns one limiter per client and plan, made on the client's first request under
/// for and the plan's rule. Under the token bucket, the fixed window and the sliding window
/// counter, a plan's clients are kept in a table of fixed size
/// ([`ServiceBuilder::capacity`]), one 16-byte slot per client, allocated when the service is
/// built: a request for a known client is a probe of at most two buckets and the limiter's own
/// lock-free decision, with no allocation and no lock; a new client takes a free or idle slot,
/// else evicts the client closest to fresh among those its key may displace (see
/// [`RateLimiterService::evictions`]). The sliding log's clients, and those of a plan of several
/// limits, are kept in a lock-free [`papaya::HashMap`].
///
/// A client's plan is the one its request names. A client moved to another plan starts afresh
/// under it, from its next request; what it used under the old plan stays with the old plan's
/// limiter (until that is evicted as idle), so moving back and forth never grants more than each
/// plan's own limit. A change of a plan's rule ([`RateLimiterService::set_rule`]) starts each of
/// its clients afresh under the new rule.
///
/// - `K`: the client key (an IP address, an API key...). Requests look it up by any borrowed form
///   (`&str` for `String` keys) without copying; the key is copied once, on the first request.
/// - `P`: the plan, the user's own type (an enum like `Tier { Free, Pro }`). Plans are found by
///   equality among the service's few plans.
/// - `C`: the clock, shared by every client so that all agree on window alignment.
/// - `S`: the hasher. The default is randomly seeded, so clients cannot pick keys that collide
///   (client keys are attacker-controlled input in a proxy).
///
/// # Examples
///
/// ```
/// use tollgate::{Algorithm, FakeClock, RateLimiterService, Rule};
///
/// #[derive(Debug, PartialEq, Eq)]
/// enum Tier { Free, Pro }
///
/// let service = RateLimiterService::new(
///     Algorithm::TokenBucket,
///     [(Tier::Free, Rule::per_second(5)?), (Tier::Pro, Rule::per_second(50)?)],
///     FakeClock::new(),
/// )?;
/// let allowed = (0..10).filter(|_| service.allow("alice", &Tier::Free).unwrap()).count();
/// assert_eq!(allowed, 5);
/// assert!(service.allow("bob", &Tier::Pro)?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RateLimiterService<K, P, C = MonotonicClock, S = SipState> {
    /// Each plan's limits and its own map of clients: a lookup hashes only the client's key,
    /// and each entry stores the key once.
    pub(super) plans: PlanTable<K, P, S>,
    pub(super) clock: C,
    /// The latest clock reading any sweep or insert retired limiters at, or an eviction's
    /// victim had counted permits up to (no later than the reading of its last grant). New
    /// limiters are made as of it, so that one replacing a retired limiter is at least as strict
    /// for every reading, even one older than the sweep's (a clock stepped back, or another
    /// core's counter slightly behind), and one replacing an evicted limiter holds at most one
    /// limit's worth more.
    pub(super) evicted_up_to: Word,
    /// Hashes keys for the plans' stores (each plan's map has a copy of its own).
    pub(super) hasher: S,
    /// This service's number, unique in the process: a plan's index found by one service is
    /// used only by it (see `tower::KnownPlan`).
    #[cfg(feature = "tower")]
    pub(super) id: u64,
}

impl<K, P, C, S> fmt::Debug for RateLimiterService<K, P, C, S>
where
    K: Hash + Eq,
    P: fmt::Debug,
    C: fmt::Debug,
    S: BuildHasher,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiterService")
            .field("plans", &self.plans)
            .field("clock", &self.clock)
            .field("clients", &self.plans.clients())
            .finish()
    }
}

impl<K, P, C> RateLimiterService<K, P, C>
where
    K: Hash + Eq,
    P: Eq + fmt::Debug,
    C: Clock,
{
    /// A service applying `algorithm`, with one rule per plan, reading time from `clock`.
    ///
    /// # Errors
    ///
    /// [`ServiceError::Plan`] when no plan is given, a plan is given twice, or the method
    /// cannot honour a plan's rule (naming the plan).
    pub fn new(
        algorithm: Algorithm,
        rules: impl IntoIterator<Item = (P, Rule)>,
        clock: C,
    ) -> Result<Self, ServiceError> {
        ServiceBuilder::new(algorithm, clock).plans(rules).build()
    }
}

impl<K, P, C, S> RateLimiterService<K, P, C, S>
where
    K: Hash + Eq,
    P: Eq + fmt::Debug,
    C: Clock,
    S: BuildHasher,
{
    /// The most limits one plan may have (see [`ServiceBuilder::plan_limits`]).
    pub const MAX_LIMITS: usize = SeveralLimits::MAX_LIMITS;

    /// The method this service applies.
    pub fn algorithm(&self) -> Algorithm {
        self.plans.algorithm()
    }

    /// The current rule of `plan`, if the service has it.
    pub fn rule(&self, plan: &P) -> Option<Rule> {
        let index = self.plans.index_of(plan)?;
        Some(self.plans.read(index).first().rule())
    }

    /// The service's plans, in the order they were given.
    pub fn plans(&self) -> impl Iterator<Item = &P> {
        self.plans.plans()
    }

    /// The clock this service reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// How many clients the service holds a limiter for (a scan of every plan's table: a
    /// figure for monitoring, not for the request path).
    pub fn len(&self) -> usize {
        self.plans.clients()
    }

    /// How many clients were evicted so far: a new client found every slot its key may use
    /// taken by a client that was not idle, and took the slot of the one closest to fresh (see
    /// [`ServiceBuilder::capacity`]). Clients whose slot is reused while idle are not counted:
    /// that changes no answer.
    pub fn evictions(&self) -> u64 {
        self.plans.evictions()
    }

    /// Whether the service holds no client.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counts of allowed and denied decisions under `plan` since the service was made; `None`
    /// for a plan the service does not have, or when the service was not built to count
    /// ([`ServiceBuilder::count_decisions`]: counting costs each decision an atomic add, which
    /// a service pays only when asked).
    pub fn stats(&self, plan: &P) -> Option<PlanStats> {
        self.plans.stats(self.plans.index_of(plan)?)
    }

    /// Replaces `plan`'s rule, from each of its clients' next request on.
    ///
    /// A client whose state was made under the old rule starts afresh under the new one: what it
    /// used under the old rule is forgotten. The change can therefore grant a client at most one
    /// window's worth of the new rule beyond what it had already used; no more, because the old
    /// state is retired (no request can still be granted on it) before the fresh one is made,
    /// and a request uses a state only if it was made under the rule in force after its lookup.
    ///
    /// Setting the rule a plan already has is no change: its clients keep their state (so a
    /// configuration reloaded unchanged resets nobody).
    ///
    /// # Errors
    ///
    /// [`ServiceError::UnknownPlan`] when the service has no such plan,
    /// [`ServiceError::Plan`] when its method cannot honour `rule` (the old rule stays),
    /// [`ServiceError::TooManyRuleChanges`] when the plan's limits have already changed
    /// 65,535 times (each client's slot records the version its state was made under in 16
    /// bits, beside the key's fingerprint, which keeps a client at 16 bytes).
    pub fn set_rule(&self, plan: &P, rule: Rule) -> Result<(), ServiceError> {
        self.set_limits(plan, [rule])
    }

    /// Replaces `plan`'s limits (one or several, enforced together), as [`set_rule`] does.
    /// The same limits in another order are a change (the order is the plan's: the headers list
    /// its limits in it), and start each client afresh.
    ///
    /// # Errors
    ///
    /// As [`set_rule`], and [`ServiceError::Plan`] for limits a plan cannot have (too few, too
    /// many, one twice, or several under the sliding window log).
    ///
    /// [`set_rule`]: RateLimiterService::set_rule
    pub fn set_limits(
        &self,
        plan: &P,
        limits: impl IntoIterator<Item = Rule>,
    ) -> Result<(), ServiceError> {
        let index = self.plan_index(plan)?;
        let rules: Vec<Rule> = limits.into_iter().collect();
        let limits = limits_of(plan, &rules, Together::GivingBack, |rule| {
            self.plans.params_for(rule)
        })?;
        self.plans
            .set_limits(index, &limits)
            .map_err(|_| ServiceError::TooManyRuleChanges {
                plan: format!("{plan:?}"),
                max: u64::from(Version::MAX),
            })?;
        Ok(())
    }

    /// The current limits of `plan`, in order, if the service has it.
    pub fn limits(&self, plan: &P) -> Option<Vec<Rule>> {
        let index = self.plans.index_of(plan)?;
        let limits = self.plans.read(index);
        Some(limits.as_slice().iter().map(AnyParams::rule).collect())
    }

    /// [`RateLimiterService::acquire`], answering as `T` does (see [`Answer`]).
    ///
    /// A known client's state is in its home bucket of the plan's store: that look, and the
    /// decision on the state it finds (`store::decide_at_home`), is all this inlines into its
    /// entry point (`allow`, `acquire`, ...). Everything else (the other bucket, an insert, a
    /// plan of several limits, a retry) is [`RateLimiterService::decide_at_length`], called out
    /// of line. The look at home reads the home lock's count before it, so where it finds no
    /// tag of the key's, that step takes the count and looks at the other bucket alone, or at
    /// neither where the lock's word says that no insert of its keys went outside home (see
    /// `store::decide_beyond_home`): a first request looks at its home bucket once. Inlined,
    /// the insert's many live values made the compiler save registers and spill values on every
    /// lookup: 32 instructions of 297 (default release), 33 of 293 (thin LTO).
    #[inline(always)]
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
        self.decide_in(client, plan, index, n)
    }

    /// [`RateLimiterService::decide`] under the plan at `index` (which is `plan`'s).
    #[inline(always)]
    pub(super) fn decide_in<Q, T: Answer>(
        &self,
        client: &Q,
        plan: &P,
        index: usize,
        n: u64,
    ) -> Result<T, ServiceError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.hash_of(client);
        let mut absent_at_home = None;
        if let Some(stored) = self.plans.stored(index) {
            let place = stored.store.place(hash);
            let asking = self.asking(index, n);
            // The token bucket, named in the request's type (see `OfMethod`); the other
            // methods' lookups decide as any method's.
            let answer = if self.plans.algorithm() == Algorithm::TokenBucket {
                store::decide_at_home(
                    stored.store,
                    place,
                    &stored,
                    &OfMethod::<_, { Algorithm::TokenBucket as u8 }>(&asking),
                )
            } else {
                store::decide_at_home(stored.store, place, &stored, &asking)
            };
            match answer {
                Ok(answer) => return Ok(answer),
                Err(absent) => absent_at_home = absent,
            }
        }
        self.decide_at_length(client, plan, index, hash, n, absent_at_home)
    }

    /// The request of `n` permits under the plan at `index`, its answer counted in the plan's
    /// decision counts (read once, here) where the service keeps them.
    #[inline(always)]
    fn asking<T: Answer>(&self, index: usize, n: u64) -> Asking<'_, T, C> {
        Asking {
            n,
            clock: &self.clock,
            counts: self.plans.counts(index),
            answer: PhantomData::<T>,
        }
    }

    /// [`RateLimiterService::decide`] where the home bucket of the plan's store (if it has one)
    /// did not answer: `client`, of keyed hash `hash`, under the plan at `index`, with what the
    /// look at home saw where it found no tag of the client's (`absent_at_home`).
    #[inline(never)]
    fn decide_at_length<Q, T: Answer>(
        &self,
        client: &Q,
        plan: &P,
        index: usize,
        hash: u64,
        n: u64,
        mut absent_at_home: Option<store::AbsentAtHome>,
    ) -> Result<T, ServiceError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let request = self.asking(index, n);
        // A plan moves between its store and its map only when its limits change between one
        // and several, so this goes round more than once only across such changes.
        for _ in 0..MAX_LOOKUP_TRIES {
            if let Some(stored) = self.plans.stored(index) {
                let place = stored.store.place(hash);
                match store::decide_beyond_home(
                    stored.store,
                    place,
                    &stored,
                    &request,
                    // The look at home's, on the first pass alone.
                    absent_at_home.take(),
                    &self.evicted_up_to,
                    |version| self.retire_in_map(index, client, version),
                    || self.clock.now_nanos(),
                ) {
                    Stored::Answer(answer) => return Ok(answer),
                    Stored::GaveUp => return Err(Self::unstable_key(plan)),
                    Stored::Elsewhere => {}
                }
            }
            // `Err(InStore)` (see `protocol::InStore`): the plan changed back to one limit meanwhile; decide in the store.
            if let Ok(answer) = self.decide_in_map(client, plan, index, &request)? {
                return Ok(answer);
            }
        }
        Err(Self::unstable_key(plan))
    }

    /// [`RateLimiterService::decide_at_length`] in the map of the plan at `index` (a plan of
    /// several limits): out of line, so that the store's path, which every first request of a
    /// plan of one limit takes, does not make room for the map's (its pin, its thread's slot).
    #[cold]
    #[inline(never)]
    fn decide_in_map<Q, T: Answer>(
        &self,
        client: &Q,
        plan: &P,
        index: usize,
        request: &Asking<'_, T, C>,
    ) -> Result<Result<T, protocol::InStore>, ServiceError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        protocol::decide(
            &self.plans.pin(index),
            client,
            request,
            &self.evicted_up_to,
            || Self::unstable_key(plan),
        )
    }

    /// The keyed hash of `client`, as `BuildHasher::hash_one` computes it, always inlined into
    /// the decision: otherwise, where a key's `Hash` has several branches (the tower layer's
    /// `ClientKey`) or its hasher many steps (std's `RandomState`), the compiler calls it out of
    /// line and passes the hasher's state through memory.
    #[inline(always)]
    // `hash_one` written out: its own inlining is the compiler's choice.
    #[allow(clippy::manual_hash_one)]
    fn hash_of<Q: Hash + ?Sized>(&self, client: &Q) -> u64 {
        let mut hasher = self.hasher.build_hasher();
        client.hash(&mut hasher);
        hasher.finish()
    }

    /// Retires and removes `client`'s entry in the map of the plan at `index`, if it has one
    /// made under a version of the plan's limits up to `version`: before a state is put in the
    /// plan's store under `version`, so that a request still holding the map's entry (made under
    /// the plan's earlier limits, of several) cannot be granted on it. An entry made under a
    /// later version is the client's current state (the limits changed again, to several, after
    /// this request read them): it stays, and the request, whose insert then finds the limits
    /// changed, is decided on it. A lookup only where the plan has had several limits (read
    /// after the plan's version: see `PlanTable::had_several`).
    #[inline]
    fn retire_in_map<Q>(&self, index: usize, client: &Q, version: Version)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.plans.had_several(index) {
            self.retire_in_map_apart(index, client, version);
        }
    }

    /// [`RateLimiterService::retire_in_map`] past its check: out of line, so that an insert into
    /// the store (every first request) does not make room for the map's look (its pin, its
    /// thread's slot), which only a plan that has had several limits makes.
    #[cold]
    #[inline(never)]
    fn retire_in_map_apart<Q>(&self, index: usize, client: &Q, version: Version)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let pinned = self.plans.pin(index);
        if let Some(entry) = pinned.clients().get(client, pinned.guard())
            && entry.state.version() <= version
        {
            pinned.head().first.retire_now(&entry.state);
            pinned
                .clients()
                .remove_if_same(client, entry, pinned.guard());
        }
    }

    /// The error of a decision that gave up looking its client up (see [`MAX_LOOKUP_TRIES`]);
    /// out of line, so that the decision's own code stays small.
    #[cold]
    #[inline(never)]
    fn unstable_key(plan: &P) -> ServiceError {
        ServiceError::UnstableKey {
            plan: format!("{plan:?}"),
            tries: MAX_LOOKUP_TRIES,
        }
    }

    /// Removes every limiter that is indistinguishable from a fresh one (a full bucket, a window
    /// that is over, a log whose entries have all expired), and every one made under an earlier
    /// rule of its plan; returns how many.
    ///
    /// Invisible to clients: each limiter is first *retired* by an exchange on its own state, the
    /// same word(s) an acquire changes, so a limiter that is admitting is never removed, and an
    /// acquire that meets a retired limiter moves to a fresh one, made as of this sweep's clock
    /// reading, which answers as the retired one would have (and no more generously to a reading
    /// older than the sweep's). The fixed tables of one-word states never need the sweep to take
    /// new clients (an insert reuses idle slots itself): there it frees the slots of idle clients,
    /// so that [`len`](RateLimiterService::len) counts the active ones, and of clients of earlier
    /// rules. The maps of the sliding log and of plans of several limits grow with their
    /// clients: there the sweep keeps memory bounded by the clients active within one window,
    /// however many distinct clients pass through.
    pub fn sweep(&self) -> usize {
        let now_nanos = self.clock.now_nanos();
        let plans = (0..self.plans.len()).map(|index| self.plans.pin(index));
        let from_maps = protocol::sweep(&self.evicted_up_to, now_nanos, plans);
        let from_stores: usize = (0..self.plans.len())
            .filter_map(|index| self.plans.stored(index))
            .map(|stored| {
                stored
                    .store
                    .sweep(&stored.head(), now_nanos, &self.evicted_up_to)
            })
            .sum();
        from_maps + from_stores
    }

    /// The plan's current limits, and `client`'s state if it was made under them: read once,
    /// after the lookup, as `decide` does (see there), so that every figure taken from them
    /// comes from one version.
    fn current_state<'p, Q>(
        &'p self,
        index: usize,
        pinned: &'p PinnedPlan<'_, K, S>,
        client: &Q,
    ) -> (PlanVersion, Option<LookedState<'p>>)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let entry = pinned.clients().get(client, pinned.guard());
        let stored = self.plans.stored(index).and_then(|stored| {
            let place = stored.store.place(self.hash_of(client));
            stored.store.find(place)
        });
        let limits = pinned.limits();
        let state = match stored {
            Some((version, word)) if !limits.has_several() => {
                (version == limits.version()).then(|| LookedState::Stored(Word::new(word)))
            }
            _ => entry
                .filter(|entry| entry.state.version() == limits.version())
                .map(|entry| LookedState::Entry(StateRef::from(&entry.state))),
        };
        (limits, state)
    }

    /// The instant new limiters are made as of (see `protocol::made_as_of`).
    #[inline]
    fn made_as_of(&self) -> u64 {
        protocol::made_as_of(&self.evicted_up_to)
    }

    /// The index of `plan` in this service's table, with the service's number: what
    /// [`RateLimiterService::acquire_verdict_in`] takes to skip comparing plans.
    #[cfg(feature = "tower")]
    pub(crate) fn plan_found(&self, plan: &P) -> Option<(u64, usize)> {
        self.plans.index_of(plan).map(|index| (self.id, index))
    }

    #[inline]
    pub(super) fn plan_index(&self, plan: &P) -> Result<usize, ServiceError> {
        self.plans
            .index_of(plan)
            .ok_or_else(|| ServiceError::UnknownPlan {
                plan: format!("{plan:?}"),
            })
    }

    /// Takes one permit for `client` under `plan`'s rule; `Ok(false)` when it is denied.
    ///
    /// The client's limiter is made on its first request.
    ///
    /// # Errors
    ///
    /// [`ServiceError::UnknownPlan`] when the service has no such plan.
    #[inline]
    pub fn allow<Q>(&self, client: &Q, plan: &P) -> Result<bool, ServiceError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.decide::<Q, Admit>(client, plan, 1)
            .map(|admit| admit == Admit::Granted)
    }

    /// Takes `n` permits for `client` under `plan`'s rule, all or nothing (see
    /// [`Limiter::try_acquire_n`](crate::Limiter::try_acquire_n) for `n = 0` and `n` above the
    /// limit). Neither attempt takes anything, so neither makes a limiter for a client the
    /// service does not hold: each is answered from a fresh one, and takes no place in the store
    /// (and evicts no one) however many distinct clients make it.
    ///
    /// # Errors
    ///
    /// [`ServiceError::UnknownPlan`] when the service has no such plan.
    #[inline]
    pub fn acquire<Q>(&self, client: &Q, plan: &P, n: u64) -> Result<Decision, ServiceError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.decide::<Q, Decision>(client, plan, n)
    }

    /// Takes `n` permits for `client` under `plan`, as [`RateLimiterService::acquire`] does, and
    /// answers with what a response reports of the decision: under [`Figures::OnRefusal`], a
    /// grant is [`Verdict::allowed`] and a refusal carries its figures; under [`Figures::Always`],
    /// every verdict does (for a plan of several limits, each limit's, read in the same lookup).
    #[cfg(feature = "tower")]
    #[inline]
    pub(crate) fn acquire_verdict<Q>(
        &self,
        client: &Q,
        plan: &P,
        n: u64,
        figures: Figures,
    ) -> Result<Verdict, ServiceError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let index = self.plan_index(plan)?;
        self.verdict_in(client, plan, index, n, figures)
    }

    /// [`RateLimiterService::acquire_verdict`] of the plan [`RateLimiterService::plan_found`]
    /// answered `found` for. Where `found` is another service's, `plan` is looked up as usual.
    #[cfg(feature = "tower")]
    #[inline]
    pub(crate) fn acquire_verdict_in<Q>(
        &self,
        client: &Q,
        plan: &P,
        (service, index): (u64, usize),
        n: u64,
        figures: Figures,
    ) -> Result<Verdict, ServiceError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if service != self.id {
            return self.acquire_verdict(client, plan, n, figures);
        }
        self.verdict_in(client, plan, index, n, figures)
    }

    /// [`RateLimiterService::acquire_verdict`] under the plan at `index` (which is `plan`'s).
    #[cfg(feature = "tower")]
    #[inline(always)]
    fn verdict_in<Q>(
        &self,
        client: &Q,
        plan: &P,
        index: usize,
        n: u64,
        figures: Figures,
    ) -> Result<Verdict, ServiceError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match figures {
            Figures::Always => self
                .decide_in::<Q, Reporting>(client, plan, index, n)
                .map(|Reporting(reported)| Verdict::from(reported)),
            Figures::OnRefusal => self
                .decide_in::<Q, Checked>(client, plan, index, n)
                .map(|Checked(verdict)| verdict),
        }
    }

    /// Takes `n` permits for `client` under `plan`, as [`RateLimiterService::acquire`] does, and
    /// answers with the decision and every figure a response reports of it: for a plan of
    /// several limits, each limit's, read in the same lookup.
    #[cfg(feature = "envoy")]
    pub(crate) fn acquire_reported<Q>(
        &self,
        client: &Q,
        plan: &P,
        n: u64,
    ) -> Result<Reported, ServiceError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.decide::<Q, Reporting>(client, plan, n)
            .map(|Reporting(reported)| reported)
    }

    /// Takes `n` permits for `client` under `plan`, as [`RateLimiterService::acquire_reported`]
    /// does, and for a grant, what [`RateLimiterService::give_back`]
    /// needs to undo it: `None` for the sliding log, which cannot, and for a refusal or an
    /// attempt of 0 permits, which took nothing.
    #[cfg(feature = "envoy")]
    pub(crate) fn reserve_reported<Q>(
        &self,
        client: &Q,
        plan: &P,
        n: u64,
    ) -> Result<(Reported, Option<Grant>), ServiceError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.decide::<Q, Reserving>(client, plan, n)
            .map(|Reserving(reported, grant)| (reported, grant))
    }

    /// Gives `n` permits back to `client` under `plan` (a refund of permits its requests took
    /// earlier: Envoy's `is_negative_hits`), by each limit's own rule (`Method::refund`): never
    /// past what the limit still counts, so that no state becomes more generous than a fresh
    /// one; nothing under the sliding log. Makes no state for a client the service does not
    /// hold (a fresh one has nothing to refund). Whether the client's state was found.
    #[cfg(feature = "envoy")]
    pub(crate) fn refund<Q>(&self, client: &Q, plan: &P, n: u64) -> Result<bool, ServiceError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let index = self.plan_index(plan)?;
        if let Some(stored) = self.plans.stored(index) {
            let place = stored.store.place(self.hash_of(client));
            let found = store::with_state(stored.store, place, &stored, |limit, slot| {
                limit.refund(StateRef::Word(slot), n, &self.clock);
            });
            if found {
                return Ok(true);
            }
        }
        let pinned = self.plans.pin(index);
        let Some((entry, limits)) = Self::entry_under_current_limits(&pinned, client) else {
            return Ok(false);
        };
        match &entry.state {
            ClientState::Several(_, several) => several.refund(limits.as_slice(), n, &self.clock),
            state => limits.first().refund(StateRef::from(state), n, &self.clock),
        }
        Ok(true)
    }

    /// `client`'s entry in the map of the plan `pinned`, with the plan's current limits, if the
    /// entry was made under them (a later write to it must be under those limits).
    #[cfg(feature = "envoy")]
    fn entry_under_current_limits<'p, Q>(
        pinned: &'p PinnedPlan<'_, K, S>,
        client: &Q,
    ) -> Option<(&'p protocol::ClientEntry, PlanVersion)>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let entry = pinned.clients().get(client, pinned.guard())?;
        let limits = pinned.limits();
        (entry.state.version() == limits.version()).then_some((entry, limits))
    }

    /// Undoes `grant` (made by [`RateLimiterService::reserve_reported`] for `client` under
    /// `plan`): on the very state it was decided on, while that state is still the client's
    /// under the same limits, by each method's own undo (`Method::undo`): exactly while no other
    /// decision has landed on the state since, and otherwise never by more than leaves the state
    /// as strict as it would be had the grant not been made (the token bucket then keeps the
    /// permits; the fixed window and the sliding window counter take them off the window they
    /// were counted in, if it is still current). Nothing where the state has gone since (evicted,
    /// swept, or retired by a rule change): what the grant took went with it, and the client's
    /// next state is made afresh. Whether the state was found.
    #[cfg(feature = "envoy")]
    pub(crate) fn give_back<Q>(&self, client: &Q, plan: &P, grant: &Grant) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let Ok(index) = self.plan_index(plan) else {
            return false;
        };
        let Grant {
            n,
            now_nanos,
            ref taken,
            held,
        } = *grant;
        match (held, taken) {
            (HeldAt::Slot(holding), Taken::One(decision, reservation)) => {
                let Some(stored) = self.plans.stored(index) else {
                    return false;
                };
                store::give_back(stored.store, holding, &stored, |limit, slot| {
                    limit.undo(StateRef::Word(slot), n, decision, *reservation, now_nanos);
                })
            }
            (HeldAt::Entry { address, version }, taken) => {
                let pinned = self.plans.pin(index);
                // The client's entry now, if it is the one the grant was decided on: the same
                // address while the map holds it. (An entry removed since, whose address a later
                // entry reuses, is told apart by what removed it: a rule change changes the
                // version; a sweep removes only an idle entry, which the grant's permits had
                // left already, so an undo finds nothing of theirs to take back.)
                let Some((entry, limits)) = Self::entry_under_current_limits(&pinned, client)
                else {
                    return false;
                };
                if std::ptr::from_ref(entry) as usize != address || limits.version() != version {
                    return false;
                }
                match (&entry.state, taken) {
                    (ClientState::Several(_, several), Taken::Several(reservations)) => {
                        several.give_back(limits.as_slice(), n, &reservations[..], now_nanos);
                    }
                    (state, Taken::One(decision, reservation)) => {
                        limits.first().undo(
                            StateRef::from(state),
                            n,
                            decision,
                            *reservation,
                            now_nanos,
                        );
                    }
                    _ => return false,
                }
                true
            }
            _ => false,
        }
    }

    /// Reports, taking nothing, what one permit for `client` under `plan` would get now. A client
    /// the service does not hold under `plan` (or holds under an earlier rule) is reported as
    /// fresh, and nothing is added or changed.
    ///
    /// # Errors
    ///
    /// [`ServiceError::UnknownPlan`] when the service has no such plan.
    pub fn peek<Q>(&self, client: &Q, plan: &P) -> Result<Decision, ServiceError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let index = self.plan_index(plan)?;
        let pinned = self.plans.pin(index);
        let (limits, looked) = self.current_state(index, &pinned, client);
        let state = looked.as_ref().map(LookedState::state);
        if limits.has_several() {
            if let Some(StateRef::Several(several)) = state
                && let Ok(decision) = several.peek(limits.as_slice(), &self.clock)
            {
                return Ok(decision);
            }
            let fresh = SeveralLimits::fresh(limits.as_slice(), self.made_as_of());
            if let Ok(decision) = fresh.peek(limits.as_slice(), &self.clock) {
                return Ok(decision);
            }
        }
        let params = limits.first();
        if let Some(state) = state
            && let Ok(decision) = params.peek(state, &self.clock)
        {
            return Ok(decision);
        }
        Ok(params.fresh_report(false, self.made_as_of(), &self.clock))
    }

    /// The IETF `RateLimit-Policy` and `RateLimit` field values for `client` under `plan`, as
    /// they stand now (after the request's own decision): one list item per limit of the plan
    /// (draft-ietf-httpapi-ratelimit-headers), named `policy` when the plan has one limit and
    /// `policy-WINDOW` (`"pro-1s"`, `"pro-1h"`) when it has several. Takes nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Algorithm, FakeClock, Rule, ServiceBuilder};
    ///
    /// let service = ServiceBuilder::new(Algorithm::TokenBucket, FakeClock::new())
    ///     .plan_limits("pro", [Rule::per_second(10)?, Rule::per_hour(1000)?])
    ///     .build::<u64>()?;
    /// assert!(service.allow(&7, &"pro")?);
    /// let (policy, ratelimit) = service.ratelimit_headers(&7, &"pro", "pro")?;
    /// assert_eq!(policy, r#""pro-1s";q=10;w=1, "pro-1h";q=1000;w=3600"#);
    /// assert_eq!(ratelimit, r#""pro-1s";r=9;t=1, "pro-1h";r=999;t=4"#);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ServiceError::UnknownPlan`] for a plan the service does not have, and
    /// [`ServiceError::InvalidPolicyName`] for a `policy` that is not printable ASCII.
    pub fn ratelimit_headers<Q>(
        &self,
        client: &Q,
        plan: &P,
        policy: &str,
    ) -> Result<(String, String), ServiceError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let figures: Vec<LimitFigures> = self
            .peek_each_limit(client, plan)?
            .iter()
            .map(LimitFigures::of)
            .collect();
        crate::headers::policy_list(policy, &figures)
            .map_err(|source| ServiceError::InvalidPolicyName { source })
    }

    /// What one permit for `client` under `plan` would get now from each of the plan's limits,
    /// in the plan's order, taking nothing (a client the service does not hold, or holds under
    /// an earlier rule, as fresh).
    pub(crate) fn peek_each_limit<Q>(
        &self,
        client: &Q,
        plan: &P,
    ) -> Result<Vec<Decision>, ServiceError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.look_each_limit(client, plan, false)
            .map(|(each, _)| each)
    }

    /// [`RateLimiterService::peek_each_limit`], and, in the same lookup, whether taking
    /// permits now would move one of the client's windows forward (see `Method::would_roll`;
    /// false for a client the service does not hold).
    #[cfg(feature = "envoy")]
    pub(crate) fn peek_each_limit_and_roll<Q>(
        &self,
        client: &Q,
        plan: &P,
    ) -> Result<(Vec<Decision>, bool), ServiceError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.look_each_limit(client, plan, true)
    }

    /// Each limit's look, and whether a taking would roll a window when `rolls` is asked.
    fn look_each_limit<Q>(
        &self,
        client: &Q,
        plan: &P,
        rolls: bool,
    ) -> Result<(Vec<Decision>, bool), ServiceError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let index = self.plan_index(plan)?;
        let pinned = self.plans.pin(index);
        let (current, looked) = self.current_state(index, &pinned, client);
        let state = looked.as_ref().map(LookedState::state);
        let limits = current.as_slice();
        let would_roll = rolls
            && match state {
                Some(StateRef::Several(several)) => several.would_roll(limits, &self.clock),
                Some(state) => limits[0].would_roll(state, &self.clock),
                None => false,
            };
        let each = state.and_then(|state| match state {
            StateRef::Several(several) => several
                .peek_each(limits, &self.clock)
                .ok()
                .map(Iterator::collect),
            state => limits[0]
                .peek(state, &self.clock)
                .ok()
                .map(|decision| vec![decision]),
        });
        let each = each.unwrap_or_else(|| {
            let since = self.made_as_of();
            limits
                .iter()
                .map(|limit| limit.fresh_report(false, since, &self.clock))
                .collect()
        });
        Ok((each, would_roll))
    }
}

/// A client's state for a look: a snapshot of its word in the plan's store (a look reads the
/// word once, so the snapshot answers as the word did), or its entry's in the map.
enum LookedState<'p> {
    Stored(Word),
    Entry(StateRef<'p>),
}

impl LookedState<'_> {
    /// The state to look at.
    fn state(&self) -> StateRef<'_> {
        match self {
            LookedState::Stored(word) => StateRef::Word(word),
            LookedState::Entry(state) => *state,
        }
    }
}

#[cfg(all(test, feature = "envoy"))]
mod give_back {
    use std::time::Duration;

    use crate::{Algorithm, FakeClock, Rule, ServiceBuilder};

    fn remaining(
        service: &crate::RateLimiterService<u64, &'static str, FakeClock>,
        client: u64,
    ) -> u64 {
        service.peek(&client, &"plan").expect("a plan").remaining()
    }

    #[test]
    fn a_grant_given_back_untouched_restores_every_permit() {
        for method in [
            Algorithm::TokenBucket,
            Algorithm::FixedWindow,
            Algorithm::SlidingWindowCounter,
        ] {
            let service = ServiceBuilder::new(method, FakeClock::new())
                .plan("plan", Rule::per_hour(5).expect("a rule"))
                .build::<u64>()
                .expect("a service");
            let (_, grant) = service.reserve_reported(&1, &"plan", 3).expect("a plan");
            let grant = grant.expect("a grant of a method that can give back");
            assert_eq!(remaining(&service, 1), 2, "{method:?}");
            assert!(service.give_back(&1, &"plan", &grant), "{method:?}");
            assert_eq!(remaining(&service, 1), 5, "{method:?}: every permit back");
        }
    }

    #[test]
    fn a_window_gives_back_past_a_later_grant_and_a_bucket_keeps_its_permits() {
        for (method, after) in [
            // The window takes the grant's 3 off the window they were counted in.
            (Algorithm::FixedWindow, 4),
            (Algorithm::SlidingWindowCounter, 4),
            // The bucket cannot tell what the later grant started from: it keeps them.
            (Algorithm::TokenBucket, 1),
        ] {
            let service = ServiceBuilder::new(method, FakeClock::new())
                .plan("plan", Rule::per_hour(5).expect("a rule"))
                .build::<u64>()
                .expect("a service");
            let (_, grant) = service.reserve_reported(&1, &"plan", 3).expect("a plan");
            let grant = grant.expect("a grant");
            assert!(service.allow(&1, &"plan").expect("a plan"));
            assert!(service.give_back(&1, &"plan", &grant), "{method:?}");
            assert_eq!(remaining(&service, 1), after, "{method:?}");
        }
    }

    #[test]
    fn a_grant_whose_state_was_evicted_gives_nothing_to_the_next_holder() {
        // One bucket of 8 slots: a ninth client evicts one of eight spent ones.
        let service = ServiceBuilder::new(Algorithm::TokenBucket, FakeClock::new())
            .plan("plan", Rule::per_hour(2).expect("a rule"))
            .capacity(8)
            .build::<u64>()
            .expect("a service");
        let grants: Vec<_> = (0..8_u64)
            .map(|client| {
                let (_, grant) = service
                    .reserve_reported(&client, &"plan", 2)
                    .expect("a plan");
                (client, grant.expect("a grant"))
            })
            .collect();
        assert!(
            service
                .acquire(&100, &"plan", 2)
                .expect("a plan")
                .is_allowed()
        );
        assert_eq!(service.evictions(), 1);
        let found = grants
            .iter()
            .filter(|(client, grant)| service.give_back(client, &"plan", grant))
            .count();
        // After an eviction no grant made before it is given back in the store (see
        // `store::give_back`: its holding could not be told from a later one of the same tag).
        assert_eq!(found, 0, "a grant given back past an eviction");
        assert_eq!(
            remaining(&service, 100),
            0,
            "the newcomer's spent permits stay spent"
        );
    }

    #[test]
    fn a_grant_made_after_an_eviction_is_given_back() {
        let service = ServiceBuilder::new(Algorithm::FixedWindow, FakeClock::new())
            .plan("plan", Rule::per_hour(2).expect("a rule"))
            .capacity(8)
            .build::<u64>()
            .expect("a service");
        for client in 0..9_u64 {
            assert!(
                service
                    .acquire(&client, &"plan", 2)
                    .expect("a plan")
                    .is_allowed()
            );
        }
        assert_eq!(service.evictions(), 1);
        let (_, grant) = service.reserve_reported(&8, &"plan", 0).expect("a plan");
        assert!(
            grant.is_none(),
            "an attempt of 0 permits takes nothing to give back"
        );
        // A first request that evicts to make room: its own eviction comes before its grant,
        // which is given back.
        let (_, grant) = service.reserve_reported(&100, &"plan", 1).expect("a plan");
        let grant = grant.expect("a grant");
        assert_eq!(service.evictions(), 2);
        assert!(
            service.give_back(&100, &"plan", &grant),
            "made after its eviction"
        );
        assert_eq!(remaining(&service, 100), 2);
        // A grant made before another eviction is not.
        let (_, grant) = service.reserve_reported(&100, &"plan", 1).expect("a plan");
        let grant = grant.expect("a grant");
        assert!(
            service
                .acquire(&101, &"plan", 1)
                .expect("a plan")
                .is_allowed()
        );
        assert_eq!(service.evictions(), 3);
        assert!(
            !service.give_back(&100, &"plan", &grant),
            "made before an eviction"
        );
    }

    #[test]
    fn a_grant_made_under_an_earlier_rule_gives_nothing_back() {
        let service = ServiceBuilder::new(Algorithm::FixedWindow, FakeClock::new())
            .plan("plan", Rule::per_hour(5).expect("a rule"))
            .build::<u64>()
            .expect("a service");
        let (_, grant) = service.reserve_reported(&1, &"plan", 3).expect("a plan");
        let grant = grant.expect("a grant");
        service
            .set_rule(&"plan", Rule::per_hour(4).expect("a rule"))
            .expect("a change");
        assert!(
            service
                .acquire(&1, &"plan", 4)
                .expect("a plan")
                .is_allowed()
        );
        assert!(!service.give_back(&1, &"plan", &grant));
        assert_eq!(
            remaining(&service, 1),
            0,
            "the state of the later rule is untouched"
        );
    }

    #[test]
    fn a_plan_of_several_limits_gives_back_to_each() {
        let clock = FakeClock::new();
        let service = ServiceBuilder::new(Algorithm::TokenBucket, clock.clone())
            .plan_limits(
                "plan",
                [
                    Rule::new(3, Duration::from_secs(1)).expect("a rule"),
                    Rule::per_hour(10).expect("a rule"),
                ],
            )
            .build::<u64>()
            .expect("a service");
        let (_, grant) = service.reserve_reported(&1, &"plan", 3).expect("a plan");
        let grant = grant.expect("a grant");
        assert!(service.give_back(&1, &"plan", &grant));
        let each = service.peek_each_limit(&1, &"plan").expect("a plan");
        let left: Vec<u64> = each.iter().map(|decision| decision.remaining()).collect();
        assert_eq!(left, [3, 10]);
    }

    #[test]
    fn the_sliding_log_makes_no_grant_to_give_back() {
        let service = ServiceBuilder::new(Algorithm::SlidingWindowLog, FakeClock::new())
            .plan("plan", Rule::per_hour(5).expect("a rule"))
            .build::<u64>()
            .expect("a service");
        let (reported, grant) = service.reserve_reported(&1, &"plan", 2).expect("a plan");
        assert!(reported.decision().is_allowed());
        assert!(grant.is_none());
    }
}

#[cfg(test)]
mod of_method {
    use super::{OfMethod, store};
    use crate::decision::Admit;
    use crate::{Algorithm, FakeClock, Rule, ServiceBuilder};

    /// The lookup of a known client names its service's method (`OfMethod`); under a limit of
    /// another method it answers nothing and writes nothing, and the full lookup decides.
    #[test]
    fn a_lookup_that_names_another_method_leaves_the_state_to_the_full_lookup() {
        let service = ServiceBuilder::new(Algorithm::TokenBucket, FakeClock::new())
            .plan("plan", Rule::per_hour(5).expect("a rule"))
            .build::<u64>()
            .expect("a service");
        assert!(service.allow(&1, &"plan").expect("a plan"));
        let remaining = || service.peek(&1, &"plan").expect("a plan").remaining();
        assert_eq!(remaining(), 4);
        let index = service.plan_index(&"plan").expect("a plan");
        let stored = service.plans.stored(index).expect("the plan's store");
        let place = stored.store.place(service.hash_of(&1_u64));
        let asking = service.asking::<Admit>(index, 1);
        let other = OfMethod::<_, { Algorithm::FixedWindow as u8 }>(&asking);
        assert_eq!(
            store::decide_at_home(stored.store, place, &stored, &other),
            Err(None),
            "the client's slot found, and answering as retired"
        );
        assert_eq!(remaining(), 4, "nothing taken under another method's name");
        let own = OfMethod::<_, { Algorithm::TokenBucket as u8 }>(&asking);
        assert_eq!(
            store::decide_at_home(stored.store, place, &stored, &own),
            Ok(Admit::Granted)
        );
        assert_eq!(remaining(), 3);
        assert!(service.allow(&1, &"plan").expect("a plan"));
        assert_eq!(remaining(), 2);
    }
}
