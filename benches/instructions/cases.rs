//! The measured cases: how each is set up, what one round of it does, and what every decision in
//! it must answer.
//!
//! Every rule is chosen so that the answer, and the path through the code, is the same for every
//! decision of a run however slowly valgrind runs it: a difference in path would make the count
//! depend on timing.

use std::hash::{BuildHasher, RandomState};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use governor::Quota;
use governor::clock::QuantaInstant;
use governor::middleware::NoOpMiddleware;
use tollgate::{
    Algorithm, FixedWindow, Limiter, MonotonicClock, RateLimiterService, Rule, ServiceBuilder,
    SipState, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};

/// One measured case.
pub(crate) struct Case {
    /// `{row}/{implementation}`, `implementation` being `tollgate` or `governor`; the name the
    /// child process is told to run.
    pub(crate) name: &'static str,
    /// What the report's table calls the row (the same for tollgate's case and governor's).
    pub(crate) label: &'static str,
    /// Decisions made by one round.
    pub(crate) decisions_per_round: u64,
    /// The two round counts measured; their difference is what the figure is taken over.
    pub(crate) rounds: [u64; 2],
    /// Sets the case up, makes `rounds` counted rounds, checks every answer, and returns how many
    /// decisions the rounds made.
    pub(crate) run: fn(rounds: u64) -> Result<u64, String>,
}

/// The case whose round decides nothing: the counting loop's own instructions per round, which
/// are subtracted from every other case.
pub(crate) const EMPTY_LOOP: &str = "empty_loop";

/// Clients pre-inserted for the lookup cases.
pub(crate) const LOOKUP_CLIENTS: u64 = 10_000;

/// Clients pre-inserted for the large lookup cases: most lookups miss the caches, which the
/// counts do not show, but a probe that goes further in a fuller table does.
pub(crate) const LOOKUP_CLIENTS_LARGE: u64 = 1_000_000;

/// The capacity tollgate's service is given for `clients` clients: four times their number.
/// Its table is allocated up front and never grows, and a new client whose 16 slots (its two
/// buckets) are all taken reuses an idle client's slot (every client here is idle a nanosecond
/// after its request) or evicts one: a lookup case whose clients did not all stay would count
/// inserts as lookups (`Lookup::new` checks that every client is still held), and a first
/// request would not be the only client in its slot. Measured with this harness's clients, a
/// table of capacity equal to the clients held 92% of 10 000, twice 99.98%, three times 99.9994%
/// of 1 000 000, four times all of them.
fn service_capacity(clients: u64) -> usize {
    usize::try_from(4 * clients).expect("the clients fit in memory")
}

/// The capacity of the full store's case: every slot is held by an idle client before the count,
/// so that each first request reuses one (the path of a flood of new keys through a service at
/// its capacity).
const FULL_STORE_CAPACITY: usize = 8_192;

/// First requests that fill the full store's case: eight per slot, so that every bucket has been
/// some key's home many times over.
const FULL_STORE_FILL: u64 = 8 * FULL_STORE_CAPACITY as u64;

/// First requests per round, each round into a fresh map (as the criterion suite's batches):
/// the cost includes the map's growth from empty.
pub(crate) const FIRST_REQUEST_BATCH: u64 = 10_000;

/// Rounds of one decision: 10 000 decisions between the two counts, the first thousand of each
/// run (and all its one-time costs) cancelled.
pub(crate) const PER_DECISION_ROUNDS: [u64; 2] = [1_000, 11_000];

/// Rounds of a batch of first requests: two batches between the two counts. The first batch fills
/// a fresh heap (the allocator grows it); the two measured ones reuse what their predecessor
/// freed, as a long-running server's allocations do.
const BATCH_ROUNDS: [u64; 2] = [1, 3];

/// The sliding log's allow rule keeps one slot per permit (at most 65 536): no run may take more
/// than this many permits, or it would run dry.
const LOG_SLOTS: u64 = 65_536;

/// The most rounds a per-decision case may be asked for: the sliding log's allow case, with a
/// permit taken by its set-up, must not run dry.
pub(crate) const MAX_ROUNDS: u64 = LOG_SLOTS - 1;

