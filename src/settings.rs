//! [`Settings`]: a service described in a settings file (TOML or JSON), behind the `serde`
//! feature.
//!
//! ```toml
//! # The method: token_bucket, fixed_window or sliding_window_log.
//! algorithm = "token_bucket"
//!
//! # One rule per plan: at most `limit` requests per `window`.
//! [plans.free]
//! limit = 5
//! window = "1s"
//!
//! [plans.pro]
//! limit = 50
//! window = "1s"
//! ```
//!
//! Windows are a whole number and a unit: `ns`, `us` (or `µs`), `ms`, `s`, `m` (or `min`), `h`,
//! `d`; for example `"500ms"`, `"1s"`, `"1h"`. Every mistake is an error that names the plan and
//! the field.

use std::fmt;
use std::hash::Hash;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::clock::Clock;
use crate::{Algorithm, LimiterFactory, RateLimiterService, Rule, RuleError, ServiceError};

/// A mistake in a settings file.
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
        /// The field.
        field: &'static str,
    },
    /// A field has a value that cannot be used.
    InvalidField {
        /// The plan it belongs to; `None` for a top-level field.
        plan: Option<String>,
        /// The field.
        field: String,
        /// The value found, as written.
        found: String,
        /// What was expected instead.
        expected: &'static str,
    },
    /// A field this format does not have (often a misspelling).
    UnknownField {
        /// The plan it belongs to; `None` for a top-level field.
        plan: Option<String>,
        /// The field.
        field: String,
    },
    /// The `plans` table is empty.
    NoPlans,
    /// A plan's rule cannot be honoured by the chosen method.
    InvalidRule {
        /// The plan.
        plan: String,
        /// Why; the message names the field (`limit` or `window`) and the bound.
        source: RuleError,
    },
    /// A plan the program needs is not in the file.
    MissingPlan {
        /// The plan.
        plan: String,
    },
    /// The file has a plan the program does not know.
    UnexpectedPlan {
        /// The plan.
        plan: String,
    },
}

fn plan_prefix(f: &mut fmt::Formatter<'_>, plan: &Option<String>) -> fmt::Result {
    match plan {
        Some(plan) => write!(f, "plan {plan:?}: "),
        None => Ok(()),
    }
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
            SettingsError::MissingField { plan, field } => {
                plan_prefix(f, plan)?;
                write!(f, "field {field:?} is missing")
            }
            SettingsError::InvalidField {
                plan,
                field,
                found,
                expected,
            } => {
                plan_prefix(f, plan)?;
                write!(f, "field {field:?} is {found}: expected {expected}")
            }
            SettingsError::UnknownField { plan, field } => {
                plan_prefix(f, plan)?;
                let known = if plan.is_some() {
                    "limit, window"
                } else {
                    "algorithm, plans"
                };
                write!(f, "field {field:?} is unknown: expected one of {known}")
            }
            SettingsError::NoPlans => write!(
                f,
                "field \"plans\" is empty: give at least one plan with a limit and a window"
            ),
            SettingsError::InvalidRule { plan, source } => write!(f, "plan {plan:?}: {source}"),
            SettingsError::MissingPlan { plan } => {
                write!(f, "plan {plan:?} is missing: every plan needs one rule")
            }
            SettingsError::UnexpectedPlan { plan } => {
                write!(f, "plan {plan:?} is not one this program knows")
            }
        }
    }
}

impl std::error::Error for SettingsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SettingsError::InvalidRule { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The method and the rule of each plan, read from a settings file and checked: every rule is
/// valid and honoured by the method.
///
/// # Examples
///
/// ```
/// use tollgate::{Algorithm, FakeClock, Settings};
///
/// let settings = Settings::from_toml_str(r#"
///     algorithm = "fixed_window"
///     [plans.free]
///     limit = 100
///     window = "1m"
/// "#)?;
/// assert_eq!(settings.algorithm(), Algorithm::FixedWindow);
/// let service = settings.build_service::<String, _>(FakeClock::new())?;
/// assert!(service.allow("alice", &"free".to_owned())?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    algorithm: Algorithm,
    plans: Vec<(String, Rule)>,
}

