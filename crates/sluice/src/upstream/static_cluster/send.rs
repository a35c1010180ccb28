//! The request path of a static cluster: pick, acquire, exchange, and the retries. The
//! exchange itself is [`crate::upstream::exchange`]'s, the retry rule `http::retry`'s.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use tracing::{debug, warn};

use super::endpoint::{Endpoint, InFlight, ReturnOnEnd};
use super::pool::Conn;
use super::{acquire, connect_fresh, wrap_response, Inner, MAX_CONNECT_ATTEMPTS};
use crate::body::ProxyBody;
use crate::error::ProxyError;
use crate::http::retry::{self, Again, Retries};
use crate::http::IO_BUFFER_BYTES;
use crate::upstream::exchange::{self, Failure, Replay};
use crate::upstream::host::default_host;
use crate::upstream::reverse::buffer;
use crate::upstream::served::{note_served_by, ServedBy, WantsServedBy};
use crate::upstream::tls::UpstreamTls;

/// Picks an endpoint and exchanges the request with it. A failed connect ejects the endpoint
/// and moves the (unsent) request to another one, up to [`MAX_CONNECT_ATTEMPTS`] (unless the
/// cluster's `retry.on` leaves out `connect-failure`). A reused connection that turns out
/// stale costs the request a fresh one to the same endpoint; a failure or answer the cluster's
/// retry policy lists sends it to another endpoint, if there is one (`http::retry`).
pub(super) async fn send(
    inner: &Arc<Inner>,
    mut req: Request<ProxyBody>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let endpoints = inner.endpoints.load_full();
    let wants = req.extensions().get::<WantsServedBy>().is_some();
    let mut retries = Retries::new(inner.retry.as_ref(), retry::is_idempotent(req.method()));
    if retries.may_replay() {
        // A body that fits the fast path's buffer is read first, so that it can go again (as
        // the fast path, which has it whole, would send it again).
        req = buffer::request(req, IO_BUFFER_BYTES).await?;
    }
    let mut replay = retries.may_replay().then(|| Replay::of(&req)).flatten();
    // Endpoints this request left (for a retry elsewhere), and whether the next attempt takes
    // a fresh connection to the one it is on (after a stale one).
    let mut tried = Vec::new();
    let mut fresh: Option<usize> = None;
    loop {
        let (i, conn, in_flight) = match fresh.take() {
            Some(i) => {
                let in_flight = endpoints[i].begin_request();
                let conn = connect_fresh(inner, &endpoints[i]).await?;
                (i, conn, in_flight)
            }
            None => {
                let acquire = |e: Arc<Endpoint>| async move { acquire(inner, &e).await };
                pick_and(inner, &endpoints, inner.now_ms(), &mut tried, acquire).await?
            }
        };
        let addr = endpoints[i].addr();
        let sni = || inner.tls.as_ref().and_then(UpstreamTls::sni);
        default_host(&mut req, || sni().unwrap_or_else(|| addr.to_string()));
        let reused = conn.is_reused();
        // A fresh connection cannot be stale, so only a reused one pays for the copy.
        if replay.is_none() && reused {
            replay = Replay::of(&req);
        }
        let failure = match exchange(inner, conn, in_flight, req).await {
            Ok(mut res) => {
                let status = res.status().as_u16();
                match &replay {
                    Some(copy) if retries.after_status(status, retry::Body::Kept) => {
                        debug!(cluster = %inner.name, upstream.addr = %addr, status, "retrying the request on another endpoint");
                        exchange::discard(res, inner.opts.response_timeout);
                        tried.push(i);
                        req = copy.request();
                        continue;
                    }
                    _ => {
                        note_served_by(wants, &mut res, || ServedBy {
                            endpoint: Some(addr),
                            ..ServedBy::default()
                        });
                        return Ok(res);
                    }
                }
            }
            Err(failure) => failure,
        };
        let again = retries.after_failure(failure.failed, reused, exchange::kept(replay.as_ref()));
        let Some(again) = again else {
            log_failure(inner, addr, &failure.error);
            return Err(failure.error);
        };
        let error = &failure.error;
        match again {
            Again::Stale => {
                debug!(cluster = %inner.name, upstream.addr = %addr, %error, "reused connection failed before the response; retrying on a fresh one");
                fresh = Some(i);
            }
            Again::Policy => {
                debug!(cluster = %inner.name, upstream.addr = %addr, %error, "retrying the request on another endpoint");
                tried.push(i);
            }
        }
        req = failure.request(replay.as_ref())?;
    }
}

/// Picks an endpoint not in `tried` (any, when a retry has tried them all) and leases a
/// connection to it with `acquire`, moving on after a failed connect (the endpoint ejected) up
/// to [`MAX_CONNECT_ATTEMPTS`], as the cluster's `retry.on` allows. `now_ms`: the cluster's
/// clock reading.
pub(super) async fn pick_and<C, F, Fut>(
    inner: &Inner,
    endpoints: &[Arc<Endpoint>],
    now_ms: u64,
    tried: &mut Vec<usize>,
    mut acquire: F,
) -> Result<(usize, C, InFlight), ProxyError>
where
    F: FnMut(Arc<Endpoint>) -> Fut,
    Fut: Future<Output = Result<C, ProxyError>>,
{
    if !tried.is_empty() && tried.len() >= endpoints.len() {
        // A retry that has been everywhere goes where the policy picks, again.
        tried.clear();
    }
    let mut last_error = None;
    for _ in 0..MAX_CONNECT_ATTEMPTS {
        let Some(i) = inner.balancer.pick(endpoints, now_ms, tried) else {
            break;
        };
        let in_flight = endpoints[i].begin_request();
        match acquire(Arc::clone(&endpoints[i])).await {
            Ok(conn) => return Ok((i, conn, in_flight)),
            Err(e) => {
                tried.push(i);
                last_error = Some((endpoints[i].addr(), e));
                if !inner.opts.retry.on.connect_failure {
                    break;
                }
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

/// Sends on `conn` and waits for the response head within the response timeout.
async fn exchange(
    inner: &Inner,
    mut conn: Conn,
    in_flight: InFlight,
    req: Request<ProxyBody>,
) -> Result<Response<ProxyBody>, Failure> {
    let timeout = inner.opts.response_timeout;
    let sent_at = std::time::Instant::now();
    let res = exchange::send(&mut conn.sender, req, timeout).await?;
    in_flight
        .endpoint()
        .observe(res.status().as_u16(), sent_at.elapsed());
    Ok(finish(inner, conn, in_flight, res))
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
