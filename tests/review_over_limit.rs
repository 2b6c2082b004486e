//! Review of the change "a new client's attempt above the limit makes no state": a request by
//! a client the service holds no state for, asking for more permits than a limit ever grants,
//! is answered from a fresh state made locally and dropped, instead of one put in the plan's
//! store (or map).
//!
//! Public API only. What is checked:
//! - a new client's answer is a fresh standalone limiter's (made at the service's start and
//!   never used) while the service has neither swept nor evicted, for one limit and for plans of
//!   several (the first limit, in the plan's order, that the attempt exceeds);
//! - after a sweep or an eviction (`evicted_up_to` ahead of a clock stepped back), a new
//!   client's answer is the one a client that holds an untouched fresh state made as of that
//!   reading gets (a reference client whose first permit was refused, so that its state is a
//!   stored, never-written fresh one);
//! - an existing client above the limit is answered from its own state (spent permits show);
//! - such attempts take no slot and evict no one, even in a full store, and are counted once,
//!   as denied;
//! - races: over-limit attempts and grants for one new key (never more than the limit granted),
//!   over-limit attempts against rule changes between one and several limits, and against
//!   sweeps while spent clients ask above their limit;
//! - the tower layer with a cost above the limit.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use tollgate::{
    Algorithm, AnyLimiter, Clock, Decision, FakeClock, Limiter, LimiterFactory, PlanStats,
    RateLimiterService, Rejection, Rule, ServiceBuilder,
};

type Svc = RateLimiterService<u64, &'static str, FakeClock>;

/// The figures of a decision, to compare two.
type Figures = (bool, u64, Duration, Duration, Option<Rejection>);

fn figures(decision: &Decision) -> Figures {
    (
        decision.is_allowed(),
        decision.remaining(),
        decision.retry_after(),
        decision.reset_after(),
        decision.rejection(),
    )
}

fn rule(limit: u64, window_nanos: u64) -> Rule {
    Rule::new(limit, Duration::from_nanos(window_nanos)).unwrap()
}

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

