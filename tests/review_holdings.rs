//! Review of the insert lock's count of holdings (79d4749, `ClientStore::holdings`): a first
//! request reads its home lock's count before its look at both buckets, and where that
//! look saw no tag of its key's and the insert takes the lock at the same count, the insert
//! skips its passes over the buckets (`find_settled`). Public API only.
//!
//! Two kinds of test:
//!
//! - Deterministic: a first request is parked *between its look and its insert*, through the
//!   key's `Hash`: where the plan has had several limits, the decision hashes the key a second
//!   time right before its insert (`retire_in_map`'s map lookup), after the look. While it is
//!   parked, the same key is inserted (in its home bucket, or in its other bucket with a slot
//!   of the home freed afterwards), or a rule changes; the parked insert must then find that
//!   state, not put a second.
//! - Races, started together on a spun flag (not a blocking barrier, so that the racing first
//!   requests overlap): many rounds of one fresh key raced by several threads (exactly the limit
//!   granted per round, one state per key), with sweeps freeing slots and rule changes racing
//!   them, and keys that share one home bucket (its lock's count moving all the time).
//!
//! What they hold the service to: a key has one live state (its grants at one clock instant
//! never pass one limit; `len()` counts one slot per key); a rule change starts a client afresh
//! at most once; no eviction while idle or free slots are there; no hang.
//!
//! Checked against planted faults in a copy of the crate: an insert that skips its passes
//! whatever the count, or a lock whose release does not advance the count, fails the two
//! deterministic tests of the same key every time (and the races); the count read after the
//! look (`StoreFault::HoldingsReadAfterTheLook`) has no window a hook can reach, and fails
//! `first_requests_of_one_fresh_key_racing_get_one_state_and_one_grant` (tens to hundreds of
//! rounds in 50,000 with two idle cores). About 6 s on two cores.

use std::cell::RefCell;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::Duration;

use tollgate::{Algorithm, FakeClock, RateLimiterService, Rule, ServiceBuilder, SipState};

#[path = "support/park.rs"]
mod park;
use park::{Park, Parked, park_request, step_towards_park};
#[path = "support/grants.rs"]
mod grants;
use grants::grants_until_denied;
#[path = "support/race.rs"]
mod race;
use race::{off_rounds, race_rounds, race_rounds_read};

/// The methods whose clients live in the fixed store.
const STORE_METHODS: [Algorithm; 3] = [
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowCounter,
];

const PLAN: &str = "p";
const WINDOW: Duration = Duration::from_secs(1);

fn rule(limit: u64) -> Rule {
    Rule::new(limit, WINDOW).unwrap()
}

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// One test at a time: the races want the machine's cores.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------------------------------------
// Keys, hashers, parking.
// ---------------------------------------------------------------------------------------------

/// A client key: its `Hash` writes the `u64` (so that [`Chosen`] makes it the hash itself), and
/// steps this thread towards its park, if it asked for one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key(u64);

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        step_towards_park(&PARK);
        state.write_u64(self.0);
    }
}

/// A hasher whose hash of a [`Key`] is the key's number: the tests choose home buckets and
/// fingerprints.
#[derive(Debug, Clone, Copy, Default)]
struct Chosen;

struct ChosenHasher(u64);

impl Hasher for ChosenHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 << 8) | u64::from(byte);
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

impl BuildHasher for Chosen {
    type Hasher = ChosenHasher;
    fn build_hasher(&self) -> ChosenHasher {
        ChosenHasher(0)
    }
}

/// The store's bucket of `hash` among `buckets` (its home bucket; mirrors the store's private
/// `bucket_of`: should it change, the placement checks of the tests that use it fail loudly).
fn bucket_of(hash: u64, buckets: u64) -> u64 {
    ((u128::from(hash) * u128::from(buckets)) >> 64) as u64
}

/// The store's other bucket of `hash` (mirrors `ClientStore::other_of`).
fn other_of(hash: u64, buckets: u64) -> u64 {
    bucket_of(
        (hash ^ (hash >> 31)).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        buckets,
    )
}

