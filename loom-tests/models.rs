//! The model shapes, written once over [`Method`] so that a real state machine and its broken
//! variant run through the same model:
//!
//! - [`Race`]: threads acquire from one state; every interleaving keeps the method's bound, and
//!   the threads win the permits the scenario says.
//! - [`RetireRace`]: an evictor retires the state while threads acquire; a thread that meets the
//!   retired state moves to a fresh one, and the admissions on both together keep the bound,
//!   even for a thread whose clock reads earlier than the evictor's.
//! - [`RetireNowRace`]: two threads retire a state unconditionally (a client moved to another
//!   rule) while a third acquires: exactly one retire takes effect, and the acquire is either
//!   granted before it or told the state is retired.
//! - [`LinearRace`]: threads acquire from one word; the decisions and the final word equal those
//!   of some sequential order of the same attempts, replayed with the pure `decide`.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64 as StdAtomicU64, Ordering as StdOrdering};

use loom::sync::Arc;
use loom::sync::atomic::Ordering;
use loom::thread;
use tollgate::Decision;

use crate::support::{
    Admission, Answer, Attempt, Evictable, Method, OneWord, WINDOW, assert_within_bound, explore,
};

/// Makes `attempts` one after another on `state`, before any thread starts; each must be
/// admitted, or the scenario does not set up what it claims to.
pub(crate) fn prefill<M: Method>(
    method: M,
    state: &M::State,
    attempts: &[Attempt],
) -> Vec<Admission> {
    attempts
        .iter()
        .map(|attempt| {
            method
                .acquire(state, attempt.n, attempt.now)
                .admission()
                .unwrap_or_else(|| panic!("prefill attempt {attempt:?} was not admitted"))
        })
        .collect()
}

fn total_permits(admissions: &[Admission]) -> u64 {
    admissions.iter().map(|admission| admission.permits).sum()
}

/// How many permits the racing threads win together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Won {
    /// Exactly this many in every interleaving: the limiter neither over- nor under-admits.
    Always(u64),
    /// Never more than this many, and this many in at least one interleaving (so the model
    /// reaches the bound it checks).
    AtMost(u64),
}

/// Threads racing to acquire from one state.
#[derive(Debug)]
pub(crate) struct Race {
    /// Attempts made one after another before the threads start; each must be admitted.
    pub(crate) prefill: &'static [Attempt],
    /// One attempt per thread.
    pub(crate) threads: &'static [Attempt],
    pub(crate) won: Won,
    pub(crate) preemption_bound: usize,
}

impl Race {
    pub(crate) fn check<M: Method>(&'static self, method: M) {
        // Outside the model: the most any one execution won, across all of them.
        let most_won = std::sync::Arc::new(StdAtomicU64::new(0));
        let most_won_in_model = std::sync::Arc::clone(&most_won);
        explore(self.preemption_bound, move || {
            let state = Arc::new(method.fresh_state());
            let mut admissions = prefill(method, &state, self.prefill);
            let threads: Vec<_> = self
                .threads
                .iter()
                .map(|&attempt| {
                    let state = Arc::clone(&state);
                    thread::spawn(move || method.acquire(&state, attempt.n, attempt.now))
                })
                .collect();
            let mut won = Vec::new();
            for thread in threads {
                let answer = thread.join().expect("an acquiring thread panicked");
                assert_ne!(answer, Answer::Retired, "nothing retires this state");
                won.extend(answer.admission());
            }
            admissions.extend(&won);
            assert_within_bound(M::BOUND, method.rule(), &admissions);

            let permits = total_permits(&won);
            match self.won {
                Won::Always(expected) => assert_eq!(
                    permits, expected,
                    "the threads won {permits} permits, expected {expected}: {won:?}"
                ),
                Won::AtMost(most) => assert!(
                    permits <= most,
                    "over-admitted: the threads won {permits} permits, at most {most}: {won:?}"
                ),
            }
            most_won_in_model.fetch_max(permits, StdOrdering::Relaxed);
        });
        if let Won::AtMost(most) = self.won {
            assert_eq!(
                most_won.load(StdOrdering::Relaxed),
                most,
                "no interleaving reached the {most} permits the scenario expects"
            );
        }
    }
}

