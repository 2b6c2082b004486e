//! The home lock's `OVERFLOWED` bit (c736ac2), through the public API only. An insert that puts
//! a key's state in the key's *other* bucket (a free slot claimed there, or a slot reused or
//! evicted there once both buckets were full) sets bit 1 of the key's home insert lock when it
//! lets the lock go, and the bit is never cleared. A decision whose look at home finds no tag of
//! its key's, and whose word of the home lock (read before that look) had neither `HELD` nor
//! `OVERFLOWED`, skips the other bucket and goes straight to the insert. These tests put a
//! key's state in its other bucket and then make the store offer a free slot to a second
//! insert of that key, so that a skip that should not happen shows as a second state: the key
//! granted a second limit in one window, an attempt of 0 permits answered as a fresh client,
//! one state more in `len()`, or a sweep freeing one state more.
//!
//! The ways a key gets to its other bucket: a free slot claimed there (home full); an idle
//! state reused there (both buckets full, the other bucket's states idle). The ways a free slot
//! appears afterwards: the other bucket's own free slots (home kept full); a sweep of idle
//! states. The holdings of the home lock that follow the overflow and must keep its mark: an
//! eviction at home by a key whose other bucket is its home; a newcomer of the same home put in
//! a slot a sweep freed at home; a parked first request of the key whose insert finds the
//! key's state (a holding that puts nothing). Rule changes and a plan moved to several limits
//! and back must retire the key's overflowed state of the earlier limits, not leave it beside a
//! fresh one. Tables of one bucket (every key's other bucket is its home), two and three
//! buckets; generation wrap of the overflowed slot (and a state overflowed by an eviction).
//! Two random runs: one thread against a twin service that keeps the same clients in its map
//! (a table whose keys can never need an eviction must answer every request and peek as the
//! map does), and rounds of two deciding threads and a sweeping one on fresh tables (each key
//! granted exactly what a peek before the round reported left). A race of a key's first
//! requests with a newcomer of its home for the home's last free slot, each round in a home
//! bucket of its own whose mark is still clear. Every test runs under the three methods the
//! store keeps, and asserts exact grants, `len()`, `evictions()`, sweeps and decision counts.
//!
//! Checked against bugs planted by hand in `src/service/store.rs` (each reverted): no mark at
//! all (every test but the one-bucket one fails); no mark in `insert_reusing` (the idle-reuse
//! and the eviction tests fail); no mark on the free claim in the other bucket (ten fail); the
//! skip whatever the word (all but the one-bucket test fail); the mark cleared when a holding
//! is let go (the eviction-at-home, swept-and-refilled, parked, differential and racing-rounds
//! tests fail, and the newcomer race in some runs). `HELD` left out of the skip condition is
//! caught by none, and cannot be: a word with `HELD` gives the insert no count to skip its
//! passes by, so it looks at both buckets under the lock (at worst one more insert attempt and
//! clock reading).
//!
//! Keys are placed by an identity hasher (`key_at`: a `u64` key is its own hash). The clock is
//! a `FakeClock` (never moved during a window), or a `ParkingClock` that parks a request at its
//! first clock reading: for a key with no state at home, that reading is taken after the
//! decision's look, before its insert takes the home lock.

use std::sync::Arc;
use std::time::Duration;

use tollgate::{Algorithm, Clock, FakeClock, RateLimiterService, Rule, ServiceBuilder};

#[path = "support/grants.rs"]
mod grants;
#[path = "support/park.rs"]
mod park;
#[path = "support/race.rs"]
mod race;
#[path = "support/stress.rs"]
mod stress;

use grants::grants_until_denied;
use park::{PARK_AT_READING, ParkingClock, park_request};
use race::race_rounds;
use stress::{Identity, PLAN, STORE_METHODS, bucket_of, key_at, other_of, serial};

/// The plan's permits per window.
const LIMIT: u64 = 3;
/// The window: a fake clock that is not moved refills nothing.
const WINDOW: Duration = Duration::from_secs(1);
/// Far enough for every state to be idle (two windows and more, for the sliding window counter).
const LATER: Duration = Duration::from_secs(10);
/// Where the clock starts.
const START: Duration = Duration::from_secs(10);

fn rule(limit: u64) -> Rule {
    Rule::new(limit, WINDOW).unwrap()
}

type Plain = RateLimiterService<u64, &'static str, FakeClock, Identity>;
type Parking = RateLimiterService<u64, &'static str, ParkingClock, Identity>;

