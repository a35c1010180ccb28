//! `request_buffer` and `response_buffer` on the hyper path: bodies read ahead into memory
//! (the rules are `sluice_core::read_ahead`'s), so a slow client never holds a session while it
//! trickles. A response's rest, past a pause, is read off the session at the service's pace by
//! a task, into what is left of the buffer: a gap (a pause of the service, or of this
//! machine's scheduler) never makes a slow client hold a session for a body that fits it.

use std::collections::VecDeque;

use bytes::Bytes;
use http::{header, HeaderMap, Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use hyper::body::Incoming;

use sluice_core::body::{ProxyBody, Pump, Release, Rest};
use sluice_core::error::ProxyError;
use sluice_core::read_ahead::{self, ReadAhead};

/// What reading a body ahead found.
struct Read<B> {
    chunks: VecDeque<Bytes>,
    trailers: Option<HeaderMap>,
    /// The rest of the body, when it did not end within the limit or the gap.
    rest: Option<B>,
    /// Bytes read.
    len: usize,
    /// Whether reading stopped at a gap (not at the limit).
    gap: bool,
}

impl<B: Into<Rest>> Read<B> {
    /// The body to forward: what was read, then the trailers or the rest.
    fn into_body(self, release: Option<Box<dyn Release>>) -> ProxyBody {
        ProxyBody::Buffered {
            head: self.chunks,
            trailers: self.trailers,
            rest: self.rest.map(Into::into),
            release,
        }
    }
}

/// Reads frames of `body` until it ends, outgrows `rule`'s buffer, or pauses for as long as
/// `rule` waits.
async fn read_ahead<B: Body<Data = Bytes> + Unpin>(
    mut body: B,
    rule: ReadAhead,
) -> Result<Read<B>, B::Error> {
    let mut ahead = Read {
        chunks: VecDeque::new(),
        trailers: None,
        rest: None,
        len: 0,
        gap: false,
    };
    while !body.is_end_stream() {
        let len = ahead.len;
        if rule.outgrown(len) {
            ahead.rest = Some(body);
            return Ok(ahead);
        }
        let next = match rule.wait(len) {
            // Dropping a pending `frame()` loses nothing: the chunk stays in the connection.
            Some(gap) => tokio::time::timeout(gap, body.frame()).await.ok(),
            None => Some(body.frame().await),
        };
        let Some(next) = next else {
            ahead.rest = Some(body);
            ahead.gap = true;
            return Ok(ahead);
        };
        let Some(frame) = next.transpose()? else {
            break;
        };
        match frame.into_data() {
            Ok(data) => {
                ahead.len = len.saturating_add(data.len());
                if !data.is_empty() {
                    ahead.chunks.push_back(data);
                }
            }
            Err(frame) => {
                // Trailers end the body.
                ahead.trailers = frame.into_trailers().ok();
                break;
            }
        }
    }
    Ok(ahead)
}

/// Reads the client's body ahead when it may fit `limit`: one of unknown length (chunked) or
/// of a known length that fits. A body that ends within the limit without trailers is sent
/// with Content-Length and may be replayed; one that outgrows it is sent as what was read,
/// then the rest. A known length over the limit streams as it comes. A client that stops
/// sending for its `client_body_timeout` gets 408 (no session was leased for it). A static
/// cluster whose retry policy may send a request again reads it ahead too.
/// A gRPC call's request goes on at a pause, also before its first message (`read_ahead`).
pub(crate) async fn request(
    req: Request<ProxyBody>,
    limit: usize,
) -> Result<Request<ProxyBody>, ProxyError> {
    let (parts, body) = req.into_parts();
    let rule = match sluice_core::grpc::is_grpc(&parts.headers) {
        true => ReadAhead::call(limit),
        false => ReadAhead::request(limit),
    };
    let body = match body {
        ProxyBody::Client { body } if fits(&body, limit) => read_request(body, rule).await?,
        ProxyBody::Incoming { body } if fits(&body, limit) => read_request(body, rule).await?,
        other => other,
    };
    Ok(Request::from_parts(parts, body))
}

/// Whether a request body is worth reading ahead: more is to come, and its length may fit.
fn fits(body: &impl Body, limit: usize) -> bool {
    !body.is_end_stream() && body.size_hint().lower() <= limit as u64
}

/// Reads a request body ahead by `rule`: whole (sent with Content-Length, replayable), or what
/// fit (or came before a pause) followed by the rest.
async fn read_request<B>(body: B, rule: ReadAhead) -> Result<ProxyBody, ProxyError>
where
    B: Body<Data = Bytes> + Unpin + Into<Rest>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let ahead = read_ahead(body, rule)
        .await
        .map_err(|e| ProxyError::client_body(e.into()))?;
    let with_length = ReadAhead::ends_with_length(ahead.trailers.is_some());
    Ok(if ahead.rest.is_none() && with_length {
        ProxyBody::full(concat(ahead.chunks))
    } else {
        ahead.into_body(None)
    })
}

