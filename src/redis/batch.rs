//! Batching: the decisions waiting for one server, several in one script call
//! ([`RedisRateLimiterBuilder::batch_size`](super::RedisRateLimiterBuilder::batch_size)).
//!
//! A decision that needs Redis goes into a bounded queue, which one task per limiter (the
//! sender) drains: it takes what is waiting, up to the batch size, and sends it as one call of
//! the method's batch script (`scripts/batch.lua`), a decision alone as one call of the method's
//! own script. At most [`IN_FLIGHT`] calls are on their way at once, so while they are, the
//! decisions that come wait in the queue and leave together in the next call: a lone request
//! goes at once, in one call of its own, and under load each call carries many. Per decision,
//! the server then pays its own reads and writes but not a call's fixed cost (parsing the
//! command, entering the script, the clock, the reply's frame): about 9k of a token bucket's
//! 72k instructions per decision.
//!
//! What each decision gets is what a call of it alone would have given at the batch's instant:
//! the batch script runs each request through the very text of the one-request script, in
//! order, in one atomic step (compared, reply by reply and key by key, with calls of the
//! one-request script in `tests/redis_batch.rs`). A request whose own decision raises an error
//! gets that error, as a call of its own would have (an unreadable value is the client's own
//! error under every policy); the others are decided all the same. A call that fails (a
//! timeout, a lost connection) fails each of its requests, which then meet the failure policy
//! as a failed call of their own would; to the circuit breaker it is one failure, as calls on
//! their way together are (see `CircuitBreaker`), where its requests sent one by one to a
//! server that refuses connections at once would each have been one. A request whose caller
//! stopped waiting (its timeout, or its future dropped) before its batch left is not sent.
//!
//! Only a single server batches: a script's keys must share one hash slot, and on a cluster
//! different clients' keys do not.

use std::sync::Arc;
use std::time::Duration;

use ::redis::Value;
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::RedisError;
use super::connection::Connection;
use super::script;
use super::stats::Counters;
use crate::Algorithm;

/// How many batch calls may be on their way at once: enough to keep the server busy while the
/// client reads one call's replies and writes the next, and to keep 64 decisions on their way
/// to a server a network away (as many as 64 tasks pipeline without batches); few enough that
/// under load most calls carry several (64 tasks, batches of up to 8: 5.3 decisions a call on
/// average; with 4 calls on their way, 7.9).
pub(super) const IN_FLIGHT: usize = 8;

/// How many decisions may wait in the queue; a request that finds it full waits for room,
/// within its timeout.
const QUEUE_CAPACITY: usize = 4096;

/// One decision's call, as the method's script for one request takes it.
#[derive(Debug)]
pub(super) struct Request {
    /// One key per limit.
    pub(super) keys: Vec<String>,
    /// The permits asked for.
    pub(super) n: u64,
    /// The script's mode argument (`acquire` or `peek`).
    pub(super) mode: &'static str,
    /// An injected time in microseconds; `None` for the server's clock.
    pub(super) now_us: Option<u64>,
    /// Each limit's parameters, in order (see `LimitSpec::params`).
    pub(super) params: Vec<u64>,
}

impl Request {
    /// How many arguments the request's script takes: `n`, the mode, the time, the parameters.
    fn arg_count(&self) -> usize {
        3 + self.params.len()
    }

    /// Appends the request's arguments to `invocation`, as the one-request script takes them.
    fn push_args(&self, invocation: &mut ::redis::ScriptInvocation<'_>) {
        let now = self.now_us.map(|now| now.to_string()).unwrap_or_default();
        invocation.arg(self.n).arg(self.mode).arg(now);
        for &param in &self.params {
            invocation.arg(param);
        }
    }
}

/// Why a batched decision has no reply.
#[derive(Debug)]
pub(super) enum Failed {
    /// The call carrying it failed, or it waited past the limiter's timeout.
    Call(RedisError),
    /// The request's own decision raised this error in the batch script (the one-request
    /// script, called alone, would have raised it as the call's error).
    Script(::redis::RedisError),
}