thread_local! {
    /// This thread's park at its `n`th hash of a [`Key`], if it asked for one.
    static PARK: RefCell<Option<Park>> = const { RefCell::new(None) };
}

type Service<S> = RateLimiterService<Key, &'static str, FakeClock, S>;

/// A service of one plan at `limit` per second whose plan has had two limits and is back at
/// one (so a first request's insert is preceded by a lookup of its key in the plan's map, which
/// hashes it: hash 1 places the key, hash 2 comes after the look, right before the insert). The
/// map is left empty, its table allocated.
fn service_with_a_gap<S: BuildHasher + Clone>(
    algorithm: Algorithm,
    clock: &FakeClock,
    capacity: usize,
    hasher: S,
    limit: u64,
) -> Arc<Service<S>> {
    let service = ServiceBuilder::new(algorithm, clock.clone())
        .plan_limits(PLAN, [rule(limit), Rule::per_minute(100).unwrap()])
        .capacity(capacity)
        .hasher(hasher)
        .build::<Key>()
        .unwrap();
    // A client under two limits, so that the map has a table (its lookups hash).
    assert!(service.allow(&Key(u64::MAX - 1), &PLAN).unwrap());
    service.set_limits(&PLAN, [rule(limit)]).unwrap();
    // Its state, made under the earlier limits, swept: the service holds no client.
    assert_eq!(service.sweep(), 1, "{algorithm}: the map's client swept");
    assert_eq!(service.len(), 0, "{algorithm}");
    Arc::new(service)
}

/// A first request of `key`, on a thread of its own, parked between its look at the buckets
/// (which found nothing) and its insert: at its second hash (the first places the key; the
/// second is the map's lookup, after the look).
fn park_first_request<S>(service: &Arc<Service<S>>, key: Key) -> Parked<bool>
where
    S: BuildHasher + Send + Sync + 'static,
{
    let service = Arc::clone(service);
    park_request(&PARK, 2, "between its look and its insert", move || {
        service.allow(&key, &PLAN).unwrap()
    })
}

/// Asks for `key` until denied (at most `up_to + 1` asks); how many permits it got.
fn spend<S: BuildHasher>(service: &Service<S>, key: Key, up_to: u64) -> u64 {
    grants_until_denied(up_to, || service.allow(&key, &PLAN).unwrap())
}

// ---------------------------------------------------------------------------------------------
// Deterministic: the same key inserted between a first request's look and its insert.
// ---------------------------------------------------------------------------------------------

/// A first request of key K parked after its look (no state of K anywhere; its home lock's count
/// read before that look), then K's first request on this thread inserts K's state (taking and
/// letting go the same home lock) and spends the limit. Resumed, the parked insert takes the
/// lock at a later count: it must make its passes, find that state and be denied on it. One
/// state: `len()` is 1, the limit granted once, no eviction.
///
/// Catches an insert that skips its passes whatever the count (or a count that does not move on
/// release): the parked insert then claims a second slot and is granted afresh.
#[test]
fn a_state_put_while_a_first_request_is_between_its_look_and_its_insert_is_found() {
    let _serial = serial();
    const LIMIT: u64 = 4;
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(millis(500));
        let service = service_with_a_gap(algorithm, &clock, 1024, SipState::new(), LIMIT);
        let key = Key(42);
        let parked = park_first_request(&service, key);
        assert_eq!(
            spend(&service, key, LIMIT),
            LIMIT,
            "{algorithm}: in the gap"
        );
        let late = parked.resume();
        assert_eq!(
            (
                late,
                spend(&service, key, LIMIT),
                service.len(),
                service.evictions()
            ),
            (false, 0, 1, 0),
            "{algorithm}: the parked request, grants after, len, evictions"
        );
    }
}