/// A service of `buckets` buckets of 8 (decisions counted), reading `clock`.
fn plain(algorithm: Algorithm, clock: &FakeClock, buckets: usize) -> Arc<Plain> {
    Arc::new(
        ServiceBuilder::new(algorithm, clock.clone())
            .plan(PLAN, rule(LIMIT))
            .capacity(8 * buckets)
            .hasher(Identity)
            .count_decisions(true)
            .build::<u64>()
            .unwrap(),
    )
}

/// Asks for `key` until denied (at most `up_to + 1` asks); how many permits it got.
fn spend<C: Clock>(
    service: &RateLimiterService<u64, &'static str, C, Identity>,
    key: u64,
    up_to: u64,
) -> u64 {
    grants_until_denied(up_to, || service.allow(&key, &PLAN).unwrap())
}

/// (allowed, denied) under the plan.
fn counts<C: Clock>(service: &RateLimiterService<u64, &'static str, C, Identity>) -> (u64, u64) {
    let stats = service.stats(&PLAN).expect("counted");
    (stats.allowed, stats.denied)
}

/// What `key` has left, by a peek (both buckets, whatever the lock's word says).
fn peeked<C: Clock>(service: &RateLimiterService<u64, &'static str, C, Identity>, key: u64) -> u64 {
    service.peek(&key, &PLAN).unwrap().remaining()
}

/// What an attempt of 0 permits for `key` reports left: through the decision's path (a client
/// the decision does not find is answered as fresh, `LIMIT`, and no state is made).
fn asked_nothing<C: Clock>(
    service: &RateLimiterService<u64, &'static str, C, Identity>,
    key: u64,
) -> u64 {
    service.acquire(&key, &PLAN, 0).unwrap().remaining()
}

/// Checks that `key` is found spent (a peek and an attempt of 0 permits report nothing left,
/// and a request is denied), and the table's `(len, evictions)` after that request.
fn assert_spent_and_held<C: Clock>(
    service: &RateLimiterService<u64, &'static str, C, Identity>,
    key: u64,
    (len, evictions): (usize, u64),
    case: &str,
) {
    assert_eq!(
        (peeked(service, key), asked_nothing(service, key)),
        (0, 0),
        "{case}: K's peek, K's attempt of nothing"
    );
    assert_eq!(
        (
            spend(service, key, LIMIT),
            service.len(),
            service.evictions()
        ),
        (0, len, evictions),
        "{case}: K again, len, evictions"
    );
}

/// `n` keys of home `home` (and other bucket `other`) among `buckets`, fingerprints
/// `base + i`, each spent at the clock's reading (active): they fill `home` first.
fn spent_fillers<C: Clock>(
    service: &RateLimiterService<u64, &'static str, C, Identity>,
    base: u64,
    n: u64,
    (home, other, buckets): (usize, usize, usize),
) -> Vec<u64> {
    (0..n)
        .map(|i| {
            let key = key_at(base + i, home, other, buckets);
            assert_eq!(spend(service, key, LIMIT), LIMIT, "filler {i}");
            key
        })
        .collect()
}

/// The layouts of the tests of several tables: (buckets, K's home, K's other bucket).
const LAYOUTS: [(usize, usize, usize); 5] = [(2, 0, 1), (2, 1, 0), (3, 0, 2), (3, 2, 1), (3, 1, 0)];

// ---------------------------------------------------------------------------------------------
// Deterministic.
// ---------------------------------------------------------------------------------------------

/// Home full of eight active clients; K's first request claims a free slot in its other bucket
/// and K spends its limit. The home stays full, the other bucket has seven free slots: K's
/// next requests find no tag at home and must probe the other bucket (the home lock's word has
/// `OVERFLOWED`), not claim one of those free slots for a second state. An attempt of 0 permits
/// reports K spent, K is denied, one state per client, no eviction.
#[test]
fn a_key_overflowed_into_a_free_slot_is_found_while_home_stays_full() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        for (buckets, home, other) in LAYOUTS {
            let case = format!("{algorithm}, {buckets} buckets, K at ({home}, {other})");
            let clock = FakeClock::starting_at(START);
            let service = plain(algorithm, &clock, buckets);
            let fillers = spent_fillers(&*service, 0x1000, 8, (home, other, buckets));
            let key = key_at(0xAB_CDEF, home, other, buckets);
            assert_eq!(spend(&*service, key, LIMIT), LIMIT, "{case}: K");
            assert_eq!(
                (service.len(), service.evictions(), counts(&*service)),
                (9, 0, (9 * LIMIT, 9)),
                "{case}: len, evictions, (allowed, denied)"
            );
            assert_spent_and_held(&*service, key, (9, 0), &case);
            for filler in fillers {
                assert_eq!(spend(&*service, filler, LIMIT), 0, "{case}: filler");
            }
            assert_eq!(service.len(), 9, "{case}: len at the end");
        }
    }
}

