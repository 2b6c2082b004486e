//! [`SetupError`]: why a layer could not be made from a settings file.

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
