//! The Lua scripts and their interface: one limit's arguments in, its `Decision` out.
//!
//! Every script takes the same shape, so that one call decides a plan with several limits, all
//! or nothing: KEYS = one key per limit, ARGV = `n`, the mode (`acquire` or `peek`), the time
//! override (`""` for the server's `TIME`), then each limit's parameters in order. The reply is
//! `{code, index, now_us}` and four integers per limit: allowed, remaining, retry_after,
//! reset_after (code 1: allowed and committed; 0: denied, nothing written; -1: `KEYS[index]`
//! holds another type, nothing written); for a plan of one limit decided without reserving, the
//! limit's integers alone (its allowed is the code), since each item of a reply costs the
//! server. The sliding window counter's waits are not whole
//! microseconds: its limits reply five integers, the fifth the nanoseconds by which its
//! retry_after, rounded up to microseconds, overstates the wait.
//!
//! What the scripts share is written once: `scripts/prelude.lua`, run before each (the arguments,
//! the clock, the keys' expiry), and `scripts/plan.lua`, run after each: the plan's decision,
//! which asks the script for each limit's figures in order and commits every limit only if none
//! refused and permits are taken. A script itself holds only its method: how one limit decides,
//! with the first read of its key (whose `WRONGTYPE` error, not a `TYPE` per key, tells another
//! program's key from ours), and what committing it writes (every key written is given its
//! expiry). The window scripts also take `scripts/div.lua`. The shared parts are values and
//! top-level code rather than functions: the script's body runs on every call, and every
//! function it makes is a closure made, and collected, on every call. For the same reason each
//! method's decision and commit are sections of text that [`compose`] writes into the plan where
//! it uses them (the window counter keeps `div` and `mul_div` as functions, the log its three
//! helpers).

use std::sync::LazyLock;

use ::redis::{Script, ScriptInvocation};

use super::RedisError;
use crate::decision::Rejection;
use crate::method::token_bucket::gcd;
use crate::{Algorithm, Decision, Rule};

pub(super) static TOKEN_BUCKET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&compose(
        &[include_str!("scripts/prelude.lua")],
        include_str!("scripts/token_bucket.lua"),
    ))
});
pub(super) static FIXED_WINDOW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&compose(
        &[include_str!("scripts/prelude.lua")],
        include_str!("scripts/fixed_window.lua"),
    ))
});
pub(super) static SLIDING_WINDOW_LOG: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&compose(
        &[include_str!("scripts/prelude.lua")],
        include_str!("scripts/sliding_window_log.lua"),
    ))
});
pub(super) static SLIDING_WINDOW_COUNTER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&compose(
        &[
            include_str!("scripts/prelude.lua"),
            include_str!("scripts/div.lua"),
        ],
        include_str!("scripts/sliding_window_counter.lua"),
    ))
});

/// The batch scripts (see [`compose_batch`]), one per method.
pub(super) static TOKEN_BUCKET_BATCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&compose_batch(
        &[],
        include_str!("scripts/token_bucket.lua"),
    ))
});
pub(super) static FIXED_WINDOW_BATCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&compose_batch(
        &[],
        include_str!("scripts/fixed_window.lua"),
    ))
});
pub(super) static SLIDING_WINDOW_LOG_BATCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&compose_batch(
        &[],
        include_str!("scripts/sliding_window_log.lua"),
    ))
});
pub(super) static SLIDING_WINDOW_COUNTER_BATCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&compose_batch(
        &[include_str!("scripts/div.lua")],
        include_str!("scripts/sliding_window_counter.lua"),
    ))
});

/// A method's script: `shared` (the prelude, and the window scripts' `div.lua`), the method's
/// own definitions (what comes before its `-- @decide` line), then `scripts/plan.lua` with the
/// method's decision (its `-- @decide` section) written in at each `-- @decide` line of the
/// plan, inside `repeat ... until true` so that a `break` ends it, and its commit (its
/// `-- @commit` section) at each `-- @commit` line, inside `do ... end`. Written in, not called:
/// a function in a script is a closure made and collected on every call, about 2,000 server
/// instructions each.
fn compose(shared: &[&str], method: &str) -> String {
    let (definitions, plan) = method_plan(method);
    let mut script = shared.concat();
    script.push_str(&definitions);
    script.push('\n');
    script.push_str(&plan);
    script
}

