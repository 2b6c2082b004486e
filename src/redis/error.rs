//! [`RedisError`]: what can go wrong building or asking a [`RedisRateLimiter`](super::RedisRateLimiter).

use std::fmt;
use std::time::Duration;

use super::script::{NOT_EXACT_BURST, NOT_EXACT_LIMIT, NOT_EXACT_WINDOW};
use crate::{PlanError, Rule};

/// An error from a [`RedisRateLimiter`](super::RedisRateLimiter): a setting it cannot honour
/// (when it is built), or a request Redis could not answer (under
/// [`FailurePolicy::Error`](super::FailurePolicy::Error) only; the other policies answer such a
/// request with a decision).
#[derive(Debug)]
#[non_exhaustive]
pub enum RedisError {
    /// The Redis URL cannot be parsed.
    InvalidUrl {
        /// The URL, with any password replaced by `***`.
        url: String,
        /// What the client library said.
        source: ::redis::RedisError,
    },
    /// The first connection failed (unreachable server, refused connection).
    Connect {
        /// The URL, with any password replaced by `***`.
        url: String,
        /// What the client library said.
        source: ::redis::RedisError,
    },
    /// The server refused the credentials in the URL.
    Authentication {
        /// The URL, with any password replaced by `***`.
        url: String,
        /// What the client library said.
        source: ::redis::RedisError,
    },
    /// The server's TLS certificate is not trusted (signed by an unknown authority, expired, or
    /// for another host).
    UntrustedCertificate {
        /// The URL, with any password replaced by `***`.
        url: String,
        /// What the client library said.
        source: ::redis::RedisError,
    },
    /// The server is a read-only replica: the limiter writes, so its URL must name the
    /// primary. Found by `ROLE` at [`build`](super::RedisRateLimiterBuilder::build), or by a
    /// `READONLY` reply to a grant (after
    /// [`build_lazy`](super::RedisRateLimiterBuilder::build_lazy), or a failover that turned
    /// the server into a replica).
    ReadOnlyReplica {
        /// The URL, with any password replaced by `***`.
        url: String,
    },
    /// A round trip failed (a broken connection, a server error).
    Command {
        /// What the client library said.
        source: ::redis::RedisError,
    },
    /// Redis did not answer within the request timeout.
    Timeout {
        /// The timeout that passed.
        after: Duration,
    },
    /// The circuit breaker is open after repeated failures: no round trip was tried.
    CircuitOpen {
        /// How long until the next probe may be sent.
        retry_in: Duration,
    },
    /// A key the limiter owns holds a value of another type (another program wrote it): the
    /// script refused to touch it.
    WrongType {
        /// The key.
        key: String,
    },
    /// The script failed on a value under the client's keys that it cannot read (another
    /// program's value of the type the limiter uses, or a corrupted one): this client's requests
    /// fail until the keys are deleted. Returned under every failure policy, and not counted by
    /// the circuit breaker: Redis answered, and every other client is decided as before.
    UnreadableValue {
        /// The client's keys under the plan, one of which holds the value.
        keys: Vec<String>,
        /// What Redis said of the script's failure.
        source: ::redis::RedisError,
    },
    /// Redis answered something the scripts never reply (another script under the same hash?).
    BadReply {
        /// The reply, as received.
        reply: String,
    },
    /// The plan was not given to the builder.
    UnknownPlan {
        /// The plan, as `Debug` shows it.
        plan: String,
    },
    /// A grant given back by a limiter, plan or client other than the ones that made it.
    ForeignGrant {
        /// The client it was given back for.
        client: String,
        /// The plan, as `Debug` shows it.
        plan: String,
    },
    /// A mistake in the plans or their limits: the same one for every backend and the settings.
    Plan(PlanError),
    /// A plan's rule cannot be kept exact in the scripts' integers: Lua numbers are doubles,
    /// exact only up to 2^53. The bounds: a token bucket's full bucket of at most
    /// [`MAX_BURST_TICKS`](super::RedisRateLimiter::MAX_BURST_TICKS) ticks, a window of at most
    /// [`MAX_WINDOW_MICROS`](super::RedisRateLimiter::MAX_WINDOW_MICROS) microseconds, a fixed
    /// window's limit of at most
    /// [`MAX_FIXED_WINDOW_LIMIT`](super::RedisRateLimiter::MAX_FIXED_WINDOW_LIMIT).
    NotExact {
        /// The plan, as `Debug` shows it.
        plan: String,
        /// The rule.
        rule: Rule,
        /// What is out of bounds.
        what: &'static str,
        /// Its value.
        value: u128,
        /// The bound.
        max: u64,
    },
    /// A plan's window is not a whole number of microseconds, the scripts' unit of time.
    WindowNotMicroseconds {
        /// The plan, as `Debug` shows it.
        plan: String,
        /// The window.
        window: Duration,
    },
    /// A plan name or key prefix holds a character that would break the key layout.
    InvalidName {
        /// Which name.
        what: &'static str,
        /// The name.
        name: String,
    },
    /// A setting outside its bounds.
    InvalidSetting {
        /// The setting.
        field: &'static str,
        /// Its value.
        value: String,
        /// The bound it breaks.
        bound: &'static str,
    },
}

