//! Time, read only through the [`Clock`] trait.
//!
//! # Monotonicity
//!
//! A clock reports nanoseconds since its own origin as a `u64`. Readings from one clock (and from
//! its clones, which share the origin) never go backwards on one thread; across threads two
//! readings may be slightly out of order (cores' counters are not perfectly in step, and a reading
//! is stale by the time it is used). Every limiter in this crate is written for that: all time
//! arithmetic saturates, and a reading earlier than what a limiter has already seen never panics
//! and never grants a permit that a later reading would not. The window methods count it as
//! no time having passed; the token bucket sees a debt not yet repaid (so it may deny what the
//! later reading would still allow).

use std::sync::Arc;
use std::time::Duration;

use crossbeam_utils::CachePadded;

use crate::sync::{Ordering, Word};

/// A source of monotonic time: nanoseconds since the clock's origin.
///
/// Clones of one clock share its origin, so limiters made from them agree on window alignment.
///
/// The service reads its clock holding none of its own locks (a first request's insert lets its
/// bucket's lock go before it reads), so a clock that takes long delays only the request that
/// reads it, and a clock may itself call the service that reads it.
pub trait Clock: Send + Sync {
    /// Nanoseconds since this clock's origin.
    fn now_nanos(&self) -> u64;
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now_nanos(&self) -> u64 {
        (**self).now_nanos()
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    #[inline]
    fn now_nanos(&self) -> u64 {
        (**self).now_nanos()
    }
}

/// The production clock: the CPU's time-stamp counter through [`quanta`], about twice as cheap
/// as [`std::time::Instant::now`], falling back to the OS monotonic clock where no usable counter
/// exists.
///
/// # Examples
///
/// ```
/// use tollgate::{Clock, MonotonicClock};
///
/// let clock = MonotonicClock::new();
/// let a = clock.now_nanos();
/// let b = clock.now_nanos();
/// assert!(b >= a);
/// ```
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    clock: quanta::Clock,
    origin_raw: u64,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin_raw = clock.raw();
        MonotonicClock { clock, origin_raw }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    // Always inlined: the lookup of a known client reads it once; called out of line (as the
    // default release profile chose once that lookup grew), quanta's read was a second call.
    #[inline(always)]
    fn now_nanos(&self) -> u64 {
        // `delta_as_nanos` returns 0 for a raw reading at or before the origin (a counter that
        // differs slightly between cores), so this never underflows.
        self.clock.delta_as_nanos(self.origin_raw, self.clock.raw())
    }
}

/// A clock that moves only when told to: for tests, simulations and demos that must not sleep.
///
/// Clones share one time, so a test keeps a clone and advances the clock its limiters read.
/// Safe to read and move from many threads at once.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Clock, FakeClock};
///
/// let clock = FakeClock::new();
/// let seen_by_limiter = clock.clone();
/// clock.advance(Duration::from_millis(200));
/// assert_eq!(seen_by_limiter.now_nanos(), 200_000_000);
/// clock.set(Duration::from_secs(1));
/// assert_eq!(seen_by_limiter.now_nanos(), 1_000_000_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct FakeClock {
    nanos: Arc<Word>,
}

impl FakeClock {
    /// A clock standing at its origin (0 ns).
    pub fn new() -> Self {
        Self::default()
    }

    /// A clock standing at `at` after its origin.
    pub fn starting_at(at: Duration) -> Self {
        let clock = Self::new();
        clock.set(at);
        clock
    }

    /// Moves the clock forward by `by`, saturating at `u64::MAX` nanoseconds.
    pub fn advance(&self, by: Duration) {
        let by = duration_to_nanos(by);
        // Relaxed: the clock publishes no other memory; readers need only this word's value.
        let _ = self
            .nanos
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_add(by))
            });
    }

    /// Sets the clock to `at` after its origin. Setting it backwards is allowed: it is how tests
    /// model a clock step, and the limiters must tolerate it.
    pub fn set(&self, at: Duration) {
        // Relaxed: as in `advance`.
        self.nanos.store(duration_to_nanos(at), Ordering::Relaxed);
    }

    /// The current reading as a `Duration`.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.now_nanos())
    }
}

impl Clock for FakeClock {
    #[inline]
    fn now_nanos(&self) -> u64 {
        // Relaxed: see `advance`.
        self.nanos.load(Ordering::Relaxed)
    }
}

/// A coarse clock: reads a timestamp that a background thread refreshes every `interval`, for
/// about a nanosecond a read instead of about ten.
///
/// Opt in where a resolution of `interval` is acceptable: a token bucket read through it refills
/// in steps of `interval`, and a window boundary is seen up to `interval` late. Every guarantee
/// of the limiters still holds (they never assume fresh readings), only later.
///
/// The refreshing thread is shared by all clones; it holds no strong reference, and stops within
/// one `interval` of the last clone being dropped.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Clock, CoarseClock};
///
/// let clock = CoarseClock::start(Duration::from_millis(1))?;
/// let a = clock.now_nanos();
/// // The reading moves on once the refreshing thread next runs (however busy the machine).
/// while clock.now_nanos() == a {
///     std::thread::sleep(Duration::from_millis(1));
/// }
/// assert!(clock.now_nanos() > a);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct CoarseClock {
    nanos: Arc<CachePadded<Word>>,
}

impl CoarseClock {
    /// Starts the refreshing thread, updating the reading every `interval` (1 ms is typical)
    /// from a [`MonotonicClock`].
    ///
    /// # Errors
    ///
    /// An [`std::io::Error`] of kind `InvalidInput` when `interval` is zero (the thread would
    /// spin), or the OS's error when it refuses a thread.
    pub fn start(interval: Duration) -> std::io::Result<Self> {
        if interval.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "coarse clock interval 0s is invalid: it must be at least 1ns (1ms is typical)",
            ));
        }
        let source = MonotonicClock::new();
        let nanos = Arc::new(CachePadded::new(Word::new(source.now_nanos())));
        let shared = Arc::downgrade(&nanos);
        std::thread::Builder::new()
            .name("tollgate-coarse-clock".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(interval);
                    let Some(nanos) = shared.upgrade() else {
                        return;
                    };
                    // Relaxed: the reading publishes no other memory; readers need only it.
                    nanos.store(source.now_nanos(), Ordering::Relaxed);
                }
            })?;
        Ok(CoarseClock { nanos })
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now_nanos(&self) -> u64 {
        // Relaxed: see `start`.
        self.nanos.load(Ordering::Relaxed)
    }
}

/// A clock stopped at one reading: the limits of one request, or the states one judgement
/// compares (which is idle, which closest to fresh), all decide at the same instant.
pub(crate) struct Reading(pub(crate) u64);

impl Clock for Reading {
    #[inline]
    fn now_nanos(&self) -> u64 {
        self.0
    }
}

/// `d` in nanoseconds, saturating at `u64::MAX` (584 years).
#[inline]
pub(crate) fn duration_to_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
