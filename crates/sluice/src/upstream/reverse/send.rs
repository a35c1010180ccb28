//! The request path of a reverse slice: lease, exchange, and the one retry.

use std::sync::Arc;

use http::{Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use tracing::debug;

use super::buffer;
use super::pool::SlicePool;
use super::session::{Lease, Session};
use crate::body::ProxyBody;
use crate::error::ProxyError;
use crate::http::headers::wants_close;

/// Reads a body that fits `request_buffer`, then leases a session and exchanges the request
/// on it. A session that dies before any response byte costs the request a second session
/// when the request can be replayed: hyper gave it back unsent, or it is idempotent and its
/// body is in memory.
pub(super) async fn send(
    pool: &Arc<SlicePool>,
    req: Request<ProxyBody>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let req = buffer::request(req, pool.opts.request_buffer).await?;
    let replay = buffer::replay_of(&req);
    let session = pool.lease().await?;
    let instance = session.instance.id().to_owned();
    let failure = match send_on(pool, session, req).await {
        Ok(res) => return Ok(res),
        Err(failure) => failure,
    };
    let retry = match failure.unsent {
        Some(unsent) => Some(unsent),
        None if failure.stale => {
            replay.map(|(parts, body)| Request::from_parts(parts, ProxyBody::full(body)))
        }
        None => None,
    };
    let Some(req) = retry else {
        return Err(failure.error);
    };
    debug!(instance = %instance, error = %failure.error, "session failed before the response; retrying on another");
    let session = pool.lease().await?;
    send_on(pool, session, req).await.map_err(|f| f.error)
}

/// Why a send failed, and what of the request survived.
struct SendFailure {
    error: ProxyError,
    /// The request, when hyper gave it back unsent.
    unsent: Option<Request<ProxyBody>>,
    /// Whether the session failed before any response byte, not by the client's fault.
    stale: bool,
}

async fn send_on(
    pool: &Arc<SlicePool>,
    mut session: Session,
    req: Request<ProxyBody>,
) -> Result<Response<ProxyBody>, SendFailure> {
    let sent = tokio::time::timeout(
        pool.opts.response_timeout,
        session.sender.try_send_request(req),
    );
    match sent.await {
        Ok(Ok(res)) => finish(pool, session, res)
            .await
            .map_err(|error| SendFailure {
                error,
                unsent: None,
                stale: false,
            }),
        Ok(Err(mut e)) => {
            let unsent = e.take_message();
            let error = e.into_error();
            let client_fault = error.is_user();
            let error = if client_fault {
                ProxyError::ClientBody(error)
            } else {
                ProxyError::UpstreamProtocol(error)
            };
            Err(SendFailure {
                error,
                unsent,
                stale: !client_fault,
            })
        }
        // Dropping the session with its request in flight closes it: it is never reused.
        Err(_elapsed) => Err(SendFailure {
            error: ProxyError::ResponseTimeout,
            unsent: None,
            stale: false,
        }),
    }
}

/// Reads the body ahead up to `response_buffer` and gives the session back as soon as the
/// body has been read off it (see [`buffer::response`]). Either way only if the session may
/// carry another request: `Connection: close` retires it; an upgrade consumes it.
async fn finish(
    pool: &Arc<SlicePool>,
    session: Session,
    res: Response<Incoming>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let reusable = res.version() == Version::HTTP_11
        && !wants_close(res.headers())
        && res.status() != StatusCode::SWITCHING_PROTOCOLS;
    if !reusable {
        debug!(instance = %session.instance.id(), status = res.status().as_u16(), "session retired by its response");
    }
    let lease = Lease::new(reusable.then_some(session), Arc::clone(pool));
    buffer::response(res, pool.opts.response_buffer, lease).await
}
