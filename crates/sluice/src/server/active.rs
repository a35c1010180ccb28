//! Counting a connection's requests in flight, so that its idle timer never fires under one.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::Response;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::Notify;

/// Requests of one connection from the service call until the response body has ended (or
/// was dropped). Shared by the connection's service and its [`IdleTimeout`](super::IdleTimeout).
#[derive(Debug, Default)]
pub struct ActiveRequests {
    count: AtomicUsize,
    /// Whether a request ever began on the connection, and who waits for the first.
    started: AtomicBool,
    first: Notify,
    /// Requests begun so far, and the most the connection may serve (`None`: no limit); who
    /// waits for the last to begin.
    served: AtomicU64,
    limit: Option<u64>,
    last: Notify,
}

impl ActiveRequests {
    /// A connection that serves at most `limit` requests (`max_requests_per_connection`).
    pub(crate) fn with_limit(limit: Option<u64>) -> Self {
        Self {
            limit,
            ..Self::default()
        }
    }

    /// Whether the connection's last request (by its limit) has begun.
    pub(crate) fn at_limit(&self) -> bool {
        self.limit
            .is_some_and(|limit| self.served.load(Ordering::Acquire) >= limit)
    }

    /// Waits until the connection's last request has begun; never, without a limit.
    pub(crate) async fn last_request(&self) {
        if self.limit.is_none() {
            return std::future::pending().await;
        }
        let last = self.last.notified();
        tokio::pin!(last);
        last.as_mut().enable();
        if !self.at_limit() {
            last.await;
        }
    }

    /// Whether any request is in flight.
    pub fn any(&self) -> bool {
        self.count.load(Ordering::Relaxed) > 0
    }

    /// Whether any request has begun on this connection yet.
    pub fn started(&self) -> bool {
        self.started.load(Ordering::Acquire)
    }

    /// Waits until the connection's first request has begun.
    pub(crate) async fn first_request(&self) {
        let first = self.first.notified();
        tokio::pin!(first);
        first.as_mut().enable();
        if !self.started() {
            first.await;
        }
    }

    /// The fast path handed the connection to hyper with a request it read but did not serve:
    /// until hyper begins that request, a shutdown must wait for it as for a first request.
    pub(crate) fn handed_over(&self) {
        self.started.store(false, Ordering::Release);
    }

    /// Counts one request until the returned guard is dropped.
    pub(crate) fn begin(self: &Arc<Self>) -> ActiveGuard {
        self.count.fetch_add(1, Ordering::Relaxed);
        if self.limit.is_some() {
            self.served.fetch_add(1, Ordering::AcqRel);
            if self.at_limit() {
                self.last.notify_waiters();
            }
        }
        // Only the first request writes the flag; later ones just read it.
        if !self.started() && !self.started.swap(true, Ordering::AcqRel) {
            self.first.notify_waiters();
        }
        ActiveGuard(Arc::clone(self))
    }
}

/// Holds one request in the count.
#[derive(Debug)]
pub(crate) struct ActiveGuard(Arc<ActiveRequests>);

impl ActiveGuard {
    /// The request was not served here after all (the fast path handed it to hyper, which
    /// begins it again): it does not count towards the connection's limit.
    pub(crate) fn given_back(self) {
        if self.0.limit.is_some() {
            self.0.served.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::Relaxed);
    }
}

pin_project_lite::pin_project! {
    /// A response future whose body keeps the request counted until it ends.
    pub(super) struct Tracked<F> {
        #[pin]
        inner: F,
        guard: Option<ActiveGuard>,
    }
}

impl<F> Tracked<F> {
    pub(super) fn new(inner: F, guard: ActiveGuard) -> Self {
        Self {
            inner,
            guard: Some(guard),
        }
    }
}

impl<F, B> Future for Tracked<F>
where
    F: Future<Output = Result<Response<B>, Infallible>>,
{
    type Output = Result<Response<TrackedBody<B>>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let res = ready!(this.inner.poll(cx));
        let guard = this.guard.take();
        Poll::Ready(res.map(|r| r.map(|body| TrackedBody { body, guard })))
    }
}

pin_project_lite::pin_project! {
    /// A response body that releases its request's count when it ends or is dropped.
    pub struct TrackedBody<B> {
        #[pin]
        body: B,
        guard: Option<ActiveGuard>,
    }
}

impl<B: Body> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let frame = ready!(this.body.poll_frame(cx));
        if frame.is_none() {
            this.guard.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
