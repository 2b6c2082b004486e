//! [`Settings`]: the method and each plan's limits, read through serde and checked.

use std::collections::HashSet;
use std::fmt;
use std::hash::Hash;
#[cfg(feature = "settings")]
use std::path::Path;

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess};
use serde::ser::{Serialize, SerializeMap, SerializeStruct, Serializer};

use super::error::SettingsError;
use super::found::{Any, At, Expect, Found, Report, Scalar, Table};
use super::rule::{RuleFields, RuleShape, check_algorithm};
use crate::clock::Clock;
use crate::plans::{Plans, Together};
use crate::{Algorithm, RateLimiterService, Rule, ServiceBuilder};

const SETTINGS_EXPECTED: &str = "a table with \"algorithm\" and \"plans\"";
const SETTINGS_FIELDS: &str = "algorithm, plans";
const PLANS_EXPECTED: &str = "a table of plans, each with a limit and a window";
const PLAN_EXPECTED: &str =
    "a table with \"limit\" and \"window\", or with \"limits\", a list of such tables";
const PLAN_FIELDS: &str = "limit, window, limits";
const LIMITS_EXPECTED: &str =
    "a list of at least one limit, like [{ limit = 10, window = \"1s\" }]";

/// The method and the limits of each plan, read from settings and checked as every backend
/// checks its plans: at least one plan, each with 1 to 4 limits the method honours, none given
/// twice (a mistake there is a [`SettingsError::Plan`]).
///
/// Written in TOML (or JSON, or any format serde reads), a plan has one limit, or a list of
/// them:
///
/// ```toml
/// # The method: token_bucket, fixed_window or sliding_window_log.
/// algorithm = "token_bucket"
///
/// # At most `limit` requests per `window`.
/// [plans.free]
/// limit = 5
/// window = "1s"
///
/// # Several limits at once: 10 a second and 1000 an hour.
/// [plans.pro]
/// limits = [{ limit = 10, window = "1s" }, { limit = 1000, window = "1h" }]
/// ```
///
/// A window is whole numbers each followed by a unit: `ns`, `us` (or `µs`), `ms`, `s`, `m` (or
/// `min`), `h`, `d`; for example `"500ms"`, `"1s"`, `"1h30m"`. Every mistake is a
/// [`SettingsError`] naming the plan, the limit's position in a list and the field:
/// `plan "free": field "limit" is -5: expected a whole number of requests, at least 1`.
///
/// A plan with several limits is enforced with all of them together (see
/// [`ServiceBuilder::plan_limits`]).
///
/// # Inside a program's own configuration
///
/// `Settings` implements `Deserialize` (feature `serde`), so it can be a field of a program's
/// own configuration, read by any serde format; a mistake is the format's error, with the same
/// message. `Settings::from_path` and the other loaders (feature `settings`) read a file of
/// settings alone and return the typed [`SettingsError`].
///
/// ```
/// use serde::Deserialize;
/// use tollgate::{Algorithm, FakeClock, Settings};
///
/// #[derive(Deserialize)]
/// struct Config {
///     listen: String,
///     rate_limits: Settings,
/// }
///
/// let config: Config = toml::from_str(r#"
///     listen = "0.0.0.0:8080"
///
///     [rate_limits]
///     algorithm = "fixed_window"
///
///     [rate_limits.plans.free]
///     limit = 100
///     window = "1m"
/// "#)?;
/// assert_eq!(config.rate_limits.algorithm(), Algorithm::FixedWindow);
/// let service = config.rate_limits.build_service::<String, _>(FakeClock::new())?;
/// assert!(service.allow("alice", &"free".to_owned())?);
///
/// let zero = toml::from_str::<Config>(r#"
///     listen = "0.0.0.0:8080"
///     [rate_limits]
///     algorithm = "fixed_window"
///     plans.free = { limit = 0, window = "1m" }
/// "#);
/// let message = zero.err().map(|error| error.to_string()).unwrap_or_default();
/// assert!(message.contains(r#"plan "free": field "limit" is 0: expected a whole number of requests, at least 1"#));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Sorted by name, checked as every backend checks its plans.
    plans: Plans<String>,
}

