//! [`Decision`]: the answer to one attempt, with what a response header needs.

use std::fmt;
use std::num::{NonZeroU32, NonZeroU64};
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
/// # Size
///
/// 64 bytes, one cache line, returned by value: the rule (16 bytes), the three figures (24),
/// the deciding limiter's units (12: the token bucket keeps its figures in ticks and token
/// parts, and they are divided only when read), a rejection's limit (8; its request shares the
/// word of the wait a rejection has no use for) and the outcome (1).
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
    rule: Rule,
    // The figures below are kept in the deciding limiter's own units and divided only when asked
    // for: a caller that only checks `is_allowed` pays for no division (a division can panic on
    // a zero divisor, so the compiler could not drop an unused one; the divisors here are
    // non-zero, and the divisions happen in the accessors).
    /// Permits left, times `permit`.
    remaining: u64,
    /// In ticks of `ticks_per_nano`. A rejected decision waits for ever and keeps here the
    /// permits it was asked for instead (see [`Decision::rejection`]).
    retry_after: u64,
    /// In ticks of `ticks_per_nano`.
    reset_after: u64,
    /// How many units of `remaining` make a permit (see [`Scale`]).
    permit: NonZeroU64,
    /// The limit a rejected request exceeded: the deciding rule's, except where a backend
    /// reports one limit's rejection with another limit's quota (a plan of several limits).
    rejected_limit: u64,
    /// How many ticks make a nanosecond (see [`Scale`]).
    ticks_per_nano: NonZeroU32,
    outcome: Outcome,
}

// Every field above is one a caller can read back (the rule, the three figures, a rejection's
// two numbers) or the units they are kept in; a rejection's request shares the word of the wait
// it has no use for. 61 bytes of fields, so 64 with alignment: one cache line, where the
// straightforward layout (an outcome enum carrying the `Rejection`, a 16-byte `Scale`) took 80.
const _: () = assert!(size_of::<Decision>() <= 64);

/// The units a limiter reports in: how many ticks make a nanosecond, and how many units of
/// `remaining` make a permit. Both 1 for the window methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Scale {
    /// At most 29 (the token bucket's finest tick, see `GcraParams`), so 32 bits are plenty.
    pub(crate) ticks_per_nano: NonZeroU32,
    pub(crate) permit: NonZeroU64,
}

impl Scale {
    /// Nanoseconds and whole permits.
    pub(crate) const UNIT: Scale = Scale {
        ticks_per_nano: NonZeroU32::MIN,
        permit: NonZeroU64::MIN,
    };
}

impl PartialEq for Decision {
    /// Decisions are equal when they report the same: the same outcome, rejection, rule and
    /// figures, in whatever units each limiter keeps them.
    fn eq(&self, other: &Self) -> bool {
        self.outcome == other.outcome
            && self.rejection() == other.rejection()
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
            .field("rejection", &self.rejection())
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
    /// Denied for good: see [`Decision::rejection`].
    Rejected,
}

/// What a decision on a client's state answers when the state has been retired: by the
/// service's sweep (an idle state) or by a rule change. The caller (the service) moves to a
/// fresh state and decides there; the retired state granted nothing. Public limiters are never
/// retired, and no [`Decision`] ever says it was: this is the one encoding of it, as the error
/// of a `Result`.
#[doc(hidden)]
#[cfg_attr(not(feature = "loom"), allow(unreachable_pub))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retired;

/// The answer to one permit, for callers that ask only whether it was granted: no figures, so
/// nothing to compute or build beyond the decision itself.
#[doc(hidden)]
#[cfg_attr(not(feature = "loom"), allow(unreachable_pub))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// The permit was taken.
    Granted,
    /// It was not (and nothing was taken).
    Denied,
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
        Decision::with(Outcome::Allowed, rule, scale, [remaining, 0, reset_after])
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
        // A denial always asks for a wait: a zero would invite a tight retry loop.
        let figures = [remaining, retry_after.max(1), reset_after];
        Decision::with(Outcome::Denied, rule, scale, figures)
    }

    /// `outcome`, with `[remaining, retry_after, reset_after]` in `scale`'s units.
    #[inline]
    fn with(outcome: Outcome, rule: Rule, scale: Scale, figures: [u64; 3]) -> Decision {
        let [remaining, retry_after, reset_after] = figures;
        Decision {
            rule,
            remaining,
            retry_after,
            reset_after,
            permit: scale.permit,
            rejected_limit: 0,
            ticks_per_nano: scale.ticks_per_nano,
            outcome,
        }
    }

    /// Rejected for good with `rejection`, by a backend that cannot tell the quota without
    /// asking for it (the Redis service answers a request that can never pass without a round
    /// trip): `remaining` and `reset_after` read 0.
    #[cfg(feature = "redis")]
    #[inline]
    pub(crate) fn rejected(rule: Rule, rejection: Rejection) -> Decision {
        Decision::allowed(rule, 0, 0).into_rejected(rejection)
    }

    /// The same figures (what the limiter holds), rejected for good with `rejection`: a request
    /// that can never be granted still reports the real quota.
    #[inline]
    pub(crate) fn into_rejected(self, rejection: Rejection) -> Decision {
        let Rejection::ExceedsLimit { requested, limit } = rejection;
        Decision {
            outcome: Outcome::Rejected,
            // A rejection waits for ever (see `retry_after`), so its word holds the request.
            retry_after: requested,
            rejected_limit: limit,
            ..self
        }
    }

    /// `reset_after` in the deciding limiter's own units (nanoseconds for the window methods).
    #[inline]
    pub(crate) fn reset_after_units(&self) -> u64 {
        self.reset_after
    }

    /// Whether the permits were granted.
    #[inline]
    pub fn is_allowed(&self) -> bool {
        self.outcome == Outcome::Allowed
    }

    /// Whether the permits were refused (for now, or for good: see [`Decision::rejection`]).
    #[inline]
    pub fn is_denied(&self) -> bool {
        !self.is_allowed()
    }

    /// Why the request can never be granted as asked, if that is the case.
    pub fn rejection(&self) -> Option<Rejection> {
        (self.outcome == Outcome::Rejected).then_some(Rejection::ExceedsLimit {
            requested: self.retry_after,
            limit: self.rejected_limit,
        })
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
        self.remaining / self.permit
    }

    /// Ticks to nanoseconds, rounded up (a client told to wait must not come back early).
    fn nanos(&self, ticks: u64) -> Duration {
        Duration::from_nanos(ticks.div_ceil(u64::from(self.ticks_per_nano.get())))
    }

    /// How long to wait before the same request could be granted: zero when allowed,
    /// [`Duration::MAX`] when rejected for good.
    pub fn retry_after(&self) -> Duration {
        if self.outcome == Outcome::Rejected {
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