pub(crate) const CASES: &[Case] = &[
    Case {
        name: EMPTY_LOOP,
        label: "",
        decisions_per_round: 1,
        rounds: PER_DECISION_ROUNDS,
        run: |rounds| drive(Nothing, rounds, Expect::Allowed),
    },
    Case {
        name: "token_bucket_allow/tollgate",
        label: "token bucket, allow",
        decisions_per_round: 1,
        rounds: PER_DECISION_ROUNDS,
        run: |rounds| {
            let bucket = TokenBucket::new(refilling_rule(), MonotonicClock::new())
                .map_err(|error| error.to_string())?;
            drive(Tollgate(bucket), rounds, Expect::Allowed)
        },
    },
    Case {
        name: "token_bucket_allow/governor",
        label: "token bucket, allow",
        decisions_per_round: 1,
        rounds: PER_DECISION_ROUNDS,
        run: |rounds| {
            let direct = GovernorDirect::direct(governor_quota(refilling_rule()));
            drive(Governor(direct), rounds, Expect::Allowed)
        },
    },
    Case {
        name: "token_bucket_deny/tollgate",
        label: "token bucket, deny",
        decisions_per_round: 1,
        rounds: PER_DECISION_ROUNDS,
        run: |rounds| {
            let bucket = TokenBucket::new(exhausted_rule(), MonotonicClock::new())
                .map_err(|error| error.to_string())?;
            drive(exhaust(Tollgate(bucket))?, rounds, Expect::Denied)
        },
    },
    Case {
        name: "token_bucket_deny/governor",
        label: "token bucket, deny",
        decisions_per_round: 1,
        rounds: PER_DECISION_ROUNDS,
        run: |rounds| {
            let direct = GovernorDirect::direct(governor_quota(exhausted_rule()));
            drive(exhaust(Governor(direct))?, rounds, Expect::Denied)
        },
    },
    Case {
        name: "token_bucket_allow_decision/tollgate",
        label: "token bucket, allow, whole `Decision`",
        decisions_per_round: 1,
        rounds: PER_DECISION_ROUNDS,
        run: |rounds| {
            let bucket = TokenBucket::new(refilling_rule(), MonotonicClock::new())
                .map_err(|error| error.to_string())?;
            drive(FullDecision(bucket), rounds, Expect::Allowed)
        },
    },
    Case {
        name: "token_bucket_deny_decision/tollgate",
        label: "token bucket, deny, whole `Decision`",
        decisions_per_round: 1,
        rounds: PER_DECISION_ROUNDS,
        run: |rounds| {
            let bucket = TokenBucket::new(exhausted_rule(), MonotonicClock::new())
                .map_err(|error| error.to_string())?;
            drive(exhaust(FullDecision(bucket))?, rounds, Expect::Denied)
        },
    },
    Case {
        name: "fixed_window_allow/tollgate",
        label: "fixed window, allow",
        decisions_per_round: 1,
        rounds: PER_DECISION_ROUNDS,
        run: |rounds| {
            let window = FixedWindow::new(window_rule(), MonotonicClock::new())
                .map_err(|error| error.to_string())?;
            drive(Tollgate(window), rounds, Expect::Allowed)
        },
    },
    Case {
        name: "fixed_window_deny/tollgate",
        label: "fixed window, deny",
        decisions_per_round: 1,
        rounds: PER_DECISION_ROUNDS,
        run: |rounds| {
            let window = FixedWindow::new(exhausted_rule(), MonotonicClock::new())
                .map_err(|error| error.to_string())?;
            drive(exhaust(Tollgate(window))?, rounds, Expect::Denied)
        },
    },
    Case {
        name: "sliding_window_log_allow/tollgate",
        label: "sliding window log, allow",
        decisions_per_round: 1,
        rounds: PER_DECISION_ROUNDS,
        run: |rounds| {
            let log = SlidingWindowLog::new(log_rule()?, MonotonicClock::new())
                .map_err(|error| error.to_string())?;
            // One permit taken before counting: a check that the log admits at all.
            let mut log = Tollgate(log);
            if log.round() != 1 {
                return Err("a fresh sliding log denied its first request".to_owned());
            }
            drive(log, rounds, Expect::Allowed)
        },
    },
    Case {
        name: "sliding_window_log_deny/tollgate",
        label: "sliding window log, deny",
        decisions_per_round: 1,
        rounds: PER_DECISION_ROUNDS,
        run: |rounds| {
            let log = SlidingWindowLog::new(exhausted_rule(), MonotonicClock::new())
                .map_err(|error| error.to_string())?;
            drive(exhaust(Tollgate(log))?, rounds, Expect::Denied)
        },
    },
    Case {
        name: "sliding_window_counter_allow/tollgate",
        label: "sliding window counter, allow",
        decisions_per_round: 1,
        rounds: PER_DECISION_ROUNDS,
        run: |rounds| {
            let counter = SlidingWindowCounter::new(counter_rule(), MonotonicClock::new())
                .map_err(|error| error.to_string())?;
            drive(Tollgate(counter), rounds, Expect::Allowed)
        },
    },
    Case {
        name: "sliding_window_counter_deny/tollgate",
        label: "sliding window counter, deny",
        decisions_per_round: 1,
        rounds: PER_DECISION_ROUNDS,
        run: |rounds| {
            let counter = SlidingWindowCounter::new(exhausted_rule(), MonotonicClock::new())
                .map_err(|error| error.to_string())?;
            drive(exhaust(Tollgate(counter))?, rounds, Expect::Denied)
        },
    },
    Case {
        name: "service_lookup_default_hasher/tollgate",
        label: "service lookup, default hasher",
        decisions_per_round: 1,
        rounds: PER_DECISION_ROUNDS,
        run: |rounds| {
            drive(
                Lookup::new(
                    tollgate_service(SipState::new(), LOOKUP_CLIENTS),
                    LOOKUP_CLIENTS,
                )?,
                rounds,
                Expect::Allowed,
            )
        },
    },
    Case {
        name: "service_lookup_fixed_window/tollgate",
        label: "service lookup, fixed window, default hasher",
        decisions_per_round: 1,
        rounds: PER_DECISION_ROUNDS,
        run: |rounds| lookup_of_method(Algorithm::FixedWindow, window_rule(), rounds),
    },
    Case {
        name: "service_lookup_sliding_window_counter/tollgate",
        label: "service lookup, sliding window counter, default hasher",
        decisions_per_round: 1,
        rounds: PER_DECISION_ROUNDS,
        run: |rounds| lookup_of_method(Algorithm::SlidingWindowCounter, counter_rule(), rounds),
    },
    Case {
        name: "service_lookup_default_hasher/governor",
        label: "service lookup, default hasher",
        decisions_per_round: 1,
        rounds: PER_DECISION_ROUNDS,
        run: |rounds| {
            drive(
                Lookup::new(governor_keyed(RandomState::new()), LOOKUP_CLIENTS)?,
                rounds,
                Expect::Allowed,
            )
        },
    },
    Case {
        name: "service_lookup_std_hasher/tollgate",
        label: "service lookup, std RandomState",
        decisions_per_round: 1,
        rounds: PER_DECISION_ROUNDS,
        run: |rounds| {
            drive(
                Lookup::new(
                    tollgate_service(RandomState::new(), LOOKUP_CLIENTS),
                    LOOKUP_CLIENTS,
                )?,
                rounds,
                Expect::Allowed,
            )
        },
    },
    Case {
        name: "service_lookup_std_hasher/governor",
        label: "service lookup, std RandomState",
        decisions_per_round: 1,
        rounds: PER_DECISION_ROUNDS,
        run: |rounds| {
            drive(
                Lookup::new(governor_keyed(RandomState::new()), LOOKUP_CLIENTS)?,
                rounds,
                Expect::Allowed,
            )
        },
    },
    Case {
        name: "service_lookup_1m_default_hasher/tollgate",
        label: "service lookup, 1 000 000 clients, default hasher",
        decisions_per_round: 1,
        rounds: PER_DECISION_ROUNDS,
        run: |rounds| {
            drive(
                Lookup::new(
                    tollgate_service(SipState::new(), LOOKUP_CLIENTS_LARGE),
                    LOOKUP_CLIENTS_LARGE,
                )?,
                rounds,
                Expect::Allowed,
            )
        },
    },
    Case {
        name: "service_lookup_1m_default_hasher/governor",
        label: "service lookup, 1 000 000 clients, default hasher",
        decisions_per_round: 1,
        rounds: PER_DECISION_ROUNDS,
        run: |rounds| {
            drive(
                Lookup::new(governor_keyed(RandomState::new()), LOOKUP_CLIENTS_LARGE)?,
                rounds,
                Expect::Allowed,
            )
        },
    },
    Case {
        name: "service_lookup_foldhash/tollgate",
        label: "service lookup, foldhash",
        decisions_per_round: 1,
        rounds: PER_DECISION_ROUNDS,
        run: |rounds| {
            drive(
                Lookup::new(
                    tollgate_service(FixedFoldHash::default(), LOOKUP_CLIENTS),
                    LOOKUP_CLIENTS,
                )?,
                rounds,
                Expect::Allowed,
            )
        },
    },
    Case {
        name: "service_lookup_foldhash/governor",
        label: "service lookup, foldhash",
        decisions_per_round: 1,
        rounds: PER_DECISION_ROUNDS,
        run: |rounds| {
            drive(
                Lookup::new(governor_keyed(FixedFoldHash::default()), LOOKUP_CLIENTS)?,
                rounds,
                Expect::Allowed,
            )
        },
    },
    Case {
        name: "service_first_request_default_hasher/tollgate",
        label: "service first request, default hasher",
        decisions_per_round: FIRST_REQUEST_BATCH,
        rounds: BATCH_ROUNDS,
        run: |rounds| {
            let first =
                FirstRequests::new(|| tollgate_service(SipState::new(), FIRST_REQUEST_BATCH));
            drive(first, rounds, Expect::Allowed)
        },
    },
    Case {
        name: "service_first_request_default_hasher/governor",
        label: "service first request, default hasher",
        decisions_per_round: FIRST_REQUEST_BATCH,
        rounds: BATCH_ROUNDS,
        run: |rounds| {
            let first = FirstRequests::new(|| governor_keyed(RandomState::new()));
            drive(first, rounds, Expect::Allowed)
        },
    },
    Case {
        name: "service_first_request_full_store/tollgate",
        label: "service first request into a full store (an idle client's slot reused), default \
                hasher",
        decisions_per_round: 1,
        rounds: PER_DECISION_ROUNDS,
        run: |rounds| {
            let service =
                tollgate_service_of_capacity(FullStoreHasher::default(), FULL_STORE_CAPACITY);
            drive(FullStore::new(service)?, rounds, Expect::Allowed)
        },
    },
    Case {
        name: "service_first_request_foldhash/tollgate",
        label: "service first request, foldhash",
        decisions_per_round: FIRST_REQUEST_BATCH,
        rounds: BATCH_ROUNDS,
        run: |rounds| {
            let first = FirstRequests::new(|| {
                tollgate_service(FixedFoldHash::default(), FIRST_REQUEST_BATCH)
            });
            drive(first, rounds, Expect::Allowed)
        },
    },
    Case {
        name: "service_first_request_foldhash/governor",
        label: "service first request, foldhash",
        decisions_per_round: FIRST_REQUEST_BATCH,
        rounds: BATCH_ROUNDS,
        run: |rounds| {
            let first = FirstRequests::new(|| governor_keyed(FixedFoldHash::default()));
            drive(first, rounds, Expect::Allowed)
        },
    },
];

