//! A request body as its DATA frames come: the connection pushes them into an [`Inbound`], the
//! proxy reads them through a [`RecvBody`] (on whatever task polls it: an upstream connection's
//! own, often), and what it read is credited back to the client as window.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use super::wakes::Wakes;
use crate::service::BoxError;

/// How many bytes read make a WINDOW_UPDATE worth sending: half a stream's window.
pub(super) const CREDIT_STEP: u32 = sluice_h2::frame::DEFAULT_WINDOW / 2;

/// What one stream's body has brought and what was read of it.
#[derive(Debug, Default)]
pub(super) struct Inbound {
    data: VecDeque<Bytes>,
    trailers: Option<HeaderMap>,
    /// The client ended the body (END_STREAM seen).
    ended: bool,
    /// The stream failed (reset by the client, or the connection ended): the body fails.
    failed: Option<&'static str>,
    /// Data read (by the proxy) and not yet credited back to the client.
    read: u32,
    /// The body was dropped: what comes is credited at once.
    dropped: bool,
    /// Who reads (woken when data comes).
    reader: Option<Waker>,
}

/// The connection's handle on a stream's body.
#[derive(Debug, Clone)]
pub(super) struct Feed(Arc<Mutex<Inbound>>);

/// The stream a body belongs to and the connection's wakes: told when a credit is due.
#[derive(Debug)]
struct Due {
    id: u32,
    wakes: Arc<Wakes>,
}

fn lock(inbound: &Mutex<Inbound>) -> MutexGuard<'_, Inbound> {
    inbound
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Feed {
    /// A body fed by the connection, and the body the proxy reads (its length the declared
    /// one, if any).
    /// A body of stream `id` fed by the connection whose wakes are `wakes`, and the body the
    /// proxy reads (its length the declared one, if any).
    pub(super) fn new(length: Option<u64>, id: u32, wakes: &Arc<Wakes>) -> (Self, RecvBody) {
        let shared = Arc::new(Mutex::new(Inbound::default()));
        let due = Due {
            id,
            wakes: Arc::clone(wakes),
        };
        let body = RecvBody {
            shared: Arc::clone(&shared),
            length,
            due,
        };
        (Self(shared), body)
    }

    /// Data came; `false` when nobody reads any more (the caller credits it back itself).
    pub(super) fn data(&self, data: &[u8]) -> bool {
        let mut inbound = lock(&self.0);
        if inbound.dropped {
            return false;
        }
        if !data.is_empty() {
            inbound.data.push_back(Bytes::copy_from_slice(data));
        }
        if let Some(reader) = inbound.reader.take() {
            reader.wake();
        }
        true
    }

    /// The body ended, with `trailers` if the client sent them; what was read of it and not
    /// credited yet is returned, to be credited to the connection (the stream is closed: what
    /// is read from now on is due at once).
    pub(super) fn end(&self, trailers: Option<HeaderMap>) -> u32 {
        let mut inbound = lock(&self.0);
        inbound.ended = true;
        inbound.trailers = trailers;
        if let Some(reader) = inbound.reader.take() {
            reader.wake();
        }
        std::mem::take(&mut inbound.read)
    }

    /// The stream failed: the body's next read fails with `why`.
    pub(super) fn fail(&self, why: &'static str) {
        let mut inbound = lock(&self.0);
        inbound.failed.get_or_insert(why);
        // What is dropped unread is credited back as if read.
        let buffered: usize = inbound.data.drain(..).map(|d| d.len()).sum();
        inbound.read = inbound
            .read
            .saturating_add(u32::try_from(buffered).unwrap_or(u32::MAX));
        if let Some(reader) = inbound.reader.take() {
            reader.wake();
        }
    }

    /// What was read since it was last taken, to be credited back to the client, once it is
    /// `step` or more (else 0).
    pub(super) fn take_read(&self, step: u32) -> u32 {
        let mut inbound = lock(&self.0);
        match inbound.read >= step {
            true => std::mem::take(&mut inbound.read),
            false => 0,
        }
    }
}

/// A request body read from its stream's [`Inbound`].
#[derive(Debug)]
pub(super) struct RecvBody {
    shared: Arc<Mutex<Inbound>>,
    length: Option<u64>,
    due: Due,
}

impl Drop for RecvBody {
    fn drop(&mut self) {
        let mut inbound = lock(&self.shared);
        inbound.dropped = true;
        let buffered: usize = inbound.data.drain(..).map(|d| d.len()).sum();
        inbound.read = inbound
            .read
            .saturating_add(u32::try_from(buffered).unwrap_or(u32::MAX));
        if inbound.read > 0 {
            self.due.wakes.credit(self.due.id);
        }
    }
}

/// The request body failed: its stream was reset, or its connection ended.
#[derive(Debug)]
pub(super) struct StreamFailed(&'static str);

impl std::fmt::Display for StreamFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the HTTP/2 request stream ended before its body: {}",
            self.0
        )
    }
}

impl std::error::Error for StreamFailed {}

impl Body for RecvBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut inbound = lock(&self.shared);
        if let Some(why) = inbound.failed {
            return Poll::Ready(Some(Err(StreamFailed(why).into())));
        }
        if let Some(data) = inbound.data.pop_front() {
            let before = inbound.read;
            inbound.read = before.saturating_add(u32::try_from(data.len()).unwrap_or(u32::MAX));
            // Due once half a window is read, or at once when the client has ended the
            // stream (only the connection's window is credited then); told once until taken.
            let due = match inbound.ended {
                true => before == 0 && inbound.read > 0,
                false => before < CREDIT_STEP && inbound.read >= CREDIT_STEP,
            };
            if due {
                self.due.wakes.credit(self.due.id);
            }
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if inbound.ended {
            return Poll::Ready(inbound.trailers.take().map(|t| Ok(Frame::trailers(t))));
        }
        if !inbound
            .reader
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            inbound.reader = Some(cx.waker().clone());
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        let inbound = lock(&self.shared);
        inbound.ended && inbound.data.is_empty() && inbound.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.length {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}
