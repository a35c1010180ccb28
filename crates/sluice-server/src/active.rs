//! Counting a connection's requests in flight, so that its idle timer never fires under one;
//! and, on HTTP/2, making what the h2 crate keeps of a response the response's own.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http::header::HeaderValue;
use http::{HeaderMap, Response};
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
    pub fn with_limit(limit: Option<u64>) -> Self {
        Self {
            limit,
            ..Self::default()
        }
    }

    /// Whether the connection's last request (by its limit) has begun.
    pub fn at_limit(&self) -> bool {
        self.limit
            .is_some_and(|limit| self.served.load(Ordering::Acquire) >= limit)
    }

    /// Waits until the connection's last request has begun; never, without a limit.
    pub async fn last_request(&self) {
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
    pub async fn first_request(&self) {
        let first = self.first.notified();
        tokio::pin!(first);
        first.as_mut().enable();
        if !self.started() {
            first.await;
        }
    }

    /// The fast path handed the connection to hyper with a request it read but did not serve:
    /// until hyper begins that request, a shutdown must wait for it as for a first request.
    pub fn handed_over(&self) {
        self.started.store(false, Ordering::Release);
    }

    /// Counts one request until the returned guard is dropped.
    pub fn begin(self: &Arc<Self>) -> ActiveGuard {
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
pub struct ActiveGuard(Arc<ActiveRequests>);

impl ActiveGuard {
    /// The request was not served here after all (the fast path handed it to hyper, which
    /// begins it again): it does not count towards the connection's limit.
    pub fn given_back(self) {
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
        h2: bool,
        alt_svc: Option<HeaderValue>,
    }
}

impl<F> Tracked<F> {
    /// `h2`: the response goes out on HTTP/2, and what h2 keeps of it is made its own
    /// ([`own_header_values`], [`OWN_LAST_BYTES`]).
    pub(super) fn new(inner: F, guard: ActiveGuard, h2: bool) -> Self {
        Self {
            inner,
            guard: Some(guard),
            h2,
            alt_svc: None,
        }
    }

    /// Puts `alt_svc` (the listener's HTTP/3 offer) on the response.
    pub(super) fn with_alt_svc(mut self, alt_svc: Option<HeaderValue>) -> Self {
        self.alt_svc = alt_svc;
        self
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
        let (guard, h2) = (this.guard.take(), *this.h2);
        let alt_svc = this.alt_svc.take();
        Poll::Ready(res.map(|mut response| {
            if let Some(alt_svc) = alt_svc {
                response
                    .headers_mut()
                    .insert(http::header::ALT_SVC, alt_svc);
            }
            if h2 {
                own_header_values(response.headers_mut());
            }
            response.map(|body| TrackedBody { body, guard, h2 })
        }))
    }
}

pin_project_lite::pin_project! {
    /// A response body that releases its request's count when it ends or is dropped, and on
    /// HTTP/2 hands the last of its data on as a copy of its own ([`OWN_LAST_BYTES`]).
    pub struct TrackedBody<B> {
        #[pin]
        body: B,
        guard: Option<ActiveGuard>,
        h2: bool,
    }
}

// What an HTTP/2 connection keeps of a response after it was sent: the h2 crate keeps the
// header values its HPACK encoder indexed (in the connection's dynamic table) and the last data
// frame it wrote (until the connection next writes, to give back what a frame did not send).
// A response's header values and data are slices of the buffer they were read into (an
// upstream connection's 8 KiB read, a reverse session's 64 KiB), so each idle HTTP/2 client
// held a whole such buffer for a few bytes of it. What h2 keeps is made the response's own.

/// The most of a response's last data an HTTP/2 connection is handed as a copy: at most one
/// frame's worth once per response; a longer last chunk is most of its buffer anyway.
pub(super) const OWN_LAST_BYTES: usize = 16 * 1024;

/// Moves `headers`' values into one buffer of their own (one allocation per response, not one
/// per value), so that those HPACK keeps hold that and not the buffer they were read into.
fn own_header_values(headers: &mut HeaderMap) {
    let mut own = BytesMut::with_capacity(headers.values().map(HeaderValue::len).sum());
    for value in headers.values() {
        own.extend_from_slice(value.as_bytes());
    }
    let own = own.freeze();
    let mut at = 0;
    for value in headers.values_mut() {
        let end = at + value.len();
        // The same bytes as a valid value: it cannot fail, and would keep the value if it did.
        if let Ok(mut copy) = HeaderValue::from_maybe_shared(own.slice(at..end)) {
            copy.set_sensitive(value.is_sensitive());
            *value = copy;
        }
        at = end;
    }
}

impl<B: Body<Data = Bytes>> Body for TrackedBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.body.as_mut().poll_frame(cx));
        if frame.is_none() {
            this.guard.take();
        }
        // The last of the data, by the body's own account (a chunked body's last chunk is not
        // known as such, and is handed on as it is).
        let body: &B = &this.body;
        if *this.h2 && (body.is_end_stream() || body.size_hint().exact() == Some(0)) {
            return Poll::Ready(frame.map(|f| f.map(own_small_data)));
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

/// A data frame of at most [`OWN_LAST_BYTES`] as a copy of its own; anything else as it is.
fn own_small_data(frame: Frame<Bytes>) -> Frame<Bytes> {
    match frame.into_data() {
        Ok(data) if data.len() <= OWN_LAST_BYTES => Frame::data(Bytes::copy_from_slice(&data)),
        Ok(data) => Frame::data(data),
        Err(frame) => frame,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use http_body_util::{BodyExt, Full};

    use super::*;

    fn tracked(body: Full<Bytes>, h2: bool) -> TrackedBody<Full<Bytes>> {
        TrackedBody {
            body,
            guard: None,
            h2,
        }
    }

    /// An HTTP/2 connection left idle after a response keeps the response's last data frame;
    /// when that is a few bytes of an 8 KiB read, it must not keep the read with it.
    #[tokio::test]
    async fn an_http2_responses_last_data_is_a_copy_of_its_own() {
        let read = Bytes::from(vec![7u8; 8192]);
        let last = read.slice(..5);
        drop(read);
        let read = last.clone();
        let frame = tracked(Full::new(last), true)
            .frame()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(frame.data_ref().unwrap().as_ref(), &[7u8; 5]);
        assert!(read.is_unique(), "the frame handed on holds the whole read");
    }

    /// HPACK keeps a response's header values for as long as the connection: they must not
    /// keep the read they came in.
    #[tokio::test]
    async fn an_http2_responses_header_values_are_their_own() {
        let read = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\n".to_vec();
        let read = Bytes::from(read);
        let mut secret = HeaderValue::from_static("s3cret");
        secret.set_sensitive(true);
        let response = Response::builder()
            .header(
                "content-type",
                HeaderValue::from_maybe_shared(read.slice(31..41)).unwrap(),
            )
            .header("set-cookie", "a=1")
            .header("authorization", secret)
            .header("set-cookie", "b=22")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let guard = Arc::new(ActiveRequests::default()).begin();
        let response = Tracked::new(async { Ok::<_, Infallible>(response) }, guard, true)
            .await
            .unwrap();
        let headers = response.headers();
        assert_eq!(headers["content-type"], "text/plain");
        assert_eq!(headers["authorization"], "s3cret");
        assert!(headers["authorization"].is_sensitive());
        let cookies: Vec<_> = headers.get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1", "b=22"]);
        assert!(read.is_unique(), "a header value holds the read");
    }

    /// HTTP/1.1 writes the data and lets it go: nothing is copied.
    #[tokio::test]
    async fn an_http1_responses_data_is_handed_on_as_it_is() {
        let read = Bytes::from(vec![7u8; 8192]);
        let last = read.slice(..5);
        let frame = tracked(Full::new(last), false)
            .frame()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(frame.data_ref().unwrap().as_ptr(), read.as_ptr());
    }
}
