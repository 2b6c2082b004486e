//! [`LimiterFactory`] and [`AnyLimiter`]: a limiter of the method a setting names.

use crate::clock::Clock;
use crate::error::RuleError;
use crate::method::for_each_method;
use crate::{Algorithm, Decision, Limiter, MonotonicClock, Rule};

/// `AnyLimiter`, one variant per method of `for_each_method`, and how the factory makes each.
macro_rules! any_limiter {
    ($($method:ident($params:ty)),* $(,)?) => {
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
            $(
                #[doc = concat!("A [`", stringify!($method), "`](crate::", stringify!($method), ").")]
                $method(crate::$method<C>),
            )*
        }

        impl<C: Clock> AnyLimiter<C> {
            /// The method of this limiter.
            pub fn algorithm(&self) -> Algorithm {
                match self {
                    $(AnyLimiter::$method(_) => Algorithm::$method,)*
                }
            }

            /// A fresh limiter of `algorithm` for `rule`, reading time from `clock`.
            fn create(algorithm: Algorithm, rule: Rule, clock: C) -> Result<Self, RuleError> {
                Ok(match algorithm {
                    $(Algorithm::$method => AnyLimiter::$method(crate::$method::new(rule, clock)?),)*
                })
            }
        }

        impl<C: Clock> Limiter for AnyLimiter<C> {
            #[inline]
            fn try_acquire(&self) -> bool {
                match self {
                    $(AnyLimiter::$method(limiter) => limiter.try_acquire(),)*
                }
            }

            #[inline]
            fn try_acquire_n(&self, n: u64) -> Decision {
                match self {
                    $(AnyLimiter::$method(limiter) => limiter.try_acquire_n(n),)*
                }
            }

            #[inline]
            fn peek(&self) -> Decision {
                match self {
                    $(AnyLimiter::$method(limiter) => limiter.peek(),)*
                }
            }

            fn rule(&self) -> Rule {
                match self {
                    $(AnyLimiter::$method(limiter) => limiter.rule(),)*
                }
            }
        }
    };
}

for_each_method!(any_limiter);

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
        crate::service::client_state::ClientParams::new(self.algorithm, rule, 0).map(|_| ())
    }

    /// A fresh limiter for `rule`, reading time from `clock`.
    pub fn create<C: Clock>(&self, rule: Rule, clock: C) -> Result<AnyLimiter<C>, RuleError> {
        AnyLimiter::create(self.algorithm, rule, clock)
    }
}