/// Both of K's buckets full: home of eight active clients, the other bucket of eight clients
/// of its own home idle by now. K's insert reuses an idle slot in the other bucket (no free
/// slot, no eviction): `insert_reusing` must mark the home lock too. K spends its limit; a
/// sweep frees the other bucket's seven idle states. K's next requests must find K's state in
/// the other bucket, not claim a freed slot there.
#[test]
fn a_key_overflowed_by_reusing_an_idle_slot_is_found_once_the_other_bucket_is_swept() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(START);
        let service = plain(algorithm, &clock, 2);
        // Bucket 1's own keys, one permit each: idle once the clock has moved on.
        for i in 0..8 {
            assert!(service.allow(&key_at(0x2000 + i, 1, 0, 2), &PLAN).unwrap());
        }
        clock.advance(LATER);
        let fillers = spent_fillers(&*service, 0x1000, 8, (0, 1, 2));
        let key = key_at(0x55_5555, 0, 1, 2);
        assert_eq!(spend(&*service, key, LIMIT), LIMIT, "{algorithm}: K");
        assert_eq!(
            (service.len(), service.evictions()),
            (16, 0),
            "{algorithm}: an idle state reused, not evicted"
        );
        assert_eq!(
            service.sweep(),
            7,
            "{algorithm}: the other bucket's idle states swept"
        );
        assert_eq!(
            (
                service.len(),
                peeked(&*service, key),
                asked_nothing(&*service, key)
            ),
            (9, 0, 0),
            "{algorithm}: len, K's peek, K's attempt of nothing"
        );
        assert_eq!(
            (spend(&*service, key, LIMIT), service.len()),
            (0, 9),
            "{algorithm}: K after the sweep, len"
        );
        let newcomer = key_at(0x66_6666, 0, 1, 2);
        assert_eq!(
            (spend(&*service, newcomer, LIMIT), service.len()),
            (LIMIT, 10),
            "{algorithm}: a newcomer of K's home, len"
        );
        assert_eq!(
            (spend(&*service, key, LIMIT), service.evictions()),
            (0, 0),
            "{algorithm}: K again, evictions"
        );
        for filler in fillers {
            assert_eq!(spend(&*service, filler, LIMIT), 0, "{algorithm}: filler");
        }
        // Allowed: eight one-permit clients, eight fillers', K's and the newcomer's limits, and
        // K's attempt of nothing. Denied: each filler twice, K three times, the newcomer once.
        assert_eq!(
            counts(&*service),
            (8 + 10 * LIMIT + 1, 8 + 8 + 3 + 1),
            "{algorithm}: allowed, denied (the attempt of nothing counted as allowed)"
        );
    }
}

/// Both of K's buckets full of active clients: home of eight spent ones, the other bucket of
/// eight clients of its own home that took one permit each. K's insert finds nothing idle and
/// evicts the client with the most permits left, one in the other bucket: `insert_reusing`
/// must mark the home lock. A window later K is granted again on that state (all else idle),
/// and a sweep frees every other slot: K's next requests must still find K in the other
/// bucket, not claim a free slot at home.
#[test]
fn a_key_overflowed_by_an_eviction_is_found_after_a_sweep() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(START);
        let service = plain(algorithm, &clock, 2);
        spent_fillers(&*service, 0x1000, 8, (0, 1, 2));
        let tenants: Vec<u64> = (0..8).map(|i| key_at(0x2000 + i, 1, 0, 2)).collect();
        for &tenant in &tenants {
            assert!(service.allow(&tenant, &PLAN).unwrap());
        }
        let key = key_at(0x55_5555, 0, 1, 2);
        assert_eq!(spend(&*service, key, LIMIT), LIMIT, "{algorithm}: K");
        assert_eq!(
            (service.len(), service.evictions()),
            (16, 1),
            "{algorithm}: len, evictions"
        );
        let evicted = tenants
            .iter()
            .filter(|&&tenant| peeked(&*service, tenant) == LIMIT)
            .count();
        assert_eq!(
            evicted, 1,
            "{algorithm}: the victim is one of the other bucket's"
        );
        clock.advance(LATER);
        assert_eq!(
            spend(&*service, key, LIMIT),
            LIMIT,
            "{algorithm}: K a window later"
        );
        assert_eq!(service.sweep(), 15, "{algorithm}: all but K swept");
        assert_eq!(
            (
                service.len(),
                peeked(&*service, key),
                asked_nothing(&*service, key)
            ),
            (1, 0, 0),
            "{algorithm}: len, K's peek, K's attempt of nothing"
        );
        assert_eq!(
            (
                spend(&*service, key, LIMIT),
                service.len(),
                service.evictions()
            ),
            (0, 1, 1),
            "{algorithm}: K after the sweep, len, evictions"
        );
    }
}