impl fmt::Display for RedisError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisError::InvalidUrl { url, source } => {
                write!(f, "Redis URL {url} is invalid: {source}")
            }
            RedisError::Connect { url, source } => {
                write!(f, "cannot connect to Redis at {url}: {source}")
            }
            RedisError::Authentication { url, source } => write!(
                f,
                "Redis at {url} refused the credentials: {source} (check the user and password \
                 in the URL, redis://user:password@host:port)"
            ),
            RedisError::UntrustedCertificate { url, source } => write!(
                f,
                "the TLS certificate of Redis at {url} is not trusted: {source} (give the \
                 certificate of the authority that signed it to .tls_root_certificate(), or \
                 install it among the system's roots)"
            ),
            RedisError::ReadOnlyReplica { url } => write!(
                f,
                "Redis at {url} is a read-only replica: the limiter writes, so point the URL at \
                 the primary"
            ),
            RedisError::Command { source } => write!(f, "Redis round trip failed: {source}"),
            RedisError::Timeout { after } => {
                write!(f, "Redis did not answer within the timeout of {after:?}")
            }
            RedisError::CircuitOpen { retry_in } => write!(
                f,
                "Redis circuit open after repeated failures: next probe in {retry_in:?}"
            ),
            RedisError::WrongType { key } => write!(
                f,
                "Redis key {key} holds a value of another type than the limiter's: it was \
                 written by another program; delete it or change the key prefix"
            ),
            RedisError::UnreadableValue { keys, source } => write!(
                f,
                "the limiter's script cannot read the value under Redis key(s) {}: another \
                 program wrote there, or the value is corrupt; delete the key(s) or change the \
                 key prefix ({source})",
                keys.join(", ")
            ),
            RedisError::BadReply { reply } => {
                write!(f, "Redis script replied {reply}, not a limiter's answer")
            }
            RedisError::ForeignGrant { client, plan } => write!(
                f,
                "a grant given back for client {client:?} under plan {plan} was not made for \
                 them: a grant is given back by the limiter that made it, for its plan and client"
            ),
            RedisError::UnknownPlan { plan } => {
                write!(
                    f,
                    "plan {plan} has no rule: give it to the builder with .plan()"
                )
            }
            RedisError::Plan(error) => write!(f, "{error}"),
            RedisError::NotExact {
                plan,
                rule,
                what,
                value,
                max,
            } => {
                let remedy = match *what {
                    NOT_EXACT_BURST => "pick a limit that shares more factors with the window",
                    NOT_EXACT_WINDOW => "pick a shorter window",
                    NOT_EXACT_LIMIT => "pick a lower limit",
                    _ => "pick a smaller rule",
                };
                write!(
                    f,
                    "plan {plan}: rule {rule} needs {what} {value}, above the {max} that Redis's \
                     Lua numbers keep exact: {remedy}"
                )
            }
            RedisError::WindowNotMicroseconds { plan, window } => write!(
                f,
                "plan {plan}: window {window:?} is not a whole number of microseconds, the unit \
                 of time in Redis"
            ),
            RedisError::InvalidName { what, name } => write!(
                f,
                "{what} {name:?} is invalid: it must be non-empty and hold none of '{{', '}}', \
                 ':' (they delimit the key's hash tag and fields)"
            ),
            RedisError::InvalidSetting {
                field,
                value,
                bound,
            } => write!(f, "{field} {value} is invalid: {bound}"),
        }
    }
}

impl std::error::Error for RedisError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RedisError::InvalidUrl { source, .. }
            | RedisError::Connect { source, .. }
            | RedisError::Authentication { source, .. }
            | RedisError::UntrustedCertificate { source, .. }
            | RedisError::UnreadableValue { source, .. }
            | RedisError::Command { source } => Some(source),
            RedisError::Plan(error) => Some(error),
            _ => None,
        }
    }
}

impl RedisError {
    /// Whether `source` is Redis's report that the script itself failed on this request's
    /// keys: a Lua error (`ERR`) or a command inside it refusing the value (`WRONGTYPE`), which
    /// Redis reports with the script's position (`user_script:LINE`). An answer about these
    /// keys, not a failure to reach or use Redis: a server out of memory (`OOM`), read-only,
    /// busy or loading says so with its own code, and stays a failure.
    pub(super) fn is_script_failure(source: &::redis::RedisError) -> bool {
        Self::is_script_error_code(source) && source.to_string().contains("user_script")
    }

    /// Whether an error a script raised is one of reading a value: a command's own error
    /// (`WRONGTYPE`), or the script's (`ERR`: a command's refusal of its arguments, or Lua's
    /// own error, such as arithmetic on a value that is no number, to which the batch script
    /// gives that code as Redis does). For a batched request's error, which the batch script
    /// hands back without the `user_script` frame a failed call's error has.
    pub(super) fn is_script_error_code(source: &::redis::RedisError) -> bool {
        matches!(source.code(), Some("ERR" | "WRONGTYPE"))
    }

    /// This error, or [`RedisError::ReadOnlyReplica`] naming `url` if it is a server's
    /// `READONLY` reply.
    pub(super) fn naming_replica(self, url: &str) -> RedisError {
        match self {
            RedisError::Command { source } if source.code() == Some("READONLY") => {
                RedisError::ReadOnlyReplica {
                    url: url.to_owned(),
                }
            }
            error => error,
        }
    }
}

impl From<PlanError> for RedisError {
    fn from(error: PlanError) -> Self {
        RedisError::Plan(error)
    }
}
