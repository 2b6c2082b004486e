//! Response header values from a [`Decision`]: `Retry-After` and the IETF `RateLimit` /
//! `RateLimit-Policy` fields (draft-ietf-httpapi-ratelimit-headers), as plain strings, so no
//! HTTP crate is needed. Their text is written in one place, `RateLimitFields`, into the
//! strings here and, by the tower layer, straight into its header values.
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

/// Whole seconds in `nanos`, rounded up.
fn seconds_rounded_up(nanos: u64) -> u64 {
    nanos.div_ceil(1_000_000_000)
}

/// `value` as a Structured Field Integer: clamped to the largest one, so the field stays valid
/// (see the module docs for what a clamped value means).
fn sf_integer(value: u64) -> u64 {
    value.min(Decision::MAX_FIELD_INTEGER)
}

/// One limit's figures, as the `RateLimit-Policy` and `RateLimit` fields report them: its quota
/// and window, and what is left of it after a decision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LimitFigures {
    limit: u64,
    window_nanos: u64,
    remaining: u64,
    reset_after_nanos: u64,
}

impl LimitFigures {
    /// What `decision` reports of the limit that made it.
    #[inline]
    pub(crate) fn of(decision: &Decision) -> LimitFigures {
        LimitFigures {
            limit: decision.limit(),
            window_nanos: crate::clock::duration_to_nanos(decision.window()),
            remaining: decision.remaining(),
            reset_after_nanos: crate::clock::duration_to_nanos(decision.reset_after()),
        }
    }
}

/// Each limit's quota and window (nanoseconds), in order: all that a plan's `RateLimit-Policy`
/// value says of its limits, kept beside a value written once (the tower layer's default plan,
/// the Envoy service's prepared fields) to tell whether a decision's limits are those it was
/// written for.
#[cfg(any(feature = "tower", feature = "envoy"))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PolicyLimits(Box<[(u64, u64)]>);

#[cfg(any(feature = "tower", feature = "envoy"))]
impl PolicyLimits {
    /// The quotas and windows of `limits`.
    pub(crate) fn of(limits: &[LimitFigures]) -> Self {
        PolicyLimits(
            limits
                .iter()
                .map(|limit| (limit.limit, limit.window_nanos))
                .collect(),
        )
    }

    /// Whether `limits` are as many, and of the same quotas and windows in the same order.
    #[inline]
    pub(crate) fn are_of(&self, limits: &[LimitFigures]) -> bool {
        self.0.len() == limits.len()
            && self.0.iter().zip(limits).all(|(&(quota, window), limit)| {
                limit.limit == quota && limit.window_nanos == window
            })
    }
}

/// The `RateLimit-Policy` and `RateLimit` field values of one plan, one list item per limit:
/// the one text that both the strings of this module and the tower layer's header values are
/// written from.
///
/// An item is named `plan` when the plan has one limit, and `plan-WINDOW` (`"pro-1s"`,
/// `"pro-1h"`) when it has several, with the limit's position too should two share a window.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RateLimitFields<'a> {
    plan: &'a str,
    limits: &'a [LimitFigures],
}

impl<'a> RateLimitFields<'a> {
    /// The fields of the plan named `plan` whose limits stand as `limits` say (at least one).
    ///
    /// # Errors
    ///
    /// [`InvalidPolicyName`] when `plan` is empty or not printable ASCII, which a Structured
    /// Field String cannot hold.
    pub(crate) fn new(
        plan: &'a str,
        limits: &'a [LimitFigures],
    ) -> Result<Self, InvalidPolicyName> {
        if plan.is_empty() || !plan.bytes().all(|byte| (0x20..=0x7e).contains(&byte)) {
            return Err(InvalidPolicyName {
                name: plan.to_owned(),
            });
        }
        Ok(RateLimitFields { plan, limits })
    }

    /// Writes the `RateLimit-Policy` value: `"name";q=LIMIT;w=WINDOW_SECONDS` per limit.
    pub(crate) fn write_policy(&self, out: &mut impl FieldWrite) -> fmt::Result {
        for (position, limit) in self.limits.iter().enumerate() {
            self.write_item_name(out, position)?;
            out.write_str(";q=")?;
            write_integer(out, sf_integer(limit.limit))?;
            out.write_str(";w=")?;
            write_integer(
                out,
                sf_integer(seconds_rounded_up(limit.window_nanos).max(1)),
            )?;
        }
        Ok(())
    }