/// Home full of active clients, K in its other bucket (a free claim) and spent. Then J, a key
/// of K's home whose other bucket is its home, evicts one of the home's clients: a holding of
/// K's home lock that puts nothing outside home. The lock's word must keep `OVERFLOWED`: K is
/// still found in its other bucket (not given a second state in one of its free slots).
#[test]
fn an_eviction_at_home_after_the_overflow_keeps_the_key_found() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        for (buckets, home, other) in LAYOUTS {
            let case = format!("{algorithm}, {buckets} buckets, K at ({home}, {other})");
            let clock = FakeClock::starting_at(START);
            let service = plain(algorithm, &clock, buckets);
            let fillers = spent_fillers(&*service, 0x1000, 8, (home, other, buckets));
            let key = key_at(0xAB_CDEF, home, other, buckets);
            assert_eq!(spend(&*service, key, LIMIT), LIMIT, "{case}: K");
            let stay_home = key_at(0x4000, home, home, buckets);
            assert_eq!(spend(&*service, stay_home, LIMIT), LIMIT, "{case}: J");
            assert_eq!(
                (service.len(), service.evictions()),
                (9, 1),
                "{case}: len, evictions after J"
            );
            assert_spent_and_held(&*service, key, (9, 1), &case);
            let fresh = fillers
                .iter()
                .filter(|&&filler| peeked(&*service, filler) == LIMIT)
                .count();
            assert_eq!(fresh, 1, "{case}: fillers read fresh (the one evicted)");
        }
    }
}

/// Home full (one client idle, seven active); K's first request claims a free slot in its
/// other bucket, and K spends its limit. A sweep frees the idle client's slot at home, and a
/// newcomer of K's home takes it (a holding of K's home lock that stays home). K's next
/// requests must still probe the other bucket.
#[test]
fn a_home_slot_swept_and_refilled_after_the_overflow_keeps_the_key_found() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        for (buckets, home, other) in LAYOUTS {
            let case = format!("{algorithm}, {buckets} buckets, K at ({home}, {other})");
            let clock = FakeClock::starting_at(START);
            let service = plain(algorithm, &clock, buckets);
            assert!(
                service
                    .allow(&key_at(0x2000, home, other, buckets), &PLAN)
                    .unwrap()
            );
            clock.advance(LATER);
            spent_fillers(&*service, 0x1000, 7, (home, other, buckets));
            let key = key_at(0xAB_CDEF, home, other, buckets);
            assert_eq!(spend(&*service, key, LIMIT), LIMIT, "{case}: K");
            assert_eq!(service.sweep(), 1, "{case}: the idle client swept");
            let newcomer = key_at(0x66_6666, home, other, buckets);
            assert_eq!(spend(&*service, newcomer, LIMIT), LIMIT, "{case}: newcomer");
            assert_eq!(service.len(), 9, "{case}: len");
            assert_spent_and_held(&*service, key, (9, 0), &case);
        }
    }
}

/// Home full of active clients; K's first request parked after its look (home lock's word
/// clear). This thread's first request of K claims a slot in the other bucket, and K spends
/// its limit. Resumed, the parked insert takes the lock at a later count, finds K's state
/// (nothing put: its holding goes nowhere) and is denied on it. The lock's word must keep
/// `OVERFLOWED` through that holding: K's next requests find K in the other bucket.
#[test]
fn a_parked_insert_that_finds_the_key_keeps_the_overflow_mark() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(START);
        let service: Arc<Parking> = Arc::new(
            ServiceBuilder::new(algorithm, ParkingClock(clock.clone()))
                .plan(PLAN, rule(LIMIT))
                .capacity(16)
                .hasher(Identity)
                .count_decisions(true)
                .build::<u64>()
                .unwrap(),
        );
        spent_fillers(&*service, 0x1000, 8, (0, 1, 2));
        let key = key_at(0x77_7777, 0, 1, 2);
        let parked = {
            let service = Arc::clone(&service);
            park_request(&PARK_AT_READING, 1, "at its first reading", move || {
                service.allow(&key, &PLAN).unwrap()
            })
        };
        assert_eq!(
            spend(&*service, key, LIMIT),
            LIMIT,
            "{algorithm}: K in the gap"
        );
        assert!(!parked.resume(), "{algorithm}: the parked request");
        assert_eq!(
            (service.len(), service.evictions(), counts(&*service)),
            (9, 0, (9 * LIMIT, 8 + 2)),
            "{algorithm}: len, evictions, (allowed, denied)"
        );
        assert_spent_and_held(&*service, key, (9, 0), &algorithm.to_string());
    }
}