/// A method's batch script (see `scripts/batch.lua`): the frame's `-- @definitions` line
/// replaced by `extra` (the window scripts' `div.lua`) and the method's definitions, made once
/// per call; its `-- @request` line by the prelude and the plan as [`compose`] writes them, the
/// body of a function called once per request. In that body every `KEYS[` reads
/// `KEYS[ko + `, every `ARGV[` reads `ARGV[ao + ` and `#KEYS` reads `limit_count` (the request's
/// own keys and arguments), and the prelude's read of the server's clock is the batch's one.
fn compose_batch(extra: &[&str], method: &str) -> String {
    let (definitions, plan) = method_plan(method);
    let prelude = include_str!("scripts/prelude.lua").replace("\r\n", "\n");
    let clock_read = "local time = redis.call('TIME')";
    debug_assert_eq!(prelude.matches(clock_read).count(), 1);
    let request = [prelude.replace(clock_read, "local time = batch_time"), plan]
        .concat()
        .replace("KEYS[", "KEYS[ko + ")
        .replace("ARGV[", "ARGV[ao + ")
        .replace("#KEYS", "limit_count");
    let frame = include_str!("scripts/batch.lua").replace("\r\n", "\n");
    let mut script = String::with_capacity(frame.len() + request.len() + definitions.len());
    for line in frame.lines() {
        match line.trim() {
            "-- @definitions" => {
                script.push_str(&extra.concat());
                script.push_str(&definitions);
                script.push('\n');
            }
            "-- @request" => script.push_str(&request),
            _ => {
                script.push_str(line);
                script.push('\n');
            }
        }
    }
    script
}

/// A method's definitions (what its file holds before its `-- @decide` line), and
/// `scripts/plan.lua` with the method's decision and commit written in (see [`compose`]).
fn method_plan(method: &str) -> (String, String) {
    // A checkout may have written the files with CRLF line ends.
    let method = method.replace("\r\n", "\n");
    let (definitions, sections) = method
        .split_once("\n-- @decide\n")
        .expect("a method's script has a `-- @decide` section");
    let (decide, commit) = sections
        .split_once("\n-- @commit\n")
        .expect("a method's script has a `-- @commit` section after its decision");
    let mut plan = String::new();
    for line in include_str!("scripts/plan.lua").lines() {
        let (open, section, close) = match line.trim() {
            "-- @decide" => ("repeat\n", decide, "\nuntil true\n"),
            "-- @commit" => ("do\n", commit, "\nend\n"),
            _ => {
                plan.push_str(line);
                plan.push('\n');
                continue;
            }
        };
        plan.push_str(open);
        plan.push_str(section);
        plan.push_str(close);
    }
    (definitions.to_owned(), plan)
}

/// The script giving back a reserving call's grant (for every method: it names its own).
pub(super) static GIVE_BACK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/give_back.lua")));

/// The script giving permits back to a plan's limits (a refund; for every method: it names its
/// own).
pub(super) static REFUND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/div.lua"),
        include_str!("scripts/refund.lua")
    ))
});

/// The script deciding for `algorithm`.
pub(super) fn script_for(algorithm: Algorithm) -> &'static Script {
    match algorithm {
        Algorithm::TokenBucket => &TOKEN_BUCKET,
        Algorithm::FixedWindow => &FIXED_WINDOW,
        Algorithm::SlidingWindowLog => &SLIDING_WINDOW_LOG,
        Algorithm::SlidingWindowCounter => &SLIDING_WINDOW_COUNTER,
    }
}

/// The batch script deciding for `algorithm` (see `scripts/batch.lua`).
pub(super) fn batch_script_for(algorithm: Algorithm) -> &'static Script {
    match algorithm {
        Algorithm::TokenBucket => &TOKEN_BUCKET_BATCH,
        Algorithm::FixedWindow => &FIXED_WINDOW_BATCH,
        Algorithm::SlidingWindowLog => &SLIDING_WINDOW_LOG_BATCH,
        Algorithm::SlidingWindowCounter => &SLIDING_WINDOW_COUNTER_BATCH,
    }
}

/// The largest full bucket, in ticks, the token bucket script accepts. A debt is capped at two
/// full buckets (more only comes from a clock stepped back) and a request adds at most one, so
/// every tick count stays below 3 * 2^50, and a TAT (now plus at most three windows of whole
/// microseconds) below 2^53, where Lua's doubles stop being exact, until the year 2148.
pub(super) const MAX_BURST_TICKS: u64 = 1 << 50;

