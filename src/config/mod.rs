//! Settings through serde (feature `serde`): `Deserialize` and `Serialize` for
//! [`Rule`](crate::Rule), [`Algorithm`](crate::Algorithm) and [`Settings`], windows written as
//! `"1h30m"`, and the typed [`SettingsError`]; file loading with the `settings` feature.

mod error;
mod found;
mod rule;
mod settings;
mod window;

pub use error::SettingsError;
pub use settings::Settings;
