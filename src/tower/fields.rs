//! The rate-limit header values the layer sends, each written once from a reported decision:
//! `Retry-After`, and the `RateLimit-Policy` and `RateLimit` fields of
//! draft-ietf-httpapi-ratelimit-headers-11 (`RateLimit-Policy: "free";q=5;w=1`, `RateLimit:
//! "free";r=0;t=1`; for a plan of several limits, one list item per limit). Their text is
//! `crate::headers`'s, the same as [`Decision::ratelimit_header`](crate::Decision::ratelimit_header)
//! returns, written into a buffer on the stack and from there into the `HeaderValue`.

use std::fmt;
use std::sync::OnceLock;

use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::headers::{FieldWrite, LimitFigures, PolicyLimits, RateLimitFields, write_integer};
use crate::verdict::Reported;

/// `RateLimit-Policy` (the plan's quota and window).
pub(crate) const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (what is left of the quota, and when it is whole again).
pub(crate) const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// `Retry-After` (for a denial that waiting can cure), `RateLimit-Policy` and `RateLimit` (unless
/// the policy's name cannot be sent: empty, or not printable ASCII).
pub(crate) fn limit_headers(reported: &Reported, policy: &str) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(3);
    LimitFields::of(reported, policy, None).insert_into(&mut headers);
    headers
}

/// A plan's `RateLimit-Policy` value, written once: for the layer's default plan, whose
/// responses report the same quotas and windows until its rule changes. The first response that
/// reports the plan writes the value and keeps it; a later one whose policy name, quotas and
/// windows are the same clones it (a reference count) instead of writing it again. After a rule
/// change the value is written for each response, as for any other plan.
#[derive(Debug, Default)]
pub(crate) struct PolicyValue(OnceLock<KeptPolicy>);

/// The value [`PolicyValue`] keeps, and what it was written for.
#[derive(Debug)]
struct KeptPolicy {
    name: Box<str>,
    limits: PolicyLimits,
    value: HeaderValue,
}

impl PolicyValue {
    /// The value for `limits` under the policy `name`: the kept one where it was written for
    /// them, else `write`'s (kept, if none is yet).
    fn get_or_write(
        &self,
        name: &str,
        limits: &[LimitFigures],
        write: impl FnOnce() -> Option<HeaderValue>,
    ) -> Option<HeaderValue> {
        let kept = self.0.get();
        if let Some(kept) = kept
            && *kept.name == *name
            && kept.limits.are_of(limits)
        {
            return Some(kept.value.clone());
        }
        let value = write()?;
        if kept.is_none() {
            // Another response may have kept its own meanwhile: either is checked as above
            // before it is used.
            let _ = self.0.set(KeptPolicy {
                name: name.into(),
                limits: PolicyLimits::of(limits),
                value: value.clone(),
            });
        }
        Some(value)
    }
}

/// The fields of [`limit_headers`], each value written once, for inserting into a response's own
/// map: no second map is allocated, merged from and dropped.
pub(crate) struct LimitFields {
    retry_after: Option<HeaderValue>,
    policy_and_state: Option<(HeaderValue, HeaderValue)>,
}

impl LimitFields {
    /// The fields of `reported` under the policy `policy`, its `RateLimit-Policy` value taken
    /// from `kept` where that holds it.
    pub(crate) fn of(reported: &Reported, policy: &str, kept: Option<&PolicyValue>) -> Self {
        let retry_after = reported
            .decision()
            .retry_after_seconds()
            .and_then(|seconds| value(|out| write_integer(out, seconds)));
        let policy_and_state = reported.with_limits(|limits| {
            let fields = RateLimitFields::new(policy, limits).ok()?;
            let write_policy = || value(|out| fields.write_policy(out));
            let policy_value = match kept {
                Some(kept) => kept.get_or_write(policy, limits, write_policy)?,
                None => write_policy()?,
            };
            Some((policy_value, value(|out| fields.write_state(out))?))
        });
        LimitFields {
            retry_after,
            policy_and_state,
        }
    }