/// The case called `name`.
pub(crate) fn case(name: &str) -> Option<&'static Case> {
    CASES.iter().find(|case| case.name == name)
}

/// One permit per nanosecond, a second's worth of burst: a decision takes far longer than a
/// nanosecond (and far longer still under valgrind), so the bucket is full again at every
/// decision, and each takes the same path.
fn refilling_rule() -> Rule {
    Rule::per_second(1_000_000_000).expect("a valid rule")
}

/// A window no run outlasts (the first window starts at the clock's origin, made at set-up), with
/// a limit no run reaches: no decision meets a window's edge.
fn window_rule() -> Rule {
    Rule::per_hour(1_000_000_000).expect("a valid rule")
}

/// The sliding window counter's allow rule: as `window_rule`, with a limit its 20-bit counts hold
/// for an hour-long window (the word cannot hold a billion an hour for ten years) and that no run
/// (`MAX_ROUNDS` at most) reaches.
fn counter_rule() -> Rule {
    Rule::per_hour(1_000_000).expect("a valid rule")
}

/// The sliding log's allow rule: a slot per permit, and a window no run outlasts, so no run
/// reuses a slot (`MAX_ROUNDS` keeps the run within the ring).
fn log_rule() -> Result<Rule, String> {
    Rule::new(LOG_SLOTS, Duration::from_secs(3600)).map_err(|error| error.to_string())
}

