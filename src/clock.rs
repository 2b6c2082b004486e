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
    /// Reads the count that `nanos_per_count` scales: quanta's raw reading, or (where its scale
    /// has no exact fixed-point form, see [`MonotonicClock::new`]) that reading in nanoseconds.
    read_count: fn(&quanta::Clock) -> u64,
    /// The count at the clock's origin.
    origin_count: u64,
    /// Nanoseconds per count, in units of 2^-[`SCALE_SHIFT`] nanoseconds.
    nanos_per_count: u64,
}

/// The fraction bits of [`MonotonicClock`]'s scale. A constant, so that a reading is scaled by
/// one multiplication and one fixed shift: quanta's own conversion shifts by its calibration's
/// power of two, which the compiler cannot fold (about five more instructions a reading).
const SCALE_SHIFT: u32 = 48;

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self::with_counter(quanta::Clock::new(), true)
    }

    /// `clock`, its raw counts scaled as quanta scales them, by a fixed-point factor taken from
    /// its calibration; or (where that factor would not give quanta's nanoseconds exactly, or
    /// `exact_scale` is false) its raw counts turned into nanoseconds by quanta before the read
    /// returns. quanta scales a count by a multiplication and a right shift by its calibration's
    /// power of two, which is at most 40 for any counter it calibrates (200 ms at most, of fewer
    /// than 2^40 ticks), so the same scale written with [`SCALE_SHIFT`] fraction bits is exact
    /// for a counter of more than 15.3 kHz (2^16 nanoseconds a tick would not fit): every
    /// time-stamp counter, and the OS clock that quanta falls back to (a scale of 1). The
    /// check below compares the two at counts up to 2^47 (39 hours at 1 GHz): at 2^48 both are
    /// the factor itself.
    fn with_counter(clock: quanta::Clock, exact_scale: bool) -> Self {
        let nanos_per_count = clock.delta_as_nanos(0, 1 << SCALE_SHIFT);
        let exact = exact_scale
            && [
                1,
                3,
                999,
                1 << 20,
                u64::from(u32::MAX) * 977,
                (1 << 32) + 12_345,
                1 << 40,
                (1 << 47) + (1 << 20) + 7,
            ]
            .into_iter()
            .all(|count| scale(count, nanos_per_count) == clock.delta_as_nanos(0, count));
        let (read_count, nanos_per_count): (fn(&quanta::Clock) -> u64, u64) = if exact {
            (quanta::Clock::raw, nanos_per_count)
        } else {
            (
                |clock| clock.delta_as_nanos(0, clock.raw()),
                1 << SCALE_SHIFT,
            )
        };
        let origin_count = read_count(&clock);
        MonotonicClock {
            clock,
            read_count,
            origin_count,
            nanos_per_count,
        }
    }
}

/// `count` counts in nanoseconds, at `nanos_per_count` (see [`MonotonicClock`]).
#[inline(always)]
fn scale(count: u64, nanos_per_count: u64) -> u64 {
    // The product has at most 128 bits; shifted, 80, of which a `u64` keeps the low 64 (584
    // years of nanoseconds), as quanta's conversion does.
    ((u128::from(count) * u128::from(nanos_per_count)) >> SCALE_SHIFT) as u64
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
        // A count before the origin (a counter that differs slightly between cores) reads as the
        // origin, as quanta's `delta_as_nanos` reads it.
        let elapsed = (self.read_count)(&self.clock).saturating_sub(self.origin_count);
        scale(elapsed, self.nanos_per_count)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixed-point scale gives quanta's nanoseconds exactly, on this machine's counter.
    #[test]
    fn a_reading_is_scaled_as_quanta_scales_it() {
        let clock = MonotonicClock::new();
        let counts = (0..64)
            .map(|bit| 1u64 << bit)
            .chain((1..10_000).map(|n| n * 7_919_993))
            .chain([u64::from(u32::MAX), 1 << 50, u64::MAX / 3, u64::MAX]);
        for count in counts {
            let start = clock.origin_count;
            let end = start.saturating_add(count);
            assert_eq!(
                scale(end - start, clock.nanos_per_count),
                clock.clock.delta_as_nanos(start, end),
                "{count} counts from the origin",
            );
        }
    }

    /// Without the fixed-point scale (where it would not be exact), a reading is still the
    /// nanoseconds since the origin, and moves with the other's.
    #[test]
    fn the_clock_without_the_fixed_point_scale_reads_the_same_time() {
        let exact = MonotonicClock::new();
        let inexact = MonotonicClock::with_counter(quanta::Clock::new(), false);
        assert_eq!(inexact.nanos_per_count, 1 << SCALE_SHIFT);
        let (a, b) = (exact.now_nanos(), inexact.now_nanos());
        std::thread::sleep(Duration::from_millis(20));
        let (c, d) = (exact.now_nanos(), inexact.now_nanos());
        assert!(d > b && c > a);
        // Both saw the same 20 ms, within the scheduling between their reads.
        let (moved_exact, moved_inexact) = (c - a, d - b);
        assert!(
            moved_exact.abs_diff(moved_inexact) < 5_000_000,
            "{moved_exact} ns against {moved_inexact} ns"
        );
    }
}
