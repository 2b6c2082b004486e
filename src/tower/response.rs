//! What the layer answers: the over-limit response (HTTP 429 or gRPC `RESOURCE_EXHAUSTED`) with
//! the rate-limit header fields (written by `fields.rs`), and the answers for a request without
//! a key or a failed check.
//!
//! The fields' policy is named after the plan (a Structured Field String, `"` and `\` escaped).
//! `Retry-After` is whole seconds rounded *up* and never 0, so a client that waits as told is not
//! refused again for being early.

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use super::fields::{LimitFields, PolicyValue, ValueBuffer, limit_headers};
use crate::Decision;
use crate::headers::write_integer;
use crate::verdict::Reported;
/// gRPC's status, sent in the headers of a trailers-only response.
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// The problem type of draft-ietf-httpapi-ratelimit-headers-11, section 7.1.
const QUOTA_EXCEEDED_TYPE: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The name of a plan's policy in the `RateLimit` fields, for a layer made with
/// [`RateLimitLayer::builder`](super::RateLimitLayer::builder).
///
/// Implemented for the string types; a plan enum need not implement it: a layer made with
/// [`RateLimitLayer::from_settings`](super::RateLimitLayer::from_settings) names each plan as the
/// settings file does, and one made with
/// [`RateLimitLayer::builder_display_names`](super::RateLimitLayer::builder_display_names) by its
/// `Display` form. A name that is empty or not printable ASCII cannot be sent: the layer then
/// leaves the `RateLimit` fields out (the 429 and `Retry-After` are still sent).
pub trait PolicyName {
    /// The policy's name.
    fn policy_name(&self) -> &str;
}

impl PolicyName for str {
    fn policy_name(&self) -> &str {
        self
    }
}

impl PolicyName for String {
    fn policy_name(&self) -> &str {
        self
    }
}

impl PolicyName for std::sync::Arc<str> {
    fn policy_name(&self) -> &str {
        self
    }
}

impl<T: PolicyName + ?Sized> PolicyName for &T {
    fn policy_name(&self) -> &str {
        (**self).policy_name()
    }
}

/// Where a layer finds the policy name of a plan.
pub(crate) enum PolicyNames<P> {
    /// The plan's own [`PolicyName`].
    Own(for<'p> fn(&'p P) -> &'p str),
    /// The plan's `Display` form, written when a field is sent.
    Display(fn(&P) -> String),
    /// The settings file's name of each plan, found with the plans' `==`.
    Table {
        names: Box<[(P, Box<str>)]>,
        eq: fn(&P, &P) -> bool,
    },
}

impl<P> PolicyNames<P> {
    /// Names each plan with its [`PolicyName`].
    pub(crate) fn own() -> Self
    where
        P: PolicyName,
    {
        PolicyNames::Own(P::policy_name)
    }

    /// Names each plan with its `Display` form.
    pub(crate) fn display() -> Self
    where
        P: fmt::Display,
    {
        PolicyNames::Display(P::to_string)
    }

    /// Names each of `names`' plans as it says; another plan has no name (and its answers no
    /// `RateLimit` fields).
    pub(crate) fn table(names: Vec<(P, Box<str>)>) -> Self
    where
        P: PartialEq,
    {
        PolicyNames::Table {
            names: names.into_boxed_slice(),
            eq: P::eq,
        }
    }

    /// The policy name of `plan` (empty when it has none, which no field is sent for).
    pub(crate) fn name<'p>(&'p self, plan: &'p P) -> Cow<'p, str> {
        match self {
            PolicyNames::Own(name) => Cow::Borrowed(name(plan)),
            PolicyNames::Display(name) => Cow::Owned(name(plan)),
            PolicyNames::Table { names, eq } => names
                .iter()
                .find(|(named, _)| eq(named, plan))
                .map_or(Cow::Borrowed(""), |(_, name)| Cow::Borrowed(name)),
        }
    }
}

impl<P> fmt::Debug for PolicyNames<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyNames::Own(_) => f.write_str("PolicyName"),
            PolicyNames::Display(_) => f.write_str("Display"),
            PolicyNames::Table { names, .. } => f
                .debug_list()
                .entries(names.iter().map(|(_, name)| name))
                .finish(),
        }
    }
}