/// One permit an hour, taken by the set-up: every measured decision is a denial.
fn exhausted_rule() -> Rule {
    Rule::per_hour(1).expect("a valid rule")
}

/// governor's quota that enforces `rule`: a burst of the limit, one permit back per
/// `window / limit` (exact for the rules above).
fn governor_quota(rule: Rule) -> Quota {
    let limit = u32::try_from(rule.limit()).expect("governor's burst is a u32");
    let burst = NonZeroU32::new(limit).expect("a rule's limit is never 0");
    Quota::with_period(rule.window() / limit)
        .expect("the rules here refill at most one permit per nanosecond")
        .allow_burst(burst)
}

/// What every decision of a case must answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Allowed,
    Denied,
}

/// One round of a case.
trait Round {
    /// Decisions made by one round.
    const DECISIONS: u64 = 1;

    /// Whether each round needs [`Round::renew`] after it, outside the count (a first-request
    /// round needs a fresh map).
    const RENEWS: bool = false;

    /// Makes one round of decisions; returns how many were allowed.
    fn round(&mut self) -> u64;

    /// Prepares the next round; not counted.
    fn renew(&mut self) {}
}

/// Makes `rounds` counted rounds of `round`, then checks that each decision answered `expect`:
/// a case set up wrong must fail, not measure another path without a word.
fn drive<R: Round>(mut round: R, rounds: u64, expect: Expect) -> Result<u64, String> {
    if rounds > MAX_ROUNDS {
        return Err(format!("at most {MAX_ROUNDS} rounds, not {rounds}"));
    }
    let allowed = if R::RENEWS {
        let mut allowed = 0;
        for _ in 0..rounds {
            allowed += counted_rounds(&mut round, 1);
            round.renew();
        }
        allowed
    } else {
        counted_rounds(&mut round, rounds)
    };
    let decisions = rounds * R::DECISIONS;
    let expected = match expect {
        Expect::Allowed => decisions,
        Expect::Denied => 0,
    };
    if allowed != expected {
        return Err(format!(
            "{allowed} of {decisions} decisions allowed, expected {expected}"
        ));
    }
    Ok(decisions)
}

