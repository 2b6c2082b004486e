//! Errors: every message names the field at fault and the bound it broke.

use std::fmt;
use std::time::Duration;

use crate::{Algorithm, PlanError};

/// A rule that cannot be made, or that a method cannot honour.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RuleError {
    /// `limit` was 0.
    ZeroLimit,
    /// `window` was zero.
    ZeroWindow,
    /// `window` exceeded [`Rule::MAX_WINDOW`](crate::Rule::MAX_WINDOW).
    WindowTooLong {
        /// The window asked for.
        window: Duration,
        /// The longest window allowed.
        max: Duration,
    },
    /// `limit` exceeded what the method can hold.
    LimitTooLarge {
        /// The method.
        algorithm: Algorithm,
        /// The limit asked for.
        limit: u64,
        /// The largest limit the method accepts.
        max: u64,
    },
    /// The rule is finer than the method's time resolution allows: no tick scale that lasts
    /// [`RuleError::MIN_HORIZON`] represents its refill within 1/1000 (roughly, more than one
    /// permit per 35 ns of window, with a limit that shares few factors with the window).
    RateTooHigh {
        /// The method.
        algorithm: Algorithm,
        /// The limit asked for.
        limit: u64,
        /// The window asked for.
        window: Duration,
    },
    /// The method's packed state would wrap before [`RuleError::MIN_HORIZON`] of uptime.
    HorizonTooShort {
        /// The method.
        algorithm: Algorithm,
        /// The limit asked for.
        limit: u64,
        /// The window asked for.
        window: Duration,
        /// How long the state would last.
        horizon: Duration,
    },
}

impl RuleError {
    /// The shortest uptime a limiter must be able to run for, counted from its own start (a
    /// service's: from when it was built), wherever its clock's origin lies: ten years, so that
    /// no deployment meets a wrap.
    pub const MIN_HORIZON: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuleError::ZeroLimit => {
                write!(
                    f,
                    "limit 0 is invalid: a rule must allow at least 1 request"
                )
            }
            RuleError::ZeroWindow => {
                write!(
                    f,
                    "window 0s is invalid: a rule's window must be at least 1ns"
                )
            }
            RuleError::WindowTooLong { window, max } => {
                write!(f, "window {window:?} is too long: at most {max:?}")
            }
            RuleError::LimitTooLarge {
                algorithm,
                limit,
                max,
            } => {
                write!(
                    f,
                    "limit {limit} is too large for the {algorithm}: at most {max}"
                )?;
                if *algorithm == Algorithm::SlidingWindowLog {
                    write!(
                        f,
                        " (it stores one timestamp per permit; the token bucket or fixed window \
                         hold any limit in 8 bytes)"
                    )?;
                }
                Ok(())
            }
            RuleError::RateTooHigh {
                algorithm,
                limit,
                window,
            } => write!(
                f,
                "limit {limit} per window {window:?} is too fine for the {algorithm}: at every \
                 tick that lasts {:?}, rounding would slow the refill by more than 1/1000 \
                 (roughly, more than 1 permit per 35ns of window)",
                RuleError::MIN_HORIZON
            ),
            RuleError::HorizonTooShort {
                algorithm,
                limit,
                window,
                horizon,
            } => write!(
                f,
                "limit {limit} per window {window:?} would make the {algorithm}'s state wrap \
                 after {horizon:?}, under the {:?} required: lower the limit or lengthen the \
                 window",
                RuleError::MIN_HORIZON
            ),
        }
    }
}

impl std::error::Error for RuleError {}

/// An error from [`RateLimiterService`](crate::RateLimiterService).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServiceError {
    /// A request named a plan that has no rule.
    UnknownPlan {
        /// The plan, as its `Debug` form.
        plan: String,
    },
    /// A mistake in the plans or their limits: the same one for every backend and the settings.
    Plan(PlanError),
    /// A policy name for the response headers that cannot be written in them.
    InvalidPolicyName {
        /// Why.
        source: crate::InvalidPolicyName,
    },
    /// A plan's limits were changed more often than a client's state can tell its versions apart.
    TooManyRuleChanges {
        /// The plan, as its `Debug` form.
        plan: String,
        /// The most changes one plan may have.
        max: u64,
    },
    /// A decision looked its client up many times, each time losing the state it found or put:
    /// the key's `Hash` or `Eq` changes between calls (a hash of a mutable field), which the
    /// service cannot index, or (in a fixed table) other threads took every state this decision
    /// put before it could decide on it (a flood of new clients into a full table, or rule changes
    /// without pause). Answered instead of retrying for ever.
    UnstableKey {
        /// The plan, as its `Debug` form.
        plan: String,
        /// The lookups made.
        tries: u32,
    },
    /// A service was built to hold more clients than [`ServiceBuilder::MAX_CAPACITY`](crate::ServiceBuilder::MAX_CAPACITY)
    /// over all its plans.
    CapacityTooLarge {
        /// The capacity asked for.
        capacity: usize,
        /// The most allowed.
        max: usize,
    },
    /// [`ServiceBuilder::capacity`](crate::ServiceBuilder::capacity) was 0: a plan must hold
    /// at least one client.
    CapacityZero,
}

impl fmt::Display for ServiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServiceError::UnknownPlan { plan } => {
                write!(
                    f,
                    "plan {plan} has no rule: every plan needs one rule in the settings"
                )
            }
            ServiceError::Plan(error) => write!(f, "{error}"),
            ServiceError::InvalidPolicyName { source } => write!(f, "{source}"),
            ServiceError::TooManyRuleChanges { plan, max } => write!(
                f,
                "plan {plan} has had its limits changed {max} times, the most one plan may: \
                 build a new service to change them again (setting the limits a plan already \
                 has is not a change)"
            ),
            ServiceError::UnstableKey { plan, tries } => write!(
                f,
                "plan {plan}: the client's state was lost in each of {tries} lookups: either \
                 the key's `Hash` or `Eq` changes between calls (a key must hash and compare the \
                 same for as long as it is in use), or other threads took each state put for it \
                 before it was decided on (new clients flooding a full table, or rule changes \
                 without pause)"
            ),
            ServiceError::CapacityTooLarge { capacity, max } => {
                write!(
                    f,
                    "capacity {capacity} is too large: at most {max} clients per plan (2^28 over \
                     all plans, allocated up front)"
                )
            }
            ServiceError::CapacityZero => {
                write!(
                    f,
                    "capacity 0 is invalid: each plan must hold at least 1 client"
                )
            }
        }
    }
}

impl std::error::Error for ServiceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ServiceError::Plan(error) => Some(error),
            _ => None,
        }
    }
}

impl From<PlanError> for ServiceError {
    fn from(error: PlanError) -> Self {
        ServiceError::Plan(error)
    }
}
