//! The service's protocol around the map, for every method: two first requests for one client
//! end with exactly one limiter that both use; and a sweep that retires and removes a client's
//! limiter while its requests race never over-admits (not even to a request whose clock lags the
//! sweep's, whose replacement limiter is made as of the sweep's reading) and never leaves a
//! retired limiter in the map.
//!
//! The requests and the sweep are the service's own code: `decide` and `sweep` of
//! `tollgate::loom_support::service`, the functions `RateLimiterService` runs, with the orderings
//! they have there (the sweep publishes its reading, `evicted_up_to`, with a Relaxed `fetch_max`
//! before the retiring exchange, whose Release a request that meets the retired limiter pairs
//! with an Acquire fence before it reads the reading back to make the replacement). papaya parks
//! threads, which loom cannot model, so they run here on the crate's `LoomClientMap`, whose
//! operations are papaya's for one key, each one loom atomic step; the plan (`ModelPlan`) is the
//! method's constants with its version in one loom word, and each client's state is the
//! method's, on loom atomics.

use std::cell::Cell;
use std::sync::Mutex;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;
use tollgate::loom_support::service::{
    Acquired, ClientMap, Fresh, LoomClientMap, MapFault, MapGuard, Pinned, Request, Versioned,
    decide, sweep,
};
use tollgate::loom_support::{OwnedWord, Retired};

use crate::fixed_window::window;
use crate::models::{EvictionCoverage, prefill};
use crate::sliding_window_log::log;
use crate::support::{
    Admission, Answer, Attempt, Evictable, WINDOW, assert_within_bound, at, explore,
};
use crate::token_bucket::bucket;

const HALF: u64 = WINDOW / 2;
const QUARTER: u64 = WINDOW / 4;

/// The one client every model's requests are for.
const CLIENT: u64 = 7;

/// The most entries one model makes: the prefilled one, and a few per request.
const ENTRIES: usize = 12;

/// One client's entry: the method's state, and the version of the plan it was made under.
pub(crate) struct ModelEntry<M: Evictable> {
    version: u16,
    pub(crate) state: M::State,
}

impl<M: Evictable> Versioned for ModelEntry<M> {
    fn version(&self) -> u16 {
        self.version
    }
}

/// The plan's version, as a request read it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ModelHead(u16);

impl Versioned for ModelHead {
    fn version(&self) -> u16 {
        self.0
    }
}

/// When a request reads the plan's version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PlanRead {
    /// At every read the protocol makes, as the plan table's `PinnedPlan::head` does.
    EachTime,
    /// Broken: once, when the request pins the plan, before its lookup; every later read
    /// returns that version.
    OnceBeforeLookup,
}

/// One plan: its clients, in the crate's loom map; its version, one loom word standing for the
/// plan table's published pointer (a read of it is one atomic snapshot, as a word's load is);
/// and the method's constants.
pub(crate) struct ModelPlan<M: Evictable> {
    pub(crate) clients: LoomClientMap<u64, ModelEntry<M>>,
    pub(crate) version: AtomicU64,
    method: M,
}

impl<M: Evictable> ModelPlan<M> {
    pub(crate) fn new(method: M, fault: MapFault) -> Self {
        ModelPlan {
            clients: LoomClientMap::new([CLIENT], ENTRIES, fault),
            version: AtomicU64::new(0),
            method,
        }
    }

    /// The plan, pinned for one decision or one sweep.
    fn pin(&self, read: PlanRead) -> ModelPin<'_, M> {
        ModelPin {
            plan: self,
            version_at_pin: match read {
                PlanRead::EachTime => None,
                PlanRead::OnceBeforeLookup => Some(self.read_version()),
            },
        }
    }

    fn read_version(&self) -> u16 {
        // Acquire, as `PinnedPlan::head`'s load of the published version.
        let version = self.version.load(Ordering::Acquire);
        u16::try_from(version).expect("a model's version fits in 16 bits")
    }

    /// The client's entry, once every thread is joined.
    pub(crate) fn entry(&self) -> Option<&ModelEntry<M>> {
        self.clients.get(&CLIENT, &())
    }

    /// Puts the client's first entry, made under version 0 as of 0, before any thread starts.
    pub(crate) fn insert_first(&self) -> &ModelEntry<M> {
        let make = || ModelEntry {
            version: 0,
            state: self.method.fresh_state(),
        };
        self.clients.get_or_insert_with(CLIENT, make, &())
    }
}