/// The only code callgrind counts: the driver runs the child under
/// `--toggle-collect=*counted_rounds*`. Never inlined, so that it exists to be found by name.
#[inline(never)]
fn counted_rounds<R: Round>(round: &mut R, rounds: u64) -> u64 {
    let mut allowed = 0;
    for _ in 0..rounds {
        allowed += round.round();
    }
    allowed
}

/// Takes the one permit of [`exhausted_rule`] and checks the next request is denied.
fn exhaust<R: Round>(mut round: R) -> Result<R, String> {
    if round.round() != 1 {
        return Err("a fresh limiter denied its first request".to_owned());
    }
    if round.round() != 0 {
        return Err("a limiter of one permit granted a second".to_owned());
    }
    Ok(round)
}

/// Decides nothing: the loop alone.
struct Nothing;

impl Round for Nothing {
    #[inline]
    fn round(&mut self) -> u64 {
        u64::from(black_box(true))
    }
}

/// One `try_acquire` on a tollgate limiter, its answer counted as a program would use it: the
/// limiter's atomic operations cannot be left out, so nothing needs hiding from the optimiser (a
/// `black_box` would add its own stores and loads to the count).
struct Tollgate<L>(L);

impl<L: Limiter> Round for Tollgate<L> {
    #[inline]
    fn round(&mut self) -> u64 {
        u64::from(self.0.try_acquire())
    }
}

/// One `try_acquire_n(1)` on a tollgate limiter, keeping the whole [`tollgate::Decision`] (what a
/// proxy needs for its response headers) rather than only yes or no.
struct FullDecision<L>(L);

