//! [`Algorithm`]: the setting that picks a method.

use std::fmt;
use std::str::FromStr;

/// The rate-limiting methods, picked by setting.
///
/// | method | guarantee | state per client |
/// |---|---|---|
/// | [`TokenBucket`](crate::TokenBucket) | exact token bucket (GCRA): bursts of N, refilled N per window | 8 bytes |
/// | [`FixedWindow`](crate::FixedWindow) | at most N per aligned window; up to 2N across an edge | 8 bytes |
/// | [`SlidingWindowLog`](crate::SlidingWindowLog) | at most N in every span of one window | 8 bytes × N |
/// | [`SlidingWindowCounter`](crate::SlidingWindowCounter) | the last window's count weighted by its overlap, plus this window's, at most N: at most N per aligned window, under 2N in any span of one window | 8 bytes |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// See [`TokenBucket`](crate::TokenBucket).
    TokenBucket,
    /// See [`FixedWindow`](crate::FixedWindow).
    FixedWindow,
    /// See [`SlidingWindowLog`](crate::SlidingWindowLog).
    SlidingWindowLog,
    /// See [`SlidingWindowCounter`](crate::SlidingWindowCounter).
    SlidingWindowCounter,
}

impl Algorithm {
    /// Every method, in a fixed order.
    pub const ALL: [Algorithm; 4] = [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
    ];

    /// The setting's name: `token_bucket`, `fixed_window`, `sliding_window_log` or
    /// `sliding_window_counter`.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindowLog => "sliding_window_log",
            Algorithm::SlidingWindowCounter => "sliding_window_counter",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Algorithm::TokenBucket => "token bucket",
            Algorithm::FixedWindow => "fixed window",
            Algorithm::SlidingWindowLog => "sliding window log",
            Algorithm::SlidingWindowCounter => "sliding window counter",
        })
    }
}

/// A name that is not one of [`Algorithm::name`]'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownAlgorithm(String);

impl UnknownAlgorithm {
    /// The name that was given.
    pub fn name(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for UnknownAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "algorithm {:?} is unknown: expected one of token_bucket, fixed_window, \
             sliding_window_log, sliding_window_counter",
            self.0
        )
    }
}

impl std::error::Error for UnknownAlgorithm {}

impl FromStr for Algorithm {
    type Err = UnknownAlgorithm;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|algorithm| algorithm.name() == name)
            .ok_or_else(|| UnknownAlgorithm(name.to_owned()))
    }
}