/// The body of the layer's own over-limit answer to HTTP requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum BodyFormat {
    /// `text/plain`: one line saying when to retry.
    #[default]
    Text,
    /// `application/problem+json` with the draft's `quota-exceeded` type and the
    /// `violated-policies` member (RFC 9457).
    ProblemJson,
}

/// What the layer does when it cannot decide: the request has no key, or the backend failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fallback {
    /// Let the request through unlimited (fail open).
    Allow,
    /// Answer with this status and a one-line body (gRPC requests get the matching gRPC status).
    Reject(StatusCode),
}

/// How a request expects to be refused, read from its `Content-Type`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// Anything but gRPC: a plain HTTP status.
    Http,
    /// gRPC over HTTP/2: a trailers-only response, `content-type: application/grpc`.
    Grpc,
    /// gRPC-Web: a trailers-only response in the request's own grpc-web media type (this value),
    /// which a grpc-web client reads its status from; never `application/grpc`, which it rejects.
    GrpcWeb(HeaderValue),
}

impl Protocol {
    /// The protocol of a request with these headers. Media types are compared without regard to
    /// case, on their type and subtype only: `application/grpc` alone or followed by `+` (a
    /// message format) or by parameters is gRPC; `application/grpcfoo` is not.
    pub(crate) fn of(headers: &HeaderMap) -> Protocol {
        let Some(value) = headers.get(CONTENT_TYPE) else {
            return Protocol::Http;
        };
        let essence = media_type_essence(value.as_bytes());
        let Some(rest) = strip_prefix_ignore_case(essence, b"application/grpc") else {
            return Protocol::Http;
        };
        if rest.is_empty() || rest[0] == b'+' {
            return Protocol::Grpc;
        }
        let web = strip_prefix_ignore_case(rest, b"-web-text")
            .or_else(|| strip_prefix_ignore_case(rest, b"-web"));
        match web {
            Some(format) if format.is_empty() || format[0] == b'+' => {
                // Echoed in lower case: media types are case-insensitive, and some clients compare
                // the response's with a lower-case constant.
                HeaderValue::from_bytes(&essence.to_ascii_lowercase())
                    .map_or(Protocol::Http, Protocol::GrpcWeb)
            }
            _ => Protocol::Http,
        }
    }

    fn is_grpc(&self) -> bool {
        !matches!(self, Protocol::Http)
    }
}

/// A media type's `type/subtype`, without its parameters and the whitespace around it.
fn media_type_essence(value: &[u8]) -> &[u8] {
    let end = value
        .iter()
        .position(|&byte| byte == b';')
        .unwrap_or(value.len());
    value[..end].trim_ascii()
}

fn strip_prefix_ignore_case<'v>(value: &'v [u8], prefix: &[u8]) -> Option<&'v [u8]> {
    (value.len() >= prefix.len() && value[..prefix.len()].eq_ignore_ascii_case(prefix))
        .then(|| &value[prefix.len()..])
}

/// A request over its limit, as the response hook sees it.
#[derive(Debug)]
pub struct Limited<'a> {
    reported: &'a Reported,
    policy: &'a str,
    protocol: Protocol,
    headers: HeaderMap,
}

impl<'a> Limited<'a> {
    pub(crate) fn new(reported: &'a Reported, policy: &'a str, protocol: Protocol) -> Self {
        Limited {
            reported,
            policy,
            protocol,
            headers: limit_headers(reported, policy),
        }
    }

    /// The decision that refused the request.
    pub fn decision(&self) -> &Decision {
        self.reported.decision()
    }

    /// The policy's (plan's) name.
    pub fn policy(&self) -> &str {
        self.policy
    }

    /// Whether the request is a gRPC call: its `Content-Type` is `application/grpc`, alone or
    /// followed by `+` or parameters, in any case (gRPC-Web's `application/grpc-web...` included;
    /// see [`Limited::is_grpc_web`]).
    pub fn is_grpc(&self) -> bool {
        self.protocol.is_grpc()
    }