/// An evictor retiring the state while threads acquire from it.
#[derive(Debug)]
pub(crate) struct RetireRace {
    /// Attempts made one after another on the old state before the threads start.
    pub(crate) prefill: &'static [Attempt],
    /// The evictor's clock reading.
    pub(crate) retire_at: u64,
    /// One attempt per thread.
    pub(crate) acquirers: &'static [Attempt],
    pub(crate) preemption_bound: usize,
}

/// Which outcomes the executions of an eviction model reached; a model that never reaches one of
/// them checks less than it claims.
#[derive(Debug, Default)]
pub(crate) struct EvictionCoverage {
    evictor_won: bool,
    evictor_lost: bool,
    admitted_by_fresh_state: bool,
}

impl EvictionCoverage {
    pub(crate) fn record(&mut self, evictor_won: bool, admitted_by_fresh_state: bool) {
        self.evictor_won |= evictor_won;
        self.evictor_lost |= !evictor_won;
        self.admitted_by_fresh_state |= admitted_by_fresh_state;
    }

    pub(crate) fn assert_complete(&self) {
        assert!(
            self.evictor_won && self.evictor_lost && self.admitted_by_fresh_state,
            "the scenario misses an outcome it should reach: {self:?}"
        );
    }
}

impl RetireRace {
    pub(crate) fn check<M: Evictable>(&'static self, method: M) {
        let coverage = std::sync::Arc::new(Mutex::new(EvictionCoverage::default()));
        let coverage_in_model = std::sync::Arc::clone(&coverage);
        explore(self.preemption_bound, move || {
            let old = Arc::new(method.fresh_state());
            // The state a thread moves to once the old one is retired: made as of the evictor's
            // reading, as the service makes the replacement for an evicted client (the service
            // models check that the reading reaches the thread that makes it).
            let fresh = Arc::new(method.fresh_state_since(self.retire_at));
            let mut admissions = prefill(method, &old, self.prefill);

            let retire_at = self.retire_at;
            let evictor = {
                let old = Arc::clone(&old);
                thread::spawn(move || method.retire_if_idle(&old, retire_at))
            };
            let acquirers: Vec<_> = self
                .acquirers
                .iter()
                .map(|&attempt| {
                    let (old, fresh) = (Arc::clone(&old), Arc::clone(&fresh));
                    thread::spawn(move || match method.acquire(&old, attempt.n, attempt.now) {
                        Answer::Retired => {
                            // The same reading on the fresh state: a clock that lags the
                            // evictor's stays behind it.
                            let answer = method.acquire(&fresh, attempt.n, attempt.now);
                            assert_ne!(answer, Answer::Retired, "a fresh state is never retired");
                            (answer, true)
                        }
                        answer => (answer, false),
                    })
                })
                .collect();

            let retired = evictor.join().expect("the evictor panicked");
            let mut admitted_by_fresh_state = false;
            for acquirer in acquirers {
                let (answer, moved) = acquirer.join().expect("an acquiring thread panicked");
                assert!(
                    !moved || retired,
                    "a thread met a retired state the evictor did not retire"
                );
                admissions.extend(answer.admission());
                admitted_by_fresh_state |= moved && answer.admission().is_some();
            }
            assert_eq!(
                method.state_is_retired(&old, retire_at),
                retired,
                "the old state must be retired exactly when the evictor won, and stay retired"
            );
            assert_within_bound(M::BOUND, method.rule(), &admissions);

            coverage_in_model
                .lock()
                .expect("coverage lock")
                .record(retired, admitted_by_fresh_state);
        });
        coverage.lock().expect("coverage lock").assert_complete();
    }
}

/// Two threads retiring a state unconditionally while a third acquires one permit from it.
#[derive(Debug)]
pub(crate) struct RetireNowRace {
    /// Attempts made one after another before the threads start; each must be admitted.
    pub(crate) prefill: &'static [Attempt],
    /// The acquiring thread's attempt, which the state can grant until it is retired.
    pub(crate) acquirer: Attempt,
    pub(crate) preemption_bound: usize,
}

