//! The request path of a reverse slice: lease, exchange, and the one retry.

use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use tracing::debug;

use super::buffer;
use super::pool::SlicePool;
use super::session::{Lease, Session};
use crate::body::ProxyBody;
use crate::error::ProxyError;
use crate::upstream::exchange::{self, Failure, Replay};

/// Reads a body that fits `request_buffer`, then leases a session and exchanges the request
/// on it. A session that dies before any response byte costs the request a second session
/// when the request can be replayed: hyper gave it back unsent, or it is idempotent and its
/// body is in memory.
pub(super) async fn send(
    pool: &Arc<SlicePool>,
    req: Request<ProxyBody>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let req = buffer::request(req, pool.opts.request_buffer).await?;
    let session = pool.lease().await?;
    // Copied only once a session is leased: a request refused for capacity never pays for it.
    let replay = Replay::of(&req);
    let instance = Arc::clone(&session.instance);
    let failure = match send_on(pool, session, req, replay).await {
        Ok(res) => return Ok(res),
        Err(failure) => failure,
    };
    let Some(req) = failure.retry else {
        return Err(failure.error);
    };
    debug!(instance = %instance.id(), error = %failure.error, "session failed before the response; retrying on another");
    // Boxed: the retry is rare, and inline its state would double every request's future.
    Box::pin(async {
        let session = pool.lease().await?;
        send_on(pool, session, req, None).await.map_err(|f| f.error)
    })
    .await
}

async fn send_on(
    pool: &Arc<SlicePool>,
    mut session: Session,
    req: Request<ProxyBody>,
    replay: Option<Replay>,
) -> Result<Response<ProxyBody>, Failure> {
    let timeout = pool.opts.response_timeout;
    let res = exchange::send(&mut session.sender, req, timeout, replay).await?;
    finish(pool, session, res)
        .await
        .map_err(|error| Failure { error, retry: None })
}

/// Reads the body ahead up to `response_buffer` and gives the session back as soon as the
/// body has been read off it (see [`buffer::response`]). Either way only if the session may
/// carry another request: `Connection: close` retires it; an upgrade consumes it.
async fn finish(
    pool: &Arc<SlicePool>,
    session: Session,
    res: Response<Incoming>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let reusable = exchange::keeps_connection(&res);
    if !reusable {
        debug!(instance = %session.instance.id(), status = res.status().as_u16(), "session retired by its response");
    }
    let lease = Lease::new(reusable.then_some(session), Arc::clone(pool));
    buffer::response(res, pool.opts.response_buffer, lease).await
}