/// The same, with K's state put in K's *other* bucket (its home full of clients, one of them
/// idle), and a sweep freeing that idle client's slot in the home bucket before the parked
/// insert resumes: a free slot is there in the home, and K's state is in the other bucket. The
/// parked insert must look in both buckets (its count moved) and be denied on K's state.
#[test]
fn a_state_put_in_the_other_bucket_while_the_home_frees_a_slot_is_found() {
    let _serial = serial();
    const LIMIT: u64 = 4;
    // Two buckets: a hash's top bit is its home.
    const CAPACITY: usize = 16;
    let buckets = (CAPACITY / 8) as u64;
    // Home 0, other bucket 1, a fingerprint no filler has.
    let key = Key((1_000..)
        .find(|&hash| bucket_of(hash, buckets) == 0 && other_of(hash, buckets) == 1)
        .unwrap());
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(millis(500));
        let service = service_with_a_gap(algorithm, &clock, CAPACITY, Chosen, LIMIT);
        // Filler 1 takes one permit now and is idle ten seconds later; fillers 2..=8 spend their
        // limit then. All eight live in bucket 0 (their home, free while they come).
        assert!(service.allow(&Key(1), &PLAN).unwrap());
        clock.advance(Duration::from_secs(10));
        for filler in 2..=8 {
            assert_eq!(spend(&service, Key(filler), LIMIT), LIMIT, "{algorithm}");
        }
        assert_eq!(service.len(), 8, "{algorithm}");
        let parked = park_first_request(&service, key);
        assert_eq!(
            spend(&service, key, LIMIT),
            LIMIT,
            "{algorithm}: in the gap"
        );
        assert_eq!(
            (service.len(), service.evictions()),
            (9, 0),
            "{algorithm}: K went to its other bucket's free slot, not the idle filler's"
        );
        assert_eq!(service.sweep(), 1, "{algorithm}: the idle filler swept");
        let late = parked.resume();
        assert_eq!(
            (
                late,
                spend(&service, key, LIMIT),
                service.len(),
                service.evictions()
            ),
            (false, 0, 8, 0),
            "{algorithm}: the parked request, grants after, len, evictions"
        );
        for filler in 2..=8 {
            assert_eq!(
                spend(&service, Key(filler), LIMIT),
                0,
                "{algorithm}: filler {filler}"
            );
        }
    }
}

/// Controls of the same gap where the parked insert must *not* find a state: another key of
/// the same home bucket is inserted in the gap (the count moves, the passes find nothing of
/// K's), or nothing is (the count stands, the passes are skipped). Either way K gets one state
/// and exactly its limit.
#[test]
fn a_first_request_resumed_after_another_key_of_its_home_or_nothing_gets_one_state() {
    let _serial = serial();
    const LIMIT: u64 = 4;
    const CAPACITY: usize = 16;
    for algorithm in STORE_METHODS {
        for other_key_in_the_gap in [false, true] {
            let clock = FakeClock::starting_at(millis(500));
            let service = service_with_a_gap(algorithm, &clock, CAPACITY, Chosen, LIMIT);
            // Both of home 0.
            let (key, neighbour) = (Key(7), Key(8));
            let parked = park_first_request(&service, key);
            if other_key_in_the_gap {
                assert_eq!(spend(&service, neighbour, LIMIT), LIMIT);
            }
            let late = parked.resume();
            assert_eq!(
                (
                    late,
                    u64::from(late) + spend(&service, key, LIMIT),
                    service.len()
                ),
                (true, LIMIT, 1 + usize::from(other_key_in_the_gap)),
                "{algorithm}, another key in the gap: {other_key_in_the_gap}: the parked \
                 request, the key's grants, len"
            );
        }
    }
}

