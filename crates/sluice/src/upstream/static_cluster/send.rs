//! The request path of a static cluster: pick, acquire, exchange, and the two retries.
//! The exchange itself, and its retry rule, are [`crate::upstream::exchange`]'s.

use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use tracing::{debug, warn};

use super::endpoint::InFlight;
use super::endpoint::ReturnOnEnd;
use super::pool::Conn;
use super::{acquire, connect_fresh, wrap_response, Inner, MAX_CONNECT_ATTEMPTS};
use crate::body::ProxyBody;
use crate::error::ProxyError;
use crate::upstream::exchange::{self, Replay};
use crate::upstream::host::default_host;
use crate::upstream::served::{note_served_by, ServedBy, WantsServedBy};
use crate::upstream::tls::UpstreamTls;

/// Picks an endpoint and exchanges the request with it. A failed connect ejects the endpoint
/// and moves the (unsent) request to another one, up to [`MAX_CONNECT_ATTEMPTS`].
pub(super) async fn send(
    inner: &Arc<Inner>,
    mut req: Request<ProxyBody>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let endpoints = inner.endpoints.load_full();
    let mut tried = Vec::new();
    let mut last_error = None;
    for _ in 0..MAX_CONNECT_ATTEMPTS {
        let Some(i) = inner.balancer.pick(&endpoints, inner.now_ms(), &tried) else {
            break;
        };
        let in_flight = endpoints[i].begin_request();
        let addr = endpoints[i].addr();
        match acquire(inner, &endpoints[i]).await {
            Ok(conn) => {
                let sni = || inner.tls.as_ref().and_then(UpstreamTls::sni);
                default_host(&mut req, || sni().unwrap_or_else(|| addr.to_string()));
                let wants = req.extensions().get::<WantsServedBy>().is_some();
                let mut result = exchange(inner, conn, in_flight, req).await;
                if let Ok(res) = &mut result {
                    note_served_by(wants, res, || ServedBy {
                        endpoint: Some(addr),
                        ..ServedBy::default()
                    });
                }
                return result.inspect_err(|e| log_failure(inner, addr, e));
            }
            Err(e) => {
                tried.push(i);
                last_error = Some((addr, e));
            }
        }
    }
    match last_error {
        Some((addr, e)) => {
            log_failure(inner, addr, &e);
            Err(e)
        }
        None => Err(ProxyError::NoEndpoint {
            cluster: inner.name.clone(),
        }),
    }
}

/// The line an operator needs for a 502 or 504: which cluster, which endpoint, what failed.
pub(super) fn log_failure(inner: &Inner, addr: SocketAddr, e: &ProxyError) {
    let status = e.status().as_u16();
    warn!(cluster = %inner.name, upstream.addr = %addr, error = %e, status, "upstream failed");
}

/// Sends on `conn`; on a reused connection that fails before any response byte (the stale
/// keep-alive race), sends once more on a fresh connection if the request can be replayed.
async fn exchange(
    inner: &Inner,
    mut conn: Conn,
    in_flight: InFlight,
    req: Request<ProxyBody>,
) -> Result<Response<ProxyBody>, ProxyError> {
    // A fresh connection cannot be stale, so only a reused one pays for the copy.
    let replay = conn.is_reused().then(|| Replay::of(&req)).flatten();
    let timeout = inner.opts.response_timeout;
    let sent_at = std::time::Instant::now();
    let failure = match exchange::send(&mut conn.sender, req, timeout).await {
        Ok(res) => {
            in_flight
                .endpoint()
                .observe(res.status().as_u16(), sent_at.elapsed());
            return Ok(finish(inner, conn, in_flight, res));
        }
        Err(failure) => failure,
    };
    let (req, error) = failure.again(conn.is_reused(), replay)?;
    debug!(cluster = %inner.name, upstream.addr = %in_flight.endpoint().addr(), %error, "reused connection failed before the response; retrying on a fresh one");
    // Boxed: the retry is rare, and inline its state would double every request's future.
    Box::pin(retry_fresh(inner, in_flight, req)).await
}

async fn retry_fresh(
    inner: &Inner,
    in_flight: InFlight,
    req: Request<ProxyBody>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let mut fresh = connect_fresh(inner, in_flight.endpoint()).await?;
    let timeout = inner.opts.response_timeout;
    let sent_at = std::time::Instant::now();
    match exchange::send(&mut fresh.sender, req, timeout).await {
        Ok(res) => {
            in_flight
                .endpoint()
                .observe(res.status().as_u16(), sent_at.elapsed());
            Ok(finish(inner, fresh, in_flight, res))
        }
        Err(failure) => Err(failure.error),
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
    let reusable = exchange::keeps_connection(&res) && conn.served < limit;
    let ret = ReturnOnEnd::new(reusable.then_some(conn), Arc::clone(&inner.opts), in_flight);
    wrap_response(res, ret)
}
