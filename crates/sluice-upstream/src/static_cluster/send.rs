//! The request path of a static cluster: pick, acquire, exchange, and the retries. The
//! exchange itself is [`crate::exchange`]'s, the retry rule `sluice_core::retry`'s.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use tracing::{debug, warn};

use super::endpoint::{Endpoint, InFlight, ReturnOnEnd};
use super::h2::{self, H2Stream};
use super::pool::Conn;
use super::{acquire, wrap_response, Inner, MAX_CONNECT_ATTEMPTS};
use crate::connect::Connected;
use crate::exchange::{self, Failure, Replay};
use crate::host::default_host;
use crate::reverse::buffer;
use crate::served::{note_served_by, ServedBy, WantsServedBy};
use crate::tls::UpstreamTls;
use sluice_config::UpstreamProtocol;
use sluice_core::attempts::{self, Attempts, Ended, Next, Tried};
use sluice_core::body::ProxyBody;
use sluice_core::error::ProxyError;
use sluice_core::read_ahead::IO_BUFFER_BYTES;
use sluice_core::retry::{self, Retries};

/// Picks an endpoint and exchanges the request with it. A failed connect ejects the endpoint
/// and moves the (unsent) request to another one, up to [`MAX_CONNECT_ATTEMPTS`] (unless the
/// cluster's `retry.on` leaves out `connect-failure`). A reused connection that turns out
/// stale costs the request a fresh one to the same endpoint; a failure or answer the cluster's
/// retry policy lists sends it to another endpoint, if there is one, else back to one it tried
/// ([`pick_and`]; `sluice_core::retry`). An answer is given up only once the next attempt has its
/// connection: if none can be had, the client gets it. The order of those decisions is
/// `sluice_core::attempts::drive`'s, as for every data path.
pub(super) async fn send(
    inner: &Arc<Inner>,
    mut req: Request<ProxyBody>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let endpoints = inner.endpoints.load_full();
    let wants = req.extensions().get::<WantsServedBy>().is_some();
    let idempotent = retry::is_idempotent(req.method());
    let mut retries = Retries::new(inner.retry.as_ref(), idempotent);
    if retries.may_replay() {
        // A body that fits the fast path's buffer is read first, so that it can go again (as
        // the fast path, which has it whole, would send it again).
        req = buffer::request(req, IO_BUFFER_BYTES).await?;
    }
    let mut up = ToEndpoints {
        inner,
        replay: retries.may_replay().then(|| Replay::of(&req)).flatten(),
        h2c: gets_h2c(inner, &req),
        endpoints: &endpoints,
        idempotent,
        tried: Vec::new(),
    };
    let (i, leg, in_flight) = up.pick().await?;
    let first = Lease {
        i,
        leg,
        in_flight,
        req,
    };
    match attempts::drive(&mut up, first, &mut retries).await {
        Ended::Answered(Answered {
            res, addr, stream, ..
        }) => answered(inner, res, addr, wants, stream).await,
        Ended::Failed(e) => Err(e),
        // hyper's path learns of a client that left by being dropped.
        Ended::Gone => Err(ProxyError::UpstreamInvalid("client gone")),
    }
}

/// One request's attempts on a static cluster's endpoints.
struct ToEndpoints<'a> {
    inner: &'a Arc<Inner>,
    endpoints: &'a [Arc<Endpoint>],
    /// A copy of the request, when it may go again.
    replay: Option<Replay>,
    h2c: bool,
    idempotent: bool,
    /// Endpoints this request left, for a retry elsewhere.
    tried: Vec<usize>,
}

/// A connection or stream leased on endpoint `i` for `req`.
struct Lease {
    i: usize,
    leg: Leg,
    in_flight: InFlight,
    req: Request<ProxyBody>,
}

/// What a failed attempt leaves: its endpoint, and the request when hyper gave it back unsent.
type Back = (usize, Option<Request<ProxyBody>>);

/// An answer, and where it came from.
struct Answered {
    res: Response<ProxyBody>,
    i: usize,
    addr: SocketAddr,
    /// It came on an HTTP/2 stream.
    stream: bool,
}