/// A rule change in the gap (4/s to 2/s), then K's first request under the new rule spends it:
/// the parked insert (holding the old rule's limits) must not add a start: K gets exactly the
/// new rule's limit. And the same without K's request in the gap (the parked insert's count
/// stands: it skips its passes, puts a state under the old rule, which is retired at once):
/// still exactly the new limit, one state.
#[test]
fn a_rule_change_in_the_gap_starts_the_client_once() {
    let _serial = serial();
    const OLD: u64 = 4;
    const NEW: u64 = 2;
    for algorithm in STORE_METHODS {
        for key_in_the_gap in [false, true] {
            let clock = FakeClock::starting_at(millis(500));
            let service = service_with_a_gap(algorithm, &clock, 1024, SipState::new(), OLD);
            let key = Key(9);
            let parked = park_first_request(&service, key);
            service.set_rule(&PLAN, rule(NEW)).unwrap();
            let mut granted = 0;
            if key_in_the_gap {
                granted += spend(&service, key, NEW + OLD);
            }
            granted += u64::from(parked.resume());
            granted += spend(&service, key, NEW + OLD);
            assert_eq!(
                (granted, service.len(), service.evictions()),
                (NEW, 1, 0),
                "{algorithm}, key in the gap: {key_in_the_gap}: grants, len, evictions"
            );
        }
    }
}

/// A change to two limits in the gap (4/s to 2/s and 100/min): the plan's clients move to its
/// map, where K's requests under the new limits make K's entry and spend it. The parked request
/// read the plan's limits before the change (one limit, its store); resumed, its retirement of
/// K's map entry (meant for an entry of an earlier rule of several) must leave that entry, made
/// under the later limits, alone, and the request is then decided on it: K gets exactly the new
/// short limit, once.
///
/// Catches a retirement of the map's entry whatever rule it was made under: K's spent entry is
/// retired, the next request makes a fresh one, and K is granted the new limit again.
#[test]
fn a_change_to_several_limits_in_the_gap_leaves_the_new_entry_in_place() {
    let _serial = serial();
    const OLD: u64 = 4;
    const NEW: u64 = 2;
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(millis(500));
        let service = service_with_a_gap(algorithm, &clock, 1024, SipState::new(), OLD);
        let key = Key(11);
        let parked = park_first_request(&service, key);
        service
            .set_limits(&PLAN, [rule(NEW), Rule::per_minute(100).unwrap()])
            .unwrap();
        let in_the_gap = spend(&service, key, NEW + OLD);
        let late = u64::from(parked.resume());
        let after = spend(&service, key, NEW + OLD);
        assert_eq!(
            (in_the_gap, late, after, service.len()),
            (NEW, 0, 0, 1),
            "{algorithm}: grants in the gap, to the parked request, after it; len"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Races.
// ---------------------------------------------------------------------------------------------

/// [`race_rounds`] on `service` where, between rounds, the clock moves on 3 windows (the
/// earlier rounds' keys are then idle) and a sweep frees their slots. Returns each round's
/// answers, by thread, and `len()` at the end of each round (before the clock moves on).
fn race_rounds_between_sweeps<S: BuildHasher + Send + Sync + 'static>(
    service: &Arc<Service<S>>,
    clock: FakeClock,
    threads: usize,
    rounds: usize,
    work: impl Fn(&Service<S>, usize) -> u64 + Send + Sync + 'static,
) -> (Vec<Vec<u64>>, Vec<usize>) {
    race_rounds_read(
        service,
        threads,
        rounds,
        Service::len,
        move |service| {
            clock.advance(3 * WINDOW);
            service.sweep();
        },
        move |service, _, round| work(service, round),
    )
}

/// Rounds of one fresh key raced by `THREADS` threads at one clock instant, each asking once
/// (a limit of 1): exactly one grant per round, and at the end one state per key (`len()` is
/// the number of rounds), no eviction (the table is large). A second state for a key shows as
/// two grants in its round, and as one more in `len()`. The only test here that reaches the
/// window between a decision's look and its reading of the count (no user code runs there):
/// its power depends on the two cores being free.
#[test]
fn first_requests_of_one_fresh_key_racing_get_one_state_and_one_grant() {
    let _serial = serial();
    const THREADS: usize = 4;
    const ROUNDS: usize = 50_000;
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(millis(500));
        let service: Arc<Service<SipState>> = Arc::new(
            ServiceBuilder::new(algorithm, clock)
                .plan(PLAN, rule(1))
                .capacity(1 << 18)
                .hasher(SipState::new())
                .build::<Key>()
                .unwrap(),
        );
        let answers = {
            let service = Arc::clone(&service);
            race_rounds(
                THREADS,
                ROUNDS,
                |_| {},
                move |_, round| u64::from(service.allow(&Key(round as u64), &PLAN).unwrap()),
            )
        };
        let grants = |round: usize| answers[round].iter().sum::<u64>();
        assert_eq!(
            off_rounds(&answers, |round, _| grants(round) == 1),
            (0, vec![]),
            "{algorithm}: rounds not granted exactly once (round, answers by thread)"
        );
        assert_eq!(
            (service.len(), service.evictions()),
            (ROUNDS, 0),
            "{algorithm}: len, evictions"
        );
    }
}