/// A service with `plans`, counting decisions; `None` where the method cannot have the plans (the
/// sliding log keeps one limit per plan).
fn build(
    algorithm: Algorithm,
    clock: &FakeClock,
    plans: &[(&'static str, Vec<Rule>)],
    capacity: usize,
) -> Option<Svc> {
    let mut builder = ServiceBuilder::new(algorithm, clock.clone())
        .count_decisions(true)
        .capacity(capacity);
    for (plan, limits) in plans {
        builder = builder.plan_limits(*plan, limits.iter().copied());
    }
    builder.build().ok()
}

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Permit counts that no limit of `limits` all grant: above the smallest, between limits, above
/// all of them, and the largest.
fn over_limit_counts(limits: &[Rule], rng: &mut u64) -> Vec<u64> {
    let mut sorted: Vec<u64> = limits.iter().map(Rule::limit).collect();
    sorted.sort_unstable();
    let mut counts = vec![sorted[0] + 1, sorted[0] + 1 + xorshift(rng) % 7, u64::MAX];
    for pair in sorted.windows(2) {
        counts.push(pair[1]); // above the smaller, the larger's own limit
        counts.push(pair[0] + 1);
    }
    let largest = *sorted.last().unwrap();
    counts.push(largest + 1);
    counts.push(largest.saturating_mul(2).saturating_add(3));
    counts
}

/// The limits a service answers with for `n` permits when its client's states are all fresh
/// (at or after the service's start, nothing swept or evicted): a standalone limiter per limit,
/// and the first limit in the plan's order that `n` exceeds decides (that limit's rejection).
fn expected_from_standalone<L: Limiter>(limits: &[Rule], standalone: &[L], n: u64) -> Figures {
    match limits.iter().position(|rule| n > rule.limit()) {
        Some(at) => figures(&standalone[at].try_acquire_n(n)),
        None => unreachable!("only counts above some limit are asked"),
    }
}

/// One standalone limiter per limit of `limits`, made now on `clock` and never used.
fn standalone_limiters(
    algorithm: Algorithm,
    limits: &[Rule],
    clock: &FakeClock,
) -> Vec<AnyLimiter<FakeClock>> {
    limits
        .iter()
        .map(|rule| {
            LimiterFactory::new(algorithm)
                .create(*rule, clock.clone())
                .unwrap()
        })
        .collect()
}

/// Sets `clock` to each of `readings` and, at each, asks every count `over_limit_counts` gives
/// for a new client (keys from `key` on): each answer must be the standalone limiters'.
fn new_clients_answer_as_standalone(
    service: &Svc,
    clock: &FakeClock,
    (limits, standalone): (&[Rule], &[AnyLimiter<FakeClock>]),
    readings: impl IntoIterator<Item = u64>,
    (key, rng): (&mut u64, &mut u64),
    context: &str,
) {
    for at in readings {
        clock.set(Duration::from_nanos(at));
        for n in over_limit_counts(limits, rng) {
            *key += 1;
            let got = service.acquire(key, &"p", n).unwrap();
            assert_eq!(
                figures(&got),
                expected_from_standalone(limits, standalone, n),
                "{context} at {at}: {n} permits"
            );
        }
    }
}

/// (1) A new client's attempt above the limit, while the service has never swept nor evicted,
/// answers exactly as a standalone limiter made at the service's start and never used: for
/// every method, many rules, service starts, clock readings (forward, and back but not before the
/// start), and for plans of several limits in either order (the first limit exceeded decides).
/// Such attempts make no state and are counted as denied.
#[test]
fn a_new_clients_attempt_above_the_limit_answers_as_a_fresh_standalone_limiter() {
    let one_limit = [
        vec![rule(1, MS)],
        vec![rule(2, S)],
        vec![rule(5, 10 * S)],
        vec![rule(7, 3 * MS + 17)],
        vec![rule(100, 3600 * S)],
    ];
    let several = [
        vec![rule(3, 10 * S), rule(6, 60 * S)],
        vec![rule(6, 60 * S), rule(3, 10 * S)],
        vec![rule(10, S), rule(4, 100 * MS), rule(50, 60 * S)],
    ];
    for algorithm in Algorithm::ALL {
        for limits in one_limit.iter().chain(&several) {
            for start in [0, 5 * S + 123, 1_000_000 * S] {
                let clock = FakeClock::starting_at(Duration::from_nanos(start));
                let Some(service) = build(algorithm, &clock, &[("p", limits.clone())], 64) else {
                    assert!(limits.len() > 1 && algorithm == Algorithm::SlidingWindowLog);
                    continue;
                };
                let standalone = standalone_limiters(algorithm, limits, &clock);
                let longest = limits.iter().map(|r| r.window().as_nanos() as u64).max();
                let longest = longest.unwrap();
                let rng = &mut (start ^ 0x9E37_79B9_7F4A_7C15 ^ longest);
                let mut key = 1_000_000u64;
                let mut asked = 0u64;
                for step in 0..120 {
                    // Mostly forward, by up to three of the longest windows; sometimes back
                    // (never before the service's start).
                    let now = clock.now_nanos();
                    let next = match xorshift(rng) % 6 {
                        0 => start + (now - start) / 2,
                        1 => now.saturating_sub(xorshift(rng) % longest).max(start),
                        _ => now + xorshift(rng) % (3 * longest),
                    };
                    clock.set(Duration::from_nanos(next));
                    for n in over_limit_counts(limits, rng) {
                        key += 1;
                        asked += 1;
                        let got = service.acquire(&key, &"p", n).unwrap();
                        let want = expected_from_standalone(limits, &standalone, n);
                        assert_eq!(
                            figures(&got),
                            want,
                            "{algorithm:?} {limits:?} start {start} step {step} at {next}: \
                             {n} permits for a new client"
                        );
                    }
                }
                assert_eq!(
                    (service.len(), service.evictions()),
                    (0, 0),
                    "{algorithm:?} {limits:?}: no state made, no one evicted"
                );
                assert_eq!(
                    service.stats(&"p").unwrap(),
                    PlanStats {
                        allowed: 0,
                        denied: asked
                    },
                    "{algorithm:?} {limits:?}: each attempt counted once, as denied"
                );
            }
        }
    }
}

/// (1b) The clock stepped back before the service's start (nothing swept): the
/// service makes fresh states as of 0 (its `evicted_up_to` starts there) while a standalone
/// limiter made at the start is as of the start. Recorded to tell whether such a difference is
/// the change's: the over-limit answer must equal the 0-permit answer's figures (a report of the
/// same fresh state) wherever it differs from the standalone's.
#[test]
fn before_the_services_start_an_over_limit_answer_reports_what_a_zero_permit_attempt_does() {
    for algorithm in Algorithm::ALL {
        for limits in [
            vec![rule(3, 10 * S)],
            vec![rule(3, 10 * S), rule(6, 60 * S)],
        ] {
            let clock = FakeClock::starting_at(Duration::from_secs(1000));
            let Some(service) = build(algorithm, &clock, &[("p", limits.clone())], 64) else {
                continue;
            };
            for back in [1, S, 9 * S, 10 * S, 61 * S, 999 * S] {
                clock.set(Duration::from_nanos(1000 * S - back));
                for (key, n) in [(1u64, 4u64), (2, 7), (3, u64::MAX)] {
                    let key = key + back;
                    let got = service.acquire(&key, &"p", n).unwrap();
                    let zero = service.acquire(&(key + 1_000_000), &"p", 0).unwrap();
                    assert!(got.rejection().is_some(), "{algorithm:?}: {n} is rejected");
                    if limits.len() == 1 {
                        assert_eq!(
                            (got.remaining(), got.reset_after()),
                            (zero.remaining(), zero.reset_after()),
                            "{algorithm:?} {limits:?} {back} ns before the start: {n} permits \
                             vs 0 permits"
                        );
                    }
                }
            }
            assert_eq!(service.len(), 0, "{algorithm:?} {limits:?}");
        }
    }
}

/// (2) After a sweep (and, for the one-word methods, after an eviction), with the clock stepped
/// back behind the service's `evicted_up_to`: a new client's attempt above the limit answers as
/// a client holding a stored fresh state made as of that reading does. The reference client
/// `R` asks for one permit at a reading where a fresh state made as of the sweep refuses it: its
/// state is put in the store (or map), refused, and never written; its own attempts above the
/// limit (which write nothing) then answer from it, at every later reading, up to past the sweep.
#[test]
fn after_a_sweep_or_eviction_with_the_clock_stepped_back_a_new_client_answers_as_a_stored_fresh_state()
 {
    let plans_of = |limits: Vec<Rule>| vec![("a", limits), ("full", vec![rule(2, 3600 * S)])];
    let variants = [
        vec![rule(3, 10 * S)],
        vec![rule(1, 500 * MS)],
        vec![rule(20, 7 * S)],
        vec![rule(3, 10 * S), rule(6, 60 * S)],
        vec![rule(6, 60 * S), rule(3, 10 * S)],
    ];
    let mut compared = 0u64;
    for algorithm in Algorithm::ALL {
        for limits in &variants {
            for via_eviction in [false, true] {
                if via_eviction && algorithm == Algorithm::SlidingWindowLog {
                    continue; // the sliding log keeps a map: it never evicts
                }
                let clock = FakeClock::new();
                let Some(service) = build(algorithm, &clock, &plans_of(limits.clone()), 64) else {
                    continue;
                };
                let longest = limits.iter().map(|r| r.window().as_nanos() as u64).max();
                let longest = longest.unwrap();
                let ahead = 50 * longest + 12_345;
                clock.set(Duration::from_nanos(ahead));
                // A client of plan `a`, idle by the sweep.
                assert!(service.allow(&7, &"a").unwrap());
                clock.advance(Duration::from_nanos(3 * longest));
                let ahead = ahead + 3 * longest;
                if via_eviction {
                    // Spenders of `full` until a new one evicts one of them: the eviction
                    // publishes where its victim's counts end, past the clock.
                    let mut key = 10_000u64;
                    while service.evictions() == 0 {
                        key += 1;
                        assert!(key < 20_000, "{algorithm:?}: no eviction");
                        while service.allow(&key, &"full").unwrap() {}
                    }
                } else {
                    assert!(
                        service.sweep() >= 1,
                        "{algorithm:?}: the idle client is swept"
                    );
                }
                let evictions = service.evictions();
                let context = format!("{algorithm:?} {limits:?} eviction {via_eviction}");
                let compared_before = compared;
                for back in [3 * longest + 1, longest + longest / 3, longest / 2, 1, 0] {
                    let from = ahead.saturating_sub(back);
                    clock.set(Duration::from_nanos(from));
                    let reference = 500 + back;
                    let first = service.acquire(&reference, &"a", 1).unwrap();
                    if first.is_allowed() {
                        // Its state is no longer a fresh one: no reference at this reading.
                        continue;
                    }
                    assert_eq!(service.evictions(), evictions, "{context}");
                    let mut now = from;
                    let mut new_key = 1_000_000 * (back + 1);
                    let rng = &mut (back | 1);
                    while now <= ahead + 2 * longest {
                        clock.set(Duration::from_nanos(now));
                        let mut counts = over_limit_counts(limits, rng);
                        counts.push(0);
                        for n in counts {
                            new_key += 1;
                            let got = service.acquire(&new_key, &"a", n).unwrap();
                            let want = service.acquire(&reference, &"a", n).unwrap();
                            compared += 1;
                            assert_eq!(
                                figures(&got),
                                figures(&want),
                                "{context}: {back} ns back, at {now} ({} after the published \
                                 reading), {n} permits: new client vs a stored fresh state",
                                now as i128 - ahead as i128
                            );
                        }
                        now += longest / 7 + 1;
                    }
                }
                assert!(
                    compared > compared_before,
                    "{context}: no reference client was refused its first permit"
                );
            }
        }
    }
    assert!(compared > 1000, "only {compared} comparisons");
}

/// (3) An existing client asking for more than the limit is answered from its own state: the
/// permits it spent show in `remaining` (and agree with `peek`), whether its state sits in its
/// home bucket or its other one, in the sliding log's map, or in a plan of several limits.
#[test]
fn an_existing_client_above_the_limit_is_answered_from_its_own_state() {
    let narrow = rule(5, 10 * S);
    let wide = rule(8, 60 * S);
    for algorithm in Algorithm::ALL {
        for limits in [vec![narrow], vec![narrow, wide], vec![wide, narrow]] {
            // 48 clients in 64 slots: many keys find their home bucket full and live in the
            // other one. Every client holds a state (each spends at least one permit), so the
            // checks below insert nothing. The hasher is randomly seeded: should the setup
            // itself evict (both buckets of a key full), it is made again.
            let spent_of = |client: u64| 1 + client % 5; // 1..=5, up to the narrow limit
            let mut made = None;
            for _attempt in 0..8 {
                let clock = FakeClock::starting_at(Duration::from_secs(7));
                let Some(service) = build(algorithm, &clock, &[("p", limits.clone())], 64) else {
                    break;
                };
                clock.advance(Duration::from_millis(1234));
                for client in 0..48u64 {
                    let d = service.acquire(&client, &"p", spent_of(client)).unwrap();
                    assert!(d.is_allowed(), "{algorithm:?} {limits:?} client {client}");
                }
                if service.evictions() == 0 {
                    made = Some(service);
                    break;
                }
            }
            let Some(service) = made else {
                assert!(
                    limits.len() > 1 && algorithm == Algorithm::SlidingWindowLog,
                    "{algorithm:?} {limits:?}: every setup evicted"
                );
                continue;
            };
            let mut checked = 0;
            for client in 0..48u64 {
                let spent = spent_of(client);
                for n in [6u64, 7, 8, 9, 100, u64::MAX] {
                    let d = service.acquire(&client, &"p", n).unwrap();
                    // The first limit (in the plan's order) the attempt exceeds decides.
                    let decider = limits.iter().find(|r| n > r.limit()).unwrap();
                    assert_eq!(
                        d.rejection(),
                        Some(Rejection::ExceedsLimit {
                            requested: n,
                            limit: decider.limit()
                        }),
                        "{algorithm:?} {limits:?} client {client}, {n} permits"
                    );
                    assert_eq!(
                        d.remaining(),
                        decider.limit() - spent,
                        "{algorithm:?} {limits:?} client {client} spent {spent}, {n} permits: \
                         answered from its own state"
                    );
                    checked += 1;
                }
                if limits.len() == 1 {
                    assert_eq!(
                        service.peek(&client, &"p").unwrap().remaining(),
                        narrow.limit() - spent,
                        "{algorithm:?} client {client}"
                    );
                }
                // Nothing was taken by the attempts above: the rest is still granted, and no
                // more.
                let left = narrow.limit() - spent;
                if left > 0 {
                    assert!(
                        service.acquire(&client, &"p", left).unwrap().is_allowed(),
                        "{algorithm:?} {limits:?} client {client}"
                    );
                }
                assert!(
                    service.acquire(&client, &"p", 1).unwrap().is_denied(),
                    "{algorithm:?} {limits:?} client {client}"
                );
            }
            assert_eq!(checked, 48 * 6);
            assert_eq!(service.evictions(), 0, "{algorithm:?} {limits:?}");
            assert_eq!(service.len(), 48, "{algorithm:?} {limits:?}");
        }
    }
}

/// (4) A flood of new clients asking above the limit into a full store (every slot a spent,
/// active client) after a sweep ahead of a clock stepped back: no slot taken, no one evicted,
/// every spent client still spent, every attempt counted once as denied.
#[test]
fn a_flood_of_new_over_limit_clients_into_a_full_store_takes_nothing_and_evicts_no_one() {
    for algorithm in Algorithm::ALL {
        for limits in [
            vec![rule(2, 3600 * S)],
            vec![rule(2, 3600 * S), rule(5, 7200 * S)],
        ] {
            let clock = FakeClock::new();
            let Some(service) = build(algorithm, &clock, &[("p", limits.clone())], 16) else {
                continue;
            };
            clock.set(Duration::from_secs(100_000));
            // Fill the store until a new spender evicts (the store is then full of spent
            // clients), then forget the evicted ones: only clients still spent are kept.
            let mut spent = Vec::new();
            let mut key = 0u64;
            while service.evictions() == 0 && key < 200 {
                key += 1;
                let granted = (0..3)
                    .filter(|_| service.allow(&key, &"p").unwrap())
                    .count();
                assert_eq!(granted, 2, "{algorithm:?}");
                spent.push(key);
            }
            spent.retain(|key| service.peek(key, &"p").unwrap().remaining() == 0);
            let held = service.len();
            let evictions = service.evictions();
            let before = service.stats(&"p").unwrap();
            // A sweep published ahead of the clock (within the spent clients' window), then the
            // clock stepped back.
            clock.set(Duration::from_secs(100_500));
            assert_eq!(service.sweep(), 0, "{algorithm:?}: nothing is idle yet");
            clock.set(Duration::from_secs(100_000 - 10));
            let mut asked = 0;
            for new_client in 1_000u64..4_000 {
                let n = [3, 4, 6, 1 << 40, u64::MAX][new_client as usize % 5];
                let d = service.acquire(&new_client, &"p", n).unwrap();
                assert!(
                    d.is_denied() && d.rejection().is_some(),
                    "{algorithm:?} {n}"
                );
                asked += 1;
            }
            assert_eq!(
                (service.len(), service.evictions()),
                (held, evictions),
                "{algorithm:?} {limits:?}: (clients held, evictions)"
            );
            clock.set(Duration::from_secs(100_000));
            for key in &spent {
                assert!(
                    !service.allow(key, &"p").unwrap(),
                    "{algorithm:?} {limits:?}: client {key} was spent and must still be"
                );
            }
            let after = service.stats(&"p").unwrap();
            assert_eq!(
                (after.allowed, after.denied),
                (before.allowed, before.denied + asked + spent.len() as u64),
                "{algorithm:?} {limits:?}: each attempt counted once, as denied"
            );
        }
    }
}

/// (5) Per-plan stats: an attempt above the limit counts once, as denied, whether the client is
/// new or held, for a plan kept in the store, one in the sliding log's map, and one of several
/// limits; the other plan's counts do not move.
#[test]
fn over_limit_attempts_are_counted_once_as_denied() {
    for algorithm in Algorithm::ALL {
        let plans = vec![
            ("one", vec![rule(3, 10 * S)]),
            ("other", vec![rule(3, 10 * S)]),
        ];
        let mut variants = vec![plans.clone()];
        if algorithm != Algorithm::SlidingWindowLog {
            variants.push(vec![
                ("one", vec![rule(3, 10 * S), rule(6, 60 * S)]),
                ("other", vec![rule(3, 10 * S)]),
            ]);
        }
        for plans in variants {
            let clock = FakeClock::new();
            let service = build(algorithm, &clock, &plans, 64).unwrap();
            let (mut allowed, mut denied) = (0u64, 0u64);
            for client in 0..20u64 {
                if client % 2 == 0 && service.allow(&client, &"one").unwrap() {
                    allowed += 1;
                }
                for n in [4u64, 7, u64::MAX] {
                    assert!(service.acquire(&client, &"one", n).unwrap().is_denied());
                    denied += 1;
                }
                assert_eq!(
                    service.stats(&"one").unwrap(),
                    PlanStats { allowed, denied },
                    "{algorithm:?} {plans:?} client {client}"
                );
            }
            assert_eq!(
                service.stats(&"other").unwrap(),
                PlanStats::default(),
                "{algorithm:?}"
            );
            assert_eq!(
                service.len(),
                10,
                "{algorithm:?}: only the granted clients are held"
            );
        }
    }
}

/// (6) Threads racing over-limit attempts and grants for the same new key (the clock standing
/// still, so one window): never more than the (smallest) limit granted in total; every
/// over-limit answer a rejection whose remaining is within the limit; stats exact.
#[test]
fn racing_over_limit_attempts_and_grants_for_one_new_key_never_grant_past_the_limit() {
    let deadline = Instant::now() + Duration::from_secs(12);
    for algorithm in Algorithm::ALL {
        for limits in [
            vec![rule(3, 3600 * S)],
            vec![rule(6, 3600 * S), rule(3, 60 * S)],
            vec![rule(3, 60 * S), rule(6, 3600 * S)],
        ] {
            let clock = FakeClock::starting_at(Duration::from_secs(5));
            let Some(service) = build(algorithm, &clock, &[("p", limits.clone())], 1024) else {
                continue;
            };
            let service = Arc::new(service);
            let smallest = limits.iter().map(Rule::limit).min().unwrap();
            let threads = 4;
            let keys = 150u64;
            let barrier = Arc::new(Barrier::new(threads));
            let granted_total = Arc::new(AtomicU64::new(0));
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (service, barrier, granted_total) = (
                        Arc::clone(&service),
                        Arc::clone(&barrier),
                        Arc::clone(&granted_total),
                    );
                    let limits = limits.clone();
                    thread::spawn(move || {
                        let mut per_key = Vec::new();
                        for key in 0..keys {
                            let mut granted = 0u64;
                            barrier.wait();
                            for i in 0..6u64 {
                                // Threads differ in their mix: even threads start above the
                                // limit, odd ones with grants.
                                let over = (i + t as u64).is_multiple_of(2);
                                if over {
                                    let n = [4u64, 7, u64::MAX][(i as usize + t) % 3];
                                    let d = service.acquire(&key, &"p", n).unwrap();
                                    let rejection = d.rejection();
                                    assert!(
                                        rejection.is_some(),
                                        "{algorithm:?} {limits:?}: {n} permits answered {d:?}"
                                    );
                                    let Some(Rejection::ExceedsLimit { limit, requested }) =
                                        rejection
                                    else {
                                        unreachable!()
                                    };
                                    assert_eq!(requested, n);
                                    assert!(limit < n && d.remaining() <= limit);
                                } else if service.allow(&key, &"p").unwrap() {
                                    granted += 1;
                                }
                            }
                            per_key.push(granted);
                            granted_total.fetch_add(granted, Ordering::Relaxed);
                        }
                        per_key
                    })
                })
                .collect();
            let mut per_key = vec![0u64; keys as usize];
            for handle in handles {
                for (key, granted) in handle.join().unwrap().into_iter().enumerate() {
                    per_key[key] += granted;
                }
            }
            for (key, granted) in per_key.iter().enumerate() {
                assert!(
                    *granted <= smallest,
                    "{algorithm:?} {limits:?}: key {key} granted {granted} > {smallest}"
                );
            }
            let stats = service.stats(&"p").unwrap();
            let total = threads as u64 * keys * 6;
            assert_eq!(
                (stats.allowed, stats.allowed + stats.denied),
                (granted_total.load(Ordering::Relaxed), total),
                "{algorithm:?} {limits:?}: stats"
            );
            assert_eq!(service.evictions(), 0);
            if Instant::now() > deadline {
                break;
            }
        }
    }
}

