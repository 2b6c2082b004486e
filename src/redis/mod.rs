//! A [`RedisRateLimiter`]: the per-client service with its state in Redis, so that a fleet of
//! nodes enforces one limit together (feature `redis`).
//!
//! The same plans, rules, methods and [`Decision`](crate::Decision)s as
//! [`RateLimiterService`](crate::RateLimiterService), asked asynchronously on tokio.
//!
//! # Connection
//!
//! The URL names one server (`redis://`, through the `redis` crate's `ConnectionManager`, which
//! reconnects in the background) or a Redis Cluster (`redis+cluster://host:port[,host:port...]`
//! naming any of its nodes, through the crate's cluster client, which routes each script to the
//! master of its keys' slot and follows `MOVED` and `ASK`); `rediss://` and `rediss+cluster://`
//! are the same over TLS (feature `redis-tls`; see
//! `RedisRateLimiterBuilder::tls_root_certificate`). Both kinds are bounded alike: the
//! connection timeout bounds establishing each connection, the timeout each round trip (on a
//! cluster, a redirected one with its retries). [`RedisRateLimiterBuilder::build`] checks that
//! one server is a primary ([`RedisError::ReadOnlyReplica`] otherwise, as is a `READONLY` reply
//! later) and loads the scripts, on every master of a cluster. The limits are only as durable as
//! the keys: a server that evicts them (`maxmemory-policy` other than `noeviction`) or loses them
//! (a restart without persistence, a failover to a replica behind) gives each client that lost
//! its keys a fresh quota, at most one limit's worth per client per loss.
//!
//! # Guarantees
//!
//! - **One round trip, atomic.** Each decision is one Lua script (`EVALSHA`; loaded again on
//!   `NOSCRIPT`) that reads the state, decides and commits in one step; no other command runs
//!   in between, so nodes never race. A denial writes nothing. A plan with several limits
//!   ([`RedisRateLimiterBuilder::plan_limits`]) is one call that checks every limit, then
//!   takes from all or none. The plans are checked as the in-process service checks them (the
//!   same [`PlanError`](crate::PlanError), up to 4 limits a plan), but for the sliding window
//!   log, which may have several limits here.
//! - **Batches, opt-in, decided as calls of their own.** With
//!   [`RedisRateLimiterBuilder::batch_size`] above 1 (a single server only), the decisions that
//!   wait while earlier calls are on their way leave together, up to that many in one script
//!   call, which decides each in turn by the very text of the one-request script, in one atomic
//!   step, at one reading of the server's clock: each gets exactly what a call of its own
//!   would have got at that instant, and a request whose own decision fails fails alone (a
//!   failed call fails each of its requests, and is one failure to the breaker). The
//!   server is spared a call's fixed cost per decision (about an eighth of a token bucket's
//!   work); a lone request still goes at once, in a call of its own.
//! - **The in-process decisions, exactly.** The token bucket is the same exact GCRA as
//!   [`TokenBucket`](crate::TokenBucket), in integer ticks of `1/(N/gcd(N, W))` µs that Lua's
//!   doubles hold exactly (a rule whose full bucket would reach 2^50 ticks is refused with
//!   [`RedisError::NotExact`]); the fixed window, sliding log and sliding window counter follow
//!   [`FixedWindow`](crate::FixedWindow), [`SlidingWindowLog`](crate::SlidingWindowLog) and
//!   [`SlidingWindowCounter`](crate::SlidingWindowCounter), with their bounds on the limit
//!   (the fixed window's limit also at most [`MAX_FIXED_WINDOW_LIMIT`](RedisRateLimiter::MAX_FIXED_WINDOW_LIMIT), 2^53, which its count
//!   in a double holds exactly; a larger one is refused with [`RedisError::NotExact`]), and
//!   windows of at most [`MAX_WINDOW_MICROS`](RedisRateLimiter::MAX_WINDOW_MICROS). The counter's estimate
//!   `ceil(P * (W - e) / W) + C` and its exact first instant to retry are computed without
//!   forming a product of a count and a time (which can pass 2^53), and its waits come back to
//!   the nanosecond. Windows must be whole microseconds; figures are reported in nanoseconds
//!   rounded up, so for times in whole microseconds the decisions equal the in-process ones
//!   (tested, the counter also with limits up to 2^30, windows up to [`MAX_WINDOW_MICROS`](RedisRateLimiter::MAX_WINDOW_MICROS) and
//!   an in-process clock counting from the Unix epoch, so that both align their windows alike).
//! - **One clock.** Scripts read the Redis server's `TIME` (scripts replicate by effects since
//!   Redis 7), so nodes with skewed clocks agree. Windows are aligned to the Unix epoch. State
//!   never moves backwards: a server clock that steps back is met with the stored state (a
//!   bucket's TAT, a window's index, a log's latest admission, a counter's window, where a
//!   reading behind it counts at its start), and grants nothing extra. (Only the figures differ
//!   from in process, and only for a step back of more than a window: the bucket's reported
//!   wait is then capped at two windows, to keep its integers exact.)
//! - **Bounded memory.** Every write sets an expiry at the instant the key becomes
//!   indistinguishable from a missing one (a full bucket, a window that is over, a log whose
//!   admissions have all left, a counter whose estimate is 0: once the window after the one
//!   holding its last admission ends), so Redis holds state only for clients active within a
//!   window (two for the counter).
//! - **Failure.** Each round trip is bounded by a timeout (50 ms by default); after 3 failures one
//!   after another (round trips in flight together, which one stall times out together, count
//!   once: see [`CircuitBreaker`]) a circuit breaker opens and no request waits on Redis until a
//!   probe, every 500 ms, succeeds; on a cluster each hash slot has a breaker of its own, so a
//!   master's outage opens the circuits of its slots alone. Meanwhile the
//!   [`FailurePolicy`] decides: return the error, allow, deny, or decide
//!   in process with a share of each limit. [`Answer::source`] and [`RedisStats`] say which
//!   path decided. No panic, no unbounded queue.
//! - **Local deny cache.** A client Redis denied until an instant is denied locally until then,
//!   without a round trip: decisions only make its state less generous. A refund or a give-back
//!   makes it more generous: the node that makes one forgets its own cached denial of the client,
//!   and no node holds a denial for more than a second, so another node's refusals of what Redis
//!   would grant last a second at most (never the reverse: the cache never grants). A refusal answered from the cache reports the figures of the refusal it
//!   remembers. A fixed table (100 000 denials by default), O(1) per request however full.
//!
//! A round trip that times out may still have been applied by Redis: the request is then counted
//! there but decided by the policy, which can only make the fleet admit less.
//!
//! # All or nothing across plans or limiters
//!
//! A request that must pass several limiters at once (each on its own keys, which on a cluster
//! may live on different nodes, so no one script can take them all) takes from each by
//! [`RedisRateLimiter::reserve`] and, when one refuses, gives back what the others granted by
//! [`RedisRateLimiter::give_back`]. A reserving call is one round trip, as a decision is, that
//! also reports each key's value before and after the grant (`DUMP`, with its expiry; of a
//! sliding log, its newest batch and the oldest ones the commit may drop: bounded work, 0.4 ms
//! on a log of 65,000 batches where a `DUMP` of it took 15-38 ms), and writes a record of the
//! grant that the give-back consumes (a grant is given back at most once); the
//! give-back, one more, restores the value from before, with its expiry, while the key still
//! holds the grant's own value (exact: as if the grant had not been made), and otherwise gives
//! back only what leaves the limit counting every admission that stands: the windows take the
//! permits off the window they were counted in, the token bucket and the sliding log keep the
//! grant. (A reading older than one the key has seen, from a server's clock stepped back, is
//! counted in the stored state by each method's rule, with the grant or without it.) Checked by
//! `tests/redis_give_back.rs` against the same history without the grant, and by
//! `tests/envoy_race.rs` under a race. The server must let scripts call `DUMP` and `RESTORE`.
//!
//! [`RedisRateLimiter::refund`] gives permits taken earlier back (Envoy's `is_negative_hits`),
//! by the in-process refund's rules (`tests/redis_refund.rs` compares them). A refund or a
//! give-back makes the node forget its cached denial of the client (see the deny cache below).
//!
//! # Key layout
//!
//! `<prefix>:{<plan>:<client>}:<method>:<limit>/<window>us`, for example
//! `tollgate:{Free:alice}:tbs:5/1000000us`: the prefix (default `tollgate`), the hash tag shared
//! by all of a client's keys under one plan (Redis Cluster puts them in one slot), the method
//! (`tbs`, `fw`, `swlb`, `swc`) and the rule, so a changed rule starts afresh. The plan is its
//! `Debug` form without quotes. Values: the bucket is a string, its TAT in whole µs, followed by
//! `:` and the TAT's remainder in ticks when that is not 0 (never when a tick is a microsecond),
//! written with its expiry in one `SET ... PX`; a string of another form under its name is
//! another program's key, as a key of another type is (the bucket was a hash `{t, f}` under
//! `tb`: the new name keeps the two layouts from reading each other's keys during a rolling
//! upgrade); the window a hash `{w: window index, c: count, i: incarnation}` (the server's time
//! when a decision made the key, so that a grant is never given back to a key deleted and made
//! again since); the log a sorted set of batches
//! (the permits one request took at one instant, joined with the newest batch when they share
//! its instant) scored by their expiry in µs, each member `<running total>:<permits>`; the
//! counter a hash `{w: window index, c: count in that window, p: count in the window before,
//! i: incarnation}`.
//! Window indexes count windows since the Unix epoch. A log's work per request does not grow
//! with `n` (a request of 65,536 permits is one member), and a log holds at most `limit`
//! batches: 20-30 bytes each up to 128 batches (a listpack), about 100 bytes each beyond
//! (measured with `MEMORY USAGE`: 6.2-6.6 MB for 65,536 batches of one permit, 170-190 bytes for
//! one batch of 65,536).

mod batch;
mod builder;
mod connection;
mod deny_cache;
mod error;
mod fallback;
mod limiter;
mod policy;
mod script;
mod stats;
mod url;

pub use builder::RedisRateLimiterBuilder;
pub use error::RedisError;
pub use limiter::{Answer, GivenBack, RedisGrant, RedisRateLimiter};
pub use policy::{CircuitBreaker, FailurePolicy, Source};
pub use stats::RedisStats;
