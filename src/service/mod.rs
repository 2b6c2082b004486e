//! The per-client service: one limiter per client and plan, made on the client's first request,
//! with each plan's limits replaceable at runtime and idle clients evicted.
//!
//! - [`RateLimiterService`] (`rate_limiter.rs`): the map of clients and the decision protocol.
//! - [`ServiceBuilder`] (`builder.rs`) and [`Sweeper`] (`sweeper.rs`).
//! - `plan_table.rs` (each plan's client map and versioned limits, read without a lock on every
//!   decision) and `stats.rs` (decision counts).
//! - `client_state.rs` (one client's state, dispatched to the service's method) and
//!   `several_limits.rs` (a plan of several limits, all or nothing).

mod builder;
pub(crate) mod client_state;
mod plan_table;
mod rate_limiter;
pub(crate) mod several_limits;
pub(crate) mod stats;
mod sweeper;

pub use builder::ServiceBuilder;
pub use rate_limiter::RateLimiterService;
pub use stats::PlanStats;
pub use sweeper::Sweeper;
