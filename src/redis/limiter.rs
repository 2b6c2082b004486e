//! [`RedisRateLimiter`]: the per-client service, with its state in Redis.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use super::RedisError;
use super::batch::{self, Batcher, Failed};
use super::connection::Connection;
use super::deny_cache::DenyCache;
use super::fallback::LocalFallback;
use super::policy::{Breakers, FailurePolicy, Gate, ProbeGuard, Source};
use super::script::{self, CODE_ALLOWED, CODE_DENIED, CODE_WRONG_TYPE, LimitSpec};
use super::stats::{Counters, RedisStats};
use crate::clock::duration_to_nanos;
use crate::method::several_limits::{SeveralLimits, combined};
use crate::{Algorithm, Decision, Rule};

/// What a request got, and which path decided it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "an answer says whether the request may proceed"]
pub struct Answer {
    decision: Decision,
    source: Source,
    /// Each limit's decision, in the plan's order: the first `limit_count` (0 unless Redis
    /// decided a plan of several limits); the rest repeat `decision`.
    each_limit: [Decision; SeveralLimits::MAX_LIMITS],
    limit_count: u8,
}

impl Answer {
    /// An answer whose decision says all: a plan of one limit's, or one that knows only the
    /// deciding limit (the deny cache, the failure policy).
    fn new(decision: Decision, source: Source) -> Answer {
        Answer {
            decision,
            source,
            each_limit: [decision; SeveralLimits::MAX_LIMITS],
            limit_count: 0,
        }
    }

    /// The decision, as the in-process service would report it.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// Which path decided: Redis, the deny cache, or the failure policy.
    pub fn source(&self) -> Source {
        self.source
    }

    /// Each limit's decision, in the plan's order, when Redis decided a plan of several limits
    /// (or reported the quota of a request it rejected): each limit's own figures, for
    /// responses that list every limit (the tower layer's `RateLimit` fields). Empty otherwise:
    /// for a plan of one limit, and for the deny cache and the failure policy, which know the
    /// deciding limit only; [`Answer::decision`] then says all there is.
    pub fn each_limit(&self) -> &[Decision] {
        &self.each_limit[..usize::from(self.limit_count)]
    }
}

/// One plan: its key name and its limits, each with the key suffix that names it.
#[derive(Debug)]
pub(super) struct PlanEntry<P> {
    pub(super) plan: P,
    pub(super) name: String,
    pub(super) limits: Vec<(LimitSpec, String)>,
}

impl<P> PlanEntry<P> {
    /// The plan's method as `scripts/give_back.lua` and `scripts/refund.lua` name it (every
    /// limit of a plan has the limiter's one method).
    fn method_name(&self) -> &'static str {
        self.limits
            .first()
            .map_or("", |(spec, _)| spec.give_back_name())
    }
}

/// Rate limits many clients across a fleet, each by the rules of its plan, with the state in
/// Redis: every node sharing one Redis enforces one limit together.
///
/// The same plans, rules, methods and [`Decision`]s as [`RateLimiterService`](crate::RateLimiterService) (so the response
/// headers work unchanged), asked asynchronously. See the [module docs](super) for the
/// guarantees and the key layout.
///
/// # Examples
///
/// ```no_run
/// use tollgate::redis::{FailurePolicy, RedisRateLimiter};
/// use tollgate::{Algorithm, Rule};
///
/// #[derive(Debug, PartialEq, Eq)]
/// enum Tier { Free, Pro }
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = RedisRateLimiter::builder("redis://127.0.0.1:6379", Algorithm::TokenBucket)
///     .plan(Tier::Free, Rule::per_second(5)?)
///     .plan(Tier::Pro, Rule::per_second(50)?)
///     .failure_policy(FailurePolicy::Local { share: 0.25 }) // four nodes
///     .build()
///     .await?;
/// let decision = limiter.acquire("alice", &Tier::Free, 1).await?;
/// if decision.is_denied() {
///     println!("retry in {:?}", decision.retry_after());
/// }
/// # Ok(())
/// # }
/// ```
pub struct RedisRateLimiter<P> {
    pub(super) algorithm: Algorithm,
    pub(super) plans: Vec<PlanEntry<P>>,
    pub(super) prefix: String,
    /// With any password redacted.
    pub(super) url: String,
    /// At least one; round trips take them in turn.
    pub(super) connections: Box<[Connection]>,
    pub(super) next_connection: AtomicUsize,
    pub(super) timeout: Duration,
    pub(super) policy: FailurePolicy,
    pub(super) breaker: Breakers,
    pub(super) deny_cache: Option<DenyCache>,
    /// Under [`FailurePolicy::Local`] only.
    pub(super) local: Option<LocalFallback>,
    pub(super) counters: Arc<Counters>,
    pub(super) grant_names: GrantNames,
    /// The most decisions one call carries (1: no batching).
    pub(super) batch_size: usize,
    /// The queue of batched decisions, when `batch_size` is above 1.
    pub(super) batcher: Option<Batcher>,
}