impl Settings {
    /// Reads settings from TOML text.
    pub fn from_toml_str(text: &str) -> Result<Settings, SettingsError> {
        let value: Value = toml::from_str(text).map_err(|error| SettingsError::Syntax {
            format: "TOML",
            message: error.to_string().trim_end().to_owned(),
        })?;
        Settings::from_value(&value)
    }

    /// Reads settings from JSON text.
    pub fn from_json_str(text: &str) -> Result<Settings, SettingsError> {
        let value: Value = serde_json::from_str(text).map_err(|error| SettingsError::Syntax {
            format: "JSON",
            message: error.to_string(),
        })?;
        Settings::from_value(&value)
    }

    /// Reads a settings file: JSON if its name ends in `.json`, TOML otherwise.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Settings, SettingsError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|error| SettingsError::Io {
            path: path.display().to_string(),
            message: error.to_string(),
        })?;
        if path
            .extension()
            .is_some_and(|extension| extension == "json")
        {
            Settings::from_json_str(&text)
        } else {
            Settings::from_toml_str(&text)
        }
    }

    fn from_value(value: &Value) -> Result<Settings, SettingsError> {
        let top = value
            .as_object()
            .ok_or_else(|| SettingsError::InvalidField {
                plan: None,
                field: "(top level)".into(),
                found: describe(value),
                expected: "a table with `algorithm` and `plans`",
            })?;
        if let Some(field) = top
            .keys()
            .find(|key| !["algorithm", "plans"].contains(&key.as_str()))
        {
            return Err(SettingsError::UnknownField {
                plan: None,
                field: field.clone(),
            });
        }
        let algorithm = match top.get("algorithm") {
            None => {
                return Err(SettingsError::MissingField {
                    plan: None,
                    field: "algorithm",
                });
            }
            Some(Value::String(name)) => name.parse::<Algorithm>().ok(),
            Some(_) => None,
        }
        .ok_or_else(|| SettingsError::InvalidField {
            plan: None,
            field: "algorithm".into(),
            found: describe(&top["algorithm"]),
            expected: "one of \"token_bucket\", \"fixed_window\", \"sliding_window_log\"",
        })?;
        let plans = match top.get("plans") {
            None => {
                return Err(SettingsError::MissingField {
                    plan: None,
                    field: "plans",
                });
            }
            Some(Value::Object(plans)) => plans,
            Some(other) => {
                return Err(SettingsError::InvalidField {
                    plan: None,
                    field: "plans".into(),
                    found: describe(other),
                    expected: "a table of plans, each with a limit and a window",
                });
            }
        };
        if plans.is_empty() {
            return Err(SettingsError::NoPlans);
        }
        let factory = LimiterFactory::new(algorithm);
        let mut rules = Vec::with_capacity(plans.len());
        for (name, rule) in plans {
            let rule = parse_rule(name, rule)?;
            factory
                .check(rule)
                .map_err(|source| SettingsError::InvalidRule {
                    plan: name.clone(),
                    source,
                })?;
            rules.push((name.clone(), rule));
        }
        Ok(Settings {
            algorithm,
            plans: rules,
        })
    }

    /// The method.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Each plan's name and rule, sorted by name.
    pub fn plans(&self) -> impl Iterator<Item = (&str, Rule)> {
        self.plans.iter().map(|(name, rule)| (name.as_str(), *rule))
    }

    /// A service whose plans are the file's plan names.
    pub fn build_service<K: Hash + Eq, C: Clock>(
        &self,
        clock: C,
    ) -> Result<RateLimiterService<K, String, C>, SettingsError> {
        let service = RateLimiterService::new(self.algorithm, self.plans.iter().cloned(), clock);
        service.map_err(service_error)
    }

    /// A service whose plans are the program's own values (an enum, say), each named in
    /// `plans`: every named plan must be in the file, and every plan in the file must be named.
    pub fn build_service_with_plans<'n, K, P, C>(
        &self,
        clock: C,
        plans: impl IntoIterator<Item = (&'n str, P)>,
    ) -> Result<RateLimiterService<K, P, C>, SettingsError>
    where
        K: Hash + Eq,
        P: Eq + fmt::Debug,
        C: Clock,
    {
        let mut wanted: Vec<(&str, P)> = plans.into_iter().collect();
        let mut rules = Vec::with_capacity(wanted.len());
        for (name, rule) in &self.plans {
            let position = wanted
                .iter()
                .position(|(wanted_name, _)| wanted_name == name)
                .ok_or_else(|| SettingsError::UnexpectedPlan { plan: name.clone() })?;
            rules.push((wanted.swap_remove(position).1, *rule));
        }
        if let Some((name, _)) = wanted.first() {
            return Err(SettingsError::MissingPlan {
                plan: (*name).to_owned(),
            });
        }
        RateLimiterService::new(self.algorithm, rules, clock).map_err(service_error)
    }
}

