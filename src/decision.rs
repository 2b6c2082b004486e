//! [`Decision`]: the answer to one attempt, with what a response header needs.

use std::fmt;
use std::num::NonZeroU64;
use std::time::Duration;

use crate::Rule;

/// The answer to one attempt to acquire permits.
///
/// Besides allowed or denied, it carries what a proxy reports to the client: the limit and
/// window of the rule that decided, the permits left, how long to wait before retrying, and how
/// long until the quota is whole again (the `Retry-After` header and the IETF `RateLimit` /
/// `RateLimit-Policy` fields; see [`Decision::retry_after_header`] and
/// [`Decision::ratelimit_header`]).
///
/// # Examples
///
/// ```
/// use tollgate::{FakeClock, Limiter, Rule, TokenBucket};
///
/// let bucket = TokenBucket::new(Rule::per_second(2)?, FakeClock::new())?;
/// let first = bucket.try_acquire_n(2);
/// assert!(first.is_allowed());
/// assert_eq!(first.remaining(), 0);
/// let second = bucket.try_acquire_n(1);
/// assert!(second.is_denied());
/// assert_eq!(second.retry_after().as_millis(), 500);
/// # Ok::<(), tollgate::RuleError>(())
/// ```
#[derive(Clone, Copy)]
#[must_use = "a decision says whether the request may proceed"]
pub struct Decision {
    outcome: Outcome,
    rule: Rule,
    // The figures below are kept in the deciding limiter's own units and divided only when asked
    // for: a caller that only checks `is_allowed` pays for no division (a division can panic on
    // a zero divisor, so the compiler could not drop an unused one; the divisors here are
    // `NonZeroU64`, and the divisions happen in the accessors).
    /// Permits left, times `scale.permit`.
    remaining: u64,
    /// In ticks of `scale.ticks_per_nano`.
    retry_after: u64,
    /// In ticks of `scale.ticks_per_nano`.
    reset_after: u64,
    scale: Scale,
}

/// The units a limiter reports in: how many ticks make a nanosecond, and how many units of
/// `remaining` make a permit. Both 1 for the window methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Scale {
    pub(crate) ticks_per_nano: NonZeroU64,
    pub(crate) permit: NonZeroU64,
}

impl Scale {
    /// Nanoseconds and whole permits.
    pub(crate) const UNIT: Scale = Scale {
        ticks_per_nano: NonZeroU64::MIN,
        permit: NonZeroU64::MIN,
    };
}

impl PartialEq for Decision {
    /// Decisions are equal when they report the same: the same outcome, rule and figures, in
    /// whatever units each limiter keeps them.
    fn eq(&self, other: &Self) -> bool {
        self.outcome == other.outcome
            && self.rule == other.rule
            && self.remaining() == other.remaining()
            && self.retry_after() == other.retry_after()
            && self.reset_after() == other.reset_after()
    }
}

impl Eq for Decision {}

impl fmt::Debug for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decision")
            .field("outcome", &self.outcome)
            .field("rule", &self.rule)
            .field("remaining", &self.remaining())
            .field("retry_after", &self.retry_after())
            .field("reset_after", &self.reset_after())
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Allowed,
    Denied,
    Rejected(Rejection),
    /// The limiter was retired for eviction; the service retries on a fresh one. Public limiters
    /// are never retired, so users never see this outcome.
    Retired,
}

/// The answer to one permit, for callers that ask only whether it was granted: no figures, so
/// nothing to compute or build beyond the decision itself.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// The permit was taken.
    Granted,
    /// It was not (and nothing was taken).
    Denied,
    /// The state was retired for eviction (see [`Outcome::Retired`]).
    Retired,
}

/// Why a request can never be granted as asked, whatever the wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// More permits were asked for at once than the rule's limit.
    ExceedsLimit {
        /// Permits asked for.
        requested: u64,
        /// The rule's limit.
        limit: u64,
    },
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::ExceedsLimit { requested, limit } => write!(
                f,
                "{requested} permits requested at once, but the limit is {limit}: \
                 n must be at most the limit"
            ),
        }
    }
}

impl std::error::Error for Rejection {}

impl Decision {
    /// Allowed, with figures in nanoseconds and whole permits.
    #[inline]
    pub(crate) fn allowed(rule: Rule, remaining: u64, reset_after_nanos: u64) -> Decision {
        Decision::allowed_in(rule, Scale::UNIT, remaining, reset_after_nanos)
    }