impl<L: Limiter> Round for FullDecision<L> {
    #[inline]
    fn round(&mut self) -> u64 {
        // The whole decision is kept (`black_box`), not only the answer the count needs.
        u64::from(black_box(self.0.try_acquire_n(1)).is_allowed())
    }
}

/// governor's direct (single-state) limiter on its default clock, `quanta`'s counter: the same
/// source as [`MonotonicClock`].
type GovernorDirect = governor::DefaultDirectRateLimiter;

/// One `check` on a governor limiter, its answer counted as [`Tollgate`]'s is.
struct Governor(GovernorDirect);

impl Round for Governor {
    #[inline]
    fn round(&mut self) -> u64 {
        u64::from(self.0.check().is_ok())
    }
}

// The default hashers: the service's `SipState` and governor's (DashMap's) std `RandomState`,
// both SipHash-1-3 of the key's bytes under random keys. The keys move entries, and with them
// probe lengths, so these cases' counts move slightly from run to run. Fixed keys would not, but
// they are constants the compiler folds into whichever hash it inlines (governor's lookup then
// counted 13 fewer than with the default), which no user of the default gets.

/// foldhash with a fixed seed, kept in the map as a random one would be (nothing to fold): a fast
/// hasher a user may choose (`ServiceBuilder::hasher`), exact from run to run, and a measure of
/// how much of a request the hashing is.
type FixedFoldHash = foldhash::fast::FixedState;

/// The plan every client is on.
#[derive(Debug, PartialEq, Eq)]
enum Plan {
    Standard,
}

/// tollgate's service: token bucket, one plan, the production clock, hasher `S`.
type TollgateService<S> = RateLimiterService<u64, Plan, MonotonicClock, S>;

fn tollgate_service<S: BuildHasher + Clone>(hasher: S, clients: u64) -> TollgateService<S> {
    tollgate_service_of_capacity(hasher, service_capacity(clients))
}

fn tollgate_service_of_capacity<S: BuildHasher + Clone>(
    hasher: S,
    capacity: usize,
) -> TollgateService<S> {
    ServiceBuilder::new(Algorithm::TokenBucket, MonotonicClock::new())
        .plan(Plan::Standard, refilling_rule())
        .hasher(hasher)
        .capacity(capacity)
        .build()
        .expect("the rule is valid for the token bucket")
}

/// The lookup of a known client (`Lookup`, every decision allowed) in a service of `method`
/// under `rule`, with the default hasher.
fn lookup_of_method(method: Algorithm, rule: Rule, rounds: u64) -> Result<u64, String> {
    let service: TollgateService<SipState> = ServiceBuilder::new(method, MonotonicClock::new())
        .plan(Plan::Standard, rule)
        .capacity(service_capacity(LOOKUP_CLIENTS))
        .build()
        .expect("the rule is valid for the method");
    drive(
        Lookup::new(service, LOOKUP_CLIENTS)?,
        rounds,
        Expect::Allowed,
    )
}

/// governor's keyed limiter (a `DashMap` of GCRA words) on its default clock, hasher `S`.
type GovernorKeyed<S> = governor::DefaultKeyedRateLimiter<u64, NoOpMiddleware<QuantaInstant>, S>;

fn governor_keyed<S: BuildHasher + Clone + Default>(hasher: S) -> GovernorKeyed<S> {
    GovernorKeyed::dashmap_with_hasher(governor_quota(refilling_rule()), hasher)
}

/// A limiter keyed by client: one request from `client`, allowed or not.
trait Keyed {
    fn allow(&self, client: u64) -> bool;

    /// Clients held, and clients evicted (0 where the map never evicts).
    fn held_and_evicted(&self) -> (usize, u64);
}

impl<S: BuildHasher> Keyed for TollgateService<S> {
    #[inline]
    fn allow(&self, client: u64) -> bool {
        self.allow(&client, &Plan::Standard)
            .expect("the plan has a rule")
    }

    fn held_and_evicted(&self) -> (usize, u64) {
        (self.len(), self.evictions())
    }
}

impl<S: BuildHasher + Clone> Keyed for GovernorKeyed<S> {
    #[inline]
    fn allow(&self, client: u64) -> bool {
        self.check_key(&client).is_ok()
    }

    fn held_and_evicted(&self) -> (usize, u64) {
        (self.len(), 0)
    }
}

