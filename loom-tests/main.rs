//! loom model checks of the core state machines.
//!
//! Run with `cargo test --release --features loom --test loom`. Each model drives the code the
//! public limiters run (instantiated with loom's atomics through `tollgate::loom_support`) from
//! two or three threads, each with its own fixed clock reading, and checks under every
//! interleaving (within a preemption bound) that:
//!
//! - no method admits more than its guarantee allows: `token_bucket`, `fixed_window`,
//!   `sliding_window_log`, `sliding_window_counter`;
//! - one-word races are linearizable (`token_bucket`, `fixed_window`, `sliding_window_counter`);
//! - retiring a state for eviction while threads acquire never over-admits;
//! - the service's first requests for a client make exactly one limiter, and its sweep never
//!   over-admits (`service`: the service's own protocol, run on the crate's loom map);
//! - a read of a plan's versioned rule never mixes versions, and a rule change racing a sweep and
//!   a client's requests starts the client afresh at most once (`rule_change`);
//! - the service's store of one-word states (its own `decide`, `insert` and `sweep`): first
//!   requests make one state, a rule change starts a client afresh once, an eviction racing a
//!   decision grants nothing but fresh permits, a sweep never retires an active state (`store`);
//! - a plan of several limits takes from all or none, exactly (`several_limits`);
//!
//! and `negative_controls` shows that each of these checks fails on a variant broken in one
//! racy step.

mod fixed_window;
mod models;
mod negative_controls;
mod rule_change;
mod service;
mod several_limits;
mod sliding_window_counter;
mod sliding_window_log;
mod store;
mod store_layouts;
mod support;
mod token_bucket;
