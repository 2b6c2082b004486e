//! What the store's stress tests share: a hasher that lets a test place each key (its hash is
//! the key), keys placed in chosen buckets, a small fast generator of pseudo-random numbers, a
//! watchdog that fails a run whose threads hang, and a lock that runs a file's tests one at a time.

#![allow(dead_code)]

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use tollgate::{Algorithm, FakeClock, RateLimiterService, Rule, ServiceBuilder};

/// Where the races of new clients and sweeps spend their spent clients' permits: far enough
/// ahead that no reading of a race reaches it (windows of 1 ms, two per new client: half a
/// billion new clients), so that those clients stay spent, and never idle, throughout.
pub(crate) const SPENT_AHEAD: Duration = Duration::from_secs(1_000_000);

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

/// One test of a file at a time, where each wants both cores: each takes this first.
pub(crate) fn serial() -> MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The store's `bucket_of`: the bucket of `hash` among `buckets`.
pub(crate) fn bucket_of(hash: u64, buckets: usize) -> usize {
    ((u128::from(hash) * buckets as u128) >> 64) as usize
}

/// The store's `other_of`: the other bucket of the key whose hash is `hash`.
pub(crate) fn other_of(hash: u64, buckets: usize) -> usize {
    let remixed = (hash ^ (hash >> 31)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    bucket_of(remixed, buckets)
}

/// A key of fingerprint `fingerprint` (below 2^40, not 0) whose home bucket is `home` and whose
/// other bucket is `other`, in a store of `buckets` buckets (under [`Identity`], the key is its
/// hash).
pub(crate) fn key_at(fingerprint: u64, home: usize, other: usize, buckets: usize) -> u64 {
    assert!(fingerprint != 0 && fingerprint < 1 << 40);
    // The high 24 bits decide the home: start where they give `home`.
    let first = ((home as u64) << 24).div_ceil(buckets as u64);
    for high in first..(1u64 << 24) {
        let key = (high << 40) | fingerprint;
        if bucket_of(key, buckets) == home && other_of(key, buckets) == other {
            return key;
        }
    }
    panic!("no key with buckets ({home}, {other}) among {buckets}");
}

/// A service of `u64` clients on one plan, whose keys a test places ([`Identity`]).
pub(crate) type PlacedService = RateLimiterService<u64, &'static str, FakeClock, Identity>;

/// The plan of a [`PlacedService`].
pub(crate) const PLAN: &str = "p";

/// The methods whose clients the store keeps (one word of state each).
pub(crate) const STORE_METHODS: [Algorithm; 3] = [
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowCounter,
];

/// A [`PlacedService`] of `algorithm` and `capacity`, its plan under `rule`, reading `clock`.
pub(crate) fn placed_service(
    algorithm: Algorithm,
    capacity: usize,
    rule: Rule,
    clock: &FakeClock,
) -> Arc<PlacedService> {
    Arc::new(
        ServiceBuilder::new(algorithm, clock.clone())
            .plan(PLAN, rule)
            .capacity(capacity)
            .hasher(Identity)
            .build::<u64>()
            .expect("a service"),
    )
}