/// One buffer for the chunks (copied only when there are several).
fn concat(mut chunks: VecDeque<Bytes>) -> Bytes {
    if chunks.len() <= 1 {
        return chunks.pop_front().unwrap_or_default();
    }
    let mut all = Vec::with_capacity(chunks.iter().map(Bytes::len).sum());
    for chunk in chunks {
        all.extend_from_slice(&chunk);
    }
    Bytes::from(all)
}

/// Reads the service's body ahead into `limit` bytes and gives the session back (`lease`: a
/// session's [`Lease`], or a stream's half of one) at once when the body ended within them;
/// otherwise the session goes back when the rest has been read. Event streams are not read
/// ahead at all: holding their events back would stall them.
pub(super) async fn response<L: Release + 'static>(
    res: Response<Incoming>,
    limit: usize,
    mut lease: L,
) -> Result<Response<ProxyBody>, ProxyError> {
    let (parts, body) = res.into_parts();
    if body.is_end_stream() || is_event_stream(&parts.headers) {
        return Ok(Response::from_parts(parts, ProxyBody::guarded(body, lease)));
    }
    let rule = ReadAhead::response(limit);
    let mut ahead = read_ahead(body, rule)
        .await
        .map_err(ProxyError::UpstreamProtocol)?;
    let body = match ahead.rest.take() {
        None => {
            lease.finish();
            ahead.into_body(None)
        }
        Some(rest) if ahead.gap => {
            let (pump, pumped) = sluice_core::body::pump(rule.rest(ahead.len), rest.size_hint());
            tokio::spawn(pump_rest(rest, pump, lease));
            ProxyBody::Buffered {
                head: ahead.chunks,
                trailers: None,
                rest: Some(Rest::Pumped(pumped)),
                release: None,
            }
        }
        Some(rest) => {
            ahead.rest = Some(rest);
            ahead.into_body(Some(Box::new(lease)))
        }
    };
    Ok(Response::from_parts(parts, body))
}

/// Reads the rest of a response off its session as the service sends it, within the pump's
/// budget, and gives the session back as soon as the last frame is read, whether or not the
/// client has taken it yet. The session closes instead if the body fails, or the client goes
/// away before its end.
async fn pump_rest<L: Release>(mut body: Incoming, pump: Pump, mut lease: L) {
    loop {
        let frame = tokio::select! {
            frame = body.frame() => frame,
            () = pump.closed() => return,
        };
        let Some(frame) = frame else {
            lease.finish();
            return;
        };
        let ended = match &frame {
            Ok(frame) => frame.is_trailers() || body.is_end_stream(),
            Err(_) => false,
        };
        if ended {
            lease.finish();
        }
        let failed = frame.is_err();
        if !pump.send(frame).await || ended || failed {
            return;
        }
    }
}

/// Whether a response is a `text/event-stream`, whose events must reach the client as sent.
pub(super) fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| read_ahead::is_event_stream(v.as_bytes()))
}