impl Settings {
    /// Reads settings from TOML text (feature `settings`).
    ///
    /// # Errors
    ///
    /// [`SettingsError::Syntax`] for text that is not TOML; otherwise the mistake, naming the
    /// plan and the field.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{Settings, SettingsError};
    ///
    /// let error = Settings::from_toml_str(r#"
    ///     algorithm = "token_bucket"
    ///     [plans.free]
    ///     limit = -5
    ///     window = "1s"
    /// "#).unwrap_err();
    /// assert!(matches!(error, SettingsError::InvalidField { field: "limit", .. }));
    /// assert_eq!(
    ///     error.to_string(),
    ///     r#"plan "free": field "limit" is -5: expected a whole number of requests, at least 1"#
    /// );
    /// ```
    #[cfg(feature = "settings")]
    pub fn from_toml_str(text: &str) -> Result<Settings, SettingsError> {
        let syntax = |error: toml::de::Error| SettingsError::Syntax {
            format: "TOML",
            message: error.to_string().trim_end().to_owned(),
        };
        let report = Report::default();
        let deserializer = toml::Deserializer::parse(text).map_err(syntax)?;
        Settings::seed(&report)
            .deserialize(deserializer)
            .map_err(|error| report.take().unwrap_or_else(|| syntax(error)))
    }

    /// Reads settings from JSON text (feature `settings`). A key given twice is a mistake, as in
    /// TOML.
    ///
    /// # Errors
    ///
    /// [`SettingsError::Syntax`] for text that is not JSON; otherwise the mistake, naming the
    /// plan and the field.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::Settings;
    ///
    /// let settings = Settings::from_json_str(r#"{
    ///     "algorithm": "sliding_window_log",
    ///     "plans": { "free": { "limit": 5, "window": "1s" } }
    /// }"#)?;
    /// assert_eq!(settings.rule("free")?.limit(), 5);
    /// # Ok::<(), tollgate::SettingsError>(())
    /// ```
    #[cfg(feature = "settings")]
    pub fn from_json_str(text: &str) -> Result<Settings, SettingsError> {
        let syntax = |error: serde_json::Error| SettingsError::Syntax {
            format: "JSON",
            message: error.to_string(),
        };
        let report = Report::default();
        let mut deserializer = serde_json::Deserializer::from_str(text);
        let settings = Settings::seed(&report)
            .deserialize(&mut deserializer)
            .map_err(|error| report.take().unwrap_or_else(|| syntax(error)))?;
        deserializer.end().map_err(syntax)?;
        Ok(settings)
    }

    /// Reads a settings file (feature `settings`): JSON if its name ends in `.json`, TOML
    /// otherwise.
    ///
    /// # Errors
    ///
    /// [`SettingsError::Io`] when the file cannot be read; otherwise as
    /// [`from_toml_str`](Settings::from_toml_str) and [`from_json_str`](Settings::from_json_str).
    #[cfg(feature = "settings")]
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

    fn seed(report: &Report) -> Any<SettingsShape<'_>> {
        Any(SettingsShape {
            at: At::top(report),
        })
    }

    /// The method.
    pub fn algorithm(&self) -> Algorithm {
        self.plans.algorithm()
    }

    /// Each plan's name and limits (at least one), sorted by name.
    pub fn plans(&self) -> impl Iterator<Item = (&str, &[Rule])> {
        self.plans
            .as_slice()
            .iter()
            .map(|(name, rules)| (name.as_str(), rules.as_slice()))
    }

    /// The rule of `plan`, when it has a single limit.
    ///
    /// # Errors
    ///
    /// [`SettingsError::MissingPlan`] when the settings have no such plan, and
    /// [`SettingsError::SeveralLimits`] when it has more than one limit.
    pub fn rule(&self, plan: &str) -> Result<Rule, SettingsError> {
        let rules = self.rules(plan).ok_or_else(|| SettingsError::MissingPlan {
            plan: plan.to_owned(),
        })?;
        single_rule(plan, rules)
    }

    /// A service whose plans are the settings' plan names.
    ///
    /// # Errors
    ///
    /// [`SettingsError::Plan`] when the in-process service refuses a plan's limits (several
    /// limits under the sliding window log).
    pub fn build_service<K: Hash + Eq, C: Clock>(
        &self,
        clock: C,
    ) -> Result<RateLimiterService<K, String, C>, SettingsError> {
        let mut builder = ServiceBuilder::new(self.algorithm(), clock);
        for (name, plan_rules) in self.plans.as_slice() {
            builder = builder.plan_limits(name.clone(), plan_rules.iter().copied());
        }
        builder.build().map_err(SettingsError::from)
    }

    /// A service whose plans are the program's own values (an enum, say), each named in
    /// `plans`: every named plan must be in the settings, and every plan in the settings must
    /// be named.
    ///
    /// # Errors
    ///
    /// [`SettingsError::PlanListedTwice`] when `plans` names a plan twice,
    /// [`SettingsError::UnexpectedPlan`] for a plan in the settings that `plans` does not name,
    /// [`SettingsError::MissingPlan`] for one `plans` names that the settings lack,
    /// and [`SettingsError::Plan`] when the service refuses the plans (two names given equal
    /// values, or several limits under the sliding window log).
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
        let wanted: Vec<(&str, P)> = plans.into_iter().collect();
        // Checked first, so that a plan named twice is reported as such rather than as missing.
        let mut named = HashSet::with_capacity(wanted.len());
        if let Some((name, _)) = wanted.iter().find(|(name, _)| !named.insert(*name)) {
            return Err(SettingsError::PlanListedTwice {
                plan: (*name).to_owned(),
            });
        }
        if let Some((name, _)) = self
            .plans
            .as_slice()
            .iter()
            .find(|(name, _)| !named.contains(name.as_str()))
        {
            return Err(SettingsError::UnexpectedPlan { plan: name.clone() });
        }
        let mut builder = ServiceBuilder::new(self.algorithm(), clock);
        for (name, plan) in wanted {
            let plan_rules = self.rules(name).ok_or_else(|| SettingsError::MissingPlan {
                plan: name.to_owned(),
            })?;
            builder = builder.plan_limits(plan, plan_rules.iter().copied());
        }
        builder.build().map_err(SettingsError::from)
    }

    /// The rules of `plan`, found by binary search in the sorted plans.
    fn rules(&self, plan: &str) -> Option<&[Rule]> {
        let plans = self.plans.as_slice();
        let position = plans
            .binary_search_by(|(name, _)| name.as_str().cmp(plan))
            .ok()?;
        Some(&plans[position].1)
    }
}

