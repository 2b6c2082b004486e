//! `Deserialize` and `Serialize` for [`Rule`] (`{ limit = 10, window = "1s" }`) and
//! [`Algorithm`] (`"token_bucket"`).

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use serde::ser::{Serialize, SerializeStruct, Serializer};

use super::error::SettingsError;
use super::found::{Any, At, Expect, Found, Report, Scalar, Table};
use super::window::{WindowError, format_window, parse_window};
use crate::{Algorithm, Rule};

const LIMIT_EXPECTED: &str = "a whole number of requests, at least 1";
const WINDOW_EXPECTED: &str =
    "a whole number and a unit (ns, us, ms, s, m, h, d), like \"500ms\", \"1s\" or \"1h30m\"";
const RULE_EXPECTED: &str = "a table with \"limit\" and \"window\"";
const RULE_FIELDS: &str = "limit, window";

fn check_limit(at: At<'_>, found: Found) -> Result<u64, SettingsError> {
    match &found {
        Found::Integer(limit) if *limit >= 1 => u64::try_from(*limit).ok(),
        _ => None,
    }
    .ok_or_else(|| at.invalid("limit", &found, LIMIT_EXPECTED))
}

fn check_window(at: At<'_>, found: Found) -> Result<Duration, SettingsError> {
    let result = match &found {
        Found::Text(text) => parse_window(text),
        _ => Err(WindowError::Unparsable),
    };
    result.map_err(|error| match error {
        WindowError::Unparsable => at.invalid("window", &found, WINDOW_EXPECTED),
        WindowError::TooLong => SettingsError::WindowTooLong {
            plan: at.plan_name(),
            index: at.index(),
            found: found.to_string(),
            max: Rule::MAX_WINDOW,
        },
    })
}

/// A rule's two fields as they are read from a table, in any order.
#[derive(Default)]
pub(super) struct RuleFields {
    limit: Option<u64>,
    window: Option<Duration>,
}

impl RuleFields {
    /// Reads `key`'s value if `key` is one of a rule's fields; `false` if it is not.
    pub(super) fn read<'de, A: MapAccess<'de>>(
        &mut self,
        at: At<'_>,
        key: &str,
        table: &mut Table<A>,
    ) -> Result<bool, A::Error> {
        match key {
            "limit" if self.limit.is_some() => Err(at.fail(at.duplicate(key))),
            "window" if self.window.is_some() => Err(at.fail(at.duplicate(key))),
            "limit" => {
                self.limit = Some(table.next_value(Any(Scalar {
                    at,
                    expecting: LIMIT_EXPECTED,
                    check: check_limit,
                }))?);
                Ok(true)
            }
            "window" => {
                self.window = Some(table.next_value(Any(Scalar {
                    at,
                    expecting: WINDOW_EXPECTED,
                    check: check_window,
                }))?);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Whether neither field was given.
    pub(super) fn is_empty(&self) -> bool {
        self.limit.is_none() && self.window.is_none()
    }

    /// The rule, made by [`Rule::new`] so that it checks the bounds.
    pub(super) fn finish(self, at: At<'_>) -> Result<Rule, SettingsError> {
        let limit = self.limit.ok_or_else(|| at.missing("limit"))?;
        let window = self.window.ok_or_else(|| at.missing("window"))?;
        Rule::new(limit, window).map_err(|source| SettingsError::InvalidRule {
            plan: at.plan_name(),
            index: at.index(),
            source,
        })
    }
}

/// A rule: a table with `limit` and `window`, on its own or in a plan's `limits` list.
pub(super) struct RuleShape<'a> {
    pub(super) at: At<'a>,
}

impl<'de> Expect<'de> for RuleShape<'_> {
    type Value = Rule;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(RULE_EXPECTED)
    }

    fn other<E: de::Error>(self, found: Found) -> Result<Rule, E> {
        Err(self.at.fail(self.at.not_a_table(&found, RULE_EXPECTED)))
    }

    fn table<A: MapAccess<'de>>(self, mut table: Table<A>) -> Result<Rule, A::Error> {
        let at = self.at;
        let mut fields = RuleFields::default();
        while let Some(key) = table.next_key()? {
            if !fields.read(at, &key, &mut table)? {
                return Err(at.fail(at.unknown(key, RULE_FIELDS)));
            }
        }
        fields.finish(at).map_err(|error| at.fail(error))
    }
}

/// Reads `{ limit = 10, window = "1s" }`, checked by [`Rule::new`]; every mistake names the field
/// and the bound (`field "limit" is 0: expected a whole number of requests, at least 1`).
impl<'de> Deserialize<'de> for Rule {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Rule, D::Error> {
        let report = Report::default();
        de::DeserializeSeed::deserialize(
            Any(RuleShape {
                at: At::top(&report),
            }),
            deserializer,
        )
    }
}

/// Writes `{ limit = 10, window = "1s" }`, the window in whole units (`"1h30m"`).
impl Serialize for Rule {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut rule = serializer.serialize_struct("Rule", 2)?;
        rule.serialize_field("limit", &self.limit())?;
        rule.serialize_field("window", &format_window(self.window()))?;
        rule.end()
    }
}

/// Reads a method's name (`"token_bucket"`, `"fixed_window"`, `"sliding_window_log"`) through
/// [`FromStr`](std::str::FromStr), so every method [`Algorithm::name`] knows is read.
impl<'de> Deserialize<'de> for Algorithm {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Algorithm, D::Error> {
        struct Name;

        impl Visitor<'_> for Name {
            type Value = Algorithm;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("the name of a method, like \"token_bucket\"")
            }

            fn visit_str<E: de::Error>(self, name: &str) -> Result<Algorithm, E> {
                name.parse().map_err(E::custom)
            }
        }

        deserializer.deserialize_str(Name)
    }
}

/// Writes the method's name, as [`Algorithm::name`].
impl Serialize for Algorithm {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// Reads the `algorithm` field, reporting an unknown name with the known ones.
pub(super) fn check_algorithm(at: At<'_>, found: Found) -> Result<Algorithm, SettingsError> {
    match &found {
        Found::Text(name) => name.parse().ok(),
        _ => None,
    }
    .ok_or_else(|| {
        let names: Vec<String> = Algorithm::ALL
            .iter()
            .map(|algorithm| format!("{:?}", algorithm.name()))
            .collect();
        at.invalid("algorithm", &found, &format!("one of {}", names.join(", ")))
    })
}
