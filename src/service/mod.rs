//! The per-client service: one limiter per client and plan, made on the client's first request,
//! with each plan's limits replaceable at runtime and idle clients evicted.
//!
//! - [`RateLimiterService`] (`rate_limiter.rs`): the API; `protocol.rs`: how a decision finds
//!   its client's state in the plan's map, replaces a retired one, and how the sweep evicts.
//! - [`ServiceBuilder`] (`builder.rs`) and [`Sweeper`] (`sweeper.rs`).
//! - `plan_table.rs` (each plan's client map and versioned limits, read without a lock on every
//!   decision) and `stats.rs` (decision counts).
//!
//! A client's state, and the methods that decide on it, live below the service in `method/`:
//! the service stores and finds states, and never looks inside them.

mod builder;
mod plan_table;
mod protocol;
mod rate_limiter;
pub(crate) mod stats;
mod sweeper;

pub use builder::ServiceBuilder;
pub use rate_limiter::RateLimiterService;
pub use stats::PlanStats;
pub use sweeper::Sweeper;