    /// Inserts the fields into `headers`, in the order `Retry-After`, `RateLimit-Policy`,
    /// `RateLimit`, each replacing any field of its name.
    pub(crate) fn insert_into(self, headers: &mut HeaderMap) {
        if let Some(retry_after) = self.retry_after {
            headers.insert(RETRY_AFTER, retry_after);
        }
        if let Some((policy, state)) = self.policy_and_state {
            headers.insert(RATELIMIT_POLICY, policy);
            headers.insert(RATELIMIT, state);
        }
    }
}

/// The `RateLimit` value alone (what shadow mode marks a request with), unless the policy's
/// name cannot be sent.
pub(crate) fn ratelimit_value(reported: &Reported, policy: &str) -> Option<HeaderValue> {
    reported.with_limits(|limits| {
        let fields = RateLimitFields::new(policy, limits).ok()?;
        value(|out| fields.write_state(out))
    })
}

/// The header value `write` writes. (Always a valid one: the fields are printable ASCII.) Its
/// bytes are copied once, into a buffer of exactly their length, which is freed without the
/// bookkeeping of a shared one.
fn value(write: impl FnOnce(&mut ValueBuffer) -> fmt::Result) -> Option<HeaderValue> {
    let mut buffer = ValueBuffer::new();
    write(&mut buffer).ok()?;
    HeaderValue::from_bytes(buffer.as_bytes()).ok()
}

/// A header value or short body being written: on the stack while it fits in `INLINE` bytes
/// (four limits under a name of some 30 characters), then on the heap.
pub(super) struct ValueBuffer {
    inline: [u8; ValueBuffer::INLINE],
    len: usize,
    spilled: Vec<u8>,
}

impl ValueBuffer {
    const INLINE: usize = 256;

    pub(super) fn new() -> Self {
        ValueBuffer {
            inline: [0; ValueBuffer::INLINE],
            len: 0,
            spilled: Vec::new(),
        }
    }

    pub(super) fn as_bytes(&self) -> &[u8] {
        if self.spilled.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.spilled
        }
    }
}

impl ValueBuffer {
    /// Appends `bytes`: one copy while they fit on the stack. (Inline: the fields are written a
    /// few bytes at a time.)
    #[inline]
    fn write_bytes(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        match self.inline.get_mut(self.len..end) {
            Some(free) if self.spilled.is_empty() => {
                free.copy_from_slice(bytes);
                self.len = end;
            }
            _ => self.spill(bytes),
        }
    }

    /// The write that does not fit on the stack: moves what is there to the heap, and goes on there.
    #[cold]
    #[inline(never)]
    fn spill(&mut self, bytes: &[u8]) {
        if self.spilled.is_empty() {
            self.spilled.extend_from_slice(&self.inline[..self.len]);
        }
        self.spilled.extend_from_slice(bytes);
    }
}

impl fmt::Write for ValueBuffer {
    #[inline]
    fn write_str(&mut self, text: &str) -> fmt::Result {
        self.write_bytes(text.as_bytes());
        Ok(())
    }

    /// One byte for an ASCII character, where the default encodes it and copies a slice of one.
    #[inline]
    fn write_char(&mut self, c: char) -> fmt::Result {
        match self.inline.get_mut(self.len) {
            Some(free) if c.is_ascii() && self.spilled.is_empty() => {
                *free = c as u8;
                self.len += 1;
                Ok(())
            }
            _ => self.write_str(c.encode_utf8(&mut [0; 4])),
        }
    }
}

