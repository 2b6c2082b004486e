//! The layer's errors: [`SetupError`] (a layer from a settings file) and [`InvalidHeaderName`]
//! (a [`HeaderKey`](super::HeaderKey) named by text).

use std::fmt;

use crate::SettingsError;

/// Why [`RateLimitLayer::from_settings`](super::RateLimitLayer::from_settings) failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum SetupError {
    /// The settings do not describe a service for these plans.
    Settings(SettingsError),
    /// The thread that evicts idle clients could not be started.
    Sweeper(std::io::Error),
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetupError::Settings(error) => write!(f, "rate limit settings: {error}"),
            SetupError::Sweeper(error) => {
                write!(f, "the idle-client sweeper could not start: {error}")
            }
        }
    }
}

impl std::error::Error for SetupError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SetupError::Settings(error) => Some(error),
            SetupError::Sweeper(error) => Some(error),
        }
    }
}

impl From<SettingsError> for SetupError {
    fn from(error: SettingsError) -> Self {
        SetupError::Settings(error)
    }
}

/// A header name given as text that is not one: empty, or with a character a header name cannot
/// have (RFC 9110 field names are tokens: letters, digits and ``!#$%&'*+-.^_`|~``).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidHeaderName {
    name: String,
}

impl InvalidHeaderName {
    pub(crate) fn new(name: &str) -> Self {
        InvalidHeaderName {
            name: name.to_owned(),
        }
    }
}

impl fmt::Display for InvalidHeaderName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "header name {:?} is invalid: a header name is one or more letters, digits and \
             any of !#$%&'*+-.^_`|~ (like \"x-api-key\")",
            self.name
        )
    }
}

impl std::error::Error for InvalidHeaderName {}
