//! One request/response exchange on an HTTP/1.1 client connection, shared by static clusters
//! (pooled connections) and reverse clusters (sessions): the response timeout, how an attempt
//! failed (`sluice_core::retry` decides whether it goes again), the copy that makes another attempt
//! possible, an answer read off when a retry replaces it, and whether the connection may carry
//! another request afterwards.

use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{header, HeaderValue, Method, Request, Response, StatusCode, Uri, Version};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::client::conn::http2;
use hyper::client::conn::TrySendError;

use sluice_core::body::{BodyFailure, ProxyBody};
use sluice_core::error::ProxyError;
use sluice_core::headers::{wants_close, TrailersWanted};
use sluice_core::retry;

/// A request's own deadline for its response head (a gRPC call's `grpc-timeout`), when it
/// is sooner than its cluster's response timeout.
#[derive(Debug, Clone, Copy)]
pub struct Deadline(pub std::time::Instant);

/// How long a request may wait for its response head, and whose limit that is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HeadTimeout {
    /// The wait.
    pub(crate) after: Duration,
    /// It is the request's own [`Deadline`], sooner than the cluster's response timeout: when
    /// it passes, the client's limit was reached, not the upstream's.
    pub(crate) deadline: bool,
}

impl HeadTimeout {
    /// What the client is answered when it passes: the upstream's 504, or the request's own
    /// deadline's (DEADLINE_EXCEEDED to a gRPC client, and not logged as an upstream failure).
    pub(crate) fn error(self) -> ProxyError {
        match self.deadline {
            true => ProxyError::DeadlineExceeded,
            false => ProxyError::ResponseTimeout,
        }
    }
}

/// How long `req` may wait for its response head: the cluster's `timeout`, or less when the
/// request's [`Deadline`] comes sooner.
pub(crate) fn response_timeout<B>(req: &Request<B>, timeout: Duration) -> HeadTimeout {
    let own = req
        .extensions()
        .get::<Deadline>()
        .map(|Deadline(at)| at.saturating_duration_since(std::time::Instant::now()));
    match own {
        Some(left) if left < timeout => HeadTimeout {
            after: left,
            deadline: true,
        },
        _ => HeadTimeout {
            after: timeout,
            deadline: false,
        },
    }
}

/// A copy of a request to send again (after a stale connection, or as a cluster's retry
/// policy says): made only for a request whose body is empty or in memory.
#[derive(Debug)]
pub(crate) struct Replay {
    parts: Parts,
    body: Bytes,
}

impl Replay {
    /// A copy of `req`, when its body is empty or in memory.
    pub(crate) fn of(req: &Request<ProxyBody>) -> Option<Self> {
        let body = match req.body() {
            ProxyBody::Full { data } => data.clone().unwrap_or_default(),
            other if http_body::Body::is_end_stream(other) => Bytes::new(),
            _ => return None,
        };
        let (mut parts, ()) = Request::new(()).into_parts();
        parts.method = req.method().clone();
        parts.uri = req.uri().clone();
        parts.version = req.version();
        parts.headers = req.headers().clone();
        Some(Self { parts, body })
    }

    /// The request again.
    pub(crate) fn request(&self) -> Request<ProxyBody> {
        let mut parts = Request::new(()).into_parts().0;
        parts.method = self.parts.method.clone();
        parts.uri = self.parts.uri.clone();
        parts.version = self.parts.version;
        parts.headers = self.parts.headers.clone();
        Request::from_parts(parts, ProxyBody::full(self.body.clone()))
    }
}

/// How the body of a request with this copy (or none) counts for [`retry`]'s rules.
pub(crate) fn kept(replay: Option<&Replay>) -> retry::Body {
    match replay {
        Some(_) => retry::Body::Kept,
        None => retry::Body::Streamed,
    }
}

/// A failed exchange: the error to answer with, how it failed, and the request when hyper gave
/// it back unsent.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) error: ProxyError,
    pub(crate) failed: retry::Failed,
    pub(crate) unsent: Option<Request<ProxyBody>>,
}

impl Failure {
    /// No response head within `timeout` (the response timeout, or the request's own
    /// deadline). The request's fate is unknown, so it is never retried, and the connection it
    /// went out on must close.
    pub(crate) fn timed_out(timeout: HeadTimeout) -> Self {
        Self::later(timeout.error())
    }

    /// A failure after the request may have been processed: never retried.
    pub(crate) fn later(error: ProxyError) -> Self {
        Self {
            error,
            failed: retry::Failed::Later,
            unsent: None,
        }
    }
}

/// The request to send again: the one hyper gave back `unsent`, or a copy of it (`replay`).
pub(crate) fn again(
    unsent: Option<Request<ProxyBody>>,
    replay: Option<&Replay>,
) -> Option<Request<ProxyBody>> {
    unsent.or_else(|| replay.map(Replay::request))
}

