//! [`SettingsError`]: a mistake in settings, naming the plan, the limit's position and the field.

use std::fmt;
use std::time::Duration;

use super::window::format_window;
use crate::{PlanError, RuleError, ServiceError};

/// A mistake in settings, or settings that cannot make the service asked for.
///
/// Every message names where the mistake is: the plan, the position in its `limits` list when
/// it has one, and the field, with what was found and what was expected:
/// `plan "free": limits[1]: field "window" is "1 fortnight": expected ...`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SettingsError {
    /// The file could not be read.
    Io {
        /// The file.
        path: String,
        /// What the OS said.
        message: String,
    },
    /// The text is not valid TOML or JSON.
    Syntax {
        /// `"TOML"` or `"JSON"`.
        format: &'static str,
        /// What the parser said, with the line and column.
        message: String,
    },
    /// A field is missing.
    MissingField {
        /// The plan it belongs to; `None` for a top-level field.
        plan: Option<String>,
        /// The position in the plan's `limits` list, when the field belongs to one of them.
        index: Option<usize>,
        /// The field.
        field: &'static str,
    },
    /// A field has a value that cannot be used.
    InvalidField {
        /// The plan it belongs to; `None` for a top-level field.
        plan: Option<String>,
        /// The position in the plan's `limits` list, when the field belongs to one of them.
        index: Option<usize>,
        /// The field.
        field: &'static str,
        /// The value found, as written.
        found: String,
        /// What was expected instead.
        expected: String,
    },
    /// A value that should be a table (the settings, a plan, one of a plan's `limits`) is not.
    NotATable {
        /// The plan, when the value is a plan or one of its limits.
        plan: Option<String>,
        /// The position in the plan's `limits` list, when the value is one of them.
        index: Option<usize>,
        /// The value found, as written.
        found: String,
        /// The table expected.
        expected: &'static str,
    },
    /// A window longer than [`Rule::MAX_WINDOW`](crate::Rule::MAX_WINDOW).
    WindowTooLong {
        /// The plan it belongs to.
        plan: Option<String>,
        /// The position in the plan's `limits` list, when the window belongs to one of them.
        index: Option<usize>,
        /// The window, as written.
        found: String,
        /// The longest window allowed.
        max: Duration,
    },
    /// A field this format does not have (often a misspelling).
    UnknownField {
        /// The plan it belongs to; `None` for a top-level field.
        plan: Option<String>,
        /// The position in the plan's `limits` list, when the field is in one of them.
        index: Option<usize>,
        /// The field.
        field: String,
        /// The fields allowed there.
        expected: &'static str,
    },
    /// A field given twice in the same table (JSON allows it; the settings do not, as TOML).
    DuplicateField {
        /// The plan it belongs to; `None` for a top-level field.
        plan: Option<String>,
        /// The position in the plan's `limits` list, when the field is in one of them.
        index: Option<usize>,
        /// The field.
        field: String,
    },
    /// A plan with both a single limit (`limit` and `window`) and a `limits` list.
    BothForms {
        /// The plan.
        plan: String,
    },
    /// A rule that cannot be made (a window of `"0s"`); a rule the method cannot honour is a
    /// [`SettingsError::Plan`].
    InvalidRule {
        /// The plan; `None` for a rule read on its own.
        plan: Option<String>,
        /// The position in the plan's `limits` list, when the rule is one of them.
        index: Option<usize>,
        /// Why; the message names the field (`limit` or `window`) and the bound.
        source: RuleError,
    },
    /// A plan the program needs is not in the settings.
    MissingPlan {
        /// The plan.
        plan: String,
    },
    /// The settings have a plan the program does not know.
    UnexpectedPlan {
        /// The plan.
        plan: String,
    },
    /// The program named the same plan twice when building a service.
    PlanListedTwice {
        /// The plan.
        plan: String,
    },
    /// A plan has several limits where one was asked for ([`Settings::rule`](crate::Settings::rule)).
    SeveralLimits {
        /// The plan.
        plan: String,
        /// How many limits it has.
        count: usize,
    },
    /// A mistake in the plans or their limits (none, one twice, a limit the method cannot
    /// honour), found when the settings are read or when a service is built from them: the same
    /// [`PlanError`] every backend gives for it.
    Plan(PlanError),
    /// The service refused the settings for another reason than their plans.
    Service {
        /// What the service said.
        source: ServiceError,
    },
}

