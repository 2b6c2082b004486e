//! Rounds of threads started together: each round's threads spin on a flag (not a blocking
//! barrier, so that what they race overlaps), and a failure on one thread stops them all.

#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// How long one round may wait to start before the test fails as hung.
const PATIENCE: Duration = Duration::from_secs(30);

/// Runs `rounds` rounds of `threads` threads: each round starts on all of them at once (they
/// spin on a flag), runs `work(thread, round)`, and the round's last thread runs
/// `between(next round)` before starting the next. Returns each round's answers, by thread.
pub(crate) fn race_rounds(
    threads: usize,
    rounds: usize,
    between: impl Fn(usize) + Send + Sync + 'static,
    work: impl Fn(usize, usize) -> u64 + Send + Sync + 'static,
) -> Vec<Vec<u64>> {
    struct Shared<B, W> {
        /// Round `r` runs once this is past `r`.
        go: AtomicUsize,
        done: AtomicUsize,
        abort: AtomicBool,
        answers: Vec<AtomicU64>,
        between: B,
        work: W,
    }
    /// Stops every thread when one panics.
    struct AbortOnPanic<'a>(&'a AtomicBool);
    impl Drop for AbortOnPanic<'_> {
        fn drop(&mut self) {
            if thread::panicking() {
                self.0.store(true, Ordering::SeqCst);
            }
        }
    }
    let shared = Arc::new(Shared {
        go: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        abort: AtomicBool::new(false),
        answers: (0..threads * rounds).map(|_| AtomicU64::new(0)).collect(),
        between,
        work,
    });
    (shared.between)(0);
    shared.go.store(1, Ordering::SeqCst);
    let handles: Vec<_> = (0..threads)
        .map(|thread| {
            let shared = Arc::clone(&shared);
            thread::spawn(move || {
                let _abort = AbortOnPanic(&shared.abort);
                for round in 0..rounds {
                    // Each round's wait is bounded, not the whole run (which a loaded machine
                    // may stretch far past `PATIENCE`).
                    let started = Instant::now();
                    let mut spins = 0_u32;
                    while shared.go.load(Ordering::Acquire) <= round {
                        assert!(
                            !shared.abort.load(Ordering::SeqCst),
                            "another thread failed"
                        );
                        assert!(started.elapsed() < PATIENCE, "round {round} never started");
                        spins += 1;
                        if spins.is_multiple_of(256) {
                            thread::yield_now();
                        } else {
                            std::hint::spin_loop();
                        }
                    }
                    let answer = (shared.work)(thread, round);
                    shared.answers[round * threads + thread].store(answer, Ordering::SeqCst);
                    if shared.done.fetch_add(1, Ordering::AcqRel) + 1 == threads * (round + 1) {
                        if round + 1 < rounds {
                            (shared.between)(round + 1);
                        }
                        shared.go.store(round + 2, Ordering::Release);
                    }
                }
            })
        })
        .collect();
    for handle in handles {
        if let Err(panic) = handle.join() {
            std::panic::resume_unwind(panic);
        }
    }
    (0..rounds)
        .map(|round| {
            (0..threads)
                .map(|thread| shared.answers[round * threads + thread].load(Ordering::SeqCst))
                .collect()
        })
        .collect()
}

/// [`race_rounds`] on `subject`: before each round, `between(subject)` runs (after the reading
/// of the round before, where there is one); at the end of each round, `at_round_end(subject)`
/// reads it. Returns each round's answers, by thread, and each round's reading.
pub(crate) fn race_rounds_read<S, T>(
    subject: &Arc<S>,
    threads: usize,
    rounds: usize,
    at_round_end: impl Fn(&S) -> T + Send + Sync + 'static,
    between: impl Fn(&S) + Send + Sync + 'static,
    work: impl Fn(&S, usize, usize) -> u64 + Send + Sync + 'static,
) -> (Vec<Vec<u64>>, Vec<T>)
where
    S: Send + Sync + 'static,
    T: Send + 'static,
{
    let readings = Arc::new(Mutex::new(Vec::new()));
    let at_round_end = Arc::new(at_round_end);
    let answers = {
        let (racing, watched, readings_of_rounds, read) = (
            Arc::clone(subject),
            Arc::clone(subject),
            Arc::clone(&readings),
            Arc::clone(&at_round_end),
        );
        race_rounds(
            threads,
            rounds,
            move |round| {
                if round > 0 {
                    let reading = read(&watched);
                    readings_of_rounds.lock().unwrap().push(reading);
                }
                between(&watched);
            },
            move |thread, round| work(&racing, thread, round),
        )
    };
    let mut readings = std::mem::take(&mut *readings.lock().unwrap());
    readings.push(at_round_end(subject));
    (answers, readings)
}

/// How many of `values` (one a round) are not `ok`, and the first ten of them with their rounds.
pub(crate) fn off_rounds<T: Clone>(
    values: &[T],
    ok: impl Fn(usize, &T) -> bool,
) -> (usize, Vec<(usize, T)>) {
    let off: Vec<_> = values
        .iter()
        .enumerate()
        .filter(|(round, value)| !ok(*round, value))
        .map(|(round, value)| (round, value.clone()))
        .collect();
    (off.len(), off.into_iter().take(10).collect())
}