/// Names the records of the grants a limiter reserves: unique to the limiter (a random seed)
/// and to the grant (a count), so that no two grants, of this node or another, share one.
pub(crate) struct GrantNames {
    seed: u64,
    made: AtomicU64,
}

impl GrantNames {
    pub(super) fn new() -> GrantNames {
        use std::hash::BuildHasher;
        GrantNames {
            // std's keyed hasher is seeded at random per instance.
            seed: std::collections::hash_map::RandomState::new().hash_one(0_u8),
            made: AtomicU64::new(0),
        }
    }

    /// The record's key of a new grant on the keys `keys` (it shares their hash tag).
    fn next(&self, keys: &[String]) -> String {
        // Relaxed: a count that only has to differ from grant to grant.
        let count = self.made.fetch_add(1, Ordering::Relaxed);
        let first = keys.first().map_or("", String::as_str);
        format!("{first}:grant:{:016x}{count:016x}", self.seed)
    }
}

impl<P: fmt::Debug> fmt::Debug for RedisRateLimiter<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRateLimiter")
            .field("algorithm", &self.algorithm)
            .field("plans", &self.plans)
            .field("prefix", &self.prefix)
            .field("url", &self.url)
            .field("connections", &self.connections.len())
            .field("timeout", &self.timeout)
            .field("policy", &self.policy)
            .field("breaker", &self.breaker)
            .field("deny_cache", &self.deny_cache.as_ref().map(DenyCache::len))
            .field("stats", &self.counters.snapshot())
            .finish_non_exhaustive()
    }
}

/// Whether a script may commit (`acquire`), commit and report what a give-back needs
/// (`reserve`), or only report (`peek`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Acquire,
    Reserve,
    Peek,
}

impl Mode {
    fn arg(self) -> &'static str {
        match self {
            Mode::Acquire => "acquire",
            Mode::Reserve => "reserve",
            Mode::Peek => "peek",
        }
    }
}

/// A grant that Redis made by [`RedisRateLimiter::reserve`], which
/// [`RedisRateLimiter::give_back`] can undo: each key's value before and after it.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisGrant {
    n: u64,
    /// The plan's index among the limiter's plans.
    plan: usize,
    /// The limits' keys it was made on.
    keys: Vec<String>,
    /// The key of its record, which a give-back consumes.
    record: String,
    saved: Vec<SavedKey>,
}

impl fmt::Debug for RedisGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisGrant")
            .field("n", &self.n)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl RedisGrant {
    #[cfg(feature = "envoy")]
    /// Whether this grant was made on the state `earlier` left (both on one client's keys
    /// under one plan, with no decision between them): given back first, it restores exactly
    /// the state `earlier`'s give-back then restores in turn.
    pub(crate) fn follows(&self, earlier: &RedisGrant) -> bool {
        self.keys == earlier.keys
            && self
                .saved
                .iter()
                .zip(&earlier.saved)
                .any(|(this, earlier)| {
                    // A sliding log's value before lists its newest batch first.
                    this.before == earlier.after
                        || (this.before.starts_with(&earlier.after)
                            && this.before.get(earlier.after.len()) == Some(&b' '))
                })
    }
}

/// How many items of a reserving call's reply each key's [`SavedKey`] takes.
const SAVED_PER_KEY: usize = 5;

/// One key's part of a [`RedisGrant`], as `scripts/plan.lua` reports it.
#[derive(Clone, PartialEq, Eq)]
struct SavedKey {
    /// `DUMP` before the grant; empty for a missing key.
    before: Vec<u8>,
    /// When the key was to expire, in Unix milliseconds; 0 for never.
    expires_at_ms: i64,
    /// `DUMP` after the grant.
    after: Vec<u8>,
    /// The window index the grant counted in; -1 for a key without windows.
    window: i64,
    /// The key's incarnation (the windows' field `i`); empty for none.
    incarnation: Vec<u8>,
}

/// What [`RedisRateLimiter::give_back`] did for each of the plan's limits, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GivenBack {
    /// No other decision had landed on the limit's key: its value from before the grant is
    /// back, with its expiry.
    Restored,
    /// Other decisions had landed: the permits came off the window they were counted in (the
    /// windows only).
    TakenOff,
    /// Kept: the token bucket and the sliding log after another decision landed, or a window
    /// no longer counted.
    Kept,
}

impl<P> RedisRateLimiter<P> {
    /// The largest full bucket, in ticks of `1/(N/gcd(N, W))` µs, a token bucket rule may need:
    /// 2^50, so that every figure the script computes stays exact in Lua's doubles (see the
    /// [module docs](super)). A larger one is refused with [`RedisError::NotExact`].
    pub const MAX_BURST_TICKS: u64 = script::MAX_BURST_TICKS;

