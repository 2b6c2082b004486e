//! Response header values from a [`Decision`]: `Retry-After` and the IETF `RateLimit` /
//! `RateLimit-Policy` fields (draft-ietf-httpapi-ratelimit-headers), as plain strings, so no
//! HTTP crate is needed.
//!
//! The draft's fields are Structured Field lists of one item per policy: the policy's name as a
//! String, with integer parameters `q` (quota) and `w` (window, seconds) for the policy, and `r`
//! (remaining) and `t` (seconds until the quota resets) for the live state. All durations are
//! whole seconds rounded *up*, so a client that waits as told is never early.
//!
//! Every integer written is a valid Structured Field Integer (RFC 9651, section 3.3.1: at most
//! 15 digits), so a conforming parser never drops the field: a figure above
//! [`Decision::MAX_FIELD_INTEGER`] (999,999,999,999,999) is written as that value, which then
//! means *at least* that much: a quota `q` or remaining count `r` of at least that many permits
//! (a limit of 2^60 is sent as `q=999999999999999`), a window `w` or reset `t` at least that many
//! seconds away. Only the quota and the remaining count can reach it (a limit above 10^15 - 1);
//! a window or reset, at most 2^64 nanoseconds, is at most 11 digits of seconds.

use std::fmt;
use std::time::Duration;

use crate::Decision;

/// A policy name that cannot be written as a Structured Field String.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidPolicyName {
    name: String,
}

impl fmt::Display for InvalidPolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "policy name {:?} is invalid: it must be non-empty printable ASCII (0x20 to 0x7E)",
            self.name
        )
    }
}

impl std::error::Error for InvalidPolicyName {}