/// K in its other bucket (home full of active clients), spent; the rule changes (3 to 2). K's
/// next request must find its state of the earlier rule in the other bucket and retire it
/// before it puts its fresh one: K gets the new limit, and the table holds eight stale
/// fillers and K's one state (not K's stale one beside it); a sweep then frees the eight.
#[test]
fn a_rule_change_retires_the_overflowed_state_before_the_fresh_one() {
    let _serial = serial();
    const NEW: u64 = 2;
    for algorithm in STORE_METHODS {
        for (buckets, home, other) in LAYOUTS {
            let case = format!("{algorithm}, {buckets} buckets, K at ({home}, {other})");
            let clock = FakeClock::starting_at(START);
            let service = plain(algorithm, &clock, buckets);
            spent_fillers(&*service, 0x1000, 8, (home, other, buckets));
            let key = key_at(0xAB_CDEF, home, other, buckets);
            assert_eq!(spend(&*service, key, LIMIT), LIMIT, "{case}: K");
            service.set_rule(&PLAN, rule(NEW)).unwrap();
            assert_eq!(
                (
                    spend(&*service, key, LIMIT),
                    service.len(),
                    service.evictions()
                ),
                (NEW, 9, 0),
                "{case}: K under the new rule, len, evictions"
            );
            assert_eq!(service.sweep(), 8, "{case}: the stale fillers swept");
            assert_eq!(
                (service.len(), spend(&*service, key, LIMIT)),
                (1, 0),
                "{case}: len after the sweep, K"
            );
        }
    }
}

/// K in its other bucket, spent; the plan moves to two limits (its clients to the map), then
/// back to one. Under two limits, K's look must find (and retire) its store state of the
/// earlier limits; back under one, K starts once more, with one state in the store (its map
/// entry retired), beside the eight stale fillers.
#[test]
fn a_plan_moved_to_several_limits_and_back_retires_the_overflowed_state() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(START);
        let service = plain(algorithm, &clock, 2);
        spent_fillers(&*service, 0x1000, 8, (0, 1, 2));
        let key = key_at(0xAB_CDEF, 0, 1, 2);
        assert_eq!(spend(&*service, key, LIMIT), LIMIT, "{algorithm}: K");
        service
            .set_limits(&PLAN, [rule(2), Rule::per_hour(100).unwrap()])
            .unwrap();
        assert_eq!(
            (spend(&*service, key, LIMIT), service.len()),
            (2, 9),
            "{algorithm}: K under two limits, len (eight stale fillers, K's entry)"
        );
        service.set_rule(&PLAN, rule(LIMIT)).unwrap();
        assert_eq!(
            (
                spend(&*service, key, LIMIT),
                service.len(),
                service.evictions()
            ),
            (LIMIT, 9, 0),
            "{algorithm}: K back under one limit, len, evictions"
        );
        assert_eq!(service.sweep(), 8, "{algorithm}: the stale fillers swept");
        assert_eq!(service.len(), 1, "{algorithm}: len after the sweep");
    }
}

/// One bucket (capacity 8): every key's other bucket is its home, so no insert overflows and
/// every first request skips the other bucket. Eight spent clients; K evicts one (exactly
/// one), is then found at home and denied; J evicts another, never K's state twice over.
#[test]
fn a_table_of_one_bucket_evicts_once_per_newcomer() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(START);
        let service = plain(algorithm, &clock, 1);
        spent_fillers(&*service, 0x1000, 8, (0, 0, 1));
        let key = key_at(0xAB_CDEF, 0, 0, 1);
        assert_eq!(spend(&*service, key, LIMIT), LIMIT, "{algorithm}: K");
        assert_eq!(
            (asked_nothing(&*service, key), spend(&*service, key, LIMIT)),
            (0, 0),
            "{algorithm}: K's attempt of nothing, K again"
        );
        assert_eq!((service.len(), service.evictions()), (8, 1), "{algorithm}");
        let other = key_at(0x12_3456, 0, 0, 1);
        assert_eq!(spend(&*service, other, LIMIT), LIMIT, "{algorithm}: J");
        assert_eq!((service.len(), service.evictions()), (8, 2), "{algorithm}");
        clock.advance(LATER);
        assert_eq!(service.sweep(), 8, "{algorithm}: all idle");
        assert_eq!(spend(&*service, key, LIMIT), LIMIT, "{algorithm}: K afresh");
        assert_eq!((service.len(), service.evictions()), (1, 2), "{algorithm}");
    }
}