/// The one rule of a plan, for [`Settings::rule`].
fn single_rule(plan: &str, rules: &[Rule]) -> Result<Rule, SettingsError> {
    match rules {
        [rule] => Ok(*rule),
        _ => Err(SettingsError::SeveralLimits {
            plan: plan.to_owned(),
            count: rules.len(),
        }),
    }
}

/// Reads `algorithm` and `plans`, each once; any other field, or a repeated one, is a mistake.
/// The rules are checked against the method once both are read, in whichever order they came.
impl<'de> Deserialize<'de> for Settings {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Settings, D::Error> {
        let report = Report::default();
        Settings::seed(&report).deserialize(deserializer)
    }
}

/// Writes `algorithm` and `plans`; a plan with one limit as `limit` and `window`, a plan with
/// several as `limits`.
impl Serialize for Settings {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        struct PlanTable<'a>(&'a [(String, Vec<Rule>)]);
        struct Limits<'a>(&'a [Rule]);

        impl Serialize for PlanTable<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut plans = serializer.serialize_map(Some(self.0.len()))?;
                for (name, rules) in self.0 {
                    match rules.as_slice() {
                        [rule] => plans.serialize_entry(name, rule)?,
                        rules => plans.serialize_entry(name, &Limits(rules))?,
                    }
                }
                plans.end()
            }
        }

        impl Serialize for Limits<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut plan = serializer.serialize_struct("Plan", 1)?;
                plan.serialize_field("limits", self.0)?;
                plan.end()
            }
        }

        let mut settings = serializer.serialize_struct("Settings", 2)?;
        settings.serialize_field("algorithm", &self.algorithm())?;
        settings.serialize_field("plans", &PlanTable(self.plans.as_slice()))?;
        settings.end()
    }
}

/// The whole settings: `algorithm` and `plans`.
struct SettingsShape<'a> {
    at: At<'a>,
}

impl<'de> Expect<'de> for SettingsShape<'_> {
    type Value = Settings;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(SETTINGS_EXPECTED)
    }

    fn other<E: de::Error>(self, found: Found) -> Result<Settings, E> {
        Err(self.at.fail(self.at.not_a_table(&found, SETTINGS_EXPECTED)))
    }

    fn table<A: MapAccess<'de>>(self, mut table: Table<A>) -> Result<Settings, A::Error> {
        let at = self.at;
        let mut algorithm = None;
        let mut plans = None;
        while let Some(key) = table.next_key()? {
            match key.as_str() {
                "algorithm" if algorithm.is_some() => return Err(at.fail(at.duplicate(&key))),
                "plans" if plans.is_some() => return Err(at.fail(at.duplicate(&key))),
                "algorithm" => {
                    algorithm = Some(table.next_value(Any(Scalar {
                        at,
                        expecting: "the name of a method, like \"token_bucket\"",
                        check: check_algorithm,
                    }))?);
                }
                "plans" => plans = Some(table.next_value(Any(PlansShape { at }))?),
                _ => return Err(at.fail(at.unknown(key, SETTINGS_FIELDS))),
            }
        }
        let algorithm = algorithm.ok_or_else(|| at.fail(at.missing("algorithm")))?;
        let plans = plans.ok_or_else(|| at.fail(at.missing("plans")))?;
        check_plans(algorithm, plans).map_err(|error| at.fail(error))
    }
}