/// The longest window the window scripts accept, in microseconds: a window index times the
/// window, plus two windows (the sliding window counter's window after next), stays below 2^53
/// for any time before the year 2184.
pub(super) const MAX_WINDOW_MICROS: u64 = 1 << 50;

/// The largest fixed-window limit the script accepts: every count, remaining count and request
/// it handles is an integer from 0 to the limit, all exact in Lua's doubles up to 2^53 (the
/// script compares a request with what is left, never with a sum that could pass 2^53).
pub(super) const MAX_FIXED_WINDOW_LIMIT: u64 = 1 << 53;

/// What [`RedisError::NotExact`] names as out of bounds, each with its own remedy.
pub(super) const NOT_EXACT_BURST: &str = "a full bucket of ticks";
pub(super) const NOT_EXACT_WINDOW: &str = "a window in microseconds of";
pub(super) const NOT_EXACT_LIMIT: &str = "a limit of";

/// Reply codes (see the module docs).
pub(super) const CODE_ALLOWED: i64 = 1;
pub(super) const CODE_DENIED: i64 = 0;
pub(super) const CODE_WRONG_TYPE: i64 = -1;

/// One limit of a plan, as its script needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LimitSpec {
    /// Exact GCRA in ticks of `1 / ticks_per_us` µs: `g = gcd(N, W_us)`, `ticks_per_us = N / g`,
    /// one token `W_us / g` ticks, a full bucket `N * token` ticks.
    TokenBucket {
        rule: Rule,
        ticks_per_us: u64,
        token_ticks: u64,
        burst_ticks: u64,
    },
    FixedWindow {
        rule: Rule,
        window_us: u64,
    },
    SlidingWindowLog {
        rule: Rule,
        window_us: u64,
    },
    SlidingWindowCounter {
        rule: Rule,
        window_us: u64,
    },
}

impl LimitSpec {
    /// The script's parameters for `rule`, or why the script cannot keep it exact. The sliding
    /// log's and counter's limits are bounded as the scripts need by the in-process bounds,
    /// which the builder checks with the plans before it makes a limiter.
    pub(super) fn new(algorithm: Algorithm, rule: Rule, plan: &str) -> Result<Self, RedisError> {
        let window_nanos = rule.window_nanos();
        if !window_nanos.is_multiple_of(1_000) {
            return Err(RedisError::WindowNotMicroseconds {
                plan: plan.to_owned(),
                window: rule.window(),
            });
        }
        let window_us = window_nanos / 1_000;
        let not_exact = |what, value, max| RedisError::NotExact {
            plan: plan.to_owned(),
            rule,
            what,
            value,
            max,
        };
        match algorithm {
            Algorithm::TokenBucket => {
                let limit = rule.limit();
                let g = gcd(limit, window_us);
                let ticks_per_us = limit / g;
                let token_ticks = window_us / g;
                let burst = u128::from(ticks_per_us) * u128::from(window_us);
                if burst > u128::from(MAX_BURST_TICKS) {
                    return Err(not_exact(NOT_EXACT_BURST, burst, MAX_BURST_TICKS));
                }
                Ok(LimitSpec::TokenBucket {
                    rule,
                    ticks_per_us,
                    token_ticks,
                    // Fits: at most 2^50.
                    burst_ticks: burst as u64,
                })
            }
            Algorithm::FixedWindow
            | Algorithm::SlidingWindowLog
            | Algorithm::SlidingWindowCounter => {
                if window_us > MAX_WINDOW_MICROS {
                    return Err(not_exact(
                        NOT_EXACT_WINDOW,
                        u128::from(window_us),
                        MAX_WINDOW_MICROS,
                    ));
                }
                match algorithm {
                    Algorithm::FixedWindow => {
                        // The in-process bound is near 2^63; the script's count is a double.
                        if rule.limit() > MAX_FIXED_WINDOW_LIMIT {
                            return Err(not_exact(
                                NOT_EXACT_LIMIT,
                                u128::from(rule.limit()),
                                MAX_FIXED_WINDOW_LIMIT,
                            ));
                        }
                        Ok(LimitSpec::FixedWindow { rule, window_us })
                    }
                    // One sorted-set member per batch, at most `limit` of them: the
                    // in-process bound on the limit bounds the key.
                    Algorithm::SlidingWindowLog => {
                        Ok(LimitSpec::SlidingWindowLog { rule, window_us })
                    }
                    // The in-process bound keeps the limit below 2^31: the script's exact
                    // quotients of a count times a time need counts below 2^32.
                    _ => Ok(LimitSpec::SlidingWindowCounter { rule, window_us }),
                }
            }
        }
    }