/// A call's failure, for each of its requests.
#[derive(Debug, Clone)]
enum CallFailure {
    Timeout(Duration),
    Command(::redis::RedisError),
}

impl CallFailure {
    fn to_error(&self) -> RedisError {
        match self {
            CallFailure::Timeout(after) => RedisError::Timeout { after: *after },
            CallFailure::Command(source) => RedisError::Command {
                source: source.clone(),
            },
        }
    }
}

/// A decision waiting for its batch, with where its reply goes.
struct Waiting {
    request: Request,
    reply: oneshot::Sender<Result<Vec<i64>, Failed>>,
}

/// The queue of a limiter's batched decisions; its sender task ends when this is dropped (once
/// the calls on their way have answered).
#[derive(Debug)]
pub(super) struct Batcher {
    queue: mpsc::Sender<Waiting>,
}

impl Batcher {
    /// Starts the sender task of a limiter of `algorithm` on `connections` (taken in turn, one
    /// per call), sending at most `batch_size` decisions a call, each call bounded by
    /// `timeout`, counted in `counters`. Needs a tokio runtime (the caller checks).
    pub(super) fn start(
        connections: Box<[Connection]>,
        algorithm: Algorithm,
        batch_size: usize,
        timeout: Duration,
        counters: Arc<Counters>,
    ) -> Batcher {
        let (queue, waiting) = mpsc::channel(QUEUE_CAPACITY);
        let sender = Sender {
            connections,
            next_connection: 0,
            algorithm,
            batch_size,
            timeout,
            counters,
        };
        tokio::spawn(sender.run(waiting));
        Batcher { queue }
    }

    /// The reply to `request` from its batch: waiting for room in the queue, then for the
    /// call, both within `timeout`.
    pub(super) async fn decide(
        &self,
        request: Request,
        timeout: Duration,
    ) -> Result<Vec<i64>, Failed> {
        let (reply, answer) = oneshot::channel();
        let waited = async {
            // The sender task stops only once the limiter (which holds this queue) is gone, so
            // neither error can happen while a request is being decided; both still answer.
            if self.queue.send(Waiting { request, reply }).await.is_err() {
                return Err(Failed::Call(RedisError::Timeout { after: timeout }));
            }
            answer
                .await
                .unwrap_or(Err(Failed::Call(RedisError::Timeout { after: timeout })))
        };
        match tokio::time::timeout(timeout, waited).await {
            Ok(reply) => reply,
            Err(_) => Err(Failed::Call(RedisError::Timeout { after: timeout })),
        }
    }
}

/// The sender task's state.
struct Sender {
    connections: Box<[Connection]>,
    next_connection: usize,
    algorithm: Algorithm,
    batch_size: usize,
    timeout: Duration,
    counters: Arc<Counters>,
}