/// A request from a known client: the clients `0..clients` in turn.
struct Lookup<M> {
    map: M,
    clients: u64,
    next_client: u64,
}

impl<M: Keyed> Lookup<M> {
    /// `map` with the first request of each of `clients` clients made, every one still held.
    fn new(map: M, clients: u64) -> Result<Self, String> {
        let admitted = (0..clients).filter(|&client| map.allow(client)).count();
        if admitted as u64 != clients {
            return Err(format!("{admitted} of {clients} first requests admitted"));
        }
        // A client dropped to make room would make its lookups inserts: allowed for at most one
        // client in 10,000 (an idle client's slot taken by another whose buckets were full,
        // which a run of a million may see once), whose few inserts the count absorbs.
        let (held, evicted) = map.held_and_evicted();
        if (held as u64) < clients - clients / 10_000 || evicted != 0 {
            return Err(format!(
                "{held} of {clients} clients held, {evicted} evicted: the capacity is too small"
            ));
        }
        Ok(Lookup {
            map,
            clients,
            next_client: 0,
        })
    }
}

impl<M: Keyed> Round for Lookup<M> {
    #[inline]
    fn round(&mut self) -> u64 {
        let client = self.next_client;
        self.next_client = if client + 1 == self.clients {
            0
        } else {
            client + 1
        };
        u64::from(black_box(black_box(&self.map).allow(black_box(client))))
    }
}

/// The default hasher under a type of its own: the full store's case is then an instance of the
/// service's generic code of its own, and the other cases' instances are compiled (and inlined)
/// as they are without it.
#[derive(Debug, Clone, Default)]
struct FullStoreHasher(SipState);

impl BuildHasher for FullStoreHasher {
    type Hasher = <SipState as BuildHasher>::Hasher;

    #[inline]
    fn build_hasher(&self) -> Self::Hasher {
        self.0.build_hasher()
    }
}

/// A request from a client the service has never seen, into a store whose every slot is held
/// by an idle client: each takes an idle client's slot (no eviction: that changes no answer).
struct FullStore<S: BuildHasher> {
    service: TollgateService<S>,
    next_client: u64,
}

impl<S: BuildHasher + Clone> FullStore<S> {
    /// `service`, of capacity [`FULL_STORE_CAPACITY`], filled by [`FULL_STORE_FILL`] first
    /// requests of new clients; checked to hold a client in every slot, none evicted.
    fn new(service: TollgateService<S>) -> Result<Self, String> {
        for client in 0..FULL_STORE_FILL {
            if !Keyed::allow(&service, client) {
                return Err(format!("client {client}'s first request denied"));
            }
        }
        let (held, evicted) = service.held_and_evicted();
        if held != FULL_STORE_CAPACITY || evicted != 0 {
            return Err(format!(
                "{held} of {FULL_STORE_CAPACITY} slots held, {evicted} evicted: the store did \
                 not fill with idle clients"
            ));
        }
        Ok(FullStore {
            service,
            next_client: FULL_STORE_FILL,
        })
    }
}

impl<S: BuildHasher> Round for FullStore<S> {
    #[inline]
    fn round(&mut self) -> u64 {
        let client = self.next_client;
        self.next_client += 1;
        u64::from(black_box(Keyed::allow(
            black_box(&self.service),
            black_box(client),
        )))
    }
}

/// A batch of requests from clients the map has never seen, into a fresh map each round.
struct FirstRequests<M, F> {
    map: M,
    make: F,
}

impl<M: Keyed, F: Fn() -> M> FirstRequests<M, F> {
    fn new(make: F) -> Self {
        FirstRequests { map: make(), make }
    }
}

impl<M: Keyed, F: Fn() -> M> Round for FirstRequests<M, F> {
    const DECISIONS: u64 = FIRST_REQUEST_BATCH;
    const RENEWS: bool = true;

    #[inline]
    fn round(&mut self) -> u64 {
        let map = black_box(&self.map);
        (0..FIRST_REQUEST_BATCH)
            .map(|client| u64::from(black_box(map.allow(black_box(client)))))
            .sum()
    }

    fn renew(&mut self) {
        // Making the next map, and dropping the filled one, are not part of a first request.
        self.map = (self.make)();
    }
}
