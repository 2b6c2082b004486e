//! [`Decision`]: the answer to one attempt, with what a response header needs.

use std::fmt;
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a decision says whether the request may proceed"]
pub struct Decision {
    outcome: Outcome,
    limit: u64,
    window_nanos: u64,
    remaining: u64,
    retry_after_nanos: u64,
    reset_after_nanos: u64,
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
    /// The method grants only one permit per attempt (the sliding window log: its ring claims
    /// one slot per compare-and-swap, and a multi-slot claim could not be all-or-nothing).
    BatchUnsupported {
        /// Permits asked for.
        requested: u64,
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
            Rejection::BatchUnsupported { requested } => write!(
                f,
                "{requested} permits requested at once, but the sliding window log grants \
                 1 per attempt: n must be 0 or 1"
            ),
        }
    }
}

impl std::error::Error for Rejection {}

impl Decision {
    #[inline]
    pub(crate) fn allowed(rule: Rule, remaining: u64, reset_after_nanos: u64) -> Decision {
        Decision {
            outcome: Outcome::Allowed,
            limit: rule.limit(),
            window_nanos: rule.window_nanos(),
            remaining,
            retry_after_nanos: 0,
            reset_after_nanos,
        }
    }

    #[inline]
    pub(crate) fn denied(
        rule: Rule,
        remaining: u64,
        retry_after_nanos: u64,
        reset_after_nanos: u64,
    ) -> Decision {
        Decision {
            outcome: Outcome::Denied,
            limit: rule.limit(),
            window_nanos: rule.window_nanos(),
            remaining,
            // A denial always asks for a wait: a zero would invite a tight retry loop.
            retry_after_nanos: retry_after_nanos.max(1),
            reset_after_nanos,
        }
    }

    #[inline]
    pub(crate) fn rejected(rule: Rule, rejection: Rejection) -> Decision {
        Decision {
            outcome: Outcome::Rejected(rejection),
            limit: rule.limit(),
            window_nanos: rule.window_nanos(),
            remaining: 0,
            retry_after_nanos: 0,
            reset_after_nanos: 0,
        }
    }

    #[inline]
    pub(crate) fn retired(rule: Rule) -> Decision {
        Decision {
            outcome: Outcome::Retired,
            limit: rule.limit(),
            window_nanos: rule.window_nanos(),
            remaining: 0,
            retry_after_nanos: 0,
            reset_after_nanos: 0,
        }
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
        self.limit
    }

    /// The window of the rule that decided.
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.window_nanos)
    }

    /// Permits left right after this decision (a snapshot: other threads may take them).
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// How long to wait before the same request could be granted: zero when allowed,
    /// [`Duration::MAX`] when rejected for good.
    pub fn retry_after(&self) -> Duration {
        if let Outcome::Rejected(_) = self.outcome {
            return Duration::MAX;
        }
        Duration::from_nanos(self.retry_after_nanos)
    }

    /// How long until the quota is whole again if nothing more is taken: for the fixed window,
    /// the end of the current window; for the token bucket, until the bucket is full; for the
    /// sliding log, until the newest admission leaves the window.
    pub fn reset_after(&self) -> Duration {
        Duration::from_nanos(self.reset_after_nanos)
    }
}