/// Sorts the plans by name and checks them as every backend checks its plans.
fn check_plans(
    algorithm: Algorithm,
    mut plans: Vec<(String, Vec<Rule>)>,
) -> Result<Settings, SettingsError> {
    // Stable: a name given twice (JSON allows it) is reported as the check finds it.
    plans.sort_by(|(a, _), (b, _)| a.cmp(b));
    let plans = Plans::new(algorithm, Together::Atomically, plans)?;
    Ok(Settings { plans })
}

/// The `plans` table: each plan's name and rules, as read (a name given twice and an empty
/// table are plan mistakes, found by [`check_plans`]).
struct PlansShape<'a> {
    at: At<'a>,
}

impl<'de> Expect<'de> for PlansShape<'_> {
    type Value = Vec<(String, Vec<Rule>)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(PLANS_EXPECTED)
    }

    fn other<E: de::Error>(self, found: Found) -> Result<Self::Value, E> {
        Err(self
            .at
            .fail(self.at.invalid("plans", &found, PLANS_EXPECTED)))
    }

    fn table<A: MapAccess<'de>>(self, mut table: Table<A>) -> Result<Self::Value, A::Error> {
        let mut plans = Vec::new();
        while let Some(name) = table.next_key()? {
            let rules = table.next_value(Any(PlanShape {
                at: self.at.plan(&name),
            }))?;
            plans.push((name, rules));
        }
        Ok(plans)
    }
}

/// One plan: `limit` and `window`, or `limits`, a list of tables with both. Its rules.
struct PlanShape<'a> {
    at: At<'a>,
}

impl<'de> Expect<'de> for PlanShape<'_> {
    type Value = Vec<Rule>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(PLAN_EXPECTED)
    }

    fn other<E: de::Error>(self, found: Found) -> Result<Vec<Rule>, E> {
        Err(self.at.fail(self.at.not_a_table(&found, PLAN_EXPECTED)))
    }

    fn table<A: MapAccess<'de>>(self, mut table: Table<A>) -> Result<Vec<Rule>, A::Error> {
        let at = self.at;
        let mut fields = RuleFields::default();
        let mut limits = None;
        while let Some(key) = table.next_key()? {
            if key == "limits" {
                if limits.is_some() {
                    return Err(at.fail(at.duplicate(&key)));
                }
                limits = Some(table.next_value(Any(LimitsShape { at }))?);
            } else if !fields.read(at, &key, &mut table)? {
                return Err(at.fail(at.unknown(key, PLAN_FIELDS)));
            }
        }
        let plan = || at.plan_name().unwrap_or_default();
        match limits {
            Some(_) if !fields.is_empty() => {
                Err(at.fail(SettingsError::BothForms { plan: plan() }))
            }
            Some(rules) => Ok(rules),
            None => match fields.finish(at) {
                Ok(rule) => Ok(vec![rule]),
                Err(error) => Err(at.fail(error)),
            },
        }
    }
}

/// A plan's `limits`: a list of at least one rule.
struct LimitsShape<'a> {
    at: At<'a>,
}

impl<'de> Expect<'de> for LimitsShape<'_> {
    type Value = Vec<Rule>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(LIMITS_EXPECTED)
    }

    fn other<E: de::Error>(self, found: Found) -> Result<Vec<Rule>, E> {
        Err(self
            .at
            .fail(self.at.invalid("limits", &found, LIMITS_EXPECTED)))
    }

    fn list<A: SeqAccess<'de>>(self, mut list: A) -> Result<Vec<Rule>, A::Error> {
        let mut rules = Vec::new();
        while let Some(rule) = list.next_element_seed(Any(RuleShape {
            at: self.at.limit(rules.len()),
        }))? {
            rules.push(rule);
        }
        if rules.is_empty() {
            let empty = self
                .at
                .invalid("limits", &Found::EmptyList, LIMITS_EXPECTED);
            return Err(self.at.fail(empty));
        }
        Ok(rules)
    }
}