/// A [`ModelPlan`] pinned for one decision or one sweep.
pub(crate) struct ModelPin<'p, M: Evictable> {
    plan: &'p ModelPlan<M>,
    /// With [`PlanRead::OnceBeforeLookup`], the version read when pinned.
    version_at_pin: Option<u16>,
}

impl<M: Evictable> Pinned for ModelPin<'_, M> {
    type Key = u64;
    type Entry = ModelEntry<M>;
    type Map = LoomClientMap<u64, ModelEntry<M>>;
    type Head = ModelHead;

    fn clients(&self) -> &Self::Map {
        &self.plan.clients
    }

    fn guard(&self) -> &MapGuard<'_, Self> {
        &()
    }

    fn head(&self) -> ModelHead {
        ModelHead(
            self.version_at_pin
                .unwrap_or_else(|| self.plan.read_version()),
        )
    }

    fn retire_now(&self, _head: &ModelHead, entry: &ModelEntry<M>) {
        self.plan.method.retire_now(&entry.state);
    }

    fn retire_if_idle(&self, _head: &ModelHead, entry: &ModelEntry<M>, now_nanos: u64) -> bool {
        self.plan.method.retire_if_idle(&entry.state, now_nanos)
    }
}

/// One request: an attempt, and the entry that answered it (by address: the map keeps every
/// entry until the model ends).
struct ModelRequest<M> {
    method: M,
    attempt: Attempt,
    answered_by: Cell<usize>,
}

fn address<M: Evictable>(entry: &ModelEntry<M>) -> usize {
    std::ptr::from_ref(entry) as usize
}

impl<M: Evictable> Request<ModelPin<'_, M>> for ModelRequest<M> {
    type Answer = Answer;

    fn fresh(
        &self,
        _pinned: &ModelPin<'_, M>,
        head: &ModelHead,
        since_nanos: u64,
    ) -> Fresh<ModelEntry<M>, Answer> {
        Fresh::Entry(ModelEntry {
            version: head.0,
            state: self.method.fresh_state_since(since_nanos),
        })
    }

    fn acquire(
        &self,
        _pinned: &ModelPin<'_, M>,
        _head: &ModelHead,
        entry: &ModelEntry<M>,
    ) -> Result<Acquired<Answer>, Retired> {
        match self
            .method
            .acquire(&entry.state, self.attempt.n, self.attempt.now)
        {
            Answer::Retired => Err(Retired),
            answer => {
                self.answered_by.set(address(entry));
                Ok(Acquired::Answer(answer))
            }
        }
    }
}

/// A service of one plan, as the models drive it: the plan, and the word the sweep publishes
/// its reading in (`RateLimiterService::evicted_up_to`; the negative controls give it one whose
/// fence does nothing).
pub(crate) struct ModelService<M: Evictable, W> {
    pub(crate) plan: ModelPlan<M>,
    evicted_up_to: W,
}

impl<M: Evictable, W: OwnedWord> ModelService<M, W> {
    pub(crate) fn new(method: M, fault: MapFault) -> Self {
        ModelService {
            plan: ModelPlan::new(method, fault),
            evicted_up_to: W::new(0),
        }
    }

    /// `RateLimiterService::acquire` for the client: the protocol's `decide`. Returns the
    /// address of the entry that answered, and the answer.
    pub(crate) fn request(&self, attempt: Attempt, read: PlanRead) -> (usize, Answer) {
        let request = ModelRequest {
            method: self.plan.method,
            attempt,
            answered_by: Cell::new(0),
        };
        let Ok::<_, std::convert::Infallible>(answer) = decide(
            &self.plan.pin(read),
            &CLIENT,
            &request,
            &self.evicted_up_to,
            || panic!("a request looked its client up too often"),
        );
        (request.answered_by.get(), answer)
    }

    /// `RateLimiterService::sweep` at `now`: the protocol's `sweep`. Whether it removed the
    /// client.
    pub(crate) fn sweep(&self, now: u64) -> bool {
        sweep(
            &self.evicted_up_to,
            now,
            [self.plan.pin(PlanRead::EachTime)],
        ) > 0
    }
}