/// `name` as a Structured Field String: quoted, with `"` and `\` escaped.
fn sf_string(name: &str) -> Result<String, InvalidPolicyName> {
    if name.is_empty() || !name.bytes().all(|byte| (0x20..=0x7e).contains(&byte)) {
        return Err(InvalidPolicyName {
            name: name.to_owned(),
        });
    }
    let mut quoted = String::with_capacity(name.len() + 2);
    quoted.push('"');
    for c in name.chars() {
        if c == '"' || c == '\\' {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('"');
    Ok(quoted)
}

/// Whole seconds in `d`, rounded up.
fn seconds_rounded_up(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// `value` as a Structured Field Integer: clamped to the largest one, so the field stays valid
/// (see the module docs for what a clamped value means).
fn sf_integer(value: u64) -> u64 {
    value.min(Decision::MAX_FIELD_INTEGER)
}

impl Decision {
    /// The largest integer a Structured Field can carry (RFC 9651, section 3.3.1: at most 15
    /// digits). The `RateLimit` and `RateLimit-Policy` fields write a larger figure as this one,
    /// meaning *at least* that many permits, or seconds.
    pub const MAX_FIELD_INTEGER: u64 = 999_999_999_999_999;

    /// The `Retry-After` value for a denied request: seconds to wait, rounded up (at least 1).
    /// `None` when the request was allowed, or can never be granted as asked (see
    /// [`Decision::rejection`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, Limiter, Rule, TokenBucket};
    ///
    /// let bucket = TokenBucket::new(Rule::per_minute(2)?, FakeClock::new())?;
    /// assert_eq!(bucket.try_acquire_n(2).retry_after_header(), None);
    /// // One token refills every 30 s.
    /// assert_eq!(bucket.try_acquire_n(1).retry_after_header().as_deref(), Some("30"));
    /// # Ok::<(), tollgate::RuleError>(())
    /// ```
    pub fn retry_after_header(&self) -> Option<String> {
        if self.is_allowed() || self.rejection().is_some() {
            return None;
        }
        Some(seconds_rounded_up(self.retry_after()).max(1).to_string())
    }

    /// The `RateLimit-Policy` value for the rule that decided, named `policy`:
    /// `"policy";q=LIMIT;w=WINDOW_SECONDS`. A window shorter than a second, or not a whole number
    /// of seconds, is rounded up.
    ///
    /// Always a valid field: a limit above [`Decision::MAX_FIELD_INTEGER`] is written as that
    /// value, a quota of *at least* that many (and likewise a window of at least that many
    /// seconds, which no [`Rule`](crate::Rule) reaches).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, FixedWindow, Limiter, Rule};
    ///
    /// let window = FixedWindow::new(Rule::per_minute(100)?, FakeClock::new())?;
    /// let decision = window.peek();
    /// assert_eq!(decision.ratelimit_policy_header("free")?, r#""free";q=100;w=60"#);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidPolicyName`] when `policy` is empty or not printable ASCII.
    pub fn ratelimit_policy_header(&self, policy: &str) -> Result<String, InvalidPolicyName> {
        Ok(format!(
            "{};q={};w={}",
            sf_string(policy)?,
            sf_integer(self.limit()),
            sf_integer(seconds_rounded_up(self.window()).max(1))
        ))
    }

    /// The `RateLimit` value after this decision, for the policy named `policy`:
    /// `"policy";r=REMAINING;t=RESET_SECONDS`, the reset rounded up.
    ///
    /// Always a valid field: a remaining count above [`Decision::MAX_FIELD_INTEGER`] is written as
    /// that value, *at least* that many left (and likewise a reset at least that many seconds
    /// away, which no decision reaches).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{FakeClock, FixedWindow, Limiter, Rule};
    ///
    /// let clock = FakeClock::starting_at(Duration::from_secs(45));
    /// let window = FixedWindow::new(Rule::per_minute(100)?, clock)?;
    /// let decision = window.try_acquire_n(40);
    /// assert_eq!(decision.ratelimit_header("free")?, r#""free";r=60;t=15"#);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidPolicyName`] when `policy` is empty or not printable ASCII.
    pub fn ratelimit_header(&self, policy: &str) -> Result<String, InvalidPolicyName> {
        Ok(format!(
            "{};r={};t={}",
            sf_string(policy)?,
            sf_integer(self.remaining()),
            sf_integer(seconds_rounded_up(self.reset_after()))
        ))
    }
}

/// A window as the shortest whole number of one unit: `1s`, `10s`, `1h`, `1500ms`.
fn compact_window(window: Duration) -> String {
    let nanos = window.as_nanos();
    for (unit, name) in [
        (86_400_000_000_000u128, "d"),
        (3_600_000_000_000, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
    ] {
        if nanos.is_multiple_of(unit) {
            return format!("{}{name}", nanos / unit);
        }
    }
    format!("{nanos}ns")
}

/// The name of limit `position` of a plan named `plan` with `count` limits: the plan's own name
/// when it has one limit, else the plan's name and the limit's window (`"pro-1s"`, `"pro-1h"`),
/// and the position too should two limits share a window.
fn policy_name(plan: &str, decisions: &[Decision], position: usize) -> String {
    if decisions.len() == 1 {
        return plan.to_owned();
    }
    let window = decisions[position].window();
    if decisions.iter().filter(|d| d.window() == window).count() > 1 {
        format!("{plan}-{}-{position}", compact_window(window))
    } else {
        format!("{plan}-{}", compact_window(window))
    }
}

/// The `RateLimit-Policy` and `RateLimit` field values for every limit of one plan, one list item
/// per limit, from each limit's own decision (see `RateLimiterService::ratelimit_headers`).
/// Every integer is within a Structured Field Integer's 15 digits: a larger figure is written as
/// [`Decision::MAX_FIELD_INTEGER`], meaning at least that much (see the module docs).
pub(crate) fn policy_list(
    plan: &str,
    decisions: &[Decision],
) -> Result<(String, String), InvalidPolicyName> {
    let mut policy = String::new();
    let mut ratelimit = String::new();
    for (position, decision) in decisions.iter().enumerate() {
        let name = policy_name(plan, decisions, position);
        if position > 0 {
            policy.push_str(", ");
            ratelimit.push_str(", ");
        }
        policy.push_str(&decision.ratelimit_policy_header(&name)?);
        ratelimit.push_str(&decision.ratelimit_header(&name)?);
    }
    Ok((policy, ratelimit))
}