/// (7) Rule changes between one limit and several (and between rules) racing new clients'
/// attempts above every limit: none makes a state (the service is empty at the end), none is
/// granted, each is rejected by a limit of some configuration, none errs, and each counts
/// once. A second asker uses a count above some configurations' limits only: it is either
/// rejected by one of those, or decided under a configuration that may grant it.
#[test]
fn rule_changes_racing_over_limit_attempts_make_no_state_and_answer_consistently() {
    for algorithm in Algorithm::ALL {
        let configs: Vec<Vec<Rule>> = if algorithm == Algorithm::SlidingWindowLog {
            vec![vec![rule(5, S)], vec![rule(10, S)], vec![rule(3, 60 * S)]]
        } else {
            vec![
                vec![rule(5, S)],
                vec![rule(10, S), rule(50, 10 * S)],
                vec![rule(3, 60 * S)],
                vec![rule(50, 10 * S), rule(10, S)],
            ]
        };
        let clock = FakeClock::starting_at(Duration::from_secs(3));
        let service =
            Arc::new(build(algorithm, &clock, &[("p", configs[0].clone())], 256).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let changer = {
            let (service, stop, configs) =
                (Arc::clone(&service), Arc::clone(&stop), configs.clone());
            thread::spawn(move || {
                let mut changes = 0u64;
                // Well under the 65,535 changes a plan may have.
                while !stop.load(Ordering::Relaxed) && changes < 20_000 {
                    let config = &configs[changes as usize % configs.len()];
                    service.set_limits(&"p", config.iter().copied()).unwrap();
                    changes += 1;
                    if changes.is_multiple_of(16) {
                        thread::yield_now();
                    }
                }
                changes
            })
        };
        let all_limits: Vec<u64> = configs.iter().flatten().map(Rule::limit).collect();
        let start = Instant::now();
        let mut asked = 0u64;
        let mut between_allowed = 0u64;
        let mut key = 0u64;
        while start.elapsed() < Duration::from_millis(700) {
            key += 1;
            // Above every limit of every configuration.
            let n = [51u64, 1000, u64::MAX][key as usize % 3];
            let d = service.acquire(&(key << 1), &"p", n).unwrap();
            asked += 1;
            let Some(Rejection::ExceedsLimit { requested, limit }) = d.rejection() else {
                panic!("{algorithm:?}: {n} permits answered {d:?}");
            };
            assert_eq!(requested, n);
            assert!(all_limits.contains(&limit), "{algorithm:?}: limit {limit}");
            assert!(d.remaining() <= limit, "{algorithm:?}: {d:?}");
        }
        stop.store(true, Ordering::Relaxed);
        let changes = changer.join().unwrap();
        assert!(changes > 10, "{algorithm:?}: only {changes} rule changes");
        assert_eq!(
            (service.len(), service.evictions()),
            (0, 0),
            "{algorithm:?}: over-limit attempts made states ({asked} asked, {changes} changes)"
        );
        assert_eq!(
            service.stats(&"p").unwrap(),
            PlanStats {
                allowed: 0,
                denied: asked
            },
            "{algorithm:?}"
        );
        // A count between configurations' limits (7: above 5 and 3, not above 10 and 50),
        // racing the same changes.
        let stop = Arc::new(AtomicBool::new(false));
        let changer = {
            let (service, stop, configs) =
                (Arc::clone(&service), Arc::clone(&stop), configs.clone());
            thread::spawn(move || {
                let mut changes = 0u64;
                while !stop.load(Ordering::Relaxed) && changes < 20_000 {
                    let config = &configs[changes as usize % configs.len()];
                    service.set_limits(&"p", config.iter().copied()).unwrap();
                    changes += 1;
                    if changes.is_multiple_of(16) {
                        thread::yield_now();
                    }
                }
            })
        };
        let start = Instant::now();
        let before = service.stats(&"p").unwrap();
        let mut asked_between = 0u64;
        while start.elapsed() < Duration::from_millis(500) {
            key += 1;
            let d = service.acquire(&((key << 1) | 1), &"p", 7).unwrap();
            asked_between += 1;
            match d.rejection() {
                Some(Rejection::ExceedsLimit { requested, limit }) => {
                    assert_eq!(requested, 7);
                    assert!(limit == 5 || limit == 3, "{algorithm:?}: {d:?}");
                }
                Some(other) => panic!("{algorithm:?}: {other:?}"),
                None => {
                    // Decided under a configuration whose every limit is at least 7: a new
                    // client's fresh state grants it.
                    assert!(
                        d.is_allowed(),
                        "{algorithm:?}: 7 permits for a new client refused: {d:?}"
                    );
                    assert!(d.limit() >= 10, "{algorithm:?}: {d:?}");
                    between_allowed += 1;
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        changer.join().unwrap();
        let after = service.stats(&"p").unwrap();
        assert_eq!(
            (after.allowed - before.allowed, after.denied - before.denied),
            (between_allowed, asked_between - between_allowed),
            "{algorithm:?}"
        );
        assert!(
            service.len() as u64 <= between_allowed,
            "{algorithm:?}: {} clients held, {between_allowed} granted",
            service.len()
        );
    }
}

/// (8) Sweeps racing over-limit attempts (new clients, and spent clients asking above their
/// limit) with the clock standing still: the spent clients are never idle, so never swept; each
/// of their over-limit answers comes from their own state (0 remaining); new clients take no
/// slot; no eviction; and every spent client is still spent at the end.
#[test]
fn sweeps_racing_over_limit_attempts_leave_spent_clients_spent() {
    for algorithm in Algorithm::ALL {
        for limits in [
            vec![rule(3, 3600 * S)],
            vec![rule(3, 3600 * S), rule(4, 7200 * S)],
        ] {
            let clock = FakeClock::starting_at(Duration::from_secs(11));
            let Some(service) = build(algorithm, &clock, &[("p", limits.clone())], 1024) else {
                continue;
            };
            let service = Arc::new(service);
            let spent: Vec<u64> = (0..40).collect();
            for key in &spent {
                while service.allow(key, &"p").unwrap() {}
            }
            assert_eq!((service.len(), service.evictions()), (40, 0));
            let stop = Arc::new(AtomicBool::new(false));
            let sweeper = {
                let (service, stop) = (Arc::clone(&service), Arc::clone(&stop));
                thread::spawn(move || {
                    let mut swept = 0;
                    while !stop.load(Ordering::Relaxed) {
                        swept += service.sweep();
                    }
                    swept
                })
            };
            let asker = {
                let service = Arc::clone(&service);
                thread::spawn(move || {
                    for round in 0..400u64 {
                        for key in 0..40u64 {
                            let d = service.acquire(&key, &"p", 5 + round % 3).unwrap();
                            assert!(d.rejection().is_some(), "{d:?}");
                            assert_eq!(
                                d.remaining(),
                                0,
                                "spent client {key} answered {d:?}: not from its own state"
                            );
                        }
                    }
                })
            };
            for new_client in 10_000u64..30_000 {
                let n = [4u64, 5, u64::MAX][new_client as usize % 3];
                let d = service.acquire(&new_client, &"p", n).unwrap();
                assert!(d.rejection().is_some(), "{algorithm:?}");
                assert_eq!(
                    d.remaining(),
                    3,
                    "{algorithm:?}: a new client's fresh figures"
                );
            }
            asker.join().unwrap();
            stop.store(true, Ordering::Relaxed);
            let swept = sweeper.join().unwrap();
            assert_eq!(
                swept, 0,
                "{algorithm:?} {limits:?}: a spent client was swept"
            );
            assert_eq!(
                (service.len(), service.evictions()),
                (40, 0),
                "{algorithm:?} {limits:?}"
            );
            for key in &spent {
                assert!(
                    !service.allow(key, &"p").unwrap(),
                    "{algorithm:?} {limits:?}"
                );
            }
        }
    }
}

/// (9) The tower layer with a cost above the limit: new keys are refused for good (429, no
/// `Retry-After`), take no slot (into a full store of spent clients), evict no one, and count
/// once each; their `RateLimit` fields report a fresh client's quota, as the backend's own
/// report for a client it does not hold does.
#[cfg(feature = "tower")]
#[test]
fn tower_layer_costs_above_the_limit_take_no_slot() {
    use bytes::Bytes;
    use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
    use http_body_util::Empty;
    use tollgate::tower::{ClientKey, HeaderKey, RateLimitLayer};
    use tower::{Layer as _, ServiceExt as _};

    type Backend = Arc<RateLimiterService<ClientKey, &'static str, FakeClock>>;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for algorithm in Algorithm::ALL {
        for limits in [
            vec![rule(3, 60 * S)],
            vec![rule(3, 60 * S), rule(5, 600 * S)],
        ] {
            for on_allowed in [false, true] {
                let clock = FakeClock::starting_at(Duration::from_secs(2));
                let Ok(service) = ServiceBuilder::new(algorithm, clock.clone())
                    .plan_limits("p", limits.iter().copied())
                    .capacity(16)
                    .count_decisions(true)
                    .build::<ClientKey>()
                else {
                    continue;
                };
                let backend: Backend = Arc::new(service);
                let layer = RateLimitLayer::builder(
                    Arc::clone(&backend),
                    HeaderKey::new(HeaderName::from_static("x-key")),
                    "p",
                )
                .without_sweep()
                .headers_on_allowed(on_allowed)
                .cost_fn(|head| {
                    head.headers()
                        .get("x-cost")
                        .and_then(|value| value.to_str().ok()?.parse().ok())
                        .unwrap_or(1)
                })
                .build();
                let mut svc = layer.layer(tower::service_fn(|_: Request<Empty<Bytes>>| async {
                    Ok::<_, std::convert::Infallible>(Response::new(Empty::<Bytes>::new()))
                }));
                let context = format!("{algorithm:?} {limits:?} on_allowed {on_allowed}");
                runtime.block_on(async {
                    async fn send<T, B>(svc: &mut T, key: &str, cost: u64) -> Response<B>
                    where
                        T: tower::Service<Request<Empty<Bytes>>, Response = Response<B>>,
                        T::Error: std::fmt::Debug,
                    {
                        let request = Request::builder()
                            .header("x-key", key)
                            .header("x-cost", cost.to_string())
                            .body(Empty::new())
                            .unwrap();
                        svc.ready().await.unwrap().call(request).await.unwrap()
                    }
                    // Spent clients until the store is full (a new one evicts).
                    let mut spent = Vec::new();
                    for i in 0..200 {
                        let key = format!("spent-{i}");
                        let reply = send(&mut svc, &key, 3).await;
                        assert_eq!(reply.status(), StatusCode::OK, "{context}");
                        spent.push(key);
                        if backend.evictions() > 0 {
                            break;
                        }
                    }
                    let held = backend.len();
                    let evictions = backend.evictions();
                    let before = backend.stats(&"p").unwrap();
                    let mut asked = 0;
                    for i in 0..500 {
                        let key = format!("new-{i}");
                        let cost = [4u64, 6, 1 << 40][i % 3];
                        let reply = send(&mut svc, &key, cost).await;
                        asked += 1;
                        assert_eq!(reply.status(), StatusCode::TOO_MANY_REQUESTS, "{context}");
                        assert!(reply.headers().get("retry-after").is_none(), "{context}");
                        let header = |name: &str| {
                            reply
                                .headers()
                                .get(name)
                                .map(|v| v.to_str().unwrap().to_owned())
                        };
                        let client = ClientKey::Header(HeaderValue::from_str(&key).unwrap());
                        let (_, fresh) = backend.ratelimit_headers(&client, &"p", "p").unwrap();
                        if limits.len() == 1 {
                            assert_eq!(
                                header("ratelimit").map(|h| h.contains(";r=3;")),
                                Some(true),
                                "{context}: {:?} (a fresh client's report: {fresh})",
                                header("ratelimit")
                            );
                        }
                    }
                    assert_eq!(
                        (backend.len(), backend.evictions()),
                        (held, evictions),
                        "{context}: (clients held, evictions)"
                    );
                    let after = backend.stats(&"p").unwrap();
                    assert_eq!(
                        (after.allowed, after.denied),
                        (before.allowed, before.denied + asked),
                        "{context}"
                    );
                });
            }
        }
    }
}

/// (10) Extreme readings: a clock far past any method's horizon (up to `u64::MAX` ns), and a
/// service started late: a new client's attempt above the limit still answers as a fresh
/// standalone limiter made at the service's start.
#[test]
fn at_extreme_readings_a_new_clients_over_limit_answer_is_a_fresh_standalone_limiters() {
    for algorithm in Algorithm::ALL {
        for limits in [
            vec![rule(3, 10 * S)],
            vec![rule(1, 1)],
            vec![rule(6, 60 * S), rule(3, 10 * S)],
        ] {
            for start in [0, u64::MAX / 2, u64::MAX - 3600 * S] {
                let clock = FakeClock::starting_at(Duration::from_nanos(start));
                let Some(service) = build(algorithm, &clock, &[("p", limits.clone())], 64) else {
                    continue;
                };
                let standalone = standalone_limiters(algorithm, &limits, &clock);
                let readings = [
                    start,
                    start.saturating_add(1),
                    start.saturating_add(10 * S + 1),
                    start / 2 + u64::MAX / 2,
                    u64::MAX - 60 * S,
                    u64::MAX - 1,
                    u64::MAX,
                ];
                new_clients_answer_as_standalone(
                    &service,
                    &clock,
                    (&limits, &standalone),
                    readings.into_iter().filter(|&at| at >= start),
                    (&mut 0, &mut (start | 1)),
                    &format!("{algorithm:?} {limits:?} start {start}"),
                );
                assert_eq!(service.len(), 0, "{algorithm:?} {limits:?}");
            }
        }
    }
}

/// (11) A rule change that puts a held client's usual count above the new limit: its state,
/// made under the old rule, is forgotten (as the documentation says of every rule change), so
/// the attempt is answered as a fresh client's under the new rule; and the client is then
/// granted the new rule's limit, no more. Also across a plan's move from several limits to one
/// (the client's state lived in the plan's map) and back.
#[test]
fn a_rule_change_under_a_held_client_answers_its_over_limit_attempt_afresh() {
    for algorithm in Algorithm::ALL {
        let moves: Vec<(Vec<Rule>, Vec<Rule>)> = if algorithm == Algorithm::SlidingWindowLog {
            vec![(vec![rule(5, 10 * S)], vec![rule(3, 10 * S)])]
        } else {
            vec![
                (vec![rule(5, 10 * S)], vec![rule(3, 10 * S)]),
                (
                    vec![rule(5, 10 * S), rule(8, 60 * S)],
                    vec![rule(3, 10 * S)],
                ),
                (
                    vec![rule(5, 10 * S)],
                    vec![rule(3, 10 * S), rule(8, 60 * S)],
                ),
                (
                    vec![rule(5, 10 * S), rule(8, 60 * S)],
                    vec![rule(8, 60 * S), rule(3, 10 * S)],
                ),
            ]
        };
        for (before, after) in moves {
            let clock = FakeClock::starting_at(Duration::from_secs(40));
            let service = build(algorithm, &clock, &[("p", before.clone())], 64).unwrap();
            let context = format!("{algorithm:?} {before:?} -> {after:?}");
            for client in 0..10u64 {
                assert!(
                    service.acquire(&client, &"p", 2).unwrap().is_allowed(),
                    "{context}"
                );
            }
            clock.advance(Duration::from_millis(10));
            service.set_limits(&"p", after.iter().copied()).unwrap();
            let fresh: Vec<_> = after
                .iter()
                .map(|rule| {
                    LimiterFactory::new(algorithm)
                        .create(*rule, clock.clone())
                        .unwrap()
                })
                .collect();
            for client in 0..10u64 {
                for n in [4u64, 5, 9, u64::MAX] {
                    let got = service.acquire(&client, &"p", n).unwrap();
                    assert_eq!(
                        figures(&got),
                        expected_from_standalone(&after, &fresh, n),
                        "{context}: client {client}, {n} permits after the change"
                    );
                }
                let granted = (0..10)
                    .filter(|_| service.allow(&client, &"p").unwrap())
                    .count();
                assert_eq!(granted, 3, "{context}: client {client} starts afresh, once");
            }
            // And back: the clients' states (made under `after`) are forgotten again.
            clock.advance(Duration::from_millis(10));
            service.set_limits(&"p", before.iter().copied()).unwrap();
            for client in 0..10u64 {
                let d = service.acquire(&client, &"p", 9).unwrap();
                assert!(d.rejection().is_some(), "{context}");
                let decider = before.iter().find(|r| 9 > r.limit()).unwrap();
                assert_eq!(d.remaining(), decider.limit(), "{context}: client {client}");
            }
            assert_eq!(service.evictions(), 0, "{context}");
        }
    }
}

/// (12) Readings before the service's start (nothing swept): the service's fresh states are
/// made as of 0 (its `evicted_up_to` before any sweep), a standalone limiter's as of the start;
/// a new client's attempt above the limit still answers as the standalone does.
#[test]
fn before_the_services_start_a_new_clients_over_limit_answer_is_a_fresh_standalone_limiters() {
    for algorithm in Algorithm::ALL {
        for limits in [
            vec![rule(3, 10 * S)],
            vec![rule(6, 60 * S), rule(3, 10 * S)],
        ] {
            let start = 1000 * S;
            let clock = FakeClock::starting_at(Duration::from_nanos(start));
            let Some(service) = build(algorithm, &clock, &[("p", limits.clone())], 64) else {
                continue;
            };
            let standalone = standalone_limiters(algorithm, &limits, &clock);
            let backs = [1, S, 9 * S, 10 * S, 61 * S, 999 * S, start];
            new_clients_answer_as_standalone(
                &service,
                &clock,
                (&limits, &standalone),
                backs.map(|back| start - back),
                (&mut 0, &mut 77),
                &format!("{algorithm:?} {limits:?} before the start"),
            );
            assert_eq!(service.len(), 0, "{algorithm:?} {limits:?}");
        }
    }
}

/// (13) A grant that happened before (another thread's, published to this one) shows in the
/// client's over-limit answer: the answer comes from the state the grant made, never from a
/// fresh one, while other threads keep inserting new clients and sweeping.
#[test]
fn an_over_limit_answer_sees_a_grant_published_by_another_thread() {
    for algorithm in Algorithm::ALL {
        for limits in [
            vec![rule(4, 3600 * S)],
            vec![rule(4, 3600 * S), rule(9, 7200 * S)],
        ] {
            let clock = FakeClock::starting_at(Duration::from_secs(9));
            let Some(service) = build(algorithm, &clock, &[("p", limits.clone())], 65_536) else {
                continue;
            };
            let service = Arc::new(service);
            let keys = 3000u64;
            let published = Arc::new(AtomicU64::new(0));
            let granter = {
                let (service, published) = (Arc::clone(&service), Arc::clone(&published));
                thread::spawn(move || {
                    for key in 1..=keys {
                        assert!(service.allow(&key, &"p").unwrap());
                        published.store(key, Ordering::Release);
                        if key % 64 == 0 {
                            service.sweep();
                        }
                    }
                })
            };
            let mut seen = 0u64;
            let mut checked = 0u64;
            while seen < keys {
                let up_to = published.load(Ordering::Acquire);
                if up_to == seen {
                    // Meanwhile, new clients above the limit (no state, no slot).
                    let d = service.acquire(&(1_000_000 + checked), &"p", 5).unwrap();
                    assert_eq!(d.remaining(), 4, "{algorithm:?} {limits:?}");
                    thread::yield_now();
                    continue;
                }
                for key in (seen + 1)..=up_to {
                    let d = service.acquire(&key, &"p", 5).unwrap();
                    assert!(d.rejection().is_some(), "{algorithm:?} {limits:?}");
                    assert_eq!(
                        d.remaining(),
                        3,
                        "{algorithm:?} {limits:?}: key {key} was granted one permit before"
                    );
                    checked += 1;
                }
                seen = up_to;
            }
            granter.join().unwrap();
            assert_eq!(checked, keys);
            assert_eq!(
                (service.len() as u64, service.evictions()),
                (keys, 0),
                "{algorithm:?} {limits:?}"
            );
        }
    }
}
