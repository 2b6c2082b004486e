//! The per-client service: one limiter per client and plan, made on the client's first request,
//! with each plan's limits replaceable at runtime and idle clients evicted.
//!
//! - [`RateLimiterService`] (`rate_limiter.rs`): the API; `protocol.rs`: how a decision finds
//!   its client's state in the plan's map, replaces a retired one, and how the sweep evicts,
//!   written once over what it needs of the map (`client_map.rs`), so that the loom models run
//!   the very same code.
//! - [`ServiceBuilder`] (`builder.rs`) and [`Sweeper`] (`sweeper.rs`).
//! - `plan_table.rs` (each plan's client map and versioned limits, read without a lock on every
//!   decision) and `stats.rs` (decision counts).
//!
//! A client's state, and the methods that decide on it, live below the service in `method/`:
//! the service stores and finds states, and never looks inside them.

mod builder;
mod client_map;
mod plan_table;
mod protocol;
mod rate_limiter;
pub(crate) mod stats;
mod store;
mod sweeper;

pub use builder::ServiceBuilder;
#[cfg(feature = "envoy")]
pub(crate) use protocol::Grant;
pub use rate_limiter::RateLimiterService;
pub use stats::PlanStats;
pub use sweeper::Sweeper;

/// The protocol and a loom map, for the loom models (`tollgate::loom_support`).
#[cfg(feature = "loom")]
pub use client_map::{ClientMap, LoomClientMap, MapFault};
#[cfg(feature = "loom")]
pub use protocol::{Acquired, Fresh, MapGuard, Pinned, Request, Versioned, decide, sweep};
/// The store of one-word states and its protocol, for the loom models (`tollgate::loom_support`).
#[cfg(feature = "loom")]
pub use store::{
    ClientStore, Holding, Place, SlotWord, StoreFault, StoreHead, StorePlan, Stored, WordLimit,
    WordRequest, decide as decide_in_store, give_back as give_back_in_store,
};