    /// The longest window the window methods accept, in microseconds: 2^50, so that a window's
    /// index times the window stays exact in Lua's doubles until the year 2184. A longer one is
    /// refused with [`RedisError::NotExact`].
    pub const MAX_WINDOW_MICROS: u64 = script::MAX_WINDOW_MICROS;

    /// The largest fixed-window limit: 2^53, the count a double holds exactly. A larger one is
    /// refused with [`RedisError::NotExact`].
    pub const MAX_FIXED_WINDOW_LIMIT: u64 = script::MAX_FIXED_WINDOW_LIMIT;

    /// How long after its making a grant of [`RedisRateLimiter::reserve`] can be given back
    /// (`scripts/plan.lua` keeps its record so long): 10 seconds.
    pub const GRANT_LIFETIME: Duration = Duration::from_secs(10);
}

impl<P: Eq + fmt::Debug> RedisRateLimiter<P> {
    /// The method this limiter applies.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The limits of `plan` (one, unless it was given several), in order, if the limiter has it.
    pub fn limits(&self, plan: &P) -> Option<Vec<Rule>> {
        let entry = self.plans.iter().find(|entry| entry.plan == *plan)?;
        Some(entry.limits.iter().map(|(spec, _)| spec.rule()).collect())
    }

    /// The policy applied when Redis fails.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.policy
    }

    /// The most decisions one script call carries (see
    /// [`RedisRateLimiterBuilder::batch_size`](super::RedisRateLimiterBuilder::batch_size)).
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// How the limiter's decisions were made so far.
    pub fn stats(&self) -> RedisStats {
        self.counters.snapshot()
    }

    /// The Redis keys holding `client`'s state under `plan`, one per limit (see the key layout
    /// in the [module docs](super)).
    ///
    /// # Errors
    ///
    /// [`RedisError::UnknownPlan`] for a plan the limiter does not have.
    pub fn keys(&self, client: &str, plan: &P) -> Result<Vec<String>, RedisError> {
        let (_, entry) = self.plan_entry(plan)?;
        Ok(self.keys_of(entry, client))
    }

    /// Takes one permit for `client` under `plan`; `Ok(false)` when it is denied.
    ///
    /// # Errors
    ///
    /// As [`RedisRateLimiter::decide`].
    pub async fn allow(&self, client: &str, plan: &P) -> Result<bool, RedisError> {
        Ok(self.acquire(client, plan, 1).await?.is_allowed())
    }

    /// Takes `n` permits for `client` under `plan`, all or nothing, in one round trip (or none:
    /// see [`Source`]). Every method takes batches, the sliding log included (its `n`
    /// admissions are logged at one instant). `n = 0` reports what is available and takes
    /// nothing; `n` above the limit (above any one limit of a plan of several) can never be
    /// granted and is rejected as in process, with the quota a round trip of 0 permits reads
    /// (if that round trip fails, for whatever reason, the rejection stands without the quota's
    /// figures: the request is refused either way).
    ///
    /// # Errors
    ///
    /// As [`RedisRateLimiter::decide`].
    pub async fn acquire(&self, client: &str, plan: &P, n: u64) -> Result<Decision, RedisError> {
        Ok(self.decide(client, plan, n).await?.decision)
    }

    /// [`RedisRateLimiter::acquire`], with the path that decided.
    ///
    /// # Errors
    ///
    /// [`RedisError::UnknownPlan`] for a plan the limiter does not have;
    /// [`RedisError::WrongType`] when a key holds another program's value; and, under
    /// [`FailurePolicy::Error`] only, the failure ([`RedisError::Timeout`],
    /// [`RedisError::CircuitOpen`], [`RedisError::Command`]). The other policies answer a failure
    /// with a decision.
    pub async fn decide(&self, client: &str, plan: &P, n: u64) -> Result<Answer, RedisError> {
        self.decide_inner(client, plan, n, Mode::Acquire, None)
            .await
    }

    /// [`RedisRateLimiter::decide`], keeping what it takes to give the grant back: for a
    /// request that must hold under several limiters at once (all or nothing across plans or
    /// limiters), take from each by `reserve` and, when one refuses, give back what the others
    /// granted by [`RedisRateLimiter::give_back`].
    ///
    /// The grant is `None` when nothing was taken from Redis: a refusal, `n = 0`, or an answer
    /// of the deny cache or the failure policy (a failure policy's grant is not given back).
    /// The round trip also reads each key's value before and after the grant (`DUMP`, and its
    /// expiry by `PEXPIRETIME`: Redis 7; of a sliding log, which may hold tens of thousands of
    /// batches, only the newest batch and the oldest ones a commit may drop), and writes a record of the grant beside the client's
    /// keys (a few dozen bytes, in their hash slot) that expires after
    /// [`GRANT_LIFETIME`](Self::GRANT_LIFETIME) unless given back before: the server must allow
    /// `DUMP` and `RESTORE` to this client's scripts.
    ///
    /// # Errors
    ///
    /// As [`RedisRateLimiter::decide`].
    pub async fn reserve(
        &self,
        client: &str,
        plan: &P,
        n: u64,
    ) -> Result<(Answer, Option<RedisGrant>), RedisError> {
        self.reserve_inner(client, plan, n, None).await
    }

    /// [`RedisRateLimiter::reserve`] at `now_us` microseconds (see
    /// [`RedisRateLimiter::decide_at`]). The token bucket's and the sliding log's values are
    /// times: a key deleted and made again at the same injected instant can repeat the grant's
    /// value, which a give-back then restores (on the server's clock a key made again cannot).
    ///
    /// # Errors
    ///
    /// As [`RedisRateLimiter::decide`].
    #[cfg(feature = "test-util")]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub async fn reserve_at(
        &self,
        client: &str,
        plan: &P,
        n: u64,
        now_us: u64,
    ) -> Result<(Answer, Option<RedisGrant>), RedisError> {
        self.reserve_inner(client, plan, n, Some(now_us)).await
    }

    /// Gives back `grant`, made by [`RedisRateLimiter::reserve`] for `client` under `plan`, in
    /// one round trip, and says what it did for each limit.
    ///
    /// Exact while no other decision has landed on a limit's key since the grant: the key's
    /// value from before is back, with its expiry, as if the grant had not been made (two
    /// grants on one key are each restored exactly when given back latest first). Once another
    /// decision has landed, the grant is given back only as far as that leaves the limit no
    /// more generous than had the grant not been made: the fixed window and the sliding window
    /// counter take the permits off the window they were counted in (decisions made since saw
    /// more permits taken, so what they granted stands either way); the token bucket and the
    /// sliding log keep the grant, which then leaves as any other (refilled at the bucket's
    /// rate, out of the log's window).
    ///
    /// A grant is given back at most once, and only within
    /// [`GRANT_LIFETIME`](Self::GRANT_LIFETIME) of its making: the reserving call writes a
    /// record of it, which the give-back consumes first; without the record (given back
    /// already, too old, or lost with the server's data) every limit answers
    /// [`GivenBack::Kept`]. So a give-back may be retried after a failure, whether or not the
    /// failed call reached Redis, and never gives back what a decision made on a rebuilt key
    /// took.
    ///
    /// # Errors
    ///
    /// [`RedisError::UnknownPlan`] for a plan the limiter does not have;
    /// [`RedisError::ForeignGrant`] for a grant made for another client, plan or limiter; a
    /// failed round trip as it failed ([`RedisError::Timeout`], [`RedisError::Command`]),
    /// whatever the failure policy: the grant may or may not have been given back (a retry
    /// gives it back if it was not).
    pub async fn give_back(
        &self,
        client: &str,
        plan: &P,
        grant: &RedisGrant,
    ) -> Result<Vec<GivenBack>, RedisError> {
        let (index, entry) = self.plan_entry(plan)?;
        let keys = self.keys_of(entry, client);
        if index != grant.plan || keys != grant.keys || grant.saved.len() != keys.len() {
            return Err(RedisError::ForeignGrant {
                client: client.to_owned(),
                plan: format!("{plan:?}"),
            });
        }
        self.forget_denial(index, client);
        let mut invocation = script::GIVE_BACK.prepare_invoke();
        for key in &keys {
            invocation.key(key);
        }
        invocation.key(&grant.record);
        let method = entry.method_name();
        invocation.arg(grant.n).arg(method);
        for saved in &grant.saved {
            invocation
                .arg(saved.before.as_slice())
                .arg(saved.expires_at_ms)
                .arg(saved.after.as_slice())
                .arg(saved.window)
                .arg(saved.incarnation.as_slice());
        }
        let reply = self.call_unchecked(&invocation).await?;
        if reply.len() != keys.len() {
            return Err(RedisError::BadReply {
                reply: format!("{reply:?}"),
            });
        }
        Ok(reply
            .into_iter()
            .map(|outcome| match outcome {
                1 => GivenBack::Restored,
                2 => GivenBack::TakenOff,
                _ => GivenBack::Kept,
            })
            .collect())
    }

    /// Gives `n` permits back to `client` under `plan` (a refund of permits taken earlier, as
    /// Envoy's `is_negative_hits` asks), by each method's own rule and never past what a limit
    /// still counts, so that no limit becomes more generous than a fresh one: the token bucket
    /// refills by `n` tokens (to full at most), the fixed window and the sliding window counter
    /// take `n` (at most their count) off the current window's count (a refund read in an older
    /// window than the stored one gives nothing), the sliding log gives nothing back (its
    /// batches record admissions). One round trip; says, per limit, whether it gave anything.
    ///
    /// # Errors
    ///
    /// [`RedisError::UnknownPlan`] for a plan the limiter does not have; a failed round trip as
    /// it failed ([`RedisError::Timeout`], [`RedisError::Command`]), whatever the failure
    /// policy: nothing is then given back.
    pub async fn refund(&self, client: &str, plan: &P, n: u64) -> Result<Vec<bool>, RedisError> {
        self.refund_inner(client, plan, n, None).await
    }

    /// [`RedisRateLimiter::refund`] at `now_us` microseconds (see
    /// [`RedisRateLimiter::decide_at`]).
    ///
    /// # Errors
    ///
    /// As [`RedisRateLimiter::refund`].
    #[cfg(feature = "test-util")]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub async fn refund_at(
        &self,
        client: &str,
        plan: &P,
        n: u64,
        now_us: u64,
    ) -> Result<Vec<bool>, RedisError> {
        self.refund_inner(client, plan, n, Some(now_us)).await
    }

    async fn reserve_inner(
        &self,
        client: &str,
        plan: &P,
        n: u64,
        now_us: Option<u64>,
    ) -> Result<(Answer, Option<RedisGrant>), RedisError> {
        let mut grant = None;
        let answer = self
            .decide_inner_saving(client, plan, n, Mode::Reserve, now_us, &mut grant)
            .await?;
        Ok((answer, grant))
    }

    async fn refund_inner(
        &self,
        client: &str,
        plan: &P,
        n: u64,
        now_us: Option<u64>,
    ) -> Result<Vec<bool>, RedisError> {
        let (index, entry) = self.plan_entry(plan)?;
        let keys = self.keys_of(entry, client);
        self.forget_denial(index, client);
        let mut invocation = script::REFUND.prepare_invoke();
        for key in &keys {
            invocation.key(key);
        }
        let method = entry.method_name();
        let now_arg = now_us.map(|now| now.to_string()).unwrap_or_default();
        invocation.arg(n).arg(method).arg(now_arg);
        for (spec, _) in &entry.limits {
            spec.push_args(&mut invocation);
        }
        let reply: Vec<i64> = self.call_unchecked(&invocation).await?;
        if reply.len() != keys.len() {
            return Err(RedisError::BadReply {
                reply: format!("{reply:?}"),
            });
        }
        Ok(reply.into_iter().map(|given| given == 1).collect())
    }

    /// Forgets this node's cached denial of `client` under the plan at `index`, whose state a
    /// refund or a give-back is about to make more generous (see the deny cache's docs).
    fn forget_denial(&self, index: usize, client: &str) {
        if let Some(cache) = &self.deny_cache {
            cache.remove((index, client));
        }
    }

    /// One script call outside the decision path (a give-back, a refund): bounded by the
    /// timeout, counted, and answered by no failure policy.
    async fn call_unchecked(
        &self,
        invocation: &::redis::ScriptInvocation<'_>,
    ) -> Result<Vec<i64>, RedisError> {
        let reply = self.invoke(invocation).await;
        if reply.is_err() {
            Counters::bump(&self.counters.errors);
        }
        reply
    }

    /// Reports, taking nothing, what one permit for `client` under `plan` would get now.
    ///
    /// # Errors
    ///
    /// As [`RedisRateLimiter::decide`].
    pub async fn peek(&self, client: &str, plan: &P) -> Result<Decision, RedisError> {
        Ok(self
            .decide_inner(client, plan, 1, Mode::Peek, None)
            .await?
            .decision)
    }

    /// [`RedisRateLimiter::peek`], with where the answer came from (under
    /// [`FailurePolicy::FailOpen`](super::FailurePolicy::FailOpen), a grant that counted
    /// nothing).
    #[cfg(feature = "envoy")]
    pub(crate) async fn peek_answer(&self, client: &str, plan: &P) -> Result<Answer, RedisError> {
        self.decide_inner(client, plan, 1, Mode::Peek, None).await
    }

    /// [`RedisRateLimiter::decide`] at `now_us` microseconds instead of the server's clock, for
    /// tests that replay a history. Skips the deny cache (it runs on the real clock).
    ///
    /// # Errors
    ///
    /// As [`RedisRateLimiter::decide`].
    #[cfg(feature = "test-util")]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub async fn decide_at(
        &self,
        client: &str,
        plan: &P,
        n: u64,
        now_us: u64,
    ) -> Result<Answer, RedisError> {
        self.decide_inner(client, plan, n, Mode::Acquire, Some(now_us))
            .await
    }

    /// [`RedisRateLimiter::peek`] at `now_us` microseconds (see [`RedisRateLimiter::decide_at`]).
    ///
    /// # Errors
    ///
    /// As [`RedisRateLimiter::decide`].
    #[cfg(feature = "test-util")]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub async fn peek_at(&self, client: &str, plan: &P, now_us: u64) -> Result<Answer, RedisError> {
        self.decide_inner(client, plan, 1, Mode::Peek, Some(now_us))
            .await
    }

    fn plan_entry(&self, plan: &P) -> Result<(usize, &PlanEntry<P>), RedisError> {
        self.plans
            .iter()
            .enumerate()
            .find(|(_, entry)| entry.plan == *plan)
            .ok_or_else(|| RedisError::UnknownPlan {
                plan: format!("{plan:?}"),
            })
    }

    fn keys_of(&self, entry: &PlanEntry<P>, client: &str) -> Vec<String> {
        // Every key of one client under one plan shares the hash tag `{plan:client}`, so one
        // script can touch them all on Redis Cluster.
        // Built by appending into one allocation of the final size, not by `format!`.
        let shared = self.prefix.len() + entry.name.len() + client.len() + ":{:}:".len();
        entry
            .limits
            .iter()
            .map(|(_, suffix)| {
                let mut key = String::with_capacity(shared + suffix.len());
                for part in [&self.prefix, ":{", &entry.name, ":", client, "}:", suffix] {
                    key.push_str(part);
                }
                key
            })
            .collect()
    }

    async fn decide_inner(
        &self,
        client: &str,
        plan: &P,
        n: u64,
        mode: Mode,
        now_us: Option<u64>,
    ) -> Result<Answer, RedisError> {
        self.decide_inner_saving(client, plan, n, mode, now_us, &mut None)
            .await
    }

    /// The decision; under [`Mode::Reserve`], with the grant in `grant` when Redis made one.
    async fn decide_inner_saving(
        &self,
        client: &str,
        plan: &P,
        n: u64,
        mode: Mode,
        now_us: Option<u64>,
        grant: &mut Option<RedisGrant>,
    ) -> Result<Answer, RedisError> {
        // Answers from the deny cache or the fallback complete without waiting; spending the
        // task's budget lets tokio preempt a task that loops on them, as it would on I/O.
        tokio::task::coop::consume_budget().await;
        let (index, entry) = self.plan_entry(plan)?;
        if mode != Mode::Peek
            && let Some((at, rejected)) = entry
                .limits
                .iter()
                .enumerate()
                .find_map(|(at, (spec, _))| spec.reject(n).map(|rejected| (at, rejected)))
        {
            Counters::bump(&self.counters.rejections);
            // A request that can never pass still reports the real quota, as in process: one
            // round trip of 0 permits (which writes nothing), and the figures of the limit that
            // rejects it (of a plan of several, not the tightest's). Without it, the rejection
            // stands with no figures.
            let quota = Box::pin(self.decide_inner(client, plan, 0, Mode::Acquire, now_us)).await;
            return Ok(match (quota, rejected.rejection()) {
                (Ok(quota), Some(rejection)) => {
                    let own = quota.each_limit().get(at).copied();
                    Answer {
                        decision: own.unwrap_or(quota.decision).into_rejected(rejection),
                        source: Source::Rejected,
                        ..quota
                    }
                }
                _ => Answer::new(rejected, Source::Rejected),
            });
        }
        // The deny cache answers on the real clock only, and only what takes permits.
        let cache = self
            .deny_cache
            .as_ref()
            .filter(|_| mode != Mode::Peek && n > 0 && now_us.is_none());
        let cache_key = cache.map(|_| (index, client));
        if let (Some(cache), Some(key)) = (cache, &cache_key)
            && let Some(decision) = cache.get(*key, n)
        {
            Counters::bump(&self.counters.cache_hits);
            return Ok(Answer::new(decision, Source::DenyCache));
        }

        // The breaker of the slot holding the client's keys, read from them; a single server's
        // one breaker gates before any key is made, so that a request it short-circuits makes
        // none.
        let slot_keys = self
            .breaker
            .is_per_slot()
            .then(|| self.keys_of(entry, client));
        let breaker = self.breaker.of_key(
            slot_keys
                .as_ref()
                .and_then(|keys| keys.first())
                .map_or("", String::as_str),
        );
        let gate = breaker.gate();
        if let Gate::Open { retry_in } = gate {
            Counters::bump(&self.counters.short_circuits);
            return self.fall_back(
                index,
                entry,
                client,
                n,
                mode,
                RedisError::CircuitOpen { retry_in },
            );
        }
        let keys = slot_keys.unwrap_or_else(|| self.keys_of(entry, client));
        let probe = ProbeGuard::new(breaker, gate);
        let sent_at = cache.map(DenyCache::now);
        let breaker_sent_at = breaker.now();
        let reply = if mode == Mode::Reserve {
            let record = self.grant_names.next(&keys);
            let mut named = keys.clone();
            named.push(record.clone());
            self.round_trip::<::redis::Value>(entry, &named, n, mode, now_us)
                .await
                .and_then(|value| {
                    let (reply, saved) = Self::split_reserved(entry, value)?;
                    *grant = saved.map(|saved| RedisGrant {
                        n,
                        plan: index,
                        keys: keys.clone(),
                        record,
                        saved,
                    });
                    Ok(reply)
                })
                .map_err(Failed::Call)
        } else if let Some(batcher) = &self.batcher {
            let request = batch::Request {
                keys: keys.clone(),
                n,
                mode: mode.arg(),
                now_us,
                params: entry
                    .limits
                    .iter()
                    .flat_map(|(spec, _)| spec.params())
                    .collect(),
            };
            batcher.decide(request, self.timeout).await
        } else {
            self.round_trip::<Vec<i64>>(entry, &keys, n, mode, now_us)
                .await
                .map_err(Failed::Call)
        };
        let probe_ticket = probe.ticket();
        probe.disarm();
        let reply = match reply {
            Ok(reply) => {
                breaker.success();
                reply
            }
            Err(Failed::Call(RedisError::Command { source }))
                if RedisError::is_script_failure(&source) =>
            {
                // Redis answered: this client's keys hold what the script cannot read. Its own
                // error, under every policy; nothing an outage is made of.
                breaker.success();
                Counters::bump(&self.counters.errors);
                return Err(RedisError::UnreadableValue { keys, source });
            }
            Err(Failed::Script(source)) if RedisError::is_script_error_code(&source) => {
                // The same, from the request's own decision in a batch.
                breaker.success();
                Counters::bump(&self.counters.errors);
                return Err(RedisError::UnreadableValue { keys, source });
            }
            Err(failed) => {
                let error = match failed {
                    Failed::Call(error) => error,
                    // Another error of the request's own decision (say, a full server's
                    // refusal of its write): as the call's error it would have been.
                    Failed::Script(source) => RedisError::Command { source },
                };
                let error = error.naming_replica(&self.url);
                Counters::bump(&self.counters.errors);
                if matches!(error, RedisError::Timeout { .. }) {
                    Counters::bump(&self.counters.timeouts);
                }
                if breaker.failure(probe_ticket, breaker_sent_at) {
                    Counters::bump(&self.counters.circuit_opens);
                }
                return self.fall_back(index, entry, client, n, mode, error);
            }
        };
        let answer = Self::read_reply(entry, &keys, &reply)?;
        Counters::bump(&self.counters.redis_decisions);
        if answer.decision.is_denied()
            && let (Some(cache), Some(key), Some(sent_at)) = (cache, cache_key, sent_at)
        {
            cache.insert(key, n, sent_at, &answer.decision);
        }
        Ok(answer)
    }

    /// A reserving call's reply: the decision's integers, and each key's saved values when
    /// the grant was committed (after the integers: see `scripts/plan.lua`).
    fn split_reserved(
        entry: &PlanEntry<P>,
        value: ::redis::Value,
    ) -> Result<(Vec<i64>, Option<Vec<SavedKey>>), RedisError> {
        use ::redis::Value;
        let bad_reply = |value: &dyn fmt::Debug| RedisError::BadReply {
            reply: format!("{value:?}"),
        };
        let Value::Array(items) = value else {
            return Err(bad_reply(&value));
        };
        let saved_len = SAVED_PER_KEY * entry.limits.len();
        let figures: usize = entry
            .limits
            .iter()
            .map(|(spec, _)| spec.figure_count())
            .sum();
        let committed = items.len() == 3 + figures + saved_len;
        let split = if committed {
            items.len() - saved_len
        } else {
            items.len()
        };
        let mut ints = Vec::with_capacity(split);
        for item in &items[..split] {
            match item {
                Value::Int(x) => ints.push(*x),
                other => return Err(bad_reply(other)),
            }
        }
        if !committed {
            return Ok((ints, None));
        }
        let bytes = |item: &Value| match item {
            Value::BulkString(bytes) => Ok(bytes.clone()),
            Value::Nil => Ok(Vec::new()),
            other => Err(bad_reply(other)),
        };
        let int = |item: &Value| match item {
            Value::Int(x) => Ok(*x),
            other => Err(bad_reply(other)),
        };
        let saved = items[split..]
            .chunks_exact(SAVED_PER_KEY)
            .map(|parts| {
                Ok(SavedKey {
                    before: bytes(&parts[0])?,
                    expires_at_ms: int(&parts[1])?,
                    after: bytes(&parts[2])?,
                    window: int(&parts[3])?,
                    incarnation: bytes(&parts[4])?,
                })
            })
            .collect::<Result<Vec<_>, RedisError>>()?;
        Ok((ints, Some(saved)))
    }

    /// One script call, bounded by the timeout.
    async fn round_trip<T: ::redis::FromRedisValue>(
        &self,
        entry: &PlanEntry<P>,
        keys: &[String],
        n: u64,
        mode: Mode,
        now_us: Option<u64>,
    ) -> Result<T, RedisError> {
        let script = script::script_for(self.algorithm);
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(key);
        }
        let now_arg = now_us.map(|now| now.to_string()).unwrap_or_default();
        // The sliding log's reserve reads its newest and oldest batches, not its whole value.
        let mode_arg = if mode == Mode::Reserve && self.algorithm == Algorithm::SlidingWindowLog {
            "reserve-log"
        } else {
            mode.arg()
        };
        invocation.arg(n).arg(mode_arg).arg(now_arg);
        for (spec, _) in &entry.limits {
            spec.push_args(&mut invocation);
        }
        self.invoke(&invocation).await
    }

    /// One script call, counted and bounded by the timeout. EVALSHA; on NOSCRIPT (a restarted
    /// or flushed server) the client loads the script and retries, once.
    async fn invoke<T: ::redis::FromRedisValue>(
        &self,
        invocation: &::redis::ScriptInvocation<'_>,
    ) -> Result<T, RedisError> {
        Counters::bump(&self.counters.round_trips);
        let mut connection = self.connection();
        let call = invocation.invoke_async::<T>(&mut connection);
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(source)) if source.is_timeout() => Err(RedisError::Timeout {
                after: self.timeout,
            }),
            Ok(Err(source)) => Err(RedisError::Command { source }),
            Err(_) => Err(RedisError::Timeout {
                after: self.timeout,
            }),
        }
    }

    /// The connection for the next round trip: the next of the limiter's connections, in turn.
    fn connection(&self) -> Connection {
        let at = match self.connections.len() {
            1 => 0,
            // Relaxed: a counter that spreads round trips; any interleaving spreads them.
            len => self.next_connection.fetch_add(1, Ordering::Relaxed) % len,
        };
        self.connections[at].clone()
    }

    /// The plan's answer from a script's reply: its decision is the denial with the longest wait
    /// if any limit denied, else the allowance with the fewest permits left; a plan of several
    /// limits keeps each limit's.
    fn read_reply(
        entry: &PlanEntry<P>,
        keys: &[String],
        reply: &[i64],
    ) -> Result<Answer, RedisError> {
        let bad_reply = || RedisError::BadReply {
            reply: format!("{reply:?}"),
        };
        match reply.first().copied() {
            Some(CODE_WRONG_TYPE) => {
                let index = reply.get(1).and_then(|&i| usize::try_from(i).ok());
                let key = index
                    .and_then(|i| keys.get(i.wrapping_sub(1)))
                    .ok_or_else(bad_reply)?;
                return Err(RedisError::WrongType { key: key.clone() });
            }
            Some(CODE_ALLOWED | CODE_DENIED) => {}
            _ => return Err(bad_reply()),
        }
        // A plan of one limit decided without reserving: its figures alone (see plan.lua).
        if let [(spec, _)] = entry.limits.as_slice()
            && reply.len() == spec.figure_count()
        {
            return Ok(Answer::new(spec.decision(reply), Source::Redis));
        }
        let mut figures = reply.get(3..).ok_or_else(bad_reply)?;
        let expected: usize = entry
            .limits
            .iter()
            .map(|(spec, _)| spec.figure_count())
            .sum();
        if figures.len() != expected {
            return Err(bad_reply());
        }
        let mut decisions = entry.limits.iter().map(|(spec, _)| {
            let (own, rest) = figures.split_at(spec.figure_count());
            figures = rest;
            spec.decision(own)
        });
        let first = decisions.next().ok_or_else(bad_reply)?;
        if entry.limits.len() == 1 {
            return Ok(Answer::new(first, Source::Redis));
        }
        let mut answer = Answer::new(first, Source::Redis);
        // Plans have at most `MAX_LIMITS` limits (checked when the limiter is built).
        for (slot, decision) in answer
            .each_limit
            .iter_mut()
            .zip(std::iter::once(first).chain(decisions))
        {
            *slot = decision;
            answer.limit_count += 1;
        }
        answer.decision = combined(first, answer.each_limit()[1..].iter().copied());
        Ok(answer)
    }

    /// The failure policy's answer.
    fn fall_back(
        &self,
        index: usize,
        entry: &PlanEntry<P>,
        client: &str,
        n: u64,
        mode: Mode,
        error: RedisError,
    ) -> Result<Answer, RedisError> {
        let Some((first, _)) = entry.limits.first() else {
            return Err(error);
        };
        let rule = first.rule();
        let (decision, source) = match self.policy {
            FailurePolicy::Error => return Err(error),
            FailurePolicy::FailOpen => (Decision::allowed(rule, 0, 0), Source::FailOpen),
            FailurePolicy::FailClosed => {
                let retry = duration_to_nanos(self.breaker.cool_down());
                let window = rule.window_nanos();
                (Decision::denied(rule, 0, retry, window), Source::FailClosed)
            }
            FailurePolicy::Local { .. } => {
                let decision = self
                    .local
                    .as_ref()
                    .and_then(|local| local.decide(index, client, n, mode));
                // `None` is unreachable: a limiter under this policy has its fallback, and every
                // plan a first limit.
                let decision = decision.unwrap_or_else(|| {
                    Decision::denied(rule, 0, rule.window_nanos(), rule.window_nanos())
                });
                (decision, Source::Local)
            }
        };
        Counters::bump(&self.counters.fallbacks);
        Ok(Answer::new(decision, source))
    }
}