impl Sender {
    /// Takes what waits, up to a batch, whenever fewer than [`IN_FLIGHT`] calls are on their
    /// way, and sends it; ends when the queue's last sender is dropped.
    async fn run(mut self, mut waiting: mpsc::Receiver<Waiting>) {
        let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
        loop {
            // The permit first: while every call is on its way, requests gather in the queue.
            let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
                return;
            };
            let Some(first) = waiting.recv().await else {
                return;
            };
            let mut batch = Vec::with_capacity(self.batch_size);
            batch.push(first);
            while batch.len() < self.batch_size {
                match waiting.try_recv() {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
            // A request whose caller stopped waiting is not sent: its answer is given already.
            batch.retain(|waiting| !waiting.reply.is_closed());
            if batch.is_empty() {
                continue;
            }
            let connection = self.connections[self.next_connection].clone();
            self.next_connection = (self.next_connection + 1) % self.connections.len();
            let (algorithm, timeout) = (self.algorithm, self.timeout);
            Counters::bump(&self.counters.round_trips);
            tokio::spawn(async move {
                send(batch, connection, algorithm, timeout).await;
                drop(permit);
            });
        }
    }
}

/// Sends `batch` in one call and hands each request its reply.
async fn send(
    batch: Vec<Waiting>,
    mut connection: Connection,
    algorithm: Algorithm,
    timeout: Duration,
) {
    let batch = match <[Waiting; 1]>::try_from(batch) {
        Ok([alone]) => {
            // A request alone: the method's own script, at its own cost.
            let mut invocation = script::script_for(algorithm).prepare_invoke();
            for key in &alone.request.keys {
                invocation.key(key);
            }
            alone.request.push_args(&mut invocation);
            let reply = call::<Vec<i64>>(&invocation, &mut connection, timeout)
                .await
                .map_err(|failure| Failed::Call(failure.to_error()));
            // Its caller may have stopped waiting: then the reply has nowhere to go.
            let _ = alone.reply.send(reply);
            return;
        }
        Err(batch) => batch,
    };
    let script = script::batch_script_for(algorithm);
    let mut invocation = script.prepare_invoke();
    invocation.arg(batch.len());
    for waiting in &batch {
        let request = &waiting.request;
        for key in &request.keys {
            invocation.key(key);
        }
        invocation.arg(request.arg_count()).arg(request.keys.len());
        request.push_args(&mut invocation);
    }
    match call::<Value>(&invocation, &mut connection, timeout).await {
        Ok(Value::Array(replies)) if replies.len() == batch.len() => {
            for (waiting, reply) in batch.into_iter().zip(replies) {
                let _ = waiting.reply.send(member_reply(reply));
            }
        }
        Ok(other) => {
            let reply = format!("{other:?}");
            for waiting in batch {
                let _ = waiting.reply.send(Err(Failed::Call(RedisError::BadReply {
                    reply: reply.clone(),
                })));
            }
        }
        Err(failure) => {
            for waiting in batch {
                let _ = waiting.reply.send(Err(Failed::Call(failure.to_error())));
            }
        }
    }
}

/// One request's item of a batch's reply: its integers, or the error its decision raised
/// (`{-2, message}`, the message as Redis words an error: its code, a space, the rest).
fn member_reply(reply: Value) -> Result<Vec<i64>, Failed> {
    let bad_reply = |reply: &dyn std::fmt::Debug| {
        Failed::Call(RedisError::BadReply {
            reply: format!("{reply:?}"),
        })
    };
    let Value::Array(items) = reply else {
        return Err(bad_reply(&reply));
    };
    if let [Value::Int(CODE_RAISED), Value::BulkString(message)] = items.as_slice() {
        let message = String::from_utf8_lossy(message);
        let (code, detail) = message.split_once(' ').unwrap_or((&message, ""));
        return Err(Failed::Script(::redis::make_extension_error(
            code.to_owned(),
            Some(detail.to_owned()),
        )));
    }
    items
        .iter()
        .map(|item| match item {
            Value::Int(x) => Ok(*x),
            _ => Err(()),
        })
        .collect::<Result<Vec<i64>, ()>>()
        .map_err(|()| bad_reply(&items))
}

/// The code of a request's item in a batch's reply that says its decision raised an error.
const CODE_RAISED: i64 = -2;

/// One script call, bounded by `timeout`: EVALSHA, and on NOSCRIPT (a restarted or flushed
/// server) the script loaded and called again, once.
async fn call<T: ::redis::FromRedisValue>(
    invocation: &::redis::ScriptInvocation<'_>,
    connection: &mut Connection,
    timeout: Duration,
) -> Result<T, CallFailure> {
    match tokio::time::timeout(timeout, invocation.invoke_async::<T>(connection)).await {
        Ok(Ok(reply)) => Ok(reply),
        Ok(Err(source)) if source.is_timeout() => Err(CallFailure::Timeout(timeout)),
        Ok(Err(source)) => Err(CallFailure::Command(source)),
        Err(_) => Err(CallFailure::Timeout(timeout)),
    }
}