/// Rounds of one fresh key raced by two threads asking until denied, in a table of two buckets
/// (16 slots), with a third thread sweeping all the while; between rounds the clock moves on 3
/// windows and a sweep frees every earlier key's slot (all idle). A sweep retires
/// the key's fresh state when it catches it before its first decision, and frees slots the
/// inserts then claim without their passes. Each round: exactly the limit granted, and one
/// state at its end (`len()` is 1: earlier keys were swept); never an eviction.
#[test]
fn first_requests_racing_sweeps_in_a_small_table_get_one_limit() {
    let _serial = serial();
    const RACERS: usize = 2;
    const ROUNDS: usize = 10_000;
    const LIMIT: u64 = 2;
    const CAPACITY: usize = 16;
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(millis(500));
        let service: Arc<Service<SipState>> = Arc::new(
            ServiceBuilder::new(algorithm, clock.clone())
                .plan(PLAN, rule(LIMIT))
                .capacity(CAPACITY)
                .build::<Key>()
                .unwrap(),
        );
        let stop = Arc::new(AtomicBool::new(false));
        let sweeper = {
            let (service, stop) = (Arc::clone(&service), Arc::clone(&stop));
            thread::spawn(move || {
                let mut sweeps = 0_u64;
                while !stop.load(Ordering::Relaxed) {
                    service.sweep();
                    assert!(service.len() <= CAPACITY);
                    sweeps += 1;
                    thread::yield_now();
                }
                sweeps
            })
        };
        let (answers, lens) =
            race_rounds_between_sweeps(&service, clock, RACERS, ROUNDS, |service, round| {
                spend(service, Key(round as u64), LIMIT + 1)
            });
        stop.store(true, Ordering::Relaxed);
        let sweeps = sweeper.join().unwrap();
        let grants = |round: usize| answers[round].iter().sum::<u64>();
        assert_eq!(
            off_rounds(&answers, |round, _| grants(round) == LIMIT),
            (0, vec![]),
            "{algorithm}: rounds not granted exactly the limit (round, grants by thread)"
        );
        assert_eq!(
            off_rounds(&lens, |_, &len| len == 1),
            (0, vec![]),
            "{algorithm}: rounds ending with other than one state (round, len)"
        );
        assert_eq!(service.evictions(), 0, "{algorithm}: evictions");
        assert!(sweeps > 0);
    }
}