impl FieldWrite for ValueBuffer {
    /// The digits of an integer, copied at once: the buffer holds bytes, so ASCII needs no
    /// check as UTF-8 (and a header value's bytes are checked when it is made).
    #[inline]
    fn write_ascii(&mut self, ascii: &[u8]) -> fmt::Result {
        debug_assert!(ascii.is_ascii());
        self.write_bytes(ascii);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Write;

    use super::*;

    /// Figures of a limit of `limit` per `window_secs` seconds, with `remaining` left.
    fn figures(limit: u64, window_secs: u64, remaining: u64) -> LimitFigures {
        let window = std::time::Duration::from_secs(window_secs);
        let rule = crate::Rule::new(limit, window).expect("a rule");
        LimitFigures::of(&crate::Decision::allowed(rule, remaining, 0))
    }

    #[test]
    fn a_kept_policy_value_is_used_only_for_the_name_and_limits_it_was_written_for() {
        let kept = PolicyValue::default();
        let writes = std::cell::Cell::new(0);
        let get = |name: &str, limits: &[LimitFigures], text: &'static str| {
            kept.get_or_write(name, limits, || {
                writes.set(writes.get() + 1);
                Some(HeaderValue::from_static(text))
            })
        };
        let one = [figures(5, 1, 4)];
        assert_eq!(
            get("free", &one, "first"),
            Some(HeaderValue::from_static("first"))
        );
        // The same quota and window, whatever remains: the kept value, not written again.
        let fewer_left = [figures(5, 1, 0)];
        assert_eq!(
            get("free", &fewer_left, "x"),
            Some(HeaderValue::from_static("first"))
        );
        assert_eq!(writes.get(), 1);
        // Another quota, window, count of limits or name: written, and the first kept.
        for (name, limits) in [
            ("free", vec![figures(6, 1, 4)]),
            ("free", vec![figures(5, 2, 4)]),
            ("free", vec![figures(5, 1, 4), figures(50, 60, 4)]),
            ("pro", vec![figures(5, 1, 4)]),
            ("free", vec![]),
        ] {
            assert_eq!(
                get(name, &limits, "other"),
                Some(HeaderValue::from_static("other"))
            );
        }
        assert_eq!(writes.get(), 6);
        assert_eq!(
            get("free", &one, "x"),
            Some(HeaderValue::from_static("first"))
        );
        // A write that fails keeps nothing.
        let empty = PolicyValue::default();
        assert_eq!(empty.get_or_write("free", &one, || None), None);
        assert!(empty.0.get().is_none());
    }

    #[test]
    fn a_value_longer_than_the_stack_buffer_moves_to_the_heap_whole() {
        let mut buffer = ValueBuffer::new();
        let long = "x".repeat(ValueBuffer::INLINE - 1);
        buffer.write_str(&long).unwrap();
        buffer.write_str("yz").unwrap();
        buffer.write_str("!").unwrap();
        assert_eq!(buffer.as_bytes(), format!("{long}yz!").as_bytes());
    }

    #[test]
    fn characters_fill_the_stack_buffer_then_follow_onto_the_heap() {
        let mut buffer = ValueBuffer::new();
        let mut expected = String::new();
        // ASCII one byte each up to the last inline byte, then a character of two bytes that
        // does not fit, then ASCII again on the heap.
        for c in "0123456789".chars().cycle().take(ValueBuffer::INLINE - 1) {
            buffer.write_char(c).unwrap();
            expected.push(c);
        }
        for c in ['é', '7', 'x'] {
            buffer.write_char(c).unwrap();
            expected.push(c);
        }
        assert_eq!(buffer.as_bytes(), expected.as_bytes());
        let mut short = ValueBuffer::new();
        for c in ['1', 'é', '2'] {
            short.write_char(c).unwrap();
        }
        assert_eq!(short.as_bytes(), "1é2".as_bytes());
    }

    #[test]
    fn integers_are_written_as_display_writes_them_on_the_stack_and_past_it() {
        let mut buffer = ValueBuffer::new();
        let mut expected = String::new();
        // Every count of digits, 1 to 20, written on until the values no longer fit on the
        // stack and go on on the heap.
        for value in (0..64).map(|shift| u64::MAX >> shift).chain([0]) {
            write_integer(&mut buffer, value).unwrap();
            buffer.write_char(',').unwrap();
            expected.push_str(&format!("{value},"));
        }
        assert!(expected.len() > ValueBuffer::INLINE);
        assert_eq!(buffer.as_bytes(), expected.as_bytes());
    }
}
