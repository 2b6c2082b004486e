//! [`Rule`]: how many permits per how long.

use std::fmt;
use std::time::Duration;

use crate::clock::duration_to_nanos;
use crate::error::RuleError;

/// [`Rule::MAX_WINDOW`] in nanoseconds.
const MAX_WINDOW_NANOS: u64 = 1 << 63;

/// A limit per window: at most `limit` permits per `window`.
///
/// A rule is valid for every method once [`Rule::new`] accepts it; a method may still refuse a
/// rule it cannot honour exactly (a sliding window log longer than its capacity, say), and says so
/// with a [`RuleError`] when the limiter is made.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::Rule;
///
/// let free = Rule::per_second(5)?;
/// assert_eq!(free, Rule::new(5, Duration::from_secs(1))?);
/// assert!(Rule::new(0, Duration::from_secs(1)).is_err());
/// # Ok::<(), tollgate::RuleError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rule {
    limit: u64,
    window_nanos: u64,
}

impl Rule {
    /// The longest window a rule may have: `u64::MAX` nanoseconds halved, about 292 years, so
    /// that adding one window to any timestamp within a limiter's horizon cannot overflow.
    pub const MAX_WINDOW: Duration = Duration::from_nanos(MAX_WINDOW_NANOS);

    /// At most `limit` permits per `window`.
    ///
    /// Errors when `limit` is 0, when `window` is zero, or when `window` exceeds
    /// [`Rule::MAX_WINDOW`].
    ///
    /// # Errors
    ///
    /// [`RuleError::ZeroLimit`], [`RuleError::ZeroWindow`], or [`RuleError::WindowTooLong`] with the
    /// maximum.
    pub fn new(limit: u64, window: Duration) -> Result<Rule, RuleError> {
        if limit == 0 {
            return Err(RuleError::ZeroLimit);
        }
        if window.is_zero() {
            return Err(RuleError::ZeroWindow);
        }
        if window > Self::MAX_WINDOW {
            return Err(RuleError::WindowTooLong {
                window,
                max: Self::MAX_WINDOW,
            });
        }
        Ok(Rule {
            limit,
            window_nanos: duration_to_nanos(window),
        })
    }

    /// At most `limit` permits per second.
    ///
    /// # Errors
    ///
    /// [`RuleError::ZeroLimit`] when `limit` is 0.
    pub fn per_second(limit: u64) -> Result<Rule, RuleError> {
        Rule::new(limit, Duration::from_secs(1))
    }

    /// At most `limit` permits per minute.
    pub fn per_minute(limit: u64) -> Result<Rule, RuleError> {
        Rule::new(limit, Duration::from_secs(60))
    }

    /// At most `limit` permits per hour.
    ///
    /// # Errors
    ///
    /// [`RuleError::ZeroLimit`] when `limit` is 0.
    pub fn per_hour(limit: u64) -> Result<Rule, RuleError> {
        Rule::new(limit, Duration::from_secs(3600))
    }

    /// The most permits a window allows.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window's length.
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.window_nanos)
    }

    /// The window's length in nanoseconds (never 0).
    pub(crate) fn window_nanos(&self) -> u64 {
        self.window_nanos
    }

    /// A rule from its two numbers, if they make a valid one (no `Duration` conversion): the Redis
    /// deny cache rebuilds a decision's rule from its figures.
    #[inline]
    #[cfg(feature = "redis")]
    pub(crate) fn from_parts(limit: u64, window_nanos: u64) -> Option<Rule> {
        (limit > 0 && window_nanos > 0 && window_nanos <= MAX_WINDOW_NANOS).then_some(Rule {
            limit,
            window_nanos,
        })
    }
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Rule({} per {:?})", self.limit, self.window())
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} per {:?}", self.limit, self.window())
    }
}
