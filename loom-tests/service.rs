//! The service's protocols around the map, for every method: two first requests for one client
//! end with exactly one limiter that both use; and a sweep that retires and removes a client's
//! limiter while its requests race never over-admits (not even to a request whose clock lags the
//! sweep's, whose replacement limiter is made as of the sweep's reading) and never leaves a
//! retired limiter in the map.
//!
//! papaya parks threads, which loom cannot model, so the map is a stand-in for one client's
//! entry: a word naming a state in an arena of states made up front, changed by the operations
//! `RateLimiterService` uses (`get`, `get_or_insert_with`, `remove_if` by pointer identity). The
//! request and sweep paths below follow `RateLimiterService::acquire` and `sweep` step by step,
//! with the service's own orderings: the sweep publishes its reading (`evicted_up_to`) with a
//! Relaxed `fetch_max` before the retiring exchange, whose Release a request that meets the
//! retired limiter pairs with an Acquire fence before it reads the reading back to make the
//! replacement.

use std::marker::PhantomData;
use std::sync::Mutex;

use loom::sync::Arc;
use loom::sync::atomic::{self, AtomicU64, Ordering};
use loom::thread;

use crate::fixed_window::window;
use crate::models::{EvictionCoverage, prefill};
use crate::sliding_window_log::log;
use crate::support::{
    Admission, Answer, Attempt, Evictable, Method, WINDOW, assert_within_bound, at, explore,
};
use crate::token_bucket::bucket;

const HALF: u64 = WINDOW / 2;
const QUARTER: u64 = WINDOW / 4;

/// One client's entry in the map: `None`, or the index of its state in the arena.
pub(crate) trait ClientSlot: Send + Sync + 'static {
    fn empty() -> Self;

    /// The entry, if any (`HashMap::get`).
    fn get(&self) -> Option<usize>;

    /// Inserts `candidate` unless there is an entry already; returns the entry the map then
    /// holds (`HashMap::get_or_insert_with`).
    fn get_or_insert(&self, candidate: usize) -> usize;

    /// Removes the entry if it is still `entry` (`HashMap::remove_if` with pointer equality).
    fn remove_if_same(&self, entry: usize);
}

/// The map's behaviour for one key: every change is one compare-and-swap on the entry. (The word
/// is open to the negative controls, which replace one exchange with a blind write.)
#[derive(Debug)]
pub(crate) struct CasSlot(pub(crate) AtomicU64);

/// 0 is the empty slot; entry `i` is stored as `i + 1`.
pub(crate) fn encode(entry: usize) -> u64 {
    entry as u64 + 1
}

fn decode(word: u64) -> Option<usize> {
    word.checked_sub(1).map(|entry| entry as usize)
}

impl ClientSlot for CasSlot {
    fn empty() -> Self {
        CasSlot(AtomicU64::new(0))
    }

    fn get(&self) -> Option<usize> {
        // Acquire: as a map lookup, it sees the entry the insert published.
        decode(self.0.load(Ordering::Acquire))
    }

    fn get_or_insert(&self, candidate: usize) -> usize {
        match self
            .0
            .compare_exchange(0, encode(candidate), Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => candidate,
            Err(existing) => decode(existing).expect("only an occupied slot fails the exchange"),
        }
    }

