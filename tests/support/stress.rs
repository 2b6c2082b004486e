//! What the store's stress tests share: a hasher that lets a test place each key (its hash is
//! the key), a small fast generator of pseudo-random numbers, and a watchdog that fails a run
//! whose threads hang.

#![allow(dead_code)]

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// The hash is the `u64` key itself: a test picks each key's fingerprint and buckets.
#[derive(Debug, Clone, Default)]
pub(crate) struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0 << 8) | u64::from(*byte);
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

/// Builds [`IdentityHasher`]s.
#[derive(Debug, Clone, Default)]
pub(crate) struct Identity;

impl BuildHasher for Identity {
    type Hasher = IdentityHasher;
    fn build_hasher(&self) -> IdentityHasher {
        IdentityHasher(0)
    }
}

/// The next number of a xorshift sequence kept in `state` (not 0).
pub(crate) fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// A watch on a run: aborts the process unless [`Watchdog::finish`] is called within its limit
/// (a hung decision, such as a compare-and-swap loop spinning on a changed holding, an insert lock
/// never released or a livelocked insert, fails the run).
pub(crate) struct Watchdog {
    done: Arc<AtomicBool>,
    thread: thread::JoinHandle<()>,
}

impl Watchdog {
    /// Starts watching a run named `what` that must finish within `limit`.
    pub(crate) fn start(limit: Duration, what: String) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let watched = Arc::clone(&done);
        let thread = thread::spawn(move || {
            let start = Instant::now();
            while !watched.load(Ordering::Relaxed) {
                if start.elapsed() > limit {
                    eprintln!("HANG: {what} did not finish within {limit:?}");
                    std::process::abort();
                }
                thread::sleep(Duration::from_millis(20));
            }
        });
        Watchdog { done, thread }
    }

    /// The run finished: stops the watch.
    pub(crate) fn finish(self) {
        self.done.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
    }
}

/// How long each stress shape runs: the milliseconds in the environment's `variable`, else
/// `default_millis`.
pub(crate) fn hammer_for(variable: &str, default_millis: u64) -> Duration {
    let millis = std::env::var(variable)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default_millis);
    Duration::from_millis(millis)
}
