//! # tollgate
//!
//! Lock-free rate limiting for the hot path of proxies and servers: several methods behind one
//! [`Limiter`] trait, picked by an [`Algorithm`] setting, and a [`RateLimiterService`] that keeps
//! one limiter per client with one [`Rule`] per plan.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{Algorithm, FakeClock, RateLimiterService, Rule};
//!
//! #[derive(Debug, PartialEq, Eq)]
//! enum Tier { Free, Pro }
//!
//! let clock = FakeClock::new(); // tests move time by hand; production uses MonotonicClock
//! let service = RateLimiterService::new(
//!     Algorithm::TokenBucket,
//!     [(Tier::Free, Rule::per_second(5)?), (Tier::Pro, Rule::per_second(50)?)],
//!     clock.clone(),
//! )?;
//!
//! let burst = (0..10).filter(|_| service.allow("alice", &Tier::Free).unwrap()).count();
//! assert_eq!(burst, 5);
//! clock.advance(Duration::from_millis(200)); // one token refills every 200 ms
//! let decision = service.acquire("alice", &Tier::Free, 1)?;
//! assert!(decision.is_allowed());
//! assert!(service.acquire("alice", &Tier::Free, 1)?.is_denied());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## The methods
//!
//! | method | guarantee | state per client |
//! |---|---|---|
//! | [`TokenBucket`] | exact token bucket (GCRA): bursts up to N, refilled N per window; at most `N + N*s/W` in any span `s` | one `AtomicU64` |
//! | [`FixedWindow`] | at most N per window aligned to the clock's origin; up to 2N across an edge | one `AtomicU64` |
//! | [`SlidingWindowLog`] | at most N in every span of one window, wherever it starts | N `AtomicU64`s (N ≤ 65 536) |
//! | [`SlidingWindowCounter`] | the last window's count weighted by how much of it the sliding window covers, plus this window's, at most N: at most N per aligned window, at most `2N - ceil(2N/W)` in any span of one window | one `AtomicU64` |
//!
//! Every method is lock-free: the state lives in atomics updated by compare-and-swap loops (the
//! fixed window takes a single `fetch_add` for one permit in the current window), and no decision
//! path takes a lock. A denied attempt changes nothing that any answer depends on: the token
//! bucket, the sliding window counter and the sliding log only read their state (but for a
//! sliding-log batch that another thread interrupts, which gives back its claims); the fixed
//! window's single-permit path adds to a count that racing grants already filled, which the
//! count's headroom absorbs. (The service counts decisions when asked to, and may retire and
//! replace a client's limiter made under an earlier rule, on any call, even one of 0 permits.)
//! Each module documents its guarantee and why it holds under any interleaving.
//!
//! ## Time
//!
//! Limiters read time only through a [`Clock`]: [`MonotonicClock`] (the CPU's counter through
//! `quanta`) in production, [`FakeClock`] in tests so that no test sleeps, and the opt-in
//! [`CoarseClock`] where millisecond resolution is enough. All time arithmetic saturates; a clock
//! that steps back never panics and never grants extra permits.
//!
//! ## Bad input
//!
//! A rule a method cannot honour is a [`RuleError`] when the limiter is made; a mistake in a
//! service's plans (none, one twice, a limit the method cannot honour) is a [`PlanError`], the
//! same whether the in-process service, the Redis service or the settings are given it; asking for more permits at once than the limit is a
//! decision with a [`Rejection`]. No call on the decision path panics.
//!
//! ## Features
//!
//! - `serde`: `Deserialize` and `Serialize` for [`Rule`] (`{ limit = 10, window = "1s" }`),
//!   [`Algorithm`] (`"token_bucket"`) and `Settings` (the method and each plan's limits), so a
//!   program can keep tollgate's settings inside its own configuration, in any serde format.
//! - `settings`: reads a settings file on its own (`Settings::from_path`, TOML or JSON), with
//!   errors that name the plan and the field. Implies `serde`.
//! - `redis`: [`redis::RedisRateLimiter`], the service with its state in Redis, shared by a
//!   fleet of nodes (async, on tokio).
//! - `tower`: [`tower::RateLimitLayer`], a tower middleware answering over-limit HTTP and gRPC
//!   requests (implies `settings`).
//! - `loom`: adds the model-checking instantiations used by the `loom-tests` target
//!   (`cargo test --features loom`). Additive: the public types do not change.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod algorithm;
mod clock;
#[cfg(feature = "serde")]
mod config;
mod decision;
#[cfg(feature = "envoy")]
#[cfg_attr(docsrs, doc(cfg(feature = "envoy")))]
pub mod envoy;
mod error;
mod factory;
mod hasher;
mod headers;
mod limiter;
mod method;
mod plans;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
mod rule;
mod service;
mod sync;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower;
#[cfg(feature = "tower")]
mod verdict;

pub use algorithm::{Algorithm, UnknownAlgorithm};
pub use clock::{Clock, CoarseClock, FakeClock, MonotonicClock};
#[cfg(feature = "serde")]
pub use config::{Settings, SettingsError};
pub use decision::{Decision, Rejection};
pub use error::{RuleError, ServiceError};
pub use factory::{AnyLimiter, LimiterFactory};
pub use hasher::{SipHasher13, SipState};
pub use headers::InvalidPolicyName;
pub use limiter::Limiter;
pub use method::fixed_window::FixedWindow;
pub use method::sliding_window_counter::SlidingWindowCounter;
pub use method::sliding_window_log::SlidingWindowLog;
pub use method::token_bucket::TokenBucket;
pub use plans::PlanError;
pub use rule::Rule;
pub use service::{PlanStats, RateLimiterService, ServiceBuilder, Sweeper};

/// The core state machines, generic over the atomic word, for model checking with loom.
///
/// Not part of the public API: the `loom-tests` target instantiates these with
/// `loom::sync::atomic::AtomicU64` and checks them under every interleaving.
#[cfg(feature = "loom")]
#[doc(hidden)]
pub mod loom_support {
    pub use crate::decision::{Admit, Retired};
    pub use crate::method::Method;
    pub use crate::method::fixed_window::WindowParams;
    pub use crate::method::several_limits::Gate;
    pub use crate::method::sliding_window_counter::CounterParams;
    pub use crate::method::sliding_window_log::{LogParams, LogRing};
    pub use crate::method::token_bucket::GcraParams;
    pub use crate::method::word::Reservation;
    pub use crate::sync::{AtomicWord, OwnedWord};

    /// The service's protocol ([`decide`](service::decide), [`sweep`](service::sweep)),
    /// generic over the map, the plan and the request, and a map of loom atomics to run it with.
    pub mod service {
        pub use crate::service::{
            Acquired, ClientMap, Fresh, LoomClientMap, MapFault, MapGuard, Pinned, Request,
            Versioned, decide, sweep,
        };
    }

    /// The service's store of one-word states ([`ClientStore`](store::ClientStore)) and its
    /// protocol ([`decide`](store::decide)), generic over the atomic word, the plan and the
    /// request.
    pub mod store {
        pub use crate::service::{
            ClientStore, Holding, Place, SlotWord, StoreFault, StoreHead, StorePlan, Stored,
            WordLimit, WordRequest, decide_in_store as decide, give_back_in_store as give_back,
        };
    }
}

// The README's examples are compiled and run as doc tests, all of them, so only with the
// features they use (`cargo test --doc --all-features`, as the CI's test command): without
// them, none is reported as passing.
#[cfg(all(doctest, feature = "redis", feature = "tower"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