/// Requests for a client the map does not hold yet, one per thread.
#[derive(Debug)]
pub(crate) struct FirstRequests {
    pub(crate) threads: &'static [Attempt],
    pub(crate) preemption_bound: usize,
}

impl FirstRequests {
    pub(crate) fn check<M: Evictable>(&'static self, method: M) {
        self.check_with::<M, AtomicU64>(method, MapFault::None);
    }

    pub(crate) fn check_with<M: Evictable, W: OwnedWord + 'static>(
        &'static self,
        method: M,
        fault: MapFault,
    ) {
        explore(self.preemption_bound, move || {
            let service = Arc::new(ModelService::<M, W>::new(method, fault));
            let requests: Vec<_> = self
                .threads
                .iter()
                .map(|&attempt| {
                    let service = Arc::clone(&service);
                    thread::spawn(move || service.request(attempt, PlanRead::EachTime))
                })
                .collect();
            let answers: Vec<(usize, Answer)> = requests
                .into_iter()
                .map(|request| request.join().expect("a request panicked"))
                .collect();

            let entry = address(service.plan.entry().expect("the client has an entry"));
            assert!(
                answers.iter().all(|&(used, _)| used == entry),
                "first requests made more than one limiter: the map holds {entry:#x}, the \
                 requests used {answers:x?}"
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
    pub(crate) fn check<M: Evictable>(&'static self, method: M) {
        self.check_with::<M, AtomicU64>(method, MapFault::None);
    }

    pub(crate) fn check_with<M: Evictable, W: OwnedWord + 'static>(
        &'static self,
        method: M,
        fault: MapFault,
    ) {
        let coverage = std::sync::Arc::new(Mutex::new(EvictionCoverage::default()));
        let coverage_in_model = std::sync::Arc::clone(&coverage);
        explore(self.preemption_bound, move || {
            let service = Arc::new(ModelService::<M, W>::new(method, fault));
            let first = service.plan.insert_first();
            let mut admissions = prefill(method, &first.state, self.prefill);
            let first = address(first);

            let sweeper = {
                let service = Arc::clone(&service);
                let sweep_at = self.sweep_at;
                thread::spawn(move || service.sweep(sweep_at))
            };
            let requests: Vec<_> = self
                .requests
                .iter()
                .map(|&attempt| {
                    let service = Arc::clone(&service);
                    thread::spawn(move || service.request(attempt, PlanRead::EachTime))
                })
                .collect();
            let swept = sweeper.join().expect("the sweeper panicked");
            let mut admitted_by_fresh_state = false;
            for request in requests {
                let (used, answer) = request.join().expect("a request panicked");
                admissions.extend(answer.admission());
                admitted_by_fresh_state |= used != first && answer.admission().is_some();
            }

            assert_within_bound(M::BOUND, method.rule(), &admissions);
            if let Some(entry) = service.plan.entry() {
                assert!(
                    !method.state_is_retired(&entry.state, self.sweep_at),
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
    TWO_FIRST_REQUESTS.check(bucket(1));
}

#[test]
fn service_first_requests_make_one_fixed_window() {
    TWO_FIRST_REQUESTS.check(window(1));
}

#[test]
fn service_first_requests_make_one_sliding_log() {
    TWO_FIRST_REQUESTS.check(log(1));
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
    SWEEP_THEN_REQUESTS.check(bucket(1));
}

#[test]
fn service_sweep_racing_requests_never_over_admits_fixed_window() {
    SWEEP_THEN_REQUESTS.check(window(1));
}

#[test]
fn service_sweep_racing_requests_never_over_admits_sliding_log() {
    SWEEP_THEN_REQUESTS.check(log(1));
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
    SWEEP_WITH_LAGGING_CLOCK.check(bucket(1));
}

#[test]
fn service_sweep_never_over_admits_lagging_clock_fixed_window() {
    SWEEP_WITH_LAGGING_CLOCK.check(window(1));
}

#[test]
fn service_sweep_never_over_admits_lagging_clock_sliding_log() {
    SWEEP_WITH_LAGGING_CLOCK.check(log(1));
}