/// Reads an answer the client will not get (a status a retry replaces) off in a task of its
/// own ([`read_off`], by `timeout`), so that its connection or session goes back.
pub(crate) fn discard(res: Response<ProxyBody>, timeout: Duration) {
    if http_body::Body::is_end_stream(res.body()) {
        // Dropped at its end: the connection or session is back already.
        return;
    }
    let limit = sluice_core::read_ahead::read_off_limit(None);
    tokio::spawn(async move {
        // Dropped at its end (the connection goes back), or before it (the connection closes).
        drop(tokio::time::timeout(timeout, read_off(res, limit)).await);
    });
}

/// Reads an answer no client will get to its end, discarding it: whether it ended, so that
/// its connection or session may go back (a body dropped at its end gives its connection back
/// itself). One that is an event stream (it may never end), fails, or outgrows `limit`
/// (`read_ahead::read_off_limit`) did not, and its connection closes. The hyper path's one
/// read-off — a retry's replaced answer ([`discard`]), a departed client's
/// (`reverse::send`); the fast path reads raw bytes off by the same limit and rule
/// (`proxy/fast/relay.rs`).
pub(crate) async fn read_off<B>(res: Response<B>, limit: usize) -> bool
where
    B: http_body::Body + Unpin,
{
    use http_body_util::BodyExt;

    let event_stream = res.headers().get(http::header::CONTENT_TYPE);
    if event_stream.is_some_and(|v| sluice_core::read_ahead::is_event_stream(v.as_bytes())) {
        return false;
    }
    let mut body = res.into_body();
    let mut left = limit;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { return false };
        let len = frame.data_ref().map_or(0, bytes::Buf::remaining);
        let Some(rest) = left.checked_sub(len) else {
            return false;
        };
        left = rest;
    }
    true
}

/// Sends `req` and waits at most `timeout` for the response head. Dropping the send future on
/// timeout closes the connection, so it is never reused.
pub(crate) async fn send(
    sender: &mut SendRequest<ProxyBody>,
    mut req: Request<ProxyBody>,
    timeout: HeadTimeout,
) -> Result<Response<Incoming>, Failure> {
    frame_unsized_body(&mut req);
    match tokio::time::timeout(timeout.after, sender.try_send_request(req)).await {
        Ok(answer) => answered(answer),
        Err(_elapsed) => Err(Failure::timed_out(timeout)),
    }
}

/// hyper's client sends no body at all for a GET or HEAD whose length it does not know (it
/// assumes those never have one): a chunked or HTTP/2 length-less body would be dropped
/// silently. Saying `Transfer-Encoding: chunked` explicitly makes hyper send it.
pub(crate) fn frame_unsized_body(req: &mut Request<ProxyBody>) {
    let body = req.body();
    let unknown_length =
        !http_body::Body::is_end_stream(body) && http_body::Body::size_hint(body).exact().is_none();
    let headers = req.headers();
    if unknown_length
        && matches!(*req.method(), Method::GET | Method::HEAD)
        && !headers.contains_key(header::CONTENT_LENGTH)
        && !headers.contains_key(header::TRANSFER_ENCODING)
    {
        req.headers_mut().insert(
            header::TRANSFER_ENCODING,
            http::HeaderValue::from_static("chunked"),
        );
    }
}

/// Sends `req` as HTTP/2 on `sender` (a static endpoint's connection, or a dial-in session's)
/// and waits for the response head within `timeout`. A request that asks to switch protocols
/// is refused (501): HTTP/2 has no `Upgrade`. A request body that fails (the client's body
/// timeout, a limit) fails the exchange with its own error, as on HTTP/1.1 (a 408 when the
/// client stalled), not with the stream reset hyper's client answers it with (a 502).
pub(crate) async fn send_h2(
    sender: &mut http2::SendRequest<ProxyBody>,
    mut req: Request<ProxyBody>,
    timeout: HeadTimeout,
    scheme: &str,
    fallback_authority: &(dyn std::fmt::Display + Sync),
) -> Result<Response<Incoming>, Failure> {
    if req.headers().contains_key(header::UPGRADE) {
        let e = ProxyError::NotImplemented("a protocol upgrade over an HTTP/2 upstream");
        return Err(Failure::later(e));
    }
    as_h2(&mut req, scheme, fallback_authority);
    let failure = BodyFailure::default();
    let req = req.map(|body| body.watched(&failure));
    let answer = async {
        // Ready unless the connection is going away (then the request comes back unsent).
        let _ = sender.ready().await;
        sender.try_send_request(req).await
    };
    match tokio::time::timeout(timeout.after, answer).await {
        // The body's own failure first: hyper tells only of the stream it reset for it.
        Ok(answer) => answered(answer).map_err(|f| {
            failure
                .take()
                .map_or(f, |e| Failure::later(ProxyError::client_body(e)))
        }),
        Err(_elapsed) => Err(Failure::timed_out(timeout)),
    }
}

