//! [`ProxyBody`]: the one body type that flows through the proxy, without boxing.

#[cfg(feature = "compression")]
mod compressed;
/// Built without the `compression` feature, no body is compressed: the variant has no value
/// (`sluice::Proxy` refuses a configuration with `compression` in such a build).
#[cfg(not(feature = "compression"))]
mod compressed {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use http_body::{Body, Frame};

    use crate::body::BoxError;

    /// No value: nothing is compressed in this build.
    #[derive(Debug)]
    pub(super) enum Compressed {}

    impl Body for Compressed {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            match *self.get_mut() {}
        }
    }
}

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use hyper::body::Incoming;

/// A body's failure, as hyper and `http-body` carry it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a body streamed off an upstream connection (a pooled connection, a leased session)
/// holds on to: the connection goes back where it came from once the body has been read to
/// the end, and is let go when the body is dropped before that. `upstream` implements it; a
/// body knows nothing of pools.
pub trait Release: Send + Sync + std::fmt::Debug {
    /// The body has been read to its end: the connection may carry another request. Called
    /// at most once; a release dropped without it lets the connection go.
    fn finish(&mut self);
}

/// Sees an answer's body as it streams to the client (a cache storing a miss: the route
/// feature hook `Keep`'s).
pub trait Tee: Send + Sync {
    /// A chunk of it; `false`: this wants no more (it has given up: too large).
    fn data(&mut self, chunk: &Bytes) -> bool;
    /// The body ended whole. Dropped without it: the body failed or the client left.
    fn end(self: Box<Self>);
}

/// The tees an answer's body streams through ([`ProxyBody::teed`]).
#[derive(Default)]
pub struct Tees(Vec<Box<dyn Tee>>);

impl std::fmt::Debug for Tees {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Tees").field(&self.0.len()).finish()
    }
}

