//! [`RecvBody`]: an HTTP/3 request's body (its DATA frames, then its trailers) as an
//! `http_body::Body`, the shape every transport hands the proxy.

use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes};
use h3::server::RequestStream;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use crate::service::BoxError;

/// The receiving half of a request stream.
pub(super) type Recv = RequestStream<h3_quinn::RecvStream, Bytes>;

/// Where a body's reading is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Data,
    Trailers,
    Done,
}

/// A request body read from its stream as the proxy polls it (QUIC's flow control holds the
/// client back meanwhile). Its length is the `Content-Length` the client declared, if any.
pub(super) struct RecvBody {
    stream: Recv,
    /// Data read ahead when the body was made (see [`new`](Self::new)).
    first: Option<Bytes>,
    length: Option<u64>,
    state: State,
}

impl RecvBody {
    /// The body of the request on `stream`. What has already arrived is looked at once, without
    /// waiting: a request whose stream ended with its head (a GET, as clients send it) is
    /// known to have no body, so it goes upstream as one without (no chunked empty body).
    pub(super) fn new(stream: Recv, length: Option<u64>) -> Self {
        let mut body = Self {
            stream,
            first: None,
            length,
            state: State::Data,
        };
        let mut cx = Context::from_waker(Waker::noop());
        match body.poll_data(&mut cx) {
            Poll::Ready(Some(Ok(data))) => body.first = Some(data),
            Poll::Ready(None) => {
                let mut trailers = body.stream.poll_recv_trailers(&mut cx);
                if let Poll::Ready(Ok(None)) = &mut trailers {
                    body.state = State::Done;
                }
            }
            // An error is met again when the proxy reads.
            Poll::Ready(Some(Err(_))) | Poll::Pending => {}
        }
        body
    }

    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BoxError>>> {
        match self.stream.poll_recv_data(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(Some(mut buf))) => {
                Poll::Ready(Some(Ok(buf.copy_to_bytes(buf.remaining()))))
            }
            Poll::Ready(Ok(None)) => {
                self.state = State::Trailers;
                Poll::Ready(None)
            }
            Poll::Ready(Err(e)) => {
                self.state = State::Done;
                Poll::Ready(Some(Err(e.into())))
            }
        }
    }

    fn poll_trailers(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = std::task::ready!(self.stream.poll_recv_trailers(cx));
        self.state = State::Done;
        Poll::Ready(match polled {
            Ok(Some(trailers)) => Some(Ok(Frame::trailers(trailers))),
            Ok(None) => None,
            Err(e) => Some(Err(e.into())),
        })
    }
}

impl Body for RecvBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        loop {
            match this.state {
                State::Data => match std::task::ready!(this.poll_data(cx)) {
                    Some(data) => return Poll::Ready(Some(data.map(Frame::data))),
                    None => continue,
                },
                State::Trailers => return this.poll_trailers(cx),
                State::Done => return Poll::Ready(None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.state == State::Done && self.first.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match (self.state, self.length) {
            (State::Done, _) if self.first.is_none() => SizeHint::with_exact(0),
            (_, Some(length)) => SizeHint::with_exact(length),
            _ => SizeHint::default(),
        }
    }
}

/// The `Content-Length` a request head declares, when it is one number.
pub(super) fn declared_length(headers: &HeaderMap) -> Option<u64> {
    let mut values = headers.get_all(http::header::CONTENT_LENGTH).iter();
    let only = values.next()?;
    if values.next().is_some() {
        return None;
    }
    only.to_str().ok()?.trim().parse().ok()
}