/// The request as HTTP/2 sends it: an absolute URI (hyper takes `:scheme` and `:authority`
/// from it; the authority is `Host`'s, which the sender always sets, else
/// `fallback_authority`), no `Host`, `te: trailers` again when the client said so.
fn as_h2(
    req: &mut Request<ProxyBody>,
    scheme: &str,
    fallback_authority: &(dyn std::fmt::Display + Sync),
) {
    let host = req.headers_mut().remove(header::HOST);
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let uri = match host.as_ref().and_then(|h| h.to_str().ok()) {
        Some(authority) => format!("{scheme}://{authority}{path}"),
        None => format!("{scheme}://{fallback_authority}{path}"),
    };
    if let Ok(uri) = Uri::try_from(uri) {
        *req.uri_mut() = uri;
    }
    *req.version_mut() = Version::HTTP_2;
    if req.extensions().get::<TrailersWanted>().is_some() {
        let te = HeaderValue::from_static("trailers");
        req.headers_mut().insert(header::TE, te);
    }
}

/// What [`SendRequest::try_send_request`] resolves to: the response head, or the failure and
/// the request when hyper gives it back unsent.
pub(crate) type Answer = Result<Response<Incoming>, TrySendError<Request<ProxyBody>>>;

/// The response, or the failure: before any response byte only when the connection closed or
/// failed (a parse error means response bytes arrived, a body error is the client's, a timeout
/// leaves the request's fate unknown).
// The failure carries the request back (it is large), as `send`'s does: the cold path.
#[allow(clippy::result_large_err)]
pub(crate) fn answered(answer: Answer) -> Result<Response<Incoming>, Failure> {
    let mut e = match answer {
        Ok(res) => return Ok(framed(res)),
        Err(e) => e,
    };
    let unsent = e.take_message();
    let error = e.into_error();
    let failed = if unsent.is_some() || refused(&error) {
        retry::Failed::Unsent
    } else if !error.is_user() && !error.is_parse() && !error.is_timeout() {
        retry::Failed::BeforeResponse
    } else {
        retry::Failed::Later
    };
    let error = if error.is_user() {
        ProxyError::client_body(error.into())
    } else {
        ProxyError::UpstreamProtocol(error)
    };
    Err(Failure {
        error,
        failed,
        unsent,
    })
}

/// Whether an HTTP/2 upstream refused the stream unprocessed (RFC 9113 §8.7): it was reset
/// with `REFUSED_STREAM`, or was above the last stream a GOAWAY said the upstream would
/// process (`NO_ERROR`: a graceful shutdown), so it may go again whatever it is.
fn refused(error: &hyper::Error) -> bool {
    let mut source = std::error::Error::source(error);
    while let Some(e) = source {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            let reason = h2.reason();
            let refused = reason == Some(h2::Reason::REFUSED_STREAM);
            let graceful =
                h2.is_go_away() && h2.is_remote() && reason == Some(h2::Reason::NO_ERROR);
            return refused || graceful;
        }
        source = e.source();
    }
    false
}

/// Marks a response that came with both `Transfer-Encoding` and `Content-Length`: its
/// connection is out of step with at least one reader of it and is never reused.
#[derive(Debug, Clone, Copy)]
struct ConflictingFraming;

/// RFC 9112 §6.3: a response with both `Transfer-Encoding` and `Content-Length` is framed by
/// the former (hyper decodes it so); the latter is removed so the client is not told a length
/// the body does not have, and the connection is closed after it (the sender may be attempting
/// request smuggling or response splitting).
fn framed(mut res: Response<Incoming>) -> Response<Incoming> {
    let headers = res.headers_mut();
    if headers.contains_key(header::TRANSFER_ENCODING)
        && headers.remove(header::CONTENT_LENGTH).is_some()
    {
        res.extensions_mut().insert(ConflictingFraming);
    }
    res
}

/// Whether the connection may carry another request after `res`: HTTP/1.1 without
/// `Connection: close`, not a 101 (the upgrade takes the socket), and framed unambiguously.
pub(crate) fn keeps_connection<B>(res: &Response<B>) -> bool {
    res.version() == Version::HTTP_11
        && !wants_close(res.headers())
        && res.status() != StatusCode::SWITCHING_PROTOCOLS
        && res.extensions().get::<ConflictingFraming>().is_none()
}
