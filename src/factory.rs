//! [`LimiterFactory`] and [`AnyLimiter`]: a limiter of the method a setting names.

use crate::clock::Clock;
use crate::error::RuleError;
use crate::{
    Algorithm, Decision, FixedWindow, Limiter, MonotonicClock, Rule, SlidingWindowCounter,
    SlidingWindowLog, TokenBucket,
};

/// A limiter of any method, dispatched by `match` (no boxing, no virtual call).
///
/// # Examples
///
/// ```
/// use tollgate::{Algorithm, FakeClock, Limiter, LimiterFactory, Rule};
///
/// let factory = LimiterFactory::new(Algorithm::SlidingWindowLog);
/// let limiter = factory.create(Rule::per_second(2)?, FakeClock::new())?;
/// assert!(limiter.try_acquire());
/// assert!(limiter.try_acquire());
/// assert!(!limiter.try_acquire());
/// # Ok::<(), tollgate::RuleError>(())
/// ```
#[derive(Debug)]
pub enum AnyLimiter<C = MonotonicClock> {
    /// A [`TokenBucket`].
    TokenBucket(TokenBucket<C>),
    /// A [`FixedWindow`].
    FixedWindow(FixedWindow<C>),
    /// A [`SlidingWindowLog`].
    SlidingWindowLog(SlidingWindowLog<C>),
    /// A [`SlidingWindowCounter`].
    SlidingWindowCounter(SlidingWindowCounter<C>),
}

impl<C: Clock> AnyLimiter<C> {
    /// The method of this limiter.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            AnyLimiter::TokenBucket(_) => Algorithm::TokenBucket,
            AnyLimiter::FixedWindow(_) => Algorithm::FixedWindow,
            AnyLimiter::SlidingWindowLog(_) => Algorithm::SlidingWindowLog,
            AnyLimiter::SlidingWindowCounter(_) => Algorithm::SlidingWindowCounter,
        }
    }

    /// A fresh limiter of `algorithm` for `rule`, reading time from `clock`.
    fn create(algorithm: Algorithm, rule: Rule, clock: C) -> Result<Self, RuleError> {
        Ok(match algorithm {
            Algorithm::TokenBucket => AnyLimiter::TokenBucket(TokenBucket::new(rule, clock)?),
            Algorithm::FixedWindow => AnyLimiter::FixedWindow(FixedWindow::new(rule, clock)?),
            Algorithm::SlidingWindowLog => {
                AnyLimiter::SlidingWindowLog(SlidingWindowLog::new(rule, clock)?)
            }
            Algorithm::SlidingWindowCounter => {
                AnyLimiter::SlidingWindowCounter(SlidingWindowCounter::new(rule, clock)?)
            }
        })
    }
}

impl<C: Clock> Limiter for AnyLimiter<C> {
    #[inline]
    fn try_acquire(&self) -> bool {
        match self {
            AnyLimiter::TokenBucket(limiter) => limiter.try_acquire(),
            AnyLimiter::FixedWindow(limiter) => limiter.try_acquire(),
            AnyLimiter::SlidingWindowLog(limiter) => limiter.try_acquire(),
            AnyLimiter::SlidingWindowCounter(limiter) => limiter.try_acquire(),
        }
    }

    #[inline]
    fn try_acquire_n(&self, n: u64) -> Decision {
        match self {
            AnyLimiter::TokenBucket(limiter) => limiter.try_acquire_n(n),
            AnyLimiter::FixedWindow(limiter) => limiter.try_acquire_n(n),
            AnyLimiter::SlidingWindowLog(limiter) => limiter.try_acquire_n(n),
            AnyLimiter::SlidingWindowCounter(limiter) => limiter.try_acquire_n(n),
        }
    }

    #[inline]
    fn peek(&self) -> Decision {
        match self {
            AnyLimiter::TokenBucket(limiter) => limiter.peek(),
            AnyLimiter::FixedWindow(limiter) => limiter.peek(),
            AnyLimiter::SlidingWindowLog(limiter) => limiter.peek(),
            AnyLimiter::SlidingWindowCounter(limiter) => limiter.peek(),
        }
    }

    fn rule(&self) -> Rule {
        match self {
            AnyLimiter::TokenBucket(limiter) => limiter.rule(),
            AnyLimiter::FixedWindow(limiter) => limiter.rule(),
            AnyLimiter::SlidingWindowLog(limiter) => limiter.rule(),
            AnyLimiter::SlidingWindowCounter(limiter) => limiter.rule(),
        }
    }
}

/// Makes limiters of one method: the setting, applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimiterFactory {
    algorithm: Algorithm,
}

impl LimiterFactory {
    /// A factory for `algorithm`.
    pub fn new(algorithm: Algorithm) -> Self {
        LimiterFactory { algorithm }
    }

    /// The method this factory makes.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Checks that the method can honour `rule`, without making a limiter.
    ///
    /// # Errors
    ///
    /// The [`RuleError`] the method's limiter would give for `rule`.
    pub fn check(&self, rule: Rule) -> Result<(), RuleError> {
        crate::method::any::AnyParams::new(self.algorithm, rule, 0).map(|_| ())
    }

    /// A fresh limiter for `rule`, reading time from `clock`.
    pub fn create<C: Clock>(&self, rule: Rule, clock: C) -> Result<AnyLimiter<C>, RuleError> {
        AnyLimiter::create(self.algorithm, rule, clock)
    }
}