    /// Writes the `RateLimit` value: `"name";r=REMAINING;t=RESET_SECONDS` per limit.
    pub(crate) fn write_state(&self, out: &mut impl FieldWrite) -> fmt::Result {
        for (position, limit) in self.limits.iter().enumerate() {
            self.write_item_name(out, position)?;
            write_state_parameters(out, limit)?;
        }
        Ok(())
    }

    /// Writes the list separator before any item but the first, and the item's name.
    fn write_item_name(&self, out: &mut impl FieldWrite, position: usize) -> fmt::Result {
        if position > 0 {
            out.write_str(", ")?;
        }
        self.write_quoted_name(out, position)
    }

    /// Writes the name of the item at `position` as a Structured Field String: quoted, with
    /// `"` and `\` escaped.
    fn write_quoted_name(&self, out: &mut impl FieldWrite, position: usize) -> fmt::Result {
        out.write_char('"')?;
        let mut rest = self.plan;
        // A byte search: both are ASCII, so a match is a whole character (and much cheaper to
        // find than by decoding each character).
        while let Some(at) = rest.bytes().position(|byte| byte == b'"' || byte == b'\\') {
            out.write_str(&rest[..at])?;
            out.write_char('\\')?;
            out.write_str(&rest[at..=at])?;
            rest = &rest[at + 1..];
        }
        out.write_str(rest)?;
        if self.limits.len() > 1 {
            let window = self.limits[position].window_nanos;
            out.write_char('-')?;
            write_compact_window(out, window)?;
            if self
                .limits
                .iter()
                .filter(|limit| limit.window_nanos == window)
                .count()
                > 1
            {
                out.write_char('-')?;
                write_integer(out, position as u64)?;
            }
        }
        out.write_char('"')
    }
}

/// One plan's fields made ready for a writer that answers many requests for it (the Envoy
/// service): the `RateLimit-Policy` value, which only the limits' quotas and windows make, and
/// each `RateLimit` item's name with its `;r=`, written once; a request then writes only its
/// figures.
#[cfg(feature = "envoy")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PreparedFields {
    /// The limits the prepared text says.
    limits: PolicyLimits,
    policy: String,
    /// Each item's quoted name.
    state_items: Vec<String>,
}

#[cfg(feature = "envoy")]
impl PreparedFields {
    /// The fields of the plan named `plan` with `limits` (at least one).
    ///
    /// # Errors
    ///
    /// As [`RateLimitFields::new`].
    pub(crate) fn new(plan: &str, limits: &[LimitFigures]) -> Result<Self, InvalidPolicyName> {
        let fields = RateLimitFields::new(plan, limits)?;
        let mut policy = String::new();
        let _ = fields.write_policy(&mut policy);
        let state_items = (0..limits.len())
            .map(|position| {
                let mut item = String::new();
                let _ = fields.write_quoted_name(&mut item, position);
                item
            })
            .collect();
        Ok(PreparedFields {
            limits: PolicyLimits::of(limits),
            policy,
            state_items,
        })
    }

    /// Appends the fields of a decision whose limits stand as `figures` say to the lists
    /// `policy` and `state`; `false`, writing nothing, when `figures` are not of the prepared
    /// quotas and windows.
    pub(crate) fn append(
        &self,
        policy: &mut String,
        state: &mut String,
        figures: &[LimitFigures],
    ) -> bool {
        if !self.limits.are_of(figures) {
            return false;
        }
        if !policy.is_empty() {
            policy.push_str(", ");
            state.push_str(", ");
        }
        policy.push_str(&self.policy);
        for (position, (figures, item)) in figures.iter().zip(&self.state_items).enumerate() {
            if position > 0 {
                state.push_str(", ");
            }
            state.push_str(item);
            let _ = write_state_parameters(state, figures);
        }
        true
    }
}