/// Writes where a mistake is: `plan "free": limits[1]: `, or nothing at the top level.
fn place(f: &mut fmt::Formatter<'_>, plan: &Option<String>, index: &Option<usize>) -> fmt::Result {
    if let Some(plan) = plan {
        write!(f, "plan {plan:?}: ")?;
    }
    if let Some(index) = index {
        write!(f, "limits[{index}]: ")?;
    }
    Ok(())
}

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SettingsError::Io { path, message } => {
                write!(f, "settings file {path:?} could not be read: {message}")
            }
            SettingsError::Syntax { format, message } => {
                write!(f, "settings are not valid {format}: {message}")
            }
            SettingsError::MissingField { plan, index, field } => {
                place(f, plan, index)?;
                write!(f, "field {field:?} is missing")
            }
            SettingsError::InvalidField {
                plan,
                index,
                field,
                found,
                expected,
            } => {
                place(f, plan, index)?;
                write!(f, "field {field:?} is {found}: expected {expected}")
            }
            SettingsError::NotATable {
                plan,
                index,
                found,
                expected,
            } => {
                place(f, plan, index)?;
                write!(f, "found {found}: expected {expected}")
            }
            SettingsError::WindowTooLong {
                plan,
                index,
                found,
                max,
            } => {
                place(f, plan, index)?;
                write!(
                    f,
                    "field \"window\" is {found}: too long, a window is at most {} ({max:?})",
                    format_window(*max)
                )
            }
            SettingsError::UnknownField {
                plan,
                index,
                field,
                expected,
            } => {
                place(f, plan, index)?;
                write!(f, "field {field:?} is unknown: expected one of {expected}")
            }
            SettingsError::DuplicateField { plan, index, field } => {
                place(f, plan, index)?;
                write!(f, "field {field:?} is given twice: give each field once")
            }
            SettingsError::BothForms { plan } => write!(
                f,
                "plan {plan:?} has both \"limit\"/\"window\" and \"limits\": give either one \
                 limit and window, or a list of limits"
            ),
            SettingsError::InvalidRule {
                plan,
                index,
                source,
            } => {
                place(f, plan, index)?;
                write!(f, "{source}")
            }
            SettingsError::MissingPlan { plan } => {
                write!(f, "plan {plan:?} is not in the settings")
            }
            SettingsError::UnexpectedPlan { plan } => {
                write!(f, "plan {plan:?} is not one this program knows")
            }
            SettingsError::PlanListedTwice { plan } => {
                write!(f, "plan {plan:?} is listed twice in the program's plans")
            }
            SettingsError::SeveralLimits { plan, count } => write!(
                f,
                "plan {plan:?} has {count} limits, not one: read them with `Settings::plans`"
            ),
            SettingsError::Plan(error) => write!(f, "{error}"),
            SettingsError::Service { source } => write!(f, "{source}"),
        }
    }
}

impl std::error::Error for SettingsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SettingsError::InvalidRule { source, .. } => Some(source),
            SettingsError::Plan(error) => Some(error),
            SettingsError::Service { source } => Some(source),
            _ => None,
        }
    }
}

impl From<PlanError> for SettingsError {
    fn from(error: PlanError) -> Self {
        SettingsError::Plan(error)
    }
}

/// A plan mistake as [`SettingsError::Plan`], whichever backend found it.
impl From<ServiceError> for SettingsError {
    fn from(error: ServiceError) -> Self {
        match error {
            ServiceError::Plan(error) => SettingsError::Plan(error),
            source => SettingsError::Service { source },
        }
    }
}