impl ToEndpoints<'_> {
    /// An endpoint not tried yet (or, retrying, back to one), and a connection or stream to it.
    async fn pick(&mut self) -> Result<(usize, Leg, InFlight), ProxyError> {
        let (inner, h2c) = (self.inner, self.h2c);
        let lease = |e: Arc<Endpoint>| async move { lease(inner, &e, h2c).await };
        let now = inner.now_ms();
        pick_and(inner, self.endpoints, now, &mut self.tried, lease).await
    }
}

impl Attempts for ToEndpoints<'_> {
    type Lease = Lease;
    type Answer = Answered;
    type Back = Back;

    async fn attempt(&mut self, lease: Lease) -> Tried<Answered, Back> {
        let Lease {
            i,
            leg,
            in_flight,
            mut req,
        } = lease;
        let addr = self.endpoints[i].addr();
        let sni = || self.inner.tls.as_ref().and_then(UpstreamTls::sni);
        default_host(&mut req, || sni().unwrap_or_else(|| addr.to_string()));
        let reused = leg.is_reused();
        let stream = matches!(leg, Leg::H2(_));
        // A fresh connection cannot be stale, so only a reused one pays for the copy, and only
        // for a request the stale rule may send again.
        if self.replay.is_none() && reused && self.idempotent {
            self.replay = Replay::of(&req);
        }
        let body = exchange::kept(self.replay.as_ref());
        match exchange(self.inner, leg, in_flight, req).await {
            Ok(res) => Tried::Answer {
                status: res.status().as_u16(),
                len: http_body::Body::size_hint(res.body()).exact(),
                answer: Answered {
                    res,
                    i,
                    addr,
                    stream,
                },
                body,
            },
            Err(failure) => Tried::Failed(attempts::Failure {
                failed: failure.failed,
                error: failure.error,
                stale: reused,
                body,
                refused: false,
                back: (i, failure.unsent),
            }),
        }
    }

    async fn renew(&mut self, (i, unsent): Back, error: ProxyError) -> Next<Lease, Answered> {
        let endpoint = &self.endpoints[i];
        debug!(cluster = %self.inner.name, upstream.addr = %endpoint.addr(), %error, "reused connection failed before the response; retrying on a fresh one");
        let Some(req) = exchange::again(unsent, self.replay.as_ref()) else {
            return Next::Failed(error);
        };
        let in_flight = endpoint.begin_request();
        match lease_fresh(self.inner, endpoint, self.h2c).await {
            Ok(leg) => Next::Lease(Lease {
                i,
                leg,
                in_flight,
                req,
            }),
            Err(e) => Next::Failed(e),
        }
    }

    async fn elsewhere(&mut self, (i, unsent): Back, error: ProxyError) -> Next<Lease, Answered> {
        let addr = self.endpoints[i].addr();
        debug!(cluster = %self.inner.name, upstream.addr = %addr, %error, "retrying the request on another endpoint");
        let Some(req) = exchange::again(unsent, self.replay.as_ref()) else {
            return Next::Failed(error);
        };
        self.tried.push(i);
        match self.pick().await {
            Ok((i, leg, in_flight)) => Next::Lease(Lease {
                i,
                leg,
                in_flight,
                req,
            }),
            Err(e) => Next::Failed(e),
        }
    }

    async fn replace(&mut self, answered: Answered) -> Next<Lease, Answered> {
        let Some(req) = self.replay.as_ref().map(Replay::request) else {
            return Next::Answer(answered);
        };
        self.tried.push(answered.i);
        let Ok((i, leg, in_flight)) = self.pick().await else {
            return Next::Answer(answered);
        };
        let (addr, status) = (answered.addr, answered.res.status().as_u16());
        debug!(cluster = %self.inner.name, upstream.addr = %addr, status, "retrying the request on another endpoint");
        exchange::discard(answered.res, self.inner.opts.response_timeout);
        Next::Lease(Lease {
            i,
            leg,
            in_flight,
            req,
        })
    }

    fn failed(&mut self, (i, _): Back, error: &ProxyError) {
        log_failure(self.inner, self.endpoints[i].addr(), error);
    }
}

