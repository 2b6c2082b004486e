//! [`Plans`]: the validated list of plans every backend and the settings are made from, and
//! [`PlanError`], the one error for a mistake in it.
//!
//! A `Plans<P>` holds, for one method, the plans in the order they were given, each with its
//! limits. Once made it guarantees:
//!
//! - at least one plan, and at most [`MAX_PLANS`];
//! - no plan twice (by `P`'s `Eq`);
//! - each plan has 1 to [`SeveralLimits::MAX_LIMITS`] limits (4: the in-process state of a plan
//!   holds that many, and the response headers report that many; the Redis service keeps the
//!   same cap so that a plan moves between the backends unchanged), none of them twice (a
//!   repeated limit adds nothing in process, and would share the first one's key in Redis);
//! - every limit is a rule the method honours in process (the [`RuleError`] its limiter would
//!   give otherwise; the in-process limiter is also the Redis service's local fallback);
//! - under a backend that takes a plan's limits one after another ([`Together::GivingBack`]),
//!   several limits only under a method that can give back a permit it granted.
//!
//! The in-process service, the Redis service and the settings all check their plans here, so
//! that the same mistake is the same [`PlanError`] whichever of them is given it; each wraps it
//! in its own error (`ServiceError::Plan`, `RedisError::Plan`, `SettingsError::Plan`). What only
//! one backend needs (Redis's key names, its whole microseconds and the integers its scripts
//! keep exact) that backend checks on its own, with its own error.

use std::fmt;

use crate::method::any::AnyParams;
use crate::method::several_limits::SeveralLimits;
use crate::{Algorithm, Rule, RuleError};

/// The most plans a service may have.
pub(crate) const MAX_PLANS: usize = 1 << 16;

/// How a backend enforces a plan's several limits together, which decides the methods that may
/// have several.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Together {
    /// One limit after another, giving back what the earlier ones granted when a later one
    /// refuses (the in-process service): only methods that can undo a grant, which the sliding
    /// window log cannot.
    GivingBack,
    /// All in one atomic step (a Redis script), or not yet known (settings, read before a
    /// backend is chosen): every method.
    #[cfg(any(feature = "serde", feature = "redis"))]
    Atomically,
}

/// Plans checked for one method: see the [module docs](self) for what each guarantees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plans<P> {
    algorithm: Algorithm,
    plans: Vec<(P, Vec<Rule>)>,
}

impl<P: Eq + fmt::Debug> Plans<P> {
    /// `plans` under `algorithm`, enforced by a backend that takes several limits `together`.
    ///
    /// # Errors
    ///
    /// The first mistake, in the order the module docs list the guarantees, plan by plan.
    pub(crate) fn new(
        algorithm: Algorithm,
        together: Together,
        plans: impl IntoIterator<Item = (P, Vec<Rule>)>,
    ) -> Result<Self, PlanError> {
        let plans: Vec<(P, Vec<Rule>)> = plans.into_iter().collect();
        if plans.is_empty() {
            return Err(PlanError::NoPlans);
        }
        // Before the duplicates, whose search is quadratic.
        if plans.len() > MAX_PLANS {
            return Err(PlanError::TooManyPlans {
                count: plans.len(),
                max: MAX_PLANS,
            });
        }
        for (position, (plan, rules)) in plans.iter().enumerate() {
            if plans[..position].iter().any(|(earlier, _)| earlier == plan) {
                return Err(PlanError::DuplicatePlan {
                    plan: format!("{plan:?}"),
                });
            }
            limits_of(plan, rules, together, |rule| {
                AnyParams::new(algorithm, rule, 0)
            })?;
        }
        Ok(Plans { algorithm, plans })
    }
}

impl<P> Plans<P> {
    /// The method the plans were checked for.
    #[cfg(feature = "serde")]
    pub(crate) fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Each plan with its limits, in the order given.
    #[cfg(feature = "serde")]
    pub(crate) fn as_slice(&self) -> &[(P, Vec<Rule>)] {
        &self.plans
    }

    /// Each plan with its limits, in the order given.
    pub(crate) fn into_vec(self) -> Vec<(P, Vec<Rule>)> {
        self.plans
    }
}

