//! [`ResponseFuture`]: the inner service's response, or the layer's own answer.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::Response;
use pin_project_lite::pin_project;

use super::body::ResponseBody;
use super::fields::LimitFields;

/// A response being made by a backend that did not answer at once (boxed: that path already
/// waits on I/O, and the in-process backend never takes it).
pub(crate) type Pending<ResB, E> =
    Pin<Box<dyn Future<Output = Result<Response<ResponseBody<ResB>>, E>> + Send>>;

pin_project! {
    /// The response future of [`RateLimit`](super::RateLimit).
    pub struct ResponseFuture<F, ResB, E> {
        #[pin]
        state: State<F, ResB, E>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, ResB, E> {
        /// The request was let through, and its response goes back as it is.
        Inner { #[pin] future: F },
        /// The request was let through; `fields` are added to the inner service's response. (A
        /// state apart: the common one above then has no fields to take or to drop.)
        InnerWithFields { #[pin] future: F, fields: Option<Box<LimitFields>> },
        /// The layer answered itself.
        Answer { response: Option<Box<Response<Bytes>>> },
        /// The backend is still deciding.
        Pending { future: Pending<ResB, E> },
    }
}

impl<F, ResB, E> fmt::Debug for ResponseFuture<F, ResB, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Inner { .. } | State::InnerWithFields { .. } => "Inner",
            State::Answer { .. } => "Answer",
            State::Pending { .. } => "Pending",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<F, ResB, E> ResponseFuture<F, ResB, E> {
    pub(crate) fn inner(future: F, fields: Option<Box<LimitFields>>) -> Self {
        let state = match fields {
            None => State::Inner { future },
            fields => State::InnerWithFields { future, fields },
        };
        ResponseFuture { state }
    }

    pub(crate) fn answer(response: Box<Response<Bytes>>) -> Self {
        ResponseFuture {
            state: State::Answer {
                response: Some(response),
            },
        }
    }

    pub(crate) fn pending(future: Pending<ResB, E>) -> Self {
        ResponseFuture {
            state: State::Pending { future },
        }
    }
}

/// The inner service's response with the layer's `fields` added and its body wrapped.
pub(crate) fn pass<ResB>(
    response: Response<ResB>,
    fields: Option<Box<LimitFields>>,
) -> Response<ResponseBody<ResB>> {
    let mut response = response.map(ResponseBody::inner);
    if let Some(fields) = fields {
        fields.insert_into(response.headers_mut());
    }
    response
}

/// The layer's own answer, in the inner service's response type.
pub(crate) fn answer<ResB>(response: Response<Bytes>) -> Response<ResponseBody<ResB>> {
    response.map(ResponseBody::answer)
}

impl<F, ResB, E> Future for ResponseFuture<F, ResB, E>
where
    F: Future<Output = Result<Response<ResB>, E>>,
{
    type Output = Result<Response<ResponseBody<ResB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Inner { future } => {
                let response = ready!(future.poll(cx))?;
                Poll::Ready(Ok(pass(response, None)))
            }
            StateProj::InnerWithFields { future, fields } => {
                let response = ready!(future.poll(cx))?;
                Poll::Ready(Ok(pass(response, fields.take())))
            }
            StateProj::Answer { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(answer(*response))),
                // Polled again after completing: a caller's bug; answer as a closed stream would,
                // with an empty 500, rather than panic.
                None => Poll::Ready(Ok(answer(
                    Response::builder()
                        .status(http::StatusCode::INTERNAL_SERVER_ERROR)
                        .body(Bytes::new())
                        .unwrap_or_default(),
                ))),
            },
            StateProj::Pending { future } => future.as_mut().poll(cx),
        }
    }
}