/// Seventy rounds (the overflowed slot's generation wraps at 64): home refilled with the same
/// eight spent clients, K put in the first slot of its other bucket, spent and denied, then
/// everything idle and swept. Each round: exactly K's limit, nine states, nine swept.
#[test]
fn the_overflowed_slot_changing_hands_past_its_generation_wrap_keeps_one_state() {
    let _serial = serial();
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(START);
        let service = plain(algorithm, &clock, 2);
        let key = key_at(0xAB_CDEF, 0, 1, 2);
        for round in 0..70 {
            spent_fillers(&*service, 0x1000, 8, (0, 1, 2));
            assert_eq!(
                (
                    spend(&*service, key, LIMIT),
                    asked_nothing(&*service, key),
                    spend(&*service, key, LIMIT),
                    service.len()
                ),
                (LIMIT, 0, 0, 9),
                "{algorithm}, round {round}: K, K's attempt of nothing, K again, len"
            );
            clock.advance(LATER);
            assert_eq!(service.sweep(), 9, "{algorithm}, round {round}: swept");
        }
        assert_eq!(service.evictions(), 0, "{algorithm}: evictions");
    }
}

/// Sixteen keys of a table of three buckets: ten of home 0 (so that it overflows), three of
/// each other home; none whose other bucket is its home, so that no insert ever has to evict
/// (a key's two buckets hold sixteen slots, and there are fifteen other keys).
const POOL_BUCKETS: usize = 3;

fn unevictable_keys() -> Vec<u64> {
    [
        (0, 1),
        (0, 2),
        (0, 1),
        (0, 2),
        (0, 1),
        (0, 2),
        (0, 1),
        (0, 2),
        (0, 1),
        (0, 2),
    ]
    .into_iter()
    .chain([(1, 0), (1, 2), (1, 0), (2, 0), (2, 1), (2, 1)])
    .zip(0x9000_u64..)
    .map(|((home, other), fingerprint)| key_at(fingerprint, home, other, POOL_BUCKETS))
    .collect()
}