    /// Whether the request is a gRPC-Web call (`application/grpc-web`, `application/grpc-web-text`,
    /// alone or followed by `+` or parameters): its answer must come in the request's own media
    /// type, which the layer's does.
    pub fn is_grpc_web(&self) -> bool {
        matches!(self.protocol, Protocol::GrpcWeb(_))
    }

    /// The header fields the layer sends on its own answer: `Retry-After` (when waiting helps),
    /// `RateLimit-Policy` and `RateLimit`.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The layer's own answer: gRPC `RESOURCE_EXHAUSTED` for a gRPC call (HTTP 200, the status in
    /// the headers, in the request's grpc-web media type for a gRPC-Web call), else 429 with a
    /// body in `format`, each with [`Limited::headers`].
    pub fn default_response(&self, format: BodyFormat) -> Response<Bytes> {
        let mut response = bare_response(self.reported, self.policy, &self.protocol, format);
        response.headers_mut().extend(self.headers.clone());
        response
    }
}

/// [`Limited::default_response`] without a [`Limited`]: the fields written straight into the
/// response's own map, as the layer answers when no hook replaces its answer.
pub(crate) fn default_response(
    reported: &Reported,
    policy: &str,
    kept: Option<&PolicyValue>,
    protocol: &Protocol,
    format: BodyFormat,
) -> Response<Bytes> {
    let mut response = bare_response(reported, policy, protocol, format);
    LimitFields::of(reported, policy, kept).insert_into(response.headers_mut());
    response
}

/// The over-limit answer without its rate-limit fields.
fn bare_response(
    reported: &Reported,
    policy: &str,
    protocol: &Protocol,
    format: BodyFormat,
) -> Response<Bytes> {
    if protocol.is_grpc() {
        return grpc_response(protocol, 8, "rate limit exceeded");
    }
    let (content_type, body) = match format {
        BodyFormat::Text => (text_plain(), text_body(reported.decision())),
        BodyFormat::ProblemJson => (
            const { HeaderValue::from_static("application/problem+json") },
            Bytes::from(problem_body(policy)),
        ),
    };
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    response.headers_mut().insert(CONTENT_TYPE, content_type);
    response
}

/// The text body: written on the stack and copied once into a buffer of its length.
fn text_body(decision: &Decision) -> Bytes {
    use fmt::Write;
    let mut body = ValueBuffer::new();
    // Writing to a `ValueBuffer` cannot fail.
    let _ = match (decision.rejection(), decision.retry_after_seconds()) {
        (Some(rejection), _) => writeln!(body, "Too Many Requests: {rejection}"),
        (None, Some(seconds)) => body
            .write_str("Too Many Requests: retry in ")
            .and_then(|()| write_integer(&mut body, seconds))
            .and_then(|()| body.write_str(" s\n")),
        (None, None) => body.write_str("Too Many Requests\n"),
    };
    Bytes::copy_from_slice(body.as_bytes())
}

fn problem_body(policy: &str) -> String {
    let mut body = format!(
        "{{\"type\":\"{QUOTA_EXCEEDED_TYPE}\",\"title\":\"Request cannot be satisfied as \
         assigned quota has been exceeded\",\"status\":429,\"violated-policies\":["
    );
    json_string(&mut body, policy);
    body.push_str("]}");
    body
}

/// The answer for a request the layer refuses without a decision (no key; a failed backend).
pub(crate) fn refusal(status: StatusCode, protocol: &Protocol, message: &str) -> Response<Bytes> {
    if protocol.is_grpc() {
        return grpc_response(protocol, grpc_code(status), message);
    }
    let mut response = Response::new(Bytes::from(format!("{message}\n")));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, text_plain());
    response
}

/// `text/plain; charset=utf-8`. Each fixed value is made at compile time (`const`): one made
/// from a string at run time is checked byte by byte, some 280 instructions on a refusal.
fn text_plain() -> HeaderValue {
    const { HeaderValue::from_static("text/plain; charset=utf-8") }
}