    fn remove_if_same(&self, entry: usize) {
        // A failure means another thread removed it, or put a fresh entry in its place.
        let _ = self
            .0
            .compare_exchange(encode(entry), 0, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// How many times one request may find its client's limiter retired: the sweeper retires at
/// most one state per model, so a request loops at most twice.
const ROUNDS: usize = 2;

/// Whether a request that meets a retired limiter runs an Acquire fence before it reads the
/// sweep's reading to make the replacement, as `RateLimiterService::acquire` does. Only a
/// negative control leaves it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fence {
    Acquire,
    Omitted,
}

/// One client's entry, the sweep's reading the service makes new limiters as of, and every state
/// the entry may ever hold: the prefilled one (index 0), then for each request and round one
/// candidate per reading the request may see (0, or the sweep's), as `get_or_insert_with` would
/// make it from `fresh_state(made_as_of)`.
struct Clients<M: Method, S> {
    slot: S,
    /// `RateLimiterService::evicted_up_to`.
    evicted_up_to: AtomicU64,
    sweep_at: u64,
    states: Vec<M::State>,
    method: PhantomData<M>,
}

impl<M: Evictable, S: ClientSlot> Clients<M, S> {
    fn new(method: M, requests: usize, sweep_at: u64) -> Self {
        let candidates = (0..requests * ROUNDS).flat_map(|_| [0, sweep_at]);
        Clients {
            slot: S::empty(),
            evicted_up_to: AtomicU64::new(0),
            sweep_at,
            states: std::iter::once(method.fresh_state())
                .chain(candidates.map(|since| method.fresh_state_since(since)))
                .collect(),
            method: PhantomData,
        }
    }

    /// The state `request` makes in `round`, as of `since`.
    fn candidate(&self, request: usize, round: usize, since: u64) -> usize {
        let as_of_sweep = match since {
            0 => 0,
            since if since == self.sweep_at => 1,
            since => panic!("no sweep read the clock at {since}"),
        };
        1 + (request * ROUNDS + round) * 2 + as_of_sweep
    }

    /// `RateLimiterService::acquire`: look the client up, insert a fresh state (made as of the
    /// sweep's reading) on a miss, and move to a fresh one if the state found was retired.
    /// Returns the state that answered.
    fn acquire(
        &self,
        method: M,
        request: usize,
        attempt: Attempt,
        fence: Fence,
    ) -> (usize, Answer) {
        for round in 0..ROUNDS {
            let entry = match self.slot.get() {
                Some(entry) => entry,
                None => {
                    // Relaxed, as `made_as_of`: a request that met a retired limiter has
                    // synchronized with the sweep that retired it (the fence below).
                    let since = self.evicted_up_to.load(Ordering::Relaxed);
                    self.slot
                        .get_or_insert(self.candidate(request, round, since))
                }
            };
            match method.acquire(&self.states[entry], attempt.n, attempt.now) {
                Answer::Retired => {
                    if fence == Fence::Acquire {
                        // As the service: pairs with the Release of the retiring exchange.
                        atomic::fence(Ordering::Acquire);
                    }
                    self.slot.remove_if_same(entry);
                }
                answer => return (entry, answer),
            }
        }
        panic!("request {request} met more retired states than the sweep can retire");
    }

    /// `RateLimiterService::sweep` for this one client: publish the reading, retire the state if
    /// idle, then remove it.
    fn sweep(&self, method: M) -> bool {
        // Relaxed, as the service: published by the Release of the retiring exchange.
        self.evicted_up_to
            .fetch_max(self.sweep_at, Ordering::Relaxed);
        let Some(entry) = self.slot.get() else {
            return false;
        };
        let retired = method.retire_if_idle(&self.states[entry], self.sweep_at);
        if retired {
            self.slot.remove_if_same(entry);
        }
        retired
    }
}

/// Requests for a client the map does not hold yet, one per thread.
#[derive(Debug)]
pub(crate) struct FirstRequests {
    pub(crate) threads: &'static [Attempt],
    pub(crate) preemption_bound: usize,
}

impl FirstRequests {
    pub(crate) fn check<M: Evictable, S: ClientSlot>(&'static self, method: M) {
        explore(self.preemption_bound, move || {
            // No sweep runs: every state is made as of 0.
            let clients = Arc::new(Clients::<M, S>::new(method, self.threads.len(), 0));
            let requests: Vec<_> = self
                .threads
                .iter()
                .enumerate()
                .map(|(request, &attempt)| {
                    let clients = Arc::clone(&clients);
                    thread::spawn(move || clients.acquire(method, request, attempt, Fence::Acquire))
                })
                .collect();
            let answers: Vec<(usize, Answer)> = requests
                .into_iter()
                .map(|request| request.join().expect("a request panicked"))
                .collect();

            let entry = clients.slot.get().expect("the client has an entry");
            assert!(
                answers.iter().all(|&(used, _)| used == entry),
                "first requests made more than one limiter: the map holds {entry}, the \
                 requests used {answers:?}"
            );
            let admissions: Vec<Admission> = answers
                .iter()
                .filter_map(|(_, answer)| answer.admission())
                .collect();
            assert_within_bound(M::BOUND, method.rule(), &admissions);
            let permits: u64 = admissions.iter().map(|admission| admission.permits).sum();
            assert_eq!(
                permits,
                method.rule().limit(),
                "first requests at one instant for more than the limit must win exactly it"
            );
        });
    }
}

/// A sweep of one client racing that client's requests.
#[derive(Debug)]
pub(crate) struct SweepRace {
    /// Requests made one after another before the threads start; the first makes the entry.
    pub(crate) prefill: &'static [Attempt],
    pub(crate) sweep_at: u64,
    /// One request per thread.
    pub(crate) requests: &'static [Attempt],
    pub(crate) preemption_bound: usize,
}

impl SweepRace {
    pub(crate) fn check<M: Evictable, S: ClientSlot>(&'static self, method: M) {
        self.check_with::<M, S>(method, Fence::Acquire);
    }

    pub(crate) fn check_with<M: Evictable, S: ClientSlot>(&'static self, method: M, fence: Fence) {
        let coverage = std::sync::Arc::new(Mutex::new(EvictionCoverage::default()));
        let coverage_in_model = std::sync::Arc::clone(&coverage);
        explore(self.preemption_bound, move || {
            let clients = Arc::new(Clients::<M, S>::new(
                method,
                self.requests.len(),
                self.sweep_at,
            ));
            let entry = clients.slot.get_or_insert(0);
            let mut admissions = prefill(method, &clients.states[entry], self.prefill);

            let sweeper = {
                let clients = Arc::clone(&clients);
                thread::spawn(move || clients.sweep(method))
            };
            let requests: Vec<_> = self
                .requests
                .iter()
                .enumerate()
                .map(|(request, &attempt)| {
                    let clients = Arc::clone(&clients);
                    thread::spawn(move || clients.acquire(method, request, attempt, fence))
                })
                .collect();
            let swept = sweeper.join().expect("the sweeper panicked");
            let mut admitted_by_fresh_state = false;
            for request in requests {
                let (used, answer) = request.join().expect("a request panicked");
                admissions.extend(answer.admission());
                admitted_by_fresh_state |= used != entry && answer.admission().is_some();
            }

            assert_within_bound(M::BOUND, method.rule(), &admissions);
            if let Some(entry) = clients.slot.get() {
                assert!(
                    !method.state_is_retired(&clients.states[entry], self.sweep_at),
                    "the sweep left a retired limiter in the map"
                );
            }
            coverage_in_model
                .lock()
                .expect("coverage lock")
                .record(swept, admitted_by_fresh_state);
        });
        coverage.lock().expect("coverage lock").assert_complete();
    }
}

/// Two first requests, at one instant, for a client whose rule allows one permit.
pub(crate) static TWO_FIRST_REQUESTS: FirstRequests = FirstRequests {
    threads: &[at(5 * WINDOW, 1), at(5 * WINDOW, 1)],
    preemption_bound: 3,
};

#[test]
fn service_first_requests_make_one_token_bucket() {
    TWO_FIRST_REQUESTS.check::<_, CasSlot>(bucket(1));
}

#[test]
fn service_first_requests_make_one_fixed_window() {
    TWO_FIRST_REQUESTS.check::<_, CasSlot>(window(1));
}

#[test]
fn service_first_requests_make_one_sliding_log() {
    TWO_FIRST_REQUESTS.check::<_, CasSlot>(log(1));
}

/// A client that took its one permit at 0 is idle again at W, when the sweep runs; two requests
/// (one half a window later) race it.
pub(crate) static SWEEP_THEN_REQUESTS: SweepRace = SweepRace {
    prefill: &[at(0, 1)],
    sweep_at: WINDOW,
    requests: &[at(WINDOW, 1), at(WINDOW + HALF, 1)],
    preemption_bound: 2,
};

#[test]
fn service_sweep_racing_requests_never_over_admits_token_bucket() {
    SWEEP_THEN_REQUESTS.check::<_, CasSlot>(bucket(1));
}

#[test]
fn service_sweep_racing_requests_never_over_admits_fixed_window() {
    SWEEP_THEN_REQUESTS.check::<_, CasSlot>(window(1));
}

#[test]
fn service_sweep_racing_requests_never_over_admits_sliding_log() {
    SWEEP_THEN_REQUESTS.check::<_, CasSlot>(log(1));
}

/// A client that took its one permit at W/4 is idle again at 5W/4, when the sweep runs. One
/// request's clock lags the sweep's by three quarters of a window (it reads W/2, where the
/// client's permit is still in force); another reads 7W/4.
pub(crate) static SWEEP_WITH_LAGGING_CLOCK: SweepRace = SweepRace {
    prefill: &[at(QUARTER, 1)],
    sweep_at: WINDOW + QUARTER,
    requests: &[at(HALF, 1), at(WINDOW + HALF + QUARTER, 1)],
    preemption_bound: 2,
};

#[test]
fn service_sweep_never_over_admits_lagging_clock_token_bucket() {
    SWEEP_WITH_LAGGING_CLOCK.check::<_, CasSlot>(bucket(1));
}

#[test]
fn service_sweep_never_over_admits_lagging_clock_fixed_window() {
    SWEEP_WITH_LAGGING_CLOCK.check::<_, CasSlot>(window(1));
}

#[test]
fn service_sweep_never_over_admits_lagging_clock_sliding_log() {
    SWEEP_WITH_LAGGING_CLOCK.check::<_, CasSlot>(log(1));
}