/// Maps the service's own checks (already made when the settings were read) to settings errors.
fn service_error(error: ServiceError) -> SettingsError {
    match error {
        ServiceError::InvalidRule { plan, source } => SettingsError::InvalidRule { plan, source },
        ServiceError::NoPlans => SettingsError::NoPlans,
        other => SettingsError::InvalidField {
            plan: None,
            field: "plans".into(),
            found: other.to_string(),
            expected: "one rule per plan",
        },
    }
}

fn parse_rule(plan: &str, value: &Value) -> Result<Rule, SettingsError> {
    let plan_name = || Some(plan.to_owned());
    let fields = value
        .as_object()
        .ok_or_else(|| SettingsError::InvalidField {
            plan: plan_name(),
            field: "(rule)".into(),
            found: describe(value),
            expected: "a table with a limit and a window",
        })?;
    if let Some(field) = fields
        .keys()
        .find(|key| !["limit", "window"].contains(&key.as_str()))
    {
        return Err(SettingsError::UnknownField {
            plan: plan_name(),
            field: field.clone(),
        });
    }
    let limit = fields.get("limit").ok_or(SettingsError::MissingField {
        plan: plan_name(),
        field: "limit",
    })?;
    let limit =
        limit
            .as_u64()
            .filter(|&limit| limit > 0)
            .ok_or_else(|| SettingsError::InvalidField {
                plan: plan_name(),
                field: "limit".into(),
                found: describe(limit),
                expected: "a whole number of requests, at least 1",
            })?;
    let window = fields.get("window").ok_or(SettingsError::MissingField {
        plan: plan_name(),
        field: "window",
    })?;
    let window = window
        .as_str()
        .and_then(parse_window)
        .ok_or_else(|| SettingsError::InvalidField {
            plan: plan_name(),
            field: "window".into(),
            found: describe(window),
            expected: "a whole number and a unit (ns, us, ms, s, m, h, d), like \"500ms\" or \"1s\"",
        })?;
    Rule::new(limit, window).map_err(|source| SettingsError::InvalidRule {
        plan: plan.to_owned(),
        source,
    })
}

/// Parses a window such as `"500ms"`, `"1 s"` or `"2h"`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::parse_window;
///
/// assert_eq!(parse_window("500ms"), Some(Duration::from_millis(500)));
/// assert_eq!(parse_window("1h"), Some(Duration::from_secs(3600)));
/// assert_eq!(parse_window("1.5s"), None);
/// ```
pub fn parse_window(text: &str) -> Option<Duration> {
    let text = text.trim();
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    let number: u64 = number.parse().ok()?;
    let nanos_per_unit: u64 = match unit.trim_start() {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" | "min" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        _ => return None,
    };
    Some(Duration::from_nanos(number.checked_mul(nanos_per_unit)?))
}

/// A value as the user wrote it, for messages.
fn describe(value: &Value) -> String {
    match value {
        Value::String(text) => format!("{text:?}"),
        other => other.to_string(),
    }
}
