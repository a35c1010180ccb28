//! The request path of a static cluster: pick, acquire, exchange, and the two retries.

use std::sync::Arc;

use http::{Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use tracing::debug;

use super::endpoint::InFlight;
use super::pool::{Conn, ReturnOnEnd};
use super::{acquire, connect_fresh, wrap_response, Inner, MAX_CONNECT_ATTEMPTS};
use crate::body::ProxyBody;
use crate::error::ProxyError;
use crate::http::headers::wants_close;
use crate::upstream::is_idempotent;

/// Picks an endpoint and exchanges the request with it. A failed connect ejects the endpoint
/// and moves the (unsent) request to another one, up to [`MAX_CONNECT_ATTEMPTS`].
pub(super) async fn send(
    inner: &Arc<Inner>,
    req: Request<ProxyBody>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let endpoints = inner.endpoints.load_full();
    let mut tried = Vec::new();
    let mut last_error = None;
    for _ in 0..MAX_CONNECT_ATTEMPTS {
        let Some(i) = inner.balancer.pick(&endpoints, inner.now_ms(), &tried) else {
            break;
        };
        let in_flight = endpoints[i].begin_request();
        match acquire(inner, &endpoints[i]).await {
            Ok(conn) => return exchange(inner, conn, in_flight, req).await,
            Err(e) => {
                tried.push(i);
                last_error = Some(e);
            }
        }
    }
    Err(last_error.unwrap_or_else(|| ProxyError::NoEndpoint {
        cluster: inner.name.clone(),
    }))
}

/// Sends on `conn`; on a reused connection that fails before any response byte (the stale
/// keep-alive race), sends once more on a fresh connection if the request can be replayed.
async fn exchange(
    inner: &Inner,
    mut conn: Conn,
    in_flight: InFlight,
    req: Request<ProxyBody>,
) -> Result<Response<ProxyBody>, ProxyError> {
    // Only an idempotent request without a body can be rebuilt after hyper has consumed it.
    let replay = (conn.is_reused()
        && is_idempotent(req.method())
        && http_body::Body::is_end_stream(req.body()))
    .then(|| head_of(&req));
    let failure = match send_on(inner, &mut conn, req).await {
        Ok(res) => return Ok(finish(inner, conn, in_flight, res)),
        Err(failure) => failure,
    };
    let retry = match failure.unsent {
        Some(unsent) => Some(unsent),
        None if failure.stale => replay.map(|parts| Request::from_parts(parts, ProxyBody::empty())),
        None => None,
    };
    let Some(req) = retry.filter(|_| conn.is_reused()) else {
        return Err(failure.error);
    };
    debug!(cluster = %inner.name, upstream.addr = %in_flight.endpoint().addr(), error = %failure.error, "reused connection failed before the response; retrying on a fresh one");
    let mut fresh = connect_fresh(inner, in_flight.endpoint()).await?;
    match send_on(inner, &mut fresh, req).await {
        Ok(res) => Ok(finish(inner, fresh, in_flight, res)),
        Err(failure) => Err(failure.error),
    }
}

/// Why a send failed, and what of the request survived.
struct SendFailure {
    error: ProxyError,
    /// The request, when hyper gave it back unsent.
    unsent: Option<Request<ProxyBody>>,
    /// Whether the failure happened before any response byte and was not the client's fault.
    stale: bool,
}

async fn send_on(
    inner: &Inner,
    conn: &mut Conn,
    req: Request<ProxyBody>,
) -> Result<Response<Incoming>, SendFailure> {
    let sent = tokio::time::timeout(
        inner.opts.response_timeout,
        conn.sender.try_send_request(req),
    );
    match sent.await {
        Ok(Ok(res)) => Ok(res),
        Ok(Err(mut e)) => {
            let unsent = e.take_message();
            let error = e.into_error();
            // Only a connection that closed or failed before the response started is stale: a
            // parse error means response bytes arrived, and a body error is the client's.
            let stale = !error.is_user() && !error.is_parse() && !error.is_timeout();
            let error = if error.is_user() {
                ProxyError::ClientBody(error)
            } else {
                ProxyError::UpstreamProtocol(error)
            };
            Err(SendFailure {
                error,
                unsent,
                stale,
            })
        }
        // Dropping the send future closes the connection: it is never reused.
        Err(_elapsed) => Err(SendFailure {
            error: ProxyError::ResponseTimeout,
            unsent: None,
            stale: false,
        }),
    }
}

/// Counts the request on the connection and wraps the body so the connection returns to the
/// pool when the body ends, if it may carry another request: `Connection: close`, the request
/// limit and a 101 (the upgrade takes the socket) each retire it.
fn finish(
    inner: &Inner,
    mut conn: Conn,
    in_flight: InFlight,
    res: Response<Incoming>,
) -> Response<ProxyBody> {
    conn.served += 1;
    let limit = inner
        .opts
        .pool
        .max_requests_per_connection
        .unwrap_or(u64::MAX);
    let reusable = res.version() == Version::HTTP_11
        && !wants_close(res.headers())
        && res.status() != StatusCode::SWITCHING_PROTOCOLS
        && conn.served < limit;
    let ret = ReturnOnEnd::new(reusable.then_some(conn), Arc::clone(&inner.opts), in_flight);
    wrap_response(res, ret)
}

fn head_of(req: &Request<ProxyBody>) -> http::request::Parts {
    let (mut parts, ()) = Request::new(()).into_parts();
    parts.method = req.method().clone();
    parts.uri = req.uri().clone();
    parts.version = req.version();
    parts.headers = req.headers().clone();
    parts
}