/// A trailers-only gRPC response: HTTP 200, the status in the headers, no body; in gRPC-Web's
/// media type for a gRPC-Web call.
fn grpc_response(protocol: &Protocol, code: u8, message: &str) -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    let headers = response.headers_mut();
    let content_type = match protocol {
        Protocol::GrpcWeb(media_type) => media_type.clone(),
        Protocol::Grpc | Protocol::Http => const { HeaderValue::from_static("application/grpc") },
    };
    headers.insert(CONTENT_TYPE, content_type);
    headers.insert(GRPC_STATUS, HeaderValue::from(u16::from(code)));
    // The messages here are fixed ASCII without `%`, so they need no percent-encoding.
    if let Ok(message) = HeaderValue::from_str(message) {
        headers.insert(GRPC_MESSAGE, message);
    }
    response
}

/// The gRPC status closest to an HTTP refusal.
fn grpc_code(status: StatusCode) -> u8 {
    match status.as_u16() {
        400 => 3,  // INVALID_ARGUMENT
        401 => 16, // UNAUTHENTICATED
        403 => 7,  // PERMISSION_DENIED
        429 => 8,  // RESOURCE_EXHAUSTED
        500 => 13, // INTERNAL
        503 => 14, // UNAVAILABLE
        _ => 2,    // UNKNOWN
    }
}

/// Appends `text` as a JSON string.
fn json_string(out: &mut String, text: &str) {
    use fmt::Write;
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_are_escaped() {
        let mut out = String::new();
        json_string(&mut out, "a\"b\\c\nd");
        assert_eq!(out, r#""a\"b\\c\u000ad""#);
    }

    fn protocol_of(content_type: &[u8]) -> Protocol {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_bytes(content_type).unwrap());
        Protocol::of(&headers)
    }

    #[test]
    fn grpc_is_recognised_by_its_media_type_in_any_case() {
        assert_eq!(Protocol::of(&HeaderMap::new()), Protocol::Http);
        use Protocol::{Grpc, Http};
        for (content_type, protocol) in [
            (&b"application/grpc"[..], Grpc),
            (b"application/grpc+proto", Grpc),
            (b"Application/gRPC", Grpc),
            (b"APPLICATION/GRPC+JSON", Grpc),
            (b"application/grpc; charset=utf-8", Grpc),
            (b"application/grpc ;x=1", Grpc),
            (b"application/grpc ", Grpc),
            (b"application/grpcfoo", Http),
            (b"application/grpc-webfoo", Http),
            (b"application/grpc-web-textual", Http),
            (b"application/grpc foo", Http),
            (b"application/json", Http),
            (b"text/application/grpc", Http),
            (b"application/grp", Http),
            (b"\xffapplication/grpc", Http),
        ] {
            assert_eq!(
                protocol_of(content_type),
                protocol,
                "{}",
                String::from_utf8_lossy(content_type)
            );
        }
    }

    #[test]
    fn grpc_web_is_answered_in_its_own_media_type() {
        for (request, answer) in [
            ("application/grpc-web", "application/grpc-web"),
            ("application/grpc-web+proto", "application/grpc-web+proto"),
            ("Application/gRPC-Web-Text", "application/grpc-web-text"),
            (
                "application/grpc-web-text+proto; charset=utf-8",
                "application/grpc-web-text+proto",
            ),
        ] {
            let protocol = protocol_of(request.as_bytes());
            assert_eq!(
                protocol,
                Protocol::GrpcWeb(HeaderValue::from_static(answer))
            );
            let response = refusal(StatusCode::TOO_MANY_REQUESTS, &protocol, "slow down");
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(response.headers()[CONTENT_TYPE], answer);
            assert_eq!(response.headers()[GRPC_STATUS], "8");
        }
    }

    #[test]
    fn refusals_of_grpc_calls_carry_the_matching_grpc_status() {
        let response = refusal(StatusCode::BAD_REQUEST, &Protocol::Grpc, "no client key");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[GRPC_STATUS], "3");
        assert_eq!(response.headers()[CONTENT_TYPE], "application/grpc");
        let response = refusal(StatusCode::SERVICE_UNAVAILABLE, &Protocol::Http, "down");
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.body().as_ref(), b"down\n");
    }
}