impl RetireNowRace {
    pub(crate) fn check<M: Evictable>(&'static self, method: M) {
        explore(self.preemption_bound, move || {
            let state = Arc::new(method.fresh_state());
            prefill(method, &state, self.prefill);
            let retirers: Vec<_> = (0..2)
                .map(|_| {
                    let state = Arc::clone(&state);
                    thread::spawn(move || method.retire_now(&state))
                })
                .collect();
            let attempt = self.acquirer;
            let answer = method.acquire(&state, attempt.n, attempt.now);
            let retired_by: Vec<bool> = retirers
                .into_iter()
                .map(|retirer| retirer.join().expect("a retiring thread panicked"))
                .collect();

            assert_eq!(
                retired_by.iter().filter(|&&retired| retired).count(),
                1,
                "exactly one unconditional retire must take effect: {retired_by:?}"
            );
            assert!(
                matches!(answer, Answer::Admitted(_) | Answer::Retired),
                "an attempt the state could grant was denied instead: {answer:?}"
            );
            assert!(
                method.state_is_retired(&state, attempt.now),
                "the state must stay retired"
            );
        });
    }
}

/// Threads acquiring from one word, checked against every sequential order of their attempts.
/// The attempts all overlap in time (every thread starts before any is joined), so
/// linearizability asks exactly for some sequential order.
#[derive(Debug)]
pub(crate) struct LinearRace {
    /// Attempts made one after another before the threads start; each must be admitted.
    pub(crate) prefill: &'static [Attempt],
    /// One attempt per thread.
    pub(crate) threads: &'static [Attempt],
    pub(crate) preemption_bound: usize,
}

impl LinearRace {
    pub(crate) fn check<M: OneWord>(&'static self, method: M) {
        explore(self.preemption_bound, move || {
            let word = Arc::new(method.fresh_state());
            prefill(method, &word, self.prefill);
            // Relaxed: no thread has started yet.
            let initial = word.load(Ordering::Relaxed);
            let threads: Vec<_> = self
                .threads
                .iter()
                .map(|&attempt| {
                    let word = Arc::clone(&word);
                    thread::spawn(move || method.acquire_decision(&word, attempt.n, attempt.now))
                })
                .collect();
            let observed: Vec<Decision> = threads
                .into_iter()
                .map(|thread| thread.join().expect("an acquiring thread panicked"))
                .map(|decided| decided.expect("nothing retires this word"))
                .collect();
            // Relaxed: the joins order every thread's exchange before this load.
            let last = word.load(Ordering::Relaxed);

            let linearizable = orders(self.threads.len()).iter().any(|order| {
                let (decisions, end) = replay(method, initial, self.threads, order);
                decisions == observed && self.same_answers(method, end, last)
            });
            assert!(
                linearizable,
                "not linearizable: no sequential order of {:?} from word {initial:#x} answers \
                 {observed:?} and ends at a word equivalent to {last:#x}",
                self.threads
            );
        });
    }

    /// Whether words `a` and `b` answer every probe alike: each thread's reading and half a
    /// window later, for every n up to the limit. Equal decisions, not equal bits: the fixed
    /// window's fast path may leave a count above the limit where a replay stops at it.
    fn same_answers<M: OneWord>(&self, method: M, a: u64, b: u64) -> bool {
        self.threads.iter().all(|attempt| {
            [attempt.now, attempt.now + WINDOW / 2].iter().all(|&now| {
                (0..=method.rule().limit())
                    .all(|n| method.decide(a, now, n).0 == method.decide(b, now, n).0)
            })
        })
    }
}

/// Replays `attempts` one after another in `order` from `word` with the pure decision: the
/// decision each attempt gets (indexed as `attempts`) and the word it ends at.
fn replay<M: OneWord>(
    method: M,
    mut word: u64,
    attempts: &[Attempt],
    order: &[usize],
) -> (Vec<Decision>, u64) {
    let mut decisions = vec![None; attempts.len()];
    for &index in order {
        let attempt = attempts[index];
        let (decision, new) = method.decide(word, attempt.now, attempt.n);
        decisions[index] = Some(decision);
        word = new.unwrap_or(word);
    }
    let decisions = decisions
        .into_iter()
        .map(|decision| decision.expect("an order lists every attempt"))
        .collect();
    (decisions, word)
}

/// Every order of `0..count`.
fn orders(count: usize) -> Vec<Vec<usize>> {
    if count == 0 {
        return vec![Vec::new()];
    }
    let mut all = Vec::new();
    for shorter in orders(count - 1) {
        for position in 0..=shorter.len() {
            let mut order = shorter.clone();
            order.insert(position, count - 1);
            all.push(order);
        }
    }
    all
}