/// Rounds of four fresh keys that share one home bucket (chosen hashes: the same high bits,
/// their own fingerprints), asked in turn by two threads (until denied), so that the home
/// lock's count moves under decisions (the other keys' inserts) while the same key's inserts
/// race. Between rounds the clock moves on 3 windows (earlier keys idle) and a sweep frees
/// their slots. Each key of each round: exactly its limit; each round ends with one state per
/// key (`len()` is 4). No eviction.
#[test]
fn keys_sharing_a_home_bucket_racing_get_one_limit_each() {
    let _serial = serial();
    const ROUNDS: usize = 10_000;
    const KEYS: u64 = 4;
    const LIMIT: u64 = 2;
    const CAPACITY: usize = 64;
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(millis(500));
        let service: Arc<Service<Chosen>> = Arc::new(
            ServiceBuilder::new(algorithm, clock.clone())
                .plan(PLAN, rule(LIMIT))
                .capacity(CAPACITY)
                .hasher(Chosen)
                .build::<Key>()
                .unwrap(),
        );
        // Home bucket 3 of 8 (the top bits), fingerprint = 1 + round * KEYS + index.
        let key = |round: usize, index: u64| Key((3 << 61) | (1 + round as u64 * KEYS + index));
        let (answers, lens) =
            race_rounds_between_sweeps(&service, clock, 2, ROUNDS, move |service, round| {
                // Each key's grants, 16 bits apiece.
                let mut packed = 0;
                for index in 0..KEYS {
                    let granted = spend(service, key(round, index), LIMIT);
                    packed |= granted << (16 * index);
                }
                packed
            });
        // Each round's grants, key by key.
        let per_key: Vec<Vec<u64>> = answers
            .iter()
            .map(|packed| {
                (0..KEYS)
                    .map(|index| packed.iter().map(|p| (p >> (16 * index)) & 0xffff).sum())
                    .collect()
            })
            .collect();
        assert_eq!(
            off_rounds(&per_key, |_, grants| grants.iter().all(|&g| g == LIMIT)),
            (0, vec![]),
            "{algorithm}: rounds where a key was not granted exactly its limit (round, grants \
             by key)"
        );
        assert_eq!(
            off_rounds(&lens, |_, &len| len == KEYS as usize),
            (0, vec![]),
            "{algorithm}: rounds ending with other than one state per key (round, len)"
        );
        assert_eq!(service.evictions(), 0, "{algorithm}: evictions");
    }
}

/// Rounds of one fresh key raced by two threads asking until denied, while a third thread
/// changes the plan's rule once during the round (3/s and 2/s in turn). A change starts the key
/// afresh at most once: per round, at most the old limit plus the new one; and at least the
/// smaller limit. One state per key at the end: `len()` the number of rounds (a large table,
/// no eviction). Every earlier round's state is of an earlier rule and stays (nothing sweeps, the
/// clock never moves), so the table must keep every key's two buckets from filling: a key that
/// finds no free slot there reuses, uncounted, another key's state of an earlier rule (which
/// changes no answer, but `len()` does not grow). At 1 << 15 slots (8,000 keys, about 2 per
/// bucket) that happened in about one run of 200; at 1 << 17 (one key per 2 buckets) the
/// chance is below 10^-10 a run.
#[test]
fn first_requests_racing_a_rule_change_start_the_client_at_most_once_per_change() {
    let _serial = serial();
    const ROUNDS: usize = 8_000;
    const LIMITS: [u64; 2] = [3, 2];
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(millis(500));
        let service: Arc<Service<SipState>> = Arc::new(
            ServiceBuilder::new(algorithm, clock)
                .plan(PLAN, rule(LIMITS[0]))
                .capacity(1 << 17)
                .build::<Key>()
                .unwrap(),
        );
        let (answers, lens) = race_rounds_read(
            &service,
            3,
            ROUNDS,
            Service::len,
            |_| {},
            move |service, thread, round| {
                if thread == 2 {
                    // The round's change: to the other limit.
                    service
                        .set_rule(&PLAN, rule(LIMITS[(round + 1) % 2]))
                        .unwrap();
                    0
                } else {
                    spend(service, Key(round as u64), LIMITS[0] + LIMITS[1])
                }
            },
        );
        let grants = |round: usize| answers[round].iter().sum::<u64>();
        assert_eq!(
            off_rounds(&answers, |round, _| (2..=5).contains(&grants(round))),
            (0, vec![]),
            "{algorithm}: rounds granted more than two limits, or less than one (round, \
             grants by thread)"
        );
        let drops: Vec<(usize, usize, usize)> = lens
            .iter()
            .enumerate()
            .filter(|&(round, &len)| len != round + 1)
            .map(|(round, &len)| (round, len, answers[round].iter().sum::<u64>() as usize))
            .take(5)
            .collect();
        assert_eq!(
            (service.len(), service.evictions()),
            (ROUNDS, 0),
            "{algorithm}: len, evictions; first rounds off (round, len after it, grants): {drops:?} answers there: {:?}",
            drops.first().map(|d| answers[d.0].clone())
        );
    }
}