/// The answer the client gets from the endpoint at `addr`: noted as served by it (when the
/// request `wants` that) and, off an HTTP/2 `stream`, with what of its body is there already
/// read first (`take_ready`), so that a body failing with its head is a 502, not a close.
async fn answered(
    inner: &Inner,
    mut res: Response<ProxyBody>,
    addr: SocketAddr,
    wants: bool,
    stream: bool,
) -> Result<Response<ProxyBody>, ProxyError> {
    note_served_by(wants, &mut res, || ServedBy {
        endpoint: Some(addr),
        ..ServedBy::default()
    });
    if !stream {
        return Ok(res);
    }
    take_ready(res)
        .await
        .inspect_err(|e| log_failure(inner, addr, e))
}

/// Picks an endpoint not in `tried` and leases a connection to it with `acquire`, moving on
/// after a failed connect (the endpoint ejected) up to [`MAX_CONNECT_ATTEMPTS`], as the
/// cluster's `retry.on` allows. `now_ms`: the cluster's clock reading.
///
/// A retry (`tried` not empty) that finds no endpoint it has not tried, or none it can
/// connect to, goes back to one it has tried, as the policy picks among those still usable
/// (the endpoint that answered, when it is the only one left), never to one whose connect
/// failed here: a dead endpoint does not end a retry that a live one could take. Only when no
/// usable endpoint can be leased at all does the retry fail, and the client gets the answer
/// in hand.
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
    let retrying = !tried.is_empty();
    // Endpoints whose connect failed here (ejected now, but not if their backoff is zero).
    let mut refused = Vec::new();
    let mut last_error = None;
    for _ in 0..MAX_CONNECT_ATTEMPTS {
        let picked = inner.balancer.pick(endpoints, now_ms, tried);
        // A retry with nowhere new to go goes where the policy picks among the rest, again.
        let picked = picked.or_else(|| {
            retrying
                .then(|| inner.balancer.pick(endpoints, now_ms, &refused))
                .flatten()
        });
        let Some(i) = picked else {
            break;
        };
        let in_flight = endpoints[i].begin_request();
        match acquire(Arc::clone(&endpoints[i])).await {
            Ok(conn) => return Ok((i, conn, in_flight)),
            Err(e) => {
                tried.push(i);
                refused.push(i);
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
        None => Err(inner.no_endpoint(endpoints)),
    }
}

/// The response that came on an HTTP/2 stream with what of its body is here already taken off
/// the stream, before the head goes to the client, up to [`IO_BUFFER_BYTES`]; never waiting
/// for more.
///
/// hyper's server writes a response head together with the first bytes of its body: a body
/// that fails before those went out (an endpoint's malformed trailers, sent with the head: h2
/// resets the stream) would leave the client an empty close, no status at all. A failure found
/// here is answered 502 instead, as NGINX and Envoy answer it. One that comes later, once the
/// head has gone out, cuts the body short: an HTTP/1.1 client's connection closes without the
/// last chunk, an HTTP/2 client's stream is reset. (An HTTP/1.1 endpoint's answer is left
/// as it is: the fast path relays those, and both paths answer a framing failure alike,
/// `crates/sluice-wire/corpus/`.)
async fn take_ready(res: Response<ProxyBody>) -> Result<Response<ProxyBody>, ProxyError> {
    use http_body::Body as _;
    use std::task::Poll;

    let (parts, body) = res.into_parts();
    let ProxyBody::Guarded {
        mut body,
        mut release,
    } = body
    else {
        return Ok(Response::from_parts(parts, body));
    };
    let mut head = std::collections::VecDeque::new();
    let (mut trailers, mut len, mut ended) = (None, 0, body.is_end_stream());
    while !ended && len < IO_BUFFER_BYTES {
        let polled =
            std::future::poll_fn(|cx| Poll::Ready(std::pin::Pin::new(&mut body).poll_frame(cx)));
        let frame = match polled.await {
            Poll::Pending => break,
            Poll::Ready(None) => {
                ended = true;
                break;
            }
            Poll::Ready(Some(frame)) => frame.map_err(ProxyError::UpstreamProtocol)?,
        };
        match frame.into_data() {
            Ok(data) => {
                len += data.len();
                if !data.is_empty() {
                    head.push_back(data);
                }
                ended = body.is_end_stream();
            }
            Err(frame) => {
                trailers = frame.into_trailers().ok();
                ended = true;
            }
        }
    }
    if head.is_empty() && trailers.is_none() && !ended {
        let body = ProxyBody::Guarded { body, release };
        return Ok(Response::from_parts(parts, body));
    }
    let body = match ended {
        true => {
            sluice_core::body::Release::finish(release.as_mut());
            ProxyBody::Buffered {
                head,
                trailers,
                rest: None,
                release: None,
            }
        }
        false => ProxyBody::Buffered {
            head,
            trailers: None,
            rest: Some(sluice_core::body::Rest::Incoming(body)),
            release: Some(release),
        },
    };
    Ok(Response::from_parts(parts, body))
}

/// A connection or stream leased for one request.
pub(super) enum Leg {
    /// An HTTP/1.1 connection of the pool.
    H1(Conn),
    /// A stream on one of the endpoint's HTTP/2 connections.
    H2(H2Stream),
}

impl Leg {
    fn is_reused(&self) -> bool {
        match self {
            Self::H1(conn) => conn.is_reused(),
            Self::H2(stream) => stream.is_reused(),
        }
    }
}

/// Whether `req` goes to a plaintext `auto` cluster's endpoints in HTTP/2 with prior knowledge
/// (h2c): it is a gRPC call. Without TLS there is no ALPN to agree on HTTP/2, so `auto` means
/// HTTP/1.1 there; but gRPC is only ever HTTP/2, so a gRPC call sent as HTTP/1.1 could never
/// succeed (a gRPC server answers it with an HTTP/2 preface hyper reads as "invalid HTTP
/// version"). Other requests, HTTP/2 from the client or not, stay HTTP/1.1: a plaintext
/// endpoint is not known to speak h2c, and most behind a TLS-terminating proxy do not.
fn gets_h2c(inner: &Inner, req: &Request<ProxyBody>) -> bool {
    inner.tls.is_none()
        && inner.opts.protocol == UpstreamProtocol::Auto
        && sluice_core::grpc::is_grpc(req.headers())
}

/// Leases what `endpoint` takes a request on, as the cluster's `protocol` says: a pooled
/// HTTP/1.1 connection, or a stream on an HTTP/2 one (`auto`: once the endpoint agreed to
/// HTTP/2 by ALPN, or for a gRPC call in plaintext, `h2c`).
async fn lease(inner: &Inner, endpoint: &Endpoint, h2c: bool) -> Result<Leg, ProxyError> {
    if h2c || takes_streams(inner, endpoint) {
        let connect = || connect_h2(inner, endpoint, h2c);
        let leased = h2::lease(&inner.opts.h2, &endpoint.h2, connect).await;
        return leased.map(Leg::H2);
    }
    if inner.opts.protocol != UpstreamProtocol::Auto {
        return acquire(inner, endpoint).await.map(Leg::H1);
    }
    if let Some(conn) = super::checkout_ready(inner, endpoint).await {
        return Ok(Leg::H1(conn));
    }
    connect_leg(inner, endpoint).await
}

/// What a request takes after a stale connection: a new HTTP/1.1 connection to `endpoint`, or
/// a stream on another of its HTTP/2 connections (the one that went away takes no more).
async fn lease_fresh(inner: &Inner, endpoint: &Endpoint, h2c: bool) -> Result<Leg, ProxyError> {
    match h2c || takes_streams(inner, endpoint) {
        true => lease(inner, endpoint, h2c).await,
        false => connect_leg(inner, endpoint).await,
    }
}

/// A new connection to `endpoint`: HTTP/1.1, or a stream on a new HTTP/2 one (for `auto`, as
/// ALPN agrees).
async fn connect_leg(inner: &Inner, endpoint: &Endpoint) -> Result<Leg, ProxyError> {
    match super::connect_any(inner, endpoint).await? {
        Connected::H1(sender) => Ok(Leg::H1(Conn::new(sender))),
        Connected::H2(sender) => {
            endpoint.agreed_h2();
            Ok(Leg::H2(endpoint.h2.add(sender)))
        }
    }
}

/// Whether `endpoint`'s requests take HTTP/2 streams: the cluster speaks HTTP/2, or may and
/// the endpoint agreed to it.
fn takes_streams(inner: &Inner, endpoint: &Endpoint) -> bool {
    match inner.opts.protocol {
        UpstreamProtocol::Http1 => false,
        UpstreamProtocol::H2 | UpstreamProtocol::H2c => true,
        UpstreamProtocol::Auto => endpoint.speaks_h2(),
    }
}

/// A new HTTP/2 connection to `endpoint`, for an `h2`, `h2c` or `auto` cluster (`h2c`: with
/// prior knowledge, whatever the cluster's `protocol`).
async fn connect_h2(
    inner: &Inner,
    endpoint: &Endpoint,
    h2c: bool,
) -> Result<hyper::client::conn::http2::SendRequest<ProxyBody>, ProxyError> {
    let protocol = match h2c {
        true => UpstreamProtocol::H2c,
        false => inner.opts.protocol,
    };
    match super::connect_as(inner, endpoint, protocol).await? {
        Connected::H2(sender) => Ok(sender),
        // An `auto` endpoint that agreed to HTTP/2 before and now does not.
        Connected::H1(_) => Err(ProxyError::UpstreamInvalid(
            "endpoint stopped agreeing to HTTP/2",
        )),
    }
}

/// The line an operator needs for a 502 or 504: which cluster, which endpoint, what failed. A
/// request's own deadline passing (a gRPC call's `grpc-timeout`) is the client's limit, not
/// the upstream's failure: a debug line of its own.
pub(super) fn log_failure(inner: &Inner, addr: SocketAddr, e: &ProxyError) {
    let status = e.status().as_u16();
    if matches!(e, ProxyError::DeadlineExceeded) {
        debug!(cluster = %inner.name, upstream.addr = %addr, status, "the request's own deadline passed before the upstream answered");
        return;
    }
    warn!(cluster = %inner.name, upstream.addr = %addr, error = %e, status, "upstream failed");
}

/// Sends on `leg` and waits for the response head within the response timeout (or the
/// request's own [`Deadline`](crate::Deadline), when sooner).
async fn exchange(
    inner: &Inner,
    leg: Leg,
    in_flight: InFlight,
    req: Request<ProxyBody>,
) -> Result<Response<ProxyBody>, Failure> {
    let timeout = exchange::response_timeout(&req, inner.opts.response_timeout);
    let mut conn = match leg {
        Leg::H1(conn) => conn,
        Leg::H2(stream) => {
            let scheme = if inner.tls.is_some() { "https" } else { "http" };
            let addr = in_flight.endpoint().addr();
            let sent_at = std::time::Instant::now();
            let (res, slot) = stream.send(req, timeout, (scheme, addr)).await?;
            let endpoint = in_flight.endpoint();
            endpoint.observe(res.status().as_u16(), sent_at.elapsed());
            let end = StreamEnd {
                _slot: slot,
                _in_flight: in_flight,
            };
            return Ok(wrap_response(res, end));
        }
    };
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

/// What a response body over HTTP/2 holds until it ends: nothing goes back to a pool (the
/// connection stays shared); dropping it gives back the stream's slot and the endpoint's
/// in-flight count.
#[derive(Debug)]
struct StreamEnd {
    _slot: h2::Slot,
    _in_flight: InFlight,
}

impl sluice_core::body::Release for StreamEnd {
    fn finish(&mut self) {}
}
