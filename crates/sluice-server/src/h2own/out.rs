//! Where a stream's answer is, and the future that brings it: what the connection keeps per
//! stream and `answer` moves along.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use futures_util::future::{AbortHandle, Abortable, Aborted};
use http::Response;
use sluice_core::body::ProxyBody;

use super::Answering;

/// Where a stream's answer is.
pub(super) enum Out {
    /// The pipeline is working on it.
    Waiting,
    /// Its head is out; its body is being sent: a chunk taken from it and not yet sent whole.
    Body {
        body: Pin<Box<ProxyBody>>,
        chunk: Option<Bytes>,
        /// What the body is polled with: it wakes the connection for this stream alone.
        waker: Waker,
    },
    /// Sent whole (END_STREAM), or given up.
    Done,
}

/// An answer's future with its stream's number, and dropped when the stream is reset.
pub(super) struct Tagged {
    id: u32,
    inner: Abortable<Answering>,
}

impl Tagged {
    pub(super) fn new(id: u32, answering: Answering) -> (Self, AbortHandle) {
        let (abort, registration) = AbortHandle::new_pair();
        let inner = Abortable::new(answering, registration);
        (Self { id, inner }, abort)
    }
}

impl Future for Tagged {
    type Output = (u32, Result<Response<ProxyBody>, Aborted>);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let id = self.id;
        Pin::new(&mut self.inner).poll(cx).map(|res| (id, res))
    }
}
