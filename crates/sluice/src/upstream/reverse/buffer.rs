//! `request_buffer` and `response_buffer`: bodies of a known length that fit are read whole,
//! so a slow client never holds a session while it trickles.
//!
//! A request body is read before a session is leased; a response body is read off the
//! session at the service's speed, and the session goes back before the client has read a
//! byte of it. Bodies of unknown length (chunked) or larger than the buffer stream through
//! the leased session as before.

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::body::ProxyBody;
use crate::error::ProxyError;

/// Whether a body announces a length (Content-Length) of at most `limit` bytes.
fn fits(hint: &http_body::SizeHint, limit: usize) -> bool {
    hint.upper().is_some_and(|n| n <= limit as u64)
}

/// Reads the client's body whole when it fits `limit`.
pub(super) async fn request(
    req: Request<ProxyBody>,
    limit: usize,
) -> Result<Request<ProxyBody>, ProxyError> {
    let (parts, body) = req.into_parts();
    let body = match body {
        ProxyBody::Incoming { body } if !body.is_end_stream() && fits(&body.size_hint(), limit) => {
            let bytes = body.collect().await.map_err(ProxyError::ClientBody)?;
            ProxyBody::full(bytes.to_bytes())
        }
        other => other,
    };
    Ok(Request::from_parts(parts, body))
}

/// Reads the service's body whole when it fits `limit`; `None` means: stream it.
pub(super) async fn response(
    res: &mut Response<Incoming>,
    limit: usize,
) -> Option<Result<Bytes, ProxyError>> {
    let body = res.body_mut();
    if body.is_end_stream() || !fits(&body.size_hint(), limit) {
        return None;
    }
    let collected = body.collect().await;
    Some(
        collected
            .map(|c| c.to_bytes())
            .map_err(ProxyError::UpstreamProtocol),
    )
}

/// A copy of the request to send again, when it is idempotent and its body is in memory.
pub(super) fn replay_of(req: &Request<ProxyBody>) -> Option<(http::request::Parts, Bytes)> {
    if !crate::upstream::is_idempotent(req.method()) {
        return None;
    }
    let body = match req.body() {
        ProxyBody::Full { data } => data.clone().unwrap_or_default(),
        other if other.is_end_stream() => Bytes::new(),
        _ => return None,
    };
    let (mut parts, ()) = Request::new(()).into_parts();
    parts.method = req.method().clone();
    parts.uri = req.uri().clone();
    parts.version = req.version();
    parts.headers = req.headers().clone();
    Some((parts, body))
}