    /// Allowed, with figures in `scale`'s units.
    #[inline]
    pub(crate) fn allowed_in(
        rule: Rule,
        scale: Scale,
        remaining: u64,
        reset_after: u64,
    ) -> Decision {
        Decision {
            outcome: Outcome::Allowed,
            rule,
            remaining,
            retry_after: 0,
            reset_after,
            scale,
        }
    }

    /// Denied, with figures in nanoseconds and whole permits.
    #[inline]
    pub(crate) fn denied(
        rule: Rule,
        remaining: u64,
        retry_after_nanos: u64,
        reset_after_nanos: u64,
    ) -> Decision {
        Decision::denied_in(
            rule,
            Scale::UNIT,
            remaining,
            retry_after_nanos,
            reset_after_nanos,
        )
    }

    /// Denied, with figures in `scale`'s units.
    #[inline]
    pub(crate) fn denied_in(
        rule: Rule,
        scale: Scale,
        remaining: u64,
        retry_after: u64,
        reset_after: u64,
    ) -> Decision {
        Decision {
            outcome: Outcome::Denied,
            rule,
            remaining,
            // A denial always asks for a wait: a zero would invite a tight retry loop.
            retry_after: retry_after.max(1),
            reset_after,
            scale,
        }
    }

    /// Rejected for good with `rejection`, by a backend that cannot tell the quota without
    /// asking for it (the Redis service answers a request that can never pass without a round
    /// trip): `remaining` and `reset_after` read 0.
    #[cfg(feature = "redis")]
    #[inline]
    pub(crate) fn rejected(rule: Rule, rejection: Rejection) -> Decision {
        Decision {
            outcome: Outcome::Rejected(rejection),
            rule,
            remaining: 0,
            retry_after: 0,
            reset_after: 0,
            scale: Scale::UNIT,
        }
    }

    /// The same figures (what the limiter holds), rejected for good with `rejection`: a request
    /// that can never be granted still reports the real quota.
    #[inline]
    pub(crate) fn into_rejected(self, rejection: Rejection) -> Decision {
        Decision {
            outcome: Outcome::Rejected(rejection),
            retry_after: 0,
            ..self
        }
    }

    #[inline]
    pub(crate) fn retired(rule: Rule) -> Decision {
        Decision {
            outcome: Outcome::Retired,
            rule,
            remaining: 0,
            retry_after: 0,
            reset_after: 0,
            scale: Scale::UNIT,
        }
    }

    /// `reset_after` in the deciding limiter's own units (nanoseconds for the window methods).
    #[inline]
    pub(crate) fn reset_after_units(&self) -> u64 {
        self.reset_after
    }

    /// Whether the limiter that decided was retired (see [`Outcome::Retired`]).
    #[inline]
    pub(crate) fn is_retired(&self) -> bool {
        matches!(self.outcome, Outcome::Retired)
    }

    /// Whether the permits were granted.
    #[inline]
    pub fn is_allowed(&self) -> bool {
        matches!(self.outcome, Outcome::Allowed)
    }

    /// Whether the permits were refused (for now, or for good: see [`Decision::rejection`]).
    #[inline]
    pub fn is_denied(&self) -> bool {
        !self.is_allowed()
    }

    /// Why the request can never be granted as asked, if that is the case.
    pub fn rejection(&self) -> Option<Rejection> {
        match self.outcome {
            Outcome::Rejected(rejection) => Some(rejection),
            _ => None,
        }
    }

    /// The limit of the rule that decided.
    pub fn limit(&self) -> u64 {
        self.rule.limit()
    }

    /// The window of the rule that decided.
    pub fn window(&self) -> Duration {
        self.rule.window()
    }

    /// Permits left right after this decision (a snapshot: other threads may take them).
    pub fn remaining(&self) -> u64 {
        self.remaining / self.scale.permit
    }

    /// Ticks to nanoseconds, rounded up (a client told to wait must not come back early).
    fn nanos(&self, ticks: u64) -> Duration {
        Duration::from_nanos(ticks.div_ceil(self.scale.ticks_per_nano.get()))
    }

    /// How long to wait before the same request could be granted: zero when allowed,
    /// [`Duration::MAX`] when rejected for good.
    pub fn retry_after(&self) -> Duration {
        if let Outcome::Rejected(_) = self.outcome {
            return Duration::MAX;
        }
        self.nanos(self.retry_after)
    }

    /// How long until the quota is whole again if nothing more is taken: for the fixed window,
    /// the end of the current window; for the token bucket, until the bucket is full; for the
    /// sliding log, until the newest admission leaves the window.
    pub fn reset_after(&self) -> Duration {
        self.nanos(self.reset_after)
    }
}