impl Tees {
    /// These tees.
    pub fn new(tees: Vec<Box<dyn Tee>>) -> Self {
        Self(tees)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A chunk of the body, to every tee that still wants them.
    pub fn data(&mut self, chunk: &Bytes) {
        self.0.retain_mut(|t| t.data(chunk));
    }

    /// The body ended whole.
    pub fn end(self) {
        for tee in self.0 {
            tee.end();
        }
    }
}

/// The rest of a body read ahead: streamed from the peer as the client reads it, or pumped
/// by a task that reads it from the peer at the peer's pace into a bounded buffer.
#[derive(Debug)]
pub enum Rest {
    /// Read from the peer when the client reads.
    Incoming(Incoming),
    /// Read from the client, under its body timeout.
    Client(ClientBody),
    /// Read from the peer by a task (see [`Pumped`]).
    Pumped(Pumped),
}

impl Rest {
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self {
            Self::Incoming(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            Self::Client(body) => Pin::new(body).poll_frame(cx),
            Self::Pumped(pumped) => pumped.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Incoming(body) => body.is_end_stream(),
            Self::Client(body) => body.is_end_stream(),
            Self::Pumped(_) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Incoming(body) => body.size_hint(),
            Self::Client(body) => body.size_hint(),
            Self::Pumped(pumped) => pumped.remaining,
        }
    }
}

impl From<Incoming> for Rest {
    fn from(body: Incoming) -> Self {
        Self::Incoming(body)
    }
}

impl From<ClientBody> for Rest {
    fn from(body: ClientBody) -> Self {
        Self::Client(body)
    }
}

/// A request body as a transport hands it to the proxy: hyper's (`Incoming`, kept as it is), or
/// any other transport's boxed (`BoxBody`: an own HTTP/2, HTTP/3, a framework user's test).
#[derive(Debug)]
pub enum RequestBody {
    /// hyper's HTTP/1.1 or HTTP/2 request body.
    Incoming(Incoming),
    /// Another transport's.
    Boxed(BoxBody<Bytes, BoxError>),
}

impl From<Incoming> for RequestBody {
    fn from(body: Incoming) -> Self {
        Self::Incoming(body)
    }
}

impl From<BoxBody<Bytes, BoxError>> for RequestBody {
    fn from(body: BoxBody<Bytes, BoxError>) -> Self {
        Self::Boxed(body)
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Self::Incoming(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            Self::Boxed(body) => Pin::new(body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Incoming(body) => body.is_end_stream(),
            Self::Boxed(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Incoming(body) => body.size_hint(),
            Self::Boxed(body) => body.size_hint(),
        }
    }
}

/// A client's request body under the listener's `client_body_timeout` (NGINX's): it fails with
/// [`BodyTimedOut`] when it is polled and nothing more has come for that long. The timer runs
/// only while a read waits (from the first such wait after each frame), and is allocated only
/// for a body that makes a read wait at all.
#[derive(Debug)]
pub struct ClientBody {
    body: RequestBody,
    /// The most data it may bring (`max_request_body`), and what it brought.
    limit: Option<u64>,
    received: u64,
    timeout: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Whether the timer runs: a read has waited since the last frame.
    armed: bool,
}

/// A client's request body brought more than its route's `max_request_body`.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the request body is larger than {0} bytes")]
pub struct BodyTooLarge(pub u64);

/// A client's request body stopped arriving for longer than `client_body_timeout`.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the client sent no more of the request body within {0:?}")]
pub struct BodyTimedOut(pub Duration);

impl ClientBody {
    /// `body`, failing when `timeout` passes between two of its frames.
    pub fn new(body: impl Into<RequestBody>, timeout: Duration) -> Self {
        Self {
            body: body.into(),
            limit: None,
            received: 0,
            timeout,
            timer: None,
            armed: false,
        }
    }

    /// Fails with [`BodyTooLarge`] once more than `limit` bytes of data came.
    pub fn limited(mut self, limit: Option<u64>) -> Self {
        self.limit = limit;
        self
    }

    /// Counts what `frame` brings against the limit.
    fn take(&mut self, frame: Frame<Bytes>) -> Result<Frame<Bytes>, BoxError> {
        if let (Some(limit), Some(data)) = (self.limit, frame.data_ref()) {
            self.received = self.received.saturating_add(data.len() as u64);
            if self.received > limit {
                return Err(BodyTooLarge(limit).into());
            }
        }
        Ok(frame)
    }

    fn arm(&mut self) {
        let deadline = tokio::time::Instant::now() + self.timeout;
        match &mut self.timer {
            Some(timer) => timer.as_mut().reset(deadline),
            None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
        self.armed = true;
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            this.armed = false;
            return Poll::Ready(frame.map(|f| f.and_then(|f| this.take(f))));
        }
        if !this.armed {
            this.arm();
        }
        let expired = this
            .timer
            .as_mut()
            .is_some_and(|timer| timer.as_mut().poll(cx).is_ready());
        if expired {
            return Poll::Ready(Some(Err(BodyTimedOut(this.timeout).into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Frames a task reads off the peer ahead of the client, within a budget of bytes: the task
/// takes budget for each chunk before it passes it on, and the budget comes back as the client
/// takes the chunk. Dropping this (the client went away) closes the budget, which stops the
/// task.
#[derive(Debug)]
pub struct Pumped {
    frames: tokio::sync::mpsc::UnboundedReceiver<Result<Frame<Bytes>, hyper::Error>>,
    budget: std::sync::Arc<tokio::sync::Semaphore>,
    limit: usize,
    /// The size of what is still to come, as the peer's framing says.
    remaining: SizeHint,
}

/// The task's side of a [`Pumped`] body.
#[derive(Debug)]
pub struct Pump {
    frames: tokio::sync::mpsc::UnboundedSender<Result<Frame<Bytes>, hyper::Error>>,
    budget: std::sync::Arc<tokio::sync::Semaphore>,
    limit: usize,
}

/// A pump with a budget of `limit` bytes (at least one), and the body it feeds, whose size is
/// `remaining`.
pub fn pump(limit: usize, remaining: SizeHint) -> (Pump, Pumped) {
    let limit = limit.clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let budget = std::sync::Arc::new(tokio::sync::Semaphore::new(limit));
    let pump = Pump {
        frames: tx,
        budget: std::sync::Arc::clone(&budget),
        limit,
    };
    let pumped = Pumped {
        frames: rx,
        budget,
        limit,
        remaining,
    };
    (pump, pumped)
}

/// What a chunk costs of the budget: its length, but no more than the whole budget (a chunk
/// larger than the budget waits until every byte before it has been taken).
fn cost(frame: &Frame<Bytes>, limit: usize) -> u32 {
    let len = frame.data_ref().map_or(0, Bytes::len).min(limit);
    u32::try_from(len).unwrap_or(u32::MAX)
}

impl Pump {
    /// Passes `frame` on once the budget allows; false if the client has gone.
    pub async fn send(&self, frame: Result<Frame<Bytes>, hyper::Error>) -> bool {
        if let Ok(frame) = &frame {
            match self.budget.acquire_many(cost(frame, self.limit)).await {
                Ok(permit) => permit.forget(),
                Err(_closed) => return false,
            }
        }
        self.frames.send(frame).is_ok()
    }

    /// Resolves when the client has gone.
    pub async fn closed(&self) {
        self.frames.closed().await;
    }
}

impl Pumped {
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = std::task::ready!(self.frames.poll_recv(cx));
        if let Some(Ok(frame)) = &polled {
            let len = frame.data_ref().map_or(0, Bytes::len) as u64;
            self.budget.add_permits(cost(frame, self.limit) as usize);
            let mut rest = SizeHint::new();
            rest.set_lower(self.remaining.lower().saturating_sub(len));
            if let Some(upper) = self.remaining.upper() {
                rest.set_upper(upper.saturating_sub(len));
            }
            self.remaining = rest;
        }
        Poll::Ready(polled.map(|f| f.map_err(Into::into)))
    }
}

impl Drop for Pumped {
    fn drop(&mut self) {
        self.budget.close();
    }
}

pin_project_lite::pin_project! {
    /// A request or response body: streamed from a peer, or a fixed buffer.
    ///
    /// An enum rather than a boxed trait object, so that the hot path allocates nothing for
    /// bodies.
    #[project = ProxyBodyProj]
    #[derive(Debug)]
    pub enum ProxyBody {
        /// Streamed from a client or an upstream connection.
        Incoming { #[pin] body: Incoming },
        /// Streamed from a client, under its `client_body_timeout`.
        Client { #[pin] body: ClientBody },
        /// Streamed from an upstream connection that goes back to its pool (or a session to
        /// its slice) when the body has been read to the end.
        Guarded { #[pin] body: Incoming, release: Box<dyn Release> },
        /// A fixed body (direct responses, error responses, retries of empty requests).
        Full { data: Option<Bytes> },
        /// Read ahead into memory (`request_buffer`, `response_buffer`): the chunks in `head`,
        /// then the trailers read with them, or else the `rest`, streamed. A `release` holds
        /// the connection a streamed rest comes from and gives it back when it ends.
        Buffered {
            head: VecDeque<Bytes>,
            trailers: Option<HeaderMap>,
            rest: Option<Rest>,
            release: Option<Box<dyn Release>>,
        },
        /// Compressed as it streams (a route's `compression`).
        Compressed { body: Box<compressed::Compressed> },
        /// A body whose end (or drop, the client gone) is reported with the bytes that went
        /// out: the access log's line is written then.
        Reported { body: Pin<Box<ProxyBody>>, report: Report },
        /// A request body whose failure is kept for its sender as well as passed on: hyper's
        /// HTTP/2 client only resets the stream, and its answer says no more than that.
        Watched { body: Pin<Box<ProxyBody>>, failure: BodyFailure },
        /// A response body whose chunks go through tees as they stream (`None` once ended).
        Teed { body: Pin<Box<ProxyBody>>, tees: Option<Tees> },
    }
}

/// Where a [`ProxyBody::Watched`] body keeps how it failed (the client's body timeout, its
/// limit, or anything else it broke), for whoever sent it (`ProxyError::client_body` reads it
/// as the client's failure).
#[derive(Debug, Clone, Default)]
pub struct BodyFailure(std::sync::Arc<std::sync::Mutex<Option<BoxError>>>);

impl BodyFailure {
    /// How the body failed, if it did.
    pub fn take(&self) -> Option<BoxError> {
        self.lock().take()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<BoxError>> {
        // One field, set whole: a poisoned lock is still consistent.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `error` and gives its sender one that says the same.
    fn keep(&self, error: BoxError) -> BoxError {
        let told = std::io::Error::other(error.to_string());
        *self.lock() = Some(error);
        Box::new(told)
    }
}

/// What is told when a [`ProxyBody::Reported`] body ends: its data bytes, and whether it
/// ended whole (false: dropped early, or failed).
pub type OnEnd = Box<dyn FnOnce(u64, bool) + Send + Sync>;

/// Counts a body's bytes and reports them once, at its end or its drop.
pub struct Report {
    sent: u64,
    on_end: Option<OnEnd>,
}

impl std::fmt::Debug for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Report").field("sent", &self.sent).finish()
    }
}

impl Report {
    fn end(&mut self, complete: bool) {
        if let Some(on_end) = self.on_end.take() {
            on_end(self.sent, complete);
        }
    }
}

impl Drop for Report {
    fn drop(&mut self) {
        self.end(false);
    }
}

impl ProxyBody {
    /// An empty body.
    pub fn empty() -> Self {
        Self::Full { data: None }
    }

    /// A fixed body with these bytes.
    pub fn full(data: impl Into<Bytes>) -> Self {
        let data: Bytes = data.into();
        Self::Full {
            data: (!data.is_empty()).then_some(data),
        }
    }

    /// `self`, reporting to `on_end` when it has ended or is dropped (at once for a body that
    /// has no data to come).
    pub fn reported(self, on_end: OnEnd) -> Self {
        if self.is_end_stream() {
            on_end(0, true);
            return self;
        }
        Self::Reported {
            body: Box::pin(self),
            report: Report {
                sent: 0,
                on_end: Some(on_end),
            },
        }
    }

    /// `self` compressed with `encoding` as it streams; flushed after every chunk when
    /// `flush` (an event stream).
    #[cfg(feature = "compression")]
    pub fn compressed(
        self,
        encoding: sluice_config::Encoding,
        levels: &sluice_config::Levels,
        flush: bool,
    ) -> Self {
        let body = compressed::Compressed::new(self, encoding, levels, flush);
        Self::Compressed {
            body: Box::new(body),
        }
    }

    /// A client's request body: `body` under `timeout` between its frames (`ClientBody`);
    /// a body that has already ended is taken as it is.
    pub fn from_client(body: impl Into<RequestBody>, timeout: Duration) -> Self {
        Self::from_client_limited(body, timeout, None)
    }

    /// [`from_client`](Self::from_client), failing with [`BodyTooLarge`] past `limit` bytes.
    pub fn from_client_limited(
        body: impl Into<RequestBody>,
        timeout: Duration,
        limit: Option<u64>,
    ) -> Self {
        let body = body.into();
        if body.is_end_stream() {
            return match body {
                RequestBody::Incoming(body) => Self::Incoming { body },
                RequestBody::Boxed(_) => Self::empty(),
            };
        }
        Self::Client {
            body: ClientBody::new(body, timeout).limited(limit),
        }
    }

    /// `self`, its failure kept in `failure` as well as passed on (at once for a body that has
    /// no data to come: nothing of it can fail).
    pub fn watched(self, failure: &BodyFailure) -> Self {
        if self.is_end_stream() {
            return self;
        }
        Self::Watched {
            body: Box::pin(self),
            failure: failure.clone(),
        }
    }

    /// `self`, its chunks given to `tees` as they stream, which are told its end when it ends
    /// whole (at once for a body that has no data to come).
    pub fn teed(self, tees: Tees) -> Self {
        if tees.is_empty() {
            return self;
        }
        if self.is_end_stream() {
            tees.end();
            return self;
        }
        Self::Teed {
            body: Box::pin(self),
            tees: Some(tees),
        }
    }

    /// `body`, streamed, with the connection it comes from given back by `release` when it
    /// has been read to the end (at once if it already has).
    pub fn guarded(body: Incoming, mut release: impl Release + 'static) -> Self {
        if body.is_end_stream() {
            release.finish();
        }
        Self::Guarded {
            body,
            release: Box::new(release),
        }
    }
}

impl From<Incoming> for ProxyBody {
    fn from(body: Incoming) -> Self {
        Self::Incoming { body }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project() {
            ProxyBodyProj::Incoming { body } => body.poll_frame(cx).map_err(Into::into),
            ProxyBodyProj::Client { body } => body.poll_frame(cx),
            ProxyBodyProj::Guarded { mut body, release } => {
                let polled = std::task::ready!(body.as_mut().poll_frame(cx));
                // The server side may stop polling once `is_end_stream` is true, so the
                // connection goes back as soon as the last frame has been read.
                match &polled {
                    None => release.finish(),
                    Some(Ok(_)) if body.is_end_stream() => release.finish(),
                    Some(_) => {}
                }
                Poll::Ready(polled.map(|f| f.map_err(Into::into)))
            }
            ProxyBodyProj::Compressed { body } => Pin::new(body.as_mut()).poll_frame(cx),
            ProxyBodyProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            ProxyBodyProj::Buffered {
                head,
                trailers,
                rest,
                release,
            } => poll_buffered(cx, head, trailers, rest, release),
            ProxyBodyProj::Reported { body, report } => {
                let polled = std::task::ready!(body.as_mut().poll_frame(cx));
                match &polled {
                    Some(Ok(frame)) => {
                        report.sent += frame.data_ref().map_or(0, |d| d.len() as u64);
                        if body.is_end_stream() {
                            report.end(true);
                        }
                    }
                    Some(Err(_)) => report.end(false),
                    None => report.end(true),
                }
                Poll::Ready(polled)
            }
            ProxyBodyProj::Watched { body, failure } => {
                let polled = std::task::ready!(body.as_mut().poll_frame(cx));
                Poll::Ready(polled.map(|f| f.map_err(|e| failure.keep(e))))
            }
            ProxyBodyProj::Teed { body, tees } => {
                let polled = std::task::ready!(body.as_mut().poll_frame(cx));
                poll_teed(&polled, body.is_end_stream(), tees);
                Poll::Ready(polled)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Incoming { body } | Self::Guarded { body, .. } => body.is_end_stream(),
            Self::Client { body } => body.is_end_stream(),
            Self::Reported { body, .. } | Self::Watched { body, .. } => body.is_end_stream(),
            Self::Teed { body, .. } => body.is_end_stream(),
            Self::Compressed { body } => body.is_end_stream(),
            Self::Full { data } => data.is_none(),
            Self::Buffered {
                head,
                trailers,
                rest,
                ..
            } => {
                head.is_empty()
                    && trailers.is_none()
                    && rest.as_ref().is_none_or(Rest::is_end_stream)
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Incoming { body } | Self::Guarded { body, .. } => body.size_hint(),
            Self::Client { body } => body.size_hint(),
            Self::Reported { body, .. } | Self::Watched { body, .. } => body.size_hint(),
            Self::Teed { body, .. } => body.size_hint(),
            Self::Compressed { body } => body.size_hint(),
            Self::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Self::Buffered {
                head,
                trailers,
                rest,
                ..
            } => buffered_hint(head, trailers.is_some(), rest.as_ref()),
        }
    }
}

/// Gives a teed body's frame to its tees: data to each, the end when it ended whole, and
/// the tees dropped when it failed.
fn poll_teed(
    polled: &Option<Result<Frame<Bytes>, BoxError>>,
    ended: bool,
    tees: &mut Option<Tees>,
) {
    match polled {
        Some(Ok(frame)) => {
            if let (Some(data), Some(t)) = (frame.data_ref(), tees.as_mut()) {
                t.data(data);
            }
            if let Some(t) = tees.take_if(|_| ended) {
                t.end();
            }
        }
        Some(Err(_)) => drop(tees.take()),
        None => {
            if let Some(t) = tees.take() {
                t.end();
            }
        }
    }
}

/// Yields the buffered chunks, then the trailers or the rest of the stream; the connection
/// goes back once the rest has been read to the end, as for [`ProxyBody::Guarded`].
fn poll_buffered(
    cx: &mut Context<'_>,
    head: &mut VecDeque<Bytes>,
    trailers: &mut Option<HeaderMap>,
    rest: &mut Option<Rest>,
    release: &mut Option<Box<dyn Release>>,
) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
    if let Some(data) = head.pop_front() {
        return Poll::Ready(Some(Ok(Frame::data(data))));
    }
    if let Some(trailers) = trailers.take() {
        return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
    }
    let Some(body) = rest else {
        return Poll::Ready(None);
    };
    let polled = std::task::ready!(body.poll_frame(cx));
    let ended = match &polled {
        None => true,
        Some(Ok(frame)) => frame.is_trailers() || body.is_end_stream(),
        Some(Err(_)) => false,
    };
    if ended {
        if let Some(release) = release {
            release.finish();
        }
    }
    Poll::Ready(polled)
}

/// Exact when the whole body is in hand without trailers (so HTTP/1.1 can frame it with
/// Content-Length); trailers need chunked framing, so then only a lower bound.
fn buffered_hint(head: &VecDeque<Bytes>, trailers: bool, rest: Option<&Rest>) -> SizeHint {
    let buffered: u64 = head.iter().map(|d| d.len() as u64).sum();
    match rest {
        None if !trailers => SizeHint::with_exact(buffered),
        None => {
            let mut hint = SizeHint::new();
            hint.set_lower(buffered);
            hint
        }
        Some(rest) => {
            let rest = rest.size_hint();
            let mut hint = SizeHint::new();
            hint.set_lower(buffered.saturating_add(rest.lower()));
            if let Some(upper) = rest.upper() {
                hint.set_upper(buffered.saturating_add(upper));
            }
            hint
        }
    }
}