/// Writes one `RateLimit` item's parameters: `;r=REMAINING;t=RESET_SECONDS`.
fn write_state_parameters(out: &mut impl FieldWrite, limit: &LimitFigures) -> fmt::Result {
    out.write_str(";r=")?;
    write_integer(out, sf_integer(limit.remaining))?;
    out.write_str(";t=")?;
    write_integer(out, sf_integer(seconds_rounded_up(limit.reset_after_nanos)))
}

/// What the fields' text is written into: a `fmt::Write` that may also take a run of ASCII bytes
/// (an integer's digits) as they are.
pub(crate) trait FieldWrite: fmt::Write {
    /// Writes `ascii`, which holds ASCII bytes only. By default one character at a time; a writer
    /// that holds bytes copies the run at once (a `&str` of them would be checked as UTF-8 first,
    /// which costs more than writing them).
    fn write_ascii(&mut self, ascii: &[u8]) -> fmt::Result {
        ascii
            .iter()
            .try_for_each(|&byte| self.write_char(char::from(byte)))
    }
}

impl FieldWrite for String {}

/// Writes `value` in decimal (without the formatting machinery, which the layer would pay for
/// on every response that carries the fields): four digits per 64-bit division, then two per
/// 32-bit one, from a table of pairs.
pub(crate) fn write_integer(out: &mut impl FieldWrite, value: u64) -> fmt::Result {
    /// `00` to `99`, two bytes each.
    const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
                                2021222324252627282930313233343536373839\
                                4041424344454647484950515253545556575859\
                                6061626364656667686970717273747576777879\
                                8081828384858687888990919293949596979899";
    fn pair(index: u32) -> [u8; 2] {
        let at = index as usize * 2;
        [PAIRS[at], PAIRS[at + 1]]
    }
    // `u64::MAX` has 20 digits: the buffer is filled from its end.
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    let mut value = value;
    while value >= 10_000 {
        let four = (value % 10_000) as u32;
        value /= 10_000;
        start -= 4;
        digits[start..start + 2].copy_from_slice(&pair(four / 100));
        digits[start + 2..start + 4].copy_from_slice(&pair(four % 100));
    }
    // The leading one to four digits: `value` is below 10,000.
    let mut value = value as u32;
    if value >= 100 {
        start -= 2;
        digits[start..start + 2].copy_from_slice(&pair(value % 100));
        value /= 100;
    }
    if value >= 10 {
        start -= 2;
        digits[start..start + 2].copy_from_slice(&pair(value));
    } else {
        start -= 1;
        digits[start] = b'0' + value as u8;
    }
    out.write_ascii(&digits[start..])
}

/// Writes a window as the shortest whole number of one unit: `1s`, `10s`, `1h`, `1500ms`.
fn write_compact_window(out: &mut impl FieldWrite, window_nanos: u64) -> fmt::Result {
    for (unit, name) in [
        (86_400_000_000_000u64, "d"),
        (3_600_000_000_000, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
    ] {
        if window_nanos.is_multiple_of(unit) {
            write_integer(out, window_nanos / unit)?;
            return out.write_str(name);
        }
    }
    write_integer(out, window_nanos)?;
    out.write_str("ns")
}

/// The text `write` writes.
fn written(write: impl FnOnce(&mut String) -> fmt::Result) -> String {
    let mut text = String::new();
    // Writing to a String does not fail.
    let _ = write(&mut text);
    text
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
        self.retry_after_seconds()
            .map(|seconds| seconds.to_string())
    }

    /// The seconds [`Decision::retry_after_header`] writes.
    pub(crate) fn retry_after_seconds(&self) -> Option<u64> {
        if self.is_allowed() || self.rejection().is_some() {
            return None;
        }
        let nanos = crate::clock::duration_to_nanos(self.retry_after());
        Some(seconds_rounded_up(nanos).max(1))
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
        let limits = [LimitFigures::of(self)];
        let fields = RateLimitFields::new(policy, &limits)?;
        Ok(written(|out| fields.write_policy(out)))
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
        let limits = [LimitFigures::of(self)];
        let fields = RateLimitFields::new(policy, &limits)?;
        Ok(written(|out| fields.write_state(out)))
    }
}