/// A differential run, one thread: a table of three buckets and sixteen keys, ten of them of
/// one home (which overflows), none whose other bucket is its home (so that no insert can ever
/// have to evict: a key's two buckets hold sixteen slots, and there are fifteen other keys),
/// against a twin service that keeps the
/// same clients in its map (the same rule beside a limit never reached: a plan of several
/// limits). Random requests of 0 to 4 permits, peeks, clock steps, sweeps and rule changes:
/// every answer (allowed, remaining) the same, never an eviction, never more states than keys.
#[test]
fn a_table_that_never_evicts_answers_as_the_map_does() {
    let _serial = serial();
    const STEPS: usize = 60_000;
    const BUCKETS: usize = POOL_BUCKETS;
    let never = || Rule::per_hour(1_000_000).unwrap();
    let keys = unevictable_keys();
    for algorithm in STORE_METHODS {
        for seed in [0x1234_5678_9ABC_DEF1_u64, 0x0F0F_1234_5555_7777] {
            let clock = FakeClock::starting_at(START);
            let service = plain(algorithm, &clock, BUCKETS);
            let twin: RateLimiterService<u64, &'static str, FakeClock> =
                ServiceBuilder::new(algorithm, clock.clone())
                    .plan_limits(PLAN, [rule(LIMIT), never()])
                    .build::<u64>()
                    .unwrap();
            let mut state = seed;
            let mut limit = LIMIT;
            for step in 0..STEPS {
                let r = stress::xorshift(&mut state);
                let key = keys[(r >> 8) as usize % keys.len()];
                match r % 100 {
                    0..70 => {
                        let n = [0, 1, 1, 1, 1, 2, 3, 4][(r >> 20) as usize % 8];
                        let (a, b) = (
                            service.acquire(&key, &PLAN, n).unwrap(),
                            twin.acquire(&key, &PLAN, n).unwrap(),
                        );
                        assert_eq!(
                            (a.is_allowed(), a.remaining()),
                            (b.is_allowed(), b.remaining()),
                            "{algorithm}, seed {seed:x}, step {step}: {n} for {key:x} (store, map)"
                        );
                    }
                    70..80 => assert_eq!(
                        peeked(&*service, key),
                        twin.peek(&key, &PLAN).unwrap().remaining(),
                        "{algorithm}, seed {seed:x}, step {step}: peek of {key:x} (store, map)"
                    ),
                    80..92 => clock.advance(Duration::from_millis((r >> 32) % 700)),
                    92..97 => {
                        service.sweep();
                        twin.sweep();
                    }
                    97 => {
                        let next = 2 + (r >> 24) % 3;
                        if next != limit {
                            limit = next;
                            service.set_rule(&PLAN, rule(limit)).unwrap();
                            twin.set_limits(&PLAN, [rule(limit), never()]).unwrap();
                        }
                    }
                    _ => {}
                }
                assert!(
                    service.len() <= keys.len() && service.evictions() == 0,
                    "{algorithm}, seed {seed:x}, step {step}: len {}, evictions {}",
                    service.len(),
                    service.evictions()
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Race.
// ---------------------------------------------------------------------------------------------

/// Rounds of three threads on the sixteen keys of [`unevictable_keys`], a fresh table every
/// twenty rounds (so that the home locks' words start clear again): two threads ask every key
/// three times each (in orders of their own), while the third sweeps. The clock stands still
/// during a round; between rounds it moves on by up to 1.5 windows, and now and then the rule
/// changes. Every round, each key is granted exactly what a peek before the round reported
/// left (it was asked six times, more than any limit); never an eviction, never more states
/// than keys.
#[test]
fn racing_decisions_and_sweeps_grant_each_key_exactly_what_it_had_left() {
    use std::sync::Mutex;
    let _serial = serial();
    const TABLES: usize = 100;
    const ROUNDS_PER_TABLE: usize = 20;
    const ROUNDS: usize = TABLES * ROUNDS_PER_TABLE;
    let keys = Arc::new(unevictable_keys());
    for algorithm in STORE_METHODS {
        let clock = FakeClock::starting_at(START);
        let current = Arc::new(Mutex::new(plain(algorithm, &clock, POOL_BUCKETS)));
        let expected = Arc::new(Mutex::new(Vec::<Vec<u64>>::new()));
        let problems = Arc::new(Mutex::new(Vec::<String>::new()));
        let between = {
            let (current, expected, problems, keys, clock) = (
                Arc::clone(&current),
                Arc::clone(&expected),
                Arc::clone(&problems),
                Arc::clone(&keys),
                clock.clone(),
            );
            let state = Mutex::new(0x5EED_0000_0000_0001_u64);
            move |round: usize| {
                let mut current = current.lock().unwrap();
                if round > 0 {
                    let (len, evictions) = (current.len(), current.evictions());
                    if len > keys.len() || evictions != 0 {
                        problems.lock().unwrap().push(format!(
                            "after round {}: len {len}, evictions {evictions}",
                            round - 1
                        ));
                    }
                }
                if round == ROUNDS {
                    return;
                }
                if round.is_multiple_of(ROUNDS_PER_TABLE) {
                    *current = plain(algorithm, &clock, POOL_BUCKETS);
                }
                let r = stress::xorshift(&mut state.lock().unwrap());
                clock.advance(Duration::from_millis(r % 1500));
                if (r >> 16).is_multiple_of(10) {
                    current.set_rule(&PLAN, rule(2 + (r >> 24) % 3)).unwrap();
                }
                let left = keys.iter().map(|&key| peeked(&**current, key)).collect();
                expected.lock().unwrap().push(left);
            }
        };
        let work = {
            let (current, keys) = (Arc::clone(&current), Arc::clone(&keys));
            move |thread: usize, round: usize| {
                let service = Arc::clone(&current.lock().unwrap());
                if thread == 2 {
                    for _ in 0..4 {
                        service.sweep();
                    }
                    return 0;
                }
                let mut granted = [0_u64; 16];
                for pass in 0..3 {
                    for i in 0..16 {
                        // Thread 0 forwards, thread 1 backwards, each pass from another key.
                        let at = (i + 5 * pass + round) % 16;
                        let at = if thread == 0 { at } else { 15 - at };
                        granted[at] += u64::from(service.allow(&keys[at], &PLAN).unwrap());
                    }
                }
                granted
                    .iter()
                    .enumerate()
                    .fold(0, |packed, (at, &g)| packed | g << (3 * at))
            }
        };
        let answers = race_rounds(3, ROUNDS, between, work);
        let expected = expected.lock().unwrap();
        let off: Vec<(usize, Vec<u64>, &Vec<u64>)> = answers
            .iter()
            .zip(expected.iter())
            .enumerate()
            .filter_map(|(round, (a, left))| {
                let grants: Vec<u64> = (0..16)
                    .map(|at| ((a[0] >> (3 * at)) & 7) + ((a[1] >> (3 * at)) & 7))
                    .collect();
                (grants != *left).then_some((round, grants, left))
            })
            .take(5)
            .collect();
        assert!(
            off.is_empty(),
            "{algorithm}: rounds granted other than left (round, grants, left): {off:?}"
        );
        assert_eq!(
            *problems.lock().unwrap(),
            Vec::<String>::new(),
            "{algorithm}"
        );
    }
}

/// Buckets of the race's table: the first half are the rounds' homes, the second half the
/// spare buckets the rounds' keys overflow into.
const RACE_BUCKETS: usize = 2048;
const RACE_ROUNDS: usize = 1000;
/// Tables per method, each raced through its rounds.
const RACE_REPEATS: usize = 4;

/// A key of fingerprint `fingerprint` whose home is `home` and whose other bucket is a spare
/// one (in the second half of the race's table) for which `fits` holds.
fn key_to_spare(fingerprint: u64, home: usize, fits: impl Fn(usize) -> bool) -> u64 {
    let first = ((home as u64) << 24).div_ceil(RACE_BUCKETS as u64);
    (first..1 << 24)
        .map(|high| (high << 40) | fingerprint)
        .find(|&key| {
            let other = other_of(key, RACE_BUCKETS);
            bucket_of(key, RACE_BUCKETS) == home && other >= RACE_BUCKETS / 2 && fits(other)
        })
        .expect("a key to a spare bucket")
}

/// The fingerprints of round `round`'s keys start here (K's, N's, then its fillers').
fn round_base(round: usize) -> u64 {
    0x100_0000 + 64 * round as u64
}

/// Each round in a home bucket of its own (its lock's word still clear): seven active fillers
/// put there before the round; then two threads ask for a fresh key K until denied while a
/// third asks for N, a newcomer of the same home, until denied. One of K and N takes home's
/// last slot, the other overflows into its spare bucket (never full: each receives at most the
/// rounds whose K or N overflows there). Every round: K granted exactly its limit between the
/// two threads, N its limit; nine states a round, no eviction, and the plan's counts add up.
#[test]
fn first_requests_of_one_key_racing_a_newcomer_for_the_last_home_slot_get_one_state() {
    let _serial = serial();
    // No spare bucket can fill: K and N are picked so that at most eight of the keys that may
    // overflow (each round's K and N) have any one spare bucket as their other.
    let mut load = vec![0_u32; RACE_BUCKETS];
    let mut pick = |fingerprint: u64, round: usize| {
        let key = key_to_spare(fingerprint, round, |other| load[other] < 8);
        load[other_of(key, RACE_BUCKETS)] += 1;
        key
    };
    let keys: Arc<Vec<(u64, u64)>> = Arc::new(
        (0..RACE_ROUNDS)
            .map(|round| {
                (
                    pick(round_base(round), round),
                    pick(round_base(round) + 1, round),
                )
            })
            .collect(),
    );
    for (method, repeat) in STORE_METHODS
        .into_iter()
        .flat_map(|method| (0..RACE_REPEATS).map(move |repeat| (method, repeat)))
    {
        let algorithm = format!("{method} (table {repeat})");
        let clock = FakeClock::starting_at(START);
        let service = plain(method, &clock, RACE_BUCKETS);
        let between = {
            let service = Arc::clone(&service);
            move |round: usize| {
                if round < RACE_ROUNDS {
                    for i in 0..7 {
                        let filler = key_to_spare(round_base(round) + 16 + i, round, |_| true);
                        assert_eq!(spend(&*service, filler, LIMIT), LIMIT, "filler");
                    }
                }
            }
        };
        let work = {
            let (service, keys) = (Arc::clone(&service), Arc::clone(&keys));
            move |thread: usize, round: usize| {
                let (k, n) = keys[round];
                spend(&*service, if thread < 2 { k } else { n }, 2 * LIMIT)
            }
        };
        let answers = race_rounds(3, RACE_ROUNDS, between, work);
        let off: Vec<(usize, Vec<u64>)> = answers
            .iter()
            .enumerate()
            .filter(|(_, a)| a[0] + a[1] != LIMIT || a[2] != LIMIT)
            .map(|(round, a)| (round, a.clone()))
            .take(10)
            .collect();
        assert!(
            off.is_empty(),
            "{algorithm}: rounds where K (two threads) or N was not granted exactly its limit \
             (round, [K, K, N]): {off:?}"
        );
        assert_eq!(
            (service.len(), service.evictions()),
            (9 * RACE_ROUNDS, 0),
            "{algorithm}: len, evictions"
        );
        // Per round: nine limits; a denial per filler, per K thread and N.
        assert_eq!(
            counts(&*service),
            (9 * LIMIT * RACE_ROUNDS as u64, 10 * RACE_ROUNDS as u64),
            "{algorithm}: allowed, denied"
        );
        for (round, &(k, n)) in keys.iter().enumerate() {
            assert_eq!(
                (peeked(&*service, k), peeked(&*service, n)),
                (0, 0),
                "{algorithm}, round {round}: K, N spent"
            );
        }
    }
}
