//! Reading any value and keeping what it was: a mistake is reported as written, with where it
//! is, and the typed error is kept for the file loaders.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::error::SettingsError;

/// The key under which the `toml` crate hands a datetime to a visitor, as a one-entry table; a
/// datetime is shown as one rather than as this marker.
const TOML_DATETIME_KEY: &str = "$__toml_private_datetime";

/// A value as written, for messages; tables and lists are described, not kept.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Found {
    Bool(bool),
    Integer(i128),
    Float(f64),
    Text(String),
    Datetime(String),
    Null,
    Table,
    List,
    EmptyList,
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Found::Bool(value) => write!(f, "{value}"),
            Found::Integer(value) => write!(f, "{value}"),
            // TOML's spellings rather than Rust's `NaN`; `{:?}` keeps the `.0` of a whole float.
            Found::Float(value) if value.is_nan() => f.write_str("nan"),
            Found::Float(value) if value.is_infinite() => {
                f.write_str(if *value > 0.0 { "inf" } else { "-inf" })
            }
            Found::Float(value) => write!(f, "{value:?}"),
            Found::Text(text) => write!(f, "{text:?}"),
            Found::Datetime(datetime) => write!(f, "the datetime {datetime}"),
            Found::Null => f.write_str("null"),
            Found::Table => f.write_str("a table"),
            Found::List => f.write_str("a list"),
            Found::EmptyList => f.write_str("an empty list"),
        }
    }
}

/// The typed error behind a failure: the format's own error carries only its message, so the
/// file loaders pick the typed one up here.
#[derive(Default)]
pub(super) struct Report(Cell<Option<SettingsError>>);

impl Report {
    #[cfg(feature = "settings")]
    pub(super) fn take(&self) -> Option<SettingsError> {
        self.0.take()
    }
}

/// Where a value sits: the plan and the position in its `limits` list, if any.
#[derive(Clone, Copy)]
pub(super) struct At<'a> {
    report: &'a Report,
    plan: Option<&'a str>,
    index: Option<usize>,
}

impl<'a> At<'a> {
    /// The top level of the settings, or a rule read on its own.
    pub(super) fn top(report: &'a Report) -> Self {
        At {
            report,
            plan: None,
            index: None,
        }
    }

    /// Inside `plan`.
    pub(super) fn plan<'b>(self, plan: &'b str) -> At<'b>
    where
        'a: 'b,
    {
        At {
            report: self.report,
            plan: Some(plan),
            index: None,
        }
    }

    /// At `index` in the plan's `limits` list.
    pub(super) fn limit(self, index: usize) -> Self {
        At {
            index: Some(index),
            ..self
        }
    }

    pub(super) fn plan_name(self) -> Option<String> {
        self.plan.map(str::to_owned)
    }

    pub(super) fn index(self) -> Option<usize> {
        self.index
    }

    /// The format's error for `error`, keeping the typed one in the report.
    pub(super) fn fail<E: de::Error>(self, error: SettingsError) -> E {
        let message = E::custom(&error);
        self.report.0.set(Some(error));
        message
    }

    pub(super) fn invalid(
        self,
        field: &'static str,
        found: &Found,
        expected: &str,
    ) -> SettingsError {
        SettingsError::InvalidField {
            plan: self.plan_name(),
            index: self.index,
            field,
            found: found.to_string(),
            expected: expected.to_owned(),
        }
    }

    pub(super) fn missing(self, field: &'static str) -> SettingsError {
        SettingsError::MissingField {
            plan: self.plan_name(),
            index: self.index,
            field,
        }
    }

    pub(super) fn duplicate(self, field: &str) -> SettingsError {
        SettingsError::DuplicateField {
            plan: self.plan_name(),
            index: self.index,
            field: field.to_owned(),
        }
    }

    pub(super) fn unknown(self, field: String, expected: &'static str) -> SettingsError {
        SettingsError::UnknownField {
            plan: self.plan_name(),
            index: self.index,
            field,
            expected,
        }
    }

    pub(super) fn not_a_table(self, found: &Found, expected: &'static str) -> SettingsError {
        SettingsError::NotATable {
            plan: self.plan_name(),
            index: self.index,
            found: found.to_string(),
            expected,
        }
    }
}

/// A shape a value is read into. Whatever the value turns out to be reaches one of these
/// methods, so every mistake can be reported as written rather than as the format describes it.
pub(super) trait Expect<'de>: Sized {
    type Value;

    /// The shape, for the rare message the format writes itself.
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;

    /// A value that is not a table or a list, or one this shape does not take.
    fn other<E: de::Error>(self, found: Found) -> Result<Self::Value, E>;

    /// A table.
    fn table<A: MapAccess<'de>>(self, table: Table<A>) -> Result<Self::Value, A::Error> {
        let _ = table;
        self.other(Found::Table)
    }

    /// A list.
    fn list<A: SeqAccess<'de>>(self, list: A) -> Result<Self::Value, A::Error> {
        let _ = list;
        self.other(Found::List)
    }
}

/// Reads any value (through `deserialize_any`) into an [`Expect`] shape.
pub(super) struct Any<T>(pub(super) T);

impl<'de, T: Expect<'de>> DeserializeSeed<'de> for Any<T> {
    type Value = T::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<T::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de, T: Expect<'de>> Visitor<'de> for Any<T> {
    type Value = T::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<T::Value, E> {
        self.0.other(Found::Bool(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<T::Value, E> {
        self.0.other(Found::Integer(value.into()))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<T::Value, E> {
        self.0.other(Found::Integer(value.into()))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<T::Value, E> {
        self.0.other(Found::Float(value))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<T::Value, E> {
        self.0.other(Found::Text(text.to_owned()))
    }

    fn visit_unit<E: de::Error>(self) -> Result<T::Value, E> {
        self.0.other(Found::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<T::Value, E> {
        self.0.other(Found::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<T::Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, list: A) -> Result<T::Value, A::Error> {
        self.0.list(list)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T::Value, A::Error> {
        let first = map.next_key::<String>()?;
        if first.as_deref() == Some(TOML_DATETIME_KEY) {
            let datetime: String = map.next_value()?;
            return self.0.other(Found::Datetime(datetime));
        }
        self.0.table(Table {
            first: Some(first),
            map,
        })
    }
}

/// A table whose first key has already been read (to tell a TOML datetime from a table).
pub(super) struct Table<A> {
    first: Option<Option<String>>,
    map: A,
}

impl<'de, A: MapAccess<'de>> Table<A> {
    /// The next key, or `None` at the end of the table.
    pub(super) fn next_key(&mut self) -> Result<Option<String>, A::Error> {
        match self.first.take() {
            Some(first) => Ok(first),
            None => self.map.next_key(),
        }
    }

    /// The value of the key just read.
    pub(super) fn next_value<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<S::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
}

/// A scalar field: `check` turns what was found into the value, or into the mistake to report.
pub(super) struct Scalar<'a, T> {
    pub(super) at: At<'a>,
    pub(super) expecting: &'static str,
    pub(super) check: fn(At<'a>, Found) -> Result<T, SettingsError>,
}

impl<'de, T> Expect<'de> for Scalar<'_, T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.expecting)
    }

    fn other<E: de::Error>(self, found: Found) -> Result<T, E> {
        (self.check)(self.at, found).map_err(|error| self.at.fail(error))
    }
}