/// The `RateLimit-Policy` and `RateLimit` field values for every limit of the plan named `plan`,
/// one list item per limit (see `RateLimiterService::ratelimit_headers`).
pub(crate) fn policy_list(
    plan: &str,
    limits: &[LimitFigures],
) -> Result<(String, String), InvalidPolicyName> {
    let fields = RateLimitFields::new(plan, limits)?;
    Ok((
        written(|out| fields.write_policy(out)),
        written(|out| fields.write_state(out)),
    ))
}

#[cfg(all(test, feature = "envoy"))]
mod tests {
    use super::*;
    use crate::Rule;
    use std::time::Duration;

    fn figures(limit: u64, window: Duration, remaining: u64, reset: Duration) -> LimitFigures {
        let rule = Rule::new(limit, window).unwrap();
        LimitFigures::of(&Decision::allowed(
            rule,
            remaining,
            crate::clock::duration_to_nanos(reset),
        ))
    }

    /// What `RateLimitFields` writes for `name` and `each`.
    fn written(name: &str, each: &[LimitFigures]) -> (String, String) {
        let fields = RateLimitFields::new(name, each).unwrap();
        let (mut policy, mut state) = (String::new(), String::new());
        fields.write_policy(&mut policy).unwrap();
        fields.write_state(&mut state).unwrap();
        (policy, state)
    }

    #[test]
    fn prepared_fields_write_what_the_fields_write() {
        let second = Duration::from_secs(1);
        let cases: [(&str, Vec<LimitFigures>); 3] = [
            ("edge.remote_address", vec![figures(5, second, 3, second)]),
            (
                r#"a "quoted" \ name"#,
                vec![figures(1_000_000_000, second, 999_999_999, second)],
            ),
            (
                "pro",
                vec![
                    figures(10, second, 9, second),
                    figures(
                        1_000,
                        Duration::from_secs(3_600),
                        0,
                        Duration::from_secs(61),
                    ),
                    figures(7, second, 7, Duration::ZERO),
                ],
            ),
        ];
        for (name, each) in &cases {
            let configured: Vec<LimitFigures> = each
                .iter()
                .map(|f| figures(f.limit, Duration::from_nanos(f.window_nanos), 0, second))
                .collect();
            let prepared = PreparedFields::new(name, &configured).unwrap();
            let (policy, state) = written(name, each);
            // Alone, then after another descriptor's items.
            let (mut got_policy, mut got_state) = (String::new(), String::new());
            assert!(prepared.append(&mut got_policy, &mut got_state, each));
            assert_eq!((&got_policy, &got_state), (&policy, &state), "{name}");
            assert!(prepared.append(&mut got_policy, &mut got_state, each));
            assert_eq!(got_policy, format!("{policy}, {policy}"), "{name}");
            assert_eq!(got_state, format!("{state}, {state}"), "{name}");
        }
    }

    #[test]
    fn prepared_fields_write_nothing_for_other_limits() {
        let second = Duration::from_secs(1);
        let prepared = PreparedFields::new("p", &[figures(5, second, 0, second)]).unwrap();
        let (mut policy, mut state) = (String::new(), String::new());
        for other in [
            vec![figures(6, second, 1, second)],
            vec![figures(5, Duration::from_secs(2), 1, second)],
            vec![figures(5, second, 1, second), figures(5, second, 1, second)],
        ] {
            assert!(!prepared.append(&mut policy, &mut state, &other));
        }
        assert!(policy.is_empty() && state.is_empty());
    }
}

#[cfg(test)]
mod decimal_tests {
    use super::write_integer;
    use proptest::prelude::*;

    fn written(value: u64) -> String {
        let mut out = String::new();
        write_integer(&mut out, value).expect("a String takes any text");
        out
    }

    /// Every count of digits, at both ends, and each side of every power of ten.
    #[test]
    fn write_integer_writes_as_display_does() {
        let mut values: Vec<u64> = (0..=1_000).collect();
        let mut power = 1u64;
        while let Some(next) = power.checked_mul(10) {
            values.extend([next - 1, next, next + 1]);
            power = next;
        }
        values.extend([u64::MAX - 1, u64::MAX, 1 << 40, (1 << 40) - 1]);
        for value in values {
            assert_eq!(written(value), value.to_string());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]
        #[test]
        fn write_integer_writes_any_value_as_display_does(value in any::<u64>()) {
            prop_assert_eq!(written(value), value.to_string());
        }
    }
}
