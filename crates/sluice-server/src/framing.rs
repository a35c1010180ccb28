//! [`FramingGuard`]: spots HTTP/1 requests that carry both Content-Length and
//! Transfer-Encoding, which hyper accepts without leaving a trace, and answers 408 to a client
//! whose request head stopped arriving.
//!
//! The guard runs the bytes hyper reads through `sluice_wire`'s [`Scanner`], which records
//! which request (by position on the connection) had both headers; the connection's service
//! marks that request with [`AmbiguousFraming`](sluice_core::checks::AmbiguousFraming).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};

use sluice_wire::framing::Scanner;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Shared by a connection's [`FramingGuard`] and its service. Both run in the connection's
/// task (hyper calls the service from there), so relaxed ordering suffices.
#[derive(Debug)]
pub(super) struct FramingWatch {
    /// Requests handed to the service so far.
    served: AtomicU64,
    /// Position of the first request with both headers; `u64::MAX` when none.
    ambiguous: AtomicU64,
    /// Set when hyper gave up waiting for a request head (`request_header_timeout`).
    head_timed_out: AtomicBool,
}

impl Default for FramingWatch {
    fn default() -> Self {
        Self {
            served: AtomicU64::new(0),
            ambiguous: AtomicU64::new(u64::MAX),
            head_timed_out: AtomicBool::new(false),
        }
    }
}

impl FramingWatch {
    /// Counts one request handed to the service and says whether it is the ambiguous one.
    /// hyper closes the connection after such a request, so at most one matters.
    pub(super) fn next_is_ambiguous(&self) -> bool {
        let n = self.served.fetch_add(1, Ordering::Relaxed);
        n == self.ambiguous.load(Ordering::Relaxed)
    }

    /// Records that the connection ended because its request head did not arrive in time: when
    /// the guard is dropped it answers 408 if part of a head had come.
    pub(super) fn head_timed_out(&self) {
        self.head_timed_out.store(true, Ordering::Relaxed);
    }
}

/// What a client whose request head stopped arriving gets, as NGINX and HAProxy answer it.
const REQUEST_TIMEOUT: &[u8] = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 24\r\n\r\nrequest header timed out";

/// Passes reads and writes through, scanning what the client sends.
#[derive(Debug)]
pub(super) struct FramingGuard<T: AsyncWrite + Unpin> {
    inner: T,
    scanner: Scanner,
    watch: Arc<FramingWatch>,
}

impl<T: AsyncWrite + Unpin> FramingGuard<T> {
    /// Wraps `inner`; heads longer than `max_head` (which hyper refuses) end the scan.
    pub(super) fn new(inner: T, max_head: usize, watch: Arc<FramingWatch>) -> Self {
        Self {
            inner,
            scanner: Scanner::new(max_head),
            watch,
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for FramingGuard<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        let this = &mut *self;
        this.scanner.feed(&buf.filled()[before..]);
        if let Some(index) = this.scanner.first_ambiguous() {
            this.watch.ambiguous.store(index, Ordering::Relaxed);
        }
        Poll::Ready(Ok(()))
    }
}

forward_async_write!(FramingGuard);

/// hyper closes a connection whose head timed out without a word; a client that had begun a
/// request is told why. hyper is done with the socket by then (the head timer only runs while
/// no response is being written), so the answer cannot interleave with another. It is written
/// only as far as the socket takes it without waiting: a client too slow to take 150 bytes has
/// no claim on the proxy's time.
impl<T: AsyncWrite + Unpin> Drop for FramingGuard<T> {
    fn drop(&mut self) {
        if !self.watch.head_timed_out.load(Ordering::Relaxed) || !self.scanner.mid_head() {
            return;
        }
        let mut cx = Context::from_waker(Waker::noop());
        let mut inner = Pin::new(&mut self.inner);
        if let Poll::Ready(Ok(_)) = inner.as_mut().poll_write(&mut cx, REQUEST_TIMEOUT) {
            let _ = inner.poll_flush(&mut cx);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_flags_only_the_recorded_position() {
        let watch = FramingWatch::default();
        watch.ambiguous.store(1, Ordering::Relaxed);
        let flags: Vec<bool> = (0..3).map(|_| watch.next_is_ambiguous()).collect();
        assert_eq!(flags, [false, true, false]);
    }
}