/// The constants of `plan`'s limits `rules`, made by `params`, enforced by a backend that takes
/// them `together`; or the plan's mistake. The one check of a plan's limits: [`Plans::new`]
/// makes it for every plan, and a service that changes a plan's limits makes it for the new
/// ones.
pub(crate) fn limits_of<P: fmt::Debug>(
    plan: &P,
    rules: &[Rule],
    together: Together,
    params: impl Fn(Rule) -> Result<AnyParams, RuleError>,
) -> Result<Vec<AnyParams>, PlanError> {
    let plan_name = || format!("{plan:?}");
    if rules.is_empty() || rules.len() > SeveralLimits::MAX_LIMITS {
        return Err(PlanError::LimitCount {
            plan: plan_name(),
            count: rules.len(),
            max: SeveralLimits::MAX_LIMITS,
        });
    }
    let mut limits = Vec::with_capacity(rules.len());
    for (position, &rule) in rules.iter().enumerate() {
        if rules[..position].contains(&rule) {
            return Err(PlanError::DuplicateLimit {
                plan: plan_name(),
                position,
                rule,
            });
        }
        let limit = params(rule)
            .map_err(|source| PlanError::invalid_rule(plan, rules.len(), position, source))?;
        limits.push(limit);
    }
    if together == Together::GivingBack
        && limits.len() > 1
        && let Some(first) = limits.iter().find(|limit| !limit.can_undo())
    {
        return Err(PlanError::SeveralLimitsUnsupported {
            plan: plan_name(),
            algorithm: first.algorithm(),
        });
    }
    Ok(limits)
}

/// A mistake in a list of plans and their limits, whichever backend or the settings were given
/// it. Each message names the plan (as its `Debug` form), the limit's position in the plan's
/// list when it has several, and the bound.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlanError {
    /// No plan was given.
    NoPlans,
    /// More plans were given than a service can tell apart.
    TooManyPlans {
        /// Plans given.
        count: usize,
        /// The most allowed.
        max: usize,
    },
    /// The same plan was given twice.
    DuplicatePlan {
        /// The plan, as its `Debug` form.
        plan: String,
    },
    /// A plan was given no limits, or more than a plan may have
    /// ([`RateLimiterService::MAX_LIMITS`](crate::RateLimiterService::MAX_LIMITS), for every
    /// backend).
    LimitCount {
        /// The plan, as its `Debug` form.
        plan: String,
        /// Limits given.
        count: usize,
        /// The most allowed.
        max: usize,
    },
    /// A plan was given the same limit twice.
    DuplicateLimit {
        /// The plan, as its `Debug` form.
        plan: String,
        /// The second one's position in the plan's list, from 0.
        position: usize,
        /// The limit.
        rule: Rule,
    },
    /// A plan's limit is a rule the method cannot honour.
    InvalidRule {
        /// The plan, as its `Debug` form.
        plan: String,
        /// The limit's position in the plan's list, from 0, when the plan has several.
        position: Option<usize>,
        /// Why.
        source: RuleError,
    },
    /// A plan was given several limits under a method that the backend cannot enforce them
    /// together with (the in-process sliding window log cannot give back a claimed slot).
    SeveralLimitsUnsupported {
        /// The plan, as its `Debug` form.
        plan: String,
        /// The method.
        algorithm: Algorithm,
    },
}

impl PlanError {
    /// [`PlanError::InvalidRule`] for the limit at `position` of `plan`'s `count` limits.
    pub(crate) fn invalid_rule(
        plan: &impl fmt::Debug,
        count: usize,
        position: usize,
        source: RuleError,
    ) -> PlanError {
        PlanError::InvalidRule {
            plan: format!("{plan:?}"),
            position: (count > 1).then_some(position),
            source,
        }
    }
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::NoPlans => write!(
                f,
                "no plans given: give at least one plan with a limit and a window"
            ),
            PlanError::TooManyPlans { count, max } => {
                write!(f, "{count} plans given: give at most {max}")
            }
            PlanError::DuplicatePlan { plan } => {
                write!(f, "plan {plan} is given twice: give each plan once")
            }
            PlanError::LimitCount { plan, count, max } => write!(
                f,
                "plan {plan} has {count} limits: a plan has at least 1 and at most {max}"
            ),
            PlanError::DuplicateLimit {
                plan,
                position,
                rule,
            } => write!(
                f,
                "plan {plan}: limits[{position}]: {rule} is given twice: give each limit once"
            ),
            PlanError::InvalidRule {
                plan,
                position,
                source,
            } => {
                write!(f, "plan {plan}: ")?;
                if let Some(position) = position {
                    write!(f, "limits[{position}]: ")?;
                }
                write!(f, "{source}")
            }
            PlanError::SeveralLimitsUnsupported { plan, algorithm } => write!(
                f,
                "plan {plan} has several limits, which the {algorithm} cannot enforce together \
                 (a granted permit cannot be given back): use one limit, or the token bucket, \
                 the fixed window or the sliding window counter"
            ),
        }
    }
}

impl std::error::Error for PlanError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PlanError::InvalidRule { source, .. } => Some(source),
            _ => None,
        }
    }
}