    pub(super) fn rule(&self) -> Rule {
        match *self {
            LimitSpec::TokenBucket { rule, .. }
            | LimitSpec::FixedWindow { rule, .. }
            | LimitSpec::SlidingWindowLog { rule, .. }
            | LimitSpec::SlidingWindowCounter { rule, .. } => rule,
        }
    }

    /// The short name of the method in keys. A method whose value layout changed names the new
    /// one, so that no node reads a key kept in the earlier layout as its own during a rolling
    /// upgrade: the two start apart. The bucket's is `tbs` (one string, written with its expiry;
    /// `tb` was a hash), the sliding log's `swlb` (one member per batch; `swl` was one member
    /// per permit).
    pub(super) fn method_tag(&self) -> &'static str {
        match self {
            LimitSpec::TokenBucket { .. } => "tbs",
            LimitSpec::FixedWindow { .. } => "fw",
            LimitSpec::SlidingWindowLog { .. } => "swlb",
            LimitSpec::SlidingWindowCounter { .. } => "swc",
        }
    }

    /// The method as `scripts/give_back.lua` and `scripts/refund.lua` name it.
    pub(super) fn give_back_name(&self) -> &'static str {
        match self {
            LimitSpec::TokenBucket { .. } => "token_bucket",
            LimitSpec::FixedWindow { .. } => "fixed_window",
            LimitSpec::SlidingWindowLog { .. } => "sliding_window_log",
            LimitSpec::SlidingWindowCounter { .. } => "sliding_window_counter",
        }
    }

    /// How many integers of the script's reply this limit's decision takes.
    pub(super) fn figure_count(&self) -> usize {
        match self {
            LimitSpec::SlidingWindowCounter { .. } => 5,
            _ => 4,
        }
    }

    /// The key suffix naming this limit: method and rule, so that a changed rule starts afresh
    /// (the old state expires on its own) instead of being read under the new one.
    pub(super) fn key_suffix(&self) -> String {
        let rule = self.rule();
        format!(
            "{}:{}/{}us",
            self.method_tag(),
            rule.limit(),
            rule.window_nanos() / 1_000
        )
    }

    /// The decision for `n` permits that needs no round trip: one that can never be granted.
    pub(super) fn reject(&self, n: u64) -> Option<Decision> {
        let rule = self.rule();
        if n > rule.limit() {
            let rejection = Rejection::ExceedsLimit {
                requested: n,
                limit: rule.limit(),
            };
            return Some(Decision::rejected(rule, rejection));
        }
        None
    }

    /// Appends this limit's parameters to `invocation`.
    pub(super) fn push_args(&self, invocation: &mut ScriptInvocation<'_>) {
        for param in self.params() {
            invocation.arg(param);
        }
    }

    /// This limit's parameters, as its script takes them: the bucket's ticks per microsecond,
    /// ticks per permit and ticks of a full bucket; a window's limit and length in microseconds.
    pub(super) fn params(&self) -> impl Iterator<Item = u64> + use<> {
        let (params, len) = match *self {
            LimitSpec::TokenBucket {
                ticks_per_us,
                token_ticks,
                burst_ticks,
                ..
            } => ([ticks_per_us, token_ticks, burst_ticks], 3),
            LimitSpec::FixedWindow { rule, window_us }
            | LimitSpec::SlidingWindowLog { rule, window_us }
            | LimitSpec::SlidingWindowCounter { rule, window_us } => {
                ([rule.limit(), window_us, 0], 2)
            }
        };
        params.into_iter().take(len)
    }

    /// The decision this limit's reply integers say ([`LimitSpec::figure_count`] of them; a
    /// missing one reads 0).
    ///
    /// Times come back in the script's units (ticks of the bucket, microseconds of the windows)
    /// and are turned into nanoseconds rounded up, as the in-process limiters round their ticks:
    /// for times and windows in whole microseconds the two answer the same figures. The
    /// counter's wait comes as whole microseconds and the nanoseconds they overstate it by.
    pub(super) fn decision(&self, figures: &[i64]) -> Decision {
        let figure = |i: usize| {
            figures
                .get(i)
                .and_then(|&x| u64::try_from(x).ok())
                .unwrap_or(0)
        };
        let (allowed, remaining, retry_after) = (figure(0), figure(1), figure(2));
        let reset_after = figure(self.figure_count() - 1);
        let rule = self.rule();
        let (remaining, retry_after, reset_after) = match *self {
            LimitSpec::TokenBucket {
                ticks_per_us,
                token_ticks,
                ..
            } => {
                let nanos = |ticks: u64| {
                    let nanos = (u128::from(ticks) * 1_000).div_ceil(u128::from(ticks_per_us));
                    u64::try_from(nanos).unwrap_or(u64::MAX)
                };
                (
                    remaining / token_ticks.max(1),
                    nanos(retry_after),
                    nanos(reset_after),
                )
            }
            LimitSpec::FixedWindow { .. } | LimitSpec::SlidingWindowLog { .. } => (
                remaining,
                retry_after.saturating_mul(1_000),
                reset_after.saturating_mul(1_000),
            ),
            LimitSpec::SlidingWindowCounter { .. } => (
                remaining,
                retry_after.saturating_mul(1_000).saturating_sub(figure(3)),
                reset_after.saturating_mul(1_000),
            ),
        };
        if allowed == 1 {
            Decision::allowed(rule, remaining, reset_after)
        } else {
            Decision::denied(rule, remaining, retry_after, reset_after)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const METHODS: [&str; 4] = [
        include_str!("scripts/token_bucket.lua"),
        include_str!("scripts/fixed_window.lua"),
        include_str!("scripts/sliding_window_log.lua"),
        include_str!("scripts/sliding_window_counter.lua"),
    ];

    /// Every marker of the plan is written over, with each section in its block, and a method
    /// file checked out with CRLF line ends composes the same script.
    #[test]
    fn every_method_composes_into_every_place_of_the_plan() {
        let places = include_str!("scripts/plan.lua")
            .lines()
            .filter(|line| matches!(line.trim(), "-- @decide" | "-- @commit"))
            .count();
        assert_eq!(
            places, 5,
            "the plan decides in two places and commits in three"
        );
        for method in METHODS {
            let script = compose(&[], method);
            assert!(
                !script
                    .lines()
                    .any(|line| matches!(line.trim(), "-- @decide" | "-- @commit")),
                "a marker left in:\n{script}"
            );
            assert_eq!(script.matches("\nrepeat\n").count(), 2);
            assert_eq!(script.matches("\nuntil true\n").count(), 2);
            assert_eq!(compose(&[], &method.replace('\n', "\r\n")), script);
        }
    }

    /// A batch script holds each method's definitions once, outside the function a request is
    /// decided by, and they read no request's keys or arguments (those are the function's,
    /// offset to its request); inside it, every read of `KEYS` and `ARGV` is offset and the
    /// prelude's read of the clock is the batch's.
    #[test]
    fn a_batch_script_offsets_every_read_of_a_request() {
        for method in METHODS {
            let script = compose_batch(&[], method);
            let (outside, inside) = script
                .split_once("local function decide_one(ko, ao, limit_count)\n")
                .expect("the request's function");
            let (inside, after) = inside
                .split_once("\nend\nlocal replies = {}\n")
                .expect("its end, then the loop over the requests");
            let code = |text: &str| -> String {
                text.lines()
                    .map(|line| line.split("--").next().unwrap_or(""))
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            for part in [code(outside), code(after)] {
                assert!(!part.contains("KEYS"), "{part}");
                assert!(
                    !part
                        .replace("ARGV[ao + 1]", "")
                        .replace("ARGV[ao + 2]", "")
                        .replace("ARGV[1]", "")
                        .contains("ARGV"),
                    "{part}"
                );
            }
            let inside = code(inside);
            assert_eq!(
                inside.matches("KEYS[").count(),
                inside.matches("KEYS[ko + ").count()
            );
            assert_eq!(
                inside.matches("ARGV[").count(),
                inside.matches("ARGV[ao + ").count()
            );
            assert!(!inside.contains("#KEYS") && !inside.contains("redis.call('TIME')\n  now"));
            assert!(inside.contains("local time = batch_time"));
            assert!(!script.lines().any(|line| matches!(
                line.trim(),
                "-- @decide" | "-- @commit" | "-- @definitions" | "-- @request"
            )));
            assert_eq!(compose_batch(&[], &method.replace('\n', "\r\n")), script);
        }
    }
}
